/*
 * attention_generic.h - the CPU attention forward and backward written once
 * over a compute type. attention.c includes it twice: REAL = float (float32,
 * float16, bfloat16 tensors; lse float32) and REAL = double (float64 tensors;
 * lse float64). FN(name) appends the type suffix.
 *
 * Forward (FlashAttention's tiled online softmax): a task is one (batch,
 * query head, block of OSS_BR query rows). It walks the visible keys in
 * blocks of OSS_BC, computes S = scale * Q K^T (+ mask) for the tile in
 * double (score_gemm), and keeps per row the running max m (double),
 * denominator l and output o, rescaling l and o by exp(m_old - m_new) when m
 * grows; exp() sees S - m rounded once to REAL. At the end o / l is the output
 * and m + log(l) the lse; a row that saw no key gets output 0 and lse -inf.
 * With p->out_residual (16-bit tensors) it also stores o / l minus the stored
 * output as int8 codes (oss_output_residual_code: steps of 2^-5 of its last
 * place).
 *
 * Backward (FlashAttention-2): a task is one (batch, kv head), so it owns dK
 * and dV of that head outright (GQA groups are summed inside the task, in a
 * fixed order: deterministic) and the dQ rows of the query heads of its
 * group. For each query block it makes two passes over the visible keys: the
 * first recomputes the row statistics (m, l, D = sum P * dP: exact, so an
 * out_residual is not needed and not read; with keys_subset they come from
 * the given lse and out instead, and this pass reads no keys), the second
 * P = exp(S - m) / l, dV += P^T dO, dP = dO V^T, dS = P * (dP - D),
 * dK += scale * dS^T Q and dQ += scale * dS K, accumulating in double.
 * Only OSS_BR x OSS_BC tiles of scores exist at any time.
 *
 * Score variants (oss.h): score_tile applies softcap, ALiBi, the mask, the
 * window and the causal rule to each tile, in that order. The key loops of
 * both directions visit only [key_begin, key_end), the keys some row of the
 * query block may see under the causal rule and the window, so the tiles
 * wholly outside a sliding window are skipped, not masked. A sink starts each
 * row's online softmax at m = sink, l = 1 (its exp(sink - m) term, no value),
 * so a row that sees no key gets output 0 and lse = sink. The backward's
 * softcap factor 1 - tanh^2 multiplies dS, and each (batch, query head)
 * leaves its share of d sink = -sum_i exp(sink - lse_i) D_i in dsink_partial,
 * summed over the batch in a fixed order once every task is done.
 *
 * Dropout (oss_internal.h's rule, factors F = 1 / (1 - p) or 0 per weight by
 * dropout_tile): the forward sums l over the weights before dropout and
 * multiplies P by F before P V; the backward takes dV from (P F)^T dO and
 * dS = P (F dP~ - D), dP~ = dO V^T, D = sum_j P F dP~ (= rowsum(dO * O)).
 */

/* ---- tile helpers ------------------------------------------------------------ */

/* Loads `rows` rows of `width` elements of a [B, H, L, width] tensor starting
 * at (b, h, row0) into dst[r * width + d]. */
static void FN(load_rows)(const void *base, oss_dtype dtype, const int64_t stride[3], int64_t b, int64_t h,
                          int64_t row0, int64_t rows, int64_t width, REAL *dst) {
  for (int64_t r = 0; r < rows; r++)
    LOAD(base, dtype, b * stride[0] + h * stride[1] + (row0 + r) * stride[2], 1, dst + r * width, width);
}

static void FN(store_rows)(void *base, oss_dtype dtype, const int64_t stride[3], int64_t b, int64_t h,
                           int64_t row0, int64_t rows, int64_t width, const REAL *src) {
  for (int64_t r = 0; r < rows; r++)
    STORE(base, dtype, b * stride[0] + h * stride[1] + (row0 + r) * stride[2], 1, src + r * width, width);
}

/* Keys batch b attends to, and the causal rule's offset for it (oss.h's
 * KV-cache fields: seqlens_k and a diagonal that follows it). */
static int64_t FN(keys_of)(const oss_attention_params *p, int64_t b) {
  return p->seqlens_k != NULL ? p->seqlens_k[b] : p->len_k;
}
static int64_t FN(causal_offset)(const oss_attention_params *p, int64_t b) {
  return p->causal == OSS_CAUSAL_BOTTOM_RIGHT ? FN(keys_of)(p, b) - p->len_q : 0;
}
/* off of the distance d = i + off - j that ALiBi and the window measure
 * (oss.h): bottom-right when the window's diagonal or the causal rule is. */
static int64_t FN(variant_offset)(const oss_attention_params *p, int64_t b) {
  return p->window_diagonal == OSS_CAUSAL_BOTTOM_RIGHT || p->causal == OSS_CAUSAL_BOTTOM_RIGHT
             ? FN(keys_of)(p, b) - p->len_q
             : 0;
}

