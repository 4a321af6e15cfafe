/*
 * cross_entropy.c - C11 CPU cross-entropy over class indices, forward and
 * backward, as oss.h describes (per-row loss with label smoothing and z-loss,
 * ignore_index rows giving 0).
 *
 * Forward: one pass over each row in chunks of OSS_CE_CHUNK elements keeps
 * the online statistics of the softmax kernels (running max m, sum d of
 * exp(x - m) rescaled by exp(m_old - m_new) when m grows) and, in the same
 * pass, the row's sum of logits (for label smoothing); the target logit is
 * read directly. Backward: one pass over each row reading the logits and
 * writing the gradient from the saved lse.
 *
 * Computes in float for float32/float16/bfloat16 logits and in double for
 * float64 ones (the body below is compiled twice, by including this file into
 * itself); the exp sums and the logit sum accumulate in double, and the final
 * per-row combination (lse, loss) is done in double. Threads split the rows
 * (oss_cpu_exec); each row is owned by one task, so results do not depend on
 * the thread count.
 * lse is kept in double for every dtype; the float backward subtracts it as
 * a float pair (hi + lo), so x - hi is exact where x is close to lse (the
 * dominant class) and the gradient there keeps float accuracy.
 * The backward may write in place (grad_logits the logits themselves, with
 * the same row stride): each chunk is read before it is written.
 * Also the mean loss's glue (row weights from the targets, the loss's total),
 * serial loops.
 *
 * Class probabilities (oss_cross_entropy_probs_*): the same row split and
 * chunks (OSS_CEP_CHUNK elements of the logits and of the target). Forward,
 * one pass: besides m and d, the row keeps S = sum u_j (u_j = w_j t'_j) and
 * A = sum u_j (x_j - m) relative to the exp shift m (0 while m is -inf);
 * when m moves from m_old to m_new, A gains S (m_old - m_new), exactly the
 * rebase of every term so far. The loss is S log d - A (+ z lse^2): for
 * u >= 0 both terms are >= 0, so nothing cancels, where the textbook
 * S lse - sum u_j x_j loses all digits when lse is large (1e4). The
 * products are formed in the compute type and summed in blocks of
 * OSS_SUM_BLOCK in it, the blocks in double (as the exp sums). Backward, one
 * pass: grad_x = g ((S p - u_j) + 2 z lse p), p = exp((x - hi) - lo), u_j
 * formed as the forward formed it (a one-class row's cross-entropy term is
 * then 0 exactly, as F.cross_entropy's), and
 * (where wanted) grad_t = g (1 - eps) w_j ((hi - x) + lo), lse split as in
 * the class-index backward. Limits: rows unit-stride, gradients apart from
 * the inputs.
 * Limits: rows must be contiguous (unit stride along classes); loss and
 * grad_loss are contiguous and float64 exactly when logits are.
 */
#ifndef OSS_CE_BODY

#include "cpu_common.h"

/* OSS_CEP_CHUNK: the probability kernels hold four chunks (logits, target,
 * their two gradients) on the stack, 64 KB in double */
enum { OSS_CE_CHUNK = 4096, OSS_CEP_CHUNK = 2048, OSS_SUM_BLOCK = 64 };

/* Class probabilities: a double sum with Neumaier's compensation: a row's thousands of block sums
 * added one after another would otherwise lose about one rounding per block
 * (float64 rows of 128k classes then miss F.cross_entropy's pairwise sums'
 * accuracy); value = sum + comp. */
typedef struct cep_acc {
  double sum, comp;
} cep_acc;
static inline void cep_add(cep_acc *acc, double v) {
  const double t = acc->sum + v;
  /* (an infinite sum keeps its comp: inf - inf would make it NaN) */
  if (isfinite(t)) acc->comp += fabs(acc->sum) >= fabs(v) ? (acc->sum - t) + v : (v - t) + acc->sum;
  acc->sum = t;
}

