"""fl.watch / %fl_watch: a real training loop, watched step by step.

The figures come from the counters torch_fl keeps anyway (kernels, bytes copied, calls per path, the pool),
so they must agree with what a profile of the same step says, and the live view must redraw as steps end."""

import pytest
import torch

import torch_fl as fl


def _loop(watch, model, opt, steps: int, fallback_at: int | None = None):
    torch.manual_seed(0)
    x, y = torch.randn(32, 8, device="fl"), torch.randn(32, 2, device="fl")
    for i in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        watch(loss).backward()
        if i == fallback_at:  # minimal has no eigensolver: this op runs on the CPU fallback
            torch.linalg.eigvals(torch.randn(3, 3, device="fl"))
        opt.step()


def _model():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2)).to("fl")
    return m, torch.optim.SGD(m.parameters(), lr=0.1)


def test_watch_records_each_step_of_a_real_loop():
    fl.set_backend("minimal")
    model, opt = _model()
    with fl.watch(model, opt) as w:
        _loop(w, model, opt, 6, fallback_at=3)
    assert w.backend == "minimal" and [s.step for s in w.steps] == [1, 2, 3, 4, 5, 6]
    losses = [s.loss for s in w.steps]
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses  # SGD on a fixed batch
    # the same step's work every time: the same kernels, and no fallback except where the loop made one
    assert len({s.kernels for s in w.steps[1:3]}) == 1 and w.steps[1].kernels > 0
    assert [sum(s.fallback_ops.values()) for s in w.steps] == [0, 0, 0, 1, 0, 0]
    assert "aten::_linalg_eigvals" in w.steps[3].fallback_ops and w.steps[3].copied_bytes > 0
    assert w.steps[1].paths.get("decomposition", 0) > 0  # gelu decomposes on minimal
    assert all(s.allocated > 0 and s.peak >= s.allocated for s in w.steps)
    text = w.render()
    assert "fl.watch on minimal: 6 steps" in text and "on the CPU fallback" not in text.split("\n")[-1]
    # the hook is gone after the with block: more steps are not recorded
    _loop(w, model, opt, 1)
    assert len(w.steps) == 6


def test_watch_kernel_counts_agree_with_a_profile():
    fl.set_backend("rocm")
    model, opt = _model()
    w = fl.watch(model, opt)
    _loop(w, model, opt, 2)
    with fl.profile() as prof:
        _loop(w, model, opt, 1)
    w.close()
    assert w.steps[-1].kernels == prof.kernels, (w.steps[-1].kernels, prof.kernels)


def test_fl_watch_magic_shows_a_view_that_redraws(monkeypatch):
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()  # the one shell of the process (test_notebook_layer.py's too)
    shown = []
    monkeypatch.setattr("fl_magics.display", lambda obj, **kw: shown.append(obj))
    ip.run_line_magic("load_ext", "fl_magics")
    fl.set_backend("rocm")
    model, opt = _model()
    ip.user_ns.update(model=model, opt=opt)
    ip.run_line_magic("fl_watch", "model opt -o w")
    (view,) = shown
    assert "waiting for the first step" in view.head.value
    w = ip.user_ns["w"]
    _loop(w, model, opt, 3)
    assert "step 3, loss" in view.head.value and view.table.value.count("<tr><td>") == 3
    assert view.curve.value.startswith("<svg") and "polyline" in view.curve.value
    w.close()
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="not an nn.Module"):
        ip.run_line_magic("fl_watch", "opt")
