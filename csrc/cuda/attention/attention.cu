/*
 * attention.cu - CUDA entry points of the attention section of oss.h:
 * argument validation, workspace sizing and dispatch.
 *
 * Dispatch: float32/float64 go to the SIMT kernels (attention_simt.cu).
 * float16/bfloat16 go to the tensor-core kernels generated per compiled head
 * dim (generate_attention_kernels.py -> generated/attention_dispatch.cu): the
 * smallest compiled head dim >= max(D, Dv) is used, the extra columns being
 * zero padding in shared memory. Each table entry has a slot per forward
 * kernel family (mma.sync for sm_80+; wgmma for sm_90a: forward at head dims 64, 128
 * and 256, backward at 64 and 128);
 * the selection takes the most specific family compiled for the device.
 *
 * Forward, few query rows (decode) and KV-cache calls: the split-KV kernel
 * (mma/attention_decode.cuh; plan and split rule below), compiled per head dim
 * of DECODE_HEAD_DIMS in the generator. It serves the score variants other
 * than dropout (window, softcap, ALiBi, sinks; a runtime branch of the one
 * kernel), their distances measured from a diagonal that follows each
 * batch's seqlens_k where it is bottom-right (a.var_bottom_right).
 *
 * Forward, tensor cores: with params->out_residual, the epilogue also writes
 * out's rounding residual (oss_attn_fwd_write).
 *
 * Dropout (params->dropout_p > 0) counts as a score variant: such calls run
 * the VAR kernels (mma.sync, and wgmma where compiled) or the SIMT kernels,
 * not the decode kernel; they draw the kept weights by oss_internal.h's
 * Philox rule from the seed in device memory (read by the kernels, never
 * here). Not with the KV-cache fields; the backward not with keys_subset.
 *
 * Variable-length batches (params->cu_seqlens_q / cu_seqlens_k): every
 * kernel but the decode one serves them, each block first turning the
 * arguments into its sequence's (oss_attn_seq_view: rows, lengths, diagonals
 * from the device-side offsets, clamped into the packed tensors). The
 * tensor-core kernels number their blocks by slots of the packed rows
 * (oss_attn_seq_slots: about total / block rows + batch per head, with no
 * host read of the offsets); the SIMT kernels' grids and the workspaces
 * follow the length bounds len_q / len_k, and blocks past a shorter sequence
 * return at once.
 *
 * Backward, tensor cores: a pre-pass computes D = rowsum(dO * O) (O plus its
 * rounding residual when given, so D carries no rounding of out) and the lse
 * in kernel units (workspace); the default mode also zeroes a float32 dQ
 * accumulator that the dK/dV kernel adds into with atomics and a last pass
 * converts into dq. These rows (oss_attn_ws_row) are [B*Hq][Lq padded], or
 * in a variable-length batch laid out by the tokens. Deterministic mode
 * orders the Hopper backward's additions by counters, or else computes dQ
 * in its own kernel without atomics, as the Hopper backward above head dim
 * 128 does in either mode (oss_attn_bwd_dq_query_major). dQ is centred: computed as
 * dS (K - kbar) with kbar the kv head's mean K row (attention_bwd.cuh), which
 * a pass before the kernels writes to the workspace. float32 /
 * float64: the SIMT dQ kernel recomputes the row statistics itself
 * (attention_simt.cu).
 */
#include <limits.h>
#include <pthread.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/attention/attention_common.cuh"

static size_t oss_attn_elem_size(oss_dtype t) {
  switch (t) {
  case OSS_FLOAT64: return 8;
  case OSS_FLOAT32: return 4;
  case OSS_BOOL: return 1;
  default: return 2;
  }
}

static bool oss_attn_is_tc(oss_dtype t) { return t == OSS_FLOAT16 || t == OSS_BFLOAT16; }

/* Rows start on 16-byte boundaries: pointer and the strides of dims longer than 1. */
static bool oss_attn_rows_aligned(const void *ptr, const int64_t s[3], const int64_t n[3], size_t esize) {
  if (((uintptr_t)ptr) % 16 != 0) return false;
  for (int i = 0; i < 3; i++)
    if (n[i] > 1 && ((s[i] * (int64_t)esize) % 16) != 0) return false;
  return true;
}

/* The compiled entry for this dtype with the smallest head dim >= need that
 * has some backward (backward != 0) or forward kernel family. */
static const oss_attn_kernel_entry *oss_attn_find(oss_dtype dtype, int64_t need, int backward) {
  const oss_attn_kernel_entry *best = NULL;
  for (int i = 0; i < oss_attn_kernel_table_len; i++) {
    const oss_attn_kernel_entry *e = &oss_attn_kernel_table[i];
    if (e->dtype != dtype || e->head_dim < need) continue;
    const oss_attn_launch_fn *fns = backward ? e->bwd : e->fwd;
    int has = 0;
    for (int f = 0; f < OSS_ATTN_FAMILIES; f++) has |= fns[f] != NULL;
    if (has && (best == NULL || e->head_dim < best->head_dim)) best = e;
  }
  return best;
}

/* Whether environment variable `name` is set to `value`. */
static bool oss_attn_env_is(const char *name, const char *value) {
  const char *v = getenv(name);
  return v != NULL && strcmp(v, value) == 0;
}

/* The kernel choices of oss.h, read from the environment once per process. */
static oss_attention_cuda_options oss_attn_options;
static pthread_once_t oss_attn_options_once = PTHREAD_ONCE_INIT;

static void oss_attn_options_from_env(void) {
  oss_attn_options.forward_mma_only = oss_attn_env_is("TORCH_OSS_ATTENTION_FORWARD", "mma");
  oss_attn_options.backward_mma_only = oss_attn_env_is("TORCH_OSS_ATTENTION_BACKWARD", "mma");
  oss_attn_options.dq_centring = !oss_attn_env_is("TORCH_OSS_ATTENTION_DQ_CENTRING", "0");
  oss_attn_options.decode_splits = 0;
  oss_attn_options.forward_ctas_per_sm = 0;
  oss_attn_options.forward_block_rows = 0;
}