/* load_rows for k or v (their strides `stride`), through the page table when
 * the cache is paged: key j of batch b is row j % page_size of page
 * block_table[b][j / page_size]. */
static void FN(load_kv_rows)(const oss_attention_params *p, const void *base, const int64_t stride[3], int64_t b,
                             int64_t h, int64_t row0, int64_t rows, int64_t width, REAL *dst) {
  if (p->block_table == NULL) {
    FN(load_rows)(base, p->dtype, stride, b, h, row0, rows, width, dst);
    return;
  }
  for (int64_t r = 0; r < rows; r++) {
    const int64_t j = row0 + r, page = p->block_table[b * p->block_table_stride + j / p->page_size];
    LOAD(base, p->dtype, page * stride[0] + h * stride[1] + j % p->page_size * stride[2], 1, dst + r * width, width);
  }
}

/* dst[d * cols + c] = src[c * width + d]: a key tile transposed so that the
 * score loop runs over unit-stride keys. */
static void FN(transpose)(const REAL *src, int64_t cols, int64_t width, REAL *dst) {
  for (int64_t c = 0; c < cols; c++)
    for (int64_t d = 0; d < width; d++) dst[d * cols + c] = src[c * width + d];
}

static void FN(widen)(const REAL *src, int64_t n, double *dst) {
  for (int64_t x = 0; x < n; x++) dst[x] = (double)src[x];
}

/* C (+)= A B for an M x N tile: A is M x K (row stride lda), B is K x N
 * (ldb), C is M x N (ldc). Blocks of 4 rows by two 32-byte vectors of
 * columns keep their 8 accumulators in registers (GNU vector extension;
 * split into 16-byte halves on the baseline ISA), so each loaded row of B
 * serves four rows of A; edges use plain loops. About 90 GFLOP/s per core
 * in float on an AVX2 machine. */
typedef REAL FN(vec) __attribute__((vector_size(32)));

static inline FN(vec) FN(vload)(const REAL *x) {
  FN(vec) v;
  memcpy(&v, x, sizeof v);
  return v;
}

static inline void FN(vstore)(REAL *x, FN(vec) v) { memcpy(x, &v, sizeof v); }

OSS_VECTOR_CLONES /* its own clones: too large to be inlined into the callers' */
static void FN(tile_gemm)(int64_t M, int64_t N, int64_t K, const REAL *A, int64_t lda, const REAL *B, int64_t ldb,
                          REAL *C, int64_t ldc, int accumulate) {
  enum { MB = 4, VL = 32 / sizeof(REAL), NB = 2 * VL };
  int64_t i = 0;
  for (; i + MB <= M; i += MB) {
    int64_t j = 0;
    for (; j + NB <= N; j += NB) {
      FN(vec) acc[MB][2];
      for (int r = 0; r < MB; r++)
        for (int h = 0; h < 2; h++)
          acc[r][h] = accumulate ? FN(vload)(C + (i + r) * ldc + j + h * VL) : (FN(vec)){0};
      for (int64_t k = 0; k < K; k++) {
        const FN(vec) b0 = FN(vload)(B + k * ldb + j), b1 = FN(vload)(B + k * ldb + j + VL);
        for (int r = 0; r < MB; r++) {
          const REAL a = A[(i + r) * lda + k];
          acc[r][0] += a * b0;
          acc[r][1] += a * b1;
        }
      }
      for (int r = 0; r < MB; r++)
        for (int h = 0; h < 2; h++) FN(vstore)(C + (i + r) * ldc + j + h * VL, acc[r][h]);
    }
    for (int r = 0; r < MB; r++) /* column tail */
      for (int64_t c = j; c < N; c++) {
        REAL acc = accumulate ? C[(i + r) * ldc + c] : 0;
        for (int64_t k = 0; k < K; k++) acc += A[(i + r) * lda + k] * B[k * ldb + c];
        C[(i + r) * ldc + c] = acc;
      }
  }
  for (; i < M; i++) { /* row tail */
    REAL *crow = C + i * ldc;
    if (!accumulate)
      for (int64_t c = 0; c < N; c++) crow[c] = 0;
    for (int64_t k = 0; k < K; k++) {
      const REAL a = A[i * lda + k], *b = B + k * ldb;
#pragma omp simd
      for (int64_t c = 0; c < N; c++) crow[c] += a * b[c];
    }
  }
}

/* C = A B in double for an M x N tile of scores, A (M x K: the query block)
 * and B (K x N: the key tile transposed) both widened to double once per
 * block; likewise the backward's dP = dO V^T. The products of two floats are
 * exact in double and the K-term sums run in double, so a float32 score
 * carries no rounding of its own (PyTorch's float GEMM, the peer, is off by
 * ~K ulps of |q||k|). The same 4-row blocks as tile_gemm, with 8 columns as
 * two vectors of 4 doubles. Contraction into fused multiply-adds is allowed
 * here alone (the C11 build keeps it off): with exact products it changes no
 * bit of a float32/16 score, and it halves the instructions; float64 scores
 * and dP may differ in the last bit between machines with and without FMA. */
