/*
 * attention_fwd.cuh - FlashAttention-2 forward on tensor cores (float16 and
 * bfloat16, mma.sync m16n8k16, sm_80 and newer): out = softmax(scale*Q K^T +
 * mask) V and lse = log(sum(exp(scale*Q K^T + mask))) per query row.
 *
 * One CTA owns Br query rows of one (batch, query head) and streams the keys of
 * its kv head (h / group, GQA without copies) in tiles of Bc:
 *   - NW warps; warp w owns MT = Br / (16 NW) m-tiles (16 rows each), rows
 *     [w*MT*16, (w+1)*MT*16) of the tile, and all Bc keys of a tile, so each
 *     warp runs its own online softmax with no inter-warp traffic.
 *   - shared memory: Q tile (Br x KD), and two stages of K and V tiles
 *     (Bc x KD each), KD = head dim rounded up to 16, zero padded.
 *   - pipeline per key tile j: wait K_j (Q with it at j = 0), barrier, issue
 *     cp.async for K_{j+1} and V_{j+1} into the other stage, S = Q K_j^T
 *     (ldmatrix + mma, fp32 accumulators), scale and mask, online softmax
 *     (m, l and o rescaled by exp2(m_old - m_new)), P packed into A fragments
 *     (l sums P for lse, lr the packed, rounded P for out = o / lr),
 *     wait V_j, barrier, o += P V_j (ldmatrix.trans for V).
 *   - causal: tiles past the diagonal are never loaded; the element mask runs
 *     only on tiles that cross the diagonal or the end of the keys, or on every
 *     tile when a mask tensor is given (read from global, tile by tile).
 *   - end: o / l written with rows < Lq and cols < Dv only, lse = m ln2 + ln l
 *     (float32); a row with no visible key gives 0 and -inf.
 *   - VAR (a separate instantiation): the score variants of oss.h
 *     (oss_attn_fwd_var_scores: the visibility test only on tiles that cross the
 *     diagonal, a window's edge or the end of the keys, or carry a mask; the
 *     softcap and ALiBi arithmetic alone elsewhere, so sinks and windows
 *     alone cost an inner tile one multiply per score), a row's softmax
 *     starting at its sink, and a window's key tiles only (the query block's
 *     first visible tile to its last). Dropout (calls with drop_seed) is a
 *     variant too: the softmax as without (m, l, lr and lse those of the
 *     weights before dropout), then the dropped weights of the packed P
 *     zeroed (one Philox call per eight of a thread's weights,
 *     oss_attn_dropout_keep), and 1 / (1 - p), the kept weights' common
 *     factor, applied to out at the end; a call without dropout tests for it
 *     once per tile.
 * Limits: head dims up to the compiled HD (D and Dv padded with zero columns);
 * lengths below 2^31; any strides (16-byte cp.async where rows are aligned,
 * element loads otherwise).
 */
#ifndef OSS_ATTENTION_FWD_CUH
#define OSS_ATTENTION_FWD_CUH

#include "cuda/attention/mma/attention_mma.cuh"

/* ---- per-tile steps shared by the mma.sync kernel here and the wgmma kernel
 * (attention_fwd_sm90.cuh). Scores and output are C fragments: s[mt][n][e] is
 * row r0 + 16mt + g (+8 for e >= 2), column 8n + 2t + (e & 1) of the tile. */

/* Prepares the raw scores of key tile j0 for rows r0 .. r0 + 16 MT - 1 and
 * returns c, the factor the softmax applies to them (folded into the row max
 * and exp2's FFMA). Tiles that need no element mask keep raw scores and
 * c = scale log2(e); so do tiles across the key bound, the causal diagonal or
 * a window's edge, with their invisible scores set to -inf, which c leaves
 * -inf while it is positive. With a mask tensor (added to the scaled scores)
 * or a scale that is not positive (where max and scaling do not commute, and
 * 0 times -inf would be NaN) a masked tile is scaled here and c = 1.
 * MASK_TENSOR = false: a kernel built for calls without a mask tensor
 * (a.mask_kind is none), which then needs no registers for reading one.
 * WINDOWS = false: a kernel never run with a window (oss_attn_mask_frag). */
