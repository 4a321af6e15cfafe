/*
 * attention_fwd_sm90.cuh - the attention forward on Hopper's warpgroup tensor
 * cores (wgmma, sm_90a; float16 and bfloat16, head dims 64, 96, 128, 192 and 256): the
 * same result as attention_fwd.cuh (out = softmax(scale Q K^T + mask) V, lse
 * per query row), computed with m64nNk16 wgmma and bulk tensor copies.
 *
 * A CTA takes one work block (BR = 128 query rows of one (batch, query
 * head)) or, on a persistent grid, several (oss_sm90_first_block); then a
 * block's epilogue runs while the next block's Q and K/V load. The launcher
 * picks the grid (see there). A block streams the keys of its
 * kv head (h / group) in tiles of BC, warp-specialised:
 *   - a producer warpgroup gives its registers away (setmaxnreg) and one of
 *     its threads issues the bulk tensor copies (TMA): Q once, then K_j and
 *     V_j into stage j % STAGES, each tile as 64-column boxes landing in the
 *     128-byte-swizzled layout wgmma reads; K and V of a stage complete on
 *     their own "full" mbarriers (S can start before V lands), and a stage is
 *     refilled once every consumer warp arrived on its "empty" mbarrier.
 *   - two consumer warpgroups; warpgroup w owns query rows [64w, 64w + 64) of
 *     the tile, warp k of it rows 16k .. 16k + 15 (the wgmma accumulator
 *     layout, the mma.sync C layout, so masking and the output code are shared
 *     with the mma.sync kernel). Per key tile j, inside one warpgroup:
 *       issue S_j = Q K_j^T and O += P_{j-1} V_{j-1} (both asynchronous),
 *       wait for S_j, mask and exponentiate it (row max m, sum l), wait for
 *       the P V product, rescale O by exp2(m_old - m_new), pack P_j to 16 bits
 *     so the softmax of tile j runs while the tensor cores finish P_{j-1} V.
 *     Without the score variants the tensor cores also sum each row's rounded
 *     P (lr, which out is divided by): a box of ones follows V's columns in
 *     every stage and P V runs with N = HD + 8 (oss_attn_fwd_sm90_ones).
 *     With PINGPONG the two warpgroups also take turns issuing their products
 *     (named barriers), so one's softmax runs under the other's products.
 *   - a mask tensor is read by the variants built for it (MASK; the
 *     variant without holds fewer registers): where the copy engine can
 *     address it and a stage fits, the producer copies each key tile's mask
 *     tile into shared memory (oss_sm90_load_mask) as two halves, one per
 *     warpgroup's 64 rows (or one row where every query row has the same
 *     mask), each on its own mbarriers, in two stages or, where two do not
 *     fit, one (oss_sm90_mask_scores_stage; MASK = 2, on the persistent
 *     grid; a warp's tile whose mask changes no score and which no bound
 *     cuts takes the plain arithmetic: oss_sm90_mask_rows_neutral);
 *     otherwise element by element from global memory (MASK = 1, one CTA
 *     per block, without ping-pong).
 *   - a window's key tiles only (producer and consumers both walk jt0 ..
 *     ntiles - 1). The kernel without a mask tensor applies a window as it
 *     applies the causal rule (on the tiles across its edges), so a window
 *     alone runs it, instantiated apart (WINDOW: jt0 in a register, and
 *     ALiBi's slope and distances; the others know jt0 = 0 and have no
 *     ALiBi); a window's blocks go on the persistent grid by stride.
 *   - sinks without dropout: the plain kernels merge a row's sink into its
 *     statistics after its last key tile (oss_sm90_sink_merge). A softcap
 *     and ALiBi (with or without a window or sinks, no dropout) run the
 *     WINDOW instantiation, which caps a tile's scores before masking it
 *     (oss_sm90_plain_scores) and adds its biases after (oss_sm90_alibi).
 *   - VAR (a separate instantiation): the other score variants of oss.h
 *     through oss_attn_fwd_var_scores (as in the mma.sync kernel), a row's
 *     softmax starting at its sink; calls that also carry a mask tensor run
 *     the mma.sync kernel with the variants instead. Dropout (a variant
 *     too), as in the mma.sync kernel: a tile's kept weights drawn after its
 *     exponentials, while the previous P V runs, the dropped ones zeroed once
 *     P is packed, and 1 / (1 - p) applied to out at the end.
 *   - a variable-length batch (oss.h cu_seqlens): the work blocks of a head
 *     are slots of the packed rows (oss_attn_seq_slots), so the grid follows
 *     the tokens rather than batch x the longest sequence; a block's arguments
 *     become its sequence's view, the copies address the packed rows from the
 *     sequence's first row in one batch of the tensor maps, and the rows of
 *     the last key tile past the sequence (the next sequence's, weight 0) are
 *     zeroed in shared memory before its P V (oss_sm90_zero_rows).
 *   - the epilogue: lse and the backward's residual leave from registers;
 *     out too, except in the kernels without score variants or a mask tensor
 *     at head dims 64 to 128 on a dense batch, where each warpgroup stages
 *     its 64 rows in shared memory (stmatrix, oss_sm90_stage_acc) and one of
 *     its threads hands them to a bulk tensor store (tensor map maps.o).
 *   - every tile up to the causal diagonal is computed by both warpgroups
 *     (a tile a warpgroup cannot see is masked to zero weight): a wgmma under
 *     a branch would make ptxas serialise them all.
 * Limits: D up to HD and Dv up to DV (HD, or a narrower DV where the table
 * has one), zero padded by the copy engine; both multiples of 16, tiles in
 * shared memory of whole 64-column boxes (head dim 96: two, the copy engine
 * zero-filling columns 96 .. 127, which the products skip; no ones column
 * there, as it would have to follow V's columns inside the zero-filled box:
 * the softmax sums the rounded P); q, k and v with 16-byte aligned base and strides (the
 * tensor maps' rule; the launcher sends other inputs to the mma.sync kernel);
 * built only for sm_90a (the launcher is in the dispatch table only when the
 * build includes that target; elsewhere the kernel body traps).
 */
#ifndef OSS_ATTENTION_FWD_SM90_CUH
#define OSS_ATTENTION_FWD_SM90_CUH

#include "cuda/attention/mma/attention_fwd.cuh"
#include "cuda/attention/sm90/attention_sm90.cuh"

/* Tiles per head dim. Registers bound them: a consumer thread holds O (HD / 2
 * floats), S (BC / 2 floats) and P (BC / 4 words); shared memory holds Q and
 * STAGES stages of K and V (and the ones box, oss_attn_fwd_sm90_ones).
 * Head dim 192 takes 96-key tiles: two stages of 128 keys would not fit in
 * shared memory; head dim 256 takes 80 (Q and two stages of 80 keys fill
 * 225 KB of it). */
template <int HD> struct oss_attn_fwd_sm90_cfg {
  static constexpr int BC = HD <= 128 ? 128 : HD <= 192 ? 96 : 80;
  /* the kernel that reads a mask tensor holds the more registers: above head
   * dim 128 it takes 64-key tiles (at 96 it spilled) */
  static constexpr int BC_MASK = HD <= 128 ? BC : 64;
  /* A kernel for calls whose v is narrower (DV_NARROW, 0: none; head dims
   * (192, 128) as in multi-head latent attention): O, P V and V's stages
   * shrink, so its key tiles grow to BC_NARROW (Q and two stages of 112
   * keys with the ones box fill 217 KB of shared memory) */
  static constexpr int DV_NARROW = HD == 192 ? 128 : 0;
  static constexpr int BC_NARROW = 112;
  static constexpr int STAGES = 2;
  static constexpr bool PINGPONG = HD <= 192;
  /* Consumer warpgroups of a second plain kernel (0: none), 192 query rows a
   * block. At head dim 64 a tile's exponentials (64 x BC per warpgroup, 16
   * a clock on an SM) take about as long as its two products, so while two
   * warpgroups take turns the tensor cores wait for the softmax; a third
   * keeps them fed. Causal blocks of 192 rows compute more masked tiles:
   * oss_attn_fwd_sm90_wide picks the kernel per call. Head dim 96 (products
   * three quarters of 128's, the same softmax) too, with 112-key tiles
   * (BC_WIDE): with 128 its consumers spilled 160 bytes under the
   * 160-register budget. */
  static constexpr int NWG_WIDE = HD == 64 || HD == 96 ? 3 : 0;
  static constexpr int BC_WIDE = HD == 96 ? 112 : BC;
  /* A dense batch without a mask tensor (score variants included, causal or
   * not) runs on a persistent grid (a block's epilogue under the next block's
   * loads), which measured faster at every seqlen and head dim, most at short
   * seqlens. */
  static bool persistent(const oss_attn_args *a) { return a->cu_q == NULL; }
  /* Head dim 96 is no variant head dim: a window call reaches the head-dim-128
   * kernels (its variant launcher's plain kernel), so 96 has no window kernel */
  static constexpr bool WINDOW_KERNEL = HD % 64 == 0;
};

