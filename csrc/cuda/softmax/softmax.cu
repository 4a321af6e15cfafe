/*
 * softmax.cu - CUDA softmax / log_softmax, forward and backward, behind the
 * plain C API of oss.h (softmax section).
 *
 * Computes y = exp(x - max) / sum exp(x - max) (or x - max - log sum) over the
 * n axis of the [outer, n, inner] view, and the backward
 * dx = y * (dy - sum y*dy) (or dy - exp(y) * sum dy), in float for
 * float32/float16/bfloat16 tensors (any input/output combination: the dtype=
 * cast is fused into the store) and in double for float64.
 *
 * Tiers, chosen here by shape and invisible to the caller:
 *   inner == 1 (rows), counted in 16-byte slots of the input (x or y):
 *     aligned rows of        softmax_row_in_cta_kernel: a row per CTA of
 *     128, 256 or 512 slots  64-512 threads x 2 register slots (backward
 *     forward (16-bit also   128-512 x 2, 64-128 slots x 1); at most 32
 *     1024), 1024 backward   registers per thread, so 2048 threads per SM
 *     (64-512 where memory   (sm_cta_row_threads). Also the one-CTA
 *     is fast per SM, e.g.   plans below that hold an aligned row in
 *     the H200; float        registers only: at more than 2 slots per
 *     statistics)            thread at 64 registers, backward at <= 2 slots
 *                            in the light footprint (on the H100 not where
 *                            they fill the CTA)
 *     rows up to 4 KB        softmax_rows_in_warp_kernel: G = 1..32 lanes per
 *     (float64: under 4 KB)  row, 4 or 8 slots per lane (two instantiations)
 *     fits one CTA           softmax_row_chunks_kernel, SM_FULL, C = 1: up to
 *                            512 threads x 8 slots in registers plus ~100 KB of
 *                            shared memory (two CTAs per SM), else 1024 threads
 *                            and up to all of the shared memory; an aligned
 *                            backward row of 3/4 to all of 1024 x 4 slots:
 *                            1024 threads, registers only (one CTA per SM)
 *     fits a cluster of      the same kernel, a cluster of C = 2..16 CTAs
 *     <= 512-thread CTAs     that exchange (m, d') through distributed shared
 *     (sm_90)                memory (forward: ~670K float32 / ~1.3M 16-bit
 *                            elements, backward half); a forward row tries
 *                            256-thread CTAs with <= 48 KB first (four per SM)
 *     fits C <= half the     SM_SPREAD: C CTAs of <= 512 threads and <= 64 KB
 *     resident CTAs          of shared memory (two per SM) that exchange
 *                            (m, d') through the workspace (H100 forward: up
 *                            to ~4.3M float32 / ~8.6M 16-bit elements; any
 *                            GPU); else 1024-thread CTAs or clusters
 *     anything wider         split: SM_STATS chunks -> merge -> SM_APPLY in
 *                            reverse order (the row is read twice; part of the
 *                            second read hits L2)
 *   inner > 1 (columns): softmax_columns_kernel, the [n x TJ] tile in shared
 *     memory in one pass. On sm_90: 128-byte row segments, one CTA or a
 *     cluster of up to 8 (16-bit: 4) CTAs sharing the tile by rows with at
 *     most SM_COL_CLUSTER_BYTES each; else 64-byte segments in up to 16 such
 *     CTAs; else 16 CTAs of up to ~210 KB (H100: n up to ~53K forward).
 *     Elsewhere one CTA of up to ~210 KB. Else the same split scheme.
 * Every row that fits on chip is read once and written once. Choices were
 * measured on an H100 (bench/NOTES-softmax.md).
 *
 * Launch rules: the caller's stream only; no synchronisation, no allocation
 * (the split and spread tiers use the caller's workspace, sized by the plan:
 * oss_softmax_*_plan_cuda plans once and oss_softmax_launch_cuda checks the
 * workspace and launches); a launch check after every launch; nothing is
 * launched when outer, n or inner is 0.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda/softmax/softmax_columns.cuh"
#include "cuda/softmax/softmax_rows.cuh"

// ---- test knobs ------------------------------------------------------------------

/* For csrc/tests/softmax_cuda_selftest.cu only (not part of oss.h): all zero
 * means the normal planner. [0] forces a row tier where it can hold the row
 * (1 warp, 2 one CTA, 3 cluster, 4 split, 5 spread); [1] the soft shared-memory limit
 * per CTA in KB (rows; also the spread tier's chunks); [2] caps the cluster size; [3] forces column chunks
 * of that many rows (the column split path); [4] the shared memory in KB of
 * a column chunk in the split path; [5] slots per lane aimed at in the warp
 * tier (1 .. sm_warp_kmax; the light kernel serves up to half of that); [6]
 * the column tile's width in bytes (16 .. 256 columns); [8] the column
 * kernel's CTA size (256 or 512); [9] the chunk kernel's CTA size
 * cap (a power of two, 64 .. 512) in the first pass and the spread tier;
 * [10] caps the rows launched at once by one-CTA and cluster row plans and
 * the split tier (so each CTA or cluster runs several rows: the next row's
 * shared-memory copies while the current one is written), the warp tier's
 * CTAs (each warp loops over several groups of rows) and the columns'
 * grid.y (several tiles per CTA or cluster);
 * [11] register slots per thread aimed at by the chunk kernel's CTA and
 * cluster plans (1 .. KREG; the planner's choice when 0); [12] the columns
 * kernel's cluster size (1 .. 16, a power of two; 1 = no cluster);
 * [13] caps the CTAs per SM of the warp tier and of one-CTA chunk plans
 * (2 .. 32) by padding their dynamic shared memory; [14] = 1: the split
 * tier's merge and APPLY launches without programmatic dependent launch;
 * [15] the warp tier's CTA size (32 or 64; 128 when 0); [16] = 1: rows run
 * the general kernels even where the aligned ones could (sm_rows_aligned),
 * = 2: the aligned ones wherever they can (backward clusters of 16 too);
 * [17] = 1: the row kernels' input loads without the L2 evict_last policy,
 * = 2: with it but without the release after the output;
 * [18] = 1: the same for the columns kernel;
 * [19] = 1: backward rows of 3/4 to all of 1024 x KREG register slots take
 * the first pass's plan (a shared-memory part, two CTAs per SM), not one
 * 1024-thread CTA of registers;
 * [20] the release window (sm_release_window) in MiB of input instead of
 * a third of the L2's size; [21] = 1: the window at the first rows, not the last;
 * [22] the light one-row-per-CTA tier (softmax_row_in_cta_kernel): 1 off,
 * 2 wherever it can hold the row, 3 the same with one slot per thread,
 * 64 .. 1024 (a power of two) there with CTAs of that size; [23] = 1: that tier releases every row, not the window;
 * [24] = 1: one-CTA plans of registers only with more than SM_CTA_ROW_K
 * slots per thread (backward: any) run the chunk kernel, not the light
 * kernel;
 * [25] the first wave's ramp (sm_first_wave_ramp): -1 off, else its step in
 * % of the computed one (0: the kernel's own, 100 % or 40 %);
 * [26] = 1: the warp tier's aligned forward rows of at most 16 slots keep a
 * row per lane group (K slots each), never slots of several rows per lane;
 * 2 .. 16 (a power of two): every such row takes several rows per lane,
 * with at most that many lanes per row;
 * [7] bit 0 / bit 1: print the next forward / backward plan (then cleared).
 * They exist only in builds with -DOSS_SOFTMAX_TEST_KNOBS (the self-test, and
 * the extension built with TORCH_OSS_SOFTMAX_KNOBS=1 for
 * scripts/softmax_variants.py); the library itself holds no mutable global
 * state. */
#ifdef OSS_SOFTMAX_TEST_KNOBS
extern "C" {
int oss_softmax_cuda_test_knobs[27];
}
#else
static const int oss_softmax_cuda_test_knobs[27] = {0};
#endif

#ifdef OSS_SOFTMAX_TIMELINE
/* The row kernels' per-CTA timeline (softmax_rows.cuh), for the self-test's
 * timeline mode: its device address and capacity in CTAs. */
extern "C" void *oss_softmax_cuda_timeline(int *ctas) {
  void *p = NULL;
  *ctas = SM_TIMELINE_CTAS;
  return cudaGetSymbolAddress(&p, sm_timeline) == cudaSuccess ? p : NULL;
}
#endif

// ---- the job: forward and backward in one shape --------------------------------

typedef struct sm_job {
  int bwd, log;
  int64_t outer, n, inner;
  const void *a, *b; /* forward: x, -      backward: y, dy */
  void *out;         /* forward: y         backward: dx */
  oss_dtype ta, tout;
  int64_t so_a, sn_a, so_b, sn_b, so_out, sn_out;
} sm_job;

/* What the planner decided; ws_bytes is the workspace the launch needs. */
typedef struct sm_plan {
  int kind; /* SM_PLAN_* */
  int threads, K, G, C, smem_slots, TJ, ph, vec_a, vec_b, vec_out, km;
  int al; /* rows: the kernels' aligned instantiation (sm_rows_aligned) */
  int rl; /* warp tier: rows per lane (softmax_rows_in_warp_kernel's RL) */
  int keep; /* the input loads carry the L2 evict_last policy (sm_l2_policy in softmax_common.cuh) */
  int64_t S, chunk_n, nchunks;
  unsigned grid_x, grid_y;
  size_t ws_bytes;
} sm_plan;

enum { SM_PLAN_WARP = 0, SM_PLAN_CHUNKS = 1, SM_PLAN_SPLIT = 2, SM_PLAN_COLS = 3, SM_PLAN_COLS_SPLIT = 4, SM_PLAN_SPREAD = 5,
       SM_PLAN_CTA_ROW = 6 };

static const char *sm_dtype_name(oss_dtype t) {
  switch (t) {
  case OSS_FLOAT32: return "float32";
  case OSS_FLOAT64: return "float64";
  case OSS_FLOAT16: return "float16";
  case OSS_BFLOAT16: return "bfloat16";
  case OSS_BOOL: return "bool";
  }
  return "unknown";
}

static size_t sm_dtype_size(oss_dtype t) {
  return t == OSS_FLOAT64 ? 8 : t == OSS_FLOAT32 ? 4 : t == OSS_BOOL ? 1 : 2;
}

static int64_t sm_pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

static int64_t sm_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- planning: rows ---------------------------------------------------------------

/* The launch configuration of a grid in clusters of C CTAs along x (sm_90),
 * shared by the residency query and the launch; cfg points at attr, so the
 * struct is used where it was initialised, never copied. Allows cluster
 * sizes above 8 on kern first. */
typedef struct {
  cudaLaunchConfig_t cfg;
  cudaLaunchAttribute attr;
} sm_cluster_config;

