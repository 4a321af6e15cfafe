/*
 * torch_ops.cpp - the registration layer: the only file that includes torch.
 *
 * It declares the `oss` operator library (full schemas), checks arguments and
 * names the offending one in every error, turns Tensors into the plain C
 * parameter structs of oss.h, sets the device guard and current stream, and
 * calls the CPU or CUDA entry points. It knows nothing about tiles or warps.
 * The autograd formulas of softmax, log_softmax and attention live here too.
 * A minimal Python module init (no pybind) makes `torch_oss._C` importable and
 * exposes build_config().
 */
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <climits>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>

#ifdef OSS_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include "oss.h"

namespace {

using at::Tensor;

// ---------------------------------------------------------------------------
// Errors
//
// Messages are formatted with vsnprintf and handed to torch as one string.
// Nothing here formats through iostreams (c10::str with several arguments):
// on the GPU machine's toolchain that put private copies of libstdc++'s
// stream code, and its locale facet ids, into this library, and formatting a
// number into an error message then crashed the process.
// ---------------------------------------------------------------------------

enum class Err { Value, Type, Index, NotImplemented, Runtime };

[[noreturn]] void raise(Err kind, const std::string &message) {
  switch (kind) {
  case Err::Value: TORCH_CHECK_VALUE(false, message);
  case Err::Type: TORCH_CHECK_TYPE(false, message);
  case Err::Index: TORCH_CHECK_INDEX(false, message);
  case Err::NotImplemented: TORCH_CHECK_NOT_IMPLEMENTED(false, message);
  case Err::Runtime: break;
  }
  TORCH_CHECK(false, message);
}

std::string format(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

std::string format(const char *fmt, ...) {
  char buf[1024];
  va_list args;
  va_start(args, fmt);
  vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

#define OSS_CHECK(cond, kind, ...)                          \
  do {                                                      \
    if (!(cond)) raise(Err::kind, format(__VA_ARGS__));     \
  } while (0)

const char *dtype_name(at::ScalarType t) { return c10::toString(t); }

std::string shape_str(at::IntArrayRef sizes) {
  std::string out = "(";
  for (size_t i = 0; i < sizes.size(); i++) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + (sizes.size() == 1 ? ",)" : ")");
}

std::string device_str(const Tensor &t) { return t.device().str(); }

#define LL(x) static_cast<long long>(x)

// ---------------------------------------------------------------------------
// Status and dtype plumbing
// ---------------------------------------------------------------------------

[[noreturn]] void throw_status(const char *op, oss_status status) {
  // Kernel messages usually name their op already ("attention: ..."); add it otherwise.
  const std::string detail = oss_error_message();
  bool named = false;
  for (const char *name : {"softmax", "log_softmax", "attention", "cross_entropy"})
    named = named || detail.rfind(name, 0) == 0;
  const std::string message = named ? detail : std::string(op) + ": " + detail;
  switch (status) {
  case OSS_ERROR_INVALID_ARGUMENT: raise(Err::Value, message);
  case OSS_ERROR_NOT_SUPPORTED: raise(Err::NotImplemented, message);
  default: raise(Err::Runtime, message + " (" + oss_status_name(status) + ")");
  }
}

void check_status(const char *op, oss_status status) {
  if (status != OSS_OK) throw_status(op, status);
}

bool is_kernel_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

oss_dtype to_oss_dtype(at::ScalarType t) {
  switch (t) {
  case at::kFloat: return OSS_FLOAT32;
  case at::kDouble: return OSS_FLOAT64;
  case at::kHalf: return OSS_FLOAT16;
  case at::kBFloat16: return OSS_BFLOAT16;
  case at::kBool: return OSS_BOOL;
  default: raise(Err::Type, format("torch_oss: unsupported dtype %s", dtype_name(t)));
  }
}

void torch_parallel_for(int64_t n, int64_t grain, void *ctx, oss_range_fn fn) {
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) { fn(ctx, begin, end); });
}

const oss_cpu_exec cpu_exec = {torch_parallel_for};

void check_device_supported(const char *op, const Tensor &t, const char *name) {
#ifdef OSS_WITH_CUDA
  const bool ok = t.device().is_cpu() || t.device().is_cuda();
#else
  const bool ok = t.device().is_cpu();
#endif
#ifdef OSS_WITH_CUDA
  const char *supported = "cpu and cuda";
#else
  const char *supported = "cpu only (built without CUDA)";
#endif
  OSS_CHECK(ok, NotImplemented, "%s: %s is on %s; this build of torch_oss supports %s", op, name,
            device_str(t).c_str(), supported);
}

#ifdef OSS_WITH_CUDA
// Device scratch from torch's caching allocator; freed when it goes out of
// scope, which is safe because reuse is ordered on the same stream.
Tensor cuda_workspace(const Tensor &like, size_t bytes) {
  if (bytes == 0) return Tensor();
  return at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
}
void *data_or_null(const Tensor &t) { return t.defined() ? t.data_ptr() : nullptr; }
#endif

// ---------------------------------------------------------------------------
// Softmax family
// ---------------------------------------------------------------------------

// True when dims [begin, end) of t fold into one dim; *stride is then the
// stride of that folded dim (size-1 dims are ignored).
bool fold_dims(const Tensor &t, int64_t begin, int64_t end, int64_t *stride) {
  *stride = 0;
  int64_t expected = -1;
  for (int64_t d = end - 1; d >= begin; d--) {
    if (t.size(d) == 1) continue;
    if (expected < 0) {
      *stride = t.stride(d);
    } else if (t.stride(d) != expected) {
      return false;
    }
    expected = t.stride(d) * t.size(d);
  }
  return true;
}

struct SoftmaxView {
  int64_t outer, n, inner;
};

SoftmaxView softmax_view(const Tensor &t, int64_t dim) {
  SoftmaxView v{1, t.size(dim), 1};
  for (int64_t d = 0; d < dim; d++) v.outer *= t.size(d);
  for (int64_t d = dim + 1; d < t.dim(); d++) v.inner *= t.size(d);
  return v;
}

// Describes t as the [outer, n, inner] view of oss.h, replacing t by a
// contiguous copy when its strides cannot be expressed that way (the kernels
// then read it directly; no copy for contiguous tensors at any dim).
oss_strided3 strided3(Tensor &t, int64_t dim, const SoftmaxView &v) {
  int64_t outer_stride = 0, inner_stride = 0;
  bool ok = fold_dims(t, 0, dim, &outer_stride) && fold_dims(t, dim + 1, t.dim(), &inner_stride);
  if (ok && v.inner > 1) ok = inner_stride == 1;
  if (ok && v.inner == 1) ok = v.n <= 1 || t.stride(dim) == 1;
  if (!ok) {
    t = t.contiguous();
    fold_dims(t, 0, dim, &outer_stride);
  }
  oss_strided3 s;
  s.data = t.data_ptr();
  s.dtype = to_oss_dtype(t.scalar_type());
  s.stride_outer = v.outer > 1 ? outer_stride : v.n * v.inner;
  s.stride_n = v.n > 1 ? t.stride(dim) : v.inner;
  return s;
}

// The shared launch tail of the softmax family: on CUDA, plan (forward or
// backward), allocate the plan's workspace from torch's caching allocator and
// launch on the current stream under a device guard; on the CPU, run the
// kernel through torch's thread pool. `on` is the tensor whose device runs it.
void run_softmax(const char *op, const Tensor &on, const oss_softmax_params *fwd,
                 const oss_softmax_backward_params *bwd) {
#ifdef OSS_WITH_CUDA
  if (on.is_cuda()) {
    const c10::cuda::CUDAGuard guard(on.device());
    oss_softmax_plan_cuda plan;
    check_status(op, fwd ? oss_softmax_forward_plan_cuda(fwd, &plan) : oss_softmax_backward_plan_cuda(bwd, &plan));
    Tensor ws = cuda_workspace(on, plan.workspace_bytes);
    check_status(op, oss_softmax_launch_cuda(&plan, data_or_null(ws), at::cuda::getCurrentCUDAStream().stream()));
    return;
  }
#else
  (void)on;
#endif
  check_status(op, fwd ? oss_softmax_forward_cpu(fwd, &cpu_exec) : oss_softmax_backward_cpu(bwd, &cpu_exec));
}
void run_softmax(const char *op, const Tensor &on, const oss_softmax_params *p) { run_softmax(op, on, p, nullptr); }
void run_softmax(const char *op, const Tensor &on, const oss_softmax_backward_params *p) {
  run_softmax(op, on, nullptr, p);
}

int64_t wrap_softmax_dim(const char *op, int64_t dim, int64_t ndim) {
  const int64_t rank = ndim > 0 ? ndim : 1;
  OSS_CHECK(dim >= -rank && dim < rank, Index,
            "%s: dim=%lld is out of range for a tensor with %lld dimensions (expected a value in [%lld, %lld])", op,
            LL(dim), LL(ndim), LL(-rank), LL(rank - 1));
  return dim < 0 ? dim + rank : dim;
}

// The forward's argument checks; returns dim wrapped into [0, rank).
int64_t check_softmax_args(const char *op, const Tensor &self, int64_t dim, std::optional<at::ScalarType> dtype) {
  check_device_supported(op, self, "self");
  if (dtype) {
    OSS_CHECK(is_kernel_float(*dtype), Type, "%s: dtype=%s is not supported; expected float16, bfloat16, float32 or "
              "float64", op, dtype_name(*dtype));
  } else {
    OSS_CHECK(is_kernel_float(self.scalar_type()), Type,
              "%s: self has dtype %s but must be float16, bfloat16, float32 or float64 (pass dtype= to cast)", op,
              dtype_name(self.scalar_type()));
  }
  return wrap_softmax_dim(op, dim, self.dim());
}

Tensor softmax_forward(const Tensor &self, int64_t dim, std::optional<at::ScalarType> dtype, bool log) {
  const char *op = log ? "log_softmax" : "softmax";
  dim = check_softmax_args(op, self, dim, dtype);
  const at::ScalarType out_dtype = dtype.value_or(self.scalar_type());

  // dtype= means "cast, then compute". A widening cast (half or bfloat16 in,
  // float out) changes no value, so the kernel reads the input as it is and
  // the cast costs nothing; any other cast rounds the input, so it is done
  // first, as F.softmax does.
  Tensor x = self;
  const at::ScalarType in_dtype = x.scalar_type();
  const bool fused_cast =
      in_dtype == out_dtype || ((in_dtype == at::kHalf || in_dtype == at::kBFloat16) && out_dtype == at::kFloat);
  if (!fused_cast) x = x.to(out_dtype);
  Tensor y = at::empty(self.sizes(), self.options().dtype(out_dtype));
  if (y.numel() == 0) return y;
  if (x.dim() == 0) x = x.reshape({1});
  Tensor y_view = y.dim() == 0 ? y.reshape({1}) : y;

  const SoftmaxView v = softmax_view(x, dim);
  oss_softmax_params p;
  p.outer = v.outer;
  p.n = v.n;
  p.inner = v.inner;
  p.log = log;
  p.x = strided3(x, dim, v);
  p.y = strided3(y_view, dim, v);
  run_softmax(op, x, &p);
  return y;
}

Tensor softmax_backward(const Tensor &grad_output, const Tensor &output, int64_t dim, at::ScalarType input_dtype,
                        bool log) {
  const char *op = log ? "log_softmax_backward" : "softmax_backward";
  check_device_supported(op, output, "output");
  OSS_CHECK(grad_output.sizes() == output.sizes(), Value, "%s: grad_output has shape %s but output has shape %s", op,
            shape_str(grad_output.sizes()).c_str(), shape_str(output.sizes()).c_str());
  OSS_CHECK(grad_output.device() == output.device(), Value, "%s: grad_output is on %s but output is on %s", op,
            device_str(grad_output).c_str(), device_str(output).c_str());
  OSS_CHECK(is_kernel_float(output.scalar_type()), Type,
            "%s: output has dtype %s but must be float16, bfloat16, float32 or float64", op,
            dtype_name(output.scalar_type()));
  OSS_CHECK(is_kernel_float(grad_output.scalar_type()), Type,
            "%s: grad_output has dtype %s but must be float16, bfloat16, float32 or float64", op,
            dtype_name(grad_output.scalar_type()));
  OSS_CHECK(is_kernel_float(input_dtype), Type, "%s: input_dtype=%s must be float16, bfloat16, float32 or float64",
            op, dtype_name(input_dtype));
  dim = wrap_softmax_dim(op, dim, output.dim());

  Tensor y = output, dy = grad_output;
  if (dy.scalar_type() != y.scalar_type()) dy = dy.to(y.scalar_type());
  // The gradient is computed in the output's precision and rounded to the
  // input dtype once at the end (as PyTorch does). float64 kernels go with
  // float64 only, so a float64 <-> other pair computes in the output dtype
  // and casts afterwards.
  const bool cast_after = (y.scalar_type() == at::kDouble) != (input_dtype == at::kDouble);
  const at::ScalarType dx_dtype = cast_after ? y.scalar_type() : input_dtype;
  Tensor dx = at::empty(output.sizes(), output.options().dtype(dx_dtype));
  if (dx.numel() == 0) return dx.to(input_dtype);
  if (y.dim() == 0) {
    y = y.reshape({1});
    dy = dy.reshape({1});
  }
  Tensor dx_view = dx.dim() == 0 ? dx.reshape({1}) : dx;

  const SoftmaxView v = softmax_view(y, dim);
  oss_softmax_backward_params p;
  p.outer = v.outer;
  p.n = v.n;
  p.inner = v.inner;
  p.log = log;
  p.y = strided3(y, dim, v);
  p.dy = strided3(dy, dim, v);
  p.dx = strided3(dx_view, dim, v);
  run_softmax(op, y, &p);
  return cast_after ? dx.to(input_dtype) : dx;
}

Tensor softmax_op(const Tensor &self, int64_t dim, std::optional<at::ScalarType> dtype) {
  return softmax_forward(self, dim, dtype, false);
}
Tensor log_softmax_op(const Tensor &self, int64_t dim, std::optional<at::ScalarType> dtype) {
  return softmax_forward(self, dim, dtype, true);
}
Tensor softmax_backward_op(const Tensor &grad_output, const Tensor &output, int64_t dim,
                           at::ScalarType input_dtype) {
  return softmax_backward(grad_output, output, dim, input_dtype, false);
}
Tensor log_softmax_backward_op(const Tensor &grad_output, const Tensor &output, int64_t dim,
                               at::ScalarType input_dtype) {
  return softmax_backward(grad_output, output, dim, input_dtype, true);
}

// ---------------------------------------------------------------------------
// softmax / log_softmax autograd
//
// Registered here, not with torch.library.register_autograd in Python: a
// Python formula runs on every call, with or without gradients, and costs
// about 14 us of host time per forward (on an H100 host, against F.softmax's
// 11 us in all). The forward saves its output and the backward is
// oss::softmax_backward / oss::log_softmax_backward, both called through the
// dispatcher, so torch.compile traces them as the ops they are.
//
// The backward ops are differentiable too (double backward: gradient
// penalties, Hessian-vector products): their own autograd node, below, whose
// formulas are ATen ops (so they are differentiable again). The gradient that
// reaches the saved output flows on into the forward's node, as for
// F.softmax.
// ---------------------------------------------------------------------------

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The forward op below autograd (the CPU or CUDA kernel).
template <bool LOG> Tensor softmax_below_autograd(const Tensor &self, int64_t dim, std::optional<at::ScalarType> dtype) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow(LOG ? "oss::log_softmax" : "oss::softmax", "")
                             .typed<Tensor(const Tensor &, int64_t, std::optional<at::ScalarType>)>();
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(self, dim, dtype);
}

template <bool LOG> struct SoftmaxFunction : public torch::autograd::Function<SoftmaxFunction<LOG>> {
  static Tensor forward(AutogradContext *ctx, const Tensor &self, int64_t dim, std::optional<at::ScalarType> dtype) {
    const Tensor y = softmax_below_autograd<LOG>(self, dim, dtype);
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["input_dtype"] = self.scalar_type();
    ctx->save_for_backward({y});
    return y;
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow(LOG ? "oss::log_softmax_backward" : "oss::softmax_backward", "")
                               .typed<Tensor(const Tensor &, const Tensor &, int64_t, at::ScalarType)>();
    if (!ctx->needs_input_grad(0) || !grads[0].defined()) return {Tensor(), Tensor(), Tensor()};
    const Tensor y = ctx->get_saved_variables()[0];
    const Tensor dx = op.call(grads[0], y, ctx->saved_data["dim"].toInt(), ctx->saved_data["input_dtype"].toScalarType());
    return {dx, Tensor(), Tensor()};
  }
};

// A call that nothing will differentiate (grad mode off, and no input that
// requires grad or carries a forward-mode tangent) skips the autograd node:
// building one costs about 2 us of host time per call.
bool will_differentiate(const Tensor &t) {
  return t.defined() && ((at::GradMode::is_enabled() && t.requires_grad()) || t._fw_grad(/*level=*/0).defined());
}

// Whether a forward must run as ATen ops (PyTorch's softmax, or
// attention_forward_aten) rather than through a C++ autograd Function: an
// input carries a forward-mode tangent (the Functions have no jvp), or a
// torch.func transform that differentiates (grad, vjp, jvp, hessian...) is
// active, under which a C++ autograd Function cannot run.
bool needs_aten_forward(std::initializer_list<const Tensor *> inputs) {
  for (const Tensor *t : inputs)  // torch.func's grad and jvp transforms wrap their inputs in this key
    if (t->defined() &&
        (t->_fw_grad(/*level=*/0).defined() || t->key_set().has(c10::DispatchKey::FuncTorchGradWrapper)))
      return true;
  return false;
}

