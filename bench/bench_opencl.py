"""The opencl backend against native CPU PyTorch, in the same run.

    python bench/bench_opencl.py            # --quick: fewer repetitions, no ResNet

What it measures (each fl figure beside native CPU's, and their ratio):
  small op      a + b on 1000 float32 elements, per call, through torch (dispatch + launch), and the
                plugin's own kernel call alone (cffi, no torch): what the OpenCL driver costs per launch
  launch+wait   the plugin's kernel call followed by a wait for it (a blocking 4-byte read)
  copy          host -> device and device -> host bandwidth of 64 MiB through the plugin's copies
  GEMM          torch.mm 1024x1024x1024 float32, GFLOP/s
  JIT op        torch.atan2 on 1M float32 (the plugin has no kernel for it: generated OpenCL C, the device
                JIT), and a generated float32 prod over rows of 1000x1000, each per call
  models        one training step (forward, backward, AdamW) of a tiny BERT and of a ResNet-50-shaped
                Hugging Face ResNet (batch 2, 64x64), seconds per step after a warm-up step

Every fl timing ends with torch.fl.synchronize(): kernels are asynchronous, and a timing that stops when the
last call returns measures queueing, not work."""

from __future__ import annotations

import argparse
import json
import time

import torch

import torch_fl as fl
from torch_fl.runtime import REGISTRY, abi
from torch_fl.runtime.abi import ffi