/* Kernels without the score variants sum each row's rounded P (lr, which out
 * is divided by) on the tensor cores: P V with N = HD + 8, the 8 extra
 * columns of V all ones (a 64-column box per stage that the copies never
 * touch), so the accumulator's column HD holds the row's sum, rescaled with
 * O. The softmax then spends no instructions on unpacking and adding the
 * rounded P. Not at head dim 256 (N would pass 256), not where V's columns
 * end inside a box (head dim 96: the ones would sit in the box the copy
 * engine zero-fills), and not with the variants: with dropout lr sums P
 * before the dropped weights are zeroed. */
template <int DV, bool VAR> __host__ __device__ constexpr bool oss_attn_fwd_sm90_ones() {
  return !VAR && DV % 64 == 0 && DV + 8 <= 256;
}
/* Elements of a V stage: oss_sm90_cols(DV) / 64 boxes of BC rows, plus the ones box. */
template <int DV, bool VAR> __host__ __device__ constexpr int oss_attn_fwd_sm90_v_cols() {
  return oss_sm90_cols(DV) + (oss_attn_fwd_sm90_ones<DV, VAR>() ? 64 : 0);
}


/* The tensor maps of q, k and v: 4-D (head dim, length, heads, batch) with the
 * tensors' strides, boxes of 64 columns by BR (q) or BC (k, v) rows; and of
 * out, boxes of 64 columns by 64 rows, where out_tma says the kernel stores
 * out with it (oss_attn_fwd_sm90_out_stage_bytes). */
typedef struct oss_attn_sm90_maps {
  CUtensorMap q, k, v, o, m;
  int out_tma;
  /* the mask tensor's tiles (tensor map m), where the kernel takes them by
   * the copy engine (oss_attn_fwd_sm90_kernel's MASK = 2) */
  oss_attn_sm90_mask_tiles mask;
} oss_attn_sm90_maps;

/* Q and the K and V stages, + room to align the tiles to 1024 bytes. */
template <int HD, int DV, int BR, int BC, int STAGES, bool VAR>
__host__ __device__ constexpr size_t oss_attn_fwd_sm90_tile_bytes() {
  return (size_t)(BR * oss_sm90_cols(HD) + STAGES * BC * (oss_sm90_cols(HD) + oss_attn_fwd_sm90_v_cols<DV, VAR>())) * 2 +
         1024;
}
/* out's staging for the copy engine (two warpgroups' 64 rows, whole 64-column
 * boxes) after the V stages, in the kernels without score variants where
 * shared memory has room for it beside the tiles (head dims up to 128; the
 * kernel that reads a mask tensor has it but stores from registers); 0 where
 * the kernel stores out from registers. *Reason:* a consumer's stores to
 * global memory hold the epilogue, which a block of a short sequence pays
 * often: with the copy engine the forward ran 2-5 % faster at seqlen 512
 * (head dims 64 and 128, H200) and level from 2k keys up. */
template <int HD, int DV, int BR, int BC, int STAGES, bool VAR>
__host__ __device__ constexpr size_t oss_attn_fwd_sm90_out_stage_bytes() {
  constexpr size_t stage = (size_t)BR * oss_sm90_cols(DV) * 2; /* every warpgroup's 64 rows */
  /* 2 KB of the 227 KB a CTA may take are left to the static shared memory */
  return !VAR && oss_attn_fwd_sm90_tile_bytes<HD, DV, BR, BC, STAGES, VAR>() + stage <= 225 * 1024 ? stage : 0;
}
template <int HD, int DV, int BR, int BC, int STAGES, bool VAR>
__host__ __device__ constexpr size_t oss_attn_fwd_sm90_smem_bytes() {
  return oss_attn_fwd_sm90_tile_bytes<HD, DV, BR, BC, STAGES, VAR>() +
         oss_attn_fwd_sm90_out_stage_bytes<HD, DV, BR, BC, STAGES, VAR>();
}

/* Softmax of one tile, first half (S landed, the previous P V may still run):
 * scale and mask were applied by oss_attn_fwd_mask_scores (c its factor); the
 * new row max m, alpha = exp2(m_old - m_new) per row, P = exp2(c s - m) in
 * place of s, and l = alpha l + rowsum(P). Rows g and g + 8 of the warp's 16;
 * a row's 4 owners are one quad. */
template <int NT>
__device__ __forceinline__ void oss_sm90_softmax_exp(float (&s)[NT][4], float (&m)[2], float (&l)[2],
                                                     float (&alpha)[2], float c) {
#pragma unroll
  for (int hi = 0; hi < 2; hi++) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < NT; n++) mx = fmaxf(mx, fmaxf(s[n][2 * hi], s[n][2 * hi + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[hi], mx * c);
    const float m_use = m_new == -INFINITY ? 0.f : m_new; /* fully masked so far: p = 0 */
    alpha[hi] = oss_ex2(m[hi] - m_use);
    m[hi] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < NT; n++) {
      s[n][2 * hi] = oss_ex2(fmaf(s[n][2 * hi], c, -m_use));
      s[n][2 * hi + 1] = oss_ex2(fmaf(s[n][2 * hi + 1], c, -m_use));
      sum += s[n][2 * hi] + s[n][2 * hi + 1];
    }
    l[hi] = l[hi] * alpha[hi] + sum;
  }
}

/* Second half (the previous P V completed, so O and P's registers are free):
 * O *= alpha, P packed to T as the A fragments of P V (pa[kk] holds n-tiles
 * 2kk and 2kk + 1), and, with SUM_ROUNDED, lr = alpha lr + the row sum of the
 * rounded P, which out is normalised by (see oss_attn_online_softmax;
 * without, the ones column of O holds it: oss_attn_fwd_sm90_ones). */
template <typename T, int NT, int NO, bool SUM_ROUNDED>
__device__ __forceinline__ void oss_sm90_softmax_pack(const float (&s)[NT][4], float (&o)[NO][4], float (&lr)[2],
                                                      const float (&alpha)[2], uint32_t (&pa)[NT / 2][4]) {
#pragma unroll
  for (int hi = 0; hi < 2; hi++) {
    float sum_rounded = 0.f;
#pragma unroll
    for (int n = 0; n < NT; n++) {
      const uint32_t packed = oss_mma_op<T>::pack(s[n][2 * hi], s[n][2 * hi + 1]);
      pa[n / 2][2 * (n & 1) + hi] = packed;
      if (SUM_ROUNDED) {
        const float2 rounded = oss_mma_op<T>::unpack(packed);
        sum_rounded += rounded.x + rounded.y;
      }
    }
    if (SUM_ROUNDED) lr[hi] = lr[hi] * alpha[hi] + sum_rounded;
#pragma unroll
    for (int n = 0; n < NO; n++) {
      o[n][2 * hi] *= alpha[hi];
      o[n][2 * hi + 1] *= alpha[hi];
    }
  }
}

/* A sink (log2 units) joins a row's statistics after its last key tile, where
 * the plain kernels take it: the same sums as a softmax that starts at the
 * sink (the variant kernels' order), P rounded relative to the keys' max
 * rather than to the larger of it and the sink. m_new = max(m, sink); O, l
 * and lr scale by exp2(m - m_new), and one quad lane's l and lr gain
 * exp2(sink - m_new); both exponents are <= 0. A row with no visible key
 * (m = -inf) gets l = lr = 1 on that lane, so out 0 and lse the sink; a NaN m
 * stays NaN through the factor. Needs lr summed by the lanes (after the ones
 * column's sum is taken out of O). */
template <int NO>
__device__ __forceinline__ void oss_sm90_sink_merge(float (&o)[NO][4], float (&m)[2], float (&l)[2], float (&lr)[2],
                                                    float sink, int lane) {
#pragma unroll
  for (int hi = 0; hi < 2; hi++) {
    const float m_new = fmaxf(m[hi], sink);
    if (m_new == -INFINITY) continue; /* no visible key and a sink of -inf: l stays 0 */
    const float alpha = oss_ex2(m[hi] - m_new), add = (lane & 3) == 0 ? oss_ex2(sink - m_new) : 0.f;
    l[hi] = l[hi] * alpha + add;
    lr[hi] = lr[hi] * alpha + add;
    m[hi] = m_new;
#pragma unroll
    for (int n = 0; n < NO; n++) {
      o[n][2 * hi] *= alpha;
      o[n][2 * hi + 1] *= alpha;
    }
  }
}

/* A tile of raw products scored and masked as oss_attn_fwd_mask_scores does
 * (c, the softmax's factor, returned), or, with a softcap (cap: the softcap
 * times log2(e), 0: off; cap_k as oss_attn_var_consts'), capped first, in log2
 * units, by oss_attn_cap_r and oss_attn_capped, as the variant kernels'
 * oss_attn_var_value, so that the backward recomputes the same scores, then
 * masked (c = 1). A softcap comes here only with a positive scale, under
 * which masking leaves the visible scores as they are. */
template <typename T, int NT, bool WINDOW>
__device__ __forceinline__ float oss_sm90_plain_scores(float (&s)[1][NT][4], const oss_attn_args &a, int r0, int j0,
                                                       int lane, float cap, float cap_k) {
  if (WINDOW && cap > 0.f) {
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[0][n][e] = oss_attn_capped(oss_attn_cap_r(s[0][n][e], cap_k), cap);
    oss_attn_fwd_mask_scores<T, 1, NT, false, WINDOW>(s, a, 0, r0, j0, lane);
    return 1.f;
  }
  return oss_attn_fwd_mask_scores<T, 1, NT, false, WINDOW>(s, a, 0, r0, j0, lane);
}

