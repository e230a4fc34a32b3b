/*
 * opencl.c — the torch_fl OpenCL backend ("opencl"): the plugin's entry point. Its files and what each
 * holds: ocl.h.
 *
 * Every OpenCL device of every platform becomes one fl device. libOpenCL.so.1
 * (the ICD loader) is opened at run time with dlopen, so this library builds and
 * loads on machines without OpenCL headers or drivers (fl_plugin_init then
 * returns FL_ERR_UNSUPPORTED and says how to install one).
 *
 * Memory: the ABI passes raw addresses (allocation base + byte offset), OpenCL
 * has cl_mem handles. Each device reserves a PROT_NONE virtual range; malloc
 * hands out addresses from it (first fit over an address-ordered free list with
 * coalescing, 256-byte alignment) backed by one cl_mem per allocation, and any
 * address inside an allocation maps back to (cl_mem, byte offset) through a
 * sorted table. The host can never dereference those addresses.
 *
 * Kernels: OpenCL C kept in kernels_cl.h, built per device and compute type at
 * first use, enqueued on an in-order profiling queue (FL_FEATURE_ASYNC_KERNELS).
 *
 * Device JIT (FL_JIT_OPENCL_C): jit_build compiles the kernels torch_fl generates,
 * jit_launch runs them with fl_plugin.h's launch convention (meta, status, one
 * buffer per tensor).
 *
 * Program binaries: every build (the plugin's programs and the JIT's) goes through
 * an on-disk cache of the driver's binaries, private to the user and checked
 * against a SHA-256 before each load (bincache.c says where it is and its rules).
 * FL_OPENCL_CACHE=0 turns it off (every program is built from source), =1 on for
 * every program; unset, it is on except that on a driver that keeps its own cache
 * of built programs (pocl with its POCL_KERNEL_CACHE on) only programs of a few
 * kernels (the JIT's) are stored: build_identity says why.
 */
#include "ocl.h"
#include "bincache.h"
#include "clblast.h"

/* ------------------------------------------------------------------ errors */
static _Thread_local char tl_err[4096];
__attribute__((format(printf, 2, 3))) int fail(int st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_err, sizeof tl_err, fmt, ap);
    va_end(ap);
    return st;
}
static const char *last_error(void) { return tl_err; }

/* ------------------------------------------------------------------ the CL library */
struct ocl_lib cl; /* filled by load_cl (below) */

/* ------------------------------------------------------------------ devices */
dev_t_ *devs;
int ndev;
static const char *g_vendor = "unknown";
static char g_vendor_buf[128];

int chk(int device, dev_t_ **d) {
    if (device < 0 || device >= ndev) return fail(FL_ERR_INVALID, NAME ": no device %d (there are %d)", device, ndev);
    *d = &devs[device];
    return FL_OK;
}

static int device_count(int *c) { if (!c) return fail(FL_ERR_INVALID, NAME ": NULL"); *c = ndev; return FL_OK; }

static uint32_t dev_dtypes(const dev_t_ *D) {
    uint32_t m = FL_DTYPE_BIT(FL_FLOAT32) | FL_DTYPE_BIT(FL_INT64) | FL_DTYPE_BIT(FL_INT32) | FL_DTYPE_BIT(FL_INT16) |
                 FL_DTYPE_BIT(FL_INT8) | FL_DTYPE_BIT(FL_UINT8) | FL_DTYPE_BIT(FL_BOOL);
    if (D->fp64) m |= FL_DTYPE_BIT(FL_FLOAT64);
    m |= FL_DTYPE_BIT(FL_FLOAT16); /* storage and conversions (vload_half / vstore_half: OpenCL 1.2 core) */
    return m;
}

static int device_props(int device, fl_device_props_t *p) {
    DEV(device);
    if (!p) return fail(FL_ERR_INVALID, NAME ": device_props(NULL)");
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", D->name);
    p->total_memory = D->mem_total;
    p->dtypes = dev_dtypes(D);
    /* copies on a stream other than NULL are non-blocking enqueues on that stream's queue (copy_h2d) */
    p->features = FL_FEATURE_ASYNC_KERNELS | FL_FEATURE_ASYNC_COPY | (D->host_cpu ? FL_FEATURE_HOST_CPU : 0);
    p->compute_units = D->cus;
    return FL_OK;
}

