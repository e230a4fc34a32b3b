"""Settings from the environment and the config file, read once per call site.

Where settings come from, strongest first: arguments to torch_fl calls, the
environment (FL_BACKEND, FL_CPU_FALLBACK, FL_PLUGIN_PATH), then the config file:
$FL_CONFIG if set, else ./torch_fl.toml, else ~/.config/torch_fl/config.toml.

    # torch_fl.toml
    backend = "rocm"          # like FL_BACKEND
    cpu_fallback = true       # like FL_CPU_FALLBACK
    plugin_path = ["/opt/vendor/lib"]
"""

from __future__ import annotations

import os
from typing import Any

import tomllib

from .errors import FlError


def config_path() -> str | None:
    explicit = os.environ.get("FL_CONFIG")
    if explicit:
        if not os.path.exists(explicit):
            raise FlError(f"FL_CONFIG points to {explicit}, which does not exist: fix the path or unset FL_CONFIG")
        return explicit
    for path in (os.path.join(os.getcwd(), "torch_fl.toml"),
                 os.path.join(os.path.expanduser("~"), ".config", "torch_fl", "config.toml")):
        if os.path.exists(path):
            return path
    return None


def load_config() -> dict[str, Any]:
    path = config_path()
    if path is None:
        return {}
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise FlError(f"config file {path} is not valid TOML: {e}") from None
    known = {"backend", "cpu_fallback", "plugin_path"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise FlError(
            f"config file {path}: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(known))}"
        )
    data["_path"] = path
    return data


def parse_bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise FlError(f"{name}={value!r} is not a boolean: use 1 or 0")
