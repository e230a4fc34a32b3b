"""Writes the notebooks from the cells below and executes them in place (outputs
and widget state stored), so the committed notebooks are exactly what a run
gives. `pytest --nbval` (the README's test command) re-runs them and compares.

    python notebooks/build.py            # all
    python notebooks/build.py 04         # the ones whose name starts with 04

Conventions: every cell's printed output is deterministic (seeded, no
timings), except cells marked `# NBVAL_IGNORE_OUTPUT` (timings, widgets,
figures built from timings); the cell after such a cell asserts a
deterministic fact about its result."""

from __future__ import annotations

import os
import sys

import nbformat
from nbconvert.preprocessors import ExecutePreprocessor

HERE = os.path.dirname(os.path.abspath(__file__))
IGNORE = "# NBVAL_IGNORE_OUTPUT\n"
SETUP = ("import torch, torch_fl as fl\n"
         "import plotly.io as pio\n"
         "pio.renderers.default = 'plotly_mimetype'  # deterministic figure output for nbval\n"
         "torch.manual_seed(0)\n"
         "%load_ext fl_magics")

NOTEBOOKS = {
    "01_quickstart": [
        ("md", "# Quickstart: unchanged PyTorch on an `fl` device\n\nThe article's verification script (section "
               "4.2): pick a backend, run a matmul, then train ResNet-50 and a Transformer encoder unchanged and "
               "compare with native CPU PyTorch. Sizes are small here so the notebook runs in CI; `torch-fl doctor "
               "--full` uses the article's sizes."),
        ("code", SETUP),
        ("code", "fl.initialize(backend_name='auto')\n"
                 "x = torch.randn(64, 128, 128).to(fl.current_device())\n"
                 "y = torch.randn(64, 128, 128, device='fl')\n"
                 "z = x @ y\n"
                 "print(z.device, fl.get_current_backend_name(), torch.accelerator.current_accelerator())\n"
                 "print('matches CPU:', torch.allclose(z.cpu(), x.cpu() @ y.cpu(), rtol=1e-4, atol=1e-3))"),
        ("code", "print(fl.list_backends().render())"),
        ("md", "## ResNet-50: forward, backward, an SGD step\n\nThe test suite defines its own ResNet-50 "
               "(`torch_fl.models`), since torchvision cannot be installed beside the CPU wheel here; "
               "`torchvision.models.resnet50()` works the same way."),
        ("code", "import copy\nfrom torch_fl.models import resnet50, transformer_encoder\n"
                 "torch.manual_seed(0)\n"
                 "model = resnet50(num_classes=10)\n"
                 "images, labels = torch.randn(4, 3, 64, 64), torch.tensor([1, 3, 5, 7])\n"
                 "dev_model = copy.deepcopy(model).to('fl')\n"
                 "opt = torch.optim.SGD(dev_model.parameters(), lr=0.01, momentum=0.9)\n"
                 "out = dev_model(images.to('fl'))\n"
                 "loss = torch.nn.functional.cross_entropy(out, labels.to('fl'))\n"
                 "loss.backward(); opt.step()\n"
                 "ref = model(images)\n"
                 "err = (out.detach().cpu() - ref.detach()).abs().max() / ref.abs().max()\n"
                 "print('output on', out.device, '| relative error vs CPU below 1e-4:', bool(err < 1e-4))\n"
                 "print('gradients on device:', all(p.grad.device.type == 'fl' for p in dev_model.parameters()))"),
        ("md", "## Transformer encoder (6 layers in the article; 2 here) with AdamW"),
        ("code", "torch.manual_seed(0)\n"
                 "enc = transformer_encoder(d_model=64, nhead=8, num_layers=2, dropout=0.0, dim_feedforward=128)\n"
                 "seq = torch.randn(4, 16, 64)\n"
                 "dev_enc = copy.deepcopy(enc).to('fl')\n"
                 "opt = torch.optim.AdamW(dev_enc.parameters(), lr=1e-3)\n"
                 "for step in range(3):\n"
                 "    opt.zero_grad()\n"
                 "    loss = dev_enc(seq.to('fl')).pow(2).mean()\n"
                 "    loss.backward(); opt.step()\n"
                 "print('state_dict round trip:', torch.equal(dev_enc.state_dict()['layers.0.linear1.weight'].cpu(),\n"
                 "      copy.deepcopy(dev_enc).cpu().state_dict()['layers.0.linear1.weight']))"),
        ("code", "print(fl.explain('aten::native_layer_norm'))"),
    ],
    "02_switching_backends": [
        ("md", "# Switching backends live\n\nSeveral backends are loaded at once; `%fl_backend` (or "
               "`fl.set_backend`) changes where new tensors go. Existing tensors stay valid on their own "
               "backend, and `--move` takes named models, tensors and optimizers along."),
        ("code", SETUP),
        ("code", "%fl_backend"),
        ("code", "a = torch.arange(6.0, device='fl')          # on the current backend (cpu)\n"
                 "model = torch.nn.Linear(6, 2)\n"
                 "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                 "%fl_backend rocm --move model\n"
                 "b = torch.arange(6.0, device='fl')          # on rocm\n"
                 "print(a.device, b.device, model.weight.device)"),
        ("code", "print((a * 2).cpu(), '(still computed by', a.device, ')')\n"
                 "try:\n    a + b\nexcept RuntimeError as e:\n    print('mixing backends:', str(e).split('!')[0])\n"
                 "print((a.to(b.device) + b).cpu())"),
        ("code", "%fl_backend ascend --caps"),
        ("code", "%fl_backend nope"),
        ("code", "%fl_backend cpu\nprint(fl.get_current_backend_name())"),
    ],
    "03_capability_explorer": [
        ("md", "# The capability explorer\n\nEvery backend's capability table is probed from its plugin at "
               "start-up. `%fl_caps` opens an explorer over it (devices, op coverage per dtype, fused kernels, "
               "collectives, and a comparison of two backends); the same data is `fl.capabilities(name)` and "
               "`fl.coverage(name)`."),
        ("code", SETUP),
        ("code", IGNORE + "%fl_caps rocm"),
        ("code", "from torch_fl.notebook import CapabilityExplorer\n"
                 "explorer = CapabilityExplorer('minimal')\n"
                 "explorer.search.value = 'conv'\n"
                 "print('convolution on minimal: decomposition (im2col + bmm)' if "
                 "'<td>aten::convolution</td><td>D</td>' in explorer.ops.value else 'unexpected')"),
        ("code", "print(fl.capabilities('ascend').render())"),
        ("code", "cov = fl.coverage('minimal')\nprint(cov.counts())\nprint(cov.render('layer_norm'))"),
        ("code", "for name in ['cpu', 'rocm', 'ascend', 'minimal']:\n"
                 "    caps = fl.capabilities(name)\n"
                 "    print(f\"{name:8} kernels {len(caps.kernels):4}  autocast {caps.amp_dtype:9} fused "
                 "{caps.fused_kernels}  collectives {caps.collectives_path}\")"),
    ],
    "04_profiling_and_fallbacks": [
        ("md", "# Profiling and fallback paths\n\n`%%fl_profile` runs a cell under `fl.profile()`: per op the "
               "calls, time, path (native / decomposition / JIT / CPU fallback), kernel launches and bytes "
               "copied. Timings vary from run to run, so their cells are not compared by the notebook check; "
               "the cell after each asserts what does not vary."),
        ("code", SETUP),
        ("code", "from torch_fl.models import transformer_encoder\n"
                 "enc = transformer_encoder(d_model=32, nhead=4, num_layers=1, dropout=0.0, dim_feedforward=64)\n"
                 "seq = torch.randn(2, 8, 32)"),
        ("code", "%fl_backend minimal --move enc"),
        ("code", "%%fl_profile -o prof --top 12\n" + IGNORE + "enc(seq.to('fl')).sum().backward()"),
        ("code", "calls = {s.op: s for s in prof.ops() if s.calls}\n"
                 "print('layer norm on the minimal chip:', calls['aten::native_layer_norm'].path)\n"
                 "print('its kernel launches:', calls['aten::native_layer_norm'].kernels)\n"
                 "print('ops that fell back:', sorted(s.op for s in prof.fallbacks()))"),
        ("code", "%fl_backend rocm --move enc"),
        ("code", "%%fl_profile --compare minimal -o cmp --top 10\n" + IGNORE
                 + "enc.to(fl.current_device())(seq.to(fl.current_device())).sum().backward()"),
        ("code", "rows = {r['op']: r for r in cmp.rows()}\n"
                 "print('kernels rocm vs minimal:', cmp.a.kernels, 'vs', cmp.b.kernels)\n"
                 "print('layer norm paths:', rows['aten::native_layer_norm']['path'])"),
        ("code", "prof.export_chrome_trace('trace.json')\nimport json, os\n"
                 "print(len(json.load(open('trace.json'))['traceEvents']) == len(prof.events))\n"
                 "os.remove('trace.json')"),
    ],
    "05_precision_alignment": [
        ("md", "# Precision alignment and mixed precision\n\n`%fl_align model inputs target` compares a model "
               "on a backend with native CPU float32: every module's output, every gradient, the same under "
               "the backend's autocast dtype, and a short training run. Verdicts: ok <= 1e-3, suspect > 1e-2 "
               "(the article's guidance)."),
        ("code", SETUP),
        ("code", "torch.manual_seed(0)\n"
                 "net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),\n"
                 "                          torch.nn.Linear(32, 4))\n"
                 "xin, tgt = torch.randn(8, 16), torch.randn(8, 4)"),
        ("code", IGNORE + "%fl_align net xin tgt --backend ascend --steps 10 -o report"),
        ("code", "print('verdict:', report.verdict, '| first divergent layer:', report.first_divergent_layer)\n"
                 "print('modes:', [m.mode for m in report.modes])\n"
                 "print('fp32 modules ok:', all(m.verdict == 'ok' for m in report.modes[0].forward))"),
        ("md", "## Mixed precision chosen from the capability table\n\nbf16 where fp16 is missing, fp16 where "
               "the device declares it stable."),
        ("code", "for name in ['cpu', 'rocm', 'ascend', 'minimal']:\n"
                 "    print(name, fl.amp.autocast_dtype(name))"),
        ("code", "fl.set_backend('rocm')\n"
                 "model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.LayerNorm(16),\n"
                 "                            torch.nn.Linear(16, 1)).to('fl')\n"
                 "fl.keep_float32(model, torch.nn.LayerNorm)\n"
                 "opt, scaler = torch.optim.SGD(model.parameters(), lr=0.05), fl.amp.GradScaler()\n"
                 "x, y = torch.randn(32, 8, device='fl'), torch.randn(32, 1, device='fl')\n"
                 "losses = []\n"
                 "for _ in range(5):\n"
                 "    opt.zero_grad()\n"
                 "    with fl.autocast():\n"
                 "        out = model(x)\n"
                 "        loss = torch.nn.functional.mse_loss(out, y)\n"
                 "    scaler.scale(loss).backward(); scaler.step(opt); scaler.update()\n"
                 "    losses.append(loss.item())\n"
                 "print('output dtype under autocast:', out.dtype, '| loss decreasing:', losses == sorted(losses, "
                 "reverse=True))"),
    ],
    "06_writing_a_plugin": [
        ("md", "# Writing and checking a plugin\n\nA vendor copies `plugins_cffi/template/`, builds it, checks "
               "it with `torch-fl plugin check`, and points `FL_PLUGIN_PATH` (or a pip entry point) at it. The "
               "guide is `docs/writing-a-plugin.md`."),
        ("code", "import os, shutil, subprocess, sys, tempfile\n"
                 "from torch_fl.runtime import header_path\n"
                 "work = tempfile.mkdtemp()\n"
                 "for f in ('fl_template.c', 'Makefile'):\n"
                 "    shutil.copy(os.path.join('..', 'plugins_cffi', 'template', f), work)\n"
                 "r = subprocess.run(['make', '-C', work, f'FL_INCLUDE={os.path.dirname(header_path())}'],\n"
                 "                   capture_output=True, text=True)\n"
                 "print('built:', r.returncode == 0, os.path.exists(os.path.join(work, 'libfl_template.so')))"),
        ("code", "from torch_fl.check import check_plugin\n"
                 "report = check_plugin(os.path.join(work, 'libfl_template.so'))\n"
                 "print('PASSED' if report.passed else 'FAILED', report.counts())\n"
                 "for row in report.rows:\n"
                 "    if row.check.startswith('kernel'):\n"
                 "        print(f'{row.check:26} {row.status}')"),
        ("md", "Plugins are found when torch_fl is imported, so a new one is tried in a fresh process:"),
        ("code", "code = '''\nimport torch, torch_fl as fl\nfl.initialize('template')\n"
                 "a = torch.arange(6.0).reshape(2, 3)\nd = a.to('fl')\n"
                 "print(fl.get_current_backend_name(), (d @ d.t()).cpu().tolist())\n"
                 "print(fl.explain('aten::mm').path, fl.explain('aten::exp').path)\n'''\n"
                 "env = dict(os.environ, FL_PLUGIN_PATH=work)\n"
                 "print(subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env).stdout)"),
        ("code", "broken = os.path.join(work, 'libbroken.so')\n"
                 "open(broken, 'w').write('not a shared library')\n"
                 "print(check_plugin(broken).rows[0].detail.split(':')[0] != '')\n"
                 "shutil.rmtree(work)"),
    ],
}


