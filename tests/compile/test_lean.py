"""The lean runtime (compile/lean.py, issue 27): a training graph whose AOTAutograd metadata is simple runs
through torch_fl's own autograd.Function instead of AOTAutograd's runtime.

What must hold: the same losses, gradients and parameters as AOTAutograd's runtime (options={"lean": False})
step after step, on every backend, replayed or not; the report says which runtime runs each graph and why;
every graph AOTAutograd's runtime must run (input mutations, aliased outputs, autocast, inference) stays on
it; and what AOTAutograd's runtime does on the way is kept: non-differentiable outputs, unused outputs,
gradients of any layout, the version-counter check on saved tensors, create_graph with a double backward
that raises, retain_graph, the determinism check."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import tiny_bert
from torch import nn

import torch_fl as fl
from torch_fl.compile import dynamo as fl_dynamo
from torch_fl.compile.graph_report import GRAPHS
from torch_fl.compile.lean import LeanPlan, LeanRuntime

pytestmark = pytest.mark.usefixtures("fresh_dynamo")
BACKENDS = ["cpu", "rocm", "ascend", "minimal"]


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


class _TwoHeads(nn.Module):
    """Outputs of every kind the lean path handles: a differentiable one, an integer one (not
    differentiable), one that does not require grad (computed from the input alone), one a caller may
    leave out of the loss."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(16, 4)
        self.aux = nn.Linear(16, 2)

    def forward(self, x):
        h = torch.tanh(self.body(x))
        logits = self.head(h)
        return logits, logits.argmax(-1), x.abs().sum(-1), self.aux(h)


def _plan(compiled) -> LeanPlan:
    graphs = fl.fusion_report(compiled).graphs
    assert len(graphs) == 1, graphs
    return graphs[0].runtime


def _pair(model: nn.Module, **options):
    """The model compiled twice: the lean runtime (the default) and AOTAutograd's, on twin parameters."""
    twin = copy.deepcopy(model)
    lean = torch.compile(model, backend="fl", options=dict(options))
    aot = torch.compile(twin, backend="fl", options={**options, "lean": False})
    return (model, lean), (twin, aot)


def _grads(model: nn.Module) -> list:
    return [None if p.grad is None else p.grad.detach().cpu().clone() for p in model.parameters()]


def _same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert (x is None) == (y is None)
        if x is not None:
            torch.testing.assert_close(x, y, rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("replay", [None, False])
def test_training_equals_aotautograds_runtime_step_after_step(backend, replay):
    """Losses, gradients and parameters equal to the bit those of AOTAutograd's runtime (the same compiled
    graphs, so the same kernels), replayed or not; the report says lean once the backward is compiled."""
    fl.set_backend(backend)
    torch.manual_seed(0)
    (m1, lean), (m2, aot) = _pair(_mlp().to("fl"), replay=replay)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (m1, m2)]
    for step in range(5):
        x = torch.randn(4, 8, device="fl")
        y = torch.randint(0, 4, (4,), device="fl")
        losses, grads = [], []
        for c, m, opt in ((lean, m1, opts[0]), (aot, m2, opts[1])):
            loss = nn.functional.cross_entropy(c(x), y)
            opt.zero_grad()
            loss.backward()
            grads.append(_grads(m))
            opt.step()
            losses.append(loss.item())
        assert losses[0] == losses[1], (step, losses)
        _same(*grads)
        if step == 0:
            assert _plan(lean).describe().startswith("lean"), _plan(lean).describe()
    _same([p.detach().cpu() for p in m1.parameters()], [p.detach().cpu() for p in m2.parameters()])
    report = fl.fusion_report(lean).table()
    assert "runtime: lean (torch_fl's autograd.Function" in report, report
    assert "runtime:" not in fl.fusion_report(aot).table()
    assert fl.fusion_report(lean).to_dict()["graphs"][0]["runtime"].startswith("lean")


