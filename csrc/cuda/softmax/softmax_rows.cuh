/*
 * softmax_rows.cuh - softmax / log_softmax forward and backward over
 * contiguous rows (inner == 1 in oss.h's [outer, n, inner] view).
 *
 * The kernels hold their part of a row on chip, so each element is read
 * from global memory once and written once (the split tier re-reads):
 *
 * softmax_rows_in_warp_kernel: narrow rows (forward up to 32 * 8 slots: 1024
 *   float32 or 2048 16-bit elements; backward 32 * 4 slots). A group of G
 *   lanes (G = 1..32, a power of two) owns one row; a warp handles 32/G rows
 *   at a time and lane g holds slots g, g+G, ... (K <= KM of them) in
 *   registers as raw 16-byte values. KM = 4 or 8 (the 4-slot variant needs
 *   fewer registers, so more warps stay resident for the narrowest rows).
 *   Aligned forward rows of 1, 2, 3, 4, 8 or 16 slots take RL = 2 or 4 rows
 *   per lane instead, K = 1 or 2 slots of each (G = the row's slots rounded
 *   up to a power of two, at most 8; the rule is softmax_plan.cu's): each load
 *   instruction of a warp then covers whole 128-byte lines of consecutive
 *   rows, not part of each row of the warp.
 *   Reduction: butterfly shuffles inside the group (forward max first,
 *   sm_reduce_max_first).
 *
 * softmax_row_in_cta_kernel: aligned rows of up to T x KM slots: a row per
 *   CTA, thread t holds slots t, t + T, ... in registers, one block
 *   reduction (the forward's max first; the backward's sm_block_sum, one
 *   barrier), log a constant. Two instantiations: the light tier, KM = 2 at
 *   most 32 registers per thread (softmax_plan.cu takes it at 128-512 slots
 *   forward, 16-bit also 1024, 1024 slots backward, 64-512 too where the
 *   memory is fast per SM, and for most of the backward's one-CTA register
 *   plans of <= 2 slots per thread), and KM = sm_chunk_kreg at 64, which
 *   runs the one-CTA chunk plans that hold a row in registers only at more
 *   than 2 slots per thread (no modes, no shared-memory part: a lighter
 *   path than the chunk kernel's for the same shape).
 *
 * softmax_row_chunks_kernel: one CTA owns a chunk of S slots of a row: thread
 *   t holds slots t + k*T in registers (k < K <= sm_chunk_kreg) and, when the
 *   chunk is larger than that, the rest in dynamic shared memory (filled by
 *   cp.async; each thread reads back only the slots it copied, so no barrier
 *   is needed for them). Modes:
 *     SM_FULL, C == 1: the CTA holds the whole row (block tier).
 *     SM_FULL, C > 1 (sm_90): a cluster of C CTAs holds the row; each CTA
 *       writes its block (m, d') into slot [rank] of every CTA's shared memory
 *       (distributed shared memory), one cluster barrier, then each merges the
 *       C values in the same order, so all agree bit for bit. The exchange
 *       buffer is double-buffered so one barrier per row suffices.
 *     SM_SPREAD: C CTAs hold the row, as a cluster does, but exchange their
 *       (m, d') through the workspace: each writes its partial and counts
 *       itself in the row's arrival counter, then waits until all C have
 *       arrived and merges the C partials in chunk order. Not limited to one
 *       GPC (any C the GPU can hold at once, two CTAs per SM) and not to
 *       sm_90. A CTA takes its (row, chunk) from a ticket counter, not from
 *       blockIdx: tickets go out in the order CTAs start, so a waiting CTA
 *       waits only for chunks already running or next in line, and the launch
 *       makes progress whenever the GPU can hold C of them (the planner
 *       asks for twice that). A wait longer than 10 s traps (an error, not a
 *       hang) should the GPU be partitioned below that.
 *     SM_STATS / SM_APPLY: split tier for rows of any width: C chunks per row
 *       in separate CTAs; STATS writes each chunk's partial statistics to the
 *       workspace, softmax_merge_partials_kernel merges them, APPLY re-reads
 *       the chunk and writes the output. On sm_90 the merge and APPLY are
 *       programmatic dependent launches: APPLY's CTAs start during STATS's
 *       tail and load their chunk before they wait for the merged statistics.
 *   Grid: SM_FULL x = rows * C (cluster rank fastest; a row-stride loop
 *   where fewer rows are launched); SM_STATS / SM_APPLY x = chunk, y = rows
 *   (grid-stride loop); SM_SPREAD x = rows * C, one chunk per CTA.
 *
 * Slots and edges. Slots are 16-byte pieces aligned to the reference tensor
 * (x forward, y backward); only slots entirely inside the row go through the
 * unrolled register/shared-memory path (16-byte loads, 8/16/32-byte stores;
 * element-wise for a tensor whose misalignment differs from the reference's).
 * The at most 2 * (VEC - 1) elements before the first and after the last full
 * slot ("edges") are handled by a short scalar loop that reads them again in
 * the output phase (from L1/L2): the hot path stays branch-free and small.
 *
 * The warp and chunk kernels come in two instantiations: AL = true where the
 * launch knows every row starts a slot in every tensor and n is a whole
 * number of slots (no edges, no misaligned-tensor paths: less code and fewer
 * instructions), and the general one (AL = false); the light kernel exists
 * aligned only (float statistics). Where a row sits on one CTA (warp tier, light tier,
 * one-CTA chunks) the input loads carry an L2 evict_last policy and, in the
 * last rows (those the L2 can still hold), each line goes back to
 * evict_normal once the row's output is written (keep, release_lo/hi;
 * sm_l2_policy in softmax_common.cuh).
 *
 * Statistics inside a thread are max-first over each part of what it holds
 * (no running rescale inside a part: the data is on chip). The chunk kernel
 * has three parts, two cp.async groups of shared-memory slots and its
 * register slots, loaded and reduced in that order, so the statistics of the
 * first parts run while the rest is still arriving. float32/float64 softmax
 * keeps the exp values (relative to their part's max) in place of x so the
 * output needs no second exp. Parts, threads, warps, CTAs and cluster ranks
 * merge (m, d') with sm_merge.
 *
 * Limits: blockDim.x a power of two, 64 .. 1024 (chunk kernel; 64
 * registers per thread, 512 for float64; row-in-CTA kernel, 32 or 64) or
 * 32 .. 128 (warp kernel); G and,
 * in SM_FULL, C powers of two; 64-bit row offsets, 32-bit offsets inside a
 * chunk.
 */
#ifndef OSS_SOFTMAX_ROWS_CUH
#define OSS_SOFTMAX_ROWS_CUH

#include <cooperative_groups.h>

#include "cuda/softmax/softmax_common.cuh"

// ---- arguments ----------------------------------------------------------------