template <typename T, int MT, int NT, bool MASK_TENSOR = true, bool WINDOWS = true>
__device__ __forceinline__ float oss_attn_fwd_mask_scores(float (&s)[MT][NT][4], const oss_attn_args &a,
                                                          int64_t mbase, int r0, int j0, int lane) {
  const bool need_mask = (MASK_TENSOR && a.mask_kind != OSS_MASK_NONE) || a.scale_log2 < 0.f || j0 + NT * 8 > a.lk ||
                         (a.causal && (int64_t)(j0 + NT * 8 - 1) > (int64_t)r0 + a.causal_off) ||
                         (WINDOWS && !MASK_TENSOR && !oss_attn_window_holds(a, r0, MT * 16, j0, NT * 8));
  if (!need_mask) return a.scale_log2;
  const bool scaled = MASK_TENSOR || !(a.scale_log2 > 0.f);
  if (scaled)
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[mt][n][e] *= a.scale_log2;
  if (MASK_TENSOR) oss_attn_mask_tile<T, false, MT, NT>(s, a, mbase, r0, j0, lane);
  else oss_attn_mask_frag<void, false, MT, NT, WINDOWS>(s, a, mbase, r0, j0, lane);
  return scaled ? 1.f : a.scale_log2;
}

/* oss_attn_fwd_mask_scores under the score variants: each score of
 * oss_attn_var_each in place, c = 1; or, without softcap or ALiBi (which
 * then only scale), as in the plain kernels: the raw scores and c = scale
 * log2(e), the hidden ones -inf where the tile needs it and no mask tensor
 * is read (so that where the variants change nothing, dropout say, the
 * weights and lse are the plain kernels' to the bit). */
template <int MT, int NT, bool MASKS = true>
__device__ __forceinline__ float oss_attn_fwd_var_scores(float (&s)[MT][NT][4], const oss_attn_args &a,
                                                         const oss_attn_var_consts &v, int64_t mbase, int r0, int j0,
                                                         int lane) {
  if (v.cap == 0.f && v.slope == 0.f && v.scale_l2 >= 0.f) {
    if (oss_attn_var_interior(a, r0, MT * 16, j0, NT * 8)) return v.scale_l2;
    if (v.scale_l2 > 0.f && (!MASKS || a.mask_kind == OSS_MASK_NONE)) {
      oss_attn_mask_frag<void, false, MT, NT>(s, a, mbase, r0, j0, lane);
      return v.scale_l2;
    }
  }
  oss_attn_var_each<false, MT, NT, MASKS>(s, a, v, mbase, r0, j0, lane,
                           [&](int mt, int n, int e, float x, float) { s[mt][n][e] = x; });
  return 1.f;
}

/* Online softmax over one tile: rows g and g+8 of each m-tile, a row's 4
 * owners are one quad. m (log2 units), l and lr are per row, o is rescaled by
 * exp2(m_old - m_new), and P = exp2(c s - m_new) goes to pa, packed to T as
 * the A fragments of P V (pa[mt][kk] holds n-tiles 2kk and 2kk+1, see
 * oss_acc_to_a). l sums P in float32, for lse; lr sums the rounded P that
 * P V multiplies, for out = P V / lr, an exact weighted mean of V's rows (a V
 * whose rows are equal comes out unchanged). Normalised by l instead, out
 * would carry P's rounding error as a scale error, which out's rounding
 * residual passes into the backward's D (dq, dk wrong by up to 1e-1 where
 * V's rows are equal); summed from the rounded P, lse loses accuracy. */
template <typename T, int MT, int NT, int NO>
__device__ __forceinline__ void oss_attn_online_softmax(const float (&s)[MT][NT][4], float (&o)[MT][NO][4],
                                                        float (&m)[MT][2], float (&l)[MT][2], float (&lr)[MT][2],
                                                        float c, uint32_t (&pa)[MT][NT / 2][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int hi = 0; hi < 2; hi++) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < NT; n++) mx = fmaxf(mx, fmaxf(s[mt][n][2 * hi], s[mt][n][2 * hi + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[mt][hi], mx * c);
      const float m_use = m_new == -INFINITY ? 0.f : m_new; /* fully masked so far: p = 0 */
      const float alpha = oss_ex2(m[mt][hi] - m_use);
      m[mt][hi] = m_new;
      float sum = 0.f, sum_rounded = 0.f;
#pragma unroll
      for (int n = 0; n < NT; n++) {
        const float p0 = oss_ex2(fmaf(s[mt][n][2 * hi], c, -m_use));
        const float p1 = oss_ex2(fmaf(s[mt][n][2 * hi + 1], c, -m_use));
        const uint32_t packed = oss_mma_op<T>::pack(p0, p1);
        pa[mt][n / 2][2 * (n & 1) + hi] = packed;
        const float2 rounded = oss_mma_op<T>::unpack(packed);
        sum += p0 + p1;
        sum_rounded += rounded.x + rounded.y;
      }
      l[mt][hi] = l[mt][hi] * alpha + sum;
      lr[mt][hi] = lr[mt][hi] * alpha + sum_rounded;
#pragma unroll
      for (int n = 0; n < NO; n++) {
        o[mt][n][2 * hi] *= alpha;
        o[mt][n][2 * hi + 1] *= alpha;
      }
    }
}

