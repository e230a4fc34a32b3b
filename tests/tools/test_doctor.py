"""`torch-fl doctor`: what its numbers are (errors against float64, relative to the tensor's scale, beside
native CPU float32's own) and that it trains: optimizer steps, the loss going down (issue 13)."""

import subprocess
import sys

import pytest
import torch
from torch import nn

import torch_fl as fl
from torch_fl.tools import doctor

pytestmark = pytest.mark.slow  # training runs and subprocesses


def _case(loss_fn=nn.functional.cross_entropy) -> doctor.Case:
    g = torch.Generator().manual_seed(0)
    return doctor.Case(
        "MLP",
        lambda: nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.GELU(), nn.Linear(16, 3)),
        torch.randn(6, 8, generator=g),
        torch.tensor([0, 1, 2, 0, 1, 2]),
        loss_fn,
        steps=4,
        lr=0.05,
    )


def test_model_check_trains_and_judges_against_float64():
    ref = doctor.reference(_case())
    check = doctor.check_model(ref, fl.device("minimal"))
    assert check.ok, check.render()
    assert len(check.losses) == 4 and check.losses[-1] < check.losses[0]
    assert check.output_err < 1e-5 and check.grad_err < 1e-5 and check.native_grad_err < 1e-5  # well conditioned
    assert check.float64_losses == ref.float64.losses and check.native_losses == ref.native.losses
    text = check.render()
    assert "errors against a float64 CPU run, relative to the tensor's scale (fl | native CPU float32)" in text
    assert "training, 4 SGD steps on one batch, loss: fl " in text and text.rstrip().splitlines()[
        -1
    ].strip().startswith("OK")
    assert f"rule: {doctor.RULE}" in text and "max(1e-4, 2x native CPU's)" in text


def test_a_loss_curve_that_drifts_from_float64_is_said_even_when_the_verdict_is_ok():
    """The verdict does not judge the curve step by step (a small train-mode batch is chaotic), but a curve
    far further from float64's than native CPU's, or rising where native's does not, is said."""
    check = doctor.check_model(doctor.reference(_case()), fl.device("cpu"))
    assert check.ok and not check.notes, check.render()
    f64 = check.float64_losses
    check.losses = [f64[0], f64[0] + 1, f64[0] + 2, f64[3] * 1.57]  # rises at steps 2 and 3, then falls
    assert check.ok and len(check.notes) == 2, check.notes
    assert check.notes[0].startswith("the final loss is 57.0% from float64's (native CPU float32: 0.0%)")
    assert check.notes[1].startswith("the fl loss rose at step 2, 3 where native CPU's did not; ")
    text = check.render()
    assert "    note: the final loss is 57.0% from float64's" in text and text.splitlines()[-1].strip().startswith("OK")


def test_model_check_fails_when_the_loss_does_not_go_down():
    def rising(out, target, calls=[0]):  # noqa: B006 - a loss that grows with every call, whatever the steps do
        calls[0] += 1
        return (out * 0).sum() + calls[0]

    check = doctor.check_model(doctor.reference(_case(rising)), fl.device("rocm"))
    assert not check.ok and any("the loss did not go down" in p for p in check.problems)
    assert "MISMATCH: the loss did not go down" in check.render()


def test_grad_err_is_relative_to_the_gradients_scale():
    ref = {"a": torch.tensor([1e-9, 0.0]), "b": torch.tensor([3.0, 4.0])}
    noisy = {"a": torch.tensor([2e-9, 0.0]), "b": torch.tensor([3.0, 4.0])}  # 100% off on a near-zero gradient
    assert doctor.grad_err(noisy, ref) < 1e-9
    assert doctor.grad_err({"b": ref["b"]}, ref) == float("inf")  # a missing gradient fails
    assert abs(doctor.rel_err(torch.tensor([1.0, 2.1]), torch.tensor([1.0, 2.0])) - 0.05) < 1e-6


def test_doctor_command_says_what_it_measures():
    r = subprocess.run(
        [sys.executable, "-m", "torch_fl.cli", "doctor", "--backend", "cpu"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    for label in ("ResNet-50 (2, 3, 64, 64)", "TransformerEncoder (4, 32, 128)"):
        assert f"{label}, train mode; errors against a float64 CPU run, relative to the tensor's scale" in out
    assert out.count("training, 3 SGD steps on one batch, loss: fl ") == 2
    assert "doctor: all backends OK" in out
