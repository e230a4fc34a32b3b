"""fl.profile: exact counts and paths for a known op sequence on every backend,
kernel launches of decompositions, fallback costs, memory, comparison and the
Chrome trace."""

import json

import pytest
import torch
import torch.nn.functional as F

import torch_fl as fl
from torch_fl.errors import FlError

BACKENDS = ["cpu", "rocm", "ascend", "minimal"]
GELU_PATH = {"cpu": "native", "rocm": "native", "ascend": "decomposition", "minimal": "decomposition"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_known_sequence_counts_paths_and_kernels(backend):
    fl.set_backend(backend)
    x = torch.randn(4, 4, device="fl")
    with fl.profile(label=backend) as prof:
        y = x + x
        z = y.exp()
        w = z @ z
        g = F.gelu(w)
        host = g.cpu()
    ops = {s.op: s for s in prof.ops() if s.calls}
    assert ops["aten::add.Tensor"].calls == 1 and ops["aten::add.Tensor"].path == "native"
    assert ops["aten::add.Tensor"].kernels == 1
    assert ops["aten::exp"].calls == 1 and ops["aten::exp"].path == "native"
    assert ops["aten::mm"].calls == 1 and ops["aten::mm"].path == "native" and ops["aten::mm"].kernels == 1
    gelu = ops["aten::gelu"]
    assert gelu.calls == 1 and gelu.path == GELU_PATH[backend]
    nested_kernels = sum(e.kernels for e in prof.events if e.depth == 1 and e.path == "native")
    if gelu.path == "native":
        assert gelu.kernels == 1
    else:  # a decomposition counts every kernel its sub-ops launched
        assert gelu.kernels == nested_kernels >= 2
    copy = ops["aten::copy_"]  # .cpu() reaches the device as a copy
    assert copy.path == "copy" and copy.calls == 1
    host_accessible = backend == "cpu"
    assert copy.bytes_copied == (0 if host_accessible else 64)  # zero-copy read vs a real device-to-host copy
    assert prof.kernels == sum(s.kernels for s in ops.values())
    assert prof.op_calls == 5
    assert torch.allclose(host, F.gelu((x.cpu() * 2).exp() @ (x.cpu() * 2).exp()), rtol=1e-4, atol=1e-4)


def test_fallbacks_are_listed_with_their_cost():
    from torch_fl.runtime import disabled_paths

    fl.set_backend("minimal")  # no convolution kernel; without its decomposition the CPU fallback serves it
    x, w = torch.randn(1, 2, 5, 5, device="fl"), torch.randn(3, 2, 3, 3, device="fl")
    with fl.profile() as prof, disabled_paths("decomposition"):
        F.conv2d(x, w)
    fb = {s.op: s for s in prof.fallbacks()}
    assert "aten::convolution" in fb
    conv = fb["aten::convolution"]
    assert conv.paths["fallback"] == 1 and conv.kernels == 0
    # inputs in (200 + 216 bytes), output out (3*3*3*4 bytes)
    assert conv.bytes_copied == (50 + 54 + 27) * 4
    assert "CPU fallbacks: aten::convolution" in prof.render()


def test_memory_and_pool_stats():
    fl.set_backend("rocm")
    torch.fl.empty_cache()
    with fl.profile() as prof:
        a = torch.empty(1000, device="fl")
        del a
        b = torch.empty(1000, device="fl")
    mem = {m.backend: m for m in prof.memory}["rocm"]
    assert mem.pool_misses >= 1 and mem.pool_hits >= 1
    from torch_fl.runtime.memory import size_class

    assert mem.peak >= 4000 and mem.allocated_end - mem.allocated_start == size_class(b.numel() * 4)


def test_profile_views_exports_and_renderings(tmp_path):
    x = torch.randn(8, 8, device="fl")
    with fl.profile(label="run") as prof:
        for _ in range(3):
            x = torch.tanh(x @ x)
    top = prof.top(2)
    assert [s.op for s in top][0] in ("aten::mm", "aten::tanh") and all(s.calls == 3 for s in top)
    d = json.loads(prof.to_json())
    assert d["op_calls"] == 6 and d["kernels"] == 6 and {o["op"] for o in d["ops"]} == {"aten::mm", "aten::tanh"}
    trace = json.load(open(prof.export_chrome_trace(str(tmp_path / "trace.json"))))
    events = trace["traceEvents"]
    assert len(events) == 6 and all(e["ph"] == "X" and e["dur"] >= 0 and e["ts"] >= 0 for e in events)
    assert {e["name"] for e in events} == {"aten::mm", "aten::tanh"} and events[0]["cat"] == "native"
    assert sum(prof.time_by_path().values()) > 0
    bundle = prof._repr_mimebundle_()
    assert "aten::mm" in bundle["text/html"] and "6 op calls" in bundle["text/plain"]


def test_compare_backends_side_by_side():
    def work():
        a = torch.randn(4, 6, device="fl")
        return F.layer_norm(a, (6,)).sum().cpu()

    c = fl.compare_backends(work, "rocm", "minimal")
    rows = {r["op"]: r for r in c.rows()}
    assert rows["aten::native_layer_norm"]["path"] == ("native", "decomposition")
    assert rows["aten::native_layer_norm"]["kernels"][0] == 1 and rows["aten::native_layer_norm"]["kernels"][1] > 1
    assert fl.get_current_backend_name() == "cpu"  # restored
    assert "rocm vs minimal" in c.render()


_MODEL = None
_X = None


def test_compare_backends_moves_what_the_workload_uses():
    """docs/tools.md's sample: the model and input were made on rocm before the comparison. The minimal
    column must hold minimal's own paths (it used to show rocm's, every op having run there), and the model
    and input go back where they were."""
    global _MODEL, _X
    torch.manual_seed(0)
    with fl.using_backend("rocm"):
        _MODEL = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64)).to("fl")
        _X = torch.randn(8, 32, device="fl")
        home = _X.device
    local = torch.randn(8, 32, device=home)  # a closure cell, too
    c = fl.compare_backends(lambda: (_MODEL(_X).sum() + _MODEL(local).sum()).backward(), "rocm", "minimal")
    rows = {r["op"]: r for r in c.rows()}
    assert rows["aten::gelu"]["path"] == ("native", "decomposition")
    assert rows["aten::native_layer_norm"]["path"] == ("native", "decomposition")
    assert {s.backend for s in c.b.ops()} == {"minimal"} and {s.backend for s in c.a.ops()} == {"rocm"}
    assert _X.device == home and local.device == home and _MODEL[0].weight.device == home
    assert _MODEL[0].weight.grad.device == home


