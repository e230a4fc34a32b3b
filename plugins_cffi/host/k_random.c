/* Host kernels: random fills -- uniform_, normal_, exponential_, bernoulli(_),
 * random_, native_dropout: counter-based draws (fl_rand_uniform), so a result
 * depends on the seed and offset only, never on the thread count. The engine's
 * helpers they use: k_elementwise.h. */
#pragma GCC optimize("no-math-errno") /* as in every file of the family (k_elementwise.h) */
#include "k_elementwise.h"

/* ------------------------------------------------------------------ */
/* random                                                              */
/* ------------------------------------------------------------------ */
static inline uint64_t rand_bits(uint64_t seed, uint64_t counter) { return fl_splitmix64(seed ^ fl_splitmix64(counter)); }

enum { R_UNIFORM, R_NORMAL, R_BERN, R_INT, R_EXP };

/* out[k] (logical index k) = f(k); p: a, b parameters; ibase/irange for ints */
/* The largest value of a floating dtype at or below the integer v: random integers drawn in [from, to) stay
 * below `to` after the cast (rounding to nearest would turn to - 1 into `to` once the dtype's spacing
 * exceeds 1, as PyTorch's CPU kernel never does). */
static void store_int_floor(int dt, void *p, int64_t v) {
    if (dt != FL_FLOAT16 && dt != FL_BFLOAT16 && dt != FL_FLOAT32) {
        fl_store_f64(dt, p, (double)v);
        return;
    }
    float f = (float)v;
    if ((double)f > (double)v) f = nextafterf(f, -INFINITY);
    fl_store_f64(dt, p, f);
    if (dt == FL_FLOAT32 || fl_load_f64(dt, p) <= (double)v) return;
    uint16_t *h = (uint16_t *)p; /* one step down: magnitude down for positives, up for negatives */
    if (fl_load_f64(dt, p) > 0) *h -= 1; else *h += 1;
}

static int rand_fill(int device, const fl_tensor_t *t, int kind, double a, double b, int64_t ifrom, uint64_t irange) {
    int64_t n = fl_numel(t);
    if (n == 0) return FL_OK;
    uint64_t seed;
    uint64_t per = kind == R_NORMAL ? 2 : 1;
    uint64_t start = fl_host_rng_reserve(device, (uint64_t)n * per, &seed);
    fl_iter_t it;
    fl_iter_init(&it, 1, (const fl_tensor_t *[]){t});
    int64_t nchunk = (it.inner + CH - 1) / CH, units = it.outer * nchunk;
    int isint = kind == R_INT;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (int64_t u = 0; u < units; u++) {
        double buf[CH];
        int64_t ibuf[CH];
        int64_t row = u / nchunk, c0 = (u % nchunk) * CH;
        int64_t len = it.inner - c0 < CH ? it.inner - c0 : CH;
        uint64_t k0 = (uint64_t)(row * it.inner + c0);
        for (int64_t i = 0; i < len; i++) {
            uint64_t k = k0 + (uint64_t)i;
            switch (kind) {
            case R_UNIFORM: buf[i] = a + (b - a) * fl_rand_uniform(seed, start + k); break;
            case R_NORMAL: {
                double u1 = fl_rand_uniform(seed, start + 2 * k), u2 = fl_rand_uniform(seed, start + 2 * k + 1);
                buf[i] = a + b * sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
                break;
            }
            case R_BERN: buf[i] = fl_rand_uniform(seed, start + k) < a ? 1.0 : 0.0; break;
            case R_EXP: buf[i] = -log1p(-fl_rand_uniform(seed, start + k)) / a; break;
            case R_INT: ibuf[i] = (int64_t)((uint64_t)ifrom + (irange ? rand_bits(seed, start + k) % irange : rand_bits(seed, start + k))); break;
            }
        }
        int64_t base[FL_ITER_MAX];
        fl_iter_row(&it, row, base);
        if (isint && fl_is_floating(t->dtype)) {
            for (int64_t i = 0; i < len; i++)
                store_int_floor(t->dtype, fl_elem(t, base[0] + (c0 + i) * it.inner_stride[0]), ibuf[i]);
        } else if (isint) fl_cvt_row(t->dtype, fl_elem(t, base[0] + c0 * it.inner_stride[0]), it.inner_stride[0], FL_INT64, ibuf, 1, len);
        else fl_cvt_row(t->dtype, fl_elem(t, base[0] + c0 * it.inner_stride[0]), it.inner_stride[0], FL_FLOAT64, buf, 1, len);
    }
    return FL_OK;
}

