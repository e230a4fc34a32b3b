/* The OpenCL plugin: convolution and convolution_backward around the GEMM.
 * Shared declarations: ocl.h. */
#include "ocl.h"
#include "clblast.h"

/* ------------------------------------------------------------------ convolution
 * aten::convolution and aten::convolution_backward under the names, argument order and output conventions of
 * the host plugin's kernels (plugins_cffi/host/k_conv.c), which the runtime calls the same way:
 *   convolution(input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups)
 *   convolution_backward(grad_output, input, weight, bias_sizes?, stride, padding, dilation, transposed,
 *                        output_padding, groups, output_mask) -> (grad_input, grad_weight, grad_bias)
 * Served: 2-D and 1-D (as 2-D with one row), plain and transposed, float32 and float64 (where the device has
 * fp64), any stride, padding, dilation, output padding and groups, inputs and outputs of any strides. The rest
 * (3-D, float16) declines before anything is queued, and the runtime uses its next tier (a decomposition into
 * views and bmm). A transposed convolution is, as in k_conv.c, the ordinary one with the roles swapped: its
 * forward is the ordinary input gradient, its input gradient the ordinary forward.
 *
 * All of it is GEMMs over a column buffer in (j, k) layout, j = (sample, output pixel) and k = (channel, tap),
 * one GEMM per group g (Og = O/G output channels, Kg = C/G * KH * KW taps), with dY packed once per chunk as
 * a (j, O) matrix:
 *   forward      Y^T (j, o)  = cols(X) (j, k) @ W_g (o, k)^T      gemm_nt, into a (j, O) temporary, then Y
 *   grad_weight  dW_g (o, k) += dY^T (o, j) @ cols(X) (j, k)      straight into grad_weight, over the chunks
 *   grad_input   cols (j, k)  = dY (j, o) @ W_g (o, k)            then col2im into grad_input
 * Why these layouts: the plugin's gemm vectorizes along C's second index and needs unit stride there in B and C;
 * here that index is an output channel or a tap, never a pixel of one image alone (a late ResNet stage at 64x64
 * input has 2x2 pixels, far below a tile), and j spans the samples of a chunk. The weight is read as it is
 * stored, never transposed: gemm_nt takes it as (o, k) rows (a transposing copy of ResNet-50's late weights
 * cost more than their GEMMs). A 1x1, stride-1, unpadded convolution over images that fill a tile is one GEMM
 * per sample straight from X into Y: Y[n] = W_g @ X[n].
 * Samples go in chunks whose buffers stay within CONV_CHUNK_BYTES (and the device's largest allocation);
 * temporaries are released right after their commands are queued, which OpenCL allows (the queue keeps them
 * until those commands are done). */
#define CONV_CHUNK_BYTES ((int64_t)64 << 20)
#define CONV_DIRECT_PIXELS 64 /* the 1x1 direct path: pixels per image, at least one GEMM tile's columns */
typedef struct { int64_t C, H, W, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw, xs[4], xoff, n0, nb, ks, js; } conv_t;
typedef struct { int64_t I, J, soff, sb, si, sj, doff, db, di, dj; } tcopy_t;
typedef struct { int64_t M, N, K, ao, ars, bo, brs, co, crs, accum; } gnt_t;
typedef struct { int64_t N, C, H, W, O, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw, G; } cgeom_t;

