#!/usr/bin/env python3
"""PyTorch's own device-generic tests on the fl device, with native CPU as the baseline.

    python scripts/upstream_tests.py DIR [--backends cpu minimal] [--files test_shape_ops ...] [-k EXPR]

DIR holds PyTorch's test files (test_view_ops.py, ...: the `instantiate_device_type_tests` kind; this
project's ../shared/upstream-tests/). Each file runs once on native CPU (torch_fl not loaded) and once per fl
backend (FL_BACKEND=NAME), exactly as PyTorch runs them on CUDA: `import torch` loads torch_fl through its
autoload entry point, and PYTORCH_TESTING_DEVICE_ONLY_FOR keeps one device. A test counts where it passes on
the CPU; the summary prints, per file and backend, what was collected, passed, failed and skipped on each
side, and every test that passes on the CPU but not on fl. Each of those is either in SKIPS below, with the
reason fl deliberately differs, or a defect; the exit status is 1 when any defect is left.

Each run writes a line per test as it goes (scripts/upstream_report.py), so a test that kills the interpreter
is recorded as crashed and the rest of the file runs again without it. --out keeps the logs; --reuse reads
the logs of runs already there instead of running them again."""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "crashed")

# Tests run on neither side: they need more than this machine has, and the kernel's OOM killer would end the
# CPU run (16 GB and 6 GB allocations on a 24 GB machine; PyTorch marks them largeTensorTest).
DESELECT = {
    "test_tensor_creation_ops.py::TestTensorCreation::test_cat_large_tensor_*": "allocates 16 GB (host memory)",
    "test_indexing.py::TestIndexing::test_index_put_accumulate_large_tensor*": "allocates 6 GB (host memory)",
}

# Tests that pass on the CPU and not on fl, where fl deliberately differs; each with its reason. Patterns are
# fnmatch patterns over "file::Class::test" with the device removed from both names (TestShapeOps,
# test_flip_float32). Nothing that is a defect of fl belongs here.
_SPARSE = "sparse layouts: fl tensors are strided; torch_fl keeps sparse tensors on the CPU and says so"
_QUANTIZED = "quantized tensors: torch_fl has no quantized fl tensors (PyTorch's QuantizedPrivateUse1 key)"
SKIPS: dict[str, str] = {
    "test_type_promotion.py::TestTypePromotion::test_sparse_*": _SPARSE,
    "test_tensor_creation_ops.py::TestTensorCreation::test_tensor_ctor_device_inference": _SPARSE,
    "test_shape_ops.py::TestShapeOps::test_flip_float32": _QUANTIZED + " (its float32 case also flips a quantized "
    "tensor made with device=fl)",
    "test_view_ops.py::TestOldViewOps::test_flatten": _QUANTIZED + " (it also flattens a quantized tensor)",
    "test_view_ops.py::TestOldViewOps::test_ravel": _QUANTIZED + " (it also ravels a quantized tensor)",
    "test_modules.py::TestModule::test_memory_format_nn_GroupNorm_*": (
        "PyTorch's derivative of native_group_norm (derivatives.yaml) makes the gradient and the input contiguous "
        "(NCHW) on every device but the CPU and XPU before native_group_norm_backward, so a channels-last input's "
        "gradient is NCHW on an accelerator; ModuleInfo skips this test on CUDA, MPS and XPU for that reason"
    ),
    "test_indexing.py::TestIndexing::test_index_reduce_reduce_*_float16": (
        "the test's reference rounds to float16 after every step, in index order, as CPU's kernel does; a scatter "
        "that accumulates in float32 and rounds once (minimal's) is closer to float64: worst relative error over "
        "200 random cases 8.5e-4 (mean) and 4.8e-4 (prod), against native CPU's 0.33 and 1.2e-3"
    ),
}

# What PyTorch's test framework itself does not run on fl: such a test is not compared (and is counted as
# such), since no device but the CPU could pass it. (outcome on fl, pattern of its reason, what it means)
NOT_FOR_FL = [
    ("missing", None, "PyTorch does not instantiate it for fl (a CPU-only class, or a dtype list of the CPU)"),
    ("skipped", re.compile(r"Only runs on cpu"), "PyTorch runs it on the CPU only (@onlyCPU)"),
    (
        "skipped",
        re.compile(r"Unknown device type"),
        "PyTorch's largeTensorTest asks only the CPU, CUDA and XPU for their free memory and skips every other device",
    ),
]


