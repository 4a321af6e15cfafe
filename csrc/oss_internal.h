/*
 * oss_internal.h - helpers shared by the kernel files (C and CUDA), not part
 * of the public C API in oss.h.
 */
#ifndef OSS_INTERNAL_H
#define OSS_INTERNAL_H

#include "oss.h"

#ifdef __cplusplus
extern "C" {
#endif

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