static int conv_list2(const fl_arg_t *a, int spatial, int64_t dflt, int64_t v[2]) {
    if (a->kind == FL_ARG_INT) { v[0] = v[1] = a->i; return 1; }
    if (a->kind != FL_ARG_INT_LIST) return 0;
    if (a->len == 0) { v[0] = v[1] = dflt; return 1; }
    if (a->len == 1) { v[0] = v[1] = a->list[0]; return 1; }
    if (a->len == 2 && spatial == 2) { v[0] = a->list[0]; v[1] = a->list[1]; return 1; }
    return 0;
}
/* t as a 4-D NCHW tensor: a 2-D convolution's itself, a 1-D convolution's (N, C, L) as (N, C, 1, L) */
static void conv_4d(const fl_tensor_t *t, fl_tensor_t *v) {
    *v = *t;
    if (t->ndim != 3) return;
    v->ndim = 4;
    v->sizes[3] = t->sizes[2]; v->strides[3] = t->strides[2];
    v->sizes[2] = 1; v->strides[2] = t->strides[2] * t->sizes[2];
}
/* The geometry of the ordinary convolution from its input x (N, C, H, W) to its output y (N, O, OH, OW) with the
 * weight (O, C/G, KH, KW), all 4-D (conv_4d), and the stride, padding and dilation arguments at
 * a_stride..a_stride+2 (one value each for a 1-D convolution: spatial 1); checked as k_conv.c checks it. A
 * transposed convolution runs from y to x: its output_padding may leave x one step longer than y needs. */
static int conv_geom(cgeom_t *g, const fl_tensor_t *x, const fl_tensor_t *y, const fl_tensor_t *w, const fl_arg_t *args,
                     int a_stride, const fl_arg_t *groups, int spatial, int transposed) {
    int64_t st[2], pd[2], dl[2];
    if (!conv_list2(&args[a_stride], spatial, 1, st) || !conv_list2(&args[a_stride + 1], spatial, 0, pd) ||
        !conv_list2(&args[a_stride + 2], spatial, 1, dl) || groups->kind != FL_ARG_INT)
        return UNSUP;
    if (spatial == 1) { st[0] = 1; pd[0] = 0; dl[0] = 1; } /* the one row */
    *g = (cgeom_t){x->sizes[0], x->sizes[1], x->sizes[2], x->sizes[3], y->sizes[1], y->sizes[2], y->sizes[3],
                   w->sizes[2], w->sizes[3], st[0], st[1], pd[0], pd[1], dl[0], dl[1], groups->i};
    if (y->sizes[0] != g->N) return fail(FL_ERR_INVALID, "convolution: batch sizes differ");
    if (g->G < 1 || g->C % g->G || g->O % g->G) return fail(FL_ERR_INVALID, "convolution: bad groups %lld", (long long)g->G);
    if (g->sh < 1 || g->sw < 1 || g->dh < 1 || g->dw < 1 || g->ph < 0 || g->pw < 0)
        return fail(FL_ERR_INVALID, "convolution: bad stride/padding/dilation");
    if (w->sizes[0] != g->O || w->sizes[1] * g->G != g->C)
        return fail(FL_ERR_INVALID, "convolution: weight shape does not match the channels");
    int64_t eh = g->H + 2 * g->ph - g->dh * (g->KH - 1) - 1, ew = g->W + 2 * g->pw - g->dw * (g->KW - 1) - 1;
    int64_t oh = eh < 0 ? 0 : eh / g->sh + 1, ow = ew < 0 ? 0 : ew / g->sw + 1;
    int loose = transposed && g->OH <= oh && g->OW <= ow && g->OH + g->sh + g->dh > oh && g->OW + g->sw + g->dw > ow;
    if (g->N > 0 && (oh != g->OH || ow != g->OW) && !loose)
        return fail(FL_ERR_INVALID, "convolution: output extent %lldx%lld, expected %lldx%lld", (long long)g->OH,
                    (long long)g->OW, (long long)oh, (long long)ow);
    /* im2col and col2im index pixels, taps and columns in 32-bit ints (element offsets stay 64-bit) */
    const int64_t lim = 0x7fffffff;
    if (g->N * g->OH * g->OW > lim || g->C * g->KH * g->KW > lim || g->H * g->W > lim || g->N * g->C > lim ||
        g->sh * g->OH + g->dh * g->KH > lim || g->sw * g->OW + g->dw * g->KW > lim || g->ph + g->H > lim ||
        g->pw + g->W > lim)
        return fail(UNSUP, NAME ": convolution: sizes beyond the kernels' 32-bit pixel indices");
    return FL_OK;
}
/* The stride of dims d0.. of t taken as one dimension, or -1 when they do not form one (size-1 dims fit
 * anywhere). */
