/*
 * cross_entropy.cu - CUDA cross-entropy over class indices (oss.h): the
 * forward (per-row loss and float64 lse), the backward (the logits' gradient
 * from the saved lse) and both in one launch (loss, lse and gradient), with
 * the CPU kernel's semantics (csrc/cpu/cross_entropy.c), plus the mean loss's
 * glue (row weights from the targets, the loss's total: one CTA each, at the
 * end of the file):
 *   lse    = log sum_j exp(x_j)
 *   loss   = (1 - eps) (lse - x_t) + eps (lse - mean_j x_j) + z lse^2   (0 on ignored rows)
 *   grad_j = g (softmax_j (1 + 2 z lse) - (1 - eps) [j == t] - eps / C)  (0 on ignored rows)
 * and the class-probability forward and backward (oss_cross_entropy_probs_*:
 * loss, lse and target_sum; the logits' and the target's gradients), which
 * share the thread mapping, row layout, statistics and reductions below and
 * have their own comment before cep_args.
 *
 * Thread mapping. A row is owned by a group of G threads: one warp (G = 32,
 * eight rows per CTA of 256 threads) when the row has at most
 * CE_WARP_MAX_CLASSES classes, else the whole CTA (G = blockDim.x, the
 * smallest power of two from 128 up that gives each thread at most
 * CE_VECS_PER_THREAD vectors, capped at 512 threads, or 1024 for forward +
 * backward). At the 64 registers a thread may use, an SM holds 1024 threads:
 * two 512-thread CTAs, so that one streams while the other is between rows
 * (its reduction, its first loads); for forward + backward one row per SM, so
 * that the rows in flight (132 on an H100: 33 MB of 128k bfloat16 classes)
 * stay in L2 for the second read. Groups walk the rows grid-stride (the
 * backward with a scale read on the device launches one wave of CTAs, which
 * all return at once where the scale is 1).
 * Inside a row, the elements before the first 16-byte boundary (the head) and
 * after the last whole 16-byte vector (the tail), fewer than 16 / sizeof(T)
 * each, are read one by one by the group's first threads; the 16-byte vectors
 * in between go to the group's threads round-robin (vector k to thread k mod
 * G), CE_UNROLL of them (2 for float64) loaded before any is used. So any row
 * stride and any element-aligned pointer take the vector path; no byte
 * outside a row is read or written.
 *
 * Forward, one pass per row: each thread keeps an exp shift m (its running
 * max, allowed to trail it by CE_SHIFT_SLACK so that it is rarely moved),
 * d = sum exp(x - m) (rescaled by exp(m_old - m_new) in double when m moves)
 * and the sum of x (for label smoothing). A batch's exp terms are summed in
 * the compute type (float, or double for float64) and added to d and the x
 * sum in double, as the CPU kernel's blocks are. The group then reduces the
 * shifts to their max first (no exp in the tree), each thread rescales its d
 * once to it and the d's and x sums are added in double (the max of 16-bit
 * logits taken in pairs on their raw bits, the x sum only with label
 * smoothing): warp shuffles, and
 * for CTA groups one shared-memory exchange per reduction. Every thread forms
 * lse = m + log d in double; the group's first thread forms the loss in
 * double, as the CPU kernel does, and writes both. The exp of 16-bit logits is
 * the hardware 2^x of (x - m) log2(e) (the subtraction first, so it is exact
 * near the shift); float32 and float64 logits use the accurate expf / exp.
 *
 * Backward, one pass per row reading x and writing grad_j = a exp((x - hi) -
 * lo) - s, with a = g (1 + 2 z lse), s = g eps / C and lse split into the
 * compute-type pair hi + lo (so x - hi is exact near the dominant class;
 * 16-bit logits take 2^((x - hi) log2(e) - lo log2(e)), one fused
 * multiply-add before the hardware 2^x); the
 * target element is recomputed in double from its own loaded value,
 * g ((p_t (1 + 2 z lse) - 1) + eps (1 - 1/C)), where p_t - 1 cancels.
 * Ignored rows are written as zeros without reading the logits. The gradient
 * is stored with 16-byte stores where its rows have the logits' 16-byte phase
 * (always for the contiguous gradient of contiguous logits, and in place),
 * element by element otherwise.
 * Forward + backward in one launch: on sm_90, rows of more than
 * CE_WARP_MAX_CLASSES classes up to 608 KB (float64 480 KB) run
 * ce_onchip_kernel (its own comment below), which holds the row in the
 * registers and shared memory of a CTA or a cluster and reads it once; elsewhere the forward's pass, the reduction,
 * then the backward's pass over the same row (read again, from L2 where the
 * rows in flight fit there).
 *
 * In place: grad_logits may be the logits themselves (same pointer and row
 * stride). Every element is read and then written by one thread; the one
 * element read by another thread, x_t for the forward's loss, is read before
 * the group's reduction, which orders it before any write of the second pass.
 * Other overlaps of the two are refused.
 *
 * Targets are not checked on the host (they live on the device and the entry
 * points never synchronise): a row whose target is neither ignore_index nor in
 * [0, classes) reads nothing outside its row, gets loss = NaN (its lse is
 * still written) and a gradient row of NaN.
 *
 * Results do not depend on the launch order: each row's reduction has a fixed
 * shape (butterfly shuffles, whose pairwise sums are symmetric), so they are
 * bitwise reproducible. Limits: classes <= INT32_MAX, pointers aligned to
 * their element size, rows unit-stride along the classes.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cooperative_groups.h>
#include <type_traits>

#include "cuda/common.cuh"

enum {
  CE_WARP_MAX_CLASSES = 2048,  /* rows up to this wide: a warp per row */
  CE_WARP_ROWS_THREADS = 256,  /* CTA size of the warp-per-row launch */
  CE_VECS_PER_THREAD = 16,     /* CTA per row: threads grow until each reads at most this many vectors */
  CE_MIN_THREADS = 128,
  CE_MAX_THREADS = 512,        /* forward or backward alone */
  CE_MAX_THREADS_FUSED = 1024, /* forward + backward (also the kernel's launch bound) */
  CE_UNROLL = 4,               /* vectors a thread loads before using them (float64: 2, its exp needs registers) */
  CE_SHIFT_SLACK = 8,          /* how far a thread's exp shift may trail its max (ce_stat) */
};

/* What a launch computes. */
enum { CE_FWD = 1, CE_BWD = 2, CE_FWD_BWD = 3 };

#define CE_LOG2E 1.4426950408889634

// ---- element types ---------------------------------------------------------

/* The compute type: float for float32/float16/bfloat16, double for float64. */
template <typename T> struct ce_acc { typedef float type; };
template <> struct ce_acc<double> { typedef double type; };

template <typename T> __host__ __device__ constexpr int ce_vec_len() { return 16 / (int)sizeof(T); }

template <typename T> __host__ __device__ constexpr int ce_unroll() { return sizeof(T) == 8 ? 2 : CE_UNROLL; }

template <typename A, typename B> struct ce_same { static constexpr bool value = false; };
template <typename A> struct ce_same<A, A> { static constexpr bool value = true; };

/* 16 bytes of a row, read or written as one vector. */
typedef union ce_vec {
  uint4 u;
  unsigned int w[4];
  unsigned short h[8];
  float f[4];
  double d[2];
} ce_vec;

__device__ __forceinline__ float ce_to_acc(float x) { return x; }
__device__ __forceinline__ double ce_to_acc(double x) { return x; }
__device__ __forceinline__ float ce_to_acc(__half x) { return __half2float(x); }
__device__ __forceinline__ float ce_to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T ce_from_acc(typename ce_acc<T>::type x);
template <> __device__ __forceinline__ double ce_from_acc<double>(double x) { return x; }
template <> __device__ __forceinline__ float ce_from_acc<float>(float x) { return x; }
template <> __device__ __forceinline__ __half ce_from_acc<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 ce_from_acc<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

/* Element e of a vector in the compute type (16-bit elements from their
 * 32-bit word, so that a vector stays four registers; bfloat16 by a shift or
 * a mask, exact). */
template <typename T> __device__ __forceinline__ typename ce_acc<T>::type ce_elem(const ce_vec &v, int e) {
  if constexpr (sizeof(T) == 8) return v.d[e];
  else if constexpr (sizeof(T) == 4) return v.f[e];
  else if constexpr (ce_same<T, __half>::value)
    return __half2float(__ushort_as_half((unsigned short)((e & 1) ? v.w[e >> 1] >> 16 : v.w[e >> 1] & 0xffffu)));
  else return __uint_as_float((e & 1) ? v.w[e >> 1] & 0xffff0000u : v.w[e >> 1] << 16);
}

/* Element e of a vector set to x, rounded to nearest even. */
template <typename T> __device__ __forceinline__ void ce_set(ce_vec &v, int e, typename ce_acc<T>::type x) {
  if constexpr (sizeof(T) == 8) v.d[e] = x;
  else if constexpr (sizeof(T) == 4) v.f[e] = x;
  else if constexpr (ce_same<T, __half>::value) v.h[e] = __half_as_ushort(__float2half_rn(x));
  else v.h[e] = __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

/* Elements 2w and 2w + 1 of a vector set to a and b, rounded to nearest
 * even (one conversion instruction for a pair of 16-bit values). */
template <typename T>
__device__ __forceinline__ void ce_set2(ce_vec &v, int w, typename ce_acc<T>::type a, typename ce_acc<T>::type b) {
  if constexpr (sizeof(T) == 2 && ce_same<T, __half>::value) {
    const __half2 h = __floats2half2_rn(a, b);
    v.w[w] = *reinterpret_cast<const unsigned int *>(&h);
  } else if constexpr (sizeof(T) == 2) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    v.w[w] = *reinterpret_cast<const unsigned int *>(&h);
  } else {
    ce_set<T>(v, 2 * w, a);
    ce_set<T>(v, 2 * w + 1, b);
  }
}

/* exp(x - ms) per element. FAST (16-bit logits): 2^((x - ms) log2(e)) by the
 * hardware (2 ulp), whose error is far below what 16-bit inputs and
 * gradients carry; the subtraction comes first so that it is exact for the
 * terms near the max. Else the accurate expf / exp. */
__device__ __forceinline__ float ce_ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
template <bool FAST> __device__ __forceinline__ float ce_exp_shift(float x, float ms) {
  return FAST ? ce_ex2((x - ms) * (float)CE_LOG2E) : expf(x - ms);
}
template <bool FAST> __device__ __forceinline__ double ce_exp_shift(double x, double ms) { return exp(x - ms); }

__device__ __forceinline__ float ce_max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double ce_max(double a, double b) { return fmax(a, b); }

/* The shift of the exponentials: the max, or 0 while it is -inf, so that
 * -inf - -inf never makes a NaN by itself. */
template <typename Acc> __device__ __forceinline__ Acc ce_safe(Acc m) { return m == (Acc)-INFINITY ? (Acc)0 : m; }

// ---- loads and stores --------------------------------------------------------

/* First-pass loads use the default policy; a load that is the element's last
 * use (the backward's pass) and the gradient's stores are marked streaming
 * (evict first), so they do not push the rows still to be re-read out of L2. */
__device__ __forceinline__ ce_vec ce_ld(const void *p) {
  ce_vec v;
  v.u = *(const uint4 *)p;
  return v;
}
__device__ __forceinline__ ce_vec ce_ld_last(const void *p) {
  ce_vec v;
  v.u = __ldcs((const uint4 *)p);
  return v;
}
__device__ __forceinline__ void ce_st(void *p, const ce_vec &v) { __stcs((uint4 *)p, v.u); }

