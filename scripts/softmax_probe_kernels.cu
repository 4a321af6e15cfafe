/*
 * softmax_probe_kernels.cu - minimal bfloat16 softmax kernels, for one
 * question only (bench/NOTES-softmax.md v18): what separates the library's
 * narrow-row kernels from Inductor's? Not part of the library. Rows are
 * aligned and n is fixed (backward 4096 columns, forward 1024): no edges, no
 * dtype casts, no checks. scripts/softmax_probe.py times them against
 * torch_oss and torch.compile in one process.
 *
 * Build: nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xcompiler -fPIC -shared
 *        scripts/softmax_probe_kernels.cu -o build/libsoftmax_probe.so
 *
 * Variants (probe_launch's `which`): backward, a CTA per row: 0 256 threads x
 * 2 slots, 1 512 x 1, 2 128 x 4, 3 two passes like Inductor's (L2 evict_last
 * then evict_first), 4 = 1 with streaming stores, 5/6/8 = 1 with loads
 * evict_first / evict_last / ld.global.nc, 7 = 5 with streaming stores,
 * 9 = 1 with stores evict_first, 15 = 1 with loads evict_last and the lines
 * set back to evict_normal after the stores; forward, a warp per row: 10 / 12
 * / 11 one / two / four warps per CTA, 13 / 14 = 11 with loads evict_first /
 * evict_last, 16 = 11 with stores evict_first, 17 = 14 with the lines set back
 * to evict_normal; persistent CTAs fed by bulk copies (cp.async.bulk, TMA) with
 * several rows in flight per CTA (bench/NOTES-softmax.md v24, rejected):
 * backward 20 / 21 / 22 = 256 threads x 2 slots per row with 4 / 2 / 6 row
 * buffers and 3 / 4 / 2 CTAs per SM, 23 = 512 x 1 with 4 buffers; forward 30 /
 * 31 / 32 = 8 warps per tile of 8 rows with 4 / 2 / 6 buffers, 33 = 4 warps
 * with 4 buffers. Backward rows of 32768 columns (bench/NOTES-softmax.md v27,
 * scripts/softmax_probe.py --bwd-cols 32768): 40 / 41 / 42 one pass, a
 * 1024-thread CTA holding the row in registers (4 slots per thread), loads
 * plain / evict_last / evict_first; two passes like Inductor's (pass 1
 * evict_last, pass 2 evict_first): 43 1024 threads x 2 slots x 2 pieces
 * (Inductor's shape), 44 1024 x 1 x 4, 45 1024 x 4 x 1, 46 512 x 2 x 4.
 * Forward, a CTA per row shaped like Triton's fused softmax (v28,
 * scripts/softmax_probe.py --fwd-cols): 1024 columns 50-53, 4096 columns
 * 54-59 (probe_launch lists the shapes). Forward at 128 columns, the
 * library's warp-tier layout against Inductor's (v34, --fwd-cols 128):
 * 60-69 (fwd_narrow; probe_launch lists the shapes).
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

__device__ __forceinline__ float lo(unsigned u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float hi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ unsigned pack(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *(unsigned *)&h;
}
__device__ __forceinline__ float ex2(float v) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}
/* A 16-byte load with an L2 cache policy; NC: through the non-coherent path. */
template <bool NC = false> __device__ __forceinline__ uint4 ld_pol(const uint4 *p, uint64_t pol) {
  uint4 v;
  if (NC)
    asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(pol));
  else
    asm volatile("ld.global.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(pol));
  return v;
}
/* L2 policies: every line evict_last (LAST) or evict_first. */
template <bool LAST> __device__ __forceinline__ uint64_t policy() {
  uint64_t p;
  if (LAST) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  else asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint64_t pol_last() { return policy<true>(); }
__device__ __forceinline__ uint64_t pol_first() { return policy<false>(); }
__device__ __forceinline__ void st_pol(uint4 *p, uint4 v, uint64_t pol) {
  asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1,%2,%3,%4}, %5;" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w), "l"(pol) : "memory");
}
__device__ __forceinline__ void demote(const void *p) {
  asm volatile("applypriority.global.L2::evict_normal [%0], 128;" ::"l"(p) : "memory");
}

template <int T> __device__ __forceinline__ float block_sum(float v, float *red) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(~0u, v, o);
  if (T == 32) return v;
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  if (l == 0) red[w] = v;
  __syncthreads();
  float s = l < T / 32 ? red[l] : 0.f;
#pragma unroll
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
  return s;
}

