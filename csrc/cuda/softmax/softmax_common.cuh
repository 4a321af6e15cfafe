/*
 * softmax_common.cuh - pieces shared by every softmax tier (forward and
 * backward): element I/O as raw bits, 16-byte "slots", the per-row statistics
 * and their merge, and the warp / block reductions.
 *
 * Slots. A row (or a chunk of one) is cut into 16-byte slots aligned to the
 * address of its reference tensor (x forward, y backward): a slot holds
 * VEC = 16 / sizeof(T) consecutive elements, and element index k of the row
 * lies in slot (k + ph) / VEC, where ph is the row's misalignment in elements.
 * A slot entirely inside the row is moved with one 16-byte access; the head
 * and tail slots (or every slot of a tensor whose misalignment differs from
 * the reference's) go element by element, so no byte outside the row is ever
 * read or written. Elements outside the row read as the neutral value (-inf
 * forward, 0 backward) and are never stored.
 *
 * Statistics. Forward: (m, d') with m the max and d' = sum exp(x - m) - 1,
 * the denominator less the exact 1 of one maximal element. log_softmax's
 * largest outputs are y = -log1p(d'): where one element dominates, d' is tiny
 * and a float32 d = 1 + d' would round it away (to a few ulps of 1, which
 * the backward multiplies by sum dy). So log_softmax sums the maximal
 * elements' exp terms (exactly 1 each) apart from the others (sm_sum_split).
 * The row edges update the state online (sm_accumulate); data held on chip
 * (registers, shared memory, column tiles) is folded max-first; partials of threads, warps, CTAs, cluster ranks and
 * split chunks are combined with sm_merge, or, in the warp and light kernels' forward,
 * reduced max first (sm_reduce_max_first). A max of -inf is replaced by 0 in
 * every subtraction (ms below), so -inf - -inf never makes a NaN by itself;
 * the max ignores NaN (fmax) but a NaN element makes d' NaN, which NaN-s the
 * whole row as PyTorch does; a +inf element gives exp(inf - inf) = NaN,
 * likewise; an all -inf row keeps d' = -1 and gives 0 * (1/0) = NaN.
 * Backward: one sum (sum y*dy, or sum dy for log_softmax) in the d field and,
 * for float32 output (COMP below), what its rounding left out in the m field
 * (oss_add_compensated), so that dx is rounded about once where the sum
 * cancels against dy (a dominant element); partials merge the same way.
 */
#ifndef OSS_SOFTMAX_COMMON_CUH
#define OSS_SOFTMAX_COMMON_CUH

#include <math.h>
#include <stdint.h>

#include "cuda/common.cuh"

// ---- constants -------------------------------------------------------------

enum sm_mode {
  SM_FULL = 0,  /* the CTA (or cluster) holds its whole row / column: stats and output */
  SM_STATS = 1, /* write this chunk's partial statistics to the workspace */
  SM_APPLY = 2, /* read the merged statistics from the workspace, write the output */
  SM_SPREAD = 3, /* the CTAs of a row each hold a chunk on chip and exchange their
                    statistics through the workspace (all resident together) */
};

// ---- raw slots and element bits --------------------------------------------

typedef union sm_slot {
  uint4 u;
  unsigned int w[4];
  unsigned short h[8];
  unsigned long long q[2];
} sm_slot;

template <typename T> __host__ __device__ constexpr int sm_vec() { return 16 / (int)sizeof(T); }

template <typename A, typename B> struct sm_same { static constexpr bool value = false; };
template <typename A> struct sm_same<A, A> { static constexpr bool value = true; };

template <typename T> __device__ __forceinline__ unsigned long long sm_ld_bits(const T *p) {
  if constexpr (sizeof(T) == 2) return __ldg((const unsigned short *)p);
  else if constexpr (sizeof(T) == 4) return __ldg((const unsigned int *)p);
  else return __ldg((const unsigned long long *)p);
}

template <typename T> __device__ __forceinline__ void sm_st_bits(T *p, unsigned long long b) {
  if constexpr (sizeof(T) == 2) *(unsigned short *)p = (unsigned short)b;
  else if constexpr (sizeof(T) == 4) *(unsigned int *)p = (unsigned int)b;
  else *(unsigned long long *)p = b;
}

template <typename T> __device__ __forceinline__ unsigned long long sm_get_bits(const sm_slot &s, int e) {
  if constexpr (sizeof(T) == 2) return s.h[e];
  else if constexpr (sizeof(T) == 4) return s.w[e];
  else return s.q[e];
}

