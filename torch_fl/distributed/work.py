"""Work handles and the process group's worker thread.

Why one worker thread per process group: every rank must issue collectives
in the same order (the plugin's communicator and gloo both match calls by
order), and an async op must return before it has finished so that DDP can
overlap the all-reduce of one gradient bucket with the backward of the
next. A FIFO queue drained by one thread gives both: calls run in issue
order, off the caller's thread. The plugin's comm_* calls and gloo release
the GIL while they move data, so Python keeps computing meanwhile.

The worker thread only calls plugin entry points and gloo on host tensors;
everything that goes through torch_fl's dispatcher (allocation, argument
checks) happens in the caller's thread before the work is queued."""

from __future__ import annotations

import datetime
import queue
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from ..errors import FlError


class CollectiveError(dist.DistBackendError, FlError):
    """A collective failed on this rank (a peer died, calls mismatched, a plugin error)."""


class CollectiveTimeoutError(CollectiveError):
    """A collective did not complete within the process group's timeout."""


class BackendMismatchError(FlError, ValueError):
    """The ranks of one process group selected different fl backends."""


_TIMEOUT_WORDS = ("timed out", "timeout")


def wrap_error(exc: BaseException, what: str) -> CollectiveError:
    """One exception type for every failure of a collective, naming the op and
    the path; timeouts (the plugin's, gloo's) become CollectiveTimeoutError."""
    if isinstance(exc, CollectiveError):
        return exc
    msg = str(exc)
    low = msg.lower()
    if any(w in low for w in _TIMEOUT_WORDS):
        err: CollectiveError = CollectiveTimeoutError(
            f"{what} timed out: {msg}. A peer rank stopped calling collectives (it died, hangs, or runs a different "
            "sequence of collectives); raise the process group's timeout= if it is only slow"
        )
    elif "connection closed by peer" in low or "connection reset" in low or "broken pipe" in low:
        err = CollectiveError(f"{what} failed: a peer rank closed its connection, so it probably died: {msg}")
    else:
        err = CollectiveError(f"{what} failed: {msg}")
    err.__cause__ = exc
    return err


class FlWork(dist.Work):
    """The handle an fl collective returns: wait() blocks until the op ran on
    the worker thread and raises its error; get_future() gives DDP's reducer a
    torch Future completed with the op's output tensors."""

    def __init__(self, what: str, fn: Callable[[], None], result: list, timeout_s: float, source_rank: int = -1):
        super().__init__()
        self.what = what
        self._fn: Callable[[], None] | None = fn
        self._result = result
        self._timeout_s = timeout_s
        self._done = threading.Event()
        self._error: CollectiveError | None = None
        # Future.set_exception only marks a Python-side error: C++ readers of the
        # future (DDP's reducer) would take the exception object for the result.
        # A callback that raises makes PyTorch fail the chained future in C++, so
        # the error reaches every reader.
        self._done_future: torch.futures.Future = torch.futures.Future()
        self._future = self._done_future.then(self._outcome)
        # the peer a recv was posted for; not named _source_rank, which is dist.Work's method (dist.recv from
        # any source calls work._source_rank(); an int attribute of that name would make it a TypeError)
        self._peer_rank = source_rank

    def _outcome(self, _fut) -> list:
        if self._error is not None:
            raise self._error
        return self._result

    # -- run by the worker thread -------------------------------------------
    def _run(self) -> None:
        assert self._fn is not None, "a work item runs once"
        try:
            self._fn()
        except BaseException as e:  # noqa: BLE001 - every failure must reach wait() and the future
            self._error = wrap_error(e, self.what)
        self._fn = None  # drop references to the staged tensors
        self._done.set()
        self._done_future.set_result(None)

    # -- the Work API ---------------------------------------------------------
    def wait(self, timeout: datetime.timedelta | float | None = None) -> bool:
        limit = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
        if not limit or limit <= 0:
            # the op itself fails at the process group's timeout; the margin covers the queue ahead of it
            limit = self._timeout_s * 2 + 10
        if not self._done.wait(limit):
            raise CollectiveTimeoutError(
                f"{self.what} did not complete within {limit:.1f} s: a peer rank stopped calling collectives, or an "
                "earlier collective of this process group is still blocked"
            )
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self):
        return self._error

    def result(self) -> list:
        self.wait()
        return self._result

    def source_rank(self) -> int:
        return self._peer_rank

    def _source_rank(self) -> int:
        return self._peer_rank

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> torch.futures.Future:
        return self._future

    def __repr__(self) -> str:
        state = "failed" if self._error else ("done" if self._done.is_set() else "pending")
        return f"<FlWork {self.what} {state}>"


class Worker:
    """Runs works one at a time, in submission order.

    A blocking call (torch.distributed's async_op=False) made while nothing
    is queued runs at once in the caller's thread: the caller waits anyway,
    and two thread hand-offs would cost more than a small collective. The
    run lock keeps it from overlapping a queued work."""

    def __init__(self, name: str):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()  # held while a work runs
        self._pending = 0  # submitted, not yet finished
        self._count_lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        self.busy_s = 0.0

    def submit(self, work: FlWork, inline: bool = False) -> FlWork:
        if not self._thread.is_alive():
            raise CollectiveError(f"{work.what}: this process group was shut down; create a new one")
        with self._count_lock:
            run_here = inline and self._pending == 0
            self._pending += 1
        if run_here:
            self._execute(work)
        else:
            self._queue.put(work)
        return work

    def _execute(self, work: FlWork) -> None:
        with self._lock:
            t0 = time.perf_counter()
            try:
                work._run()
            finally:
                self.busy_s += time.perf_counter() - t0
                with self._count_lock:
                    self._pending -= 1

    def _loop(self) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                return
            self._execute(work)

    def stop(self, timeout_s: float = 5.0) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout_s)
