/*
 * softmax_plan.cuh - what the CUDA softmax planner takes and gives: the job (one
 * call's shape, dtypes and tensors), the tiers, the plan, and the residency
 * question the planner asks about a kernel. Host code only.
 *
 * The planner (softmax_plan.cu) is a pure function of the job, the device's
 * facts (oss_device_info) and the answers to residency questions; the
 * launcher (softmax_launch.cu) runs a plan; the op entry points (softmax.cu)
 * validate a call, plan it once and launch it.
 */
#ifndef OSS_SOFTMAX_PLAN_CUH
#define OSS_SOFTMAX_PLAN_CUH

#include <stddef.h>
#include <stdint.h>

#include "cuda/common.cuh"

/* One call: softmax or log_softmax over the n axis of [outer, n, inner],
 * forward (a = x, out = y) or backward (a = y, b = dy, out = dx). Strides in
 * elements (so: stride_outer, sn: stride_n); a is the reference tensor whose
 * 16-byte slot grid the row kernels follow. */
typedef struct sm_job {
  int bwd, log;
  int64_t outer, n, inner;
  const void *a, *b; /* forward: x, x      backward: y, dy */
  void *out;         /* forward: y         backward: dx */
  oss_dtype ta, tout;
  int64_t so_a, sn_a, so_b, sn_b, so_out, sn_out;
} sm_job;

/*
 * The tiers. Rows (inner == 1) are measured in 16-byte slots of the input
 * (x forward, y backward); every tier that holds a row on chip reads each
 * element once and writes it once.
 *
 *  tier                 rows it takes                 threads per row            why
 *  SM_TIER_ROW_IN_CTA   aligned rows of 128-512 slots  one CTA of 64-1024 threads the lightest code per row: small CTAs of
 *                       forward (16-bit also 1024);    x 1-2 register slots, or   <= 32 registers, 2048 threads per SM; also
 *                       1024 backward (64-512 where    the chunk kernel's shape   runs one-CTA register-only shapes of the
 *                       memory is fast per SM)         (registers only)           chunk tier (no modes, no shared memory)
 *  SM_TIER_WARP         up to 32 x 8 slots forward,    G = 1..32 lanes x 4 or 8   a row too narrow for a CTA: a warp holds
 *                       32 x 4 backward (float64:      slots (aligned narrow      32 / G rows, reductions are shuffles
 *                       less)                          forward: rows per lane)
 *  SM_TIER_ROW_CHUNKS   what one CTA (<= 1024 threads  one CTA, or a cluster of   registers plus shared memory hold the
 *                       x 8 slots + shared memory) or  C = 2..16 CTAs (sm_90)     row; a cluster exchanges (m, d') through
 *                       a cluster holds                that share the row         distributed shared memory
 *  SM_TIER_ROW_SPREAD   what C CTAs of <= 64 KB each   C CTAs, two per SM, all    rows too wide for a cluster still read
 *                       hold, C <= half the resident   resident together          once; (m, d') goes through the workspace
 *                       CTAs
 *  SM_TIER_ROW_SPLIT    anything wider                 chunks of 256 x 8 slots    statistics pass, merge, output pass in
 *                                                                                 reverse order (part of the re-read hits L2)
 *  SM_TIER_COLUMNS      inner > 1: the [n x TJ] tile   one CTA or a cluster of    strided data read in place, once
 *                       fits on chip                   up to 16 per column tile
 *  SM_TIER_COLUMNS_SPLIT  inner > 1, anything larger   chunks of rows per CTA     as the row split
 */
typedef enum sm_tier {
  SM_TIER_WARP = 0,          /* softmax_rows_in_warp_kernel */
  SM_TIER_ROW_CHUNKS = 1,    /* softmax_row_chunks_kernel, SM_FULL */
  SM_TIER_ROW_SPLIT = 2,     /* softmax_row_chunks_kernel SM_STATS, the merge, SM_APPLY */
  SM_TIER_COLUMNS = 3,       /* softmax_columns_kernel, SM_FULL */
  SM_TIER_COLUMNS_SPLIT = 4, /* softmax_columns_kernel SM_STATS, the merge, SM_APPLY */
  SM_TIER_ROW_SPREAD = 5,    /* softmax_row_chunks_kernel, SM_SPREAD */
  SM_TIER_ROW_IN_CTA = 6,    /* softmax_row_in_cta_kernel */
} sm_tier;

