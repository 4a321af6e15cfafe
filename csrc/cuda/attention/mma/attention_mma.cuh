/*
 * attention_mma.cuh - tensor-core building blocks of the float16/bfloat16
 * attention kernels (sm_80 and newer): cp.async tile loads, ldmatrix, the
 * m16n8k16 mma.sync, three warp-level GEMMs that differ only in where
 * their operands come from, and the per-fragment steps the kernels share
 * (masking, the score variants, dropout).
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16, g = lane / 4, t = lane % 4):
 *   A 16x16, 4 regs of 2 elements: a0 (row g,   k 2t..2t+1)   a1 (row g+8, k 2t..)
 *                                  a2 (row g,   k 2t+8..)     a3 (row g+8, k 2t+8..)
 *   B 16x8,  2 regs:               b0 (k 2t..2t+1, col g)     b1 (k 2t+8.., col g)
 *   C 16x8,  4 floats:             c0,c1 (row g, cols 2t, 2t+1)  c2,c3 (row g+8, same cols)
 * A C fragment pair (n-tiles 2kk, 2kk+1) is exactly an A fragment for k-step kk
 * once packed to 16-bit pairs, which is how P and dS go from the score
 * accumulators into the next product without touching shared memory.
 *
 * Shared-memory tiles are row-major with a pitch of LDS elements, LDS chosen so
 * a row is an odd number of 16-byte chunks: the 8 row addresses of each
 * ldmatrix 8x8 matrix then fall in 8 different 16-byte bank groups (no bank
 * conflicts) without a swizzle. Column count KD is the head dim rounded up to
 * 16 (the mma k-step); the padding columns are zero-filled by the loads.
 */
#ifndef OSS_ATTENTION_MMA_CUH
#define OSS_ATTENTION_MMA_CUH

#include <limits.h>
#include <type_traits>

#include "cuda/attention/attention_common.cuh"

/* oss_attn_kd / oss_attn_pitch (attention_common.cuh): head dim rounded up to
 * the mma k-step, and the smem pitch for KD columns. */

// ---------------------------------------------------------------------------
// PTX wrappers
// ---------------------------------------------------------------------------

__device__ __forceinline__ void oss_ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void oss_ldsm_x4_t(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <typename T> struct oss_mma_op;
template <> struct oss_mma_op<__half> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t x) {
    return __half22float2(*reinterpret_cast<const __half2 *>(&x));
  }
};
template <> struct oss_mma_op<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t x) {
    return make_float2(__uint_as_float(x << 16), __uint_as_float(x & 0xffff0000u));
  }
};

/* 2^x in one MUFU op; ex2(-inf) = 0. */
__device__ __forceinline__ float oss_ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/* x, hidden from the optimiser: address arithmetic built on it is recomputed
 * where it is used instead of being hoisted out of the key loop and held in
 * registers (which the accumulators need). */
__device__ __forceinline__ int64_t oss_opaque(int64_t x) {
  int64_t y;
  asm volatile("mov.b64 %0, %1;\n" : "=l"(y) : "l"(x));
  return y;
}

/* The 16-bit pattern of a T element loaded from global memory. */
__device__ __forceinline__ unsigned short oss_ld_bits16(const void *p) {
  return __ldg(reinterpret_cast<const unsigned short *>(p));
}

// ---------------------------------------------------------------------------
// Tile load: ROWS x KD elements of T into smem (pitch LDS), zero beyond
// rows_valid / cols_valid. Thread tid owns the 16-byte column chunk tid % TPR
// (TPR = chunks per row rounded up to a power of two; threads past the last
// chunk idle) of rows tid / TPR, tid / TPR + RSTEP, ... and walks them with one
// pointer, so the copy costs a few registers whatever the tile size.
// vec: one 16-byte cp.async per chunk (needs 16-byte aligned rows); otherwise
// element loads and 16-byte shared stores (visible after the next
// __syncthreads, like the cp.async path after its wait).
// g points at row 0 of the tile, which must exist (rows_valid >= 1).
// SW128 (the wgmma operand layout, attention_fwd_sm90.cuh): the tile is stored
// as KD/64 column blocks of [ROWS][64] elements, 128-byte rows, and chunk c of
// row r sits at chunk position c ^ (r % 8) of its row (the hardware's 128-byte
// swizzle; blocks must start on 1024-byte boundaries). LDS is then 64.
// ---------------------------------------------------------------------------
__host__ __device__ constexpr int oss_pow2_ceil(int x) { return x <= 1 ? 1 : 2 * oss_pow2_ceil((x + 1) / 2); }

template <typename T, int ROWS, int KD, int LDS, int NTHREADS, bool SW128 = false>
__device__ __forceinline__ void oss_load_tile(T *s, const T *g, int64_t row_stride, int rows_valid,
                                              int cols_valid, bool vec, int tid) {
  constexpr int CPR = KD / 8; /* 16-byte chunks per row */
  constexpr int TPR = oss_pow2_ceil(CPR);
  static_assert(TPR <= NTHREADS, "a row of chunks fits the block");
  constexpr int RSTEP = NTHREADS / TPR;
  constexpr int ITERS = (ROWS + RSTEP - 1) / RSTEP;
  static_assert(sizeof(T) == 2, "tensor-core tiles hold 16-bit elements");
  static_assert(!SW128 || (LDS == 64 && KD % 64 == 0), "swizzled tiles: 64-column blocks");
  const int ch = tid % TPR, r0 = tid / TPR;
  if (ch >= CPR) return;
  const int col = ch * 8;
  const int64_t step = oss_opaque(row_stride * RSTEP);
  const T *src = g + r0 * row_stride + col;
  /* element offset of (row r0 + it * RSTEP, this thread's chunk) is dst + off(it) */
  T *dst = SW128 ? s + (ch >> 3) * ROWS * 64 + r0 * 64 : s + r0 * LDS + col;
#define OSS_TILE_OFF(it) (SW128 ? (it) * RSTEP * 64 + (((ch & 7) ^ ((r0 + (it) * RSTEP) & 7)) << 3) : (it) * RSTEP * LDS)
  if (vec) {
    int nb = cols_valid - col;
    nb = (nb < 0 ? 0 : (nb > 8 ? 8 : nb)) * 2;
    const uint32_t d0 = oss_smem_u32(dst);
#pragma unroll
    for (int it = 0; it < ITERS; it++) {
      const int r = r0 + it * RSTEP;
      if (ROWS % RSTEP == 0 || r < ROWS) {
        const int bytes = r < rows_valid ? nb : 0;
        oss_cp_async16(d0 + OSS_TILE_OFF(it) * 2, bytes ? src : g, bytes);
      }
      src += step;
    }
  } else {
#pragma unroll 1
    for (int it = 0; it < ITERS; it++) {
      const int r = r0 + it * RSTEP;
      if (ROWS % RSTEP == 0 || r < ROWS) {
        uint32_t w[4] = {0u, 0u, 0u, 0u};
        if (r < rows_valid) {
#pragma unroll
          for (int e = 0; e < 8; e++)
            if (col + e < cols_valid) w[e >> 1] |= (uint32_t)oss_ld_bits16(src + e) << (16 * (e & 1));
        }
        *reinterpret_cast<uint4 *>(dst + OSS_TILE_OFF(it)) = make_uint4(w[0], w[1], w[2], w[3]);
      }
      src += step;
    }
  }
#undef OSS_TILE_OFF
}

