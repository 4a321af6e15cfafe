/*
 * softmax_cuda_selftest.cu - standalone test and timing driver for the CUDA
 * softmax C API (oss.h), no torch.
 *
 *   selftest check   correctness: many shapes / dtypes / alignments / tiers,
 *                    forward and backward, softmax and log_softmax, special
 *                    values, error paths; float64 CPU reference
 *   selftest quick   a reduced check (for compute-sanitizer memcheck)
 *   selftest columns check's column suites only (with SELFTEST_KNOBS="8=512":
 *                    every columns case on 512-thread CTAs where it can)
 *   selftest race    a few small cases per tier (for compute-sanitizer racecheck)
 *   selftest bench   timing table: % of a 1 GiB device-to-device copy
 *                    measured in the same run (bytes read + written)
 *   selftest bench_dim1 [BYTES [THREADS]]  only the table's last lines (dim=1
 *                    against the last dim), optionally with the column tiles'
 *                    width and CTA size forced (0: the planner's)
 *   selftest sweep   timing of planner alternatives (test knobs)
 *   selftest sweep_cols  the columns kernel's cluster sizes and tile widths at
 *                    n = 1024 .. 16384 (test knobs 12 and 6)
 *   selftest waves [DTYPE:COLS ...]  the cluster-width plans (CTA size,
 *                    shared memory, cluster cap) with the rows that fit at
 *                    once; WAVES_VARIANTS=auto,t256,... picks variants
 *   selftest profile one forward and one backward launch of each point that
 *                    misses a target of issue #3, with its plan printed (to run
 *                    under ncu; each case's kernels are launched once)
 *   selftest fixed POINT...  each point (OP:DTYPE:COLS[:KNOBS], e.g.
 *                    bwd:bf16:4096:11=1) timed alone with the L2 flushed at
 *                    2^26..2^28 elements (FIXED_SIZES), and t = t0 + bytes /
 *                    rate fitted: the fixed cost per call against the
 *                    streaming rate
 *   selftest timeline POINT...  (builds with -DOSS_SOFTMAX_TIMELINE) every
 *                    CTA's start, end and SM in one launch: where the fixed
 *                    cost goes (ramp-up, the last wave's tail)
 *   selftest bwd_data the bfloat16 and float16 backward kernels on their own
 *                    data and on each other's bits: does a speed gap follow
 *                    the code or the data?
 *
 * SELFTEST_KNOBS="9=512,1=64" sets the planner's test knobs (softmax.cu) for
 * the whole run, so one binary times two plans.
 *
 * Inputs are fresh random values (randn * 3 plus a few large outliers, never
 * zero); outputs and the whole output buffer are poisoned with NaN (0xff
 * bytes) before each launch, and every byte outside the tensor view must
 * still be poison afterwards. Workspaces are allocated at exactly the size
 * the API reports. Exit status 0 only when every check passed.
 *
 * Build: nvcc -std=c++17 -O3 -DOSS_SOFTMAX_TEST_KNOBS -gencode arch=compute_90a,code=sm_90a -I csrc
 *        csrc/common.c csrc/cuda/softmax.cu csrc/tests/softmax_cuda_selftest.cu
 *        (add -DOSS_SOFTMAX_TIMELINE for the timeline mode: a separate binary,
 *        since the stamps cost the kernels a little)
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

/* Planner knobs of softmax.cu, for tests and tuning only (see there). */
enum { SM_TEST_KNOBS = 27 };
extern "C" int oss_softmax_cuda_test_knobs[SM_TEST_KNOBS];

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

/* the L2 release window (test knob 20 = 1 MiB of input, 21 = 1 at the first
 * rows): only some rows (outer indices) release their lines, so the boundary
 * falls inside the launch; warp tier, one-CTA chunks (aligned, and
 * misaligned with a dtype cast), columns clusters. In the quick suite too,
 * so memcheck sees the releases on both sides of the boundary. */
