/* Host kernels: discrete Fourier transforms (PyTorch's three FFT primitives).
 *
 *   aten::_fft_r2c(self, dim, normalization, onesided)   real -> complex, forward
 *   aten::_fft_c2c(self, dim, normalization, forward)    complex -> complex
 *   aten::_fft_c2r(self, dim, normalization, last_dim_size)  complex -> real, backward
 *
 * Every torch.fft function lowers to these (torch/_refs/fft.py). A multi-dimensional
 * transform is a 1-D transform along each listed dim in turn. `normalization` is
 * PyTorch's fft_norm_mode (SpectralOpsUtils.h): 0 none, 1 divide by sqrt(n), 2 divide by n,
 * n being the product of the signal sizes over `dim` (the output's sizes for c2r).
 *
 * 1-D transforms of any length are O(n log n): an iterative radix-2 FFT for powers of two,
 * Bluestein's chirp-z algorithm (a power-of-two circular convolution) for the rest.
 * Everything is computed in double in a contiguous scratch array, whatever the strides
 * of the input and output and their precision (float32/complex64 or float64/complex128).
 *
 * c2r, as PyTorch's CPU kernel: an inverse c2c over dim[:-1], then a 1-D c2r along dim[-1]
 * that reads the first last_dim_size/2 + 1 entries, completes them by Hermitian symmetry
 * and keeps the real part (the imaginary parts of the zero and Nyquist entries are ignored).
 */
#include <stdlib.h>

#include "fl_host.h"

#define UNSUP FL_ERR_UNSUPPORTED
#define PAR_MIN 32768

typedef fl_cx_t cx;

static inline cx cmul(cx a, cx b) { return (cx){a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re}; }
static inline cx cconj(cx a) { return (cx){a.re, -a.im}; }

/* ---- 1-D plans ---- */
typedef struct {
    int64_t n;     /* transform length */
    int64_t m;     /* power-of-two length the butterflies run at (n, or Bluestein's m >= 2n - 1) */
    int sign;      /* -1 forward, +1 inverse */
    cx *tw;        /* m/2 twiddles exp(-2 pi i k / m) */
    cx *chirp;     /* Bluestein: w_k = exp(sign pi i k^2 / n), k < n */
    cx *chirp_fft; /* Bluestein: FFT of the conjugate chirp b, length m */
} plan_t;

static int is_pow2(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

/* in-place radix-2 FFT of length m (a power of two); sign -1 forward, +1 inverse */
static void fft_pow2(cx *a, int64_t m, const cx *tw, int sign) {
    for (int64_t i = 1, j = 0; i < m; i++) { /* bit reversal */
        int64_t bit = m >> 1;
        for (; j & bit; bit >>= 1) j ^= bit;
        j ^= bit;
        if (i < j) { cx t = a[i]; a[i] = a[j]; a[j] = t; }
    }
    for (int64_t len = 2; len <= m; len <<= 1) {
        int64_t half = len >> 1, step = m / len;
        for (int64_t s = 0; s < m; s += len)
            for (int64_t k = 0; k < half; k++) {
                cx w = tw[k * step];
                if (sign > 0) w.im = -w.im;
                cx u = a[s + k], v = cmul(a[s + k + half], w);
                a[s + k] = (cx){u.re + v.re, u.im + v.im};
                a[s + k + half] = (cx){u.re - v.re, u.im - v.im};
            }
    }
}

static void plan_free(plan_t *p) {
    free(p->tw); free(p->chirp); free(p->chirp_fft);
    p->tw = p->chirp = p->chirp_fft = NULL;
}

static int plan_make(plan_t *p, int64_t n, int sign) {
    memset(p, 0, sizeof *p);
    p->n = n;
    p->sign = sign;
    int64_t m = n;
    if (!is_pow2(n)) for (m = 1; m < 2 * n - 1; m <<= 1) {}
    p->m = m;
    p->tw = malloc(sizeof(cx) * (size_t)(m / 2 + 1));
    if (!p->tw) return -1;
    for (int64_t k = 0; k < m / 2 + 1; k++) {
        double ang = -2.0 * M_PI * (double)k / (double)m;
        p->tw[k] = (cx){cos(ang), sin(ang)};
    }
    if (m == n) return 0;
    p->chirp = malloc(sizeof(cx) * (size_t)n);
    p->chirp_fft = calloc((size_t)m, sizeof(cx));
    if (!p->chirp || !p->chirp_fft) { plan_free(p); return -1; }
    for (int64_t k = 0; k < n; k++) {
        /* k^2 mod 2n keeps the angle exact for large k */
        int64_t k2 = (int64_t)(((unsigned __int128)k * (unsigned __int128)k) % (unsigned __int128)(2 * n));
        double ang = (double)sign * M_PI * (double)k2 / (double)n;
        p->chirp[k] = (cx){cos(ang), sin(ang)};
    }
    p->chirp_fft[0] = cconj(p->chirp[0]);
    for (int64_t k = 1; k < n; k++) p->chirp_fft[k] = p->chirp_fft[m - k] = cconj(p->chirp[k]);
    fft_pow2(p->chirp_fft, m, p->tw, -1);
    return 0;
}

/* x (length n) <- its DFT with the plan's sign; work holds m elements (Bluestein only) */
static void plan_run(const plan_t *p, cx *x, cx *work) {
    int64_t n = p->n, m = p->m;
    if (n == 1) return;
    if (m == n) { fft_pow2(x, n, p->tw, p->sign); return; }
    for (int64_t k = 0; k < n; k++) work[k] = cmul(x[k], p->chirp[k]);
    for (int64_t k = n; k < m; k++) work[k] = (cx){0, 0};
    fft_pow2(work, m, p->tw, -1);
    for (int64_t k = 0; k < m; k++) work[k] = cmul(work[k], p->chirp_fft[k]);
    fft_pow2(work, m, p->tw, +1);
    double inv = 1.0 / (double)m;
    for (int64_t k = 0; k < n; k++) {
        cx c = {work[k].re * inv, work[k].im * inv};
        x[k] = cmul(c, p->chirp[k]);
    }
}

/* ---- a contiguous complex double scratch array of up to FL_MAX_DIMS dims ---- */
typedef struct {
    int ndim;
    int64_t sizes[FL_MAX_DIMS], strides[FL_MAX_DIMS], numel;
    cx *data;
} grid_t;

static int grid_make(grid_t *g, int ndim, const int64_t *sizes) {
    g->ndim = ndim;
    g->numel = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        g->sizes[d] = sizes[d];
        g->strides[d] = g->numel;
        g->numel *= sizes[d];
    }
    g->data = calloc((size_t)(g->numel ? g->numel : 1), sizeof(cx));
    return g->data ? 0 : -1;
}

