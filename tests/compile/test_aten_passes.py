"""backend="fl"'s qkv and pointwise passes (layout: test_layout.py) and linear -> act -> dropout in
training (torch_fl/compile/passes/: qkv.py, pointwise_fusion.py, linear_act.py): each applies where the capability table
allows, matches eager in outputs and every gradient (judged against float64 on the
host), is named in the report, goes away when switched off, and is recorded as kept,
with the reason, on a backend without what it needs."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_fl as fl
from torch_fl import fused
from torch_fl.compile import dynamo as fl_dynamo

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _close(a: torch.Tensor, ref: torch.Tensor, rtol: float = 1e-4) -> None:
    a, ref = a.detach().cpu().double(), ref.detach().cpu().double()
    torch.testing.assert_close(a, ref, rtol=rtol, atol=rtol * max(1.0, ref.abs().max().item()))


def _patterns(report, name: str, applied: bool | None = True) -> list:
    return [p for p in report.patterns(applied) if p.pattern.startswith(name)]


def _train_step(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = net(x)
    out.square().mean().backward()
    return out


def _check_against_float64(model: nn.Module, compiled, x: torch.Tensor) -> None:
    """Compiled output and gradients (fl, float32) against eager float64 on the host."""
    ref = copy.deepcopy(model).cpu().double()
    out = _train_step(compiled, x)
    want = _train_step(ref, x.cpu().double())
    _close(out, want)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        _close(p.grad, q.grad, rtol=1e-3)


class SelfAttention(nn.Module):
    """Hugging Face BERT-style attention: three nn.Linear on one input, heads, softmax."""

    def __init__(self, d: int = 16, heads: int = 2):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.heads = heads

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = (f(x).view(b, n, self.heads, d // self.heads).transpose(1, 2) for f in (self.q, self.k, self.v))
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, -1)
        return (att @ v).transpose(1, 2).reshape(b, n, d)


# -- qkv -------------------------------------------------------------------------------------


def test_qkv_one_gemm_matches_float64_and_saves_kernels():
    fl.set_backend("cpu")
    torch.manual_seed(0)
    model = SelfAttention().to("fl")
    x = torch.randn(2, 5, 16).to("fl")
    compiled = torch.compile(model, backend="fl")
    _check_against_float64(model, compiled, x)
    report = fl_dynamo.fusion_report(compiled)
    (p,) = _patterns(report, "QKV projections")
    assert p.graph == "captured" and p.where == "q, k, v" and p.replaced == ["linear"] * 3
    # the weight and bias concatenations stay kernels where their gradient is needed
    assert {q.graph for q in _patterns(report, "QKV weight concatenation", applied=False)} == {"forward"}

    def kernels(net) -> int:
        _train_step(net, x)
        with fl.profile() as prof:
            _train_step(net, x)
        return prof.kernels

    fused_step = kernels(compiled)
    fl_dynamo.reset()
    off = torch.compile(model, backend="fl", options={"passes": {"qkv": False}})
    unfused_step = kernels(off)
    assert not _patterns(fl_dynamo.fusion_report(off), "QKV")
    # forward: 2 cats + 1 GEMM for 3 GEMMs; backward: 1 GEMM per gradient for 3, no adds of the 3 input gradients
    assert fused_step < unfused_step, (fused_step, unfused_step)


def test_qkv_leaves_projections_whose_weight_is_computed_after_the_first():
    class Late(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            y = self.a(x)
            return y + F.linear(x, self.b.weight * y.mean(), self.b.bias)  # b's weight depends on a's output

    fl.set_backend("cpu")
    torch.manual_seed(0)
    model = Late().to("fl")
    compiled = torch.compile(model, backend="fl")
    _check_against_float64(model, compiled, torch.randn(4, 8).to("fl"))
    assert not _patterns(fl_dynamo.fusion_report(compiled), "2 projections")


def test_qkv_inference_caches_the_concatenated_weights_until_they_change():
    fl.set_backend("cpu")
    torch.manual_seed(0)
    model = SelfAttention().to("fl")
    x = torch.randn(2, 5, 16).to("fl")
    compiled = torch.compile(model, backend="fl")
    with torch.no_grad():
        compiled(x)
        with fl.profile() as warm:
            out = compiled(x)
        _close(out, model(x))
        assert not [o for o in warm.ops() if o.op == "aten::cat"]  # both concatenations come from the cache
        model.k.weight.mul_(2.0)  # an in-place update bumps the version: the cache is recomputed
        with fl.profile() as changed:
            out = compiled(x)
        _close(out, model(x))
        assert sum(o.calls for o in changed.ops() if o.op == "aten::cat") == 1  # the weights' only
    report = fl_dynamo.fusion_report(compiled)
    assert {p.graph for p in _patterns(report, "QKV weight concatenation")} == {"inference"}


# -- pointwise -------------------------------------------------------------------------------


class Swish(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.full((8,), 0.7))

    def forward(self, x):
        h = self.lin(x)
        return h * torch.sigmoid(h) * self.scale + torch.tanh(h)


def test_pointwise_chain_is_one_jit_kernel_forward_and_backward():
    fl.set_backend("cpu")
    torch.manual_seed(0)
    model = Swish().to("fl")
    x = torch.randn(4, 8).to("fl")
    compiled = torch.compile(model, backend="fl")
    _check_against_float64(model, compiled, x)
    report = fl_dynamo.fusion_report(compiled)
    assert {p.graph for p in _patterns(report, "elementwise chain")} == {"forward", "backward"}

    def kernels(net) -> tuple[int, list[str]]:
        _train_step(net, x)
        with fl.profile() as prof:
            _train_step(net, x)
        return prof.kernels, [o.op for o in prof.ops()]

    fused_step, ops = kernels(compiled)
    assert any(op.startswith("fl::fused_pointwise") for op in ops)
    fl_dynamo.reset()
    off = torch.compile(model, backend="fl", options={"passes": {"pointwise": False}})
    unfused_step, ops = kernels(off)
    assert not any(op.startswith("fl::fused_pointwise") for op in ops)
    assert not _patterns(fl_dynamo.fusion_report(off), "elementwise chain", applied=None)
    assert fused_step < unfused_step, (fused_step, unfused_step)


class _DropoutChain(nn.Module):
    """Dropout after an elementwise chain: its backward multiplies the gradient by a bool mask."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.drop = nn.Linear(16, 32), nn.Linear(32, 4), nn.Dropout(0.3)

    def forward(self, x):
        return self.b(self.drop(torch.tanh(self.a(x)) * 2 + 1))