typedef struct sm_row_args {
  const void *a;  /* forward: x        backward: y   (the reference of the slot grid) */
  const void *b;  /* forward: unused   backward: dy */
  void *out;      /* forward: y        backward: dx */
  int64_t so_a, so_b, so_out; /* stride_outer, elements */
  int64_t rows, n;
  int log;
  int keep;       /* 1: input loads evict_last, released after the output (sm_l2_policy);
                   * (any other nonzero value: evict_last, never released) */
  int64_t release_lo, release_hi; /* keep == 1: the rows [lo, hi) whose lines are released */
  int mode;       /* sm_mode */
  int C;          /* CTAs per row: cluster size (SM_FULL) or chunk count (SM_STATS/SM_APPLY) */
  int K;          /* register slots per thread */
  int G;          /* warp kernel: lanes per row */
  int smem_slots; /* chunk kernel, SM_FULL: shared-memory slots per CTA */
  int64_t S;      /* chunk kernel: slots per chunk = blockDim.x * K + smem_slots */
  void *partials; /* workspace: [rows][C] statistics (SM_STATS, SM_SPREAD) */
  unsigned *counters; /* workspace, zeroed by the launch (SM_SPREAD): [0] the ticket, [1 + row] arrivals */
  void *finals;   /* workspace: [rows] merged statistics (SM_APPLY) */
  int ramp_ns;      /* chunk kernel (SM_FULL), row-in-CTA kernel: the first wave's ramp (sm_first_wave_ramp): */
  int64_t ramp_rows; /* row r < ramp_rows starts r * ramp_ns late (sm_ramp_wait); 0: no ramp */
} sm_row_args;

enum { SM_WARP_THREADS = 128, SM_CHUNK_THREADS = 1024, SM_CTA_ROW_K = 2 };

/* Register slots per thread: 128 bytes of raw data forward, 2 x 64 backward
 * (chunk kernel) or 2 x 64 (warp kernel); halved for float64, whose math
 * needs more registers. */
template <bool BWD, typename Acc> __host__ __device__ constexpr int sm_warp_kmax() {
  return (BWD ? 4 : 8) / (sizeof(Acc) == 8 ? 2 : 1);
}
template <bool BWD, typename Acc> __host__ __device__ constexpr int sm_chunk_kreg() {
  return (BWD ? 4 : 8) / (sizeof(Acc) == 8 ? 2 : 1);
}

// ---- a chunk of a row: pointers, full slots and edges ---------------------------

/* The chunk s0 .. s0+S-1 of a row's slot grid. Chunk-relative element k lives
 * at a0[k]; full slot m (0 <= m < nfull) starts at element f0 + m*VEC; edge
 * e (0 <= e < ne) is element lo + e (e < hlen) or tstart + e - hlen. */
template <typename T1, typename T2> struct sm_chunk {
  const T1 *a0, *b0;
  T2 *out0;
  int f0, nfull;
  int lo, hlen, tstart, ne;
  bool ok_b, ok_out; /* b / out share a's slot grid (vector access allowed) */
};

template <bool BWD, bool AL, typename T1, typename T2>
__device__ __forceinline__ sm_chunk<T1, T2> sm_chunk_setup(const sm_row_args &P, int64_t row, int64_t s0, int64_t S) {
  constexpr int VEC = sm_vec<T1>();
  sm_chunk<T1, T2> R;
  const T1 *a = (const T1 *)P.a + row * P.so_a;
  const T1 *b = BWD ? (const T1 *)P.b + row * P.so_b : a;
  T2 *out = (T2 *)P.out + row * P.so_out;
  if constexpr (AL) { /* every row starts a slot in each tensor and n is a whole number of slots */
    const int64_t off = s0 * VEC, rem = P.n - off;
    const int hi = rem <= 0 ? 0 : (int)(rem < S * VEC ? rem : S * VEC);
    R.a0 = a + off;
    R.b0 = b + off;
    R.out0 = out + off;
    R.ok_b = R.ok_out = true;
    R.f0 = R.lo = R.hlen = R.ne = 0;
    R.nfull = hi / VEC;
    R.tstart = hi;
    return R;
  }
  const int ph = sm_phase(a);
  R.ok_b = BWD ? sm_grid_ok<T1, VEC>(b, ph) : true;
  R.ok_out = sm_grid_ok<T2, VEC>(out, ph);
  const int64_t off = s0 * VEC - ph; /* row element of chunk element 0 */
  R.a0 = a + off;
  R.b0 = b + off;
  R.out0 = out + off;
  const int lo = off < 0 ? (int)-off : 0;
  const int64_t rem = P.n - off;
  const int hi = rem <= lo ? lo : (int)(rem < S * VEC ? rem : S * VEC);
  const int lfirst = lo > 0 ? 1 : 0, llast = hi / VEC;
  const int lend = llast > lfirst ? llast : lfirst;
  const int hend = hi < lfirst * VEC ? hi : lfirst * VEC;
  R.f0 = lfirst * VEC;
  R.nfull = lend - lfirst;
  R.lo = lo;
  R.hlen = hend > lo ? hend - lo : 0;
  R.tstart = lend * VEC > hend ? lend * VEC : hend;
  R.ne = R.hlen + (hi > R.tstart ? hi - R.tstart : 0);
  return R;
}

/* An aligned chunk's pointers moved to its full slot m, and made opaque to
 * the compiler, so that slot m + k * step of each tensor is that pointer
 * plus k * step slots. Without it the compiler recomputes row x stride for
 * each slot and tensor, 7 instructions per address. The forward of the warp
 * and light kernels uses it (5-19 % fewer instructions per row, which bound
 * the narrow rows). The backward does not: with it ptxas spills a register
 * or two per thread, and in CTAs that live one row each thread's local
 * store is L2 write traffic beside the stream, which costs more than the
 * instructions saved. */
template <typename T1, typename T2>
__device__ __forceinline__ sm_chunk<T1, T2> sm_chunk_at_slot(sm_chunk<T1, T2> R, int m) {
  constexpr int VEC = sm_vec<T1>();
  unsigned long long a = (unsigned long long)(R.a0 + R.f0 + m * VEC), b = (unsigned long long)(R.b0 + R.f0 + m * VEC),
                     o = (unsigned long long)(R.out0 + R.f0 + m * VEC);
  asm("" : "+l"(a), "+l"(b), "+l"(o));
  R.a0 = (const T1 *)a;
  R.b0 = (const T1 *)b;
  R.out0 = (T2 *)o;
  R.f0 = 0;
  return R;
}

template <typename T1, typename T2> __device__ __forceinline__ int sm_edge_index(const sm_chunk<T1, T2> &R, int e) {
  return e < R.hlen ? R.lo + e : R.tstart + (e - R.hlen);
}

/* The register slots m = first + k * step (k < nv) of a and, backward, b,
 * all with 16-byte loads; where b's slot grid is misaligned (rare), its
 * vector loads read a instead (always aligned and in bounds) and b's slots
 * are then reloaded element by element. A per-slot choice between the
 * vector and element paths of b makes the compiler copy each vector right
 * after its load, so the thread would wait for that load before it issues
 * the next one. */