static void suite_release_window(void) {
  for (int front = 0; front < 2; front++) {
    oss_softmax_cuda_test_knobs[20] = 1;
    oss_softmax_cuda_test_knobs[21] = front;
    check(front, 0, 1500, 1000, 1, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 0, 0, 0, 0);
    check(!front, 1, 300, 4096, 1, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 0, 0, 0, 0);
    check(1, front, 200, 4099, 1, OSS_FLOAT16, OSS_FLOAT32, 1, 2, 1, 3, 0, 0);
    check(front, 0, 40, 256, 512, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 0, 0, 0, 0);
  }
  oss_softmax_cuda_test_knobs[20] = oss_softmax_cuda_test_knobs[21] = 0;
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
   * warp's group, contiguous and strided rows; then (knob 26) every such
   * row with rows per lane, at most 8 lanes per row (K = 2 with lanes of
   * one slot at 12 and 15 slots) and 16 (idle lanes) */
  static const int64_t narrow_widths[] = {8, 24, 64, 96, 120, 128};
  static const int lanes_knob[] = {0, 8, 16};
  for (int li = 0; li < 3; li++) {
    oss_softmax_cuda_test_knobs[26] = lanes_knob[li];
    for (int wi = 0; wi < 6; wi++)
      for (int a = 0; a < 3; a++)
        for (int o = 0; o < 3; o++) {
          if ((quick || li > 0) && (a + o + wi + li) % 3) continue;
          const int64_t n = narrow_widths[wi] / (k3[a] == OSS_FLOAT32 ? 2 : 1);
          check(0, (a + o + wi) & 1, 1000 + 37 * wi, n, 1, k3[a], k3[o], 0, 0, 0, 8 * (wi & 1), 0, 0);
        }
  }
  oss_softmax_cuda_test_knobs[26] = 0;
  static const int64_t f64_widths[] = {1, 7, 128, 255, 1000, 5000, 70001};
  for (int wi = 0; wi < 7; wi++)
    for (int bwd = 0; bwd < 2; bwd++)
      for (int log = 0; log < 2; log++)
        if (!quick || wi % 3 == 0) check(bwd, log, rows_for(f64_widths[wi], budget / 4), f64_widths[wi], 1, OSS_FLOAT64, OSS_FLOAT64, wi & 1, 0, 0, wi, 0, 0);
  /* backward rows of 3/4 to all of 1024 x 4 register slots: aligned ones
   * take one 1024-thread CTA of registers, misaligned ones (and all of them
   * with test knob 19) the two-CTA plan with a shared-memory part */
  for (int alt = 0; alt < 2; alt++) {
    oss_softmax_cuda_test_knobs[19] = alt;
    for (int log = 0; log < 2; log++) {
      check(1, log, 9, 28001 + 7 * log, 1, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 0, 0, 0, 0);
      check(1, log, 7, 30001, 1, OSS_FLOAT16, OSS_FLOAT32, 1, 2, 1, 3, 0, 0);
      check(1, log, 5, 12288 + log, 1, OSS_FLOAT32, OSS_BFLOAT16, log, 0, 0, log, 0, 0);
      check(1, log, 6, 16384, 1, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 0);
    }
  }
  oss_softmax_cuda_test_knobs[19] = 0;
  /* the light one-row-per-CTA tier wherever it holds the row (test knob 22
   * = 2: two slots per thread, 3: one slot, 256: CTAs of 256 threads), every
   * dtype, the grid also capped at 5 CTAs (knob 10) so each CTA loops over
   * rows: the backward's block sum alternates its shared buffer per row */
  static const int64_t light_widths[] = {64, 256, 1000, 2048, 4096, 8192};
  static const int light_knob[] = {2, 3, 256};
  for (int li = 0; li < 3; li++)
    for (int cap = 0; cap < 2; cap++) {
      oss_softmax_cuda_test_knobs[22] = light_knob[li];
      oss_softmax_cuda_test_knobs[10] = cap ? 5 : 0;
      for (int wi = 0; wi < 6; wi++)
        for (int a = 0; a < 3; a++)
          for (int bwd = 0; bwd < 2; bwd++) {
            if (quick && (wi + a + li + cap) % 3) continue;
            const int o = (a + wi * bwd) % 3; /* the backward also with another output type */
            check(bwd, (wi + a + cap) & 1, 17 + 4 * wi, light_widths[wi], 1, k3[a], k3[o], 0, 0, 0, 0, 0, 0);
          }
    }
  oss_softmax_cuda_test_knobs[22] = oss_softmax_cuda_test_knobs[10] = 0;
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
  oss_softmax_cuda_test_knobs[0] = 5;
  for (int wi = 0; wi < 4; wi++)
    for (int d = 0; d < 3; d++)
      for (int bwd = 0; bwd < 2; bwd++) {
        if (quick && (wi + d + bwd) % 3) continue;
        const int64_t n = widths[wi];
        check(bwd, (wi + d + bwd) & 1, wi == 3 ? 2 : 5, n, 1, k3[d], k3[(d + bwd) % 3], (wi + d) % 4, 0, 1, wi & 1 ? 3 : 0, 0, 0);
      }
  check(0, 0, 300, 131072 + 1, 1, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 0, 0, 0, 0); /* rows >> resident */
  oss_softmax_cuda_test_knobs[0] = 0;
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
          oss_softmax_cuda_test_knobs[12] = sizes[ci];
          check(bwd, (s + d + bwd) & 1, h.outer, h.n, h.inner, k3[d], k3[(d + bwd + ci) % 3], (s + ci) % 4, bwd, ci & 1, s & 1,
                (s + ci) % 3, 0);
        }
  oss_softmax_cuda_test_knobs[10] = 2;
  for (int bwd = 0; bwd < 2; bwd++) {
    oss_softmax_cuda_test_knobs[12] = 4;
    check(bwd, 0, 7, 333, 50, OSS_BFLOAT16, OSS_BFLOAT16, 1, 0, 1, 1, 0, 0);
    check(bwd, 1, 5, 1000, 33, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 1, 0);
    check(bwd, 0, 5, 100, 37, OSS_FLOAT64, OSS_FLOAT64, 0, 1, 0, 1, 0, 0);
  }
  oss_softmax_cuda_test_knobs[10] = 0;
  oss_softmax_cuda_test_knobs[12] = 0;
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
  for (int tier = 1; tier <= 5; tier++) {
    oss_softmax_cuda_test_knobs[0] = tier;
    static const int64_t widths[] = {3, 100, 1000, 2049, 20000, 70001};
    for (int wi = 0; wi < 6; wi++)
      for (int bwd = 0; bwd < 2; bwd++) {
        if (quick && (wi + bwd + tier) % 2) continue;
        check(bwd, wi & 1, 5, widths[wi], 1, OSS_FLOAT32, OSS_BFLOAT16, wi % 3, 1, 0, 1, 0, 0);
        if (!quick) check(bwd, 1, 3, widths[wi], 1, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 3, 0, 0, wi % 2 == 0 && !bwd);
      }
    for (int wi = 1; wi < 6; wi += 2) check(0, 1, 9, widths[wi], 1, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 1);
  }
  oss_softmax_cuda_test_knobs[0] = 0;
  oss_softmax_cuda_test_knobs[3] = 7; /* column split with 7-row chunks */
  for (int bwd = 0; bwd < 2; bwd++) {
    check(bwd, 0, 3, 100, 37, OSS_FLOAT32, OSS_FLOAT32, 1, 0, 0, 0, 0, 0);
    check(bwd, 1, 2, 50, 300, OSS_BFLOAT16, OSS_FLOAT16, 0, 0, 0, 1, 2, 0);
  }
  check(0, 0, 2, 50, 300, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 1);
  check(0, 1, 2, 50, 300, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 1);
  oss_softmax_cuda_test_knobs[3] = 0;
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

static void bench_dim1(int tile_bytes, int threads);

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
  bench_dim1(0, 0);
}

/* softmax over dim 1 of a (32, 1024, 64, 64) tensor (the columns kernel)
 * against the last-dim case of the same bytes (#3's 0.9x target) */