static const oss_attention_cuda_options *oss_attn_opts(void) {
  pthread_once(&oss_attn_options_once, oss_attn_options_from_env);
  return &oss_attn_options;
}

oss_attention_cuda_options oss_attention_cuda_get_options(void) { return *oss_attn_opts(); }

void oss_attention_cuda_set_options(const oss_attention_cuda_options *options) {
  oss_attn_opts();
  if (options != NULL) oss_attn_options = *options;
}

/* Kernel family for the device: the Hopper (wgmma) kernel on sm_90 where it is
 * compiled for the head dim, else mma.sync (also where the options ask for
 * it, so that kernel stays testable and comparable on Hopper). */
static oss_attn_launch_fn oss_attn_select(const oss_attn_launch_fn fns[OSS_ATTN_FAMILIES],
                                          const oss_device_info *dev, bool backward) {
  const oss_attention_cuda_options *o = oss_attn_opts();
  const bool mma_only = backward ? o->backward_mma_only : o->forward_mma_only;
  if (!mma_only && dev->cc_major == 9 && dev->cc_minor == 0 && fns[OSS_ATTN_SM90] != NULL)
    return fns[OSS_ATTN_SM90];
  return fns[OSS_ATTN_MMA];
}

static int64_t oss_attn_max_dim(oss_dtype dtype) {
  return oss_attn_is_tc(dtype) ? oss_attention_cuda_max_head_dim() : 256;
}

/* The score variants, dropout among them: they run in the VAR kernels. */
static bool oss_attn_has_variants(const oss_attention_params *p) {
  return p->window || p->softcap != 0.0 || p->alibi_slopes != NULL || p->sinks != NULL || p->dropout_p > 0.0;
}

static oss_status oss_attn_validate(const oss_attention_params *p) {
  if (p == NULL) return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention: params is NULL");
  if (p->dtype != OSS_FLOAT16 && p->dtype != OSS_BFLOAT16 && p->dtype != OSS_FLOAT32 && p->dtype != OSS_FLOAT64)
    return oss_fail(OSS_ERROR_NOT_SUPPORTED,
                    "attention: params->dtype=%d but CUDA attention supports float16, bfloat16, float32 and float64",
                    (int)p->dtype);
  if (!(p->dropout_p >= 0.0 && p->dropout_p <= 1.0)) /* NaN fails too */
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention: params->dropout_p=%g must be in [0, 1]", p->dropout_p);
  if (p->dropout_p > 0.0 && p->dropout_seed == NULL)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention: params->dropout_seed is NULL but params->dropout_p=%g",
                    p->dropout_p);
  if (p->dropout_p > 0.0 && (p->seqlens_k != NULL || p->block_table != NULL))
    return oss_fail(OSS_ERROR_NOT_SUPPORTED,
                    "attention: params->dropout_p=%g is not supported with the KV-cache fields on CUDA",
                    p->dropout_p);
  if (p->alibi_slopes != NULL && p->alibi_stride_batch < 0)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention: params->alibi_stride_batch=%lld must be >= 0",
                    (long long)p->alibi_stride_batch);
  if (!(p->softcap >= 0.0) || !isfinite(p->softcap))
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention: params->softcap=%g must be finite and >= 0", p->softcap);
  const struct {
    const char *name;
    int64_t v;
  } sizes[5] = {{"batch", p->batch}, {"heads_q", p->heads_q}, {"heads_kv", p->heads_kv}, {"len_q", p->len_q},
                {"len_k", p->len_k}};
  for (int i = 0; i < 5; i++) {
    if (sizes[i].v < 0)
      return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention: params->%s=%lld must be >= 0", sizes[i].name,
                      (long long)sizes[i].v);
    if (sizes[i].v > INT_MAX - 1024)
      return oss_fail(OSS_ERROR_NOT_SUPPORTED, "attention: params->%s=%lld exceeds the supported %d",
                      sizes[i].name, (long long)sizes[i].v, INT_MAX - 1024);
  }
  if (p->heads_q > 0 && p->heads_kv < 1)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention: params->heads_kv=%lld must be >= 1",
                    (long long)p->heads_kv);
  if (p->heads_kv > 0 && p->heads_q % p->heads_kv != 0)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT,
                    "attention: params->heads_q=%lld must be a multiple of params->heads_kv=%lld",
                    (long long)p->heads_q, (long long)p->heads_kv);
  const int64_t maxd = oss_attn_max_dim(p->dtype);
  if (p->head_dim < 1 || p->head_dim > maxd)
    return oss_fail(p->head_dim < 1 ? OSS_ERROR_INVALID_ARGUMENT : OSS_ERROR_NOT_SUPPORTED,
                    "attention: params->head_dim=%lld but this build supports head dims 1 to %lld",
                    (long long)p->head_dim, (long long)maxd);
  if (p->head_dim_v < 1 || p->head_dim_v > maxd)
    return oss_fail(p->head_dim_v < 1 ? OSS_ERROR_INVALID_ARGUMENT : OSS_ERROR_NOT_SUPPORTED,
                    "attention: params->head_dim_v=%lld but this build supports head dims 1 to %lld",
                    (long long)p->head_dim_v, (long long)maxd);
  if (p->causal != OSS_CAUSAL_NONE && p->causal != OSS_CAUSAL_TOP_LEFT && p->causal != OSS_CAUSAL_BOTTOM_RIGHT)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention: params->causal=%d is not an oss_causal value",
                    (int)p->causal);
  if (!isfinite(p->scale))
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention: params->scale=%g must be finite", p->scale);
  if (p->mask_kind != OSS_MASK_NONE) {
    if (p->mask_kind != OSS_MASK_BOOL && p->mask_kind != OSS_MASK_ADDITIVE)
      return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention: params->mask_kind=%d is not an oss_mask_kind value",
                      (int)p->mask_kind);
    if (p->mask_kind == OSS_MASK_BOOL && p->mask_dtype != OSS_BOOL)
      return oss_fail(OSS_ERROR_INVALID_ARGUMENT,
                      "attention: params->mask_dtype=%d but a bool mask (mask_kind=OSS_MASK_BOOL) must be OSS_BOOL",
                      (int)p->mask_dtype);
    if (p->mask_kind == OSS_MASK_ADDITIVE && p->mask_dtype != p->dtype && p->mask_dtype != OSS_FLOAT32)
      return oss_fail(OSS_ERROR_INVALID_ARGUMENT,
                      "attention: params->mask_dtype=%d but an additive mask must have the inputs' dtype (%d) or "
                      "float32",
                      (int)p->mask_dtype, (int)p->dtype);
  }
  const int64_t nq = p->batch * p->heads_q * p->len_q, nkv = p->batch * p->heads_kv * p->len_k;
  if (nq > 0 && p->q == NULL) return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention: params->q is NULL");
  if (nq > 0 && p->out == NULL) return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention: params->out is NULL");
  if (nq > 0 && p->lse == NULL) return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention: params->lse is NULL");
  if (p->out_residual != NULL && !oss_attn_is_tc(p->dtype))
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention: params->out_residual is only for float16/bfloat16");
  if (nkv > 0 && p->k == NULL) return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention: params->k is NULL");
  if (nkv > 0 && p->v == NULL) return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention: params->v is NULL");
  if (nq > 0 && nkv > 0 && p->mask_kind != OSS_MASK_NONE && p->mask == NULL)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention: params->mask is NULL but mask_kind is %d",
                    (int)p->mask_kind);
  if (p->block_table != NULL) {
    if (p->page_size < 1 || p->page_size > INT_MAX || p->num_pages < 0 || p->num_pages > INT_MAX ||
        p->block_table_stride < 1 || p->len_k > p->block_table_stride * p->page_size)
      return oss_fail(OSS_ERROR_INVALID_ARGUMENT,
                      "attention: a paged cache needs page_size >= 1 (got %lld), num_pages >= 0 (got %lld) and "
                      "len_k=%lld <= block_table_stride=%lld * page_size",
                      (long long)p->page_size, (long long)p->num_pages, (long long)p->len_k,
                      (long long)p->block_table_stride);
  }
  if ((p->seqlens_k != NULL || p->block_table != NULL) && !oss_attn_is_tc(p->dtype))
    return oss_fail(OSS_ERROR_NOT_SUPPORTED,
                    "attention: the KV-cache fields (seqlens_k, block_table) need float16 or bfloat16 inputs on CUDA");
  if ((p->cu_seqlens_q == NULL) != (p->cu_seqlens_k == NULL))
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention: cu_seqlens_q and cu_seqlens_k must be given together");
  if (p->cu_seqlens_q != NULL) {
    if (p->mask_kind != OSS_MASK_NONE || p->seqlens_k != NULL || p->block_table != NULL)
      return oss_fail(OSS_ERROR_NOT_SUPPORTED,
                      "attention: cu_seqlens do not combine with a mask or the KV-cache fields");
    if (p->total_q < 0 || p->total_k < 0 || p->total_q > INT_MAX - 1024 || p->total_k > INT_MAX - 1024)
      return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention: params->total_q=%lld and total_k=%lld must be in [0, %d]",
                      (long long)p->total_q, (long long)p->total_k, INT_MAX - 1024);
  }
  return OSS_OK;
}

