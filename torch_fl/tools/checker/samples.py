"""Realistic calls of aten overloads, for checking kernels against PyTorch.

Why record rather than invent: a kernel is called with whatever a real model's
ops produce (broadcast shapes, scalars, keyword defaults, odd strides).
PyTorch's own OpInfo database has sample inputs for ~700 operators; running
them on CPU under a dispatch mode captures every aten overload they reach,
backward ops included (the samples are also differentiated). Captured calls
keep their exact arguments; `variants` adds non-contiguous copies.

Which OpInfos to run for an overload: those whose names share a word with it
("native_layer_norm_backward" -> layer_norm), plus hints for names that share
none (convolution -> conv2d)."""

from __future__ import annotations

import re
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

import torch
from torch.utils._python_dispatch import TorchDispatchMode

if TYPE_CHECKING:
    from torch.testing._internal.opinfo.core import OpInfo

GENERIC = {
    "native",
    "backward",
    "forward",
    "data",
    "with",
    "legit",
    "no",
    "update",
    "stats",
    "training",
    "out",
    "default",
    "self",
    "tensor",
    "scalar",
    "mode",
    "int",
    "dim",
    "intlist",
    "correction",
    "dims",
    "from",
    "to",
    "p",
    "float",
    "decimals",
    "start",
    "end",
    "safe",
    "unsafe",
    "functional",
    "nn",
    "aten",
    "fl",
    "t",
    "opt",
    "list",
    "input",
    "nll2d",
    "2d",
    "1d",
    "dense",
    "with_indices",
}
HINTS = {
    "convolution": ["nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv_transpose2d"],
    "mm": ["mm", "matmul"],
    "bmm": ["bmm", "matmul"],
    "addmm": ["addmm", "nn.functional.linear"],
    "mv": ["mv"],
    "dot": ["dot"],
    "threshold": ["nn.functional.relu", "nn.functional.threshold"],
    "_softmax": ["softmax"],
    "_log_softmax": ["log_softmax"],
    "_safe_softmax": ["softmax"],
    "nll_loss_forward": ["nn.functional.nll_loss", "nn.functional.cross_entropy"],
    "nll_loss2d_forward": ["nn.functional.nll_loss"],
    "max_pool2d_with_indices": ["nn.functional.max_pool2d"],
    "avg_pool2d": ["nn.functional.avg_pool2d"],
    "_adaptive_avg_pool2d": ["nn.functional.adaptive_avg_pool2d"],
    "native_batch_norm": ["nn.functional.batch_norm"],
    "_native_batch_norm_legit": ["nn.functional.batch_norm"],
    "_native_batch_norm_legit_no_training": ["nn.functional.batch_norm"],
    "_batch_norm_with_update": ["nn.functional.batch_norm"],
    "_batch_norm_no_update": ["nn.functional.batch_norm"],
    "batch_norm_backward": ["nn.functional.batch_norm"],
    "native_layer_norm": ["nn.functional.layer_norm"],
    "native_group_norm": ["nn.functional.group_norm"],
    "embedding": ["nn.functional.embedding"],
    "embedding_dense_backward": ["nn.functional.embedding"],
    "native_dropout": ["nn.functional.dropout"],
    "gelu": ["nn.functional.gelu"],
    "silu": ["nn.functional.silu"],
    "elu": ["nn.functional.elu"],
    "hardtanh": ["nn.functional.hardtanh"],
    "leaky_relu": ["nn.functional.leaky_relu"],
    "relu": ["nn.functional.relu"],
    "sigmoid": ["sigmoid"],
    "tanh": ["tanh"],
    "copy": ["clone", "contiguous"],
    "fill": ["fill", "zeros_like", "ones_like"],
    "zero": ["zero_"],
    "uniform": ["rand_like", "nn.functional.dropout"],
    "normal": ["randn_like", "normal"],
    "bernoulli": ["bernoulli", "nn.functional.dropout"],
    "linalg_vector_norm": ["linalg.vector_norm", "norm"],
    "var_mean": ["var_mean"],
    "std_mean": ["std_mean"],
    "where": ["where"],
    "masked_fill": ["masked_fill"],
    "index_select": ["index_select"],
    "gather": ["gather"],
    "scatter_add": ["scatter_add"],
    "cat": ["cat"],
    "stack": ["stack"],
    "rsub": ["rsub"],
}

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

