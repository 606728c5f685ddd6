// Helpers shared by the fused CPU kernels (edge_attention.cpp, edge_attention_blocked.cpp).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

namespace graphattn_csrc {

// Prefetches the n elements at p into the cache (one request per 64-byte line).
template <typename T>
inline void prefetch_row(const T* p, int64_t n) {
  const char* c = reinterpret_cast<const char*>(p);
  const int64_t bytes = n * static_cast<int64_t>(sizeof(T));
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 1);
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

}  // namespace graphattn_csrc
