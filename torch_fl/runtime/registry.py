"""Discovery, loading and selection of backends, and the global fl device table.

Start-up follows the Torch-FL article's three steps: enumerate plugins (bundled, pip
entry points in group `torch_fl.plugins`, FL_PLUGIN_PATH), probe each into a
capability table, and assemble the backend the user asked for. Devices of all
loaded backends share one index space: fl:0..N."""

from __future__ import annotations

import contextlib
import glob
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from importlib import metadata

import torch

from ..errors import BackendNotFoundError, FlError, PluginLoadError, PluginUnavailableError
from . import abi, config, core, elf, isolation, memory
from .abi import ffi
from .capability import probe
from .plugin import DeviceProps, Plugin

ENTRY_POINT_GROUP = "torch_fl.plugins"
_BUNDLED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugins")  # setup.py builds them here
# which plugin wins a name: the environment, then the config file, then pip entry points, then bundled
_ORIGIN_RANK = {"FL_PLUGIN_PATH": 0, "config file": 1, "entry point": 2, "bundled": 3}


@dataclass
class Candidate:
    """One plugin file the loader looked at, and what became of it.

    origin is the kind of place it came from (bundled, entry point, FL_PLUGIN_PATH,
    config file); source says exactly which (the entry point, the variable's entry,
    the config file's path)."""

    path: str
    origin: str
    status: str = "pending"  # loaded | rejected | shadowed | unavailable (its device is not on this machine)
    reason: str = ""
    name: str | None = None
    emulated: bool | None = None
    source: str = ""
    plugin: Plugin | None = field(default=None, repr=False)

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "path": self.path,
            "origin": self.origin,
            "source": self.source,
            "status": self.status,
            "reason": self.reason,
            "emulated": self.emulated,
        }