/* ------------------------------------------------------------------ rng */
static int rng_set_state(int device, uint64_t seed, uint64_t offset) {
    DEV(device);
    pthread_mutex_lock(&D->rlock); D->seed = seed; D->offset = offset; pthread_mutex_unlock(&D->rlock);
    return FL_OK;
}
static int rng_get_state(int device, uint64_t *seed, uint64_t *offset) {
    DEV(device);
    if (!seed || !offset) return fail(FL_ERR_INVALID, NAME ": rng_get_state(NULL)");
    pthread_mutex_lock(&D->rlock); *seed = D->seed; *offset = D->offset; pthread_mutex_unlock(&D->rlock);
    return FL_OK;
}
uint64_t rng_reserve(dev_t_ *D, uint64_t n, uint64_t *seed) {
    pthread_mutex_lock(&D->rlock);
    uint64_t s = D->offset; D->offset += n; *seed = D->seed;
    pthread_mutex_unlock(&D->rlock);
    return s;
}

/* ------------------------------------------------------------------ kernel table */
#define B_(d) FL_DTYPE_BIT(d)
#define FLT (B_(FL_FLOAT32) | B_(FL_FLOAT64))
#define INTS (B_(FL_INT64) | B_(FL_INT32) | B_(FL_INT16) | B_(FL_INT8) | B_(FL_UINT8))
#define NUM (FLT | INTS)
#define ALLD (NUM | B_(FL_BOOL))
#define INTB (INTS | B_(FL_BOOL))
#define STOR (ALLD | B_(FL_FLOAT16))
#define E(n, m, f) {n, m, 0, f}
static const fl_kernel_entry_t kernels[] = {
    /* minimal's primitives */
    E("aten::add.Tensor", NUM, k_add), E("aten::add_.Tensor", NUM, k_add), E("aten::sub.Tensor", NUM, k_sub),
    E("aten::sub_.Tensor", NUM, k_sub), E("aten::mul.Tensor", NUM, k_mul), E("aten::mul_.Tensor", NUM, k_mul),
    E("aten::div.Tensor", FLT, k_div), E("aten::div_.Tensor", FLT, k_div), E("aten::neg", NUM, k_neg),
    E("aten::exp", FLT, k_exp), E("aten::log", FLT, k_log), E("aten::sqrt", FLT, k_sqrt), E("aten::rsqrt", FLT, k_rsqrt),
    E("aten::tanh", FLT, k_tanh), E("aten::erf", FLT, k_erf), E("aten::abs", NUM, k_abs), E("aten::sigmoid", FLT, k_sigmoid),
    E("aten::pow.Tensor_Scalar", FLT, k_pow_ts), E("aten::maximum", NUM, k_maximum), E("aten::minimum", NUM, k_minimum),
    E("aten::where.self", B_(FL_BOOL), k_where), E("aten::eq.Tensor", ALLD, k_eq), E("aten::gt.Scalar", ALLD, k_gt),
    E("aten::lt.Scalar", ALLD, k_lt), E("aten::sum.dim_IntList", ALLD, k_sum_dim), E("aten::amax", ALLD, k_amax),
    E("aten::mm", FLT, k_mm), E("aten::bmm", FLT, k_bmm), E("aten::fill_.Scalar", STOR, k_fill), E("aten::copy_", STOR, k_copy),
    E("aten::cat", STOR, k_cat), E("aten::uniform_", FLT, k_uniform), E("aten::normal_", FLT, k_normal),
    E("aten::bernoulli_.float", ALLD, k_bernoulli), E("aten::arange.start_step", NUM, k_arange),
    /* more pointwise and comparisons */
    E("aten::eq.Scalar", ALLD, k_eq), E("aten::ne.Tensor", ALLD, k_ne), E("aten::ne.Scalar", ALLD, k_ne),
    E("aten::lt.Tensor", ALLD, k_lt), E("aten::le.Tensor", ALLD, k_le), E("aten::le.Scalar", ALLD, k_le),
    E("aten::gt.Tensor", ALLD, k_gt), E("aten::ge.Tensor", ALLD, k_ge), E("aten::ge.Scalar", ALLD, k_ge),
    E("aten::zero_", STOR, k_zero), E("aten::relu", NUM, k_relu), E("aten::relu_", NUM, k_relu),
    E("aten::gelu", FLT, k_gelu), E("aten::silu", FLT, k_silu), E("aten::threshold", FLT, k_threshold),
    E("aten::threshold_backward", NUM, k_threshold_bw), E("aten::gelu_backward", FLT, k_gelu_bw),
    E("aten::silu_backward", FLT, k_silu_bw), E("aten::sigmoid_backward", FLT, k_sigmoid_bw),
    E("aten::tanh_backward", FLT, k_tanh_bw),
    /* reductions, normalization, linear algebra */
    E("aten::sum", ALLD, k_sum), E("aten::mean.dim", FLT, k_mean_dim), E("aten::mean", FLT, k_mean),
    E("aten::_softmax", FLT, k_softmax), E("aten::_log_softmax", FLT, k_log_softmax),
    E("aten::_softmax_backward_data", FLT, k_softmax_bw), E("aten::_log_softmax_backward_data", FLT, k_log_softmax_bw),
    E("aten::native_layer_norm", FLT, k_layer_norm), E("aten::native_layer_norm_backward", FLT, k_layer_norm_bw),
    E("aten::addmm", FLT, k_addmm),
    {"aten::convolution", FLT, FL_KERNEL_ANY_OUT_LAYOUT, k_conv}, /* writes its output through its strides */
    E("aten::convolution_backward", FLT, k_conv_bw),
    E("aten::gather", ALLD, k_gather), E("aten::scatter.value", ALLD, k_scatter_value),
    E("aten::scatter_.value", ALLD, k_scatter_value), E("aten::scatter.src", ALLD, k_scatter_src),
    E("aten::scatter_.src", ALLD, k_scatter_src), E("aten::scatter_add", ALLD, k_scatter_add),
    E("aten::scatter_add_", ALLD, k_scatter_add), E("aten::index_select", ALLD, k_index_select),
    E("aten::embedding", ALLD, k_embedding), E("aten::embedding_dense_backward", FLT, k_embedding_bw),
    /* bitwise and logical */
    E("aten::bitwise_and.Tensor", INTB, k_band), E("aten::bitwise_and_.Tensor", INTB, k_band),
    E("aten::bitwise_and.Scalar", INTB, k_band), E("aten::bitwise_and_.Scalar", INTB, k_band),
    E("aten::bitwise_or.Tensor", INTB, k_bor), E("aten::bitwise_or_.Tensor", INTB, k_bor),
    E("aten::bitwise_or.Scalar", INTB, k_bor), E("aten::bitwise_or_.Scalar", INTB, k_bor),
    E("aten::bitwise_xor.Tensor", INTB, k_bxor), E("aten::bitwise_xor_.Tensor", INTB, k_bxor),
    E("aten::bitwise_xor.Scalar", INTB, k_bxor), E("aten::bitwise_xor_.Scalar", INTB, k_bxor),
    E("aten::bitwise_not", INTB, k_bnot), E("aten::bitwise_not_", INTB, k_bnot),
    E("aten::logical_not", ALLD, k_lnot), E("aten::signbit", NUM, k_signbit),
    /* more pointwise */
    E("aten::sin", FLT, k_sin), E("aten::sin_", FLT, k_sin), E("aten::cos", FLT, k_cos), E("aten::cos_", FLT, k_cos),
    E("aten::ceil", NUM, k_ceil), E("aten::ceil_", NUM, k_ceil), E("aten::floor", NUM, k_floor), E("aten::floor_", NUM, k_floor),
    E("aten::trunc", NUM, k_trunc), E("aten::trunc_", NUM, k_trunc), E("aten::sign", NUM, k_sign), E("aten::sign_", NUM, k_sign),
    E("aten::div.Tensor_mode", NUM, k_div_mode), E("aten::div_.Tensor_mode", NUM, k_div_mode),
    E("aten::div.Scalar_mode", NUM, k_div_mode), E("aten::div_.Scalar_mode", NUM, k_div_mode),
    E("aten::fmod.Tensor", NUM, k_fmod), E("aten::fmod_.Tensor", NUM, k_fmod),
    E("aten::fmod.Scalar", NUM, k_fmod), E("aten::fmod_.Scalar", NUM, k_fmod),
    E("aten::remainder.Tensor", NUM, k_remainder), E("aten::remainder_.Tensor", NUM, k_remainder),
    E("aten::remainder.Scalar", NUM, k_remainder), E("aten::remainder_.Scalar", NUM, k_remainder),
    /* more reductions */
    E("aten::max", ALLD, k_max_all), E("aten::min", ALLD, k_min_all),
    E("aten::amin", ALLD, k_amin), E("aten::max.dim", NUM, k_max_dim), E("aten::min.dim", NUM, k_min_dim),
    E("aten::argmax", NUM, k_argmax), E("aten::argmin", NUM, k_argmin),
    E("aten::var.correction", FLT, k_var), E("aten::std.correction", FLT, k_std),
    E("aten::var_mean.correction", FLT, k_var_mean), E("aten::std_mean.correction", FLT, k_std_mean),
    E("aten::cumsum", NUM | B_(FL_BOOL), k_cumsum), E("aten::cumsum_", NUM, k_cumsum),
    /* sort.stable only, and topk for floats only: ties are ordered stably here, while PyTorch's CPU sort(stable=False)
     * and topk order them as its std::sort / nth_element happen to, which `plugin check` compares index by index */
    E("aten::sort.stable", ALLD, k_sort_stable), E("aten::topk", FLT, k_topk),
};
#define NK ((int)(sizeof kernels / sizeof kernels[0]))
static int kernel_count(int *c) { if (!c) return fail(FL_ERR_INVALID, NAME ": kernel_count(NULL)"); *c = NK; return FL_OK; }
static int kernel_get(int i, fl_kernel_entry_t *e) {
    if (i < 0 || i >= NK) return fail(FL_ERR_INVALID, NAME ": kernel index %d out of range [0, %d)", i, NK);
    if (!e) return fail(FL_ERR_INVALID, NAME ": kernel_get(NULL)");
    *e = kernels[i];
    return FL_OK;
}

