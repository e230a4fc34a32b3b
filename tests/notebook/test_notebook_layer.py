"""The notebook layer through a real IPython InteractiveShell: every magic,
its UsageError paths and what it displays; the capability explorer driven by
its widgets' values; figures built from torch_fl results."""

import json
import re

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import torch_fl as fl
from torch_fl.notebook import (
    CapabilityExplorer,
    alignment_layers,
    alignment_losses,
    comparison_kernels,
    fallback_paths,
    time_by_path,
)


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


def test_fl_backend_lists_switches_moves_and_refuses(shell, capsys):
    shell.run_line_magic("fl_backend", "")
    out = capsys.readouterr().out
    assert "current fl backend: cpu (fl:0)" in out and "rocm" in out and "bundled" in out
    shell.run_cell("m = torch.nn.Linear(3, 2)\nt = torch.ones(2)\nopt = torch.optim.Adam(m.parameters())")
    shell.run_cell("m(torch.ones(1, 3)).sum().backward(); opt.step()")
    shell.run_line_magic("fl_backend", "rocm --move m t opt --caps")
    out = capsys.readouterr().out
    assert "fl backend: rocm (fl:3); moved m, t, opt" in out
    ns = shell.user_ns
    assert fl.get_current_backend_name() == "rocm"
    assert ns["m"].weight.device == fl.device("rocm") and ns["t"].device == fl.device("rocm")
    assert all(v.device == fl.device("rocm") for s in ns["opt"].state.values() for v in s.values() if v.dim())
    assert any("text/plain" in d and "backend rocm  (EMULATED)" in d["text/plain"] for d in shell.displayed)
    with pytest.raises(UsageError, match="unknown fl backend 'nope'; choose one of: .*rocm"):
        shell.run_line_magic("fl_backend", "nope")
    with pytest.raises(UsageError, match="no variable named 'ghost'"):
        shell.run_line_magic("fl_backend", "cpu --move ghost")
    with pytest.raises(UsageError, match="only modules, tensors and optimizers move"):
        shell.run_cell("s = 'text'")
        shell.run_line_magic("fl_backend", "cpu --move s")


def test_fl_profile_cell_keeps_last_expression_and_stores_result(shell, capsys):
    shell.run_cell("x = torch.randn(8, 8, device='fl')")
    shell.displayed.clear()
    shell.run_cell_magic("fl_profile", "-o prof --top 5", "y = torch.tanh(x @ x)\ny.sum().item()")
    table = next(d for d in shell.displayed if "text/html" in d and "fl profile" in d["text/plain"])
    out = table["text/plain"]
    assert "fl profile cpu: " in out and "aten::mm" in out and "aten::tanh" in out
    assert "<td>aten::mm</td>" in table["text/html"]  # an HTML table in a notebook, text in a terminal
    prof = shell.user_ns["prof"]
    assert isinstance(prof, fl.Profile) and {s.op for s in prof.ops()} >= {"aten::mm", "aten::tanh"}
    plotly = [d for d in shell.displayed if "application/vnd.plotly.v1+json" in d]
    assert len(plotly) == 2  # time by path, fallback paths
    assert "Out" in shell.user_ns and shell.user_ns["Out"]  # the cell's last expression was displayed
    shell.run_cell_magic(
        "fl_profile",
        "--backend minimal --compare rocm -o cmp --no-plot",
        "a = torch.randn(4, 6, device='fl')\nb = torch.nn.functional.layer_norm(a, (6,)).cpu()",
    )
    cmp = shell.user_ns["cmp"]
    assert cmp.names == ("minimal", "rocm")
    rows = {r["op"]: r for r in cmp.rows()}
    assert rows["aten::native_layer_norm"]["path"] == ("decomposition", "native")
    assert fl.get_current_backend_name() == "cpu"  # restored
    # tensors and modules made in earlier cells move to each compared backend, and back
    shell.run_cell(
        "m = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.GELU()).to('fl')\ninp = torch.randn(3, 6, device='fl')"
    )
    shell.run_cell_magic("fl_profile", "--compare minimal -o cmp2 --no-plot", "m(inp).sum().backward()")
    rows = {r["op"]: r for r in shell.user_ns["cmp2"].rows()}
    assert rows["aten::gelu"]["path"] == ("native", "decomposition")
    assert shell.user_ns["inp"].device == shell.user_ns["m"][0].weight.device == fl.current_device()
    with pytest.raises(UsageError, match="unknown fl backend"):
        shell.run_cell_magic("fl_profile", "--compare nope", "1")