__device__ __forceinline__ float dot8(uint4 a, uint4 b) {
  return lo(a.x) * lo(b.x) + hi(a.x) * hi(b.x) + lo(a.y) * lo(b.y) + hi(a.y) * hi(b.y) + lo(a.z) * lo(b.z) +
         hi(a.z) * hi(b.z) + lo(a.w) * lo(b.w) + hi(a.w) * hi(b.w);
}
__device__ __forceinline__ uint4 grad8(uint4 a, uint4 b, float s) {
  uint4 o;
  o.x = pack(lo(a.x) * (lo(b.x) - s), hi(a.x) * (hi(b.x) - s));
  o.y = pack(lo(a.y) * (lo(b.y) - s), hi(a.y) * (hi(b.y) - s));
  o.z = pack(lo(a.z) * (lo(b.z) - s), hi(a.z) * (hi(b.z) - s));
  o.w = pack(lo(a.w) * (lo(b.w) - s), hi(a.w) * (hi(b.w) - s));
  return o;
}

/* backward, one pass: a CTA per row, thread t holds slots t + k*T (k < K) of y and dy */
template <int T, int K, int MINB, bool CS>
__global__ void __launch_bounds__(T, MINB) bwd_onepass(const uint4 *y, const uint4 *dy, uint4 *dx) {
  __shared__ float red[32];
  const int64_t base = (int64_t)blockIdx.x * (T * K) + threadIdx.x;
  uint4 a[K], b[K];
#pragma unroll
  for (int k = 0; k < K; k++) {
    a[k] = y[base + k * T];
    b[k] = dy[base + k * T];
  }
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < K; k++) s += dot8(a[k], b[k]);
  s = block_sum<T>(s, red);
#pragma unroll
  for (int k = 0; k < K; k++) {
    if (CS) __stcs(&dx[base + k * T], grad8(a[k], b[k], s));
    else dx[base + k * T] = grad8(a[k], b[k], s);
  }
}

/* backward, one pass, a CTA per row of T slots, loads with an L2 policy
 * (POL 1: evict_first, 2: evict_last, 3: evict_normal via ld.global.nc) */
template <int T, int MINB, int POL, bool CS>
__global__ void __launch_bounds__(T, MINB) bwd_onepass_pol(const uint4 *y, const uint4 *dy, uint4 *dx) {
  __shared__ float red[32];
  const int64_t base = (int64_t)blockIdx.x * T + threadIdx.x;
  uint4 a, b;
  if (POL == 3) {
    a = __ldg(y + base);
    b = __ldg(dy + base);
  } else {
    const uint64_t p = POL == 1 ? pol_first() : pol_last();
    a = ld_pol(y + base, p);
    b = ld_pol(dy + base, p);
  }
  float s = block_sum<T>(dot8(a, b), red);
  if (CS) __stcs(&dx[base], grad8(a, b, s));
  else dx[base] = grad8(a, b, s);
}

/* backward, one pass: MODE 0 stores with L2 evict_first; 1 loads evict_last
 * (nc) and the loaded lines set back to evict_normal after the stores */
template <int T, int MINB, int MODE>
__global__ void __launch_bounds__(T, MINB) bwd_onepass_x(const uint4 *y, const uint4 *dy, uint4 *dx) {
  __shared__ float red[32];
  const int64_t base = (int64_t)blockIdx.x * T + threadIdx.x;
  uint4 a, b;
  if (MODE == 0) {
    a = y[base];
    b = dy[base];
  } else {
    const uint64_t p = pol_last();
    a = ld_pol<true>(y + base, p);
    b = ld_pol<true>(dy + base, p);
  }
  float s = block_sum<T>(dot8(a, b), red);
  if (MODE == 0) st_pol(&dx[base], grad8(a, b, s), pol_first());
  else {
    dx[base] = grad8(a, b, s);
    if ((threadIdx.x & 7) == 0) {
      demote(y + base);
      demote(dy + base);
    }
  }
}

/* backward, two passes like Inductor's: pass 1 loads y, dy (L2 evict_last) and
 * sums; pass 2 reloads them (evict_first) and writes dx */
template <int T, int ITER, int MINB>
__global__ void __launch_bounds__(T, MINB) bwd_twopass(const uint4 *y, const uint4 *dy, uint4 *dx) {
  __shared__ float red[32];
  const int64_t base = (int64_t)blockIdx.x * (T * ITER) + threadIdx.x;
  const uint64_t pl = pol_last(), pf = pol_first();
  float s = 0.f;
  for (int i = 0; i < ITER; i++) s += dot8(ld_pol(y + base + i * T, pl), ld_pol(dy + base + i * T, pl));
  s = block_sum<T>(s, red);
  for (int i = 0; i < ITER; i++)
    dx[base + i * T] = grad8(ld_pol(y + base + i * T, pf), ld_pol(dy + base + i * T, pf), s);
}

