/*
 * oss.h - the plain C API of torch_oss.
 *
 * This header is the only contract between the registration layer
 * (csrc/torch_ops.cpp, the one file that knows torch) and the kernels
 * (C11 files in csrc/cpu, C-style CUDA files in csrc/cuda). It holds parameter
 * structs made of raw pointers, int64_t sizes and element strides, a dtype
 * enum and status codes; no torch and no C++ types, so the kernels can be
 * driven from a plain C program.
 *
 * Conventions
 *   - Strides are in elements of the tensor's own dtype, never bytes.
 *   - Every entry point validates what it relies on and returns a status;
 *     on failure oss_error_message() holds a sentence saying why.
 *   - CUDA entry points take the cudaStream_t to launch on as a void*; they
 *     never synchronise and never allocate device memory (callers pass a
 *     workspace whose size the matching *_workspace_size function, or the
 *     softmax plan, gives).
 *   - CPU entry points take an oss_cpu_exec that says how to run a parallel
 *     loop (the registration layer hands in torch's thread pool).
 */
#ifndef OSS_H
#define OSS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------
 * Types shared by every op
 * ------------------------------------------------------------------------- */

typedef enum oss_dtype {
  OSS_FLOAT32 = 0,
  OSS_FLOAT64 = 1,
  OSS_FLOAT16 = 2,
  OSS_BFLOAT16 = 3,
  OSS_BOOL = 4, /* one byte, 0 or 1: only as an attention mask */
} oss_dtype;

typedef enum oss_status {
  OSS_OK = 0,
  OSS_ERROR_INVALID_ARGUMENT = 1, /* the caller broke a documented rule */
  OSS_ERROR_NOT_SUPPORTED = 2,    /* valid, but this build/device cannot do it */
  OSS_ERROR_CUDA = 3,             /* a CUDA runtime call or launch failed */
  OSS_ERROR_OUT_OF_MEMORY = 4,    /* host allocation failed */
} oss_status;

/* Thread-local sentence describing the last failure on the calling thread. */
const char *oss_error_message(void);
const char *oss_status_name(oss_status status);

/* Build description: "cuda=<0|1> archs=<list> attention_head_dims=<list>". */
const char *oss_build_config(void);

/* How CPU kernels run a parallel loop: call fn(ctx, begin, end) on disjoint
 * ranges covering [0, n), each at least `grain` long where possible. fn never
 * throws and may be called from several threads at once. */
typedef void (*oss_range_fn)(void *ctx, int64_t begin, int64_t end);
typedef void (*oss_parallel_for_fn)(int64_t n, int64_t grain, void *ctx, oss_range_fn fn);

typedef struct oss_cpu_exec {
  oss_parallel_for_fn parallel_for; /* NULL: run serially on the calling thread */
} oss_cpu_exec;

/* ---------------------------------------------------------------------------
 * Softmax family
 *
 * A tensor is seen as [outer, n, inner] and the reduction runs over n.
 * Element (o, i, j) of a tensor lives at data + o*stride_outer + i*stride_n + j:
 * the inner dimension is always unit-stride. When inner == 1 the caller must
 * also make stride_n == 1 (rows are contiguous); any stride_outer is allowed.
 * ------------------------------------------------------------------------- */

typedef struct oss_strided3 {
  void *data;
  oss_dtype dtype;
  int64_t stride_outer;
  int64_t stride_n;
} oss_strided3;

typedef struct oss_softmax_params {
  int64_t outer, n, inner;
  int log;        /* 0: softmax, 1: log_softmax */
  oss_strided3 x; /* input, read only; float32/64/16, bfloat16 */
  oss_strided3 y; /* output; its dtype may differ from x's (the dtype= cast) */
} oss_softmax_params;

/* dx = y * (dy - sum(y * dy))          (softmax)
 * dx = dy - exp(y) * sum(dy)           (log_softmax, y = log-probabilities)
 * y and dy share a dtype; dx may have another (the forward input's). */