def test_fl_caps_and_fl_explain(shell, capsys):
    shell.displayed.clear()
    shell.run_line_magic("fl_caps", "ascend")
    assert any("application/vnd.jupyter.widget-view+json" in d for d in shell.displayed)
    # one row per backend: its path and why (it printed every tier's reason for each, ~20 lines per op)
    shell.displayed.clear()
    shell.run_line_magic("fl_explain", "aten::gelu")
    (table,) = shell.displayed
    rows = {line.split()[0]: line.split()[1] for line in table["text/plain"].splitlines()[2:]}
    assert rows["ascend"] == "decomposition" and rows["rocm"] == "native"
    assert "<td>ascend</td><td><b>decomposition</b></td><td>no native kernel for aten::gelu" in table["text/html"]
    assert len(table["text/plain"].splitlines()) == 2 + len(fl.available_backends())
    shell.run_line_magic("fl_explain", "fl::conv_bn_relu --dtype float32 --detail")
    assert "on backend 'ascend': native" in capsys.readouterr().out
    with pytest.raises(UsageError, match="unknown operator"):
        shell.run_line_magic("fl_explain", "not_an_op")
    with pytest.raises(UsageError, match="not a torch dtype"):
        shell.run_line_magic("fl_explain", "mm --dtype float99")
    with pytest.raises(UsageError, match="unknown fl backend"):
        shell.run_line_magic("fl_caps", "nope")


def test_fl_align(shell, capsys):
    shell.run_cell(
        "torch.manual_seed(0)\nnet = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), "
        "torch.nn.Linear(8, 2))\nxin = torch.randn(5, 4)\ntgt = torch.randn(5, 2)"
    )
    shell.displayed.clear()
    shell.run_line_magic("fl_align", "net xin tgt --backend rocm --steps 3 -o rep")
    out = capsys.readouterr().out
    assert "alignment of rocm against native CPU float32" in out and ": OK" in out
    assert shell.user_ns["rep"].verdict == "ok"
    assert sum("application/vnd.plotly.v1+json" in d for d in shell.displayed) == 2
    with pytest.raises(UsageError, match="not an nn.Module"):
        shell.run_line_magic("fl_align", "xin xin")
    with pytest.raises(UsageError, match="no variable named 'nothing'"):
        shell.run_line_magic("fl_align", "net nothing")
    with pytest.raises(UsageError, match="name the model and its inputs"):
        shell.run_line_magic("fl_align", "net")


def test_fl_align_cell_runs_the_cell_then_aligns_what_it_defined(shell, capsys):
    """%%fl_align: the cell builds the model and its inputs (a Conv -> BatchNorm model, which must align ok:
    its conv bias gradients are zero by construction), then the magic aligns them."""
    shell.run_cell_magic(
        "fl_align",
        "--backend minimal --steps 2 --no-plot -o cellrep",
        "torch.manual_seed(0)\n"
        "model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), "
        "torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 3))\n"
        "inputs = torch.randn(2, 3, 6, 6)\ntarget = torch.randn(2, 3)",
    )
    rep = shell.user_ns["cellrep"]
    assert rep.backend == "minimal" and rep.verdict == "ok", rep.render()
    assert "alignment of minimal against native CPU float32" in capsys.readouterr().out
    assert isinstance(shell.user_ns["model"], torch.nn.Module)  # the cell ran in the user's namespace
    shell.run_cell_magic(
        "fl_align",
        "m2 x2 --backend rocm --steps 0 --no-plot -o rep2",
        "m2 = torch.nn.Linear(3, 2)\nx2 = torch.randn(4, 3)",
    )
    assert shell.user_ns["rep2"].training is None and shell.user_ns["rep2"].verdict == "ok"


def test_magics_have_help():
    from fl_magics import FlMagics

    for name in ("fl_backend", "fl_profile", "fl_caps", "fl_explain", "fl_align"):
        doc = getattr(FlMagics, name).__doc__
        assert doc and f"%{name}" in doc and ("options:" in doc or "positional arguments" in doc), name