// ---- a row's layout ------------------------------------------------------------

/* Elements [0, head) and [tail, C) are read one by one; the nvec vectors in
 * between start at element head, on a 16-byte boundary. */
typedef struct ce_row_layout {
  int head, nvec, tail;
} ce_row_layout;

template <typename T> __device__ __forceinline__ ce_row_layout ce_layout(const T *x, int C) {
  constexpr int VEC = ce_vec_len<T>();
  ce_row_layout L;
  const int mis = (int)(((uintptr_t)x & 15) / sizeof(T)); /* elements past the last boundary */
  L.head = mis == 0 ? 0 : (VEC - mis < C ? VEC - mis : C);
  L.nvec = (C - L.head) / VEC;
  L.tail = L.head + L.nvec * VEC;
  return L;
}

// ---- forward statistics ------------------------------------------------------------

/* A thread's statistics: the sum d of exp(x - ce_safe(m)) over the values it
 * has read and their plain sum. The shift m trails the max by at most
 * CE_SHIFT_SLACK: it moves (and d is rescaled, in double) only when a value
 * exceeds it by more, so after a thread's first values it rarely moves, and
 * the terms stay below e^CE_SHIFT_SLACK. After the reduction, m is the row's
 * shift and d its sum relative to it: lse = m + log d. */
template <typename Acc> struct ce_stat {
  Acc m;
  double d;
  double sx;
};

/* exp in double, out of line: the rescale below is rare (about once per
 * thread and row), and inlined its registers would be reserved in the loop
 * that holds the loaded vectors. */
__device__ __noinline__ double ce_exp_rare(double x) { return exp(x); }

/* Moves the shift to bm when bm exceeds it by more than the slack. -inf +
 * slack is -inf, so the first finite value sets it (no rescale: d is 0).
 * Returns whether it moved (the probability kernels rebase their sums then). */
template <typename Acc> __device__ __forceinline__ bool ce_move_shift(ce_stat<Acc> &st, Acc bm) {
  if (bm > st.m + (Acc)CE_SHIFT_SLACK) {
    if (st.m != (Acc)-INFINITY) st.d *= ce_exp_rare((double)st.m - (double)bm);
    st.m = bm;
    return true;
  }
  return false;
}

/* Adds one value to the statistics (the row's head and tail elements). The
 * max ignores NaN, so the shift is never NaN, but a NaN value makes d NaN
 * (its exp is NaN); +inf becomes the shift and its term exp(inf - inf) makes
 * d NaN too, as the CPU kernel's row; -inf adds 0 to d, and a thread that saw
 * only -inf keeps m = -inf and d = 0. */
template <bool FAST, typename Acc> __device__ __forceinline__ void ce_fold1(ce_stat<Acc> &st, Acc x) {
  ce_move_shift(st, x);
  st.d += (double)ce_exp_shift<FAST>(x, ce_safe(st.m));
  st.sx += (double)x;
}

/* An empty asm that "modifies" a vector: between the max and the sums it
 * keeps the compiler from holding the converted values of every vector
 * across both loops (twice the registers for 16-bit logits); the sums convert
 * again from the raw bits (a shift or a mask for bfloat16). */
__device__ __forceinline__ void ce_fence(ce_vec &v) {
  asm volatile("" : "+r"(v.w[0]), "+r"(v.w[1]), "+r"(v.w[2]), "+r"(v.w[3]));
}

/* The max of U vectors of T. 16-bit elements are compared in pairs on their
 * own bits (max over the raw values, then one conversion: the same result,
 * half the instructions); like fmaxf, a NaN loses to any other value. */
template <typename T, int U, typename Acc> __device__ __forceinline__ Acc ce_vecs_max(const ce_vec (&v)[U]) {
  constexpr int VEC = ce_vec_len<T>();
  if constexpr (sizeof(T) == 2) {
    typedef typename std::conditional<ce_same<T, __half>::value, __half2, __nv_bfloat162>::type T2;
    T2 m2[4];
#pragma unroll
    for (int w = 0; w < 4; w++) m2[w] = *reinterpret_cast<const T2 *>(&v[0].w[w]);
#pragma unroll
    for (int k = 1; k < U; k++)
#pragma unroll
      for (int w = 0; w < 4; w++) m2[w] = __hmax2(m2[w], *reinterpret_cast<const T2 *>(&v[k].w[w]));
    const T2 m = __hmax2(__hmax2(m2[0], m2[1]), __hmax2(m2[2], m2[3]));
    return fmaxf(ce_to_acc(m.x), ce_to_acc(m.y));
  } else {
    Acc bm[2] = {(Acc)-INFINITY, (Acc)-INFINITY};
#pragma unroll
    for (int k = 0; k < U; k++)
#pragma unroll
      for (int e = 0; e < VEC; e++) bm[e & 1] = ce_max(bm[e & 1], ce_elem<T>(v[k], e));
    return ce_max(bm[0], bm[1]);
  }
}

/* Adds U vectors of T to the statistics: the shift first (from their max),
 * then their exp terms and (SUM_X, for label smoothing) their sum, each
 * summed in Acc and added in double. Special values as in ce_fold1. */
template <bool FAST, bool SUM_X, typename T, int U, typename Acc>
__device__ __forceinline__ void ce_fold_vecs(ce_stat<Acc> &st, ce_vec (&v)[U]) {
  constexpr int VEC = ce_vec_len<T>();
  ce_move_shift(st, ce_vecs_max<T, U, Acc>(v));
  const Acc ms = ce_safe(st.m);
  Acc s[2] = {0, 0}, sx[2] = {0, 0};
#pragma unroll
  for (int k = 0; k < U; k++) {
    ce_fence(v[k]);
#pragma unroll
    for (int e = 0; e < VEC; e++) {
      const Acc x = ce_elem<T>(v[k], e);
      s[e & 1] += ce_exp_shift<FAST>(x, ms);
      if constexpr (SUM_X) sx[e & 1] += x;
    }
  }
  st.d += (double)(s[0] + s[1]);
  if constexpr (SUM_X) st.sx += (double)(sx[0] + sx[1]);
}

/* The statistics of the row elements a thread owns (thread `lane` of G). */
template <bool FAST, bool SUM_X, typename T, typename Acc>
__device__ __forceinline__ ce_stat<Acc> ce_thread_stats(const T *x, const ce_row_layout &L, int C, int lane, int G) {
  constexpr int U = ce_unroll<T>();
  ce_stat<Acc> st;
  st.m = (Acc)-INFINITY;
  st.d = 0;
  st.sx = 0;
  if (lane < L.head) ce_fold1<FAST>(st, ce_to_acc(x[lane]));
  if (lane < C - L.tail) ce_fold1<FAST>(st, ce_to_acc(x[L.tail + lane]));
  const ce_vec *xv = (const ce_vec *)(x + L.head);
  int k = lane;
  for (; k + (U - 1) * G < L.nvec; k += U * G) {
    ce_vec v[U];
#pragma unroll
    for (int u = 0; u < U; u++) v[u] = ce_ld(xv + k + u * G);
    ce_fold_vecs<FAST, SUM_X, T>(st, v);
  }
  for (; k < L.nvec; k += G) {
    ce_vec v[1] = {ce_ld(xv + k)};
    ce_fold_vecs<FAST, SUM_X, T>(st, v);
  }
  return st;
}

// ---- group reductions ------------------------------------------------------------------

/* Butterfly reductions over a warp: every lane ends with the same value, and
 * since each step combines the same two operands on both lanes (max and +
 * are symmetric), bitwise the same. */
template <typename Acc> __device__ __forceinline__ Acc ce_warp_max(Acc m) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) m = ce_max(m, __shfl_xor_sync(0xffffffffu, m, off));
  return m;
}
/* N sums at once, interleaved step by step (one shuffle latency per step for all). */
template <int N> __device__ __forceinline__ void ce_warp_sum(double (&v)[N]) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
#pragma unroll
    for (int i = 0; i < N; i++) v[i] += __shfl_xor_sync(0xffffffffu, v[i], off);
}
__device__ __forceinline__ void ce_warp_sum2(double &a, double &b) {
  double v[2] = {a, b};
  ce_warp_sum(v);
  a = v[0];
  b = v[1];
}

/* Shared memory of a CTA group's two exchanges (one slot per warp): the max,
 * then N sums. */
template <typename Acc, int N = 2> struct ce_smem {
  Acc m[32];
  double s[N][32];
};

/* The two halves of a group's reduction, every thread of the group ending
 * with the result. A CTA group exchanges warp partials through shared memory
 * with one barrier per reduction: a warp reads the max slots before the
 * barrier of the sums, and the sum slots before the next row's first one, so
 * nothing is overwritten while still being read. The max's barrier is also
 * the group's memory barrier: every read of the first pass is ordered before
 * every write after it. */
template <typename Acc> __device__ __forceinline__ Acc ce_group_max(Acc m, int G, Acc (&slots)[32]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  m = ce_warp_max(m);
  if (G > 32) {
    if (lane == 0) slots[warp] = m;
    __syncthreads();
    m = ce_warp_max(lane < nwarps ? slots[lane] : (Acc)-INFINITY);
  } else {
    __syncwarp();
  }
  return m;
}
template <int N> __device__ __forceinline__ void ce_group_sum(double (&v)[N], int G, double (&slots)[N][32]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  ce_warp_sum(v);
  if (G > 32) {
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < N; i++) slots[i][warp] = v[i];
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < N; i++) v[i] = lane < nwarps ? slots[i][lane] : 0.0;
    ce_warp_sum(v);
  }
}

/* The row's statistics on every thread of the group: the max of the shifts
 * first, then each thread's d rescaled once to it, then the d's and x sums
 * added. */
template <typename Acc>
__device__ __forceinline__ ce_stat<Acc> ce_group_reduce(ce_stat<Acc> st, int G, ce_smem<Acc> *sh) {
  const Acc m = ce_group_max(st.m, G, sh->m);
  /* this thread's d to the row's shift (0 when it read only -inf, or nothing) */
  double v[2] = {st.m == (Acc)-INFINITY ? 0.0 : st.d * exp((double)st.m - (double)ce_safe(m)), st.sx};
  ce_group_sum(v, G, sh->s);
  ce_stat<Acc> r;
  r.m = m;
  r.d = v[0];
  r.sx = v[1];
  return r;
}

// ---- backward pass ------------------------------------------------------------------------

/* What a row's gradient pass needs. */
template <typename Acc> struct ce_grad_row {
  Acc a, s, hi, lo; /* grad = a exp((x - hi) - lo) - s */
  Acc lo2;          /* lo log2(e), for the 16-bit logits' 2^x */
  int t;            /* the target column, or -1 (no element is special) */
  double g, lse, scale, smooth; /* the target element, in double */
};

template <typename Acc>
__device__ __forceinline__ ce_grad_row<Acc> ce_grad_setup(double g, double lse, int64_t t, bool valid, double eps,
                                                          double z, int C) {
  ce_grad_row<Acc> R;
  R.scale = 1 + 2 * z * lse;
  R.a = valid ? (Acc)(g * R.scale) : (Acc)NAN; /* an invalid target: a row of NaN */
  R.s = valid ? (Acc)(g * eps / (double)C) : (Acc)NAN;
  R.hi = (Acc)lse;
  R.lo = isfinite(lse) ? (Acc)(lse - (double)R.hi) : (Acc)0;
  R.lo2 = (Acc)((double)R.lo * CE_LOG2E);
  R.t = valid && t >= 0 && t < C ? (int)t : -1;
  R.g = g;
  R.lse = lse;
  R.smooth = eps * (1 - 1 / (double)C);
  return R;
}

