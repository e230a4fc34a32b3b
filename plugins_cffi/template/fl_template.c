/*
 * fl_template.c — a complete, minimal torch_fl plugin to copy and adapt.
 *
 * It is a real plugin: torch_fl loads it, allocates tensors through it and
 * runs its kernels. Its "device" is ordinary host memory obtained with
 * malloc, but it deliberately does NOT declare FL_FEATURE_HOST_ACCESSIBLE, so
 * the runtime treats that memory exactly like an accelerator's: every byte
 * moves through copy_h2d / copy_d2h / copy_d2d, never through a host pointer.
 * That makes the template exercise the same runtime paths your chip will.
 *
 * To port it to a chip, replace, in this order:
 *   1. dev_malloc / dev_free / the three copies   (your driver's allocator and DMA)
 *   2. the kernels at the bottom                  (launch your device code)
 *   3. name / vendor / description / emulated    (in fl_plugin_init)
 * Everything else (error reporting, argument checks, the kernel table) stays.
 *
 * Build:  make            (or: cc -O2 -shared -fPIC -fvisibility=hidden -I../include \
 *                               fl_template.c -o libfl_template.so)
 * Only fl_plugin.h, fl_kernel_util.h (header-only helpers: the strided
 * iterator, argument accessors, size parsing) and the C library are used.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_plugin.h"
#include "fl_kernel_util.h"

#define TEMPLATE_NAME "template"
#define DEFAULT_MEMORY_LIMIT (256ull << 20) /* 256 MiB; env FL_TEMPLATE_MEMORY_LIMIT overrides */

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */
/* The runtime reads fl_last_error() right after a call returned non-FL_OK, on
 * the same thread. Calls arrive from several threads (the user's threads and
 * PyTorch's autograd thread for backward), so the message buffer must be
 * thread-local: a global buffer would let one thread's error overwrite
 * another's before it is read. */
static _Thread_local char tl_error[512];

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int fail(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_error, sizeof tl_error, fmt, ap);
    va_end(ap);
    return status;
}

static const char *last_error(void) { return tl_error; }

/* A kernel that declines a call: not an error, the runtime tries its next
 * tier (decomposition, JIT, CPU fallback). The message is kept for
 * debugging only; the runtime does not raise on FL_ERR_UNSUPPORTED. */
#define DECLINE(...) fail(FL_ERR_UNSUPPORTED, __VA_ARGS__)

static int check_device(int device) {
    if (device != 0) return fail(FL_ERR_INVALID, TEMPLATE_NAME ": there is one device (0), got device %d", device);
    return FL_OK;
}

/* ------------------------------------------------------------------------ */
/* Devices                                                                  */
/* ------------------------------------------------------------------------ */
static uint64_t memory_limit = DEFAULT_MEMORY_LIMIT;

static int device_count(int *count) {
    if (!count) return fail(FL_ERR_INVALID, TEMPLATE_NAME ": device_count(NULL)");
    *count = 1;
    return FL_OK;
}

static int device_props(int device, fl_device_props_t *p) {
    int st = check_device(device);
    if (st) return st;
    if (!p) return fail(FL_ERR_INVALID, TEMPLATE_NAME ": device_props with a NULL props pointer");
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "template device (host memory)");
    p->total_memory = memory_limit;
    /* The dtypes the device computes in. The runtime only sends a kernel
     * calls whose lookup dtype is both in the kernel's mask and in this one;
     * tensors of other dtypes can still live on the device (the CPU fallback
     * serves them). */
    p->dtypes = FL_DTYPE_BIT(FL_FLOAT32) | FL_DTYPE_BIT(FL_FLOAT64);
    /* No FL_FEATURE_HOST_ACCESSIBLE: the runtime must copy, never dereference. */
    p->features = 0;
    p->compute_units = 1;
    return FL_OK;
}

