/* clblast.c — the OpenCL plugin's GEMM through CLBlast (https://github.com/CNugteren/CLBlast), when
 * libclblast.so.1 is installed (Debian/Ubuntu: libclblast1). CLBlast's kernels are tuned per device, and on
 * GPUs they are what a register-blocked kernel of our own cannot match. On a CPU device (pocl) it is the other
 * way round: CLBlast 1.5.3 ran 1024^3 float32 at 14 GFLOP/s there, the plugin's kernel at 119 (2 cores,
 * bench/bench_opencl.py), so by default CLBlast serves GPU and accelerator devices only. FL_OPENCL_CLBLAST
 * (read once): 0 never, 1 on every device, unset as said. The plugin keeps its own kernel for what CLBlast
 * cannot take (strides that are not a plain or transposed matrix). The C API used is CLBlast's clblast_c.h, declared here by hand (the
 * plugin builds without CLBlast's headers), with its documented enum values. */
#define _GNU_SOURCE
#include "clblast.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum { kRowMajor = 101, kNo = 111, kYes = 112 };
typedef int (*sgemm_fn)(int, int, int, size_t, size_t, size_t, float, cl_mem, size_t, size_t, cl_mem, size_t, size_t,
                        float, cl_mem, size_t, size_t, cl_command_queue *, cl_event *);
typedef int (*dgemm_fn)(int, int, int, size_t, size_t, size_t, double, cl_mem, size_t, size_t, cl_mem, size_t, size_t,
                        double, cl_mem, size_t, size_t, cl_command_queue *, cl_event *);
typedef int (*sgemm_b_fn)(int, int, int, size_t, size_t, size_t, float, cl_mem, size_t, size_t, size_t, cl_mem, size_t,
                          size_t, size_t, float, cl_mem, size_t, size_t, size_t, size_t, cl_command_queue *, cl_event *);
typedef int (*dgemm_b_fn)(int, int, int, size_t, size_t, size_t, double, cl_mem, size_t, size_t, size_t, cl_mem, size_t,
                          size_t, size_t, double, cl_mem, size_t, size_t, size_t, size_t, cl_command_queue *, cl_event *);

static struct {
    pthread_once_t once;
    sgemm_fn sgemm;
    dgemm_fn dgemm;
    sgemm_b_fn sgemm_b;
    dgemm_b_fn dgemm_b;
    const char *why;
    int forced; /* FL_OPENCL_CLBLAST=1: on CPU devices too */
} lib = {PTHREAD_ONCE_INIT, NULL, NULL, NULL, NULL, "not loaded", 0};

static void load(void) {
    const char *v = getenv("FL_OPENCL_CLBLAST");
    /* the words torch_fl's config check accepts for a boolean (torch_fl/runtime/config.py) */
    if (v && (!strcasecmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") || !strcasecmp(v, "off"))) {
        lib.why = "turned off (FL_OPENCL_CLBLAST=0)";
        return;
    }
    lib.forced = v && (!strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"));
    void *h = dlopen("libclblast.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        lib.why = "not installed (Debian/Ubuntu: apt-get install libclblast1)";
        return;
    }
    lib.sgemm = (sgemm_fn)dlsym(h, "CLBlastSgemm");
    lib.dgemm = (dgemm_fn)dlsym(h, "CLBlastDgemm");
    lib.sgemm_b = (sgemm_b_fn)dlsym(h, "CLBlastSgemmStridedBatched");
    lib.dgemm_b = (dgemm_b_fn)dlsym(h, "CLBlastDgemmStridedBatched");
    if (!lib.sgemm || !lib.dgemm) {
        lib.sgemm = NULL;
        lib.why = "libclblast.so.1 lacks CLBlastSgemm";
        dlclose(h);
        return;
    }
    lib.why = NULL;
}

const char *ocl_clblast_version(const char **why) {
    pthread_once(&lib.once, load);
    if (why) *why = lib.why;
    return lib.sgemm ? "1" : NULL; /* CLBlast's C API has no version call: the soname says 1.x */
}

int ocl_clblast_for(int host_cpu) {
    pthread_once(&lib.once, load);
    return lib.sgemm && (!host_cpu || lib.forced);
}

/* op(X) of a rows x cols matrix with element strides (rs, cs), as CLBlast takes it: row-major (element (i, j)
 * at i * ld + j: not transposed) or column-major (at j * ld + i: transposed). 0 when it is neither (a broadcast
 * or otherwise strided view). A single row or column has a stride that is never used. */
static int layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, int *trans, size_t *ld) {
    if ((cols == 1 || cs == 1) && (rows == 1 || rs >= cols)) {
        *trans = kNo;
        *ld = (size_t)(rows == 1 ? cols : rs);
        return 1;
    }
    if ((rows == 1 || rs == 1) && (cols == 1 || cs >= rows)) {
        *trans = kYes;
        *ld = (size_t)(cols == 1 ? rows : cs);
        return 1;
    }
    return 0;
}

int ocl_clblast_gemm(cl_command_queue q, int double_, int64_t batch, int64_t M, int64_t N, int64_t K, double alpha,
                     cl_mem a, int64_t ao, int64_t ars, int64_t acs, int64_t abs,
                     cl_mem b, int64_t bo, int64_t brs, int64_t bcs, int64_t bbs,
                     cl_mem c, int64_t co, int64_t crs, int64_t cbs, int accum, int *status) {
    pthread_once(&lib.once, load);
    if (!lib.sgemm || M <= 0 || N <= 0 || K <= 0 || batch <= 0) return 1;
    int ta, tb, tc;
    size_t lda, ldb, ldc;
    if (!layout(M, K, ars, acs, &ta, &lda) || !layout(K, N, brs, bcs, &tb, &ldb)) return 1;
    if (!layout(M, N, crs, 1, &tc, &ldc) || tc != kNo || ao < 0 || bo < 0 || co < 0) return 1;
    double beta = accum ? 1.0 : 0.0;
    int st;
    if (batch == 1) {
        st = double_ ? lib.dgemm(kRowMajor, ta, tb, (size_t)M, (size_t)N, (size_t)K, alpha, a, (size_t)ao, lda, b,
                                 (size_t)bo, ldb, beta, c, (size_t)co, ldc, &q, NULL)
                     : lib.sgemm(kRowMajor, ta, tb, (size_t)M, (size_t)N, (size_t)K, (float)alpha, a, (size_t)ao, lda,
                                 b, (size_t)bo, ldb, (float)beta, c, (size_t)co, ldc, &q, NULL);
    } else {
        if (!lib.sgemm_b || !lib.dgemm_b || abs < 0 || bbs < 0 || cbs <= 0) return 1;
        st = double_ ? lib.dgemm_b(kRowMajor, ta, tb, (size_t)M, (size_t)N, (size_t)K, alpha, a, (size_t)ao, lda,
                                   (size_t)abs, b, (size_t)bo, ldb, (size_t)bbs, beta, c, (size_t)co, ldc, (size_t)cbs,
                                   (size_t)batch, &q, NULL)
                     : lib.sgemm_b(kRowMajor, ta, tb, (size_t)M, (size_t)N, (size_t)K, (float)alpha, a, (size_t)ao,
                                   lda, (size_t)abs, b, (size_t)bo, ldb, (size_t)bbs, (float)beta, c, (size_t)co, ldc,
                                   (size_t)cbs, (size_t)batch, &q, NULL);
    }
    if (st == 0) return 0;
    *status = st;
    return -1;
}