/* softmax_j = exp(x_j - lse), in Acc. */
template <bool FAST, typename Acc> __device__ __forceinline__ Acc ce_grad_exp(const ce_grad_row<Acc> &R, Acc x) {
  if constexpr (FAST && sizeof(Acc) == 4) return ce_ex2(fmaf(x - R.hi, (float)CE_LOG2E, -R.lo2)); /* x - hi exact */
  else if constexpr (sizeof(Acc) == 4) return expf((x - R.hi) - R.lo);
  else return exp((x - R.hi) - R.lo);
}

/* The gradient of an element other than the target, in Acc. */
template <bool FAST, typename Acc> __device__ __forceinline__ Acc ce_grad_elem(const ce_grad_row<Acc> &R, Acc x) {
  return R.a * ce_grad_exp<FAST>(R, x) - R.s;
}

/* The target element's gradient, in double from its value x. */
template <typename Acc> __device__ __forceinline__ Acc ce_grad_target(const ce_grad_row<Acc> &R, Acc x) {
  return (Acc)(R.g * ((exp((double)x - R.lse) * R.scale - 1) + R.smooth));
}

/* The thread of the group that owns element j (ce_row_layout). */
__device__ __forceinline__ int ce_owner(const ce_row_layout &L, int j, int vec, int G) {
  return j < L.head ? j : j >= L.tail ? j - L.tail : ((j - L.head) / vec) % G;
}

/* Writes the gradient of the elements a thread owns. zero: an ignored row,
 * written as zeros without reading x. Every element first gets the Acc
 * formula; then the target's owner, which read x_t before its own writes,
 * overwrites it with the value computed in double (so the loop has no
 * per-element test). The gradient goes out in 16-byte stores where y's rows
 * have x's 16-byte boundaries, element by element otherwise. */
