"""fl_magics' views in a real browser (issue 26): JupyterLab started by the test, driven by headless
Chromium through Playwright, runs a notebook generated here and checks what the page shows -- the
capability explorer widget answering its dropdown and search box, the HTML table of `%%fl_profile
--compare`, and `%fl_watch`'s live view after a training loop. tests/notebook/test_notebook_layer.py tests the
same views by their values in a bare IPython shell; this test checks that they render and respond in a
browser. Screenshots of each stage go to $FL_TEST_ARTIFACTS/browser (else pytest's tmp_path).

Needs the system's Chromium (apt-get install chromium) and Playwright for Python (pip install playwright,
never `playwright install`); without them it skips, saying what to install."""

import os
import re
import sys
import time

import pytest
from browser.lab import JupyterLab, NotebookPage, find_chromium, missing, write_notebook

pytestmark = pytest.mark.slow  # JupyterLab and Chromium

CELLS = [
    "%load_ext fl_magics\nimport torch, torch_fl as fl\n%fl_backend rocm\nimport sys\nprint('kernel:', sys.executable)",
    "%fl_caps minimal",
    "m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).to('fl')",
    "%%fl_profile --compare minimal --no-plot --top 50\nm(torch.randn(4, 8, device='fl')).sum().backward()",
    "torch.manual_seed(0)\nmodel = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))"
    ".to('fl')\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "x, y = torch.randn(32, 8, device='fl'), torch.randn(32, 1, device='fl')",
    "%fl_watch model opt",
    "for _ in range(5):\n    opt.zero_grad()\n    watch(torch.nn.functional.mse_loss(model(x), y)).backward()\n"
    "    opt.step()",
]
CAPS, PROFILE, WATCH, LOOP = 1, 3, 5, 6
TIMEOUT_S = 90  # per wait: a loaded two-core machine starts the lab, the kernel and torch slowly


@pytest.fixture
def artifacts(tmp_path):
    root = os.environ.get("FL_TEST_ARTIFACTS")
    out = os.path.join(root, "browser") if root else str(tmp_path / "browser")
    os.makedirs(out, exist_ok=True)
    return out


