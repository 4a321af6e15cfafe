/*
 * attention_common.cuh - what every attention file shares: the kernel argument
 * block (built once on the host from the oss.h params), the kernel-family
 * dispatch table written by generate_attention_kernels.py, and small device
 * helpers (mask lookup, the causal rule).
 *
 * Notation (FlashAttention papers): a CTA owns Br query rows or Bc keys; m is
 * the running row max of the scaled, masked scores, l the running sum of
 * exp(s - m), o the running unnormalised output. The tensor-core kernels keep m
 * in log2 units (scores multiplied by scale*log2(e)) so that exp2 is one MUFU
 * instruction; lse is converted back to natural log when written.
 */
#ifndef OSS_ATTENTION_COMMON_CUH
#define OSS_ATTENTION_COMMON_CUH

#include "cuda/common.cuh"

#define OSS_LOG2E 1.4426950408889634
#define OSS_LN2 0.6931471805599453

/* Bits of oss_attn_args.vec: the rows of that tensor start on 16-byte
 * boundaries (pointer and every stride of the first three dims), so tiles move
 * as 16-byte vectors (cp.async); otherwise the element-wise path runs. */
enum {
  OSS_ATTN_VEC_Q = 1,
  OSS_ATTN_VEC_K = 2,
  OSS_ATTN_VEC_V = 4,
  OSS_ATTN_VEC_O = 8,
  OSS_ATTN_VEC_DO = 16,
  OSS_ATTN_VEC_DQ = 32,
  OSS_ATTN_VEC_DK = 64,
  OSS_ATTN_VEC_DV = 128,
  OSS_ATTN_VEC_OR = 256,
};

/* Everything a kernel needs, passed by value (a few hundred bytes of kernel
 * parameter space). Lengths fit in int (checked on the host); every offset
 * into a tensor is computed in int64_t. */
