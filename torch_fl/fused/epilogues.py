"""GEMM epilogues, residual add + LayerNorm, attention with dropout.

Kernels vendor stacks ship and the compile passes use (torch_fl/compile/passes/):
  fl::linear_act            input @ W^T + b -> ReLU / GELU / none -> dropout       (hipBLASLt epilogues)
  fl::add_layer_norm        residual + dropout(x) -> LayerNorm                     (MIOpen AddLayerNorm)
  fl::linear_add_layer_norm residual + dropout(input @ W^T + b) -> LayerNorm       (the same after a GEMM)
  fl::attention_dropout     flash attention with dropout on the weights
each with a backward op computing every gradient in one kernel. Dropout masks
are counter-based: element i of the op's output (of the (B, H, L, S) weights
for attention, row-major) is kept iff uniform(seed, i) >= p, with
fl_host.h's fl_rand_uniform (splitmix64); `keep_mask` computes the same mask
with torch ops, so the reference decompositions match the kernels bit for
bit and a backward regenerates the forward's mask from the seed.
The emulated `rocm` plugin (plugins_cffi/emulated/fused_linear.c,
fused_attention.c) has kernels for all of them; elsewhere the references run."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..dispatch import autocast_kernel, sdpa_scores
from ..runtime import not_traced

_lib = torch.library.Library("fl", "FRAGMENT")  # the namespace is conv_bn.py's

ACTIVATIONS = {"none": 0, "relu": 1, "gelu": 2}  # the `act` argument

_lib.define(
    "linear_act(Tensor input, Tensor weight, Tensor? bias, int act, float p, int seed, bool save) -> (Tensor, Tensor)"
)
_lib.define(
    "linear_act_backward(Tensor grad, Tensor input, Tensor weight, Tensor out, Tensor pre, int act, "
    "float p, int seed, bool has_bias) -> (Tensor, Tensor, Tensor)"
)
_lib.define(
    "add_layer_norm(Tensor input, Tensor residual, Tensor? weight, Tensor? bias, float eps, float p, "
    "int seed, bool save) -> (Tensor, Tensor, Tensor, Tensor)"
)
_lib.define(
    "add_layer_norm_backward(Tensor grad, Tensor sum, Tensor mean, Tensor rstd, Tensor? weight, "
    "bool has_bias, float p, int seed) -> (Tensor, Tensor, Tensor, Tensor)"
)
_lib.define(
    "linear_add_layer_norm(Tensor input, Tensor weight, Tensor? bias, Tensor residual, Tensor? ln_weight, "
    "Tensor? ln_bias, float eps, float p, int seed, bool save) -> (Tensor, Tensor, Tensor, Tensor)"
)
_lib.define(
    "linear_add_layer_norm_backward(Tensor grad, Tensor input, Tensor weight, Tensor sum, Tensor mean, "
    "Tensor rstd, Tensor? ln_weight, bool has_bias, bool has_ln_bias, float p, int seed) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"
)
_lib.define(
    "attention_dropout(Tensor query, Tensor key, Tensor value, Tensor? attn_bias, float dropout_p, "
    "bool is_causal, int seed, float? scale=None) -> (Tensor, Tensor)"
)
_lib.define(
    "attention_dropout_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor? attn_bias, "
    "Tensor out, Tensor logsumexp, float dropout_p, bool is_causal, int seed, float? scale=None) "
    "-> (Tensor, Tensor, Tensor)"
)


def _i64(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


_SPLITMIX = (_i64(0x9E3779B97F4A7C15), _i64(0xBF58476D1CE4E5B9), _i64(0x94D049BB133111EB))


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 (uint64 bits)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _splitmix64(x: torch.Tensor) -> torch.Tensor:
    x = x + _SPLITMIX[0]
    x = (x ^ _shr(x, 30)) * _SPLITMIX[1]
    x = (x ^ _shr(x, 27)) * _SPLITMIX[2]
    return x ^ _shr(x, 31)


def keep_mask(seed: int, shape, p: float, device) -> torch.Tensor:
    """The kernels' dropout mask: element i kept iff fl_rand_uniform(seed, i) >= p."""
    n = 1
    for s in shape:
        n *= s
    idx = torch.arange(n, dtype=torch.int64, device=device)
    u = _shr(_splitmix64(_splitmix64(idx) ^ seed), 11)  # 53 random bits
    return (u >= math.ceil(p * 2.0**53)).view(tuple(shape))