template <typename Kern>
static cudaError_t sm_cluster_config_init(sm_cluster_config *L, Kern kern, int C, dim3 grid, dim3 block, size_t smem,
                                          cudaStream_t stream) {
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

/* Answers of sm_config_residency, per device: the planner asks the same few
 * questions on every call, and each asks the driver (cudaFuncSetAttribute
 * and an occupancy query: microseconds of host time per call at the wide
 * rows, bench/NOTES-softmax.md v24). The launches set the attributes they
 * need themselves, so a remembered answer skips nothing they rely on.
 * A set-associative table: a key hashes to one set of SM_RESIDENCY_WAYS
 * entries, and a new answer replaces the set's oldest, so a lookup costs a
 * few compares and a process whose shapes change keeps its recent answers. */
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

template <typename Kern>
static int sm_config_residency_uncached(Kern kern, int C, int threads, size_t smem, unsigned grid_y,
                                        cudaStream_t stream);

/* How many of a configuration can be resident at once: CTAs per SM for C ==
 * 1, clusters on the GPU for C > 1; 0 where it cannot run. */
template <typename Kern>
static int sm_config_residency(Kern kern, int C, int threads, size_t smem, unsigned grid_y, cudaStream_t stream) {
  sm_residency_entry key;
  memset(&key, 0, sizeof key);
  key.kern = (const void *)kern;
  key.C = C;
  key.threads = threads;
  key.smem = smem;
  key.grid_y = grid_y;
  if (cudaGetDevice(&key.device) != cudaSuccess) {
    cudaGetLastError();
    return sm_config_residency_uncached(kern, C, threads, smem, grid_y, stream);
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
  key.answer = sm_config_residency_uncached(kern, C, threads, smem, grid_y, stream);
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

/* Sets the attributes a configuration needs and asks the driver how many of
 * it can be resident at once (see sm_config_residency). */
template <typename Kern>
static int sm_config_residency_uncached(Kern kern, int C, int threads, size_t smem, unsigned grid_y,
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

/* CTA size cap of the chunk kernel's first pass and of the spread tier. */
static int64_t sm_first_pass_threads(void) {
  const int k = oss_softmax_cuda_test_knobs[9];
  return k >= 64 && k <= 512 ? sm_pow2_ceil(k) : 512;
}

/* Bytes of SM_SPREAD's counters at the front of its workspace: the ticket and
 * one arrival count per row, rounded up to 16. */
static size_t sm_spread_counter_bytes(int64_t rows) { return ((size_t)(rows + 1) * sizeof(unsigned) + 15) & ~(size_t)15; }

/* Rows (inner == 1) whose every row starts a 16-byte slot in each tensor
 * (an 8-byte one for a 16-bit input's 8-byte output slots) and hold a whole
 * number of slots: the row kernels' aligned instantiation (AL) then has no
 * edge elements, no misaligned-tensor paths and no phase arithmetic: 8-10 %
 * fewer instructions, 25-45 % fewer instruction-fetch stalls, and 0.3-1.9 us
 * less per narrow-row call on the H100 (bench/NOTES-softmax.md
 * v18). float compute only: float64 keeps the general kernels. Test knob
 * 16 = 1 turns it off. */
template <typename T1, typename T2, typename Acc> static bool sm_rows_aligned(const sm_job *J) {
  if (sizeof(Acc) != 4 || oss_softmax_cuda_test_knobs[16] == 1) return false;
  const int64_t VEC = sm_vec<T1>();
  const int64_t A = VEC * (int64_t)sizeof(T2) < 16 ? VEC * (int64_t)sizeof(T2) : 16;
  const bool many = J->outer > 1;
  return J->n % VEC == 0 && (uintptr_t)J->a % 16 == 0 && (uintptr_t)J->out % (uintptr_t)A == 0 &&
         (!J->bwd || (uintptr_t)J->b % 16 == 0) && (!many || (J->so_a * (int64_t)sizeof(T1)) % 16 == 0) &&
         (!many || (J->so_out * (int64_t)sizeof(T2)) % A == 0) &&
         (!many || !J->bwd || (J->so_b * (int64_t)sizeof(T1)) % 16 == 0);
}

typedef void (*sm_row_kernel)(sm_row_args);
template <bool BWD, typename T1, typename T2, typename Acc> static sm_row_kernel sm_chunks_kernel_for(int al) {
  if constexpr (sizeof(Acc) == 4)
    if (al) return softmax_row_chunks_kernel<BWD, T1, T2, Acc, true>;
  return softmax_row_chunks_kernel<BWD, T1, T2, Acc, false>;
}
/* The warp kernel for km slots per lane: the light variant (half of
 * sm_warp_kmax, more CTAs resident) up to its size. The backward's full
 * kernel runs the general instantiation: aligned, the compiler gave each
 * slot's loads a branch and recomputed their addresses, and bfloat16 rows of
 * 128 lost 1.4 points of copy (97.4 against 98.8 % on the H100, v18; with
 * those loads unpredicated it still trailed by 0.1-0.4 points, v19). The
 * backward's light kernel exists aligned only: general, it spills at its 40
 * registers. */
template <bool BWD, typename T1, typename T2, typename Acc>
static sm_row_kernel sm_warp_kernel_for(int al, int km, int rl) {
  constexpr int WK = sm_warp_kmax<BWD, Acc>(), WL = WK / 2;
  if constexpr (sizeof(Acc) == 4) {
    if constexpr (!BWD) {
      if (al && rl == WL) return softmax_rows_in_warp_kernel<BWD, T1, T2, Acc, WL, true, WL>;
      if (al && rl == WL / 2) return softmax_rows_in_warp_kernel<BWD, T1, T2, Acc, WL, true, WL / 2>;
    }
    if (al && km <= WL) return softmax_rows_in_warp_kernel<BWD, T1, T2, Acc, WL, true, 1>;
    if constexpr (!BWD)
      if (al) return softmax_rows_in_warp_kernel<BWD, T1, T2, Acc, WK, true, 1>;
  }
  if constexpr (!BWD)
    if (km <= WL) return softmax_rows_in_warp_kernel<BWD, T1, T2, Acc, WL, false, 1>;
  return softmax_rows_in_warp_kernel<BWD, T1, T2, Acc, WK, false, 1>;
}

/* The light one-row-per-CTA kernel with km register slots per thread: the
 * light footprint (SM_CTA_ROW_K slots, <= 32 registers) or the chunk
 * kernel's register budget (sm_chunk_kreg slots, 64 registers). Float
 * statistics only; NULL for float64, which never plans it. */
template <bool BWD, typename T1, typename T2, typename Acc> static sm_row_kernel sm_cta_row_kernel_for(int km) {
  if constexpr (sizeof(Acc) == 4) {
    if (km <= SM_CTA_ROW_K) return softmax_row_in_cta_kernel<BWD, T1, T2, Acc, SM_CTA_ROW_K>;
    return softmax_row_in_cta_kernel<BWD, T1, T2, Acc, sm_chunk_kreg<BWD, Acc>()>;
  }
  return NULL;
}

/* Whether the GPU's DRAM feeds each SM fast enough that a narrow row's
 * kernel is bound by the instructions it issues rather than by memory: an
 * H200 (6144-bit HBM3e at 3201 MHz, 4.9 TB/s over 132 SMs, 37 bytes per ns
 * per SM), not an H100 SXM (3.35 TB/s, 25) or an A100 (19). The
 * backward's narrow-row plans (sm_cta_row_threads, bench/NOTES-softmax.md
 * v36) and the rows the warp tier releases from the L2 (sm_run_rows, v39)
 * differ by it; measured on those two GPUs only; unknown bandwidth counts
 * as slow. */
static bool sm_fast_memory_per_sm(const oss_device_info *info) {
  return info->sm_count > 0 && info->dram_bytes_per_ns >= 30.0 * info->sm_count;
}

/* The CTA size with which the light one-row-per-CTA tier takes an aligned
 * row of nslots slots of es-byte input by default; 0: it does not. H100,
 * 2^26 elements, % of copy, five rounds each, the other tiers' plan -> this
 * one (bench/NOTES-softmax.md v28, v29):
 *  - forward, two slots per thread, rows of 128-512 slots (the warp kernel's
 *    8 slots per lane or a one-CTA chunk plan before): bfloat16 1024 columns
 *    94.6 -> 95.9, 2048 95.0 -> 96.1, 4096 94.9 -> 95.5, float16 1024 95.1
 *    -> 96.0, 4096 94.9 -> 96.0, float32 1024 98.5 -> 98.9. Rows of 1024
 *    slots, 512 threads, since the per-row work was cut (v29): 16-bit 8192
 *    columns 94.6 -> 95.3 (bfloat16; 2^28: 99.7 -> 100.3), float16 94.5 ->
 *    95.1; float32 4096 ties (-0.2 at 2^26, +0.15 at 2^28), so it keeps the
 *    chunk plan. 2048 slots (1024 threads) -1.8 (v28). One slot per thread
 *    loses: bfloat16 512 columns 92.0 against the warp kernel's 95.5, and
 *    the more threads per CTA the more (82.6 at 4096, 75.1 at 8192): every
 *    thread's share of the row's fixed work (reduction, constants,
 *    addresses) is then spread over only 8 elements.
 *  - backward (v36, since its block sum is one barrier and plain shuffles
 *    for 16-bit outputs): two slots per thread at 256-1024 slots, one at
 *    64 and 128. H200, 2^27 elements, self-test fixed mode, % of copy, the
 *    plan before (chunk kernel at 2 slots, warp kernel, light 1024 x 1) ->
 *    this one: bfloat16 2048 columns 87.0 -> 100.8, 4096 86.9 -> 101.0
 *    (512 x 1: 98.5), 8192 82.0 -> 99.9 (1024 x 1: 92.5), float32 1024
 *    86.9 -> 103.6, 2048 86.9 -> 103.4, 4096 95.1 -> 103.2 (1024 x 1: 88.9,
 *    its compensated cross-warp sum on every warp); one slot: bfloat16
 *    1024 97.5 -> 101.1, float16 97.1 -> 100.6, 16-bit 512 96.9-97.1 ->
 *    100.2-100.4, float32 512 99.0 -> 101.0, 256 98.9 -> 102.1.
 *    On the H100 (the same A/B at 2^26 and 2^27) the narrower rows lose a
 *    little: 2 slots per thread at 256 and 512 slots 0.3-1.5 points against
 *    the chunk kernel (bfloat16 4096 99.4 -> 98.2 at 2^26), one slot at 64
 *    and 128 0.2-0.6 against the warp kernel, while 1024 slots gain
 *    (bfloat16 8192 98.4-98.9 -> 100.1 at 2^27), except for float32, where
 *    1024 x 1 stays ahead of 512 x 2 (4096 columns, 2^27: 102.4 against
 *    101.1; 256 x 4 101.7; v37). So rows of 64-512 slots, and float32 rows of
 *    1024 at 2 slots per thread, take it only where the memory is fast for
 *    the SMs' issue rate (sm_fast_memory_per_sm: the H200, not the H100).
 * Forward rows of other sizes leave some threads one slot: they keep the
 * other tiers (the backward's chunk plans of registers only at <= 2 slots
 * per thread run this kernel too, sm_plan_rows). */
static int64_t sm_cta_row_threads(bool bwd, int64_t es, int64_t nslots, bool fast_memory) {
  if (bwd) {
    if (nslots == 1024) return es == 2 || fast_memory ? 512 : 1024;
    if (!fast_memory) return 0;
    return nslots == 256 || nslots == 512 ? nslots / 2 : nslots == 64 || nslots == 128 ? nslots : 0;
  }
  if (nslots == 1024 && es == 2) return 512;
  return nslots == 128 || nslots == 256 || nslots == 512 ? nslots / SM_CTA_ROW_K : 0;
}

/* SM_SPREAD: the fewest CTAs of <= 512 threads and <= `soft` bytes of shared
 * memory (two per SM) that hold the row; false where fewer than two are
 * needed or the GPU cannot hold twice a row's CTAs at once (the tier needs
 * all C of a row resident together). */
template <bool BWD, typename T1, typename T2, typename Acc>
static bool sm_plan_spread(const sm_job *J, const oss_device_info *info, int64_t nslots, int64_t soft,
                           cudaStream_t stream, sm_plan *P) {
  constexpr int KREG = sm_chunk_kreg<BWD, Acc>();
  const int64_t slot_bytes = 16 * (BWD ? 2 : 1), tmax = sm_first_pass_threads();
  const int64_t C = sm_cdiv(nslots, tmax * KREG + soft / slot_bytes);
  if (C < 2 || J->outer * C > 0x7fffffff) return false;
  int64_t T, K, smem_slots;
  sm_chunk_shape(sm_cdiv(nslots, C), tmax, KREG, &T, &K, &smem_slots);
  const int per_sm = sm_config_residency(sm_chunks_kernel_for<BWD, T1, T2, Acc>(P->al), 1, (int)T,
                                         (size_t)(smem_slots * slot_bytes), 1, stream);
  if (2 * C > (int64_t)per_sm * info->sm_count) return false;
  P->kind = SM_PLAN_SPREAD;
  P->threads = (int)T;
  P->K = (int)K;
  P->C = (int)C;
  P->smem_slots = (int)smem_slots;
  P->S = T * K + smem_slots;
  P->grid_x = (unsigned)(J->outer * C);
  P->grid_y = 1;
  P->ws_bytes = sm_spread_counter_bytes(J->outer) + (size_t)(J->outer * C) * sizeof(sm_stat<Acc>);
  return true;
}

template <bool BWD, typename T1, typename T2, typename Acc>
static oss_status sm_plan_rows(const sm_job *J, const oss_device_info *info, cudaStream_t stream, sm_plan *P) {
  constexpr int VEC = sm_vec<T1>();
  constexpr int KREG = sm_chunk_kreg<BWD, Acc>();
  constexpr int WKMAX = sm_warp_kmax<BWD, Acc>();
  static_assert(WKMAX >= 2 && KREG >= 2, "slot counts");
  const int64_t es = sizeof(T1);
  memset(P, 0, sizeof *P);
  P->al = sm_rows_aligned<T1, T2, Acc>(J);
  /* worst-case misalignment of a row: constant when every row shifts by a
   * multiple of 16 bytes, else up to VEC - 1 */
  int64_t ph = (int64_t)(((uintptr_t)J->a / es) % VEC);
  if (J->outer > 1 && (J->so_a * es) % 16 != 0) ph = VEC - 1;
  const int64_t nslots = (ph + J->n + VEC - 1) / VEC;
  /* test knob 10 caps the rows launched at once (each CTA or cluster then
   * loops over rows); the split tier's rows go in grid.y */
  const int64_t rows_cap = oss_softmax_cuda_test_knobs[10];
  const int64_t split_ymax = rows_cap > 0 ? rows_cap : 65535;

  const int force = oss_softmax_cuda_test_knobs[0];
  /* the light tier: a row per CTA of T threads x <= SM_CTA_ROW_K register
   * slots (sm_cta_row_threads; test knob 22 turns it off, or takes it
   * wherever it fits with T = nslots / SM_CTA_ROW_K or nslots rounded up to
   * a power of two, at least 64, or with the T it gives) */
  const int light = oss_softmax_cuda_test_knobs[22];
  const bool fast_memory = sm_fast_memory_per_sm(info);
  const int64_t light_t = sm_cta_row_threads(BWD, es, nslots, fast_memory);
  if (sizeof(Acc) == 4 && P->al && force == 0 && light != 1 && (light >= 2 || light_t > 0)) {
    int64_t T = light >= 64 ? light
                : light == 2 ? sm_pow2_ceil(sm_cdiv(nslots, SM_CTA_ROW_K))
                : light == 3 ? sm_pow2_ceil(nslots)
                             : light_t;
    if (T < 64) T = 64;
    if (T <= SM_CHUNK_THREADS && (T & (T - 1)) == 0 && nslots <= T * SM_CTA_ROW_K) {
      P->kind = SM_PLAN_CTA_ROW;
      P->km = SM_CTA_ROW_K;
      P->keep = 1;
      P->threads = (int)T;
      P->K = (int)sm_cdiv(nslots, T);
      int64_t ctas = J->outer < 0x7fffffff ? J->outer : 0x7fffffff;
      if (rows_cap > 0 && rows_cap < ctas) ctas = rows_cap;
      P->grid_x = (unsigned)ctas;
      P->grid_y = 1;
      return OSS_OK;
    }
  }

  /* warp tier: rows up to 4 KB (float64: under 4 KB); the light kernel
   * (half the slots per lane) for the narrowest rows (more warps resident) */
  /* (float32 rows of exactly 32 * WKMAX slots, 1024 columns forward and 512
   * backward, took the CTA tier until the L2 policy: with it the warp tier
   * streams the forward at 100.4 % of copy, the CTA tier's 64-thread CTAs at
   * 94.4; the backward at 512 went from 99.2 to 100.7 in bench/softmax.py; v18) */
  const int64_t warp_max = es == 8 ? 32 * WKMAX - 1 : 32 * WKMAX;
  if ((nslots <= warp_max && force == 0) || (nslots <= 32 * WKMAX && force == 1)) {
    /* slots per lane aimed at: the light kernel's (half of WKMAX) for the
     * narrowest rows. Backward: aligned rows only (sm_warp_kernel_for); on
     * the H100 it gains at 128 columns (16-bit 2^26 elements: 96.4-97.0 ->
     * 97.5-98.1 % of copy; 2^28: 100.9-101.2 -> 101.6; float32 2^28 102.4 ->
     * 102.7) and ties at 16-bit 512 and float32 256 (bench/NOTES-softmax.md v21) */
    const bool light_bwd = BWD && P->al;
    int64_t km = BWD ? (light_bwd && nslots <= 32 * (WKMAX / 2) ? WKMAX / 2 : WKMAX)
                     : (es == 2 ? (nslots <= 64 ? WKMAX / 2 : WKMAX) : (nslots <= 128 ? WKMAX / 2 : WKMAX));
    if (oss_softmax_cuda_test_knobs[5] > 0) km = oss_softmax_cuda_test_knobs[5] < WKMAX ? oss_softmax_cuda_test_knobs[5] : WKMAX;
    int64_t G = sm_pow2_ceil(sm_cdiv(nslots, km));
    if (G > 32) G = 32;
    P->kind = SM_PLAN_WARP;
    P->keep = 1; /* see the chunk plans below */
    P->G = (int)G;
    P->K = (int)sm_cdiv(nslots, G);
    P->km = (int)(P->K <= WKMAX / 2 && (!BWD || light_bwd) ? WKMAX / 2 : WKMAX);
    P->rl = 1;
    if (BWD && P->km == WKMAX) P->al = 0; /* the general instantiation (sm_warp_kernel_for) */
    /* aligned forward rows of a power-of-two number of slots up to 16, or of
     * at most 4: G = the row's slots rounded up to a power of two, at most
     * 8, and K = 1 or 2 slots of each of WKMAX / 2 / K rows per lane
     * (softmax_rows_in_warp_kernel's RL), so each load instruction covers
     * whole 128-byte lines of consecutive rows, not 16-64 bytes of each of
     * 32 / G rows. H100, 2^26 elements, kernel time (bench/NOTES-softmax.md
     * v34): 16-bit forward 128 columns 91.4 -> 91.0 us, 64 columns 103.5 ->
     * 91.6, 32 columns 137.4 -> 91.6, 24 columns 120.9 -> 96.7; at 16
     * lanes per row the 16-slot rows lost (91.5 us). Other widths keep a
     * row per lane group: 6-slot rows (8 lanes, 2 idle) lost, 95.3 -> 98.0;
     * 12-slot ones gained 0.5 us (91.3 -> 90.7), measured once and 9 %
     * ahead of torch.compile either way, so the rule stays this simple */
    const int lanes_knob = oss_softmax_cuda_test_knobs[26];
    const bool lanes_forced = lanes_knob >= 2 && lanes_knob <= 16 && (lanes_knob & (lanes_knob - 1)) == 0;
    const int64_t lanes = lanes_forced ? lanes_knob : 8;
    if (!BWD && es != 8 && P->al && nslots <= 16 && (nslots <= 4 || (nslots & (nslots - 1)) == 0 || lanes_forced) &&
        P->km == WKMAX / 2 && oss_softmax_cuda_test_knobs[5] == 0 && lanes_knob != 1) {
      const int64_t rg = sm_pow2_ceil(nslots) < lanes ? sm_pow2_ceil(nslots) : lanes, rk = sm_cdiv(nslots, rg);
      if (rk <= WKMAX / 4) {
        P->G = (int)rg;
        P->K = (int)rk;
        P->rl = (int)(WKMAX / 2 / rk);
      }
    }
    P->threads = SM_WARP_THREADS;
    if (oss_softmax_cuda_test_knobs[15] == 32 || oss_softmax_cuda_test_knobs[15] == 64) P->threads = oss_softmax_cuda_test_knobs[15];
    /* one CTA per group of rows, as many CTAs as that takes: a grid capped at
     * 256 CTAs per SM, each looping over rows, lost 0.5-2 points of copy at
     * 2^28 elements on the H100 (bf16 backward 128 columns 100.2 against
     * 100.9 %, float32 forward 128 98.6 against 100.6; v21). The kernel
     * still loops (test knob 10 caps the grid). */
    const int64_t rows_per_cta = P->threads / 32 * (32 / P->G) * P->rl;
    const int64_t blocks = sm_cdiv(J->outer, rows_per_cta);
    int64_t cap = 0x7fffffff;
    if (oss_softmax_cuda_test_knobs[10] > 0) cap = oss_softmax_cuda_test_knobs[10];
    P->grid_x = (unsigned)(blocks < cap ? blocks : cap);
    P->grid_y = 1;
    return OSS_OK;
  }

  /* one CTA, or a cluster of up to 16 (sm_90). Main pass: CTAs of <= 512
   * threads with <= ~100 KB of shared memory, two per SM, so one computes
   * while the other moves data; last pass: one CTA of up to 1024 threads per
   * SM with up to all of its shared memory. A forward row that needs more
   * than one CTA of the main pass first tries clusters of 256-thread CTAs
   * with <= 48 KB of shared memory, four per SM: on the H100 they gain
   * about a point of copy at 256K columns (four rounds each: bfloat16
   * 86.8-87.4 -> 87.4-88.7 %, float16 87.0-87.5 -> 88.1-89.0, float32
   * 93.3-93.5 -> 94.0-94.4) and tie at 128K; the backward loses with them
   * (float32 256K 97.4 -> 92.9 %), and 128-thread CTAs lose in both
   * (bench/NOTES-softmax.md v13) */
  const int64_t slot_bytes = 16 * (BWD ? 2 : 1);
  const int64_t static_smem = 2048;
  const int64_t soft = oss_softmax_cuda_test_knobs[1] > 0 ? oss_softmax_cuda_test_knobs[1] * 1024 : 100 * 1024;
  const int64_t hard = (int64_t)info->max_smem_per_block_optin - static_smem;
  const int64_t tmax_hard = sizeof(Acc) == 8 ? SM_CHUNK_THREADS / 2 : SM_CHUNK_THREADS;
  int cmax = info->cc_major >= 9 ? 16 : 1;
  if (oss_softmax_cuda_test_knobs[2] > 0 && oss_softmax_cuda_test_knobs[2] < cmax) cmax = oss_softmax_cuda_test_knobs[2];
  const sm_row_kernel kern = sm_chunks_kernel_for<BWD, T1, T2, Acc>(P->al);
  /* spread tier: chunks of <= 64 KB of shared memory. On the H100 it beats
   * 1024-thread CTAs (one per SM; at most 7 clusters of 16 fit) and the split
   * tier by far (float32 1M columns forward 76 -> 89 % of copy, backward
   * 61 -> 91 %), but loses to the clusters of the first pass (float32 256K
   * forward 90 against 94 %, bfloat16 1M forward 77 against 78 %): its
   * exchange goes through L2 (bench/NOTES-softmax.md v11) */
  const int64_t spread_soft = oss_softmax_cuda_test_knobs[1] > 0 ? soft : 64 * 1024;
  if (force == 5 && sm_plan_spread<BWD, T1, T2, Acc>(J, info, nslots, spread_soft, stream, P)) return OSS_OK;
  const int64_t quarter_t = 256, quarter_soft = 48 * 1024;
  const bool quarter = !BWD && sizeof(Acc) == 4 && oss_softmax_cuda_test_knobs[1] == 0 &&
                       oss_softmax_cuda_test_knobs[9] == 0 && nslots > sm_first_pass_threads() * KREG + soft / slot_bytes;
  /* register slots per thread aimed at: a backward row that fits 256
   * threads x 2 slots takes twice the threads of KREG slots each (H100, two
   * rounds, % of copy: 4096 columns float32 99.8-99.9 -> 100.9, bfloat16
   * 98.1-98.4 -> 99.0-99.7, float16 98.1-98.4 -> 99.7-99.9; float32 1024
   * columns 100.0-100.1 -> 101.1; bench/NOTES-softmax.md v14). Not up to 512
   * threads x 2: two such CTAs per SM left too few loads in flight (bf16 6144
   * columns 84.5 against 97.4 % with 256 x 3, float32 3072 90.0 against 99.8,
   * bf16 8192 95.7 against 97.2; float32 4096 99.6 against 99.3; v17) */
  int kaim = BWD && KREG > 2 && nslots <= 256 * 2 ? 2 : KREG;
  if (oss_softmax_cuda_test_knobs[11] >= 1 && oss_softmax_cuda_test_knobs[11] <= KREG) kaim = oss_softmax_cuda_test_knobs[11];
  /* a backward row of 3/4 to all of 1024 x KREG register slots: one
   * 1024-thread CTA per SM holding it in registers, not two 512-thread CTAs
   * with a shared-memory part. H100, % of copy, two -> one, 2^28 elements:
   * bfloat16 24576 columns 101.3-101.4 -> 102.1-102.2, 16-bit 32768
   * 100.9-101.0 -> 101.7-101.8, float32 16384 101.8-101.9 -> 102.7; at 2^26
   * -0.3 to -0.4, 0 to +0.2 and +0.7 (two runs). Rows that fill less of it
   * lose (bfloat16 20000 columns, 2500 slots: 101.1 -> 98.0 at 2^28; 96.6 ->
   * 92.0 at 2^26), and so do misaligned rows, which run the general kernel
   * (float32 12289 columns 101.1 -> 93.3) and the forward (float32 20000
   * columns 100.3 -> 88.3, bfloat16 65536 98.4 -> 98.3; bench/NOTES-softmax.md
   * v22) */
  const bool regs1024 = BWD && P->al && tmax_hard == 1024 && kaim == KREG && force == 0 &&
                        oss_softmax_cuda_test_knobs[19] != 1 && oss_softmax_cuda_test_knobs[1] == 0 &&
                        oss_softmax_cuda_test_knobs[9] == 0 && 4 * nslots >= 3 * 1024 * KREG &&
                        nslots <= 1024 * KREG && sm_config_residency(kern, 1, 1024, 0, 1, stream) >= 1;
  /* (regs1024 starts at the last pass, whose first plan is that CTA) */
  for (int pass = quarter ? 0 : regs1024 ? 2 : 1; pass < 3 && force != 4 && force != 5; pass++) {
    if (pass == 2 && force == 0 && !regs1024 && sm_plan_spread<BWD, T1, T2, Acc>(J, info, nslots, spread_soft, stream, P))
      return OSS_OK;
    const int64_t limit = pass == 0 ? quarter_soft : pass == 1 ? soft : hard;
    const int64_t tmax = pass == 0 ? quarter_t : pass == 1 ? sm_first_pass_threads() : tmax_hard;
    for (int C = pass == 0 ? 2 : 1; C <= cmax; C *= 2) {
      if ((force == 2 && C > 1) || (force == 3 && C == 1)) continue;
      int64_t T, K, smem_slots;
      sm_chunk_shape(sm_cdiv(nslots, C), tmax, kaim, &T, &K, &smem_slots);
      const int64_t bytes = smem_slots * slot_bytes;
      if (bytes > limit) continue;
      if ((C > 1 || bytes > 40 * 1024 || T > 512) &&
          sm_config_residency(kern, C, (int)T, (size_t)bytes, 1, stream) < 1)
        continue;
      P->kind = SM_PLAN_CHUNKS;
      /* a one-CTA plan of registers only (aligned, float statistics) runs
       * the light kernel in the same shape, its instantiation with the
       * chunk kernel's register budget: the same data path without the
       * modes, the shared-memory part and the runtime log. H100, 2^26
       * elements, % of copy, five rounds in two calls: 16-bit backward
       * 32768 columns (1024 x 4) +0.22 to +0.29 (bfloat16 96.71 -> 97.00),
       * float32 backward 16384 +0.26, bfloat16 24576 +0.19, float32 forward
       * 8192 / 16384 (256 / 512 x 8) +0.36 / +0.31, 4096 (128 x 8) +0.30 and
       * -0.05, 16-bit forward 32768 (512 x 8) +0.2 to +0.3; 2^28: bfloat16
       * backward 32768 +0.12, float32 forward 4096 +0.18. At 2 slots per
       * thread (backward rows of <= 512 slots) the light instantiation lost
       * (bfloat16 backward 4096 -0.6 at 2^28, float32 2048 -0.4; v30), but
       * since the backward's block sum is lean it wins by 14-17 % on the
       * H200 (sm_cta_row_threads, v36), and on both GPUs where the CTA's
       * slots are not all filled (H100, 2^27: bfloat16 3000 columns, 375
       * slots on 256 x 2, 89.8 -> 99.8-100.0 % of copy; float32 1500 90.3
       * -> 101.2-101.4; H200 69.9 -> 100.1 and 102.4), so backward plans of
       * <= 2 slots per thread run its light footprint, except full ones
       * where the memory is slow for the SMs (sm_fast_memory_per_sm: on the
       * H100 those keep the chunk kernel, 0.3-1.5 points ahead). The
       * forward's keep the chunk kernel; test knob 24 = 1 turns all of this
       * off */
      if (C == 1 && smem_slots == 0 && (K > SM_CTA_ROW_K || (BWD && (fast_memory || T * K != nslots))) && P->al &&
          sizeof(Acc) == 4 && force == 0 && oss_softmax_cuda_test_knobs[24] != 1) {
        P->kind = SM_PLAN_CTA_ROW;
        P->km = K > SM_CTA_ROW_K ? KREG : SM_CTA_ROW_K;
      }
      /* backward clusters of 16 run the general kernel: aligned, float32
       * 262144 columns lost 1.7-1.8 points of copy (97.2-97.5 against
       * 99.0-99.2 % on the H100, 2^28 elements), while clusters of 8 tie or
       * gain (bench/NOTES-softmax.md v19). Same registers and shared memory,
       * so the residency checked above holds. */
      if (BWD && C == 16 && oss_softmax_cuda_test_knobs[16] != 2) P->al = 0;
      /* the L2 evict_last policy on the input where a row is on one CTA:
       * H100, 2^28 elements, % of copy without -> with it: warp tier
       * +0.5-1.3 points, one-CTA plans +0.6-1.4 (bench/NOTES-softmax.md
       * v18); clusters and the spread tier lose 0.9-8.8 with it (float32
       * backward 262144 89 against 98), the split tier is neutral */
      P->keep = C == 1;
      P->threads = (int)T;
      P->K = (int)K;
      P->C = C;
      P->smem_slots = (int)smem_slots;
      P->S = T * K + smem_slots;
      /* one CTA (cluster) per row, every row in grid.x. Rows used to go in
       * grid.y, capped at 65,535, so a CTA looped over rows beyond that:
       * H100, 2^28 elements, % of copy, capped -> one CTA per row: bfloat16
       * backward 2048 columns 102.1 -> 103.2, float32 forward 2048 100.3
       * -> 101.0, backward 103.0 -> 103.5 (bench/NOTES-softmax.md v22) */
      int64_t rows_at_once = 0x7fffffff / C;
      if (rows_cap > 0 && rows_cap < rows_at_once) rows_at_once = rows_cap;
      if (J->outer < rows_at_once) rows_at_once = J->outer;
      P->grid_x = (unsigned)(C * rows_at_once);
      P->grid_y = 1;
      return OSS_OK;
    }
  }

  /* split: chunks of 256 threads x KREG slots (four CTAs per SM),
   * statistics in the workspace */
  const int64_t split_t = 256, chunk = split_t * KREG;
  P->kind = SM_PLAN_SPLIT;
  P->threads = (int)split_t;
  P->K = KREG;
  P->S = chunk;
  P->nchunks = sm_cdiv(nslots, chunk);
  if (P->nchunks > 0x7fffffff) return oss_fail(OSS_ERROR_NOT_SUPPORTED, "softmax: a row of %lld elements is too long", (long long)J->n);
  P->C = (int)P->nchunks;
  P->grid_x = (unsigned)P->nchunks;
  P->grid_y = (unsigned)(J->outer < split_ymax ? J->outer : split_ymax);
  P->ws_bytes = (size_t)(J->outer * P->nchunks + J->outer) * sizeof(sm_stat<Acc>);
  return OSS_OK;
}

// ---- planning: columns --------------------------------------------------------------

/* The columns kernel instantiation for a CTA size (float64 statistics: 256 only). */
template <bool BWD, typename T1, typename T2, typename Acc>
static void (*sm_columns_kernel_for(int threads))(sm_col_args) {
  if constexpr (sizeof(Acc) == 4)
    if (threads == SM_COL_THREADS_WIDE) return softmax_columns_kernel<BWD, T1, T2, Acc, SM_COL_THREADS_WIDE>;
  return softmax_columns_kernel<BWD, T1, T2, Acc, SM_COL_THREADS>;
}

/* The columns kernel's CTA size for a tile of `bytes`: 256 threads, or 512
 * (float statistics only: double's static shared memory would not fit beside
 * it) when the tile leaves room for no second CTA on the SM */
template <typename Acc> static int sm_col_threads(int64_t bytes, const oss_device_info *info) {
  const int k = oss_softmax_cuda_test_knobs[8];
  if (k == SM_COL_THREADS || (k == SM_COL_THREADS_WIDE && sizeof(Acc) == 4)) return k;
  return sizeof(Acc) == 4 && bytes > info->max_smem_per_sm / 2 - 8 * 1024 ? SM_COL_THREADS_WIDE : SM_COL_THREADS;
}

/* The most bytes of a column tile per CTA in the sm_90 cluster plans */
enum { SM_COL_CLUSTER_BYTES = 64 * 1024 };

template <bool BWD, typename T1, typename T2, typename Acc>
static oss_status sm_plan_cols(const sm_job *J, const oss_device_info *info, cudaStream_t stream, sm_plan *P) {
  constexpr int VEC = sm_vec<T1>();
  const int64_t es = sizeof(T1), es2 = sizeof(T2), NA = BWD ? 2 : 1;
  const int64_t A2 = VEC * es2 < 16 ? VEC * es2 : 16;
  memset(P, 0, sizeof *P);
  /* 16-byte pieces are aligned for every (outer, row) when the strides are
   * multiples of 16 bytes; the tile grid then follows the base's misalignment */
  P->vec_a = (J->sn_a * es) % 16 == 0 && (J->outer == 1 || (J->so_a * es) % 16 == 0);
  P->ph = P->vec_a ? (int)(((uintptr_t)J->a / es) % VEC) : 0;
  P->vec_b = !BWD || (P->vec_a && (J->sn_b * es) % 16 == 0 && (J->outer == 1 || (J->so_b * es) % 16 == 0) &&
                      (int)(((uintptr_t)J->b / es) % VEC) == P->ph);
  P->vec_out = (J->sn_out * es2) % A2 == 0 && (J->outer == 1 || (J->so_out * es2) % A2 == 0) &&
               (((uintptr_t)J->out - (uintptr_t)P->ph * es2) % A2) == 0;

  /* tile width: 64-byte row segments, wider (up to 256 columns) while the
   * tile is small, narrower when inner is. 32-byte segments only where a
   * 64-byte tile cannot be held at all: on the H100 they cost the dim=1
   * backward of (32, 1024, 64, 64) float32 80 % of copy against 89 % for
   * 64-byte segments at one CTA per SM (forward: 78 % against 89 %) */
  const int64_t span = sm_pow2_ceil(J->inner + P->ph);
  int64_t TJ = 64 / es;
  if (span < TJ) TJ = span < VEC ? VEC : span;
  while (TJ < SM_COL_THREADS && TJ * 2 <= span && J->n * TJ * es * NA < 16 * 1024) TJ *= 2;
  const int force_bytes = oss_softmax_cuda_test_knobs[6];
  if (force_bytes >= 16 && force_bytes / es <= SM_COL_THREADS) TJ = force_bytes / es;
  const int64_t soft = oss_softmax_cuda_test_knobs[4] > 0 ? oss_softmax_cuda_test_knobs[4] * 1024 : 72 * 1024;
  const int64_t hard = (int64_t)info->max_smem_per_block_optin - 16 * 1024;
  const int64_t ymax = oss_softmax_cuda_test_knobs[10] > 0 ? oss_softmax_cuda_test_knobs[10] : 65535;
  const unsigned grid_y1 = (unsigned)(J->outer < ymax ? J->outer : ymax);
  const int cforce = oss_softmax_cuda_test_knobs[12];
  /* sm_90: the fewest CTAs c (a power of two in [cmin, cmax], a cluster
   * where c > 1) that share a tile of tj columns with at most `limit` bytes
   * of it each (with cforce: c = cforce, up to `hard`); 0 where none can run */
  const auto fit = [&](int64_t tj, int64_t limit, int cmin, int cmax) -> int {
    for (int c = cmin; c <= cmax; c *= 2) {
      const int64_t per = sm_cdiv(J->n, c) * tj * es * NA;
      if (cforce ? c != cforce : per > limit) continue;
      if (per > hard || sm_cdiv(J->inner + P->ph, tj) * c > 0x7fffffff) continue;
      if (c == 1) return 1;
      const int threads = sm_col_threads<Acc>(per, info);
      const size_t xch = (size_t)c * 2 * tj * sizeof(sm_stat<Acc>);
      if (sm_config_residency(sm_columns_kernel_for<BWD, T1, T2, Acc>(threads), c, threads, (size_t)per + xch, grid_y1,
                              stream) >= 1)
        return c;
    }
    return 0;
  };
  /* On sm_90 a cluster shares the tile by rows, so the segments can be 128
   * bytes with at most SM_COL_CLUSTER_BYTES of the tile per CTA, in clusters
   * of up to 8 CTAs (16-bit: 4, whose tiles hold twice the elements per
   * byte). H100, % of copy (bench/NOTES-softmax.md v15): dim=1 of (32, 1024,
   * 64, 64) float32 forward 89.3 -> 94.1 with clusters of 2, backward 91.3
   * -> 93.5 with 4; bfloat16 forward 87.9 -> 90.3, backward 85.7 -> 90.3.
   * Larger clusters of 128-byte segments lose (n = 4096 bfloat16 forward:
   * 69.6 with 8, against 80.1 for 64-byte segments in 4). Failing that,
   * 64-byte segments in clusters of up to 16 with <= SM_COL_CLUSTER_BYTES
   * each, then clusters of 16 with up to `hard`: they hold what one CTA
   * cannot (n = 4096 float32 forward 67 -> 81 %, backward 53 -> 81 %);
   * else one CTA or the split path below. */
  int C = 0;
  if (info->cc_major >= 9 && oss_softmax_cuda_test_knobs[3] == 0) {
    int64_t wide = TJ;
    while (force_bytes == 0 && wide * es < 128 && wide * 2 <= span && wide * 2 <= SM_COL_THREADS) wide *= 2;
    if ((C = fit(wide, SM_COL_CLUSTER_BYTES, 1, cforce ? 16 : es == 2 ? 4 : 8)) != 0) {
      TJ = wide;
      /* the L2 evict_last policy on these clusters' input. H100, % of
       * copy without -> with it, dim=1 of (32, 1024, 64, 64), two rounds:
       * float32 forward 94.0 -> 94.6, backward 90.0-90.2 -> 94.7-94.8,
       * bfloat16 forward 81.6-88.0 -> 90.9-91.3, backward 86.1-86.7 ->
       * 91.6-92.1; the same kind of plan at n = 512, 2048 and 4096 (one
       * round) +1.4 to +4.3. Others lost with it: 64-byte segments and
       * clusters of 16 0.5-6.4 points, one-CTA tiles up to 12 (and the
       * planner's one-CTA 128-byte tiles -0.7 to +1.2); bench/NOTES-softmax.md
       * v19 */
      P->keep = C > 1 && wide * es == 128;
    }
    else if (wide == TJ || (C = fit(TJ, SM_COL_CLUSTER_BYTES, 1, 16)) == 0) C = fit(TJ, hard, 16, 16);
  }
  if (C == 0) C = 1;
  int64_t chunk_n = sm_cdiv(J->n, C);
  if (C == 1) {
    if (J->n * TJ * es * NA > hard && TJ * es > 32 && J->n * (TJ / 2) * es * NA <= hard) TJ /= 2; /* 32-byte segments */
    if (J->n * TJ * es * NA > hard) chunk_n = soft / (TJ * es * NA);
    if (oss_softmax_cuda_test_knobs[3] > 0 && oss_softmax_cuda_test_knobs[3] < chunk_n) chunk_n = oss_softmax_cuda_test_knobs[3];
  }
  P->TJ = (int)TJ;
  P->C = C;
  P->chunk_n = chunk_n;
  P->nchunks = C > 1 ? 1 : sm_cdiv(J->n, chunk_n);
  P->kind = P->nchunks == 1 ? SM_PLAN_COLS : SM_PLAN_COLS_SPLIT;
  const int64_t xch_bytes = C > 1 ? C * 2 * TJ * (int64_t)sizeof(sm_stat<Acc>) : 0; /* cluster exchange */
  P->smem_slots = (int)(chunk_n * (TJ / VEC) * NA + (xch_bytes + 15) / 16);
  P->threads = sm_col_threads<Acc>(chunk_n * TJ * es * NA, info);
  if (P->kind == SM_PLAN_COLS_SPLIT)
    P->ws_bytes = (size_t)(J->outer * J->inner * (P->nchunks + 1)) * sizeof(sm_stat<Acc>);
  const int64_t tiles_c = sm_cdiv(J->inner + P->ph, TJ) * C;
  if (tiles_c > 0x7fffffff)
    return oss_fail(OSS_ERROR_NOT_SUPPORTED, "softmax: inner=%lld is too large", (long long)J->inner);
  P->grid_x = (unsigned)tiles_c;
  const int64_t pairs = J->outer * P->nchunks;
  P->grid_y = (unsigned)(pairs < ymax ? pairs : ymax);
  return OSS_OK;
}

// ---- launches -------------------------------------------------------------------------

/* Launches kern in clusters of C CTAs along grid x (sm_90). */
template <typename Args>
static oss_status sm_launch_clusters(void (*kern)(Args), dim3 grid, dim3 block, size_t smem, int C, cudaStream_t stream,
                                     Args A, const char *name) {
  sm_cluster_config L;
  OSS_CUDA_TRY(sm_cluster_config_init(&L, kern, C, grid, block, smem, stream));
  cudaError_t err = cudaLaunchKernelEx(&L.cfg, kern, A);
  if (err != cudaSuccess)
    return oss_fail(OSS_ERROR_CUDA, "launch of %s (cluster of %d) failed: %s", name, C, cudaGetErrorString(err));
  return oss_check_launch(name);
}

/* Launches kern right behind the previous launch on the stream: on sm_90 with
 * programmatic dependent launch, so its CTAs may start (and issue loads that
 * do not depend on that launch) while the previous kernel's last CTAs run;
 * the kernel calls sm_pdl_wait before it reads what the previous one wrote,
 * and that one calls sm_pdl_launch_dependents. A plain launch elsewhere. */
template <typename... Params, typename... Args>
static oss_status sm_launch_dependent(void (*kern)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                      const oss_device_info *info, const char *name, Args... args) {
  cudaLaunchConfig_t cfg;
  cudaLaunchAttribute attr;
  memset(&cfg, 0, sizeof cfg);
  memset(&attr, 0, sizeof attr);
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = info->cc_major >= 9 && oss_softmax_cuda_test_knobs[14] != 1 ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kern, args...);
  if (err != cudaSuccess) return oss_fail(OSS_ERROR_CUDA, "launch of %s failed: %s", name, cudaGetErrorString(err));
  return oss_check_launch(name);
}

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
  return sm_launch_dependent(softmax_merge_partials_kernel<BWD, Acc>, dim3((unsigned)blocks), dim3(SM_MERGE_THREADS), 0,
                             stream, info, "softmax_merge_partials_kernel", (const sm_stat<Acc> *)part,
                             (sm_stat<Acc> *)fin, items, inner, nchunks, G);
}

/* Test knob 13: dynamic shared memory that leaves room for only that many
 * CTAs per SM (0: none). */
static size_t sm_test_occupancy_pad(const oss_device_info *info) {
#ifdef OSS_SOFTMAX_TEST_KNOBS
  const int cap = oss_softmax_cuda_test_knobs[13];
  if (cap >= 2 && cap <= 32) return (size_t)(info->max_smem_per_sm / cap) - 2048;
#endif
  (void)info;
  return 0;
}

/* Which units (rows; outer indices for the columns kernel) of `units`, each
 * `unit_bytes` of input, get their input lines set back to evict_normal after
 * their output where the loads carry evict_last (keep): [*lo, *hi), the
 * last ones, as many as hold a third of the L2's size of input. The L2 keeps
 * only the latest ~5 MB of evict_last lines: newer ones displace older ones,
 * so only the lines loaded last can still be there when the call ends. H100
 * (50 MiB of L2), 128 MiB inputs, L2 hits of a re-read of the input after the
 * call and a stream of 4x the L2 (scripts/softmax_l2_residue.py), in sectors:
 * no release 153K; released the last 16 MiB 0-2,070, the last 32 or 64 MiB or
 * all 66 (as after a flush); the first 16 or 64 MiB 153K (bench/NOTES-softmax.md
 * v23); the last third of the L2 (this window) 8-80 at five points and 3,688
 * (118 KB) at bfloat16 backward 4096 columns, the last 8 MiB 23K-33K (v26).
 * Each release costs L2 traffic, so the window is as short as that
 * allows: at 2^26 elements, % of copy, L2's size -> 16 MiB, with the L2
 * flushed by a write / by a read before each call (v26): bfloat16 forward
 * 4096 columns 94.1 -> 95.0 / 101.0 -> 101.6, bfloat16 backward 4096 98.0 ->
 * 98.4 / 102.9 -> 103.9, float16 backward 4096 98.7 -> 98.9 / 103.7 -> 103.7,
 * the columns kernel's bfloat16 dim=1 forward and backward +0.2 to +0.6; the
 * one-CTA plans at 32768 columns within 0.3. Releasing every row instead cost
 * (v23, window = the L2's size -> all): 16-bit backward 4096 columns 99.0-99.2
 * -> 97.2-97.6, bfloat16 forward 65536 92.2 -> 91.1. Test knob 20 sets the
 * window in MiB, 21 = 1 puts it at the first units. */
static void sm_release_window(int64_t units, int64_t unit_bytes, const oss_device_info *info, int64_t *lo,
                              int64_t *hi) {
  int64_t window = info->l2_bytes / 3;
  if (oss_softmax_cuda_test_knobs[20] > 0) window = (int64_t)oss_softmax_cuda_test_knobs[20] << 20;
  const int64_t count = sm_cdiv(window, unit_bytes > 0 ? unit_bytes : 1);
  *lo = 0;
  *hi = units;
  if (count >= units) return;
  if (oss_softmax_cuda_test_knobs[21] == 1) *hi = count;
  else *lo = units - count;
}

/* The first wave's ramp, for the chunk kernel's rows and the one-row-per-CTA
 * kernel's chunk-budget rows (bench/NOTES-softmax.md v32). A launch's first
 * wave of rows (one per CTA or cluster, as many as are resident at once:
 * wave_rows) would start together, read together and write together, and the
 * later waves inherit that lockstep: the DRAM sees reads,
 * a pause, then writes, wave after wave. Instead row r < wave_rows starts r
 * steps late, a step being the time the DRAM takes to stream one row's input
 * (at 85 % of its peak, about what a copy reaches), so the first wave's rows
 * start about as their inputs can arrive and their reads and writes
 * interleave from then on. Only where the launch has more rows than one wave:
 * a single wave has no later waves to gain from it. H100, 2^26 elements, % of
 * copy, ramp off -> on (v32): the 16-bit forward at 1M columns (clusters of
 * 16, 14 rows at once) 85.4-85.6 -> 88.0-88.1, bfloat16 262144 91.2 -> 92.3,
 * float16 128256 91.2 -> 92.8, float32 262144 95.1 -> 96.0, backward bfloat16
 * 262144 95.1 -> 96.2, float32 262144 96.0 -> 97.4; 70 % or 130 % of the step
 * did no better. The one-row-per-CTA kernel's rows (a CTA per SM or a few)
 * take 40 % of the step (`percent`): 16-bit backward 32768 columns 97.0 ->
 * 97.6-97.7, float32 forward 4096 98.4 -> 98.8, backward 16384 100.0 -> 100.3;
 * 60 % and 80 % gained less, and its light instantiation (two slots per
 * thread) lost 0.2 at the 16-bit forward 8192, so it has none. Test knob 25:
 * -1 off, else the step in % of the computed one, for both kernels. */
static void sm_first_wave_ramp(sm_row_args *A, int64_t wave_rows, int64_t row_in_bytes, const oss_device_info *info,
                               int percent) {
  const int scale = oss_softmax_cuda_test_knobs[25] == 0 ? percent : oss_softmax_cuda_test_knobs[25];
  if (scale < 0 || info->dram_bytes_per_ns <= 0 || wave_rows < 2 || A->rows <= wave_rows) return;
  const double step = (double)row_in_bytes / (0.85 * info->dram_bytes_per_ns) * scale / 100;
  if (step < 1) return;
  A->ramp_ns = step > 100000 ? 100000 : (int)step;
  A->ramp_rows = wave_rows;
}

template <bool BWD, typename T1, typename T2, typename Acc>
static oss_status sm_run_rows(const sm_job *J, const sm_plan *P, void *ws, const oss_device_info *info,
                              cudaStream_t stream) {
  sm_row_args A;
  memset(&A, 0, sizeof A);
  A.a = J->a;
  A.b = J->b;
  A.out = J->out;
  A.so_a = J->so_a;
  A.so_b = J->so_b;
  A.so_out = J->so_out;
  A.rows = J->outer;
  A.n = J->n;
  A.log = J->log;
  const int policy_knob = oss_softmax_cuda_test_knobs[17]; /* 1: no policy, 2: no release */
  A.keep = !P->keep || policy_knob == 1 ? 0 : policy_knob == 2 ? 2 : 1;
  A.release_lo = 0;
  A.release_hi = J->outer;
  /* on the H100 the warp tier releases every row: after an L2 flush by a
   * write (the benchmark's), that streams up to 0.5 points of copy faster
   * than the window (bfloat16 forward at 128 columns, 2^26 elements: 94.6
   * against 94.1 %; v23: 0.2-0.3 against the L2's size). After a flush by a
   * read the window is 0.35-1.4 ahead at those points (bench/NOTES-softmax.md
   * v26): the choice follows the benchmark's protocol. Where memory is fast
   * per SM (the H200) the release requests of every row cost the narrow rows
   * 0.5-9.6 points of copy against the window (16-bit backward 128 columns
   * 97.8 -> 101.4 % at 2^27, 256 columns 88.75 -> 98.35 at 2^26; forward 64
   * columns 84.8 -> 93.45 at 2^26, v38; float32 backward 128 columns 97.0 ->
   * 100.75 at 2^26 by do_bench's protocol, v39), so they take the window there. */
  const bool every_row = (P->kind == SM_PLAN_WARP && !sm_fast_memory_per_sm(info)) ||
                         (P->kind == SM_PLAN_CTA_ROW && oss_softmax_cuda_test_knobs[23] == 1);
  if (A.keep == 1 && (!every_row || oss_softmax_cuda_test_knobs[20] > 0))
    sm_release_window(J->outer, J->n * (int64_t)sizeof(T1) * (BWD ? 2 : 1), info, &A.release_lo, &A.release_hi);
  /* the kernels shift where they would divide by these (softmax_rows.cuh) */
  const bool pow2 = P->kind == SM_PLAN_WARP      ? (P->G & (P->G - 1)) == 0
                    : P->kind == SM_PLAN_CTA_ROW ? (P->threads & (P->threads - 1)) == 0 && P->K <= P->km
                                            : (P->threads & (P->threads - 1)) == 0 &&
                                                  (P->kind != SM_PLAN_CHUNKS || (P->C & (P->C - 1)) == 0);
  if (!pow2)
    return oss_fail(OSS_ERROR_NOT_SUPPORTED, "softmax: internal plan error (threads=%d G=%d C=%d K=%d)",
                    P->threads, P->G, P->C, P->K);
  A.K = P->K;
  A.G = P->G;
  A.C = P->C;
  A.S = P->S;
  A.smem_slots = P->smem_slots;
  const size_t pad = sm_test_occupancy_pad(info);
  const int64_t row_in_bytes = J->n * (int64_t)sizeof(T1) * (BWD ? 2 : 1);
  if (P->kind == SM_PLAN_WARP) {
    const sm_row_kernel wk = sm_warp_kernel_for<BWD, T1, T2, Acc>(P->al, P->km, P->rl);
    if (pad > 40 * 1024) OSS_CUDA_TRY(cudaFuncSetAttribute(wk, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pad));
    wk<<<P->grid_x, P->threads, pad, stream>>>(A);
    return oss_check_launch("softmax_rows_in_warp_kernel");
  }
  if (P->kind == SM_PLAN_CTA_ROW) {
    const sm_row_kernel ck = sm_cta_row_kernel_for<BWD, T1, T2, Acc>(P->km);
    if (ck == NULL) return oss_fail(OSS_ERROR_NOT_SUPPORTED, "softmax: internal plan error (light tier for float64)");
    if (pad > 40 * 1024) OSS_CUDA_TRY(cudaFuncSetAttribute(ck, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pad));
    if (P->km > SM_CTA_ROW_K) /* the kernel's light instantiation has no ramp */
      sm_first_wave_ramp(&A, (int64_t)sm_config_residency(ck, 1, P->threads, pad, 1, stream) * info->sm_count,
                         row_in_bytes, info, 40);
    ck<<<P->grid_x, P->threads, pad, stream>>>(A);
    return oss_check_launch("softmax_row_in_cta_kernel");
  }
  const sm_row_kernel kern = sm_chunks_kernel_for<BWD, T1, T2, Acc>(P->al);
  const dim3 grid(P->grid_x, P->grid_y, 1), block((unsigned)P->threads, 1, 1);
  /* SM_CHUNKS and SM_SPREAD (split plans have none); static shared memory
   * counts toward the default 48 KB: opt in early */
  size_t smem = (size_t)P->smem_slots * 16 * (BWD ? 2 : 1);
  if (P->kind == SM_PLAN_CHUNKS && P->C == 1 && pad > smem) smem = pad;
  if (smem > 40 * 1024) OSS_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  if (P->kind == SM_PLAN_CHUNKS) {
    A.mode = SM_FULL;
    const int resident = sm_config_residency(kern, P->C, P->threads, smem, P->grid_y, stream);
    sm_first_wave_ramp(&A, P->C > 1 ? resident : (int64_t)resident * info->sm_count, row_in_bytes, info, 100);
    if (P->C == 1) {
      kern<<<grid, block, smem, stream>>>(A);
      return oss_check_launch("softmax_row_chunks_kernel");
    }
    return sm_launch_clusters(kern, grid, block, smem, P->C, stream, A, "softmax_row_chunks_kernel");
  }
  if (P->kind == SM_PLAN_SPREAD) {
    A.mode = SM_SPREAD;
    A.counters = (unsigned *)ws;
    A.partials = (char *)ws + sm_spread_counter_bytes(J->outer);
    OSS_CUDA_TRY(cudaMemsetAsync(ws, 0, sm_spread_counter_bytes(J->outer), stream));
    kern<<<grid, block, smem, stream>>>(A);
    return oss_check_launch("softmax_row_chunks_kernel (spread)");
  }
  /* split */
  A.partials = ws;
  A.finals = (char *)ws + (size_t)(J->outer * P->nchunks) * sizeof(sm_stat<Acc>);
  A.mode = SM_STATS;
  kern<<<grid, block, 0, stream>>>(A);
  oss_status s = oss_check_launch("softmax_row_chunks_kernel (stats)");
  if (s != OSS_OK) return s;
  s = sm_launch_merge<BWD, Acc>(A.partials, A.finals, J->outer, 1, P->nchunks, info, stream);
  if (s != OSS_OK) return s;
  A.mode = SM_APPLY;
  return sm_launch_dependent(kern, grid, block, 0, stream, info, "softmax_row_chunks_kernel (apply)", A);
}

template <bool BWD, typename T1, typename T2, typename Acc>
static oss_status sm_run_cols(const sm_job *J, const sm_plan *P, void *ws, const oss_device_info *info,
                              cudaStream_t stream) {
  sm_col_args A;
  memset(&A, 0, sizeof A);
  A.a = J->a;
  A.b = J->b;
  A.out = J->out;
  A.so_a = J->so_a;
  A.sn_a = J->sn_a;
  A.so_b = J->so_b;
  A.sn_b = J->sn_b;
  A.so_out = J->so_out;
  A.sn_out = J->sn_out;
  A.outer = J->outer;
  A.n = J->n;
  A.inner = J->inner;
  A.log = J->log;
  A.TJ = P->TJ;
  A.ph = P->ph;
  A.vec_a = P->vec_a;
  A.vec_b = P->vec_b;
  A.vec_out = P->vec_out;
  A.chunk_n = P->chunk_n;
  A.nchunks = P->nchunks;
  A.C = P->C;
  A.keep = P->keep && oss_softmax_cuda_test_knobs[18] != 1;
  if (A.keep)
    sm_release_window(J->outer, J->n * J->inner * (int64_t)sizeof(T1) * (BWD ? 2 : 1), info, &A.release_lo,
                      &A.release_hi);
  void (*kern)(sm_col_args) = sm_columns_kernel_for<BWD, T1, T2, Acc>(P->threads);
  const size_t smem = (size_t)P->smem_slots * 16;
  /* static shared memory (up to 12 KB) counts toward the default 48 KB: opt in early */
  if (smem > 32 * 1024) OSS_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  const dim3 grid(P->grid_x, P->grid_y, 1), block((unsigned)P->threads, 1, 1);
  if (P->kind == SM_PLAN_COLS) {
    A.mode = SM_FULL;
    if (P->C > 1) return sm_launch_clusters(kern, grid, block, smem, P->C, stream, A, "softmax_columns_kernel");
    kern<<<grid, block, smem, stream>>>(A);
    return oss_check_launch("softmax_columns_kernel");
  }
  const int64_t items = J->outer * J->inner;
  A.partials = ws;
  A.finals = (char *)ws + (size_t)(items * P->nchunks) * sizeof(sm_stat<Acc>);
  A.mode = SM_STATS;
  kern<<<grid, block, smem, stream>>>(A);
  oss_status s = oss_check_launch("softmax_columns_kernel (stats)");
  if (s != OSS_OK) return s;
  s = sm_launch_merge<BWD, Acc>(A.partials, A.finals, items, J->inner, P->nchunks, info, stream);
  if (s != OSS_OK) return s;
  A.mode = SM_APPLY;
  kern<<<grid, block, smem, stream>>>(A);
  return oss_check_launch("softmax_columns_kernel (apply)");
}

/* Plans (launch == false: fills *P, its ws_bytes rounded up to 16) or
 * launches the plan *P (launch == true). */
template <bool BWD, typename T1, typename T2, typename Acc>
static oss_status sm_run(const sm_job *J, sm_plan *P, void *ws, cudaStream_t stream, bool launch) {
  oss_device_info info;
  oss_status s = oss_get_device_info(&info);
  if (s != OSS_OK) return s;
  if (!launch) {
    s = J->inner == 1 ? sm_plan_rows<BWD, T1, T2, Acc>(J, &info, stream, P)
                      : sm_plan_cols<BWD, T1, T2, Acc>(J, &info, stream, P);
    P->ws_bytes = (P->ws_bytes + 15) & ~(size_t)15;
    return s;
  }
#ifdef OSS_SOFTMAX_TEST_KNOBS
  if (oss_softmax_cuda_test_knobs[7] & (BWD ? 2 : 1)) {
    oss_softmax_cuda_test_knobs[7] &= BWD ? ~2 : ~1;
    static const char *kinds[] = {"warp", "chunks", "split", "cols", "cols-split", "spread", "cta-row"};
    printf("plan %s: %s al=%d keep=%d km=%d rl=%d threads=%d K=%d G=%d C=%d smem_slots=%d S=%lld TJ=%d chunk_n=%lld nchunks=%lld grid=%ux%u ws=%zu\n",
           BWD ? "bwd" : "fwd", kinds[P->kind], P->al, P->keep, P->km, P->rl, P->threads, P->K, P->G, P->C, P->smem_slots,
           (long long)P->S, P->TJ, (long long)P->chunk_n, (long long)P->nchunks, P->grid_x, P->grid_y, P->ws_bytes);
    if (P->kind == SM_PLAN_CHUNKS || P->kind == SM_PLAN_SPREAD)
      printf("plan %s: resident at once: %d %s\n", BWD ? "bwd" : "fwd",
             sm_config_residency(sm_chunks_kernel_for<BWD, T1, T2, Acc>(P->al), P->kind == SM_PLAN_SPREAD ? 1 : P->C,
                                 P->threads, (size_t)P->smem_slots * 16 * (BWD ? 2 : 1), P->grid_y, stream),
             P->C > 1 && P->kind == SM_PLAN_CHUNKS ? "clusters on the GPU" : "CTAs per SM");
    if (P->kind == SM_PLAN_CTA_ROW)
      printf("plan %s: resident at once: %d CTAs per SM\n", BWD ? "bwd" : "fwd",
             sm_config_residency(sm_cta_row_kernel_for<BWD, T1, T2, Acc>(P->km), 1, P->threads, 0, 1, stream));
    if (P->kind == SM_PLAN_COLS || P->kind == SM_PLAN_COLS_SPLIT)
      printf("plan %s: resident at once: %d %s\n", BWD ? "bwd" : "fwd",
             sm_config_residency(sm_columns_kernel_for<BWD, T1, T2, Acc>(P->threads), P->C, P->threads,
                                 (size_t)P->smem_slots * 16, P->grid_y, stream),
             P->C > 1 ? "clusters on the GPU" : "CTAs per SM");
    fflush(stdout);
  }
#endif
  return J->inner == 1 ? sm_run_rows<BWD, T1, T2, Acc>(J, P, ws, &info, stream)
                       : sm_run_cols<BWD, T1, T2, Acc>(J, P, ws, &info, stream);
}

template <bool BWD, typename T1>
static oss_status sm_dispatch_out(const sm_job *J, sm_plan *P, void *ws, cudaStream_t stream, bool launch) {
  switch (J->tout) {
  case OSS_FLOAT32: return sm_run<BWD, T1, float, float>(J, P, ws, stream, launch);
  case OSS_FLOAT16: return sm_run<BWD, T1, __half, float>(J, P, ws, stream, launch);
  case OSS_BFLOAT16: return sm_run<BWD, T1, __nv_bfloat16, float>(J, P, ws, stream, launch);
  default: break;
  }
  return oss_fail(OSS_ERROR_NOT_SUPPORTED, "softmax: unsupported output dtype");
}

template <bool BWD> static oss_status sm_dispatch(const sm_job *J, sm_plan *P, void *ws, cudaStream_t stream, bool launch) {
  switch (J->ta) {
  case OSS_FLOAT32: return sm_dispatch_out<BWD, float>(J, P, ws, stream, launch);
  case OSS_FLOAT16: return sm_dispatch_out<BWD, __half>(J, P, ws, stream, launch);
  case OSS_BFLOAT16: return sm_dispatch_out<BWD, __nv_bfloat16>(J, P, ws, stream, launch);
  case OSS_FLOAT64: return sm_run<BWD, double, double, double>(J, P, ws, stream, launch);
  default: break;
  }
  return oss_fail(OSS_ERROR_NOT_SUPPORTED, "softmax: unsupported input dtype");
}

// ---- validation ---------------------------------------------------------------------------

static int sm_is_float(oss_dtype t) {
  return t == OSS_FLOAT32 || t == OSS_FLOAT64 || t == OSS_FLOAT16 || t == OSS_BFLOAT16;
}

static oss_status sm_check_tensor(const char *op, const char *name, const oss_strided3 *t, const sm_job *J) {
  if (!sm_is_float(t->dtype))
    return oss_fail(OSS_ERROR_NOT_SUPPORTED,
                    "%s: %s.dtype=%s is not supported; the CUDA kernels take float32, float64, float16 or bfloat16",
                    op, name, sm_dtype_name(t->dtype));
  if (J->inner == 1 && J->n > 1 && t->stride_n != 1)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: %s.stride_n=%lld but rows (inner == 1) must be contiguous",
                    op, name, (long long)t->stride_n);
  if (t->data == NULL)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: %s.data is NULL for a non-empty tensor", op, name);
  if ((uintptr_t)t->data % sm_dtype_size(t->dtype) != 0)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: %s.data is not aligned to its %s element size", op, name,
                    sm_dtype_name(t->dtype));
  return OSS_OK;
}

