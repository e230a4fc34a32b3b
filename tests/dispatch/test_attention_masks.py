"""F.scaled_dot_product_attention with a boolean mask, on every backend.

PyTorch's own scaled_dot_product_attention turns a boolean mask into an
additive one (0 / -inf) before it picks a kernel; the math composition it
falls back to adds the mask to the scores. torch_fl's SDPA entry point for fl
tensors called that composition with the boolean mask as it came, so True
added 1 to a score instead of keeping it (Mistral's sliding-window mask: every
logit wrong on cpu, ascend and minimal; found by the model zoo)."""

import pytest
import torch
import torch.nn.functional as F

import torch_fl as fl


def _sliding_window(n: int, window: int) -> torch.Tensor:
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return causal & ~torch.ones(n, n, dtype=torch.bool).tril(-window)


@pytest.mark.parametrize("shape", ["2d", "expanded-4d"])
@pytest.mark.parametrize("backend", ["cpu", "rocm", "ascend", "minimal"])
def test_boolean_mask_keeps_and_removes(backend, shape):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 8) for _ in range(3))
    mask = _sliding_window(8, 4)
    if shape == "expanded-4d":
        mask = mask.expand(2, 1, 8, 8)  # what transformers builds: stride 0 over the batch
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*leaves, attn_mask=mask)
    want.sum().backward()
    fl.set_backend(backend)
    fl_leaves = [t.to("fl").requires_grad_() for t in (q, k, v)]
    got = F.scaled_dot_product_attention(*fl_leaves, attn_mask=mask.to("fl"))
    got.sum().backward()
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    for a, b in zip(fl_leaves, leaves, strict=True):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "backends,fused",
    [(None, True), (["MATH"], False), (["FLASH_ATTENTION"], True), (["EFFICIENT_ATTENTION", "MATH"], True)],
)
def test_sdpa_kernel_switches_choose_fused_or_math(backends, fused):
    """torch.nn.attention.sdpa_kernel (and torch.backends.cuda.enable_*_sdp) are honoured on fl: the plugin's
    fused kernel stands for the fused implementations, the composition for MATH (rocm has the kernel)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fl.set_backend("rocm")
    q = torch.randn(2, 2, 8, 16)
    with fl.profile() as prof:
        if backends is None:
            out = F.scaled_dot_product_attention(*(q.to("fl"),) * 3)
        else:
            with sdpa_kernel([getattr(SDPBackend, b) for b in backends]):
                out = F.scaled_dot_product_attention(*(q.to("fl"),) * 3)
    ops = {s.op for s in prof.ops()}
    assert ("aten::_scaled_dot_product_fused_attention_overrideable" in ops) == fused, ops
    assert ("aten::bmm" in ops) == (not fused), ops
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, q, q), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["cpu", "rocm"])  # plugins with a fused attention kernel
def test_fused_attention_calls_take_the_fast_path(backend, monkeypatch):
    """The fused attention op returns two ints beside its tensors (max_q, max_k: from the shapes); the C++ fast
    path returns them too, so a repeated signature no longer enters Python, with every value and gradient
    as on the first call and against float64."""
    import importlib

    entry = importlib.import_module("torch_fl.dispatch.entry")
    calls: list = []
    real = entry.ENTRY.dispatch
    monkeypatch.setattr(entry.ENTRY, "dispatch", lambda func, a, k: calls.append(str(func)) or real(func, a, k))
    fl.set_backend(backend)
    for k in range(4):
        torch.manual_seed(k)
        q, key, v = (torch.randn(2, 2, 8, 16) for _ in range(3))
        leaves = [t.to("fl").requires_grad_() for t in (q, key, v)]
        calls.clear()
        got = F.scaled_dot_product_attention(*leaves)
        if k >= 2:
            assert not [c for c in calls if "attention" in c], calls
        got.sum().backward()
        ref = [t.double().requires_grad_() for t in (q, key, v)]
        want = F.scaled_dot_product_attention(*ref)
        want.sum().backward()
        torch.testing.assert_close(got.cpu().double(), want, rtol=1e-5, atol=1e-5)
        for a, b in zip(leaves, ref, strict=True):
            torch.testing.assert_close(a.grad.cpu().double(), b.grad, rtol=1e-4, atol=1e-5)
