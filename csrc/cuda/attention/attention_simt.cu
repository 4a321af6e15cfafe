/*
 * attention_simt.cu - attention for float32 and float64 inputs on the CUDA
 * cores (no tensor cores, no tf32), with the same online-softmax algorithm as
 * the tensor-core path. Accuracy first; speed is secondary here.
 *
 * Precision. Scores and dP are dot products in double (a product of two
 * floats is exact in double), taken in order d = 0, 1, ... by one shared
 * function, so every kernel that recomputes a score gets the same bits. The
 * row max m stays in double and exponentials see only the small difference
 * s - m, rounded once to the input precision: a float32 score of 2e4 is only
 * good to 1e-3, which exp() would turn into a 1e-3 relative error of P.
 * Products with V, dO, Q and K and their sums run in the input precision,
 * blocked as a GEMM's are: the KT terms of a tile are summed into a partial
 * that is then added to the running total, so the rounding error grows with
 * KT + L/KT terms rather than L (one sequential sum over 256 queries was 6x
 * less accurate than PyTorch's float32 matmul; found by the long fuzz profile).
 *
 * Layout shared by the kernels: 4 warps, R = 4 rows (queries, or keys for
 * dK/dV) per warp, 16 per CTA; the other side is streamed in tiles of KT (32
 * for float, 16 for double so that the tiles of head dim 256 fit in the shared
 * memory of an A100). In the score phase lane l takes tile element l % KT for
 * RL = R*KT/32 of the warp's rows (row group l / KT); in the accumulation phase
 * lane l takes output columns l, l+32, ... (up to 256) for all R rows, reading
 * p / dS of the tile from shared memory.
 *   oss_attn_fwd_simt_kernel      per 16 queries: m, l, o over key tiles; out, lse
 *   oss_attn_bwd_dq_simt_kernel   per 16 queries, two passes over the keys:
 *                                 1. the row statistics m, l and D = sum_j P_ij dP_ij
 *                                    (into the workspace), 2. dQ = scale * sum_j dS_ij K_j
 *   oss_attn_bwd_dkdv_simt_kernel per 16 keys, over the GQA group's query heads
 *                                 and query tiles: dV = P^T dO, dK = scale dS^T Q
 * The backward never reads the forward's lse or output: P = exp(s - m) / l and
 * D come from the very scores and dP it uses, so P sums to 1 and dS = P (dP -
 * D) cancels exactly where it should (one visible key: dS = 0), which a
 * rounded lse and a rounded output cannot give.
 * Dropout (oss_internal.h's rule, one Philox call per weight): the weight that
 * multiplies V (forward) or dO (dV) is P / (1 - p) where kept and 0 where
 * dropped, l and lse sum the weights before dropout, and the backward takes
 * dP times Z / (1 - p) in D = sum_j P_ij Z_ij dP_ij / (1 - p) (rowsum(dO * O)
 * of the dropped output) and in dS = P (Z dP / (1 - p) - D).
 * No atomics anywhere: the float32/float64 backward is always deterministic.
 * Limits: head dims up to 256; shared memory sized at run time from D and Dv.
 *
 * Also here, the 16-bit (tensor-core) backward's row passes, memory-bound
 * (see the comment above them): oss_attn_bwd_pre_kernel (D = rowsum(dO * O),
 * lse in log2 units, the float32 dQ accumulator zeroed), the mean K rows of
 * dQ's centring, and oss_attn_bwd_dq_convert_kernel (the accumulator into dq).
 */
#include <limits.h>
#include <math.h>

#include "cuda/attention/attention_common.cuh"

#define OSS_SIMT_R 4       /* rows per warp */
#define OSS_SIMT_ROWS 16   /* rows per CTA */
#define OSS_SIMT_NCOL 8    /* output columns per lane: 8 * 32 = 256 */
#define OSS_SIMT_THREADS 128

template <typename S> __device__ __forceinline__ S oss_exp(S x);
template <> __device__ __forceinline__ float oss_exp<float>(float x) { return expf(x); }
template <> __device__ __forceinline__ double oss_exp<double>(double x) { return exp(x); }
template <typename S> __device__ __forceinline__ S oss_log(S x);
template <> __device__ __forceinline__ float oss_log<float>(float x) { return logf(x); }
template <> __device__ __forceinline__ double oss_log<double>(double x) { return log(x); }

/* exp(x) for a double argument, evaluated in the input precision S. */
template <typename S> __device__ __forceinline__ double oss_simt_exp(double x) { return (double)oss_exp<S>((S)x); }

/* Loads rows [r0, r0+nrows) of a [L][cols] slice (row stride rs) into smem with
 * pitch ld; rows past `valid` are zero. */
template <typename S>
__device__ __forceinline__ void oss_simt_load(S *s, int ld, const S *g, int64_t rs, int nrows, int valid, int cols,
                                              int tid) {
  for (int idx = tid; idx < nrows * cols; idx += OSS_SIMT_THREADS) {
    const int r = idx / cols, c = idx % cols;
    s[r * ld + c] = r < valid ? g[(int64_t)r * rs + c] : (S)0;
  }
}

/* Is key j visible to query i (bounds, causal rule and window)? */
__device__ __forceinline__ bool oss_simt_visible(const oss_attn_args &a, int i, int j) {
  return i < a.lq && j < a.lk && (!a.causal || (int64_t)j <= (int64_t)i + a.causal_off) &&
         (!a.variants || oss_attn_in_window(a, i, j));
}

/* x . y in double, in order 0, 1, ..., n-1 (the same bits in every kernel). */
template <typename S> __device__ __forceinline__ double oss_simt_dot(const S *x, const S *y, int n) {
  double acc = 0;
  for (int d = 0; d < n; d++) acc = fma((double)x[d], (double)y[d], acc);
  return acc;
}

/* Score of query i (row q) and key j (row k): scale * q.k, capped (softcap),
 * minus ALiBi's slope |d| (slope: this (batch, head)'s, 0 without ALiBi),
 * plus the additive mask, or -inf where the key is hidden (causal rule,
 * bounds, window, bool mask). *dcap (when given): the derivative of the
 * capped score by the scaled one, 1 - tanh^2 (1 without softcap). */
template <typename S>
__device__ __forceinline__ double oss_simt_score(const oss_attn_args &a, const S *q, const S *k, int64_t mbase, int i,
                                                 int j, double slope = 0.0, double *dcap = nullptr) {
  if (dcap) *dcap = 1.0;
  if (!oss_simt_visible(a, i, j)) return -INFINITY;
  double v = oss_simt_dot<S>(q, k, a.d) * a.scale;
  if (a.variants) {
    if (a.softcap > 0.0) {
      const double t = tanh(v / a.softcap);
      v = a.softcap * t;
      if (dcap) *dcap = 1.0 - t * t;
    }
    if (slope != 0.0) v -= slope * fabs((double)((int64_t)i + a.var_off - j));
  }
  if (a.mask_kind) v += oss_attn_mask_value<double>(a, mbase + i * a.m_s[2] + j * a.m_s[3]);
  return v;
}

/* Whether dropout keeps weight (bh, query i, key j): oss_internal.h's rule,
 * one Philox call per weight here (the bits of the weight's group). */
__device__ __forceinline__ bool oss_simt_kept(const oss_attn_args &a, uint64_t seed, int64_t bh, int i, int j) {
  uint32_t w[4];
  oss_dropout_group(seed, (uint64_t)bh, i, j, w);
  const int k = oss_dropout_word(i, j);
  return oss_dropout_bits(k == 0 ? w[0] : (k == 1 ? w[1] : (k == 2 ? w[2] : w[3])), j) >= a.drop_thr;
}