static void bench_dim1(int tile_bytes, int threads) {
  double fp, bp, fu, bu, fp2, bp2, fu2, bu2;
  oss_softmax_cuda_test_knobs[6] = tile_bytes;
  oss_softmax_cuda_test_knobs[8] = threads;
  oss_softmax_cuda_test_knobs[7] = tile_bytes || threads ? 3 : 0;
  bench_one(OSS_FLOAT32, 32, 1024, 64 * 64, &fp, &bp, &fu, &bu, 1);
  bench_one(OSS_FLOAT32, 32 * 64 * 64, 1024, 1, &fp2, &bp2, &fu2, &bu2, 0);
  printf("\ndim=1 of (32,1024,64,64) f32: fwd %.1f us %.1f%% (%.2fx of last-dim %.1f%%), bwd %.1f us %.1f%% (%.2fx of %.1f%%)\n",
         fu, fp, fp / fp2, fp2, bu, bp, bp / bp2, bp2);
  oss_softmax_cuda_test_knobs[7] = tile_bytes || threads ? 3 : 0;
  bench_one(OSS_BFLOAT16, 32, 1024, 64 * 64, &fp, &bp, &fu, &bu, 1);
  bench_one(OSS_BFLOAT16, 32 * 64 * 64, 1024, 1, &fp2, &bp2, &fu2, &bu2, 0);
  printf("dim=1 of (32,1024,64,64) bf16: fwd %.1f%% (%.2fx of last-dim %.1f%%), bwd %.1f%% (%.2fx of %.1f%%)\n", fp,
         fp / fp2, fp2, bp, bp / bp2, bp2);
  oss_softmax_cuda_test_knobs[6] = 0;
  oss_softmax_cuda_test_knobs[8] = 0;
}

/* planner alternatives through the knobs (forced tier, soft shared-memory
 * limit per CTA), each with the chosen
 * plan printed: documents the planner's choices. Where a row needs more
 * than one CTA: the planner's tier against the spread tier (CTAs exchanging
 * through the workspace; chunks of <= 64 KB of shared memory, or the size
 * named), the cluster tier and the split tier. */
static void sweep(void) {
  measure_copy();
  typedef struct {
    oss_dtype t;
    int64_t n;
    int tier, soft_kb, threads;
    const char *name;
  } var;
  static const var vars[] = {
      {OSS_FLOAT32, 262144, 0, 0, 0, "auto"},      {OSS_FLOAT32, 262144, 5, 0, 0, "spread"},
      {OSS_BFLOAT16, 128256, 0, 0, 0, "auto"},     {OSS_BFLOAT16, 128256, 5, 0, 0, "spread"},
      {OSS_BFLOAT16, 262144, 0, 0, 0, "auto"},     {OSS_BFLOAT16, 262144, 5, 0, 0, "spread"},
      {OSS_FLOAT32, 1048576, 0, 0, 0, "auto"},     {OSS_FLOAT32, 1048576, 3, 0, 0, "cluster"},
      {OSS_FLOAT32, 1048576, 4, 0, 0, "split"},    {OSS_FLOAT32, 1048576, 5, 100, 0, "spread100"},
      {OSS_FLOAT32, 1048576, 5, 48, 0, "spread48"}, {OSS_BFLOAT16, 1048576, 0, 0, 0, "auto"},
      {OSS_BFLOAT16, 1048576, 5, 0, 0, "spread"},  {OSS_BFLOAT16, 1048576, 5, 100, 0, "spread100"},
      {OSS_BFLOAT16, 1048576, 5, 32, 0, "spread32"}, {OSS_FLOAT16, 1048576, 0, 0, 0, "auto"},
      {OSS_FLOAT16, 1048576, 5, 0, 0, "spread"},   {OSS_FLOAT32, 1048576, 5, 32, 0, "spread32"},
      {OSS_FLOAT32, 4194304, 0, 0, 0, "auto"},     {OSS_FLOAT32, 4194304, 4, 0, 0, "split"},
      {OSS_BFLOAT16, 4194304, 0, 0, 0, "auto"},    {OSS_BFLOAT16, 4194304, 4, 0, 0, "split"},
      {OSS_BFLOAT16, 128256, 0, 48, 256, "t256"},  {OSS_BFLOAT16, 262144, 0, 48, 256, "t256"},
      {OSS_BFLOAT16, 1048576, 5, 48, 256, "spread48t256"}, {OSS_FLOAT16, 1048576, 5, 48, 256, "spread48t256"},
      {OSS_BFLOAT16, 1048576, 5, 32, 256, "spread32t256"}, {OSS_FLOAT32, 1048576, 5, 48, 256, "spread48t256"},
      {OSS_FLOAT32, 262144, 0, 48, 256, "t256"}
  };
  for (size_t v = 0; v < sizeof vars / sizeof vars[0]; v++) {
    oss_softmax_cuda_test_knobs[0] = vars[v].tier;
    oss_softmax_cuda_test_knobs[1] = vars[v].soft_kb;
    oss_softmax_cuda_test_knobs[9] = vars[v].threads;
    oss_softmax_cuda_test_knobs[7] = 3;
    double fp, bp, fu, bu;
    bench_one(vars[v].t, ((int64_t)1 << 26) / vars[v].n, vars[v].n, 1, &fp, &bp, &fu, &bu, 1);
    printf("sweep %-5s %8lld %-8s fwd %6.1f%%  bwd %6.1f%%\n", dt_name(vars[v].t), (long long)vars[v].n, vars[v].name, fp, bp);
    fflush(stdout);
  }
  memset(oss_softmax_cuda_test_knobs, 0, sizeof oss_softmax_cuda_test_knobs);
}

/* The columns kernel's cluster sizes (knob 12; 1 = one CTA per tile, which
 * falls back to the split path where the tile does not fit) and row segments
 * (knob 6, bytes) at n = 512 .. 16384 (1024: #3's dim=1 shape), 2^27
 * elements each */
static void sweep_cols(void) {
  measure_copy();
  typedef struct {
    int64_t n;
    int C, tile_bytes; /* knobs 12 and 6; 0 = the planner's */
  } var;
  static const var vars[] = {{512, 0, 0},    {512, 1, 64},   {1024, 0, 0},   {1024, 1, 64},   {1024, 2, 128},
                             {1024, 4, 128}, {1024, 4, 256}, {1024, 8, 256}, {2048, 0, 0},    {2048, 1, 64},
                             {2048, 8, 128}, {4096, 0, 0},   {4096, 0, 64},  {16384, 0, 0},   {16384, 0, 64}};
  for (int d = 0; d < 2; d++)
    for (size_t v = 0; v < sizeof vars / sizeof vars[0]; v++) {
      const oss_dtype t = d ? OSS_BFLOAT16 : OSS_FLOAT32;
      const int64_t n = vars[v].n, inner = 4096, outer = ((int64_t)1 << 27) / (n * inner);
      oss_softmax_cuda_test_knobs[12] = vars[v].C;
      oss_softmax_cuda_test_knobs[6] = vars[v].tile_bytes;
      oss_softmax_cuda_test_knobs[7] = 3;
      double fp, bp, fu, bu;
      bench_one(t, outer, n, inner, &fp, &bp, &fu, &bu, 1);
      char name[16] = "auto";
      if (vars[v].C) snprintf(name, sizeof name, "C=%d", vars[v].C);
      if (vars[v].tile_bytes) snprintf(name + strlen(name), sizeof name - strlen(name), ",%dB", vars[v].tile_bytes);
      printf("sweep_cols %-5s [%lld,%lld,%lld] %-9s fwd %6.1f%% %7.1f us  bwd %6.1f%% %7.1f us\n", dt_name(t),
             (long long)outer, (long long)n, (long long)inner, name, fp, fu, bp, bu);
      fflush(stdout);
    }
  memset(oss_softmax_cuda_test_knobs, 0, sizeof oss_softmax_cuda_test_knobs);
}

