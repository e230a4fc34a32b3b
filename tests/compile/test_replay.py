"""Graph replay (issue 17, item 4): torch.compile(m, backend="fl", options={"replay": True}) records an
inference graph once as a kernel list and replays it with no per-op Python.

What must hold: replayed outputs equal those of the same graph compiled without replay, on every backend;
new input values give new results (no stale inputs) and earlier results stay valid (outputs are fresh
tensors); a new shape never replays the old recording; a graph with a CPU fallback is reported not
replayable and stays correct; a replay launches exactly the recorded kernels, without the dispatcher;
training steps (forward and backward graphs) replay too."""

from __future__ import annotations

import copy
import os
import re
import sys

import pytest
import torch
from conftest import tiny_bert
from torch import nn

import torch_fl as fl
from torch_fl.compile import dynamo as fl_dynamo
from torch_fl.compile.replay import ReplayStatus, replayable
from torch_fl.runtime import core, events

BACKENDS = ["cpu", "rocm", "ascend", "minimal"]
transformers = pytest.importorskip("transformers")


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@torch.library.custom_op("fl_test_replay::twice", mutates_args=(), device_types="cpu")
def _twice(x: torch.Tensor) -> torch.Tensor:
    """An op with a CPU kernel only: on fl it is served by the CPU fallback."""
    return x * 2


@_twice.register_fake
def _(x):
    return torch.empty_like(x)


class _WithFallback(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return torch.ops.fl_test_replay.twice(self.lin(x)).relu()


def _mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def _convnet():
    m = nn.Sequential(
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
    for bn in (m[1], m[4]):
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    return m


def _bert():
    return tiny_bert()


def _status(compiled) -> ReplayStatus:
    graphs = [g for g in fl_dynamo.fusion_report(compiled).graphs if g.replay is not None]
    assert len(graphs) == 1, str(fl_dynamo.fusion_report(compiled))
    return graphs[0].replay


def _inputs(kind: str, batch: int = 2):
    if kind == "mlp":
        return (torch.randn(batch, 8, device="fl"),), {}
    if kind == "conv":
        return (torch.randn(batch, 3, 8, 8, device="fl"),), {}
    ids = torch.randint(0, 100, (batch, 8), device="fl")
    mask = torch.ones(batch, 8, dtype=torch.long, device="fl")
    mask[0, 6:] = 0
    return (), {"input_ids": ids, "attention_mask": mask}


def _out(o):
    return o.last_hidden_state if hasattr(o, "last_hidden_state") else o


@pytest.mark.slow  # models (transformers, zoo), 5-13 s a case measured
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["mlp", "conv", "bert"])
def test_replayed_outputs_equal_compiled_outputs_with_new_inputs_each_call(backend, kind):
    fl.set_backend(backend)
    torch.manual_seed(0)
    model = {"mlp": _mlp, "conv": _convnet, "bert": _bert}[kind]().eval().to("fl")
    plain = torch.compile(copy.deepcopy(model), backend="fl", options={"replay": False})
    replayed = torch.compile(model, backend="fl", options={"replay": True})
    kept = []
    with torch.no_grad():
        for _ in range(5):  # warm-up, recording, then three replays, each on new input values
            args, kwargs = _inputs(kind)
            out, ref = _out(replayed(*args, **kwargs)), _out(plain(*args, **kwargs))
            torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(out.cpu(), _out(model(*args, **kwargs)).cpu(), rtol=1e-4, atol=1e-5)
            kept.append((out, ref))
    outs = [o.cpu() for o, _ in kept]
    assert all(not torch.equal(a, b) for a, b in zip(outs, outs[1:], strict=False)), "a replay repeated a result"
    for out, ref in kept:  # an earlier result is not overwritten by a later replay
        torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=1e-6, atol=1e-6)
    status = _status(replayed)
    # on minimal, BERT's embeddings and its attention mask's advanced indexing are gathers whose kernels check
    # the indices on the device (no host read): replayable too
    assert status.replayed and status.replays == 3 and status.recordings == 1 and status.kernels > 0, status