typedef struct oss_attn_args {
  int batch, hq, hkv, group; /* group = hq / hkv */
  int lq, lk, d, dv;
  const void *q, *k, *v;
  int64_t q_s[3], k_s[3], v_s[3];
  void *out;
  void *out_res; /* out's rounding residual: int8 codes (oss.h out_residual; out's strides), or NULL */
  int64_t o_s[3];
  void *lse; /* float [B*Hq*Lq] (double for float64 inputs) */
  double scale;
  float scale_log2; /* scale * log2(e) */
  int causal;       /* 0 none; else key j visible to query i iff j <= i + causal_off */
  int64_t causal_off;
  int mask_kind; /* oss_mask_kind */
  int mask_dtype;
  const void *mask;
  int64_t m_s[4];
  int vec; /* OSS_ATTN_VEC_* bits */
  /* backward only */
  const void *dout;
  int64_t do_s[3];
  void *dq, *dk, *dv_ptr;
  int64_t dq_s[3], dk_s[3], dv_s[3];
  /* Backward row statistics, workspace arrays of [B*Hq*lq_pad] (or
   * [Hq][ws_rows], see oss_attn_ws_row). Tensor-core
   * kernels (float): lse_adj = lse in log2 units (+inf for rows with no key),
   * dsum = D = rowsum(dO * O). SIMT kernels (double, written by their dQ
   * kernel): lse_adj = the row max m of the scores, inv_l = 1 / sum exp(s - m)
   * (0 for rows with no key), dsum = D = sum_j P_ij dP_ij. */
  void *lse_adj;
  void *dsum;
  void *inv_l;    /* SIMT only */
  /* dq_acc: workspace [rows of oss_attn_ws_row][dq_ld] float, or NULL (SIMT;
   * deterministic mode without the Hopper key-split backward; the Hopper
   * column-split backward where its query-major dQ kernel runs). Columns dq_ld - 4 and
   * dq_ld - 3 of a row (padding past the kernels' head dims) take the row
   * sums of the rounded dS' for dQ's centring. dq_sem (deterministic mode
   * only, else NULL): one counter per 64 workspace rows, which orders the
   * Hopper backward's additions into dq_acc (attention_bwd_sm90.cuh); the
   * mma.sync kernels then leave dq_acc alone and dQ to the query-major kernel. */
  float *dq_acc;
  unsigned *dq_sem;
  int64_t lq_pad; /* Lq rounded up to OSS_ATTN_LQ_PAD */
  int64_t ws_rows; /* > 0: the variable-length layout [Hq][ws_rows] (oss_attn_ws_row) */
  int dq_ld;
  /* dQ's centring (tensor-core backward, attention_bwd.cuh; kmean NULL: off).
   * kmean: float [B*Hkv][mean_ld], each kv head's mean K row (columns >= D
   * zero), from the per-chunk float64 sums kmean_part [B*Hkv][chunks][mean_ld]
   * (oss_attn_bwd_means). The dK/dV kernels add the row sums R of the
   * rounded dS' into dq_acc's columns dq_ld - 4 and dq_ld - 3, and the dq
   * conversion applies them (dq -= R kmean). */
  float *kmean;
  double *kmean_part;
  int mean_ld; /* the kernels' padded head dim */
  /* split-KV decode forward (attention_decode.cuh) and the KV-cache fields of
   * oss.h: keys per batch (NULL: lk), page table (NULL: k/v are [B, Hkv, Lk]),
   * the split plan (dec_splits splits of dec_tiles key tiles each) and, with
   * more than one split, the float32 partial outputs [splits][B*Hq*Lq][dv]
   * and their lse [splits][B*Hq*Lq] in the workspace. */
  const int *seqlens_k;
  const int *block_table;
  int64_t bt_stride;
  int page_size, num_pages;
  int causal_bottom_right; /* with seqlens_k: the diagonal follows each batch's length */
  int dec_splits, dec_tiles;
  int dec_cluster; /* the splits merge in a cluster (attention_decode.cuh), not in part_o / part_lse */
  float *part_o, *part_lse;
  /* Score variants (oss.h; all off when `variants` is 0): d = i + var_off - j
   * is a score's distance from the window's and ALiBi's diagonal; a window
   * side below 0 is open; softcap_l2 = softcap log2(e) (0: off); ALiBi slopes
   * [batch][hq] with batch stride alibi_sb; sinks [hq] and, in the backward,
   * their gradient dsinks [hq]. */
  int variants;
  int64_t var_off, win_left, win_right;
  float softcap_l2;
  double softcap; /* the SIMT kernels' (natural units) */
  const float *alibi;
  int64_t alibi_sb;
  const float *sinks;
  float *dsinks;
  /* lse's gradient (oss.h dlse; lse's layout and dtype) or NULL: the row
   * passes take D - dlse for D */
  const void *dlse;
  /* Dropout of the attention weights (oss.h; counts as a score variant, so
   * it runs in the VAR kernels and the SIMT kernels; drop_seed NULL: off).
   * Weight (bh = b * hq + h, query i, key j) is kept when its 16 bits of
   * oss_dropout_group(*drop_seed, bh, i, j) are >= drop_thr, and then takes
   * the factor 1 / (1 - p) (0 at p = 1): drop_scale for the tensor-core
   * kernels, drop_scale64 for the SIMT ones. drop_seed: device memory, read
   * by the kernels. */
  const uint64_t *drop_seed;
  uint32_t drop_thr;
  float drop_scale;
  double drop_scale64;
  /* Variable-length batch (oss.h cu_seqlens; cu_q NULL: off): the host sets
   * every batch stride to 0, lq / lk to the length bounds and var_bottom_right
   * when the variants' diagonal is bottom-right; oss_attn_seq_view turns a
   * copy of the block into sequence b's (pointers at its first rows, its
   * lengths, its diagonals, seq_q0 / seq_k0 its first query / key row). The
   * decode kernel reads var_bottom_right too: there the diagonal follows each
   * batch's seqlens_k. */
  const int *cu_q, *cu_k;
  int64_t total_q, total_k;
  int var_bottom_right;
  int64_t seq_q0, seq_k0;
} oss_attn_args;