/* Fills the kernel argument block from the forward params. */
static void oss_attn_fill_args(const oss_attention_params *p, oss_attn_args *a) {
  memset(a, 0, sizeof *a);
  a->batch = (int)p->batch;
  a->hq = (int)p->heads_q;
  a->hkv = (int)p->heads_kv;
  a->group = p->heads_kv > 0 ? (int)(p->heads_q / p->heads_kv) : 1;
  a->lq = (int)p->len_q;
  a->lk = (int)p->len_k;
  a->d = (int)p->head_dim;
  a->dv = (int)p->head_dim_v;
  a->q = p->q;
  a->k = p->k;
  a->v = p->v;
  a->out = p->out;
  a->out_res = p->out_residual;
  a->lse = p->lse;
  for (int i = 0; i < 3; i++) {
    a->q_s[i] = p->q_stride[i];
    a->k_s[i] = p->k_stride[i];
    a->v_s[i] = p->v_stride[i];
    a->o_s[i] = p->out_stride[i];
  }
  a->scale = p->scale;
  a->scale_log2 = (float)(p->scale * OSS_LOG2E);
  a->causal = p->causal != OSS_CAUSAL_NONE;
  a->causal_off = p->causal == OSS_CAUSAL_BOTTOM_RIGHT ? p->len_k - p->len_q : 0;
  a->mask_kind = p->mask_kind;
  a->mask_dtype = p->mask_dtype;
  a->mask = p->mask;
  for (int i = 0; i < 4; i++) a->m_s[i] = p->mask_stride[i];
  a->seqlens_k = p->seqlens_k;
  a->block_table = p->block_table;
  a->bt_stride = p->block_table_stride;
  a->page_size = (int)p->page_size;
  a->num_pages = (int)p->num_pages;
  a->causal_bottom_right = p->causal == OSS_CAUSAL_BOTTOM_RIGHT;
  a->win_left = a->win_right = -1;
  if (oss_attn_has_variants(p)) {
    a->variants = 1;
    a->var_off = p->window_diagonal == OSS_CAUSAL_BOTTOM_RIGHT || p->causal == OSS_CAUSAL_BOTTOM_RIGHT
                     ? p->len_k - p->len_q
                     : 0;
    if (p->window) {
      a->win_left = p->window_left < 0 ? -1 : p->window_left;
      a->win_right = p->window_right < 0 ? -1 : p->window_right;
    }
    a->softcap_l2 = (float)(p->softcap * OSS_LOG2E);
    a->softcap = p->softcap;
    a->alibi = p->alibi_slopes;
    a->alibi_sb = p->alibi_stride_batch;
    a->sinks = p->sinks;
  }
  if (p->cu_seqlens_q != NULL) { /* packed rows: every batch stride 0 (oss_attn_seq_view) */
    a->cu_q = p->cu_seqlens_q;
    a->cu_k = p->cu_seqlens_k;
    a->total_q = p->total_q;
    a->total_k = p->total_k;
    a->var_bottom_right = a->variants && (p->window_diagonal == OSS_CAUSAL_BOTTOM_RIGHT ||
                                          p->causal == OSS_CAUSAL_BOTTOM_RIGHT);
    a->q_s[0] = a->k_s[0] = a->v_s[0] = a->o_s[0] = 0;
  }
  if (p->dropout_p > 0.0) { /* the seed stays in device memory: the kernels read it */
    a->drop_seed = p->dropout_seed;
    a->drop_thr = oss_dropout_threshold(p->dropout_p);
    a->drop_scale64 = oss_dropout_scale(p->dropout_p);
    a->drop_scale = (float)a->drop_scale64;
  }
  const size_t es = oss_attn_elem_size(p->dtype);
  /* a paged cache's first dim is its pages, and a page holds page_size rows */
  const int64_t nq[3] = {p->batch, p->heads_q, p->cu_seqlens_q ? p->total_q : p->len_q},
                nk[3] = {p->block_table ? p->num_pages : p->batch, p->heads_kv,
                         p->block_table ? p->page_size : (p->cu_seqlens_k ? p->total_k : p->len_k)};
  if (oss_attn_rows_aligned(p->q, p->q_stride, nq, es)) a->vec |= OSS_ATTN_VEC_Q;
  if (oss_attn_rows_aligned(p->k, p->k_stride, nk, es)) a->vec |= OSS_ATTN_VEC_K;
  if (oss_attn_rows_aligned(p->v, p->v_stride, nk, es)) a->vec |= OSS_ATTN_VEC_V;
  if (oss_attn_rows_aligned(p->out, p->out_stride, nq, es)) a->vec |= OSS_ATTN_VEC_O;
  if (oss_attn_rows_aligned(p->out_residual, p->out_stride, nq, 1)) a->vec |= OSS_ATTN_VEC_OR; /* int8 codes */
}