#define OSS_CE_BODY
#define OSS_GENERIC_BODY "cross_entropy.c"
#include "cpu_precisions.h"
#undef OSS_CE_BODY

/* ---- validation ------------------------------------------------------------ */

static oss_status ce_check(const char *op, const oss_cross_entropy_params *p) {
  const oss_status st = oss_cross_entropy_check_params(op, p);
  if (st != OSS_OK) return st;
  /* A serial scan, O(rows), so that no out-of-range target is ever used as an index. */
  for (int64_t r = 0; r < p->rows; r++) {
    const int64_t t = p->target[r];
    if (t != p->ignore_index && (t < 0 || t >= p->classes))
      return oss_fail(OSS_ERROR_INVALID_ARGUMENT,
                      "%s: target[%lld] = %lld is out of range: expected a class index in [0, %lld) or "
                      "ignore_index=%lld",
                      op, (long long)r, (long long)t, (long long)p->classes, (long long)p->ignore_index);
  }
  return OSS_OK;
}

static int64_t ce_grain(int64_t classes) { return classes >= 16384 ? 1 : 16384 / classes; }

/* ---- entry points ------------------------------------------------------------ */

oss_status oss_cross_entropy_forward_cpu(const oss_cross_entropy_params *p, const oss_cpu_exec *exec) {
  const char *op = "cross_entropy";
  oss_status st = ce_check(op, p);
  if (st != OSS_OK) return st;
  if (p->rows > 0 && p->loss == NULL) return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: loss is NULL", op);
  if (p->rows == 0) return OSS_OK;
  const int f64 = p->dtype == OSS_FLOAT64;
  oss_cpu_parallel_for(exec, p->rows, ce_grain(p->classes), (void *)p, f64 ? ce_fwd_rows_f64 : ce_fwd_rows_f32);
  return OSS_OK;
}

oss_status oss_cross_entropy_backward_cpu(const oss_cross_entropy_backward_params *p, const oss_cpu_exec *exec) {
  const char *op = "cross_entropy_backward";
  oss_status st = ce_check(op, &p->fwd);
  if (st != OSS_OK) return st;
  if (p->fwd.rows > 0 && (p->grad_loss == NULL || p->grad_logits == NULL))
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: grad_loss or grad_logits is NULL", op);
  if (p->fwd.rows > 1 && p->grad_logits_stride_row < p->fwd.classes)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: grad_logits_stride_row=%lld is below classes=%lld", op,
                    (long long)p->grad_logits_stride_row, (long long)p->fwd.classes);
  if (p->fwd.rows == 0) return OSS_OK;
  const int f64 = p->fwd.dtype == OSS_FLOAT64;
  if (p->grad_scale != NULL && (f64 ? *(const double *)p->grad_scale : (double)*(const float *)p->grad_scale) == 1.0)
    return OSS_OK; /* grad_logits already holds this gradient */
  oss_cpu_parallel_for(exec, p->fwd.rows, ce_grain(p->fwd.classes), (void *)p,
                       f64 ? ce_bwd_rows_f64 : ce_bwd_rows_f32);
  return OSS_OK;
}

/* ---- class probabilities ----------------------------------------------------------- */

oss_status oss_cross_entropy_probs_forward_cpu(const oss_cross_entropy_probs_params *p, const oss_cpu_exec *exec) {
  const char *op = "cross_entropy_probs";
  const oss_status st = oss_cross_entropy_probs_check_params(op, p);
  if (st != OSS_OK) return st;
  if (p->rows > 0 && p->loss == NULL) return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: loss is NULL", op);
  if (p->rows == 0) return OSS_OK;
  const int f64 = p->dtype == OSS_FLOAT64;
  oss_cpu_parallel_for(exec, p->rows, ce_grain(p->classes), (void *)p, f64 ? cep_fwd_rows_f64 : cep_fwd_rows_f32);
  return OSS_OK;
}

