"""The C the JIT generators share: the C type of each dtype a generated kernel
stores, loads and stores through a tensor descriptor (bfloat16 converted,
integers exact in int64_t, floating values in double), constants, and the
prelude every generated source starts with (the ABI header and fl_kernel_util.h
themselves, so the generated code can never disagree with them and converts
bfloat16 as the host kernels do, then the helpers below; with `special`, the
special-function header the host plugin's kernels are built from), and `walk`,
the strided loop every generator's kernel runs. A generator that cannot express
a call raises Unsupported."""

from __future__ import annotations

import os

import torch

from ..runtime import TO_CODE, get_include, header_path, special_math_path

DTYPES = {torch.float32: "float", torch.float64: "double", torch.bfloat16: "bf16", torch.bool: "uint8_t",
          torch.int64: "int64_t", torch.int32: "int32_t"}


class Unsupported(Exception):
    """The generator cannot express this call (the next tier serves it)."""


def c_const(v) -> str:
    if isinstance(v, bool):
        return "1.0" if v else "0.0"
    if isinstance(v, (int, float)):
        f = float(v)
        if f != f:
            return "NAN"
        if f in (float("inf"), float("-inf")):
            return "INFINITY" if f > 0 else "(-INFINITY)"
        return f"({f.hex()})"
    raise Unsupported(f"constant {v!r}")


_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1


def c_int(v: int) -> str:
    """An int64_t literal (INT64_MIN has no literal of its own in C)."""
    v = int(v)
    if not _INT64_MIN <= v <= _INT64_MAX:
        raise Unsupported(f"integer constant {v} does not fit int64")
    if v == _INT64_MIN:
        return "(-INT64_C(9223372036854775807) - 1)"
    return f"INT64_C({v})"


def exact(dtype) -> bool:
    """Whether a dtype computes in int64_t (integers and bool) rather than in double."""
    return dtype is not None and not dtype.is_floating_point and not dtype.is_complex


def value_type(dtype) -> str:
    """The C type generated code computes a dtype's values in."""
    return "int64_t" if exact(dtype) else "double"


HELPERS = r"""
/* v rounded to bfloat16 (fl_kernel_util.h's conversions), as a double */
static inline double fl_rnd_bf16(double v) { return fl_bf16_to_f32(fl_f32_to_bf16((float)v)); }
/* as PyTorch's CPU kernels: relu and the clamps keep x when it equals the bound (relu(-0.0) is -0.0),
 * a NaN input or bound gives NaN, and floor division follows ATen's div_floor_floating */
static inline double fl_relu(double x) { return x < 0.0 ? 0.0 : x; }
static inline double fl_clamp_lo(double x, double lo) { return lo != lo ? lo : (x < lo ? lo : x); }
static inline double fl_clamp_hi(double x, double hi) { return hi != hi ? hi : (x > hi ? hi : x); }
static inline double fl_div_floor(double a, double b) {
    if (b == 0.0) return a / b;
    double mod = fmod(a, b), div = (a - mod) / b;
    if (mod != 0.0 && ((b < 0.0) != (mod < 0.0))) div -= 1.0;
    if (div == 0.0) return copysign(0.0, a / b);
    double fd = floor(div);
    return div - fd > 0.5 ? fd + 1.0 : fd;
}
static inline double fl_max(double a, double b) { return (a != a || b != b) ? NAN : (a > b ? a : b); }
static inline double fl_min(double a, double b) { return (a != a || b != b) ? NAN : (a < b ? a : b); }
/* as PyTorch's CPU kernel, (0 < x) - (x < 0): NaN and -0.0 give +0.0 */
static inline double fl_sign(double x) { return (double)((x > 0.0) - (x < 0.0)); }
static inline double fl_rem(double a, double b) {
    double m = fmod(a, b); return (m != 0.0 && ((m < 0.0) != (b < 0.0))) ? m + b : m;
}
/* integers as PyTorch computes them: two's complement wrap-around (through uint64_t: signed
 * overflow is undefined in C), C division truncating, floor division and remainder with
 * Python's signs, INT64_MIN / -1 wrapping, a zero divisor flagged in *err (PyTorch raises
 * ZeroDivisionError), shifts by a negative or too large count giving 0 (left) or the sign (right) */
static inline int64_t fl_iadd(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static inline int64_t fl_isub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
static inline int64_t fl_imul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }
static inline int64_t fl_ineg(int64_t a) { return (int64_t)(0u - (uint64_t)a); }
static inline int64_t fl_iabs(int64_t a) { return a < 0 ? fl_ineg(a) : a; }
static inline int64_t fl_isign(int64_t a) { return (int64_t)(a > 0) - (int64_t)(a < 0); }
static inline int64_t fl_imax(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t fl_imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t fl_idiv_trunc(int64_t a, int64_t b, int *err) {
    if (b == 0) { *err = 1; return 0; }
    return b == -1 ? fl_ineg(a) : a / b;
}
static inline int64_t fl_idiv_floor(int64_t a, int64_t b, int *err) {
    if (b == 0) { *err = 1; return 0; }
    if (b == -1) return fl_ineg(a);
    int64_t q = a / b, r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t fl_ifmod(int64_t a, int64_t b, int *err) {
    if (b == 0) { *err = 1; return 0; }
    return b == -1 ? 0 : a % b;
}
static inline int64_t fl_irem(int64_t a, int64_t b, int *err) {
    if (b == 0) { *err = 1; return 0; }
    if (b == -1) return 0;
    int64_t m = a % b;
    return (m != 0 && ((m < 0) != (b < 0))) ? m + b : m;
}
static inline int64_t fl_ipow(int64_t a, int64_t b) {
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
    uint64_t r = 1, x = (uint64_t)a;
    while (b) { if (b & 1) r *= x; x *= x; b >>= 1; }
    return (int64_t)r;
}
static inline int64_t fl_ishl(int64_t a, int64_t b) { return (b < 0 || b >= 64) ? 0 : (int64_t)((uint64_t)a << b); }
static inline int64_t fl_ishr(int64_t a, int64_t b) { return (b < 0 || b >= 63) ? (a < 0 ? -1 : 0) : (a >> b); }
static inline int64_t fl_igcd(int64_t a, int64_t b) {
    a = fl_iabs(a); b = fl_iabs(b);
    while (b != 0) { int64_t t = a % b; a = b; b = t; }
    return a;
}
static inline int64_t fl_ilcm(int64_t a, int64_t b) {
    int64_t g = fl_igcd(a, b);
    return g == 0 ? 0 : fl_iabs(fl_imul(a / g, b));
}
"""


