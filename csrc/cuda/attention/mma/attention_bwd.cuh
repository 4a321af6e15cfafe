/*
 * attention_bwd.cuh - FlashAttention-2 backward on tensor cores (float16 and
 * bfloat16, mma.sync m16n8k16, sm_80 and newer).
 *
 * With P = exp(scale*Q K^T + mask - lse) recomputed from the forward's lse,
 * dP = dO V^T, D = rowsum(dO * O) (oss_attn_bwd_pre_kernel, before these
 * kernels; O plus its rounding residual when the forward kept one) and
 * dS' = scale * P * (dP - D):  dV = P^T dO,  dK = dS'^T Q,
 * dQ = dS' K. The scale goes into dS before it is rounded to 16 bits.
 *
 * oss_attn_bwd_dkdv_mma_kernel - one CTA per (batch, kv head, block of Bc
 * keys). K and V of the block stay in shared memory; the CTA loops over every
 * query head of its GQA group and every query block of Br rows that can see
 * the keys (causal: from the diagonal on), so dK and dV of the kv head are
 * accumulated in registers without an expanded buffer.
 *   - NW = NKW * NCS warps. Warp w owns the 16 keys kg = w % NKW (Bc = 16 NKW)
 *     and, for dK/dV, the column slice cs = w / NKW of KD / NCS columns (NCS = 2
 *     for head dims above 128 so the dK/dV accumulators fit in registers; the
 *     two warps of a key group then both compute S^T and dP^T).
 *   - per query block (two cp.async stages of Q, dO, lse, D, the next block
 *     loading while this one computes):
 *       S^T = K Q^T and dP^T = V dO^T (A from smem, B = Q / dO via ldmatrix),
 *       P^T = exp2(S^T scale log2e - lse log2e), dS^T = scale P^T (dP^T - D), in
 *       registers, key-major, so P^T and dS^T are directly the A fragments of
 *       dV += P^T dO and dK += dS^T Q (B via ldmatrix.trans);
 *       default mode: dS^T goes to shared memory and all warps compute
 *       dQ_blk = dS K (warp grid WM x WN over the Br x KD block) and add it to
 *       a float32 accumulator in the workspace with atomics (red.add, float2 on
 *       sm_90); attention_aux.cu scales and converts it to dq at the end.
 *   - the end: dK and dV written (rows < Lk, cols < D / Dv).
 *
 * oss_attn_bwd_dq_mma_kernel - deterministic mode only: one CTA per (batch,
 * query head, Br query rows), looping over key blocks like the forward
 * (Q, dO resident; K, V double buffered): S = Q K^T, dP = dO V^T, dS in
 * registers, dQ += dS K, no atomics. The dK/dV kernel then skips its dQ part.
 *
 * dQ's centring (off when a.kmean is NULL). The exact dS has rows that sum to
 * 0 (sum_j P_ij (dP_ij - D_i) = D_i - D_i), so dQ = dS K = dS (K - kbar) for
 * any row kbar. The kernels multiply the rounded dS' by K; where K's rows are
 * all equal the exact dQ is 0 and what they return is the rounding of dS'
 * times k. So dq also takes -R kbar, R = the row sums of the rounded dS' and
 * kbar = the mean K row of the kv head: dq = rounded dS' (K - kbar), exactly 0
 * for equal rows and otherwise the same error (smaller where K's rows share a
 * large mean). R comes from the tensor cores (the dS' fragments times a B of
 * ones): the dK/dV kernel's dQ product adds it into column dq_ld - 4 of the
 * float32 accumulator's rows with atomics and the dq conversion subtracts R
 * kbar; the dQ kernel sums it in registers and subtracts R kbar at its end.
 * kbar: oss_attn_bwd_means.
 *
 * VAR (a separate instantiation of both kernels): each score through the
 * score variants of oss.h (oss_attn_var_each: the visibility test only on
 * tiles that cross the diagonal, a window's edge or the end of the keys), and
 * dS' times the softcap's derivative, in one pass per element; both kernels
 * visit only the tiles whose window reaches them. The sinks need nothing
 * here: they are in lse, and their gradient comes after (oss_attn_bwd_dsinks).
 * Dropout (a variant too; Z the kept weights, k = 1 / (1 - p), P the weights
 * before dropout, D = rowsum(dO * O) of the dropped output as it is):
 * dV = (P Z k)^T dO and dS' = scale P (Z k dP - D). One draw of a tile's bits
 * serves both: dP times Z k before the per-element pass
 * (oss_attn_dropout_tile), and the dropped weights zeroed in the packed P
 * after it (oss_attn_dropout_apply_a), k, common to the kept ones, applied
 * to dV when it is written (as the forward applies it to out: P rounded
 * once, unscaled). dK and dQ follow from dS' as without, and dS' rows still
 * sum to 0, so dQ's centring holds.
 *
 * Fully masked rows have lse = -inf, stored as +inf in lse_adj, so P = 0 and
 * every gradient they touch is 0.
 */