/* The plans for rows that need a cluster: each plan the knobs give (CTA size
 * cap [9], soft shared-memory limit [1], cluster cap [2]) with the number of
 * rows that fit at once (printed with the plan), forward and backward. */
static void waves(int nshape, char **shape_args) {
  measure_copy();
  typedef struct {
    int threads, soft_kb, cmax;
    const char *name;
  } var;
  static const var vars[] = {{0, 0, 0, "auto"},       {256, 48, 0, "t256"},     {256, 32, 0, "t256-s32"},
                             {0, 1, 0, "regs"},       {256, 1, 0, "t256-regs"}, {0, 64, 0, "s64"},
                             {0, 80, 0, "s80"},       {0, 0, 8, "c8"},          {128, 16, 0, "t128-s16"},
                             {128, 24, 0, "t128-s24"}};
  static const struct {
    oss_dtype t;
    int64_t n;
  } shapes[] = {{OSS_BFLOAT16, 128256}, {OSS_BFLOAT16, 262144}, {OSS_BFLOAT16, 1048576}, {OSS_FLOAT16, 262144},
                {OSS_FLOAT32, 262144}};
  /* optional arguments DTYPE:COLUMNS (f32, bf16, f16) replace the shapes;
   * WAVES_VARIANTS=name,name,... picks variants */
  const int ndefault = (int)(sizeof shapes / sizeof shapes[0]);
  const int ns = nshape > 0 ? nshape : ndefault;
  const char *pick = getenv("WAVES_VARIANTS");
  for (int s = 0; s < ns; s++) {
    oss_dtype t = shapes[s % ndefault].t;
    int64_t n = shapes[s % ndefault].n;
    if (nshape > 0) {
      char name[8];
      long long cols;
      const int ok = sscanf(shape_args[s], "%7[a-z0-9]:%lld", name, &cols) == 2 && cols >= 1 &&
                     (strcmp(name, "f32") == 0 || strcmp(name, "f16") == 0 || strcmp(name, "bf16") == 0);
      if (!ok) {
        fprintf(stderr, "waves: cannot read shape '%s' (DTYPE:COLS, DTYPE f32, bf16 or f16)\n", shape_args[s]);
        g_failures++;
        return;
      }
      t = strcmp(name, "f32") == 0 ? OSS_FLOAT32 : strcmp(name, "f16") == 0 ? OSS_FLOAT16 : OSS_BFLOAT16;
      n = cols;
    }
    for (size_t v = 0; v < sizeof vars / sizeof vars[0]; v++) {
      if (pick) {
        char want[64];
        snprintf(want, sizeof want, ",%s,", vars[v].name);
        char list[512];
        snprintf(list, sizeof list, ",%s,", pick);
        if (!strstr(list, want)) continue;
      }
      memset(oss_softmax_cuda_test_knobs, 0, sizeof oss_softmax_cuda_test_knobs);
      oss_softmax_cuda_test_knobs[9] = vars[v].threads;
      oss_softmax_cuda_test_knobs[1] = vars[v].soft_kb;
      oss_softmax_cuda_test_knobs[2] = vars[v].cmax;
      oss_softmax_cuda_test_knobs[7] = 3;
      double fp, bp, fu, bu;
      bench_one(t, ((int64_t)1 << 26) / n, n, 1, &fp, &bp, &fu, &bu, 1);
      printf("waves %-5s %8lld %-13s fwd %6.1f%% %7.1f us  bwd %6.1f%% %7.1f us\n", dt_name(t), (long long)n,
             vars[v].name, fp, fu, bp, bu);
      fflush(stdout);
    }
  }
  memset(oss_softmax_cuda_test_knobs, 0, sizeof oss_softmax_cuda_test_knobs);
}

/* Does the backward's speed follow the code or the data? The bfloat16 and
 * float16 kernels, each on its own y = softmax(x), dy, and on the other's
 * bits (the same bytes reinterpreted), same plan. */
static void bwd_data(void) {
  measure_copy();
  static const int64_t ns[3] = {4096, 128256, 262144};
  for (int k = 0; k < 3; k++) {
    const int64_t n = ns[k], rows = ((int64_t)1 << 26) / n;
    sm_ctx cb, ch;
    bench_ctx_alloc(&cb, OSS_BFLOAT16, rows, n, 1);
    bench_ctx_alloc(&ch, OSS_FLOAT16, rows, n, 1);
    if (do_fwd(&cb) != OSS_OK || do_fwd(&ch) != OSS_OK) g_failures++;
    const double bytes = 3.0 * (double)(rows * n) * 2;
#define PCT(ms) (100.0 * bytes / ((ms) * 1e-3) / 1e9 / g_copy_gbs)
    const float bb = time_median_ms(do_bwd, &cb, 15), hh = time_median_ms(do_bwd, &ch, 15);
    void *by = cb.b.y.data, *bdy = cb.b.dy.data;
    cb.b.y.data = ch.b.y.data, cb.b.dy.data = ch.b.dy.data;
    ch.b.y.data = by, ch.b.dy.data = bdy;
    const float bh = time_median_ms(do_bwd, &cb, 15), hb = time_median_ms(do_bwd, &ch, 15);
    ch.b.y.data = cb.b.y.data, ch.b.dy.data = cb.b.dy.data;
    cb.b.y.data = by, cb.b.dy.data = bdy;
    printf("bwd_data %7lld: bf16 kernel on bf16 data %.1f%%, on f16 bits %.1f%% | f16 kernel on f16 data %.1f%%, on bf16 bits %.1f%%\n",
           (long long)n, PCT(bb), PCT(bh), PCT(hh), PCT(hb));
#undef PCT
    fflush(stdout);
    bench_ctx_free(&cb);
    bench_ctx_free(&ch);
  }
}