def test_views_render_and_respond_in_jupyterlab(tmp_path, artifacts):
    why = missing()
    if why:
        pytest.skip(f"the browser test needs Chromium and Playwright for Python: {why}")
    from playwright.sync_api import sync_playwright

    t0 = time.monotonic()

    def tick(what: str) -> None:
        print(f"[test_browser] {time.monotonic() - t0:6.1f} s  {what}", flush=True)

    shots: list[str] = []

    def shot(name: str, target) -> None:
        path = os.path.join(artifacts, f"{len(shots) + 1:02d}_{name}.png")
        target.screenshot(path=path)
        shots.append(path)

    root, home = tmp_path / "root", tmp_path / "home"
    root.mkdir()
    home.mkdir()
    write_notebook(str(root / "views.ipynb"), CELLS)
    log = os.path.join(artifacts, "jupyterlab.log")
    with JupyterLab(str(home), str(root), log) as lab, sync_playwright() as pw:
        tick(f"jupyter lab up on port {lab.port} (log: {log})")
        browser = pw.chromium.launch(
            executable_path=find_chromium(),
            headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page_errors: list[str] = []
        page.on("pageerror", lambda e: page_errors.append(str(e)))
        nb = NotebookPage(page, TIMEOUT_S)
        try:
            nb.open(lab.url("lab/tree/views.ipynb"))
            tick("notebook open, kernel idle")

            # 1. the extension loads in the venv's kernel
            out = nb.run(0)
            assert "fl backend: rocm" in out and f"kernel: {sys.executable}" in out, out
            shot("notebook_loaded", page)
            tick("cell 1: %load_ext fl_magics, import torch_fl")

            # 2. the capability explorer: a real widget, not its text repr
            nb.run(CAPS)
            caps = nb.output(CAPS)
            backend = (
                caps.locator(".widget-dropdown").filter(has=page.get_by_text("backend", exact=True)).locator("select")
            )
            nb.poll(
                "the capability explorer widget to render (ipywidgets' JupyterLab extension)",
                lambda: backend.count() == 1 and "Loading widget" not in caps.inner_text(),
                lambda: caps.inner_text()[:1000],
            )
            summary = caps.locator(".widget-html-content").first
            on_minimal = summary.inner_text()
            assert on_minimal.startswith("minimal (EMULATED)") and "native kernels" in on_minimal, on_minimal
            caps.locator(".lm-TabBar-tab", has_text="op paths").click()
            ops = caps.locator(".widget-tab .widget-html-content:visible", has_text=" ops; N native")
            first_column = ops.locator("table.flx tr td:first-child")
            nb.poll("the op-coverage table", lambda: first_column.count() > 10, lambda: caps.inner_text()[:2000])
            assert all(re.match(r"(aten|fl)::\w", n) for n in first_column.all_inner_texts()), ops.inner_text()[:2000]
            shot("caps_minimal", nb.cell(CAPS))
            tick("cell 2: %fl_caps minimal rendered")

            backend.select_option("rocm")
            nb.poll(
                "the summary to show rocm",
                lambda: summary.inner_text().startswith("rocm (EMULATED)"),
                summary.inner_text,
            )
            on_rocm = summary.inner_text()
            assert (
                "native kernels" in on_rocm
                and on_rocm.split("native kernels")[0] != on_minimal.split("native kernels")[0]
            ), (on_minimal, on_rocm)
            shot("caps_rocm", nb.cell(CAPS))
            search = caps.locator(".widget-text input")
            search.click()
            search.press_sequentially("layer_norm", delay=30)

            def only_layer_norm():
                names = first_column.all_inner_texts()
                return names if names and all("layer_norm" in n for n in names) else None

            names = nb.poll(
                "the ops table to list only ops matching 'layer_norm'", only_layer_norm, lambda: ops.inner_text()[:2000]
            )
            assert "aten::native_layer_norm" in names, names
            assert ops.inner_text().startswith(f"{len(names)} of "), ops.inner_text()[:200]
            shot("caps_rocm_search", nb.cell(CAPS))
            tick(f"explorer: backend -> rocm, search -> {len(names)} layer_norm ops")

            # 3. %%fl_profile --compare: an HTML table, both backends in its header, gelu's paths
            nb.run(2)
            nb.run(PROFILE)
            table = nb.output(PROFILE).locator(".jp-RenderedHTMLCommon table")
            assert table.count() == 1, nb.output(PROFILE).inner_text()
            head = table.locator("tr").first.locator("th").all_inner_texts()
            assert "path rocm" in head and "path minimal" in head, head
            gelu = table.locator("tr").filter(has=page.locator("td:first-child", has_text=re.compile(r"^aten::gelu$")))
            assert gelu.count() == 1, table.inner_text()
            row = dict(zip(head, gelu.locator("td").all_inner_texts(), strict=True))
            assert row["path minimal"] == "decomposition" and row["path rocm"] == "native", row
            shot("profile_compare", nb.cell(PROFILE))
            tick("cell 4: %%fl_profile --compare minimal: table checked")

            # 4. %fl_watch's live view follows the loop
            nb.run(4)
            nb.run(WATCH)
            view = nb.output(WATCH)
            nb.poll(
                "the watch view to render", lambda: "waiting for the first step" in view.inner_text(), view.inner_text
            )
            nb.run(LOOP)
            nb.poll(
                "the watch view to show step 5", lambda: re.search(r"\bstep 5\b", view.inner_text()), view.inner_text
            )
            assert view.locator("svg polyline").count() == 1, view.inner_html()[:2000]
            assert "fl.watch on rocm" in view.inner_text(), view.inner_text()
            shot("watch", nb.cell(WATCH))
            tick("cells 6-7: %fl_watch view at step 5 with its loss line")
        except BaseException:
            try:
                page.screenshot(path=os.path.join(artifacts, "failure.png"))
            except Exception as e:  # the browser itself may be gone: the test's own error matters
                print(f"[test_browser] no failure screenshot: {e}")
            print(
                f"[test_browser] failure screenshot and server log in {artifacts}; errors in the page: "
                f"{page_errors or 'none'}"
            )
            raise
        finally:
            browser.close()
    tick("lab and browser closed")

    # 5. the screenshots are there for a reader
    assert len(shots) == 6
    for path in shots:
        assert os.path.isfile(path) and os.path.getsize(path) > 0, (
            f"screenshot {path} missing or empty (artifacts folder: {artifacts})"
        )
    tick(f"done; screenshots in {artifacts}")
