/*
 * attention_fwd_sm90.cuh - the attention forward on Hopper's warpgroup tensor
 * cores (wgmma, sm_90a; float16 and bfloat16, head dims 64 and 128): the same
 * result as attention_fwd.cuh (out = softmax(scale Q K^T + mask) V, lse per
 * query row), computed with m64nNk16 wgmma instead of warp-level mma.sync.
 *
 * One CTA owns BR = 64 NWG query rows of one (batch, query head) and streams
 * the keys of its kv head (h / group) in tiles of BC, warp-specialised:
 *   - a producer warpgroup (few registers, setmaxnreg) copies Q, then K_j and
 *     V_j into stage j % 2 with 16-byte cp.async, in the 128-byte-swizzled
 *     layout wgmma reads (oss_load_tile's SW128); each copy completes on the
 *     stage's "full" mbarrier, and a stage is refilled only after every
 *     consumer thread arrived on its "empty" mbarrier.
 *   - NWG consumer warpgroups (more registers); warpgroup w owns query rows
 *     [64w, 64w + 64) of the tile, warp k of it rows 16k .. 16k + 15 (the wgmma
 *     accumulator layout). Per tile: wait K_j, S = Q K_j^T (wgmma, A = Q and
 *     B = K from shared memory, K-major), release K_j; mask and online softmax
 *     in registers (shared with the mma.sync kernel), P packed to 16-bit A
 *     fragments; wait V_j, O += P V_j (A = P from registers, B = V MN-major),
 *     release V_j. No CTA-wide barrier after setup, so the two warpgroups
 *     drift apart and one's softmax overlaps the other's products.
 *   - causal: key tiles past the diagonal are not loaded, and a warpgroup
 *     whose rows see none of a tile skips its products.
 * Limits: head dims (D and Dv) up to HD, zero padded; HD a multiple of 64
 * (64 and 128 are compiled: S and O accumulators of 256 need more registers);
 * built only for sm_90a (the launcher is in the dispatch table only when the
 * build includes that target; elsewhere the kernel body traps).
 */
#ifndef OSS_ATTENTION_FWD_SM90_CUH
#define OSS_ATTENTION_FWD_SM90_CUH

#include "cuda/attention/mma/attention_fwd.cuh"
#include "cuda/attention/sm90/attention_sm90.cuh"

template <int HD> struct oss_attn_fwd_sm90_cfg {
  static constexpr int NWG = 2;  /* consumer warpgroups: 128 query rows per CTA */
  static constexpr int BC = 128; /* keys per tile */
};

/* Registers per thread after setmaxnreg. A CTA keeps the registers it was
 * launched with (the 168 per thread that ptxas allots for 384 threads), so the
 * producer's and consumers' budgets must fit in them, or the consumers' request
 * waits forever. */
enum { OSS_SM90_PRODUCER_REGS = 72, OSS_SM90_CONSUMER_REGS = 216, OSS_SM90_LAUNCH_REGS = 168 };
static_assert(128 * OSS_SM90_PRODUCER_REGS + 256 * OSS_SM90_CONSUMER_REGS <= 384 * OSS_SM90_LAUNCH_REGS,
              "register budgets exceed the CTA's launch allocation");

template <int HD, int BR, int BC> __host__ __device__ constexpr size_t oss_attn_fwd_sm90_smem_bytes() {
  return (size_t)(BR + 4 * BC) * HD * 2 + 1024; /* + room to align the tiles to 1024 bytes */
}

/* Mask, online softmax and packing of P into A fragments for one tile. */
template <typename T, int NT, int NO>
__device__ __forceinline__ void oss_attn_sm90_softmax(float (&s)[1][NT][4], float (&o)[1][NO][4], float (&m)[1][2],
                                                      float (&l)[1][2], float (&lr)[1][2],
                                                      uint32_t (&pa)[1][NT / 2][4],
                                                      const oss_attn_args &a, int64_t mbase, int r0, int j0,
                                                      int lane) {
  const float c = oss_attn_fwd_mask_scores<T, 1, NT>(s, a, mbase, r0, j0, lane);
  oss_attn_online_softmax<T, 1, NT, NO>(s, o, m, l, lr, c, pa);
}

