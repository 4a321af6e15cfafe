/*
 * attention_fwd_sm90.cuh - the attention forward on Hopper's warpgroup tensor
 * cores (wgmma, sm_90a; float16 and bfloat16, head dims 64 and 128): the same
 * result as attention_fwd.cuh (out = softmax(scale Q K^T + mask) V, lse per
 * query row), computed with m64nNk16 wgmma instead of warp-level mma.sync.
 *
 * One CTA owns BR = 64 NWG query rows of one (batch, query head) and streams
 * the keys of its kv head (h / group) in tiles of BC:
 *   - NWG warpgroups of 4 warps; warpgroup w owns query rows [64w, 64w + 64)
 *     of the tile, warp k of it rows 16k .. 16k + 15 (the wgmma accumulator
 *     layout), and runs its own online softmax on its S = Q K^T accumulators.
 *   - shared memory, in the 128-byte-swizzled layout wgmma reads (see
 *     oss_load_tile's SW128): Q (BR x HD) and two stages of K and V tiles
 *     (BC x HD each), filled by cp.async from every thread, 16 bytes each.
 *   - per key tile j: wait K_j, barrier, issue the loads of K_{j+1}, V_{j+1}
 *     into the other stage; S = Q K_j^T (wgmma, A = Q and B = K from shared
 *     memory, K-major); mask and online softmax in registers (shared with the
 *     mma.sync kernel); P packed to 16-bit A fragments in registers; wait V_j,
 *     barrier; O += P V_j (wgmma, A = P from registers, B = V from shared
 *     memory, MN-major).
 *   - causal: key tiles past the diagonal are not loaded, and a warpgroup
 *     whose rows see none of a tile skips its products.
 * Limits: head dims (D and Dv) up to HD, zero padded; HD a multiple of 64;
 * built only for sm_90a (the launcher is in the dispatch table only when the
 * build includes that target; elsewhere the kernel body traps).
 */
#ifndef OSS_ATTENTION_FWD_SM90_CUH
#define OSS_ATTENTION_FWD_SM90_CUH

#include "attention_fwd.cuh"
#include "wgmma_ops.cuh"

template <int HD> struct oss_attn_fwd_sm90_cfg {
  static constexpr int NWG = 2;  /* warpgroups: 128 query rows per CTA */
  static constexpr int BC = 128; /* keys per tile */
};

template <int HD, int BR, int BC> __host__ __device__ constexpr size_t oss_attn_fwd_sm90_smem_bytes() {
  return (size_t)(BR + 4 * BC) * HD * 2 + 1024; /* + room to align the tiles to 1024 bytes */
}

/* Shared-memory matrix descriptor of a 128-byte-swizzled operand (PTX ISA,
 * "matrix descriptor"): start address, leading and stride byte offsets, all in
 * 16-byte units; layout type 1 = 128-byte swizzle. */
