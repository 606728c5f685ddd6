// Cache-blocked fused attention for fp32 on AVX2 CPUs (softmax mode, H a multiple of 4, D = 8, 16,
// 32 or 64). Same mathematics as edge_attention.cpp (see there and kernels/fused.py); what differs
// is the order of the work.
//
// On a large graph with random sources every edge gathers a random row of k and v (forward, backward
// destination pass) or of q and dO (backward source pass): the kernel waits on DRAM. Here the
// gathered side is cut into B blocks of rows small enough to stay in the last-level cache, and
// every pass runs block after block:
//   forward, destination pass: edges sorted by (source block, target row); bptr [B, R + 1];
//   source pass:               entries sorted by (target block, source row); bptr [B', S + 1].
// Between blocks a row keeps its running state in the output tensors themselves: the forward an
// online softmax (running max m and sum l per head in a [R, 2H] buffer, the unnormalised output in
// out), the backward its dq, or dk and dv, partial sums. With B = 1 this is the plain CSR / CSC.
//
// The inner loops vectorise across heads: the scores of an edge are one 4-lane vector per group of
// four heads (the four dot products reduced together), and the softmax statistics, exponentials
// and gradients of a row are computed four heads at a time, so a row with few edges in a block
// costs little more than its edges.
//
// Every row (or source) is computed by one thread, blocks in a fixed order and edges in storage
// order, so results are bit-identical across runs and thread counts (for a given blocking).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include "common.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define GA_BLOCKED_AVX2 1
#else
#define GA_BLOCKED_AVX2 0
#endif

