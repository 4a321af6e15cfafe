/*
 * softmax_plan.cu - the CUDA softmax planner: from a job's shape, dtypes and
 * alignment, the device's facts and residency answers to a plan (tier, CTA
 * shape, grid, workspace). Host code only; launches nothing and asks the
 * driver nothing itself (residency comes through sm_residency).
 *
 * The tiers and their order are softmax_plan.cuh's table. Each rule below
 * gives its reason; the numbers behind them were measured on the H100 and
 * H200 (% of a device-to-device copy's rate), and the rules keep the faster
 * plan of each pair compared.
 */
#include <string.h>

#include "cuda/softmax/softmax_columns.cuh"
#include "cuda/softmax/softmax_plan.cuh"
#include "cuda/softmax/softmax_rows.cuh"

/* The kernels' register slots per thread for this job (sm_chunk_kreg,
 * sm_warp_kmax: halved where the statistics are double). */
static int sm_job_chunk_kreg(const sm_job *J, bool wide_stats) {
  if (J->bwd) return wide_stats ? sm_chunk_kreg<true, double>() : sm_chunk_kreg<true, float>();
  return wide_stats ? sm_chunk_kreg<false, double>() : sm_chunk_kreg<false, float>();
}
static int sm_job_warp_kmax(const sm_job *J, bool wide_stats) {
  if (J->bwd) return wide_stats ? sm_warp_kmax<true, double>() : sm_warp_kmax<true, float>();
  return wide_stats ? sm_warp_kmax<false, double>() : sm_warp_kmax<false, float>();
}

static size_t sm_dtype_bytes(oss_dtype t) { return t == OSS_FLOAT64 ? 8 : t == OSS_FLOAT32 ? 4 : t == OSS_BOOL ? 1 : 2; }

// ---- rows --------------------------------------------------------------------------

/* The CTA shape holding `need` slots: T threads (a power of two, 64 .. tmax)
 * with K register slots each, the rest in shared memory. */
static void sm_chunk_shape(int64_t need, int64_t tmax, int kreg, int64_t *T, int64_t *K, int64_t *smem_slots) {
  if (need <= tmax * kreg) {
    *T = sm_pow2_ceil(sm_cdiv(need, kreg));
    if (*T < 64) *T = 64;
    *K = sm_cdiv(need, *T);
    *smem_slots = 0;
  } else {
    *T = tmax;
    *K = kreg;
    *smem_slots = need - tmax * kreg;
  }
}

/* CTA size cap of the chunk tier's main pass and of the spread tier: two
 * such CTAs per SM, so one computes while the other moves data. */
enum { SM_MAIN_PASS_THREADS = 512 };

/* Rows whose every row starts a 16-byte slot in each tensor (an 8-byte one
 * for a 16-bit input's 8-byte output slots) and hold a whole number of slots
 * run the row kernels' aligned instantiation: no edge elements, no
 * misaligned-tensor paths and no phase arithmetic, so fewer instructions and
 * instruction-fetch stalls, which bound the narrow rows. Float statistics
 * only: float64 keeps the general kernels. */
static bool sm_rows_aligned(const sm_job *J, int64_t es, int64_t es_out, bool wide_stats) {
  if (wide_stats) return false;
  const int64_t VEC = 16 / es;
  const int64_t A = VEC * es_out < 16 ? VEC * es_out : 16;
  const bool many = J->outer > 1;
  return J->n % VEC == 0 && (uintptr_t)J->a % 16 == 0 && (uintptr_t)J->out % (uintptr_t)A == 0 &&
         (!J->bwd || (uintptr_t)J->b % 16 == 0) && (!many || (J->so_a * es) % 16 == 0) &&
         (!many || (J->so_out * es_out) % A == 0) && (!many || !J->bwd || (J->so_b * es) % 16 == 0);
}