/* One forward then one backward of each case, plans printed: the launches to
 * profile (ncu) at the points where #3's targets are missed. */
static void profile(void) {
  typedef struct {
    oss_dtype t;
    int64_t outer, n, inner;
  } pcase;
  static const pcase cases[] = {
      {OSS_FLOAT32, 32, 1024, 64 * 64},      {OSS_BFLOAT16, 32, 1024, 64 * 64}, /* dim=1 */
      {OSS_FLOAT32, 32 * 64 * 64, 1024, 1},  {OSS_BFLOAT16, 32 * 64 * 64, 1024, 1}, /* their last-dim peers */
      {OSS_BFLOAT16, 523, 128256, 1},        {OSS_FLOAT16, 523, 128256, 1},        {OSS_BFLOAT16, 256, 262144, 1},
      {OSS_FLOAT32, 64, 1048576, 1},         {OSS_BFLOAT16, 64, 1048576, 1}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const pcase *k = &cases[i];
    sm_ctx c;
    bench_ctx_alloc(&c, k->t, k->outer, k->n, k->inner);
    printf("profile case %zu: %s [%lld, %lld, %lld]\n", i, dt_name(k->t), (long long)k->outer, (long long)k->n,
           (long long)k->inner);
    oss_softmax_cuda_test_knobs[7] = 3;
    if (do_fwd(&c) != OSS_OK || do_bwd(&c) != OSS_OK) {
      printf("FAIL profile case %zu: %s\n", i, oss_error_message());
      g_failures++;
    }
    CK(cudaStreamSynchronize(g_stream));
    fflush(stdout);
    bench_ctx_free(&c);
    g_cases++;
  }
}

/* ---- the fixed cost per call: fits and timelines --------------------------
 * A point is OP:DTYPE:COLS[:KNOBS] (OP fwd or bwd, DTYPE f32, bf16 or f16,
 * KNOBS i=v;i=v planner knobs for that point only). */
typedef struct {
  int bwd;
  oss_dtype t;
  int64_t n;
  int knobs[SM_TEST_KNOBS];
  char text[96];
} point;

static int parse_point(const char *arg, point *pt) {
  char op[8], name[8], rest[64] = "";
  long long cols;
  memset(pt, 0, sizeof *pt);
  snprintf(pt->text, sizeof pt->text, "%s", arg);
  if (sscanf(arg, "%7[a-z]:%7[a-z0-9]:%lld:%63s", op, name, &cols, rest) < 3 || cols < 1) return 0;
  if (strcmp(op, "fwd") != 0 && strcmp(op, "bwd") != 0) return 0;
  if (strcmp(name, "f32") != 0 && strcmp(name, "f16") != 0 && strcmp(name, "bf16") != 0) return 0;
  pt->bwd = strcmp(op, "bwd") == 0;
  pt->t = strcmp(name, "f32") == 0 ? OSS_FLOAT32 : strcmp(name, "f16") == 0 ? OSS_FLOAT16 : OSS_BFLOAT16;
  pt->n = cols;
  for (const char *k = rest; *k;) {
    int i, v, used = 0;
    if (sscanf(k, "%d=%d%n", &i, &v, &used) != 2 || i < 0 || i >= (int)(sizeof pt->knobs / sizeof pt->knobs[0])) return 0;
    pt->knobs[i] = v;
    k += used;
    if (*k == ';') k++;
  }
  return 1;
}

/* parse_point for mode `mode`, reporting a point it cannot read as a failure. */
static int read_point(const char *mode, const char *arg, point *pt) {
  if (parse_point(arg, pt)) return 1;
  fprintf(stderr, "%s: cannot read point '%s' (OP:DTYPE:COLS[:i=v;i=v])\n", mode, arg);
  g_failures++;
  return 0;
}

/* Rows of n columns in 2^log2n elements (at least one). */
static int64_t rows_in(int log2n, int64_t n) {
  const int64_t rows = ((int64_t)1 << log2n) / n;
  return rows > 0 ? rows : 1;
}

/* Median of reps launches, each timed alone after a 256 MB write flushed the L2. */
static float time_flushed_ms(launch_fn fn, void *ctx, void *flush, int reps) {
  cudaEvent_t a, b;
  float ms[32];
  if (reps > 32) reps = 32;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; i++) fn(ctx);
  for (int i = 0; i < reps; i++) {
    CK(cudaMemsetAsync(flush, i, (size_t)256 << 20, g_stream));
    CK(cudaEventRecord(a, g_stream));
    if (fn(ctx) != OSS_OK) printf("launch failed: %s\n", oss_error_message());
    CK(cudaEventRecord(b, g_stream));
    CK(cudaEventSynchronize(b));
    CK(cudaEventElapsedTime(&ms[i], a, b));
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  qsort(ms, (size_t)reps, sizeof(float), cmp_float);
  return ms[reps / 2];
}

/* Least squares t = t0 + bytes / rate: t0 in us, rate in % of copy. */
static void fit_line(const double *bytes, const double *ms, int k, double *t0_us, double *rate_pct) {
  double mb = 0, mt = 0, sbt = 0, sbb = 0;
  for (int i = 0; i < k; i++) mb += bytes[i] / k, mt += ms[i] / k;
  for (int i = 0; i < k; i++) sbt += (bytes[i] - mb) * (ms[i] - mt), sbb += (bytes[i] - mb) * (bytes[i] - mb);
  const double slope = sbt / sbb;
  *t0_us = (mt - slope * mb) * 1e3;
  *rate_pct = 100.0 * (1.0 / slope) / 1e6 / g_copy_gbs;
}

/* fixed POINT...: each point timed alone (events around the one launch, after
 * a 256 MB write that flushes the L2) at 2^k elements for k in FIXED_SIZES
 * (default 26,27,28), and the line t = t0 + bytes / rate fitted: t0 is the
 * fixed cost per call (ramp-up, the last wave's tail), rate the streaming
 * speed. The device-to-device copy is fitted the same way. Caveat: the
 * flush's dirty lines are written back during the timed launch, which at
 * 2^26 costs some launches (the copy among them, on the H100) up to ~20 us
 * and not others, so fits over 2^26 are unreliable; compare one size at a
 * time, A against B in one run. */