def _best(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def small_op(reps: int) -> dict:
    n = 2000
    a, b = torch.randn(1000), torch.randn(1000)
    fa, fb = a.to("fl"), b.to("fl")

    def cpu():
        for _ in range(n):
            a + b

    def dev():
        for _ in range(n):
            fa + fb
        torch.fl.synchronize()

    dev()
    return {"cpu_us": _best(cpu, reps) / n * 1e6, "fl_us": _best(dev, reps) / n * 1e6}


def _descs(*tensors):
    d = ffi.new(f"fl_tensor_t[{len(tensors)}]")
    for k, t in enumerate(tensors):
        d[k].data, d[k].offset, d[k].dtype, d[k].ndim = ffi.cast("void *", t.data_ptr()), 0, 0, 1
        d[k].sizes[0], d[k].strides[0] = t.numel(), 1
    return d


def launch_cost(reps: int) -> dict:
    """The plugin's aten::add.Tensor kernel called directly: the driver's enqueue cost, then with a wait."""
    dev = REGISTRY.current_device
    fn = dev.plugin.kernels["aten::add.Tensor"].fn
    a, b, out = (torch.randn(1000, device="fl") for _ in range(3))
    ins, outs = _descs(a, b), _descs(out)
    args = ffi.new("fl_arg_t[3]")
    args[0].kind, args[0].i = abi.ARG_TENSOR, 0
    args[1].kind, args[1].i = abi.ARG_TENSOR, 1
    args[2].kind, args[2].i = abi.ARG_INT, 1
    host = ffi.new("float[1]")
    table = dev.plugin.table
    n = 2000

    def enqueue():
        for _ in range(n):
            fn(ffi.NULL, dev.local, ins, 2, outs, 1, args, 3)
        table.synchronize(dev.local)

    def with_wait():
        for _ in range(n // 10):
            fn(ffi.NULL, dev.local, ins, 2, outs, 1, args, 3)
            table.copy_d2h(dev.local, host, outs[0].data, 4, ffi.NULL)

    enqueue()
    return {"launch_us": _best(enqueue, reps) / n * 1e6, "launch_wait_us": _best(with_wait, reps) / (n // 10) * 1e6}


def copies(reps: int) -> dict:
    dev = REGISTRY.current_device
    table = dev.plugin.table
    nbytes = 64 << 20
    host = torch.empty(nbytes, dtype=torch.uint8)
    d = torch.empty(nbytes, dtype=torch.uint8, device="fl")
    h2d = _best(
        lambda: table.copy_h2d(
            dev.local, ffi.cast("void *", d.data_ptr()), ffi.cast("void *", host.data_ptr()), nbytes, ffi.NULL
        ),
        reps,
    )
    d2h = _best(
        lambda: table.copy_d2h(
            dev.local, ffi.cast("void *", host.data_ptr()), ffi.cast("void *", d.data_ptr()), nbytes, ffi.NULL
        ),
        reps,
    )
    return {"h2d_GBps": nbytes / h2d / 1e9, "d2h_GBps": nbytes / d2h / 1e9}


def gemm(reps: int) -> dict:
    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    fa, fb = a.to("fl"), b.to("fl")
    flop = 2 * n**3

    def dev():
        torch.mm(fa, fb)
        torch.fl.synchronize()

    dev()
    cpu = _best(lambda: torch.mm(a, b), reps)
    return {"cpu_GFLOPs": flop / cpu / 1e9, "fl_GFLOPs": flop / _best(dev, reps) / 1e9}


def jit_ops(reps: int) -> dict:
    """Ops the opencl plugin has no kernel for, served by generated OpenCL C (checked: the path is "jit")."""
    a, b = torch.randn(1 << 20), torch.randn(1 << 20)
    m = torch.rand(1000, 1000) + 0.5
    fa, fb, fm = a.to("fl"), b.to("fl"), m.to("fl")
    with fl.profile() as prof:
        torch.atan2(fa, fb), fm.prod(1)
        torch.fl.synchronize()
    if sum(1 for e in prof.events if e.path == "jit") < 2:
        ran = sorted({(e.op, e.path) for e in prof.events})
        raise SystemExit(f"the JIT ops did not run as generated kernels: {ran}")
    out = {}
    for name, cpu, dev in (
        ("atan2", lambda: torch.atan2(a, b), lambda: torch.atan2(fa, fb)),
        ("prod", lambda: m.prod(1), lambda: fm.prod(1)),
    ):
        out[f"{name}_cpu_ms"] = _best(cpu, reps) * 1e3

        def timed(dev=dev):
            dev()
            torch.fl.synchronize()

        out[f"{name}_fl_ms"] = _best(timed, reps) * 1e3
    return out


def _step_time(model, inputs, device, reps: int) -> float:
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    inputs = {k: v.to(device) for k, v in inputs.items()}

    def step():
        opt.zero_grad()
        out = model(**inputs)
        out.loss.backward()
        opt.step()
        if device != "cpu":
            torch.fl.synchronize()

    step()
    return _best(step, reps)


def models(reps: int, resnet: bool) -> dict:
    from transformers import BertConfig, BertForSequenceClassification, ResNetConfig, ResNetForImageClassification

    out = {}
    torch.manual_seed(0)
    bert = BertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
    )
    inputs = {"input_ids": torch.randint(0, 1000, (8, 32)), "labels": torch.zeros(8, dtype=torch.long)}
    out["bert_cpu_s"] = _step_time(BertForSequenceClassification(bert), inputs, "cpu", reps)
    torch.manual_seed(0)
    out["bert_fl_s"] = _step_time(BertForSequenceClassification(bert), inputs, "fl", reps)
    if resnet:  # ResNet-50's shape (bottleneck blocks 3-4-6-3, widths 256..2048), small images
        cfg = ResNetConfig(
            depths=[3, 4, 6, 3], hidden_sizes=[256, 512, 1024, 2048], layer_type="bottleneck", num_labels=10
        )
        inputs = {"pixel_values": torch.randn(2, 3, 64, 64), "labels": torch.tensor([1, 2])}
        torch.manual_seed(0)
        out["resnet50_cpu_s"] = _step_time(ResNetForImageClassification(cfg), inputs, "cpu", max(1, reps // 2))
        torch.manual_seed(0)
        out["resnet50_fl_s"] = _step_time(ResNetForImageClassification(cfg), inputs, "fl", max(1, reps // 2))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if "opencl" not in fl.available_backends():
        row = next((r for r in fl.list_backends() if r["name"] == "opencl"), None)
        raise SystemExit(f"no opencl backend here: {row['reason'] if row else 'not built'}")
    fl.initialize("opencl")
    reps = 3 if a.quick else 5
    res = {
        "device": REGISTRY.current_device.props.name,
        "small_op": small_op(reps),
        "plugin": launch_cost(reps),
        "copy": copies(reps),
        "gemm": gemm(reps),
        "jit": jit_ops(reps),
        "models": models(reps, resnet=not a.quick),
    }
    if a.json:
        print(json.dumps(res, indent=1))
        return
    s, g, m = res["small_op"], res["gemm"], res["models"]
    print(f"device: {res['device']}")
    print(
        f"small op (add, 1000 floats): fl {s['fl_us']:.1f} us, native CPU {s['cpu_us']:.1f} us, "
        f"+{s['fl_us'] - s['cpu_us']:.1f} us"
    )
    print(
        f"plugin kernel call alone: {res['plugin']['launch_us']:.1f} us; with a wait for it: "
        f"{res['plugin']['launch_wait_us']:.1f} us"
    )
    print(
        f"copies of 64 MiB: host->device {res['copy']['h2d_GBps']:.2f} GB/s, device->host "
        f"{res['copy']['d2h_GBps']:.2f} GB/s"
    )
    print(
        f"GEMM 1024^3 float32: fl {g['fl_GFLOPs']:.1f} GFLOP/s, native CPU {g['cpu_GFLOPs']:.1f} GFLOP/s, "
        f"ratio {g['fl_GFLOPs'] / g['cpu_GFLOPs']:.2f}"
    )
    j = res["jit"]
    for name, what in (("atan2", "atan2, 1M floats"), ("prod", "prod over rows, 1000x1000")):
        print(
            f"JIT op ({what}): fl {j[name + '_fl_ms']:.2f} ms, native CPU {j[name + '_cpu_ms']:.2f} ms, "
            f"ratio {j[name + '_fl_ms'] / j[name + '_cpu_ms']:.2f}"
        )
    print(
        f"tiny BERT training step: fl {m['bert_fl_s'] * 1e3:.1f} ms, native CPU {m['bert_cpu_s'] * 1e3:.1f} ms, "
        f"ratio {m['bert_fl_s'] / m['bert_cpu_s']:.2f}"
    )
    if "resnet50_fl_s" in m:
        print(
            f"ResNet-50-shaped training step (2x3x64x64): fl {m['resnet50_fl_s']:.2f} s, native CPU "
            f"{m['resnet50_cpu_s']:.2f} s, ratio {m['resnet50_fl_s'] / m['resnet50_cpu_s']:.2f}"
        )


if __name__ == "__main__":
    main()