static size_t oss_attn_round256(size_t bytes) { return (bytes + 255) / 256 * 256; }

/* ---- split-KV decode -----------------------------------------------------------
 * Calls with few query rows per head (len_q <= OSS_ATTN_DEC_MAX_LQ) and every
 * KV-cache call run attention_decode.cuh, where the rows of q, k and v are
 * 16-byte aligned and batch * kv heads fits a grid dim.
 * Split rule: a CTA owns 16 packed rows of one (batch, kv head), and the
 * `base` CTAs of one split are batch x kv heads x row tiles. Short keys
 * stream fastest with about one CTA per SM (sm_count / base splits): fewer,
 * longer CTAs beat more, shorter ones there, even with a free merge; up to 8
 * splits whose CTAs fit the SMs merge in a cluster (sm_90; no workspace, no
 * combine kernel), and where a CTA per SM would take more than 8 splits but
 * 8 splits keep at most OSS_ATTN_DEC_CLUSTER_TILES key tiles each, 8 in a
 * cluster win over more through the combine kernel. Where a split would then
 * hold more than OSS_ATTN_DEC_LONG_TILES tiles, and for paged caches (whose
 * row-table copies need more CTAs in flight), the splits fill a full wave
 * (SMs times the CTAs an SM holds at the kernel's shared memory) and merge
 * through the workspace. Each split keeps at least OSS_ATTN_DEC_MIN_TILES key
 * tiles, or OSS_ATTN_DEC_MIN_TILES_BUSY where the unsplit CTAs already fill a
 * quarter of the SMs (there a split's fixed costs outweigh what it gains), and
 * there are at most OSS_ATTN_DEC_MAX_SPLITS. The key tiles are then dealt out
 * evenly. A forced split count (oss_attn_options) takes the same merge rule.
 * The keys split are len_k (a cache's capacity) or, with a window, the most
 * that the rows of one CTA can see (oss_attn_dec_span; the kernel splits each
 * CTA's keys from the first one its rows see), never the device-side
 * seqlens_k, so a shape always gets the same plan. A split can still find no
 * key (a shorter sequence, a window that ends early): it writes an empty
 * partial, which the merge weighs 0.
 * Variants: all but dropout (drop_seed), which stays with the VAR kernels. */
#define OSS_ATTN_DEC_MIN_TILES 2
#define OSS_ATTN_DEC_MIN_TILES_BUSY 8
#define OSS_ATTN_DEC_CLUSTER_TILES 8
#define OSS_ATTN_DEC_LONG_TILES 64

typedef struct oss_attn_dec_plan {
  const oss_attn_kernel_entry *entry; /* NULL: the call does not run the decode kernel */
  int splits, tiles;                  /* key splits of `tiles` key tiles each */
  int cluster;                        /* the splits merge in a cluster: no workspace, no combine kernel */
  size_t off_lse, bytes;              /* workspace: partial outputs, then their lse */
} oss_attn_dec_plan;

static bool oss_attn_kv_cache(const oss_attention_params *p) {
  return p->seqlens_k != NULL || p->block_table != NULL;
}

/* The keys the decode kernel splits for one CTA: len_k, or fewer under a
 * window with a left side. A CTA's rows are queries i_lo .. i_hi, which see
 * keys i_lo + off - left .. i_hi + off + right: at most len_q + left + right
 * of them, where the right side is bounded by the window or, on the
 * window's diagonal, by the causal rule (right 0). */