def test_a_cpu_fallback_op_makes_the_graph_not_replayable_and_results_stay_correct():
    torch.manual_seed(0)
    model = _WithFallback().eval().to("fl")
    compiled = torch.compile(model, backend="fl", options={"replay": True})
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(2, 8, device="fl")
            torch.testing.assert_close(compiled(x).cpu(), model(x).cpu())
    status = _status(compiled)
    assert not status.replayed and status.reason == "fl_test_replay::twice runs as a CPU fallback", status
    assert "replay: not replayed: fl_test_replay::twice runs as a CPU fallback" in str(
        fl_dynamo.fusion_report(compiled)
    )


def test_a_replay_launches_the_recorded_kernels_and_no_dispatcher_python():
    """The kernel count of a replay is the recorded list's, which is the count the same graph launches
    without replay; during a replay no frame of the dispatcher or of run_native runs (during the
    recording they do: the check can fail), and the torch_fl Python that runs does not grow with the
    kernel count."""
    torch.manual_seed(0)
    model = _bert().eval().to("fl")
    plain = torch.compile(copy.deepcopy(model), backend="fl", options={"replay": False})
    replayed = torch.compile(model, backend="fl", options={"replay": True})
    _, kw = _inputs("bert")
    with torch.no_grad():
        plain(**kw)
        k0 = events.kernel_count()
        plain(**kw)
        plain_kernels = events.kernel_count() - k0
        replayed(**kw)  # warm-up

        frames: list[str] = []
        package = os.path.dirname(os.path.abspath(fl.__file__)) + os.sep  # not a substring: the test command's
        # venv lives in a folder whose name holds "torch_fl" too

        def profile(frame, event, arg):
            if event == "call" and os.path.abspath(frame.f_code.co_filename).startswith(package):
                frames.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

        def traced_call():
            frames.clear()
            sys.setprofile(profile)
            try:
                replayed(**kw)
            finally:
                sys.setprofile(None)
            return [f for f in frames if "/dispatch/" in f or "runtime/native.py" in f]

        assert traced_call(), "the recording call ran no dispatcher Python?"
        status = _status(replayed)
        assert status.replayed, status
        k0, hits0 = events.kernel_count(), core.lib().fl_core_fast_hits()
        assert traced_call() == []
        assert events.kernel_count() - k0 == status.kernels == plain_kernels
        assert core.lib().fl_core_fast_hits() == hits0  # the kernels ran from the graph, not the fast path
        assert len(frames) < 30 < status.kernels, frames


def test_the_replay_wrapper_never_replays_another_shape_or_stride():
    """The wrapper's own guards, without Dynamo's in front: a new shape or stride is a new signature
    (warm-up, then its own recording), never the old recording."""
    w = torch.randn(8, 5, device="fl")

    def graph(x, w):
        return [torch.relu(x @ w) + 1.0]

    from functorch.compile import make_boxed_func

    status = ReplayStatus()
    fn = replayable(make_boxed_func(graph), status)  # no AOTAutograd metadata: every input is copied
    shapes = [(2, 8)] * 4 + [(3, 8)] * 3 + [(2, 8)] * 2
    for shape in shapes:
        x = torch.randn(*shape, device="fl")
        torch.testing.assert_close(fn([x, w])[0].cpu(), graph(x, w)[0].cpu())
    x = torch.randn(8, 2, device="fl").t()  # (2, 8) with other strides
    torch.testing.assert_close(fn([x, w])[0].cpu(), graph(x, w)[0].cpu())
    assert status.replayed and status.recordings == 2 and status.replays == 2 + 1 + 2, status


