/*
 * attention_decode.cuh - split-KV attention forward for few query rows per
 * head (decode, speculative decode, KV-cache calls; float16/bfloat16,
 * mma.sync m16n8k16, sm_80 and newer): out and lse as the FA2 forward
 * (attention_fwd.cuh) computes them, over contiguous or paged K/V with
 * optional per-batch key counts, with or without the score variants.
 *
 * Rows: the query rows of the query heads that share a kv head are packed
 * into one tile, packed row R = g * Lq + i being query i of query head
 * hk * group + g, so each K/V byte is read once for the whole group. A CTA
 * owns 16 packed rows (blockIdx.x), one split of the keys (blockIdx.y) and
 * one (batch, kv head) (blockIdx.z).
 * Keys: the split's keys stream through shared memory in tiles of BK =
 * oss_attn_dec_keys keys (K and V of a tile in one cp.async group,
 * oss_attn_dec_stages tiles in flight, one barrier per tile; rows swizzled,
 * oss_tile_chunk, so that the 16-byte copies land as whole 128-byte
 * wavefronts); warp w takes keys w BK / 4 .. (w + 1) BK / 4 - 1 of every tile
 * and runs its own online softmax (m, l, lr, o as in attention_fwd.cuh) over
 * them, so the warps never wait for each other inside the key loop; at the
 * end the four warp states are merged through shared memory. Up to head dim
 * 128 the warps keep Q's fragments in registers. A tile whose keys every row
 * of the CTA sees, without a mask tensor, skips the masking: its scale goes
 * into the exponentials' multiply-add, and the padding rows past the packed
 * query rows (zero queries, never written out) take its keys too.
 * Variants (a.variants; all of oss.h's but dropout, which the host keeps
 * from this kernel): the key loop is compiled twice behind one runtime
 * branch, so calls without them run the plain loop, which holds nothing of
 * them. A row's distance is d = i + var_off - j, var_off following the
 * batch's key count where the diagonal is bottom-right (a.var_bottom_right
 * with seqlens_k), as the CPU does. Each score goes through
 * oss_attn_var_value (scale, softcap, ALiBi with the slope of the row's own
 * query head: the packed rows of a CTA span several heads); keys outside the
 * row's [first, last] (oss_attn_var_visible: key count, causal rule, window)
 * are -inf. Those per-row values sit in the unused padding columns of the Q
 * tile's rows, read once per tile. A CTA loads and computes only the keys
 * some row of it can see: the union of its rows' visible keys, which the
 * splits divide from its first key on (the host sizes the splits by the
 * window's span where it is bounded, oss_attn_dec_span in attention.cu). A
 * sink is one more term of its row's softmax, added once: split 0, warp 0
 * starts the row at m = sink, l = lr = 1 and o = 0, so a row that sees no
 * key gets out 0 and lse = sink, and the merge needs nothing of its own
 * for sinks.
 * Output: with one split, out, its rounding residual and lse directly; with
 * several in a cluster (a.dec_cluster: up to 8 splits on sm_90, the host's
 * choice), the splits' CTAs merge their normalised partial outputs through
 * distributed shared memory (oss_attn_dec_cluster_merge); otherwise each
 * split writes its partial (float32) and lse to the workspace and
 * oss_attn_dec_combine_kernel, launched behind it as a programmatic
 * dependent (sm_90), merges them. Both merge by the lse in a fixed order, so
 * a shape gives the same bits on every call. A split that sees no key
 * (past a shorter sequence or outside the window) writes zeros and lse -inf
 * (split 0 with a sink: the sink), and -inf weighs nothing in the merge.
 * Paging: key j of batch b is row j % page_size of page
 * block_table[b][j / page_size]; k_s[0] / v_s[0] are then the page strides. A
 * page index outside [0, num_pages) reads as zeros (the host checks them).
 * Each row's address is worked out once per tile, into a row table in shared
 * memory that the copying threads read (oss_attn_dec_tabled).
 * Limits: rows of q, k and v 16-byte aligned (the host falls back to the FA2
 * kernel otherwise); head dims up to the compiled HD (zero padded); batch *
 * kv heads and splits below 65536; clusters only with sm_90 code (a kernel
 * built from older PTX runs one split instead); lengths below 2^31; ALiBi distances exact
 * below 2^24 (float); no dropout and no variable-length batch (cu_seqlens).
 */
#ifndef OSS_ATTENTION_DECODE_CUH
#define OSS_ATTENTION_DECODE_CUH

#include "cuda/attention/mma/attention_fwd.cuh"

/* Thread tid copies 16-byte chunk tid % CPR of key rows tid / CPR + it * STEP
 * (it < N) of each tile of BK keys, into swizzled rows of KD elements
 * (oss_tile_chunk). */
template <int KD, int BK> struct oss_attn_dec_rows {
  static constexpr int CPR = KD / 8, STEP = 128 / CPR, N = BK / STEP;
  static_assert(128 % CPR == 0 && BK % STEP == 0, "chunks tile the threads and the key tile");
  static_assert(KD % 64 == 0, "swizzled rows are whole 128-byte groups");
};

/* What a thread's K/V copies keep from tile to tile: its 16-byte chunk's
 * column and byte counts (zero padding past d and dv), the chunk's address
 * in kv head hk (k0, v0: key 0 of batch 0) and, for a contiguous cache, in
 * key 0 of batch b (kb0, vb0: row tid / CPR) with the step of STEP rows. */
template <typename T> struct oss_attn_dec_src {
  const T *k0, *v0, *kb0, *vb0;
  int64_t kstep, vstep;
  int col, kbytes, vbytes;
};

