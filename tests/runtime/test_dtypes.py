"""Every dtype PyTorch has on the CPU is right on fl, or refused with a clear error.

The ABI names 12 dtypes; the others (uint16/32/64, the float8 family, complex32) live on the device as bytes
no plugin kernel may read. Before this was enforced, a cast from them ran the native copy kernel with a source
dtype it did not know, which wrote nothing: the result was whatever a freed tensor had left. So each check
here first frees a block of the output's size filled with a pattern, and compares bit for bit with the CPU."""

import warnings

import pytest
import torch

import torch_fl as fl

BACKENDS = ["cpu", "rocm", "ascend", "minimal"]
DTYPES = [
    torch.bool,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
    torch.complex32,
    torch.complex64,
    torch.complex128,
]
VALUES = torch.tensor([0, 1, 2, 3, 5, 7, 100, 127, 0, 1, 2, 3, 4, 5, 6, 1] * 16, dtype=torch.float64)

pytestmark = [
    pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental"),
    pytest.mark.filterwarnings("ignore:Casting complex values to real"),
]


@pytest.fixture(params=BACKENDS)
def backend(request):
    fl.set_backend(request.param)
    yield request.param
    fl.set_backend("cpu")


def poison(like: torch.Tensor) -> None:
    """Free a device block of like's size (and a little more) full of 0xA5 bytes: the caching pool hands it to
    the next allocation of that size, so an output nobody writes shows the pattern instead of zeros."""
    p = torch.full((like.numel() * like.element_size() + 64,), 0xA5, dtype=torch.uint8, device="fl")
    del p


def bits(t: torch.Tensor) -> torch.Tensor:
    """t's values in a form torch.equal compares exactly (float8 and complex32 have no CPU equality)."""
    t = t.cpu()
    if t.dtype.is_floating_point and t.dtype.itemsize == 1:
        return t.view(torch.uint8)
    if t.dtype == torch.complex32:
        return t.view(torch.float16)
    return t


def same_bits(got: torch.Tensor, expected: torch.Tensor) -> bool:
    return got.dtype == expected.dtype and got.shape == expected.shape and torch.equal(bits(got), bits(expected))


def test_cast_matrix_is_exact(backend):
    """.to(dtype) and cross-dtype copy_ between every pair of dtypes, on the device, against the CPU."""
    wrong = []
    for s in DTYPES:
        src = VALUES.to(s)
        dsrc = src.to("fl")
        assert same_bits(dsrc, src), f"host-to-device copy of {s}"
        for d in DTYPES:
            expected = src.to(d)
            poison(expected)
            if not same_bits(dsrc.to(d), expected):
                wrong.append(f"{s} .to({d})")
            poison(expected)
            out = torch.empty_like(expected, device="fl")
            out.copy_(dsrc)
            if not same_bits(out, expected):
                wrong.append(f"{s} copy_ into {d}")
            strided = torch.empty(2 * VALUES.numel(), dtype=d, device="fl")[::2]
            strided.copy_(dsrc)
            if not same_bits(strided, expected):
                wrong.append(f"{s} copy_ into a strided {d}")
    assert not wrong, f"{len(wrong)} wrong casts on {backend}: {wrong[:10]}"


def _call(fn, *xs):
    try:
        return fn(*xs)
    except Exception as e:  # noqa: BLE001 - compared with what the CPU raises
        return e


UNARY = {
    "sum": lambda x: x.sum(),
    "amax": lambda x: x.amax(),
    "mean": lambda x: x.mean(),
    "cumsum": lambda x: x.cumsum(0),
    "mul 2": lambda x: x * 2,
    "add 1.5": lambda x: x + 1.5,
    "abs": torch.abs,
    "eq": lambda x: x == x,
    "cat": lambda x: torch.cat([x, x]),
    "flip": lambda x: x.flip(0),
    "clone": torch.clone,
    "index_select": lambda x: x.index_select(0, torch.tensor([3, 1], device=x.device)),
    "where": lambda x: torch.where(torch.arange(x.numel(), device=x.device) % 3 == 0, x, x[:1].expand_as(x)),
}
BINARY = {
    "add": torch.add,
    "mul": torch.mul,
    "maximum": torch.maximum,
    "lt": torch.lt,
    "cat": lambda a, b: torch.cat([a, b]),
}


def _compare(what, expected, got, wrong) -> None:
    if isinstance(expected, Exception):
        return  # PyTorch's CPU has no kernel for it (sum of complex32): fl may compute it (CUDA does)
    if isinstance(got, Exception):
        wrong.append(f"{what}: raised {type(got).__name__}: {str(got)[:120]}")
        return
    got = got.cpu()
    if got.dtype != expected.dtype or got.shape != expected.shape:
        wrong.append(f"{what}: {got.dtype} {tuple(got.shape)}, expected {expected.dtype} {tuple(expected.shape)}")
    elif expected.dtype.is_floating_point or expected.dtype.is_complex:
        wide = torch.complex128 if expected.is_complex() else torch.float64
        if not torch.allclose(
            bits(got).to(wide) if expected.dtype.itemsize > 1 else got.to(wide),
            bits(expected).to(wide) if expected.dtype.itemsize > 1 else expected.to(wide),
            rtol=1e-2,
            atol=1e-2,
            equal_nan=True,
        ):
            wrong.append(f"{what}: values")
    elif not torch.equal(got, expected):
        wrong.append(f"{what}: values")


def test_every_dtype_through_common_ops_and_promotion(backend):
    """Each dtype through reductions, pointwise ops, indexing and cat, and each pair through the binary ops
    (type promotion), on the device against the CPU: the same dtype, shape and values."""
    x64 = VALUES[:64]
    wrong: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s in DTYPES:
            x = x64.to(s)
            for name, fn in UNARY.items():
                expected = _call(fn, x)
                if isinstance(expected, torch.Tensor):
                    poison(expected)
                _compare(f"{name}({s})", expected, _call(fn, x.to("fl")), wrong)
            for t in DTYPES:
                y = x64.flip(0).to(t)
                for name, fn in BINARY.items():
                    expected = _call(fn, x, y)
                    if isinstance(expected, torch.Tensor):
                        poison(expected)
                    _compare(f"{name}({s}, {t})", expected, _call(fn, x.to("fl"), y.to("fl")), wrong)
    assert not wrong, f"{len(wrong)} differ on {backend}: {wrong[:10]}"


def test_no_kernel_reads_a_dtype_the_abi_lacks(minimal_no_fallback):
    """With the CPU fallback off, a cast from a dtype the ABI has no code for is refused, naming the dtype,
    instead of handing the copy kernel memory it cannot read."""
    x = torch.ones(8, dtype=torch.uint16).to("fl")
    with pytest.raises(NotImplementedError, match="uint16 has no fl dtype"):
        x.to(torch.float32)
    why = fl.explain("aten::copy_", dtype=(torch.float32, torch.uint16))
    assert why.path is None and any("uint16 has no fl dtype" in r for r in why.reasons), why.reasons