def test_the_cpp_guards_check_parameter_addresses_and_python_checks_values():
    """fl_graph::replay guards every tensor argument (layout, dtype, device; a parameter's address), and the
    wrapper checks the non-tensor arguments: a parameter at another address, a scale that changed, a CPU
    tensor where an fl one was recorded never replay the old recording."""
    from functorch.compile import make_boxed_func

    from torch_fl.compile.replay import ReplayedGraph

    def graph(x, w, scale):
        return [torch.relu(x @ w) * scale]

    status = ReplayStatus()
    fn = ReplayedGraph(make_boxed_func(graph), {1}, set(), status, "forward")  # w: a parameter, used in place
    w = torch.randn(8, 5, device="fl")
    x = torch.randn(2, 8, device="fl")
    for _ in range(3):  # warm-up, recording, replay
        torch.testing.assert_close(fn([x, w, 2.0])[0].cpu(), graph(x, w, 2.0)[0].cpu())
    assert status.replays == 1, status
    w.mul_(-1)  # in place: the same address, seen by the replay
    torch.testing.assert_close(fn([x, w, 2.0])[0].cpu(), graph(x, w, 2.0)[0].cpu())
    assert status.replays == 2
    other = w.clone()  # the same layout at another address: not the recorded parameter
    other.add_(1)
    torch.testing.assert_close(fn([x, other, 2.0])[0].cpu(), graph(x, other, 2.0)[0].cpu())
    torch.testing.assert_close(fn([x, w, 3.0])[0].cpu(), graph(x, w, 3.0)[0].cpu())
    assert status.replays == 2, status
    cpu_x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="fl:0 and cpu|cpu and fl"):  # run normally: the op's own error
        fn([cpu_x, w, 2.0])
    assert status.replays == 2, status


def test_an_in_place_parameter_update_is_seen_by_the_next_call():
    """Parameters are used in place; the conv+bn fold cached on them is refreshed when their version moves
    (the next call runs normally, the one after records again)."""
    torch.manual_seed(0)
    model = _convnet().eval().to("fl")
    compiled = torch.compile(model, backend="fl", options={"replay": True})
    x = torch.randn(2, 3, 8, 8, device="fl")
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
        assert _status(compiled).replayed
        for _update in range(3):
            model[1].running_var.mul_(1.5)
            model[0].weight.add_(0.1)
            for _ in range(3):
                torch.testing.assert_close(compiled(x).cpu(), model(x).cpu(), rtol=1e-4, atol=1e-5)
    assert _status(compiled).recordings == 4


def test_a_listening_profiler_sees_every_op_of_a_replayable_graph():
    """While a profiler listens the graph runs normally (its per-op report is complete)."""
    torch.manual_seed(0)
    model = _mlp().eval().to("fl")
    compiled = torch.compile(model, backend="fl", options={"replay": True})
    x = torch.randn(2, 8, device="fl")
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
        assert _status(compiled).replays == 1
        with fl.profile() as prof:
            compiled(x)
    assert _status(compiled).replays == 1
    assert any("addmm" in e.op for e in prof.events), [e.op for e in prof.events]


@pytest.mark.slow  # models (transformers, zoo), 5-13 s a case measured
@pytest.mark.parametrize("backend", ["cpu", "rocm"])
@pytest.mark.parametrize("kind", ["mlp", "conv", "bert"])
def test_training_steps_replay_forward_and_backward_like_the_compiled_graph(backend, kind):
    """A training step's forward and backward graphs are replayed (parameters in place, so the optimizer's
    updates are seen; batch norm's running statistics updated by the replayed kernels; BERT's expanded
    gradients and saved tensors copied with their strides): losses, parameters and buffers stay equal to
    the same model compiled without replay, step after step."""
    fl.set_backend(backend)
    torch.manual_seed(0)
    model = {"mlp": _mlp, "conv": _convnet, "bert": _bert}[kind]().train().to("fl")
    twin = copy.deepcopy(model)
    replayed = torch.compile(model, backend="fl", options={"replay": True})
    plain = torch.compile(twin, backend="fl", options={"replay": False})
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (model, twin)]
    for _ in range(6):
        args, kwargs = _inputs(kind, batch=4)
        target = torch.randn(4, 4, device="fl") if kind != "bert" else 0.0
        losses = []
        for m, opt in zip((replayed, plain), opts, strict=True):
            loss = ((_out(m(*args, **kwargs)) - target) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-6, abs=1e-7)
    for a, b in zip(
        list(model.parameters()) + list(model.buffers()), list(twin.parameters()) + list(twin.buffers()), strict=True
    ):
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-6, atol=1e-6)
    status = _status(replayed)
    assert status.replayed and set(status.parts) == {"forward", "backward"}, status
    assert status.replays == 2 * 4 and status.recordings == 2, status  # per graph: warm-up, recording, 4 replays


