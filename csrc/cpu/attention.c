/*
 * attention.c - C11 CPU attention forward (out and lse) and backward (dq, dk,
 * dv from the saved lse) over the [batch, heads, len, dim] views of oss.h.
 *
 * Computes in float for float32/float16/bfloat16 tensors (lse float32) and in
 * double for float64 tensors (lse float64); attention_generic.h holds the
 * algorithm. Threads split (batch, query head, query block) tasks in the
 * forward and (batch, kv head) tasks in the backward; every task writes
 * disjoint outputs in a fixed order, so results are bitwise reproducible and
 * independent of the thread count. Each task allocates its own tile scratch
 * (O(tile) in the forward, O(len_k * head_dim) in the backward). The
 * forward also reads paged caches and per-batch key counts (oss.h's KV-cache
 * fields). Both directions serve the score variants (sliding window,
 * softcap, ALiBi, sinks and the sinks' gradient), skipping the key tiles a
 * window hides, and dropout (oss_internal.h's rule, regenerated in the
 * backward).
 */
#include <stdlib.h>

#include "cpu_common.h"

/* Tiles: OSS_BR query rows by OSS_BC keys; the tile product's register
 * block is 4 rows by 64 bytes of columns. */
enum { OSS_BR = 32, OSS_BC = 64 };

#define OSS_GENERIC_BODY "attention_generic.h"
#include "cpu_precisions.h"

/* ---- validation ------------------------------------------------------------------ */

/* The KV-cache fields (oss.h): every length in [0, len_k] and every page a
 * batch's keys use inside [0, num_pages). */
static oss_status check_kv_cache(const char *op, const oss_attention_params *p) {
  if (p->block_table != NULL &&
      (p->page_size < 1 || p->num_pages < 0 || p->block_table_stride < 1 ||
       p->len_k > p->block_table_stride * p->page_size))
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT,
                    "%s: a paged cache needs page_size >= 1 (got %lld), num_pages >= 0 (got %lld) and len_k=%lld "
                    "<= block_table_stride=%lld * page_size",
                    op, (long long)p->page_size, (long long)p->num_pages, (long long)p->len_k,
                    (long long)p->block_table_stride);
  for (int64_t b = 0; b < p->batch; b++) {
    const int64_t keys = p->seqlens_k != NULL ? p->seqlens_k[b] : p->len_k;
    if (keys < 0 || keys > p->len_k)
      return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: seqlens_k[%lld]=%lld is outside [0, %lld]", op, (long long)b,
                      (long long)keys, (long long)p->len_k);
    if (p->block_table == NULL) continue;
    for (int64_t j = 0; j * p->page_size < keys; j++) {
      const int64_t page = p->block_table[b * p->block_table_stride + j];
      if (page < 0 || page >= p->num_pages)
        return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: block_table[%lld][%lld]=%lld is outside [0, %lld)", op,
                        (long long)b, (long long)j, (long long)page, (long long)p->num_pages);
    }
  }
  return OSS_OK;
}

static oss_status check_params(const char *op, const oss_attention_params *p) {
  if (p->dtype != OSS_FLOAT32 && p->dtype != OSS_FLOAT64 && p->dtype != OSS_FLOAT16 && p->dtype != OSS_BFLOAT16)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: dtype code %d is not a floating type", op, (int)p->dtype);
  if (p->batch < 0 || p->heads_q < 1 || p->heads_kv < 1 || p->len_q < 0 || p->len_k < 0 || p->head_dim < 1 ||
      p->head_dim_v < 1)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT,
                    "%s: sizes batch=%lld heads_q=%lld heads_kv=%lld len_q=%lld len_k=%lld head_dim=%lld "
                    "head_dim_v=%lld are out of range",
                    op, (long long)p->batch, (long long)p->heads_q, (long long)p->heads_kv, (long long)p->len_q,
                    (long long)p->len_k, (long long)p->head_dim, (long long)p->head_dim_v);
  if (p->heads_q % p->heads_kv != 0)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: heads_q=%lld is not a multiple of heads_kv=%lld", op,
                    (long long)p->heads_q, (long long)p->heads_kv);
  if (p->mask_kind == OSS_MASK_BOOL && p->mask_dtype != OSS_BOOL)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: a boolean mask must have dtype bool", op);
  if (p->mask_kind == OSS_MASK_ADDITIVE && p->mask_dtype == OSS_BOOL)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: an additive mask must have a floating dtype", op);
  if (p->mask_kind != OSS_MASK_NONE && p->mask == NULL)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: mask_kind is set but mask is NULL", op);
  if (p->scale != p->scale)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: scale is NaN", op);
  if (!(p->softcap >= 0) || p->softcap == INFINITY)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: softcap=%g must be finite and >= 0 (0: off)", op, p->softcap);
  if (p->window && p->window_diagonal != OSS_CAUSAL_NONE && p->window_diagonal != OSS_CAUSAL_TOP_LEFT &&
      p->window_diagonal != OSS_CAUSAL_BOTTOM_RIGHT)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: window_diagonal code %d is not an oss_causal", op,
                    (int)p->window_diagonal);
  if (p->alibi_slopes != NULL && p->alibi_stride_batch < 0)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: alibi_stride_batch=%lld must be >= 0", op,
                    (long long)p->alibi_stride_batch);
  if (p->out_residual != NULL && p->dtype != OSS_FLOAT16 && p->dtype != OSS_BFLOAT16)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: out_residual is only for float16/bfloat16 (dtype code %d)", op,
                    (int)p->dtype);
  if (!(p->dropout_p >= 0 && p->dropout_p <= 1))
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: dropout_p=%g must be in [0, 1]", op, p->dropout_p);
  if (p->dropout_p > 0 && p->dropout_seed == NULL)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: dropout_p > 0 needs dropout_seed", op);
  if (p->dropout_p > 0 && (p->seqlens_k != NULL || p->block_table != NULL))
    return oss_fail(OSS_ERROR_NOT_SUPPORTED, "%s: dropout is not supported with the KV-cache fields", op);
  return check_kv_cache(op, p);
}

