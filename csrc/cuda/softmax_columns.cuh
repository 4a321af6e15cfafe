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
 *   alignment; columns outside [0, inner) are never touched). Then thread
 *   t = ti * TJ + tj folds rows ti, ti + TI, ... of column tj into online
 *   (m, d') statistics, sm_block_reduce merges them over ti, and the output is
 *   written from the tile in 16-byte pieces (so x is read once, y written once).
 *     SM_FULL: the tile holds all n rows.
 *     SM_STATS / SM_APPLY: two-pass fallback for n too large for shared
 *       memory: chunks of rows go to separate CTAs (grid y), partials to the
 *       workspace, merged by softmax_merge_partials_kernel, then each chunk is
 *       re-read and normalised.
 *   Grid: x = column tiles, y = (outer, chunk) pairs (grid-stride loop).
 *   The tile's column grid is shifted by the base pointer's misalignment (ph)
 *   so that 16-byte pieces are aligned when the strides allow it.
 *
 * softmax_merge_partials_kernel: for each item (a row, or an (outer, column)
 *   pair) merges its nchunks partial statistics, laid out [outer][chunk][inner],
 *   with G lanes per item (G = 32 for rows, 1 for columns, whose items are
 *   adjacent in memory).
 *
 * Limits: blockDim.x = SM_COL_THREADS; TJ a power of two, a multiple of the
 * slot width and at most SM_COL_THREADS; 64-bit offsets.
 */
#ifndef OSS_SOFTMAX_COLUMNS_CUH
#define OSS_SOFTMAX_COLUMNS_CUH

#include "softmax_common.cuh"

// ---- arguments ----------------------------------------------------------------

typedef struct sm_col_args {
  const void *a, *b; /* as in sm_row_args */
  void *out;
  int64_t so_a, sn_a, so_b, sn_b, so_out, sn_out;
  int64_t outer, n, inner;
  int log, mode;
  int TJ;                    /* columns per tile */
  int ph;                    /* the tile grid starts at column -ph */
  int vec_a, vec_b, vec_out; /* 16-byte (8 for a narrow output) accesses are aligned */
  int64_t chunk_n, nchunks;  /* rows per CTA and chunks per column */
  void *partials;            /* [outer][nchunks][inner] */
  void *finals;              /* [outer][inner] */
} sm_col_args;

enum { SM_COL_THREADS = 256 };

template <typename T> __device__ __forceinline__ unsigned long long sm_smem_bits(const T *p) {
  if constexpr (sizeof(T) == 2) return *(const unsigned short *)p;
  else if constexpr (sizeof(T) == 4) return *(const unsigned int *)p;
  else return *(const unsigned long long *)p;
}

// ---- columns -------------------------------------------------------------------

template <bool BWD, typename T1, typename T2, typename Acc>
__global__ void __launch_bounds__(SM_COL_THREADS) softmax_columns_kernel(sm_col_args P) {
  constexpr int VEC = sm_vec<T1>();
  constexpr bool FAST = sizeof(T2) == 2;
  extern __shared__ uint4 sm_dyn[]; /* tile of a, then tile of b: [chunk_n][TJ / VEC] slots each */
  __shared__ sm_stat<Acc> red[SM_COL_THREADS + SM_COL_THREADS];
  __shared__ Acc colc[2][SM_COL_THREADS];
  const int t = threadIdx.x, T = blockDim.x, TJ = P.TJ, SPR = TJ / VEC;
  const int tj = t & (TJ - 1), ti = t / TJ, TI = T / TJ;
  /* APPLY visits tiles in the reverse order of STATS (L2 reuse, as for rows) */
  const bool rev = P.mode == SM_APPLY;
  const int64_t tile = rev ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int64_t jt0 = tile * TJ - P.ph; /* column of the tile's element 0 */
  const int lo = jt0 < 0 ? (int)-jt0 : 0;
  const int hi = (int)(P.inner - jt0 < TJ ? P.inner - jt0 : TJ);
  const bool jok = tj >= lo && tj < hi;
  const int64_t pairs = P.outer * P.nchunks;
  uint4 *ta = sm_dyn, *tb = sm_dyn + P.chunk_n * SPR;
  const unsigned long long fill = BWD ? 0ull : sm_neg_inf_bits<T1>();

  for (int64_t pq = blockIdx.y; pq < pairs; pq += gridDim.y) {
    const int64_t pr = rev ? pairs - 1 - pq : pq;
    const int64_t o = pr / P.nchunks, c = pr - o * P.nchunks;
    const int64_t i0 = c * P.chunk_n;
    const int rows = (int)(P.n - i0 < P.chunk_n ? P.n - i0 : P.chunk_n);
    const T1 *A = (const T1 *)P.a + o * P.so_a + i0 * P.sn_a + jt0;
    const T1 *B = BWD ? (const T1 *)P.b + o * P.so_b + i0 * P.sn_b + jt0 : A;

    // -- load the tile (rows x TJ) into shared memory
    for (int p = t; p < rows * SPR; p += T) {
      const int i = p / SPR, q = p - i * SPR;
      sm_load_slot_to_smem(ta + p, A + i * P.sn_a, q * VEC, lo, hi, P.vec_a, fill);
      if (BWD) sm_load_slot_to_smem(tb + p, B + i * P.sn_b, q * VEC, lo, hi, P.vec_b, 0ull);
    }
    sm_cp_async_wait();
    __syncthreads();

    // -- statistics of column tj over rows ti, ti + TI, ... (8 rows per online update)
    sm_stat<Acc> st;
    if (P.mode != SM_APPLY) {
      st = sm_stat_identity<BWD, Acc>();
      sm_plain_d<BWD>(st, P.log);
      const T1 *ca = (const T1 *)ta + tj, *cb = (const T1 *)tb + tj;
      for (int i = ti; i < rows; i += 8 * TI) {
        Acc va[8], vb[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
          const int r = i + u * TI < rows ? i + u * TI : i;
          va[u] = sm_bits_to_acc<T1, Acc>(sm_smem_bits(ca + r * TJ));
          vb[u] = BWD ? sm_bits_to_acc<T1, Acc>(sm_smem_bits(cb + r * TJ)) : va[u];
        }
        const int cnt = (rows - i + TI - 1) / TI;
        sm_accumulate<BWD, FAST>(st, va, vb, cnt < 8 ? cnt : 8, P.log);
      }
      sm_prime_d<BWD>(st, P.log);
      st = sm_block_reduce<BWD>(st, TJ, red);
      if (P.mode == SM_STATS) {
        if (ti == 0 && jok) ((sm_stat<Acc> *)P.partials)[(o * P.nchunks + c) * P.inner + jt0 + tj] = st;
        __syncthreads(); /* the tile is reloaded next */
        continue;
      }
    } else {
      st = jok ? ((const sm_stat<Acc> *)P.finals)[o * P.inner + jt0 + tj] : sm_stat_identity<BWD, Acc>();
    }
    if (ti == 0) sm_finish<BWD, FAST>(st, P.log, colc[0][tj], colc[1][tj]);
    __syncthreads();

    // -- output, 16-byte pieces of the tile; a thread's pieces all lie in the
    //    same slot column q (T is a multiple of TJ / VEC), so its per-column
    //    constants are read once
    T2 *O = (T2 *)P.out + o * P.so_out + i0 * P.sn_out + jt0;
    const int q = t % SPR;
    Acc k0[VEC], k1[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++) k0[e] = colc[0][q * VEC + e], k1[e] = colc[1][q * VEC + e];
    for (int p = t; p < rows * SPR; p += T) {
      const int i = p / SPR;
      sm_slot xa, xb;
      xa.u = ta[p];
      if (BWD) xb.u = tb[p];
      Acc v[VEC];
#pragma unroll
      for (int e = 0; e < VEC; e++) {
        const Acc a = sm_slot_elem<T1, Acc>(xa, e);
        const Acc b = BWD ? sm_slot_elem<T1, Acc>(xb, e) : a;
        v[e] = sm_output<BWD, FAST>(a, b, P.log, k0[e], k1[e]);
      }
      sm_store_slot<T2, VEC>(O + i * P.sn_out, q * VEC, lo, hi, P.vec_out, v);
    }
    __syncthreads(); /* the tile and colc are reused next */
  }
}

// ---- merge of partial statistics ----------------------------------------------

template <bool BWD, typename Acc>
__global__ void __launch_bounds__(256)
    softmax_merge_partials_kernel(const sm_stat<Acc> *part, sm_stat<Acc> *fin, int64_t items, int64_t inner,
                                  int64_t nchunks, int G) {
  const int g = threadIdx.x & (G - 1);
  const int64_t per_block = blockDim.x / G;
  for (int64_t base = (int64_t)blockIdx.x * per_block; base < items; base += (int64_t)gridDim.x * per_block) {
    const int64_t item = base + threadIdx.x / G;
    sm_stat<Acc> acc = sm_stat_identity<BWD, Acc>();
    if (item < items) {
      const int64_t o = item / inner, j = item - o * inner;
      for (int64_t c = g; c < nchunks; c += G) acc = sm_merge<BWD>(acc, part[(o * nchunks + c) * inner + j]);
    }
    acc = sm_group_reduce<BWD>(acc, G);
    if (item < items && g == 0) fin[item] = acc;
  }
}

#endif /* OSS_SOFTMAX_COLUMNS_CUH */