template <typename T> __device__ __forceinline__ void sm_set_bits(sm_slot &s, int e, unsigned long long b) {
  if constexpr (sizeof(T) == 2) s.h[e] = (unsigned short)b;
  else if constexpr (sizeof(T) == 4) s.w[e] = (unsigned int)b;
  else s.q[e] = b;
}

/* Bits of T -> compute type (float for float/half/bfloat16, double for double). */
template <typename T, typename Acc> __device__ __forceinline__ Acc sm_bits_to_acc(unsigned long long b) {
  if constexpr (sizeof(Acc) == 8) return __longlong_as_double((long long)b);
  else if constexpr (sizeof(T) == 4) return __uint_as_float((unsigned int)b);
  else if constexpr (sizeof(T) == 2 && sm_same<T, __half>::value) return __half2float(__ushort_as_half((unsigned short)b));
  else return __uint_as_float(((unsigned int)b) << 16); /* bfloat16: exact */
}

/* Compute type -> bits of T, rounding to nearest even. */
template <typename T, typename Acc> __device__ __forceinline__ unsigned long long sm_acc_to_bits(Acc v) {
  if constexpr (sizeof(Acc) == 8) return (unsigned long long)__double_as_longlong(v);
  else if constexpr (sizeof(T) == 4) return __float_as_uint(v);
  else if constexpr (sm_same<T, __half>::value) return __half_as_ushort(__float2half_rn(v));
  else return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

/* Bits of the neutral element: -inf (forward, adds nothing to m or d) or 0
 * (backward, adds nothing to the sums). */
template <typename T> __host__ __device__ constexpr unsigned long long sm_neg_inf_bits() {
  return sizeof(T) == 8 ? 0xfff0000000000000ull
         : sizeof(T) == 4 ? 0xff800000ull
         : sm_same<T, __half>::value ? 0xfc00ull
                                : 0xff80ull;
}

/* Element e of a slot in the compute type. bfloat16 is read from its 32-bit
 * word (one shift or mask; through the 16-bit lanes the compiler emits a
 * byte permute and a shift for the high half). */
template <typename T, typename Acc> __device__ __forceinline__ Acc sm_slot_elem(const sm_slot &s, int e) {
  if constexpr (sm_same<T, __nv_bfloat16>::value && sizeof(Acc) == 4)
    return __uint_as_float((e & 1) ? s.w[e >> 1] & 0xffff0000u : s.w[e >> 1] << 16);
  else return sm_bits_to_acc<T, Acc>(sm_get_bits<T>(s, e));
}

/* 16- and 8-byte global accesses written in PTX, so the compiler keeps them
 * vectors (it otherwise may split a vector store into scalar ones to merge it
 * with the element-wise path of the same slot). */
__device__ __forceinline__ uint4 sm_ld16(const void *p) {
  uint4 r;
  asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
/* L2 eviction priority of the row kernels' input. Where a row is held by
 * one CTA, its 16-byte input loads carry an evict_last policy while its
 * output is computed. In the rows loaded last (a third of the L2's size of
 * input: sm_release_window in softmax_launch.cu) each line goes back to
 * evict_normal once the output is written (sm_release_line); older
 * evict_last lines have been displaced by then, so none stays above normal
 * priority after the call. The policy shortens the fixed cost per call after
 * an L2 flush and raises the streaming rate of the plans that use it (the
 * L2 then evicts the dirty output lines first). sm_80 and later; plain loads
 * elsewhere. */
__device__ __forceinline__ unsigned long long sm_l2_policy(bool keep) {
  unsigned long long p = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (keep) asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
  else asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(p));
#endif
  (void)keep;
  return p;
}
__device__ __forceinline__ uint4 sm_ld16_hint(const void *p, unsigned long long pol) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint4 r;
  asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p), "l"(pol));
  return r;
#else
  (void)pol;
  return sm_ld16(p);
#endif
}
/* 16 bytes from global p into shared dst, asynchronously, with the policy. */
__device__ __forceinline__ void sm_cp_async16_hint(uint4 *dst, const void *p, unsigned long long pol) {
  const unsigned sa = (unsigned)__cvta_generic_to_shared(dst);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(p), "l"(pol) : "memory");
#else
  (void)pol;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(p) : "memory");
#endif
}
/* Sets the L2 line holding p back to evict_normal. applypriority takes the
 * line's 128-byte aligned address (PTX ISA); p itself may be anywhere in it,
 * and the line holds p, so the aligned address is mapped memory too. */