static int64_t oss_attn_dec_span(const oss_attention_params *p, const oss_attn_args *a) {
  int64_t right = a->win_right;
  if (p->causal == OSS_CAUSAL_BOTTOM_RIGHT ||
      (p->causal == OSS_CAUSAL_TOP_LEFT && p->window_diagonal != OSS_CAUSAL_BOTTOM_RIGHT))
    right = 0; /* the causal rule's diagonal is the window's (oss_attn_fill_args: var_off) */
  if (a->win_left < 0 || right < 0 || a->win_left >= p->len_k || right >= p->len_k) return p->len_k;
  const int64_t span = p->len_q + a->win_left + right;
  return span < p->len_k ? span : p->len_k;
}

static oss_attn_dec_plan oss_attn_dec_make_plan(const oss_attention_params *p, const oss_attn_args *a,
                                                const oss_device_info *dev) {
  oss_attn_dec_plan plan;
  memset(&plan, 0, sizeof plan);
  if (!oss_attn_is_tc(p->dtype) || dev->cc_major < 8 || a->drop_seed != NULL || a->cu_q != NULL) return plan;
  const int forced = oss_attn_opts()->decode_splits;
  if (!oss_attn_kv_cache(p) && (p->len_q > OSS_ATTN_DEC_MAX_LQ || forced < 0)) return plan;
  const int need_vec = OSS_ATTN_VEC_Q | OSS_ATTN_VEC_K | OSS_ATTN_VEC_V;
  if ((a->vec & need_vec) != need_vec || p->batch * p->heads_kv > 65535) return plan;
  const int64_t need = p->head_dim > p->head_dim_v ? p->head_dim : p->head_dim_v;
  const oss_attn_kernel_entry *e = oss_attn_find(p->dtype, need, 0);
  if (e == NULL || e->dec == NULL) return plan;
  plan.entry = e;
  const int64_t keys = oss_attn_dec_keys(e->dec_head_dim);
  const int64_t tiles = (oss_attn_dec_span(p, a) + keys - 1) / keys;
  const int64_t row_tiles = (p->heads_q / p->heads_kv * p->len_q + OSS_ATTN_DEC_ROWS - 1) / OSS_ATTN_DEC_ROWS;
  const int64_t base = p->batch * p->heads_kv * row_tiles; /* CTAs of one split */
  const int64_t sms = dev->sm_count;
  int64_t splits = 1;
  if (forced > 0) {
    splits = forced;
  } else if (tiles > 0) {
    int64_t per_sm = dev->max_smem_per_sm / (int64_t)(oss_attn_dec_smem_bytes(e->dec_head_dim) + 1024);
    const int64_t regs_cap = oss_attn_dec_ctas_per_sm(e->dec_head_dim);
    per_sm = per_sm < 1 ? 1 : (per_sm > regs_cap ? regs_cap : per_sm);
    const int64_t one = base < sms ? sms / base : 1;                       /* about a CTA per SM */
    const int64_t wave = base < sms * per_sm ? sms * per_sm / base : 1;  /* a full wave */
    if (p->block_table != NULL || tiles > one * OSS_ATTN_DEC_LONG_TILES) splits = wave;
    else if (one > OSS_ATTN_DEC_MAX_CLUSTER && dev->cc_major >= 9 &&
             tiles <= OSS_ATTN_DEC_MAX_CLUSTER * OSS_ATTN_DEC_CLUSTER_TILES)
      splits = OSS_ATTN_DEC_MAX_CLUSTER;
    else splits = one;
    const int64_t most = tiles / (base * 4 >= sms ? OSS_ATTN_DEC_MIN_TILES_BUSY : OSS_ATTN_DEC_MIN_TILES);
    if (splits > most) splits = most;
  }
  if (splits > OSS_ATTN_DEC_MAX_SPLITS) splits = OSS_ATTN_DEC_MAX_SPLITS;
  if (splits > tiles) splits = tiles;
  if (splits < 1) splits = 1;
  plan.tiles = (int)(tiles > 0 ? (tiles + splits - 1) / splits : 1);
  plan.splits = tiles > 0 ? (int)((tiles + plan.tiles - 1) / plan.tiles) : 1;
  plan.cluster = plan.splits > 1 && plan.splits <= OSS_ATTN_DEC_MAX_CLUSTER && base * plan.splits <= sms &&
                 dev->cc_major >= 9;
  if (plan.splits > 1 && !plan.cluster) {
    const size_t rows = (size_t)(p->batch * p->heads_q * p->len_q) * (size_t)plan.splits;
    plan.off_lse = oss_attn_round256(rows * (size_t)oss_attn_dec_part_ld((int)p->head_dim_v) * 4);
    plan.bytes = plan.off_lse + oss_attn_round256(rows * 4);
  }
  return plan;
}

size_t oss_attention_forward_workspace_size_cuda(const oss_attention_params *p) {
  if (oss_attn_validate(p) != OSS_OK || p->batch == 0 || p->heads_q == 0 || p->len_q == 0) return 0;
  oss_device_info dev;
  if (oss_get_device_info(&dev) != OSS_OK) return 0;
  oss_attn_args a;
  oss_attn_fill_args(p, &a);
  return oss_attn_dec_make_plan(p, &a, &dev).bytes;
}

oss_status oss_attention_forward_cuda(const oss_attention_params *p, void *workspace, void *cuda_stream) {
  return oss_attn_forward_with(p, workspace, cuda_stream, NULL);
}