/* ------------------------------------------------------------------------ */
/* Memory                                                                   */
/* ------------------------------------------------------------------------ */
/* Each block carries a small header in front of the pointer we hand out, so
 * free() knows how many bytes to give back to the accounting, and can reject
 * a pointer it never handed out (the commonest bug: freeing base+offset).
 * On a real device this bookkeeping usually lives in the driver. */
typedef struct {
    uint64_t magic;
    uint64_t nbytes;
} block_hdr_t;
#define HDR_SIZE 64 /* keeps the returned pointer 64-byte aligned */
#define BLOCK_MAGIC 0xf17e3a91c0ffee11ull
#define BLOCK_FREED 0xdeadf7eedeadf7eeull

static atomic_uint_fast64_t used_bytes;

/* Reserve nbytes against the limit; 0 on success. A compare-and-swap loop, so
 * two threads allocating at once can never both squeeze past the limit. */
static int reserve(uint64_t nbytes) {
    uint_fast64_t now = atomic_load(&used_bytes);
    do {
        if (nbytes > memory_limit || now > memory_limit - nbytes) return -1;
    } while (!atomic_compare_exchange_weak(&used_bytes, &now, now + nbytes));
    return 0;
}

static int dev_malloc(int device, size_t nbytes, void **ptr) {
    int st = check_device(device);
    if (st) return st;
    if (!ptr) return fail(FL_ERR_INVALID, TEMPLATE_NAME ": malloc with a NULL result pointer");
    *ptr = NULL;
    if (reserve(nbytes))
        return fail(FL_ERR_OOM, TEMPLATE_NAME ": cannot allocate %zu bytes: %llu of %llu bytes in use", nbytes,
                    (unsigned long long)atomic_load(&used_bytes), (unsigned long long)memory_limit);
    /* nbytes == 0 still gets a unique, freeable pointer (the header alone). */
    void *block = NULL;
    if (nbytes <= SIZE_MAX - 2 * HDR_SIZE) /* C11 aligned_alloc wants a multiple of the alignment */
        block = aligned_alloc(HDR_SIZE, (HDR_SIZE + nbytes + HDR_SIZE - 1) / HDR_SIZE * HDR_SIZE);
    if (!block) {
        atomic_fetch_sub(&used_bytes, nbytes);
        return fail(FL_ERR_OOM, TEMPLATE_NAME ": the host refused %zu bytes", nbytes);
    }
    block_hdr_t *h = block;
    h->magic = BLOCK_MAGIC;
    h->nbytes = nbytes;
    *ptr = (char *)block + HDR_SIZE;
    return FL_OK;
}

static int dev_free(int device, void *ptr) {
    int st = check_device(device);
    if (st) return st;
    if (!ptr) return FL_OK; /* like free(NULL) */
    block_hdr_t *h = (block_hdr_t *)((char *)ptr - HDR_SIZE);
    if (h->magic != BLOCK_MAGIC)
        return fail(FL_ERR_INVALID, TEMPLATE_NAME ": free(%p): not a pointer this plugin's malloc returned "
                    "(or freed twice)", ptr);
    h->magic = BLOCK_FREED;
    atomic_fetch_sub(&used_bytes, h->nbytes);
    free(h);
    return FL_OK;
}

static int memory_used(int device, uint64_t *bytes) {
    int st = check_device(device);
    if (st) return st;
    if (!bytes) return fail(FL_ERR_INVALID, TEMPLATE_NAME ": memory_used with a NULL result pointer");
    *bytes = atomic_load(&used_bytes);
    return FL_OK;
}

/* ------------------------------------------------------------------------ */
/* Copies                                                                   */
/* ------------------------------------------------------------------------ */
/* Pointers arrive as base + byte offset already. Streams are synchronous
 * here: the copy is complete when the call returns, whatever the stream. A
 * device with DMA engines would enqueue on `stream` instead. */