/* The seed of a call with dropout (0 without), read from device memory. */
__device__ __forceinline__ uint64_t oss_simt_drop_seed(const oss_attn_args &a) {
  return a.drop_seed != nullptr ? *a.drop_seed : 0;
}

/* This (batch, query head)'s ALiBi slope, 0 without ALiBi. */
__device__ __forceinline__ double oss_simt_slope(const oss_attn_args &a, int b, int h) {
  return a.alibi == nullptr ? 0.0 : (double)a.alibi[(int64_t)b * a.alibi_sb + h];
}

/* Row statistics of the backward: m = max score, l = sum exp(s - m) and
 * d = sum exp(s - m) dP, updated online (one exp per score) and merged across
 * lanes. A NaN score makes l and d NaN (the whole row NaN, as in SDPA). */
typedef struct oss_simt_stat {
  double m, l, d;
} oss_simt_stat;

template <typename S> __device__ __forceinline__ void oss_simt_stat_add(oss_simt_stat &st, double v, double dp) {
  if (v == -INFINITY) return; /* hidden key: adds nothing */
  if (v > st.m) {
    const double f = oss_simt_exp<S>(st.m - v); /* m = -inf: 0 */
    st.l = st.l * f + 1.0;
    st.d = st.d * f + dp;
    st.m = v;
  } else {
    const double e = oss_simt_exp<S>(v - st.m); /* NaN score: NaN */
    st.l += e;
    st.d += e * dp;
  }
}

template <typename S> __device__ __forceinline__ oss_simt_stat oss_simt_stat_merge(oss_simt_stat x, oss_simt_stat y) {
  oss_simt_stat r;
  r.m = fmax(x.m, y.m);
  const double fx = x.m == -INFINITY ? 0.0 : oss_simt_exp<S>(x.m - r.m);
  const double fy = y.m == -INFINITY ? 0.0 : oss_simt_exp<S>(y.m - r.m);
  r.l = x.l * fx + y.l * fy;
  r.d = x.d * fx + y.d * fy;
  return r;
}

// ---------------------------------------------------------------------------
// forward
// ---------------------------------------------------------------------------
template <typename S, int KT>
__global__ void __launch_bounds__(OSS_SIMT_THREADS) oss_attn_fwd_simt_kernel(const oss_attn_args args) {
  oss_attn_args a = args; /* a sequence's view in a variable-length batch */
  constexpr int R = OSS_SIMT_R, RL = R * KT / 32, NG = 32 / KT;
  extern __shared__ __align__(16) unsigned char oss_smem[];
  const int D = a.d, DV = a.dv, LDK = D + 1;
  S *sQ = reinterpret_cast<S *>(oss_smem); /* [16][D] */
  S *sK = sQ + OSS_SIMT_ROWS * D;          /* [KT][D+1] */
  S *sV = sK + KT * LDK;                   /* [KT][DV] */
  S *sP = sV + KT * DV;                    /* [16][KT] */

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int kl = lane % KT, rg = lane / KT;
  const int64_t bh = blockIdx.y + (int64_t)gridDim.y * blockIdx.z;
  if (bh >= (int64_t)a.batch * a.hq) return;
  const int b = (int)(bh / a.hq), h = (int)(bh % a.hq), hk = h / a.group;
  oss_attn_seq_view<S>(a, b);
  const int nqb = (a.lq + OSS_SIMT_ROWS - 1) / OSS_SIMT_ROWS; /* gridDim.x, or fewer in a sequence */
  if ((int)blockIdx.x >= nqb) return;
  const int qb = a.causal ? nqb - 1 - (int)blockIdx.x : (int)blockIdx.x;
  const int i0 = qb * OSS_SIMT_ROWS;
  const int rows = min(OSS_SIMT_ROWS, a.lq - i0);
  int n_end = a.lk;
  if (a.causal) {
    const int64_t lim = (int64_t)(i0 + rows) + a.causal_off;
    n_end = (int)(lim < 0 ? 0 : (lim < a.lk ? lim : a.lk));
  }
  const S *gK = (const S *)a.k + b * a.k_s[0] + hk * a.k_s[1];
  const S *gV = (const S *)a.v + b * a.v_s[0] + hk * a.v_s[1];
  const int64_t mbase = a.mask_kind ? oss_attn_mask_base(a, b, h) : 0;
  const double slope = oss_simt_slope(a, b, h);
  const bool drop = a.drop_seed != nullptr;
  const uint64_t seed = oss_simt_drop_seed(a);

  oss_simt_load<S>(sQ, D, (const S *)a.q + b * a.q_s[0] + h * a.q_s[1] + (int64_t)i0 * a.q_s[2], a.q_s[2],
                   OSS_SIMT_ROWS, rows, D, tid);

  /* A sink starts each row as its first term: m = the sink, and the first
   * lane of the row group holds its exp(sink - m) = 1 in l. */
  S o[R][OSS_SIMT_NCOL], lpart[RL];
  double m[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    m[r] = a.sinks == nullptr ? -INFINITY : (double)a.sinks[h];
#pragma unroll
    for (int c = 0; c < OSS_SIMT_NCOL; c++) o[r][c] = 0;
  }
#pragma unroll
  for (int t = 0; t < RL; t++) lpart[t] = (a.sinks != nullptr && kl == 0) ? (S)1 : (S)0;

  for (int j0 = 0; j0 < n_end; j0 += KT) {
    __syncthreads();
    const int kv = min(KT, a.lk - j0);
    oss_simt_load<S>(sK, LDK, gK + (int64_t)j0 * a.k_s[2], a.k_s[2], KT, kv, D, tid);
    oss_simt_load<S>(sV, DV, gV + (int64_t)j0 * a.v_s[2], a.v_s[2], KT, kv, DV, tid);
    __syncthreads();

    const int j = j0 + kl;
    double x[RL];
#pragma unroll
    for (int t = 0; t < RL; t++) {
      const int rl = warp * R + rg * RL + t;
      x[t] = oss_simt_score<S>(a, sQ + rl * D, sK + kl * LDK, mbase, i0 + rl, j, slope);
    }
    /* row max over the KT lanes of each row group, then to every lane */
    double mx[RL];
#pragma unroll
    for (int t = 0; t < RL; t++) {
      mx[t] = x[t];
#pragma unroll
      for (int off = KT / 2; off >= 1; off /= 2) mx[t] = fmax(mx[t], __shfl_xor_sync(0xffffffffu, mx[t], off));
    }
    S alpha[R];
    double muse[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
      const double mt = __shfl_sync(0xffffffffu, mx[r % RL], (r / RL) * KT);
      const double m_new = fmax(m[r], mt);
      muse[r] = m_new == -INFINITY ? 0.0 : m_new;
      alpha[r] = oss_exp<S>((S)(m[r] - muse[r]));
      m[r] = m_new;
    }
#pragma unroll
    for (int t = 0; t < RL; t++) {
      double mu = muse[t];
      S al = alpha[t];
#pragma unroll
      for (int gg = 1; gg < NG; gg++)
        if (rg == gg) {
          mu = muse[gg * RL + t];
          al = alpha[gg * RL + t];
        }
      const S p = oss_exp<S>((S)(x[t] - mu)); /* NaN score: NaN, the row becomes NaN */
      lpart[t] = lpart[t] * al + p; /* l sums the weights before dropout */
      const int rl = warp * R + rg * RL + t;
      S pv = p; /* the weight that multiplies V */
      if (drop) pv = oss_simt_kept(a, seed, bh, i0 + rl, j) ? p * (S)a.drop_scale64 : (S)0;
      sP[rl * KT + kl] = pv;
    }
    __syncwarp();
#pragma unroll
    for (int r = 0; r < R; r++) {
      S tile[OSS_SIMT_NCOL] = {};
      for (int jj = 0; jj < KT; jj++) {
        const S p = sP[(warp * R + r) * KT + jj];
#pragma unroll
        for (int cc = 0; cc < OSS_SIMT_NCOL; cc++) {
          const int c = lane + 32 * cc;
          if (c < DV) tile[cc] += p * sV[jj * DV + c];
        }
      }
#pragma unroll
      for (int cc = 0; cc < OSS_SIMT_NCOL; cc++) o[r][cc] = o[r][cc] * alpha[r] + tile[cc];
    }
  }

  /* l: sum of the KT lanes' partials of each row, then to every lane */
  S ls[RL];
#pragma unroll
  for (int t = 0; t < RL; t++) {
    ls[t] = lpart[t];
#pragma unroll
    for (int off = KT / 2; off >= 1; off /= 2) ls[t] += __shfl_xor_sync(0xffffffffu, ls[t], off);
  }
  S *gO = (S *)a.out + b * a.o_s[0] + h * a.o_s[1];
  S *lse = (S *)a.lse + oss_attn_lse_row(a, bh);
#pragma unroll
  for (int r = 0; r < R; r++) {
    const S lt = __shfl_sync(0xffffffffu, ls[r % RL], (r / RL) * KT);
    const int i = i0 + warp * R + r;
    if (i < a.lq) {
      /* l == 0: no visible key (out 0, lse -inf); l NaN: NaN or +inf scores (NaN) */
      const S inv = lt == 0 ? (S)0 : (S)1 / lt;
      S *orow = gO + (int64_t)i * a.o_s[2];
#pragma unroll
      for (int cc = 0; cc < OSS_SIMT_NCOL; cc++) {
        const int c = lane + 32 * cc;
        if (c < DV) orow[c] = o[r][cc] * inv;
      }
      if (lane == 0) lse[i] = lt == 0 ? (S)(-INFINITY) : (S)(m[r] + (double)oss_log<S>(lt));
    }
  }
}

