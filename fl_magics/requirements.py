"""The `jupyter` extra's packages (pyproject.toml; tests/notebook/test_notebook_layer.py keeps the two the same), named
where IPython is missing so that a user with torch_fl installed adds them without rebuilding torch_fl."""

JUPYTER_PACKAGES = ("ipython>=8", "ipywidgets>=8", "plotly>=5", "ipykernel", "jupyterlab>=4")
