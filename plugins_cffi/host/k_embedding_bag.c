/* Host kernels: _embedding_bag and its backward ops (dense, sparse-as-dense,
 * per-sample weights).
 * Scratch I/O, argument helpers and the planes x (D, H, W) layout: k_nn.h. */
#include "k_nn.h"

/* ======================================================================
 * Embedding bags: _embedding_bag(weight, indices, offsets, scale_grad_by_freq,
 * mode, sparse, per_sample_weights, include_last_offset, padding_idx)
 *   -> (output, offset2bag, bag_size, max_indices)
 * mode 0 sum, 1 mean, 2 max. Bag b covers indices [offsets[b], offsets[b+1])
 * (the last bag runs to the end of indices). Auxiliary outputs follow CPU:
 * offset2bag always filled, bag_size counts non-padding indices (0 for sum),
 * max_indices the arg-max row per (bag, feature) for max, bag_size for mean,
 * zeros for sum.
 * ====================================================================== */

/* offset2bag from offsets; checks them like ATen */
static int make_offset2bag(const int64_t *off, int64_t n_off, int64_t numel, int64_t bags, int64_t *o2b) {
    if (bags > 0 && numel > 0 && off[0] != 0)
        FL_FAIL(FL_ERR_INVALID, "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from "
                "position 0. However, got %ld", (long)off[0]);
    for (int64_t b = 0; b < n_off; b++) {
        if (off[b] > numel)
            FL_FAIL(FL_ERR_INVALID, "offsets[%ld] can not be greater than input's length %ld, but got %ld", (long)b,
                    (long)numel, (long)off[b]);
        if (b > 0 && off[b] < off[b - 1])
            FL_FAIL(FL_ERR_INVALID, "embedding_bag: offsets must be non-decreasing, got %ld after %ld", (long)off[b],
                    (long)off[b - 1]);
    }
    for (int64_t b = 0; b < bags; b++) {
        int64_t end = b + 1 < bags ? off[b + 1] : numel;
        for (int64_t i = off[b]; i < end; i++) o2b[i] = b;
    }
    if (bags == 0)
        for (int64_t i = 0; i < numel; i++) o2b[i] = 0;
    return FL_OK;
}

