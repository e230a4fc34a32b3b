"""Exceptions torch_fl raises. Each message names the problem and the fix."""

from __future__ import annotations


class FlError(RuntimeError):
    """Base class of torch_fl's own errors."""


class PluginLoadError(FlError):
    """A plugin file could not be used: not a plugin, wrong ABI, missing entry points."""


class PluginUnavailableError(PluginLoadError):
    """A sound plugin whose device is not on this machine (fl_plugin_init returned FL_ERR_UNSUPPORTED: no
    OpenCL driver, no GPU): listed as unavailable, with its name and the plugin's reason."""

    def __init__(self, message: str, name: str | None = None) -> None:
        super().__init__(message)
        self.backend_name = name


class BackendNotFoundError(FlError, ValueError):
    """A backend name that no loaded plugin provides."""


class KernelError(FlError):
    """A plugin kernel returned an error status (`status`: the FL_ERR_* code, when known)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class KernelIndexError(KernelError, IndexError):
    """A kernel of an indexing op (index, index_put_, index_select, embedding, take, ...) refused an index out
    of range: an IndexError, as PyTorch raises for these ops, so code that catches IndexError works on fl."""


class PrivateUse1TakenError(FlError):
    """Another package already owns PyTorch's PrivateUse1 device slot."""


class ConfigError(FlError, ValueError):
    """A setting (an FL_* variable or a config-file key) with a value torch_fl does not accept.
    The message names the setting, the value and what is accepted."""


class PluginError(FlError):
    """A loaded plugin broke the fl_plugin.h contract at run time (e.g. malloc returned FL_OK
    with a NULL pointer). The message names the plugin and the entry point."""


class CacheDirError(FlError):
    """A cache folder torch_fl would compile into or load code from is not private to this user."""