__device__ __forceinline__ void sm_release_line(const void *p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uintptr_t line = (uintptr_t)p & ~(uintptr_t)127;
  asm volatile("applypriority.global.L2::evict_normal [%0], 128;\n" ::"l"(line) : "memory");
#else
  (void)p;
#endif
}

__device__ __forceinline__ void sm_st16(void *p, unsigned a, unsigned b, unsigned c, unsigned d) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
__device__ __forceinline__ void sm_st8(void *p, unsigned a, unsigned b) {
  asm volatile("st.global.v2.u32 [%0], {%1, %2};\n" ::"l"(p), "r"(a), "r"(b) : "memory");
}

/* Loads the slot whose first element is element k0 of p; only elements in
 * [lo, hi) exist (the others read as `fill`). One 16-byte load when the slot
 * lies inside [lo, hi) and p's slot grid is 16-byte aligned (vec_ok). Indices
 * are relative to the chunk a CTA or lane group owns, so they fit in 32 bits. */
template <typename T>
__device__ __forceinline__ sm_slot sm_load_slot(const T *p, int k0, int lo, int hi, bool vec_ok,
                                                unsigned long long fill) {
  constexpr int VEC = sm_vec<T>();
  sm_slot r;
  if (vec_ok && k0 >= lo && k0 + VEC <= hi) {
    r.u = sm_ld16(p + k0);
  } else {
#pragma unroll
    for (int e = 0; e < VEC; e++) {
      const int k = k0 + e;
      sm_set_bits<T>(r, e, (k >= lo && k < hi) ? sm_ld_bits(p + k) : fill);
    }
  }
  return r;
}

/* Same, with cp.async into shared memory (and the L2 policy pol) for the
 * full-vector case (bypassing registers); the partial case stores through
 * registers. The caller waits with sm_cp_async_wait() before reading its own
 * slots back. */
template <typename T>
__device__ __forceinline__ void sm_load_slot_to_smem(uint4 *dst, const T *p, int k0, int lo, int hi, bool vec_ok,
                                                     unsigned long long fill, unsigned long long pol) {
  constexpr int VEC = sm_vec<T>();
  if (vec_ok && k0 >= lo && k0 + VEC <= hi) {
    sm_cp_async16_hint(dst, p + k0, pol);
  } else {
    *dst = sm_load_slot(p, k0, lo, hi, false, fill).u;
  }
}

__device__ __forceinline__ void sm_cp_async_wait() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
__device__ __forceinline__ void sm_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* waits until at most N of this thread's committed cp.async groups are pending */
template <int N> __device__ __forceinline__ void sm_cp_async_wait_pending() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Stores VEC values (the slot grid of the reference tensor, VEC of its type)
 * as T2 elements k0 .. k0+VEC-1 of q, those inside [lo, hi): one 8-, 16- or
 * 32-byte store when the whole slot is inside and vec_ok says q's slot grid
 * is aligned. */