// ---------------------------------------------------------------------------
// Warp GEMMs. acc[MT][NT][4] holds MT x NT C fragments (MT*16 rows, NT*8 cols).
// Shared addresses are byte addresses of element [0][0] of the operand.
// ---------------------------------------------------------------------------

/* Swizzled tiles (SW): a row of LD elements (a multiple of 64: whole 128-byte
 * groups) keeps its 16-byte chunk c at chunk c ^ (row % 8), the row counted
 * from the tile's first row (a multiple of 8 rows from where the copies
 * started it). ldmatrix's eight rows at one chunk then fall in eight
 * different banks, as with padded rows (pitch LD with LD / 8 odd), and each
 * 128-byte group of a row holds the same 128 bytes of its global row: a
 * warp's 16-byte cp.async copies land as whole 128-byte wavefronts, where
 * padded rows, shifted 16 bytes a row against the global lines, cost the
 * copies a shared-memory wavefront and part of a sector fetch per 32 bytes.
 * oss_tile_chunk gives the chunk where a lane's ldmatrix reads: c0 (even)
 * plus the lane's chunk y of a padded tile, or c0 ^ y of a swizzled one
 * (y then also holds the lane's row % 8). */
template <bool SW> __device__ __forceinline__ int oss_tile_chunk(int c0, int y) { return SW ? (c0 ^ y) : c0 + y; }
template <bool SW> __device__ __forceinline__ int oss_tile_lane_y(int chunk, int row) {
  return SW ? chunk ^ (row & 7) : chunk;
}

/* Lane address and chunk (oss_tile_chunk) of a B operand stored [n][k]
 * (pitch LDB, swizzled with SWB) for ldmatrix x4: n rows 0..15, k chunks 0, 1. */
template <int LDB, bool SWB> __device__ __forceinline__ uint32_t oss_bt_lane(uint32_t sB, int lane, int *y) {
  static_assert(!SWB || LDB % 64 == 0, "swizzled rows are whole 128-byte groups");
  const int row = ((lane >> 4) << 3) + (lane & 7);
  *y = oss_tile_lane_y<SWB>((lane >> 3) & 1, row);
  return sB + row * LDB * 2;
}

/* One k-step kk of acc += A * B^T: A's fragments a for it, B stored [n][k]
 * (from oss_bt_lane). */
template <typename T, int MT, int NT, int LDB, bool SWB>
__device__ __forceinline__ void oss_warp_mma_kstep_bt(float (&acc)[MT][NT][4], const uint32_t (&a)[MT][4],
                                                      uint32_t b_lane, int b_y, int kk) {
  static_assert(NT % 2 == 0, "n-tiles come in pairs");
#pragma unroll
  for (int np = 0; np < NT / 2; np++) {
    uint32_t b[4];
    oss_ldsm_x4(b_lane + np * 16 * LDB * 2 + oss_tile_chunk<SWB>(kk * 2, b_y) * 16, b);
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
      oss_mma_op<T>::run(acc[mt][2 * np], a[mt], b[0], b[1]);
      oss_mma_op<T>::run(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
    }
  }
}

/* acc += A * B^T: A stored [m][k] (pitch LDA), B stored [n][k] (pitch LDB;
 * swizzled with SWB), K (multiple of 16) contracted. Used for S = Q K^T,
 * dP = dO V^T and their transposes. */
template <typename T, int MT, int NT, int K, int LDA, int LDB, bool SWB = false>
__device__ __forceinline__ void oss_warp_mma_ss(float (&acc)[MT][NT][4], uint32_t sA, uint32_t sB, int lane) {
  static_assert(K % 16 == 0, "k in steps of 16");
  const uint32_t a_lane = sA + ((lane & 15) * LDA + (lane >> 4) * 8) * 2;
  int b_y;
  const uint32_t b_lane = oss_bt_lane<LDB, SWB>(sB, lane, &b_y);
#pragma unroll
  for (int kk = 0; kk < K / 16; kk++) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) oss_ldsm_x4(a_lane + (mt * 16 * LDA + kk * 16) * 2, a[mt]);
    oss_warp_mma_kstep_bt<T, MT, NT, LDB, SWB>(acc, a, b_lane, b_y, kk);
  }
}

/* A's fragments for every k-step of oss_warp_mma_rs_bt: A stored [m][k]
 * (pitch LDA), MT m-tiles, K columns. */
template <int MT, int K, int LDA>
__device__ __forceinline__ void oss_warp_load_a(uint32_t (&a)[MT][K / 16][4], uint32_t sA, int lane) {
  const uint32_t a_lane = sA + ((lane & 15) * LDA + (lane >> 4) * 8) * 2;
#pragma unroll
  for (int kk = 0; kk < K / 16; kk++)
#pragma unroll
    for (int mt = 0; mt < MT; mt++) oss_ldsm_x4(a_lane + (mt * 16 * LDA + kk * 16) * 2, a[mt][kk]);
}

/* acc += A * B^T with A in registers (oss_warp_load_a) and B stored [n][k]
 * (pitch LDB, swizzled with SWB): oss_warp_mma_ss for an A that stays. */
template <typename T, int MT, int NT, int K, int LDB, bool SWB = false>
__device__ __forceinline__ void oss_warp_mma_rs_bt(float (&acc)[MT][NT][4], const uint32_t (&a)[MT][K / 16][4],
                                                   uint32_t sB, int lane) {
  int b_y;
  const uint32_t b_lane = oss_bt_lane<LDB, SWB>(sB, lane, &b_y);
#pragma unroll
  for (int kk = 0; kk < K / 16; kk++) {
    uint32_t ak[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int e = 0; e < 4; e++) ak[mt][e] = a[mt][kk][e];
    oss_warp_mma_kstep_bt<T, MT, NT, LDB, SWB>(acc, ak, b_lane, b_y, kk);
  }
}

/* acc += A * B: A in registers (KS k-steps of fragments), B stored [k][n]
 * (pitch LDB, swizzled with SWB; read with ldmatrix.trans). Used for O += P V,
 * dQ += dS K, dV += P^T dO, dK += dS^T Q. */
template <typename T, int MT, int NT, int KS, int LDB, bool SWB = false>
__device__ __forceinline__ void oss_warp_mma_rs(float (&acc)[MT][NT][4], const uint32_t (&a)[MT][KS][4],
                                                uint32_t sB, int lane) {
  static_assert(NT % 2 == 0, "n-tiles come in pairs");
  static_assert(!SWB || LDB % 64 == 0, "swizzled rows are whole 128-byte groups");
  const int b_row = (((lane >> 3) & 1) << 3) + (lane & 7), b_y = oss_tile_lane_y<SWB>(lane >> 4, b_row);
  const uint32_t b_lane = sB + b_row * LDB * 2;
#pragma unroll
  for (int kk = 0; kk < KS; kk++) {
#pragma unroll
    for (int np = 0; np < NT / 2; np++) {
      uint32_t b[4];
      oss_ldsm_x4_t(b_lane + kk * 16 * LDB * 2 + oss_tile_chunk<SWB>(np * 2, b_y) * 16, b);
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        oss_mma_op<T>::run(acc[mt][2 * np], a[mt][kk], b[0], b[1]);
        oss_mma_op<T>::run(acc[mt][2 * np + 1], a[mt][kk], b[2], b[3]);
      }
    }
  }
}

