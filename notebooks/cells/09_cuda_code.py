"""09_cuda_code: a cell written for an NVIDIA GPU runs unchanged on rocm and minimal through the cuda alias,
profiled op by op, and compared with plain CPU PyTorch (notebooks/build.py builds it)."""

CELLS = [
    ("md", "# Code written for CUDA, unchanged, on any fl backend\n\n"
           "Most PyTorch code in the wild is written for an NVIDIA GPU: `device = \"cuda\" if "
           "torch.cuda.is_available() else \"cpu\"`, `.cuda()`, `torch.autocast(\"cuda\")`, "
           "`torch.amp.GradScaler(\"cuda\")`, `torch.cuda.synchronize()`. The opt-in **cuda alias** runs it on the "
           "active fl backend without an edit: `%fl_backend rocm --as-cuda` in a notebook, "
           "`torch_fl.alias_cuda()` in Python, or `FL_ALIAS_CUDA=1` for a script (then `import torch` alone is "
           "enough). Tensors keep reporting their real device (`fl:N`). docs/user-guide.md (\"Code written for "
           "CUDA\") lists what it covers and what it does not."),
    ("code", SETUP + "\n"  # noqa: F821 - provided by notebooks/build.py
             "import os, subprocess, sys, tempfile\n"
             "work, runs = tempfile.mkdtemp(), {}\n"
             "print('CUDA available:', torch.cuda.is_available())\n"
             "try:\n"
             "    torch.zeros(1, device='cuda')\n"
             "except AssertionError as e:\n"
             "    print('without the alias:', e)"),
    ("md", "## The CUDA cell\n\n"
           "Written as for an NVIDIA GPU: a small classifier trained with mixed precision and loss scaling. "
           "It is saved to a file, so the same code can also run as a plain script further down."),
    ("code", "%%writefile {work}/cuda_cell.py\n"
             "import torch\n"
             "from torch import nn\n"
             "\n"
             "device = \"cuda\" if torch.cuda.is_available() else \"cpu\"\n"
             "torch.manual_seed(0)\n"
             "model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 4)).to(device)\n"
             "opt = torch.optim.AdamW(model.parameters(), lr=1e-2)\n"
             "scaler = torch.amp.GradScaler(\"cuda\")\n"
             "x = torch.randn(64, 32).cuda() if device == \"cuda\" else torch.randn(64, 32)\n"
             "y = torch.randint(0, 4, (64,)).to(device, non_blocking=True)\n"
             "losses = []\n"
             "for step in range(4):\n"
             "    opt.zero_grad(set_to_none=True)\n"
             "    with torch.autocast(device_type=\"cuda\"):\n"
             "        logits = model(x)\n"
             "        loss = nn.functional.cross_entropy(logits, y)\n"
             "    scaler.scale(loss).backward()\n"
             "    scaler.step(opt)\n"
             "    scaler.update()\n"
             "    losses.append(loss.item())\n"
             "if device == \"cuda\":\n"
             "    torch.cuda.synchronize()\n"
             "print(device, next(model.parameters()).device, logits.dtype, [round(v, 4) for v in losses])"),
    ("md", "## Turn the alias on, then run the cell on `rocm` and on `minimal`\n\n"
           "`--as-cuda` makes `cuda` mean the current fl backend from now on; it follows later backend switches, "
           "so `%%fl_profile --compare minimal` runs the same cell once on `rocm` (fp16 autocast, 2 devices, "
           "fused kernels) and once on `minimal` (a bring-up chip: bf16 autocast, 33 native kernels), and lines the "
           "two profiles up op by op."),
    ("code", "%fl_backend rocm --as-cuda\n"
             "print(torch.cuda.is_available(), torch.cuda.device_count(), torch.cuda.get_device_name())"),
    ("code", "%%fl_profile --compare minimal -o cmp --top 12\n" + IGNORE  # noqa: F821
             + "%run -i {work}/cuda_cell.py\n"
               "runs[fl.get_current_backend_name()] = (str(logits.dtype), losses)"),
    ("md", "Times vary from run to run, so the table above is not compared by the notebook check; what follows "
           "is. Where did the cell's ops go? On `rocm` the matmuls, the norm, GELU and the softmax run native "
           "kernels; on `minimal` they are decompositions into its few kernels and JIT kernels. The GradScaler's two "
           "bookkeeping ops (`_amp_foreach_non_finite_check_and_unscale_`, `_amp_update_scale_`) have no device "
           "kernel on either backend and run on the host (on `minimal` so do a few dtype copies and `reciprocal`): the "
           "profile names what a vendor would be asked for."),
    ("code", "rows = {r['op']: r for r in cmp.rows()}\n"
             "for op in ('aten::addmm', 'aten::native_layer_norm', 'aten::gelu', 'aten::_log_softmax'):\n"
             "    print(f\"{op:<26} rocm | minimal: {rows[op]['path']}\")\n"
             "print('kernels rocm vs minimal:', cmp.a.kernels, 'vs', cmp.b.kernels)\n"
             "for name, prof in (('rocm', cmp.a), ('minimal', cmp.b)):\n"
             "    print(name, 'ops with CPU fallbacks:', sorted(s.op for s in prof.fallbacks()))\n"
             "for backend, (dtype, losses) in runs.items():\n"
             "    print(backend, 'autocast dtype', dtype, '| loss decreasing:',\n"
             "          losses == sorted(losses, reverse=True))"),
    ("md", "## The same code as a plain script, on the CPU, as the reference\n\n"
           "Run by plain PyTorch (torch_fl not loaded), the cell finds no GPU and trains in float32 on the CPU. The "
           "fl runs are within a few roundings of their autocast dtype of it."),
    ("code", "env = {k: v for k, v in os.environ.items() if not k.startswith('FL_')}\n"
             "env['TORCH_DEVICE_BACKEND_AUTOLOAD'] = '0'\n"
             "r = subprocess.run([sys.executable, os.path.join(work, 'cuda_cell.py')], env=env, capture_output=True,\n"
             "                   text=True, timeout=600)\n"
             "print(r.stdout.strip())\n"
             "cpu = [float(v) for v in r.stdout.split('[')[1].rstrip(']\\n').split(',')]\n"
             "for backend, (dtype, losses) in runs.items():\n"
             "    tol = 4 * torch.finfo(getattr(torch, dtype.split('.')[1])).eps\n"
             "    close = [abs(a - b) <= tol * abs(b) + 5e-5 for a, b in zip(losses, cpu, strict=True)]  # 4 digits\n"
             "    print(backend, 'within', tol, 'of CPU float32:', all(close))"),
    ("md", "## Where CUDA code needs care\n\n"
           "Tensors report their real device, so a test like `x.is_cuda` or `x.device.type == \"cuda\"` is false "
           "on an fl backend: compare with `torch.device(\"cuda\")` through the alias (`x.device == "
           "torch.ones(0, device=\"cuda\").device`), or ask `x.device.type != \"cpu\"`. What the alias cannot "
           "cover raises an error that names the feature and what to do instead:"),
    ("code", "x = torch.ones(2).cuda()\n"
             "print(x.device, x.is_cuda, x.device.type == 'cuda', x.device.type != 'cpu')\n"
             "try:\n"
             "    torch.cuda.CUDAGraph()\n"
             "except NotImplementedError as e:\n"
             "    print(type(e).__name__, e)"),
    ("code", "import shutil\nshutil.rmtree(work)\n%fl_backend cpu"),
]
