"""The rocm emulator's fused flash-style attention kernels
(plugins_cffi/emulated/fused_attention.c), called directly on CPU tensors
(the emulator's device memory is host memory), against PyTorch's math SDPA
path computed in float64 (forward, logsumexp, and autograd gradients)."""

from __future__ import annotations

import math

import harness
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

A = torch.ops.aten
FWD = A._scaled_dot_product_fused_attention_overrideable.default
BWD = A._scaled_dot_product_fused_attention_overrideable_backward.default
FWD_NAME = "aten::_scaled_dot_product_fused_attention_overrideable"
BWD_NAME = "aten::_scaled_dot_product_fused_attention_overrideable_backward"
FL_OK, FL_ERR_UNSUPPORTED, FL_KERNEL_FUSED = 0, 3, 1
ROCM = "libfl_rocm.so"  # the emulator whose table has these kernels (harness.load)


def call(op, name, *args, **kwargs):
    """Runs the rocm emulator's kernel for `op` the way the runtime does (harness: one fl_arg_t per
    schema argument, outputs preallocated NaN-filled from the meta function, undefined outputs as
    ndim -1). Returns (status, outputs)."""
    inputs, cargs = harness.to_specs(harness.bind(op, args, kwargs))
    outs = harness.meta_outputs(op, args, kwargs)
    return harness.call(name, inputs, outs, cargs, lib=ROCM), outs


def fwd(q, k, v, bias=None, causal=False, scale=None, dropout=0.0, debug=False):
    return call(FWD, FWD_NAME, q, k, v, bias, dropout, causal, debug, scale=scale)


def bwd(g, q, k, v, bias, out, lse, causal=False, scale=None, mask=(True, True, True, True), dropout=0.0):
    seed = torch.zeros((), dtype=torch.int64)
    return call(
        BWD,
        BWD_NAME,
        g,
        q,
        k,
        v,
        bias,
        list(mask),
        out,
        lse,
        None,
        None,
        q.shape[2],
        k.shape[2],
        dropout,
        causal,
        seed,
        seed.clone(),
        scale=scale,
    )


# ---------------------------------------------------------------------------
# reference: PyTorch's math path in float64
# ---------------------------------------------------------------------------


