/*
 * attention_cuda_selftest.cu - standalone test and timing driver of the CUDA
 * attention kernels (no torch): forward out/lse and backward dq/dk/dv against
 * a float64 CPU reference on fresh random inputs, then TFLOP/s at the
 * benchmark shapes (batch x seqlen = 16k tokens, width 2048).
 *
 * Build and run: bash scripts/gpu_check.sh attention_selftest (it builds the
 * attention kernels, their generated instantiations, csrc/common.c and this file
 * into build/attention_selftest/selftest and runs it with --no-bench). By hand,
 * from the repository root (add -DOSS_SELFTEST_TUNE to also time alternative
 * bf16 tile configurations):
 *   python3 csrc/cuda/attention/generate_attention_kernels.py --sm90 --out-dir build/gen
 *   nvcc -std=c++17 -O3 -DOSS_WITH_CUDA -Icsrc -gencode arch=compute_90a,code=sm_90a \
 *        -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__ -U__CUDA_NO_HALF2_OPERATORS__ \
 *        -U__CUDA_NO_BFLOAT16_CONVERSIONS__ --expt-relaxed-constexpr -x cu csrc/common.c \
 *        csrc/cuda/attention/*.cu build/gen/*.cu csrc/tests/attention_cuda_selftest.cu -o selftest
 * Run: ./selftest [--quick] [--no-test] [--no-bench] [--tune] [--only fp16,bf16,fp32,fp64] [--seed N]
 *   --quick: a reduced test grid (for compute-sanitizer) and no timing.
 *
 * Coverage: float16, bfloat16, float32, float64; every compiled head dim plus
 * 17, 72, 100 and Dv != D; causal none / top-left / bottom-right; bool masks
 * with broadcast strides (some rows fully masked), additive masks (input dtype
 * and float32, transposed strides, -inf entries); GQA ratios 1, 2, 4, 8;
 * lengths 0, 1, 17, 127, 129 with Lq != Lk both ways; contiguous, (B, L, H, D)
 * transposed, padded-aligned and misaligned (odd pitch, pointer + 1 element)
 * layouts; a head stride above 2^31 elements. Inputs and outputs are poisoned
 * with NaN (0xFF bytes) first, and the padding of output rows must stay
 * poisoned. Default and deterministic backward are both checked, the latter
 * twice for bitwise equality.
 *
 * Tolerance (FlashAttention's rule), per tensor:
 *   max |ours - ref64| <= 2 * max |peer - ref64| + atol
 * ref64 is the float64 computation; peer is a same-dtype computation done on
 * the CPU the way a FlashAttention kernel does it (a CPU emulation, no torch):
 * scores, softmax and every sum in float32 from the dtype's inputs, P and dS
 * rounded to the dtype before they multiply V, dO, K or Q, the output
 * normalised by the float32 row sum, and each result rounded once to the
 * dtype; for float64 the peer is the float64 computation itself. atol: 1e-10
 * (float64), 4 float32 roundings of max |ref64| (float32), 1e-4 (float16),
 * 1e-3 (bfloat16). A row with no visible key must give out 0, lse -inf and
 * zero gradients exactly. The program exits non-zero when any case fails.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "cuda/attention/attention_common.cuh"
#ifdef OSS_SELFTEST_TUNE
#include "cuda/attention/mma/attention_bwd.cuh"
#include "cuda/attention/mma/attention_fwd.cuh"
#endif

#define CK(call)                                                                                 \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(2);                                                                                   \
    }                                                                                            \
  } while (0)

#define OK(call)                                                                                     \
  do {                                                                                               \
    oss_status s_ = (call);                                                                          \
    if (s_ != OSS_OK) {                                                                              \
      fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, oss_status_name(s_),        \
              oss_error_message());                                                                  \
      exit(2);                                                                                       \
    }                                                                                                \
  } while (0)

// ---------------------------------------------------------------------------
// random numbers, dtype conversion
// ---------------------------------------------------------------------------
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static double urand() {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return ((g_rng >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static double nrand() { return sqrt(-2.0 * log(urand())) * cos(6.283185307179586 * urand()); }

static size_t esize(oss_dtype t) { return t == OSS_FLOAT64 ? 8 : t == OSS_FLOAT32 ? 4 : t == OSS_BOOL ? 1 : 2; }
static const char *dname(oss_dtype t) {
  switch (t) {
  case OSS_FLOAT16: return "fp16";
  case OSS_BFLOAT16: return "bf16";
  case OSS_FLOAT32: return "fp32";
  case OSS_FLOAT64: return "fp64";
  default: return "bool";
  }
}
/* Rounds v to dtype t, writes its bytes to dst, returns the rounded value. */
static double put(oss_dtype t, void *dst, double v) {
  switch (t) {
  case OSS_FLOAT16: {
    __half h = __float2half_rn((float)v);
    memcpy(dst, &h, 2);
    return (double)__half2float(h);
  }
  case OSS_BFLOAT16: {
    __nv_bfloat16 h = __float2bfloat16_rn((float)v);
    memcpy(dst, &h, 2);
    return (double)__bfloat162float(h);
  }
  case OSS_FLOAT32: {
    float f = (float)v;
    memcpy(dst, &f, 4);
    return f;
  }
  case OSS_FLOAT64: memcpy(dst, &v, 8); return v;
  default: {
    unsigned char c = v != 0;
    memcpy(dst, &c, 1);
    return c;
  }
  }
}
static double get(oss_dtype t, const void *src) {
  switch (t) {
  case OSS_FLOAT16: {
    __half h;
    memcpy(&h, src, 2);
    return __half2float(h);
  }
  case OSS_BFLOAT16: {
    __nv_bfloat16 h;
    memcpy(&h, src, 2);
    return __bfloat162float(h);
  }
  case OSS_FLOAT32: {
    float f;
    memcpy(&f, src, 4);
    return f;
  }
  default: {
    double d;
    memcpy(&d, src, 8);
    return d;
  }
  }
}

// ---------------------------------------------------------------------------
// strided 4-d tensors [n0][n1][n2][n3] (last dim contiguous) on host and device
// ---------------------------------------------------------------------------
enum { LAY_CONTIG = 0, LAY_BLHD = 1, LAY_MISALIGNED = 2, LAY_PADDED = 3, LAY_HUGE = 4 };
static const char *lay_name[] = {"contig", "blhd", "misaligned", "padded", "huge-stride"};

