/*
 * common.cuh - small helpers shared by the CUDA kernel files: status
 * conversion for CUDA errors, launch checks, device attributes, the
 * load/convert/store of the element types (computation happens in float, or
 * double for float64 tensors), programmatic dependent launch, cp.async, and
 * the shared-memory addresses, mbarriers and bulk copies of the sm_90 kernels
 * (used only inside sm_90 code).
 */
#ifndef OSS_CUDA_COMMON_CUH
#define OSS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "oss_internal.h"

/* Returns from the enclosing function with OSS_ERROR_CUDA when `call` fails. */
#define OSS_CUDA_TRY(call)                                                                  \
  do {                                                                                      \
    cudaError_t oss_err_ = (call);                                                          \
    if (oss_err_ != cudaSuccess)                                                            \
      return oss_fail(OSS_ERROR_CUDA, "%s failed: %s", #call, cudaGetErrorString(oss_err_)); \
  } while (0)

/* After every launch: reports a failed launch (bad configuration, too much
 * shared memory, a sticky earlier fault) naming the kernel. */
static inline oss_status oss_check_launch(const char *kernel_name) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return oss_fail(OSS_ERROR_CUDA, "launch of %s failed: %s", kernel_name, cudaGetErrorString(err));
  return OSS_OK;
}

/* Attributes of the current device (the caller's device guard selects it). */
typedef struct oss_device_info {
  int device;
  int sm_count;
  int max_smem_per_block_optin; /* bytes a block may use after cudaFuncSetAttribute */
  int max_smem_per_sm;
  int l2_bytes;
  int cc_major, cc_minor;
  double dram_bytes_per_ns; /* the DRAM's peak bandwidth (0 where the driver does not say) */
} oss_device_info;

/* Fills info's attributes for device info->device from the driver. */
static inline oss_status oss_query_device_info(oss_device_info *info) {
  OSS_CUDA_TRY(cudaDeviceGetAttribute(&info->sm_count, cudaDevAttrMultiProcessorCount, info->device));
  OSS_CUDA_TRY(cudaDeviceGetAttribute(&info->max_smem_per_block_optin,
                                      cudaDevAttrMaxSharedMemoryPerBlockOptin, info->device));
  OSS_CUDA_TRY(cudaDeviceGetAttribute(&info->max_smem_per_sm,
                                      cudaDevAttrMaxSharedMemoryPerMultiprocessor, info->device));
  OSS_CUDA_TRY(cudaDeviceGetAttribute(&info->l2_bytes, cudaDevAttrL2CacheSize, info->device));
  OSS_CUDA_TRY(cudaDeviceGetAttribute(&info->cc_major, cudaDevAttrComputeCapabilityMajor, info->device));
  OSS_CUDA_TRY(cudaDeviceGetAttribute(&info->cc_minor, cudaDevAttrComputeCapabilityMinor, info->device));
  int mem_khz = 0, bus_bits = 0; /* double data rate: 2 transfers per clock */
  if (cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, info->device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, info->device) != cudaSuccess) {
    cudaGetLastError();
    mem_khz = bus_bits = 0;
  }
  info->dram_bytes_per_ns = 2.0 * mem_khz * 1e3 * (bus_bits / 8) * 1e-9;
  return OSS_OK;
}

/* The attributes of the current device, asked of the driver once per device
 * (per translation unit): every op call needs them, and seven attribute
 * queries would cost microseconds of host time on each. */
enum { OSS_DEVICE_INFO_CACHE = 64 };
static oss_device_info oss_device_info_cache[OSS_DEVICE_INFO_CACHE];
static int oss_device_info_known[OSS_DEVICE_INFO_CACHE];
static pthread_mutex_t oss_device_info_lock = PTHREAD_MUTEX_INITIALIZER;

static inline oss_status oss_get_device_info(oss_device_info *info) {
  int device;
  OSS_CUDA_TRY(cudaGetDevice(&device));
  if (device >= 0 && device < OSS_DEVICE_INFO_CACHE) {
    pthread_mutex_lock(&oss_device_info_lock);
    const int known = oss_device_info_known[device];
    if (known) *info = oss_device_info_cache[device];
    pthread_mutex_unlock(&oss_device_info_lock);
    if (known) return OSS_OK;
  }
  info->device = device;
  const oss_status s = oss_query_device_info(info);
  if (s != OSS_OK || device < 0 || device >= OSS_DEVICE_INFO_CACHE) return s;
  pthread_mutex_lock(&oss_device_info_lock);
  oss_device_info_cache[device] = *info;
  oss_device_info_known[device] = 1;
  pthread_mutex_unlock(&oss_device_info_lock);
  return OSS_OK;
}