// ---------------------------------------------------------------------------
// backward: row statistics and dQ (one CTA per 16 queries)
// ---------------------------------------------------------------------------
template <typename S, int KT>
__global__ void __launch_bounds__(OSS_SIMT_THREADS) oss_attn_bwd_dq_simt_kernel(const oss_attn_args args) {
  oss_attn_args a = args; /* a sequence's view in a variable-length batch */
  constexpr int R = OSS_SIMT_R, RL = R * KT / 32;
  extern __shared__ __align__(16) unsigned char oss_smem[];
  const int D = a.d, DV = a.dv, LDK = D + 1, LDV = DV + 1;
  S *sQ = reinterpret_cast<S *>(oss_smem); /* [16][D] */
  S *sdO = sQ + OSS_SIMT_ROWS * D;         /* [16][DV] */
  S *sK = sdO + OSS_SIMT_ROWS * DV;        /* [KT][D+1] */
  S *sV = sK + KT * LDK;                   /* [KT][DV+1] */
  S *sdS = sV + KT * LDV;                  /* [16][KT] */

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int kl = lane % KT, rg = lane / KT;
  const int64_t bh = blockIdx.y + (int64_t)gridDim.y * blockIdx.z;
  if (bh >= (int64_t)a.batch * a.hq) return;
  const int b = (int)(bh / a.hq), h = (int)(bh % a.hq), hk = h / a.group;
  oss_attn_seq_view<S>(a, b);
  const int nqb = (a.lq + OSS_SIMT_ROWS - 1) / OSS_SIMT_ROWS; /* gridDim.x, or fewer in a sequence */
  if ((int)blockIdx.x >= nqb) return;
  const int qb = a.causal ? nqb - 1 - (int)blockIdx.x : (int)blockIdx.x;
  const int i0 = qb * OSS_SIMT_ROWS;
  const int rows = min(OSS_SIMT_ROWS, a.lq - i0);
  int n_end = a.lk;
  if (a.causal) {
    const int64_t lim = (int64_t)(i0 + rows) + a.causal_off;
    n_end = (int)(lim < 0 ? 0 : (lim < a.lk ? lim : a.lk));
  }
  const S *gK = (const S *)a.k + b * a.k_s[0] + hk * a.k_s[1];
  const S *gV = (const S *)a.v + b * a.v_s[0] + hk * a.v_s[1];
  const int64_t mbase = a.mask_kind ? oss_attn_mask_base(a, b, h) : 0;
  const double slope = oss_simt_slope(a, b, h);
  const S scale = (S)a.scale;
  const bool drop = a.drop_seed != nullptr;
  const uint64_t seed = oss_simt_drop_seed(a);
  /* dP of query i, key j with dropout: Z k dP, so that D = sum_j P Z k dP =
   * rowsum(dO * O) of the dropped output and dS = P (Z k dP - D) */
  auto dp_of = [&](double dp, int i, int j) {
    return !drop ? dp : (oss_simt_kept(a, seed, bh, i, j) ? dp * a.drop_scale64 : 0.0);
  };

  oss_simt_load<S>(sQ, D, (const S *)a.q + b * a.q_s[0] + h * a.q_s[1] + (int64_t)i0 * a.q_s[2], a.q_s[2],
                   OSS_SIMT_ROWS, rows, D, tid);
  oss_simt_load<S>(sdO, DV, (const S *)a.dout + b * a.do_s[0] + h * a.do_s[1] + (int64_t)i0 * a.do_s[2], a.do_s[2],
                   OSS_SIMT_ROWS, rows, DV, tid);

  /* keys j0 .. j0 + KT - 1 of K and V into shared memory (both passes) */
  auto load_kv_tile = [&](int j0) {
    const int kv = min(KT, a.lk - j0);
    oss_simt_load<S>(sK, LDK, gK + (int64_t)j0 * a.k_s[2], a.k_s[2], KT, kv, D, tid);
    oss_simt_load<S>(sV, LDV, gV + (int64_t)j0 * a.v_s[2], a.v_s[2], KT, kv, DV, tid);
  };

  /* pass 1: statistics of this lane's keys, merged over the KT lanes of each row group */
  oss_simt_stat st[RL];
#pragma unroll
  for (int t = 0; t < RL; t++) st[t].m = -INFINITY, st[t].l = 0, st[t].d = 0;
  for (int j0 = 0; j0 < n_end; j0 += KT) {
    __syncthreads();
    load_kv_tile(j0);
    __syncthreads();
#pragma unroll
    for (int t = 0; t < RL; t++) {
      const int rl = warp * R + rg * RL + t;
      const double v = oss_simt_score<S>(a, sQ + rl * D, sK + kl * LDK, mbase, i0 + rl, j0 + kl, slope);
      if (v != -INFINITY)
        oss_simt_stat_add<S>(st[t], v, dp_of(oss_simt_dot<S>(sdO + rl * DV, sV + kl * LDV, DV), i0 + rl, j0 + kl));
    }
  }
  double rm[RL], rinv[RL], rd[RL]; /* per row: m, 1/l (0 with no visible key), D */
  double *ws_m = (double *)a.lse_adj + bh * a.lq_pad, *ws_inv = (double *)a.inv_l + bh * a.lq_pad;
  double *ws_d = (double *)a.dsum + bh * a.lq_pad;
#pragma unroll
  for (int t = 0; t < RL; t++) {
#pragma unroll
    for (int off = KT / 2; off >= 1; off /= 2) {
      oss_simt_stat o;
      o.m = __shfl_xor_sync(0xffffffffu, st[t].m, off);
      o.l = __shfl_xor_sync(0xffffffffu, st[t].l, off);
      o.d = __shfl_xor_sync(0xffffffffu, st[t].d, off);
      st[t] = oss_simt_stat_merge<S>(st[t], o);
    }
    if (a.sinks != nullptr) { /* the sink's term: exp(sink - m) in l, nothing in d (no value) */
      oss_simt_stat sk;
      sk.m = (double)a.sinks[h], sk.l = 1.0, sk.d = 0.0;
      st[t] = oss_simt_stat_merge<S>(st[t], sk);
    }
    rm[t] = st[t].m;
    rinv[t] = st[t].l == 0 ? 0.0 : 1.0 / st[t].l; /* NaN stays NaN */
    rd[t] = st[t].d * rinv[t];
    const int i = i0 + warp * R + rg * RL + t; /* < lq_pad */
    if (a.dlse != nullptr && i < a.lq && st[t].l != 0) /* lse's gradient: D - dlse */
      rd[t] -= (double)((const S *)a.dlse)[oss_attn_lse_row(a, bh) + i];
    if (kl == 0) {
      ws_m[i] = rm[t];
      ws_inv[i] = rinv[t];
      ws_d[i] = rd[t];
    }
  }

  /* pass 2: dS = P (dP - D), dQ += dS K */
  S dq[R][OSS_SIMT_NCOL];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int c = 0; c < OSS_SIMT_NCOL; c++) dq[r][c] = 0;
  for (int j0 = 0; j0 < n_end; j0 += KT) {
    __syncthreads();
    load_kv_tile(j0);
    __syncthreads();
#pragma unroll
    for (int t = 0; t < RL; t++) {
      const int rl = warp * R + rg * RL + t;
      double dcap;
      const double v = oss_simt_score<S>(a, sQ + rl * D, sK + kl * LDK, mbase, i0 + rl, j0 + kl, slope, &dcap);
      double ds = 0;
      if (v != -INFINITY) {
        const double p = oss_simt_exp<S>(v - rm[t]) * rinv[t];
        ds = p * (dp_of(oss_simt_dot<S>(sdO + rl * DV, sV + kl * LDV, DV), i0 + rl, j0 + kl) - rd[t]) * dcap;
      }
      sdS[rl * KT + kl] = (S)ds;
    }
    __syncwarp();
#pragma unroll
    for (int r = 0; r < R; r++) {
      S tile[OSS_SIMT_NCOL] = {};
      for (int jj = 0; jj < KT; jj++) {
        const S ds = sdS[(warp * R + r) * KT + jj];
#pragma unroll
        for (int cc = 0; cc < OSS_SIMT_NCOL; cc++) {
          const int c = lane + 32 * cc;
          if (c < D) tile[cc] += ds * sK[jj * LDK + c];
        }
      }
#pragma unroll
      for (int cc = 0; cc < OSS_SIMT_NCOL; cc++) dq[r][cc] += tile[cc];
    }
  }

  S *gdQ = (S *)a.dq + b * a.dq_s[0] + h * a.dq_s[1];
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int i = i0 + warp * R + r;
    if (i < a.lq) {
      S *row = gdQ + (int64_t)i * a.dq_s[2];
#pragma unroll
      for (int cc = 0; cc < OSS_SIMT_NCOL; cc++) {
        const int c = lane + 32 * cc;
        if (c < D) row[c] = dq[r][cc] * scale;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// backward: dK, dV (one CTA per 16 keys of a kv head, all query heads of its
// group), from the row statistics the dQ kernel wrote
// ---------------------------------------------------------------------------
template <typename S, int KT>
__global__ void __launch_bounds__(OSS_SIMT_THREADS) oss_attn_bwd_dkdv_simt_kernel(const oss_attn_args args) {
  oss_attn_args a = args; /* a sequence's view in a variable-length batch */
  constexpr int R = OSS_SIMT_R, RL = R * KT / 32;
  extern __shared__ __align__(16) unsigned char oss_smem[];
  const int D = a.d, DV = a.dv, LDQ = D + 1, LDO = DV + 1;
  double *sM = reinterpret_cast<double *>(oss_smem); /* [KT] row max */
  double *sInv = sM + KT;                             /* [KT] 1/l */
  double *sDs = sInv + KT;                            /* [KT] D */
  S *sK = reinterpret_cast<S *>(sDs + KT);            /* [16][D] */
  S *sV = sK + OSS_SIMT_ROWS * D;                     /* [16][DV] */
  S *sQ = sV + OSS_SIMT_ROWS * DV;                    /* [KT][D+1] */
  S *sdO = sQ + KT * LDQ;                             /* [KT][DV+1] */
  S *sP = sdO + KT * LDO;                             /* [16][KT] */
  S *sdS = sP + OSS_SIMT_ROWS * KT;                   /* [16][KT] */

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int ql = lane % KT, rg = lane / KT;
  const int64_t bhk = blockIdx.y + (int64_t)gridDim.y * blockIdx.z;
  if (bhk >= (int64_t)a.batch * a.hkv) return;
  const int b = (int)(bhk / a.hkv), hk = (int)(bhk % a.hkv);
  oss_attn_seq_view<S>(a, b);
  const int j0 = blockIdx.x * OSS_SIMT_ROWS;
  if (j0 >= a.lk) return; /* past a shorter sequence's keys */
  const int kv = min(OSS_SIMT_ROWS, a.lk - j0);
  const S scale = (S)a.scale;
  const bool drop = a.drop_seed != nullptr;
  const uint64_t seed = oss_simt_drop_seed(a);

  int q_start = 0;
  if (a.causal) {
    const int64_t first = (int64_t)j0 - a.causal_off;
    q_start = first <= 0 ? 0 : (first >= a.lq ? a.lq : (int)first);
    q_start = q_start / KT * KT;
  }

  oss_simt_load<S>(sK, D, (const S *)a.k + b * a.k_s[0] + hk * a.k_s[1] + (int64_t)j0 * a.k_s[2], a.k_s[2],
                   OSS_SIMT_ROWS, kv, D, tid);
  oss_simt_load<S>(sV, DV, (const S *)a.v + b * a.v_s[0] + hk * a.v_s[1] + (int64_t)j0 * a.v_s[2], a.v_s[2],
                   OSS_SIMT_ROWS, kv, DV, tid);

  S dk[R][OSS_SIMT_NCOL], dv[R][OSS_SIMT_NCOL];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int c = 0; c < OSS_SIMT_NCOL; c++) dk[r][c] = dv[r][c] = 0;

  for (int hh = 0; hh < a.group; hh++) {
    const int h = hk * a.group + hh;
    const S *gQ = (const S *)a.q + b * a.q_s[0] + h * a.q_s[1];
    const S *gdO = (const S *)a.dout + b * a.do_s[0] + h * a.do_s[1];
    const int64_t ro = ((int64_t)b * a.hq + h) * a.lq_pad;
    const double *ws_m = (const double *)a.lse_adj + ro, *ws_inv = (const double *)a.inv_l + ro;
    const double *ws_d = (const double *)a.dsum + ro;
    const int64_t mbase = a.mask_kind ? oss_attn_mask_base(a, b, h) : 0;
    const double slope = oss_simt_slope(a, b, h);
    for (int q0 = q_start; q0 < a.lq; q0 += KT) {
      __syncthreads();
      const int qv = min(KT, a.lq - q0);
      oss_simt_load<S>(sQ, LDQ, gQ + (int64_t)q0 * a.q_s[2], a.q_s[2], KT, qv, D, tid);
      oss_simt_load<S>(sdO, LDO, gdO + (int64_t)q0 * a.do_s[2], a.do_s[2], KT, qv, DV, tid);
      if (tid < KT) { /* rows past lq are never visible: not read from the workspace */
        const bool in = q0 + tid < a.lq;
        sM[tid] = in ? ws_m[q0 + tid] : 0.0;
        sInv[tid] = in ? ws_inv[q0 + tid] : 0.0;
        sDs[tid] = in ? ws_d[q0 + tid] : 0.0;
      }
      __syncthreads();
#pragma unroll
      for (int t = 0; t < RL; t++) {
        const int kr = warp * R + rg * RL + t;
        double dcap;
        const double v = oss_simt_score<S>(a, sQ + ql * LDQ, sK + kr * D, mbase, q0 + ql, j0 + kr, slope, &dcap);
        double p = 0, ds = 0, pv = 0; /* pv: the weight that multiplied V, for dV */
        if (v != -INFINITY) {
          p = oss_simt_exp<S>(v - sM[ql]) * sInv[ql];
          double dp = oss_simt_dot<S>(sdO + ql * LDO, sV + kr * DV, DV);
          pv = p;
          if (drop) { /* dS = P (Z k dP - D), dV = (P Z k)^T dO */
            const bool kept = oss_simt_kept(a, seed, (int64_t)b * a.hq + h, q0 + ql, j0 + kr);
            dp = kept ? dp * a.drop_scale64 : 0.0;
            pv = kept ? p * a.drop_scale64 : 0.0;
          }
          ds = p * (dp - sDs[ql]) * dcap;
        }
        sP[kr * KT + ql] = (S)pv;
        sdS[kr * KT + ql] = (S)ds;
      }
      __syncwarp();
#pragma unroll
      for (int r = 0; r < R; r++) {
        S tile_v[OSS_SIMT_NCOL] = {}, tile_k[OSS_SIMT_NCOL] = {};
        for (int qq = 0; qq < KT; qq++) {
          const S p = sP[(warp * R + r) * KT + qq], ds = sdS[(warp * R + r) * KT + qq];
#pragma unroll
          for (int cc = 0; cc < OSS_SIMT_NCOL; cc++) {
            const int c = lane + 32 * cc;
            if (c < DV) tile_v[cc] += p * sdO[qq * LDO + c];
            if (c < D) tile_k[cc] += ds * sQ[qq * LDQ + c];
          }
        }
#pragma unroll
        for (int cc = 0; cc < OSS_SIMT_NCOL; cc++) {
          dv[r][cc] += tile_v[cc];
          dk[r][cc] += tile_k[cc];
        }
      }
    }
  }

  S *gdK = (S *)a.dk + b * a.dk_s[0] + hk * a.dk_s[1];
  S *gdV = (S *)a.dv_ptr + b * a.dv_s[0] + hk * a.dv_s[1];
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int j = j0 + warp * R + r;
    if (j < a.lk) {
      S *rk = gdK + (int64_t)j * a.dk_s[2], *rv = gdV + (int64_t)j * a.dv_s[2];
#pragma unroll
      for (int cc = 0; cc < OSS_SIMT_NCOL; cc++) {
        const int c = lane + 32 * cc;
        if (c < D) rk[c] = dk[r][cc] * scale;
        if (c < DV) rv[c] = dv[r][cc];
      }
    }
  }
}