template <typename T2, int VEC, typename Acc>
__device__ __forceinline__ void sm_store_slot(T2 *q, int k0, int lo, int hi, bool vec_ok, const Acc (&v)[VEC]) {
  constexpr int B = VEC * (int)sizeof(T2);
  if (vec_ok && k0 >= lo && k0 + VEC <= hi) {
    unsigned int w[B / 4];
    if constexpr (sizeof(T2) == 2) {
#pragma unroll
      for (int i = 0; i < B / 4; i++)
        w[i] = (unsigned int)sm_acc_to_bits<T2, Acc>(v[2 * i]) |
               ((unsigned int)sm_acc_to_bits<T2, Acc>(v[2 * i + 1]) << 16);
    } else if constexpr (sizeof(T2) == 4) {
#pragma unroll
      for (int i = 0; i < B / 4; i++) w[i] = (unsigned int)sm_acc_to_bits<T2, Acc>(v[i]);
    } else {
#pragma unroll
      for (int i = 0; i < VEC; i++) {
        const unsigned long long b = sm_acc_to_bits<T2, Acc>(v[i]);
        w[2 * i] = (unsigned int)b;
        w[2 * i + 1] = (unsigned int)(b >> 32);
      }
    }
    if constexpr (B == 8) {
      sm_st8(q + k0, w[0], w[1]);
    } else {
#pragma unroll
      for (int i = 0; i < B / 16; i++) sm_st16((char *)(q + k0) + 16 * i, w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
    }
  } else {
#pragma unroll
    for (int e = 0; e < VEC; e++) {
      const int k = k0 + e;
      if (k >= lo && k < hi) sm_st_bits(q + k, sm_acc_to_bits<T2, Acc>(v[e]));
    }
  }
}

/* An empty asm that "modifies" a slot: placed between the statistics and the
 * output phase it stops the compiler from keeping the converted values of
 * every slot alive across the reduction (which doubles the registers for
 * 16-bit inputs); the output phase converts again from the raw bits. */
__device__ __forceinline__ void sm_slot_fence(sm_slot &s) {
  asm volatile("" : "+r"(s.w[0]), "+r"(s.w[1]), "+r"(s.w[2]), "+r"(s.w[3]));
}

/* A slot known to lie inside the row: one 16-byte load, or VEC element loads
 * when p's slot grid is not 16-byte aligned (a tensor misaligned relative to
 * the reference). */
template <typename T> __device__ __forceinline__ sm_slot sm_load_full(const T *p, bool vec_ok) {
  constexpr int VEC = sm_vec<T>();
  sm_slot r;
  if (vec_ok) {
    r.u = sm_ld16(p);
  } else {
#pragma unroll
    for (int e = 0; e < VEC; e++) sm_set_bits<T>(r, e, sm_ld_bits(p + e));
  }
  return r;
}

/* Stores VEC values as T2 at q (a slot inside the row): one 8/16/32-byte
 * access when vec_ok, else element by element. */
template <typename T2, int VEC, typename Acc>
__device__ __forceinline__ void sm_store_full(T2 *q, bool vec_ok, const Acc (&v)[VEC]) {
  sm_store_slot<T2, VEC>(q, 0, 0, VEC, vec_ok, v);
}

/* Misalignment of p in elements of T, and whether a tensor of element type U
 * at q can use the slot grid of a reference with misalignment ph (8-byte
 * stores suffice when a slot of U is 8 bytes). */
template <typename T> __device__ __forceinline__ int sm_phase(const T *p) {
  return (int)(((uintptr_t)p / sizeof(T)) & (uintptr_t)(sm_vec<T>() - 1));
}
template <typename U, int VEC> __device__ __forceinline__ bool sm_grid_ok(const U *q, int ph) {
  constexpr uintptr_t A = VEC * sizeof(U) < 16 ? VEC * sizeof(U) : 16;
  return (((uintptr_t)q - (uintptr_t)ph * sizeof(U)) & (A - 1)) == 0;
}

// ---- math ------------------------------------------------------------------

/* exp used per element: the fast hardware path when the output is 16-bit (its
 * rounding dwarfs the difference), the accurate one for float32/float64. */
template <bool FAST> __device__ __forceinline__ float sm_exp(float x) { return FAST ? __expf(x) : expf(x); }
template <bool FAST> __device__ __forceinline__ double sm_exp(double x) { return exp(x); }
__device__ __forceinline__ float sm_max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double sm_max(double a, double b) { return fmax(a, b); }
__device__ __forceinline__ float sm_log1p(float x) { return log1pf(x); }
__device__ __forceinline__ double sm_log1p(double x) { return log1p(x); }

/* 2^x, hardware approximation (ex2.approx: 2 ulp; -inf -> 0, NaN -> NaN). */
__device__ __forceinline__ float sm_ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
/* log2(x), hardware approximation (lg2.approx: absolute error about 2^-22;
 * 0 and subnormals -> -inf, inf -> inf, NaN -> NaN). */
__device__ __forceinline__ float sm_lg2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

#define SM_LOG2E 1.4426950408889634

/* exp(x - ms). FAST: 2^((x - ms) log2(e)), one FADD, FMUL and MUFU.EX2. The
 * subtraction comes first: x - ms is exact for the values that matter (those
 * near the max), while folding ms into the FFMA as ms*log2(e) would round the
 * shift by an ulp of ms*log2(e) (0.4% of the result at |ms| = 6e4, float16's
 * range) and overflow to inf past 2.4e38 (bfloat16's range). */
template <bool FAST> __device__ __forceinline__ float sm_exp_shift(float x, float ms) {
  return FAST ? sm_ex2((x - ms) * (float)SM_LOG2E) : expf(x - ms);
}
template <bool FAST> __device__ __forceinline__ double sm_exp_shift(double x, double ms) { return exp(x - ms); }

template <typename Acc> __device__ __forceinline__ Acc sm_safe_max(Acc m) { return m == (Acc)-INFINITY ? (Acc)0 : m; }

// ---- statistics and their merge --------------------------------------------

template <typename Acc> struct sm_stat {
  Acc m; /* forward: running max (never NaN; -inf when empty)   backward: the sum's lost low part */
  Acc d; /* forward: d' = sum of exp(x - ms), less 1             backward: the sum */
};

/* Backward sums are compensated where the output is float32 (not FAST, float
 * compute); 16-bit outputs round far above a float32 sum's error. */
template <bool FAST, typename Acc> __host__ __device__ constexpr bool sm_compensated() {
  return !FAST && sizeof(Acc) == 4;
}

/* The empty state: m = -inf, d' = -1 (d = 0) forward; a sum of 0 + 0 backward. */
template <bool BWD, typename Acc> __device__ __forceinline__ sm_stat<Acc> sm_stat_identity() {
  sm_stat<Acc> s;
  s.m = BWD ? (Acc)0 : (Acc)-INFINITY;
  s.d = BWD ? (Acc)0 : (Acc)-1;
  return s;
}

/* hi += x keeping the rounding error in lo (float; plain double sums). */
__device__ __forceinline__ void sm_add_compensated(float &hi, float &lo, float x) { oss_add_compensated(&hi, &lo, x); }
__device__ __forceinline__ void sm_add_compensated(double &hi, double &lo, double x) { hi += x; }

/* (m, d') merge: the larger max keeps its d', the other partial's d = d' + 1
 * is rescaled by exp(m_small - m_big) (one exp); equal maxes add d'1 + d'2 + 1.
 * With both maxes -inf the rescale is exp(-inf) = 0 and d' stays -1, so empty
 * partials never produce NaN; +inf with +inf gives NaN, as the row must. */
template <bool BWD, typename Acc> __device__ __forceinline__ sm_stat<Acc> sm_merge(sm_stat<Acc> a, sm_stat<Acc> b) {
  if constexpr (BWD) {
    a.m += b.m;
    sm_add_compensated(a.d, a.m, b.d);
    return a;
  } else {
    const bool ab = a.m >= b.m;
    sm_stat<Acc> r;
    r.m = ab ? a.m : b.m;
    const Acc mn = ab ? b.m : a.m, dx = ab ? a.d : b.d, dn = ab ? b.d : a.d;
    r.d = dx + (dn + (Acc)1) * sm_exp<false>(mn - sm_safe_max(r.m));
    return r;
  }
}

/* One exp term e = exp(x - ms) of a fold whose max is vm, summed into s, or
 * (SPLIT, x == vm) into top: top ends as the count of maximal elements
 * (0 when vm is -inf, NaN when +inf), kept exact apart from the small terms. */
template <bool SPLIT, typename Acc> __device__ __forceinline__ void sm_sum_split(Acc x, Acc vm, Acc e, Acc &s, Acc &top) {
  if (SPLIT && x == vm) top += e;
  else s += e;
}

/* The d' of a fold of new values with max vm >= st.m, from the fold's sums
 * (s, top) as sm_sum_split left them (without SPLIT: top = 0, s has it all):
 * a new max rescales the old d = d' + 1 by exp(st.m - ms) and the fold's own
 * maximal element supplies the new 1; otherwise the fold just adds. */
template <typename Acc>
__device__ __forceinline__ Acc sm_fold_d(sm_stat<Acc> st, Acc vm, Acc ms, Acc s, Acc top) {
  if (vm > st.m) return (st.d + (Acc)1) * sm_exp<false>(st.m - ms) + s + (top - (Acc)1);
  return st.d + s + top;
}

template <typename Acc> __device__ __forceinline__ sm_stat<Acc> sm_shfl_xor(sm_stat<Acc> s, int off) {
  s.m = __shfl_xor_sync(0xffffffffu, s.m, off);
  s.d = __shfl_xor_sync(0xffffffffu, s.d, off);
  return s;
}

/* Online update with N values held on chip (forward: one rescale of d per
 * call; backward: a plain sum of a*b or of b). Entries k >= count are skipped;
 * entries outside the row hold the neutral value and add nothing. softmax's
 * forward (log = 0) folds the plain d = d' + 1 in st.d, one FFMA per call: the
 * caller converts around its loop (sm_plain_d / sm_prime_d); softmax's output
 * needs only d. Used by the row edges (softmax_rows.cuh). */
template <bool BWD, bool FAST, typename Acc, int N>
__device__ __forceinline__ void sm_accumulate(sm_stat<Acc> &st, const Acc (&a)[N], const Acc (&b)[N], int count,
                                              int log) {
  if constexpr (BWD) {
    if constexpr (sm_compensated<FAST, Acc>()) {
#pragma unroll
      for (int e = 0; e < N; e++)
        if (e < count) sm_add_compensated(st.d, st.m, log ? b[e] : a[e] * b[e]);
    } else {
      Acc s = 0;
#pragma unroll
      for (int e = 0; e < N; e++)
        if (e < count) s += log ? b[e] : a[e] * b[e];
      st.d += s;
    }
  } else {
    Acc vm = st.m;
#pragma unroll
    for (int e = 0; e < N; e++)
      if (e < count) vm = sm_max(vm, a[e]);
    const Acc ms = sm_safe_max(vm);
    Acc s = 0, top = 0;
    if (log) {
#pragma unroll
      for (int e = 0; e < N; e++)
        if (e < count) sm_sum_split<true>(a[e], vm, sm_exp_shift<FAST>(a[e], ms), s, top);
      st.d = sm_fold_d(st, vm, ms, s, top);
    } else {
#pragma unroll
      for (int e = 0; e < N; e++)
        if (e < count) s += sm_exp_shift<FAST>(a[e], ms);
      st.d = st.d * sm_exp<false>(st.m - ms) + s; /* the plain d */
    }
    st.m = vm;
  }
}

/* st.d between d' (every state outside sm_accumulate's loops) and the plain
 * d that sm_accumulate folds for softmax's forward; nothing otherwise. */
template <bool BWD, typename Acc> __device__ __forceinline__ void sm_plain_d(sm_stat<Acc> &st, int log) {
  if (!BWD && !log) st.d += (Acc)1;
}
template <bool BWD, typename Acc> __device__ __forceinline__ void sm_prime_d(sm_stat<Acc> &st, int log) {
  if (!BWD && !log) st.d -= (Acc)1;
}

/* What the output phase needs, per row/column. Forward: c0 = ms and c1 =
 * log1p(d') = log(d) (log_softmax: y = (x - c0) - c1), else 1/d (softmax: y = exp(x - c0)
 * c1), or with FAST (16-bit output) -log2(d) by the hardware log2 (softmax:
 * y = 2^((x - c0) log2(e) + c1), one FADD, FFMA and MUFU; the log2's error,
 * some 2^-22, is far below 16-bit rounding). x - ms is computed first so that a large
 * |ms| is never rounded into a combined constant. Backward: c0 = the sum
 * rounded once and c1 what that rounding left out (0 when it is not finite). */
template <bool BWD, bool FAST, typename Acc>
__device__ __forceinline__ void sm_finish(sm_stat<Acc> st, int log, Acc &c0, Acc &c1) {
  if constexpr (BWD) {
    /* hi alone is the plain float sum: renormalise, c0 = the float nearest
     * hi + lo, c1 = the rest (exact: c0 is within an ulp or so of hi) */
    if (isfinite(st.d)) {
      c0 = st.d + st.m;
      c1 = (st.d - c0) + st.m;
    } else {
      c0 = st.d;
      c1 = 0;
    }
  } else {
    c0 = sm_safe_max(st.m);
    if (log) c1 = sm_log1p(st.d);
    else if (FAST && sizeof(Acc) == 4) c1 = -(Acc)sm_lg2((float)(st.d + (Acc)1)); /* 2^-22 against 16-bit rounding */
    else c1 = (Acc)1 / (st.d + (Acc)1);
  }
}

/* One output element: forward y from x = a; backward dx from y = a, dy = b,
 * with the compensated sum c0 + c1 where the output is float32. */
template <bool BWD, bool FAST, typename Acc>
__device__ __forceinline__ Acc sm_output(Acc a, Acc b, int log, Acc c0, Acc c1) {
  if constexpr (BWD) {
    if constexpr (sm_compensated<FAST, Acc>()) {
      if (!log) return a * ((b - c0) - c1);
      if (a > (Acc)OSS_LOG_SOFTMAX_NEAR_ONE) {
        const Acc dx = oss_log_softmax_grad_near_one(a, b, c0, c1);
        if (dx == dx) return dx;
      }
    }
    return log ? b - sm_exp<FAST>(a) * c0 : a * (b - c0);
  } else if constexpr (FAST && sizeof(Acc) == 4) {
    return log ? (a - c0) - c1 : (Acc)sm_ex2(fmaf((float)(a - c0), (float)SM_LOG2E, (float)c1));
  } else {
    return log ? (a - c0) - c1 : sm_exp<FAST>(a - c0) * c1;
  }
}

/* Forward softmax with 4- or 8-byte input (float32 / float64) may keep
 * exp(x - ms_thread) in place of x (registers, or the column tile), so the
 * output needs no second exp: y = e * sm_cache_scale. */
template <typename T1, typename Acc> __host__ __device__ constexpr bool sm_can_cache() {
  return sizeof(T1) == sizeof(Acc);
}

/* The factor turning a thread's cached exp(x - ms_thread) into y: exp(m_thread - ms) / (d' + 1),
 * or 0 / d (0, or NaN for an all -inf row) when the thread held only -inf. */
template <typename Acc> __device__ __forceinline__ Acc sm_cache_scale(Acc m_thread, sm_stat<Acc> st) {
  return (m_thread == (Acc)-INFINITY ? (Acc)0 : sm_exp<false>(m_thread - sm_safe_max(st.m))) / (st.d + (Acc)1);
}

// ---- reductions ------------------------------------------------------------

/* Merge across the G lanes (a power of two <= 32) of each aligned lane group;
 * every lane of the warp must call it; all G lanes get the result. */
template <bool BWD, typename Acc> __device__ __forceinline__ sm_stat<Acc> sm_group_reduce(sm_stat<Acc> st, int G) {
  for (int off = G >> 1; off > 0; off >>= 1) st = sm_merge<BWD>(st, sm_shfl_xor(st, off));
  return st;
}

/* Backward sums (hi = st.d, lo = st.m) over the G lanes (a power of two <=
 * 32) of each aligned lane group, every lane of the warp calling: COMP
 * merges with sm_merge (TwoSum; a loop, which holds fewer registers), else
 * plain adds of hi, unrolled (lo stays 0: a 16-bit output rounds far above
 * a float sum's error; the merge's 8 instructions a step against 2 would be
 * much of what a thread of the narrow backward issues per row). Both are
 * symmetric in their operands, so
 * every lane of a group gets the same bits. */
template <bool COMP, typename Acc> __device__ __forceinline__ void sm_bwd_group_sum(sm_stat<Acc> &st, int G) {
  if constexpr (COMP) {
    st = sm_group_reduce<true>(st, G);
  } else {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
      if (off < G) st.d += __shfl_xor_sync(~0u, st.d, off);
  }
}

/* The backward sum over the block (blockDim.x a power of two, 32 .. 1024):
 * each warp's sum goes to red[parity], one barrier, then every warp sums
 * the nw warps' values itself (each gets the same bits), so there is no
 * second barrier and no broadcast. A caller that loops over rows alternates
 * parity: a warp reaches the next row's barrier only after every warp has
 * read this row's entries, so it never overwrites entries still being read. */
template <bool COMP, typename Acc>
__device__ __forceinline__ sm_stat<Acc> sm_block_sum(sm_stat<Acc> st, sm_stat<Acc> (*red)[32], int parity) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  sm_bwd_group_sum<COMP>(st, 32);
  if (lane == 0) red[parity][warp] = st;
  __syncthreads();
  st = red[parity][lane & (nw - 1)];
  sm_bwd_group_sum<COMP>(st, nw);
  return st;
}

