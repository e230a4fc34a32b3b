"""fl.compile: each fusion pass matches what it should, leaves alone what it
must not, and the fused model computes what the unfused one does (outputs
and gradients, eval and training) against native CPU PyTorch; switches,
hints, the eager fallback and the report."""

import copy
import json
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from torch import nn

import torch_fl as fl
from torch_fl.compile import CompileWarning, PerformanceHint
from torch_fl.compile import pointwise as pw
from torch_fl.models import ResNet

SDPA = "aten::_scaled_dot_product_fused_attention_overrideable"


def _on(backend: str, model: nn.Module) -> nn.Module:
    fl.set_backend(backend)
    return copy.deepcopy(model).to(fl.device(backend))


def _patterns(compiled, applied=True) -> list[str]:
    return [r.pattern for r in compiled.fusion_report.latest().records if r.applied == applied]


def _ops(prof) -> set[str]:
    return {s.op for s in prof.ops()}


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _check_training(model: nn.Module, x: torch.Tensor, backend: str, rel: float = 1e-4, passes=None):
    """Fused training step on `backend` against the unfused model on native CPU: outputs and every gradient."""
    torch.manual_seed(0)
    ref = copy.deepcopy(model).train()
    dev = _on(backend, model).train()
    compiled = fl.compile(dev, passes=passes)
    xr = x.clone().requires_grad_()
    xd = x.to(fl.device(backend)).requires_grad_()
    out_r, out_d = ref(xr), compiled(xd)
    w = torch.randn(out_r.shape)
    (out_r * w).sum().backward()
    (out_d * w.to(xd.device)).sum().backward()
    assert_close(out_d, out_r, rel, "output")
    assert_close(xd.grad, xr.grad, rel, "input grad")
    gr, gd = _grads(ref), _grads(dev)
    assert gr.keys() == gd.keys()
    for name in gr:
        assert_close(gd[name], gr[name], rel, name, scale_floor=1e-2)  # some are ~0 exactly (key bias)
    return compiled


# -- Conv + BN (+ ReLU) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def small_resnet():
    torch.manual_seed(0)
    m = ResNet((1, 1, 1, 1), num_classes=10, width=8)
    for mod in m.modules():  # non-trivial running statistics
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
            nn.init.uniform_(mod.weight, 0.5, 1.5)
            nn.init.uniform_(mod.bias, -0.2, 0.2)
    return m.eval()


@pytest.mark.parametrize("backend", ["ascend", "rocm"])
def test_conv_bn_relu_eval_matches_cpu_with_fewer_kernels(small_resnet, backend):
    x = torch.randn(2, 3, 32, 32)
    ref = small_resnet(x)
    compiled = fl.compile(_on(backend, small_resnet))
    with torch.no_grad():
        compiled(x.to("fl"))  # capture, JIT compile
        with fl.profile() as prof:
            out = compiled(x.to("fl"))
    assert_close(out, ref, 1e-4, "logits")
    patterns = _patterns(compiled)
    assert patterns.count("conv+bn+relu") + patterns.count("conv+bn") == 17  # every conv of the network
    if backend == "ascend":  # the backend's fused kernel
        assert patterns.count("conv+bn+relu") == 9 and "fl::conv_bn_relu" in _ops(prof)
        assert next(s for s in prof.ops() if s.op == "fl::conv_bn_relu").path == "native"
    else:  # folded into the convolution
        assert patterns.count("conv+bn") == 17 and "fl::conv_bn_relu" not in _ops(prof)
        assert "aten::native_batch_norm" not in _ops(prof) and "aten::_native_batch_norm_legit_no_training" \
            not in _ops(prof)
    report = compiled.measure(x.to("fl"))
    m = report.measurement
    assert m.kernels_after < m.kernels_before * 2 / 3
    for i, r in enumerate(report.records):  # each pattern: its unfused kernels -> one
        if r.pattern.startswith("conv+bn"):
            assert (m.per_pattern[i].kernels_before, m.per_pattern[i].kernels_after) == (r.pattern.count("+") + 1, 1)


