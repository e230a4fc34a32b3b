"""torch dtypes <-> the ABI's fl_dtype_t codes (fl_plugin.h fixes the numbering)."""

from __future__ import annotations

import torch

TO_CODE: dict[torch.dtype, int] = {
    torch.float32: 0,
    torch.float64: 1,
    torch.float16: 2,
    torch.bfloat16: 3,
    torch.int64: 4,
    torch.int32: 5,
    torch.int16: 6,
    torch.int8: 7,
    torch.uint8: 8,
    torch.bool: 9,
    torch.complex64: 10,
    torch.complex128: 11,
}
FROM_CODE: dict[int, torch.dtype] = {v: k for k, v in TO_CODE.items()}
NAMES: dict[int, str] = {0: "float32", 1: "float64", 2: "float16", 3: "bfloat16", 4: "int64", 5: "int32",
                         6: "int16", 7: "int8", 8: "uint8", 9: "bool", 10: "complex64", 11: "complex128"}
COMPLEX_CODES = frozenset(c for d, c in TO_CODE.items() if d.is_complex)


def mask_to_dtypes(mask: int) -> list[torch.dtype]:
    return [FROM_CODE[c] for c in sorted(FROM_CODE) if mask & (1 << c)]


def mask_to_names(mask: int) -> list[str]:
    return [NAMES[c] for c in sorted(NAMES) if mask & (1 << c)]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")