template <typename T, int KD, int BK>
__device__ __forceinline__ oss_attn_dec_src<T> oss_attn_dec_src_of(const oss_attn_args &a, int b, int hk, int tid) {
  typedef oss_attn_dec_rows<KD, BK> R;
  oss_attn_dec_src<T> s;
  s.col = tid % R::CPR * 8;
  const int kb = a.d - s.col, vb = a.dv - s.col;
  s.kbytes = (kb < 0 ? 0 : (kb > 8 ? 8 : kb)) * 2;
  s.vbytes = (vb < 0 ? 0 : (vb > 8 ? 8 : vb)) * 2;
  s.k0 = (const T *)a.k + hk * a.k_s[1] + s.col;
  s.v0 = (const T *)a.v + hk * a.v_s[1] + s.col;
  const int r = tid / R::CPR;
  s.kb0 = s.k0 + (int64_t)b * a.k_s[0] + (int64_t)r * a.k_s[2];
  s.vb0 = s.v0 + (int64_t)b * a.v_s[0] + (int64_t)r * a.v_s[2];
  s.kstep = (int64_t)R::STEP * a.k_s[2];
  s.vstep = (int64_t)R::STEP * a.v_s[2];
  return s;
}

/* The row table: the tile at key j0 has its rows a pointer step apart only in
 * a contiguous cache and below n_end; otherwise (a paged cache, the partial
 * last tile) its copies read each row's K and V element offsets from k0 / v0
 * (oss_attn_dec_src) in a table of BK entries in shared memory, which
 * threads 0 .. BK - 1 fill a tile ahead, one row each, so a row's
 * page lookup, division and products are done once rather than by each of
 * its CPR copying threads. An entry {-1, -1} is a row at or past n_end or on
 * a page outside [0, num_pages): zero-filled. */
template <int BK> __device__ __forceinline__ bool oss_attn_dec_tabled(const oss_attn_args &a, int j0, int n_end) {
  return a.block_table != nullptr || j0 + BK > n_end;
}

/* The page of row tid of the tile at key j0 (-1 past n_end, for threads past
 * the tile's rows, and without a page table), read ahead of its entry. */
template <int BK>
__device__ __forceinline__ int oss_attn_dec_page(const oss_attn_args &a, int b, int j0, int n_end, int tid) {
  const int j = j0 + tid;
  if (a.block_table == nullptr || tid >= BK || j >= n_end) return -1;
  return __ldg(a.block_table + (int64_t)b * a.bt_stride + j / a.page_size);
}

/* Thread tid < BK writes row tid's entry of the tile at key j0 into tab (pg:
 * its page from oss_attn_dec_page). */
template <int BK>
__device__ __forceinline__ void oss_attn_dec_fill_row(const oss_attn_args &a, int b, int j0, int n_end, int tid,
                                                      int pg, longlong2 *tab) {
  if (tid >= BK) return;
  const int j = j0 + tid;
  long long ko = -1, vo = -1;
  if (j < n_end) {
    if (a.block_table == nullptr) {
      ko = (int64_t)b * a.k_s[0] + (int64_t)j * a.k_s[2];
      vo = (int64_t)b * a.v_s[0] + (int64_t)j * a.v_s[2];
    } else if (pg >= 0 && pg < a.num_pages) {
      const int row = j % a.page_size;
      ko = (int64_t)pg * a.k_s[0] + (int64_t)row * a.k_s[2];
      vo = (int64_t)pg * a.v_s[0] + (int64_t)row * a.v_s[2];
    }
  }
  tab[tid] = make_longlong2(ko, vo);
}

/* Issues the cp.async copies of K and V rows j0 .. j0 + BK - 1 of (batch b, kv
 * head hk) into one stage: by a pointer step per row where the rows are
 * evenly spaced, else by their row table tab. The copies' address arithmetic
 * would otherwise outnumber the tile's math several times over, in a kernel
 * that keeps only eight warps per SM. */
template <typename T, int KD, int BK>
__device__ __forceinline__ void oss_attn_dec_load_kv(const oss_attn_args &a, const oss_attn_dec_src<T> &src, T *sK,
                                                     T *sV, int j0, int n_end, int tid, const longlong2 *tab) {
  typedef oss_attn_dec_rows<KD, BK> R;
  const int r0 = tid / R::CPR, y = oss_tile_lane_y<true>(tid % R::CPR, r0);
  /* row r0 + it * STEP holds this chunk at y ^ ((it * STEP) % 8) */
  auto at = [&](int it) { return (uint32_t)(((r0 + it * R::STEP) * KD + ((y ^ ((it * R::STEP) & 7)) << 3)) * 2); };
  const uint32_t dk = oss_smem_u32(sK), dv = oss_smem_u32(sV);
  if (!oss_attn_dec_tabled<BK>(a, j0, n_end)) {
    const T *kp = src.kb0 + (int64_t)j0 * a.k_s[2], *vp = src.vb0 + (int64_t)j0 * a.v_s[2];
#pragma unroll
    for (int it = 0; it < R::N; it++) {
      oss_cp_async16(dk + at(it), kp, src.kbytes);
      oss_cp_async16(dv + at(it), vp, src.vbytes);
      kp += src.kstep;
      vp += src.vstep;
    }
    return;
  }
#pragma unroll
  for (int it = 0; it < R::N; it++) {
    const longlong2 e = tab[r0 + it * R::STEP];
    const bool ok = e.x >= 0;
    oss_cp_async16(dk + at(it), ok ? src.k0 + e.x : src.k0, ok ? src.kbytes : 0);
    oss_cp_async16(dv + at(it), ok ? src.v0 + e.y : src.v0, ok ? src.vbytes : 0);
  }
}