def test_conv_bn_eval_backward_takes_the_folded_route(small_resnet):
    """The fused kernel has no backward: with autograd on, the fold is differentiable instead."""
    m = nn.Sequential(small_resnet.conv1, small_resnet.bn1, nn.ReLU()).eval()
    x = torch.randn(2, 3, 16, 16)
    xr = x.clone().requires_grad_()
    m(xr).square().sum().backward()
    dev = _on("ascend", m)
    compiled = fl.compile(dev, passes=["conv_bn"])
    xd = x.to("fl").requires_grad_()
    compiled(xd).square().sum().backward()
    assert _patterns(compiled) == ["conv+bn+relu"]
    assert_close(xd.grad, xr.grad, 1e-4, "input grad")
    for (name, pr), pd in zip(m.named_parameters(), dev.parameters(), strict=True):
        assert_close(pd.grad, pr.grad, 1e-4, name)


def test_folded_weights_follow_parameter_updates(small_resnet):
    m = nn.Sequential(copy.deepcopy(small_resnet.conv1), copy.deepcopy(small_resnet.bn1)).eval()
    x = torch.randn(1, 3, 16, 16)
    dev = _on("rocm", m)
    compiled = fl.compile(dev)
    with torch.no_grad():
        compiled(x.to("fl"))
        for mod in (m, dev):
            mod[0].weight.mul_(-2.0)
            mod[1].running_mean.add_(0.3)
        assert_close(compiled(x.to("fl")), m(x), 1e-4, "after an in-place update")


def test_conv_bn_not_fused_in_training_or_when_shared(small_resnet):
    m = nn.Sequential(small_resnet.conv1, small_resnet.bn1, nn.ReLU())
    compiled = _check_training(m, torch.randn(2, 3, 16, 16), "ascend", passes=["conv_bn"])  # batch stats: kept
    assert _patterns(compiled) == [] and _patterns(compiled, applied=False) == ["conv+bn"]
    assert "batch statistics" in compiled.fusion_report.latest().records[0].note

    class Shared(nn.Module):  # the convolution's output is used twice: folding would change the second use
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

        def forward(self, x):
            y = self.conv(x)
            return self.bn(y) + y

    s = Shared().eval()
    compiled = fl.compile(_on("ascend", s))
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        assert_close(compiled(x.to("fl")), s(x), 1e-4)
    assert "conv+bn" not in _patterns(compiled) + _patterns(compiled, applied=False)


# -- attention -------------------------------------------------------------------------


class HFSelfAttention(nn.Module):
    """Attention written the Hugging Face (BERT) way: three projections,
    matmul -> scale -> additive mask -> softmax -> dropout -> matmul."""

    def __init__(self, hidden=32, heads=4, dropout=0.0):
        super().__init__()
        self.heads, self.dim = heads, hidden // heads
        self.query, self.key, self.value = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(
            hidden, hidden)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden, hidden)

    def split(self, x):
        b, length, _ = x.shape
        return x.view(b, length, self.heads, self.dim).permute(0, 2, 1, 3)

    def forward(self, hidden, mask):
        q, k, v = self.split(self.query(hidden)), self.split(self.key(hidden)), self.split(self.value(hidden))
        scores = torch.matmul(q, k.transpose(-1, -2))
        scores = scores / math.sqrt(self.dim)
        scores = scores + mask
        probs = F.softmax(scores, dim=-1)
        probs = self.dropout(probs)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3)
        b, length = ctx.shape[0], ctx.shape[1]
        return self.out(ctx.reshape(b, length, -1))


def _hf_inputs():
    torch.manual_seed(1)
    x = torch.randn(2, 6, 32)
    mask = torch.zeros(2, 1, 1, 6)
    mask[1, ..., 4:] = -10000.0  # padding in the second sequence
    return x, mask