/* backward, rows of T * K * ITER slots (v27: 32768 columns), a CTA per row.
 * bwd_rows_onepass holds the row, K slots per thread, loads with
 * POL (0 plain, 1 evict_first, 2 evict_last); bwd_rows_twopass reads it in
 * ITER pieces of K slots per thread, pass 1 (evict_last) sums, pass 2
 * reloads each piece (evict_first, mostly L2 hits) and writes dx, as
 * Inductor's looped reduction does. */
template <int POL> __device__ __forceinline__ uint4 ld_k(const uint4 *p) {
  if (POL == 0) return *p;
  return ld_pol(p, POL == 1 ? pol_first() : pol_last());
}
template <int T, int K, int POL>
__global__ void __launch_bounds__(T, 1) bwd_rows_onepass(const uint4 *y, const uint4 *dy, uint4 *dx) {
  __shared__ float red[32];
  const int64_t row = (int64_t)blockIdx.x * (T * K);
  const unsigned t = threadIdx.x;
  uint4 a[K], b[K];
#pragma unroll
  for (int k = 0; k < K; k++) {
    a[k] = ld_k<POL>(y + row + (t + k * T));
    b[k] = ld_k<POL>(dy + row + (t + k * T));
  }
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < K; k++) s += dot8(a[k], b[k]);
  s = block_sum<T>(s, red);
  uint4 *out = dx + row;
#pragma unroll
  for (int k = 0; k < K; k++) out[t + k * T] = grad8(a[k], b[k], s);
}
/* piece i of a row for bwd_rows_twopass: K slots per thread of y and dy, loads with POL */
template <int T, int K, int POL>
__device__ __forceinline__ void ld_piece(const uint4 *y, const uint4 *dy, int64_t base, int i, uint4 (&a)[K],
                                         uint4 (&b)[K]) {
#pragma unroll
  for (int k = 0; k < K; k++) {
    a[k] = ld_k<POL>(y + base + (i * K + k) * T);
    b[k] = ld_k<POL>(dy + base + (i * K + k) * T);
  }
}
template <int T, int K, int ITER>
__global__ void __launch_bounds__(T, 1) bwd_rows_twopass(const uint4 *y, const uint4 *dy, uint4 *dx) {
  __shared__ float red[32];
  const int64_t base = (int64_t)blockIdx.x * (T * K * ITER) + threadIdx.x;
  float s = 0.f;
#pragma unroll 1
  for (int i = 0; i < ITER; i++) {
    uint4 a[K], b[K];
    ld_piece<T, K, 2>(y, dy, base, i, a, b);
#pragma unroll
    for (int k = 0; k < K; k++) s += dot8(a[k], b[k]);
  }
  s = block_sum<T>(s, red);
#pragma unroll 1
  for (int i = 0; i < ITER; i++) {
    uint4 a[K], b[K];
    ld_piece<T, K, 1>(y, dy, base, i, a, b);
#pragma unroll
    for (int k = 0; k < K; k++) dx[base + (i * K + k) * T] = grad8(a[k], b[k], s);
  }
}

/* A row's softmax over a thread's K bfloat16 slots v[k] into out[k]: the
 * thread's max, max_all (the row's: shuffles or a block reduction), the sum
 * of exp2, sum_all, the outputs. */
template <int K, typename MaxAll, typename SumAll>
__device__ __forceinline__ void row_softmax(const uint4 (&v)[K], uint4 (&out)[K], MaxAll max_all, SumAll sum_all) {
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < K; k++) {
    m = fmaxf(m, fmaxf(fmaxf(lo(v[k].x), hi(v[k].x)), fmaxf(lo(v[k].y), hi(v[k].y))));
    m = fmaxf(m, fmaxf(fmaxf(lo(v[k].z), hi(v[k].z)), fmaxf(lo(v[k].w), hi(v[k].w))));
  }
  m = max_all(m);
  const float L2E = 1.4426950408889634f, c = -m * L2E;
  float d = 0.f;
#pragma unroll
  for (int k = 0; k < K; k++) {
    d += ex2(fmaf(lo(v[k].x), L2E, c)) + ex2(fmaf(hi(v[k].x), L2E, c)) + ex2(fmaf(lo(v[k].y), L2E, c)) +
         ex2(fmaf(hi(v[k].y), L2E, c));
    d += ex2(fmaf(lo(v[k].z), L2E, c)) + ex2(fmaf(hi(v[k].z), L2E, c)) + ex2(fmaf(lo(v[k].w), L2E, c)) +
         ex2(fmaf(hi(v[k].w), L2E, c));
  }
  d = sum_all(d);
  const float c2 = c - __log2f(d);
