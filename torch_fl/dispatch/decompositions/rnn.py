"""The fused LSTM and GRU cells, as elementwise ops, for every backend.

PyTorch's recurrent layers (nn.LSTM, nn.GRU, nn.LSTMCell, nn.GRUCell) run a
composite loop on the CPU, but for a PrivateUse1 tensor they call the fused
cell ops that only CUDA implements (aten/src/ATen/native/RNN.cpp picks
`_thnn_fused_lstm_cell` for CUDA, XPU and PrivateUse1 inputs). Nothing on the
host can run them, so without these decompositions every recurrent model
fails on fl. The forward ops add the two gate GEMM results and apply the
gate nonlinearities; their backward ops are the ones autograd calls when no
double backward is needed, and read the same `workspace` layout CUDA's
kernels write (aten/src/ATen/native/cuda/RNN.cu), so the pair stays
interchangeable with a vendor's native kernels of the same names:

* LSTM: workspace (B, 4H) = the activated gates [input, forget, cell, output];
* GRU: workspace (B, 5H) = [reset, update, new gate, hx, hidden new-gate part].

Everything here is add/mul/sigmoid/tanh/cat/sum, which even the `minimal`
chip has."""

from __future__ import annotations

import torch

aten = torch.ops.aten


def _gates(input_gates, hidden_gates, input_bias, hidden_bias):
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias
    if hidden_bias is not None:
        gates = gates + hidden_bias
    return gates


def lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """(hy, cy, workspace) of one LSTM step from the precomputed gate GEMMs."""
    i, f, g, o = _gates(input_gates, hidden_gates, input_bias, hidden_bias).chunk(4, 1)
    i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
    cy = f * cx + i * g
    hy = o * torch.tanh(cy)
    return hy, cy, torch.cat([i, f, g, o], 1)


def lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    """(grad_gates, grad_cx, grad_bias): grad_gates serves both gate GEMMs' inputs."""
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = torch.tanh(cy)
    if grad_hy is None:
        grad_hy = torch.zeros_like(cy)
    grad_c = grad_hy * o * (1 - tanh_cy * tanh_cy)
    if grad_cy is not None:
        grad_c = grad_c + grad_cy
    grad_gates = torch.cat([
        grad_c * g * i * (1 - i),
        grad_c * cx * f * (1 - f),
        grad_c * i * (1 - g * g),
        grad_hy * tanh_cy * o * (1 - o),
    ], 1)
    grad_bias = grad_gates.sum(0) if has_bias else None
    return grad_gates, grad_c * f, grad_bias


def gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """(hy, workspace) of one GRU step; the reset gate scales only the hidden part of the new gate."""
    if input_bias is not None:
        input_gates = input_gates + input_bias
    if hidden_bias is not None:
        hidden_gates = hidden_gates + hidden_bias
    ir, ii, in_ = input_gates.chunk(3, 1)
    hr, hi, hn = hidden_gates.chunk(3, 1)
    r = torch.sigmoid(ir + hr)
    z = torch.sigmoid(ii + hi)
    n = torch.tanh(in_ + r * hn)
    hy = n + z * (hx - n)
    return hy, torch.cat([r, z, n, hx, hn], 1)


def gru_cell_backward(grad_hy, workspace, has_bias):
    """(grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias)."""
    r, z, n, hx, hn = workspace.chunk(5, 1)
    grad_z = grad_hy * (hx - n) * z * (1 - z)
    grad_n = grad_hy * (1 - z) * (1 - n * n)
    grad_r = grad_n * hn * r * (1 - r)
    grad_input = torch.cat([grad_r, grad_z, grad_n], 1)
    grad_hidden = torch.cat([grad_r, grad_z, grad_n * r], 1)
    if has_bias:
        return grad_input, grad_hidden, grad_hy * z, grad_input.sum(0), grad_hidden.sum(0)
    return grad_input, grad_hidden, grad_hy * z, None, None


def register(table: dict) -> None:
    table[aten._thnn_fused_lstm_cell.default] = lstm_cell
    table[aten._thnn_fused_lstm_cell_backward_impl.default] = lstm_cell_backward
    table[aten._thnn_fused_gru_cell.default] = gru_cell
    table[aten._thnn_fused_gru_cell_backward.default] = gru_cell_backward