typedef struct oss_softmax_backward_params {
  int64_t outer, n, inner;
  int log;
  oss_strided3 y;  /* forward output, read only */
  oss_strided3 dy; /* gradient of the output, read only */
  oss_strided3 dx; /* gradient of the input, written */
} oss_softmax_backward_params;

oss_status oss_softmax_forward_cpu(const oss_softmax_params *p, const oss_cpu_exec *exec);
oss_status oss_softmax_backward_cpu(const oss_softmax_backward_params *p, const oss_cpu_exec *exec);

/* CUDA, planned once: a *_plan_cuda function checks the params, chooses the
 * kernels for the current device and sets plan->workspace_bytes, the device
 * scratch the launch needs (0 for most shapes); oss_softmax_launch_cuda then
 * launches that plan with a workspace at least that large and 16-byte aligned
 * (NULL when 0), on the device that was current when it was planned. A plan
 * holds the params' pointers and may be launched any number of times while
 * the tensors live. */
typedef struct oss_softmax_plan_cuda {
  size_t workspace_bytes;
  int64_t internal[32]; /* private to the implementation */
} oss_softmax_plan_cuda;

oss_status oss_softmax_forward_plan_cuda(const oss_softmax_params *p, oss_softmax_plan_cuda *plan);
oss_status oss_softmax_backward_plan_cuda(const oss_softmax_backward_params *p, oss_softmax_plan_cuda *plan);
oss_status oss_softmax_launch_cuda(const oss_softmax_plan_cuda *plan, void *workspace, void *cuda_stream);

/* The same in two calls that each plan: workspace_size returns the bytes of
 * scratch (0 for most shapes, and 0 for params the call would reject). */
size_t oss_softmax_forward_workspace_size_cuda(const oss_softmax_params *p);
oss_status oss_softmax_forward_cuda(const oss_softmax_params *p, void *workspace, void *cuda_stream);
size_t oss_softmax_backward_workspace_size_cuda(const oss_softmax_backward_params *p);
oss_status oss_softmax_backward_cuda(const oss_softmax_backward_params *p, void *workspace,
                                     void *cuda_stream);

/* ---------------------------------------------------------------------------
 * Attention
 *
 * q: [batch, heads_q, len_q, head_dim]      k: [batch, heads_kv, len_k, head_dim]
 * v: [batch, heads_kv, len_k, head_dim_v]   out: [batch, heads_q, len_q, head_dim_v]
 * Each 4-d tensor is given by its pointer and the element strides of its
 * first three dims; the last dim is contiguous. heads_q % heads_kv == 0 and
 * query head h reads kv head h / (heads_q / heads_kv) (GQA/MQA).
 *
 * lse: contiguous [batch, heads_q, len_q], natural-log log-sum-exp of the
 * scaled, masked scores of each query row; float32, or float64 when the
 * inputs are float64. A row with no visible key has lse = -inf and output 0.
 *
 * Mask: bool (true = may attend) or additive (added to the scaled scores,
 * same dtype as q or float32), addressed as
 * mask[b*s[0] + h*s[1] + i*s[2] + j*s[3]] with h the query head; a stride of
 * 0 broadcasts that dim. The causal rule and the mask combine.
 * ------------------------------------------------------------------------- */

typedef enum oss_causal {
  OSS_CAUSAL_NONE = 0,
  OSS_CAUSAL_TOP_LEFT = 1,     /* key j visible to query i iff j <= i             */
  OSS_CAUSAL_BOTTOM_RIGHT = 2, /* key j visible to query i iff j <= i + len_k - len_q */
} oss_causal;

typedef enum oss_mask_kind {
  OSS_MASK_NONE = 0,
  OSS_MASK_BOOL = 1,
  OSS_MASK_ADDITIVE = 2,
} oss_mask_kind;

