"""The JIT tier for ops that work along one dim: scans, sorting and order statistics.

cumsum, cumprod, cummax/cummin, logcumsumexp, sort, topk, kthvalue, median and
nanmedian each take one "row" (all elements along `dim` for a fixed index in
the other dims) at a time. The generated kernel copies a row into a scratch
array of (value, position) pairs, runs the op's step on it, and writes the
row's results through the output descriptors' strides. Sorting is a stable
merge sort with PyTorch's order (NaN is the largest value), so values and
indices match PyTorch's stable sort exactly. Rows of floating dtypes are
handled as doubles, rows of integers and bool as int64_t (exact at any
magnitude; sums and products wrap as PyTorch's do).

The rank, dtypes and the op are fixed in the source; `dim`, sizes and strides
are read at run time."""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from ..runtime import NOT_HANDLED, call_kernel, desc, events, ffi, is_fl, new_tensor, run_native
from .kernel import Kernel, fresh_layouts
from .render import DTYPES, Unsupported, c_load, c_store, exact, kernel, opencl, prelude, value_type, walk

aten = torch.ops.aten


def _dim(v, default=-1):
    return default if v is None else int(v)


# op -> function(vals) giving (kind, dim, extra) where extra is k / descending / ...
OPS: dict = {
    aten.cumsum.default: lambda v: ("cumsum", v[1], 0),
    aten.cumprod.default: lambda v: ("cumprod", v[1], 0),
    aten.cummax.default: lambda v: ("cummax", v[1], 0),
    aten.cummin.default: lambda v: ("cummin", v[1], 0),
    aten.logcumsumexp.default: lambda v: ("logcumsumexp", v[1], 0),
    aten.sort.default: lambda v: ("sort", _dim(v[1]), int(bool(v[2]))),
    aten.sort.stable: lambda v: ("sort", _dim(v[2]), int(bool(v[3]))),
    aten.topk.default: lambda v: ("topk", _dim(v[2]), int(bool(v[3]))),
    aten.kthvalue.default: lambda v: ("kthvalue", _dim(v[2]), int(v[1])),
    aten.median.dim: lambda v: ("median", _dim(v[1]), 0),
    aten.nanmedian.dim: lambda v: ("nanmedian", _dim(v[1]), 0),
    aten.median.default: lambda v: ("median", None, 0),
    aten.nanmedian.default: lambda v: ("nanmedian", None, 0),
}

_PRELUDE = r"""
#include <stdlib.h>
typedef struct { VT v; int64_t i; } fl_vi;
/* PyTorch's order: NaN above everything; equal values keep their positions (stable) */
static inline int fl_before(const fl_vi *a, const fl_vi *b, int desc) {
    int an = a->v != a->v, bn = b->v != b->v;
    if (an || bn) {
        if (an && bn) return a->i < b->i;
        return desc ? an : bn;
    }
    if (a->v != b->v) return desc ? a->v > b->v : a->v < b->v;
    return a->i < b->i;
}
static void fl_msort(fl_vi *x, fl_vi *tmp, int64_t n, int desc) {
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n, a = lo, b = mid, k = lo;
            while (a < mid && b < hi) tmp[k++] = fl_before(&x[b], &x[a], desc) ? x[b++] : x[a++];
            while (a < mid) tmp[k++] = x[a++];
            while (b < hi) tmp[k++] = x[b++];
        }
        memcpy(x, tmp, (size_t)n * sizeof *x);
    }
}
"""

