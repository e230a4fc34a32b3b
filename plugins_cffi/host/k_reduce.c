/* Host kernels: reductions. Serves sum, mean, prod, amax/amin, max/min (with
 * and without dim), argmax/argmin, var/std(_mean), any/all, vector norms,
 * logsumexp, and the row-wise ops along one dim: cumsum and the softmax
 * family (_softmax, _log_softmax, _safe_softmax and their backward). Indexing
 * lives in k_index.c, losses in k_loss.c.
 *
 * Reductions: the input is split into kept dims (one output element per
 * combination) and reduced dims. Each output element's reduced elements are
 * visited in logical order, a segment at a time, gathered into a double (or
 * int64, for exact integer sums/products/extrema) buffer and folded into an
 * accumulator. Floats accumulate in double with lane-parallel partial sums,
 * so 1e6-element float32 sums stay accurate. Many outputs: parallel over
 * outputs; few outputs: parallel over segments with per-thread partial
 * accumulators combined in order (first-occurrence rules for arg-extrema
 * hold). Sums over outer dims with a contiguous kept inner dim use a column
 * path that adds whole rows into a block of accumulators.
 */
#pragma GCC optimize("no-math-errno")
#include <omp.h>
#include <stdlib.h>

#include "fl_host.h"

#define UNSUP FL_ERR_UNSUPPORTED
#define PAR_MIN 32768
#define SEG 2048

FL_MV static double sum_fd(const float *b, int64_t n) { /* float array summed in double lanes */
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += (double)b[i + j];
    for (; i < n; i++) acc[0] += b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* dims argument -> bit mask over x's dims. NONE / empty list = all dims. */
static int parse_dims(const fl_arg_t *a, int ndim, uint32_t *mask) {
    uint32_t all = ndim ? ((1u << ndim) - 1) : 0;
    if (a == NULL || a->kind == FL_ARG_NONE || (a->kind == FL_ARG_INT_LIST && a->len == 0)) { *mask = all; return 0; }
    uint32_t m = 0;
    if (a->kind == FL_ARG_INT) {
        int d;
        if (fl_wrap_dim(a->i, ndim, &d)) FL_FAIL(FL_ERR_INVALID, "dimension %lld out of range", (long long)a->i);
        m = ndim ? 1u << d : 0;
    } else if (a->kind == FL_ARG_INT_LIST) {
        for (int k = 0; k < a->len && k < FL_MAX_DIMS; k++) {
            int d;
            if (fl_wrap_dim(a->list[k], ndim, &d)) FL_FAIL(FL_ERR_INVALID, "dimension %lld out of range", (long long)a->list[k]);
            if (!ndim) continue;
            if (m & (1u << d)) FL_FAIL(FL_ERR_INVALID, "dim %d appears multiple times in the list of dims", d);
            m |= 1u << d;
        }
    } else {
        return UNSUP;
    }
    *mask = m;
    return 0;
}

/* ------------------------------------------------------------------ */
/* reduction plan                                                      */
/* ------------------------------------------------------------------ */
typedef struct {
    int nk, nr, nouts;
    int64_t ksz[FL_MAX_DIMS], kis[FL_MAX_DIMS], kos[2][FL_MAX_DIMS];
    int64_t rsz[FL_MAX_DIMS], ris[FL_MAX_DIMS];
    int64_t nout, nred;
} rplan_t;

static int make_plan(const fl_tensor_t *x, uint32_t mask, int keepdim, const fl_tensor_t *outs, int nouts, rplan_t *p) {
    memset(p, 0, sizeof *p);
    p->nouts = nouts;
    p->nout = 1;
    p->nred = 1;
    for (int k = 0; k < nouts; k++)
        if (!fl_tensor_ok(&outs[k])) return UNSUP;
    int j = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (mask & (1u << d)) {
            p->rsz[p->nr] = x->sizes[d];
            p->ris[p->nr] = x->strides[d];
            p->nred *= x->sizes[d];
            p->nr++;
            if (keepdim)
                for (int k = 0; k < nouts; k++)
                    if (outs[k].ndim != x->ndim || outs[k].sizes[d] != 1) return UNSUP;
        } else {
            p->ksz[p->nk] = x->sizes[d];
            p->kis[p->nk] = x->strides[d];
            p->nout *= x->sizes[d];
            for (int k = 0; k < nouts; k++) {
                int od = keepdim ? d : j;
                if (od >= outs[k].ndim || outs[k].sizes[od] != x->sizes[d]) return UNSUP;
                p->kos[k][p->nk] = outs[k].strides[od];
            }
            p->nk++;
            j++;
        }
    }
    for (int k = 0; k < nouts; k++) {
        if (keepdim && outs[k].ndim != x->ndim && !(x->ndim == 0 && outs[k].ndim == 0)) return UNSUP;
        if (!keepdim && outs[k].ndim != j) return UNSUP;
    }
    return 0;
}
static void plan_offsets(const rplan_t *p, int64_t o, int64_t *xoff, int64_t *ooff) {
    int64_t xo = 0, oo[2] = {0, 0};
    for (int d = p->nk - 1; d >= 0 && o; d--) {
        int64_t idx = o % p->ksz[d];
        o /= p->ksz[d];
        xo += idx * p->kis[d];
        for (int k = 0; k < p->nouts; k++) oo[k] += idx * p->kos[k][d];
    }
    *xoff = xo;
    ooff[0] = oo[0];
    ooff[1] = oo[1];
}

/* ------------------------------------------------------------------ */
/* accumulators                                                        */
/* ------------------------------------------------------------------ */
enum { OP_SUM, OP_PROD, OP_MAX, OP_MIN, OP_ANY, OP_ALL, OP_VAR, OP_NORM, OP_LSE };
enum { NORM_P, NORM_1, NORM_2, NORM_INF, NORM_NINF, NORM_0 };

typedef struct {
    double s, m, c; /* sum / extreme / M2 */
    int64_t is, idx, n;
    int has;
} racc_t;

typedef struct {
    int op, intmode, norm;
    double p;
} rop_t;

