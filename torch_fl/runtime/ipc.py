"""fl tensors between processes: multiprocessing queues, DataLoader workers.

PyTorch sends a CPU tensor to another process through shared memory and a
CUDA tensor through a CUDA IPC handle. Plugin memory has no such handle (an
emulated device's memory, and the host plugin's, belong to one process), so
an fl tensor travels as its values: torch_fl's reducer copies it to the host,
PyTorch shares that copy, and the receiving process (which imports torch_fl
when it unpickles) puts it back on the same fl device. The receiver gets a
copy, not a view of the sender's memory. Every other tensor is reduced by
PyTorch's own reducer, unchanged.

The values travel as bytes in the pickle (through the pipe), not as a shared
host copy: a temporary host copy could be freed before the receiver maps it."""

from __future__ import annotations

import torch

_installed = False


def _to_bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _from_bytes(data: bytes, dtype: torch.dtype, shape) -> torch.Tensor:
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


def _rebuild_tensor(
    data: bytes, dtype: torch.dtype, shape, device: str, requires_grad: bool, is_param: bool
) -> torch.Tensor:
    t = _from_bytes(data, dtype, shape).to(device)
    if is_param:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    return t.requires_grad_(requires_grad) if requires_grad else t


def _rebuild_storage(data: bytes, device: str) -> torch.UntypedStorage:
    cpu = _from_bytes(data, torch.uint8, (len(data),))
    return cpu.to(device).untyped_storage()


def install() -> None:
    """Register the fl-aware reducers with multiprocessing's pickler (after PyTorch's own)."""
    global _installed
    if _installed:
        return
    from multiprocessing.reduction import ForkingPickler

    from torch.multiprocessing import reductions

    tensor_reducer, storage_reducer = reductions.reduce_tensor, reductions.reduce_storage

    def reduce_tensor(t: torch.Tensor):
        if t.device.type == "fl":
            return (
                _rebuild_tensor,
                (
                    _to_bytes(t),
                    t.dtype,
                    tuple(t.shape),
                    str(t.device),
                    t.requires_grad,
                    isinstance(t, torch.nn.Parameter),
                ),
            )
        return tensor_reducer(t)

    def reduce_storage(s):
        if s.device.type == "fl":
            return (
                _rebuild_storage,
                (_to_bytes(torch.empty(0, dtype=torch.uint8, device=s.device).set_(s)), str(s.device)),
            )
        return storage_reducer(s)

    ForkingPickler.register(torch.Tensor, reduce_tensor)
    ForkingPickler.register(torch.nn.parameter.Parameter, reduce_tensor)
    ForkingPickler.register(torch.UntypedStorage, reduce_storage)
    _installed = True