/* ---- programmatic dependent launch (sm_90) -------------------------------- */

/* In a kernel (no-ops before sm_90 and in a kernel launched without it):
 * launch_dependents lets the next kernel on the stream, launched with
 * oss_launch_dependent, start once every CTA of this one has run it; wait
 * blocks until the previous kernel has finished and its writes are visible. */
__device__ __forceinline__ void oss_pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void oss_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/* Launches kern right behind the previous launch on the stream: on sm_90 with
 * programmatic dependent launch, so its CTAs may start (and do the work that
 * does not depend on that launch) while the previous kernel's last CTAs run;
 * the kernel calls oss_pdl_wait before it reads what the previous one wrote,
 * and that one calls oss_pdl_launch_dependents. A plain launch elsewhere. */
template <typename... Params, typename... Args>
static oss_status oss_launch_dependent(void (*kern)(Params...), dim3 grid, dim3 block, size_t smem,
                                       cudaStream_t stream, const oss_device_info *info, const char *name,
                                       Args... args) {
  cudaLaunchConfig_t cfg;
  cudaLaunchAttribute attr;
  memset(&cfg, 0, sizeof cfg);
  memset(&attr, 0, sizeof attr);
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = info->cc_major >= 9 ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kern, args...);
  if (err != cudaSuccess) return oss_fail(OSS_ERROR_CUDA, "launch of %s failed: %s", name, cudaGetErrorString(err));
  return oss_check_launch(name);
}

/* ---- element conversion ------------------------------------------------- */

__device__ __forceinline__ float oss_to_float(float x) { return x; }
__device__ __forceinline__ float oss_to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float oss_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T oss_from_float(float x);
template <> __device__ __forceinline__ float oss_from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half oss_from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 oss_from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

/* ---- shared memory, mbarriers and bulk copies (sm_90) -------------------- */

__device__ __forceinline__ uint32_t oss_smem_u32(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

/* cp.async (sm_80): a 16-byte global->shared copy by the issuing thread,
 * bytes past src_bytes (0..16) zero-filled; commit closes a group of them,
 * wait<N> blocks until at most N groups are pending. The wrappers carry no
 * memory clobber: a reader of the copied bytes orders its loads after the
 * wait itself (a __syncthreads, or a compiler fence for the issuing thread). */
__device__ __forceinline__ void oss_cp_async16(uint32_t dst, const void *src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void oss_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void oss_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* mbarrier (PTX ISA, "mbarrier"): a shared-memory barrier object completing a
 * phase when its pending arrivals reach zero; waiters poll the parity of the
 * phase they wait for. */
__device__ __forceinline__ void oss_mbar_init(uint64_t *bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(oss_smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void oss_mbar_wait(uint64_t *bar, int parity) {
  asm volatile("{\n.reg .pred done;\nwait_%=:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra wait_%=;\n}\n" ::"r"(oss_smem_u32(bar)),
               "r"(parity)
               : "memory");
}
/* The same wait for a thread that has nothing else to do and is not on the
 * critical path (a producer waiting for a free stage): it sleeps ~64 ns
 * between polls. A failed poll returns within a few cycles, so a polling warp
 * would otherwise take a large share of the issue slots of the scheduler it
 * shares with the consumer warps (a producer is mostly ahead, so it waits for
 * most of a kernel). */
__device__ __forceinline__ void oss_mbar_wait_backoff(uint64_t *bar, int parity) {
  asm volatile("{\n.reg .pred done;\nwait_%=:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done nanosleep.u32 64;\n"
               "@!done bra wait_%=;\n}\n" ::"r"(oss_smem_u32(bar)),
               "r"(parity)
               : "memory");
}
/* Arrives on bar and adds `bytes` to the transaction count its phase waits
 * for (the bytes the copy engine will deliver to it). */
__device__ __forceinline__ void oss_mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(oss_smem_u32(bar)), "r"(bytes)
               : "memory");
}
/* Makes initialised mbarriers visible to the copy engine (async proxy). */
__device__ __forceinline__ void oss_fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/* Bulk copy (PTX ISA, "cp.async.bulk"): `bytes` (a multiple of 16) from
 * global memory to this CTA's shared memory, both 16-byte aligned, by the
 * copy engine; the bytes complete on bar. */
__device__ __forceinline__ void oss_bulk_load(uint32_t dst, const void *src, uint32_t bytes, uint64_t *bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(oss_smem_u32(bar))
               : "memory");
}

#endif /* OSS_CUDA_COMMON_CUH */
