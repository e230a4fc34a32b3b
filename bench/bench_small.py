"""Small models, where the host's cost per op sets the step time: one SGD training step (and one
inference call) per model and backend, eager fl, compiled fl (which replays its graphs by default),
compiled fl without replay, native CPU eager and native CPU under inductor, side by side in one run.

    python bench/bench_small.py                       # every model on cpu, rocm, ascend, minimal
    python bench/bench_small.py --mode infer          # inference only (eval, no_grad); --mode train
    python bench/bench_small.py --quick               # fewer rounds, a smoke run
    python bench/bench_small.py --models mlp bert --backends rocm minimal
    python bench/bench_small.py --no-inductor         # skip native CPU under torch.compile
    python bench/bench_small.py --caller-thread       # backward on the calling thread (see below)
    python bench/bench_small.py --handoff             # the smallest backward: device thread vs calling thread
    python bench/bench_small.py --models lstm --allow-rnn   # Dynamo captures nn.LSTM (see below)
    python bench/bench_small.py --kernels             # the host plugin's cost per kernel instead
    python bench/bench_small.py --kernels --old OLD/libfl_cpu.so   # ... beside another build's

Models (training mode, dropout 0 so that replay applies; SGD lr 1e-3, gradients set to None):
  mlp   MLP 64-256-256-10 (GELU), batch 4, cross-entropy
  bert  transformers BertForSequenceClassification, 2 layers, hidden 32, 2 heads, intermediate 64,
        batch 2, seq 8, 2 labels (the model's own loss)
  conv  conv 3->16 + BN + ReLU, conv 16->16 stride 2 + BN + ReLU, global pool, linear 16->10;
        batch 2, 3x16x16, cross-entropy
  lstm  nn.LSTM 2 layers, input 32, hidden 64, batch_first, linear 64->10 on the last step;
        batch 4, seq 16, cross-entropy

Columns, each one training step (forward, loss, backward, optimizer step) or one inference call
(eval mode, torch.no_grad(), the model's output), in microseconds:
  native    the model on CPU tensors in plain PyTorch (eager)
  inductor  the same under torch.compile (inductor), what a CPU user would pick instead; skipped,
            with the reason, when inductor does not work here
  eager     the model on the backend's fl device, no compilation
  compiled  torch.compile(model, backend="fl"): its graphs recorded once as kernel lists and replayed
            by the C core where they can be (the default, docs/fusion.md "Graph replay"), simple
            training graphs run by torch_fl's lean runtime (the default, compile/lean.py)
  aot-runtime  the same with options={"lean": False}: AOTAutograd's own runtime around the graphs
            (training only: inference graphs always run on it)
  no-replay torch.compile(model, backend="fl", options={"replay": False}): every op dispatched
  dynamo    torch.compile(model, backend="eager") on fl: Dynamo's capture run by eager PyTorch, no
            compiler at all; what any torch.compile backend costs per call at least (its guards,
            its frame handling), the floor under the compiled column
Every fl step ends with torch.fl.synchronize(). Timing: after a warm-up (compilation, recording),
--rounds rounds; in each round every column runs --steps steps back to back, the columns in a
rotated order (this machine's speed drifts for seconds at a time); a column's figure is the median
over rounds of its time per step. Ratios: eager / native, compiled / eager, compiled / native,
aot-runtime / eager, no-replay / eager, dynamo / eager, inductor / native. One thread by default
(torch.set_num_threads(1); --threads to change), which is also the plugins' OpenMP team size (they share
torch's OpenMP runtime).

Dynamo's caches are reset before each model (torch._dynamo.reset()): Dynamo keys compiled code on the
forward's code object, which every nn.Sequential shares, and once a code object has run with other input sizes
it compiles it with symbolic sizes, so without the reset the conv net (after the MLP) was measured compiled
with dynamic shapes, which a user compiling it alone does not get.

A column that fails prints its error's first line below the table instead of stopping the run.

--caller-thread: every backward runs on the thread that calls it (torch.autograd.set_multithreading_enabled
(False), PyTorch's own switch), as CPU tensors' always do. By default PyTorch's autograd engine runs an
accelerator's backward on a thread of its own per device (fl's too, as CUDA's), and the calling thread waits for
it: a hand-off each way per backward, which costs tens of microseconds where waking a thread on another core is
slow (this machine: ~40 us a round trip). The switch says what that costs each training row; --handoff times
the smallest backward ((x * 2).sum().backward() of 4 elements) both ways on each backend, beside native.

--allow-rnn: torch._dynamo.config.allow_rnn = True, Dynamo's own switch (experimental in PyTorch, off by
default): without it Dynamo leaves nn.LSTM/GRU/RNN to eager PyTorch (a graph break), so the compiled LSTM
row runs the LSTM eagerly; with it the LSTM is captured, decomposed per time step by AOTAutograd, and
replayed.

--kernels: small kernels of the host plugin (backend cpu: zero_, add, mul, copy_, a transposing copy
and sum of float32 vectors, 16 to 1M elements; add and relu of channels-last (1, 16, 1, n/16) tensors:
add_cl, relu_cl; the 3x3 windows of a 4-channel image laid out as rows, as the convolution decomposition's
im2col does: copy_win; --kernel-ops chooses) called directly through cffi (no dispatch: the
kernel's own cost), beside the same native PyTorch op, with one OpenMP thread and with two; with
--old, the same kernels of another build of libfl_cpu.so loaded beside this tree's (an A/B in one
process). Per call in microseconds, medians of --rounds rounds, the variants in a rotated order."""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
import warnings
from collections.abc import Callable