def test_capability_explorer_reacts_to_its_widgets():
    e = CapabilityExplorer("rocm")
    assert "rocm</b> (EMULATED)" in e.summary.value and "304" in e.devices.value
    assert "aten::_scaled_dot_product_fused_attention_overrideable" in e.fused.value
    e.search.value = "layer_norm_backward"
    assert "aten::native_layer_norm_backward" in e.ops.value and "aten::mm<" not in e.ops.value
    e.backend.value = "minimal"
    assert "minimal</b>" in e.summary.value and "no fused kernels" in e.fused.value
    assert "<td>aten::native_layer_norm_backward</td><td>D</td>" in e.ops.value
    e.search.value = ""
    e.path.value = "fallback"
    assert "aten::_adaptive_avg_pool2d_backward<" in e.ops.value and "aten::add.Tensor<" not in e.ops.value
    e.compare_with.value = "rocm"
    assert "take a different float32 path on minimal and rocm" in e.comparison.value
    assert "<td>aten::_adaptive_avg_pool2d_backward</td><td>F</td><td>N</td>" in e.comparison.value


def test_coverage_data_matches_explain():
    cov = fl.path_table("ascend", ops=["aten::gelu", "aten::mm", "fl::conv_bn_relu"])
    assert cov.rows["aten::gelu"]["float32"] == "decomposition"
    assert cov.rows["aten::mm"]["float32"] == "native" and cov.rows["aten::mm"]["float64"] == "fallback"
    assert cov.rows["fl::conv_bn_relu"]["float32"] == "native"
    assert json.loads(cov.to_json())["counts"]["native"] >= 2
    # a dtype the device does not compute in runs on the CPU whatever the op: never D (its parts fall back)
    mini = fl.path_table("minimal", ops=["aten::gelu", "aten::mm"])
    assert mini.host_dtypes == ("float64", "float16")
    assert mini.rows["aten::gelu"]["float64"] == "fallback" and mini.rows["aten::gelu"]["float32"] == "decomposition"
    assert "the device has no float64, float16: F throughout" in mini.render()


def test_the_grid_marks_what_pytorch_itself_does_not_define():
    """A convolution of bools, abs of bools, bitwise ops on floats: the CPU has no kernel, so no path on any
    backend is claimed for them (they were D or F); what PyTorch defines keeps its plan."""
    ops = [
        "aten::convolution",
        "aten::convolution_backward",
        "aten::abs",
        "aten::add.Tensor",
        "aten::bitwise_and.Tensor",
    ]
    for backend in ("cpu", "minimal"):
        rows = fl.path_table(backend, ops=ops).rows
        assert rows["aten::convolution"]["bool"] == "undefined" and rows["aten::abs"]["bool"] == "undefined"
        assert rows["aten::convolution_backward"]["bool"] == "undefined"
        assert rows["aten::bitwise_and.Tensor"]["float32"] == "undefined"
        assert rows["aten::add.Tensor"]["bool"] != "undefined" and rows["aten::abs"]["int64"] != "undefined"
        assert rows["aten::convolution"]["float32"] in ("native", "decomposition")
    for op, dtype in (("convolution", torch.bool), ("abs", torch.bool)):  # the CPU really refuses them
        with pytest.raises(RuntimeError, match="not implemented"):
            if op == "abs":
                torch.abs(torch.ones(2, dtype=dtype))
            else:
                torch.nn.functional.conv1d(torch.ones(1, 1, 3, dtype=dtype), torch.ones(1, 1, 2, dtype=dtype))
    cov = fl.path_table("minimal", ops=ops)
    assert ". not defined by PyTorch for the dtype" in cov.render()


