/*
 * attention_simt.cu - attention for float32 and float64 inputs on the CUDA
 * cores (no tensor cores, no tf32: every product and sum in the input
 * precision), with the same online-softmax algorithm as the tensor-core path.
 * Correctness first; speed is secondary here.
 *
 * Layout shared by the three kernels: 4 warps, R = 4 rows (queries, or keys
 * for dK/dV) per warp, 16 per CTA; the other side is streamed in tiles of KT
 * (32 for float, 16 for double so that the tiles of head dim 256 fit in the
 * shared memory of an A100). In the score phase lane l takes tile element
 * l % KT for RL = R*KT/32 of the warp's rows (row group l / KT); in the
 * accumulation phase lane l takes output columns l, l+32, ... (up to 256) for
 * all R rows, reading p / dS of the tile from shared memory.
 *   oss_attn_fwd_simt_kernel      per 16 queries: m, l, o over key tiles; out, lse
 *   oss_attn_bwd_dq_simt_kernel   per 16 queries: dQ = scale * sum_j dS_ij K_j
 *   oss_attn_bwd_dkdv_simt_kernel per 16 keys, over the GQA group's query heads
 *                                 and query tiles: dV = P^T dO, dK = scale dS^T Q
 * No atomics anywhere: the float32/float64 backward is always deterministic.
 * Limits: head dims up to 256; shared memory sized at run time from D and Dv.
 */
#include <math.h>

#include "attention_common.cuh"

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

template <typename S> __device__ __forceinline__ S oss_neg_inf() { return (S)(-INFINITY); }

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

/* Is key j visible to query i (bounds and causal rule)? */
__device__ __forceinline__ bool oss_simt_visible(const oss_attn_args &a, int i, int j) {
  return i < a.lq && j < a.lk && (!a.causal || (int64_t)j <= (int64_t)i + a.causal_off);
}

