"""Discovery, loading and selection of backends, and the global fl device table.

Start-up follows the article's three steps: enumerate plugins (bundled, pip
entry points in group `torch_fl.plugins`, FL_PLUGIN_PATH), probe each into a
capability table, and assemble the backend the user asked for. Devices of all
loaded backends share one index space: fl:0..N."""

from __future__ import annotations

import glob
import os
import threading
from dataclasses import dataclass, field
from importlib import metadata

import torch

from . import _config, _core, _memory
from ._plugin import DeviceProps, Plugin
from .errors import BackendNotFoundError, FlError, PluginLoadError

ENTRY_POINT_GROUP = "torch_fl.plugins"
_BUNDLED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_plugins")
_ORIGIN_RANK = {"FL_PLUGIN_PATH": 0, "entry point": 1, "bundled": 2}


@dataclass
class Candidate:
    """One plugin file the loader looked at, and what became of it."""

    path: str
    origin: str
    status: str = "pending"  # loaded | rejected | shadowed
    reason: str = ""
    name: str | None = None
    emulated: bool | None = None
    plugin: Plugin | None = field(default=None, repr=False)

    def as_dict(self) -> dict:
        return {"name": self.name, "path": self.path, "origin": self.origin, "status": self.status,
                "reason": self.reason, "emulated": self.emulated}


class Device:
    """One fl device: a plugin's local device behind a global fl index. Its memory is managed by the
    C++ core's caching allocator (one pool per device); the stats below are read from there."""

    def __init__(self, backend: Backend, local: int, index: int, props: DeviceProps):
        self.backend = backend
        self.plugin = backend.plugin
        self.local = local
        self.index = index
        self.props = props
        self.torch_device = torch.device("fl", index)
        self.host_accessible = props.host_accessible
        _core.add_device(self, _memory.default_pool_limit(props.total_memory))

    def memory(self) -> dict[str, int]:
        """allocated (live tensor bytes), peak, cached (pool), allocations, hits, misses, limit, ..."""
        return _core.memory_stats(self.index)

    @property
    def allocated(self) -> int:
        return self.memory()["allocated"]

    @property
    def peak(self) -> int:
        return self.memory()["peak"]

    @peak.setter
    def peak(self, value: int) -> None:
        """The peak becomes max(value, allocated) (0 resets it)."""
        _core.lib().fl_core_set_peak(self.index, int(value))

    @property
    def pool_hits(self) -> int:
        return self.memory()["hits"]

    @property
    def pool_misses(self) -> int:
        return self.memory()["misses"]

    @property
    def cached(self) -> int:
        return self.memory()["cached"]

    @property
    def pool_limit(self) -> int:
        return self.memory()["limit"]

    def __repr__(self) -> str:
        return f"<fl:{self.index} {self.backend.name}:{self.local} {self.props.name}>"


class Backend:
    """A loaded plugin, its devices, and the dispatcher state kept per backend."""

    def __init__(self, plugin: Plugin, first_index: int):
        self.plugin = plugin
        self.name = plugin.name
        self.devices = [Device(self, i, first_index + i, p) for i, p in enumerate(plugin.devices)]
        self.plans: dict = {}  # dispatcher decisions, keyed by (op, dtypes)
        self.own_counts: dict = {}  # (op name, path) -> calls the Python dispatcher served
        self._capabilities = None

    @property
    def counts(self) -> dict:
        """(op name, path) -> calls, always on: the Python dispatcher's counts plus the calls the C++ core's
        fast path served."""
        _core.drain_counts()
        return self.own_counts

    @property
    def capabilities(self):
        if self._capabilities is None:
            from ._capability import probe

            self._capabilities = probe(self)
        return self._capabilities

    def __repr__(self) -> str:
        return f"<Backend {self.name!r} devices={[d.index for d in self.devices]}>"