template <bool LOG> Tensor softmax_autograd(const Tensor &self, int64_t dim, std::optional<at::ScalarType> dtype) {
  if (needs_aten_forward({&self})) {  // the op's checks, then PyTorch's op
    dim = check_softmax_args(LOG ? "log_softmax" : "softmax", self, dim, dtype);
    return LOG ? at::log_softmax(self, dim, dtype) : at::softmax(self, dim, dtype);
  }
  return will_differentiate(self) ? SoftmaxFunction<LOG>::apply(self, dim, dtype)
                                  : softmax_below_autograd<LOG>(self, dim, dtype);
}

// The backward op below autograd (the CPU or CUDA kernel).
template <bool LOG>
Tensor softmax_backward_below_autograd(const Tensor &grad_output, const Tensor &output, int64_t dim,
                                       at::ScalarType input_dtype) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow(LOG ? "oss::log_softmax_backward" : "oss::softmax_backward", "")
                             .typed<Tensor(const Tensor &, const Tensor &, int64_t, at::ScalarType)>();
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(grad_output, output, dim, input_dtype);
}

// The derivatives of the backward ops, with g the gradient of their result
// dx and sums taken over dim:
//   softmax:     dx = y * (dy - sum(dy * y))
//                d/d dy = y * (g - sum(g * y))                 (= softmax_backward(g, y))
//                d/d y  = g * (dy - sum(dy * y)) - dy * sum(g * y)
//   log_softmax: dx = dy - exp(y) * sum(dy)
//                d/d dy = g - sum(g * exp(y))
//                d/d y  = -g * exp(y) * sum(dy)
// computed in ATen ops in float64 (the sums over dim cancel, and a second
// derivative is rare enough that its cost does not matter) and returned in
// the dtypes of dy and y, each rounded once. ATen ops record their own
// autograd nodes, so these are differentiable again (third and higher
// derivatives).
template <bool LOG> struct SoftmaxBackwardFunction : public torch::autograd::Function<SoftmaxBackwardFunction<LOG>> {
  static Tensor forward(AutogradContext *ctx, const Tensor &grad_output, const Tensor &output, int64_t dim,
                        at::ScalarType input_dtype) {
    const Tensor dx = softmax_backward_below_autograd<LOG>(grad_output, output, dim, input_dtype);
    ctx->saved_data["dim"] = wrap_softmax_dim(LOG ? "log_softmax_backward" : "softmax_backward", dim, output.dim());
    ctx->save_for_backward({grad_output, output});
    return dx;
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    const bool want_dy = ctx->needs_input_grad(0), want_y = ctx->needs_input_grad(1);
    if (!grads[0].defined() || (!want_dy && !want_y)) return {Tensor(), Tensor(), Tensor(), Tensor()};
    const variable_list saved = ctx->get_saved_variables();
    const Tensor &dy = saved[0], &y = saved[1];
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const at::ScalarType wide = at::kDouble;
    const Tensor g = grads[0].to(wide), dyw = dy.to(wide), yw = y.to(wide);
    Tensor grad_dy, grad_y;
    if (LOG) {
      const Tensor p = yw.exp();
      if (want_dy) grad_dy = g - (g * p).sum(dim, /*keepdim=*/true);
      if (want_y) grad_y = -g * p * dyw.sum(dim, /*keepdim=*/true);
    } else {
      const Tensor gy = (g * yw).sum(dim, /*keepdim=*/true);
      if (want_dy) grad_dy = yw * (g - gy);
      if (want_y) grad_y = g * (dyw - (dyw * yw).sum(dim, /*keepdim=*/true)) - dyw * gy;
    }
    return {want_dy ? grad_dy.to(dy.scalar_type()) : Tensor(), want_y ? grad_y.to(y.scalar_type()) : Tensor(),
            Tensor(), Tensor()};
  }
};

template <bool LOG>
Tensor softmax_backward_autograd(const Tensor &grad_output, const Tensor &output, int64_t dim,
                                 at::ScalarType input_dtype) {
  return will_differentiate(grad_output) || will_differentiate(output)
             ? SoftmaxBackwardFunction<LOG>::apply(grad_output, output, dim, input_dtype)
             : softmax_backward_below_autograd<LOG>(grad_output, output, dim, input_dtype);
}

// ---------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------

constexpr int64_t kMaxHeadDim = 256;

void fill_strides3(const Tensor &t, int64_t out[3]) {
  for (int i = 0; i < 3; i++) out[i] = t.stride(i);
}

// The last dim must be unit-stride; anything else about the strides is fine.
Tensor last_dim_contiguous(const Tensor &t) {
  return t.size(-1) <= 1 || t.stride(-1) == 1 ? t : t.contiguous();
}

// The dtype and sizes of attention params (the rest is the caller's).
void set_attention_sizes(oss_attention_params &p, at::ScalarType dtype, int64_t B, int64_t Hq, int64_t Hkv,
                         int64_t Lq, int64_t Lk, int64_t D, int64_t Dv) {
  p.dtype = to_oss_dtype(dtype);
  p.batch = B;
  p.heads_q = Hq;
  p.heads_kv = Hkv;
  p.len_q = Lq;
  p.len_k = Lk;
  p.head_dim = D;
  p.head_dim_v = Dv;
}

// Validated attention inputs: q, k, v with a unit-stride last dim, the mask
// broadcast (stride 0, never copied) to [B, Hq, Lq, Lk], and the forward
// parameters filled in except out/lse.
struct AttentionInputs {
  Tensor q, k, v, mask, alibi, sinks;
  oss_attention_params p;
};

// The score variants of one call (oss.h): window_size (left, right), -1 =
// unbounded on that side; softcap (0: off); ALiBi slopes float32 (Hq,) or
// (B, Hq); sinks (Hq,) of any floating dtype (held as float32 by the kernels).
struct AttentionVariants {
  at::IntArrayRef window_size;
  double softcap;
  const std::optional<Tensor> &alibi_slopes;
  const std::optional<Tensor> &sinks;
  // Dropout of the weights (oss.h): dropout_p in [0, 1]; the seed a one-element
  // int64 tensor on the inputs' device (its bits are the uint64 seed).
  double dropout_p = 0.0;
  const std::optional<Tensor> *dropout_seed = nullptr;
};

bool given(const std::optional<Tensor> &t) { return t.has_value() && t->defined(); }

// The score-variant fields of `from` (set_attention_variants) into `to`.
void copy_variant_fields(const oss_attention_params &from, oss_attention_params &to) {
  to.window = from.window;
  to.window_left = from.window_left;
  to.window_right = from.window_right;
  to.window_diagonal = from.window_diagonal;
  to.softcap = from.softcap;
  to.alibi_slopes = from.alibi_slopes;
  to.alibi_stride_batch = from.alibi_stride_batch;
  to.sinks = from.sinks;
  to.dropout_p = from.dropout_p;
  to.dropout_seed = from.dropout_seed;
}

// Checks the variants of a call on `device` with B batches and Hq query heads
// and fills their fields of p (the diagonal of the window and the ALiBi
// distances is `diagonal`); alibi and sinks receive the float32 contiguous
// tensors p points into. A KV-cache call takes them all but dropout.
void set_attention_variants(const char *op, const AttentionVariants &var, const Tensor &query, int64_t B,
                            int64_t Hq, oss_causal diagonal, oss_attention_params &p, Tensor &alibi, Tensor &sinks,
                            bool kv_cache = false) {
  OSS_CHECK(var.window_size.size() == 2, Value, "%s: window_size must be a pair (left, right), got %lld values", op,
            LL(var.window_size.size()));
  const int64_t left = var.window_size[0], right = var.window_size[1];
  OSS_CHECK(left >= -1 && right >= -1, Value,
            "%s: window_size=(%lld, %lld) must hold ints >= -1 (-1: unbounded on that side)", op, LL(left), LL(right));
  OSS_CHECK(std::isfinite(var.softcap) && var.softcap >= 0.0, Value,
            "%s: softcap=%g must be a finite number >= 0 (0: off)", op, var.softcap);
  const bool windowed = left != -1 || right != -1;
  if (given(var.alibi_slopes)) {
    const Tensor &a = *var.alibi_slopes;
    OSS_CHECK(a.scalar_type() == at::kFloat, Type, "%s: alibi_slopes.dtype=%s must be torch.float32", op,
              dtype_name(a.scalar_type()));
    OSS_CHECK(a.device() == query.device(), Value, "%s: alibi_slopes is on %s but query is on %s", op,
              device_str(a).c_str(), device_str(query).c_str());
    OSS_CHECK((a.dim() == 1 && a.size(0) == Hq) || (a.dim() == 2 && a.size(0) == B && a.size(1) == Hq), Value,
              "%s: alibi_slopes must have shape (heads_q,) = (%lld,) or (batch, heads_q) = (%lld, %lld), got %s", op,
              LL(Hq), LL(B), LL(Hq), shape_str(a.sizes()).c_str());
  }
  if (given(var.sinks)) {
    const Tensor &t = *var.sinks;
    OSS_CHECK(is_kernel_float(t.scalar_type()), Type,
              "%s: sinks has dtype %s but must be float16, bfloat16, float32 or float64", op,
              dtype_name(t.scalar_type()));
    OSS_CHECK(t.device() == query.device(), Value, "%s: sinks is on %s but query is on %s", op,
              device_str(t).c_str(), device_str(query).c_str());
    OSS_CHECK(t.dim() == 1 && t.size(0) == Hq, Value, "%s: sinks must have shape (heads_q,) = (%lld,), got %s", op,
              LL(Hq), shape_str(t.sizes()).c_str());
  }
  OSS_CHECK(std::isfinite(var.dropout_p) && var.dropout_p >= 0.0 && var.dropout_p <= 1.0, Value,
            "%s: dropout_p=%g must be a number in [0, 1]", op, var.dropout_p);
  if (var.dropout_p > 0.0) {
    OSS_CHECK(var.dropout_seed != nullptr && given(*var.dropout_seed), Value,
              "%s: dropout_p > 0 needs dropout_seed (a one-element int64 tensor)", op);
    const Tensor &seed = **var.dropout_seed;
    OSS_CHECK(seed.scalar_type() == at::kLong && seed.numel() == 1, Type,
              "%s: dropout_seed must be a one-element int64 tensor, got dtype %s and shape %s", op,
              dtype_name(seed.scalar_type()), shape_str(seed.sizes()).c_str());
    OSS_CHECK(seed.device() == query.device(), Value, "%s: dropout_seed is on %s but query is on %s", op,
              device_str(seed).c_str(), device_str(query).c_str());
    OSS_CHECK(!kv_cache, NotImplemented, "torch_oss.%s: dropout is not supported with a KV cache", op);
    p.dropout_p = var.dropout_p;
    p.dropout_seed = reinterpret_cast<const uint64_t *>(seed.data_ptr());  // one element: contiguous
  }
  p.window = windowed ? 1 : 0;
  p.window_left = left;
  p.window_right = right;
  p.window_diagonal = diagonal;
  p.softcap = var.softcap;
  if (given(var.alibi_slopes)) {
    alibi = var.alibi_slopes->contiguous();
    p.alibi_slopes = alibi.data_ptr<float>();
    p.alibi_stride_batch = alibi.dim() == 2 ? Hq : 0;
  }
  if (given(var.sinks)) {
    sinks = var.sinks->detach().to(at::kFloat).contiguous();
    p.sinks = sinks.data_ptr<float>();
  }
}

AttentionInputs prepare_attention(const char *op, const Tensor &query, const Tensor &key, const Tensor &value,
                                  const std::optional<Tensor> &attn_mask, bool is_causal,
                                  std::optional<double> scale, bool enable_gqa, c10::string_view causal_alignment,
                                  const AttentionVariants &variants, int64_t variants_batch = -1) {
  const Tensor *named[3] = {&query, &key, &value};
  const char *names[3] = {"query", "key", "value"};
  for (int i = 0; i < 3; i++) {
    const Tensor &t = *named[i];
    OSS_CHECK(is_kernel_float(t.scalar_type()), Type, "%s: %s has dtype %s but must be float16, bfloat16, float32 "
              "or float64", op, names[i], dtype_name(t.scalar_type()));
    OSS_CHECK(t.dim() == 4, Value, "%s: %s must be 4-D (batch, heads, seq_len, head_dim), got %lld-D with shape %s",
              op, names[i], LL(t.dim()), shape_str(t.sizes()).c_str());
    check_device_supported(op, t, names[i]);
  }
  for (int i = 1; i < 3; i++) {
    const Tensor &t = *named[i];
    OSS_CHECK(t.scalar_type() == query.scalar_type(), Type, "%s: %s.dtype=%s must equal query.dtype=%s", op,
              names[i], dtype_name(t.scalar_type()), dtype_name(query.scalar_type()));
    OSS_CHECK(t.device() == query.device(), Value, "%s: %s is on %s but query is on %s", op, names[i],
              device_str(t).c_str(), device_str(query).c_str());
    OSS_CHECK(t.size(0) == query.size(0), Value, "%s: %s.size(0)=%lld (batch) must equal query.size(0)=%lld", op,
              names[i], LL(t.size(0)), LL(query.size(0)));
  }
  const int64_t B = query.size(0), Hq = query.size(1), Lq = query.size(2), D = query.size(3);
  const int64_t Hkv = key.size(1), Lk = key.size(2), Dv = value.size(3);
  OSS_CHECK(value.size(1) == Hkv, Value, "%s: value.size(1)=%lld (heads) must equal key.size(1)=%lld", op,
            LL(value.size(1)), LL(Hkv));
  OSS_CHECK(value.size(2) == Lk, Value, "%s: value.size(2)=%lld (seq_len) must equal key.size(2)=%lld", op,
            LL(value.size(2)), LL(Lk));
  OSS_CHECK(key.size(3) == D, Value, "%s: key.size(-1)=%lld (head_dim) must equal query.size(-1)=%lld", op,
            LL(key.size(3)), LL(D));
  OSS_CHECK(D >= 1 && D <= kMaxHeadDim, Value, "%s: query.size(-1)=%lld but head_dim must be in [1, %lld]", op, LL(D),
            LL(kMaxHeadDim));
  OSS_CHECK(Dv >= 1 && Dv <= kMaxHeadDim, Value, "%s: value.size(-1)=%lld but head_dim must be in [1, %lld]", op,
            LL(Dv), LL(kMaxHeadDim));
  OSS_CHECK(Hkv >= 1 || Hq == 0, Value, "%s: key.size(1)=%lld (heads) must be at least 1 when query has %lld heads",
            op, LL(Hkv), LL(Hq));
  if (Hq != Hkv && Hq > 0) {
    OSS_CHECK(enable_gqa, Value,
              "%s: query has %lld heads but key and value have %lld; pass enable_gqa=True for grouped-query attention",
              op, LL(Hq), LL(Hkv));
    OSS_CHECK(Hq % Hkv == 0, Value,
              "%s: query.size(1)=%lld (heads) must be a multiple of key.size(1)=%lld for grouped-query attention", op,
              LL(Hq), LL(Hkv));
  }
  const std::string alignment(causal_alignment);
  OSS_CHECK(alignment == "top_left" || alignment == "bottom_right", Value,
            "%s: causal_alignment must be 'top_left' or 'bottom_right', got '%s'", op, alignment.c_str());
  if (scale) {
    OSS_CHECK(std::isfinite(*scale), Value, "%s: scale must be a finite number, got %g", op, *scale);
  }
  Tensor alibi, sinks;
  oss_attention_params variant_fields{};
  // a variable-length batch checks (batch, heads_q) ALiBi slopes against its sequences
  set_attention_variants(op, variants, query, variants_batch >= 0 ? variants_batch : B, Hq,
                         alignment == "bottom_right" ? OSS_CAUSAL_BOTTOM_RIGHT : OSS_CAUSAL_TOP_LEFT, variant_fields,
                         alibi, sinks);
#ifdef OSS_WITH_CUDA
  if (query.is_cuda()) {
    const int64_t max_dim = oss_attention_cuda_max_head_dim();
    OSS_CHECK(std::max(D, Dv) <= max_dim, NotImplemented,
              "%s: head_dim %lld exceeds the largest head dim compiled into this build (%lld); rebuild with "
              "TORCH_OSS_HEAD_DIMS including it",
              op, LL(std::max(D, Dv)), LL(max_dim));
  }
#endif

  AttentionInputs in{};  // p zeroed: optional fields (out_residual) default to none
  in.q = last_dim_contiguous(query);
  in.k = last_dim_contiguous(key);
  in.v = last_dim_contiguous(value);
  oss_attention_params &p = in.p;
  set_attention_sizes(p, query.scalar_type(), B, Hq, Hkv, Lq, Lk, D, Dv);
  p.q = in.q.data_ptr();
  p.k = in.k.data_ptr();
  p.v = in.v.data_ptr();
  fill_strides3(in.q, p.q_stride);
  fill_strides3(in.k, p.k_stride);
  fill_strides3(in.v, p.v_stride);
  p.out = nullptr;
  p.lse = nullptr;
  p.scale = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(D));
  p.causal = !is_causal ? OSS_CAUSAL_NONE
                        : (alignment == "bottom_right" ? OSS_CAUSAL_BOTTOM_RIGHT : OSS_CAUSAL_TOP_LEFT);
  p.mask_kind = OSS_MASK_NONE;
  p.mask = nullptr;
  p.mask_dtype = OSS_BOOL;
  for (int i = 0; i < 4; i++) p.mask_stride[i] = 0;
  in.alibi = alibi;
  in.sinks = sinks;
  copy_variant_fields(variant_fields, p);

  if (attn_mask && attn_mask->defined()) {
    const Tensor &m = *attn_mask;
    const at::ScalarType mt = m.scalar_type();
    OSS_CHECK(mt == at::kBool || mt == query.scalar_type() || mt == at::kFloat, Type,
              "%s: attn_mask.dtype=%s must be torch.bool, the dtype of query (%s) or torch.float32", op,
              dtype_name(mt), dtype_name(query.scalar_type()));
    OSS_CHECK(m.device() == query.device(), Value, "%s: attn_mask is on %s but query is on %s", op,
              device_str(m).c_str(), device_str(query).c_str());
    OSS_CHECK(m.dim() <= 4, Value, "%s: attn_mask must have at most 4 dims, got shape %s", op,
              shape_str(m.sizes()).c_str());
    const int64_t target[4] = {B, Hq, Lq, Lk};
    for (int64_t i = 0; i < m.dim(); i++) {
      const int64_t size = m.size(m.dim() - 1 - i), want = target[3 - i];
      OSS_CHECK(size == want || size == 1, Value,
                "%s: attn_mask of shape %s cannot be broadcast to (batch, heads, len_q, len_k) = (%lld, %lld, %lld, "
                "%lld)",
                op, shape_str(m.sizes()).c_str(), LL(B), LL(Hq), LL(Lq), LL(Lk));
    }
    in.mask = m.expand({B, Hq, Lq, Lk});
    if (in.mask.numel() == 0) return in;  // nothing to mask (and no storage to point at)
    p.mask_kind = mt == at::kBool ? OSS_MASK_BOOL : OSS_MASK_ADDITIVE;
    p.mask = in.mask.data_ptr();
    p.mask_dtype = to_oss_dtype(mt);
    for (int i = 0; i < 4; i++) p.mask_stride[i] = in.mask.size(i) == 1 ? 0 : in.mask.stride(i);
  }
  return in;
}

