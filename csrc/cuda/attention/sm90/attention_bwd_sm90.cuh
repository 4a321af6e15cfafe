/*
 * attention_bwd_sm90.cuh - the attention backward on Hopper's warpgroup tensor
 * cores (wgmma, sm_90a; float16 and bfloat16, head dims 64 and 128): the same
 * gradients as attention_bwd.cuh's dK/dV kernel, with m64nNk16 wgmma in place
 * of warp-level mma.sync.
 *
 * With P = exp(scale Q K^T + mask - lse) recomputed from the forward's lse,
 * dP = dO V^T, D = rowsum(dO * O) (oss_attn_bwd_pre_kernel, run before) and
 * dS' = scale P (dP - D):  dV = P^T dO,  dK = dS'^T Q,  dQ = dS' K.
 *
 * One CTA (256 threads, two warpgroups) owns BC = 128 keys of one (batch, kv
 * head); K and V of the block stay in shared memory, and the CTA loops over
 * every query head of its GQA group and every block of BR query rows that sees
 * the keys (causal: from the diagonal on). Warpgroup w owns keys
 * [64w, 64w + 64) of the block, warp k of it keys 16k .. 16k + 15 (the wgmma
 * accumulator rows), and accumulates their dK and dV in registers. Per query
 * block (Q, dO, lse and D double buffered with cp.async, the next block
 * loading while this one computes; all tiles 128-byte swizzled):
 *   S^T = K_w Q^T and dP^T = V_w dO^T (wgmma, both operands in shared memory,
 *   K-major); P^T and dS'^T in registers, key-major, so they are directly the
 *   A operands of dV += P^T dO and dK += dS'^T Q (B = dO, Q read MN-major).
 *   dQ (default, non-deterministic mode): dS'^T goes to shared memory and,
 *   after a CTA barrier, warpgroup w computes a 64 x 64 piece of
 *   dQ_blk = dS' K (A = dS' read MN-major from dS'^T, B = K MN-major; BR = 64:
 *   head-dim columns [64w, 64w + 64), BR = 128: query rows [64w, 64w + 64)),
 *   staged in shared memory and added to the float32 dQ accumulator of the
 *   workspace with one bulk reduction (cp.reduce.async.bulk) per row, issued
 *   after the next barrier.
 *   Deterministic mode skips that and runs the mma.sync dQ kernel afterwards.
 *   VAR (a separate instantiation): the score variants through
 *   oss_attn_var_each, P^T and dS'^T in one pass per element once dP^T has
 *   landed (dS' takes the softcap's derivative), only the query blocks whose
 *   window reaches the keys; calls with a mask tensor as well run the
 *   mma.sync kernels with the variants. Dropout (a variant too, as in
 *   attention_bwd.cuh): the tile's kept weights drawn while dP^T is
 *   computed, dP^T times Z k before that pass, the dropped weights zeroed in
 *   the packed P^T after it, and dV times k when written.
 *   dQ's centring (attention_bwd.cuh): m64n8k16 wgmmas of dS' by a tile of
 *   ones give the row sums R of the piece's 64 query rows (BR = 64: each
 *   warpgroup over its half of the keys), added into eacc.
 * Limits: D and Dv up to HD, zero padded; HD in {64, 128} with BR * HD = 8192
 * (the dQ split); built only for sm_90a (elsewhere the body traps and the
 * launcher is not in the dispatch table).
 */
#ifndef OSS_ATTENTION_BWD_SM90_CUH
#define OSS_ATTENTION_BWD_SM90_CUH

#include "cuda/attention/mma/attention_bwd.cuh"
#include "cuda/attention/sm90/attention_sm90.cuh"

template <int HD> struct oss_attn_bwd_sm90_cfg {
  static constexpr int BC = 128;             /* keys per CTA (two warpgroups of 64) */
  static constexpr int BR = 8192 / HD;       /* query rows per iteration: 128 (hd 64), 64 (hd 128) */
};