def _dropout(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    if not p:
        return x
    return torch.where(
        keep_mask(seed, x.shape, p, x.device), x * (1.0 / (1.0 - p)), torch.zeros((), dtype=x.dtype, device=x.device)
    )


def new_seed() -> int:
    """A dropout seed from PyTorch's CPU generator (reproducible under torch.manual_seed)."""
    return int(torch.randint(0, 2**62, (), dtype=torch.int64))


def _act(x, act: int):
    return F.relu(x) if act == 1 else F.gelu(x) if act == 2 else x


def _gelu_grad(x):
    return 0.5 * (1.0 + torch.erf(x * 0.7071067811865476)) + x * torch.exp(-0.5 * x * x) * 0.3989422804014327


def _linear_act_ref(input, weight, bias, act, p, seed, save):
    pre = F.linear(input, weight, bias)
    out = _dropout(_act(pre, act), p, seed)
    if out is pre:
        out = pre.clone()
    return out, pre if save else pre.new_empty(0)


def _linear_act_meta(input, weight, bias, act, p, seed, save):
    out = input.new_empty(input.shape[:-1] + (weight.shape[0],))
    return out, torch.empty_like(out) if save else input.new_empty(0)


def _linear_act_bwd_ref(grad, input, weight, out, pre, act, p, seed, has_bias):
    d = _dropout(grad, p, seed)
    if act == 1:
        d = torch.where(out > 0, d, torch.zeros((), dtype=d.dtype, device=d.device))
    elif act == 2:
        d = d * _gelu_grad(pre)
    n, k = weight.shape
    d2 = d.reshape(-1, n)
    gw = d2.t().matmul(input.reshape(-1, k))
    gb = d2.sum(0) if has_bias else d.new_empty(0)
    return d.matmul(weight), gw, gb


def _linear_act_bwd_meta(grad, input, weight, out, pre, act, p, seed, has_bias):
    return (
        input.new_empty(input.shape),
        weight.new_empty(weight.shape),
        weight.new_empty((weight.shape[0],) if has_bias else (0,)),
    )


def _norm_stats(z, weight, bias, eps):
    out, mean, rstd = torch.native_layer_norm(z, [z.shape[-1]], weight, bias, eps)
    return out, mean, rstd


def _add_layer_norm_ref(input, residual, weight, bias, eps, p, seed, save):
    z = residual + _dropout(input, p, seed)
    out, mean, rstd = _norm_stats(z, weight, bias, eps)
    return out, z if save else z.new_empty(0), mean, rstd


def _norm_meta(like, save):
    out = like.new_empty(like.shape)
    stats = like.shape[:-1] + (1,)
    return out, torch.empty_like(out) if save else like.new_empty(0), like.new_empty(stats), like.new_empty(stats)


def _add_layer_norm_meta(input, residual, weight, bias, eps, p, seed, save):
    return _norm_meta(residual, save)


def _linear_add_layer_norm_ref(input, weight, bias, residual, ln_weight, ln_bias, eps, p, seed, save):
    return _add_layer_norm_ref(F.linear(input, weight, bias), residual, ln_weight, ln_bias, eps, p, seed, save)


def _linear_add_layer_norm_meta(input, weight, bias, residual, ln_weight, ln_bias, eps, p, seed, save):
    return _norm_meta(residual, save)


def _norm_grads(grad, z, mean, rstd, weight, has_bias):
    """LayerNorm's backward: d sum, d weight, d bias."""
    xhat = (z - mean) * rstd
    dx = grad * weight if weight is not None else grad
    n = z.shape[-1]
    dz = rstd * (dx - dx.mean(-1, keepdim=True) - xhat * (dx * xhat).mean(-1, keepdim=True))
    gw = (grad * xhat).reshape(-1, n).sum(0) if weight is not None else grad.new_empty(0)
    gb = grad.reshape(-1, n).sum(0) if has_bias else grad.new_empty(0)
    return dz, gw, gb


def _add_layer_norm_bwd_ref(grad, sum, mean, rstd, weight, has_bias, p, seed):  # noqa: A002 - the schema's name
    dz, gw, gb = _norm_grads(grad, sum, mean, rstd, weight, has_bias)
    return _dropout(dz, p, seed) if p else dz.clone(), dz, gw, gb


def _add_layer_norm_bwd_meta(grad, sum, mean, rstd, weight, has_bias, p, seed):  # noqa: A002
    n = sum.shape[-1]
    return (
        grad.new_empty(sum.shape),
        grad.new_empty(sum.shape),
        grad.new_empty((n,) if weight is not None else (0,)),
        grad.new_empty((n,) if has_bias else (0,)),
    )


def _linear_add_layer_norm_bwd_ref(
    grad,
    input,
    weight,
    sum,
    mean,
    rstd,
    ln_weight,
    has_bias,
    has_ln_bias,
    p,  # noqa: A002
    seed,
):
    dz, glw, glb = _norm_grads(grad, sum, mean, rstd, ln_weight, has_ln_bias)
    dy = _dropout(dz, p, seed)
    n, k = weight.shape
    dy2 = dy.reshape(-1, n)
    gw = dy2.t().matmul(input.reshape(-1, k))
    gb = dy2.sum(0) if has_bias else dy.new_empty(0)
    return dy.matmul(weight), gw, gb, dz, glw, glb


def _linear_add_layer_norm_bwd_meta(
    grad,
    input,
    weight,
    sum,
    mean,
    rstd,
    ln_weight,
    has_bias,
    has_ln_bias,
    p,  # noqa: A002
    seed,
):
    n = weight.shape[0]
    return (
        input.new_empty(input.shape),
        weight.new_empty(weight.shape),
        weight.new_empty((n,) if has_bias else (0,)),
        grad.new_empty(sum.shape),
        grad.new_empty((n,) if ln_weight is not None else (0,)),
        grad.new_empty((n,) if has_ln_bias else (0,)),
    )


def _attention_dropout_ref(query, key, value, attn_bias, dropout_p, is_causal, seed, scale=None):
    work = torch.promote_types(query.dtype, torch.float32)
    scores, _ = sdpa_scores(query.to(work), key.to(work), attn_bias, is_causal, scale)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)
    out = torch.matmul(_dropout(probs, dropout_p, seed), value.to(work)).to(value.dtype)
    return out.transpose(1, 2).contiguous().transpose(1, 2), lse.float()  # the meta function's layout