__device__ __forceinline__ uint64_t oss_wgmma_desc(uint32_t addr, uint32_t lead_bytes, uint32_t stride_bytes) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lead_bytes & 0x3FFFF) >> 4) << 16) |
         ((uint64_t)((stride_bytes & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void oss_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void oss_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void oss_wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
/* Makes writes of ordinary (generic-proxy) shared-memory stores, cp.async
 * included, visible to the tensor cores' reads after the next barrier. */
__device__ __forceinline__ void oss_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* Ties accumulator registers to this point of the program, so that the
 * compiler neither reads them before the wgmma.wait that completes them nor
 * moves their last writes past the wgmma that reads them. */
template <int N> __device__ __forceinline__ void oss_wgmma_fence_operand(float (&d)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[n][e])::"memory");
}

template <typename T, int HD, int BC, int NWG>
__global__ void __launch_bounds__(NWG * 128, 1) oss_attn_fwd_sm90_kernel(const oss_attn_args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BR = 64 * NWG, NT = BC / 8, NO = HD / 8, NTHREADS = NWG * 128;
  static_assert(HD % 64 == 0 && BC % 16 == 0, "head dim a multiple of 64, key tile of 16");
  constexpr uint32_t Q_BLOCK = BR * 128, KV_BLOCK = BC * 128; /* bytes of one column block */

  extern __shared__ __align__(1024) unsigned char oss_smem[];
  T *sQ = reinterpret_cast<T *>(oss_smem + ((1024u - (oss_smem_u32(oss_smem) & 1023u)) & 1023u));
  T *sK = sQ + BR * HD;
  T *sV = sK + 2 * BC * HD;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const int64_t bh = blockIdx.y + (int64_t)gridDim.y * blockIdx.z;
  if (bh >= (int64_t)a.batch * a.hq) return;
  const int b = (int)(bh / a.hq), h = (int)(bh % a.hq), hk = h / a.group;
  const int qb = a.causal ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x; /* heavy blocks first */
  const int i0 = qb * BR;
  const int rows = min(BR, a.lq - i0);
  const int wrow = wg * 64 + (warp & 3) * 16; /* this warp's first row in the tile */

  int n_end = a.lk;
  if (a.causal) {
    const int64_t lim = (int64_t)(i0 + rows) + a.causal_off;
    n_end = (int)(lim < 0 ? 0 : (lim < a.lk ? lim : a.lk));
  }
  const int ntiles = (n_end + BC - 1) / BC;

  const T *gQ = (const T *)a.q + b * a.q_s[0] + h * a.q_s[1] + (int64_t)i0 * a.q_s[2];
  const T *gK = (const T *)a.k + b * a.k_s[0] + hk * a.k_s[1];
  const T *gV = (const T *)a.v + b * a.v_s[0] + hk * a.v_s[1];
  const bool vq = a.vec & OSS_ATTN_VEC_Q, vk = a.vec & OSS_ATTN_VEC_K, vv = a.vec & OSS_ATTN_VEC_V;
  const int64_t mbase = a.mask_kind ? oss_attn_mask_base(a, b, h) : 0;

  float o[1][NO][4], s[1][NT][4];
  float m[1][2] = {{-INFINITY, -INFINITY}}, l[1][2] = {{0.f, 0.f}};
#pragma unroll
  for (int n = 0; n < NO; n++) o[0][n][0] = o[0][n][1] = o[0][n][2] = o[0][n][3] = 0.f;
#pragma unroll
  for (int n = 0; n < NT; n++) s[0][n][0] = s[0][n][1] = s[0][n][2] = s[0][n][3] = 0.f;

  if (ntiles > 0) {
    oss_load_tile<T, BR, HD, 64, NTHREADS, true>(sQ, gQ, a.q_s[2], rows, a.d, vq, tid);
    oss_load_tile<T, BC, HD, 64, NTHREADS, true>(sK, gK, a.k_s[2], min(BC, a.lk), a.d, vk, tid);
    oss_cp_async_commit();
    oss_load_tile<T, BC, HD, 64, NTHREADS, true>(sV, gV, a.v_s[2], min(BC, a.lk), a.dv, vv, tid);
    oss_cp_async_commit();
  }

  const uint32_t sQa = oss_smem_u32(sQ) + wg * 64 * 128; /* this warpgroup's 64 rows */

#pragma unroll 1
  for (int j = 0; j < ntiles; j++) {
    const int j0 = j * BC;
    const int st = j & 1;
    oss_cp_async_wait<1>(); /* K_j (and Q) landed; V_j may still be in flight */
    oss_fence_proxy_async();
    __syncthreads(); /* ... for every thread; and stage st^1 is free again */
    if (j + 1 < ntiles) {
      const int jn = j0 + BC;
      oss_load_tile<T, BC, HD, 64, NTHREADS, true>(sK + (st ^ 1) * BC * HD, gK + (int64_t)jn * a.k_s[2],
                                                   a.k_s[2], min(BC, a.lk - jn), a.d, vk, tid);
      oss_cp_async_commit();
      oss_load_tile<T, BC, HD, 64, NTHREADS, true>(sV + (st ^ 1) * BC * HD, gV + (int64_t)jn * a.v_s[2],
                                                   a.v_s[2], min(BC, a.lk - jn), a.dv, vv, tid);
      oss_cp_async_commit();
    } else {
      oss_cp_async_commit();
      oss_cp_async_commit();
    }

    /* keys of this tile visible to some row of this warpgroup (uniform over it) */
    const bool wg_live = !a.causal || (int64_t)j0 <= (int64_t)(i0 + wg * 64 + 63) + a.causal_off;
    uint32_t pa[1][BC / 16][4];
    if (wg_live) {
      const uint32_t sKa = oss_smem_u32(sK + st * BC * HD);
      oss_wgmma_fence_operand<NT>(s[0]);
      oss_wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < HD / 16; kk++) /* k-step kk: column block kk / 4, 32 bytes per step inside it */
        oss_wgmma<T, BC>::template ss<0, 0>(s[0],
                                           oss_wgmma_desc(sQa + (kk >> 2) * Q_BLOCK + (kk & 3) * 32, 16, 1024),
                                           oss_wgmma_desc(sKa + (kk >> 2) * KV_BLOCK + (kk & 3) * 32, 16, 1024),
                                           kk > 0);
      oss_wgmma_commit();
      oss_wgmma_wait_all();
      oss_wgmma_fence_operand<NT>(s[0]);

      const float c = oss_attn_fwd_mask_scores<T, 1, NT>(s, a, mbase, i0 + wrow, j0, lane);
      oss_attn_online_softmax<1, NT, NO>(s, o, m, l, c);
      oss_acc_to_a<T, 1, NT>(s, pa);
    }

    oss_cp_async_wait<2>(); /* V_j landed (K_{j+1}, V_{j+1} may be in flight) */
    oss_fence_proxy_async();
    __syncthreads();
    if (wg_live) {
      /* B = V_j, MN-major: 16 keys (two 8-row groups, 1024 bytes apart) per
       * k-step; the 64-column blocks of the head dim are KV_BLOCK apart. */
      const uint32_t sVa = oss_smem_u32(sV + st * BC * HD);
      oss_wgmma_fence_operand<NO>(o[0]);
      oss_wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BC / 16; kk++)
        oss_wgmma<T, HD>::template rs<1>(o[0], pa[0][kk], oss_wgmma_desc(sVa + kk * 16 * 128, KV_BLOCK, 1024), 1);
      oss_wgmma_commit();
      oss_wgmma_wait_all();
      oss_wgmma_fence_operand<NO>(o[0]);
    }
  }

  oss_attn_fwd_write<T, 1, NO>(a, o, m, l, b, h, bh, i0 + wrow, lane);
#else
  __trap(); /* not built for sm_90a: never in the dispatch table */
#endif
}

template <typename T, int HD>
oss_status oss_attn_fwd_sm90_launch(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev) {
  typedef oss_attn_fwd_sm90_cfg<HD> C;
  constexpr int BR = 64 * C::NWG;
  constexpr size_t smem = oss_attn_fwd_sm90_smem_bytes<HD, BR, C::BC>();
  if (smem > (size_t)dev->max_smem_per_block_optin)
    return oss_fail(OSS_ERROR_NOT_SUPPORTED,
                    "attention forward (sm90) for head dim %d needs %zu bytes of shared memory per block, the "
                    "device allows %d",
                    HD, smem, dev->max_smem_per_block_optin);
  void (*kernel)(const oss_attn_args) = oss_attn_fwd_sm90_kernel<T, HD, C::BC, C::NWG>;
  OSS_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  const dim3 grid = oss_attn_grid((a->lq + BR - 1) / BR, (int64_t)a->batch * a->hq);
  kernel<<<grid, C::NWG * 128, smem, stream>>>(*a);
  return oss_check_launch("oss_attn_fwd_sm90_kernel");
}

#endif /* OSS_ATTENTION_FWD_SM90_CUH */
