# %% [markdown]
# # Quickstart: unchanged PyTorch on an `fl` device
#
# The article's verification script (section 4.2): pick a backend, run a matmul, then train ResNet-50 and a
# Transformer encoder unchanged and compare with native CPU PyTorch. Sizes are small here so the notebook runs in CI;
# `torch-fl doctor --full` uses the article's sizes.

# %%
import torch, torch_fl as fl
torch.manual_seed(0)
# %load_ext fl_magics

# %%
fl.initialize(backend_name='auto')
x = torch.randn(64, 128, 128).to(fl.current_device())
y = torch.randn(64, 128, 128, device='fl')
z = x @ y
print(z.device, fl.get_current_backend_name(), torch.accelerator.current_accelerator())
print('matches CPU:', torch.allclose(z.cpu(), x.cpu() @ y.cpu(), rtol=1e-4, atol=1e-3))

# %%
print(fl.list_backends().render())

# %% [markdown]
# ## ResNet-50: forward, backward, an SGD step
#
# torch_fl's model zoo defines its own ResNet-50 (`torch_fl.tools.zoo`), since torchvision cannot be installed beside
# the CPU wheel here; `torchvision.models.resnet50()` works the same way.

# %%
import copy
from torch_fl.tools.zoo import resnet50, transformer_encoder
torch.manual_seed(0)
model = resnet50(num_classes=10)
images, labels = torch.randn(4, 3, 64, 64), torch.tensor([1, 3, 5, 7])
dev_model = copy.deepcopy(model).to('fl')
opt = torch.optim.SGD(dev_model.parameters(), lr=0.01, momentum=0.9)
out = dev_model(images.to('fl'))
loss = torch.nn.functional.cross_entropy(out, labels.to('fl'))
loss.backward(); opt.step()
ref = model(images)
err = (out.detach().cpu() - ref.detach()).abs().max() / ref.abs().max()
print('output on', out.device, '| relative error vs CPU below 1e-4:', bool(err < 1e-4))
print('gradients on device:', all(p.grad.device.type == 'fl' for p in dev_model.parameters()))

# %% [markdown]
# ## Transformer encoder (6 layers in the article; 2 here) with AdamW

# %%
torch.manual_seed(0)
enc = transformer_encoder(d_model=64, nhead=8, num_layers=2, dropout=0.0, dim_feedforward=128)
seq = torch.randn(4, 16, 64)
dev_enc = copy.deepcopy(enc).to('fl')
opt = torch.optim.AdamW(dev_enc.parameters(), lr=1e-3)
for _ in range(3):
    opt.zero_grad()
    loss = dev_enc(seq.to('fl')).pow(2).mean()
    loss.backward(); opt.step()
print('state_dict round trip:', torch.equal(dev_enc.state_dict()['layers.0.linear1.weight'].cpu(),
      copy.deepcopy(dev_enc).cpu().state_dict()['layers.0.linear1.weight']))

# %%
print(fl.explain('aten::native_layer_norm'))