def test_explicit_attention_goes_to_the_fused_kernel_forward_and_backward():
    torch.manual_seed(0)
    m = HFSelfAttention()
    x, mask = _hf_inputs()
    xr = x.clone().requires_grad_()
    ref = m(xr, mask)
    ref.square().sum().backward()
    dev = _on("rocm", m)
    compiled = fl.compile(dev)
    xd = x.to("fl").requires_grad_()
    with fl.profile() as prof:
        out = compiled(xd, mask.to("fl"))
        out.square().sum().backward()
    assert {"matmul-softmax-matmul attention", "QKV projections"} <= set(_patterns(compiled))
    assert SDPA in _ops(prof) and SDPA + "_backward" in _ops(prof)
    assert "aten::_softmax" not in _ops(prof) and "aten::bmm" not in _ops(prof)
    assert_close(out, ref, 1e-4, "output")
    assert_close(xd.grad, xr.grad, 1e-4, "input grad")
    for (name, pr), pd in zip(m.named_parameters(), dev.parameters(), strict=True):
        assert_close(pd.grad, pr.grad, 1e-4, name, scale_floor=1e-2)  # the key bias gradient is ~0 exactly


def test_missing_attention_kernel_keeps_math_path_and_hints():
    torch.manual_seed(0)
    m = HFSelfAttention()
    x, mask = _hf_inputs()
    compiled = fl.compile(_on("ascend", m), passes=["attention"])
    with pytest.warns(PerformanceHint, match=r"'ascend' has no fused attention kernel \(" + SDPA):
        out = compiled(x.to("fl"), mask.to("fl"))
    assert_close(out, m(x, mask), 1e-4)
    report = compiled.fusion_report.latest()
    assert _patterns(compiled) == [] and _patterns(compiled, applied=False) == ["matmul-softmax-matmul attention"]
    assert report.hints and "math path" in report.hints[0] and "(model)" in report.hints[0]


def test_explicit_attention_not_matched_when_probabilities_are_used():
    class ReturnsProbs(HFSelfAttention):
        def forward(self, hidden, mask):
            q, k = self.split(self.query(hidden)), self.split(self.key(hidden))
            probs = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) + mask, -1)
            return torch.matmul(probs, self.split(self.value(hidden))), probs

    torch.manual_seed(0)
    m = ReturnsProbs()
    x, mask = _hf_inputs()
    compiled = fl.compile(_on("rocm", m), passes=["attention"])
    out, probs = compiled(x.to("fl"), mask.to("fl"))
    ref_out, ref_probs = m(x, mask)
    assert "matmul-softmax-matmul attention" not in _patterns(compiled) + _patterns(compiled, applied=False)
    assert_close(out, ref_out, 1e-4)
    assert_close(probs, ref_probs, 1e-4)


def _encoder(dropout=0.0, layers=2):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=dropout, batch_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


def test_transformer_encoder_training_matches_cpu_with_fewer_kernels():
    x = torch.randn(2, 7, 32)
    compiled = _check_training(_encoder(), x, "rocm")
    assert _patterns(compiled).count("multi-head attention") == 2
    xd = x.to("fl")
    report = compiled.measure(xd)
    assert report.measurement.workload == "forward+backward"
    assert report.measurement.kernels_after < report.measurement.kernels_before * 0.75


def test_transformer_key_padding_mask_eval_matches_cpu():
    m = _encoder().eval()
    x = torch.randn(2, 7, 32)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[0, 5:] = True
    with torch.no_grad():
        ref = m(x, src_key_padding_mask=pad)
        compiled = fl.compile(_on("rocm", m))
        out = compiled(x.to("fl"), src_key_padding_mask=pad.to("fl"))
    keep = ~pad
    assert_close(out[keep.to("fl")], ref[keep], 1e-4)  # PyTorch's fast path leaves padded rows undefined
    assert _patterns(compiled).count("multi-head attention") == 2