/* The part of a job both directions share: the view's sizes and the log flag
 * into *J (zeroed first); *empty when there is nothing to compute. */
static oss_status sm_job_view(const char *op, int bwd, int log, int64_t outer, int64_t n, int64_t inner, sm_job *J,
                              int *empty) {
  if (outer < 0 || n < 0 || inner < 0)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: view [outer=%lld, n=%lld, inner=%lld] has a negative size", op,
                    (long long)outer, (long long)n, (long long)inner);
  memset(J, 0, sizeof *J);
  J->bwd = bwd;
  J->log = log ? 1 : 0;
  J->outer = outer;
  J->n = n;
  J->inner = inner;
  *empty = outer == 0 || n == 0 || inner == 0;
  return OSS_OK;
}

/* Fills J from the forward params; *empty = 1 when there is nothing to do. */
static oss_status sm_job_forward(const oss_softmax_params *p, sm_job *J, int *empty) {
  const char *op = "oss_softmax_forward_cuda";
  if (p == NULL) return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: params is NULL", op);
  oss_status s = sm_job_view(op, 0, p->log, p->outer, p->n, p->inner, J, empty);
  if (s != OSS_OK) return s;
  if (!sm_is_float(p->x.dtype) || !sm_is_float(p->y.dtype) ||
      ((p->x.dtype == OSS_FLOAT64) != (p->y.dtype == OSS_FLOAT64)))
    return oss_fail(OSS_ERROR_NOT_SUPPORTED,
                    "%s: x.dtype=%s with y.dtype=%s is not supported; x and y may be float32, float16 or bfloat16 "
                    "in any combination, or both float64",
                    op, sm_dtype_name(p->x.dtype), sm_dtype_name(p->y.dtype));
  if (*empty) return OSS_OK;
  s = sm_check_tensor(op, "x", &p->x, J);
  if (s == OSS_OK) s = sm_check_tensor(op, "y", &p->y, J);
  if (s != OSS_OK) return s;
  J->a = p->x.data;
  J->b = p->x.data;
  J->out = p->y.data;
  J->ta = p->x.dtype;
  J->tout = p->y.dtype;
  J->so_a = J->so_b = p->x.stride_outer;
  J->sn_a = J->sn_b = p->x.stride_n;
  J->so_out = p->y.stride_outer;
  J->sn_out = p->y.stride_n;
  return OSS_OK;
}

