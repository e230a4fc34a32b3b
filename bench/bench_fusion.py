"""What `torch.compile(backend="fl")` does to kernel count and step time, per backend,
against eager fl and native CPU PyTorch in the same run.

    python bench/bench_fusion.py                 # ResNet-50 b1 64², Transformer d512 x6 b2 s32
    python bench/bench_fusion.py --full          # the article's sizes (ResNet-50 b8 224², Transformer b16 s128)
    python bench/bench_fusion.py --backends rocm ascend --json fusion.json

For each backend: ResNet-50 inference (eval forward) and training step
(forward + backward of the output's sum, gradients reset first), the
Transformer encoder (torch_fl.models, 6 layers, d_model 512, 8 heads)
inference and training step with dropout 0. "eager" is the model on fl
without compilation, "compiled" is fl.compile (torch.compile with backend
"fl"), "native" is the same model on CPU tensors in plain PyTorch. Kernel
counts are fl.profile's kernel launches (fl.measure_compiled); times are the
best of 5 after a warm-up. PyTorch's MultiheadAttention/encoder fast path is
switched off for the fl runs: on fl it is one fused op no plugin implements
(a CPU fallback with zero kernels), which would make a kernel count
meaningless; the native run keeps it, as native users have it."""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import time

import torch

import torch_fl as fl
from torch_fl.compile import reset
from torch_fl.models import resnet50, transformer_encoder


@contextlib.contextmanager
def no_fast_path():
    fast = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fast)


def native_seconds(model: torch.nn.Module, x: torch.Tensor, train: bool, repeat: int = 5) -> float:
    m = copy.deepcopy(model).train(train)

    def step():
        if train:
            for p in m.parameters():
                p.grad = None
            m(x).sum().backward()
        else:
            with torch.no_grad():
                m(x)

    step()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(model: torch.nn.Module, x: torch.Tensor, backend: str, train: bool) -> dict:
    reset()
    fl.set_backend(backend)
    dev = copy.deepcopy(model).to(fl.device(backend)).train(train)
    compiled = fl.compile(dev)
    grad = torch.enable_grad() if train else torch.no_grad()
    with no_fast_path(), grad:
        m = fl.measure_compiled(compiled, x.to(fl.device(backend)), backward=train, repeat=5)
    report = fl.fusion_report(compiled)
    return {"backend": backend, "mode": "train" if train else "eval", "workload": m.workload,
            "kernels_eager": m.kernels_before, "kernels_compiled": m.kernels_after,
            "ms_eager": m.seconds_before * 1e3, "ms_compiled": m.seconds_after * 1e3,
            "fallbacks_eager": m.fallbacks_before, "fallbacks_compiled": m.fallbacks_after,
            "graphs": report.graph_count, "graph_breaks": len(report.graph_breaks), "patterns": report.counts()}


def line(name: str, r: dict, per: int = 1) -> str:
    ke, kc = r["kernels_eager"], r["kernels_compiled"]
    per_layer = f" (per layer {ke / per:.1f} -> {kc / per:.1f})" if per > 1 else ""
    native = r["ms_native"]
    return (f"{name:<28} {r['backend']:<8} {r['mode']:<5} kernels {ke:>5} -> {kc:>5} ({(1 - kc / ke) * 100:>3.0f}% "
            f"fewer){per_layer}  ms: native {native:8.1f}  eager {r['ms_eager']:8.1f} (x{r['ms_eager'] / native:.2f})"
            f"  compiled {r['ms_compiled']:8.1f} (x{r['ms_compiled'] / native:.2f})"
            + (f"  CPU fallbacks {r['fallbacks_eager']} -> {r['fallbacks_compiled']}"
               if r["fallbacks_eager"] or r["fallbacks_compiled"] else "")
            + (f"  graph breaks {r['graph_breaks']}" if r["graph_breaks"] else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", nargs="+", default=["cpu", "rocm", "ascend", "minimal"])
    ap.add_argument("--full", action="store_true", help="the article's sizes")
    ap.add_argument("--skip-train", action="store_true", help="inference only")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    torch.manual_seed(0)
    b, hw = (8, 224) if args.full else (1, 64)
    tb, ts = (16, 128) if args.full else (2, 32)
    layers = 6
    resnet = resnet50(num_classes=1000).eval()
    images = torch.randn(b, 3, hw, hw)
    seq = torch.randn(tb, ts, 512)
    enc = transformer_encoder(d_model=512, nhead=8, num_layers=layers, dropout=0.0)
    runs = [("ResNet-50", resnet, images, False, 1)]
    if not args.skip_train:
        runs.append(("ResNet-50", resnet, images, True, 1))
    runs.append(("Transformer encoder", enc, seq, False, layers))
    if not args.skip_train:
        runs.append(("Transformer encoder", enc, seq, True, layers))
    native = {(name, train): native_seconds(model, x, train) * 1e3 for name, model, x, train, _ in runs}
    results = []
    print(f"torch.compile(backend='fl'), torch {torch.__version__}; ResNet-50 b{b} {hw}x{hw}; Transformer encoder "
          f"{layers} layers d512 h8 b{tb} s{ts}; times: best of 5, x = ratio to native CPU PyTorch")
    for backend in args.backends:
        for name, model, x, train, per in runs:
            r = measure(model, x, backend, train)
            r["model"], r["ms_native"] = name, native[(name, train)]
            results.append(r)
            print(line(name, r, per), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