class _WhereChain(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)

    def forward(self, x):
        h = self.a(x)
        return torch.where(h > 0, torch.sigmoid(h) * 2 + 1, h * 0.5)


@pytest.mark.parametrize("backend", ["cpu", "minimal"])
def test_pointwise_chains_take_bool_masks(backend):
    """Issue 27: a chain whose op takes a bool mask (dropout's backward, where) is one kernel too: the mask
    is loaded as 0/1, as PyTorch's promotion converts it. The dropout model against the same compiled graph
    without the pass (the same masks: one seed), the where model against float64."""
    fl.set_backend(backend)
    torch.manual_seed(0)
    model = _DropoutChain().to("fl")
    x = torch.randn(8, 16, device="fl")

    def step(opts):
        net = copy.deepcopy(model)
        compiled = torch.compile(net, backend="fl", options=opts)
        torch.manual_seed(1)
        _train_step(compiled, x)  # the first call compiles
        torch.manual_seed(2)
        with fl.profile() as prof:
            out = _train_step(compiled, x)
        return out, [p.grad for p in net.parameters()], prof, compiled

    out, grads, prof, compiled = step({})
    want, want_grads, _, _ = step({"passes": {"pointwise": False}})
    # within an ulp, not to the bit: on a chip without addmm the bias add joins tanh's chain, whose generated
    # tanh (double, rounded once) is not the plugin's float tanh kernel; a wrong mask would be far off
    torch.testing.assert_close(out.cpu(), want.cpu(), rtol=1e-6, atol=1e-6)
    for g, w in zip(grads, want_grads, strict=True):
        _close(g, w, rtol=1e-5)
    chains = [p for p in _patterns(fl_dynamo.fusion_report(compiled), "elementwise chain") if p.graph == "backward"]
    assert any("native_dropout_backward" in p.replacement for p in chains), chains
    fused = [o for o in prof.ops() if o.op.startswith("fl::fused_pointwise(native_dropout_backward")]
    assert fused and all(o.path == "jit" for o in fused), prof.ops()

    where = _WhereChain().to("fl")
    compiled = torch.compile(where, backend="fl")
    _check_against_float64(where, compiled, x)
    chains = _patterns(fl_dynamo.fusion_report(compiled), "elementwise chain")
    assert any("where" in p.replacement for p in chains if p.graph == "forward"), chains