#define OSS_ATTN_LQ_PAD 128

/* ---- dispatch table (defined in generated/attention_dispatch.cu) ---------- */

typedef oss_status (*oss_attn_launch_fn)(const oss_attn_args *a, cudaStream_t stream,
                                         const oss_device_info *dev);

/* Kernel families: a slot per architecture-specific implementation, for the
 * forward and the backward. OSS_ATTN_MMA: the mma.sync/ldmatrix/cp.async
 * kernels (sm_80 and newer, attention_fwd.cuh / attention_bwd.cuh);
 * OSS_ATTN_SM90: the Hopper wgmma kernels (attention_fwd_sm90.cuh /
 * attention_bwd_sm90.cuh), present only where the build targets sm_90a. */
enum { OSS_ATTN_MMA = 0, OSS_ATTN_SM90 = 1, OSS_ATTN_FAMILIES = 2 };

typedef struct oss_attn_kernel_entry {
  int head_dim;    /* compiled head dim (D and Dv up to it run here, zero padded) */
  oss_dtype dtype; /* OSS_FLOAT16 or OSS_BFLOAT16 */
  oss_attn_launch_fn fwd[OSS_ATTN_FAMILIES]; /* NULL where not compiled */
  oss_attn_launch_fn bwd[OSS_ATTN_FAMILIES]; /* backward kernels, NULL where not compiled */
  int bwd_sm90_head_dim; /* the head dim bwd[OSS_ATTN_SM90] was compiled for (>= head_dim; 0: none) */
  oss_attn_launch_fn dec; /* split-KV decode forward (mma.sync), NULL where not compiled */
  int dec_head_dim;       /* the head dim dec was compiled for (>= head_dim) */
  oss_attn_launch_fn fwd_var[OSS_ATTN_FAMILIES]; /* with the score variants (NULL where not compiled) */
  oss_attn_launch_fn bwd_var[OSS_ATTN_FAMILIES];
  int var_head_dim;                    /* the head dim they were compiled for (>= head_dim) */
} oss_attn_kernel_entry;

/* ---- split-KV decode (attention_decode.cuh) --------------------------------- */

/* Head dim rounded up to the mma k-step, and the smem pitch for KD columns (a
 * row is an odd number of 16-byte chunks, so ldmatrix is free of bank conflicts). */
__host__ __device__ constexpr int oss_attn_kd(int hd) { return (hd + 15) / 16 * 16; }
__host__ __device__ constexpr int oss_attn_pitch(int cols) { return (cols / 8) % 2 == 0 ? cols + 8 : cols; }

#define OSS_ATTN_DEC_ROWS 16       /* packed query rows per CTA */
#define OSS_ATTN_DEC_MAX_SPLITS 256
#define OSS_ATTN_DEC_MAX_LQ 16     /* the forward takes the decode kernel up to this len_q */
#define OSS_ATTN_DEC_MAX_CLUSTER 8 /* the most splits that merge in a cluster (the portable size) */
/* Floats per partial output row in the workspace: Dv rounded up to 16 bytes. */
__host__ __device__ constexpr int oss_attn_dec_part_ld(int dv) { return (dv + 3) / 4 * 4; }
/* Keys per tile (a quarter per warp): 128 at head dim 64, where a tile of 64
 * keys gives a warp too few bytes per row reduction and rescale of o; 64
 * above, where 128 would leave one CTA per SM. */
__host__ __device__ constexpr int oss_attn_dec_keys(int hd) { return hd <= 64 ? 128 : 64; }
/* K/V tiles in flight per CTA: three up to head dim 128 (where two CTAs share
 * an SM), two above. */
__host__ __device__ constexpr int oss_attn_dec_stages(int hd) { return hd <= 128 ? 3 : 2; }
/* CTAs per SM the decode kernel is compiled for (its launch bounds cap the
 * registers to fit them): as many as the stages' shared memory allows on an
 * sm_90 SM. The host's split rule takes the smaller of this and what the
 * device's shared memory holds. */
