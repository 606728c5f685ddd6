// Fused sparse multi-head attention on a destination-sorted CSR graph (CPU, ATen parallel / OpenMP).
//
// Notation (see kernels/fused.py): R target rows, S source rows, H heads, D channels per head;
// q [R, H, D], k and v [S, H, D] contiguous; rowptr [R + 1], col [E], eid [E] int32 (CSR order; eid =
// the caller's edge id, used to read bias / weight and to write their gradients in the caller's
// order). Per-head edge sets are handled by the caller as virtual rows (target * H + head, H = 1).
//
//   SDDMM     s_e   = scale * q_i . (k_j + f_e) + b_e
//   softmax   p_e   = exp(s_e - lse_i),  lse_i = log sum_{e -> i} exp(s_e)
//   SpMM      o_i   = sum_{e -> i} p_e w_e (v_j + f_e)    (softmax = false: p_e = 1)
// f [E, H, D] are optional per-edge features added to keys and values (TransformerConv's
// W_E e_ji; f = 0 without them), read by edge id like bias and weight; their gradient
// df_e = scale ds_e q_i + p_e w_e dO_i is written by the destination pass, once per edge.
//
// Forward: one row (target) at a time, two passes over its edges with a deg x H scratch (scores,
// then exp and the weighted sum of values); writes o and lse (-inf for a row without edges; o = 0).
// Backward (FlashAttention-2 style, no atomics, so bit-identical results for any thread count):
//   dst pass over the CSR:  Dterm_i = dO_i . o_i,  g_e = dO_i . v_j,  ds_e = p_e (w_e g_e - Dterm_i)
//                           dq_i = scale sum ds_e k_j,  dbias_e = ds_e,  dweight_e = p_e g_e
//   src pass over the CSC:  dk_j = scale sum ds_e q_i,  dv_j = sum p_e w_e dO_i
// The source pass recomputes s, p and g from q_i, dO_i, lse_i and Dterm_i, which it gathers anyway,
// so no per-edge state ([E, H] handoff) is written between the passes.
// Work is split into contiguous row ranges of equal (edges + rows) cost, scheduled dynamically.

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
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
#include <cstring>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

