"""The JIT tier for reductions: sum, prod, mean, amax/amin, var/std, argmax/argmin, max/min.

A reduction is one loop nest whatever the op: for each output element, walk
the reduced elements, fold them into an accumulator, finish, store. What
changes between ops is the fold (and, for var/std, a second pass), so the
generated C is that loop with the op's fold spliced in. The reduced dims,
keepdim and the rank are fixed in the source (they decide the loop nest);
sizes and strides are read from the tensor descriptors at run time, so one
compiled kernel serves every shape of that rank. Floating inputs accumulate in
double, which is at least as accurate as PyTorch's float kernels; integer and
bool inputs in int64_t, wrapping on overflow as PyTorch does (exact at any
magnitude). A reduction with no identity over nothing raises PyTorch's error.

Both PyTorch's prims reductions (what torch._decomp lowers mean, var, norms
and losses to) and the aten reductions themselves are served, so a backend
with no reduction kernels still runs them on the device."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from ..runtime import NOT_HANDLED, is_fl, run_native
from .kernel import Kernel, fresh_layouts
from .render import DTYPES, Unsupported, c_const, c_load, c_store, exact, kernel, prelude, value_type, walk

aten = torch.ops.aten
prims = torch.ops.prims


class Spec(NamedTuple):
    kind: str  # sum prod mean amax amin var std argmax argmin max min var_mean std_mean
    dims: tuple | None  # reduced dims (normalised, sorted); None = all
    keepdim: bool
    correction: float = 0.0


def _dims(dim, ndim: int, empty_means_all: bool) -> tuple | None:
    if dim is None:
        return None
    if isinstance(dim, int):
        dim = [dim]
    if not dim:
        return None if empty_means_all else ()
    return tuple(sorted({d % max(ndim, 1) for d in dim}))


def _n(vals) -> int:
    return vals[0].dim()


def _corr(c) -> float:
    return 1.0 if c is None else float(c)


# op -> function(vals) giving its Spec; vals are normalised (schema order)
OPS: dict[Any, Callable[[list], Spec]] = {
    aten.sum.default: lambda v: Spec("sum", None, False),
    aten.sum.dim_IntList: lambda v: Spec("sum", _dims(v[1], _n(v), True), bool(v[2])),
    aten.prod.default: lambda v: Spec("prod", None, False),
    aten.prod.dim_int: lambda v: Spec("prod", _dims(v[1], _n(v), True), bool(v[2])),
    aten.mean.default: lambda v: Spec("mean", None, False),
    aten.mean.dim: lambda v: Spec("mean", _dims(v[1], _n(v), True), bool(v[2])),
    aten.amax.default: lambda v: Spec("amax", _dims(v[1], _n(v), True), bool(v[2])),
    aten.amin.default: lambda v: Spec("amin", _dims(v[1], _n(v), True), bool(v[2])),
    aten.var.correction: lambda v: Spec("var", _dims(v[1], _n(v), True), bool(v[3]), _corr(v[2])),
    aten.std.correction: lambda v: Spec("std", _dims(v[1], _n(v), True), bool(v[3]), _corr(v[2])),
    aten.var_mean.correction: lambda v: Spec("var_mean", _dims(v[1], _n(v), True), bool(v[3]), _corr(v[2])),
    aten.std_mean.correction: lambda v: Spec("std_mean", _dims(v[1], _n(v), True), bool(v[3]), _corr(v[2])),
    aten.argmax.default: lambda v: Spec("argmax", _dims(v[1], _n(v), True), bool(v[2])),
    aten.argmin.default: lambda v: Spec("argmin", _dims(v[1], _n(v), True), bool(v[2])),
    aten.max.dim: lambda v: Spec("max", _dims(v[1], _n(v), False), bool(v[2])),
    aten.min.dim: lambda v: Spec("min", _dims(v[1], _n(v), False), bool(v[2])),
    aten.max.default: lambda v: Spec("amax", None, False),
    aten.min.default: lambda v: Spec("amin", None, False),
    prims.sum.default: lambda v: Spec("sum", _dims(v[1], _n(v), False), False),
    prims.prod.default: lambda v: Spec("prod", _dims(v[1], _n(v), False), False),
    prims.amax.default: lambda v: Spec("amax", _dims(v[1], _n(v), False), False),
    prims.amin.default: lambda v: Spec("amin", _dims(v[1], _n(v), False), False),
    prims.var.default: lambda v: Spec("var", _dims(v[1], _n(v), False), False, _corr(v[2])),
}

# per kind: accumulator declarations, the fold of one value `v` at reduced position `r`, and the
# result(s); `at` (an index) is an int64_t whatever the values are
_FOLD = {
    "sum": ("double acc = 0.0;", "acc += v;", ["acc"]),
    "mean": ("double acc = 0.0;", "acc += v;", ["acc / (double)nred"]),
    "prod": ("double acc = 1.0;", "acc *= v;", ["acc"]),
    # NaN wins and stays (PyTorch propagates NaN through max/min reductions)
    "amax": (
        "double acc = -INFINITY; int nan = 0;",
        "if (v != v) { acc = v; nan = 1; } else if (!nan && v > acc) acc = v;",
        ["acc"],
    ),
    "amin": (
        "double acc = INFINITY; int nan = 0;",
        "if (v != v) { acc = v; nan = 1; } else if (!nan && v < acc) acc = v;",
        ["acc"],
    ),
    # first index of the extreme; the first NaN counts as the extreme
    "argmax": (
        "double acc = -INFINITY; int64_t at = 0; int nan = 0;",
        "if (!nan && (v != v || v > acc)) { acc = v; at = r; nan = (v != v); }",
        ["at"],
    ),
    "argmin": (
        "double acc = INFINITY; int64_t at = 0; int nan = 0;",
        "if (!nan && (v != v || v < acc)) { acc = v; at = r; nan = (v != v); }",
        ["at"],
    ),
}
# integer and bool inputs: exact int64_t folds (sums and products wrap as PyTorch's do)
_FOLD_INT = {
    "sum": ("int64_t acc = 0;", "acc = fl_iadd(acc, v);", ["acc"]),
    "prod": ("int64_t acc = 1;", "acc = fl_imul(acc, v);", ["acc"]),
    "amax": ("int64_t acc = INT64_MIN;", "if (v > acc) acc = v;", ["acc"]),
    "amin": ("int64_t acc = INT64_MAX;", "if (v < acc) acc = v;", ["acc"]),
    "argmax": ("int64_t acc = INT64_MIN; int64_t at = -1;", "if (at < 0 || v > acc) { acc = v; at = r; }", ["at"]),
    "argmin": ("int64_t acc = INT64_MAX; int64_t at = -1;", "if (at < 0 || v < acc) { acc = v; at = r; }", ["at"]),
}
for _folds in (_FOLD, _FOLD_INT):
    _folds["max"] = (_folds["argmax"][0], _folds["argmax"][1], ["acc", "at"])
    _folds["min"] = (_folds["argmin"][0], _folds["argmin"][1], ["acc", "at"])
# the results that are integers whatever the input is (indices)
_INDEX_RESULTS = {"at"}
# var/std: the mean in a first pass, then squared deviations (two-pass: no cancellation)
_VAR_INIT = "double acc = 0.0;"
_VAR_FOLD = "acc += v;"
_VAR_RESULTS = {"var": ["var"], "std": ["sqrt(var)"], "var_mean": ["var", "mean"], "std_mean": ["sqrt(var)", "mean"]}


def generate(
    name: str, spec: Spec, ndim: int, in_dtype, out_dtypes: tuple, n_in: int = 1, n_args: int = 1
) -> tuple[str, str]:
    """C source and symbol of the kernel for one (op kind, rank, reduced dims, dtypes)."""
    red = [1 if spec.dims is None or d in spec.dims else 0 for d in range(ndim)]
    integer = exact(in_dtype)
    # the reduced dimensions of the current output element: `r` counts them (argmax's index)
    walk_red = (
        "{ rin.offset = ib; int64_t r = 0; (void)r;\n        "
        + walk(
            "rin",
            {"io": "rin"},
            f"{value_type(in_dtype)} v = {c_load('in[0]', in_dtype, 'io')};\n        FOLD\n        r++;",
        )
        + " }"
    )
    if integer and spec.kind not in _FOLD_INT:  # mean/var/std of integers: PyTorch refuses them
        raise Unsupported(f"{spec.kind} of {in_dtype}")
    if spec.kind in _VAR_RESULTS:
        divisor = f"fmax(0.0, (double)nred - {c_const(spec.correction)})"
        body = (
            _VAR_INIT
            + "\n        "
            + walk_red.replace("FOLD", _VAR_FOLD)
            + "\n        double mean = acc / (double)nred; acc = 0.0;\n        "
            + walk_red.replace("FOLD", "acc += (v - mean) * (v - mean);")
            + f"\n        double var = acc / {divisor};"
        )
        results = _VAR_RESULTS[spec.kind]
    else:
        init, fold, results = (_FOLD_INT if integer else _FOLD)[spec.kind]
        body = init + "\n        " + walk_red.replace("FOLD", fold)
    if len(results) != len(out_dtypes):
        raise Unsupported("outputs")
    pairs = zip(out_dtypes, results, strict=True)
    stores = "\n        ".join(
        c_store(f"out[{k}]", dt, f"ob{k}", e, integer=integer or e in _INDEX_RESULTS) for k, (dt, e) in enumerate(pairs)
    )
    key = "|".join([name, spec.kind, str(red), str(spec.keepdim), str(spec.correction), str(in_dtype), str(out_dtypes)])
    symbol = "fl_jitr_" + hashlib.sha256(key.encode()).hexdigest()[:16]
    n_out = len(out_dtypes)
    outer = walk("kin", {"ib": "kin", **{f"ob{k}": f"kout[{k}]" for k in range(n_out)}}, f"{body}\n        {stores}")
    what = f"JIT reduction kernel for {name} ({spec.kind} over dims {red}, keepdim={int(spec.keepdim)})"
    red_c = ", ".join(map(str, red + [0]))
    src = prelude() + kernel(
        symbol,
        what,
        f"""const int red[{ndim + 1}] = {{{red_c}}};
    if (n_in < 1 || n_out != {n_out} || in[0].ndim != {ndim}) return 3;
    /* views of the input and outputs over the kept dimensions (the outer walk, one output element
     * each) and of the input over the reduced ones (the inner walk, from the element's offset) */
    fl_tensor_t kin = in[0], rin = in[0], kout[{n_out}];
    int od = 0;
    int64_t nred = 1;
    kin.ndim = rin.ndim = 0;
    for (int j = 0; j < {n_out}; j++) {{ kout[j] = out[j]; kout[j].ndim = 0; }}
    for (int d = 0; d < {ndim}; d++) {{
        if (red[d]) {{
            rin.sizes[rin.ndim] = in[0].sizes[d]; rin.strides[rin.ndim++] = in[0].strides[d]; nred *= in[0].sizes[d];
            if ({int(spec.keepdim)}) od++;
        }} else {{
            for (int j = 0; j < {n_out}; j++) {{
                kout[j].sizes[kin.ndim] = in[0].sizes[d]; kout[j].strides[kin.ndim] = out[j].strides[od];
            }}
            kin.sizes[kin.ndim] = in[0].sizes[d]; kin.strides[kin.ndim++] = in[0].strides[d];
            od++;
        }}
    }}
    {outer}
    return 0;""",
        n_in=n_in,
        n_out=n_out,
        n_args=n_args,
    )
    return src, symbol


class ReduceKernel(Kernel):
    """The JIT tier for one reduction op in one input dtype on one backend."""

    def __call__(self, f, dev, vals):
        x = vals[0]
        if not is_fl(x) or any(is_fl(v) for v in vals[1:]):
            return NOT_HANDLED
        try:
            spec = OPS[f.func](vals)
        except Exception:  # noqa: BLE001 - an argument form we do not parse: not ours
            return NOT_HANDLED
        layouts = fresh_layouts(f, vals)
        if layouts is None:
            return NOT_HANDLED
        out_dtypes = tuple(lay[2] for lay in layouts)
        sig = (spec, x.dim(), x.dtype, out_dtypes)
        entry = self.kernel_for(f, dev, sig, lambda: generate(f.name, spec, x.dim(), x.dtype, out_dtypes, 1, len(vals)))
        if entry is None:
            return NOT_HANDLED
        return run_native(f, entry, dev, vals)


def lookup(backend: Any, facts: Any, dtypes: tuple) -> Any:
    """A JIT kernel factory for a reduction in a supported dtype, or None."""
    if facts.func not in OPS or len(dtypes) != 1 or dtypes[0] not in DTYPES:
        return None
    return ReduceKernel(backend, facts, dtypes[0])