def test_training_with_dropout_is_not_replayed_and_says_which_op():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 4)).to("fl")
    compiled = torch.compile(model, backend="fl", options={"replay": True})
    for _ in range(3):
        compiled(torch.randn(2, 8, device="fl")).sum().backward()
    status = _status(compiled)
    assert not status.replayed and status.reason.startswith("forward: aten::") and "random" in status.reason, status


def test_inference_mode_and_parameters_made_in_inference_mode():
    """Under torch.inference_mode, and with parameters that are inference tensors (no version counter)."""
    torch.manual_seed(0)
    with torch.inference_mode():
        made_in_inference = _mlp().eval().to("fl")
    for model in (_mlp().eval().to("fl"), made_in_inference):
        fl_dynamo.reset()
        compiled = torch.compile(model, backend="fl", options={"replay": True})
        with torch.inference_mode():
            for _ in range(4):
                x = torch.randn(2, 8, device="fl")
                torch.testing.assert_close(compiled(x).cpu(), model(x).cpu())
        status = _status(compiled)
        assert status.replayed and status.replays == 2, status


def test_a_failing_kernel_in_a_replay_raises_naming_the_op_and_step():
    """The C loop checks every status: a kernel that fails in a replay (here a recorded step whose kernel
    fails on its second call) raises the plugin's error with the op's name and the step, and the kernels
    after it do not run."""
    from torch_fl.errors import KernelError
    from torch_fl.runtime import KernelGraph, ffi, recording

    calls = {"n": 0}

    @ffi.callback("int(void*, int, const fl_tensor_t*, int, const fl_tensor_t*, int, const fl_arg_t*, int)")
    def flaky(stream, device, ins, n_in, outs, n_out, args, n_args):
        calls["n"] += 1
        return 0 if calls["n"] == 1 else 4  # FL_ERR_INTERNAL from the second call on

    class Kernel:
        fn = flaky

    x = torch.randn(4, device="fl")
    with recording() as rec:
        y = x + 1  # one real kernel, recorded
    assert rec.reason is None and len(rec.steps) == 1
    _, kernel, dev, ins, outs, cargs, path = rec.steps[0]
    rec.steps.insert(0, ["aten::flaky_test_op", Kernel(), dev, ins, outs, cargs, path])
    graph = KernelGraph(rec)
    graph.replay(None, None)  # the flaky kernel's first call succeeds
    y.zero_()
    with pytest.raises(
        KernelError,
        match=r"kernel aten::flaky_test_op \(step 0 of 2 in a graph replay\) failed "
        r"with FL_ERR_INTERNAL",
    ):
        graph.replay(None, None)
    assert y.abs().sum().item() == 0  # the step after the failing one did not run


@pytest.mark.parametrize("backend", ["cpu", "minimal"])
def test_replayed_outputs_that_share_memory_stay_aliased(backend):
    """y and y.view(-1) returned together are one tensor's memory in eager; a replay gives them one fresh copy
    (before: two separate copies, so an in-place edit of one did not show in the other)."""
    fl.set_backend(backend)
    lin = nn.Linear(4, 6).to("fl")

    def f(x):
        y = torch.relu(lin(x))
        return y, y.view(-1), y[1:], y * 2

    compiled = torch.compile(f, backend="fl", options={"replay": True})
    with torch.no_grad():
        x = torch.randn(3, 4).to("fl")
        for _ in range(4):
            y, flat, tail, other = compiled(x)
        assert fl_dynamo.fusion_report(compiled).graphs[0].replay.replays >= 1
        y.add_(100.0)
        assert torch.equal(flat.cpu(), y.cpu().view(-1)) and torch.equal(tail.cpu(), y.cpu()[1:])
        assert other.min().item() >= 0 and other.max().item() < 100  # a separate result stays separate
        assert y.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
    fl.set_backend("cpu")