struct Tensor {
  oss_dtype dt;
  int64_t n[4];
  int64_t s[3];
  int64_t off; /* element offset of [0][0][0][0] in the allocation */
  size_t alloc; /* elements */
  std::vector<unsigned char> host; /* allocation image */
  void *dev = nullptr;
  std::vector<double> val; /* logical values, [n0][n1][n2][n3] */

  void *ptr() const { return (char *)dev + off * esize(dt); }
  int64_t idx(int64_t a, int64_t b, int64_t c, int64_t d) const { return off + a * s[0] + b * s[1] + c * s[2] + d; }
  int64_t lidx(int64_t a, int64_t b, int64_t c, int64_t d) const { return ((a * n[1] + b) * n[2] + c) * n[3] + d; }
};

static void tensor_init(Tensor &t, oss_dtype dt, int64_t n0, int64_t n1, int64_t n2, int64_t n3, int lay) {
  t.dt = dt;
  t.n[0] = n0, t.n[1] = n1, t.n[2] = n2, t.n[3] = n3;
  int64_t pitch = n3;
  t.off = 0;
  switch (lay) {
  case LAY_BLHD:
    t.s[0] = n2 * n1 * n3, t.s[1] = n3, t.s[2] = n1 * n3;
    break;
  case LAY_MISALIGNED:
    pitch = n3 + 3;
    t.off = 1;
    t.s[0] = n1 * n2 * pitch, t.s[1] = n2 * pitch, t.s[2] = pitch;
    break;
  case LAY_PADDED:
    pitch = (n3 + 7) / 8 * 8 + 8;
    t.s[0] = n1 * n2 * pitch, t.s[1] = n2 * pitch, t.s[2] = pitch;
    break;
  case LAY_HUGE: /* head stride past 2^31 elements (needs n1 >= 2 to matter) */
    pitch = (n3 + 7) / 8 * 8;
    t.s[2] = pitch, t.s[1] = (1ll << 31) + 64, t.s[0] = n1 * t.s[1];
    break;
  default:
    t.s[0] = n1 * n2 * n3, t.s[1] = n2 * n3, t.s[2] = n3;
  }
  t.alloc = (size_t)(t.off + (n0 > 0 ? (n0 - 1) * t.s[0] : 0) + (n1 > 0 ? (n1 - 1) * t.s[1] : 0) +
                     (n2 > 0 ? (n2 - 1) * t.s[2] : 0) + n3 + 16);
  t.val.assign((size_t)(n0 * n1 * n2 * n3), 0.0);
}

static bool is_huge(const Tensor &t) { return t.alloc > (size_t)1 << 28; }

/* Byte offset in the host image of element (a, b, c, d): the allocation image,
 * or for huge layouts a compact [n0][n1][n2][n3] image of the used rows. */
static size_t host_off(const Tensor &t, int64_t a, int64_t b, int64_t c, int64_t d) {
  return (is_huge(t) ? t.lidx(a, b, c, d) : t.idx(a, b, c, d)) * esize(t.dt);
}

/* Random values (rounded to dtype) into a NaN-poisoned image. */
static void tensor_random(Tensor &t, double sd) {
  t.host.assign((is_huge(t) ? t.val.size() : t.alloc) * esize(t.dt), 0xFF);
  for (int64_t a = 0; a < t.n[0]; a++)
    for (int64_t b = 0; b < t.n[1]; b++)
      for (int64_t c = 0; c < t.n[2]; c++)
        for (int64_t d = 0; d < t.n[3]; d++) {
          double v = nrand() * sd;
          if (urand() < 0.002) v *= 4; /* a few outliers */
          t.val[t.lidx(a, b, c, d)] = put(t.dt, &t.host[host_off(t, a, b, c, d)], v);
        }
}

/* Device allocation poisoned with 0xFF, then the host image (if any). */
static void tensor_upload(Tensor &t) {
  const size_t bytes = t.alloc * esize(t.dt);
  CK(cudaMalloc(&t.dev, bytes));
  CK(cudaMemset(t.dev, 0xFF, bytes));
  if (t.host.empty()) return;
  if (!is_huge(t)) {
    CK(cudaMemcpy(t.dev, t.host.data(), bytes, cudaMemcpyHostToDevice));
  } else {
    for (int64_t a = 0; a < t.n[0]; a++)
      for (int64_t b = 0; b < t.n[1]; b++)
        for (int64_t c = 0; c < t.n[2]; c++)
          CK(cudaMemcpy((char *)t.dev + t.idx(a, b, c, 0) * esize(t.dt), &t.host[host_off(t, a, b, c, 0)],
                        t.n[3] * esize(t.dt), cudaMemcpyHostToDevice));
  }
}

static void tensor_poison_output(Tensor &t) {
  if (t.dev) CK(cudaFree(t.dev));
  t.dev = nullptr;
  t.host.clear(); /* all 0xFF */
  tensor_upload(t);
}

/* Reads back; returns the number of bytes outside the logical tensor that
 * changed (stray writes). */
static int64_t tensor_download(Tensor &t) {
  const size_t es = esize(t.dt);
  int64_t stray = 0;
  if (!is_huge(t)) {
    t.host.resize(t.alloc * es);
    CK(cudaMemcpy(t.host.data(), t.dev, t.alloc * es, cudaMemcpyDeviceToHost));
    std::vector<char> inside(t.alloc, 0);
    for (int64_t a = 0; a < t.n[0]; a++)
      for (int64_t b = 0; b < t.n[1]; b++)
        for (int64_t c = 0; c < t.n[2]; c++)
          for (int64_t d = 0; d < t.n[3]; d++) {
            const int64_t i = t.idx(a, b, c, d);
            inside[i] = 1;
            t.val[t.lidx(a, b, c, d)] = get(t.dt, &t.host[i * es]);
          }
    for (size_t i = 0; i < t.alloc; i++)
      if (!inside[i])
        for (size_t e = 0; e < es; e++) stray += t.host[i * es + e] != 0xFF;
  } else {
    std::vector<unsigned char> row(t.n[3] * es + 16 * es);
    for (int64_t a = 0; a < t.n[0]; a++)
      for (int64_t b = 0; b < t.n[1]; b++)
        for (int64_t c = 0; c < t.n[2]; c++) {
          const size_t o = t.idx(a, b, c, 0) * es;
          const size_t len = std::min((size_t)std::min(t.n[3] + 8, t.s[2]) * es, t.alloc * es - o);
          CK(cudaMemcpy(row.data(), (char *)t.dev + o, len, cudaMemcpyDeviceToHost));
          for (int64_t d = 0; d < t.n[3]; d++) t.val[t.lidx(a, b, c, d)] = get(t.dt, &row[d * es]);
          for (size_t e = t.n[3] * es; e < len; e++) stray += row[e] != 0xFF;
        }
  }
  return stray;
}