import torch
from torch import nn

import torch_fl as fl

COLUMNS = ("native", "inductor", "eager", "compiled", "aot", "noreplay", "dynamo")
MODELS = ("mlp", "bert", "conv", "lstm")
BACKENDS = ("cpu", "rocm", "ascend", "minimal")
TITLES = {
    "mlp": "MLP 64-256-256-10 b4",
    "bert": "BERT 2 layers h32 b2 s8",
    "conv": "conv net 2x(conv+bn+relu) b2 16x16",
    "lstm": "LSTM 2 layers h64 b4 s16",
}


class _LSTMNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(32, 64, num_layers=2, batch_first=True)
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def _ce(out, batch):
    return nn.functional.cross_entropy(out, batch["y"])


def _hf_loss(out, batch):
    return out.loss


def make(name: str) -> tuple[str, nn.Module, dict, Callable]:
    """(title, model on the CPU, batch of CPU tensors: model kwargs, plus "y" for the loss, loss function)."""
    torch.manual_seed(0)
    if name == "mlp":
        m = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))
        return "MLP 64-256-256-10 b4", m, {"x": torch.randn(4, 64), "y": torch.randint(0, 10, (4,))}, _ce
    if name == "conv":
        m = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 16, 3, stride=2),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(16, 10),
        )
        return (
            "conv net 2x(conv+bn+relu) b2 16x16",
            m,
            {"x": torch.randn(2, 3, 16, 16), "y": torch.randint(0, 10, (2,))},
            _ce,
        )
    if name == "lstm":
        return (
            "LSTM 2 layers h64 b4 s16",
            _LSTMNet(),
            {"x": torch.randn(4, 16, 32), "y": torch.randint(0, 10, (4,))},
            _ce,
        )
    if name == "bert":
        import transformers

        cfg = transformers.BertConfig(
            vocab_size=100,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=32,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            num_labels=2,
        )
        m = transformers.BertForSequenceClassification(cfg)
        batch = {
            "input_ids": torch.randint(0, 100, (2, 8)),
            "attention_mask": torch.ones(2, 8, dtype=torch.long),
            "labels": torch.randint(0, 2, (2,)),
        }
        return "BERT 2 layers h32 b2 s8", m, batch, _hf_loss
    raise ValueError(name)


def _call(model: nn.Module, batch: dict):
    if "x" in batch:
        return model(batch["x"])
    return model(**batch)


