"""The C the JIT generators share: the C type of each dtype a generated kernel
stores, loads and stores through a tensor descriptor (bfloat16 converted,
integers exact in int64_t, floating values in double), constants, and the
prelude every generated source starts with (the ABI header and fl_kernel_util.h
themselves, so the generated code can never disagree with them and converts
bfloat16 as the host kernels do, then the helpers below; with `special`, the
special-function header the host plugin's kernels are built from), `walk`,
the strided loop every generator's kernel runs, and `kernel`, the function
around a generator's body. A generator that cannot express a call raises
Unsupported.

Two languages (fl_plugin.h, "Device JIT"): host C, which a version-1 plugin's
jit_compile builds into a function the host calls, and OpenCL C for a chip
whose memory the host cannot touch. Generators write one body for both, in the
C subset the two share; `language` selects what the helpers here emit: the
address space of loads and stores, the prelude (OpenCL C gets the same
descriptor, argument and walk types, rebuilt from the launch convention's
meta array), the walk (on a device the outermost walk is shared out among the
work-items; inner walks are loops of one work-item) and the kernel function
(a __kernel entry that unpacks descriptors and arguments)."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator

import torch

from ..runtime import TO_CODE, abi, config, get_include, header_path, special_math_paths

DTYPES = {
    torch.float32: "float",
    torch.float64: "double",
    torch.bfloat16: "bf16",
    torch.bool: "uint8_t",
    torch.int64: "int64_t",
    torch.int32: "int32_t",
}


class Unsupported(Exception):
    """The generator cannot express this call (the next tier serves it)."""


_LANGUAGE: contextvars.ContextVar[int] = contextvars.ContextVar("fl_jit_language", default=abi.JIT_HOST_C)


@contextlib.contextmanager
def language(code: int) -> Iterator[None]:
    """Generate in a device JIT language (abi.JIT_HOST_C or abi.JIT_OPENCL_C) inside the block."""
    if code not in (abi.JIT_HOST_C, abi.JIT_OPENCL_C):
        raise Unsupported(f"JIT language {abi.JIT_LANGUAGES.get(code, code)}")
    token = _LANGUAGE.set(code)
    try:
        yield
    finally:
        _LANGUAGE.reset(token)


def opencl() -> bool:
    """Whether the source being generated is OpenCL C."""
    return _LANGUAGE.get() == abi.JIT_OPENCL_C


def address_space() -> str:
    """The address-space qualifier of tensor data: device memory is __global in OpenCL C."""
    return "__global " if opencl() else ""


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


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


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


def _walker() -> str:
    """fl_kernel_util.h's fl_walk_t and its functions, from the header itself (so the device walks
    exactly as the host does), minus the one libc call OpenCL C lacks: fl_walk_init's memset (every
    field it leaves is written before it is read)."""
    with open(os.path.join(get_include(), "fl_kernel_util.h")) as f:
        text = f.read()
    start, end = text.index("#define FL_WALK_MAX"), text.index("/* ---- fl_rows_t")
    block = text[start:end]
    if "memset(w, 0, sizeof *w);" not in block:
        raise Unsupported("fl_kernel_util.h's fl_walk_init changed: the OpenCL prelude cannot adapt it")
    return block.replace("memset(w, 0, sizeof *w);", "w->nt = 0;")


def _opencl_prelude() -> str:
    """OpenCL C's stand-ins for what host sources get from fl_plugin.h and fl_kernel_util.h: the
    fixed-width types, the descriptor and argument types (data in __global memory), the argument
    readers, bfloat16 conversions as fl_kernel_util.h rounds, fl_walk_t, and the launch convention's
    unpacking of the meta array. Constants come from the header, through abi."""
    walker = _walker()
    kinds = abi.enum_values("fl_arg_kind_t", "FL_ARG_")
    arg_kinds = "\n".join(f"#define FL_ARG_{name} {code}" for name, code in kinds.items())
    return f"""#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef long int64_t; typedef ulong uint64_t; typedef int int32_t; typedef uint uint32_t;