@dataclass
class Run:
    """One file on one side: test -> (outcome, why)."""

    results: dict = field(default_factory=dict)
    seconds: float = 0.0
    note: str = ""

    def count(self, outcome: str) -> int:
        return sum(1 for o, _ in self.results.values() if o == outcome)


_DEVICE_IN_NAME = re.compile(r"_(cpu|fl)(?=_|$)")


def key_of(nodeid: str) -> str:
    """The device-free name of a test: TestShapeOpsPRIVATEUSE1::test_flip_fl_float32 and
    TestShapeOpsCPU::test_flip_cpu_float32 are both TestShapeOps::test_flip_float32. PyTorch appends the
    device after the test's own name, so the last _cpu / _fl word is the device."""
    parts = nodeid.split("::")
    parts[0] = os.path.basename(parts[0])
    if len(parts) >= 3:
        parts[-2] = re.sub(r"(PRIVATEUSE1|FL|CPU)$", "", parts[-2])
    matches = list(_DEVICE_IN_NAME.finditer(parts[-1]))
    if matches:
        m = matches[-1]
        parts[-1] = parts[-1][: m.start()] + parts[-1][m.end() :]
    return "::".join(parts)


def matching(table: dict, key: str) -> str | None:
    for pattern, reason in table.items():
        if fnmatch.fnmatchcase(key, pattern):
            return reason
    return None


def _read_log(path: str) -> tuple[list, dict, list]:
    collected, ended, started = [], {}, []
    if not os.path.exists(path):
        return collected, ended, started
    with open(path) as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash
            if "collected" in rec:
                collected = rec["collected"]
            elif "start" in rec:
                started.append(rec["start"])
            elif "end" in rec:
                ended[rec["end"]] = (rec["outcome"], rec["why"])
    return collected, ended, started


def run_files(
    folder: str, names: list[str], side: str, out: str, timeout: int, select: str | None, sample: int, reuse: bool
) -> dict[str, Run]:
    """Run test files in one pytest process on one side ("native" or an fl backend name); crashes are recorded
    and skipped over. Returns each file's Run."""
    tag = f"{'+'.join(names) if len(names) < 4 else f'{len(names)}files'}.{side}"
    log = os.path.join(out, tag + ".jsonl")
    summary_path = os.path.join(out, tag + ".json")
    if reuse and os.path.exists(summary_path):
        with open(summary_path) as fh:
            data = json.load(fh)
        return {
            n: Run({k: tuple(v) for k, v in r["results"].items()}, r["seconds"], r.get("note", ""))
            for n, r in data.items()
        }
    if os.path.exists(log):
        os.remove(log)
    skip_file = os.path.join(out, tag + ".skip")
    ini = os.path.join(out, "pytest.ini")
    with open(ini, "w") as fh:
        fh.write("[pytest]\n")  # keeps the runs away from any project's pytest settings
    env = dict(os.environ)
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    env.update(FL_UPSTREAM_LOG=log, FL_UPSTREAM_SKIP=skip_file, FL_UPSTREAM_SAMPLE=str(sample))
    if side == "native":
        env.update(TORCH_DEVICE_BACKEND_AUTOLOAD="0", PYTORCH_TESTING_DEVICE_ONLY_FOR="cpu")
        env.pop("FL_BACKEND", None)
    else:
        env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
        env.update(FL_BACKEND=side, PYTORCH_TESTING_DEVICE_ONLY_FOR="fl")
    crashed: dict = {}
    t0 = time.monotonic()
    note = ""
    for _attempt in range(50):
        _, ended, _ = _read_log(log)
        with open(skip_file, "w") as fh:
            fh.write("\n".join([*ended, *crashed]))
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-c",
            ini,
            "--rootdir",
            out,
            "-p",
            "no:cacheprovider",
            "-p",
            "upstream_report",
            "-p",
            "no:randomly",
            f"--timeout={timeout}",
            *(os.path.join(folder, name + ".py") for name in names),
        ]
        if select:
            cmd += ["-k", select]
        proc = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True)
        collected, ended, started = _read_log(log)
        if not collected and proc.returncode not in (0, 1, 5):
            note = f"pytest exit status {proc.returncode}: {(proc.stdout + proc.stderr).strip()[-300:]}"
            break
        running = [s for s in started if s not in ended and s not in crashed]
        if proc.returncode in (0, 1, 5) or not running:
            break
        crashed[running[-1]] = ("crashed", f"the interpreter died (exit status {proc.returncode})")
    seconds = time.monotonic() - t0
    runs = {name: Run({}, seconds / len(names), note) for name in names}
    for nodeid, outcome in [*ended.items(), *crashed.items()]:
        key = key_of(nodeid)
        name = key.split("::", 1)[0].removesuffix(".py")
        if name in runs:
            runs[name].results[key] = outcome
    with open(summary_path, "w") as fh:
        json.dump({n: {"results": r.results, "seconds": r.seconds, "note": r.note} for n, r in runs.items()}, fh)
    return runs


