"""The notebook layer: renders what torch_fl's Python API returns (plotly
figures, ipywidgets). No logic of its own: every number comes from a
torch_fl object passed in."""

from ..progress import register_bar
from .explorer import CapabilityExplorer
from .figures import (
    alignment_layers,
    alignment_losses,
    comparison_kernels,
    fallback_paths,
    fusion_figure,
    fusion_patterns,
    time_by_path,
)
from .progress_bar import ProgressBar
from .watch_view import WatchView, loss_svg

register_bar(ProgressBar)  # long runs (plugin check, doctor, zoo, coverage) show this bar inside a kernel

__all__ = [
    "CapabilityExplorer",
    "alignment_layers",
    "alignment_losses",
    "comparison_kernels",
    "fallback_paths",
    "fusion_figure",
    "fusion_patterns",
    "loss_svg",
    "ProgressBar",
    "time_by_path",
    "WatchView",
]
