"""Long runs show their steps as they end (issue 26): lines in a terminal, a bar that moves in a notebook.

The reporter sees every step of the real run (its count and what ended), the terminal gets one line per
step, and a real Jupyter kernel that loaded the notebook layer gets an ipywidgets bar whose value moves
with the steps, not a wall of lines."""

import queue

import pytest
import torch
from torch import nn

import torch_fl as fl
from torch_fl import progress
from torch_fl.tools import doctor


class Recorder:
    def __init__(self):
        self.steps, self.closed = [], False

    def update(self, done, text, failed=False):
        self.steps.append((done, text, failed))

    def close(self):
        self.closed = True


def test_a_coverage_run_reports_each_op_as_it_ends():
    rec = Recorder()
    report = fl.coverage("cpu", "abs,neg", progress=rec)
    assert [r.op for r in report.results] == ["abs", "neg"]
    assert [(d, t) for d, t, _ in rec.steps] == [(1, "abs: pass"), (2, "neg: pass")] and rec.closed


def test_a_terminal_gets_one_line_per_step_and_false_is_silent(capsys):
    fl.coverage("cpu", "abs,neg")
    err = capsys.readouterr().err.splitlines()
    assert "[1/2] coverage on cpu: abs: pass" in err and "[2/2] coverage on cpu: neg: pass" in err, err
    fl.coverage("cpu", "abs,neg", progress=False)
    assert not capsys.readouterr().err.strip()


def test_the_doctor_as_a_call_reports_references_then_each_backend():
    g = torch.Generator().manual_seed(0)
    case = doctor.Case(
        "MLP",
        lambda: nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 3)),
        torch.randn(6, 8, generator=g),
        torch.tensor([0, 1, 2, 0, 1, 2]),
        nn.functional.cross_entropy,
        steps=3,
        lr=0.05,
    )
    rec = Recorder()
    before = fl.get_current_backend_name()
    report = doctor.run_doctor(["cpu", "minimal"], progress=rec, cases=[case])
    assert report.ok and list(report.checks) == ["cpu", "minimal"], report.render()
    assert [d for d, _, _ in rec.steps] == [1, 2, 3] and rec.closed
    assert rec.steps[0][1].startswith("MLP: CPU float64") and rec.steps[2][1].startswith("MLP on minimal: OK")
    assert report.render().splitlines()[-1] == "doctor: all backends OK"
    assert fl.get_current_backend_name() == before  # the run leaves the current backend as it found it


def test_a_failed_step_is_marked_and_the_reporter_closed_on_error():
    rec = Recorder()
    with pytest.raises(Exception):  # noqa: B017 - any error: what matters is that the view is closed
        fl.coverage("cpu", "abs", progress=rec, state_file="/nonexistent-dir/state.jsonl")
    assert rec.closed


def _kernel_run(code: str) -> tuple[list, str]:
    """Run code in a real ipykernel; the widget states it sent and its stdout."""
    jupyter_client = pytest.importorskip("jupyter_client")
    pytest.importorskip("ipywidgets")
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="python3")
    try:
        msg_id = kc.execute(code)
        states, stdout = [], ""
        while True:
            try:
                msg = kc.get_iopub_msg(timeout=240)
            except queue.Empty:
                raise AssertionError("the kernel did not finish the cell") from None
            kind, content = msg["msg_type"], msg["content"]
            if kind in ("comm_open", "comm_msg"):
                states.append(content.get("data", {}).get("state", {}))
            elif kind == "stream" and content["name"] == "stdout":
                stdout += content["text"]
            elif kind == "error":
                raise AssertionError("\n".join(content["traceback"]))
            elif (
                kind == "status"
                and content["execution_state"] == "idle"
                and msg["parent_header"].get("msg_id") == msg_id
            ):
                return states, stdout
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


@pytest.mark.slow  # a Jupyter kernel
def test_a_notebook_gets_a_bar_that_moves_with_the_steps():
    states, stdout = _kernel_run(
        "import torch_fl.notebook\nimport torch_fl as fl\n"
        "r = fl.coverage('cpu', 'abs,neg,sin')\nprint('ops', len(r.results))"
    )
    bars = [s for s in states if s.get("_model_name") == "IntProgressModel"]
    assert bars and bars[0]["max"] == 3, states
    values = [s["value"] for s in states if "value" in s and isinstance(s["value"], int)]
    assert values[-3:] == [1, 2, 3], values
    assert any(s.get("bar_style") == "success" for s in states)
    labels = [s["value"] for s in states if isinstance(s.get("value"), str)]
    assert any("[3/3]" in v and "sin: pass" in v for v in labels), labels
    assert "ops 3" in stdout and "[1/3]" not in stdout  # the bar, not lines


@pytest.mark.slow  # a Jupyter kernel
def test_a_kernel_without_the_notebook_layer_gets_lines_on_stdout():
    _, stdout = _kernel_run("import torch_fl as fl\nr = fl.coverage('cpu', 'abs')")
    assert "[1/1] coverage on cpu: abs: pass" in stdout, stdout


def test_lines_outside_a_kernel_and_the_registered_bar_only_inside_one():
    made = []
    progress.register_bar(lambda title, total: made.append(title) or progress.Silent())
    try:
        assert isinstance(progress.start("x", 1), progress.Lines) and not made  # pytest is no kernel
    finally:
        from torch_fl.notebook import ProgressBar

        progress.register_bar(ProgressBar)  # the real bar again
