/*
 * softmax_columns.cuh - softmax / log_softmax forward and backward reduced
 * over a non-last dimension (inner > 1 in oss.h's [outer, n, inner] view),
 * and the merge of partial statistics used by every split tier.
 *
 * softmax_columns_kernel: a CTA owns a tile of TJ adjacent columns (inner
 *   indices j) of one outer index, over a range of the n axis (all of it in
 *   SM_FULL, a chunk in the split modes). The strided data is read in place,
 *   with no transpose: each row segment of the tile (TJ elements, 64 bytes or
 *   more) is copied into shared memory by 16-byte cp.async pieces, coalesced
 *   along inner (element-wise where the strides or the base break 16-byte
 *   alignment; columns outside [0, inner) are never touched); thread t
 *   copies slots t, t + T, ..., all in one slot column, so its addresses
 *   step by a constant. Then thread t = ti * TJ + tj takes the statistics of
 *   tile elements t, t + T, ... (rows ti, ti + TI, ... of column tj) max
 *   first, as (m, d') (float32/float64 softmax keeps the exp values in the
 *   tile, so the output needs no second exp), sm_block_reduce merges them
 *   over ti, and the output is written from the tile in 16-byte pieces by the
 *   same slot mapping as the loads (so x is read once, y written once).
 *     SM_FULL, C = 1: the CTA's tile holds all n rows.
 *     SM_FULL, C > 1 (sm_90): a cluster of C CTAs (adjacent in grid x) shares
 *       the column tile, rank r holding rows [r * chunk_n, (r + 1) * chunk_n);
 *       each CTA sends its per-column (m, d') to every peer's shared memory
 *       (DSMEM), one cluster barrier, then each merges the C partials in rank
 *       order (so all agree bit for bit). The buffer after the tiles is
 *       double-buffered, so one barrier per tile suffices. Columns up to C
 *       times one CTA's tile are still read once.
 *     SM_STATS / SM_APPLY: two-pass fallback for n too large for shared
 *       memory: chunks of rows go to separate CTAs (grid y), partials to the
 *       workspace, merged by softmax_merge_partials_kernel, then each chunk is
 *       re-read and normalised.
 *   Grid: x = column tiles (times C: cluster rank fastest), y = (outer,
 *   chunk) pairs, or outer indices in a cluster (grid-stride loop).
 *   The tile's column grid is shifted by the base pointer's misalignment (ph)
 *   so that 16-byte pieces are aligned when the strides allow it.
 *   Where the launch sets keep (the planner's 128-byte-segment clusters), the
 *   tile's 16-byte loads carry an L2 evict_last policy and, in the last outer
 *   indices (those the L2 can still hold), each input line goes back to
 *   evict_normal once the tile's output is written (sm_l2_policy in
 *   softmax_common.cuh).
 *
 * softmax_merge_partials_kernel: for each item (a row, or an (outer, column)
 *   pair) merges its nchunks partial statistics, laid out [outer][chunk][inner],
 *   with G lanes per item: 1 for columns, whose items are adjacent in memory;
 *   for rows 32 (a warp), or the whole CTA (G = SM_MERGE_THREADS) where a row
 *   has many chunks, so that no lane walks a long chain of dependent loads
 *   (with a warp per row, the merge of a row of thousands of chunks took
 *   longer than reading the row).
 *
 * Limits: blockDim.x = T (SM_COL_THREADS, or SM_COL_THREADS_WIDE for float
 * statistics); TJ a power of two, a multiple of the slot width and at most
 * SM_COL_THREADS; C <= 16 (sm_90 only); 64-bit offsets.
 */
#ifndef OSS_SOFTMAX_COLUMNS_CUH
#define OSS_SOFTMAX_COLUMNS_CUH

#include <cooperative_groups.h>

#include "cuda/softmax/softmax_common.cuh"

// ---- arguments ----------------------------------------------------------------