#ifndef OSS_ATTENTION_BWD_CUH
#define OSS_ATTENTION_BWD_CUH

#include "cuda/attention/mma/attention_mma.cuh"

template <int HD> struct oss_attn_bwd_cfg {
  /* dK/dV kernel */
  static constexpr int BR = HD <= 128 ? 64 : 32; /* query rows per iteration */
  static constexpr int NKW = HD <= 128 ? 8 : 4;  /* key groups of 16: Bc = 16 NKW */
  static constexpr int NCS = HD <= 128 ? 1 : 2;  /* dK/dV column slices */
  static constexpr int MINB = 1;                 /* __launch_bounds__ min blocks per SM */
  /* deterministic dQ kernel */
  static constexpr int DQ_BR = 64, DQ_NW = 4;
  static constexpr int DQ_BC = HD <= 128 ? 64 : 32;
};

template <int HD, int BR, int NKW>
__host__ __device__ constexpr size_t oss_attn_bwd_dkdv_smem_bytes() {
  return (size_t)(2 * 16 * NKW + 4 * BR) * oss_attn_pitch(oss_attn_kd(HD)) * 2 /* K, V, 2x(Q, dO) */
         + (size_t)16 * NKW * oss_attn_pitch(BR) * 2                          /* dS^T */
         + (size_t)4 * BR * 4;                                                 /* 2x(lse, D) */
}
template <int HD, int BR, int BC> __host__ __device__ constexpr size_t oss_attn_bwd_dq_smem_bytes() {
  return (size_t)(2 * BR + 4 * BC) * oss_attn_pitch(oss_attn_kd(HD)) * 2 + (size_t)2 * BR * 4;
}

/* Loads BR rows of lse_adj and D (float, padded rows so always in bounds). */
template <int BR, int NTHREADS>
__device__ __forceinline__ void oss_attn_load_rowstats(float *sL, float *sD, const float *gL, const float *gD,
                                                       int tid) {
  static_assert(2 * (BR / 4) <= NTHREADS, "one 16-byte chunk per thread");
  if (tid < BR / 4) oss_cp_async16(oss_smem_u32(sL + tid * 4), gL + tid * 4, 16);
  else if (tid < BR / 2) oss_cp_async16(oss_smem_u32(sD + (tid - BR / 4) * 4), gD + (tid - BR / 4) * 4, 16);
}

/* Issues the cp.async copies for iteration `it` of a key-block CTA (query head
 * hk * group + it / nqe, query block qb0 + it % nqe): its Q and dO rows into sQ
 * and sdO, in the calling kernel's tile layout (pitch LDS, or SW128), and its
 * lse_adj and D rows into sL and sD. */
template <typename T, int BR, int KD, int LDS, int NTHREADS, bool SW128>
__device__ __forceinline__ void oss_attn_bwd_load_query_block(const oss_attn_args &a, int b, int hk, int qb0,
                                                              int nqe, int it, T *sQ, T *sdO, float *sL, float *sD,
                                                              int tid) {
  const int h = hk * a.group + it / nqe;
  const int i0 = (qb0 + it % nqe) * BR;
  const int rows = min(BR, a.lq - i0);
  oss_load_tile<T, BR, KD, LDS, NTHREADS, SW128>(
      sQ, (const T *)a.q + b * a.q_s[0] + h * a.q_s[1] + (int64_t)i0 * a.q_s[2], a.q_s[2], rows, a.d,
      a.vec & OSS_ATTN_VEC_Q, tid);
  oss_load_tile<T, BR, KD, LDS, NTHREADS, SW128>(
      sdO, (const T *)a.dout + b * a.do_s[0] + h * a.do_s[1] + (int64_t)i0 * a.do_s[2], a.do_s[2], rows, a.dv,
      a.vec & OSS_ATTN_VEC_DO, tid);
  const int64_t ro = oss_attn_ws_row(a, b, h) + i0;
  oss_attn_load_rowstats<BR, NTHREADS>(sL, sD, (const float *)a.lse_adj + ro, (const float *)a.dsum + ro, tid);
}

/* The blocks of BR query rows that see some key of the key block of bc keys
 * starting at j0: blocks qb0 .. qb0 + nqe - 1 (causal: from the diagonal on;
 * a window: only the rows whose window reaches the block). */
