"""The dispatcher: every aten op on an fl tensor that the C++ core does not serve
itself reaches `entry`, which serves it by the first tier that can: the plugin's
native kernel, a decomposition into other ops, a JIT-compiled kernel, the CPU
fallback.

entry.py installs it with PyTorch and picks each op's handler; plan.py holds the
tiers (a plan per op signature, resolved once and cached per backend, out=
overloads served by their functional twin); facts.py what an op's schema says;
meta.py the ops that move no numbers (views, metadata, copies); fallback.py the
CPU fallback; decompositions/ the decomposition table; argcheck.py and
overlap.py the checks PyTorch makes before any kernel. It stands on the runtime
(torch_fl.runtime) and the JIT (torch_fl.jit) and imports only what they
export."""

from __future__ import annotations

from .autocast import autocast_kernel, tensor_map, tensors_in
from .decompositions import DECOMPOSITIONS
from .decompositions.attention import sdpa_backward, sdpa_forward, sdpa_fused_eligible, sdpa_scores
from .entry import DIRECT, dispatch, entry, install, overload_named, set_dispatch
from .facts import OpFacts, facts, functional_twin, op_name, resolve_op
from .plan import Plan, resolve

__all__ = [
    "DECOMPOSITIONS",
    "DIRECT",
    "autocast_kernel",
    "tensor_map",
    "tensors_in",
    "OpFacts",
    "Plan",
    "dispatch",
    "entry",
    "facts",
    "functional_twin",
    "install",
    "op_name",
    "overload_named",
    "resolve",
    "resolve_op",
    "sdpa_backward",
    "sdpa_forward",
    "sdpa_fused_eligible",
    "sdpa_scores",
    "set_dispatch",
]
