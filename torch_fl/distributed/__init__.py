"""torch.distributed on fl tensors: the `fl` process-group backend.

`import torch_fl` registers backend "fl" for the devices "fl" and "cpu".
Then `dist.init_process_group("fl")` (or with no backend at all: "fl" is
c10d's default for the fl accelerator, as NCCL is for CUDA), DDP,
`dist.all_reduce(t)` on fl tensors and torchrun work unchanged. Collectives
use the plugin's comm_* entry points where the plugin has them, and a CPU
relay (host copies + gloo) everywhere else; `collectives_path()` says which,
`fl.profile()` records each collective with its bytes. docs/distributed.md
has the details and the multi-node recipe."""

from __future__ import annotations

import torch.distributed as _dist

if not _dist.is_available():  # a PyTorch build without torch.distributed: nothing to register
    raise ImportError("torch_fl.distributed needs a PyTorch build with torch.distributed (dist.is_available())")

from .pg import BACKEND_NAME, GLOO, PLUGIN, RELAY, RELAY_ENV, ProcessGroupFl, collectives_path, register  # noqa: E402
from .work import BackendMismatchError, CollectiveError, CollectiveTimeoutError, FlWork  # noqa: E402

register()

__all__ = [
    "BACKEND_NAME",
    "GLOO",
    "PLUGIN",
    "RELAY",
    "RELAY_ENV",
    "BackendMismatchError",
    "CollectiveError",
    "CollectiveTimeoutError",
    "FlWork",
    "ProcessGroupFl",
    "collectives_path",
    "register",
]