/* DFT of every line of g along dim d (sign -1 forward, +1 inverse) */
static int grid_fft(grid_t *g, int d, int sign) {
    int64_t n = g->sizes[d], stride = g->strides[d];
    if (n <= 1 || g->numel == 0) return 0;
    plan_t p;
    if (plan_make(&p, n, sign)) return -1;
    int64_t lines = g->numel / n;
    int failed = 0;
#pragma omp parallel if (g->numel >= PAR_MIN)
    {
        cx *buf = malloc(sizeof(cx) * (size_t)(n + (p.m == n ? 0 : p.m)));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t l = 0; l < lines; l++) {
            if (!buf) continue;
            int64_t outer = l / stride, inner = l % stride;
            cx *line = g->data + outer * n * stride + inner;
            for (int64_t k = 0; k < n; k++) buf[k] = line[k * stride];
            plan_run(&p, buf, buf + n);
            for (int64_t k = 0; k < n; k++) line[k * stride] = buf[k];
        }
        free(buf);
    }
    plan_free(&p);
    return failed ? -1 : 0;
}

/* Walk every element of t (row-major over t's sizes); fn gets t's element address and the
 * offset of the same multi-index in g (whose sizes are >= t's in every dim). */
#define WALK(t, g, BODY)                                                                  \
    do {                                                                                  \
        int64_t idx_[FL_MAX_DIMS] = {0}, toff_ = (t)->offset, goff_ = 0;                  \
        int64_t n_ = fl_numel(t);                                                         \
        size_t isz_ = fl_itemsize((t)->dtype);                                            \
        for (int64_t e_ = 0; e_ < n_; e_++) {                                             \
            char *ptr = (char *)(t)->data + toff_ * (int64_t)isz_;                        \
            int64_t gi = goff_;                                                           \
            BODY;                                                                         \
            for (int d_ = (t)->ndim - 1; d_ >= 0; d_--) {                                 \
                if (++idx_[d_] < (t)->sizes[d_]) {                                        \
                    toff_ += (t)->strides[d_]; goff_ += (g)->strides[d_];                 \
                    break;                                                                \
                }                                                                         \
                toff_ -= (idx_[d_] - 1) * (t)->strides[d_];                               \
                goff_ -= (idx_[d_] - 1) * (g)->strides[d_];                               \
                idx_[d_] = 0;                                                             \
            }                                                                             \
        }                                                                                 \
    } while (0)

static void grid_load(grid_t *g, const fl_tensor_t *t) {
    WALK(t, g, g->data[gi] = fl_load_cx(t->dtype, ptr));
}