/* acc += A * B: A stored [k][m] (pitch LDA, ldmatrix.trans), B stored [k][n]
 * (pitch LDB, ldmatrix.trans); only the first np_valid n-tile pairs are
 * computed (warp-uniform). With rowsum (warp-uniform), also rs += A's row sums
 * (A times a B of ones: every column of rs[mt] holds the sum of its row). Used
 * for dQ = dS K from dS^T kept in smem. */
template <typename T, int MT, int NT, int K, int LDA, int LDB>
__device__ __forceinline__ void oss_warp_mma_tt(float (&acc)[MT][NT][4], uint32_t sA, uint32_t sB, int lane,
                                                int np_valid, bool rowsum, float (&rs)[MT][4]) {
  static_assert(NT % 2 == 0 && K % 16 == 0, "n-tiles come in pairs, k in steps of 16");
  const uint32_t a_lane = sA + ((((lane >> 4) << 3) + (lane & 7)) * LDA + (((lane >> 3) & 1) << 3)) * 2;
  const uint32_t b_lane = sB + (((((lane >> 3) & 1) << 3) + (lane & 7)) * LDB + ((lane >> 4) << 3)) * 2;
#pragma unroll
  for (int kk = 0; kk < K / 16; kk++) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) oss_ldsm_x4_t(a_lane + (kk * 16 * LDA + mt * 16) * 2, a[mt]);
    if (rowsum) {
      const uint32_t one = oss_mma_op<T>::pack(1.f, 1.f);
#pragma unroll
      for (int mt = 0; mt < MT; mt++) oss_mma_op<T>::run(rs[mt], a[mt], one, one);
    }
#pragma unroll
    for (int np = 0; np < NT / 2; np++) {
      if (np < np_valid) {
        uint32_t b[4];
        oss_ldsm_x4_t(b_lane + (kk * 16 * LDB + np * 16) * 2, b);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          oss_mma_op<T>::run(acc[mt][2 * np], a[mt], b[0], b[1]);
          oss_mma_op<T>::run(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }
}

/* Packs C fragments of n-tiles (2kk, 2kk+1) into the A fragment of k-step kk. */
template <typename T, int MT, int NT>
__device__ __forceinline__ void oss_acc_to_a(const float (&c)[MT][NT][4], uint32_t (&a)[MT][NT / 2][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int kk = 0; kk < NT / 2; kk++) {
      a[mt][kk][0] = oss_mma_op<T>::pack(c[mt][2 * kk][0], c[mt][2 * kk][1]);
      a[mt][kk][1] = oss_mma_op<T>::pack(c[mt][2 * kk][2], c[mt][2 * kk][3]);
      a[mt][kk][2] = oss_mma_op<T>::pack(c[mt][2 * kk + 1][0], c[mt][2 * kk + 1][1]);
      a[mt][kk][3] = oss_mma_op<T>::pack(c[mt][2 * kk + 1][2], c[mt][2 * kk + 1][3]);
    }
}

/* A mask element as an additive term in log2 units (bool: 0 or -inf). */
template <typename M> __device__ __forceinline__ float oss_attn_mask_ld(const void *mask, int64_t off) {
  const M v = reinterpret_cast<const M *>(mask)[off];
  if constexpr (sizeof(M) == 1) return v ? 0.f : -INFINITY;
  else return oss_to_float(v) * (float)OSS_LOG2E;
}

/* The window (oss.h window_size; a side < 0 is unbounded) narrows the
 * visible columns [*lo, *hi] of fragment row R: key j lies in query i's
 * window iff i + var_off - left <= j <= i + var_off + right. KEY_MAJOR =
 * false: R is the query and the columns are keys; else R is a key and the
 * columns are queries. */
template <bool KEY_MAJOR>
__device__ __forceinline__ void oss_attn_window_clamp(const oss_attn_args &a, int R, int64_t *lo, int64_t *hi) {
  const int64_t diag = KEY_MAJOR ? (int64_t)R - a.var_off : (int64_t)R + a.var_off; /* the column of d = 0 */
  const int64_t below = KEY_MAJOR ? a.win_right : a.win_left, above = KEY_MAJOR ? a.win_left : a.win_right;
  if (below >= 0 && diag - below > *lo) *lo = diag - below;
  if (above >= 0 && diag + above < *hi) *hi = diag + above;
}

/* Whether every pair of queries [i0, i0 + ni) and keys [j0, j0 + nj) lies
 * inside the window (always, without one). */
__device__ __forceinline__ bool oss_attn_window_holds(const oss_attn_args &a, int i0, int ni, int j0, int nj) {
  const int64_t dmax = (int64_t)(i0 + ni - 1) + a.var_off - j0, dmin = (int64_t)i0 + a.var_off - (j0 + nj - 1);
  return (a.win_left < 0 || dmax <= a.win_left) && (a.win_right < 0 || -dmin <= a.win_right);
}

/* Applies the key bound, the causal rule and the mask tensor (element type M,
 * void for none) to scaled scores held as C fragments: fragment row
 * R = r0 + mt*16 + g (+8), column C = c0 + n*8 + 2t (+1). KEY_MAJOR = false:
 * R is the query and C the key (forward, dQ); true: the transpose (dK/dV).
 * Without a mask tensor, the window too (a window with a mask tensor runs the
 * kernels with the score variants), unless WINDOWS is false (a kernel that
 * never runs with one: a query row's visible keys then start at 0, and one
 * comparison an element decides). Invisible scores become -inf. */
template <typename M, bool KEY_MAJOR, int MT, int NT, bool WINDOWS = true>
__device__ __forceinline__ void oss_attn_mask_frag(float (&s)[MT][NT][4], const oss_attn_args &a, int64_t mbase,
                                                   int r0, int c0, int lane) {
  const int g = lane >> 2, t2 = (lane & 3) * 2;
  int64_t ms_r = 0, ms_c = 0;
  if constexpr (!std::is_same<M, void>::value) {
    ms_r = oss_opaque(KEY_MAJOR ? a.m_s[3] : a.m_s[2]);
    ms_c = oss_opaque(KEY_MAJOR ? a.m_s[2] : a.m_s[3]);
  }
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int hi = 0; hi < 2; hi++) {
      const int R = r0 + mt * 16 + g + hi * 8;
      /* visible columns form the interval [cmin, cmax] */
      int cmin, cmax;
      bool row_in; /* the row is a real query (or key), so the mask may be read */
      if (KEY_MAJOR) {
        const int64_t lo = a.causal ? (int64_t)R - a.causal_off : 0;
        cmin = (int)(lo < 0 ? 0 : (lo > a.lq ? a.lq : lo));
        cmax = R < a.lk ? a.lq - 1 : -1;
        row_in = R < a.lk;
      } else {
        const int64_t hiv = a.causal ? (int64_t)R + a.causal_off : (int64_t)a.lk - 1;
        cmin = 0;
        cmax = (int)(hiv < (int64_t)a.lk - 1 ? (hiv < -1 ? -1 : hiv) : (int64_t)a.lk - 1);
        row_in = R < a.lq;
      }
      if constexpr (std::is_same<M, void>::value && WINDOWS) {
        if (a.win_left >= 0 || a.win_right >= 0) {
          int64_t lo = cmin, hi = cmax;
          oss_attn_window_clamp<KEY_MAJOR>(a, R, &lo, &hi);
          cmin = lo > INT_MAX ? INT_MAX : (int)lo; /* lo only rose, hi only fell (and stays above INT_MIN) */
          cmax = (int)hi;
        }
      }
      const int64_t mrow = mbase + (int64_t)R * ms_r;
#pragma unroll
      for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int C = c0 + n * 8 + t2 + e;
          const bool vis = (!WINDOWS && !KEY_MAJOR ? true : C >= cmin) && C <= cmax; /* C >= 0 = cmin there */
          float x = s[mt][n][2 * hi + e];
          if constexpr (!std::is_same<M, void>::value) {
            if (vis && row_in) x += oss_attn_mask_ld<M>(a.mask, mrow + (int64_t)C * ms_c);
          }
          s[mt][n][2 * hi + e] = vis ? x : -INFINITY;
        }
    }
}

