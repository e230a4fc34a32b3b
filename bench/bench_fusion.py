"""What fl.compile's fusion does to kernel count and step time, per backend.

    python bench/bench_fusion.py                 # ResNet-50 b1 64², Transformer d512 x6 b2 s32
    python bench/bench_fusion.py --full          # the article's sizes (ResNet-50 b8 224², Transformer b16 s128)
    python bench/bench_fusion.py --backends rocm ascend --json fusion.json

For each backend: ResNet-50 inference (eval forward) and training step
(forward + backward), the Transformer encoder (torch_fl.models, 6 layers,
d_model 512, 8 heads) inference and training step with dropout 0 and with the
default dropout 0.1. "unfused" is the captured graph with no pass (the
model's own ops; for the Transformer in eval this is PyTorch's slow path:
its fast path is one fused CPU op that fl serves by the CPU fallback);
"fused" is fl.compile's graph. Kernel counts are fl.profile's kernel
launches; times are the best of 3 after a warm-up."""

from __future__ import annotations

import argparse
import copy
import json
import warnings

import torch

import torch_fl as fl
from torch_fl.compile import PerformanceHint
from torch_fl.models import resnet50, transformer_encoder


def measure(model: torch.nn.Module, x: torch.Tensor, backend: str, train: bool) -> dict:
    fl.set_backend(backend)
    dev = copy.deepcopy(model).to(fl.device(backend)).train(train)
    compiled = fl.compile(dev)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PerformanceHint)
        report = compiled.measure(x.to(fl.device(backend)), backward=train, repeat=5)
    m = report.measurement
    return {"backend": backend, "mode": "train" if train else "eval", "workload": m.workload,
            "kernels_before": m.kernels_before, "kernels_after": m.kernels_after,
            "ms_before": m.seconds_before * 1e3, "ms_after": m.seconds_after * 1e3,
            "fallbacks_before": m.fallbacks_before, "fallbacks_after": m.fallbacks_after,
            "patterns": report.counts(), "hints": len(report.hints)}


def line(name: str, r: dict, per: int = 1) -> str:
    kb, ka = r["kernels_before"], r["kernels_after"]
    per_layer = f"  per layer {kb / per:.1f} -> {ka / per:.1f}" if per > 1 else ""
    return (f"{name:<34} {r['backend']:<8} {r['mode']:<5} kernels {kb:>5} -> {ka:>5} ({(1 - ka / kb) * 100:>3.0f}% "
            f"fewer){per_layer}   time {r['ms_before']:>9.1f} -> {r['ms_after']:>9.1f} ms "
            f"(x{r['ms_before'] / r['ms_after']:.2f})"
            + (f"  CPU fallbacks {r['fallbacks_before']} -> {r['fallbacks_after']}"
               if r["fallbacks_before"] or r["fallbacks_after"] else ""))


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
    enc0 = transformer_encoder(d_model=512, nhead=8, num_layers=layers, dropout=0.0)
    enc1 = transformer_encoder(d_model=512, nhead=8, num_layers=layers, dropout=0.1)
    results = []
    print(f"fl.compile fusion, torch {torch.__version__}; ResNet-50 b{b} {hw}x{hw}; Transformer encoder "
          f"{layers} layers d512 h8 b{tb} s{ts}")
    for backend in args.backends:
        runs = [("ResNet-50", resnet, images, False, 1)]
        if not args.skip_train:
            runs.append(("ResNet-50", resnet, images, True, 1))
        runs.append(("Transformer encoder", enc0, seq, False, layers))
        if not args.skip_train:
            runs.append(("Transformer encoder (dropout 0)", enc0, seq, True, layers))
            runs.append(("Transformer encoder (dropout 0.1)", enc1, seq, True, layers))
        for name, model, x, train, per in runs:
            r = measure(model, x, backend, train)
            r["model"] = name
            results.append(r)
            print(line(name, r, per), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