at::ScalarType lse_dtype(at::ScalarType input) { return input == at::kDouble ? at::kDouble : at::kFloat; }

bool is_half(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

// The forward's out: in query's layout where query is (B, L, H, D) memory seen
// as (B, H, L, D) (a projection's .view(B, L, H, D).transpose(1, 2)), as
// SDPA's kernels return it, so that a caller's out.transpose(1, 2).contiguous()
// copies nothing; contiguous otherwise. (_registrations.py's fake follows the
// same rule.)
Tensor attention_out_like(const Tensor &query, int64_t head_dim_v) {
  const int64_t B = query.size(0), H = query.size(1), L = query.size(2);
  if (query.stride(1) < query.stride(2)) return at::empty({B, L, H, head_dim_v}, query.options()).transpose(1, 2);
  return at::empty({B, H, L, head_dim_v}, query.options());
}

// A gradient in its input's layout (empty_like) where the input's last dim is
// contiguous, so dq, dk, dv of (B, L, H, D) views need no copy on their way
// back to the projections; contiguous otherwise. (The fakes follow it.)
Tensor grad_like(const Tensor &input) {
  return input.stride(-1) == 1 ? at::empty_like(input) : at::empty(input.sizes(), input.options());
}

// out's rounding residual as oss.h out_residual takes it: int8 codes with
// out's shape and strides, or an empty int8 tensor where none is kept.
Tensor residual_for(const Tensor &out, bool keep) {
  return keep ? at::empty_like(out, out.options().dtype(at::kChar)) : at::empty({0}, out.options().dtype(at::kChar));
}

// out, lse and, with keep_residual and 16-bit inputs, out's rounding residual
// (oss.h out_residual; an empty tensor otherwise).
std::tuple<Tensor, Tensor, Tensor> attention_forward(const char *op, const Tensor &query, const Tensor &key,
                                                     const Tensor &value, const std::optional<Tensor> &attn_mask,
                                                     bool is_causal, std::optional<double> scale, bool enable_gqa,
                                                     c10::string_view causal_alignment, bool keep_residual,
                                                     const AttentionVariants &variants) {
  AttentionInputs in =
      prepare_attention(op, query, key, value, attn_mask, is_causal, scale, enable_gqa, causal_alignment, variants);
  oss_attention_params &p = in.p;
  Tensor out = attention_out_like(query, p.head_dim_v);
  Tensor lse = at::empty({p.batch, p.heads_q, p.len_q}, query.options().dtype(lse_dtype(query.scalar_type())));
  Tensor residual = residual_for(out, keep_residual && is_half(query.scalar_type()));
  if (out.numel() == 0) return {out, lse, residual};
  p.out = out.data_ptr();
  fill_strides3(out, p.out_stride);
  p.lse = lse.data_ptr();
  p.out_residual = residual.numel() ? residual.data_ptr() : nullptr;  // empty_like(out): out's strides
#ifdef OSS_WITH_CUDA
  if (query.is_cuda()) {
    const c10::cuda::CUDAGuard guard(query.device());
    Tensor ws = cuda_workspace(query, oss_attention_forward_workspace_size_cuda(&p));
    check_status(op, oss_attention_forward_cuda(&p, data_or_null(ws), at::cuda::getCurrentCUDAStream().stream()));
    return {out, lse, residual};
  }
#endif
  check_status(op, oss_attention_forward_cpu(&p, &cpu_exec));
  return {out, lse, residual};
}

// `deterministic` (None: torch.are_deterministic_algorithms_enabled() at the
// call) is for the backward the autograd kernel records; the forward is
// always deterministic.
std::tuple<Tensor, Tensor> attention_op(const Tensor &query, const Tensor &key, const Tensor &value,
                                        const std::optional<Tensor> &attn_mask, bool is_causal,
                                        std::optional<double> scale, bool enable_gqa,
                                        c10::string_view causal_alignment, at::IntArrayRef window_size,
                                        double softcap, const std::optional<Tensor> &alibi_slopes,
                                        const std::optional<Tensor> &sinks, std::optional<bool> deterministic,
                                        double dropout_p, const std::optional<Tensor> &dropout_seed) {
  auto [out, lse, residual] =
      attention_forward("attention", query, key, value, attn_mask, is_causal, scale, enable_gqa, causal_alignment,
                        false, AttentionVariants{window_size, softcap, alibi_slopes, sinks, dropout_p, &dropout_seed});
  return {out, lse};
}

std::tuple<Tensor, Tensor, Tensor> attention_with_residual_op(
    const Tensor &query, const Tensor &key, const Tensor &value, const std::optional<Tensor> &attn_mask,
    bool is_causal, std::optional<double> scale, bool enable_gqa, c10::string_view causal_alignment,
    at::IntArrayRef window_size, double softcap, const std::optional<Tensor> &alibi_slopes,
    const std::optional<Tensor> &sinks, std::optional<bool> deterministic, double dropout_p,
    const std::optional<Tensor> &dropout_seed) {
  return attention_forward("attention_with_residual", query, key, value, attn_mask, is_causal, scale, enable_gqa,
                           causal_alignment, true,
                           AttentionVariants{window_size, softcap, alibi_slopes, sinks, dropout_p, &dropout_seed});
}

// The checks the attention backward ops share: grad_out, out and lse of the
// shapes the forward gave (out_shape, lse_shape), on the device of the query
// (named query_name), out and lse of the dtypes it gave, and out_residual
// (16-bit only) of out's shape, int8. Returns whether a residual is given.
bool check_backward_tensors(const char *op, const char *query_name, const Tensor &query, const Tensor &grad_out,
                            const Tensor &out, const Tensor &lse, const std::optional<Tensor> &out_residual,
                            const std::vector<int64_t> &out_shape, const std::vector<int64_t> &lse_shape) {
  const Tensor *named[3] = {&grad_out, &out, &lse};
  const char *names[3] = {"grad_out", "out", "lse"};
  const std::vector<int64_t> *want[3] = {&out_shape, &out_shape, &lse_shape};
  for (int i = 0; i < 3; i++) {
    OSS_CHECK(named[i]->sizes() == at::IntArrayRef(*want[i]), Value, "%s: %s has shape %s, expected %s", op,
              names[i], shape_str(named[i]->sizes()).c_str(), shape_str(*want[i]).c_str());
    OSS_CHECK(named[i]->device() == query.device(), Value, "%s: %s is on %s but %s is on %s", op, names[i],
              device_str(*named[i]).c_str(), query_name, device_str(query).c_str());
  }
  OSS_CHECK(out.scalar_type() == query.scalar_type(), Type, "%s: out.dtype=%s must equal %s.dtype=%s", op,
            dtype_name(out.scalar_type()), query_name, dtype_name(query.scalar_type()));
  OSS_CHECK(is_kernel_float(grad_out.scalar_type()), Type, "%s: grad_out has dtype %s but must be a floating type",
            op, dtype_name(grad_out.scalar_type()));
  OSS_CHECK(lse.scalar_type() == lse_dtype(query.scalar_type()), Type,
            "%s: lse has dtype %s but the forward of %s inputs produces %s", op, dtype_name(lse.scalar_type()),
            dtype_name(query.scalar_type()), dtype_name(lse_dtype(query.scalar_type())));
  const bool use_residual = out_residual.has_value() && out_residual->numel() > 0;
  if (use_residual) {
    OSS_CHECK(is_half(query.scalar_type()), Value,
              "%s: out_residual is only for float16/bfloat16 inputs, not %s (pass None)", op,
              dtype_name(query.scalar_type()));
    OSS_CHECK(out_residual->sizes() == out.sizes(), Value, "%s: out_residual has shape %s, expected %s", op,
              shape_str(out_residual->sizes()).c_str(), shape_str(out_shape).c_str());
    OSS_CHECK(out_residual->scalar_type() == at::kChar, Type,
              "%s: out_residual.dtype=%s must be torch.int8 (the forward's residual codes)", op,
              dtype_name(out_residual->scalar_type()));
    OSS_CHECK(out_residual->device() == query.device(), Value, "%s: out_residual is on %s but %s is on %s", op,
              device_str(*out_residual).c_str(), query_name, device_str(query).c_str());
  }
  return use_residual;
}

// The buffers of a backward call: out (and its residual, undefined when
// none), lse, dout, the gradients, dsinks (undefined when not wanted) and
// lse's gradient (undefined when none).
struct BackwardBuffers {
  Tensor out, out_residual, lse, dout, dq, dk, dv, dsinks, dlse;
};

// lse's gradient for the kernels (oss.h dlse): grad_lse checked against lse
// (shape, device, a floating dtype), in lse's dtype, contiguous; undefined
// when not given.
Tensor lse_gradient(const char *op, const Tensor &lse, const std::optional<Tensor> &grad_lse) {
  if (!given(grad_lse)) return Tensor();
  OSS_CHECK(grad_lse->sizes() == lse.sizes(), Value, "%s: grad_lse has shape %s, expected lse's %s", op,
            shape_str(grad_lse->sizes()).c_str(), shape_str(lse.sizes()).c_str());
  OSS_CHECK(grad_lse->device() == lse.device(), Value, "%s: grad_lse is on %s but lse is on %s", op,
            device_str(*grad_lse).c_str(), device_str(lse).c_str());
  OSS_CHECK(is_kernel_float(grad_lse->scalar_type()), Type, "%s: grad_lse has dtype %s but must be a floating type",
            op, dtype_name(grad_lse->scalar_type()));
  return grad_lse->to(lse.scalar_type()).contiguous();
}

// Points bp at b (strides of view(t): the tensors as [B, H, L, D]) and runs
// the backward on the device of `on`; the rest of bp is the caller's.
template <typename View>
void run_attention_backward(const char *op, oss_attention_backward_params &bp, const Tensor &on,
                            const BackwardBuffers &b, View view) {
  bp.fwd.out = b.out.data_ptr();
  fill_strides3(view(b.out), bp.fwd.out_stride);
  bp.fwd.out_residual = b.out_residual.defined() ? b.out_residual.data_ptr() : nullptr;
  bp.fwd.lse = b.lse.data_ptr();
  bp.dout = b.dout.data_ptr();
  fill_strides3(view(b.dout), bp.dout_stride);
  bp.dq = b.dq.data_ptr();
  fill_strides3(view(b.dq), bp.dq_stride);
  bp.dk = b.dk.data_ptr();
  fill_strides3(view(b.dk), bp.dk_stride);
  bp.dv = b.dv.data_ptr();
  fill_strides3(view(b.dv), bp.dv_stride);
  bp.dsinks = b.dsinks.defined() ? b.dsinks.data_ptr<float>() : nullptr;
  bp.dlse = b.dlse.defined() ? b.dlse.data_ptr() : nullptr;
#ifdef OSS_WITH_CUDA
  if (on.is_cuda()) {
    const c10::cuda::CUDAGuard guard(on.device());
    Tensor ws = cuda_workspace(on, oss_attention_backward_workspace_size_cuda(&bp));
    check_status(op, oss_attention_backward_cuda(&bp, data_or_null(ws), at::cuda::getCurrentCUDAStream().stream()));
    return;
  }
#endif
  check_status(op, oss_attention_backward_cpu(&bp, &cpu_exec));
}

// dq, dk, dv and, with want_dsinks (sinks given), the sinks' gradient in
// their dtype (an undefined tensor otherwise).
std::tuple<Tensor, Tensor, Tensor, Tensor> attention_backward_impl(
    const char *op, const Tensor &grad_out, const Tensor &query, const Tensor &key, const Tensor &value,
    const Tensor &out, const Tensor &lse, const std::optional<Tensor> &attn_mask, bool is_causal,
    std::optional<double> scale, bool enable_gqa, c10::string_view causal_alignment, bool deterministic,
    const std::optional<Tensor> &out_residual, const AttentionVariants &variants, bool want_dsinks,
    const std::optional<Tensor> &grad_lse, bool keys_subset = false) {
  AttentionInputs in =
      prepare_attention(op, query, key, value, attn_mask, is_causal, scale, enable_gqa, causal_alignment, variants);
  oss_attention_backward_params bp{};
  bp.fwd = in.p;
  const oss_attention_params &p = bp.fwd;
  // the residual is read with out's strides: both as given where they share
  // them (as the forward returns them), else both contiguous
  const bool use_residual =
      check_backward_tensors(op, "query", query, grad_out, out, lse, out_residual,
                             {p.batch, p.heads_q, p.len_q, p.head_dim_v}, {p.batch, p.heads_q, p.len_q});
  const bool residual_as_given =
      use_residual && out.stride(-1) == 1 && out_residual->strides() == out.strides();
  Tensor o = use_residual && !residual_as_given ? out.contiguous() : last_dim_contiguous(out);
  Tensor o_res = use_residual ? (residual_as_given ? *out_residual : out_residual->contiguous()) : Tensor();
  Tensor dout = last_dim_contiguous(grad_out.to(query.scalar_type()));
  Tensor lse_c = lse.contiguous();
  Tensor dlse = lse_gradient(op, lse, grad_lse);
  Tensor dq = grad_like(query);
  Tensor dk = grad_like(key);
  Tensor dv = grad_like(value);
  Tensor dsinks = want_dsinks ? at::zeros({p.heads_q}, query.options().dtype(at::kFloat)) : Tensor();
  auto result = [&]() -> std::tuple<Tensor, Tensor, Tensor, Tensor> {
    return {dq, dk, dv, want_dsinks ? dsinks.to(variants.sinks->scalar_type()) : Tensor()};
  };
  if (p.batch == 0 || p.heads_q == 0) {
    dk.zero_();
    dv.zero_();
    return result();
  }

  bp.deterministic = deterministic;
  bp.keys_subset = keys_subset;
  run_attention_backward(op, bp, query, {o, o_res, lse_c, dout, dq, dk, dv, dsinks, dlse},
                         [](const Tensor &t) -> const Tensor & { return t; });
  return result();
}

// The backward ops' checks alone (attention_backward_impl's), for the
// differentiable recomputation, which runs no kernel.
void check_attention_backward(const char *op, const Tensor &grad_out, const Tensor &query, const Tensor &key,
                              const Tensor &value, const Tensor &out, const Tensor &lse,
                              const std::optional<Tensor> &attn_mask, bool is_causal, std::optional<double> scale,
                              bool enable_gqa, c10::string_view causal_alignment,
                              const std::optional<Tensor> &out_residual, const AttentionVariants &variants,
                              const std::optional<Tensor> &grad_lse) {
  const AttentionInputs in =
      prepare_attention(op, query, key, value, attn_mask, is_causal, scale, enable_gqa, causal_alignment, variants);
  const oss_attention_params &p = in.p;
  check_backward_tensors(op, "query", query, grad_out, out, lse, out_residual,
                         {p.batch, p.heads_q, p.len_q, p.head_dim_v}, {p.batch, p.heads_q, p.len_q});
  lse_gradient(op, lse, grad_lse);
}

std::tuple<Tensor, Tensor, Tensor> attention_backward_op(
    const Tensor &grad_out, const Tensor &query, const Tensor &key, const Tensor &value, const Tensor &out,
    const Tensor &lse, const std::optional<Tensor> &attn_mask, bool is_causal, std::optional<double> scale,
    bool enable_gqa, c10::string_view causal_alignment, bool deterministic, const std::optional<Tensor> &out_residual,
    at::IntArrayRef window_size, double softcap, const std::optional<Tensor> &alibi_slopes,
    const std::optional<Tensor> &sinks, bool keys_subset, double dropout_p, const std::optional<Tensor> &dropout_seed,
    const std::optional<Tensor> &grad_lse) {
  auto [dq, dk, dv, dsinks] = attention_backward_impl(
      "attention_backward", grad_out, query, key, value, out, lse, attn_mask, is_causal, scale, enable_gqa,
      causal_alignment, deterministic, out_residual,
      AttentionVariants{window_size, softcap, alibi_slopes, sinks, dropout_p, &dropout_seed}, false, grad_lse,
      keys_subset);
  return {dq, dk, dv};
}

// The same backward that also returns the sinks' gradient (oss.h dsinks), in
// the sinks' dtype.
std::tuple<Tensor, Tensor, Tensor, Tensor> attention_backward_with_sinks_op(
    const Tensor &grad_out, const Tensor &query, const Tensor &key, const Tensor &value, const Tensor &out,
    const Tensor &lse, const std::optional<Tensor> &attn_mask, bool is_causal, std::optional<double> scale,
    bool enable_gqa, c10::string_view causal_alignment, bool deterministic, const std::optional<Tensor> &out_residual,
    at::IntArrayRef window_size, double softcap, const std::optional<Tensor> &alibi_slopes, const Tensor &sinks,
    double dropout_p, const std::optional<Tensor> &dropout_seed, const std::optional<Tensor> &grad_lse) {
  const std::optional<Tensor> sinks_opt(sinks);
  return attention_backward_impl(
      "attention_backward_with_sinks", grad_out, query, key, value, out, lse, attn_mask, is_causal, scale, enable_gqa,
      causal_alignment, deterministic, out_residual,
      AttentionVariants{window_size, softcap, alibi_slopes, sinks_opt, dropout_p, &dropout_seed}, true, grad_lse);
}

// ---------------------------------------------------------------------------
// Variable-length batches (oss.h cu_seqlens_q / cu_seqlens_k): packed q
// (total_q, Hq, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv); sequence b is
// rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1 of q and cu_seqlens_k[b] .. of k
// and v. The kernels see them as [1, H, total, D] views whose batch stride they
// ignore; out is (total_q, Hq, Dv), lse (Hq, total_q). Shapes, dtypes and
// devices are checked here; the CPU kernel checks the values of cu_seqlens, on
// CUDA the Python wrapper does (a host synchronisation), and the kernels clamp
// every sequence inside the packed tensors.
// ---------------------------------------------------------------------------

// A packed (total, heads, dim) tensor as the [1, heads, total, dim] view.
Tensor packed_view(const Tensor &t) { return t.transpose(0, 1).unsqueeze(0); }

struct VarlenInputs {
  AttentionInputs in;
  Tensor cu_q, cu_k;
};

VarlenInputs prepare_varlen(const char *op, const Tensor &q, const Tensor &k, const Tensor &v,
                            const Tensor &cu_seqlens_q, const Tensor &cu_seqlens_k, int64_t max_seqlen_q,
                            int64_t max_seqlen_k, bool is_causal, std::optional<double> scale,
                            c10::string_view causal_alignment, const AttentionVariants &variants) {
  const Tensor *named[3] = {&q, &k, &v};
  const char *names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; i++)
    OSS_CHECK(named[i]->dim() == 3, Value, "%s: %s must be 3-D (total_tokens, heads, head_dim), got shape %s", op,
              names[i], shape_str(named[i]->sizes()).c_str());
  OSS_CHECK(v.size(0) == k.size(0), Value, "%s: v.size(0)=%lld (tokens) must equal k.size(0)=%lld", op,
            LL(v.size(0)), LL(k.size(0)));
  OSS_CHECK(v.size(1) == k.size(1), Value, "%s: v.size(1)=%lld (heads) must equal k.size(1)=%lld", op,
            LL(v.size(1)), LL(k.size(1)));
  const Tensor *cus[2] = {&cu_seqlens_q, &cu_seqlens_k};
  const char *cu_names[2] = {"cu_seqlens_q", "cu_seqlens_k"};
  for (int i = 0; i < 2; i++) {
    const Tensor &c = *cus[i];
    OSS_CHECK(c.scalar_type() == at::kInt, Type, "%s: %s.dtype=%s must be torch.int32", op, cu_names[i],
              dtype_name(c.scalar_type()));
    OSS_CHECK(c.dim() == 1 && c.size(0) >= 1, Value, "%s: %s must be 1-D with batch + 1 >= 1 entries, got shape %s",
              op, cu_names[i], shape_str(c.sizes()).c_str());
    OSS_CHECK(c.device() == q.device(), Value, "%s: %s is on %s but q is on %s", op, cu_names[i],
              device_str(c).c_str(), device_str(q).c_str());
  }
  OSS_CHECK(cu_seqlens_q.size(0) == cu_seqlens_k.size(0), Value,
            "%s: cu_seqlens_q has %lld entries but cu_seqlens_k has %lld (both batch + 1)", op,
            LL(cu_seqlens_q.size(0)), LL(cu_seqlens_k.size(0)));
  OSS_CHECK(max_seqlen_q >= 0 && max_seqlen_q <= INT_MAX - 1024, Value, "%s: max_seqlen_q=%lld must be in [0, %d]",
            op, LL(max_seqlen_q), INT_MAX - 1024);
  OSS_CHECK(max_seqlen_k >= 0 && max_seqlen_k <= INT_MAX - 1024, Value, "%s: max_seqlen_k=%lld must be in [0, %d]",
            op, LL(max_seqlen_k), INT_MAX - 1024);
  const int64_t batch = cu_seqlens_q.size(0) - 1;
  VarlenInputs r;
  r.in = prepare_attention(op, packed_view(q), packed_view(k), packed_view(v), std::nullopt, is_causal, scale,
                           /*enable_gqa=*/true, causal_alignment, variants, batch);
  r.cu_q = cu_seqlens_q.contiguous();
  r.cu_k = cu_seqlens_k.contiguous();
  oss_attention_params &p = r.in.p;
  p.batch = batch;
  p.len_q = max_seqlen_q;
  p.len_k = max_seqlen_k;
  p.total_q = q.size(0);
  p.total_k = k.size(0);
  p.cu_seqlens_q = r.cu_q.data_ptr<int32_t>();
  p.cu_seqlens_k = r.cu_k.data_ptr<int32_t>();
  return r;
}