typedef struct oss_attention_params {
  oss_dtype dtype; /* of q, k, v, out (and dout, dq, dk, dv in the backward) */
  int64_t batch, heads_q, heads_kv, len_q, len_k, head_dim, head_dim_v;
  const void *q;
  int64_t q_stride[3];
  const void *k;
  int64_t k_stride[3];
  const void *v;
  int64_t v_stride[3];
  void *out; /* written by the forward, read by the backward */
  int64_t out_stride[3];
  void *lse; /* written by the forward, read by the backward */
  /* Optional (NULL: none), float16/bfloat16 only, int8 with out's shape and
   * strides (in elements): the forward also writes out's rounding residual
   * (the output before its rounding to dtype minus out, itself rounded to a
   * step of 1/32 of out's unit in the last place, below which the forward's
   * float32 sums carry only noise; 0 where out is not finite) as its count
   * of steps, -16 .. 16 (oss_internal.h oss_output_residual_code), and the
   * backward, given it, takes D = rowsum(dout * (out + residual)) instead of
   * rowsum(dout * out), so the gradients do not
   * carry the output's rounding (about 2^-11 relative in float16, 2^-8 in
   * bfloat16, times |dout| |k| in dq). Backward kernels that compute D = sum
   * P dP themselves (CPU; CUDA float32/float64) need none. */
  void *out_residual;
  double scale;
  oss_causal causal;
  oss_mask_kind mask_kind;
  const void *mask;
  oss_dtype mask_dtype;
  int64_t mask_stride[4];
  /* Optional KV-cache addressing (forward only; NULL / 0: off). seqlens_k:
   * int32 [batch] (device memory for CUDA, host memory for CPU): batch b
   * attends to keys 0 .. seqlens_k[b] - 1 only, each in [0, len_k]; with
   * OSS_CAUSAL_BOTTOM_RIGHT the diagonal follows that length (key j visible
   * to query i iff j <= i + seqlens_k[b] - len_q). block_table: int32
   * [batch][block_table_stride], k and v are then paged caches of num_pages
   * pages of page_size rows: key j of batch b is row j % page_size of page
   * block_table[b][j / page_size], k_stride / v_stride give the element
   * strides of (page, head, row in page), and len_k is the capacity
   * (block_table_stride * page_size). Each used entry must be in
   * [0, num_pages); the CPU checks, the CUDA kernels read a page outside that
   * range as zeros (the registration layer checks before launching). */
  const int32_t *seqlens_k;
  const int32_t *block_table;
  int64_t block_table_stride;
  int64_t page_size;
  int64_t num_pages;
  /* Score variants (0 / NULL: off, so a zeroed struct has none), applied in
   * this order to each score s = scale * q.k of query row i and key j, with
   * d = i + off - j the signed
   * distance from the diagonal: off = 0, or len_k - len_q (per batch
   * seqlens_k[b] - len_q with seqlens_k) when window_diagonal is
   * OSS_CAUSAL_BOTTOM_RIGHT or causal is OSS_CAUSAL_BOTTOM_RIGHT.
   *   softcap > 0:   s <- softcap * tanh(s / softcap)
   *   alibi_slopes:  s <- s - slope * |d|, slope = alibi_slopes[b * alibi_stride_batch + h]
   *                  (float32; alibi_stride_batch 0 shares one row of heads_q slopes)
   *   mask:          as above
   *   window != 0:   key j is hidden when d > window_left (window_left >= 0) or
   *                  -d > window_right (window_right >= 0); a negative side is open
   *   causal:        as above (a causal window is window_right = 0)
   * sinks: float32 [heads_q], one extra logit per query head that joins every
   * row's softmax denominator (and its lse) and carries no value. */
  int window;
  int64_t window_left, window_right;
  oss_causal window_diagonal;
  double softcap;
  const float *alibi_slopes;
  int64_t alibi_stride_batch;
  const float *sinks;
  /* Dropout of the attention weights (dropout_p = 0: off), the one rule of
   * oss_internal.h for every kernel: softmax weight P(b, h, i, j) is kept
   * with probability 1 - dropout_p and then scaled by 1 / (1 - dropout_p),
   * or replaced by 0, before it multiplies v; the lse, the softmax's
   * normaliser and the sinks' terms are those of the weights before dropout.
   * dropout_seed: one uint64, in device memory for CUDA (read by the kernels,
   * so a seed drawn on the device needs no synchronisation and a CUDA graph
   * replays with the seed's new value), host memory for CPU. The backward,
   * given the same seed, drops the same weights (nothing is stored) and
   * D = rowsum(dout * out) still holds for the dropped output. 0 <= dropout_p
   * <= 1; not with the KV-cache fields. */
  double dropout_p;
  const uint64_t *dropout_seed;
  /* Optional variable-length batch (both NULL: off; both or neither):
   * cu_seqlens_q, cu_seqlens_k int32 [batch + 1] (device memory for CUDA,
   * host memory for CPU), nondecreasing within [0, total_q] / [0, total_k].
   * Sequence b is query rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of
   * the packed q and out (dout, dq, out_residual) and key rows cu_seqlens_k[b]
   * .. cu_seqlens_k[b + 1] - 1 of the packed k and v (dk, dv): each tensor's
   * first stride is then ignored, row r of it lies at r * stride[2] and head h
   * at h * stride[1]; total_q / total_k are the packed tensors' rows. len_q and
   * len_k bound every sequence's lengths (they size grids and workspaces).
   * Within a sequence everything is as for one batch entry of lengths
   * (its len_q, its len_k): the causal rule, the variants' diagonal, ALiBi's
   * batch row b, the dropout rule with batch index b. lse is then
   * [heads_q, total_q] contiguous. Not with a mask or the KV-cache fields.
   * The CPU checks the values; the CUDA kernels clamp every sequence inside
   * the packed tensors and to len_q / len_k (nothing is read or written
   * outside them; the rows of a longer sequence past those bounds are left
   * unwritten), so the caller validates them when it cannot trust them. */
  const int32_t *cu_seqlens_q;
  const int32_t *cu_seqlens_k;
  int64_t total_q, total_k;
} oss_attention_params;

