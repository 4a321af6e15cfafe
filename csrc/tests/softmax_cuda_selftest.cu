/*
 * softmax_cuda_selftest.cu - standalone test and timing driver for the CUDA
 * softmax C API (oss.h), no torch.
 *
 *   selftest check   correctness: many shapes / dtypes / alignments / tiers,
 *                    forward and backward, softmax and log_softmax, special
 *                    values, error paths; float64 CPU reference
 *   selftest quick   a reduced check (for compute-sanitizer memcheck)
 *   selftest columns check's column suites only (with SELFTEST_KNOBS="column_threads=512":
 *                    every columns case on 512-thread CTAs where it can)
 *   selftest race    a few small cases per tier (for compute-sanitizer racecheck)
 *   selftest bench   timing table: % of a 1 GiB device-to-device copy
 *                    measured in the same run (bytes read + written)
 *   selftest bench_dim1  only the table's last lines (dim=1 against the last dim)
 *
 * SELFTEST_KNOBS="column_threads=512,rows_at_once=3" sets the planner's test
 * knobs (cuda/softmax/softmax_test_knobs.cuh, by field name) for the whole run.
 *
 * Inputs are fresh random values (randn * 3 plus a few large outliers, never
 * zero); outputs and the whole output buffer are poisoned with NaN (0xff
 * bytes) before each launch, and every byte outside the tensor view must
 * still be poison afterwards. Workspaces are allocated at exactly the size
 * the API reports. Exit status 0 only when every check passed.
 *
 * Build: nvcc -std=c++17 -O3 -DOSS_SOFTMAX_TEST_KNOBS -gencode arch=compute_90a,code=sm_90a -I csrc
 *        csrc/common.c csrc/cuda/softmax/softmax.cu csrc/cuda/softmax/softmax_plan.cu
 *        csrc/cuda/softmax/softmax_launch.cu csrc/tests/softmax_cuda_selftest.cu
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "oss.h"

/* the planner's test knobs (oss_softmax_cuda_test_knobs, softmax_test_knobs.cuh) */
#include "cuda/softmax/softmax_plan.cuh"

#define CK(call)                                                                                  \
  do {                                                                                            \
    cudaError_t e_ = (call);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(2);                                                                                    \
    }                                                                                             \
  } while (0)

static int g_failures = 0, g_cases = 0;
static cudaStream_t g_stream;

// ---- dtypes and host conversion ------------------------------------------------

static size_t dt_size(oss_dtype t) { return t == OSS_FLOAT64 ? 8 : t == OSS_FLOAT32 ? 4 : t == OSS_BOOL ? 1 : 2; }
static const char *dt_name(oss_dtype t) {
  switch (t) {
  case OSS_FLOAT32: return "f32";
  case OSS_FLOAT64: return "f64";
  case OSS_FLOAT16: return "f16";
  case OSS_BFLOAT16: return "bf16";
  default: return "bool";
  }
}

static double get_elem(const void *buf, oss_dtype t, int64_t i) {
  switch (t) {
  case OSS_FLOAT32: return ((const float *)buf)[i];
  case OSS_FLOAT64: return ((const double *)buf)[i];
  case OSS_FLOAT16: return (double)__half2float(((const __half *)buf)[i]);
  case OSS_BFLOAT16: return (double)__bfloat162float(((const __nv_bfloat16 *)buf)[i]);
  default: return 0;
  }
}

static void set_elem(void *buf, oss_dtype t, int64_t i, double v) {
  switch (t) {
  case OSS_FLOAT32: ((float *)buf)[i] = (float)v; break;
  case OSS_FLOAT64: ((double *)buf)[i] = v; break;
  case OSS_FLOAT16: ((__half *)buf)[i] = __float2half_rn((float)v); break;
  case OSS_BFLOAT16: ((__nv_bfloat16 *)buf)[i] = __float2bfloat16_rn((float)v); break;
  default: break;
  }
}

// ---- counter-based random numbers (same on host and device) --------------------

