"""torch_fl's own fused ops, for kernels no aten op describes.

`fl::conv2d_nhwc` (conv_nhwc.py) is a 2-D convolution whose output is
channels-last, with a fake implementation that says so and a backward op
whose input gradient is channels-last too: what the `layout` pass of
torch.compile puts in the graphs of devices that prefer NHWC, and what
`conv2d_nhwc(x, w, ...)` calls directly.
`fl::conv_bn_relu` (conv_bn.py) is convolution -> inference batch norm -> ReLU
in one op: the ascend emulator has a kernel for it, torch.compile's `conv_bn`
pass rewrites inference graphs into it, `conv_bn_relu(conv, bn, x)` calls it.
The GEMM-epilogue, residual-add + LayerNorm and attention-with-dropout ops
the `rocm` emulator has kernels for (`fl::linear_act`,
`fl::linear_add_layer_norm`, `fl::add_layer_norm`, `fl::attention_dropout`,
each with a one-kernel backward op) are epilogues.py's.

Importing this package (torch_fl does) defines the ops, their autocast
kernels, and registers their reference decompositions with the dispatcher's
table (dispatch.DECOMPOSITIONS), so every backend without a kernel runs them."""

from __future__ import annotations

from ..dispatch import DECOMPOSITIONS
from . import conv_bn, conv_nhwc, epilogues
from .conv_bn import conv_bn_relu, conv_bn_relu_op
from .conv_nhwc import conv2d_nhwc
from .epilogues import (
    ACTIVATIONS,
    ADD_NORM_KERNELS,
    ATTENTION_DROPOUT_KERNELS,
    LINEAR_ACT_KERNELS,
    LINEAR_ADD_NORM_KERNELS,
    add_layer_norm,
    attention_dropout,
    keep_mask,
    linear_act,
    linear_add_layer_norm,
    new_seed,
)


def register_decompositions(table: dict) -> None:
    """Backends without a native kernel run the unfused aten ops: every fused op's reference into `table`
    (the dispatcher's, when this package is imported; a fresh one for the plugin checker)."""
    conv_bn.register_decompositions(table)
    conv_nhwc.register_decompositions(table)
    epilogues.register_decompositions(table)


register_decompositions(DECOMPOSITIONS)

__all__ = [
    "ACTIVATIONS",
    "ADD_NORM_KERNELS",
    "ATTENTION_DROPOUT_KERNELS",
    "LINEAR_ACT_KERNELS",
    "LINEAR_ADD_NORM_KERNELS",
    "add_layer_norm",
    "attention_dropout",
    "conv2d_nhwc",
    "conv_bn_relu",
    "conv_bn_relu_op",
    "keep_mask",
    "linear_act",
    "linear_add_layer_norm",
    "new_seed",
    "register_decompositions",
]