static int copy_bytes(const char *what, int device, void *dst, const void *src, size_t nbytes) {
    int st = check_device(device);
    if (st) return st;
    if (nbytes == 0) return FL_OK;
    if (!dst || !src)
        return fail(FL_ERR_INVALID, TEMPLATE_NAME ": %s of %zu bytes with a NULL %s pointer", what, nbytes,
                    !dst ? "destination" : "source");
    memmove(dst, src, nbytes); /* memmove: d2d copies may overlap */
    return FL_OK;
}

static int copy_h2d(int device, void *dst, const void *src, size_t nbytes, fl_stream_t stream) {
    (void)stream;
    return copy_bytes("copy_h2d", device, dst, src, nbytes);
}
static int copy_d2h(int device, void *dst, const void *src, size_t nbytes, fl_stream_t stream) {
    (void)stream;
    return copy_bytes("copy_d2h", device, dst, src, nbytes);
}
static int copy_d2d(int device, void *dst, const void *src, size_t nbytes, fl_stream_t stream) {
    (void)stream;
    return copy_bytes("copy_d2d", device, dst, src, nbytes);
}

/* ABI version 2: fill bytes on the device (torch_fl zeroes dense tensors with it: one call, no kernel).
 * Ordered on the stream like a kernel; here, done when it returns. */
static int mem_set(int device, void *dst, int value, size_t nbytes, fl_stream_t stream) {
    (void)stream;
    int st = check_device(device);
    if (st) return st;
    if (nbytes && !dst) return fail(FL_ERR_INVALID, TEMPLATE_NAME ": mem_set of %zu bytes at NULL", nbytes);
    if (nbytes) memset(dst, value, nbytes);
    return FL_OK;
}

/* Every call of this plugin finishes before it returns, so there is nothing
 * to wait for. stream_* and event_* are left NULL in the table: the header
 * allows it, and the runtime then treats all work as synchronous. */
static int synchronize(int device) { return check_device(device); }

/* ------------------------------------------------------------------------ */
/* Random numbers                                                           */
/* ------------------------------------------------------------------------ */
/* torch.fl.manual_seed / get_rng_state land here. A counter-based generator
 * (Philox and friends) is fully described by (seed, offset): a random kernel
 * would reserve `offset .. offset+n` and advance offset. The template has no
 * random kernels (dropout, randn fall back), but keeps the state so seeding
 * round-trips. A spin lock keeps the pair consistent across threads. */
static uint64_t rng_seed = 67280421310721ull, rng_offset;
static atomic_flag rng_lock = ATOMIC_FLAG_INIT;

static int rng_set_state(int device, uint64_t seed, uint64_t offset) {
    int st = check_device(device);
    if (st) return st;
    while (atomic_flag_test_and_set(&rng_lock)) {}
    rng_seed = seed;
    rng_offset = offset;
    atomic_flag_clear(&rng_lock);
    return FL_OK;
}

static int rng_get_state(int device, uint64_t *seed, uint64_t *offset) {
    int st = check_device(device);
    if (st) return st;
    if (!seed || !offset) return fail(FL_ERR_INVALID, TEMPLATE_NAME ": rng_get_state with a NULL result pointer");
    while (atomic_flag_test_and_set(&rng_lock)) {}
    *seed = rng_seed;
    *offset = rng_offset;
    atomic_flag_clear(&rng_lock);
    return FL_OK;
}

/* ------------------------------------------------------------------------ */
/* Kernel helpers                                                           */
/* ------------------------------------------------------------------------ */
/* A tensor is (data, offset, sizes, strides): element (i0, i1, ...) lives at
 *     ((T *)data)[offset + i0*strides[0] + i1*strides[1] + ...]
 * Offsets and strides count ELEMENTS, not bytes. Strides may be 0 (a
 * broadcast dimension) and are never negative, but otherwise arbitrary (transposes,
 * slices with steps). A tensor with no elements may have data == NULL: never
 * dereference before checking the element count. */
#define AT(T, t, off) (((T *)(t)->data)[off])

static int same_shape(const fl_tensor_t *a, const fl_tensor_t *b) {
    if (a->ndim != b->ndim) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->sizes[d] != b->sizes[d]) return 0;
    return 1;
}