// ---------------------------------------------------------------------------
// host side
// ---------------------------------------------------------------------------
template <typename S, int KT>
static oss_status oss_simt_launch(void (*kernel)(const oss_attn_args), const char *name, size_t smem, int64_t blocks,
                                  int64_t bh, const oss_attn_args *a, cudaStream_t stream,
                                  const oss_device_info *dev) {
  if (smem > (size_t)dev->max_smem_per_block_optin)
    return oss_fail(OSS_ERROR_NOT_SUPPORTED,
                    "%s for head_dim=%d, head_dim_v=%d needs %zu bytes of shared memory, the device allows %d", name,
                    a->d, a->dv, smem, dev->max_smem_per_block_optin);
  OSS_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  const int64_t y = bh < 65535 ? bh : 65535;
  const dim3 grid((unsigned)blocks, (unsigned)y, (unsigned)((bh + y - 1) / y));
  kernel<<<grid, OSS_SIMT_THREADS, smem, stream>>>(*a);
  return oss_check_launch(name);
}

template <typename S>
static oss_status oss_attn_fwd_simt_t(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev) {
  constexpr int KT = sizeof(S) == 4 ? 32 : 16;
  const size_t smem =
      sizeof(S) * ((size_t)OSS_SIMT_ROWS * a->d + (size_t)KT * (a->d + 1) + (size_t)KT * a->dv + OSS_SIMT_ROWS * KT);
  return oss_simt_launch<S, KT>(oss_attn_fwd_simt_kernel<S, KT>, "oss_attn_fwd_simt_kernel", smem,
                                (a->lq + OSS_SIMT_ROWS - 1) / OSS_SIMT_ROWS, (int64_t)a->batch * a->hq, a, stream,
                                dev);
}

