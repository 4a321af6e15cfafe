/*
 * oss_internal.h - helpers shared by the kernel files (C and CUDA), not part
 * of the public C API in oss.h.
 */
#ifndef OSS_INTERNAL_H
#define OSS_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "oss.h"

#if defined(__CUDACC__)
#define OSS_HOST_DEVICE __host__ __device__
#else
#define OSS_HOST_DEVICE
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The 16-bit attention forwards' output residual (oss.h out_residual), the
 * same on CPU and CUDA: x (the output before its rounding) minus `rounded`
 * (x rounded to float16, or bfloat16 when bf16), itself rounded to a step of
 * 2^-OSS_RESIDUAL_BITS of rounded's unit in the last place (that of the
 * smallest normal below it); 0 where rounded is not finite. The bits below
 * that step are the float32 accumulation's own noise, not information: where
 * every value row is the same, x is that row to a few float32 ulps, and those
 * ulps passed into the backward's D made dq and dk, exactly 0 there, come out
 * several times worse than PyTorch's. The residual is |d| <= half a last
 * place, so it is k steps with |k| <= 2^(OSS_RESIDUAL_BITS - 1) = 16: it is
 * kept as that int8 code k, the step being known from `rounded` (out itself),
 * one byte an element instead of out's two. */
#define OSS_RESIDUAL_BITS 5
/* Branch-free (it runs on every element of a training forward's output): with
 * a = max(|rounded|, the smallest normal) and 2^step the residual's step,
 * c = 1.5 * 2^(step + 23) has 2^step as its last place, so d + c rounds d =
 * x - rounded (exact) to a multiple of 2^step, to nearest with ties to even,
 * as |d|, at most half of rounded's last place, is below 2^(step + 22); the
 * sum stays in c's binade, so its bits minus c's are the code k. Where c's
 * exponent would pass the largest (bfloat16 above 2^116), d and c are scaled
 * by 2^-64, exactly. The code is rint(ldexp(d, -step)), bit for bit
 * (test_attention.py checks it). */
static inline OSS_HOST_DEVICE int oss_residual_exponent(float rounded, int bf16) {
  const float a = fmaxf(fabsf(rounded), bf16 ? 0x1p-126f : 0x1p-14f);
  uint32_t bits;
  memcpy(&bits, &a, sizeof bits);
  /* c's biased exponent: a's plus 23 - mantissa bits - OSS_RESIDUAL_BITS (a not finite: 255 plus that) */
  return (int)(bits >> 23) + 23 - (bf16 ? 7 : 10) - OSS_RESIDUAL_BITS;
}
static inline OSS_HOST_DEVICE float oss_residual_c(int e) {
  const uint32_t cbits = (uint32_t)(e > 254 ? e - 64 : e) << 23 | 0x400000u;
  float c;
  memcpy(&c, &cbits, sizeof c);
  return c;
}
static inline OSS_HOST_DEVICE int oss_output_residual_code(float x, float rounded, int bf16) {
  const int e = oss_residual_exponent(rounded, bf16);
  const float c = oss_residual_c(e), sum = (x - rounded) * (e > 254 ? 0x1p-64f : 1.f) + c;
  uint32_t sbits, cbits;
  memcpy(&sbits, &sum, sizeof sbits);
  memcpy(&cbits, &c, sizeof cbits);
  return isfinite(rounded) ? (int)(sbits - cbits) : 0;
}
/* The residual a code stands for: k steps of `rounded`'s (k * 2^step, exact;
 * a code of 0 gives +0). */
static inline OSS_HOST_DEVICE float oss_output_residual_value(int k, float rounded, int bf16) {
  const int e = oss_residual_exponent(rounded, bf16);
  const float c = oss_residual_c(e);
  uint32_t bits;
  memcpy(&bits, &c, sizeof bits);
  bits += (uint32_t)k;
  float sum;
  memcpy(&sum, &bits, sizeof sum);
  return (sum - c) * (e > 254 ? 0x1p64f : 1.f);
}

/* Softmax backward sums in float32 are carried as hi + lo, lo being what the
 * rounding of hi left out (TwoSum, exact for finite values): at an element
 * that dominates its row the sum cancels against dy, and a float32 sum's own
 * rounding would be all of dx's error there. */
static inline OSS_HOST_DEVICE void oss_add_compensated(float *hi, float *lo, float x) {
  const float t = *hi + x, xb = t - *hi;
  *lo += (*hi - (t - xb)) + (x - xb);
  *hi = t;
}

/* log_softmax's backward for one float32 element, dx = dy - exp(y) * s with
 * s = hi + lo, where exp(y) is near 1 (y > -1/4: at most one element of a
 * row, the dominant one). There dy - s cancels, so dy - hi is split exactly
 * into t + r (TwoSum) and dx = t + (r - lo - expm1(y) * s) is rounded about
 * once, where exp(y) * hi would carry exp's and the product's rounding,
 * each up to an ulp of s. NaN when not finite: the caller's direct form then
 * gives PyTorch's inf and NaN. */
static inline OSS_HOST_DEVICE float oss_log_softmax_grad_near_one(float y, float dy, float hi, float lo) {
  const float t = dy - hi, tb = t - dy;
  const float r = (dy - (t - tb)) + (-hi - tb);
  const float dx = t + ((r - lo) - expm1f(y) * (hi + lo));
  return isfinite(dx) ? dx : NAN;
}
#define OSS_LOG_SOFTMAX_NEAR_ONE (-0.25f)