typedef double FN(dvec) __attribute__((vector_size(32)));

OSS_VECTOR_CLONES __attribute__((optimize("fp-contract=fast")))
static void FN(score_gemm)(int64_t M, int64_t N, int64_t K, const double *A, int64_t lda, const double *B,
                           int64_t ldb, double *C, int64_t ldc) {
  enum { MB = 4, NB = 8 };
  int64_t i = 0;
  for (; i + MB <= M; i += MB) {
    int64_t j = 0;
    for (; j + NB <= N; j += NB) {
      FN(dvec) acc[MB][2];
      for (int r = 0; r < MB; r++) acc[r][0] = acc[r][1] = (FN(dvec)){0};
      for (int64_t k = 0; k < K; k++) {
        FN(dvec) b0, b1;
        memcpy(&b0, B + k * ldb + j, sizeof b0);
        memcpy(&b1, B + k * ldb + j + 4, sizeof b1);
        for (int r = 0; r < MB; r++) {
          const double a = A[(i + r) * lda + k];
          acc[r][0] += a * b0;
          acc[r][1] += a * b1;
        }
      }
      for (int r = 0; r < MB; r++) {
        memcpy(C + (i + r) * ldc + j, &acc[r][0], sizeof acc[r][0]);
        memcpy(C + (i + r) * ldc + j + 4, &acc[r][1], sizeof acc[r][1]);
      }
    }
    for (int r = 0; r < MB; r++) /* column tail */
      for (int64_t c = j; c < N; c++) {
        double acc = 0;
        for (int64_t k = 0; k < K; k++) acc += A[(i + r) * lda + k] * B[k * ldb + c];
        C[(i + r) * ldc + c] = acc;
      }
  }
  for (; i < M; i++) { /* row tail */
    double *crow = C + i * ldc;
    for (int64_t c = 0; c < N; c++) crow[c] = 0;
    for (int64_t k = 0; k < K; k++) {
      const double a = A[i * lda + k];
      const double *b = B + k * ldb;
#pragma omp simd
      for (int64_t c = 0; c < N; c++) crow[c] += a * b[c];
    }
  }
}

static REAL FN(mask_value)(const oss_attention_params *p, int64_t offset) {
  switch (p->mask_dtype) {
  case OSS_FLOAT32: return (REAL)((const float *)p->mask)[offset];
  case OSS_FLOAT64: return (REAL)((const double *)p->mask)[offset];
  case OSS_FLOAT16: return (REAL)oss_half_to_float(((const uint16_t *)p->mask)[offset]);
  case OSS_BFLOAT16: return (REAL)oss_bf16_to_float(((const uint16_t *)p->mask)[offset]);
  default: return (REAL)NAN;
  }
}

/* S[r][c] for a rows x cols tile: scale * Q[r] . K[c] computed in double
 * by score_gemm from Qd (the query block) and Ktd (the key tile transposed),
 * both already widened to double; then the variants in oss.h's order:
 * softcap, ALiBi, the mask (additive values added, false entries hidden), the
 * window and the causal rule (hidden scores become -inf, whatever the mask
 * put there). With softcap > 0 and G != NULL, G[r][c] = 1 - tanh^2, the
 * derivative of the cap (the backward's factor). Scores stay in double
 * through the row max, so exp() sees only S - m rounded once: a float32 score
 * of 1e4 is only good to 1e-3, which exp() would turn into a 1e-3 relative
 * error of P. The forward and the backward's recomputation get the same bits. */
static void FN(score_tile)(const oss_attention_params *p, int64_t b, int64_t h, int64_t i0, int64_t rows,
                           int64_t j0, int64_t cols, const double *Qd, const double *Ktd, double *S, double *G) {
  const int64_t D = p->head_dim;
  const double scale = p->scale, softcap = p->softcap;
  const int64_t causal_offset = FN(causal_offset)(p, b), off = FN(variant_offset)(p, b);
  const double slope = p->alibi_slopes != NULL ? (double)p->alibi_slopes[b * p->alibi_stride_batch + h] : 0.0;
  FN(score_gemm)(rows, cols, D, Qd, D, Ktd, cols, S, cols);
  for (int64_t r = 0; r < rows; r++) {
    double *s = S + r * cols;
    for (int64_t c = 0; c < cols; c++) s[c] *= scale;
    const int64_t i = i0 + r;
    if (softcap > 0)
      for (int64_t c = 0; c < cols; c++) {
        const double t = tanh(s[c] / softcap);
        s[c] = softcap * t;
        if (G != NULL) G[r * cols + c] = 1 - t * t;
      }
    if (p->alibi_slopes != NULL)
      for (int64_t c = 0; c < cols; c++) {
        const int64_t d = i + off - (j0 + c);
        s[c] -= slope * (double)(d < 0 ? -d : d);
      }
    if (p->mask_kind != OSS_MASK_NONE) {
      const int64_t mrow = b * p->mask_stride[0] + h * p->mask_stride[1] + i * p->mask_stride[2];
      for (int64_t c = 0; c < cols; c++) {
        const int64_t at = mrow + (j0 + c) * p->mask_stride[3];
        if (p->mask_kind == OSS_MASK_BOOL) {
          if (!((const uint8_t *)p->mask)[at]) s[c] = -INFINITY;
        } else {
          s[c] += (double)FN(mask_value)(p, at);
        }
      }
    }
    if (p->window)
      for (int64_t c = 0; c < cols; c++) {
        const int64_t d = i + off - (j0 + c);
        if ((p->window_left >= 0 && d > p->window_left) || (p->window_right >= 0 && -d > p->window_right))
          s[c] = -INFINITY;
      }
    if (p->causal != OSS_CAUSAL_NONE)
      for (int64_t c = 0; c < cols; c++)
        if (j0 + c > i + causal_offset) s[c] = -INFINITY;
  }
}

