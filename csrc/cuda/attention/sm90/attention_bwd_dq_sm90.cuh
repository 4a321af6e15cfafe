/*
 * attention_bwd_dq_sm90.cuh - dQ of the attention backward on Hopper's
 * warpgroup tensor cores (wgmma, sm_90a; float16 and bfloat16), query-major:
 * the same dq as attention_bwd.cuh's oss_attn_bwd_dq_mma_kernel, for the
 * column-split backward (head dim 256, and 192 zero-padded), which computes
 * dK and dV only.
 *
 * With P = exp2(scale log2(e) Q K^T + mask - lse log2(e)) recomputed from the
 * forward's lse, dP = dO V^T, D = rowsum(dO * O) (oss_attn_bwd_pre_kernel)
 * and dS' = scale P (dP - D):  dQ = dS' K, summed over the key tiles in one
 * order, so dq is bitwise reproducible (no atomics).
 *
 * One CTA owns BR = 128 query rows of one (batch, query head) and streams the
 * keys of its kv head (causal: up to the diagonal) in tiles of BC, the
 * forward kernel's shape (attention_fwd_sm90.cuh), warp-specialised:
 *   - a producer warpgroup gives its registers away (setmaxnreg); one of its
 *     threads issues the bulk tensor copies (TMA, 64-column boxes landing
 *     128-byte swizzled, rows past the tensors zero): Q and dO once, then K_j
 *     into K stage j % KSTAGES and V_j into V stage j % VSTAGES, each on its
 *     own "full" mbarrier; a stage is refilled once every consumer warp
 *     arrived on its "empty" mbarrier. V_j is read by dP_j only, K_j by S_j
 *     and by dQ += dS'_j K_j, which runs while the next tile's S and dP
 *     queue, so K takes two stages and V one (shared memory: Q, dO, two K
 *     and one V tile of 64 x 256 fill 224 KB); the copies of K_{j+2} and
 *     V_{j+2} start once tile j's dQ product and tile j + 1's dP are done.
 *   - two consumer warpgroups; warpgroup w owns query rows [64w, 64w + 64),
 *     warp k of it rows 16k .. 16k + 15 (the wgmma accumulator layout). Per
 *     key tile j, inside one warpgroup: wait for S_j = Q K_j^T and
 *     dP_j = dO V_j^T (shared-memory operands, K-major; and for the previous
 *     tile's dQ product), release V_j (and K_{j-1}), compute dS'_j in
 *     registers and pack it to 16 bits, issue dQ += dS'_j K_j (A = dS' from
 *     registers, B = K read MN-major: the forward's P V), then S_{j+1} and
 *     dP_{j+1} behind it. A warpgroup's tensor cores idle while it computes
 *     dS'; the other warpgroup's products fill that time.
 *     A thread holds dQ (HD / 2 floats), S and dP (BC / 2 each) and the
 *     packed dS' (BC / 4 words).
 *   - every tile up to the causal diagonal is computed by both warpgroups (a
 *     tile a warpgroup cannot see is masked to zero weight): a wgmma under a
 *     branch would make ptxas serialise them all.
 *   - dQ's centring (attention_bwd.cuh; off when a.kmean is NULL): each
 *     thread sums its rows' rounded dS' (the values the product multiplies),
 *     the quad's four sums meet at the end, and dq takes -R kbar.
 *   - dq is written from the accumulator fragments (rows < Lq, columns < D).
 *   - VAR (a separate instantiation): the score variants of oss.h per element
 *     (oss_attn_var_each, dS' times the softcap's derivative), only the key
 *     tiles a window reaches, and dropout (dP times Z k before that pass), as
 *     in the mma.sync dQ kernel.
 *   - a variable-length batch (oss.h cu_seqlens): a block is a slot of the
 *     packed rows of its head (oss_attn_seq_slots), the copies address the
 *     sequence's rows in one batch of the tensor maps, and the rows of the
 *     last key tile past the sequence (the next sequence's) are zeroed once
 *     landed.
 * Limits: no mask tensor (the mma.sync backward runs those); D and Dv up
 * to HD (zero padded by the copy engine, whole 64-column boxes); q, k, v and
 * dout with 16-byte aligned base and strides (the tensor maps' rule; else
 * the mma.sync dQ kernel runs); the VAR instantiation keeps 16 bytes of its
 * block constants on the stack (ptxas), read once a tile; built only for
 * sm_90a (elsewhere the body traps; the launcher is in the dispatch table
 * only when the build includes that target).
 */
