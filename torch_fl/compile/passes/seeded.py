"""fl:: ops for training dropout inside a fused kernel, with a fresh seed per call.

The fused kernels (fl::linear_act, fl::add_layer_norm, fl::linear_add_layer_norm,
torch_fl/fused/epilogues.py) take their dropout mask from a seed argument. A seed written
into a compiled graph would drop the same units every step; these ops draw the
seed when they run (PyTorch's CPU generator: reproducible under
torch.manual_seed) and return it as a CPU int64 scalar, which AOTAutograd saves
for the backward op, where the kernel regenerates the same mask. They are tagged
nondeterministic_seeded, so the partitioner never recomputes them.

  fl::linear_act_dropout             F.linear -> ReLU / GELU -> dropout
  fl::add_layer_norm_dropout         LayerNorm(residual + dropout(x))
  fl::linear_add_layer_norm_dropout  LayerNorm(residual + dropout(F.linear(x)))

each with a `_backward` op computing every gradient in the base op's one
backward kernel. The rewrites that call them are the linear_act and add_norm
passes (passes/linear_act.py, passes/add_norm.py)."""

from __future__ import annotations

import torch

from ...dispatch import autocast_kernel
from ...runtime import not_traced

_lib = torch.library.Library("fl", "FRAGMENT")
_SEEDED = (torch.Tag.nondeterministic_seeded,)


def _draw() -> int:
    return int(torch.randint(0, 2**62, (), dtype=torch.int64))


def _seed_tensor(seed: int) -> torch.Tensor:
    return torch.tensor(seed, dtype=torch.int64)


def _fake_seed() -> torch.Tensor:
    return torch.empty((), dtype=torch.int64, device="cpu")


def _keep(ctx, saved: tuple, cfg: tuple, *non_differentiable: torch.Tensor) -> None:
    """What each forward keeps for its backward; no zero-filled gradients for the saved outputs."""
    ctx.save_for_backward(*saved)
    ctx.cfg = cfg
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(*non_differentiable)


def _stats(like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    shape = like.shape[:-1] + (1,)
    return like.new_empty(shape), like.new_empty(shape)


# -- F.linear -> activation -> dropout --------------------------------------------------

_lib.define(
    "linear_act_dropout(Tensor input, Tensor weight, Tensor? bias, int act, float p, bool save) "
    "-> (Tensor, Tensor, Tensor)",
    tags=_SEEDED,
)
_lib.define(
    "linear_act_dropout_backward(Tensor grad, Tensor input, Tensor weight, Tensor out, Tensor pre, int act, "
    "float p, Tensor seed, bool has_bias) -> (Tensor, Tensor, Tensor)"
)


def linear_act_dropout_impl(input, weight, bias, act: int, p: float, save: bool):
    seed = _draw()
    out, pre = torch.ops.fl.linear_act.default(input, weight, bias, act, p, seed, save)
    return out, pre, _seed_tensor(seed)


def linear_act_dropout_backward_impl(grad, input, weight, out, pre, act: int, p: float, seed, has_bias: bool):
    return torch.ops.fl.linear_act_backward.default(grad, input, weight, out, pre, act, p, int(seed), has_bias)


@torch.library.register_fake("fl::linear_act_dropout", lib=_lib)
def _linear_act_dropout_fake(input, weight, bias, act, p, save):
    out = input.new_empty(input.shape[:-1] + (weight.shape[0],))
    pre = torch.empty_like(out) if save else input.new_empty(0)
    return out, pre, _fake_seed()


@torch.library.register_fake("fl::linear_act_dropout_backward", lib=_lib)
def _linear_act_dropout_backward_fake(grad, input, weight, out, pre, act, p, seed, has_bias):
    return (
        input.new_empty(input.shape),
        weight.new_empty(weight.shape),
        weight.new_empty((weight.shape[0],) if has_bias else (0,)),
    )


class LinearActDropoutFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, act, p, save):
        with torch._C._AutoDispatchBelowAutograd():
            out, pre, seed = torch.ops.fl.linear_act_dropout.default(input, weight, bias, act, p, save)
        _keep(ctx, (input, weight, out, pre, seed), (act, p, bias is not None), pre, seed)
        return out, pre, seed

    @staticmethod
    def backward(ctx, grad, *_):
        if grad is None:
            return (None,) * 6
        input, weight, out, pre, seed = ctx.saved_tensors
        act, p, has_bias = ctx.cfg
        gi, gw, gb = torch.ops.fl.linear_act_dropout_backward.default(
            grad, input, weight, out, pre, act, p, seed, has_bias
        )
        return gi, gw, gb if has_bias else None, None, None, None