@pytest.mark.parametrize("backend", ["cpu", "ascend", "minimal"])
def test_on_a_chip_without_addmm_or_gelu_a_linear_gelu_is_two_kernels(backend):
    """Where the backend has mm but no addmm, an inference graph's addmm whose one user is elementwise becomes
    mm + add and the add joins the chain after it; an elementwise op the backend has no kernel of (GELU, its
    backward) is one generated kernel on its own rather than the dispatcher's decomposition (five kernels for
    GELU). Where the backend has both (cpu), nothing changes. Results and gradients against float64."""
    fl.set_backend(backend)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).to("fl")
    x = torch.randn(8, 16, device="fl")
    compiled = torch.compile(model, backend="fl")
    _check_against_float64(model, compiled, x)  # a training step: forward and backward graphs
    report = fl_dynamo.fusion_report(compiled)
    split, alone = _patterns(report, "addmm"), _patterns(report, "elementwise op")
    narrow = backend != "cpu"
    # training: the forward saves addmm's result for GELU's backward, so the add could not join GELU: no split
    assert not split and bool(alone) == narrow, report
    if narrow:
        assert {p.graph for p in alone} == {"forward", "backward"}, alone
        assert any("no gelu_backward kernel" in p.replacement for p in alone), alone
    torch._dynamo.reset()
    infer = torch.compile(model.eval(), backend="fl")
    with torch.no_grad():
        for _ in range(3):  # warm-up, recording, replay
            out = infer(x)
        _close(out, copy.deepcopy(model).cpu().double()(x.cpu().double()), rtol=1e-5)
    report = fl_dynamo.fusion_report(infer)
    chains = _patterns(report, "elementwise chain")
    # the first addmm only: the last one's add would stay alone (the graph's output)
    assert len(_patterns(report, "addmm")) == (1 if narrow else 0), report
    if narrow:  # mm, add + GELU, mm, add: 4 kernels
        assert [p.replacement for p in chains] == ["one JIT kernel (add,gelu)"], report
        assert "replayed: 4 kernels" in str(report), report
    else:
        assert not chains and "replayed: 3 kernels" in str(report), report


def test_pointwise_without_a_jit_keeps_the_ops_with_the_reason(monkeypatch):
    fl.set_backend("cpu")
    monkeypatch.setattr(fl.capabilities("cpu"), "jit", False)
    torch.manual_seed(0)
    model = Swish().to("fl")
    x = torch.randn(4, 8).to("fl")
    compiled = torch.compile(model, backend="fl")
    _check_against_float64(model, compiled, x)
    report = fl_dynamo.fusion_report(compiled)
    kept = _patterns(report, "elementwise chain", applied=False)
    assert kept and not _patterns(report, "elementwise chain")
    assert all("no jit_compile" in p.note for p in kept)


@pytest.mark.parametrize("backend", ["cpu", "ascend", "minimal"])
def test_encoder_layer_training_step_runs_no_more_kernels_than_eager(backend):
    """A traced dropout with p = 0 is a clone (PyTorch's decomposition), where eager
    returns the input: three copy kernels more per TransformerEncoderLayer step, until
    the pointwise pass removes them (one more copy stays: a layout copy in the traced
    backward; the pass's add + add kernel makes up for it)."""
    fl.set_backend(backend)
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).to("fl")
    x = torch.randn(2, 6, 64).to("fl")

    def kernels(net) -> int:
        net(x).sum().backward()
        with fl.profile() as prof:
            net(x).sum().backward()
        return prof.kernels

    eager = kernels(layer)
    assert kernels(torch.compile(layer, backend="fl")) <= eager
    report = fl_dynamo.fusion_report(layer)
    assert len(_patterns(report, "identity copy")) == 3
    fl_dynamo.reset()
    assert kernels(torch.compile(layer, backend="fl", options={"passes": {"pointwise": False}})) == eager + 4