/* The dQ kernel also writes the row statistics the dK/dV kernel reads, so it
 * runs first, on the same stream. */
template <typename S>
static oss_status oss_attn_bwd_simt_t(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev) {
  constexpr int KT = sizeof(S) == 4 ? 32 : 16;
  if (a->lq > 0) {
    const size_t smem = sizeof(S) * ((size_t)OSS_SIMT_ROWS * (a->d + a->dv) + (size_t)KT * (a->d + 1) +
                                     (size_t)KT * (a->dv + 1) + OSS_SIMT_ROWS * KT);
    const oss_status st = oss_simt_launch<S, KT>(oss_attn_bwd_dq_simt_kernel<S, KT>, "oss_attn_bwd_dq_simt_kernel",
                                                 smem, (a->lq + OSS_SIMT_ROWS - 1) / OSS_SIMT_ROWS,
                                                 (int64_t)a->batch * a->hq, a, stream, dev);
    if (st != OSS_OK) return st;
  }
  if (a->lk == 0) return OSS_OK;
  const size_t smem = 3 * KT * sizeof(double) + sizeof(S) * ((size_t)OSS_SIMT_ROWS * (a->d + a->dv) + (size_t)KT * (a->d + 1) +
                                                (size_t)KT * (a->dv + 1) + 2 * OSS_SIMT_ROWS * KT);
  return oss_simt_launch<S, KT>(oss_attn_bwd_dkdv_simt_kernel<S, KT>, "oss_attn_bwd_dkdv_simt_kernel", smem,
                                (a->lk + OSS_SIMT_ROWS - 1) / OSS_SIMT_ROWS, (int64_t)a->batch * a->hkv, a, stream,
                                dev);
}

oss_status oss_attn_fwd_simt(const oss_attn_args *a, oss_dtype dtype, cudaStream_t stream,
                             const oss_device_info *dev) {
  return dtype == OSS_FLOAT64 ? oss_attn_fwd_simt_t<double>(a, stream, dev) : oss_attn_fwd_simt_t<float>(a, stream, dev);
}

oss_status oss_attn_bwd_simt(const oss_attn_args *a, oss_dtype dtype, cudaStream_t stream,
                             const oss_device_info *dev) {
  return dtype == OSS_FLOAT64 ? oss_attn_bwd_simt_t<double>(a, stream, dev) : oss_attn_bwd_simt_t<float>(a, stream, dev);
}


// ---------------------------------------------------------------------------
// backward pre-pass and dQ conversion of the tensor-core kernels
// ---------------------------------------------------------------------------

/* These passes stream rows of O, dO, K or the dQ accumulator. A row goes to a
 * group of oss_attn_row_lanes(n) lanes of one warp, 8 columns a lane (one
 * 16-byte load of 16-bit elements where the rows allow, 4 to 32 lanes, so a
 * warp takes 1 to 8 rows at once), and a CTA of 256 threads takes
 * consecutive rows (OSS_ATTN_ROW_BLOCK, or oss_attn_pre_rows): the index
 * arithmetic is paid per CTA, the loads are as wide as the memory system
 * serves them. */
