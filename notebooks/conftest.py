"""nbval's kernels for the notebooks: Plotly figures as their JSON mime bundle (deterministic, comparable), the
setting notebooks/build.py gives the kernels that build them (so no notebook cell has to say it)."""

import os

os.environ.setdefault("PLOTLY_RENDERER", "plotly_mimetype")