/* ALiBi on a tile of scores masked as raw products (oss_attn_fwd_mask_scores,
 * c its factor): s <- c s - slope |i + off - j| in log2 units, after which the
 * softmax takes the factor 1. d0: i + off - j of the thread's first element
 * (row g, column 2t); element (n, e) is d0 + 8 (e >> 1) - 8 n - (e & 1), exact
 * in float below 2^24. A hidden score stays -inf. */
template <int NT>
__device__ __forceinline__ void oss_sm90_alibi(float (&s)[NT][4], float c, float slope, float d0) {
#pragma unroll
  for (int n = 0; n < NT; n++)
#pragma unroll
    for (int e = 0; e < 4; e++)
      s[n][e] = fmaf(s[n][e], c, -slope * fabsf(d0 + (float)(8 * (e >> 1) - 8 * n - (e & 1))));
}

/* A tile of scores (raw products) masked by a mask tile in shared memory
 * (oss_sm90_load_mask; M its element: bool bytes, float or the 16-bit T):
 * scaled to log2 units, the mask's value added (a bool's 0 or -inf, an
 * additive one times log2(e)), and -inf past the keys or the causal
 * diagonal, as oss_attn_mask_frag does from global memory. r0: the global
 * row of the thread's first (row g of its warp's 16), rl0: that row in the
 * block. The element at (row r, key c) of the tile lies in box c / COLS at
 * row r (row 0 when the mask is the same for every row), in the copy
 * engine's swizzle: the 16-byte chunks of a SPAN-byte row XORed with the
 * row's index (bits 7.. of the offset into bits 4..). A thread's pair of
 * keys never straddles a chunk. */
template <typename M, typename T, int NT>
__device__ __forceinline__ void oss_sm90_mask_from_tile(float (&s)[NT][4], const oss_attn_args &a, uint32_t tile,
                                                        const oss_attn_sm90_mask_tiles &t, int r0, int rl0, int j0,
                                                        int lane) {
  constexpr int ES = (int)sizeof(M), BC = NT * 8, COLS = BC * ES < 128 ? BC : 128 / ES, SPAN = COLS * ES;
  constexpr int SWZ = SPAN == 128 ? 0x70 : 0x30;
  const int g = lane >> 2, t2 = (lane & 3) * 2;
  const bool same_rows = t.rows == 1;
  /* a tile inside the keys and left of the causal diagonal for the warp's rows
   * (rows past the queries are never stored): the mask's value alone */
  const bool inside = j0 + BC <= a.lk && (!a.causal || (int64_t)(j0 + BC - 1) <= (int64_t)r0 + a.causal_off);
#pragma unroll
  for (int hi = 0; hi < 2; hi++) {
    const int R = r0 + g + hi * 8;
    const int64_t last = a.causal ? (int64_t)R + a.causal_off : (int64_t)a.lk - 1;
    const int cmax = (int)(last < (int64_t)a.lk - 1 ? (last < -1 ? -1 : last) : (int64_t)a.lk - 1);
    const bool row_in = R < a.lq;
    const int row_off = same_rows ? 0 : (rl0 + g + hi * 8) * SPAN;
#pragma unroll
    for (int n = 0; n < NT; n++) {
      const int cl = n * 8 + t2, off = cl / COLS * t.box_bytes + row_off + cl % COLS * ES;
      const uint32_t p = tile + (uint32_t)(off ^ ((off >> 3) & SWZ));
      float v0, v1;
      if constexpr (ES == 1) {
        uint16_t w;
        asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(w) : "r"(p) : "memory");
        v0 = (w & 0xffu) ? 0.f : -INFINITY;
        v1 = (w >> 8) ? 0.f : -INFINITY;
      } else if constexpr (ES == 2) {
        uint32_t w;
        asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(w) : "r"(p) : "memory");
        const float2 f = oss_mma_op<T>::unpack(w);
        v0 = f.x * (float)OSS_LOG2E;
        v1 = f.y * (float)OSS_LOG2E;
      } else {
        float2 f;
        asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(f.x), "=f"(f.y) : "r"(p) : "memory");
        v0 = f.x * (float)OSS_LOG2E;
        v1 = f.y * (float)OSS_LOG2E;
      }
      const int C = j0 + cl;
      s[n][2 * hi] = inside || (row_in && C <= cmax) ? s[n][2 * hi] + v0 : -INFINITY;
      s[n][2 * hi + 1] = inside || (row_in && C + 1 <= cmax) ? s[n][2 * hi + 1] + v1 : -INFINITY;
    }
  }
}

/* Whether a mask tile (as oss_sm90_mask_from_tile reads it; M's size ES,
 * BC keys) is neutral (oss_sm90_mask_chunk_neutral) on a warp's 16 rows
 * from rl0, or on its one row where the mask is the same for every row. A
 * box's bytes of consecutive rows are one range whatever the swizzle (it
 * permutes the chunks within a row); each lane tests 16-byte chunks of the
 * ranges, its first before the others, so that a tile which is not neutral
 * mostly costs one load and one vote. */
template <int ES, int BC>
__device__ __forceinline__ bool oss_sm90_mask_rows_neutral(uint32_t tile, const oss_attn_sm90_mask_tiles &t, int rl0,
                                                           int lane) {
  constexpr int COLS = BC * ES < 128 ? BC : 128 / ES, SPAN = COLS * ES, BOXES = BC / COLS;
  /* other tile widths (the plain kernels' 80 and 96 keys) never take a mask tile */
  if constexpr (BC % COLS != 0 || BOXES * SPAN % 32 != 0 || BOXES * SPAN / 16 > 32) return false;
  if (t.rows == 1) { /* one row: BOXES * SPAN / 16 chunks, at most one a lane */
    constexpr int PER_BOX = SPAN / 16;
    return __all_sync(0xffffffffu, lane >= BOXES * PER_BOX ||
                                       oss_sm90_mask_chunk_neutral<ES>(tile + (uint32_t)(lane / PER_BOX * t.box_bytes +
                                                                                        lane % PER_BOX * 16)));
  }
  constexpr int PER_BOX = SPAN, N = BOXES * PER_BOX / 32; /* 16 rows of SPAN bytes: SPAN chunks a box */
  const uint32_t rows = tile + (uint32_t)(rl0 * SPAN);
  auto at = [&](int q) { return rows + (uint32_t)(q / PER_BOX * t.box_bytes + q % PER_BOX * 16); };
  if (!__all_sync(0xffffffffu, oss_sm90_mask_chunk_neutral<ES>(at(lane)))) return false;
  bool neutral = true;
#pragma unroll
  for (int k = 1; k < N; k++) neutral &= oss_sm90_mask_chunk_neutral<ES>(at(lane + 32 * k));
  return __all_sync(0xffffffffu, neutral);
}

/* oss_attn_fwd_mask_scores for a mask whose tile is in shared memory: the
 * factor c of the exponent is 1 (the scores are scaled here), except on a
 * tile inside the keys and left of the causal diagonal for the warp's rows
 * whose mask is neutral there (a padding mask's whole keys, the inside of a
 * causal or block mask), which takes the plain kernel's arithmetic: raw
 * scores and c = the scale (while it is positive). */
template <typename T, int NT>
__device__ __forceinline__ float oss_sm90_mask_scores_tile(float (&s)[NT][4], const oss_attn_args &a, uint32_t tile,
                                                           const oss_attn_sm90_mask_tiles &t, int r0, int rl0,
                                                           int j0, int lane) {
  constexpr int BC = NT * 8;
  if (a.scale_log2 > 0.f && j0 + BC <= a.lk &&
      (!a.causal || (int64_t)(j0 + BC - 1) <= (int64_t)r0 + a.causal_off) &&
      (a.mask_dtype == OSS_BOOL      ? oss_sm90_mask_rows_neutral<1, BC>(tile, t, rl0, lane)
       : a.mask_dtype == OSS_FLOAT32 ? oss_sm90_mask_rows_neutral<4, BC>(tile, t, rl0, lane)
                                     : oss_sm90_mask_rows_neutral<2, BC>(tile, t, rl0, lane)))
    return a.scale_log2;
#pragma unroll
  for (int n = 0; n < NT; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) s[n][e] *= a.scale_log2;
  if (a.mask_dtype == OSS_BOOL) oss_sm90_mask_from_tile<unsigned char, T, NT>(s, a, tile, t, r0, rl0, j0, lane);
  else if (a.mask_dtype == OSS_FLOAT32) oss_sm90_mask_from_tile<float, T, NT>(s, a, tile, t, r0, rl0, j0, lane);
  else oss_sm90_mask_from_tile<T, T, NT>(s, a, tile, t, r0, rl0, j0, lane);
  return 1.f;
}

/* oss_sm90_mask_scores_tile on key tile `tile_no` of the CTA's sequence of
 * tiles, from warpgroup wg's half of its mask stage (`half`: the half of
 * stage 0; stages t.stages, each two halves of t.stage_bytes): waits for the
 * half to land, and gives it back once the warp has read it. */