static oss_status sm_job_backward(const oss_softmax_backward_params *p, sm_job *J, int *empty) {
  const char *op = "oss_softmax_backward_cuda";
  if (p == NULL) return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: params is NULL", op);
  oss_status s = sm_job_view(op, 1, p->log, p->outer, p->n, p->inner, J, empty);
  if (s != OSS_OK) return s;
  if (!sm_is_float(p->y.dtype) || !sm_is_float(p->dy.dtype) || !sm_is_float(p->dx.dtype) ||
      ((p->y.dtype == OSS_FLOAT64) != (p->dx.dtype == OSS_FLOAT64)))
    return oss_fail(OSS_ERROR_NOT_SUPPORTED,
                    "%s: y.dtype=%s, dy.dtype=%s, dx.dtype=%s is not supported; y/dy and dx may be float32, float16 "
                    "or bfloat16 in any combination, or all float64",
                    op, sm_dtype_name(p->y.dtype), sm_dtype_name(p->dy.dtype), sm_dtype_name(p->dx.dtype));
  if (p->y.dtype != p->dy.dtype)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: y.dtype=%s but dy.dtype=%s; they must match", op,
                    sm_dtype_name(p->y.dtype), sm_dtype_name(p->dy.dtype));
  if (*empty) return OSS_OK;
  s = sm_check_tensor(op, "y", &p->y, J);
  if (s == OSS_OK) s = sm_check_tensor(op, "dy", &p->dy, J);
  if (s == OSS_OK) s = sm_check_tensor(op, "dx", &p->dx, J);
  if (s != OSS_OK) return s;
  J->a = p->y.data;
  J->b = p->dy.data;
  J->out = p->dx.data;
  J->ta = p->y.dtype;
  J->tout = p->dx.dtype;
  J->so_a = p->y.stride_outer;
  J->sn_a = p->y.stride_n;
  J->so_b = p->dy.stride_outer;
  J->sn_b = p->dy.stride_n;
  J->so_out = p->dx.stride_outer;
  J->sn_out = p->dx.stride_n;
  return OSS_OK;
}