typedef short int16_t; typedef ushort uint16_t; typedef char int8_t; typedef uchar uint8_t;
/* C99 math OpenCL C names differently: nearbyint rounds half to even in the default mode, as rint does */
#define nearbyint(x) rint(x)
#define nextafterf(a, b) nextafter((float)(a), (float)(b))
#define INT64_C(x) (x##L)
#define INT64_MAX LONG_MAX
#define INT64_MIN LONG_MIN
#define FL_MAX_DIMS {abi.MAX_DIMS}
#define FL_META_TENSOR {abi.JIT_META_TENSOR}
#define FL_META_ARG {abi.JIT_META_ARG}
{arg_kinds}
typedef struct {{
    __global uchar *data; int64_t offset; int32_t dtype; int32_t ndim;
    int64_t sizes[FL_MAX_DIMS]; int64_t strides[FL_MAX_DIMS];
}} fl_tensor_t;
typedef struct {{ int32_t kind; int32_t len; int64_t i; double f; int64_t list[FL_MAX_DIMS]; }} fl_arg_t;
static inline double fl_arg_num(const fl_arg_t *a) {{ return a->kind == FL_ARG_FLOAT ? a->f : (double)a->i; }}
static inline int64_t fl_arg_int(const fl_arg_t *a) {{ return a->kind == FL_ARG_FLOAT ? (int64_t)a->f : a->i; }}
static inline float fl_bf16_to_f32(uint16_t h) {{ return as_float((uint)h << 16); }}
static inline uint16_t fl_f32_to_bf16(float f) {{
    uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}}
/* the launch convention's meta array -> descriptors and arguments */
static inline void fl_unpack_tensor(fl_tensor_t *t, __global const long *m, __global uchar *buf) {{
    t->data = buf + m[0]; t->offset = m[1]; t->dtype = (int32_t)m[2]; t->ndim = (int32_t)m[3];
    for (int d = 0; d < FL_MAX_DIMS; d++) {{ t->sizes[d] = m[4 + d]; t->strides[d] = m[4 + FL_MAX_DIMS + d]; }}
}}
static inline void fl_unpack_arg(fl_arg_t *a, __global const long *m) {{
    a->kind = (int32_t)m[0]; a->len = (int32_t)m[1]; a->i = m[2]; a->f = as_double(m[3]);
    for (int d = 0; d < FL_MAX_DIMS; d++) a->list[d] = m[4 + d];
}}
{walker}
/* the share [lo, hi) of n elements this work-item walks: a contiguous chunk when the walk is the
 * kernel's parallel one, else all of them */