static int is_float_dtype(int dtype) { return dtype == FL_FLOAT32 || dtype == FL_FLOAT64; }

/* Walks the elements of `shape` in row-major order and keeps the element
 * offset of up to 3 tensors of that shape (each with its own strides), so one
 * loop serves contiguous, transposed, sliced and broadcast operands alike.
 * fl_walk_t (fl_kernel_util.h) does the walking; a NULL tensor stands for a
 * scalar operand, whose offset is never read. A real device would rather use
 * fl_iter_t, which coalesces contiguous dimensions into long rows to
 * vectorise; the template stays obvious. */
typedef struct {
    fl_walk_t w;
    int64_t ctr[FL_MAX_DIMS], off[FL_WALK_MAX];
} cursor_t;

static void cursor_init(cursor_t *c, const fl_tensor_t *shape, int n, const fl_tensor_t *const *ts) {
    fl_walk_init(&c->w, shape->ndim, shape->sizes);
    for (int k = 0; k < n; k++) fl_walk_add(&c->w, ts[k] ? ts[k] : shape);
    fl_walk_seek(&c->w, 0, c->ctr, c->off);
}

static void cursor_next(cursor_t *c) { fl_walk_next(&c->w, c->ctr, c->off); }

/* [lo, hi] in elements of the storage a non-empty tensor touches. */
static void span(const fl_tensor_t *t, int64_t *lo, int64_t *hi) {
    *lo = *hi = t->offset;
    for (int d = 0; d < t->ndim; d++) *hi += (t->sizes[d] - 1) * t->strides[d];
}

/* In-place and out= calls hand the kernel an output that aliases an input.
 * `data` is always the base of the runtime's allocation, so two descriptors
 * share memory only if their data pointers are equal. The very same view
 * (x.add_(y): out == self) is safe for an element-by-element loop; a view
 * that overlaps differently (x[1:].add_(x[:-1])) would make the result depend
 * on the loop order, so such calls are declined. */
static int partial_overlap(const fl_tensor_t *t, const fl_tensor_t *o) {
    if (t->data != o->data || t->data == NULL || fl_numel(t) == 0 || fl_numel(o) == 0) return 0;
    int identical = t->offset == o->offset && t->ndim == o->ndim;
    for (int d = 0; identical && d < t->ndim; d++)
        if (t->sizes[d] != o->sizes[d] || (t->sizes[d] > 1 && t->strides[d] != o->strides[d])) identical = 0;
    if (identical) return 0;
    int64_t tlo, thi, olo, ohi;
    span(t, &tlo, &thi);
    span(o, &olo, &ohi);
    return tlo <= ohi && olo <= thi;
}

/* One operand of a pointwise op: a tensor (already broadcast to the output's
 * shape by the runtime), or a Python number the runtime passed as a scalar
 * argument (x + 2.5 arrives as add.Tensor with args[1] = FL_ARG_FLOAT). */
typedef struct {
    const fl_tensor_t *t; /* NULL for a scalar */
    double value;
} operand_t;

static int get_operand(const fl_arg_t *a, const fl_tensor_t *in, int n_in, const fl_tensor_t *out,
                       operand_t *op) {
    if (a->kind == FL_ARG_TENSOR) {
        if (a->i < 0 || a->i >= n_in) return DECLINE("tensor argument index %lld out of range", (long long)a->i);
        const fl_tensor_t *t = &in[a->i];
        /* Mixed dtypes (float32 + float64 -> float64) would need conversions:
         * decline and let the next tier do PyTorch's type promotion. */
        if (t->dtype != out->dtype) return DECLINE("mixed dtypes %d and %d", t->dtype, out->dtype);
        /* The runtime broadcasts inputs of ops tagged pointwise; anything else
         * (this kernel registered for a non-pointwise op) is declined. */
        if (!same_shape(t, out)) return DECLINE("input shape differs from the output's");
        if (partial_overlap(t, out)) return DECLINE("input partially overlaps the output");
        op->t = t;
        op->value = 0.0;
        return FL_OK;
    }
    if (fl_arg_is_num(a)) {
        op->t = NULL;
        op->value = fl_arg_num(a);
        return FL_OK;
    }
    return DECLINE("argument kind %d not handled", a->kind);
}