#ifndef OSS_ATTENTION_BWD_DQ_SM90_CUH
#define OSS_ATTENTION_BWD_DQ_SM90_CUH

#include "cuda/attention/mma/attention_fwd.cuh"
#include "cuda/attention/sm90/attention_sm90.cuh"

template <int HD> struct oss_attn_bwd_dq_sm90_cfg {
  static constexpr int BR = 128; /* query rows per CTA: two consumer warpgroups of 64 */
  static constexpr int BC = 64;  /* keys per tile */
  static constexpr int KSTAGES = 2, VSTAGES = 1;
};

/* The tensor maps of q, dout, k and v: 4-D (head dim, length, heads, batch)
 * with the tensors' strides, boxes of 64 columns by BR (q, dout) or BC (k, v)
 * rows. */
typedef struct oss_attn_bwd_dq_sm90_maps {
  CUtensorMap q, dout, k, v;
} oss_attn_bwd_dq_sm90_maps;

template <int HD, int BR, int BC, int KSTAGES, int VSTAGES>
__host__ __device__ constexpr size_t oss_attn_bwd_dq_sm90_smem_bytes() {
  /* Q, dO, the K and V stages (whole boxes); + room to align the tiles to 1024 bytes */
  return (size_t)(2 * BR + (KSTAGES + VSTAGES) * BC) * oss_sm90_cols(HD) * 2 + 1024;
}