/* Block reduction over "thread rows": thread t = ti * TJ + tj (TJ a power of
 * two dividing blockDim.x, blockDim.x a multiple of 32). Every thread gets the
 * merge over ti of the partials of its column tj. TJ == 1 is a plain block
 * reduction. red must hold blockDim.x + TJ entries when TJ >= 32, and
 * blockDim.x / 32 * TJ + TJ entries otherwise. Safe to call repeatedly. */
template <bool BWD, typename Acc>
__device__ __forceinline__ sm_stat<Acc> sm_block_reduce(sm_stat<Acc> st, int TJ, sm_stat<Acc> *red) {
  const int T = blockDim.x, t = threadIdx.x, lane = t & 31, warp = t >> 5;
  if (TJ >= T) return st;
  if (TJ < 32) {
    for (int off = 16; off >= TJ; off >>= 1) st = sm_merge<BWD>(st, sm_shfl_xor(st, off));
    const int nw = T >> 5;
    if (nw == 1) return st;
    if (lane < TJ) red[warp * TJ + lane] = st;
    __syncthreads();
    const int entries = nw * TJ;
    if (warp == 0) {
      sm_stat<Acc> acc = sm_stat_identity<BWD, Acc>();
      for (int e = lane; e < entries; e += 32) acc = sm_merge<BWD>(acc, red[e]);
      for (int off = 16; off >= TJ; off >>= 1) acc = sm_merge<BWD>(acc, sm_shfl_xor(acc, off));
      if (lane < TJ) red[entries + lane] = acc;
    }
    __syncthreads();
    return red[entries + (t & (TJ - 1))];
  } else {
    const int TI = T / TJ, ti = t / TJ, tj = t & (TJ - 1);
    red[t] = st;
    __syncthreads();
    if (ti == 0) {
      for (int k = 1; k < TI; k++) st = sm_merge<BWD>(st, red[k * TJ + tj]);
      red[T + tj] = st;
    }
    __syncthreads();
    return red[T + tj];
  }
}

