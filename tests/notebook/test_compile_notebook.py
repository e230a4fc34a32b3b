"""The fusion results in the notebook layer: `%%fl_profile --fusion` through a
real IPython InteractiveShell, and the before/after figures."""

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import torch_fl as fl
from torch_fl.notebook.figures import fusion_figure, fusion_patterns


@pytest.fixture
def shell(capsys):
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "fl_magics")
    displayed = []
    ip.display_pub.publish = lambda data, metadata=None, **kw: displayed.append(data)
    ip.displayed = displayed
    ip.run_cell("import torch, torch_fl as fl")
    yield ip
    fl.set_backend("cpu")


SETUP = """
from torch import nn
torch.manual_seed(0)
net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8)).eval()
x = torch.randn(2, 3, 12, 12)
compiled = fl.compile(net.to(fl.device('ascend')))
"""


def test_fl_profile_fusion_runs_the_cell_unfused_then_fused(shell, capsys):
    shell.run_cell(SETUP)
    shell.displayed.clear()
    shell.run_cell_magic(
        "fl_profile",
        "--fusion --backend ascend -o fus",
        "with torch.no_grad():\n    y = compiled(x.to(fl.device('ascend')))\ny.shape",
    )
    out = capsys.readouterr().out
    cmp = shell.user_ns["fus"]
    assert cmp.b.kernels < cmp.a.kernels
    assert cmp.names == ("eager", "compiled")
    assert f"fusion on 'ascend': kernels {cmp.a.kernels} -> {cmp.b.kernels}" in out
    assert "fl.fusion_report(compiled):" in out and "fl::conv_bn_relu" in out and "conv+bn" in out
    rows = {r["op"]: r for r in cmp.rows()}
    assert rows["fl::conv_bn_relu"]["calls"] == (0, 1)
    plotly = [d for d in shell.displayed if "application/vnd.plotly.v1+json" in d]
    assert len(plotly) == 2  # kernels per op, kernels per pattern
    assert fl.get_current_backend_name() == "cpu"  # restored
    with pytest.raises(UsageError, match="--fusion compares the cell with and without fusion"):
        shell.run_cell_magic("fl_profile", "--fusion --compare rocm", "1")


def test_fl_profile_fusion_says_when_nothing_is_compiled(shell, capsys):
    shell.run_cell(
        "for k in [k for k, v in globals().items() if isinstance(v, torch._dynamo.eval_frame."
        "OptimizedModule)]: del globals()[k]"
    )
    shell.run_cell_magic("fl_profile", "--fusion --no-plot", "a = torch.randn(3, device='fl') + 1")
    assert "no compiled model in the namespace" in capsys.readouterr().out


def test_fusion_figures_are_views_of_the_report():
    from torch import nn

    from torch_fl.compile import dynamo

    dynamo.reset()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.LayerNorm(8))
    fl.set_backend("rocm")
    compiled = fl.compile(net.to("fl"))
    x = torch.randn(4, 8, device="fl")
    empty = fusion_figure(fl.fusion_report(compiled))
    assert [list(t.y) for t in empty.data] == [[], []]
    m = fl.measure_compiled(compiled, x)  # a fresh module is in training mode: forward + backward
    report = fl.fusion_report(compiled)
    fig = fusion_figure(report)
    assert list(fig.data[0].x) == ["rocm (forward+backward)"]
    assert (fig.data[0].y[0], fig.data[1].y[0]) == (m.kernels_before, m.kernels_after)
    per = fusion_patterns(report)
    counts = {t.name: dict(zip(t.y, t.x, strict=True)) for t in per.data}
    assert counts["captured"]["linear+relu"] == 1  # rewritten on Dynamo's graph
    assert counts["forward"]["linear+act"] == 1 and counts["backward"]["linear+act backward"] == 1
    assert fusion_figure(fl.fusion_report(compiled)).to_json() == fig.to_json()  # deterministic
    fl.set_backend("cpu")
    dynamo.reset()