// ---------------------------------------------------------------------------
// forward
// ---------------------------------------------------------------------------
template <typename S, int KT>
__global__ void __launch_bounds__(OSS_SIMT_THREADS) oss_attn_fwd_simt_kernel(const oss_attn_args a) {
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
  const int qb = a.causal ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x;
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
  const S scale = (S)a.scale;

  oss_simt_load<S>(sQ, D, (const S *)a.q + b * a.q_s[0] + h * a.q_s[1] + (int64_t)i0 * a.q_s[2], a.q_s[2],
                   OSS_SIMT_ROWS, rows, D, tid);

  S o[R][OSS_SIMT_NCOL], m[R], lpart[RL];
#pragma unroll
  for (int r = 0; r < R; r++) {
    m[r] = oss_neg_inf<S>();
#pragma unroll
    for (int c = 0; c < OSS_SIMT_NCOL; c++) o[r][c] = 0;
  }
#pragma unroll
  for (int t = 0; t < RL; t++) lpart[t] = 0;

  for (int j0 = 0; j0 < n_end; j0 += KT) {
    __syncthreads();
    const int kv = min(KT, a.lk - j0);
    oss_simt_load<S>(sK, LDK, gK + (int64_t)j0 * a.k_s[2], a.k_s[2], KT, kv, D, tid);
    oss_simt_load<S>(sV, DV, gV + (int64_t)j0 * a.v_s[2], a.v_s[2], KT, kv, DV, tid);
    __syncthreads();

    const int j = j0 + kl;
    S x[RL];
#pragma unroll
    for (int t = 0; t < RL; t++) {
      const int rl = warp * R + rg * RL + t, i = i0 + rl;
      S acc = 0;
      for (int d = 0; d < D; d++) acc += sQ[rl * D + d] * sK[kl * LDK + d];
      S v = acc * scale;
      const bool vis = oss_simt_visible(a, i, j);
      if (vis && a.mask_kind) v += oss_attn_mask_value<S>(a, mbase + i * a.m_s[2] + j * a.m_s[3]);
      x[t] = vis ? v : oss_neg_inf<S>();
    }
    /* row max over the KT lanes of each row group, then to every lane */
    S mx[RL];
#pragma unroll
    for (int t = 0; t < RL; t++) {
      mx[t] = x[t];
#pragma unroll
      for (int off = KT / 2; off >= 1; off /= 2) mx[t] = fmax(mx[t], __shfl_xor_sync(0xffffffffu, mx[t], off));
    }
    S alpha[R], muse[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
      const S mt = __shfl_sync(0xffffffffu, mx[r % RL], (r / RL) * KT);
      const S m_new = fmax(m[r], mt);
      muse[r] = m_new == oss_neg_inf<S>() ? (S)0 : m_new;
      alpha[r] = oss_exp<S>(m[r] - muse[r]);
      m[r] = m_new;
    }
#pragma unroll
    for (int t = 0; t < RL; t++) {
      S mu = muse[t], al = alpha[t];
#pragma unroll
      for (int gg = 1; gg < NG; gg++)
        if (rg == gg) {
          mu = muse[gg * RL + t];
          al = alpha[gg * RL + t];
        }
      const S p = oss_exp<S>(x[t] - mu);
      lpart[t] = lpart[t] * al + p;
      sP[(warp * R + rg * RL + t) * KT + kl] = p;
    }
    __syncwarp();
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
      for (int cc = 0; cc < OSS_SIMT_NCOL; cc++) o[r][cc] *= alpha[r];
      for (int jj = 0; jj < KT; jj++) {
        const S p = sP[(warp * R + r) * KT + jj];
#pragma unroll
        for (int cc = 0; cc < OSS_SIMT_NCOL; cc++) {
          const int c = lane + 32 * cc;
          if (c < DV) o[r][cc] += p * sV[jj * DV + c];
        }
      }
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
  S *lse = (S *)a.lse + bh * a.lq;
#pragma unroll
  for (int r = 0; r < R; r++) {
    const S lt = __shfl_sync(0xffffffffu, ls[r % RL], (r / RL) * KT);
    const int i = i0 + warp * R + r;
    if (i < a.lq) {
      const S inv = lt > 0 ? (S)1 / lt : (S)0;
      S *orow = gO + (int64_t)i * a.o_s[2];
#pragma unroll
      for (int cc = 0; cc < OSS_SIMT_NCOL; cc++) {
        const int c = lane + 32 * cc;
        if (c < DV) orow[c] = o[r][cc] * inv;
      }
      if (lane == 0) lse[i] = lt > 0 ? m[r] + oss_log<S>(lt) : oss_neg_inf<S>();
    }
  }
}

// ---------------------------------------------------------------------------
// backward: dQ (one CTA per 16 queries)
// ---------------------------------------------------------------------------
template <typename S, int KT>
__global__ void __launch_bounds__(OSS_SIMT_THREADS) oss_attn_bwd_dq_simt_kernel(const oss_attn_args a) {
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
  const int qb = a.causal ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x;
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
  const S scale = (S)a.scale;
  const S *lse_adj = (const S *)a.lse_adj + bh * a.lq_pad;
  const S *dsum = (const S *)a.dsum + bh * a.lq_pad;

  oss_simt_load<S>(sQ, D, (const S *)a.q + b * a.q_s[0] + h * a.q_s[1] + (int64_t)i0 * a.q_s[2], a.q_s[2],
                   OSS_SIMT_ROWS, rows, D, tid);
  oss_simt_load<S>(sdO, DV, (const S *)a.dout + b * a.do_s[0] + h * a.do_s[1] + (int64_t)i0 * a.do_s[2], a.do_s[2],
                   OSS_SIMT_ROWS, rows, DV, tid);

  S lr[RL], dr[RL];
#pragma unroll
  for (int t = 0; t < RL; t++) {
    const int i = i0 + warp * R + rg * RL + t; /* < lq_pad always */
    lr[t] = lse_adj[i];
    dr[t] = dsum[i];
  }
  S dq[R][OSS_SIMT_NCOL];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int c = 0; c < OSS_SIMT_NCOL; c++) dq[r][c] = 0;

  for (int j0 = 0; j0 < n_end; j0 += KT) {
    __syncthreads();
    const int kv = min(KT, a.lk - j0);
    oss_simt_load<S>(sK, LDK, gK + (int64_t)j0 * a.k_s[2], a.k_s[2], KT, kv, D, tid);
    oss_simt_load<S>(sV, LDV, gV + (int64_t)j0 * a.v_s[2], a.v_s[2], KT, kv, DV, tid);
    __syncthreads();
    const int j = j0 + kl;
#pragma unroll
    for (int t = 0; t < RL; t++) {
      const int rl = warp * R + rg * RL + t, i = i0 + rl;
      S s = 0, dp = 0;
      for (int d = 0; d < D; d++) s += sQ[rl * D + d] * sK[kl * LDK + d];
      for (int c = 0; c < DV; c++) dp += sdO[rl * DV + c] * sV[kl * LDV + c];
      S v = s * scale;
      const bool vis = oss_simt_visible(a, i, j);
      if (vis && a.mask_kind) v += oss_attn_mask_value<S>(a, mbase + i * a.m_s[2] + j * a.m_s[3]);
      const S p = vis ? oss_exp<S>(v - lr[t]) : (S)0;
      sdS[rl * KT + kl] = p * (dp - dr[t]);
    }
    __syncwarp();
#pragma unroll
    for (int r = 0; r < R; r++)
      for (int jj = 0; jj < KT; jj++) {
        const S ds = sdS[(warp * R + r) * KT + jj];
#pragma unroll
        for (int cc = 0; cc < OSS_SIMT_NCOL; cc++) {
          const int c = lane + 32 * cc;
          if (c < D) dq[r][cc] += ds * sK[jj * LDK + c];
        }
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
// backward: dK, dV (one CTA per 16 keys of a kv head, all query heads of its group)
// ---------------------------------------------------------------------------
template <typename S, int KT>
__global__ void __launch_bounds__(OSS_SIMT_THREADS) oss_attn_bwd_dkdv_simt_kernel(const oss_attn_args a) {
  constexpr int R = OSS_SIMT_R, RL = R * KT / 32;
  extern __shared__ __align__(16) unsigned char oss_smem[];
  const int D = a.d, DV = a.dv, LDQ = D + 1, LDO = DV + 1;
  S *sK = reinterpret_cast<S *>(oss_smem); /* [16][D] */
  S *sV = sK + OSS_SIMT_ROWS * D;          /* [16][DV] */
  S *sQ = sV + OSS_SIMT_ROWS * DV;         /* [KT][D+1] */
  S *sdO = sQ + KT * LDQ;                  /* [KT][DV+1] */
  S *sL = sdO + KT * LDO;                  /* [KT] */
  S *sDs = sL + KT;                        /* [KT] */
  S *sP = sDs + KT;                        /* [16][KT] */
  S *sdS = sP + OSS_SIMT_ROWS * KT;        /* [16][KT] */

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int ql = lane % KT, rg = lane / KT;
  const int64_t bhk = blockIdx.y + (int64_t)gridDim.y * blockIdx.z;
  if (bhk >= (int64_t)a.batch * a.hkv) return;
  const int b = (int)(bhk / a.hkv), hk = (int)(bhk % a.hkv);
  const int j0 = blockIdx.x * OSS_SIMT_ROWS;
  const int kv = min(OSS_SIMT_ROWS, a.lk - j0);
  const S scale = (S)a.scale;

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
    const S *lse_adj = (const S *)a.lse_adj + ((int64_t)b * a.hq + h) * a.lq_pad;
    const S *dsum = (const S *)a.dsum + ((int64_t)b * a.hq + h) * a.lq_pad;
    const int64_t mbase = a.mask_kind ? oss_attn_mask_base(a, b, h) : 0;
    for (int q0 = q_start; q0 < a.lq; q0 += KT) {
      __syncthreads();
      const int qv = min(KT, a.lq - q0);
      oss_simt_load<S>(sQ, LDQ, gQ + (int64_t)q0 * a.q_s[2], a.q_s[2], KT, qv, D, tid);
      oss_simt_load<S>(sdO, LDO, gdO + (int64_t)q0 * a.do_s[2], a.do_s[2], KT, qv, DV, tid);
      if (tid < KT) {
        sL[tid] = lse_adj[q0 + tid]; /* rows past lq: +inf (padded) */
        sDs[tid] = dsum[q0 + tid];
      }
      __syncthreads();
      const int i = q0 + ql;
#pragma unroll
      for (int t = 0; t < RL; t++) {
        const int kr = warp * R + rg * RL + t, j = j0 + kr;
        S s = 0, dp = 0;
        for (int d = 0; d < D; d++) s += sK[kr * D + d] * sQ[ql * LDQ + d];
        for (int c = 0; c < DV; c++) dp += sV[kr * DV + c] * sdO[ql * LDO + c];
        S v = s * scale;
        const bool vis = oss_simt_visible(a, i, j);
        if (vis && a.mask_kind) v += oss_attn_mask_value<S>(a, mbase + i * a.m_s[2] + j * a.m_s[3]);
        const S p = vis ? oss_exp<S>(v - sL[ql]) : (S)0;
        sP[kr * KT + ql] = p;
        sdS[kr * KT + ql] = p * (dp - sDs[ql]);
      }
      __syncwarp();
#pragma unroll
      for (int r = 0; r < R; r++)
        for (int qq = 0; qq < KT; qq++) {
          const S p = sP[(warp * R + r) * KT + qq], ds = sdS[(warp * R + r) * KT + qq];
#pragma unroll
          for (int cc = 0; cc < OSS_SIMT_NCOL; cc++) {
            const int c = lane + 32 * cc;
            if (c < DV) dv[r][cc] += p * sdO[qq * LDO + c];
            if (c < D) dk[r][cc] += ds * sQ[qq * LDQ + c];
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
template <typename S> static size_t oss_simt_kt() { return sizeof(S) == 4 ? 32 : 16; }

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

template <typename S>
static oss_status oss_attn_bwd_simt_t(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev) {
  constexpr int KT = sizeof(S) == 4 ? 32 : 16;
  if (a->lq > 0) {
    const size_t smem = sizeof(S) * ((size_t)OSS_SIMT_ROWS * (a->d + a->dv) + (size_t)KT * (a->d + 1) +
                                     (size_t)KT * (a->dv + 1) + OSS_SIMT_ROWS * KT);
    oss_status st = oss_simt_launch<S, KT>(oss_attn_bwd_dq_simt_kernel<S, KT>, "oss_attn_bwd_dq_simt_kernel", smem,
                                           (a->lq + OSS_SIMT_ROWS - 1) / OSS_SIMT_ROWS, (int64_t)a->batch * a->hq,
                                           a, stream, dev);
    if (st != OSS_OK) return st;
  }
  if (a->lk > 0) {
    const size_t smem = sizeof(S) * ((size_t)OSS_SIMT_ROWS * (a->d + a->dv) + (size_t)KT * (a->d + 1) +
                                     (size_t)KT * (a->dv + 1) + 2 * KT + 2 * OSS_SIMT_ROWS * KT);
    return oss_simt_launch<S, KT>(oss_attn_bwd_dkdv_simt_kernel<S, KT>, "oss_attn_bwd_dkdv_simt_kernel", smem,
                                  (a->lk + OSS_SIMT_ROWS - 1) / OSS_SIMT_ROWS, (int64_t)a->batch * a->hkv, a, stream,
                                  dev);
  }
  return OSS_OK;
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
// backward pre-pass (every dtype) and dQ conversion (tensor-core default mode)
// ---------------------------------------------------------------------------

/* One warp per padded row of [B*Hq][lq_pad]: dsum = rowsum(dO * O) in Acc,
 * lse_adj = lse * lse_mult (+inf where lse = -inf and for padding rows), and
 * the row of the float32 dQ accumulator zeroed when there is one. */
template <typename T, typename Acc>
__global__ void __launch_bounds__(256) oss_attn_bwd_pre_kernel(const oss_attn_args a, Acc lse_mult) {
  const int64_t row = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= (int64_t)a.batch * a.hq * a.lq_pad) return;
  const int64_t bh = row / a.lq_pad;
  const int i = (int)(row % a.lq_pad);
  const int b = (int)(bh / a.hq), h = (int)(bh % a.hq);
  Acc sum = 0, ladj = (Acc)INFINITY;
  if (i < a.lq) {
    const T *o = (const T *)a.out + b * a.o_s[0] + h * a.o_s[1] + (int64_t)i * a.o_s[2];
    const T *d = (const T *)a.dout + b * a.do_s[0] + h * a.do_s[1] + (int64_t)i * a.do_s[2];
    for (int c = lane; c < a.dv; c += 32) {
      if constexpr (sizeof(Acc) == 8) sum += (Acc)o[c] * (Acc)d[c];
      else sum += oss_to_float(o[c]) * oss_to_float(d[c]);
    }
#pragma unroll
    for (int off = 16; off >= 1; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    const Acc lse = ((const Acc *)a.lse)[bh * a.lq + i];
    ladj = lse == (Acc)(-INFINITY) ? (Acc)INFINITY : lse * lse_mult;
  }
  if (lane == 0) {
    ((Acc *)a.dsum)[row] = sum;
    ((Acc *)a.lse_adj)[row] = ladj;
  }
  if (a.dq_acc) {
    float *acc = a.dq_acc + row * a.dq_ld;
    for (int c = lane; c < a.dq_ld; c += 32) acc[c] = 0.f;
  }
}

/* dq = scale * dq_acc for rows < Lq, cols < D. One warp per row. */
template <typename T> __global__ void __launch_bounds__(256) oss_attn_bwd_dq_convert_kernel(const oss_attn_args a) {
  const int64_t row = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= (int64_t)a.batch * a.hq * a.lq) return;
  const int64_t bh = row / a.lq;
  const int i = (int)(row % a.lq);
  const int b = (int)(bh / a.hq), h = (int)(bh % a.hq);
  const float *src = a.dq_acc + (bh * a.lq_pad + i) * a.dq_ld;
  T *dst = (T *)a.dq + b * a.dq_s[0] + h * a.dq_s[1] + (int64_t)i * a.dq_s[2];
  const float sc = (float)a.scale;
  for (int c = lane; c < a.d; c += 32) dst[c] = oss_from_float<T>(src[c] * sc);
}

oss_status oss_attn_bwd_prepare(const oss_attn_args *a, oss_dtype dtype, cudaStream_t stream) {
  const int64_t rows = (int64_t)a->batch * a->hq * a->lq_pad;
  if (rows == 0) return OSS_OK;
  const dim3 grid((unsigned)((rows + 7) / 8));
  switch (dtype) {
  case OSS_FLOAT16: oss_attn_bwd_pre_kernel<__half, float><<<grid, 256, 0, stream>>>(*a, (float)OSS_LOG2E); break;
  case OSS_BFLOAT16:
    oss_attn_bwd_pre_kernel<__nv_bfloat16, float><<<grid, 256, 0, stream>>>(*a, (float)OSS_LOG2E);
    break;
  case OSS_FLOAT32: oss_attn_bwd_pre_kernel<float, float><<<grid, 256, 0, stream>>>(*a, 1.f); break;
  default: oss_attn_bwd_pre_kernel<double, double><<<grid, 256, 0, stream>>>(*a, 1.0); break;
  }
  return oss_check_launch("oss_attn_bwd_pre_kernel");
}

oss_status oss_attn_bwd_dq_convert(const oss_attn_args *a, oss_dtype dtype, cudaStream_t stream) {
  const int64_t rows = (int64_t)a->batch * a->hq * a->lq;
  if (rows == 0) return OSS_OK;
  const dim3 grid((unsigned)((rows + 7) / 8));
  if (dtype == OSS_FLOAT16) oss_attn_bwd_dq_convert_kernel<__half><<<grid, 256, 0, stream>>>(*a);
  else oss_attn_bwd_dq_convert_kernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(*a);
  return oss_check_launch("oss_attn_bwd_dq_convert_kernel");
}
