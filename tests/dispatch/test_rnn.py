"""Recurrent layers on every backend: PyTorch sends fl tensors to the fused
LSTM/GRU cells that only CUDA implements (aten::_thnn_fused_lstm_cell ...);
torch_fl's decompositions of the cells and of their backward ops make
nn.LSTM, nn.GRU, nn.LSTMCell and nn.GRUCell run, differentiate and train,
with errors against float64 no worse than native float32's."""

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import torch_fl as fl
from torch_fl.tools.numerics import compare_with_float64

BACKENDS = ["cpu", "rocm", "ascend", "minimal"]


def _modules():
    torch.manual_seed(0)
    return {
        "LSTM": (nn.LSTM(6, 8, 2, batch_first=True), torch.randn(3, 5, 6)),
        "LSTM-proj": (nn.LSTM(6, 8, proj_size=4), torch.randn(5, 3, 6)),
        "GRU": (nn.GRU(6, 8, bidirectional=True), torch.randn(5, 3, 6)),
        "LSTMCell": (nn.LSTMCell(6, 8), torch.randn(3, 6)),
        "GRUCell": (nn.GRUCell(6, 8), torch.randn(3, 6)),
        "GRUCell-nobias": (nn.GRUCell(6, 8, bias=False), torch.randn(3, 6)),
    }


@pytest.mark.parametrize("name", list(_modules()))
@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_backward_against_float64(backend, name):
    module, x = _modules()[name]
    fl.set_backend(backend)
    weights = torch.Generator().manual_seed(1)

    def run(device, dtype):
        m = copy.deepcopy(module).to(dtype).to(device)
        xx = x.detach().to(dtype).to(device).requires_grad_()
        y = m(xx)
        y = y[0] if isinstance(y, tuple) else y
        proj = torch.randn(y.shape, generator=weights.manual_seed(1)).to(dtype).to(device)
        (y * proj).sum().backward()
        return {"out": y, "grad_input": xx.grad, **{n: p.grad for n, p in m.named_parameters()}}

    cmp = compare_with_float64(run, "fl")
    assert cmp.ok, cmp.summary()


class _LstmLM(nn.Module):
    def __init__(self, vocab=20, dim=12):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, dim, 2, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        return self.head(self.rnn(self.emb(tokens))[0])


def _train(model, tokens, device, steps=5):
    model = copy.deepcopy(model).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = tokens.to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("backend", BACKENDS)
def test_lstm_language_model_trains_like_cpu(backend):
    torch.manual_seed(0)
    model, tokens = _LstmLM(), torch.randint(0, 20, (4, 9))
    fl.set_backend(backend)
    got, ref = _train(model, tokens, "fl"), _train(model, tokens, "cpu")
    assert got[-1] < got[0]
    assert max(abs(a - b) / b for a, b in zip(got, ref, strict=True)) < 1e-4, (got, ref)


def test_packed_sequences_and_double_backward_stay_on_the_minimal_chip(minimal_no_fallback):
    """The bring-up chip with the CPU fallback off: the cells are elementwise ops it has."""
    torch.manual_seed(0)
    gru = nn.GRU(4, 6, batch_first=True).to("fl")
    x = torch.randn(3, 5, 4)
    packed = pack_padded_sequence(x, torch.tensor([5, 3, 2]), batch_first=True).to("fl")
    out, _ = gru(packed)
    padded = pad_packed_sequence(out, batch_first=True)[0]
    padded.sum().backward()
    assert all(p.grad is not None and p.grad.device.type == "fl" for p in gru.parameters())
    cell = nn.LSTMCell(4, 6).to("fl")
    xx = torch.randn(2, 4, device="fl", requires_grad=True)
    (g,) = torch.autograd.grad(cell(xx)[0].sum(), xx, create_graph=True)  # the differentiable cell backward
    g.pow(2).sum().backward()
    assert xx.grad is not None
