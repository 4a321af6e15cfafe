/*
 * softmax_test_knobs.cuh - knobs that steer the CUDA softmax planner and
 * launcher onto paths the test shapes would not reach by themselves (a tier
 * forced on a small row, several rows per CTA, a cluster size), so that the
 * standalone self-test (csrc/tests/softmax_cuda_selftest.cu) covers every
 * kernel path with small tensors.
 *
 * Debug builds only: compiled where -DOSS_SOFTMAX_TEST_KNOBS is given (the
 * self-test, and the extension built with TORCH_OSS_SOFTMAX_KNOBS=1). In a
 * production build the header is not included and every knob reads 0.
 * All zero means the planner's own choice.
 */
#ifndef OSS_SOFTMAX_TEST_KNOBS_CUH
#define OSS_SOFTMAX_TEST_KNOBS_CUH

typedef struct oss_softmax_test_knobs {
  int force_tier;          /* SM_FORCE_* (softmax_plan.cuh): the row tier to take where it can hold the row */
  int rows_at_once;        /* > 0: caps the rows (one-CTA, cluster, row-in-CTA, split tiers), the warp tier's
                              CTAs and the columns' grid.y, so each CTA or cluster loops over several */
  int row_in_cta;          /* the row-in-CTA tier: 1 off; 2 wherever it holds an aligned row (threads: the
                              slots / 2 rounded up to a power of two), 3 the same at one slot per thread,
                              64 .. 1024 (a power of two) there with CTAs of that size */
  int warp_lanes_per_row;  /* aligned narrow forward rows in the warp tier: 1 one row per lane group always;
                              2 .. 16 (a power of two) several rows per lane wherever they fit, with at most
                              that many lanes per row */
  int no_backward_1024;    /* 1: backward rows of 3/4 to all of 1024 x 4 slots take the two-CTA plan with a
                              shared-memory part, not one 1024-thread CTA of registers */
  int release_window_mib;  /* > 0: the L2 release window in MiB of input (sm_release_window) */
  int release_first;       /* 1: the release window covers the first rows, not the last */
  int column_chunk_rows;   /* > 0: the columns' split path with chunks of that many rows */
  int column_threads;      /* 256 or 512: the columns kernel's CTA size (512: float statistics only) */
  int column_cluster;      /* 1 .. 16 (a power of two): the columns kernel's cluster size (1: none) */
} oss_softmax_test_knobs;

extern "C" oss_softmax_test_knobs oss_softmax_cuda_test_knobs;

#endif /* OSS_SOFTMAX_TEST_KNOBS_CUH */
