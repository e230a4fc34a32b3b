"""`torch-fl`: the command line.

torch-fl doctor [--full] [--backend NAME]   discover backends, print capability tables, train
                                            ResNet-50 and a Transformer encoder a few SGD steps on
                                            each, judged against float64 beside native CPU
torch-fl backends                           every plugin found, and why any was rejected
torch-fl explain OP [--dtype D] [--backend NAME]
torch-fl coverage [--backend NAME] [--ops GLOB] [--no-fallback] [--state FILE] [--json]
                                            fl.coverage(): every OpInfo op's samples on fl vs CPU, forward and
                                            backward, with the path each call took (resumable)
torch-fl zoo [--models A,B] [--backends X,Y] [--train [MODEL]] [--json]
                                            the model zoo (docs/models.md): transformers and torch.nn models
                                            on every backend against float64; exit status 1 if a row fails
torch-fl plugin check PATH_OR_NAME [--ops GLOB] [--timeout S] [--json]
                                            conformance of a plugin: entry-point contract and every
                                            declared kernel against PyTorch CPU; exit status 1 on failure
"""

from __future__ import annotations

import argparse
import sys

import torch


def _doctor(args: argparse.Namespace) -> int:
    """Every backend end to end: the plugins found, each capability table, and
    ResNet-50 and a Transformer encoder trained a few steps on each, judged
    against float64 beside native CPU float32 (torch_fl.tools.doctor says how)."""
    import torch_fl as fl
    from torch_fl.runtime import REGISTRY
    from torch_fl.tools import doctor

    print(f"torch {torch.__version__}, torch_fl {fl.__version__}")
    report = fl.list_backends()
    print(report.render())
    from torch_fl.runtime import plugin

    if plugin.BLAS_CORE:
        print(f"host BLAS: OpenBLAS {plugin.BLAS_CORE} kernels")
    hint = plugin.blas_hint()
    if hint:
        print(f"hint: {hint}")
    names = [args.backend] if args.backend else report.names()
    if not names:
        print("no backend could be loaded")
        return 1
    print("\nreference runs on the CPU (float64 and float32), once for every backend ...")
    refs = [doctor.reference(case) for case in doctor.default_cases(args.full)]
    failures = 0
    for name in names:
        fl.set_backend(name)
        print()
        print(fl.capabilities(name).render())
        for ref in refs:
            check = doctor.check_model(ref, fl.current_device())
            print(check.render())
            failures += not check.ok
        paths: dict[str, int] = {}
        for (_op, path), n in REGISTRY.get(name).counts.items():
            paths[path] = paths.get(path, 0) + n
        print("  op calls by path: " + ", ".join(f"{p} {n}" for p, n in sorted(paths.items())))
    print()
    print("doctor: all backends OK" if not failures else f"doctor: {failures} check(s) FAILED")
    return 0 if not failures else 1


def _backends(args: argparse.Namespace) -> int:
    import torch_fl as fl

    print(fl.list_backends().render())
    return 0


def _explain(args: argparse.Namespace) -> int:
    import torch_fl as fl

    print(fl.explain(args.op, args.dtype, backend=args.backend).render())
    return 0


def _dtype(name: str) -> torch.dtype:
    """--dtype NAME; a name that is no dtype is a one-line error (exit 2), not a traceback."""
    found = getattr(torch, name, None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"--dtype {name!r} is not a torch dtype (float32, bfloat16, int64, ...)")
    return found


def _coverage(args: argparse.Namespace) -> int:
    """Runs the coverage in a child process writing to a state file, so an op
    that kills the process is recorded as a crash and the run goes on."""
    import json
    import subprocess
    import tempfile

    import torch_fl as fl
    from torch_fl.progress import Lines
    from torch_fl.tools.coverage import CoverageReport, OpResult

    dtype = _dtype(args.dtype)
    if args.worker:

        def begin(name: str) -> None:
            print(f"@@BEGIN {name}", flush=True)

        # the worker's stderr is the terminal's: one line per op ended (stdout is the parent's protocol)
        fl.coverage(
            args.backend,
            args.ops,
            dtype,
            args.samples,
            cpu_fallback=not args.no_fallback,
            state_file=args.state,
            progress=Lines(f"coverage on {args.backend}", None, sys.stderr),
            on_begin=begin,
        )
        return 0
    state = args.state or tempfile.mkstemp(suffix=".jsonl", prefix="fl_coverage_")[1]
    backend = args.backend or fl.get_current_backend_name()
    # not `python -m`: that would put the working directory first on the worker's sys.path
    from torch_fl.runtime import spawn

    cmd = spawn.python_command(
        "torch_fl.cli",
        "coverage",
        "--worker",
        "--backend",
        backend,
        "--ops",
        args.ops,
        "--dtype",
        args.dtype,
        "--samples",
        str(args.samples),
        "--state",
        state,
    )
    if args.no_fallback:
        cmd.append("--no-fallback")
    for _attempt in range(100):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        current = None
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("@@BEGIN "):
                current = line[8:].strip()
        if proc.wait() == 0:
            break
        if current is None:
            print("torch-fl: error: the coverage process failed to start", file=sys.stderr)
            return 2
        with open(state, "a") as f:  # the op that took the process down
            crash = OpResult(current, "crash", "fail", "fail", f"crashed the process (exit {proc.returncode})")
            f.write(json.dumps(crash.__dict__) + "\n")
    report = CoverageReport(backend, args.dtype, not args.no_fallback)
    with open(state) as f:
        report.results = [OpResult(**json.loads(line)) for line in f if line.strip()]
    print(report.to_json(indent=1) if args.json else report.render())
    if not args.state:
        import os

        os.unlink(state)
    return 0