// ---- the C API ------------------------------------------------------------------------------

/* What oss_softmax_plan_cuda.internal holds. */
typedef struct sm_saved_plan {
  uint32_t magic; /* SM_SAVED_PLAN_MAGIC once a plan function has filled it */
  int device;     /* current when it was planned */
  int empty;      /* nothing to launch */
  sm_job J;
  sm_plan P;
} sm_saved_plan;
enum : uint32_t { SM_SAVED_PLAN_MAGIC = 0x534d504cu };
static_assert(sizeof(sm_saved_plan) <= sizeof(((oss_softmax_plan_cuda *)0)->internal),
              "oss_softmax_plan_cuda.internal is too small for sm_saved_plan");

static oss_status sm_plan_job(const char *op, oss_status job_status, sm_saved_plan *S, oss_softmax_plan_cuda *plan) {
  if (job_status != OSS_OK) return job_status;
  if (cudaGetDevice(&S->device) != cudaSuccess) {
    cudaGetLastError();
    return oss_fail(OSS_ERROR_CUDA, "%s: cudaGetDevice failed", op);
  }
  if (!S->empty) {
    const oss_status s = S->J.bwd ? sm_dispatch<true>(&S->J, &S->P, NULL, NULL, false)
                                  : sm_dispatch<false>(&S->J, &S->P, NULL, NULL, false);
    if (s != OSS_OK) return s;
  }
  S->magic = SM_SAVED_PLAN_MAGIC;
  plan->workspace_bytes = S->empty ? 0 : S->P.ws_bytes;
  memcpy(plan->internal, S, sizeof *S);
  return OSS_OK;
}