/* The score variants' per-thread constants, hoisted out of the key loops. */
typedef struct oss_attn_var_consts {
  float scale_l2; /* the softmax scale times log2(e) */
  float cap;      /* the softcap times log2(e) (0: off) */
  float cap_k;    /* 2 scale log2(e) / softcap: tanh(raw scale / softcap) = 1 - 2 / (2^(raw cap_k) + 1) */
  float slope;    /* this (batch, query head)'s ALiBi slope times log2(e) (0: off) */
} oss_attn_var_consts;

__device__ __forceinline__ oss_attn_var_consts oss_attn_var_consts_of(const oss_attn_args &a, int b, int h) {
  oss_attn_var_consts v;
  v.scale_l2 = a.scale_log2;
  v.cap = a.softcap_l2;
  v.cap_k = a.softcap_l2 > 0.f ? (float)(2.0 * OSS_LOG2E) * a.scale_log2 / a.softcap_l2 : 0.f;
  v.slope = a.alibi == nullptr ? 0.f : a.alibi[(int64_t)b * a.alibi_sb + h] * (float)OSS_LOG2E;
  return v;
}

/* 1 / x in one MUFU op (x = inf gives 0). */
__device__ __forceinline__ float oss_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/* The softcap of a raw product: r = 1 / (2^(raw cap_k) + 1) (cap_k:
 * oss_attn_var_consts') by one ex2.approx and one rcp.approx; the capped score is
 * then oss_attn_capped(r, cap) = cap (1 - 2 r) in log2 units (cap: the
 * softcap times log2(e)), and tanh = 1 - 2 r. */
__device__ __forceinline__ float oss_attn_cap_r(float raw, float cap_k) { return oss_rcp(oss_ex2(raw * cap_k) + 1.f); }
__device__ __forceinline__ float oss_attn_capped(float r, float cap) { return fmaf(-2.f * cap, r, cap); }

/* A visible pair's score in log2 units from its raw product q.k: scaled,
 * capped (s = cap tanh(s / cap)) where cap, minus ALiBi's slope |dist| where
 * alibi (dist = i + off - j, exact in float below 2^24). The capped score is
 * cap (1 - 2 r), r = 1 / (2^(raw cap_k) + 1), by one ex2.approx and one
 * rcp.approx: absolute error ~1e-7 in tanh, which the cap scales into the
 * score's absolute error (~5e-6 at cap 50, float32's own rounding of such a
 * score); the backward recomputes the same value. *dcap: the capped score's
 * derivative by the scaled one, 1 - tanh^2 (1 without softcap), for dS. */
__device__ __forceinline__ float oss_attn_var_value(const oss_attn_var_consts &v, bool cap, bool alibi, float raw,
                                                    float dist, float *dcap) {
  float x;
  *dcap = 1.f;
  if (cap) {
    const float r = oss_attn_cap_r(raw, v.cap_k);
    x = oss_attn_capped(r, v.cap);
    const float t = fmaf(-2.f, r, 1.f);
    *dcap = 1.f - t * t;
  } else {
    x = raw * v.scale_l2;
  }
  return alibi ? fmaf(-v.slope, fabsf(dist), x) : x;
}

/* The columns visible from fragment row R under the bounds, the causal rule
 * and the window: [*lo, *hi], empty when lo > hi. KEY_MAJOR = false: R is a
 * query and the columns are keys; else R is a key and the columns queries. */
template <bool KEY_MAJOR>
__device__ __forceinline__ void oss_attn_var_visible(const oss_attn_args &a, int R, int *lo, int *hi) {
  int64_t l = 0, h;
  if (!KEY_MAJOR) { /* keys j with j <= i + causal_off and i + off - left <= j <= i + off + right */
    h = R < a.lq ? (int64_t)a.lk - 1 : -1;
    if (a.causal && (int64_t)R + a.causal_off < h) h = (int64_t)R + a.causal_off;
  } else { /* queries i with i >= j - causal_off and j - off - right <= i <= j - off + left */
    h = R < a.lk ? (int64_t)a.lq - 1 : -1;
    if (a.causal && (int64_t)R - a.causal_off > l) l = (int64_t)R - a.causal_off;
  }
  oss_attn_window_clamp<KEY_MAJOR>(a, R, &l, &h);
  *lo = l > INT_MAX ? INT_MAX : (int)l;
  *hi = h < -1 ? -1 : (int)h; /* h <= lk - 1 or lq - 1 */
}

/* Whether every pair of queries [i0, i0 + ni) and keys [j0, j0 + nj) is
 * visible and unmasked: the keys inside lk, the causal rule and the window
 * hold for all of them, and there is no mask tensor. Queries past lq are not
 * checked, as in the plain kernels: their rows are never written (forward),
 * and their zero dO and D make their terms vanish (backward). */
__device__ __forceinline__ bool oss_attn_var_interior(const oss_attn_args &a, int i0, int ni, int j0, int nj) {
  return a.mask_kind == OSS_MASK_NONE && j0 + nj <= a.lk &&
         !(a.causal && (int64_t)(j0 + nj - 1) > (int64_t)i0 + a.causal_off) && oss_attn_window_holds(a, i0, ni, j0, nj);
}

/* Whether some key of [j0, j0 + nj) is inside the window of some query of
 * the warp's 16 MT rows from r0. */