/* The keys [*begin, *end) of batch b that some query row of [i0, i0 + rows)
 * may see under the causal rule and the window (all of them without either):
 * the key loops visit only these, so tiles outside a window are skipped. */
static void FN(key_range)(const oss_attention_params *p, int64_t b, int64_t i0, int64_t rows, int64_t *begin,
                          int64_t *end) {
  const int64_t keys = FN(keys_of)(p, b), last = i0 + rows - 1;
  int64_t lo = 0, hi = keys;
  if (p->causal != OSS_CAUSAL_NONE && last + FN(causal_offset)(p, b) + 1 < hi) hi = last + FN(causal_offset)(p, b) + 1;
  if (p->window) {
    /* |d| <= len_q + keys: a side wider than that is open (and cannot overflow) */
    const int64_t off = FN(variant_offset)(p, b), span = p->len_q + keys;
    if (p->window_right >= 0 && p->window_right <= span && last + off + p->window_right + 1 < hi)
      hi = last + off + p->window_right + 1;
    if (p->window_left >= 0 && p->window_left <= span && i0 + off - p->window_left > lo)
      lo = i0 + off - p->window_left;
  }
  if (hi < 0) hi = 0;
  if (lo > hi) lo = hi;
  *begin = lo;
  *end = hi;
}

/* A row's online-softmax state before any key: the sink's term (m = sink,
 * l = exp(sink - m) = 1) or nothing (m = -inf, l = 0). */
static double FN(sink_of)(const oss_attention_params *p, int64_t h) {
  return p->sinks != NULL ? (double)p->sinks[h] : -INFINITY;
}

/* F[r * cols + c] = the dropout factor of weight (query i0 + r, key j0 + c)
 * of (b, h): 1 / (1 - p) where oss_internal.h's rule keeps it, else 0. One
 * Philox call serves the (up to) eight weights of its group in the tile, made
 * at the group's first member inside the tile. */
static void FN(dropout_tile)(const oss_attention_params *p, int64_t b, int64_t h, int64_t i0, int64_t rows,
                             int64_t j0, int64_t cols, double *F) {
  static const int64_t di[2] = {0, 8}, dj[4] = {0, 1, 8, 9};
  const uint64_t seed = *p->dropout_seed, bh = (uint64_t)(b * p->heads_q + h);
  const uint32_t thr = oss_dropout_threshold(p->dropout_p);
  const double keep = oss_dropout_scale(p->dropout_p);
  for (int64_t i = i0; i < i0 + rows; i++) {
    const int64_t gi = i & ~(int64_t)8;
    if (i != (gi >= i0 ? gi : gi + 8)) continue;
    for (int64_t j = j0; j < j0 + cols; j++) {
      const int64_t gj = j & ~(int64_t)9;
      int k = 0;
      while (gj + dj[k] < j0) k++; /* stops at j's member or before: j >= j0 */
      if (j != gj + dj[k]) continue;
      uint32_t w[4];
      oss_dropout_group(seed, bh, i, j, w);
      for (int x = 0; x < 2; x++)
        for (int y = 0; y < 4; y++) {
          const int64_t qi = gi + di[x], kj = gj + dj[y];
          if (qi >= i0 && qi < i0 + rows && kj >= j0 && kj < j0 + cols)
            F[(qi - i0) * cols + (kj - j0)] =
                oss_dropout_bits(w[oss_dropout_word(qi, kj)], kj) >= thr ? keep : 0.0;
        }
    }
  }
}

/* ---- forward ------------------------------------------------------------------- */

typedef struct FN(attention_task_ctx) {
  const void *params;
  double *dsink_partial; /* backward with sinks and dsinks: [batch][heads_q] shares of d sink */
  _Atomic int failed;
} FN(attention_task_ctx);