namespace graphattn_fused {
namespace {

using at::Tensor;
using graphattn_csrc::data_or_null;
using graphattn_csrc::dot;
using graphattn_csrc::EdgeField;
using graphattn_csrc::for_each_entry;
using graphattn_csrc::gathered;
using graphattn_csrc::grow;
using graphattn_csrc::head_dots;
using graphattn_csrc::kPrefetch;
using graphattn_csrc::OptTensor;
using graphattn_csrc::parallel_rows;
using graphattn_csrc::prefetch_row;
using graphattn_csrc::present;
using graphattn_csrc::zeros_if;

// exp for float: Cephes-style range reduction + degree-5 polynomial, branch-free so that loops over
// it vectorise (relative error ~2e-7, exp(x) = 0 below -87.3). Doubles use std::exp.
inline float fast_exp(float x) {
  const bool tiny = x < -87.3f;
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  const float r2 = r * r;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r2 + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float pow2;
  std::memcpy(&pow2, &bits, sizeof(float));
  return tiny ? 0.0f : y * pow2;
}
inline double fast_exp(double x) { return std::exp(x); }

template <int DT, typename T>
inline void axpy(T* acc, T c, const T* x, int64_t Drt) {
  const int64_t D = DT > 0 ? DT : Drt;
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) acc[d] += c * x[d];
}

// Scratch buffers are head-major ([H][deg]) so that the exponentials, maxima and sums over a row's
// edges run as contiguous (vectorised) loops.

// ------------------------------------------------------------------------------------- forward
template <typename T, int DT>
void forward_impl(const T* q, const T* k, const T* v, const int32_t* rowptr, const int32_t* col,
                  const int32_t* eid, EdgeField<T> bias, EdgeField<T> weight, const T* ef, T* out,
                  T* lse, int64_t R, int64_t H, int64_t Drt, T scale, bool softmax) {
  const int64_t D = DT > 0 ? DT : Drt;
  const int64_t HD = H * D;
  parallel_rows(rowptr, R, [&](int64_t r0, int64_t r1) {
    const int64_t e_end = rowptr[r1];
    std::vector<T> scratch, acc(HD), l(H);
    for (int64_t i = r0; i < r1; ++i) {
      const int64_t e0 = rowptr[i], e1 = rowptr[i + 1], deg = e1 - e0;
      T* oi = out + i * HD;
      if (deg == 0) {
        std::fill(oi, oi + HD, T(0));
        for (int64_t h = 0; h < H; ++h)
          lse[i * H + h] = softmax ? -std::numeric_limits<T>::infinity() : T(0);
        continue;
      }
      const T* qi = q + i * HD;
      T* c = grow(scratch, H * deg);  // c[h * deg + t]: coefficient of edge e0 + t in head h
      if (softmax) {
        // SDDMM: scores of every (edge, head) of the row; prefetch the keys and values ahead
        const auto score = [&](int64_t t, int64_t j) {
          head_dots<DT>(qi, k + j * HD, c + t, deg, H, D);
        };
        for_each_entry(col, e0, deg, e_end, score, gathered(k, HD), gathered(v, HD));
        if (ef != nullptr)  // q_i . f_e
          for (int64_t t = 0; t < deg; ++t) {
            const T* ft = ef + static_cast<int64_t>(eid[e0 + t]) * HD;
            for (int64_t h = 0; h < H; ++h) c[h * deg + t] += dot<DT>(qi + h * D, ft + h * D, D);
          }
        // softmax numerators exp(s - m) and their sums
        for (int64_t h = 0; h < H; ++h) {
          T* ch = c + h * deg;
          if (bias.on())
            for (int64_t t = 0; t < deg; ++t) ch[t] = ch[t] * scale + bias.at(eid[e0 + t], h);
          else
            for (int64_t t = 0; t < deg; ++t) ch[t] *= scale;
          T m = ch[0];
          for (int64_t t = 1; t < deg; ++t) m = std::max(m, ch[t]);
          T sum = 0;
#pragma omp simd reduction(+ : sum)
          for (int64_t t = 0; t < deg; ++t) {
            const T p = fast_exp(ch[t] - m);
            ch[t] = p;
            sum += p;
          }
          l[h] = sum;
          lse[i * H + h] = m + std::log(sum);
        }
      } else {
        std::fill(c, c + H * deg, T(1));
        for (int64_t h = 0; h < H; ++h) lse[i * H + h] = T(0);
      }
      if (weight.on())
        for (int64_t h = 0; h < H; ++h)
          for (int64_t t = 0; t < deg; ++t) c[h * deg + t] *= weight.at(eid[e0 + t], h);
      // SpMM: acc = sum_e c_e v_j
      std::fill(acc.begin(), acc.end(), T(0));
      for (int64_t e = e0; e < e1; ++e) {
        if (!softmax && e + kPrefetch < e1)
          prefetch_row(v + static_cast<int64_t>(col[e + kPrefetch]) * HD, HD);
        const T* vj = v + static_cast<int64_t>(col[e]) * HD;
        for (int64_t h = 0; h < H; ++h)
          axpy<DT>(acc.data() + h * D, c[h * deg + (e - e0)], vj + h * D, D);
        if (ef != nullptr) {
          const T* fe = ef + static_cast<int64_t>(eid[e]) * HD;
          for (int64_t h = 0; h < H; ++h)
            axpy<DT>(acc.data() + h * D, c[h * deg + (e - e0)], fe + h * D, D);
        }
      }
      for (int64_t h = 0; h < H; ++h) {
        const T inv = softmax ? T(1) / l[h] : T(1);
        for (int64_t d = 0; d < D; ++d) oi[h * D + d] = acc[h * D + d] * inv;
      }
    }
  });
}

// ------------------------------------------------------------------ backward, destination pass
template <typename T, int DT>
void backward_dst_impl(const T* q, const T* k, const T* v, const T* out, const T* dout, const T* lse,
                       const int32_t* rowptr, const int32_t* col, const int32_t* eid,
                       EdgeField<T> bias, EdgeField<T> weight, const T* ef, T* dq,
                       EdgeField<T> dbias, EdgeField<T> dweight, T* def, T* dterm, int64_t R,
                       int64_t H, int64_t Drt, T scale, bool softmax) {
  const int64_t D = DT > 0 ? DT : Drt;
  const int64_t HD = H * D;
  parallel_rows(rowptr, R, [&](int64_t r0, int64_t r1) {
    const int64_t e_end = rowptr[r1];
    std::vector<T> sbuf, gbuf, dqa(HD);
    for (int64_t i = r0; i < r1; ++i) {
      const int64_t e0 = rowptr[i], e1 = rowptr[i + 1], deg = e1 - e0;
      const T* qi = q + i * HD;
      const T* doi = dout + i * HD;
      for (int64_t h = 0; h < H; ++h)
        dterm[i * H + h] = softmax ? dot<DT>(doi + h * D, out + i * HD + h * D, D) : T(0);
      if (deg == 0) {
        if (dq != nullptr) std::fill(dq + i * HD, dq + (i + 1) * HD, T(0));
        continue;
      }
      T* s = grow(sbuf, H * deg);  // scores, then p
      T* g = grow(gbuf, H * deg);  // g = dO . v, then ds
      const auto dots = [&](int64_t t, int64_t j) {
        head_dots<DT>(doi, v + j * HD, g + t, deg, H, D);
        if (softmax) head_dots<DT>(qi, k + j * HD, s + t, deg, H, D);
      };
      // the keys only for softmax (a row of width 0 is not prefetched)
      for_each_entry(col, e0, deg, e_end, dots, gathered(k, softmax ? HD : 0), gathered(v, HD));
      if (ef != nullptr)  // dO_i . f_e and q_i . f_e
        for (int64_t t = 0; t < deg; ++t) {
          const T* ft = ef + static_cast<int64_t>(eid[e0 + t]) * HD;
          for (int64_t h = 0; h < H; ++h) {
            g[h * deg + t] += dot<DT>(doi + h * D, ft + h * D, D);
            if (softmax) s[h * deg + t] += dot<DT>(qi + h * D, ft + h * D, D);
          }
        }
      if (!softmax) {  // weighted mode: dweight = g, df_e = w_e dO_i
        if (dweight.on())
          for (int64_t h = 0; h < H; ++h)
            for (int64_t t = 0; t < deg; ++t) dweight.ref(eid[e0 + t], h) += g[h * deg + t];
        if (def != nullptr)
          for (int64_t t = 0; t < deg; ++t) {
            const int64_t uid = eid[e0 + t];
            for (int64_t h = 0; h < H; ++h) {
              const T w = weight.on() ? weight.at(uid, h) : T(1);
              T* dfe = def + uid * HD + h * D;
              for (int64_t d = 0; d < D; ++d) dfe[d] = w * doi[h * D + d];
            }
          }
        continue;
      }
      for (int64_t h = 0; h < H; ++h) {
        T* sh = s + h * deg;
        T* gh = g + h * deg;
        const T lse_h = lse[i * H + h], Dt = dterm[i * H + h];
        if (bias.on())
          for (int64_t t = 0; t < deg; ++t) sh[t] = sh[t] * scale + bias.at(eid[e0 + t], h) - lse_h;
        else
          for (int64_t t = 0; t < deg; ++t) sh[t] = sh[t] * scale - lse_h;
#pragma omp simd
        for (int64_t t = 0; t < deg; ++t) sh[t] = fast_exp(sh[t]);
        for (int64_t t = 0; t < deg; ++t) {
          const int64_t uid = eid[e0 + t];
          const T p = sh[t];
          const T w = weight.on() ? weight.at(uid, h) : T(1);
          if (dweight.on()) dweight.ref(uid, h) += p * gh[t];
          const T ds = p * (w * gh[t] - Dt);
          if (dbias.on()) dbias.ref(uid, h) += ds;
          gh[t] = ds * scale;
          if (def != nullptr) {  // df_e = scale ds q_i + p w dO_i
            T* dfe = def + uid * HD + h * D;
            const T pw = p * w;
            for (int64_t d = 0; d < D; ++d) dfe[d] = gh[t] * qi[h * D + d] + pw * doi[h * D + d];
          }
        }
      }
      if (dq != nullptr) {
        std::fill(dqa.begin(), dqa.end(), T(0));
        for (int64_t e = e0; e < e1; ++e) {
          const T* kj = k + static_cast<int64_t>(col[e]) * HD;
          for (int64_t h = 0; h < H; ++h)
            axpy<DT>(dqa.data() + h * D, g[h * deg + (e - e0)], kj + h * D, D);
          if (ef != nullptr) {
            const T* fe = ef + static_cast<int64_t>(eid[e]) * HD;
            for (int64_t h = 0; h < H; ++h)
              axpy<DT>(dqa.data() + h * D, g[h * deg + (e - e0)], fe + h * D, D);
          }
        }
        std::copy(dqa.begin(), dqa.end(), dq + i * HD);
      }
    }
  });
}

// ----------------------------------------------------------------------- backward, source pass
template <typename T, int DT>
void backward_src_impl(const T* q, const T* k, const T* v, const T* dout, const T* lse,
                       const T* dterm, const int32_t* colptr, const int32_t* crow,
                       const int32_t* cuid, EdgeField<T> bias, EdgeField<T> weight, const T* ef,
                       T* dk, T* dv, int64_t R, int64_t S, int64_t H, int64_t Drt, T scale,
                       bool softmax) {
  const int64_t D = DT > 0 ? DT : Drt;
  const int64_t HD = H * D;
  // (lse, Dterm) of each target row side by side: one cache line per gathered row
  std::vector<T> stats(softmax ? 2 * R * H : 0);
  if (softmax) {
    at::parallel_for(0, R, 4096, [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i)
        for (int64_t h = 0; h < H; ++h) {
          stats[2 * (i * H + h)] = lse[i * H + h];
          stats[2 * (i * H + h) + 1] = dterm[i * H + h];
        }
    });
  }
  const T* st = stats.data();
  parallel_rows(colptr, S, [&](int64_t j0, int64_t j1) {
    const int64_t c_end = colptr[j1];
    std::vector<T> pbuf, cbuf, tmp(H), dka(HD), dva(HD);
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t c0 = colptr[j], c1 = colptr[j + 1], n = c1 - c0;
      const T* kj = k + j * HD;
      const T* vj = v + j * HD;
      std::fill(dka.begin(), dka.end(), T(0));
      std::fill(dva.begin(), dva.end(), T(0));
      if (n > 0) {
        T* p = grow(pbuf, H * n);   // p (softmax) then p * w: coefficient of dO_i in dv_j
        T* ds = grow(cbuf, H * n);  // g = dO_i . v_j, then ds * scale: coefficient of q_i in dk_j
        if (softmax) {
          const auto logits = [&](int64_t t, int64_t i) {
            head_dots<DT>(q + i * HD, kj, tmp.data(), 1, H, D);
            if (dk != nullptr) head_dots<DT>(dout + i * HD, vj, ds + t, n, H, D);
            if (ef != nullptr) {  // q_i . f_e and dO_i . f_e
              const T* fe = ef + static_cast<int64_t>(cuid[c0 + t]) * HD;
              for (int64_t h = 0; h < H; ++h) {
                tmp[h] += dot<DT>(q + i * HD + h * D, fe + h * D, D);
                if (dk != nullptr) ds[h * n + t] += dot<DT>(dout + i * HD + h * D, fe + h * D, D);
              }
            }
            for (int64_t h = 0; h < H; ++h) {
              T sc = tmp[h] * scale;
              if (bias.on()) sc += bias.at(cuid[c0 + t], h);
              p[h * n + t] = sc - st[2 * (i * H + h)];
            }
          };
          // the rows of each target i: q, dO and (lse, Dterm)
          for_each_entry(crow, c0, n, c_end, logits, gathered(q, HD), gathered(dout, HD),
                         gathered(st, 2 * H));
#pragma omp simd
          for (int64_t x = 0; x < H * n; ++x) p[x] = fast_exp(p[x]);
          for (int64_t h = 0; h < H; ++h)
            for (int64_t t = 0; t < n; ++t) {
              const int64_t c = c0 + t;
              const T w = weight.on() ? weight.at(cuid[c], h) : T(1);
              if (dk != nullptr) {
                const T Dt = st[2 * (static_cast<int64_t>(crow[c]) * H + h) + 1];
                ds[h * n + t] = p[h * n + t] * (w * ds[h * n + t] - Dt) * scale;
              }
              p[h * n + t] *= w;
            }
        } else {
          for (int64_t h = 0; h < H; ++h)
            for (int64_t t = 0; t < n; ++t) p[h * n + t] = weight.on() ? weight.at(cuid[c0 + t], h) : T(1);
        }
        for (int64_t c = c0; c < c1; ++c) {
          if (!softmax && c + kPrefetch < c_end)
            prefetch_row(dout + static_cast<int64_t>(crow[c + kPrefetch]) * HD, HD);
          const int64_t i = crow[c], t = c - c0;
          for (int64_t h = 0; h < H; ++h) {
            if (dk != nullptr) axpy<DT>(dka.data() + h * D, ds[h * n + t], q + i * HD + h * D, D);
            axpy<DT>(dva.data() + h * D, p[h * n + t], dout + i * HD + h * D, D);
          }
        }
      }
      if (dk != nullptr) std::copy(dka.begin(), dka.end(), dk + j * HD);
      if (dv != nullptr) std::copy(dva.begin(), dva.end(), dv + j * HD);
    }
  });
}

