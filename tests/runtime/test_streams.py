"""Streams: the C++ core's guard and caching pool (runtime/csrc/fl_guard.cpp, fl_allocator.cpp) over the plugins'.

PyTorch's autograd engine records each node's stream and, where a gradient
crosses streams, records an event on the producer and waits on it from the
consumer; torch.Stream, torch.Event and torch.accelerator use the same guard
calls. Kernels, fills and copies go to the calling thread's current stream;
`wait_stream`/`wait_event` order one stream after another on the device
(stream_wait_event); the pool reuses a block only on its own stream and, after
`record_stream`, only once the named streams have passed its free. On the
synchronous backends a stream's work is done when its call returns; the
emulators' asynchronous mode (FL_EMU_ASYNC=1, which scripts/test.sh runs this
file under too, and the subprocess tests below) runs every stream on its own
worker thread, so a missing order shows up as a wrong value."""

import os
import threading

import pytest
import torch
from conftest import HERE, run_py

import torch_fl as fl


@pytest.fixture
def rocm():
    fl.set_backend("rocm")
    torch.fl.set_device(fl.current_device())
    return fl.current_device()


def test_new_streams_are_distinct_and_on_the_current_device(rocm):
    a, b = torch.Stream("fl"), torch.Stream("fl")
    assert a.device_index == b.device_index == rocm.index
    assert a.stream_id != b.stream_id
    default = torch.accelerator.current_stream()
    assert default.device_index == rocm.index and default.stream_id == 0


def test_stream_context_sets_the_current_stream_of_this_thread_only(rocm):
    side = torch.Stream("fl")
    seen = {}
    with side:
        assert torch.accelerator.current_stream() == side
        t = threading.Thread(target=lambda: seen.update(other=torch.accelerator.current_stream()))
        t.start()
        t.join()
    assert seen["other"].stream_id == 0  # another thread keeps its own current stream
    assert torch.accelerator.current_stream().stream_id == 0  # restored on exit


def test_events_record_query_synchronize_and_time(rocm):
    start, end = torch.Event("fl", enable_timing=True), torch.Event("fl", enable_timing=True)
    assert start.query()  # never recorded
    start.record()
    y = torch.randn(64, 64, device="fl") @ torch.randn(64, 64, device="fl")
    end.record()
    end.synchronize()
    assert start.query() and end.query()
    assert end.event_id != 0 and start.event_id != end.event_id
    assert start.elapsed_time(end) >= 0.0
    torch.Stream("fl").synchronize()
    torch.accelerator.synchronize()
    assert y.shape == (64, 64)


def test_autograd_across_streams_and_devices(rocm):
    """Forward on a side stream, backward on another: the engine records events on the producers'
    streams and waits on them (through the guard); the gradients are the CPU's."""
    torch.manual_seed(0)
    w = torch.randn(5, 5)
    x_cpu = w.clone().requires_grad_()
    ((x_cpu * 2).relu().sum() + (x_cpu * 3).sum()).backward()
    x = w.to("fl").requires_grad_()
    side = torch.Stream("fl")
    with side:
        y = (x * 2).relu().sum()
    z = (x.cpu() * 3).sum().to("fl")  # through the host and back
    with torch.Stream("fl"):
        (y + z).backward()
    torch.testing.assert_close(x.grad.cpu(), x_cpu.grad)


def test_gradient_on_the_wrong_device_is_refused_like_cuda():
    """A CPU output's gradient given on fl: PyTorch refuses it for CUDA tensors ("invalid gradient
    ... expected device cpu"); the wrapper tensors of torch_fl 0.1 skipped that check and tripped the
    engine's internal assert `opt_ready_stream && opt_parent_stream`. Real PrivateUse1 tensors get the
    engine's own check."""
    x = torch.randn(3, device="fl", requires_grad=True)
    with pytest.raises(RuntimeError, match="invalid gradient|expected device cpu"):
        x.to("cpu").backward(torch.ones(3, device="fl"))


def test_fl_module_has_streams_and_events(rocm):
    s = torch.fl.Stream()
    assert isinstance(s, torch.fl.Stream) and isinstance(s, torch.Stream)
    assert s.device_type == torch.fl.current_stream().device_type
    assert torch.fl.default_stream().stream_id == 0 and torch.fl.current_stream() == torch.fl.default_stream()
    with torch.fl.stream(s) as inside:
        assert inside is s and torch.fl.current_stream() == s
    assert torch.fl.current_stream().stream_id == 0
    torch.fl.set_stream(s)
    try:
        assert torch.fl.current_stream() == s
    finally:
        torch.fl.set_stream(torch.fl.default_stream())
    e = torch.fl.Event(enable_timing=True)
    assert isinstance(e, torch.fl.Event) and e.device.type == "fl"
    with pytest.raises(ValueError, match="expected an fl device"):
        torch.fl.Stream("cpu")


def test_torch_stream_hands_out_a_pool_not_a_thread_per_call(rocm):
    """A plugin stream may be a thread (the emulators) or a queue (OpenCL): a loop that makes a stream
    per step must reuse a few, as CUDA's pool does."""
    ids = {torch.fl.Stream().stream_id for _ in range(40)}
    assert 2 <= len(ids) <= 8