/* Writes out = out_scale o / lr for rows r0 .. r0 + 16 MT - 1 (those < Lq,
 * columns < Dv) and lse = m ln2 + ln l (float32). l == 0: no visible key
 * (out 0, lse -inf); l NaN: a NaN or +inf score (out and lse NaN, as SDPA's
 * math). With a.out_res, also out's rounding residual out_scale o / lr - out
 * as int8 codes (oss_output_residual_code: steps of 2^-5 of out's last place,
 * 0 where out is not finite), for the backward's D. out_scale: dropout's 1 /
 * (1 - p), else 1. RUN: out's common case as one run of stores
 * (oss_store_frag_row); false keeps a branch per pair, for a kernel without
 * the registers to spare for both paths. WIDE (implies RUN): out in 16-byte
 * and the residual in 8-byte stores after the quad's exchange. The
 * residual's stores follow the output's, so that the path without them is
 * one stretch of code. OUT = false: out is left to the caller (the Hopper
 * forward stores it through shared memory with the copy engine), which gets
 * each row's factor out_scale / lr in inv_rows (row g + 8 hi of m-tile mt
 * at inv_rows[mt][hi], on every lane of its quad). */
template <typename T, int MT, int NO, bool RUN = true, bool WIDE = false, bool OUT = true>
__device__ __forceinline__ void oss_attn_fwd_write(const oss_attn_args &a, const float (&o)[MT][NO][4],
                                                   const float (&m)[MT][2], const float (&l)[MT][2],
                                                   const float (&lr)[MT][2], int b, int h, int64_t bh, int r0,
                                                   int lane, float out_scale = 1.f, float (*inv_rows)[2] = nullptr) {
  T *gO = (T *)a.out + b * a.o_s[0] + h * a.o_s[1];
  int8_t *gR = a.out_res == nullptr ? nullptr : (int8_t *)a.out_res + b * a.o_s[0] + h * a.o_s[1];
  float *lse = (float *)a.lse + oss_attn_lse_row(a, bh);
  const bool vo = a.vec & OSS_ATTN_VEC_O, vr = a.vec & OSS_ATTN_VEC_OR;
  const int g = lane >> 2, t2 = (lane & 3) * 2;
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int hi = 0; hi < 2; hi++) {
      float lt = l[mt][hi], lrt = lr[mt][hi];
      lt += __shfl_xor_sync(0xffffffffu, lt, 1);
      lt += __shfl_xor_sync(0xffffffffu, lt, 2);
      lrt += __shfl_xor_sync(0xffffffffu, lrt, 1);
      lrt += __shfl_xor_sync(0xffffffffu, lrt, 2);
      /* lr >= 1 when l > 0: the row's largest P is exactly 1 */
      const float inv = lt == 0.f ? 0.f : out_scale / lrt;
      if (!OUT) inv_rows[mt][hi] = inv;
      const int r = r0 + mt * 16 + g + hi * 8;
      if (r < a.lq) {
        T *orow = gO + (int64_t)r * a.o_s[2];
        if constexpr (OUT) {
          if (RUN) {
            oss_store_frag_row<T, NO, WIDE>(orow, t2, a.dv, vo, o[mt], hi, inv);
          } else {
#pragma unroll
            for (int n = 0; n < NO; n++)
              oss_store_pair<T>(orow, n * 8 + t2, a.dv, o[mt][n][2 * hi] * inv, o[mt][n][2 * hi + 1] * inv, vo);
          }
        }
        if (gR != nullptr) oss_store_residual_row<T, NO, WIDE>(gR + (int64_t)r * a.o_s[2], t2, a.dv, vr, o[mt], hi, inv);
        if ((lane & 3) == 0) /* in double: one rounding of m ln2 + ln l, which can be large */
          lse[r] = lt == 0.f ? -INFINITY : (float)((double)m[mt][hi] * OSS_LN2 + (double)logf(lt));
      }
    }
}