template <int BR>
__device__ __forceinline__ void oss_attn_bwd_query_blocks(const oss_attn_args &a, int j0, int *qb0, int *nqe,
                                                          int bc = 1) {
  const int nblocks = (a.lq + BR - 1) / BR;
  int64_t first = 0, last = a.lq - 1; /* the rows that may see the block */
  if (a.causal) first = (int64_t)j0 - a.causal_off; /* first row i with j0 <= i + off */
  if (a.variants && a.win_right >= 0 && (int64_t)j0 - a.var_off - a.win_right > first)
    first = (int64_t)j0 - a.var_off - a.win_right;
  if (a.variants && a.win_left >= 0 && (int64_t)(j0 + bc - 1) - a.var_off + a.win_left < last)
    last = (int64_t)(j0 + bc - 1) - a.var_off + a.win_left;
  const int first_block = first <= 0 ? 0 : (first >= a.lq ? nblocks : (int)(first / BR));
  const int end_block = last < 0 ? 0 : (last >= a.lq ? nblocks : (int)(last / BR) + 1);
  *qb0 = first_block;
  *nqe = end_block > first_block ? end_block - first_block : 0;
}

template <typename T, int HD, int BR, int NKW, int NCS, int MINB, bool VAR>
__global__ void __launch_bounds__(NKW * NCS * 32, MINB) oss_attn_bwd_dkdv_mma_kernel(const oss_attn_args args) {
  constexpr int NW = NKW * NCS, NTHREADS = NW * 32, BC = 16 * NKW;
  constexpr int KD = oss_attn_kd(HD), LDS = oss_attn_pitch(KD), LDSS = oss_attn_pitch(BR);
  constexpr int NTQ = BR / 8;      /* n-tiles of S^T (queries) */
  constexpr int KDW = KD / NCS;    /* dK/dV columns per warp */
  constexpr int NOW = KDW / 8;     /* their n-tiles */
  static_assert(KDW % 16 == 0, "dK/dV column slices come in 16s");
  /* dQ block warp grid: WM x WN warps, each TM m-tiles x TN n-tiles */
  constexpr int QM = BR / 16;
  constexpr int WM = QM >= 2 ? QM / 2 : 1;
  constexpr int TM = QM / WM;
  constexpr int WN = NW / WM;
  constexpr int NB8 = KD / 8;
  constexpr int TN = ((NB8 + WN - 1) / WN + 1) / 2 * 2;
  static_assert(WM * TM == QM && WM * WN == NW, "dQ warp grid");

  extern __shared__ __align__(16) unsigned char oss_smem[];
  T *sK = reinterpret_cast<T *>(oss_smem);
  T *sV = sK + BC * LDS;
  T *sQ = sV + BC * LDS;   /* [2][BR][LDS] */
  T *sdO = sQ + 2 * BR * LDS; /* [2][BR][LDS] */
  T *sdS = sdO + 2 * BR * LDS; /* [BC][LDSS], dS^T */
  float *sL = reinterpret_cast<float *>(sdS + BC * LDSS); /* [2][BR] */
  float *sD = sL + 2 * BR;                                /* [2][BR] */

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int kg = warp % NKW, cs = warp / NKW;
  const int g = lane >> 2, t2 = (lane & 3) * 2;
  int b, hk, block;
  if (!oss_attn_key_block_of(args, BC, &b, &hk, &block)) return;
  oss_attn_args a = args; /* a sequence's view in a variable-length batch */
  oss_attn_seq_view<T>(a, b);
  const int j0 = block * BC;
  if (block < 0 || j0 >= a.lk) return; /* an empty slot, or past a shorter sequence's keys */
  const int krows = min(BC, a.lk - j0);

  int qb0, nqe;
  oss_attn_bwd_query_blocks<BR>(a, j0, &qb0, &nqe, BC);
  const int niter = a.group * nqe;

  const bool vk = a.vec & OSS_ATTN_VEC_K, vv = a.vec & OSS_ATTN_VEC_V;
  const bool atomic_dq = a.dq_acc != nullptr && a.dq_sem == nullptr; /* else the dQ kernel's */
  /* dS is scaled before it is rounded to T for the dK / dQ products: the
   * unscaled P (dP - D) overflows float16 long before the gradients do. */
  const float sc = (float)a.scale;
  const uint64_t seed = VAR ? oss_attn_drop_seed(a) : 0; /* dropout's */

  float dV[1][NOW][4], dK[1][NOW][4];
#pragma unroll
  for (int n = 0; n < NOW; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) dV[0][n][e] = dK[0][n][e] = 0.f;

  if (niter > 0) {
    oss_load_tile<T, BC, KD, LDS, NTHREADS>(sK, (const T *)a.k + b * a.k_s[0] + hk * a.k_s[1] + (int64_t)j0 * a.k_s[2],
                                             a.k_s[2], krows, a.d, vk, tid);
    oss_load_tile<T, BC, KD, LDS, NTHREADS>(sV, (const T *)a.v + b * a.v_s[0] + hk * a.v_s[1] + (int64_t)j0 * a.v_s[2],
                                             a.v_s[2], krows, a.dv, vv, tid);
  }

#pragma unroll 1
  for (int it = -1; it < niter; it++) {
    const int st = it & 1;
    if (it >= 0) {
      oss_cp_async_wait<0>(); /* stage st (and K, V) landed */
      __syncthreads();        /* for all threads; stage st^1 and sdS are free */
    }
    /* prefetch iteration it+1 into stage st^1 */
    if (it + 1 < niter) {
      const int sn = st ^ 1;
      oss_attn_bwd_load_query_block<T, BR, KD, LDS, NTHREADS, false>(a, b, hk, qb0, nqe, it + 1, sQ + sn * BR * LDS,
                                                                     sdO + sn * BR * LDS, sL + sn * BR, sD + sn * BR,
                                                                     tid);
    }
    oss_cp_async_commit();
    if (it < 0) continue;

    const int h = hk * a.group + it / nqe;
    const int i0 = (qb0 + it % nqe) * BR;
    const T *cQ = sQ + st * BR * LDS;
    const T *cdO = sdO + st * BR * LDS;
    const float *cL = sL + st * BR, *cD = sD + st * BR;

    /* S^T = K Q^T, dP^T = V dO^T for this warp's 16 keys */
    float sT[1][NTQ][4], pT[1][NTQ][4];
#pragma unroll
    for (int n = 0; n < NTQ; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) sT[0][n][e] = pT[0][n][e] = 0.f;
    oss_warp_mma_ss<T, 1, NTQ, KD, LDS, LDS>(sT, oss_smem_u32(sK + kg * 16 * LDS), oss_smem_u32(cQ), lane);
    oss_warp_mma_ss<T, 1, NTQ, KD, LDS, LDS>(pT, oss_smem_u32(sV + kg * 16 * LDS), oss_smem_u32(cdO), lane);

    /* P^T and scale * dS^T (element (key r, query c)). The scores are scaled
     * (and masked) first, rounding s*c as the forward rounds its row max. */
    oss_attn_keep<1, NTQ> keep; /* dropout's kept weights (VAR) */
    if constexpr (VAR) {
      /* dropout: dP^T times Z k first, so that dS = P (Z k dP - D) */
      if (a.drop_seed != nullptr)
        oss_attn_dropout_tile<true, 1, NTQ>(pT, keep, a, seed, (int64_t)b * a.hq + h, j0 + kg * 16, i0, lane);
      /* one pass per element: the variants' score, P, and dS through the softcap's derivative */
      const oss_attn_var_consts vc = oss_attn_var_consts_of(a, b, h);
      oss_attn_var_each<true>(sT, a, vc, a.mask_kind ? oss_attn_mask_base(a, b, h) : 0, j0 + kg * 16, i0, lane,
                              [&](int, int n, int e, float x, float dcap) {
                                const int c = n * 8 + t2 + (e & 1); /* the query's row in the stage */
                                const float p = oss_ex2(x - cL[c]);
                                sT[0][n][e] = p;
                                pT[0][n][e] = (p * sc * dcap) * (pT[0][n][e] - cD[c]);
                              });
    } else {
      const bool need_mask = a.mask_kind != OSS_MASK_NONE || j0 + BC > a.lk ||
                             (a.causal && (int64_t)(j0 + BC - 1) > (int64_t)i0 + a.causal_off);
#pragma unroll
      for (int n = 0; n < NTQ; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) sT[0][n][e] *= a.scale_log2;
      if (need_mask)
        oss_attn_mask_tile<T, true, 1, NTQ>(sT, a, a.mask_kind ? oss_attn_mask_base(a, b, h) : 0, j0 + kg * 16, i0,
                                            lane);
#pragma unroll
      for (int n = 0; n < NTQ; n++) {
        const float2 lv = *reinterpret_cast<const float2 *>(cL + n * 8 + t2);
        const float2 dd = *reinterpret_cast<const float2 *>(cD + n * 8 + t2);
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const float p = oss_ex2(sT[0][n][e] - ((e & 1) ? lv.y : lv.x));
          sT[0][n][e] = p;
          pT[0][n][e] = (p * sc) * (pT[0][n][e] - ((e & 1) ? dd.y : dd.x));
        }
      }
    }
    uint32_t pa[1][NTQ / 2][4], dsa[1][NTQ / 2][4];
    oss_acc_to_a<T, 1, NTQ>(sT, pa);
    oss_acc_to_a<T, 1, NTQ>(pT, dsa);
    if (VAR && a.drop_seed != nullptr) oss_attn_dropout_apply_a<1, NTQ>(pa, keep); /* P Z, for dV (k at the end) */

    /* dV += P^T dO, dK += dS^T Q over this warp's column slice */
    oss_warp_mma_rs<T, 1, NOW, NTQ / 2, LDS>(dV, pa, oss_smem_u32(cdO + cs * KDW), lane);
    oss_warp_mma_rs<T, 1, NOW, NTQ / 2, LDS>(dK, dsa, oss_smem_u32(cQ + cs * KDW), lane);

    if (atomic_dq) {
      if (cs == 0) {
        /* dS^T rows (keys) g, g+8 of this warp's group, cols = queries */
        T *r0 = sdS + (kg * 16 + g) * LDSS + t2;
        T *r1 = r0 + 8 * LDSS;
#pragma unroll
        for (int kk = 0; kk < NTQ / 2; kk++) {
          *reinterpret_cast<uint32_t *>(r0 + kk * 16) = dsa[0][kk][0];
          *reinterpret_cast<uint32_t *>(r1 + kk * 16) = dsa[0][kk][1];
          *reinterpret_cast<uint32_t *>(r0 + kk * 16 + 8) = dsa[0][kk][2];
          *reinterpret_cast<uint32_t *>(r1 + kk * 16 + 8) = dsa[0][kk][3];
        }
      }
      __syncthreads();
      /* dQ block = dS K: warp (wm, wn) owns rows wm*TM*16.., n-tiles wn*TN.. */
      const int wm = warp / WN, wn = warp % WN;
      const int nb0 = wn * TN;
      int np_valid = (NB8 - nb0) / 2;
      np_valid = np_valid < 0 ? 0 : (np_valid > TN / 2 ? TN / 2 : np_valid);
      if (np_valid > 0) {
        float q[TM][TN][4], rs[TM][4];
#pragma unroll
        for (int mt = 0; mt < TM; mt++) {
#pragma unroll
          for (int n = 0; n < TN; n++) q[mt][n][0] = q[mt][n][1] = q[mt][n][2] = q[mt][n][3] = 0.f;
          rs[mt][0] = rs[mt][1] = rs[mt][2] = rs[mt][3] = 0.f;
        }
        /* the first warp of each row block also sums dS' rows (dQ's centring) */
        const bool rowsum = a.kmean != nullptr && wn == 0;
        oss_warp_mma_tt<T, TM, TN, BC, LDSS, LDS>(q, oss_smem_u32(sdS + wm * TM * 16), oss_smem_u32(sK + nb0 * 8),
                                                  lane, np_valid, rowsum, rs);
        if (rowsum && (lane & 3) == 0) { /* into the accumulator row's column dq_ld - 4 */
          float *e = a.dq_acc + (oss_attn_ws_row(a, b, h) + i0) * a.dq_ld + (a.dq_ld - 4);
#pragma unroll
          for (int mt = 0; mt < TM; mt++)
#pragma unroll
            for (int hi = 0; hi < 2; hi++) {
              const int r = wm * TM * 16 + mt * 16 + g + hi * 8;
              if (i0 + r < a.lq) atomicAdd(e + (int64_t)r * a.dq_ld, rs[mt][2 * hi]);
            }
        }
        float *acc = a.dq_acc + (oss_attn_ws_row(a, b, h) + i0) * a.dq_ld;
#pragma unroll
        for (int mt = 0; mt < TM; mt++)
#pragma unroll
          for (int hi = 0; hi < 2; hi++) {
            const int r = wm * TM * 16 + mt * 16 + g + hi * 8;
            if (i0 + r < a.lq) {
              float *row = acc + (int64_t)r * a.dq_ld;
#pragma unroll
              for (int n = 0; n < TN; n++) {
                const int c = (nb0 + n) * 8 + t2;
                if ((n >> 1) < np_valid && c < a.d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
                  atomicAdd(reinterpret_cast<float2 *>(row + c), make_float2(q[mt][n][2 * hi], q[mt][n][2 * hi + 1]));
#else
                  atomicAdd(row + c, q[mt][n][2 * hi]);
                  atomicAdd(row + c + 1, q[mt][n][2 * hi + 1]);
#endif
                }
              }
            }
          }
      }
    }
  }

  /* write dK (scaled) and dV (times dropout's k) for rows < Lk, cols < D / Dv */
  T *gdK = (T *)a.dk + b * a.dk_s[0] + hk * a.dk_s[1];
  T *gdV = (T *)a.dv_ptr + b * a.dv_s[0] + hk * a.dv_s[1];
  const bool vdk = a.vec & OSS_ATTN_VEC_DK, vdv = a.vec & OSS_ATTN_VEC_DV;
  const float dv_scale = VAR && a.drop_seed != nullptr ? a.drop_scale : 1.f;