std::tuple<Tensor, Tensor, Tensor> attention_varlen_op(
    const Tensor &q, const Tensor &k, const Tensor &v, const Tensor &cu_seqlens_q, const Tensor &cu_seqlens_k,
    int64_t max_seqlen_q, int64_t max_seqlen_k, bool is_causal, std::optional<double> scale,
    c10::string_view causal_alignment, at::IntArrayRef window_size, double softcap,
    const std::optional<Tensor> &alibi_slopes, const std::optional<Tensor> &sinks, std::optional<bool> deterministic,
    double dropout_p, const std::optional<Tensor> &dropout_seed, bool return_residual) {
  // deterministic (None: torch.are_deterministic_algorithms_enabled() at the
  // call) is for the backward the autograd formula records; the forward is
  // always deterministic
  const char *op = "attention_varlen";
  VarlenInputs r = prepare_varlen(op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal,
                                  scale, causal_alignment,
                                  AttentionVariants{window_size, softcap, alibi_slopes, sinks, dropout_p, &dropout_seed});
  oss_attention_params &p = r.in.p;
  Tensor out = at::empty({q.size(0), q.size(1), v.size(2)}, q.options());
  Tensor lse = at::empty({q.size(1), q.size(0)}, q.options().dtype(lse_dtype(q.scalar_type())));
  Tensor residual = residual_for(out, return_residual && is_half(q.scalar_type()));
  if (out.numel() == 0 || p.batch == 0) return {out, lse, residual};
  Tensor out4 = packed_view(out);
  p.out = out.data_ptr();
  fill_strides3(out4, p.out_stride);
  p.lse = lse.data_ptr();
  p.out_residual = residual.numel() ? residual.data_ptr() : nullptr;  // out's strides
#ifdef OSS_WITH_CUDA
  if (q.is_cuda()) {
    const c10::cuda::CUDAGuard guard(q.device());
    Tensor ws = cuda_workspace(q, oss_attention_forward_workspace_size_cuda(&p));
    check_status(op, oss_attention_forward_cuda(&p, data_or_null(ws), at::cuda::getCurrentCUDAStream().stream()));
    return {out, lse, residual};
  }
#endif
  check_status(op, oss_attention_forward_cpu(&p, &cpu_exec));
  return {out, lse, residual};
}

// dq, dk, dv and the sinks' gradient in their dtype (an empty tensor without sinks).
std::tuple<Tensor, Tensor, Tensor, Tensor> attention_varlen_backward_op(
    const Tensor &grad_out, const Tensor &q, const Tensor &k, const Tensor &v, const Tensor &out, const Tensor &lse,
    const Tensor &cu_seqlens_q, const Tensor &cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
    bool is_causal, std::optional<double> scale, c10::string_view causal_alignment, bool deterministic,
    const std::optional<Tensor> &out_residual, at::IntArrayRef window_size, double softcap,
    const std::optional<Tensor> &alibi_slopes, const std::optional<Tensor> &sinks, double dropout_p,
    const std::optional<Tensor> &dropout_seed, const std::optional<Tensor> &grad_lse) {
  const char *op = "attention_varlen_backward";
  VarlenInputs r = prepare_varlen(op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal,
                                  scale, causal_alignment,
                                  AttentionVariants{window_size, softcap, alibi_slopes, sinks, dropout_p, &dropout_seed});
  oss_attention_backward_params bp{};
  bp.fwd = r.in.p;
  const bool use_residual = check_backward_tensors(op, "q", q, grad_out, out, lse, out_residual,
                                                   {q.size(0), q.size(1), v.size(2)}, {q.size(1), q.size(0)});
  const bool want_dsinks = given(sinks);
  Tensor o = use_residual ? out.contiguous() : last_dim_contiguous(out);
  Tensor o_res = use_residual ? out_residual->contiguous() : Tensor();
  Tensor dout = last_dim_contiguous(grad_out.to(q.scalar_type()));
  Tensor lse_c = lse.contiguous();
  Tensor dlse = lse_gradient(op, lse, grad_lse);
  // zeroed: rows outside every sequence get 0
  Tensor dq = at::zeros(q.sizes(), q.options());
  Tensor dk = at::zeros(k.sizes(), k.options());
  Tensor dv = at::zeros(v.sizes(), v.options());
  Tensor dsinks = want_dsinks ? at::zeros({q.size(1)}, q.options().dtype(at::kFloat)) : Tensor();
  auto result = [&]() -> std::tuple<Tensor, Tensor, Tensor, Tensor> {
    return {dq, dk, dv, want_dsinks ? dsinks.to(sinks->scalar_type()) : at::empty({0}, q.options())};
  };
  if (bp.fwd.batch == 0 || q.size(1) == 0) return result();
  bp.deterministic = deterministic;
  run_attention_backward(op, bp, q, {o, o_res, lse_c, dout, dq, dk, dv, dsinks, dlse},
                         [](const Tensor &t) { return packed_view(t); });
  return result();
}

// ---------------------------------------------------------------------------
// Attention over a KV cache (FlashAttention's layout: q (B, Lq, Hq, D), caches
// (B, Lmax, Hkv, D) or paged (num_pages, page_size, Hkv, D) with block_table
// (B, pages per sequence)). New keys and values k, v (B, Lnew, Hkv, D/Dv) are
// written into the caches at positions cache_seqlens[b] .. + Lnew - 1 (ATen
// index_put_, no host synchronisation), then q attends to keys
// 0 .. cache_seqlens[b] + Lnew - 1, causally aligned bottom-right. Checks here
// cover shapes, dtypes and devices; the values of cache_seqlens and
// block_table are checked by the CPU kernel and, on CUDA, by the Python
// wrapper (torch_oss.attention_with_kvcache), which can do it only with a
// host synchronisation.
// ---------------------------------------------------------------------------

std::tuple<Tensor, Tensor> attention_with_kvcache_op(const Tensor &q, const Tensor &k_cache, const Tensor &v_cache,
                                                     const std::optional<Tensor> &k_new,
                                                     const std::optional<Tensor> &v_new,
                                                     const std::optional<Tensor> &cache_seqlens,
                                                     const std::optional<Tensor> &block_table,
                                                     std::optional<double> softmax_scale, bool causal,
                                                     at::IntArrayRef window_size, double softcap,
                                                     const std::optional<Tensor> &alibi_slopes,
                                                     const std::optional<Tensor> &sinks) {
  const char *op = "attention_with_kvcache";
  const Tensor *named[3] = {&q, &k_cache, &v_cache};
  const char *names[3] = {"q", "k_cache", "v_cache"};
  for (int i = 0; i < 3; i++) {
    const Tensor &t = *named[i];
    OSS_CHECK(is_kernel_float(t.scalar_type()), Type,
              "%s: %s has dtype %s but must be float16, bfloat16, float32 or float64", op, names[i],
              dtype_name(t.scalar_type()));
    OSS_CHECK(t.dim() == 4, Value, "%s: %s must be 4-D, got shape %s", op, names[i], shape_str(t.sizes()).c_str());
    OSS_CHECK(t.scalar_type() == q.scalar_type(), Type, "%s: %s.dtype=%s must equal q.dtype=%s", op, names[i],
              dtype_name(t.scalar_type()), dtype_name(q.scalar_type()));
    OSS_CHECK(t.device() == q.device(), Value, "%s: %s is on %s but q is on %s", op, names[i],
              device_str(t).c_str(), device_str(q).c_str());
    check_device_supported(op, t, names[i]);
    OSS_CHECK(t.size(3) <= 1 || t.stride(3) == 1, Value, "%s: %s must have a unit-stride last dim (strides %s)", op,
              names[i], shape_str(t.strides()).c_str());
  }
  const bool paged = block_table.has_value() && block_table->defined();
  const int64_t B = q.size(0), Lq = q.size(1), Hq = q.size(2), D = q.size(3);
  const int64_t Hkv = k_cache.size(2), Dv = v_cache.size(3);
  OSS_CHECK(v_cache.sizes().slice(0, 3) == k_cache.sizes().slice(0, 3), Value,
            "%s: v_cache has shape %s but k_cache has %s (they may differ in the last dim only)", op,
            shape_str(v_cache.sizes()).c_str(), shape_str(k_cache.sizes()).c_str());
  OSS_CHECK(k_cache.size(3) == D, Value, "%s: k_cache.size(-1)=%lld must equal q.size(-1)=%lld", op,
            LL(k_cache.size(3)), LL(D));
  OSS_CHECK(D >= 1 && D <= kMaxHeadDim && Dv >= 1 && Dv <= kMaxHeadDim, Value,
            "%s: head dims %lld (q) and %lld (v_cache) must be in [1, %lld]", op, LL(D), LL(Dv), LL(kMaxHeadDim));
  OSS_CHECK(Hkv >= 1 && Hq % Hkv == 0, Value,
            "%s: q has %lld heads, which must be a multiple of the caches' %lld heads", op, LL(Hq), LL(Hkv));
  OSS_CHECK(paged || k_cache.size(0) == B, Value, "%s: k_cache.size(0)=%lld (batch) must equal q.size(0)=%lld", op,
            LL(k_cache.size(0)), LL(B));
  // the variants, checked before anything is written into the caches; their
  // diagonal is the bottom-right one the causal rule follows
  Tensor alibi, sinks_f;
  oss_attention_params variant_fields{};
  set_attention_variants(op, AttentionVariants{window_size, softcap, alibi_slopes, sinks}, q, B, Hq,
                         OSS_CAUSAL_BOTTOM_RIGHT, variant_fields, alibi, sinks_f, /*kv_cache=*/true);
  int64_t capacity = k_cache.size(1);
  Tensor table;
  if (paged) {
    table = *block_table;
    OSS_CHECK(table.scalar_type() == at::kInt, Type, "%s: block_table.dtype=%s must be torch.int32", op,
              dtype_name(table.scalar_type()));
    OSS_CHECK(table.dim() == 2 && table.size(0) == B, Value,
              "%s: block_table must have shape (batch=%lld, pages per sequence), got %s", op, LL(B),
              shape_str(table.sizes()).c_str());
    OSS_CHECK(table.device() == q.device(), Value, "%s: block_table is on %s but q is on %s", op,
              device_str(table).c_str(), device_str(q).c_str());
    OSS_CHECK(table.size(1) >= 1 && k_cache.size(1) >= 1, Value,
              "%s: block_table has %lld pages per sequence and the pages %lld rows; both must be >= 1", op,
              LL(table.size(1)), LL(k_cache.size(1)));
    table = table.contiguous();
    capacity = table.size(1) * k_cache.size(1);
  }
  Tensor seqlens;
  if (cache_seqlens.has_value() && cache_seqlens->defined()) {
    const Tensor &c = *cache_seqlens;
    OSS_CHECK(c.scalar_type() == at::kInt || c.scalar_type() == at::kLong, Type,
              "%s: cache_seqlens.dtype=%s must be torch.int32 or torch.int64", op, dtype_name(c.scalar_type()));
    OSS_CHECK(c.dim() == 1 && c.size(0) == B, Value, "%s: cache_seqlens must have shape (batch=%lld,), got %s", op,
              LL(B), shape_str(c.sizes()).c_str());
    OSS_CHECK(c.device() == q.device(), Value, "%s: cache_seqlens is on %s but q is on %s", op,
              device_str(c).c_str(), device_str(q).c_str());
    seqlens = c.to(at::kInt);
  }
  const bool has_k = k_new.has_value() && k_new->defined(), has_v = v_new.has_value() && v_new->defined();
  if (seqlens.defined() && seqlens.is_cpu() && B > 0) {  // host values: checked here, naming the argument
    const int64_t added = has_k ? k_new->size(1) : 0;
    const int64_t low = seqlens.min().item<int64_t>(), high = seqlens.max().item<int64_t>() + added;
    OSS_CHECK(low >= 0 && high <= capacity, Value,
              "%s: cache_seqlens (from %lld to %lld) plus %lld new tokens must stay within [0, %lld], the tokens the "
              "cache holds per sequence",
              op, LL(low), LL(high - added), LL(added), LL(capacity));
  }
  OSS_CHECK(has_k == has_v, Value, "%s: k and v must be given together (k %s, v %s)", op, has_k ? "given" : "None",
            has_v ? "given" : "None");
  if (has_k) {
    OSS_CHECK(seqlens.defined(), Value, "%s: appending k and v needs cache_seqlens (where to write them)", op);
    const Tensor &kn = *k_new, &vn = *v_new;
    for (const auto &[t, name, width] : {std::tuple<const Tensor &, const char *, int64_t>{kn, "k", D},
                                         std::tuple<const Tensor &, const char *, int64_t>{vn, "v", Dv}}) {
      OSS_CHECK(t.scalar_type() == q.scalar_type(), Type, "%s: %s.dtype=%s must equal q.dtype=%s", op, name,
                dtype_name(t.scalar_type()), dtype_name(q.scalar_type()));
      OSS_CHECK(t.device() == q.device(), Value, "%s: %s is on %s but q is on %s", op, name, device_str(t).c_str(),
                device_str(q).c_str());
      OSS_CHECK(t.dim() == 4 && t.size(0) == B && t.size(1) == kn.size(1) && t.size(2) == Hkv && t.size(3) == width,
                Value, "%s: %s must have shape (batch=%lld, new tokens, heads=%lld, %lld), got %s", op, name, LL(B),
                LL(Hkv), LL(width), shape_str(t.sizes()).c_str());
    }
    const int64_t Lnew = kn.size(1);
    if (Lnew > 0) {
      // positions (B, Lnew) of the new tokens, and their (batch or page, row) in the caches
      Tensor pos = seqlens.to(at::kLong).unsqueeze(1) + at::arange(Lnew, seqlens.options().dtype(at::kLong));
      Tensor first, row;
      if (paged) {
        const int64_t page_size = k_cache.size(1);
        first = table.to(at::kLong).gather(1, at::div(pos, page_size, "floor").clamp_max(table.size(1) - 1));
        row = at::remainder(pos, page_size);
      } else {
        first = at::arange(B, pos.options()).unsqueeze(1).expand({B, Lnew});
        row = pos;
      }
      const c10::List<std::optional<Tensor>> where({first, row});
      k_cache.index_put_(where, kn);
      v_cache.index_put_(where, vn);
    }
    seqlens = (seqlens + Lnew).to(at::kInt);
  }

  oss_attention_params p{};
  set_attention_sizes(p, q.scalar_type(), B, Hq, Hkv, Lq, capacity, D, Dv);
  // [batch or page, heads, position] strides of the (B or pages, L, H, D) layout
  const Tensor *views[3] = {&q, &k_cache, &v_cache};
  int64_t *strides[3] = {p.q_stride, p.k_stride, p.v_stride};
  for (int i = 0; i < 3; i++) {
    strides[i][0] = views[i]->stride(0);
    strides[i][1] = views[i]->stride(2);
    strides[i][2] = views[i]->stride(1);
  }
  p.q = q.data_ptr();
  p.k = k_cache.data_ptr();
  p.v = v_cache.data_ptr();
  p.scale = softmax_scale ? *softmax_scale : 1.0 / std::sqrt(static_cast<double>(D));
  OSS_CHECK(std::isfinite(p.scale), Value, "%s: softmax_scale must be a finite number, got %g", op, p.scale);
  p.causal = causal ? OSS_CAUSAL_BOTTOM_RIGHT : OSS_CAUSAL_NONE;
  p.mask_kind = OSS_MASK_NONE;
  p.mask_dtype = OSS_BOOL;
  copy_variant_fields(variant_fields, p);
  if (seqlens.defined()) seqlens = seqlens.contiguous();
  p.seqlens_k = seqlens.defined() ? seqlens.data_ptr<int32_t>() : nullptr;
  if (paged) {
    p.block_table = table.data_ptr<int32_t>();
    p.block_table_stride = table.size(1);
    p.page_size = k_cache.size(1);
    p.num_pages = k_cache.size(0);
  }
  Tensor out = at::empty({B, Lq, Hq, Dv}, q.options());
  Tensor lse = at::empty({B, Hq, Lq}, q.options().dtype(lse_dtype(q.scalar_type())));
  if (out.numel() == 0) return {out, lse};
  p.out = out.data_ptr();
  p.out_stride[0] = out.stride(0);
  p.out_stride[1] = out.stride(2);
  p.out_stride[2] = out.stride(1);
  p.lse = lse.data_ptr();
#ifdef OSS_WITH_CUDA
  if (q.is_cuda()) {
    const c10::cuda::CUDAGuard guard(q.device());
    Tensor ws = cuda_workspace(q, oss_attention_forward_workspace_size_cuda(&p));
    check_status(op, oss_attention_forward_cuda(&p, data_or_null(ws), at::cuda::getCurrentCUDAStream().stream()));
    return {out, lse};
  }
#endif
  check_status(op, oss_attention_forward_cpu(&p, &cpu_exec));
  return {out, lse};
}

