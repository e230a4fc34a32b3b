"""Profiler overhead and memory-pool speed, against native PyTorch in the same run.

    python bench/bench_profiler.py

Prints, per small op (add of 16 floats on the host `cpu` backend): native CPU,
fl with no profiler, fl inside `fl.profile()`; and per allocate+free of a 4 KiB
tensor: native CPU torch.empty, fl with the caching pool, fl with the pool off
(every tensor a plugin malloc/free)."""

from __future__ import annotations

import time

import torch

import torch_fl as fl
from torch_fl.runtime import memory


def _best(fn, number: int, repeat: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def main() -> None:
    fl.initialize("cpu")
    a, b = torch.randn(16), torch.randn(16)
    fa, fb = a.to("fl"), b.to("fl")
    n = 5000
    native = _best(lambda: torch.add(a, b), n)
    idle = _best(lambda: torch.add(fa, fb), n)
    with fl.profile():
        active = _best(lambda: torch.add(fa, fb), n)
    print(f"torch {torch.__version__}, backend cpu")
    print(
        f"small op: native {native * 1e6:.1f} us, fl (no profiler) {idle * 1e6:.1f} us, "
        f"fl (profiling) {active * 1e6:.1f} us  -> a profile adds {(active - idle) * 1e6:.1f} us/op while it "
        f"records; with none open the dispatcher's only cost is one list test per op (in the first figure)"
    )
    shape = (1024,)
    cpu = _best(lambda: torch.empty(shape), n)
    pooled = _best(lambda: torch.empty(shape, device="fl"), n)
    memory.POOL_ENABLED = False
    torch.fl.empty_cache()
    raw = _best(lambda: torch.empty(shape, device="fl"), n)
    memory.POOL_ENABLED = True
    print(
        f"allocate+free 4 KiB: native CPU {cpu * 1e6:.1f} us, fl pooled {pooled * 1e6:.1f} us, "
        f"fl unpooled {raw * 1e6:.1f} us  (pool saves {(raw - pooled) * 1e6:.1f} us per tensor)"
    )


if __name__ == "__main__":
    main()