static void grid_store(const grid_t *g, const fl_tensor_t *t, double scale) {
    WALK(t, g, fl_store_cx(t->dtype, ptr, ((cx){g->data[gi].re * scale, g->data[gi].im * scale})));
}

/* ---- argument checks shared by the three kernels ---- */
typedef struct {
    const fl_tensor_t *in, *out;
    int ndims, dims[FL_MAX_DIMS];
    int64_t norm;
} fft_call_t;

static int real_of(int cdt) { return cdt == FL_COMPLEX64 ? FL_FLOAT32 : cdt == FL_COMPLEX128 ? FL_FLOAT64 : -1; }

static int parse(const char *op, FL_KERNEL_ARGS, int in_complex, int out_complex, fft_call_t *c) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_args < 4 || args[0].kind != FL_ARG_TENSOR || args[0].i < 0 || args[0].i >= n_in) return UNSUP;
    if (n_out < 1 || out[0].ndim < 0) return UNSUP;
    c->in = &in[args[0].i];
    c->out = &out[0];
    int di = c->in->dtype, dout = c->out->dtype;
    /* the precision pairs PyTorch allows: float32 <-> complex64, float64 <-> complex128 */
    int ci = in_complex ? fl_is_complex(di) : (di == FL_FLOAT32 || di == FL_FLOAT64);
    int co = out_complex ? fl_is_complex(dout) : (dout == FL_FLOAT32 || dout == FL_FLOAT64);
    if (!ci || !co) return UNSUP;
    int pi = in_complex ? real_of(di) : di, po = out_complex ? real_of(dout) : dout;
    if (pi != po) return UNSUP;
    if (c->in->ndim != c->out->ndim || c->in->ndim > FL_MAX_DIMS) return UNSUP;
    if (args[1].kind != FL_ARG_INT_LIST || args[2].kind != FL_ARG_INT) return UNSUP;
    c->ndims = args[1].len;
    c->norm = args[2].i;
    if (c->norm < 0 || c->norm > 2)
        FL_FAIL(FL_ERR_INVALID, "%s: unsupported normalization %lld (0 none, 1 by sqrt(n), 2 by n)", op,
                (long long)c->norm);
    unsigned seen = 0;
    for (int k = 0; k < c->ndims; k++) {
        int64_t d = args[1].list[k];
        if (d < 0) d += c->in->ndim;
        if (d < 0 || d >= c->in->ndim)
            FL_FAIL(FL_ERR_INVALID, "%s: dim %lld out of range for a %d-dim tensor", op, (long long)args[1].list[k],
                    c->in->ndim);
        if (seen & (1u << d)) FL_FAIL(FL_ERR_INVALID, "%s: dim %lld appears twice", op, (long long)d);
        seen |= 1u << d;
        c->dims[k] = (int)d;
    }
    return FL_OK;
}

static double norm_scale(int64_t norm, const int64_t *sizes, const int *dims, int ndims) {
    if (norm == 0) return 1.0;
    double n = 1.0;
    for (int k = 0; k < ndims; k++) n *= (double)sizes[dims[k]];
    if (n == 0.0) return 1.0;
    return norm == 1 ? 1.0 / sqrt(n) : 1.0 / n;
}

#define OOM(op) FL_FAIL(FL_ERR_OOM, "%s: cannot allocate the transform's scratch memory", op)

static int k_fft_c2c(FL_KERNEL_ARGS) {
    fft_call_t c;
    int st = parse("_fft_c2c", stream, device, in, n_in, out, n_out, args, n_args, 1, 1, &c);
    if (st) return st;
    if (args[3].kind != FL_ARG_BOOL && args[3].kind != FL_ARG_INT) return UNSUP;
    for (int d = 0; d < c.in->ndim; d++)
        if (c.in->sizes[d] != c.out->sizes[d]) FL_FAIL(FL_ERR_INVALID, "_fft_c2c: output shape differs from input");
    grid_t g;
    if (grid_make(&g, c.in->ndim, c.in->sizes)) OOM("_fft_c2c");
    grid_load(&g, c.in);
    int sign = args[3].i ? -1 : +1;
    for (int k = 0; k < c.ndims; k++)
        if (grid_fft(&g, c.dims[k], sign)) { free(g.data); OOM("_fft_c2c"); }
    grid_store(&g, c.out, norm_scale(c.norm, c.in->sizes, c.dims, c.ndims));
    free(g.data);
    return FL_OK;
}