static void tensor_free(Tensor &t) {
  if (t.dev) CK(cudaFree(t.dev));
  t.dev = nullptr;
}

// ---------------------------------------------------------------------------
// test cases and the float64 reference
// ---------------------------------------------------------------------------
enum { MASK_NONE = 0, MASK_BOOL_BCAST = 1, MASK_ADD_DTYPE = 2, MASK_ADD_F32_T = 3, MASK_BOOL_ROWS = 4 };
static const char *mask_name[] = {"none", "bool[B,1,Lq,Lk]", "add[1,H,1,Lk]", "add-f32[B,H,Lq,Lk]^T", "bool[B,H,Lq,1]"};

struct Case {
  oss_dtype dt;
  int B, Hq, Hkv, Lq, Lk, D, Dv;
  int causal, mask, lay_in, lay_out;
};

struct Mask {
  oss_dtype dt;
  int64_t s[4];
  std::vector<unsigned char> host;
  std::vector<double> val; /* indexed like the device buffer */
  void *dev = nullptr;
};

static void make_mask(const Case &c, Mask &m) {
  const int64_t B = c.B, H = c.Hq, Lq = c.Lq, Lk = c.Lk;
  int64_t n = 0;
  switch (c.mask) {
  case MASK_BOOL_BCAST: /* [B,1,Lq,Lk], head broadcast; a few rows all false */
    m.dt = OSS_BOOL;
    m.s[0] = Lq * Lk, m.s[1] = 0, m.s[2] = Lk, m.s[3] = 1;
    n = B * Lq * Lk;
    break;
  case MASK_ADD_DTYPE: /* [1,H,1,Lk] additive, batch and row broadcast */
    m.dt = c.dt;
    m.s[0] = 0, m.s[1] = Lk, m.s[2] = 0, m.s[3] = 1;
    n = H * Lk;
    break;
  case MASK_ADD_F32_T: /* [B,H,Lq,Lk] float32 stored transposed (key-major) */
    m.dt = OSS_FLOAT32;
    m.s[0] = H * Lq * Lk, m.s[1] = Lq * Lk, m.s[2] = 1, m.s[3] = Lq;
    n = B * H * Lq * Lk;
    break;
  case MASK_BOOL_ROWS: /* [B,H,Lq,1]: whole rows visible or not */
    m.dt = OSS_BOOL;
    m.s[0] = H * Lq, m.s[1] = Lq, m.s[2] = 1, m.s[3] = 0;
    n = B * H * Lq;
    break;
  }
  n = std::max<int64_t>(n, 1);
  m.host.assign(n * esize(m.dt), 0);
  m.val.assign(n, 0.0);
  for (int64_t i = 0; i < n; i++) {
    double v;
    if (m.dt == OSS_BOOL) {
      if (c.mask == MASK_BOOL_BCAST) {
        const int64_t row = i / std::max<int64_t>(Lk, 1);
        v = (row % 7 == 3) ? 0.0 : (urand() < 0.8); /* rows 3, 10, ... fully masked */
      } else {
        v = urand() < 0.75;
      }
    } else {
      v = nrand() * 2.0;
      if (urand() < 0.1) v = -INFINITY;
    }
    m.val[i] = put(m.dt, &m.host[i * esize(m.dt)], v);
  }
  CK(cudaMalloc(&m.dev, m.host.size()));
  CK(cudaMemcpy(m.dev, m.host.data(), m.host.size(), cudaMemcpyHostToDevice));
}

/* v rounded to dtype t (to float32 for float32; float64 unchanged) */
static double round_to(oss_dtype t, double v) {
  unsigned char bytes[8];
  return put(t, bytes, v);
}

/* The float64 reference, and the same-dtype peer (see Tolerance above). */
struct Ref {
  std::vector<double> out, lse, dq, dk, dv;
  std::vector<double> peer_out, peer_lse, peer_dq, peer_dk, peer_dv;
};

static void parallel_for(int64_t n, void (*fn)(void *, int64_t), void *ctx) {
  const int nt = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  std::vector<std::thread> th;
  for (int t = 0; t < nt; t++)
    th.emplace_back([=]() {
      for (int64_t i = t; i < n; i += nt) fn(ctx, i);
    });
  for (auto &x : th) x.join();
}

struct RefCtx {
  const Case *c;
  const Tensor *q, *k, *v, *dO;
  const Mask *m;
  double scale;
  Ref *r;
};

/* The same-dtype peer of query row i of head h: scores, softmax and sums in
 * float32 from the dtype's inputs; P and dS rounded to the dtype (a no-op for
 * float32) before they multiply; out = (sum P V) / l; every result rounded to
 * the dtype once (dq here; dk and dv, summed over the rows in float32, in
 * run_case). vis: the keys the row sees (causal rule and boolean mask). */