# per kind: the step over the row `r[0..n)` (positions r[j].i); writes through PUT(k, j, value).
# VT is the row's value type (double, or int64_t for integers); ADD and MUL its arithmetic
_STEPS = {
    "cumsum": "VT acc = 0; for (int64_t j = 0; j < n; j++) { acc = ADD(acc, r[j].v); PUT(0, j, acc); }",
    "cumprod": "VT acc = 1; for (int64_t j = 0; j < n; j++) { acc = MUL(acc, r[j].v); PUT(0, j, acc); }",
    # PyTorch: a NaN, or a value >= the running extreme, takes over (so ties report the last position)
    "cummax": (
        "VT acc = 0; int64_t at = 0; for (int64_t j = 0; j < n; j++) {"
        " VT x = r[j].v; if (j == 0 || x != x || (acc == acc && x >= acc)) { acc = x; at = j; }"
        " PUT(0, j, acc); PUT(1, j, (VT)at); }"
    ),
    "cummin": (
        "VT acc = 0; int64_t at = 0; for (int64_t j = 0; j < n; j++) {"
        " VT x = r[j].v; if (j == 0 || x != x || (acc == acc && x <= acc)) { acc = x; at = j; }"
        " PUT(0, j, acc); PUT(1, j, (VT)at); }"
    ),
    "logcumsumexp": (
        "double acc = -INFINITY; for (int64_t j = 0; j < n; j++) { double x = r[j].v;"
        " double hi = acc > x ? acc : x, lo = acc > x ? x : acc;"
        " acc = (x != x || acc != acc) ? NAN : (lo == -INFINITY ? hi : hi + log1p(exp(lo - hi)));"
        " PUT(0, j, acc); }"
    ),
    "sort": (
        "fl_msort(r, tmp, n, (int)EXTRA); for (int64_t j = 0; j < n; j++) { PUT(0, j, r[j].v); PUT(1, j, (VT)r[j].i); }"
    ),
    "topk": (
        "fl_msort(r, tmp, n, (int)EXTRA); int64_t k = out[0].ndim ? out[0].sizes[dim] : 1;"
        " for (int64_t j = 0; j < k; j++) { PUT(0, j, r[j].v); PUT(1, j, (VT)r[j].i); }"
    ),
    "kthvalue": (
        "if (EXTRA < 1 || EXTRA > n) return 2; fl_msort(r, tmp, n, 0);"
        " PUT(0, 0, r[EXTRA - 1].v); PUT(1, 0, (VT)r[EXTRA - 1].i);"
    ),
    # the lower median; a NaN in the row makes it NaN (at the first NaN's position), as PyTorch
    "median": (
        "if (n == 0) return 2; fl_msort(r, tmp, n, 0); int64_t m = (n - 1) / 2;"
        " if (r[n - 1].v != r[n - 1].v) {"
        " int64_t f = n - 1; while (f > 0 && r[f - 1].v != r[f - 1].v) f--; m = f; }"
        " PUT(0, 0, r[m].v); PUT(1, 0, (VT)r[m].i);"
    ),
    "nanmedian": (
        "if (n == 0) return 2; fl_msort(r, tmp, n, 0); int64_t c = n;"
        " while (c > 0 && r[c - 1].v != r[c - 1].v) c--;"
        " int64_t m = c ? (c - 1) / 2 : 0; PUT(0, 0, r[m].v); PUT(1, 0, (VT)r[m].i);"
    ),
}
# arithmetic of a row's values: plain for doubles, wrapping for int64_t
_ARITH = {False: {"ADD": "fl_dadd", "MUL": "fl_dmul"}, True: {"ADD": "fl_iadd", "MUL": "fl_imul"}}
_DOUBLE_ARITH = """
static inline double fl_dadd(double a, double b) { return a + b; }
static inline double fl_dmul(double a, double b) { return a * b; }
"""
_REDUCING = {"kthvalue", "median", "nanmedian"}


def _put(dtypes: tuple, integer: bool) -> str:
    """PUT(k, j, value): store into output k at position j along dim of the current row (values
    of the row's type: int64_t when `integer`, else double)."""
    cases = [
        f"if ((k_) == {k}) {c_store(f'out[{k}]', dt, f'ob[{k}] + (j_) * os[{k}]', '(v_)', integer=integer)}"
        for k, dt in enumerate(dtypes)
    ]
    return "#define PUT(k_, j_, v_) do { " + " else ".join(cases) + " } while (0)"


def generate(name: str, kind: str, extra: int, ndim: int, in_dtype, out_dtypes: tuple) -> tuple[str, str]:
    integer = exact(in_dtype)
    if integer and kind == "logcumsumexp":
        raise Unsupported("logcumsumexp of integers")
    vt = value_type(in_dtype)
    step = _STEPS[kind].replace("EXTRA", f"((int64_t){extra})").replace("VT", vt)
    for macro, fn in _ARITH[integer].items():
        step = step.replace(macro, fn)
    step = step.replace("return 2;", "{ free(r); free(tmp); return 2; }")  # an early exit frees the scratch rows
    load = c_load("in[0]", in_dtype, "io")
    n_out = len(out_dtypes)
    obs = ", ".join(f"ob{k}" for k in range(n_out))
    loop = walk(
        "rin",
        {"ib": "rin", **{f"ob{k}": f"rout[{k}]" for k in range(n_out)}},
        f"int64_t ob[{n_out}] = {{{obs}}};\n"
        f"        for (int64_t j = 0; j < n; j++) {{\n"
        f"            int64_t io = ib + j * rs; r[j].v = {load}; r[j].i = j;\n        }}\n"
        f"        {{ {step} }}",
    )
    key = "|".join(map(str, [name, kind, extra, ndim, in_dtype, out_dtypes]))
    symbol = "fl_jits_" + hashlib.sha256(key.encode()).hexdigest()[:16]
    if opencl():  # a row's scratch copy comes from malloc, which OpenCL C does not have
        raise Unsupported("row kernels in OpenCL C")
    what = f"JIT row kernel for {name} ({kind})"
    src = (
        prelude()
        + _PRELUDE.replace("VT", vt)
        + _DOUBLE_ARITH
        + _put(out_dtypes, integer)
        + kernel(
            symbol,
            what,
            f"""
    /* a 0-dim tensor is one row of one element; `dim` comes from the runtime (-1: the whole tensor) */
    int nd = {ndim}, dim = @DIM@;
    if (n_out != {n_out}) return 3;
    if (dim < 0) dim += nd > 0 ? nd : 1;
    int64_t n = nd ? in[0].sizes[dim] : 1, rs = nd ? in[0].strides[dim] : 0, os[{n_out}];
    int reduced = {int(kind in _REDUCING)} && out[0].ndim != nd;
    for (int k = 0; k < {n_out}; k++) os[k] = (nd && !reduced && out[k].ndim) ? out[k].strides[dim] : 0;
    /* views over every dimension but dim (one row each): the input, and the outputs (a reducing
     * op's output lacks dim; a 0-dim output has no strides to step) */
    fl_tensor_t rin = in[0], rout[{n_out}];
    rin.ndim = 0;
    for (int k = 0; k < {n_out}; k++) {{ rout[k] = out[k]; rout[k].ndim = 0; }}
    for (int d = 0; d < nd; d++) {{
        if (d == dim) continue;
        int od = (reduced && d > dim) ? d - 1 : d;
        for (int k = 0; k < {n_out}; k++) {{
            rout[k].sizes[rin.ndim] = in[0].sizes[d]; rout[k].strides[rin.ndim] = out[k].ndim ? out[k].strides[od] : 0;
        }}
        rin.sizes[rin.ndim] = in[0].sizes[d]; rin.strides[rin.ndim++] = in[0].strides[d];
    }}
    fl_vi *r = malloc((size_t)(n > 0 ? n : 1) * sizeof *r), *tmp = malloc((size_t)(n > 0 ? n : 1) * sizeof *tmp);
    if (!r || !tmp) {{ free(r); free(tmp); return 1; }}
    {loop}
    free(r); free(tmp);
    return 0;""",
            n_in=1,
            n_out=n_out,
            n_args=0,
        )
    )
    return src, symbol