/* The CTA size with which the row-in-CTA tier takes an aligned row of
 * nslots slots of es-byte input; 0: it does not.
 *  - forward: two slots per thread at 128-512 slots, and the 16-bit rows of
 *    1024 slots (512 threads), ahead of the warp tier's 8 slots per lane and
 *    the one-CTA chunk plans; float32 rows of 1024 slots tie and keep the
 *    chunk plan, 1024-thread CTAs lose. One slot per thread loses: each
 *    thread's share of the per-row work (reduction, constants, addresses) is
 *    then spread over too few elements.
 *  - backward: where memory is fast per SM (sm_fast_memory_per_sm) two slots
 *    per thread at 256-1024 slots and one at 64 and 128, ahead of the chunk
 *    and warp kernels; where it is slow the narrower rows lose a little to
 *    those and only 1024 slots take it (float32 at one slot per thread,
 *    which stays ahead of two there).
 * Forward rows of other sizes would leave threads with one slot and keep the
 * other tiers. */
static int64_t sm_cta_row_threads(bool bwd, int64_t es, int64_t nslots, bool fast_memory) {
  if (bwd) {
    if (nslots == 1024) return es == 2 || fast_memory ? 512 : 1024;
    if (!fast_memory) return 0;
    return nslots == 256 || nslots == 512 ? nslots / 2 : nslots == 64 || nslots == 128 ? nslots : 0;
  }
  if (nslots == 1024 && es == 2) return 512;
  return nslots == 128 || nslots == 256 || nslots == 512 ? nslots / SM_CTA_ROW_K : 0;
}

/* SM_TIER_ROW_SPREAD: the fewest CTAs of <= 512 threads and <= `soft` bytes
 * of shared memory (two per SM) that hold the row; false where fewer than
 * two are needed or the GPU cannot hold twice a row's CTAs at once (the tier
 * needs all C of a row resident together). */
static bool sm_plan_spread(const sm_job *J, const oss_device_info *info, const sm_residency *R, int kreg,
                           int64_t nslots, int64_t soft, sm_plan *P) {
  const int64_t stat_bytes = J->ta == OSS_FLOAT64 ? 16 : 8; /* sizeof(sm_stat<Acc>) */
  const int64_t slot_bytes = 16 * (J->bwd ? 2 : 1), tmax = SM_MAIN_PASS_THREADS;
  const int64_t C = sm_cdiv(nslots, tmax * kreg + soft / slot_bytes);
  if (C < 2 || J->outer * C > 0x7fffffff) return false;
  int64_t T, K, smem_slots;
  sm_chunk_shape(sm_cdiv(nslots, C), tmax, kreg, &T, &K, &smem_slots);
  const int per_sm = R->resident(R->row_chunks[P->aligned], 1, (int)T, (size_t)(smem_slots * slot_bytes), 1);
  if (2 * C > (int64_t)per_sm * info->sm_count) return false;
  P->tier = SM_TIER_ROW_SPREAD;
  P->threads = (int)T;
  P->slots_per_thread = (int)K;
  P->ctas_per_row = (int)C;
  P->smem_slots = (int)smem_slots;
  P->chunk_slots = T * K + smem_slots;
  P->grid_x = (unsigned)(J->outer * C);
  P->grid_y = 1;
  P->workspace_bytes = sm_spread_counter_bytes(J->outer) + (size_t)(J->outer * C) * stat_bytes;
  return true;
}

/* The row-in-CTA tier where sm_cta_row_threads (or the row_in_cta knob)
 * gives it the row; false otherwise. */
static bool sm_plan_row_in_cta(const sm_job *J, int64_t es, int64_t nslots, bool fast_memory, sm_plan *P) {
  const int knob = SM_KNOB(row_in_cta);
  const int64_t chosen = sm_cta_row_threads(J->bwd, es, nslots, fast_memory);
  if (knob == 1 || (knob < 2 && chosen == 0)) return false;
  int64_t T = knob >= 64 ? knob
              : knob == 2 ? sm_pow2_ceil(sm_cdiv(nslots, SM_CTA_ROW_K))
              : knob == 3 ? sm_pow2_ceil(nslots)
                          : chosen;
  if (T < 64) T = 64;
  if (T > SM_CHUNK_THREADS || (T & (T - 1)) != 0 || nslots > T * SM_CTA_ROW_K) return false;
  P->tier = SM_TIER_ROW_IN_CTA;
  P->kernel_slots = SM_CTA_ROW_K;
  P->keep_in_l2 = 1;
  P->threads = (int)T;
  P->slots_per_thread = (int)sm_cdiv(nslots, T);
  int64_t ctas = J->outer < 0x7fffffff ? J->outer : 0x7fffffff;
  if (SM_KNOB(rows_at_once) > 0 && SM_KNOB(rows_at_once) < ctas) ctas = SM_KNOB(rows_at_once);
  P->grid_x = (unsigned)ctas;
  P->grid_y = 1;
  return true;
}

