// graphattn: the first-order linear recurrence of the Converter's shift operator, in place.
//
//   forward:  h_t = a_t h_{t-1} + b_t   (h_{-1} = 0)      reverse:  h_t = a_t h_{t+1} + b_t   (h_L = 0)
//
// for a [L] (one coefficient per step, shared by the F columns) and b [L, F], real or complex, float
// or double. Each column is an independent sequential recurrence (exactly the left-to-right order of
// the definition) computed by the same code whatever the thread split, so the result does not depend
// on the number of threads: threads take disjoint fixed blocks of 16 columns. The torch fallback (kernels/linear_scan.py, _scan_) is a blocked
// two-level scan of the same recurrence; the two agree to rounding.

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/complex.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

namespace graphattn_scan {

// The columns [f0, f0 + W) of b; W = kBlock for every block but the last, so each column is always
// computed by the same code (the same vectorisation and contraction), whatever the thread split.
template <typename T, int64_t W>
void scan_block(const T* a, T* b, int64_t L, int64_t F, int64_t f0, int64_t w, bool reverse) {
  const int64_t width = W > 0 ? W : w;
  if (reverse) {
    for (int64_t t = L - 2; t >= 0; --t) {
      const T at = a[t];
      T* cur = b + t * F + f0;
      const T* nxt = b + (t + 1) * F + f0;
      for (int64_t f = 0; f < width; ++f) cur[f] += at * nxt[f];
    }
  } else {
    for (int64_t t = 1; t < L; ++t) {
      const T at = a[t];
      T* cur = b + t * F + f0;
      const T* prv = b + (t - 1) * F + f0;
      for (int64_t f = 0; f < width; ++f) cur[f] += at * prv[f];
    }
  }
}

constexpr int64_t kBlock = 16;

void linear_scan_(const at::Tensor& a, const at::Tensor& b, bool reverse) {
  TORCH_CHECK(a.device().is_cpu() && b.device().is_cpu(), "graphattn linear_scan_: CPU tensors only");
  TORCH_CHECK(a.dim() == 1 && b.dim() == 2 && b.size(0) == a.size(0),
              "graphattn linear_scan_: a must be [L] and b [L, F]");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "graphattn linear_scan_: a and b differ in dtype");
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous(), "graphattn linear_scan_: contiguous tensors only");
  const int64_t L = b.size(0), F = b.size(1);
  if (L < 2 || F == 0) return;
  const int64_t blocks = (F + kBlock - 1) / kBlock;
  // one task per block of columns once there is enough work to pay for the fork
  const int64_t grain = L * F >= (1 << 15) ? 1 : blocks;
  AT_DISPATCH_FLOATING_AND_COMPLEX_TYPES(b.scalar_type(), "graphattn_linear_scan", [&] {
    const scalar_t* pa = a.data_ptr<scalar_t>();
    scalar_t* pb = b.data_ptr<scalar_t>();
    at::parallel_for(0, blocks, grain, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) {
        const int64_t f0 = k * kBlock, w = std::min(kBlock, F - f0);
        if (w == kBlock)
          scan_block<scalar_t, kBlock>(pa, pb, L, F, f0, w, reverse);
        else
          scan_block<scalar_t, 0>(pa, pb, L, F, f0, w, reverse);
      }
    });
  });
}

}  // namespace graphattn_scan

TORCH_LIBRARY_FRAGMENT(graphattn_fused, m) {
  m.def("linear_scan_(Tensor a, Tensor(a!) b, bool reverse) -> ()", &graphattn_scan::linear_scan_);
}