static void peer_row(RefCtx &x, int b, int h, int hk, int i, const std::vector<char> &vis) {
  const Case &c = *x.c;
  const oss_dtype dt = c.dt;
  const float scale = (float)x.scale;
  std::vector<float> ps(c.Lk);
  float m = -INFINITY;
  for (int j = 0; j < c.Lk; j++) {
    if (!vis[j]) continue;
    float acc = 0;
    for (int d = 0; d < c.D; d++) acc += (float)x.q->val[x.q->lidx(b, h, i, d)] * (float)x.k->val[x.k->lidx(b, hk, j, d)];
    double add = 0;
    if (c.mask != MASK_NONE && x.m->dt != OSS_BOOL)
      add = x.m->val[b * x.m->s[0] + h * x.m->s[1] + i * x.m->s[2] + j * x.m->s[3]];
    ps[j] = acc * scale + (float)add;
    m = std::max(m, ps[j]);
  }
  float l = 0;
  for (int j = 0; j < c.Lk; j++) {
    ps[j] = vis[j] ? expf(ps[j] - m) : 0.0f;
    l += ps[j];
  }
  const int64_t li = ((int64_t)b * c.Hq + h) * c.Lq + i;
  x.r->peer_lse[li] = l > 0 ? (double)(m + logf(l)) : -INFINITY;
  std::vector<double> o(c.Dv, 0.0);
  for (int e = 0; e < c.Dv; e++) {
    float acc = 0;
    for (int j = 0; j < c.Lk; j++)
      if (ps[j] != 0) acc += (float)round_to(dt, ps[j]) * (float)x.v->val[x.v->lidx(b, hk, j, e)];
    o[e] = l > 0 ? round_to(dt, acc / l) : 0.0;
    x.r->peer_out[li * c.Dv + e] = o[e];
  }
  if (!(l > 0)) return;
  float Dsum = 0; /* rowsum(dO * out), out as stored */
  for (int e = 0; e < c.Dv; e++) Dsum += (float)x.dO->val[x.dO->lidx(b, h, i, e)] * (float)o[e];
  std::vector<float> dq(c.D, 0.0f);
  for (int j = 0; j < c.Lk; j++) {
    if (ps[j] == 0) continue;
    float dp = 0;
    for (int e = 0; e < c.Dv; e++) dp += (float)x.dO->val[x.dO->lidx(b, h, i, e)] * (float)x.v->val[x.v->lidx(b, hk, j, e)];
    const float pn = ps[j] / l;
    const float pr = (float)round_to(dt, pn);
    const float ds = (float)round_to(dt, pn * (dp - Dsum));
    const int64_t kj = ((int64_t)b * c.Hkv + hk) * c.Lk + j;
    for (int d = 0; d < c.D; d++) {
      dq[d] += scale * ds * (float)x.k->val[x.k->lidx(b, hk, j, d)];
      x.r->peer_dk[kj * c.D + d] = (float)x.r->peer_dk[kj * c.D + d] + scale * ds * (float)x.q->val[x.q->lidx(b, h, i, d)];
    }
    for (int e = 0; e < c.Dv; e++)
      x.r->peer_dv[kj * c.Dv + e] = (float)x.r->peer_dv[kj * c.Dv + e] + pr * (float)x.dO->val[x.dO->lidx(b, h, i, e)];
  }
  for (int d = 0; d < c.D; d++) x.r->peer_dq[li * c.D + d] = round_to(dt, dq[d]);
}

/* One (b, kv head): the group's query heads, so dk/dv need no atomics. */
static void ref_one(void *vctx, int64_t bhk) {
  RefCtx &x = *(RefCtx *)vctx;
  const Case &c = *x.c;
  const int b = (int)(bhk / c.Hkv), hk = (int)(bhk % c.Hkv), G = c.Hq / c.Hkv;
  const int64_t off = c.causal == OSS_CAUSAL_BOTTOM_RIGHT ? c.Lk - c.Lq : 0;
  std::vector<double> s(c.Lk), p(c.Lk), dp(c.Lk);
  std::vector<char> vis(c.Lk);
  for (int hh = 0; hh < G; hh++) {
    const int h = hk * G + hh;
    for (int i = 0; i < c.Lq; i++) {
      double mx = -INFINITY;
      for (int j = 0; j < c.Lk; j++) {
        bool ok = c.causal == OSS_CAUSAL_NONE || j <= i + off;
        double add = 0;
        if (c.mask != MASK_NONE) {
          const double mv = x.m->val[b * x.m->s[0] + h * x.m->s[1] + i * x.m->s[2] + j * x.m->s[3]];
          if (x.m->dt == OSS_BOOL) ok = ok && mv != 0;
          else add = mv;
        }
        double acc = 0;
        for (int d = 0; d < c.D; d++) acc += x.q->val[x.q->lidx(b, h, i, d)] * x.k->val[x.k->lidx(b, hk, j, d)];
        s[j] = acc * x.scale + add;
        vis[j] = ok && s[j] != -INFINITY;
        if (vis[j]) mx = std::max(mx, s[j]);
      }
      double l = 0;
      for (int j = 0; j < c.Lk; j++) {
        p[j] = vis[j] ? exp(s[j] - mx) : 0.0;
        l += p[j];
      }
      const int64_t li = ((int64_t)b * c.Hq + h) * c.Lq + i;
      x.r->lse[li] = l > 0 ? mx + log(l) : -INFINITY;
      for (int j = 0; j < c.Lk; j++) p[j] = l > 0 ? p[j] / l : 0.0;
      for (int e = 0; e < c.Dv; e++) {
        double acc = 0;
        for (int j = 0; j < c.Lk; j++) acc += p[j] * x.v->val[x.v->lidx(b, hk, j, e)];
        x.r->out[(li)*c.Dv + e] = acc;
      }
      /* backward */
      double Dsum = 0;
      for (int j = 0; j < c.Lk; j++) {
        double acc = 0;
        for (int e = 0; e < c.Dv; e++) acc += x.dO->val[x.dO->lidx(b, h, i, e)] * x.v->val[x.v->lidx(b, hk, j, e)];
        dp[j] = acc;
        Dsum += p[j] * acc;
      }
      for (int j = 0; j < c.Lk; j++) {
        if (p[j] == 0) continue;
        const double ds = p[j] * (dp[j] - Dsum);
        for (int d = 0; d < c.D; d++) {
          x.r->dq[li * c.D + d] += x.scale * ds * x.k->val[x.k->lidx(b, hk, j, d)];
          x.r->dk[(((int64_t)b * c.Hkv + hk) * c.Lk + j) * c.D + d] += x.scale * ds * x.q->val[x.q->lidx(b, h, i, d)];
        }
        for (int e = 0; e < c.Dv; e++)
          x.r->dv[(((int64_t)b * c.Hkv + hk) * c.Lk + j) * c.Dv + e] += p[j] * x.dO->val[x.dO->lidx(b, h, i, e)];
      }
      if (c.dt != OSS_FLOAT64) peer_row(x, b, h, hk, i, vis);
    }
  }
}

// ---------------------------------------------------------------------------
// comparison
// ---------------------------------------------------------------------------
static int g_fail = 0, g_pass = 0;
static double g_worst[4][5]; /* dtype x {out, lse, dq, dk, dv}: worst err / bound */

static int dt_index(oss_dtype t) { return t == OSS_FLOAT16 ? 0 : t == OSS_BFLOAT16 ? 1 : t == OSS_FLOAT32 ? 2 : 3; }

static double atol_for(oss_dtype t, double maxref) {
  switch (t) {
  case OSS_FLOAT16: return 1e-4;
  case OSS_BFLOAT16: return 1e-3;
  case OSS_FLOAT32: return 4 * 1.1920928955078125e-07 * std::max(maxref, 1e-30);
  default: return 1e-10;
  }
}

/* The tolerance rule for one tensor: max |got - ref| <= 2 max |peer - ref| +
 * atol over the elements where ref is finite; got must be NaN-free and equal
 * ref exactly where ref is not finite. Records err / bound in g_worst. */
