"""The lean runtime against code we did not write: every module of PyTorch's ModuleInfo database
(torch.testing._internal.common_modules.module_db) with a float32 sample, in training mode, compiled with
backend "fl" twice, once on the lean runtime and once on AOTAutograd's (options={"lean": False}).

Three steps each (the first on AOTAutograd's runtime in both, since AOTAutograd compiles the backward at its
first use; the others lean where it applies), seeded alike (dropout draws the same masks): the outputs, the
parameters' and the inputs' gradients must be equal to the bit, since both run the same compiled graphs.
On cpu (the host plugin), ascend (an emulated chip's native kernels) and minimal (decompositions and JIT
kernels). Measured 2026-12-05: 112 modules equal on each, 107 of them with lean graphs (the recurrent modules,
GaussianNLLLoss and CTCLoss give Dynamo no graph), ~35-40 s a backend."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.utils._pytree as pytree

import torch_fl as fl

common_modules = pytest.importorskip("torch.testing._internal.common_modules")

pytestmark = [pytest.mark.usefixtures("fresh_dynamo"), pytest.mark.slow]  # 114 modules, ~35 s a backend

# modules whose ModuleInfo float32 sample fails in eager PyTorch on the CPU already
NOT_COMPILABLE = {
    # the sample passes _random_samples in float64 for a float32 input: fractional_max_pool refuses it
    "nn.FractionalMaxPool2d",
    "nn.FractionalMaxPool3d",
}
# a representative set that must run lean (each has a training graph whose metadata is simple)
MUST_BE_LEAN = {
    "nn.Linear",
    "nn.Conv2d",
    "nn.BatchNorm2d",
    "nn.LayerNorm",
    "nn.GroupNorm",
    "nn.Embedding",
    "nn.MultiheadAttention",
    "nn.TransformerEncoderLayer",
    "nn.Transformer",
    "nn.PReLU",
}


def _float32_infos() -> list:
    return [mi for mi in common_modules.module_db if torch.float32 in mi.dtypes]


def _clone(tree):
    def one(x):
        return x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x

    return pytree.tree_map(one, tree)


def _steps(module: torch.nn.Module, args, kwargs, lean: bool) -> tuple[list, list]:
    """Three seeded training steps of `module` compiled with backend "fl": per step the floating outputs,
    the parameters' and the inputs' gradients (on the CPU); and the report's runtime lines."""
    module = copy.deepcopy(module).to("fl")
    compiled = torch.compile(module, backend="fl", options={"lean": lean})
    steps = []
    for step in range(3):
        a, k = _clone(args), _clone(kwargs)
        torch.manual_seed(step)
        out = compiled(*a, **k)
        flat = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        terms = [(t.float() * (i + 1)).sum() for i, t in enumerate(flat) if t.requires_grad]
        for p in module.parameters():
            p.grad = None
        if terms:
            sum(terms).backward()
        leaves = [x for x in pytree.tree_leaves((a, k)) if isinstance(x, torch.Tensor)]
        steps.append(
            [t.detach().cpu() for t in flat]
            + [None if p.grad is None else p.grad.cpu() for p in module.parameters()]
            + [None if x.grad is None else x.grad.cpu() for x in leaves]
        )
    runtimes = [g.runtime.describe() for g in fl.fusion_report(compiled).graphs if g.runtime is not None]
    return steps, runtimes


@pytest.mark.parametrize("backend", ["cpu", "ascend", "minimal"])
@pytest.mark.parametrize("info", _float32_infos(), ids=lambda mi: mi.name)
def test_every_moduleinfo_module_trains_as_on_aotautograds_runtime(info, backend):
    if info.name in NOT_COMPILABLE:
        pytest.skip("its ModuleInfo float32 sample fails in eager PyTorch on the CPU (float64 _random_samples)")
    fl.set_backend(backend)
    samples = list(info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=True, training=True))
    if not samples:
        pytest.skip("no float32 training sample")
    sample = samples[0]
    torch.manual_seed(0)
    module = info.module_cls(*sample.constructor_input.args, **sample.constructor_input.kwargs).train()

    def to_fl(x):
        return x.detach().to("fl").requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x

    args = pytree.tree_map(to_fl, sample.forward_input.args)
    kwargs = pytree.tree_map(to_fl, sample.forward_input.kwargs)
    torch._dynamo.reset()
    lean, runtimes = _steps(module, args, kwargs, lean=True)
    torch._dynamo.reset()
    aot, _ = _steps(module, args, kwargs, lean=False)
    for step, (a, b) in enumerate(zip(lean, aot, strict=True)):
        assert len(a) == len(b), (step, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert (x is None) == (y is None), (step, i)
            if x is not None:
                assert x.shape == y.shape and torch.equal(torch.nan_to_num(x), torch.nan_to_num(y)), (step, i)
    if info.name in MUST_BE_LEAN:
        assert runtimes and all(r.startswith("lean") for r in runtimes), runtimes