/* The single output of a pointwise/reduction op, as the runtime allocated it. */
static int get_output(const fl_tensor_t *out, int n_out, const fl_tensor_t **o) {
    if (n_out < 1 || out[0].ndim < 0 || out[0].ndim > FL_MAX_DIMS) return DECLINE("no defined output");
    if (!is_float_dtype(out[0].dtype)) return DECLINE("dtype %d not handled", out[0].dtype);
    if (out[0].data == NULL && fl_numel(&out[0]) != 0) return DECLINE("output without storage");
    *o = &out[0];
    return FL_OK;
}

/* Element i of operand k inside a walk over the output. */
#define OPERAND(T, op, w, k) ((op).t ? AT(T, (op).t, (w).off[k]) : (T)(op).value)

/* ------------------------------------------------------------------------ */
/* Kernels                                                                  */
/* ------------------------------------------------------------------------ */
/* Calling convention (fl_plugin.h): inputs = tensor arguments in schema
 * order, outputs = returns (pre-allocated by the runtime; for in-place ops
 * the output IS the mutated argument), args = one per schema argument.
 * Return FL_ERR_UNSUPPORTED for anything not handled: never guess. */

#define KERNEL_ARGS fl_stream_t stream, int device, const fl_tensor_t *in, int n_in, \
                    const fl_tensor_t *out, int n_out, const fl_arg_t *args, int n_args

/* add.Tensor(self, other, *, alpha=1): out = self + alpha * other.
 * Also serves add_.Tensor (out aliases self; writing element i after reading
 * element i of the same tensor is safe in this loop order). */
static int k_add(KERNEL_ARGS) {
    (void)stream;
    if (check_device(device)) return FL_ERR_INVALID;
    const fl_tensor_t *o;
    operand_t a, b;
    int st;
    if (n_args < 3) return DECLINE("add: expected 3 arguments, got %d", n_args);
    if ((st = get_output(out, n_out, &o)) || (st = get_operand(&args[0], in, n_in, o, &a)) ||
        (st = get_operand(&args[1], in, n_in, o, &b)))
        return st;
    if (!fl_arg_is_num(&args[2])) return DECLINE("add: alpha of kind %d", args[2].kind);
    double alpha = fl_arg_num(&args[2]);
    int64_t n = fl_numel(o);
    cursor_t w;
    cursor_init(&w, o, 3, (const fl_tensor_t *const[]){o, a.t, b.t});
#define ADD_LOOP(T)                                                                        \
    for (int64_t i = 0; i < n; i++, cursor_next(&w))                                         \
        AT(T, o, w.off[0]) = OPERAND(T, a, w, 1) + (T)alpha * OPERAND(T, b, w, 2);
    if (o->dtype == FL_FLOAT32) { ADD_LOOP(float) } else { ADD_LOOP(double) }
#undef ADD_LOOP
    return FL_OK;
}

/* mul.Tensor(self, other) (and mul_.Tensor) */
static int k_mul(KERNEL_ARGS) {
    (void)stream;
    if (check_device(device)) return FL_ERR_INVALID;
    const fl_tensor_t *o;
    operand_t a, b;
    int st;
    if (n_args < 2) return DECLINE("mul: expected 2 arguments, got %d", n_args);
    if ((st = get_output(out, n_out, &o)) || (st = get_operand(&args[0], in, n_in, o, &a)) ||
        (st = get_operand(&args[1], in, n_in, o, &b)))
        return st;
    int64_t n = fl_numel(o);
    cursor_t w;
    cursor_init(&w, o, 3, (const fl_tensor_t *const[]){o, a.t, b.t});
#define MUL_LOOP(T)                                                                        \
    for (int64_t i = 0; i < n; i++, cursor_next(&w))                                         \
        AT(T, o, w.off[0]) = OPERAND(T, a, w, 1) * OPERAND(T, b, w, 2);
    if (o->dtype == FL_FLOAT32) { MUL_LOOP(float) } else { MUL_LOOP(double) }
#undef MUL_LOOP
    return FL_OK;
}