static bool compare(const char *what, int slot, const Case &c, const std::vector<double> &got,
                    const std::vector<double> &ref, const std::vector<double> &peer, char *msg, size_t msglen) {
  double maxref = 0, maxerr = 0, peer_err = 0;
  int64_t bad_nan = 0, bad_exact = 0, worst = -1;
  for (size_t i = 0; i < ref.size(); i++)
    if (isfinite(ref[i])) maxref = std::max(maxref, fabs(ref[i]));
  for (size_t i = 0; i < ref.size(); i++) {
    if (isnan(got[i])) {
      bad_nan++;
      continue;
    }
    if (!isfinite(ref[i])) {
      if (got[i] != ref[i]) bad_exact++;
      continue;
    }
    const double e = fabs(got[i] - ref[i]);
    if (e > maxerr) maxerr = e, worst = (int64_t)i;
    if (isfinite(peer[i])) peer_err = std::max(peer_err, fabs(peer[i] - ref[i]));
  }
  const double bound = 2 * peer_err + atol_for(c.dt, maxref);
  const double ratio = maxerr / bound;
  double &w = g_worst[dt_index(c.dt)][slot];
  w = std::max(w, ratio);
  const bool ok = bad_nan == 0 && bad_exact == 0 && ratio <= 1.0;
  if (!ok)
    snprintf(msg + strlen(msg), msglen - strlen(msg),
             " %s(err %.3g at %lld, peer err %.3g, bound %.3g, max|ref| %.3g, ratio %.2f, nan %lld, inf-mismatch %lld)",
             what, maxerr, (long long)worst, peer_err, bound, maxref, ratio, (long long)bad_nan, (long long)bad_exact);
  return ok;
}

static void case_name(const Case &c, char *buf, size_t n) {
  static const char *cz[] = {"none", "top-left", "bottom-right"};
  snprintf(buf, n, "%s B=%d Hq=%d Hkv=%d Lq=%d Lk=%d D=%d Dv=%d causal=%s mask=%s in=%s out=%s", dname(c.dt), c.B,
           c.Hq, c.Hkv, c.Lq, c.Lk, c.D, c.Dv, cz[c.causal], mask_name[c.mask], lay_name[c.lay_in],
           lay_name[c.lay_out]);
}