#pragma unroll
  for (int k = 0; k < K; k++) {
    uint4 o;
    o.x = pack(ex2(fmaf(lo(v[k].x), L2E, c2)), ex2(fmaf(hi(v[k].x), L2E, c2)));
    o.y = pack(ex2(fmaf(lo(v[k].y), L2E, c2)), ex2(fmaf(hi(v[k].y), L2E, c2)));
    o.z = pack(ex2(fmaf(lo(v[k].z), L2E, c2)), ex2(fmaf(hi(v[k].z), L2E, c2)));
    o.w = pack(ex2(fmaf(lo(v[k].w), L2E, c2)), ex2(fmaf(hi(v[k].w), L2E, c2)));
    out[k] = o;
  }
}

/* A warp's row of 32 * K slots (lane holds v[k] = slot lane + 32k): butterfly shuffles */
template <int K> __device__ __forceinline__ void warp_row_softmax(const uint4 (&v)[K], uint4 (&out)[K]) {
  row_softmax<K>(
      v, out,
      [](float m) {
#pragma unroll
        for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(~0u, m, o));
        return m;
      },
      [](float d) {
#pragma unroll
        for (int o = 16; o; o >>= 1) d += __shfl_xor_sync(~0u, d, o);
        return d;
      });
}

/* forward, a warp per row of 32 * K slots, W warps per CTA */
template <int W, int K, int MINB, int POL = 0>
__global__ void __launch_bounds__(W * 32, MINB) fwd_warp_row(const uint4 *x, uint4 *y, int64_t rows) {
  const int64_t row = (int64_t)blockIdx.x * W + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const uint4 *xr = x + row * (32 * K) + lane;
  uint4 *yr = y + row * (32 * K) + lane;
  uint4 v[K];
  if (POL == 0) {
#pragma unroll
    for (int k = 0; k < K; k++) v[k] = xr[32 * k];
  } else if (POL == 3) {
#pragma unroll
    for (int k = 0; k < K; k++) v[k] = xr[32 * k];
  } else {
    const uint64_t p = POL == 1 ? pol_first() : pol_last();
#pragma unroll
    for (int k = 0; k < K; k++) v[k] = POL == 4 ? ld_pol<true>(xr + 32 * k, p) : ld_pol(xr + 32 * k, p);
  }
  uint4 out[K];
  warp_row_softmax<K>(v, out);
#pragma unroll
  for (int k = 0; k < K; k++) {
    const uint4 o = out[k];
    if (POL == 3) st_pol(yr + 32 * k, o, pol_first());
    else yr[32 * k] = o;
  }
  if (POL == 4 && (lane & 7) == 0) {
#pragma unroll
    for (int k = 0; k < K; k++) demote(xr + 32 * k);
  }
}

/* forward, a CTA per row of T * S slots, shaped like Triton's fused softmax
 * (bench/softmax.py's peer: one program per row, 1-2 slots per thread, small
 * register footprint, so up to 16 CTAs per SM): thread t holds slots t + s*T.
 * POL 0 plain loads; 2 loads evict_last and the lines set back to
 * evict_normal after the stores (the library's keep policy). Two block
 * reductions (max, then the sum of exp2), each through its own shared array. */
template <int T> __device__ __forceinline__ float block_max(float v, float *red) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(~0u, v, o));
  if (T == 32) return v;
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  if (l == 0) red[w] = v;
  __syncthreads();
  float m = l < T / 32 ? red[l] : -INFINITY;
#pragma unroll
  for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(~0u, m, o));
  return m;
}
template <int T, int S, int POL>
__global__ void __launch_bounds__(T) fwd_cta_row(const uint4 *x, uint4 *y) {
  __shared__ float red_m[32], red_d[32];
  const int64_t base = (int64_t)blockIdx.x * (T * S) + threadIdx.x;
  uint4 v[S], out[S];
#pragma unroll
  for (int s = 0; s < S; s++) v[s] = POL == 2 ? ld_pol(x + base + s * T, pol_last()) : x[base + s * T];
  row_softmax<S>(
      v, out, [&](float m) { return block_max<T>(m, red_m); }, [&](float d) { return block_sum<T>(d, red_d); });
#pragma unroll
  for (int s = 0; s < S; s++) y[base + s * T] = out[s];
  if (POL == 2 && (threadIdx.x & 7) == 0) {
#pragma unroll
    for (int s = 0; s < S; s++) demote(x + base + s * T);
  }
}

// ---- persistent CTAs fed by bulk copies (TMA), several rows in flight ---------

