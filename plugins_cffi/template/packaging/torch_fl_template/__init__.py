"""Example Vendor's torch_fl plugin, shipped as a pip package.

torch_fl discovers it through the entry point `template` in the group
`torch_fl.plugins` (see pyproject.toml), which names `plugin_path` below. The
function runs during torch_fl's plugin discovery, so it must stay cheap: no
import of torch, no device initialisation; it only says where the library is.
"""

from __future__ import annotations

import os

__all__ = ["plugin_path"]

_LIBRARY = "libfl_template.so"


def plugin_path() -> str:
    """Absolute path of the plugin library built into this package."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), _LIBRARY)
    if not os.path.exists(path):
        # torch_fl turns this into a "rejected" entry in torch_fl.list_backends()
        raise FileNotFoundError(
            f"{path} is missing: the package was installed without building its plugin; "
            f"reinstall it with `pip install --force-reinstall torch-fl-template`"
        )
    return path