/* Scales a warp's 8 NT scores per row to log2 units and hides the invisible
 * ones: keys after the row's last visible key last[hi] (its causal diagonal
 * and the batch's key count; -1 for padding rows) and, with a mask tensor,
 * its entries (row offsets mrow[hi]). */
template <int NT>
__device__ __forceinline__ void oss_attn_dec_mask(float (&s)[1][NT][4], const oss_attn_args &a, const int (&last)[2],
                                                  const int64_t (&mrow)[2], int c0, int lane) {
  const int t2 = (lane & 3) * 2;
#pragma unroll
  for (int hi = 0; hi < 2; hi++)
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int C = c0 + n * 8 + t2 + e;
        float x = s[0][n][2 * hi + e] * a.scale_log2;
        if (C > last[hi]) x = -INFINITY;
        else if (a.mask_kind != OSS_MASK_NONE)
          x += oss_attn_mask_value<float>(a, mrow[hi] + (int64_t)C * a.m_s[3]) * (float)OSS_LOG2E;
        s[0][n][2 * hi + e] = x;
      }
}

/* What the variants need of packed row r, in the 16 bytes of padding that
 * end its row of the Q tile (pitch LDS = KD + 8: columns KD .. KD + 7, which
 * no copy writes and no ldmatrix reads): its first and last visible keys
 * (key count, causal rule, window), i + var_off, and its query head's ALiBi
 * slope in log2 units (bits). */
template <typename T, int KD, int LDS> __device__ __forceinline__ int4 *oss_attn_dec_row_vars(T *sQ, int r) {
  static_assert(LDS >= KD + 8, "a row of the Q tile has 16 bytes of padding");
  return reinterpret_cast<int4 *>(sQ + r * LDS + KD);
}

/* oss_attn_dec_mask under the score variants: each score by
 * oss_attn_var_value with the constants v (scale, softcap) and its row's
 * slope and distance i + var_off - C (oss_attn_dec_row_vars), -inf outside
 * the row's visible keys, plus the mask tensor's value inside them. CAP: the
 * softcap is on. ALiBi's two operations always run (slope 0 leaves a score
 * unchanged). */
template <bool CAP, typename T, int KD, int LDS, int NT>
__device__ __forceinline__ void oss_attn_dec_var_mask(float (&s)[1][NT][4], const oss_attn_args &a, T *sQ,
                                                      oss_attn_var_consts v, const int64_t (&mrow)[2], int c0,
                                                      int lane) {
  const int g = lane >> 2, t2 = (lane & 3) * 2;
#pragma unroll
  for (int hi = 0; hi < 2; hi++) {
    const int4 row = *oss_attn_dec_row_vars<T, KD, LDS>(sQ, g + hi * 8);
    v.slope = __int_as_float(row.w);
    const float d0 = (float)((int64_t)row.z - c0 - t2); /* the distance at column c0 + t2 */
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int C = c0 + n * 8 + t2 + e;
        float dcap;
        float x = oss_attn_var_value(v, CAP, true, s[0][n][2 * hi + e], d0 - (float)(n * 8 + e), &dcap);
        if (C < row.x || C > row.y) x = -INFINITY;
        else if (a.mask_kind != OSS_MASK_NONE)
          x += oss_attn_mask_value<float>(a, mrow[hi] + (int64_t)C * a.m_s[3]) * (float)OSS_LOG2E;
        s[0][n][2 * hi + e] = x;
      }
  }
}

/* Batch b's arguments for the variants' visibility rule
 * (oss_attn_var_visible): its key count kv_len, its causal offset off and
 * its var_off. */
__device__ __forceinline__ oss_attn_args oss_attn_dec_batch_view(const oss_attn_args &a, int kv_len, int64_t off,
                                                                 int64_t var_off) {
  oss_attn_args v = a;
  v.lk = kv_len;
  v.causal_off = off;
  v.var_off = var_off;
  return v;
}

/* Output row (b, h, i) of a decode call: where it starts in out and, where
 * the call keeps a rounding residual, in out_res (else nullptr). */
template <typename T> struct oss_attn_dec_out_row {
  T *out;
  int8_t *res;
};

template <typename T>
__device__ __forceinline__ oss_attn_dec_out_row<T> oss_attn_dec_row_at(const oss_attn_args &a, int b, int h, int i) {
  const int64_t off = (int64_t)b * a.o_s[0] + (int64_t)h * a.o_s[1] + (int64_t)i * a.o_s[2];
  return {(T *)a.out + off, a.out_res == nullptr ? nullptr : (int8_t *)a.out_res + off};
}

/* Column c of an output row: the value rounded to T and its rounding residual's code. */
template <typename T>
__device__ __forceinline__ void oss_attn_dec_store(const oss_attn_dec_out_row<T> &row, int c, float v) {
  row.out[c] = oss_from_float<T>(v);
  if (row.res != nullptr) row.res[c] = (int8_t)oss_residual_code<T>(v);
}

/* A merge of parts (splits) with weights exp(lse_s - mx) summing to sum: the
 * factor that normalises the weighted sum, and the merged lse mx + log sum. A
 * row no part saw (mx = -inf) gives 0 and -inf; a NaN lse of any part NaN. */
__device__ __forceinline__ float oss_attn_dec_merge_inv(float mx, float sum, bool nan) {
  return nan ? NAN : (mx == -INFINITY ? 0.f : 1.f / sum);
}

__device__ __forceinline__ float oss_attn_dec_merge_lse(float mx, float sum, bool nan) {
  return nan ? NAN : (mx == -INFINITY ? -INFINITY : mx + logf(sum));
}

