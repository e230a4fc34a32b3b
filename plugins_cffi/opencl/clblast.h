/* clblast.h — GEMM through CLBlast, the tuned OpenCL BLAS, when it is installed (clblast.c). It is opened at run
 * time like the driver, so the plugin builds and runs without it. */
#ifndef FL_OPENCL_CLBLAST_H
#define FL_OPENCL_CLBLAST_H
#include <stddef.h>
#include <stdint.h>

#include "cl_min.h"

/* Non-NULL when the library is loaded, NULL when it is not installed or turned off (then *why says so). */
const char *ocl_clblast_version(const char **why);
/* Whether GEMMs of a device go to CLBlast: loaded, and the device is no CPU device unless FL_OPENCL_CLBLAST=1. */
int ocl_clblast_for(int host_cpu);

/* C[b] = alpha * op(A[b]) @ op(B[b]) (+ C[b] when accum) for b < batch, row-major C with leading dimension ldc;
 * A is M x K with strides (ars, acs), B is K x N with strides (brs, bcs): either stride 1 (a transposed
 * operand is op = transpose). Offsets and strides are in elements; float32 (double_ 0) or float64 (1).
 * Returns 0 on success, 1 when CLBlast cannot take this call (the caller then runs its own kernel), -1 on an
 * error CLBlast reported (*status holds its code). */
int ocl_clblast_gemm(cl_command_queue q, int double_, int64_t batch, int64_t M, int64_t N, int64_t K, double alpha,
                     cl_mem a, int64_t ao, int64_t ars, int64_t acs, int64_t abs,
                     cl_mem b, int64_t bo, int64_t brs, int64_t bcs, int64_t bbs,
                     cl_mem c, int64_t co, int64_t crs, int64_t cbs, int accum, int *status);
#endif
