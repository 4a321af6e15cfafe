/*
 * attention_sm90.cuh - building blocks of the Hopper (sm_90a) attention
 * kernels (attention_fwd_sm90.cuh, attention_bwd_sm90.cuh): wgmma shared-memory
 * descriptors for 128-byte-swizzled tiles (oss_load_tile's SW128 layout, which
 * is also the bulk tensor copy's 128-byte swizzle of 64-column boxes), wgmma
 * fences, commits and waits, proxy fences, mbarriers, bulk tensor copies,
 * named barriers, setmaxnreg and the warp-specialised kernels' register
 * budgets, the two tile products every kernel issues (S = A B^T from shared
 * memory, O += P V with P in registers), zeroing a landed tile's rows,
 * storing a warpgroup's accumulator rows through shared memory, and on the
 * host the tensor maps of the bulk tensor copies. Device code is compiled
 * only for sm_90a (uses sit inside __CUDA_ARCH_FEAT_SM90_ALL).
 */
#ifndef OSS_ATTENTION_SM90_CUH
#define OSS_ATTENTION_SM90_CUH

#include <cuda.h>

#include "cuda/attention/mma/attention_mma.cuh"
#include "cuda/attention/sm90/wgmma_ops.cuh"

/* Shared-memory matrix descriptor of a 128-byte-swizzled operand (PTX ISA,
 * "matrix descriptor"): start address, leading and stride byte offsets, all in
 * 16-byte units; layout type 1 = 128-byte swizzle. Built as its two 32-bit
 * words: the low one (start, leading offset), the high one (stride, layout),
 * joined where wgmma takes it. The k-steps of a product move only the
 * start address, which stays inside its 14-bit field of the low word, so they
 * add to that word alone (a 64-bit add costs a carry and a move per operand
 * and k-step); the high word (stride, swizzle) is a constant. */
__device__ __forceinline__ uint32_t oss_wgmma_desc_lo(uint32_t addr, uint32_t lead_bytes) {
  return ((addr & 0x3FFFF) >> 4) | (((lead_bytes & 0x3FFFF) >> 4) << 16);
}
__host__ __device__ constexpr uint32_t oss_wgmma_desc_hi(uint32_t stride_bytes) {
  return ((stride_bytes & 0x3FFFF) >> 4) | (1u << 30);
}
__device__ __forceinline__ uint64_t oss_wgmma_desc_join(uint32_t lo, uint32_t hi) { return (uint64_t)hi << 32 | lo; }

/* The low word, formed where it is used: the compiler may not hoist it (or the
 * per-k-step words derived from it) out of a loop, where each would hold a
 * register for the whole loop. */
__device__ __forceinline__ uint32_t oss_wgmma_desc_lo_here(uint32_t addr, uint32_t lead_bytes) {
  uint32_t here;
  asm volatile("mov.b32 %0, %1;\n" : "=r"(here) : "r"(addr));
  return oss_wgmma_desc_lo(here, lead_bytes);
}

/* The thread's warpgroup, broadcast from lane 0 so that the compiler knows it
 * is the same across the warp: what derives from it (the shared-memory
 * descriptors) is then formed in uniform registers, which wgmma reads, instead
 * of in per-thread registers converted at every k-step. */
__device__ __forceinline__ int oss_warpgroup() { return __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0); }

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
/* Counters between CTAs: an acquiring load and a releasing add at GPU scope;
 * the proxy fence orders the generic accesses around them with the bulk
 * operations (async proxy) on global memory. */
