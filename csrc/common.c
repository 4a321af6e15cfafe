/*
 * common.c - error reporting and build description for the C API (oss.h).
 *
 * The failure sentence lives in thread-local storage so concurrent callers on
 * different threads never see each other's messages.
 */
#include <stdarg.h>
#include <stdio.h>

#include "oss_internal.h"

#ifndef OSS_CUDA_ARCHS
#define OSS_CUDA_ARCHS ""
#endif

static _Thread_local char error_message[1024];

oss_status oss_fail(oss_status status, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(error_message, sizeof error_message, fmt, args);
  va_end(args);
  return status;
}

const char *oss_error_message(void) { return error_message; }

const char *oss_status_name(oss_status status) {
  switch (status) {
  case OSS_OK: return "ok";
  case OSS_ERROR_INVALID_ARGUMENT: return "invalid argument";
  case OSS_ERROR_NOT_SUPPORTED: return "not supported";
  case OSS_ERROR_CUDA: return "CUDA error";
  case OSS_ERROR_OUT_OF_MEMORY: return "out of memory";
  }
  return "unknown status";
}

const char *oss_build_config(void) {
  static _Thread_local char config[512];
#ifdef OSS_WITH_CUDA
  snprintf(config, sizeof config, "cuda=1 archs=%s attention_head_dims=%s attention_hopper_head_dims=%s",
           OSS_CUDA_ARCHS, oss_attention_cuda_head_dims_list(), oss_attention_cuda_hopper_head_dims_list());
#else
  snprintf(config, sizeof config, "cuda=0 archs= attention_head_dims= attention_hopper_head_dims=");
#endif
  return config;
}
