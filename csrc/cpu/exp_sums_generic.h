/*
 * exp_sums_generic.h - the two row reductions the CPU softmax and
 * cross-entropy kernels share, compiled once per precision: included by a
 * generic body with REAL (float or double), FN(name) (the name with the
 * precision's suffix) and EXP defined, and OSS_SUM_BLOCK (terms per REAL
 * partial sum) in scope.
 */

/* Max of a run, NaN if the run holds a NaN (as PyTorch's CPU softmax). */
static inline REAL FN(max_of)(const REAL *x, int64_t n) {
  REAL m = -INFINITY;
  int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
  for (int64_t i = 0; i < n; i++) {
    m = x[i] > m ? x[i] : m;
    nan |= x[i] != x[i];
  }
  return nan ? (REAL)NAN : m;
}

/* The forward's exp sums run in blocks of OSS_SUM_BLOCK terms (vectorised, in
 * REAL) whose partial sums accumulate in double: a single float running sum
 * near 1 would silently drop the many tiny exp terms of a row with outliers. */

/* sum of exp(x - m); NaN when m is -inf or +inf, as PyTorch's softmax gives.
 * The terms of elements equal to m (1 each, NaN for m = +inf) are summed
 * apart from the others: a REAL partial that held a 1 would round away the
 * small terms of a row with one dominant element, and log_softmax's output
 * there is -log(d) = -(d - 1) to first order, so it needs d - 1 whole. */
static inline double FN(sum_exp)(const REAL *x, int64_t n, REAL m) {
  double total = 0;
  for (int64_t b = 0; b < n; b += OSS_SUM_BLOCK) {
    const int64_t e = n - b < OSS_SUM_BLOCK ? n : b + OSS_SUM_BLOCK;
    REAL s = 0, top = 0;
#pragma omp simd reduction(+ : s, top)
    for (int64_t i = b; i < e; i++) {
      const REAL t = EXP(x[i] - m);
      const int is_top = x[i] == m;
      s += is_top ? 0 : t;
      top += is_top ? t : 0;
    }
    total += (double)s + (double)top;
  }
  return total;
}