def _attention_dropout_meta(query, key, value, attn_bias, dropout_p, is_causal, seed, scale=None):
    # the output is laid out (B, L, H, Ev), like the flash kernels': merging the heads back is a view
    b, h, length = query.shape[:3]
    out = query.new_empty((b, length, h, value.shape[-1])).transpose(1, 2)
    return out, query.new_empty((b, h, length), dtype=torch.float32)


def _attention_dropout_bwd_ref(
    grad_out, query, key, value, attn_bias, out, logsumexp, dropout_p, is_causal, seed, scale=None
):
    dt = query.dtype
    work = torch.promote_types(dt, torch.float32)
    q, k, v, g, o = (t.to(work) for t in (query, key, value, grad_out, out))
    scores, s = sdpa_scores(q, k, attn_bias, is_causal, scale)
    probs = torch.exp(scores - torch.logsumexp(scores, dim=-1, keepdim=True)).nan_to_num(0.0)
    z = _dropout(torch.ones_like(probs), dropout_p, seed)
    grad_v = torch.matmul((probs * z).transpose(-2, -1), g)
    grad_p = torch.matmul(g, v.transpose(-2, -1)) * z
    grad_s = probs * (grad_p - (g * o).sum(-1, keepdim=True))
    return (
        torch.matmul(grad_s, k).mul(s).to(dt),
        torch.matmul(grad_s.transpose(-2, -1), q).mul(s).to(dt),
        grad_v.to(dt),
    )


def _attention_dropout_bwd_meta(
    grad_out, query, key, value, attn_bias, out, logsumexp, dropout_p, is_causal, seed, scale=None
):
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape)


def _below(op, *args):
    with torch._C._AutoDispatchBelowAutograd():
        return op(*args)


class _LinearActFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, act, p, seed, save):
        out, pre = _below(torch.ops.fl.linear_act.default, input, weight, bias, act, p, seed, save)
        ctx.save_for_backward(input, weight, out, pre)
        ctx.cfg = (act, p, seed, bias is not None)
        ctx.set_materialize_grads(False)  # no zero-filled gradients for the saved outputs: no zero_ kernels
        ctx.mark_non_differentiable(pre)
        return out, pre

    @staticmethod
    def backward(ctx, grad, _grad_pre):
        if grad is None:
            return (None,) * 7
        input, weight, out, pre = ctx.saved_tensors
        act, p, seed, has_bias = ctx.cfg
        gi, gw, gb = torch.ops.fl.linear_act_backward.default(grad, input, weight, out, pre, act, p, seed, has_bias)
        return gi, gw, gb if has_bias else None, None, None, None, None