template <typename T, int HD, int BC, int KSTAGES, int VSTAGES, bool VAR>
__global__ void __launch_bounds__(384, 1)
    oss_attn_bwd_dq_sm90_kernel(const __grid_constant__ oss_attn_args args,
                                const __grid_constant__ oss_attn_bwd_dq_sm90_maps maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BR = 128, NT = BC / 8, NO = HD / 8, NWARPS = 8;
  constexpr int KD = oss_sm90_cols(HD);
  static_assert(HD % 64 == 0 && BC % 16 == 0 && BC <= 256, "whole 64-column boxes, key tiles of 16");
  static_assert(BR <= OSS_ATTN_LQ_PAD, "the workspace's row padding covers a block's rows past Lq");

  extern __shared__ __align__(1024) unsigned char oss_sm90_smem[];
  T *sQ = reinterpret_cast<T *>(oss_sm90_smem + ((1024u - (oss_smem_u32(oss_sm90_smem) & 1023u)) & 1023u));
  T *sdO = sQ + BR * KD;
  T *sK = sdO + BR * KD; /* stage st at sK + st * BC * KD */
  T *sV = sK + KSTAGES * BC * KD;

  /* q_full: Q and dO landed (two arrivals plus the copies' bytes);
   * k_full / v_full[stage]: that stage's tile landed; k_empty / v_empty[stage]:
   * every consumer warp is done reading it. */
  __shared__ __align__(8) uint64_t q_full, k_full[KSTAGES], v_full[VSTAGES], k_empty[KSTAGES], v_empty[VSTAGES];

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = oss_warpgroup();
  oss_attn_args a = args; /* in a variable-length batch the block's sequence's view */
  oss_attn_query_block qb;
  if (!oss_attn_query_block_of<T, BR, BC>(a, &qb)) return; /* uniform over the CTA */
  /* the block's key tiles jt0 .. jt0 + ntiles - 1 (a window's; else all up to the diagonal) */
  const int jt0 = VAR ? qb.jt0 : 0, ntiles = qb.ntiles > jt0 ? qb.ntiles - jt0 : 0;
  /* the copies address a variable-length batch's packed rows from the
   * sequence's first (seq_q0, seq_k0) in one batch */
  const int tb = a.cu_q != nullptr ? 0 : qb.b;

  if (tid == 0) {
    oss_mbar_init(&q_full, 2);
    for (int i = 0; i < KSTAGES; i++) {
      oss_mbar_init(&k_full[i], 1);
      oss_mbar_init(&k_empty[i], NWARPS);
    }
    for (int i = 0; i < VSTAGES; i++) {
      oss_mbar_init(&v_full[i], 1);
      oss_mbar_init(&v_empty[i], NWARPS);
    }
    oss_fence_mbar_init();
  }
  __syncthreads(); /* the only CTA-wide barrier */

  if (wg == 2) {
    /* producer warpgroup: one thread issues every copy */
    oss_setmaxnreg_dec<OSS_SM90_PRODUCER_REGS>();
    if (tid == 256 && ntiles > 0) {
      oss_tma_prefetch_map(&maps.q);
      oss_tma_prefetch_map(&maps.dout);
      oss_tma_prefetch_map(&maps.k);
      oss_tma_prefetch_map(&maps.v);
      oss_sm90_load_tile<KD, BR>(sQ, &maps.q, &q_full, (int)a.seq_q0 + qb.i0, qb.h, tb);
      oss_sm90_load_tile<KD, BR>(sdO, &maps.dout, &q_full, (int)a.seq_q0 + qb.i0, qb.h, tb);
#pragma unroll 1
      for (int t = 0; t < ntiles; t++) {
        const int ks = t % KSTAGES, vs = t % VSTAGES, j0 = (int)a.seq_k0 + (jt0 + t) * BC;
        if (t >= KSTAGES) oss_mbar_wait_backoff(&k_empty[ks], (t / KSTAGES - 1) & 1);
        oss_sm90_load_tile<KD, BC>(sK + ks * BC * KD, &maps.k, &k_full[ks], j0, qb.hk, tb);
        if (t >= VSTAGES) oss_mbar_wait_backoff(&v_empty[vs], (t / VSTAGES - 1) & 1);
        oss_sm90_load_tile<KD, BC>(sV + vs * BC * KD, &maps.v, &v_full[vs], j0, qb.hk, tb);
      }
    }
    return;
  }

  /* consumer warpgroups */
  oss_setmaxnreg_inc<OSS_SM90_CONSUMER_REGS>();
  const int g = lane >> 2, t2 = (lane & 3) * 2;
  const int wrow = wg * 64 + (warp & 3) * 16; /* this warp's first row in the block */
  const int r0 = qb.i0 + wrow;                /* its first query row */
  const uint32_t sQa = oss_smem_u32(sQ) + wg * 64 * 128, sdOa = oss_smem_u32(sdO) + wg * 64 * 128;
  const float sc = (float)a.scale;
  const bool centre = a.kmean != nullptr;
  oss_attn_var_consts vc;
  uint64_t seed = 0; /* dropout's */
  if constexpr (VAR) {
    vc = oss_attn_var_consts_of(a, qb.b, qb.h);
    seed = oss_attn_drop_seed(a);
  }
  /* the rows' lse (log2 units, +inf for rows that see no key) and D; the
   * workspace pads every (batch, head)'s or sequence's rows by up to
   * OSS_ATTN_LQ_PAD = BR, so the block's rows past Lq exist there */
  const int64_t ro = oss_attn_ws_row(a, qb.b, qb.h) + r0 + g;
  const float lrow[2] = {((const float *)a.lse_adj)[ro], ((const float *)a.lse_adj)[ro + 8]};
  const float drow[2] = {((const float *)a.dsum)[ro], ((const float *)a.dsum)[ro + 8]};

  float dq[NO][4], rs[2] = {0.f, 0.f};
#pragma unroll
  for (int n = 0; n < NO; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
  uint32_t dsa[NT / 2][4];

  /* dS' of the key tile at j0 into s (its S and dP landed); VAR: the score
   * variants per element (dS' takes the softcap's derivative), dropout's dP
   * times Z k first (attention_bwd.cuh) */
  auto dscores = [&](float (&s)[1][NT][4], float (&dp)[1][NT][4], int j0) {
    if constexpr (VAR) {
      if (a.drop_seed != nullptr) {
        oss_attn_keep<1, NT> keep;
        oss_attn_dropout_tile<false, 1, NT>(dp, keep, a, seed, qb.bh, r0, j0, lane);
      }
      oss_attn_var_each<false, 1, NT, false>(s, a, vc, 0, r0, j0, lane, [&](int mt, int n, int e, float x, float dcap) {
        const float p = oss_ex2(x - lrow[e >> 1]);
        s[mt][n][e] = (p * sc * dcap) * (dp[mt][n][e] - drow[e >> 1]);
      });
    } else {
      const float c = oss_attn_fwd_mask_scores<T, 1, NT, false, false>(s, a, 0, r0, j0, lane);
#pragma unroll
      for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const float p = oss_ex2(fmaf(s[0][n][e], c, -lrow[e >> 1]));
          s[0][n][e] = (p * sc) * (dp[0][n][e] - drow[e >> 1]);
        }
    }
  };
  /* In a variable-length batch the rows of the last key tile past the
   * sequence (the next sequence's keys, weight 0) are zeroed once landed:
   * 0 times a non-finite value would not be 0 */
  auto zero_tail = [&](int t, int ks, int vs) {
    const int first = a.lk - (jt0 + t) * BC;
    if (a.cu_q != nullptr && first < BC) {
      oss_sm90_zero_rows<T, KD, BC>(sK + ks * BC * KD, first, tid & 127, 1 + wg);
      oss_sm90_zero_rows<T, KD, BC>(sV + vs * BC * KD, first, tid & 127, 1 + wg);
    }
  };
  /* dS' packed to T as the A fragments of dQ += dS' K (dsa[kk] holds n-tiles
   * 2kk and 2kk + 1), and the rows' sums of the packed values (centring) */
  auto pack = [&](const float (&s)[1][NT][4]) {
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int hi = 0; hi < 2; hi++) {
        const uint32_t packed = oss_mma_op<T>::pack(s[0][n][2 * hi], s[0][n][2 * hi + 1]);
        dsa[n / 2][2 * (n & 1) + hi] = packed;
        if (centre) {
          const float2 rounded = oss_mma_op<T>::unpack(packed);
          rs[hi] += rounded.x + rounded.y;
        }
      }
  };

  if (ntiles > 0) {
    float s[1][NT][4], dp[1][NT][4];
    oss_mbar_wait(&q_full, 0);
    oss_mbar_wait(&k_full[0], 0);
    oss_mbar_wait(&v_full[0], 0);
    zero_tail(0, 0, 0);
    oss_wgmma_fence_operand<NT>(s[0]);
    oss_wgmma_fence_operand<NT>(dp[0]);
    oss_wgmma_fence_operand<NO>(dq); /* zeroed before the pipeline starts */
    oss_wgmma_fence();
    oss_attn_sm90_qk<T, HD, BR, BC>(s[0], sQa, oss_smem_u32(sK));
    oss_attn_sm90_qk<T, HD, BR, BC>(dp[0], sdOa, oss_smem_u32(sV));
    oss_wgmma_commit();
#pragma unroll 1
    for (int t = 0; t < ntiles; t++) {
      const int ks = t % KSTAGES;
      oss_wgmma_wait<0>(); /* S_t and dP_t, and dQ += dS'_{t-1} K_{t-1} */
      oss_wgmma_fence_operand<NT>(s[0]);
      oss_wgmma_fence_operand<NT>(dp[0]);
      oss_wgmma_fence_operand<NO>(dq);
      oss_wgmma_fence_operand<NT / 2>(dsa);
      __syncwarp();
      if (lane == 0) {
        oss_mbar_arrive(&v_empty[t % VSTAGES]);
        if (t > 0) oss_mbar_arrive(&k_empty[(t - 1) % KSTAGES]);
      }
      dscores(s, dp, (jt0 + t) * BC);
      pack(s);
      oss_wgmma_fence();
      oss_attn_sm90_pv<T, HD, BC>(dq, dsa, oss_smem_u32(sK + ks * BC * KD));
      oss_wgmma_commit();
      if (t + 1 < ntiles) { /* the next tile's S and dP queue behind the dQ product */
        const int nks = (t + 1) % KSTAGES, nvs = (t + 1) % VSTAGES;
        oss_mbar_wait(&k_full[nks], ((t + 1) / KSTAGES) & 1);
        oss_mbar_wait(&v_full[nvs], ((t + 1) / VSTAGES) & 1);
        zero_tail(t + 1, nks, nvs);
        oss_attn_sm90_qk<T, HD, BR, BC>(s[0], sQa, oss_smem_u32(sK + nks * BC * KD));
        oss_attn_sm90_qk<T, HD, BR, BC>(dp[0], sdOa, oss_smem_u32(sV + nvs * BC * KD));
        oss_wgmma_commit();
      }
    }
    oss_wgmma_wait<0>();
    oss_wgmma_fence_operand<NO>(dq);
    oss_wgmma_fence_operand<NT / 2>(dsa);
  }

  if (centre) { /* dq -= R kbar, R the row's sum over its quad */
    const float *kbar = a.kmean + ((int64_t)qb.b * a.hkv + qb.hk) * a.mean_ld;
#pragma unroll
    for (int hi = 0; hi < 2; hi++) {
      rs[hi] += __shfl_xor_sync(0xffffffffu, rs[hi], 1);
      rs[hi] += __shfl_xor_sync(0xffffffffu, rs[hi], 2);
      if (!isfinite(rs[hi])) rs[hi] = 0.f;
    }
#pragma unroll
    for (int n = 0; n < NO; n++) {
      const float2 w = *reinterpret_cast<const float2 *>(kbar + n * 8 + t2);
#pragma unroll
      for (int hi = 0; hi < 2; hi++) {
        dq[n][2 * hi] -= rs[hi] * w.x;
        dq[n][2 * hi + 1] -= rs[hi] * w.y;
      }
    }
  }
  T *gdQ = (T *)a.dq + qb.b * a.dq_s[0] + qb.h * a.dq_s[1];
  const bool vdq = a.vec & OSS_ATTN_VEC_DQ;
