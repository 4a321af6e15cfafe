/*
 * softmax_generic.h - the CPU softmax family written once over a compute type.
 * softmax.c includes it twice: REAL = float (float32/float16/bfloat16 tensors)
 * and REAL = double (float64 tensors). FN(name) appends the type suffix.
 *
 * Rows (inner == 1): a task is a range of rows; each row is streamed in
 * chunks of OSS_ROW_CHUNK elements: pass 1 keeps the online statistics
 * (max m, denominator d rescaled by exp(m_old - m_new) when m grows), pass 2
 * normalises. Columns (inner > 1): a task is one outer index and a block of
 * OSS_COL_BLOCK adjacent inner columns; the same two passes run with one
 * (m, d) per column, OSS_COL_CHUNK rows of the block at a time, so the inner
 * loops run over unit-stride columns and vectorise.
 */

/* ---- direct access or conversion -----------------------------------------
 * A run of `count` unit-stride elements at base[offset] is read in place when
 * the tensor already holds REAL, else converted into `buf`; outputs are
 * computed in place when the output holds REAL, else in `buf` and converted. */

static inline const REAL *FN(read_run)(const void *base, oss_dtype dtype, int64_t offset, REAL *buf,
                                       int64_t count) {
  if (dtype == NATIVE) return (const REAL *)base + offset;
  LOAD(base, dtype, offset, 1, buf, count);
  return buf;
}

static inline REAL *FN(write_target)(void *base, oss_dtype dtype, int64_t offset, REAL *buf) {
  return dtype == NATIVE ? (REAL *)base + offset : buf;
}

static inline void FN(write_run)(void *base, oss_dtype dtype, int64_t offset, const REAL *run, int64_t count) {
  if (dtype != NATIVE) STORE(base, dtype, offset, 1, run, count);
}

/* ---- small vectorisable reductions ---------------------------------------- */

#include "exp_sums_generic.h" /* max_of, sum_exp */

/* y[i] = exp(x[i] - m), returning the sum (blocked like sum_exp). */
static inline double FN(exp_sum_to)(const REAL *x, REAL *y, int64_t n, REAL m) {
  double total = 0;
  for (int64_t b = 0; b < n; b += OSS_SUM_BLOCK) {
    const int64_t e = n - b < OSS_SUM_BLOCK ? n : b + OSS_SUM_BLOCK;
    REAL s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = b; i < e; i++) {
      y[i] = EXP(x[i] - m);
      s += y[i];
    }
    total += s;
  }
  return total;
}

/* The backward's sums (of g, or of y * g where y is not NULL) accumulate in
 * double from the first term: they cancel against dy at an element that
 * dominates its row, where any rounding of the sum is all of dx's error (see
 * oss_log_softmax_grad_near_one). Float terms summed in double are far more
 * precise than a float result needs; double terms take a compensated sum
 * (a plain one rounds sum dy of a 33000-wide row at |sum| ~ 400 by up to
 * ~3e-12, which lands whole in dx where exp(y) ~ 1). */
static inline void FN(accumulate)(oss_csum *acc, const REAL *g, const REAL *y, int64_t n) {
  if (sizeof(REAL) == sizeof(float)) {
    double total = 0;
    if (y) {
#pragma omp simd reduction(+ : total)
      for (int64_t i = 0; i < n; i++) total += (double)y[i] * (double)g[i];
    } else {
#pragma omp simd reduction(+ : total)
      for (int64_t i = 0; i < n; i++) total += (double)g[i];
    }
    oss_csum_add(acc, total);
  } else {
    for (int64_t i = 0; i < n; i++) oss_csum_add(acc, y ? (double)y[i] * (double)g[i] : (double)g[i]);
  }
}

/* The backward's constants from a sum: s rounded to REAL, s_lo the rest. */
static inline void FN(sum_constants)(oss_csum acc, REAL *s, REAL *s_lo) {
  double hi, lo;
  oss_csum_split(acc, &hi, &lo);
  *s = (REAL)hi;
  *s_lo = isfinite(hi) ? (REAL)((hi - (double)*s) + lo) : 0;
}

