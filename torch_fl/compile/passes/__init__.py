"""The passes of backend="fl", one module each, and the order the backend runs them in.

Some passes rewrite Dynamo's graph, before AOTAutograd: their replacement is an
fl:: op with an autograd formula, so AOTAutograd's own trace puts the fused
forward kernel in the forward graph and its one-kernel backward in the backward
graph (matching the backward's mm/sum chains in the aten graph is left out that
way). The others rewrite the aten graphs (forward, backward, inference), where
the backward graph exists and where ops are what a plugin implements.

Passes (same names as `fl.compile`; switch one off with
`torch.compile(m, backend="fl", options={"passes": {"attention": False}})`,
`backend(passes=...)` or FL_FUSION_DISABLE=attention,conv_bn):
  conv_bn     aten inference graphs: conv -> bn -> relu as fl::conv_bn_relu,
              else the batch norm folded into the convolution (cached; conv_bn.py)
  attention   aten graphs: the fused SDPA pair, forward and backward (switched
              off: the math composition); Dynamo's graph: nn.MultiheadAttention's
              self-attention as one QKV GEMM viewed as q, k, v + the fused pair,
              explicit matmul -> softmax -> matmul attention as SDPA (attention.py)
  qkv         Dynamo's graph: linear projections of one input as one GEMM on
              the concatenated weights, split; inference graphs cache the
              concatenation (qkv.py)
  add_norm    Dynamo's graph: (linear ->) (dropout ->) residual add -> LayerNorm
              as fl::linear_add_layer_norm / fl::add_layer_norm; a training
              dropout as their dropout epilogue with a fresh seed per call
              (add_norm.py; the seeded fl:: ops: seeded.py)
  linear_act  Dynamo's graph: linear -> ReLU/GELU as fl::linear_act; with a
              training dropout after it, fl::linear_act_dropout (the kernel's
              dropout epilogue, a fresh seed per call; linear_act.py)
  pointwise   aten graphs: chains of elementwise ops as one JIT kernel, where
              the backend can compile; first, copies eager does not make (the
              clone of a p=0 dropout) go (pointwise_fusion.py)
  layout      aten inference graphs: NHWC activations and cached channels-last
              weights for 2-D convolutions where the device prefers channels-last
              and its kernels write it; the traced layout comes back wherever an op
              could tell (layout.py)

Steps that always run (they change where ops run or undo what tracing added, not
which kernels fuse): nn.TransformerEncoderLayer's fast path expanded on Dynamo's
graph before the passes (encoder_layer.py); batch norm's statistics and buffer
counters updated in place again on the aten graphs before the passes
(inplace.py); the fl:: kernels found in each aten graph recorded after them
(fused_ops.py)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import torch.fx as fx

from ..graph_report import Pattern
from . import add_norm, attention, conv_bn, encoder_layer, fused_ops, inplace, layout, linear_act, pointwise_fusion, qkv
from .base import Pass, PassContext

__all__ = ["PASSES", "PASS_NAMES", "Pass", "PassContext", "enabled_passes", "run_aten", "run_captured"]

PASSES: tuple[Pass, ...] = (
    conv_bn.PASS,
    attention.PASS,
    qkv.PASS,
    add_norm.PASS,
    linear_act.PASS,
    pointwise_fusion.PASS,
    layout.PASS,
)
PASS_NAMES = tuple(p.name for p in PASSES)


def enabled_passes(passes: Mapping[str, bool] | Iterable[str] | None) -> list[str]:
    """The passes to run: all by default; a {name: bool} dict or a list of names
    chooses; FL_FUSION_DISABLE=name,name switches passes off on top."""
    if passes is None:
        chosen = dict.fromkeys(PASS_NAMES, True)
    elif isinstance(passes, Mapping):
        chosen = {n: bool(passes.get(n, True)) for n in PASS_NAMES}
        wanted = list(passes)
    elif isinstance(passes, str):
        raise TypeError(f"passes={passes!r}: give a list of pass names or a dict {{name: bool}}")
    else:
        wanted = list(passes)
        chosen = {n: n in wanted for n in PASS_NAMES}
    if passes is not None:
        unknown = [p for p in wanted if p not in PASS_NAMES]
        if unknown:
            raise ValueError(f"unknown fusion pass(es) {unknown}; the passes are {list(PASS_NAMES)}")
    for name in filter(None, (s.strip() for s in os.environ.get("FL_FUSION_DISABLE", "").split(","))):
        if name not in PASS_NAMES:
            raise ValueError(f"FL_FUSION_DISABLE names an unknown pass {name!r}; the passes are {list(PASS_NAMES)}")
        chosen[name] = False
    return [n for n in PASS_NAMES if chosen[n]]


def run_captured(gm: fx.GraphModule, kernels: set, patterns: list[Pattern], passes: list[str]) -> None:
    """Dynamo's graph, before AOTAutograd: the encoder fast path expanded, then each chosen pass's rewrite."""
    encoder_layer.encoder_fast_path(gm, patterns)
    for p in PASSES:
        if p.name in passes and p.captured is not None:
            p.captured(gm, kernels, patterns, passes)


def run_aten(ctx: PassContext, passes: list[str]) -> None:
    """One aten graph: buffer updates in place, each chosen pass (a pass switched off runs its `off`
    rewrite, where it has one), then the fl:: kernels recorded."""
    inplace.buffer_updates(ctx)
    for p in PASSES:
        if p.name in passes:
            if p.aten is not None:
                p.aten(ctx)
        elif p.off is not None:
            p.off(ctx)
    fused_ops.fused_ops(ctx)