namespace graphattn_blocked {
namespace {

using at::Tensor;
using graphattn_csrc::data_or_null;
using graphattn_csrc::for_each_entry;
using graphattn_csrc::gathered;
using graphattn_csrc::grow;
using graphattn_csrc::OptTensor;
using graphattn_csrc::parallel_rows;
using graphattn_csrc::present;
using graphattn_csrc::zeros_if;

bool supported() { return GA_BLOCKED_AVX2 == 1; }

#if GA_BLOCKED_AVX2

using graphattn_csrc::head_dots;

// exp of 4 floats: range reduction to [-ln2/2, ln2/2] and a degree-5 polynomial (relative error
// ~2e-7); exp(x) = 0 below -87.3 (so exp(-inf) = 0).
inline __m128 exp4(__m128 x) {
  const __m128 lo = _mm_set1_ps(-87.3f);
  const __m128 tiny = _mm_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm_min_ps(_mm_max_ps(x, lo), _mm_set1_ps(88.3f));
  const __m128 n = _mm_round_ps(_mm_mul_ps(x, _mm_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m128 r = _mm_fnmadd_ps(n, _mm_set1_ps(0.693359375f), x);
  r = _mm_fnmadd_ps(n, _mm_set1_ps(-2.12194440e-4f), r);
  const __m128 r2 = _mm_mul_ps(r, r);
  __m128 y = _mm_set1_ps(1.9875691500e-4f);
  y = _mm_fmadd_ps(y, r, _mm_set1_ps(1.3981999507e-3f));
  y = _mm_fmadd_ps(y, r, _mm_set1_ps(8.3334519073e-3f));
  y = _mm_fmadd_ps(y, r, _mm_set1_ps(4.1665795894e-2f));
  y = _mm_fmadd_ps(y, r, _mm_set1_ps(1.6666665459e-1f));
  y = _mm_fmadd_ps(y, r, _mm_set1_ps(5.0000001201e-1f));
  y = _mm_fmadd_ps(y, r2, _mm_add_ps(r, _mm_set1_ps(1.0f)));
  const __m128i e = _mm_slli_epi32(_mm_add_epi32(_mm_cvtps_epi32(n), _mm_set1_epi32(127)), 23);
  return _mm_andnot_ps(tiny, _mm_mul_ps(y, _mm_castsi128_ps(e)));
}

// dst[h] (D floats per head) = init[h] * dst[h] + sum_t c[t * H + h] * rows_t[h] for every head h of
// the rows base[idx[t]] ([H, D] each); init == nullptr: dst starts from 0.
// All heads at once, NV = H * D / 8 vector sums in registers (one pass over the edges):
template <int D, int NV>
inline void row_accumulate_all(float* dst, const float* init, const float* c, int64_t H,
                               const float* base, const int32_t* idx, int64_t n) {
  __m256 acc[NV];
  for (int u = 0; u < NV; ++u)
    acc[u] = init == nullptr ? _mm256_setzero_ps()
                             : _mm256_mul_ps(_mm256_set1_ps(init[(8 * u) / D]), _mm256_loadu_ps(dst + 8 * u));
  for (int64_t t = 0; t < n; ++t) {
    const float* r = base + static_cast<int64_t>(idx[t]) * (8 * NV);
    const float* ct = c + t * H;
    for (int u = 0; u < NV; ++u)
      acc[u] = _mm256_fmadd_ps(_mm256_broadcast_ss(ct + (8 * u) / D), _mm256_loadu_ps(r + 8 * u), acc[u]);
  }
  for (int u = 0; u < NV; ++u) _mm256_storeu_ps(dst + 8 * u, acc[u]);
}

// ... or head by head (wider rows).
template <int D>
inline void row_accumulate(float* dst, const float* init, const float* c, int64_t H,
                           const float* base, const int32_t* idx, int64_t n) {
  const int64_t HD = H * D;
  if (HD == 32) return row_accumulate_all<D, 4>(dst, init, c, H, base, idx, n);
  if (HD == 64) return row_accumulate_all<D, 8>(dst, init, c, H, base, idx, n);
  for (int64_t h = 0; h < H; ++h) {
    __m256 acc[D / 8];
    for (int u = 0; u < D / 8; ++u)
      acc[u] = init == nullptr ? _mm256_setzero_ps()
                               : _mm256_mul_ps(_mm256_set1_ps(init[h]), _mm256_loadu_ps(dst + h * D + 8 * u));
    for (int64_t t = 0; t < n; ++t) {
      const float* r = base + static_cast<int64_t>(idx[t]) * HD + h * D;
      const __m256 cv = _mm256_broadcast_ss(c + t * H + h);
      for (int u = 0; u < D / 8; ++u) acc[u] = _mm256_fmadd_ps(cv, _mm256_loadu_ps(r + 8 * u), acc[u]);
    }
    for (int u = 0; u < D / 8; ++u) _mm256_storeu_ps(dst + h * D + 8 * u, acc[u]);
  }
}

// Per-edge [E] or [E, H] tensor (bias, weight and their gradients), read / written four heads at a
// time.
struct EdgeField : graphattn_csrc::EdgeField<float> {
  using graphattn_csrc::EdgeField<float>::EdgeField;
  __m128 load4(int64_t e, int64_t h) const {
    return sh != 0 ? _mm_loadu_ps(data + e * se + h) : _mm_set1_ps(data[e]);
  }
  void add4(int64_t e, int64_t h, __m128 x) const {
    if (sh != 0) {
      _mm_storeu_ps(data + e * se + h, _mm_add_ps(_mm_loadu_ps(data + e * se + h), x));
    } else {  // shared by the heads: the sum over them
      __m128 s = _mm_hadd_ps(x, x);
      s = _mm_hadd_ps(s, s);
      data[e] += _mm_cvtss_f32(s);
    }
  }
};

// Softmax probability and logit gradient of one edge for four heads h .. h + 3, from its score s
// (q_i . k_j) and g = dO_i . v_j:  p = exp(scale s + b - lse_i),  ds = p (w g - Dterm_i).
struct EdgeGrad {
  __m128 p, ds;
};
inline EdgeGrad edge_grad4(const float* s, const float* g, __m128 scale, const EdgeField& bias,
                           const EdgeField& weight, int64_t uid, int64_t h, __m128 lse4,
                           __m128 dterm4) {
  __m128 x = _mm_mul_ps(_mm_loadu_ps(s), scale);
  if (bias.on()) x = _mm_add_ps(x, bias.load4(uid, h));
  const __m128 p = exp4(_mm_sub_ps(x, lse4));
  const __m128 gv = _mm_loadu_ps(g);
  const __m128 wg = weight.on() ? _mm_mul_ps(weight.load4(uid, h), gv) : gv;
  return {p, _mm_mul_ps(p, _mm_sub_ps(wg, dterm4))};
}

// The blocks of a blocked layout (bptr [B, rows + 1]: block b's entries of row r are bptr[b, r] ..
// bptr[b, r + 1]) one after the other; within a block, its rows in parallel ranges:
// f(first, last, the block's row pointer, r0, r1), first / last: whether it is the first / last
// block (where a row's running state starts / ends).
template <typename F>
void parallel_blocks(const int32_t* bptr, int64_t B, int64_t rows, const F& f) {
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* ptr = bptr + b * (rows + 1);
    parallel_rows(ptr, rows, [&](int64_t r0, int64_t r1) { f(b == 0, b == B - 1, ptr, r0, r1); });
  }
}

// ------------------------------------------------------------------------------------- forward
template <int D>
void forward_impl(const float* q, const float* k, const float* v, const int32_t* bptr, int64_t B,
                  const int32_t* col, const int32_t* eid, EdgeField bias, EdgeField weight,
                  float* out, float* lse, float* ml, int64_t R, int64_t H, float scale) {
  const int64_t HD = H * D;
  const float ninf = -std::numeric_limits<float>::infinity();
  parallel_blocks(bptr, B, R, [&](bool first, bool last, const int32_t* rowptr, int64_t r0, int64_t r1) {
    const int64_t e_end = rowptr[r1];
    std::vector<float> sbuf, fbuf;
    for (int64_t i = r0; i < r1; ++i) {
      const int64_t e0 = rowptr[i], deg = rowptr[i + 1] - e0;
      float* oi = out + i * HD;
      float* mi = ml + i * 2 * H;  // running max, then running sum, per head
      float* li = mi + H;
      if (first) {
        std::fill(mi, mi + H, ninf);
        std::fill(li, li + H, 0.0f);
      }
      if (deg > 0) {
        float* s = grow(sbuf, deg * H);  // s[t * H + h]: score, then softmax numerator (* w)
        const float* qi = q + i * HD;
        const auto score = [&](int64_t t, int64_t j) { head_dots<D>(qi, k + j * HD, s + t * H, H); };
        for_each_entry(col, e0, deg, e_end, score, gathered(k, HD), gathered(v, HD));
        const __m128 sc = _mm_set1_ps(scale);
        float* f = grow(fbuf, H);  // per head: rescaling of the earlier blocks' partial sums
        for (int64_t h = 0; h < H; h += 4) {
          __m128 mx = _mm_set1_ps(ninf);
          for (int64_t t = 0; t < deg; ++t) {
            __m128 x = _mm_mul_ps(_mm_loadu_ps(s + t * H + h), sc);
            if (bias.on()) x = _mm_add_ps(x, bias.load4(eid[e0 + t], h));
            _mm_storeu_ps(s + t * H + h, x);
            mx = _mm_max_ps(mx, x);
          }
          const __m128 m_old = _mm_loadu_ps(mi + h);
          const __m128 m_new = _mm_max_ps(m_old, mx);
          // rescaling of the earlier blocks' sums (0 while there were none: exp(-inf) = 0)
          const __m128 f4 = first ? _mm_setzero_ps() : exp4(_mm_sub_ps(m_old, m_new));
          __m128 sum = _mm_setzero_ps();
          for (int64_t t = 0; t < deg; ++t) {
            const __m128 p = exp4(_mm_sub_ps(_mm_loadu_ps(s + t * H + h), m_new));
            sum = _mm_add_ps(sum, p);
            _mm_storeu_ps(s + t * H + h, weight.on() ? _mm_mul_ps(p, weight.load4(eid[e0 + t], h)) : p);
          }
          _mm_storeu_ps(mi + h, m_new);
          _mm_storeu_ps(li + h, _mm_fmadd_ps(_mm_loadu_ps(li + h), f4, sum));
          _mm_storeu_ps(f + h, f4);
        }
        row_accumulate<D>(oi, first ? nullptr : f, s, H, v, col + e0, deg);
      } else if (first) {
        std::fill(oi, oi + HD, 0.0f);
      }
      if (last) {
        for (int64_t h = 0; h < H; ++h) {
          const float l = li[h];
          const float inv = l > 0.0f ? 1.0f / l : 0.0f;
          for (int64_t d = 0; d < D; ++d) oi[h * D + d] *= inv;
          lse[i * H + h] = l > 0.0f ? mi[h] + std::log(l) : ninf;
        }
      }
    }
  });
}

// ------------------------------------------------------------------ backward, destination pass
// Blocks of sources (the forward's layout): Dterm_i = dO_i . o_i (first block), and per edge
// p = exp(s - lse_i), g = dO_i . v_j, ds = p (w g - Dterm_i): dq_i += scale ds k_j, dbias_e = ds,
// dweight_e = p g.
template <int D>
void backward_dst_impl(const float* q, const float* k, const float* v, const float* out,
                       const float* dout, const float* lse, const int32_t* bptr, int64_t B,
                       const int32_t* col, const int32_t* eid, EdgeField bias, EdgeField weight,
                       float* dq, EdgeField dbias, EdgeField dweight, float* dterm, int64_t R,
                       int64_t H, float scale) {
  const int64_t HD = H * D;
  const bool ids = bias.on() || weight.on();
  parallel_blocks(bptr, B, R, [&](bool first, bool, const int32_t* rowptr, int64_t r0, int64_t r1) {
    const int64_t e_end = rowptr[r1];
    std::vector<float> sbuf, gbuf, ones(H, 1.0f);
    for (int64_t i = r0; i < r1; ++i) {
      const int64_t e0 = rowptr[i], deg = rowptr[i + 1] - e0;
      const float* qi = q + i * HD;
      const float* doi = dout + i * HD;
      if (first) head_dots<D>(doi, out + i * HD, dterm + i * H, H);
      if (deg == 0) {
        if (first && dq != nullptr) std::fill(dq + i * HD, dq + (i + 1) * HD, 0.0f);
        continue;
      }
      float* s = grow(sbuf, deg * H);  // scores, then p
      float* g = grow(gbuf, deg * H);  // dO . v, then ds * scale
      const auto dots = [&](int64_t t, int64_t j) {
        head_dots<D>(qi, k + j * HD, s + t * H, H);
        head_dots<D>(doi, v + j * HD, g + t * H, H);
      };
      for_each_entry(col, e0, deg, e_end, dots, gathered(k, HD), gathered(v, HD));
      const __m128 sc = _mm_set1_ps(scale);
      for (int64_t h = 0; h < H; h += 4) {
        const __m128 l4 = _mm_loadu_ps(lse + i * H + h);
        const __m128 dt = _mm_loadu_ps(dterm + i * H + h);
        for (int64_t t = 0; t < deg; ++t) {
          const int64_t uid = ids ? eid[e0 + t] : 0;
          const EdgeGrad eg = edge_grad4(s + t * H + h, g + t * H + h, sc, bias, weight, uid, h, l4, dt);
          if (dweight.on()) dweight.add4(uid, h, _mm_mul_ps(eg.p, _mm_loadu_ps(g + t * H + h)));
          if (dbias.on()) dbias.add4(uid, h, eg.ds);
          _mm_storeu_ps(g + t * H + h, _mm_mul_ps(eg.ds, sc));
        }
      }
      if (dq != nullptr)
        row_accumulate<D>(dq + i * HD, first ? nullptr : ones.data(), g, H, k, col + e0, deg);
    }
  });
}

// ----------------------------------------------------------------------- backward, source pass
// Blocks of target rows (the transposed layout): per source j and edge (j -> i), p and ds again
// from q_i, dO_i and (lse_i, Dterm_i) (stats [R, 2H]): dk_j += scale ds q_i, dv_j += p w dO_i.
template <int D>
void backward_src_impl(const float* q, const float* k, const float* v, const float* dout,
                       const float* stats, const int32_t* bptr, int64_t B, const int32_t* crow,
                       const int32_t* cuid, EdgeField bias, EdgeField weight, float* dk, float* dv,
                       int64_t S, int64_t H, float scale) {
  const int64_t HD = H * D;
  const bool ids = bias.on() || weight.on();
  parallel_blocks(bptr, B, S, [&](bool first, bool, const int32_t* colptr, int64_t j0, int64_t j1) {
    const int64_t c_end = colptr[j1];
    std::vector<float> pbuf, gbuf, ones(H, 1.0f);
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t c0 = colptr[j], n = colptr[j + 1] - c0;
      if (n == 0) {
        if (first) {
          if (dk != nullptr) std::fill(dk + j * HD, dk + (j + 1) * HD, 0.0f);
          if (dv != nullptr) std::fill(dv + j * HD, dv + (j + 1) * HD, 0.0f);
        }
        continue;
      }
      const float* kj = k + j * HD;
      const float* vj = v + j * HD;
      float* p = grow(pbuf, n * H);  // scores, then p * w: coefficient of dO_i in dv_j
      float* g = grow(gbuf, n * H);  // dO_i . v_j, then ds * scale: coefficient of q_i in dk_j
      const auto dots = [&](int64_t t, int64_t i) {
        head_dots<D>(q + i * HD, kj, p + t * H, H);
        head_dots<D>(dout + i * HD, vj, g + t * H, H);
      };
      // the rows of each target i: q, dO and (lse, Dterm)
      for_each_entry(crow, c0, n, c_end, dots, gathered(q, HD), gathered(dout, HD),
                     gathered(stats, 2 * H));
      const __m128 sc = _mm_set1_ps(scale);
      for (int64_t h = 0; h < H; h += 4) {
        for (int64_t t = 0; t < n; ++t) {
          const int64_t c = c0 + t, uid = ids ? cuid[c] : 0;
          const float* st = stats + static_cast<int64_t>(crow[c]) * 2 * H;  // lse, then Dterm
          const EdgeGrad eg = edge_grad4(p + t * H + h, g + t * H + h, sc, bias, weight, uid, h,
                                         _mm_loadu_ps(st + h), _mm_loadu_ps(st + H + h));
          _mm_storeu_ps(g + t * H + h, _mm_mul_ps(eg.ds, sc));
          _mm_storeu_ps(p + t * H + h, weight.on() ? _mm_mul_ps(eg.p, weight.load4(uid, h)) : eg.p);
        }
      }
      const float* init = first ? nullptr : ones.data();
      if (dk != nullptr) row_accumulate<D>(dk + j * HD, init, g, H, q, crow + c0, n);
      if (dv != nullptr) row_accumulate<D>(dv + j * HD, init, p, H, dout, crow + c0, n);
    }
  });
}

#endif  // GA_BLOCKED_AVX2

// ------------------------------------------------------------------------------------ checks
constexpr const char* kKernel = "graphattn blocked";
constexpr const char* kNeedD = "graphattn blocked: D must be 8, 16, 32 or 64";

// Node tensors are float32 with v's (here: ref's) H and D.
void check_nodes(const Tensor& t, const Tensor& ref, const char* name) {
  graphattn_csrc::check_nodes(kKernel, t, ref, at::kFloat, name,
                              "float32 [rows, H, D] tensor like v");
}

void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v) {
  check_nodes(v, v, "v");
  check_nodes(q, v, "q");
  check_nodes(k, v, "k");
}

void check_layout(const Tensor& bptr, const Tensor& idx, const Tensor& eid, int64_t rows) {
  TORCH_CHECK(graphattn_csrc::int32_contiguous(bptr, idx, eid) && bptr.dim() == 2 &&
                  bptr.size(1) == rows + 1 && (idx.numel() == eid.numel() || eid.numel() == 0),
              "graphattn blocked: the layout must be int32, bptr [B, rows + 1], idx and eid [E]");
}

// bias and weight: float32 [E] or [E, H], read through the layout's edge ids.
void check_fields(const OptTensor& bias, const OptTensor& weight, const Tensor& eid, int64_t E,
                  int64_t H) {
  const char* expected = "float32 [E] or [E, H] tensor";
  graphattn_csrc::check_edge(kKernel, bias, E, H, at::kFloat, "bias", expected);
  graphattn_csrc::check_edge(kKernel, weight, E, H, at::kFloat, "weight", expected);
  TORCH_CHECK(!(present(bias) || present(weight)) || eid.numel() == E,
              "graphattn blocked: a layout with edge ids is needed for bias or weight");
}

void check_heads(const Tensor& v) {
  TORCH_CHECK(supported(), "graphattn blocked: built without AVX2/FMA");
  TORCH_CHECK(v.size(1) % 4 == 0, "graphattn blocked: the number of heads must be a multiple of 4");
}

// ---------------------------------------------------------------------------------- operators
std::tuple<Tensor, Tensor> forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& bptr, const Tensor& col, const Tensor& eid,
                                   const OptTensor& bias, const OptTensor& weight, double scale) {
  check_qkv(q, k, v);
  check_heads(v);
  const int64_t R = q.size(0), H = v.size(1), D = v.size(2), E = col.numel();
  check_layout(bptr, col, eid, R);
  TORCH_CHECK(k.size(0) == v.size(0), "graphattn blocked: k and v differ in rows");
  check_fields(bias, weight, eid, E, H);
  Tensor out = at::empty({R, H, D}, v.options());
  Tensor lse = at::empty({R, H}, v.options());
#if GA_BLOCKED_AVX2
  Tensor ml = at::empty({R, 2 * H}, v.options());
  GA_DISPATCH_D_FIXED(D, kNeedD, [&] {
    forward_impl<DT>(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                     bptr.data_ptr<int32_t>(), bptr.size(0), col.data_ptr<int32_t>(),
                     eid.data_ptr<int32_t>(), EdgeField(bias, H), EdgeField(weight, H),
                     out.data_ptr<float>(), lse.data_ptr<float>(), ml.data_ptr<float>(), R, H,
                     static_cast<float>(scale));
  });
#endif
  return {out, lse};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> backward_dst(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
    const Tensor& lse, const Tensor& bptr, const Tensor& col, const Tensor& eid,
    const OptTensor& bias, const OptTensor& weight, double scale, bool need_dq, bool need_dbias,
    bool need_dweight) {
  check_qkv(q, k, v);
  check_nodes(out, v, "out");
  check_nodes(dout, v, "dout");
  check_heads(v);
  const int64_t R = q.size(0), H = v.size(1), D = v.size(2), E = col.numel();
  check_layout(bptr, col, eid, R);
  TORCH_CHECK(out.size(0) == R && dout.size(0) == R && lse.numel() == R * H &&
                  lse.is_contiguous() && lse.scalar_type() == at::kFloat && k.size(0) == v.size(0),
              "graphattn blocked: out, dout and lse need one row per target, k and v one per source");
  check_fields(bias, weight, eid, E, H);
  Tensor dq = need_dq ? at::empty_like(q) : Tensor();
  Tensor dbias = zeros_if(need_dbias, bias);
  Tensor dweight = zeros_if(need_dweight, weight);
  Tensor dterm = at::empty({R, H}, v.options());
#if GA_BLOCKED_AVX2
  GA_DISPATCH_D_FIXED(D, kNeedD, [&] {
    backward_dst_impl<DT>(
        q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), out.data_ptr<float>(),
        dout.data_ptr<float>(), lse.data_ptr<float>(), bptr.data_ptr<int32_t>(), bptr.size(0),
        col.data_ptr<int32_t>(), eid.data_ptr<int32_t>(), EdgeField(bias, H), EdgeField(weight, H),
        data_or_null<float>(dq), EdgeField(dbias, H), EdgeField(dweight, H),
        dterm.data_ptr<float>(), R, H, static_cast<float>(scale));
  });
#endif
  return {dq, dbias, dweight, dterm};
}