/* The splits of a cluster (a.dec_cluster: clusters of dec_splits CTAs along
 * grid y, sm_90) merge through distributed shared memory instead of the
 * workspace and the combine kernel: each CTA holds its 16 rows' normalised
 * partial outputs (pitch OP) and their lse (sx); after the cluster's barrier
 * the CTA of split s merges rows s, s + S, s + 2 S, ... (S = dec_splits) as
 * oss_attn_dec_combine_kernel does, reading the S partials in split order (so
 * a shape gives the same bits on every call), and a second barrier keeps
 * every CTA's shared memory alive until the others have read it. */
template <typename T>
__device__ __forceinline__ void oss_attn_dec_cluster_merge(const oss_attn_args &a, const float *sO, const float *sx,
                                                           int OP, int b, int hk, int r0, int rows_total, int split,
                                                           int tid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
  const int S = a.dec_splits;
  const uint32_t o_local = oss_smem_u32(sO), x_local = oss_smem_u32(sx);
  uint32_t o_at[OSS_ATTN_DEC_MAX_CLUSTER], x_at[OSS_ATTN_DEC_MAX_CLUSTER];
#pragma unroll
  for (int s = 0; s < OSS_ATTN_DEC_MAX_CLUSTER; s++) {
    const uint32_t rank = (uint32_t)(s < S ? s : 0);
    asm("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(o_at[s]) : "r"(o_local), "r"(rank));
    asm("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(x_at[s]) : "r"(x_local), "r"(rank));
  }
  for (int r = split; r < OSS_ATTN_DEC_ROWS && r0 + r < rows_total; r += S) {
    float x[OSS_ATTN_DEC_MAX_CLUSTER], mx = -INFINITY;
    bool nan = false;
#pragma unroll
    for (int s = 0; s < OSS_ATTN_DEC_MAX_CLUSTER; s++) {
      x[s] = -INFINITY;
      if (s < S) asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(x[s]) : "r"(x_at[s] + 4u * r) : "memory");
      nan |= x[s] != x[s];
      mx = fmaxf(mx, x[s]);
    }
    float sum = 0.f;
#pragma unroll
    for (int s = 0; s < OSS_ATTN_DEC_MAX_CLUSTER; s++) {
      x[s] = s < S && mx != -INFINITY ? expf(x[s] - mx) : 0.f;
      sum += x[s];
    }
    const float inv = oss_attn_dec_merge_inv(mx, sum, nan);
    const int R = r0 + r, h = hk * a.group + R / a.lq, i = R % a.lq;
    const oss_attn_dec_out_row<T> orow = oss_attn_dec_row_at<T>(a, b, h, i);
    for (int c = tid; c < a.dv; c += 128) {
      float acc = 0.f;
#pragma unroll
      for (int s = 0; s < OSS_ATTN_DEC_MAX_CLUSTER; s++) {
        float v = 0.f;
        if (s < S)
          asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(o_at[s] + 4u * (uint32_t)(r * OP + c)) : "memory");
        acc += x[s] * v;
      }
      oss_attn_dec_store(orow, c, acc * inv);
    }
    if (tid == 0) ((float *)a.lse)[((int64_t)b * a.hq + h) * a.lq + i] = oss_attn_dec_merge_lse(mx, sum, nan);
  }
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
  __trap(); /* never launched: the launcher gives a kernel without sm_90 code one split */
#endif
}

