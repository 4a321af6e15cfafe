/*
 * cpu_common.h - helpers shared by the C11 CPU kernels: element conversion
 * for float16/bfloat16 (software, round-to-nearest-even, inf/NaN preserved),
 * strided row load/store into float or double buffers, a vectorisable exp,
 * and the parallel-for wrapper around oss_cpu_exec.
 */
#ifndef OSS_CPU_COMMON_H
#define OSS_CPU_COMMON_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../oss_internal.h"

typedef union oss_bits32 {
  uint32_t u;
  float f;
} oss_bits32;

/* ---- float16 / bfloat16 <-> float ---------------------------------------- */

static inline float oss_half_to_float(uint16_t h) {
  /* Move exponent+mantissa into float position and rebias by multiplying by
   * 2^112; this is exact for normal and subnormal halves. Inf/NaN land at
   * 65536 and above and get the all-ones exponent. */
  oss_bits32 v;
  v.u = (uint32_t)(h & 0x7fffu) << 13;
  v.f *= 0x1p112f;
  if (v.f >= 65536.0f) v.u |= 0x7f800000u;
  v.u |= (uint32_t)(h & 0x8000u) << 16;
  return v.f;
}

static inline uint16_t oss_float_to_half(float f) {
  oss_bits32 v = {.f = f};
  uint32_t sign = v.u & 0x80000000u;
  v.u ^= sign;
  uint16_t h;
  if (v.u >= 0x47800000u) {              /* |f| >= 65536, inf or NaN */
    h = v.u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (v.u < 0x38800000u) {        /* below the smallest normal half */
    /* Adding 0.5 lines the half subnormal grid up with the float mantissa's
     * last bits, so the FPU's own rounding is round-to-nearest-even. */
    oss_bits32 magic = {.u = 0x3f000000u};
    v.f += magic.f;
    h = (uint16_t)(v.u - magic.u);
  } else {
    uint32_t odd = (v.u >> 13) & 1u;      /* ties go to even */
    v.u += 0xc8000fffu + odd;             /* rebias (-112 << 23) and round */
    h = (uint16_t)(v.u >> 13);
  }
  return (uint16_t)(h | (sign >> 16));
}

static inline float oss_bf16_to_float(uint16_t b) {
  oss_bits32 v = {.u = (uint32_t)b << 16};
  return v.f;
}

static inline uint16_t oss_float_to_bf16(float f) {
  oss_bits32 v = {.f = f};
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u); /* quiet NaN */
  v.u += 0x7fffu + ((v.u >> 16) & 1u);
  return (uint16_t)(v.u >> 16);
}

/* ---- strided loads and stores -------------------------------------------
 * Element i of a run lives at base[offset + i*stride] in the tensor's dtype. */

static inline void oss_load_f32(const void *base, oss_dtype dtype, int64_t offset, int64_t stride,
                                float *dst, int64_t count) {
  switch (dtype) {
  case OSS_FLOAT32: {
    const float *src = (const float *)base + offset;
    if (stride == 1) memcpy(dst, src, (size_t)count * sizeof *dst);
    else for (int64_t i = 0; i < count; i++) dst[i] = src[i * stride];
    break;
  }
  case OSS_FLOAT16: {
    const uint16_t *src = (const uint16_t *)base + offset;
    for (int64_t i = 0; i < count; i++) dst[i] = oss_half_to_float(src[i * stride]);
    break;
  }
  case OSS_BFLOAT16: {
    const uint16_t *src = (const uint16_t *)base + offset;
    for (int64_t i = 0; i < count; i++) dst[i] = oss_bf16_to_float(src[i * stride]);
    break;
  }
  case OSS_FLOAT64: {
    const double *src = (const double *)base + offset;
    for (int64_t i = 0; i < count; i++) dst[i] = (float)src[i * stride];
    break;
  }
  default:
    for (int64_t i = 0; i < count; i++) dst[i] = NAN;
  }
}

