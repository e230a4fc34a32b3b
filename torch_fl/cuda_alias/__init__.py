"""The opt-in `cuda` alias: code written for NVIDIA runs on the active fl backend unchanged.

Most "unchanged PyTorch code" is CUDA code: `device = "cuda" if
torch.cuda.is_available() else "cpu"`, `.cuda()`, `torch.autocast("cuda")`,
`torch.amp.GradScaler("cuda")`, `torch.cuda.synchronize()`,
`dist.init_process_group("nccl")`. The string "cuda" is parsed in C++ to
DeviceType::CUDA, which a CPU-only PyTorch cannot allocate on, and no backend
registration can claim it. So the alias works where CUDA enters from Python:

* a TorchFunctionMode, entered once and kept, rewrites CUDA device arguments
  (`device="cuda:1"`, `torch.device("cuda")`, a bare index, `.to("cuda")`,
  `.cuda()`, `torch.set_default_device("cuda")`) to the fl device they mean:
  `cuda:N` is the active backend's N-th device, `cuda` its current device;
* the `torch.cuda` functions are replaced by fl-backed ones (device count,
  memory, seeds, streams, events); the ones with no fl meaning (CUDA graphs,
  NCCL, NVTX, jiterator, compute capability ...) raise UnsupportedCudaFeatureError
  naming the feature and what to do instead;
* `torch.autocast("cuda")`, `torch.amp.GradScaler("cuda")`, `torch.load` of
  CUDA checkpoints, storages' `.cuda()`, `dist.init_process_group("nccl")`
  and DDP's `device_ids` are mapped to the fl device type.

Tensors keep reporting their real device (`fl:N`): code that tests
`x.is_cuda` or `x.device.type == "cuda"` sees False. The alias is off by
default, turns on with `FL_ALIAS_CUDA=1` (at `import torch` through the
autoload entry point, or at `import torch_fl`) or `torch_fl.alias_cuda()`,
never over a real CUDA device unless forced (`FL_ALIAS_CUDA=force`,
`alias_cuda(force=True)`), says so in one line on stderr, and lasts for the
process. docs/user-guide.md ("Code written for CUDA") lists what it covers.

The package, one module per part: switch.py turns the alias on (alias_cuda, FL_ALIAS_CUDA); devices.py says
which fl device a CUDA device means; mode.py is the TorchFunctionMode that rewrites device arguments (and the
legacy torch.cuda.FloatTensor types); torch_cuda.py is torch.cuda backed by fl; unsupported.py the errors for
what the alias does not cover; autocast_storage.py and parallel.py patch autocast, GradScaler, checkpoints,
storages, torch.distributed, DataParallel and C++ extensions; install.py puts every replacement in place, and
state.py records what it replaced so that a failure half-way undoes all of it."""

from __future__ import annotations

from .errors import CudaAliasError, UnsupportedCudaFeatureError
from .switch import ENV, alias_cuda, autoload_in_progress, from_environment, is_active, requested

__all__ = [
    "ENV",
    "CudaAliasError",
    "UnsupportedCudaFeatureError",
    "alias_cuda",
    "autoload_in_progress",
    "from_environment",
    "is_active",
    "requested",
]