template <typename T, int HD>
__global__ void __launch_bounds__(128, oss_attn_dec_ctas_per_sm(HD)) oss_attn_dec_kernel(const oss_attn_args a) {
  constexpr int KD = oss_attn_kd(HD), LDS = oss_attn_pitch(KD), NO = KD / 8, BK = oss_attn_dec_keys(HD);
  constexpr int KW = BK / 4, NK = KW / 8; /* a warp's keys of a tile, and their 8-column n-tiles */
  constexpr int STAGES = oss_attn_dec_stages(HD), OP = KD + 4; /* OP: merge pitch, rows in other banks */
  static_assert(OSS_ATTN_DEC_ROWS == 16 && KW % 16 == 0 && BK <= 128, "one m-tile of rows, k-steps of keys per "
                "warp, a row table entry per thread");
  static_assert((size_t)4 * 16 * OP * 4 + 4 * 16 * 3 * 4 + 16 * 4 <= (size_t)2 * STAGES * BK * KD * 2,
                "the warps' states and a cluster's lse fit the K/V stages for the merge");

  /* K and V stages first (swizzled rows of KD elements: 128-byte aligned), then
   * the Q tile (pitch LDS), then the row tables */
  extern __shared__ __align__(128) unsigned char oss_smem[];
  T *sK = reinterpret_cast<T *>(oss_smem);
  T *sV = sK + STAGES * BK * KD;
  T *sQ = sV + STAGES * BK * KD;

  /* The combine kernel's CTAs may take free slots from now on: they start
   * only once every CTA of this grid has run this, so they never hold a slot
   * that one of this grid's CTAs still waits for. */
  oss_pdl_launch_dependents();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2;
  const int b = (int)(blockIdx.z / a.hkv), hk = (int)(blockIdx.z % a.hkv);
  const int split = blockIdx.y, rows_total = a.group * a.lq, r0 = blockIdx.x * OSS_ATTN_DEC_ROWS;

  /* keys of this batch, the causal offset, and this split's key range */
  int kv_len = a.lk;
  if (a.seqlens_k != nullptr) kv_len = min(max(__ldg(a.seqlens_k + b), 0), a.lk);
  const int64_t off = a.seqlens_k != nullptr && a.causal_bottom_right ? (int64_t)kv_len - a.lq : a.causal_off;
  int n_end = kv_len;
  if (a.causal) {
    const int64_t lim = (int64_t)(a.lq - 1) + off + 1;
    n_end = (int)(lim < 0 ? 0 : (lim < kv_len ? lim : kv_len));
  }
  /* With the variants, the keys [n_begin, n_end) that some row of the CTA
   * can see: its rows are queries i_lo .. i_hi (every query where they span
   * two query heads), and a row's first and last visible keys grow with i.
   * The splits divide the keys from n_begin on. */
  int n_begin = 0;
  int64_t var_off = 0;
  if (a.variants) {
    var_off = a.seqlens_k != nullptr && a.var_bottom_right ? (int64_t)kv_len - a.lq : a.var_off;
    const oss_attn_args av = oss_attn_dec_batch_view(a, kv_len, off, var_off);
    const int r1 = min(r0 + OSS_ATTN_DEC_ROWS, rows_total) - 1;
    const bool one_head = r0 / a.lq == r1 / a.lq;
    int lo, hi, lo1, hi1;
    oss_attn_var_visible<false>(av, one_head ? r0 % a.lq : 0, &lo, &hi);
    oss_attn_var_visible<false>(av, one_head ? r1 % a.lq : a.lq - 1, &lo1, &hi1);
    n_end = min(n_end, hi1 + 1);
    n_begin = min(lo, n_end);
  }
  const int64_t kb = (int64_t)n_begin + (int64_t)split * a.dec_tiles * BK;
  const int k_begin = (int)min(kb, (int64_t)n_end);
  const int k_end = (int)min((int64_t)n_end, kb + (int64_t)a.dec_tiles * BK);
  const int ntiles = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;

  /* Q rows (packed), zero beyond rows_total and d */
  for (int idx = tid; idx < OSS_ATTN_DEC_ROWS * (KD / 8); idx += 128) {
    const int r = idx / (KD / 8), col = (idx % (KD / 8)) * 8, R = r0 + r;
    int nb = a.d - col;
    nb = R < rows_total ? (nb < 0 ? 0 : (nb > 8 ? 8 : nb)) * 2 : 0;
    const T *src = (const T *)a.q;
    if (nb > 0)
      src += (int64_t)b * a.q_s[0] + (int64_t)(hk * a.group + R / a.lq) * a.q_s[1] + (int64_t)(R % a.lq) * a.q_s[2] +
             col;
    oss_cp_async16(oss_smem_u32(sQ + r * LDS + col), src, nb);
  }
  oss_cp_async_commit(); /* Q: a group of its own, waited for before the key loop */
  /* The row tables (oss_attn_dec_tabled) alternate between two buffers: the
   * table of tile t is filled before the barrier that precedes its copies, and
   * its buffer is refilled for tile t + 2 only after the next barrier. */
  longlong2 *tab = reinterpret_cast<longlong2 *>(sQ + OSS_ATTN_DEC_ROWS * LDS);
  const oss_attn_dec_src<T> src = oss_attn_dec_src_of<T, KD, BK>(a, b, hk, tid);
  static_assert(STAGES <= 3, "the prologue's tables fit the two buffers");
#pragma unroll
  for (int st = 0; st < STAGES - 1; st++) {
    const int j0 = k_begin + st * BK;
    longlong2 *tb = tab + (st & 1) * BK;
    if (st < ntiles && oss_attn_dec_tabled<BK>(a, j0, k_end))
      oss_attn_dec_fill_row<BK>(a, b, j0, k_end, tid, oss_attn_dec_page<BK>(a, b, j0, k_end, tid), tb);
    __syncthreads();
    if (st < ntiles)
      oss_attn_dec_load_kv<T, KD, BK>(a, src, sK + st * BK * KD, sV + st * BK * KD, j0, k_end, tid, tb);
    oss_cp_async_commit();
  }
  if (STAGES - 1 < ntiles && oss_attn_dec_tabled<BK>(a, k_begin + (STAGES - 1) * BK, k_end)) {
    const int j0 = k_begin + (STAGES - 1) * BK;
    oss_attn_dec_fill_row<BK>(a, b, j0, k_end, tid, oss_attn_dec_page<BK>(a, b, j0, k_end, tid),
                          tab + ((STAGES - 1) & 1) * BK);
  }
  /* the page of the next table's row, read a tile ahead of its use */
  int pg = STAGES < ntiles ? oss_attn_dec_page<BK>(a, b, k_begin + STAGES * BK, k_end, tid) : -1;

  /* this thread's two fragment rows: last visible key and mask row offset */
  int last[2];
  int64_t mrow[2];
#pragma unroll
  for (int hi = 0; hi < 2; hi++) {
    const int R = r0 + g + hi * 8;
    const int i = R % a.lq, h = hk * a.group + R / a.lq;
    int64_t lv = kv_len - 1;
    if (a.causal && (int64_t)i + off < lv) lv = (int64_t)i + off;
    last[hi] = R < rows_total ? (int)(lv < -1 ? -1 : lv) : -1;
    mrow[hi] = R < rows_total && a.mask_kind != OSS_MASK_NONE
                   ? oss_attn_mask_base(a, b, h) + (int64_t)i * a.m_s[2]
                   : 0;
  }
  /* The last key that every packed row of the CTA sees (-1 with a mask
   * tensor): the plain loop's tiles up to it skip the masking. A warp's lanes
   * hold all 16 rows. */
  int open_last = INT_MAX;
#pragma unroll
  for (int hi = 0; hi < 2; hi++)
    if (r0 + g + hi * 8 < rows_total) open_last = min(open_last, last[hi]);
  open_last = a.mask_kind != OSS_MASK_NONE ? -1 : __reduce_min_sync(0xffffffffu, open_last);
  /* With the variants, what oss_attn_dec_var_mask reads of each packed row
   * (oss_attn_dec_row_vars; padding rows see no key), in shared memory
   * rather than registers. The first barrier of the key loop publishes it. */
  if (a.variants && tid < OSS_ATTN_DEC_ROWS) {
    const oss_attn_args av = oss_attn_dec_batch_view(a, kv_len, off, var_off);
    const int R = r0 + tid, i = R % a.lq;
    int first = 0, lastv = -1;
    if (R < rows_total) oss_attn_var_visible<false>(av, i, &first, &lastv);
    const oss_attn_var_consts v = oss_attn_var_consts_of(a, b, R < rows_total ? hk * a.group + R / a.lq : 0);
    int4 *row = oss_attn_dec_row_vars<T, KD, LDS>(sQ, tid);
    *row = make_int4(first, lastv, (int)(i + var_off), __float_as_int(v.slope));
  }

  float o[1][NO][4];
  float m[1][2], l[1][2], lr[1][2];
#pragma unroll
  for (int n = 0; n < NO; n++) o[0][n][0] = o[0][n][1] = o[0][n][2] = o[0][n][3] = 0.f;
  m[0][0] = m[0][1] = -INFINITY;
  l[0][0] = l[0][1] = lr[0][0] = lr[0][1] = 0.f;
  /* A sink joins its row's softmax once, in split 0 and warp 0, as the
   * first term: m = the sink, and one quad lane's l and lr hold its
   * exp(sink - m) = 1 (no value: o stays 0). A split with no key then gives
   * out 0 and lse = the sink. */
  if (a.variants && a.sinks != nullptr && split == 0 && warp == 0) {
#pragma unroll
    for (int hi = 0; hi < 2; hi++) {
      const int R = r0 + g + hi * 8;
      if (R < rows_total) {
        m[0][hi] = a.sinks[hk * a.group + R / a.lq] * (float)OSS_LOG2E;
        if ((lane & 3) == 0) l[0][hi] = lr[0][hi] = 1.f;
      }
    }
  }
  /* Up to head dim 128 the warps keep Q's fragments in registers (KD / 4 of
   * them) rather than reading them from shared memory on every tile. */
  constexpr bool QREG = KD <= 128;
  const uint32_t sQa = oss_smem_u32(sQ);
  uint32_t qa[1][QREG ? KD / 16 : 1][4];
  if constexpr (QREG) {
    oss_cp_async_wait<STAGES - 1>(); /* Q landed for this thread (the tiles may be in flight) */
    __syncthreads();
    oss_warp_load_a<1, KD, LDS>(qa, sQa, lane);
  }

  /* The key loop, compiled twice behind one runtime branch on a.variants:
   * the plain loop's code holds nothing of the variants, so calls without
   * them run it as they would without this branch. */
  auto key_loop = [&](auto var) {
    oss_attn_var_consts vc = {}; /* the variants' scale and softcap (each row's slope: oss_attn_dec_row_vars) */
    if constexpr (decltype(var)::value) vc = oss_attn_var_consts_of(a, b, hk * a.group);
#pragma unroll 1
    for (int t = 0; t < ntiles; t++) {
      const int st = t % STAGES;
      oss_cp_async_wait<STAGES - 2>(); /* tile t (and Q) landed for this thread */
      __syncthreads();                 /* ... for all; the stage of tile t - 1 is free */
      if (t + STAGES - 1 < ntiles) {
        const int sn = (t + STAGES - 1) % STAGES;
        oss_attn_dec_load_kv<T, KD, BK>(a, src, sK + sn * BK * KD, sV + sn * BK * KD,
                                          k_begin + (t + STAGES - 1) * BK, k_end, tid,
                                          tab + ((t + STAGES - 1) & 1) * BK);
        const int jn = k_begin + (t + STAGES) * BK;
        if (t + STAGES < ntiles && oss_attn_dec_tabled<BK>(a, jn, k_end)) {
          oss_attn_dec_fill_row<BK>(a, b, jn, k_end, tid, pg, tab + ((t + STAGES) & 1) * BK);
          if (t + STAGES + 1 < ntiles) pg = oss_attn_dec_page<BK>(a, b, jn + BK, k_end, tid);
        }
      }
      oss_cp_async_commit();

      const int c0 = k_begin + t * BK + warp * KW;
      if (c0 < k_end) {
        float s[1][NK][4];
#pragma unroll
        for (int n = 0; n < NK; n++) s[0][n][0] = s[0][n][1] = s[0][n][2] = s[0][n][3] = 0.f;
        const uint32_t sKw = oss_smem_u32(sK + (st * BK + warp * KW) * KD);
        if constexpr (QREG) oss_warp_mma_rs_bt<T, 1, NK, KD, KD, true>(s, qa, sKw, lane);
        else oss_warp_mma_ss<T, 1, NK, KD, LDS, KD, true>(s, sQa, sKw, lane);
        float c = 1.f; /* the scale, where the masking has not applied it */
        if constexpr (!decltype(var)::value) {
          if (c0 + KW - 1 <= open_last) c = a.scale_log2;
          else oss_attn_dec_mask(s, a, last, mrow, c0, lane);
        } else if (vc.cap > 0.f) {
          oss_attn_dec_var_mask<true, T, KD, LDS>(s, a, sQ, vc, mrow, c0, lane);
        } else {
          oss_attn_dec_var_mask<false, T, KD, LDS>(s, a, sQ, vc, mrow, c0, lane);
        }
        uint32_t pa[1][NK / 2][4];
        oss_attn_online_softmax<T, 1, NK, NO>(s, o, m, l, lr, c, pa);
        oss_warp_mma_rs<T, 1, NO, NK / 2, KD, true>(o, pa, oss_smem_u32(sV + (st * BK + warp * KW) * KD), lane);
      }
    }
  };
  if (a.variants) key_loop(std::true_type());
  else key_loop(std::false_type());
  oss_cp_async_wait<0>();
  __syncthreads(); /* the stages are free: they hold the warp states now */

  /* merge: warp w's state for row r is sm/sl/slr[w][r] and sO[w][r][0..KD) */
  float *sO = reinterpret_cast<float *>(sK);
  float *sm = sO + 4 * 16 * OP, *sl = sm + 4 * 16, *slr = sl + 4 * 16;
  const int t2 = (lane & 3) * 2;
#pragma unroll
  for (int hi = 0; hi < 2; hi++) {
    float lt = l[0][hi], lrt = lr[0][hi];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    lrt += __shfl_xor_sync(0xffffffffu, lrt, 1);
    lrt += __shfl_xor_sync(0xffffffffu, lrt, 2);
    const int r = g + hi * 8;
    if ((lane & 3) == 0) {
      sm[warp * 16 + r] = m[0][hi];
      sl[warp * 16 + r] = lt;
      slr[warp * 16 + r] = lrt;
    }
#pragma unroll
    for (int n = 0; n < NO; n++) {
      sO[(warp * 16 + r) * OP + n * 8 + t2] = o[0][n][2 * hi];
      sO[(warp * 16 + r) * OP + n * 8 + t2 + 1] = o[0][n][2 * hi + 1];
    }
  }
  __syncthreads();

  /* thread tid: row tid / 8, columns tid % 8 + 8c; in a cluster every
   * thread goes on to the cluster's barriers */
  const int r = tid >> 3, R = r0 + r;
  if (R >= rows_total && !a.dec_cluster) return;
  float mx = -INFINITY;
#pragma unroll
  for (int w = 0; w < 4; w++) mx = fmaxf(mx, sm[w * 16 + r]);
  float wt[4], lt = 0.f, lrt = 0.f;
#pragma unroll
  for (int w = 0; w < 4; w++) {
    wt[w] = mx == -INFINITY ? 0.f : oss_ex2(sm[w * 16 + r] - mx);
    lt += wt[w] * sl[w * 16 + r];
    lrt += wt[w] * slr[w * 16 + r];
  }
  /* lr >= 1 when l > 0: the largest P of the row is exactly 1 */
  const float inv = lt == 0.f ? 0.f : 1.f / lrt;
  /* natural-log lse, in double: one rounding of m ln2 + ln l */
  const float lse = lt == 0.f ? -INFINITY : (float)((double)mx * OSS_LN2 + (double)logf(lt));
  const int h = hk * a.group + R / a.lq, i = R % a.lq;
  const int64_t row = ((int64_t)b * a.hq + h) * a.lq + i;
  if (a.dec_splits == 1) {
    const oss_attn_dec_out_row<T> orow = oss_attn_dec_row_at<T>(a, b, h, i);
    for (int c = tid & 7; c < a.dv; c += 8) {
      float acc = 0.f;
#pragma unroll
      for (int w = 0; w < 4; w++) acc += wt[w] * sO[(w * 16 + r) * OP + c];
      oss_attn_dec_store(orow, c, acc * inv);
    }
    if ((tid & 7) == 0) ((float *)a.lse)[row] = lse;
  } else if (a.dec_cluster) {
    /* the normalised partial in place of warp 0's o (each column read and
     * written by one thread), its lse after the warps' states */
    float *sx = slr + 4 * 16;
    for (int c = tid & 7; c < a.dv; c += 8) {
      float acc = 0.f;
#pragma unroll
      for (int w = 0; w < 4; w++) acc += wt[w] * sO[(w * 16 + r) * OP + c];
      sO[r * OP + c] = acc * inv;
    }
    if ((tid & 7) == 0) sx[r] = lse;
    oss_attn_dec_cluster_merge<T>(a, sO, sx, OP, b, hk, r0, rows_total, split, tid);
  } else {
    const int64_t nrows = (int64_t)a.batch * a.hq * a.lq, prow = (int64_t)split * nrows + row;
    float *po = a.part_o + prow * oss_attn_dec_part_ld(a.dv);
    for (int c = tid & 7; c < a.dv; c += 8) {
      float acc = 0.f;
#pragma unroll
      for (int w = 0; w < 4; w++) acc += wt[w] * sO[(w * 16 + r) * OP + c];
      po[c] = acc * inv;
    }
    if ((tid & 7) == 0) a.part_lse[prow] = lse;
  }
}