template <bool FAST, typename T, typename Acc>
__device__ __forceinline__ void ce_thread_grad(const T *x, T *y, const ce_row_layout &L, int C, int lane, int G,
                                               const ce_grad_row<Acc> &R, bool zero) {
  constexpr int VEC = ce_vec_len<T>(), U = ce_unroll<T>();
  const bool own_t = !zero && R.t >= 0 && lane == ce_owner(L, R.t, VEC, G);
  const Acc xt = own_t ? ce_to_acc(x[R.t]) : (Acc)0;
  const bool vec_out = (((uintptr_t)(y + L.head)) & 15) == 0;
  if (lane < L.head) y[lane] = ce_from_acc<T>(zero ? (Acc)0 : ce_grad_elem<FAST>(R, ce_to_acc(x[lane])));
  if (lane < C - L.tail) {
    const int j = L.tail + lane;
    y[j] = ce_from_acc<T>(zero ? (Acc)0 : ce_grad_elem<FAST>(R, ce_to_acc(x[j])));
  }
  const ce_vec *xv = (const ce_vec *)(x + L.head);
  T *y0 = y + L.head;
  for (int k = lane; k < L.nvec; k += U * G) {
    ce_vec v[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int kk = k + u * G;
      if (kk < L.nvec) {
        if (zero) v[u].u = make_uint4(0, 0, 0, 0);
        else v[u] = ce_ld_last(xv + kk);
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int kk = k + u * G;
      if (kk < L.nvec) {
        if (!zero) {
#pragma unroll
          for (int e = 0; e < VEC; e++) ce_set<T>(v[u], e, ce_grad_elem<FAST>(R, ce_elem<T>(v[u], e)));
        }
        if (vec_out) {
          ce_st(y0 + (int64_t)kk * VEC, v[u]);
        } else {
#pragma unroll
          for (int e = 0; e < VEC; e++) y0[(int64_t)kk * VEC + e] = ce_from_acc<T>(ce_elem<T>(v[u], e));
        }
      }
    }
  }
  if (own_t) y[R.t] = ce_from_acc<T>(ce_grad_target(R, xt));
}

// ---- the kernel --------------------------------------------------------------------------

typedef struct ce_args {
  const void *x;
  int64_t x_stride;
  void *y; /* gradient (CE_BWD) */
  int64_t y_stride;
  const int64_t *target;
  int64_t ignore_index;
  int64_t rows;
  int classes;
  int group; /* threads per row: 32, or blockDim.x */
  double eps, z;
  void *loss;           /* float32, or float64 for float64 logits (CE_FWD) */
  double *lse;          /* written (CE_FWD) or read (CE_BWD alone) */
  const void *grad_loss; /* loss's dtype (CE_BWD) */
  const void *grad_scale; /* NULL, or grad_loss's multiplier, nothing written where it is 1 (CE_BWD alone) */
  int cluster;             /* ce_onchip_kernel: CTAs per row */
  int chunk_vecs;          /* ce_onchip_kernel: vectors per CTA (the last CTA of a row may hold fewer) */
} ce_args;

/* A row's loss (formed in double, rounded once to its dtype) and lse from
 * its statistics: NaN for an invalid target, 0 for an ignored row. */
template <bool F64, typename Acc>
__device__ __forceinline__ void ce_write_loss(const ce_args &A, int64_t row, int C, double lse, double sx, Acc xt,
                                              bool valid, bool ignored) {
  double loss = 0;
  if (!valid) {
    loss = NAN;
  } else if (!ignored) {
    loss = (1 - A.eps) * (lse - (double)xt);
    if (A.eps != 0) loss += A.eps * (lse - sx / (double)C);
    if (A.z != 0) loss += A.z * lse * lse;
  }
  if constexpr (F64) ((double *)A.loss)[row] = loss;
  else ((float *)A.loss)[row] = (float)loss;
  A.lse[row] = lse;
}

/* The backward's upstream multiplier (ce_args.grad_scale), in the loss's dtype. */
template <bool F64> __device__ __forceinline__ double ce_grad_scale(const void *p) {
  return F64 ? *(const double *)p : (double)*(const float *)p;
}

template <typename T, int MODE> __global__ void __launch_bounds__(CE_MAX_THREADS_FUSED) ce_kernel(ce_args A) {
  typedef typename ce_acc<T>::type Acc;
  constexpr bool FAST = sizeof(T) == 2;
  constexpr bool F64 = sizeof(T) == 8;
  __shared__ ce_smem<Acc> sh;
  if constexpr (MODE == CE_BWD) {
    if (A.grad_scale != NULL && ce_grad_scale<F64>(A.grad_scale) == 1) return; /* y already holds this gradient */
  }
  const int G = A.group, C = A.classes;
  const int lane = (int)(threadIdx.x % (unsigned)G);
  const int groups = (int)(blockDim.x / (unsigned)G);
  for (int64_t row = (int64_t)blockIdx.x * groups + threadIdx.x / (unsigned)G; row < A.rows;
       row += (int64_t)gridDim.x * groups) {
    const T *x = (const T *)A.x + row * A.x_stride;
    const ce_row_layout L = ce_layout(x, C);
    const int64_t t = A.target[row];
    const bool ignored = t == A.ignore_index;
    const bool valid = ignored || (t >= 0 && t < C);
    double lse;
    if constexpr ((MODE & CE_FWD) != 0) {
      /* x_t, read before the reduction (in place, its owner overwrites it after) */
      Acc xt = 0;
      if (lane == 0 && !ignored && valid) xt = ce_to_acc(x[t]);
      ce_stat<Acc> st = A.eps != 0 ? ce_thread_stats<FAST, true, T, Acc>(x, L, C, lane, G)
                                   : ce_thread_stats<FAST, false, T, Acc>(x, L, C, lane, G);
      st = ce_group_reduce(st, G, &sh);
      lse = (double)st.m + log(st.d);
      if (lane == 0) ce_write_loss<F64>(A, row, C, lse, st.sx, xt, valid, ignored);
    } else {
      lse = A.lse[row];
    }
    if constexpr ((MODE & CE_BWD) != 0) {
      double g = ignored ? 0.0
                 : F64   ? ((const double *)A.grad_loss)[row]
                         : (double)((const float *)A.grad_loss)[row];
      /* (the product in the loss's dtype, as the CPU kernel forms it) */
      if (A.grad_scale != NULL)
        g = F64 ? g * ce_grad_scale<F64>(A.grad_scale) : (double)((float)g * (float)ce_grad_scale<F64>(A.grad_scale));
      const ce_grad_row<Acc> R = ce_grad_setup<Acc>(g, lse, t, valid, A.eps, A.z, C);
      ce_thread_grad<FAST, T, Acc>(x, (T *)A.y + row * A.y_stride, L, C, lane, G, R, ignored);
    }
  }
}

// ---- forward + backward with the row on chip (sm_90) ------------------------------------

/* The fused pass reading each logit from DRAM once. A row's 16-byte vectors
 * are split into chunks of `chunk_vecs`, one per CTA of a cluster of
 * `cluster` CTAs (a lone CTA for rows up to CE_ONCHIP_LARGE_SMEM plus its
 * register part). Of a CTA's chunk, the first blockDim.x x S vectors (S =
 * ce_onchip_slots) stay in registers: thread i holds vectors i, i +
 * blockDim.x, ..., in static slots loaded with plain loads; the rest is copied
 * into shared memory, where thread i owns vectors i, i + blockDim.x, ... too.
 * A lone CTA copies it with one bulk copy completing on an mbarrier; the CTAs
 * of a cluster copy it per thread with cp.async (each thread later reads only
 * what it copied itself, so its own wait orders the reads). Registers take
 * the part of the row that shared memory would otherwise cap: with 64
 * registers a thread, an SM then holds four 256-thread CTAs of up to 76 KB
 * (24 KB in registers, 52 KB in shared memory) or two 512-thread CTAs of up to
 * 148 KB, so a row is in flight on fewer, larger CTAs than shared memory alone
 * allows, with more bytes in flight per SM.
 * The chunk's statistics are the forward's (ce_fold_vecs, ce_group_reduce);
 * the CTAs of a cluster then write theirs into every CTA's shared memory and
 * each merges them in rank order (the same bits everywhere). The gradient
 * pass reads the vectors again from registers and shared memory and writes the
 * gradient, so nothing is read twice from DRAM, and in place needs no ordering
 * beyond the exchange. Head and tail elements go to the first threads of the
 * first and last CTAs (kept in shared memory for the gradient pass); x_t is
 * read by thread 0 of every CTA before the exchange, for the loss (rank 0)
 * and for the target's gradient, formed in double and written over the
 * formula's value by the thread that wrote the target's vector. One cluster per row (grid.x =
 * rows x cluster). Limits: chunks up to 256 x S vectors plus
 * CE_ONCHIP_SMALL_SMEM in clusters of up to CE_ONCHIP_MAX_CLUSTER CTAs (608 KB
 * rows; float64 480 KB), rows x cluster < 2^31. */
enum {
  CE_ONCHIP_SMALL_THREADS = 256,       /* a CTA of at most this many threads ... */
  CE_ONCHIP_SMALL_SMEM = 52 * 1024,    /* ... and this much shared memory: four per SM */
  CE_ONCHIP_LARGE_THREADS = 512,       /* a lone CTA of this many threads ... */
  CE_ONCHIP_LARGE_SMEM = 100 * 1024,   /* ... and up to this much shared memory: two per SM */
  CE_ONCHIP_MAX_CLUSTER = 8,           /* the portable cluster size */
  CE_ONCHIP_VECS_PER_THREAD = 16,      /* small rows: threads grow from 128 until each holds at most this many */
};

/* Register vectors per thread: six 16-byte vectors fit 64 registers next to
 * the statistics and the shared-memory loop's four in flight (seven measured
 * no faster, eight spill); float64's exp needs more registers: two. */
template <typename T> __host__ __device__ constexpr int ce_onchip_slots() { return sizeof(T) == 8 ? 2 : 6; }

/* A CTA's chunk statistics (its n vectors in shared memory). */
template <bool FAST, bool SUM_X, typename T, int U, typename Acc>
__device__ __forceinline__ void ce_chunk_stats(ce_stat<Acc> &st, const ce_vec *chunk, int n) {
  const int tid = threadIdx.x, nt = blockDim.x;
  int k = tid;
  for (; k + (U - 1) * nt < n; k += U * nt) {
    ce_vec v[U];
#pragma unroll
    for (int u = 0; u < U; u++) v[u] = chunk[k + u * nt];
    ce_fold_vecs<FAST, SUM_X, T>(st, v);
  }
  for (; k < n; k += nt) {
    ce_vec v[1] = {chunk[k]};
    ce_fold_vecs<FAST, SUM_X, T>(st, v);
  }
}

/* The register slots' statistics: all S at once where the thread holds S
 * vectors, one by one otherwise (the last CTA of a row, small rows). */
template <bool FAST, bool SUM_X, typename T, int S, typename Acc>
__device__ __forceinline__ void ce_slot_stats(ce_stat<Acc> &st, ce_vec (&r)[S], int held) {
  if (held == S) {
    ce_fold_vecs<FAST, SUM_X, T>(st, r);
  } else {
#pragma unroll
    for (int s = 0; s < S; s++) {
      if (s < held) {
        ce_vec v[1] = {r[s]};
        ce_fold_vecs<FAST, SUM_X, T>(st, v);
      }
    }
  }
}

/* Where a CTA's chunk lies in its row. Read from the special registers again
 * where it is needed (volatile moves), so that the compiler recomputes it
 * instead of holding it across the loops next to the register slots. */
typedef struct ce_chunk_place {
  int rank;    /* the CTA's rank in its cluster */
  int64_t row; /* the cluster's row */
} ce_chunk_place;

__device__ __forceinline__ ce_chunk_place ce_onchip_locate() {
  unsigned rank, row;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  asm volatile("mov.u32 %0, %%clusterid.x;\n" : "=r"(row));
  ce_chunk_place p;
  p.rank = (int)rank;
  p.row = (int64_t)row;
  return p;
}

/* The gradient of one vector of logits, written at dst (16-byte stores where
 * the gradient row has the logits' 16-byte phase, element by element
 * otherwise). */
template <bool FAST, typename T, typename Acc>
__device__ __forceinline__ void ce_grad_vec(const ce_grad_row<Acc> &R, const ce_vec &xv, T *dst, bool zero,
                                            bool vec_out) {
  constexpr int VEC = ce_vec_len<T>();
  ce_vec v;
  if (zero) {
    v.u = make_uint4(0, 0, 0, 0);
  } else {
#pragma unroll
    for (int e = 0; e < VEC; e += 2)
      ce_set2<T>(v, e >> 1, ce_grad_elem<FAST>(R, ce_elem<T>(xv, e)), ce_grad_elem<FAST>(R, ce_elem<T>(xv, e + 1)));
  }
  if (vec_out) {
    ce_st(dst, v);
  } else {
#pragma unroll
    for (int e = 0; e < VEC; e++) dst[e] = ce_from_acc<T>(ce_elem<T>(v, e));
  }
}

template <typename T>
__global__ void __launch_bounds__(CE_ONCHIP_LARGE_THREADS, 2) ce_onchip_kernel(ce_args A) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  typedef typename ce_acc<T>::type Acc;
  constexpr bool FAST = sizeof(T) == 2;
  constexpr bool F64 = sizeof(T) == 8;
  constexpr int VEC = ce_vec_len<T>(), S = ce_onchip_slots<T>();
  /* vectors in flight in the shared-memory loop: float16 takes two, its
   * conversions need the registers that four would (they spill next to the
   * slots) */
  constexpr int SU = ce_same<T, __half>::value ? 2 : ce_unroll<T>();
  extern __shared__ __align__(16) ce_vec ce_chunk[];
  __shared__ uint64_t loaded; /* the mbarrier of a lone CTA's bulk copy */
  __shared__ ce_smem<Acc> sh;
  __shared__ ce_stat<Acc> xch[CE_ONCHIP_MAX_CLUSTER]; /* every rank's statistics */
  __shared__ ce_stat<Acc> merged;
  __shared__ Acc x_target;      /* x_t, for the loss */
  __shared__ Acc x_edge[2][8];  /* the row's head and tail elements */
  const int tid = threadIdx.x, nt = blockDim.x, CR = A.cluster, C = A.classes;
  /* every CTA of the cluster must be running before its shared memory is
   * written: arrive now, wait just before the exchange */
  if (CR > 1) asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");

  ce_chunk_place P = ce_onchip_locate();
  const T *x = (const T *)A.x + P.row * A.x_stride;
  ce_row_layout L = ce_layout(x, C);
  int v0 = min(P.rank * A.chunk_vecs, L.nvec);
  int n = min(A.chunk_vecs, L.nvec - v0); /* this CTA's vectors: registers first, then shared memory */
  const int ns = n - min(n, nt * S);      /* in shared memory */
  const ce_vec *xv = (const ce_vec *)(x + L.head) + v0;
  if (CR == 1) {
    if (tid == 0) {
      oss_mbar_init(&loaded, 1);
      oss_fence_mbar_init();
      if (ns > 0) {
        oss_mbar_arrive_expect_tx(&loaded, (uint32_t)ns * 16u);
        oss_bulk_load(oss_smem_u32(ce_chunk), xv + nt * S, (uint32_t)ns * 16u, &loaded);
      }
    }
  } else {
    for (int k = tid; k < ns; k += nt) oss_cp_async16(oss_smem_u32(ce_chunk + k), xv + nt * S + k, 16);
    oss_cp_async_commit();
  }
  ce_vec r[S];
  const int held = n <= tid ? 0 : min(S, (n - tid + nt - 1) / nt); /* register slots this thread fills */
#pragma unroll
  for (int s = 0; s < S; s++)
    if (s < held) r[s] = ce_ld(xv + tid + s * nt);

  const int64_t t = A.target[P.row];
  const bool ignored = t == A.ignore_index;
  const bool valid = ignored || (t >= 0 && t < C);
  /* x_t, read by every CTA before the exchange (in place, its owner
   * overwrites it after): rank 0 forms the loss, the owner its gradient */
  if (tid == 0) x_target = !ignored && valid ? ce_to_acc(x[t]) : (Acc)0;
  ce_stat<Acc> st;
  st.m = (Acc)-INFINITY;
  st.d = 0;
  st.sx = 0;
  if (P.rank == 0 && tid < L.head) {
    const Acc xh = ce_to_acc(x[tid]);
    x_edge[0][tid] = xh;
    ce_fold1<FAST>(st, xh);
  }
  if (P.rank == CR - 1 && tid < C - L.tail) {
    const Acc xe = ce_to_acc(x[L.tail + tid]);
    x_edge[1][tid] = xe;
    ce_fold1<FAST>(st, xe);
  }
  if (A.eps != 0) ce_slot_stats<FAST, true, T>(st, r, held);
  else ce_slot_stats<FAST, false, T>(st, r, held);
  if (CR == 1) {
    __syncthreads(); /* the mbarrier is initialised before anyone waits on it */
    if (ns > 0) oss_mbar_wait(&loaded, 0);
  } else {
    oss_cp_async_wait<0>();
    asm volatile("" ::: "memory"); /* this thread's reads of its copied vectors stay after the wait */
  }
  if (A.eps != 0) ce_chunk_stats<FAST, true, T, SU>(st, ce_chunk, ns);
  else ce_chunk_stats<FAST, false, T, SU>(st, ce_chunk, ns);
  st = ce_group_reduce(st, nt, &sh);
  if (CR > 1) {
    cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
    const int rank = ce_onchip_locate().rank;
    if (tid < CR) *cl.map_shared_rank(&xch[rank], (unsigned)tid) = st;
    cl.sync();
    if (tid < 32) {
      /* the ranks' statistics merged as ce_group_reduce merges threads' */
      ce_stat<Acc> q;
      q.m = (Acc)-INFINITY;
      q.d = 0;
      q.sx = 0;
      if (tid < CR) q = xch[tid];
      const Acc m = ce_warp_max(q.m);
      double d = q.m == (Acc)-INFINITY ? 0.0 : q.d * exp((double)q.m - (double)ce_safe(m));
      double sx = q.sx;
      ce_warp_sum2(d, sx);
      if (tid == 0) {
        merged.m = m;
        merged.d = d;
        merged.sx = sx;
      }
    }
    __syncthreads();
    st = merged;
  }
  P = ce_onchip_locate();
  const double lse = (double)st.m + log(st.d);
  if (P.rank == 0 && tid == 0) ce_write_loss<F64>(A, P.row, C, lse, st.sx, x_target, valid, ignored);

  /* the gradient: every element by the Acc formula, then the target's, in
   * double, over it by the thread that stored its vector */
  const double g = ignored ? 0.0
                   : F64   ? ((const double *)A.grad_loss)[P.row]
                           : (double)((const float *)A.grad_loss)[P.row];
  const ce_grad_row<Acc> R = ce_grad_setup<Acc>(g, lse, t, valid, A.eps, A.z, C);
  x = (const T *)A.x + P.row * A.x_stride;
  L = ce_layout(x, C);
  v0 = min(P.rank * A.chunk_vecs, L.nvec);
  n = min(A.chunk_vecs, L.nvec - v0);
  T *y = (T *)A.y + P.row * A.y_stride;
  if (P.rank == 0 && tid < L.head) {
    const Acc xh = x_edge[0][tid];
    y[tid] = ce_from_acc<T>(ignored ? (Acc)0 : ce_grad_elem<FAST>(R, xh));
  }
  if (P.rank == CR - 1 && tid < C - L.tail) {
    const Acc xe = x_edge[1][tid];
    y[L.tail + tid] = ce_from_acc<T>(ignored ? (Acc)0 : ce_grad_elem<FAST>(R, xe));
  }
  const bool vec_out = (((uintptr_t)(y + L.head)) & 15) == 0;
  T *y0 = y + L.head + (int64_t)v0 * VEC;
#pragma unroll
  for (int s = 0; s < S; s++)
    if (s < held) ce_grad_vec<FAST, T>(R, r[s], y0 + (int64_t)(tid + s * nt) * VEC, ignored, vec_out);
  T *ys = y0 + (int64_t)nt * S * VEC;
#pragma unroll 4
  for (int k = tid; k < ns; k += nt) ce_grad_vec<FAST, T>(R, ce_chunk[k], ys + (int64_t)k * VEC, ignored, vec_out);
  /* the target's element, owned by the thread that wrote its vector (or
   * its head / tail element) */
  bool own = false;
  if (!ignored && R.t >= 0) {
    if (R.t < L.head) {
      own = P.rank == 0 && tid == R.t;
    } else if (R.t >= L.tail) {
      own = P.rank == CR - 1 && tid == R.t - L.tail;
    } else {
      const int k = (R.t - L.head) / VEC - v0; /* the target's vector in this chunk (nt x S is a multiple of nt) */
      own = k >= 0 && k < n && k % nt == tid;
    }
  }
  if (own) y[R.t] = ce_from_acc<T>(ce_grad_target(R, x_target));
#else
  __trap(); /* launched only on sm_90 and later (ce_onchip_plan) */
#endif
}

