/*
 * attention_generic.h - the CPU attention forward and backward written once
 * over a compute type. attention.c includes it twice: REAL = float (float32,
 * float16, bfloat16 tensors; lse float32) and REAL = double (float64 tensors;
 * lse float64). FN(name) appends the type suffix.
 *
 * Forward (FlashAttention's tiled online softmax): a task is one (batch,
 * query head, block of OSS_BR query rows). It walks the visible keys in
 * blocks of OSS_BC, computes S = scale * Q K^T (+ mask) for the tile, and
 * keeps per row the running max m, denominator l and output o, rescaling l
 * and o by exp(m_old - m_new) when m grows. At the end o / l is the output
 * and m + log(l) the lse; a row that saw no key gets output 0 and lse -inf.
 *
 * Backward (FlashAttention-2): a task is one (batch, kv head), so it owns dK
 * and dV of that head outright (GQA groups are summed inside the task, in a
 * fixed order: deterministic) and the dQ rows of the query heads of its
 * group. For each query block and visible key block it recomputes
 * P = exp(S - lse), then dV += P^T dO, dP = dO V^T, dS = P * (dP - D) with
 * D = rowsum(dO * O), dK += scale * dS^T Q and dQ += scale * dS K.
 * Only OSS_BR x OSS_BC tiles of scores exist at any time.
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

/* dst[d * cols + c] = src[c * width + d]: a key tile transposed so that the
 * score loop runs over unit-stride keys. */