#pragma unroll
  for (int hi = 0; hi < 2; hi++) {
    const int r = r0 + g + hi * 8;
    if (r < a.lq) oss_store_frag_row<T, NO>(gdQ + (int64_t)r * a.dq_s[2], t2, a.d, vdq, dq, hi, 1.f);
  }
#else
  __trap(); /* not built for sm_90a: never launched */
#endif
}

/* Computes dq with the kernel (VAR: the instantiation with the score
 * variants and dropout), or where the copy engine cannot address the inputs
 * or the register budget does not hold, with `fallback` (the mma.sync dQ
 * kernel of the same result, from its own generated file). */
template <typename T, int HD, bool VAR>
oss_status oss_attn_bwd_dq_sm90_run(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev,
                                    oss_attn_launch_fn fallback) {
  typedef oss_attn_bwd_dq_sm90_cfg<HD> C;
  if (a->lq == 0) return OSS_OK;
  constexpr auto kernel = oss_attn_bwd_dq_sm90_kernel<T, HD, C::BC, C::KSTAGES, C::VSTAGES, VAR>;
  static const int regs = oss_kernel_regs(kernel);
  const size_t smem = oss_attn_bwd_dq_sm90_smem_bytes<HD, C::BR, C::BC, C::KSTAGES, C::VSTAGES>();
  /* a variable-length batch: one batch of the packed rows */
  const bool packed = a->cu_q != NULL;
  const int64_t mb = packed ? 1 : a->batch, mq = packed ? a->total_q : a->lq, mk = packed ? a->total_k : a->lk;
  oss_attn_bwd_dq_sm90_maps maps;
  if (a->mask_kind != OSS_MASK_NONE || regs < OSS_SM90_LAUNCH_REGS || smem > (size_t)dev->max_smem_per_block_optin ||
      mq > INT_MAX || mk > INT_MAX || !oss_attn_sm90_map<T>(&maps.q, a->q, mb, a->hq, mq, a->d, a->q_s, C::BR) ||
      !oss_attn_sm90_map<T>(&maps.dout, a->dout, mb, a->hq, mq, a->dv, a->do_s, C::BR) ||
      !oss_attn_sm90_map<T>(&maps.k, a->k, mb, a->hkv, mk, a->d, a->k_s, C::BC) ||
      !oss_attn_sm90_map<T>(&maps.v, a->v, mb, a->hkv, mk, a->dv, a->v_s, C::BC))
    return fallback(a, stream, dev);
  OSS_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  kernel<<<oss_attn_query_grid(a, C::BR), 384, smem, stream>>>(*a, maps);
  return oss_check_launch(VAR ? "attention backward with score variants (dQ, wgmma)" : "attention backward (dQ, wgmma)");
}

#endif /* OSS_ATTENTION_BWD_DQ_SM90_CUH */