static int64_t merged_stride(const fl_tensor_t *t, int d0) {
    int64_t st = 1, inner = 1;
    int have = 0;
    for (int d = t->ndim - 1; d >= d0; d--) {
        if (t->sizes[d] == 1) continue;
        if (have && t->strides[d] != st * inner) return -1;
        if (!have) { st = t->strides[d]; have = 1; }
        inner *= t->sizes[d];
    }
    return st;
}
/* Samples per chunk: as many as keep a (nb * OH * OW) x row_len buffer within the budget, at least one. */
static int64_t conv_chunk(dev_t_ *D, const cgeom_t *g, size_t isz, int64_t row_len) {
    int64_t budget = CONV_CHUNK_BYTES;
    if ((uint64_t)budget > D->max_alloc) budget = (int64_t)D->max_alloc;
    int64_t per = g->OH * g->OW * row_len * (int64_t)isz, nb = per > 0 ? budget / per : g->N;
    return nb < 1 ? 1 : nb > g->N ? g->N : nb;
}
/* im2col (x the input) or col2im (x grad_input) for samples [n0, n0 + nb), the column buffer in (j, k) layout */
static int conv_cols(dev_t_ *D, fl_stream_t s, int T, const cgeom_t *g, const fl_tensor_t *x, const dt_t *xd, cl_mem col,
                     int64_t n0, int64_t nb, int to_cols) {
    conv_t c = {g->C, g->H, g->W, g->OH, g->OW, g->KH, g->KW, g->sh, g->sw, g->ph, g->pw, g->dh, g->dw,
                {x->strides[0], x->strides[1], x->strides[2], x->strides[3]}, xd->off + x->offset, n0, nb,
                1, g->C * g->KH * g->KW};
    char prog[16];
    snprintf(prog, sizeof prog, "conv:%s", tname(T));
    if (to_cols) {
        if (g->C == 0 || nb * g->OH * g->OW == 0) return FL_OK;
        size_t gs[2] = {(size_t)g->C, (size_t)(nb * g->OH * g->OW)};
        karg_t a[3] = {{sizeof(cl_mem), &col}, {sizeof(cl_mem), &xd->m}, KA(c)};
        return launch(D, s, prog, "im2col", 3, a, 2, gs, NULL);
    }
    if (g->W == 0 || g->H == 0 || nb * g->C == 0) return FL_OK;
    size_t gs[3] = {(size_t)g->W, (size_t)g->H, (size_t)(nb * g->C)};
    karg_t a[3] = {{sizeof(cl_mem), &xd->m}, {sizeof(cl_mem), &col}, KA(c)};
    return launch(D, s, prog, "col2im", 3, a, 3, gs, NULL);
}
/* dst(b, i, j) = src(b, i, j) over (B, t.I, t.J), both strided, in 16 x 16 tiles */
static int conv_tile_copy(dev_t_ *D, fl_stream_t s, int T, cl_mem dst, cl_mem src, int64_t B, tcopy_t t) {
    if (!B || !t.I || !t.J) return FL_OK;
    char prog[16];
    snprintf(prog, sizeof prog, "conv:%s", tname(T));
    size_t gs[3] = {(size_t)((t.J + 15) / 16), (size_t)((t.I + 15) / 16), (size_t)B};
    karg_t a[3] = {{sizeof(cl_mem), &dst}, {sizeof(cl_mem), &src}, KA(t)};
    return launch(D, s, prog, "tile_copy", 3, a, 3, gs, NULL);
}
/* C (M x N) = A (M x K) @ B (N x K)^T, A and B with unit stride along K (mat_t.cs ignored), K > 0: CLBlast where
 * clblast.c says so (B^T is a transposed matrix to it), else the gemm_nt kernel */
