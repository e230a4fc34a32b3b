"""Integer ops compute in integers, exactly, on every backend and tier (values near +-2**62, INT64_MIN,
-1, 0, empty tensors), and raise what CPU PyTorch raises; float special values (NaN, inf, -0.0) in
sign/min/max/clamp/where follow CPU. Each result is compared bit for bit with CPU PyTorch's.

Before: integer kernels of the JIT tier computed through double (exact only below 2**53) and so did
every decomposition built on them; `minimal` (33 kernels) took that path for %, ==, gather, sort,
unique, max, prod, cumsum (and `ascend` for cumsum)."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torch_fl as fl
from torch_fl.runtime import disabled_paths

pytestmark = pytest.mark.slow  # every op x dtype x backend x tier matrix (931 cases, minutes): the full run keeps it

BACKENDS = ["cpu", "rocm", "ascend", "minimal"]
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
BIG = 2**60 + 12345
EDGES = [
    0,
    1,
    -1,
    2,
    -2,
    3,
    -3,
    INT64_MIN,
    INT64_MIN + 1,
    INT64_MAX,
    INT64_MAX - 1,
    2**62,
    -(2**62),
    2**62 + 1,
    -(2**62) - 1,
    2**53 + 1,
    -(2**53) - 1,
    2**31,
    -(2**31),
    2**32 - 1,
    BIG,
]


# the host backend again with its native kernels switched off, then its decompositions too: every op
# through the decomposition and JIT tiers, which minimal only reaches for the ops it lacks
TIERS = {"cpu-decomposition": ("native",), "cpu-jit": ("native", "decomposition")}


@pytest.fixture(params=BACKENDS + sorted(TIERS))
def backend(request):
    name = request.param
    fl.set_backend(name.split("-")[0])
    with disabled_paths(*TIERS.get(name, ())):
        yield name


def outcome(fn, *args):
    """('ok', result) or ('raise', exception)."""
    try:
        return ("ok", fn(*args))
    except Exception as e:  # noqa: BLE001 - compared with what CPU raises
        return ("raise", e)


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    b = b.cpu()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():  # bit for bit, every NaN alike
        nan_a, nan_b = a.isnan(), b.isnan()
        if not torch.equal(nan_a, nan_b):
            return False
        ints = {torch.float64: torch.int64, torch.float32: torch.int32, torch.bfloat16: torch.int16}[a.dtype]
        return torch.equal(a[~nan_a].view(ints), b[~nan_b].view(ints))
    return torch.equal(a, b)


def same(expected, got) -> bool:
    if isinstance(expected, torch.Tensor):
        return isinstance(got, torch.Tensor) and _same_tensor(expected, got)
    if isinstance(expected, (tuple, list)):
        return len(expected) == len(got) and all(same(a, b) for a, b in zip(expected, got, strict=True))
    return expected == got


def check_like_cpu(fn, *cpu_args) -> None:
    """fn on the fl device gives CPU's result bit for bit, or raises what CPU raises (an instance of
    CPU's exception type whose message ends with CPU's message: a plugin kernel's error names the
    backend and op first)."""
    want = outcome(fn, *cpu_args)
    got = outcome(fn, *[a.to("fl") if isinstance(a, torch.Tensor) else a for a in cpu_args])
    if want[0] == "raise":
        assert got[0] == "raise", f"CPU raises {want[1]!r}, fl gives {got[1]}"
        assert isinstance(got[1], type(want[1])) and str(got[1]).endswith(str(want[1])), (want[1], got[1])
    else:
        assert got[0] == "ok", f"fl raises {got[1]!r}, CPU gives {want[1]}"
        assert same(want[1], got[1]), f"CPU {want[1]} != fl {got[1]}"


# -- the issue's cases -----------------------------------------------------------------------------

VALUES = [BIG, -BIG, 5, 2**62 + 1, -(2**62) - 3, INT64_MIN, INT64_MAX, -1, 0]


@pytest.mark.parametrize(
    "name",
    [
        "remainder",
        "eq",
        "gather",
        "index_select",
        "sort",
        "unique",
        "max",
        "prod",
        "cumsum",
        "floor_divide",
        "and_scalar",
    ],
)
def test_issue_cases_exact(backend, name):
    idx = torch.tensor([0, 3, 5, 6])
    ops = {
        "remainder": lambda a: a % 1000,
        "eq": lambda a: a == BIG + 1,
        "gather": lambda a: a.gather(0, idx.to(a.device)),
        "index_select": lambda a: a.index_select(0, idx.to(a.device)),
        "sort": lambda a: a.sort(),
        "unique": lambda a: torch.unique(a, return_counts=True),
        "max": lambda a: a.max(),
        "prod": lambda a: a[:2].prod(),
        "cumsum": lambda a: a.cumsum(0),
        "floor_divide": lambda a: a // 7,
        "and_scalar": lambda a: a & 5,
    }
    check_like_cpu(ops[name], torch.tensor(VALUES))


def test_remainder_of_big_value(backend):
    assert (torch.tensor([2**60 + 12345], device="fl") % 1000).item() == 321


@pytest.mark.parametrize("name", ["floor_divide", "remainder", "fmod", "div_trunc", "div_floor"])
def test_integer_division_by_zero_raises(backend, name):
    ops = {
        "floor_divide": lambda a, b: a // b,
        "remainder": lambda a, b: a % b,
        "fmod": torch.fmod,
        "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    }
    a, b = torch.tensor([7, -7, BIG]), torch.tensor([2, 0, 3])
    check_like_cpu(ops[name], a, b)
    check_like_cpu(lambda x: ops[name](x, 0), a)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        ops[name](a.to("fl"), 0)


@pytest.mark.parametrize(
    "name", ["max", "min", "amax", "amin", "argmax", "argmin", "max_dim", "min_dim", "amax_dim", "argmin_dim"]
)
def test_empty_reduction_errors(backend, name):
    ops = {
        "max": lambda t: t.max(),
        "min": lambda t: t.min(),
        "amax": lambda t: t.amax(),
        "amin": lambda t: t.amin(),
        "argmax": lambda t: t.argmax(),
        "argmin": lambda t: t.argmin(),
        "max_dim": lambda t: t.max(-2),
        "min_dim": lambda t: t.min(0),
        "amax_dim": lambda t: t.amax(-2),
        "argmin_dim": lambda t: t.argmin(0),
    }
    for dtype in (torch.float32, torch.int64):
        x = torch.empty(0, 3, dtype=dtype)
        want = outcome(ops[name], x)
        assert want[0] == "raise"
        got = outcome(ops[name], x.to("fl"))
        assert got[0] == "raise" and type(got[1]) is type(want[1]) and str(got[1]) == str(want[1]), (want, got)
        check_like_cpu(ops[name], torch.arange(6, dtype=dtype).reshape(2, 3))
        if name.endswith("dim"):  # reducing a non-empty dim of an empty tensor is fine
            check_like_cpu(ops[name], torch.empty(3, 0, dtype=dtype))


def test_min_of_empty_names_min_on_every_path():
    for name in BACKENDS:
        fl.set_backend(name)
        with pytest.raises(RuntimeError, match=r"^min\(\): Expected reduction dim to be specified"):
            torch.tensor([], device="fl").min()


def test_sign_of_special_values(backend):
    x = torch.tensor([float("nan"), -0.0, 0.0, float("inf"), -float("inf"), -2.5, 3.0] * 5)
    check_like_cpu(torch.sign, x)
    check_like_cpu(torch.sgn, x)


# -- property tests: random integers near the edges, every backend, bit-exact with CPU -------------

_any_int = st.one_of(
    st.sampled_from(EDGES),
    st.integers(INT64_MIN, INT64_MAX),
    st.integers(2**62 - 64, 2**62 + 64),
    st.integers(-(2**62) - 64, -(2**62) + 64),
    st.integers(-4, 4),
)
_PROPERTY = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@st.composite
def int_pairs(draw, max_size=6):
    n = draw(st.integers(0, max_size))
    a = draw(st.lists(_any_int, min_size=n, max_size=n))
    b = draw(st.lists(_any_int, min_size=n, max_size=n))
    return torch.tensor(a, dtype=torch.int64), torch.tensor(b, dtype=torch.int64)


BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=3),
    "floor_divide": torch.floor_divide,
    "remainder": torch.remainder,
    "fmod": torch.fmod,
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "true_divide": torch.true_divide,
    "eq": torch.eq,
    "ne": torch.ne,
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "where": lambda a, b: torch.where(a > b, a, b),
    "clamp": lambda a, b: torch.clamp(a, torch.minimum(a, b), b),
    "and": torch.bitwise_and,
    "or": torch.bitwise_or,
    "xor": torch.bitwise_xor,
    "lshift": lambda a, b: a << (b % 70 - 3),
    "rshift": lambda a, b: a >> (b % 70 - 3),
    "pow": lambda a, b: torch.pow(a, b % 5),
    "gcd": torch.gcd,
    "lcm": torch.lcm,
    "add_": lambda a, b: a.clone().add_(b),
    "mul_": lambda a, b: a.clone().mul_(b),
}
UNARY = {
    "neg": torch.neg,
    "abs": torch.abs,
    "sign": torch.sign,
    "not": torch.bitwise_not,
    "square": torch.square,
    "mod_scalar": lambda a: a % 1000,
    "rem_neg_scalar": lambda a: a % -7,
    "floordiv_scalar": lambda a: a // -3,
    "and_scalar": lambda a: a & 5,
    "mul_scalar": lambda a: a * 3,
    "eq_scalar": lambda a: a == BIG,
    "lt_scalar": lambda a: a < 2**62,
    "clamp_scalar": lambda a: a.clamp(-(2**62), 2**62),
    "to_bool": lambda a: a.bool(),
    "to_int32": lambda a: a.int(),
    "to_float": lambda a: a.float(),
    "sum": torch.sum,
    "prod": torch.prod,
    "max": lambda a: a.max(),
    "min": lambda a: a.min(),
    "amax": lambda a: a.amax(0),
    "argmax": lambda a: a.argmax(),
    "argmin": lambda a: a.argmin(),
    "max_dim": lambda a: a.max(0),
    "cumsum": lambda a: a.cumsum(0),
    "cumprod": lambda a: a.cumprod(0),
    "cummax": lambda a: a.cummax(0),
    "cummin": lambda a: a.cummin(0),
    "sort": lambda a: a.sort(stable=True),
    "sort_desc": lambda a: a.sort(descending=True, stable=True),
    "argsort": lambda a: a.argsort(stable=True),
    "topk": lambda a: _values_at(a, a.topk(min(2, a.numel()))),
    "unique": lambda a: torch.unique(a, return_counts=True),
    "unique_inverse": lambda a: torch.unique(a, return_inverse=True),
    "kthvalue": lambda a: _values_at(a, a.kthvalue(1)) if a.numel() else a,
    "msort": torch.msort,
    "bool_sum": lambda a: (a > 0).sum(),
    "int32_sum": lambda a: a.int().sum(),
}
INDEXING = {
    "gather": lambda a, i: a.gather(0, i),
    "index_select": lambda a, i: a.index_select(0, i),
    "take": lambda a, i: a.take(i),
    "getitem": lambda a, i: a[i],
    "scatter": lambda a, i: torch.zeros_like(a).scatter(0, i, a.flip(0)),
    "scatter_add": lambda a, i: a.clone().scatter_add(0, i, a),
    "scatter_amax": lambda a, i: a.clone().scatter_reduce(0, i, a.flip(0), "amax"),
    "scatter_amin": lambda a, i: a.clone().scatter_reduce(0, i, a.flip(0), "amin", include_self=False),
    "scatter_prod": lambda a, i: a.clone().scatter_reduce(0, i, a.flip(0), "prod"),
    "scatter_mean": lambda a, i: a.clone().scatter_reduce(0, i, a.flip(0), "mean"),
    "index_add": lambda a, i: a.clone().index_add(0, i, a.flip(0)),
    "index_put_acc": lambda a, i: a.clone().index_put_((i,), a.flip(0), accumulate=True),
    "masked_select": lambda a, i: a.masked_select(i > 0),
    "setitem": lambda a, i: _setitem(a.clone(), i),
}


def _values_at(a, result):
    """(values, a at the indices): which of several equal elements topk/kthvalue name is not
    defined (CPU's own kernels differ), but each index must point at its value."""
    return result.values, a[result.indices]


def _setitem(a, i):
    a[i] = a.flip(0)
    return a


def _index(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, max(n, 1), (n,), generator=g) if n else torch.zeros(0, dtype=torch.int64)


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_integer_ops_exact(backend, name):
    @_PROPERTY
    @given(int_pairs())
    def prop(pair):
        check_like_cpu(BINARY[name], *pair)

    prop()


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_integer_ops_exact(backend, name):
    @_PROPERTY
    @given(int_pairs())
    def prop(pair):
        check_like_cpu(UNARY[name], pair[0])

    prop()


@pytest.mark.parametrize("name", sorted(INDEXING))
def test_indexing_integer_ops_exact(backend, name):
    @_PROPERTY
    @given(int_pairs(), st.integers(0, 1000))
    def prop(pair, seed):
        a = pair[0]
        check_like_cpu(INDEXING[name], a, _index(a.numel(), seed))

    prop()


def test_two_dim_reductions_exact(backend):
    @_PROPERTY
    @given(st.lists(_any_int, min_size=6, max_size=6))
    def prop(values):
        a = torch.tensor(values).reshape(2, 3)
        for fn in (
            lambda t: t.sum(1),
            lambda t: t.prod(0),
            lambda t: t.amax(1),
            lambda t: t.amin(0),
            lambda t: t.max(1),
            lambda t: t.argmin(0),
            lambda t: t.cumsum(1),
            lambda t: t.t().cumsum(0),
            lambda t: t.sort(0, stable=True),
            lambda t: t.t().gather(1, t.new_zeros(3, 1)),
        ):
            check_like_cpu(fn, a)

    prop()


# -- float special values where PyTorch defines the result ----------------------------------------

SPECIALS = [float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1.0, -1.0, 3.5, -2.25, 1e-30]


@st.composite
def float_pairs(draw):
    n = draw(st.integers(0, 20))
    vals = st.sampled_from(SPECIALS)
    a = torch.tensor(draw(st.lists(vals, min_size=n, max_size=n)), dtype=torch.float32)
    b = torch.tensor(draw(st.lists(vals, min_size=n, max_size=n)), dtype=torch.float32)
    return a, b


def _zero_sign_free(fn):
    """max/min of +0.0 and -0.0 may give either zero on CPU (its vector and scalar loops differ):
    compare those results as values, everything else (NaN, inf) exactly."""

    def wrapped(*args):
        out = fn(*args)
        return tuple(o + 0.0 if o.is_floating_point() else o for o in out) if isinstance(out, tuple) else out + 0.0

    return wrapped


FLOAT_OPS = {
    "sign": lambda a, b: torch.sign(a),
    "sgn": lambda a, b: torch.sgn(a),
    "maximum": _zero_sign_free(torch.maximum),
    "minimum": _zero_sign_free(torch.minimum),
    "fmax": _zero_sign_free(torch.fmax),
    "fmin": _zero_sign_free(torch.fmin),
    "clamp": lambda a, b: torch.clamp(a, min=-1.0, max=2.0),
    "clamp_zero": lambda a, b: torch.clamp(a, min=0.0),
    "clamp_nan_bound": lambda a, b: torch.clamp(a, min=float("nan")),
    "clamp_tensor": _zero_sign_free(lambda a, b: torch.clamp(a, min=b)),
    "clamp_tensors": _zero_sign_free(lambda a, b: torch.clamp(a, min=b, max=b + 1)),
    "hardtanh": lambda a, b: torch.nn.functional.hardtanh(a, 0.0, 1.0),
    "elu": lambda a, b: torch.nn.functional.elu(a),
    "leaky_relu": lambda a, b: torch.nn.functional.leaky_relu(a),
    "floor_divide": lambda a, b: torch.floor_divide(a, b),
    "remainder": lambda a, b: torch.remainder(a, b),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "signbit": lambda a, b: torch.signbit(a),
    "where": lambda a, b: torch.where(a > b, a, b),
    "where_nan": lambda a, b: torch.where(a != a, b, a),
    "max": _zero_sign_free(lambda a, b: a.max() if a.numel() else a),
    "min": _zero_sign_free(lambda a, b: a.amin(0) if a.numel() else a),
    "argmax": lambda a, b: a.argmax() if a.numel() else a,
    "argmin": lambda a, b: a.argmin() if a.numel() else a,
    "max_dim": _zero_sign_free(lambda a, b: a.max(0) if a.numel() else a),
    "sort": lambda a, b: a.sort(stable=True),
    "cummax": _zero_sign_free(lambda a, b: a.cummax(0)),
    "eq": lambda a, b: a == b,
    "lt": lambda a, b: a < b,
    "isnan": lambda a, b: torch.isnan(a),
    "relu": lambda a, b: torch.relu(a),
    "nan_to_num": lambda a, b: torch.nan_to_num(a),
}


@pytest.mark.parametrize("name", sorted(FLOAT_OPS))
def test_float_special_values_like_cpu(backend, name):
    @_PROPERTY
    @given(float_pairs())
    def prop(pair):
        check_like_cpu(FLOAT_OPS[name], *pair)

    prop()


@pytest.mark.parametrize(
    "name",
    [
        "f32_eq_scalar",
        "f32_lt_scalar",
        "int_eq_float",
        "int_lt_float",
        "bf16_eq_scalar",
        "f32_add_scalar",
        "int_to_float32",
    ],
)
def test_scalars_convert_like_pytorch(backend, name):
    """A scalar (or an integer) meets a float tensor in the tensor's dtype, as PyTorch's type
    promotion converts it: x_f32 == 0.1 compares with 0.1f, int64 2**30 + 1 compared with a float
    becomes float32 2**30. The JIT used to compare in double (0.1f != 0.1)."""
    f32 = torch.tensor([0.1, 1.0, 0.3, 2.0**30, -0.0])
    ints = torch.tensor([2**30 + 1, 2**62 + 2**38 + 1, -(2**24) - 1, 0])
    ops = {
        "f32_eq_scalar": (lambda x: x == 0.1, f32),
        "f32_lt_scalar": (lambda x: x < 0.3, f32),
        "int_eq_float": (lambda x: x == 1073741824.0, ints),
        "int_lt_float": (lambda x: x < 1073741825.0, ints),
        "bf16_eq_scalar": (lambda x: x == 0.1, f32.bfloat16()),
        "f32_add_scalar": (lambda x: x + 0.1, f32),
        "int_to_float32": (lambda x: (x.float() * 1.0, x.bfloat16()), ints),
    }
    fn, x = ops[name]
    check_like_cpu(fn, x)


UNARY_FLOAT = [
    "tanh",
    "sin",
    "tan",
    "asin",
    "atan",
    "sinh",
    "asinh",
    "atanh",
    "erf",
    "expm1",
    "log1p",
    "sqrt",
    "neg",
    "trunc",
    "floor",
    "ceil",
    "round",
    "abs",
    "sign",
    "sgn",
    "relu",
    "exp",
    "log",
    "cos",
    "sigmoid",
    "reciprocal",
    "rsqrt",
    "frac",
    "square",
    "erfinv",
    "log2",
    "exp2",
    "cosh",
    "acosh",
    "nan_to_num",
    "signbit",
    "isnan",
    "isinf",
    "isfinite",
    "deg2rad",
    "rad2deg",
    "logit",
    "sinc",
    "lgamma",
    "digamma",
]


def test_unary_functions_of_special_values_like_cpu(backend):
    """At -0.0, 0.0, +-inf and NaN the result is IEEE's (tanh(-0.0) is -0.0: the host kernel's
    polynomial gave +0.0), bit for bit with CPU, for vector-length and tail positions alike."""
    x = torch.tensor([-0.0, 0.0, float("inf"), -float("inf"), float("nan")] * 4)
    for name in UNARY_FLOAT:
        check_like_cpu(getattr(torch, name), x)


@pytest.mark.parametrize(
    "bounds",
    [
        (2**62, 2**62 + 5, 1),
        (-(2**62), 2**62, 2**61 + 1),
        (INT64_MAX - 10, INT64_MAX, 3),
        (-5, 2**60, 2**58),
        (10, -(2**61), -(2**59)),
    ],
)
def test_arange_of_big_int64_bounds(backend, bounds):
    """arange computes integer results in int64 as PyTorch's CPU kernel does (the host kernel went
    through double: arange(2**62, 2**62 + 5) gave five 2**62), and refuses a range whose length
    overflows int64 in PyTorch's own size arithmetic, with its message."""

    def make(dev):
        return torch.arange(*bounds, device=dev)

    want, got = outcome(make, "cpu"), outcome(make, "fl")
    if want[0] == "raise":
        assert got[0] == "raise" and str(got[1]) == str(want[1]), (want, got)
    else:
        assert got[0] == "ok" and same(want[1], got[1]), (want, got)
