"""What a pass of backend="fl" is, and what an aten-graph pass is handed.

A pass has a name (what `fl.compile(passes=...)` and FL_FUSION_DISABLE take) and
up to three functions: `captured` rewrites Dynamo's graph before AOTAutograd
traces it, `aten` rewrites each aten graph AOTAutograd makes (forward, backward,
inference), `off` runs on the aten graphs instead of `aten` when the pass is
switched off (attention: the fused pair becomes the math composition). The
registry (passes/__init__.py) runs them in its order."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch.fx as fx

from ..graph_report import Pattern
from .fxnodes import op_name, where

CapturedFn = Callable[[fx.GraphModule, set, list[Pattern], list[str]], None]  # (gm, kernels, patterns, passes)


@dataclass
class PassContext:
    """One aten graph as the passes see it: its kind, the backend and the kernels its
    capability table declares, and the patterns recorded so far (the report's)."""

    gm: fx.GraphModule
    kind: str  # "forward", "backward" or "inference"
    backend: str
    kernels: set
    patterns: list[Pattern]
    # what a pass of a training step's forward graph tells the same pass of its backward graph (compiled after
    # it, from the same Dynamo graph): the layout pass names the saved tensors it left channels-last
    shared: dict = field(default_factory=dict)
    # the names of the graph's output nodes, by position, as AOTAutograd made them (before any pass renamed a
    # node): a forward's saved tensors are its backward's placeholders of those names
    output_names: list = field(default_factory=list)

    def has(self, *names: str) -> bool:
        return all(n in self.kernels for n in names)

    def record(
        self, pattern: str, nodes: list[fx.Node], replacement: str, applied: bool = True, note: str = ""
    ) -> None:
        self.patterns.append(
            Pattern(pattern, self.kind, where(nodes[0]), [op_name(n) for n in nodes], replacement, applied, note)
        )


AtenFn = Callable[[PassContext], None]


@dataclass(frozen=True)
class Pass:
    """One switchable pass: its name and the graphs it rewrites."""

    name: str
    captured: CapturedFn | None = None
    aten: AtenFn | None = None
    off: AtenFn | None = None

    def __post_init__(self) -> None:
        if self.captured is None and self.aten is None:
            raise ValueError(f"pass {self.name!r} rewrites no graph: give it a captured or an aten function")