class Device:
    """One fl device: a plugin's local device behind a global fl index. Its memory is managed by the
    C++ core's caching allocator, one pool per device (`pool`); the stats below are read from there."""

    def __init__(self, backend: Backend, local: int, index: int, props: DeviceProps):
        self.backend = backend
        self.plugin = backend.plugin
        self.local = local
        self.index = index
        self.props = props
        self.torch_device = torch.device("fl", index)
        self.host_accessible = props.host_accessible
        core.add_device(self, memory.default_pool_limit(props.total_memory))
        self.pool = memory.Pool(index)

    def memory(self) -> dict[str, int]:
        """allocated (live tensor bytes), peak, cached (pool), allocations, hits, misses, limit, ..."""
        return self.pool.stats()

    @property
    def allocated(self) -> int:
        return self.memory()["allocated"]

    @property
    def peak(self) -> int:
        return self.memory()["peak"]

    @peak.setter
    def peak(self, value: int) -> None:
        """The peak becomes max(value, allocated) (0 resets it)."""
        self.pool.set_peak(value)

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

    def stream(self):
        """This thread's current stream on the device as the plugin's handle (NULL: the default stream):
        where kernels, fills and copies go, as CUDA code expects (`with torch.fl.stream(s):`)."""
        if not core.streams_made():
            return ffi.NULL
        return core.lib().fl_core_current_stream(self.index)

    # Host copies on the current stream, done when the call returns (a NULL-stream copy blocks by the copy
    # contract; on another stream the runtime waits for that stream). Device copies are the C++ core's
    # (copy_d2d_on in csrc/fl_guard.cpp).
    def copy_h2d(self, dst: int, src: int, nbytes: int) -> None:
        s = self.stream()
        self.plugin.copy_h2d(self.local, dst, src, nbytes, s)
        if s != ffi.NULL:
            self.plugin.stream_synchronize(self.local, s)

    def copy_d2h(self, dst: int, src: int, nbytes: int) -> None:
        s = self.stream()
        self.plugin.copy_d2h(self.local, dst, src, nbytes, s)
        if s != ffi.NULL:
            self.plugin.stream_synchronize(self.local, s)

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
        core.drain_counts()
        return self.own_counts

    @property
    def capabilities(self):
        if self._capabilities is None:
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
            core.set_current(dev.index)

    # -- discovery ------------------------------------------------------------
    def _candidate_paths(self) -> list[tuple[str, str, str]]:
        """(path, origin, source) of every plugin file to try; entries that cannot be used
        (missing, relative, writable by every user) become rejected candidates at once."""
        found = [(path, "bundled", "") for path in sorted(glob.glob(os.path.join(_BUNDLED_DIR, "lib*.so")))]
        found += self._entry_point_paths()
        for entry in [p for p in os.environ.get("FL_PLUGIN_PATH", "").split(os.pathsep) if p]:
            if not os.path.isabs(entry):
                self._reject(
                    entry,
                    "FL_PLUGIN_PATH",
                    f"FL_PLUGIN_PATH={entry}",
                    "a relative path: it would load plugins from whatever folder the program runs in; "
                    "give an absolute path (e.g. FL_PLUGIN_PATH=$PWD/" + entry + ")",
                )
                continue
            found += self._expand(entry, "FL_PLUGIN_PATH", f"FL_PLUGIN_PATH={entry}")
        cfg = config.load_config()
        for entry in cfg.get("plugin_path", []):
            found += self._expand(entry, "config file", cfg["_path"])
        return found

    def _entry_point_paths(self) -> list[tuple[str, str, str]]:
        found = []
        try:
            eps: Iterable[metadata.EntryPoint] = metadata.entry_points(group=ENTRY_POINT_GROUP)
        except Exception:  # a broken distribution must not stop discovery
            eps = []
        for ep in eps:
            source = f"entry point {ep.name} = {ep.value}"
            try:
                target = ep.load()
                path = target() if callable(target) else target
                found.append((os.path.abspath(os.fspath(path)), "entry point", source))
            except Exception as e:
                self._reject(f"{ep.value}", "entry point", source, f"entry point {ep.name!r} failed to load: {e}")
        return found

    def _expand(self, entry: str, origin: str, source: str) -> list[tuple[str, str, str]]:
        """The plugin files a path-list entry names: a folder's *.so files, or the file itself.
        A folder or file every user can write is refused: anyone could plant a plugin there."""
        if not os.path.exists(entry):
            self._reject(entry, origin, source, "no such file or directory")
            return []
        unsafe = config.untrusted_reason(os.stat(entry))
        if unsafe and unsafe.startswith("is writable by every user"):
            self._reject(
                entry,
                origin,
                source,
                f"{unsafe}: any user could plant a plugin there, and a plugin is "
                f"code that runs in your process; keep plugins in a folder only you "
                f"(or root) can write",
            )
            return []
        if os.path.isdir(entry):
            return [(path, origin, source) for path in sorted(glob.glob(os.path.join(entry, "*.so")))]
        return [(entry, origin, source)]

    def _reject(self, path: str, origin: str, source: str, reason: str) -> None:
        self.candidates.append(Candidate(path, origin, "rejected", reason, source=source))

    def _load(self, cand: Candidate) -> None:
        """Loads one candidate, or records why not. Files are checked before dlopen (a FIFO
        would hang it, a truncated library crashes it); plugins not bundled with torch_fl are
        loaded once in a throwaway process first (see probe.py), the verdict cached."""
        problem = elf.elf_problem(cand.path)
        if problem is not None:
            cand.status, cand.reason = "rejected", f"{cand.path} is not a loadable shared library: {problem}"
            return
        problem = isolation.crash_verdict(cand.path) if cand.origin != "bundled" else None
        if problem is not None:
            cand.status, cand.reason = "rejected", f"{cand.path}: {problem}"
            return
        try:
            cand.plugin = Plugin(cand.path, cand.origin)
        except PluginUnavailableError as e:
            cand.status, cand.reason = "unavailable", str(e)
            if e.backend_name:
                cand.name = e.backend_name
        except PluginLoadError as e:
            cand.status, cand.reason = "rejected", str(e)
        except Exception as e:  # noqa: BLE001 - any failure of a foreign library is a rejection
            cand.status, cand.reason = "rejected", f"{type(e).__name__}: {e}"

    def discover(self) -> None:
        with self.lock:
            if self.discovered:
                return
            config.validate_environment()  # a bad setting raises here, before anything loads
            paths = self._candidate_paths()
            self.discovered = True
            loaded: list[Candidate] = []
            for path, origin, source in paths:
                cand = Candidate(path, origin, source=source)
                self.candidates.append(cand)
                self._load(cand)
                if cand.plugin is None:
                    continue
                cand.name, cand.emulated = cand.plugin.name, cand.plugin.emulated
                loaded.append(cand)
            # One plugin per name: a real plugin beats an emulator; then the
            # environment beats the config file beats entry points beats bundled.
            by_name: dict[str, Candidate] = {}
            for cand in sorted(loaded, key=lambda c: (c.emulated, _ORIGIN_RANK[c.origin])):
                assert cand.name is not None, "a loaded candidate is named after its plugin (set above)"
                if cand.name in by_name:
                    winner = by_name[cand.name]
                    cand.status = "shadowed"
                    cand.reason = (
                        f"another plugin named {cand.name!r} takes precedence: {winner.path} "
                        f"({'emulated' if winner.emulated else 'real'}, {winner.origin})"
                    )
                    continue
                by_name[cand.name] = cand
                cand.status = "loaded"
            # stable device numbering: the host backend first, then the emulators (always there), then the
            # backends of real devices (there or not, machine by machine), each group by name; so a machine
            # with an OpenCL driver numbers the emulators' devices as one without
            for name in sorted(by_name, key=lambda n: (n != "cpu", not by_name[n].emulated, n)):
                plugin = by_name[name].plugin
                assert plugin is not None, "only loaded candidates are in by_name"
                backend = Backend(plugin, len(self.devices))
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
        rejected = [
            c for c in self.candidates if c.status in ("rejected", "unavailable") and (c.name == name or name in c.path)
        ]
        for c in rejected:
            msg += f"\n  {c.path} was {c.status}: {c.reason}"
        return msg + "\n(see torch_fl.list_backends() for every plugin found and why any was rejected)"

    def auto(self) -> Backend:
        """The most capable backend: real accelerators, then the host (the cpu backend before a plugin whose
        devices are the host's CPU cores too, FL_FEATURE_HOST_CPU: an OpenCL CPU driver), then emulators;
        more native kernels first among equals."""
        self.discover()
        if not self.backends:
            raise FlError("no fl backend could be loaded; torch_fl.list_backends() says why")

        def score(b: Backend):
            host = all(d.host_accessible for d in b.devices)
            on_cpu = any(d.props.features & abi.FEATURE_HOST_CPU for d in b.devices)
            if b.plugin.emulated:
                tier = 3
            elif on_cpu:
                tier = 2
            else:
                tier = 1 if host else 0
            return (tier, -len(b.plugin.kernels), b.name)

        return min(self.backends.values(), key=score)

    def select(self, name: str | None) -> Backend:
        with self.lock:
            if name is None:
                name = os.environ.get("FL_BACKEND") or config.load_config().get("backend") or "auto"
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
            raise FlError(
                f"fl:{index} does not exist: there are {len(self.devices)} fl devices "
                f"({', '.join(f'fl:{d.index}={d.backend.name}' for d in self.devices)})"
            )
        return self.devices[index]


REGISTRY = Registry()


@contextlib.contextmanager
def using_backend(name: str) -> Iterator[str]:
    """`with fl.using_backend("rocm"):` runs the block on backend `name` (new tensors
    go there) and then makes the backend and device that were current before current
    again, also when the block raises. Yields the backend's name. With no backend
    selected before, the one selected here stays (there is nothing to go back to)."""
    previous, previous_device = REGISTRY.current, REGISTRY.current_device
    selected = REGISTRY.select(name).name
    try:
        yield selected
    finally:
        if previous is not None:
            REGISTRY.select(previous.name)
            if previous_device is not None and previous_device.backend is previous:
                REGISTRY.current_device = previous_device
