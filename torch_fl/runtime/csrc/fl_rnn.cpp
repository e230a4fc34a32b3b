// fl_rnn.cpp — the fused LSTM and GRU cells as compositions of elementwise ops, for every device.
//
// PyTorch's recurrent layers call, for a PrivateUse1 tensor, the fused cell ops that only CUDA implements
// (aten/src/ATen/native/RNN.cpp picks _thnn_fused_lstm_cell for CUDA, XPU and PrivateUse1 inputs); torch_fl's
// decompositions (dispatch/decompositions/rnn.py) serve them with these ops. They are PyTorch composites
// (CompositeExplicitAutograd): on fl tensors each sub-op is dispatched to the device as any op is, and on
// CPU tensors they are a host kernel the CPU fallback can run whole where the device computes none of the
// dtypes (float64 on a float32 chip): one round trip per cell instead of one per sub-op. Being C++, a cell
// costs no Python per sub-op either way.
//
// The arithmetic is rnn.py's of before, op for op (x - 1 is rsub, as Python's `1 - x`), so the bits are
// what they were. The workspace layout is CUDA's (aten/src/ATen/native/cuda/RNN.cu), so the forward and
// backward ops stay interchangeable with a vendor's native kernels of the same names:
//   LSTM: workspace (B, 4H) = the activated gates [input, forget, cell, output];
//   GRU:  workspace (B, 5H) = [reset, update, new gate, hx, hidden new-gate part].
#include <optional>
#include <tuple>

#include <ATen/ATen.h>
#include <torch/library.h>