static void run_case(const Case &c, bool verbose) {
  char name[256];
  case_name(c, name, sizeof name);
  const double scale = 1.0 / sqrt((double)c.D) * (c.D % 2 ? 1.3 : 1.0);
  Tensor q, k, v, dO, out, dq, dk, dv;
  tensor_init(q, c.dt, c.B, c.Hq, c.Lq, c.D, c.lay_in);
  tensor_init(k, c.dt, c.B, c.Hkv, c.Lk, c.D, c.lay_in == LAY_HUGE ? LAY_PADDED : c.lay_in);
  tensor_init(v, c.dt, c.B, c.Hkv, c.Lk, c.Dv, c.lay_in == LAY_BLHD ? LAY_MISALIGNED : (c.lay_in == LAY_HUGE ? LAY_CONTIG : c.lay_in));
  tensor_init(dO, c.dt, c.B, c.Hq, c.Lq, c.Dv, c.lay_in == LAY_HUGE ? LAY_CONTIG : c.lay_in);
  tensor_init(out, c.dt, c.B, c.Hq, c.Lq, c.Dv, c.lay_out);
  tensor_init(dq, c.dt, c.B, c.Hq, c.Lq, c.D, c.lay_out);
  tensor_init(dk, c.dt, c.B, c.Hkv, c.Lk, c.D, c.lay_out == LAY_HUGE ? LAY_PADDED : c.lay_out);
  tensor_init(dv, c.dt, c.B, c.Hkv, c.Lk, c.Dv, c.lay_out == LAY_HUGE ? LAY_MISALIGNED : c.lay_out);
  tensor_random(q, 1.0);
  tensor_random(k, 1.5);
  tensor_random(v, 1.0);
  tensor_random(dO, 1.0);
  tensor_upload(q);
  tensor_upload(k);
  tensor_upload(v);
  tensor_upload(dO);
  Mask m;
  if (c.mask != MASK_NONE) make_mask(c, m);

  const int64_t nlse = (int64_t)c.B * c.Hq * c.Lq;
  const size_t lse_es = c.dt == OSS_FLOAT64 ? 8 : 4;
  void *lse_dev;
  CK(cudaMalloc(&lse_dev, std::max<int64_t>(nlse, 1) * lse_es));
  CK(cudaMemset(lse_dev, 0xFF, std::max<int64_t>(nlse, 1) * lse_es));
  tensor_poison_output(out);

  oss_attention_params p;
  memset(&p, 0, sizeof p);
  p.dtype = c.dt;
  p.batch = c.B, p.heads_q = c.Hq, p.heads_kv = c.Hkv, p.len_q = c.Lq, p.len_k = c.Lk;
  p.head_dim = c.D, p.head_dim_v = c.Dv;
  p.q = q.ptr(), p.k = k.ptr(), p.v = v.ptr(), p.out = out.ptr(), p.lse = lse_dev;
  for (int i = 0; i < 3; i++) {
    p.q_stride[i] = q.s[i], p.k_stride[i] = k.s[i], p.v_stride[i] = v.s[i], p.out_stride[i] = out.s[i];
  }
  p.scale = scale;
  p.causal = (oss_causal)c.causal;
  p.mask_kind = c.mask == MASK_NONE ? OSS_MASK_NONE
                : (c.mask == MASK_BOOL_BCAST || c.mask == MASK_BOOL_ROWS) ? OSS_MASK_BOOL
                                                                          : OSS_MASK_ADDITIVE;
  if (c.mask != MASK_NONE) {
    p.mask = m.dev;
    p.mask_dtype = m.dt;
    for (int i = 0; i < 4; i++) p.mask_stride[i] = m.s[i];
  }

  /* reference */
  Ref r;
  r.out.assign((size_t)nlse * c.Dv, 0.0);
  r.lse.assign((size_t)nlse, 0.0);
  r.dq.assign((size_t)nlse * c.D, 0.0);
  r.dk.assign((size_t)c.B * c.Hkv * c.Lk * c.D, 0.0);
  r.dv.assign((size_t)c.B * c.Hkv * c.Lk * c.Dv, 0.0);
  r.peer_out.assign(r.out.size(), 0.0);
  r.peer_lse.assign(r.lse.size(), 0.0);
  r.peer_dq.assign(r.dq.size(), 0.0);
  r.peer_dk.assign(r.dk.size(), 0.0);
  r.peer_dv.assign(r.dv.size(), 0.0);
  RefCtx ctx = {&c, &q, &k, &v, &dO, &m, scale, &r};
  parallel_for((int64_t)c.B * c.Hkv, ref_one, &ctx);
  if (c.dt == OSS_FLOAT64) { /* the peer of float64 is the float64 computation */
    r.peer_out = r.out, r.peer_lse = r.lse, r.peer_dq = r.dq, r.peer_dk = r.dk, r.peer_dv = r.dv;
  } else {
    for (double &x : r.peer_dk) x = round_to(c.dt, x);
    for (double &x : r.peer_dv) x = round_to(c.dt, x);
  }

  char msg[2048] = "";
  bool ok = true;

  /* forward (the split-KV decode kernel needs a workspace for its partial outputs) */
  {
    const size_t fws_size = oss_attention_forward_workspace_size_cuda(&p);
    void *fws = nullptr;
    if (fws_size) CK(cudaMalloc(&fws, fws_size));
    OK(oss_attention_forward_cuda(&p, fws, nullptr));
    CK(cudaDeviceSynchronize());
    if (fws) CK(cudaFree(fws));
  }
  int64_t stray = tensor_download(out);
  std::vector<double> lse_got(nlse);
  {
    std::vector<unsigned char> buf(std::max<int64_t>(nlse, 1) * lse_es);
    CK(cudaMemcpy(buf.data(), lse_dev, buf.size(), cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < nlse; i++) lse_got[i] = get(c.dt == OSS_FLOAT64 ? OSS_FLOAT64 : OSS_FLOAT32, &buf[i * lse_es]);
  }
  ok &= compare("out", 0, c, out.val, r.out, r.peer_out, msg, sizeof msg);
  ok &= compare("lse", 1, c, lse_got, r.lse, r.peer_lse, msg, sizeof msg);
  /* fully masked rows: out exactly 0 */
  for (int64_t i = 0; i < nlse; i++)
    if (r.lse[i] == -INFINITY)
      for (int e = 0; e < c.Dv; e++)
        if (out.val[i * c.Dv + e] != 0.0) {
          ok = false;
          snprintf(msg + strlen(msg), sizeof msg - strlen(msg), " out-of-masked-row-not-zero(row %lld)", (long long)i);
          i = nlse;
          break;
        }
  if (stray) {
    ok = false;
    snprintf(msg + strlen(msg), sizeof msg - strlen(msg), " out-stray-bytes=%lld", (long long)stray);
  }

  /* backward: default mode, then deterministic twice */
  std::vector<double> det_q, det_k, det_v;
  for (int mode = 0; mode < 3; mode++) {
    tensor_poison_output(dq);
    tensor_poison_output(dk);
    tensor_poison_output(dv);
    oss_attention_backward_params bp;
    memset(&bp, 0, sizeof bp);
    bp.fwd = p;
    bp.dout = dO.ptr();
    bp.dq = dq.ptr(), bp.dk = dk.ptr(), bp.dv = dv.ptr();
    for (int i = 0; i < 3; i++)
      bp.dout_stride[i] = dO.s[i], bp.dq_stride[i] = dq.s[i], bp.dk_stride[i] = dk.s[i], bp.dv_stride[i] = dv.s[i];
    bp.deterministic = mode > 0;
    const size_t ws_size = oss_attention_backward_workspace_size_cuda(&bp);
    void *ws = nullptr;
    if (ws_size) {
      CK(cudaMalloc(&ws, ws_size));
      CK(cudaMemset(ws, 0xFF, ws_size));
    }
    OK(oss_attention_backward_cuda(&bp, ws, nullptr));
    CK(cudaDeviceSynchronize());
    if (ws) CK(cudaFree(ws));
    stray = tensor_download(dq) + tensor_download(dk) + tensor_download(dv);
    char tag[16];
    snprintf(tag, sizeof tag, "%s", mode == 0 ? "" : "det-");
    char nq_[16], nk_[16], nv_[16];
    snprintf(nq_, 16, "%sdq", tag), snprintf(nk_, 16, "%sdk", tag), snprintf(nv_, 16, "%sdv", tag);
    ok &= compare(nq_, 2, c, dq.val, r.dq, r.peer_dq, msg, sizeof msg);
    ok &= compare(nk_, 3, c, dk.val, r.dk, r.peer_dk, msg, sizeof msg);
    ok &= compare(nv_, 4, c, dv.val, r.dv, r.peer_dv, msg, sizeof msg);
    for (int64_t i = 0; i < nlse; i++)
      if (r.lse[i] == -INFINITY)
        for (int d = 0; d < c.D; d++)
          if (dq.val[i * c.D + d] != 0.0) {
            ok = false;
            snprintf(msg + strlen(msg), sizeof msg - strlen(msg), " %s-masked-row-not-zero", nq_);
            i = nlse;
            break;
          }
    if (stray) {
      ok = false;
      snprintf(msg + strlen(msg), sizeof msg - strlen(msg), " %sgrad-stray-bytes=%lld", tag, (long long)stray);
    }
    if (mode == 1) det_q = dq.val, det_k = dk.val, det_v = dv.val;
    if (mode == 2 && (det_q != dq.val || det_k != dk.val || det_v != dv.val)) {
      ok = false;
      snprintf(msg + strlen(msg), sizeof msg - strlen(msg), " deterministic-not-bitwise-equal");
    }
  }

  if (ok) g_pass++;
  else g_fail++;
  if (!ok || verbose) printf("%s %s%s\n", ok ? "PASS" : "FAIL", name, msg);
  fflush(stdout);
  Tensor *all[] = {&q, &k, &v, &dO, &out, &dq, &dk, &dv};
  for (Tensor *t : all) tensor_free(*t);
  CK(cudaFree(lse_dev));
  if (m.dev) CK(cudaFree(m.dev));
}

static std::vector<int> compiled_head_dims() {
  std::vector<int> dims;
  const char *s = oss_attention_cuda_head_dims_list();
  while (*s) {
    dims.push_back(atoi(s));
    while (*s && *s != ',') s++;
    if (*s == ',') s++;
  }
  return dims;
}

static const char *g_only = nullptr; /* --only fp16,bf16,...: dtypes to test */

static void run_tests(bool quick) {
  std::vector<int> dims = compiled_head_dims();
  std::vector<int> extra = {17, 72, 100};
  const oss_dtype dts[4] = {OSS_FLOAT16, OSS_BFLOAT16, OSS_FLOAT32, OSS_FLOAT64};
  /* (B, Hq, Hkv, Lq, Lk, causal, mask, lay_in, lay_out) scenarios, cycled */
  struct Sc {
    int B, Hq, Hkv, Lq, Lk, causal, mask, lin, lout;
  };
  const Sc sc[] = {
      {2, 4, 4, 129, 129, 0, MASK_NONE, LAY_CONTIG, LAY_CONTIG},
      {1, 8, 2, 127, 129, 1, MASK_NONE, LAY_BLHD, LAY_PADDED},
      {2, 4, 2, 17, 127, 2, MASK_BOOL_BCAST, LAY_MISALIGNED, LAY_MISALIGNED},
      {1, 8, 1, 129, 17, 2, MASK_ADD_DTYPE, LAY_PADDED, LAY_BLHD},
      {2, 2, 1, 1, 129, 1, MASK_ADD_F32_T, LAY_CONTIG, LAY_MISALIGNED},
      {1, 4, 1, 129, 1, 0, MASK_BOOL_ROWS, LAY_BLHD, LAY_CONTIG},
      {1, 16, 2, 200, 300, 2, MASK_NONE, LAY_CONTIG, LAY_CONTIG},
  };
  const int nsc = sizeof sc / sizeof sc[0];
  int counter = 0;
  for (oss_dtype dt : dts) {
    if (g_only && !strstr(g_only, dname(dt))) continue;
    std::vector<int> hds = dims;
    hds.insert(hds.end(), extra.begin(), extra.end());
    for (size_t hi = 0; hi < hds.size(); hi++) {
      const int D = hds[hi];
      const int nrun = quick ? 1 : (dt == OSS_FLOAT64 ? 3 : nsc);
      for (int r = 0; r < nrun; r++) {
        const Sc &s = sc[(counter++) % nsc];
        Case c = {dt, s.B, s.Hq, s.Hkv, s.Lq, s.Lk, D, D, s.causal, s.mask, s.lin, s.lout};
        if (quick) c.B = 1, c.Lq = std::min(c.Lq, 65), c.Lk = std::min(c.Lk, 70);
        run_case(c, false);
      }
    }
    /* Dv != D both ways, GQA 8 */
    Case c1 = {dt, 1, 8, 1, 129, 127, 64, 40, 1, MASK_NONE, LAY_CONTIG, LAY_PADDED};
    Case c2 = {dt, 2, 4, 2, 65, 130, 24, 96, 2, MASK_BOOL_BCAST, LAY_BLHD, LAY_CONTIG};
    run_case(c1, true);
    run_case(c2, true);
    /* empty lengths */
    Case e1 = {dt, 2, 2, 1, 17, 0, 64, 64, 0, MASK_NONE, LAY_CONTIG, LAY_CONTIG};
    Case e2 = {dt, 2, 2, 1, 0, 17, 64, 64, 1, MASK_NONE, LAY_CONTIG, LAY_CONTIG};
    run_case(e1, true);
    run_case(e2, true);
  }
  if (!quick && !g_only) {
    /* 64-bit offsets: a head stride above 2^31 elements */
    Case h = {OSS_FLOAT16, 1, 2, 2, 70, 70, 64, 64, 1, MASK_NONE, LAY_HUGE, LAY_HUGE};
    run_case(h, true);
    h.dt = OSS_BFLOAT16;
    h.lay_in = LAY_CONTIG;
    run_case(h, true);
  }
}

// ---------------------------------------------------------------------------
// timing
// ---------------------------------------------------------------------------
__global__ void fill_random_kernel(unsigned short *p, size_t n, uint64_t seed, int bf16) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    /* sum of 4 uniforms, roughly normal */
    float s = 0.f;
    for (int k = 0; k < 4; k++) s += (float)((x >> (16 * k)) & 0xFFFF) * (1.f / 65536.f);
    const float v = (s - 2.f) * 1.7f;
    p[i] = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v)) : __half_as_ushort(__float2half_rn(v));
  }
}