// ---- class probabilities (oss.h: oss_cross_entropy_probs_*) ---------------------------

/* The probability kernels take the class-index kernels' thread mapping (a
 * warp per row up to CE_WARP_MAX_CLASSES classes, else a CTA of 128 to 512
 * threads, ce_shape), row layout (ce_row_layout: head, 16-byte vectors
 * round-robin, tail), exp shift with slack and group reductions. The target
 * row is read at the logits' element indices: as 16-byte vectors where it has
 * the logits' 16-byte phase, element by element otherwise (the weights, if
 * any, always element by element: C values that every row shares, from L1/L2).
 *
 * Forward, one pass: each thread keeps the exp shift m and d of the
 * class-index forward, plus a = sum u (x - ce_safe(m)) and s = sum u, u =
 * w (c1 t + c0), c1 = 1 - eps, c0 = eps / C; a batch's terms are summed in Acc
 * and added in double. When the shift moves (rarely, CE_SHIFT_SLACK), a gains
 * s (m_old - m_new): every earlier term rebased at once. The group reduces
 * the shifts to their max, rebases each thread's d and a to it, and adds d,
 * a and s in double. loss = s log d - a + z lse^2: both terms are >= 0 for
 * u >= 0, so nothing cancels at large logits (the textbook s lse - sum u x
 * would lose every digit at lse = 1e4). A u of 0 at x = -inf makes a NaN (0 *
 * -inf), F.cross_entropy's NaN.
 * Backward, one pass: grad_x = g ((S p - u) + 2 z lse p), p = exp((x - hi) -
 * lo) (ce_grad_exp, lse split as there), u formed as the forward formed it
 * (cep_grad_elem says why), and, where wanted, grad_t = g (1 - eps) w
 * ((hi - x) + lo). Both gradients go out as 16-byte vectors where their rows have the
 * logits' phase. Limits: those of the class-index kernels; the gradients may
 * not overlap the inputs. */
typedef struct cep_args {
  const void *x;
  int64_t x_stride;
  const void *t;
  int64_t t_stride;
  const void *w; /* NULL or [C] in Acc */
  void *y;       /* grad_x (backward) */
  int64_t y_stride;
  void *gt; /* grad_t (backward, CEP_DT) */
  int64_t gt_stride;
  int64_t rows;
  int classes;
  int group;
  double eps, z;
  void *loss;            /* forward */
  double *lse, *tsum;    /* written by the forward, read by the backward */
  const void *grad_loss; /* backward */
} cep_args;

/* Vectors of the logits (and as many of the target) a thread loads before
 * using them: half the class-index kernels' (ce_unroll), so the bytes in
 * flight are theirs; at their count the target's vectors spill at the 64
 * registers of two 512-thread CTAs an SM. */
template <typename T> __host__ __device__ constexpr int cep_unroll() { return ce_unroll<T>() / 2; }

/* A thread's statistics: the forward's (m, d) and the target sums a and s. */
template <typename Acc> struct cep_stat {
  ce_stat<Acc> e; /* e.sx unused */
  double a, s;
};

/* VEC elements of T from p, one by one (a row whose 16-byte phase is not the
 * logits'), as a vector. */
template <typename T> __device__ __forceinline__ ce_vec cep_ld_elems(const T *p) {
  ce_vec v;
  if constexpr (sizeof(T) == 8) {
    v.d[0] = ((const double *)p)[0];
    v.d[1] = ((const double *)p)[1];
  } else if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int e = 0; e < 4; e++) v.f[e] = ((const float *)p)[e];
  } else {
#pragma unroll
    for (int e = 0; e < 8; e++) v.h[e] = ((const unsigned short *)p)[e];
  }
  return v;
}

/* Vector k of a row's vector part: x's (aligned), t's (aligned where
 * t_vec). LAST: the element's last use (the backward). */
template <bool LAST, typename T>
__device__ __forceinline__ void cep_ld(ce_vec &xv, ce_vec &tv, const T *x0, const T *t0, int k, bool t_vec) {
  constexpr int VEC = ce_vec_len<T>();
  xv = LAST ? ce_ld_last(x0 + (int64_t)k * VEC) : ce_ld(x0 + (int64_t)k * VEC);
  if (t_vec) tv = LAST ? ce_ld_last(t0 + (int64_t)k * VEC) : ce_ld(t0 + (int64_t)k * VEC);
  else tv = cep_ld_elems(t0 + (int64_t)k * VEC);
}

/* u = w (c1 t + c0) of element j (W: weighted). */
template <bool W, typename Acc>
__device__ __forceinline__ Acc cep_u(Acc t, const Acc *w, int j, Acc c1, Acc c0) {
  const Acc u = c1 * t + c0;
  if constexpr (W) return u * __ldg(w + j);
  else return u;
}

/* Moves the shift (ce_move_shift) and rebases a with it. */
template <typename Acc> __device__ __forceinline__ void cep_move_shift(cep_stat<Acc> &st, Acc bm) {
  const Acc old = ce_safe(st.e.m);
  if (ce_move_shift(st.e, bm)) st.a += st.s * ((double)old - (double)bm);
}

/* Adds one element (head and tail). */
template <bool FAST, bool W, typename Acc>
__device__ __forceinline__ void cep_fold1(cep_stat<Acc> &st, Acc x, Acc t, const Acc *w, int j, Acc c1, Acc c0) {
  cep_move_shift(st, x);
  const Acc ms = ce_safe(st.e.m), u = cep_u<W>(t, w, j, c1, c0);
  st.e.d += (double)ce_exp_shift<FAST>(x, ms);
  st.a += (double)(u * (x - ms));
  st.s += (double)u;
}

/* Adds U vectors: x's max moves the shift, then the exp terms, u (x - ms)
 * and u, summed in Acc and added in double. j0: the element index of
 * vector 0, the others G vectors apart. */
template <bool FAST, bool W, typename T, int U, typename Acc>
__device__ __forceinline__ void cep_fold_vecs(cep_stat<Acc> &st, ce_vec (&xv)[U], const ce_vec (&tv)[U],
                                              const Acc *w, int j0, int G, Acc c1, Acc c0) {
  constexpr int VEC = ce_vec_len<T>();
  cep_move_shift(st, ce_vecs_max<T, U, Acc>(xv));
  const Acc ms = ce_safe(st.e.m);
  Acc d[2] = {0, 0}, a[2] = {0, 0}, s[2] = {0, 0};
#pragma unroll
  for (int k = 0; k < U; k++) {
    ce_fence(xv[k]);
#pragma unroll
    for (int e = 0; e < VEC; e++) {
      const Acc x = ce_elem<T>(xv[k], e);
      const Acc u = cep_u<W>(ce_elem<T>(tv[k], e), w, j0 + k * G * VEC + e, c1, c0);
      d[e & 1] += ce_exp_shift<FAST>(x, ms);
      a[e & 1] += u * (x - ms);
      s[e & 1] += u;
    }
  }
  st.e.d += (double)(d[0] + d[1]);
  st.a += (double)(a[0] + a[1]);
  st.s += (double)(s[0] + s[1]);
}

/* The statistics of the elements a thread owns (thread `lane` of G), in
 * ce_thread_stats's order. */
template <bool FAST, bool W, typename T, typename Acc>
__device__ __forceinline__ cep_stat<Acc> cep_thread_stats(const T *x, const T *t, const Acc *w, const ce_row_layout &L,
                                                          int C, int lane, int G, Acc c1, Acc c0) {
  constexpr int U = cep_unroll<T>(), VEC = ce_vec_len<T>();
  cep_stat<Acc> st;
  st.e.m = (Acc)-INFINITY;
  st.e.d = 0;
  st.e.sx = 0;
  st.a = 0;
  st.s = 0;
  if (lane < L.head) cep_fold1<FAST, W>(st, ce_to_acc(x[lane]), ce_to_acc(t[lane]), w, lane, c1, c0);
  if (lane < C - L.tail) {
    const int j = L.tail + lane;
    cep_fold1<FAST, W>(st, ce_to_acc(x[j]), ce_to_acc(t[j]), w, j, c1, c0);
  }
  const T *x0 = x + L.head, *t0 = t + L.head;
  const bool t_vec = (((uintptr_t)t0) & 15) == 0;
  int k = lane;
  for (; k + (U - 1) * G < L.nvec; k += U * G) {
    ce_vec xv[U], tv[U];
#pragma unroll
    for (int u = 0; u < U; u++) cep_ld<false>(xv[u], tv[u], x0, t0, k + u * G, t_vec);
    cep_fold_vecs<FAST, W, T>(st, xv, tv, w, L.head + k * VEC, G, c1, c0);
  }
  for (; k < L.nvec; k += G) {
    ce_vec xv[1], tv[1];
    cep_ld<false>(xv[0], tv[0], x0, t0, k, t_vec);
    cep_fold_vecs<FAST, W, T>(st, xv, tv, w, L.head + k * VEC, G, c1, c0);
  }
  return st;
}

/* The row's statistics on every thread: the shifts' max, each thread's d and
 * a rebased to it, then d, a and s added (ce_group_max, ce_group_sum). */
template <typename Acc>
__device__ __forceinline__ cep_stat<Acc> cep_group_reduce(const cep_stat<Acc> &st, int G, ce_smem<Acc, 3> *sh) {
  const Acc m = ce_group_max(st.e.m, G, sh->m);
  double v[3] = {st.e.m == (Acc)-INFINITY ? 0.0 : st.e.d * exp((double)st.e.m - (double)ce_safe(m)),
                 st.a + st.s * ((double)ce_safe(st.e.m) - (double)ce_safe(m)), st.s};
  ce_group_sum(v, G, sh->s);
  cep_stat<Acc> r;
  r.e.m = m;
  r.e.d = v[0];
  r.e.sx = 0;
  r.a = v[1];
  r.s = v[2];
  return r;
}

/* The rows of a group (grid-stride), as ce_kernel walks them. */
#define CEP_FOR_ROWS(A, G, lane, row)                                                                      \
  const int lane = (int)(threadIdx.x % (unsigned)(G));                                                     \
  for (int64_t row = (int64_t)blockIdx.x * (int64_t)(blockDim.x / (unsigned)(G)) + threadIdx.x / (unsigned)(G); \
       row < (A).rows; row += (int64_t)gridDim.x * (int64_t)(blockDim.x / (unsigned)(G)))

/* One 512-thread CTA an SM (up to 128 registers) for float64 and with
 * weights (their index arithmetic and, in float64, the double exp spill at
 * 64), two otherwise. */
