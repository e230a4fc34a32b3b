"""fl tensors and other processes: a clear error instead of a broken shared-memory handle.

Why: torch.multiprocessing sends a tensor to another process by moving its
storage into shared memory and passing a file descriptor. An fl tensor's
memory belongs to a plugin in this process, so PyTorch ended up sharing an
empty host storage ("unable to resize file <filename not specified>") or, in
a DataLoader worker, calling a null allocator (SIGSEGV). Until fl tensors are
real PrivateUse1 tensors with a C++ allocator, sending one to another process
is refused with a message that says what to do: send CPU tensors and call
.to("fl") on the other side.

Where the refusal can be raised: in the sending process when pickling
happens on a thread that reports errors (Process.start, Pool.map's task
handler); in a DataLoader worker or a multiprocessing.Queue feeder thread
(which only print pickling errors and drop the item, so the receiver would
wait forever) the pickle instead carries the error, raised when it arrives."""

from __future__ import annotations

import threading
from multiprocessing.reduction import ForkingPickler

from .errors import FlError

MESSAGE = ("an fl tensor cannot be sent to another process (multiprocessing, DataLoader workers): its memory belongs "
           "to the plugin in this process. Send CPU tensors (t.cpu()) and call .to('fl') in the receiving process; "
           "with a DataLoader, return CPU tensors from the Dataset and move each batch to 'fl' in the training loop "
           "(pin_memory=True and .to('fl', non_blocking=True) keep that fast)")


def _delivered_error(message: str):
    """Unpickling target: the receiver raises the sender's refusal."""
    raise FlError(message)


def _reduce_fl_tensor(t):
    if _errors_are_dropped_here():
        return _delivered_error, (MESSAGE,)
    raise FlError(MESSAGE)


def _errors_are_dropped_here() -> bool:
    """True on a thread whose pickling errors nobody sees: a DataLoader worker process, or a
    multiprocessing.Queue's feeder thread."""
    try:
        from torch.utils.data import get_worker_info

        if get_worker_info() is not None:
            return True
    except ImportError:
        pass
    return threading.current_thread().name == "QueueFeederThread"


def register(tensor_type: type) -> None:
    """Makes multiprocessing's pickler refuse `tensor_type` (FlTensor) as described above."""
    ForkingPickler.register(tensor_type, _reduce_fl_tensor)
