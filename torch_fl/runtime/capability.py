"""The capability table: what a backend can do, probed from its plugin at
start-up. Every later decision (dispatch paths, autocast dtype, collectives
path, fusion) reads it; it prints as a table and exports to dict/JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import torch

from ..rendering import Report
from . import abi
from .dtypes import mask_to_names


@dataclass
class DeviceCaps:
    index: int
    local_index: int
    name: str
    total_memory: int
    dtypes: list[str]
    host_accessible: bool
    async_copy: bool
    fp16_stable: bool
    compute_units: int
    channels_last: bool = False  # FL_FEATURE_CHANNELS_LAST: convolutions run fastest on NHWC tensors
    async_kernels: bool = False  # FL_FEATURE_ASYNC_KERNELS: kernels finish after their call returns
    host_cpu: bool = False  # FL_FEATURE_HOST_CPU: the device is the host's own CPU cores


@dataclass
class CapabilityTable(Report):
    backend: str
    vendor: str
    version: str
    description: str
    emulated: bool
    plugin_path: str
    origin: str
    devices: list[DeviceCaps]
    kernels: dict[str, list[str]]  # aten overload -> dtypes served natively
    fused_kernels: list[str]
    collectives: dict[str, bool]
    collectives_path: str  # "plugin" | "cpu-relay"
    streams: bool
    jit: bool
    amp_dtype: str
    notes: list[str] = field(default_factory=list)
    abi_version: int = 1
    # FL_KERNEL_ANY_OUT_LAYOUT: kernels that write an output of any dense layout they are given (a
    # channels-last convolution output), what torch.compile's layout pass needs
    any_layout_kernels: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    def supports(self, op: str, dtype: torch.dtype | str = "float32") -> bool:
        name = dtype if isinstance(dtype, str) else str(dtype).replace("torch.", "")
        return name in self.kernels.get(op, [])

    def render(self) -> str:
        lines = [
            f"backend {self.backend}  ({'EMULATED' if self.emulated else 'real'})  {self.vendor} {self.version}",
            f"  {self.description}",
            f"  plugin: {self.plugin_path} [{self.origin}]  ABI v{self.abi_version}",
        ]
        for d in self.devices:
            lines.append(
                f"  fl:{d.index}  {d.name}  memory {d.total_memory / 2**30:.1f} GiB  "
                f"dtypes {','.join(d.dtypes)}  host-accessible {'yes' if d.host_accessible else 'no'}  "
                f"units {d.compute_units}"
                + ("  prefers channels-last" if d.channels_last else "")
                + ("  async kernels" if d.async_kernels else "")
                + ("  (host CPU cores)" if d.host_cpu else "")
            )
        lines.append(
            f"  native kernels: {len(self.kernels)} aten overloads; fused: "
            f"{', '.join(self.fused_kernels) or 'none'}; any output layout: "
            f"{', '.join(self.any_layout_kernels) or 'none'}"
        )
        lines.append(
            f"  autocast dtype: {self.amp_dtype}   streams: {'yes' if self.streams else 'no'}   "
            f"JIT: {'yes' if self.jit else 'no'}"
        )
        lines.append(f"  collectives: {self.collectives_path} ({self.collectives_note()})")
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)

    def html(self) -> str:
        """The same facts as render(), the devices as a table (the text's long device lines wrap in a notebook)."""
        import html

        e = html.escape
        devices = "".join(
            f"<tr><td>fl:{d.index}</td><td>{e(d.name)}</td><td>{d.total_memory / 2**30:.1f} GiB</td>"
            f"<td>{e(', '.join(d.dtypes))}</td><td>{'yes' if d.host_accessible else 'no'}</td>"
            f"<td>{'yes' if d.async_kernels else 'no'}</td><td>{d.compute_units}</td></tr>"
            for d in self.devices
        )
        notes = "".join(f"<br>note: {e(n)}" for n in self.notes)
        return (
            f"<b>backend {e(self.backend)}</b> ({'EMULATED' if self.emulated else 'real'}) {e(self.vendor)} "
            f"{e(self.version)}<br>{e(self.description)}<br>plugin {e(self.plugin_path)} [{e(self.origin)}], "
            f"ABI v{self.abi_version}<table><tr><th>device</th><th>name</th><th>memory</th><th>dtypes</th>"
            f"<th>host-accessible</th><th>async kernels</th><th>units</th></tr>{devices}</table>"
            f"native kernels: {len(self.kernels)} aten overloads; fused: "
            f"{e(', '.join(self.fused_kernels) or 'none')}"
            f"<br>autocast dtype: {self.amp_dtype}; streams: {'yes' if self.streams else 'no'}; JIT: "
            f"{'yes' if self.jit else 'no'}<br>collectives: {self.collectives_path} ({e(self.collectives_note())})"
            f"{notes}"
        )

    def collectives_note(self) -> str:
        """How torch.distributed moves this backend's tensors (torch_fl.distributed)."""
        if self.collectives_path == "plugin":
            where = "; between the processes of one host, other hosts go through the CPU relay" if self.emulated else ""
            return (
                f"the plugin's own all_reduce/broadcast/all_gather/reduce_scatter/send/recv/barrier{where}; "
                "reduce, gather, scatter and all_to_all through the CPU relay"
            )
        return "CPU relay: every collective copies to the host, runs gloo and copies back"


def _amp_choice(dtypes: set[str], fp16_stable: bool) -> str:
    if "bfloat16" in dtypes and not ("float16" in dtypes and fp16_stable):
        return "bfloat16"
    if "float16" in dtypes and fp16_stable:
        return "float16"
    if "bfloat16" in dtypes:
        return "bfloat16"
    return "float32"


def probe(backend) -> CapabilityTable:
    p = backend.plugin
    devices = []
    for d in backend.devices:
        devices.append(
            DeviceCaps(
                d.index,
                d.local,
                d.props.name,
                d.props.total_memory,
                mask_to_names(d.props.dtypes),
                d.host_accessible,
                bool(d.props.features & abi.FEATURE_ASYNC_COPY),
                bool(d.props.features & abi.FEATURE_FP16_STABLE),
                d.props.compute_units,
                bool(d.props.features & abi.FEATURE_CHANNELS_LAST),
                bool(d.props.features & abi.FEATURE_ASYNC_KERNELS),
                bool(d.props.features & abi.FEATURE_HOST_CPU),
            )
        )
    kernels = {op: mask_to_names(e.dtypes) for op, e in sorted(p.kernels.items())}
    fused = sorted(op for op, e in p.kernels.items() if e.flags & abi.KERNEL_FUSED)
    any_layout = sorted(op for op, e in p.kernels.items() if e.flags & abi.KERNEL_ANY_OUT_LAYOUT)
    comm = {n[len("comm_") :]: p.optional[n] for n in abi.OPTIONAL_ENTRIES if n.startswith("comm_")}
    dt = set(devices[0].dtypes) if devices else set()
    amp = _amp_choice(dt, devices[0].fp16_stable if devices else False)
    return CapabilityTable(
        backend=backend.name,
        vendor=p.vendor,
        version=p.version,
        description=p.description,
        emulated=p.emulated,
        plugin_path=p.path,
        origin=p.origin,
        devices=devices,
        kernels=kernels,
        fused_kernels=fused,
        collectives=comm,
        collectives_path="plugin" if all(comm.values()) else "cpu-relay",
        streams=bool(p.optional["stream_create"]),
        jit=bool(p.jit_target),
        amp_dtype=amp,
        any_layout_kernels=any_layout,
        abi_version=getattr(p, "abi_version", 1),
    )


def amp_dtypes(backend) -> list[torch.dtype]:
    caps = backend.capabilities
    dt = set(caps.devices[0].dtypes) if caps.devices else set()
    out = []
    if "float16" in dt:
        out.append(torch.float16)
    if "bfloat16" in dt:
        out.append(torch.bfloat16)
    return out or [torch.float32]