def test_the_first_forward_runs_on_aotautograd_until_the_backward_is_compiled():
    (m1, lean), _ = _pair(_mlp().to("fl"))
    x = torch.randn(2, 8, device="fl")
    first = lean(x)  # AOTAutograd compiles the backward lazily: this call is its runtime's
    plan = _plan(lean)
    assert plan.reason is None and not plan.ready
    assert "until the first backward" in plan.describe()
    second = lean(x)
    assert type(second.grad_fn).__name__ != "_LeanFunctionBackward"
    first.sum().backward()  # compiles the backward
    assert plan.ready
    third = lean(x)
    assert type(third.grad_fn).__name__ == "_LeanFunctionBackward", third.grad_fn
    g = _grads(m1)
    for p in m1.parameters():
        p.grad = None
    second.sum().backward()  # the earlier AOTAutograd node still works beside the lean one
    g2 = _grads(m1)
    for p in m1.parameters():
        p.grad = None
    third.sum().backward()
    _same(g, g2)
    _same(g, _grads(m1))


@pytest.mark.parametrize("backend", ["cpu", "ascend"])
def test_outputs_of_every_kind_and_unused_outputs(backend):
    """An integer output and one computed without parameters come back non-differentiable, as with
    AOTAutograd; an output left out of the loss gets no gradient (zeros inside the backward graph);
    a transposed use of an output hands the backward a non-contiguous gradient, coerced to the traced
    strides."""
    fl.set_backend(backend)
    torch.manual_seed(0)
    (m1, lean), (m2, aot) = _pair(_TwoHeads().to("fl"))
    x = torch.randn(3, 8, device="fl")
    for step in range(4):
        grads = []
        for c, m in ((lean, m1), (aot, m2)):
            for p in m.parameters():
                p.grad = None
            logits, idx, norms, aux = c(x)
            assert idx.dtype == torch.int64 and not idx.requires_grad and not norms.requires_grad
            assert logits.requires_grad and aux.requires_grad
            if step % 2:
                loss = (logits.t() * torch.arange(3.0, device="fl")).sum()  # a transposed gradient
            else:
                loss = logits.square().mean()  # aux unused: its gradient materialized as zeros
            loss.backward()
            grads.append(_grads(m))
        _same(*grads)
        assert grads[0][-1] is None or not grads[0][-1].any()  # aux's bias: no gradient flows there
    assert _plan(lean).ready


def test_sum_backward_hands_an_expanded_gradient():
    (m1, lean), (m2, aot) = _pair(_mlp().to("fl"))
    x = torch.randn(5, 8, device="fl")
    for _ in range(3):
        for c in (lean, aot):
            c(x).sum().backward()
    _same(_grads(m1), _grads(m2))


def test_a_gradient_of_another_layout_is_coerced_to_the_traced_strides():
    """A 3-D linear's backward graph views its gradient as 2-D: a transposed gradient (from a transposed
    use of the output) must be made contiguous first, as AOTAutograd does, or the view fails."""
    torch.manual_seed(0)
    (m1, lean), (m2, aot) = _pair(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).to("fl"))
    x = torch.randn(2, 3, 8, device="fl")
    weights = torch.randn(3, 2, 4, device="fl")
    for _ in range(3):
        for c in (lean, aot):
            (c(x).transpose(0, 1) * weights).sum().backward()
    assert _plan(lean).ready
    _same(_grads(m1), _grads(m2))


def test_an_output_that_views_an_intermediate_can_be_changed_in_place():
    """A 3-D linear's output is a view of its 2-D matmul (AOTAutograd's unsafe_view_alias): handed out as a
    plain tensor (aten._unsafe_view), as AOTAutograd does, so an in-place change of it is allowed; as a view
    made inside an autograd.Function it would raise. Without replay, so that the graph returns the view."""
    (m1, lean), (m2, aot) = _pair(nn.Linear(8, 4).to("fl"), replay=False)
    x = torch.randn(2, 3, 8, device="fl")
    for _ in range(3):
        for c in (lean, aot):
            out = c(x)
            out.mul_(2)
            out.sum().backward()
    assert _plan(lean).ready and _plan(lean).unsafe_views == (0,)
    _same(_grads(m1), _grads(m2))


