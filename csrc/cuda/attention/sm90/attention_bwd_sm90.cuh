/*
 * attention_bwd_sm90.cuh - the attention backward on Hopper's warpgroup tensor
 * cores (wgmma, sm_90a; float16 and bfloat16): the same gradients as
 * attention_bwd.cuh's dK/dV kernel, with m64nNk16 wgmma in place of warp-level
 * mma.sync. Two kernels: the key-split one (head dims 64, 96 and 128),
 * described here, and the column-split one for head dim 256
 * (oss_attn_bwd_sm90_wide_kernel, described at it).
 *
 * With P = exp(scale Q K^T + mask - lse) recomputed from the forward's lse,
 * dP = dO V^T, D = rowsum(dO * O) (oss_attn_bwd_pre_kernel, run before) and
 * dS' = scale P (dP - D):  dV = P^T dO,  dK = dS'^T Q,  dQ = dS' K.
 *
 * One CTA owns BC = 128 keys of one (batch, kv head) and loops over every
 * query head of its GQA group and every block of BR query rows that sees the
 * keys (causal: from the diagonal on), warp-specialised (384 threads):
 *   - the producer warpgroup gives its registers away (setmaxnreg). Its warp
 *     8 streams the query blocks through STAGES stages: Q and dO by bulk
 *     tensor copies (TMA; 64-column boxes landing 128-byte swizzled, rows
 *     past the queries zero), lse and D by bulk copies, all completing on the
 *     stage's "full" mbarrier; a stage is refilled once every consumer thread
 *     arrived on its "empty" mbarrier. Its warp 9 adds each staged dQ block
 *     to the float32 dQ accumulator of the workspace with one bulk reduction
 *     (cp.reduce.async.bulk): the accumulator's rows have the staging rows'
 *     pitch, so a block is one contiguous range.
 *   - two consumer warpgroups load K and V once (cp.async, zero past the
 *     keys) and keep them in shared memory. Warpgroup w owns keys
 *     [64w, 64w + 64) of the block, warp k of it keys 16k .. 16k + 15 (the
 *     wgmma accumulator rows), and accumulates their dK and dV in registers
 *     (stored at the end through its half of K's and V's shared memory, in
 *     16-byte rows: oss_sm90_store_rows). Per query block:
 *   S^T = K_w Q^T and dP^T = V_w dO^T (wgmma, both operands in shared memory,
 *   K-major); P^T and dS'^T in registers, key-major, so they are directly the
 *   A operands of dV += P^T dO and dK += dS'^T Q (B = dO, Q read MN-major).
 *   dQ: dS'^T goes to shared memory, and warpgroup w computes a 64 x 64
 *   piece of dQ_blk = dS' K (A = dS' read MN-major from dS'^T, B = K
 *   MN-major; BR = 64: head-dim columns [64w, 64w + 64), BR = 128: query
 *   rows [64w, 64w + 64)) once both warpgroups stored theirs, staged in
 *   shared memory for the dQ warp (per warpgroup named barriers: staged,
 *   and read again). Two dS'^T buffers (mbarriers ds_full and ds_empty per
 *   buffer): block it - 1's dQ product is issued in block it, after dV's
 *   and dK's, so neither warpgroup waits for the other's dS'^T of the block
 *   it has just computed, and their softmax phases drift apart (the tensor
 *   cores run one's products under the other's P and dS'). *Reason:* with
 *   one buffer both met at a barrier every block; forward+backward ran
 *   1-6 % faster at 8k queries, 0-5 % at 2k (head dims 64 and 128, H200),
 *   level at 512. Warpgroups taking turns at their S^T and dP^T products as well
 *   (the forward's ping-pong) gained nothing more. The kernel that brings
 *   mask tiles keeps one buffer (its tile would not fit beside a second).
 *   Deterministic mode (a.dq_sem, dense batches): the key blocks of a head
 *   run in reverse and add into each dQ block in that order, the dQ warp
 *   waiting on the block's counter for its turn (oss_attn_bwd_sm90_rank)
 *   and bumping it once its addition completed; the float32 sums then
 *   happen in one order whatever the timing.
 *   In a variable-length batch the query rows past a sequence's last (the
 *   next sequence's) are zeroed once landed.
 *   VAR (a separate instantiation): the score variants through
 *   oss_attn_var_each, P^T and dS'^T in one pass per element once dP^T has
 *   landed (dS' takes the softcap's derivative), only the query blocks whose
 *   window reaches the keys; calls with a mask tensor as well run the
 *   mma.sync kernels with the variants. A window, sinks or both run the
 *   plain instantiation, which masks the tiles across the window's edges as
 *   it masks the diagonal's and finds the sinks in lse (its fallbacks then
 *   those with the variants).
 *   Dropout (a variant too, as in attention_bwd.cuh): the tile's kept
 *   weights drawn while dP^T is computed, dP^T times Z k before that pass,
 *   the dropped weights zeroed in the packed P^T after it, and dV times k
 *   when written.
 *   dQ's centring (attention_bwd.cuh): m64n8k16 wgmmas of dS' by a tile of
 *   ones give the row sums R of the piece's 64 query rows (BR = 64: each
 *   warpgroup over its half of the keys), staged in a padding column of the
 *   dQ block, so they reach the accumulator with it; and before its first
 *   query block the CTA sums its K tile's columns into its chunk of the mean
 *   K row's partial sums (oss_attn_bwd_sm90_ksum), so that no pass reads K
 *   again for them.
 * Limits: D and Dv up to HD, zero padded; HD 64 with BR = 128, HD 96 or 128
 * with BR = 64 (the dQ split: each warpgroup's piece is 64 x 64; at head dim
 * 96 the tiles are stored as 128 columns, the copy engine and the K/V loads
 * zero-filling columns 96 .. 127, which the products over HD skip, and the
 * second warpgroup's dQ piece computes columns 64 .. 127 and stages those
 * below 96); a mask tensor only in the instantiations that read it (MASK:
 * 1 element by element, which spills; 2 the query block's tile through
 * shared memory, skipped for a warp whose keys it leaves unchanged, see
 * oss_attn_bwd_sm90_mask_neutral) and not with VAR; q and dout with 16-byte aligned base and strides (the
 * tensor maps' rule; else the mma.sync backward runs); built only for sm_90a
 * (elsewhere the body traps and the launcher is not in the dispatch table).
 */
#ifndef OSS_ATTENTION_BWD_SM90_CUH
#define OSS_ATTENTION_BWD_SM90_CUH

#include "cuda/attention/mma/attention_bwd.cuh"
#include "cuda/attention/sm90/attention_bwd_dq_sm90.cuh"
#include "cuda/attention/sm90/attention_sm90.cuh"

template <int HD> struct oss_attn_bwd_sm90_cfg {
  /* above 128 the column-split kernel (oss_attn_bwd_sm90_wide_kernel) */
  static constexpr bool WIDE = HD > 128;
  static constexpr int BC = WIDE ? 64 : 128; /* keys per CTA (key split: two consumer warpgroups of 64) */
  static constexpr int BR = HD <= 64 ? 128 : 64; /* query rows per iteration (see the dQ split) */
  static constexpr int STAGES = 2;     /* query blocks in flight */
};

/* The tensor maps of q and dout: 4-D (head dim, length, heads, batch) with the
 * tensors' strides, boxes of 64 columns by BR rows. */
typedef struct oss_attn_bwd_sm90_maps {
  CUtensorMap q, dout;
  /* the mask tensor's tiles (tensor map m), where the key-split kernel takes
   * them by the copy engine (its MASK = 2) */
  CUtensorMap m;
  oss_attn_sm90_mask_tiles mask;
} oss_attn_bwd_sm90_maps;

/* float pitch of the dQ staging rows: 32 bytes of padding, so that rows start
 * 8 banks apart and the 8-byte stores of a half warp (4 rows of 8 columns) hit
 * 32 distinct banks; padding columns pitch - 4 and pitch - 3 take dQ's
 * centring row sums */
template <int HD> __host__ __device__ constexpr int oss_attn_bwd_sm90_dq_pitch() { return HD + 8; }

/* dS'^T buffers of the key-split kernel: two, so that a block's dQ product
 * can wait for the next block's dS'^T (see the kernel); one in the kernel
 * that brings mask tiles, whose tile would not fit beside a second */
__host__ __device__ constexpr int oss_attn_bwd_sm90_ds_bufs(int mask) { return mask == 2 ? 1 : 2; }
template <int HD, int BR, int BC, int STAGES, int NB> __host__ __device__ constexpr size_t oss_attn_bwd_sm90_tiles_bytes() {
  return (size_t)(2 * BC + 2 * STAGES * BR) * oss_sm90_cols(HD) * 2 /* K, V, STAGES x (Q, dO): whole boxes */
         + (size_t)NB * BC * BR * 2                          /* NB x dS'^T */
         + (size_t)BR * oss_attn_bwd_sm90_dq_pitch<HD>() * 4 /* dQ block (float) */
         + (size_t)2 * STAGES * BR * 4;                      /* STAGES x (lse, D) */
}
template <int HD, int BR, int BC, int STAGES, int NB> __host__ __device__ constexpr size_t oss_attn_bwd_sm90_smem_bytes() {
  return oss_attn_bwd_sm90_tiles_bytes<HD, BR, BC, STAGES, NB>() + 1024 /* a tile of ones (dQ's centring) */
         + 1024;                                                        /* room to align the tiles to 1024 bytes */
}
/* The column-split kernel's: K, V, STAGES x (Q, dO), 2 x (P^T, dS'^T), STAGES x
 * (lse, D), room to align (no dQ: the query-major kernel computes it). */