static void FN(transpose)(const REAL *src, int64_t cols, int64_t width, REAL *dst) {
  for (int64_t c = 0; c < cols; c++)
    for (int64_t d = 0; d < width; d++) dst[d * cols + c] = src[c * width + d];
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

/* S[r][c] = scale * Q[r] . K[c] for a rows x cols tile (Kt is K transposed),
 * then the causal rule and the mask: hidden scores become -inf, additive
 * mask values are added. */
static void FN(score_tile)(const oss_attention_params *p, int64_t b, int64_t h, int64_t i0, int64_t rows,
                           int64_t j0, int64_t cols, const REAL *Q, const REAL *Kt, REAL *S) {
  const int64_t D = p->head_dim;
  const REAL scale = (REAL)p->scale;
  const int64_t causal_offset = p->causal == OSS_CAUSAL_BOTTOM_RIGHT ? p->len_k - p->len_q : 0;
  for (int64_t r = 0; r < rows; r++) {
    REAL *s = S + r * cols;
    for (int64_t c = 0; c < cols; c++) s[c] = 0;
    for (int64_t d = 0; d < D; d++) {
      const REAL q = Q[r * D + d];
      const REAL *kt = Kt + d * cols;
#pragma omp simd
      for (int64_t c = 0; c < cols; c++) s[c] += q * kt[c];
    }
    for (int64_t c = 0; c < cols; c++) s[c] *= scale;
    const int64_t i = i0 + r;
    if (p->causal != OSS_CAUSAL_NONE)
      for (int64_t c = 0; c < cols; c++)
        if (j0 + c > i + causal_offset) s[c] = -INFINITY;
    if (p->mask_kind != OSS_MASK_NONE) {
      const int64_t mrow = b * p->mask_stride[0] + h * p->mask_stride[1] + i * p->mask_stride[2];
      for (int64_t c = 0; c < cols; c++) {
        const int64_t at = mrow + (j0 + c) * p->mask_stride[3];
        if (p->mask_kind == OSS_MASK_BOOL) {
          if (!((const uint8_t *)p->mask)[at]) s[c] = -INFINITY;
        } else {
          s[c] += FN(mask_value)(p, at);
        }
      }
    }
  }
}

/* Number of keys any of the query rows [i0, i0 + rows) may see under the
 * causal rule (all of them without one). */
static int64_t FN(visible_keys)(const oss_attention_params *p, int64_t i0, int64_t rows) {
  if (p->causal == OSS_CAUSAL_NONE) return p->len_k;
  const int64_t offset = p->causal == OSS_CAUSAL_BOTTOM_RIGHT ? p->len_k - p->len_q : 0;
  int64_t last = i0 + rows - 1 + offset + 1;
  if (last < 0) last = 0;
  return last < p->len_k ? last : p->len_k;
}

/* ---- forward ------------------------------------------------------------------- */

typedef struct FN(attention_task_ctx) {
  const void *params;
  _Atomic int failed;
} FN(attention_task_ctx);

OSS_VECTOR_CLONES
static void FN(attention_fwd_range)(void *vctx, int64_t begin, int64_t end) {
  FN(attention_task_ctx) *ctx = (FN(attention_task_ctx) *)vctx;
  const oss_attention_params *p = (const oss_attention_params *)ctx->params;
  const int64_t D = p->head_dim, Dv = p->head_dim_v, group = p->heads_q / p->heads_kv;
  const int64_t qblocks = (p->len_q + OSS_BR - 1) / OSS_BR;
  REAL *scratch = (REAL *)malloc(sizeof(REAL) * (size_t)(OSS_BR * D + 2 * OSS_BC * D + OSS_BC * Dv +
                                                          OSS_BR * OSS_BC + OSS_BR * Dv + 3 * OSS_BR));
  if (!scratch) {
    ctx->failed = 1;
    return;
  }
  REAL *Q = scratch, *K = Q + OSS_BR * D, *Kt = K + OSS_BC * D, *V = Kt + OSS_BC * D, *S = V + OSS_BC * Dv,
       *O = S + OSS_BR * OSS_BC, *m = O + OSS_BR * Dv, *l = m + OSS_BR, *lse = l + OSS_BR;
  for (int64_t task = begin; task < end; task++) {
    const int64_t b = task / (p->heads_q * qblocks), h = task / qblocks % p->heads_q;
    const int64_t hk = h / group, i0 = task % qblocks * OSS_BR;
    const int64_t rows = p->len_q - i0 < OSS_BR ? p->len_q - i0 : OSS_BR;
    FN(load_rows)(p->q, p->dtype, p->q_stride, b, h, i0, rows, D, Q);
    for (int64_t r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0;
    for (int64_t x = 0; x < rows * Dv; x++) O[x] = 0;
    const int64_t kend = FN(visible_keys)(p, i0, rows);
    for (int64_t j0 = 0; j0 < kend; j0 += OSS_BC) {
      const int64_t cols = kend - j0 < OSS_BC ? kend - j0 : OSS_BC;
      FN(load_rows)(p->k, p->dtype, p->k_stride, b, hk, j0, cols, D, K);
      FN(transpose)(K, cols, D, Kt);
      FN(load_rows)(p->v, p->dtype, p->v_stride, b, hk, j0, cols, Dv, V);
      FN(score_tile)(p, b, h, i0, rows, j0, cols, Q, Kt, S);
      for (int64_t r = 0; r < rows; r++) {
        REAL *s = S + r * cols, *o = O + r * Dv;
        REAL m_new = m[r];
        for (int64_t c = 0; c < cols; c++) m_new = s[c] > m_new ? s[c] : m_new;
        if (m_new == -INFINITY) continue; /* nothing visible to this row yet */
        const REAL alpha = EXP(m[r] - m_new);
        REAL row_sum = 0;
#pragma omp simd reduction(+ : row_sum)
        for (int64_t c = 0; c < cols; c++) {
          s[c] = EXP(s[c] - m_new);
          row_sum += s[c];
        }
        l[r] = l[r] * alpha + row_sum;
        m[r] = m_new;
        for (int64_t d = 0; d < Dv; d++) o[d] *= alpha;
        for (int64_t c = 0; c < cols; c++) {
          const REAL pc = s[c], *vc = V + c * Dv;
#pragma omp simd
          for (int64_t d = 0; d < Dv; d++) o[d] += pc * vc[d];
        }
      }
    }
    for (int64_t r = 0; r < rows; r++) {
      REAL *o = O + r * Dv;
      if (l[r] == 0) { /* fully masked row */
        for (int64_t d = 0; d < Dv; d++) o[d] = 0;
        lse[r] = -INFINITY;
      } else {
        const REAL inv_l = 1 / l[r];
        for (int64_t d = 0; d < Dv; d++) o[d] *= inv_l;
        lse[r] = m[r] + LOG(l[r]);
      }
    }
    FN(store_rows)(p->out, p->dtype, p->out_stride, b, h, i0, rows, Dv, O);
    LSE_T *lse_out = (LSE_T *)p->lse + (b * p->heads_q + h) * p->len_q + i0;
    for (int64_t r = 0; r < rows; r++) lse_out[r] = (LSE_T)lse[r];
  }
  free(scratch);
}

/* ---- backward ------------------------------------------------------------------ */

OSS_VECTOR_CLONES
static void FN(attention_bwd_range)(void *vctx, int64_t begin, int64_t end) {
  FN(attention_task_ctx) *ctx = (FN(attention_task_ctx) *)vctx;
  const oss_attention_backward_params *bp = (const oss_attention_backward_params *)ctx->params;
  const oss_attention_params *p = &bp->fwd;
  const int64_t D = p->head_dim, Dv = p->head_dim_v, group = p->heads_q / p->heads_kv, Lk = p->len_k;
  const size_t tile = (size_t)(OSS_BR * D + OSS_BR * Dv * 2 + OSS_BR * D + OSS_BC * D * 2 + OSS_BC * Dv * 2 +
                               OSS_BR * OSS_BC * 2 + 2 * OSS_BR);
  REAL *scratch = (REAL *)malloc(sizeof(REAL) * (tile + (size_t)(Lk * (D + Dv))));
  if (!scratch) {
    ctx->failed = 1;
    return;
  }
  REAL *Q = scratch, *dO = Q + OSS_BR * D, *O = dO + OSS_BR * Dv, *dQ = O + OSS_BR * Dv,
       *K = dQ + OSS_BR * D, *Kt = K + OSS_BC * D, *V = Kt + OSS_BC * D, *Vt = V + OSS_BC * Dv,
       *P = Vt + OSS_BC * Dv,
       *dS = P + OSS_BR * OSS_BC, *lse = dS + OSS_BR * OSS_BC, *Drow = lse + OSS_BR,
       *dK = Drow + OSS_BR, *dV = dK + Lk * D;
  const REAL scale = (REAL)p->scale;
  for (int64_t task = begin; task < end; task++) {
    const int64_t b = task / p->heads_kv, hk = task % p->heads_kv;
    for (int64_t x = 0; x < Lk * (D + Dv); x++) dK[x] = 0; /* dV follows dK */
    for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
      for (int64_t i0 = 0; i0 < p->len_q; i0 += OSS_BR) {
        const int64_t rows = p->len_q - i0 < OSS_BR ? p->len_q - i0 : OSS_BR;
        FN(load_rows)(p->q, p->dtype, p->q_stride, b, h, i0, rows, D, Q);
        FN(load_rows)(bp->dout, p->dtype, bp->dout_stride, b, h, i0, rows, Dv, dO);
        FN(load_rows)(p->out, p->dtype, p->out_stride, b, h, i0, rows, Dv, O);
        const LSE_T *lse_in = (const LSE_T *)p->lse + (b * p->heads_q + h) * p->len_q + i0;
        for (int64_t r = 0; r < rows; r++) {
          lse[r] = (REAL)lse_in[r];
          REAL s = 0;
          for (int64_t d = 0; d < Dv; d++) s += dO[r * Dv + d] * O[r * Dv + d];
          Drow[r] = s;
        }
        for (int64_t x = 0; x < rows * D; x++) dQ[x] = 0;
        const int64_t kend = FN(visible_keys)(p, i0, rows);
        for (int64_t j0 = 0; j0 < kend; j0 += OSS_BC) {
          const int64_t cols = kend - j0 < OSS_BC ? kend - j0 : OSS_BC;
          FN(load_rows)(p->k, p->dtype, p->k_stride, b, hk, j0, cols, D, K);
          FN(transpose)(K, cols, D, Kt);
          FN(load_rows)(p->v, p->dtype, p->v_stride, b, hk, j0, cols, Dv, V);
          FN(transpose)(V, cols, Dv, Vt);
          FN(score_tile)(p, b, h, i0, rows, j0, cols, Q, Kt, P);
          for (int64_t r = 0; r < rows; r++) {
            REAL *pr = P + r * cols, *dsr = dS + r * cols;
            const REAL *dor = dO + r * Dv;
            if (lse[r] == -INFINITY) { /* fully masked row: no gradient flows */
              for (int64_t c = 0; c < cols; c++) pr[c] = 0, dsr[c] = 0;
              continue;
            }
            for (int64_t c = 0; c < cols; c++) pr[c] = EXP(pr[c] - lse[r]);
            for (int64_t c = 0; c < cols; c++) dsr[c] = 0;
            for (int64_t d = 0; d < Dv; d++) { /* dP = dO V^T */
              const REAL g = dor[d], *vt = Vt + d * cols;
#pragma omp simd
              for (int64_t c = 0; c < cols; c++) dsr[c] += g * vt[c];
            }
            for (int64_t c = 0; c < cols; c++) dsr[c] = pr[c] * (dsr[c] - Drow[r]) * scale;
          }
          for (int64_t r = 0; r < rows; r++) {
            const REAL *pr = P + r * cols, *dsr = dS + r * cols, *dor = dO + r * Dv, *qr = Q + r * D;
            REAL *dqr = dQ + r * D;
            for (int64_t c = 0; c < cols; c++) {
              REAL *dv = dV + (j0 + c) * Dv, *dk = dK + (j0 + c) * D;
              const REAL pc = pr[c], dsc = dsr[c], *kc = K + c * D;
#pragma omp simd
              for (int64_t d = 0; d < Dv; d++) dv[d] += pc * dor[d];
#pragma omp simd
              for (int64_t d = 0; d < D; d++) dk[d] += dsc * qr[d];
#pragma omp simd
              for (int64_t d = 0; d < D; d++) dqr[d] += dsc * kc[d];
            }
          }
        }
        FN(store_rows)(bp->dq, p->dtype, bp->dq_stride, b, h, i0, rows, D, dQ);
      }
    }
    FN(store_rows)(bp->dk, p->dtype, bp->dk_stride, b, hk, 0, Lk, D, dK);
    FN(store_rows)(bp->dv, p->dtype, bp->dv_stride, b, hk, 0, Lk, Dv, dV);
  }
  free(scratch);
}