def test_mha_with_weights_used_is_kept():
    class UsesWeights(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

        def forward(self, x):
            out, weights = self.attn(x, x, x)
            return out, weights

    torch.manual_seed(0)
    m = UsesWeights()
    x = torch.randn(2, 5, 16)
    compiled = fl.compile(_on("rocm", m))
    out, weights = compiled(x.to("fl"))
    ref_out, ref_w = m(x)
    assert_close(out, ref_out, 1e-4)
    assert_close(weights, ref_w, 1e-4)
    rec = compiled.fusion_report.latest().records[0]
    assert not rec.applied and "need_weights" in rec.note and rec.path == "attn"


# -- QKV -------------------------------------------------------------------------------


def test_qkv_projections_become_one_gemm():
    class Proj(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 8)
            self.other = nn.Linear(16, 16)

        def forward(self, x, y):
            return self.q(x) * 2 + self.k(x), self.v(x), self.other(y)

    torch.manual_seed(0)
    m = Proj()
    x, y = torch.randn(3, 16), torch.randn(3, 16)
    compiled = fl.compile(_on("rocm", m), passes=["qkv"])
    with torch.no_grad():
        compiled(x.to("fl"), y.to("fl"))
        with fl.profile() as prof:
            outs = compiled(x.to("fl"), y.to("fl"))
    for o, r in zip(outs, m(x, y), strict=True):
        assert_close(o, r, 1e-5)
    rec = compiled.fusion_report.latest().records
    assert [r.pattern for r in rec] == ["QKV projections"] and rec[0].path == "q, k, v"  # `other` reads y
    gemms = sum(s.calls for s in prof.ops() if s.op in ("aten::addmm", "aten::mm"))
    assert gemms == 2  # q, k, v in one; `other` on its own


def test_qkv_training_gradients_match_cpu():
    class Proj(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x):
            return self.q(x) * self.k(x) + self.v(x)

    compiled = _check_training(Proj(), torch.randn(4, 16), "ascend")
    assert "QKV projections" in _patterns(compiled)


# -- elementwise chains ------------------------------------------------------------------


class BiasGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 24, bias=False)
        self.bias = nn.Parameter(torch.randn(24))
        self.act = nn.GELU()

    def forward(self, x, r):
        h = self.act(self.lin(x) + self.bias)
        return F.relu(h + r) * 0.5


@pytest.mark.parametrize("backend", ["rocm", "minimal"])
def test_elementwise_chain_is_one_jit_kernel_forward_and_backward(backend):
    torch.manual_seed(0)
    m = BiasGelu()
    x, r = torch.randn(5, 16), torch.randn(5, 24)
    compiled = fl.compile(_on(backend, m), passes=["pointwise"])
    xd, rd = x.to("fl"), r.to("fl").requires_grad_()
    compiled(xd, rd)
    with fl.profile() as prof:
        out = compiled(xd, rd)
    chains = [s for s in prof.ops() if s.op.startswith("fl::fused_pointwise(")]
    assert [s.op for s in chains] == ["fl::fused_pointwise(add,gelu,add,relu,mul)"]  # the whole chain
    assert chains[0].kernels == 1 and chains[0].path == "jit"
    assert not {"aten::gelu", "aten::add.Tensor", "aten::relu"} & _ops(prof)
    rr = r.clone().requires_grad_()
    ref = m(x, rr)
    assert_close(out, ref, 1e-5)
    g = torch.randn(ref.shape)
    ref.backward(g)
    with fl.profile() as prof:
        out.backward(g.to("fl"))
    back = [s for s in prof.ops() if s.op.startswith("fl::fused_pointwise_backward")]
    # three inputs need a gradient; the linear output and the bias share one formula: two kernels
    assert len(back) == 1 and back[0].kernels == 2 and set(back[0].paths) <= {"jit", "jit-compile"}
    assert_close(rd.grad, rr.grad, 1e-5, "grad of r")
    for (name, pr), pd in zip(m.named_parameters(), compiled.model.parameters(), strict=True):
        assert_close(pd.grad, pr.grad, 1e-5, name)  # the bias gradient sums over the broadcast dimension