oss_status oss_cross_entropy_probs_backward_cpu(const oss_cross_entropy_probs_backward_params *p,
                                                const oss_cpu_exec *exec) {
  const oss_status st = oss_cross_entropy_probs_check_backward("cross_entropy_probs_backward", p);
  if (st != OSS_OK) return st;
  if (p->fwd.rows == 0) return OSS_OK;
  const int f64 = p->fwd.dtype == OSS_FLOAT64;
  oss_cpu_parallel_for(exec, p->fwd.rows, ce_grain(p->fwd.classes), (void *)p,
                       f64 ? cep_bwd_rows_f64 : cep_bwd_rows_f32);
  return OSS_OK;
}

/* ---- the mean loss's glue (oss.h): serial, O(rows) ------------------------------ */

oss_status oss_cross_entropy_row_weights_cpu(const int64_t *target, int64_t rows, int64_t ignore_index, oss_dtype dtype,
                                             int mean, void *weights, int64_t *count) {
  const oss_status st = oss_cross_entropy_check_glue("cross_entropy_row_weights", rows, dtype, target, weights, count);
  if (st != OSS_OK) return st;
  int64_t n = 0;
  for (int64_t i = 0; i < rows; i++) n += target[i] != ignore_index;
  *count = n;
  for (int64_t i = 0; i < rows; i++) {
    const int c = target[i] != ignore_index;
    if (dtype == OSS_FLOAT64) ((double *)weights)[i] = mean ? (double)c / (double)n : (double)c;
    else ((float *)weights)[i] = mean ? (float)c / (float)n : (float)c;
  }
  return OSS_OK;
}

oss_status oss_cross_entropy_total_cpu(const void *loss, int64_t rows, oss_dtype dtype, const int64_t *count,
                                       void *total) {
  const oss_status st = oss_cross_entropy_check_glue("cross_entropy_total", rows, dtype, loss, loss, total);
  if (st != OSS_OK) return st;
  double s = 0;
  for (int64_t i = 0; i < rows; i++) s += dtype == OSS_FLOAT64 ? ((const double *)loss)[i] : ((const float *)loss)[i];
  if (dtype == OSS_FLOAT64) *(double *)total = count ? s / (double)*count : s;
  else *(float *)total = count ? (float)s / (float)*count : (float)s;
  return OSS_OK;
}

#else /* OSS_CE_BODY: the row tasks, compiled once per REAL */

#include "exp_sums_generic.h" /* max_of, sum_exp */

static inline double FN(ce_sum)(const REAL *x, int64_t n) {
  double total = 0;
#pragma omp simd reduction(+ : total)
  for (int64_t i = 0; i < n; i++) total += (double)x[i];
  return total;
}

static inline const REAL *FN(ce_read)(const void *base, oss_dtype dtype, int64_t offset, REAL *buf, int64_t n) {
  if (dtype == NATIVE) return (const REAL *)base + offset;
  LOAD(base, dtype, offset, 1, buf, n);
  return buf;
}

OSS_VECTOR_CLONES
static void FN(ce_fwd_rows)(void *ctx, int64_t begin, int64_t end) {
  const oss_cross_entropy_params *p = (const oss_cross_entropy_params *)ctx;
  REAL buf[OSS_CE_CHUNK];
  const int64_t C = p->classes;
  const double eps = p->label_smoothing;
  for (int64_t row = begin; row < end; row++) {
    const int64_t xo = row * p->logits_stride_row, t = p->target[row];
    REAL m = -INFINITY;
    double d = 0, sum_x = 0, x_t = 0;
    for (int64_t c = 0; c < C; c += OSS_CE_CHUNK) {
      const int64_t len = C - c < OSS_CE_CHUNK ? C - c : OSS_CE_CHUNK;
      const REAL *x = FN(ce_read)(p->logits, p->dtype, xo + c, buf, len);
      const REAL cm = FN(max_of)(x, len);
      /* online rescale: a NaN max sticks; while m is -inf, d is 0 */
      const REAL m_new = (cm > m || cm != cm) ? cm : m;
      if (m_new != m && m != -INFINITY) d *= (double)EXP(m - m_new);
      m = m_new;
      if (m != -INFINITY) d += FN(sum_exp)(x, len, m);
      if (eps != 0) sum_x += FN(ce_sum)(x, len);
      if (t >= c && t < c + len) x_t = (double)x[t - c];
    }
    const double lse = (double)m + log(d);
    double loss = 0;
    if (t != p->ignore_index) {
      loss = (1 - eps) * (lse - x_t);
      if (eps != 0) loss += eps * (lse - sum_x / (double)C);
      if (p->z_loss != 0) loss += p->z_loss * lse * lse;
    }
    if (NATIVE == OSS_FLOAT64) ((double *)p->loss)[row] = loss;
    else ((float *)p->loss)[row] = (float)loss;
    ((double *)p->lse)[row] = lse;
  }
}

