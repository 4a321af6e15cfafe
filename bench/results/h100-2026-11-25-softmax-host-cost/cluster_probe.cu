// How many clusters of C CTAs (T threads, S bytes of dynamic smem) fit at once on this GPU.
#include <cstdio>
#include <cuda_runtime.h>
__global__ void __launch_bounds__(1024, 1) dummy(float *p, int n) {
  extern __shared__ int s[];
  float a[56];
#pragma unroll
  for (int i = 0; i < 56; i++) a[i] = p[threadIdx.x + i * 1024];
  for (int k = 0; k < n; k++)
#pragma unroll
    for (int i = 0; i < 56; i++) a[i] = a[i] * a[(i + 1) % 56] + s[i];
  float t = 0;
#pragma unroll
  for (int i = 0; i < 56; i++) t += a[i];
  p[threadIdx.x] = t;
}
int main() {
  cudaFuncSetAttribute(dummy, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaFuncSetAttribute(dummy, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024);
  int T[] = {256, 512, 1024};
  int KB[] = {0, 32, 48, 64, 82, 96, 100, 110};
  for (int ti = 0; ti < 3; ti++)
    for (int si = 0; si < 8; si++) {
      printf("T=%4d smem=%3d KB:", T[ti], KB[si]);
      for (int C = 1; C <= 16; C++) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = C; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
        cfg.gridDim = dim3(C * 64, 1, 1); cfg.blockDim = dim3(T[ti], 1, 1);
        cfg.dynamicSmemBytes = (size_t)KB[si] * 1024; cfg.attrs = at; cfg.numAttrs = 1;
        int n = -1;
        cudaError_t e = cudaOccupancyMaxActiveClusters(&n, (void *)dummy, &cfg);
        if (e != cudaSuccess) { printf(" C%d:err", C); cudaGetLastError(); }
        else printf(" %d:%d(%d)", C, n, n * C);
      }
      printf("\n");
    }
  cudaFuncAttributes fa; cudaFuncGetAttributes(&fa, dummy); printf("regs %d\n", fa.numRegs);
  int dev; cudaGetDevice(&dev); cudaDeviceProp pr; cudaGetDeviceProperties(&pr, dev);
  printf("%s SMs %d\n", pr.name, pr.multiProcessorCount);
}