def test_elementwise_chain_not_fused_when_an_intermediate_is_reused():
    class Reuse(nn.Module):
        def forward(self, x, y):
            s = x + y
            return torch.relu(s), s

    m = Reuse()
    compiled = fl.compile(_on("rocm", m), passes=["pointwise"])
    x, y = torch.randn(4), torch.randn(4)
    a, s = compiled(x.to("fl"), y.to("fl"))
    assert _patterns(compiled) == []
    assert_close(a, torch.relu(x + y))


def test_elementwise_chain_runs_unfused_where_no_kernel_can_be_made():
    """Native CPU tensors, and mixed dtypes on fl: the chain's own ops run, same values."""
    torch.manual_seed(0)
    m = BiasGelu()
    x, r = torch.randn(3, 16), torch.randn(3, 24)
    compiled = fl.compile(copy.deepcopy(m), passes=["pointwise"])
    assert_close(compiled(x, r), m(x, r), 1e-6)
    assert compiled.fusion_report.latest().backend == "native"
    before = pw.STATS["eager"]
    compiled = fl.compile(_on("rocm", m), passes=["pointwise"])
    compiled(x.to("fl"), r.double().to("fl"))
    assert pw.STATS["eager"] > before


# -- layout ----------------------------------------------------------------------------


def test_channels_last_only_where_declared_and_only_at_the_edges(small_resnet):
    m = nn.Sequential(small_resnet.conv1, small_resnet.bn1, nn.ReLU(), nn.Conv2d(8, 4, 3)).eval()
    x = torch.randn(2, 3, 16, 16)
    ref = m(x)
    for backend, expect in (("ascend", True), ("rocm", False)):
        compiled = fl.compile(_on(backend, m), passes=["layout"])
        with torch.no_grad():
            out = compiled(x.to("fl"))
        assert_close(out, ref, 1e-4)
        assert out.is_contiguous()
        graph = next(iter(compiled._graphs.values())).gm.graph
        edges = [n.target.__name__ for n in graph.nodes if n.op == "call_function"]
        assert (edges == ["to_channels_last", "to_contiguous_tree"]) == expect
        assert ("layout" in _patterns(compiled)) == expect
    assert fl.capabilities("ascend").devices[0] and fl.device("ascend")


# -- switches, fallback, errors --------------------------------------------------------


def test_passes_switch_off_by_api_and_environment(small_resnet, monkeypatch):
    x = torch.randn(1, 3, 16, 16).to(fl.device("ascend"))
    dev = _on("ascend", small_resnet)
    with torch.no_grad():
        off = fl.compile(dev, passes={"conv_bn": False})
        off(x)
        assert "conv+bn+relu" not in _patterns(off) and "elementwise chain" in _patterns(off)
        monkeypatch.setenv("FL_FUSION_DISABLE", "pointwise, layout")
        env = fl.compile(dev)
        env(x)
        assert env.passes == ["conv_bn", "attention", "qkv", "add_norm", "linear_act"]
        assert "elementwise chain" not in _patterns(env) and "conv+bn+relu" in _patterns(env)
        monkeypatch.setenv("FL_COMPILE", "0")
        eager = fl.compile(dev)
        assert_close(eager(x), small_resnet(x.cpu()), 1e-4)
        assert eager.fusion_report.graphs == []
    monkeypatch.setenv("FL_FUSION_DISABLE", "conv_bn,fold")
    with pytest.raises(ValueError, match=r"FL_FUSION_DISABLE names an unknown pass 'fold'; the passes are"):
        fl.compile(dev)