/* Merges the splits' partial outputs of one output row per CTA of 256
 * threads: weights w_s = exp(lse_s - max_s lse_s) (thread s), out =
 * sum_s w_s o_s / sum_s w_s, lse = max + log(sum_s w_s); a row no split saw
 * gives 0 and -inf, a NaN lse of any split gives NaN (as the one-split kernel
 * does). The warps take the splits in turn over 16-byte column groups (a
 * lane owns columns 4 c4 .. 4 c4 + 3, +128; where a row has fewer than 32
 * groups, the warp's lanes form 32 / C groups of C lanes, each taking the
 * warp's splits in turn), so a row's loads are spread over the whole CTA
 * and are in flight together: with few rows this kernel is bound by their
 * latency. The lane groups' and then the eight warps' sums are added in a
 * fixed order. */
template <typename T>
__global__ void __launch_bounds__(256) oss_attn_dec_combine_kernel(const oss_attn_args a) {
  static_assert(OSS_ATTN_DEC_MAX_SPLITS <= 256, "one split per thread for the weights");
  __shared__ float sw[OSS_ATTN_DEC_MAX_SPLITS];
  __shared__ float red[2][8];
  __shared__ __align__(16) float sacc[8][256];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t nrows = (int64_t)a.batch * a.hq * a.lq, row = blockIdx.x;
  const int splits = a.dec_splits, ld = oss_attn_dec_part_ld(a.dv);
  oss_pdl_wait(); /* launched behind the split kernel (oss_launch_dependent): its partials */
  const float x = tid < splits ? a.part_lse[(int64_t)tid * nrows + row] : -INFINITY;
  const bool nan = __syncthreads_or(x != x) != 0;
  float mx = x;
#pragma unroll
  for (int k = 16; k >= 1; k >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, k));
  if (lane == 0) red[0][warp] = mx;
  __syncthreads();
  mx = red[0][0];
