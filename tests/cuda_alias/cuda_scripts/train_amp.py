"""A tutorial-style training loop written for an NVIDIA GPU: nothing here knows about torch_fl.

Without a GPU it runs on the CPU (autocast and the GradScaler then switch themselves off); with
FL_ALIAS_CUDA=1 it runs on the active fl backend. It prints one JSON line for tests/cuda_alias/test_cuda_alias.py."""

import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
torch.cuda.manual_seed_all(0)
torch.backends.cudnn.benchmark = True
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True

data = TensorDataset(torch.randn(64, 1, 8, 8), torch.randint(0, 4, (64,)))
loader = DataLoader(data, batch_size=16, shuffle=False, pin_memory=True)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, 4)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.norm(self.conv(x))), 2)
        return self.fc(x.flatten(1))


model = Net().to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler("cuda")
losses, pinned = [], []
for _epoch in range(2):
    for images, labels in loader:
        pinned.append(images.is_pinned())
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda"):
            logits = model(images)
            loss = nn.functional.cross_entropy(logits, labels)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())

if torch.cuda.is_available():
    torch.cuda.synchronize()
    memory = {"allocated": torch.cuda.memory_allocated(), "peak": torch.cuda.max_memory_allocated()}
    torch.cuda.reset_peak_memory_stats()
    memory["peak_after_reset"] = torch.cuda.max_memory_allocated()
    torch.cuda.empty_cache()
else:
    memory = {}
print(
    json.dumps(
        {
            "device": str(next(model.parameters()).device),
            "logits_dtype": str(logits.dtype),
            "losses": losses,
            "pinned": pinned,
            "scale": scaler.get_scale() if scaler.is_enabled() else None,
            "memory": memory,
        }
    )
)