static int k_uniform_(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (!fl_is_floating(out[0].dtype) || n_args < 3) return UNSUP;
    double a = fl_arg_num(&args[1]), b = fl_arg_num(&args[2]);
    if (!(a <= b)) FL_FAIL(FL_ERR_INVALID, "uniform_ expects to return a [from, to) range, but found from=%g > to=%g", a, b);
    return rand_fill(device, &out[0], R_UNIFORM, a, b, 0, 0);
}
static int k_normal_(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (!fl_is_floating(out[0].dtype) || n_args < 3) return UNSUP;
    double m = fl_arg_num(&args[1]), s = fl_arg_num(&args[2]);
    if (s < 0) FL_FAIL(FL_ERR_INVALID, "normal expects std >= 0.0, but found std %g", s);
    return rand_fill(device, &out[0], R_NORMAL, m, s, 0, 0);
}
static int k_exponential_(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (!fl_is_floating(out[0].dtype) || n_args < 2) return UNSUP;
    double l = fl_arg_num(&args[1]);
    if (!(l > 0)) FL_FAIL(FL_ERR_INVALID, "exponential_ expects lambda > 0.0, but found lambda=%g", l);
    return rand_fill(device, &out[0], R_EXP, l, 0, 0, 0);
}
static int k_bernoulli_f(FL_KERNEL_ARGS) { /* bernoulli_.float(self, p), bernoulli.p(self, p) */
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (n_args < 2 || !fl_arg_is_num(&args[1])) return UNSUP;
    double p = fl_arg_num(&args[1]);
    if (!(p >= 0 && p <= 1)) FL_FAIL(FL_ERR_INVALID, "bernoulli_ expects p to be in [0, 1], but got p=%g", p);
    return rand_fill(device, &out[0], R_BERN, p, 0, 0, 0);
}
/* bernoulli(self) / bernoulli_.Tensor(self, p): probabilities from a tensor */
static int bern_tensor(int device, const fl_tensor_t *o, const fl_tensor_t *prob) {
    fl_tensor_t pb;
    if (fl_bcast(prob, o->ndim, o->sizes, &pb)) return UNSUP;
    int64_t n = fl_numel(o);
    if (n == 0) return FL_OK;
    uint64_t seed, start = fl_host_rng_reserve(device, (uint64_t)n, &seed);
    fl_iter_t it;
    fl_iter_init(&it, 2, (const fl_tensor_t *[]){o, &pb});
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (int64_t r = 0; r < it.outer; r++) {
        int64_t base[FL_ITER_MAX];
        fl_iter_row(&it, r, base);
        for (int64_t i = 0; i < it.inner; i++) {
            double pv = fl_load_f64(pb.dtype, fl_elem(&pb, base[1] + i * it.inner_stride[1]));
            double v = fl_rand_uniform(seed, start + (uint64_t)(r * it.inner + i)) < pv ? 1.0 : 0.0;
            fl_store_f64(o->dtype, fl_elem(o, base[0] + i * it.inner_stride[0]), v);
        }
    }
    return FL_OK;
}
static int k_bernoulli(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (n_args < 1 || args[0].kind != FL_ARG_TENSOR || args[0].i >= n_in) return UNSUP;
    if (!fl_is_floating(in[args[0].i].dtype)) return UNSUP;
    return bern_tensor(device, &out[0], &in[args[0].i]);
}
static int k_bernoulli_t(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (n_args < 2) return UNSUP;
    if (fl_arg_is_num(&args[1])) return k_bernoulli_f(stream, device, in, n_in, out, n_out, args, n_args);
    if (args[1].kind != FL_ARG_TENSOR || args[1].i >= n_in) return UNSUP;
    return bern_tensor(device, &out[0], &in[args[1].i]);
}