__device__ __forceinline__ void oss_fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
__device__ __forceinline__ unsigned oss_ld_acquire_gpu(const unsigned *p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void oss_red_release_gpu_add(unsigned *p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
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
/* Bulk tensor store: the box of the 4-D tensor map at {c0, c1, c2, c3} from
 * shared memory at src (in the map's swizzled layout); elements outside the
 * tensor are not written. Tracked in bulk groups (oss_bulk_commit,
 * oss_bulk_wait_read); src must stay unchanged until the group was read. */
__device__ __forceinline__ void oss_tma_store_4d(const void *map, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(map),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
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
 * warpgroup's first row of A; sBa at the first of the NB rows of B it reads,
 * whose column blocks hold NB_BOX rows (B's rows may be part of a larger tile,
 * starting at a multiple of 8 rows). Forward: S = Q K^T; backward: S^T = K Q^T
 * and dP^T = V dO^T. */
template <typename T, int HD, int MA, int NB, int NB_BOX = NB>
__device__ __forceinline__ void oss_attn_sm90_qk(float (&s)[NB / 8][4], uint32_t sAa, uint32_t sBa) {
  const uint32_t la = oss_wgmma_desc_lo_here(sAa, 16), lb = oss_wgmma_desc_lo_here(sBa, 16);
  constexpr uint32_t hi = oss_wgmma_desc_hi(1024);
#pragma unroll
  for (int kk = 0; kk < HD / 16; kk++)
    oss_wgmma<T, NB>::template ss<0, 0>(s, oss_wgmma_desc_join(la + (((kk >> 2) * (MA * 128) + (kk & 3) * 32) >> 4), hi),
                                        oss_wgmma_desc_join(lb + (((kk >> 2) * (NB_BOX * 128) + (kk & 3) * 32) >> 4), hi),
                                        kk > 0);
}

/* Issues O += P V for one warpgroup (no commit): A = P from registers (one
 * mma.sync A fragment per 16 of the KR summed rows), B = V, a KR x HD tile read
 * MN-major: 16 rows (two 8-row groups, 1024 bytes apart) per k-step, the
 * 64-column blocks KR * 128 bytes apart. Forward: O += P V; backward:
 * dV += P^T dO and dK += dS^T Q. */
template <typename T, int HD, int KR>
__device__ __forceinline__ void oss_attn_sm90_pv(float (&o)[HD / 8][4], const uint32_t (&pa)[KR / 16][4],
                                                 uint32_t sVa) {
  const uint32_t lv = oss_wgmma_desc_lo_here(sVa, KR * 128);
  constexpr uint32_t hi = oss_wgmma_desc_hi(1024);
#pragma unroll
  for (int kk = 0; kk < KR / 16; kk++)
    oss_wgmma<T, HD>::template rs<1>(o, pa[kk], oss_wgmma_desc_join(lv + ((kk * 16 * 128) >> 4), hi), 1);
}

/* Registers per thread after setmaxnreg, for a CTA of NWG consumer
 * warpgroups and one producer warpgroup at one CTA per SM. A CTA keeps the
 * registers it was launched with (65536 / threads in steps of 8: 168 for 384
 * threads, 128 for 512), so the producer's 24 and the consumers' share of the
 * rest (240 with two consumer warpgroups, 160 with three) must fit in them, or
 * the consumers' request waits forever. */
enum { OSS_SM90_PRODUCER_REGS = 24 };
template <int NWG> struct oss_sm90_regs {
  static constexpr int THREADS = 128 * (NWG + 1);
  static constexpr int LAUNCH = 65536 / THREADS / 8 * 8;
  static constexpr int CONSUMER = (LAUNCH * THREADS - 128 * OSS_SM90_PRODUCER_REGS) / (128 * NWG) / 8 * 8;
  static_assert(128 * OSS_SM90_PRODUCER_REGS + 128 * NWG * CONSUMER <= THREADS * LAUNCH, "register budgets");
};
/* the kernels of two consumer warpgroups (every backward kernel, and the forward's by default) */
enum { OSS_SM90_CONSUMER_REGS = oss_sm90_regs<2>::CONSUMER, OSS_SM90_LAUNCH_REGS = oss_sm90_regs<2>::LAUNCH };

/* Columns a tile of `cols` occupies in shared memory: whole 64-column boxes
 * (the copy engine zero-fills the columns past the tensor's). */
__host__ __device__ constexpr int oss_sm90_cols(int cols) { return (cols + 63) / 64 * 64; }

/* Copies the ROWS x HD tile at row `row` of (batch, head) into `dst` as HD / 64
 * boxes of 64 columns (each ROWS x 128 bytes), completing on `full`, which
 * expects the tile's bytes. */
template <int HD, int ROWS, typename T>
__device__ __forceinline__ void oss_sm90_load_tile(T *dst, const CUtensorMap *map, uint64_t *full, int row, int head,
                                                   int batch) {
  oss_mbar_arrive_expect_tx(full, ROWS * HD * (uint32_t)sizeof(T));
#pragma unroll
  for (int cb = 0; cb < HD / 64; cb++)
    oss_tma_load_4d(oss_smem_u32(dst + cb * ROWS * 64), map, full, cb * 64, row, head, batch);
}

/* Zeroes rows first .. ROWS - 1 of a landed ROWS x HD tile (HD / 64 boxes of
 * ROWS rows of 128 bytes; the swizzle moves chunks only within a row) for the
 * warpgroup's thread t of 128, then makes the writes visible to its tensor
 * cores (named barrier `bar` of 128 threads). In a variable-length batch the
 * rows past a sequence's last key (or query) hold the next sequence's values:
 * their weights are 0, but 0 times a non-finite value would not be. Both consumer
 * warpgroups may zero the same rows at once: they write the same zeros. */
template <typename T, int HD, int ROWS>
__device__ __forceinline__ void oss_sm90_zero_rows(T *tile, int first, int t, int bar) {
  const int n = (ROWS - first) * (HD / 64) * 8; /* 16-byte chunks */
  for (int c = t; c < n; c += 128) {
    const int row = first + c / 8 % (ROWS - first), box = c / 8 / (ROWS - first);
    reinterpret_cast<uint4 *>(tile + box * ROWS * 64 + row * 64)[c % 8] = make_uint4(0u, 0u, 0u, 0u);
  }
  oss_fence_proxy_async();
  oss_named_sync(bar, 128);
}

/* Writes a warpgroup's 64 rows of a wgmma accumulator (NO n-tiles of 8
 * columns; warp k of the warpgroup holds rows 16k .. 16k + 15, lane (g, t)
 * rows g and g + 8, columns 8n + 2t and 8n + 2t + 1), times `scale` and
 * rounded to T, to global rows dst + r * ld for r < nrows, columns < ncols,
 * through `stage` (shared memory, 16-byte aligned, free for the warpgroup:
 * 64 rows of 8 NO elements, NO rounded up to a multiple of 8): each thread
 * stores its pairs there (16-byte chunk c of row r at chunk c ^ (r % 8), so a
 * warp's pairs fall in 32 banks), the
 * warpgroup meets at named barrier `bar` (t: the thread's index in it), and
 * each thread then copies whole 16-byte chunks to global memory (element by
 * element where `vec`, rows of 16-byte aligned vectors, does not hold, and
 * for a last chunk that ncols cuts). *Reason:* the fragments' own 4-byte
 * stores put 8 rows in a warp's every store, a partial sector each; under
 * ncu they held the load/store queue (lg_throttle) for 8 % of the Hopper
 * backward's samples at seqlen 1k, where each CTA stores its dK and dV once
 * after 16 query blocks. */
template <typename T, int NO>
__device__ __forceinline__ void oss_sm90_store_rows(T *dst, int64_t ld, int nrows, int ncols, bool vec,
                                                    const float (&acc)[NO][4], float scale, T *stage, int bar,
                                                    int t) {
  /* a staged row: NO 16-byte chunks, room for a multiple of 8 so that the
   * swizzle (chunk c at c ^ (r % 8)) stays inside the row */
  constexpr int PITCH = (NO + 7) / 8 * 8 * 16;
  const int warp = t >> 5, g = (t & 31) >> 2, t2 = (t & 3) * 2;
  unsigned char *s = reinterpret_cast<unsigned char *>(stage);
#pragma unroll
  for (int hi = 0; hi < 2; hi++) {
    const int r = warp * 16 + g + hi * 8;
#pragma unroll
    for (int n = 0; n < NO; n++)
      *reinterpret_cast<uint32_t *>(s + r * PITCH + ((n ^ (r & 7)) << 4) + t2 * 2) =
          oss_mma_op<T>::pack(acc[n][2 * hi] * scale, acc[n][2 * hi + 1] * scale);
  }
  oss_named_sync(bar, 128);
#pragma unroll 4
  for (int idx = t; idx < 64 * NO; idx += 128) {
    const int r = idx / NO, c = idx % NO;
    if (r < nrows && c * 8 < ncols) {
      const uint4 v = *reinterpret_cast<const uint4 *>(s + r * PITCH + ((c ^ (r & 7)) << 4));
      T *out = dst + (int64_t)r * ld + c * 8;
      if (vec && c * 8 + 8 <= ncols) {
        *reinterpret_cast<uint4 *>(out) = v;
      } else {
        const T *e = reinterpret_cast<const T *>(&v);
#pragma unroll
        for (int k = 0; k < 8; k++)
          if (c * 8 + k < ncols) out[k] = e[k];
      }
    }
  }
}

/* Stores four 8 x 8 matrices of 16-bit elements to shared memory: register k
 * of lane L holds elements (L / 4, 2 (L % 4)) and (L / 4, 2 (L % 4) + 1) of
 * matrix k (an mma accumulator fragment's layout), and lane L gives the
 * address of row L % 8 of matrix L / 8 (16 bytes a row). */
__device__ __forceinline__ void oss_stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

/* Stages a warpgroup's 64 rows of a wgmma accumulator (NO n-tiles of 8
 * columns; warp w holds rows 16w .. 16w + 15, lane (g, t) rows g and g + 8),
 * row g + 8 hi times scale[hi] and rounded to T, at `stage` (shared memory,
 * 1024-byte aligned) as the boxes a tensor map of 64 columns by 64 rows with
 * the 128-byte swizzle stores from: box c / 64 of 8 KB, its row r's 16-byte
 * chunk k at k ^ (r % 8). One stmatrix per two n-tiles n, n + 1: matrices
 * (n, rows 0-7), (n, rows 8-15), (n + 1, rows 0-7), (n + 1, rows 8-15); a
 * matrix's 8 rows land in 8 distinct chunks of their rows, so its store is
 * free of bank conflicts. */
template <typename T, int NO>
__device__ __forceinline__ void oss_sm90_stage_acc(uint32_t stage, const float (&acc)[NO][4], const float (&scale)[2],
                                                   int warp, int lane) {
  static_assert(NO % 2 == 0, "n-tiles in pairs");
  const int k = lane >> 3, r = warp * 16 + (lane & 7) + 8 * (k & 1);
  const uint32_t row = stage + (uint32_t)r * 128u;
#pragma unroll
  for (int n = 0; n < NO; n += 2) {
    const int tile = n + (k >> 1);
    oss_stmatrix_x4(row + (uint32_t)(tile >> 3) * 8192u + (uint32_t)(((tile & 7) ^ (r & 7)) << 4),
                    oss_mma_op<T>::pack(acc[n][0] * scale[0], acc[n][1] * scale[0]),
                    oss_mma_op<T>::pack(acc[n][2] * scale[1], acc[n][3] * scale[1]),
                    oss_mma_op<T>::pack(acc[n + 1][0] * scale[0], acc[n + 1][1] * scale[0]),
                    oss_mma_op<T>::pack(acc[n + 1][2] * scale[1], acc[n + 1][3] * scale[1]));
  }
}

/* ---- host: tensor maps ----------------------------------------------------- */

typedef CUresult (*oss_encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                        const cuuint64_t *, const cuuint32_t *, const cuuint32_t *,
                                        CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                        CUtensorMapFloatOOBfill);

static inline oss_encode_tiled_fn oss_find_encode_tiled(void) {
  void *p = NULL;
  cudaDriverEntryPointQueryResult found;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess)
    p = NULL;
  cudaGetLastError();
  return (oss_encode_tiled_fn)p;
}

/* The driver's cuTensorMapEncodeTiled, found once per process (the runtime
 * hands out driver entry points, so the library need not link libcuda); NULL
 * where the driver has none, and then the mma.sync kernel runs. */
static inline oss_encode_tiled_fn oss_encode_tiled(void) {
  static const oss_encode_tiled_fn fn = oss_find_encode_tiled(); /* initialised once, thread-safely */
  return fn;
}

template <typename T> struct oss_tma_dtype;
template <> struct oss_tma_dtype<__half> {
  static constexpr CUtensorMapDataType value = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
};
template <> struct oss_tma_dtype<__nv_bfloat16> {
  static constexpr CUtensorMapDataType value = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
};

/* Tensor map of a (batch, heads, len, cols) tensor whose rows are contiguous,
 * strides s (elements) of batch, heads and len; boxes of 64 columns by
 * box_rows rows, 128-byte swizzle. Returns 0 when the copy engine cannot
 * address it (16-byte rule on the base and strides). */
template <typename T>
static inline int oss_attn_sm90_map(CUtensorMap *map, const void *base, int64_t batch, int64_t heads, int64_t len,
                                    int64_t cols, const int64_t s[3], int box_rows) {
  oss_encode_tiled_fn encode = oss_encode_tiled();
  if (encode == NULL || ((uintptr_t)base) % 16 != 0) return 0;
  const cuuint64_t dims[4] = {(cuuint64_t)cols, (cuuint64_t)len, (cuuint64_t)heads, (cuuint64_t)batch};
  const int64_t want[3] = {s[2], s[1], s[0]};
  cuuint64_t strides[3];
  int64_t prev = cols * 2;
  for (int i = 0; i < 3; i++) {
    /* a dimension of size 1 is never stepped along: any legal stride will do */
    const int64_t st = dims[i + 1] == 1 ? (prev + 15) / 16 * 16 : want[i] * 2;
    if (st <= 0 || st % 16 != 0 || st >= ((int64_t)1 << 40)) return 0;
    strides[i] = (cuuint64_t)st;
    prev = st * (int64_t)dims[i + 1];
  }
  const cuuint32_t box[4] = {64, (cuuint32_t)box_rows, 1, 1}, elem_strides[4] = {1, 1, 1, 1};
  return encode(map, oss_tma_dtype<T>::value, 4, const_cast<void *>(base), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* A mask tensor's tiles for the copy engine (oss_attn_sm90_mask_map): boxes
 * of `cols` key columns (128 bytes, or the whole tile where it is narrower)
 * by `rows` query rows (the block's BR, or 1 where the mask is the same for
 * every query row), each box at a 1024-byte boundary so that its swizzle
 * follows its rows; `bcast` bit 0: one batch for all, bit 1: one head for
 * all (those coordinates are 0). */
typedef struct oss_attn_sm90_mask_tiles {
  int cols, rows, box_bytes, stage_bytes, bcast;
  int tx; /* bytes a stage's copies deliver */
  int span; /* the swizzle's span in bytes: 128 or 64 (a box's row) */
  int stages; /* the forward's mask stages (1 or 2; its launcher's choice) */
} oss_attn_sm90_mask_tiles;

/* Tensor map of a call's mask tensor (bool, float32 or 16-bit; last dim
 * contiguous): 4-D (keys, queries, heads, batch) with the mask's strides, a
 * broadcast dim (stride 0) of size 1, boxes of t->cols x t->rows elements in
 * the 128-byte swizzle (64-byte for a 64-byte row). Returns 0 where the copy
 * engine cannot address it (16-byte rule on the base and strides); the
 * kernel then reads the mask from global memory element by element. */
static inline int oss_attn_sm90_mask_map(CUtensorMap *map, oss_attn_sm90_mask_tiles *t, const oss_attn_args *a,
                                         int bc, int br) {
  oss_encode_tiled_fn encode = oss_encode_tiled();
  if (encode == NULL || a->mask_kind == OSS_MASK_NONE || ((uintptr_t)a->mask) % 16 != 0 || a->m_s[3] != 1)
    return 0;
  const int esize = a->mask_dtype == OSS_BOOL ? 1 : a->mask_dtype == OSS_FLOAT32 ? 4 : 2;
  const CUtensorMapDataType type = esize == 1   ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : esize == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16
                                                : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  const int64_t sizes[3] = {a->lq, a->hq, a->batch}, want[3] = {a->m_s[2], a->m_s[1], a->m_s[0]};
  cuuint64_t dims[4] = {(cuuint64_t)a->lk, 1, 1, 1}, strides[3];
  int64_t prev = (int64_t)a->lk * esize;
  for (int i = 0; i < 3; i++) {
    dims[i + 1] = want[i] == 0 ? 1 : (cuuint64_t)sizes[i];
    /* a dimension of size 1 is never stepped along: any legal stride will do */
    const int64_t st = dims[i + 1] == 1 ? (prev + 15) / 16 * 16 : want[i] * esize;
    if (st <= 0 || st % 16 != 0 || st >= ((int64_t)1 << 40)) return 0;
    strides[i] = (cuuint64_t)st;
    prev = st * (int64_t)dims[i + 1];
  }
  t->cols = bc * esize < 128 ? bc : 128 / esize;
  t->span = t->cols * esize;
  t->rows = dims[1] == 1 ? 1 : br;
  t->box_bytes = (t->cols * esize * t->rows + 1023) / 1024 * 1024;
  t->stage_bytes = bc / t->cols * t->box_bytes;
  t->tx = bc * esize * t->rows;
  t->bcast = (a->m_s[0] == 0 ? 1 : 0) | (a->m_s[1] == 0 ? 2 : 0);
  t->stages = 1;
  const cuuint32_t box[4] = {(cuuint32_t)t->cols, (cuuint32_t)t->rows, 1, 1}, elem_strides[4] = {1, 1, 1, 1};
  return encode(map, type, 4, const_cast<void *>(a->mask), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, t->span == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* The mask tile of key columns j0 .. j0 + bc - 1 and query rows from i0 (one
 * row where the mask is the same for every row) of (batch b, head h) into
 * shared memory at dst: t.cols-column boxes, completing on full (one
 * arrival with the copies' bytes). */
__device__ __forceinline__ void oss_sm90_load_mask(uint32_t dst, const CUtensorMap *map,
                                                   const oss_attn_sm90_mask_tiles &t, uint64_t *full, int bc, int j0,
                                                   int i0, int h, int b) {
  oss_mbar_arrive_expect_tx(full, (uint32_t)t.tx);
  for (int c = 0; c < bc; c += t.cols)
    oss_tma_load_4d(dst + c / t.cols * t.box_bytes, map, full, j0 + c, t.rows == 1 ? 0 : i0, (t.bcast & 2) ? 0 : h,
                    (t.bcast & 1) ? 0 : b);
}

/* Whether the 16 bytes of a mask tile at shared-memory address `at` leave
 * the scores they mask unchanged: bool bytes all 1 (true), float or 16-bit
 * values all +0 (their bits 0). Other encodings of those values (a bool byte
 * above 1, -0) read as not neutral, which only costs the masking. */
template <int ES> __device__ __forceinline__ bool oss_sm90_mask_chunk_neutral(uint32_t at) {
  uint32_t w0, w1, w2, w3;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(w0), "=r"(w1), "=r"(w2), "=r"(w3) : "r"(at) : "memory");
  if constexpr (ES == 1) return (w0 & w1 & w2 & w3) == 0x01010101u && (w0 | w1 | w2 | w3) == 0x01010101u;
  else return (w0 | w1 | w2 | w3) == 0u;
}

/* Registers per thread the kernel launches with (0 if the runtime cannot say). */
template <typename K> static inline int oss_kernel_regs(K *kernel) {
  cudaFuncAttributes attr;
  if (cudaFuncGetAttributes(&attr, (const void *)kernel) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return attr.numRegs;
}

/* Calls whose variants the plain Hopper kernels serve. They apply a window
 * where they apply the causal rule; the forward merges the sinks into each
 * row's statistics after its keys, and the backward finds them in lse. The
 * forward's window instantiation also caps the scores (with a positive
 * scale, see oss_sm90_plain_scores) and adds ALiBi's biases; the backward's
 * kernels do neither. */
static inline bool oss_attn_fwd_plain_scores(const oss_attn_args *a) {
  return a->drop_seed == NULL && (a->softcap_l2 == 0.f || a->scale_log2 > 0.f);
}
static inline bool oss_attn_bwd_plain_scores(const oss_attn_args *a) {
  return a->drop_seed == NULL && a->softcap_l2 == 0.f && a->alibi == NULL;
}

#endif /* OSS_ATTENTION_SM90_CUH */