/* Tile configuration per compiled head dim. */
template <int HD> struct oss_attn_fwd_cfg {
  static constexpr int BR = 128;                 /* query rows per CTA */
  static constexpr int NW = HD <= 128 ? 4 : 8;   /* warps: MT = 2 m-tiles per warp up to 128, then 1 */
  static constexpr int BC = HD <= 64 ? 128 : (HD <= 192 ? 64 : 32); /* keys per tile (hd 256: 2 stages fit smem) */
  static constexpr int MINB = 1;                 /* __launch_bounds__ min blocks per SM (register cap) */
  /* keys per tile of the variants' kernel: at head dim 64 their per-score
   * work spills registers with 128 (the same warps, MT = 2, run faster at
   * head dim 128 on long rows than 8 warps of MT = 1) */
  static constexpr int VAR_BC = BC < 64 ? BC : 64;
};

template <int HD, int BR, int BC> __host__ __device__ constexpr size_t oss_attn_fwd_smem_bytes() {
  return (size_t)(BR + 4 * BC) * oss_attn_pitch(oss_attn_kd(HD)) * 2;
}

template <typename T, int HD, int BR, int BC, int NW, int MINB, bool VAR>
__global__ void __launch_bounds__(NW * 32, MINB) oss_attn_fwd_mma_kernel(const oss_attn_args args) {
  constexpr int KD = oss_attn_kd(HD), LDS = oss_attn_pitch(KD);
  constexpr int MT = BR / (16 * NW), NT = BC / 8, NO = KD / 8, NTHREADS = NW * 32;
  static_assert(MT >= 1 && MT * 16 * NW == BR, "Br must be a multiple of 16 * warps");
  static_assert(BC % 16 == 0, "Bc must be a multiple of 16");

  extern __shared__ __align__(16) unsigned char oss_smem[];
  T *sQ = reinterpret_cast<T *>(oss_smem);
  T *sK = sQ + BR * LDS;
  T *sV = sK + 2 * BC * LDS;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  oss_attn_args a = args; /* a sequence's view in a variable-length batch */
  oss_attn_query_block qblk;
  if (!oss_attn_query_block_of<T, BR, BC>(a, &qblk)) return;
  const int64_t bh = qblk.bh;
  const int b = qblk.b, h = qblk.h, hk = qblk.hk, i0 = qblk.i0, rows = qblk.rows, ntiles = qblk.ntiles;
  const int jt0 = VAR ? qblk.jt0 : 0; /* a window's first tile (the plain kernel starts at 0) */
  const int wrow = warp * MT * 16; /* this warp's first row in the tile */
  oss_attn_var_consts vc;
  uint64_t seed = 0; /* dropout's */
  if constexpr (VAR) {
    vc = oss_attn_var_consts_of(a, b, h);
    seed = oss_attn_drop_seed(a);
  }

  const T *gQ = (const T *)a.q + b * a.q_s[0] + h * a.q_s[1] + (int64_t)i0 * a.q_s[2];
  const T *gK = (const T *)a.k + b * a.k_s[0] + hk * a.k_s[1];
  const T *gV = (const T *)a.v + b * a.v_s[0] + hk * a.v_s[1];
  const bool vq = a.vec & OSS_ATTN_VEC_Q, vk = a.vec & OSS_ATTN_VEC_K, vv = a.vec & OSS_ATTN_VEC_V;
  const int64_t mbase = a.mask_kind ? oss_attn_mask_base(a, b, h) : 0;

  /* A sink starts each row's softmax as its first term: m = the sink, and
   * one quad lane's l and lr hold its exp(sink - m) = 1 (the quad's lanes
   * are summed at the end). */
  const float sink_l2 = (!VAR || a.sinks == nullptr) ? -INFINITY : a.sinks[h] * (float)OSS_LOG2E;
  const float sink_l = (VAR && a.sinks != nullptr && (lane & 3) == 0) ? 1.f : 0.f;
  float o[MT][NO][4];
  float m[MT][2], l[MT][2], lr[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
#pragma unroll
    for (int n = 0; n < NO; n++) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
    m[mt][0] = m[mt][1] = sink_l2;
    l[mt][0] = l[mt][1] = lr[mt][0] = lr[mt][1] = sink_l;
  }

  if (jt0 < ntiles) {
    const int64_t jf = (int64_t)jt0 * BC;
    oss_load_tile<T, BR, KD, LDS, NTHREADS>(sQ, gQ, a.q_s[2], rows, a.d, vq, tid);
    oss_load_tile<T, BC, KD, LDS, NTHREADS>(sK, gK + jf * a.k_s[2], a.k_s[2], min(BC, a.lk - (int)jf), a.d, vk, tid);
    oss_cp_async_commit();
    oss_load_tile<T, BC, KD, LDS, NTHREADS>(sV, gV + jf * a.v_s[2], a.v_s[2], min(BC, a.lk - (int)jf), a.dv, vv, tid);
    oss_cp_async_commit();
  }

  const uint32_t sQw = oss_smem_u32(sQ + wrow * LDS);

#pragma unroll 1
  for (int j = jt0; j < ntiles; j++) {
    const int j0 = j * BC;
    const int st = (j - jt0) & 1;
    oss_cp_async_wait<1>(); /* K_j (and Q) landed; V_j may still be in flight */
    __syncthreads();        /* ... for every thread; and stage st^1 is free again */
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

    /* Keys of this tile visible to some row of this warp? (causal and window skip) */
    bool warp_live = !a.causal || (int64_t)j0 <= (int64_t)(i0 + wrow + MT * 16 - 1) + a.causal_off;
    if constexpr (VAR) warp_live = warp_live && oss_attn_var_window_live<MT>(a, i0 + wrow, j0, BC);
    uint32_t pa[MT][BC / 16][4];
    if (warp_live) {
      float s[MT][NT][4];
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < NT; n++) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
      oss_warp_mma_ss<T, MT, NT, KD, LDS, LDS>(s, sQw, oss_smem_u32(sK + st * BC * LDS), lane);

      float c;
      if constexpr (VAR) c = oss_attn_fwd_var_scores<MT, NT>(s, a, vc, mbase, i0 + wrow, j0, lane);
      else c = oss_attn_fwd_mask_scores<T, MT, NT>(s, a, mbase, i0 + wrow, j0, lane);
      oss_attn_online_softmax<T, MT, NT, NO>(s, o, m, l, lr, c, pa);
      if constexpr (VAR) {
        if (a.drop_seed != nullptr) { /* dropout: the dropped weights of P zeroed */
          oss_attn_keep<MT, NT> keep;
          oss_attn_dropout_keep<false, MT, NT>(keep, a, seed, bh, i0 + wrow, j0, lane);
          oss_attn_dropout_apply_a<MT, NT>(pa, keep);
        }
      }
    }

    oss_cp_async_wait<2>(); /* V_j landed (K_{j+1}, V_{j+1} may be in flight) */
    __syncthreads();
    if (warp_live) oss_warp_mma_rs<T, MT, NO, BC / 16, LDS>(o, pa, oss_smem_u32(sV + st * BC * LDS), lane);
  }

  oss_attn_fwd_write<T, MT, NO>(a, o, m, l, lr, b, h, bh, i0 + wrow, lane,
                                VAR && a.drop_seed != nullptr ? a.drop_scale : 1.f);
}