typedef struct oss_attention_backward_params {
  oss_attention_params fwd; /* the forward's inputs, out and lse */
  const void *dout;
  int64_t dout_stride[3];
  void *dq;
  int64_t dq_stride[3];
  void *dk;
  int64_t dk_stride[3];
  void *dv;
  int64_t dv_stride[3];
  int deterministic; /* nonzero: bitwise identical gradients run to run */
  /* Nonzero: fwd.out and fwd.lse come from attention over more keys than k
   * and v (one block of ring attention): the backward takes P and D from them
   * (P = exp(s - lse), D = rowsum(dout * out), plus out_residual where given)
   * and so gives this block's share of that attention's gradient; the 16-bit
   * CUDA kernels then do not centre dQ (centring needs dS's rows to sum to 0
   * over k). CPU, and float16/bfloat16 on CUDA (the float32/float64 CUDA
   * kernels refuse it: OSS_ERROR_NOT_SUPPORTED). */
  int keys_subset;
  /* With fwd.sinks: float32 [heads_q], written (not accumulated) with
   * d sink_h = -sum over (b, i) of p_sink(b, h, i) * D(b, h, i), where
   * p_sink = exp(sink_h - lse) and D = rowsum(dout * out); NULL: not wanted. */
  float *dsinks;
  /* Optional (NULL: zero): the gradient of fwd.lse, with lse's layout and
   * dtype. As d lse_i / d s_ij = P_ij, the backward then takes D - dlse for
   * D (dS = P (dP - D + dlse)), so dq, dk and dsinks carry lse's share too
   * (and the 16-bit CUDA kernels do not centre dQ: dS's rows no longer sum
   * to 0). */
  const void *dlse;
} oss_attention_backward_params;

oss_status oss_attention_forward_cpu(const oss_attention_params *p, const oss_cpu_exec *exec);
oss_status oss_attention_backward_cpu(const oss_attention_backward_params *p,
                                      const oss_cpu_exec *exec);

/* CUDA: the kernels accept any pointer alignment and any strides (16-byte
 * vector paths where rows are aligned, a correct element-wise path where they
 * are not), any head_dim / head_dim_v from 1 to the largest compiled one, and
 * float16/bfloat16 (tensor cores) or float32/float64 (exact-precision SIMT).
 * Calls with at most 16 query rows per head (decode) run a split-KV kernel
 * that reads each kv head's K and V once for all its query heads; its key
 * splits follow the SM count and the work (attention.cu) and need the
 * forward workspace. The KV-cache fields (seqlens_k, block_table) need that
 * kernel (any len_q): float16/bfloat16 and 16-byte aligned rows of q, k, v. */
