// graphattn: the SBM samplers' tables and draws compiled for the CPU: fastRG's inverse-CDF tables
// and per-edge draws, the Bernoulli sampler's per-pair uniforms (graphattn/producers/sbm/fastrg.py, sbm/bernoulli.py).
//
// The torch path expands every per-row value to the edges (repeat_interleave), hashes the keyed
// uniforms with int64 arithmetic (MurmurHash3's finaliser, 32-bit products split in halves) and
// inverts three CDFs with a guide table and a vectorised walk: dozens of passes over the edges. Here
// two loops do it per edge (the second visits a block's edges grouped by key column, so that each
// column's table is walked at once), with the same integers and the same float64 operations, so
// the edges are the torch path's, bit for bit and in the same order, on any number of threads. The
// edges are processed in blocks (2^14 to 2^20 edges) without any random access to an E-sized array:
//
//   h      = mix32(key_r ^ d)                     d: the draw's number within its row
//   u_w    = (mix32(h ^ w) + 1/2) / 2^32           w = 0, 1, 2
//   V      = search(v_keys, v_guide, r k, k, r, u_0) - r k
//   I      = search(y_keys, y_guide, i_start_r, n_r, i_off_r, u_1) - i_start_r
//   c      = h_r k + V,  s = c Nb + first_r
//   J      = search(z_keys, z_guide, s, n_r, base_r + z_col_offset_c, u_2) - s
//   edge   = (I + first_r + n0, J + first_r + n0, h_r)
//
// search(keys, guide, start, L, off, u): the first index p of the segment [start, start + L) with
// keys[p] > u + off (the last index if none): with a guide table from guide[start + floor(u L)]
// walking forward, without one a binary search over all keys (torch.searchsorted(right=True))
// clamped to the segment.

// No floating-point contraction in this file: a fused multiply-add (allowed by default for C++ on
// some compilers) would round differently from torch's separate product and sum, and the tables
// must equal the torch path's bit for bit.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

namespace graphattn_sbm {

inline uint32_t mix32(uint32_t x) {  // MurmurHash3 fmix32 (keyed_random.mix32)
  x ^= x >> 16;
  x *= 0x85EBCA6BU;
  x ^= x >> 13;
  x *= 0xC2B2AE35U;
  x ^= x >> 16;
  return x;
}

inline double uniform(uint32_t h, uint32_t w) {  // KeyedRows.uniform(w) of a key h, float64
  return (static_cast<double>(mix32(h ^ w)) + 0.5) * 2.3283064365386963e-10;  // 2^-32
}

struct Table {
  const double* keys;
  const int64_t* guide;  // nullptr: no guide table
  int64_t size;
};

inline int64_t search(const Table& t, int64_t start, int64_t length, double offset, double u) {
  const int64_t last = start + (length - 1);
  const double target = u + offset;
  if (t.guide == nullptr) {
    const int64_t pos = std::upper_bound(t.keys, t.keys + t.size, target) - t.keys;
    return std::min(std::max(pos, start), last);
  }
  const int64_t cell = static_cast<int64_t>(u * static_cast<double>(length));
  int64_t pos = t.guide[std::min(start + cell, last)];
  // the walk is 0 or 1 steps most of the time (about 0.5 on average): two steps without a
  // branch (a random taken/not-taken branch is mispredicted half the time), then the rare rest
  pos += static_cast<int64_t>(t.keys[pos] <= target) & static_cast<int64_t>(pos < last);
  pos += static_cast<int64_t>(t.keys[pos] <= target) & static_cast<int64_t>(pos < last);
  while (t.keys[pos] <= target && pos < last) ++pos;
  return pos;
}

Table table(const at::Tensor& keys, const at::Tensor& guide, const char* name) {
  TORCH_CHECK(keys.device().is_cpu() && keys.scalar_type() == at::kDouble && keys.is_contiguous(),
              "graphattn sbm_fastrg_draws: ", name, " keys must be a contiguous float64 CPU tensor");
  const bool has_guide = guide.numel() > 0;
  if (has_guide) {
    TORCH_CHECK(guide.scalar_type() == at::kLong && guide.is_contiguous() &&
                    guide.numel() == keys.numel(),
                "graphattn sbm_fastrg_draws: ", name, " guide must be int64, one per key");
  }
  return {keys.const_data_ptr<double>(), has_guide ? guide.const_data_ptr<int64_t>() : nullptr,
          keys.numel()};
}

template <typename T>
const T* ptr(const at::Tensor& t, at::ScalarType type, int64_t n, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == type && t.is_contiguous() && t.numel() == n,
              "graphattn sbm_fastrg_draws: '", name, "' must be a contiguous CPU tensor of ", n,
              " elements of type ", type);
  return t.const_data_ptr<T>();
}

