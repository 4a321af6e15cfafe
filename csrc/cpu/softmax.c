/*
 * softmax.c - C11 CPU softmax and log_softmax, forward and backward, over the
 * [outer, n, inner] view of oss.h.
 *
 * Computes in float for float32/float16/bfloat16 tensors and in double for
 * float64 ones (softmax_generic.h is instantiated for both). Threads split the
 * rows (inner == 1) or the (outer, column-block) pairs (inner > 1); each task
 * owns disjoint outputs, so results do not depend on the thread count.
 * Limits: float64 must be used for both input and output (the registration
 * layer casts otherwise).
 */
#include "cpu_common.h"

enum { OSS_ROW_CHUNK = 4096, OSS_COL_BLOCK = 64, OSS_COL_CHUNK = 16, OSS_SUM_BLOCK = 64 };

#define OSS_GENERIC_BODY "softmax_generic.h"
#include "cpu_precisions.h"

/* ---- validation ------------------------------------------------------------ */

static int is_float_dtype(oss_dtype t) {
  return t == OSS_FLOAT32 || t == OSS_FLOAT64 || t == OSS_FLOAT16 || t == OSS_BFLOAT16;
}

static oss_status check_view(const char *op, const char *name, int64_t outer, int64_t n, int64_t inner,
                             const oss_strided3 *t) {
  if (!is_float_dtype(t->dtype))
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: %s has dtype code %d, expected a floating type", op,
                    name, (int)t->dtype);
  if (outer < 0 || n < 0 || inner < 1)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT,
                    "%s: view [outer=%lld, n=%lld, inner=%lld] needs outer, n >= 0 and inner >= 1", op,
                    (long long)outer, (long long)n, (long long)inner);
  if (inner == 1 && n > 1 && t->stride_n != 1)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: %s.stride_n=%lld but rows (inner == 1) must be contiguous",
                    op, name, (long long)t->stride_n);
  if (outer * n * inner > 0 && t->data == NULL)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: %s.data is NULL", op, name);
  return OSS_OK;
}

#define OSS_TRY(expr)                 \
  do {                                \
    oss_status oss_st_ = (expr);      \
    if (oss_st_ != OSS_OK) return oss_st_; \
  } while (0)

/* ---- entry points ------------------------------------------------------------ */

oss_status oss_softmax_forward_cpu(const oss_softmax_params *p, const oss_cpu_exec *exec) {
  const char *op = p->log ? "log_softmax" : "softmax";
  OSS_TRY(check_view(op, "x", p->outer, p->n, p->inner, &p->x));
  OSS_TRY(check_view(op, "y", p->outer, p->n, p->inner, &p->y));
  if ((p->x.dtype == OSS_FLOAT64) != (p->y.dtype == OSS_FLOAT64))
    return oss_fail(OSS_ERROR_NOT_SUPPORTED, "%s: float64 must be both the input and the output dtype", op);
  if (p->outer == 0 || p->n == 0) return OSS_OK;
  const int f64 = p->x.dtype == OSS_FLOAT64;
  void *ctx = (void *)p;
  if (p->inner == 1) {
    const int64_t grain = p->n >= 16384 ? 1 : 16384 / p->n;
    oss_cpu_parallel_for(exec, p->outer, grain, ctx, f64 ? softmax_fwd_rows_f64 : softmax_fwd_rows_f32);
  } else {
    const int64_t tasks = p->outer * ((p->inner + OSS_COL_BLOCK - 1) / OSS_COL_BLOCK);
    const int64_t per_task = p->n * OSS_COL_BLOCK;
    const int64_t grain = per_task >= 16384 ? 1 : 16384 / per_task;
    oss_cpu_parallel_for(exec, tasks, grain, ctx, f64 ? softmax_fwd_cols_f64 : softmax_fwd_cols_f32);
  }
  return OSS_OK;
}

oss_status oss_softmax_backward_cpu(const oss_softmax_backward_params *p, const oss_cpu_exec *exec) {
  const char *op = p->log ? "log_softmax_backward" : "softmax_backward";
  OSS_TRY(check_view(op, "y", p->outer, p->n, p->inner, &p->y));
  OSS_TRY(check_view(op, "dy", p->outer, p->n, p->inner, &p->dy));
  OSS_TRY(check_view(op, "dx", p->outer, p->n, p->inner, &p->dx));
  const int f64 = p->y.dtype == OSS_FLOAT64;
  if (f64 != (p->dy.dtype == OSS_FLOAT64) || f64 != (p->dx.dtype == OSS_FLOAT64))
    return oss_fail(OSS_ERROR_NOT_SUPPORTED, "%s: float64 must be the dtype of y, dy and dx together", op);
  if (p->outer == 0 || p->n == 0) return OSS_OK;
  void *ctx = (void *)p;
  if (p->inner == 1) {
    const int64_t grain = p->n >= 16384 ? 1 : 16384 / p->n;
    oss_cpu_parallel_for(exec, p->outer, grain, ctx, f64 ? softmax_bwd_rows_f64 : softmax_bwd_rows_f32);
  } else {
    const int64_t tasks = p->outer * ((p->inner + OSS_COL_BLOCK - 1) / OSS_COL_BLOCK);
    const int64_t per_task = p->n * OSS_COL_BLOCK;
    const int64_t grain = per_task >= 16384 ? 1 : 16384 / per_task;
    oss_cpu_parallel_for(exec, tasks, grain, ctx, f64 ? softmax_bwd_cols_f64 : softmax_bwd_cols_f32);
  }
  return OSS_OK;
}
