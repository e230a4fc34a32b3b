# %% [markdown]
# # Profiling and fallback paths
#
# `%%fl_profile` runs a cell under `fl.profile()`: per op the calls, time, path (native / decomposition / JIT / CPU
# fallback), kernel launches and bytes copied. Timings vary from run to run, so their cells are not compared by the
# notebook check; the cell after each asserts what does not vary.

# %%
import torch, torch_fl as fl
torch.manual_seed(0)
# %load_ext fl_magics

# %%
from torch_fl.tools.zoo import transformer_encoder
enc = transformer_encoder(d_model=32, nhead=4, num_layers=1, dropout=0.0, dim_feedforward=64)
seq = torch.randn(2, 8, 32)

# %%
# %fl_backend minimal --move enc

# %%
# %%fl_profile -o prof --top 12
# NBVAL_IGNORE_OUTPUT
enc(seq.to('fl')).sum().backward()

# %%
calls = {s.op: s for s in prof.ops() if s.calls}
print('layer norm on the minimal chip:', calls['aten::native_layer_norm'].path)
print('its kernel launches:', calls['aten::native_layer_norm'].kernels)
print('ops that fell back:', sorted(s.op for s in prof.fallbacks()))

# %%
# %fl_backend rocm --move enc

# %%
# %%fl_profile --compare minimal -o cmp --top 10
# NBVAL_IGNORE_OUTPUT
enc(seq.to('fl')).sum().backward()  # enc moves to each compared backend for its run, then back

# %%
rows = {r['op']: r for r in cmp.rows()}
print('kernels rocm vs minimal:', cmp.a.kernels, 'vs', cmp.b.kernels)
print('layer norm paths:', rows['aten::native_layer_norm']['path'])
print('enc is back on', fl.get_current_backend_name(), '-', next(enc.parameters()).device == fl.current_device())

# %%
prof.export_chrome_trace('trace.json')
import json, os
print(len(json.load(open('trace.json'))['traceEvents']) == len(prof.events))
os.remove('trace.json')