/* ------------------------------------------------------------------ init */
int fl_plugin_abi_version(void) { return FL_ABI_VERSION; }

static int load_cl(void) {
    if (cl.lib) return FL_OK;
    void *h = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libOpenCL.so", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return fail(FL_ERR_UNSUPPORTED, "no OpenCL driver: libOpenCL.so.1 not found (%s); install one: Debian/Ubuntu "
                    "`apt-get install pocl-opencl-icd ocl-icd-libopencl1` for any CPU, or your GPU vendor's OpenCL driver", dlerror());
#define L(n) if (!(cl.n = (PFN_##n)dlsym(h, #n))) { dlclose(h); memset(&cl, 0, sizeof cl); \
        return fail(FL_ERR_UNSUPPORTED, "no usable OpenCL driver: libOpenCL.so.1 lacks %s (OpenCL 1.2 is needed)", #n); }
    L(clGetPlatformIDs) L(clGetPlatformInfo) L(clGetDeviceIDs) L(clGetDeviceInfo) L(clCreateContext)
    L(clCreateCommandQueue) L(clReleaseCommandQueue) L(clCreateBuffer) L(clReleaseMemObject)
    L(clCreateProgramWithSource) L(clBuildProgram) L(clGetProgramBuildInfo) L(clReleaseProgram) L(clCreateKernel)
    L(clSetKernelArg) L(clEnqueueNDRangeKernel) L(clEnqueueReadBuffer) L(clEnqueueWriteBuffer) L(clEnqueueCopyBuffer)
    L(clEnqueueFillBuffer) L(clEnqueueMarkerWithWaitList) L(clFinish) L(clFlush) L(clWaitForEvents) L(clGetEventInfo)
    L(clGetEventProfilingInfo) L(clReleaseEvent) L(clCreateProgramWithBinary) L(clGetProgramInfo) L(clGetKernelInfo)
    L(clGetKernelWorkGroupInfo) L(clReleaseKernel)
#undef L
    cl.lib = h;
    return FL_OK;
}