enum { SM_MERGE_THREADS = 256 };

typedef struct sm_col_args {
  const void *a, *b; /* as in sm_row_args */
  void *out;
  int64_t so_a, sn_a, so_b, sn_b, so_out, sn_out;
  int64_t outer, n, inner;
  int log, mode;
  int keep;                  /* input loads evict_last, released after the output (sm_l2_policy) */
  int64_t release_lo, release_hi; /* keep: the outer indices [lo, hi) whose lines are released */
  int TJ;                    /* columns per tile */
  int ph;                    /* the tile grid starts at column -ph */
  int vec_a, vec_b, vec_out; /* 16-byte (8 for a narrow output) accesses are aligned */
  int64_t chunk_n, nchunks;  /* rows per CTA and chunks per column (split modes; 1 in SM_FULL) */
  int C;                     /* CTAs per column tile: cluster size (SM_FULL), else 1 */
  void *partials;            /* [outer][nchunks][inner] */
  void *finals;              /* [outer][inner] */
} sm_col_args;

/* CTA sizes: 256 threads, or 512 for float statistics when the tile is so
 * large that one CTA fills the SM (the statistics then run on twice the
 * warps, with nothing else on the SM to hide them) */
enum { SM_COL_THREADS = 256, SM_COL_THREADS_WIDE = 512 };

template <typename T> __device__ __forceinline__ unsigned long long sm_smem_bits(const T *p) {
  if constexpr (sizeof(T) == 2) return *(const unsigned short *)p;
  else if constexpr (sizeof(T) == 4) return *(const unsigned int *)p;
  else return *(const unsigned long long *)p;
}

// ---- columns -------------------------------------------------------------------

/* The statistics of tile elements e = t, t + T, ... < ne (T the CTA size):
 * the tile is [rows][TJ] and T (the CTA size) is a multiple of TJ, so these are one column
 * (t mod TJ), every TI-th row. Forward: max first, then the sum of exp(x - ms)
 * (the data is on chip: no running rescale), as (m, d'); with cache
 * (softmax, 4-/8-byte input, SM_FULL) the exp values replace x in the tile so
 * the output needs no second exp, and m_thread returns the max they are
 * relative to. Backward: the sum of y*dy (log_softmax: of dy), compensated
 * where the output is float32. */
template <bool BWD, bool FAST, typename T1, typename Acc, int T>
__device__ __forceinline__ sm_stat<Acc> sm_column_stats(T1 *xa, const T1 *xb, int ne, int log, bool cache,
                                                        Acc &m_thread) {
  const int t = threadIdx.x;
  sm_stat<Acc> st = sm_stat_identity<BWD, Acc>();
  if constexpr (BWD) {
    if constexpr (sm_compensated<FAST, Acc>()) {
#pragma unroll 8
      for (int e = t; e < ne; e += T) {
        const Acc a = sm_bits_to_acc<T1, Acc>(sm_smem_bits(xa + e)), b = sm_bits_to_acc<T1, Acc>(sm_smem_bits(xb + e));
        sm_add_compensated(st.d, st.m, log ? b : a * b);
      }
    } else {
      Acc s = 0;
#pragma unroll 8
      for (int e = t; e < ne; e += T) {
        const Acc a = sm_bits_to_acc<T1, Acc>(sm_smem_bits(xa + e)), b = sm_bits_to_acc<T1, Acc>(sm_smem_bits(xb + e));
        s += log ? b : a * b;
      }
      st.d = s;
    }
  } else {
    Acc m = (Acc)-INFINITY;
#pragma unroll 8
    for (int e = t; e < ne; e += T) m = sm_max(m, sm_bits_to_acc<T1, Acc>(sm_smem_bits(xa + e)));
    const Acc ms = sm_safe_max(m);
    Acc s = 0, top = 0;
    if (log) {
#pragma unroll 8
      for (int e = t; e < ne; e += T) {
        const Acc x = sm_bits_to_acc<T1, Acc>(sm_smem_bits(xa + e));
        sm_sum_split<true>(x, m, sm_exp_shift<FAST>(x, ms), s, top);
      }
    } else if (sm_can_cache<T1, Acc>() && cache) {
      Acc *ca = (Acc *)xa; /* T1 is Acc here */
#pragma unroll 8
      for (int e = t; e < ne; e += T) {
        const Acc ex = sm_exp_shift<FAST>(ca[e], ms);
        s += ex;
        ca[e] = ex;
      }
    } else {
#pragma unroll 8
      for (int e = t; e < ne; e += T) s += sm_exp_shift<FAST>(sm_bits_to_acc<T1, Acc>(sm_smem_bits(xa + e)), ms);
    }
    st.d = sm_fold_d(st, m, ms, s, top);
    st.m = m;
    m_thread = m;
  }
  return st;
}