oss_status oss_attn_forward_with(const oss_attention_params *p, void *workspace, void *cuda_stream,
                                 oss_attn_launch_fn override_fn) {
  oss_status st = oss_attn_validate(p);
  if (st != OSS_OK) return st;
  if (p->batch == 0 || p->heads_q == 0 || p->len_q == 0) return OSS_OK;
  oss_device_info dev;
  st = oss_get_device_info(&dev);
  if (st != OSS_OK) return st;
  oss_attn_args a;
  oss_attn_fill_args(p, &a);
  cudaStream_t stream = (cudaStream_t)cuda_stream;
  const oss_attn_dec_plan dec = override_fn ? (oss_attn_dec_plan){0} : oss_attn_dec_make_plan(p, &a, &dev);
  if (dec.entry != NULL) {
    if (dec.bytes > 0 && (workspace == NULL || ((uintptr_t)workspace) % 16 != 0))
      return oss_fail(OSS_ERROR_INVALID_ARGUMENT,
                      "attention: workspace must be 16-byte aligned with %zu bytes "
                      "(oss_attention_forward_workspace_size_cuda)",
                      dec.bytes);
    a.dec_splits = dec.splits;
    a.dec_tiles = dec.tiles;
    a.dec_cluster = dec.cluster;
    /* the variants' diagonal follows each batch's seqlens_k where it is bottom-right */
    a.var_bottom_right = a.variants && (p->window_diagonal == OSS_CAUSAL_BOTTOM_RIGHT ||
                                        p->causal == OSS_CAUSAL_BOTTOM_RIGHT);
    a.part_o = dec.bytes ? (float *)workspace : NULL;
    a.part_lse = dec.bytes ? (float *)((char *)workspace + dec.off_lse) : NULL;
    return dec.entry->dec(&a, stream, &dev);
  }
  if (oss_attn_kv_cache(p))
    return oss_fail(OSS_ERROR_NOT_SUPPORTED,
                    "attention: the KV-cache fields need 16-byte aligned rows of q, k and v, batch * heads_kv <= "
                    "65535 and a decode kernel for head dim %lld (compiled head dims: %s)",
                    (long long)(p->head_dim > p->head_dim_v ? p->head_dim : p->head_dim_v),
                    oss_attention_cuda_head_dims_list());
  if (!oss_attn_is_tc(p->dtype)) return oss_attn_fwd_simt(&a, p->dtype, stream, &dev);
  if (dev.cc_major < 8)
    return oss_fail(OSS_ERROR_NOT_SUPPORTED,
                    "attention: float16/bfloat16 need compute capability 8.0 or newer, the device has %d.%d",
                    dev.cc_major, dev.cc_minor);
  const int64_t need = p->head_dim > p->head_dim_v ? p->head_dim : p->head_dim_v;
  const oss_attn_kernel_entry *e = oss_attn_find(p->dtype, need, 0);
  if (e == NULL)
    return oss_fail(OSS_ERROR_NOT_SUPPORTED,
                    "attention: no forward kernel compiled for head dim %lld (compiled head dims: %s)",
                    (long long)need, oss_attention_cuda_head_dims_list());
  if (a.variants && e->fwd_var[OSS_ATTN_MMA] == NULL)
    return oss_fail(OSS_ERROR_NOT_SUPPORTED, "attention: no forward kernel with the score variants for head dim %lld",
                    (long long)need);
  /* the score variants run in their own mma.sync kernels */
  const oss_attn_launch_fn fn = override_fn   ? override_fn
                                : a.variants ? oss_attn_select(e->fwd_var, &dev, false)
                                             : oss_attn_select(e->fwd, &dev, false);
  return fn(&a, stream, &dev);
}

/* Workspace layout of the backward; every piece 256-byte aligned: the row
 * statistics (two float arrays for the tensor-core kernels, three double
 * arrays for the SIMT kernels), then for the tensor-core kernels the mean K
 * row per kv head with its per-chunk sums and, where the dK/dV kernel adds
 * dQ, the float32 dQ accumulator (its padding columns take the row sums of
 * the rounded dS'). */
typedef struct oss_attn_bwd_layout {
  int64_t lq_pad, ws_rows; /* ws_rows > 0: a variable-length batch's rows per head (oss_attn_ws_row) */
  int dq_ld;   /* 0: no float32 dQ accumulator */
  int mean_ld; /* 0: no mean K rows (SIMT kernels) */
  size_t off_dsum, off_inv_l, off_kpart, off_kmean, off_dq, off_sem, total;
  size_t sem_bytes; /* deterministic mode's dQ counters (0: none) */
} oss_attn_bwd_layout;

/* Does the backward leave dQ to the Hopper query-major kernel in either mode
 * (no accumulator then)? The column-split backward (the Hopper kernels above
 * head dim 128, with the variants or without) does, for calls without a mask
 * tensor (oss_attn_bwd_sm90_run): on an sm_90 device running the Hopper
 * family, as oss_attn_select picks it. */
static bool oss_attn_bwd_dq_query_major(const oss_attention_params *p, const oss_attn_kernel_entry *e) {
  const bool var = oss_attn_has_variants(p);
  const oss_attn_launch_fn *fns = var ? e->bwd_var : e->bwd;
  const int hd = var ? e->var_head_dim : e->bwd_sm90_head_dim;
  oss_device_info dev;
  if (p->mask_kind != OSS_MASK_NONE || hd <= 128 || fns[OSS_ATTN_SM90] == NULL || oss_get_device_info(&dev) != OSS_OK)
    return false;
  return oss_attn_select(fns, &dev, true) == fns[OSS_ATTN_SM90];
}

