/*
 * oss_internal.h - helpers shared by the kernel files (C and CUDA), not part
 * of the public C API in oss.h.
 */
#ifndef OSS_INTERNAL_H
#define OSS_INTERNAL_H

#include <math.h>

#include "oss.h"

#if defined(__CUDACC__)
#define OSS_HOST_DEVICE __host__ __device__
#else
#define OSS_HOST_DEVICE
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The 16-bit attention forwards' output residual (oss.h out_residual), the
 * same on CPU and CUDA: x (the output before its rounding) minus `rounded`
 * (x rounded to float16, or bfloat16 when bf16), itself rounded to a step of
 * 2^-OSS_RESIDUAL_BITS of rounded's unit in the last place (that of the
 * smallest normal below it); 0 where rounded is not finite. The bits below
 * that step are the float32 accumulation's own noise, not information: where
 * every value row is the same, x is that row to a few float32 ulps, and those
 * ulps passed into the backward's D made dq and dk, exactly 0 there, come out
 * several times worse than PyTorch's (H100 fuzz, session h). */
#define OSS_RESIDUAL_BITS 5
static inline OSS_HOST_DEVICE float oss_output_residual(float x, float rounded, int bf16) {
  if (!isfinite(rounded)) return 0.f;
  const int mantissa_bits = bf16 ? 7 : 10, min_exponent = bf16 ? -126 : -14;
  const int step = ilogbf(fmaxf(fabsf(rounded), ldexpf(1.f, min_exponent))) - mantissa_bits - OSS_RESIDUAL_BITS;
  return ldexpf(rintf(ldexpf(x - rounded, -step)), step);
}

/* Records a printf-style sentence for oss_error_message() on this thread and
 * returns `status`, so failures read `return oss_fail(OSS_ERROR_..., "...")`. */
oss_status oss_fail(oss_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Comma-separated head dims compiled into the CUDA attention kernels
 * (defined by the generated dispatch file; absent in CPU-only builds). */
const char *oss_attention_cuda_head_dims_list(void);
const char *oss_attention_cuda_hopper_head_dims_list(void); /* head dims of the sm_90a wgmma forward */

#ifdef __cplusplus
}
#endif

#endif /* OSS_INTERNAL_H */