# one recorded call: the overload, its positional arguments and its keyword arguments
Call = tuple[torch._ops.OpOverload, tuple[Any, ...], dict[str, Any]]


def _words(name: str) -> set[str]:
    return {w for w in re.split(r"[._:]+", name.lower()) if w and w not in GENERIC}


def base_name(op: str) -> str:
    """aten::add_.Tensor -> add_ ; fl::conv_bn_relu -> conv_bn_relu"""
    return op.split("::", 1)[-1].split(".", 1)[0]


def candidate_opinfos(op: str, op_db: Iterable[OpInfo], exact: bool = True) -> list[OpInfo]:
    base = base_name(op)
    stem = base.rstrip("_")
    wanted = set(HINTS.get(stem, [])) | set(HINTS.get(base, []))
    words = _words(stem)
    out = []
    for info in op_db:
        names = {info.name, getattr(info, "aten_name", None) or ""} | {a.name for a in getattr(info, "aliases", ())}
        if exact:
            if info.name in wanted or stem in names:
                out.append(info)
        elif any(_words(n) & words for n in names if n):
            out.append(info)
    return out


def snapshot(t: torch.Tensor) -> torch.Tensor:
    """An independent copy with exactly t's sizes, strides and storage offset."""
    if t.layout != torch.strided or t.device.type != "cpu":
        return t
    storage = t.untyped_storage()
    copy = torch.empty(0, dtype=t.dtype)
    copy.set_(storage.clone(), t.storage_offset(), t.shape, t.stride())
    return copy.requires_grad_(False)


def _snap(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return snapshot(v.detach())
    if isinstance(v, (list, tuple)):
        return type(v)(_snap(x) for x in v)
    return v


class Recorder(TorchDispatchMode):
    """Captures calls of the target overloads (at most `limit` per overload and dtype)."""

    def __init__(self, targets: set[str], limit: int) -> None:
        super().__init__()
        self.targets = targets
        self.limit = limit
        self.calls: dict[str, dict[torch.dtype | None, list]] = defaultdict(lambda: defaultdict(list))

    def __torch_dispatch__(
        self, func: torch._ops.OpOverload, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        name = func.name()
        if "::" not in name:
            name = "aten::" + name
        if func._overloadname != "default" and not name.endswith("." + func._overloadname):
            name = f"{name}.{func._overloadname}"
        if name in self.targets:
            dtype = next((a.dtype for a in _tensors(args, kwargs)), None)
            bucket = self.calls[name][dtype]
            if len(bucket) < self.limit:
                bucket.append((func, _snap(args), _snap(kwargs)))
        return func(*args, **kwargs)


def _tensors(args: Iterable[Any], kwargs: dict[str, Any]) -> Iterator[torch.Tensor]:
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (x for x in v if isinstance(x, torch.Tensor))


def _op_db() -> list[OpInfo]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    return op_db


def _run_opinfo(rec: Recorder, info: OpInfo, dtypes: Iterable[torch.dtype], samples_per_opinfo: int) -> None:
    for dtype in sorted(dtypes, key=str):
        try:
            if dtype not in info.supported_dtypes("cpu"):
                continue
        except Exception:
            continue
        grad = dtype in (torch.float32, torch.float64) and info.supports_autograd
        try:
            samples = list(info.sample_inputs("cpu", dtype, requires_grad=grad))[:samples_per_opinfo]
        except Exception:
            continue
        for sample in samples:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    with rec:
                        out = info.op(sample.input, *sample.args, **sample.kwargs)
                        if grad:
                            leaves = [
                                t for t in _tensors([sample.input, *sample.args], sample.kwargs) if t.requires_grad
                            ]
                            outs = [
                                o
                                for o in (out if isinstance(out, (list, tuple)) else [out])
                                if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point()
                            ]
                            if outs and leaves:
                                total = sum((o.float() * torch.randn_like(o, dtype=torch.float)).sum() for o in outs)
                                assert isinstance(total, torch.Tensor), "a sum of one or more tensors"
                                torch.autograd.grad(total, leaves, allow_unused=True)
            except Exception:
                continue


def record(
    targets: dict[str, list[torch.dtype]], limit: int = 4, samples_per_opinfo: int = 5
) -> dict[str, dict[torch.dtype | None, list[Call]]]:
    """For each target overload, captured CPU calls per dtype it declares.

    Two passes: OpInfos named like the overload (or hinted) first; OpInfos
    sharing a word with it only for overloads the first pass did not reach."""
    op_db = _op_db()
    sources = {src for op in targets for src, _how in _sources_of(op)}
    rec = Recorder(set(targets) | sources, limit)
    done: set[str] = set()
    for exact in (True, False):
        plan: dict[str, tuple] = {}
        for op, dtypes in targets.items():
            if op in rec.calls or op in CUSTOM:
                continue
            if any(src in rec.calls for src, _how in _sources_of(op)):
                continue
            for info in candidate_opinfos(op, op_db, exact):
                key = info.name + "|" + info.variant_test_name
                if key in done:
                    continue
                plan.setdefault(key, (info, set()))[1].update(dtypes)
        for key, (info, dtypes) in plan.items():
            done.add(key)
            _run_opinfo(rec, info, dtypes, samples_per_opinfo)
    calls: dict[str, dict] = {op: dict(by_dtype) for op, by_dtype in rec.calls.items()}
    for op, dtypes in targets.items():
        if op in CUSTOM:
            calls[op] = {dt: CUSTOM[op](dt) for dt in dtypes}
        elif op not in calls:
            derived = _derive(op, calls)
            if derived:
                calls[op] = derived
    return calls


# -- calls for overloads no OpInfo reaches ---------------------------------------


def _overload(op: str) -> torch._ops.OpOverload | None:
    ns, rest = op.split("::", 1)
    name, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, ns), name, None)
    if packet is None:
        return None
    return getattr(packet, overload or "default", None)


