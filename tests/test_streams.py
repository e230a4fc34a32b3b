"""The C++ core's stream and event bookkeeping (its device guard, torch_fl/runtime/csrc/fl_core.cpp).

PyTorch's autograd engine records each node's stream and, where a gradient
crosses streams, records an event on the producer and waits on it from the
consumer; torch.Stream, torch.Event and torch.accelerator use the same guard
calls. The guard used to answer every stream query with the default stream,
ignore stream switches, leave events unrecorded and refuse elapsed_time, and
gave torch.Stream("fl") device index -1. fl kernels are synchronous with the
host, so an event is complete when recorded; what matters is that the
bookkeeping is PyTorch's: a current stream per thread and device, distinct
new streams, events that record and time."""

import threading

import pytest
import torch

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
