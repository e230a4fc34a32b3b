/* Internals shared by the BLAS-backed kernel files (k_linalg.c, k_conv.c, k_norm.c, k_pool.c):
 * the helpers k_linalg.c defines (fl_lin_ prefix, external linkage; the
 * library is built with -fvisibility=hidden, so none leaves the shared
 * object), and the macros of the files that include themselves once per
 * element type. Not part of the ABI. */
#ifndef FL_K_LINALG_H
#define FL_K_LINALG_H

#include <stdlib.h>

#include <omp.h>

#include "fl_host.h"

/* k_linalg.c */
double fl_lin_num(const fl_arg_t *a, double dflt);
void fl_lin_copy(const fl_tensor_t *dst, const fl_tensor_t *src);
void fl_lin_contig_desc(fl_tensor_t *d, const fl_tensor_t *t, void *p);
void *fl_lin_pack(const fl_tensor_t *t, void **owned);
void *fl_lin_out_buf(const fl_tensor_t *t, void **owned);
void fl_lin_unpack(const fl_tensor_t *t, void *owned);
/* The end of a backward kernel with up to three gradient outputs packed by fl_lin_out_buf: on
 * error (st != FL_OK) the packed buffers are dropped, else each is copied into its output. */
int fl_lin_finish_grads(int st, const fl_tensor_t *const g[3], void *packed[3]);
void fl_lin_blas_init(void);
int fl_lin_threads(void);
void *fl_lin_scratch(int slot, size_t bytes);
void fl_lin_scratch_trim(void);
void fl_lin_gemm1(int dtype, int ta, int tb, int64_t M, int64_t N, int64_t K, double alpha,
                  const void *A, int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc);
void fl_lin_gemm(int dtype, int ta, int tb, int64_t M, int64_t N, int64_t K, double alpha,
                 const void *A, int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc);
int fl_lin_via_f32(fl_kernel_fn fn, int write_inputs, FL_KERNEL_ARGS);

/* kernels of k_conv.c and k_norm.c (in k_linalg.c's table) and k_pool.c's 2-D pooling */
int fl_lin_convolution(FL_KERNEL_ARGS);
int fl_lin_convolution_backward(FL_KERNEL_ARGS);
int fl_lin_native_batch_norm(FL_KERNEL_ARGS);
int fl_lin_native_batch_norm_backward(FL_KERNEL_ARGS);
int fl_lin_bn_legit(FL_KERNEL_ARGS);
int fl_lin_bn_legit_no_stats(FL_KERNEL_ARGS);
int fl_lin_bn_legit_no_training(FL_KERNEL_ARGS);
int fl_lin_bn_with_update(FL_KERNEL_ARGS);
int fl_lin_bn_no_update(FL_KERNEL_ARGS);
int fl_lin_batch_norm_backward(FL_KERNEL_ARGS);
int fl_lin_native_layer_norm(FL_KERNEL_ARGS);
int fl_lin_native_layer_norm_backward(FL_KERNEL_ARGS);
int fl_lin_native_group_norm(FL_KERNEL_ARGS);
int fl_lin_native_group_norm_backward(FL_KERNEL_ARGS);
int fl_lin_max_pool2d(FL_KERNEL_ARGS);
int fl_lin_max_pool2d_backward(FL_KERNEL_ARGS);
int fl_lin_avg_pool2d(FL_KERNEL_ARGS);
int fl_lin_avg_pool2d_backward(FL_KERNEL_ARGS);
int fl_lin_adaptive_avg_pool2d(FL_KERNEL_ARGS);
int fl_lin_adaptive_avg_pool2d_backward(FL_KERNEL_ARGS);

/* name(FL_KERNEL_ARGS): fn, with float16/bfloat16 inputs computed on float32 copies (fl_lin_via_f32) */
#define LIN_ANY_FLOAT(name, fn)                                                                          \
    static int name(FL_KERNEL_ARGS) {                                                                    \
        if (n_in >= 1 && (in[0].dtype == FL_FLOAT16 || in[0].dtype == FL_BFLOAT16))                      \
            return fl_lin_via_f32(fn, 0, stream, device, in, n_in, out, n_out, args, n_args);            \
        return fn(stream, device, in, n_in, out, n_out, args, n_args);                                   \
    }

/* the dtypes the BLAS-backed and typed kernels compute in (half types go through fl_lin_via_f32) */
static inline int fl_lin_float_dt(int dt) { return dt == FL_FLOAT32 || dt == FL_FLOAT64; }
/* the size of an OpenMP team and this thread's place in it (per-thread scratch) */
static inline int fl_lin_team_size(void) { return omp_get_max_threads(); }
static inline int fl_lin_thread_id(void) { return omp_get_thread_num(); }

/* Hot loops are compiled for AVX2 and AVX-512 too and picked at load time
 * (the build itself targets baseline x86-64). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LIN_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define LIN_CLONES
#endif

#define LIN_CAT_(a, b) a##b
#define LIN_CAT(a, b) LIN_CAT_(a, b)

#endif