/* relu(self) (and relu_): max(x, 0), NaN stays NaN as in PyTorch. */
static int k_relu(KERNEL_ARGS) {
    (void)stream;
    if (check_device(device)) return FL_ERR_INVALID;
    const fl_tensor_t *o;
    operand_t x;
    int st;
    if (n_args < 1) return DECLINE("relu: expected 1 argument");
    if ((st = get_output(out, n_out, &o)) || (st = get_operand(&args[0], in, n_in, o, &x))) return st;
    if (!x.t) return DECLINE("relu: self is not a tensor");
    int64_t n = fl_numel(o);
    cursor_t w;
    cursor_init(&w, o, 2, (const fl_tensor_t *const[]){o, x.t});
#define RELU_LOOP(T)                                                                       \
    for (int64_t i = 0; i < n; i++, cursor_next(&w)) {                                       \
        T v = AT(T, x.t, w.off[1]);                                                        \
        AT(T, o, w.off[0]) = (v > 0 || v != v) ? v : (T)0;                                 \
    }
    if (o->dtype == FL_FLOAT32) { RELU_LOOP(float) } else { RELU_LOOP(double) }
#undef RELU_LOOP
    return FL_OK;
}

/* fill_.Scalar(self, value): in place; outputs[0] is self (any strides; a
 * stride-0 dimension just writes the same element again). */
static int k_fill_(KERNEL_ARGS) {
    (void)stream; (void)in; (void)n_in;
    if (check_device(device)) return FL_ERR_INVALID;
    const fl_tensor_t *o;
    int st;
    if ((st = get_output(out, n_out, &o))) return st;
    if (n_args < 2 || !fl_arg_is_num(&args[1])) return DECLINE("fill_: value is not a number");
    double value = fl_arg_num(&args[1]);
    int64_t n = fl_numel(o);
    cursor_t w;
    cursor_init(&w, o, 1, (const fl_tensor_t *const[]){o});
    if (o->dtype == FL_FLOAT32) {
        for (int64_t i = 0; i < n; i++, cursor_next(&w)) AT(float, o, w.off[0]) = (float)value;
    } else {
        for (int64_t i = 0; i < n; i++, cursor_next(&w)) AT(double, o, w.off[0]) = value;
    }
    return FL_OK;
}

/* mm(self [n,k], mat2 [k,m]) -> out [n,m]. mm is not pointwise, so inputs
 * keep their own shapes; strides are arbitrary (x.t() arrives as a stride
 * swap, not a copy). Naive triple loop, accumulated in double. */