static int dtype_int_range(int dt, int64_t *lo, int64_t *hi) {
    switch (dt) {
    case FL_INT64: *lo = INT64_MIN; *hi = INT64_MAX; return 0;
    case FL_INT32: *lo = INT32_MIN; *hi = INT32_MAX; return 0;
    case FL_INT16: *lo = INT16_MIN; *hi = INT16_MAX; return 0;
    case FL_INT8: *lo = INT8_MIN; *hi = INT8_MAX; return 0;
    case FL_UINT8: *lo = 0; *hi = 255; return 0;
    case FL_BOOL: *lo = 0; *hi = 1; return 0;
    case FL_FLOAT32: *lo = -(1ll << 24); *hi = 1ll << 24; return 0;
    case FL_FLOAT64: *lo = -(1ll << 53); *hi = 1ll << 53; return 0;
    case FL_FLOAT16: *lo = -(1ll << 11); *hi = 1ll << 11; return 0;
    case FL_BFLOAT16: *lo = -(1ll << 8); *hi = 1ll << 8; return 0;
    }
    return -1;
}
/* values in [from, to) ; to_incl: [from, hi] */
static int random_range(int device, const fl_tensor_t *t, int64_t from, int64_t to, int to_incl) {
    uint64_t range = to_incl ? (uint64_t)to - (uint64_t)from + 1 : (uint64_t)to - (uint64_t)from;
    if (!to_incl && to <= from) FL_FAIL(FL_ERR_INVALID, "random_ expects 'from' to be less than 'to', but got from=%lld >= to=%lld",
                                         (long long)from, (long long)to);
    return rand_fill(device, t, R_INT, 0, 0, from, range); /* range 0 means all 2^64 values */
}
static int k_random_from(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (n_args < 3 || args[1].kind != FL_ARG_INT) return UNSUP;
    int64_t lo, hi;
    if (dtype_int_range(out[0].dtype, &lo, &hi)) return UNSUP;
    if (args[2].kind == FL_ARG_NONE) return random_range(device, &out[0], args[1].i, hi, 1);
    if (args[2].kind != FL_ARG_INT) return UNSUP;
    return random_range(device, &out[0], args[1].i, args[2].i, 0);
}
static int k_random_to(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    if (n_args < 2 || args[1].kind != FL_ARG_INT) return UNSUP;
    return random_range(device, &out[0], 0, args[1].i, 0);
}
static int k_random_(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    CHECK_OUT;
    int64_t lo, hi;
    if (dtype_int_range(out[0].dtype, &lo, &hi)) return UNSUP;
    return random_range(device, &out[0], 0, hi, 1);
}