/* D->opts (OpenCL C 1.2 where the device has it, -DHAS_FP64 with cl_khr_fp64) and D->ident (what a program
 * binary depends on besides its options and source: the binary cache's key) */
static void build_identity(dev_t_ *D) {
    char cv[128] = "";
    cl.clGetDeviceInfo(D->id, CL_DEVICE_OPENCL_C_VERSION, sizeof cv - 1, cv, NULL);
    int major = 0, minor = 0;
    int c12 = sscanf(cv, "OpenCL C %d.%d", &major, &minor) == 2 && (major > 1 || (major == 1 && minor >= 2));
    snprintf(D->opts, sizeof D->opts, "%s%s", c12 ? "-cl-std=CL1.2" : "", D->fp64 ? " -DHAS_FP64" : "");
    static const struct { int plat; cl_uint what; } parts[] = {
        {1, CL_PLATFORM_NAME}, {1, CL_PLATFORM_VERSION}, {0, CL_DEVICE_NAME}, {0, CL_DEVICE_VENDOR},
        {0, CL_DEVICE_VERSION}, {0, CL_DRIVER_VERSION}, {0, CL_DEVICE_OPENCL_C_VERSION}};
    size_t used = 0;
    for (size_t k = 0; k < sizeof parts / sizeof *parts && used + 2 < sizeof D->ident; k++) {
        char v[256] = "";
        if (parts[k].plat) cl.clGetPlatformInfo(D->plat, parts[k].what, sizeof v - 1, v, NULL);
        else cl.clGetDeviceInfo(D->id, parts[k].what, sizeof v - 1, v, NULL);
        int w = snprintf(D->ident + used, sizeof D->ident - used, "%s\n", v);
        if (w > 0) used += (size_t)w;
    }
    /* The binary cache: FL_OPENCL_CACHE=0 off, =1 every program, unset every program except where the driver
     * keeps its own cache of built programs across processes. pocl does (POCL_KERNEL_CACHE, on by default), and
     * asking it for a binary makes it compile every kernel of the program at once (a generic work-group function
     * each): for the plugin's own programs (dozens of kernels) seconds, once per machine, to gain nothing over
     * pocl's cache; for the JIT's programs (one kernel) a few milliseconds, and a later process then builds one
     * in ~2 ms instead of the ~25 ms pocl's cache takes. So there only programs of FEW_KERNELS are stored. */
    const char *v = getenv("FL_OPENCL_CACHE"), *pk = getenv("POCL_KERNEL_CACHE");
    char pname[128] = "";
    cl.clGetPlatformInfo(D->plat, CL_PLATFORM_NAME, sizeof pname - 1, pname, NULL);
    int own_cache = strstr(pname, "Portable Computing Language") && !(pk && !strcmp(pk, "0"));
    /* the words torch_fl's config check accepts for a boolean (torch_fl/runtime/config.py) */
    int off = v && (!strcasecmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") || !strcasecmp(v, "off"));
    int on = v && (!strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"));
    D->bincache = off ? 0 : on ? 1 : own_cache ? 2 : 1;
}

static int open_devices(void) {
    if (devs) return FL_OK;
    cl_uint np = 0;
    cl_int e = cl.clGetPlatformIDs(0, NULL, &np);
    if (e || !np)
        return fail(FL_ERR_UNSUPPORTED, "no OpenCL platform: libOpenCL.so.1 loaded but lists no platform (error %d); install a "
                    "driver: Debian/Ubuntu `apt-get install pocl-opencl-icd` for any CPU, or your GPU vendor's OpenCL driver", e);
    cl_platform_id plats[16];
    if (np > 16) np = 16;
    cl.clGetPlatformIDs(np, plats, NULL);
    dev_t_ *ds = calloc(64, sizeof *ds);
    if (!ds) return fail(FL_ERR_OOM, NAME ": host out of memory");
    int n = 0;
    for (cl_uint p = 0; p < np && n < 64; p++) {
        cl_device_id ids[16];
        cl_uint nd = 0;
        if (cl.clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 16, ids, &nd) || !nd) continue;
        if (nd > 16) nd = 16;
        if (!n) cl.clGetPlatformInfo(plats[p], CL_PLATFORM_VENDOR, sizeof g_vendor_buf, g_vendor_buf, NULL);
        for (cl_uint i = 0; i < nd && n < 64; i++) {
            dev_t_ *D = &ds[n];
            D->plat = plats[p];
            D->id = ids[i];
            cl.clGetDeviceInfo(ids[i], CL_DEVICE_NAME, sizeof D->name - 1, D->name, NULL);
            cl_ulong gm = 0, ma = 0;
            cl_uint cu = 0;
            cl.clGetDeviceInfo(ids[i], CL_DEVICE_GLOBAL_MEM_SIZE, sizeof gm, &gm, NULL);
            cl.clGetDeviceInfo(ids[i], CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof ma, &ma, NULL);
            cl.clGetDeviceInfo(ids[i], CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu, NULL);
            cl_ulong dtype = 0;
            if (cl.clGetDeviceInfo(ids[i], CL_DEVICE_TYPE, sizeof dtype, &dtype, NULL) == 0)
                D->host_cpu = (dtype & CL_DEVICE_TYPE_CPU) != 0;
            size_t xl = 0;
            cl.clGetDeviceInfo(ids[i], CL_DEVICE_EXTENSIONS, 0, NULL, &xl);
            char *ext = calloc(1, xl + 1);
            if (ext) { cl.clGetDeviceInfo(ids[i], CL_DEVICE_EXTENSIONS, xl, ext, NULL); D->fp64 = strstr(ext, "cl_khr_fp64") != NULL; free(ext); }
            D->mem_total = gm; D->max_alloc = ma ? ma : gm; D->cus = (int)cu;
            D->ctx = cl.clCreateContext(NULL, 1, &ids[i], NULL, NULL, &e);
            if (!D->ctx || e) continue;
            D->q = cl.clCreateCommandQueue(D->ctx, ids[i], CL_QUEUE_PROFILING_ENABLE, &e);
            if (!D->q || e) continue;
            build_identity(D);
            char zeros[256] = {0};
            D->scratch = cl.clCreateBuffer(D->ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof zeros, zeros, &e);
            if (e) D->scratch = NULL; /* jit_launch then says so */
            /* reserve the device's address range: 4x its memory, at most 1 TiB, never readable by the host */
            size_t vs = gm * 4;
            if (vs > (1ull << 40)) vs = 1ull << 40;
            if (vs < (1ull << 30)) vs = 1ull << 30;
            void *base = mmap(NULL, vs, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (base == MAP_FAILED) continue;
            D->vbase = ((uintptr_t)base + ALIGN - 1) / ALIGN * ALIGN;
            D->vsize = vs - (D->vbase - (uintptr_t)base);
            D->free_ = malloc(1024 * sizeof(ext_t));
            D->capfree = 1024; D->nfree = 1;
            D->free_[0] = (ext_t){D->vbase, D->vsize / ALIGN * ALIGN};
            pthread_mutex_init(&D->mlock, NULL);
            pthread_mutex_init(&D->klock, NULL);
            pthread_mutex_init(&D->rlock, NULL);
            pthread_mutex_init(&D->elock, NULL);
            D->seed = 67280421310721ull;
            n++;
        }
    }
    if (!n) { free(ds); return fail(FL_ERR_UNSUPPORTED, "no OpenCL device: %u platform(s) but no usable device; install a driver "
                                    "(Debian/Ubuntu `apt-get install pocl-opencl-icd` for any CPU, or your GPU vendor's)", np); }
    devs = ds;
    ndev = n;
    if (g_vendor_buf[0]) g_vendor = g_vendor_buf;
    return FL_OK;
}

int fl_plugin_init(fl_plugin_t *p) {
    if (!p) return fail(FL_ERR_INVALID, NAME ": fl_plugin_init(NULL)");
    memset(p, 0, sizeof *p);
    p->last_error = last_error;
    p->name = NAME; /* set first: a machine without a driver lists the backend by name, as unavailable */
    int st = load_cl();
    if (!st) st = open_devices();
    if (st) return st;
    p->abi_version = FL_ABI_VERSION;
    p->struct_size = sizeof *p;
    p->name = NAME;
    p->vendor = g_vendor;
    p->version = "0.1.0";
    static char desc[256];
    const char *why = NULL;
    if (ocl_clblast_version(&why))
        snprintf(desc, sizeof desc, "OpenCL devices through the system's ICD loader (pocl, or a GPU vendor's driver); "
                 "GEMM: CLBlast on %s, else the plugin's register-blocked kernel",
                 ocl_clblast_for(1) ? "every device (FL_OPENCL_CLBLAST=1)" : "GPU and accelerator devices");
    else
        snprintf(desc, sizeof desc, "OpenCL devices through the system's ICD loader (pocl, or a GPU vendor's driver); "
                 "GEMM: the plugin's register-blocked kernel (CLBlast %s)", why ? why : "");
    p->description = desc;
    p->emulated = 0;
    p->device_count = device_count;
    p->device_props = device_props;
    p->malloc = dev_malloc;
    p->free = dev_free;
    p->memory_used = memory_used;
    p->copy_h2d = copy_h2d;
    p->copy_d2h = copy_d2h;
    p->copy_d2d = copy_d2d;
    p->stream_create = stream_create;
    p->stream_wait_event = stream_wait_event;
    p->stream_destroy = stream_destroy;
    p->stream_synchronize = stream_sync;
    p->event_create = event_create;
    p->event_destroy = event_destroy;
    p->event_record = event_record;
    p->event_synchronize = event_sync;
    p->event_query = event_query;
    p->synchronize = synchronize;
    p->rng_set_state = rng_set_state;
    p->rng_get_state = rng_get_state;
    p->kernel_count = kernel_count;
    p->kernel_get = kernel_get;
    p->event_elapsed = event_elapsed;
    p->mem_set = mem_set;
    p->copy_d2h_async = copy_d2h_async;
    p->jit_language = FL_JIT_OPENCL_C;
    p->jit_build = jit_build;
    p->jit_launch = jit_launch;
    return FL_OK;
}