template <bool BWD, int KMAX, typename T1, typename T2>
__device__ __forceinline__ void sm_load_full_slots(const sm_chunk<T1, T2> &R, int first, int step, int nv,
                                                   sm_slot (&ra)[KMAX], sm_slot (&rb)[KMAX], unsigned long long pol) {
  constexpr int VEC = sm_vec<T1>();
  const T1 *b = BWD && R.ok_b ? R.b0 : R.a0;
#pragma unroll
  for (int k = 0; k < KMAX; k++)
    if (k < nv) {
      const int e = R.f0 + (first + k * step) * VEC;
      ra[k].u = sm_ld16_hint(R.a0 + e, pol);
      if (BWD) rb[k].u = sm_ld16_hint(b + e, pol);
    }
  if (BWD && !R.ok_b) {
#pragma unroll
    for (int k = 0; k < KMAX; k++)
      if (k < nv) rb[k] = sm_load_full(R.b0 + R.f0 + (first + k * step) * VEC, false);
  }
}

template <bool BWD, typename T1, typename T2>
__device__ __forceinline__ void sm_load_full_slot_to_smem(const sm_chunk<T1, T2> &R, int m, uint4 *da, uint4 *db,
                                                          unsigned long long pol) {
  constexpr int VEC = sm_vec<T1>();
  const int k = R.f0 + m * VEC;
  sm_cp_async16_hint(da, R.a0 + k, pol);
  if (BWD) {
    if (R.ok_b) sm_cp_async16_hint(db, R.b0 + k, pol);
    else *db = sm_load_full(R.b0 + k, false).u;
  }
}

/* Sets the input lines of full slot m back to evict_normal (see
 * sm_l2_policy) once its output is written: one request per 128-byte line,
 * from the slot at the line's start, and from the chunk's first slot, whose
 * line may begin in the row before (each owner releases after its own loads,
 * so the last word on a shared line is a release). */
template <bool BWD, typename T1, typename T2>
__device__ __forceinline__ void sm_release_slot(const sm_chunk<T1, T2> &R, int m) {
  constexpr int VEC = sm_vec<T1>();
  const T1 *pa = R.a0 + R.f0 + m * VEC;
  if (m == 0 || ((uintptr_t)pa & 127) == 0) sm_release_line(pa);
  if (BWD) {
    const T1 *pb = R.b0 + R.f0 + m * VEC;
    if (m == 0 || ((uintptr_t)pb & 127) == 0) sm_release_line(pb);
  }
}

/* Per-slot pieces of the thread statistics (full slots only). Forward: the
 * max over every value a thread holds (registers and shared memory) comes
 * first, then one sum of exp(x - ms): the data is on chip, so no running
 * rescale is needed inside a thread, and the (m, d') partials are merged
 * across threads with sm_merge. With cache (softmax, 4-/8-byte input) the exp
 * values replace x in the slot, so the output needs no second exp. Backward:
 * the plain sums. */
template <typename T1, typename Acc> __device__ __forceinline__ Acc sm_slot_max(const sm_slot &ra, Acc m) {
  constexpr int VEC = sm_vec<T1>();
  Acc v[2] = {m, (Acc)-INFINITY};
#pragma unroll
  for (int e = 0; e < VEC; e++) v[e & 1] = sm_max(v[e & 1], sm_slot_elem<T1, Acc>(ra, e));
  return sm_max(v[0], v[1]);
}

/* 16-bit input: the max runs on packed pairs (one HMNMX2 per two elements, no
 * conversion). Like fmaxf it ignores a NaN next to a number (two NaNs give
 * NaN, which sm_pair_max_acc drops), and the pair max is exact, so the result
 * equals sm_slot_max's. */
template <typename T1> struct sm_pair;
template <> struct sm_pair<__half> { typedef __half2 type; };
template <> struct sm_pair<__nv_bfloat16> { typedef __nv_bfloat162 type; };
template <typename T1, typename Acc> __host__ __device__ constexpr bool sm_pair_max() {
  return sizeof(T1) == 2 && sizeof(Acc) == 4;
}
template <typename T1> __device__ __forceinline__ unsigned sm_pair_max_identity() {
  return (unsigned)(sm_neg_inf_bits<T1>() | (sm_neg_inf_bits<T1>() << 16));
}
template <typename T1> __device__ __forceinline__ unsigned sm_pair_max_word(unsigned a, unsigned b) {
  typedef typename sm_pair<T1>::type P;
  const P r = __hmax2(*(const P *)&a, *(const P *)&b);
  return *(const unsigned *)&r;
}
template <typename T1> __device__ __forceinline__ unsigned sm_slot_pair_max(const sm_slot &ra, unsigned p) {
  return sm_pair_max_word<T1>(p, sm_pair_max_word<T1>(sm_pair_max_word<T1>(ra.w[0], ra.w[1]),
                                                        sm_pair_max_word<T1>(ra.w[2], ra.w[3])));
}
template <typename T1, typename Acc> __device__ __forceinline__ Acc sm_pair_max_acc(unsigned p) {
  sm_slot s;
  s.w[0] = p;
  return sm_max(sm_max((Acc)-INFINITY, sm_slot_elem<T1, Acc>(s, 0)), sm_slot_elem<T1, Acc>(s, 1)); /* NaN pair -> -inf */
}

/* Adds the slot's exp(x - ms) to s (SPLIT: those of elements equal to the
 * fold's max m to top instead, see sm_sum_split). */
template <bool FAST, bool SPLIT, typename T1, typename Acc>
__device__ __forceinline__ void sm_slot_sumexp(sm_slot &ra, Acc m, Acc ms, bool cache, Acc &s, Acc &top) {
  constexpr int VEC = sm_vec<T1>();
  Acc v[2] = {0, 0};
#pragma unroll
  for (int e = 0; e < VEC; e++) {
    const Acc x = sm_slot_elem<T1, Acc>(ra, e);
    const Acc ex = sm_exp_shift<FAST>(x, ms);
    sm_sum_split<SPLIT>(x, m, ex, v[e & 1], top);
    if (cache) sm_set_bits<T1>(ra, e, sm_acc_to_bits<T1, Acc>(ex));
  }
  s += v[0] + v[1];
}

/* Adds the slot's y*dy (log_softmax: dy) to hi, compensated into lo (COMP). */
template <bool COMP, typename T1, typename Acc>
__device__ __forceinline__ void sm_slot_dot(const sm_slot &ra, const sm_slot &rb, int log, Acc &hi, Acc &lo) {
  constexpr int VEC = sm_vec<T1>();
  Acc v[2] = {0, 0};
#pragma unroll
  for (int e = 0; e < VEC; e++) {
    const Acc a = sm_slot_elem<T1, Acc>(ra, e), b = sm_slot_elem<T1, Acc>(rb, e);
    if (COMP) sm_add_compensated(hi, lo, log ? b : a * b);
    else v[e & 1] += log ? b : a * b;
  }
  if (!COMP) hi += v[0] + v[1];
}

/* The sum over a thread's register slots and shared-memory slots l = first,
 * first + step, ... < nsm of exp(x - ms), split (SPLIT) as sm_sum_split does. */