OSS_VECTOR_CLONES
static void FN(attention_fwd_range)(void *vctx, int64_t begin, int64_t end) {
  FN(attention_task_ctx) *ctx = (FN(attention_task_ctx) *)vctx;
  const oss_attention_params *all = (const oss_attention_params *)ctx->params, *p = all;
  oss_attention_params seq; /* a variable-length batch's sequence b (attention_seq_params) */
  const int64_t D = p->head_dim, Dv = p->head_dim_v, group = p->heads_q / p->heads_kv;
  const int64_t qblocks = (p->len_q + OSS_BR - 1) / OSS_BR;
  double Sd[OSS_BR * OSS_BC], m[OSS_BR]; /* scores and row maxes in double */
  double F[OSS_BR * OSS_BC];              /* dropout factors */
  const int dropout = p->dropout_p > 0;
  REAL *scratch = (REAL *)malloc(sizeof(REAL) * (size_t)(OSS_BR * D + 2 * OSS_BC * D + OSS_BC * Dv +
                                                          OSS_BR * OSS_BC + 2 * OSS_BR * Dv + 2 * OSS_BR));
  double *Qd = (double *)malloc(sizeof(double) * (size_t)((OSS_BR + OSS_BC) * D)), *Ktd = Qd + OSS_BR * D;
  if (!scratch || !Qd) {
    free(scratch);
    free(Qd);
    ctx->failed = 1;
    return;
  }
  REAL *Q = scratch, *K = Q + OSS_BR * D, *Kt = K + OSS_BC * D, *V = Kt + OSS_BC * D, *S = V + OSS_BC * Dv,
       *O = S + OSS_BR * OSS_BC, *l = O + OSS_BR * Dv, *lse = l + OSS_BR, *R = lse + OSS_BR;
  for (int64_t task = begin; task < end; task++) {
    const int64_t b = task / (all->heads_q * qblocks), h = task / qblocks % all->heads_q;
    const int64_t hk = h / group, i0 = task % qblocks * OSS_BR;
    p = attention_seq_params(all, b, &seq);
    if (i0 >= p->len_q) continue; /* past a shorter sequence's rows */
    const int64_t rows = p->len_q - i0 < OSS_BR ? p->len_q - i0 : OSS_BR;
    FN(load_rows)(p->q, p->dtype, p->q_stride, b, h, i0, rows, D, Q);
    FN(widen)(Q, rows * D, Qd);
    const double sink = FN(sink_of)(p, h);
    for (int64_t r = 0; r < rows; r++) m[r] = sink, l[r] = sink == -INFINITY ? 0 : 1;
    for (int64_t x = 0; x < rows * Dv; x++) O[x] = 0;
    int64_t kbegin, kend;
    FN(key_range)(p, b, i0, rows, &kbegin, &kend);
    for (int64_t j0 = kbegin; j0 < kend; j0 += OSS_BC) {
      const int64_t cols = kend - j0 < OSS_BC ? kend - j0 : OSS_BC;
      FN(load_kv_rows)(p, p->k, p->k_stride, b, hk, j0, cols, D, K);
      FN(transpose)(K, cols, D, Kt);
      FN(widen)(Kt, D * cols, Ktd);
      FN(load_kv_rows)(p, p->v, p->v_stride, b, hk, j0, cols, Dv, V);
      FN(score_tile)(p, b, h, i0, rows, j0, cols, Qd, Ktd, Sd, NULL);
      for (int64_t r = 0; r < rows; r++) { /* online softmax: P into S, rescale o */
        const double *sd = Sd + r * cols;
        REAL *s = S + r * cols, *o = O + r * Dv;
        double m_new = m[r];
        for (int64_t c = 0; c < cols; c++) /* NaN sticks: a NaN score makes the row NaN, as in SDPA */
          m_new = (sd[c] > m_new || sd[c] != sd[c]) ? sd[c] : m_new;
        if (m_new == -INFINITY) { /* nothing visible to this row yet: P = 0 */
          for (int64_t c = 0; c < cols; c++) s[c] = 0;
          continue;
        }
        const REAL alpha = EXP((REAL)(m[r] - m_new));
        REAL row_sum = 0;
#pragma omp simd reduction(+ : row_sum)
        for (int64_t c = 0; c < cols; c++) {
          s[c] = EXP((REAL)(sd[c] - m_new));
          row_sum += s[c];
        }
        l[r] = l[r] * alpha + row_sum;
        m[r] = m_new;
        for (int64_t d = 0; d < Dv; d++) o[d] *= alpha;
      }
      if (dropout) { /* l has the weights before dropout; P V the dropped ones */
        FN(dropout_tile)(p, b, h, i0, rows, j0, cols, F);
        for (int64_t x = 0; x < rows * cols; x++) S[x] *= (REAL)F[x];
      }
      FN(tile_gemm)(rows, Dv, cols, S, cols, V, Dv, O, Dv, 1); /* o += P V */
    }
    for (int64_t r = 0; r < rows; r++) {
      REAL *o = O + r * Dv;
      if (l[r] == 0) { /* fully masked row, no sink */
        for (int64_t d = 0; d < Dv; d++) o[d] = 0;
        lse[r] = -INFINITY;
      } else {
        const REAL inv_l = 1 / l[r];
        for (int64_t d = 0; d < Dv; d++) o[d] *= inv_l;
        lse[r] = (REAL)(m[r] + (double)LOG(l[r]));
      }
    }
    FN(store_rows)(p->out, p->dtype, p->out_stride, b, h, i0, rows, Dv, O);
    if (p->out_residual != NULL) { /* O minus what was stored, as int8 codes (oss_output_residual_code) */
      FN(load_rows)(p->out, p->dtype, p->out_stride, b, h, i0, rows, Dv, R);
      for (int64_t r = 0; r < rows; r++) {
        int8_t *code = (int8_t *)p->out_residual + b * p->out_stride[0] + h * p->out_stride[1] + (i0 + r) * p->out_stride[2];
        for (int64_t d = 0; d < Dv; d++)
          code[d] = (int8_t)oss_output_residual_code((float)O[r * Dv + d], (float)R[r * Dv + d], p->dtype == OSS_BFLOAT16);
      }
    }
    LSE_T *lse_out = (LSE_T *)p->lse + attention_lse_at(p, b, h) + i0;
    for (int64_t r = 0; r < rows; r++) lse_out[r] = (LSE_T)lse[r];
  }
  free(scratch);
  free(Qd);
}

