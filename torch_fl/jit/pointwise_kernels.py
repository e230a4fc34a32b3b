"""The JIT tier: kernels generated for pointwise ops a backend lacks.

When a backend has no kernel for a pointwise op (torch.Tag.pointwise) and its
plugin offers `jit_compile`, the op is traced once per signature with
PyTorch's core-aten decompositions on tiny CPU tensors, the traced graph is
turned into one C expression per element (computed in double, stored in the
output dtype), and the plugin compiles that C source. The plugin caches the
compiled library on disk by a hash of the source (the host and emulated
plugins: `$FL_JIT_CACHE` or `~/.cache/torch_fl/jit`); this module caches the
kernel function in memory per signature. An op whose traced graph uses
anything outside the supported set, or whose compile fails, is not served:
the dispatcher moves on to the CPU fallback, and `explain` says why.

Supported: float32 / float64 / bfloat16 / bool / int64 / int32 tensors, with Python scalars and
wrapped numbers as arguments; the element-wise arithmetic, comparison,
transcendental and activation ops listed in _UNARY/_BINARY below. Each graph
node is computed in the C type of its own dtype: floating nodes in double,
integer and bool nodes in int64_t with PyTorch's integer semantics (two's
complement wrap-around, floor division and Python's remainder sign, shifts
past the width, ZeroDivisionError), so integers are exact at any magnitude,
not only below 2**53."""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import torch

from ..runtime import NOT_HANDLED, is_fl, output_layouts
from .kernel import STATS, Kernel, key, run, wrap_numbers
from .render import (
    DTYPES,
    Unsupported,
    c_const,
    c_int,
    c_load,
    c_store,
    dtype_code,
    exact,
    kernel,
    prelude,
    value_type,
    walk,
)

aten = torch.ops.aten

_UNARY = {
    aten.exp.default: "exp({0})",
    aten.log.default: "log({0})",
    aten.log1p.default: "log1p({0})",
    aten.expm1.default: "expm1({0})",
    aten.sqrt.default: "sqrt({0})",
    aten.rsqrt.default: "(1.0/sqrt({0}))",
    aten.tanh.default: "tanh({0})",
    aten.sigmoid.default: "(1.0/(1.0+exp(-({0}))))",
    aten.erf.default: "erf({0})",
    aten.abs.default: "fabs({0})",
    aten.neg.default: "(-({0}))",
    aten.sin.default: "sin({0})",
    aten.cos.default: "cos({0})",
    aten.tan.default: "tan({0})",
    aten.reciprocal.default: "(1.0/({0}))",
    aten.floor.default: "floor({0})",
    aten.ceil.default: "ceil({0})",
    aten.trunc.default: "trunc({0})",
    aten.round.default: "nearbyint({0})",
    aten.relu.default: "fl_relu({0})",
    aten.exp2.default: "exp2({0})",
    aten.log2.default: "log2({0})",
    aten.log10.default: "log10({0})",
    aten.sign.default: "fl_sign({0})",
    aten.logical_not.default: "(({0}) == 0.0)",
    aten.asin.default: "asin({0})",
    aten.acos.default: "acos({0})",
    aten.atan.default: "atan({0})",
    aten.sinh.default: "sinh({0})",
    aten.cosh.default: "cosh({0})",
    aten.asinh.default: "asinh({0})",
    aten.acosh.default: "acosh({0})",
    aten.atanh.default: "atanh({0})",
    aten.erfc.default: "erfc({0})",
    aten.isnan.default: "(({0}) != ({0}))",
    aten.signbit.default: "signbit({0})",
}
_BINARY = {
    "add": "(({0}) + ({1}))",
    "sub": "(({0}) - ({1}))",
    "mul": "(({0}) * ({1}))",
    "div": "(({0}) / ({1}))",
    "maximum": "fl_max({0}, {1})",
    "minimum": "fl_min({0}, {1})",
    "pow": "pow({0}, {1})",
    "atan2": "atan2({0}, {1})",
    "eq": "(({0}) == ({1}))",
    "ne": "(({0}) != ({1}))",
    "gt": "(({0}) > ({1}))",
    "ge": "(({0}) >= ({1}))",
    "lt": "(({0}) < ({1}))",
    "le": "(({0}) <= ({1}))",
    "fmod": "fmod({0}, {1})",
    "logical_and": "((({0}) != 0.0) && (({1}) != 0.0))",
    "logical_or": "((({0}) != 0.0) || (({1}) != 0.0))",
    "copysign": "copysign({0}, {1})",
    "hypot": "hypot({0}, {1})",
    "remainder": "fl_rem({0}, {1})",
    "logical_xor": "((({0}) != 0.0) != (({1}) != 0.0))",
    # integer and bool operands only (PyTorch has no float bitwise ops); exact below 2**53
    "bitwise_and": "(double)((int64_t)({0}) & (int64_t)({1}))",
    "bitwise_or": "(double)((int64_t)({0}) | (int64_t)({1}))",
    "bitwise_xor": "(double)((int64_t)({0}) ^ (int64_t)({1}))",
}