template <int MT>
__device__ __forceinline__ bool oss_attn_var_window_live(const oss_attn_args &a, int r0, int j0, int nj) {
  return (a.win_right < 0 || (int64_t)j0 <= (int64_t)(r0 + MT * 16 - 1) + a.var_off + a.win_right) &&
         (a.win_left < 0 || (int64_t)(j0 + nj - 1) >= (int64_t)r0 + a.var_off - a.win_left);
}

/* f(mt, n, e, x, dcap) for each element of a tile of raw scores held as C
 * fragments: x its score under the variants in log2 units
 * (oss_attn_var_value, plus the mask tensor's value; -inf where the key is
 * hidden by the bounds, the causal rule, the window or a bool mask) and dcap
 * the softcap's derivative. Fragment row R = r0 + mt*16 + g (+8), column
 * C = c0 + n*8 + 2t (+1); KEY_MAJOR = false: R is the query and C the key.
 * A tile of visible, unmasked pairs (oss_attn_var_interior: all but the tiles
 * on the diagonal, the window's edges and the end of the keys) skips the
 * visibility test; the others test each column against its row's visible
 * interval (oss_attn_var_visible). MASKS = false: a kernel the launcher
 * never gives a mask tensor, which then needs no registers for reading one. */
template <bool KEY_MAJOR, int MT, int NT, bool MASKS = true, typename F>
__device__ __forceinline__ void oss_attn_var_each(const float (&s)[MT][NT][4], const oss_attn_args &a,
                                                  const oss_attn_var_consts &v, int64_t mbase, int r0, int c0,
                                                  int lane, F &&f) {
  const int g = lane >> 2, t2 = (lane & 3) * 2;
  const bool interior = KEY_MAJOR ? oss_attn_var_interior(a, c0, NT * 8, r0, MT * 16)
                                  : oss_attn_var_interior(a, r0, MT * 16, c0, NT * 8);
  /* dist = query + off - key of element (mt, n, e) = d0 +/- (mt*16 + (e>>1)*8 - n*8 - (e&1)) */
  const float d0 = KEY_MAJOR ? (float)((int64_t)c0 + a.var_off - r0 + (t2 - g))
                             : (float)((int64_t)r0 + a.var_off - c0 + (g - t2));
  auto each = [&](auto cap, auto alibi, auto checked, auto masked) {
    int lo[MT][2], hi[MT][2];
    if (checked) {
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) oss_attn_var_visible<KEY_MAJOR>(a, r0 + mt * 16 + g + h * 8, &lo[mt][h], &hi[mt][h]);
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int k = mt * 16 + (e >> 1) * 8 - n * 8 - (e & 1);
          float dcap;
          float x = oss_attn_var_value(v, decltype(cap)::value, decltype(alibi)::value, s[mt][n][e],
                                       KEY_MAJOR ? d0 - k : d0 + k, &dcap);
          if (checked) {
            const int R = r0 + mt * 16 + g + (e >> 1) * 8, C = c0 + n * 8 + t2 + (e & 1);
            const bool vis = C >= lo[mt][e >> 1] && C <= hi[mt][e >> 1];
            if (masked && vis)
              x += oss_attn_mask_value<float>(a, mbase + (int64_t)(KEY_MAJOR ? C : R) * a.m_s[2] +
                                                     (int64_t)(KEY_MAJOR ? R : C) * a.m_s[3]) *
                   (float)OSS_LOG2E;
            x = vis ? x : -INFINITY;
          }
          f(mt, n, e, x, dcap);
        }
  };
  /* compiled per call: softcap or not; inner tiles with ALiBi or not, the
   * others with ALiBi's two operations always (slope 0 leaves x unchanged)
   * and with a mask tensor or not */
  using yes = std::true_type;
  using no = std::false_type;
  auto per_tile = [&](auto cap) {
    if (interior) {
      if (v.slope != 0.f) each(cap, yes(), no(), no());
      else each(cap, no(), no(), no());
    } else {
      if (MASKS && a.mask_kind != OSS_MASK_NONE) each(cap, yes(), yes(), yes());
      else each(cap, yes(), yes(), no());
    }
  };
  if (v.cap > 0.f) per_tile(yes());
  else per_tile(no());
}

/* ---- dropout (oss.h; the rule of oss_internal.h) --------------------------
 * Weights held as C fragments, element (mt, n, e) at fragment row
 * R = r0 + 16 mt + g + 8 (e >> 1) and column C = c0 + 8 n + 2t + (e & 1);
 * KEY_MAJOR = false: R is the query i and C the key j (forward, dQ), true:
 * the reverse (dK/dV). With r0 and c0 multiples of 16 (every kernel's tile
 * origins are), R = r0 + 16 mt + g and C = c0 + 16 m + 2t have bit 3 clear
 * (C bit 0 too), so elements (mt, 2m + dc, 2 dr + x) for dr, dc, x in {0, 1}
 * are rows R, R + 8 by columns C, C + 1, C + 8, C + 9. Query-major that is
 * one Philox group: one call for eight of the thread's own weights.
 * Key-major the keys R and R ^ 1 share groups: the lane of R (row g) draws
 * the group of query C + (g & 1), the lane of R ^ 1 (lane ^ 4) the group of
 * the other query, and each gives the other the halves of its keys: again
 * one call per eight weights, and two shuffles. A tile's kept
 * weights are drawn once, as bits (oss_attn_keep): the forward zeroes the
 * dropped ones in the packed P (oss_attn_dropout_apply_a), the backward
 * applies the same bits to dP and to P (oss_attn_dropout_tile, then
 * oss_attn_dropout_apply). */

/* The seed of a call with dropout (0 without), read from device memory. */
__device__ __forceinline__ uint64_t oss_attn_drop_seed(const oss_attn_args &a) {
  return a.drop_seed != nullptr ? __ldg(reinterpret_cast<const unsigned long long *>(a.drop_seed)) : 0ull;
}

/* Which weights of an MT x NT fragment tile are kept: bit (mt NT + n) 4 + e
 * (every kernel's tile has at most 64 weights a thread). */
template <int MT, int NT> struct oss_attn_keep {
  static_assert(MT * NT * 4 <= 64, "a thread's weights of a tile fit 64 bits");
  uint64_t bits;
  __device__ __forceinline__ bool at(int mt, int n, int e) const { return (bits >> ((mt * NT + n) * 4 + e)) & 1u; }
};

/* The kept weights of the tile at (r0, c0) (multiples of 16) of (batch, query
 * head) bh: weights whose 16 bits are >= a.drop_thr. Byte mt NT / 2 + m of
 * the bits holds n-tiles 2m and 2m + 1 of m-tile mt; the bytes are made one
 * at a time (a loop, not unrolled), so the calls' temporaries stay few beside
 * the tiles the kernels hold. Every lane of the warp calls it (key-major
 * lanes swap bits). */