static void fixed_cost(int npts, char **args) {
  measure_copy();
  int sizes[8], ns = 0;
  const char *env = getenv("FIXED_SIZES");
  for (const char *k = env ? env : "26,27,28"; *k && ns < 8;) {
    int v, used = 0;
    if (sscanf(k, "%d%n", &v, &used) != 1 || v < 10 || v > 30) break;
    sizes[ns++] = v;
    k += used;
    if (*k == ',') k++;
  }
  void *flush;
  CK(cudaMalloc(&flush, (size_t)256 << 20));
  {
    double by[8], ms[8], t0, rate;
    for (int i = 0; i < ns; i++) {
      copy_ctx cc;
      cc.bytes = (size_t)2 << sizes[i]; /* 2-byte elements: one bf16 forward's read */
      CK(cudaMalloc(&cc.src, cc.bytes));
      CK(cudaMalloc(&cc.dst, cc.bytes));
      CK(cudaMemsetAsync(cc.src, 1, cc.bytes, g_stream));
      ms[i] = time_flushed_ms(do_copy, &cc, flush, 15);
      by[i] = 2.0 * (double)cc.bytes;
      printf("fixed copy 2^%d x 2 B: %8.2f us %6.1f%%\n", sizes[i], ms[i] * 1e3, 100.0 * by[i] / (ms[i] * 1e6) / g_copy_gbs);
      CK(cudaFree(cc.src));
      CK(cudaFree(cc.dst));
    }
    if (ns > 1) {
      fit_line(by, ms, ns, &t0, &rate);
      printf("fit copy: fixed %6.2f us per call, streaming at %6.1f %% of copy\n", t0, rate);
    }
  }
  for (int p = 0; p < npts; p++) {
    point pt;
    if (!read_point("fixed", args[p], &pt)) break;
    double by[8], ms[8], t0, rate;
    for (int i = 0; i < ns; i++) {
      const int64_t rows = rows_in(sizes[i], pt.n);
      sm_ctx c;
      bench_ctx_alloc(&c, pt.t, rows, pt.n, 1);
      memcpy(oss_softmax_cuda_test_knobs, pt.knobs, sizeof pt.knobs);
      oss_softmax_cuda_test_knobs[7] = i == 0 ? (pt.bwd ? 2 : 1) : 0;
      if (pt.bwd && do_fwd(&c) != OSS_OK) printf("launch failed: %s\n", oss_error_message());
      ms[i] = time_flushed_ms(pt.bwd ? do_bwd : do_fwd, &c, flush, 15);
      verify_rows(&c, pt.bwd, rows, pt.n, 1);
      by[i] = (double)rows * pt.n * dt_size(pt.t) * (pt.bwd ? 3 : 2);
      printf("fixed %-28s 2^%d: %8.2f us %6.1f%%\n", pt.text, sizes[i], ms[i] * 1e3,
             100.0 * by[i] / (ms[i] * 1e6) / g_copy_gbs);
      bench_ctx_free(&c);
      fflush(stdout);
    }
    memset(oss_softmax_cuda_test_knobs, 0, sizeof oss_softmax_cuda_test_knobs);
    if (ns > 1) {
      fit_line(by, ms, ns, &t0, &rate);
      printf("fit %-28s fixed %6.2f us per call, streaming at %6.1f %% of copy\n", pt.text, t0, rate);
    }
  }
  CK(cudaFree(flush));
}

#ifdef OSS_SOFTMAX_TIMELINE
extern "C" void *oss_softmax_cuda_timeline(int *ctas);

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int cmp_u64(const void *a, const void *b) {
  const unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
  return x < y ? -1 : x > y;
}

/* timeline POINT...: TL_REPS (default 5) launches of each point at
 * 2^TL_LOG2 elements (default 26), each after a 256 MB write, with every
 * CTA's start, end and SM recorded (row kernels only; a split plan's two
 * passes share the records). Per launch: the streaming rate in the middle of
 * the span and what the span loses against it (ramp-up and tail), CTA
 * lifetimes, when each SM got its first CTA and finished its last, and the
 * CTAs running in 0.5 us bins over the first and last 10 us. */