template <int HD, int BR, int BC, int STAGES> __host__ __device__ constexpr size_t oss_attn_bwd_sm90_wide_smem_bytes() {
  return (size_t)(2 * BC + 2 * STAGES * BR) * HD * 2 + (size_t)4 * BC * BR * 2 + (size_t)2 * STAGES * BR * 4 + 1024;
}

/* dQ's centring: this CTA's chunk of kmean_part (oss_attn_bwd_means' pass 1
 * for its BC = OSS_ATTN_MEAN_CHUNK keys, from K's tile in shared memory; rows
 * past the keys are zero there): thread t sums column t % HD over the rows
 * t / HD, t / HD + G, ... (G = 256 / HD groups; four float32 partial sums in a
 * fixed order), the groups' sums meet in float64 in `scratch` (the dS'^T
 * buffer, free before the first query block) and are added in group order.
 * The consumers meet twice at `bar`, so the scratch is free again after. */
template <typename T, int HD, int BC, int BR>
__device__ __forceinline__ void oss_attn_bwd_sm90_ksum(const oss_attn_args &a, const T *sK, T *scratch, int b, int hk,
                                                       int block, int chunks, int tid, int bar) {
  static_assert(BC == OSS_ATTN_MEAN_CHUNK && HD <= 256 && BC % (4 * (256 / HD)) == 0, "a CTA's keys are one chunk");
  static_assert((size_t)(256 / HD) * HD * 8 <= (size_t)BC * BR * 2, "the groups' sums fit the dS'^T buffer");
  constexpr int G = 256 / HD; /* threads G HD .. 255 (head dim 96: 64 of them) sit out */
  const int col = tid % HD, grp = tid / HD;
  const T *base = sK + (col >> 6) * BC * 64 + (col & 7); /* column col of row r: + r * 64 + chunk swizzle */
  auto at = [&](int r) { return oss_to_float(base[r * 64 + ((((col & 63) >> 3) ^ (r & 7)) << 3)]); };
  double *part = reinterpret_cast<double *>(scratch);
  if (grp < G) {
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 2
    for (int r = grp; r < BC; r += 4 * G)
#pragma unroll
      for (int k = 0; k < 4; k++) s[k] += at(r + k * G);
    part[grp * HD + col] = ((double)s[0] + (double)s[1]) + ((double)s[2] + (double)s[3]);
  }
  oss_named_sync(bar, 256);
  for (int c = tid; c < a.mean_ld; c += 256) {
    double t = 0;
    if (c < HD)
#pragma unroll
      for (int g = 0; g < G; g++) t += part[g * HD + c];
    a.kmean_part[(((int64_t)b * a.hkv + hk) * chunks + block) * a.mean_ld + c] = t;
  }
  oss_named_sync(bar, 256);
}

/* Deterministic mode: the key blocks of a head add into a dQ block in
 * decreasing order, which is the order in which they reach it (a key block's
 * first query block does not decrease with the block, and each walks its
 * query blocks upwards); the grid starts them in that order too, so a CTA
 * only ever waits for CTAs started before it. The key blocks that see query
 * block qi are consecutive, so the rank of key block kb (how many add before
 * it) is hi - kb, hi the last key block whose first query block is <= qi. */
template <int BR, int BC>
__device__ __forceinline__ int oss_attn_bwd_sm90_rank(const oss_attn_args &a, int kb, int nkb, int qi) {
  int lo = kb, hi = nkb - 1; /* kb itself sees qi */
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    int q0, ne;
    oss_attn_bwd_query_blocks<BR>(a, mid * BC, &q0, &ne, BC);
    if (q0 <= qi)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo - kb;
}

/* Thread 0 initialises the stages' mbarriers (full: one producer arrival plus
 * the copies' bytes; empty: one arrival per consumer thread), then the CTA
 * meets once. */
template <int STAGES>
__device__ __forceinline__ void oss_attn_bwd_sm90_init_stages(uint64_t *full, uint64_t *empty, int consumers) {
  if (threadIdx.x == 0) {
    for (int i = 0; i < STAGES; i++) {
      oss_mbar_init(&full[i], 1);
      oss_mbar_init(&empty[i], consumers);
    }
    oss_fence_mbar_init();
  }
  __syncthreads();
}

/* A warpgroup's S^T (raw scores of keys kw0 + g, + 8 of warp k, kl0 the
 * first of them in the CTA's block; queries q0 + 8n + 2t, + 1) masked by the
 * query block's mask tile in shared memory at `tile` (maps.mask: boxes of
 * t.cols keys by t.rows query rows, or one row where every query has the same
 * mask; the copy engine's swizzle as in the forward's oss_sm90_mask_from_tile):
 * scaled to log2 units, the mask's value added, -inf where the causal rule or
 * the end of the keys hides the pair, as oss_attn_mask_frag does (key-major)
 * from global memory. A thread's elements of one key are queries apart, a
 * row of the tile each: one load per element, or, for a mask the same for
 * every query, one per key. */
template <typename M, typename T, int NTQ>
__device__ __forceinline__ void oss_attn_bwd_sm90_mask_from_tile(float (&sT)[NTQ][4], const oss_attn_args &a,
                                                                 uint32_t tile, const oss_attn_sm90_mask_tiles &t,
                                                                 int kw0, int kl0, int q0, int lane) {
  constexpr int ES = (int)sizeof(M), COLS = 128 / ES, SPAN = 128; /* key blocks of 128: boxes of 128-byte rows */
  const int g = lane >> 2, t2 = (lane & 3) * 2;
  const bool same_rows = t.rows == 1;
  auto value = [&](int kl, int ql) {
    const int off = kl / COLS * t.box_bytes + ql * SPAN + kl % COLS * ES;
    const uint32_t p = tile + (uint32_t)(off ^ ((off >> 3) & 0x70));
    float v;
    if constexpr (ES == 1) {
      uint32_t w;
      asm volatile("ld.shared.u8 %0, [%1];\n" : "=r"(w) : "r"(p) : "memory");
      v = w ? 0.f : -INFINITY;
    } else if constexpr (ES == 2) {
      uint16_t w;
      asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(w) : "r"(p) : "memory");
      v = oss_mma_op<T>::unpack((uint32_t)w).x * (float)OSS_LOG2E;
    } else {
      asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(p) : "memory");
      v *= (float)OSS_LOG2E;
    }
    return v;
  };
#pragma unroll
  for (int hi = 0; hi < 2; hi++) {
    const int R = kw0 + g + hi * 8, kl = kl0 + g + hi * 8;
    const int64_t lo = a.causal ? (int64_t)R - a.causal_off : 0;
    const int cmin = (int)(lo < 0 ? 0 : (lo > a.lq ? a.lq : lo)), cmax = R < a.lk ? a.lq - 1 : -1;
    const float key_v = same_rows ? value(kl, 0) : 0.f;
#pragma unroll
    for (int n = 0; n < NTQ; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int C = q0 + n * 8 + t2 + e;
        const float v = same_rows ? key_v : value(kl, n * 8 + t2 + e);
        sT[n][2 * hi + e] = C >= cmin && C <= cmax ? sT[n][2 * hi + e] + v : -INFINITY;
      }
  }
}

/* Whether a warp's part of the query block's mask tile (its 16 keys from
 * kl0 in the CTA's block, every query row, or the one row of a mask the
 * same for every query; as oss_attn_bwd_sm90_mask_from_tile reads it) is
 * neutral (oss_sm90_mask_chunk_neutral). A row's 16 keys are ES whole
 * 16-byte chunks (the swizzle keeps a chunk whole); each lane tests its
 * first chunk before the others, so that a tile which is not neutral mostly
 * costs one load and one vote. */
template <int ES, int BR>
__device__ __forceinline__ bool oss_attn_bwd_sm90_mask_neutral(uint32_t tile, const oss_attn_sm90_mask_tiles &t,
                                                               int kl0, int lane) {
  constexpr int COLS = 128 / ES, N = BR * ES / 32; /* key blocks of 128: boxes of 128-byte rows */
  static_assert(BR * ES % 32 == 0, "a warp's worth of chunks");
  /* the addresses formed here in each block (hoisted out of the loop, their
   * base took a register, and the kernel spilled at head dim 128) */
  asm volatile("" : "+r"(kl0));
  auto at = [&](int q) { /* chunk q % ES of the warp's keys in row q / ES */
    const int off = kl0 / COLS * t.box_bytes + q / ES * 128 + kl0 % COLS * ES + q % ES * 16;
    return tile + (uint32_t)(off ^ ((off >> 3) & 0x70));
  };
  if (t.rows == 1) return __all_sync(0xffffffffu, lane >= ES || oss_sm90_mask_chunk_neutral<ES>(at(lane)));
  if (!__all_sync(0xffffffffu, oss_sm90_mask_chunk_neutral<ES>(at(lane)))) return false;
  bool neutral = true;
#pragma unroll 1
  for (int k = 1; k < N; k++) neutral &= oss_sm90_mask_chunk_neutral<ES>(at(lane + 32 * k));
  return __all_sync(0xffffffffu, neutral);
}