def test_compare_backends_refuses_a_run_that_ran_elsewhere():
    with fl.using_backend("rocm"):
        hidden = {"x": torch.randn(4, 4, device="fl")}
    with pytest.raises(FlError, match="the run on 'minimal' is not a run on minimal: .* calls on rocm"):
        fl.compare_backends(lambda: torch.tanh(hidden["x"]) + 1, "minimal", "rocm")
    with pytest.raises(FlError, match="the run on 'rocm' is not a run on rocm: no fl op at all"):
        fl.compare_backends(lambda: torch.ones(3) + 1, "rocm", "minimal")
    assert fl.get_current_backend_name() == "cpu"


def test_torch_profiler_sees_fl_paths():
    x = torch.randn(4, 4, device="fl")
    with torch.profiler.profile() as tp:
        with fl.profile(record_functions=True):
            (x @ x).exp()
    names = {e.name for e in tp.events()}
    assert "fl::aten::mm" in names and "fl::aten::exp" in names


def test_torch_profiler_trace_holds_fl_device_kernels(tmp_path):
    """torch.profiler with ProfilerActivity.PrivateUse1: each fl kernel is a device event in the trace (the
    op that launched it, its fl device and stream), linked to its CPU op, whose device time key_averages
    then shows. On an asynchronous device (FL_EMU_ASYNC=1, opencl) the time comes from device events."""
    from torch.profiler import ProfilerActivity, profile

    from torch_fl.runtime import REGISTRY, core

    if not core.lib().fl_core_kineto():
        pytest.skip("this torch has no PrivateUse1 profiler registry (torch >= 2.10 has)")
    fl.set_backend("rocm")
    dev = REGISTRY.device(None)
    a = torch.randn(128, 128, device="fl")
    (a @ a).sum().item()  # warm: plans and programs built
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        (a @ a).relu().sum().item()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    kernels = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "kernel"]
    mm = [e for e in kernels if e["name"].startswith("aten::mm")]
    assert mm and {e["args"]["device"] for e in kernels} == {f"fl:{dev.index}"}, kernels
    assert mm[0]["dur"] > 0 and mm[0]["args"]["stream"] == 0
    timing = "device events" if dev.props.async_kernels else "host clock around a synchronous kernel"
    assert {e["args"]["timing"] for e in kernels} == {timing}
    booked = {e.key: e.self_device_time_total for e in prof.key_averages()}
    assert booked.get("aten::mm", 0) > 0, booked
    assert not core.tracing()  # the recorder is off once the trace ends