# Special functions: the mathematics lives once in plugins_cffi/host/fl_special_math.h and fl_special_bessel.h
# (shipped in torch_fl/runtime/include), shared with the host plugin's native kernels; a kernel that calls one
# gets both headers in its source. Keys are packet names of aten and prims ops alike.
_SPECIAL_UNARY = {
    "lgamma": "lgamma({0})",
    "digamma": "fl_sp_digamma({0})",
    "special_psi": "fl_sp_digamma({0})",
    "erfinv": "fl_sp_erfinv({0})",
    "erf_inv": "fl_sp_erfinv({0})",
    "i0": "fl_sp_i0({0})",
    "bessel_i0": "fl_sp_i0({0})",
    "special_i0e": "fl_sp_i0e({0})",
    "bessel_i0e": "fl_sp_i0e({0})",
    "special_i1": "fl_sp_i1({0})",
    "bessel_i1": "fl_sp_i1({0})",
    "special_i1e": "fl_sp_i1e({0})",
    "bessel_i1e": "fl_sp_i1e({0})",
    "special_ndtri": "fl_sp_ndtri({0})",
    "ndtri": "fl_sp_ndtri({0})",
    "special_log_ndtr": "fl_sp_log_ndtr({0})",
    "special_erfcx": "fl_sp_erfcx({0})",
    "erfcx": "fl_sp_erfcx({0})",
    "special_airy_ai": "fl_sp_airy_ai({0})",
    "special_bessel_j0": "fl_sp_bessel_j0({0})",
    "bessel_j0": "fl_sp_bessel_j0({0})",
    "special_bessel_j1": "fl_sp_bessel_j1({0})",
    "bessel_j1": "fl_sp_bessel_j1({0})",
    "special_bessel_y0": "fl_sp_bessel_y0({0})",
    "special_bessel_y1": "fl_sp_bessel_y1({0})",
    "special_modified_bessel_i0": "fl_sp_modified_bessel_i0({0})",
    "special_modified_bessel_i1": "fl_sp_modified_bessel_i1({0})",
    "special_modified_bessel_k0": "fl_sp_modified_bessel_k0({0})",
    "special_modified_bessel_k1": "fl_sp_modified_bessel_k1({0})",
    "special_scaled_modified_bessel_k0": "fl_sp_scaled_modified_bessel_k0({0})",
    "special_scaled_modified_bessel_k1": "fl_sp_scaled_modified_bessel_k1({0})",
    "special_spherical_bessel_j0": "fl_sp_spherical_bessel_j0({0})",
    "spherical_bessel_j0": "fl_sp_spherical_bessel_j0({0})",
    "angle": "fl_sp_angle({0})",
}
# (x, n) polynomials: the header's float32 flavour rounds the recurrence like PyTorch's float kernel
_SPECIAL_POLY = {
    "special_chebyshev_polynomial_t": "fl_sp_cheb_t",
    "special_chebyshev_polynomial_u": "fl_sp_cheb_u",
    "special_chebyshev_polynomial_v": "fl_sp_cheb_v",
    "special_chebyshev_polynomial_w": "fl_sp_cheb_w",
    "special_shifted_chebyshev_polynomial_t": "fl_sp_scheb_t",
    "special_shifted_chebyshev_polynomial_u": "fl_sp_scheb_u",
    "special_shifted_chebyshev_polynomial_v": "fl_sp_scheb_v",
    "special_shifted_chebyshev_polynomial_w": "fl_sp_scheb_w",
    "special_hermite_polynomial_h": "fl_sp_herm_h",
    "special_hermite_polynomial_he": "fl_sp_herm_he",
    "special_laguerre_polynomial_l": "fl_sp_lag_l",
    "special_legendre_polynomial_p": "fl_sp_leg_p",
}
_SPECIAL_BINARY = {
    "igamma": "fl_sp_igamma({0}, {1})",
    "igammac": "fl_sp_igammac({0}, {1})",
    "special_zeta": "fl_sp_zeta({0}, {1})",
    "zeta": "fl_sp_zeta({0}, {1})",
    "fmax": "fmax({0}, {1})",
    "fmin": "fmin({0}, {1})",
}
# prims ops PyTorch's decompositions produce that carry no pointwise tag but are elementwise
_PRIMS_POINTWISE = {
    getattr(torch.ops.prims, n).default
    for n in (
        "lgamma",
        "erf_inv",
        "bessel_i0",
        "bessel_i0e",
        "bessel_i1",
        "bessel_i1e",
        "ndtri",
        "erfcx",
        "zeta",
        "spherical_bessel_j0",
        "bessel_j0",
        "bessel_j1",
        "remainder",
    )
    if hasattr(torch.ops.prims, n)
}