def _zoo(args: argparse.Namespace) -> int:
    """The model zoo table (docs/models.md): exit status 1 when any row fails."""
    from torch_fl.tools import zoo

    if args.list:
        for spec in zoo.MODELS.values():
            print(f"{spec.name:<15} {spec.family}")
        return 0
    names = args.models.split(",") if args.models else None
    unknown = sorted(set(names or ()) - set(zoo.MODELS))
    if unknown:
        raise ValueError(f"no zoo model {', '.join(unknown)} (torch-fl zoo --list names them)")
    backends = args.backends.split(",") if args.backends else None

    from torch_fl.progress import Lines

    report = zoo.run_zoo(names, backends, Lines("zoo", None, sys.stderr))
    curves = [zoo.train_curve(args.train, b, steps=args.steps) for b in report.backends] if args.train else []
    if args.json:
        print(report.to_json(indent=1))
    else:
        print(report.render())
        for c in curves:
            print(
                f"training {c.model} on {c.backend}: {len(c.losses)} AdamW steps, loss {c.losses[0]:.4f} -> "
                f"{c.losses[-1]:.4f} (CPU {c.cpu_losses[0]:.4f} -> {c.cpu_losses[-1]:.4f}), max relative "
                f"difference to CPU {c.max_rel_diff:.1e}"
            )
    return 0 if all(r.passed for r in report.results) else 1


def _plugin(args: argparse.Namespace) -> int:
    from torch_fl.progress import Lines
    from torch_fl.tools.checker import check_plugin

    # one line per decided check on stderr, so minutes of checking are not silent
    report = check_plugin(
        args.target,
        ops=args.ops,
        samples=args.samples,
        timeout=args.timeout,
        progress=False if args.json else Lines("plugin check", None, sys.stderr),
    )
    print(report.to_json(indent=1) if args.json else report.render())
    return 0 if report.passed else 1


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torch-fl", description="torch_fl: PyTorch on any vendor's chip")
    sub = parser.add_subparsers(dest="command")
    d = sub.add_parser("doctor", help="check every backend end to end (the default)")
    d.add_argument("--full", action="store_true", help="use the Torch-FL article's model sizes (slow on a CPU)")
    d.add_argument("--backend", help="only this backend")
    sub.add_parser("backends", help="list the plugins found and why any was rejected")
    e = sub.add_parser("explain", help="which path an op takes and why")
    e.add_argument("op")
    e.add_argument("--dtype", default="float32")
    e.add_argument("--backend")
    cov = sub.add_parser("coverage", help="OpInfo coverage of a backend (forward, backward, paths)")
    cov.add_argument("--backend", help="backend to cover (default: the current one)")
    cov.add_argument("--ops", default="*", help="globs over OpInfo names, comma-separated (default: all ~700)")
    cov.add_argument("--dtype", default="float32")
    cov.add_argument("--samples", type=int, default=4, help="sample inputs per op (default 4)")
    cov.add_argument("--no-fallback", action="store_true", help="switch the CPU fallback off (FL_CPU_FALLBACK=0)")
    cov.add_argument("--state", help="JSON-lines file of finished ops: a rerun resumes after them")
    cov.add_argument("--json", action="store_true", help="print the full report as JSON")
    cov.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    z = sub.add_parser("zoo", help="real models (transformers, torch.nn) on every backend against float64")
    z.add_argument("--models", help="comma-separated zoo names (default: all; --list shows them)")
    z.add_argument("--backends", help="comma-separated backends (default: every one found)")
    z.add_argument("--list", action="store_true", help="list the zoo's models and exit")
    z.add_argument(
        "--train",
        nargs="?",
        const="llama",
        metavar="MODEL",
        help="also train a causal LM (default llama) for --steps AdamW steps against the CPU",
    )
    z.add_argument("--steps", type=int, default=30)
    z.add_argument("--json", action="store_true", help="print the results as JSON")
    pl = sub.add_parser("plugin", help="tools for plugin authors")
    plsub = pl.add_subparsers(dest="plugin_command", required=True)
    c = plsub.add_parser("check", help="check a plugin against the ABI contract and PyTorch CPU")
    c.add_argument("target", help="path of the plugin's lib*.so, or the name of a discovered backend")
    c.add_argument("--ops", default="*", help="only kernels whose aten name matches this glob")
    c.add_argument("--samples", type=int, default=4, help="recorded calls per kernel and dtype (default 4)")
    c.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=300.0,
        help="seconds one check (a contract group, one kernel's calls) may take before it is reported "
        "as hung and the checker goes on (default 300)",
    )
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    command = args.command or "doctor"
    if command == "doctor" and args.command is None:
        args = parser.parse_args(["doctor"])
    try:
        return {
            "doctor": _doctor,
            "backends": _backends,
            "explain": _explain,
            "plugin": _plugin,
            "coverage": _coverage,
            "zoo": _zoo,
        }[command](args)
    except Exception as exc:  # user-facing: one line, no traceback
        from torch_fl.errors import FlError

        if isinstance(exc, (FlError, ValueError)):
            print(f"torch-fl: error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
