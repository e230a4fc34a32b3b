"""`torch-fl`: the command line.

    torch-fl doctor [--full] [--backend NAME]   discover backends, print capability tables,
                                                train the reference models on each and compare with CPU
    torch-fl backends                           every plugin found, and why any was rejected
    torch-fl explain OP [--dtype D] [--backend NAME]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import torch


def _doctor(args) -> int:
    import torch_fl as fl
    from torch_fl.models import resnet50, transformer_encoder

    print(f"torch {torch.__version__}, torch_fl {fl.__version__}")
    report = fl.list_backends()
    print(report.render())
    names = [args.backend] if args.backend else report.names()
    if not names:
        print("no backend could be loaded")
        return 1
    if args.full:  # the article's section 4.2 sizes
        cases = [("ResNet-50", lambda: resnet50(), (8, 3, 224, 224)),
                 ("TransformerEncoder", lambda: transformer_encoder(512, 8, 6, dropout=0.0), (16, 128, 512))]
    else:
        cases = [("ResNet-50", lambda: resnet50(num_classes=10), (2, 3, 64, 64)),
                 ("TransformerEncoder", lambda: transformer_encoder(128, 8, 2, dropout=0.0, dim_feedforward=256),
                  (4, 32, 128))]
    failures = 0
    for name in names:
        fl.set_backend(name)
        print()
        print(fl.capabilities(name).render())
        for label, make, shape in cases:
            torch.manual_seed(0)
            model = make()
            x = torch.randn(*shape)
            t0 = time.perf_counter()
            out_ref = model(x)
            out_ref.float().pow(2).mean().backward()
            t_ref = time.perf_counter() - t0
            dev_model = copy.deepcopy(model).to(fl.current_device())
            model.zero_grad()
            t0 = time.perf_counter()
            out = dev_model(x.to(fl.current_device()))
            out.float().pow(2).mean().backward()
            torch.fl.synchronize()
            t_dev = time.perf_counter() - t0
            scale = out_ref.abs().max().item()
            diff = (out.detach().cpu() - out_ref.detach()).abs().max().item()
            ok = diff <= 1e-4 * max(scale, 1e-6)
            grads_ok = all(p.grad is not None and p.grad.device.type == "fl" for p in dev_model.parameters())
            failures += not (ok and grads_ok)
            print(f"  {label:<19} forward+backward {tuple(shape)}: max|diff| {diff:.2e} (scale {scale:.2e}) "
                  f"{'OK' if ok else 'MISMATCH'}; grads on device {'yes' if grads_ok else 'NO'}; "
                  f"{t_dev:.2f}s on fl vs {t_ref:.2f}s native CPU")
        paths: dict[str, int] = {}
        for (_op, path), n in fl._registry.REGISTRY.get(name).counts.items():
            paths[path] = paths.get(path, 0) + n
        print("  op calls by path: " + ", ".join(f"{p} {n}" for p, n in sorted(paths.items())))
    print()
    print("doctor: all backends OK" if not failures else f"doctor: {failures} check(s) FAILED")
    return 0 if not failures else 1


def _backends(args) -> int:
    import torch_fl as fl

    print(fl.list_backends().render())
    return 0


def _explain(args) -> int:
    import torch_fl as fl

    dtype = getattr(torch, args.dtype)
    print(fl.explain(args.op, dtype, backend=args.backend).render())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torch-fl", description="torch_fl: PyTorch on any vendor's chip")
    sub = parser.add_subparsers(dest="command")
    d = sub.add_parser("doctor", help="check every backend end to end (the default)")
    d.add_argument("--full", action="store_true", help="use the article's model sizes (slow on a CPU)")
    d.add_argument("--backend", help="only this backend")
    sub.add_parser("backends", help="list the plugins found and why any was rejected")
    e = sub.add_parser("explain", help="which path an op takes and why")
    e.add_argument("op")
    e.add_argument("--dtype", default="float32")
    e.add_argument("--backend")
    args = parser.parse_args(argv)
    command = args.command or "doctor"
    if command == "doctor" and args.command is None:
        args = parser.parse_args(["doctor"])
    try:
        return {"doctor": _doctor, "backends": _backends, "explain": _explain}[command](args)
    except Exception as exc:  # user-facing: one line, no traceback
        from torch_fl.errors import FlError

        if isinstance(exc, (FlError, ValueError)):
            print(f"torch-fl: error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