__device__ __forceinline__ unsigned smem_addr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
/* thread 0 initialises the N barriers (one arrival each: its expect_tx); then all wait */
template <int N> __device__ __forceinline__ void mbar_init_all(uint64_t *bar) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < N; s++) mbar_init(&bar[s], 1);
    mbar_fence_init();
  }
  __syncthreads();
}
/* bytes (a multiple of 16) from global src to shared dst, completing on bar */
__device__ __forceinline__ void bulk_load(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

/* backward, a CTA of T threads per row of T * K slots, persistent (rows
 * blockIdx.x, + gridDim.x, ...): thread 0 keeps the next NBUF rows' y and dy
 * on their way into shared memory (bulk copies); each thread copies its K
 * slots to registers, the block sums, and thread 0 refills the buffer with
 * the row NBUF ahead before the outputs are written. */
template <int T, int K, int NBUF, int MINB>
__global__ void __launch_bounds__(T, MINB) bwd_tma(const uint4 *y, const uint4 *dy, uint4 *dx, long long rows) {
  extern __shared__ uint4 buf[]; /* [NBUF][2][T * K] */
  __shared__ uint64_t bar[NBUF];
  __shared__ float red[2][32];
  constexpr int S = T * K;
  constexpr unsigned BYTES = S * 16;
  const int t = threadIdx.x;
  mbar_init_all<NBUF>(bar);
  if (t == 0)
    for (int s = 0; s < NBUF; s++) {
      const long long r = blockIdx.x + (long long)s * gridDim.x;
      if (r >= rows) break;
      mbar_expect_tx(&bar[s], 2 * BYTES);
      bulk_load(buf + (2 * s) * S, y + r * S, BYTES, &bar[s]);
      bulk_load(buf + (2 * s + 1) * S, dy + r * S, BYTES, &bar[s]);
    }
  int i = 0;
  for (long long r = blockIdx.x; r < rows; r += gridDim.x, i++) {
    const int s = i % NBUF;
    mbar_wait(&bar[s], (unsigned)(i / NBUF) & 1);
    uint4 a[K], b[K];
#pragma unroll
    for (int k = 0; k < K; k++) {
      a[k] = buf[(2 * s) * S + t + k * T];
      b[k] = buf[(2 * s + 1) * S + t + k * T];
    }
    float v = 0.f;
#pragma unroll
    for (int k = 0; k < K; k++) v += dot8(a[k], b[k]);
    /* block sum; its barrier also frees buffer s */
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(~0u, v, o);
    if ((t & 31) == 0) red[i & 1][t >> 5] = v;
    __syncthreads();
    if (t == 0) {
      const long long rn = r + (long long)NBUF * gridDim.x;
      if (rn < rows) {
        mbar_expect_tx(&bar[s], 2 * BYTES);
        bulk_load(buf + (2 * s) * S, y + rn * S, BYTES, &bar[s]);
        bulk_load(buf + (2 * s + 1) * S, dy + rn * S, BYTES, &bar[s]);
      }
    }
    float sum = (t & 31) < T / 32 ? red[i & 1][t & 31] : 0.f;
#pragma unroll
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(~0u, sum, o);
#pragma unroll
    for (int k = 0; k < K; k++) dx[r * S + t + k * T] = grad8(a[k], b[k], sum);
  }
}

/* forward, a warp per row of 32 * K slots, W warps per CTA and W rows per
 * tile, persistent (tiles blockIdx.x, + gridDim.x, ...), NBUF tiles in flight
 * as in bwd_tma; a barrier after the copies to registers frees the buffer */
template <int W, int K, int NBUF, int MINB>
__global__ void __launch_bounds__(W * 32, MINB) fwd_tma(const uint4 *x, uint4 *y, long long rows) {
  extern __shared__ uint4 buf[]; /* [NBUF][W * 32 * K] */
  __shared__ uint64_t bar[NBUF];
  constexpr int S = W * 32 * K; /* slots per tile */
  const int t = threadIdx.x, lane = t & 31, w = t >> 5;
  const long long tiles = rows / W; /* rows a multiple of W (the probe's shapes) */
  mbar_init_all<NBUF>(bar);
  if (t == 0)
    for (int s = 0; s < NBUF; s++) {
      const long long tl = blockIdx.x + (long long)s * gridDim.x;
      if (tl >= tiles) break;
      mbar_expect_tx(&bar[s], S * 16);
      bulk_load(buf + s * S, x + tl * S, S * 16, &bar[s]);
    }
  int i = 0;
  for (long long tl = blockIdx.x; tl < tiles; tl += gridDim.x, i++) {
    const int s = i % NBUF;
    mbar_wait(&bar[s], (unsigned)(i / NBUF) & 1);
    uint4 v[K];
#pragma unroll
    for (int k = 0; k < K; k++) v[k] = buf[s * S + w * 32 * K + lane + 32 * k];
    __syncthreads();
    if (t == 0) {
      const long long tn = tl + (long long)NBUF * gridDim.x;
      if (tn < tiles) {
        mbar_expect_tx(&bar[s], S * 16);
        bulk_load(buf + s * S, x + tn * S, S * 16, &bar[s]);
      }
    }
    uint4 out[K];
    warp_row_softmax<K>(v, out);
    uint4 *yr = y + tl * S + w * 32 * K + lane;
#pragma unroll
    for (int k = 0; k < K; k++) {
      const uint4 o = out[k];
      yr[32 * k] = o;
    }
  }
}

/* forward, rows of 16 slots (128 bfloat16 columns): G lanes per row, KS =
 * 16 / G slots of a row per lane, R rows per lane, so a warp covers
 * RPW = R * 32 / G rows. Lane (sub = lane / G, g = lane % G) holds, for r <
 * R, slots g + G * s (s < KS) of the warp's row r * (32 / G) + sub. R = 1 is
 * the library's warp-tier layout (each load instruction of a warp touches 64
 * bytes of each of 8 rows, at G = 4); KS = 1 makes each load instruction
 * cover 32 / G whole rows, 512 contiguous bytes (Inductor's layout: 16 lanes
 * per row). POL 0 plain loads; 2 loads evict_last and the lines set back to
 * evict_normal after the row's stores (the library's keep policy). The
 * kernel is compiled for PER_SM CTAs per SM and the launch pads shared
 * memory to hold it there (fwd_narrow_launch), as the library's launch
 * bounds and residency do. */
template <int T, int G, int R, int POL, int PER_SM>
__global__ void __launch_bounds__(T, PER_SM) fwd_narrow(const uint4 *x, uint4 *y) {
  constexpr int KS = 16 / G, RPW = R * (32 / G);
  const int lane = threadIdx.x & 31, g = lane % G, sub = lane / G;
  const int64_t row0 = ((int64_t)blockIdx.x * (T / 32) + threadIdx.x / 32) * RPW + sub;
  const uint64_t p = POL == 2 ? pol_last() : 0;
  uint4 v[R][KS];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int s = 0; s < KS; s++) {
      const uint4 *src = x + (row0 + r * (32 / G)) * 16 + g + G * s;
      v[r][s] = POL == 2 ? ld_pol(src, p) : *src;
    }
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int64_t row = row0 + r * (32 / G);
    uint4 out[KS];
    row_softmax<KS>(
        v[r], out,
        [](float m) {
#pragma unroll
          for (int o = G / 2; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(~0u, m, o));
          return m;
        },
        [](float d) {
#pragma unroll
          for (int o = G / 2; o; o >>= 1) d += __shfl_xor_sync(~0u, d, o);
          return d;
        });
#pragma unroll
    for (int s = 0; s < KS; s++) y[row * 16 + g + G * s] = out[s];
    if (POL == 2)
#pragma unroll
      for (int s = 0; s < KS; s++)
        if ((g + G * s) % 8 == 0) demote(x + row * 16 + g + G * s);
  }
}

