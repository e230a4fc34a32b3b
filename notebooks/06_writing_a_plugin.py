# %% [markdown]
# # Writing and checking a plugin
#
# A vendor copies `plugins_cffi/template/`, builds it, checks it with `torch-fl plugin check`, and points
# `FL_PLUGIN_PATH` (or a pip entry point) at it. The guide is `docs/writing-a-plugin.md`.

# %%
import os, shutil, subprocess, sys, tempfile
from torch_fl.runtime import header_path
work = tempfile.mkdtemp()
for f in ('fl_template.c', 'Makefile'):
    shutil.copy(os.path.join('..', 'plugins_cffi', 'template', f), work)
r = subprocess.run(['make', '-C', work, f'FL_INCLUDE={os.path.dirname(header_path())}'],
                   capture_output=True, text=True)
print('built:', r.returncode == 0, os.path.exists(os.path.join(work, 'libfl_template.so')))

# %% [markdown]
# The check takes a minute; in a notebook a progress bar moves as each check is decided (in a terminal,
# `torch-fl plugin check` prints a line per check).

# %%
# NBVAL_IGNORE_OUTPUT
import torch_fl.notebook  # noqa: F401 - registers the progress bar (%load_ext fl_magics does too)
from torch_fl.tools.checker import check_plugin
report = check_plugin(os.path.join(work, 'libfl_template.so'))

# %%
print('PASSED' if report.passed else 'FAILED', report.counts())
for row in report.rows:
    if row.check.startswith('kernel'):
        print(f'{row.check:26} {row.status}')

# %% [markdown]
# Plugins are found when torch_fl is imported, so a new one is tried in a fresh process:

# %%
code = '''
import torch, torch_fl as fl
fl.initialize('template')
a = torch.arange(6.0).reshape(2, 3)
d = a.to('fl')
print(fl.get_current_backend_name(), (d @ d.t()).cpu().tolist())
print(fl.explain('aten::mm').path, fl.explain('aten::exp').path)
'''
env = dict(os.environ, FL_PLUGIN_PATH=work)
print(subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env).stdout)

# %%
broken = os.path.join(work, 'libbroken.so')
open(broken, 'w').write('not a shared library')
print(check_plugin(broken, progress=False).rows[0].detail.split(':')[0] != '')
shutil.rmtree(work)