__host__ __device__ constexpr int oss_attn_dec_ctas_per_sm(int hd) { return hd <= 128 ? 2 : 1; }
/* The K and V stages (unpadded, swizzled rows), the Q tile (padded rows), and
 * two row tables of 16 bytes per key. */
__host__ __device__ constexpr size_t oss_attn_dec_smem_bytes(int hd) {
  return (size_t)2 * oss_attn_dec_stages(hd) * oss_attn_dec_keys(hd) * oss_attn_kd(hd) * 2 +
         (size_t)OSS_ATTN_DEC_ROWS * oss_attn_pitch(oss_attn_kd(hd)) * 2 + 2 * oss_attn_dec_keys(hd) * 16;
}

#ifdef __cplusplus
extern "C" {
#endif
extern const oss_attn_kernel_entry oss_attn_kernel_table[];
extern const int oss_attn_kernel_table_len;
#ifdef __cplusplus
}
#endif

/* attention_simt.cu: float32/float64 kernels, and the backward pre-pass / dQ
 * conversion of the tensor-core kernels. */
oss_status oss_attn_fwd_simt(const oss_attn_args *a, oss_dtype dtype, cudaStream_t stream,
                             const oss_device_info *dev);
oss_status oss_attn_bwd_simt(const oss_attn_args *a, oss_dtype dtype, cudaStream_t stream,
                             const oss_device_info *dev);
oss_status oss_attn_bwd_prepare(const oss_attn_args *a, oss_dtype dtype, cudaStream_t stream);
oss_status oss_attn_bwd_dq_convert(const oss_attn_args *a, oss_dtype dtype, cudaStream_t stream);
/* Writes a->dsinks (nothing without sinks), after the row statistics of the
 * backward are in the workspace (oss_attn_bwd_prepare, or the SIMT dQ kernel). */
oss_status oss_attn_bwd_dsinks(const oss_attn_args *a, oss_dtype dtype, cudaStream_t stream);
/* Rows of K summed per chunk of kmean_part (the chunks are added in order). */
#define OSS_ATTN_MEAN_CHUNK 128
/* Fills a->kmean (nothing when it is NULL): oss_attn_bwd_means from K, run
 * by the mma.sync backward before its kernels; oss_attn_bwd_means_reduce from
 * kmean_part, which the Hopper backward's kernel wrote (its dQ conversion
 * needs kmean only after it). */
oss_status oss_attn_bwd_means(const oss_attn_args *a, oss_dtype dtype, cudaStream_t stream);
oss_status oss_attn_bwd_means_reduce(const oss_attn_args *a, cudaStream_t stream);

/* attention.cu: the public entry points with the tensor-core kernel replaced
 * by override_fn when it is not NULL (same head dim; used by the self-test to
 * time alternative tile configurations through the same host path). */
oss_status oss_attn_forward_with(const oss_attention_params *p, void *workspace, void *cuda_stream,
                                 oss_attn_launch_fn override_fn);
oss_status oss_attn_backward_with(const oss_attention_backward_params *bp, void *workspace, void *cuda_stream,
                                  oss_attn_launch_fn override_fn);

/* ---- device helpers -------------------------------------------------------- */

/* Value of an additive mask element as Acc, or 0 / -inf for a bool mask. */
template <typename Acc>
__device__ __forceinline__ Acc oss_attn_mask_value(const oss_attn_args &a, int64_t off) {
  switch (a.mask_dtype) {
  case OSS_BOOL:
    return ((const unsigned char *)a.mask)[off] ? (Acc)0 : (Acc)(-INFINITY);
  case OSS_FLOAT32:
    return (Acc)((const float *)a.mask)[off];
  case OSS_FLOAT64:
    return (Acc)((const double *)a.mask)[off];
  case OSS_FLOAT16:
    return (Acc)__half2float(((const __half *)a.mask)[off]);
  case OSS_BFLOAT16:
    return (Acc)__bfloat162float(((const __nv_bfloat16 *)a.mask)[off]);
  }
  return (Acc)0;
}

