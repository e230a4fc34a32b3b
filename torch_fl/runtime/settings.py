"""Switches the dispatcher reads on every plan: the CPU fallback (FL_CPU_FALLBACK, the config
file's `cpu_fallback`, torch_fl.set_cpu_fallback) and the paths switched off for a test or the
bring-up of a new chip (disabled_paths). Plans are cached per backend, so changing a switch
forgets them (clear_plans), in Python and in the C++ core's fast path."""

from __future__ import annotations

import contextlib
import os

from . import config, core
from .events import DECOMPOSITION, JIT, NATIVE
from .registry import REGISTRY


class Settings:
    def __init__(self) -> None:
        self._cpu_fallback: bool | None = None
        self.disabled: frozenset = frozenset()  # paths switched off (tests, bring-up of a new chip)

    @property
    def cpu_fallback(self) -> bool:
        if self._cpu_fallback is None:
            env = os.environ.get("FL_CPU_FALLBACK")
            if env is not None and env != "":
                self._cpu_fallback = config.parse_bool(env, "FL_CPU_FALLBACK")
            else:
                self._cpu_fallback = config.parse_bool(config.load_config().get("cpu_fallback", True), "cpu_fallback")
        return self._cpu_fallback

    @cpu_fallback.setter
    def cpu_fallback(self, value: bool) -> None:
        self._cpu_fallback = bool(value)
        clear_plans()


SETTINGS = Settings()


@contextlib.contextmanager
def disabled_paths(*paths: str):
    """Switch dispatch paths off inside the block, e.g. disabled_paths("native")
    runs every op through decomposition or fallback, to check those paths."""
    unknown = set(paths) - {NATIVE, DECOMPOSITION, JIT}
    if unknown:
        raise ValueError(
            f"can only disable native, decomposition or jit (the CPU fallback has its own switch), "
            f"not {', '.join(sorted(unknown))}"
        )
    before = SETTINGS.disabled
    SETTINGS.disabled = frozenset(paths) | before
    clear_plans()
    try:
        yield
    finally:
        SETTINGS.disabled = before
        clear_plans()


def clear_plans() -> None:
    """Forget every backend's cached plans and the C++ fast paths' committed calls (native and CPU fallback)."""
    if core.loaded():
        core.lib().fl_core_fast_clear()
        core.lib().fl_fallback_clear()  # the CPU fallback's committed calls (csrc/fl_cpu_fallback.cpp)
    for backend in REGISTRY.backends.values():
        backend.plans.clear()