template <typename T, int NT>
__device__ __forceinline__ float oss_sm90_mask_scores_stage(float (&s)[NT][4], const oss_attn_args &a, uint32_t half,
                                                            const oss_attn_sm90_mask_tiles &t, uint64_t (*full)[2],
                                                            uint64_t (*empty)[2], int wg, int tile_no, int r0, int rl0,
                                                            int j0, int lane) {
  const int ms = tile_no & (t.stages - 1);
  oss_mbar_wait(&full[ms][wg], (tile_no >> (t.stages - 1)) & 1);
  const float c = oss_sm90_mask_scores_tile<T, NT>(s, a, half + 2 * ms * t.stage_bytes, t, r0, rl0, j0, lane);
  __syncwarp();
  if (lane == 0) oss_mbar_arrive(&empty[ms][wg]);
  return c;
}

/* A divisor fixed for a kernel's run as a multiply and a shift: n / d for
 * 0 <= n < 2^31 (d >= 1) in three instructions, where a 32-bit division is a
 * chain of some twenty and a 64-bit one a call; the block loop divides by the
 * same few numbers for every block. mul = 2^32 (2^shift - d) / d + 1 with
 * shift = ceil(log2 d) (Granlund and Montgomery's round-up method; t + n
 * stays below 2^32 as t <= n < 2^31). */
typedef struct oss_fastdiv {
  int d;
  uint32_t mul, shift;
} oss_fastdiv;
__device__ __forceinline__ oss_fastdiv oss_fastdiv_of(int d) {
  oss_fastdiv f;
  f.d = d;
  f.shift = d > 1 ? 32u - (uint32_t)__clz(d - 1) : 0u;
  f.mul = (uint32_t)(((((uint64_t)1 << f.shift) - (uint64_t)d) << 32) / (uint64_t)d + 1u);
  return f;
}
__device__ __forceinline__ int oss_fastdiv_q(int n, const oss_fastdiv &f) {
  return (int)((__umulhi((uint32_t)n, f.mul) + (uint32_t)n) >> f.shift);
}
/* n / f.d, by the multiply or, with DIVIDE, by a division (for a kernel with no
 * registers to hold the multipliers: the compiler then drops them). */
template <bool DIVIDE> __device__ __forceinline__ int oss_fastdiv_div(int n, const oss_fastdiv &f) {
  return DIVIDE ? n / f.d : oss_fastdiv_q(n, f);
}

/* Work blocks per row of the work grid, and the rows (see oss_sm90_block_view). */
__host__ __device__ __forceinline__ int64_t oss_sm90_row_blocks(const oss_attn_args &a, int rows) {
  return a.cu_q != nullptr ? oss_attn_seq_slots(a.total_q, a.batch, rows) : (a.lq + rows - 1) / rows;
}
__host__ __device__ __forceinline__ int64_t oss_sm90_work_rows(const oss_attn_args &a) {
  return a.cu_q != nullptr ? a.hq : (int64_t)a.batch * a.hq;
}

/* A CTA's walk over the work grid (oss_sm90_first_block): nqb blocks per row,
 * nwork in all, by pairs of equal work where `pairs` (units of them, per_row a
 * row), and the divisors the walk and a block's heads need. */
typedef struct oss_sm90_sched {
  int nqb, nwork, units;
  bool pairs;
  oss_fastdiv by_nqb, by_per_row, by_hq, by_group;
} oss_sm90_sched;
template <int BR> __device__ __forceinline__ oss_sm90_sched oss_sm90_sched_of(const oss_attn_args &args) {
  oss_sm90_sched s;
  s.nqb = (int)oss_sm90_row_blocks(args, BR);
  const int rows = (int)oss_sm90_work_rows(args), per_row = (s.nqb + 1) / 2;
  s.nwork = s.nqb * rows; /* the launcher checks that it fits */
  s.units = rows * per_row;
  /* causal blocks in pairs of equal work; a window's blocks are of about equal
   * work each (a left edge caps them), taken by stride */
  s.pairs = args.causal && args.cu_q == nullptr && args.win_left < 0;
  s.by_nqb = oss_fastdiv_of(s.nqb > 0 ? s.nqb : 1);
  s.by_per_row = oss_fastdiv_of(per_row > 0 ? per_row : 1);
  s.by_hq = oss_fastdiv_of(args.hq > 0 ? (int)args.hq : 1);
  s.by_group = oss_fastdiv_of(args.group > 0 ? (int)args.group : 1);
  return s;
}

/* Work block w of nqb per row of the work grid comes as its row *bh = w / nqb
 * (batch * query head) and its query block *block = w % nqb; in a
 * variable-length batch the row is the query head and the block a slot of the
 * packed rows (oss_attn_seq_slots): they become the slot's sequence's (batch *
 * query head, query block), and a its view. False: an empty slot. */
template <typename T, int BR>
__device__ __forceinline__ bool oss_sm90_block_view(oss_attn_args &a, const oss_attn_args &args, int64_t *bh,
                                                    int *block) {
  if (args.cu_q == nullptr) return true;
  a = args;
  const int b = oss_attn_slot_seq(args.cu_q, args.batch, args.total_q, BR, *block, block);
  *bh += (int64_t)b * args.hq;
  oss_attn_seq_view<T>(a, b);
  return *block >= 0 && *block * BR < a.lq;
}

/* oss_attn_query_block_at with the schedule's divisors (bh < 2^31: the
 * launcher checks that the work grid fits an int). DIVIDE: by divisions (the
 * kernel that reads a mask tensor, which the multipliers' registers spill at
 * head dim 128). */
template <int BR, int BC, bool DIVIDE>
__device__ __forceinline__ void oss_sm90_query_block(const oss_attn_args &a, const oss_sm90_sched &s, int64_t bh,
                                                     int block, oss_attn_query_block *q) {
  q->bh = bh;
  q->b = oss_fastdiv_div<DIVIDE>((int)bh, s.by_hq);
  q->h = (int)bh - q->b * (int)a.hq;
  q->hk = oss_fastdiv_div<DIVIDE>(q->h, s.by_group);
  oss_attn_query_block_rows<BR, BC>(a, block, q);
}

/* The work blocks of a CTA: w = oss_sm90_first_block(), then
 * oss_sm90_next_block(w) while w >= 0. One CTA per block (gridDim.x >= nwork)
 * takes block blockIdx.x. A persistent grid of fewer CTAs takes the blocks of
 * a row of the work grid (one head's, consecutive, so the CTAs running at one
 * time share few heads' K and V in L2) by stride, or, with causal masking,
 * whose blocks of a head cost nqb, nqb - 1, ..., 1 key tiles (heaviest first),
 * by pairs of equal work: unit u of a row is block u then block nqb - 1 - u
 * (the middle block of an odd nqb alone), the units taken by stride, so every
 * CTA gets the same work (a stride over single blocks would hand CTA c the
 * same weight every time). Only w carries from one block to the next. */
template <bool DIVIDE> __device__ __forceinline__ int oss_sm90_unit_block(unsigned u, const oss_sm90_sched &s) {
  if (u >= (unsigned)s.units) return -1;
  const int row = oss_fastdiv_div<DIVIDE>((int)u, s.by_per_row);
  return row * s.nqb + ((int)u - row * s.by_per_row.d);
}
template <bool DIVIDE> __device__ __forceinline__ int oss_sm90_first_block(const oss_sm90_sched &s) {
  if (gridDim.x >= (unsigned)s.nwork || !s.pairs) return blockIdx.x < (unsigned)s.nwork ? (int)blockIdx.x : -1;
  return oss_sm90_unit_block<DIVIDE>(blockIdx.x, s);
}
template <bool DIVIDE> __device__ __forceinline__ int oss_sm90_next_block(int w, const oss_sm90_sched &s) {
  if (gridDim.x >= (unsigned)s.nwork) return -1;
  /* unsigned: w + gridDim.x < 2 nwork <= 2 INT_MAX */
  if (!s.pairs) return w + gridDim.x < (unsigned)s.nwork ? (int)(w + gridDim.x) : -1;
  const int row = oss_fastdiv_div<DIVIDE>(w, s.by_nqb), b = w - row * s.nqb, partner = s.nqb - 1 - b;
  if (b < partner) return row * s.nqb + partner; /* the light block of the unit */
  return oss_sm90_unit_block<DIVIDE>((unsigned)row * (unsigned)s.by_per_row.d + (unsigned)partner + gridDim.x, s);
}


template <typename T, int HD, int DV, int BC, int STAGES, bool PINGPONG, int MASK, bool VAR = false,
          bool WINDOW = false, int NWG = 2>