static void timeline(int npts, char **args) {
  measure_copy();
  const char *env = getenv("TL_LOG2");
  const int log2n = env ? atoi(env) : 26;
  int cap = 0;
  unsigned long long *dtl = (unsigned long long *)oss_softmax_cuda_timeline(&cap);
  if (!dtl) {
    printf("FAIL timeline: no buffer\n");
    g_failures++;
    return;
  }
  unsigned long long *tl = (unsigned long long *)malloc((size_t)cap * 24);
  void *flush;
  CK(cudaMalloc(&flush, (size_t)256 << 20));
  for (int p = 0; p < npts; p++) {
    point pt;
    if (!read_point("timeline", args[p], &pt)) break;
    const int64_t rows = rows_in(log2n, pt.n);
    sm_ctx c;
    bench_ctx_alloc(&c, pt.t, rows, pt.n, 1);
    memcpy(oss_softmax_cuda_test_knobs, pt.knobs, sizeof pt.knobs);
    oss_softmax_cuda_test_knobs[7] = pt.bwd ? 2 : 1;
    launch_fn fn = pt.bwd ? do_bwd : do_fwd;
    if (pt.bwd) do_fwd(&c);
    for (int i = 0; i < 3; i++) fn(&c);
    const char *renv = getenv("TL_REPS");
    int reps = renv ? atoi(renv) : 5;
    if (reps < 1 || reps > 32) reps = 5;
    double losses[32], spans[32];
    for (int rep = 0; rep < reps; rep++) {
      losses[rep] = spans[rep] = 0;
      CK(cudaMemsetAsync(dtl, 0, (size_t)cap * 24, g_stream));
      CK(cudaMemsetAsync(flush, 7, (size_t)256 << 20, g_stream));
      cudaEvent_t a, b;
      CK(cudaEventCreate(&a));
      CK(cudaEventCreate(&b));
      CK(cudaEventRecord(a, g_stream));
      fn(&c);
      CK(cudaEventRecord(b, g_stream));
      CK(cudaMemcpyAsync(tl, dtl, (size_t)cap * 24, cudaMemcpyDeviceToHost, g_stream));
      CK(cudaStreamSynchronize(g_stream));
      float ev_ms;
      CK(cudaEventElapsedTime(&ev_ms, a, b));
      CK(cudaEventDestroy(a));
      CK(cudaEventDestroy(b));
      int n = 0;
      while (n < cap && tl[3 * n] != 0) n++;
      unsigned long long t0 = ~0ull, t1 = 0;
      for (int i = 0; i < n; i++) {
        if (tl[3 * i] < t0) t0 = tl[3 * i];
        if (tl[3 * i + 1] > t1) t1 = tl[3 * i + 1];
      }
      const double bytes = (double)rows * pt.n * dt_size(pt.t) * (pt.bwd ? 3 : 2);
      printf("timeline %s 2^%d: %d CTAs%s; event %.2f us, CTAs span %.2f us, bytes at copy speed %.2f us\n", pt.text,
             log2n, n, n == cap ? " (buffer full: later CTAs not recorded)" : "", ev_ms * 1e3, (t1 - t0) * 1e-3,
             bytes / g_copy_gbs * 1e-3);
      if (n == 0) break;
      /* the streaming rate: the bytes of the CTAs that end in the middle 60 %
       * of the span over that time (every CTA moves the same bytes but the
       * last), and what the span loses against it (ramp-up and tail) */
      {
        const unsigned long long w0 = t0 + (t1 - t0) / 5, w1 = t1 - (t1 - t0) / 5;
        int done = 0;
        for (int i = 0; i < n; i++) done += tl[3 * i + 1] >= w0 && tl[3 * i + 1] < w1;
        const double rate = done * (bytes / n) / (double)(w1 - w0); /* GB/s */
        const double loss = (t1 - t0) * 1e-3 - bytes / rate * 1e-3;
        printf("  streaming (middle 60 %%): %.1f %% of copy; the span loses %.2f us against it\n",
               100.0 * rate / g_copy_gbs, loss);
        losses[rep] = loss, spans[rep] = (t1 - t0) * 1e-3;
      }
      unsigned long long *life = (unsigned long long *)malloc((size_t)n * 8);
      for (int i = 0; i < n; i++) life[i] = tl[3 * i + 1] - tl[3 * i];
      qsort(life, (size_t)n, 8, cmp_u64);
      printf("  CTA lifetime us: p10 %.2f p50 %.2f p90 %.2f max %.2f\n", life[n / 10] * 1e-3, life[n / 2] * 1e-3,
             life[9 * n / 10] * 1e-3, life[n - 1] * 1e-3);
      free(life);
      enum { NSM = 256 };
      unsigned long long first[NSM], last[NSM];
      int count[NSM];
      for (int s = 0; s < NSM; s++) first[s] = ~0ull, last[s] = 0, count[s] = 0;
      for (int i = 0; i < n; i++) {
        const int s = (int)(tl[3 * i + 2] % NSM);
        if (tl[3 * i] < first[s]) first[s] = tl[3 * i];
        if (tl[3 * i + 1] > last[s]) last[s] = tl[3 * i + 1];
        count[s]++;
      }
      unsigned long long fs[NSM], ls[NSM];
      int nsm = 0, cmin = 1 << 30, cmax = 0;
      for (int s = 0; s < NSM; s++)
        if (count[s]) {
          fs[nsm] = first[s] - t0, ls[nsm] = t1 - last[s], nsm++;
          if (count[s] < cmin) cmin = count[s];
          if (count[s] > cmax) cmax = count[s];
        }
      qsort(fs, (size_t)nsm, 8, cmp_u64);
      qsort(ls, (size_t)nsm, 8, cmp_u64);
      double idle_mean = 0;
      for (int i = 0; i < nsm; i++) idle_mean += ls[i] * 1e-3 / nsm;
      printf("  %d SMs, %d..%d CTAs each; first CTA after start us: p50 %.2f max %.2f; "
             "idle before the end us: p10 %.2f p50 %.2f p90 %.2f max %.2f (mean %.2f)\n",
             nsm, cmin, cmax, fs[nsm / 2] * 1e-3, fs[nsm - 1] * 1e-3, ls[nsm / 10] * 1e-3, ls[nsm / 2] * 1e-3,
             ls[9 * nsm / 10] * 1e-3, ls[nsm - 1] * 1e-3, idle_mean);
      /* CTAs running, averaged over 0.5 us bins */
      const double bin = 500.0, span = (double)(t1 - t0);
      const int nb = (int)(span / bin) + 1;
      double *act = (double *)calloc((size_t)nb, sizeof(double));
      for (int i = 0; i < n; i++) {
        const double s0 = (double)(tl[3 * i] - t0), s1 = (double)(tl[3 * i + 1] - t0);
        for (int k = (int)(s0 / bin); k < nb && k * bin < s1; k++) {
          const double lo = k * bin > s0 ? k * bin : s0, hi = (k + 1) * bin < s1 ? (k + 1) * bin : s1;
          if (hi > lo) act[k] += (hi - lo) / bin;
        }
      }
      printf("  running CTAs per 0.5 us, first 10 us:");
      for (int k = 0; k < nb && k < 20; k++) printf(" %.0f", act[k]);
      printf("\n  running CTAs per 0.5 us, last 10 us: ");
      for (int k = nb - 20 > 0 ? nb - 20 : 0; k < nb; k++) printf(" %.0f", act[k]);
      printf("\n");
      free(act);
    }
    memset(oss_softmax_cuda_test_knobs, 0, sizeof oss_softmax_cuda_test_knobs);
    qsort(losses, (size_t)reps, sizeof(double), cmp_double);
    qsort(spans, (size_t)reps, sizeof(double), cmp_double);
    printf("timeline %s median of %d: CTAs span %.2f us, loss %.2f us (min %.2f max %.2f)\n", pt.text, reps,
           spans[reps / 2], losses[reps / 2], losses[0], losses[reps - 1]);
    bench_ctx_free(&c);
    fflush(stdout);
  }
  free(tl);
  CK(cudaFree(flush));
}
#endif

/* CTAs (and clusters) that run several rows each (grid.y capped): the next
 * row's shared-memory part is copied while the current row is written */