/* ---- backward ------------------------------------------------------------------ */

/* S (scores) and dP = dO V^T for one tile, both in double from dO and the
 * value tile transposed widened to double (dOd, Vtd): like a score, dP
 * carries no rounding of its own, so D = sum_j P_ij dP_ij and the sink's
 * gradient -sum_i P_sink D_i, sums whose terms cancel, are not left with the
 * K-term rounding of a float GEMM. */
static void FN(score_and_dp_tile)(const oss_attention_params *p, int64_t b, int64_t h, int64_t i0, int64_t rows,
                                  int64_t j0, int64_t cols, const double *Qd, const double *Ktd, const double *Vtd,
                                  const double *dOd, double *S, double *G, double *dP) {
  FN(score_tile)(p, b, h, i0, rows, j0, cols, Qd, Ktd, S, G);
  FN(score_gemm)(rows, cols, p->head_dim_v, dOd, p->head_dim_v, Vtd, cols, dP, cols);
}

/* acc[r][d] += tile[r][d] for an n x width tile: per-tile products in REAL,
 * running sums in double. */
static void FN(add_tile)(double *acc, const REAL *tile, int64_t n, int64_t width) {
  for (int64_t x = 0; x < n * width; x++) acc[x] += (double)tile[x];
}

/* Loads key block [j0, j0 + cols) of kv head hk: K row-major (for dQ), K
 * transposed and widened to double (for S), V transposed and widened to
 * double (for dP). */
static void FN(load_kv_tile)(const oss_attention_params *p, int64_t b, int64_t hk, int64_t j0, int64_t cols, REAL *K,
                             REAL *Kt, double *Ktd, REAL *V, REAL *Vt, double *Vtd) {
  FN(load_rows)(p->k, p->dtype, p->k_stride, b, hk, j0, cols, p->head_dim, K);
  FN(transpose)(K, cols, p->head_dim, Kt);
  FN(widen)(Kt, p->head_dim * cols, Ktd);
  FN(load_rows)(p->v, p->dtype, p->v_stride, b, hk, j0, cols, p->head_dim_v, V);
  FN(transpose)(V, cols, p->head_dim_v, Vt);
  FN(widen)(Vt, p->head_dim_v * cols, Vtd);
}

static void FN(store_acc_rows)(void *base, oss_dtype dtype, const int64_t stride[3], int64_t b, int64_t h,
                               int64_t row0, int64_t rows, int64_t width, const double *acc, REAL *tmp) {
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t d = 0; d < width; d++) tmp[d] = (REAL)acc[r * width + d];
    STORE(base, dtype, b * stride[0] + h * stride[1] + (row0 + r) * stride[2], 1, tmp, width);
  }
}

/* Gradients accumulate in double (dK and dV sum over every query of the GQA
 * group). A first pass over the keys recomputes each row's statistics from
 * the very scores the second pass sees: the max m, l = sum exp(S - m) and
 * D = sum_j P_ij dP_ij (= rowsum(dO * O) without the output's rounding), in
 * double, with the forward's online rescaling. P = exp(S - m) / l then cancels
 * exactly where scores are large, which a float32 lse cannot (a score of 1e4
 * has an ulp of 1e-3), so the CPU backward reads the saved lse only for its
 * shape; the CUDA kernels read it as FlashAttention does. */