__global__ void __launch_bounds__(oss_sm90_regs<NWG>::THREADS, 1)
    oss_attn_fwd_sm90_kernel(const __grid_constant__ oss_attn_args args, const __grid_constant__ oss_attn_sm90_maps maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  /* NWG consumer warpgroups of 64 query rows each (NWARPS warps), then the producer's */
  constexpr int BR = 64 * NWG, NT = BC / 8, NO = DV / 8, NWARPS = 4 * NWG, THREADS = oss_sm90_regs<NWG>::THREADS;
  static_assert(NWG == 2 || (NWG == 3 && MASK == 0 && !VAR), "three consumer warpgroups: the plain kernels only");
  /* MASK: 0 no mask tensor, 1 one read element by element from global
   * memory, 2 one whose tiles the copy engine brings (maps.m, maps.mask) */
  constexpr bool MASK_TENSOR = MASK != 0, MASK_TILES = MASK == 2;
  /* the element-wise kernel's registers are full: it divides instead of
   * holding multipliers, keeps the warpgroup index per thread and stores out
   * with a branch per pair above 128 columns */
  constexpr bool TIGHT = MASK == 1;
  constexpr bool ONES = oss_attn_fwd_sm90_ones<DV, VAR>();
  /* a window moves a block's first key tile (jt0) off 0: the kernels for
   * windows (VAR, or WINDOW: a window alone) keep it in a register, the
   * others know it is 0 */
  constexpr bool WIN = VAR || WINDOW;
  constexpr int VC = oss_attn_fwd_sm90_v_cols<DV, VAR>(), NOA = NO + (ONES ? 1 : 0); /* O's n-tiles, ones included */
  /* KD: the columns of Q's and K's tiles in shared memory (whole boxes); the
   * products read HD of them, P V writes DV columns of O */
  constexpr int KD = oss_sm90_cols(HD);
  static_assert(HD % 16 == 0 && DV % 16 == 0 && DV <= HD && BC % 16 == 0 && BC <= 256,
                "head dims and key tile multiples of 16");

  extern __shared__ __align__(1024) unsigned char oss_sm90_smem[];
  T *sQ = reinterpret_cast<T *>(oss_sm90_smem + ((1024u - (oss_smem_u32(oss_sm90_smem) & 1023u)) & 1023u));
  T *sK = sQ + BR * KD;
  T *sV = sK + STAGES * BC * KD; /* stage st at sV + st * BC * VC */
  /* out's staging (warpgroup w's half at OUT_STAGE / 2 w), where the kernel
   * has one and uses it: the copy engine then stores out */
  constexpr size_t OUT_STAGE = oss_attn_fwd_sm90_out_stage_bytes<HD, DV, BR, BC, STAGES, VAR>();
  constexpr bool TMA_OUT = OUT_STAGE > 0 && !MASK_TENSOR;
  T *sO = sV + STAGES * BC * VC;
  /* the kernel that reads a mask tensor stores out from registers; where the
   * copy engine brings its mask tiles, their stages take out's place: stage
   * st's half for warpgroup w (its 64 rows) at sM + (2 st + w) stage_bytes */
  unsigned char *sM = reinterpret_cast<unsigned char *>(sO);

  /* q_full: Q landed; q_empty: every consumer warp issued its last Q K^T of
   * the block; k_full / v_full[stage]: that stage's tile landed (one producer
   * arrival plus the copy's bytes); k_empty / v_empty[stage]: every consumer
   * warp is done reading it. Phases count on across work blocks. */
  __shared__ __align__(8) uint64_t q_full, q_empty, k_full[STAGES], v_full[STAGES], k_empty[STAGES], v_empty[STAGES];
  /* m_full / m_empty[stage][w]: a mask stage's half of warpgroup w landed /
   * read by its four warps (MASK = 2). A half per warpgroup, so that a
   * single stage (where two do not fit) is refilled as soon as its
   * warpgroup masked the tile, a whole tile's time before it needs the next */
  __shared__ __align__(8) uint64_t m_full[MASK_TILES ? 2 : 1][2], m_empty[MASK_TILES ? 2 : 1][2];

  /* wg known uniform (oss_warpgroup) except in the kernels that read a mask
   * tensor, where the uniform registers it takes make the kernel spill */
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = TIGHT ? warp >> 2 : oss_warpgroup();
  /* the work blocks of this CTA: oss_sm90_first_block */
  const oss_sm90_sched sched = oss_sm90_sched_of<BR>(args);
  /* the current block's arguments: in a variable-length batch its sequence's
   * view (oss_attn_seq_view); the copies then address the packed rows from the
   * sequence's first (seq_q0, seq_k0) in one batch. A mask tensor never comes
   * with a variable-length batch: that kernel skips the view (registers). */
  oss_attn_args a = args;

  if (ONES) { /* every V stage's ones box (swizzling moves ones among ones) */
    const uint32_t one2 = oss_mma_op<T>::pack(1.f, 1.f);
    for (int c = tid; c < STAGES * BC * 64 / 8; c += THREADS) {
      const int st = c / (BC * 8), e = c % (BC * 8);
      reinterpret_cast<uint4 *>(sV + st * BC * VC + DV * BC)[e] = make_uint4(one2, one2, one2, one2);
    }
    oss_fence_proxy_async(); /* the tensor cores read them */
  }
  if (tid == 0) {
    oss_mbar_init(&q_full, 1);
    oss_mbar_init(&q_empty, NWARPS);
    for (int i = 0; i < STAGES; i++) {
      oss_mbar_init(&k_full[i], 1);
      oss_mbar_init(&v_full[i], 1);
      oss_mbar_init(&k_empty[i], NWARPS);
      oss_mbar_init(&v_empty[i], NWARPS);
    }
    if (MASK_TILES)
      for (int i = 0; i < 4; i++) {
        oss_mbar_init(&m_full[i >> 1][i & 1], 1);
        oss_mbar_init(&m_empty[i >> 1][i & 1], 4); /* the four warps of the half's warpgroup */
      }
    oss_fence_mbar_init();
  }
  __syncthreads(); /* the only CTA-wide barrier */

  if (wg == NWG) {
    /* producer warpgroup: one thread issues every copy */
    oss_setmaxnreg_dec<OSS_SM90_PRODUCER_REGS>();
    if (tid == 128 * NWG) {
      oss_tma_prefetch_map(&maps.q);
      oss_tma_prefetch_map(&maps.k);
      oss_tma_prefetch_map(&maps.v);
      if (MASK_TILES) oss_tma_prefetch_map(&maps.m);
      int blocks = 0, tiles = 0; /* Q and K/V uses so far */
#pragma unroll 1
      for (int w = oss_sm90_first_block<TIGHT>(sched); w >= 0; w = oss_sm90_next_block<TIGHT>(w, sched)) {
        int64_t bh = oss_fastdiv_div<TIGHT>(w, sched.by_nqb);
        int block = w - (int)bh * sched.nqb;
        if (!MASK_TENSOR && !oss_sm90_block_view<T, BR>(a, args, &bh, &block)) continue;
        oss_attn_query_block qb;
        oss_sm90_query_block<BR, BC, TIGHT>(a, sched, bh, block, &qb);
        const int jt0 = WIN ? qb.jt0 : 0;
        if (qb.ntiles <= jt0) continue;
        const int tb = a.cu_q != nullptr ? 0 : qb.b; /* the copies' batch */
        if (blocks > 0) oss_mbar_wait_backoff(&q_empty, (blocks - 1) & 1);
        oss_sm90_load_tile<KD, BR>(sQ, &maps.q, &q_full, (int)a.seq_q0 + qb.i0, qb.h, tb);
        blocks++;
#pragma unroll 1
        for (int j = jt0; j < qb.ntiles; j++, tiles++) {
          const int st = tiles % STAGES, use = tiles / STAGES, j0 = (int)a.seq_k0 + j * BC;
          if (use > 0) oss_mbar_wait_backoff(&k_empty[st], (use - 1) & 1);
          oss_sm90_load_tile<KD, BC>(sK + st * BC * KD, &maps.k, &k_full[st], j0, qb.hk, tb);
          /* the mask's halves (a mask never comes with packed rows): the first
           * warpgroup's between K and V, which wait on the warpgroups' previous
           * tiles in their order */
          const int ms = MASK_TILES ? tiles & (maps.mask.stages - 1) : 0, muse = tiles >> (maps.mask.stages - 1);
          if (MASK_TILES) {
            if (muse > 0) oss_mbar_wait_backoff(&m_empty[ms][0], (muse - 1) & 1);
            oss_sm90_load_mask(oss_smem_u32(sM) + 2 * ms * maps.mask.stage_bytes, &maps.m, maps.mask, &m_full[ms][0],
                               BC, j0, qb.i0, qb.h, qb.b);
          }
          if (use > 0) oss_mbar_wait_backoff(&v_empty[st], (use - 1) & 1);
          oss_sm90_load_tile<oss_sm90_cols(DV), BC>(sV + st * BC * VC, &maps.v, &v_full[st], j0, qb.hk, tb);
          if (MASK_TILES) {
            if (muse > 0) oss_mbar_wait_backoff(&m_empty[ms][1], (muse - 1) & 1);
            oss_sm90_load_mask(oss_smem_u32(sM) + (2 * ms + 1) * maps.mask.stage_bytes, &maps.m, maps.mask,
                               &m_full[ms][1], BC, j0, qb.i0 + 64, qb.h, qb.b);
          }
        }
      }
    }
  } else {
    /* consumer warpgroups */
    oss_setmaxnreg_inc<oss_sm90_regs<NWG>::CONSUMER>();
    const int wrow = wg * 64 + (warp & 3) * 16; /* this warp's first row in the tile */
    const uint32_t sQa = oss_smem_u32(sQ) + wg * 64 * 128; /* this warpgroup's 64 rows */
    /* ping-pong: a warpgroup issues its products after syncing on its own
     * barrier, then arrives on the next one's (warpgroups in a ring). All take
     * the same turns; the last warpgroup arrives once more at the start, so
     * the first goes first, and the first syncs once more at the end to take
     * that arrival */
    const int my_bar = 1 + wg, next_bar = wg + 1 == NWG ? 1 : 2 + wg;
    if (PINGPONG && wg == NWG - 1) oss_named_arrive(next_bar, 256);
    /* named barriers 1 .. NWG are the turns'; EPI_BAR + w a warpgroup's own */
    constexpr int EPI_BAR = 1 + NWG;
    const bool drop = VAR && a.drop_seed != nullptr; /* dropout (VAR kernels) */
    /* this warpgroup's halves of the mask stages */
    constexpr bool mask_tiles = MASK_TILES;
    const uint32_t sMa = MASK_TILES ? oss_smem_u32(sM) + wg * maps.mask.stage_bytes : 0u;
    const uint64_t seed = VAR ? oss_attn_drop_seed(a) : 0;
    oss_attn_keep<1, NT> keep; /* the kept weights of the tile being packed */
    /* a softcap in the WINDOW instantiation (oss_sm90_plain_scores) */
    const float cap = WINDOW ? a.softcap_l2 : 0.f;
    const float cap_k = cap > 0.f ? (float)(2.0 * OSS_LOG2E) * a.scale_log2 / cap : 0.f;
    int blocks = 0, tiles = 0;
#pragma unroll 1
    for (int w = oss_sm90_first_block<TIGHT>(sched); w >= 0; w = oss_sm90_next_block<TIGHT>(w, sched)) {
      int64_t bh = oss_fastdiv_div<TIGHT>(w, sched.by_nqb);
      int block = w - (int)bh * sched.nqb;
      if (!MASK_TENSOR && !oss_sm90_block_view<T, BR>(a, args, &bh, &block)) continue;
      oss_attn_query_block qb;
      oss_sm90_query_block<BR, BC, TIGHT>(a, sched, bh, block, &qb);
      /* the block's key tiles jt0 .. jt0 + ntiles - 1 (a window's; else all up to the diagonal) */
      const int i0 = qb.i0, jt0 = WIN ? qb.jt0 : 0, ntiles = qb.ntiles > jt0 ? qb.ntiles - jt0 : 0;
      const int64_t mbase = MASK_TENSOR ? oss_attn_mask_base(a, qb.b, qb.h) : 0;
      oss_attn_var_consts vc;
      if constexpr (VAR) vc = oss_attn_var_consts_of(a, qb.b, qb.h);
      /* ALiBi in the WINDOW instantiation (log2 units; 0: none) */
      const float slope =
          WINDOW && a.alibi != nullptr ? a.alibi[(int64_t)qb.b * a.alibi_sb + qb.h] * (float)OSS_LOG2E : 0.f;
      /* i + off - j at the thread's first element of key tile 0 (the distances of oss_sm90_alibi) */
      const int64_t d_row = (int64_t)(i0 + wrow + (lane >> 2)) + a.var_off - (lane & 3) * 2;
      /* [1]: the one 16-row m-tile of a warp, as the shared mma.sync helpers
       * count them. In the VAR kernels a sink starts each row's softmax as its
       * first term (as in the mma.sync kernel: m = the sink, one quad lane's l
       * and lr hold 1); the plain kernels merge it at the end. */
      const float sink_m = (!VAR || a.sinks == nullptr) ? -INFINITY : a.sinks[qb.h] * (float)OSS_LOG2E;
      const float sink_l = (VAR && a.sinks != nullptr && (lane & 3) == 0) ? 1.f : 0.f;
      float o[1][NOA][4], s[1][NT][4];
      float m[1][2] = {{sink_m, sink_m}}, l[1][2] = {{sink_l, sink_l}}, lr[1][2] = {{sink_l, sink_l}}, alpha[2];
      uint32_t pa[NT / 2][4];
#pragma unroll
      for (int n = 0; n < NOA; n++) o[0][n][0] = o[0][n][1] = o[0][n][2] = o[0][n][3] = 0.f;

      if (ntiles > 0) {
        oss_mbar_wait(&q_full, blocks & 1);
        /* tile 0: S_0 alone */
        int st = tiles % STAGES;
        oss_mbar_wait(&k_full[st], (tiles / STAGES) & 1);
        if (PINGPONG) oss_named_sync(my_bar, 256);
        oss_wgmma_fence_operand<NT>(s[0]);
        oss_wgmma_fence();
        oss_attn_sm90_qk<T, HD, BR, BC>(s[0], sQa, oss_smem_u32(sK + st * BC * KD));
        oss_wgmma_commit();
        if (PINGPONG) oss_named_arrive(next_bar, 256);
        oss_wgmma_wait<0>();
        oss_wgmma_fence_operand<NT>(s[0]);
        __syncwarp();
        if (lane == 0) {
          oss_mbar_arrive(&k_empty[st]);
          if (ntiles == 1) oss_mbar_arrive(&q_empty);
        }
        float c = VAR ? oss_attn_fwd_var_scores<1, NT, false>(s, a, vc, mbase, i0 + wrow, jt0 * BC, lane)
                  : mask_tiles ? oss_sm90_mask_scores_stage<T, NT>(s[0], a, sMa, maps.mask, m_full, m_empty, wg,
                                                                   tiles, i0 + wrow, wrow - wg * 64, jt0 * BC, lane)
                  : MASK_TENSOR ? oss_attn_fwd_mask_scores<T, 1, NT, MASK_TENSOR, WINDOW>(s, a, mbase, i0 + wrow,
                                                                                          jt0 * BC, lane)
                               : oss_sm90_plain_scores<T, NT, WINDOW>(s, a, i0 + wrow, jt0 * BC, lane, cap, cap_k);
        if constexpr (WINDOW)
          if (slope != 0.f) {
            oss_sm90_alibi<NT>(s[0], c, slope, (float)(d_row - jt0 * BC));
            c = 1.f;
          }
        oss_sm90_softmax_exp<NT>(s[0], m[0], l[0], alpha, c);
        oss_sm90_softmax_pack<T, NT, NOA, !ONES>(s[0], o[0], lr[0], alpha, pa);
        if (drop) {
          oss_attn_dropout_keep<false, 1, NT>(keep, a, seed, qb.bh, i0 + wrow, jt0 * BC, lane);
          oss_attn_dropout_apply_a<1, NT>(reinterpret_cast<uint32_t(&)[1][NT / 2][4]>(pa), keep);
        }

#pragma unroll 1
        for (int j = 1; j < ntiles; j++) {
          const int pst = st, pphase = ((tiles + j - 1) / STAGES) & 1, j0 = (jt0 + j) * BC;
          st = (tiles + j) % STAGES;
          oss_mbar_wait(&k_full[st], ((tiles + j) / STAGES) & 1);
          if (PINGPONG) oss_named_sync(my_bar, 256);
          oss_wgmma_fence_operand<NT>(s[0]);
          oss_wgmma_fence();
          oss_attn_sm90_qk<T, HD, BR, BC>(s[0], sQa, oss_smem_u32(sK + st * BC * KD));
          oss_wgmma_commit();
          oss_mbar_wait(&v_full[pst], pphase);
          oss_wgmma_fence_operand<NOA>(o[0]);
          oss_wgmma_fence();
          oss_attn_sm90_pv<T, NOA * 8, BC>(o[0], pa, oss_smem_u32(sV + pst * BC * VC));
          oss_wgmma_commit();
          if (PINGPONG) oss_named_arrive(next_bar, 256);
          oss_wgmma_wait<1>(); /* S_j done, P_{j-1} V_{j-1} may still run */
          oss_wgmma_fence_operand<NT>(s[0]);
          __syncwarp();
          if (lane == 0) {
            oss_mbar_arrive(&k_empty[st]);
            if (j == ntiles - 1) oss_mbar_arrive(&q_empty);
          }
          c = VAR ? oss_attn_fwd_var_scores<1, NT, false>(s, a, vc, mbase, i0 + wrow, j0, lane)
              : mask_tiles ? oss_sm90_mask_scores_stage<T, NT>(s[0], a, sMa, maps.mask, m_full, m_empty, wg,
                                                               tiles + j, i0 + wrow, wrow - wg * 64, j0, lane)
              : MASK_TENSOR ? oss_attn_fwd_mask_scores<T, 1, NT, MASK_TENSOR, WINDOW>(s, a, mbase, i0 + wrow, j0, lane)
                           : oss_sm90_plain_scores<T, NT, WINDOW>(s, a, i0 + wrow, j0, lane, cap, cap_k);
          if constexpr (WINDOW)
            if (slope != 0.f) {
              oss_sm90_alibi<NT>(s[0], c, slope, (float)(d_row - j0));
              c = 1.f;
            }
          oss_sm90_softmax_exp<NT>(s[0], m[0], l[0], alpha, c);
          if (drop) oss_attn_dropout_keep<false, 1, NT>(keep, a, seed, qb.bh, i0 + wrow, j0, lane);
          oss_wgmma_wait<0>();
          oss_wgmma_fence_operand<NOA>(o[0]);
          oss_wgmma_fence_operand<NT / 2>(pa);
          __syncwarp();
          if (lane == 0) oss_mbar_arrive(&v_empty[pst]);
          oss_sm90_softmax_pack<T, NT, NOA, !ONES>(s[0], o[0], lr[0], alpha, pa);
          if (drop) oss_attn_dropout_apply_a<1, NT>(reinterpret_cast<uint32_t(&)[1][NT / 2][4]>(pa), keep);
        }

        /* the last tile's P V */
        oss_mbar_wait(&v_full[st], ((tiles + ntiles - 1) / STAGES) & 1);
        if (!MASK_TENSOR && a.cu_q != nullptr && (jt0 + ntiles) * BC > a.lk)
          oss_sm90_zero_rows<T, oss_sm90_cols(DV), BC>(sV + st * BC * VC, a.lk - (jt0 + ntiles - 1) * BC, tid & 127,
                                                       EPI_BAR + wg);
        if (PINGPONG) oss_named_sync(my_bar, 256);
        oss_wgmma_fence_operand<NOA>(o[0]);
        oss_wgmma_fence();
        oss_attn_sm90_pv<T, NOA * 8, BC>(o[0], pa, oss_smem_u32(sV + st * BC * VC));
        oss_wgmma_commit();
        if (PINGPONG) oss_named_arrive(next_bar, 256);
        oss_wgmma_wait<0>();
        oss_wgmma_fence_operand<NOA>(o[0]);
        oss_wgmma_fence_operand<NT / 2>(pa);
        __syncwarp();
        if (lane == 0) oss_mbar_arrive(&v_empty[st]);
        blocks++;
        tiles += ntiles;
      }
      /* the epilogue runs while the producer already loads the next block. With
       * the ones column every lane of a quad holds its rows' lr; the epilogue
       * sums a quad's partial lr, so one lane gives it */
      if (ONES)
        for (int hi = 0; hi < 2; hi++) lr[0][hi] = (lane & 3) == 0 ? o[0][NO][2 * hi] : 0.f;
      /* the plain kernels take a call's sinks here, as the last term of each row */
      if constexpr (!VAR && !MASK_TENSOR)
        if (a.sinks != nullptr)
          oss_sm90_sink_merge<NOA>(o[0], m[0], l[0], lr[0], a.sinks[qb.h] * (float)OSS_LOG2E, lane);
      /* the mask kernel at head dim 256 has no register to spare for the run of stores */
      constexpr bool RUN = !(TIGHT && DV > 128);
      /* 16-byte stores: the plain kernels of 128 to 192 columns (the variant kernels and
       * 256 spill with them; at 64 the exchange costs more than the stores save) */
      constexpr bool WIDE = !VAR && !MASK_TENSOR && !WINDOW && DV >= 128 && DV <= 192 && NO % 4 == 0;
      const float(&o_out)[1][NO][4] = reinterpret_cast<const float(&)[1][NO][4]>(o);
      if (TMA_OUT && maps.out_tma) {
        /* lse and the residual from registers; out staged in shared memory
         * (oss_sm90_stage_acc), which one thread of the warpgroup hands to
         * the copy engine once every warp's writes are visible to it (proxy
         * fence, named barrier), and which the next block rewrites only once
         * that copy has read it (the same thread's wait, then the barrier).
         * The copy clips rows past Lq and columns past Dv. */
        const bool leader = (tid & 127) == 0;
        const uint32_t stage = oss_smem_u32(sO) + (uint32_t)(wg * (OUT_STAGE / NWG));
        float inv[1][2];
        /* the residual (training calls) in 8-byte stores after the quad's
         * exchange at every head dim here: with out left to the copy engine
         * the registers hold it, and 2-byte stores (8 bytes of a row per
         * warp store) held the epilogue of short sequences */
        constexpr bool RES_WIDE = !WINDOW && NO % 4 == 0;
        oss_attn_fwd_write<T, 1, NO, RUN, RES_WIDE, false>(a, o_out, m, l, lr, qb.b, qb.h, qb.bh, i0 + wrow, lane,
                                                           1.f, inv);
        if (leader) oss_bulk_wait_read<0>();
        oss_named_sync(EPI_BAR + wg, 128);
        oss_sm90_stage_acc<T, NO>(stage, o_out[0], inv[0], warp & 3, lane);
        oss_fence_proxy_async();
        oss_named_sync(EPI_BAR + wg, 128);
        if (leader) {
#pragma unroll
          for (int cb = 0; cb < oss_sm90_cols(DV) / 64; cb++)
            oss_tma_store_4d(&maps.o, stage + cb * 64 * 64 * (uint32_t)sizeof(T), cb * 64, i0 + wg * 64, qb.h, qb.b);
          oss_bulk_commit();
        }
      } else {
        oss_attn_fwd_write<T, 1, NO, RUN, WIDE>(a, o_out, m, l, lr, qb.b, qb.h, qb.bh, i0 + wrow, lane,
                                                drop ? a.drop_scale : 1.f);
      }
    }
    if (PINGPONG && wg == 0) oss_named_sync(my_bar, 256);
    /* the shared memory of the last store must outlive the CTA's reads of it */
    if (TMA_OUT && (tid & 127) == 0) oss_bulk_wait_read<0>();
  }
#else
  __trap(); /* not built for sm_90a: never in the dispatch table */
#endif
}

