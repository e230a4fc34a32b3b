"""The JIT tier for gather and scatter: generated kernels for a backend with no indexing kernels.

gather, scatter (src / value), scatter_add, scatter.reduce and
scatter_reduce.two are one loop over the index tensor each: read an index,
check it, and either load from `self` at it (gather) or fold `src` into the
output at it (the scatters). The fold is what differs, so it is spliced into
a fixed loop, as for reductions (reduce.py). index_select, embedding, flip,
roll and advanced indexing decompose into these (torch_fl/dispatch/decompositions/general.py),
which is how a chip with a few dozen primitive kernels indexes at all.

Rank and dtypes are fixed in the source, sizes, strides and `dim` are read
at run time. An out-of-range index makes the kernel return FL_ERR_INVALID
before it writes past anything; the runtime raises an IndexError naming the
dimension and its size, as PyTorch does."""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from ..errors import KernelError
from ..runtime import NOT_HANDLED, is_fl, run_native
from .kernel import Kernel
from .render import (
    DTYPES,
    Unsupported,
    address_space,
    c_load,
    c_store,
    exact,
    kernel,
    opencl,
    prelude,
    value_type,
    walk,
)

aten = torch.ops.aten

# reduce name -> fold of the current value `a` and the incoming `v` (floating dtypes, in double)
_SCATTER_FOLDS = {
    "sum": "a + v",
    "prod": "a * v",
    "mean": "a + v",
    "amax": "fl_max(a, v)",
    "amin": "fl_min(a, v)",
    "add": "a + v",
    "multiply": "a * v",
}
# the same folds for integer and bool dtypes, exact in int64_t (wrapping as PyTorch does)
_INT_FOLDS = {
    "a + v": "fl_iadd(a, v)",
    "a * v": "fl_imul(a, v)",
    "fl_max(a, v)": "fl_imax(a, v)",
    "fl_min(a, v)": "fl_imin(a, v)",
    "v": "v",
}


def _spec(f, vals) -> tuple:
    """(kind, fold, include_self, value_arg) for this call; raises KeyError for what is not served."""
    func = f.func
    base = func._schema.name.split("::")[1].rstrip("_")
    ov = func._overloadname
    if base == "gather":
        return ("gather", None, True, None)
    if base == "scatter_add":
        return ("scatter", "a + v", True, None)
    if base == "scatter" and ov in ("src", "value"):
        return ("scatter", "v", True, 3 if ov == "value" else None)
    if base == "scatter" and ov in ("reduce", "value_reduce"):
        return ("scatter", _SCATTER_FOLDS[vals[4]], True, 3 if ov == "value_reduce" else None)
    if base == "scatter_reduce" and ov == "two":
        red = vals[4]
        return ("scatter_mean" if red == "mean" else "scatter", _SCATTER_FOLDS[red], bool(vals[5]), None)
    raise KeyError(f.name)


_INDEX_TYPES = {
    torch.int64: "int64_t",
    torch.int32: "int32_t",
    torch.int16: "int16_t",
    torch.int8: "int8_t",
    torch.uint8: "uint8_t",
}
SERVED = {
    aten.gather.default,
    aten.scatter_add.default,
    aten.scatter_add_.default,
    aten.scatter.src,
    aten.scatter.value,
    aten.scatter_.src,
    aten.scatter_.value,
    aten.scatter.reduce,
    aten.scatter.value_reduce,
    aten.scatter_.reduce,
    aten.scatter_.value_reduce,
    aten.scatter_reduce.two,
    aten.scatter_reduce_.two,
}


_load, _store = c_load, c_store


# every element of the index: its offsets in the index, in S (same position) and in T off dim
# (Tz: T's strides with dim's zeroed), then T's position along dim read from the index
def _walk() -> str:
    load = f"(int64_t)(({address_space()}const IDX *)ix->data)[io]"
    return walk(
        "(*ix)",
        {"io": "(*ix)", "so": "(*S)", "to": "Tz"},
        f"""int64_t k = {load};
        if (k < 0 || k >= T->sizes[dim]) return 2;
        to += k * T->strides[dim];
        BODY""",
    )