static int conv_gemm_nt(dev_t_ *D, fl_stream_t s, int T, int64_t M, int64_t N, int64_t K, mat_t a, mat_t b, mat_t c) {
    if (!M || !N) return FL_OK;
    if (ocl_clblast_for(D->host_cpu)) {
        int cst = 0;
        int r = ocl_clblast_gemm(qof(D, s), T == FL_FLOAT64, 1, M, N, K, 1.0, a.m, a.off, a.rs, 1, 0, b.m, b.off, 1, b.rs, 0,
                                 c.m, c.off, c.rs, 0, 0, &cst);
        if (r == 0) return FL_OK;
        if (r < 0) return fail(FL_ERR_INTERNAL, NAME ": CLBlast's GEMM (%lld x %lld x %lld, convolution) failed with "
                               "status %d; FL_OPENCL_CLBLAST=0 uses the plugin's own kernel", (long long)M, (long long)N,
                               (long long)K, cst);
    }
    gnt_t g = {M, N, K, a.off, a.rs, b.off, b.rs, c.off, c.rs, 0};
    char prog[16];
    snprintf(prog, sizeof prog, "conv:%s", tname(T));
    karg_t ka[4] = {{sizeof(cl_mem), &c.m}, {sizeof(cl_mem), &a.m}, {sizeof(cl_mem), &b.m}, KA(g)};
    size_t gs[2] = {(size_t)((N + 3) / 4), (size_t)((M + 3) / 4)}, ls[2] = {1, 1};
    return launch(D, s, prog, "gemm_nt", 4, ka, 2, gs, ls);
}
/* A (j, O) matrix of samples [0, nb): element (sample, channel, pixel) at (sample * P + pixel) * O + channel */
static tcopy_t conv_jo(int64_t O, int64_t P) {
    tcopy_t t = {O, P, 0, P * O, 1, O, 0, P * O, 1, O};
    return t;
}

/* y (N, C, H, W) += b (C), when there is a bias */
static int conv_bias(dev_t_ *D, fl_stream_t s, int T, const fl_tensor_t *y, const dt_t *yd, const fl_tensor_t *b, const dt_t *bd) {
    if (!b) return FL_OK;
    opnd_t ops[2]; /* the bias broadcast along dims 0, 2, 3 */
    memset(ops, 0, sizeof ops);
    ops[0].v = *y; ops[0].d = *yd;
    ops[1].v = *y; ops[1].d = *bd;
    ops[1].v.offset = b->offset;
    ops[1].v.strides[0] = ops[1].v.strides[2] = ops[1].v.strides[3] = 0;
    ops[1].v.strides[1] = b->strides[0];
    return ew_run(D, s, T, "b_add", y, 2, ops, 1.0, 0);
}