def _check_side_stream_chain(dev):
    torch.manual_seed(1)
    x = torch.randn(256, 256, device=dev)
    acc = torch.zeros(256, 256, device=dev)
    for _ in range(6):  # a long chain on the default stream
        acc.add_(x @ x)
    side = torch.fl.Stream()
    side.wait_stream(torch.fl.current_stream())  # the side stream starts after the chain
    with torch.fl.stream(side):
        col = (acc * 2 + 1).sum(0)
    torch.fl.current_stream().wait_stream(side)
    got = col.cpu().double()
    # judged against float64, relative to native float32's own error on the same sums
    xc = x.cpu()
    native = (sum(xc @ xc for _ in range(6)) * 2 + 1).sum(0).double()
    truth = (sum(xc.double() @ xc.double() for _ in range(6)) * 2 + 1).sum(0)
    err, native_err = (got - truth).abs().max().item(), (native - truth).abs().max().item()
    assert err <= 8 * native_err + 1e-6 * truth.abs().max().item(), (err, native_err)


def _check_record_stream(n: int, steps: int) -> bool:
    """A block used on a side stream (record_stream) and freed while that stream may still run: the pool
    hands it out again only once the stream has passed the free. Returns whether it was reused at once."""
    x = torch.randn(384, 384, device="fl")
    z = torch.ones(n, device="fl")
    ptr = z.data_ptr()
    side = torch.fl.Stream()
    side.wait_stream(torch.fl.current_stream())
    with torch.fl.stream(side):
        w = x
        for _ in range(steps):  # keeps the side stream busy (on an asynchronous device)
            w = w @ x / 384
        u = z * 2  # z is used on the side stream
    z.record_stream(side)
    used = torch.fl.Event()
    used.record(side)
    del z  # the pool marks the side stream here, after `used`
    fresh = torch.empty(n, device="fl").fill_(7.0)
    reused = fresh.data_ptr() == ptr
    # reused only if the side stream had passed the free by then, and so `used` before it
    assert not reused or used.query()
    del fresh
    side.synchronize()
    again = torch.empty(n, device="fl")
    assert again.data_ptr() == ptr  # once the side stream is done the block comes back
    torch.fl.current_stream().wait_stream(side)
    assert u.sum().item() == 2 * n
    return reused


def _check_training_on_a_side_stream() -> None:
    """A training step's gradients on a side stream are the default stream's."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to("fl")
    inp = torch.randn(16, 32, device="fl")
    m(inp).square().mean().backward()
    g0 = [p.grad.cpu().clone() for p in m.parameters()]
    m.zero_grad()
    side = torch.fl.Stream()
    side.wait_stream(torch.fl.current_stream())
    with torch.fl.stream(side):
        m(inp).square().mean().backward()
    torch.fl.current_stream().wait_stream(side)
    for a, b in zip(g0, [p.grad.cpu() for p in m.parameters()], strict=True):
        torch.testing.assert_close(a, b)


def streams_script(backend: str) -> str:
    """The checks above in a process of their own on `backend` (one that needs FL_EMU_ASYNC=1 or a driver)."""
    return f"""
import sys, torch, torch_fl as fl
sys.path[:0] = [{os.path.dirname(os.path.abspath(__file__))!r}, {HERE!r}]
import test_streams as t
fl.initialize({backend!r})
x = torch.randn(384, 384, device="fl")
(x @ x / 384).sum().item()  # the emulator runs a signature's first call to completion: warm them
t._check_side_stream_chain("fl")
reused = t._check_record_stream(345_678, 24)
t._check_training_on_a_side_stream()
print("STREAMS-OK", reused)
"""


def test_kernels_on_a_side_stream_are_ordered_by_wait_stream(rocm):
    _check_side_stream_chain("fl")


def test_the_pool_reuses_a_block_only_on_its_own_stream(rocm):
    side = torch.fl.Stream()
    n = 123_456  # a size class nothing else here uses
    with torch.fl.stream(side):
        a = torch.empty(n, device="fl")
        ptr = a.data_ptr()
        del a
    b = torch.empty(n, device="fl")
    assert b.data_ptr() != ptr  # the default stream may still be ahead of the side stream's use
    with torch.fl.stream(side):
        c = torch.empty(n, device="fl")
        assert c.data_ptr() == ptr  # in the side stream's own order the reuse is safe
    del b, c


def test_record_stream_holds_a_block_until_the_stream_passes_its_free(rocm):
    _check_record_stream(234_567, 8)


def test_record_stream_of_another_device_is_refused(rocm):
    x = torch.ones(4, device="fl")
    other = next(d for d in fl.runtime.REGISTRY.devices if d.index != x.get_device())
    with pytest.raises(RuntimeError, match="record_stream: the stream is on fl:.*record a stream of the tensor's"):
        x.record_stream(torch.Stream(device=other.torch_device))


def test_training_on_a_side_stream(rocm):
    _check_training_on_a_side_stream()


@pytest.mark.slow  # a subprocess
def test_streams_on_an_asynchronous_device():
    """The same checks where every stream is its own worker thread and kernels return at once: a missing
    device-side wait reads a half-written tensor; a block reused too early is overwritten."""
    r = run_py(streams_script("rocm"), env={"FL_EMU_ASYNC": "1"})
    assert r.returncode == 0 and "STREAMS-OK" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]