// ---------------------------------------------------------------------------
// Cross-entropy over class indices: the C kernel on the CPU, the CUDA kernels
// (csrc/cuda/cross_entropy/cross_entropy.cu) on CUDA. The CPU kernel checks
// the targets on the host and raises for a bad one; the CUDA entry points do
// not (the targets live on the device, and a check would synchronise with
// it): there a bad target gives its row a NaN loss and a NaN gradient row.
// ---------------------------------------------------------------------------

// The checks of both target kinds: logits (2-D rows of a kernel dtype on a
// supported device), the target's device and the scalars; returns the loss
// dtype (lse is float64).
at::ScalarType check_cross_entropy_common(const char *op, const Tensor &logits, const Tensor &target,
                                          double label_smoothing, double z_loss) {
  check_device_supported(op, logits, "logits");
  OSS_CHECK(logits.dim() == 2, Value, "%s: logits must be 2-D (N, C), got shape %s", op,
            shape_str(logits.sizes()).c_str());
  OSS_CHECK(is_kernel_float(logits.scalar_type()), Type,
            "%s: logits have dtype %s but must be float16, bfloat16, float32 or float64", op,
            dtype_name(logits.scalar_type()));
  OSS_CHECK(logits.size(1) >= 1, Value, "%s: logits have %lld classes; need at least 1", op, LL(logits.size(1)));
  OSS_CHECK(target.device() == logits.device(), Value, "%s: target is on %s but logits are on %s", op,
            device_str(target).c_str(), device_str(logits).c_str());
  OSS_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, Value, "%s: label_smoothing=%g must be in [0, 1]", op,
            label_smoothing);
  OSS_CHECK(z_loss >= 0.0 && std::isfinite(z_loss), Value, "%s: z_loss=%g must be finite and >= 0", op, z_loss);
  return logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Checks shared by the forward and the backward; returns the loss dtype.
at::ScalarType check_cross_entropy(const char *op, const Tensor &logits, const Tensor &target,
                                   double label_smoothing, double z_loss) {
  const at::ScalarType loss_dtype = check_cross_entropy_common(op, logits, target, label_smoothing, z_loss);
  OSS_CHECK(target.scalar_type() == at::kLong, Type, "%s: target has dtype %s but must be int64 class indices", op,
            dtype_name(target.scalar_type()));
  OSS_CHECK(target.dim() == 1 && target.size(0) == logits.size(0), Value,
            "%s: target has shape %s but must be (N,) = (%lld,) for logits of shape %s", op,
            shape_str(target.sizes()).c_str(), LL(logits.size(0)), shape_str(logits.sizes()).c_str());
  return loss_dtype;
}

oss_cross_entropy_params cross_entropy_params(Tensor &logits, Tensor &target, int64_t ignore_index,
                                              double label_smoothing, double z_loss) {
  // (a single row with a class stride too: the kernels read rows as unit-stride)
  if (logits.size(1) > 1 && logits.stride(1) != 1) logits = logits.contiguous();
  target = target.contiguous();
  oss_cross_entropy_params p;
  p.rows = logits.size(0);
  p.classes = logits.size(1);
  p.logits = logits.data_ptr();
  p.dtype = to_oss_dtype(logits.scalar_type());
  p.logits_stride_row = logits.size(0) > 1 ? logits.stride(0) : logits.size(1);
  p.target = target.data_ptr<int64_t>();
  p.ignore_index = ignore_index;
  p.label_smoothing = label_smoothing;
  p.z_loss = z_loss;
  p.loss = nullptr;
  p.lse = nullptr;
  return p;
}

std::tuple<Tensor, Tensor> cross_entropy_op(const Tensor &logits_in, const Tensor &target_in, int64_t ignore_index,
                                            double label_smoothing, double z_loss) {
  const char *op = "cross_entropy";
  const at::ScalarType stat_dtype = check_cross_entropy(op, logits_in, target_in, label_smoothing, z_loss);
  Tensor logits = logits_in, target = target_in;
  Tensor loss = at::empty({logits.size(0)}, logits.options().dtype(stat_dtype));
  Tensor lse = at::empty({logits.size(0)}, logits.options().dtype(at::kDouble));
  if (logits.size(0) == 0) return {loss, lse};
  oss_cross_entropy_params p = cross_entropy_params(logits, target, ignore_index, label_smoothing, z_loss);
  p.loss = loss.data_ptr();
  p.lse = lse.data_ptr();
#ifdef OSS_WITH_CUDA
  if (logits.is_cuda()) {
    const c10::cuda::CUDAGuard guard(logits.device());
    check_status(op, oss_cross_entropy_forward_cuda(&p, at::cuda::getCurrentCUDAStream().stream()));
    return {loss, lse};
  }
#endif
  check_status(op, oss_cross_entropy_forward_cpu(&p, &cpu_exec));
  return {loss, lse};
}

// The checks of a grad_loss (and, for the backward, an lse) argument: on the
// logits' device, shape (N,), floating point.
void check_row_vector(const char *op, const char *name, const Tensor &t, const Tensor &logits) {
  OSS_CHECK(t.device() == logits.device(), Value, "%s: %s is on %s but logits are on %s", op, name,
            device_str(t).c_str(), device_str(logits).c_str());
  OSS_CHECK(t.dim() == 1 && t.size(0) == logits.size(0), Value, "%s: %s has shape %s but must be (N,) = (%lld,)", op,
            name, shape_str(t.sizes()).c_str(), LL(logits.size(0)));
  OSS_CHECK(is_kernel_float(t.scalar_type()), Type, "%s: %s has dtype %s but must be a floating type", op, name,
            dtype_name(t.scalar_type()));
}

// The backward kernels on checked arguments: the gradient for grad_loss
// (times grad_scale where that is defined: the scaled op's rule) written into
// grad, whose classes are unit-stride.
void run_cross_entropy_backward(const char *op, at::ScalarType stat_dtype, const Tensor &grad_loss_in,
                                const Tensor &logits_in, const Tensor &target_in, const Tensor &lse_in,
                                int64_t ignore_index, double label_smoothing, double z_loss, const Tensor &grad,
                                const Tensor &grad_scale_in) {
  if (logits_in.size(0) == 0) return;
  Tensor logits = logits_in, target = target_in;
  const Tensor grad_loss = grad_loss_in.to(stat_dtype).contiguous();
  const Tensor lse = lse_in.to(at::kDouble).contiguous();
  const Tensor grad_scale =
      grad_scale_in.defined() ? grad_scale_in.reshape({1}).to(stat_dtype).contiguous() : grad_scale_in;
  oss_cross_entropy_backward_params p;
  p.fwd = cross_entropy_params(logits, target, ignore_index, label_smoothing, z_loss);
  p.fwd.lse = const_cast<void *>(lse.data_ptr());
  p.grad_loss = grad_loss.data_ptr();
  p.grad_logits = grad.data_ptr();
  p.grad_logits_stride_row = grad.size(0) > 1 ? grad.stride(0) : grad.size(1);
  p.grad_scale = grad_scale.defined() ? grad_scale.data_ptr() : nullptr;
#ifdef OSS_WITH_CUDA
  if (logits.is_cuda()) {
    const c10::cuda::CUDAGuard guard(logits.device());
    check_status(op, oss_cross_entropy_backward_cuda(&p, at::cuda::getCurrentCUDAStream().stream()));
    return;
  }
#endif
  check_status(op, oss_cross_entropy_backward_cpu(&p, &cpu_exec));
}

Tensor cross_entropy_backward_op(const Tensor &grad_loss, const Tensor &logits, const Tensor &target,
                                 const Tensor &lse, int64_t ignore_index, double label_smoothing, double z_loss) {
  const char *op = "cross_entropy_backward";
  const at::ScalarType stat_dtype = check_cross_entropy(op, logits, target, label_smoothing, z_loss);
  check_row_vector(op, "grad_loss", grad_loss, logits);
  check_row_vector(op, "lse", lse, logits);
  Tensor grad = at::empty(logits.sizes(), logits.options().memory_format(at::MemoryFormat::Contiguous));
  run_cross_entropy_backward(op, stat_dtype, grad_loss, logits, target, lse, ignore_index, label_smoothing, z_loss,
                             grad, Tensor());
  return grad;
}

// The forward and the backward for a grad_loss known in advance, in one call:
// loss, lse and the gradient, written into a new tensor or (inplace) over the
// logits, which must then be unit-stride along the classes (any row stride).
// On CUDA one launch (on sm_90 a row held in shared memory and read once,
// else read a second time, from L2 where it still is there); on the CPU the
// two kernels one after the other.
std::tuple<Tensor, Tensor, Tensor> cross_entropy_forward_backward(const char *op, const Tensor &grad_loss_in,
                                                                  const Tensor &logits_in, const Tensor &target_in,
                                                                  int64_t ignore_index, double label_smoothing,
                                                                  double z_loss, bool inplace) {
  const at::ScalarType stat_dtype = check_cross_entropy(op, logits_in, target_in, label_smoothing, z_loss);
  check_row_vector(op, "grad_loss", grad_loss_in, logits_in);
  if (inplace) {
    OSS_CHECK(logits_in.size(1) <= 1 || logits_in.stride(1) == 1, Value,
              "%s: logits have strides (%lld, %lld); to be overwritten with the gradient they must have unit stride "
              "along the classes",
              op, LL(logits_in.stride(0)), LL(logits_in.stride(1)));
  }
  Tensor logits = logits_in, target = target_in;
  const Tensor grad_loss = grad_loss_in.to(stat_dtype).contiguous();
  Tensor loss = at::empty({logits.size(0)}, logits.options().dtype(stat_dtype));
  Tensor lse = at::empty({logits.size(0)}, logits.options().dtype(at::kDouble));
  Tensor grad = inplace ? logits_in
                        : at::empty(logits.sizes(), logits.options().memory_format(at::MemoryFormat::Contiguous));
  if (logits.size(0) == 0) return {loss, lse, grad};
  oss_cross_entropy_backward_params p;
  p.fwd = cross_entropy_params(logits, target, ignore_index, label_smoothing, z_loss);
  p.fwd.loss = loss.data_ptr();
  p.fwd.lse = lse.data_ptr();
  p.grad_loss = grad_loss.data_ptr();
  p.grad_logits = grad.data_ptr();
  p.grad_logits_stride_row = inplace ? p.fwd.logits_stride_row : grad.size(1);
  p.grad_scale = nullptr;
#ifdef OSS_WITH_CUDA
  if (logits.is_cuda()) {
    const c10::cuda::CUDAGuard guard(logits.device());
    check_status(op, oss_cross_entropy_forward_backward_cuda(&p, at::cuda::getCurrentCUDAStream().stream()));
    return {loss, lse, grad};
  }
#endif
  check_status(op, oss_cross_entropy_forward_cpu(&p.fwd, &cpu_exec));
  check_status(op, oss_cross_entropy_backward_cpu(&p, &cpu_exec));
  return {loss, lse, grad};
}

std::tuple<Tensor, Tensor, Tensor> cross_entropy_forward_backward_op(const Tensor &grad_loss, const Tensor &logits,
                                                                     const Tensor &target, int64_t ignore_index,
                                                                     double label_smoothing, double z_loss) {
  return cross_entropy_forward_backward("cross_entropy_forward_backward", grad_loss, logits, target, ignore_index,
                                        label_smoothing, z_loss, false);
}

std::tuple<Tensor, Tensor> cross_entropy_forward_backward_inplace_op(const Tensor &grad_loss, const Tensor &logits,
                                                                     const Tensor &target, int64_t ignore_index,
                                                                     double label_smoothing, double z_loss) {
  auto [loss, lse, grad] = cross_entropy_forward_backward("cross_entropy_forward_backward_", grad_loss, logits,
                                                          target, ignore_index, label_smoothing, z_loss, true);
  return {loss, lse};
}

// The backward of a loss whose gradient the forward + backward op already
// wrote into grad_logits for grad_loss: rewrites it for grad_loss * grad_scale
// (one value), unless grad_scale is exactly 1, where it is left as it is. The
// test runs where grad_scale lives (on the device for CUDA: nothing
// synchronises), so a loss whose upstream gradient is 1, as for
// loss.backward(), costs no second pass over the logits.
void cross_entropy_backward_scaled_op(const Tensor &grad_logits, const Tensor &grad_loss_in,
                                      const Tensor &grad_scale_in, const Tensor &logits_in, const Tensor &target_in,
                                      const Tensor &lse_in, int64_t ignore_index, double label_smoothing,
                                      double z_loss) {
  const char *op = "cross_entropy_backward_scaled_";
  const at::ScalarType stat_dtype = check_cross_entropy(op, logits_in, target_in, label_smoothing, z_loss);
  check_row_vector(op, "grad_loss", grad_loss_in, logits_in);
  check_row_vector(op, "lse", lse_in, logits_in);
  OSS_CHECK(grad_scale_in.device() == logits_in.device() && grad_scale_in.numel() == 1 &&
                is_kernel_float(grad_scale_in.scalar_type()),
            Value, "%s: grad_scale must be one floating-point value on the logits' device, got %s of shape %s on %s",
            op, dtype_name(grad_scale_in.scalar_type()), shape_str(grad_scale_in.sizes()).c_str(),
            device_str(grad_scale_in).c_str());
  OSS_CHECK(grad_logits.device() == logits_in.device() && grad_logits.scalar_type() == logits_in.scalar_type() &&
                grad_logits.sizes() == logits_in.sizes(),
            Value, "%s: grad_logits must have the logits' shape %s, dtype and device, got %s %s on %s", op,
            shape_str(logits_in.sizes()).c_str(), shape_str(grad_logits.sizes()).c_str(),
            dtype_name(grad_logits.scalar_type()), device_str(grad_logits).c_str());
  OSS_CHECK(grad_logits.size(1) <= 1 || grad_logits.stride(1) == 1, Value,
            "%s: grad_logits has strides (%lld, %lld) but must have unit stride along the classes", op,
            LL(grad_logits.stride(0)), LL(grad_logits.stride(1)));
  run_cross_entropy_backward(op, stat_dtype, grad_loss_in, logits_in, target_in, lse_in, ignore_index,
                             label_smoothing, z_loss, grad_logits, grad_scale_in);
}

