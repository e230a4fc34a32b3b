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
    shell.run_cell_magic("fl_profile", "--fusion --backend ascend -o fus",
                         "with torch.no_grad():\n    y = compiled(x.to(fl.device('ascend')))\ny.shape")
    out = capsys.readouterr().out
    cmp = shell.user_ns["fus"]
    assert cmp.names == ("unfused", "fused") and cmp.b.kernels < cmp.a.kernels
    assert f"fusion on 'ascend': kernels {cmp.a.kernels} -> {cmp.b.kernels}" in out
    assert "compiled.fusion_report:" in out and "fl::conv_bn_relu" in out and "conv+bn" in out
    rows = {r["op"]: r for r in cmp.rows()}
    assert rows["fl::conv_bn_relu"]["calls"] == (0, 1)
    plotly = [d for d in shell.displayed if "application/vnd.plotly.v1+json" in d]
    assert len(plotly) == 2  # kernels per op, kernels per pattern
    assert fl.get_current_backend_name() == "cpu"  # restored
    with pytest.raises(UsageError, match="--fusion compares the cell with and without fusion"):
        shell.run_cell_magic("fl_profile", "--fusion --compare rocm", "1")


def test_fl_profile_fusion_says_when_nothing_is_compiled(shell, capsys):
    shell.run_cell("for k in [k for k, v in globals().items() if isinstance(v, fl.CompiledModel)]: del globals()[k]")
    shell.run_cell_magic("fl_profile", "--fusion --no-plot", "a = torch.randn(3, device='fl') + 1")
    assert "no fl.compile'd model in the namespace" in capsys.readouterr().out


def test_fusion_figures_are_views_of_the_report():
    from torch import nn

    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            return torch.relu(self.lin(x) + x) * 2

    torch.manual_seed(0)
    net = Residual()
    compiled = fl.compile(net.to(fl.device("rocm")))
    x = torch.randn(4, 8).to(fl.device("rocm"))
    empty = fusion_figure(compiled.fusion_report)
    assert [list(t.y) for t in empty.data] == [[], []]
    compiled.measure(x)
    report = compiled.fusion_report.latest()
    fig = fusion_figure(compiled.fusion_report)
    assert list(fig.data[0].x) == ["rocm (train)"]  # a fresh module is in training mode
    assert (fig.data[0].y[0], fig.data[1].y[0]) == (report.measurement.kernels_before,
                                                    report.measurement.kernels_after)
    per = fusion_patterns(compiled.fusion_report)
    assert list(per.data[0].y) == ["(model) [elementwise chain]"]
    assert (per.data[0].x[0], per.data[1].x[0]) == (3, 1)  # add, relu, mul -> one kernel
    assert fusion_figure(compiled.fusion_report).to_json() == fig.to_json()  # deterministic