/* float pitch of the dQ staging rows: 16 bytes of padding against bank conflicts */
template <int HD> __host__ __device__ constexpr int oss_attn_bwd_sm90_dq_pitch() { return HD + 4; }

template <int HD, int BR, int BC> __host__ __device__ constexpr size_t oss_attn_bwd_sm90_smem_bytes() {
  return (size_t)(2 * BC + 4 * BR) * HD * 2                  /* K, V, 2 x (Q, dO) */
         + (size_t)BC * BR * 2                                /* dS'^T */
         + (size_t)BR * oss_attn_bwd_sm90_dq_pitch<HD>() * 4 /* dQ block (float) */
         + (size_t)4 * BR * 4                                 /* 2 x (lse, D) */
         + 1024                                               /* a tile of ones (dQ's centring) */
         + 1024;                                              /* room to align the tiles to 1024 bytes */
}

/* Adds the dQ block staged in sdQ (rows < `rows`) to the float32 accumulator
 * rows acc[r * ld]: one bulk reduction per row, issued by thread r. */
template <int HD, int BR>
__device__ __forceinline__ void oss_attn_bwd_sm90_flush_dq(float *acc, int64_t ld, const float *sdQ, int rows,
                                                           int tid) {
  if (tid < BR && tid < rows) {
    oss_bulk_reduce_add_f32(acc + tid * ld, oss_smem_u32(sdQ + tid * oss_attn_bwd_sm90_dq_pitch<HD>()), HD * 4);
    oss_bulk_commit();
  }
}