template <bool KEY_MAJOR, int MT, int NT>
__device__ __forceinline__ void oss_attn_dropout_keep(oss_attn_keep<MT, NT> &keep, const oss_attn_args &a,
                                                      uint64_t seed, int64_t bh, int r0, int c0, int lane) {
  static_assert(NT % 2 == 0, "n-tiles come in pairs");
  const int g = lane >> 2, t2 = (lane & 3) * 2;
  keep.bits = 0;
  /* The seed is read again each iteration (for the next one, by a strong
   * load the compiler may not hoist; CTA scope, so from L1) so that each call
   * derives its twenty round keys afresh (an add each) rather than the
   * compiler holding them across the loop, in registers the accumulators
   * need. */
  uint64_t s = seed;
#pragma unroll 1
  for (int idx = 0; idx < MT * NT / 2; idx++) {
    const int mt = idx / (NT / 2), m = idx % (NT / 2);
    const int R = r0 + mt * 16 + g, C = c0 + m * 16 + t2;
    uint64_t s_next;
    asm volatile("ld.relaxed.cta.global.u64 %0, [%1];" : "=l"(s_next) : "l"(a.drop_seed));
    const uint32_t thr = a.drop_thr;
    uint32_t w[4], byte = 0;
    if constexpr (!KEY_MAJOR) {
      /* query R + 8 dr, key C + 8 dc + x: half x of word 2 dr + dc */
      oss_dropout_group(s, (uint64_t)bh, R, C, w);
#pragma unroll
      for (int dr = 0; dr < 2; dr++)
#pragma unroll
        for (int dc = 0; dc < 2; dc++) {
          if ((w[2 * dr + dc] & 0xFFFFu) >= thr) byte |= 1u << (4 * dc + 2 * dr);
          if ((w[2 * dr + dc] >> 16) >= thr) byte |= 2u << (4 * dc + 2 * dr);
        }
    } else {
      /* key R + 8 dr, query C + 8 dc + x: half g & 1 (R's bit 0) of word
       * 2 dc + dr of query C + x's group. This lane draws the group of query
       * C + own and keeps the halves own of its words; the other halves go to
       * the partner lane, which returns those of query C + (1 - own). */
      const int own = g & 1;
      oss_dropout_group(s, (uint64_t)bh, C + own, R, w);
      const uint32_t keep_sel = own ? 0x7632u : 0x5410u, give_sel = own ? 0x5410u : 0x7632u;
#pragma unroll
      for (int dc = 0; dc < 2; dc++) {
        /* keys R, R + 8 (low, high half) of query C + own (mine), C + 1 - own (got) */
        const uint32_t mine = __byte_perm(w[2 * dc], w[2 * dc + 1], keep_sel);
        const uint32_t got = __shfl_xor_sync(0xFFFFFFFFu, __byte_perm(w[2 * dc], w[2 * dc + 1], give_sel), 4);
#pragma unroll
        for (int dr = 0; dr < 2; dr++) {
          const uint32_t bm = dr ? mine >> 16 : mine & 0xFFFFu, bg = dr ? got >> 16 : got & 0xFFFFu;
          if (bm >= thr) byte |= (1u << (4 * dc + 2 * dr)) << own;
          if (bg >= thr) byte |= (2u << (4 * dc + 2 * dr)) >> own;
        }
      }
    }
    keep.bits |= (uint64_t)byte << (8 * idx);
    s = s_next;
  }
}

/* x = kept ? x * scale : 0 over a fragment tile. */
template <int MT, int NT>
__device__ __forceinline__ void oss_attn_dropout_apply(float (&x)[MT][NT][4], const oss_attn_keep<MT, NT> &keep,
                                                       float scale) {
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) x[mt][n][e] = keep.at(mt, n, e) ? x[mt][n][e] * scale : 0.f;
}

/* Zeroes the dropped weights of the A fragments packed from a tile of them
 * (oss_acc_to_a's layout: pa[mt][kk][2 (n & 1) + hi] holds elements 2 hi
 * and 2 hi + 1 of n-tile n = 2 kk + (0 or 1), the first in the low half).
 * The kept weights stay unscaled: drop_scale, common to all of them, is
 * applied to the product they enter, after one rounding of each weight. */
template <int MT, int NT>
__device__ __forceinline__ void oss_attn_dropout_apply_a(uint32_t (&pa)[MT][NT / 2][4],
                                                         const oss_attn_keep<MT, NT> &keep) {
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int kk = 0; kk < NT / 2; kk++)
#pragma unroll
      for (int r = 0; r < 4; r++) {
        const int n = 2 * kk + (r >> 1), e = 2 * (r & 1);
        pa[mt][kk][r] &= (keep.at(mt, n, e) ? 0x0000FFFFu : 0u) | (keep.at(mt, n, e + 1) ? 0xFFFF0000u : 0u);
      }
}

/* Drops the weights of tile x in place (oss_attn_dropout_keep, then apply
 * with a.drop_scale) and returns the kept bits in keep for other tiles of the
 * same weights. */
template <bool KEY_MAJOR, int MT, int NT>
__device__ __forceinline__ void oss_attn_dropout_tile(float (&x)[MT][NT][4], oss_attn_keep<MT, NT> &keep,
                                                      const oss_attn_args &a, uint64_t seed, int64_t bh, int r0,
                                                      int c0, int lane) {
  oss_attn_dropout_keep<KEY_MAJOR, MT, NT>(keep, a, seed, bh, r0, c0, lane);
  oss_attn_dropout_apply<MT, NT>(x, keep, a.drop_scale);
}

/* oss_attn_mask_frag for the mask tensor's dtype (bool, float32 or T). */
template <typename T, bool KEY_MAJOR, int MT, int NT>
__device__ __forceinline__ void oss_attn_mask_tile(float (&s)[MT][NT][4], const oss_attn_args &a, int64_t mbase,
                                                   int r0, int c0, int lane) {
  if (a.mask_kind == OSS_MASK_NONE) oss_attn_mask_frag<void, KEY_MAJOR, MT, NT>(s, a, mbase, r0, c0, lane);
  else if (a.mask_dtype == OSS_BOOL) oss_attn_mask_frag<unsigned char, KEY_MAJOR, MT, NT>(s, a, mbase, r0, c0, lane);
  else if (a.mask_dtype == OSS_FLOAT32) oss_attn_mask_frag<float, KEY_MAJOR, MT, NT>(s, a, mbase, r0, c0, lane);
  else oss_attn_mask_frag<T, KEY_MAJOR, MT, NT>(s, a, mbase, r0, c0, lane);
}

/* The int8 code of x minus x rounded to T (oss_output_residual_code, oss_internal.h). */
template <typename T> __device__ __forceinline__ int oss_residual_code(float x) {
  return oss_output_residual_code(x, oss_to_float(oss_from_float<T>(x)), std::is_same<T, __nv_bfloat16>::value);
}
/* Two codes as the 16 bits of columns c, c + 1 (little-endian: c's byte first). */
template <typename T> __device__ __forceinline__ uint32_t oss_residual_code2(float x0, float x1) {
  return (uint32_t)(oss_residual_code<T>(x0) & 0xff) | (uint32_t)(oss_residual_code<T>(x1) & 0xff) << 8;
}

/* Stores a pair of output elements (cols c, c+1 of a row), only those < ncols;
 * as one 32-bit store when the row is 16-byte aligned and both exist. */
