/* The OpenCL plugin: GEMM: mm, bmm, addmm.
 * Shared declarations: ocl.h. */
#include "ocl.h"
#include "clblast.h"

/* ------------------------------------------------------------------ GEMM */
typedef struct { int64_t M, N, K, ao, ars, acs, abs, bo, brs, bbs, co, crs, cbs, accum; real_t alpha; } gemm_t;

/* C[b] (+)= alpha A[b] @ B[b] on buffers, K > 0. A has any strides; C has unit column stride; a B without it
 * is first copied into a contiguous temporary. CLBlast where clblast.c says so, else the plugin's kernel. */
int gemm_mats(dev_t_ *D, fl_stream_t s, int T, int64_t batch, int64_t M, int64_t N, int64_t K, mat_t a, mat_t b,
                     mat_t c, double alpha, int accum) {
    if (!M || !N || !batch) return FL_OK;
    if (N == 1) b.cs = c.cs = 1;
    if (c.cs != 1) return UNSUP; /* the output has unit column stride (every layout the runtime allocates for these ops) */
    if (batch == 1) a.bs = b.bs = c.bs = 0;
    gemm_t g;
    memset(&g, 0, sizeof g);
    g.M = M; g.N = N; g.K = K; g.accum = accum;
    g.ao = a.off; g.ars = a.rs; g.acs = a.cs; g.abs = a.bs;
    g.bo = b.off; g.brs = b.rs; g.bbs = b.bs;
    g.co = c.off; g.crs = c.rs; g.cbs = c.bs;
    if (D->fp64) g.alpha.d = alpha; else g.alpha.f = (float)alpha;
    if ((T == FL_FLOAT32 || T == FL_FLOAT64) && ocl_clblast_for(D->host_cpu)) { /* CLBlast (clblast.c says when) */
        int cst = 0;
        int r = ocl_clblast_gemm(qof(D, s), T == FL_FLOAT64, batch, M, N, K, alpha, a.m, g.ao, g.ars, g.acs, g.abs,
                                 b.m, g.bo, g.brs, b.cs, g.bbs, c.m, g.co, g.crs, g.cbs, accum, &cst);
        if (r == 0) return FL_OK;
        if (r < 0) return fail(FL_ERR_INTERNAL, NAME ": CLBlast's GEMM (%lld x %lld x %lld, batch %lld) failed with "
                               "status %d; FL_OPENCL_CLBLAST=0 uses the plugin's own kernel", (long long)M, (long long)N,
                               (long long)K, (long long)batch, cst);
    }
    int st = FL_OK;
    cl_mem tmp = NULL, bm = b.m;
    if (b.cs != 1) { /* B transposed or strided: make it contiguous first */
        fl_tensor_t src, tb;
        memset(&src, 0, sizeof src);
        src.dtype = T; src.ndim = 3; src.offset = 0;
        src.sizes[0] = batch; src.sizes[1] = K; src.sizes[2] = N;
        src.strides[0] = b.bs; src.strides[1] = b.rs; src.strides[2] = b.cs;
        tb = src;
        contig_strides(&tb);
        dt_t sd = {b.m, b.off}, td = {tmpbuf(D, (size_t)(batch * K * N) * fl_itemsize(T), &st), 0};
        if (!td.m) return st;
        if ((st = copy_view(D, s, &tb, &td, &src, &sd))) { cl.clReleaseMemObject(td.m); return st; }
        tmp = td.m; bm = td.m;
        g.bo = 0; g.brs = N; g.bbs = batch > 1 ? K * N : 0;
    }
    char prog[16];
    snprintf(prog, sizeof prog, "nn:%s", tname(T));
    karg_t ka[4] = {{sizeof(cl_mem), &c.m}, {sizeof(cl_mem), &a.m}, {sizeof(cl_mem), &bm}, KA(g)};
    size_t gs[3] = {(size_t)((N + 63) / 64), (size_t)((M + 63) / 64), (size_t)batch}, ls[3] = {1, 1, 1};
    st = launch(D, s, prog, "gemm", 4, ka, 3, gs, ls);
    if (tmp) cl.clReleaseMemObject(tmp);
    return st;
}