// ------------------------------------------------------------------- attention probabilities
template <typename T, int DT>
void probs_impl(const T* q, const T* k, const T* lse, const int32_t* rowptr, const int32_t* col,
                const int32_t* eid, EdgeField<T> bias, const T* ef, T* p, int64_t R, int64_t H,
                int64_t Drt, T scale) {
  const int64_t D = DT > 0 ? DT : Drt;
  const int64_t HD = H * D;
  parallel_rows(rowptr, R, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) {
      const T* qi = q + i * HD;
      for (int64_t e = rowptr[i]; e < rowptr[i + 1]; ++e) {
        const T* kj = k + static_cast<int64_t>(col[e]) * HD;
        const int64_t uid = eid[e];
        for (int64_t h = 0; h < H; ++h) {
          T dots = dot<DT>(qi + h * D, kj + h * D, D);
          if (ef != nullptr) dots += dot<DT>(qi + h * D, ef + uid * HD + h * D, D);
          T sc = dots * scale;
          if (bias.on()) sc += bias.at(uid, h);
          p[uid * H + h] = fast_exp(sc - lse[i * H + h]);
        }
      }
    }
  });
}

// ------------------------------------------------------------------------------------ checks
constexpr const char* kKernel = "graphattn fused";

void check_graph(const Tensor& rowptr, const Tensor& col, const Tensor& eid) {
  TORCH_CHECK(rowptr.scalar_type() == at::kInt && col.scalar_type() == at::kInt &&
                  eid.scalar_type() == at::kInt,
              "graphattn fused: graph indices must be int32");
  TORCH_CHECK(rowptr.is_contiguous() && col.is_contiguous() && eid.is_contiguous(),
              "graphattn fused: graph indices must be contiguous");
  TORCH_CHECK(col.numel() == eid.numel(), "graphattn fused: col and eid differ in length");
}