/* The CTAs per SM the columns kernel is compiled for (its register budget):
 * ptxas holds a 512-thread CTA to 64 registers unless told it is alone on
 * its SM, which a 512-thread CTA is (sm_col_threads gives that size only to
 * tiles that leave no room for a second one). Only the backward from a
 * 16-bit y to a wider dx spills at 64 (4 bytes a thread) and gets the
 * budget of one CTA (86-88 registers); the other instantiations keep the
 * code they were measured with. */
template <bool BWD, typename T1, typename T2, int T> constexpr int sm_col_min_ctas() {
  return T == SM_COL_THREADS_WIDE && BWD && sizeof(T1) < sizeof(T2) ? 1 : 0;
}

template <bool BWD, typename T1, typename T2, typename Acc, int T>
__global__ void __launch_bounds__(T, sm_col_min_ctas<BWD, T1, T2, T>()) softmax_columns_kernel(sm_col_args P) {
  constexpr int VEC = sm_vec<T1>();
  constexpr bool FAST = sizeof(T2) == 2;
  /* tile of a, then tile of b: [chunk_n][TJ / VEC] slots each; with C > 1
   * then the cluster exchange, [2][C][TJ] statistics */
  extern __shared__ uint4 sm_dyn[];
  __shared__ sm_stat<Acc> red[T + T];
  __shared__ Acc colc[2][T];
  const int t = threadIdx.x, TJ = P.TJ, SPR = TJ / VEC;
  const int tj = t & (TJ - 1);
  /* loads and output: thread t moves slots t, t + T, ... of the tile, all in
   * slot column q (T is a multiple of SPR), rows t / SPR + k * di */
  const int q = t & (SPR - 1), kq = q * VEC, di = T / SPR;
  /* APPLY visits tiles in the reverse order of STATS (L2 reuse, as for rows) */
  const bool rev = P.mode == SM_APPLY;
  const int C = P.C, rank = (int)(blockIdx.x % (unsigned)C);
  const int64_t tile = rev ? gridDim.x - 1 - blockIdx.x : blockIdx.x / (unsigned)C;
  const int64_t jt0 = tile * TJ - P.ph; /* column of the tile's element 0 */
  const int lo = jt0 < 0 ? (int)-jt0 : 0;
  const int hi = (int)(P.inner - jt0 < TJ ? P.inner - jt0 : TJ);
  const bool jok = tj >= lo && tj < hi;
  const int64_t pairs = P.outer * P.nchunks;
  uint4 *ta = sm_dyn, *tb = sm_dyn + P.chunk_n * SPR;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  sm_stat<Acc> *xch = (sm_stat<Acc> *)(sm_dyn + P.chunk_n * SPR * (BWD ? 2 : 1));
  /* every CTA of the cluster must be running before its shared memory is
   * written: arrive now, wait before the first exchange */
  bool start_wait = C > 1;
  if (C > 1) asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
#endif
  const unsigned long long fill = BWD ? 0ull : sm_neg_inf_bits<T1>();
  const bool cache = !BWD && sm_can_cache<T1, Acc>() && !P.log && P.mode == SM_FULL;
  const int64_t step_a = di * P.sn_a, step_b = di * P.sn_b, step_out = di * P.sn_out;
  const unsigned long long pol = sm_l2_policy(P.keep);

  for (int64_t pq = blockIdx.y; pq < pairs; pq += gridDim.y) {
    const int64_t pr = rev ? pairs - 1 - pq : pq;
    const int64_t o = pr / P.nchunks, c = C > 1 ? rank : pr - o * P.nchunks;
    const int64_t i0 = c * P.chunk_n + t / SPR; /* this thread's first row */
    const int64_t left = P.n - c * P.chunk_n;   /* a cluster's last ranks may hold none */
    const int rows = (int)(left < P.chunk_n ? (left > 0 ? left : 0) : P.chunk_n);
    const int nslots = rows * SPR;

    // -- load the tile (rows x TJ) into shared memory
    {
      const T1 *pa = (const T1 *)P.a + o * P.so_a + i0 * P.sn_a + jt0;
      const T1 *pb = BWD ? (const T1 *)P.b + o * P.so_b + i0 * P.sn_b + jt0 : pa;
      for (int l = t; l < nslots; l += T, pa += step_a, pb += step_b) {
        sm_load_slot_to_smem(ta + l, pa, kq, lo, hi, P.vec_a, fill, pol);
        if (BWD) sm_load_slot_to_smem(tb + l, pb, kq, lo, hi, P.vec_b, 0ull, pol);
      }
    }
    sm_cp_async_wait();
    __syncthreads();

    // -- statistics of column tj, merged over the TI threads of the column
    sm_stat<Acc> st;
    Acc m_thread = 0;
    if (P.mode != SM_APPLY) {
      st = sm_column_stats<BWD, FAST, T1, Acc, T>((T1 *)ta, (const T1 *)tb, rows * TJ, P.log, cache, m_thread);
      st = sm_block_reduce<BWD>(st, TJ, red);
      if (P.mode == SM_STATS) {
        if (t < TJ && jok) ((sm_stat<Acc> *)P.partials)[(o * P.nchunks + c) * P.inner + jt0 + tj] = st;
        __syncthreads(); /* the tile is reloaded next */
        continue;
      }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      if (C > 1) {
        /* every thread holds its column's statistics: threads e = t, t + T,
         * ... < C * TJ send them to rank e / TJ (T is a multiple of TJ) */
        cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
        sm_stat<Acc> *xb = xch + (((pq - blockIdx.y) / gridDim.y) & 1) * C * TJ; /* alternates tile by tile */
        if (start_wait) {
          asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
          start_wait = false;
        }
        for (int e = t; e < C * TJ; e += T) *cl.map_shared_rank(xb + rank * TJ + tj, (unsigned)(e / TJ)) = st;
        cl.sync(); /* also: every thread is past sm_block_reduce's reads of red */
        if (t < TJ) {
          sm_stat<Acc> acc = xb[t];
          for (int k = 1; k < C; k++) acc = sm_merge<BWD>(acc, xb[k * TJ + t]);
          red[t] = acc;
        }
        __syncthreads();
        st = red[tj];
      }
#endif
    } else {
      st = jok ? ((const sm_stat<Acc> *)P.finals)[o * P.inner + jt0 + tj] : sm_stat_identity<BWD, Acc>();
    }
    /* per column constants (sm_finish), or with cache the factor of each
     * statistics thread's exp values (sm_cache_scale) */
    if (cache) colc[0][t] = sm_cache_scale(m_thread, st);
    else if (t < TJ) sm_finish<BWD, FAST>(st, P.log, colc[0][tj], colc[1][tj]);
    __syncthreads();

    // -- output, 16-byte pieces of the tile. Element v of slot l is tile element
    //    l * VEC + v, whose column is kq + v and whose statistics thread is
    //    (t * VEC + v) mod T: constants read once
    Acc k0[VEC], k1[VEC];
#pragma unroll
    for (int v = 0; v < VEC; v++) {
      k0[v] = cache ? colc[0][(t * VEC + v) & (T - 1)] : colc[0][kq + v];
      k1[v] = cache ? (Acc)0 : colc[1][kq + v];
    }
    T2 *po = (T2 *)P.out + o * P.so_out + i0 * P.sn_out + jt0;
    for (int l = t; l < nslots; l += T, po += step_out) {
      sm_slot xa, xb;
      xa.u = ta[l];
      if (BWD) xb.u = tb[l];
      Acc y[VEC];
#pragma unroll
      for (int v = 0; v < VEC; v++) {
        const Acc a = sm_slot_elem<T1, Acc>(xa, v);
        const Acc b = BWD ? sm_slot_elem<T1, Acc>(xb, v) : a;
        y[v] = cache ? a * k0[v] : sm_output<BWD, FAST>(a, b, P.log, k0[v], k1[v]);
      }
      sm_store_slot<T2, VEC>(po, kq, lo, hi, P.vec_out, y);
    }
    if (P.keep && o >= P.release_lo && o < P.release_hi) {
      /* each input line back to evict_normal: from the first 16-byte slot
       * on it of each row segment (a line may also hold a neighbour tile's
       * columns; that tile releases it too) */
      const bool whole = kq >= lo && kq + VEC <= hi, first = kq - VEC < lo;
      const T1 *pa = (const T1 *)P.a + o * P.so_a + i0 * P.sn_a + jt0 + kq;
      const T1 *pb = BWD ? (const T1 *)P.b + o * P.so_b + i0 * P.sn_b + jt0 + kq : pa;
      for (int l = t; whole && l < nslots; l += T, pa += step_a, pb += step_b) {
        if (P.vec_a && (first || ((uintptr_t)pa & 127) == 0)) sm_release_line(pa);
        if (BWD && P.vec_b && (first || ((uintptr_t)pb & 127) == 0)) sm_release_line(pb);
      }
    }
    __syncthreads(); /* the tile and colc are reused next */
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (start_wait) asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
#endif
}

// ---- merge of partial statistics ----------------------------------------------

template <bool BWD, typename Acc>
__global__ void __launch_bounds__(SM_MERGE_THREADS)
    softmax_merge_partials_kernel(const sm_stat<Acc> *part, sm_stat<Acc> *fin, int64_t items, int64_t inner,
                                  int64_t nchunks, int G) {
  __shared__ sm_stat<Acc> red[SM_MERGE_THREADS / 32 + 1];
  oss_pdl_launch_dependents(); /* APPLY may start loading its chunks */
  oss_pdl_wait();              /* the partials of STATS */
  const int g = threadIdx.x & (G - 1);
  const int64_t per_block = blockDim.x / G;
  /* per_block is 1 when G == blockDim.x, so every thread runs the same
   * iterations and the block reduction's barriers are uniform */
  for (int64_t base = (int64_t)blockIdx.x * per_block; base < items; base += (int64_t)gridDim.x * per_block) {
    const int64_t item = base + threadIdx.x / G;
    sm_stat<Acc> acc = sm_stat_identity<BWD, Acc>();
    if (item < items) {
      const int64_t o = item / inner, j = item - o * inner;
      /* unrolled so that several independent loads are in flight */
#pragma unroll 4
      for (int64_t c = g; c < nchunks; c += G) acc = sm_merge<BWD>(acc, part[(o * nchunks + c) * inner + j]);
    }
    acc = G <= 32 ? sm_group_reduce<BWD>(acc, G) : sm_block_reduce<BWD>(acc, 1, red);
    if (item < items && g == 0) fin[item] = acc;
  }
}

#endif /* OSS_SOFTMAX_COLUMNS_CUH */