def prelude(special: bool = False) -> str:
    """The ABI header and fl_kernel_util.h themselves (so the generated code can never disagree with
    them), then helpers; with `special`, the special-function header the host plugin's kernels are
    built from. Pasted, not #included: the plugin compiles the source with no include path."""
    with open(header_path()) as f, open(os.path.join(get_include(), "fl_kernel_util.h")) as g:
        text = f.read() + g.read() + HELPERS
    if special:
        path = special_math_path()
        if path is None:
            raise Unsupported("fl_special_math.h is not installed")
        with open(path) as f:
            return text + f.read()
    return text


def ctype(dtype) -> str:
    return DTYPES[dtype]


def c_load(t: str, dtype, off: str) -> str:
    """C for element `off` of tensor descriptor `t` (e.g. "in[0]"), in value_type(dtype):
    int64_t for integers and bool (exact), double for floating dtypes."""
    c = ctype(dtype)
    if c == "bf16":
        return f"(double)fl_bf16_to_f32(((const uint16_t *){t}.data)[{off}])"
    if exact(dtype):
        return f"(int64_t)((const {c} *){t}.data)[{off}]"
    return f"(double)((const {c} *){t}.data)[{off}]"


def c_store(t: str, dtype, off: str, expr: str, integer: bool = False) -> str:
    """C storing `expr` as element `off` of `t`: a double expression (integers truncate, bool is
    != 0), or with `integer` an int64_t one (integers wrap to the width, floats round once)."""
    c = ctype(dtype)
    if dtype is torch.bool:
        zero = "0" if integer else "0.0"
        return f"((uint8_t *){t}.data)[{off}] = (uint8_t)(({expr}) != {zero});"
    if c == "bf16":
        return f"((uint16_t *){t}.data)[{off}] = fl_f32_to_bf16((float)({expr}));"
    if integer or dtype.is_floating_point:
        return f"(({c} *){t}.data)[{off}] = ({c})({expr});"
    return f"(({c} *){t}.data)[{off}] = ({c})trunc({expr});"


def dtype_code(dtype) -> int:
    """The ABI's fl_dtype_t code of a dtype."""
    return TO_CODE[dtype]


def walk(space: str, offsets: dict[str, str], body: str, flat_body: str | None = None) -> str:
    """The one strided loop every generator's kernel runs: C that executes `body` once per
    element of the index space of descriptor `space` (a C expression of an fl_tensor_t,
    e.g. "out[0]"), in row-major order, with each name of `offsets` bound (int64_t) to
    the element's offset in its descriptor (name -> C expression of an fl_tensor_t whose
    strides describe that space: the same shape, or a view built for it). It is
    fl_kernel_util.h's fl_walk_t, the walker the host plugin's kernels use; loops nest
    (a reduction's inner walk over the reduced dimensions) as long as their offset names
    differ. Generators describe the computation; this writes the loop.

    With `flat_body` (an elementwise computation whose elements are independent: no
    `return`, an error only ORed into `err`), tensors that share one dense layout (what
    fl_walk_flat checks: NCHW or channels-last alike) run a plain loop over memory order
    instead, split over OpenMP threads when it is long; the coordinate walk serves the rest."""
    if not offsets or len(offsets) > 11:  # FL_WALK_MAX = FL_MAX_DIMS + 3
        raise Unsupported(f"a walk over {len(offsets)} tensors")
    w = "w_" + "_".join(offsets)
    adds = " ".join(f"fl_walk_add(&{w}, &({t}));" for t in offsets.values())
    binds = " ".join(f"int64_t {name} = {w}_off[{k}];" for k, name in enumerate(offsets))
    walked = f"""int64_t {w}_ctr[FL_MAX_DIMS], {w}_off[FL_WALK_MAX];
    if ({w}.numel > 0) fl_walk_seek(&{w}, 0, {w}_ctr, {w}_off);
    for (int64_t {w}_i = 0; {w}_i < {w}.numel; {w}_i++, fl_walk_next(&{w}, {w}_ctr, {w}_off)) {{
        {binds}
        {body}
    }}"""
    if flat_body is None:
        return f"""{{
    fl_walk_t {w}; fl_walk_init(&{w}, ({space}).ndim, ({space}).sizes); {adds}
    {walked}
}}"""
    flat_binds = " ".join(f"int64_t {name} = {w}.base[{k}] + {w}_q;" for k, name in enumerate(offsets))
    return f"""{{
    fl_walk_t {w}; fl_walk_init(&{w}, ({space}).ndim, ({space}).sizes); {adds}
    if (fl_walk_flat(&{w})) {{
        const int64_t {w}_n = {w}.numel;
#pragma omp parallel for schedule(static) reduction(| : err) if ({w}_n >= 65536)
        for (int64_t {w}_q = 0; {w}_q < {w}_n; {w}_q++) {{
            {flat_binds}
            {flat_body}
        }}
    }} else {{
    {walked}
    }}
}}"""