def test_figures_are_deterministic_and_built_from_results():
    x = torch.randn(6, 6, device="fl")
    with fl.profile() as prof:
        torch.tanh(x @ x).cumsum(0)
    f1, f2 = fallback_paths(prof), fallback_paths(prof)
    assert f1.to_json() == f2.to_json()
    labels = f1.data[0].labels
    assert "native" in labels and any(lbl.startswith("aten::mm") for lbl in labels)
    assert set(time_by_path(prof).data[0].x) == set(prof.time_by_path())
    cmp = fl.compare_backends(lambda: torch.nn.functional.gelu(torch.randn(3, device="fl")).cpu(), "rocm", "ascend")
    bars = comparison_kernels(cmp)
    assert [b.name for b in bars.data] == ["rocm", "ascend"]
    torch.manual_seed(0)
    rep = fl.align(torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh()), torch.randn(4, 3), steps=2, amp=False)
    layers = alignment_layers(rep)
    assert list(layers.data[0].x) == ["0 (Linear)", "1 (Tanh)"]
    losses = alignment_losses(rep)
    assert [t.name for t in losses.data][2:] == ["cpu error vs float64", "native CPU float32 error vs float64"]
    assert all(v >= 1e-9 for t in losses.data[2:] for v in t.y)  # no zeros to break the log line
    assert losses.layout.yaxis2.exponentformat == "power"  # 1e-7, not "100n"


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_fl_backend_validates_every_argument_before_switching(shell):
    """Issue 13: `--move nosuchvar` raised a UsageError but had switched the backend already."""
    shell.run_cell("s = 'text'")
    for line in ("minimal --move nosuchvar", "minimal --move s"):
        with pytest.raises(UsageError):
            shell.run_line_magic("fl_backend", line)
        assert fl.get_current_backend_name() == "cpu"


@pytest.mark.parametrize(
    "magic, line, message",
    [
        ("fl_backend", '"unterminated', "cannot parse the arguments"),
        ("fl_explain", "add", r"aten::add needs an overload name: aten::add\.Tensor"),
        ("fl_explain", "aten::add.Tensor --dtype float99", "'float99' is not a torch dtype"),
    ],
)
def test_bad_lines_are_usage_errors(shell, magic, line, message):
    """Issue 15: an unterminated quote (ValueError) and an op without its overload (RuntimeError) were raw
    tracebacks."""
    with pytest.raises(UsageError, match=message):
        shell.run_line_magic(magic, line)


@pytest.mark.parametrize("name", ["__builtins__", "1bad", "class", "print", "__name__", "a-b"])
def test_profile_output_must_be_a_plain_identifier(shell, name):
    """Issue 15: `-o __builtins__` broke every later cell; `-o 1bad` was accepted."""
    with pytest.raises(UsageError, match="-o"):
        shell.run_cell_magic("fl_profile", f"-o {name} --no-plot", "x = 1")
    with pytest.raises(UsageError, match="-o"):
        shell.run_line_magic("fl_align", f"net xin -o {name}")
    assert shell.run_cell("y = len([1, 2])").success and shell.user_ns["y"] == 2


def test_exception_in_profiled_cell_stops_the_notebook_and_shows_the_users_line(shell, capsys):
    """Issues 13 and 15: the error was swallowed (error_in_exec None, so nbval carried on), its traceback ran
    through torch_fl's internals and named the wrong cell."""
    shell.run_cell("fl.set_backend('ascend'); fl.set_cpu_fallback(False)")
    capsys.readouterr()
    try:
        result = shell.run_cell(
            "%%fl_profile -o partial --no-plot\n"
            "x = torch.ones(3, device='fl')\n"
            "y = torch.randn(3, dtype=torch.float64, device='fl')\n",
            store_history=True,
        )
    finally:
        fl.set_cpu_fallback(True)
    assert isinstance(result.error_in_exec, NotImplementedError)
    tb = ANSI.sub("", capsys.readouterr().out)
    lines = [ln for ln in tb.splitlines() if ln.strip() and not set(ln) <= {"-"}]
    assert lines[1] == f"Cell In[{result.execution_count}], line 2", tb  # the user's cell, its own number
    assert "----> 2 y = torch.randn(3, dtype=torch.float64, device='fl')" in tb
    assert "run_cell_magic" not in tb and "__torch_dispatch__" not in tb and "skipping hidden" in tb
    assert {s.op for s in shell.user_ns["partial"].ops()} >= {"aten::fill_.Scalar"}  # recorded before re-raising
    assert fl.get_current_backend_name() == "ascend"  # the backend the cell ran on stays current
    result = shell.run_cell("%%fl_profile --no-plot --compare minimal\n1 / 0", store_history=True)
    assert isinstance(result.error_in_exec, ZeroDivisionError)