def stepper(
    model: nn.Module, params, batch: dict, loss_fn: Callable, sync: Callable[[], None], infer: bool = False
) -> Callable:
    """One SGD training step of `model` (possibly compiled) whose parameters are `params`; infer: one
    forward under torch.no_grad() instead (the model already in eval mode)."""
    inputs = {k: v for k, v in batch.items() if k not in ("y", "labels")}
    if infer:

        def call() -> None:
            with torch.no_grad():
                _call(model, inputs)
            sync()

        return call
    opt = torch.optim.SGD(list(params), lr=1e-3)
    inputs = {k: v for k, v in batch.items() if k != "y"}

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(_call(model, inputs), batch)
        loss.backward()
        opt.step()
        sync()

    return step


def _first_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


class Column:
    """One column of a row: its step function, or why it has none."""

    def __init__(self, name: str, build: Callable[[], Callable], warm: int) -> None:
        self.name, self.step, self.error, self.times = name, None, None, []
        try:
            step = build()
            for _ in range(warm):
                step()
            self.step = step
        except Exception as e:  # a failing column is reported, not fatal
            self.error = _first_line(e)

    def run(self, steps: int) -> None:
        if self.step is None:
            return
        try:
            t0 = time.perf_counter_ns()
            for _ in range(steps):
                self.step()
            self.times.append((time.perf_counter_ns() - t0) / steps / 1e3)
        except Exception as e:
            self.step, self.error = None, _first_line(e)

    @property
    def us(self) -> float | None:
        return statistics.median(self.times) if self.step is not None and self.times else None


def _to(batch: dict, dev) -> dict:
    return {k: v.to(dev) for k, v in batch.items()}


def native_columns(name: str, args: argparse.Namespace, infer: bool) -> dict[str, Callable]:
    """Builders of the native CPU columns of one model (shared by its rows, so inductor compiles once)."""
    _, model, batch, loss_fn = make(name)
    eager = _mode(copy.deepcopy(model), infer)
    builders: dict[str, Callable] = {
        "native": lambda: stepper(eager, eager.parameters(), batch, loss_fn, _nosync, infer)
    }
    if args.inductor_error is None:
        ind_model = _mode(copy.deepcopy(model), infer)
        compiled = torch.compile(ind_model)
        builders["inductor"] = lambda: stepper(compiled, ind_model.parameters(), batch, loss_fn, _nosync, infer)
    return builders


def _mode(m: nn.Module, infer: bool) -> nn.Module:
    return m.eval() if infer else m.train()


def _nosync() -> None:
    pass


def fl_columns(name: str, backend: str, infer: bool) -> dict[str, Callable]:
    """Builders of the fl columns of one model on one backend (the backend already selected)."""
    _, model, batch, loss_fn = make(name)
    dev = fl.device(backend)
    sync = torch.fl.synchronize
    fl_batch = _to(batch, dev)

    def eager():
        m = _mode(copy.deepcopy(model), infer).to(dev)
        return stepper(m, m.parameters(), fl_batch, loss_fn, sync, infer)

    def compiled():
        m = _mode(copy.deepcopy(model), infer).to(dev)
        c = torch.compile(m, backend="fl")
        compiled.compiled = c
        return stepper(c, m.parameters(), fl_batch, loss_fn, sync, infer)

    def aot():
        m = _mode(copy.deepcopy(model), infer).to(dev)
        c = torch.compile(m, backend="fl", options={"lean": False})
        return stepper(c, m.parameters(), fl_batch, loss_fn, sync, infer)

    def noreplay():
        m = _mode(copy.deepcopy(model), infer).to(dev)
        c = torch.compile(m, backend="fl", options={"replay": False})
        return stepper(c, m.parameters(), fl_batch, loss_fn, sync, infer)

    def dynamo():
        m = _mode(copy.deepcopy(model), infer).to(dev)
        return stepper(torch.compile(m, backend="eager"), m.parameters(), fl_batch, loss_fn, sync, infer)

    columns = {"eager": eager, "compiled": compiled, "noreplay": noreplay, "dynamo": dynamo}
    if not infer:  # inference graphs always run on AOTAutograd's runtime: that column would repeat "compiled"
        columns["aot"] = aot
    return columns


