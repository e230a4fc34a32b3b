"""What `torch.compile(backend="fl")` does to kernel count and step time, per backend,
against eager fl and native CPU PyTorch in the same run, and what graph replay
does to the host time per kernel.

    python bench/bench_fusion.py                 # ResNet-50 b1 64², Transformer d512 x6 b2 s32, then replay
    python bench/bench_fusion.py --full          # Torch-FL article sizes (ResNet-50 b8 224², Transformer b16 s128)
    python bench/bench_fusion.py --backends rocm ascend --json fusion.json
    python bench/bench_fusion.py --only replay   # the graph replay section alone
    python bench/bench_fusion.py --only layout --full   # channels-last on the devices that prefer it

For each backend: ResNet-50 inference (eval forward) and training step
(forward + backward of the output's sum, gradients reset first), the
Transformer encoder (torch_fl.tools.zoo, 6 layers, d_model 512, 8 heads)
inference and training step with dropout 0. "eager" is the model on fl
without compilation, "compiled" is fl.compile (torch.compile with backend
"fl"), "native" is the same model on CPU tensors in plain PyTorch. Kernel
counts are fl.profile's kernel launches (fl.measure_compiled); times are the
best of 5 after a warm-up. PyTorch's MultiheadAttention/encoder fast path is
switched off for the fl runs: on fl it is one fused op no plugin implements
(a CPU fallback with zero kernels), which would make a kernel count
meaningless; the native run keeps it, as native users have it.

Layout: for each backend whose table prefers channels-last (ascend), ResNet-50
inference compiled with the `layout` pass (NHWC activations) and without it
(NCHW), both compiled once and called in turn --rounds times (median), against
native CPU PyTorch in NCHW and in channels-last (best of 5).

Graph replay (torch.compile(m, backend="fl"), replay on by default; compiled = options={"replay": False}), for
small inference models where the host, not the kernels, sets the step time (an
MLP, a small conv net, a 2-layer BERT): step time (median of --calls calls after
warm-up, each followed by torch.fl.synchronize()) of eager fl, compiled fl,
replayed fl and the same model in native CPU PyTorch, as ratios to native CPU.
Host time per kernel in replay is measured two ways, both on the recorded
kernel list itself:
  loop  one KernelGraph.replay() call timed around the call, minus the time
        spent inside the kernels in that same call (the C loop reads a clock
        around each kernel), divided by the kernel count: cffi call + C loop
        + clock reads (median over the calls);
  call  the replayed torch.compile call's median time minus the median time
        inside the kernels, divided by the kernel count: everything that is not
        a kernel, including Dynamo's guards, AOTAutograd's wrappers, the model's
        Python outside the graph, our guards, the input and output copies.
The replay wrapper's own time per call (median; its guards, copies, output
allocation and the kernels: ReplayStatus.last_replay_ns) is printed beside them, so
that call minus wrapper is what torch.compile's machinery and the model's
Python outside the graph cost."""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import time

import torch

import torch_fl as fl
from torch_fl.compile import reset
from torch_fl.compile.dynamo import backend as backend_with
from torch_fl.runtime import core
from torch_fl.tools.zoo import resnet50, transformer_encoder


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

    return _best_seconds(step, repeat)


def measure(model: torch.nn.Module, x: torch.Tensor, backend: str, train: bool) -> dict:
    reset()
    fl.set_backend(backend)
    dev = copy.deepcopy(model).to(fl.device(backend)).train(train)
    compiled = fl.compile(dev)
    grad = torch.enable_grad() if train else torch.no_grad()
    with no_fast_path(), grad:
        m = fl.measure_compiled(compiled, x.to(fl.device(backend)), backward=train, repeat=5)
    report = fl.fusion_report(compiled)
    return {
        "backend": backend,
        "mode": "train" if train else "eval",
        "workload": m.workload,
        "kernels_eager": m.kernels_before,
        "kernels_compiled": m.kernels_after,
        "ms_eager": m.seconds_before * 1e3,
        "ms_compiled": m.seconds_after * 1e3,
        "fallbacks_eager": m.fallbacks_before,
        "fallbacks_compiled": m.fallbacks_after,
        "graphs": report.graph_count,
        "graph_breaks": len(report.graph_breaks),
        "patterns": report.counts(),
    }


