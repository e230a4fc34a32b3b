"""Turning the alias on: `alias_cuda()` from Python, FL_ALIAS_CUDA at `import torch_fl` or at `import torch`
(the autoload entry point). Once on, it lasts for the process."""

from __future__ import annotations

import os
import sys

import torch

from ..errors import ConfigError
from ..notice import notice
from ..runtime import config
from .devices import backend_name, fl_devices
from .errors import CudaAliasError
from .install import install
from .mode import enter_mode
from .state import LOCK, STATE, restore

ENV = "FL_ALIAS_CUDA"


def is_active() -> bool:
    """Whether the cuda alias is on in this process."""
    return bool(STATE["active"])


def _real_cuda_available() -> bool:
    """Whether this PyTorch sees a real CUDA device (asked before the alias replaces is_available)."""
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken CUDA install counts as none
        return False


def alias_cuda(force: bool = False) -> str:
    """Make code written for CUDA run on the active fl backend, unchanged; returns the backend's name.

    Why opt-in: it changes what `torch.cuda` answers for the whole process. Why
    it refuses a real CUDA device unless `force=True`: there, "cuda" already
    means something, and silently sending it elsewhere would surprise. Calling
    it again is harmless (and enters the device mode in a thread that lacks it)."""
    with LOCK:
        if STATE["active"]:
            enter_mode()
            return backend_name()
        if not force and _real_cuda_available():
            raise CudaAliasError(
                "torch_fl's cuda alias stays off: this PyTorch sees a real CUDA device, so 'cuda' "
                "already means it. Call alias_cuda(force=True) (or set FL_ALIAS_CUDA=force) to "
                "send 'cuda' to the fl backend anyway"
            )
        backend = backend_name()  # FL_BACKEND, the config file, or auto
        try:
            install()
        except BaseException:
            restore()
            raise
        STATE.update(active=True, forced=bool(force))
        enter_mode()
    devices = ", ".join(f"cuda:{i} -> {d}" for i, d in enumerate(fl_devices(backend)))
    notice(
        f"torch_fl: cuda alias on: 'cuda' runs on fl backend '{backend}' ({devices}); tensors report their "
        f"real device (fl:N)"
    )
    return backend


def requested() -> str | None:
    """What FL_ALIAS_CUDA asks for: None (unset, empty, 0/false/no/off), "on" (1/true/yes/on) or "force".
    Any other value raises ConfigError naming the variable and the accepted values."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return None
    if text.lower() == "force":
        return "force"
    try:
        return "on" if config.parse_bool(text, ENV) else None
    except ConfigError:
        raise ConfigError(
            f"{ENV}={text!r} is not valid: use 1 to alias 'cuda' to the active fl backend, "
            f"force to do so even over a real CUDA device, or 0 to leave it off"
        ) from None


def autoload_in_progress() -> bool:
    """Whether torch_fl is being imported by the `import torch` autoload entry point (torch_fl_autoload.load),
    which turns the alias on itself once the device is registered, so a failure gets its own warning."""
    return bool(getattr(sys.modules.get("torch_fl_autoload"), "loading", False))


def from_environment() -> str | None:
    """Honour FL_ALIAS_CUDA (see `requested`); returns the backend 'cuda' now runs on, or None. Called at
    `import torch_fl`, and by the autoload entry point, so with autoload `import torch` alone is enough.
    A real CUDA device without force leaves the alias off with one line on stderr instead of an error:
    the variable may be set machine-wide."""
    want = requested()
    if want is None:
        return None
    try:
        return alias_cuda(force=want == "force")
    except CudaAliasError:
        notice(
            f"torch_fl: {ENV}={os.environ[ENV].strip()} ignored: this PyTorch sees a real CUDA device, "
            f"so 'cuda' stays CUDA ({ENV}=force aliases it anyway)"
        )
        return None