def generate(
    name: str, spec: tuple, ndim: int, dtype, inplace: bool, index_dtype=torch.int64, n_in: int = 3, n_args: int = 4
) -> tuple[str, str]:
    kind, fold, include_self, value_arg = spec
    integer = exact(dtype)  # integers move and fold as int64_t, exactly
    vt = value_type(dtype)
    if integer and fold is not None:
        fold = _INT_FOLDS[fold]

    def store(t: str, off: str, expr: str) -> str:
        return _store(t, dtype, off, expr, integer=integer)

    pre, post = "", ""
    if kind == "gather":  # T = self (read at the index), S = out (written where the index is)
        setup = "const fl_tensor_t *T = &in[0], *S = &out[0];"
        body = store("(*S)", "so", _load("(*T)", dtype, "to"))
    else:  # T = out (written at the index), S = src (read where the index is)
        setup = "const fl_tensor_t *T = &out[0], *S = &in[2];"
        number = f"fl_arg_{'int' if integer else 'num'}(&args[{value_arg}])"
        v = number if value_arg is not None else _load("(*S)", dtype, "so")
        if not inplace:  # the functional form starts from a copy of self
            copy = store("out[0]", "b", _load("in[0]", dtype, "a"))
            pre += "\n    " + walk("in[0]", {"a": "in[0]", "b": "out[0]"}, copy)
        if value_arg is not None:
            setup = "const fl_tensor_t *T = &out[0], *S = &in[1];"  # no src: walk the index's own strides
        if include_self and kind == "scatter":
            load = _load("(*T)", dtype, "to")
            body = f"{{ {vt} a = {load}, v = {v}; (void)a; {store('(*T)', 'to', fold)} }}"
        else:  # positions the index reaches start over (from src alone, or counted for the mean)
            pre += """
    int64_t span = 1;
    for (int d = 0; d < nd; d++) span += (T->sizes[d] - 1) * T->strides[d];
    int64_t *count = calloc((size_t)(span > 0 ? span : 1), sizeof *count);
    if (!count) return 1;"""
            cond = "0" if include_self else "count[c] == 0"
            body = (
                f"{{ {vt} a = {_load('(*T)', dtype, 'to')}, v = {v}; int64_t c = to - T->offset;\n"
                f"          a = ({cond}) ? v : ({fold}); count[c]++; {store('(*T)', 'to', 'a')} }}"
            )
            if kind == "scatter_mean":
                own = 1 if include_self else 0
                walk_out = "\n    " + walk(
                    "(*T)",
                    {"to": "(*T)"},
                    f"""int64_t c = count[to - T->offset] + {own};
        if (count[to - T->offset] > 0) {{
            {_mean_store(dtype, integer)}
        }}""",
                )
                post += walk_out
            post += "\n    free(count);"
    loop = _walk().replace("BODY", body).replace("IDX", _INDEX_TYPES[index_dtype])
    if "count" in pre:  # free the counts on the error path too
        loop = loop.replace("return 2;", "{ free(count); return 2; }")
    key = "|".join(map(str, [name, spec, ndim, dtype, inplace, index_dtype]))
    symbol = "fl_jiti_" + hashlib.sha256(key.encode()).hexdigest()[:16]
    if opencl() and "calloc" in pre:  # a count per position comes from calloc, which OpenCL C does not have
        raise Unsupported(f"{kind} without self in OpenCL C")
    src = (
        prelude()
        + ("" if opencl() else "#include <stdlib.h>\n")
        + kernel(
            symbol,
            f"JIT {kind} kernel for {name}",
            f"""const int nd = {ndim};
    int dim = (int)args[1].i;
    if (dim < 0) dim += nd;
    const fl_tensor_t *ix = &in[1];
    {setup}
    if (dim < 0 || dim >= nd || ix->ndim != nd) return 3;
    fl_tensor_t Tz = *T;
    Tz.strides[dim] = 0;
    {pre}
    {loop}
    {post}
    return 0;""",
            n_in=n_in,
            n_out=1,
            n_args=n_args,
            parallel=kind == "gather",
            checked=True,
        )
    )
    return src, symbol


def _mean_store(dtype, integer: bool) -> str:
    """The mean of the folded sum `a` over `c` values: floor division for integers, as PyTorch."""
    if integer:
        return f"int err = 0; int64_t a = fl_idiv_floor({_load('(*T)', dtype, 'to')}, c, &err); (void)err; " + _store(
            "(*T)", dtype, "to", "a", integer=True
        )
    return f"double a = {_load('(*T)', dtype, 'to')} / (double)c; " + _store("(*T)", dtype, "to", "a")


_REPLAYABLE = {aten.gather.default}


class IndexKernel(Kernel):
    """The JIT tier for one gather/scatter op in one dtype on one backend."""

    @property
    def replays(self) -> bool:
        """Whether the C++ fast path may replay a call (dispatch.jit_replay): gather's. Its kernel writes only
        its output, so a replayed call that meets a bad index and goes back to Python (which raises the
        IndexError) is rerun from scratch. Not the scatters: a scatter_add_ stopped midway has folded part
        of src into self, and the rerun would fold it again."""
        return self.f.func in _REPLAYABLE

    def __call__(self, f, dev, vals, site: dict | None = None):
        x, index = vals[0], vals[2]
        if not is_fl(x) or not is_fl(index) or index.dtype not in _INDEX_TYPES:
            return NOT_HANDLED
        if x.dim() == 0 or index.dim() != x.dim() or x.dtype not in DTYPES:
            return NOT_HANDLED  # 0-dim and rank-mismatch forms: PyTorch's own checks run on the next tier
        if (
            len(vals) > 3
            and isinstance(vals[3], torch.Tensor)
            and (not is_fl(vals[3]) or vals[3].dtype != x.dtype or vals[3].dim() != x.dim())
        ):
            return NOT_HANDLED
        try:
            spec = _spec(f, vals)
        except KeyError:
            return NOT_HANDLED
        inplace = bool(f.mutable)
        sig = (spec, x.dim(), x.dtype, inplace, index.dtype)
        n_in = sum(1 for v in vals if is_fl(v))
        entry = self.kernel_for(
            f, dev, sig, lambda: generate(f.name, spec, x.dim(), x.dtype, inplace, index.dtype, n_in, len(vals))
        )
        if entry is None:
            return NOT_HANDLED
        try:
            return run_native(f, entry, dev, vals, None, site if self.replays else None)
        except KernelError as e:
            if "FL_ERR_INVALID" not in str(e):
                raise
            dim = vals[1] % x.dim()
            size = x.shape[dim]
            raise KernelError(
                f"{f.name}: an index in `index` is out of bounds for dimension {dim} with size "
                f"{size} (valid indices are 0..{size - 1})",
                e.status,
            ) from None


def lookup(backend: Any, facts: Any, dtypes: tuple) -> Any:
    if facts.func not in SERVED or not dtypes or dtypes[0] not in DTYPES:
        return None
    return IndexKernel(backend, facts, dtypes[0])
