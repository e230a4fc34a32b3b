"""embedding and its weight gradient where the plugin has no kernel for them (ascend, minimal): one gather of the
rows and one scatter_add of the gradient rows (dispatch/decompositions/general.py), with no host read of the
indices. They must give CPU's values for every index rank, padding_idx and half precision (the gradient judged
against float64), raise PyTorch's IndexError for an index out of range, and stay out of Python once their
signature is known."""

import importlib

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close

import torch_fl as fl

aten = torch.ops.aten


@pytest.fixture(params=["cpu", "rocm", "ascend", "minimal"])
def backend(request):
    fl.set_backend(request.param)
    yield request.param
    fl.set_backend("cpu")


@pytest.mark.parametrize("shape", [(), (5,), (2, 3), (2, 2, 3)])
@pytest.mark.parametrize("padding_idx", [None, 1])
def test_values_and_weight_gradients_match_cpu(backend, shape, padding_idx):
    g = torch.Generator().manual_seed(len(shape))
    weight = torch.randn(6, 4, generator=g)
    idx = torch.randint(0, 6, shape, generator=g)
    if idx.numel() > 1:
        idx.view(-1)[:2] = 1  # a repeated row, and the padding row where there is one
    gout = torch.randn(*shape, 4, generator=g)
    w = weight.to("fl").requires_grad_()
    out = F.embedding(idx.to("fl"), w, padding_idx=padding_idx)
    assert torch.equal(out.cpu(), F.embedding(idx, weight, padding_idx=padding_idx))  # a gather is exact
    out.backward(gout.to("fl"))
    w64 = weight.double().requires_grad_()
    F.embedding(idx, w64, padding_idx=padding_idx).backward(gout.double())
    assert_close(w.grad, w64.grad, 1e-6, what=f"{backend} {shape} padding_idx={padding_idx}")
    if padding_idx is not None:
        assert torch.count_nonzero(w.grad.cpu()[padding_idx]) == 0


def test_half_precision_gradients_accumulate_in_float32(backend):
    """Many bfloat16 gradient rows into one weight row: summed in float32 and rounded once, as PyTorch's
    decomposition (and CUDA) does; summing in bfloat16 would lose most of them."""
    idx = torch.zeros(300, dtype=torch.long)
    weight = torch.zeros(3, 2, dtype=torch.bfloat16)
    gout = torch.full((300, 2), 0.01, dtype=torch.bfloat16)
    w = weight.to("fl").requires_grad_()
    F.embedding(idx.to("fl"), w).backward(gout.to("fl"))
    truth = gout.double().sum(0)
    assert w.grad.dtype == torch.bfloat16
    assert torch.allclose(w.grad.cpu()[0].double(), truth, rtol=1e-2), (w.grad.cpu()[0], truth)


def test_an_index_out_of_range_is_an_index_error(backend):
    w = torch.randn(5, 4, device="fl")
    for bad in ([[0, 5]], [[0, -1]], [7]):  # a plugin's own embedding kernel words it its way
        with pytest.raises(IndexError, match="out of range"):
            F.embedding(torch.tensor(bad, device="fl"), w)
    # native CPU's kernel does not check here (it corrupts memory); fl refuses
    with pytest.raises(IndexError, match="out of range"):
        aten.embedding_dense_backward(
            torch.randn(1, 2, 4, device="fl"), torch.tensor([[0, 9]], device="fl"), 5, -1, False
        )
    ok = torch.tensor([[0, 4]])
    assert torch.equal(F.embedding(ok.to("fl"), w).cpu(), F.embedding(ok, w.cpu()))  # still usable


def test_a_known_signature_stays_out_of_python(backend, monkeypatch):
    entry = importlib.import_module("torch_fl.dispatch.entry")
    calls: list = []
    real = entry.ENTRY.dispatch
    monkeypatch.setattr(entry.ENTRY, "dispatch", lambda func, a, k: calls.append(str(func)) or real(func, a, k))
    w = torch.randn(8, 4).to("fl").requires_grad_()
    gout = torch.randn(2, 3, 4).to("fl")
    for k in range(4):
        idx = torch.randint(0, 8, (2, 3)).to("fl")
        calls.clear()
        F.embedding(idx, w).backward(gout)
        if k >= 3:
            assert not [c for c in calls if "embedding" in c or "index" in c], calls