/* Folds a chunk whose max is chunk_max into the running (m, d): d is
 * rescaled by exp(m_old - m_new) when m grows. A NaN max sticks. While m is
 * still -inf every value so far is -inf and d stays 0 (the caller skips the
 * chunk's exp-sum then: exp(-inf - -inf) would be NaN). */
static inline REAL FN(online_rescale)(REAL *m, double *d, REAL chunk_max) {
  REAL m_new = (chunk_max > *m || chunk_max != chunk_max) ? chunk_max : *m;
  if (m_new != *m && *m != -INFINITY) *d *= (double)EXP(*m - m_new);
  *m = m_new;
  return m_new;
}

/* ---- forward over rows (inner == 1) --------------------------------------- */

OSS_VECTOR_CLONES
static void FN(softmax_fwd_rows)(void *ctx, int64_t begin, int64_t end) {
  const oss_softmax_params *p = (const oss_softmax_params *)ctx;
  REAL xbuf[OSS_ROW_CHUNK], ybuf[OSS_ROW_CHUNK];
  const int64_t n = p->n;
  for (int64_t row = begin; row < end; row++) {
    const int64_t xo = row * p->x.stride_outer, yo = row * p->y.stride_outer;
    if (n <= OSS_ROW_CHUNK && !p->log) {
      /* The row fits the buffer: read it once and take each exp once. */
      const REAL *x = FN(read_run)(p->x.data, p->x.dtype, xo, xbuf, n);
      REAL *y = FN(write_target)(p->y.data, p->y.dtype, yo, ybuf);
      const REAL m = FN(max_of)(x, n);
      const REAL inv_d = (REAL)(1 / FN(exp_sum_to)(x, y, n, m));
      for (int64_t i = 0; i < n; i++) y[i] *= inv_d;
      FN(write_run)(p->y.data, p->y.dtype, yo, y, n);
      continue;
    }
    REAL m = -INFINITY;
    double d = 0;
    for (int64_t c = 0; c < n; c += OSS_ROW_CHUNK) {
      const int64_t len = n - c < OSS_ROW_CHUNK ? n - c : OSS_ROW_CHUNK;
      const REAL *x = FN(read_run)(p->x.data, p->x.dtype, xo + c, xbuf, len);
      if (FN(online_rescale)(&m, &d, FN(max_of)(x, len)) != -INFINITY) d += FN(sum_exp)(x, len, m);
    }
    const REAL inv_d = (REAL)(1 / d), log_d = (REAL)log(d);
    for (int64_t c = 0; c < n; c += OSS_ROW_CHUNK) {
      const int64_t len = n - c < OSS_ROW_CHUNK ? n - c : OSS_ROW_CHUNK;
      const REAL *x = FN(read_run)(p->x.data, p->x.dtype, xo + c, xbuf, len);
      REAL *y = FN(write_target)(p->y.data, p->y.dtype, yo + c, ybuf);
      if (p->log)
        for (int64_t i = 0; i < len; i++) y[i] = (x[i] - m) - log_d;
      else
        for (int64_t i = 0; i < len; i++) y[i] = EXP(x[i] - m) * inv_d;
      FN(write_run)(p->y.data, p->y.dtype, yo + c, y, len);
    }
  }
}

/* ---- forward over columns (inner > 1) ------------------------------------- */