#define OSS_ATTN_ROW_BLOCK 64

__host__ __device__ __forceinline__ int oss_attn_row_lanes(int64_t n) {
  int lanes = 4;
  while (lanes < 32 && lanes * 8 < n) lanes *= 2;
  return lanes;
}

/* Elements [c, c + 8) of a row of 16-bit T, as they are in memory: one
 * 16-byte load where `vec` (the row 16-byte aligned) and all 8 are below n,
 * else element loads (0 past n). oss_attn_unpack8: them as float. */
template <typename T> __device__ __forceinline__ uint4 oss_attn_load8(const T *row, int64_t c, int64_t n, bool vec) {
  static_assert(sizeof(T) == 2, "16-bit elements");
  if (vec && c + 8 <= n) return *reinterpret_cast<const uint4 *>(row + c);
  uint4 u;
  T *e = reinterpret_cast<T *>(&u);
#pragma unroll
  for (int k = 0; k < 8; k++) e[k] = c + k < n ? row[c + k] : oss_from_float<T>(0.f);
  return u;
}
/* The same for 8 int8 codes of the output residual (8 bytes, zeros past n). */
__device__ __forceinline__ uint2 oss_attn_load8_codes(const int8_t *row, int64_t c, int64_t n, bool vec) {
  if (vec && c + 8 <= n) return *reinterpret_cast<const uint2 *>(row + c);
  uint2 u;
  int8_t *e = reinterpret_cast<int8_t *>(&u);
#pragma unroll
  for (int k = 0; k < 8; k++) e[k] = c + k < n ? row[c + k] : (int8_t)0;
  return u;
}
template <typename T> __device__ __forceinline__ void oss_attn_unpack8(const uint4 &u, float (&x)[8]) {
  const T *e = reinterpret_cast<const T *>(&u);
#pragma unroll
  for (int k = 0; k < 8; k++) x[k] = oss_to_float(e[k]);
}

/* Workspace rows (oss_attn_ws_row: [B*Hq][lq_pad], or in a variable-length
 * batch [Hq][ws_rows]): dsum = rowsum(dO * O) (summed in double: it is
 * subtracted from dP, where every rounding shows in dS; O plus its rounding
 * residual when the forward kept one, so D carries no rounding of the output;
 * each product of two 16-bit values is exact in float), lse_adj = lse *
 * log2(e) (+inf where lse = -inf and for padding rows), and the CTA's rows of
 * the float32 dQ accumulator (one contiguous range) zeroed when there is one.
 * A row by LANES lanes (oss_attn_row_lanes(Dv): its columns in one pass), a
 * thread's PRE_ROWS rows loaded before any is summed and stored, so that each
 * thread has all its loads in flight at once (the pass is bound by the bytes
 * in flight). *Reason for 2 rows:* with 4 a thread held 98 registers, two
 * CTAs filled an SM, and their loads stopped while both summed; 2 rows (63
 * registers) run the pass faster (docs/performance.md).
 * oss_attn_pre_rows<LANES>() rows a CTA; a dense CTA's rows are of one
 * (batch, head) (they divide lq_pad), a packed CTA's of at most two heads
 * (they are fewer than ws_rows). */
#define OSS_ATTN_PRE_ROWS 2
template <int LANES> __host__ __device__ constexpr int oss_attn_pre_rows() {
  return 256 / LANES * OSS_ATTN_PRE_ROWS < OSS_ATTN_LQ_PAD ? 256 / LANES * OSS_ATTN_PRE_ROWS : OSS_ATTN_LQ_PAD;
}