/* Largest head dim this build can serve (0 when CUDA attention is absent). */
int64_t oss_attention_cuda_max_head_dim(void);
size_t oss_attention_forward_workspace_size_cuda(const oss_attention_params *p);
oss_status oss_attention_forward_cuda(const oss_attention_params *p, void *workspace,
                                      void *cuda_stream);
size_t oss_attention_backward_workspace_size_cuda(const oss_attention_backward_params *p);
oss_status oss_attention_backward_cuda(const oss_attention_backward_params *p, void *workspace,
                                       void *cuda_stream);

/* Which CUDA attention kernels run, for tests and benchmarks that compare
 * them. Defaults: the best family for the device, dQ centring on, or what the
 * environment says at the first attention call (TORCH_OSS_ATTENTION_FORWARD /
 * TORCH_OSS_ATTENTION_BACKWARD = "mma", TORCH_OSS_ATTENTION_DQ_CENTRING = "0").
 * Set them between calls, not while another thread runs attention. */
typedef struct oss_attention_cuda_options {
  int forward_mma_only;  /* nonzero: the mma.sync forward also where a wgmma one exists */
  int backward_mma_only; /* nonzero: the same for the backward */
  int dq_centring;       /* nonzero: the 16-bit backward centres dQ (see attention.cu) */
  int decode_splits;     /* the split-KV decode forward: 0 splits by its rule, n > 0 forces
                            n key splits (fewer where there are fewer key tiles), -1 never
                            runs it (where the other kernels can serve the call) */
  int forward_ctas_per_sm; /* the Hopper forward's grid: 0 by the launcher's rule, -1 one CTA
                              per work block, n > 0 a persistent grid of n CTAs per SM, each
                              looping over blocks */
  int forward_block_rows; /* the Hopper forward's query rows per block where kernels of
                             two sizes serve a call: 0 by the launcher's rule, 128 or 192 */
} oss_attention_cuda_options;
oss_attention_cuda_options oss_attention_cuda_get_options(void);
void oss_attention_cuda_set_options(const oss_attention_cuda_options *options);

/* ---------------------------------------------------------------------------
 * Cross-entropy over class indices
 *
 * logits: [rows, classes], rows contiguous (element (r, j) at
 * logits + r*logits_stride_row + j); float32/64/16, bfloat16.
 * target: contiguous int64 [rows]; each entry is ignore_index or in
 * [0, classes) (checked: OSS_ERROR_INVALID_ARGUMENT names the first bad one).
 * loss: contiguous [rows], float32, or float64 when logits are float64.
 * lse: contiguous [rows], float64 for every logits dtype: the backward takes
 * softmax_t = exp(x_t - lse), and at a dominant class (softmax_t near 1, its
 * gradient softmax_t - 1 near 0) a float32 lse of ~20 would already be off by
 * up to 1e-6, all of which would land in that gradient.
 *
 * Per row, with eps = label_smoothing, C = classes and t = target:
 *   lse  = log(sum_j exp(x_j))
 *   loss = (1 - eps) (lse - x_t) + eps (lse - mean_j x_j) + z_loss lse^2
 * and loss = 0 where t == ignore_index (lse is still written there).
 * The backward writes, with g = grad_loss of the row (0 on ignored rows):
 *   grad_j = g (softmax_j (1 + 2 z_loss lse) - (1 - eps) [j == t] - eps / C)
 * ------------------------------------------------------------------------- */

typedef struct oss_cross_entropy_params {
  int64_t rows, classes;
  const void *logits; /* read only */
  oss_dtype dtype;    /* of logits (and grad_logits) */
  int64_t logits_stride_row;
  const int64_t *target;
  int64_t ignore_index;
  double label_smoothing; /* in [0, 1] */
  double z_loss;          /* >= 0 */
  void *loss;             /* forward: written; backward: unused */
  void *lse;              /* forward: written; backward: read */
} oss_cross_entropy_params;