def line(name: str, r: dict, per: int = 1) -> str:
    ke, kc = r["kernels_eager"], r["kernels_compiled"]
    per_layer = f" (per layer {ke / per:.1f} -> {kc / per:.1f})" if per > 1 else ""
    native = r["ms_native"]
    return (
        f"{name:<28} {r['backend']:<8} {r['mode']:<5} kernels {ke:>5} -> {kc:>5} ({(1 - kc / ke) * 100:>3.0f}% "
        f"fewer){per_layer}  ms: native {native:8.1f}  eager {r['ms_eager']:8.1f} (x{r['ms_eager'] / native:.2f})"
        f"  compiled {r['ms_compiled']:8.1f} (x{r['ms_compiled'] / native:.2f})"
        + (
            f"  CPU fallbacks {r['fallbacks_eager']} -> {r['fallbacks_compiled']}"
            if r["fallbacks_eager"] or r["fallbacks_compiled"]
            else ""
        )
        + (f"  graph breaks {r['graph_breaks']}" if r["graph_breaks"] else "")
    )


def fusion_section(args: argparse.Namespace) -> list[dict]:
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
    print(
        f"torch.compile(backend='fl'), torch {torch.__version__}; ResNet-50 b{b} {hw}x{hw}; Transformer encoder "
        f"{layers} layers d512 h8 b{tb} s{ts}; times: best of 5, x = ratio to native CPU PyTorch"
    )
    for backend in args.backends:
        for name, model, x, train, per in runs:
            r = measure(model, x, backend, train)
            r["model"], r["ms_native"] = name, native[(name, train)]
            results.append(r)
            print(line(name, r, per), flush=True)
    return results


def _replay_models() -> list:
    """(name, model, args, kwargs) of the small inference workloads, on the CPU."""
    mlp = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 10)
    )
    conv = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, stride=2),
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(16, 10),
    )
    models = [
        ("MLP 64-256-256-10 b4", mlp, (torch.randn(4, 64),), {}),
        ("conv net 2x(conv+bn+relu) b2 16x16", conv, (torch.randn(2, 3, 16, 16),), {}),
    ]
    try:
        import transformers
    except ImportError:
        return models
    # dropout 0: a training step with dropout is not replayed (a replay would repeat its mask)
    cfg = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    bert = transformers.BertModel(cfg)
    models.append(
        (
            "BERT 2 layers h32 b2 s8",
            bert,
            (),
            {"input_ids": torch.randint(0, 100, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.long)},
        )
    )
    return models


def _median_call_us(fn, calls: int, sync) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        sync()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def measure_replay(name: str, model: torch.nn.Module, args: tuple, kwargs: dict, backend: str, calls: int) -> dict:
    from torch_fl.compile import dynamo as fl_dynamo

    fl_dynamo.reset()  # every torch.compile(module) shares one frame: without a reset, Dynamo's recompile limit
    fl.set_backend(backend)
    dev = fl.device(backend)
    model = copy.deepcopy(model).eval()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_var.uniform_(0.5, 2.0)
    on_fl = copy.deepcopy(model).to(dev)
    fl_args = tuple(a.to(dev) for a in args)
    fl_kwargs = {k: v.to(dev) for k, v in kwargs.items()}
    compiled = torch.compile(copy.deepcopy(on_fl), backend="fl", options={"replay": False})  # replay is the default
    replayed = torch.compile(on_fl, backend="fl", options={"replay": True})
    sync = torch.fl.synchronize
    with torch.no_grad():
        r = {
            "backend": backend,
            "model": name,
            "native_cpu_us": _median_call_us(lambda: model(*args, **kwargs), calls, lambda: None),
            "eager_us": _median_call_us(lambda: on_fl(*fl_args, **fl_kwargs), calls, sync),
            "compiled_us": _median_call_us(lambda: compiled(*fl_args, **fl_kwargs), calls, sync),
        }
        replayed(*fl_args, **fl_kwargs)  # compiles: the graph's ReplayStatus exists from here on
        status = [g.replay for g in fl_dynamo.fusion_report(replayed).graphs if g.replay is not None]
        wrapper: list[int] = []

        def replay_call():
            n = status[0].replays if len(status) == 1 else 0
            replayed(*fl_args, **fl_kwargs)
            if len(status) == 1 and status[0].replays > n:
                wrapper.append(status[0].last_replay_ns)

        r["replayed_us"] = _median_call_us(replay_call, calls, sync)
    status = [g.replay for g in fl_dynamo.fusion_report(replayed).graphs if g.replay is not None]
    graph = status[0].graph if len(status) == 1 and status[0].replayed else None
    r["replay"] = str(status[0]) if len(status) == 1 else f"{len(status)} graphs"
    if graph is not None:
        n = graph.kernel_count
        step_ns = core.ffi.new("int64_t[]", n)
        host, inside = [], []
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            graph.replay(None, None, step_ns=step_ns)
            wall = time.perf_counter_ns() - t0
            k = sum(step_ns)
            inside.append(k)
            host.append(wall - k)
        r.update(
            kernels=n,
            kernel_us=statistics.median(inside) / 1e3,
            host_per_kernel_loop_us=statistics.median(host) / n / 1e3,
            host_per_kernel_call_us=(r["replayed_us"] - statistics.median(inside) / 1e3) / n,
            replay_wrapper_us=statistics.median(wrapper[-calls:]) / 1e3,
        )
    return r