template <bool FAST, bool SPLIT, typename T1, typename Acc, int KM>
__device__ __forceinline__ void sm_thread_sumexp(sm_slot (&ra)[KM], int nv, uint4 *sa, int first, int nsm, int step,
                                                 Acc m, bool cache, Acc &s, Acc &top) {
  const Acc ms = sm_safe_max(m);
  Acc acc[2] = {0, 0};
#pragma unroll
  for (int k = 0; k < KM; k++)
    if (k < nv) sm_slot_sumexp<FAST, SPLIT, T1, Acc>(ra[k], m, ms, cache, acc[k & 1], top);
  for (int l = first; l < nsm; l += step) {
    sm_slot xa;
    xa.u = sa[l];
    sm_slot_sumexp<FAST, SPLIT, T1, Acc>(xa, m, ms, cache, acc[0], top);
    if (cache) sa[l] = xa.u;
  }
  s = acc[0] + acc[1];
}

/* Statistics of a thread's first nv register slots and, in shared memory,
 * slots l = first, first + step, ... < nsm of sa/sb (the caller has waited
 * for their copies). */
template <bool BWD, typename T1, typename T2, typename Acc, int KM>
__device__ __forceinline__ sm_stat<Acc> sm_thread_stats(sm_slot (&ra)[KM], const sm_slot (&rb)[KM], int nv,
                                                        uint4 *sa, const uint4 *sb, int first, int nsm, int step,
                                                        int log) {
  constexpr bool FAST = sizeof(T2) == 2;
  sm_stat<Acc> st = sm_stat_identity<BWD, Acc>();
  if constexpr (BWD) {
    constexpr bool COMP = sm_compensated<FAST, Acc>();
    Acc acc[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < KM; k++)
      if (k < nv) sm_slot_dot<COMP, T1>(ra[k], rb[k], log, acc[k & 1], st.m);
    for (int l = first; l < nsm; l += step) {
      sm_slot xa, xb;
      xa.u = sa[l];
      xb.u = sb[l];
      sm_slot_dot<COMP, T1>(xa, xb, log, acc[0], st.m);
    }
    st.d = acc[0];
    if (COMP) sm_add_compensated(st.d, st.m, acc[1]);
    else st.d += acc[1];
  } else {
    Acc m;
    if constexpr (sm_pair_max<T1, Acc>()) {
      unsigned pv[2] = {sm_pair_max_identity<T1>(), sm_pair_max_identity<T1>()};
#pragma unroll
      for (int k = 0; k < KM; k++)
        if (k < nv) pv[k & 1] = sm_slot_pair_max<T1>(ra[k], pv[k & 1]);
      for (int l = first; l < nsm; l += step) {
        sm_slot xa;
        xa.u = sa[l];
        pv[0] = sm_slot_pair_max<T1>(xa, pv[0]);
      }
      m = sm_pair_max_acc<T1, Acc>(sm_pair_max_word<T1>(pv[0], pv[1]));
    } else {
      Acc mv[2] = {(Acc)-INFINITY, (Acc)-INFINITY};
#pragma unroll
      for (int k = 0; k < KM; k++)
        if (k < nv) mv[k & 1] = sm_slot_max<T1, Acc>(ra[k], mv[k & 1]);
      for (int l = first; l < nsm; l += step) {
        sm_slot xa;
        xa.u = sa[l];
        mv[0] = sm_slot_max<T1, Acc>(xa, mv[0]);
      }
      m = sm_max(mv[0], mv[1]);
    }
    Acc s = 0, top = 0;
    if (log) sm_thread_sumexp<FAST, true, T1>(ra, nv, sa, first, nsm, step, m, false, s, top);
    else sm_thread_sumexp<FAST, false, T1>(ra, nv, sa, first, nsm, step, m, sm_can_cache<T1, Acc>(), s, top);
    st.d = s + (top - (Acc)1); /* sm_fold_d from the empty state: the fold's maximal element supplies the 1 */
    st.m = m;
  }
  return st;
}

/* Output of a slot whose values were replaced by exp(x - ms_thread): y = e * scale. */
template <typename T1, typename T2, typename Acc>
__device__ __forceinline__ void sm_slot_output_cached(const sm_chunk<T1, T2> &R, int m, const sm_slot &ra, Acc scale) {
  constexpr int VEC = sm_vec<T1>();
  Acc o[VEC];
#pragma unroll
  for (int e = 0; e < VEC; e++) o[e] = sm_slot_elem<T1, Acc>(ra, e) * scale;
  sm_store_full<T2, VEC>(R.out0 + R.f0 + m * VEC, R.ok_out, o);
}

template <bool BWD, typename T1, typename T2, typename Acc>
__device__ __forceinline__ void sm_slot_output(const sm_chunk<T1, T2> &R, int m, const sm_slot &ra, const sm_slot &rb,
                                               int log, Acc c0, Acc c1) {
  constexpr int VEC = sm_vec<T1>();
  constexpr bool FAST = sizeof(T2) == 2;
  Acc o[VEC];
#pragma unroll
  for (int e = 0; e < VEC; e++) {
    const Acc a = sm_slot_elem<T1, Acc>(ra, e);
    const Acc b = BWD ? sm_slot_elem<T1, Acc>(rb, e) : a;
    o[e] = sm_output<BWD, FAST>(a, b, log, c0, c1);
  }
  sm_store_full<T2, VEC>(R.out0 + R.f0 + m * VEC, R.ok_out, o);
}

/* Edge elements e = first, first + step, ...: fold into st (stats) or write
 * their output (out). Scalar loads; in the output phase they hit L1/L2. */
template <bool BWD, typename T1, typename T2, typename Acc>
__device__ __forceinline__ void sm_edges_accumulate(const sm_chunk<T1, T2> &R, int first, int step, sm_stat<Acc> &st,
                                                    int log) {
  constexpr bool FAST = sizeof(T2) == 2;
  sm_plain_d<BWD>(st, log);
  for (int e = first; e < R.ne; e += step) {
    const int k = sm_edge_index(R, e);
    Acc va[1], vb[1];
    va[0] = sm_bits_to_acc<T1, Acc>(sm_ld_bits(R.a0 + k));
    vb[0] = BWD ? sm_bits_to_acc<T1, Acc>(sm_ld_bits(R.b0 + k)) : va[0];
    sm_accumulate<BWD, FAST>(st, va, vb, 1, log);
  }
  sm_prime_d<BWD>(st, log);
}

template <bool BWD, typename T1, typename T2, typename Acc>
__device__ __forceinline__ void sm_edges_output(const sm_chunk<T1, T2> &R, int first, int step, int log, Acc c0,
                                                Acc c1) {
  constexpr bool FAST = sizeof(T2) == 2;
  for (int e = first; e < R.ne; e += step) {
    const int k = sm_edge_index(R, e);
    const Acc a = sm_bits_to_acc<T1, Acc>(sm_ld_bits(R.a0 + k));
    const Acc b = BWD ? sm_bits_to_acc<T1, Acc>(sm_ld_bits(R.b0 + k)) : a;
    sm_st_bits(R.out0 + k, sm_acc_to_bits<T2, Acc>(sm_output<BWD, FAST>(a, b, log, c0, c1)));
  }
}

