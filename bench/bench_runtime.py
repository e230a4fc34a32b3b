"""Runtime speed against native CPU PyTorch, side by side in one run.

    python bench/bench_runtime.py            # article sizes (ResNet-50 b8 224², Transformer d512 x6 b16 s128)
    python bench/bench_runtime.py --quick    # small sizes, a smoke run

Prints: per-op dispatch overhead for a small op, GEMM 1024³ fp32 throughput,
and training-step time for ResNet-50 and the Transformer encoder, each with
the ratio to native."""

from __future__ import annotations

import argparse
import copy
import os
import time

import torch
from torch import nn

import torch_fl as fl
from torch_fl.tools.zoo import resnet50, transformer_encoder


def _best(fn, repeat: int, number: int = 1) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def small_op(number: int) -> tuple[float, float]:
    a, b = torch.randn(16), torch.randn(16)
    fa, fb = a.to("fl"), b.to("fl")
    native = _best(lambda: torch.add(a, b), 5, number)
    ours = _best(lambda: torch.add(fa, fb), 5, number)
    return native, ours


def gemm(n: int) -> tuple[float, float]:
    a, b = torch.randn(n, n), torch.randn(n, n)
    fa, fb = a.to("fl"), b.to("fl")
    flops = 2 * n**3
    native = _best(lambda: torch.mm(a, b), 5)
    ours = _best(lambda: torch.mm(fa, fb), 5)
    return flops / native / 1e9, flops / ours / 1e9


def train_step(make, x, target, loss_fn, repeat: int) -> tuple[float, float]:
    torch.manual_seed(0)
    model = make()
    dev_model = copy.deepcopy(model).to("fl")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    opt_dev = torch.optim.SGD(dev_model.parameters(), lr=0.01, momentum=0.9)
    xd, td = x.to("fl"), target.to("fl")

    def step(m, o, inp, tgt):
        def run():
            o.zero_grad()
            loss_fn(m(inp), tgt).backward()
            o.step()

        return run

    native = _best(step(model, opt, x, target), repeat)
    ours = _best(step(dev_model, opt_dev, xd, td), repeat)
    return native, ours


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    fl.initialize("cpu")
    from torch_fl.runtime import plugin

    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, backend {fl.get_current_backend_name()}, "
        f"host BLAS OpenBLAS {plugin.BLAS_CORE} (OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')})"
    )
    n, o = small_op(2000)
    print(
        f"small op (add, 16 floats): native {n * 1e6:.1f} us, fl {o * 1e6:.1f} us/op  "
        f"(fl overhead {(o - n) * 1e6:.1f} us, ratio {o / n:.1f}x)"
    )
    size = 512 if args.quick else 1024
    g_n, g_o = gemm(size)
    print(f"GEMM {size}^3 fp32: native {g_n:.0f} GFLOP/s, fl {g_o:.0f} GFLOP/s  ({g_o / g_n * 100:.0f}% of native)")
    if args.quick:
        rn = (lambda: resnet50(num_classes=10), torch.randn(2, 3, 64, 64), torch.tensor([1, 2]))
        tr = (lambda: transformer_encoder(128, 8, 2, dropout=0.0, dim_feedforward=256), torch.randn(4, 32, 128))
        repeat = 2
    else:
        rn = (lambda: resnet50(), torch.randn(8, 3, 224, 224), torch.randint(0, 1000, (8,)))
        tr = (lambda: transformer_encoder(512, 8, 6, dropout=0.0), torch.randn(16, 128, 512))
        repeat = 3
    n, o = train_step(rn[0], rn[1], rn[2], nn.functional.cross_entropy, repeat)
    print(f"ResNet-50 train step {tuple(rn[1].shape)}: native {n:.3f} s, fl {o:.3f} s  (ratio {o / n:.2f}x)")
    n, o = train_step(tr[0], tr[1], torch.zeros_like(tr[1]), nn.functional.mse_loss, repeat)
    print(f"TransformerEncoder train step {tuple(tr[1].shape)}: native {n:.3f} s, fl {o:.3f} s  (ratio {o / n:.2f}x)")


if __name__ == "__main__":
    main()