std::tuple<Tensor, Tensor> backward_src(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& dout, const Tensor& lse, const Tensor& dterm,
                                        const Tensor& bptr, const Tensor& crow, const Tensor& cuid,
                                        const OptTensor& bias, const OptTensor& weight,
                                        double scale, bool need_dk, bool need_dv) {
  check_qkv(q, k, v);
  check_nodes(dout, v, "dout");
  check_heads(v);
  const int64_t S = v.size(0), R = q.size(0), H = v.size(1), D = v.size(2), E = crow.numel();
  check_layout(bptr, crow, cuid, S);
  TORCH_CHECK(k.size(0) == S && dout.size(0) == R && lse.numel() == R * H &&
                  dterm.numel() == R * H,
              "graphattn blocked: bad q / k / dout / lse / dterm rows");
  check_fields(bias, weight, cuid, E, H);
  Tensor dk = need_dk ? at::empty_like(k) : Tensor();
  Tensor dv = need_dv ? at::empty_like(v) : Tensor();
  if (!dk.defined() && !dv.defined()) return {dk, dv};
#if GA_BLOCKED_AVX2
  // (lse, Dterm) of each target row side by side: one cache line per gathered row
  Tensor stats = at::cat({lse.reshape({R, H}), dterm.reshape({R, H})}, 1).contiguous();
  GA_DISPATCH_D_FIXED(D, kNeedD, [&] {
    backward_src_impl<DT>(
        q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), dout.data_ptr<float>(),
        stats.data_ptr<float>(), bptr.data_ptr<int32_t>(), bptr.size(0), crow.data_ptr<int32_t>(),
        cuid.data_ptr<int32_t>(), EdgeField(bias, H), EdgeField(weight, H),
        data_or_null<float>(dk), data_or_null<float>(dv), S, H, static_cast<float>(scale));
  });
