"""torch dtypes <-> the ABI's fl_dtype_t codes, read from fl_plugin.h's enum (the header fixes the numbering)."""

from __future__ import annotations

import torch

from .abi import enum_values

# fl_dtype_t names each dtype FL_<PyTorch's name, upper case>: FL_BFLOAT16 is torch.bfloat16
_CODES = {name.lower(): code for name, code in enum_values("fl_dtype_t", "FL_").items() if name != "DTYPE_COUNT"}
TO_CODE: dict[torch.dtype, int] = {
    getattr(torch, name): code for name, code in sorted(_CODES.items(), key=lambda item: item[1])
}
FROM_CODE: dict[int, torch.dtype] = {v: k for k, v in TO_CODE.items()}
NAMES: dict[int, str] = {code: name for name, code in _CODES.items()}
COMPLEX_CODES = frozenset(c for d, c in TO_CODE.items() if d.is_complex)


def mask_to_dtypes(mask: int) -> list[torch.dtype]:
    return [FROM_CODE[c] for c in sorted(FROM_CODE) if mask & (1 << c)]


def mask_to_names(mask: int) -> list[str]:
    return [NAMES[c] for c in sorted(NAMES) if mask & (1 << c)]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")
