// Helpers shared by the fused CPU kernels (edge_attention.cpp, edge_attention_blocked.cpp).
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace graphattn_csrc {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

constexpr int64_t kPrefetch = 8;  // edges ahead (across row boundaries within a thread's range)

// Prefetches the n elements at p into the cache (one request per 64-byte line).
template <typename T>
inline void prefetch_row(const T* p, int64_t n) {
  const char* c = reinterpret_cast<const char*>(p);
  const int64_t bytes = n * static_cast<int64_t>(sizeof(T));
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 1);
}

// Row r of a [rows, width] array that the entries of a layout gather: base + r * width.
template <typename T>
struct Gathered {
  const T* base;
  int64_t width;
};
template <typename T>
inline Gathered<T> gathered(const T* base, int64_t width) {
  return {base, width};
}

// The entries c = c0 .. c0 + n - 1 of a row of a compressed layout, in order: f(c - c0, idx[c]),
// prefetching row idx[c + kPrefetch] of each of the arrays `rows` while c + kPrefetch < c_end (the
// end of the thread's range: the prefetch runs on across row boundaries). The prefetches are made
// here rather than by a callback: the compiler may drop a call to a function that only prefetches.
template <typename F, typename... T>
inline void for_each_entry(const int32_t* idx, int64_t c0, int64_t n, int64_t c_end, const F& f,
                           Gathered<T>... rows) {
  for (int64_t t = 0; t < n; ++t) {
    const int64_t c = c0 + t;
    if (c + kPrefetch < c_end) {
      const int64_t ahead = idx[c + kPrefetch];
      (prefetch_row(rows.base + ahead * rows.width, rows.width), ...);
    }
    f(t, static_cast<int64_t>(idx[c]));
  }
}

// Rows 0 .. R - 1 of a compressed layout (entries of row r: ptr[r] .. ptr[r + 1]) are cut into
// contiguous chunks of about equal cost (entries + rows), 16 per thread, which the threads take from
// a shared counter (dynamic scheduling: a thread that the OS preempts on a busy machine does not hold
// the others up). Every row is computed by one thread in a fixed order, so results depend neither on
// the number of threads nor on the schedule.
template <typename F>
void parallel_rows(const int32_t* ptr, int64_t R, const F& f) {
  if (R <= 0) return;
  const int64_t threads = at::get_num_threads();
  const int64_t parts = std::min<int64_t>(threads == 1 ? 1 : 16 * threads, R);
  if (parts <= 1) {
    f(0, R);
    return;
  }
  std::vector<int64_t> bounds(parts + 1, 0);
  bounds[parts] = R;
  const int64_t base = ptr[0];
  const int64_t total = static_cast<int64_t>(ptr[R]) - base + R;
  for (int64_t p = 1; p < parts; ++p) {
    const int64_t target = total * p / parts;
    int64_t lo = bounds[p - 1], hi = R;  // first r with ptr[r] - base + r >= target
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (static_cast<int64_t>(ptr[mid]) - base + mid < target) lo = mid + 1; else hi = mid;
    }
    bounds[p] = lo;
  }
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t p = next.fetch_add(1); p < parts; p = next.fetch_add(1))
      if (bounds[p] < bounds[p + 1]) f(bounds[p], bounds[p + 1]);
  });
}

// A scratch buffer of at least n elements.
template <typename T>
inline T* grow(std::vector<T>& buf, int64_t n) {
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
  return buf.data();
}

// ----------------------------------------------------------------------------- dot products
template <int DT, typename T>
inline T dot(const T* a, const T* b, int64_t Drt) {
  const int64_t D = DT > 0 ? DT : Drt;
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

#if defined(__AVX2__) && defined(__FMA__)
// The dot products a_u . b_u of four heads u = 0 .. 3 of two [4, D] float rows (D a multiple of 8),
// reduced together by two rounds of horizontal adds.
template <int D>
inline __m128 head_dots4(const float* a, const float* b) {
  __m256 p[4];
  for (int u = 0; u < 4; ++u) {
    const float* x = a + u * D;
    const float* y = b + u * D;
    __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(y));
    for (int d = 8; d < D; d += 8)
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + d), _mm256_loadu_ps(y + d), acc);
    p[u] = acc;
  }
  const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(p[0], p[1]), _mm256_hadd_ps(p[2], p[3]));
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

// out[h] = a_h . b_h for the H heads of two [H, D] float rows (H a multiple of 4).
template <int D>
inline void head_dots(const float* a, const float* b, float* out, int64_t H) {
  for (int64_t h = 0; h < H; h += 4) _mm_storeu_ps(out + h, head_dots4<D>(a + h * D, b + h * D));
}
#endif