def test_a_saved_tensor_changed_in_place_raises_as_with_aotautograd():
    """The forward's saved activations keep the version-counter check: an in-place change between forward
    and backward raises the same error on both runtimes (none where AOTAutograd saves without it)."""
    torch.manual_seed(0)
    outcomes = []
    for lean_on in (True, False):
        model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2)).to("fl")
        c = torch.compile(model, backend="fl", options={"lean": lean_on})
        x = torch.randn(2, 4, device="fl", requires_grad=True)
        for _ in range(2):
            c(x).sum().backward()
        out = c(x)
        x.data.add_(1)  # .data: not seen by the version counter, no error either way
        out.sum().backward()
        h = torch.randn(2, 4, device="fl", requires_grad=True)
        inner = h * 1.0  # a non-leaf input the graph saves
        out = c(inner)
        inner.add_(1)
        try:
            out.sum().backward()
            outcomes.append(None)
        except RuntimeError as e:
            outcomes.append(str(e).split(";")[0])
    assert outcomes[0] == outcomes[1], outcomes
    assert outcomes[0] is not None and "modified by an inplace operation" in outcomes[0], outcomes


def test_create_graph_gives_the_gradients_and_a_double_backward_raises():
    """backward(create_graph=True): the gradients, connected to the graph, equal AOTAutograd's plain backward
    (AOTAutograd itself refuses create_graph here: its backward graph donates the saved buffers, which
    torch_fl's compiled backward never writes); differentiating them again raises, naming the way out."""
    torch.manual_seed(0)
    (m1, lean), (m2, aot) = _pair(_mlp().to("fl"))
    x = torch.randn(2, 8, device="fl")
    for c in (lean, aot):
        c(x).sum().backward()
    (g,) = torch.autograd.grad(lean(x).square().sum(), [m1[0].weight], create_graph=True)
    assert g.requires_grad
    (ref,) = torch.autograd.grad(aot(x).square().sum(), [m2[0].weight])
    torch.testing.assert_close(g.detach().cpu(), ref.cpu(), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="double backward through a compiled graph"):
        g.sum().backward()
    # a constant gradient (sum()'s) and detached saved tensors: still connected, still raising
    (g1,) = torch.autograd.grad(lean(x).sum(), [m1[0].weight], create_graph=True)
    (ref1,) = torch.autograd.grad(aot(x).sum(), [m2[0].weight])
    torch.testing.assert_close(g1.detach().cpu(), ref1.cpu(), rtol=0, atol=0)
    assert g1.requires_grad
    with pytest.raises(RuntimeError, match="double backward through a compiled graph"):
        g1.sum().backward()
    for p in m1.parameters():
        p.grad = None
    lean(x).sum().backward()  # the process stays usable
    assert m1[0].weight.grad is not None


def test_retain_graph_backward_twice_and_without_it_the_second_raises():
    """retain_graph=True keeps the saved tensors for a second backward (gradients accumulate to twice one
    backward's); without it a third raises autograd's own error."""
    (m1, lean), (m2, aot) = _pair(_mlp().to("fl"))
    x = torch.randn(2, 8, device="fl")
    for c in (lean, aot):
        c(x).sum().backward()
    for m in (m1, m2):
        for p in m.parameters():
            p.grad = None
    out = lean(x).sum()
    out.backward(retain_graph=True)
    out.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.backward()
    aot(x).sum().backward()
    _same(_grads(m1), [g * 2 for g in _grads(m2)])


def test_the_determinism_check_of_aotautograd_is_kept():
    lean = torch.compile(_mlp().to("fl"), backend="fl")
    x = torch.randn(2, 8, device="fl")
    lean(x).sum().backward()
    out = lean(x)
    assert type(out.grad_fn).__name__ == "_LeanFunctionBackward"
    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        with pytest.raises(RuntimeError, match="use_deterministic_algorithms"):
            out.sum().backward()
    finally:
        torch.use_deterministic_algorithms(was)


class _CountsCalls(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, counter):
        counter.add_(1)  # written inside the graph (it does not require grad)
        return self.lin(x)


class _ScalesItsInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        x.mul_(2)  # x requires grad: AOTAutograd writes it back after the graph, for autograd to see
        return self.lin(x)