template <typename T>
__device__ __forceinline__ void oss_store_pair(T *row, int c, int ncols, float v0, float v1, bool vec) {
  if (vec && c + 1 < ncols) {
    *reinterpret_cast<uint32_t *>(row + c) = oss_mma_op<T>::pack(v0, v1);
  } else {
    if (c < ncols) row[c] = oss_from_float<T>(v0);
    if (c + 1 < ncols) row[c + 1] = oss_from_float<T>(v1);
  }
}

/* Lane q of each quad holds word q of the 16-byte pieces w[0..3] of four
 * consecutive 8-column tiles (the mma accumulator layout); afterwards it holds
 * all four words of tile q's piece: the quad's 4 x 4 transpose, in two
 * exchanges of two words with the lane whose index differs in one bit. The
 * shuffles name only the quad's lanes: callers store rows under a bound,
 * which a quad (one row) passes or fails as a whole. */
__device__ __forceinline__ void oss_quad_transpose(uint32_t (&w)[4], int q) {
  const unsigned quad = 0xfu << (threadIdx.x & 28); /* blocks are whole warps along x */
#pragma unroll
  for (int bit = 1; bit <= 2; bit <<= 1) {
    const bool upper = q & bit;
    /* the words whose tile bit differs from the lane's go to the partner, which
     * sends back its words whose tile bit matches this lane's */
#pragma unroll
    for (int k = 0; k < 4; k++) {
      if (k & bit) continue;
      const uint32_t send = upper ? w[k] : w[k | bit];
      const uint32_t got = __shfl_xor_sync(quad, send, bit);
      if (upper) w[k] = got;
      else w[k | bit] = got;
    }
  }
}

/* WIDE stores of row hi of an accumulator fragment: for each four
 * consecutive 8-column tiles, the quad's words pack(x, x') of its pairs
 * exchanged (oss_quad_transpose), so that lane q holds tile n0 + q's four
 * words, which store(n0 + q, words) writes. */
template <int NO, typename Pack, typename Store>
__device__ __forceinline__ void oss_quad_tiles(const float (&acc)[NO][4], int hi, int q, Pack pack, Store store) {
  static_assert(NO % 4 == 0, "the quad's exchange takes the tiles four at a time");
#pragma unroll
  for (int n0 = 0; n0 < NO; n0 += 4) {
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; j++) w[j] = pack(acc[n0 + j][2 * hi], acc[n0 + j][2 * hi + 1]);
    oss_quad_transpose(w, q);
    store(n0 + q, w);
  }
}

/* Stores row hi of an accumulator fragment times `scale`: acc[n][2 hi] and
 * acc[n][2 hi + 1] at columns n * 8 + t2 and n * 8 + t2 + 1 of `row`, only
 * those < ncols. Where the row is aligned and all NO * 8 columns exist (the
 * common case) that is one branch-free run of stores: an epilogue with a
 * branch per element is long enough to miss the instruction cache. WIDE (NO
 * a multiple of 4): the quad's words of four tiles are exchanged so that each
 * lane stores one tile's whole 16 bytes, and a warp's store fills 32-byte
 * sectors, in a quarter of the instructions (4-byte stores cover half of each
 * sector); the exchange costs registers, which kernels with score variants or
 * wide rows do not have to spare. */
template <typename T, int NO, bool WIDE = false>
__device__ __forceinline__ void oss_store_frag_row(T *row, int t2, int ncols, bool vec, const float (&acc)[NO][4],
                                                   int hi, float scale) {
  if (vec && NO * 8 <= ncols) {
    if constexpr (WIDE) {
      oss_quad_tiles<NO>(
          acc, hi, t2 >> 1, [scale](float x0, float x1) { return oss_mma_op<T>::pack(x0 * scale, x1 * scale); },
          [row](int n, const uint32_t(&w)[4]) {
            *reinterpret_cast<uint4 *>(row + n * 8) = make_uint4(w[0], w[1], w[2], w[3]);
          });
    } else {
      uint32_t *row32 = reinterpret_cast<uint32_t *>(row + t2);
#pragma unroll
      for (int n = 0; n < NO; n++) row32[n * 4] = oss_mma_op<T>::pack(acc[n][2 * hi] * scale, acc[n][2 * hi + 1] * scale);
    }
  } else {
#pragma unroll
    for (int n = 0; n < NO; n++)
      oss_store_pair<T>(row, n * 8 + t2, ncols, acc[n][2 * hi] * scale, acc[n][2 * hi + 1] * scale, vec);
  }
}

/* The same row's rounding residual (of each value times `scale` rounded to T)
 * as int8 codes (oss_residual_code) into `row`, one byte a column, those <
 * ncols. WIDE (the row aligned and whole): each lane stores a tile's 8 bytes
 * after the quad's exchange (as oss_store_frag_row). Otherwise a 2-byte store
 * per pair, with a branch per pair: as one run of stores it spilled the
 * head-dim-256 variant kernels. */
template <typename T, int NO, bool WIDE = false>
__device__ __forceinline__ void oss_store_residual_row(int8_t *row, int t2, int ncols, bool vec,
                                                       const float (&acc)[NO][4], int hi, float scale) {
  if constexpr (WIDE) {
    if (vec && NO * 8 <= ncols) {
      oss_quad_tiles<NO>(
          acc, hi, t2 >> 1, [scale](float x0, float x1) { return oss_residual_code2<T>(x0 * scale, x1 * scale); },
          [row](int n, const uint32_t(&w)[4]) {
            *reinterpret_cast<uint2 *>(row + n * 8) = make_uint2(w[0] | w[1] << 16, w[2] | w[3] << 16);
          });
      return;
    }
  }
#pragma unroll
  for (int n = 0; n < NO; n++) {
    const int c = n * 8 + t2;
    const float v0 = acc[n][2 * hi] * scale, v1 = acc[n][2 * hi + 1] * scale;
    if (vec && c + 1 < ncols) {
      *reinterpret_cast<uint16_t *>(row + c) = (uint16_t)oss_residual_code2<T>(v0, v1);
    } else {
      if (c < ncols) row[c] = (int8_t)oss_residual_code<T>(v0);
      if (c + 1 < ncols) row[c + 1] = (int8_t)oss_residual_code<T>(v1);
    }
  }
}

/* Query block `block` of (batch, query head) bh: batch b, query head h and
 * its kv head hk, rows i0 .. i0 + rows - 1, and the ntiles key tiles of BC
 * that some of them can see (causal: up to the diagonal). Causal blocks are
 * numbered heaviest (last rows) first. oss_attn_query_block_of: the block a
 * query-major CTA owns (grid: oss_attn_query_grid); false for the padding CTAs
 * past batch * heads and a variable-length batch's empty slots. */
typedef struct oss_attn_query_block {
  int64_t bh;
  int b, h, hk, i0, rows, ntiles;
  int jt0; /* the first key tile some row can see (a window's left edge; else 0) */
} oss_attn_query_block;