template <typename T, int HD, int BR, int BC, bool VAR = false>
__global__ void __launch_bounds__(256, 1) oss_attn_bwd_sm90_kernel(const oss_attn_args args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int NTHREADS = 256, NTQ = BR / 8, NO = HD / 8;
  static_assert(HD % 64 == 0 && BR % 64 == 0 && BC == 128, "64-multiples, two warpgroups of 64 keys");
  static_assert(BR * HD == 8192, "the dQ block splits into one 64 x 64 piece per warpgroup");

  extern __shared__ __align__(1024) unsigned char oss_sm90_smem[];
  T *sK = reinterpret_cast<T *>(oss_sm90_smem + ((1024u - (oss_smem_u32(oss_sm90_smem) & 1023u)) & 1023u));
  T *sV = sK + BC * HD;
  T *sQ = sV + BC * HD;       /* [2][BR x HD] */
  T *sdO = sQ + 2 * BR * HD;  /* [2][BR x HD] */
  T *sdS = sdO + 2 * BR * HD; /* dS'^T: BC rows (keys) x BR columns (queries) */
  float *sdQ = reinterpret_cast<float *>(sdS + BC * BR);  /* [BR][dq pitch] */
  float *sL = sdQ + BR * oss_attn_bwd_sm90_dq_pitch<HD>(); /* [2][BR] */
  float *sD = sL + 2 * BR;                              /* [2][BR] */
  T *sOnes = reinterpret_cast<T *>(sD + 2 * BR);        /* 8 x 64 ones: B of the dS' row sums */
  static_assert(((2 * BC + 4 * BR) * HD * 2 + BC * BR * 2 + BR * oss_attn_bwd_sm90_dq_pitch<HD>() * 4 + 4 * BR * 4) %
                        1024 == 0,
                "the tile of ones is 1024-byte aligned, as its 128-byte swizzle needs");

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const int g = lane >> 2, t2 = (lane & 3) * 2;
  int b, hk, block;
  if (!oss_attn_key_block_of(args, BC, &b, &hk, &block)) return;
  oss_attn_args a = args; /* a sequence's view in a variable-length batch */
  oss_attn_seq_view<T>(a, b);
  const int j0 = block * BC;
  if (block < 0 || j0 >= a.lk) return; /* an empty slot, or past a shorter sequence's keys */
  const int krows = min(BC, a.lk - j0);
  const int kw0 = j0 + wg * 64 + (warp & 3) * 16; /* this warp's first key */

  int qb0, nqe;
  oss_attn_bwd_query_blocks<BR>(a, j0, &qb0, &nqe, BC);
  const int niter = a.group * nqe;

  const bool atomic_dq = a.dq_acc != nullptr;
  const float sc = (float)a.scale;
  const uint64_t seed = VAR ? oss_attn_drop_seed(a) : 0; /* dropout's */

  float dV[NO][4], dK[NO][4];
#pragma unroll
  for (int n = 0; n < NO; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) dV[n][e] = dK[n][e] = 0.f;

  if (niter > 0) {
    oss_load_tile<T, BC, HD, 64, NTHREADS, true>(
        sK, (const T *)a.k + b * a.k_s[0] + hk * a.k_s[1] + (int64_t)j0 * a.k_s[2], a.k_s[2], krows, a.d,
        a.vec & OSS_ATTN_VEC_K, tid);
    oss_load_tile<T, BC, HD, 64, NTHREADS, true>(
        sV, (const T *)a.v + b * a.v_s[0] + hk * a.v_s[1] + (int64_t)j0 * a.v_s[2], a.v_s[2], krows, a.dv,
        a.vec & OSS_ATTN_VEC_V, tid);
  }
  reinterpret_cast<uint32_t *>(sOnes)[tid] = oss_mma_op<T>::pack(1.f, 1.f); /* 256 x 4 bytes */
  const uint32_t sKw = oss_smem_u32(sK) + wg * 64 * 128, sVw = oss_smem_u32(sV) + wg * 64 * 128;
  /* this warpgroup's 64 x 64 piece of dQ_blk: query rows mo.., head-dim columns no.. */
  const int mo = BR == 128 ? wg * 64 : 0, no = BR == 128 ? 0 : wg * 64;
  /* dQ's centring: the dS' row sums of this warpgroup's piece, over all 128
   * keys (BR = 128: the rows are its own) or over its half of them (BR = 64:
   * both warpgroups share the rows and each adds half the sum), always issued
   * (a condition around a wgmma makes ptxas serialise every wgmma of the
   * kernel) */
  constexpr int RS_STEPS = BR == 128 ? BC / 16 : BC / 32;
  const int rs_k0 = BR == 128 ? 0 : wg * RS_STEPS;
  /* the dQ block staged in sdQ, to be added to the accumulator after the next barrier */
  float *dq_pending = nullptr;
  int dq_pending_rows = 0;

#pragma unroll 1
  for (int it = -1; it < niter; it++) {
    const int st = it & 1;
    if (it >= 0) {
      oss_cp_async_wait<0>(); /* stage st (and K, V) landed */
      oss_fence_proxy_async(); /* ... for the tensor cores' reads too */
      __syncthreads();        /* for all threads; stage st^1 and dS'^T are free, sdQ is staged */
      if (dq_pending != nullptr) oss_attn_bwd_sm90_flush_dq<HD, BR>(dq_pending, a.dq_ld, sdQ, dq_pending_rows, tid);
    }
    if (it + 1 < niter) { /* prefetch iteration it + 1 into stage st^1 */
      const int sn = st ^ 1;
      oss_attn_bwd_load_query_block<T, BR, HD, 64, NTHREADS, true>(a, b, hk, qb0, nqe, it + 1, sQ + sn * BR * HD,
                                                                   sdO + sn * BR * HD, sL + sn * BR, sD + sn * BR,
                                                                   tid);
    }
    oss_cp_async_commit();
    if (it < 0) continue;

    const int h = hk * a.group + it / nqe;
    const int i0 = (qb0 + it % nqe) * BR;
    const uint32_t cQ = oss_smem_u32(sQ + st * BR * HD), cdO = oss_smem_u32(sdO + st * BR * HD);
    const float *cL = sL + st * BR, *cD = sD + st * BR;

    /* S^T = K_w Q^T and dP^T = V_w dO^T, committed as two groups (their first
     * k-step ignores the accumulators' old values, so these start undefined and
     * are live only inside the iteration) */
    float sT[NTQ][4], pT[NTQ][4];
    oss_wgmma_fence();
    oss_attn_sm90_qk<T, HD, BC, BR>(sT, sKw, cQ);
    oss_wgmma_commit();
    oss_attn_sm90_qk<T, HD, BC, BR>(pT, sVw, cdO);
    oss_wgmma_commit();
    oss_wgmma_wait<1>(); /* S^T done */
    oss_wgmma_fence_operand<NTQ>(sT);

    oss_attn_keep<1, NTQ> keep; /* dropout's kept weights (VAR) */
    if constexpr (VAR) {
      /* dropout: the kept weights drawn while dP^T is computed, then dP^T
       * times Z k, so that dS = P (Z k dP - D) */
      if (a.drop_seed != nullptr)
        oss_attn_dropout_keep<true, 1, NTQ>(keep, a, seed, (int64_t)b * a.hq + h, kw0, i0, lane);
      /* one pass per element, as in the mma.sync kernel: the variants' score,
       * P^T, and dS'^T through the softcap's derivative (so dP^T first) */
      oss_wgmma_wait<0>();
      oss_wgmma_fence_operand<NTQ>(pT);
      if (a.drop_seed != nullptr)
        oss_attn_dropout_apply<1, NTQ>(reinterpret_cast<float(&)[1][NTQ][4]>(pT), keep, a.drop_scale);
      const oss_attn_var_consts vc = oss_attn_var_consts_of(a, b, h);
      oss_attn_var_each<true, 1, NTQ, false>(reinterpret_cast<float(&)[1][NTQ][4]>(sT), a, vc, 0, kw0, i0, lane,
                                             [&](int, int n, int e, float x, float dcap) {
                                               const int c = n * 8 + t2 + (e & 1); /* the query's row */
                                               const float p = oss_ex2(x - cL[c]);
                                               sT[n][e] = p;
                                               pT[n][e] = (p * sc * dcap) * (pT[n][e] - cD[c]);
                                             });
    } else {
      /* P^T (element (key r, query c)); scaled scores masked first, as in the
       * forward, then exp2 against the query's lse */
      const bool need_mask = a.mask_kind != OSS_MASK_NONE || j0 + BC > a.lk ||
                             (a.causal && (int64_t)(j0 + wg * 64 + 63) > (int64_t)i0 + a.causal_off);
#pragma unroll
      for (int n = 0; n < NTQ; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) sT[n][e] *= a.scale_log2;
      if (need_mask)
        oss_attn_mask_tile<T, true, 1, NTQ>(reinterpret_cast<float(&)[1][NTQ][4]>(sT), a,
                                            a.mask_kind ? oss_attn_mask_base(a, b, h) : 0, kw0, i0, lane);
#pragma unroll
      for (int n = 0; n < NTQ; n++) {
        const float2 lv = *reinterpret_cast<const float2 *>(cL + n * 8 + t2);
#pragma unroll
        for (int e = 0; e < 4; e++) sT[n][e] = oss_ex2(sT[n][e] - ((e & 1) ? lv.y : lv.x));
      }
      oss_wgmma_wait<0>(); /* dP^T done */
      oss_wgmma_fence_operand<NTQ>(pT);
#pragma unroll
      for (int n = 0; n < NTQ; n++) {
        const float2 dd = *reinterpret_cast<const float2 *>(cD + n * 8 + t2);
#pragma unroll
        for (int e = 0; e < 4; e++) pT[n][e] = (sT[n][e] * sc) * (pT[n][e] - ((e & 1) ? dd.y : dd.x));
      }
    }
    /* dV += P^T dO and dK += dS'^T Q, P^T and dS'^T packed to 16-bit A fragments
     * (after both are computed, so the float copies and the fragments are not
     * live together) */
    uint32_t pa[1][NTQ / 2][4], dsa[1][NTQ / 2][4];
    oss_acc_to_a<T, 1, NTQ>(reinterpret_cast<float(&)[1][NTQ][4]>(sT), pa);
    oss_acc_to_a<T, 1, NTQ>(reinterpret_cast<float(&)[1][NTQ][4]>(pT), dsa);
    if (VAR && a.drop_seed != nullptr) oss_attn_dropout_apply_a<1, NTQ>(pa, keep); /* P Z, for dV (k at the end) */
    oss_wgmma_fence_operand<NO>(dV);
    oss_wgmma_fence_operand<NO>(dK);
    oss_wgmma_fence();
    oss_attn_sm90_pv<T, HD, BR>(dV, pa[0], cdO);
    oss_attn_sm90_pv<T, HD, BR>(dK, dsa[0], cQ);
    oss_wgmma_commit();

    if (atomic_dq) {
      /* dS'^T rows (keys) kw0 - j0 + g (+8), columns (queries) 16kk + t2 (+1, +8, +9), swizzled */
#pragma unroll
      for (int kk = 0; kk < NTQ / 2; kk++)
#pragma unroll
        for (int f = 0; f < 4; f++) {
          const int r = kw0 - j0 + g + (f & 1) * 8, c = kk * 16 + (f >> 1) * 8 + t2;
          T *p = sdS + (c >> 6) * BC * 64 + r * 64 + ((((c & 63) >> 3) ^ (r & 7)) << 3) + (c & 7);
          *reinterpret_cast<uint32_t *>(p) = dsa[0][kk][f];
        }
      oss_fence_proxy_async();
      oss_bulk_wait_read<0>(); /* the previous dQ block left sdQ */
      __syncthreads();         /* dS'^T of both warpgroups stored; sdQ free */

      float dq[8][4], rs[1][4]; /* rs: the first k-step ignores its old value */
#pragma unroll
      for (int n = 0; n < 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
      oss_wgmma_fence_operand<8>(dq);
      oss_wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BC / 16; kk++)
        oss_wgmma<T, 64>::template ss<1, 1>(
            dq, oss_wgmma_desc(oss_smem_u32(sdS) + (mo >> 6) * BC * 128 + kk * 16 * 128, BC * 128, 1024),
            oss_wgmma_desc(oss_smem_u32(sK) + (no >> 6) * BC * 128 + kk * 16 * 128, BC * 128, 1024), kk > 0);
      /* R = dS' times ones (K-major B; every k-step reads the same ones) */
#pragma unroll
      for (int k = 0; k < RS_STEPS; k++)
        oss_wgmma<T, 8>::template ss<1, 0>(
            rs, oss_wgmma_desc(oss_smem_u32(sdS) + (mo >> 6) * BC * 128 + (rs_k0 + k) * 16 * 128, BC * 128, 1024),
            oss_wgmma_desc(oss_smem_u32(sOnes) + (k & 3) * 32, 16, 1024), k > 0);
      oss_wgmma_commit();
      oss_wgmma_wait<0>();
      oss_wgmma_fence_operand<8>(dq);
      oss_wgmma_fence_operand<1>(rs);
      if (a.eacc != nullptr && (lane & 3) == 0) {
        float *e = a.eacc + oss_attn_ws_row(a, b, h) + i0;
#pragma unroll
        for (int hi = 0; hi < 2; hi++) {
          const int r = mo + (warp & 3) * 16 + g + hi * 8;
          if (i0 + r < a.lq) atomicAdd(e + r, rs[0][2 * hi]);
        }
      }
      /* stage the piece in sdQ; the next barrier publishes it and the bulk reductions follow */
#pragma unroll
      for (int hi = 0; hi < 2; hi++) {
        float *row = sdQ + (mo + (warp & 3) * 16 + g + hi * 8) * oss_attn_bwd_sm90_dq_pitch<HD>() + no + t2;
#pragma unroll
        for (int n = 0; n < 8; n++) *reinterpret_cast<float2 *>(row + n * 8) = make_float2(dq[n][2 * hi], dq[n][2 * hi + 1]);
      }
      oss_fence_proxy_async();
      dq_pending = a.dq_acc + (oss_attn_ws_row(a, b, h) + i0) * a.dq_ld;
      dq_pending_rows = min(BR, a.lq - i0);
    } else {
      oss_wgmma_wait<0>();
    }
    oss_wgmma_fence_operand<NO>(dV);
    oss_wgmma_fence_operand<NO>(dK);
  }

  if (dq_pending != nullptr) { /* the last dQ block */
    __syncthreads();
    oss_attn_bwd_sm90_flush_dq<HD, BR>(dq_pending, a.dq_ld, sdQ, dq_pending_rows, tid);
  }
  oss_bulk_wait<0>();

  /* dK and dV (times dropout's k) for rows < Lk, columns < D / Dv */
  T *gdK = (T *)a.dk + b * a.dk_s[0] + hk * a.dk_s[1];
  T *gdV = (T *)a.dv_ptr + b * a.dv_s[0] + hk * a.dv_s[1];
  const bool vdk = a.vec & OSS_ATTN_VEC_DK, vdv = a.vec & OSS_ATTN_VEC_DV;
  const float dv_scale = VAR && a.drop_seed != nullptr ? a.drop_scale : 1.f;
#pragma unroll
  for (int hi = 0; hi < 2; hi++) {
    const int r = kw0 + g + hi * 8;
    if (r < a.lk) {
      T *rk = gdK + (int64_t)r * a.dk_s[2];
      T *rv = gdV + (int64_t)r * a.dv_s[2];
#pragma unroll
      for (int n = 0; n < NO; n++) {
        oss_store_pair<T>(rk, n * 8 + t2, a.d, dK[n][2 * hi], dK[n][2 * hi + 1], vdk);
        oss_store_pair<T>(rv, n * 8 + t2, a.dv, dV[n][2 * hi] * dv_scale, dV[n][2 * hi + 1] * dv_scale, vdv);
      }
    }
  }
#else
  __trap(); /* not built for sm_90a: never in the dispatch table */
#endif
}