OSS_VECTOR_CLONES
static void FN(attention_bwd_range)(void *vctx, int64_t begin, int64_t end) {
  FN(attention_task_ctx) *ctx = (FN(attention_task_ctx) *)vctx;
  const oss_attention_backward_params *all = (const oss_attention_backward_params *)ctx->params, *bp = all;
  oss_attention_backward_params seq; /* a variable-length batch's sequence b */
  const oss_attention_params *p = &bp->fwd;
  /* Lk bounds every task's keys (with cu_seqlens a sequence has its own, Lkb <= Lk) */
  const int64_t D = p->head_dim, Dv = p->head_dim_v, group = p->heads_q / p->heads_kv, Lk = p->len_k;
  const int64_t W = D > Dv ? D : Dv;
  const size_t tile = (size_t)(OSS_BR * D + OSS_BR * Dv + OSS_BC * D * 2 + OSS_BC * Dv * 2 + OSS_BR * OSS_BC * 3 +
                               OSS_BC * W + W);
  REAL *scratch = (REAL *)malloc(sizeof(REAL) * tile);
  double *acc = (double *)malloc(sizeof(double) * (size_t)(Lk * (D + Dv) + (2 * OSS_BR + OSS_BC) * D +
                                                             (OSS_BR + OSS_BC) * Dv + 4 * OSS_BR));
  if (!scratch || !acc) {
    free(scratch);
    free(acc);
    ctx->failed = 1;
    return;
  }
  REAL *Q = scratch, *dO = Q + OSS_BR * D, *K = dO + OSS_BR * Dv, *Kt = K + OSS_BC * D, *V = Kt + OSS_BC * D,
       *Vt = V + OSS_BC * Dv, *P = Vt + OSS_BC * Dv, *dS = P + OSS_BR * OSS_BC, *Tt = dS + OSS_BR * OSS_BC,
       *prod = Tt + OSS_BR * OSS_BC, *row_tmp = prod + OSS_BC * W;
  double *dK = acc, *dV = dK + Lk * D, *dQ = dV + Lk * Dv, *Drow = dQ + OSS_BR * D, *m = Drow + OSS_BR,
         *l = m + OSS_BR, *inv_l = l + OSS_BR, *Qd = inv_l + OSS_BR, *Ktd = Qd + OSS_BR * D,
         *dOd = Ktd + OSS_BC * D, *Vtd = dOd + OSS_BR * Dv;
  double S[OSS_BR * OSS_BC], G[OSS_BR * OSS_BC]; /* scores; softcap's 1 - tanh^2 */
  double dP[OSS_BR * OSS_BC];                    /* dO V^T */
  double F[OSS_BR * OSS_BC];                     /* dropout factors (1 without dropout) */
  const int dropout = p->dropout_p > 0;
  if (!dropout)
    for (int64_t x = 0; x < OSS_BR * OSS_BC; x++) F[x] = 1;
  double *Gp = p->softcap > 0 ? G : NULL;
  const double scale = p->scale;
  for (int64_t task = begin; task < end; task++) {
    const int64_t b = task / all->fwd.heads_kv, hk = task % all->fwd.heads_kv;
    bp = attention_seq_backward_params(all, b, &seq);
    p = &bp->fwd;
    const int64_t Lkb = p->len_k;
    for (int64_t x = 0; x < Lk * (D + Dv); x++) dK[x] = 0; /* dV follows dK */
    for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
      const double sink = FN(sink_of)(p, h);
      double dsink = 0; /* this (b, h)'s share of d sink_h */
      for (int64_t i0 = 0; i0 < p->len_q; i0 += OSS_BR) {
        const int64_t rows = p->len_q - i0 < OSS_BR ? p->len_q - i0 : OSS_BR;
        int64_t kbegin, kend;
        FN(key_range)(p, b, i0, rows, &kbegin, &kend);
        FN(load_rows)(p->q, p->dtype, p->q_stride, b, h, i0, rows, D, Q);
        FN(widen)(Q, rows * D, Qd);
        FN(load_rows)(bp->dout, p->dtype, bp->dout_stride, b, h, i0, rows, Dv, dO);
        FN(widen)(dO, rows * Dv, dOd);

        /* pass 1: m, l and D per row; with keys_subset, m = the given lse, l = 1 and
         * D = rowsum(dO * out) of the given out (the attention over more keys, of
         * which these are a block: this block's share of its gradient) */
        for (int64_t r = 0; r < rows; r++) m[r] = sink, l[r] = sink == -INFINITY ? 0 : 1, Drow[r] = 0;
        if (bp->keys_subset) {
          const LSE_T *lse_in = (const LSE_T *)p->lse + attention_lse_at(p, b, h) + i0;
          FN(load_rows)(p->out, p->dtype, p->out_stride, b, h, i0, rows, Dv, prod);
          for (int64_t r = 0; r < rows; r++) {
            const double lr = (double)lse_in[r];
            m[r] = lr;
            l[r] = lr == -INFINITY ? 0 : 1;
            double d = 0;
            for (int64_t e = 0; e < Dv; e++) d += (double)dO[r * Dv + e] * (double)prod[r * Dv + e];
            Drow[r] = d;
          }
        }
        for (int64_t j0 = kbegin; j0 < (bp->keys_subset ? kbegin : kend); j0 += OSS_BC) {
          const int64_t cols = kend - j0 < OSS_BC ? kend - j0 : OSS_BC;
          FN(load_kv_tile)(p, b, hk, j0, cols, K, Kt, Ktd, V, Vt, Vtd);
          FN(score_and_dp_tile)(p, b, h, i0, rows, j0, cols, Qd, Ktd, Vtd, dOd, S, NULL, dP);
          if (dropout) FN(dropout_tile)(p, b, h, i0, rows, j0, cols, F);
          for (int64_t r = 0; r < rows; r++) {
            const double *sr = S + r * cols;
            const double *dpr = dP + r * cols;
            double m_new = m[r];
            for (int64_t c = 0; c < cols; c++) m_new = (sr[c] > m_new || sr[c] != sr[c]) ? sr[c] : m_new;
            if (m_new == -INFINITY) continue; /* nothing visible yet */
            const double alpha = m[r] == -INFINITY ? 0.0 : exp(m[r] - m_new);
            double ls = 0, ds = 0;
            for (int64_t c = 0; c < cols; c++) {
              const double e = exp(sr[c] - m_new);
              ls += e;
              ds += e * F[r * cols + c] * dpr[c]; /* dP of the dropped weights: F dP~ */
            }
            l[r] = l[r] * alpha + ls;
            Drow[r] = Drow[r] * alpha + ds;
            m[r] = m_new;
          }
        }
        /* lse's gradient: d lse_i / d s_ij = P_ij, so dS = P (dP - (D - dlse)) */
        const LSE_T *dlse_in = bp->dlse == NULL ? NULL : (const LSE_T *)bp->dlse + attention_lse_at(p, b, h) + i0;
        for (int64_t r = 0; r < rows; r++) { /* l == 0: no visible key, so no gradient */
          inv_l[r] = l[r] > 0 ? 1 / l[r] : (l[r] == 0 ? 0 : l[r]);
          if (!bp->keys_subset) Drow[r] *= inv_l[r];
          if (dlse_in != NULL && l[r] != 0) Drow[r] -= (double)dlse_in[r];
          if (p->sinks != NULL && l[r] != 0) dsink -= exp(sink - m[r]) * inv_l[r] * Drow[r]; /* -p_sink D */
        }

        /* pass 2: P, dS and the gradients */
        for (int64_t x = 0; x < rows * D; x++) dQ[x] = 0;
        for (int64_t j0 = kbegin; j0 < kend; j0 += OSS_BC) {
          const int64_t cols = kend - j0 < OSS_BC ? kend - j0 : OSS_BC;
          FN(load_kv_tile)(p, b, hk, j0, cols, K, Kt, Ktd, V, Vt, Vtd);
          FN(score_and_dp_tile)(p, b, h, i0, rows, j0, cols, Qd, Ktd, Vtd, dOd, S, Gp, dP);
          if (dropout) FN(dropout_tile)(p, b, h, i0, rows, j0, cols, F);
          /* P = exp(S - m) / l, dS = P * (F dP~ - D) * scale (* 1 - tanh^2), and
           * P F (the dropped weights) for dV; F = 1 without dropout */
          for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) {
              const double pc = inv_l[r] == 0 ? 0.0 : exp(S[r * cols + c] - m[r]) * inv_l[r];
              const double f = F[r * cols + c];
              const double ds = pc * (f * dP[r * cols + c] - Drow[r]) * scale;
              P[r * cols + c] = (REAL)(pc * f);
              dS[r * cols + c] = (REAL)(Gp != NULL ? ds * Gp[r * cols + c] : ds);
            }
          FN(transpose)(P, rows, cols, Tt); /* dV += P^T dO */
          FN(tile_gemm)(cols, Dv, rows, Tt, rows, dO, Dv, prod, Dv, 0);
          FN(add_tile)(dV + j0 * Dv, prod, cols, Dv);
          FN(transpose)(dS, rows, cols, Tt); /* dK += dS^T Q */
          FN(tile_gemm)(cols, D, rows, Tt, rows, Q, D, prod, D, 0);
          FN(add_tile)(dK + j0 * D, prod, cols, D);
          FN(tile_gemm)(rows, D, cols, dS, cols, K, D, prod, D, 0); /* dQ += dS K */
          FN(add_tile)(dQ, prod, rows, D);
        }
        FN(store_acc_rows)(bp->dq, p->dtype, bp->dq_stride, b, h, i0, rows, D, dQ, row_tmp);
      }
      if (ctx->dsink_partial != NULL) ctx->dsink_partial[b * p->heads_q + h] = dsink;
    }
    FN(store_acc_rows)(bp->dk, p->dtype, bp->dk_stride, b, hk, 0, Lkb, D, dK, row_tmp);
    FN(store_acc_rows)(bp->dv, p->dtype, bp->dv_stride, b, hk, 0, Lkb, Dv, dV, row_tmp);
  }
  free(scratch);
  free(acc);
}