static oss_attn_bwd_layout oss_attn_bwd_plan(const oss_attention_backward_params *bp) {
  const oss_attention_params *p = &bp->fwd;
  oss_attn_bwd_layout L;
  memset(&L, 0, sizeof L);
  L.lq_pad = (p->len_q + OSS_ATTN_LQ_PAD - 1) / OSS_ATTN_LQ_PAD * OSS_ATTN_LQ_PAD;
  const int tc = oss_attn_is_tc(p->dtype);
  /* the tensor-core kernels lay a variable-length batch's rows out by the
   * tokens; the SIMT kernels keep [B*Hq][lq_pad] */
  L.ws_rows = tc && p->cu_seqlens_q != NULL ? oss_attn_ws_rows(p->total_q, (int)p->batch) : 0;
  const size_t rows = L.ws_rows > 0 ? (size_t)(p->heads_q * L.ws_rows) : (size_t)(p->batch * p->heads_q * L.lq_pad);
  const size_t vec = oss_attn_round256(rows * (tc ? 4 : 8));
  L.off_dsum = vec;
  L.off_inv_l = tc ? 0 : 2 * vec;
  L.total = (tc ? 2 : 3) * vec;
  if (!tc) return L;
  const int64_t need = p->head_dim > p->head_dim_v ? p->head_dim : p->head_dim_v;
  const oss_attn_kernel_entry *e = oss_attn_find(p->dtype, need, 1);
  if (e == NULL) return L;
  /* the padded head dim of the kernel that will run (the variants' and the
   * Hopper kernel's may be wider: sized for the widest that may run) */
  const int hd = oss_attn_has_variants(p) ? e->var_head_dim
                                          : (e->bwd_sm90_head_dim > e->head_dim ? e->bwd_sm90_head_dim : e->head_dim);
  const int kd = (hd + 15) / 16 * 16;
  L.mean_ld = kd;
  L.off_kpart = L.total;
  L.total += oss_attn_round256((size_t)(p->batch * p->heads_kv) *
                               (size_t)((p->len_k + OSS_ATTN_MEAN_CHUNK - 1) / OSS_ATTN_MEAN_CHUNK) * kd * 8);
  L.off_kmean = L.total;
  L.total += oss_attn_round256((size_t)(p->batch * p->heads_kv) * kd * 4);
  /* Deterministic mode keeps the accumulator only for the Hopper key-split
   * backward, which orders its additions by counters (one per query head and
   * block of 64 rows, the smaller of its query blocks; not for
   * variable-length batches); elsewhere, and in either mode after the
   * column-split backward, a query-major dQ kernel writes dq. */
  const int sm90 = oss_attn_has_variants(p) ? e->bwd_var[OSS_ATTN_SM90] != NULL : e->bwd[OSS_ATTN_SM90] != NULL;
  if ((!bp->deterministic || (sm90 && L.ws_rows == 0)) && !oss_attn_bwd_dq_query_major(p, e)) {
    /* rows padded by 16 bytes, 32 for the Hopper kernel: it stages a dQ
     * block in shared memory with that pitch (oss_attn_bwd_sm90_dq_pitch,
     * against bank conflicts) and adds it to the accumulator with one bulk
     * reduction; columns dq_ld - 4 and dq_ld - 3 take the row sums of dQ's
     * centring */
    L.dq_ld = kd + (sm90 ? 8 : 4);
    L.off_dq = L.total;
    L.total += oss_attn_round256(rows * (size_t)L.dq_ld * 4);
  }
  if (bp->deterministic && L.dq_ld > 0) {
    L.sem_bytes = (rows / 64 + 1) * sizeof(unsigned);
    L.off_sem = L.total;
    L.total += oss_attn_round256(L.sem_bytes);
  }
  return L;
}

size_t oss_attention_backward_workspace_size_cuda(const oss_attention_backward_params *bp) {
  if (bp == NULL || oss_attn_validate(&bp->fwd) != OSS_OK) return 0;
  return oss_attn_bwd_plan(bp).total;
}

oss_status oss_attention_backward_cuda(const oss_attention_backward_params *bp, void *workspace,
                                       void *cuda_stream) {
  return oss_attn_backward_with(bp, workspace, cuda_stream, NULL);
}