@pytest.mark.parametrize("backend", ["cpu", "minimal"])
def test_batch_norm_statistics_are_updated_in_place_as_in_eager(backend):
    """AOTAutograd's functional batch norm returns new running statistics and copies them
    back at the end (two clones and three copies per layer on fl); put back in place,
    the buffers hold eager's values after every step and no step runs more kernels."""
    fl.set_backend(backend)
    torch.manual_seed(0)
    model = _conv_net().to("fl")
    twin = copy.deepcopy(model)
    x = torch.randn(2, 3, 8, 8).to("fl")
    compiled = torch.compile(model, backend="fl")
    for _ in range(2):
        _train_step(compiled, x)
        _train_step(twin, x)
    for a, b in zip(model.buffers(), twin.buffers(), strict=True):
        _close(a, b)
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        _close(p.grad, q.grad, rtol=1e-3)
    report = fl_dynamo.fusion_report(compiled)
    assert [p.graph for p in _patterns(report, "batch norm running stats in place")] == ["forward"]
    assert [p.graph for p in _patterns(report, "buffer counter in place")] == ["forward"]
    with fl.profile() as fused_step:
        _train_step(compiled, x)
    with fl.profile() as eager_step:
        _train_step(twin, x)
    assert fused_step.kernels <= eager_step.kernels
    assert not [o for o in fused_step.ops() if o.op == "aten::copy_" and o.calls]  # top-level copies
    # two forwards before one backward (the buffers updated twice in between): as in eager, no saved tensor is stale
    for net in (compiled, twin):
        (net(x).sum() + net(x * 2).sum()).backward()
    for a, b in zip(model.buffers(), twin.buffers(), strict=True):
        _close(a, b)
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        _close(p.grad, q.grad, rtol=1e-3)


# -- linear -> activation -> dropout in training ---------------------------------------------


def _mlp(p: float) -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Dropout(p), nn.Linear(32, 4))


def test_linear_gelu_dropout_is_one_kernel_with_a_fresh_mask_each_step():
    fl.set_backend("rocm")
    torch.manual_seed(0)
    model = _mlp(0.3).to("fl")
    x = torch.randn(16, 8).to("fl")
    compiled = torch.compile(model, backend="fl")
    torch.manual_seed(1)
    with fl.profile() as prof:
        out = _train_step(compiled, x)
    calls = {o.op: o.calls for o in prof.ops() if o.op.startswith("fl::linear_act")}
    assert calls == {"fl::linear_act": 1, "fl::linear_act_backward": 1}, calls
    # the reference: the same mask from the seed the op drew (the first draw after manual_seed(1))
    torch.manual_seed(1)
    seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
    ref = copy.deepcopy(model).cpu().double()
    h = F.gelu(ref[0](x.cpu().double()))
    h = torch.where(fused.keep_mask(seed, h.shape, 0.3, "cpu"), h / 0.7, torch.zeros((), dtype=h.dtype))
    want = ref[3](h)
    want.square().mean().backward()
    _close(out, want)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        _close(p.grad, q.grad, rtol=1e-3)
    # a real dropout: another mask next step, about p of the units dropped, kept ones scaled by 1/(1-p)
    hidden = torch.compile(model[:3], backend="fl")
    with torch.no_grad():
        a, b = hidden(x), hidden(x)
    assert (a != b).any()
    assert 0.2 < (a == 0).double().mean().item() < 0.4
    report = fl_dynamo.fusion_report(compiled)
    assert {p.graph for p in _patterns(report, "linear+gelu+dropout")} == {"captured"}
    assert {p.graph for p in _patterns(report, "linear+act+dropout")} == {"forward", "backward"}
    fl_dynamo.reset()
    off = torch.compile(model, backend="fl", options={"passes": {"linear_act": False}})
    with fl.profile() as prof:
        _train_step(off, x)
    # no fused linear; the pointwise pass still makes dropout's backward and GELU's one kernel (a bool mask)
    assert not [o for o in prof.ops() if o.op.startswith("fl::linear")]
    assert [o.op for o in prof.ops() if o.op.startswith("fl::")] == [
        "fl::fused_pointwise(native_dropout_backward,gelu_backward)"
    ]
    assert not _patterns(fl_dynamo.fusion_report(off), "linear+", applied=None)