def _sources_of(op: str) -> list[tuple[str, str]]:
    base, _, overload = op.partition(".")
    sources = []
    if base.endswith("_"):
        sources.append((base[:-1] + ("." + overload if overload else ""), "inplace"))
    if "Scalar" in overload:
        sources.append((base + "." + overload.replace("Scalar", "Tensor"), "scalar"))
        if base.endswith("_"):
            sources.append((base[:-1] + "." + overload.replace("Scalar", "Tensor"), "both"))
    return sources


def _derive(op: str, calls: dict) -> dict:
    """In-place `x_` from captured `x` calls; `.Scalar` overloads from `.Tensor`
    ones (the other tensor replaced by one of its values). Each derived call is
    validated by running it on CPU."""
    func = _overload(op)
    if func is None:
        return {}
    out: dict = {}
    for src, how in _sources_of(op):
        for dtype, recorded in calls.get(src, {}).items():
            for _f, args, kwargs in recorded:
                args = list(args)
                if how in ("scalar", "both"):
                    if len(args) < 2 or not isinstance(args[1], torch.Tensor):
                        continue
                    other = args[1]
                    args[1] = other.flatten()[0].item() if other.numel() else 2
                try:
                    trial = [snapshot(a) if isinstance(a, torch.Tensor) else a for a in args]
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        func(*trial, **kwargs)
                except Exception:
                    continue
                out.setdefault(dtype, []).append((func, tuple(args), kwargs))
    return out


def _sdpa_samples(dtype: torch.dtype) -> list[Call]:
    gen = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype)

    fwd = torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default
    calls: list[Call] = []
    for (b, h, lq, lk, e, ev), causal in (
        ((2, 3, 5, 7, 8, 4), False),
        ((1, 2, 6, 6, 16, 16), True),
        ((0, 2, 4, 4, 8, 8), False),
    ):
        q = r(b, lq, h, e).transpose(1, 2)  # the (B, L, H, E) layout real models produce
        k, v = r(b, h, lk, e), r(b, h, lk, ev)
        calls.append((fwd, (q, k, v, None, 0.0, causal, False), {}))
    bias = r(2, 1, 5, 7)
    calls.append((fwd, (r(2, 3, 5, 8), r(2, 3, 7, 8), r(2, 3, 7, 4), bias, 0.0, False, False), {"scale": 0.3}))
    return calls


