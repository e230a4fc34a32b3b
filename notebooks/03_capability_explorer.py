# %% [markdown]
# # The capability explorer
#
# Every backend's capability table is probed from its plugin at start-up. `%fl_caps` opens an explorer over it
# (devices, the path each op takes per dtype, fused kernels, collectives, and a comparison of two backends); the
# same data is `fl.capabilities(name)` and `fl.path_table(name)`.

# %%
import torch, torch_fl as fl
torch.manual_seed(0)
# %load_ext fl_magics

# %%
# NBVAL_IGNORE_OUTPUT
# %fl_caps rocm

# %%
from torch_fl.notebook import CapabilityExplorer
explorer = CapabilityExplorer('minimal')
explorer.search.value = 'conv'
decomposed = '<td>aten::convolution</td><td>D</td>' in explorer.ops.value
print('convolution on minimal: decomposition (im2col + bmm)' if decomposed else 'unexpected')

# %%
print(fl.capabilities('ascend').render())

# %%
paths = fl.path_table('minimal')
print(paths.counts())
print(paths.render('layer_norm'))

# %%
for name in ['cpu', 'rocm', 'ascend', 'minimal']:
    caps = fl.capabilities(name)
    print(f"{name:8} kernels {len(caps.kernels):4}  autocast {caps.amp_dtype:9} fused {caps.fused_kernels}  "
          f"collectives {caps.collectives_path}")