OSS_VECTOR_CLONES
static void FN(ce_bwd_rows)(void *ctx, int64_t begin, int64_t end) {
  const oss_cross_entropy_backward_params *b = (const oss_cross_entropy_backward_params *)ctx;
  const oss_cross_entropy_params *p = &b->fwd;
  REAL xbuf[OSS_CE_CHUNK], ybuf[OSS_CE_CHUNK];
  const int64_t C = p->classes;
  const double eps = p->label_smoothing;
  for (int64_t row = begin; row < end; row++) {
    const int64_t xo = row * p->logits_stride_row, yo = row * b->grad_logits_stride_row, t = p->target[row];
    const int ignored = t == p->ignore_index;
    double g = ignored ? 0.0
               : NATIVE == OSS_FLOAT64 ? ((const double *)b->grad_loss)[row]
                                       : (double)((const float *)b->grad_loss)[row];
    /* the product in the loss's dtype, as the upstream gradient a caller
     * would pass for it */
    if (b->grad_scale != NULL)
      g = NATIVE == OSS_FLOAT64 ? g * *(const double *)b->grad_scale
                                : (double)((float)g * *(const float *)b->grad_scale);
    const double lse = ((const double *)p->lse)[row];
    /* grad_j = a exp(x_j - lse) - s, and grad_t -= g (1 - eps) */
    const REAL a = (REAL)(g * (1 + 2 * p->z_loss * lse)), s = (REAL)(g * eps / (double)C);
    const REAL lse_hi = (REAL)lse, lse_lo = isfinite(lse) ? (REAL)(lse - (double)lse_hi) : 0;
    for (int64_t c = 0; c < C; c += OSS_CE_CHUNK) {
      const int64_t len = C - c < OSS_CE_CHUNK ? C - c : OSS_CE_CHUNK;
      REAL *y = p->dtype == NATIVE ? (REAL *)b->grad_logits + yo + c : ybuf;
      if (ignored) {
        for (int64_t i = 0; i < len; i++) y[i] = 0;
      } else {
        const REAL *x = FN(ce_read)(p->logits, p->dtype, xo + c, xbuf, len);
        /* x_t before the loop: in place (y == x) the loop overwrites it */
        const double xt = t >= c && t < c + len ? (double)x[t - c] : 0.0;
#pragma omp simd
        for (int64_t i = 0; i < len; i++) y[i] = a * EXP((x[i] - lse_hi) - lse_lo) - s;
        if (t >= c && t < c + len) {
          /* the target element in double: p_t - 1 cancels when p_t is near 1 */
          const double pt = exp(xt - lse);
          y[t - c] = (REAL)(g * ((pt * (1 + 2 * p->z_loss * lse) - 1) + eps * (1 - 1 / (double)C)));
        }
      }
      if (p->dtype != NATIVE) STORE(b->grad_logits, p->dtype, yo + c, 1, y, len);
    }
  }
}

/* ---- class probabilities ---- */

