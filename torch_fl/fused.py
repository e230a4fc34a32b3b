"""torch_fl's own fused ops, for kernels no aten op describes.

`fl::conv_bn_relu` is convolution -> inference batch norm -> ReLU in one op.
A backend whose plugin has a kernel for it (the ascend emulator) runs one
kernel; every other backend, and the CPU, runs the three aten ops it stands
for (its decomposition). The fusion pass (a later issue) rewrites eligible
module sequences into it; until then `conv_bn_relu(conv, bn, x)` calls it.

Inference only: batch norm uses its running statistics, and the op has no
autograd formula (a tensor that requires grad raises, naming the unfused
route)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_lib = torch.library.Library("fl", "DEF")
_lib.define(
    "conv_bn_relu(Tensor input, Tensor weight, Tensor? bias, Tensor? bn_weight, Tensor? bn_bias, "
    "Tensor running_mean, Tensor running_var, float eps, int[] stride, int[] padding, int[] dilation, "
    "int groups) -> Tensor"
)


def _reference(input, weight, bias, bn_weight, bn_bias, running_mean, running_var, eps, stride, padding, dilation,
               groups):
    conv = F.conv2d if input.dim() == 4 else F.conv1d
    y = conv(input, weight, bias, stride, padding, dilation, groups)
    y = F.batch_norm(y, running_mean, running_var, bn_weight, bn_bias, False, 0.0, eps)
    return F.relu(y)


def _meta(input, weight, bias, bn_weight, bn_bias, running_mean, running_var, eps, stride, padding, dilation, groups):
    conv = F.conv2d if input.dim() == 4 else F.conv1d
    return torch.empty_like(conv(input, weight, bias, stride, padding, dilation, groups),
                            memory_format=torch.contiguous_format)


def _autograd(*args):
    if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        raise RuntimeError("fl::conv_bn_relu is an inference kernel and has no backward; call it under "
                           "torch.no_grad() / inference_mode(), or run the modules unfused for training")
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.fl.conv_bn_relu.default(*args)


_lib.impl("conv_bn_relu", _reference, "CPU")
_lib.impl("conv_bn_relu", _meta, "Meta")
_lib.impl("conv_bn_relu", _autograd, "Autograd")

conv_bn_relu_op = torch.ops.fl.conv_bn_relu.default


def _decomposition(*args, **kwargs):
    return _reference(*args, **kwargs)


def register_decompositions(table: dict) -> None:
    """Backends without a native kernel run the unfused aten ops."""
    table[conv_bn_relu_op] = _decomposition
    _register_sdpa(table)


def conv_bn_relu(conv: nn.Conv2d | nn.Conv1d, bn: nn.BatchNorm2d | nn.BatchNorm1d, x: torch.Tensor) -> torch.Tensor:
    """relu(bn(conv(x))) with bn in inference mode, as one op."""
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError("conv_bn_relu needs a batch norm with running statistics (track_running_stats=True)")
    if isinstance(conv.padding, str):
        raise ValueError(f"conv_bn_relu needs numeric padding, not padding={conv.padding!r}")
    return conv_bn_relu_op(x, conv.weight, conv.bias, bn.weight, bn.bias, bn.running_mean, bn.running_var,
                           float(bn.eps), list(conv.stride), list(conv.padding), list(conv.dilation), conv.groups)


# -- fused attention: the overrideable SDPA pair, composed of aten ops ----------
#
# F.scaled_dot_product_attention on fl goes to these two ops when the device
# says OVERRIDEABLE (_dispatch._sdp_choice: the plugin has both kernels). If a
# kernel then declines a call, or a path is switched off, these compositions
# run instead, so the op works on every tier.


def _sdpa_scores(query, key, attn_bias, is_causal, scale):
    e = query.shape[-1]
    s = scale if scale is not None else e ** -0.5
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


def _sdpa_forward(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *,
                  scale=None):
    if dropout_p:
        raise NotImplementedError("the composed fused-attention op has no dropout")
    work = torch.promote_types(query.dtype, torch.float32)  # half inputs accumulate in float32
    scores, _ = _sdpa_scores(query.to(work), key.to(work), attn_bias, is_causal, scale)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)  # fully masked rows: zeros
    out = torch.matmul(probs, value.to(work)).to(value.dtype)
    lse = lse.float()  # the op's contract: logsumexp is float32 whatever the inputs
    zero = torch.zeros((), dtype=torch.int64, device=query.device)
    return out, lse, None, None, query.shape[-2], key.shape[-2], zero, zero.clone(), None


def _sdpa_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q, cum_seq_k,
                   max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    dt = query.dtype
    work = torch.promote_types(dt, torch.float32)
    q, k, v, g, o = (t.to(work) for t in (query, key, value, grad_out, out))
    scores, s = _sdpa_scores(q, k, attn_bias, is_causal, scale)
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


def _register_sdpa(table: dict) -> None:
    table[SDPA_FORWARD] = _sdpa_forward
    table[SDPA_BACKWARD] = _sdpa_backward


def _scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                  enable_gqa=False):
    """F.scaled_dot_product_attention for fl tensors, above autograd.

    PyTorch picks SDPA kernels through a C++ dispatch stub that a Python
    backend cannot fill, so on fl it would always compose matmul and softmax.
    This kernel asks the plugin instead: its fused forward/backward pair when
    it serves the call, PyTorch's math composition otherwise."""
    from ._dispatch import sdpa_fused_eligible

    if sdpa_fused_eligible(query, key, value, dropout_p, enable_gqa):
        return SDPA_FORWARD(query, key, value, attn_mask, dropout_p, is_causal, False, scale=scale)[0]
    return torch.ops.aten._scaled_dot_product_attention_math.default(
        query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa)[0]


_aten_lib = torch.library.Library("aten", "IMPL")
_aten_lib.impl("scaled_dot_product_attention", _scaled_dot_product_attention, "AutogradPrivateUse1")