/* ---- attention dropout ----------------------------------------------------
 * Every kernel (CPU and CUDA, forward and backward) drops the same weights:
 * weight (bh = b * heads_q + h, query i, key j) takes 16 random bits from
 * Philox4x32-7 (Salmon et al., SC'11; seven rounds, as FlashAttention's
 * dropout draws them: the paper finds seven pass BigCrush and recommends ten
 * as a margin, and the rounds are the dropout's main cost) keyed by the
 * 64-bit seed, with the
 * counter (i & ~8, j & ~9, low and high words of bh): one call gives the
 * eight weights {i, i | 8} x {j, j | 1, j | 8, j | 9}, half (j & 1) of word
 * ((i >> 3) & 1) * 2 + ((j >> 3) & 1). That group is what one thread holds of
 * a 16 x 16 tensor-core tile query-major (the forward), so a thread spends
 * one call on eight of its own weights; key-major (the backward) a thread
 * holds half of two groups, and two lanes each draw one and swap halves.
 * A weight is kept when its bits are >= oss_dropout_threshold(p), probability
 * 1 - p to within 2^-17, and then scaled by 1 / (1 - p). */
static inline OSS_HOST_DEVICE uint32_t oss_mulhilo32(uint32_t a, uint32_t b, uint32_t *hi) {
#ifdef __CUDA_ARCH__
  /* one IMAD.WIDE either way, but the 64-bit product's shift leaves an extra
   * add on each high word in the device code */
  *hi = __umulhi(a, b);
  return a * b;
#else
  const uint64_t prod = (uint64_t)a * b;
  *hi = (uint32_t)(prod >> 32);
  return (uint32_t)prod;
#endif
}

#define OSS_PHILOX_ROUNDS 7
/* out[0..3] = Philox4x32-7(counter c0..c3, key k0 k1). */
static inline OSS_HOST_DEVICE void oss_philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                                  uint32_t k1, uint32_t out[4]) {
  for (int round = 0; round < OSS_PHILOX_ROUNDS; round++) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = oss_mulhilo32(0xD2511F53u, c0, &hi0), lo1 = oss_mulhilo32(0xCD9E8D57u, c2, &hi1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* The random words of the group holding (i, j) (any member of the group
 * gives the same words). */
static inline OSS_HOST_DEVICE void oss_dropout_group(uint64_t seed, uint64_t bh, int64_t i, int64_t j,
                                                     uint32_t out[4]) {
  oss_philox4x32((uint32_t)(i & ~(int64_t)8), (uint32_t)(j & ~(int64_t)9), (uint32_t)bh, (uint32_t)(bh >> 32),
                 (uint32_t)seed, (uint32_t)(seed >> 32), out);
}
/* Weight (i, j)'s word in its group's words, and its bits: that word's half j & 1. */
static inline OSS_HOST_DEVICE int oss_dropout_word(int64_t i, int64_t j) {
  return (int)(((i >> 3) & 1) * 2 + ((j >> 3) & 1));
}
static inline OSS_HOST_DEVICE uint32_t oss_dropout_bits(uint32_t word, int64_t j) {
  return (word >> (16 * (int)(j & 1))) & 0xFFFFu;
}
/* Bits below which a weight is dropped: round(p 2^16), all 65536 values at p >= 1. */
static inline OSS_HOST_DEVICE uint32_t oss_dropout_threshold(double p) {
  return p >= 1.0 ? 65536u : (uint32_t)(p * 65536.0 + 0.5);
}
/* The factor a kept weight takes: 1 / (1 - p); 0 at p = 1 (nothing is kept). */
static inline OSS_HOST_DEVICE double oss_dropout_scale(double p) { return p >= 1.0 ? 0.0 : 1.0 / (1.0 - p); }

/* Records a printf-style sentence for oss_error_message() on this thread and
 * returns `status`, so failures read `return oss_fail(OSS_ERROR_..., "...")`. */
oss_status oss_fail(oss_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* The cross-entropy params checks the CPU and CUDA entry points share (dtype,
 * sizes, label_smoothing, z_loss, pointers, row stride); each adds its own. */
oss_status oss_cross_entropy_check_params(const char *op, const oss_cross_entropy_params *p);
/* The checks of the class-probability entry points (both devices), same sentences. */
oss_status oss_cross_entropy_probs_check_params(const char *op, const oss_cross_entropy_probs_params *p);
oss_status oss_cross_entropy_probs_check_backward(const char *op, const oss_cross_entropy_probs_backward_params *b);
/* The checks of the mean loss's glue (row_weights, total): rows >= 0, dtype
 * float32 or float64, rows_a and rows_b (arrays of `rows` entries) not NULL
 * unless rows is 0, one (a single value) not NULL. */
oss_status oss_cross_entropy_check_glue(const char *op, int64_t rows, oss_dtype dtype, const void *rows_a,
                                        const void *rows_b, const void *one);

/* Comma-separated head dims compiled into the CUDA attention kernels
 * (defined by the generated dispatch file; absent in CPU-only builds). */
const char *oss_attention_cuda_head_dims_list(void);
const char *oss_attention_cuda_hopper_head_dims_list(void); /* head dims of the sm_90a wgmma forward */

#ifdef __cplusplus
}
#endif

#endif /* OSS_INTERNAL_H */