static int k_embedding_bag(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *w = IN(0), *ix = IN(1), *of = IN(2), *psw = IN(6);
    const fl_tensor_t *y = OUT(0), *o2b = OUT(1), *bsz = OUT(2), *mxi = OUT(3);
    if (!w || !ix || !of || !y || !is_float(w->dtype) || y->dtype != w->dtype || n_args < 9 || w->ndim != 2 ||
        (psw && psw->dtype != w->dtype))
        return FL_ERR_UNSUPPORTED;
    if ((ix->dtype != FL_INT64 && ix->dtype != FL_INT32) || (of->dtype != FL_INT64 && of->dtype != FL_INT32))
        return FL_ERR_UNSUPPORTED;
    if ((o2b && o2b->dtype != FL_INT64 && o2b->dtype != FL_INT32) || (bsz && bsz->dtype != FL_INT64 && bsz->dtype != FL_INT32) ||
        (mxi && mxi->dtype != FL_INT64 && mxi->dtype != FL_INT32))
        return FL_ERR_UNSUPPORTED;
    const int mode = (int)args[4].i, last = args[7].i != 0;
    const int64_t pad = args[8].i, V = w->sizes[0], D = w->sizes[1], numel = fl_numel(ix), n_off = fl_numel(of);
    const int64_t bags = last ? n_off - 1 : n_off;
    if (ix->ndim != 1 || of->ndim != 1) FL_FAIL(FL_ERR_INVALID, "embedding_bag: input has to be 1D with offsets");
    if (mode < 0 || mode > 2) FL_FAIL(FL_ERR_INVALID, "embedding_bag: unknown mode %d", mode);
    if (psw && (mode != 0 || fl_numel(psw) != numel))
        FL_FAIL(FL_ERR_INVALID, "embedding_bag: per_sample_weights only supported with mode='sum' and one weight per index");
    if (bags < 0 || fl_numel(y) != bags * D) FL_FAIL(FL_ERR_INVALID, "embedding_bag: output shape does not match the bags");
    io_t io = {0};
    const double *wp = io_in(&io, w, FL_FLOAT64), *sp = psw ? io_in(&io, psw, FL_FLOAT64) : NULL;
    const int64_t *ip = io_in(&io, ix, FL_INT64), *op = io_in(&io, of, FL_INT64);
    double *yp = io_out(&io, y, FL_FLOAT64, 1);
    int64_t *o2 = malloc((size_t)(numel + 1) * sizeof(int64_t)), *cnt = calloc((size_t)(bags + 1), sizeof(int64_t));
    int64_t *mx = mode == 2 ? calloc((size_t)(bags * D + 1), sizeof(int64_t)) : NULL;
    if (!wp || (psw && !sp) || !ip || !op || !yp || !o2 || !cnt || (mode == 2 && !mx)) {
        free(o2); free(cnt); free(mx);
        IO_OOM(&io, "embedding_bag");
    }
    int st = make_offset2bag(op, n_off, numel, bags, o2);
    for (int64_t i = 0; i < numel && !st; i++)
        if (ip[i] < 0 || ip[i] >= V) {
            fl_host_set_error("embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx to be %ld", (long)ip[i]);
            st = FL_ERR_INVALID;
        }
    if (!st) {
        for (int64_t i = 0; i < numel && bags > 0; i++) {
            int64_t b = o2[i], r = ip[i];
            if (r == pad) continue;
            const double *row = wp + r * D;
            double *o = yp + b * D;
            if (mode == 2) {
                for (int64_t d = 0; d < D; d++)
                    if (cnt[b] == 0 || row[d] > o[d]) { o[d] = row[d]; mx[b * D + d] = r; }
            } else {
                double s = sp ? sp[i] : 1.0;
                for (int64_t d = 0; d < D; d++) o[d] += s * row[d];
            }
            cnt[b]++;
        }
        if (mode == 1)
            for (int64_t b = 0; b < bags; b++)
                if (cnt[b] > 0)
                    for (int64_t d = 0; d < D; d++) yp[b * D + d] /= (double)cnt[b];
        /* auxiliary outputs, as CPU fills them */
        const fl_tensor_t *aux[3] = {o2b, bsz, mxi};
        for (int k = 0; k < 3; k++) {
            const fl_tensor_t *t = aux[k];
            if (!t) continue;
            int64_t n = fl_numel(t), *buf = io_out(&io, t, FL_INT64, 1);
            if (!buf) { st = FL_ERR_OOM; break; }
            for (int64_t i = 0; i < n; i++) {
                int64_t v = 0;
                if (k == 0) v = i < numel ? o2[i] : 0;
                else if (k == 1 || mode == 1) v = (mode != 0 && i < bags) ? cnt[i] : 0;
                else if (mode == 2) v = i < bags * D ? mx[i] : 0;
                buf[i] = v;
            }
        }
    }
    free(o2); free(cnt); free(mx);
    io_end(&io, st);
    if (st == FL_ERR_OOM) FL_FAIL(st, "embedding_bag: cannot allocate scratch");
    return st;
}

/* scale_grad_by_freq divisors, as ATen's CPU kernel computes them: it sorts the
 * indices and, for the g-th group of equal indices, divides by the count of
 * sorted[g] (not of the group's own index). That is what CPU returns, so the
 * plugin reproduces it: count[] (occurrences per value) becomes the divisor
 * per value. */
static int freq_divisors(const int64_t *ip, int64_t numel, int64_t V, int64_t *count) {
    int64_t *sorted = malloc((size_t)(numel + 1) * sizeof(int64_t)), *div = malloc((size_t)(V + 1) * sizeof(int64_t));
    if (!sorted || !div) { free(sorted); free(div); FL_FAIL(FL_ERR_OOM, "embedding_bag_backward: cannot allocate scratch"); }
    memcpy(sorted, ip, (size_t)numel * sizeof(int64_t));
    qsort(sorted, (size_t)numel, sizeof(int64_t), fl_cmp_i64);
    for (int64_t v = 0; v < V; v++) div[v] = 1;
    for (int64_t i = 0, g = 0; i < numel; g++) {
        int64_t j = i;
        while (j < numel && sorted[j] == sorted[i]) j++;
        int64_t key = sorted[g];
        if (sorted[i] >= 0 && sorted[i] < V && key >= 0 && key < V) div[sorted[i]] = count[key];
        i = j;
    }
    memcpy(count, div, (size_t)V * sizeof(int64_t));
    free(sorted); free(div);
    return FL_OK;
}