def reference(q, k, v, bias=None, causal=False, scale=None, g=None):
    """(out, lse, grads(q, k, v, bias)) in float64 from the math SDPA path."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    b64 = None
    if bias is not None:
        b64 = bias.detach() if bias.dtype == torch.bool else bias.detach().double().requires_grad_()
    with sdpa_kernel(SDPBackend.MATH):
        if causal and b64 is not None:  # sdpa forbids both: fold the causal mask into the bias
            L, S = q.shape[2], k.shape[2]
            tril = torch.ones(L, S, dtype=torch.bool).tril()
            mb = b64 & tril if b64.dtype == torch.bool else b64.masked_fill(~tril, float("-inf"))
            out = F.scaled_dot_product_attention(q64, k64, v64, attn_mask=mb, scale=scale)
        else:
            out = F.scaled_dot_product_attention(q64, k64, v64, attn_mask=b64, is_causal=causal, scale=scale)
    with torch.no_grad():
        sc = q64 @ k64.transpose(-2, -1) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
        if b64 is not None:
            sc = sc.masked_fill(~b64, float("-inf")) if b64.dtype == torch.bool else sc + b64
        if causal:
            sc = sc.masked_fill(~torch.ones(sc.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
        lse = (
            torch.logsumexp(sc, dim=-1)
            if sc.shape[-1]
            else torch.full(sc.shape[:-1], float("-inf"), dtype=torch.float64)
        )
    grads = None
    if g is not None:
        leaves = [q64, k64, v64] + ([b64] if b64 is not None and b64.requires_grad else [])
        grads = torch.autograd.grad(out, leaves, g.double(), allow_unused=True)
        grads = [x if x is not None else torch.zeros_like(leaf) for x, leaf in zip(grads, leaves, strict=True)]
    return out.detach(), lse, grads


TOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 1e-2, torch.bfloat16: 2e-2}


def close(got, want, dtype, what=""):
    assert got.shape == want.shape, (what, got.shape, want.shape)
    s = max(1.0, float(want[torch.isfinite(want)].abs().max())) if want.numel() else 1.0
    t = TOL[dtype]
    torch.testing.assert_close(got.double(), want, rtol=t, atol=t * s, equal_nan=False, msg=lambda m: f"{what}: {m}")


def make(B, H, L, E, dtype, layout="contig"):
    """(B, H, L, E) tensor; 'blhe' is transposed from (B, L, H, E) as models
    produce it, 'sliced' has no unit stride in the last dim."""
    if layout == "blhe":
        return torch.randn(B, L, H, E).to(dtype).transpose(1, 2)
    if layout == "sliced":
        return torch.randn(B, H, L, 2 * E).to(dtype)[..., ::2]
    return torch.randn(B, H, L, E).to(dtype)


def run_case(B, H, L, S, E, Ev, dtype, layout="contig", causal=False, bias=None, scale=None, backward=True):
    q, k, v = make(B, H, L, E, dtype, layout), make(B, H, S, E, dtype, layout), make(B, H, S, Ev, dtype, layout)
    st, outs = fwd(q, k, v, bias, causal=causal, scale=scale)
    assert st == FL_OK, "forward declined"
    out, lse = outs[0], outs[1]
    assert lse.dtype == torch.float32  # meta gives float32 statistics for every input dtype
    g = make(B, H, L, Ev, dtype, layout)
    ref_out, ref_lse, ref_grads = reference(q, k, v, bias, causal, scale, g if backward else None)
    close(out, ref_out, dtype, "out")
    lse_tol = dtype if dtype != torch.float64 else torch.float32  # stored in float32
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin), "logsumexp: masked rows must be -inf"
    assert bool((lse[~fin] == float("-inf")).all())
    close(lse[fin], ref_lse[fin], lse_tol, "logsumexp")
    assert int(outs[6]) == 0 and int(outs[7]) == 0
    if not backward:
        return
    st, grads = bwd(
        g,
        q,
        k,
        v,
        bias,
        out,
        lse,
        causal=causal,
        scale=scale,
        mask=(True, True, True, bias is not None and bias.dtype != torch.bool),
    )
    assert st == FL_OK, "backward declined"
    for name, got, want in zip("qkv", grads[:3], ref_grads[:3], strict=True):
        close(got, want, dtype, f"grad_{name}")
    if bias is not None and bias.dtype != torch.bool:
        close(grads[3], ref_grads[3], dtype, "grad_attn_bias")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ---------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------


def test_table_lists_fused_attention():
    ks = harness.load(ROCM)[1]
    want = sum(1 << d for d in (0, 1, 2, 3))
    for name in (FWD_NAME, BWD_NAME):
        assert name in ks, name
        dtypes, flags, _ = ks[name]
        assert dtypes == want and flags & FL_KERNEL_FUSED


# ---------------------------------------------------------------------------
# shapes, layouts, dtypes
# ---------------------------------------------------------------------------

ALL = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
SHAPES = [
    # B, H, L, S, E, Ev
    (1, 1, 1, 1, 8, 8),
    (1, 1, 5, 7, 4, 3),  # Lq != S, Ev != E
    (2, 3, 9, 4, 16, 16),  # Lq > S
    (2, 4, 64, 80, 32, 32),
    (1, 2, 130, 300, 16, 24),  # several query and key tiles, ragged
]


@pytest.mark.parametrize("dtype", ALL, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_shapes(shape, dtype):
    run_case(*shape, dtype)


@pytest.mark.parametrize("dtype", ALL, ids=str)
@pytest.mark.parametrize("layout", ["blhe", "sliced"])
def test_non_contiguous(layout, dtype):
    run_case(2, 4, 33, 70, 16, 12, dtype, layout)


@pytest.mark.parametrize("dtype", ALL, ids=str)
@pytest.mark.parametrize("L,S", [(5, 5), (9, 4), (4, 9), (150, 140), (70, 200)])
def test_causal(L, S, dtype):
    run_case(2, 2, L, S, 8, 8, dtype, causal=True)


def test_causal_is_top_left_aligned():
    """Row 0 sees only key 0 whatever S is: its output is v[..., 0, :]."""
    q, k, v = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 6, 4), torch.randn(1, 1, 6, 5)
    st, outs = fwd(q, k, v, causal=True)
    assert st == FL_OK
    torch.testing.assert_close(outs[0][0, 0, 0], v[0, 0, 0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_scale(dtype):
    run_case(2, 2, 10, 12, 8, 6, dtype, scale=0.37)


@pytest.mark.parametrize("dtype", ALL, ids=str)
@pytest.mark.parametrize("bias_shape", ["B11S", "1HLS", "BHLS", "LS", "S", "B1L1", "11LS"])
def test_float_bias(bias_shape, dtype):
    B, H, L, S = 2, 3, 70, 140
    shape = {
        "B11S": (B, 1, 1, S),
        "1HLS": (1, H, L, S),
        "BHLS": (B, H, L, S),
        "LS": (L, S),
        "S": (S,),
        "B1L1": (B, 1, L, 1),
        "11LS": (1, 1, L, S),
    }[bias_shape]
    bias = torch.randn(shape).to(dtype)
    run_case(B, H, L, S, 16, 8, dtype, "blhe", bias=bias)


def test_float_bias_non_contiguous_and_causal():
    B, H, L, S = 2, 2, 20, 30
    bias = torch.randn(B, H, S, L, dtype=torch.float64).transpose(-1, -2)
    run_case(B, H, L, S, 8, 8, torch.float64, bias=bias, causal=True)
    bias = torch.randn(1, S, 1, L).permute(0, 2, 3, 1)  # (1, 1, L, S), odd strides
    run_case(B, H, L, S, 8, 8, torch.float32, "sliced", bias=bias)


@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_bool_mask(dtype):
    B, H, L, S = 2, 2, 40, 150
    mask = torch.rand(B, 1, L, S) > 0.3
    run_case(B, H, L, S, 8, 8, dtype, bias=mask)
    run_case(B, H, L, S, 8, 8, dtype, bias=torch.rand(L, S) > 0.5, causal=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_fully_masked_rows(dtype):
    """The math path's safe softmax: output 0 and zero gradients; lse -inf."""
    B, H, L, S = 1, 2, 6, 140
    mask = torch.rand(B, H, L, S) > 0.5
    mask[:, :, 2] = False
    mask[0, 1, 4] = False
    run_case(B, H, L, S, 8, 8, dtype, bias=mask)
    fb = torch.randn(B, H, L, S).to(dtype)
    fb[:, :, 3] = float("-inf")
    fb[:, :, 5, :130] = float("-inf")  # only the last key tile is live
    run_case(B, H, L, S, 8, 8, dtype, bias=fb)


