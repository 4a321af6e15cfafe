/*
 * softmax_launch.cu - runs a softmax plan (softmax_plan.cuh): picks each tier's
 * kernel instantiation for the job's dtypes, fills its arguments and launches
 * it on the caller's stream, and answers the planner's residency questions.
 *
 * Launch rules: the caller's stream only; no synchronisation, no allocation
 * (the split and spread tiers use the caller's workspace, sized by the
 * plan); a launch check after every launch. Every kernel instantiation of the
 * CUDA softmax is compiled in this file.
 */
#include <pthread.h>
#include <string.h>

#include "cuda/softmax/softmax_columns.cuh"
#include "cuda/softmax/softmax_plan.cuh"
#include "cuda/softmax/softmax_rows.cuh"

// ---- residency ----------------------------------------------------------------------

/* The launch configuration of a grid in clusters of C CTAs along x (sm_90),
 * shared by the residency query and the launch; cfg points at attr, so the
 * struct is used where it was initialised, never copied. Allows cluster
 * sizes above 8 on kern first. */
typedef struct {
  cudaLaunchConfig_t cfg;
  cudaLaunchAttribute attr;
} sm_cluster_config;

static cudaError_t sm_cluster_config_init(sm_cluster_config *L, const void *kern, int C, dim3 grid, dim3 block,
                                          size_t smem, cudaStream_t stream) {
  memset(L, 0, sizeof *L);
  L->attr.id = cudaLaunchAttributeClusterDimension;
  L->attr.val.clusterDim.x = (unsigned)C;
  L->attr.val.clusterDim.y = 1;
  L->attr.val.clusterDim.z = 1;
  L->cfg.gridDim = grid;
  L->cfg.blockDim = block;
  L->cfg.dynamicSmemBytes = smem;
  L->cfg.stream = stream;
  L->cfg.attrs = &L->attr;
  L->cfg.numAttrs = 1;
  return C > 8 ? cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) : cudaSuccess;
}

/* Sets the attributes a configuration needs and asks the driver how many of
 * it can be resident at once (sm_residency in softmax_plan.cuh). */
