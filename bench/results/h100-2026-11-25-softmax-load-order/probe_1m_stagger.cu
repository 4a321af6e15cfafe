/* The 16-bit 1M forward's shape without the arithmetic: rows of 2 MB, a
 * cluster of 16 CTAs per row (512 threads, 2 CTAs per SM), each CTA holds
 * 128 KB: 64 KB in registers (8 LDG.128 per thread) and 64 KB in shared
 * memory, loaded by
 *   V=0 cp.async 16 B per thread (the library's way)
 *   V=1 cp.async.bulk (TMA): thread 0, 2 x 32 KB, one mbarrier
 *   V=2 cp.async.bulk issued before the register loads
 * then a reduction, a cluster barrier with the partials read over DSMEM, and
 * the writes. Times the launch after an L2-flushing memset, % of a 1 GiB copy. */
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

constexpr int T = 512, SR = 8, SS = 8, C = 16;
constexpr int CTA_SLOTS = T * (SR + SS);            /* 8192 x 16 B = 128 KB */
constexpr size_t ROW_SLOTS = (size_t)CTA_SLOTS * C; /* 2 MB */

__device__ __forceinline__ unsigned sa(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp16(void *d, const void *s) { asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa(d)), "l"(s) : "memory"); }

template <int V>
__global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(T, 2) row_1m(const uint4 *in, uint4 *out, int first, int step_ns, int mode) {
  extern __shared__ uint4 sm[];
  __shared__ uint64_t bar;
  __shared__ unsigned red[32];
  cg::cluster_group cluster = cg::this_cluster();
  const int t = threadIdx.x;
  const int rank = cluster.block_rank();
  const size_t row = blockIdx.x / C;
  const uint4 *src = in + row * ROW_SLOTS + (size_t)rank * CTA_SLOTS;
  uint4 *dst = out + row * ROW_SLOTS + (size_t)rank * CTA_SLOTS;
  constexpr unsigned BYTES = SS * T * 16;
  if (mode != 0 && (int)row < first) {
    const unsigned long long wait = mode == 1 ? (unsigned long long)row * step_ns : (row & 1) ? step_ns : 0;
    if (wait > 0) {
      unsigned long long t0, t1;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
      do { __nanosleep(100); asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1)); } while (t1 - t0 < wait);
    }
  }
  if (V >= 1 && t == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sa(&bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if (V >= 3) {
#pragma unroll
    for (int s = 0; s < SS; s++) cp16(sm + s * T + t, src + (SR + s) * T + t);
  }
  if (V == 2 && t == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(&bar)), "r"(BYTES) : "memory");
    for (unsigned o = 0; o < BYTES; o += 32768)
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(sa((char *)sm + o)), "l"((const char *)(src + SR * T) + o), "r"(32768u), "r"(sa(&bar)) : "memory");
  }
  uint4 v[SR];
#pragma unroll
  for (int s = 0; s < SR; s++) v[s] = __ldcg(src + s * T + t);
  if (V == 0) {
#pragma unroll
    for (int s = 0; s < SS; s++) cp16(sm + s * T + t, src + (SR + s) * T + t);
  }
  if (V == 1) {
    __syncthreads(); /* the barrier's init before anyone waits */
    if (t == 0) {
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(&bar)), "r"(BYTES) : "memory");
      for (unsigned o = 0; o < BYTES; o += 32768)
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(sa((char *)sm + o)), "l"((const char *)(src + SR * T) + o), "r"(32768u), "r"(sa(&bar)) : "memory");
    }
  }
  if (V == 2) __syncthreads();
  unsigned x = 0;
#pragma unroll
  for (int s = 0; s < SR; s++) x ^= v[s].x ^ v[s].w;
  if (V == 0 || V >= 3) asm volatile("cp.async.wait_all;" ::: "memory");
  else asm volatile("{\n .reg .pred p;\n W_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n @!p bra W_%=;\n}\n" ::"r"(sa(&bar)) : "memory");
