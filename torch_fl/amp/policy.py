"""The autocast policy for the fl device: which ops run in the autocast dtype, which in float32, which in
their widest input dtype, and the AutocastPrivateUse1 kernels that apply it.

PyTorch registers no autocast kernels for an out-of-tree backend's dispatch key, so without `register()`
every op under `torch.autocast("fl")` fails. The lists are CUDA's policy: matmul/convolution-like ops
(LOWER) in the autocast dtype, numerically sensitive ops (losses, norms, exp/log, softmax, sums; FLOAT32)
in float32, multi-input ops (cat, stack, addcmul ...; PROMOTE) in their widest input dtype."""

from __future__ import annotations

import torch

from ..dispatch import autocast_kernel
from ..runtime import not_traced

LOWER = [
    "mm",
    "bmm",
    "addmm",
    "addmv",
    "addr",
    "baddbmm",
    "addbmm",
    "matmul",
    "mv",
    "linear",
    "chain_matmul",
    "linalg_multi_dot",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "_convolution",
    "convolution",
    "prelu",
    "scaled_dot_product_attention",
    "conv_tbc",
]
FLOAT32 = [
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow",
    "softplus",
    "layer_norm",
    "group_norm",
    "frobenius_norm",
    "nuclear_norm",
    "cosine_similarity",
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "nll_loss2d",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "margin_ranking_loss",
    "multilabel_margin_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    "binary_cross_entropy_with_logits",
    "dist",
    "pdist",
    "cdist",
    "renorm",
    "logsumexp",
    "softmax",
    "log_softmax",
    "cross_entropy_loss",
    "cumsum",
    "cumprod",
    "prod",
    "sum",
    "norm",
    "linalg_vector_norm",
    "upsample_bilinear2d",
    "upsample_nearest2d",
]
PROMOTE = [
    "addcdiv",
    "addcmul",
    "atan2",
    "bilinear",
    "cross",
    "dot",
    "grid_sampler",
    "index_put",
    "scatter_add",
    "tensordot",
    "cat",
    "stack",
]

_libs: list = []


def register() -> None:
    """Autocast for the fl device: a fall-through for every op, then the casting kernels."""
    if _libs:
        return
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, dispatch_key="AutocastPrivateUse1")
    lib = torch.library.Library("aten", "IMPL")
    for names, policy in ((LOWER, "lower"), (FLOAT32, "fp32"), (PROMOTE, "promote")):
        for name in names:
            packet = getattr(torch.ops.aten, name, None)
            if packet is None:
                continue
            for overload in packet.overloads():
                op = getattr(packet, overload)
                if any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
                    continue  # out= and in-place overloads keep their dtypes, as under CUDA autocast
                qualified = name if overload == "default" else f"{name}.{overload}"
                try:
                    lib.impl(qualified, not_traced(autocast_kernel(op, policy)), "AutocastPrivateUse1")
                except RuntimeError:  # an overload with a kernel there already
                    continue
    _libs.extend([fallthrough, lib])