/* Max / sum over the G lanes (a power of two <= 32) of each aligned lane
 * group, of N values at once, every lane of the warp calling (G the same for
 * all): butterfly shuffles, unrolled (a loop over a G known only at run time
 * costs more than its shuffles), the N values' shuffles of one step under
 * one branch, so independent rows' chains interleave; every lane of a group
 * gets the same bits. */
template <int N, typename Acc> __device__ __forceinline__ void sm_group_max(Acc (&v)[N], int G) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    if (off < G)
#pragma unroll
      for (int i = 0; i < N; i++) v[i] = sm_max(v[i], __shfl_xor_sync(~0u, v[i], off));
}
template <int N, typename Acc> __device__ __forceinline__ void sm_group_sum(Acc (&v)[N], int G) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    if (off < G)
#pragma unroll
      for (int i = 0; i < N; i++) v[i] += __shfl_xor_sync(~0u, v[i], off);
}

/* Forward reduction, max first, of N rows' states at once (a lane's rows of
 * the warp kernel) over the G lanes (a power of two <= 32) of each lane
 * group or, BLOCK (G = 32, N = 1), over the whole block (blockDim.x a
 * power of two, 64 .. 1024; red: 3 x 32 entries of shared memory; safe to
 * call repeatedly; each lane group of the second level reads all the warps'
 * values). Every thread gets the results, in place. The max M of the
 * threads' maxes comes first (fmax shuffles), then one sum of the threads' d
 * rescaled to M, each thread's exp taken before the sum: sm_group_reduce's
 * merge tree puts an exp on every level of its dependency chain (ten levels
 * for a CTA of several warps), and threads that hold a slot or two would
 * wait for that chain about as long as for their loads. softmax
 * sums the plain d = d' + 1; log_softmax keeps d' exact for the maximal
 * threads: they add their d' to the sum and 1 to a separate count, and the
 * result is d' = sum + (count - 1), as sm_merge's equal maxes give. FAST
 * (16-bit output): the rescale takes the hardware exp. */
