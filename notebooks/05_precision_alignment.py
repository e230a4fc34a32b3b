# %% [markdown]
# # Precision alignment and mixed precision
#
# `%fl_align model inputs target` compares a model on a backend with native CPU float32: every module's output, every
# gradient, the same under the backend's autocast dtype, and a short training run. Verdicts judge against float64: ok
# where the backend's error is within 10x native CPU's own error on the same tensor, suspect beyond 1000x (the
# report prints its rule, and an `x native` column with the ratio). A gradient that is zero by construction (a conv
# bias before BatchNorm) is judged against the scale of the gradients around it, so its rounding noise never
# decides.

# %%
import torch, torch_fl as fl
torch.manual_seed(0)
# %load_ext fl_magics

# %%
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                          torch.nn.Linear(32, 4))
xin, tgt = torch.randn(8, 16), torch.randn(8, 4)

# %%
# NBVAL_IGNORE_OUTPUT
# %fl_align net xin tgt --backend ascend --steps 10 -o report

# %%
print('verdict:', report.verdict, '| first divergent layer:', report.first_divergent_layer)
print('modes:', [m.mode for m in report.modes])
print('fp32 modules ok:', all(m.verdict == 'ok' for m in report.modes[0].forward))

# %% [markdown]
# ## Mixed precision chosen from the capability table
#
# bf16 where fp16 is missing, fp16 where the device declares it stable.

# %%
for name in ['cpu', 'rocm', 'ascend', 'minimal']:
    print(name, fl.amp.autocast_dtype(name))

# %%
fl.set_backend('rocm')
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.LayerNorm(16),
                            torch.nn.Linear(16, 1)).to('fl')
fl.keep_float32(model, torch.nn.LayerNorm)
opt, scaler = torch.optim.SGD(model.parameters(), lr=0.05), fl.amp.GradScaler()
x, y = torch.randn(32, 8, device='fl'), torch.randn(32, 1, device='fl')
losses = []
for _ in range(5):
    opt.zero_grad()
    with fl.autocast():
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, y)
    scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
    losses.append(loss.item())
print('output dtype under autocast:', out.dtype, '| loss decreasing:', losses == sorted(losses, reverse=True))