def test_bad_arguments_say_what_to_do():
    m = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"unknown fusion pass\(es\) \['fusion'\]; the passes are \['conv_bn'"):
        fl.compile(m, passes=["fusion"])
    with pytest.raises(ValueError, match="unknown fusion pass"):
        fl.compile(m, passes={"convbn": False})
    with pytest.raises(TypeError, match=r"give a list of pass names.*passes=\['qkv'\]"):
        fl.compile(m, passes="qkv")
    with pytest.raises(TypeError, match="takes an nn.Module, not function"):
        fl.compile(lambda x: x)
    with pytest.raises(TypeError, match="already compiled; compile the original"):
        fl.compile(fl.compile(m))
    with pytest.raises(TypeError, match="leaf_modules must be nn.Module subclasses"):
        fl.compile(m, leaf_modules=(int,))
    with pytest.raises(TypeError, match="fl.compile: .*argument"):
        fl.compile(m)(torch.randn(2), torch.randn(2))


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:  # control flow on a value: symbolic tracing cannot follow it
            return torch.relu(self.lin(x)) * 2
        return self.lin(x)


class Wrapper(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = DataDependent()
        self.head = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.head(self.inner(x)) + 1)


def test_capture_failure_falls_back_to_eager_with_a_message():
    torch.manual_seed(0)
    m = Wrapper()
    x = torch.randn(3, 4).abs()
    compiled = fl.compile(_on("rocm", m))
    with pytest.warns(CompileWarning, match=r"could not capture Wrapper \(TraceError.*leaf_modules=\(ThatModule,\)"):
        out = compiled(x.to("fl"))
    assert_close(out, m(x), 1e-5)
    report = compiled.fusion_report.latest()
    assert report.fallback.startswith("TraceError") and "capture failed, running eagerly" in report.render()
    with pytest.raises(RuntimeError, match="nothing to measure: the model was not captured"):
        compiled.measure(x.to("fl"))
    fixed = fl.compile(compiled.model, leaf_modules=(DataDependent,))  # the hint works
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)
        assert_close(fixed(x.to("fl")), m(x), 1e-5)
    assert fixed.fusion_report.latest().fallback is None and _patterns(fixed) == ["elementwise chain"]


# -- the report ---------------------------------------------------------------------------


def test_report_is_data_table_and_figure(small_resnet):
    compiled = fl.compile(_on("ascend", small_resnet))
    x = torch.randn(1, 3, 16, 16).to("fl")
    report = compiled.measure(x)
    data = json.loads(compiled.fusion_report.to_json())
    graph = data["graphs"][0]
    assert graph["backend"] == "ascend" and graph["training"] is False
    assert graph["measurement"]["kernels_after"] < graph["measurement"]["kernels_before"]
    rows = compiled.fusion_report.rows()
    assert {r["path"] for r in rows} >= {"conv1", "layer1.0.conv1", "layer4.0.downsample.0"}
    text = compiled.fusion_report.table()
    assert "fusion on 'ascend' (eval)" in text and "fl::conv_bn_relu" in text and "3 -> 1" in text
    assert report.counts()["conv+bn+relu"] == 9
    from torch_fl.notebook import fusion_figure

    fig = fusion_figure(compiled.fusion_report)
    bars = {t.name: list(t.y) for t in fig.data}
    assert bars["unfused"][0] == report.measurement.kernels_before
    assert bars["fused"][0] == report.measurement.kernels_after


def test_compare_backends_shows_kernels_with_and_without_fusion(small_resnet):
    compiled = fl.compile(copy.deepcopy(small_resnet))
    x = torch.randn(1, 3, 16, 16)

    def step():
        compiled.to(fl.current_device())
        with torch.no_grad():
            compiled(x.to(fl.current_device()))

    cmp = fl.compare_backends(step, "ascend", "rocm", fusion=True)
    assert cmp.unfused is not None
    assert cmp.a.kernels < cmp.unfused.a.kernels and cmp.b.kernels < cmp.unfused.b.kernels
    text = cmp.render()
    assert f"without fusion {cmp.unfused.a.kernels} vs {cmp.unfused.b.kernels}" in text
    assert cmp.to_dict()["kernels_unfused"] == [cmp.unfused.a.kernels, cmp.unfused.b.kernels]


# -- GEMM epilogues, residual add + LayerNorm, attention with dropout (rocm kernels) ------------