def measure_replay_train(
    name: str, model: torch.nn.Module, args: tuple, kwargs: dict, backend: str, calls: int
) -> dict:
    """One training step (forward, mean-square loss, backward, SGD step; gradients set to None) of eager fl,
    compiled fl, replayed fl (forward and backward graphs replayed) and native CPU PyTorch."""
    from torch_fl.compile import dynamo as fl_dynamo

    fl_dynamo.reset()
    fl.set_backend(backend)
    dev = fl.device(backend)
    model = copy.deepcopy(model).train()
    on_fl = copy.deepcopy(model).to(dev)
    fl_args = tuple(a.to(dev) for a in args)
    fl_kwargs = {k: v.to(dev) for k, v in kwargs.items()}
    compiled_model, replayed_model = copy.deepcopy(on_fl), on_fl
    compiled = torch.compile(compiled_model, backend="fl", options={"replay": False})  # replay is the default
    replayed = torch.compile(replayed_model, backend="fl", options={"replay": True})

    def stepper(fn, params, a, kw):
        opt = torch.optim.SGD(params, lr=1e-3)

        def step():
            out = fn(*a, **kw)
            out = getattr(out, "last_hidden_state", out)
            loss = out.square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return step

    sync = torch.fl.synchronize
    cpu_eager = copy.deepcopy(model)
    r = {
        "backend": backend,
        "model": name + " (train step)",
        "native_cpu_us": _median_call_us(stepper(cpu_eager, cpu_eager.parameters(), args, kwargs), calls, lambda: None),
        "eager_us": _median_call_us(stepper(copy.deepcopy(on_fl), on_fl.parameters(), fl_args, fl_kwargs), calls, sync),
        "compiled_us": _median_call_us(stepper(compiled, compiled_model.parameters(), fl_args, fl_kwargs), calls, sync),
        "replayed_us": _median_call_us(stepper(replayed, replayed_model.parameters(), fl_args, fl_kwargs), calls, sync),
    }
    status = [g.replay for g in fl_dynamo.fusion_report(replayed).graphs if g.replay is not None]
    r["replay"] = str(status[0]) if len(status) == 1 else f"{len(status)} graphs"
    return r