/* The warp tier: G lanes per row, K slots per lane. */
static void sm_plan_warp(const sm_job *J, int64_t es, int wkmax, int64_t nslots, sm_plan *P) {
  const bool bwd = J->bwd;
  /* slots per lane aimed at: the light kernel's (half of wkmax: fewer
   * registers, more warps resident) for the narrowest rows. The backward
   * has a light kernel for aligned rows only (sm_warp_kernel_for). */
  const bool light_bwd = bwd && P->aligned;
  const int64_t km = bwd ? (light_bwd && nslots <= 32 * (wkmax / 2) ? wkmax / 2 : wkmax)
                         : (es == 2 ? (nslots <= 64 ? wkmax / 2 : wkmax) : (nslots <= 128 ? wkmax / 2 : wkmax));
  int64_t G = sm_pow2_ceil(sm_cdiv(nslots, km));
  if (G > 32) G = 32;
  P->tier = SM_TIER_WARP;
  P->keep_in_l2 = 1; /* a row on one CTA: see sm_plan_rows */
  P->lanes_per_row = (int)G;
  P->slots_per_thread = (int)sm_cdiv(nslots, G);
  P->kernel_slots = P->slots_per_thread <= wkmax / 2 && (!bwd || light_bwd) ? wkmax / 2 : wkmax;
  P->rows_per_lane = 1;
  if (bwd && P->kernel_slots == wkmax) P->aligned = 0; /* the general instantiation (sm_warp_kernel_for) */
  /* aligned forward rows of a power-of-two number of slots up to 16, or of
   * at most 4: G = the row's slots rounded up to a power of two, at most 8,
   * and K = 1 or 2 slots of each of wkmax / 2 / K rows per lane, so that
   * each load instruction of a warp covers whole 128-byte lines of
   * consecutive rows instead of 16-64 bytes of each of 32 / G rows. Rows of
   * other widths would leave lanes idle and keep a row per lane group. */
  const int lanes_knob = SM_KNOB(warp_lanes_per_row);
  const bool lanes_forced = lanes_knob >= 2 && lanes_knob <= 16 && (lanes_knob & (lanes_knob - 1)) == 0;
  const int64_t lanes = lanes_forced ? lanes_knob : 8;
  if (!bwd && es != 8 && P->aligned && nslots <= 16 && (nslots <= 4 || (nslots & (nslots - 1)) == 0 || lanes_forced) &&
      P->kernel_slots == wkmax / 2 && lanes_knob != 1) {
    const int64_t rg = sm_pow2_ceil(nslots) < lanes ? sm_pow2_ceil(nslots) : lanes, rk = sm_cdiv(nslots, rg);
    if (rk <= wkmax / 4) {
      P->lanes_per_row = (int)rg;
      P->slots_per_thread = (int)rk;
      P->rows_per_lane = (int)(wkmax / 2 / rk);
    }
  }
  P->threads = SM_WARP_THREADS;
  /* one CTA per group of rows, as many CTAs as that takes: a grid capped at
   * a few CTAs per SM that loop over rows streams slower */
  const int64_t rows_per_cta = P->threads / 32 * (32 / P->lanes_per_row) * P->rows_per_lane;
  const int64_t blocks = sm_cdiv(J->outer, rows_per_cta);
  const int64_t cap = SM_KNOB(rows_at_once) > 0 ? SM_KNOB(rows_at_once) : 0x7fffffff;
  P->grid_x = (unsigned)(blocks < cap ? blocks : cap);
  P->grid_y = 1;
}