def test_empty_keys():
    """S == 0: every row is fully masked."""
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 0, 4), torch.randn(1, 2, 0, 5)
    st, outs = fwd(q, k, v)
    assert st == FL_OK
    assert torch.equal(outs[0], torch.zeros(1, 2, 3, 5))
    assert bool((outs[1] == float("-inf")).all())
    g = torch.randn(1, 2, 3, 5)
    st, grads = bwd(g, q, k, v, None, outs[0], outs[1])
    assert st == FL_OK
    assert torch.equal(grads[0], torch.zeros_like(q))


@pytest.mark.parametrize("shape", [(0, 2, 5, 5, 4, 4), (2, 0, 5, 5, 4, 4), (2, 2, 0, 5, 4, 4)], ids=str)
def test_zero_size(shape):
    B, H, L, S, E, Ev = shape
    q, k, v = torch.randn(B, H, L, E), torch.randn(B, H, S, E), torch.randn(B, H, S, Ev)
    st, outs = fwd(q, k, v)
    assert st == FL_OK and outs[0].shape == (B, H, L, Ev)
    g = torch.randn(B, H, L, Ev)
    bias = torch.randn(1, 1, L, S)
    st, outs = fwd(q, k, v, bias)
    assert st == FL_OK
    st, grads = bwd(g, q, k, v, bias, outs[0], outs[1])
    assert st == FL_OK
    # L == 0: no query attends, so key/value/bias gradients are zeros (not left unwritten)
    for t in grads:
        assert torch.equal(t, torch.zeros_like(t))