/* ---- host: launch ----------------------------------------------------------- */

/* Launches `kernel` (one of oss_attn_fwd_sm90_kernel<T, HD, ...>, launched
 * with `regs` registers per thread) over the call's work blocks (on a
 * persistent grid where `persistent`), or, where
 * the copy engine cannot address the inputs or the kernel's register budget
 * does not hold, `fallback` (the mma.sync kernel of the same result). */
template <typename T, int HD, int DV, int BC, bool VAR, int NWG = 2>
oss_status oss_attn_fwd_sm90_run(void (*kernel)(const oss_attn_args, const oss_attn_sm90_maps), int regs,
                                 oss_attn_launch_fn fallback, bool persistent, const oss_attn_args *a,
                                 cudaStream_t stream, const oss_device_info *dev,
                                 void (*tiles_kernel)(const oss_attn_args, const oss_attn_sm90_maps) = nullptr,
                                 int tiles_regs = 0) {
  typedef oss_attn_fwd_sm90_cfg<HD> C;
  constexpr int BR = 64 * NWG; /* the kernel's query rows per block */
  /* The budgets of setmaxnreg hold only if the kernel launches with the
   * registers assumed above; a compiler that allots fewer would make the
   * consumers wait forever, so then the mma.sync kernel runs instead. */
  const int64_t nwork = oss_sm90_row_blocks(*a, BR) * oss_sm90_work_rows(*a);
  oss_attn_sm90_maps maps;
  /* a variable-length batch: one batch of the packed rows */
  const bool packed = a->cu_q != NULL;
  const int64_t mb = packed ? 1 : a->batch, mq = packed ? a->total_q : a->lq, mk = packed ? a->total_k : a->lk;
  if (regs < oss_sm90_regs<NWG>::LAUNCH || a->lk == 0 || nwork > INT_MAX || mq > INT_MAX || mk > INT_MAX ||
      !oss_attn_sm90_map<T>(&maps.q, a->q, mb, a->hq, mq, a->d, a->q_s, BR) ||
      !oss_attn_sm90_map<T>(&maps.k, a->k, mb, a->hkv, mk, a->d, a->k_s, BC) ||
      !oss_attn_sm90_map<T>(&maps.v, a->v, mb, a->hkv, mk, a->dv, a->v_s, BC))
    return fallback(a, stream, dev);
  /* out by the copy engine where the kernel stages it: a dense batch (a
   * packed one's blocks end inside the next sequence's rows) whose out the
   * copy engine can address; else the kernel stores it from registers */
  maps.out_tma = oss_attn_fwd_sm90_out_stage_bytes<HD, DV, BR, BC, C::STAGES, VAR>() > 0 &&
                 a->mask_kind == OSS_MASK_NONE && !packed &&
                 oss_attn_sm90_map<T>(&maps.o, a->out, a->batch, a->hq, a->lq, a->dv, a->o_s, 64);
  size_t smem = oss_attn_fwd_sm90_smem_bytes<HD, DV, BR, BC, C::STAGES, VAR>();
  /* tiles_kernel (a mask tensor's tiles by the copy engine) where the copy
   * engine can address the mask and its stages fit beside the tiles (bool
   * masks at every head dim; 16-bit and float32 ones where the head dim
   * leaves room); else `kernel`, which reads the mask element by element
   * from global memory. *Reason:* each element's load, its 64-bit address
   * and its wait held the kernel at a fraction of the plain one's speed. */
  if (tiles_kernel != nullptr && tiles_regs >= oss_sm90_regs<NWG>::LAUNCH && !packed &&
      oss_attn_sm90_mask_map(&maps.m, &maps.mask, a, BC, 64)) {
    /* two stages of the two warpgroups' halves where they fit, else one */
    const size_t tiles = oss_attn_fwd_sm90_tile_bytes<HD, DV, BR, BC, C::STAGES, VAR>(),
                 stage = 2 * (size_t)maps.mask.stage_bytes;
    maps.mask.stages = tiles + 2 * stage <= 225 * 1024 ? 2 : 1;
    const size_t with = tiles + maps.mask.stages * stage;
    if (with <= 225 * 1024) {
      kernel = tiles_kernel;
      if (with > smem) smem = with;
      /* its blocks are of equal work (no causal rule) or paired by it, as the
       * plain kernel's: the persistent grid, as for those */
      persistent = !packed;
    }
  }
  if (smem > (size_t)dev->max_smem_per_block_optin) return fallback(a, stream, dev);
  OSS_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  /* The grid: one CTA per work block, or, where the caller's `persistent`
   * says so, one CTA per SM, each looping over blocks (oss_sm90_first_block).
   * oss.h's forward_ctas_per_sm overrides the choice. */
  const int forced = oss_attention_cuda_get_options().forward_ctas_per_sm;
  const int64_t per_sm = forced != 0 ? forced : persistent ? 1 : 0;
  const int64_t grid = per_sm > 0 && per_sm * dev->sm_count < nwork ? per_sm * dev->sm_count : nwork;
  kernel<<<(unsigned)grid, oss_sm90_regs<NWG>::THREADS, smem, stream>>>(*a, maps);
  return oss_check_launch("attention forward (wgmma)");
}