template <typename T, bool W>
__global__ void __launch_bounds__(CE_MAX_THREADS, sizeof(T) == 8 || W ? 1 : 2) cep_forward_kernel(cep_args A) {
  typedef typename ce_acc<T>::type Acc;
  constexpr bool FAST = sizeof(T) == 2;
  __shared__ ce_smem<Acc, 3> sh;
  const int G = A.group, C = A.classes;
  const Acc c1 = (Acc)(1 - A.eps), c0 = (Acc)(A.eps / (double)C);
  const Acc *w = (const Acc *)A.w;
  CEP_FOR_ROWS(A, G, lane, row) {
    const T *x = (const T *)A.x + row * A.x_stride, *t = (const T *)A.t + row * A.t_stride;
    const ce_row_layout L = ce_layout(x, C);
    cep_stat<Acc> st = cep_thread_stats<FAST, W, T, Acc>(x, t, w, L, C, lane, G, c1, c0);
    st = cep_group_reduce(st, G, &sh);
    if (lane == 0) {
      const double log_d = log(st.e.d), lse = (double)st.e.m + log_d;
      double loss = st.s * log_d - st.a;
      if (A.z != 0) loss += A.z * lse * lse;
      if constexpr (sizeof(T) == 8) ((double *)A.loss)[row] = loss;
      else ((float *)A.loss)[row] = (float)loss;
      A.lse[row] = lse;
      A.tsum[row] = st.s;
    }
  }
}

/* What a row's backward needs: R gives p_j = exp(x_j - lse). */
template <typename Acc> struct cep_grad_row {
  ce_grad_row<Acc> R;
  Acc S, zl, g, gt, c1, c0; /* target_sum, 2 z lse, g, g (1 - eps), 1 - eps, eps / C */
};

/* The two gradients of one element j: g ((S p_j - u_j) + 2 z lse p_j), with
 * u_j formed as the forward formed it (cep_u) and the z-loss's term added
 * apart, so where p_j S is u_j (one class) the first is 0 exactly and the
 * second keeps its own digits, as in F.cross_entropy plus the z-loss; and
 * g (1 - eps) w_j (lse - x_j). */
template <bool FAST, bool W, typename Acc>
__device__ __forceinline__ void cep_grad_elem(const cep_grad_row<Acc> &Q, const Acc *w, int j, Acc x, Acc t, Acc &gx,
                                              Acc &gt) {
  const Acc p = ce_grad_exp<FAST>(Q.R, x);
  gx = Q.g * ((Q.S * p - cep_u<W>(t, w, j, Q.c1, Q.c0)) + Q.zl * p);
  gt = (W ? Q.gt * __ldg(w + j) : Q.gt) * ((Q.R.hi - x) + Q.R.lo);
}

/* Stores one gradient vector at dst: 16 bytes where vec_out, else element by element. */
template <typename T> __device__ __forceinline__ void cep_st(T *dst, const ce_vec &v, bool vec_out) {
  if (vec_out) {
    ce_st(dst, v);
  } else {
#pragma unroll
    for (int e = 0; e < ce_vec_len<T>(); e++) dst[e] = ce_from_acc<T>(ce_elem<T>(v, e));
  }
}

/* One 512-thread CTA an SM (up to 128 registers) for float64 (its double exp
 * spills at 64 even with one vector in flight) and where the target's
 * gradient is written too (two gradient vectors and the target's in flight
 * spill at 64); two otherwise. */
template <typename T, bool W, bool DT>
__global__ void __launch_bounds__(CE_MAX_THREADS, sizeof(T) == 8 || DT ? 1 : 2) cep_backward_kernel(cep_args A) {
  typedef typename ce_acc<T>::type Acc;
  constexpr bool FAST = sizeof(T) == 2;
  constexpr int VEC = ce_vec_len<T>(), U = cep_unroll<T>();
  const int G = A.group, C = A.classes;
  const Acc *w = (const Acc *)A.w;
  CEP_FOR_ROWS(A, G, lane, row) {
    const T *x = (const T *)A.x + row * A.x_stride, *t = (const T *)A.t + row * A.t_stride;
    T *y = (T *)A.y + row * A.y_stride, *z = DT ? (T *)A.gt + row * A.gt_stride : (T *)NULL;
    const ce_row_layout L = ce_layout(x, C);
    const double g = sizeof(T) == 8 ? ((const double *)A.grad_loss)[row] : (double)((const float *)A.grad_loss)[row];
    const double lse = A.lse[row];
    cep_grad_row<Acc> Q;
    Q.R = ce_grad_setup<Acc>(1.0, lse, -1, true, 0.0, A.z, C);
    Q.S = (Acc)A.tsum[row];
    Q.zl = (Acc)(2 * A.z * lse);
    Q.g = (Acc)g;
    Q.gt = (Acc)(g * (1 - A.eps));
    Q.c1 = (Acc)(1 - A.eps);
    Q.c0 = (Acc)(A.eps / (double)C);
    Acc gx, gt;
    if (lane < L.head) {
      cep_grad_elem<FAST, W>(Q, w, lane, ce_to_acc(x[lane]), ce_to_acc(t[lane]), gx, gt);
      y[lane] = ce_from_acc<T>(gx);
      if (DT) z[lane] = ce_from_acc<T>(gt);
    }
    if (lane < C - L.tail) {
      const int j = L.tail + lane;
      cep_grad_elem<FAST, W>(Q, w, j, ce_to_acc(x[j]), ce_to_acc(t[j]), gx, gt);
      y[j] = ce_from_acc<T>(gx);
      if (DT) z[j] = ce_from_acc<T>(gt);
    }
    const T *x0 = x + L.head, *t0 = t + L.head;
    T *y0 = y + L.head, *z0 = DT ? z + L.head : (T *)NULL;
    const bool t_vec = (((uintptr_t)t0) & 15) == 0, y_vec = (((uintptr_t)y0) & 15) == 0;
    const bool z_vec = DT && (((uintptr_t)z0) & 15) == 0;
    for (int k = lane; k < L.nvec; k += U * G) {
      ce_vec xv[U], tv[U];
#pragma unroll
      for (int u = 0; u < U; u++)
        if (k + u * G < L.nvec) cep_ld<true>(xv[u], tv[u], x0, t0, k + u * G, t_vec);
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int kk = k + u * G;
        if (kk < L.nvec) {
          ce_vec yv, zv;
          /* element pairs: one conversion instruction per pair of 16-bit values */
#pragma unroll
          for (int e = 0; e < VEC; e += 2) {
            const int j = L.head + kk * VEC + e;
            Acc gx1, gt1;
            cep_grad_elem<FAST, W>(Q, w, j, ce_elem<T>(xv[u], e), ce_elem<T>(tv[u], e), gx, gt);
            cep_grad_elem<FAST, W>(Q, w, j + 1, ce_elem<T>(xv[u], e + 1), ce_elem<T>(tv[u], e + 1), gx1, gt1);
            ce_set2<T>(yv, e >> 1, gx, gx1);
            if (DT) ce_set2<T>(zv, e >> 1, gt, gt1);
          }
          cep_st(y0 + (int64_t)kk * VEC, yv, y_vec);
          if (DT) cep_st(z0 + (int64_t)kk * VEC, zv, z_vec);
        }
      }
    }
  }
}

// ---- the mean loss's glue (oss.h: row_weights, total) ------------------------------

/* One CTA of CE_GLUE_THREADS: thread i takes entries i, i + CE_GLUE_THREADS,
 * ..., CE_GLUE_UNROLL of them loaded before any is used (the loop is bound by
 * the loads' latency, paid once per batch instead of once per entry); warp
 * butterflies, then the warps' partials added by warp 0 in warp order (a
 * fixed order: bitwise reproducible). The result is returned to every
 * thread. */
enum { CE_GLUE_THREADS = 1024, CE_GLUE_UNROLL = 8 };

template <typename V> __device__ __forceinline__ V ce_cta_sum(V v) {
  __shared__ V part[CE_GLUE_THREADS / 32];
  __shared__ V all;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    V w = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : (V)0;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) w += __shfl_xor_sync(0xffffffffu, w, off);
    if (threadIdx.x == 0) all = w;
  }
  __syncthreads();
  return all;
}

/* This thread's entries base, base + blockDim.x, ... (CE_GLUE_UNROLL of them;
 * fill past the end). */
template <typename X>
__device__ __forceinline__ void ce_glue_load(X (&v)[CE_GLUE_UNROLL], const X *x, int64_t n, int64_t base, X fill) {
#pragma unroll
  for (int u = 0; u < CE_GLUE_UNROLL; u++) {
    const int64_t i = base + (int64_t)u * blockDim.x;
    v[u] = i < n ? x[i] : fill;
  }
}

/* The sum over this thread's entries of f(x[i]) (f(fill) past the end). */
template <typename V, typename X, typename F>
__device__ __forceinline__ V ce_thread_sum(const X *x, int64_t n, X fill, F f) {
  V s = 0;
  for (int64_t base = threadIdx.x; base < n; base += (int64_t)CE_GLUE_UNROLL * blockDim.x) {
    X v[CE_GLUE_UNROLL];
    ce_glue_load(v, x, n, base, fill);
#pragma unroll
    for (int u = 0; u < CE_GLUE_UNROLL; u++) s += f(v[u]);
  }
  return s;
}

struct ce_is_counted {
  int64_t ignore_index;
  __device__ long long operator()(int64_t t) const { return t != ignore_index; }
};
struct ce_as_double {
  template <typename L> __device__ double operator()(L v) const { return (double)v; }
};

/* count, then the weights (a second read of the targets, from L2) */
template <typename W>
__global__ void __launch_bounds__(CE_GLUE_THREADS)
    ce_row_weights_kernel(const int64_t *target, int64_t rows, int64_t ignore_index, int mean, W *weights,
                          int64_t *count) {
  const long long n =
      ce_cta_sum(ce_thread_sum<long long>(target, rows, ignore_index, ce_is_counted{ignore_index}));
  if (threadIdx.x == 0) *count = n;
  const W one = mean ? (W)1 / (W)n : (W)1, zero = mean ? (W)0 / (W)n : (W)0; /* (0 / 0 is NaN) */
  for (int64_t base = threadIdx.x; base < rows; base += (int64_t)CE_GLUE_UNROLL * blockDim.x) {
    int64_t v[CE_GLUE_UNROLL];
    ce_glue_load(v, target, rows, base, ignore_index);
#pragma unroll
    for (int u = 0; u < CE_GLUE_UNROLL; u++) {
      const int64_t i = base + (int64_t)u * blockDim.x;
      if (i < rows) weights[i] = v[u] != ignore_index ? one : zero;
    }
  }
}

template <typename L>
__global__ void __launch_bounds__(CE_GLUE_THREADS)
    ce_total_kernel(const L *loss, int64_t rows, const int64_t *count, L *total) {
  const double s = ce_cta_sum(ce_thread_sum<double>(loss, rows, (L)0, ce_as_double{}));
  if (threadIdx.x == 0) *total = count ? (L)s / (L)*count : (L)s;
}

// ---- host side ----------------------------------------------------------------------------

static size_t ce_dtype_size(oss_dtype t) { return t == OSS_FLOAT64 ? 8 : t == OSS_FLOAT32 ? 4 : 2; }

/* The checks the CPU kernel makes too (same sentences), less its host scan of
 * the targets, plus what the CUDA kernels rely on. */
static oss_status ce_check(const char *op, const oss_cross_entropy_params *p) {
  const oss_status st = oss_cross_entropy_check_params(op, p);
  if (st != OSS_OK) return st;
  if (p->classes > INT32_MAX)
    return oss_fail(OSS_ERROR_NOT_SUPPORTED, "%s: classes=%lld; the CUDA kernels take at most %d classes", op,
                    (long long)p->classes, INT32_MAX);
  const size_t es = ce_dtype_size(p->dtype);
  if ((uintptr_t)p->logits % es != 0 || (uintptr_t)p->target % 8 != 0 || (uintptr_t)p->lse % 8 != 0)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: logits, target or lse is not aligned to its element size", op);
  return OSS_OK;
}

