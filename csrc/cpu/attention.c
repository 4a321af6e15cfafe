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

/* ---- variable-length batches (oss.h cu_seqlens_q / cu_seqlens_k) ------------- */

static size_t attention_elem_size(oss_dtype t) {
  return t == OSS_FLOAT64 ? 8 : t == OSS_FLOAT32 ? 4 : 2;
}

static const void *attention_rows_at(const void *base, oss_dtype t, int64_t row, int64_t row_stride) {
  return base == NULL ? NULL : (const char *)base + (size_t)(row * row_stride) * attention_elem_size(t);
}

/* The params of sequence b of a variable-length batch, as one batch entry of
 * its own lengths: pointers moved to its first rows, batch strides 0 (so
 * index b still names it for ALiBi, dropout and the sinks' shares), lse moved
 * to its first column of [heads_q, total_q] (attention_lse_at). Without
 * cu_seqlens, p itself. The values were checked (check_varlen). */
static const oss_attention_params *attention_seq_params(const oss_attention_params *p, int64_t b,
                                                        oss_attention_params *view) {
  if (p->cu_seqlens_q == NULL) return p;
  const int64_t q0 = p->cu_seqlens_q[b], k0 = p->cu_seqlens_k[b];
  *view = *p;
  view->len_q = p->cu_seqlens_q[b + 1] - q0;
  view->len_k = p->cu_seqlens_k[b + 1] - k0;
  view->q = attention_rows_at(p->q, p->dtype, q0, p->q_stride[2]);
  view->k = attention_rows_at(p->k, p->dtype, k0, p->k_stride[2]);
  view->v = attention_rows_at(p->v, p->dtype, k0, p->v_stride[2]);
  view->out = (void *)attention_rows_at(p->out, p->dtype, q0, p->out_stride[2]);
  /* the residual's int8 codes, with out's strides in elements */
  view->out_residual = p->out_residual == NULL ? NULL : (char *)p->out_residual + (size_t)(q0 * p->out_stride[2]);
  view->lse = (char *)p->lse + (size_t)q0 * (p->dtype == OSS_FLOAT64 ? 8 : 4);
  view->q_stride[0] = view->k_stride[0] = view->v_stride[0] = view->out_stride[0] = 0;
  return view;
}

/* The backward's params of sequence b (attention_seq_params, and the
 * gradients' pointers moved alike). */
static const oss_attention_backward_params *attention_seq_backward_params(const oss_attention_backward_params *bp,
                                                                          int64_t b,
                                                                          oss_attention_backward_params *view) {
  if (bp->fwd.cu_seqlens_q == NULL) return bp;
  *view = *bp;
  attention_seq_params(&bp->fwd, b, &view->fwd);
  const oss_dtype t = bp->fwd.dtype;
  const int64_t q0 = bp->fwd.cu_seqlens_q[b], k0 = bp->fwd.cu_seqlens_k[b];
  view->dout = attention_rows_at(bp->dout, t, q0, bp->dout_stride[2]);
  view->dq = (void *)attention_rows_at(bp->dq, t, q0, bp->dq_stride[2]);
  view->dk = (void *)attention_rows_at(bp->dk, t, k0, bp->dk_stride[2]);
  view->dv = (void *)attention_rows_at(bp->dv, t, k0, bp->dv_stride[2]);
  if (bp->dlse != NULL) view->dlse = (const char *)bp->dlse + (size_t)q0 * (t == OSS_FLOAT64 ? 8 : 4);
  view->dout_stride[0] = view->dq_stride[0] = view->dk_stride[0] = view->dv_stride[0] = 0;
  return view;
}

/* Offset in lse of row 0 of (b, h): [batch, heads_q, len_q], or with
 * cu_seqlens [heads_q, total_q] from the sequence's first column (p a
 * sequence's params). */
static int64_t attention_lse_at(const oss_attention_params *p, int64_t b, int64_t h) {
  return p->cu_seqlens_q != NULL ? h * p->total_q : (b * p->heads_q + h) * p->len_q;
}

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

/* The variable-length fields (oss.h): both or neither, no mask or KV cache,
 * and every sequence inside the packed tensors and the length bounds. */
static oss_status check_varlen(const char *op, const oss_attention_params *p) {
  if (p->cu_seqlens_q == NULL && p->cu_seqlens_k == NULL) return OSS_OK;
  if (p->cu_seqlens_q == NULL || p->cu_seqlens_k == NULL)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: cu_seqlens_q and cu_seqlens_k must be given together", op);
  if (p->mask_kind != OSS_MASK_NONE || p->seqlens_k != NULL || p->block_table != NULL)
    return oss_fail(OSS_ERROR_NOT_SUPPORTED, "%s: cu_seqlens do not combine with a mask or the KV-cache fields", op);
  const struct {
    const char *name;
    const int32_t *cu;
    int64_t total, bound;
  } sides[2] = {{"cu_seqlens_q", p->cu_seqlens_q, p->total_q, p->len_q},
                {"cu_seqlens_k", p->cu_seqlens_k, p->total_k, p->len_k}};
  for (int s = 0; s < 2; s++) {
    if (sides[s].cu[0] < 0 || sides[s].cu[0] > sides[s].total)
      return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: %s[0]=%d is outside [0, %lld] (the packed rows)", op,
                      sides[s].name, (int)sides[s].cu[0], (long long)sides[s].total);
    for (int64_t b = 0; b < p->batch; b++) {
      const int64_t lo = sides[s].cu[b], hi = sides[s].cu[b + 1];
      if (hi < lo || hi > sides[s].total)
        return oss_fail(OSS_ERROR_INVALID_ARGUMENT,
                        "%s: %s[%lld]=%lld must be in [%s[%lld]=%lld, %lld] (nondecreasing, within the packed rows)",
                        op, sides[s].name, (long long)(b + 1), (long long)hi, sides[s].name, (long long)b,
                        (long long)lo, (long long)sides[s].total);
      if (hi - lo > sides[s].bound)
        return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: sequence %lld has %lld %s, more than the bound %s=%lld", op,
                        (long long)b, (long long)(hi - lo), s == 0 ? "query rows" : "keys",
                        s == 0 ? "max_seqlen_q" : "max_seqlen_k", (long long)sides[s].bound);
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
  const oss_status st = check_varlen(op, p);
  return st != OSS_OK ? st : check_kv_cache(op, p);
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