# -- LayerNorm(residual + dropout(x)) -----------------------------------------------------

_lib.define(
    "add_layer_norm_dropout(Tensor input, Tensor residual, Tensor? weight, Tensor? bias, float eps, float p) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    tags=_SEEDED,
)
_lib.define(
    "add_layer_norm_dropout_backward(Tensor grad, Tensor sum, Tensor mean, Tensor rstd, Tensor? weight, "
    "bool has_bias, float p, Tensor seed) -> (Tensor, Tensor, Tensor, Tensor)"
)


def add_layer_norm_dropout_impl(input, residual, weight, bias, eps: float, p: float):
    seed = _draw()
    out, z, mean, rstd = torch.ops.fl.add_layer_norm.default(input, residual, weight, bias, eps, p, seed, True)
    return out, z, mean, rstd, _seed_tensor(seed)


def add_layer_norm_dropout_backward_impl(grad, sum, mean, rstd, weight, has_bias: bool, p: float, seed):  # noqa: A002
    return torch.ops.fl.add_layer_norm_backward.default(grad, sum, mean, rstd, weight, has_bias, p, int(seed))


@torch.library.register_fake("fl::add_layer_norm_dropout", lib=_lib)
def _add_layer_norm_dropout_fake(input, residual, weight, bias, eps, p):
    return (residual.new_empty(residual.shape), residual.new_empty(residual.shape), *_stats(residual), _fake_seed())


@torch.library.register_fake("fl::add_layer_norm_dropout_backward", lib=_lib)
def _add_layer_norm_dropout_backward_fake(grad, sum, mean, rstd, weight, has_bias, p, seed):  # noqa: A002
    n = sum.shape[-1]
    return (
        grad.new_empty(sum.shape),
        grad.new_empty(sum.shape),
        grad.new_empty((n,) if weight is not None else (0,)),
        grad.new_empty((n,) if has_bias else (0,)),
    )


class AddLayerNormDropoutFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, residual, weight, bias, eps, p):
        with torch._C._AutoDispatchBelowAutograd():
            out, z, mean, rstd, seed = torch.ops.fl.add_layer_norm_dropout.default(
                input, residual, weight, bias, eps, p
            )
        _keep(ctx, (z, mean, rstd, weight, seed), (p, bias is not None), z, mean, rstd, seed)
        return out, z, mean, rstd, seed

    @staticmethod
    def backward(ctx, grad, *_):
        if grad is None:
            return (None,) * 6
        z, mean, rstd, weight, seed = ctx.saved_tensors
        p, has_bias = ctx.cfg
        gx, gr, gw, gb = torch.ops.fl.add_layer_norm_dropout_backward.default(
            grad, z, mean, rstd, weight, has_bias, p, seed
        )
        return gx, gr, gw if weight is not None else None, gb if has_bias else None, None, None


# -- LayerNorm(residual + dropout(F.linear(x))) -------------------------------------------

_lib.define(
    "linear_add_layer_norm_dropout(Tensor input, Tensor weight, Tensor? bias, Tensor residual, "
    "Tensor? ln_weight, Tensor? ln_bias, float eps, float p) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    tags=_SEEDED,
)
_lib.define(
    "linear_add_layer_norm_dropout_backward(Tensor grad, Tensor input, Tensor weight, Tensor sum, "
    "Tensor mean, Tensor rstd, Tensor? ln_weight, bool has_bias, bool has_ln_bias, float p, Tensor seed) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"
)


def linear_add_layer_norm_dropout_impl(input, weight, bias, residual, ln_weight, ln_bias, eps: float, p: float):
    seed = _draw()
    out, z, mean, rstd = torch.ops.fl.linear_add_layer_norm.default(
        input, weight, bias, residual, ln_weight, ln_bias, eps, p, seed, True
    )
    return out, z, mean, rstd, _seed_tensor(seed)