class _AddNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, residual, weight, bias, eps, p, seed, save):
        out, z, mean, rstd = _below(
            torch.ops.fl.add_layer_norm.default, input, residual, weight, bias, eps, p, seed, save
        )
        ctx.save_for_backward(z, mean, rstd, weight)
        ctx.cfg = (p, seed, bias is not None)
        ctx.set_materialize_grads(False)  # no zero-filled gradients for the saved outputs: no zero_ kernels
        ctx.mark_non_differentiable(z, mean, rstd)
        return out, z, mean, rstd

    @staticmethod
    def backward(ctx, grad, *_):
        if grad is None:
            return (None,) * 8
        z, mean, rstd, weight = ctx.saved_tensors
        p, seed, has_bias = ctx.cfg
        gx, gr, gw, gb = torch.ops.fl.add_layer_norm_backward.default(grad, z, mean, rstd, weight, has_bias, p, seed)
        return gx, gr, gw if weight is not None else None, gb if has_bias else None, None, None, None, None


class _LinearAddNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, residual, ln_weight, ln_bias, eps, p, seed, save):
        out, z, mean, rstd = _below(
            torch.ops.fl.linear_add_layer_norm.default,
            input,
            weight,
            bias,
            residual,
            ln_weight,
            ln_bias,
            eps,
            p,
            seed,
            save,
        )
        ctx.save_for_backward(input, weight, z, mean, rstd, ln_weight)
        ctx.cfg = (p, seed, bias is not None, ln_bias is not None)
        ctx.set_materialize_grads(False)  # no zero-filled gradients for the saved outputs: no zero_ kernels
        ctx.mark_non_differentiable(z, mean, rstd)
        return out, z, mean, rstd

    @staticmethod
    def backward(ctx, grad, *_):
        if grad is None:
            return (None,) * 10
        input, weight, z, mean, rstd, ln_weight = ctx.saved_tensors
        p, seed, has_bias, has_ln_bias = ctx.cfg
        gi, gw, gb, gr, glw, glb = torch.ops.fl.linear_add_layer_norm_backward.default(
            grad, input, weight, z, mean, rstd, ln_weight, has_bias, has_ln_bias, p, seed
        )
        return (
            gi,
            gw,
            gb if has_bias else None,
            gr,
            glw if ln_weight is not None else None,
            glb if has_ln_bias else None,
            None,
            None,
            None,
            None,
        )


class _AttentionDropoutFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, attn_bias, dropout_p, is_causal, seed, scale=None):
        out, lse = _below(
            torch.ops.fl.attention_dropout.default, query, key, value, attn_bias, dropout_p, is_causal, seed, scale
        )
        ctx.save_for_backward(query, key, value, attn_bias, out, lse)
        ctx.cfg = (dropout_p, is_causal, seed, scale)
        ctx.set_materialize_grads(False)  # no zero-filled gradients for the saved outputs: no zero_ kernels
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad, _grad_lse):
        if grad is None:
            return (None,) * 8
        query, key, value, attn_bias, out, lse = ctx.saved_tensors
        if attn_bias is not None and attn_bias.requires_grad:
            raise RuntimeError(
                "fl::attention_dropout has no gradient for attn_bias; use "
                "F.scaled_dot_product_attention for a trainable bias"
            )
        p, causal, seed, scale = ctx.cfg
        gq, gk, gv = torch.ops.fl.attention_dropout_backward.default(
            grad, query, key, value, attn_bias, out, lse, p, causal, seed, scale
        )
        return gq, gk, gv, None, None, None, None, None


_NEW_OPS: dict[str, tuple[Callable[..., Any], Callable[..., Any], Any]] = {
    "linear_act": (_linear_act_ref, _linear_act_meta, _LinearActFn),
    "linear_act_backward": (_linear_act_bwd_ref, _linear_act_bwd_meta, None),
    "add_layer_norm": (_add_layer_norm_ref, _add_layer_norm_meta, _AddNormFn),
    "add_layer_norm_backward": (_add_layer_norm_bwd_ref, _add_layer_norm_bwd_meta, None),
    "linear_add_layer_norm": (_linear_add_layer_norm_ref, _linear_add_layer_norm_meta, _LinearAddNormFn),
    "linear_add_layer_norm_backward": (_linear_add_layer_norm_bwd_ref, _linear_add_layer_norm_bwd_meta, None),
    "attention_dropout": (_attention_dropout_ref, _attention_dropout_meta, _AttentionDropoutFn),
    "attention_dropout_backward": (_attention_dropout_bwd_ref, _attention_dropout_bwd_meta, None),
}


