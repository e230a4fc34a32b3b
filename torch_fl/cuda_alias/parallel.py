"""torch.distributed ('nccl' runs as the fl process group, DDP's device_ids mapped), DataParallel (raises:
it needs CUDA's comm kernels) and C++ extensions (CUDA sources raise, naming the feature)."""

from __future__ import annotations

import functools
import os
from typing import Any

from ..notice import notice
from .devices import backend_name, cuda_index, mapped
from .errors import UnsupportedCudaFeatureError
from .state import STATE, replace
from .unsupported import DEVICE_ID, DP, KERNELS, raiser, unsupported_message


def _map_pg_backend(backend: Any) -> Any:
    """'nccl' (or 'cuda:nccl' in a device:backend list) -> the fl process group, said once per process."""
    if not isinstance(backend, str) or "nccl" not in backend.lower():
        return backend
    parts = [p.strip() for p in backend.lower().split(",")]
    if len(parts) == 1 and ":" not in parts[0]:
        new = "fl"
    else:
        new = ",".join("fl:fl" if p in ("cuda:nccl", "fl:nccl") else p for p in parts)
    if not STATE["nccl_said"]:
        STATE["nccl_said"] = True
        notice(
            f"torch_fl: process group backend '{backend}' runs as the fl process group on backend "
            f"'{backend_name()}' (cuda alias)"
        )
    return new


def patch_distributed() -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return
    from torch.distributed import distributed_c10d as c10d
    from torch.nn.parallel import DistributedDataParallel

    init = c10d.init_process_group

    def no_device_id(call: str, kwargs: dict) -> None:
        if kwargs.get("device_id") is not None:
            raise UnsupportedCudaFeatureError(unsupported_message(f"{call}(..., device_id=...)", *DEVICE_ID))

    @functools.wraps(init)
    def init_process_group(backend=None, *args, **kwargs):
        no_device_id("torch.distributed.init_process_group", kwargs)
        return init(_map_pg_backend(backend), *args, **kwargs)

    new_group_orig = c10d.new_group

    @functools.wraps(new_group_orig)
    def new_group(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = _map_pg_backend(kwargs["backend"])
        elif len(args) > 2:
            args = (*args[:2], _map_pg_backend(args[2]), *args[3:])
        no_device_id("torch.distributed.new_group", kwargs)
        return new_group_orig(*args, **kwargs)

    barrier_orig = c10d.barrier

    @functools.wraps(barrier_orig)
    def barrier(*args, **kwargs):
        ids = kwargs.get("device_ids")
        if ids is not None:
            kwargs["device_ids"] = [mapped(i).index if cuda_index(i, True)[0] else i for i in ids]
        return barrier_orig(*args, **kwargs)

    for module in (c10d, dist):
        replace(module, "init_process_group", init_process_group)
        replace(module, "new_group", new_group)
        replace(module, "barrier", barrier)
        replace(module, "is_nccl_available", lambda: True)

    ddp_init = DistributedDataParallel.__init__

    @functools.wraps(ddp_init)
    def ddp(self, module, device_ids=None, output_device=None, *args, **kwargs):
        if device_ids is not None:
            device_ids = [mapped(d) for d in device_ids]
        if output_device is not None:
            output_device = mapped(output_device)
        ddp_init(self, module, device_ids, output_device, *args, **kwargs)

    replace(DistributedDataParallel, "__init__", ddp)


def patch_data_parallel() -> None:
    from torch.nn.parallel import DataParallel

    init = DataParallel.__init__

    @functools.wraps(init)
    def data_parallel(self, *args, **kwargs):
        raise UnsupportedCudaFeatureError(unsupported_message("torch.nn.DataParallel", *DP))

    replace(DataParallel, "__init__", data_parallel)


def _is_cuda_source(path: Any) -> bool:
    return isinstance(path, str) and os.path.splitext(path)[1] in (".cu", ".cuh")


def patch_extensions(cpp_extension: Any) -> None:
    """CUDAExtension and CUDA sources in load()/load_inline() raise, naming the feature."""
    what = "a custom CUDA kernel ({})"
    replace(cpp_extension, "CUDAExtension", raiser("torch.utils.cpp_extension.CUDAExtension", *KERNELS))
    load, load_inline = cpp_extension.load, cpp_extension.load_inline

    @functools.wraps(load)
    def checked_load(name, sources, *args, **kwargs):
        srcs = [sources] if isinstance(sources, str) else list(sources)
        if kwargs.get("with_cuda") or any(_is_cuda_source(s) for s in srcs):
            raise UnsupportedCudaFeatureError(
                unsupported_message(
                    what.format("torch.utils.cpp_extension.load with .cu sources or with_cuda=True"), *KERNELS
                )
            )
        return load(name, sources, *args, **kwargs)

    @functools.wraps(load_inline)
    def checked_inline(name, cpp_sources, cuda_sources=None, *args, **kwargs):
        if cuda_sources or kwargs.get("with_cuda"):
            raise UnsupportedCudaFeatureError(
                unsupported_message(
                    what.format("torch.utils.cpp_extension.load_inline with cuda_sources or with_cuda=True"), *KERNELS
                )
            )
        return load_inline(name, cpp_sources, cuda_sources, *args, **kwargs)

    replace(cpp_extension, "load", checked_load)
    replace(cpp_extension, "load_inline", checked_inline)