static int k_mm(KERNEL_ARGS) {
    (void)stream; (void)args; (void)n_args;
    if (check_device(device)) return FL_ERR_INVALID;
    if (n_in != 2 || n_out < 1) return DECLINE("mm: expected 2 inputs and 1 output");
    const fl_tensor_t *a = &in[0], *b = &in[1], *o = &out[0];
    if (a->ndim != 2 || b->ndim != 2 || o->ndim != 2) return DECLINE("mm: operands are not matrices");
    if (!is_float_dtype(o->dtype) || a->dtype != o->dtype || b->dtype != o->dtype)
        return DECLINE("mm: dtypes %d @ %d -> %d not handled", a->dtype, b->dtype, o->dtype);
    int64_t n = a->sizes[0], k = a->sizes[1], m = b->sizes[1];
    if (b->sizes[0] != k || o->sizes[0] != n || o->sizes[1] != m)
        return fail(FL_ERR_INVALID, "mm: shapes [%lld,%lld] @ [%lld,%lld] -> [%lld,%lld] do not match",
                    (long long)n, (long long)k, (long long)b->sizes[0], (long long)m, (long long)o->sizes[0],
                    (long long)o->sizes[1]);
    const int64_t as0 = a->strides[0], as1 = a->strides[1], bs0 = b->strides[0], bs1 = b->strides[1];
    const int64_t os0 = o->strides[0], os1 = o->strides[1];
#define MM_LOOP(T)                                                                         \
    for (int64_t i = 0; i < n; i++)                                                        \
        for (int64_t j = 0; j < m; j++) {                                                  \
            double acc = 0.0;                                                              \
            for (int64_t p = 0; p < k; p++)                                                \
                acc += (double)AT(T, a, a->offset + i * as0 + p * as1) *                   \
                       (double)AT(T, b, b->offset + p * bs0 + j * bs1);                    \
            AT(T, o, o->offset + i * os0 + j * os1) = (T)acc;                              \
        }
    if (o->dtype == FL_FLOAT32) { MM_LOOP(float) } else { MM_LOOP(double) }
#undef MM_LOOP
    return FL_OK;
}

/* sum(self, *, dtype=None) -> 0-dim tensor: every element of self added up.
 * args[1] is FL_ARG_NONE or FL_ARG_DTYPE; a dtype different from self's
 * (sum(x, dtype=torch.float64) of a float32 x) is declined, and so the
 * output's dtype is simply checked against the input's. */
static int k_sum(KERNEL_ARGS) {
    (void)stream; (void)args; (void)n_args;
    if (check_device(device)) return FL_ERR_INVALID;
    if (n_in != 1 || n_out < 1) return DECLINE("sum: expected 1 input and 1 output");
    const fl_tensor_t *x = &in[0], *o = &out[0];
    if (o->ndim != 0) return DECLINE("sum: output is not a 0-dim tensor");
    if (!is_float_dtype(o->dtype) || x->dtype != o->dtype)
        return DECLINE("sum: dtype %d -> %d not handled", x->dtype, o->dtype);
    int64_t n = fl_numel(x);
    double acc = 0.0; /* the sum of zero elements is 0 */
    cursor_t w;
    cursor_init(&w, x, 1, (const fl_tensor_t *const[]){x});
    if (x->dtype == FL_FLOAT32) {
        for (int64_t i = 0; i < n; i++, cursor_next(&w)) acc += AT(float, x, w.off[0]);
        AT(float, o, o->offset) = (float)acc;
    } else {
        for (int64_t i = 0; i < n; i++, cursor_next(&w)) acc += AT(double, x, w.off[0]);
        AT(double, o, o->offset) = acc;
    }
    return FL_OK;
}

/* ------------------------------------------------------------------------ */
/* Kernel table                                                             */
/* ------------------------------------------------------------------------ */
/* Names are aten overload names exactly as PyTorch spells them
 * ("aten::add.Tensor"; the default overload has no suffix: "aten::mm").
 * The mask says which lookup dtypes (the first tensor argument's) the
 * runtime may send; a kernel still declines mixes it does not handle. */
#define F32_F64 (FL_DTYPE_BIT(FL_FLOAT32) | FL_DTYPE_BIT(FL_FLOAT64))
static const fl_kernel_entry_t kernels[] = {
    {"aten::add.Tensor", F32_F64, 0, k_add},
    {"aten::add_.Tensor", F32_F64, 0, k_add},
    {"aten::mul.Tensor", F32_F64, 0, k_mul},
    {"aten::mul_.Tensor", F32_F64, 0, k_mul},
    {"aten::relu", F32_F64, 0, k_relu},
    {"aten::relu_", F32_F64, 0, k_relu},
    {"aten::fill_.Scalar", F32_F64, 0, k_fill_},
    {"aten::mm", F32_F64, 0, k_mm},
    {"aten::sum", F32_F64, 0, k_sum},
};
#define N_KERNELS ((int)(sizeof kernels / sizeof kernels[0]))