/* The rows and key tiles of query block `block` (q's head fields already set). */
template <int BR, int BC>
__device__ __forceinline__ void oss_attn_query_block_rows(const oss_attn_args &a, int block, oss_attn_query_block *q) {
  const int qb = a.causal ? (a.lq + BR - 1) / BR - 1 - block : block;
  q->i0 = qb * BR;
  q->rows = min(BR, a.lq - q->i0);
  int n_end = a.lk; /* keys [0, n_end) can be visible to some row of the block */
  if (a.causal) {
    const int64_t lim = (int64_t)(q->i0 + q->rows) + a.causal_off;
    n_end = (int)(lim < 0 ? 0 : (lim < a.lk ? lim : a.lk));
  }
  int n_start = 0; /* a window: keys [i0 + off - left, i0 + rows - 1 + off + right] */
  if (a.win_right >= 0) {
    const int64_t lim = (int64_t)(q->i0 + q->rows - 1) + a.var_off + a.win_right + 1;
    n_end = (int)(lim < 0 ? 0 : (lim < n_end ? lim : n_end));
  }
  if (a.win_left >= 0) {
    const int64_t first = (int64_t)q->i0 + a.var_off - a.win_left;
    n_start = (int)(first < 0 ? 0 : (first < n_end ? first : n_end));
  }
  q->ntiles = (n_end + BC - 1) / BC;
  q->jt0 = n_start / BC;
  if (q->jt0 > q->ntiles) q->jt0 = q->ntiles;
}

template <int BR, int BC>
__device__ __forceinline__ void oss_attn_query_block_at(const oss_attn_args &a, int64_t bh, int block,
                                                        oss_attn_query_block *q) {
  q->bh = bh;
  q->b = (int)(q->bh / a.hq);
  q->h = (int)(q->bh % a.hq);
  q->hk = q->h / a.group;
  oss_attn_query_block_rows<BR, BC>(a, block, q);
}

/* The block of this CTA; a (the kernel's copy of its arguments) becomes its
 * sequence's view in a variable-length batch (oss_attn_seq_view). False: no
 * such block (past batch * heads, or past its sequence's rows). */
template <typename T, int BR, int BC>
__device__ __forceinline__ bool oss_attn_query_block_of(oss_attn_args &a, oss_attn_query_block *q) {
  const int64_t y = blockIdx.y + (int64_t)gridDim.y * blockIdx.z;
  int64_t bh = y;
  int block = (int)blockIdx.x;
  if (a.cu_q != nullptr) { /* y: the query head; x: a slot of the packed rows */
    if (y >= a.hq) return false;
    bh = (int64_t)oss_attn_slot_seq(a.cu_q, a.batch, a.total_q, BR, blockIdx.x, &block) * a.hq + y;
  } else if (bh >= (int64_t)a.batch * a.hq) {
    return false;
  }
  oss_attn_seq_view<T>(a, (int)(bh / a.hq));
  if (block < 0 || (int64_t)block * BR >= a.lq) return false;
  oss_attn_query_block_at<BR, BC>(a, bh, block, q);
  return true;
}

/* The (batch, kv head) and key block of a key-major CTA with blocks of R
 * keys (grid: oss_attn_key_grid; in a variable-length batch b is the slot's
 * sequence). False: padding past batch * kv heads. The caller compares the
 * block with its sequence's keys (negative or past them: nothing to do). */
__device__ __forceinline__ bool oss_attn_key_block_of(const oss_attn_args &a, int rows, int *b, int *hk, int *block) {
  const int64_t y = blockIdx.y + (int64_t)gridDim.y * blockIdx.z;
  *block = (int)blockIdx.x;
  if (a.cu_q != nullptr) { /* y: the kv head; x: a slot of the packed keys */
    if (y >= a.hkv) return false;
    *b = oss_attn_slot_seq(a.cu_k, a.batch, a.total_k, rows, blockIdx.x, block);
    *hk = (int)y;
    return true;
  }
  if (y >= (int64_t)a.batch * a.hkv) return false;
  *b = (int)(y / a.hkv);
  *hk = (int)(y % a.hkv);
  return true;
}

/* Grid for (blocks along a sequence) x (batch * heads), the second folded into
 * y and z so that any batch * heads up to 65535^2 fits. */
static inline dim3 oss_attn_grid(int64_t blocks, int64_t bh) {
  const int64_t y = bh < 65535 ? bh : 65535;
  return dim3((unsigned)blocks, (unsigned)(y > 0 ? y : 1), (unsigned)((bh + y - 1) / (y > 0 ? y : 1)));
}

/* Grids of the query-major kernels (blocks of R query rows) and key-major
 * ones (blocks of R keys): blocks along the longest sequence x batch * heads,
 * or in a variable-length batch the slots of the packed rows x heads
 * (oss_attn_seq_slots). */
static inline dim3 oss_attn_query_grid(const oss_attn_args *a, int rows) {
  return a->cu_q != NULL ? oss_attn_grid(oss_attn_seq_slots(a->total_q, a->batch, rows), a->hq)
                         : oss_attn_grid((a->lq + rows - 1) / rows, (int64_t)a->batch * a->hq);
}
static inline dim3 oss_attn_key_grid(const oss_attn_args *a, int rows) {
  return a->cu_q != NULL ? oss_attn_grid(oss_attn_seq_slots(a->total_k, a->batch, rows), a->hkv)
                         : oss_attn_grid((a->lk + rows - 1) / rows, (int64_t)a->batch * a->hkv);
}

/* Launches kernel(*a) with grid x threads and `smem` bytes of dynamic shared
 * memory, once the device is known to allow that much per block; `what` names
 * the kernel in errors (with the head dim it was instantiated for).
 * cluster_y > 1: in thread-block clusters of (1, cluster_y, 1) CTAs (sm_90). */
static inline oss_status oss_attn_launch(void (*kernel)(const oss_attn_args), const char *what, int head_dim,
                                         size_t smem, dim3 grid, int threads, const oss_attn_args *a,
                                         cudaStream_t stream, const oss_device_info *dev, int cluster_y = 1) {
  if (smem > (size_t)dev->max_smem_per_block_optin)
    return oss_fail(OSS_ERROR_NOT_SUPPORTED,
                    "%s for head dim %d needs %zu bytes of shared memory per block, the device allows %d", what,
                    head_dim, smem, dev->max_smem_per_block_optin);
  OSS_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  if (cluster_y > 1) {
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr;
    memset(&cfg, 0, sizeof cfg);
    memset(&attr, 0, sizeof attr);
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 1;
    attr.val.clusterDim.y = (unsigned)cluster_y;
    attr.val.clusterDim.z = 1;
    cfg.gridDim = grid;
    cfg.blockDim = dim3((unsigned)threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    OSS_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, *a));
  } else {
    kernel<<<grid, threads, smem, stream>>>(*a);
  }
  return oss_check_launch(what);
}

/* The virtual architecture a kernel's code was compiled from, as __CUDA_ARCH__
 * / 10 (90 for sm_90 code; 80 for sm_80 PTX that the driver compiled for a
 * newer device); 0 if the runtime cannot say. */
static inline int oss_kernel_ptx_arch(void (*kernel)(const oss_attn_args)) {
  cudaFuncAttributes attr;
  if (cudaFuncGetAttributes(&attr, (const void *)kernel) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return attr.ptxVersion;
}

#endif /* OSS_ATTENTION_MMA_CUH */