/* What the planner decided; the launcher follows it to the letter. */
typedef struct sm_plan {
  sm_tier tier;
  int threads;           /* per CTA */
  int slots_per_thread;  /* rows: register slots each thread (warp tier: lane) holds */
  int lanes_per_row;     /* warp tier: lanes of a warp that share one row (a power of two) */
  int ctas_per_row;      /* rows: cluster size (row chunks), CTAs of a row (spread), chunks of a row (split);
                            columns: cluster size per tile */
  int smem_slots;        /* shared-memory slots per CTA (rows: per tensor; columns: tile and exchange) */
  int kernel_slots;      /* warp and row-in-CTA tiers: the register slots per thread of the kernel
                            instantiation (its KM template argument) */
  int aligned;           /* rows: the aligned kernel instantiation (sm_rows_aligned) */
  int rows_per_lane;     /* warp tier: rows each lane holds (the kernel's RL) */
  int keep_in_l2;        /* the input loads carry the L2 evict_last policy (sm_l2_policy) */
  int64_t chunk_slots;   /* row chunks, spread, split: slots of a row per CTA */
  int tile_columns;      /* columns: columns per tile (the kernel's TJ) */
  int column_phase;      /* columns: the tile grid starts this many columns before column 0 */
  int vector_a, vector_b, vector_out; /* columns: 16-byte accesses (8 for a narrow output) are aligned */
  int64_t chunk_rows;    /* columns: rows of the n axis per CTA */
  int64_t chunks;        /* split tiers: chunks per row or column */
  unsigned grid_x, grid_y;
  size_t workspace_bytes; /* rounded up to 16 */
} sm_plan;

/* Kernels the planner asks about, and how many of a configuration of one
 * can be resident at once: CTAs per SM for cluster == 1, clusters on the
 * GPU for cluster > 1; 0 where it cannot run. */
typedef struct sm_residency {
  const void *row_chunks[2]; /* softmax_row_chunks_kernel: [0] general, [1] aligned */
  const void *columns[2];    /* softmax_columns_kernel: [0] SM_COL_THREADS, [1] SM_COL_THREADS_WIDE */
  int (*resident)(const void *kernel, int cluster, int threads, size_t smem, unsigned grid_y);
} sm_residency;

/* Plans J on a device with facts *info (softmax_plan.cu). */
oss_status sm_choose_plan(const sm_job *J, const oss_device_info *info, const sm_residency *R, sm_plan *P);

/* The kernels of J's dtypes and the residency answers about them; runs
 * plan *P (softmax_launch.cu). */
oss_status sm_residency_for_job(const sm_job *J, sm_residency *R);
oss_status sm_launch_plan(const sm_job *J, const sm_plan *P, void *workspace, const oss_device_info *info,
                          cudaStream_t stream);

/* Whether the GPU's DRAM feeds each SM fast enough that a narrow row's
 * kernel is bound by the instructions it issues rather than by memory (the
 * H200's 37 bytes per ns per SM, not the H100 SXM's 25 or the A100's 19;
 * unknown bandwidth counts as slow). The narrow backward plans and the warp
 * tier's L2 release differ by it. */
static inline bool sm_fast_memory_per_sm(const oss_device_info *info) {
  return info->sm_count > 0 && info->dram_bytes_per_ns >= 30.0 * info->sm_count;
}

static inline int64_t sm_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static inline int64_t sm_pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

/* Bytes of SM_TIER_ROW_SPREAD's counters at the front of its workspace: the
 * ticket and one arrival count per row, rounded up to 16. */
static inline size_t sm_spread_counter_bytes(int64_t rows) {
  return ((size_t)(rows + 1) * sizeof(unsigned) + 15) & ~(size_t)15;
}

/* Values of the force_tier test knob (softmax_test_knobs.cuh). */
enum {
  SM_FORCE_WARP = 1,
  SM_FORCE_ONE_CTA = 2, /* the chunk tier without clusters */
  SM_FORCE_CLUSTER = 3, /* the chunk tier in clusters of 2 or more */
  SM_FORCE_SPLIT = 4,
  SM_FORCE_SPREAD = 5,
};

/* Debug builds only (-DOSS_SOFTMAX_TEST_KNOBS): the test knobs steer the
 * planner and launcher (softmax_test_knobs.cuh); a production build reads every
 * knob as 0, the planner's own choice. */
#ifdef OSS_SOFTMAX_TEST_KNOBS
#include "cuda/softmax/softmax_test_knobs.cuh"
#define SM_KNOB(name) (oss_softmax_cuda_test_knobs.name)
#else
#define SM_KNOB(name) 0
#endif

#endif /* OSS_SOFTMAX_PLAN_CUH */