/* y = conv(x, w) + b (ordinary convolution space: x (N, C, H, W), y (N, O, OH, OW)) */
static int conv_fwd(dev_t_ *D, fl_stream_t s, int T, const cgeom_t *g, const fl_tensor_t *x, const dt_t *xd,
                    const fl_tensor_t *w, const dt_t *wd, const fl_tensor_t *b, const dt_t *bd, const fl_tensor_t *y,
                    const dt_t *yd) {
    const int64_t P = g->OH * g->OW, KK = g->KH * g->KW, Cg = g->C / g->G, Og = g->O / g->G, Kg = Cg * KK;
    const int64_t CK = g->C * KK, O = g->O;
    const size_t isz = fl_itemsize(T);
    int st = FL_OK;
    if (fl_numel(y) == 0) return FL_OK;
    const int64_t xsp = merged_stride(x, 2), ysp = merged_stride(y, 2), wk = merged_stride(w, 1);
    if (Kg == 0) { /* no input channels: the bias alone */
        st = fill_bits(D, s, y, 0);
    } else if (g->KH == 1 && g->KW == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0 && xsp == 1 && ysp == 1 &&
               P >= CONV_DIRECT_PIXELS) { /* Y[n] (Og, P) = W_g (Og, C/G) @ X[n] (C/G, P), every sample at once */
        for (int64_t gr = 0; gr < g->G && !st; gr++) {
            mat_t am = {wd->m, wd->off + w->offset + gr * Og * w->strides[0], w->strides[0], w->strides[1], 0};
            mat_t bm = {xd->m, xd->off + x->offset + gr * Cg * x->strides[1], x->strides[1], 1, x->strides[0]};
            mat_t cm = {yd->m, yd->off + y->offset + gr * Og * y->strides[1], y->strides[1], 1, y->strides[0]};
            st = gemm_mats(D, s, T, g->N, Og, P, Cg, am, bm, cm, 1.0, 0);
        }
    } else {
        const int64_t nb_max = conv_chunk(D, g, isz, CK > O ? CK : O);
        cl_mem tmp = tmpbuf(D, (size_t)(nb_max * P * O) * isz, &st), col = NULL, wc = NULL;
        if (tmp) col = tmpbuf(D, (size_t)(nb_max * P * CK) * isz, &st);
        mat_t wm = {wd->m, wd->off + w->offset, w->strides[0], 1, 0};
        if (col && wk != 1) { /* gemm_nt reads the weight's rows along k: a contiguous copy first */
            fl_tensor_t wdense = *w;
            wdense.offset = 0;
            contig_strides(&wdense);
            dt_t wcd = {wc = tmpbuf(D, (size_t)(O * Kg) * isz, &st), 0};
            if (wc) st = copy_view(D, s, &wdense, &wcd, w, wd);
            wm = (mat_t){wc, 0, Kg, 1, 0};
        }
        for (int64_t n0 = 0; n0 < g->N && col && !st; n0 += nb_max) {
            const int64_t nb = g->N - n0 < nb_max ? g->N - n0 : nb_max;
            st = conv_cols(D, s, T, g, x, xd, col, n0, nb, 1);
            for (int64_t gr = 0; gr < g->G && !st; gr++) {
                mat_t am = {col, gr * Kg, CK, 1, 0}, bm = {wm.m, wm.off + gr * Og * wm.rs, wm.rs, 1, 0};
                mat_t cm = {tmp, gr * Og, O, 1, 0};
                st = conv_gemm_nt(D, s, T, nb * P, Og, Kg, am, bm, cm);
            }
            if (st) break;
            fl_tensor_t yv = *y, tv;
            yv.sizes[0] = nb;
            yv.offset += n0 * y->strides[0];
            if (ysp >= 0) { /* (j, O) -> NCHW in tiles */
                tcopy_t t = conv_jo(O, P);
                t.doff = yd->off + yv.offset; t.db = y->strides[0]; t.di = y->strides[1]; t.dj = ysp;
                st = conv_tile_copy(D, s, T, yd->m, tmp, nb, t);
            } else {
                memset(&tv, 0, sizeof tv);
                tv.dtype = T; tv.ndim = 4;
                tv.sizes[0] = nb; tv.sizes[1] = O; tv.sizes[2] = g->OH; tv.sizes[3] = g->OW;
                tv.strides[0] = P * O; tv.strides[1] = 1; tv.strides[2] = g->OW * O; tv.strides[3] = O;
                dt_t td = {tmp, 0};
                st = copy_view(D, s, &yv, yd, &tv, &td);
            }
        }
        if (tmp) cl.clReleaseMemObject(tmp);
        if (col) cl.clReleaseMemObject(col);
        if (wc) cl.clReleaseMemObject(wc);
    }
    return st ? st : conv_bias(D, s, T, y, yd, b, bd);
}

/* the ranks these kernels take: 1-D and 2-D convolutions (3-D and 4-D tensors), all of the same rank */
static int conv_rank_ok(const fl_tensor_t *x, const fl_tensor_t *w, const fl_tensor_t *y, const char *op) {
    if ((x->ndim != 3 && x->ndim != 4) || w->ndim != x->ndim || y->ndim != x->ndim)
        return fail(UNSUP, NAME ": %s: kernels for 1-D and 2-D convolutions only (%d-D tensors here)", op, x->ndim);
    return FL_OK;
}