static void suite_rows_per_cta(void) {
  oss_softmax_cuda_test_knobs[10] = 3;
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
  oss_softmax_cuda_test_knobs[0] = 4; /* split: SM_STATS / SM_APPLY over several rows per CTA */
  oss_softmax_cuda_test_knobs[10] = 2;
  for (int bwd = 0; bwd < 2; bwd++) check(bwd, 0, 5, 100003, 1, OSS_BFLOAT16, OSS_BFLOAT16, 1, 0, 0, 1, 0, 0);
  oss_softmax_cuda_test_knobs[0] = 0;
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
  for (int tier = 1; tier <= 5; tier++) {
    oss_softmax_cuda_test_knobs[0] = tier;
    for (int bwd = 0; bwd < 2; bwd++) check(bwd, 1, 3, 20000, 1, OSS_BFLOAT16, OSS_FLOAT32, 1, 0, 1, 1, 0, 0);
  }
  oss_softmax_cuda_test_knobs[0] = 5; /* spread: many CTAs per row, more rows than resident at once */
  for (int bwd = 0; bwd < 2; bwd++) check(bwd, bwd, 3, 300007, 1, OSS_FLOAT64, OSS_FLOAT64, 1, 0, 0, 1, 0, 0);
  check(0, 0, 40, 1048576 + 3, 1, OSS_FLOAT32, OSS_FLOAT32, 1, 0, 0, 0, 0, 0);
  check(1, 1, 9, 1048576, 1, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 0, 0, 0, 0);
  oss_softmax_cuda_test_knobs[0] = 0;
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
    oss_softmax_cuda_test_knobs[10] = 2; /* several rows per CTA: the backward's alternating block-sum buffer */
    check(bwd, 0, 7, 4096, 1, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 0, 0, 0, 0);
    check(bwd, 1, 7, 8192, 1, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 0);
    oss_softmax_cuda_test_knobs[10] = 0;
    check(bwd, 1, 3, 3000, 1, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 0, 0, 0, 0);    /* one CTA, registers */
    check(bwd, 0, 3, 40000, 1, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 0);     /* one CTA + shared memory */
    if (bwd) check(1, 1, 3, 30000, 1, OSS_FLOAT16, OSS_FLOAT16, 0, 0, 0, 0, 0, 0); /* 1024 threads, registers */
    check(bwd, 1, 2, 300001, 1, OSS_FLOAT32, OSS_FLOAT32, 1, 0, 0, 0, 0, 0);    /* cluster */
    if (!bwd) check(0, 0, 1, 1048576, 1, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 0); /* 1024-thread CTAs */
    check(bwd, 1, 20, 1048581, 1, OSS_BFLOAT16, OSS_BFLOAT16, 1, 1, 1, 1, 0, 0); /* 16-bit clusters of 16, more than fit at once */
    check(bwd, 0, 3, 262147, 1, OSS_FLOAT16, OSS_FLOAT16, 1, 1, 1, 1, 0, 0);    /* 16-bit cluster of 4 */
    oss_softmax_cuda_test_knobs[10] = 2; /* several rows per CTA: next-row copies */
    check(bwd, 1, 5, 40003, 1, OSS_FLOAT32, OSS_FLOAT32, 1, 0, 0, 1, 0, 0);
    check(bwd, 0, 5, 300001, 1, OSS_BFLOAT16, OSS_BFLOAT16, 0, 0, 0, 0, 0, 0);
    oss_softmax_cuda_test_knobs[10] = 0;
    check(bwd, 0, 3, 700, 33, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 0);      /* columns */
    oss_softmax_cuda_test_knobs[0] = 4;
    check(bwd, 0, 2, 20000, 1, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 0);     /* split */
    oss_softmax_cuda_test_knobs[0] = 5;
    check(bwd, 1, 3, 300001, 1, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 0);    /* spread */
    oss_softmax_cuda_test_knobs[0] = 0;
    oss_softmax_cuda_test_knobs[3] = 9;
    check(bwd, 1, 2, 100, 40, OSS_FLOAT32, OSS_FLOAT32, 0, 0, 0, 0, 0, 0);      /* column split */
    oss_softmax_cuda_test_knobs[3] = 0;
    oss_softmax_cuda_test_knobs[12] = 4;
    oss_softmax_cuda_test_knobs[10] = 2;
    check(bwd, 0, 5, 700, 33, OSS_BFLOAT16, OSS_BFLOAT16, 1, 0, 0, 0, 0, 0);     /* column clusters, two tiles each */
    oss_softmax_cuda_test_knobs[10] = 0;
    oss_softmax_cuda_test_knobs[12] = 0;
  }
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "check";
  cudaDeviceProp prop;
  int dev = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaGetDeviceProperties(&prop, dev));
  printf("device: %s (sm_%d%d, %d SMs)  mode: %s\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount, mode);
  CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  /* SELFTEST_KNOBS="i=v,i=v": planner knobs for the whole run (A/B timing) */
  const char *env = getenv("SELFTEST_KNOBS");
  for (const char *k = env; k && *k;) {
    int i, v, used = 0;
    if (sscanf(k, "%d=%d%n", &i, &v, &used) != 2 || i < 0 || i >= (int)(sizeof oss_softmax_cuda_test_knobs / sizeof(int))) {
      fprintf(stderr, "SELFTEST_KNOBS: cannot read '%s'\n", k);
      return 2;
    }
    oss_softmax_cuda_test_knobs[i] = v;
    printf("knob [%d] = %d\n", i, v);
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
  } else if (strcmp(mode, "sweep") == 0) {
    sweep();
  } else if (strcmp(mode, "sweep_cols") == 0) {
    sweep_cols();
  } else if (strcmp(mode, "waves") == 0) {
    waves(argc - 2, argv + 2);
  } else if (strcmp(mode, "bench_dim1") == 0) {
    /* optional: the column tiles' width in bytes (knob 6), the CTA size (knob 8) */
    measure_copy();
    bench_dim1(argc > 2 ? atoi(argv[2]) : 0, argc > 3 ? atoi(argv[3]) : 0);
  } else if (strcmp(mode, "profile") == 0) {
    profile();
  } else if (strcmp(mode, "bwd_data") == 0) {
    bwd_data();
  } else if (strcmp(mode, "fixed") == 0) {
    fixed_cost(argc - 2, argv + 2);
#ifdef OSS_SOFTMAX_TIMELINE
  } else if (strcmp(mode, "timeline") == 0) {
    timeline(argc - 2, argv + 2);
#endif
  } else {
    fprintf(stderr, "usage: %s [check|columns|quick|race|bench|bench_dim1|sweep|sweep_cols|waves|profile|bwd_data|fixed|timeline]\n", argv[0]);
    return 2;
  }
  printf("\n%s: %d checks, %d failed\n", mode, g_cases, g_failures);
  return g_failures ? 1 : 0;
}
