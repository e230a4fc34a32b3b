"""`torch.fl`'s streams and events, as torch.cuda has them.

They are PyTorch's own torch.Stream and torch.Event on the fl device, so
torch.accelerator, autograd's stream handling and `Tensor.record_stream`
accept them. The C++ core (csrc/fl_guard.cpp) maps a stream to the plugin's
queue: kernels, fills and copies issued while a stream is current go to it,
`wait_stream`/`wait_event` make one queue wait for another on the device
(ABI v2's stream_wait_event, else the host waits), and the caching pool
reuses a block only on the stream it was allocated on, after the streams
named by `record_stream` have passed its free."""

from __future__ import annotations

from typing import Any

import torch

from . import core


def _device(device: Any = None) -> torch.device:
    """None (the current fl device), an index, 'fl', 'fl:N' or torch.device('fl', N)."""
    if device is None or (isinstance(device, (str, torch.device)) and torch.device(device) == torch.device("fl")):
        return torch.device("fl", core.lib().fl_core_current())
    if isinstance(device, int):
        return torch.device("fl", device)
    d = torch.device(device)
    if d.type != "fl":
        raise ValueError(f"expected an fl device (None, an index, 'fl:N'), got {device!r}")
    return d


class FlInstance(type):
    """isinstance(s, torch.fl.Stream) is true for any fl torch.Stream (current_stream() returns plain ones)."""

    base: type[torch.Stream] | type[torch.Event]

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls.base) and obj.device.type == "fl"


class Stream(metaclass=FlInstance):
    """torch.fl.Stream(device=None, priority=0): a stream of the device's pool, a plain torch.Stream (so
    torch's own stream functions accept it): `with s:` or `with torch.fl.stream(s):` makes it current."""

    base = torch.Stream

    # a factory, so not an instance of cls (mypy's rule for __new__): FlInstance's isinstance accepts it
    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> torch.Stream:  # type: ignore[misc]
        if kwargs:  # (stream_id=, device_index=, device_type=): naming an existing stream
            return torch.Stream(**kwargs)
        return torch.Stream(device=_device(device), priority=priority)


class Event(metaclass=FlInstance):
    """torch.fl.Event(enable_timing=False, blocking=False, interprocess=False): a torch.Event on an fl device;
    elapsed_time between two of them is device time."""

    base = torch.Event

    # a factory, so not an instance of cls (mypy's rule for __new__): FlInstance's isinstance accepts it
    def __new__(  # type: ignore[misc]
        cls,
        enable_timing: bool = False,
        blocking: bool = False,
        interprocess: bool = False,
        device: Any = None,
    ) -> torch.Event:
        return torch.Event(
            device=_device(device), enable_timing=enable_timing, blocking=blocking, interprocess=interprocess
        )


def current_stream(device: Any = None) -> torch.Stream:
    """This thread's current stream on the device (the default stream unless one was made current)."""
    return torch.accelerator.current_stream(_device(device))


def default_stream(device: Any = None) -> torch.Stream:
    """The device's default stream (the plugin's NULL stream)."""
    current = current_stream(device)
    return torch.Stream(stream_id=0, device_index=current.device_index, device_type=current.device_type)


def set_stream(stream: torch.Stream | None) -> None:
    """Make the stream current on its device for this thread (None: no change, as torch.cuda.set_stream)."""
    if stream is not None:
        torch.accelerator.set_stream(stream)


class StreamContext:
    """torch.fl.stream(s) / StreamContext(s): s is the current stream inside the block (None: no change)."""

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = stream
        self.previous: torch.Stream | None = None

    def __enter__(self) -> torch.Stream | None:
        if self.stream is not None:
            self.previous = torch.accelerator.current_stream(self.stream.device)
            torch.accelerator.set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc: Any) -> None:
        if self.previous is not None:
            torch.accelerator.set_stream(self.previous)


def stream(stream: torch.Stream | None) -> StreamContext:
    return StreamContext(stream)