from torch_fl import fused  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_epilogue_kernels_match_the_reference_with_gradients_and_dropout(dtype):
    """Each fused rocm kernel (forward and its one-kernel backward) against its CPU reference, dropout
    included: the masks are counter-based, so kernel and reference drop the same elements."""
    torch.manual_seed(0)
    tol = 1e-4 if dtype == torch.float32 else 1e-10

    def t(*shape):
        return torch.randn(*shape, dtype=dtype, requires_grad=True)

    x, w, b, r, lw, lb, y = t(2, 5, 16), t(24, 16), t(24), t(2, 5, 24), t(24), t(24), t(2, 5, 24)
    q, k, v = t(2, 3, 7, 8), t(2, 3, 9, 8), t(2, 3, 9, 8)
    cases = [("fl::linear_act", torch.ops.fl.linear_act, (x, w, b), (2, 0.3, 11, True)),
             ("fl::linear_act", torch.ops.fl.linear_act, (x, w, None), (1, 0.3, 12, False)),
             ("fl::linear_add_layer_norm", torch.ops.fl.linear_add_layer_norm, (x, w, b, r, lw, lb),
              (1e-5, 0.25, 13, True)),
             ("fl::add_layer_norm", torch.ops.fl.add_layer_norm, (y, r, lw, None), (1e-5, 0.0, 0, True)),
             ("fl::attention_dropout", torch.ops.fl.attention_dropout, (q, k, v, None), (0.2, False, 14, None))]
    for name, op, tensors, rest in cases:
        for a in tensors:
            if a is not None:
                a.grad = None
        ref = op(*tensors, *rest)[0]  # CPU: the reference (aten ops, torch-computed mask)
        g = torch.randn_like(ref)
        ref.backward(g)
        fl.set_backend("rocm")
        dev = [a.detach().to("fl").requires_grad_() if a is not None else None for a in tensors]
        with fl.profile() as prof:
            out = op(*dev, *rest)[0]
            out.backward(g.to("fl"))
        by_op = {s.op: s.path for s in prof.ops()}
        assert by_op[name] == "native" and by_op[name + "_backward"] == "native", by_op
        assert_close(out, ref, tol, name)
        for a, d in zip(tensors, dev, strict=True):
            if a is not None:
                assert_close(d.grad, a.grad, tol, f"{name} grad")
    keep = fused.keep_mask(7, (200000,), 0.1, "cpu").float().mean().item()
    assert abs(keep - 0.9) < 0.005


def _per_layer(compiled, x, layers=2) -> tuple[float, float]:
    m = compiled.measure(x).measurement
    return m.kernels_before / layers, m.kernels_after / layers


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_transformer_encoder_kernels_per_layer_halved_on_rocm(dropout):
    """The issue's goal, on a small encoder: eval and a training step (dropout 0 and 0.1) on rocm
    use at most half the kernels per layer; the linear + residual + LayerNorm, linear + ReLU and
    attention-with-dropout kernels are what replaced them."""
    m = _encoder(dropout)
    x = torch.randn(2, 7, 32)
    dev = _on("rocm", m)
    compiled = fl.compile(dev)
    if dropout == 0.0:
        dev.eval()
        with torch.no_grad():
            assert_close(compiled(x.to("fl")), m.eval()(x), 1e-4, "eval output")
        before, after = _per_layer(compiled, x.to("fl"))
        assert after * 2 <= before, (before, after)
        assert _patterns(compiled).count("linear+add+layer_norm") == 4
        assert _patterns(compiled).count("linear+relu") == 2
        m.train()
    dev.train()
    before, after = _per_layer(compiled, x.to("fl"))
    assert after * 2 <= before, (before, after)
    report = compiled.fusion_report.latest(training=True)
    kinds = [r.replacement.split(" ")[0] for r in report.applied]
    assert kinds.count("fl::linear_add_layer_norm") == 4 and kinds.count("fl::linear_act") == 2
    if dropout:
        assert all("fl::attention_dropout" in r.replacement for r in report.applied if r.pattern ==
                   "multi-head attention")