typedef struct oss_cross_entropy_backward_params {
  oss_cross_entropy_params fwd; /* the forward's inputs and its lse */
  const void *grad_loss;        /* contiguous [rows], loss's dtype */
  void *grad_logits;            /* [rows, classes] in fwd.dtype, rows contiguous */
  int64_t grad_logits_stride_row;
  /* NULL, or one value s of the loss's dtype (backward only): the gradient is
   * for grad_loss[i] * s, and where s is exactly 1 nothing is written:
   * grad_logits then already holds the gradient for grad_loss, as the
   * forward + backward wrote it. Decided where s lives (on the device for
   * CUDA), so the caller never reads it. */
  const void *grad_scale;
} oss_cross_entropy_backward_params;

/* One pass over each row (online max and sum of exponentials). */
oss_status oss_cross_entropy_forward_cpu(const oss_cross_entropy_params *p, const oss_cpu_exec *exec);
/* One pass over each row, reading logits and writing grad_logits. */
oss_status oss_cross_entropy_backward_cpu(const oss_cross_entropy_backward_params *p,
                                          const oss_cpu_exec *exec);

/* CUDA, on the caller's stream (no synchronisation, no workspace), with the
 * same math and the same argument checks, except that the targets, which
 * live on the device, are not checked: a row whose target is neither
 * ignore_index nor in [0, classes) reads nothing outside its row and gets
 * loss = NaN (its lse is still written) and, in the backward, a gradient row
 * of NaN. Any row stride and any pointer aligned to its element size (16-byte
 * vectors where a row's 16-byte boundaries allow). In the backward,
 * grad_logits may be the logits themselves (same pointer and row stride: the
 * gradient is written in place); any other overlap is refused.
 * csrc/cuda/cross_entropy/cross_entropy.cu describes the kernels. */
oss_status oss_cross_entropy_forward_cuda(const oss_cross_entropy_params *p, void *cuda_stream);
oss_status oss_cross_entropy_backward_cuda(const oss_cross_entropy_backward_params *p, void *cuda_stream);
/* Both in one launch: writes p->fwd.loss and p->fwd.lse as the forward does
 * and the gradient for the given grad_loss as the backward does (from the
 * lse it just computed; p->fwd.lse is only written). On sm_90 a row of up to
 * 608 KB is held on chip (a CTA's or a cluster's registers and shared memory)
 * and read once;
 * other rows are read once for the statistics and once more for the
 * gradient. p->grad_scale must be NULL. */
oss_status oss_cross_entropy_forward_backward_cuda(const oss_cross_entropy_backward_params *p, void *cuda_stream);

/* ---------------------------------------------------------------------------
 * Cross-entropy over class probabilities
 *
 * logits and target: [rows, classes] of one dtype (float32/64/16, bfloat16),
 * rows unit-stride along the classes, any row strides (element (r, j) at
 * logits + r*logits_stride_row + j, target + r*target_stride_row + j).
 * weight: NULL (every w_j = 1) or contiguous [classes] in the loss's dtype.
 * loss: contiguous [rows], float32, or float64 when logits are float64.
 * lse and target_sum: contiguous [rows], float64 (the backward's inputs).
 *
 * Per row, with eps = label_smoothing, C = classes and
 * u_j = w_j ((1 - eps) t_j + eps / C):
 *   lse        = log(sum_j exp(x_j))
 *   target_sum = sum_j u_j
 *   loss       = sum_j u_j (lse - x_j) + z_loss lse^2
 * formed in one pass as target_sum log(d) - sum_j u_j (x_j - m), with m the
 * row's exp shift (its running max) and d = sum_j exp(x_j - m): both terms
 * are >= 0 for u >= 0, so nothing cancels where lse is large (a logit of
 * 1e4). As in F.cross_entropy a logit of -inf with u_j = 0 makes the row's
 * loss NaN (0 * -inf), and with u_j > 0 +inf.
 * The backward writes, with g = grad_loss of the row and S = target_sum:
 *   grad_logits_j = g (softmax_j (S + 2 z_loss lse) - u_j)
 *   grad_target_j = g (1 - eps) w_j (lse - x_j)     (where grad_target != NULL)
 * ------------------------------------------------------------------------- */

