"""What the passes put in place of the patterns they find.

Each replacement holds the user's own modules (so parameters, buffers and
`.to()` stay shared with the original model) and computes the same function
with fewer kernels. All of them work under autograd: where a fused kernel is
inference-only, the replacement takes a differentiable route when a gradient
is needed."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import fused as _fused
from ..dispatch import sdpa_fused_eligible
from ..runtime import is_fl
from . import pointwise


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def _version_key(*tensors) -> tuple:
    """Changes whenever one of the tensors is replaced, moved or written in place."""
    return tuple((id(t), t._version, t.device, t.dtype) if t is not None else None for t in tensors)


# -- Conv + BatchNorm (+ ReLU), inference --------------------------------------


def _folded(conv: nn.Module, bn: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Convolution weight and bias with an inference batch norm folded in:
    bn(conv(x)) == conv'(x) exactly in real arithmetic."""
    scale = torch.rsqrt(bn.running_var + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight
    shape = (-1,) + (1,) * (conv.weight.dim() - 1)
    weight = conv.weight * scale.reshape(shape)
    bias = -bn.running_mean * scale
    if conv.bias is not None:
        bias = bias + conv.bias * scale
    if bn.bias is not None:
        bias = bias + bn.bias
    return weight, bias


class FoldedConvBN(nn.Module):
    """conv -> batch norm (inference) as one convolution with folded weights.

    The folded weights are cached and recomputed only when a parameter or a
    running statistic changes (tracked by tensor version), so an inference
    step costs one convolution kernel. When a gradient is needed the fold is
    computed under autograd, so conv and bn parameters get their gradients."""

    def __init__(self, conv: nn.Module, bn: nn.Module, relu: bool = False):
        super().__init__()
        self.conv, self.bn, self.relu = conv, bn, relu
        self._cache: tuple | None = None

    def _weights(self):
        params = (self.conv.weight, self.conv.bias, self.bn.weight, self.bn.bias, self.bn.running_mean,
                  self.bn.running_var)
        if _needs_grad(*params):
            return _folded(self.conv, self.bn)
        key = _version_key(*params)
        if self._cache is None or self._cache[0] != key:
            with torch.no_grad():
                self._cache = (key, _folded(self.conv, self.bn))
        return self._cache[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self._weights()
        y = self.conv._conv_forward(x, weight, bias)
        return F.relu(y) if self.relu else y


class ConvBnRelu(nn.Module):
    """conv -> batch norm (inference) -> ReLU through the backend's fused
    `fl::conv_bn_relu` kernel; the folded route when a gradient is needed
    (the fused kernel has no backward)."""

    def __init__(self, conv: nn.Module, bn: nn.Module):
        super().__init__()
        self.conv, self.bn = conv, bn
        self.folded = FoldedConvBN(conv, bn, relu=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _needs_grad(x, self.conv.weight, self.conv.bias, self.bn.weight, self.bn.bias):
            return self.folded(x)
        return _fused.conv_bn_relu(self.conv, self.bn, x)


# -- attention -----------------------------------------------------------------


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
              dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v through F.scaled_dot_product_attention,
    which torch_fl sends to the backend's fused attention kernel where it has
    one (forward and backward), and to the math composition elsewhere."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal,
                                          scale=scale)


def explicit_attention(q, k, v, k_dims: tuple, scale_value, scale_op: str, mask, mask_kind: str, dropout_p: float,
                       softmax_dim: int):
    """The matched matmul -> scale -> mask -> softmax -> matmul as one
    attention call; any shape the fused op cannot take runs the original
    formula, so the replacement is exact everywhere."""
    nd = k.dim()
    last_two = sorted(d % nd for d in k_dims) == [nd - 2, nd - 1] and softmax_dim % nd == nd - 1
    if scale_value is None:
        scale = 1.0
    else:
        sv = float(scale_value)
        scale = sv if scale_op == "mul" else 1.0 / sv
    if last_two and q.dim() == nd and v.dim() == nd and nd >= 3:
        m = mask
        if mask is not None and mask_kind == "fill":  # masked_fill(cond, -inf): SDPA keeps where True
            m = ~mask
        return attention(q, k, v, m, dropout_p, False, scale)
    scores = torch.matmul(q, k.transpose(*k_dims)) * scale
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf")) if mask_kind == "fill" else scores + mask
    probs = torch.softmax(scores, softmax_dim)
    if dropout_p:
        probs = F.dropout(probs, dropout_p)
    return torch.matmul(probs, v)


class FusedSelfAttention(nn.Module):
    """nn.MultiheadAttention used as self-attention, with its packed input
    projection as one GEMM whose output is viewed (not copied) as q, k, v in
    (batch, heads, seq, dim) order, one fused attention call on those views,
    and the output projection reading the attention output as a view.

    Backward is cheap too: q, k and v are one `unbind` of the packed
    projection, so their gradients are stacked by one kernel, where
    nn.MultiheadAttention's `proj[0]`, `proj[1]`, `proj[2]` cost a
    select_backward and an accumulation each."""

    def __init__(self, mha: nn.MultiheadAttention, linear_kernel: bool = False, dropout_kernel: bool = False):
        super().__init__()
        self.mha = mha
        self.linear_kernel = linear_kernel  # the QKV GEMM as fl::linear_act: its backward is one kernel
        self.dropout_kernel = dropout_kernel  # attention dropout inside fl::attention_dropout
        self.project = True  # False: the output projection is left to the caller (fused into a later kernel)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None,
                key_padding_mask: torch.Tensor | None = None, is_causal: bool = False):
        m = self.mha
        if x.dim() != 3:  # unbatched input
            if self.project:  # the module's own route
                return m(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False,
                         is_causal=is_causal)
            bdim = 0 if m.batch_first else 1
            kpm = key_padding_mask.unsqueeze(0) if key_padding_mask is not None else None
            out = self.forward(x.unsqueeze(bdim), attn_mask, kpm, is_causal)[0]
            return out.squeeze(bdim), None
        if not m.batch_first:
            x = x.transpose(0, 1)
        b, length, e = x.shape
        h = m.num_heads
        p = m.dropout if m.training else 0.0
        if self.linear_kernel:
            qkv = _fused.linear_act(x, m.in_proj_weight, m.in_proj_bias)  # one GEMM, one backward kernel
        else:
            qkv = F.linear(x, m.in_proj_weight, m.in_proj_bias)  # one GEMM for q, k and v
        heads = qkv.view(b, length, 3, h, e // h).permute(2, 0, 3, 1, 4)
        mask = _merged_mask(attn_mask, key_padding_mask, b, h, length, qkv.dtype)
        causal = bool(is_causal) and mask is None
        if p and self.dropout_kernel and not (mask is not None and mask.requires_grad):
            q, k, v = heads.unbind(0)
            out = _fused.attention_dropout(q, k, v, mask, p, causal)  # strided views, dropout in the kernel
        else:
            if not _fused_attention(heads[0], p):
                heads = heads.contiguous()  # the math path multiplies contiguous heads: one copy, not one per matmul
            q, k, v = heads.unbind(0)
            out = attention(q, k, v, mask, p, causal)
        out = out.transpose(1, 2).reshape(b, length, e)
        if self.project:
            out = F.linear(out, m.out_proj.weight, m.out_proj.bias)
        if not m.batch_first:
            out = out.transpose(0, 1)
        return out, None


def _fused_attention(q: torch.Tensor, dropout_p: float) -> bool:

    return is_fl(q) and sdpa_fused_eligible(q, q, q, dropout_p, False)


def _merged_mask(attn_mask, key_padding_mask, b, h, length, dtype):
    """nn.MultiheadAttention's mask rules: boolean masks mean "do not attend"
    (SDPA's mean "attend"), float masks are added; the key padding mask
    (batch, seq) joins the attention mask per batch."""
    def as_float(m):
        if m is None:
            return None
        if m.dtype == torch.bool:
            return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(m, float("-inf"))
        return m.to(dtype)

    am, kp = as_float(attn_mask), as_float(key_padding_mask)
    if am is not None and am.dim() == 3:  # (batch * heads, L, S)
        am = am.view(b, h, length, -1)
    if kp is not None:
        kp = kp.view(b, 1, 1, -1)
        am = kp if am is None else am + kp
    return am


# -- GEMM epilogues ------------------------------------------------------------


def _dropout_p(dropout: nn.Module | None) -> float:
    return float(dropout.p) if dropout is not None and dropout.training else 0.0


class LinearAct(nn.Module):
    """nn.Linear -> (ReLU | GELU | nothing) -> (Dropout) as the backend's
    `fl::linear_act` kernel (the bias, activation and dropout are the GEMM's
    epilogue); its backward computes the input, weight and bias gradients in
    one kernel."""

    def __init__(self, linear: nn.Linear, activation: str, dropout: nn.Module | None = None):
        super().__init__()
        self.linear, self.activation, self.dropout = linear, activation, dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _fused.linear_act(x, self.linear.weight, self.linear.bias, self.activation, _dropout_p(self.dropout))

    def extra_repr(self) -> str:
        return self.activation


class LinearAddNorm(nn.Module):
    """LayerNorm(residual + Dropout(Linear(x))) as the backend's
    `fl::linear_add_layer_norm` kernel (bias, dropout, residual add and the
    normalisation are the GEMM's epilogue); without a linear layer
    (`linear=None`), LayerNorm(residual + Dropout(x)) as `fl::add_layer_norm`.
    The linear layer may be nn.MultiheadAttention's output projection."""

    def __init__(self, linear: nn.Linear | None, norm: nn.LayerNorm, dropout: nn.Module | None = None):
        super().__init__()
        self.linear, self.norm, self.dropout = linear, norm, dropout

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        n, p = self.norm, _dropout_p(self.dropout)
        if self.linear is None:
            return _fused.add_layer_norm(x, residual, n.weight, n.bias, n.eps, p)
        return _fused.linear_add_layer_norm(x, self.linear.weight, self.linear.bias, residual, n.weight, n.bias, n.eps,
                                            p)


# -- QKV: projections of one input as one GEMM --------------------------------


class PackedLinear(nn.Module):
    """Several nn.Linear on the same input as one GEMM over the stacked
    weights; the outputs are views of its result. For inference the stacked
    weights are cached (recomputed when a weight changes); with autograd the
    stacking is part of the graph, so each Linear gets its own gradient."""

    def __init__(self, linears: list[nn.Linear]):
        super().__init__()
        self.linears = nn.ModuleList(linears)
        self.sizes = [lin.out_features for lin in linears]
        self._cache: tuple | None = None

    def _stacked(self):
        ws = [lin.weight for lin in self.linears]
        bs = [lin.bias for lin in self.linears]
        if _needs_grad(*ws, *bs):
            return torch.cat(ws), (torch.cat(bs) if bs[0] is not None else None)
        key = _version_key(*ws, *bs)
        if self._cache is None or self._cache[0] != key:
            with torch.no_grad():
                self._cache = (key, (torch.cat(ws), torch.cat(bs) if bs[0] is not None else None))
        return self._cache[1]

    def forward(self, x: torch.Tensor) -> tuple:
        w, b = self._stacked()
        return tuple(F.linear(x, w, b).split(self.sizes, dim=-1))


# -- elementwise chains ----------------------------------------------------------


class FusedPointwise(nn.Module):
    """A chain of elementwise ops as one JIT-compiled kernel (torch_fl.compile.pointwise)."""

    def __init__(self, chain: pointwise.PointwiseChain):
        super().__init__()
        self.chain = chain

    def forward(self, *xs):
        return pointwise.run(self.chain, *xs)

    def extra_repr(self) -> str:
        return self.chain.label


# -- layout ----------------------------------------------------------------------


def to_channels_last(x):
    """Graph-edge conversion into the backend's preferred convolution layout."""
    if isinstance(x, torch.Tensor) and x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    return x


def to_contiguous(x):
    """Graph-edge conversion back to the layout the caller gave us."""
    if isinstance(x, torch.Tensor) and x.dim() == 4:
        return x.contiguous()
    return x


def to_contiguous_tree(out):
    """to_contiguous over a graph's output (a tensor, or tuples/lists/dicts of them)."""
    if isinstance(out, (tuple, list)):
        return type(out)(to_contiguous_tree(o) for o in out)
    if isinstance(out, dict):
        return {k: to_contiguous_tree(v) for k, v in out.items()}
    return to_contiguous(out)