/* The backward's extra checks: grad_loss and grad_logits, and grad_logits
 * either the logits themselves (in place) or apart from them. */
static oss_status ce_check_backward(const char *op, const oss_cross_entropy_backward_params *b) {
  const oss_cross_entropy_params *p = &b->fwd;
  if (p->rows > 0 && (b->grad_loss == NULL || b->grad_logits == NULL))
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: grad_loss or grad_logits is NULL", op);
  if (p->rows > 1 && b->grad_logits_stride_row < p->classes)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: grad_logits_stride_row=%lld is below classes=%lld", op,
                    (long long)b->grad_logits_stride_row, (long long)p->classes);
  const size_t es = ce_dtype_size(p->dtype);
  const uintptr_t ls = p->dtype == OSS_FLOAT64 ? 8 : 4;
  if ((uintptr_t)b->grad_logits % es != 0 || (uintptr_t)b->grad_loss % ls != 0 || (uintptr_t)b->grad_scale % ls != 0)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT,
                    "%s: grad_logits, grad_loss or grad_scale is not aligned to its element size", op);
  if (p->rows == 0) return OSS_OK;
  const int64_t xs = p->rows > 1 ? p->logits_stride_row : p->classes;
  const int64_t ys = p->rows > 1 ? b->grad_logits_stride_row : p->classes;
  const uintptr_t x0 = (uintptr_t)p->logits, y0 = (uintptr_t)b->grad_logits;
  const uintptr_t x1 = x0 + ((uintptr_t)(p->rows - 1) * (uintptr_t)xs + (uintptr_t)p->classes) * es;
  const uintptr_t y1 = y0 + ((uintptr_t)(p->rows - 1) * (uintptr_t)ys + (uintptr_t)p->classes) * es;
  const int same = x0 == y0 && (p->rows == 1 || xs == ys);
  if (!same && x0 < y1 && y0 < x1)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT,
                    "%s: grad_logits overlaps the logits without being the same rows (in place needs the same "
                    "pointer and row stride)",
                    op);
  return OSS_OK;
}

/* The launch shape (the rule of the header comment). */
static void ce_shape(int64_t classes, oss_dtype dtype, int fused, int *threads, int *group) {
  if (classes <= CE_WARP_MAX_CLASSES) {
    *threads = CE_WARP_ROWS_THREADS;
    *group = 32;
    return;
  }
  const int64_t vec = 16 / (int64_t)ce_dtype_size(dtype);
  const int64_t nvec = (classes + vec - 1) / vec;
  const int max_threads = fused ? CE_MAX_THREADS_FUSED : CE_MAX_THREADS;
  int t = CE_MIN_THREADS;
  while (t < max_threads && (int64_t)t * CE_VECS_PER_THREAD < nvec) t *= 2;
  *threads = t;
  *group = t;
}

/* One CTA per `threads / group` rows, or at most max_ctas (0: no cap) CTAs
 * walking the rows grid-stride. */
template <typename T, int MODE>
static oss_status ce_launch_typed(const ce_args &A, int threads, int64_t max_ctas, cudaStream_t stream) {
  const int64_t per_cta = threads / A.group;
  int64_t ctas = (A.rows + per_cta - 1) / per_cta;
  if (max_ctas > 0 && ctas > max_ctas) ctas = max_ctas;
  const unsigned grid = (unsigned)(ctas < INT32_MAX ? ctas : INT32_MAX);
  ce_kernel<T, MODE><<<grid, threads, 0, stream>>>(A);
  return oss_check_launch("ce_kernel");
}

template <int MODE>
static oss_status ce_launch(oss_dtype dtype, const ce_args &A, int threads, int64_t max_ctas, cudaStream_t stream) {
  switch (dtype) {
  case OSS_FLOAT32: return ce_launch_typed<float, MODE>(A, threads, max_ctas, stream);
  case OSS_FLOAT64: return ce_launch_typed<double, MODE>(A, threads, max_ctas, stream);
  case OSS_FLOAT16: return ce_launch_typed<__half, MODE>(A, threads, max_ctas, stream);
  case OSS_BFLOAT16: return ce_launch_typed<__nv_bfloat16, MODE>(A, threads, max_ctas, stream);
  default: return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "cross_entropy: logits have dtype code %d", (int)dtype);
  }
}

/* Whether the binary runs sm_90 code of the on-chip kernel on this device (a
 * build for older archs only would run its trap), asked once per device. */
static int ce_onchip_built(int device) {
  static signed char known[OSS_DEVICE_INFO_CACHE]; /* 0 unknown, 1 yes, -1 no; a racing write stores the same */
  if (device >= 0 && device < OSS_DEVICE_INFO_CACHE && known[device] != 0) return known[device] > 0;
  cudaFuncAttributes fa;
  int built = 0;
  if (cudaFuncGetAttributes(&fa, (const void *)ce_onchip_kernel<float>) == cudaSuccess) built = fa.binaryVersion >= 90;
  else cudaGetLastError();
  if (device >= 0 && device < OSS_DEVICE_INFO_CACHE) known[device] = built ? 1 : -1;
  return built;
}

/* The on-chip plan of a forward + backward launch (ce_onchip_kernel): on
 * sm_90 and later, for rows wider than a warp's. With S register vectors a
 * thread (ce_onchip_slots): a row of at most 256 x S vectors plus
 * CE_ONCHIP_SMALL_SMEM takes one CTA of 128 to 256 threads (threads grow
 * until each holds at most CE_ONCHIP_VECS_PER_THREAD vectors); one of at most
 * 512 x S plus CE_ONCHIP_LARGE_SMEM one CTA of 512 threads; a wider one the
 * smallest cluster of 256-thread CTAs whose chunks fit the first bound.
 * Returns 0 where the L2 path (ce_kernel) runs instead. */
static int ce_onchip_plan(const oss_device_info *info, int64_t classes, int64_t rows, oss_dtype dtype, int *cluster,
                          int *chunk_vecs, int *threads, size_t *smem) {
  if (info->cc_major < 9 || classes <= CE_WARP_MAX_CLASSES || !ce_onchip_built(info->device)) return 0;
  const int64_t slots = dtype == OSS_FLOAT64 ? ce_onchip_slots<double>() : ce_onchip_slots<float>();
  const int64_t nvec = classes / (16 / (int64_t)ce_dtype_size(dtype)); /* at least any row's whole vectors */
  const int64_t small = CE_ONCHIP_SMALL_THREADS * slots + CE_ONCHIP_SMALL_SMEM / 16;
  const int64_t large = CE_ONCHIP_LARGE_THREADS * slots + CE_ONCHIP_LARGE_SMEM / 16;
  int c = 1, t;
  if (nvec <= small) {
    t = 128;
    while (t < CE_ONCHIP_SMALL_THREADS && (int64_t)t * CE_ONCHIP_VECS_PER_THREAD < nvec) t *= 2;
  } else if (nvec <= large) {
    t = CE_ONCHIP_LARGE_THREADS;
  } else {
    t = CE_ONCHIP_SMALL_THREADS;
    c = 2;
    while (c < CE_ONCHIP_MAX_CLUSTER && (nvec + c - 1) / c > small) c++;
    if ((nvec + c - 1) / c > small) return 0;
  }
  if (rows > INT32_MAX / c) return 0;
  const int64_t chunk = (nvec + c - 1) / c;
  const int64_t shared_vecs = chunk > t * slots ? chunk - t * slots : 0;
  /* a GPU with less shared memory per CTA (the chunk's shared part and about
   * 1 KB of the kernel's own) takes the L2 path */
  if (shared_vecs * 16 + 2048 > info->max_smem_per_block_optin) return 0;
  *cluster = c;
  *chunk_vecs = (int)chunk;
  *threads = t;
  *smem = (size_t)shared_vecs * 16;
  return 1;
}

template <typename T>
static oss_status ce_onchip_launch_typed(const ce_args &A, int threads, size_t smem, cudaStream_t stream) {
  const void *kern = (const void *)ce_onchip_kernel<T>;
  OSS_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  cudaLaunchConfig_t cfg;
  cudaLaunchAttribute attr;
  memset(&cfg, 0, sizeof cfg);
  memset(&attr, 0, sizeof attr);
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = (unsigned)A.cluster;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.gridDim = dim3((unsigned)(A.rows * A.cluster));
  cfg.blockDim = dim3((unsigned)threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  OSS_CUDA_TRY(cudaLaunchKernelEx(&cfg, ce_onchip_kernel<T>, A));
  return oss_check_launch("ce_onchip_kernel");
}

static oss_status ce_onchip_launch(oss_dtype dtype, const ce_args &A, int threads, size_t smem, cudaStream_t stream) {
  switch (dtype) {
  case OSS_FLOAT32: return ce_onchip_launch_typed<float>(A, threads, smem, stream);
  case OSS_FLOAT64: return ce_onchip_launch_typed<double>(A, threads, smem, stream);
  case OSS_FLOAT16: return ce_onchip_launch_typed<__half>(A, threads, smem, stream);
  case OSS_BFLOAT16: return ce_onchip_launch_typed<__nv_bfloat16>(A, threads, smem, stream);
  default: return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "cross_entropy: logits have dtype code %d", (int)dtype);
  }
}

static ce_args ce_args_from(const oss_cross_entropy_params *p, int group) {
  ce_args A;
  A.x = p->logits;
  A.x_stride = p->rows > 1 ? p->logits_stride_row : p->classes;
  A.y = NULL;
  A.y_stride = 0;
  A.target = p->target;
  A.ignore_index = p->ignore_index;
  A.rows = p->rows;
  A.classes = (int)p->classes;
  A.group = group;
  A.eps = p->label_smoothing;
  A.z = p->z_loss;
  A.loss = p->loss;
  A.lse = (double *)p->lse;
  A.grad_loss = NULL;
  A.grad_scale = NULL;
  A.cluster = 1;
  A.chunk_vecs = 0;
  return A;
}

extern "C" oss_status oss_cross_entropy_forward_cuda(const oss_cross_entropy_params *p, void *cuda_stream) {
  const char *op = "cross_entropy";
  oss_status st = ce_check(op, p);
  if (st != OSS_OK) return st;
  if (p->rows > 0 && p->loss == NULL) return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: loss is NULL", op);
  if ((uintptr_t)p->loss % (p->dtype == OSS_FLOAT64 ? 8 : 4) != 0)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: loss is not aligned to its element size", op);
  if (p->rows == 0) return OSS_OK;
  int threads, group;
  ce_shape(p->classes, p->dtype, 0, &threads, &group);
  return ce_launch<CE_FWD>(p->dtype, ce_args_from(p, group), threads, 0, (cudaStream_t)cuda_stream);
}