template <typename T, int LANES>
__global__ void __launch_bounds__(256) oss_attn_bwd_pre_kernel(const oss_attn_args args) {
  constexpr int ROWS = oss_attn_pre_rows<LANES>(), STEP = 256 / LANES, PER = ROWS / STEP;
  static_assert(OSS_ATTN_LQ_PAD % ROWS == 0 && ROWS % STEP == 0, "a dense CTA's rows are of one (batch, head)");
  const bool packed = args.ws_rows > 0;
  const int64_t nrows = packed ? (int64_t)args.hq * args.ws_rows : (int64_t)args.batch * args.hq * args.lq_pad;
  const int64_t r0 = (int64_t)blockIdx.x * ROWS;
  if (r0 >= nrows) return;
  const int sub = threadIdx.x % LANES, c = sub * 8; /* this lane's columns */
  const bool vec = (args.vec & OSS_ATTN_VEC_O) && (args.vec & OSS_ATTN_VEC_DO) &&
                   (args.out_res == nullptr || (args.vec & OSS_ATTN_VEC_OR));
  const bool res = args.out_res != nullptr;
  /* dense: the CTA's (batch * head); packed: the head of its first row */
  const int64_t base = packed ? r0 / args.ws_rows : r0 / args.lq_pad;
  uint4 xo[PER], xd[PER]; /* the rows' elements, unpacked once all have been loaded */
  uint2 xr[PER];          /* and the residual's codes */
  float lse[PER], dlse[PER]; /* each row's lse (-inf for padding rows) and lse's gradient (0: none) */
#pragma unroll
  for (int k = 0; k < PER; k++) {
    const int64_t row = r0 + threadIdx.x / LANES + k * STEP;
    oss_attn_args a = args; /* a sequence's view in a variable-length batch: rows past it are padding */
    int b = 0, h = 0;
    int64_t i = -1;
    if (row < nrows) {
      if (packed) {
        int64_t r = row - base * args.ws_rows;
        h = (int)base;
        if (r >= args.ws_rows) {
          r -= args.ws_rows;
          h++;
        }
        b = oss_attn_bisect(args.batch, r,
                            [&](int x) { return oss_attn_ws_base(oss_attn_cu_at(args.cu_q, args.total_q, x), x); });
        oss_attn_seq_view<T>(a, b);
        i = r - oss_attn_ws_base(a.seq_q0, b);
      } else {
        b = (int)(base / args.hq);
        h = (int)(base % args.hq);
        i = row - base * args.lq_pad;
      }
    }
    lse[k] = -INFINITY;
    dlse[k] = 0.f;
    xo[k] = xd[k] = make_uint4(0u, 0u, 0u, 0u); /* +0 in both 16-bit types */
    xr[k] = make_uint2(0u, 0u);
    if (i >= 0 && i < a.lq && c < a.dv) {
      const int64_t off_o = b * a.o_s[0] + h * a.o_s[1] + i * a.o_s[2];
      xo[k] = oss_attn_load8<T>((const T *)a.out + off_o, c, a.dv, vec);
      xd[k] = oss_attn_load8<T>((const T *)a.dout + b * a.do_s[0] + h * a.do_s[1] + i * a.do_s[2], c, a.dv, vec);
      if (res) xr[k] = oss_attn_load8_codes((const int8_t *)a.out_res + off_o, c, a.dv, vec);
    }
    if (i >= 0 && i < a.lq) {
      const int64_t at = oss_attn_lse_row(a, (int64_t)b * a.hq + h) + i;
      lse[k] = ((const float *)a.lse)[at];
      if (args.dlse != nullptr) dlse[k] = ((const float *)args.dlse)[at];
    }
  }
  if (args.dq_acc != nullptr) { /* dq_ld is a multiple of 4 and the workspace 16-byte aligned */
    float4 *acc = reinterpret_cast<float4 *>(args.dq_acc + r0 * args.dq_ld);
    const int n = (int)(min((int64_t)ROWS, nrows - r0) * args.dq_ld / 4);
    for (int e = threadIdx.x; e < n; e += 256) acc[e] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int k = 0; k < PER; k++) {
    float o[8], d[8];
    oss_attn_unpack8<T>(xo[k], o);
    oss_attn_unpack8<T>(xd[k], d);
    const int8_t *code = reinterpret_cast<const int8_t *>(&xr[k]);
    double sum = 0;
#pragma unroll
    for (int e = 0; e < 8; e++) {
      sum += (double)(o[e] * d[e]);
      if (res) /* the residual (a few bits: the product is exact) */
        sum += (double)(oss_output_residual_value(code[e], o[e], std::is_same<T, __nv_bfloat16>::value) * d[e]);
    }
#pragma unroll
    for (int off = LANES / 2; off >= 1; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    const int64_t row = r0 + threadIdx.x / LANES + k * STEP;
    if (sub == 0 && row < nrows) {
      /* lse's gradient: D - dlse (none for a row with no key, whose P is 0) */
      ((float *)args.dsum)[row] = (float)(lse[k] == -INFINITY ? sum : sum - (double)dlse[k]);
      ((float *)args.lse_adj)[row] = lse[k] == -INFINITY ? INFINITY : (float)((double)lse[k] * OSS_LOG2E); /* one rounding */
    }
  }
}

/* dq = dq_acc (already scaled) - R kmean (dQ's centring, when on; R is the
 * sum of the row's columns dq_ld - 4 and dq_ld - 3, where the dK/dV kernels
 * add it) for rows < Lq, cols < D. OSS_ATTN_ROW_BLOCK rows a CTA: grid x the
 * blocks of a (batch, head)'s Lq rows, or of a variable-length batch's packed
 * rows; y and z the (batch, head), or the head. The accumulator's and kmean's
 * rows are 16-byte aligned with at least D rounded up to 8 columns. */
template <typename T> __global__ void __launch_bounds__(256) oss_attn_bwd_dq_convert_kernel(const oss_attn_args args) {
  const bool packed = args.ws_rows > 0;
  const int64_t y = blockIdx.y + (int64_t)gridDim.y * blockIdx.z;
  if (y >= (packed ? (int64_t)args.hq : (int64_t)args.batch * args.hq)) return;
  const int lanes = oss_attn_row_lanes(args.d), per_warp = 32 / lanes;
  const int lane = threadIdx.x & 31, sub = lane % lanes;
  const bool vec = (args.vec & OSS_ATTN_VEC_DQ) != 0;
  for (int rr = (int)(threadIdx.x >> 5) * per_warp + lane / lanes; rr < OSS_ATTN_ROW_BLOCK; rr += 8 * per_warp) {
    const int64_t t = (int64_t)blockIdx.x * OSS_ATTN_ROW_BLOCK + rr;
    oss_attn_args a = args; /* a sequence's view in a variable-length batch */
    int b, h;
    int64_t i;
    if (packed) {
      if (t >= args.total_q) break;
      h = (int)y;
      b = oss_attn_row_seq(args.cu_q, args.batch, args.total_q, t);
      oss_attn_seq_view<T>(a, b);
      i = t - a.seq_q0;
    } else {
      b = (int)(y / args.hq);
      h = (int)(y % args.hq);
      i = t;
    }
    if (i < 0 || i >= a.lq) continue;
    const float *src = a.dq_acc + (oss_attn_ws_row(a, b, h) + i) * a.dq_ld;
    T *dst = (T *)a.dq + b * a.dq_s[0] + h * a.dq_s[1] + i * a.dq_s[2];
    float e = 0.f;
    const float *kbar = nullptr;
    if (a.kmean != nullptr) {
      e = src[a.dq_ld - 4] + src[a.dq_ld - 3];
      e = isfinite(e) ? e : 0.f;
      kbar = a.kmean + ((int64_t)b * a.hkv + h / a.group) * a.mean_ld;
    }
    for (int c = sub * 8; c < a.d; c += lanes * 8) {
      float x[8];
      *reinterpret_cast<float4 *>(x) = *reinterpret_cast<const float4 *>(src + c);
      *reinterpret_cast<float4 *>(x + 4) = *reinterpret_cast<const float4 *>(src + c + 4);
      if (kbar != nullptr) {
        const float4 k0 = *reinterpret_cast<const float4 *>(kbar + c), k1 = *reinterpret_cast<const float4 *>(kbar + c + 4);
        const float kb[8] = {k0.x, k0.y, k0.z, k0.w, k1.x, k1.y, k1.z, k1.w};
#pragma unroll
        for (int k = 0; k < 8; k++) x[k] -= e * kb[k];
      }
      if (vec && c + 8 <= a.d) {
        uint4 u;
        T *v = reinterpret_cast<T *>(&u);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = oss_from_float<T>(x[k]);
        *reinterpret_cast<uint4 *>(dst + c) = u;
      } else {
#pragma unroll
        for (int k = 0; k < 8; k++)
          if (c + k < a.d) dst[c + k] = oss_from_float<T>(x[k]);
      }
    }
  }
}

/* dQ's centring: the mean K row of each kv head, deterministically. Pass 1:
 * one CTA of 256 threads per (chunk of OSS_ATTN_MEAN_CHUNK rows, batch * kv
 * head); its threads take the chunk's rows by groups (a row per group, 8
 * columns a lane, as the passes above), each summing its columns over every
 * `rows`-th row in float64, and the groups' sums are added in order into
 * kmean_part (the Hopper backward writes the same sums from its K tiles
 * instead). Pass 2: one thread per (kv head, column) adds the chunks of its
 * keys in order and divides (n equal rows average exactly to that row).
 * Columns >= D and non-finite means give 0. */
template <typename T> __global__ void __launch_bounds__(256) oss_attn_kmean_part_kernel(const oss_attn_args args) {
  __shared__ double part[256 * 8];
  const int64_t bh = blockIdx.y + (int64_t)gridDim.y * blockIdx.z;
  if (bh >= (int64_t)args.batch * args.hkv) return;
  const int b = (int)(bh / args.hkv), h = (int)(bh % args.hkv);
  oss_attn_args a = args; /* a sequence's view in a variable-length batch: chunks past its keys sum to 0 */
  oss_attn_seq_view<T>(a, b);
  const int chunks = (args.lk + OSS_ATTN_MEAN_CHUNK - 1) / OSS_ATTN_MEAN_CHUNK;
  const int r0 = blockIdx.x * OSS_ATTN_MEAN_CHUNK, r1 = min(r0 + OSS_ATTN_MEAN_CHUNK, a.lk);
  const T *x = (const T *)a.k + b * a.k_s[0] + h * a.k_s[1];
  const int lanes = oss_attn_row_lanes(a.mean_ld), rows = 256 / lanes; /* mean_ld <= 256 */
  const int sub = threadIdx.x % lanes, group = threadIdx.x / lanes, c = sub * 8;
  const bool vec = (a.vec & OSS_ATTN_VEC_K) != 0;
  double sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int r = r0 + group; r < r1; r += rows) {
    float v[8];
    oss_attn_unpack8<T>(oss_attn_load8<T>(x + (int64_t)r * a.k_s[2], c, a.d, vec), v);
#pragma unroll
    for (int k = 0; k < 8; k++) sum[k] += (double)v[k];
  }
#pragma unroll
  for (int k = 0; k < 8; k++) part[group * lanes * 8 + c + k] = sum[k];
  __syncthreads();
  for (int col = threadIdx.x; col < a.mean_ld; col += 256) {
    double total = 0;
    for (int g = 0; g < rows; g++) total += part[g * lanes * 8 + col];
    a.kmean_part[(bh * chunks + blockIdx.x) * a.mean_ld + col] = total;
  }
}