static void acc_init(const rop_t *r, racc_t *a) {
    memset(a, 0, sizeof *a);
    if (r->op == OP_PROD) { a->s = 1; a->is = 1; }
    if (r->op == OP_ALL) a->is = 1;
    if (r->op == OP_LSE) a->m = -INFINITY;
}

FL_MV static double sum_d(const double *b, int64_t n) {
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += b[i + j];
    for (; i < n; i++) acc[0] += b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* extreme with NaN propagation; b replaces a when strictly better (a first) */
static inline int better(int ismax, double v, double m) {
    if (m != m) return 0;
    if (v != v) return 1;
    return ismax ? v > m : v < m;
}

static void acc_feed_d(const rop_t *r, racc_t *a, const double *b, int64_t n, int64_t start) {
    if (n <= 0) return;
    switch (r->op) {
    case OP_SUM: a->s += sum_d(b, n); break;
    case OP_PROD: for (int64_t i = 0; i < n; i++) a->s *= b[i]; break;
    case OP_MAX: case OP_MIN: {
        int ismax = r->op == OP_MAX;
        for (int64_t i = 0; i < n; i++)
            if (!a->has || better(ismax, b[i], a->m)) { a->m = b[i]; a->idx = start + i; a->has = 1; }
        break;
    }
    case OP_ANY: for (int64_t i = 0; i < n; i++) if (b[i] != 0) { a->is = 1; break; } break;
    case OP_ALL: for (int64_t i = 0; i < n; i++) if (b[i] == 0) { a->is = 0; break; } break;
    case OP_VAR: {
        double mb = sum_d(b, n) / (double)n, m2 = 0;
        for (int64_t i = 0; i < n; i++) { double d = b[i] - mb; m2 += d * d; }
        if (a->n == 0) { a->s = mb; a->c = m2; a->n = n; break; }
        double nt = (double)(a->n + n), delta = mb - a->s;
        a->s += delta * (double)n / nt;
        a->c += m2 + delta * delta * (double)a->n * (double)n / nt;
        a->n += n;
        break;
    }
    case OP_NORM:
        switch (r->norm) {
        case NORM_2: { double t = 0; for (int64_t i = 0; i < n; i++) t += b[i] * b[i]; a->s += t; break; }
        case NORM_1: { double t = 0; for (int64_t i = 0; i < n; i++) t += fabs(b[i]); a->s += t; break; }
        case NORM_0: { double t = 0; for (int64_t i = 0; i < n; i++) t += b[i] != 0; a->s += t; break; }
        case NORM_P: { double t = 0; for (int64_t i = 0; i < n; i++) t += pow(fabs(b[i]), r->p); a->s += t; break; }
        case NORM_INF: case NORM_NINF:
            for (int64_t i = 0; i < n; i++) {
                double v = fabs(b[i]);
                if (!a->has || better(r->norm == NORM_INF, v, a->m)) { a->m = v; a->has = 1; }
            }
            break;
        }
        break;
    case OP_LSE: {
        double cm = -INFINITY;
        for (int64_t i = 0; i < n; i++) if (b[i] > cm || b[i] != b[i]) { cm = b[i]; if (cm != cm) break; }
        if (cm != cm) { a->m = cm; a->has = 1; break; }
        if (cm == -INFINITY) break;
        double cs = 0;
        if (cm == INFINITY) cs = 1;
        else for (int64_t i = 0; i < n; i++) cs += exp(b[i] - cm);
        if (a->m != a->m) break;
        if (a->m == -INFINITY) { a->m = cm; a->s = cs; break; }
        double nm = a->m > cm ? a->m : cm;
        a->s = (nm == INFINITY ? (a->m == INFINITY ? a->s : 0) + (cm == INFINITY ? cs : 0)
                               : a->s * exp(a->m - nm) + cs * exp(cm - nm));
        a->m = nm;
        break;
    }
    }
}

static void acc_feed_i(const rop_t *r, racc_t *a, const int64_t *b, int64_t n, int64_t start) {
    switch (r->op) {
    case OP_SUM: { uint64_t t = 0; for (int64_t i = 0; i < n; i++) t += (uint64_t)b[i]; a->is = (int64_t)((uint64_t)a->is + t); break; }
    case OP_PROD: for (int64_t i = 0; i < n; i++) a->is = (int64_t)((uint64_t)a->is * (uint64_t)b[i]); break;
    case OP_MAX: for (int64_t i = 0; i < n; i++) if (!a->has || b[i] > a->is) { a->is = b[i]; a->idx = start + i; a->has = 1; } break;
    case OP_MIN: for (int64_t i = 0; i < n; i++) if (!a->has || b[i] < a->is) { a->is = b[i]; a->idx = start + i; a->has = 1; } break;
    case OP_ANY: for (int64_t i = 0; i < n; i++) if (b[i] != 0) { a->is = 1; break; } break;
    case OP_ALL: for (int64_t i = 0; i < n; i++) if (b[i] == 0) { a->is = 0; break; } break;
    }
}

/* a := a (earlier) combined with b (later) */
static void acc_combine(const rop_t *r, racc_t *a, const racc_t *b) {
    if (r->intmode) {
        switch (r->op) {
        case OP_SUM: a->is = (int64_t)((uint64_t)a->is + (uint64_t)b->is); break;
        case OP_PROD: a->is = (int64_t)((uint64_t)a->is * (uint64_t)b->is); break;
        case OP_MAX: if (b->has && (!a->has || b->is > a->is)) *a = *b; break;
        case OP_MIN: if (b->has && (!a->has || b->is < a->is)) *a = *b; break;
        case OP_ANY: a->is = a->is || b->is; break;
        case OP_ALL: a->is = a->is && b->is; break;
        }
        return;
    }
    switch (r->op) {
    case OP_SUM: a->s += b->s; break;
    case OP_PROD: a->s *= b->s; break;
    case OP_MAX: case OP_MIN: if (b->has && (!a->has || better(r->op == OP_MAX, b->m, a->m))) *a = *b; break;
    case OP_ANY: a->is = a->is || b->is; break;
    case OP_ALL: a->is = a->is && b->is; break;
    case OP_VAR:
        if (b->n == 0) break;
        if (a->n == 0) { *a = *b; break; }
        {
            double nt = (double)(a->n + b->n), delta = b->s - a->s;
            a->s += delta * (double)b->n / nt;
            a->c += b->c + delta * delta * (double)a->n * (double)b->n / nt;
            a->n += b->n;
        }
        break;
    case OP_NORM:
        if (r->norm == NORM_INF || r->norm == NORM_NINF) {
            if (b->has && (!a->has || better(r->norm == NORM_INF, b->m, a->m))) { a->m = b->m; a->has = 1; }
        } else {
            a->s += b->s;
        }
        break;
    case OP_LSE: {
        if (b->m != b->m || a->m != a->m) { if (b->m != b->m) a->m = b->m; break; }
        if (b->m == -INFINITY) break;
        if (a->m == -INFINITY) { *a = *b; break; }
        double nm = a->m > b->m ? a->m : b->m;
        if (nm == INFINITY) a->s = 1;
        else a->s = a->s * exp(a->m - nm) + b->s * exp(b->m - nm);
        a->m = nm;
        break;
    }
    }
}

/* feed the reduced elements of units [u0, u1) for the output at input offset xoff */
static void reduce_units(const rop_t *r, const rplan_t *p, const fl_tensor_t *x, int64_t xoff, int64_t u0, int64_t u1,
                         racc_t *a) {
    int64_t last = p->nr ? p->rsz[p->nr - 1] : 1, ls = p->nr ? p->ris[p->nr - 1] : 0;
    int64_t nseg = (last + SEG - 1) / SEG;
    double buf[SEG];
    for (int64_t u = u0; u < u1; u++) {
        int64_t row = u / nseg, s0 = (u % nseg) * SEG;
        int64_t len = last - s0 < SEG ? last - s0 : SEG;
        int64_t off = xoff + x->offset, rr = row;
        for (int d = p->nr - 2; d >= 0 && rr; d--) {
            off += (rr % p->rsz[d]) * p->ris[d];
            rr /= p->rsz[d];
        }
        off += s0 * ls;
        if (r->intmode) {
            fl_cvt_row(FL_INT64, buf, 1, x->dtype, fl_elem(x, off), ls, len);
            acc_feed_i(r, a, (const int64_t *)buf, len, row * last + s0);
        } else {
            fl_cvt_row(FL_FLOAT64, buf, 1, x->dtype, fl_elem(x, off), ls, len);
            acc_feed_d(r, a, buf, len, row * last + s0);
        }
    }
}

typedef void (*rfinal_fn)(const rop_t *r, const racc_t *a, int64_t nred, const fl_tensor_t *outs, const int64_t *ooff,
                          const void *ctx);

static void store_d(const fl_tensor_t *t, int64_t off, double v) { fl_store_f64(t->dtype, fl_elem(t, t->offset + off), v); }
static void store_i(const fl_tensor_t *t, int64_t off, int64_t v) { fl_cvt_row(t->dtype, fl_elem(t, t->offset + off), 1, FL_INT64, &v, 0, 1); }

static int reduce_run(const rop_t *r, const rplan_t *p, const fl_tensor_t *x, const fl_tensor_t *outs, rfinal_fn fin,
                      const void *ctx) {
    if (p->nout == 0) return FL_OK;
    int64_t last = p->nr ? p->rsz[p->nr - 1] : 1;
    int64_t nseg = (last + SEG - 1) / SEG;
    int64_t units = p->nred == 0 ? 0 : (p->nred / last) * nseg;
    int64_t total = p->nout * (p->nred ? p->nred : 1);
    int nth = omp_get_max_threads();
    if (p->nout >= 4 * nth || total < PAR_MIN || units < 2 * nth) {
#pragma omp parallel for schedule(dynamic, 1) if (total >= PAR_MIN && p->nout > 1)
        for (int64_t o = 0; o < p->nout; o++) {
            int64_t xoff, ooff[2];
            plan_offsets(p, o, &xoff, ooff);
            racc_t a;
            acc_init(r, &a);
            reduce_units(r, p, x, xoff, 0, units, &a);
            fin(r, &a, p->nred, outs, ooff, ctx);
        }
        return FL_OK;
    }
    racc_t *parts = malloc(sizeof(racc_t) * (size_t)nth);
    if (!parts) FL_FAIL(FL_ERR_OOM, "reduction: out of host memory");
    for (int64_t o = 0; o < p->nout; o++) {
        int64_t xoff, ooff[2];
        plan_offsets(p, o, &xoff, ooff);
        int used = nth;
#pragma omp parallel num_threads(nth)
        {
            int t = omp_get_thread_num(), nt = omp_get_num_threads();
            if (t == 0) used = nt;
            int64_t u0 = units * t / nt, u1 = units * (t + 1) / nt;
            acc_init(r, &parts[t]);
            reduce_units(r, p, x, xoff, u0, u1, &parts[t]);
        }
        for (int t = 1; t < used; t++) acc_combine(r, &parts[0], &parts[t]);
        fin(r, &parts[0], p->nred, outs, ooff, ctx);
    }
    free(parts);
    return FL_OK;
}

/* Column path for sums: the innermost kept dim is contiguous in the input
 * and every reduced dim is outside it. Adds blocks of CB outputs at once. */
#define CB 256
static int sum_columns(const rplan_t *p, const fl_tensor_t *x, const fl_tensor_t *out, double scale, int intmode) {
    if (p->nout == 0) return 0;
    if (p->nk == 0 || p->kis[p->nk - 1] != 1 || p->nred == 0) return -1;
    for (int d = 0; d < p->nr; d++)
        if (p->rsz[d] > 1 && p->ris[d] < p->ksz[p->nk - 1]) return -1;
    int64_t inner = p->ksz[p->nk - 1], nblk = (inner + CB - 1) / CB;
    int64_t outer = p->nout / inner, units = outer * nblk;
    int64_t total = p->nout * p->nred;
#pragma omp parallel for schedule(static) if (total >= PAR_MIN)
    for (int64_t u = 0; u < units; u++) {
        double acc[CB], tmp[CB];
        int64_t iacc[CB];
        int64_t ob = u / nblk, j0 = (u % nblk) * CB, len = inner - j0 < CB ? inner - j0 : CB;
        int64_t xoff, ooff[2];
        plan_offsets(p, ob * inner, &xoff, ooff);
        for (int64_t j = 0; j < len; j++) { acc[j] = 0; iacc[j] = 0; }
        for (int64_t rr = 0; rr < p->nred; rr++) {
            int64_t off = x->offset + xoff + j0, q = rr;
            for (int d = p->nr - 1; d >= 0 && q; d--) { off += (q % p->rsz[d]) * p->ris[d]; q /= p->rsz[d]; }
            if (intmode) {
                fl_cvt_row(FL_INT64, tmp, 1, x->dtype, fl_elem(x, off), 1, len);
                const int64_t *ti = (const int64_t *)tmp;
                for (int64_t j = 0; j < len; j++) iacc[j] = (int64_t)((uint64_t)iacc[j] + (uint64_t)ti[j]);
            } else if (x->dtype == FL_FLOAT32) {
                const float *xf = (const float *)fl_elem(x, off);
                for (int64_t j = 0; j < len; j++) acc[j] += xf[j];
            } else {
                fl_cvt_row(FL_FLOAT64, tmp, 1, x->dtype, fl_elem(x, off), 1, len);
                for (int64_t j = 0; j < len; j++) acc[j] += tmp[j];
            }
        }
        int64_t os = p->kos[0][p->nk - 1];
        char *op = fl_elem(out, out->offset + ooff[0] + j0 * os);
        if (intmode) {
            fl_cvt_row(out->dtype, op, os, FL_INT64, iacc, 1, len);
        } else {
            for (int64_t j = 0; j < len; j++) acc[j] *= scale;
            fl_cvt_row(out->dtype, op, os, FL_FLOAT64, acc, 1, len);
        }
    }
    return 0;
}

/* ---- finalizers ---- */
static void fin_value(const rop_t *r, const racc_t *a, int64_t nred, const fl_tensor_t *outs, const int64_t *ooff,
                      const void *ctx) {
    int mode = ctx ? *(const int *)ctx : 0; /* 1 = mean, 2 = var, 3 = std, 4 = var+mean, 5 = std+mean */
    double corr = mode >= 2 ? ((const double *)ctx)[1] : 0;
    if (r->intmode) {
        if (r->op == OP_ANY || r->op == OP_ALL) store_i(&outs[0], ooff[0], a->is != 0);
        else store_i(&outs[0], ooff[0], a->is);
        if ((r->op == OP_MAX || r->op == OP_MIN) && outs[1].ndim >= 0 && outs[1].data) store_i(&outs[1], ooff[1], a->idx);
        return;
    }
    switch (r->op) {
    case OP_SUM: store_d(&outs[0], ooff[0], mode == 1 ? a->s / (double)nred : a->s); break;
    case OP_PROD: store_d(&outs[0], ooff[0], a->s); break;
    case OP_MAX: case OP_MIN:
        store_d(&outs[0], ooff[0], a->m);
        if (outs[1].ndim >= 0 && outs[1].data) store_i(&outs[1], ooff[1], a->idx);
        break;
    case OP_ANY: case OP_ALL: store_i(&outs[0], ooff[0], a->is != 0); break;
    case OP_VAR: {
        double den = (double)nred - corr;
        if (den < 0) den = 0;
        double v = a->c / den;
        if (nred == 0) v = NAN;
        if (mode == 3 || mode == 5) v = sqrt(v);
        store_d(&outs[0], ooff[0], v);
        if (mode == 4 || mode == 5) store_d(&outs[1], ooff[1], nred ? a->s : NAN);
        break;
    }
    case OP_NORM: {
        double v;
        switch (r->norm) {
        case NORM_2: v = sqrt(a->s); break;
        case NORM_INF: case NORM_NINF: v = a->m; break;
        case NORM_P: v = pow(a->s, 1.0 / r->p); break;
        default: v = a->s;
        }
        store_d(&outs[0], ooff[0], v);
        break;
    }
    case OP_LSE: store_d(&outs[0], ooff[0], (a->m == INFINITY || a->m == -INFINITY || a->m != a->m) ? a->m : a->m + log(a->s)); break;
    }
}
static void fin_argidx(const rop_t *r, const racc_t *a, int64_t nred, const fl_tensor_t *outs, const int64_t *ooff,
                       const void *ctx) {
    (void)r; (void)nred; (void)ctx;
    store_i(&outs[0], ooff[0], a->idx);
}

/* ------------------------------------------------------------------ */
/* reduction kernels                                                   */
/* ------------------------------------------------------------------ */
static int run_reduce(const fl_tensor_t *x, const fl_arg_t *dims, int keepdim, const fl_tensor_t *outs, int nouts,
                      int op, const void *ctx, rfinal_fn fin, int force_float, int norm, double pnorm) {
    if (x->ndim > FL_MAX_DIMS) return UNSUP;
    uint32_t mask;
    int st = parse_dims(dims, x->ndim, &mask);
    if (st) return st;
    rplan_t p;
    if (make_plan(x, mask, keepdim, outs, nouts, &p)) return UNSUP;
    rop_t r = {.op = op, .intmode = !fl_is_floating(x->dtype) && !force_float, .norm = norm, .p = pnorm};
    int mode = ctx ? *(const int *)ctx : 0;
    if (op == OP_SUM && (mode == 0 || mode == 1) && (!r.intmode || mode == 0)) {
        double scale = mode == 1 ? 1.0 / (double)p.nred : 1.0;
        if (sum_columns(&p, x, &outs[0], scale, r.intmode) == 0) return FL_OK;
    }
    return reduce_run(&r, &p, x, outs, fin, ctx);
}

#define GET_X const fl_tensor_t *x = fl_arg_tensor(args, n_args, 0, in, n_in); if (!x || n_out < 1) return UNSUP;
static int bool_arg(const fl_arg_t *args, int n_args, int k) {
    return k < n_args && (args[k].kind == FL_ARG_BOOL || args[k].kind == FL_ARG_INT) ? (int)args[k].i : 0;
}

static int k_sum_dim(FL_KERNEL_ARGS) { /* sum.dim_IntList(self, dim?, keepdim, dtype?) */
    FL_UNUSED_KERNEL_ARGS;
    GET_X;
    int mode = 0;
    return run_reduce(x, n_args > 1 ? &args[1] : NULL, bool_arg(args, n_args, 2), out, 1, OP_SUM, &mode, fin_value, 0, 0, 0);
}
static int k_sum(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    GET_X;
    int mode = 0;
    return run_reduce(x, NULL, 0, out, 1, OP_SUM, &mode, fin_value, 0, 0, 0);
}
static int k_mean_dim(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    GET_X;
    if (!fl_is_floating(out[0].dtype)) return UNSUP;
    int mode = 1;
    return run_reduce(x, n_args > 1 ? &args[1] : NULL, bool_arg(args, n_args, 2), out, 1, OP_SUM, &mode, fin_value, 1, 0, 0);
}
static int k_mean(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    GET_X;
    if (!fl_is_floating(out[0].dtype)) return UNSUP;
    int mode = 1;
    return run_reduce(x, NULL, 0, out, 1, OP_SUM, &mode, fin_value, 1, 0, 0);
}
static int k_prod(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    GET_X;
    return run_reduce(x, NULL, 0, out, 1, OP_PROD, NULL, fin_value, 0, 0, 0);
}
static int k_prod_dim(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    GET_X;
    if (n_args < 2 || args[1].kind != FL_ARG_INT) return UNSUP;
    return run_reduce(x, &args[1], bool_arg(args, n_args, 2), out, 1, OP_PROD, NULL, fin_value, 0, 0, 0);
}
static int empty_reduce_check(const fl_tensor_t *x, const fl_arg_t *dims) {
    uint32_t mask;
    if (parse_dims(dims, x->ndim, &mask)) return 0;
    for (int d = 0; d < x->ndim; d++)
        if ((mask & (1u << d)) && x->sizes[d] == 0) return 1;
    return 0;
}
static int extreme(FL_KERNEL_ARGS, int op, const fl_arg_t *dims, int keepdim, int nouts) {
    FL_UNUSED_KERNEL_ARGS;
    GET_X;
    if (fl_numel(x) == 0 && empty_reduce_check(x, dims)) /* the runtime raises PyTorch's exact error first */
        FL_FAIL(FL_ERR_INVALID, "%s(): Expected reduction dim to be specified for input.numel() == 0, or a non-zero "
                "size", op == OP_MAX ? "max" : "min");
    if (nouts > n_out) return UNSUP;
    fl_tensor_t outs[2] = {out[0], {.data = NULL, .ndim = -1}};
    if (nouts == 2) outs[1] = out[1];
    return run_reduce(x, dims, keepdim, outs, nouts, op, NULL, fin_value, 0, 0, 0);
}
static int k_amax(FL_KERNEL_ARGS) { return extreme(stream, device, in, n_in, out, n_out, args, n_args, OP_MAX, n_args > 1 ? &args[1] : NULL, bool_arg(args, n_args, 2), 1); }
static int k_amin(FL_KERNEL_ARGS) { return extreme(stream, device, in, n_in, out, n_out, args, n_args, OP_MIN, n_args > 1 ? &args[1] : NULL, bool_arg(args, n_args, 2), 1); }
static int k_max(FL_KERNEL_ARGS) { return extreme(stream, device, in, n_in, out, n_out, args, n_args, OP_MAX, NULL, 0, 1); }
static int k_min(FL_KERNEL_ARGS) { return extreme(stream, device, in, n_in, out, n_out, args, n_args, OP_MIN, NULL, 0, 1); }
static int k_max_dim(FL_KERNEL_ARGS) {
    if (n_args < 2 || args[1].kind != FL_ARG_INT || n_out < 2) return UNSUP;
    return extreme(stream, device, in, n_in, out, n_out, args, n_args, OP_MAX, &args[1], bool_arg(args, n_args, 2), 2);
}
static int k_min_dim(FL_KERNEL_ARGS) {
    if (n_args < 2 || args[1].kind != FL_ARG_INT || n_out < 2) return UNSUP;
    return extreme(stream, device, in, n_in, out, n_out, args, n_args, OP_MIN, &args[1], bool_arg(args, n_args, 2), 2);
}
static int argext(FL_KERNEL_ARGS, int op) { /* argmax(self, dim?, keepdim) */
    FL_UNUSED_KERNEL_ARGS;
    GET_X;
    const fl_arg_t *dims = n_args > 1 ? &args[1] : NULL;
    if (dims && dims->kind != FL_ARG_NONE && dims->kind != FL_ARG_INT) return UNSUP;
    if (empty_reduce_check(x, dims) || (fl_numel(x) == 0 && (!dims || dims->kind == FL_ARG_NONE)))
        FL_FAIL(FL_ERR_INVALID, "%s(): Expected reduction dim to be specified for input.numel() == 0.",
                op == OP_MAX ? "argmax" : "argmin");
    return run_reduce(x, dims, bool_arg(args, n_args, 2), out, 1, op, NULL, fin_argidx, 0, 0, 0);
}
static int k_argmax(FL_KERNEL_ARGS) { return argext(stream, device, in, n_in, out, n_out, args, n_args, OP_MAX); }
static int k_argmin(FL_KERNEL_ARGS) { return argext(stream, device, in, n_in, out, n_out, args, n_args, OP_MIN); }

static int varstd(FL_KERNEL_ARGS, int mode) { /* var.correction(self, dim?, correction?, keepdim) */
    FL_UNUSED_KERNEL_ARGS;
    GET_X;
    if (!fl_is_floating(x->dtype) || !fl_is_floating(out[0].dtype)) return UNSUP;
    int nouts = mode >= 4 ? 2 : 1;
    if (n_out < nouts) return UNSUP;
    double ctx[2];
    int *m = (int *)&ctx[0];
    *m = mode;
    ctx[1] = (n_args > 2 && fl_arg_is_num(&args[2])) ? fl_arg_num(&args[2]) : 1.0;
    return run_reduce(x, n_args > 1 ? &args[1] : NULL, bool_arg(args, n_args, 3), out, nouts, OP_VAR, ctx, fin_value, 1, 0, 0);
}
static int k_var(FL_KERNEL_ARGS) { return varstd(stream, device, in, n_in, out, n_out, args, n_args, 2); }
static int k_std(FL_KERNEL_ARGS) { return varstd(stream, device, in, n_in, out, n_out, args, n_args, 3); }
static int k_var_mean(FL_KERNEL_ARGS) { return varstd(stream, device, in, n_in, out, n_out, args, n_args, 4); }
static int k_std_mean(FL_KERNEL_ARGS) { return varstd(stream, device, in, n_in, out, n_out, args, n_args, 5); }

static int anyall(FL_KERNEL_ARGS, int op, int has_dim) {
    FL_UNUSED_KERNEL_ARGS;
    GET_X;
    return run_reduce(x, has_dim && n_args > 1 ? &args[1] : NULL, has_dim ? bool_arg(args, n_args, 2) : 0, out, 1, op,
                      NULL, fin_value, 0, 0, 0);
}
static int k_any(FL_KERNEL_ARGS) { return anyall(stream, device, in, n_in, out, n_out, args, n_args, OP_ANY, 0); }
static int k_any_dim(FL_KERNEL_ARGS) { return anyall(stream, device, in, n_in, out, n_out, args, n_args, OP_ANY, 1); }
static int k_all(FL_KERNEL_ARGS) { return anyall(stream, device, in, n_in, out, n_out, args, n_args, OP_ALL, 0); }
static int k_all_dim(FL_KERNEL_ARGS) { return anyall(stream, device, in, n_in, out, n_out, args, n_args, OP_ALL, 1); }

static int norm_common(const fl_tensor_t *x, const fl_arg_t *ordarg, const fl_arg_t *dims, int keepdim,
                       const fl_tensor_t *out) {
    if (!fl_is_floating(x->dtype) || !fl_is_floating(out->dtype)) return UNSUP;
    double ord = (ordarg && fl_arg_is_num(ordarg)) ? fl_arg_num(ordarg) : 2.0;
    int norm = ord == 2 ? NORM_2 : ord == 1 ? NORM_1 : ord == INFINITY ? NORM_INF : ord == -INFINITY ? NORM_NINF
               : ord == 0 ? NORM_0 : NORM_P;
    if ((norm == NORM_INF || norm == NORM_NINF) && empty_reduce_check(x, dims))
        FL_FAIL(FL_ERR_INVALID, "linalg.vector_norm cannot compute the inf norm on an empty tensor");
    if (norm == NORM_P && ord < 0 && empty_reduce_check(x, dims)) return UNSUP;
    return run_reduce(x, dims, keepdim, out, 1, OP_NORM, NULL, fin_value, 1, norm, ord);
}
static int k_vector_norm(FL_KERNEL_ARGS) { /* linalg_vector_norm(self, ord, dim?, keepdim, dtype?) */
    FL_UNUSED_KERNEL_ARGS;
    GET_X;
    return norm_common(x, n_args > 1 ? &args[1] : NULL, n_args > 2 ? &args[2] : NULL, bool_arg(args, n_args, 3), &out[0]);
}
static int k_norm_scalar(FL_KERNEL_ARGS) { /* norm.Scalar(self, p) */
    FL_UNUSED_KERNEL_ARGS;
    GET_X;
    return norm_common(x, n_args > 1 ? &args[1] : NULL, NULL, 0, &out[0]);
}
static int k_norm_dim(FL_KERNEL_ARGS) { /* norm.ScalarOpt_dim(self, p?, dim, keepdim) */
    FL_UNUSED_KERNEL_ARGS;
    GET_X;
    if (n_args < 3 || args[2].kind != FL_ARG_INT_LIST || args[2].len == 0) return UNSUP;
    return norm_common(x, &args[1], &args[2], bool_arg(args, n_args, 3), &out[0]);
}
static int k_logsumexp(FL_KERNEL_ARGS) { /* logsumexp(self, dim[], keepdim) */
    FL_UNUSED_KERNEL_ARGS;
    GET_X;
    if (!fl_is_floating(out[0].dtype)) return UNSUP;
    if (n_args < 2 || args[1].kind != FL_ARG_INT_LIST) return UNSUP;
    if (args[1].len == 0) return UNSUP; /* empty dim list: elementwise in PyTorch */
    return run_reduce(x, &args[1], bool_arg(args, n_args, 2), out, 1, OP_LSE, NULL, fin_value, 1, 0, 0);
}

/* ------------------------------------------------------------------ */
/* row-wise ops along one dim: cumsum, softmax family                  */
/* ------------------------------------------------------------------ */
/* The rows along dim of n tensors of one shape (fl_rows_init lets the size along dim differ). */
static int same_rows(fl_rows_t *r, const fl_tensor_t *const *ts, int n, int dim) {
    if (fl_rows_init(r, ts, n, dim)) return -1;
    for (int k = 1; k < n; k++)
        if (ts[0]->ndim && ts[k]->sizes[dim] != r->len) return -1;
    return 0;
}
static int k_cumsum(FL_KERNEL_ARGS) { /* cumsum(self, dim, dtype?) ; cumsum_ */
    FL_UNUSED_KERNEL_ARGS;
    GET_X;
    if (n_args < 2 || args[1].kind != FL_ARG_INT || !fl_tensor_ok(&out[0])) return UNSUP;
    int dim;
    if (fl_wrap_dim(args[1].i, x->ndim, &dim)) FL_FAIL(FL_ERR_INVALID, "cumsum: dimension out of range");
    const fl_tensor_t *ts[2] = {&out[0], x};
    fl_rows_t r;
    if (same_rows(&r, ts, 2, dim)) return UNSUP;
    int intmode = !fl_is_floating(out[0].dtype);
    if (r.len == 0 || r.nrows == 0) return FL_OK;
    int err = 0;
#pragma omp parallel if (r.nrows * r.len >= PAR_MIN)
    {
        double *buf = malloc(sizeof(double) * (size_t)r.len);
        if (!buf) {
#pragma omp atomic write
            err = 1;
        }
#pragma omp for schedule(static)
        for (int64_t row = 0; row < r.nrows; row++) {
            if (!buf) continue;
            int64_t off[2];
            fl_rows_at(&r, ts, row, off);
            if (intmode) {
                int64_t *b = (int64_t *)buf;
                fl_cvt_row(FL_INT64, b, 1, x->dtype, fl_elem(x, off[1]), r.st[1], r.len);
                uint64_t acc = 0;
                for (int64_t i = 0; i < r.len; i++) { acc += (uint64_t)b[i]; b[i] = (int64_t)acc; }
                fl_cvt_row(out[0].dtype, fl_elem(&out[0], off[0]), r.st[0], FL_INT64, b, 1, r.len);
            } else {
                fl_cvt_row(FL_FLOAT64, buf, 1, x->dtype, fl_elem(x, off[1]), r.st[1], r.len);
                double acc = 0;
                for (int64_t i = 0; i < r.len; i++) { acc += buf[i]; buf[i] = acc; }
                fl_cvt_row(out[0].dtype, fl_elem(&out[0], off[0]), r.st[0], FL_FLOAT64, buf, 1, r.len);
            }
        }
        free(buf);
    }
    if (err) FL_FAIL(FL_ERR_OOM, "cumsum: out of host memory");
    return FL_OK;
}

/* softmax family: kind 0 softmax, 1 log_softmax, 2 safe softmax,
 * 3 softmax backward, 4 log_softmax backward. Rows computed in float for
 * float32/f16/bf16 and in double for float64; sums in double. */
static int softmax_rows(const fl_tensor_t *o, const fl_tensor_t *a, const fl_tensor_t *b, int dim, int kind) {
    if (!fl_is_floating(o->dtype) || !fl_is_floating(a->dtype) || (b && !fl_is_floating(b->dtype))) return UNSUP;
    const fl_tensor_t *ts[3] = {o, a, b};
    fl_rows_t r;
    if (same_rows(&r, ts, b ? 3 : 2, dim)) return UNSUP;
    if (r.len == 0 || r.nrows == 0) return FL_OK;
    int dbl = o->dtype == FL_FLOAT64 || a->dtype == FL_FLOAT64;
    int err = 0;
    int64_t L = r.len;
#pragma omp parallel if (r.nrows * L >= PAR_MIN / 4)
    {
        double *mem = malloc(sizeof(double) * (size_t)L * 2);
        if (!mem) {
#pragma omp atomic write
            err = 1;
        }
#pragma omp for schedule(static)
        for (int64_t row = 0; row < r.nrows; row++) {
            if (!mem) continue;
            int64_t off[3];
            fl_rows_at(&r, ts, row, off);
            if (!dbl) {
                float *x = (float *)mem, *y = (float *)(mem + L);
                fl_cvt_row(FL_FLOAT32, x, 1, a->dtype, fl_elem(a, off[1]), r.st[1], L);
                if (kind <= 2) {
                    float mx = -INFINITY;
                    for (int64_t i = 0; i < L; i++) mx = x[i] > mx ? x[i] : mx;
                    for (int64_t i = 0; i < L; i++) if (x[i] != x[i]) { mx = x[i]; break; }
                    if (kind == 2 && mx == -INFINITY) {
                        for (int64_t i = 0; i < L; i++) y[i] = 0;
                    } else if (kind == 1) {
                        double s = 0;
                        for (int64_t i = 0; i < L; i++) y[i] = fl_vexpf(x[i] - mx);
                        s = sum_fd(y, L);
                        float ls = (float)log(s);
                        for (int64_t i = 0; i < L; i++) y[i] = x[i] - mx - ls;
                    } else {
                        double s = 0;
                        for (int64_t i = 0; i < L; i++) y[i] = fl_vexpf(x[i] - mx);
                        s = sum_fd(y, L);
                        float inv = (float)(1.0 / s);
                        for (int64_t i = 0; i < L; i++) y[i] *= inv;
                    }
                } else { /* x = grad, y = output */
                    fl_cvt_row(FL_FLOAT32, y, 1, b->dtype, fl_elem(b, off[2]), r.st[2], L);
                    double s = 0;
                    if (kind == 3) {
                        for (int64_t i = 0; i < L; i++) s += (double)x[i] * y[i];
                        float fs = (float)s;
                        for (int64_t i = 0; i < L; i++) y[i] = y[i] * (x[i] - fs);
                    } else {
                        for (int64_t i = 0; i < L; i++) s += x[i];
                        float fs = (float)s;
                        for (int64_t i = 0; i < L; i++) y[i] = x[i] - fl_vexpf(y[i]) * fs;
                    }
                }
                fl_cvt_row(o->dtype, fl_elem(o, off[0]), r.st[0], FL_FLOAT32, y, 1, L);
            } else {
                double *x = mem, *y = mem + L;
                fl_cvt_row(FL_FLOAT64, x, 1, a->dtype, fl_elem(a, off[1]), r.st[1], L);
                if (kind <= 2) {
                    double mx = -INFINITY;
                    for (int64_t i = 0; i < L; i++) mx = x[i] > mx ? x[i] : mx;
                    for (int64_t i = 0; i < L; i++) if (x[i] != x[i]) { mx = x[i]; break; }
                    if (kind == 2 && mx == -INFINITY) {
                        for (int64_t i = 0; i < L; i++) y[i] = 0;
                    } else if (kind == 1) {
                        double s = 0;
                        for (int64_t i = 0; i < L; i++) s += exp(x[i] - mx);
                        double ls = log(s);
                        for (int64_t i = 0; i < L; i++) y[i] = x[i] - mx - ls;
                    } else {
                        double s = 0;
                        for (int64_t i = 0; i < L; i++) { y[i] = exp(x[i] - mx); s += y[i]; }
                        double inv = 1.0 / s;
                        for (int64_t i = 0; i < L; i++) y[i] *= inv;
                    }
                } else {
                    fl_cvt_row(FL_FLOAT64, y, 1, b->dtype, fl_elem(b, off[2]), r.st[2], L);
                    double s = 0;
                    if (kind == 3) {
                        for (int64_t i = 0; i < L; i++) s += x[i] * y[i];
                        for (int64_t i = 0; i < L; i++) y[i] = y[i] * (x[i] - s);
                    } else {
                        for (int64_t i = 0; i < L; i++) s += x[i];
                        for (int64_t i = 0; i < L; i++) y[i] = x[i] - exp(y[i]) * s;
                    }
                }
                fl_cvt_row(o->dtype, fl_elem(o, off[0]), r.st[0], FL_FLOAT64, y, 1, L);
            }
        }
        free(mem);
    }
    if (err) FL_FAIL(FL_ERR_OOM, "softmax: out of host memory");
    return FL_OK;
}
static int softmax_k(FL_KERNEL_ARGS, int kind) {
    FL_UNUSED_KERNEL_ARGS;
    GET_X;
    if (n_args < 2 || args[1].kind != FL_ARG_INT || !fl_tensor_ok(&out[0])) return UNSUP;
    int dim;
    if (fl_wrap_dim(args[1].i, x->ndim, &dim)) FL_FAIL(FL_ERR_INVALID, "softmax: dimension out of range");
    return softmax_rows(&out[0], x, NULL, dim, kind);
}
static int k_softmax(FL_KERNEL_ARGS) { return softmax_k(stream, device, in, n_in, out, n_out, args, n_args, 0); }
static int k_log_softmax(FL_KERNEL_ARGS) { return softmax_k(stream, device, in, n_in, out, n_out, args, n_args, 1); }
static int k_safe_softmax(FL_KERNEL_ARGS) { return softmax_k(stream, device, in, n_in, out, n_out, args, n_args, 2); }
static int softmax_bw_k(FL_KERNEL_ARGS, int kind) { /* (grad_output, output, dim, input_dtype) */
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *g = fl_arg_tensor(args, n_args, 0, in, n_in), *y = fl_arg_tensor(args, n_args, 1, in, n_in);
    if (!g || !y || n_out < 1 || !fl_tensor_ok(&out[0]) || n_args < 3 || args[2].kind != FL_ARG_INT) return UNSUP;
    int dim;
    if (fl_wrap_dim(args[2].i, g->ndim, &dim)) FL_FAIL(FL_ERR_INVALID, "softmax backward: dimension out of range");
    return softmax_rows(&out[0], g, y, dim, kind);
}
static int k_softmax_bw(FL_KERNEL_ARGS) { return softmax_bw_k(stream, device, in, n_in, out, n_out, args, n_args, 3); }
static int k_log_softmax_bw(FL_KERNEL_ARGS) { return softmax_bw_k(stream, device, in, n_in, out, n_out, args, n_args, 4); }

/* ------------------------------------------------------------------ */
/* table                                                               */
/* ------------------------------------------------------------------ */
#define ALL FL_ALL_DTYPES
#define FLT FL_FLOATS
#define NUM (FL_FLOATS | FL_INTS)
#define E(name, mask, fn) {name, mask, 0, fn}

static const fl_kernel_entry_t entries[] = {
    E("aten::sum.dim_IntList", ALL, k_sum_dim),
    E("aten::sum", ALL, k_sum),
    E("aten::mean.dim", ALL, k_mean_dim),
    E("aten::mean", ALL, k_mean),
    E("aten::prod", ALL, k_prod),
    E("aten::prod.dim_int", ALL, k_prod_dim),
    E("aten::amax", ALL, k_amax),
    E("aten::amin", ALL, k_amin),
    E("aten::max", ALL, k_max),
    E("aten::min", ALL, k_min),
    E("aten::max.dim", ALL, k_max_dim),
    E("aten::min.dim", ALL, k_min_dim),
    E("aten::argmax", ALL, k_argmax),
    E("aten::argmin", ALL, k_argmin),
    E("aten::var.correction", FLT, k_var),
    E("aten::std.correction", FLT, k_std),
    E("aten::var_mean.correction", FLT, k_var_mean),
    E("aten::std_mean.correction", FLT, k_std_mean),
    E("aten::any", ALL, k_any),
    E("aten::any.dim", ALL, k_any_dim),
    E("aten::any.dims", ALL, k_any_dim),
    E("aten::all", ALL, k_all),
    E("aten::all.dim", ALL, k_all_dim),
    E("aten::all.dims", ALL, k_all_dim),
    E("aten::linalg_vector_norm", FLT, k_vector_norm),
    E("aten::norm.Scalar", FLT, k_norm_scalar),
    E("aten::norm.ScalarOpt_dim", FLT, k_norm_dim),
    E("aten::logsumexp", ALL, k_logsumexp),
    E("aten::cumsum", ALL, k_cumsum),
    E("aten::cumsum_", ALL, k_cumsum),
    E("aten::_softmax", FLT, k_softmax),
    E("aten::_log_softmax", FLT, k_log_softmax),
    E("aten::_safe_softmax", FLT, k_safe_softmax),
    E("aten::_softmax_backward_data", FLT, k_softmax_bw),
    E("aten::_log_softmax_backward_data", FLT, k_log_softmax_bw),
};

const fl_kernel_group_t fl_host_group_reduce = {entries, (int)(sizeof entries / sizeof entries[0])};