/* C[b] (+)= alpha A[b] @ B[b]; views given as (tensor, batch dim or -1) */
static int gemm_run(dev_t_ *D, fl_stream_t s, int T, int64_t batch, int64_t M, int64_t N, int64_t K, const fl_tensor_t *a,
                    const fl_tensor_t *b, const fl_tensor_t *c, double alpha, int accum) {
    int bd = a->ndim == 3; /* the batch dim is dim 0 for bmm */
    int i0 = bd, i1 = bd + 1;
    dt_t ad, bdd, cd;
    int st;
    if ((st = tres(D, a, &ad)) || (st = tres(D, b, &bdd)) || (st = tres(D, c, &cd))) return st;
    if (!M || !N || !batch) return FL_OK;
    if ((N == 1 ? 1 : c->strides[i1]) != 1) return UNSUP;
    if (K == 0) return accum ? FL_OK : fill_bits(D, s, c, 0);
    mat_t am = {ad.m, ad.off + a->offset, a->strides[i0], a->strides[i1], bd ? a->strides[0] : 0};
    mat_t bm = {bdd.m, bdd.off + b->offset, b->strides[i0], b->strides[i1], bd ? b->strides[0] : 0};
    mat_t cm = {cd.m, cd.off + c->offset, c->strides[i0], 1, bd ? c->strides[0] : 0};
    return gemm_mats(D, s, T, batch, M, N, K, am, bm, cm, alpha, accum);
}
static int mm_check(dev_t_ *D, const fl_tensor_t *a, const fl_tensor_t *b, const fl_tensor_t *o, int nd) {
    if (a->ndim != nd || b->ndim != nd || o->ndim != nd) return UNSUP;
    if (!is_flt(o->dtype) || !dt_ok(D, o->dtype) || a->dtype != o->dtype || b->dtype != o->dtype) return UNSUP;
    int i = nd - 2;
    if (b->sizes[i] != a->sizes[i + 1] || o->sizes[i] != a->sizes[i] || o->sizes[i + 1] != b->sizes[i + 1]) return UNSUP;
    if (nd == 3 && (a->sizes[0] != o->sizes[0] || b->sizes[0] != o->sizes[0])) return UNSUP;
    return FL_OK;
}
int k_mm(KARGS) {
    (void)args; (void)n_args;
    DEV(device);
    if (n_in < 2 || !fl_out_ok(out, n_out)) return UNSUP;
    if (mm_check(D, &in[0], &in[1], &out[0], 2)) return UNSUP;
    return gemm_run(D, stream, out[0].dtype, 1, in[0].sizes[0], in[1].sizes[1], in[0].sizes[1], &in[0], &in[1], &out[0], 1.0, 0);
}
int k_bmm(KARGS) {
    (void)args; (void)n_args;
    DEV(device);
    if (n_in < 2 || !fl_out_ok(out, n_out)) return UNSUP;
    if (mm_check(D, &in[0], &in[1], &out[0], 3)) return UNSUP;
    return gemm_run(D, stream, out[0].dtype, out[0].sizes[0], in[0].sizes[1], in[1].sizes[2], in[0].sizes[2], &in[0], &in[1], &out[0], 1.0, 0);
}
int k_addmm(KARGS) { /* addmm(self, mat1, mat2, beta, alpha) */
    DEV(device);
    const fl_tensor_t *self = fl_arg_tensor(args, n_args, 0, in, n_in), *a = fl_arg_tensor(args, n_args, 1, in, n_in),
                      *b = fl_arg_tensor(args, n_args, 2, in, n_in);
    if (!self || !a || !b || !fl_out_ok(out, n_out) || n_args < 5 || !fl_arg_is_num(&args[3]) || !fl_arg_is_num(&args[4])) return UNSUP;
    const fl_tensor_t *o = &out[0];
    if (mm_check(D, a, b, o, 2) || self->dtype != o->dtype) return UNSUP;
    if ((o->sizes[1] == 1 ? 1 : o->strides[1]) != 1) return UNSUP;
    double beta = fl_arg_num(&args[3]), alpha = fl_arg_num(&args[4]);
    int st;
    fl_tensor_t sv;
    if (fl_bcast(self, 2, o->sizes, &sv)) return UNSUP;
    dt_t sd, odd;
    if ((st = tres(D, &sv, &sd)) || (st = tres(D, o, &odd))) return st;
    if (odd.m && sd.m == odd.m && fl_numel(o)) return UNSUP; /* addmm_ (self is the output): not handled here */
    if (beta != 0) {
        opnd_t ops[2];
        memset(ops, 0, sizeof ops);
        ops[0].v = sv; ops[0].d = sd;
        ops[1].scalar = 1; ops[1].sd = beta; ops[1].si = (int64_t)beta;
        if ((st = ew_run(D, stream, o->dtype, "b_mul", o, 2, ops, 0, 0))) return st;
    }
    return gemm_run(D, stream, o->dtype, 1, a->sizes[0], b->sizes[1], a->sizes[1], a, b, o, alpha, beta != 0);
}
