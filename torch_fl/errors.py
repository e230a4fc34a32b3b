"""Exceptions torch_fl raises. Each message names the problem and the fix."""

from __future__ import annotations


class FlError(RuntimeError):
    """Base class of torch_fl's own errors."""


class PluginLoadError(FlError):
    """A plugin file could not be used: not a plugin, wrong ABI, missing entry points."""


class BackendNotFoundError(FlError, ValueError):
    """A backend name that no loaded plugin provides."""


class KernelError(FlError):
    """A plugin kernel returned an error status (`status`: the FL_ERR_* code, when known)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class PrivateUse1TakenError(FlError):
    """Another package already owns PyTorch's PrivateUse1 device slot."""