def test_replay_is_the_default_and_options_switch_it_off():
    """torch.compile(backend="fl") and fl.compile replay by default (issue 27); replay=False keeps every call
    on the dispatcher, and a replay value that is not a bool or None is refused by name."""
    fl.set_backend("cpu")
    torch.manual_seed(0)
    model = _mlp().to("fl")
    x = torch.randn(2, 8, device="fl")
    want = model(x)
    for compiled in (torch.compile(copy.deepcopy(model), backend="fl"), fl.compile(copy.deepcopy(model))):
        with torch.no_grad():
            outs = [compiled(x) for _ in range(3)]  # warm-up, recording, replay
        status = _status(compiled)
        assert status.replayed and status.replays == 1, status
        for o in outs:
            torch.testing.assert_close(o, want, rtol=0, atol=0)
    off = torch.compile(copy.deepcopy(model), backend="fl", options={"replay": False})
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(off(x), want, rtol=0, atol=0)
    report = fl_dynamo.fusion_report(off)
    assert [g.replay for g in report.graphs] == [None] and "replay:" not in str(report)
    bad = torch.compile(copy.deepcopy(model), backend="fl", options={"replay": "yes"})
    with pytest.raises(Exception, match=r"replay must be True .*False .*None .*not 'yes'"):
        bad(x)
    with pytest.raises(TypeError, match=r"replay must be True"):
        fl.compile(copy.deepcopy(model), replay=1)


def test_default_replay_skips_graphs_whose_buffers_pass_the_bound(monkeypatch):
    """By default a graph whose buffers would pin more than AUTO_MAX_BYTES is not recorded, and says why;
    options={"replay": True} replays it anyway. Results are the same either way."""
    from torch_fl.compile import replay as replay_mod

    fl.set_backend("cpu")
    torch.manual_seed(0)
    model = _mlp().to("fl")
    x = torch.randn(64, 8, device="fl")  # its copy alone: 2 KiB; the recording's buffers a few KiB more
    want = model(x).detach()
    monkeypatch.setattr(replay_mod, "AUTO_MAX_BYTES", 4096)
    bounded = torch.compile(copy.deepcopy(model), backend="fl")
    forced = torch.compile(copy.deepcopy(model), backend="fl", options={"replay": True})
    with torch.no_grad():
        for _ in range(4):
            torch.testing.assert_close(bounded(x), want, rtol=0, atol=0)
            torch.testing.assert_close(forced(x), want, rtol=0, atol=0)
    status = _status(bounded)
    assert not status.replayed and status.replays == 0, status
    assert re.fullmatch(
        r"its buffers would hold \d+\.\d MiB of device memory \(by default graphs up to 0 MiB are replayed; "
        r"options=\{'replay': True\} replays any size\)",
        status.reason,
    ), status.reason
    assert _status(forced).replayed and _status(forced).replays == 2
    monkeypatch.setattr(replay_mod, "AUTO_MAX_BYTES", 1024)  # below the copied input: refused before recording
    fl_dynamo.reset()  # else Dynamo reuses `bounded`'s compiled code (the same backend and guards)
    early = torch.compile(copy.deepcopy(model), backend="fl")
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(early(x), want, rtol=0, atol=0)
    assert _status(early).recordings == 0 and "its buffers would hold" in _status(early).reason