OSS_VECTOR_CLONES
static void FN(softmax_fwd_cols)(void *ctx, int64_t begin, int64_t end) {
  const oss_softmax_params *p = (const oss_softmax_params *)ctx;
  const int64_t blocks = (p->inner + OSS_COL_BLOCK - 1) / OSS_COL_BLOCK;
  REAL tile[OSS_COL_CHUNK][OSS_COL_BLOCK], m[OSS_COL_BLOCK], inv_d[OSS_COL_BLOCK], log_d[OSS_COL_BLOCK];
  double d[OSS_COL_BLOCK];
  for (int64_t task = begin; task < end; task++) {
    const int64_t o = task / blocks, j0 = (task % blocks) * OSS_COL_BLOCK;
    const int64_t w = p->inner - j0 < OSS_COL_BLOCK ? p->inner - j0 : OSS_COL_BLOCK;
    const int64_t xo = o * p->x.stride_outer + j0, yo = o * p->y.stride_outer + j0;
    for (int64_t j = 0; j < w; j++) m[j] = -INFINITY, d[j] = 0;
    for (int64_t c = 0; c < p->n; c += OSS_COL_CHUNK) {
      const int64_t rows = p->n - c < OSS_COL_CHUNK ? p->n - c : OSS_COL_CHUNK;
      REAL chunk_max[OSS_COL_BLOCK];
      for (int64_t j = 0; j < w; j++) chunk_max[j] = -INFINITY;
      for (int64_t i = 0; i < rows; i++) {
        LOAD(p->x.data, p->x.dtype, xo + (c + i) * p->x.stride_n, 1, tile[i], w);
        for (int64_t j = 0; j < w; j++) chunk_max[j] = tile[i][j] > chunk_max[j] ? tile[i][j] : chunk_max[j];
      }
      for (int64_t j = 0; j < w; j++) FN(online_rescale)(&m[j], &d[j], chunk_max[j]);
      for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < w; j++) /* a column still all -inf adds 0, a NaN adds NaN */
          d[j] += m[j] == -INFINITY ? (tile[i][j] != tile[i][j] ? (double)NAN : 0.0) : (double)EXP(tile[i][j] - m[j]);
    }
    for (int64_t j = 0; j < w; j++) log_d[j] = (REAL)log(d[j]), inv_d[j] = (REAL)(1 / d[j]);
    for (int64_t i = 0; i < p->n; i++) {
      REAL *row = tile[0];
      LOAD(p->x.data, p->x.dtype, xo + i * p->x.stride_n, 1, row, w);
      if (p->log)
        for (int64_t j = 0; j < w; j++) row[j] = (row[j] - m[j]) - log_d[j];
      else
        for (int64_t j = 0; j < w; j++) row[j] = EXP(row[j] - m[j]) * inv_d[j];
      STORE(p->y.data, p->y.dtype, yo + i * p->y.stride_n, 1, row, w);
    }
  }
}

/* ---- backward over rows ----------------------------------------------------
 * softmax:     dx = y * (dy - sum(y * dy))
 * log_softmax: dx = dy - exp(y) * sum(dy)
 * The sum (double) is used as hi + lo in REAL, so that dy - sum is rounded
 * once where it cancels (an element that dominates its row); log_softmax's
 * float elements with y near 0 are redone by oss_log_softmax_grad_near_one,
 * as the CUDA kernels do. */

/* Element i's sum is hi[i * step] + lo[i * step]: step 0 for a row's one sum,
 * 1 for a block of columns' own sums. */
static inline void FN(log_grad_near_one)(const REAL *y, const REAL *g, REAL *dx, int64_t n, const REAL *hi,
                                         const REAL *lo, int64_t step) {
  if (sizeof(REAL) != sizeof(float)) return;
  for (int64_t i = 0; i < n; i++)
    if (y[i] > (REAL)OSS_LOG_SOFTMAX_NEAR_ONE) {
      const float v =
          oss_log_softmax_grad_near_one((float)y[i], (float)g[i], (float)hi[i * step], (float)lo[i * step]);
      if (v == v) dx[i] = v;
    }
}