/* The output of a thread's register slots first, first + step, ... (nv of
 * them), with st the row's statistics and c0, c1 from sm_finish: cached (the
 * float32 softmax that kept exp(x - m_thread) in place of x, m_thread the
 * thread's own max) one multiply per element, else from x (and dy). */
template <bool BWD, typename T1, typename T2, typename Acc, int KM>
__device__ __forceinline__ void sm_output_register_slots(const sm_chunk<T1, T2> &R, const sm_slot (&ra)[KM],
                                                         const sm_slot (&rb)[KM], int nv, int first, int step,
                                                         bool cached, Acc m_thread, sm_stat<Acc> st, int log, Acc c0,
                                                         Acc c1) {
  if (cached) {
    const Acc scale = sm_cache_scale(m_thread, st);
#pragma unroll
    for (int k = 0; k < KM; k++)
      if (k < nv) sm_slot_output_cached(R, first + k * step, ra[k], scale);
  } else {
#pragma unroll
    for (int k = 0; k < KM; k++)
      if (k < nv) sm_slot_output<BWD>(R, first + k * step, ra[k], rb[k], log, c0, c1);
  }
}

/* The same once st holds the row's statistics, for the warp and light
 * kernels: the slots' fences, the constants of sm_finish (returned for the
 * edges), then the output. */
template <bool BWD, typename T1, typename T2, typename Acc, int KM>
__device__ __forceinline__ void sm_output_registers(const sm_chunk<T1, T2> &R, sm_slot (&ra)[KM], sm_slot (&rb)[KM],
                                                    int nv, int first, int step, sm_stat<Acc> st, Acc m_thread, int log,
                                                    Acc &c0, Acc &c1) {
#pragma unroll
  for (int k = 0; k < KM; k++) {
    sm_slot_fence(ra[k]);
    if (BWD) sm_slot_fence(rb[k]);
  }
  sm_finish<BWD, sizeof(T2) == 2>(st, log, c0, c1);
  sm_output_register_slots<BWD>(R, ra, rb, nv, first, step, !BWD && sm_can_cache<T1, Acc>() && !log, m_thread, st,
                                log, c0, c1);
}

/* Releases the input lines of those register slots (sm_release_slot). */
template <bool BWD, int KM, typename T1, typename T2>
__device__ __forceinline__ void sm_release_registers(const sm_chunk<T1, T2> &R, int nv, int first, int step) {
#pragma unroll
  for (int k = 0; k < KM; k++)
    if (k < nv) sm_release_slot<BWD>(R, first + k * step);
}

/* The same for an aligned row, its pointers formed anew (from the strides in
 * bytes, unlike sm_chunk_setup): where the loads went through
 * sm_chunk_at_slot, the compiler would otherwise hold their pointers through
 * the row, spilled, for this branch that only the release window takes. */
template <bool BWD, int KM, typename T1, typename T2>
__device__ __forceinline__ void sm_release_aligned_row(const sm_row_args &P, int64_t row, int nv, int first,
                                                       int step) {
  sm_chunk<T1, T2> R{};
  R.a0 = (const T1 *)((const char *)P.a + row * (P.so_a * (int64_t)sizeof(T1)));
  R.b0 = BWD ? (const T1 *)((const char *)P.b + row * (P.so_b * (int64_t)sizeof(T1))) : R.a0;
  sm_release_registers<BWD, KM>(R, nv, first, step);
}

__device__ __forceinline__ unsigned long long sm_globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

/* The first wave's ramp (sm_first_wave_ramp in softmax_launch.cu): row r of the
 * first wave waits r * P.ramp_ns before its first load. */
__device__ __forceinline__ void sm_ramp_wait(const sm_row_args &P, int64_t r) {
  if (r >= P.ramp_rows) return;
  const unsigned long long wait = (unsigned long long)r * (unsigned)P.ramp_ns, t0 = sm_globaltimer_ns();
  while (sm_globaltimer_ns() - t0 < wait) __nanosleep(64);
}

// ---- narrow rows: G lanes per row --------------------------------------------

/* The warp kernel and the light tier run their row loop with log a constant: each
 * calls it with 0 or 1 (from P.log, the same for the whole launch), so each
 * copy drops the other's branches and per-element selects. A thread of
 * these kernels holds few slots, so what it does once per row (reduction,
 * constants, addresses) is a large share of its instructions, which bound
 * the narrowest rows. */

/* KM: register slots per lane (a light variant with half of sm_warp_kmax
 * keeps more warps resident for the narrowest rows: 9 CTAs per SM forward;
 * backward 12 at 40 registers, 10 where the output's element size differs,
 * which spills at 40; the full kernels run 6). RL: rows per lane (RL > 1
 * only aligned; K <= KM / RL slots of each row per lane); the warp's 32 / G
 * * RL rows of an iteration are RL groups of 32 / G consecutive rows, and
 * group r's k-th slots are loaded by one instruction, which so covers G
 * consecutive slots (whole lines at G = 8) of each of 32 / G consecutive
 * rows (with RL = 1 and G < 8 an instruction touches part of each of 32 / G
 * rows: 64 bytes each at G = 4, the 16-bit forward at 128 columns). At the
 * light kernel's 56 registers RL = 4 holds four rows' state through the
 * reductions with no stack (tests/test_softmax.py checks). */
