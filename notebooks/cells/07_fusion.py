"""07_fusion: fl.compile's fusion passes and their results (notebooks/build.py builds it)."""

CELLS = [
    ("md", "# Fusion results: `fl.compile`\n\n"
           "The article (section 3.3): a model that runs at half speed on a new chip usually lacks graph "
           "optimisation, not silicon; judge a backend by its kernel count against a reference. `fl.compile(model)` "
           "captures the model's graph (torch.fx, module paths kept) and applies the passes the active backend's "
           "capability table allows: Conv+BN(+ReLU) onto a fused kernel or folded, attention onto the fused "
           "attention kernel, QKV projections as one GEMM, elementwise chains as one JIT kernel, channels-last where "
           "the backend prefers it. Sizes are small so the notebook runs in CI; `python bench/bench_fusion.py` "
           "measures ResNet-50 and the Transformer encoder (docs/fusion.md has the figures)."),
    ("code", SETUP + "\n"  # noqa: F821 - provided by notebooks/build.py
             "import copy, warnings\nfrom torch import nn\nfrom torch_fl.models import ResNet\n"
             "from torch_fl.compile import PerformanceHint\n"
             "from torch_fl.notebook.figures import fusion_figure, fusion_patterns\n"
             "warnings.simplefilter('ignore', PerformanceHint)  # the report lists hints; no stderr paths here"),
    ("md", "## ResNet on `ascend`: the NPU's fused Conv+BN+ReLU kernel\n\n"
           "`ascend` declares `fl::conv_bn_relu` and a channels-last preference. In eval mode every "
           "conv → bn → relu becomes that kernel, conv → bn without ReLU is folded into the convolution's weights, "
           "and each residual add + ReLU becomes one JIT kernel."),
    ("code", "torch.manual_seed(0)\n"
             "model = ResNet((1, 1, 1, 1), num_classes=10, width=8).eval()\n"
             "x = torch.randn(2, 3, 32, 32)\n"
             "reference = model(x)                               # native CPU PyTorch, unfused\n"
             "fl.set_backend('ascend')\n"
             "compiled = fl.compile(copy.deepcopy(model).to('fl'))\n"
             "with torch.no_grad():\n"
             "    out = compiled(x.to('fl'))                     # captured and fused on this first call\n"
             "err = (out.cpu() - reference).abs().max() / reference.abs().max()\n"
             "print('matches native CPU within 1e-5:', bool(err < 1e-5))\n"
             "print(compiled.fusion_report)"),
    ("md", "The report is data: each pattern with its module path, what it replaced and what replaced it."),
    ("code", "rows = compiled.fusion_report.rows()\n"
             "print(len(rows), 'patterns;', compiled.fusion_report.latest().counts())\n"
             "rows[0]"),
    ("md", "`measure` runs the unfused graph (the model's own ops) and the fused one under `fl.profile`, and splits "
           "the kernel launches per pattern. Times vary from run to run, so the next cell's output is not "
           "compared; the cell after it asserts the kernel counts, which are deterministic."),
    ("code", IGNORE + "report = compiled.measure(x.to('fl'))\nprint(report)"),  # noqa: F821
    ("code", "m = report.measurement\n"
             "print('kernels', m.kernels_before, '->', m.kernels_after, '| at least a third fewer:',\n"
             "      m.kernels_after <= m.kernels_before * 2 / 3)\n"
             "fusion_figure(compiled.fusion_report)"),
    ("code", "fusion_patterns(compiled.fusion_report)"),
    ("md", "## A Transformer encoder on `rocm`: fused attention, forward and backward\n\n"
           "`rocm` has a flash-style attention kernel pair. Each `nn.MultiheadAttention` becomes one QKV GEMM whose "
           "output is viewed (not copied) as q, k, v, one fused attention kernel, and the output projection; in "
           "training the gradients of q, k and v are stacked by one kernel. Outputs and gradients match the unfused "
           "model on native CPU."),
    ("code", "torch.manual_seed(0)\n"
             "layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)\n"
             "encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)\n"
             "seq = torch.randn(2, 8, 32)\n"
             "ref = copy.deepcopy(encoder)\n"
             "fl.set_backend('rocm')\n"
             "enc = fl.compile(copy.deepcopy(encoder).to('fl'))\n"
             "xs = seq.to('fl').requires_grad_()\n"
             "enc(xs).square().sum().backward()\n"
             "xr = seq.clone().requires_grad_()\n"
             "ref(xr).square().sum().backward()\n"
             "grads_ok = all(torch.allclose(a.grad.cpu(), b.grad, atol=1e-5, rtol=1e-4)\n"
             "               for a, b in zip(enc.model.parameters(), ref.parameters(), strict=True))\n"
             "print('input grad matches:', torch.allclose(xs.grad.cpu(), xr.grad, atol=1e-5, rtol=1e-4),\n"
             "      '| parameter grads match:', grads_ok)\n"
             "print(enc.fusion_report.latest())"),
    ("md", "`%%fl_profile --fusion` runs a cell with fusion off, then on (here called through "
           "`run_cell_magic` so the cell can carry the marker that its timings are not compared)."),
    ("code", IGNORE + "get_ipython().run_cell_magic('fl_profile', '--fusion --backend rocm --no-plot --top 8 -o fus',\n"  # noqa: F821
             "                             \"enc(seq.to('fl')).sum().backward()\")"),
    ("code", "print('training step kernels, unfused -> fused:', fus.a.kernels, '->', fus.b.kernels)\n"
             "sdpa = 'aten::_scaled_dot_product_fused_attention_overrideable'\n"
             "ran = {s.op for s in fus.b.ops()}\n"
             "print('fused attention forward/backward ran:', {sdpa, sdpa + '_backward'} <= ran)"),
    ("md", "## A backend without the kernel: a performance hint\n\n"
           "`ascend` has no fused attention. Attention written as matmul → scale → mask → softmax → matmul (the "
           "Hugging Face way) keeps the math path there, and the report names the missing kernel."),
    ("code", "class SelfAttention(nn.Module):\n"
             "    def __init__(self, hidden=32, heads=4):\n"
             "        super().__init__()\n"
             "        self.heads, self.dim = heads, hidden // heads\n"
             "        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))\n"
             "    def split(self, t):\n"
             "        return t.view(t.shape[0], t.shape[1], self.heads, self.dim).transpose(1, 2)\n"
             "    def forward(self, h, mask):\n"
             "        q, k, v = self.split(self.query(h)), self.split(self.key(h)), self.split(self.value(h))\n"
             "        scores = torch.matmul(q, k.transpose(-1, -2)) / self.dim ** 0.5 + mask\n"
             "        return torch.matmul(torch.softmax(scores, dim=-1), v)\n"
             "torch.manual_seed(0)\n"
             "attn = SelfAttention()\n"
             "h, mask = torch.randn(2, 6, 32), torch.zeros(2, 1, 1, 6)\n"
             "for name in ('rocm', 'ascend'):\n"
             "    fl.set_backend(name)\n"
             "    c = fl.compile(copy.deepcopy(attn).to('fl'))\n"
             "    with warnings.catch_warnings(record=True):\n"
             "        warnings.simplefilter('always')\n"
             "        c(h.to('fl'), mask.to('fl'))\n"
             "    print(c.fusion_report.latest(), end='\\n\\n')"),
    ("md", "## Two backends, with and without fusion\n\n"
           "`fl.compare_backends(fn, a, b, fusion=True)` profiles the same code on two backends, each with "
           "fusion off and on (the timing cell is not compared; the next one prints the kernel counts)."),
    ("code", "compiled_resnet = fl.compile(copy.deepcopy(model))\n"
             "def step():\n"
             "    compiled_resnet.to(fl.current_device())\n"
             "    with torch.no_grad():\n"
             "        compiled_resnet(x.to(fl.current_device()))\n"),
    ("code", IGNORE + "cmp = fl.compare_backends(step, 'ascend', 'rocm', fusion=True)\n"  # noqa: F821
             "print(cmp.render(8))"),
    ("code", "print('kernels without fusion (ascend, rocm):', cmp.unfused.a.kernels, cmp.unfused.b.kernels)\n"
             "print('kernels with fusion    (ascend, rocm):', cmp.a.kernels, cmp.b.kernels)"),
]