#pragma unroll
  for (int hi = 0; hi < 2; hi++) {
    const int r = j0 + kg * 16 + g + hi * 8;
    if (r < a.lk) {
      T *rk = gdK + (int64_t)r * a.dk_s[2];
      T *rv = gdV + (int64_t)r * a.dv_s[2];
#pragma unroll
      for (int n = 0; n < NOW; n++) {
        const int c = cs * KDW + n * 8 + t2;
        oss_store_pair<T>(rk, c, a.d, dK[0][n][2 * hi], dK[0][n][2 * hi + 1], vdk);
        oss_store_pair<T>(rv, c, a.dv, dV[0][n][2 * hi] * dv_scale, dV[0][n][2 * hi + 1] * dv_scale, vdv);
      }
    }
  }
}

template <typename T, int HD, int BR, int BC, int NW, bool VAR>
__global__ void __launch_bounds__(NW * 32, 1) oss_attn_bwd_dq_mma_kernel(const oss_attn_args args) {
  constexpr int KD = oss_attn_kd(HD), LDS = oss_attn_pitch(KD);
  constexpr int MT = BR / (16 * NW), NT = BC / 8, NO = KD / 8, NTHREADS = NW * 32;
  static_assert(MT >= 1 && MT * 16 * NW == BR, "Br must be a multiple of 16 * warps");

  extern __shared__ __align__(16) unsigned char oss_smem[];
  T *sQ = reinterpret_cast<T *>(oss_smem);
  T *sdO = sQ + BR * LDS;
  T *sK = sdO + BR * LDS; /* [2][BC][LDS] */
  T *sV = sK + 2 * BC * LDS;
  float *sL = reinterpret_cast<float *>(sV + 2 * BC * LDS);
  float *sD = sL + BR;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t2 = (lane & 3) * 2;
  oss_attn_query_block qblk;
  oss_attn_args a = args; /* a sequence's view in a variable-length batch */
  if (!oss_attn_query_block_of<T, BR, BC>(a, &qblk)) return;
  const int64_t bh = qblk.bh;
  const int b = qblk.b, h = qblk.h, hk = qblk.hk, i0 = qblk.i0, rows = qblk.rows, ntiles = qblk.ntiles;
  const int jt0 = VAR ? qblk.jt0 : 0; /* a window's first tile (the plain kernel starts at 0) */
  const int wrow = warp * MT * 16;

  const T *gK = (const T *)a.k + b * a.k_s[0] + hk * a.k_s[1];
  const T *gV = (const T *)a.v + b * a.v_s[0] + hk * a.v_s[1];
  const bool vk = a.vec & OSS_ATTN_VEC_K, vv = a.vec & OSS_ATTN_VEC_V;
  const int64_t mbase = a.mask_kind ? oss_attn_mask_base(a, b, h) : 0;
  const float sc = (float)a.scale;
  oss_attn_var_consts vc;
  uint64_t seed = 0; /* dropout's */
  if constexpr (VAR) {
    vc = oss_attn_var_consts_of(a, b, h);
    seed = oss_attn_drop_seed(a);
  }
  const bool centre = a.kmean != nullptr; /* dQ's centring: R, dS' row sums */
  float rs[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) rs[mt][0] = rs[mt][1] = rs[mt][2] = rs[mt][3] = 0.f;

  float dq[MT][NO][4];
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int n = 0; n < NO; n++) dq[mt][n][0] = dq[mt][n][1] = dq[mt][n][2] = dq[mt][n][3] = 0.f;

  if (jt0 < ntiles) {
    oss_load_tile<T, BR, KD, LDS, NTHREADS>(sQ, (const T *)a.q + b * a.q_s[0] + h * a.q_s[1] + (int64_t)i0 * a.q_s[2],
                                             a.q_s[2], rows, a.d, a.vec & OSS_ATTN_VEC_Q, tid);
    oss_load_tile<T, BR, KD, LDS, NTHREADS>(
        sdO, (const T *)a.dout + b * a.do_s[0] + h * a.do_s[1] + (int64_t)i0 * a.do_s[2], a.do_s[2], rows, a.dv,
        a.vec & OSS_ATTN_VEC_DO, tid);
    const int64_t ro = oss_attn_ws_row(a, b, h) + i0;
    oss_attn_load_rowstats<BR, NTHREADS>(sL, sD, (const float *)a.lse_adj + ro, (const float *)a.dsum + ro, tid);
    const int64_t jf = (int64_t)jt0 * BC;
    oss_load_tile<T, BC, KD, LDS, NTHREADS>(sK, gK + jf * a.k_s[2], a.k_s[2], min(BC, a.lk - (int)jf), a.d, vk, tid);
    oss_cp_async_commit();
    oss_load_tile<T, BC, KD, LDS, NTHREADS>(sV, gV + jf * a.v_s[2], a.v_s[2], min(BC, a.lk - (int)jf), a.dv, vv, tid);
    oss_cp_async_commit();
  }

  const uint32_t sQw = oss_smem_u32(sQ + wrow * LDS), sdOw = oss_smem_u32(sdO + wrow * LDS);
  float lrow[MT][2], drow[MT][2];