def linear_add_layer_norm_dropout_backward_impl(
    grad,
    input,
    weight,
    sum,
    mean,
    rstd,
    ln_weight,  # noqa: A002
    has_bias: bool,
    has_ln_bias: bool,
    p: float,
    seed,
):
    return torch.ops.fl.linear_add_layer_norm_backward.default(
        grad, input, weight, sum, mean, rstd, ln_weight, has_bias, has_ln_bias, p, int(seed)
    )


@torch.library.register_fake("fl::linear_add_layer_norm_dropout", lib=_lib)
def _linear_add_layer_norm_dropout_fake(input, weight, bias, residual, ln_weight, ln_bias, eps, p):
    return (residual.new_empty(residual.shape), residual.new_empty(residual.shape), *_stats(residual), _fake_seed())


@torch.library.register_fake("fl::linear_add_layer_norm_dropout_backward", lib=_lib)
def _linear_add_layer_norm_dropout_backward_fake(
    grad,
    input,
    weight,
    sum,
    mean,
    rstd,
    ln_weight,  # noqa: A002
    has_bias,
    has_ln_bias,
    p,
    seed,
):
    n, h = weight.shape[0], sum.shape[-1]
    return (
        input.new_empty(input.shape),
        weight.new_empty(weight.shape),
        weight.new_empty((n,) if has_bias else (0,)),
        grad.new_empty(sum.shape),
        grad.new_empty((h,) if ln_weight is not None else (0,)),
        grad.new_empty((h,) if has_ln_bias else (0,)),
    )


class LinearAddLayerNormDropoutFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, residual, ln_weight, ln_bias, eps, p):
        with torch._C._AutoDispatchBelowAutograd():
            out, z, mean, rstd, seed = torch.ops.fl.linear_add_layer_norm_dropout.default(
                input, weight, bias, residual, ln_weight, ln_bias, eps, p
            )
        _keep(
            ctx,
            (input, weight, z, mean, rstd, ln_weight, seed),
            (p, bias is not None, ln_bias is not None),
            z,
            mean,
            rstd,
            seed,
        )
        return out, z, mean, rstd, seed

    @staticmethod
    def backward(ctx, grad, *_):
        if grad is None:
            return (None,) * 8
        input, weight, z, mean, rstd, ln_weight, seed = ctx.saved_tensors
        p, has_bias, has_ln_bias = ctx.cfg
        gi, gw, gb, gr, glw, glb = torch.ops.fl.linear_add_layer_norm_dropout_backward.default(
            grad, input, weight, z, mean, rstd, ln_weight, has_bias, has_ln_bias, p, seed
        )
        return (
            gi,
            gw,
            gb if has_bias else None,
            gr,
            glw if ln_weight is not None else None,
            glb if has_ln_bias else None,
            None,
            None,
        )


for _name, _fwd, _bwd, _fn in (
    ("linear_act_dropout", linear_act_dropout_impl, linear_act_dropout_backward_impl, LinearActDropoutFn),
    (
        "add_layer_norm_dropout",
        add_layer_norm_dropout_impl,
        add_layer_norm_dropout_backward_impl,
        AddLayerNormDropoutFn,
    ),
    (
        "linear_add_layer_norm_dropout",
        linear_add_layer_norm_dropout_impl,
        linear_add_layer_norm_dropout_backward_impl,
        LinearAddLayerNormDropoutFn,
    ),
):
    _lib.impl(_name, _fwd, "CompositeExplicitAutograd")
    _lib.impl(_name + "_backward", _bwd, "CompositeExplicitAutograd")
    _lib.impl(_name, _fn.apply, "Autograd")
    # autocast casts as for the ops fused: the GEMM + activation in the autocast dtype, a LayerNorm in float32
    _lib.impl(
        _name,
        not_traced(
            autocast_kernel(getattr(torch.ops.fl, _name).default, "lower" if _name == "linear_act_dropout" else "fp32")
        ),
        "AutocastPrivateUse1",
    )
