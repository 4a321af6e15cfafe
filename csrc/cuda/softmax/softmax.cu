/*
 * softmax.cu - the CUDA softmax / log_softmax op entry points of oss.h
 * (forward and backward): validation of a call, planning it once
 * (softmax_plan.cu) and launching the plan (softmax_launch.cu).
 *
 * Computes y = exp(x - max) / sum exp(x - max) (or x - max - log sum) over the
 * n axis of the [outer, n, inner] view, and the backward
 * dx = y * (dy - sum y*dy) (or dy - exp(y) * sum dy), in float for
 * float32/float16/bfloat16 tensors (any input/output combination: the dtype=
 * cast is fused into the store) and in double for float64. The tier is
 * chosen by shape and is invisible to the caller (softmax_plan.cuh's table).
 *
 * oss_softmax_*_plan_cuda plans once and reports the workspace;
 * oss_softmax_launch_cuda checks the workspace and launches on the caller's
 * stream; nothing is launched when outer, n or inner is 0.
 */
#include <string.h>

#include "cuda/softmax/softmax_plan.cuh"

#ifdef OSS_SOFTMAX_TEST_KNOBS
extern "C" {
oss_softmax_test_knobs oss_softmax_cuda_test_knobs;
}
#endif

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

// ---- validation ----------------------------------------------------------------------

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
    sm_residency R;
    oss_device_info info;
    oss_status s = sm_residency_for_job(&S->J, &R);
    if (s == OSS_OK) s = oss_get_device_info(&info);
    if (s == OSS_OK) s = sm_choose_plan(&S->J, &info, &R, &S->P);
    if (s != OSS_OK) return s;
  }
  S->magic = SM_SAVED_PLAN_MAGIC;
  plan->workspace_bytes = S->empty ? 0 : S->P.workspace_bytes;
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
  if (S.P.workspace_bytes > 0 && workspace == NULL)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: this plan needs a workspace of %zu bytes but workspace is NULL",
                    op, S.P.workspace_bytes);
  if (S.P.workspace_bytes > 0 && (uintptr_t)workspace % 16 != 0)
    return oss_fail(OSS_ERROR_INVALID_ARGUMENT, "%s: workspace is not 16-byte aligned", op);
  oss_device_info info;
  const oss_status s = oss_get_device_info(&info);
  return s != OSS_OK ? s : sm_launch_plan(&S.J, &S.P, workspace, &info, (cudaStream_t)cuda_stream);
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
