"""PyTorch parity defects found by running PyTorch's own device tests and a hostile probe on fl (issue: "PyTorch
parity"), each pinned by a test that failed before its fix. Where PyTorch raises, fl raises the same exception type
(code and tests catch IndexError, TypeError, ValueError, RuntimeError by type)."""

import pytest
import torch

import torch_fl as fl


@pytest.fixture(params=["cpu", "minimal"])
def backend(request):
    fl.set_backend(request.param)
    yield request.param
    fl.set_backend("cpu")


def test_flip_of_a_0_dim_tensor(backend):
    x = torch.tensor(3.5, device="fl")
    assert x.flip(0).item() == 3.5 and x.flip(-1).item() == 3.5
    with pytest.raises(IndexError):
        x.flip(1)


def test_cpu_index_tensors_and_masks_index_an_fl_tensor(backend):
    """CUDA moves host index tensors (and a 0-dim value) to the device itself; PyTorch's own tests rely on it."""
    base = torch.arange(12.0).reshape(3, 4)
    x = base.to("fl")
    idx, mask = torch.tensor([2, 0]), torch.tensor([True, False, True])
    assert torch.equal(x[idx].cpu(), base[idx])
    assert torch.equal(x[mask].cpu(), base[mask])
    assert torch.equal(x[:, torch.tensor([1, 3])].cpu(), base[:, torch.tensor([1, 3])])
    y, ref = x.clone(), base.clone()
    y[idx] = torch.tensor(-1.0)
    ref[idx] = -1.0
    y[mask, 1] = 7.0
    ref[mask, 1] = 7.0
    assert torch.equal(y.cpu(), ref)
    assert torch.equal(x.index_fill(1, torch.tensor([0, 2]), 5.0).cpu(), base.index_fill(1, torch.tensor([0, 2]), 5.0))
    with pytest.raises(RuntimeError, match="same device"):  # a non-scalar value must be on the device, as on CUDA
        x.index_put_((idx.to("fl"),), torch.zeros(2, 4))


def test_indexing_errors_are_index_errors(backend):
    x = torch.zeros(3, 4, device="fl")
    with pytest.raises(IndexError, match=r"The shape of the mask \[2\] at index 0 does not match"):
        torch.arange(10.0, device="fl")[torch.tensor([True, False], device="fl")]
    with pytest.raises(IndexError, match=r"shape mismatch: indexing tensors could not be broadcast together with "
                                         r"shapes \[2\], \[3\]"):
        x[torch.tensor([0, 1], device="fl"), torch.tensor([0, 1, 2], device="fl")]
    with pytest.raises(IndexError, match="tensors used as indices must be long, int, byte or bool"):
        torch.ops.aten.index(x, [torch.tensor([0.0], device="fl")])
    with pytest.raises(IndexError, match="too many indices"):
        torch.ops.aten.index(x, [torch.tensor([0], device="fl")] * 3)
    i = torch.tensor([5], device="fl")
    for what, call in {"index": lambda: x[i], "index_put_": lambda: x.index_put_((i,), torch.tensor(1.0)),
                       "index_select": lambda: x.index_select(0, i),
                       "embedding": lambda: torch.nn.functional.embedding(i, x),
                       "index_copy": lambda: x.index_copy(0, i, torch.zeros(1, 4, device="fl")),
                       "index_fill": lambda: x.index_fill(0, i, 1.0),
                       "take": lambda: x.take(torch.tensor([50], device="fl"))}.items():
        with pytest.raises(IndexError):
            call()
            pytest.fail(f"{what} accepted an index out of range")
    with pytest.raises(RuntimeError) as info:  # gather: RuntimeError on CPU, so not an IndexError here either
        x.gather(0, torch.tensor([[5]], device="fl"))
    assert not isinstance(info.value, IndexError)
    assert x.sum().item() == 0  # the process stays usable