def test_magic_defaults_are_set_with_config(shell, capsys):
    """`%config FlMagics.top = N` changes %%fl_profile's default table length; --top still wins."""
    shell.run_cell("x = torch.randn(4, 4, device='fl')")
    cell = "y = ((x + 1) * 2 - 3).exp().tanh().abs().sqrt()"  # seven ops

    def table_rows(line):
        shell.displayed.clear()
        shell.run_cell_magic("fl_profile", line, cell)
        text, page = shell.displayed[0]["text/plain"], shell.displayed[0]["text/html"]
        rows = sum(1 for ln in text.splitlines() if ln.startswith("aten::"))
        assert page.count("<tr><td>aten::") == rows  # the notebook's HTML table has the same rows
        return rows

    assert table_rows("--no-plot") == 7  # within the default of 15
    try:
        shell.run_line_magic("config", "FlMagics.top = 3")
        assert table_rows("--no-plot") == 3
        assert table_rows("--no-plot --top 5") == 5
        shell.run_line_magic("config", "FlMagics.top = -1")  # %config logs traitlets' refusal
        assert table_rows("--no-plot") == 3  # and the setting stays as it was
        shell.run_line_magic("config", "FlMagics.steps = 2")
        shell.run_cell("net = torch.nn.Linear(3, 2)\nxin = torch.randn(4, 3)")
        shell.run_line_magic("fl_align", "net xin --backend rocm --no-plot -o rep")
        assert shell.user_ns["rep"].training.steps == 2
    finally:
        shell.run_line_magic("config", "FlMagics.top = 15")
        shell.run_line_magic("config", "FlMagics.steps = 20")
    assert table_rows("--no-plot --top 4") == 4
    shell.run_line_magic("config", "FlMagics")
    assert "FlMagics.top=<Int>" in capsys.readouterr().out  # listed with its help, like IPython's own options


def _profile():
    x = torch.randn(3, 3, device="fl")
    with fl.profile(label="t") as prof:
        torch.tanh(x @ x)
    return prof


def _check_report():
    from torch_fl.tools.checker import CheckReport, CheckRow

    return CheckReport("lib<x>.so", [CheckRow("load", "PASS", "a < b")])


def _op_coverage_report():
    from torch_fl.tools.coverage import CoverageReport, OpResult

    return CoverageReport("rocm", "float32", True, [OpResult("mm", "pass", "pass", "pass")])


def _zoo_report():
    from torch_fl.tools.zoo import ZooReport

    return ZooReport([], ["rocm"])


def _model_check():
    from torch_fl.tools.doctor import ModelCheck

    return ModelCheck("m", (1,), 1, 0.0, 0.0, 0.0, 0.0, [1.0], [1.0], [1.0], True, 0.0, 0.0)


# one of every report type torch_fl returns, each made as cheaply as it can be
def _measurement():
    from torch_fl.compile import Measurement

    return Measurement("rocm", "forward", 10, 4, 1e-3, 5e-4)


REPORTS = {
    "BackendReport": fl.list_backends,
    "CapabilityTable": lambda: fl.capabilities("rocm"),
    "Explanation": lambda: fl.explain("mm"),
    "ExplanationTable": lambda: fl.explain_all("mm"),
    "Profile": _profile,
    "Comparison": lambda: _profile().compare(_profile(), ("a", "b")),
    "AlignmentReport": lambda: fl.align(torch.nn.Linear(3, 2), torch.randn(2, 3), steps=0, amp=False),
    "PathTable": lambda: fl.path_table("minimal", ops=["aten::mm"]),
    "CheckReport": _check_report,
    "CoverageReport": _op_coverage_report,
    "ZooReport": _zoo_report,
    "ModelCheck": _model_check,
    "DoctorReport": lambda: __import__("torch_fl.tools.doctor").tools.doctor.DoctorReport({"rocm": [_model_check()]}),
    "FusionReport": lambda: fl.fusion_report(torch.nn.Linear(2, 2)),
    "Measurement": _measurement,
    "Watch": lambda: fl.watch(),
}