/* The gradients of y = conv(x, w) in ordinary convolution space: gi (N, C, H, W) and/or gw from go (N, O, OH, OW);
 * x is read only for gw, w only for gi. A transposed convolution's forward (gi its output, go its input) and
 * weight gradient (go its input, x its grad_output) run through it too. */
static int conv_bwd(dev_t_ *D, fl_stream_t s, int T, const cgeom_t *g, const fl_tensor_t *go, const dt_t *god,
                    const fl_tensor_t *x, const dt_t *xd, const fl_tensor_t *w, const dt_t *wd, const fl_tensor_t *gi,
                    const dt_t *gid, const fl_tensor_t *gw, const dt_t *gwd) {
    const int64_t P = g->OH * g->OW, KK = g->KH * g->KW, Cg = g->C / g->G, Og = g->O / g->G, Kg = Cg * KK;
    const int64_t CK = g->C * KK, O = g->O;
    const size_t isz = fl_itemsize(T);
    int st = FL_OK;
    if (fl_numel(go) == 0 || Kg == 0) { /* nothing reaches the gradients: zeros (or no elements at all) */
        if (gi && (st = fill_bits(D, s, gi, 0))) return st;
        return gw ? fill_bits(D, s, gw, 0) : FL_OK;
    }
    /* W_g is B of the grad_input GEMM and grad_weight C of the other: both need unit stride along k, else a
     * contiguous copy of the weight / a contiguous temporary for grad_weight */
    const int64_t wk = merged_stride(w, 1), gwk = gw ? merged_stride(gw, 1) : 1, gsp = merged_stride(go, 2);
    const int64_t nb_max = conv_chunk(D, g, isz, CK > O ? CK : O);
    cl_mem col = tmpbuf(D, (size_t)(nb_max * P * CK) * isz, &st), pack = NULL, wc = NULL, gwt = NULL;
    if (col) pack = tmpbuf(D, (size_t)(nb_max * P * O) * isz, &st);
    if (pack && gi && wk != 1) wc = tmpbuf(D, (size_t)(O * Kg) * isz, &st);
    if (pack && gw && gwk != 1) gwt = tmpbuf(D, (size_t)(O * Kg) * isz, &st);
    fl_tensor_t wdense = *w, gwdense = gw ? *gw : *w;
    wdense.offset = 0; gwdense.offset = 0;
    contig_strides(&wdense);
    contig_strides(&gwdense);
    mat_t wm = {wd->m, wd->off + w->offset, w->strides[0], 1, 0};
    mat_t gwm = gw ? (mat_t){gwd->m, gwd->off + gw->offset, gw->strides[0], 1, 0} : (mat_t){NULL, 0, 0, 1, 0};
    if (!st && wc) {
        dt_t wcd = {wc, 0};
        st = copy_view(D, s, &wdense, &wcd, w, wd);
        wm = (mat_t){wc, 0, Kg, 1, 0};
    }
    if (gwt) gwm = (mat_t){gwt, 0, Kg, 1, 0};
    for (int64_t n0 = 0; n0 < g->N && !st; n0 += nb_max) {
        const int64_t nb = g->N - n0 < nb_max ? g->N - n0 : nb_max;
        if (gsp >= 0) { /* dY as a (j, O) matrix */
            tcopy_t t = conv_jo(O, P);
            t.soff = god->off + go->offset + n0 * go->strides[0]; t.sb = go->strides[0]; t.si = go->strides[1]; t.sj = gsp;
            st = conv_tile_copy(D, s, T, pack, god->m, nb, t);
        } else {
            fl_tensor_t gov = *go, pv;
            gov.sizes[0] = nb;
            gov.offset += n0 * go->strides[0];
            pv = gov;
            pv.offset = 0;
            pv.strides[0] = P * O; pv.strides[1] = 1; pv.strides[2] = g->OW * O; pv.strides[3] = O;
            dt_t pd = {pack, 0};
            st = copy_view(D, s, &pv, &pd, &gov, god);
        }
        if (!st && gw) {
            st = conv_cols(D, s, T, g, x, xd, col, n0, nb, 1);
            for (int64_t gr = 0; gr < g->G && !st; gr++) {
                mat_t am = {pack, gr * Og, 1, O, 0}, bm = {col, gr * Kg, CK, 1, 0};
                mat_t cm = {gwm.m, gwm.off + gr * Og * gwm.rs, gwm.rs, 1, 0};
                st = gemm_mats(D, s, T, 1, Og, Kg, nb * P, am, bm, cm, 1.0, n0 > 0);
            }
        }
        if (!st && gi) {
            for (int64_t gr = 0; gr < g->G && !st; gr++) {
                mat_t am = {pack, gr * Og, O, 1, 0}, bm = {wm.m, wm.off + gr * Og * wm.rs, wm.rs, 1, 0};
                mat_t cm = {col, gr * Kg, CK, 1, 0};
                st = gemm_mats(D, s, T, 1, nb * P, Kg, Og, am, bm, cm, 1.0, 0);
            }
            if (!st) st = conv_cols(D, s, T, g, gi, gid, col, n0, nb, 0);
        }
    }
    if (!st && gwt) {
        dt_t gtd = {gwt, 0};
        st = copy_view(D, s, gw, gwd, &gwdense, &gtd);
    }
    if (col) cl.clReleaseMemObject(col);
    if (pack) cl.clReleaseMemObject(pack);
    if (wc) cl.clReleaseMemObject(wc);
    if (gwt) cl.clReleaseMemObject(gwt);
    return st;
}