def sampled(key: str, sample: int) -> bool:
    """Whether a test is in a 1-in-`sample` selection: by a hash of its device-free name, so the native and
    the fl runs select the same tests, and every run the same ones."""
    return sample <= 1 or zlib.crc32(key.encode()) % sample == 0


@dataclass
class Comparison:
    file: str
    backend: str
    cpu: Run
    fl: Run
    passing_on_cpu: int = 0
    passing_on_both: int = 0
    not_for_fl: int = 0  # of those passing on CPU: tests PyTorch does not run on fl (NOT_FOR_FL)
    explained: list = field(default_factory=list)  # (test, fl outcome, reason)
    defects: list = field(default_factory=list)  # (test, fl outcome, why)

    @property
    def compared(self) -> int:
        return self.passing_on_cpu - self.not_for_fl

    @property
    def rate_offered(self) -> float:
        """The rate over what fl offers: the skip list's tests (sparse, quantized, ...) left out."""
        n = self.compared - len(self.explained)
        return self.passing_on_both / n if n else 1.0

    @property
    def rate(self) -> float:
        return self.passing_on_both / self.compared if self.compared else 1.0


def _not_for_fl(outcome: str, why: str) -> str | None:
    for o, pattern, meaning in NOT_FOR_FL:
        if outcome == o and (pattern is None or pattern.search(why)):
            return meaning
    return None


def compare(file: str, backend: str, cpu: Run, fl: Run) -> Comparison:
    c = Comparison(file, backend, cpu, fl)
    for test, (outcome, _) in sorted(cpu.results.items()):
        if outcome != "passed":
            continue
        c.passing_on_cpu += 1
        got, why = fl.results.get(test, ("missing", "not collected on fl"))
        if got == "passed":
            c.passing_on_both += 1
            continue
        if _not_for_fl(got, why) is not None:
            c.not_for_fl += 1
            continue
        reason = matching(SKIPS, test)
        if reason is not None:
            c.explained.append((test, got, reason))
        else:
            c.defects.append((test, got, why))
    return c


def table(comparisons: list[Comparison]) -> str:
    head = (
        f"{'file':<28} {'backend':<8} {'cpu: coll pass fail skip':>25} {'fl: coll pass fail skip':>24} "
        f"{'cpu-only':>8} {'rate':>7} {'explained':>9} {'defects':>7} {'w/o skips':>9}"
    )
    lines = [head, "-" * len(head)]
    for c in comparisons:
        lines.append(
            f"{c.file:<28} {c.backend:<8} {_counts(c.cpu):>25} {_counts(c.fl):>24} {c.not_for_fl:>8} "
            f"{100 * c.rate:>6.1f}% {len(c.explained):>9} {len(c.defects):>7} {100 * c.rate_offered:>8.1f}%"
        )
    return "\n".join(lines)


def _counts(r: Run) -> str:
    failed = r.count("failed") + r.count("error") + r.count("crashed")
    return f"{len(r.results):>5} {r.count('passed'):>5} {failed:>4} {r.count('skipped') + r.count('xfailed'):>4}"