__global__ void __launch_bounds__(256) oss_attn_kmean_kernel(const oss_attn_args args) {
  const int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x;
  if (i >= (int64_t)args.batch * args.hkv * args.mean_ld) return;
  const int64_t bh = i / args.mean_ld;
  const int c = (int)(i % args.mean_ld);
  const int chunks = (args.lk + OSS_ATTN_MEAN_CHUNK - 1) / OSS_ATTN_MEAN_CHUNK;
  oss_attn_args a = args; /* the keys of (batch or sequence, kv head) bh */
  if (a.cu_q != nullptr) {
    int64_t k0;
    oss_attn_seq_bounds(a, (int)(bh / a.hkv), &k0);
  }
  double sum = 0; /* a sequence's chunks: those past its keys are not written by the Hopper backward */
  const int own = (a.lk + OSS_ATTN_MEAN_CHUNK - 1) / OSS_ATTN_MEAN_CHUNK;
  for (int k = 0; k < own; k++) sum += a.kmean_part[(bh * chunks + k) * a.mean_ld + c];
  const float mean = (float)(sum / a.lk);
  a.kmean[i] = isfinite(mean) ? mean : 0.f;
}

oss_status oss_attn_bwd_means(const oss_attn_args *a, oss_dtype dtype, cudaStream_t stream) {
  if (a->kmean == nullptr) return OSS_OK;
  if (a->mean_ld > 256 || a->lk == 0)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention backward: mean K rows for head dim %d, len_k %d",
                    a->mean_ld, a->lk);
  const int64_t bh = (int64_t)a->batch * a->hkv;
  if (bh == 0) return OSS_OK;
  const int64_t y = bh < 65535 ? bh : 65535;
  const dim3 grid((unsigned)((a->lk + OSS_ATTN_MEAN_CHUNK - 1) / OSS_ATTN_MEAN_CHUNK), (unsigned)y,
                  (unsigned)((bh + y - 1) / y));
  if (dtype == OSS_FLOAT16) oss_attn_kmean_part_kernel<__half><<<grid, 256, 0, stream>>>(*a);
  else oss_attn_kmean_part_kernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(*a);
  oss_status st = oss_check_launch("oss_attn_kmean_part_kernel");
  if (st != OSS_OK) return st;
  return oss_attn_bwd_means_reduce(a, stream);
}

oss_status oss_attn_bwd_means_reduce(const oss_attn_args *a, cudaStream_t stream) {
  const int64_t bh = (int64_t)a->batch * a->hkv;
  if (a->kmean == nullptr || a->lk == 0 || bh == 0) return OSS_OK;
  oss_attn_kmean_kernel<<<(unsigned)((bh * a->mean_ld + 255) / 256), 256, 0, stream>>>(*a);
  return oss_check_launch("oss_attn_kmean_kernel");
}

oss_status oss_attn_bwd_prepare(const oss_attn_args *a, oss_dtype dtype, cudaStream_t stream) {
  const int64_t rows = a->ws_rows > 0 ? (int64_t)a->hq * a->ws_rows : (int64_t)a->batch * a->hq * a->lq_pad;
  if (rows == 0) return OSS_OK;
  auto launch = [&](auto lanes) {
    constexpr int L = decltype(lanes)::value, R = oss_attn_pre_rows<L>();
    const dim3 grid((unsigned)((rows + R - 1) / R));
    if (dtype == OSS_FLOAT16) oss_attn_bwd_pre_kernel<__half, L><<<grid, 256, 0, stream>>>(*a);
    else oss_attn_bwd_pre_kernel<__nv_bfloat16, L><<<grid, 256, 0, stream>>>(*a);
  };
  switch (oss_attn_row_lanes(a->dv)) { /* Dv <= 256: at most 32 lanes of 8 columns */
  case 4: launch(std::integral_constant<int, 4>()); break;
  case 8: launch(std::integral_constant<int, 8>()); break;
  case 16: launch(std::integral_constant<int, 16>()); break;
  default: launch(std::integral_constant<int, 32>()); break;
  }
  return oss_check_launch("oss_attn_bwd_pre_kernel");
}

oss_status oss_attn_bwd_dq_convert(const oss_attn_args *a, oss_dtype dtype, cudaStream_t stream) {
  const bool packed = a->ws_rows > 0;
  const int64_t per = packed ? a->total_q : a->lq, heads = packed ? (int64_t)a->hq : (int64_t)a->batch * a->hq;
  if (per == 0 || heads == 0) return OSS_OK;
  const int64_t y = heads < 65535 ? heads : 65535;
  const dim3 grid((unsigned)((per + OSS_ATTN_ROW_BLOCK - 1) / OSS_ATTN_ROW_BLOCK), (unsigned)y,
                  (unsigned)((heads + y - 1) / y));
  if (dtype == OSS_FLOAT16) oss_attn_bwd_dq_convert_kernel<__half><<<grid, 256, 0, stream>>>(*a);
  else oss_attn_bwd_dq_convert_kernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(*a);
  return oss_check_launch("oss_attn_bwd_dq_convert_kernel");
}

/* The sinks' gradient: one CTA of 256 threads per query head h,
 * dsinks[h] = -sum over (b, i) of p_sink D, each thread summing every 256th
 * row in float64, then the threads' sums added in a fixed tree: the same bits
 * every run. p_sink = exp(sink_h - lse) from the forward's lse (tensor-core
 * kernels), or exp(sink_h - m) / l from the SIMT dQ kernel's row statistics. */
template <bool SIMT> __global__ void __launch_bounds__(256) oss_attn_bwd_dsinks_kernel(const oss_attn_args a) {
  __shared__ double part[256];
  const int h = blockIdx.x;
  const double sink = (double)a.sinks[h];
  double acc = 0;
  /* rows (batch, row), or in a variable-length batch on the workspace's
   * packed layout the packed rows */
  const bool packed = a.ws_rows > 0;
  const int64_t n = packed ? a.total_q : (int64_t)a.batch * a.lq;
  for (int64_t r = threadIdx.x; r < n; r += 256) {
    int b = packed ? oss_attn_row_seq(a.cu_q, a.batch, a.total_q, r) : (int)(r / a.lq);
    oss_attn_args s = a; /* sequence b's rows and lse in a variable-length batch */
    int64_t i = packed ? 0 : r % a.lq;
    if (a.cu_q != nullptr) {
      int64_t k0;
      oss_attn_seq_bounds(s, b, &k0);
      if (packed) i = r - s.seq_q0;
      if (i < 0 || i >= s.lq) continue;
    }
    const int64_t row = oss_attn_ws_row(s, b, h) + i;
    if (SIMT) {
      const double *m = (const double *)a.lse_adj, *inv = (const double *)a.inv_l, *d = (const double *)a.dsum;
      acc -= exp(sink - m[row]) * inv[row] * d[row];
    } else {
      const double lse = (double)((const float *)a.lse)[oss_attn_lse_row(s, (int64_t)b * a.hq + h) + i];
      acc -= exp(sink - lse) * (double)((const float *)a.dsum)[row];
    }
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) a.dsinks[h] = (float)part[0];
}

oss_status oss_attn_bwd_dsinks(const oss_attn_args *a, oss_dtype dtype, cudaStream_t stream) {
  if (a->sinks == nullptr || a->dsinks == nullptr || a->hq == 0) return OSS_OK;
  if (dtype == OSS_FLOAT32 || dtype == OSS_FLOAT64) oss_attn_bwd_dsinks_kernel<true><<<(unsigned)a->hq, 256, 0, stream>>>(*a);
  else oss_attn_bwd_dsinks_kernel<false><<<(unsigned)a->hq, 256, 0, stream>>>(*a);
  return oss_check_launch("oss_attn_bwd_dsinks_kernel");
}