static oss_status sm_plan_rows(const sm_job *J, const oss_device_info *info, const sm_residency *R, sm_plan *P) {
  const bool bwd = J->bwd, wide_stats = J->ta == OSS_FLOAT64;
  const int64_t es = (int64_t)sm_dtype_bytes(J->ta), VEC = 16 / es;
  const int kreg = sm_job_chunk_kreg(J, wide_stats), wkmax = sm_job_warp_kmax(J, wide_stats);
  const int64_t stat_bytes = wide_stats ? 16 : 8; /* sizeof(sm_stat<Acc>) */
  P->aligned = sm_rows_aligned(J, es, (int64_t)sm_dtype_bytes(J->tout), wide_stats);
  /* worst-case misalignment of a row: constant when every row shifts by a
   * multiple of 16 bytes, else up to VEC - 1 */
  int64_t ph = (int64_t)(((uintptr_t)J->a / es) % VEC);
  if (J->outer > 1 && (J->so_a * es) % 16 != 0) ph = VEC - 1;
  const int64_t nslots = (ph + J->n + VEC - 1) / VEC;
  const int64_t rows_cap = SM_KNOB(rows_at_once);
  const int force = SM_KNOB(force_tier);
  const bool fast_memory = sm_fast_memory_per_sm(info);

  if (!wide_stats && P->aligned && force == 0 && sm_plan_row_in_cta(J, es, nslots, fast_memory, P)) return OSS_OK;

  /* warp tier: rows up to 32 lanes x wkmax slots (float64: under that) */
  const int64_t warp_max = es == 8 ? 32 * wkmax - 1 : 32 * wkmax;
  if ((nslots <= warp_max && force == 0) || (nslots <= 32 * wkmax && force == SM_FORCE_WARP)) {
    sm_plan_warp(J, es, wkmax, nslots, P);
    return OSS_OK;
  }

  /* One CTA, or a cluster of up to 16 (sm_90), in up to three passes:
   *  0. a forward row that needs more than one CTA of pass 1: clusters of
   *     256-thread CTAs with <= 48 KB of shared memory, four per SM (ahead of
   *     pass 1's clusters on wide rows; the backward and 128-thread CTAs
   *     lose with them);
   *  1. CTAs of <= 512 threads with <= 100 KB of shared memory, two per SM,
   *     so one computes while the other moves data;
   *  2. the spread tier (rows too wide for a cluster of pass 1: it beats
   *     1024-thread CTAs, of which few clusters fit, but loses to pass 1's
   *     clusters, its exchange going through L2), then one CTA of up to 1024
   *     threads per SM with up to all of its shared memory.
   * Each pass tries clusters of C = 1, 2, 4, ... and takes the first shape
   * that fits its limits and can be resident. */
  const int64_t slot_bytes = 16 * (bwd ? 2 : 1);
  const int64_t static_smem = 2048;
  const int64_t soft = 100 * 1024, spread_soft = 64 * 1024;
  const int64_t hard = (int64_t)info->max_smem_per_block_optin - static_smem;
  const int64_t tmax_hard = wide_stats ? SM_CHUNK_THREADS / 2 : SM_CHUNK_THREADS;
  const int cmax = info->cc_major >= 9 ? 16 : 1;
  const void *kern = R->row_chunks[P->aligned];
  if (force == SM_FORCE_SPREAD && sm_plan_spread(J, info, R, kreg, nslots, spread_soft, P)) return OSS_OK;
  const int64_t quarter_threads = 256, quarter_soft = 48 * 1024;
  const bool quarter_cluster = !bwd && !wide_stats && nslots > SM_MAIN_PASS_THREADS * kreg + soft / slot_bytes;
  /* register slots per thread aimed at: a backward row that fits 256
   * threads x 2 slots takes twice the threads of kreg slots each (more
   * loads in flight per row); 512 threads x 2 would leave two such CTAs per
   * SM too few loads in flight */
  const int slots_aim = bwd && kreg > 2 && nslots <= 256 * 2 ? 2 : kreg;
  /* a backward row of 3/4 to all of 1024 x kreg register slots: one
   * 1024-thread CTA per SM holding it in registers, ahead of two 512-thread
   * CTAs with a shared-memory part. Rows that fill less of it lose, and so
   * do misaligned rows (the general kernel) and the forward. It starts at
   * pass 2, whose first shape is that CTA. */
  const bool backward_1024 = bwd && P->aligned && tmax_hard == 1024 && slots_aim == kreg && force == 0 &&
                             SM_KNOB(no_backward_1024) != 1 && 4 * nslots >= 3 * 1024 * kreg &&
                             nslots <= 1024 * kreg && R->resident(kern, 1, 1024, 0, 1) >= 1;
  for (int pass = quarter_cluster ? 0 : backward_1024 ? 2 : 1; pass < 3 && force != SM_FORCE_SPLIT && force != SM_FORCE_SPREAD;
       pass++) {
    if (pass == 2 && force == 0 && !backward_1024 && sm_plan_spread(J, info, R, kreg, nslots, spread_soft, P))
      return OSS_OK;
    const int64_t limit = pass == 0 ? quarter_soft : pass == 1 ? soft : hard;
    const int64_t tmax = pass == 0 ? quarter_threads : pass == 1 ? SM_MAIN_PASS_THREADS : tmax_hard;
    for (int C = pass == 0 ? 2 : 1; C <= cmax; C *= 2) {
      if ((force == SM_FORCE_ONE_CTA && C > 1) || (force == SM_FORCE_CLUSTER && C == 1)) continue;
      int64_t T, K, smem_slots;
      sm_chunk_shape(sm_cdiv(nslots, C), tmax, slots_aim, &T, &K, &smem_slots);
      const int64_t bytes = smem_slots * slot_bytes;
      if (bytes > limit) continue;
      if ((C > 1 || bytes > 40 * 1024 || T > 512) && R->resident(kern, C, (int)T, (size_t)bytes, 1) < 1) continue;
      P->tier = SM_TIER_ROW_CHUNKS;
      /* a one-CTA plan of registers only (aligned, float statistics) runs
       * the row-in-CTA kernel in the same shape: the same data path without
       * the modes, the shared-memory part and the runtime log. Above 2 slots
       * per thread its instantiation with the chunk kernel's register budget
       * (kreg); at <= 2 (backward only) its light footprint, where the memory
       * is fast per SM or the CTA's slots are not all filled (on the H100 a
       * full CTA keeps the chunk kernel, slightly ahead). */
      if (C == 1 && smem_slots == 0 && (K > SM_CTA_ROW_K || (bwd && (fast_memory || T * K != nslots))) && P->aligned &&
          !wide_stats && force == 0) {
        P->tier = SM_TIER_ROW_IN_CTA;
        P->kernel_slots = K > SM_CTA_ROW_K ? kreg : SM_CTA_ROW_K;
      }
      /* backward clusters of 16 run the general kernel (aligned, they lose
       * against it; clusters of 8 tie). Same registers and shared memory, so
       * the residency checked above holds. */
      if (bwd && C == 16) P->aligned = 0;
      /* the L2 evict_last policy on the input where a row is on one CTA:
       * the warp, row-in-CTA and one-CTA plans gain with it; clusters and
       * the spread tier lose, the split tier is neutral */
      P->keep_in_l2 = C == 1;
      P->threads = (int)T;
      P->slots_per_thread = (int)K;
      P->ctas_per_row = C;
      P->smem_slots = (int)smem_slots;
      P->chunk_slots = T * K + smem_slots;
      /* one CTA (cluster) per row, every row in grid.x: rows in grid.y,
       * capped at 65,535, made CTAs loop over rows and streamed slower */
      int64_t rows_at_once = 0x7fffffff / C;
      if (rows_cap > 0 && rows_cap < rows_at_once) rows_at_once = rows_cap;
      if (J->outer < rows_at_once) rows_at_once = J->outer;
      P->grid_x = (unsigned)(C * rows_at_once);
      P->grid_y = 1;
      return OSS_OK;
    }
  }

  /* split: chunks of 256 threads x kreg slots (four CTAs per SM),
   * statistics in the workspace */
  const int64_t split_threads = 256, chunk = split_threads * kreg;
  const int64_t split_ymax = rows_cap > 0 ? rows_cap : 65535;
  P->tier = SM_TIER_ROW_SPLIT;
  P->threads = (int)split_threads;
  P->slots_per_thread = kreg;
  P->chunk_slots = chunk;
  P->chunks = sm_cdiv(nslots, chunk);
  if (P->chunks > 0x7fffffff)
    return oss_fail(OSS_ERROR_NOT_SUPPORTED, "softmax: a row of %lld elements is too long", (long long)J->n);
  P->ctas_per_row = (int)P->chunks;
  P->grid_x = (unsigned)P->chunks;
  P->grid_y = (unsigned)(J->outer < split_ymax ? J->outer : split_ymax);
  P->workspace_bytes = (size_t)(J->outer * P->chunks + J->outer) * stat_bytes;
  return OSS_OK;
}

