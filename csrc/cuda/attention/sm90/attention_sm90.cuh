/*
 * attention_sm90.cuh - building blocks of the Hopper (sm_90a) attention
 * kernels (attention_fwd_sm90.cuh, attention_bwd_sm90.cuh): wgmma shared-memory
 * descriptors for 128-byte-swizzled tiles (oss_load_tile's SW128 layout, which
 * is also the bulk tensor copy's 128-byte swizzle of 64-column boxes), wgmma
 * fences, commits and waits, proxy fences, mbarriers, bulk tensor copies,
 * named barriers, setmaxnreg, and the
 * two tile products every kernel issues (S = A B^T from shared memory,
 * O += P V with P in registers). Compiled only for sm_90a (uses sit inside
 * __CUDA_ARCH_FEAT_SM90_ALL).
 */
#ifndef OSS_ATTENTION_SM90_CUH
#define OSS_ATTENTION_SM90_CUH

#include "cuda/attention/mma/attention_mma.cuh"
#include "cuda/attention/sm90/wgmma_ops.cuh"

/* Shared-memory matrix descriptor of a 128-byte-swizzled operand (PTX ISA,
 * "matrix descriptor"): start address, leading and stride byte offsets, all in
 * 16-byte units; layout type 1 = 128-byte swizzle. */
__device__ __forceinline__ uint64_t oss_wgmma_desc(uint32_t addr, uint32_t lead_bytes, uint32_t stride_bytes) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lead_bytes & 0x3FFFF) >> 4) << 16) |
         ((uint64_t)((stride_bytes & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}

/* The same descriptor, formed where it is used: the compiler may not hoist it
 * (or the per-k-step descriptors derived from it by adding offsets, which
 * stay inside the 14-bit address field) out of a loop, where each would hold
 * two registers for the whole loop. */
__device__ __forceinline__ uint64_t oss_wgmma_desc_here(uint32_t addr, uint32_t lead_bytes, uint32_t stride_bytes) {
  uint32_t here;
  asm volatile("mov.b32 %0, %1;\n" : "=r"(here) : "r"(addr));
  return oss_wgmma_desc(here, lead_bytes, stride_bytes);
}

__device__ __forceinline__ void oss_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void oss_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
/* Waits until at most N of this warpgroup's committed wgmma groups are pending. */
template <int N> __device__ __forceinline__ void oss_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Makes writes of ordinary (generic-proxy) shared-memory stores, cp.async
 * included, visible to the tensor cores' reads after the next barrier. */
__device__ __forceinline__ void oss_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* Bulk reduction (PTX ISA, "cp.reduce.async.bulk"): adds `bytes` (a multiple of
 * 16) of float32 from shared memory into global memory in L2, asynchronously;
 * both addresses 16-byte aligned. Completion is tracked per thread in bulk
 * groups: wait_read<N> returns once the shared memory of all but the last N
 * groups was read (it may then be rewritten), wait<N> once they completed. */
__device__ __forceinline__ void oss_bulk_reduce_add_f32(float *dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void oss_bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void oss_bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void oss_bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

/* mbarriers beyond common.cuh's init, wait and expect_tx. */
__device__ __forceinline__ void oss_mbar_arrive(uint64_t *bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(oss_smem_u32(bar))
               : "memory");
}
/* Arrives on bar once all of this thread's earlier cp.async copies landed. */
__device__ __forceinline__ void oss_cp_async_arrive(uint64_t *bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(oss_smem_u32(bar)) : "memory");
}

/* Bulk tensor copy (PTX ISA, "cp.async.bulk.tensor"): the box of the 4-D
 * tensor map at coordinates {c0, c1, c2, c3} (innermost first) lands in shared
 * memory at dst in the map's swizzled layout, out-of-bounds elements as zeros,
 * and completes its bytes on bar. map is a kernel parameter (__grid_constant__). */
__device__ __forceinline__ void oss_tma_load_4d(uint32_t dst, const void *map, uint64_t *bar, int c0, int c1, int c2,
                                                int c3) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
               "%3, %4, %5}], [%6];\n" ::"r"(dst),
               "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(oss_smem_u32(bar))
               : "memory");
}
__device__ __forceinline__ void oss_tma_prefetch_map(const void *map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

/* Named barriers (ids 1..15; 0 is __syncthreads): sync waits until `count`
 * threads reached the barrier, counting those that only arrive. */
__device__ __forceinline__ void oss_named_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void oss_named_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

/* Register budget per thread of the executing warpgroup (sm_90a): the
 * producer gives registers back, the consumers take them. */
template <int N> __device__ __forceinline__ void oss_setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void oss_setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

/* Ties accumulator registers to this point of the program, so that the
 * compiler neither reads them before the wgmma.wait that completes them nor
 * moves their last writes past the wgmma that reads them. */
template <int N> __device__ __forceinline__ void oss_wgmma_fence_operand(float (&d)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[n][e])::"memory");
}
/* The same for A fragments in registers: an RS wgmma reads them
 * asynchronously, so they must stay in their registers, unchanged, until the
 * wgmma.wait that completes it (fence after that wait). */
template <int N> __device__ __forceinline__ void oss_wgmma_fence_operand(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) asm volatile("" : "+r"(a[n][e])::"memory");
}

/* Issues S = A B^T for one warpgroup (64 rows of A x NB rows of B, summed over
 * HD columns; no commit), both operands K-major 128-byte-swizzled tiles of HD
 * columns stored as 64-column blocks (of MA and NB rows): k-step kk reads
 * column block kk / 4 at 32 bytes per step inside it. sAa points at the
 * warpgroup's first row of A. Forward: S = Q K^T; backward: S^T = K Q^T and
 * dP^T = V dO^T. */
template <typename T, int HD, int MA, int NB>
__device__ __forceinline__ void oss_attn_sm90_qk(float (&s)[NB / 8][4], uint32_t sAa, uint32_t sBa) {
  const uint64_t da = oss_wgmma_desc_here(sAa, 16, 1024), db = oss_wgmma_desc_here(sBa, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < HD / 16; kk++)
    oss_wgmma<T, NB>::template ss<0, 0>(s, da + (((kk >> 2) * (MA * 128) + (kk & 3) * 32) >> 4),
                                        db + (((kk >> 2) * (NB * 128) + (kk & 3) * 32) >> 4), kk > 0);
}

/* Issues O += P V for one warpgroup (no commit): A = P from registers (one
 * mma.sync A fragment per 16 of the KR summed rows), B = V, a KR x HD tile read
 * MN-major: 16 rows (two 8-row groups, 1024 bytes apart) per k-step, the
 * 64-column blocks KR * 128 bytes apart. Forward: O += P V; backward:
 * dV += P^T dO and dK += dS^T Q. */
template <typename T, int HD, int KR>
__device__ __forceinline__ void oss_attn_sm90_pv(float (&o)[HD / 8][4], const uint32_t (&pa)[KR / 16][4],
                                                 uint32_t sVa) {
  const uint64_t dv = oss_wgmma_desc_here(sVa, KR * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < KR / 16; kk++) oss_wgmma<T, HD>::template rs<1>(o, pa[kk], dv + ((kk * 16 * 128) >> 4), 1);
}

#endif /* OSS_ATTENTION_SM90_CUH */