template <typename T, int HD, int BC, int NWG>
__global__ void __launch_bounds__(NWG * 128 + 128, 1) oss_attn_fwd_sm90_kernel(const oss_attn_args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BR = 64 * NWG, NT = BC / 8, NO = HD / 8, NCONSUMER = NWG * 128;
  static_assert(HD % 64 == 0 && BC % 16 == 0, "head dim a multiple of 64, key tile of 16");
  static_assert(NWG == 2, "the register budgets assume two consumer warpgroups");

  extern __shared__ __align__(1024) unsigned char oss_sm90_smem[];
  T *sQ = reinterpret_cast<T *>(oss_sm90_smem + ((1024u - (oss_smem_u32(oss_sm90_smem) & 1023u)) & 1023u));
  T *sK = sQ + BR * HD;
  T *sV = sK + 2 * BC * HD;

  /* barriers: full[stage] (the producer's copies landed), empty[stage] (every
   * consumer thread is done reading it), for K (0, 1) and V (2, 3) */
  __shared__ __align__(8) uint64_t full_bar[4], empty_bar[4];

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  oss_attn_query_block qblk;
  if (!oss_attn_query_block_of<BR, BC>(a, &qblk)) return;
  const int64_t bh = qblk.bh;
  const int b = qblk.b, h = qblk.h, hk = qblk.hk, i0 = qblk.i0, rows = qblk.rows, ntiles = qblk.ntiles;

  if (tid == 0) {
    for (int i = 0; i < 4; i++) {
      oss_mbar_init(&full_bar[i], 128);        /* the producer warpgroup's threads (cp.async arrivals) */
      oss_mbar_init(&empty_bar[i], NCONSUMER); /* every consumer thread */
    }
  }
  __syncthreads(); /* the only CTA-wide barrier */

  if (wg == NWG) {
    /* producer warpgroup (few registers): Q with K_0, then K_j and V_j into stage j % 2 once the
     * consumers released its previous use (tile j - 2) */
    const T *gQ = (const T *)a.q + b * a.q_s[0] + h * a.q_s[1] + (int64_t)i0 * a.q_s[2];
    const T *gK = (const T *)a.k + b * a.k_s[0] + hk * a.k_s[1];
    const T *gV = (const T *)a.v + b * a.v_s[0] + hk * a.v_s[1];
    const bool vq = a.vec & OSS_ATTN_VEC_Q, vk = a.vec & OSS_ATTN_VEC_K, vv = a.vec & OSS_ATTN_VEC_V;
    const int ptid = tid - NCONSUMER;
    oss_setmaxnreg_dec<OSS_SM90_PRODUCER_REGS>();
    if (ntiles > 0) oss_load_tile<T, BR, HD, 64, 128, true>(sQ, gQ, a.q_s[2], rows, a.d, vq, ptid);
#pragma unroll 1
    for (int j = 0; j < ntiles; j++) {
      const int st = j & 1, use = j >> 1, j0 = j * BC;
      if (use > 0) oss_mbar_wait(&empty_bar[st], (use - 1) & 1);
      oss_load_tile<T, BC, HD, 64, 128, true>(sK + st * BC * HD, gK + (int64_t)j0 * a.k_s[2], a.k_s[2],
                                              min(BC, a.lk - j0), a.d, vk, ptid);
      oss_fence_proxy_async(); /* the element-load path's plain stores */
      oss_cp_async_arrive(&full_bar[st]);
      if (use > 0) oss_mbar_wait(&empty_bar[2 + st], (use - 1) & 1);
      oss_load_tile<T, BC, HD, 64, 128, true>(sV + st * BC * HD, gV + (int64_t)j0 * a.v_s[2], a.v_s[2],
                                              min(BC, a.lk - j0), a.dv, vv, ptid);
      oss_fence_proxy_async();
      oss_cp_async_arrive(&full_bar[2 + st]);
    }
    oss_cp_async_wait<0>();
  } else {
  /* consumer warpgroups */
  oss_setmaxnreg_inc<OSS_SM90_CONSUMER_REGS>();
  const int wrow = wg * 64 + (warp & 3) * 16; /* this warp's first row in the tile */
  const int64_t mbase = a.mask_kind ? oss_attn_mask_base(a, b, h) : 0;
  float o[1][NO][4], s[1][NT][4];
  float m[1][2] = {{-INFINITY, -INFINITY}}, l[1][2] = {{0.f, 0.f}}, lr[1][2] = {{0.f, 0.f}};
#pragma unroll
  for (int n = 0; n < NO; n++) o[0][n][0] = o[0][n][1] = o[0][n][2] = o[0][n][3] = 0.f;
#pragma unroll
  for (int n = 0; n < NT; n++) s[0][n][0] = s[0][n][1] = s[0][n][2] = s[0][n][3] = 0.f;
  const uint32_t sQa = oss_smem_u32(sQ) + wg * 64 * 128; /* this warpgroup's 64 rows */
  uint32_t pa[1][BC / 16][4];

#pragma unroll 1
  for (int j = 0; j < ntiles; j++) {
    const int st = j & 1, par = (j >> 1) & 1, j0 = j * BC;
    /* keys of this tile visible to some row of this warpgroup (uniform over it) */
    const bool live = !a.causal || (int64_t)j0 <= (int64_t)(i0 + wg * 64 + 63) + a.causal_off;
    oss_mbar_wait(&full_bar[st], par); /* K_j (and Q) landed */
    oss_fence_proxy_async();
    if (live) {
      oss_wgmma_fence_operand<NT>(s[0]);
      oss_wgmma_fence();
      oss_attn_sm90_qk<T, HD, BR, BC>(s[0], sQa, oss_smem_u32(sK + st * BC * HD));
      oss_wgmma_commit();
      oss_wgmma_wait<0>();
      oss_wgmma_fence_operand<NT>(s[0]);
    }
    oss_mbar_arrive(&empty_bar[st]);
    if (live) oss_attn_sm90_softmax<T, NT, NO>(s, o, m, l, lr, pa, a, mbase, i0 + wrow, j0, lane);
    oss_mbar_wait(&full_bar[2 + st], par); /* V_j landed */
    oss_fence_proxy_async();
    if (live) {
      oss_wgmma_fence_operand<NO>(o[0]);
      oss_wgmma_fence();
      oss_attn_sm90_pv<T, HD, BC>(o[0], pa[0], oss_smem_u32(sV + st * BC * HD));
      oss_wgmma_commit();
      oss_wgmma_wait<0>();
      oss_wgmma_fence_operand<NO>(o[0]);
    }
    oss_mbar_arrive(&empty_bar[2 + st]);
  }

  oss_attn_fwd_write<T, 1, NO>(a, o, m, l, lr, b, h, bh, i0 + wrow, lane);
  }
#else
  __trap(); /* not built for sm_90a: never in the dispatch table */
#endif
}