def test_transformer_training_with_fused_kernels_matches_cpu():
    """Gradients through the fused kernels (dropout 0) against native CPU PyTorch, every parameter."""
    x = torch.randn(2, 7, 32)
    compiled = _check_training(_encoder(), x, "rocm")
    assert {"linear+add+layer_norm", "linear+relu"} <= set(_patterns(compiled))


def test_transformer_dropout_training_kernels_match_their_references():
    """With dropout 0.1 the fused graph on rocm (kernels) and the same graph on CPU tensors (the ops'
    reference decompositions) draw the same seeds and masks: outputs and gradients agree."""
    m = _encoder(0.1)
    dev = _on("rocm", m).train()
    compiled = fl.compile(dev)
    x = torch.randn(2, 7, 32)
    torch.manual_seed(3)
    out = compiled(x.to("fl"))
    gm = next(iter(compiled._graphs.values())).gm
    w = torch.randn(out.shape)
    (out * w.to("fl")).sum().backward()
    ref_gm = copy.deepcopy(gm).to("cpu")
    for p in ref_gm.parameters():
        p.grad = None
    torch.manual_seed(3)
    ref = ref_gm(x)
    (ref * w).sum().backward()
    assert_close(out, ref, 1e-4, "output")
    grads = dict(ref_gm.named_parameters())
    for name, p in gm.named_parameters():
        assert_close(p.grad, grads[name].grad, 1e-4, name, scale_floor=1e-2)
    assert not torch.allclose(ref, m.eval()(x), atol=1e-3)  # dropout was applied


def test_add_norm_and_linear_act_match_only_what_they_should():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)
            self.n1, self.n2 = nn.LayerNorm(16), nn.LayerNorm([4, 16])
            self.tanh = nn.Tanh()

        def forward(self, x):
            h = self.a(x)
            y = self.n1(x + h)  # h is used again below: only the add + norm can fuse, not the GEMM
            z = self.n2(y + self.b(y))  # 2-D normalized shape: not matched
            return z + h + self.tanh(self.c(z))  # Linear -> Tanh: no kernel epilogue for tanh

    torch.manual_seed(0)
    m = Block().eval()
    x = torch.randn(3, 4, 16)
    compiled = fl.compile(_on("rocm", m))
    with torch.no_grad():
        out = compiled(x.to("fl"))
    assert_close(out, m(x), 1e-4)
    assert "add+layer_norm" in _patterns(compiled)
    assert "linear+add+layer_norm" not in _patterns(compiled)
    assert not [p for p in _patterns(compiled) if p.startswith("linear+")]


def test_missing_epilogue_kernels_keep_the_ops_and_hint():
    m = _encoder().eval()
    x = torch.randn(2, 7, 32)
    compiled = fl.compile(_on("ascend", m))
    with torch.no_grad(), pytest.warns(PerformanceHint) as caught:
        out = compiled(x.to("fl"))
    assert_close(out, m(x), 1e-4)
    text = " ".join(str(w.message) for w in caught)
    assert "'ascend' has no fl::linear_add_layer_norm kernel" in text and "fl::linear_act kernel" in text
    assert _patterns(compiled, applied=False).count("add+layer_norm") == 4
    assert not [p for p in _patterns(compiled) if "layer_norm" in p or p.startswith("linear")]


def test_epilogue_passes_switch_off():
    m = _encoder().eval()
    x = torch.randn(2, 7, 32).to(fl.device("rocm"))
    dev = _on("rocm", m)
    off = fl.compile(dev, passes={"add_norm": False, "linear_act": False})
    on = fl.compile(dev)
    with torch.no_grad():
        assert_close(off(x), on(x), 1e-4)
    assert not [p for p in _patterns(off) if "layer_norm" in p or p.startswith("linear")]
    assert _per_layer(off, x)[1] == 10 and _per_layer(on, x)[1] == 5
