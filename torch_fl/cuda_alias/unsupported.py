"""Errors for what the alias does not cover: each names the CUDA feature, why fl has no counterpart, and
what to use instead (UNSUPPORTED: torch.cuda names; UNSUPPORTED_MODULES: every public function of a module)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .devices import backend_name
from .errors import UnsupportedCudaFeatureError
from .state import STATE


def unsupported_message(feature: str, why: str, instead: str) -> str:
    backend = backend_name() if STATE["active"] else "?"
    return (
        f"{feature} is not covered by torch_fl's cuda alias ('cuda' runs on fl backend '{backend}'): {why}. {instead}"
    )


def raiser(feature: str, why: str, instead: str) -> Callable[..., Any]:
    def unsupported(*args, **kwargs):
        raise UnsupportedCudaFeatureError(unsupported_message(feature, why, instead))

    unsupported.__name__ = feature.rsplit(".", 1)[-1]
    unsupported.__doc__ = f"Not covered by torch_fl's cuda alias: {why}."
    return unsupported


def raising_class(feature: str, why: str, instead: str) -> type:
    """A stand-in for a CUDA class: isinstance() still works (always False), constructing it raises."""

    def __new__(cls, *args, **kwargs):
        raise UnsupportedCudaFeatureError(unsupported_message(feature, why, instead))

    return type(
        feature.rsplit(".", 1)[-1],
        (),
        {
            "__new__": __new__,
            "__module__": "torch_fl.cuda_alias",
            "__doc__": f"Not covered by torch_fl's cuda alias: {why}.",
        },
    )


GRAPHS = (
    "CUDA graphs record and replay CUDA kernel launches, and fl devices have no graph capture",
    "Run the captured code eagerly (drop the graph capture), or use fl.compile for fused kernels",
)
NCCL = (
    "torch.cuda.nccl calls NVIDIA's collective library directly",
    "Use torch.distributed: init_process_group('nccl') is mapped to the fl process group",
)
NVTX = (
    "NVTX markers are read by NVIDIA's profilers only",
    "Use torch.profiler.record_function, or fl.profile() for per-op paths",
)
JIT = (
    "the jiterator compiles CUDA C++ source",
    "Write the function with PyTorch ops: fl's JIT tier compiles pointwise ops for the device",
)
KERNELS = (
    "custom CUDA kernels are compiled with nvcc for NVIDIA GPUs",
    "A device kernel for an fl backend goes into its plugin (docs/writing-a-plugin.md); "
    "CppExtension / load_inline(cpp_sources=...) still build CPU code",
)
COMM = (
    "torch.cuda.comm copies between GPUs with CUDA kernels",
    "Move tensors with .to('cuda:N'), or use DistributedDataParallel with torchrun",
)
DP = (
    "torch.nn.DataParallel scatters and gathers through CUDA's comm kernels",
    "Run the model on one device ('cuda'), or use DistributedDataParallel with torchrun (init_process_group('nccl') "
    "is mapped to the fl process group)",
)
DEVICE_ID = (
    "the fl process group does not bind to a device yet (it runs collectives on the tensors' own devices)",
    "Drop device_id and call torch.cuda.set_device(local_rank) before init_process_group",
)
CAPABILITY = (
    "an fl device has no CUDA compute capability",
    "Ask what it computes in instead: torch.cuda.is_bf16_supported(), or fl.capabilities().devices[0].dtypes",
)
NVML = ("it reads NVIDIA's management library (NVML)", "Use torch.cuda.mem_get_info() / memory_allocated() for memory")
ALLOCATOR = (
    "it configures CUDA's caching allocator",
    "fl has its own pool: FL_MEMORY_POOL_LIMIT, torch.fl.set_memory_pool_limit(), torch.cuda.empty_cache()",
)
RUNTIME = ("it needs the CUDA runtime itself", "Leave it out when running on an fl backend")
PROFILER = ("torch.cuda.profiler drives NVIDIA's profiler", "Use torch.profiler or fl.profile()")
EXTERNAL = ("it wraps a raw cudaStream_t", "Use torch.cuda.Stream() (an fl stream)")

UNSUPPORTED: dict[str, tuple[str, str]] = {  # torch.cuda name -> (why, what instead)
    "CUDAGraph": GRAPHS,
    "graph": GRAPHS,
    "make_graphed_callables": GRAPHS,
    "graph_pool_handle": GRAPHS,
    "get_device_capability": CAPABILITY,
    "ExternalStream": EXTERNAL,
    "get_stream_from_external": EXTERNAL,
    "utilization": NVML,
    "temperature": NVML,
    "power_draw": NVML,
    "clock_rate": NVML,
    "memory_usage": NVML,
    "device_memory_used": NVML,
    "list_gpu_processes": NVML,
    "set_per_process_memory_fraction": ALLOCATOR,
    "get_per_process_memory_fraction": ALLOCATOR,
    "caching_allocator_alloc": ALLOCATOR,
    "caching_allocator_delete": ALLOCATOR,
    "caching_allocator_enable": ALLOCATOR,
    "change_current_allocator": ALLOCATOR,
    "CUDAPluggableAllocator": ALLOCATOR,
    "MemPool": ALLOCATOR,
    "use_mem_pool": ALLOCATOR,
    "memory_snapshot": ALLOCATOR,
    "cudart": RUNTIME,
    "current_blas_handle": RUNTIME,
    "current_solver_handle": RUNTIME,
    "can_device_access_peer": RUNTIME,
    "check_error": RUNTIME,
    "get_sync_debug_mode": RUNTIME,
    "set_sync_debug_mode": RUNTIME,
    "GreenContext": RUNTIME,
}
UNSUPPORTED_MODULES: dict[str, tuple[str, str]] = {  # every public function of these modules raises
    "torch.cuda.nccl": NCCL,
    "torch.cuda.nvtx": NVTX,
    "torch.cuda.jiterator": JIT,
    "torch.cuda.comm": COMM,
    "torch.nn.parallel.comm": COMM,
    "torch.cuda.profiler": PROFILER,
    "torch.cuda.graphs": GRAPHS,
}
