// graphattn: a stable argsort of every column within every graph, compiled for the CPU (Sliceformer's
// sorting permutations, graphattn/producers/sliceformer/sorting.py).
//
// segmented_argsort(key [N, C], ptr [B + 1]) -> src [N, C] int64: for each graph g (the rows
// ptr[g] .. ptr[g + 1] - 1) and column c, src[ptr[g] + r, c] is the row of the r-th smallest key of
// that column in that graph, ties in row order: torch.argsort(key[ptr[g]:ptr[g + 1]], dim=0,
// stable=True) + ptr[g], with torch's order of floats (-0.0 equals 0.0; NaN after +inf, NaNs in row
// order).
//
// Each float is mapped to an unsigned integer of the same width whose order is that order (the sign
// bit flipped for non-negative floats, every bit flipped for negative ones, zeros and NaNs made
// canonical), then sorted with the row as the tie-break: an LSD radix sort by bytes (a byte every
// key shares is skipped) for long segments, a comparison sort of (key, row) pairs for short ones.
// torch's CPU sort is a comparison sort, ~70 ns per element at 4096 rows; this is a few.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace graphattn_sort {

// below this many rows a segment is sorted by comparisons (radix passes cost 256 buckets each)
constexpr int64_t kRadixMin = 96;

template <typename F>
struct Bits;
template <>
struct Bits<float> {
  using U = uint32_t;
};
template <>
struct Bits<double> {
  using U = uint64_t;
};

template <typename F>
inline typename Bits<F>::U ordered_bits(F f) {
  using U = typename Bits<F>::U;
  constexpr U sign = U(1) << (8 * sizeof(U) - 1);
  if (std::isnan(f)) return ~U(0);  // every NaN after +inf, equal among themselves
  if (f == F(0)) return sign;       // -0.0 == +0.0
  U b;
  std::memcpy(&b, &f, sizeof(U));
  const U negative = U(0) - (b >> (8 * sizeof(U) - 1));  // all ones for a negative float
  return b ^ (negative | sign);  // without a branch on the (random) sign
}

template <typename U>
struct Scratch {
  std::vector<U> key, key2;
  std::vector<uint32_t> row, row2;
  std::vector<std::pair<U, uint32_t>> pairs;
};

// sorts rows 0 .. n - 1 of one (segment, column) by their keys (read with stride), writes the rows
template <typename F, typename U>
void sort_one(const F* col, int64_t stride, int64_t n, int64_t first, int64_t* out,
              int64_t out_stride, Scratch<U>& s) {
  if (n < kRadixMin) {
    auto& p = s.pairs;
    p.resize(n);
    for (int64_t i = 0; i < n; ++i) p[i] = {ordered_bits<F>(col[i * stride]), uint32_t(i)};
    std::sort(p.begin(), p.end());  // (key, row): unique pairs, so the order is the stable one
    for (int64_t r = 0; r < n; ++r) out[r * out_stride] = first + p[r].second;
    return;
  }
  constexpr int kBytes = sizeof(U);
  s.key.resize(n);
  s.key2.resize(n);
  s.row.resize(n);
  s.row2.resize(n);
  std::array<std::array<uint32_t, 256>, kBytes> hist{};
  U* k = s.key.data();
  U* k2 = s.key2.data();
  uint32_t* r = s.row.data();
  uint32_t* r2 = s.row2.data();
  for (int64_t i = 0; i < n; ++i) {
    const U u = ordered_bits<F>(col[i * stride]);
    k[i] = u;
    r[i] = uint32_t(i);
    for (int b = 0; b < kBytes; ++b) ++hist[b][(u >> (8 * b)) & 0xFF];
  }
  for (int b = 0; b < kBytes; ++b) {
    auto& h = hist[b];
    if (h[(k[0] >> (8 * b)) & 0xFF] == uint32_t(n)) continue;  // every key shares this byte
    uint32_t sum = 0;
    for (int d = 0; d < 256; ++d) {
      const uint32_t c = h[d];
      h[d] = sum;
      sum += c;
    }
    for (int64_t i = 0; i < n; ++i) {  // stable scatter by this byte
      const uint32_t pos = h[(k[i] >> (8 * b)) & 0xFF]++;
      k2[pos] = k[i];
      r2[pos] = r[i];
    }
    std::swap(k, k2);
    std::swap(r, r2);
  }
  for (int64_t i = 0; i < n; ++i) out[i * out_stride] = first + r[i];
}