template <bool FAST, bool BLOCK, int N, typename Acc>
__device__ __forceinline__ void sm_reduce_max_first(sm_stat<Acc> (&st)[N], int G, int log, Acc (*red)[32]) {
  static_assert(!BLOCK || N == 1, "a block reduction takes one row");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const bool block = BLOCK && nw > 1;
  Acc m[N], s[N], c[N];
#pragma unroll
  for (int i = 0; i < N; i++) m[i] = st[i].m;
  sm_group_max(m, G);
  if (block) {
    if (lane == 0) red[0][warp] = m[0];
    __syncthreads();
    m[0] = red[0][lane & (nw - 1)];
    sm_group_max(m, nw);
  }
#pragma unroll
  for (int i = 0; i < N; i++) {
    const Acc scale = sm_exp<FAST>(st[i].m - sm_safe_max(m[i]));
    const bool top = log && st[i].m == m[i];
    s[i] = top ? st[i].d : (st[i].d + (Acc)1) * scale;
    c[i] = top ? (Acc)1 : (Acc)0;
  }
  sm_group_sum(s, G);
  if (log) sm_group_sum(c, G);
  if (block) {
    if (lane == 0) {
      red[1][warp] = s[0];
      if (log) red[2][warp] = c[0];
    }
    __syncthreads();
    s[0] = red[1][lane & (nw - 1)];
    sm_group_sum(s, nw);
    if (log) {
      c[0] = red[2][lane & (nw - 1)];
      sm_group_sum(c, nw);
    }
  }
#pragma unroll
  for (int i = 0; i < N; i++) {
    st[i].m = m[i];
    st[i].d = log ? s[i] + (c[i] - (Acc)1) : s[i] - (Acc)1;
  }
}

#endif /* OSS_SOFTMAX_COMMON_CUH */