class _Value(NamedTuple):
    """A C expression, whether it is an int64_t (else a double), the dtype it holds a value of, and
    whether it is a scalar (a Python number or a wrapped number: lowest in type promotion)."""

    expr: str
    integer: bool
    dtype: Any = None
    scalar: bool = False


def _as(v: _Value, integer: bool) -> str:
    """v's expression converted to int64_t or double (C's conversions: floats truncate)."""
    if v.integer == integer:
        return v.expr
    return f"((int64_t)({v.expr}))" if integer else f"((double)({v.expr}))"


def _round(expr: str, dtype) -> str:
    """A double rounded to dtype's precision: float32 and bfloat16 values are kept as PyTorch
    stores them, so a chain of ops and a comparison see what PyTorch's kernels see."""
    if dtype == torch.float32:
        return f"((double)(float)({expr}))"
    if dtype == torch.bfloat16:
        return f"fl_rnd_bf16({expr})"
    return expr


def _in(v: _Value, math) -> str:
    """An operand as a double in an op computed in dtype `math`: a value of another dtype (an
    integer, a float64 scalar) is first converted to it, as PyTorch's type promotion does, so
    x_f32 == 0.1 compares with 0.1f and int64 2**30 + 1 becomes float32 2**30. Reduced float
    dtypes compute in float32 (PyTorch's opmath); only comparisons see a bfloat16 operand."""
    expr = _as(v, False)
    if v.dtype == math or math not in (torch.float32, torch.bfloat16):
        return expr
    if v.integer and math == torch.bfloat16:
        return _round(_round(expr, torch.float32), math)
    return _round(expr, math)