def test_linear_act_dropout_without_the_kernel_is_kept_with_the_reason():
    fl.set_backend("cpu")
    torch.manual_seed(0)
    model = _mlp(0.3).to("fl")
    x = torch.randn(16, 8).to("fl")
    compiled = torch.compile(model, backend="fl")
    _train_step(compiled, x)
    (p,) = _patterns(fl_dynamo.fusion_report(compiled), "linear+gelu+dropout", applied=False)
    assert p.note == "no fl::linear_act kernel"


def test_a_dropout_the_kernel_cannot_take_is_kept_after_a_fused_linear_act():
    class InPlace(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            return F.dropout(F.relu(self.lin(x)), 0.5, True, True)

    fl.set_backend("rocm")
    torch.manual_seed(0)
    compiled = torch.compile(InPlace().to("fl"), backend="fl")
    with torch.no_grad():  # in training, eager fails too: the dropout overwrites what ReLU's backward reads
        out = compiled(torch.randn(64, 8).to("fl"))
    assert 0.3 < (out == 0).double().mean().item() < 0.9  # ReLU zeros plus dropped units
    report = fl_dynamo.fusion_report(compiled)
    (kept,) = _patterns(report, "linear+relu+dropout", applied=False)
    assert "in place" in kept.note
    assert _patterns(report, "linear+relu")[0].replacement.startswith("fl::linear_act")


def _conv_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    )


# -- (linear ->) dropout -> residual add -> LayerNorm in training --------------------------------


class SelfOutput(nn.Module):
    """Hugging Face BERT's BertSelfOutput / BertOutput: LayerNorm(dropout(dense(h)) + input), and the
    same without the linear (the dropout reads an activation)."""

    def __init__(self, p: float, linear: bool):
        super().__init__()
        self.dense = nn.Linear(16, 16) if linear else nn.Tanh()
        self.dropout, self.norm = nn.Dropout(p), nn.LayerNorm(16)

    def forward(self, h, x):
        return self.norm(self.dropout(self.dense(h)) + x)


@pytest.mark.parametrize("linear", [True, False], ids=["linear", "activation"])
def test_training_dropout_before_add_norm_is_the_kernels_epilogue_with_a_fresh_seed(linear):
    fl.set_backend("rocm")
    torch.manual_seed(0)
    model = SelfOutput(0.25, linear).to("fl")
    h, x = torch.randn(4, 6, 16), torch.randn(4, 6, 16)
    compiled = torch.compile(model, backend="fl")
    hd, xd = h.to("fl").requires_grad_(), x.to("fl").requires_grad_()
    torch.manual_seed(1)
    with fl.profile() as prof:
        out = compiled(hd, xd)
        out.square().mean().backward()
    op = "fl::linear_add_layer_norm" if linear else "fl::add_layer_norm"
    calls = {o.op: o.calls for o in prof.ops() if o.op.startswith("fl::")}
    assert calls == {op: 1, op + "_backward": 1}, calls
    # the reference: the mask from the seed the op drew (the first draw after manual_seed(1)), in float64
    torch.manual_seed(1)
    seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
    ref = copy.deepcopy(model).cpu().double()
    hr, xr = h.double().requires_grad_(), x.double().requires_grad_()
    y = ref.dense(hr)
    y = torch.where(fused.keep_mask(seed, y.shape, 0.25, "cpu"), y / 0.75, torch.zeros((), dtype=y.dtype))
    want = ref.norm(y + xr)
    want.square().mean().backward()
    _close(out, want)
    _close(hd.grad, hr.grad, rtol=1e-3)
    _close(xd.grad, xr.grad, rtol=1e-3)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        _close(p.grad, q.grad, rtol=1e-3)
    # a real dropout: another mask each call
    with torch.no_grad():
        a, b = compiled(hd, xd), compiled(hd, xd)
    assert (a != b).any()
    name = ("linear+" if linear else "") + "dropout+add+layer_norm"
    report = fl_dynamo.fusion_report(compiled)
    assert {p.graph for p in _patterns(report, name)} >= {"captured", "forward", "backward"}