// ---------------------------------------------------------------------------
// Cross-entropy over class probabilities (oss.h): the forward writes the
// loss, lse and target_sum = sum_j w_j t'_j per row; the backward the
// logits' gradient and, where asked, the target's. Logits and target share
// dtype and shape; weight is converted to the loss's dtype.
// ---------------------------------------------------------------------------

// Checks shared by the forward and the backward; returns the loss dtype.
at::ScalarType check_cross_entropy_probs(const char *op, const Tensor &logits, const Tensor &target,
                                         const std::optional<Tensor> &weight, double label_smoothing,
                                         double z_loss) {
  const at::ScalarType loss_dtype = check_cross_entropy_common(op, logits, target, label_smoothing, z_loss);
  OSS_CHECK(target.scalar_type() == logits.scalar_type(), Type,
            "%s: target has dtype %s but must have the logits' dtype %s (class probabilities)", op,
            dtype_name(target.scalar_type()), dtype_name(logits.scalar_type()));
  OSS_CHECK(target.sizes() == logits.sizes(), Value, "%s: target has shape %s but must have the logits' shape %s",
            op, shape_str(target.sizes()).c_str(), shape_str(logits.sizes()).c_str());
  if (weight.has_value()) {
    const Tensor &w = *weight;
    OSS_CHECK(w.device() == logits.device(), Value, "%s: weight is on %s but logits are on %s", op,
              device_str(w).c_str(), device_str(logits).c_str());
    OSS_CHECK(w.dim() == 1 && w.size(0) == logits.size(1), Value, "%s: weight has shape %s but must be (C,) = (%lld,)",
              op, shape_str(w.sizes()).c_str(), LL(logits.size(1)));
    OSS_CHECK(is_kernel_float(w.scalar_type()), Type, "%s: weight has dtype %s but must be a floating type", op,
              dtype_name(w.scalar_type()));
  }
  return loss_dtype;
}

// The params of checked arguments; logits and target become unit-stride
// along the classes (a copy of other layouts), weight contiguous in the loss's
// dtype (the tensors are kept alive by the caller's references).
oss_cross_entropy_probs_params cross_entropy_probs_params(Tensor &logits, Tensor &target, Tensor &weight,
                                                          at::ScalarType stat_dtype, double label_smoothing,
                                                          double z_loss) {
  if (logits.size(1) > 1 && logits.stride(1) != 1) logits = logits.contiguous();
  if (target.size(1) > 1 && target.stride(1) != 1) target = target.contiguous();
  if (weight.defined()) weight = weight.to(stat_dtype).contiguous();
  oss_cross_entropy_probs_params p;
  p.rows = logits.size(0);
  p.classes = logits.size(1);
  p.logits = logits.data_ptr();
  p.dtype = to_oss_dtype(logits.scalar_type());
  p.logits_stride_row = logits.size(0) > 1 ? logits.stride(0) : logits.size(1);
  p.target = target.data_ptr();
  p.target_stride_row = target.size(0) > 1 ? target.stride(0) : target.size(1);
  p.weight = weight.defined() ? weight.data_ptr() : nullptr;
  p.label_smoothing = label_smoothing;
  p.z_loss = z_loss;
  p.loss = nullptr;
  p.lse = nullptr;
  p.target_sum = nullptr;
  return p;
}

std::tuple<Tensor, Tensor, Tensor> cross_entropy_probs_op(const Tensor &logits_in, const Tensor &target_in,
                                                          const std::optional<Tensor> &weight_in,
                                                          double label_smoothing, double z_loss) {
  const char *op = "cross_entropy_probs";
  const at::ScalarType stat_dtype =
      check_cross_entropy_probs(op, logits_in, target_in, weight_in, label_smoothing, z_loss);
  Tensor logits = logits_in, target = target_in, weight = weight_in.has_value() ? *weight_in : Tensor();
  const int64_t n = logits.size(0);
  Tensor loss = at::empty({n}, logits.options().dtype(stat_dtype));
  Tensor lse = at::empty({n}, logits.options().dtype(at::kDouble));
  Tensor target_sum = at::empty({n}, logits.options().dtype(at::kDouble));
  if (n == 0) return {loss, lse, target_sum};
  oss_cross_entropy_probs_params p =
      cross_entropy_probs_params(logits, target, weight, stat_dtype, label_smoothing, z_loss);
  p.loss = loss.data_ptr();
  p.lse = lse.data_ptr();
  p.target_sum = target_sum.data_ptr();
#ifdef OSS_WITH_CUDA
  if (logits.is_cuda()) {
    const c10::cuda::CUDAGuard guard(logits.device());
    check_status(op, oss_cross_entropy_probs_forward_cuda(&p, at::cuda::getCurrentCUDAStream().stream()));
    return {loss, lse, target_sum};
  }
#endif
  check_status(op, oss_cross_entropy_probs_forward_cpu(&p, &cpu_exec));
  return {loss, lse, target_sum};
}

// grad_target is computed when asked for, else returned empty, shape (0,).
std::tuple<Tensor, Tensor> cross_entropy_probs_backward_op(const Tensor &grad_loss_in, const Tensor &logits_in,
                                                           const Tensor &target_in,
                                                           const std::optional<Tensor> &weight_in,
                                                           const Tensor &lse_in, const Tensor &target_sum_in,
                                                           double label_smoothing, double z_loss, bool grad_target) {
  const char *op = "cross_entropy_probs_backward";
  const at::ScalarType stat_dtype =
      check_cross_entropy_probs(op, logits_in, target_in, weight_in, label_smoothing, z_loss);
  check_row_vector(op, "grad_loss", grad_loss_in, logits_in);
  check_row_vector(op, "lse", lse_in, logits_in);
  check_row_vector(op, "target_sum", target_sum_in, logits_in);
  Tensor logits = logits_in, target = target_in, weight = weight_in.has_value() ? *weight_in : Tensor();
  Tensor grad = at::empty(logits.sizes(), logits.options().memory_format(at::MemoryFormat::Contiguous));
  Tensor grad_t = grad_target ? at::empty(logits.sizes(), logits.options().memory_format(at::MemoryFormat::Contiguous))
                              : at::empty({0}, logits.options());
  if (logits.size(0) == 0) return {grad, grad_t};
  const Tensor grad_loss = grad_loss_in.to(stat_dtype).contiguous();
  const Tensor lse = lse_in.to(at::kDouble).contiguous();
  const Tensor target_sum = target_sum_in.to(at::kDouble).contiguous();
  oss_cross_entropy_probs_backward_params p;
  p.fwd = cross_entropy_probs_params(logits, target, weight, stat_dtype, label_smoothing, z_loss);
  p.fwd.lse = const_cast<void *>(lse.data_ptr());
  p.fwd.target_sum = const_cast<void *>(target_sum.data_ptr());
  p.grad_loss = grad_loss.data_ptr();
  p.grad_logits = grad.data_ptr();
  p.grad_logits_stride_row = grad.size(1);
  p.grad_target = grad_target ? grad_t.data_ptr() : nullptr;
  p.grad_target_stride_row = grad_target ? grad_t.size(1) : 0;
#ifdef OSS_WITH_CUDA
  if (logits.is_cuda()) {
    const c10::cuda::CUDAGuard guard(logits.device());
    check_status(op, oss_cross_entropy_probs_backward_cuda(&p, at::cuda::getCurrentCUDAStream().stream()));
    return {grad, grad_t};
  }
#endif
  check_status(op, oss_cross_entropy_probs_backward_cpu(&p, &cpu_exec));
  return {grad, grad_t};
}

// The mean loss's glue (oss.h): the rows' weights and count from the targets,
// and the loss's total, each one small launch on CUDA.
std::tuple<Tensor, Tensor> cross_entropy_row_weights_op(const Tensor &target_in, int64_t ignore_index,
                                                        at::ScalarType dtype, bool mean) {
  const char *op = "cross_entropy_row_weights";
  check_device_supported(op, target_in, "target");
  OSS_CHECK(target_in.scalar_type() == at::kLong, Type, "%s: target has dtype %s but must be int64 class indices", op,
            dtype_name(target_in.scalar_type()));
  OSS_CHECK(target_in.dim() == 1, Value, "%s: target has shape %s but must be 1-D (N,)", op,
            shape_str(target_in.sizes()).c_str());
  OSS_CHECK(dtype == at::kFloat || dtype == at::kDouble, Type, "%s: dtype is %s but must be float32 or float64", op,
            dtype_name(dtype));
  const Tensor target = target_in.contiguous();
  Tensor weights = at::empty({target.size(0)}, target.options().dtype(dtype));
  Tensor count = at::empty({}, target.options());
#ifdef OSS_WITH_CUDA
  if (target.is_cuda()) {
    const c10::cuda::CUDAGuard guard(target.device());
    check_status(op, oss_cross_entropy_row_weights_cuda(target.data_ptr<int64_t>(), target.size(0), ignore_index,
                                                        to_oss_dtype(dtype), mean, weights.data_ptr(),
                                                        count.data_ptr<int64_t>(),
                                                        at::cuda::getCurrentCUDAStream().stream()));
    return {weights, count};
  }
#endif
  check_status(op, oss_cross_entropy_row_weights_cpu(target.data_ptr<int64_t>(), target.size(0), ignore_index,
                                                     to_oss_dtype(dtype), mean, weights.data_ptr(),
                                                     count.data_ptr<int64_t>()));
  return {weights, count};
}

Tensor cross_entropy_total_op(const Tensor &loss_in, const std::optional<Tensor> &count_in) {
  const char *op = "cross_entropy_total";
  check_device_supported(op, loss_in, "loss");
  OSS_CHECK(loss_in.scalar_type() == at::kFloat || loss_in.scalar_type() == at::kDouble, Type,
            "%s: loss has dtype %s but must be float32 or float64", op, dtype_name(loss_in.scalar_type()));
  OSS_CHECK(loss_in.dim() == 1, Value, "%s: loss has shape %s but must be 1-D (N,)", op,
            shape_str(loss_in.sizes()).c_str());
  const int64_t *count = nullptr;
  if (count_in.has_value()) {
    const Tensor &n = *count_in;
    OSS_CHECK(n.device() == loss_in.device(), Value, "%s: count is on %s but loss is on %s", op, device_str(n).c_str(),
              device_str(loss_in).c_str());
    OSS_CHECK(n.scalar_type() == at::kLong && n.dim() == 0, Type,
              "%s: count has dtype %s and shape %s but must be a 0-dim int64 tensor", op, dtype_name(n.scalar_type()),
              shape_str(n.sizes()).c_str());
    count = n.data_ptr<int64_t>();
  }
  const Tensor loss = loss_in.contiguous();
  Tensor total = at::empty({}, loss.options());
#ifdef OSS_WITH_CUDA
  if (loss.is_cuda()) {
    const c10::cuda::CUDAGuard guard(loss.device());
    check_status(op, oss_cross_entropy_total_cuda(loss.data_ptr(), loss.size(0), to_oss_dtype(loss.scalar_type()),
                                                  count, total.data_ptr(), at::cuda::getCurrentCUDAStream().stream()));
    return total;
  }
#endif
  check_status(op, oss_cross_entropy_total_cpu(loss.data_ptr(), loss.size(0), to_oss_dtype(loss.scalar_type()), count,
                                               total.data_ptr()));
  return total;
}

}  // namespace

// ---------------------------------------------------------------------------
// Attention's autograd (Autograd key). The forward runs the op below autograd
// and saves q, k, v, the mask, out, lse (and the rounding residual of
// attention_with_residual, the ALiBi slopes and the sinks); the backward is
// oss::attention_backward, or oss::attention_backward_with_sinks when the
// sinks need their gradient. lse's gradient, where lse feeds the loss,
// reaches the backward op (grad_lse); the residual carries none, and a
// mask or ALiBi slopes that require grad are refused. The deterministic flag
// of the backward is the call's (None: the global setting at the call).
// As for softmax, a call nothing will differentiate skips the node.
// ---------------------------------------------------------------------------

// The forward op below autograd: (out, lse) or (out, lse, out_residual).
// The arguments after causal_alignment, as the forward ops take them.
#define OSS_ATTENTION_VARIANT_PARAMS                                                                      \
  at::IntArrayRef window_size, double softcap, const std::optional<Tensor> &alibi_slopes,                 \
      const std::optional<Tensor> &sinks, std::optional<bool> deterministic, double dropout_p,              \
      const std::optional<Tensor> &dropout_seed
#define OSS_ATTENTION_VARIANT_ARGS window_size, softcap, alibi_slopes, sinks, deterministic, dropout_p, dropout_seed

template <bool RESIDUAL>
variable_list attention_below_autograd(const Tensor &query, const Tensor &key, const Tensor &value,
                                       const std::optional<Tensor> &attn_mask, bool is_causal,
                                       std::optional<double> scale, bool enable_gqa,
                                       c10::string_view causal_alignment, OSS_ATTENTION_VARIANT_PARAMS) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  if constexpr (RESIDUAL) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("oss::attention_with_residual", "")
                               .typed<decltype(attention_with_residual_op)>();
    auto [out, lse, residual] = op.call(query, key, value, attn_mask, is_causal, scale, enable_gqa, causal_alignment,
                                        OSS_ATTENTION_VARIANT_ARGS);
    return {out, lse, residual};
  } else {
    static const auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("oss::attention", "").typed<decltype(attention_op)>();
    auto [out, lse] = op.call(query, key, value, attn_mask, is_causal, scale, enable_gqa, causal_alignment,
                              OSS_ATTENTION_VARIANT_ARGS);
    return {out, lse};
  }
}

// The forward's inputs are (query, key, value, attn_mask, is_causal, scale,
// enable_gqa, causal_alignment, window_size, softcap, alibi_slopes, sinks,
// deterministic, dropout_p, dropout_seed): gradients for query, key, value and
// sinks (its index).
constexpr int kAttentionInputs = 15, kSinksInput = 11;

template <bool RESIDUAL> struct AttentionFunction : public torch::autograd::Function<AttentionFunction<RESIDUAL>> {
  static variable_list forward(AutogradContext *ctx, const Tensor &query, const Tensor &key, const Tensor &value,
                               const std::optional<Tensor> &attn_mask, bool is_causal, std::optional<double> scale,
                               bool enable_gqa, c10::string_view causal_alignment, OSS_ATTENTION_VARIANT_PARAMS) {
    OSS_CHECK(!(attn_mask.has_value() && attn_mask->defined() && attn_mask->requires_grad()), NotImplemented,
              "torch_oss.attention: attn_mask requires grad, but gradients with respect to the mask are not "
              "supported; pass attn_mask.detach()");
    OSS_CHECK(!(given(alibi_slopes) && alibi_slopes->requires_grad()), NotImplemented,
              "torch_oss.attention: alibi_slopes requires grad, but gradients with respect to the ALiBi slopes are "
              "not supported; pass alibi_slopes.detach()");
    variable_list outs = attention_below_autograd<RESIDUAL>(query, key, value, attn_mask, is_causal, scale,
                                                            enable_gqa, causal_alignment, OSS_ATTENTION_VARIANT_ARGS);
    /* the residual exists for float16/bfloat16 only (else it is empty) */
    const bool half = query.scalar_type() == at::kHalf || query.scalar_type() == at::kBFloat16;
    const Tensor residual = RESIDUAL && half ? outs[2] : Tensor();
    if (RESIDUAL) ctx->mark_non_differentiable({outs[2]});
    // no zero tensors for the gradients of outputs the loss does not use
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({query, key, value, attn_mask.value_or(Tensor()), outs[0], outs[1], residual,
                            alibi_slopes.value_or(Tensor()), sinks.value_or(Tensor()),
                            dropout_p > 0 ? dropout_seed.value_or(Tensor()) : Tensor()});
    ctx->saved_data["is_causal"] = is_causal;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["enable_gqa"] = enable_gqa;
    ctx->saved_data["causal_alignment"] = std::string(causal_alignment);
    ctx->saved_data["deterministic"] = deterministic.value_or(at::globalContext().deterministicAlgorithms());
    ctx->saved_data["window_size"] = window_size.vec();
    ctx->saved_data["softcap"] = softcap;
    ctx->saved_data["dropout_p"] = dropout_p;
    return outs;
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("oss::attention_backward", "")
                               .typed<decltype(attention_backward_op)>();
    static const auto op_with_sinks = c10::Dispatcher::singleton()
                                          .findSchemaOrThrow("oss::attention_backward_with_sinks", "")
                                          .typed<decltype(attention_backward_with_sinks_op)>();
    variable_list none(kAttentionInputs);
    // out's and lse's gradients both zero: so are the inputs'
    if (!grads[0].defined() && !grads[1].defined()) return none;
    const variable_list saved = ctx->get_saved_variables();
    const Tensor grad_out = grads[0].defined() ? grads[0] : at::zeros_like(saved[4]);
    const Tensor &mask = saved[3], &residual = saved[6], &alibi = saved[7], &sinks = saved[8], &seed = saved[9];
    // needs_input_grad counts the defined tensor inputs only: q, k, v, [mask], [alibi], sinks
    const bool want_dsinks = sinks.defined() && ctx->needs_input_grad(3 + mask.defined() + alibi.defined());
    if (!ctx->needs_input_grad(0) && !ctx->needs_input_grad(1) && !ctx->needs_input_grad(2) && !want_dsinks)
      return none;
    auto opt = [](const Tensor &t) { return t.defined() ? std::optional<Tensor>(t) : std::nullopt; };
    const std::vector<int64_t> window_size = ctx->saved_data["window_size"].toIntVector();
    const double softcap = ctx->saved_data["softcap"].toDouble();
    const bool is_causal = ctx->saved_data["is_causal"].toBool(), enable_gqa = ctx->saved_data["enable_gqa"].toBool();
    const std::optional<double> scale = ctx->saved_data["scale"].toOptional<double>();
    const std::string alignment = ctx->saved_data["causal_alignment"].toStringRef();
    const bool deterministic = ctx->saved_data["deterministic"].toBool();
    const double dropout_p = ctx->saved_data["dropout_p"].toDouble();  // the same seed drops the same weights
    if (want_dsinks) {
      auto [dq, dk, dv, dsinks] =
          op_with_sinks.call(grad_out, saved[0], saved[1], saved[2], saved[4], saved[5], opt(mask), is_causal, scale,
                             enable_gqa, alignment, deterministic, opt(residual), window_size, softcap, opt(alibi),
                             sinks, dropout_p, opt(seed), opt(grads[1]));
      none[0] = dq;
      none[1] = dk;
      none[2] = dv;
      none[kSinksInput] = dsinks;
      return none;
    }
    auto [dq, dk, dv] = op.call(grad_out, saved[0], saved[1], saved[2], saved[4], saved[5], opt(mask), is_causal,
                                scale, enable_gqa, alignment, deterministic, opt(residual), window_size, softcap,
                                opt(alibi), opt(sinks), false, dropout_p, opt(seed), opt(grads[1]));
    none[0] = dq;
    none[1] = dk;
    none[2] = dv;
    return none;
  }
};