def _extra_notebooks() -> dict:
    """Notebooks kept in their own files (notebooks/cells/NN_name.py, each defining CELLS
    with the same conventions), so separate features don't all edit this one file."""
    import glob
    import runpy
    found = {}
    for path in sorted(glob.glob(os.path.join(HERE, "cells", "[0-9]*.py"))):
        name = os.path.splitext(os.path.basename(path))[0]
        found[name] = runpy.run_path(path, init_globals={"SETUP": SETUP, "IGNORE": IGNORE})["CELLS"]
    return found


NOTEBOOKS.update(_extra_notebooks())


def build(name: str, cells) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for kind, src in cells:
        nb.cells.append(nbformat.v4.new_markdown_cell(src) if kind == "md" else nbformat.v4.new_code_cell(src))
    ExecutePreprocessor(timeout=600, kernel_name="python3", store_widget_state=True,
                        allow_errors=True).preprocess(nb, {"metadata": {"path": HERE}})
    path = os.path.join(HERE, f"{name}.ipynb")
    nbformat.write(nb, path)
    print("wrote", path)


if __name__ == "__main__":
    prefix = sys.argv[1] if len(sys.argv) > 1 else ""
    for name, cells in NOTEBOOKS.items():
        if name.startswith(prefix):
            build(name, cells)