template <bool BWD, typename T1, typename T2, typename Acc, int KM, bool AL, int RL>
__device__ __forceinline__ void sm_rows_in_warp(const sm_row_args &P, const int log) {
  static_assert(RL == 1 || (AL && KM % RL == 0), "rows per lane: aligned rows, whole slots per row");
  constexpr bool FAST = sizeof(T2) == 2;
  constexpr int KR = KM / RL; /* register slots of one row */
  /* G is a power of two (the launch checks): shifts, not divisions, before
   * the first loads */
  const int lane = threadIdx.x & 31, G = P.G, lgG = __ffs(G) - 1, rpw = 32 >> lgG, g = lane & (G - 1),
            sub = lane >> lgG;
  const int64_t warp0 = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int64_t wstride = (int64_t)gridDim.x * (blockDim.x >> 5);
  const unsigned long long pol = sm_l2_policy(P.keep != 0);
  /* row r of the lane's rows in this iteration, its slots and edges (for RL >
   * 1, aligned rows, recomputed where needed rather than held through the
   * reductions: a few integer instructions against registers that spilled).
   * A row past the last gets no slots, so its pointers are never used; for
   * RL > 1 they are formed from the row itself, not from a row clamped into
   * range: ptxas held the four clamped rows' high words through the
   * reductions and spilled them (16-24 bytes per thread; a CTA lives one
   * iteration, so that is L2 write traffic). At RL = 1 the clamp stays:
   * there dropping it made the float32 backward spill instead. */
  auto chunk = [&](int64_t base, int r) {
    const int64_t row = base + r * rpw + sub;
    sm_chunk<T1, T2> c = sm_chunk_setup<BWD, AL, T1, T2>(P, (RL > 1 || row < P.rows) ? row : base, 0, (int64_t)G * P.K);
    if (row >= P.rows) c.nfull = c.ne = 0;
    return c;
  };
  /* aligned forward rows (no edges), one row per lane: the row from the
   * lane's first slot, so that slot k is that pointer plus k * G
   * (sm_chunk_at_slot; the backward lost with it, and with several rows per
   * lane it spilled 16-40 bytes more per thread) */
  constexpr bool AT = AL && !BWD && RL == 1;
  for (int64_t base = warp0 * rpw * RL; base < P.rows; base += wstride * rpw * RL) {
    sm_chunk<T1, T2> R[RL];
    int nv[RL];
    sm_slot ra[RL][KR], rb[RL][KR];
#pragma unroll
    for (int r = 0; r < RL; r++) {
      R[r] = chunk(base, r);
      nv[r] = R[r].nfull > g ? min((R[r].nfull - g + G - 1) >> lgG, P.K) : 0;
      if constexpr (AT) sm_load_full_slots<BWD>(sm_chunk_at_slot(R[r], g), 0, G, nv[r], ra[r], rb[r], pol);
      else sm_load_full_slots<BWD>(R[r], g, G, nv[r], ra[r], rb[r], pol);
    }
    /* each row's statistics, then the reductions of all RL rows at once
     * (their shuffle chains interleave), then each row's output */
    sm_stat<Acc> st[RL];
    Acc m_thread[RL];
#pragma unroll
    for (int r = 0; r < RL; r++) {
      st[r] = sm_thread_stats<BWD, T1, T2, Acc>(ra[r], rb[r], nv[r], (uint4 *)0, (const uint4 *)0, 0, 0, 1, log);
      m_thread[r] = st[r].m;
      sm_edges_accumulate<BWD>(R[r], g, G, st[r], log);
    }
    if constexpr (BWD) {
#pragma unroll
      for (int r = 0; r < RL; r++) sm_bwd_group_sum<sm_compensated<FAST, Acc>()>(st[r], G);
    } else {
      sm_reduce_max_first<FAST, false>(st, G, log, (Acc(*)[32])nullptr);
    }
#pragma unroll
    for (int r = 0; r < RL; r++) {
      const sm_chunk<T1, T2> Rr = RL == 1 ? R[0] : chunk(base, r);
      Acc c0, c1;
      if constexpr (AT)
        sm_output_registers<BWD>(sm_chunk_at_slot(Rr, g), ra[r], rb[r], nv[r], 0, G, st[r], m_thread[r], log, c0, c1);
      else sm_output_registers<BWD>(Rr, ra[r], rb[r], nv[r], g, G, st[r], m_thread[r], log, c0, c1);
      sm_edges_output<BWD>(Rr, g, G, log, c0, c1);
      const int64_t row = base + r * rpw + sub;
      if (P.keep == 1 && row >= P.release_lo && row < P.release_hi) {
        if constexpr (AT) sm_release_aligned_row<BWD, KR, T1, T2>(P, row, nv[r], g, G);
        else sm_release_registers<BWD, KR>(Rr, nv[r], g, G);
      }
    }
  }
}

template <bool BWD, typename T1, typename T2, typename Acc, int KM, bool AL, int RL>
__global__ void __launch_bounds__(SM_WARP_THREADS, sizeof(Acc) == 8                 ? 4
                                                   : KM == sm_warp_kmax<BWD, Acc>() ? 6
                                                   : !BWD                           ? 9
                                                   : sizeof(T1) == sizeof(T2)       ? 12
                                                                                    : 10)
    softmax_rows_in_warp_kernel(sm_row_args P) {
  if (P.log) sm_rows_in_warp<BWD, T1, T2, Acc, KM, AL, RL>(P, 1);
  else sm_rows_in_warp<BWD, T1, T2, Acc, KM, AL, RL>(P, 0);
}

// ---- a row per CTA, registers only, a light footprint --------------------------

/* Aligned rows (AL) of up to blockDim.x * KM slots: CTA r holds row r (a
 * row-stride loop where fewer CTAs are launched), thread t slots t, t + T,
 * ... in registers, one block reduction (the forward's max first:
 * sm_reduce_max_first; the backward's sm_block_sum, its shared buffer
 * alternating per row). KM = SM_CTA_ROW_K (2) is compiled for at most 32
 * registers per thread (the backward with an output of another size: 64,
 * where 32 spilled), so 2048 threads per SM stay resident: small CTAs
 * (64-1024 threads) that each live one row, the shape of Triton's fused
 * softmax, which carries a tenth of the chunk kernel's code and so less
 * fixed cost per call: forward 32 bytes of a row per thread, backward 32 of
 * y and dy. KM = sm_chunk_kreg (8 forward, 4 backward) is compiled for 64,
 * the chunk kernel's budget, and runs its register-only one-CTA shapes. */
template <bool BWD, typename T1, typename T2, typename Acc, int KM>
__device__ __forceinline__ void sm_row_in_cta(const sm_row_args &P, const int log, sm_stat<Acc> (*red)[32],
                                              Acc (*red_fwd)[32]) {
  constexpr bool FAST = sizeof(T2) == 2;
  const int t = threadIdx.x, T = blockDim.x;
  /* the row is n / VEC <= T * KM whole slots (the launch checks), so the
   * thread's slots t, t + T, ... are simply those below that */
  const int nslots = (int)(P.n / sm_vec<T1>());
  const unsigned long long pol = sm_l2_policy(P.keep != 0);
  if constexpr (KM > SM_CTA_ROW_K) sm_ramp_wait(P, blockIdx.x);
  int parity = 0; /* backward: sm_block_sum's buffer */
  /* forward: the row from the thread's first slot, so that slot k is R's
   * plus k * T (sm_chunk_at_slot; the backward lost with it) */
  constexpr bool AT = !BWD;
  const int first = AT ? 0 : t;
  for (int64_t row = blockIdx.x; row < P.rows; row += gridDim.x) {
    /* the thread's slot count, per row: held across rows, ptxas spilled it
     * (one local store per thread, which a CTA that lives one row pays in
     * L2 traffic) */
    int nv = 0;
#pragma unroll
    for (int k = 0; k < KM; k++) nv += t + k * T < nslots;
    const sm_chunk<T1, T2> R0 = sm_chunk_setup<BWD, true, T1, T2>(P, row, 0, (int64_t)T * P.K);
    const sm_chunk<T1, T2> R = AT ? sm_chunk_at_slot(R0, t) : R0;
    sm_slot ra[KM], rb[KM];
    sm_load_full_slots<BWD>(R, first, T, nv, ra, rb, pol);
    sm_stat<Acc> st = sm_thread_stats<BWD, T1, T2, Acc>(ra, rb, nv, (uint4 *)0, (const uint4 *)0, 0, 0, 1, log);
    const Acc m_thread = st.m;
    if constexpr (BWD) {
      st = sm_block_sum<sm_compensated<FAST, Acc>()>(st, red, parity);
      parity ^= 1;
    } else {
      sm_stat<Acc> one[1] = {st};
      sm_reduce_max_first<FAST, true>(one, 32, log, red_fwd);
      st = one[0];
    }
    Acc c0, c1;
    sm_output_registers<BWD>(R, ra, rb, nv, first, T, st, m_thread, log, c0, c1);
    if (P.keep == 1 && row >= P.release_lo && row < P.release_hi) {
      if constexpr (AT) sm_release_aligned_row<BWD, KM, T1, T2>(P, row, nv, t, T);
      else sm_release_registers<BWD, KM>(R0, nv, t, T);
    }
  }
}