/* P^T in place of the scores S^T of a warpgroup's 64 keys (warp k: keys kw0
 * .. kw0 + 15, kw0 its first) and NTQ * 8 queries from q0 (cL: their lse):
 * element (key r, query c) = exp2(c s - lse) with one fused multiply-add,
 * c = scale log2(e); where need_mask, masked scores (the causal rule, the
 * end of the keys and a window) set to -inf, which c leaves -inf while it is
 * positive.
 * With a mask tensor (added to scaled scores) or a scale that is not
 * positive, the scores are scaled first and c = 1. With a mask tile (MASK =
 * 2, where need_mask says whether the bounds hide pairs of the tile), a tile
 * without hidden pairs whose mask is neutral for the warp's keys skips the
 * mask (its scores are still scaled first, as a c other than 1 there made
 * the kernel spill; adding the neutral mask would change no bit). */
template <typename T, int NTQ, int MASK>
__device__ __forceinline__ void oss_attn_bwd_sm90_probs(float (&sT)[NTQ][4], const oss_attn_args &a, bool need_mask,
                                                        int b, int h, int kw0, int q0, const float *cL, int lane,
                                                        uint32_t mask_tile = 0,
                                                        const oss_attn_sm90_mask_tiles *mt = nullptr, int kl0 = 0) {
  constexpr int BR = NTQ * 8;
  const int t2 = (lane & 3) * 2;
  bool neutral = false; /* the mask changes none of the tile's scores */
  if constexpr (MASK == 2)
    if (!need_mask)
      neutral = a.mask_dtype == OSS_BOOL      ? oss_attn_bwd_sm90_mask_neutral<1, BR>(mask_tile, *mt, kl0, lane)
                : a.mask_dtype == OSS_FLOAT32 ? oss_attn_bwd_sm90_mask_neutral<4, BR>(mask_tile, *mt, kl0, lane)
                                              : oss_attn_bwd_sm90_mask_neutral<2, BR>(mask_tile, *mt, kl0, lane);
  const bool scaled = MASK != 0 || !(a.scale_log2 > 0.f);
  if (scaled)
#pragma unroll
    for (int n = 0; n < NTQ; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) sT[n][e] *= a.scale_log2;
  const float c = scaled ? 1.f : a.scale_log2;
  if constexpr (MASK == 2) {
    if (!neutral) {
      if (a.mask_dtype == OSS_BOOL)
        oss_attn_bwd_sm90_mask_from_tile<unsigned char, T, NTQ>(sT, a, mask_tile, *mt, kw0, kl0, q0, lane);
      else if (a.mask_dtype == OSS_FLOAT32)
        oss_attn_bwd_sm90_mask_from_tile<float, T, NTQ>(sT, a, mask_tile, *mt, kw0, kl0, q0, lane);
      else
        oss_attn_bwd_sm90_mask_from_tile<T, T, NTQ>(sT, a, mask_tile, *mt, kw0, kl0, q0, lane);
    }
  } else if (MASK == 1)
    oss_attn_mask_tile<T, true, 1, NTQ>(reinterpret_cast<float(&)[1][NTQ][4]>(sT), a, oss_attn_mask_base(a, b, h), kw0,
                                        q0, lane);
  else if (need_mask)
    oss_attn_mask_frag<void, true, 1, NTQ>(reinterpret_cast<float(&)[1][NTQ][4]>(sT), a, 0, kw0, q0, lane);
#pragma unroll
  for (int n = 0; n < NTQ; n++) {
    const float2 lv = *reinterpret_cast<const float2 *>(cL + n * 8 + t2);
#pragma unroll
    for (int e = 0; e < 4; e++) sT[n][e] = oss_ex2(fmaf(sT[n][e], c, -((e & 1) ? lv.y : lv.x)));
  }
}

/* The score variants and dropout (VAR kernels) for a warp's fragments of S^T
 * and dP^T (keys kw0 .., queries i0 + q0 ..; dP^T the last wgmma group in
 * flight): dropout's kept weights drawn while dP^T is computed, dP^T times
 * Z k (so that dS = P (Z k dP - D)), then one pass per element as in the
 * mma.sync kernel: the variants' score, P^T into sT, and dS'^T into pT through
 * the softcap's derivative (sc: the softmax scale). cL, cD: the block's lse
 * and D from query q0 on. */
template <int NTQ>
__device__ __forceinline__ void oss_attn_bwd_sm90_var_probs(float (&sT)[NTQ][4], float (&pT)[NTQ][4],
                                                            oss_attn_keep<1, NTQ> &keep, const oss_attn_args &a,
                                                            uint64_t seed, int b, int h, int kw0, int i0, int q0,
                                                            const float *cL, const float *cD, float sc, int lane) {
  const int t2 = (lane & 3) * 2;
  if (a.drop_seed != nullptr)
    oss_attn_dropout_keep<true, 1, NTQ>(keep, a, seed, (int64_t)b * a.hq + h, kw0, i0 + q0, lane);
  oss_wgmma_wait<0>();
  oss_wgmma_fence_operand<NTQ>(pT);
  if (a.drop_seed != nullptr)
    oss_attn_dropout_apply<1, NTQ>(reinterpret_cast<float(&)[1][NTQ][4]>(pT), keep, a.drop_scale);
  const oss_attn_var_consts vc = oss_attn_var_consts_of(a, b, h);
  oss_attn_var_each<true, 1, NTQ, false>(reinterpret_cast<float(&)[1][NTQ][4]>(sT), a, vc, 0, kw0, i0 + q0, lane,
                                         [&](int, int n, int e, float x, float dcap) {
                                           const int c = n * 8 + t2 + (e & 1); /* the query's index */
                                           const float p = oss_ex2(x - cL[c]);
                                           sT[n][e] = p;
                                           pT[n][e] = (p * sc * dcap) * (pT[n][e] - cD[c]);
                                         });
}

/* The producer's copies (one thread): query block it = 0 .. niter - 1 (query
 * head hk * group + it / nqe, block qb0 + it % nqe) into stage it % STAGES:
 * Q and dO by bulk tensor copies (KD / 64 boxes of 64 columns by BR rows,
 * 128-byte swizzled, rows past the queries zero), lse and D by bulk copies,
 * all completing on full[stage]; a stage is refilled once every consumer
 * thread arrived on its empty mbarrier. */
template <typename T, int KD, int BR, int STAGES, bool MASK_TILES = false>
__device__ __forceinline__ void oss_attn_bwd_sm90_produce(const oss_attn_args &a, const oss_attn_bwd_sm90_maps &maps,
                                                          uint64_t *full, uint64_t *empty, T *sQ, T *sdO, float *sL,
                                                          float *sD, int b, int hk, int qb0, int nqe, int niter,
                                                          int j0 = 0, unsigned char *sM = nullptr,
                                                          uint64_t *mfull = nullptr, uint64_t *mempty = nullptr) {
  oss_tma_prefetch_map(&maps.q);
  oss_tma_prefetch_map(&maps.dout);
  if (MASK_TILES) oss_tma_prefetch_map(&maps.m);
  const int tb = a.cu_q != nullptr ? 0 : b; /* the copies' batch: packed rows are one */
#pragma unroll 1
  for (int it = 0; it < niter; it++) {
    const int st = it % STAGES, use = it / STAGES;
    const int h = hk * a.group + it / nqe, i0 = (qb0 + it % nqe) * BR;
    if (use > 0) oss_mbar_wait_backoff(&empty[st], (use - 1) & 1);
    oss_mbar_arrive_expect_tx(&full[st], 2u * BR * KD * (uint32_t)sizeof(T) + 2u * BR * 4u);
#pragma unroll
    for (int cb = 0; cb < KD / 64; cb++) {
      oss_tma_load_4d(oss_smem_u32(sQ + st * BR * KD + cb * BR * 64), &maps.q, &full[st], cb * 64,
                      (int)a.seq_q0 + i0, h, tb);
      oss_tma_load_4d(oss_smem_u32(sdO + st * BR * KD + cb * BR * 64), &maps.dout, &full[st], cb * 64,
                      (int)a.seq_q0 + i0, h, tb);
    }
    /* lse_adj and D: padded workspace rows, so BR of them are always there */
    const int64_t ro = oss_attn_ws_row(a, b, h) + i0;
    oss_bulk_load(oss_smem_u32(sL + st * BR), (const float *)a.lse_adj + ro, BR * 4, &full[st]);
    oss_bulk_load(oss_smem_u32(sD + st * BR), (const float *)a.dsum + ro, BR * 4, &full[st]);
    if constexpr (MASK_TILES) { /* the block's mask tile: one buffer, free once the previous block was masked */
      if (it > 0) oss_mbar_wait_backoff(mempty, (it - 1) & 1);
      oss_sm90_load_mask(oss_smem_u32(sM), &maps.m, maps.mask, mfull, 128, j0, i0, h, b);
    }
  }
}

