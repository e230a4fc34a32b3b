"""Attention on fl: F.scaled_dot_product_attention above autograd, and the
overrideable fused-attention pair composed of aten ops.

PyTorch picks SDPA kernels through a C++ dispatch stub that a Python backend
cannot fill. On fl, aten::scaled_dot_product_attention is therefore served here
(at the fl autograd key): the plugin's fused forward/backward pair
(aten::_scaled_dot_product_fused_attention_overrideable[_backward]) when it
serves the call (sdpa_fused_eligible), PyTorch's math composition otherwise.
If a fused kernel then declines a call, or a path is switched off, the
compositions below run instead, so the pair works on every tier."""

from __future__ import annotations

import torch

from ...runtime import NATIVE, SETTINGS, TO_CODE, device_of, is_fl, not_traced

_SDPA_FWD = "aten::_scaled_dot_product_fused_attention_overrideable"
_SDPA_BWD = "aten::_scaled_dot_product_fused_attention_overrideable_backward"


def fused_sdpa_allowed() -> bool:
    """PyTorch's switches for SDPA's implementations (`torch.nn.attention.sdpa_kernel([...])`,
    `torch.backends.cuda.enable_flash_sdp(False)` ...): the plugin's fused kernel stands for the fused
    ones (flash, memory-efficient, cuDNN), the math composition for MATH. Code that asks for MATH only
    (to compare, or to get the reference numerics) gets it on fl too."""
    b = torch.backends.cuda
    return b.flash_sdp_enabled() or b.mem_efficient_sdp_enabled() or b.cudnn_sdp_enabled()


def sdpa_fused_eligible(q, k, v, dropout_p: float, enable_gqa: bool) -> bool:
    """Whether the plugin's fused attention kernels (forward and backward both)
    serve this call: 4-D fl inputs of one dtype the device computes in, no
    dropout, no grouped-query broadcasting, native path not switched off, and
    a fused implementation allowed by PyTorch's SDPA switches."""
    if not is_fl(q) or enable_gqa or dropout_p or q.dim() != 4 or not fused_sdpa_allowed():
        return False
    if not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)) or k.dim() != 4 or v.dim() != 4:
        return False
    if k.dtype != q.dtype or v.dtype != q.dtype or NATIVE in SETTINGS.disabled:
        return False
    dev = device_of(q)
    kernels = dev.backend.plugin.kernels
    fwd, bwd = kernels.get(_SDPA_FWD), kernels.get(_SDPA_BWD)
    code = TO_CODE.get(q.dtype, -1)
    return (
        fwd is not None
        and bwd is not None
        and code >= 0
        and bool((fwd.dtypes >> code) & 1)
        and bool((bwd.dtypes >> code) & 1)
        and bool((dev.props.dtypes >> code) & 1)
    )


def sdpa_scores(query, key, attn_bias, is_causal, scale):
    e = query.shape[-1]
    s = scale if scale is not None else e**-0.5
    scores = torch.matmul(query, key.transpose(-2, -1)) * s
    if is_causal:
        lq, lk = query.shape[-2], key.shape[-2]
        keep = torch.ones(lq, lk, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_bias is not None:
        if attn_bias.dtype == torch.bool:
            scores = scores.masked_fill(~attn_bias, float("-inf"))
        else:
            scores = scores + attn_bias
    return scores, s


def sdpa_forward(
    query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None
):
    if dropout_p:
        raise NotImplementedError("the composed fused-attention op has no dropout")
    work = torch.promote_types(query.dtype, torch.float32)  # half inputs accumulate in float32
    scores, _ = sdpa_scores(query.to(work), key.to(work), attn_bias, is_causal, scale)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)  # fully masked rows: zeros
    out = torch.matmul(probs, value.to(work)).to(value.dtype)
    lse = lse.float()  # the op's contract: logsumexp is float32 whatever the inputs
    zero = torch.zeros((), dtype=torch.int64, device=query.device)
    return out, lse, None, None, query.shape[-2], key.shape[-2], zero, zero.clone(), None


def sdpa_backward(
    grad_out,
    query,
    key,
    value,
    attn_bias,
    grad_input_mask,
    out,
    logsumexp,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    philox_seed,
    philox_offset,
    *,
    scale=None,
):
    dt = query.dtype
    work = torch.promote_types(dt, torch.float32)
    q, k, v, g, o = (t.to(work) for t in (query, key, value, grad_out, out))
    scores, s = sdpa_scores(q, k, attn_bias, is_causal, scale)
    probs = torch.exp(scores - logsumexp.to(work).unsqueeze(-1)).nan_to_num(0.0)
    grad_v = torch.matmul(probs.transpose(-2, -1), g)
    grad_p = torch.matmul(g, v.transpose(-2, -1))
    d = (g * o).sum(-1, keepdim=True)
    grad_s = probs * (grad_p - d)
    grad_q = torch.matmul(grad_s, k) * s
    grad_k = torch.matmul(grad_s.transpose(-2, -1), q) * s
    grad_bias = None
    if attn_bias is not None and grad_input_mask[3] and attn_bias.dtype != torch.bool:
        grad_bias = grad_s.sum_to_size(attn_bias.shape).to(attn_bias.dtype)
    return grad_q.to(dt), grad_k.to(dt), grad_v.to(dt), grad_bias


SDPA_FORWARD = torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default
SDPA_BACKWARD = torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward.default


def register(table: dict) -> None:
    table[SDPA_FORWARD] = sdpa_forward
    table[SDPA_BACKWARD] = sdpa_backward


def _scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """F.scaled_dot_product_attention for fl tensors, above autograd: the plugin's fused
    forward/backward pair when it serves the call, PyTorch's math composition otherwise."""
    if sdpa_fused_eligible(query, key, value, dropout_p, enable_gqa):
        return SDPA_FORWARD(query, key, value, attn_mask, dropout_p, is_causal, False, scale=scale)[0]
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # what PyTorch's own scaled_dot_product_attention does before any backend (its
        # convert_boolean_attn_mask): the math composition adds the mask, so True/False would add
        # 1/0 to the scores instead of keeping/removing them
        attn_mask = torch.where(attn_mask, 0.0, float("-inf")).to(query.dtype)
    return torch.ops.aten._scaled_dot_product_attention_math.default(
        query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
    )[0]


_aten_lib = torch.library.Library("aten", "IMPL")
_aten_lib.impl("scaled_dot_product_attention", not_traced(_scaled_dot_product_attention), "AutogradPrivateUse1")