// key and out column-major ([C, N]: each column's rows contiguous)
template <typename F>
void argsort_segments(const F* key, const int64_t* ptr, int64_t B, int64_t C, int64_t* out) {
  using U = typename Bits<F>::U;
  const int64_t tasks = B * C;
  // grain: about 4096 rows of work per task chunk
  const int64_t N = ptr[B];
  const int64_t grain = std::max<int64_t>(1, tasks * 4096 / std::max<int64_t>(N * C, 1));
  at::parallel_for(0, tasks, grain, [&](int64_t t0, int64_t t1) {
    Scratch<U> s;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t g = t / C, c = t % C;
      const int64_t first = ptr[g], n = ptr[g + 1] - first;
      if (n <= 0) continue;
      sort_one<F, U>(key + c * N + first, 1, n, first, out + c * N + first, 1, s);
    }
  });
}

at::Tensor segmented_argsort(const at::Tensor& key, const at::Tensor& ptr) {
  TORCH_CHECK(key.device().is_cpu() && key.dim() == 2 && key.is_contiguous() &&
                  (key.scalar_type() == at::kFloat || key.scalar_type() == at::kDouble),
              "graphattn segmented_argsort: 'key' must be a contiguous float32/float64 CPU tensor "
              "[N, C], got ",
              key.scalar_type(), " ", key.sizes());
  TORCH_CHECK(ptr.device().is_cpu() && ptr.dim() == 1 && ptr.numel() >= 1 && ptr.is_contiguous() &&
                  ptr.scalar_type() == at::kLong,
              "graphattn segmented_argsort: 'ptr' must be a contiguous int64 CPU tensor [B + 1]");
  const int64_t N = key.size(0), C = key.size(1), B = ptr.numel() - 1;
  const int64_t* p = ptr.const_data_ptr<int64_t>();
  TORCH_CHECK(p[0] == 0 && p[B] == N,
              "graphattn segmented_argsort: 'ptr' must run from 0 to the number of rows ", N);
  for (int64_t g = 0; g < B; ++g) {
    TORCH_CHECK(p[g + 1] >= p[g], "graphattn segmented_argsort: 'ptr' must be non-decreasing");
    TORCH_CHECK(p[g + 1] - p[g] <= int64_t(UINT32_MAX),
                "graphattn segmented_argsort: a graph has more than 2^32 rows");
  }
  if (N == 0 || C == 0) return at::empty({N, C}, key.options().dtype(at::kLong));
  // sorted column by column: transposed once each way (far cheaper than strided access per column)
  const at::Tensor keyT = key.t().contiguous();
  at::Tensor outT = at::empty({C, N}, key.options().dtype(at::kLong));
  if (key.scalar_type() == at::kFloat) {
    argsort_segments<float>(keyT.const_data_ptr<float>(), p, B, C, outT.mutable_data_ptr<int64_t>());
  } else {
    argsort_segments<double>(keyT.const_data_ptr<double>(), p, B, C,
                             outT.mutable_data_ptr<int64_t>());
  }
  return outT.t().contiguous();
}

}  // namespace graphattn_sort

TORCH_LIBRARY_FRAGMENT(graphattn_fused, m) {
  m.def("segmented_argsort(Tensor key, Tensor ptr) -> Tensor", &graphattn_sort::segmented_argsort);
}