template <typename T, int HD, int BR, int BC, int STAGES, bool VAR = false, int MASK = 0>
__global__ void __launch_bounds__(384, 1)
    oss_attn_bwd_sm90_kernel(const __grid_constant__ oss_attn_args args,
                             const __grid_constant__ oss_attn_bwd_sm90_maps maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int NCONS = 256, NTQ = BR / 8, NO = HD / 8;
  /* MASK: 0 no mask tensor, 1 one read element by element from global
   * memory, 2 one whose tiles the copy engine brings (maps.m, maps.mask) into
   * one buffer after the tile of ones, refilled once every consumer thread
   * masked the block (mfull, mempty) */
  constexpr bool MASK_TENSOR = MASK != 0, MASK_TILES = MASK == 2;
  /* KD: the columns of the K, V, Q and dO tiles in shared memory (whole
   * boxes); the products read HD of them */
  constexpr int KD = oss_sm90_cols(HD);
  static_assert(HD % 16 == 0 && BR % 64 == 0 && BC == 128, "16-multiples, two warpgroups of 64 keys");
  static_assert(BR == 128 ? HD == 64 : HD > 64 && HD <= 128,
                "the dQ block splits into one 64 x 64 piece per warpgroup (rows by BR = 128, columns by 64)");
  constexpr int NB = oss_attn_bwd_sm90_ds_bufs(MASK);
  static_assert(oss_attn_bwd_sm90_tiles_bytes<HD, BR, BC, STAGES, NB>() % 1024 == 0,
                "the tile of ones is 1024-byte aligned, as its 128-byte swizzle needs");
  /* named barriers: the consumers (K and V landed, dK and dV staged);
   * zeroing rows, a warpgroup's piece of the dQ block staged (the warpgroup
   * arrives, the dQ warp waits) and its part of sdQ free again (the dQ warp
   * arrives, the warpgroup waits), one of each per consumer warpgroup */
  enum { BAR_CONSUMERS = 1, BAR_ZERO = 2, BAR_DQ_FULL = 4, BAR_DQ_EMPTY = 6 };
  constexpr int DQ_BAR_THREADS = 128 + 32;

  extern __shared__ __align__(1024) unsigned char oss_sm90_smem[];
  T *sK = reinterpret_cast<T *>(oss_sm90_smem + ((1024u - (oss_smem_u32(oss_sm90_smem) & 1023u)) & 1023u));
  T *sV = sK + BC * KD;
  T *sQ = sV + BC * KD;            /* [STAGES][BR x KD] */
  T *sdO = sQ + STAGES * BR * KD;  /* [STAGES][BR x KD] */
  T *sdS = sdO + STAGES * BR * KD; /* [NB] dS'^T: BC rows (keys) x BR columns (queries) */
  float *sdQ = reinterpret_cast<float *>(sdS + NB * BC * BR); /* [BR][dq pitch] */
  float *sL = sdQ + BR * oss_attn_bwd_sm90_dq_pitch<HD>();   /* [STAGES][BR] */
  float *sD = sL + STAGES * BR;                             /* [STAGES][BR] */
  T *sOnes = reinterpret_cast<T *>(sD + STAGES * BR);       /* 8 x 64 ones: B of the dS' row sums */
  unsigned char *sM = reinterpret_cast<unsigned char *>(sOnes) + 1024; /* the mask tile (MASK_TILES) */

  /* full[st]: stage st's Q, dO, lse and D landed (one producer arrival plus
   * the copies' bytes); empty[st]: every consumer thread is done with it
   * (each arrives after its own last read: racecheck then follows the
   * order from its reads of lse and D to the next copy into the stage) */
  __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES], mfull, mempty;
  /* ds_full[i]: both warpgroups stored their dS'^T rows in buffer i;
   * ds_empty[i]: both warpgroups' dQ products have read it (one arrival per
   * consumer thread each) */
  __shared__ __align__(8) uint64_t ds_full[NB], ds_empty[NB];

  /* wg known uniform (oss_warpgroup) except in the kernels that read a mask
   * tensor, where the uniform registers it takes make the kernel spill */
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = MASK_TENSOR ? warp >> 2 : oss_warpgroup();
  int b, hk, block;
  if (!oss_attn_key_block_of(args, BC, &b, &hk, &block)) return;
  oss_attn_args a = args; /* a sequence's view in a variable-length batch */
  oss_attn_seq_view<T>(a, b);
  /* deterministic mode (dense batches only): the key blocks in reverse
   * (oss_attn_bwd_sm90_rank), the dQ blocks added in that order */
  const bool ordered = a.dq_sem != nullptr;
  const int nkb = (a.lk + BC - 1) / BC;
  if (ordered) block = nkb - 1 - block;
  const int j0 = block * BC;
  if (block < 0 || j0 >= a.lk) return; /* an empty slot, or past a shorter sequence's keys */

  /* iteration it: query head hk * group + it / nqe, query block qb0 + it % nqe */
  int qb0, nqe;
  oss_attn_bwd_query_blocks<BR>(a, j0, &qb0, &nqe, BC);
  const int niter = a.group * nqe;
  const bool atomic_dq = a.dq_acc != nullptr;

  if (tid == 0) { /* made visible by the fence and barrier of init_stages */
    if (MASK_TILES) {
      oss_mbar_init(&mfull, 1);
      oss_mbar_init(&mempty, NCONS);
    }
    for (int i = 0; i < NB; i++) {
      oss_mbar_init(&ds_full[i], NCONS);
      oss_mbar_init(&ds_empty[i], NCONS);
    }
  }
  oss_attn_bwd_sm90_init_stages<STAGES>(full, empty, NCONS); /* the only CTA-wide barrier */

  if (wg == 2) {
    /* producer warpgroup: warp 8 issues the copies of the query blocks, warp
     * 9 adds the staged dQ blocks to the accumulator */
    oss_setmaxnreg_dec<OSS_SM90_PRODUCER_REGS>();
    if (warp == 8 && lane == 0 && niter > 0) {
      oss_attn_bwd_sm90_produce<T, KD, BR, STAGES, MASK_TILES>(a, maps, full, empty, sQ, sdO, sL, sD, b, hk, qb0, nqe,
                                                               niter, j0, sM, &mfull, &mempty);
    } else if (warp == 9 && atomic_dq && niter > 0) {
      oss_named_arrive(BAR_DQ_EMPTY, DQ_BAR_THREADS); /* sdQ starts free */
      oss_named_arrive(BAR_DQ_EMPTY + 1, DQ_BAR_THREADS);
#pragma unroll 1
      for (int it = 0; it < niter; it++) {
        const int h = hk * a.group + it / nqe, qi = qb0 + it % nqe, i0 = qi * BR;
        const int64_t row0 = oss_attn_ws_row(a, b, h) + i0;
        /* deterministic mode: this block's counter (one per 64 workspace
         * rows) and the count of additions it must see first */
        unsigned *sem = ordered ? a.dq_sem + row0 / 64 : nullptr;
        const unsigned rank = ordered && lane == 0 ? (unsigned)oss_attn_bwd_sm90_rank<BR, BC>(a, block, nkb, qi) : 0u;
        oss_named_sync(BAR_DQ_FULL, DQ_BAR_THREADS); /* both warpgroups' pieces staged */
        oss_named_sync(BAR_DQ_FULL + 1, DQ_BAR_THREADS);
        /* the accumulator's rows have the staging pitch (the launcher checks),
         * so the block is one contiguous range; its rows past the queries are
         * the workspace's padding and receive zeros */
        if (lane == 0) {
          if (ordered) {
            while (oss_ld_acquire_gpu(sem) != rank) __nanosleep(64);
            oss_fence_proxy_async_global(); /* the bulk reduction after the acquire */
          }
          oss_bulk_reduce_add_f32(a.dq_acc + row0 * a.dq_ld, oss_smem_u32(sdQ), BR * oss_attn_bwd_sm90_dq_pitch<HD>() * 4);
          oss_bulk_commit();
          oss_bulk_wait_read<0>(); /* sdQ read */
        }
        __syncwarp();
        if (it + 1 < niter) {
          oss_named_arrive(BAR_DQ_EMPTY, DQ_BAR_THREADS);
          oss_named_arrive(BAR_DQ_EMPTY + 1, DQ_BAR_THREADS);
        }
        if (ordered && lane == 0) { /* the additions done, then the next key block's turn */
          oss_bulk_wait<0>();
          oss_fence_proxy_async_global();
          oss_red_release_gpu_add(sem, 1u);
        }
      }
      oss_bulk_wait<0>();
    }
    return;
  }

  /* consumer warpgroups */
  oss_setmaxnreg_inc<OSS_SM90_CONSUMER_REGS>();
  const int g = lane >> 2, t2 = (lane & 3) * 2;
  const int kw0 = j0 + wg * 64 + (warp & 3) * 16; /* this warp's first key */
  const float sc = (float)a.scale;
  const uint64_t seed = VAR ? oss_attn_drop_seed(a) : 0; /* dropout's */

  float dV[NO][4], dK[NO][4];