def _best_seconds(fn, repeat: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def layout_section(args: argparse.Namespace) -> list[dict]:
    torch.manual_seed(0)
    b, hw = (8, 224) if args.full else (1, 64)
    resnet = resnet50(num_classes=1000).eval()
    images = torch.randn(b, 3, hw, hw)
    with torch.no_grad():
        nchw = _best_seconds(lambda: resnet(images))
        cl_model = copy.deepcopy(resnet).to(memory_format=torch.channels_last)
        cl_images = images.contiguous(memory_format=torch.channels_last)
        nhwc = _best_seconds(lambda: cl_model(cl_images))
    print(
        f"layout pass, torch {torch.__version__}: ResNet-50 b{b} {hw}x{hw} inference, median of {args.rounds} "
        f"interleaved calls; native CPU (best of 5) NCHW "
        f"{nchw * 1e3:.1f} ms, channels-last {nhwc * 1e3:.1f} ms"
    )
    rows = []
    for backend in args.backends:
        if not any(d.channels_last for d in fl.capabilities(backend).devices):
            continue
        fl.set_backend(backend)
        dev = fl.device(backend)
        model, x = copy.deepcopy(resnet).to(dev), images.to(dev)
        reset()
        compiled = {
            "nchw": torch.compile(model, backend=backend_with({"layout": False})),
            "nhwc": torch.compile(model, backend=backend_with(None)),
        }
        runs: dict[str, list[float]] = {"nchw": [], "nhwc": []}
        with torch.no_grad():
            for c in compiled.values():
                c(x).cpu()
                c(x).cpu()
            # the two interleaved, call by call: this machine's speed drifts for seconds at a time
            for i in range(args.rounds):
                for name in ("nchw", "nhwc") if i % 2 == 0 else ("nhwc", "nchw"):
                    t0 = time.perf_counter()
                    compiled[name](x).cpu()
                    runs[name].append(time.perf_counter() - t0)
        ms = {name: statistics.median(v) * 1e3 for name, v in runs.items()}
        r = {
            "backend": backend,
            "workload": f"ResNet-50 b{b} {hw}x{hw} eval",
            "ms_layout_off": ms["nchw"],
            "ms_layout_on": ms["nhwc"],
            "ms_native_nchw": nchw * 1e3,
            "ms_native_channels_last": nhwc * 1e3,
        }
        rows.append(r)
        print(
            f"{backend:<8} compiled, layout off {ms['nchw']:8.1f} ms (x{ms['nchw'] / (nchw * 1e3):.2f} native NCHW)"
            f"  layout on {ms['nhwc']:8.1f} ms (x{ms['nhwc'] / (nhwc * 1e3):.2f} native channels-last)"
            f"  on/off x{ms['nhwc'] / ms['nchw']:.2f}",
            flush=True,
        )
    return rows


def replay_line(r: dict) -> str:
    base = r["native_cpu_us"]
    times = "  ".join(
        f"{k} {r[k + '_us']:>8.1f} us (x{r[k + '_us'] / base:5.2f})" for k in ("eager", "compiled", "replayed")
    )
    head = f"{r['model']:<47} {r['backend']:<8} native CPU {base:>7.1f} us  {times}"
    if "kernels" not in r:  # a training step, or a graph that is not replayed
        return f"{head}\n{'':<56}{r['replay']}"
    return (
        f"{head}\n{'':<56}{r['kernels']} kernels, {r['kernel_us']:.1f} us inside them; host per kernel: "
        f"loop {r['host_per_kernel_loop_us'] * 1e3:.0f} ns, whole call {r['host_per_kernel_call_us']:.2f} us; "
        f"replay wrapper {r['replay_wrapper_us']:.1f} us/call (kernels included)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", nargs="+", default=["cpu", "rocm", "ascend", "minimal"])
    ap.add_argument("--full", action="store_true", help="the Torch-FL article's sizes")
    ap.add_argument("--skip-train", action="store_true", help="inference only")
    ap.add_argument("--only", choices=("fusion", "layout", "replay"), help="one section only")
    ap.add_argument("--calls", type=int, default=200, help="timed calls per figure in the replay section")
    ap.add_argument("--rounds", type=int, default=20, help="calls of each variant in the layout section")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    results = []
    if args.only in (None, "fusion"):
        results += fusion_section(args)
    if args.only in (None, "layout"):
        results += layout_section(args)
    if args.only in (None, "replay"):
        torch.manual_seed(0)
        print(
            f"graph replay, torch {torch.__version__}: median of {args.calls} calls; ratios to native CPU PyTorch "
            f"(torch threads: {torch.get_num_threads()})"
        )
        for backend in args.backends:
            for name, model, margs, mkwargs in _replay_models():
                r = measure_replay(name, model, margs, mkwargs, backend, args.calls)
                results.append(r)
                print(replay_line(r), flush=True)
            for name, model, margs, mkwargs in _replay_models():
                if not args.skip_train:
                    r = measure_replay_train(name, model, margs, mkwargs, backend, max(args.calls // 4, 5))
                    results.append(r)
                    print(replay_line(r), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