static int sm_residency_uncached(const void *kern, int C, int threads, size_t smem, unsigned grid_y,
                                 cudaStream_t stream) {
  if (smem > 40 * 1024 &&
      cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (C == 1) {
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kern, threads, smem) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return blocks;
  }
  sm_cluster_config L;
  int clusters = 0;
  if (sm_cluster_config_init(&L, kern, C, dim3((unsigned)C, grid_y, 1), dim3((unsigned)threads, 1, 1), smem, stream) !=
          cudaSuccess ||
      cudaOccupancyMaxActiveClusters(&clusters, kern, &L.cfg) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return clusters;
}

/* Remembered residency answers, per device: the planner asks the same few
 * questions on every call, and each costs the driver microseconds of host
 * time. The launches set the attributes they need themselves, so a
 * remembered answer skips nothing they rely on. A set-associative table: a
 * key hashes to one set of SM_RESIDENCY_WAYS entries, and a new answer
 * replaces the set's oldest, so a lookup costs a few compares and a process
 * whose shapes change keeps its recent answers. */
typedef struct sm_residency_entry {
  const void *kern; /* NULL: an empty entry */
  int device, C, threads;
  size_t smem;
  unsigned grid_y;
  int answer;
} sm_residency_entry;
enum { SM_RESIDENCY_SETS = 256, SM_RESIDENCY_WAYS = 8 };
static sm_residency_entry sm_residency_cache[SM_RESIDENCY_SETS][SM_RESIDENCY_WAYS];
static unsigned char sm_residency_oldest[SM_RESIDENCY_SETS];
static pthread_mutex_t sm_residency_lock = PTHREAD_MUTEX_INITIALIZER;

static bool sm_residency_same(const sm_residency_entry *e, const sm_residency_entry *k) {
  return e->kern == k->kern && e->device == k->device && e->C == k->C && e->threads == k->threads &&
         e->smem == k->smem && e->grid_y == k->grid_y;
}

static unsigned sm_residency_set(const sm_residency_entry *k) {
  uint64_t h = (uint64_t)(uintptr_t)k->kern;
  const uint64_t fields[5] = {(uint64_t)k->device, (uint64_t)k->C, (uint64_t)k->threads, (uint64_t)k->smem,
                              (uint64_t)k->grid_y};
  for (int i = 0; i < 5; i++) h = (h ^ fields[i]) * 0x9E3779B97F4A7C15ull;
  return (unsigned)(h >> 40) % SM_RESIDENCY_SETS;
}

/* How many of a configuration can be resident at once: CTAs per SM for C ==
 * 1, clusters on the GPU for C > 1; 0 where it cannot run. */
static int sm_residency_of(const void *kern, int C, int threads, size_t smem, unsigned grid_y, cudaStream_t stream) {
  sm_residency_entry key;
  memset(&key, 0, sizeof key);
  key.kern = kern;
  key.C = C;
  key.threads = threads;
  key.smem = smem;
  key.grid_y = grid_y;
  if (cudaGetDevice(&key.device) != cudaSuccess) {
    cudaGetLastError();
    return sm_residency_uncached(kern, C, threads, smem, grid_y, stream);
  }
  const unsigned set = sm_residency_set(&key);
  sm_residency_entry *ways = sm_residency_cache[set];
  pthread_mutex_lock(&sm_residency_lock);
  for (int i = 0; i < SM_RESIDENCY_WAYS; i++)
    if (sm_residency_same(&ways[i], &key)) {
      const int answer = ways[i].answer;
      pthread_mutex_unlock(&sm_residency_lock);
      return answer;
    }
  pthread_mutex_unlock(&sm_residency_lock);
  key.answer = sm_residency_uncached(kern, C, threads, smem, grid_y, stream);
  pthread_mutex_lock(&sm_residency_lock);
  bool present = false; /* another thread may have added it meanwhile */
  for (int i = 0; i < SM_RESIDENCY_WAYS && !present; i++) present = sm_residency_same(&ways[i], &key);
  if (!present) {
    ways[sm_residency_oldest[set]] = key;
    sm_residency_oldest[set] = (unsigned char)((sm_residency_oldest[set] + 1) % SM_RESIDENCY_WAYS);
  }
  pthread_mutex_unlock(&sm_residency_lock);
  return key.answer;
}

/* The planner's question (it plans on no stream). */
static int sm_plan_residency(const void *kern, int C, int threads, size_t smem, unsigned grid_y) {
  return sm_residency_of(kern, C, threads, smem, grid_y, NULL);
}

// ---- kernel instantiations ------------------------------------------------------------

typedef void (*sm_row_kernel)(sm_row_args);
typedef void (*sm_col_kernel)(sm_col_args);

template <bool BWD, typename T1, typename T2, typename Acc> static sm_row_kernel sm_chunks_kernel_for(int aligned) {
  if constexpr (sizeof(Acc) == 4)
    if (aligned) return softmax_row_chunks_kernel<BWD, T1, T2, Acc, true>;
  return softmax_row_chunks_kernel<BWD, T1, T2, Acc, false>;
}

/* The warp kernel for km slots per lane and rl rows per lane: the light
 * variant (half of sm_warp_kmax, more CTAs resident) up to its size. The
 * backward's full kernel runs the general instantiation: aligned, the
 * compiler gave each slot's loads a branch and recomputed their addresses,
 * which streamed slower. The backward's light kernel exists aligned only:
 * general, it spills at its register budget. */
template <bool BWD, typename T1, typename T2, typename Acc>
static sm_row_kernel sm_warp_kernel_for(int aligned, int km, int rl) {
  constexpr int WK = sm_warp_kmax<BWD, Acc>(), WL = WK / 2;
  if constexpr (sizeof(Acc) == 4) {
    if constexpr (!BWD) {
      if (aligned && rl == WL) return softmax_rows_in_warp_kernel<BWD, T1, T2, Acc, WL, true, WL>;
      if (aligned && rl == WL / 2) return softmax_rows_in_warp_kernel<BWD, T1, T2, Acc, WL, true, WL / 2>;
    }
    if (aligned && km <= WL) return softmax_rows_in_warp_kernel<BWD, T1, T2, Acc, WL, true, 1>;
    if constexpr (!BWD)
      if (aligned) return softmax_rows_in_warp_kernel<BWD, T1, T2, Acc, WK, true, 1>;
  }
  if constexpr (!BWD)
    if (km <= WL) return softmax_rows_in_warp_kernel<BWD, T1, T2, Acc, WL, false, 1>;
  return softmax_rows_in_warp_kernel<BWD, T1, T2, Acc, WK, false, 1>;
}

/* The row-in-CTA kernel with km register slots per thread: the light
 * footprint (SM_CTA_ROW_K slots) or the chunk kernel's register budget.
 * Float statistics only; NULL for float64, which never plans it. */
template <bool BWD, typename T1, typename T2, typename Acc> static sm_row_kernel sm_cta_row_kernel_for(int km) {
  if constexpr (sizeof(Acc) == 4) {
    if (km <= SM_CTA_ROW_K) return softmax_row_in_cta_kernel<BWD, T1, T2, Acc, SM_CTA_ROW_K>;
    return softmax_row_in_cta_kernel<BWD, T1, T2, Acc, sm_chunk_kreg<BWD, Acc>()>;
  }
  return NULL;
}

/* The columns kernel for a CTA size (float64 statistics: 256 only). */
template <bool BWD, typename T1, typename T2, typename Acc> static sm_col_kernel sm_columns_kernel_for(int threads) {
  if constexpr (sizeof(Acc) == 4)
    if (threads == SM_COL_THREADS_WIDE) return softmax_columns_kernel<BWD, T1, T2, Acc, SM_COL_THREADS_WIDE>;
  return softmax_columns_kernel<BWD, T1, T2, Acc, SM_COL_THREADS>;
}

// ---- launch helpers -------------------------------------------------------------------

/* Launches kern in clusters of C CTAs along grid x (sm_90). */
template <typename Args>
static oss_status sm_launch_clusters(void (*kern)(Args), dim3 grid, dim3 block, size_t smem, int C, cudaStream_t stream,
                                     Args A, const char *name) {
  sm_cluster_config L;
  OSS_CUDA_TRY(sm_cluster_config_init(&L, (const void *)kern, C, grid, block, smem, stream));
  cudaError_t err = cudaLaunchKernelEx(&L.cfg, kern, A);
  if (err != cudaSuccess)
    return oss_fail(OSS_ERROR_CUDA, "launch of %s (cluster of %d) failed: %s", name, C, cudaGetErrorString(err));
  return oss_check_launch(name);
}

/* The split tiers' merge of partial statistics, behind their SM_STATS pass. */
template <bool BWD, typename Acc>
static oss_status sm_launch_merge(const void *part, void *fin, int64_t items, int64_t inner, int64_t nchunks,
                                  const oss_device_info *info, cudaStream_t stream) {
  /* rows: a warp per row, or the whole CTA where a row has more than 4
   * partials per lane of a warp */
  const int G = inner > 1 ? 1 : nchunks > 4 * 32 ? SM_MERGE_THREADS : 32;
  const int64_t per_block = SM_MERGE_THREADS / G;
  int64_t blocks = sm_cdiv(items, per_block);
  const int64_t cap = (int64_t)info->sm_count * 8;
  if (blocks > cap) blocks = cap;
  return oss_launch_dependent(softmax_merge_partials_kernel<BWD, Acc>, dim3((unsigned)blocks), dim3(SM_MERGE_THREADS), 0,
                             stream, info, "softmax_merge_partials_kernel", (const sm_stat<Acc> *)part,
                             (sm_stat<Acc> *)fin, items, inner, nchunks, G);
}

/* Which units (rows; outer indices for the columns kernel) of `units`, each
 * `unit_bytes` of input, get their input lines set back to evict_normal after
 * their output where the loads carry evict_last: [*lo, *hi), the last ones,
 * as many as hold a third of the L2's size of input. The L2 keeps only the
 * latest few MB of evict_last lines, newer ones displacing older ones, so
 * only the lines loaded last can still be there when the call ends: releasing
 * those leaves none above normal priority for whatever runs next. Each
 * release costs L2 traffic, so the window is no longer than that needs
 * (releasing every row streams slower). */
static void sm_release_window(int64_t units, int64_t unit_bytes, const oss_device_info *info, int64_t *lo,
                              int64_t *hi) {
  int64_t window = info->l2_bytes / 3;
  if (SM_KNOB(release_window_mib) > 0) window = (int64_t)SM_KNOB(release_window_mib) << 20;
  const int64_t count = sm_cdiv(window, unit_bytes > 0 ? unit_bytes : 1);
  *lo = 0;
  *hi = units;
  if (count >= units) return;
  if (SM_KNOB(release_first) == 1) *hi = count;
  else *lo = units - count;
}

/* The first wave's ramp, for the chunk kernel's rows and the row-in-CTA
 * kernel's chunk-budget rows. A launch's first wave of rows (one per CTA or
 * cluster, as many as are resident at once: wave_rows) would start together,
 * read together and write together, and the later waves inherit that
 * lockstep: the DRAM sees reads, a pause, then writes, wave after wave.
 * Instead row r < wave_rows starts r steps late, a step being `percent` % of
 * the time the DRAM takes to stream one row's input at 85 % of its peak
 * (about what a copy reaches), so the first wave's reads and writes
 * interleave from then on. Only where the launch has more rows than one
 * wave: a single wave has no later waves to gain from it. */
static void sm_first_wave_ramp(sm_row_args *A, int64_t wave_rows, int64_t row_in_bytes, const oss_device_info *info,
                               int percent) {
  if (info->dram_bytes_per_ns <= 0 || wave_rows < 2 || A->rows <= wave_rows) return;
  const double step = (double)row_in_bytes / (0.85 * info->dram_bytes_per_ns) * percent / 100;
  if (step < 1) return;
  A->ramp_ns = step > 100000 ? 100000 : (int)step;
  A->ramp_rows = wave_rows;
}

// ---- rows -----------------------------------------------------------------------------

/* The arguments both kernel families take from the job (sm_row_args,
 * sm_col_args), the rest zeroed. */
template <typename Args> static void sm_args_from_job(Args *A, const sm_job *J) {
  memset(A, 0, sizeof *A);
  A->a = J->a;
  A->b = J->b;
  A->out = J->out;
  A->so_a = J->so_a;
  A->so_b = J->so_b;
  A->so_out = J->so_out;
  A->n = J->n;
  A->log = J->log;
}

template <bool BWD, typename T1, typename T2, typename Acc>
static oss_status sm_launch_rows(const sm_job *J, const sm_plan *P, void *ws, const oss_device_info *info,
                                 cudaStream_t stream) {
  sm_row_args A;
  sm_args_from_job(&A, J);
  A.rows = J->outer;
  A.keep = P->keep_in_l2 ? 1 : 0;
  A.release_lo = 0;
  A.release_hi = J->outer;
  /* the warp tier releases every row where memory is slow per SM (the H100):
   * after an L2 flush by a write it streams a little faster than with the
   * window; where memory is fast per SM (the H200) the release requests of
   * every row cost the narrow rows far more than they gain, so the window */
  const bool every_row = P->tier == SM_TIER_WARP && !sm_fast_memory_per_sm(info);
  if (A.keep == 1 && (!every_row || SM_KNOB(release_window_mib) > 0))
    sm_release_window(J->outer, J->n * (int64_t)sizeof(T1) * (BWD ? 2 : 1), info, &A.release_lo, &A.release_hi);
  /* the kernels shift where they would divide by these (softmax_rows.cuh) */
  const int threads = P->threads, G = P->lanes_per_row, C = P->ctas_per_row, K = P->slots_per_thread;
  const bool pow2 = P->tier == SM_TIER_WARP         ? (G & (G - 1)) == 0
                    : P->tier == SM_TIER_ROW_IN_CTA ? (threads & (threads - 1)) == 0 && K <= P->kernel_slots
                                                    : (threads & (threads - 1)) == 0 &&
                                                          (P->tier != SM_TIER_ROW_CHUNKS || (C & (C - 1)) == 0);
  if (!pow2)
    return oss_fail(OSS_ERROR_NOT_SUPPORTED, "softmax: internal plan error (threads=%d G=%d C=%d K=%d)", threads, G,
                    C, K);
  A.K = K;
  A.G = G;
  A.C = C;
  A.S = P->chunk_slots;
  A.smem_slots = P->smem_slots;
  const int64_t row_in_bytes = J->n * (int64_t)sizeof(T1) * (BWD ? 2 : 1);
  if (P->tier == SM_TIER_WARP) {
    const sm_row_kernel wk = sm_warp_kernel_for<BWD, T1, T2, Acc>(P->aligned, P->kernel_slots, P->rows_per_lane);
    wk<<<P->grid_x, threads, 0, stream>>>(A);
    return oss_check_launch("softmax_rows_in_warp_kernel");
  }
  if (P->tier == SM_TIER_ROW_IN_CTA) {
    const sm_row_kernel ck = sm_cta_row_kernel_for<BWD, T1, T2, Acc>(P->kernel_slots);
    if (ck == NULL) return oss_fail(OSS_ERROR_NOT_SUPPORTED, "softmax: internal plan error (light tier for float64)");
    /* the chunk-budget instantiation ramps at 40 % of the step: its rows
     * are a CTA per SM or a few; the light one gains nothing from a ramp */
    if (P->kernel_slots > SM_CTA_ROW_K)
      sm_first_wave_ramp(&A, (int64_t)sm_residency_of((const void *)ck, 1, threads, 0, 1, stream) * info->sm_count,
                         row_in_bytes, info, 40);
    ck<<<P->grid_x, threads, 0, stream>>>(A);
    return oss_check_launch("softmax_row_in_cta_kernel");
  }
  const sm_row_kernel kern = sm_chunks_kernel_for<BWD, T1, T2, Acc>(P->aligned);
  const dim3 grid(P->grid_x, P->grid_y, 1), block((unsigned)threads, 1, 1);
  /* row chunks and spread (split plans have no shared-memory part); static
   * shared memory counts toward the default 48 KB: opt in early */
  const size_t smem = (size_t)P->smem_slots * 16 * (BWD ? 2 : 1);
  if (smem > 40 * 1024) OSS_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  if (P->tier == SM_TIER_ROW_CHUNKS) {
    A.mode = SM_FULL;
    const int resident = sm_residency_of((const void *)kern, C, threads, smem, P->grid_y, stream);
    sm_first_wave_ramp(&A, C > 1 ? resident : (int64_t)resident * info->sm_count, row_in_bytes, info, 100);
    if (C == 1) {
      kern<<<grid, block, smem, stream>>>(A);
      return oss_check_launch("softmax_row_chunks_kernel");
    }
    return sm_launch_clusters(kern, grid, block, smem, C, stream, A, "softmax_row_chunks_kernel");
  }
  if (P->tier == SM_TIER_ROW_SPREAD) {
    A.mode = SM_SPREAD;
    A.counters = (unsigned *)ws;
    A.partials = (char *)ws + sm_spread_counter_bytes(J->outer);
    OSS_CUDA_TRY(cudaMemsetAsync(ws, 0, sm_spread_counter_bytes(J->outer), stream));
    kern<<<grid, block, smem, stream>>>(A);
    return oss_check_launch("softmax_row_chunks_kernel (spread)");
  }
  A.partials = ws; /* split */
  A.finals = (char *)ws + (size_t)(J->outer * P->chunks) * sizeof(sm_stat<Acc>);
  A.mode = SM_STATS;
  kern<<<grid, block, 0, stream>>>(A);
  oss_status s = oss_check_launch("softmax_row_chunks_kernel (stats)");
  if (s != OSS_OK) return s;
  s = sm_launch_merge<BWD, Acc>(A.partials, A.finals, J->outer, 1, P->chunks, info, stream);
  if (s != OSS_OK) return s;
  A.mode = SM_APPLY;
  return oss_launch_dependent(kern, grid, block, 0, stream, info, "softmax_row_chunks_kernel (apply)", A);
}

// ---- columns --------------------------------------------------------------------------

template <bool BWD, typename T1, typename T2, typename Acc>
static oss_status sm_launch_cols(const sm_job *J, const sm_plan *P, void *ws, const oss_device_info *info,
                                 cudaStream_t stream) {
  sm_col_args A;
  sm_args_from_job(&A, J);
  A.sn_a = J->sn_a;
  A.sn_b = J->sn_b;
  A.sn_out = J->sn_out;
  A.outer = J->outer;
  A.inner = J->inner;
  A.TJ = P->tile_columns;
  A.ph = P->column_phase;
  A.vec_a = P->vector_a;
  A.vec_b = P->vector_b;
  A.vec_out = P->vector_out;
  A.chunk_n = P->chunk_rows;
  A.nchunks = P->chunks;
  A.C = P->ctas_per_row;
  A.keep = P->keep_in_l2;
  if (A.keep)
    sm_release_window(J->outer, J->n * J->inner * (int64_t)sizeof(T1) * (BWD ? 2 : 1), info, &A.release_lo,
                      &A.release_hi);
  const sm_col_kernel kern = sm_columns_kernel_for<BWD, T1, T2, Acc>(P->threads);
  const size_t smem = (size_t)P->smem_slots * 16;
  /* static shared memory (up to 12 KB) counts toward the default 48 KB: opt in early */
  if (smem > 32 * 1024) OSS_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  const dim3 grid(P->grid_x, P->grid_y, 1), block((unsigned)P->threads, 1, 1);
  if (P->tier == SM_TIER_COLUMNS) {
    A.mode = SM_FULL;
    if (A.C > 1) return sm_launch_clusters(kern, grid, block, smem, A.C, stream, A, "softmax_columns_kernel");
    kern<<<grid, block, smem, stream>>>(A);
    return oss_check_launch("softmax_columns_kernel");
  }
  const int64_t items = J->outer * J->inner;
  A.partials = ws;
  A.finals = (char *)ws + (size_t)(items * P->chunks) * sizeof(sm_stat<Acc>);
  A.mode = SM_STATS;
  kern<<<grid, block, smem, stream>>>(A);
  oss_status s = oss_check_launch("softmax_columns_kernel (stats)");
  if (s != OSS_OK) return s;
  s = sm_launch_merge<BWD, Acc>(A.partials, A.finals, items, J->inner, P->chunks, info, stream);
  if (s != OSS_OK) return s;
  A.mode = SM_APPLY;
  kern<<<grid, block, smem, stream>>>(A);
  return oss_check_launch("softmax_columns_kernel (apply)");
}

// ---- dispatch on the job's dtypes -----------------------------------------------------

/* What a dispatch does for the job's types: fill *residency where it is set,
 * else launch *plan. */
typedef struct sm_action {
  sm_residency *residency;
  const sm_plan *plan;
  void *workspace;
  const oss_device_info *info;
  cudaStream_t stream;
} sm_action;

template <bool BWD, typename T1, typename T2, typename Acc> static oss_status sm_act(const sm_job *J, const sm_action *X) {
  if (X->residency != NULL) {
    sm_residency *R = X->residency;
    R->row_chunks[0] = (const void *)sm_chunks_kernel_for<BWD, T1, T2, Acc>(0);
    R->row_chunks[1] = (const void *)sm_chunks_kernel_for<BWD, T1, T2, Acc>(1);
    R->columns[0] = (const void *)sm_columns_kernel_for<BWD, T1, T2, Acc>(SM_COL_THREADS);
    R->columns[1] = (const void *)sm_columns_kernel_for<BWD, T1, T2, Acc>(SM_COL_THREADS_WIDE);
    R->resident = sm_plan_residency;
    return OSS_OK;
  }
  return J->inner == 1 ? sm_launch_rows<BWD, T1, T2, Acc>(J, X->plan, X->workspace, X->info, X->stream)
                       : sm_launch_cols<BWD, T1, T2, Acc>(J, X->plan, X->workspace, X->info, X->stream);
}

template <bool BWD, typename T1> static oss_status sm_dispatch_out(const sm_job *J, const sm_action *X) {
  switch (J->tout) {
  case OSS_FLOAT32: return sm_act<BWD, T1, float, float>(J, X);
  case OSS_FLOAT16: return sm_act<BWD, T1, __half, float>(J, X);
  case OSS_BFLOAT16: return sm_act<BWD, T1, __nv_bfloat16, float>(J, X);
  default: break;
  }
  return oss_fail(OSS_ERROR_NOT_SUPPORTED, "softmax: unsupported output dtype");
}

template <bool BWD> static oss_status sm_dispatch(const sm_job *J, const sm_action *X) {
  switch (J->ta) {
  case OSS_FLOAT32: return sm_dispatch_out<BWD, float>(J, X);
  case OSS_FLOAT16: return sm_dispatch_out<BWD, __half>(J, X);
  case OSS_BFLOAT16: return sm_dispatch_out<BWD, __nv_bfloat16>(J, X);
  case OSS_FLOAT64: return sm_act<BWD, double, double, double>(J, X);
  default: break;
  }
  return oss_fail(OSS_ERROR_NOT_SUPPORTED, "softmax: unsupported input dtype");
}

static oss_status sm_dispatch_job(const sm_job *J, const sm_action *X) {
  return J->bwd ? sm_dispatch<true>(J, X) : sm_dispatch<false>(J, X);
}

oss_status sm_residency_for_job(const sm_job *J, sm_residency *R) {
  const sm_action X = {R, NULL, NULL, NULL, NULL};
  return sm_dispatch_job(J, &X);
}

oss_status sm_launch_plan(const sm_job *J, const sm_plan *P, void *workspace, const oss_device_info *info,
                          cudaStream_t stream) {
  const sm_action X = {NULL, P, workspace, info, stream};
  return sm_dispatch_job(J, &X);
}
