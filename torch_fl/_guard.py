"""torch_fl's C++ device guard for the `fl` device.

Why: the Python device guard that `_setup_privateuseone_for_python_backend`
registers (torch >= 2.9, torch/csrc/acc/Module.cpp) answers getDevice() with
index 0 and deviceCount() with 1. PyTorch then resolves `.to("fl")` to fl:0
whatever the current device, and the autograd engine, which sizes its
per-device queues from deviceCount() at the first backward of the process,
fails with an internal assert for any fl:N with N >= 1. The replacement
(_csrc/device_guard.cpp, a few dozen lines over c10's DeviceGuardImplInterface)
is compiled once per torch build with the system C++ compiler, cached, and
loaded with ctypes; the current device it reports is the one torch_fl selects.
It also keeps PyTorch's stream bookkeeping, which the autograd engine and
torch.Stream / torch.Event rely on: a current stream per thread and device,
distinct new streams, events that record (with a time) and synchronize
through torch_fl (`set_sync_hook`).

Without a C++ compiler torch_fl keeps PyTorch's guard, says so once, and
still resolves a bare "fl" in Tensor.to/Module.to to the current device."""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sysconfig
import tempfile
import warnings

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(_HERE, "_csrc", "device_guard.cpp")

_lib: ctypes.CDLL | None = None
STATUS = "not installed"  # for doctor / list_backends


def cache_dir() -> str:
    return os.environ.get("FL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "torch_fl")


def _library_path() -> str:
    torch_dir = os.path.dirname(torch.__file__)
    with open(SOURCE, "rb") as f:
        key = hashlib.sha256(f.read() + torch.__version__.encode() + torch_dir.encode()
                             + str(torch._C._GLIBCXX_USE_CXX11_ABI).encode()).hexdigest()[:16]
    return os.path.join(cache_dir(), f"libfl_guard-{key}.so")


def _build(path: str) -> None:
    torch_dir = os.path.dirname(torch.__file__)
    include, lib = os.path.join(torch_dir, "include"), os.path.join(torch_dir, "lib")
    cxx = os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "c++"
    cxx = cxx.split()[0]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
    os.close(fd)
    cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", "-I", include, SOURCE,
           "-L", lib, "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib}", "-o", tmp]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise OSError(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
        os.replace(tmp, path)  # atomic: concurrent processes may build at once
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def install(device_count: int) -> bool:
    """Replace PyTorch's Python guard for PrivateUse1 with ours."""
    global _lib, STATUS
    if _lib is not None:
        _lib.fl_guard_set_count(max(device_count, 1))
        return True
    path = _library_path()
    try:
        if not os.path.exists(path):
            _build(path)
        lib = ctypes.CDLL(path)
    except (OSError, subprocess.SubprocessError) as e:
        STATUS = f"PyTorch's Python device guard (the C++ guard could not be built: {str(e).splitlines()[0]})"
        warnings.warn(
            "torch_fl could not build its device guard, so PyTorch's Python guard stays: autograd works on fl:0 "
            "only, backward on fl:1 and above fails, and pin_memory() is unavailable. Install a C++ compiler "
            "(g++) and start a new Python process. "
            f"Reason: {e}", RuntimeWarning, stacklevel=3)
        return False
    lib.fl_guard_install.argtypes = [ctypes.c_int]
    lib.fl_guard_set_count.argtypes = [ctypes.c_int]
    lib.fl_guard_set_default.argtypes = [ctypes.c_int]
    lib.fl_guard_install(max(device_count, 1))
    global HOOKS
    HOOKS = bool(lib.fl_hooks_install())
    _lib = lib
    STATUS = f"torch_fl C++ guard and hooks ({path})"
    return True


HOOKS = False  # torch_fl's C++ PrivateUse1 hooks (pinned memory) are registered

_SYNC_HOOK_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_int)
_sync_hook = None  # the ctypes callback object: kept alive as long as the guard may call it


def set_sync_hook(synchronize) -> None:
    """What the guard's synchronize calls run (torch.Stream.synchronize, torch.Event.synchronize,
    torch.accelerator.synchronize): `synchronize(index)` waits for fl:index's in-flight work (async
    copies, plugin streams). fl kernels themselves are done when their call returns."""
    global _sync_hook
    if _lib is None:
        return

    def hook(index: int) -> None:
        try:
            synchronize(index)
        except Exception as e:  # noqa: BLE001 - an exception cannot cross into C++; say it and go on
            warnings.warn(f"torch_fl: synchronize(fl:{index}) failed: {e}", RuntimeWarning, stacklevel=1)

    _sync_hook = _SYNC_HOOK_TYPE(hook)
    _lib.fl_guard_set_sync_hook.argtypes = [_SYNC_HOOK_TYPE]
    _lib.fl_guard_set_sync_hook(_sync_hook)


def set_current(index: int) -> None:
    """The device a bare "fl" means, and the one new threads start on."""
    if _lib is not None:
        _lib.fl_guard_set_default(int(index))


def installed() -> bool:
    return _lib is not None


def probe_autograd(index: int) -> str | None:
    """Runs a one-element backward on fl:index; says why it failed, if it did.

    The autograd engine sizes its device queues once, at the first backward
    of the process: if that happened before torch_fl was imported, backward
    on fl tensors cannot work in this process."""
    try:
        t = torch.ones(1, device=torch.device("fl", index), requires_grad=True)
        (t * 2).sum().backward()
    except RuntimeError as e:
        if "device_ready_queues_" in str(e):
            return ("PyTorch's autograd engine was started (a backward() ran) before torch_fl was imported, so it "
                    "has no queue for fl devices and backward() on fl tensors fails in this process. Import "
                    "torch_fl before the first backward() (e.g. at the top of the script or notebook).")
        return None
    return None