def default_folder() -> str | None:
    """FL_UPSTREAM_TESTS, else the project's ../shared/upstream-tests beside a checkout."""
    env = os.environ.get("FL_UPSTREAM_TESTS")
    if env:
        return env
    guess = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "upstream-tests"))
    return guess if os.path.isdir(guess) else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "folder",
        nargs="?",
        help="folder of PyTorch's test files (default: FL_UPSTREAM_TESTS, "
        "or ../shared/upstream-tests beside this checkout)",
    )
    p.add_argument("--backends", nargs="+", default=["cpu", "minimal"], help="fl backends (default: cpu minimal)")
    p.add_argument("--files", nargs="+", help="test files without .py (default: every test_*.py in the folder)")
    p.add_argument("-k", dest="select", help="pytest -k expression, applied on both sides")
    p.add_argument("--timeout", type=int, default=300, help="seconds per test (pytest-timeout; default 300)")
    p.add_argument("--out", default=os.path.join(os.getcwd(), "upstream-results"), help="where logs go")
    p.add_argument("--reuse", action="store_true", help="read runs already in --out instead of running them")
    p.add_argument("--sample", type=int, default=1, help="run 1 test in N, the same ones on both sides (default 1)")
    p.add_argument(
        "--together",
        action="store_true",
        help="all files in one pytest process per side (faster start-up; a crash reruns the rest)",
    )
    p.add_argument("--json", help="write the comparison here as JSON")
    p.add_argument("--max-list", type=int, default=40, help="defects listed per file and backend")
    args = p.parse_args(argv)
    folder = args.folder or default_folder()
    if not folder or not os.path.isdir(folder):
        print(
            f"upstream_tests: no folder of PyTorch's test files ({folder or 'none given'}); pass one, or set "
            f"FL_UPSTREAM_TESTS",
            file=sys.stderr,
        )
        return 2
    files = args.files or sorted(f[:-3] for f in os.listdir(folder) if f.startswith("test_") and f.endswith(".py"))
    missing = [f for f in files if not os.path.exists(os.path.join(folder, f + ".py"))]
    if missing:
        print(f"upstream_tests: not in {folder}: {', '.join(missing)}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    comparisons = []
    groups = [files] if args.together else [[name] for name in files]
    for group in groups:
        what = ", ".join(group)
        cpu = run_files(folder, group, "native", args.out, args.timeout, args.select, args.sample, args.reuse)
        print(
            f"{what}: native cpu {sum(len(r.results) for r in cpu.values())} tests in "
            f"{sum(r.seconds for r in cpu.values()):.0f}s {cpu[group[0]].note}",
            flush=True,
        )
        for backend in args.backends:
            fl = run_files(folder, group, backend, args.out, args.timeout, args.select, args.sample, args.reuse)
            print(
                f"{what}: fl {backend} {sum(len(r.results) for r in fl.values())} tests in "
                f"{sum(r.seconds for r in fl.values()):.0f}s {fl[group[0]].note}",
                flush=True,
            )
            comparisons += [compare(name + ".py", backend, cpu[name], fl[name]) for name in group]
    print()
    print(table(comparisons))
    total_cpu = sum(c.compared for c in comparisons)
    total_both = sum(c.passing_on_both for c in comparisons)
    print(
        f"\nall: {total_both} of {total_cpu} tests that pass on native CPU pass on fl "
        f"({100 * total_both / max(total_cpu, 1):.1f} %); not compared: "
        f"{sum(c.not_for_fl for c in comparisons)} that PyTorch runs on the CPU only (cpu-only)"
    )
    for c in comparisons:
        if c.defects:
            print(f"\n{c.file} on {c.backend}: {len(c.defects)} pass on CPU, not on fl")
            for test, outcome, why in c.defects[: args.max_list]:
                print(f"  {outcome:<8} {test.split('::', 1)[1]}: {why[:160]}")
            if len(c.defects) > args.max_list:
                print(f"  ... {len(c.defects) - args.max_list} more (--max-list)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                [
                    {
                        "file": c.file,
                        "backend": c.backend,
                        "passing_on_cpu": c.passing_on_cpu,
                        "not_for_fl": c.not_for_fl,
                        "passing_on_both": c.passing_on_both,
                        "explained": c.explained,
                        "defects": c.defects,
                        "rate": c.rate,
                        "rate_without_skips": c.rate_offered,
                        "cpu": {o: c.cpu.count(o) for o in OUTCOMES},
                        "fl": {o: c.fl.count(o) for o in OUTCOMES},
                    }
                    for c in comparisons
                ],
                fh,
                indent=1,
            )
    return 1 if any(c.defects for c in comparisons) else 0


if __name__ == "__main__":
    sys.exit(main())