int k_conv(KARGS) {
    DEV(device);
    if (n_args < 9 || !fl_out_ok(out, n_out)) return UNSUP;
    const fl_tensor_t *x0 = fl_arg_tensor(args, n_args, 0, in, n_in), *w0 = fl_arg_tensor(args, n_args, 1, in, n_in);
    const fl_tensor_t *b = fl_arg_tensor(args, n_args, 2, in, n_in), *y0 = &out[0];
    if (!x0 || !w0) return UNSUP;
    const int T = x0->dtype;
    if (!is_flt(T) || !dt_ok(D, T) || w0->dtype != T || y0->dtype != T) return UNSUP;
    const int tr = (int)fl_arg_int_or(args, n_args, 6, -1);
    if (tr < 0) return UNSUP;
    int st = conv_rank_ok(x0, w0, y0, "convolution");
    if (st) return st;
    fl_tensor_t xv, wv, yv;
    conv_4d(x0, &xv); conv_4d(w0, &wv); conv_4d(y0, &yv);
    const fl_tensor_t *x = &xv, *w = &wv, *y = &yv;
    cgeom_t g; /* a transposed convolution is the ordinary one's input gradient: from y's space to x's */
    st = tr ? conv_geom(&g, y, x, w, args, 3, &args[8], x0->ndim - 2, 1) : conv_geom(&g, x, y, w, args, 3, &args[8], x0->ndim - 2, 0);
    if (st) return st;
    if (b && (b->dtype != T || b->ndim != 1 || b->sizes[0] != y->sizes[1])) return UNSUP;
    dt_t xd, wd, bd = {NULL, 0}, yd;
    if ((st = tres(D, x, &xd)) || (st = tres(D, w, &wd)) || (b && (st = tres(D, b, &bd))) || (st = tres(D, y, &yd))) return st;
    if (!tr) return conv_fwd(D, stream, T, &g, x, &xd, w, &wd, b, &bd, y, &yd);
    st = conv_bwd(D, stream, T, &g, x, &xd, NULL, NULL, w, &wd, y, &yd, NULL, NULL);
    return st ? st : conv_bias(D, stream, T, y, &yd, b, &bd);
}