def test_the_bound_leaves_out_the_weights_the_graph_caches(monkeypatch):
    """Channels-last and batch-norm-folded weight copies live in the compiled graph's caches whatever runs
    (runtime.cached_value): a replay that reads them pins nothing more, so they do not count against the
    bound. (ResNet-50 on ascend was refused at 78.5 MiB with the layout pass, 33 of its weights copied
    channels-last, and ran x1.47 slower than without the pass.) Results equal eager's, also after the weights
    change, which the caches and the replay's write guard notice."""
    from torch_fl.compile import replay as replay_mod

    fl.set_backend("ascend")
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [nn.Conv2d(128, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Flatten()).eval()
    for m in model:
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    model = model.to("fl")
    x = torch.randn(1, 128, 4, 4, device="fl")  # activations of 8 KiB; weights of 576 KiB each
    monkeypatch.setattr(replay_mod, "AUTO_MAX_BYTES", 256 << 10)
    compiled = torch.compile(model, backend="fl")
    with torch.no_grad():
        for step in range(5):
            if step == 3:
                for p in model.parameters():
                    p.mul_(0.5)
            torch.testing.assert_close(compiled(x).cpu(), model(x).cpu(), rtol=1e-4, atol=1e-4)
    status = _status(compiled)
    assert status.replayed and status.replays >= 1, status
    values = [ref() for ref in list(fl.runtime.watch.CACHED.values())]
    cached = sum(t.untyped_storage().nbytes() for t in values if t is not None)
    assert cached > 4 * replay_mod.AUTO_MAX_BYTES  # counted, they would have refused the graph


def test_the_replay_op_refuses_a_handle_that_is_not_a_live_graph():
    """fl_graph::replay is a public torch op taking a graph handle as an int: any other int (a freed graph's
    included) is refused by name, never followed as a pointer."""
    from torch_fl.runtime import KernelGraph, recording

    x = torch.randn(4, device="fl")
    with recording() as rec:
        torch.relu(x)
    graph = KernelGraph(rec)
    handle = int(core.ffi.cast("intptr_t", graph._g))
    assert torch.ops.fl_graph.replay(handle, []) == []  # live: it replays its kernel (no results declared)
    del graph
    for bad in (handle, 12345, 0, -1):
        with pytest.raises(RuntimeError, match=rf"fl_graph::replay: {bad} is not a live kernel graph"):
            torch.ops.fl_graph.replay(bad, [x])
    assert torch.relu(x).shape == (4,)  # the process goes on


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_replay_reads_unwritten_inputs_in_place_and_copies_written_ones(backend):
    """A copied input that no kernel writes into is read where the caller's tensor is (its readers' descriptors
    point there for the call: no copy), at whatever storage offset; one that a kernel writes into is copied, so
    the caller's tensor never sees the write; replay() (the copy path bench_fusion times) reads the static
    buffers again after a call pointed the readers elsewhere."""
    from torch_fl.runtime import KernelGraph, recording

    fl.set_backend(backend)
    x, w = torch.randn(8, device="fl"), torch.randn(8, device="fl")  # the static inputs
    for _ in range(2):  # plans and kernels made outside the recording
        (x * 2 + w).add_(1)
    with recording() as rec:
        y = x * 2 + w
        w.add_(1)  # a kernel writes into the static input w
    graph = KernelGraph(rec, [(x.data_ptr(), 32), (w.data_ptr(), 32)], [(y.data_ptr(), 32)])
    graph.guard_tensor(x, copied=True)
    graph.guard_tensor(w, copied=True)
    graph.out_tensor(0, True, (8,), (1,), torch.float32, 0)
    assert graph.bind_inputs() == [True, False]
    for bad in (2, -1):  # no such static input: refused, nothing bound
        assert graph._lib.fl_core_graph_bind_input(graph._g, bad) == -1
    assert graph._lib.fl_core_graph_bind_input(core.ffi.NULL, 0) == -1
    big = torch.randn(40, device="fl")
    for k, a in enumerate([torch.randn(8, device="fl"), big[3:11], big[17:25], torch.randn(8, device="fl")]):
        b = torch.randn(8, device="fl")
        a_before, b_before = a.cpu(), b.cpu()
        (out,) = graph.call([a, b])
        torch.testing.assert_close(out.cpu(), a_before * 2 + b_before, rtol=0, atol=0, msg=f"call {k}")
        assert torch.equal(a.cpu(), a_before) and torch.equal(b.cpu(), b_before), "a caller's tensor was written"
        assert torch.equal(big[:3].cpu(), big.cpu()[:3])
    c, d, dst = torch.randn(8, device="fl"), torch.randn(8, device="fl"), torch.empty(8, device="fl")
    graph.replay([c.data_ptr(), d.data_ptr()], [dst.data_ptr()])  # the copy path, after in-place calls
    torch.testing.assert_close(dst.cpu(), c.cpu() * 2 + d.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(x.cpu(), c.cpu(), rtol=0, atol=0)  # copied into the static buffer again


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_replay_writes_a_fresh_result_in_place_only_where_its_first_kernel_writes_it_whole(backend):
    """A static output whose first kernel writes all of it, densely, without reading it, is written by the
    kernels straight into the call's fresh result (its static buffer keeps the recording's values: no kernel
    writes there, and no copy is made); an output written in pieces, one whose first kernel reads it, one no
    kernel writes (a value made before the graph) and outputs sharing bytes stay copies out of their static
    buffers. Every result is right, call after call, and stays valid after the next call; replay() (the copy
    path) writes the static outputs again after direct calls."""
    from torch_fl.runtime import KernelGraph, recording

    fl.set_backend(backend)
    x = torch.randn(8, device="fl")
    before = torch.randn(8, device="fl")  # made before the recording: no kernel of the graph writes it
    garbage = torch.empty(8, device="fl")
    for _ in range(2):  # plans and kernels made outside the recording
        y = x * 2 + 1
        z = torch.empty(16, device="fl")
        z[:8].copy_(x)
        z[8:].copy_(y)
        garbage.add_(1)
    with recording() as rec:
        y = x * 2 + 1  # written whole by its last kernel, read by none before
        z = torch.empty(16, device="fl")
        z[:8].copy_(x)  # written in two halves
        z[8:].copy_(y)
        r = garbage.add_(1)  # its first kernel reads it
    outputs = [(y.data_ptr(), 32), (z.data_ptr(), 64), (r.data_ptr(), 32), (before.data_ptr(), 32)]
    graph = KernelGraph(rec, [(x.data_ptr(), 32)], outputs)
    graph.guard_tensor(x, copied=True)
    for k, (shape, stride) in enumerate([((8,), (1,)), ((16,), (1,)), ((8,), (1,)), ((8,), (1,))]):
        graph.out_tensor(k, True, shape, stride, torch.float32, 0)
    assert graph.bind_outputs() == [True, False, False, False]
    for bad in (4, -1):  # no such static output: refused
        assert graph._lib.fl_core_graph_bind_output(graph._g, bad) == -1
    assert graph._lib.fl_core_graph_bind_output(core.ffi.NULL, 0) == -1
    y_static = y.cpu()
    garbage_after = garbage.cpu()
    results = []
    for k in range(3):
        a = torch.randn(8, device="fl")
        outs = graph.call([a])
        assert outs is not None
        results.append(([o.cpu() for o in outs], outs))
        garbage_after += 1
        expect_y = a.cpu() * 2 + 1
        torch.testing.assert_close(outs[0].cpu(), expect_y, rtol=0, atol=0, msg=f"call {k}")
        torch.testing.assert_close(outs[1].cpu(), torch.cat([a.cpu(), expect_y]), rtol=0, atol=0)
        torch.testing.assert_close(outs[2].cpu(), garbage_after, rtol=0, atol=0)
        torch.testing.assert_close(outs[3].cpu(), before.cpu(), rtol=0, atol=0)
        assert torch.equal(y.cpu(), y_static), "a direct output's static buffer was written"
        torch.testing.assert_close(z.cpu(), outs[1].cpu(), rtol=0, atol=0)  # a copied one: written, copied out
    for cpus, outs in results:  # earlier results stay valid: each call wrote its own
        for o, c in zip(outs, cpus, strict=True):
            assert torch.equal(o.cpu(), c)
    c, dst = torch.randn(8, device="fl"), [torch.empty(n // 4, device="fl") for _, n in outputs]
    graph.replay([c.data_ptr()], [d.data_ptr() for d in dst])  # the copy path, after direct calls
    torch.testing.assert_close(dst[0].cpu(), c.cpu() * 2 + 1, rtol=0, atol=0)
    torch.testing.assert_close(y.cpu(), c.cpu() * 2 + 1, rtol=0, atol=0)  # written into the static output again

    shared = KernelGraph(rec, [(x.data_ptr(), 32)], [(y.data_ptr(), 32), (y.data_ptr() + 16, 16)])
    assert shared.bind_outputs() == [False, False]  # two outputs over the same bytes: both copies


def test_the_replay_op_makes_views_of_its_arguments_and_nones_among_its_results():
    """Results that view an input (a forward's transposed weights saved for the backward) and Nones (a gradient
    a backward does not compute) are made by the C++ op too: a view of the caller's tensor at its own storage
    offset, sharing its memory (a write through it shows in the input, as in eager), in the declared order."""
    from torch_fl.runtime import KernelGraph, recording

    fl.set_backend("cpu")
    x = torch.randn(8, device="fl")
    for _ in range(2):
        x * 2
    with recording() as rec:
        y = x * 2
    graph = KernelGraph(rec, [(x.data_ptr(), 32)], [(y.data_ptr(), 32)])
    graph.guard_tensor(x, copied=True)
    graph.out_view(0, (2, 3), (1, 2), torch.float32, 1)  # x.as_strided((2, 3), (1, 2), 1)
    graph.out_tensor(0, True, (8,), (1,), torch.float32, 0)
    graph.out_none()
    with pytest.raises(fl.FlError, match="refused a view of argument 1"):
        graph.out_view(1, (8,), (1,), torch.float32, 0)  # the call has one tensor argument
    big = torch.randn(20, device="fl")
    a = big[5:13]
    view, out, none = graph.call([a])
    assert none is None
    torch.testing.assert_close(out.cpu(), a.cpu() * 2, rtol=0, atol=0)
    assert view.untyped_storage().data_ptr() == big.untyped_storage().data_ptr()
    assert view.storage_offset() == 6 and view.shape == (2, 3) and view.stride() == (1, 2)
    torch.testing.assert_close(view.cpu(), a.cpu().as_strided((2, 3), (1, 2), 1), rtol=0, atol=0)
    view.zero_()  # a view, not a copy: the write shows in the caller's tensor
    assert float(a[1:7].abs().sum()) == 0.0


def test_training_replays_read_saved_tensors_in_place():
    """A replayed backward reads the saved tensors and the gradient where they are (none of its kernels writes
    into them), step after step with new values, equal to the model compiled without replay."""
    fl.set_backend("rocm")
    torch.manual_seed(0)
    model = _mlp().train().to("fl")
    twin = copy.deepcopy(model)
    replayed = torch.compile(model, backend="fl")
    plain = torch.compile(twin, backend="fl", options={"replay": False})
    big = torch.randn(64, 8, device="fl")
    for step in range(5):
        x = big[step : step + 4]  # the input at another storage offset each step
        for m in (replayed, plain):
            m(x).square().mean().backward()
        for a, b in zip(model.parameters(), twin.parameters(), strict=True):
            torch.testing.assert_close(a.grad.cpu(), b.grad.cpu(), rtol=1e-6, atol=1e-7)
            a.grad = b.grad = None
    status = _status(replayed)
    assert status.replayed and status.replays == 2 * 3, status
    backward = status.graph  # the latest recording: the backward graph
    assert backward is not None and backward.n_inputs > 0 and all(backward.bound), backward.bound
    # every gradient is written by the kernels straight into its fresh tensor (no copy out)
    assert backward.n_outputs > 0 and all(backward.direct), backward.direct


@pytest.mark.slow  # an LSTM's 16 steps, compiled forward and backward: ~10 s a backend
@pytest.mark.parametrize("backend", ["rocm", "minimal"])
def test_an_lstm_captured_with_allow_rnn_replays_and_matches_float64(backend):
    """With Dynamo's allow_rnn (off by default: nn.LSTM is then left to eager PyTorch), an LSTM is captured,
    decomposed per time step by AOTAutograd and replayed: outputs and gradients within native float32's
    distance of float64, step after step with new inputs."""
    with torch._dynamo.config.patch(allow_rnn=True):  # Dynamo reads it while it traces: at the first call
        _lstm_steps(backend)


def _lstm_steps(backend: str) -> None:
    fl.set_backend(backend)
    torch.manual_seed(0)
    model = nn.LSTM(8, 16, num_layers=2, batch_first=True)
    ref, native = copy.deepcopy(model).double(), copy.deepcopy(model)
    model = model.to("fl")
    compiled = torch.compile(model, backend="fl")
    for step in range(4):
        x = torch.randn(3, 5, 8)
        for m, arg in ((compiled, x.to("fl")), (ref, x.double()), (native, x)):
            m(arg)[0].square().sum().backward()
        for (name, p), r, n in zip(model.named_parameters(), ref.parameters(), native.parameters(), strict=True):
            err = (p.grad.cpu().double() - r.grad).abs().max().item()
            native_err = (n.grad.double() - r.grad).abs().max().item()
            assert err <= 4 * native_err + 1e-6 * r.grad.abs().max().item(), (step, name, err, native_err)
            p.grad = r.grad = n.grad = None
    status = _status(compiled)
    assert status.replayed and status.replays == 2 * 2 and status.kernels > 50, status