/* Launches fwd_narrow with PER_SM CTAs per SM at most (the smallest
 * dynamic shared-memory pad that brings the occupancy calculator's figure
 * down to it); rows must fill whole CTAs. Returns -2 where they do not and
 * -3 where the kernel cannot reach PER_SM at all. */
template <int T, int G, int R, int POL, int PER_SM>
static int fwd_narrow_launch(const uint4 *x, uint4 *y, long long rows, cudaStream_t st) {
  constexpr long long rows_per_cta = (long long)T / 32 * R * (32 / G);
  if (rows % rows_per_cta) return -2;
  static int pad = -1;
  if (pad < 0) {
    cudaFuncSetAttribute(fwd_narrow<T, G, R, POL, PER_SM>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
    for (int bytes = 0; bytes <= 200 * 1024; bytes += 256) {
      int n = 0;
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fwd_narrow<T, G, R, POL, PER_SM>, T, bytes);
      if (n <= PER_SM) {
        if (n < PER_SM) return -3;
        pad = bytes;
        break;
      }
    }
    if (pad < 0) return -3;
  }
  fwd_narrow<T, G, R, POL, PER_SM><<<(unsigned)(rows / rows_per_cta), T, pad, st>>>(x, y);
  return 0;
}

static int sm_count() {
  static int n = 0;
  if (!n) {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
  }
  return n;
}