static int k_fft_r2c(FL_KERNEL_ARGS) {
    fft_call_t c;
    int st = parse("_fft_r2c", stream, device, in, n_in, out, n_out, args, n_args, 0, 1, &c);
    if (st) return st;
    if (args[3].kind != FL_ARG_BOOL && args[3].kind != FL_ARG_INT) return UNSUP;
    if (c.ndims == 0) FL_FAIL(FL_ERR_INVALID, "_fft_r2c: dim must name at least one dimension");
    int last = c.dims[c.ndims - 1];
    for (int d = 0; d < c.in->ndim; d++) {
        int64_t want = d == last && args[3].i ? c.in->sizes[d] / 2 + 1 : c.in->sizes[d];
        if (c.out->sizes[d] != want)
            FL_FAIL(FL_ERR_INVALID, "_fft_r2c: output size %lld at dim %d, expected %lld", (long long)c.out->sizes[d],
                    d, (long long)want);
    }
    grid_t g; /* the full two-sided spectrum; a onesided output stores its first half */
    if (grid_make(&g, c.in->ndim, c.in->sizes)) OOM("_fft_r2c");
    grid_load(&g, c.in);
    for (int k = 0; k < c.ndims; k++)
        if (grid_fft(&g, c.dims[k], -1)) { free(g.data); OOM("_fft_r2c"); }
    grid_store(&g, c.out, norm_scale(c.norm, c.in->sizes, c.dims, c.ndims));
    free(g.data);
    return FL_OK;
}

static int k_fft_c2r(FL_KERNEL_ARGS) {
    fft_call_t c;
    int st = parse("_fft_c2r", stream, device, in, n_in, out, n_out, args, n_args, 1, 0, &c);
    if (st) return st;
    if (c.ndims == 0) FL_FAIL(FL_ERR_INVALID, "_fft_c2r: dim must name at least one dimension");
    int last = c.dims[c.ndims - 1];
    int64_t L = c.out->sizes[last], half = L / 2 + 1;
    if (args[3].kind == FL_ARG_INT && args[3].i != L)
        FL_FAIL(FL_ERR_INVALID, "_fft_c2r: output size %lld at dim %d, expected last_dim_size %lld", (long long)L,
                last, (long long)args[3].i);
    if (L < 1) FL_FAIL(FL_ERR_INVALID, "_fft_c2r: last_dim_size must be positive, got %lld", (long long)L);
    for (int d = 0; d < c.in->ndim; d++)
        if (d != last && c.in->sizes[d] != c.out->sizes[d])
            FL_FAIL(FL_ERR_INVALID, "_fft_c2r: output shape differs from input at dim %d", d);
    if (c.in->sizes[last] < half)
        FL_FAIL(FL_ERR_INVALID, "_fft_c2r: the input holds %lld entries along dim %d; last_dim_size %lld needs %lld",
                (long long)c.in->sizes[last], last, (long long)L, (long long)half);
    if (fl_numel(c.out) == 0) return FL_OK;
    grid_t h, g;
    if (grid_make(&h, c.in->ndim, c.in->sizes)) OOM("_fft_c2r");
    grid_load(&h, c.in);
    for (int k = 0; k + 1 < c.ndims; k++)
        if (grid_fft(&h, c.dims[k], +1)) { free(h.data); OOM("_fft_c2r"); }
    if (grid_make(&g, c.out->ndim, c.out->sizes)) { free(h.data); OOM("_fft_c2r"); }
    /* Hermitian completion of each line along the last dim */
    int64_t hs = h.strides[last], gs = g.strides[last], lines = g.numel / L;
    for (int64_t l = 0; l < lines; l++) {
        int64_t outer = l / gs, inner = l % gs;
        const cx *src = h.data + outer * h.sizes[last] * hs + inner;
        cx *dst = g.data + outer * L * gs + inner;
        for (int64_t k = 0; k < half; k++) dst[k * gs] = src[k * hs];
        for (int64_t k = 1; k < L - half + 1; k++) dst[(L - k) * gs] = cconj(src[k * hs]);
    }
    free(h.data);
    if (grid_fft(&g, last, +1)) { free(g.data); OOM("_fft_c2r"); }
    grid_store(&g, c.out, norm_scale(c.norm, c.out->sizes, c.dims, c.ndims)); /* keeps the real part */
    free(g.data);
    return FL_OK;
}

#define E(name, mask, fn) {name, mask, 0, fn}
static const fl_kernel_entry_t entries[] = {
    /* the lookup dtype is self's: real for r2c, complex for c2c and c2r */
    E("aten::_fft_r2c", FL_F32 | FL_F64, k_fft_r2c),
    E("aten::_fft_c2c", FL_COMPLEX, k_fft_c2c),
    E("aten::_fft_c2r", FL_COMPLEX, k_fft_c2r),
};
const fl_kernel_group_t fl_host_group_fft = {entries, (int)(sizeof entries / sizeof entries[0])};