#pragma unroll
  for (int n = 0; n < NO; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) dV[n][e] = dK[n][e] = 0.f;

  /* K and V, zero past the keys: once per CTA, by the consumers (K also for
   * dQ's centring alone) */
  const int krows = min(BC, a.lk - j0);
  if (niter > 0 || a.kmean_part != nullptr)
    oss_load_tile<T, BC, KD, 64, NCONS, true>(
        sK, (const T *)a.k + b * a.k_s[0] + hk * a.k_s[1] + (int64_t)j0 * a.k_s[2], a.k_s[2], krows, a.d,
        a.vec & OSS_ATTN_VEC_K, tid);
  if (niter > 0)
    oss_load_tile<T, BC, KD, 64, NCONS, true>(
        sV, (const T *)a.v + b * a.v_s[0] + hk * a.v_s[1] + (int64_t)j0 * a.v_s[2], a.v_s[2], krows, a.dv,
        a.vec & OSS_ATTN_VEC_V, tid);
  reinterpret_cast<uint32_t *>(sOnes)[tid] = oss_mma_op<T>::pack(1.f, 1.f); /* 256 x 4 bytes */
  if (tid < BR) { /* the staging rows' padding, added to the accumulator's */
    float4 *pad = reinterpret_cast<float4 *>(sdQ + tid * oss_attn_bwd_sm90_dq_pitch<HD>() + HD);
    pad[0] = pad[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  oss_cp_async_commit();
  oss_cp_async_wait<0>();
  oss_fence_proxy_async(); /* for the tensor cores' reads */
  oss_named_sync(BAR_CONSUMERS, NCONS);
  if (a.kmean_part != nullptr) /* chunks: the kmean_part stride of the batch's longest keys */
    oss_attn_bwd_sm90_ksum<T, HD, BC, BR>(a, sK, sdS, b, hk, block, (args.lk + BC - 1) / BC, tid, BAR_CONSUMERS);

  const uint32_t sKw = oss_smem_u32(sK) + wg * 64 * 128, sVw = oss_smem_u32(sV) + wg * 64 * 128;
  /* this warpgroup's 64 x 64 piece of dQ_blk: query rows mo.., head-dim columns no.. */
  const int mo = BR == 128 ? wg * 64 : 0, no = BR == 128 ? 0 : wg * 64;
  /* dQ's centring: the dS' row sums of this warpgroup's piece, over all 128
   * keys (BR = 128: the rows are its own) or over its half of them (BR = 64:
   * both warpgroups share the rows and each adds half the sum), always issued
   * (a condition around a wgmma makes ptxas serialise every wgmma of the
   * kernel) */
  constexpr int RS_STEPS = BR == 128 ? BC / 16 : BC / 32;
  const int rs_k0 = BR == 128 ? 0 : wg * RS_STEPS;

  /* This warpgroup's piece of block q's dQ (and the row sums R) from dS'^T
   * in buffer q % NB, once both warpgroups stored theirs there; then, with
   * every product issued so far complete, the buffer is released and the
   * piece staged in sdQ for the dQ warp once it has read the previous block.
   * R goes into the padding column pitch - 4 (BR = 64: pitch - 4 + wg, a
   * half per warpgroup, which the dq conversion adds), so it reaches the
   * accumulator with dQ. */
  auto dq_step = [&](int q) {
    const int buf = NB == 1 ? 0 : q & 1;
    oss_mbar_wait(&ds_full[buf], (q / NB) & 1);
    int off = buf * BC * BR;
    asm volatile("" : "+r"(off));
    const T *tdS = sdS + off;
    float dq[8][4], rs[1][4]; /* rs: the first k-step ignores its old value */
#pragma unroll
    for (int n = 0; n < 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
    oss_wgmma_fence_operand<8>(dq);
    oss_wgmma_fence();
    /* descriptors' low words (oss_wgmma_desc_lo): a k-step of 16 rows
     * moves the MN-major operands by 16 * 128 bytes, the ones by 32 */
    const uint32_t dS_lo = oss_wgmma_desc_lo(oss_smem_u32(tdS) + (mo >> 6) * BC * 128, BC * 128);
    const uint32_t k_lo = oss_wgmma_desc_lo(oss_smem_u32(sK) + (no >> 6) * BC * 128, BC * 128);
    const uint32_t ones_lo = oss_wgmma_desc_lo(oss_smem_u32(sOnes), 16);
    constexpr uint32_t hi = oss_wgmma_desc_hi(1024);
#pragma unroll
    for (int kk = 0; kk < BC / 16; kk++)
      oss_wgmma<T, 64>::template ss<1, 1>(dq, oss_wgmma_desc_join(dS_lo + kk * 128, hi),
                                          oss_wgmma_desc_join(k_lo + kk * 128, hi), kk > 0);
    /* R = dS' times ones (K-major B; every k-step reads the same ones) */
#pragma unroll
    for (int k = 0; k < RS_STEPS; k++)
      oss_wgmma<T, 8>::template ss<1, 0>(rs, oss_wgmma_desc_join(dS_lo + (rs_k0 + k) * 128, hi),
                                         oss_wgmma_desc_join(ones_lo + (k & 3) * 2, hi), k > 0);
    oss_wgmma_commit();
    oss_wgmma_wait<0>();
    oss_wgmma_fence_operand<8>(dq);
    oss_wgmma_fence_operand<1>(rs);
    oss_mbar_arrive(&ds_empty[buf]);
    oss_named_sync(BAR_DQ_EMPTY + wg, DQ_BAR_THREADS);
#pragma unroll
    for (int hi = 0; hi < 2; hi++) {
      float *row = sdQ + (mo + (warp & 3) * 16 + g + hi * 8) * oss_attn_bwd_sm90_dq_pitch<HD>();
#pragma unroll
      for (int n = 0; n < 8; n++)
        if (HD % 64 == 0 || no + n * 8 < HD) /* head dim 96: the second piece's columns past HD are zero */
          *reinterpret_cast<float2 *>(row + no + t2 + n * 8) = make_float2(dq[n][2 * hi], dq[n][2 * hi + 1]);
      if ((lane & 3) == 0) row[oss_attn_bwd_sm90_dq_pitch<HD>() - 4 + (BR == 128 ? 0 : wg)] = rs[0][2 * hi];
    }
    oss_fence_proxy_async();
    oss_named_arrive(BAR_DQ_FULL + wg, DQ_BAR_THREADS);
  };

#pragma unroll 1
  for (int it = 0; it < niter; it++) {
    const int st = it % STAGES;
    const int h = hk * a.group + it / nqe;
    const int i0 = (qb0 + it % nqe) * BR;
    T *tQ = sQ + st * BR * KD, *tdO = sdO + st * BR * KD;
    oss_mbar_wait(&full[st], (it / STAGES) & 1);
    /* a sequence's last block in a variable-length batch: the rows past it
     * are the next sequence's */
    if (a.cu_q != nullptr && i0 + BR > a.lq) {
      oss_sm90_zero_rows<T, KD, BR>(tQ, a.lq - i0, tid & 127, BAR_ZERO + wg);
      oss_sm90_zero_rows<T, KD, BR>(tdO, a.lq - i0, tid & 127, BAR_ZERO + wg);
    }
    const uint32_t cQ = oss_smem_u32(tQ), cdO = oss_smem_u32(tdO);
    const float *cL = sL + st * BR, *cD = sD + st * BR;

    /* S^T = K_w Q^T and dP^T = V_w dO^T, committed as two groups (their first
     * k-step ignores the accumulators' old values, so these start undefined and
     * are live only inside the iteration) */
    float sT[NTQ][4], pT[NTQ][4];
    oss_wgmma_fence();
    oss_attn_sm90_qk<T, HD, BC, BR>(sT, sKw, cQ);
    oss_wgmma_commit();
    oss_attn_sm90_qk<T, HD, BC, BR>(pT, sVw, cdO);
    oss_wgmma_commit();
    oss_wgmma_wait<1>(); /* S^T done */
    oss_wgmma_fence_operand<NTQ>(sT);

    oss_attn_keep<1, NTQ> keep; /* dropout's kept weights (VAR) */
    if constexpr (VAR) {
      oss_attn_bwd_sm90_var_probs<NTQ>(sT, pT, keep, a, seed, b, h, kw0, i0, 0, cL, cD, sc, lane);
    } else {
      /* P^T; the scores to mask: the causal rule, the end of the keys and a
       * window's edges (a window alone runs this kernel) */
      const bool bounds = j0 + BC > a.lk ||
                          (a.causal && (int64_t)(j0 + wg * 64 + 63) > (int64_t)i0 + a.causal_off) ||
                          !oss_attn_window_holds(a, i0, BR, j0 + wg * 64, 64);
      if constexpr (MASK_TILES) {
        oss_mbar_wait(&mfull, it & 1);
        oss_attn_bwd_sm90_probs<T, NTQ, MASK>(sT, a, bounds, b, h, kw0, i0, cL, lane, oss_smem_u32(sM), &maps.mask,
                                              kw0 - j0);
        oss_mbar_arrive(&mempty); /* after this thread's reads of the tile */
      } else {
        oss_attn_bwd_sm90_probs<T, NTQ, MASK>(sT, a, MASK_TENSOR || bounds, b, h, kw0, i0, cL, lane);
      }
      oss_wgmma_wait<0>(); /* dP^T done */
      oss_wgmma_fence_operand<NTQ>(pT);
#pragma unroll
      for (int n = 0; n < NTQ; n++) {
        const float2 dd = *reinterpret_cast<const float2 *>(cD + n * 8 + t2);
#pragma unroll
        for (int e = 0; e < 4; e++) pT[n][e] = (sT[n][e] * sc) * (pT[n][e] - ((e & 1) ? dd.y : dd.x));
      }
    }
    /* dV += P^T dO and dK += dS'^T Q, P^T and dS'^T packed to 16-bit A fragments
     * (after both are computed, so the float copies and the fragments are not
     * live together) */
    uint32_t pa[1][NTQ / 2][4], dsa[1][NTQ / 2][4];
    oss_acc_to_a<T, 1, NTQ>(reinterpret_cast<float(&)[1][NTQ][4]>(sT), pa);
    oss_acc_to_a<T, 1, NTQ>(reinterpret_cast<float(&)[1][NTQ][4]>(pT), dsa);
    if (VAR && a.drop_seed != nullptr) oss_attn_dropout_apply_a<1, NTQ>(pa, keep); /* P Z, for dV (k at the end) */
    oss_wgmma_fence_operand<NO>(dV);
    oss_wgmma_fence_operand<NO>(dK);
    oss_wgmma_fence();
    oss_attn_sm90_pv<T, HD, BR>(dV, pa[0], cdO);
    oss_attn_sm90_pv<T, HD, BR>(dK, dsa[0], cQ);
    oss_wgmma_commit();

    if (atomic_dq) {
      /* dS'^T goes to buffer `buf` once both warpgroups' dQ products of block
       * it - NB have read it. Its address takes an offset the compiler cannot
       * see is 0, so that the stores' addresses are formed in each block
       * (hoisted out of the loop, they held registers and the kernel spilled) */
      const int buf = NB == 1 ? 0 : it & 1;
      if (it >= NB) oss_mbar_wait(&ds_empty[buf], (it / NB - 1) & 1);
      int off = buf * BC * BR;
      asm volatile("" : "+r"(off));
      T *tdS = sdS + off;
      /* dS'^T rows (keys) kw0 - j0 + g (+8), columns (queries) 16kk + t2 (+1, +8, +9), swizzled */
#pragma unroll
      for (int kk = 0; kk < NTQ / 2; kk++)
#pragma unroll
        for (int f = 0; f < 4; f++) {
          const int r = kw0 - j0 + g + (f & 1) * 8, c = kk * 16 + (f >> 1) * 8 + t2;
          T *p = tdS + (c >> 6) * BC * 64 + r * 64 + ((((c & 63) >> 3) ^ (r & 7)) << 3) + (c & 7);
          *reinterpret_cast<uint32_t *>(p) = dsa[0][kk][f];
        }
      oss_fence_proxy_async();
      oss_mbar_arrive(&ds_full[buf]);
      /* With two buffers the dQ product trails by one block: block it - 1's,
       * whose dS'^T both warpgroups stored a block ago, so neither waits for
       * the other here and their softmax phases need not coincide (the
       * tensor cores run one's products under the other's). */
      if (it >= NB - 1) dq_step(it - (NB - 1));
      else oss_wgmma_wait<0>();
      oss_mbar_arrive(&empty[st]); /* the stage's Q, dO, lse and D are read */
    } else {
      oss_wgmma_wait<0>();
      oss_mbar_arrive(&empty[st]);
    }
    oss_wgmma_fence_operand<NO>(dV);
    oss_wgmma_fence_operand<NO>(dK);
  }
  /* the last block's dQ product where it trails */
  if (NB > 1 && atomic_dq && niter > 0) dq_step(niter - 1);

  /* dK and dV (times dropout's k) for rows < Lk, columns < D / Dv, staged in
   * K's and V's shared memory (this warpgroup's rows of them) once both
   * warpgroups' last products have read it */
  const int r0 = j0 + wg * 64; /* this warpgroup's first key */
  T *gdK = (T *)a.dk + b * a.dk_s[0] + hk * a.dk_s[1] + (int64_t)r0 * a.dk_s[2];
  T *gdV = (T *)a.dv_ptr + b * a.dv_s[0] + hk * a.dv_s[1] + (int64_t)r0 * a.dv_s[2];
  const bool vdk = a.vec & OSS_ATTN_VEC_DK, vdv = a.vec & OSS_ATTN_VEC_DV;
  const float dv_scale = VAR && a.drop_seed != nullptr ? a.drop_scale : 1.f;
  const int nrows = min(64, a.lk - r0);
  oss_named_sync(BAR_CONSUMERS, NCONS);
  oss_sm90_store_rows<T, NO>(gdK, a.dk_s[2], nrows, a.d, vdk, dK, 1.f, sK + wg * 64 * KD, BAR_ZERO + wg, tid & 127);
  oss_sm90_store_rows<T, NO>(gdV, a.dv_s[2], nrows, a.dv, vdv, dV, dv_scale, sV + wg * 64 * KD, BAR_ZERO + wg,
                             tid & 127);
#else
  __trap(); /* not built for sm_90a: never in the dispatch table */
#endif
}

/* The column-split kernel for head dims above 128 (HD a multiple of 128),
 * where a warpgroup's dK and dV for 64 keys over every column would not fit
 * its registers: dK and dV only; dQ comes after it from the query-major
 * kernel (attention_bwd_dq_sm90.cuh, or where that cannot run the mma.sync
 * one), which measured faster than adding each block's dQ to a float32
 * accumulator here (five products a block, the additions bound by the
 * memory side). One CTA owns BC = 64 keys of one (batch, kv head) and loops
 * over the query heads of its GQA group and the BR = 64 query blocks that see
 * the keys, with the producer of the key-split kernel (no dQ warp):
 *   S^T = K Q^T and dP^T = V dO^T (wgmma, shared-memory operands): warpgroup w
 *   computes queries [32w, 32w + 32) for all 64 keys (warp k: keys 16k ..
 *   16k + 15), P^T and dS'^T in registers as in the key-split kernel; both go
 *   to shared memory (two buffers each, so one consumer barrier per block
 *   suffices: a warpgroup writes buffer i & 1 only after both passed the
 *   barrier of block i - 1, by when each had waited for its products of block
 *   i - 2).
 *   dV += P^T dO and dK += dS'^T Q over head-dim columns [HD/2 w, HD/2 w +
 *   HD/2) (A = P^T, dS'^T from shared memory, K-major; B MN-major), so a
 *   thread keeps HD / 2 floats of dK and of dV, summed in one order (the
 *   kernel is deterministic in either mode).
 *   VAR: the score variants and dropout as in the key-split kernel.
 * Limits: as the key-split kernel's, and no mask tensor (the launcher runs the
 * mma.sync backward for it). */
template <typename T, int HD, int BR, int BC, int STAGES, bool VAR = false>
__global__ void __launch_bounds__(384, 1)
    oss_attn_bwd_sm90_wide_kernel(const __grid_constant__ oss_attn_args args,
                                  const __grid_constant__ oss_attn_bwd_sm90_maps maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int NCONS = 256, QW = BR / 2 /* a warpgroup's queries of S^T */, NTQ = QW / 8;
  constexpr int HW = HD / 2 /* a warpgroup's columns of dK and dV */, NO = HW / 8;
  static_assert(HD % 128 == 0 && BR == 64 && BC == 64, "64 x 64 blocks, whole 64-column boxes per warpgroup");
  enum { BAR_CONSUMERS = 1, BAR_ZERO = 4 };

  extern __shared__ __align__(1024) unsigned char oss_sm90_smem[];
  T *sK = reinterpret_cast<T *>(oss_sm90_smem + ((1024u - (oss_smem_u32(oss_sm90_smem) & 1023u)) & 1023u));
  T *sV = sK + BC * HD;
  T *sQ = sV + BC * HD;           /* [STAGES][BR x HD] */
  T *sdO = sQ + STAGES * BR * HD; /* [STAGES][BR x HD] */
  T *sP = sdO + STAGES * BR * HD; /* [2][P^T: BC rows (keys) x BR columns (queries), one 64-column box] */
  T *sdS = sP + 2 * BC * BR;      /* [2][dS'^T, the same] */
  float *sL = reinterpret_cast<float *>(sdS + 2 * BC * BR); /* [STAGES][BR] */
  float *sD = sL + STAGES * BR;                             /* [STAGES][BR] */
  __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = oss_warpgroup();
  int b, hk, block;
  if (!oss_attn_key_block_of(args, BC, &b, &hk, &block)) return;
  oss_attn_args a = args;
  oss_attn_seq_view<T>(a, b);
  const int j0 = block * BC;
  if (j0 >= a.lk) return; /* past a shorter sequence's keys */
  int qb0, nqe;
  oss_attn_bwd_query_blocks<BR>(a, j0, &qb0, &nqe, BC);
  const int niter = a.group * nqe;

  oss_attn_bwd_sm90_init_stages<STAGES>(full, empty, NCONS); /* the only CTA-wide barrier */

  if (wg == 2) {
    oss_setmaxnreg_dec<OSS_SM90_PRODUCER_REGS>();
    if (warp == 8 && lane == 0 && niter > 0)
      oss_attn_bwd_sm90_produce<T, HD, BR, STAGES>(a, maps, full, empty, sQ, sdO, sL, sD, b, hk, qb0, nqe, niter);
    return;
  }

  oss_setmaxnreg_inc<OSS_SM90_CONSUMER_REGS>();
  const int g = lane >> 2, t2 = (lane & 3) * 2;
  const int kr = (warp & 3) * 16, kw0 = j0 + kr; /* this warp's first key (its rows of S^T) */
  const int q0 = wg * QW, c0 = wg * HW;         /* this warpgroup's queries of S^T, columns of dK and dV */
  const float sc = (float)a.scale;
  const uint64_t seed = VAR ? oss_attn_drop_seed(a) : 0; /* dropout's */

  float dV[NO][4], dK[NO][4];
#pragma unroll
  for (int n = 0; n < NO; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) dV[n][e] = dK[n][e] = 0.f;

  const int krows = min(BC, a.lk - j0);
  if (niter > 0) {
    oss_load_tile<T, BC, HD, 64, NCONS, true>(sK, (const T *)a.k + b * a.k_s[0] + hk * a.k_s[1] + (int64_t)j0 * a.k_s[2],
                                             a.k_s[2], krows, a.d, a.vec & OSS_ATTN_VEC_K, tid);
    oss_load_tile<T, BC, HD, 64, NCONS, true>(sV, (const T *)a.v + b * a.v_s[0] + hk * a.v_s[1] + (int64_t)j0 * a.v_s[2],
                                             a.v_s[2], krows, a.dv, a.vec & OSS_ATTN_VEC_V, tid);
  }
  oss_cp_async_commit();
  oss_cp_async_wait<0>();
  oss_fence_proxy_async(); /* for the tensor cores' reads */
  oss_named_sync(BAR_CONSUMERS, NCONS);

  constexpr uint32_t hi = oss_wgmma_desc_hi(1024);
#pragma unroll 1
  for (int it = 0; it < niter; it++) {
    const int st = it % STAGES;
    const int h = hk * a.group + it / nqe;
    const int i0 = (qb0 + it % nqe) * BR;
    T *tQ = sQ + st * BR * HD, *tdO = sdO + st * BR * HD;
    oss_mbar_wait(&full[st], (it / STAGES) & 1);
    if (a.cu_q != nullptr && i0 + BR > a.lq) {
      oss_sm90_zero_rows<T, HD, BR>(tQ, a.lq - i0, tid & 127, BAR_ZERO + wg);
      oss_sm90_zero_rows<T, HD, BR>(tdO, a.lq - i0, tid & 127, BAR_ZERO + wg);
    }
    const float *cL = sL + st * BR + q0, *cD = sD + st * BR + q0;

    /* S^T and dP^T for keys 0 .. 63, queries q0 .. q0 + 31 (rows 32 wg of Q's
     * and dO's boxes: 4096 bytes, a whole number of swizzle periods) */
    float sT[NTQ][4], pT[NTQ][4];
    oss_wgmma_fence();
    oss_attn_sm90_qk<T, HD, BC, QW, BR>(sT, oss_smem_u32(sK), oss_smem_u32(tQ) + q0 * 128);
    oss_wgmma_commit();
    oss_attn_sm90_qk<T, HD, BC, QW, BR>(pT, oss_smem_u32(sV), oss_smem_u32(tdO) + q0 * 128);
    oss_wgmma_commit();
    oss_wgmma_wait<1>();
    oss_wgmma_fence_operand<NTQ>(sT);

    /* dS'^T */
    oss_attn_keep<1, NTQ> keep; /* dropout's kept weights (VAR) */
    if constexpr (VAR) {
      oss_attn_bwd_sm90_var_probs<NTQ>(sT, pT, keep, a, seed, b, h, kw0, i0, q0, cL, cD, sc, lane);
    } else {
      /* P^T; the scores to mask: the causal rule and the end of the keys */
      const bool need_mask =
          j0 + BC > a.lk || (a.causal && (int64_t)(j0 + BC - 1) > (int64_t)(i0 + q0) + a.causal_off);
      oss_attn_bwd_sm90_probs<T, NTQ, 0>(sT, a, need_mask, b, h, kw0, i0 + q0, cL, lane);
      oss_wgmma_wait<0>();
      oss_wgmma_fence_operand<NTQ>(pT);
#pragma unroll
      for (int n = 0; n < NTQ; n++) {
        const float2 dd = *reinterpret_cast<const float2 *>(cD + n * 8 + t2);
#pragma unroll
        for (int e = 0; e < 4; e++) pT[n][e] = (sT[n][e] * sc) * (pT[n][e] - ((e & 1) ? dd.y : dd.x));
      }
    }
    uint32_t pa[1][NTQ / 2][4], dsa[1][NTQ / 2][4];
    oss_acc_to_a<T, 1, NTQ>(reinterpret_cast<float(&)[1][NTQ][4]>(sT), pa);
    oss_acc_to_a<T, 1, NTQ>(reinterpret_cast<float(&)[1][NTQ][4]>(pT), dsa);
    if (VAR && a.drop_seed != nullptr) oss_attn_dropout_apply_a<1, NTQ>(pa, keep); /* P Z, for dV (k at the end) */
    T *tP = sP + (it & 1) * BC * BR, *tdS = sdS + (it & 1) * BC * BR;
    /* rows (keys) kr + g (+8), columns (queries) q0 + 16kk + t2 (+1, +8, +9), swizzled */
#pragma unroll
    for (int kk = 0; kk < NTQ / 2; kk++)
#pragma unroll
      for (int f = 0; f < 4; f++) {
        const int r = kr + g + (f & 1) * 8, col = q0 + kk * 16 + (f >> 1) * 8 + t2;
        const int off = r * 64 + (((col >> 3) ^ (r & 7)) << 3) + (col & 7);
        *reinterpret_cast<uint32_t *>(tP + off) = pa[0][kk][f];
        *reinterpret_cast<uint32_t *>(tdS + off) = dsa[0][kk][f];
      }
    oss_fence_proxy_async();
    oss_named_sync(BAR_CONSUMERS, NCONS); /* P^T and dS'^T of both warpgroups stored */

    /* dV += P^T dO and dK += dS'^T Q (B's column blocks BR * 128 bytes
     * apart, 16 rows per k-step) over columns c0 .. c0 + HW */
    oss_wgmma_fence_operand<NO>(dV);
    oss_wgmma_fence_operand<NO>(dK);
    oss_wgmma_fence();
    const uint32_t p_lo = oss_wgmma_desc_lo(oss_smem_u32(tP), 16), ds_lo = oss_wgmma_desc_lo(oss_smem_u32(tdS), 16);
    const uint32_t do_lo = oss_wgmma_desc_lo(oss_smem_u32(tdO + (c0 >> 6) * BR * 64), BR * 128);
    const uint32_t q_lo = oss_wgmma_desc_lo(oss_smem_u32(tQ + (c0 >> 6) * BR * 64), BR * 128);
#pragma unroll
    for (int kk = 0; kk < BR / 16; kk++)
      oss_wgmma<T, HW>::template ss<0, 1>(dV, oss_wgmma_desc_join(p_lo + kk * 2, hi),
                                          oss_wgmma_desc_join(do_lo + kk * 128, hi), 1);
#pragma unroll
    for (int kk = 0; kk < BR / 16; kk++)
      oss_wgmma<T, HW>::template ss<0, 1>(dK, oss_wgmma_desc_join(ds_lo + kk * 2, hi),
                                          oss_wgmma_desc_join(q_lo + kk * 128, hi), 1);
    oss_wgmma_commit();

    oss_wgmma_wait<0>();
    oss_wgmma_fence_operand<NO>(dV);
    oss_wgmma_fence_operand<NO>(dK);
    oss_mbar_arrive(&empty[st]); /* the stage's Q, dO, lse and D are read */
  }

  /* dK and dV: all 64 keys, this warpgroup's columns, staged in its own
   * column blocks of K and V (no product reads them once both warpgroups
   * passed the barrier) */
  T *gdK = (T *)a.dk + b * a.dk_s[0] + hk * a.dk_s[1] + (int64_t)j0 * a.dk_s[2] + c0;
  T *gdV = (T *)a.dv_ptr + b * a.dv_s[0] + hk * a.dv_s[1] + (int64_t)j0 * a.dv_s[2] + c0;
  const bool vdk = a.vec & OSS_ATTN_VEC_DK, vdv = a.vec & OSS_ATTN_VEC_DV;
  oss_named_sync(BAR_CONSUMERS, NCONS);
  oss_sm90_store_rows<T, NO>(gdK, a.dk_s[2], krows, a.d - c0, vdk, dK, 1.f, sK + (c0 >> 6) * BC * 64, BAR_ZERO + wg,
                             tid & 127);
  const float dv_scale = VAR && a.drop_seed != nullptr ? a.drop_scale : 1.f; /* dropout's k */
  oss_sm90_store_rows<T, NO>(gdV, a.dv_s[2], krows, a.dv - c0, vdv, dV, dv_scale, sV + (c0 >> 6) * BC * 64,
                             BAR_ZERO + wg, tid & 127);
#else
  __trap(); /* not built for sm_90a: never in the dispatch table */
#endif
}

/* Launches the kernel over the call's key blocks, then the dQ pass. The
 * key-split kernel: with an accumulator and no counters dq_det (the mma.sync
 * query-major dQ pass, from its own generated file) then does nothing and
 * the caller converts the accumulator; in deterministic mode (a->dq_sem) the
 * kernel's ordered additions fill it and this converts it; without one
 * dq_det computes dq. The column-split kernel: the wgmma query-major kernel
 * computes dq (oss_attn_bwd_dq_sm90_run, falling back to dq_det). Where the
 * copy engine cannot address q or dout, or the kernel's register budget does
 * not hold, or a deterministic call has a variable-length batch (key-split
 * kernel), `fallback` (the mma.sync backward of the same gradients, whose dQ
 * pass then computes dq where there is no accumulator) runs instead. */
template <typename T, int HD, bool VAR, bool MASK_TENSOR = false>
oss_status oss_attn_bwd_sm90_run(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev,
                                 oss_attn_launch_fn dq_det, oss_attn_launch_fn fallback) {
  typedef oss_attn_bwd_sm90_cfg<HD> C;
  static_assert(!C::WIDE || !MASK_TENSOR, "the column-split kernel reads no mask tensor");
  oss_attn_bwd_sm90_maps maps;
  void (*kernel)(const oss_attn_args, const oss_attn_bwd_sm90_maps);
  size_t smem;
  if constexpr (C::WIDE) {
    /* dQ from the query-major kernel: the workspace plan gives the call no
     * accumulator (oss_attn_bwd_dq_query_major); a call that has one (the
     * plan expected another kernel) runs `fallback`, which fills it */
    if (a->dq_acc != NULL) return fallback(a, stream, dev);
    kernel = oss_attn_bwd_sm90_wide_kernel<T, HD, C::BR, C::BC, C::STAGES, VAR>;
    smem = oss_attn_bwd_sm90_wide_smem_bytes<HD, C::BR, C::BC, C::STAGES>();
  } else {
    kernel = oss_attn_bwd_sm90_kernel<T, HD, C::BR, C::BC, C::STAGES, VAR, MASK_TENSOR ? 1 : 0>;
    smem = oss_attn_bwd_sm90_smem_bytes<HD, C::BR, C::BC, C::STAGES, oss_attn_bwd_sm90_ds_bufs(MASK_TENSOR ? 1 : 0)>();
  }
  /* the setmaxnreg budgets hold only if the kernel launches with the
   * registers they assume (see OSS_SM90_LAUNCH_REGS) */
  static const int regs = oss_kernel_regs(kernel);
  if constexpr (MASK_TENSOR && !C::WIDE) {
    /* the mask's tiles by the copy engine (MASK = 2) where it can address the
     * mask and one tile fits beside the others (bool and 16-bit masks;
     * float32 ones at head dims 96 and 128); else the mask is read element
     * by element.
     * *Reason:* as in the forward, each element's load from global memory
     * held the kernel, which also spilled for the registers they took. */
    void (*tiles_kernel)(const oss_attn_args, const oss_attn_bwd_sm90_maps) =
        oss_attn_bwd_sm90_kernel<T, HD, C::BR, C::BC, C::STAGES, VAR, 2>;
    static const int tiles_regs = oss_kernel_regs(tiles_kernel);
    const size_t tiles_smem = oss_attn_bwd_sm90_smem_bytes<HD, C::BR, C::BC, C::STAGES, oss_attn_bwd_sm90_ds_bufs(2)>();
    if (tiles_regs >= OSS_SM90_LAUNCH_REGS && a->cu_q == NULL &&
        oss_attn_sm90_mask_map(&maps.m, &maps.mask, a, C::BC, C::BR) && tiles_smem + maps.mask.stage_bytes <= 225 * 1024) {
      kernel = tiles_kernel;
      smem = tiles_smem + maps.mask.stage_bytes;
    }
  }
  if (a->lk > 0) {
    const bool packed = a->cu_q != NULL; /* a variable-length batch: one batch of the packed rows */
    const int64_t mb = packed ? 1 : a->batch, mq = packed ? a->total_q : a->lq;
    const bool unsupported = !C::WIDE && ((a->dq_acc != NULL && a->dq_ld != oss_attn_bwd_sm90_dq_pitch<HD>()) ||
                                          (a->dq_sem != NULL && packed));
    if (regs < OSS_SM90_LAUNCH_REGS || mq > INT_MAX || smem > (size_t)dev->max_smem_per_block_optin || unsupported ||
        !oss_attn_sm90_map<T>(&maps.q, a->q, mb, a->hq, mq, a->d, a->q_s, C::BR) ||
        !oss_attn_sm90_map<T>(&maps.dout, a->dout, mb, a->hq, mq, a->dv, a->do_s, C::BR))
      return fallback(a, stream, dev);
    oss_status st;
    if (C::WIDE) { /* kbar from K, before the kernel (it does not sum K's columns) */
      st = oss_attn_bwd_means(a, std::is_same<T, __half>::value ? OSS_FLOAT16 : OSS_BFLOAT16, stream);
      if (st != OSS_OK) return st;
    }
    OSS_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<oss_attn_key_grid(a, C::BC), 384, smem, stream>>>(*a, maps);
    st = oss_check_launch(VAR ? "attention backward with score variants (wgmma)" : "attention backward (wgmma)");
    if (st != OSS_OK) return st;
    if (!C::WIDE) {
      st = oss_attn_bwd_means_reduce(a, stream); /* kbar from the sums the kernel wrote, for the dQ passes below */
      if (st != OSS_OK) return st;
    }
  }
  /* the key-split kernel's ordered additions filled the accumulator; after
   * the column-split kernel the query-major kernel computes dq */
  if (a->dq_sem != NULL && !C::WIDE)
    return a->lq > 0 ? oss_attn_bwd_dq_convert(a, std::is_same<T, __half>::value ? OSS_FLOAT16 : OSS_BFLOAT16, stream)
                     : OSS_OK;
  if constexpr (C::WIDE) return oss_attn_bwd_dq_sm90_run<T, HD, VAR>(a, stream, dev, dq_det);
  return dq_det(a, stream, dev);
}

/* Entry points instantiated once per (head dim, dtype) by the generator: the
 * plain kernel, a variant of it that reads a mask tensor (a separate
 * instantiation, so that the plain one keeps its registers: reading the mask
 * makes the consumers spill), and the one with the score variants (with a
 * mask tensor as well: mma_var, the mma.sync backward with the variants).
 * The mma.sync launchers come from their own generated files, so these files
 * do not compile those kernels again. */
template <typename T, int HD>
oss_status oss_attn_bwd_sm90_launch(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev,
                                    oss_attn_launch_fn dq_det, oss_attn_launch_fn mma, oss_attn_launch_fn dq_det_var,
                                    oss_attn_launch_fn mma_var) {
  if (a->variants) {
    /* a window, sinks or both (oss_attn_bwd_sm90_var_launch sends them here):
     * the key-split kernel masks the tiles across a window's edges as it masks
     * the diagonal, and the sinks are in lse; the passes that may run beside
     * it or instead of it are those with the variants, which know windows */
    if constexpr (oss_attn_bwd_sm90_cfg<HD>::WIDE) return mma_var(a, stream, dev);
    else return oss_attn_bwd_sm90_run<T, HD, false>(a, stream, dev, dq_det_var, mma_var);
  }
  if (a->mask_kind != OSS_MASK_NONE) {
    if constexpr (oss_attn_bwd_sm90_cfg<HD>::WIDE) return mma(a, stream, dev);
    else return oss_attn_bwd_sm90_run<T, HD, false, true>(a, stream, dev, dq_det, mma);
  }
  return oss_attn_bwd_sm90_run<T, HD, false>(a, stream, dev, dq_det, mma);
}
template <typename T, int HD>
oss_status oss_attn_bwd_sm90_var_launch(const oss_attn_args *a, cudaStream_t stream, const oss_device_info *dev,
                                        oss_attn_launch_fn dq_det_var, oss_attn_launch_fn mma_var,
                                        oss_attn_launch_fn plain) {
  if (a->mask_kind != OSS_MASK_NONE) return mma_var(a, stream, dev);
  /* a window, sinks or both: the plain key-split kernel (`plain`: the
   * launcher above, from its own generated file; NULL where the build has none) */
  if (!oss_attn_bwd_sm90_cfg<HD>::WIDE && oss_attn_bwd_plain_scores(a) && plain != NULL) return plain(a, stream, dev);
  return oss_attn_bwd_sm90_run<T, HD, true>(a, stream, dev, dq_det_var, mma_var);
}

#endif /* OSS_ATTENTION_BWD_SM90_CUH */