def test_no_listener_no_events():
    from torch_fl.runtime import events

    x = torch.randn(4, device="fl")
    with fl.profile() as prof:
        pass
    (x + x).cpu()
    assert prof.events == [] and not events.STATE.listeners


def test_self_time_never_exceeds_total_time():
    """Issue 13: an op called both directly and inside a decomposition showed self > total (total counted
    the user's calls only, self every call)."""
    fl.set_backend("minimal")  # gelu decomposes into mul/add/erf; add is also called directly
    x = torch.randn(16, 16, device="fl")
    with fl.profile() as prof:
        for _ in range(3):
            y = F.gelu(x) + x
            y = F.layer_norm(y, (16,))
    ops = {s.op: s for s in prof.ops()}
    add = ops["aten::add.Tensor"]
    assert add.calls == 3 and add.nested_calls > 0  # the case of the issue
    for s in ops.values():
        assert s.self_s <= s.total_s, (s.op, s.self_s, s.total_s)
        assert s.total_s > 0 and s.mean_us > 0, s.op  # ops reached only inside others are timed too
    assert f"{add.calls}+{add.nested_calls}" in prof.table(50)


def test_comparison_table_names_the_backend_of_every_column():
    """Issue 13: two numbers under one "kernels" and one "ms" header, without the backends' names."""
    c = fl.compare_backends(lambda: F.layer_norm(torch.randn(4, 6, device="fl"), (6,)).cpu(), "rocm", "minimal")
    header = c.render().splitlines()[1].split()
    assert header == [
        "op",
        "path",
        "rocm",
        "path",
        "minimal",
        "kernels",
        "rocm",
        "kernels",
        "minimal",
        "ms",
        "rocm",
        "ms",
        "minimal",
    ]
    row = next(line for line in c.render().splitlines() if line.startswith("aten::native_layer_norm"))
    path_a, path_b, kernels_a, kernels_b = row.split()[1:5]
    assert (path_a, path_b, kernels_a) == ("native", "decomposition", "1") and int(kernels_b) > 1


def test_using_backend_switches_and_restores_even_on_error():
    fl.set_backend("rocm")
    torch.fl.set_device(fl.device("rocm", 1).index)  # a device other than the backend's first one
    before = fl.current_device()
    with fl.using_backend("minimal") as name:
        assert name == "minimal" and fl.get_current_backend_name() == "minimal"
        assert torch.empty(1, device="fl").device == fl.device("minimal")
    assert fl.get_current_backend_name() == "rocm" and fl.current_device() == before
    with pytest.raises(RuntimeError, match="in the block"), fl.using_backend("ascend"):
        assert fl.get_current_backend_name() == "ascend"
        raise RuntimeError("in the block")
    assert fl.get_current_backend_name() == "rocm" and fl.current_device() == before
    with pytest.raises(fl.BackendNotFoundError):  # an unknown name changes nothing
        with fl.using_backend("nope"):
            pass
    assert fl.get_current_backend_name() == "rocm" and fl.current_device() == before
    fl.set_backend("cpu")


def test_compare_backends_restores_the_backend_when_fn_raises():
    fl.set_backend("ascend")
    ran = []

    def work():
        ran.append(fl.get_current_backend_name())
        torch.ones(2, device="fl").add_(1)
        if len(ran) == 2:
            raise RuntimeError("second run")

    with pytest.raises(RuntimeError, match="second run"):
        fl.compare_backends(work, "rocm", "minimal", warmup=0)
    assert ran == ["rocm", "minimal"] and fl.get_current_backend_name() == "ascend"
    fl.set_backend("cpu")