def replay_status(builder) -> str:
    c = getattr(builder, "compiled", None)
    if c is None:
        return ""
    try:
        status = [g.replay for g in fl.fusion_report(c).graphs if g.replay is not None]
    except Exception as e:
        return f"report failed: {_first_line(e)}"
    return "; ".join(str(s) for s in status) if status else "no replayable graph"


def runtime_status(builder) -> str:
    c = getattr(builder, "compiled", None)
    if c is None:
        return ""
    try:
        lines = sorted({g.runtime.describe() for g in fl.fusion_report(c).graphs if g.runtime is not None})
    except Exception as e:
        return f"report failed: {_first_line(e)}"
    return "; ".join(lines)


def measure_row(name: str, backend: str, native: dict[str, Callable], args: argparse.Namespace, infer: bool) -> dict:
    fl.set_backend(backend)
    builders = dict(native)
    fl_builders = fl_columns(name, backend, infer)
    builders.update(fl_builders)
    cols = [Column(c, builders[c], args.warmup) for c in COLUMNS if c in builders]
    for r in range(args.rounds):
        k = r % len(cols)
        for col in cols[k:] + cols[:k]:
            col.run(args.steps)
    out = {
        "model": name,
        "backend": backend,
        "us": {c.name: c.us for c in cols},
        "errors": {c.name: c.error for c in cols if c.error},
        "replay": replay_status(fl_builders["compiled"]),
        "runtime": runtime_status(fl_builders["compiled"]),
    }
    return out


def _ratio(a: float | None, b: float | None) -> str:
    return f"x{a / b:.2f}" if a is not None and b else "-"


def _cell(us: float | None) -> str:
    return f"{us:.0f}" if us is not None else "-"


def print_table(rows: list[dict], titles: dict[str, str], inductor: bool) -> None:
    aot = any("aot" in r["us"] for r in rows)
    head = ["model", "backend", "native us", "eager us", "compiled us"]
    head += ["aot-runtime us"] if aot else []
    head += ["no-replay us", "dynamo us"]
    if inductor:
        head.append("inductor us")
    head += ["eager/native", "compiled/eager", "compiled/native"]
    head += ["aot-runtime/eager"] if aot else []
    head += ["no-replay/eager", "dynamo/eager"]
    if inductor:
        head.append("inductor/native")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    last = None
    for r in rows:
        us = r["us"]
        cells = [
            titles[r["model"]] if r["model"] != last else "",
            r["backend"],
            _cell(us.get("native")),
            _cell(us.get("eager")),
            _cell(us.get("compiled")),
            *([_cell(us.get("aot"))] if aot else []),
            _cell(us.get("noreplay")),
            _cell(us.get("dynamo")),
        ]
        if inductor:
            cells.append(_cell(us.get("inductor")))
        cells += [
            _ratio(us.get("eager"), us.get("native")),
            _ratio(us.get("compiled"), us.get("eager")),
            _ratio(us.get("compiled"), us.get("native")),
            *([_ratio(us.get("aot"), us.get("eager"))] if aot else []),
            _ratio(us.get("noreplay"), us.get("eager")),
            _ratio(us.get("dynamo"), us.get("eager")),
        ]
        if inductor:
            cells.append(_ratio(us.get("inductor"), us.get("native")))
        print("| " + " | ".join(cells) + " |")
        last = r["model"]
    notes = [(r, c, e) for r in rows for c, e in r["errors"].items()]
    for r, c, e in notes:
        print(f"  {r['model']} {r['backend']} {c}: {e}")
    for r in rows:
        if r["replay"]:
            print(f"  {r['model']} {r['backend']} replay: {r['replay']}")
        if r.get("runtime"):
            print(f"  {r['model']} {r['backend']} runtime: {r['runtime']}")


def check_inductor() -> str | None:
    """None when inductor compiles and runs a small training step here, else why not (first line)."""
    try:
        m = nn.Linear(4, 2)
        c = torch.compile(m)
        c(torch.randn(3, 4)).sum().backward()
        return None
    except Exception as e:
        return _first_line(e)