static int kernel_count(int *count) {
    if (!count) return fail(FL_ERR_INVALID, TEMPLATE_NAME ": kernel_count(NULL)");
    *count = N_KERNELS;
    return FL_OK;
}

static int kernel_get(int index, fl_kernel_entry_t *entry) {
    if (index < 0 || index >= N_KERNELS)
        return fail(FL_ERR_INVALID, TEMPLATE_NAME ": kernel index %d out of range [0, %d)", index, N_KERNELS);
    if (!entry) return fail(FL_ERR_INVALID, TEMPLATE_NAME ": kernel_get with a NULL entry pointer");
    *entry = kernels[index];
    return FL_OK;
}

/* ------------------------------------------------------------------------ */
/* The two exported symbols                                                 */
/* ------------------------------------------------------------------------ */
/* Checked first, before any struct is touched: a plugin built against
 * another ABI version is rejected with a clear message instead of crashing. */
int fl_plugin_abi_version(void) { return FL_ABI_VERSION; }

int fl_plugin_init(fl_plugin_t *p) {
    if (!p) return FL_ERR_INVALID;
    /* Zero first: every entry point not set below is NULL, which the header
     * defines as "not provided" for the optional ones. last_error goes in
     * before anything can fail, so a loader can say why init failed. */
    memset(p, 0, sizeof *p);
    p->last_error = last_error;
    /* A malformed setting rejects the plugin rather than being ignored:
     * torch_fl.list_backends() then shows "fl_plugin_init returned
     * FL_ERR_INVALID" for it. */
    const char *env = getenv("FL_TEMPLATE_MEMORY_LIMIT");
    if (env && *env) {
        uint64_t v;
        if (fl_parse_size(env, &v) || !v) return fail(FL_ERR_INVALID, TEMPLATE_NAME ": FL_TEMPLATE_MEMORY_LIMIT=%s is not a size", env);
        memory_limit = v;
    }
    p->abi_version = FL_ABI_VERSION;
    p->struct_size = sizeof *p; /* the runtime compares it with its own sizeof */
    p->name = TEMPLATE_NAME;
    p->vendor = "Example Vendor";
    p->version = "0.1.0";
    p->description = "template plugin from the torch_fl SDK: its device is host memory, reached only "
                     "through the copy entry points; a few reference kernels in float32/float64";
    p->emulated = 1; /* no real chip behind it: a real plugin named "template" would take precedence */

    p->device_count = device_count;
    p->device_props = device_props;
    p->malloc = dev_malloc;
    p->free = dev_free;
    p->memory_used = memory_used;
    p->copy_h2d = copy_h2d;
    p->copy_d2h = copy_d2h;
    p->copy_d2d = copy_d2d;
    p->mem_set = mem_set; /* version 2; a plugin built against version 1 simply has none of these */
    p->synchronize = synchronize;
    p->rng_set_state = rng_set_state;
    p->rng_get_state = rng_get_state;
    p->kernel_count = kernel_count;
    p->kernel_get = kernel_get;
    /* stream_*, event_*, comm_* and jit_compile stay NULL: synchronous work,
     * collectives relayed through the host, no JIT. Version 2's event_elapsed,
     * host_alloc/host_free, copy_d2h_async and stream_wait_event (a queue
     * waiting on another queue's event) stay NULL too: they matter for a
     * device whose work is asynchronous (FL_FEATURE_ASYNC_KERNELS, which this
     * one does not declare; plugins_cffi/opencl/ is one that does).
     * jit_language stays FL_JIT_NONE: a chip that compiles its own language
     * sets it (FL_JIT_OPENCL_C, say) with jit_build and jit_launch, and
     * torch_fl generates kernels in that language for the ops this table
     * lacks; plugins_cffi/opencl/opencl.c is the worked example. */
    p->jit_language = FL_JIT_NONE;
    return FL_OK;
}