#pragma unroll
  for (int w = 1; w < 8; w++) mx = fmaxf(mx, red[0][w]);
  const float wt = tid < splits && mx != -INFINITY ? expf(x - mx) : 0.f;
  if (tid < splits) sw[tid] = wt;
  float sum = wt;
#pragma unroll
  for (int k = 16; k >= 1; k >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, k);
  if (lane == 0) red[1][warp] = sum;
  __syncthreads();
  sum = 0.f;
#pragma unroll
  for (int w = 0; w < 8; w++) sum += red[1][w];

  const float4 *po = reinterpret_cast<const float4 *>(a.part_o + row * ld);
  const int64_t split_stride4 = nrows * ld / 4;
  /* C lanes cover a row's column groups (the power of two >= ld / 4, at most
   * 32); the warp's 32 / C lane groups take its splits in turn, so narrow rows
   * keep every lane loading, and their sums are added in a fixed order */
  const int groups4 = ld / 4;
  int C = 1;
  while (C < groups4 && C < 32) C *= 2;
  const int sub = lane / C, nsub = 32 / C;
  for (int c4 = lane % C; c4 - lane % C < groups4; c4 += C) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (c4 < groups4) {
#pragma unroll 8
      for (int s = warp * nsub + sub; s < splits; s += 8 * nsub) {
        const float4 v = po[s * split_stride4 + c4];
        const float w = sw[s];
        acc.x += w * v.x;
        acc.y += w * v.y;
        acc.z += w * v.z;
        acc.w += w * v.w;
      }
    }
    for (int k = C; k < 32; k *= 2) {
      acc.x += __shfl_xor_sync(0xffffffffu, acc.x, k);
      acc.y += __shfl_xor_sync(0xffffffffu, acc.y, k);
      acc.z += __shfl_xor_sync(0xffffffffu, acc.z, k);
      acc.w += __shfl_xor_sync(0xffffffffu, acc.w, k);
    }
    if (sub == 0 && c4 < groups4) reinterpret_cast<float4 *>(sacc[warp])[c4] = acc;
  }
  __syncthreads();
  const float inv = oss_attn_dec_merge_inv(mx, sum, nan);
  const int i = (int)(row % a.lq), h = (int)(row / a.lq % a.hq), b = (int)(row / a.lq / a.hq);
  const oss_attn_dec_out_row<T> orow = oss_attn_dec_row_at<T>(a, b, h, i);
  for (int c = tid; c < a.dv; c += 256) {
    float acc = 0.f;
#pragma unroll
    for (int w = 0; w < 8; w++) acc += sacc[w][c];
    oss_attn_dec_store(orow, c, acc * inv);
  }
  if (tid == 0) ((float *)a.lse)[row] = oss_attn_dec_merge_lse(mx, sum, nan);
}