__device__ __forceinline__ int64_t oss_attn_mask_base(const oss_attn_args &a, int64_t b, int64_t h) {
  return b * a.m_s[0] + h * a.m_s[1];
}

/* The part of oss_attn_seq_view that moves no pointer (a.cu_q set): lengths,
 * diagonals, seq_q0 and seq_k0; *k0 the sequence's first key row. */
__device__ __forceinline__ void oss_attn_seq_bounds(oss_attn_args &a, int b, int64_t *k0) {
  const int64_t q0 = min((int64_t)max(__ldg(a.cu_q + b), 0), a.total_q);
  const int64_t q1 = min(max((int64_t)__ldg(a.cu_q + b + 1), q0), a.total_q);
  *k0 = min((int64_t)max(__ldg(a.cu_k + b), 0), a.total_k);
  const int64_t k1 = min(max((int64_t)__ldg(a.cu_k + b + 1), *k0), a.total_k);
  a.lq = (int)min(q1 - q0, (int64_t)a.lq);
  a.lk = (int)min(k1 - *k0, (int64_t)a.lk);
  a.seq_q0 = q0;
  a.seq_k0 = *k0;
  if (a.causal) a.causal_off = a.causal_bottom_right ? a.lk - a.lq : 0;
  a.var_off = a.var_bottom_right ? a.lk - a.lq : 0;
}

/* Sequence b of a variable-length batch as a batch of its own lengths:
 * pointers moved to its first rows (the batch strides are 0, so b still names
 * it for ALiBi, dropout and the sinks), lq / lk its lengths clamped to the
 * bounds, its causal and variant offsets. Offsets are clamped into [0, total],
 * so bad cu_seqlens never reach outside the packed tensors. T: the element
 * type of q, k, v, out, dout, dq, dk, dv. Without cu_q, nothing changes. */
template <typename T> __device__ __forceinline__ void oss_attn_seq_view(oss_attn_args &a, int b) {
  if (a.cu_q == nullptr) return;
  int64_t k0;
  oss_attn_seq_bounds(a, b, &k0);
  const int64_t q0 = a.seq_q0;
  a.q = (const T *)a.q + q0 * a.q_s[2];
  a.out = (T *)a.out + q0 * a.o_s[2];
  if (a.out_res != nullptr) a.out_res = (int8_t *)a.out_res + q0 * a.o_s[2];
  if (a.dout != nullptr) a.dout = (const T *)a.dout + q0 * a.do_s[2];
  if (a.dq != nullptr) a.dq = (T *)a.dq + q0 * a.dq_s[2];
  a.k = (const T *)a.k + k0 * a.k_s[2];
  a.v = (const T *)a.v + k0 * a.v_s[2];
  if (a.dk != nullptr) a.dk = (T *)a.dk + k0 * a.dk_s[2];
  if (a.dv_ptr != nullptr) a.dv_ptr = (T *)a.dv_ptr + k0 * a.dv_s[2];
}

/* Blocks of a variable-length batch. A grid sized by the longest sequence
 * (batch x ceil(max_len / R) blocks per head) is mostly CTAs that find their
 * sequence shorter and exit, when lengths vary. Instead sequence b's blocks of
 * R rows take the slots s_b, s_b + 1, ... with s_b = floor(cu[b] / R) + b:
 * s_{b+1} - s_b = floor(cu[b+1] / R) - floor(cu[b] / R) + 1, at least
 * ceil(len_b / R) and at most one more, so the slots of two sequences never
 * overlap, at most one per sequence stays empty, and floor(total / R) +
 * batch + 1 slots per head hold every block: a count the host knows without
 * reading cu (no synchronisation). */
__host__ __device__ __forceinline__ int64_t oss_attn_seq_slots(int64_t total, int batch, int rows) {
  return total / rows + batch + 1;
}

/* The last b in [0, batch) with key(b) <= t, by bisection (0 if none); key
 * nondecreasing in b, as the keys made from valid offsets are. */
