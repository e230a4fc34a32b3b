# %% [markdown]
# # Code written for CUDA, unchanged, on any fl backend
#
# Most PyTorch code in the wild is written for an NVIDIA GPU: `device = "cuda" if torch.cuda.is_available() else
# "cpu"`, `.cuda()`, `torch.autocast("cuda")`, `torch.amp.GradScaler("cuda")`, `torch.cuda.synchronize()`. The opt-in
# **cuda alias** runs it on the active fl backend without an edit: `%fl_backend rocm --as-cuda` in a notebook,
# `torch_fl.alias_cuda()` in Python, or `FL_ALIAS_CUDA=1` for a script (then `import torch` alone is enough). Tensors
# keep reporting their real device (`fl:N`). docs/user-guide.md ("Code written for CUDA") lists what it covers and
# what it does not.

# %%
import torch, torch_fl as fl
torch.manual_seed(0)
# %load_ext fl_magics
import os, subprocess, sys, tempfile
work, runs = tempfile.mkdtemp(), {}
print('CUDA available:', torch.cuda.is_available())
try:
    torch.zeros(1, device='cuda')
except AssertionError as e:
    print('without the alias:', e)

# %% [markdown]
# ## The CUDA cell
#
# Written as for an NVIDIA GPU: a small classifier trained with mixed precision and loss scaling. It is saved to a
# file, so the same code can also run as a plain script further down.

# %%
# %%writefile {work}/cuda_cell.py
import torch
from torch import nn

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 4)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler("cuda")
x = torch.randn(64, 32).cuda() if device == "cuda" else torch.randn(64, 32)
y = torch.randint(0, 4, (64,)).to(device, non_blocking=True)
losses = []
for _ in range(4):
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device_type="cuda"):
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    losses.append(loss.item())
if device == "cuda":
    torch.cuda.synchronize()
print(device, next(model.parameters()).device, logits.dtype, [round(v, 4) for v in losses])

# %% [markdown]
# ## Turn the alias on, then run the cell on `rocm` and on `minimal`
#
# `--as-cuda` makes `cuda` mean the current fl backend from now on; it follows later backend switches, so
# `%%fl_profile --compare minimal` runs the same cell once on `rocm` (fp16 autocast, 2 devices, fused kernels) and
# once on `minimal` (a bring-up chip: bf16 autocast, 33 native kernels), and lines the two profiles up op by op.

# %%
# %fl_backend rocm --as-cuda
print(torch.cuda.is_available(), torch.cuda.device_count(), torch.cuda.get_device_name())

# %%
# %%fl_profile --compare minimal -o cmp --top 12
# NBVAL_IGNORE_OUTPUT
# %run -i {work}/cuda_cell.py
runs[fl.get_current_backend_name()] = (str(logits.dtype), losses)

# %% [markdown]
# Times vary from run to run, so the table above is not compared by the notebook check; what follows is. Where did the
# cell's ops go? On `rocm` the matmuls, the norm, GELU and the softmax run native kernels; on `minimal` they are
# decompositions into its few kernels and JIT kernels. The GradScaler's two bookkeeping ops
# (`_amp_foreach_non_finite_check_and_unscale_`, `_amp_update_scale_`) have no device kernel on either backend and run
# on the host (on `minimal` so do a few dtype copies and `reciprocal`): the profile names what a vendor would be asked
# for.

# %%
rows = {r['op']: r for r in cmp.rows()}
for op in ('aten::addmm', 'aten::native_layer_norm', 'aten::gelu', 'aten::_log_softmax'):
    print(f"{op:<26} rocm | minimal: {rows[op]['path']}")
print('kernels rocm vs minimal:', cmp.a.kernels, 'vs', cmp.b.kernels)
for name, prof in (('rocm', cmp.a), ('minimal', cmp.b)):
    print(name, 'ops with CPU fallbacks:', sorted(s.op for s in prof.fallbacks()))
for backend, (dtype, losses) in runs.items():
    print(backend, 'autocast dtype', dtype, '| loss decreasing:',
          losses == sorted(losses, reverse=True))

# %% [markdown]
# ## The same code as a plain script, on the CPU, as the reference
#
# Run by plain PyTorch (torch_fl not loaded), the cell finds no GPU and trains in float32 on the CPU. The fl runs are
# within a few roundings of their autocast dtype of it.

# %%
env = {k: v for k, v in os.environ.items() if not k.startswith('FL_')}
env['TORCH_DEVICE_BACKEND_AUTOLOAD'] = '0'
r = subprocess.run([sys.executable, os.path.join(work, 'cuda_cell.py')], env=env, capture_output=True,
                   text=True, timeout=600)
print(r.stdout.strip())
cpu = [float(v) for v in r.stdout.split('[')[1].rstrip(']\n').split(',')]
for backend, (dtype, losses) in runs.items():
    tol = 4 * torch.finfo(getattr(torch, dtype.split('.')[1])).eps
    close = [abs(a - b) <= tol * abs(b) + 5e-5 for a, b in zip(losses, cpu, strict=True)]  # 4 digits
    print(backend, 'within', tol, 'of CPU float32:', all(close))

# %% [markdown]
# ## Where CUDA code needs care
#
# Tensors report their real device, so a test like `x.is_cuda` or `x.device.type == "cuda"` is false on an fl backend:
# compare with `torch.device("cuda")` through the alias (`x.device == torch.ones(0, device="cuda").device`), or ask
# `x.device.type != "cpu"`. What the alias cannot cover raises an error that names the feature and what to do instead:

# %%
x = torch.ones(2).cuda()
print(x.device, x.is_cuda, x.device.type == 'cuda', x.device.type != 'cpu')
try:
    torch.cuda.CUDAGraph()
except NotImplementedError as e:
    print(type(e).__name__, e)

# %%
import shutil
shutil.rmtree(work)
# %fl_backend cpu