// Node tensors have q's (here: ref's) dtype, H and D.
void check_nodes(const Tensor& t, const Tensor& ref, const char* name) {
  graphattn_csrc::check_nodes(kKernel, t, ref, ref.scalar_type(), name,
                              "[rows, H, D] tensor like q");
}

// bias and weight: [E] or [E, H] of ref's dtype.
void check_fields(const OptTensor& bias, const OptTensor& weight, int64_t E, int64_t H,
                  const Tensor& ref) {
  const char* expected = "[E] or [E, H] tensor like q";
  graphattn_csrc::check_edge(kKernel, bias, E, H, ref.scalar_type(), "bias", expected);
  graphattn_csrc::check_edge(kKernel, weight, E, H, ref.scalar_type(), "weight", expected);
}

// Edge features: [E, H, D] contiguous, of ref's dtype.
void check_features(const OptTensor& ef, int64_t E, const Tensor& ref) {
  if (!present(ef)) return;
  TORCH_CHECK(ef->scalar_type() == ref.scalar_type() && ef->is_contiguous() && ef->dim() == 3 &&
                  ef->size(0) == E && ef->size(1) == ref.size(1) && ef->size(2) == ref.size(2),
              "graphattn fused: edge features must be a contiguous [E, H, D] tensor like v");
}