#pragma unroll 1
  for (int j = jt0; j < ntiles; j++) {
    const int j0 = j * BC;
    const int st = (j - jt0) & 1;
    oss_cp_async_wait<1>();
    __syncthreads();
    if (j == jt0) {
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hi = 0; hi < 2; hi++) {
          lrow[mt][hi] = sL[wrow + mt * 16 + g + hi * 8];
          drow[mt][hi] = sD[wrow + mt * 16 + g + hi * 8];
        }
    }
    if (j + 1 < ntiles) {
      const int jn = j0 + BC;
      oss_load_tile<T, BC, KD, LDS, NTHREADS>(sK + (st ^ 1) * BC * LDS, gK + (int64_t)jn * a.k_s[2], a.k_s[2],
                                               min(BC, a.lk - jn), a.d, vk, tid);
      oss_cp_async_commit();
      oss_load_tile<T, BC, KD, LDS, NTHREADS>(sV + (st ^ 1) * BC * LDS, gV + (int64_t)jn * a.v_s[2], a.v_s[2],
                                               min(BC, a.lk - jn), a.dv, vv, tid);
      oss_cp_async_commit();
    } else {
      oss_cp_async_commit();
      oss_cp_async_commit();
    }

    bool warp_live = !a.causal || (int64_t)j0 <= (int64_t)(i0 + wrow + MT * 16 - 1) + a.causal_off;
    if constexpr (VAR) warp_live = warp_live && oss_attn_var_window_live<MT>(a, i0 + wrow, j0, BC);
    float s[MT][NT][4];
    if (warp_live) {
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < NT; n++) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
      oss_warp_mma_ss<T, MT, NT, KD, LDS, LDS>(s, sQw, oss_smem_u32(sK + st * BC * LDS), lane);
    }
    oss_cp_async_wait<2>();
    __syncthreads();
    if (warp_live) {
      float dp[MT][NT][4];
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < NT; n++) dp[mt][n][0] = dp[mt][n][1] = dp[mt][n][2] = dp[mt][n][3] = 0.f;
      oss_warp_mma_ss<T, MT, NT, KD, LDS, LDS>(dp, sdOw, oss_smem_u32(sV + st * BC * LDS), lane);

      if constexpr (VAR) {
        if (a.drop_seed != nullptr) { /* dP times Z k: dS = P (Z k dP - D) */
          oss_attn_keep<MT, NT> keep;
          oss_attn_dropout_tile<false, MT, NT>(dp, keep, a, seed, bh, i0 + wrow, j0, lane);
        }
        oss_attn_var_each<false>(s, a, vc, mbase, i0 + wrow, j0, lane, [&](int mt, int n, int e, float x, float dcap) {
          const float p = oss_ex2(x - lrow[mt][e >> 1]);
          s[mt][n][e] = (p * sc * dcap) * (dp[mt][n][e] - drow[mt][e >> 1]);
        });
      } else {
        const bool need_mask = a.mask_kind != OSS_MASK_NONE || j0 + BC > a.lk ||
                               (a.causal && (int64_t)(j0 + BC - 1) > (int64_t)(i0 + wrow) + a.causal_off);
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
          for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[mt][n][e] *= a.scale_log2;
        if (need_mask) oss_attn_mask_tile<T, false, MT, NT>(s, a, mbase, i0 + wrow, j0, lane);
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
          for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
              const float p = oss_ex2(s[mt][n][e] - lrow[mt][e >> 1]);
              s[mt][n][e] = (p * sc) * (dp[mt][n][e] - drow[mt][e >> 1]);
            }
      }
      uint32_t dsa[MT][BC / 16][4];
      oss_acc_to_a<T, MT, NT>(s, dsa);
      if (centre) {
        const uint32_t one = oss_mma_op<T>::pack(1.f, 1.f);
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
          for (int kk = 0; kk < BC / 16; kk++) oss_mma_op<T>::run(rs[mt], dsa[mt][kk], one, one);
      }
      oss_warp_mma_rs<T, MT, NO, BC / 16, LDS>(dq, dsa, oss_smem_u32(sK + st * BC * LDS), lane);
    }
  }

  if (centre) { /* dq -= R kbar */
    const float *kbar = a.kmean + ((int64_t)b * a.hkv + hk) * a.mean_ld;
#pragma unroll
    for (int n = 0; n < NO; n++) {
      const float2 w = *reinterpret_cast<const float2 *>(kbar + n * 8 + t2);
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hi = 0; hi < 2; hi++) {
          const float r = isfinite(rs[mt][2 * hi]) ? rs[mt][2 * hi] : 0.f;
          dq[mt][n][2 * hi] -= r * w.x;
          dq[mt][n][2 * hi + 1] -= r * w.y;
        }
    }
  }
  T *gdQ = (T *)a.dq + b * a.dq_s[0] + h * a.dq_s[1];
  const bool vdq = a.vec & OSS_ATTN_VEC_DQ;
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int hi = 0; hi < 2; hi++) {
      const int r = i0 + wrow + mt * 16 + g + hi * 8;
      if (r < a.lq) {
        T *row = gdQ + (int64_t)r * a.dq_s[2];
#pragma unroll
        for (int n = 0; n < NO; n++)
          oss_store_pair<T>(row, n * 8 + t2, a.d, dq[mt][n][2 * hi], dq[mt][n][2 * hi + 1], vdq);
      }
    }
}