#pragma unroll
  for (int s = 0; s < SS; s++) x ^= sm[s * T + t].x ^ sm[s * T + t].w;
  x = __reduce_xor_sync(0xffffffffu, x);
  if ((t & 31) == 0) red[t >> 5] = x;
  __syncthreads();
  if (t == 0) { unsigned y = 0; for (int w = 0; w < T / 32; w++) y ^= red[w]; red[0] = y; }
  cluster.sync();
  unsigned tot = 0;
  if (t < C) tot = *cluster.map_shared_rank(&red[0], t);
  tot = __reduce_xor_sync(0xffffffffu, tot);
  const unsigned flag = tot == 0x12345u ? 1u : 0u; /* keeps the dependence */
  if (V == 4) {
#pragma unroll
    for (int s = 0; s < SS; s++) { uint4 w = sm[s * T + t]; w.y += flag; __stcs(dst + (SR + s) * T + t, w); }
  }
#pragma unroll
  for (int s = 0; s < SR; s++) { uint4 w = v[s]; w.y += flag; __stcs(dst + s * T + t, w); }
  if (V != 4) {
#pragma unroll
    for (int s = 0; s < SS; s++) { uint4 w = sm[s * T + t]; w.y += flag; __stcs(dst + (SR + s) * T + t, w); }
  }
  cluster.sync(); /* no CTA leaves while a partner may read its shared memory */
}

template <int V> float time_rows(const uint4 *in, uint4 *out, int rows, void *flush, size_t flush_bytes, int first = 0, int step_ns = 0, int mode = 0) {
  const int smem = SS * T * 16;
  CK(cudaFuncSetAttribute(row_1m<V>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CK(cudaFuncSetAttribute(row_1m<V>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int rep = 0; rep < 15; rep++) {
    CK(cudaMemsetAsync(flush, rep, flush_bytes));
    CK(cudaEventRecord(a));
    row_1m<V><<<rows * C, T, smem>>>(in, out, first, step_ns, mode);
    CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
    float x; CK(cudaEventElapsedTime(&x, a, b)); if (rep >= 3) ms.push_back(x);
  }
  CK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int main() {
  const size_t max_rows = 256;
  uint4 *in, *out; void *flush;
  const size_t bytes = max_rows * ROW_SLOTS * 16, flush_bytes = 256u << 20;
  CK(cudaMalloc(&in, bytes)); CK(cudaMalloc(&out, bytes)); CK(cudaMalloc(&flush, flush_bytes));
  CK(cudaMemset(in, 1, bytes));
  float copy_ms;
  {
    cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int rep = 0; rep < 9; rep++) {
      CK(cudaEventRecord(a)); CK(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice)); CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b)); float x; CK(cudaEventElapsedTime(&x, a, b)); ms.push_back(x);
    }
    std::sort(ms.begin(), ms.end()); copy_ms = ms[4];
  }
  const double copy_gbs = 2.0 * bytes / (copy_ms * 1e-3) / 1e9;
  int ncl = 0;
  {
    cudaLaunchConfig_t cfg = {}; cfg.gridDim = dim3(C * 64); cfg.blockDim = dim3(T); cfg.dynamicSmemBytes = SS * T * 16;
    CK(cudaFuncSetAttribute(row_1m<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, SS * T * 16));
    CK(cudaFuncSetAttribute(row_1m<0>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    cudaError_t e = cudaOccupancyMaxActiveClusters(&ncl, row_1m<0>, &cfg); if (e != cudaSuccess) { printf("occupancy query: %s\n", cudaGetErrorString(e)); cudaGetLastError(); }
  }
  printf("copy %.1f GB/s; max active clusters of %d: %d\n", copy_gbs, C, ncl);
  struct { int first, step, mode; const char *name; } st[] = {
      {0, 0, 0, "no wait"}, {14, 150, 1, "first 14: row x 150 ns"}, {14, 300, 1, "first 14: row x 300 ns"},
      {14, 700, 1, "first 14: row x 700 ns"}, {14, 2500, 2, "first 14: odd rows 2.5 us"}, {14, 5000, 2, "first 14: odd rows 5 us"},
      {14, 100, 2, "first 14: odd rows 0.1 us"}, {1, 0, 1, "a wait of 0 (the code path only)"}};
  for (int round = 0; round < 3; round++)
    for (int rows : {64, 256}) {
      const double mb = 2.0 * rows * ROW_SLOTS * 16;
      for (auto &v : st) {
        float t = time_rows<0>(in, out, rows, flush, flush_bytes, v.first, v.step, v.mode);
        printf("round %d rows %3d %-34s %7.1f us %6.2f %%\n", round, rows, v.name, t * 1e3, 100.0 * mb / (t * 1e-3) / 1e9 / copy_gbs);
      }
    }
  return 0;
}
