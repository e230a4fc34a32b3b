/* The OpenCL plugin: programs and kernels -- built per device and compute type at first use,
 * through the on-disk binary cache -- launching, tensors on the device, the device error flag.
 * Shared declarations: ocl.h. */
#include "ocl.h"
#include "kernels_cl.h"
#include "bincache.h"

/* ------------------------------------------------------------------ programs and kernels */

/* The compiler's log for a message, at most n-1 bytes: from the line of its first error on when the whole
 * log does not fit (warnings often come first). */
void log_excerpt(const char *log, char *out, size_t n) {
    if (!log || !*log) { snprintf(out, n, "(the compiler printed no log)"); return; }
    const char *s = log, *err = strstr(log, "error");
    if (strlen(log) >= n && err) {
        while (err > log && err[-1] != '\n') err--;
        s = err;
    }
    snprintf(out, n, "%s", s);
    for (size_t k = strlen(out); k && (out[k - 1] == '\n' || out[k - 1] == ' '); k--) out[k - 1] = 0;
}

#define FEW_KERNELS 8
/* Builds src with opts for D: from the binary cache when it holds this very build (same platform, device,
 * driver, options and source), else from source, and then the driver's binary is cached. NULL when the
 * build fails: the OpenCL error in *err, the compiler's log in *log (malloc'ed, or NULL; the caller frees). */
cl_program build_program(dev_t_ *D, const char *src, const char *opts, cl_int *err, char **log) {
    *err = 0;
    *log = NULL;
    char name[OCL_CACHE_NAME] = "";
    int cache = D->bincache;
    if (cache) {
        const char *parts[3] = {D->ident, opts, src};
        ocl_cache_name(parts, 3, name);
        unsigned char *bin = NULL;
        size_t n = 0;
        if (ocl_cache_load(name, &bin, &n)) {
            cl_int e = 0, bst = 0;
            const unsigned char *bp = bin;
            cl_program p = cl.clCreateProgramWithBinary(D->ctx, 1, &D->id, &n, &bp, &bst, &e);
            if (p && !e && !bst) e = cl.clBuildProgram(p, 1, &D->id, opts, NULL, NULL);
            free(bin);
            if (p && !e && !bst) return p;
            if (p) cl.clReleaseProgram(p);
            char why[96];
            snprintf(why, sizeof why, "the driver refused it (OpenCL error %d)", e ? e : bst);
            ocl_cache_drop(name, why);
        }
    }
    cl_int e = 0;
    cl_program p = cl.clCreateProgramWithSource(D->ctx, 1, &src, NULL, &e);
    if (!p || e) {
        *err = e ? e : -1;
        return NULL;
    }
    e = cl.clBuildProgram(p, 1, &D->id, opts, NULL, NULL);
    if (e) {
        size_t ln = 0;
        cl.clGetProgramBuildInfo(p, D->id, CL_PROGRAM_BUILD_LOG, 0, NULL, &ln);
        *log = calloc(1, ln + 1);
        if (*log && ln) cl.clGetProgramBuildInfo(p, D->id, CL_PROGRAM_BUILD_LOG, ln, *log, NULL);
        cl.clReleaseProgram(p);
        *err = e;
        return NULL;
    }
    size_t n = 0, nk = 0;
    if (cache == 2 && (cl.clGetProgramInfo(p, CL_PROGRAM_NUM_KERNELS, sizeof nk, &nk, NULL) || nk > FEW_KERNELS))
        return p;
    if (cache && !cl.clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof n, &n, NULL) && n) {
        unsigned char *bin = malloc(n);
        if (bin && !cl.clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL)) ocl_cache_store(name, bin, n);
        free(bin);
    }
    return p;
}