// ---- columns -----------------------------------------------------------------------

/* The columns kernel's CTA size for a tile of `bytes`: 256 threads, or 512
 * (float statistics only: double's static shared memory would not fit beside
 * it) when the tile leaves room for no second CTA on the SM, which would
 * otherwise hide the statistics behind its loads. */
static int sm_col_threads(int64_t bytes, bool wide_stats, const oss_device_info *info) {
  const int k = SM_KNOB(column_threads);
  if (k == SM_COL_THREADS || (k == SM_COL_THREADS_WIDE && !wide_stats)) return k;
  return !wide_stats && bytes > info->max_smem_per_sm / 2 - 8 * 1024 ? SM_COL_THREADS_WIDE : SM_COL_THREADS;
}

/* The most bytes of a column tile per CTA in the sm_90 cluster plans */
enum { SM_COL_CLUSTER_BYTES = 64 * 1024 };

static oss_status sm_plan_cols(const sm_job *J, const oss_device_info *info, const sm_residency *R, sm_plan *P) {
  const bool bwd = J->bwd, wide_stats = J->ta == OSS_FLOAT64;
  const int64_t es = (int64_t)sm_dtype_bytes(J->ta), es2 = (int64_t)sm_dtype_bytes(J->tout), NA = bwd ? 2 : 1;
  const int64_t VEC = 16 / es, A2 = VEC * es2 < 16 ? VEC * es2 : 16;
  const int64_t stat_bytes = wide_stats ? 16 : 8; /* sizeof(sm_stat<Acc>) */
  /* 16-byte pieces are aligned for every (outer, row) when the strides are
   * multiples of 16 bytes; the tile grid then follows the base's misalignment */
  P->vector_a = (J->sn_a * es) % 16 == 0 && (J->outer == 1 || (J->so_a * es) % 16 == 0);
  P->column_phase = P->vector_a ? (int)(((uintptr_t)J->a / es) % VEC) : 0;
  const int ph = P->column_phase;
  P->vector_b = !bwd || (P->vector_a && (J->sn_b * es) % 16 == 0 && (J->outer == 1 || (J->so_b * es) % 16 == 0) &&
                         (int)(((uintptr_t)J->b / es) % VEC) == ph);
  P->vector_out = (J->sn_out * es2) % A2 == 0 && (J->outer == 1 || (J->so_out * es2) % A2 == 0) &&
                  (((uintptr_t)J->out - (uintptr_t)ph * es2) % A2) == 0;

  /* tile width: 64-byte row segments, wider (up to 256 columns) while the
   * tile is small, narrower when inner is. 32-byte segments only where a
   * 64-byte tile cannot be held at all: they stream markedly slower. */
  const int64_t span = sm_pow2_ceil(J->inner + ph);
  int64_t TJ = 64 / es;
  if (span < TJ) TJ = span < VEC ? VEC : span;
  while (TJ < SM_COL_THREADS && TJ * 2 <= span && J->n * TJ * es * NA < 16 * 1024) TJ *= 2;
  const int64_t soft = 72 * 1024;
  const int64_t hard = (int64_t)info->max_smem_per_block_optin - 16 * 1024;
  const int64_t ymax = SM_KNOB(rows_at_once) > 0 ? SM_KNOB(rows_at_once) : 65535;
  const unsigned grid_y1 = (unsigned)(J->outer < ymax ? J->outer : ymax);
  const int cforce = SM_KNOB(column_cluster);
  /* sm_90: the fewest CTAs c (a power of two in [cmin, cmax], a cluster
   * where c > 1) that share a tile of tj columns with at most `limit` bytes
   * of it each (with the column_cluster knob: c = that, up to `hard`); 0
   * where none can run */
  const auto fit = [&](int64_t tj, int64_t limit, int cmin, int cmax) -> int {
    for (int c = cmin; c <= cmax; c *= 2) {
      const int64_t per = sm_cdiv(J->n, c) * tj * es * NA;
      if (cforce ? c != cforce : per > limit) continue;
      if (per > hard || sm_cdiv(J->inner + ph, tj) * c > 0x7fffffff) continue;
      if (c == 1) return 1;
      const int threads = sm_col_threads(per, wide_stats, info);
      const size_t xch = (size_t)c * 2 * tj * stat_bytes;
      if (R->resident(R->columns[threads == SM_COL_THREADS_WIDE], c, threads, (size_t)per + xch, grid_y1) >= 1)
        return c;
    }
    return 0;
  };
  /* On sm_90 a cluster shares the tile by rows, so the segments can be 128
   * bytes with at most SM_COL_CLUSTER_BYTES of the tile per CTA, in clusters
   * of up to 8 CTAs (16-bit: 4, whose tiles hold twice the elements per
   * byte); larger clusters of 128-byte segments lose to 64-byte segments.
   * Failing that, 64-byte segments in clusters of up to 16 with <=
   * SM_COL_CLUSTER_BYTES each, then clusters of 16 with up to `hard`: they
   * hold what one CTA cannot. Else one CTA or the split path below. */
  int C = 0;
  if (info->cc_major >= 9 && SM_KNOB(column_chunk_rows) == 0) {
    int64_t wide = TJ;
    while (wide * es < 128 && wide * 2 <= span && wide * 2 <= SM_COL_THREADS) wide *= 2;
    if ((C = fit(wide, SM_COL_CLUSTER_BYTES, 1, cforce ? 16 : es == 2 ? 4 : 8)) != 0) {
      TJ = wide;
      /* the L2 evict_last policy on these clusters' input: they gain with
       * it, the other column plans (64-byte segments, clusters of 16, one
       * CTA) lose or tie */
      P->keep_in_l2 = C > 1 && wide * es == 128;
    } else if (wide == TJ || (C = fit(TJ, SM_COL_CLUSTER_BYTES, 1, 16)) == 0) {
      C = fit(TJ, hard, 16, 16);
    }
  }
  if (C == 0) C = 1;
  int64_t chunk_n = sm_cdiv(J->n, C);
  if (C == 1) {
    if (J->n * TJ * es * NA > hard && TJ * es > 32 && J->n * (TJ / 2) * es * NA <= hard) TJ /= 2; /* 32-byte segments */
    if (J->n * TJ * es * NA > hard) chunk_n = soft / (TJ * es * NA);
    if (SM_KNOB(column_chunk_rows) > 0 && SM_KNOB(column_chunk_rows) < chunk_n) chunk_n = SM_KNOB(column_chunk_rows);
  }
  P->tile_columns = (int)TJ;
  P->ctas_per_row = C;
  P->chunk_rows = chunk_n;
  P->chunks = C > 1 ? 1 : sm_cdiv(J->n, chunk_n);
  P->tier = P->chunks == 1 ? SM_TIER_COLUMNS : SM_TIER_COLUMNS_SPLIT;
  const int64_t xch_bytes = C > 1 ? C * 2 * TJ * stat_bytes : 0; /* cluster exchange */
  P->smem_slots = (int)(chunk_n * (TJ / VEC) * NA + (xch_bytes + 15) / 16);
  P->threads = sm_col_threads(chunk_n * TJ * es * NA, wide_stats, info);
  if (P->tier == SM_TIER_COLUMNS_SPLIT)
    P->workspace_bytes = (size_t)(J->outer * J->inner * (P->chunks + 1)) * stat_bytes;
  const int64_t tiles_c = sm_cdiv(J->inner + ph, TJ) * C;
  if (tiles_c > 0x7fffffff)
    return oss_fail(OSS_ERROR_NOT_SUPPORTED, "softmax: inner=%lld is too large", (long long)J->inner);
  P->grid_x = (unsigned)tiles_c;
  const int64_t pairs = J->outer * P->chunks;
  P->grid_y = (unsigned)(pairs < ymax ? pairs : ymax);
  return OSS_OK;
}

oss_status sm_choose_plan(const sm_job *J, const oss_device_info *info, const sm_residency *R, sm_plan *P) {
  memset(P, 0, sizeof *P);
  const oss_status s = J->inner == 1 ? sm_plan_rows(J, info, R, P) : sm_plan_cols(J, info, R, P);
  P->workspace_bytes = (P->workspace_bytes + 15) & ~(size_t)15;
  return s;
}