namespace {

using at::Tensor;

Tensor one_minus(const Tensor& x) { return at::rsub(x, 1); }

std::tuple<Tensor, Tensor, Tensor> lstm_cell(const Tensor& input_gates, const Tensor& hidden_gates, const Tensor& cx,
                                             const std::optional<Tensor>& input_bias,
                                             const std::optional<Tensor>& hidden_bias) {
  Tensor gates = at::add(input_gates, hidden_gates);
  if (input_bias.has_value() && input_bias->defined()) gates = at::add(gates, *input_bias);
  if (hidden_bias.has_value() && hidden_bias->defined()) gates = at::add(gates, *hidden_bias);
  auto chunks = gates.chunk(4, 1);
  Tensor i = at::sigmoid(chunks[0]), f = at::sigmoid(chunks[1]), g = at::tanh(chunks[2]), o = at::sigmoid(chunks[3]);
  Tensor cy = at::add(at::mul(f, cx), at::mul(i, g));
  Tensor hy = at::mul(o, at::tanh(cy));
  return {hy, cy, at::cat({i, f, g, o}, 1)};
}

// (grad_gates, grad_cx, grad_bias): grad_gates serves both gate GEMMs' inputs.
std::tuple<Tensor, Tensor, Tensor> lstm_cell_backward(const std::optional<Tensor>& grad_hy_opt,
                                                      const std::optional<Tensor>& grad_cy, const Tensor& cx,
                                                      const Tensor& cy, const Tensor& workspace, bool has_bias) {
  auto w = workspace.chunk(4, 1);
  const Tensor &i = w[0], &f = w[1], &g = w[2], &o = w[3];
  Tensor tanh_cy = at::tanh(cy);
  Tensor grad_hy = grad_hy_opt.has_value() && grad_hy_opt->defined() ? *grad_hy_opt : at::zeros_like(cy);
  Tensor grad_c = at::mul(at::mul(grad_hy, o), one_minus(at::mul(tanh_cy, tanh_cy)));
  if (grad_cy.has_value() && grad_cy->defined()) grad_c = at::add(grad_c, *grad_cy);
  Tensor grad_gates = at::cat({
      at::mul(at::mul(at::mul(grad_c, g), i), one_minus(i)),
      at::mul(at::mul(at::mul(grad_c, cx), f), one_minus(f)),
      at::mul(at::mul(grad_c, i), one_minus(at::mul(g, g))),
      at::mul(at::mul(at::mul(grad_hy, tanh_cy), o), one_minus(o)),
  }, 1);
  Tensor grad_bias = has_bias ? grad_gates.sum(0) : Tensor();
  return {grad_gates, at::mul(grad_c, f), grad_bias};
}

// (hy, workspace) of one GRU step; the reset gate scales only the hidden part of the new gate.
std::tuple<Tensor, Tensor> gru_cell(const Tensor& input_gates_in, const Tensor& hidden_gates_in, const Tensor& hx,
                                    const std::optional<Tensor>& input_bias,
                                    const std::optional<Tensor>& hidden_bias) {
  Tensor input_gates = input_gates_in, hidden_gates = hidden_gates_in;
  if (input_bias.has_value() && input_bias->defined()) input_gates = at::add(input_gates, *input_bias);
  if (hidden_bias.has_value() && hidden_bias->defined()) hidden_gates = at::add(hidden_gates, *hidden_bias);
  auto in = input_gates.chunk(3, 1);
  auto hid = hidden_gates.chunk(3, 1);
  Tensor r = at::sigmoid(at::add(in[0], hid[0]));
  Tensor z = at::sigmoid(at::add(in[1], hid[1]));
  Tensor n = at::tanh(at::add(in[2], at::mul(r, hid[2])));
  Tensor hy = at::add(n, at::mul(z, at::sub(hx, n)));
  return {hy, at::cat({r, z, n, hx, hid[2]}, 1)};
}

// (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> gru_cell_backward(const Tensor& grad_hy, const Tensor& workspace,
                                                                     bool has_bias) {
  auto w = workspace.chunk(5, 1);
  const Tensor &r = w[0], &z = w[1], &n = w[2], &hx = w[3], &hn = w[4];
  Tensor grad_z = at::mul(at::mul(at::mul(grad_hy, at::sub(hx, n)), z), one_minus(z));
  Tensor grad_n = at::mul(at::mul(grad_hy, one_minus(z)), one_minus(at::mul(n, n)));
  Tensor grad_r = at::mul(at::mul(at::mul(grad_n, hn), r), one_minus(r));
  Tensor grad_input = at::cat({grad_r, grad_z, grad_n}, 1);
  Tensor grad_hidden = at::cat({grad_r, grad_z, at::mul(grad_n, r)}, 1);
  Tensor grad_hx = at::mul(grad_hy, z);
  if (!has_bias) return {grad_input, grad_hidden, grad_hx, Tensor(), Tensor()};
  return {grad_input, grad_hidden, grad_hx, grad_input.sum(0), grad_hidden.sum(0)};
}

}  // namespace

// The schemas are the aten cells' own, so a decomposition and the CPU fallback call them as they would the
// aten op.
TORCH_LIBRARY(fl_rnn, m) {
  m.def("lstm_cell(Tensor input_gates, Tensor hidden_gates, Tensor cx, Tensor? input_bias=None, "
        "Tensor? hidden_bias=None) -> (Tensor, Tensor, Tensor)");
  m.def("lstm_cell_backward(Tensor? grad_hy, Tensor? grad_cy, Tensor cx, Tensor cy, Tensor workspace, "
        "bool has_bias) -> (Tensor, Tensor, Tensor)");
  m.def("gru_cell(Tensor input_gates, Tensor hidden_gates, Tensor hx, Tensor? input_bias=None, "
        "Tensor? hidden_bias=None) -> (Tensor, Tensor)");
  m.def("gru_cell_backward(Tensor grad_hy, Tensor workspace, bool has_bias) -> (Tensor, Tensor, Tensor, Tensor, "
        "Tensor)");
}

TORCH_LIBRARY_IMPL(fl_rnn, CompositeExplicitAutograd, m) {
  m.impl("lstm_cell", lstm_cell);
  m.impl("lstm_cell_backward", lstm_cell_backward);
  m.impl("gru_cell", gru_cell);
  m.impl("gru_cell_backward", gru_cell_backward);
}