/* Whether a plain call runs the kernel of nwg consumer warpgroups (64 nwg
 * query rows a block) rather than the one of two: where oss.h's
 * forward_block_rows names its rows, or, by default, without the causal
 * rule, and with it from 8k queries up. *Reason (H200, bf16, head dim 64):*
 * without the causal rule blocks of 192 ran 1.03-1.12x blocks of 128 from
 * 512 to 16k queries; with it 0.74x at 512 and 0.92x at 2k (a block's
 * diagonal tiles are computed by all three warpgroups), 1.03-1.05x at 8k-16k.
 * At head dim 96 (hd96) without the causal rule only from 2k queries up. *Reason
 * (H200, bf16, head dim 96):* blocks of 192 ran 0.91x blocks of 128 at 512
 * queries without the causal rule, 1.05x at 2k and 1.07x at 8k; causal 0.66x
 * at 512, 0.91x at 2k, 1.08x at 8k. */
static inline bool oss_attn_fwd_sm90_wide(const oss_attn_args *a, int nwg, bool hd96) {
  const int forced = oss_attention_cuda_get_options().forward_block_rows;
  if (forced != 0) return forced == 64 * nwg;
  return a->causal ? a->lq >= 8192 : !hd96 || a->lq >= 2048;
}

/* Entry points instantiated once per (head dim, dtype) by the generator.
 * mma: the mma.sync forward of the same head dim and dtype (its own
 * generated file's launcher, so this file does not compile that kernel
 * again), which runs what the wgmma kernel cannot take. */
