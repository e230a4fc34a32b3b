"""DDP written for NVIDIA GPUs: torchrun --nproc-per-node 2 ddp_nccl.py OUT_DIR.

The NCCL process group, `torch.cuda.set_device(local_rank)`, `device_ids=[local_rank]`: nothing here
knows about torch_fl. With FL_ALIAS_CUDA=1 each rank runs on its own device of the active fl backend and
'nccl' is the fl process group. Each rank saves its parameters for tests/cuda_alias/test_cuda_alias.py."""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
device = torch.device("cuda", local_rank)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
ddp = DDP(model, device_ids=[local_rank], output_device=local_rank)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
losses = []
for step in range(3):
    g = torch.Generator().manual_seed(100 * step + rank)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(ddp(x.to(device)), y.cuda(non_blocking=True))
    loss.backward()
    opt.step()
    losses.append(loss.item())
pair = dist.new_group([0, 1], backend="nccl")
total = torch.full((2,), float(rank + 1), device="cuda")
dist.all_reduce(total, group=pair)
dist.barrier(device_ids=[local_rank])
torch.cuda.synchronize()
torch.save(
    {
        "params": {k: v.cpu() for k, v in model.state_dict().items()},
        "losses": losses,
        "device": str(next(model.parameters()).device),
        "current_device": torch.cuda.current_device(),
        "pg_backend": dist.get_backend(),
        "world": dist.get_world_size(),
        "nccl": dist.is_nccl_available(),
        "group_backend": dist.get_backend(pair),
        "group_sum": total.cpu().tolist(),
        "sum_device": str(total.device),
    },
    os.path.join(sys.argv[1], f"rank{rank}.pt"),
)
dist.destroy_process_group()