// The draws of the pieces (rows[p], counts[p] draws from draw number offsets[p]); per-row values
// indexed by the row.
std::tuple<at::Tensor, at::Tensor, at::Tensor> fastrg_draws(
    const at::Tensor& rows, const at::Tensor& counts, const at::Tensor& offsets,
    const at::Tensor& row_key, const at::Tensor& row_head, const at::Tensor& row_first,
    const at::Tensor& row_n, const at::Tensor& row_base, const at::Tensor& row_i_start,
    const at::Tensor& row_i_off, const at::Tensor& v_keys, const at::Tensor& v_guide,
    const at::Tensor& y_keys, const at::Tensor& y_guide, const at::Tensor& z_keys,
    const at::Tensor& z_guide, const at::Tensor& z_col_offset, int64_t k, int64_t Nb, int64_t n0) {
  const int64_t P = rows.numel(), R = row_key.numel();
  const int64_t* prow = ptr<int64_t>(rows, at::kLong, P, "rows");
  const int64_t* pcnt = ptr<int64_t>(counts, at::kLong, P, "counts");
  const int64_t* poff = ptr<int64_t>(offsets, at::kLong, P, "offsets");
  const int64_t* key = ptr<int64_t>(row_key, at::kLong, R, "row_key");
  const int64_t* head = ptr<int64_t>(row_head, at::kLong, R, "row_head");
  const int64_t* first = ptr<int64_t>(row_first, at::kLong, R, "row_first");
  const int64_t* nsz = ptr<int64_t>(row_n, at::kLong, R, "row_n");
  const double* base = ptr<double>(row_base, at::kDouble, R, "row_base");
  const int64_t* istart = ptr<int64_t>(row_i_start, at::kLong, R, "row_i_start");
  const double* ioff = ptr<double>(row_i_off, at::kDouble, R, "row_i_off");
  const Table vt = table(v_keys, v_guide, "v"), yt = table(y_keys, y_guide, "y"),
              zt = table(z_keys, z_guide, "z");
  const double* zcol = ptr<double>(z_col_offset, at::kDouble, z_col_offset.numel(), "z_col_offset");
  TORCH_CHECK(k > 0 && Nb >= 0, "graphattn sbm_fastrg_draws: k must be positive");
  // where each piece's edges start
  std::vector<int64_t> at_(P + 1, 0);
  for (int64_t p = 0; p < P; ++p) {
    TORCH_CHECK(prow[p] >= 0 && prow[p] < R && pcnt[p] >= 0,
                "graphattn sbm_fastrg_draws: piece ", p, " out of range");
    at_[p + 1] = at_[p] + pcnt[p];
  }
  const int64_t E = at_[P];
  auto opts = rows.options().dtype(at::kLong);
  at::Tensor src = at::empty({E}, opts), dst = at::empty({E}, opts), hd = at::empty({E}, opts);
  int64_t* ps = src.mutable_data_ptr<int64_t>();
  int64_t* pd = dst.mutable_data_ptr<int64_t>();
  int64_t* ph = hd.mutable_data_ptr<int64_t>();
  const int64_t C = z_col_offset.numel();  // H k key columns
  // The edges in blocks, each block on one thread with its own buffers:
  // * pass 1, in edge order (the row's query column and block-pair row stay cache-hot): the key
  //   h, V and I, and the key column c = h_r k + V of each edge;
  // * a counting sort of the block by c (C sequential write streams);
  // * pass 2, in that order (each column's table segment is walked by all the block's edges of
  //   that column together, not at random): J, written in that order;
  // * back to edge order by the same counting sort read the other way (a cursor per column, C
  //   sequential read streams): no random access to any E-sized array.
  // A block is long enough that each column's segment (about n_g / 4 cache lines of keys and as
  // many of guide) is walked by about n_g edges: C n_g edges, within [2^14, 2^20].
  int64_t max_n = 1;
  for (int64_t r = 0; r < R; ++r) max_n = std::max(max_n, nsz[r]);
  const int64_t kBlock = std::min(std::max(C * max_n, int64_t(1) << 14), int64_t(1) << 20);
  const int64_t nblocks = (E + kBlock - 1) / kBlock;
  at::parallel_for(0, nblocks, 1, [&](int64_t b0, int64_t b1) {
    const int64_t cap = std::min(kBlock, E);
    std::vector<uint32_t> hkey(cap), sorted_key(cap);
    std::vector<int64_t> row_of(cap), col(cap), sorted_row(cap), jbuf(cap);
    std::vector<int64_t> start(C + 1);
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t e0 = blk * kBlock, e1 = std::min(E, e0 + kBlock);
      // the first piece with edges in [e0, e1)
      int64_t p = std::upper_bound(at_.begin(), at_.end(), e0) - at_.begin() - 1;
      for (int64_t e = e0; e < e1; ++p) {
        const int64_t r = prow[p], n = nsz[r], f = first[r], h = head[r];
        const uint32_t kr = static_cast<uint32_t>(key[r]);
        const int64_t vs = r * k;
        const int64_t t_end = std::min(pcnt[p], e1 - at_[p]);
        for (int64_t t = e - at_[p]; t < t_end; ++t, ++e) {
          const uint32_t hk = mix32(kr ^ static_cast<uint32_t>(poff[p] + t));
          const int64_t v = search(vt, vs, k, static_cast<double>(r), uniform(hk, 0)) - vs;
          const int64_t i = search(yt, istart[r], n, ioff[r], uniform(hk, 1)) - istart[r];
          const int64_t q = e - e0;
          hkey[q] = hk;
          row_of[q] = r;
          col[q] = h * k + v;
          ps[e] = i + f + n0;
          ph[e] = h;
        }
      }
      const int64_t L = e1 - e0;
      std::fill(start.begin(), start.end(), 0);
      for (int64_t q = 0; q < L; ++q) {
        TORCH_CHECK(col[q] >= 0 && col[q] < C, "graphattn sbm_fastrg_draws: key column out of range");
        ++start[col[q] + 1];
      }
      for (int64_t c = 0; c < C; ++c) start[c + 1] += start[c];
      std::vector<int64_t> cursor(start.begin(), start.end() - 1);
      for (int64_t q = 0; q < L; ++q) {
        const int64_t at = cursor[col[q]]++;
        sorted_row[at] = row_of[q];
        sorted_key[at] = hkey[q];
      }
      for (int64_t c = 0; c < C; ++c) {
        for (int64_t at = start[c]; at < start[c + 1]; ++at) {
          const int64_t r = sorted_row[at], f = first[r];
          const int64_t s = c * Nb + f;
          const int64_t j = search(zt, s, nsz[r], base[r] + zcol[c], uniform(sorted_key[at], 2)) - s;
          jbuf[at] = j + f + n0;
        }
      }
      std::copy(start.begin(), start.end() - 1, cursor.begin());
      for (int64_t q = 0; q < L; ++q) pd[e0 + q] = jbuf[cursor[col[q]]++];
    }
  });
  return {src, dst, hd};
}