__host__ __device__ static inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
static double unif(uint64_t seed, uint64_t i) { return ((mix64(seed ^ mix64(i)) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
/* randn * 3, one element in 500 an outlier of +-(20..40); never exactly 0 */
static double rand_val(uint64_t seed, uint64_t i) {
  const double u1 = unif(seed, 2 * i), u2 = unif(seed, 2 * i + 1);
  double v = 3.0 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
  const double u3 = unif(seed + 7, i);
  if (u3 < 0.002) v += (u3 < 0.001 ? -1 : 1) * (20 + 20 * unif(seed + 11, i));
  if (v == 0) v = 0.125;
  return v;
}

// ---- strided tensors ---------------------------------------------------------------

typedef struct {
  oss_dtype dt;
  int64_t off, so, sn; /* element offset of the view in the buffer, strides */
  int64_t nbuf;        /* elements in the buffer */
  void *h, *d;         /* host copy of the whole buffer, device buffer (base) */
} tensor;

static void tensor_make(tensor *t, oss_dtype dt, int64_t outer, int64_t n, int64_t inner, int64_t off,
                        int64_t pad_outer, int64_t pad_n) {
  t->dt = dt;
  t->off = off;
  t->sn = inner == 1 ? 1 : inner + pad_n;
  t->so = n * t->sn + pad_outer;
  t->nbuf = off + (outer - 1) * t->so + (n - 1) * t->sn + inner + 24;
  t->h = malloc((size_t)t->nbuf * dt_size(dt));
  if (!t->h) { fprintf(stderr, "host out of memory\n"); exit(2); }
  memset(t->h, 0xff, (size_t)t->nbuf * dt_size(dt));
  CK(cudaMalloc(&t->d, (size_t)t->nbuf * dt_size(dt)));
}
static void tensor_free(tensor *t) {
  free(t->h);
  CK(cudaFree(t->d));
}
static int64_t tidx(const tensor *t, int64_t o, int64_t i, int64_t j) { return t->off + o * t->so + i * t->sn + j; }
static oss_strided3 tensor_view(const tensor *t) {
  oss_strided3 v;
  v.data = (char *)t->d + t->off * dt_size(t->dt);
  v.dtype = t->dt;
  v.stride_outer = t->so;
  v.stride_n = t->sn;
  return v;
}
/* Every copy and fill goes through g_stream, which is non-blocking: work on the
 * legacy default stream (cudaMemset, cudaMemcpy) does not order with it, and a
 * fill still queued there once overwrote the kernel's workspace on a busy GPU. */
static void tensor_upload(tensor *t) {
  CK(cudaMemcpyAsync(t->d, t->h, (size_t)t->nbuf * dt_size(t->dt), cudaMemcpyHostToDevice, g_stream));
  CK(cudaStreamSynchronize(g_stream));
}
static void tensor_poison(tensor *t) { CK(cudaMemsetAsync(t->d, 0xff, (size_t)t->nbuf * dt_size(t->dt), g_stream)); }
static void tensor_download(tensor *t) {
  CK(cudaMemcpyAsync(t->h, t->d, (size_t)t->nbuf * dt_size(t->dt), cudaMemcpyDeviceToHost, g_stream));
  CK(cudaStreamSynchronize(g_stream));
}

// ---- a test case ----------------------------------------------------------------------

typedef struct {
  int bwd, log;
  int64_t outer, n, inner;
  oss_dtype tin, tout; /* forward: x, y      backward: y/dy, dx */
  int64_t off_a, off_b, off_out, pad_outer, pad_n;
  int special; /* 1: rows of -inf, NaN, +inf, partial -inf, one dominant element */
  const char *tag;
} tcase;

/* special row kinds, by line index */
static int line_kind(uint64_t seed, int64_t line) {
  const uint64_t h = mix64(seed * 31 + (uint64_t)line) % 9;
  /* 0-2 normal, 3 all -inf, 4 a NaN, 5 a +inf, 6 some -inf, 7 one finite rest -inf,
     8 one dominant element (0, the rest near -20) */
  return (int)h;
}

/* kind 8's dominant element: its log_softmax is -log1p(d') with d' ~ n * 2e-9,
 * which must come out to 1e-4 relative (a float32 d = 1 + d' rounds d' away) */
static int64_t dominant_index(uint64_t seed, int64_t line, int64_t n) {
  return (int64_t)(mix64(seed * 7 + (uint64_t)line) % (uint64_t)n);
}

static double tol_out_rel(oss_dtype t) {
  return t == OSS_BFLOAT16 ? 1.0 / 256 : t == OSS_FLOAT16 ? 1.0 / 2048 : 0;
}
static double tol_out_abs(oss_dtype t) { return t == OSS_FLOAT16 ? 1e-7 : 1e-37; }

static int run_case(const tcase *c, uint64_t seed) {
  const int64_t outer = c->outer, n = c->n, inner = c->inner;
  const int64_t lines = outer * inner;
  tensor A, B, O;
  tensor_make(&A, c->tin, outer, n, inner, c->off_a, c->pad_outer, c->pad_n);
  if (c->bwd) tensor_make(&B, c->tin, outer, n, inner, c->off_b, c->pad_outer + 1, c->pad_n);
  tensor_make(&O, c->tout, outer, n, inner, c->off_out, c->pad_outer + 2, c->pad_n + 1);
  double *ref = (double *)malloc(sizeof(double) * (size_t)(n > 0 ? n : 1) * (size_t)(lines > 0 ? lines : 1));
  double *scale = (double *)malloc(sizeof(double) * (size_t)(n > 0 ? n : 1) * (size_t)(lines > 0 ? lines : 1));

  /* inputs */
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t line = 0; line < lines; line++) {
    const int64_t o = line / inner, j = line % inner;
    const int kind = c->special ? line_kind(seed, line) : 0;
    if (!c->bwd) {
      for (int64_t i = 0; i < n; i++) {
        const uint64_t g = (uint64_t)(line * n + i);
        double v = rand_val(seed, g);
        if (kind == 3) v = -INFINITY;
        if (kind == 4 && i == (int64_t)(mix64(g) % (uint64_t)n)) v = NAN;
        if (kind == 4 && i == n / 2) v = NAN;
        if (kind == 5 && i == n / 3) v = INFINITY;
        if (kind == 6 && unif(seed + 3, g) < 0.3) v = -INFINITY;
        if (kind == 7 && i != n / 2) v = -INFINITY;
        if (kind == 8) v = i == dominant_index(seed, line, n) ? 0.0 : -20 + 0.1 * v;
        set_elem(A.h, A.dt, tidx(&A, o, i, j), v);
      }
    } else {
      /* y = softmax / log_softmax of a random row (rounded to the dtype), dy random */
      double m = -INFINITY, s = 0;
      for (int64_t i = 0; i < n; i++) m = fmax(m, rand_val(seed, (uint64_t)(line * n + i)));
      for (int64_t i = 0; i < n; i++) s += exp(rand_val(seed, (uint64_t)(line * n + i)) - m);
      for (int64_t i = 0; i < n; i++) {
        const double x = rand_val(seed, (uint64_t)(line * n + i));
        set_elem(A.h, A.dt, tidx(&A, o, i, j), c->log ? x - m - log(s) : exp(x - m) / s);
        set_elem(B.h, B.dt, tidx(&B, o, i, j), rand_val(seed + 1, (uint64_t)(line * n + i)));
      }
    }
  }
  tensor_upload(&A);
  if (c->bwd) tensor_upload(&B);
  tensor_poison(&O);

  /* reference */
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t line = 0; line < lines; line++) {
    const int64_t o = line / inner, j = line % inner;
    double *r = ref + line * n, *sc = scale + line * n;
    if (!c->bwd) {
      int nan = 0;
      double m = -INFINITY, s = 0;
      for (int64_t i = 0; i < n; i++) {
        const double x = get_elem(A.h, A.dt, tidx(&A, o, i, j));
        if (x != x) nan = 1;
        if (x > m) m = x;
      }
      for (int64_t i = 0; i < n; i++) s += exp(get_elem(A.h, A.dt, tidx(&A, o, i, j)) - m);
      for (int64_t i = 0; i < n; i++) {
        const double x = get_elem(A.h, A.dt, tidx(&A, o, i, j));
        r[i] = nan ? NAN : c->log ? x - m - log(s) : exp(x - m) / s;
        /* float32 rounds x - m: relative error of exp grows with |x - m| */
        const double xm = isfinite(x - m) ? fabs(x - m) : 0;
        sc[i] = c->log ? xm + fabs(log(s)) + 1 : fabs(r[i]) * (1 + xm);
      }
    } else {
      /* the sum's rounding error scales with the sum of magnitudes */
      double s = 0, sa = 0;
      for (int64_t i = 0; i < n; i++) {
        const double y = get_elem(A.h, A.dt, tidx(&A, o, i, j)), g = get_elem(B.h, B.dt, tidx(&B, o, i, j));
        s += c->log ? g : y * g;
        sa += fabs(c->log ? g : y * g);
      }
      for (int64_t i = 0; i < n; i++) {
        const double y = get_elem(A.h, A.dt, tidx(&A, o, i, j)), g = get_elem(B.h, B.dt, tidx(&B, o, i, j));
        r[i] = c->log ? g - exp(y) * s : y * (g - s);
        sc[i] = c->log ? fabs(g) + exp(y) * sa : fabs(y) * (fabs(g) + sa);
      }
    }
  }

  /* run */
  oss_status st;
  size_t ws_size;
  void *ws = NULL;
  if (!c->bwd) {
    oss_softmax_params p;
    memset(&p, 0, sizeof p);
    p.outer = outer, p.n = n, p.inner = inner, p.log = c->log;
    p.x = tensor_view(&A);
    p.y = tensor_view(&O);
    ws_size = oss_softmax_forward_workspace_size_cuda(&p);
    if (ws_size) {
      CK(cudaMalloc(&ws, ws_size));
      CK(cudaMemsetAsync(ws, 0xff, ws_size, g_stream));
    }
    st = oss_softmax_forward_cuda(&p, ws, g_stream);
  } else {
    oss_softmax_backward_params p;
    memset(&p, 0, sizeof p);
    p.outer = outer, p.n = n, p.inner = inner, p.log = c->log;
    p.y = tensor_view(&A);
    p.dy = tensor_view(&B);
    p.dx = tensor_view(&O);
    ws_size = oss_softmax_backward_workspace_size_cuda(&p);
    if (ws_size) {
      CK(cudaMalloc(&ws, ws_size));
      CK(cudaMemsetAsync(ws, 0xff, ws_size, g_stream));
    }
    st = oss_softmax_backward_cuda(&p, ws, g_stream);
  }
  CK(cudaStreamSynchronize(g_stream));
  CK(cudaGetLastError());
  int bad = 0;
  if (st != OSS_OK) {
    printf("FAIL %s: status %s: %s\n", c->tag, oss_status_name(st), oss_error_message());
    bad = 1;
  }
  tensor_download(&O);

  /* compare */
  const double comp = (c->tin == OSS_FLOAT64) ? 1e-12 : 4e-6;
  const double orel = tol_out_rel(c->tout), oabs = tol_out_abs(c->tout);
  int64_t nbad = 0, first_line = -1, first_i = -1;
  char *inview = (char *)calloc((size_t)O.nbuf, 1);
  for (int64_t line = 0; line < lines && !bad; line++) {
    const int64_t o = line / inner, j = line % inner;
    for (int64_t i = 0; i < n; i++) inview[tidx(&O, o, i, j)] = 1;
  }
#pragma omp parallel for schedule(dynamic, 16) reduction(+ : nbad)
  for (int64_t line = 0; line < lines; line++) {
    if (bad) continue;
    const int64_t o = line / inner, j = line % inner;
    const int64_t dom = !c->bwd && c->log && c->special && line_kind(seed, line) == 8
                            ? dominant_index(seed, line, n) : -1;
    for (int64_t i = 0; i < n; i++) {
      const double r = ref[line * n + i], v = get_elem(O.h, O.dt, tidx(&O, o, i, j));
      int ok;
      if (r != r) ok = v != v;
      else if (isinf(r)) ok = v == r;
      else {
        const double tol = i == dom ? (orel + 1e-4) * fabs(r) + oabs
                                    : comp * scale[line * n + i] + orel * fabs(r) + oabs;
        ok = v == v && fabs(v - r) <= tol;
      }
      if (!ok) {
        nbad++;
#pragma omp critical
        if (first_line < 0 || line < first_line) first_line = line, first_i = i;
      }
    }
  }
  /* bytes outside the view must be untouched (0xff) */
  int64_t clobbered = 0;
  const size_t es = dt_size(O.dt);
  for (int64_t e = 0; e < O.nbuf && !bad; e++) {
    if (inview[e]) continue;
    const unsigned char *p = (const unsigned char *)O.h + e * es;
    for (size_t k = 0; k < es; k++)
      if (p[k] != 0xff) {
        clobbered++;
        break;
      }
  }
  if (nbad || clobbered) {
    bad = 1;
    printf("FAIL %s: %lld wrong elements, %lld bytes outside the view written", c->tag, (long long)nbad,
           (long long)clobbered);
    if (first_line >= 0) {
      const int64_t o = first_line / inner, j = first_line % inner;
      printf("; first at line %lld (o=%lld j=%lld) i=%lld: got %.9g want %.9g", (long long)first_line,
             (long long)o, (long long)j, (long long)first_i, get_elem(O.h, O.dt, tidx(&O, o, first_i, j)),
             ref[first_line * n + first_i]);
    }
    printf("\n");
  }
  free(inview);
  free(ref);
  free(scale);
  if (ws) CK(cudaFree(ws));
  tensor_free(&A);
  if (c->bwd) tensor_free(&B);
  tensor_free(&O);
  g_cases++;
  if (bad) g_failures++;
  return bad;
}

static void check(int bwd, int log, int64_t outer, int64_t n, int64_t inner, oss_dtype tin, oss_dtype tout,
                  int64_t off_a, int64_t off_b, int64_t off_out, int64_t pad_outer, int64_t pad_n, int special) {
  static uint64_t seed = 12345;
  char tag[256];
  snprintf(tag, sizeof tag, "%s%s [%lld,%lld,%lld] %s->%s off=(%lld,%lld,%lld) pad=(%lld,%lld)%s", bwd ? "bwd" : "fwd",
           log ? "-log" : "", (long long)outer, (long long)n, (long long)inner, dt_name(tin), dt_name(tout),
           (long long)off_a, (long long)off_b, (long long)off_out, (long long)pad_outer, (long long)pad_n,
           special ? " special" : "");
  tcase c = {bwd, log, outer, n, inner, tin, tout, off_a, off_b, off_out, pad_outer, pad_n, special, tag};
  seed = mix64(seed);
  run_case(&c, seed);
}

// ---- correctness suites ---------------------------------------------------------------

static const oss_dtype k3[3] = {OSS_FLOAT32, OSS_BFLOAT16, OSS_FLOAT16};

static int64_t rows_for(int64_t n, int64_t budget) {
  int64_t r = budget / (n > 0 ? n : 1);
  if (r < 1) r = 1;
  if (r > 67) r = 67;
  return r;
}

static void suite_errors(void) {
  /* unsupported dtype, empty shapes, mismatched y/dy */
  float *d;
  CK(cudaMalloc(&d, 1024));
  oss_softmax_params p;
  memset(&p, 0, sizeof p);
  p.outer = 2, p.n = 3, p.inner = 1;
  p.x.data = d, p.x.dtype = OSS_BOOL, p.x.stride_outer = 3, p.x.stride_n = 1;
  p.y = p.x;
  p.y.dtype = OSS_FLOAT32;
  oss_status s = oss_softmax_forward_cuda(&p, NULL, g_stream);
  g_cases++;
  if (s != OSS_ERROR_NOT_SUPPORTED) printf("FAIL errors: bool input gave %s\n", oss_status_name(s)), g_failures++;
  else printf("ok   bool input -> %s: %s\n", oss_status_name(s), oss_error_message());
  p.x.dtype = OSS_FLOAT64;
  s = oss_softmax_forward_cuda(&p, NULL, g_stream);
  g_cases++;
  if (s != OSS_ERROR_NOT_SUPPORTED) printf("FAIL errors: f64->f32 gave %s\n", oss_status_name(s)), g_failures++;
  else printf("ok   f64 -> f32 -> %s: %s\n", oss_status_name(s), oss_error_message());
  p.x.dtype = OSS_FLOAT32;
  for (int z = 0; z < 3; z++) {
    p.outer = z == 0 ? 0 : 2, p.n = z == 1 ? 0 : 3, p.inner = z == 2 ? 0 : 1;
    s = oss_softmax_forward_cuda(&p, NULL, g_stream);
    g_cases++;
    if (s != OSS_OK) printf("FAIL errors: empty shape %d gave %s\n", z, oss_status_name(s)), g_failures++;
  }
  p.outer = 2, p.n = 3, p.inner = 1, p.x.stride_n = 2;
  s = oss_softmax_forward_cuda(&p, NULL, g_stream);
  g_cases++;
  if (s != OSS_ERROR_INVALID_ARGUMENT) printf("FAIL errors: stride_n=2 rows gave %s\n", oss_status_name(s)), g_failures++;
  else printf("ok   rows with stride_n=2 -> %s: %s\n", oss_status_name(s), oss_error_message());
  oss_softmax_backward_params b;
  memset(&b, 0, sizeof b);
  b.outer = 2, b.n = 3, b.inner = 1;
  b.y.data = d, b.y.dtype = OSS_FLOAT32, b.y.stride_outer = 3, b.y.stride_n = 1;
  b.dy = b.y, b.dx = b.y;
  b.dy.dtype = OSS_FLOAT16;
  s = oss_softmax_backward_cuda(&b, NULL, g_stream);
  g_cases++;
  if (s == OSS_OK) printf("FAIL errors: y f32 / dy f16 accepted\n"), g_failures++;
  else printf("ok   y f32 with dy f16 -> %s: %s\n", oss_status_name(s), oss_error_message());
  /* the plan API: no plan, a plan no plan function filled, and a plan that
   * needs a workspace (one float32 row of 2^26: the split tier) launched
   * without one or with a misaligned one; each must be refused before any
   * launch (d is 1 KB) */
  oss_softmax_plan_cuda plan;
  g_cases++;
  if ((s = oss_softmax_forward_plan_cuda(&p, NULL)) != OSS_ERROR_INVALID_ARGUMENT)
    printf("FAIL errors: NULL plan gave %s\n", oss_status_name(s)), g_failures++;
  memset(&plan, 0, sizeof plan);
  g_cases++;
  if ((s = oss_softmax_launch_cuda(&plan, NULL, g_stream)) != OSS_ERROR_INVALID_ARGUMENT)
    printf("FAIL errors: unfilled plan gave %s\n", oss_status_name(s)), g_failures++;
  else printf("ok   unfilled plan -> %s: %s\n", oss_status_name(s), oss_error_message());
  p.outer = 1, p.n = (int64_t)1 << 26, p.inner = 1, p.x.stride_n = 1, p.x.stride_outer = p.n;
  p.y = p.x;
  g_cases++;
  if ((s = oss_softmax_forward_plan_cuda(&p, &plan)) != OSS_OK || plan.workspace_bytes == 0) {
    printf("FAIL errors: a 2^26 float32 row planned %s with a workspace of %zu bytes\n", oss_status_name(s),
           plan.workspace_bytes);
    g_failures++;
  } else {
    g_cases++;
    if ((s = oss_softmax_launch_cuda(&plan, NULL, g_stream)) != OSS_ERROR_INVALID_ARGUMENT)
      printf("FAIL errors: NULL workspace gave %s\n", oss_status_name(s)), g_failures++;
    else printf("ok   NULL workspace for %zu bytes -> %s: %s\n", plan.workspace_bytes, oss_status_name(s),
                oss_error_message());
    g_cases++;
    if ((s = oss_softmax_launch_cuda(&plan, (char *)d + 4, g_stream)) != OSS_ERROR_INVALID_ARGUMENT)
      printf("FAIL errors: misaligned workspace gave %s\n", oss_status_name(s)), g_failures++;
    else printf("ok   misaligned workspace -> %s: %s\n", oss_status_name(s), oss_error_message());
  }
  CK(cudaStreamSynchronize(g_stream));
  CK(cudaGetLastError());
  CK(cudaFree(d));
}

/* the L2 release window (release_window_mib = 1 MiB of input, release_first:
 * at the first rows): only some rows (outer indices) release their lines, so the boundary
 * falls inside the launch; warp tier, one-CTA chunks (aligned, and
 * misaligned with a dtype cast), columns clusters. In the quick suite too,
 * so memcheck sees the releases on both sides of the boundary. */
static void suite_release_window(void) {
  for (int front = 0; front < 2; front++) {
    oss_softmax_cuda_test_knobs.release_window_mib = 1;
    oss_softmax_cuda_test_knobs.release_first = front;
    check(front, 0, 1500, 1000, 1, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 0, 0, 0, 0);
    check(!front, 1, 300, 4096, 1, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 0, 0, 0, 0);
    check(1, front, 200, 4099, 1, OSS_FLOAT16, OSS_FLOAT32, 1, 2, 1, 3, 0, 0);
    check(front, 0, 40, 256, 512, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 0, 0, 0, 0);
  }
  oss_softmax_cuda_test_knobs.release_window_mib = oss_softmax_cuda_test_knobs.release_first = 0;
}

static void suite_rows(int quick) {
  static const int64_t widths[] = {1,    2,    3,    5,    7,    8,    9,    15,    16,    17,    31,     33,  63,
                                   64,   65,   127,  128,  129,  255,  256,  257,   511,   513,   1000,   1023, 1024,
                                   1025, 2047, 2049, 4095, 4097, 8191, 8193, 16389, 32771, 65543, 131072, 262144};
  const int nw = (int)(sizeof widths / sizeof widths[0]);
  const int64_t budget = quick ? 1 << 14 : 1 << 18;
  for (int wi = 0; wi < nw; wi++) {
    const int64_t n = widths[wi];
    if (quick && (wi % 3) != 0 && n < 100000) continue;
    const int64_t rows = rows_for(n, budget);
    for (int d = 0; d < 3; d++)
      for (int bwd = 0; bwd < 2; bwd++) {
        const int log = (wi + d + bwd) & 1;
        /* aligned; misaligned input and padded rows; misaligned output only */
        check(bwd, log, rows, n, 1, k3[d], k3[d], 0, 0, 0, 0, 0, 0);
        if (!quick || wi % 2 == 0) check(bwd, !log, rows, n, 1, k3[d], k3[d], 1, 3, 0, 3, 0, 0);
        if (!quick) check(bwd, log, rows + 2, n, 1, k3[d], k3[d], 0, 0, 1, 5, 0, 0);
      }
  }
  /* every dtype combination, including float64 */
  static const int64_t combo_widths[] = {7, 129, 1000, 4097, 32771};
  for (int wi = 0; wi < 5; wi++)
    for (int a = 0; a < 3; a++)
      for (int o = 0; o < 3; o++)
        for (int bwd = 0; bwd < 2; bwd++) {
          if (quick && (a + o + wi) % 3) continue;
          const int64_t n = combo_widths[wi];
          check(bwd, (a + o + bwd) & 1, rows_for(n, budget / 4), n, 1, k3[a], k3[o], (a + wi) % 3, o, (o + 1) % 2, wi, 0, 0);
        }
  /* aligned forward rows of at most 16 slots (the warp tier's rows per
   * lane): every dtype combination, 1 to 16 slots, rows ending inside a
   * warp's group, contiguous and strided rows; then (warp_lanes_per_row) every such
   * row with rows per lane, at most 8 lanes per row (K = 2 with lanes of
   * one slot at 12 and 15 slots) and 16 (idle lanes) */
  static const int64_t narrow_widths[] = {8, 24, 64, 96, 120, 128};
  static const int lanes_knob[] = {0, 8, 16};
  for (int li = 0; li < 3; li++) {
    oss_softmax_cuda_test_knobs.warp_lanes_per_row = lanes_knob[li];
    for (int wi = 0; wi < 6; wi++)
      for (int a = 0; a < 3; a++)
        for (int o = 0; o < 3; o++) {
          if ((quick || li > 0) && (a + o + wi + li) % 3) continue;
          const int64_t n = narrow_widths[wi] / (k3[a] == OSS_FLOAT32 ? 2 : 1);
          check(0, (a + o + wi) & 1, 1000 + 37 * wi, n, 1, k3[a], k3[o], 0, 0, 0, 8 * (wi & 1), 0, 0);
        }
  }
  oss_softmax_cuda_test_knobs.warp_lanes_per_row = 0;
  static const int64_t f64_widths[] = {1, 7, 128, 255, 1000, 5000, 70001};
  for (int wi = 0; wi < 7; wi++)
    for (int bwd = 0; bwd < 2; bwd++)
      for (int log = 0; log < 2; log++)
        if (!quick || wi % 3 == 0) check(bwd, log, rows_for(f64_widths[wi], budget / 4), f64_widths[wi], 1, OSS_FLOAT64, OSS_FLOAT64, wi & 1, 0, 0, wi, 0, 0);
  /* backward rows of 3/4 to all of 1024 x 4 register slots: aligned ones
   * take one 1024-thread CTA of registers, misaligned ones (and all of them
   * with no_backward_1024) the two-CTA plan with a shared-memory part */
  for (int alt = 0; alt < 2; alt++) {
    oss_softmax_cuda_test_knobs.no_backward_1024 = alt;
    for (int log = 0; log < 2; log++) {
      check(1, log, 9, 28001 + 7 * log, 1, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 0, 0, 0, 0);
      check(1, log, 7, 30001, 1, OSS_FLOAT16, OSS_FLOAT32, 1, 2, 1, 3, 0, 0);
      check(1, log, 5, 12288 + log, 1, OSS_FLOAT32, OSS_BFLOAT16, log, 0, 0, log, 0, 0);
      check(1, log, 6, 16384, 1, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 0);
    }
  }
  oss_softmax_cuda_test_knobs.no_backward_1024 = 0;
  /* the light one-row-per-CTA tier wherever it holds the row (row_in_cta
   * = 2: two slots per thread, 3: one slot, 256: CTAs of 256 threads), every
   * dtype, the grid also capped at 5 CTAs (rows_at_once) so each CTA loops over
   * rows: the backward's block sum alternates its shared buffer per row */
  static const int64_t light_widths[] = {64, 256, 1000, 2048, 4096, 8192};
  static const int light_knob[] = {2, 3, 256};
  for (int li = 0; li < 3; li++)
    for (int cap = 0; cap < 2; cap++) {
      oss_softmax_cuda_test_knobs.row_in_cta = light_knob[li];
      oss_softmax_cuda_test_knobs.rows_at_once = cap ? 5 : 0;
      for (int wi = 0; wi < 6; wi++)
        for (int a = 0; a < 3; a++)
          for (int bwd = 0; bwd < 2; bwd++) {
            if (quick && (wi + a + li + cap) % 3) continue;
            const int o = (a + wi * bwd) % 3; /* the backward also with another output type */
            check(bwd, (wi + a + cap) & 1, 17 + 4 * wi, light_widths[wi], 1, k3[a], k3[o], 0, 0, 0, 0, 0, 0);
          }
    }
  oss_softmax_cuda_test_knobs.row_in_cta = oss_softmax_cuda_test_knobs.rows_at_once = 0;
  suite_release_window();
  /* more rows than a grid's y dimension holds (65,535): one CTA per row of the
   * chunk tier, every row in grid.x (aligned, then misaligned rows) */
  if (!quick)
    for (int bwd = 0; bwd < 2; bwd++) {
      check(bwd, bwd, 70001, bwd ? 520 : 1028, 1, OSS_FLOAT32, bwd ? OSS_FLOAT32 : OSS_BFLOAT16, 0, 0, 0, 0, 0, 0);
      check(bwd, !bwd, 66001, bwd ? 1030 : 2050, 1, OSS_BFLOAT16, OSS_BFLOAT16, 1, 0, 1, 3, 0, 0);
    }
}

static void suite_wide(int quick) {
  /* cluster and split tiers: few rows */
  static const int64_t widths[] = {524291, 1048576, 2097152 + 5, 4194304, 16777216};
  for (int wi = 0; wi < 5; wi++) {
    if (quick && wi != 0 && wi != 3) continue;
    const int64_t n = widths[wi];
    const int64_t rows = n >= 4194304 ? (quick ? 1 : 2) : 3;
    for (int d = 0; d < 3; d++)
      for (int bwd = 0; bwd < 2; bwd++) {
        if (quick && d == 2) continue;
        check(bwd, (wi + d) & 1, rows, n, 1, k3[d], k3[d], (wi + d) % 4, 1, 0, wi & 1 ? 7 : 0, 0, 0);
        if (!quick && d == 0 && wi == 1) check(bwd, 1, rows, n, 1, OSS_BFLOAT16, OSS_FLOAT32, 3, 0, 0, 0, 0, 0);
      }
  }
  /* the spread tier where it can hold the row (else the planner's tier) */
  oss_softmax_cuda_test_knobs.force_tier = SM_FORCE_SPREAD;
  for (int wi = 0; wi < 4; wi++)
    for (int d = 0; d < 3; d++)
      for (int bwd = 0; bwd < 2; bwd++) {
        if (quick && (wi + d + bwd) % 3) continue;
        const int64_t n = widths[wi];
        check(bwd, (wi + d + bwd) & 1, wi == 3 ? 2 : 5, n, 1, k3[d], k3[(d + bwd) % 3], (wi + d) % 4, 0, 1, wi & 1 ? 3 : 0, 0, 0);
      }
  check(0, 0, 300, 131072 + 1, 1, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 0, 0, 0, 0); /* rows >> resident */
  oss_softmax_cuda_test_knobs.force_tier = 0;
}

static void suite_columns(int quick) {
  typedef struct {
    int64_t outer, n, inner;
  } shp;
  static const shp shapes[] = {{3, 5, 7},     {2, 1000, 33}, {4, 3, 1000}, {2, 3000, 16}, {1, 1, 5},   {2, 2, 2},
                               {3, 129, 130}, {2, 70000, 3}, {5, 17, 64},  {2, 1024, 4096}, {1, 20000, 40}};
  const int ns = (int)(sizeof shapes / sizeof shapes[0]);
  for (int s = 0; s < ns; s++)
    for (int d = 0; d < 3; d++)
      for (int bwd = 0; bwd < 2; bwd++) {
        if (quick && (s + d) % 3) continue;
        const shp h = shapes[s];
        check(bwd, (s + d + bwd) & 1, h.outer, h.n, h.inner, k3[d], k3[d], 0, 0, 0, 0, 0, 0);
        if (!quick) check(bwd, (s + bwd) & 1, h.outer, h.n, h.inner, k3[d], k3[(d + 1) % 3], s % 4, 2, 1, 3, s % 3, 0);
      }
  for (int bwd = 0; bwd < 2; bwd++) {
    check(bwd, 0, 3, 33, 45, OSS_FLOAT64, OSS_FLOAT64, 1, 0, 0, 0, 1, 0);
    check(bwd, 1, 2, 5000, 20, OSS_FLOAT64, OSS_FLOAT64, 0, 0, 1, 1, 0, 0);
  }
}

/* columns shared by a cluster (sm_90; elsewhere the planner's tier runs):
 * each cluster size forced, ranks that hold no rows (n < C), misaligned
 * pointers, padded strides, several outer indices per cluster (grid.y
 * capped, so the exchange buffer alternates) */
static void suite_column_clusters(int quick) {
  typedef struct {
    int64_t outer, n, inner;
  } shp;
  static const shp shapes[] = {{2, 1000, 33}, {3, 5, 7}, {2, 3000, 16}, {3, 129, 130}, {1, 20000, 40}, {2, 17, 64}, {2, 1024, 4096}};
  static const int sizes[] = {2, 4, 16};
  const int ns = (int)(sizeof shapes / sizeof shapes[0]);
  for (int s = 0; s < ns; s++)
    for (int ci = 0; ci < 3; ci++)
      for (int d = 0; d < 3; d++)
        for (int bwd = 0; bwd < 2; bwd++) {
          if (quick ? (s + ci + d + bwd) % 4 != 0 : (s == ns - 1 && (ci + d) % 3 != 0)) continue;
          const shp h = shapes[s];
          oss_softmax_cuda_test_knobs.column_cluster = sizes[ci];
          check(bwd, (s + d + bwd) & 1, h.outer, h.n, h.inner, k3[d], k3[(d + bwd + ci) % 3], (s + ci) % 4, bwd, ci & 1, s & 1,
                (s + ci) % 3, 0);
        }
  oss_softmax_cuda_test_knobs.rows_at_once = 2;
  for (int bwd = 0; bwd < 2; bwd++) {
    oss_softmax_cuda_test_knobs.column_cluster = 4;
    check(bwd, 0, 7, 333, 50, OSS_BFLOAT16, OSS_BFLOAT16, 1, 0, 1, 1, 0, 0);
    check(bwd, 1, 5, 1000, 33, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 1, 0);
    check(bwd, 0, 5, 100, 37, OSS_FLOAT64, OSS_FLOAT64, 0, 1, 0, 1, 0, 0);
  }
  oss_softmax_cuda_test_knobs.rows_at_once = 0;
  oss_softmax_cuda_test_knobs.column_cluster = 0;
  if (!quick)
    for (int log = 0; log < 2; log++) check(0, log, 2, 3000, 40, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 1); /* specials */
}

static void suite_special(int quick) {
  static const int64_t widths[] = {1, 7, 128, 1000, 5000, 300000, 4194304};
  for (int wi = 0; wi < 7; wi++)
    for (int d = 0; d < 2; d++)
      for (int log = 0; log < 2; log++) {
        if (quick && wi == 6) continue;
        const int64_t n = widths[wi];
        const int64_t rows = n > 100000 ? 8 : 64;
        check(0, log, rows, n, 1, k3[d], k3[d], wi & 1, 0, 0, 0, 0, 1);
      }
  for (int log = 0; log < 2; log++) {
    check(0, log, 4, 100, 37, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 1);
    check(0, log, 2, 30000, 5, OSS_BFLOAT16, OSS_FLOAT32, 1, 0, 0, 0, 0, 1);
    check(0, log, 32, 200, 1, OSS_FLOAT64, OSS_FLOAT64, 0, 0, 0, 0, 0, 1);
  }
}

/* forced tiers (test knobs): the same shapes through every tier that can hold them */
static void suite_forced(int quick) {
  for (int tier = SM_FORCE_WARP; tier <= SM_FORCE_SPREAD; tier++) {
    oss_softmax_cuda_test_knobs.force_tier = tier;
    static const int64_t widths[] = {3, 100, 1000, 2049, 20000, 70001};
    for (int wi = 0; wi < 6; wi++)
      for (int bwd = 0; bwd < 2; bwd++) {
        if (quick && (wi + bwd + tier) % 2) continue;
        check(bwd, wi & 1, 5, widths[wi], 1, OSS_FLOAT32, OSS_BFLOAT16, wi % 3, 1, 0, 1, 0, 0);
        if (!quick) check(bwd, 1, 3, widths[wi], 1, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 3, 0, 0, wi % 2 == 0 && !bwd);
      }
    for (int wi = 1; wi < 6; wi += 2) check(0, 1, 9, widths[wi], 1, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 1);
  }
  oss_softmax_cuda_test_knobs.force_tier = 0;
  oss_softmax_cuda_test_knobs.column_chunk_rows = 7; /* column split with 7-row chunks */
  for (int bwd = 0; bwd < 2; bwd++) {
    check(bwd, 0, 3, 100, 37, OSS_FLOAT32, OSS_FLOAT32, 1, 0, 0, 0, 0, 0);
    check(bwd, 1, 2, 50, 300, OSS_BFLOAT16, OSS_FLOAT16, 0, 0, 0, 1, 2, 0);
  }
  check(0, 0, 2, 50, 300, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 1);
  check(0, 1, 2, 50, 300, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 1);
  oss_softmax_cuda_test_knobs.column_chunk_rows = 0;
}

// ---- timing -----------------------------------------------------------------------------

__device__ static inline float dev_rand(uint64_t seed, uint64_t i) {
  const uint64_t a = mix64(seed ^ mix64(2 * i)), b = mix64(seed ^ mix64(2 * i + 1));
  const float u1 = ((a >> 40) + 0.5f) * (1.0f / 16777216.0f), u2 = ((b >> 40) + 0.5f) * (1.0f / 16777216.0f);
  float v = 3.0f * sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
  return v == 0.0f ? 0.125f : v;
}

__device__ static inline void dev_store(float *p, float v) { *p = v; }
__device__ static inline void dev_store(__half *p, float v) { *p = __float2half_rn(v); }
__device__ static inline void dev_store(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

template <typename T> __global__ void init_kernel(T *p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dev_store(p + i, dev_rand(seed, (uint64_t)i));
}

static void init_device(void *p, oss_dtype t, int64_t n, uint64_t seed) {
  if (t == OSS_FLOAT32) init_kernel<<<1024, 256, 0, g_stream>>>((float *)p, n, seed);
  else if (t == OSS_FLOAT16) init_kernel<<<1024, 256, 0, g_stream>>>((__half *)p, n, seed);
  else init_kernel<<<1024, 256, 0, g_stream>>>((__nv_bfloat16 *)p, n, seed);
  CK(cudaGetLastError());
}

static int cmp_float(const void *a, const void *b) {
  const float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

typedef oss_status (*launch_fn)(void *ctx);
static float time_median_ms(launch_fn fn, void *ctx, int reps) {
  cudaEvent_t ev[64];
  float ms[32];
  if (reps > 32) reps = 32;
  for (int i = 0; i < 3; i++)
    if (fn(ctx) != OSS_OK) {
      printf("launch failed: %s\n", oss_error_message());
      return -1;
    }
  for (int i = 0; i < 2 * reps; i++) CK(cudaEventCreate(&ev[i]));
  for (int i = 0; i < reps; i++) {
    CK(cudaEventRecord(ev[2 * i], g_stream));
    fn(ctx);
    CK(cudaEventRecord(ev[2 * i + 1], g_stream));
  }
  CK(cudaStreamSynchronize(g_stream));
  CK(cudaGetLastError());
  for (int i = 0; i < reps; i++) CK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (int i = 0; i < 2 * reps; i++) CK(cudaEventDestroy(ev[i]));
  qsort(ms, (size_t)reps, sizeof(float), cmp_float);
  return ms[reps / 2];
}

typedef struct {
  void *dst, *src;
  size_t bytes;
} copy_ctx;
static oss_status do_copy(void *ctx) {
  copy_ctx *c = (copy_ctx *)ctx;
  CK(cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, g_stream));
  return OSS_OK;
}
typedef struct {
  oss_softmax_params f;
  oss_softmax_backward_params b;
  void *ws;
} sm_ctx;
static oss_status do_fwd(void *ctx) {
  sm_ctx *c = (sm_ctx *)ctx;
  return oss_softmax_forward_cuda(&c->f, c->ws, g_stream);
}
static oss_status do_bwd(void *ctx) {
  sm_ctx *c = (sm_ctx *)ctx;
  return oss_softmax_backward_cuda(&c->b, c->ws, g_stream);
}

/* Checks a few rows (first, middle, last) of a timed run against float64. */
static int verify_rows(const sm_ctx *c, int bwd, int64_t rows, int64_t n, int64_t inner) {
  const int64_t samples[4] = {0, rows / 2, rows - 1, rows / 3};
  int bad = 0;
  for (int s = 0; s < 4 && !bad; s++) {
    const int64_t o = samples[s];
    const oss_strided3 va = bwd ? c->b.y : c->f.x, vb = c->b.dy, vo = bwd ? c->b.dx : c->f.y;
    const size_t ea = dt_size(va.dtype), eo = dt_size(vo.dtype);
    const int64_t cnt = n * inner;
    void *ha = malloc((size_t)cnt * 8), *hb = malloc((size_t)cnt * 8), *ho = malloc((size_t)cnt * 8);
    CK(cudaMemcpyAsync(ha, (char *)va.data + o * va.stride_outer * ea, (size_t)cnt * ea, cudaMemcpyDeviceToHost,
                       g_stream));
    if (bwd)
      CK(cudaMemcpyAsync(hb, (char *)vb.data + o * vb.stride_outer * ea, (size_t)cnt * ea, cudaMemcpyDeviceToHost,
                         g_stream));
    CK(cudaMemcpyAsync(ho, (char *)vo.data + o * vo.stride_outer * eo, (size_t)cnt * eo, cudaMemcpyDeviceToHost,
                       g_stream));
    CK(cudaStreamSynchronize(g_stream));
    for (int64_t j = 0; j < inner && !bad; j++) {
      double m = -INFINITY, sum = 0, sabs = 0;
      for (int64_t i = 0; i < n; i++) {
        const double x = get_elem(ha, va.dtype, i * inner + j);
        if (!bwd) m = fmax(m, x);
        else sum += get_elem(hb, va.dtype, i * inner + j) * x, sabs += fabs(get_elem(hb, va.dtype, i * inner + j) * x);
      }
      if (!bwd)
        for (int64_t i = 0; i < n; i++) sum += exp(get_elem(ha, va.dtype, i * inner + j) - m);
      for (int64_t i = 0; i < n; i++) {
        const double x = get_elem(ha, va.dtype, i * inner + j);
        double r, sc;
        if (!bwd) r = exp(x - m) / sum, sc = r * (1 + fabs(x - m));
        else {
          const double g = get_elem(hb, va.dtype, i * inner + j);
          r = x * (g - sum), sc = fabs(x) * (fabs(g) + sabs);
        }
        const double v = get_elem(ho, vo.dtype, i * inner + j);
        const double tol = 4e-6 * sc + tol_out_rel(vo.dtype) * fabs(r) + tol_out_abs(vo.dtype);
        if (!(fabs(v - r) <= tol)) {
          printf("FAIL timed run: row %lld col %lld i %lld got %.9g want %.9g\n", (long long)o, (long long)j,
                 (long long)i, v, r);
          bad = 1;
          break;
        }
      }
    }
    free(ha), free(hb), free(ho);
  }
  g_cases++;
  g_failures += bad;
  return bad;
}

static double g_copy_gbs = 0;

static void measure_copy(void) {
  copy_ctx cc;
  cc.bytes = (size_t)1 << 30;
  CK(cudaMalloc(&cc.src, cc.bytes));
  CK(cudaMalloc(&cc.dst, cc.bytes));
  CK(cudaMemsetAsync(cc.src, 1, cc.bytes, g_stream));
  const float ms = time_median_ms(do_copy, &cc, 15);
  g_copy_gbs = 2.0 * (double)cc.bytes / (ms * 1e-3) / 1e9;
  printf("copy 1 GiB device-to-device: %.3f ms = %.0f GB/s (read + write)\n", ms, g_copy_gbs);
  CK(cudaFree(cc.src));
  CK(cudaFree(cc.dst));
}

/* Contiguous x, y, dy, dx of [outer, n, inner] in dtype t (x and dy random),
 * the forward and backward jobs over them and their workspace; free with
 * bench_ctx_free. */
static void bench_ctx_alloc(sm_ctx *c, oss_dtype t, int64_t outer, int64_t n, int64_t inner) {
  const int64_t cnt = outer * n * inner;
  const size_t es = dt_size(t);
  void *x, *y, *dy, *dx;
  CK(cudaMalloc(&x, cnt * es));
  CK(cudaMalloc(&y, cnt * es));
  CK(cudaMalloc(&dy, cnt * es));
  CK(cudaMalloc(&dx, cnt * es));
  init_device(x, t, cnt, 1000 + n);
  init_device(dy, t, cnt, 2000 + n);
  memset(c, 0, sizeof *c);
  oss_strided3 v = {x, t, n * inner, inner};
  c->f.outer = outer, c->f.n = n, c->f.inner = inner, c->f.log = 0;
  c->f.x = v;
  c->f.y = v, c->f.y.data = y;
  c->b.outer = outer, c->b.n = n, c->b.inner = inner, c->b.log = 0;
  c->b.y = c->f.y;
  c->b.dy = v, c->b.dy.data = dy;
  c->b.dx = v, c->b.dx.data = dx;
  size_t ws = oss_softmax_forward_workspace_size_cuda(&c->f);
  const size_t wsb = oss_softmax_backward_workspace_size_cuda(&c->b);
  if (wsb > ws) ws = wsb;
  if (ws) CK(cudaMalloc(&c->ws, ws));
}

static void bench_ctx_free(sm_ctx *c) {
  if (c->ws) CK(cudaFree(c->ws));
  CK(cudaFree(c->f.x.data));
  CK(cudaFree(c->f.y.data));
  CK(cudaFree(c->b.dy.data));
  CK(cudaFree(c->b.dx.data));
}

/* One forward + backward timing of [outer, n, inner] in dtype t; returns % of copy. */
static void bench_one(oss_dtype t, int64_t outer, int64_t n, int64_t inner, double *fwd_pct, double *bwd_pct,
                      double *fwd_us, double *bwd_us, int verify) {
  const int64_t cnt = outer * n * inner;
  const size_t es = dt_size(t);
  sm_ctx c;
  bench_ctx_alloc(&c, t, outer, n, inner);
  const float fms = time_median_ms(do_fwd, &c, 15);
  if (verify) verify_rows(&c, 0, outer, n, inner);
  const float bms = time_median_ms(do_bwd, &c, 15);
  if (verify) verify_rows(&c, 1, outer, n, inner);
  const double bytes = (double)cnt * es;
  *fwd_us = fms * 1e3, *bwd_us = bms * 1e3;
  *fwd_pct = 100.0 * (2 * bytes / (fms * 1e-3) / 1e9) / g_copy_gbs;
  *bwd_pct = 100.0 * (3 * bytes / (bms * 1e-3) / 1e9) / g_copy_gbs;
  bench_ctx_free(&c);
}

static const int64_t bench_widths[] = {128, 512, 1024, 4096, 32768, 128256, 262144, 1048576, 16777216};

static void bench_dim1(void);

static void bench(void) {
  measure_copy();
  printf("\n%-5s %9s %6s | %9s %6s | %9s %6s   (%% of copy = bytes read+written / time / copy GB/s)\n", "dtype",
         "cols", "rows", "fwd us", "fwd %", "bwd us", "bwd %");
  for (int d = 0; d < 3; d++)
    for (int w = 0; w < 9; w++) {
      const int64_t n = bench_widths[w], rows = ((int64_t)1 << 26) / n;
      double fp, bp, fu, bu;
      bench_one(k3[d], rows, n, 1, &fp, &bp, &fu, &bu, 1);
      printf("%-5s %9lld %6lld | %9.1f %6.1f | %9.1f %6.1f\n", dt_name(k3[d]), (long long)n, (long long)rows, fu, fp,
             bu, bp);
      fflush(stdout);
    }
  bench_dim1();
}

/* softmax over dim 1 of a (32, 1024, 64, 64) tensor (the columns kernel)
 * against the last-dim case of the same bytes */
static void bench_dim1(void) {
  double fp, bp, fu, bu, fp2, bp2, fu2, bu2;
  bench_one(OSS_FLOAT32, 32, 1024, 64 * 64, &fp, &bp, &fu, &bu, 1);
  bench_one(OSS_FLOAT32, 32 * 64 * 64, 1024, 1, &fp2, &bp2, &fu2, &bu2, 0);
  printf("\ndim=1 of (32,1024,64,64) f32: fwd %.1f us %.1f%% (%.2fx of last-dim %.1f%%), bwd %.1f us %.1f%% (%.2fx of %.1f%%)\n",
         fu, fp, fp / fp2, fp2, bu, bp, bp / bp2, bp2);
  bench_one(OSS_BFLOAT16, 32, 1024, 64 * 64, &fp, &bp, &fu, &bu, 1);
  bench_one(OSS_BFLOAT16, 32 * 64 * 64, 1024, 1, &fp2, &bp2, &fu2, &bu2, 0);
  printf("dim=1 of (32,1024,64,64) bf16: fwd %.1f%% (%.2fx of last-dim %.1f%%), bwd %.1f%% (%.2fx of %.1f%%)\n", fp,
         fp / fp2, fp2, bp, bp / bp2, bp2);
}

/* CTAs (and clusters) that run several rows each (grid.y capped): the next
 * row's shared-memory part is copied while the current row is written */
static void suite_rows_per_cta(void) {
  oss_softmax_cuda_test_knobs.rows_at_once = 3;
  for (int bwd = 0; bwd < 2; bwd++)
    for (int log = 0; log < 2; log++) {
      /* the warp tier in 3 CTAs: each warp loops over groups of rows (light
       * kernels aligned, the full ones, misaligned) */
      check(bwd, log, 2001, 128, 1, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 0, 0, 0, 0);
      check(bwd, log, 999, 64, 1, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 0);
      check(bwd, log, 301, 1000, 1, OSS_FLOAT16, OSS_FLOAT16, 0, 0, 0, 0, 0, 0);
      check(bwd, log, 777, 33, 1, OSS_FLOAT32, OSS_FLOAT16, 1, 0, 1, 1, 0, 0);
      check(bwd, log, 11, 40003, 1, OSS_FLOAT32, OSS_FLOAT32, 1, 0, 1, 1, 0, 0);   /* one CTA + shared memory */
      check(bwd, log, 10, 300001, 1, OSS_BFLOAT16, OSS_BFLOAT16, 0, 1, 0, 0, 0, 0); /* clusters */
      check(bwd, log, 7, 70001, 1, OSS_FLOAT16, OSS_FLOAT32, 3, 0, 1, 1, 0, 0);
    }
  oss_softmax_cuda_test_knobs.force_tier = SM_FORCE_SPLIT; /* split: SM_STATS / SM_APPLY over several rows per CTA */
  oss_softmax_cuda_test_knobs.rows_at_once = 2;
  for (int bwd = 0; bwd < 2; bwd++) check(bwd, 0, 5, 100003, 1, OSS_BFLOAT16, OSS_BFLOAT16, 1, 0, 0, 1, 0, 0);
  oss_softmax_cuda_test_knobs.force_tier = 0;
  /* clusters of 16 with more rows than fit at once (16-bit forward) */
  for (int log = 0; log < 2; log++) {
    check(0, log, 30, 1000003, 1, OSS_BFLOAT16, OSS_BFLOAT16, log, 0, 1, 0, 0, 0);
    check(0, log, 17, 800001, 1, OSS_FLOAT16, OSS_FLOAT32, 0, 1, 0, 1, 0, 0);
  }
}

/* a reduced set for compute-sanitizer memcheck: every tier, alignments, dtypes */
static void suite_quick(void) {
  static const int64_t widths[] = {1, 7, 33, 129, 1000, 1025, 4097, 32771, 131072, 524291};
  for (int wi = 0; wi < 10; wi++)
    for (int d = 0; d < 3; d++)
      for (int bwd = 0; bwd < 2; bwd++) {
        const int64_t n = widths[wi], rows = n > 100000 ? 2 : 5;
        check(bwd, (wi + d) & 1, rows, n, 1, k3[d], k3[(d + wi) % 3], (wi + d) % 4, bwd, wi & 1, wi % 3, 0, 0);
      }
  check(0, 0, 2, 1048576, 1, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 0);       /* cluster of 16 x 1024 threads */
  check(0, 1, 1, 1048576 + 1, 1, OSS_FLOAT32, OSS_BFLOAT16, 3, 0, 1, 0, 0, 0);
  for (int bwd = 0; bwd < 2; bwd++) {
    check(bwd, 1, 1, 4194304 + 3, 1, OSS_FLOAT32, OSS_FLOAT32, 1, 0, 0, 0, 0, 0); /* split */
    check(bwd, 0, 3, 1000, 1, OSS_FLOAT64, OSS_FLOAT64, 1, 0, 0, 1, 0, 0);
    check(bwd, 0, 3, 5, 7, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 0);
    check(bwd, 1, 2, 1000, 33, OSS_BFLOAT16, OSS_FLOAT32, 1, 2, 1, 3, 1, 0);
    check(bwd, 0, 2, 20000, 40, OSS_FLOAT32, OSS_FLOAT16, 0, 0, 0, 0, 0, 0); /* column split */
    check(bwd, 1, 2, 40, 300, OSS_FLOAT64, OSS_FLOAT64, 0, 0, 0, 0, 0, 0);
  }
  check(0, 0, 16, 1000, 1, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 1);
  check(0, 1, 16, 100, 9, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 0, 0, 0, 1);
  for (int tier = SM_FORCE_WARP; tier <= SM_FORCE_SPREAD; tier++) {
    oss_softmax_cuda_test_knobs.force_tier = tier;
    for (int bwd = 0; bwd < 2; bwd++) check(bwd, 1, 3, 20000, 1, OSS_BFLOAT16, OSS_FLOAT32, 1, 0, 1, 1, 0, 0);
  }
  oss_softmax_cuda_test_knobs.force_tier = SM_FORCE_SPREAD; /* spread: many CTAs per row, more rows than resident at once */
  for (int bwd = 0; bwd < 2; bwd++) check(bwd, bwd, 3, 300007, 1, OSS_FLOAT64, OSS_FLOAT64, 1, 0, 0, 1, 0, 0);
  check(0, 0, 40, 1048576 + 3, 1, OSS_FLOAT32, OSS_FLOAT32, 1, 0, 0, 0, 0, 0);
  check(1, 1, 9, 1048576, 1, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 0, 0, 0, 0);
  oss_softmax_cuda_test_knobs.force_tier = 0;
  check(1, 1, 3, 28008, 1, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 0, 0, 0, 0); /* 1024-thread backward CTA, registers */
  check(1, 0, 3, 12288, 1, OSS_FLOAT32, OSS_FLOAT16, 0, 0, 0, 0, 0, 0);
  check(1, 0, 3, 12289, 1, OSS_FLOAT32, OSS_FLOAT16, 1, 1, 1, 1, 0, 0);   /* misaligned: the two-CTA plan */
  suite_release_window();
  suite_rows_per_cta();
  suite_column_clusters(1);
}

/* small cases through every tier that uses shared memory or clusters (for racecheck) */
static void suite_race(void) {
  for (int bwd = 0; bwd < 2; bwd++) {
    check(bwd, 0, 3, 100, 1, OSS_FLOAT32, OSS_FLOAT32, 1, 0, 0, 1, 0, 0);       /* warp */
    /* the light one-row-per-CTA tier (aligned rows: forward 128-512 slots, backward 64-1024) */
    check(bwd, 1, 3, bwd ? 8192 : 2048, 1, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 0, 0, 0, 0);
    check(bwd, 0, 3, bwd ? 4096 : 1024, 1, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 0);
    oss_softmax_cuda_test_knobs.rows_at_once = 2; /* several rows per CTA: the backward's alternating block-sum buffer */
    check(bwd, 0, 7, 4096, 1, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 0, 0, 0, 0);
    check(bwd, 1, 7, 8192, 1, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 0);
    oss_softmax_cuda_test_knobs.rows_at_once = 0;
    check(bwd, 1, 3, 3000, 1, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 0, 0, 0, 0);    /* one CTA, registers */
    check(bwd, 0, 3, 40000, 1, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 0);     /* one CTA + shared memory */
    if (bwd) check(1, 1, 3, 30000, 1, OSS_FLOAT16, OSS_FLOAT16, 0, 0, 0, 0, 0, 0); /* 1024 threads, registers */
    check(bwd, 1, 2, 300001, 1, OSS_FLOAT32, OSS_FLOAT32, 1, 0, 0, 0, 0, 0);    /* cluster */
    if (!bwd) check(0, 0, 1, 1048576, 1, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 0); /* 1024-thread CTAs */
    check(bwd, 1, 20, 1048581, 1, OSS_BFLOAT16, OSS_BFLOAT16, 1, 1, 1, 1, 0, 0); /* 16-bit clusters of 16, more than fit at once */
    check(bwd, 0, 3, 262147, 1, OSS_FLOAT16, OSS_FLOAT16, 1, 1, 1, 1, 0, 0);    /* 16-bit cluster of 4 */
    oss_softmax_cuda_test_knobs.rows_at_once = 2; /* several rows per CTA: next-row copies */
    check(bwd, 1, 5, 40003, 1, OSS_FLOAT32, OSS_FLOAT32, 1, 0, 0, 1, 0, 0);
    check(bwd, 0, 5, 300001, 1, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 0, 0, 0, 0);
    oss_softmax_cuda_test_knobs.rows_at_once = 0;
    check(bwd, 0, 3, 700, 33, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 0);      /* columns */
    oss_softmax_cuda_test_knobs.force_tier = SM_FORCE_SPLIT;
    check(bwd, 0, 2, 20000, 1, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 0);     /* split */
    oss_softmax_cuda_test_knobs.force_tier = SM_FORCE_SPREAD;
    check(bwd, 1, 3, 300001, 1, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 0);    /* spread */
    oss_softmax_cuda_test_knobs.force_tier = 0;
    oss_softmax_cuda_test_knobs.column_chunk_rows = 9;
    check(bwd, 1, 2, 100, 40, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 0);      /* column split */
    oss_softmax_cuda_test_knobs.column_chunk_rows = 0;
    oss_softmax_cuda_test_knobs.column_cluster = 4;
    oss_softmax_cuda_test_knobs.rows_at_once = 2;
    check(bwd, 0, 5, 700, 33, OSS_BFLOAT16, OSS_BFLOAT16, 1, 0, 0, 0, 0, 0);     /* column clusters, two tiles each */
    oss_softmax_cuda_test_knobs.rows_at_once = 0;
    oss_softmax_cuda_test_knobs.column_cluster = 0;
  }
}

/* The test knob called `name` (softmax_test_knobs.cuh); NULL if there is none. */
static int *knob_named(const char *name) {
  oss_softmax_test_knobs *k = &oss_softmax_cuda_test_knobs;
  const struct {
    const char *name;
    int *field;
  } knobs[] = {{"force_tier", &k->force_tier},
               {"rows_at_once", &k->rows_at_once},
               {"row_in_cta", &k->row_in_cta},
               {"warp_lanes_per_row", &k->warp_lanes_per_row},
               {"no_backward_1024", &k->no_backward_1024},
               {"release_window_mib", &k->release_window_mib},
               {"release_first", &k->release_first},
               {"column_chunk_rows", &k->column_chunk_rows},
               {"column_threads", &k->column_threads},
               {"column_cluster", &k->column_cluster}};
  for (size_t i = 0; i < sizeof knobs / sizeof knobs[0]; i++)
    if (strcmp(name, knobs[i].name) == 0) return knobs[i].field;
  return NULL;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "check";
  cudaDeviceProp prop;
  int dev = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaGetDeviceProperties(&prop, dev));
  printf("device: %s (sm_%d%d, %d SMs)  mode: %s\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount, mode);
  CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  /* SELFTEST_KNOBS="name=v,name=v": test knobs for the whole run */
  const char *env = getenv("SELFTEST_KNOBS");
  for (const char *k = env; k && *k;) {
    char name[64];
    int v, used = 0;
    int *knob = NULL;
    if (sscanf(k, "%63[a-z_0-9]=%d%n", name, &v, &used) == 2) knob = knob_named(name);
    if (knob == NULL) {
      fprintf(stderr, "SELFTEST_KNOBS: cannot read '%s'\n", k);
      return 2;
    }
    *knob = v;
    printf("knob %s = %d\n", name, v);
    k += used;
    if (*k == ',') k++;
  }
  if (strcmp(mode, "check") == 0) {
    suite_errors();
    printf("-- rows\n"), fflush(stdout);
    suite_rows(0);
    printf("-- wide rows\n"), fflush(stdout);
    suite_wide(0);
    printf("-- columns\n"), fflush(stdout);
    suite_columns(0);
    printf("-- column clusters\n"), fflush(stdout);
    suite_column_clusters(0);
    printf("-- special values\n"), fflush(stdout);
    suite_special(0);
    printf("-- forced tiers\n"), fflush(stdout);
    suite_forced(0);
    printf("-- several rows per CTA\n"), fflush(stdout);
    suite_rows_per_cta();
  } else if (strcmp(mode, "columns") == 0) {
    suite_columns(0);
    suite_column_clusters(0);
  } else if (strcmp(mode, "quick") == 0) {
    suite_errors();
    suite_quick();
  } else if (strcmp(mode, "race") == 0) {
    suite_race();
  } else if (strcmp(mode, "bench") == 0) {
    bench();
  } else if (strcmp(mode, "bench_dim1") == 0) {
    measure_copy();
    bench_dim1();
  } else {
    fprintf(stderr, "usage: %s [check|columns|quick|race|bench|bench_dim1]\n", argv[0]);
    return 2;
  }
  printf("\n%s: %d checks, %d failed\n", mode, g_cases, g_failures);
  return g_failures ? 1 : 0;
}
