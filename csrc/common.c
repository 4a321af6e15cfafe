/*
 * common.c - error reporting, build description and the params checks shared
 * by the CPU and CUDA entry points of the C API (oss.h).
 *
 * The failure sentence lives in thread-local storage so concurrent callers on
 * different threads never see each other's messages.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "oss_internal.h"

#ifndef OSS_CUDA_ARCHS
#define OSS_CUDA_ARCHS ""
#endif

static _Thread_local char error_message[1024];

oss_status oss_fail(oss_status status, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(error_message, sizeof error_message, fmt, args);
  va_end(args);
  return status;
}

const char *oss_error_message(void) { return error_message; }

const char *oss_status_name(oss_status status) {
  switch (status) {
  case OSS_OK: return "ok";
  case OSS_ERROR_INVALID_ARGUMENT: return "invalid argument";
  case OSS_ERROR_NOT_SUPPORTED: return "not supported";
  case OSS_ERROR_CUDA: return "CUDA error";
  case OSS_ERROR_OUT_OF_MEMORY: return "out of memory";
  }
  return "unknown status";
}

const char *oss_build_config(void) {
  static _Thread_local char config[512];
#ifdef OSS_WITH_CUDA
  snprintf(config, sizeof config, "cuda=1 archs=%s attention_head_dims=%s attention_hopper_head_dims=%s",
           OSS_CUDA_ARCHS, oss_attention_cuda_head_dims_list(), oss_attention_cuda_hopper_head_dims_list());
#else
  snprintf(config, sizeof config, "cuda=0 archs= attention_head_dims= attention_hopper_head_dims=");
#endif
  return config;
}

oss_status oss_cross_entropy_check_glue(const char *op, int64_t rows, oss_dtype dtype, const void *rows_a,
                                        const void *rows_b, const void *one) {
  if (rows < 0) return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: rows=%lld is negative", op, (long long)rows);
  if (dtype != OSS_FLOAT32 && dtype != OSS_FLOAT64)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: dtype code %d is neither float32 nor float64", op, (int)dtype);
  if ((rows > 0 && (rows_a == NULL || rows_b == NULL)) || one == NULL)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: a pointer is NULL", op);
  return OSS_OK;
}

/* The checks of both cross-entropy target kinds: the dtype, the shape and the scalars. */
static oss_status ce_check_common(const char *op, oss_dtype dtype, int64_t rows, int64_t classes,
                                  double label_smoothing, double z_loss) {
  if (dtype != OSS_FLOAT32 && dtype != OSS_FLOAT64 && dtype != OSS_FLOAT16 && dtype != OSS_BFLOAT16)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: logits have dtype code %d, expected a floating type", op,
                    (int)dtype);
  if (rows < 0 || classes < 1)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: rows=%lld, classes=%lld; need rows >= 0 and classes >= 1", op,
                    (long long)rows, (long long)classes);
  if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0))
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: label_smoothing=%g must be in [0, 1]", op, label_smoothing);
  if (!(z_loss >= 0.0) || isinf(z_loss))
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: z_loss=%g must be finite and >= 0", op, z_loss);
  return OSS_OK;
}

oss_status oss_cross_entropy_probs_check_params(const char *op, const oss_cross_entropy_probs_params *p) {
  if (p == NULL) return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: params is NULL", op);
  const oss_status common = ce_check_common(op, p->dtype, p->rows, p->classes, p->label_smoothing, p->z_loss);
  if (common != OSS_OK) return common;
  if (p->rows > 0 && (p->logits == NULL || p->target == NULL || p->lse == NULL || p->target_sum == NULL))
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: logits, target, lse or target_sum is NULL", op);
  if (p->rows > 1 && (p->logits_stride_row < p->classes || p->target_stride_row < p->classes))
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT,
                    "%s: logits_stride_row=%lld or target_stride_row=%lld is below classes=%lld", op,
                    (long long)p->logits_stride_row, (long long)p->target_stride_row, (long long)p->classes);
  return OSS_OK;
}

oss_status oss_cross_entropy_probs_check_backward(const char *op, const oss_cross_entropy_probs_backward_params *b) {
  if (b == NULL) return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: params is NULL", op);
  const oss_status st = oss_cross_entropy_probs_check_params(op, &b->fwd);
  if (st != OSS_OK) return st;
  const int64_t rows = b->fwd.rows, classes = b->fwd.classes;
  if (rows > 0 && (b->grad_loss == NULL || b->grad_logits == NULL))
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: grad_loss or grad_logits is NULL", op);
  if (rows > 1 && (b->grad_logits_stride_row < classes || (b->grad_target && b->grad_target_stride_row < classes)))
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT,
                    "%s: grad_logits_stride_row=%lld or grad_target_stride_row=%lld is below classes=%lld", op,
                    (long long)b->grad_logits_stride_row, (long long)b->grad_target_stride_row, (long long)classes);
  return OSS_OK;
}

oss_status oss_cross_entropy_check_params(const char *op, const oss_cross_entropy_params *p) {
  if (p == NULL) return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: params is NULL", op);
  const oss_status common = ce_check_common(op, p->dtype, p->rows, p->classes, p->label_smoothing, p->z_loss);
  if (common != OSS_OK) return common;
  if (p->rows > 0 && (p->logits == NULL || p->target == NULL || p->lse == NULL))
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: logits, target or lse is NULL", op);
  if (p->rows > 1 && p->logits_stride_row < p->classes)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: logits_stride_row=%lld is below classes=%lld", op,
                    (long long)p->logits_stride_row, (long long)p->classes);
  return OSS_OK;
}