template <typename T, int HD>
oss_status oss_attn_fwd_sm90_launch(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev,
                                    oss_attn_launch_fn mma, oss_attn_launch_fn mma_var) {
  typedef oss_attn_fwd_sm90_cfg<HD> C;
  /* a kernel without the registers for reading a mask tensor where there is
   * none; the one that reads it has no registers left for ping-pong */
  static const int plain_regs = oss_kernel_regs(oss_attn_fwd_sm90_kernel<T, HD, HD, C::BC, C::STAGES, C::PINGPONG, false>);
  static const int mask_regs = oss_kernel_regs(oss_attn_fwd_sm90_kernel<T, HD, HD, C::BC_MASK, C::STAGES, false, 1>);
  static const int tiles_regs = oss_kernel_regs(oss_attn_fwd_sm90_kernel<T, HD, HD, C::BC_MASK, C::STAGES, C::PINGPONG, 2>);
  if (a->mask_kind != OSS_MASK_NONE)
    return oss_attn_fwd_sm90_run<T, HD, HD, C::BC_MASK, false>(
        oss_attn_fwd_sm90_kernel<T, HD, HD, C::BC_MASK, C::STAGES, false, 1>, mask_regs, mma, false, a, stream, dev,
        oss_attn_fwd_sm90_kernel<T, HD, HD, C::BC_MASK, C::STAGES, C::PINGPONG, 2>, tiles_regs);
  const bool persistent = C::persistent(a);
  /* a call with a window, sinks, a softcap or ALiBi (oss_attn_fwd_sm90_var_launch
   * sends them here) falls back to the mma.sync kernel with the variants */
  const oss_attn_launch_fn fallback = a->variants ? mma_var : mma;
  if (a->win_left >= 0 || a->win_right >= 0 || a->alibi != NULL || a->softcap_l2 > 0.f) {
    /* a window, ALiBi or a softcap: the instantiation that moves a block's
     * first key tile, caps the scores and adds ALiBi's biases */
    if constexpr (C::WINDOW_KERNEL) {
      static const int window_regs =
          oss_kernel_regs(oss_attn_fwd_sm90_kernel<T, HD, HD, C::BC, C::STAGES, C::PINGPONG, false, false, true>);
      return oss_attn_fwd_sm90_run<T, HD, HD, C::BC, false>(
          oss_attn_fwd_sm90_kernel<T, HD, HD, C::BC, C::STAGES, C::PINGPONG, false, false, true>, window_regs, mma_var,
          persistent, a, stream, dev);
    } else {
      return mma_var(a, stream, dev);
    }
  }
  if constexpr (C::DV_NARROW > 0) {
    if (a->dv <= C::DV_NARROW) {
      static const int narrow_regs = oss_kernel_regs(
          oss_attn_fwd_sm90_kernel<T, HD, C::DV_NARROW, C::BC_NARROW, C::STAGES, C::PINGPONG, false>);
      return oss_attn_fwd_sm90_run<T, HD, C::DV_NARROW, C::BC_NARROW, false>(
          oss_attn_fwd_sm90_kernel<T, HD, C::DV_NARROW, C::BC_NARROW, C::STAGES, C::PINGPONG, false>, narrow_regs,
          fallback, persistent, a, stream, dev);
    }
  }
  if constexpr (C::NWG_WIDE > 0) {
    if (oss_attn_fwd_sm90_wide(a, C::NWG_WIDE, HD == 96)) {
      static const int wide_regs = oss_kernel_regs(
          oss_attn_fwd_sm90_kernel<T, HD, HD, C::BC_WIDE, C::STAGES, C::PINGPONG, false, false, false, C::NWG_WIDE>);
      return oss_attn_fwd_sm90_run<T, HD, HD, C::BC_WIDE, false, C::NWG_WIDE>(
          oss_attn_fwd_sm90_kernel<T, HD, HD, C::BC_WIDE, C::STAGES, C::PINGPONG, false, false, false, C::NWG_WIDE>,
          wide_regs, fallback, persistent, a, stream, dev);
    }
  }
  return oss_attn_fwd_sm90_run<T, HD, HD, C::BC, false>(oss_attn_fwd_sm90_kernel<T, HD, HD, C::BC, C::STAGES, C::PINGPONG, false>,
                                             plain_regs, fallback, persistent, a, stream, dev);
}

/* The score variants on Hopper (oss_attn_fwd_var_scores per tile, a window's
 * key tiles only, sinks in the row statistics). A window, sinks, a softcap
 * and ALiBi without dropout (oss_attn_fwd_plain_scores) run `plain`, the
 * launcher above (its own generated file's; NULL where the build has no plain
 * Hopper kernel of this head dim), whose kernels apply a window where they
 * apply the causal rule, merge the sinks after the keys
 * (oss_sm90_sink_merge), cap the scores (oss_sm90_plain_scores), add ALiBi's
 * biases to a masked tile (oss_sm90_alibi), and keep the ones column and,
 * without a softcap or ALiBi, the scale folded into the exponent; calls that also pass a mask tensor run mma_var, the
 * mma.sync kernel with the variants (its own generated file's launcher),
 * which reads it. */
template <typename T, int HD>
oss_status oss_attn_fwd_sm90_var_launch(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev,
                                        oss_attn_launch_fn mma_var, oss_attn_launch_fn plain) {
  typedef oss_attn_fwd_sm90_cfg<HD> C;
  if (a->mask_kind != OSS_MASK_NONE) return mma_var(a, stream, dev);
  if (oss_attn_fwd_plain_scores(a) && plain != NULL) return plain(a, stream, dev);
  static const int regs = oss_kernel_regs(oss_attn_fwd_sm90_kernel<T, HD, HD, C::BC, C::STAGES, C::PINGPONG, false, true>);
  const bool persistent = C::persistent(a);
  return oss_attn_fwd_sm90_run<T, HD, HD, C::BC, true>(oss_attn_fwd_sm90_kernel<T, HD, HD, C::BC, C::STAGES, C::PINGPONG, false, true>,
                                            regs, mma_var, persistent, a, stream, dev);
}

#endif /* OSS_ATTENTION_FWD_SM90_CUH */
