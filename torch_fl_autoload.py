"""`import torch` alone makes the fl device available: PyTorch calls every
`torch.backends` entry point at the end of its import (set
TORCH_DEVICE_BACKEND_AUTOLOAD=0 to stop it). This module is what the entry
point names. It is a top-level module, outside the torch_fl package (importing
torch_fl.anything would import torch_fl first), so a torch_fl that cannot load
(no C++ compiler, a broken plugin) costs `import torch` a warning naming the
problem, never the import.

With FL_ALIAS_CUDA=1 it then turns on the cuda alias (torch_fl/cuda_alias/),
so a script written for CUDA runs on the active fl backend without
`import torch_fl`; a failure there is its own warning, the fl device stays."""

from __future__ import annotations

import warnings

loading = False  # True while load() imports torch_fl (torch_fl.cuda_alias.autoload_in_progress reads it)


def load() -> None:
    global loading
    loading = True
    try:
        import torch_fl  # (registers the device, its core and the dispatcher)
    except Exception as e:  # noqa: BLE001 - torch itself must stay importable
        warnings.warn(
            f"torch_fl could not register the fl device at `import torch`: {type(e).__name__}: {e} "
            f"(import torch_fl to see the full error; TORCH_DEVICE_BACKEND_AUTOLOAD=0 stops the attempt)",
            RuntimeWarning,
            stacklevel=2,
        )
        return
    finally:
        loading = False
    if not hasattr(torch_fl, "alias_cuda"):
        # `import torch` ran from inside torch_fl's own import (`import torch_fl` before torch, or
        # `python -m torch_fl.cli`): torch_fl is half-initialised here and honours FL_ALIAS_CUDA at its end
        return
    try:
        torch_fl.cuda_alias.from_environment()
    except Exception as e:  # noqa: BLE001 - torch itself must stay importable
        warnings.warn(
            f"torch_fl's cuda alias (FL_ALIAS_CUDA) could not turn on at `import torch`: {type(e).__name__}: {e}",
            RuntimeWarning,
            stacklevel=2,
        )