/* _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
 *                               scale_grad_by_freq, mode, per_sample_weights, padding_idx) -> (num_weights, D) */
/* the dense weight gradient; offsets (may be NULL) rebuild an empty offset2bag */
static int emb_dense_bwd(const fl_tensor_t *g, const fl_tensor_t *ix, const fl_tensor_t *of, const fl_tensor_t *o2b,
                         const fl_tensor_t *bsz, const fl_tensor_t *mxi, const fl_tensor_t *psw, int64_t V, int freq,
                         int mode, int64_t pad, const fl_tensor_t *gw) {
    if (!g || !ix || !o2b || !bsz || !mxi || !gw || !is_float(g->dtype) || gw->dtype != g->dtype ||
        g->ndim != 2 || gw->ndim != 2 || (psw && psw->dtype != g->dtype))
        return FL_ERR_UNSUPPORTED;
    const int64_t numel = fl_numel(ix), B = g->sizes[0], D = g->sizes[1];
    int64_t *own = NULL;
    if (gw->sizes[0] != V || gw->sizes[1] != D) FL_FAIL(FL_ERR_INVALID, "embedding_bag_backward: grad_weight shape");
    if (mode != 2 && numel > 0 && fl_numel(o2b) == 0 && of) { /* CPU's sum fast path leaves offset2bag empty */
        io_t io0 = {0};
        const int64_t *op = io_in(&io0, of, FL_INT64);
        own = malloc((size_t)numel * sizeof(int64_t));
        int st0 = (!op || !own) ? FL_ERR_OOM : make_offset2bag(op, fl_numel(of), numel, fl_numel(of), own);
        io_end(&io0, st0);
        if (st0) { free(own); if (st0 == FL_ERR_OOM) FL_FAIL(st0, "embedding_bag_backward: cannot allocate scratch"); return st0; }
    }
    if (mode != 2 && numel > 0 && fl_numel(o2b) != numel && !own)
        FL_FAIL(FL_ERR_INVALID, "embedding_bag_backward: offset2bag has %ld entries for %ld indices",
                (long)fl_numel(o2b), (long)numel);
    if (mode == 2 && fl_numel(mxi) != B * D) FL_FAIL(FL_ERR_INVALID, "embedding_bag_backward: max_indices shape");
    io_t io = {0};
    const double *gp = io_in(&io, g, FL_FLOAT64), *sp = psw ? io_in(&io, psw, FL_FLOAT64) : NULL;
    const int64_t *ip = io_in(&io, ix, FL_INT64), *bp = own ? own : io_in(&io, o2b, FL_INT64);
    const int64_t *szp = io_in(&io, bsz, FL_INT64), *mp = io_in(&io, mxi, FL_INT64);
    double *wp = io_out(&io, gw, FL_FLOAT64, 1);
    int64_t *count = freq ? calloc((size_t)(V + 1), sizeof(int64_t)) : NULL;
    if (!gp || (psw && !sp) || !ip || !bp || !szp || !mp || !wp || (freq && !count)) {
        free(count); free(own);
        IO_OOM(&io, "embedding_bag_backward");
    }
    int st = FL_OK;
    if (mode == 2) {
        for (int64_t b = 0; b < B && !st; b++) {
            if (b < fl_numel(bsz) && szp[b] == 0) continue; /* ATen skips empty bags */
            for (int64_t d = 0; d < D; d++) {
                int64_t r = mp[b * D + d];
                if (r < 0 || r >= V) { fl_host_set_error("embedding_bag_backward: max index %ld out of range [0, %ld)", (long)r, (long)V); st = FL_ERR_INVALID; break; }
                wp[r * D + d] += gp[b * D + d];
            }
        }
    } else {
        for (int64_t i = 0; i < numel && freq; i++)
            if (ip[i] >= 0 && ip[i] < V) count[ip[i]]++;
        if (freq && !st) st = freq_divisors(ip, numel, V, count);
        for (int64_t i = 0; i < numel && !st; i++) {
            int64_t r = ip[i], b = bp[i];
            if (r == pad) continue;
            if (r < 0 || r >= V || b < 0 || b >= B) {
                fl_host_set_error("embedding_bag_backward: index %ld / bag %ld out of range", (long)r, (long)b);
                st = FL_ERR_INVALID;
                break;
            }
            double s = sp ? sp[i] : 1.0;
            if (mode == 1 && b < fl_numel(bsz) && szp[b] > 0) s /= (double)szp[b];
            if (freq) s /= (double)count[r]; /* count[] now holds the divisor per index value */
            for (int64_t d = 0; d < D; d++) wp[r * D + d] += s * gp[b * D + d];
        }
    }
    free(count); free(own);
    return io_end(&io, st);
}
static int k_embedding_bag_dense_bwd(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 10) return FL_ERR_UNSUPPORTED;
    return emb_dense_bwd(IN(0), IN(1), NULL, IN(2), IN(3), IN(4), IN(8), args[5].i, args[6].i != 0, (int)args[7].i,
                         args[9].i, OUT(0));
}
/* _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
 *                         scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx): dense only */
