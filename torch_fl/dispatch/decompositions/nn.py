"""Convolution and average pooling as views plus matrix products, for a backend without them.

A convolution reads, for each output position, a window of the (padded)
input: `as_strided` gives all windows at once as a view, one copy lays them
out as rows (im2col), and one batched matrix product per group applies the
weights. A transposed convolution is the convolution of the input spread out
by the stride (zeros between elements) with the flipped, transposed weight;
the backward of a convolution is built from the same pieces. Average pooling
is the same window view, summed. These use only copy_, fill_, bmm, sum and
elementwise ops, which is what the `minimal` chip has (or the JIT makes)."""

from __future__ import annotations

import functools
import math

import torch

aten = torch.ops.aten


def _pad_input(x, padding):
    pads = []
    for p in reversed(padding):
        pads += [p, p]
    return aten.constant_pad_nd.default(x, pads, 0.0) if any(pads) else x


def _windows(x, kernel, stride, dilation):
    """(N, C, *out, *kernel) view of every window of x (already padded)."""
    nd = len(kernel)
    x = x.contiguous()
    out = [(x.shape[2 + i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in range(nd)]
    if any(o <= 0 for o in out):
        raise RuntimeError(
            f"convolution: the (padded) input {list(x.shape[2:])} is smaller than the kernel "
            f"{list(kernel)} with dilation {list(dilation)}"
        )
    st = x.stride()
    sizes = list(x.shape[:2]) + out + list(kernel)
    strides = [st[0], st[1]] + [st[2 + i] * stride[i] for i in range(nd)] + [st[2 + i] * dilation[i] for i in range(nd)]
    return x.as_strided(sizes, strides, x.storage_offset()), out


def _cols(x, kernel, stride, padding, dilation, groups):
    """im2col: (G, N*P, C/G*K) rows, P output positions, K kernel elements; and the output size."""
    nd = len(kernel)
    win, out = _windows(_pad_input(x, padding), kernel, stride, dilation)
    n, c = x.shape[:2]
    p, k = math.prod(out), math.prod(kernel)
    # (N, *out, C, *k) -> (N, P, G, C/G*K) -> (G, N*P, C/G*K)
    perm = [0] + list(range(2, 2 + nd)) + [1] + list(range(2 + nd, 2 + 2 * nd))
    rows = win.permute(perm).reshape(n, p, groups, (c // groups) * k)
    return rows.permute(2, 0, 1, 3).reshape(groups, n * p, (c // groups) * k), out


def _conv(x, weight, bias, stride, padding, dilation, groups):
    n = x.shape[0]
    o = weight.shape[0]
    kernel = list(weight.shape[2:])
    cols, out = _cols(x, kernel, stride, padding, dilation, groups)
    w = weight.reshape(groups, o // groups, -1).transpose(1, 2)  # (G, C/G*K, O/G)
    y = torch.bmm(cols, w)  # (G, N*P, O/G)
    y = y.reshape(groups, n, math.prod(out), o // groups).permute(1, 0, 3, 2).reshape([n, o] + out)
    if bias is not None:
        y = y + bias.reshape([1, o] + [1] * len(out))
    return y.contiguous()


def _spread(x, stride):
    """x with stride-1 zeros between its elements along each spatial dim."""
    if all(s == 1 for s in stride):
        return x
    nd = len(stride)
    shape = list(x.shape[:2]) + [(x.shape[2 + i] - 1) * stride[i] + 1 for i in range(nd)]
    z = torch.zeros(shape, dtype=x.dtype, device=x.device)
    view = z
    for i, s in enumerate(stride):
        view = aten.slice.Tensor(view, 2 + i, 0, None, s)
    view.copy_(x)
    return z


def _conv_transpose(x, weight, bias, stride, padding, output_padding, dilation, groups):
    nd = weight.dim() - 2
    kernel = list(weight.shape[2:])
    cin, og = weight.shape[0], weight.shape[1]
    # (C_in, O/G, *k) -> (O, C_in/G, *k), flipped in space
    w = weight.reshape([groups, cin // groups, og] + kernel).transpose(1, 2)
    w = w.reshape([groups * og, cin // groups] + kernel)
    w = w.flip(list(range(2, 2 + nd)))
    z = _spread(x, stride)
    pads = []
    for i in reversed(range(nd)):
        lo = dilation[i] * (kernel[i] - 1) - padding[i]
        pads += [lo, lo + output_padding[i]]
    z = aten.constant_pad_nd.default(z, pads, 0.0)
    return _conv(z, w, bias, [1] * nd, [0] * nd, dilation, groups)


def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    if input.dim() != weight.dim() or input.dim() not in (3, 4, 5):
        return NotImplemented
    if transposed:
        return _conv_transpose(input, weight, bias, stride, padding, output_padding, dilation, groups)
    return _conv(input, weight, bias, stride, padding, dilation, groups)


def convolution_backward(
    grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask
):
    """Gradients of a (non-transposed) convolution: the input's is a transposed convolution of
    the output gradient, the weight's a product of the output gradient with the im2col rows."""
    if transposed or input.dim() not in (3, 4, 5):
        return NotImplemented
    nd = input.dim() - 2
    kernel = list(weight.shape[2:])
    n, o = grad_output.shape[:2]
    g_in = g_w = g_b = None
    if output_mask[0]:
        # output_padding recovers the input positions the forward's floor division dropped
        op = [
            input.shape[2 + i]
            + 2 * padding[i]
            - dilation[i] * (kernel[i] - 1)
            - 1
            - (grad_output.shape[2 + i] - 1) * stride[i]
            for i in range(nd)
        ]
        g_in = _conv_transpose(grad_output, weight, None, stride, padding, op, dilation, groups)
    if output_mask[1]:
        cols, out = _cols(input, kernel, stride, padding, dilation, groups)  # (G, N*P, C/G*K)
        p = math.prod(out)
        go = grad_output.reshape(n, groups, o // groups, p).permute(1, 2, 0, 3).reshape(groups, o // groups, n * p)
        g_w = torch.bmm(go, cols).reshape(weight.shape)
    if output_mask[2]:
        g_b = grad_output.sum([0] + list(range(2, 2 + nd)))
    return g_in, g_w, g_b


def _pool_geometry(x, kernel_size, stride, padding, ceil_mode, nd):
    k = list(kernel_size) * (nd if len(kernel_size) == 1 else 1)
    s = list(stride) if stride else k
    s = s * (nd if len(s) == 1 else 1)
    p = list(padding) * (nd if len(padding) == 1 else 1)
    out = []
    for i in range(nd):
        size = x.shape[-nd + i]
        num = size + 2 * p[i] - k[i]
        o = (-(-num // s[i]) if ceil_mode else num // s[i]) + 1
        if ceil_mode and (o - 1) * s[i] >= size + p[i]:  # the last window must start inside the input
            o -= 1
        out.append(o)
    return k, s, p, out


def avg_pool(
    nd: int, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None
):
    """avg_pool1d/2d/3d: sum over the window view of the zero-padded input, divided by the window
    size PyTorch uses (the padded window clipped to input+padding, or only the input part when
    count_include_pad is False, or divisor_override)."""
    padding = [padding] if isinstance(padding, int) else list(padding)
    k, s, p, out = _pool_geometry(x, kernel_size, stride, padding, ceil_mode, nd)
    batched = x.dim() == nd + 2
    xb = x if batched else x.unsqueeze(0)
    lead = list(xb.shape[:2])
    # pad generously on the high side so ceil_mode windows stay inside the view
    pads = []
    for i in reversed(range(nd)):
        need = (out[i] - 1) * s[i] + k[i] - (xb.shape[2 + i] + p[i])
        pads += [p[i], max(p[i], need)]
    padded = aten.constant_pad_nd.default(xb, pads, 0.0).contiguous()
    win, _ = _windows(padded, k, s, [1] * nd)
    win = aten.slice.Tensor(win, 2, 0, out[0]) if nd >= 1 else win
    for i in range(1, nd):
        win = aten.slice.Tensor(win, 2 + i, 0, out[i])
    total = win.sum(list(range(2 + nd, 2 + 2 * nd)))
    if divisor_override:
        y = total / divisor_override
    else:
        # per output position along each dim: the window's extent within input+padding (or input only)
        div = None
        for i in range(nd):
            start = torch.arange(out[i], device=x.device, dtype=torch.int64) * s[i] - p[i]
            size = xb.shape[2 + i]
            end = torch.clamp(start + k[i], max=size + p[i])
            if count_include_pad:
                cnt = end - start
            else:
                cnt = torch.clamp(end, max=size) - torch.clamp(start, min=0)
            shape = [1] * (2 + nd)
            shape[2 + i] = out[i]
            cnt = cnt.to(x.dtype).reshape(shape)
            div = cnt if div is None else div * cnt
        y = total / div
    y = y.reshape(lead + out).contiguous()
    return y if batched else y.squeeze(0)


def weight_norm_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    """_weight_norm_interface's backward (w = g * v / ||v||, the norm over every dim but `dim`):
    PyTorch has kernels for CPU and CUDA only, and no decomposition (Wav2Vec2's convolutional
    position embedding is weight-normalised)."""
    dims = [d for d in range(saved_v.dim()) if d != dim % saved_v.dim()]
    norms = saved_norms.reshape(saved_g.shape)
    dot = (grad_w * saved_v).sum(dims, keepdim=True)
    grad_g = dot / norms
    grad_v = (saved_g / norms) * (grad_w - saved_v * (dot / (norms * norms)))
    return grad_v, grad_g


def grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """torch._grouped_mm (mixture-of-experts layers: one GEMM per expert over its slice of the
    tokens) as one mm per group; `offs` are the groups' cumulative ends along the grouped dim:
    a's rows (2D x 3D), b's columns (3D x 2D), or the shared dim (2D x 2D, the weight gradient:
    one (K, N) product per group). Rows no group covers are zero."""
    if bias is not None or (out_dtype is not None and out_dtype != mat_a.dtype):
        return NotImplemented
    if mat_a.dim() == 3 and mat_b.dim() == 3:
        return torch.bmm(mat_a, mat_b)
    ends = [int(e) for e in offs.tolist()]
    spans = list(zip([0] + ends[:-1], ends, strict=True))
    if mat_a.dim() == 2 and mat_b.dim() == 3:
        out = mat_a.new_zeros(mat_a.shape[0], mat_b.shape[-1])
        for g, (s, e) in enumerate(spans):
            if e > s:
                out[s:e] = torch.mm(mat_a[s:e], mat_b[g])
    elif mat_a.dim() == 3:
        out = mat_a.new_zeros(mat_a.shape[1], mat_b.shape[-1])
        for g, (s, e) in enumerate(spans):
            if e > s:
                out[:, s:e] = torch.mm(mat_a[g], mat_b[:, s:e])
    else:
        out = mat_a.new_zeros(len(spans), mat_a.shape[0], mat_b.shape[-1])
        for g, (s, e) in enumerate(spans):
            if e > s:
                out[g] = torch.mm(mat_a[:, s:e], mat_b[s:e])
    return out


def _eval_saves_empty(decomposition):
    """PyTorch's batch norm decompositions return saved statistics of shape [C] in inference, where its CPU
    kernel (and so every caller's expectation) returns empty ones."""

    def run(x, weight, bias, running_mean, running_var, training, momentum, eps):
        out, mean, invstd = decomposition(x, weight, bias, running_mean, running_var, training, momentum, eps)
        if training:
            return out, mean, invstd
        return out, mean.new_empty((0,)), invstd.new_empty((0,))

    return run


def _no_training_saves_empty(decomposition):
    def run(x, weight, bias, running_mean, running_var, momentum, eps):
        out, mean, invstd = decomposition(x, weight, bias, running_mean, running_var, momentum, eps)
        return out, mean.new_empty((0,)), invstd.new_empty((0,))

    return run


def _multilabel_margin_1d(decomposition):
    """PyTorch's decomposition gives a 1-D input's unreduced loss shape [1]; its CPU kernel gives []."""

    def run(x, target, reduction):
        loss, is_target = decomposition(x, target, reduction)
        if x.dim() <= 1 and loss.dim() == 1:
            loss = loss.reshape(())
        return loss, is_target

    return run


def register(table: dict) -> None:
    for op, fix in (
        (aten.native_batch_norm.default, _eval_saves_empty),
        (aten._native_batch_norm_legit.default, _eval_saves_empty),
        (aten._native_batch_norm_legit_no_training.default, _no_training_saves_empty),
        (aten.multilabel_margin_loss_forward.default, _multilabel_margin_1d),
    ):
        if table.get(op) is not None:
            table[op] = fix(table[op])
    table[aten._grouped_mm.default] = grouped_mm
    table[aten._weight_norm_interface_backward.default] = weight_norm_backward
    table[aten.convolution.default] = convolution
    table[aten.convolution_backward.default] = convolution_backward
    table[aten.avg_pool2d.default] = functools.partial(avg_pool, 2)
    table[aten.avg_pool3d.default] = functools.partial(avg_pool, 3)