class RowKernel(Kernel):
    """The JIT tier for one along-a-dim op in one input dtype on one backend."""

    def __call__(self, f, dev, vals):
        x = vals[0]
        if not is_fl(x):
            return NOT_HANDLED
        try:
            kind, dim, extra = OPS[f.func](vals)
        except Exception:  # noqa: BLE001 - an argument form we do not parse: not ours
            return NOT_HANDLED
        whole = dim is None
        if not whole and -x.dim() <= dim < x.dim():  # PyTorch's checks in its words (the meta function only declines)
            size = x.shape[dim]
            if kind == "kthvalue" and not 1 <= extra <= size:
                raise RuntimeError(f"kthvalue(): selected number k out of range for dimension {dim % x.dim()}")
            if kind in _REDUCING and size == 0:
                raise IndexError(f"{kind}(): Expected reduction dim {dim % x.dim()} to have non-zero size.")
        if whole and x.numel() == 0:  # PyTorch gives NaN for the median of nothing
            if not x.is_floating_point():
                return NOT_HANDLED
            return torch.full((), float("nan"), dtype=x.dtype, device=x.device)
        layouts = fresh_layouts(f, vals)
        if layouts is None:
            return NOT_HANDLED
        if whole:  # median() of the whole tensor: one row over the flattened values
            x = x.reshape(-1)
            vals = [x] + list(vals[1:])
        out_dtypes = tuple(lay[2] for lay in layouts) + ((torch.int64,) if whole else ())
        sig = (kind, extra, x.dim(), x.dtype, out_dtypes, whole)

        def gen():
            src, sym = generate(f.name, kind, extra, x.dim(), x.dtype, out_dtypes)
            return src.replace("@DIM@", "0" if whole else f"(int)args[{_dim_arg(f)}].i"), sym

        entry = self.kernel_for(f, dev, sig, gen)
        if entry is None:
            return NOT_HANDLED
        if whole:
            return _run_whole(f, entry, dev, x, layouts)
        return run_native(f, entry, dev, vals)


def _dim_arg(f) -> int:
    return f.arg_names.index("dim")


def _run_whole(f, entry, dev, flat, layouts):
    """median()/nanmedian() of a whole tensor: the kernel sees the flattened values as one row
    (dim 0) and writes a value and an index; the op returns the value."""
    shape, stride, dtype = layouts[0]
    value = new_tensor(dev, shape, dtype, stride)
    index = new_tensor(dev, [], torch.int64, [])
    c_in = ffi.new("fl_tensor_t[]", [desc(flat)])
    c_out = ffi.new("fl_tensor_t[]", [desc(value), desc(index)])
    c_args = ffi.new("fl_arg_t[]", 1)
    status = call_kernel(entry, dev, c_in, 1, c_out, 2, c_args, 0, f.name)
    events.STATE.kernels += 1
    if events.STATE.recording is not None:  # a call run_native does not make: a kernel graph cannot hold it
        events.STATE.recording.refuse(f"{f.name} of a whole tensor runs a JIT kernel outside run_native")
    dev.plugin.check(status, f"kernel {f.name}")
    return value


def lookup(backend: Any, facts: Any, dtypes: tuple) -> Any:
    if facts.func not in OPS or len(dtypes) != 1 or dtypes[0] not in DTYPES:
        return None
    return RowKernel(backend, facts, dtypes[0])
