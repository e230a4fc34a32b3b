# %% [markdown]
# # Switching backends live
#
# Several backends are loaded at once; `%fl_backend` (or `fl.set_backend`) changes where new tensors go. Existing
# tensors stay valid on their own backend, and `--move` takes named models, tensors and optimizers along.

# %%
import torch, torch_fl as fl
torch.manual_seed(0)
# %load_ext fl_magics

# %%
# %fl_backend

# %%
a = torch.arange(6.0, device='fl')          # on the current backend (cpu)
model = torch.nn.Linear(6, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
# %fl_backend rocm --move model
b = torch.arange(6.0, device='fl')          # on rocm
print(a.device, b.device, model.weight.device)

# %%
print((a * 2).cpu(), '(still computed by', a.device, ')')
try:
    a + b
except RuntimeError as e:
    print('mixing backends:', str(e).split('!')[0])
print((a.to(b.device) + b).cpu())

# %%
# %fl_backend ascend --caps

# %% tags=["raises-exception"]
# %fl_backend nope

# %%
# %fl_backend cpu
print(fl.get_current_backend_name())