/* The backward (fused = 0) or the forward and backward in one pass (fused = 1). */
static oss_status ce_backward(const char *op, const oss_cross_entropy_backward_params *b, int fused,
                              void *cuda_stream) {
  if (b == NULL) return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: params is NULL", op);
  const oss_cross_entropy_params *p = &b->fwd;
  oss_status st = ce_check(op, p);
  if (st == OSS_OK) st = ce_check_backward(op, b);
  if (st != OSS_OK) return st;
  if (fused && b->grad_scale != NULL)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: grad_scale is for the backward alone", op);
  if (fused && p->rows > 0 && p->loss == NULL) return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: loss is NULL", op);
  if (fused && (uintptr_t)p->loss % (p->dtype == OSS_FLOAT64 ? 8 : 4) != 0)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: loss is not aligned to its element size", op);
  if (p->rows == 0) return OSS_OK;
  int threads, group;
  ce_shape(p->classes, p->dtype, fused, &threads, &group);
  ce_args A = ce_args_from(p, group);
  A.y = b->grad_logits;
  A.y_stride = p->rows > 1 ? b->grad_logits_stride_row : p->classes;
  A.grad_loss = b->grad_loss;
  if (!fused) A.grad_scale = b->grad_scale;
  const cudaStream_t stream = (cudaStream_t)cuda_stream;
  if (fused) {
    oss_device_info info;
    st = oss_get_device_info(&info);
    if (st != OSS_OK) return st;
    int cluster, chunk_vecs, onchip_threads;
    size_t smem;
    if (ce_onchip_plan(&info, p->classes, p->rows, p->dtype, &cluster, &chunk_vecs, &onchip_threads, &smem)) {
      A.cluster = cluster;
      A.chunk_vecs = chunk_vecs;
      return ce_onchip_launch(p->dtype, A, onchip_threads, smem, stream);
    }
  }
  if (fused) return ce_launch<CE_FWD_BWD>(p->dtype, A, threads, 0, stream);
  int64_t max_ctas = 0;
  if (A.grad_scale != NULL) {
    /* the scale is read on the device, and where it is 1 every CTA returns
     * at once: one wave of CTAs (1024 threads an SM, as the kernel's 64
     * registers allow), not one per row, so that this case costs
     * microseconds */
    oss_device_info info;
    st = oss_get_device_info(&info);
    if (st != OSS_OK) return st;
    max_ctas = (int64_t)info.sm_count * (threads < 1024 ? 1024 / threads : 1);
  }
  return ce_launch<CE_BWD>(p->dtype, A, threads, max_ctas, stream);
}

extern "C" oss_status oss_cross_entropy_backward_cuda(const oss_cross_entropy_backward_params *p, void *cuda_stream) {
  return ce_backward("cross_entropy_backward", p, 0, cuda_stream);
}

extern "C" oss_status oss_cross_entropy_forward_backward_cuda(const oss_cross_entropy_backward_params *p,
                                                              void *cuda_stream) {
  return ce_backward("cross_entropy_forward_backward", p, 1, cuda_stream);
}

/* ---- class probabilities: host side ---- */

/* Whether [p, p + rows at stride s, C elements each) of two arrays overlap. */
static int cep_overlap(const void *a, int64_t as, const void *b, int64_t bs, int64_t rows, int64_t C, size_t es) {
  const uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
  const uintptr_t a1 = a0 + ((uintptr_t)(rows - 1) * (uintptr_t)as + (uintptr_t)C) * es;
  const uintptr_t b1 = b0 + ((uintptr_t)(rows - 1) * (uintptr_t)bs + (uintptr_t)C) * es;
  return a0 < b1 && b0 < a1;
}

/* The CUDA checks beyond oss_cross_entropy_probs_check_params: sizes and
 * alignments the kernels rely on. */
static oss_status cep_check(const char *op, const oss_cross_entropy_probs_params *p) {
  const oss_status st = oss_cross_entropy_probs_check_params(op, p);
  if (st != OSS_OK) return st;
  if (p->classes > INT32_MAX)
    return oss_fail(OSS_ERROR_NOT_SUPPORTED, "%s: classes=%lld; the CUDA kernels take at most %d classes", op,
                    (long long)p->classes, INT32_MAX);
  const size_t es = ce_dtype_size(p->dtype), ls = p->dtype == OSS_FLOAT64 ? 8 : 4;
  if ((uintptr_t)p->logits % es != 0 || (uintptr_t)p->target % es != 0 || (uintptr_t)p->weight % ls != 0 ||
      (uintptr_t)p->lse % 8 != 0 || (uintptr_t)p->target_sum % 8 != 0 || (uintptr_t)p->loss % ls != 0)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT,
                    "%s: logits, target, weight, loss, lse or target_sum is not aligned to its element size", op);
  return OSS_OK;
}

static cep_args cep_args_from(const oss_cross_entropy_probs_params *p, int group) {
  cep_args A;
  memset(&A, 0, sizeof A);
  A.x = p->logits;
  A.x_stride = p->rows > 1 ? p->logits_stride_row : p->classes;
  A.t = p->target;
  A.t_stride = p->rows > 1 ? p->target_stride_row : p->classes;
  A.w = p->weight;
  A.rows = p->rows;
  A.classes = (int)p->classes;
  A.group = group;
  A.eps = p->label_smoothing;
  A.z = p->z_loss;
  A.loss = p->loss;
  A.lse = (double *)p->lse;
  A.tsum = (double *)p->target_sum;
  return A;
}

static unsigned cep_grid(int64_t rows, int threads, int group) {
  const int64_t per_cta = threads / group, ctas = (rows + per_cta - 1) / per_cta;
  return (unsigned)(ctas < INT32_MAX ? ctas : INT32_MAX);
}

template <typename T>
static oss_status cep_launch_typed(const cep_args &A, int backward, int threads, cudaStream_t stream) {
  const unsigned grid = cep_grid(A.rows, threads, A.group);
  const bool W = A.w != NULL, DT = A.gt != NULL;
  if (!backward) {
    if (W) cep_forward_kernel<T, true><<<grid, threads, 0, stream>>>(A);
    else cep_forward_kernel<T, false><<<grid, threads, 0, stream>>>(A);
    return oss_check_launch("cep_forward_kernel");
  }
  if (W && DT) cep_backward_kernel<T, true, true><<<grid, threads, 0, stream>>>(A);
  else if (W) cep_backward_kernel<T, true, false><<<grid, threads, 0, stream>>>(A);
  else if (DT) cep_backward_kernel<T, false, true><<<grid, threads, 0, stream>>>(A);
  else cep_backward_kernel<T, false, false><<<grid, threads, 0, stream>>>(A);
  return oss_check_launch("cep_backward_kernel");
}

static oss_status cep_launch(oss_dtype dtype, const cep_args &A, int backward, int threads, cudaStream_t stream) {
  switch (dtype) {
  case OSS_FLOAT32: return cep_launch_typed<float>(A, backward, threads, stream);
  case OSS_FLOAT64: return cep_launch_typed<double>(A, backward, threads, stream);
  case OSS_FLOAT16: return cep_launch_typed<__half>(A, backward, threads, stream);
  case OSS_BFLOAT16: return cep_launch_typed<__nv_bfloat16>(A, backward, threads, stream);
  default: return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "cross_entropy_probs: logits have dtype code %d", (int)dtype);
  }
}

extern "C" oss_status oss_cross_entropy_probs_forward_cuda(const oss_cross_entropy_probs_params *p,
                                                           void *cuda_stream) {
  const char *op = "cross_entropy_probs";
  const oss_status st = cep_check(op, p);
  if (st != OSS_OK) return st;
  if (p->rows > 0 && p->loss == NULL) return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: loss is NULL", op);
  if (p->rows == 0) return OSS_OK;
  int threads, group;
  ce_shape(p->classes, p->dtype, 0, &threads, &group);
  return cep_launch(p->dtype, cep_args_from(p, group), 0, threads, (cudaStream_t)cuda_stream);
}

extern "C" oss_status oss_cross_entropy_probs_backward_cuda(const oss_cross_entropy_probs_backward_params *b,
                                                            void *cuda_stream) {
  const char *op = "cross_entropy_probs_backward";
  oss_status st = oss_cross_entropy_probs_check_backward(op, b);
  if (st == OSS_OK) st = cep_check(op, &b->fwd);
  if (st != OSS_OK) return st;
  const oss_cross_entropy_probs_params *p = &b->fwd;
  const size_t es = ce_dtype_size(p->dtype), ls = p->dtype == OSS_FLOAT64 ? 8 : 4;
  if ((uintptr_t)b->grad_logits % es != 0 || (uintptr_t)b->grad_target % es != 0 || (uintptr_t)b->grad_loss % ls != 0)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT,
                    "%s: grad_logits, grad_target or grad_loss is not aligned to its element size", op);
  if (p->rows == 0) return OSS_OK;
  const int64_t R = p->rows, C = p->classes;
  const int64_t xs = R > 1 ? p->logits_stride_row : C, ts = R > 1 ? p->target_stride_row : C;
  const int64_t ys = R > 1 ? b->grad_logits_stride_row : C, zs = R > 1 ? b->grad_target_stride_row : C;
  const int y_overlaps = cep_overlap(b->grad_logits, ys, p->logits, xs, R, C, es) ||
                         cep_overlap(b->grad_logits, ys, p->target, ts, R, C, es);
  const int z_overlaps = b->grad_target != NULL && (cep_overlap(b->grad_target, zs, p->logits, xs, R, C, es) ||
                                                    cep_overlap(b->grad_target, zs, p->target, ts, R, C, es) ||
                                                    cep_overlap(b->grad_target, zs, b->grad_logits, ys, R, C, es));
  if (y_overlaps || z_overlaps)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: grad_logits or grad_target overlaps an input or each other", op);
  int threads, group;
  ce_shape(C, p->dtype, 0, &threads, &group);
  cep_args A = cep_args_from(p, group);
  A.y = b->grad_logits;
  A.y_stride = ys;
  A.gt = b->grad_target;
  A.gt_stride = zs;
  A.grad_loss = b->grad_loss;
  return cep_launch(p->dtype, A, 1, threads, (cudaStream_t)cuda_stream);
}

extern "C" oss_status oss_cross_entropy_row_weights_cuda(const int64_t *target, int64_t rows, int64_t ignore_index,
                                                         oss_dtype dtype, int mean, void *weights, int64_t *count,
                                                         void *cuda_stream) {
  const oss_status st = oss_cross_entropy_check_glue("cross_entropy_row_weights", rows, dtype, target, weights, count);
  if (st != OSS_OK) return st;
  const cudaStream_t stream = (cudaStream_t)cuda_stream;
  if (dtype == OSS_FLOAT64)
    ce_row_weights_kernel<double><<<1, CE_GLUE_THREADS, 0, stream>>>(target, rows, ignore_index, mean,
                                                                     (double *)weights, count);
  else
    ce_row_weights_kernel<float><<<1, CE_GLUE_THREADS, 0, stream>>>(target, rows, ignore_index, mean,
                                                                    (float *)weights, count);
  return oss_check_launch("ce_row_weights_kernel");
}

extern "C" oss_status oss_cross_entropy_total_cuda(const void *loss, int64_t rows, oss_dtype dtype,
                                                   const int64_t *count, void *total, void *cuda_stream) {
  const oss_status st = oss_cross_entropy_check_glue("cross_entropy_total", rows, dtype, loss, loss, total);
  if (st != OSS_OK) return st;
  const cudaStream_t stream = (cudaStream_t)cuda_stream;
  if (dtype == OSS_FLOAT64)
    ce_total_kernel<double><<<1, CE_GLUE_THREADS, 0, stream>>>((const double *)loss, rows, count, (double *)total);
  else
    ce_total_kernel<float><<<1, CE_GLUE_THREADS, 0, stream>>>((const float *)loss, rows, count, (float *)total);
  return oss_check_launch("ce_total_kernel");
}