def test_every_report_type_shares_one_rendering_hook():
    """Every torch_fl class with a render() is a Report (text, HTML, _repr_mimebundle_ from one place), and
    REPORTS below has one of each."""
    import importlib
    import inspect
    import pkgutil

    from torch_fl.rendering import Report

    pending: set = set()
    found = {}
    for info in pkgutil.walk_packages(fl.__path__, "torch_fl."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            qual = f"{cls.__module__}.{cls.__qualname__}"
            if cls.__module__ == info.name and "render" in vars(cls) and cls is not Report and qual not in pending:
                found[qual] = cls
    assert not [q for q, cls in found.items() if not issubclass(cls, Report)]
    assert sorted(q.rsplit(".", 1)[1] for q in found) == sorted(REPORTS)


@pytest.mark.parametrize("kind", sorted(REPORTS))
def test_report_bundle_honours_include_and_exclude(shell, kind):
    report = REPORTS[kind]()
    assert type(report).__name__ == kind
    full = report._repr_mimebundle_()
    assert set(full) == {"text/plain", "text/html"}
    assert full["text/plain"] == str(report) == report.render() and full["text/html"] == report.html()
    assert report._repr_mimebundle_(include=["text/plain"]) == {"text/plain": full["text/plain"]}
    assert report._repr_mimebundle_(exclude=["text/plain"]) == {"text/html": full["text/html"]}
    assert report._repr_mimebundle_(include=["text/html"], exclude=["text/html"]) == {}
    # through IPython's formatter, as a notebook front end asks
    data, _ = shell.display_formatter.format(report, include={"text/html"})
    assert data == {"text/html": full["text/html"]}
    data, _ = shell.display_formatter.format(report, exclude={"text/html"})
    assert data == {"text/plain": full["text/plain"]}


def test_report_html_escapes_the_text():
    html = _check_report().html()
    assert "lib&lt;x&gt;.so" in html and "a &lt; b" in html and "<x>" not in html


def test_report_renders_only_the_formats_asked_for():
    from torch_fl.rendering import Report

    class Fixed(Report):
        def render(self):
            return "a < b"

        def html(self):
            raise AssertionError("HTML was not asked for")

    assert Fixed()._repr_mimebundle_(include={"text/plain"}) == {"text/plain": "a < b"}
    assert Report.html(Fixed()) == "<pre>a &lt; b</pre>"
    with pytest.raises(NotImplementedError, match="must define render"):
        str(type("Bare", (Report,), {})())


def test_magic_misuse_is_a_usage_error(shell):
    """%fl_align with inputs that are not tensors ended in a raw TypeError deep in the alignment; a negative
    --top was accepted."""
    from IPython.core.error import UsageError

    shell.run_cell("from torch import nn\nm = nn.Linear(3, 2)\ns = 'not a tensor'\nx = torch.randn(4, 3)")
    with pytest.raises(UsageError, match="'s' is a str, not the model's input"):
        shell.run_line_magic("fl_align", "m s")
    with pytest.raises(UsageError, match="'s' is a str, not a target tensor"):
        shell.run_line_magic("fl_align", "m x s")
    with pytest.raises(UsageError, match="--steps -1"):
        shell.run_line_magic("fl_align", "m x --steps -1")
    with pytest.raises(UsageError, match="--top -3"):
        shell.run_cell_magic("fl_profile", "--top -3", "1")


@pytest.mark.slow  # a subprocess
def test_without_ipython_the_import_names_the_extra_to_install():
    """After the README's plain install (no jupyter extra), `import fl_magics` says what to install."""
    from conftest import run_py

    r = run_py("""
        import sys
        sys.modules["IPython"] = None  # as if IPython were not installed
        try:
            import fl_magics
        except ModuleNotFoundError as e:
            print("ERR", e)
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ERR fl_magics needs IPython" in r.stdout and "pip install 'torch_fl[jupyter]'" in r.stdout, r.stdout
    # and, torch_fl being installed already, the extra's packages alone: no second build of torch_fl's wheel
    from importlib.metadata import requires

    from fl_magics import JUPYTER_PACKAGES

    extra = sorted(r.split(";")[0].replace(" ", "") for r in requires("torch_fl") if 'extra == "jupyter"' in r)
    assert sorted(JUPYTER_PACKAGES) == extra, extra
    assert "pip install " + " ".join(repr(p) for p in JUPYTER_PACKAGES) in r.stdout, r.stdout