# integer dtypes narrower than int64: a node of one wraps to its width, as PyTorch stores it
_NARROW = {torch.int32: "int32_t", torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t"}


def _narrow(expr: str, dtype) -> str:
    if dtype is torch.bool:
        return f"((int64_t)(({expr}) != 0))"
    c = _NARROW.get(dtype)
    return f"((int64_t)({c})({expr}))" if c else expr


def _node_dtype(n, default):
    return getattr(n.meta.get("val"), "dtype", default)


def _constant(v) -> _Value:
    if isinstance(v, bool):
        return _Value("INT64_C(1)" if v else "INT64_C(0)", True, torch.bool, True)
    if isinstance(v, int):
        return _Value(c_int(v), True, torch.int64, True)
    return _Value(c_const(v), False, torch.float64, True)


_COMPARISONS = {"eq", "ne", "gt", "ge", "lt", "le", "logical_and", "logical_or", "logical_xor"}


def _promoted(operands: list) -> Any:
    """torch.result_type of a node's operands (scalars as Python numbers), or None."""
    items: list[bool | int | float | torch.Tensor] = []
    for v in operands:
        if v.dtype is None:
            return None
        if v.scalar:
            items.append(True if v.dtype is torch.bool else (0 if exact(v.dtype) else 0.0))
        else:
            items.append(torch.empty((1,), dtype=v.dtype))
    if len(items) != 2:
        return None
    if not isinstance(items[0], torch.Tensor) and not isinstance(items[1], torch.Tensor):
        return None
    return torch.result_type(*items)  # type: ignore[arg-type]  # a tensor and a scalar, either order


# integer forms of the ops, over int64_t operands; `err` flags a zero divisor
_INT_BINARY = {
    "add": "fl_iadd({0}, {1})",
    "sub": "fl_isub({0}, {1})",
    "mul": "fl_imul({0}, {1})",
    "maximum": "fl_imax({0}, {1})",
    "minimum": "fl_imin({0}, {1})",
    "pow": "fl_ipow({0}, {1})",
    "fmod": "fl_ifmod({0}, {1}, &err)",
    "remainder": "fl_irem({0}, {1}, &err)",
    "eq": "(({0}) == ({1}))",
    "ne": "(({0}) != ({1}))",
    "gt": "(({0}) > ({1}))",
    "ge": "(({0}) >= ({1}))",
    "lt": "(({0}) < ({1}))",
    "le": "(({0}) <= ({1}))",
    "bitwise_and": "(({0}) & ({1}))",
    "bitwise_or": "(({0}) | ({1}))",
    "bitwise_xor": "(({0}) ^ ({1}))",
    "bitwise_left_shift": "fl_ishl({0}, {1})",
    "bitwise_right_shift": "fl_ishr({0}, {1})",
    "__lshift__": "fl_ishl({0}, {1})",
    "__rshift__": "fl_ishr({0}, {1})",
    "logical_and": "((({0}) != 0) && (({1}) != 0))",
    "logical_or": "((({0}) != 0) || (({1}) != 0))",
    "logical_xor": "((({0}) != 0) != (({1}) != 0))",
    "gcd": "fl_igcd({0}, {1})",
    "lcm": "fl_ilcm({0}, {1})",
}
_INT_UNARY = {
    "abs": "fl_iabs({0})",
    "neg": "fl_ineg({0})",
    "sign": "fl_isign({0})",
    "sgn": "fl_isign({0})",
    "relu": "(({0}) > 0 ? ({0}) : 0)",
    "floor": "({0})",
    "ceil": "({0})",
    "trunc": "({0})",
    "round": "({0})",
    "logical_not": "(({0}) == 0)",
    "isnan": "0",
    "signbit": "(({0}) < 0)",
    "square": "fl_imul({0}, {0})",
    "_to_copy": "({0})",
    "clone": "({0})",
    "alias": "({0})",
    "lift_fresh_copy": "({0})",
    "detach": "({0})",
}
_CLAMPS = ("clamp", "clamp_min", "clamp_max")


def _int_expr(packet: str, n, operand, dtype) -> str:
    """The int64_t C expression of an integer node whose operands are all integers; raises
    Unsupported for an op without an exact integer form (the next tier serves the call)."""
    args, kw = n.args, n.kwargs

    def i(x) -> str:
        return _as(operand(x), True)

    if packet in ("add", "sub") and len(args) >= 2:
        alpha = kw.get("alpha", args[2] if len(args) > 2 else 1)
        y = i(args[1]) if alpha == 1 else f"fl_imul({i(args[1])}, {c_int(alpha)})"
        return f"fl_i{packet}({i(args[0])}, {y})"
    if packet == "rsub":
        alpha = kw.get("alpha", 1)
        return f"fl_isub({i(args[1])}, fl_imul({i(args[0])}, {c_int(alpha)}))"
    if packet == "div":
        mode = kw.get("rounding_mode")
        if mode in ("trunc", "floor"):
            return f"fl_idiv_{mode}({i(args[0])}, {i(args[1])}, &err)"
        raise Unsupported(f"integer div with rounding {mode}")
    if packet in _INT_BINARY and len(args) >= 2:
        return _INT_BINARY[packet].format(i(args[0]), i(args[1]))
    if packet == "bitwise_not":
        return f"(({i(args[0])}) == 0)" if dtype is torch.bool else f"(~({i(args[0])}))"
    if packet in _INT_UNARY and args:
        return _INT_UNARY[packet].format(i(args[0]))
    if packet == "where":
        return f"(({operand(args[0]).expr}) != 0 ? ({i(args[1])}) : ({i(args[2])}))"
    if packet in _CLAMPS:
        lo, hi = _clamp_bounds(packet, n)
        expr = i(args[0])
        if lo is not None:
            expr = f"fl_imax({expr}, {i(lo)})"
        if hi is not None:
            expr = f"fl_imin({expr}, {i(hi)})"
        return expr
    if packet in ("full", "scalar_tensor"):
        return i(_fill_value(packet, n))
    raise Unsupported(f"{packet} on integers")


def _clamp_bounds(packet: str, n) -> tuple:
    args, kw = n.args, n.kwargs
    if packet == "clamp_max":
        return None, args[1] if len(args) > 1 else kw.get("max")
    if packet == "clamp_min":
        return (args[1] if len(args) > 1 else kw.get("min")), None
    return (args[1] if len(args) > 1 else kw.get("min")), (args[2] if len(args) > 2 else kw.get("max"))


def _fill_value(packet: str, n):
    if packet == "full" and list(n.args[0]) not in ([], [1]):
        raise Unsupported("full of a shape")
    return n.args[1] if packet == "full" else n.args[0]


def _is_operand(x) -> bool:
    """A graph node or a number (not a dtype, a shape, a string)."""
    return hasattr(x, "op") or isinstance(x, (int, float))


def _emit(graph, inputs: dict, node_dtype, scalars: frozenset = frozenset()) -> tuple[list[str], _Value]:
    """C statements computing each graph node into a local of its own C type (int64_t for integer
    and bool nodes, double for floating ones, rounded to their dtype); the output's value.
    `scalars` names the placeholders that are wrapped numbers."""
    lines: list[str] = []
    values: dict = {}

    def operand(x) -> _Value:
        return values[x] if hasattr(x, "op") else _constant(x)

    for n in graph.nodes:
        if n.op == "placeholder":
            dtype = _node_dtype(n, node_dtype)
            values[n] = _Value(inputs[n.name], exact(dtype), dtype, n.name in scalars)
            continue
        if n.op == "output":
            out = n.args[0]
            if isinstance(out, (list, tuple)):
                if len(out) != 1:
                    raise Unsupported("several outputs")
                out = out[0]
            return lines, values[out]
        if n.op != "call_function":
            raise Unsupported(n.op)
        t = n.target
        packet = getattr(t, "_opname", str(t).split(".")[1] if "." in str(t) else str(t))
        dtype = _node_dtype(n, node_dtype)
        integer = exact(dtype)
        inputs_integer = all(operand(x).integer for x in list(n.args) + list(n.kwargs.values()) if _is_operand(x))
        if integer and inputs_integer:
            value = _Value(_int_expr(packet, n, operand, dtype), True)
        else:
            value = _Value(_float_expr(t, packet, n, operand, dtype, node_dtype), False)
        name = f"v{len(values)}"
        expr = _as(value, integer)
        expr = _narrow(expr, dtype) if integer else _round(expr, dtype)
        lines.append(f"{value_type(dtype)} {name} = {expr};")
        values[n] = _Value(name, integer, dtype)
    raise Unsupported("no output")


def _float_expr(t, packet: str, n, operand, dtype, node_dtype) -> str:
    """The double C expression of a node, its operands converted into the dtype it computes in
    (its own; for a comparison, its operands' promoted dtype)."""
    kw = n.kwargs
    math = dtype
    if packet in _COMPARISONS:
        math = _promoted([operand(x) for x in n.args[:2] if _is_operand(x)]) or dtype

    def a(i, node=n):
        v = node.args[i] if i < len(node.args) else None
        return _in(operand(v), math) if _is_operand(v) else c_const(v)

    def k(v) -> str:  # a constant of the op (slope, alpha, beta), as PyTorch's kernel holds it
        return _in(_constant(v), math)

    if t in _UNARY:
        return _UNARY[t].format(a(0))
    if packet in _BINARY and len(n.args) >= 2:
        x, y = a(0), a(1)
        alpha = n.kwargs.get("alpha", n.args[2] if len(n.args) > 2 and packet in ("add", "sub") else None)
        if alpha is not None and packet in ("add", "sub"):
            y = f"(({y}) * {_in(_constant(alpha), math)})"
        mode = kw.get("rounding_mode")
        expr = _BINARY[packet].format(x, y)
        if packet == "div" and mode == "trunc":
            expr = f"trunc({expr})"
        elif packet == "div" and mode == "floor":
            expr = f"fl_div_floor({x}, {y})"
        elif packet == "div" and mode is not None:
            raise Unsupported(f"div rounding {mode}")
        return expr
    if packet in _SPECIAL_UNARY and len(n.args) == 1:
        return _SPECIAL_UNARY[packet].format(a(0))
    if packet in _SPECIAL_BINARY and len(n.args) == 2:
        return _SPECIAL_BINARY[packet].format(a(0), a(1))
    f32 = dtype == torch.float32
    if packet in _SPECIAL_POLY:
        return f"{_SPECIAL_POLY[packet]}({a(0)}, {a(1)}, {int(f32)})"
    if packet == "nextafter":  # the next representable value in the tensor's own precision
        return f"(double)nextafterf((float)({a(0)}), (float)({a(1)}))" if f32 else f"nextafter({a(0)}, {a(1)})"
    if packet == "polygamma":  # the float flavour keeps float32's finite values at the poles
        return f"fl_sp_polygamma{'f' if dtype != torch.float64 else ''}((int64_t){int(n.args[0])}, {a(1)})"
    if packet == "mvlgamma":
        return f"fl_sp_mvlgamma({a(0)}, (int64_t){int(n.args[1] if len(n.args) > 1 else kw['p'])})"
    if packet == "bitwise_not":
        return f"(({a(0)}) == 0.0)" if dtype is torch.bool else f"(double)(~(int64_t)({a(0)}))"
    if packet == "round" and len(n.args) + len(kw) > 1:  # round(x, decimals=d), in the tensor's precision
        d = int(n.args[1] if len(n.args) > 1 else kw["decimals"])
        return (
            f"(double)fl_sp_round_decimalsf((float)({a(0)}), {d})"
            if dtype != torch.float64
            else f"fl_sp_round_decimals({a(0)}, {d})"
        )
    if packet == "rsub":
        return f"(({a(1)}) - ({a(0)}) * {k(kw.get('alpha', 1))})"
    if packet == "where":
        return f"((({operand(n.args[0]).expr}) != 0) ? ({a(1)}) : ({a(2)}))"
    if packet in _CLAMPS or packet == "hardtanh":
        lo, hi = (
            _clamp_bounds(packet, n)
            if packet != "hardtanh"
            else (n.args[1] if len(n.args) > 1 else -1.0, n.args[2] if len(n.args) > 2 else 1.0)
        )
        expr = a(0)
        if lo is not None:
            expr = f"fl_clamp_lo({expr}, {_in(operand(lo), math)})"
        if hi is not None:
            expr = f"fl_clamp_hi({expr}, {_in(operand(hi), math)})"
        return expr
    if packet == "gelu":
        approx = n.args[1] if len(n.args) > 1 else kw.get("approximate", "none")
        x = a(0)
        return (
            f"(0.5*({x})*(1.0+tanh(0.7978845608028654*(({x})+0.044715*({x})*({x})*({x})))))"
            if approx == "tanh"
            else f"(0.5*({x})*(1.0+erf(({x})*0.7071067811865476)))"
        )
    if packet == "elu":
        alpha = n.args[1] if len(n.args) > 1 else kw.get("alpha", 1.0)
        scale = n.args[2] if len(n.args) > 2 else kw.get("scale", 1.0)
        inscale = n.args[3] if len(n.args) > 3 else kw.get("input_scale", 1.0)
        x = a(0)
        scale, alpha, inscale = k(scale), k(alpha), k(inscale)
        return f"(({x}) > 0.0 ? {scale}*({x}) : {scale}*{alpha}*expm1(({x})*{inscale}))"
    if packet == "leaky_relu":
        slope = n.args[1] if len(n.args) > 1 else kw.get("negative_slope", 0.01)
        return f"(({a(0)}) > 0.0 ? ({a(0)}) : ({a(0)})*{k(slope)})"
    if packet == "silu":
        return f"(({a(0)})/(1.0+exp(-({a(0)}))))"
    if packet == "mish":
        return f"(({a(0)})*tanh(log1p(exp({a(0)}))))"
    if packet == "softplus":
        beta = n.args[1] if len(n.args) > 1 else 1.0
        thr = n.args[2] if len(n.args) > 2 else 20.0
        x = a(0)
        beta, thr = k(beta), k(thr)
        return f"((({x})*{beta}) > {thr} ? ({x}) : log1p(exp(({x})*{beta}))/{beta})"
    if packet in ("_to_copy", "clone", "alias", "lift_fresh_copy", "detach"):
        if kw.get("dtype") is torch.bool:  # any nonzero, NaN included, is True
            return f"((double)(({operand(n.args[0]).expr}) != 0))"
        return a(0)  # the local's own type truncates a float stored as an integer
    if packet in ("full", "scalar_tensor"):
        return _as(_constant(_fill_value(packet, n)), False)
    raise Unsupported(str(t))


def generate(f, vals, dtype, out_dtype=None, masks: bool = False) -> tuple[str, str]:
    """C source and symbol of a kernel for this call's signature (raises Unsupported). masks: bool tensors
    may come beside the floating `dtype` (a fused chain's dropout mask): each is loaded as 0 or 1 in the
    computation type, as PyTorch's type promotion converts it before the op."""
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    example, inputs, slot, scalars = [], {}, 0, set()
    n_in = 0
    in_dtypes = []
    for i, v in enumerate(vals):
        if is_fl(v):
            if v.dtype != dtype and not (masks and v.dtype is torch.bool and dtype.is_floating_point):
                raise Unsupported("mixed dtypes")
            in_dtypes.append(v.dtype)
            example.append(torch.ones(1, dtype=v.dtype))
            inputs[f"arg{slot}_1"] = f"x{n_in}"
            n_in += 1
            slot += 1
        elif isinstance(v, torch.Tensor):  # a wrapped number: passed as a scalar argument
            example.append(v.clone())
            inputs[f"arg{slot}_1"] = f"fl_arg_{'int' if exact(v.dtype) else 'num'}(&args[{i}])"
            scalars.add(f"arg{slot}_1")
            slot += 1
        elif isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            raise Unsupported("tensor lists")

    func = f.func
    if f.mutable:  # an in-place op computes what its functional twin does, into its first argument
        base = func._schema.name.split("::")[1].rstrip("_")
        packet = getattr(aten, base, None)
        func = getattr(packet, func._overloadname, None) if packet is not None else None
        if func is None:
            raise Unsupported("no functional twin")

    def fn(*ts):
        it = iter(ts)
        return func(*[next(it) if isinstance(v, torch.Tensor) else v for v in vals[: len(f.arg_names)]])

    kwarg_names = [f.arg_names[i] for i in range(len(vals)) if f.kwarg_only[i]]
    if kwarg_names:  # keyword-only arguments go by name

        def fn(*ts):  # noqa: F811
            it = iter(ts)
            pos, kw = [], {}
            for i, v in enumerate(vals):
                v = next(it) if isinstance(v, torch.Tensor) else v
                if f.kwarg_only[i]:
                    kw[f.arg_names[i]] = v
                else:
                    pos.append(v)
            return func(*pos, **kw)

    # a CustomDecompTable is a Mapping at run time; torch's annotation of make_fx does not say so
    gm = make_fx(fn, decomposition_table=core_aten_decompositions())(*example)  # type: ignore[arg-type]
    lines, result = _emit(gm.graph, inputs, dtype, frozenset(scalars))
    vt = value_type(dtype)
    loads = "\n        ".join(
        f"{vt} x{k} = {'' if in_dtypes[k] == dtype else f'({vt})'}{c_load(f'in[{k}]', in_dtypes[k], f'o{k}')};"
        for k in range(n_in)
    )
    body = "\n        ".join(lines)
    store = c_store("out[0]", out_dtype or dtype, "oo", result.expr, integer=result.integer)
    loop = walk(
        "out[0]",
        {"oo": "out[0]", **{f"o{k}": f"in[{k}]" for k in range(n_in)}},
        f"{loads}\n        {body}\n        if (err) return 2; /* PyTorch raises ZeroDivisionError; the runtime "
        f"says so */\n        {store}",
        # unguarded where nothing can set err (no integer division): a guarded store keeps GCC from vectorizing
        flat_body=f"{loads}\n            {body}\n            {'if (!err) ' if '&err' in body else ''}{store}",
    )
    mixed = [str(d) for d in in_dtypes] if any(d != dtype for d in in_dtypes) else []  # old digests unchanged
    digest = hashlib.sha256(
        ("|".join([f.name, str(dtype), str(out_dtype)] + mixed + lines + [result.expr])).encode()
    ).hexdigest()[:16]
    symbol = f"fl_jit_{digest}"
    what = f"JIT kernel for {f.name} ({str(dtype).replace('torch.', '')})"
    src = prelude(special="fl_sp_" in body) + kernel(
        symbol,
        what,
        f"""if (n_in != {n_in} || n_out < 1) return 3;
    int err = 0; /* set by an integer division by zero */
    {loop}
    return err ? 2 : 0;""",
        n_in=n_in,
        n_out=1,
        n_args=len(vals),
        checked="&err" in body,
    )
    return src, symbol


class PointwiseKernel(Kernel):
    """A pointwise op: one C expression per element, generated from the op traced with PyTorch's
    core-aten decompositions, compiled per argument signature."""

    def _signature(self, vals):
        sig = [self.out_dtype]
        for v in vals:
            if is_fl(v):
                sig.append(("T", v.dtype))
            elif isinstance(v, torch.Tensor):
                sig.append(("W", v.dtype))
            elif isinstance(v, (int, float, bool, str, type(None), torch.dtype)):
                sig.append((type(v).__name__, v))
            else:
                return None
        return tuple(sig)

    # the C++ fast path may replay a call (dispatch.jit_replay): a call's marshalling is the op's own arguments
    replays = True

    def __call__(self, f, dev, vals, site: dict | None = None):
        """The op's result, or NOT_HANDLED. With site, the kernel call's marshalling is recorded there when
        a replay would do what this call did: the kernel cannot fail midway (no integer division)."""
        vals = wrap_numbers(f, vals)
        if f.mutable:  # in-place: the output is the first argument itself
            first = vals[0]
            layouts = (
                ((list(first.shape), list(first.stride()), first.dtype),) if isinstance(first, torch.Tensor) else None
            )
        else:
            layouts = output_layouts(f, vals)
        # the kernel stores one element of self.dtype per output element: nothing else may come out
        if (
            not layouts
            or len(layouts) != 1
            or not isinstance(layouts[0], tuple)
            or len(layouts[0]) != 3
            or layouts[0][2] not in (self.dtype, torch.bool)
        ):
            return NOT_HANDLED
        self.out_dtype = layouts[0][2]
        sig = self._signature(vals)
        if sig is None:
            return NOT_HANDLED
        sig = key(sig, dev)
        entry = self.kernels.get(sig)
        if entry is None and sig not in self.kernels:
            sources: list = []

            def gen():
                sources.append(generate(f, vals, self.dtype, self.out_dtype))
                return sources[-1]

            entry = self.kernels[sig] = self.compile_with(f, dev, gen)
            if entry is not None:
                entry.replays = "&err" not in sources[0][0]  # an integer division's zero divisor stops it midway
        elif entry is not None:
            STATS["memory_hits"] += 1
        if entry is None:
            return NOT_HANDLED
        return run(f, entry, dev, vals, site if entry.replays else None)


def lookup(backend: Any, facts: Any, dtypes: tuple) -> Any:
    """A kernel factory for a pointwise op in a supported dtype, or None."""
    if not (facts.pointwise or facts.func in _PRIMS_POINTWISE) or facts.n_returns != 1:
        return None
    if not dtypes or any(d != dtypes[0] for d in dtypes) or dtypes[0] not in DTYPES:
        return None
    if backend.devices and not (backend.devices[0].props.dtypes >> dtype_code(dtypes[0])) & 1:
        return None
    return PointwiseKernel(backend, facts, dtypes[0])