template <typename T, int HD>
oss_status oss_attn_fwd_sm90_launch(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev) {
  typedef oss_attn_fwd_sm90_cfg<HD> C;
  constexpr int BR = 64 * C::NWG;
  void (*kernel)(const oss_attn_args) = oss_attn_fwd_sm90_kernel<T, HD, C::BC, C::NWG>;
  /* The budgets of setmaxnreg hold only if the kernel launches with the
   * registers assumed above; a compiler that allots fewer would make the
   * consumers wait forever, so then the mma.sync kernel runs instead. */
  static int launch_regs = -1;
  if (launch_regs < 0) {
    cudaFuncAttributes attr;
    OSS_CUDA_TRY(cudaFuncGetAttributes(&attr, kernel));
    launch_regs = attr.numRegs;
  }
  if (launch_regs < OSS_SM90_LAUNCH_REGS) return oss_attn_fwd_mma_launch<T, HD>(a, stream, dev);
  return oss_attn_launch(kernel, "attention forward (wgmma)", HD, oss_attn_fwd_sm90_smem_bytes<HD, BR, C::BC>(),
                         oss_attn_grid((a->lq + BR - 1) / BR, (int64_t)a->batch * a->hq), C::NWG * 128 + 128, a,
                         stream, dev);
}

#endif /* OSS_ATTENTION_FWD_SM90_CUH */