static inline void oss_store_f32(void *base, oss_dtype dtype, int64_t offset, int64_t stride,
                                 const float *src, int64_t count) {
  switch (dtype) {
  case OSS_FLOAT32: {
    float *dst = (float *)base + offset;
    if (stride == 1) memcpy(dst, src, (size_t)count * sizeof *src);
    else for (int64_t i = 0; i < count; i++) dst[i * stride] = src[i];
    break;
  }
  case OSS_FLOAT16: {
    uint16_t *dst = (uint16_t *)base + offset;
    for (int64_t i = 0; i < count; i++) dst[i * stride] = oss_float_to_half(src[i]);
    break;
  }
  case OSS_BFLOAT16: {
    uint16_t *dst = (uint16_t *)base + offset;
    for (int64_t i = 0; i < count; i++) dst[i * stride] = oss_float_to_bf16(src[i]);
    break;
  }
  case OSS_FLOAT64: {
    double *dst = (double *)base + offset;
    for (int64_t i = 0; i < count; i++) dst[i * stride] = (double)src[i];
    break;
  }
  default: break;
  }
}

/* float64 kernels only ever see float64 tensors (the registration layer casts). */
static inline void oss_load_f64(const void *base, oss_dtype dtype, int64_t offset, int64_t stride,
                                double *dst, int64_t count) {
  const double *src = (const double *)base + offset;
  (void)dtype;
  for (int64_t i = 0; i < count; i++) dst[i] = src[i * stride];
}

static inline void oss_store_f64(void *base, oss_dtype dtype, int64_t offset, int64_t stride,
                                 const double *src, int64_t count) {
  double *dst = (double *)base + offset;
  (void)dtype;
  for (int64_t i = 0; i < count; i++) dst[i * stride] = src[i];
}

/* ---- exp ----------------------------------------------------------------
 * oss_expf: branch-free float exp (Cody-Waite reduction, degree-7 Taylor
 * polynomial, about 1 ulp) that the compiler vectorises. Exactly 0 below -87 (so -inf gives
 * 0), +inf above 88, NaN passes through. */

static inline float oss_expf(float x) {
  float xc = x < -87.0f ? -87.0f : x;
  xc = xc > 88.0f ? 88.0f : xc;
  xc = xc == xc ? xc : 0.0f;                                 /* keep NaN out of the int path */
  float fn = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x / ln2) */
  float r = xc - fn * 0.693359375f;                           /* ln2 split in two parts */
  r = r - fn * -2.12194440e-4f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  oss_bits32 scale = {.u = (uint32_t)((int32_t)fn + 127) << 23};
  float y = p * scale.f;
  y = x < -87.0f ? 0.0f : y;
  y = x > 88.0f ? INFINITY : y;
  return x == x ? y : x;
}

/* ---- compensated sums ------------------------------------------------------
 * A Neumaier running sum: s + c holds the sum of the terms added so far to
 * about one rounding of the result, however many terms cancel. */

typedef struct oss_csum {
  double s, c;
} oss_csum;

static inline void oss_csum_add(oss_csum *a, double v) {
  const double t = a->s + v;
  a->c += fabs(a->s) >= fabs(v) ? (a->s - t) + v : (v - t) + a->s;
  a->s = t;
}

/* The sum as hi + lo: hi rounded once, lo the rest. Once the running sum is
 * inf or NaN it stays so (c is then NaN): hi is that, as a plain sum gives,
 * and lo is 0. */
static inline void oss_csum_split(oss_csum a, double *hi, double *lo) {
  *hi = isfinite(a.s) ? a.s + a.c : a.s;
  *lo = isfinite(*hi) ? a.c - (*hi - a.s) : 0;
}

/* ---- instruction sets ------------------------------------------------------
 * The hot loops are plain C that the compiler vectorises. Where GCC can, each
 * task function is also compiled for x86-64-v3 (AVX2, FMA) and picked at load
 * time by the CPU it runs on; the default clone keeps the baseline ISA. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define OSS_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define OSS_VECTOR_CLONES
#endif

/* ---- threads -------------------------------------------------------------- */

static inline void oss_cpu_parallel_for(const oss_cpu_exec *exec, int64_t n, int64_t grain, void *ctx,
                                        oss_range_fn fn) {
  if (n <= 0) return;
  if (exec && exec->parallel_for) exec->parallel_for(n, grain, ctx, fn);
  else fn(ctx, 0, n);
}

#endif /* OSS_CPU_COMMON_H */