/* Deterministic mode (no float32 dQ accumulator, or one that only the Hopper
 * backward's ordered additions use): dQ by the query-major kernel, after a
 * dK/dV kernel that skipped it. */
template <typename T, int HD, int DQ_BR, int DQ_BC, int DQ_NW, bool VAR = false>
oss_status oss_attn_bwd_dq_det_run(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev) {
  if ((a->dq_acc != nullptr && a->dq_sem == nullptr) || a->lq == 0) return OSS_OK;
  return oss_attn_launch(oss_attn_bwd_dq_mma_kernel<T, HD, DQ_BR, DQ_BC, DQ_NW, VAR>,
                         "deterministic attention backward (dQ, mma.sync)", HD,
                         oss_attn_bwd_dq_smem_bytes<HD, DQ_BR, DQ_BC>(),
                         oss_attn_query_grid(a, DQ_BR), DQ_NW * 32, a, stream,
                         dev);
}

template <typename T, int HD, int BR, int NKW, int NCS, int MINB, int DQ_BR, int DQ_BC, int DQ_NW, bool VAR = false>
oss_status oss_attn_bwd_mma_run(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev) {
  /* kbar first: the query-major dQ kernel reads it */
  oss_status ms = oss_attn_bwd_means(a, std::is_same<T, __half>::value ? OSS_FLOAT16 : OSS_BFLOAT16, stream);
  if (ms != OSS_OK) return ms;
  if (a->lk > 0) {
    const oss_status st = oss_attn_launch(
        oss_attn_bwd_dkdv_mma_kernel<T, HD, BR, NKW, NCS, MINB, VAR>,
        VAR ? "attention backward with score variants (dK/dV, mma.sync)" : "attention backward (dK/dV, mma.sync)", HD,
        oss_attn_bwd_dkdv_smem_bytes<HD, BR, NKW>(),
        oss_attn_key_grid(a, 16 * NKW), NKW * NCS * 32, a, stream,
        dev);
    if (st != OSS_OK) return st;
  }
  return oss_attn_bwd_dq_det_run<T, HD, DQ_BR, DQ_BC, DQ_NW, VAR>(a, stream, dev);
}

