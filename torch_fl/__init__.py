"""torch_fl: run unchanged PyTorch models on any vendor's chip.

A vendor implements one C plugin (plugins_cffi/include/fl_plugin.h); torch_fl
loads it through cffi, exposes its devices as `fl:N`, and maps every aten op
onto it: native kernel, else a decomposition, else a JIT kernel, else a CPU
fallback, recording which path each op took."""

from __future__ import annotations

from . import amp, dispatch, fused, runtime  # noqa: F401 - fused: its fl:: ops and their decompositions
from .amp import autocast, keep_float32
from .api import (
    BackendReport,
    Explanation,
    available_backends,
    capabilities,
    cpu_fallback_enabled,
    current_device,
    device,
    explain,
    explain_all,
    get_current_backend_name,
    initialize,
    list_backends,
    set_backend,
    set_cpu_fallback,
    using_backend,
)
from .compile import FusionReport, compile, fusion_report  # noqa: A004 - fl.compile, like torch.compile
from .errors import (
    BackendNotFoundError,
    CacheDirError,
    ConfigError,
    FlError,
    KernelError,
    PluginError,
    PluginLoadError,
    PluginUnavailableError,
    PrivateUse1TakenError,
)
from .placement import move, non_blocking_to
from .runtime import CapabilityTable, get_include
from .tools.alignment import AlignmentReport, align
from .tools.coverage import CoverageReport, PathTable, coverage, path_table
from .tools.profiler import Comparison, Profile, compare_backends, measure_compiled, profile
from .tools.stepwatch import StepRecord, Watch, watch

__version__ = "0.1.0"

from . import cuda_alias  # noqa: E402 - FL_ALIAS_CUDA is checked before anything is registered

cuda_alias.requested()  # a bad FL_ALIAS_CUDA value raises ConfigError here, like every FL_* variable
runtime.register()  # the fl device, its C++ core and the plugins; fl tensors through multiprocessing
dispatch.install()  # every op the core does not serve goes to the dispatcher (fused registered its fl:: ops)
amp.register()  # autocast kernels for the fl device
runtime.core.name_devices_in_errors()  # last: it takes the ops no fl kernel above took

try:  # registers the "fl" process-group backend with torch.distributed
    from . import distributed  # noqa: E402
except ImportError:  # a PyTorch build without torch.distributed
    distributed = None  # type: ignore[assignment]

from .cuda_alias import alias_cuda  # noqa: E402

if not cuda_alias.autoload_in_progress():  # the autoload entry point turns it on itself, with its own message
    cuda_alias.from_environment()  # FL_ALIAS_CUDA=1: code written for CUDA runs on the active fl backend

__all__ = [
    "StepRecord",
    "Watch",
    "watch",
    "AlignmentReport",
    "FusionReport",
    "compile",
    "fusion_report",
    "measure_compiled",
    "Comparison",
    "CoverageReport",
    "PathTable",
    "coverage",
    "path_table",
    "align",
    "alias_cuda",
    "amp",
    "autocast",
    "keep_float32",
    "move",
    "non_blocking_to",
    "Profile",
    "compare_backends",
    "profile",
    "BackendNotFoundError",
    "BackendReport",
    "CacheDirError",
    "ConfigError",
    "CapabilityTable",
    "Explanation",
    "FlError",
    "KernelError",
    "PluginError",
    "PluginLoadError",
    "PluginUnavailableError",
    "PrivateUse1TakenError",
    "available_backends",
    "capabilities",
    "cpu_fallback_enabled",
    "current_device",
    "device",
    "distributed",
    "explain",
    "explain_all",
    "get_current_backend_name",
    "get_include",
    "initialize",
    "list_backends",
    "set_backend",
    "set_cpu_fallback",
    "using_backend",
]