int k_conv_bw(KARGS) {
    DEV(device);
    if (n_args < 11 || n_out < 3) return UNSUP;
    const fl_tensor_t *go0 = fl_arg_tensor(args, n_args, 0, in, n_in), *x0 = fl_arg_tensor(args, n_args, 1, in, n_in),
                      *w0 = fl_arg_tensor(args, n_args, 2, in, n_in);
    if (!go0 || !x0 || !w0) return UNSUP;
    const int T = go0->dtype;
    if (!is_flt(T) || !dt_ok(D, T) || x0->dtype != T || w0->dtype != T) return UNSUP;
    const int tr = (int)fl_arg_int_or(args, n_args, 7, -1);
    if (tr < 0) return UNSUP;
    int m[3] = {1, 1, 1};
    if (args[10].kind == FL_ARG_INT_LIST && args[10].len == 3)
        for (int k = 0; k < 3; k++) m[k] = args[10].list[k] != 0;
    const fl_tensor_t *gi0 = m[0] ? fl_out_at(out, n_out, 0) : NULL, *gw0 = m[1] ? fl_out_at(out, n_out, 1) : NULL,
                      *gb = m[2] ? fl_out_at(out, n_out, 2) : NULL;
    if ((gi0 && gi0->dtype != T) || (gw0 && gw0->dtype != T) || (gb && gb->dtype != T)) return UNSUP;
    int st = conv_rank_ok(x0, w0, go0, "convolution_backward");
    if (st) return st;
    for (int d = 0; d < x0->ndim; d++) {
        if (gi0 && (gi0->ndim != x0->ndim || gi0->sizes[d] != x0->sizes[d]))
            return fail(FL_ERR_INVALID, "convolution_backward: grad_input shape");
        if (gw0 && (gw0->ndim != w0->ndim || gw0->sizes[d] != w0->sizes[d]))
            return fail(FL_ERR_INVALID, "convolution_backward: grad_weight shape");
    }
    fl_tensor_t gov, xv, wv, giv, gwv;
    conv_4d(go0, &gov); conv_4d(x0, &xv); conv_4d(w0, &wv);
    if (gi0) conv_4d(gi0, &giv);
    if (gw0) conv_4d(gw0, &gwv);
    const fl_tensor_t *go = &gov, *x = &xv, *w = &wv, *gi = gi0 ? &giv : NULL, *gw = gw0 ? &gwv : NULL;
    cgeom_t g;
    st = tr ? conv_geom(&g, go, x, w, args, 4, &args[9], x0->ndim - 2, 1) : conv_geom(&g, x, go, w, args, 4, &args[9], x0->ndim - 2, 0);
    if (st) return st;
    if (gb && (gb->ndim != 1 || gb->sizes[0] != go->sizes[1]))
        return fail(FL_ERR_INVALID, "convolution_backward: grad_bias shape");
    dt_t god, xd, wd, gid = {NULL, 0}, gwd = {NULL, 0};
    if ((st = tres(D, go, &god)) || (st = tres(D, x, &xd)) || (st = tres(D, w, &wd)) || (gi && (st = tres(D, gi, &gid))) ||
        (gw && (st = tres(D, gw, &gwd))))
        return st;
    if (gb) { /* the sum of grad_output over batch and pixels; first: the reduction may still decline */
        fl_arg_t dims;
        memset(&dims, 0, sizeof dims);
        dims.kind = FL_ARG_INT_LIST; dims.len = 3;
        dims.list[0] = 0; dims.list[1] = 2; dims.list[2] = 3;
        if ((st = reduce(D, stream, go, &dims, 0, gb, 0, 0))) return st;
    }
    if (!gi && !gw) return FL_OK;
    if (!tr) return conv_bwd(D, stream, T, &g, go, &god, x, &xd, w, &wd, gi, &gid, gw, &gwd);
    /* transposed: grad_input = the ordinary convolution of grad_output; grad_weight that of the ordinary one with
     * grad_output as its input and the input as its output gradient */
    if (gi && (st = conv_fwd(D, stream, T, &g, go, &god, w, &wd, NULL, NULL, gi, &gid))) return st;
    return gw ? conv_bwd(D, stream, T, &g, x, &xd, go, &god, w, &wd, NULL, NULL, gw, &gwd) : FL_OK;
}