#endif
  return {dk, dv};
}

// ------------------------------------------------------------------------------------ layouts
// From a destination-sorted CSR (rowptr [R + 1], col [E], eid [E]), the layout of one pass, by a
// counting sort with no temporaries beyond its outputs and one [B, rows] cursor:
//   by_target = true  (forward, destination pass): edges sorted by (block of `block_rows` sources,
//                      target row); bptr [B, R + 1] and the source of each edge;
//   by_target = false (source pass): edges sorted by (block of `block_rows` target rows, source,
//                      target row); bptr [B, S + 1] and the target row of each edge.
// bptr holds global positions: block b's entries of row r are bptr[b, r] .. bptr[b, r + 1]. With
// one block (block_rows >= R) and by_target = false this is the CSC of the general kernel. The
// caller's edge ids come along only `with_eid` (they are needed for bias and weight; else the
// third output is empty).
std::tuple<Tensor, Tensor, Tensor> build_layout(const Tensor& rowptr, const Tensor& col,
                                                const Tensor& eid, int64_t num_sources,
                                                int64_t block_rows, bool by_target, bool with_eid) {
  TORCH_CHECK(graphattn_csrc::int32_contiguous(rowptr, col, eid) && col.numel() == eid.numel() &&
                  block_rows > 0,
              "graphattn blocked: build_layout needs an int32 CSR and block_rows > 0");
  const int64_t R = rowptr.numel() - 1, E = col.numel(), S = num_sources;
  const int64_t rows = by_target ? R : S;
  const int64_t B = std::max<int64_t>(1, ((by_target ? S : R) + block_rows - 1) / block_rows);
  TORCH_CHECK(B * (rows + 1) < std::numeric_limits<int32_t>::max(),
              "graphattn blocked: too many blocks for int32 pointers");
  const int32_t* rp = rowptr.data_ptr<int32_t>();
  const int32_t* cp = col.data_ptr<int32_t>();
  const int32_t* ep = eid.data_ptr<int32_t>();
  for (int64_t e = 0; e < E; ++e)
    TORCH_CHECK(cp[e] >= 0 && cp[e] < S, "graphattn blocked: column out of range");
  auto i32 = col.options();
  Tensor bptr = at::zeros({B, rows + 1}, i32);
  Tensor idx = at::empty({E}, i32);
  Tensor ids = at::empty({with_eid ? E : 0}, i32);
  int32_t* bp = bptr.data_ptr<int32_t>();
  for (int64_t r = 0; r < R; ++r)  // counts, then global start positions
    for (int64_t e = rp[r]; e < rp[r + 1]; ++e) {
      const int64_t b = by_target ? cp[e] / block_rows : r / block_rows;
      bp[b * (rows + 1) + (by_target ? r : cp[e]) + 1] += 1;
    }
  int64_t run = 0;
  for (int64_t b = 0; b < B; ++b) {
    int32_t* p = bp + b * (rows + 1);
    p[0] = static_cast<int32_t>(run);
    for (int64_t r = 0; r < rows; ++r) {
      run += p[r + 1];
      p[r + 1] = static_cast<int32_t>(run);
    }
  }
  std::vector<int32_t> cursor(B * rows);
  for (int64_t b = 0; b < B; ++b)
    std::copy(bp + b * (rows + 1), bp + b * (rows + 1) + rows, cursor.begin() + b * rows);
  int32_t* ip = idx.data_ptr<int32_t>();
  int32_t* dp = with_eid ? ids.data_ptr<int32_t>() : nullptr;
  for (int64_t r = 0; r < R; ++r)  // rows in order: a (block, source) keeps its targets sorted
    for (int64_t e = rp[r]; e < rp[r + 1]; ++e) {
      const int64_t b = by_target ? cp[e] / block_rows : r / block_rows;
      const int32_t at = cursor[b * rows + (by_target ? r : cp[e])]++;
      ip[at] = by_target ? cp[e] : static_cast<int32_t>(r);
      if (dp != nullptr) dp[at] = ep[e];
    }
  return {bptr, idx, ids};
}

}  // namespace
}  // namespace graphattn_blocked

TORCH_LIBRARY_FRAGMENT(graphattn_fused, m) {
  m.def("blocked_supported", &graphattn_blocked::supported);
  m.def("blocked_forward", &graphattn_blocked::forward);
  m.def("blocked_backward_dst", &graphattn_blocked::backward_dst);
  m.def("blocked_backward_src", &graphattn_blocked::backward_src);
  m.def("build_layout", &graphattn_blocked::build_layout);
}