/* The exp shift of a row's running max m: m, or 0 while m is -inf (so that
 * -inf - -inf never makes a NaN by itself). */
static inline REAL FN(cep_shift)(REAL m) { return m == -INFINITY ? (REAL)0 : m; }

/* a += sum u_i (x_i - ms) and s += sum u_i over a chunk, u_i = w_i (c1 t_i +
 * c0) (w NULL: 1), each block of OSS_SUM_BLOCK summed in REAL, the blocks
 * added in compensated double. u_i = 0 at x_i = -inf gives NaN (0 * -inf),
 * as F.cross_entropy. */
static inline void FN(cep_sums)(const REAL *x, const REAL *t, const REAL *w, int64_t n, REAL c1, REAL c0, REAL ms,
                                cep_acc *a, cep_acc *s) {
  for (int64_t b = 0; b < n; b += OSS_SUM_BLOCK) {
    const int64_t e = n - b < OSS_SUM_BLOCK ? n : b + OSS_SUM_BLOCK;
    REAL ba = 0, bs = 0;
    if (w == NULL) {
#pragma omp simd reduction(+ : ba, bs)
      for (int64_t i = b; i < e; i++) {
        const REAL u = c1 * t[i] + c0;
        ba += u * (x[i] - ms);
        bs += u;
      }
    } else {
#pragma omp simd reduction(+ : ba, bs)
      for (int64_t i = b; i < e; i++) {
        const REAL u = w[i] * (c1 * t[i] + c0);
        ba += u * (x[i] - ms);
        bs += u;
      }
    }
    cep_add(a, (double)ba);
    cep_add(s, (double)bs);
  }
}

OSS_VECTOR_CLONES
static void FN(cep_fwd_rows)(void *ctx, int64_t begin, int64_t end) {
  const oss_cross_entropy_probs_params *p = (const oss_cross_entropy_probs_params *)ctx;
  REAL xbuf[OSS_CEP_CHUNK], tbuf[OSS_CEP_CHUNK];
  const int64_t C = p->classes;
  const REAL c1 = (REAL)(1 - p->label_smoothing), c0 = (REAL)(p->label_smoothing / (double)C);
  const REAL *w = (const REAL *)p->weight; /* the loss's dtype is REAL */
  for (int64_t row = begin; row < end; row++) {
    const int64_t xo = row * p->logits_stride_row, to = row * p->target_stride_row;
    REAL m = -INFINITY;
    double d = 0;
    cep_acc a = {0, 0}, s = {0, 0};
    for (int64_t c = 0; c < C; c += OSS_CEP_CHUNK) {
      const int64_t len = C - c < OSS_CEP_CHUNK ? C - c : OSS_CEP_CHUNK;
      const REAL *x = FN(ce_read)(p->logits, p->dtype, xo + c, xbuf, len);
      const REAL *t = FN(ce_read)(p->target, p->dtype, to + c, tbuf, len);
      const REAL cm = FN(max_of)(x, len);
      /* online rescale, as the class-index forward; a NaN max sticks */
      const REAL m_new = (cm > m || cm != cm) ? cm : m;
      if (m_new != m) {
        if (m != -INFINITY) d *= (double)EXP(m - m_new);
        /* the terms so far, rebased */
        cep_add(&a, (s.sum + s.comp) * ((double)FN(cep_shift)(m) - (double)FN(cep_shift)(m_new)));
      }
      m = m_new;
      if (m != -INFINITY) d += FN(sum_exp)(x, len, m);
      FN(cep_sums)(x, t, w ? w + c : NULL, len, c1, c0, FN(cep_shift)(m), &a, &s);
    }
    const double log_d = log(d), lse = (double)m + log_d, S = s.sum + s.comp;
    double loss = S * log_d - (a.sum + a.comp);
    if (p->z_loss != 0) loss += p->z_loss * lse * lse;
    if (NATIVE == OSS_FLOAT64) ((double *)p->loss)[row] = loss;
    else ((float *)p->loss)[row] = (float)loss;
    ((double *)p->lse)[row] = lse;
    ((double *)p->target_sum)[row] = S;
  }
}