def _sdpa_backward_samples(dtype: torch.dtype) -> list[Call]:
    fwd = torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default
    bwd = torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward.default
    from ...dispatch import sdpa_forward

    calls = []
    for f, args, kwargs in _sdpa_samples(dtype):
        assert f is fwd
        q, k, v, bias, p, causal, _ = args
        out, lse, _, _, mq, mk, seed, off, _ = sdpa_forward(q, k, v, bias, p, causal, **kwargs)
        g = torch.randn(out.shape, dtype=torch.float32).to(dtype)
        calls.append(
            (
                bwd,
                (
                    g,
                    q,
                    k,
                    v,
                    bias,
                    [True, True, True, bias is not None],
                    out,
                    lse,
                    None,
                    None,
                    mq,
                    mk,
                    0.0,
                    causal,
                    seed,
                    off,
                ),
                dict(kwargs),
            )
        )
    return calls


def _conv_bn_relu_samples(dtype: torch.dtype) -> list[Call]:
    from ... import fused  # noqa: F401  (defines fl::conv_bn_relu)

    gen = torch.Generator().manual_seed(0)
    op = torch.ops.fl.conv_bn_relu.default
    calls: list[Call] = []
    for n, c, o, hw, k, stride, pad, groups, bias in (
        (2, 3, 8, 9, 3, 1, 1, 1, True),
        (1, 4, 4, 7, 3, 2, 0, 2, False),
        (0, 3, 5, 6, 1, 1, 0, 1, True),
    ):
        x = torch.randn(n, c, hw, hw, generator=gen).to(dtype)
        w = torch.randn(o, c // groups, k, k, generator=gen).to(dtype)
        b = torch.randn(o, generator=gen).to(dtype) if bias else None
        gamma, beta = torch.rand(o, generator=gen).to(dtype) + 0.5, torch.randn(o, generator=gen).to(dtype)
        mean, var = torch.randn(o, generator=gen).to(dtype), torch.rand(o, generator=gen).to(dtype) + 0.5
        calls.append((op, (x, w, b, gamma, beta, mean, var, 1e-5, [stride] * 2, [pad] * 2, [1, 1], groups), {}))
    return calls


# N, C, O, H=W, k, stride, padding, dilation, groups, bias, input channels-last
_CONV2D_NHWC_CASES = (
    (2, 3, 8, 9, 3, 1, 1, 1, 1, True, False),
    (1, 4, 4, 7, 3, 2, 0, 2, 2, False, True),
    (2, 6, 6, 5, 3, 1, 1, 1, 6, True, True),  # depthwise
    (0, 3, 5, 6, 1, 1, 0, 1, 1, True, False),  # empty batch
)


def _conv2d_nhwc_inputs(dtype: torch.dtype, gen: torch.Generator) -> Iterator[tuple[Any, ...]]:
    for n, c, o, hw, k, stride, pad, dil, groups, bias, x_cl in _CONV2D_NHWC_CASES:
        x = torch.randn(n, c, hw, hw, generator=gen).to(dtype)
        if x_cl:
            x = x.contiguous(memory_format=torch.channels_last)
        w = torch.randn(o, c // groups, k, k, generator=gen).to(dtype)
        b = torch.randn(o, generator=gen).to(dtype) if bias else None
        yield x, w, b, [stride] * 2, [pad] * 2, [dil] * 2, groups


def _conv2d_nhwc_samples(dtype: torch.dtype) -> list[Call]:
    from ... import fused  # noqa: F401  (defines fl::conv2d_nhwc)

    gen = torch.Generator().manual_seed(0)
    op = torch.ops.fl.conv2d_nhwc.default
    return [(op, args, {}) for args in _conv2d_nhwc_inputs(dtype, gen)]


def _conv2d_nhwc_backward_samples(dtype: torch.dtype) -> list[Call]:
    from ... import fused  # noqa: F401  (defines fl::conv2d_nhwc_backward)

    gen = torch.Generator().manual_seed(0)
    op = torch.ops.fl.conv2d_nhwc_backward.default
    calls: list[Call] = []
    masks = ([True, True, True], [True, True, False], [False, True, True])
    for (x, w, b, stride, pad, dil, groups), mask in zip(_conv2d_nhwc_inputs(dtype, gen), masks * 2, strict=False):
        shape = torch.ops.fl.conv2d_nhwc.default(x.float(), w.float(), None, stride, pad, dil, groups).shape
        grad = torch.randn(shape, generator=gen).to(dtype).contiguous(memory_format=torch.channels_last)
        bias_sizes = None if b is None else [b.shape[0]]
        mask = [*mask[:2], mask[2] and b is not None]
        calls.append((op, (grad, x, w, bias_sizes, stride, pad, dil, groups, mask), {}))
    return calls


def _simple(
    op: str, make: Callable[[torch.Tensor, torch.dtype], tuple[Any, ...] | None]
) -> Callable[[torch.dtype], list[Call]]:
    # every op given here is a CUSTOM_SIMPLE name: an aten overload each supported PyTorch defines
    func = cast(torch._ops.OpOverload, _overload(op))

    def samples(dtype: torch.dtype) -> list[Call]:
        gen = torch.Generator().manual_seed(1)
        out: list[Call] = []
        for shape in ((5, 7), (3, 0, 2), ()):
            if dtype.is_floating_point:
                x = torch.randn(shape, generator=gen).to(dtype)
            elif dtype == torch.bool:
                x = torch.randint(0, 2, shape, generator=gen).bool()
            else:
                x = torch.randint(-5, 6, shape, generator=gen).to(dtype)
            args = make(x, dtype)
            if args is not None:
                out.append((func, args, {}))
        return out

    return samples


def _fill_value(dtype: torch.dtype) -> bool | int | float:
    return True if dtype == torch.bool else (2.5 if dtype.is_floating_point else 3)


CUSTOM_SIMPLE = {
    "aten::fill_.Scalar": lambda x, dt: (x, _fill_value(dt)),
    "aten::fill_.Tensor": lambda x, dt: (x, torch.tensor(_fill_value(dt), dtype=dt)),
    "aten::zero_": lambda x, dt: (x,),
    "aten::clamp": lambda x, dt: (x, 0 if dt == torch.uint8 else -1, 1) if dt != torch.bool else None,
    "aten::clamp_": lambda x, dt: (x, 0 if dt == torch.uint8 else -1, 1) if dt != torch.bool else None,
    "aten::clamp_max": lambda x, dt: (x, 1) if dt != torch.bool else None,
    "aten::clamp_max_": lambda x, dt: (x, 1) if dt != torch.bool else None,
    "aten::uniform_": lambda x, dt: (x, -2.0, 3.0) if dt.is_floating_point else None,
    "aten::normal_": lambda x, dt: (x, 1.0, 2.0) if dt.is_floating_point else None,
    "aten::exponential_": lambda x, dt: (x, 1.5) if dt.is_floating_point else None,
    "aten::bernoulli_.float": lambda x, dt: (x, 0.3) if dt.is_floating_point else None,
    "aten::bernoulli.p": lambda x, dt: (x, 0.3) if dt.is_floating_point else None,
    "aten::bernoulli_.Tensor": lambda x, dt: (x, torch.full_like(x, 0.4)) if dt.is_floating_point else None,
    "aten::random_": lambda x, dt: (x,) if dt != torch.bool else None,
    "aten::random_.to": lambda x, dt: (x, 5) if dt != torch.bool else None,
    "aten::random_.from": lambda x, dt: (x, -3, 4) if dt != torch.bool and dt != torch.uint8 else None,
    "aten::native_dropout": lambda x, dt: (x, 0.25, True) if dt.is_floating_point else None,
}

CUSTOM = {op: _simple(op, make) for op, make in CUSTOM_SIMPLE.items()}
CUSTOM.update(
    {
        "aten::_scaled_dot_product_fused_attention_overrideable": _sdpa_samples,
        "aten::_scaled_dot_product_fused_attention_overrideable_backward": _sdpa_backward_samples,
        "fl::conv_bn_relu": _conv_bn_relu_samples,
        "fl::conv2d_nhwc": _conv2d_nhwc_samples,
        "fl::conv2d_nhwc_backward": _conv2d_nhwc_backward_samples,
    }
)