/* dq_det: the deterministic mode's dQ pass, the mma.sync kernel's (its own
 * generated file's launcher, oss_attn_bwd_dq_det_launch). */
template <typename T, int HD, bool VAR>
oss_status oss_attn_bwd_sm90_run(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev,
                                 oss_attn_launch_fn dq_det) {
  typedef oss_attn_bwd_sm90_cfg<HD> C;
  if (a->lk > 0) {
    const oss_status st = oss_attn_launch(
        oss_attn_bwd_sm90_kernel<T, HD, C::BR, C::BC, VAR>,
        VAR ? "attention backward with score variants (wgmma)" : "attention backward (wgmma)", HD,
        oss_attn_bwd_sm90_smem_bytes<HD, C::BR, C::BC>(),
        oss_attn_key_grid(a, C::BC), 256, a, stream, dev);
    if (st != OSS_OK) return st;
  }
  return dq_det(a, stream, dev);
}

/* Entry points instantiated once per (head dim, dtype) by the generator: the
 * plain kernel, and the one with the score variants (calls that also carry a
 * mask tensor run mma_var, the mma.sync backward with the variants, which
 * reads it). The mma.sync launchers come from their own generated files, so
 * these files do not compile those kernels again. */
template <typename T, int HD>
oss_status oss_attn_bwd_sm90_launch(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev,
                                    oss_attn_launch_fn dq_det) {
  return oss_attn_bwd_sm90_run<T, HD, false>(a, stream, dev, dq_det);
}
template <typename T, int HD>
oss_status oss_attn_bwd_sm90_var_launch(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev,
                                        oss_attn_launch_fn dq_det_var, oss_attn_launch_fn mma_var) {
  if (a->mask_kind != OSS_MASK_NONE) return mma_var(a, stream, dev);
  return oss_attn_bwd_sm90_run<T, HD, true>(a, stream, dev, dq_det_var);
}

#endif /* OSS_ATTENTION_BWD_SM90_CUH */