def _plugin_kernels(path: str) -> dict:
    from torch_fl.runtime import ffi

    lib = ffi.dlopen(path)
    plugin = ffi.new("fl_plugin_t*")
    if lib.fl_plugin_init(plugin) != 0:
        raise RuntimeError(f"{path}: fl_plugin_init failed")
    n, e, kernels = ffi.new("int*"), ffi.new("fl_kernel_entry_t*"), {}
    plugin.kernel_count(n)
    for i in range(n[0]):
        plugin.kernel_get(i, e)
        kernels[ffi.string(e.op).decode()] = e.fn
    kernels["__keep"] = (lib, plugin)
    return kernels


def _kernel_case(op: str, n: int, builds: dict) -> tuple[dict, tuple]:
    """{variant: callable} for one kernel on float32 vectors of n elements: each build's kernel, native torch."""
    from torch_fl.runtime import ffi

    a, b, o, s = torch.randn(n), torch.randn(n), torch.empty(n), torch.empty(())
    # channels-last (1, 16, 1, n / 16): memory dense, but its logical row-major order has an inner stride of 16
    c = max(1, min(16, n))
    ac, bc = (torch.randn(1, c, 1, n // c).contiguous(memory_format=torch.channels_last) for _ in range(2))
    oc = torch.empty_like(ac)
    r = max(8, int(n**0.5))
    m, mt = torch.randn(r, n // r), torch.empty(n // r, r)
    # im2col: the 3x3 windows of a (1, 4, h, h) image as rows (1, oh, ow, 4, 3, 3), rows of 3 elements
    h = max(4, int((n / 4) ** 0.5))
    img = torch.randn(1, 4, h, h)
    win = img.as_strided((1, 4, h - 2, h - 2, 3, 3), (4 * h * h, h * h, h, 1, h, 1)).permute(0, 2, 3, 1, 4, 5)
    wo = torch.empty(win.shape)
    t0, t1, i1, no = ("tensor", 0), ("tensor", 1), ("int", 1), ("bool", False)
    name, ins, outs, args, native = {
        "zero_": ("aten::zero_", [a], [a], [t0], lambda: a.zero_()),
        "add": ("aten::add.Tensor", [a, b], [o], [t0, t1, i1], lambda: torch.add(a, b, out=o)),
        "mul": ("aten::mul.Tensor", [a, b], [o], [t0, t1], lambda: torch.mul(a, b, out=o)),
        "copy_": ("aten::copy_", [o, b], [o], [t0, t1, no], lambda: o.copy_(b)),
        "copy_T": ("aten::copy_", [mt, m.t()], [mt], [t0, t1, no], lambda: mt.copy_(m.t())),
        "sum": ("aten::sum", [a], [s], [t0, ("none",)], lambda: torch.sum(a, 0, out=s)),
        "add_cl": ("aten::add.Tensor", [ac, bc], [oc], [t0, t1, i1], lambda: torch.add(ac, bc, out=oc)),
        "relu_cl": ("aten::relu", [ac], [oc], [t0], lambda: torch.clamp_min(ac, 0, out=oc)),
        "copy_win": ("aten::copy_", [wo, win], [wo], [t0, t1, no], lambda: wo.copy_(win)),
    }[op]
    ci, co, ca = ffi.new("fl_tensor_t[]", len(ins)), ffi.new("fl_tensor_t[]", len(outs)), ffi.new("fl_arg_t[]", 4)
    for arr, ts in ((ci, ins), (co, outs)):
        for i, t in enumerate(ts):
            d = arr[i]
            d.data = ffi.cast("void*", t.untyped_storage().data_ptr())
            d.offset, d.dtype, d.ndim = t.storage_offset(), 0, t.dim()  # dtype 0: float32
            for k in range(t.dim()):
                d.sizes[k], d.strides[k] = t.size(k), t.stride(k)
    kinds = {"none": 0, "tensor": 1, "int": 3, "bool": 5}
    for i, (kind, *v) in enumerate(args):
        ca[i].kind = kinds[kind]
        if v:
            ca[i].i = int(v[0])
    variants = {"native": native}
    for label, kernels in builds.items():
        fn, ni, nn_, na = kernels[name], len(ins), len(outs), len(args)
        if fn(ffi.NULL, 0, ci, ni, co, nn_, ca, na) != 0:
            raise RuntimeError(f"{label} {name} failed")
        variants[label] = lambda fn=fn, ni=ni, nn_=nn_, na=na: fn(ffi.NULL, 0, ci, ni, co, nn_, ca, na)
    return variants, (a, b, o, s, m, mt, ac, bc, oc, img, win, wo, ci, co, ca)


def handoff_section(args: argparse.Namespace) -> None:
    """The smallest backward, (x * 2).sum().backward() of a 4-element leaf: on fl with autograd's device thread
    (PyTorch's default), on fl with the backward on the calling thread, and native; what the hand-off costs."""
    print(f"backward hand-off: (x * 2).sum().backward(), 4 elements; us per call, medians of {args.rounds} rounds")
    print("| backend | device thread us | calling thread us | native us | device / calling |")
    print("|---|---|---|---|---|")
    xc = torch.ones(4, requires_grad=True)
    for backend in args.backends:
        fl.set_backend(backend)
        x = torch.ones(4, device=fl.device(backend), requires_grad=True)

        def calls(t: torch.Tensor, threads: bool, n: int = 200) -> float:
            with torch.autograd.set_multithreading_enabled(threads):
                start = time.perf_counter_ns()
                for _ in range(n):
                    (t * 2).sum().backward()
                if t.device.type == "fl":
                    torch.fl.synchronize()
                return (time.perf_counter_ns() - start) / n / 1000

        times: dict[str, list[float]] = {"device": [], "calling": [], "native": []}
        calls(x, True, 20)
        calls(x, False, 20)
        for _ in range(args.rounds):
            times["device"].append(calls(x, True))
            times["calling"].append(calls(x, False))
            times["native"].append(calls(xc, True))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"| {backend} | {med['device']:.1f} | {med['calling']:.1f} | {med['native']:.1f} | "
            f"{_ratio(med['device'], med['calling'])} |"
        )


KERNEL_OPS = ("zero_", "add", "mul", "copy_", "copy_T", "sum", "add_cl", "relu_cl", "copy_win")


def kernels_section(args: argparse.Namespace) -> None:
    import glob

    here = glob.glob(os.path.join(os.path.dirname(fl.__file__), "runtime", "plugins", "libfl_cpu.so"))[0]
    builds = {"fl": _plugin_kernels(here)}
    if args.old:
        builds = {"old": _plugin_kernels(args.old), "new": builds["fl"]}
    sizes = [16, 256, 4096, 16384, 65536, 262144, 1 << 20]
    teams = (1, 2)
    print(
        f"host plugin kernels, called directly (cffi), float32; torch {torch.__version__}; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs); us per call, medians of "
        f"{args.rounds} rounds; t1/t2: OpenMP team size (torch.set_num_threads)"
    )
    labels = ["native", *builds]
    print("| op | n | " + " | ".join(f"t{t} {k}" for t in teams for k in labels) + " |")
    print("|" + "---|" * (2 + len(teams) * len(labels)))
    for op in args.kernel_ops:
        for n in sizes:
            variants, _keep = _kernel_case(op, n, builds)
            reps = max(5, min(200, 200 * 4096 // n))
            cells = []
            for t in teams:
                torch.set_num_threads(t)
                times: dict[str, list[float]] = {k: [] for k in labels}
                for k in labels:
                    variants[k]()
                for r in range(args.rounds):
                    for k in labels[r % len(labels) :] + labels[: r % len(labels)]:
                        t0 = time.perf_counter_ns()
                        for _ in range(reps):
                            variants[k]()
                        times[k].append((time.perf_counter_ns() - t0) / reps / 1e3)
                cells += [f"{statistics.median(times[k]):.2f}" for k in labels]
            print(f"| {op} | {n} | " + " | ".join(cells) + " |", flush=True)
    torch.set_num_threads(args.threads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--backends", nargs="+", default=list(BACKENDS))
    ap.add_argument("--quick", action="store_true", help="fewer rounds and steps: a smoke run")
    ap.add_argument("--rounds", type=int, help="rounds of alternating columns (default 15, --quick 5)")
    ap.add_argument("--steps", type=int, help="steps of each column per round (default 5, --quick 2)")
    ap.add_argument("--warmup", type=int, default=3, help="steps before timing (compilation, recording)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--no-inductor", action="store_true", help="skip native CPU under torch.compile")
    ap.add_argument("--mode", choices=("train", "infer", "both"), default="both", help="training steps, inference")
    ap.add_argument(
        "--caller-thread", action="store_true", help="backward on the calling thread, not autograd's device thread"
    )
    ap.add_argument("--allow-rnn", action="store_true", help="torch._dynamo.config.allow_rnn: Dynamo captures nn.LSTM")
    ap.add_argument("--handoff", action="store_true", help="the smallest backward, device thread vs calling thread")
    ap.add_argument("--kernels", action="store_true", help="the host plugin's cost per kernel instead")
    ap.add_argument("--old", help="with --kernels: another build's libfl_cpu.so, measured beside this tree's")
    ap.add_argument(
        "--kernel-ops",
        nargs="+",
        choices=KERNEL_OPS,
        default=list(KERNEL_OPS),
        help="with --kernels: which (add_cl, relu_cl: channels-last operands; copy_win: an im2col, 3x3 windows of "
        "a 4-channel image as rows, ~9x the size's elements)",
    )
    args = ap.parse_args()
    args.rounds = args.rounds or (5 if args.quick else 15)
    args.steps = args.steps or (2 if args.quick else 5)
    torch.set_num_threads(args.threads)
    if args.kernels:
        kernels_section(args)
        return
    if args.handoff:
        handoff_section(args)
        return
    if args.caller_thread:
        torch.autograd.set_multithreading_enabled(False)  # for this (the only) thread, until the process ends
    if args.allow_rnn:
        torch._dynamo.config.allow_rnn = True  # every compiled column, inductor's included
    # every column compiles the same forward code (one Dynamo cache entry per model instance): room for all
    for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    warnings.filterwarnings("ignore")
    args.inductor_error = "--no-inductor" if args.no_inductor else check_inductor()
    titles = {m: TITLES[m] for m in args.models}
    print(
        f"bench_small: torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs); "
        f"{args.rounds} rounds x {args.steps} steps per column, medians; us per step; backward on "
        f"{'the calling thread' if args.caller_thread else 'autograd device threads (PyTorch default)'}"
        f"{'; torch._dynamo.config.allow_rnn = True' if args.allow_rnn else ''}"
    )
    if args.inductor_error is not None:
        print(f"native inductor column skipped: {args.inductor_error}")
    t0 = time.perf_counter()
    modes = ["train", "infer"] if args.mode == "both" else [args.mode]
    tables = []
    for mode in modes:
        infer = mode == "infer"
        rows = []
        for name in args.models:
            # each model from an empty Dynamo cache: Dynamo keys compiled code on the forward's code object,
            # which every nn.Sequential shares, and compiles a code object it has seen with other input sizes
            # with symbolic sizes (its automatic dynamic shapes), so the conv net after the MLP would be dynamic
            torch._dynamo.reset()
            try:
                native = native_columns(name, args, infer)
            except Exception as e:  # e.g. transformers missing: the model's rows say why
                print(f"  {name}: {_first_line(e)}")
                continue
            for backend in args.backends:
                try:
                    rows.append(measure_row(name, backend, native, args, infer))
                except Exception as e:
                    rows.append(
                        {"model": name, "backend": backend, "us": {}, "errors": {"row": _first_line(e)}, "replay": ""}
                    )
                print(f"  done {mode} {name} {backend} ({time.perf_counter() - t0:.0f} s)", flush=True)
        tables.append((mode, rows))
    print(f"load average after {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {time.perf_counter() - t0:.0f} s")
    for mode, rows in tables:
        what = "SGD training step" if mode == "train" else "inference call (eval, no_grad)"
        print(f"\n{what}, us per step\n")
        print_table(rows, titles, args.inductor_error is None)


if __name__ == "__main__":
    main()
