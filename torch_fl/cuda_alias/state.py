"""What the cuda alias changed in this process, and how to undo it.

Every replacement goes through `replace()`, which records what was there before; `restore()` puts it all
back, newest first, so a failure while turning the alias on leaves torch.cuda as it was. STATE holds the
switches the other modules read (on, forced, the nccl notice said, a legacy default tensor type set)."""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable
from typing import Any

LOCK = threading.RLock()
STATE: dict[str, Any] = {"active": False, "forced": False, "nccl_said": False}
MISSING = object()
# (owner, name, what was in owner.__dict__ or MISSING), in the order the alias replaced them: what
# restore() puts back if turning the alias on fails half-way
ORIGINALS: list[tuple[Any, str, Any]] = []


def replace(owner: Any, name: str, value: Any) -> None:
    """owner.name = value, remembering what owner's own __dict__ held (restore() puts it back)."""
    ORIGINALS.append((owner, name, owner.__dict__.get(name, MISSING)))
    setattr(owner, name, value)


def restore() -> None:
    """Undo every replacement, newest first: a failure while turning the alias on must not leave half of
    torch.cuda answering for fl (the half-done alias the issue warns about)."""
    while ORIGINALS:
        owner, name, value = ORIGINALS.pop()
        if value is MISSING:
            with contextlib.suppress(AttributeError):
                delattr(owner, name)
        else:
            setattr(owner, name, value)
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, PatchOnImport)]


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs `patch(module)` right after the module `name` is first imported."""

    def __init__(self, name: str, patch: Callable[[Any], None]) -> None:
        self.name, self.patch = name, patch

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, patch = spec.loader.exec_module, self.patch

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]  # this loader instance only
        return spec