def _autograd_kernel(op: Any, fn: Any) -> Callable[..., Any]:
    """The op's Autograd kernel: its autograd.Function where a gradient is wanted, else straight below the
    Autograd key. A compiled training graph calls these ops inside AOTAutograd's forward, where grad mode is
    off: there autograd.Function.apply would only add its own bookkeeping (tens of microseconds a call)."""

    def kernel(*args: Any) -> Any:
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return fn.apply(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args)

    return kernel


for _name, (_ref, _meta_fn, _fn) in _NEW_OPS.items():
    _lib.impl(_name, not_traced(_ref), "CPU")
    _lib.impl(_name, not_traced(_meta_fn), "Meta")
    if _fn is not None:
        not_traced(_fn.forward)
        not_traced(_fn.backward)
        _lib.impl(_name, _autograd_kernel(getattr(torch.ops.fl, _name).default, _fn), "Autograd")


def register_decompositions(table: dict) -> None:
    """Backends without native kernels run the reference compositions of aten ops."""
    for name, (ref, _, _) in _NEW_OPS.items():
        table[getattr(torch.ops.fl, name).default] = ref


# kernel names (as plugins declare them) -> what the passes call
LINEAR_ACT_KERNELS = ("fl::linear_act", "fl::linear_act_backward")
ADD_NORM_KERNELS = ("fl::add_layer_norm", "fl::add_layer_norm_backward")
LINEAR_ADD_NORM_KERNELS = ("fl::linear_add_layer_norm", "fl::linear_add_layer_norm_backward")
ATTENTION_DROPOUT_KERNELS = ("fl::attention_dropout", "fl::attention_dropout_backward")


def _train_seed(p: float, *tensors) -> tuple[float, int]:
    return (float(p), new_seed()) if p else (0.0, 0)


def linear_act(input, weight, bias=None, activation: str = "none", p: float = 0.0) -> torch.Tensor:
    """dropout_p(activation(F.linear(input, weight, bias))) as one op (`fl::linear_act`)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"linear_act: activation {activation!r} is not one of {sorted(ACTIVATIONS)}")
    act = ACTIVATIONS[activation]
    p, seed = _train_seed(p)
    save = (
        act == 2 and torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (input, weight, bias))
    )
    return torch.ops.fl.linear_act.default(input, weight, bias, act, p, seed, save)[0]


def _grad_wanted(*ts) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in ts)


def add_layer_norm(input, residual, weight=None, bias=None, eps: float = 1e-5, p: float = 0.0) -> torch.Tensor:
    """F.layer_norm(residual + dropout_p(input)) over the last dim, as one op (`fl::add_layer_norm`)."""
    p, seed = _train_seed(p)
    save = _grad_wanted(input, residual, weight, bias)
    return torch.ops.fl.add_layer_norm.default(input, residual, weight, bias, float(eps), p, seed, save)[0]


def linear_add_layer_norm(
    input, weight, bias, residual, ln_weight=None, ln_bias=None, eps: float = 1e-5, p: float = 0.0
) -> torch.Tensor:
    """F.layer_norm(residual + dropout_p(F.linear(input, weight, bias))) as one op (`fl::linear_add_layer_norm`)."""
    p, seed = _train_seed(p)
    save = _grad_wanted(input, weight, bias, residual, ln_weight, ln_bias)
    return torch.ops.fl.linear_add_layer_norm.default(
        input, weight, bias, residual, ln_weight, ln_bias, float(eps), p, seed, save
    )[0]


def attention_dropout(
    query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    """F.scaled_dot_product_attention with dropout inside the flash kernel (`fl::attention_dropout`); the
    mask comes from a seed, so nothing (L, S) is stored for the backward. attn_mask must not require grad."""
    if attn_mask is not None and attn_mask.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            "attention_dropout: attn_mask requires grad, and fl::attention_dropout has no gradient for "
            "it; use F.scaled_dot_product_attention"
        )
    p, seed = _train_seed(dropout_p)
    return torch.ops.fl.attention_dropout.default(query, key, value, attn_mask, p, bool(is_causal), seed, scale)[0]


# Under torch.autocast("fl") each op casts as the ops it fuses would: a GEMM (with its epilogue) or attention in
# the autocast dtype, anything ending in a LayerNorm in float32, so a compiled model's dtypes match eager's.
for _name, _policy in (
    ("linear_act", "lower"),
    ("attention_dropout", "lower"),
    ("add_layer_norm", "fp32"),
    ("linear_add_layer_norm", "fp32"),
):
    _lib.impl(_name, not_traced(autocast_kernel(getattr(torch.ops.fl, _name).default, _policy)), "AutocastPrivateUse1")
