"""One checking process: `python -m torch_fl.tools.checker.worker TARGET [--skip A,B] [--ops GLOB]`.

Prints `@@BEGIN name` before each check and `@@ROW {json}` for each result, so
the parent can name the check that was running if the plugin kills the
process. TARGET is a backend name or, with FL_PLUGIN_PATH set by the parent,
the path of the plugin file."""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch_fl.runtime import Backend


def _emit(kind: str, payload: Any) -> None:
    sys.stdout.write(f"@@{kind} {json.dumps(payload) if not isinstance(payload, str) else payload}\n")
    sys.stdout.flush()


def _row(check: str, status: str, detail: str) -> None:
    _emit("ROW", {"check": check, "status": status, "detail": detail})


def _find(target: str) -> tuple[Backend | None, str | None]:
    from torch_fl.runtime import REGISTRY

    REGISTRY.discover()
    if os.path.isfile(target):
        real = os.path.realpath(target)
        for cand in REGISTRY.candidates:
            if os.path.realpath(cand.path) == real:
                if cand.status == "rejected":
                    return None, f"rejected by the loader: {cand.reason}"
                if cand.status == "shadowed":
                    return None, f"not loaded: {cand.reason}"
                assert cand.name is not None, "a candidate neither rejected nor shadowed was loaded"
                return REGISTRY.get(cand.name), None
        return None, f"{target} was not found by discovery (is it a lib*.so file?)"
    try:
        return REGISTRY.get(target), None
    except Exception as e:  # noqa: BLE001
        return None, str(e)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("target")
    p.add_argument("--skip", default="")
    p.add_argument("--ops", default="*")
    p.add_argument("--samples", type=int, default=4)
    args = p.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    warnings.simplefilter("ignore")
    # every device buffer must be a fresh guarded block (see guarded.py): no pool reuse
    os.environ["FL_MEMORY_POOL"] = "0"
    import torch

    from torch_fl.tools.checker import contract, guarded, kernels, samples

    if "load" not in skip:
        _emit("BEGIN", "load")
    backend, why = _find(args.target)
    if backend is None:  # also when an earlier worker loaded it (load skipped) and it is gone since
        _row("load", contract.FAIL, why or "not found")
        _emit("DONE", "")
        return 0
    plugin = backend.plugin
    if "load" not in skip:
        _row("load", contract.PASS, f"{plugin.path} [{plugin.origin}], ABI version and entry points")
    groups = [
        ("identity", contract.identity),
        ("devices", contract.devices),
        ("memory", contract.memory),
        ("copies", contract.copies),
        ("version 2", contract.version2),
        ("rng", contract.rng),
        ("kernel table", contract.kernel_table),
    ]
    for name, fn in groups:
        if name in skip:
            continue
        _emit("BEGIN", name)
        try:
            for row in fn(plugin):
                _row(*row)
        except Exception as e:  # noqa: BLE001 - a broken plugin may raise anywhere
            _row(name, contract.FAIL, f"{type(e).__name__}: {e}")
    dev = backend.devices[0]
    dev_mask = dev.props.dtypes
    from torch_fl.runtime import FROM_CODE

    selected = [op for op in plugin.kernels if fnmatch.fnmatch(op, args.ops)]
    if not selected:
        _row(
            "kernel selection",
            contract.FAIL,
            f"--ops {args.ops!r} matches none of the plugin's {len(plugin.kernels)} kernels"
            + (f" (for example {', '.join(sorted(plugin.kernels)[:3])})" if plugin.kernels else "")
            + "; give a glob over aten names such as 'aten::add*'",
        )
    targets = {}
    for op in selected:
        k = plugin.kernels[op]
        if f"kernel {op}" in skip:
            continue
        dts = [FROM_CODE[c] for c in sorted(FROM_CODE) if (k.dtypes >> c) & 1 and (dev_mask >> c) & 1]
        if dts:
            targets[op] = dts
    guard = guarded.GuardedMemory(plugin)
    if targets:
        _emit("BEGIN", "recording samples")
        calls = samples.record(targets, limit=args.samples)
    for op, dtypes in targets.items():
        _emit("BEGIN", f"kernel {op}")
        kernel = plugin.kernels[op]
        by_dtype = calls.get(op, {})
        compared, failures, notes, max_err = 0, [], [], 0.0
        for dt in dtypes:
            name = str(dt).replace("torch.", "")
            recorded = by_dtype.get(dt, [])
            if not recorded:
                notes.append(f"{name}: no sample")
                continue
            try:
                out = kernels.run_calls(dev, kernel, recorded, guard=guard)
            except Exception as e:  # noqa: BLE001
                failures.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                continue
            compared += out.compared
            max_err = max(max_err, out.max_err)
            failures += [f"{name} {f}" for f in out.failures]
            if out.compared == 0 and out.declined:
                failures.append(f"{name}: declared, but the kernel declined all {out.declined} calls")
        if failures:
            _row(f"kernel {op}", contract.FAIL, "; ".join(failures[:3]))
        elif compared == 0:
            _row(f"kernel {op}", contract.WARN, "not checked: " + "; ".join(notes))
        else:
            extra = f"; {'; '.join(notes)}" if notes else ""
            random = torch.Tag.nondeterministic_seeded in next(iter(by_dtype.values()))[0][0].tags
            what = (
                "calls give PyTorch's shapes and dtypes, finite values (random op: values not compared)"
                if random
                else f"calls match PyTorch CPU (max rel err {max_err:.1e})"
            )
            _row(
                f"kernel {op}",
                contract.PASS,
                f"{compared} {what}, dtypes {','.join(str(d).replace('torch.', '') for d in dtypes)}{extra}",
            )
    _emit("DONE", "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