static inline void fl_share(int64_t n, int par, int64_t gid, int64_t gsz, int64_t *lo, int64_t *hi) {{
    if (!par) {{ *lo = 0; *hi = n; return; }}
    int64_t chunk = (n + gsz - 1) / gsz;
    *lo = gid * chunk < n ? gid * chunk : n;
    *hi = *lo + chunk < n ? *lo + chunk : n;
}}
"""


# glibc's libmvec: vector variants of these (one double argument), by the glibc version that added them
_LIBMVEC = {
    (2, 22): ("exp", "log", "sin", "cos"),
    (2, 35): (
        "acos", "acosh", "asin", "asinh", "atan", "atanh", "cbrt", "cosh", "erf", "erfc", "exp10", "exp2",
        "expm1", "log10", "log1p", "log2", "sinh", "tan", "tanh",
    ),
}  # fmt: skip
_VECTOR_MATH: str | None = None


def vector_math() -> str:
    """C that lets GCC vectorize a generated host loop's math calls, for this machine: with AVX2 (what
    PyTorch's own CPU dispatch found: torch.backends.cpu.get_cpu_capability) and glibc's libmvec, the
    functions above are declared `omp declare simd`, so a `#pragma omp simd` loop calls their 4-wide AVX2
    variants (libm.so links libmvec as needed). Why: a fused elementwise kernel computes in double, and its
    exp/tanh/erf calls, one element at a time, were its whole cost (an LSTM cell's chain: ~20 ns an element).
    The variants are accurate to a few units in the last place of a double, and every op's result is rounded
    to the kernel's dtype as before (an LSTM chain over 4M random inputs: the same float32 bits). The target
    is AVX2 without FMA, so no multiply and add are fused where the scalar code rounds twice. Empty where any
    of it is missing (another CPU, C library or compiler: the loops stay scalar) or FL_JIT_VECTOR_MATH=0;
    the text is part of the source, so the JIT cache never mixes the two."""
    global _VECTOR_MATH
    if _VECTOR_MATH is None:
        _VECTOR_MATH = _vector_math()
    return _VECTOR_MATH


def _vector_math() -> str:
    import platform

    if not config.env_bool("FL_JIT_VECTOR_MATH", True) or platform.machine() not in ("x86_64", "AMD64"):
        return ""
    try:
        capable = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    except (AttributeError, RuntimeError):
        return ""
    name, version = platform.libc_ver()
    if not capable or name != "glibc":
        return ""
    try:
        have = tuple(int(v) for v in version.split(".")[:2])
    except ValueError:
        return ""
    funcs = [f for since, names in _LIBMVEC.items() if have >= since for f in names]
    if not funcs:
        return ""
    # const: no errno to set (GCC does not vectorize a call that may write memory); declared before math.h
    decls = "\n".join(
        f"#pragma omp declare simd notinbranch\ndouble {f}(double) __attribute__((__const__, __nothrow__));"
        for f in funcs
    )
    return f"""/* vector math: this machine has AVX2 and glibc's libmvec (torch_fl.jit.render.vector_math) */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(_OPENMP)
#pragma GCC target("avx2")
{decls}
#endif
"""


def prelude(special: bool = False) -> str:
    """The ABI header and fl_kernel_util.h themselves (so the generated code can never disagree with
    them), then helpers; with `special`, the special-function header the host plugin's kernels are
    built from (host C only). Pasted, not #included: the plugin compiles the source with no include
    path. In OpenCL C, the stand-ins of _opencl_prelude instead of the two headers."""
    if opencl():
        text = _opencl_prelude() + HELPERS
    else:
        with open(header_path()) as f, open(os.path.join(get_include(), "fl_kernel_util.h")) as g:
            text = vector_math() + f.read() + g.read() + HELPERS
    if special:
        if opencl():  # its tables are static arrays inside functions, which OpenCL C does not allow
            raise Unsupported("special functions (fl_special_math.h) in OpenCL C")
        paths = special_math_paths()
        if paths is None:
            raise Unsupported("fl_special_math.h or fl_special_bessel.h is not installed")
        for path in paths:
            with open(path) as f:
                text += f.read()
    return text


def ctype(dtype) -> str:
    return DTYPES[dtype]


def c_load(t: str, dtype, off: str) -> str:
    """C for element `off` of tensor descriptor `t` (e.g. "in[0]"), in value_type(dtype):
    int64_t for integers and bool (exact), double for floating dtypes."""
    c, q = ctype(dtype), address_space()
    if c == "bf16":
        return f"(double)fl_bf16_to_f32((({q}const uint16_t *){t}.data)[{off}])"
    if exact(dtype):
        return f"(int64_t)(({q}const {c} *){t}.data)[{off}]"
    return f"(double)(({q}const {c} *){t}.data)[{off}]"


def c_store(t: str, dtype, off: str, expr: str, integer: bool = False) -> str:
    """C storing `expr` as element `off` of `t`: a double expression (integers truncate, bool is
    != 0), or with `integer` an int64_t one (integers wrap to the width, floats round once)."""
    c, q = ctype(dtype), address_space()
    if dtype is torch.bool:
        zero = "0" if integer else "0.0"
        return f"(({q}uint8_t *){t}.data)[{off}] = (uint8_t)(({expr}) != {zero});"
    if c == "bf16":
        return f"(({q}uint16_t *){t}.data)[{off}] = fl_f32_to_bf16((float)({expr}));"
    if integer or dtype.is_floating_point:
        return f"(({q}{c} *){t}.data)[{off}] = ({c})({expr});"
    return f"(({q}{c} *){t}.data)[{off}] = ({c})trunc({expr});"


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
    instead, split over OpenMP threads when it is long; tensors whose last dimension is
    contiguous in all of them (an LSTM's gate chunks, a slice) run a plain loop along each
    row of it, the other dimensions walked per row; the coordinate walk serves the rest.
    Both plain loops are `omp simd` loops: with vector_math(), GCC vectorizes them, math
    calls included, where the body allows (a store guarded by `err` does not)."""
    if not offsets or len(offsets) > 11:  # FL_WALK_MAX = FL_MAX_DIMS + 3
        raise Unsupported(f"a walk over {len(offsets)} tensors")
    w = "w_" + "_".join(offsets)
    if opencl():
        return _device_walk(w, space, offsets, body, flat=flat_body is not None)
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
    row_starts = " ".join(f"const int64_t {w}_b{k} = {w}_off[{k}];" for k in range(len(offsets)))
    row_binds = " ".join(f"int64_t {name} = {w}_b{k} + {w}_j;" for k, name in enumerate(offsets))
    return f"""{{
    fl_walk_t {w}; fl_walk_init(&{w}, ({space}).ndim, ({space}).sizes); {adds}
    int {w}_unit = {w}.nd > 0 && {w}.size[{w}.nd - 1] >= 8;
    for (int {w}_k = 0; {w}_unit && {w}_k < {w}.nt; {w}_k++) {w}_unit = {w}.st[{w}_k][{w}.nd - 1] == 1;
    if (fl_walk_flat(&{w})) {{
        const int64_t {w}_n = {w}.numel;
#pragma omp parallel for simd schedule(static) reduction(| : err) if ({w}_n >= 65536)
        for (int64_t {w}_q = 0; {w}_q < {w}_n; {w}_q++) {{
            {flat_binds}
            {flat_body}
        }}
    }} else if ({w}_unit) {{ /* rows along the last dimension, contiguous in every tensor */
        const int64_t {w}_len = {w}.size[{w}.nd - 1], {w}_rows = {w}.numel / {w}_len;
        int64_t {w}_ctr[FL_MAX_DIMS], {w}_off[FL_WALK_MAX];
        {w}.nd -= 1;
        if ({w}_rows > 0) fl_walk_seek(&{w}, 0, {w}_ctr, {w}_off);
        for (int64_t {w}_r = 0; {w}_r < {w}_rows; {w}_r++, fl_walk_next(&{w}, {w}_ctr, {w}_off)) {{
            {row_starts}
#pragma omp simd reduction(| : err)
            for (int64_t {w}_j = 0; {w}_j < {w}_len; {w}_j++) {{
                {row_binds}
                {flat_body}
            }}
        }}
    }} else {{
    {walked}
    }}
}}"""


def _device_walk(w: str, space: str, offsets: dict[str, str], body: str, flat: bool) -> str:
    """walk() in OpenCL C: the same coordinate walk over this work-item's share of the elements. The
    share comes from fl_share with a @PAR@ mark that `kernel` resolves: the outermost walk of a
    parallel kernel is split among the work-items, every other walk runs whole in one work-item.
    With `flat` (independent elements), tensors that share one dense layout run a plain loop over
    memory order instead, as the host's walk does: ~10x fewer instructions per element on pocl."""
    adds = " ".join(f"fl_walk_add(&{w}, &({t}));" for t in offsets.values())
    binds = " ".join(f"int64_t {name} = {w}_off[{k}];" for k, name in enumerate(offsets))
    walked = f"""fl_walk_seek(&{w}, {w}_lo, {w}_ctr, {w}_off);
    for (int64_t {w}_i = {w}_lo; {w}_i < {w}_hi; {w}_i++, fl_walk_next(&{w}, {w}_ctr, {w}_off)) {{
        {binds}
        {body}
    }}"""
    if flat:
        flat_binds = " ".join(f"int64_t {name} = {w}.base[{k}] + {w}_q;" for k, name in enumerate(offsets))
        walked = f"""if (fl_walk_flat(&{w})) {{
        for (int64_t {w}_q = {w}_lo; {w}_q < {w}_hi; {w}_q++) {{
            {flat_binds}
            {body}
        }}
    }} else {{
    {walked}
    }}"""
    return f"""{{
    fl_walk_t {w}; fl_walk_init(&{w}, ({space}).ndim, ({space}).sizes); {adds}
    int64_t {w}_ctr[FL_MAX_DIMS], {w}_off[FL_WALK_MAX], {w}_lo, {w}_hi;
    fl_share({w}.numel, @PAR@, fl_gid, fl_gsz, &{w}_lo, &{w}_hi);
    if ({w}_lo < {w}_hi) {{
    {walked}
    }}
}}"""


def kernel(
    symbol: str,
    comment: str,
    body: str,
    *,
    n_in: int,
    n_out: int,
    n_args: int,
    parallel: bool = True,
    checked: bool = False,
) -> str:
    """The kernel function around a generator's body: C that reads in/n_in, out/n_out and args/n_args
    (the kernel calling convention of fl_plugin.h) and returns an fl_status_t. Host C: the exported
    fl_kernel_fn itself. OpenCL C: the body as a function of one work-item, and the __kernel entry of
    the launch convention that unpacks n_in + n_out descriptors and n_args arguments and runs it.
    `parallel`: the body's outermost walk may be split among work-items (its elements are
    independent); else one work-item runs the whole body. `checked`: the body may fail (a nonzero
    status: an index out of range, an integer division by zero), which the launch then reports."""
    if not opencl():
        return f"""
/* {comment}, generated by torch_fl */
__attribute__((visibility("default")))
int {symbol}(fl_stream_t stream, int device, const fl_tensor_t *in, int n_in, const fl_tensor_t *out, int n_out,
             const fl_arg_t *args, int n_args) {{
    (void)stream; (void)device; (void)in; (void)n_in; (void)out; (void)n_out; (void)args; (void)n_args;
    {body}
}}
"""
    first = body.find("@PAR@")
    if first >= 0:  # the first walk in the text is the outermost one: inner walks sit in its body
        body = body[:first] + ("1" if parallel else "0") + body[first + 5 :].replace("@PAR@", "0")
    n_t = n_in + n_out
    buffers = "".join(f", __global uchar *t{k}" for k in range(n_t))
    unpack = "\n    ".join(
        [f"fl_unpack_tensor(&in[{k}], meta + {k} * FL_META_TENSOR, t{k});" for k in range(n_in)]
        + [f"fl_unpack_tensor(&out[{k}], meta + {n_in + k} * FL_META_TENSOR, t{n_in + k});" for k in range(n_out)]
        + [f"fl_unpack_arg(&args[{k}], meta + {n_t} * FL_META_TENSOR + {k} * FL_META_ARG);" for k in range(n_args)]
    )
    only_first = "" if parallel else "if (get_global_id(0) != 0) return;\n    "
    return f"""
/* {comment}, generated by torch_fl (OpenCL C) */
{"#define FL_JIT_CHECKED 1" if checked else ""}
static int fl_body(const fl_tensor_t *in, int n_in, const fl_tensor_t *out, int n_out, const fl_arg_t *args,
                   int n_args, int64_t fl_gid, int64_t fl_gsz) {{
    (void)in; (void)n_in; (void)out; (void)n_out; (void)args; (void)n_args; (void)fl_gid; (void)fl_gsz;
    {body}
}}
__kernel void {symbol}(__global const long *meta, __global int *status{buffers}) {{
    {only_first}fl_tensor_t in[{max(n_in, 1)}], out[{max(n_out, 1)}];
    fl_arg_t args[{max(n_args, 1)}];
    {unpack}
    int st = fl_body(in, {n_in}, out, {n_out}, args, {n_args}, (int64_t)get_global_id(0), (int64_t)get_global_size(0));
    if (st != 0) *status = st;
}}
"""