OSS_VECTOR_CLONES
static void FN(cep_bwd_rows)(void *ctx, int64_t begin, int64_t end) {
  const oss_cross_entropy_probs_backward_params *b = (const oss_cross_entropy_probs_backward_params *)ctx;
  const oss_cross_entropy_probs_params *p = &b->fwd;
  REAL xbuf[OSS_CEP_CHUNK], tbuf[OSS_CEP_CHUNK], ybuf[OSS_CEP_CHUNK], zbuf[OSS_CEP_CHUNK];
  const int64_t C = p->classes;
  const double eps = p->label_smoothing;
  const REAL *w = (const REAL *)p->weight;
  const int native = p->dtype == NATIVE;
  for (int64_t row = begin; row < end; row++) {
    const double g = NATIVE == OSS_FLOAT64 ? ((const double *)b->grad_loss)[row]
                                           : (double)((const float *)b->grad_loss)[row];
    const double lse = ((const double *)p->lse)[row], S = ((const double *)p->target_sum)[row];
    /* grad_x = g ((S p - u) + 2 z lse p), p = exp(x - lse), u = w (c1 t + c0)
     * formed as the forward formed it, the z-loss's term apart: where p S is
     * u (one class) the first term is exactly 0 and the second keeps its
     * digits; grad_t = gt w (lse - x) */
    const REAL gr = (REAL)g, sr = (REAL)S, zl = (REAL)(2 * p->z_loss * lse), c1 = (REAL)(1 - eps),
               c0 = (REAL)(eps / (double)C), gt = (REAL)(g * (1 - eps));
    const REAL lse_hi = (REAL)lse, lse_lo = isfinite(lse) ? (REAL)(lse - (double)lse_hi) : 0;
    const int64_t xo = row * p->logits_stride_row, to = row * p->target_stride_row;
    const int64_t yo = row * b->grad_logits_stride_row, zo = row * b->grad_target_stride_row;
    for (int64_t c = 0; c < C; c += OSS_CEP_CHUNK) {
      const int64_t len = C - c < OSS_CEP_CHUNK ? C - c : OSS_CEP_CHUNK;
      const REAL *x = FN(ce_read)(p->logits, p->dtype, xo + c, xbuf, len);
      const REAL *t = FN(ce_read)(p->target, p->dtype, to + c, tbuf, len);
      REAL *y = native ? (REAL *)b->grad_logits + yo + c : ybuf;
      if (w == NULL) {
#pragma omp simd
        for (int64_t i = 0; i < len; i++) {
          const REAL e = EXP((x[i] - lse_hi) - lse_lo);
          y[i] = gr * ((sr * e - (c1 * t[i] + c0)) + zl * e);
        }
      } else {
        const REAL *wc = w + c;
#pragma omp simd
        for (int64_t i = 0; i < len; i++) {
          const REAL e = EXP((x[i] - lse_hi) - lse_lo);
          y[i] = gr * ((sr * e - wc[i] * (c1 * t[i] + c0)) + zl * e);
        }
      }
      if (!native) STORE(b->grad_logits, p->dtype, yo + c, 1, y, len);
      if (b->grad_target != NULL) {
        REAL *z = native ? (REAL *)b->grad_target + zo + c : zbuf;
        if (w == NULL) {
#pragma omp simd
          for (int64_t i = 0; i < len; i++) z[i] = gt * ((lse_hi - x[i]) + lse_lo);
        } else {
          const REAL *wc = w + c;
#pragma omp simd
          for (int64_t i = 0; i < len; i++) z[i] = (gt * wc[i]) * ((lse_hi - x[i]) + lse_lo);
        }
        if (!native) STORE(b->grad_target, p->dtype, zo + c, 1, z, len);
      }
    }
  }
}

#endif /* OSS_CE_BODY */