/* key: "ew:<t>", "red:<t>", "nn:<t>", "conv:<t>", "cvt" (klock held) */
static cl_program prog_get(dev_t_ *D, const char *key, int *st) {
    for (int i = 0; i < D->nprog; i++) if (!strcmp(D->progs[i].key, key)) return D->progs[i].p;
    if (D->nprog == NPROG) { *st = fail(FL_ERR_INTERNAL, NAME ": too many programs"); return NULL; }
    const char *src = NULL;
    char opts[512] = "";
    const char *colon = strchr(key, ':');
    int dt = -1;
    if (colon) for (int d = 0; d < FL_DTYPE_COUNT; d++) if (tname(d) && !strcmp(tname(d), colon + 1)) dt = d;
    const char *fp = D->opts; /* the language version and -DHAS_FP64 */
    if (!strcmp(key, "cvt")) { src = CL_CVT_SRC; snprintf(opts, sizeof opts, "%s", fp); }
    else if (dt >= 0) {
        const char *acc = is_flt(dt) ? (D->fp64 ? "double" : "float") : "long";
        int tn = dt == FL_FLOAT64 ? 8 : 16;
        if (!strncmp(key, "ew:", 3)) src = CL_EW_SRC;
        else if (!strncmp(key, "red:", 4)) src = CL_RED_SRC;
        else if (!strncmp(key, "nn:", 3)) src = CL_NN_SRC;
        else if (!strncmp(key, "conv:", 5)) src = CL_CONV_SRC;
        snprintf(opts, sizeof opts, "%s -DT=%s -DACC=%s%s%s -DTN=%d -DVT=%s%d -DVLOAD=vload%d -DVSTORE=vstore%d", fp, ctype(dt),
                 acc, is_flt(dt) ? " -DIS_FLOAT" : "", dt == FL_BOOL ? " -DIS_BOOL" : "", tn, ctype(dt), tn, tn, tn);
    }
    if (!src) { *st = fail(FL_ERR_INTERNAL, NAME ": unknown program %s", key); return NULL; }
    cl_int e = 0;
    char *log = NULL;
    cl_program p = build_program(D, src, opts, &e, &log);
    if (!p) {
        char ex[2800];
        log_excerpt(log, ex, sizeof ex);
        free(log);
        *st = fail(FL_ERR_INTERNAL, NAME ": building OpenCL program %s (%s) failed with error %d: %s", key, opts, e, ex);
        return NULL;
    }
    snprintf(D->progs[D->nprog].key, sizeof D->progs[D->nprog].key, "%s", key);
    D->progs[D->nprog++].p = p;
    return p;
}
static uint32_t hstr(const char *a, const char *b) {
    uint32_t h = 2166136261u;
    for (; *a; a++) h = (h ^ (uint8_t)*a) * 16777619u;
    h = (h ^ '/') * 16777619u;
    for (; *b; b++) h = (h ^ (uint8_t)*b) * 16777619u;
    return h;
}
static cl_kernel kern_get(dev_t_ *D, const char *prog, const char *kn, int *st) {
    char full[48];
    snprintf(full, sizeof full, "%s/%s", prog, kn);
    uint32_t h = hstr(prog, kn) % KSLOTS;
    for (int i = 0; i < KSLOTS; i++) {
        kslot_t *s = &D->ks[(h + i) % KSLOTS];
        if (!s->k) {
            cl_program p = prog_get(D, prog, st);
            if (!p) return NULL;
            cl_int e = 0;
            cl_kernel k = cl.clCreateKernel(p, kn, &e);
            if (!k || e) { *st = fail(FL_ERR_INTERNAL, NAME ": clCreateKernel(%s) failed with OpenCL error %d", full, e); return NULL; }
            snprintf(s->name, sizeof s->name, "%s", full);
            s->k = k;
            return k;
        }
        if (!strcmp(s->name, full)) return s->k;
    }
    *st = fail(FL_ERR_INTERNAL, NAME ": kernel cache full");
    return NULL;
}

/* sets the arguments and enqueues, under the device's kernel lock (cl_kernel is not thread-safe) */
int launch(dev_t_ *D, fl_stream_t s, const char *prog, const char *kn, int na, const karg_t *a, int dims,
                  const size_t *g, const size_t *l) {
    int st = FL_OK;
    pthread_mutex_lock(&D->klock);
    cl_kernel k = kern_get(D, prog, kn, &st);
    if (!k) { pthread_mutex_unlock(&D->klock); return st; }
    cl_int e = 0;
    for (int i = 0; i < na && !e; i++) {
        e = cl.clSetKernelArg(k, (cl_uint)i, a[i].sz, a[i].p);
        if (e) st = fail(FL_ERR_INTERNAL, NAME ": clSetKernelArg(%s/%s, %d) failed with OpenCL error %d", prog, kn, i, e);
    }
    if (!e) {
        e = cl.clEnqueueNDRangeKernel(qof(D, s), k, (cl_uint)dims, NULL, g, l, 0, NULL, NULL);
        if (e) st = fail(FL_ERR_INTERNAL, NAME ": clEnqueueNDRangeKernel(%s/%s) failed with OpenCL error %d", prog, kn, e);
    }
    pthread_mutex_unlock(&D->klock);
    return st;
}
static size_t round_up(int64_t n, int64_t m) { return (size_t)((n + m - 1) / m * m); }
int launch1(dev_t_ *D, fl_stream_t s, const char *prog, const char *kn, int na, const karg_t *a, int64_t n) {
    if (n <= 0) return FL_OK;
    size_t g = round_up(n, 64);
    return launch(D, s, prog, kn, na, a, 1, &g, NULL);
}

/* ------------------------------------------------------------------ tensors on the device */