template <typename Key> __device__ __forceinline__ int oss_attn_bisect(int batch, int64_t t, Key key) {
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (key(mid) <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

/* Offset b of cu clamped into [0, total], as oss_attn_seq_bounds reads it. */
__device__ __forceinline__ int64_t oss_attn_cu_at(const int *cu, int64_t total, int b) {
  return min((int64_t)max(__ldg(cu + b), 0), total);
}

/* The sequence of slot t (the last b with s_b <= t) and, in *block, t - s_b:
 * the block of R rows within the sequence, which the caller compares with
 * its length (negative or past it: an empty slot). */
__device__ __forceinline__ int oss_attn_slot_seq(const int *cu, int batch, int64_t total, int rows, int64_t t,
                                                 int *block) {
  const int b = oss_attn_bisect(batch, t, [&](int x) { return oss_attn_cu_at(cu, total, x) / rows + x; });
  *block = (int)(t - (oss_attn_cu_at(cu, total, b) / rows + b));
  return b;
}

/* The sequence holding packed row t (the last b with cu[b] <= t: empty
 * sequences before it share its offset). */
__device__ __forceinline__ int oss_attn_row_seq(const int *cu, int batch, int64_t total, int64_t t) {
  return oss_attn_bisect(batch, t, [&](int x) { return oss_attn_cu_at(cu, total, x); });
}

/* The backward's row workspace (lse_adj, dsum and the rows of dq_acc).
 * Its blocks read the statistics of up to OSS_ATTN_LQ_PAD rows from a block's
 * first row, so a sequence's rows are followed by padding rows (D = 0,
 * lse_adj = +inf: weight 0). Dense: [B*Hq][lq_pad]. A variable-length batch
 * on the tensor-core kernels (ws_rows > 0): [Hq][ws_rows], sequence b's rows
 * from oss_attn_ws_base(cu[b], b) = 4 ceil(cu[b] / 4) + b OSS_ATTN_WS_GAP:
 * its rows and padding (< len_b + OSS_ATTN_LQ_PAD) end before the next
 * sequence's first row, every base is a multiple of 4 (16-byte loads of the
 * statistics), and ws_rows = 4 ceil(total / 4) + batch OSS_ATTN_WS_GAP holds
 * them all: the workspace follows the tokens, not batch x the longest. */
#define OSS_ATTN_WS_GAP (OSS_ATTN_LQ_PAD + 4)
__host__ __device__ __forceinline__ int64_t oss_attn_ws_base(int64_t q0, int b) {
  return (q0 + 3) / 4 * 4 + (int64_t)b * OSS_ATTN_WS_GAP;
}
__host__ __device__ __forceinline__ int64_t oss_attn_ws_rows(int64_t total_q, int batch) {
  return oss_attn_ws_base(total_q, batch);
}

/* Workspace row of query row 0 of (batch b, query head h); a: b's view in a
 * variable-length batch (seq_q0 its first row). */
__device__ __forceinline__ int64_t oss_attn_ws_row(const oss_attn_args &a, int b, int h) {
  return a.ws_rows > 0 ? (int64_t)h * a.ws_rows + oss_attn_ws_base(a.seq_q0, b) : ((int64_t)b * a.hq + h) * a.lq_pad;
}

/* Offset in lse of row 0 of (batch, query head) bh: [B, Hq, Lq], or with
 * cu_seqlens [Hq, total_q] from the sequence's first row (a: a sequence's view). */
__device__ __forceinline__ int64_t oss_attn_lse_row(const oss_attn_args &a, int64_t bh) {
  return a.cu_q != nullptr ? (bh % a.hq) * a.total_q + a.seq_q0 : bh * a.lq;
}

/* Is key j inside query i's window (always, without one)? */
__device__ __forceinline__ bool oss_attn_in_window(const oss_attn_args &a, int64_t i, int64_t j) {
  const int64_t d = i + a.var_off - j;
  return !((a.win_left >= 0 && d > a.win_left) || (a.win_right >= 0 && -d > a.win_right));
}

#endif /* OSS_ATTENTION_COMMON_CUH */