// Dot products of every head of two [H, D] rows: out[h * stride] = a_h . b_h. With AVX2 and
// float rows of D = 8, 16, 32, ... four heads are reduced together (head_dots4).
template <int DT, typename T>
inline void head_dots(const T* a, const T* b, T* out, int64_t stride, int64_t H, int64_t Drt) {
  const int64_t D = DT > 0 ? DT : Drt;
  int64_t h = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same_v<T, float> && DT > 0 && DT % 8 == 0) {
    for (; h + 4 <= H; h += 4) {
      alignas(16) float tmp[4];
      _mm_store_ps(tmp, head_dots4<DT>(a + h * DT, b + h * DT));
      for (int u = 0; u < 4; ++u) out[(h + u) * stride] = tmp[u];
    }
  }
#endif
  for (; h < H; ++h) out[h * stride] = dot<DT>(a + h * D, b + h * D, D);
}

// ------------------------------------------------------------------------------ edge fields
// Whether an optional tensor argument was given.
inline bool present(const OptTensor& t) { return t.has_value() && t->defined(); }

// A per-edge [E] or [E, H] tensor (bias, weight, their gradients) read or written at
// (edge id, head).
template <typename T>
struct EdgeField {
  T* data = nullptr;
  int64_t se = 0, sh = 0;  // strides over edges and heads ([E]: sh = 0, shared by the heads)
  EdgeField() = default;
  EdgeField(const OptTensor& t, int64_t H) {
    if (present(t)) {
      data = t->data_ptr<T>();
      if (t->dim() == 1) { se = 1; sh = 0; } else { se = H; sh = 1; }
    }
  }
  bool on() const { return data != nullptr; }
  T at(int64_t e, int64_t h) const { return data[e * se + h * sh]; }
  T& ref(int64_t e, int64_t h) const { return data[e * se + h * sh]; }
};

// The gradient buffer of an edge field (zeros like it), or an undefined tensor if it is not needed.
inline Tensor zeros_if(bool need, const OptTensor& t) {
  return need && t.has_value() ? at::zeros_like(*t) : Tensor();
}

// The data of a tensor that may be undefined (nullptr).
template <typename T>
inline T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

// ---------------------------------------------------------------------------------- checks
// `kernel` starts each message ("graphattn fused"); `dtype` is the dtype the tensor must have and
// `expected` what the message asks for after "must be a contiguous ".

// An [rows, H, D] node tensor with the H and D of ref.
inline void check_nodes(const char* kernel, const Tensor& t, const Tensor& ref,
                        at::ScalarType dtype, const char* name, const char* expected) {
  TORCH_CHECK(t.dim() == 3 && t.is_contiguous() && t.scalar_type() == dtype &&
                  t.size(1) == ref.size(1) && t.size(2) == ref.size(2),
              kernel, ": '", name, "' must be a contiguous ", expected);
}

// An optional [E] or [E, H] edge field (nothing to check when it is absent).
inline void check_edge(const char* kernel, const OptTensor& t, int64_t E, int64_t H,
                       at::ScalarType dtype, const char* name, const char* expected) {
  if (!present(t)) return;
  TORCH_CHECK(t->is_contiguous() && t->scalar_type() == dtype && t->size(0) == E &&
                  (t->dim() == 1 || (t->dim() == 2 && t->size(1) == H)),
              kernel, ": '", name, "' must be a contiguous ", expected);
}

// Whether every index tensor of a graph layout is contiguous int32.
inline bool int32_contiguous(const Tensor& a, const Tensor& b, const Tensor& c) {
  return a.scalar_type() == at::kInt && b.scalar_type() == at::kInt &&
         c.scalar_type() == at::kInt && a.is_contiguous() && b.is_contiguous() && c.is_contiguous();
}

}  // namespace graphattn_csrc

// ------------------------------------------------------------------------- head-dim dispatch
// The cases of a switch over the head dimension with a specialised kernel (D = 8, 16, 32, 64):
// each runs the lambda __VA_ARGS__ with `constexpr int DT` set to D.
#define GA_DISPATCH_D_CASES(...)                               \
    case 8: { constexpr int DT = 8; __VA_ARGS__(); break; }    \
    case 16: { constexpr int DT = 16; __VA_ARGS__(); break; }  \
    case 32: { constexpr int DT = 32; __VA_ARGS__(); break; }  \
    case 64: { constexpr int DT = 64; __VA_ARGS__(); break; }

// Any other D runs the generic kernel (DT = 0: D is read at run time) ...
#define GA_DISPATCH_D(D, ...)                                  \
  switch (D) {                                                 \
    GA_DISPATCH_D_CASES(__VA_ARGS__)                           \
    default: { constexpr int DT = 0; __VA_ARGS__(); break; }   \
  }

// ... or is an error (MESSAGE) where there is no generic kernel.
#define GA_DISPATCH_D_FIXED(D, MESSAGE, ...)                   \
  switch (D) {                                                 \
    GA_DISPATCH_D_CASES(__VA_ARGS__)                           \
    default: TORCH_CHECK(false, MESSAGE);                      \
  }
