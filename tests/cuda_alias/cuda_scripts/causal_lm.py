"""Fine-tune a Hugging Face causal LM, then generate(), written for an NVIDIA GPU.

A tiny random-init GPT-2 (nothing is downloaded). Nothing here knows about torch_fl: with
FL_ALIAS_CUDA=1 it runs on the active fl backend. It prints one JSON line for tests/cuda_alias/test_cuda_alias.py."""

import json

import torch
from transformers import GPT2Config, GPT2LMHeadModel

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
config = GPT2Config(
    vocab_size=128,
    n_positions=32,
    n_embd=32,
    n_layer=2,
    n_head=4,
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
    bos_token_id=1,
    eos_token_id=2,
)
model = GPT2LMHeadModel(config)
if device.type == "cuda":
    model.cuda()
ids = torch.randint(3, 128, (4, 16), generator=torch.Generator().manual_seed(1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

model.train()
losses = []
for _step in range(3):
    batch = ids.to(device, non_blocking=True)
    out = model(input_ids=batch, labels=batch)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    losses.append(out.loss.item())

model.eval()
prompt = ids[:2, :4].to(device)
with torch.no_grad():
    generated = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False, pad_token_id=0
    )
if torch.cuda.is_available():
    torch.cuda.synchronize()
print(
    json.dumps(
        {
            "device": str(model.device),
            "logits_device": str(out.logits.device),
            "losses": losses,
            "generated": generated.cpu().tolist(),
            "generated_device": str(generated.device),
        }
    )
)
