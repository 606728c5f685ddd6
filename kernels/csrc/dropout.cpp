// graphattn: dropout with a counter-based random stream, for the CPU.
//
//   out_i = x_i * keep_i / (1 - p),   keep_i = [ u(seed, i) >= p * 2^32 ],
//
// where u(seed, i) is a 32-bit hash of the element index i keyed by the 64-bit ``seed`` (a
// one-element int64 CPU tensor, drawn from torch's generator by the caller; see word() below). The mask is a pure function
// of (seed, i): it is the same whatever the number of threads or the split of the work, so the
// backward pass recomputes it from the seed instead of storing it (grad_x = dropout_apply(grad_out,
// p, seed)). torch's own CPU dropout draws one Bernoulli variate per element from the sequential
// Mersenne Twister, a few nanoseconds each on one thread; this kernel is vectorisable and runs on
// every thread.

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace graphattn_dropout {

// Two rounds of the "lowbias32" integer finalizer (C. Wellons' hash-prospector): 32-bit multiplies
// and shifts only, so the loop below vectorises (8 lanes with AVX2).
inline uint32_t mix32(uint32_t z) {
  z ^= z >> 16;
  z *= 0x7FEB352DU;
  z ^= z >> 15;
  z *= 0x846CA68BU;
  z ^= z >> 16;
  return z;
}

// u(seed, i) for the 64-bit element index i = hi * 2^32 + lo
inline uint32_t word(uint32_t lo, uint32_t key_lo, uint32_t key_hi) {
  return mix32(mix32(lo * 0x9E3779B9U + key_lo) ^ key_hi);
}

// out[t] = x[t] * keep * scale for the elements base + t, t < len, of one run (a plain function, not
// the lambda, so that the compiler sees the restrict-qualified pointers and vectorises the loop)
template <typename T>
void run(const T* __restrict x, T* __restrict out, int64_t len, uint32_t base, uint32_t key_lo,
         uint32_t key_hi, uint32_t threshold, T scale) {
  for (int64_t t = 0; t < len; ++t) {  // branch-free
    const uint32_t u = word(base + static_cast<uint32_t>(t), key_lo, key_hi);
    const T m = u >= threshold ? scale : T(0);
    out[t] = x[t] * m;
  }
}

// out = x * keep * scale over the contiguous elements [0, n)
template <typename T>
void apply(const T* x, T* out, int64_t n, uint64_t seed, uint32_t threshold, T scale) {
  const uint32_t seed_lo = static_cast<uint32_t>(seed), seed_hi = static_cast<uint32_t>(seed >> 32);
  at::parallel_for(0, n, 1 << 14, [&](int64_t i0, int64_t i1) {
    int64_t i = i0;
    while (i < i1) {  // runs that share the high 32 bits of the index
      const uint64_t hi = static_cast<uint64_t>(i) >> 32;
      const int64_t stop = std::min<int64_t>(i1, static_cast<int64_t>((hi + 1) << 32));
      const uint32_t key_hi = seed_hi ^ mix32(static_cast<uint32_t>(hi) + 0x632BE5ABU);
      run<T>(x + i, out + i, stop - i, static_cast<uint32_t>(i), seed_lo, key_hi, threshold, scale);
      i = stop;
    }
  });
}

at::Tensor dropout_apply(const at::Tensor& x, double p, const at::Tensor& seed_tensor) {
  TORCH_CHECK(x.device().is_cpu() && seed_tensor.device().is_cpu(),
              "graphattn dropout_apply: CPU tensors only");
  TORCH_CHECK(seed_tensor.numel() == 1 && seed_tensor.scalar_type() == at::kLong,
              "graphattn dropout_apply: seed must be one int64 element");
  const int64_t seed = *seed_tensor.const_data_ptr<int64_t>();  // a CPU read, no dispatch
  TORCH_CHECK(p >= 0.0 && p < 1.0, "graphattn dropout_apply: p must be in [0, 1), got ", p);
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty_like(xc);
  const int64_t n = xc.numel();
  if (n == 0) return out;
  // keep iff the 32-bit word is >= round(p * 2^32): the keep probability is 1 - p up to 2^-33
  // (p < 1 - 2^-33 here; p = 1 is F.dropout's job)
  const uint64_t t64 = static_cast<uint64_t>(std::llround(p * 4294967296.0));
  TORCH_CHECK(t64 <= 0xFFFFFFFFULL, "graphattn dropout_apply: p too close to 1");
  const uint32_t threshold = static_cast<uint32_t>(t64);
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "graphattn_dropout", [&] {
    const scalar_t scale = static_cast<scalar_t>(1.0 / (1.0 - p));
    apply<scalar_t>(xc.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), n,
                    static_cast<uint64_t>(seed), threshold, scale);
  });
  return out;
}

}  // namespace graphattn_dropout

TORCH_LIBRARY_FRAGMENT(graphattn_fused, m) {
  m.def("dropout_apply(Tensor x, float p, Tensor seed) -> Tensor", &graphattn_dropout::dropout_apply);
}