OSS_VECTOR_CLONES
static void FN(softmax_bwd_rows)(void *ctx, int64_t begin, int64_t end) {
  const oss_softmax_backward_params *p = (const oss_softmax_backward_params *)ctx;
  REAL ybuf[OSS_ROW_CHUNK], gbuf[OSS_ROW_CHUNK], xbuf[OSS_ROW_CHUNK];
  const int64_t n = p->n;
  for (int64_t row = begin; row < end; row++) {
    const int64_t yo = row * p->y.stride_outer, go = row * p->dy.stride_outer,
                  xo = row * p->dx.stride_outer;
    oss_csum sum = {0, 0};
    for (int64_t c = 0; c < n; c += OSS_ROW_CHUNK) {
      const int64_t len = n - c < OSS_ROW_CHUNK ? n - c : OSS_ROW_CHUNK;
      const REAL *g = FN(read_run)(p->dy.data, p->dy.dtype, go + c, gbuf, len);
      FN(accumulate)(&sum, g, p->log ? NULL : FN(read_run)(p->y.data, p->y.dtype, yo + c, ybuf, len), len);
    }
    REAL s, s_lo;
    FN(sum_constants)(sum, &s, &s_lo);
    for (int64_t c = 0; c < n; c += OSS_ROW_CHUNK) {
      const int64_t len = n - c < OSS_ROW_CHUNK ? n - c : OSS_ROW_CHUNK;
      const REAL *y = FN(read_run)(p->y.data, p->y.dtype, yo + c, ybuf, len);
      const REAL *g = FN(read_run)(p->dy.data, p->dy.dtype, go + c, gbuf, len);
      REAL *dx = FN(write_target)(p->dx.data, p->dx.dtype, xo + c, xbuf);
      if (p->log) {
        for (int64_t i = 0; i < len; i++) dx[i] = g[i] - EXP(y[i]) * s;
        FN(log_grad_near_one)(y, g, dx, len, &s, &s_lo, 0);
      } else {
        for (int64_t i = 0; i < len; i++) dx[i] = y[i] * ((g[i] - s) - s_lo);
      }
      FN(write_run)(p->dx.data, p->dx.dtype, xo + c, dx, len);
    }
  }
}

/* ---- backward over columns ------------------------------------------------ */

OSS_VECTOR_CLONES
static void FN(softmax_bwd_cols)(void *ctx, int64_t begin, int64_t end) {
  const oss_softmax_backward_params *p = (const oss_softmax_backward_params *)ctx;
  const int64_t blocks = (p->inner + OSS_COL_BLOCK - 1) / OSS_COL_BLOCK;
  REAL yrow[OSS_COL_BLOCK], grow[OSS_COL_BLOCK], s[OSS_COL_BLOCK], s_lo[OSS_COL_BLOCK];
  oss_csum sum[OSS_COL_BLOCK];
  for (int64_t task = begin; task < end; task++) {
    const int64_t o = task / blocks, j0 = (task % blocks) * OSS_COL_BLOCK;
    const int64_t w = p->inner - j0 < OSS_COL_BLOCK ? p->inner - j0 : OSS_COL_BLOCK;
    const int64_t yo = o * p->y.stride_outer + j0, go = o * p->dy.stride_outer + j0,
                  xo = o * p->dx.stride_outer + j0;
    for (int64_t j = 0; j < w; j++) sum[j].s = sum[j].c = 0;
    for (int64_t i = 0; i < p->n; i++) {
      LOAD(p->dy.data, p->dy.dtype, go + i * p->dy.stride_n, 1, grow, w);
      if (p->log) {
        for (int64_t j = 0; j < w; j++) oss_csum_add(&sum[j], (double)grow[j]);
      } else {
        LOAD(p->y.data, p->y.dtype, yo + i * p->y.stride_n, 1, yrow, w);
        for (int64_t j = 0; j < w; j++) oss_csum_add(&sum[j], (double)yrow[j] * (double)grow[j]);
      }
    }
    for (int64_t j = 0; j < w; j++) FN(sum_constants)(sum[j], &s[j], &s_lo[j]);
    for (int64_t i = 0; i < p->n; i++) {
      LOAD(p->y.data, p->y.dtype, yo + i * p->y.stride_n, 1, yrow, w);
      LOAD(p->dy.data, p->dy.dtype, go + i * p->dy.stride_n, 1, grow, w);
      if (p->log) {
        REAL dx[OSS_COL_BLOCK];
        for (int64_t j = 0; j < w; j++) dx[j] = grow[j] - EXP(yrow[j]) * s[j];
        FN(log_grad_near_one)(yrow, grow, dx, w, s, s_lo, 1);
        memcpy(grow, dx, sizeof(REAL) * (size_t)w);
      } else {
        for (int64_t j = 0; j < w; j++) grow[j] = yrow[j] * ((grow[j] - s[j]) - s_lo[j]);
      }
      STORE(p->dx.data, p->dx.dtype, xo + i * p->dx.stride_n, 1, grow, w);
    }
  }
}