// The inverse-CDF tables of one block of graphs (sbm/fastrg.py: _node_tables), one column at a time
// (the torch path makes a dozen passes over the R x Nb table): for Yt = Yf^T [R, Nb] float64 and the
// block's graph pointer lptr [Gb + 1],
//   mass[g, r] = sum of Yf over the nodes of g (in node order); a column without mass in g is
//                replaced by ones there (uniform, never drawn), inv = 1 / mass (1 / n_g then)
//   keys[r, m] = r (Gb + 1) + sum_{m' <= m} Yf[m', r] inv[g(m'), r]   (running sum over all nodes)
//   guide[r Nb + t]: the guide table of each segment (sbm/fastrg.py: _guide)
// with the same float64 operations in the same order as the torch path.
std::tuple<at::Tensor, at::Tensor, at::Tensor> node_tables(const at::Tensor& Yt, const at::Tensor& lptr,
                                                           bool with_guide) {
  TORCH_CHECK(Yt.device().is_cpu() && Yt.dim() == 2 && Yt.scalar_type() == at::kDouble &&
                  Yt.is_contiguous(),
              "graphattn sbm_node_tables: 'Yt' must be a contiguous float64 CPU tensor [R, Nb]");
  const int64_t R = Yt.size(0), Nb = Yt.size(1), Gb = lptr.numel() - 1;
  const int64_t* lp = ptr<int64_t>(lptr, at::kLong, Gb + 1, "lptr");
  TORCH_CHECK(Gb >= 0 && lp[0] == 0 && lp[Gb] == Nb, "graphattn sbm_node_tables: bad 'lptr'");
  const double* y = Yt.const_data_ptr<double>();
  auto dopts = Yt.options();
  at::Tensor keys = at::empty({R * Nb}, dopts), base_t = at::empty({Gb}, dopts);
  at::Tensor guide = at::empty({with_guide ? R * Nb : 0}, dopts.dtype(at::kLong));
  double* pk = keys.mutable_data_ptr<double>();
  double* base = base_t.mutable_data_ptr<double>();
  int64_t* pg = with_guide ? guide.mutable_data_ptr<int64_t>() : nullptr;
  double acc_base = 0.0;
  for (int64_t g = 0; g < Gb; ++g) {  // non-empty graphs before g (float64, as cumsum - x)
    const double nonempty = lp[g + 1] > lp[g] ? 1.0 : 0.0;
    const double next = acc_base + nonempty;
    base[g] = next - nonempty;
    acc_base = next;
  }
  at::parallel_for(0, R, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      double running = 0.0;
      const double col_offset = static_cast<double>(r) * static_cast<double>(Gb + 1);
      double* kr = pk + r * Nb;
      const double* yr = y + r * Nb;
      for (int64_t g = 0; g < Gb; ++g) {
        const int64_t a = lp[g], b = lp[g + 1];
        double mass = 0.0;
        for (int64_t m = a; m < b; ++m) mass += yr[m];
        const bool empty = mass <= 0.0;
        const double inv = empty ? 1.0 / static_cast<double>(std::max<int64_t>(b - a, 1)) : 1.0 / mass;
        for (int64_t m = a; m < b; ++m) {
          const double term = (empty ? 1.0 : yr[m]) * inv;  // rounded, then summed (torch's order)
          running += term;
          kr[m] = running;
        }
      }
      if (pg != nullptr) {  // guide cells: element m owns [cell_{m-1}, cell_m) of the flat table
        int64_t written = r * Nb;
        for (int64_t g = 0; g < Gb; ++g) {
          const int64_t a = lp[g], b = lp[g + 1];
          const double L = static_cast<double>(b - a);
          for (int64_t m = a; m < b; ++m) {
            const double F = kr[m] - base[g];
            const double cell = (m == b - 1) ? L : std::min(std::ceil(F * L), L);
            const int64_t end = static_cast<int64_t>(cell + static_cast<double>(r * Nb + a));
            for (; written < end; ++written) pg[written] = r * Nb + m;
          }
        }
      }
      for (int64_t m = 0; m < Nb; ++m) kr[m] += col_offset;
    }
  });
  return {keys, guide, base_t};
}