template <typename T, int HD, int BR, int BC, int NW, int MINB, bool VAR = false>
oss_status oss_attn_fwd_mma_run(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev) {
  return oss_attn_launch(oss_attn_fwd_mma_kernel<T, HD, BR, BC, NW, MINB, VAR>,
                         VAR ? "attention forward with score variants (mma.sync)" : "attention forward (mma.sync)", HD,
                         oss_attn_fwd_smem_bytes<HD, BR, BC>(),
                         oss_attn_query_grid(a, BR), NW * 32, a, stream, dev);
}

/* Entry points instantiated once per (head dim, dtype) by the generator: the
 * plain kernel, and (for the head dims of VARIANT_HEAD_DIMS) the one with the
 * score variants (a separate instantiation, so they cost the plain kernel no
 * registers). */
template <typename T, int HD>
oss_status oss_attn_fwd_mma_launch(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev) {
  typedef oss_attn_fwd_cfg<HD> C;
  return oss_attn_fwd_mma_run<T, HD, C::BR, C::BC, C::NW, C::MINB>(a, stream, dev);
}
template <typename T, int HD>
oss_status oss_attn_fwd_var_launch(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev) {
  typedef oss_attn_fwd_cfg<HD> C;
  return oss_attn_fwd_mma_run<T, HD, C::BR, C::VAR_BC, C::NW, C::MINB, true>(a, stream, dev);
}

#endif /* OSS_ATTENTION_FWD_CUH */
