// graphattn: the backward of the SBM edge gate, compiled for the CPU
// (graphattn/producers/sbm/gate.py::_EdgeGate).
//
// sbm_gate_backward(Y [R, k], W [S, k], rows_q [E], rows_k [E], grad [E], need_y, need_w)
//   -> (gY [R, k], gW [S, k]):
//   gY[r] = sum_{e: rows_q[e] = r} grad[e] W[rows_k[e]],   gW[s] = sum_{e: rows_k[e] = s} grad[e] Y[rows_q[e]]
// the two sparse-dense products of p_e = Y[rows_q[e]] . W[rows_k[e]] (zeros where an output is not
// needed: an empty tensor). Each output is accumulated in edge order by one thread (the two outputs
// on two threads when both are needed and there are threads), so the sums are deterministic; rows
// of an edge's graph stay in cache, since no SBM edge leaves its graph. torch.sparse.mm of a COO
// matrix did the same in about 80 ns per edge and output at k = 128.

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <cstdint>
#include <tuple>

namespace graphattn_sbm_gate {

// out[dst[e]] += g[e] * in[src[e]] for every edge, rows of k values
template <typename T>
void accumulate(T* out, const T* in, const int64_t* dst, const int64_t* src, const T* g, int64_t E,
                int64_t k) {
  for (int64_t e = 0; e < E; ++e) {
    const T w = g[e];
    T* __restrict o = out + dst[e] * k;
    const T* __restrict x = in + src[e] * k;
    for (int64_t c = 0; c < k; ++c) o[c] += w * x[c];
  }
}

void check_rows(const at::Tensor& rows, int64_t E, int64_t bound, const char* name) {
  TORCH_CHECK(rows.device().is_cpu() && rows.scalar_type() == at::kLong && rows.dim() == 1 &&
                  rows.numel() == E && rows.is_contiguous(),
              "graphattn sbm_gate_backward: '", name, "' must be a contiguous int64 CPU tensor of ",
              E, " entries");
  const int64_t* p = rows.const_data_ptr<int64_t>();
  for (int64_t e = 0; e < E; ++e) {
    TORCH_CHECK(p[e] >= 0 && p[e] < bound, "graphattn sbm_gate_backward: '", name, "'[", e,
                "] = ", p[e], " is out of range [0, ", bound, ")");
  }
}

std::tuple<at::Tensor, at::Tensor> gate_backward(const at::Tensor& Y, const at::Tensor& W,
                                                 const at::Tensor& rows_q, const at::Tensor& rows_k,
                                                 const at::Tensor& grad, bool need_y, bool need_w) {
  TORCH_CHECK(Y.device().is_cpu() && W.device().is_cpu() && Y.dim() == 2 && W.dim() == 2 &&
                  Y.size(1) == W.size(1) && Y.scalar_type() == W.scalar_type() &&
                  (Y.scalar_type() == at::kFloat || Y.scalar_type() == at::kDouble),
              "graphattn sbm_gate_backward: 'Y' and 'W' must be float32/float64 CPU matrices with "
              "the same number of columns and dtype");
  const int64_t E = grad.numel(), k = Y.size(1);
  TORCH_CHECK(grad.device().is_cpu() && grad.dim() == 1 && grad.scalar_type() == Y.scalar_type(),
              "graphattn sbm_gate_backward: 'grad' must be a 1-D CPU tensor of Y's dtype");
  check_rows(rows_q, E, Y.size(0), "rows_q");
  check_rows(rows_k, E, W.size(0), "rows_k");
  const at::Tensor y = Y.contiguous(), w = W.contiguous(), g = grad.contiguous();
  at::Tensor gY = need_y ? at::zeros(Y.sizes(), Y.options()) : at::empty({0}, Y.options());
  at::Tensor gW = need_w ? at::zeros(W.sizes(), W.options()) : at::empty({0}, W.options());
  const int64_t* rq = rows_q.const_data_ptr<int64_t>();
  const int64_t* rk = rows_k.const_data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES(Y.scalar_type(), "sbm_gate_backward", [&] {
    const scalar_t* py = y.const_data_ptr<scalar_t>();
    const scalar_t* pw = w.const_data_ptr<scalar_t>();
    const scalar_t* pg = g.const_data_ptr<scalar_t>();
    auto job = [&](int64_t which) {
      if (which == 0 && need_y) accumulate(gY.mutable_data_ptr<scalar_t>(), pw, rq, rk, pg, E, k);
      if (which == 1 && need_w) accumulate(gW.mutable_data_ptr<scalar_t>(), py, rk, rq, pg, E, k);
    };
    at::parallel_for(0, 2, 1, [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i) job(i);
    });
  });
  return {gY, gW};
}

}  // namespace graphattn_sbm_gate

TORCH_LIBRARY_FRAGMENT(graphattn_fused, m) {
  m.def("sbm_gate_backward(Tensor Y, Tensor W, Tensor rows_q, Tensor rows_k, Tensor grad, "
        "bool need_y, bool need_w) -> (Tensor, Tensor)",
        &graphattn_sbm_gate::gate_backward);
}