extern "C" oss_status oss_softmax_forward_plan_cuda(const oss_softmax_params *p, oss_softmax_plan_cuda *plan) {
  if (plan == NULL) return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "oss_softmax_forward_plan_cuda: plan is NULL");
  memset(plan, 0, sizeof *plan);
  sm_saved_plan S;
  memset(&S, 0, sizeof S);
  return sm_plan_job("oss_softmax_forward_plan_cuda", sm_job_forward(p, &S.J, &S.empty), &S, plan);
}

extern "C" oss_status oss_softmax_backward_plan_cuda(const oss_softmax_backward_params *p,
                                                     oss_softmax_plan_cuda *plan) {
  if (plan == NULL) return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "oss_softmax_backward_plan_cuda: plan is NULL");
  memset(plan, 0, sizeof *plan);
  sm_saved_plan S;
  memset(&S, 0, sizeof S);
  return sm_plan_job("oss_softmax_backward_plan_cuda", sm_job_backward(p, &S.J, &S.empty), &S, plan);
}

extern "C" oss_status oss_softmax_launch_cuda(const oss_softmax_plan_cuda *plan, void *workspace, void *cuda_stream) {
  const char *op = "oss_softmax_launch_cuda";
  if (plan == NULL) return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: plan is NULL", op);
  sm_saved_plan S;
  memcpy(&S, plan->internal, sizeof S);
  if (S.magic != SM_SAVED_PLAN_MAGIC)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: plan was not filled by oss_softmax_*_plan_cuda", op);
  if (S.empty) return OSS_OK;
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return oss_fail(OSS_ERROR_CUDA, "%s: cudaGetDevice failed", op);
  }
  if (device != S.device)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: the plan was made on device %d but device %d is current", op,
                    S.device, device);
  if (S.P.ws_bytes > 0 && workspace == NULL)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: this plan needs a workspace of %zu bytes but workspace is NULL",
                    op, S.P.ws_bytes);
  if (S.P.ws_bytes > 0 && (uintptr_t)workspace % 16 != 0)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: workspace is not 16-byte aligned", op);
  return S.J.bwd ? sm_dispatch<true>(&S.J, &S.P, workspace, (cudaStream_t)cuda_stream, true)
                 : sm_dispatch<false>(&S.J, &S.P, workspace, (cudaStream_t)cuda_stream, true);
}