static int k_embedding_bag_bwd(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 12 || args[9].i != 0) return FL_ERR_UNSUPPORTED;
    return emb_dense_bwd(IN(0), IN(1), IN(2), IN(3), IN(4), IN(5), IN(10), args[6].i, args[7].i != 0, (int)args[8].i,
                         args[11].i, OUT(0));
}

/* _embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx)
 *   -> (numel,): grad . weight[index] per index, 0 for padding */
static int k_embedding_bag_psw_bwd(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    const fl_tensor_t *g = IN(0), *w = IN(1), *ix = IN(2), *of = IN(3), *o2b = IN(4), *y = OUT(0);
    if (!g || !w || !ix || !of || !o2b || !y || !is_float(g->dtype) || w->dtype != g->dtype || y->dtype != g->dtype ||
        n_args < 7 || g->ndim != 2 || w->ndim != 2)
        return FL_ERR_UNSUPPORTED;
    if (args[5].i != 0) FL_FAIL(FL_ERR_INVALID, "embedding_bag_backward: per_sample_weights only supported for mode='sum'");
    const int64_t pad = args[6].i, numel = fl_numel(ix), B = g->sizes[0], D = g->sizes[1], V = w->sizes[0];
    if (fl_numel(y) != numel || w->sizes[1] != D) FL_FAIL(FL_ERR_INVALID, "embedding_bag_backward: shapes disagree");
    io_t io = {0};
    const double *gp = io_in(&io, g, FL_FLOAT64), *wp = io_in(&io, w, FL_FLOAT64);
    const int64_t *ip = io_in(&io, ix, FL_INT64), *op = io_in(&io, of, FL_INT64), *bp = io_in(&io, o2b, FL_INT64);
    double *yp = io_out(&io, y, FL_FLOAT64, 1);
    int64_t *own = NULL;
    if (!gp || !wp || !ip || !op || !bp || !yp) IO_OOM(&io, "embedding_bag_backward");
    int st = FL_OK;
    if (numel > 0 && fl_numel(o2b) == 0) { /* CPU's sum fast path leaves offset2bag empty: rebuild it */
        own = malloc((size_t)numel * sizeof(int64_t));
        if (!own) { io_end(&io, FL_ERR_OOM); FL_FAIL(FL_ERR_OOM, "embedding_bag_backward: cannot allocate scratch"); }
        st = make_offset2bag(op, fl_numel(of), numel, fl_numel(of), own);
        bp = own;
    }
    for (int64_t i = 0; i < numel && !st; i++) {
        int64_t r = ip[i], b = bp[i];
        if (r == pad) continue;
        if (r < 0 || r >= V || b < 0 || b >= B) {
            fl_host_set_error("embedding_bag_backward: index %ld / bag %ld out of range", (long)r, (long)b);
            st = FL_ERR_INVALID;
            break;
        }
        double s = 0.0;
        for (int64_t d = 0; d < D; d++) s += gp[b * D + d] * wp[r * D + d];
        yp[i] = s;
    }
    free(own);
    return io_end(&io, st);
}

/* ======================================================================
 * Table
 * ====================================================================== */
static const fl_kernel_entry_t entries[] = {
    {"aten::_embedding_bag", FL_FLOATS, 0, k_embedding_bag},
    {"aten::_embedding_bag_backward", FL_FLOATS, 0, k_embedding_bag_bwd},
    {"aten::_embedding_bag_dense_backward", FL_FLOATS, 0, k_embedding_bag_dense_bwd},
    {"aten::_embedding_bag_per_sample_weights_backward", FL_FLOATS, 0, k_embedding_bag_psw_bwd},
};

const fl_kernel_group_t fl_host_group_embedding_bag = {entries, (int)(sizeof entries / sizeof entries[0])};