// oss::attention_backward's Autograd kernel. When a graph is to be built
// through the backward (autograd.grad or backward with create_graph=True, or
// the op called with inputs that require grad), the gradients are
// recomputed by attention_backward_differentiable below, whose ATen ops
// autograd differentiates again; otherwise the kernel runs. Dropout, ring
// attention's partial blocks (keys_subset) and forward-mode AD through the
// backward raise NotImplementedError instead of answering without their share.
bool backward_builds_graph(const Tensor &grad_out, const Tensor &query, const Tensor &key, const Tensor &value,
                           const Tensor &out, const Tensor &lse, const std::optional<Tensor> &attn_mask,
                           const std::optional<Tensor> &out_residual, const std::optional<Tensor> &sinks,
                           const std::optional<Tensor> &grad_lse, double dropout_p, bool keys_subset) {
  const Tensor opt_tensors[4] = {attn_mask.value_or(Tensor()), out_residual.value_or(Tensor()),
                                 sinks.value_or(Tensor()), grad_lse.value_or(Tensor())};
  bool any = false, forward_ad = false;
  for (const Tensor *t : {&grad_out, &query, &key, &value, &out, &lse, &opt_tensors[0], &opt_tensors[1],
                          &opt_tensors[2], &opt_tensors[3]}) {
    any = any || will_differentiate(*t);
    forward_ad = forward_ad || (t->defined() && t->_fw_grad(/*level=*/0).defined());
  }
  if (!any) return false;
  const char *what = forward_ad        ? "forward-mode AD (a tangent) through attention's backward"
                     : dropout_p > 0.0 ? "with dropout_p > 0"
                     : keys_subset     ? "of a block of a larger key set (keys_subset)"
                                       : nullptr;
  OSS_CHECK(what == nullptr, NotImplemented,
            "torch_oss.attention: double backward is not supported %s: the gradient of attention's backward (a "
            "second derivative, as autograd.grad(..., create_graph=True) or backward(create_graph=True) would "
            "build) is not implemented there. Compute the first gradient without create_graph=True",
            what);
  return true;
}

// Attention's forward as ATen ops, differentiable by autograd in either mode
// and under torch.func transforms: out and lse (in float32 for 16-bit
// inputs, else in their dtype) of q, k, v and sinks, the variants applied in
// oss.h's order (scores, softcap, ALiBi, mask, window, causal rule, the
// softmax with the sink's column). The N x N scores exist in full, as in
// PyTorch's math attention. A row that sees no key (and has no sink) gets
// P = 0 and lse -inf, with derivatives that stay finite at any order: the
// softmax's shift (each row's largest logit) is a constant of the graph and
// such a row's denominator is 1. The sinks take their float32 value, as in
// the kernels (oss.h), with the identity as its derivative.
std::pair<Tensor, Tensor> attention_forward_aten(const Tensor &q, const Tensor &k, const Tensor &v,
                                                 const std::optional<Tensor> &attn_mask, bool is_causal,
                                                 std::optional<double> scale, c10::string_view causal_alignment,
                                                 at::IntArrayRef window_size, double softcap,
                                                 const std::optional<Tensor> &alibi_slopes, const Tensor &sink) {
  const at::ScalarType compute = is_half(q.scalar_type()) ? at::kFloat : q.scalar_type();
  const int64_t B = q.size(0), Hq = q.size(1), Lq = q.size(2), Hkv = k.size(1), Lk = k.size(2);
  Tensor kc = k.to(compute), vc = v.to(compute);
  if (Hkv != Hq && Hkv > 0) {  // query head h reads kv head h / (Hq / Hkv)
    kc = kc.repeat_interleave(Hq / Hkv, 1);
    vc = vc.repeat_interleave(Hq / Hkv, 1);
  }
  const double sc = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  Tensor s = at::matmul(q.to(compute), kc.transpose(-2, -1)) * sc;
  if (softcap > 0.0) s = at::tanh(s / softcap) * softcap;
  // d = i + off - j, the distance from the diagonal the alignment picks
  const auto index = at::TensorOptions().dtype(at::kLong).device(q.device());
  const int64_t off = causal_alignment == "bottom_right" ? Lk - Lq : 0;
  const Tensor d = (at::arange(Lq, index) + off).unsqueeze(1) - at::arange(Lk, index).unsqueeze(0);
  if (alibi_slopes.has_value() && alibi_slopes->defined()) {
    const Tensor slopes = alibi_slopes->detach().to(compute).reshape({alibi_slopes->dim() == 2 ? B : 1, Hq, 1, 1});
    s = s - slopes * d.abs().to(compute);
  }
  if (attn_mask.has_value() && attn_mask->defined()) {
    const Tensor &m = *attn_mask;
    s = m.scalar_type() == at::kBool ? s.masked_fill(m.logical_not(), -INFINITY) : s + m.detach().to(compute);
  }
  Tensor hidden = at::zeros({Lq, Lk}, index.dtype(at::kBool));
  if (window_size.size() == 2 && window_size[0] >= 0) hidden = hidden.logical_or(d > window_size[0]);
  if (window_size.size() == 2 && window_size[1] >= 0) hidden = hidden.logical_or(d.neg() > window_size[1]);
  if (is_causal) hidden = hidden.logical_or(d < 0);
  s = s.masked_fill(hidden, -INFINITY);
  const Tensor sink_logit =
      sink.defined() ? (sink.to(compute) + (sink.detach().to(at::kFloat).to(compute) - sink.detach().to(compute)))
                           .reshape({1, Hq, 1, 1})
                     : Tensor();
  Tensor shift = Lk > 0 ? std::get<0>(s.detach().max(-1, /*keepdim=*/true)) : at::zeros({B, Hq, Lq, 1}, s.options());
  if (sink_logit.defined()) shift = at::maximum(shift, sink_logit.detach());
  shift = at::where(at::isfinite(shift), shift, at::zeros_like(shift));
  const Tensor e = at::exp(s - shift);
  Tensor l = e.sum(-1, /*keepdim=*/true);
  if (sink_logit.defined()) l = l + at::exp(sink_logit - shift);
  const Tensor seen = l > 0;
  const Tensor l_safe = at::where(seen, l, at::ones_like(l));
  return {at::matmul(e / l_safe, vc),
          at::where(seen, shift + at::log(l_safe), at::full_like(l, -INFINITY)).squeeze(-1)};
}

// The gradients of attention (dq, dk, dv and, with sinks, d sinks) as ATen
// ops that autograd can differentiate again: attention_forward_aten's
// vector-Jacobian product taken by autograd with create_graph, seeded by
// grad_out and grad_lse. out and lse are not read: the recomputed gradients
// carry all of their dependence on q, k, v and sinks, so the share that
// would flow through the saved out and lse is zero.
std::vector<Tensor> attention_backward_differentiable(
    const Tensor &grad_out, const Tensor &query, const Tensor &key, const Tensor &value,
    const std::optional<Tensor> &attn_mask, bool is_causal, std::optional<double> scale,
    c10::string_view causal_alignment, at::IntArrayRef window_size, double softcap,
    const std::optional<Tensor> &alibi_slopes, const std::optional<Tensor> &sinks,
    const std::optional<Tensor> &grad_lse) {
  at::AutoGradMode grad_mode(true);
  // autograd.grad needs inputs that require grad: those that do not (their
  // gradient is not wanted) get a leaf of their own
  auto differentiable = [](const Tensor &t) { return t.requires_grad() ? t : t.detach().requires_grad_(true); };
  std::vector<Tensor> inputs{differentiable(query), differentiable(key), differentiable(value)};
  if (sinks.has_value() && sinks->defined()) inputs.push_back(differentiable(*sinks));
  auto [out, lse] = attention_forward_aten(inputs[0], inputs[1], inputs[2], attn_mask, is_causal, scale,
                                           causal_alignment, window_size, softcap, alibi_slopes,
                                           inputs.size() > 3 ? inputs[3] : Tensor());
  std::vector<Tensor> outputs{out}, seeds{grad_out.to(out.scalar_type())};
  if (grad_lse.has_value() && grad_lse->defined()) {
    outputs.push_back(lse);
    seeds.push_back(grad_lse->to(lse.scalar_type()));
  }
  std::vector<Tensor> grads = torch::autograd::grad(outputs, inputs, seeds, /*retain_graph=*/true,
                                                    /*create_graph=*/true, /*allow_unused=*/true);
  for (size_t i = 0; i < grads.size(); i++)
    grads[i] = grads[i].defined() ? grads[i].to(inputs[i].scalar_type()) : at::zeros_like(inputs[i]);
  return grads;
}

// The graph branch of both backward ops' autograd kernels: the op's checks,
// then attention_backward_differentiable's gradients (d sinks last, with sinks).
std::vector<Tensor> attention_backward_graph(const char *op, const Tensor &grad_out, const Tensor &query,
                                             const Tensor &key, const Tensor &value, const Tensor &out,
                                             const Tensor &lse, const std::optional<Tensor> &attn_mask, bool is_causal,
                                             std::optional<double> scale, bool enable_gqa,
                                             c10::string_view causal_alignment,
                                             const std::optional<Tensor> &out_residual,
                                             const AttentionVariants &variants,
                                             const std::optional<Tensor> &grad_lse) {
  check_attention_backward(op, grad_out, query, key, value, out, lse, attn_mask, is_causal, scale, enable_gqa,
                           causal_alignment, out_residual, variants, grad_lse);
  return attention_backward_differentiable(grad_out, query, key, value, attn_mask, is_causal, scale,
                                           causal_alignment, variants.window_size, variants.softcap,
                                           variants.alibi_slopes, variants.sinks, grad_lse);
}

std::tuple<Tensor, Tensor, Tensor> attention_backward_op_autograd(
    const Tensor &grad_out, const Tensor &query, const Tensor &key, const Tensor &value, const Tensor &out,
    const Tensor &lse, const std::optional<Tensor> &attn_mask, bool is_causal, std::optional<double> scale,
    bool enable_gqa, c10::string_view causal_alignment, bool deterministic, const std::optional<Tensor> &out_residual,
    at::IntArrayRef window_size, double softcap, const std::optional<Tensor> &alibi_slopes,
    const std::optional<Tensor> &sinks, bool keys_subset, double dropout_p, const std::optional<Tensor> &dropout_seed,
    const std::optional<Tensor> &grad_lse) {
  if (backward_builds_graph(grad_out, query, key, value, out, lse, attn_mask, out_residual, sinks, grad_lse,
                            dropout_p, keys_subset)) {
    const std::vector<Tensor> g = attention_backward_graph(
        "attention_backward", grad_out, query, key, value, out, lse, attn_mask, is_causal, scale, enable_gqa,
        causal_alignment, out_residual,
        AttentionVariants{window_size, softcap, alibi_slopes, sinks, dropout_p, &dropout_seed}, grad_lse);
    return {g[0], g[1], g[2]};
  }
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("oss::attention_backward", "")
                             .typed<decltype(attention_backward_op)>();
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(grad_out, query, key, value, out, lse, attn_mask, is_causal, scale, enable_gqa, causal_alignment,
                 deterministic, out_residual, window_size, softcap, alibi_slopes, sinks, keys_subset, dropout_p,
                 dropout_seed, grad_lse);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> attention_backward_with_sinks_op_autograd(
    const Tensor &grad_out, const Tensor &query, const Tensor &key, const Tensor &value, const Tensor &out,
    const Tensor &lse, const std::optional<Tensor> &attn_mask, bool is_causal, std::optional<double> scale,
    bool enable_gqa, c10::string_view causal_alignment, bool deterministic, const std::optional<Tensor> &out_residual,
    at::IntArrayRef window_size, double softcap, const std::optional<Tensor> &alibi_slopes, const Tensor &sinks,
    double dropout_p, const std::optional<Tensor> &dropout_seed, const std::optional<Tensor> &grad_lse) {
  const std::optional<Tensor> sinks_opt(sinks);
  if (backward_builds_graph(grad_out, query, key, value, out, lse, attn_mask, out_residual, sinks_opt, grad_lse,
                            dropout_p, false)) {
    const std::vector<Tensor> g = attention_backward_graph(
        "attention_backward_with_sinks", grad_out, query, key, value, out, lse, attn_mask, is_causal, scale,
        enable_gqa, causal_alignment, out_residual,
        AttentionVariants{window_size, softcap, alibi_slopes, sinks_opt, dropout_p, &dropout_seed}, grad_lse);
    return {g[0], g[1], g[2], g[3]};
  }
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("oss::attention_backward_with_sinks", "")
                             .typed<decltype(attention_backward_with_sinks_op)>();
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(grad_out, query, key, value, out, lse, attn_mask, is_causal, scale, enable_gqa, causal_alignment,
                 deterministic, out_residual, window_size, softcap, alibi_slopes, sinks, dropout_p, dropout_seed,
                 grad_lse);
}

template <bool RESIDUAL>
variable_list attention_autograd(const Tensor &query, const Tensor &key, const Tensor &value,
                                 const std::optional<Tensor> &attn_mask, bool is_causal, std::optional<double> scale,
                                 bool enable_gqa, c10::string_view causal_alignment, OSS_ATTENTION_VARIANT_PARAMS) {
  const Tensor none;
  if (needs_aten_forward({&query, &key, &value, attn_mask ? &*attn_mask : &none, sinks ? &*sinks : &none})) {
    OSS_CHECK(dropout_p == 0.0, NotImplemented,
              "torch_oss.attention: dropout_p > 0 is not supported under forward-mode AD or torch.func "
              "transforms, which run attention as ATen ops (the dropout mask lives in the kernels' random streams)");
    // the kernel checks the arguments and gives the results' dtypes; the
    // values come from the ATen ops, which carry the derivatives (the
    // residual is then zero: out is not rounded from the kernel's)
    variable_list kernel = attention_below_autograd<RESIDUAL>(query, key, value, attn_mask, is_causal, scale,
                                                              enable_gqa, causal_alignment, OSS_ATTENTION_VARIANT_ARGS);
    auto [out, lse] = attention_forward_aten(query, key, value, attn_mask, is_causal, scale, causal_alignment,
                                             window_size, softcap, alibi_slopes, sinks.value_or(Tensor()));
    variable_list outs{out.to(kernel[0].scalar_type()), lse.to(kernel[1].scalar_type())};
    if (RESIDUAL) outs.push_back(at::zeros_like(kernel[2]));
    return outs;
  }
  const bool any = will_differentiate(query) || will_differentiate(key) || will_differentiate(value) ||
                   (attn_mask.has_value() && will_differentiate(*attn_mask)) ||
                   (alibi_slopes.has_value() && will_differentiate(*alibi_slopes)) ||
                   (sinks.has_value() && will_differentiate(*sinks));
  return any ? AttentionFunction<RESIDUAL>::apply(query, key, value, attn_mask, is_causal, scale, enable_gqa,
                                                  causal_alignment, OSS_ATTENTION_VARIANT_ARGS)
             : attention_below_autograd<RESIDUAL>(query, key, value, attn_mask, is_causal, scale, enable_gqa,
                                                  causal_alignment, OSS_ATTENTION_VARIANT_ARGS);
}

std::tuple<Tensor, Tensor> attention_op_autograd(const Tensor &query, const Tensor &key, const Tensor &value,
                                                 const std::optional<Tensor> &attn_mask, bool is_causal,
                                                 std::optional<double> scale, bool enable_gqa,
                                                 c10::string_view causal_alignment, OSS_ATTENTION_VARIANT_PARAMS) {
  variable_list outs = attention_autograd<false>(query, key, value, attn_mask, is_causal, scale, enable_gqa,
                                                 causal_alignment, OSS_ATTENTION_VARIANT_ARGS);
  return {outs[0], outs[1]};
}

std::tuple<Tensor, Tensor, Tensor> attention_with_residual_op_autograd(
    const Tensor &query, const Tensor &key, const Tensor &value, const std::optional<Tensor> &attn_mask,
    bool is_causal, std::optional<double> scale, bool enable_gqa, c10::string_view causal_alignment,
    OSS_ATTENTION_VARIANT_PARAMS) {
  variable_list outs = attention_autograd<true>(query, key, value, attn_mask, is_causal, scale, enable_gqa,
                                                causal_alignment, OSS_ATTENTION_VARIANT_ARGS);
  return {outs[0], outs[1], outs[2]};
}

// The KV-cache op has no backward: it refuses inputs that would need one
// (instead of PyTorch's warning and outputs cut from the graph), and marks
// the caches it writes as modified (their version counters) for autograd's
// saved-tensor checks.
std::tuple<Tensor, Tensor> attention_with_kvcache_autograd(const Tensor &q, const Tensor &k_cache,
                                                           const Tensor &v_cache, const std::optional<Tensor> &k_new,
                                                           const std::optional<Tensor> &v_new,
                                                           const std::optional<Tensor> &cache_seqlens,
                                                           const std::optional<Tensor> &block_table,
                                                           std::optional<double> softmax_scale, bool causal,
                                                           at::IntArrayRef window_size, double softcap,
                                                           const std::optional<Tensor> &alibi_slopes,
                                                           const std::optional<Tensor> &sinks) {
  const bool needs_grad = at::GradMode::is_enabled() &&
                          (q.requires_grad() || k_cache.requires_grad() || v_cache.requires_grad() ||
                           (k_new && k_new->defined() && k_new->requires_grad()) ||
                           (v_new && v_new->defined() && v_new->requires_grad()));
  OSS_CHECK(!needs_grad, Runtime,
            "attention_with_kvcache: an input requires grad, but this op is for inference and has no backward; call "
            "it under torch.no_grad() or use torch_oss.attention for training");
  std::tuple<Tensor, Tensor> result;
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("oss::attention_with_kvcache", "")
                               .typed<decltype(attention_with_kvcache_op)>();
    result = op.call(q, k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, softmax_scale, causal,
                     window_size, softcap, alibi_slopes, sinks);
  }
  if (k_new && k_new->defined())
    for (const Tensor *cache : {&k_cache, &v_cache})
      if (!cache->is_inference()) cache->unsafeGetTensorImpl()->bump_version();
  return result;
}

