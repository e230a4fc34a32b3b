"""All-reduce bus bandwidth and DDP step time with 2 processes on this host.

    python bench/bench_distributed.py            # add --quick for fewer sizes and steps

All-reduce (float32, sum) per message size, on four paths:
  plugin      rocm: the emulator's shared-memory collectives (comm-plugin)
  relay       rocm with FL_DIST_RELAY=1: device -> host copy, gloo, copy back
  relay-host  cpu: the relay on host-accessible memory (gloo on the device memory, no copies)
  gloo        plain init_process_group("gloo") on CPU tensors: the baseline
Bus bandwidth as nccl-tests defines it: size / time x 2(n-1)/n (= size / time for 2 ranks).

DDP: an MLP training step (SGD), 2 ranks each with the single process's batch,
against one process alone, per backend: the ratio is what data parallelism
costs per step (the all-reduces that do not hide behind the backward)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import torch

SIZES = [1 << k for k in (10, 13, 16, 19, 22, 25)]  # 1 KiB .. 32 MiB
QUICK_SIZES = [1 << k for k in (10, 16, 22)]
PATHS = {
    "plugin": ("rocm", {}),
    "relay": ("rocm", {"FL_DIST_RELAY": "1"}),
    "relay-host": ("cpu", {}),
    "gloo": (None, {}),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _time(fn, seconds: float, min_iters: int = 3) -> float:
    fn()
    fn()
    n, t0 = 0, time.perf_counter()
    while n < min_iters or time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return (time.perf_counter() - t0) / n


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )


# ---------------------------------------------------------------- inside a rank


def rank_allreduce(backend: str | None, sizes: list[int], seconds: float) -> dict:
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=120)
    if backend is None:
        dist.init_process_group("gloo", timeout=timeout)
        dev = torch.device("cpu")
    else:
        import torch_fl as fl

        fl.initialize(backend)
        dist.init_process_group("fl", timeout=timeout)
        dev = fl.device(backend)
    out = {}
    for size in sizes:
        t = torch.ones(size // 4).to(dev)
        dist.barrier()
        for _ in range(2):
            dist.all_reduce(t)
        t0 = time.perf_counter()
        for _ in range(3):  # every rank must make the same calls: rank 0 sizes the run from these three
            dist.all_reduce(t)
        n = torch.tensor([max(3, int(seconds / max((time.perf_counter() - t0) / 3, 1e-6)))])
        dist.broadcast(n, src=0)
        t0 = time.perf_counter()
        for _ in range(int(n.item())):
            dist.all_reduce(t)
        out[size] = (time.perf_counter() - t0) / int(n.item())
    dist.destroy_process_group()
    return out


def rank_ddp(backend: str, steps: int) -> dict:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_fl as fl

    fl.initialize(backend)
    dist.init_process_group("fl", timeout=datetime.timedelta(seconds=120))
    dev = fl.device(backend)
    ddp = DDP(_mlp().to(dev))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(64, 256).to(dev), torch.randint(0, 10, (64,)).to(dev)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        torch.fl.synchronize()

    dist.barrier()
    t = _time(step, 0, min_iters=steps)
    dist.destroy_process_group()
    return {"step_s": t}


def single_ddp(backend: str, steps: int) -> float:
    import torch_fl as fl

    fl.initialize(backend)
    dev = fl.device(backend)
    model = _mlp().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256).to(dev), torch.randint(0, 10, (64,)).to(dev)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        torch.fl.synchronize()

    return _time(step, 0, min_iters=steps)


# ---------------------------------------------------------------- the driver


def _launch(job: dict, env_extra: dict) -> list[dict]:
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for r in range(2):
            env = {k: v for k, v in os.environ.items() if not k.startswith("FL_")}
            env.update(
                env_extra,
                RANK=str(r),
                WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                OMP_NUM_THREADS="1",
            )
            procs.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--rank-job", json.dumps(job), os.path.join(tmp, f"r{r}.json")], env=env
                )
            )
        for p in procs:
            if p.wait(timeout=900) != 0:
                raise SystemExit(f"a rank failed (exit {p.returncode}) on {job}")
        return [json.load(open(os.path.join(tmp, f"r{r}.json"))) for r in range(2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ddp-only", action="store_true", help="skip the all_reduce table")
    ap.add_argument("--rank-job", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_job:
        job, out = json.loads(args.rank_job[0]), args.rank_job[1]
        torch.set_num_threads(1)
        if job["kind"] == "allreduce":
            res = rank_allreduce(job["backend"], job["sizes"], job["seconds"])
        else:
            res = rank_ddp(job["backend"], job["steps"])
        with open(out, "w") as f:
            json.dump(res, f)
        return

    sizes = QUICK_SIZES if args.quick else SIZES
    seconds = 0.3 if args.quick else 1.0
    print(
        f"torch {torch.__version__}, 2 processes on one host ({os.cpu_count()} cores), 1 thread each; "
        f"load average at start {os.getloadavg()[0]:.1f} (other work on the host skews small messages most)"
    )
    if not args.ddp_only:
        print("all_reduce float32 sum: time per call and bus bandwidth (2 ranks: size / time)")
    table = {}
    for name, (backend, env) in ({} if args.ddp_only else PATHS).items():
        ranks = _launch({"kind": "allreduce", "backend": backend, "sizes": sizes, "seconds": seconds}, env)
        table[name] = {int(k): max(r[k] for r in ranks) for k in ranks[0]}
    if table:
        print(f"{'size':>9} " + " ".join(f"{n:>21}" for n in PATHS))
    for size in sizes if table else []:
        cells = []
        for name in PATHS:
            t = table[name][size]
            cells.append(f"{t * 1e6:>9.0f} us {size / t / 1e9:>6.2f} GB/s")
        print(f"{_fmt(size):>9} " + " ".join(f"{c:>21}" for c in cells))

    steps = 5 if args.quick else 20
    print(f"\nDDP training step (MLP 256-512-512-10, batch 64 per rank, SGD), mean of {steps} steps")
    for backend in ("cpu", "rocm", "ascend"):
        code = (
            f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import torch; "
            f"torch.set_num_threads(1); from bench_distributed import single_ddp; "
            f"print(single_ddp({backend!r}, {steps}))"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("FL_")}
        env["OMP_NUM_THREADS"] = "1"  # as in the ranks: the plugins' OpenMP kernels use one thread each
        single = float(
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
            ).stdout.split()[-1]
        )
        ranks = _launch({"kind": "ddp", "backend": backend, "steps": steps}, {})
        two = max(r["step_s"] for r in ranks)
        import torch_fl as fl

        path = fl.capabilities(backend).collectives_path
        print(
            f"  {backend:<7} ({path:<9}) 1 process {single * 1e3:7.1f} ms   2 processes (DDP) {two * 1e3:7.1f} ms"
            f"   ratio {two / single:.2f}x"
        )


def _fmt(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n} {unit}"
        n //= 1024
    return f"{n} GiB"


if __name__ == "__main__":
    main()
