"""Decomposition plans (docs/runtime.md, "The C++ fast path"): one eager SGD training step of a small model
on fl, with the plans switched off and on, beside the same step on CPU tensors in plain PyTorch.

    python bench/bench_decomp_plans.py                          # MLP on minimal and ascend
    python bench/bench_decomp_plans.py --models mlp bert --backends minimal ascend rocm

The models are bench_small.py's (MLP 64-256-256-10 GELU batch 4, ...). Columns, microseconds per step:
  native   the model on CPU tensors (eager)
  off      eager fl with decomposition plans switched off: every decomposition runs in Python
  on       eager fl with decomposition plans: their calls replayed by the C++ core
Rounds alternate the columns in a rotated order; switching a column forgets the core's plans and warms up
again (4 steps), so each column runs in its own steady state. A figure is the median over rounds of the time
per step; one thread (torch.set_num_threads(1)). Every fl step ends with torch.fl.synchronize()."""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from bench_small import make, stepper

import torch_fl as fl
from torch_fl.dispatch import decomp_replay
from torch_fl.runtime import core

COLUMNS = ("native", "off", "on")
BOUND = decomp_replay.MAX_BYTES


def switch(column: str) -> None:
    """Plans off (none recorded, the committed ones forgotten) or on (recorded again at the next calls)."""
    if column == "native":
        return
    decomp_replay.MAX_BYTES = BOUND if column == "on" else -1
    core.lib().fl_core_fast_clear()


def row(name: str, backend: str, args: argparse.Namespace) -> dict[str, float]:
    fl.set_backend(backend)
    title, model, batch, loss_fn = make(name)
    cpu = copy.deepcopy(model).train()
    dev = fl.device(backend)
    fl_batch = {k: v.to(dev) for k, v in batch.items()}
    m = copy.deepcopy(model).train().to(dev)
    steps = {
        "native": stepper(cpu, cpu.parameters(), batch, loss_fn, lambda: None),
        "off": stepper(m, m.parameters(), fl_batch, loss_fn, torch.fl.synchronize),
        "on": stepper(m, m.parameters(), fl_batch, loss_fn, torch.fl.synchronize),
    }
    times: dict[str, list[float]] = {c: [] for c in COLUMNS}
    hits = {"off": 0, "on": 0}
    for r in range(args.rounds):
        order = COLUMNS[r % 3 :] + COLUMNS[: r % 3]
        for c in order:
            switch(c)
            for _ in range(args.warmup):
                steps[c]()
            h = core.lib().fl_core_decomp_hits()
            t0 = time.perf_counter_ns()
            for _ in range(args.steps):
                steps[c]()
            times[c].append((time.perf_counter_ns() - t0) / args.steps / 1e3)
            if c in hits:
                hits[c] = (core.lib().fl_core_decomp_hits() - h) // args.steps
    switch("on")
    us = {c: statistics.median(t) for c, t in times.items()}
    print(
        f"| {title} | {backend} | {us['native']:.0f} | {us['off']:.0f} | {us['on']:.0f} | "
        f"x{us['off'] / us['native']:.2f} | x{us['on'] / us['native']:.2f} | {hits['on']} |",
        flush=True,
    )
    assert hits["off"] == 0, "plans served calls while switched off"
    return us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["mlp"], choices=["mlp", "bert", "conv", "lstm"])
    ap.add_argument("--backends", nargs="+", default=["minimal", "ascend"])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=4, help="steps after each switch (plans are recorded again)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print("| model | backend | native us | off us | on us | off/native | on/native | calls replayed per step |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models:
        for backend in args.backends:
            row(name, backend, args)


if __name__ == "__main__":
    main()
