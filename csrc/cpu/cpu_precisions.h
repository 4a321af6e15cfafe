/*
 * cpu_precisions.h - compiles the generic kernel body named by
 * OSS_GENERIC_BODY (a quoted file name, defined by the includer) once per
 * precision the CPU kernels compute in: float, for float32, float16 and
 * bfloat16 data, and double, for float64. For each it defines REAL (the
 * compute type), NATIVE (the dtype stored as REAL), LSE_T (the lse type),
 * FN(name) (name with the precision's suffix), EXP, LOG, LOAD and STORE
 * (cpu_common.h's converting loads and stores). No include guard: a kernel
 * file includes it once per body.
 */

#define REAL float
#define NATIVE OSS_FLOAT32
#define LSE_T float
#define FN(name) name##_f32
#define EXP oss_expf
#define LOG logf
#define LOAD oss_load_f32
#define STORE oss_store_f32
#include OSS_GENERIC_BODY
#undef REAL
#undef NATIVE
#undef LSE_T
#undef FN
#undef EXP
#undef LOG
#undef LOAD
#undef STORE

#define REAL double
#define NATIVE OSS_FLOAT64
#define LSE_T double
#define FN(name) name##_f64
#define EXP exp
#define LOG log
#define LOAD oss_load_f64
#define STORE oss_store_f64
#include OSS_GENERIC_BODY
#undef REAL
#undef NATIVE
#undef LSE_T
#undef FN
#undef EXP
#undef LOG
#undef LOAD
#undef STORE

#undef OSS_GENERIC_BODY