def test_training_dropout_before_add_norm_without_the_kernel_keeps_the_ops():
    fl.set_backend("ascend")
    torch.manual_seed(0)
    model = SelfOutput(0.25, True).to("fl")
    compiled = torch.compile(model, backend="fl")
    with fl.profile() as prof:
        compiled(torch.randn(4, 6, 16).to("fl"), torch.randn(4, 6, 16).to("fl")).sum().backward()
    # (dropout's backward alone is one generated kernel: ascend has no kernel of it, the elementwise pass's doing)
    assert not [o for o in prof.ops() if o.op.startswith("fl::") and not o.op.startswith("fl::fused_pointwise")]
    kept = _patterns(fl_dynamo.fusion_report(compiled), "add+layer_norm", applied=False)
    assert kept and "no fl::add_layer_norm kernel" in kept[0].replacement + kept[0].note


def test_fused_ops_under_autocast_cast_as_the_ops_they_fuse():
    """torch.autocast("fl"): linear -> GELU (fl::linear_act) runs and returns the autocast dtype, as eager's
    F.linear does; a fused residual add + LayerNorm returns float32, as eager's layer_norm does."""
    fl.set_backend("rocm")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU()).to("fl")
    norm = SelfOutput(0.0, True).to("fl")
    x, h = torch.randn(4, 16).to("fl"), torch.randn(4, 6, 16).to("fl")
    with torch.autocast("fl", dtype=torch.bfloat16):
        want, want_norm = model(x), norm(h, h)
        with fl.profile() as prof:
            got, got_norm = torch.compile(model, backend="fl")(x), torch.compile(norm, backend="fl")(h, h)
    assert {o.op for o in prof.ops()} >= {"fl::linear_act", "fl::linear_add_layer_norm"}
    assert got.dtype == want.dtype == torch.bfloat16 and got_norm.dtype == want_norm.dtype == torch.float32
    _close(got, want, rtol=2e-2)
    _close(got_norm, want_norm, rtol=2e-2)


def test_fused_ops_take_their_autograd_function_only_where_a_gradient_is_wanted(monkeypatch):
    """A compiled training graph calls the fused ops inside AOTAutograd's forward, with grad mode off: there the
    op goes straight below the Autograd key. Where a gradient is wanted, the autograd.Function records it."""
    from torch_fl.fused import epilogues

    forwards = []
    real = epilogues._LinearActFn.forward
    monkeypatch.setattr(epilogues._LinearActFn, "forward", staticmethod(lambda *a: forwards.append(1) or real(*a)))
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)
    fx, fw, fb = (t.to("fl").requires_grad_() for t in (x, w, b))
    op = torch.ops.fl.linear_act.default
    with torch.no_grad():
        out, _ = op(fx, fw, fb, epilogues.ACTIVATIONS["gelu"], 0.0, 0, False)
    assert forwards == [] and out.grad_fn is None
    out, _ = op(fx, fw, fb, epilogues.ACTIVATIONS["gelu"], 0.0, 0, True)
    assert forwards == [1] and out.grad_fn is not None
    out.sum().backward()
    x64, w64, b64 = (t.double().requires_grad_() for t in (x, w, b))
    F.gelu(F.linear(x64, w64, b64)).sum().backward()
    for got, want in ((fx.grad, x64.grad), (fw.grad, w64.grad), (fb.grad, b64.grad)):
        assert torch.allclose(got.cpu().double(), want, atol=1e-5)