static float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct BenchBufs {
  void *q, *k, *v, *o, *dO, *dq, *dk, *dv, *lse, *ws;
  size_t ws_size;
};

static void bench_params(oss_dtype dt, int B, int H, int L, int D, bool causal, BenchBufs &b,
                         oss_attention_backward_params &bp) {
  memset(&bp, 0, sizeof bp);
  oss_attention_params &p = bp.fwd;
  p.dtype = dt;
  p.batch = B, p.heads_q = H, p.heads_kv = H, p.len_q = L, p.len_k = L, p.head_dim = D, p.head_dim_v = D;
  const int64_t s[3] = {(int64_t)H * L * D, (int64_t)L * D, D};
  p.q = b.q, p.k = b.k, p.v = b.v, p.out = b.o, p.lse = b.lse;
  for (int i = 0; i < 3; i++) p.q_stride[i] = p.k_stride[i] = p.v_stride[i] = p.out_stride[i] = s[i];
  p.scale = 1.0 / sqrt((double)D);
  p.causal = causal ? OSS_CAUSAL_TOP_LEFT : OSS_CAUSAL_NONE;
  bp.dout = b.dO, bp.dq = b.dq, bp.dk = b.dk, bp.dv = b.dv;
  for (int i = 0; i < 3; i++) bp.dout_stride[i] = bp.dq_stride[i] = bp.dk_stride[i] = bp.dv_stride[i] = s[i];
}

/* Median time in ms of fn over reps after warm-up. */
template <typename F> static float time_ms(F fn, int reps) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < 2; i++) fn();
  std::vector<float> t;
  for (int i = 0; i < reps; i++) {
    CK(cudaEventRecord(e0));
    fn();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return median(t);
}

#ifdef OSS_SELFTEST_TUNE
typedef __nv_bfloat16 bf;
struct TuneVariant {
  const char *name;
  int fwd; /* 1 forward, 0 backward */
  int hd;
  oss_attn_launch_fn fn;
};
static oss_status tf64a(const oss_attn_args *a, cudaStream_t s, const oss_device_info *d) { return oss_attn_fwd_mma_run<bf, 64, 128, 64, 4, 1>(a, s, d); }
static oss_status tf128a(const oss_attn_args *a, cudaStream_t s, const oss_device_info *d) { return oss_attn_fwd_mma_run<bf, 128, 128, 32, 4, 1>(a, s, d); }
static oss_status tb64a(const oss_attn_args *a, cudaStream_t s, const oss_device_info *d) { return oss_attn_bwd_mma_run<bf, 64, 64, 4, 1, 1, 64, 64, 4>(a, s, d); }
static oss_status tb128a(const oss_attn_args *a, cudaStream_t s, const oss_device_info *d) { return oss_attn_bwd_mma_run<bf, 128, 32, 8, 1, 1, 64, 64, 4>(a, s, d); }
static const TuneVariant g_tune[] = {
    {"fwd Br128 Bc64 4w", 1, 64, tf64a},
    {"fwd Br128 Bc32 4w", 1, 128, tf128a},
    {"bwd Br64 Bc64 4w", 0, 64, tb64a},
    {"bwd Br32 Bc128 8w", 0, 128, tb128a},
};
#endif

