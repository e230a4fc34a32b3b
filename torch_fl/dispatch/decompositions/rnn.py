"""The fused LSTM and GRU cells, for every backend.

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

Everything is add/mul/sigmoid/tanh/cat/sum, which even the `minimal` chip
has. The arithmetic is C++ (runtime/csrc/fl_rnn.cpp, the `fl_rnn` ops with the
aten cells' schemas: PyTorch composites, so each sub-op goes to the device as
any op does, with no Python per sub-op). The same ops on host tensors are the
cells' host kernels (HOST_KERNELS): where the device computes none of the
dtypes (float64 on a float32 chip), the CPU fallback runs a whole cell in one
round trip (dispatch.plan)."""

from __future__ import annotations

import torch

aten = torch.ops.aten

# aten cell -> the fl_rnn op computing it (loaded with the C++ core, so looked up at the first call)
_CELLS = {
    aten._thnn_fused_lstm_cell.default: "lstm_cell",
    aten._thnn_fused_lstm_cell_backward_impl.default: "lstm_cell_backward",
    aten._thnn_fused_gru_cell.default: "gru_cell",
    aten._thnn_fused_gru_cell_backward.default: "gru_cell_backward",
}


def host_kernel(func):
    """The op that computes the aten cell `func` on host tensors (the CPU has no kernel of its own for the
    fused cells), or None for any other op."""
    name = _CELLS.get(func)
    return getattr(torch.ops.fl_rnn, name).default if name is not None else None


def _cell(name: str):
    def cell(*args, **kwargs):
        return getattr(torch.ops.fl_rnn, name).default(*args, **kwargs)

    cell.__name__ = name
    cell.__doc__ = f"aten's fused cell as fl_rnn::{name} (runtime/csrc/fl_rnn.cpp)."
    return cell


lstm_cell = _cell("lstm_cell")
lstm_cell_backward = _cell("lstm_cell_backward")
gru_cell = _cell("gru_cell")
gru_cell_backward = _cell("gru_cell_backward")


def register(table: dict) -> None:
    table[aten._thnn_fused_lstm_cell.default] = lstm_cell
    table[aten._thnn_fused_lstm_cell_backward_impl.default] = lstm_cell_backward
    table[aten._thnn_fused_gru_cell.default] = gru_cell
    table[aten._thnn_fused_gru_cell_backward.default] = gru_cell_backward