oss_status oss_attn_backward_with(const oss_attention_backward_params *bp, void *workspace, void *cuda_stream,
                                  oss_attn_launch_fn override_fn) {
  if (bp == NULL) return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention_backward: params is NULL");
  const oss_attention_params *p = &bp->fwd;
  oss_status st = oss_attn_validate(p);
  if (st != OSS_OK) return st;
  if (oss_attn_kv_cache(p))
    return oss_fail(OSS_ERROR_NOT_SUPPORTED, "attention_backward: the KV-cache fields are for the forward only");
  if (bp->keys_subset && p->dropout_p > 0.0)
    return oss_fail(OSS_ERROR_NOT_SUPPORTED,
                    "attention_backward: params->fwd.dropout_p=%g is not supported with keys_subset on CUDA",
                    p->dropout_p);
  if (bp->keys_subset && !oss_attn_is_tc(p->dtype))
    return oss_fail(OSS_ERROR_NOT_SUPPORTED,
                    "attention_backward: keys_subset needs float16/bfloat16 inputs on CUDA (the float32/float64 "
                    "kernels recompute the row statistics from the keys they are given)");
  const int64_t nq = p->batch * p->heads_q * p->len_q, nkv = p->batch * p->heads_kv * p->len_k;
  if (nq > 0 && (bp->dout == NULL || bp->dq == NULL))
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention_backward: params->%s is NULL",
                    bp->dout == NULL ? "dout" : "dq");
  if (nkv > 0 && (bp->dk == NULL || bp->dv == NULL))
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention_backward: params->%s is NULL",
                    bp->dk == NULL ? "dk" : "dv");
  if (p->sinks != NULL && bp->dsinks != NULL && p->heads_q > 0 && nq == 0) { /* no rows: d sinks is 0 */
    if (cudaMemsetAsync(bp->dsinks, 0, (size_t)p->heads_q * sizeof(float), (cudaStream_t)cuda_stream) != cudaSuccess)
      return oss_fail(OSS_ERROR_CUDA, "attention_backward: clearing dsinks failed");
  }
  if (nq == 0 && nkv == 0) return OSS_OK;
  const oss_attn_bwd_layout L = oss_attn_bwd_plan(bp);
  if (L.total > 0 && workspace == NULL)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT,
                    "attention_backward: workspace is NULL but %zu bytes are needed "
                    "(oss_attention_backward_workspace_size_cuda)",
                    L.total);
  if (((uintptr_t)workspace) % 16 != 0)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "attention_backward: workspace must be 16-byte aligned");

  oss_device_info dev;
  st = oss_get_device_info(&dev);
  if (st != OSS_OK) return st;
  oss_attn_args a;
  oss_attn_fill_args(p, &a);
  a.dout = bp->dout;
  a.dq = bp->dq;
  a.dk = bp->dk;
  a.dv_ptr = bp->dv;
  for (int i = 0; i < 3; i++) {
    a.do_s[i] = bp->dout_stride[i];
    a.dq_s[i] = bp->dq_stride[i];
    a.dk_s[i] = bp->dk_stride[i];
    a.dv_s[i] = bp->dv_stride[i];
  }
  if (a.cu_q != NULL) a.do_s[0] = a.dq_s[0] = a.dk_s[0] = a.dv_s[0] = 0;
  const size_t es = oss_attn_elem_size(p->dtype);
  const int64_t nq3[3] = {p->batch, p->heads_q, a.cu_q ? p->total_q : p->len_q},
                nk3[3] = {p->batch, p->heads_kv, a.cu_q ? p->total_k : p->len_k};
  if (oss_attn_rows_aligned(bp->dout, bp->dout_stride, nq3, es)) a.vec |= OSS_ATTN_VEC_DO;
  if (oss_attn_rows_aligned(bp->dq, bp->dq_stride, nq3, es)) a.vec |= OSS_ATTN_VEC_DQ;
  if (oss_attn_rows_aligned(bp->dk, bp->dk_stride, nk3, es)) a.vec |= OSS_ATTN_VEC_DK;
  if (oss_attn_rows_aligned(bp->dv, bp->dv_stride, nk3, es)) a.vec |= OSS_ATTN_VEC_DV;
  a.dsinks = p->sinks != NULL ? bp->dsinks : NULL;
  a.dlse = bp->dlse;
  a.lq_pad = L.lq_pad;
  a.ws_rows = L.ws_rows;
  a.lse_adj = workspace;
  a.dsum = (char *)workspace + L.off_dsum;
  a.inv_l = L.off_inv_l ? (char *)workspace + L.off_inv_l : NULL;
  a.dq_acc = L.dq_ld > 0 ? (float *)((char *)workspace + L.off_dq) : NULL;
  a.dq_ld = L.dq_ld;
  a.dq_sem = L.sem_bytes > 0 ? (unsigned *)((char *)workspace + L.off_sem) : NULL;
  /* dQ's centring needs dS's rows to sum to 0 over these keys: not so for a
   * block of a larger key set, nor with sinks (the rows sum to D p_sink) or a
   * softcap (dS carries its derivative). In a variable-length batch the mean
   * K rows are per (sequence, kv head) */
  if (L.mean_ld > 0 && nq > 0 && nkv > 0 && oss_attn_opts()->dq_centring && !bp->keys_subset && p->sinks == NULL && bp->dlse == NULL &&
      p->softcap == 0.0) {
    a.kmean_part = (double *)((char *)workspace + L.off_kpart);
    a.kmean = (float *)((char *)workspace + L.off_kmean);
    a.mean_ld = L.mean_ld;
  }
  cudaStream_t stream = (cudaStream_t)cuda_stream;

  const oss_attn_kernel_entry *e = NULL;
  if (oss_attn_is_tc(p->dtype)) {
    if (dev.cc_major < 8)
      return oss_fail(OSS_ERROR_NOT_SUPPORTED,
                      "attention_backward: float16/bfloat16 need compute capability 8.0 or newer, the device has "
                      "%d.%d",
                      dev.cc_major, dev.cc_minor);
    const int64_t need = p->head_dim > p->head_dim_v ? p->head_dim : p->head_dim_v;
    e = oss_attn_find(p->dtype, need, 1);
    if (e == NULL)
      return oss_fail(OSS_ERROR_NOT_SUPPORTED,
                      "attention_backward: no backward kernel compiled for head dim %lld (compiled head dims: %s)",
                      (long long)need, oss_attention_cuda_head_dims_list());
  }
  if (e == NULL) {
    st = oss_attn_bwd_simt(&a, p->dtype, stream, &dev);
    if (st != OSS_OK || nq == 0) return st;
    return oss_attn_bwd_dsinks(&a, p->dtype, stream);
  }
  if (nq > 0) {
    st = oss_attn_bwd_prepare(&a, p->dtype, stream);
    if (st != OSS_OK) return st;
  }
  if (a.dq_sem != NULL && cudaMemsetAsync(a.dq_sem, 0, L.sem_bytes, stream) != cudaSuccess)
    return oss_fail(OSS_ERROR_CUDA, "attention_backward: clearing the dQ counters failed");
  /* the kernel family's launcher fills a.kmean (oss_attn_bwd_means) */
  if (a.variants && e->bwd_var[OSS_ATTN_MMA] == NULL)
    return oss_fail(OSS_ERROR_NOT_SUPPORTED,
                    "attention_backward: no backward kernel with the score variants for head dim %d", e->head_dim);
  const oss_attn_launch_fn fn = override_fn   ? override_fn
                                : a.variants ? oss_attn_select(e->bwd_var, &dev, true)
                                             : oss_attn_select(e->bwd, &dev, true);
  st = fn(&a, stream, &dev);
  if (st != OSS_OK) return st;
  if (nq > 0) {
    st = oss_attn_bwd_dsinks(&a, p->dtype, stream);
    if (st != OSS_OK) return st;
  }
  /* with counters, the Hopper backward converts its own accumulator (the
   * mma.sync kernels it may fall back to leave it unused) */
  if (a.dq_acc != NULL && a.dq_sem == NULL && nq > 0) return oss_attn_bwd_dq_convert(&a, p->dtype, stream);
  return OSS_OK;
}