template <bool BWD, typename T1, typename T2, typename Acc, int KM>
__global__ void __launch_bounds__(SM_CHUNK_THREADS, KM > SM_CTA_ROW_K || (BWD && sizeof(T1) != sizeof(T2)) ? 1 : 2)
    softmax_row_in_cta_kernel(sm_row_args P) {
  static_assert(sizeof(Acc) == 4, "float statistics only (float64 keeps the general kernels)");
  __shared__ sm_stat<Acc> red[2][32];                      /* backward (sm_block_sum) */
  __shared__ Acc red_fwd[3][32];                           /* forward (max first) */
  if (P.log) sm_row_in_cta<BWD, T1, T2, Acc, KM>(P, 1, red, red_fwd);
  else sm_row_in_cta<BWD, T1, T2, Acc, KM>(P, 0, red, red_fwd);
}

// ---- a chunk of a row per CTA: block, cluster and split tiers -----------------

__device__ __forceinline__ unsigned sm_ld_acquire(const unsigned *p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

/* SM_SPREAD's exchange, called by all 32 lanes of warp 0 with the CTA's
 * statistics: publishes them as partial [chunk] of the row's C, waits for the
 * other C - 1, and returns the merge of all C in a fixed order (the same in
 * every CTA of the row, so all agree bit for bit). */
template <bool BWD, typename Acc>
__device__ __forceinline__ sm_stat<Acc> sm_spread_exchange(sm_stat<Acc> st, sm_stat<Acc> *part, unsigned *arrived,
                                                        int64_t chunk, int C) {
  const int lane = threadIdx.x & 31;
  if (lane == 0) {
    __stcg(&part[chunk].m, st.m);
    __stcg(&part[chunk].d, st.d);
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(arrived) : "memory");
  }
  const unsigned long long t0 = sm_globaltimer_ns();
  while (sm_ld_acquire(arrived) < (unsigned)C) {
    __nanosleep(32);
    if (sm_globaltimer_ns() - t0 > 10000000000ull) __trap(); /* the row's CTAs cannot all be resident */
  }
  sm_stat<Acc> acc = sm_stat_identity<BWD, Acc>();
  for (int j = lane; j < C; j += 32) {
    sm_stat<Acc> p;
    p.m = __ldcg(&part[j].m);
    p.d = __ldcg(&part[j].d);
    acc = sm_merge<BWD>(acc, p);
  }
  return sm_group_reduce<BWD>(acc, 32);
}

/* The end of the first cp.async group of nsm shared-memory slots copied by T
 * threads (see sm_chunk_copy_smem): half of the CTA's full passes. */
__device__ __forceinline__ int sm_smem_mid(int nsm, int lgT) { return nsm > 0 ? (nsm >> (lgT + 1)) << lgT : 0; }

/* Starts the cp.async copies of a chunk's shared-memory slots (full slots
 * [nreg, nfull), local index l = slot - nreg) in two groups, l in [0, mid) and
 * [mid, nsm) with mid a multiple of T, so that the statistics of the first
 * group can run while the second is still arriving. Thread t copies slots
 * l = t, t + T, ...: the only ones it reads back, so no barrier is needed. */
template <bool BWD, typename T1, typename T2>
__device__ __forceinline__ void sm_chunk_copy_smem(const sm_chunk<T1, T2> &R, int nreg, uint4 *sa, uint4 *sb,
                                                   unsigned long long pol) {
  const int t = threadIdx.x, T = blockDim.x;
  const int nsm = R.nfull - nreg, mid = sm_smem_mid(nsm, __ffs(T) - 1);
  for (int l = t; l < mid; l += T) sm_load_full_slot_to_smem<BWD>(R, nreg + l, sa + l, sb + l, pol);
  sm_cp_async_commit();
  for (int l = mid + t; l < nsm; l += T) sm_load_full_slot_to_smem<BWD>(R, nreg + l, sa + l, sb + l, pol);
  sm_cp_async_commit();
}

/* 64 registers per thread (float): two CTAs of 512 threads per SM, or one of
 * 1024 for the configurations that need most of an SM's shared memory. */