// ---------------------------------------------------------------------------------- operators
// Runs the lambda __VA_ARGS__ with `scalar_t` the floating dtype TYPE and `constexpr int DT` the
// head dimension D (GA_DISPATCH_D).
#define GA_DISPATCH_FLOATING_D(TYPE, NAME, D, ...) \
  AT_DISPATCH_FLOATING_TYPES(TYPE, NAME, [&] { GA_DISPATCH_D(D, __VA_ARGS__); })

std::tuple<Tensor, Tensor> forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& rowptr, const Tensor& col, const Tensor& eid,
                                   const OptTensor& bias, const OptTensor& weight, double scale,
                                   bool softmax, const OptTensor& ef) {
  check_graph(rowptr, col, eid);
  check_nodes(v, v, "v");
  const int64_t R = rowptr.numel() - 1, H = v.size(1), D = v.size(2), E = col.numel();
  if (softmax) {
    check_nodes(q, v, "q");
    check_nodes(k, v, "k");
    TORCH_CHECK(q.size(0) == R, "graphattn fused: q must have one row per target row");
    TORCH_CHECK(k.size(0) == v.size(0), "graphattn fused: k and v differ in rows");
  }
  check_fields(bias, weight, E, H, v);
  check_features(ef, E, v);
  Tensor out = at::empty({R, H, D}, v.options());
  Tensor lse = at::empty({R, H}, v.options());
  GA_DISPATCH_FLOATING_D(v.scalar_type(), "graphattn_fused_forward", D, [&] {
    forward_impl<scalar_t, DT>(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(),
                               v.data_ptr<scalar_t>(), rowptr.data_ptr<int32_t>(),
                               col.data_ptr<int32_t>(), eid.data_ptr<int32_t>(),
                               EdgeField<scalar_t>(bias, H), EdgeField<scalar_t>(weight, H),
                               present(ef) ? ef->data_ptr<scalar_t>() : nullptr,
                               out.data_ptr<scalar_t>(), lse.data_ptr<scalar_t>(), R, H, D,
                               static_cast<scalar_t>(scale), softmax);
  });
  return {out, lse};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> backward_dst(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
    const Tensor& lse, const Tensor& rowptr, const Tensor& col, const Tensor& eid,
    const OptTensor& bias, const OptTensor& weight, double scale, bool softmax, bool need_dq,
    bool need_dbias, bool need_dweight, const OptTensor& ef, bool need_def) {
  check_graph(rowptr, col, eid);
  check_nodes(v, v, "v");
  check_nodes(out, v, "out");
  check_nodes(dout, v, "dout");
  const int64_t R = rowptr.numel() - 1, H = v.size(1), D = v.size(2), E = col.numel();
  TORCH_CHECK(out.size(0) == R && dout.size(0) == R, "graphattn fused: out must have R rows");
  if (softmax) {
    check_nodes(q, v, "q");
    check_nodes(k, v, "k");
    TORCH_CHECK(q.size(0) == R && lse.numel() == R * H, "graphattn fused: q / lse must have R rows");
  }
  check_fields(bias, weight, E, H, v);
  Tensor dq = need_dq && softmax ? at::empty_like(q) : Tensor();
  Tensor dbias = zeros_if(need_dbias, bias);
  Tensor dweight = zeros_if(need_dweight, weight);
  check_features(ef, E, v);
  // every edge of a row writes its own df_e; edges in no row (none here) would keep the zeros
  Tensor def = need_def && present(ef) ? at::zeros_like(*ef) : Tensor();
  Tensor dterm = at::empty({R, H}, v.options());
  GA_DISPATCH_FLOATING_D(v.scalar_type(), "graphattn_fused_backward_dst", D, [&] {
    backward_dst_impl<scalar_t, DT>(
        q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
        out.data_ptr<scalar_t>(), dout.data_ptr<scalar_t>(), lse.data_ptr<scalar_t>(),
        rowptr.data_ptr<int32_t>(), col.data_ptr<int32_t>(), eid.data_ptr<int32_t>(),
        EdgeField<scalar_t>(bias, H), EdgeField<scalar_t>(weight, H),
        present(ef) ? ef->data_ptr<scalar_t>() : nullptr, data_or_null<scalar_t>(dq),
        EdgeField<scalar_t>(dbias, H), EdgeField<scalar_t>(dweight, H),
        data_or_null<scalar_t>(def), dterm.data_ptr<scalar_t>(), R, H, D,
        static_cast<scalar_t>(scale), softmax);
  });
  return {dq, dbias, dweight, dterm, def};
}

std::tuple<Tensor, Tensor> backward_src(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& dout, const Tensor& lse, const Tensor& dterm,
                                        const Tensor& colptr, const Tensor& crow,
                                        const Tensor& cuid, const OptTensor& bias,
                                        const OptTensor& weight, double scale, bool softmax,
                                        bool need_dk, bool need_dv, const OptTensor& ef) {
  check_graph(colptr, crow, cuid);
  check_nodes(v, v, "v");
  check_nodes(dout, v, "dout");
  const int64_t S = colptr.numel() - 1, H = v.size(1), D = v.size(2), E = crow.numel();
  TORCH_CHECK(v.size(0) == S, "graphattn fused: v needs one row per source");
  if (softmax) {
    check_nodes(q, v, "q");
    check_nodes(k, v, "k");
    TORCH_CHECK(k.size(0) == S && q.size(0) == dout.size(0) &&
                    lse.numel() == dout.size(0) * H && dterm.numel() == dout.size(0) * H,
                "graphattn fused: bad q / k / lse / dterm rows");
  }
  check_fields(bias, weight, E, H, v);
  check_features(ef, E, v);
  Tensor dk = need_dk && softmax ? at::empty_like(k) : Tensor();
  Tensor dv = need_dv ? at::empty_like(v) : Tensor();
  if (!dk.defined() && !dv.defined()) return {dk, dv};
  GA_DISPATCH_FLOATING_D(v.scalar_type(), "graphattn_fused_backward_src", D, [&] {
    backward_src_impl<scalar_t, DT>(
        q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
        dout.data_ptr<scalar_t>(), lse.data_ptr<scalar_t>(), dterm.data_ptr<scalar_t>(),
        colptr.data_ptr<int32_t>(), crow.data_ptr<int32_t>(), cuid.data_ptr<int32_t>(),
        EdgeField<scalar_t>(bias, H), EdgeField<scalar_t>(weight, H),
        present(ef) ? ef->data_ptr<scalar_t>() : nullptr, data_or_null<scalar_t>(dk),
        data_or_null<scalar_t>(dv), dout.size(0), S, H, D,
        static_cast<scalar_t>(scale), softmax);
  });
  return {dk, dv};
}

Tensor probs(const Tensor& q, const Tensor& k, const Tensor& lse, const Tensor& rowptr,
             const Tensor& col, const Tensor& eid, const OptTensor& bias, double scale,
             const OptTensor& ef) {
  check_graph(rowptr, col, eid);
  check_nodes(q, q, "q");
  check_nodes(k, q, "k");
  const int64_t R = rowptr.numel() - 1, H = q.size(1), D = q.size(2), E = col.numel();
  check_fields(bias, std::nullopt, E, H, q);
  check_features(ef, E, q);
  Tensor p = at::empty({E, H}, q.options());
  GA_DISPATCH_FLOATING_D(q.scalar_type(), "graphattn_fused_probs", D, [&] {
    probs_impl<scalar_t, DT>(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(),
                             lse.data_ptr<scalar_t>(), rowptr.data_ptr<int32_t>(),
                             col.data_ptr<int32_t>(), eid.data_ptr<int32_t>(),
                             EdgeField<scalar_t>(bias, H),
                             present(ef) ? ef->data_ptr<scalar_t>() : nullptr,
                             p.data_ptr<scalar_t>(), R, H, D,
                             static_cast<scalar_t>(scale));
  });
  return p;
}

// ------------------------------------------------------------------------ graph preparation
// Stable counting sort of the edges by row (target, or target * H + head): rowptr, col (source, or
// source * H + head) and eid (the caller's edge id) in CSR order, all int32. Checks every index.
std::tuple<Tensor, Tensor, Tensor> build_csr(const Tensor& src, const Tensor& dst,
                                             const OptTensor& head, int64_t num_heads,
                                             int64_t num_targets, int64_t num_sources) {
  TORCH_CHECK(src.scalar_type() == at::kLong && dst.scalar_type() == at::kLong &&
                  src.is_contiguous() && dst.is_contiguous() && src.numel() == dst.numel(),
              "graphattn fused: src and dst must be contiguous int64 tensors of equal length");
  const bool per_head = present(head);
  const int64_t E = src.numel();
  const int64_t Hm = per_head ? num_heads : 1;
  const int64_t R = num_targets * Hm, S = num_sources * Hm;
  const int64_t lim = std::numeric_limits<int32_t>::max();
  TORCH_CHECK(E < lim && R < lim && S < lim, "graphattn fused: graph too large for int32 indices");
  const int64_t* s = src.data_ptr<int64_t>();
  const int64_t* d = dst.data_ptr<int64_t>();
  const int64_t* hd = nullptr;
  if (per_head) {
    TORCH_CHECK(head->scalar_type() == at::kLong && head->is_contiguous() && head->numel() == E,
                "graphattn fused: head must be a contiguous int64 tensor [E]");
    hd = head->data_ptr<int64_t>();
  }
  auto i32 = src.options().dtype(at::kInt);
  Tensor rowptr = at::zeros({R + 1}, i32);
  Tensor col = at::empty({E}, i32);
  Tensor eid = at::empty({E}, i32);
  int32_t* rp = rowptr.data_ptr<int32_t>();
  for (int64_t e = 0; e < E; ++e) {
    const int64_t h = per_head ? hd[e] : 0;
    TORCH_CHECK(d[e] >= 0 && d[e] < num_targets, "graphattn fused: target ", d[e], " of edge ", e,
                " out of range [0, ", num_targets, ")");
    TORCH_CHECK(s[e] >= 0 && s[e] < num_sources, "graphattn fused: source ", s[e], " of edge ", e,
                " out of range [0, ", num_sources, ")");
    TORCH_CHECK(h >= 0 && h < Hm, "graphattn fused: head ", h, " of edge ", e, " out of range");
    rp[d[e] * Hm + h + 1] += 1;
  }
  for (int64_t r = 0; r < R; ++r) rp[r + 1] += rp[r];
  std::vector<int32_t> pos(rp, rp + R);
  int32_t* cp = col.data_ptr<int32_t>();
  int32_t* ep = eid.data_ptr<int32_t>();
  for (int64_t e = 0; e < E; ++e) {
    const int64_t h = per_head ? hd[e] : 0;
    const int32_t p = pos[d[e] * Hm + h]++;
    cp[p] = static_cast<int32_t>(s[e] * Hm + h);
    ep[p] = static_cast<int32_t>(e);
  }
  return {rowptr, col, eid};
}

}  // namespace
}  // namespace graphattn_fused

TORCH_LIBRARY(graphattn_fused, m) {
  m.def("forward", &graphattn_fused::forward);
  m.def("backward_dst", &graphattn_fused::backward_dst);
  m.def("backward_src", &graphattn_fused::backward_src);
  m.def("probs", &graphattn_fused::probs);
  m.def("build_csr", &graphattn_fused::build_csr);
}