/* persistent launch: grid = min(work items, SMs x CTAs per SM) */
template <typename Kern, typename... Args>
static void launch_persistent(Kern kern, int threads, size_t smem, int per_sm, long long items, cudaStream_t st,
                              Args... args) {
  cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  long long grid = (long long)sm_count() * per_sm;
  if (items < grid) grid = items;
  kern<<<(unsigned)grid, threads, smem, st>>>(args...);
}

/* Launches variant `which` (see the top) on `stream`; returns the launch's
 * cudaError_t, or -1 for an unknown variant. */
extern "C" int probe_launch(int which, const void *a, const void *b, void *out, long long rows, void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  const uint4 *A = (const uint4 *)a, *B = (const uint4 *)b;
  uint4 *O = (uint4 *)out;
  switch (which) {
    case 0: bwd_onepass<256, 2, 4, false><<<rows, 256, 0, st>>>(A, B, O); break;
    case 1: bwd_onepass<512, 1, 4, false><<<rows, 512, 0, st>>>(A, B, O); break;
    case 2: bwd_onepass<128, 4, 8, false><<<rows, 128, 0, st>>>(A, B, O); break;
    case 3: bwd_twopass<512, 1, 4><<<rows, 512, 0, st>>>(A, B, O); break;
    case 4: bwd_onepass<512, 1, 4, true><<<rows, 512, 0, st>>>(A, B, O); break;
    case 10: fwd_warp_row<1, 4, 32><<<rows, 32, 0, st>>>(A, O, rows); break;
    case 11: fwd_warp_row<4, 4, 8><<<(rows + 3) / 4, 128, 0, st>>>(A, O, rows); break;
    case 12: fwd_warp_row<2, 4, 16><<<(rows + 1) / 2, 64, 0, st>>>(A, O, rows); break;
    case 5: bwd_onepass_pol<512, 4, 1, false><<<rows, 512, 0, st>>>(A, B, O); break;
    case 6: bwd_onepass_pol<512, 4, 2, false><<<rows, 512, 0, st>>>(A, B, O); break;
    case 7: bwd_onepass_pol<512, 4, 1, true><<<rows, 512, 0, st>>>(A, B, O); break;
    case 8: bwd_onepass_pol<512, 4, 3, false><<<rows, 512, 0, st>>>(A, B, O); break;
    case 13: fwd_warp_row<4, 4, 8, 1><<<(rows + 3) / 4, 128, 0, st>>>(A, O, rows); break;
    case 14: fwd_warp_row<4, 4, 8, 2><<<(rows + 3) / 4, 128, 0, st>>>(A, O, rows); break;
    case 9: bwd_onepass_x<512, 4, 0><<<rows, 512, 0, st>>>(A, B, O); break;
    case 15: bwd_onepass_x<512, 4, 1><<<rows, 512, 0, st>>>(A, B, O); break;
    case 16: fwd_warp_row<4, 4, 8, 3><<<(rows + 3) / 4, 128, 0, st>>>(A, O, rows); break;
    case 17: fwd_warp_row<4, 4, 8, 4><<<(rows + 3) / 4, 128, 0, st>>>(A, O, rows); break;
    /* persistent, bulk copies (TMA): backward 256 threads x 2 slots per row, NBUF rows
     * of 16 KB in flight per CTA; forward 8 warps x 4 slots, tiles of 8 rows (16 KB) */
    case 20: launch_persistent(bwd_tma<256, 2, 4, 3>, 256, 4 * 16384, 3, rows, st, A, B, O, rows); break;
    case 21: launch_persistent(bwd_tma<256, 2, 2, 4>, 256, 2 * 16384, 4, rows, st, A, B, O, rows); break;
    case 22: launch_persistent(bwd_tma<256, 2, 6, 2>, 256, 6 * 16384, 2, rows, st, A, B, O, rows); break;
    case 23: launch_persistent(bwd_tma<512, 1, 4, 3>, 512, 4 * 16384, 3, rows, st, A, B, O, rows); break;
    case 30: launch_persistent(fwd_tma<8, 4, 4, 3>, 256, 4 * 16384, 3, rows / 8, st, A, O, rows); break;
    case 31: launch_persistent(fwd_tma<8, 4, 2, 4>, 256, 2 * 16384, 4, rows / 8, st, A, O, rows); break;
    case 32: launch_persistent(fwd_tma<8, 4, 6, 2>, 256, 6 * 16384, 2, rows / 8, st, A, O, rows); break;
    case 33: launch_persistent(fwd_tma<4, 4, 4, 6>, 128, 4 * 8192, 6, rows / 4, st, A, O, rows); break;
    /* backward rows of 4096 slots (32768 bfloat16 columns), a 1024-thread CTA per row */
    case 40: bwd_rows_onepass<1024, 4, 0><<<rows, 1024, 0, st>>>(A, B, O); break;
    case 41: bwd_rows_onepass<1024, 4, 2><<<rows, 1024, 0, st>>>(A, B, O); break;
    case 42: bwd_rows_onepass<1024, 4, 1><<<rows, 1024, 0, st>>>(A, B, O); break;
    case 43: bwd_rows_twopass<1024, 2, 2><<<rows, 1024, 0, st>>>(A, B, O); break;
    case 44: bwd_rows_twopass<1024, 1, 4><<<rows, 1024, 0, st>>>(A, B, O); break;
    case 45: bwd_rows_twopass<1024, 4, 1><<<rows, 1024, 0, st>>>(A, B, O); break;
    case 46: bwd_rows_twopass<512, 2, 4><<<rows, 512, 0, st>>>(A, B, O); break;
    /* forward, a CTA per row like Triton's (fwd_cta_row): 1024 columns
     * 50 / 51 = 128 threads x 1 slot plain / keep, 52 / 53 = 64 x 2; 4096
     * columns 54 / 55 = 512 x 1, 56 / 57 = 256 x 2, 58 / 59 = 128 x 4 */
    case 50: fwd_cta_row<128, 1, 0><<<rows, 128, 0, st>>>(A, O); break;
    case 51: fwd_cta_row<128, 1, 2><<<rows, 128, 0, st>>>(A, O); break;
    case 52: fwd_cta_row<64, 2, 0><<<rows, 64, 0, st>>>(A, O); break;
    case 53: fwd_cta_row<64, 2, 2><<<rows, 64, 0, st>>>(A, O); break;
    case 54: fwd_cta_row<512, 1, 0><<<rows, 512, 0, st>>>(A, O); break;
    case 55: fwd_cta_row<512, 1, 2><<<rows, 512, 0, st>>>(A, O); break;
    case 56: fwd_cta_row<256, 2, 0><<<rows, 256, 0, st>>>(A, O); break;
    case 57: fwd_cta_row<256, 2, 2><<<rows, 256, 0, st>>>(A, O); break;
    case 58: fwd_cta_row<128, 4, 0><<<rows, 128, 0, st>>>(A, O); break;
    case 59: fwd_cta_row<128, 4, 2><<<rows, 128, 0, st>>>(A, O); break;
    default: {
      /* forward, 128 columns (fwd_narrow): 60 / 61 the library's warp-tier
       * layout (4 lanes x 4 slots per row, 128 threads, 32 rows per CTA, 9
       * CTAs per SM) plain / keep; 62 / 63 the same CTAs with 16 lanes per
       * row (each load instruction 512 contiguous bytes); 64 / 65 Inductor's
       * shape (64 threads, 16 lanes per row, 2 rows per lane, 8 rows per
       * CTA, 32 CTAs per SM); keep: 66 the library's layout in 64-thread
       * CTAs (18 per SM: the same warps per SM), 67 Inductor's shape at 18
       * per SM (the library's warps per SM), 68 Inductor's layout in
       * 128-thread CTAs (16 rows each, 16 per SM: Inductor's warps per SM),
       * 69 8 lanes x 2 slots per row, 2 rows per lane (each load instruction
       * whole 128-byte lines of 4 rows), 9 per SM */
      int rc;
      switch (which) {
        case 60: rc = fwd_narrow_launch<128, 4, 1, 0, 9>(A, O, rows, st); break;
        case 61: rc = fwd_narrow_launch<128, 4, 1, 2, 9>(A, O, rows, st); break;
        case 62: rc = fwd_narrow_launch<128, 16, 4, 0, 9>(A, O, rows, st); break;
        case 63: rc = fwd_narrow_launch<128, 16, 4, 2, 9>(A, O, rows, st); break;
        case 64: rc = fwd_narrow_launch<64, 16, 2, 0, 32>(A, O, rows, st); break;
        case 65: rc = fwd_narrow_launch<64, 16, 2, 2, 32>(A, O, rows, st); break;
        case 66: rc = fwd_narrow_launch<64, 4, 1, 2, 18>(A, O, rows, st); break;
        case 67: rc = fwd_narrow_launch<64, 16, 2, 2, 18>(A, O, rows, st); break;
        case 68: rc = fwd_narrow_launch<128, 16, 2, 2, 16>(A, O, rows, st); break;
        case 69: rc = fwd_narrow_launch<128, 8, 2, 2, 9>(A, O, rows, st); break;
        default: return -1;
      }
      if (rc) return rc;
    }
  }
  return (int)cudaGetLastError();
}