/* native_dropout(input, p, train?) -> (output, mask) */
static int k_native_dropout(FL_KERNEL_ARGS) {
    FL_UNUSED_KERNEL_ARGS;
    if (n_out < 2 || !fl_out_ok(out, n_out) || fl_out_ok(out + 1, 1) == 0 || out[1].ndim != out[0].ndim) return UNSUP;
    if (n_args < 3 || args[0].kind != FL_ARG_TENSOR || args[0].i >= n_in || !fl_arg_is_num(&args[1])) return UNSUP;
    if (!fl_is_floating(out[0].dtype)) return UNSUP;
    double p = fl_arg_num(&args[1]);
    int train = args[2].kind == FL_ARG_NONE ? 1 : (int)args[2].i;
    fl_tensor_t x;
    if (fl_bcast(&in[args[0].i], out[0].ndim, out[0].sizes, &x)) return UNSUP;
    for (int d = 0; d < out[0].ndim; d++)
        if (out[1].sizes[d] != out[0].sizes[d]) return UNSUP;
    int64_t n = fl_numel(&out[0]);
    if (!train || n == 0) {
        fl_ew_copy_strided(&out[0], &x);
        uint8_t one = 1;
        fl_tensor_t s = {.data = &one, .dtype = FL_BOOL, .ndim = 0}, sb;
        fl_bcast(&s, out[1].ndim, out[1].sizes, &sb);
        fl_ew_copy_strided(&out[1], &sb);
        return FL_OK;
    }
    if (!(p >= 0 && p <= 1)) FL_FAIL(FL_ERR_INVALID, "dropout probability has to be between 0 and 1, but got %g", p);
    double keep = 1.0 - p;
    float scale = keep > 0 ? (float)(1.0 / keep) : 0.0f;
    double dscale = keep > 0 ? 1.0 / keep : 0.0;
    uint64_t seed, start = fl_host_rng_reserve(device, (uint64_t)n, &seed);
    fl_iter_t it;
    fl_iter_init(&it, 3, (const fl_tensor_t *[]){&out[0], &out[1], &x});
    int64_t nchunk = (it.inner + CH - 1) / CH, units = it.outer * nchunk;
    int ct = ct_of(out[0].dtype);
    const fl_tensor_t *o0 = &out[0], *o1 = &out[1];
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (int64_t u = 0; u < units; u++) {
        double xb[CH], ob[CH];
        uint8_t mb[CH];
        int64_t row = u / nchunk, c0 = (u % nchunk) * CH;
        int64_t len = it.inner - c0 < CH ? it.inner - c0 : CH;
        uint64_t k0 = (uint64_t)(row * it.inner + c0);
        int64_t base[FL_ITER_MAX];
        fl_iter_row(&it, row, base);
        for (int64_t i = 0; i < len; i++) mb[i] = keep > 0 && fl_rand_uniform(seed, start + k0 + (uint64_t)i) < keep;
        if (ct == CT_F) {
            float *xf = (float *)xb, *of = (float *)ob;
            fl_cvt_row(FL_FLOAT32, xf, 1, x.dtype, fl_elem(&x, base[2] + c0 * it.inner_stride[2]), it.inner_stride[2], len);
            for (int64_t i = 0; i < len; i++) of[i] = mb[i] ? xf[i] * scale : 0.0f;
            fl_cvt_row(o0->dtype, fl_elem(o0, base[0] + c0 * it.inner_stride[0]), it.inner_stride[0], FL_FLOAT32, of, 1, len);
        } else {
            fl_cvt_row(FL_FLOAT64, xb, 1, x.dtype, fl_elem(&x, base[2] + c0 * it.inner_stride[2]), it.inner_stride[2], len);
            for (int64_t i = 0; i < len; i++) ob[i] = mb[i] ? xb[i] * dscale : 0.0;
            fl_cvt_row(o0->dtype, fl_elem(o0, base[0] + c0 * it.inner_stride[0]), it.inner_stride[0], FL_FLOAT64, ob, 1, len);
        }
        fl_cvt_row(o1->dtype, fl_elem(o1, base[1] + c0 * it.inner_stride[1]), it.inner_stride[1], FL_BOOL, mb, 1, len);
    }
    return FL_OK;
}

/* ------------------------------------------------------------------ */
/* table                                                               */
/* ------------------------------------------------------------------ */
static const fl_kernel_entry_t entries[] = {
    /* random */
    E("aten::uniform_", FLT, k_uniform_),
    E("aten::normal_", FLT, k_normal_),
    E("aten::exponential_", FLT, k_exponential_),
    E("aten::bernoulli_.float", ALL, k_bernoulli_f),
    E("aten::bernoulli.p", ALL, k_bernoulli_f),
    E("aten::bernoulli_.Tensor", ALL, k_bernoulli_t),
    E("aten::bernoulli", FLT, k_bernoulli),
    E("aten::random_.from", ALL, k_random_from),
    E("aten::random_.to", ALL, k_random_to),
    E("aten::random_", ALL, k_random_),
    E("aten::native_dropout", FLT, k_native_dropout),
};

const fl_kernel_group_t fl_host_group_random = {entries, (int)(sizeof entries / sizeof entries[0])};