/* resolves t (checks its elements lie in its allocation); a tensor with no elements gets m = NULL */
int tres(dev_t_ *D, const fl_tensor_t *t, dt_t *r) {
    r->m = NULL; r->off = 0;
    if (fl_numel(t) == 0) return FL_OK;
    size_t off = 0, room = 0, isz = fl_itemsize(t->dtype);
    r->m = resolve(D, t->data, &off, &room);
    if (!r->m) return fail(FL_ERR_INVALID, NAME ": tensor data %p is not memory of %s", t->data, D->name);
    if (off % isz) return UNSUP;
    int64_t lo, hi;
    span_of(t, &lo, &hi);
    if (lo < 0 || (uint64_t)(hi + 1) * isz > room)
        return fail(FL_ERR_INVALID, NAME ": tensor view (offset %lld, last element %lld) lies outside its allocation",
                    (long long)t->offset, (long long)hi);
    r->off = (int64_t)(off / isz);
    return FL_OK;
}
/* a walk over shape (sizes of ts0) for up to 4 tensors (NULL = scalar: stride 0), dims coalesced */
void mkwalk(walk_t *w, int nd, const int64_t *sizes, int nt, const fl_tensor_t *const *ts, const int64_t *base) {
    memset(w, 0, sizeof *w);
    int64_t sz[8], st[4][8];
    int m = 0;
    w->n = 1;
    for (int d = 0; d < nd; d++) w->n *= sizes[d];
    for (int d = 0; d < nd; d++) {
        if (sizes[d] == 1) continue;
        int merge = m > 0;
        for (int k = 0; k < nt && merge; k++) {
            int64_t s = ts[k] ? ts[k]->strides[d] : 0;
            if (st[k][m - 1] != s * sizes[d]) merge = 0;
        }
        if (merge) {
            sz[m - 1] *= sizes[d];
            for (int k = 0; k < nt; k++) st[k][m - 1] = ts[k] ? ts[k]->strides[d] : 0;
            continue;
        }
        sz[m] = sizes[d];
        for (int k = 0; k < nt; k++) st[k][m] = ts[k] ? ts[k]->strides[d] : 0;
        m++;
    }
    if (m == 0) { sz[0] = 1; for (int k = 0; k < 4; k++) st[k][0] = 0; m = 1; }
    w->ndim = m;
    for (int d = 0; d < m; d++) {
        w->size[d] = sz[d];
        for (int k = 0; k < nt; k++) w->st[k][d] = st[k][d];
    }
    for (int k = 0; k < nt; k++) w->off[k] = ts[k] ? base[k] + ts[k]->offset : 0;
}

void prm_real(dev_t_ *D, prm_t *p, int which, int k, double v) { /* which 0: sd, 1: pd */
    if (D->fp64) memcpy(p->r + which * 32 + k * 8, &v, 8);
    else { float f = (float)v; memcpy(p->r + which * 16 + k * 4, &f, 4); }
}
size_t prm_size(dev_t_ *D) { return D->fp64 ? sizeof(prm_t) : sizeof(prm_t) - 32; }
karg_t ka_real(dev_t_ *D, real_t *r, double v) {
    if (D->fp64) { r->d = v; return (karg_t){8, r}; }
    r->f = (float)v; return (karg_t){4, r};
}
cl_mem tmpbuf(dev_t_ *D, size_t n, int *st) {
    cl_int e = 0;
    cl_mem m = cl.clCreateBuffer(D->ctx, CL_MEM_READ_WRITE, n ? n : 1, NULL, &e);
    if (!m || e) { *st = fail(FL_ERR_OOM, NAME ": cannot allocate a %zu-byte temporary buffer (OpenCL error %d)", n, e); return NULL; }
    return m;
}

/* The device-side error flag. err_begin locks it (and creates it zeroed on first use); err_end always
 * unlocks: after a successful launch it reads the flag with a blocking read on the kernel's queue (so the
 * kernel is synchronous), resets it, and returns the flag's code (1 index out of range, 2 integer division
 * by zero) with the offending value in *val; st when the launch failed. */
int err_begin(dev_t_ *D, cl_mem *em) {
    pthread_mutex_lock(&D->elock);
    if (!D->errm) {
        int64_t z[2] = {0, 0};
        cl_int e = 0;
        D->errm = cl.clCreateBuffer(D->ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof z, z, &e);
        if (!D->errm || e) {
            D->errm = NULL;
            pthread_mutex_unlock(&D->elock);
            return fail(FL_ERR_OOM, NAME ": cannot allocate the device error flag (OpenCL error %d)", e);
        }
    }
    *em = D->errm;
    return FL_OK;
}
int err_end(dev_t_ *D, fl_stream_t s, int st, int *code, int64_t *val) {
    *code = 0; *val = 0;
    if (st) { pthread_mutex_unlock(&D->elock); return st; }
    int32_t b[4] = {0, 0, 0, 0};
    cl_int e = cl.clEnqueueReadBuffer(qof(D, s), D->errm, CL_TRUE, 0, sizeof b, b, 0, NULL, NULL);
    if (!e && b[0]) {
        int64_t z[2] = {0, 0};
        memcpy(val, &b[2], 8);
        *code = b[0];
        e = cl.clEnqueueWriteBuffer(qof(D, s), D->errm, CL_TRUE, 0, sizeof z, z, 0, NULL, NULL);
    }
    pthread_mutex_unlock(&D->elock);
    if (e) return fail(FL_ERR_INTERNAL, NAME ": reading the device error flag failed with OpenCL error %d (or an earlier kernel failed)", e);
    return FL_OK;
}
