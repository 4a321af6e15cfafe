/*
 * cluster_synccheck_probe.cu - does compute-sanitizer's synccheck report a
 * divergent warp at a CTA barrier in a kernel whose warps cannot diverge
 * there? (A check on the tool, not on torch_oss: docs/reliability.md.)
 *
 * The kernel has the barrier skeleton of softmax_row_chunks_kernel's cluster
 * tier and nothing else: clusters of 16 CTAs of 512 threads with 64 KB of
 * dynamic shared memory (two CTAs per SM, so on an H100 14 clusters fit at
 * once), a grid of more rows than that, a cluster barrier at the start (an
 * early barrier.cluster.arrive.relaxed waited on before the first remote
 * write, mode 1, as the softmax kernel does; or a plain cluster sync, mode 0),
 * then per row: loads, a warp shuffle reduction (full mask, so each warp is
 * converged), a block reduction with two __syncthreads whose only divergent
 * code is a predicated shared store, a DSMEM exchange and a cluster sync.
 * Every element of the output must equal 1 / (16 * 4096 * 4 / 4).
 *
 * Build: nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a
 *        csrc/tests/cluster_synccheck_probe.cu -o build/cluster_synccheck_probe
 * Run:   compute-sanitizer --tool synccheck build/cluster_synccheck_probe MODE ROWS
 * (scripts/gpu_check.sh syncprobe runs both modes several times).
 */
#include <cooperative_groups.h>
#include <cstdio>
#include <cstdlib>
namespace cg = cooperative_groups;

__global__ void __launch_bounds__(512, 1) probe(const float4 *x, float *out, int rows, int per_cta, int early) {
  extern __shared__ float4 buf[];
  __shared__ float red[33];
  __shared__ float xch[2][16];
  __shared__ float cbc;
  cg::cluster_group cl = cg::this_cluster();
  bool start_wait = early != 0;
  if (early) asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
  else cl.sync();
  const int t = threadIdx.x, T = blockDim.x, lane = t & 31, warp = t >> 5;
  const unsigned C = cl.num_blocks(), rank = cl.block_rank();
  for (int r = blockIdx.y; r < rows; r += gridDim.y) {
    const float4 *src = x + ((size_t)r * gridDim.x + blockIdx.x) * per_cta;
    float s = 0;
    for (int i = t; i < per_cta; i += T) {
      const float4 v = src[i];
      buf[i] = v;
      s += v.x + v.y + v.z + v.w;
    }
    for (int off = 16; off >= 1; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) red[warp] = s;
    __syncthreads();
    if (warp == 0) {
      float a = lane < T / 32 ? red[lane] : 0.f;
      for (int off = 16; off >= 1; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
      if (lane == 0) red[32] = a;
    }
    __syncthreads();
    s = red[32];
    const int b = ((r - (int)blockIdx.y) / (int)gridDim.y) & 1;
    if (start_wait) {
      asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
      start_wait = false;
    }
    if (t < (int)C) *cl.map_shared_rank(&xch[b][rank], (unsigned)t) = s;
    cl.sync();
    if (t < 32) {
      float a = t < (int)C ? xch[b][t] : 0.f;
      for (int off = 16; off >= 1; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
      if (t == 0) cbc = a;
    }
    __syncthreads();
    s = cbc;
    float *dst = out + ((size_t)r * gridDim.x + blockIdx.x) * per_cta;
    for (int i = t; i < per_cta; i += T) dst[i] = buf[i].x / s;
  }
  if (start_wait) asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

int main(int argc, char **argv) {
  const int early = argc > 1 ? atoi(argv[1]) : 1, rows = argc > 2 ? atoi(argv[2]) : 20;
  const int C = 16, T = 512, per_cta = 4096; /* 64 KB of float4 per CTA */
  const size_t n4 = (size_t)rows * C * per_cta, smem = per_cta * 16;
  float4 *x;
  float *out;
  cudaMalloc(&x, n4 * 16);
  cudaMalloc(&out, n4 * 4);
  float4 *h = (float4 *)malloc(n4 * 16);
  for (size_t i = 0; i < n4; i++) h[i] = make_float4(1.f, 0.f, 0.f, 0.f);
  cudaMemcpy(x, h, n4 * 16, cudaMemcpyHostToDevice);
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  cudaFuncSetAttribute(probe, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = C;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3(C, rows, 1);
  cfg.blockDim = dim3(T, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  cudaOccupancyMaxActiveClusters(&clusters, probe, &cfg);
  cudaError_t e = cudaLaunchKernelEx(&cfg, probe, (const float4 *)x, out, rows, per_cta, early);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  float *ho = (float *)malloc(n4 * 4);
  cudaMemcpy(ho, out, n4 * 4, cudaMemcpyDeviceToHost);
  size_t bad = 0;
  const float want = 1.f / (float)(C * per_cta); /* x = (1, 0, 0, 0): the row sum is C * per_cta */
  for (size_t i = 0; i < n4; i++) bad += ho[i] != want;
  printf("probe early=%d rows=%d clusters resident=%d: %s, %zu wrong\n", early, rows, clusters, cudaGetErrorString(e), bad);
  return e != cudaSuccess || bad != 0;
}