// The dense Bernoulli sampler's hits (bernoulli_sample): for probabilities prob [G, H, R, C] of the
// query rows row0 .. row0 + R - 1 and key columns 0 .. C - 1, hit = u < prob with
//   u = (mix32(mix32(key_gh ^ (row0 + r)) ^ c) + 1/2) / 2^32
// (KeyedRows(key).uniform(row, col), compared in float64): the torch path's mask, bit for bit.
template <typename T>
void bernoulli_rows(const T* prob, const int64_t* keys, bool* hit, int64_t GH, int64_t R, int64_t C,
                    int64_t row0) {
  at::parallel_for(0, GH * R, 1, [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t gh = q / R, r = q % R;
      const uint32_t hr = mix32(static_cast<uint32_t>(keys[gh]) ^ static_cast<uint32_t>(row0 + r));
      const T* p = prob + q * C;
      bool* out = hit + q * C;
      for (int64_t c = 0; c < C; ++c) {
        out[c] = uniform(hr, static_cast<uint32_t>(c)) < static_cast<double>(p[c]);
      }
    }
  });
}

at::Tensor bernoulli_hits(const at::Tensor& prob, const at::Tensor& keys, int64_t row0) {
  TORCH_CHECK(prob.device().is_cpu() && prob.dim() == 4 && prob.is_contiguous() &&
                  (prob.scalar_type() == at::kFloat || prob.scalar_type() == at::kDouble),
              "graphattn sbm_bernoulli_hits: 'prob' must be a contiguous float32/float64 CPU "
              "tensor [G, H, R, C]");
  const int64_t G = prob.size(0), H = prob.size(1), R = prob.size(2), C = prob.size(3);
  const int64_t* pk = ptr<int64_t>(keys, at::kLong, G * H, "keys");
  at::Tensor hit = at::empty(prob.sizes(), prob.options().dtype(at::kBool));
  if (prob.scalar_type() == at::kFloat) {
    bernoulli_rows<float>(prob.const_data_ptr<float>(), pk, hit.mutable_data_ptr<bool>(), G * H, R,
                          C, row0);
  } else {
    bernoulli_rows<double>(prob.const_data_ptr<double>(), pk, hit.mutable_data_ptr<bool>(), G * H,
                           R, C, row0);
  }
  return hit;
}

}  // namespace graphattn_sbm

TORCH_LIBRARY_FRAGMENT(graphattn_fused, m) {
  m.def(
      "sbm_fastrg_draws(Tensor rows, Tensor counts, Tensor offsets, Tensor row_key, Tensor row_head, "
      "Tensor row_first, Tensor row_n, Tensor row_base, Tensor row_i_start, Tensor row_i_off, "
      "Tensor v_keys, Tensor v_guide, Tensor y_keys, Tensor y_guide, Tensor z_keys, Tensor z_guide, "
      "Tensor z_col_offset, int k, int Nb, int n0) -> (Tensor, Tensor, Tensor)",
      &graphattn_sbm::fastrg_draws);
  m.def("sbm_node_tables(Tensor Yt, Tensor lptr, bool with_guide) -> (Tensor, Tensor, Tensor)",
        &graphattn_sbm::node_tables);
  m.def("sbm_bernoulli_hits(Tensor prob, Tensor keys, int row0) -> Tensor",
        &graphattn_sbm::bernoulli_hits);
}