typedef struct oss_cross_entropy_probs_params {
  int64_t rows, classes;
  const void *logits; /* read only */
  oss_dtype dtype;    /* of logits, target and the gradients */
  int64_t logits_stride_row;
  const void *target; /* read only */
  int64_t target_stride_row;
  const void *weight;     /* NULL or [classes] in the loss's dtype */
  double label_smoothing; /* in [0, 1] */
  double z_loss;          /* >= 0 */
  void *loss;             /* forward: written; backward: unused */
  void *lse;              /* forward: written; backward: read */
  void *target_sum;       /* forward: written; backward: read */
} oss_cross_entropy_probs_params;

typedef struct oss_cross_entropy_probs_backward_params {
  oss_cross_entropy_probs_params fwd; /* the forward's inputs, its lse and target_sum */
  const void *grad_loss;              /* contiguous [rows], loss's dtype */
  void *grad_logits;                  /* [rows, classes] in fwd.dtype, rows unit-stride */
  int64_t grad_logits_stride_row;
  void *grad_target; /* NULL (not computed) or [rows, classes] in fwd.dtype, rows unit-stride */
  int64_t grad_target_stride_row;
} oss_cross_entropy_probs_backward_params;

/* One pass over each row's logits and target. */
oss_status oss_cross_entropy_probs_forward_cpu(const oss_cross_entropy_probs_params *p, const oss_cpu_exec *exec);
/* One pass over each row, reading logits and target, writing the gradients. */
oss_status oss_cross_entropy_probs_backward_cpu(const oss_cross_entropy_probs_backward_params *p,
                                                const oss_cpu_exec *exec);
/* CUDA, on the caller's stream (no synchronisation, no workspace), with the
 * same math and checks. Any row strides and any pointers aligned to their
 * element size; 16-byte vectors where a row's boundaries allow (the target's
 * and the gradients' rows where they have the logits' 16-byte phase, element
 * by element otherwise). The gradients may not overlap the inputs. */
oss_status oss_cross_entropy_probs_forward_cuda(const oss_cross_entropy_probs_params *p, void *cuda_stream);
oss_status oss_cross_entropy_probs_backward_cuda(const oss_cross_entropy_probs_backward_params *p,
                                                 void *cuda_stream);

/* The glue of a mean (or summed) loss around the ops above, two small
 * reductions:
 * row_weights: count = the rows whose target is not ignore_index (one int64),
 * and weights[i] = c_i / count (mean != 0) or c_i (mean == 0), c_i = 1 where
 * target[i] != ignore_index else 0, in `dtype` (OSS_FLOAT32 or OSS_FLOAT64),
 * the division in that dtype with count converted to it (0 / 0 = NaN when no
 * row counts). target and weights are contiguous [rows].
 * total: *total = the sum of loss[0, rows) (contiguous, OSS_FLOAT32 or
 * OSS_FLOAT64) accumulated in double and rounded once to the loss's dtype,
 * then divided by *count (converted to that dtype) where count is not NULL.
 * CUDA: one CTA each on the caller's stream, count and total in device memory,
 * the sum's order fixed (bitwise reproducible). */
oss_status oss_cross_entropy_row_weights_cpu(const int64_t *target, int64_t rows, int64_t ignore_index, oss_dtype dtype,
                                             int mean, void *weights, int64_t *count);
oss_status oss_cross_entropy_total_cpu(const void *loss, int64_t rows, oss_dtype dtype, const int64_t *count,
                                       void *total);
oss_status oss_cross_entropy_row_weights_cuda(const int64_t *target, int64_t rows, int64_t ignore_index,
                                              oss_dtype dtype, int mean, void *weights, int64_t *count,
                                              void *cuda_stream);
oss_status oss_cross_entropy_total_cuda(const void *loss, int64_t rows, oss_dtype dtype, const int64_t *count,
                                        void *total, void *cuda_stream);

#ifdef __cplusplus
}
#endif

#endif /* OSS_H */