template <bool BWD, typename T1, typename T2, typename Acc, bool AL>
__global__ void __launch_bounds__(sizeof(Acc) == 8 ? SM_CHUNK_THREADS / 2 : SM_CHUNK_THREADS, 1)
    softmax_row_chunks_kernel(sm_row_args P) {
  constexpr int KREG = sm_chunk_kreg<BWD, Acc>();
  extern __shared__ uint4 sm_dyn[];        /* [BWD ? 2 : 1][smem_slots] raw slots */
  __shared__ sm_stat<Acc> red[SM_CHUNK_THREADS / 32 + 1];
  static_assert(SM_CHUNK_THREADS <= 1024, "sm_block_reduce scratch");
  __shared__ sm_stat<Acc> xch[2][16];      /* cluster exchange, double-buffered */
  __shared__ sm_stat<Acc> cbc;             /* cluster / spread result broadcast */
  __shared__ unsigned ticket;              /* SM_SPREAD: this CTA's (row, chunk) */
  /* T is a power of two (the launch checks): the slot counts below are
   * shifts, not divisions, ahead of the first loads (an integer division
   * there delays every load of the row) */
  const int t = threadIdx.x, T = blockDim.x, lgT = __ffs(T) - 1;
  const bool in_cluster = P.mode == SM_FULL && P.C > 1;
  (void)in_cluster;
  uint4 *sa = sm_dyn, *sb = sm_dyn + P.smem_slots;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  /* every CTA of the cluster must be running before its shared memory is
   * written: arrive now, wait just before the first remote write, so the
   * barrier's latency hides behind the loads */
  bool start_wait = in_cluster;
  if (in_cluster) asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
#endif

  /* STATS lets the merge kernel (and through it APPLY) start early: APPLY's
   * CTAs load their chunk while STATS's last CTAs run, then wait for the
   * merged statistics (oss_pdl_wait below) */
  if (P.mode == SM_STATS) oss_pdl_launch_dependents();
  /* APPLY runs the chunks in the reverse order of STATS, so the chunks read
   * last by STATS (still in L2) are re-read first */
  const bool rev = P.mode == SM_APPLY;
  int64_t chunk_x = rev ? gridDim.x - 1 - blockIdx.x : blockIdx.x, r0 = blockIdx.y, rstep = gridDim.y;
  if (P.mode == SM_FULL) { /* x = rows x C, the cluster rank fastest; C is a power of two */
    const int lgC = __ffs(P.C) - 1;
    chunk_x = blockIdx.x & (P.C - 1);
    r0 = blockIdx.x >> lgC;
    rstep = gridDim.x >> lgC;
    sm_ramp_wait(P, r0);
  }
  if (P.mode == SM_SPREAD) {
    if (t == 0) ticket = atomicAdd(P.counters, 1u);
    __syncthreads();
    r0 = ticket / (unsigned)P.C;
    chunk_x = ticket % (unsigned)P.C;
    rstep = P.rows;
  }
  const int nreg = T * P.K; /* full slots [0, nreg) in registers, [nreg, nfull) in shared memory */
  /* the launch sets keep for one-CTA rows only (sm_run_rows) */
  const bool release = P.keep == 1;
  const unsigned long long pol = sm_l2_policy(P.keep != 0);
  /* the shared-memory part of row r is copied before the loop (first row) or
   * while the previous row's register part is written, so its loads overlap
   * that work (SM_STATS and SM_APPLY chunks have no shared-memory part) */
  const bool smem = P.smem_slots > 0;
  if (smem && r0 < P.rows) sm_chunk_copy_smem<BWD>(sm_chunk_setup<BWD, AL, T1, T2>(P, rev ? P.rows - 1 - r0 : r0, chunk_x * P.S, P.S),
                                           nreg, sa, sb, pol);
  for (int64_t r = r0; r < P.rows; r += rstep) {
    const int64_t row = rev ? P.rows - 1 - r : r;
    const int64_t next = smem && r + rstep < P.rows ? (rev ? P.rows - 1 - (r + rstep) : r + rstep) : -1;
    const sm_chunk<T1, T2> R = sm_chunk_setup<BWD, AL, T1, T2>(P, row, chunk_x * P.S, P.S);
    const int nsm = R.nfull - nreg;
    const int nv = R.nfull > t ? min((R.nfull - t + T - 1) >> lgT, P.K) : 0;

    // -- load: registers (the shared-memory slots are on their way, in two
    // cp.async groups split at mid, see sm_chunk_copy_smem)
    const int mid = sm_smem_mid(nsm, lgT);
    sm_slot ra[KREG], rb[KREG];
    sm_load_full_slots<BWD>(R, t, T, nv, ra, rb, pol);

    // -- statistics in the order the parts land: the two shared-memory groups
    // (copied before the register loads), then the registers, so the work on
    // the first parts (the forward's exps) hides behind the loads still in
    // flight; the thread's (m, d') of the three
    // parts merge with sm_merge, registers first. With the cache, each part's
    // exp values are relative to its own max (m_reg, m_lo, m_hi).
    sm_stat<Acc> st;
    Acc m_reg = (Acc)-INFINITY, m_lo = (Acc)-INFINITY, m_hi = (Acc)-INFINITY;
    const bool cached = !BWD && sm_can_cache<T1, Acc>() && !P.log && P.mode != SM_APPLY;
    if (P.mode != SM_APPLY) {
      sm_stat<Acc> lo = sm_stat_identity<BWD, Acc>(), hi = lo;
      if (nsm > 0) {
        sm_cp_async_wait_pending<1>();
        lo = sm_thread_stats<BWD, T1, T2, Acc>(ra, rb, 0, sa, sb, t, mid, T, P.log);
        sm_cp_async_wait_pending<0>();
        hi = sm_thread_stats<BWD, T1, T2, Acc>(ra, rb, 0, sa, sb, mid + t, nsm, T, P.log);
      }
      st = sm_thread_stats<BWD, T1, T2, Acc>(ra, rb, nv, sa, sb, 0, 0, T, P.log);
      m_reg = st.m;
      if (nsm > 0) {
        m_lo = lo.m;
        m_hi = hi.m;
        st = sm_merge<BWD>(sm_merge<BWD>(st, lo), hi);
      }
      sm_edges_accumulate<BWD>(R, t, T, st, P.log);
      st = sm_block_reduce<BWD>(st, 1, red);
      if (P.mode == SM_STATS) {
        if (t == 0) ((sm_stat<Acc> *)P.partials)[row * P.C + chunk_x] = st;
        continue;
      }
      if (P.mode == SM_SPREAD) {
        if (t < 32) {
          const sm_stat<Acc> all = sm_spread_exchange<BWD>(st, (sm_stat<Acc> *)P.partials + row * P.C,
                                                           P.counters + 1 + row, chunk_x, P.C);
          if (t == 0) cbc = all;
        }
        __syncthreads();
        st = cbc;
      }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      if (in_cluster) {
        cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
        const unsigned rank = cl.block_rank();
        const int buf = (int)(((r - r0) / rstep) & 1); /* alternates row by row */
        if (start_wait) {
          asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
          start_wait = false;
        }
        if (t < P.C) *cl.map_shared_rank(&xch[buf][rank], (unsigned)t) = st;
        cl.sync();
        if (t < 32) {
          sm_stat<Acc> acc = t < P.C ? xch[buf][t] : sm_stat_identity<BWD, Acc>();
          acc = sm_group_reduce<BWD>(acc, 32);
          if (t == 0) cbc = acc;
        }
        __syncthreads();
        st = cbc;
      }
#endif
    } else {
      oss_pdl_wait(); /* the merge kernel's output; this chunk's loads are on their way */
      st = ((const sm_stat<Acc> *)P.finals)[row];
    }

    // -- output
#pragma unroll
    for (int k = 0; k < KREG; k++) {
      sm_slot_fence(ra[k]);
      if (BWD) sm_slot_fence(rb[k]);
    }
    Acc c0, c1;
    sm_finish<BWD, sizeof(T2) == 2>(st, P.log, c0, c1);
    const auto output_registers = [&]() {
      sm_output_register_slots<BWD>(R, ra, rb, nv, t, T, cached, m_reg, st, P.log, c0, c1);
      sm_edges_output<BWD>(R, t, T, P.log, c0, c1);
    };
    const auto output_smem = [&]() {
      if (nsm <= 0) return;
      sm_cp_async_wait();
      if (cached) {
        const Acc scale_lo = sm_cache_scale(m_lo, st), scale_hi = sm_cache_scale(m_hi, st);
        for (int l = t; l < nsm; l += T) {
          sm_slot xa;
          xa.u = sa[l];
          sm_slot_output_cached(R, nreg + l, xa, l < mid ? scale_lo : scale_hi);
        }
      } else {
        for (int l = t; l < nsm; l += T) {
          sm_slot xa, xb;
          xa.u = sa[l];
          if (BWD) xb.u = sb[l];
          sm_slot_output<BWD>(R, nreg + l, xa, xb, P.log, c0, c1);
        }
      }
    };
    // where the next row is to be copied, the shared-memory part goes first,
    // so its buffer takes those copies while the register part is written
    if (next >= 0) {
      output_smem();
      sm_chunk_copy_smem<BWD>(sm_chunk_setup<BWD, AL, T1, T2>(P, next, chunk_x * P.S, P.S), nreg, sa, sb, pol);
      output_registers();
    } else {
      output_registers();
      output_smem();
    }
    if (release && row >= P.release_lo && row < P.release_hi) {
      sm_release_registers<BWD, KREG>(R, nv, t, T);
      for (int l = t; l < nsm; l += T) sm_release_slot<BWD>(R, nreg + l);
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (start_wait) asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
#endif
}

#endif /* OSS_SOFTMAX_ROWS_CUH */