class Registry:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.candidates: list[Candidate] = []
        self.backends: dict[str, Backend] = {}
        self.devices: list[Device] = []
        self.current: Backend | None = None
        self._current_device: Device | None = None
        self.discovered = False

    @property
    def current_device(self) -> Device | None:
        return self._current_device

    @current_device.setter
    def current_device(self, dev: Device | None) -> None:
        # the C++ device guard answers PyTorch's "which fl device is current"
        self._current_device = dev
        if dev is not None:
            _core.set_current(dev.index)

    # -- discovery ------------------------------------------------------------
    def _candidate_paths(self) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        for path in sorted(glob.glob(os.path.join(_BUNDLED_DIR, "lib*.so"))):
            found.append((path, "bundled"))
        try:
            eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
        except Exception:  # a broken distribution must not stop discovery
            eps = []
        for ep in eps:
            try:
                target = ep.load()
                path = target() if callable(target) else target
                found.append((os.fspath(path), "entry point"))
            except Exception as e:
                self.candidates.append(Candidate(f"{ep.value}", "entry point", "rejected",
                                                 f"entry point {ep.name!r} failed to load: {e}"))
        search = os.environ.get("FL_PLUGIN_PATH", "")
        cfg_paths = _config.load_config().get("plugin_path", [])
        for entry in [p for p in search.split(os.pathsep) if p] + list(cfg_paths):
            if os.path.isdir(entry):
                for path in sorted(glob.glob(os.path.join(entry, "*.so"))):
                    found.append((path, "FL_PLUGIN_PATH"))
            elif os.path.exists(entry):
                found.append((entry, "FL_PLUGIN_PATH"))
            else:
                self.candidates.append(Candidate(entry, "FL_PLUGIN_PATH", "rejected", "no such file or directory"))
        return found

    def discover(self) -> None:
        with self.lock:
            if self.discovered:
                return
            self.discovered = True
            loaded: list[Candidate] = []
            for path, origin in self._candidate_paths():
                cand = Candidate(path, origin)
                self.candidates.append(cand)
                try:
                    cand.plugin = Plugin(path, origin)
                except PluginLoadError as e:
                    cand.status, cand.reason = "rejected", str(e)
                    continue
                except Exception as e:  # noqa: BLE001 - any failure of a foreign library is a rejection
                    cand.status, cand.reason = "rejected", f"{type(e).__name__}: {e}"
                    continue
                cand.name, cand.emulated = cand.plugin.name, cand.plugin.emulated
                loaded.append(cand)
            # One plugin per name: a real plugin beats an emulator; then the
            # search path beats entry points beats bundled.
            by_name: dict[str, Candidate] = {}
            for cand in sorted(loaded, key=lambda c: (c.emulated, _ORIGIN_RANK[c.origin])):
                if cand.name in by_name:
                    winner = by_name[cand.name]
                    cand.status = "shadowed"
                    cand.reason = (f"another plugin named {cand.name!r} takes precedence: {winner.path} "
                                   f"({'emulated' if winner.emulated else 'real'}, {winner.origin})")
                    continue
                by_name[cand.name] = cand
                cand.status = "loaded"
            # stable device numbering: the host backend first, then by name
            for name in sorted(by_name, key=lambda n: (n != "cpu", n)):
                backend = Backend(by_name[name].plugin, len(self.devices))
                self.backends[name] = backend
                self.devices.extend(backend.devices)

    # -- selection ------------------------------------------------------------
    def available(self) -> list[str]:
        self.discover()
        return list(self.backends)

    def get(self, name: str) -> Backend:
        self.discover()
        backend = self.backends.get(name)
        if backend is None:
            raise BackendNotFoundError(self._unknown_message(name))
        return backend

    def _unknown_message(self, name: str) -> str:
        avail = ", ".join(self.backends) or "none"
        msg = f"unknown fl backend {name!r}; available backends: {avail}"
        rejected = [c for c in self.candidates if c.status == "rejected" and (c.name == name or name in c.path)]
        for c in rejected:
            msg += f"\n  {c.path} was rejected: {c.reason}"
        return msg + "\n(see torch_fl.list_backends() for every plugin found and why any was rejected)"

    def auto(self) -> Backend:
        """The most capable backend: real accelerators, then the host, then
        emulators; more native kernels first among equals."""
        self.discover()
        if not self.backends:
            raise FlError("no fl backend could be loaded; torch_fl.list_backends() says why")

        def score(b: Backend):
            host = all(d.host_accessible for d in b.devices)
            tier = 0 if not b.plugin.emulated and not host else (1 if not b.plugin.emulated else 2)
            return (tier, -len(b.plugin.kernels), b.name)

        return min(self.backends.values(), key=score)

    def select(self, name: str | None) -> Backend:
        with self.lock:
            if name is None:
                name = os.environ.get("FL_BACKEND") or _config.load_config().get("backend") or "auto"
            backend = self.auto() if name == "auto" else self.get(name)
            if not backend.devices:
                raise FlError(f"fl backend {backend.name!r} reports no devices")
            self.current = backend
            self.current_device = backend.devices[0]
            return backend

    def ensure(self) -> Backend:
        if self.current is None:
            self.select(None)
        assert self.current is not None
        return self.current

    def device(self, index: int | None) -> Device:
        self.discover()
        if index is None:
            self.ensure()
            assert self.current_device is not None
            return self.current_device
        if not 0 <= index < len(self.devices):
            raise FlError(f"fl:{index} does not exist: there are {len(self.devices)} fl devices "
                          f"({', '.join(f'fl:{d.index}={d.backend.name}' for d in self.devices)})")
        return self.devices[index]


REGISTRY = Registry()