// ---------------------------------------------------------------------------
// The Autograd kernels of cross_entropy_forward_backward(_) and
// cross_entropy_backward_scaled_. These ops compute a gradient themselves and
// are not differentiable (differentiate
// oss::cross_entropy, whose backward is oss::cross_entropy_backward): on
// inputs autograd would track they raise, rather than return results that
// silently carry no gradient. The in-place one bumps the logits' version, so
// a graph that saved them for a backward sees that they were overwritten.
// ---------------------------------------------------------------------------

void refuse_differentiation(const char *op, const Tensor &grad_loss, const Tensor &logits) {
  OSS_CHECK(!will_differentiate(grad_loss) && !will_differentiate(logits), NotImplemented,
            "%s computes the logits' gradient itself and is not differentiable (grad_loss or logits requires "
            "grad); differentiate torch.ops.oss.cross_entropy instead, or call it on detached tensors",
            op);
}

std::tuple<Tensor, Tensor, Tensor> cross_entropy_forward_backward_autograd(const Tensor &grad_loss,
                                                                           const Tensor &logits, const Tensor &target,
                                                                           int64_t ignore_index,
                                                                           double label_smoothing, double z_loss) {
  refuse_differentiation("cross_entropy_forward_backward", grad_loss, logits);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("oss::cross_entropy_forward_backward", "")
                             .typed<decltype(cross_entropy_forward_backward_op)>();
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(grad_loss, logits, target, ignore_index, label_smoothing, z_loss);
}

std::tuple<Tensor, Tensor> cross_entropy_forward_backward_inplace_autograd(const Tensor &grad_loss,
                                                                           const Tensor &logits, const Tensor &target,
                                                                           int64_t ignore_index,
                                                                           double label_smoothing, double z_loss) {
  refuse_differentiation("cross_entropy_forward_backward_", grad_loss, logits);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("oss::cross_entropy_forward_backward_", "")
                             .typed<decltype(cross_entropy_forward_backward_inplace_op)>();
  std::tuple<Tensor, Tensor> out;
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    out = op.call(grad_loss, logits, target, ignore_index, label_smoothing, z_loss);
  }
  logits.unsafeGetTensorImpl()->bump_version();
  return out;
}

void cross_entropy_backward_scaled_autograd(const Tensor &grad_logits, const Tensor &grad_loss,
                                            const Tensor &grad_scale, const Tensor &logits, const Tensor &target,
                                            const Tensor &lse, int64_t ignore_index, double label_smoothing,
                                            double z_loss) {
  OSS_CHECK(!will_differentiate(grad_loss) && !will_differentiate(grad_scale) && !will_differentiate(logits) &&
                !will_differentiate(grad_logits),
            NotImplemented,
            "cross_entropy_backward_scaled_ is not differentiable (an argument requires grad); differentiate "
            "torch.ops.oss.cross_entropy_backward instead, or call it on detached tensors");
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("oss::cross_entropy_backward_scaled_", "")
                             .typed<decltype(cross_entropy_backward_scaled_op)>();
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.call(grad_logits, grad_loss, grad_scale, logits, target, lse, ignore_index, label_smoothing, z_loss);
  }
  grad_logits.unsafeGetTensorImpl()->bump_version();
}

// (its input, int64 targets, is never differentiated: the weights are constants)
std::tuple<Tensor, Tensor> cross_entropy_row_weights_autograd(const Tensor &target, int64_t ignore_index,
                                                              at::ScalarType dtype, bool mean) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("oss::cross_entropy_row_weights", "")
                             .typed<decltype(cross_entropy_row_weights_op)>();
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(target, ignore_index, dtype, mean);
}

Tensor cross_entropy_total_autograd(const Tensor &loss, const std::optional<Tensor> &count) {
  OSS_CHECK(!will_differentiate(loss), NotImplemented,
            "cross_entropy_total is not differentiable (loss requires grad); sum the loss with torch ops instead, or "
            "call it on a detached tensor");
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("oss::cross_entropy_total", "")
                             .typed<decltype(cross_entropy_total_op)>();
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(loss, count);
}

// ---------------------------------------------------------------------------
// Registration
// ---------------------------------------------------------------------------

TORCH_LIBRARY(oss, m) {
  m.def("softmax(Tensor self, int dim, ScalarType? dtype=None) -> Tensor");
  m.def("softmax_backward(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype) -> Tensor");
  m.def("log_softmax(Tensor self, int dim, ScalarType? dtype=None) -> Tensor");
  m.def("log_softmax_backward(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype) -> Tensor");
  // The score variants (window_size, softcap, alibi_slopes, sinks; oss.h) come
  // last with defaults that turn them off, so calls without them keep working.
  m.def(
      "attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, bool is_causal=False, "
      "float? scale=None, bool enable_gqa=False, str causal_alignment=\"top_left\", "
      "int[2] window_size=[-1, -1], float softcap=0.0, Tensor? alibi_slopes=None, Tensor? sinks=None, "
      "bool? deterministic=None, float dropout_p=0.0, Tensor? dropout_seed=None) -> (Tensor out, Tensor lse)");
  m.def(
      "attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out, Tensor lse, "
      "Tensor? attn_mask, bool is_causal, float? scale, bool enable_gqa, str causal_alignment, "
      "bool deterministic, Tensor? out_residual=None, int[2] window_size=[-1, -1], float softcap=0.0, "
      "Tensor? alibi_slopes=None, Tensor? sinks=None, bool keys_subset=False, float dropout_p=0.0, "
      "Tensor? dropout_seed=None, Tensor? grad_lse=None) -> (Tensor grad_query, Tensor grad_key, Tensor grad_value)");
  m.def(
      "attention_backward_with_sinks(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out, "
      "Tensor lse, Tensor? attn_mask, bool is_causal, float? scale, bool enable_gqa, str causal_alignment, "
      "bool deterministic, Tensor? out_residual, int[2] window_size, float softcap, Tensor? alibi_slopes, "
      "Tensor sinks, float dropout_p=0.0, Tensor? dropout_seed=None, Tensor? grad_lse=None) -> (Tensor grad_query, "
      "Tensor grad_key, Tensor grad_value, Tensor grad_sinks)");
  m.def(
      "attention_with_residual(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
      "bool is_causal=False, float? scale=None, bool enable_gqa=False, str causal_alignment=\"top_left\", "
      "int[2] window_size=[-1, -1], float softcap=0.0, Tensor? alibi_slopes=None, Tensor? sinks=None, "
      "bool? deterministic=None, float dropout_p=0.0, Tensor? dropout_seed=None) -> (Tensor out, Tensor lse, "
      "Tensor out_residual)");
  m.def(
      "attention_with_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k=None, Tensor? v=None, "
      "Tensor? cache_seqlens=None, Tensor? block_table=None, float? softmax_scale=None, bool causal=True, "
      "int[2] window_size=[-1, -1], float softcap=0.0, Tensor? alibi_slopes=None, Tensor? sinks=None) -> "
      "(Tensor out, Tensor lse)");
  m.def(
      "attention_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
      "int max_seqlen_k, bool is_causal=False, float? scale=None, str causal_alignment=\"bottom_right\", "
      "int[2] window_size=[-1, -1], float softcap=0.0, Tensor? alibi_slopes=None, Tensor? sinks=None, "
      "bool? deterministic=None, float dropout_p=0.0, Tensor? dropout_seed=None, bool return_residual=False) -> "
      "(Tensor out, Tensor lse, Tensor out_residual)");
  m.def(
      "attention_varlen_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
      "Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, bool is_causal, float? scale, "
      "str causal_alignment, bool deterministic, Tensor? out_residual=None, int[2] window_size=[-1, -1], "
      "float softcap=0.0, Tensor? alibi_slopes=None, Tensor? sinks=None, float dropout_p=0.0, "
      "Tensor? dropout_seed=None, Tensor? grad_lse=None) -> (Tensor grad_q, Tensor grad_k, Tensor grad_v, "
      "Tensor grad_sinks)");
  m.def(
      "cross_entropy(Tensor logits, Tensor target, int ignore_index=-100, float label_smoothing=0.0, "
      "float z_loss=0.0) -> (Tensor loss, Tensor lse)");
  m.def(
      "cross_entropy_backward(Tensor grad_loss, Tensor logits, Tensor target, Tensor lse, int ignore_index, "
      "float label_smoothing, float z_loss) -> Tensor");
  m.def(
      "cross_entropy_forward_backward(Tensor grad_loss, Tensor logits, Tensor target, int ignore_index=-100, "
      "float label_smoothing=0.0, float z_loss=0.0) -> (Tensor loss, Tensor lse, Tensor grad_logits)");
  m.def(
      "cross_entropy_forward_backward_(Tensor grad_loss, Tensor(a!) logits, Tensor target, int ignore_index=-100, "
      "float label_smoothing=0.0, float z_loss=0.0) -> (Tensor loss, Tensor lse)");
  m.def(
      "cross_entropy_backward_scaled_(Tensor(a!) grad_logits, Tensor grad_loss, Tensor grad_scale, Tensor logits, "
      "Tensor target, Tensor lse, int ignore_index, float label_smoothing, float z_loss) -> ()");
  m.def(
      "cross_entropy_row_weights(Tensor target, int ignore_index, ScalarType dtype, bool mean) -> (Tensor weights, "
      "Tensor count)");
  m.def("cross_entropy_total(Tensor loss, Tensor? count=None) -> Tensor");
  m.def(
      "cross_entropy_probs(Tensor logits, Tensor target, Tensor? weight=None, float label_smoothing=0.0, "
      "float z_loss=0.0) -> (Tensor loss, Tensor lse, Tensor target_sum)");
  m.def(
      "cross_entropy_probs_backward(Tensor grad_loss, Tensor logits, Tensor target, Tensor? weight, Tensor lse, "
      "Tensor target_sum, float label_smoothing, float z_loss, bool grad_target) -> (Tensor grad_logits, "
      "Tensor grad_target)");
}

// The same entry points serve CPU and CUDA tensors: each op picks the C API
// call (CPU or CUDA) for its inputs' device.
static void impl_device_kernels(torch::Library &m) {
  m.impl("softmax", &softmax_op);
  m.impl("softmax_backward", &softmax_backward_op);
  m.impl("log_softmax", &log_softmax_op);
  m.impl("log_softmax_backward", &log_softmax_backward_op);
  m.impl("attention", &attention_op);
  m.impl("attention_with_residual", &attention_with_residual_op);
  m.impl("attention_backward", &attention_backward_op);
  m.impl("attention_backward_with_sinks", &attention_backward_with_sinks_op);
  m.impl("attention_with_kvcache", &attention_with_kvcache_op);
  m.impl("attention_varlen", &attention_varlen_op);
  m.impl("attention_varlen_backward", &attention_varlen_backward_op);
  m.impl("cross_entropy", &cross_entropy_op);
  m.impl("cross_entropy_backward", &cross_entropy_backward_op);
  m.impl("cross_entropy_forward_backward", &cross_entropy_forward_backward_op);
  m.impl("cross_entropy_forward_backward_", &cross_entropy_forward_backward_inplace_op);
  m.impl("cross_entropy_backward_scaled_", &cross_entropy_backward_scaled_op);
  m.impl("cross_entropy_row_weights", &cross_entropy_row_weights_op);
  m.impl("cross_entropy_total", &cross_entropy_total_op);
  m.impl("cross_entropy_probs", &cross_entropy_probs_op);
  m.impl("cross_entropy_probs_backward", &cross_entropy_probs_backward_op);
}

TORCH_LIBRARY_IMPL(oss, CPU, m) { impl_device_kernels(m); }

TORCH_LIBRARY_IMPL(oss, Autograd, m) {
  m.impl("softmax", &softmax_autograd<false>);
  m.impl("log_softmax", &softmax_autograd<true>);
  m.impl("softmax_backward", &softmax_backward_autograd<false>);
  m.impl("log_softmax_backward", &softmax_backward_autograd<true>);
  m.impl("attention", &attention_op_autograd);
  m.impl("attention_with_residual", &attention_with_residual_op_autograd);
  m.impl("attention_backward", &attention_backward_op_autograd);
  m.impl("attention_backward_with_sinks", &attention_backward_with_sinks_op_autograd);
  m.impl("attention_with_kvcache", &attention_with_kvcache_autograd);
  m.impl("cross_entropy_forward_backward", &cross_entropy_forward_backward_autograd);
  m.impl("cross_entropy_forward_backward_", &cross_entropy_forward_backward_inplace_autograd);
  m.impl("cross_entropy_backward_scaled_", &cross_entropy_backward_scaled_autograd);
  m.impl("cross_entropy_row_weights", &cross_entropy_row_weights_autograd);
  m.impl("cross_entropy_total", &cross_entropy_total_autograd);
}

#ifdef OSS_WITH_CUDA
TORCH_LIBRARY_IMPL(oss, CUDA, m) { impl_device_kernels(m); }
#endif

// ---------------------------------------------------------------------------
// Python module: importing torch_oss._C runs the static registrations above.
// ---------------------------------------------------------------------------

static PyObject *py_build_config(PyObject *, PyObject *) { return PyUnicode_FromString(oss_build_config()); }

// attention_kernels(forward_mma_only, backward_mma_only, dq_centring,
// decode_splits, forward_ctas_per_sm, forward_block_rows): sets each choice of
// oss_attention_cuda_options that is not kKeep and returns the previous six
// (a build without CUDA has none to set: (0, 0, 1, 0, 0, 0)).
static PyObject *py_attention_kernels(PyObject *, PyObject *args) {
  int set[6];
  if (!PyArg_ParseTuple(args, "iiiiii", &set[0], &set[1], &set[2], &set[3], &set[4], &set[5])) return nullptr;
#ifdef OSS_WITH_CUDA
  constexpr int kKeep = -1000;
  oss_attention_cuda_options o = oss_attention_cuda_get_options();
  PyObject *previous = Py_BuildValue("(iiiiii)", o.forward_mma_only, o.backward_mma_only, o.dq_centring,
                                     o.decode_splits, o.forward_ctas_per_sm, o.forward_block_rows);
  if (set[0] != kKeep) o.forward_mma_only = set[0];
  if (set[1] != kKeep) o.backward_mma_only = set[1];
  if (set[2] != kKeep) o.dq_centring = set[2];
  if (set[3] != kKeep) o.decode_splits = set[3];
  if (set[4] != kKeep) o.forward_ctas_per_sm = set[4];
  if (set[5] != kKeep) o.forward_block_rows = set[5];
  oss_attention_cuda_set_options(&o);
  return previous;
#else
  return Py_BuildValue("(iiiiii)", 0, 0, 1, 0, 0, 0);
#endif
}

static PyMethodDef oss_methods[] = {
    {"build_config", py_build_config, METH_NOARGS, "Describe what this build of torch_oss compiled."},
    {"attention_kernels", py_attention_kernels, METH_VARARGS,
     "Set the CUDA attention's kernel choices (forward_mma_only, backward_mma_only, dq_centring, decode_splits, "
     "forward_ctas_per_sm, forward_block_rows; -1000 keeps one); returns the previous ones."},
    {nullptr, nullptr, 0, nullptr},
};

static struct PyModuleDef oss_module = {PyModuleDef_HEAD_INIT, "_C", "torch_oss native ops", -1, oss_methods};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&oss_module); }