class _ReturnsAView(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        return y, y.view(-1)


def test_an_input_written_inside_the_graph_stays_lean_and_its_version_moves():
    """Batch norm's running statistics, or any input without grad the graph writes: the write happens in the
    graph, and the version counter moves as AOTAutograd's runtime moves it (autograd's in-place check)."""
    x = torch.randn(2, 4, device="fl")
    (m1, lean), (m2, aot) = _pair(_CountsCalls().to("fl"))
    counters = [torch.zeros(1, device="fl"), torch.zeros(1, device="fl")]
    versions = []
    for _ in range(4):
        for c, counter in zip((lean, aot), counters, strict=True):
            before = counter._version
            c(x, counter).sum().backward()
            versions.append(counter._version - before)
    assert [c.item() for c in counters] == [4.0, 4.0]
    assert versions[-2] == versions[-1] and versions[-1] > 0, versions
    assert _plan(lean).ready
    _same(_grads(m1), _grads(m2))


def test_graphs_aotautograds_runtime_must_run_stay_on_it_with_the_reason():
    x = torch.randn(2, 4, device="fl")
    mut = torch.compile(_ScalesItsInput().to("fl"), backend="fl")
    for _ in range(3):
        h = torch.randn(2, 4, device="fl", requires_grad=True)
        inner = h * 1.0
        mut(inner).sum().backward()
        torch.testing.assert_close(inner.detach().cpu(), h.detach().cpu() * 2)
        assert h.grad is not None
    assert "mutates its input" in _plan(mut).describe(), _plan(mut).describe()
    fl_dynamo.reset()

    view = torch.compile(_ReturnsAView().to("fl"), backend="fl")
    for _ in range(3):
        y, flat = view(x)
        (y.sum() + flat.square().sum()).backward()
    assert "aliases" in _plan(view).describe(), _plan(view).describe()
    fl_dynamo.reset()

    infer = torch.compile(_mlp().to("fl"), backend="fl")
    with torch.no_grad():
        infer(torch.randn(2, 8, device="fl"))
    assert "an inference graph" in _plan(infer).describe()
    fl_dynamo.reset()

    auto = torch.compile(_mlp().to("fl"), backend="fl")
    with torch.autocast("fl", dtype=torch.bfloat16):
        auto(torch.randn(2, 8, device="fl")).float().sum().backward()
    assert "autocast" in _plan(auto).describe(), _plan(auto).describe()


class _Held(nn.Module):
    """A graph module that holds its parameter (not a graph input): AOTAutograd passes it itself."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 3)

    def forward(self, x):
        return (self.lin(x),)


def _linear(a, w):
    return (nn.functional.linear(a, w),)


def test_the_compiled_callable_is_the_lean_runtime_only_where_it_applies(monkeypatch):
    """Under Dynamo, compile_graph returns LeanRuntime for a training graph, AOTAutograd's callable with
    lean=False; its results and gradients are the graph's, on AOTAutograd's runtime first, then its own.
    A graph module that holds its parameters, or a call outside Dynamo (no AOTAutograd metadata), is refused."""
    made = []
    real = fl_dynamo.compile_graph

    def spy(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(fl_dynamo, "compile_graph", spy)
    x = torch.randn(2, 8, device="fl")
    w = torch.randn(3, 8, device="fl", requires_grad=True)
    fn = torch.compile(_linear, backend="fl")
    for _ in range(3):
        w.grad = None
        (out,) = fn(x, w)
        torch.testing.assert_close(out.cpu(), x.cpu() @ w.detach().cpu().t())
        out.sum().backward()
        torch.testing.assert_close(w.grad.cpu(), x.sum(0).cpu().expand(3, 8))
    assert len(made) == 1 and isinstance(made[0], LeanRuntime) and made[0].plan.ready
    torch.compile(_linear, backend="fl", options={"lean": False})(x, w)
    assert len(made) == 2 and not isinstance(made[1], LeanRuntime)

    held = LeanPlan()
    held.check_graph(torch.fx.symbolic_trace(_Held().to("fl")), [x])
    assert "holds parameters" in held.describe()
    outside = real(torch.fx.symbolic_trace(_linear), [x, w], [])
    assert not isinstance(outside, LeanRuntime)
    assert "no AOTAutograd metadata" in GRAPHS[-1].runtime.describe(), GRAPHS[-1].runtime.describe()


def test_the_lean_option_takes_booleans_only():
    with pytest.raises(TypeError, match="lean must be True .* or False .*not 'yes'"):
        fl_dynamo.fl_backend(None, [], options={"lean": "yes"})
    with pytest.raises(TypeError, match="lean must be True"):
        fl.compile(_mlp(), lean=1)


@pytest.mark.slow  # a transformers model, compiled twice: ~10 s
def test_bert_training_equals_aotautograds_runtime():
    fl.set_backend("ascend")
    torch.manual_seed(0)
    (m1, lean), (m2, aot) = _pair(tiny_bert().train().to("fl"))
    ids = torch.randint(0, 100, (2, 8), device="fl")
    mask = torch.ones(2, 8, dtype=torch.long, device="fl")
    mask[0, 6:] = 0
    for _ in range(3):
        losses = []
        for c, m in ((lean, m1), (aot, m2)):
            for p in m.parameters():
                p.grad = None
            loss = c(input_ids=ids, attention_mask=mask).last_hidden_state.square().mean()
            loss.backward()
            losses.append(loss.item())
        assert losses[0] == losses[1]
        _same(_grads(m1), _grads(m2))
    assert all(g.runtime.ready for g in fl.fusion_report(lean).graphs), fl.fusion_report(lean).table()


def _convnet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    )


@pytest.mark.parametrize("backend", ["cpu", "ascend"])
def test_batch_norm_training_is_lean_with_its_running_statistics(backend):
    """A conv net in training mode writes batch norm's running statistics and counters inside the graph:
    lean, with losses, gradients, parameters and buffers equal to AOTAutograd's runtime's."""
    fl.set_backend(backend)
    torch.manual_seed(0)
    (m1, lean), (m2, aot) = _pair(_convnet().train().to("fl"))
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (m1, m2)]
    for _ in range(4):
        x = torch.randn(2, 3, 8, 8, device="fl")
        grads = []
        for c, m, opt in ((lean, m1, opts[0]), (aot, m2, opts[1])):
            opt.zero_grad()
            c(x).square().mean().backward()
            grads.append(_grads(m))
            opt.step()
        _same(*grads)
    assert _plan(lean).ready, _plan(lean).describe()
    _same([b.cpu() for b in m1.buffers()], [b.cpu() for b in m2.buffers()])
    assert int(m1[1].num_batches_tracked) == 4


def test_symbolic_sizes_are_lean_with_the_sizes_the_backward_needs():
    """dynamic=True (or Dynamo's automatic dynamic sizes, once a forward has seen two batch sizes): the
    forward hands the backward the sizes it saved; each batch size trains as AOTAutograd's runtime does."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3))
    twin = copy.deepcopy(model)
    lean = torch.compile(model.to("fl"), backend="fl", dynamic=True)
    aot = torch.compile(twin.to("fl"), backend="fl", dynamic=True, options={"lean": False})
    for batch in (2, 3, 5, 3, 2):
        x = torch.randn(batch, 3, 4, 4, device="fl")
        grads = []
        for c, m in ((lean, model), (aot, twin)):
            for p in m.parameters():
                p.grad = None
            c(x).square().sum().backward()
            grads.append(_grads(m))
        _same(*grads)
    report = fl.fusion_report(lean)
    assert report.graph_count == 1 and report.graphs[0].dynamic, report.table()
    assert _plan(lean).ready and _plan(lean).symints != slice(0), _plan(lean).describe()
    _same([b.cpu() for b in model.buffers()], [b.cpu() for b in twin.buffers()])


def test_metadata_another_torch_names_differently_is_refused_not_raised(monkeypatch):
    """A metadata field missing (another torch version): the graph stays on AOTAutograd's runtime with the
    reason; the compile does not fail. Checked inside the compile, while AOTAutograd's metadata is whole."""
    plans = []
    real = LeanPlan.set_forward

    class Older:
        def __init__(self, meta):
            self._meta = meta

        def __getattr__(self, name):
            if name == "dynamic_outputs":  # read after the checks, by _read_forward
                raise AttributeError(name)
            return getattr(self._meta, name)

    def spy(self, fw, gm, meta, n):
        for older in (Older(meta), object()):
            plan = LeanPlan()
            plan.reason = None
            real(plan, fw, gm, older, n)
            plans.append(plan)
        return real(self, fw, gm, meta, n)

    monkeypatch.setattr(LeanPlan, "set_forward", spy)
    c = torch.compile(_mlp().to("fl"), backend="fl")
    c(torch.randn(2, 8, device="fl")).sum().backward()
    assert len(plans) == 2
    for plan in plans:
        assert not plan.ready and plan.fw is None
        assert "metadata differs" in plan.describe(), plan.describe()
    assert "dynamic_outputs" in plans[0].describe()
    assert _plan(c).ready  # the real metadata: lean