/* Entry points instantiated once per (head dim, dtype) by the generator: the
 * plain kernels and (VARIANT_HEAD_DIMS) those with the score variants. */
template <typename T, int HD>
oss_status oss_attn_bwd_mma_launch(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev) {
  typedef oss_attn_bwd_cfg<HD> C;
  return oss_attn_bwd_mma_run<T, HD, C::BR, C::NKW, C::NCS, C::MINB, C::DQ_BR, C::DQ_BC, C::DQ_NW>(a, stream, dev);
}
template <typename T, int HD>
oss_status oss_attn_bwd_var_launch(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev) {
  typedef oss_attn_bwd_cfg<HD> C;
  return oss_attn_bwd_mma_run<T, HD, C::BR, C::NKW, C::NCS, C::MINB, C::DQ_BR, C::DQ_BC, C::DQ_NW, true>(a, stream,
                                                                                                          dev);
}
/* The deterministic mode's dQ pass alone (nothing in the default mode), for
 * the Hopper backward, which has no dQ kernel of its own. */
template <typename T, int HD, bool VAR>
oss_status oss_attn_bwd_dq_det_launch(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev) {
  typedef oss_attn_bwd_cfg<HD> C;
  return oss_attn_bwd_dq_det_run<T, HD, C::DQ_BR, C::DQ_BC, C::DQ_NW, VAR>(a, stream, dev);
}

#endif /* OSS_ATTENTION_BWD_CUH */