static void run_bench(bool tune) {
  const size_t max_elems = (size_t)16384 * 2048; /* tokens x width */
  BenchBufs b;
  void **bufs[] = {&b.q, &b.k, &b.v, &b.o, &b.dO, &b.dq, &b.dk, &b.dv};
  for (void **x : bufs) CK(cudaMalloc(x, max_elems * 2));
  CK(cudaMalloc(&b.lse, (size_t)16384 * 32 * 4));
  b.ws_size = 0;
  b.ws = nullptr;
  printf("\n%-5s %-4s %-6s %-6s %9s %9s %9s %9s\n", "dtype", "hd", "causal", "seqlen", "fwd", "bwd", "fwd+bwd",
         "fwd+bwd");
  printf("%-5s %-4s %-6s %-6s %9s %9s %9s %9s\n", "", "", "", "", "TFLOP/s", "TFLOP/s", "TFLOP/s", "det TF/s");
  const oss_dtype dts[2] = {OSS_BFLOAT16, OSS_FLOAT16};
  const int hds[3] = {64, 128, 256};
  const int lens[6] = {512, 1024, 2048, 4096, 8192, 16384};
  for (oss_dtype dt : dts) {
    for (void **x : bufs) fill_random_kernel<<<1024, 256>>>((unsigned short *)*x, max_elems, (uint64_t)(uintptr_t)x, dt == OSS_BFLOAT16);
    CK(cudaDeviceSynchronize());
    for (int hd : hds) {
      bool have = false;
      for (int d : compiled_head_dims()) have |= d == hd;
      if (!have) continue;
      for (int causal = 0; causal < 2; causal++)
        for (int L : lens) {
          if (hd == 256 && (L == 512 || L == 16384)) continue;
          const int H = 2048 / hd, B = 16384 / L;
          oss_attention_backward_params bp;
          bench_params(dt, B, H, L, hd, causal, b, bp);
          size_t need = std::max(oss_attention_backward_workspace_size_cuda(&bp),
                                 oss_attention_forward_workspace_size_cuda(&bp.fwd));
          bp.deterministic = 1;
          need = std::max(need, oss_attention_backward_workspace_size_cuda(&bp));
          bp.deterministic = 0;
          if (need > b.ws_size) {
            if (b.ws) CK(cudaFree(b.ws));
            CK(cudaMalloc(&b.ws, need));
            b.ws_size = need;
          }
          const double fl = 4.0 * B * H * (double)L * L * hd / (causal ? 2 : 1);
          const int reps = L >= 8192 ? 5 : 10;
          const float tf = time_ms([&]() { OK(oss_attention_forward_cuda(&bp.fwd, b.ws, nullptr)); }, reps);
          const float tb = time_ms([&]() { OK(oss_attention_backward_cuda(&bp, b.ws, nullptr)); }, reps);
          bp.deterministic = 1;
          const float tbd = time_ms([&]() { OK(oss_attention_backward_cuda(&bp, b.ws, nullptr)); }, reps);
          bp.deterministic = 0;
          printf("%-5s %-4d %-6s %-6d %9.1f %9.1f %9.1f %9.1f\n", dname(dt), hd, causal ? "yes" : "no", L,
                 fl / tf * 1e-9, 2.5 * fl / tb * 1e-9, 3.5 * fl / (tf + tb) * 1e-9, 3.5 * fl / (tf + tbd) * 1e-9);
          fflush(stdout);
#ifdef OSS_SELFTEST_TUNE
          if (tune && dt == OSS_BFLOAT16 && (L == 2048 || L == 8192)) {
            for (const TuneVariant &tv : g_tune) {
              if (tv.hd != hd) continue;
              float t;
              if (tv.fwd)
                t = time_ms([&]() { OK(oss_attn_forward_with(&bp.fwd, nullptr, nullptr, tv.fn)); }, reps);
              else
                t = time_ms([&]() { OK(oss_attn_backward_with(&bp, b.ws, nullptr, tv.fn)); }, reps);
              printf("      variant %-22s %s %9.1f TFLOP/s\n", tv.name, tv.fwd ? "fwd" : "bwd",
                     (tv.fwd ? fl : 2.5 * fl) / t * 1e-9);
            }
            fflush(stdout);
          }
#else
          (void)tune;
#endif
        }
    }
  }
  CK(cudaGetLastError());
  for (void **x : bufs) CK(cudaFree(*x));
  CK(cudaFree(b.lse));
  if (b.ws) CK(cudaFree(b.ws));
}

int main(int argc, char **argv) {
  bool quick = false, test = true, bench = true, tune = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) quick = true, bench = false;
    else if (!strcmp(argv[i], "--no-test")) test = false;
    else if (!strcmp(argv[i], "--no-bench")) bench = false;
    else if (!strcmp(argv[i], "--tune")) tune = true;
    else if (!strcmp(argv[i], "--only") && i + 1 < argc) g_only = argv[++i];
    else if (!strcmp(argv[i], "--seed") && i + 1 < argc) g_rng ^= strtoull(argv[++i], nullptr, 10) * 0x2545F4914F6CDD1Dull;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s (sm_%d%d, %d SMs); %s\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount,
         oss_build_config());
  if (test) {
    run_tests(quick);
    printf("\nworst err / bound per dtype (out, lse, dq, dk, dv; a case fails above 1):\n");
    const oss_dtype dts[4] = {OSS_FLOAT16, OSS_BFLOAT16, OSS_FLOAT32, OSS_FLOAT64};
    for (int i = 0; i < 4; i++)
      printf("  %s: %.3f %.3f %.3f %.3f %.3f\n", dname(dts[i]), g_worst[i][0], g_worst[i][1], g_worst[i][2],
             g_worst[i][3], g_worst[i][4]);
    printf("selftest: %d passed, %d failed\n", g_pass, g_fail);
  }
  if (bench) run_bench(tune);
  CK(cudaDeviceSynchronize());
  return g_fail ? 1 : 0;
}