oss_status oss_attention_forward_cpu(const oss_attention_params *p, const oss_cpu_exec *exec) {
  oss_status st = check_params("attention", p);
  if (st != OSS_OK) return st;
  const int64_t qblocks = (p->len_q + OSS_BR - 1) / OSS_BR;
  const int64_t tasks = p->batch * p->heads_q * qblocks;
  if (p->dtype == OSS_FLOAT64) {
    attention_task_ctx_f64 ctx = {.params = p, .dsink_partial = NULL, .failed = 0};
    oss_cpu_parallel_for(exec, tasks, 1, &ctx, attention_fwd_range_f64);
    if (ctx.failed) return oss_fail(OSS_ERROR_OUT_OF_MEMORY, "attention: out of host memory for tile scratch");
  } else {
    attention_task_ctx_f32 ctx = {.params = p, .dsink_partial = NULL, .failed = 0};
    oss_cpu_parallel_for(exec, tasks, 1, &ctx, attention_fwd_range_f32);
    if (ctx.failed) return oss_fail(OSS_ERROR_OUT_OF_MEMORY, "attention: out of host memory for tile scratch");
  }
  return OSS_OK;
}

oss_status oss_attention_backward_cpu(const oss_attention_backward_params *bp, const oss_cpu_exec *exec) {
  oss_status st = check_params("attention_backward", &bp->fwd);
  if (st != OSS_OK) return st;
  if (bp->fwd.seqlens_k != NULL || bp->fwd.block_table != NULL)
    return oss_fail(OSS_ERROR_NOT_SUPPORTED, "attention_backward: the KV-cache fields are for the forward only");
  if (bp->keys_subset && bp->fwd.dropout_p > 0)
    return oss_fail(OSS_ERROR_NOT_SUPPORTED, "attention_backward: dropout is not supported with keys_subset");
  const int64_t tasks = bp->fwd.batch * bp->fwd.heads_kv;
  /* d sink: each task leaves its (batch, query head) shares here; summed over
   * the batch below, in a fixed order (deterministic, any thread count) */
  const int want_dsinks = bp->fwd.sinks != NULL && bp->dsinks != NULL;
  double *partial = NULL;
  if (want_dsinks && bp->fwd.batch > 0) {
    partial = (double *)calloc((size_t)(bp->fwd.batch * bp->fwd.heads_q), sizeof(double));
    if (partial == NULL)
      return oss_fail(OSS_ERROR_OUT_OF_MEMORY, "attention_backward: out of host memory for the sinks' gradient");
  }
  int failed;
  if (bp->fwd.dtype == OSS_FLOAT64) {
    attention_task_ctx_f64 ctx = {.params = bp, .dsink_partial = partial, .failed = 0};
    oss_cpu_parallel_for(exec, tasks, 1, &ctx, attention_bwd_range_f64);
    failed = ctx.failed;
  } else {
    attention_task_ctx_f32 ctx = {.params = bp, .dsink_partial = partial, .failed = 0};
    oss_cpu_parallel_for(exec, tasks, 1, &ctx, attention_bwd_range_f32);
    failed = ctx.failed;
  }
  if (!failed && want_dsinks)
    for (int64_t h = 0; h < bp->fwd.heads_q; h++) {
      double sum = 0;
      for (int64_t b = 0; b < bp->fwd.batch; b++) sum += partial[b * bp->fwd.heads_q + h];
      bp->dsinks[h] = (float)sum;
    }
  free(partial);
  if (failed) return oss_fail(OSS_ERROR_OUT_OF_MEMORY, "attention_backward: out of host memory for tile scratch");
  return OSS_OK;
}