extern "C" size_t oss_softmax_forward_workspace_size_cuda(const oss_softmax_params *p) {
  oss_softmax_plan_cuda plan;
  return oss_softmax_forward_plan_cuda(p, &plan) == OSS_OK ? plan.workspace_bytes : 0;
}

extern "C" oss_status oss_softmax_forward_cuda(const oss_softmax_params *p, void *workspace, void *cuda_stream) {
  oss_softmax_plan_cuda plan;
  const oss_status s = oss_softmax_forward_plan_cuda(p, &plan);
  return s != OSS_OK ? s : oss_softmax_launch_cuda(&plan, workspace, cuda_stream);
}

extern "C" size_t oss_softmax_backward_workspace_size_cuda(const oss_softmax_backward_params *p) {
  oss_softmax_plan_cuda plan;
  return oss_softmax_backward_plan_cuda(p, &plan) == OSS_OK ? plan.workspace_bytes : 0;
}

extern "C" oss_status oss_softmax_backward_cuda(const oss_softmax_backward_params *p, void *workspace,
                                                void *cuda_stream) {
  oss_softmax_plan_cuda plan;
  const oss_status s = oss_softmax_backward_plan_cuda(p, &plan);
  return s != OSS_OK ? s : oss_softmax_launch_cuda(&plan, workspace, cuda_stream);
}