def test_grad_bias_not_requested_is_zero_and_masks_respected():
    B, H, L, S = 2, 2, 7, 9
    q, k, v = torch.randn(B, H, L, 4), torch.randn(B, H, S, 4), torch.randn(B, H, S, 4)
    bias = torch.randn(B, 1, 1, S)
    st, outs = fwd(q, k, v, bias)
    g = torch.randn(B, H, L, 4)
    st, grads = bwd(g, q, k, v, bias, outs[0], outs[1], mask=(True, True, True, False))
    assert st == FL_OK
    assert torch.equal(grads[3], torch.zeros_like(bias))
    _, _, ref = reference(q, k, v, bias, g=g)
    close(grads[0], ref[0], torch.float32, "grad_q")


def test_backward_accepts_other_lse_conventions():
    """A fully masked row's lse may come as 0 (PyTorch's CPU flash kernel) or +inf."""
    B, H, L, S = 1, 1, 4, 6
    q, k, v = torch.randn(B, H, L, 4), torch.randn(B, H, S, 4), torch.randn(B, H, S, 4)
    mask = torch.ones(L, S, dtype=torch.bool)
    mask[1] = False
    st, outs = fwd(q, k, v, mask)
    g = torch.randn(B, H, L, 4)
    _, _, ref = reference(q, k, v, mask, g=g)
    for val in (0.0, float("inf"), float("-inf")):
        lse = outs[1].clone()
        lse[0, 0, 1] = val
        st, grads = bwd(g, q, k, v, mask, outs[0], lse, mask=(True, True, True, False))
        assert st == FL_OK
        for got, want in zip(grads[:3], ref[:3], strict=True):
            close(got, want, torch.float32, f"lse={val}")


# ---------------------------------------------------------------------------
# what the kernels decline
# ---------------------------------------------------------------------------


def test_declines():
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    assert fwd(q, k, v, dropout=0.1)[0] == FL_ERR_UNSUPPORTED
    assert fwd(q, k, v, debug=True)[0] == FL_ERR_UNSUPPORTED
    assert fwd(q.double(), k, v)[0] == FL_ERR_UNSUPPORTED  # mixed dtypes
    assert fwd(q[0], k[0], v[0])[0] == FL_ERR_UNSUPPORTED  # 3-D
    assert fwd(q, k, v, torch.randint(0, 2, (3, 5)))[0] == FL_ERR_UNSUPPORTED  # integer mask
    assert fwd(q, torch.randn(1, 1, 5, 4), torch.randn(1, 1, 5, 4))[0] == FL_ERR_UNSUPPORTED  # GQA-style heads
    bad = torch.randn(1, 2, 3, 5)
    bad_desc = torch.randn(2, 2, 3, 5)[:1]
    assert fwd(q, k, v, bad)[0] == FL_OK
    assert fwd(q, k, v, bad_desc.expand(1, 2, 3, 5))[0] == FL_OK
    st, outs = fwd(q, k, v)
    g = torch.randn(1, 2, 3, 4)
    assert bwd(g, q, k, v, None, outs[0], outs[1], dropout=0.2)[0] == FL_ERR_UNSUPPORTED
    # a gradient for a bool mask
    mask = torch.ones(3, 5, dtype=torch.bool)
    assert bwd(g, q, k, v, mask, outs[0], outs[1])[0] == FL_ERR_UNSUPPORTED
    assert bwd(g, q, k, v, mask, outs[0], outs[1], mask=(True, True, True, False))[0] == FL_OK


def test_declines_non_broadcastable_bias():
    """The meta function rejects such a bias itself, so build the call by hand
    with a bias of shape (2, 5) for L = 3."""
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    bias = torch.randn(2, 5)
    o, lse = torch.empty(1, 2, 3, 4), torch.empty(1, 2, 3)
    args = [
        ("tensor", 0),
        ("tensor", 1),
        ("tensor", 2),
        ("tensor", 3),
        ("float", 0.0),
        ("bool", False),
        ("bool", False),
        ("none",),
    ]
    assert harness.call(FWD_NAME, [q, k, v, bias], [o, lse] + [None] * 7, args, lib=ROCM) == FL_ERR_UNSUPPORTED
