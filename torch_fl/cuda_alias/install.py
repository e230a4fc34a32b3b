"""Putting every replacement in place: torch.cuda's covered and unsupported names (wherever torch.cuda
re-exports them), the modules that only raise, the leftover torch.cuda functions (wrapped so that an error
from the missing CUDA runtime names them), the legacy types, and the patches of autocast_storage.py and
parallel.py (looked up there at call time, so a test can replace one)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
from collections.abc import Callable
from typing import Any

import torch

from ..errors import FlError
from . import autocast_storage, parallel
from .errors import UnsupportedCudaFeatureError
from .mode import LEGACY_DTYPES, legacy_class, legacy_default_tensor_type
from .state import PatchOnImport, replace
from .torch_cuda import COVERED
from .unsupported import UNSUPPORTED, UNSUPPORTED_MODULES, raiser, raising_class, unsupported_message


def _cuda_modules() -> list[Any]:
    """torch.cuda and its loaded submodules: a replaced function is replaced wherever torch.cuda re-exports it."""
    return [
        m for n, m in list(sys.modules.items()) if m is not None and (n == "torch.cuda" or n.startswith("torch.cuda."))
    ]


def _replace_everywhere(name: str, value: Any) -> None:
    original = getattr(torch.cuda, name, None)
    replace(torch.cuda, name, value)
    if original is None:
        return
    for module in _cuda_modules():
        if module is not torch.cuda and module.__dict__.get(name) is original:
            replace(module, name, value)


def _wrap_leftover(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A torch.cuda function neither covered nor listed as unsupported: it runs as before, but an error from
    PyTorch's missing CUDA runtime comes back naming the function and the alias."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (AssertionError, RuntimeError, AttributeError) as e:
            if "cuda" not in str(e).lower() or isinstance(e, FlError):
                raise
            raise UnsupportedCudaFeatureError(
                unsupported_message(
                    f"torch.cuda.{name}",
                    f"it reached PyTorch's CUDA runtime, which this process does not use "
                    f"({type(e).__name__}: {str(e).splitlines()[0]})",
                    "Leave it out on an fl backend",
                )
            ) from e

    return call


def install() -> None:
    import inspect

    for mod_name in UNSUPPORTED_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(mod_name)
    for name, value in COVERED.items():
        _replace_everywhere(name, value)
    for name, reason in UNSUPPORTED.items():
        original = getattr(torch.cuda, name, None)
        stand_in = (raising_class if inspect.isclass(original) else raiser)(f"torch.cuda.{name}", *reason)
        _replace_everywhere(name, stand_in)
    for mod_name, reason in UNSUPPORTED_MODULES.items():
        module = sys.modules.get(mod_name)
        if module is None:
            continue
        for name, value in list(vars(module).items()):
            if name.startswith("_") and not (mod_name == "torch.cuda.jiterator" and name.startswith("_create")):
                continue
            if getattr(value, "__module__", None) != mod_name:
                continue  # names it imported from elsewhere (typing, torch)
            if inspect.isclass(value):
                replace(module, name, raising_class(f"{mod_name}.{name}", *reason))
            elif callable(value):
                replace(module, name, raiser(f"{mod_name}.{name}", *reason))
    for name, value in list(vars(torch.cuda).items()):
        if (
            not name.startswith("_")
            and inspect.isfunction(value)
            and name not in COVERED
            and name not in UNSUPPORTED
            and value.__module__.startswith("torch.cuda")
        ):
            _replace_everywhere(name, _wrap_leftover(name, value))
    for name in LEGACY_DTYPES:
        if hasattr(torch.cuda, name):
            replace(torch.cuda, name, legacy_class(name))
    replace(torch, "set_default_tensor_type", legacy_default_tensor_type(torch.set_default_tensor_type))
    autocast_storage.patch_amp()
    autocast_storage.patch_storages()
    parallel.patch_distributed()
    parallel.patch_data_parallel()
    extensions = sys.modules.get("torch.utils.cpp_extension")
    if extensions is not None:
        parallel.patch_extensions(extensions)
    else:  # importing it pulls in setuptools: patch it when the program imports it, not before
        sys.meta_path.insert(0, PatchOnImport("torch.utils.cpp_extension", parallel.patch_extensions))