/* Entry point instantiated once per (decode head dim, dtype) by the
 * generator; a->dec_splits, a->dec_tiles and the partial buffers are set by
 * the host (attention.cu). */
template <typename T, int HD>
oss_status oss_attn_dec_launch(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev) {
  /* A plan of clusters meets a kernel without their merge where the build has
   * no sm_90 code (older PTX the driver compiled for this device): one split
   * then takes every tile, which needs no merge. */
  static const bool cluster_code = oss_kernel_ptx_arch(oss_attn_dec_kernel<T, HD>) >= 90;
  oss_attn_args one;
  if (a->dec_cluster && !cluster_code) {
    one = *a;
    one.dec_tiles = a->dec_tiles * a->dec_splits;
    one.dec_splits = 1;
    one.dec_cluster = 0;
    a = &one;
  }
  const int64_t row_tiles = ((int64_t)a->group * a->lq + OSS_ATTN_DEC_ROWS - 1) / OSS_ATTN_DEC_ROWS;
  const dim3 grid((unsigned)row_tiles, (unsigned)a->dec_splits, (unsigned)((int64_t)a->batch * a->hkv));
  oss_status st = oss_attn_launch(oss_attn_dec_kernel<T, HD>,
                                  a->dec_cluster ? "attention decode forward (mma.sync, clusters of splits)"
                                                 : "attention decode forward (mma.sync)",
                                  HD, oss_attn_dec_smem_bytes(HD), grid, 128, a, stream, dev,
                                  a->dec_cluster ? a->dec_splits : 1);
  if (st != OSS_OK || a->dec_splits == 1 || a->dec_cluster) return st;
  const int64_t nrows = (int64_t)a->batch * a->hq * a->lq;
  return oss_launch_dependent(oss_attn_dec_combine_kernel<T>, dim3((unsigned)nrows), dim3(256), 0, stream, dev,
                              "attention decode combine", *a);
}

#endif /* OSS_ATTENTION_DECODE_CUH */
