/* The emulated-device runtime shared by every emulator: devices, memory kept
 * apart from host memory, explicit copies, synchronous streams, per-device
 * counter RNG, and a kernel table cut from the host kernels by the profile.
 *
 * Honest about what it is: the "device memory" is host RAM obtained with
 * posix_memalign, but the device never declares FL_FEATURE_HOST_ACCESSIBLE,
 * so torch_fl treats it as foreign memory and moves data only through
 * copy_h2d/copy_d2h/copy_d2d, exactly as it must for a real accelerator. */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdlib.h>

#include "emu.h"

#define MAX_DEVICES 8
#define HDR 64

static int n_devices = -1;
static uint64_t mem_limit;
static atomic_uint_fast64_t used[MAX_DEVICES];
static uint64_t rng_seed[MAX_DEVICES], rng_offset[MAX_DEVICES];

/* The emulator's settings, read once. torch_fl validated and normalised them (plain integers)
 * before loading the plugin; a value a plugin cannot use still fails loudly here, naming it. */
static int config_status = -1;
static char config_error[256];

static int configure(void) {
    if (config_status >= 0) {
        if (config_status) FL_FAIL(config_status, "%s", config_error);
        return FL_OK;
    }
    char key[96], what[96];
    snprintf(key, sizeof key, "FL_%s_MEMORY_LIMIT", fl_emu_profile.env_prefix);
    int st = fl_host_env_size(key, fl_emu_profile.default_memory, &mem_limit);
    int n = 0;
    if (!st) {
        snprintf(key, sizeof key, "FL_%s_DEVICES", fl_emu_profile.env_prefix);
        snprintf(what, sizeof what, "the %s emulator's device count", fl_emu_profile.name);
        st = fl_host_env_count(key, fl_emu_profile.default_devices, 1, MAX_DEVICES, what, &n);
    }
    if (st) {
        snprintf(config_error, sizeof config_error, "%s", fl_host_last_error());
        config_status = st;
        return st;
    }
    if (!st) st = fl_emu_async_configure(n, mem_limit);
    if (st) {
        snprintf(config_error, sizeof config_error, "%s", fl_host_last_error());
        config_status = st;
        return st;
    }
    for (int i = 0; i < n; i++) rng_seed[i] = 67280421310721ull + (uint64_t)i;
    n_devices = n;
    config_status = FL_OK;
    return FL_OK;
}

static int check_device(int device) {
    int st = configure();
    if (st) return st;
    if (device < 0 || device >= n_devices)
        FL_FAIL(FL_ERR_INVALID, "%s: no device %d (this emulator has %d)", fl_emu_profile.name, device, n_devices);
    return FL_OK;
}

static int device_count(int *count) {
    int st = configure();
    if (st) return st;
    *count = n_devices;
    return FL_OK;
}

static int device_props(int device, fl_device_props_t *p) {
    int st = check_device(device);
    if (st) return st;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s #%d (emulated)", fl_emu_profile.device_name, device);
    p->total_memory = mem_limit;
    p->dtypes = fl_emu_profile.dtypes;
    p->features = fl_emu_profile.features & ~FL_FEATURE_HOST_ACCESSIBLE;
    if (fl_emu_async_on()) p->features |= FL_FEATURE_ASYNC_KERNELS;
    p->compute_units = fl_emu_profile.compute_units;
    return FL_OK;
}

static int emu_malloc(int device, size_t nbytes, void **ptr) {
    int st = check_device(device);
    if (st) return st;
    uint64_t now = atomic_fetch_add(&used[device], nbytes) + nbytes;
    if (now > mem_limit) {
        atomic_fetch_sub(&used[device], nbytes);
        FL_FAIL(FL_ERR_OOM, "%s: device %d cannot allocate %zu bytes: %llu of %llu bytes in use",
                fl_emu_profile.name, device, nbytes, (unsigned long long)(now - nbytes),
                (unsigned long long)mem_limit);
    }
    if (fl_emu_async_on()) {
        st = fl_emu_far_alloc(device, nbytes, ptr);
        if (st) atomic_fetch_sub(&used[device], nbytes);
        return st;
    }
    void *block = NULL;
    if (posix_memalign(&block, 64, nbytes + HDR) != 0) {
        atomic_fetch_sub(&used[device], nbytes);
        FL_FAIL(FL_ERR_OOM, "%s: the host refused %zu bytes of emulated device memory", fl_emu_profile.name, nbytes);
    }
    ((size_t *)block)[0] = nbytes;
    ((size_t *)block)[1] = (size_t)device;
    *ptr = (char *)block + HDR;
    return FL_OK;
}

static int emu_free(int device, void *ptr) {
    int st = check_device(device);
    if (st) return st;
    if (!ptr) return FL_OK;
    if (fl_emu_async_on()) {
        size_t nbytes = 0;
        st = fl_emu_far_free(device, ptr, &nbytes);
        if (!st) atomic_fetch_sub(&used[device], nbytes);
        return st;
    }
    size_t *block = (size_t *)((char *)ptr - HDR);
    if ((int)block[1] != device)
        FL_FAIL(FL_ERR_INVALID, "%s: free of a block of device %d on device %d", fl_emu_profile.name, (int)block[1],
                device);
    atomic_fetch_sub(&used[device], block[0]);
    free(block);
    return FL_OK;
}

static int memory_used(int device, uint64_t *bytes) {
    int st = check_device(device);
    if (st) return st;
    *bytes = atomic_load(&used[device]);
    return FL_OK;
}

static int copy(int device, void *dst, const void *src, size_t n, fl_stream_t s) {
    (void)s;
    int st = check_device(device);
    if (st) return st;
    if (n && (!dst || !src))
        FL_FAIL(FL_ERR_INVALID, "%s: copy of %zu bytes with a NULL pointer", fl_emu_profile.name, n);
    memmove(dst, src, n);
    return FL_OK;
}

FL_SYNC_STREAMS(check_device)

/* Whether the stream and event entry points are streams.c's (real streams), not FL_SYNC_STREAMS's. */
static int real_streams(void) { return fl_emu_async_on() || (fl_emu_profile.features & FL_FEATURE_ASYNC_COPY); }

/* The asynchronous versions (streams.c) behind the same device checks; device addresses become the
 * plugin's own view of the memory (async.c) before anything touches them. */
static int async_copy(int device, void *dst, const void *src, size_t n, fl_stream_t s) {
    int st = check_device(device);
    return st ? st : fl_emu_copy_async(device, fl_emu_far_host(dst), fl_emu_far_host(src), n, s);
}
static int mem_set(int device, void *dst, int value, size_t n, fl_stream_t s) {
    int st = check_device(device);
    return st ? st : fl_emu_fill(device, fl_emu_far_host(dst), value, n, real_streams() ? s : NULL);
}
/* Pinned host memory: page-aligned host memory (an emulator has nothing to pin; a chip's driver would
 * page-lock it), so the runtime's non_blocking copies have somewhere to go. */
static int host_alloc(int device, size_t n, void **ptr) {
    int st = check_device(device);
    if (st) return st;
    if (posix_memalign(ptr, 4096, n ? n : 1) != 0)
        FL_FAIL(FL_ERR_OOM, "%s: cannot allocate %zu bytes of pinned host memory", fl_emu_profile.name, n);
    return FL_OK;
}
static int host_free(int device, void *ptr) {
    int st = check_device(device);
    if (st) return st;
    free(ptr);
    return FL_OK;
}
/* A device-to-host copy that may return before it lands (queued on the stream, NULL = the default one). */
static int copy_d2h_async(int device, void *dst, const void *src, size_t n, fl_stream_t s) {
    int st = check_device(device);
    if (st) return st;
    return fl_emu_copy_async_on(device, dst, fl_emu_far_host(src), n, s);
}
static int event_elapsed(int device, fl_event_t a, fl_event_t b, double *ms) {
    int st = check_device(device);
    return st ? st : fl_emu_event_elapsed(device, a, b, ms);
}
static int async_stream_create(int device, fl_stream_t *s) {
    int st = check_device(device);
    return st ? st : fl_emu_stream_create(device, s);
}
static int async_stream_destroy(int device, fl_stream_t s) {
    int st = check_device(device);
    return st ? st : fl_emu_stream_destroy(device, s);
}
static int async_stream_sync(int device, fl_stream_t s) {
    int st = check_device(device);
    return st ? st : fl_emu_stream_synchronize(device, s);
}
static int async_event_create(int device, fl_event_t *e) {
    int st = check_device(device);
    return st ? st : fl_emu_event_create(device, e);
}
static int async_event_destroy(int device, fl_event_t e) {
    int st = check_device(device);
    return st ? st : fl_emu_event_destroy(device, e);
}
static int async_event_record(int device, fl_event_t e, fl_stream_t s) {
    int st = check_device(device);
    return st ? st : fl_emu_event_record(device, e, s);
}
static int async_event_sync(int device, fl_event_t e) {
    int st = check_device(device);
    return st ? st : fl_emu_event_synchronize(device, e);
}
static int async_event_query(int device, fl_event_t e, int *done) {
    int st = check_device(device);
    return st ? st : fl_emu_event_query(device, e, done);
}
static int async_stream_wait_event(int device, fl_stream_t s, fl_event_t e) {
    int st = check_device(device);
    return st ? st : fl_emu_stream_wait_event(device, s, e);
}
static int async_synchronize(int device) {
    int st = check_device(device);
    return st ? st : fl_emu_synchronize_all(device);
}

/* The generator's state as the queued kernels leave it: they draw their offsets when they run. */
static int rng_set(int device, uint64_t seed, uint64_t offset) {
    int st = check_device(device);
    if (!st && fl_emu_async_on()) st = fl_emu_stream_synchronize(device, NULL);
    if (st) return st;
    rng_seed[device] = seed;
    rng_offset[device] = offset;
    return FL_OK;
}
static int rng_get(int device, uint64_t *seed, uint64_t *offset) {
    int st = check_device(device);
    if (!st && fl_emu_async_on()) st = fl_emu_stream_synchronize(device, NULL);
    if (st) return st;
    *seed = rng_seed[device];
    *offset = rng_offset[device];
    return FL_OK;
}
uint64_t fl_host_rng_reserve(int device, uint64_t count, uint64_t *seed) {
    if (device < 0 || device >= MAX_DEVICES) device = 0;
    uint64_t start = rng_offset[device];
    rng_offset[device] += count;
    *seed = rng_seed[device];
    return start;
}

/* ---- kernel table: host kernels the profile keeps, in its dtypes, plus its fused kernels ---- */
static fl_kernel_entry_t *table;
static int table_len = -1;

static int listed(const char *const *list, const char *op) {
    for (; list && *list; list++)
        if (strcmp(*list, op) == 0) return 1;
    return 0;
}

static int build_table(void) {
    if (table_len >= 0) return FL_OK;
    int cap = 0;
    for (int g = 0; g < fl_host_ngroups; g++) cap += fl_host_groups[g]->count;
    for (const fl_kernel_group_t *const *f = fl_emu_profile.fused; f && *f; f++) cap += (*f)->count;
    table = calloc((size_t)cap + 1, sizeof *table);
    if (!table) FL_FAIL(FL_ERR_OOM, "%s: cannot allocate the kernel table", fl_emu_profile.name);
    int n = 0;
    for (int g = 0; g < fl_host_ngroups; g++)
        for (int i = 0; i < fl_host_groups[g]->count; i++) {
            fl_kernel_entry_t e = fl_host_groups[g]->entries[i];
            if (fl_emu_profile.only && !listed(fl_emu_profile.only, e.op)) continue;
            if (listed(fl_emu_profile.without, e.op)) continue;
            e.dtypes &= fl_emu_profile.dtypes;
            if (e.dtypes) table[n++] = e;
        }
    for (const fl_kernel_group_t *const *f = fl_emu_profile.fused; f && *f; f++)
        for (int i = 0; i < (*f)->count; i++) {
            fl_kernel_entry_t e = (*f)->entries[i];
            e.dtypes &= fl_emu_profile.dtypes;
            if (e.dtypes) table[n++] = e;
        }
    if (fl_emu_async_on()) /* each kernel queues its work through a launch slot of its own */
        for (int i = 0; i < n; i++) {
            table[i].fn = fl_emu_async_wrap(table[i].op, table[i].fn);
            if (!table[i].fn) FL_FAIL(FL_ERR_INTERNAL, "%s: more kernels than launch slots", fl_emu_profile.name);
        }
    table_len = n;
    return FL_OK;
}

static int jit_compile(const char *source, const char *symbol, fl_kernel_fn *fn) {
    int st = fl_host_jit_compile(source, symbol, fn);
    if (st || !fl_emu_async_on()) return st;
    fl_kernel_fn wrapped = fl_emu_async_wrap(symbol, *fn);
    if (!wrapped)
        FL_FAIL(FL_ERR_UNSUPPORTED, "%s: every launch slot of the asynchronous emulator is in use; %s runs on "
                "another tier", fl_emu_profile.name, symbol);
    *fn = wrapped;
    return FL_OK;
}

static int kernel_count(int *count) {
    int st = build_table();
    if (st) return st;
    *count = table_len;
    return FL_OK;
}

static int kernel_get(int index, fl_kernel_entry_t *entry) {
    int st = build_table();
    if (st) return st;
    if (index < 0 || index >= table_len) FL_FAIL(FL_ERR_INVALID, "%s: kernel index %d out of range", fl_emu_profile.name, index);
    *entry = table[index];
    return FL_OK;
}

int fl_plugin_abi_version(void) { return FL_ABI_VERSION; }

int fl_plugin_init(fl_plugin_t *p) {
    memset(p, 0, sizeof *p);
    p->last_error = fl_host_last_error; /* first: a bad setting is reported through it */
    int st = configure();
    if (st) return st;
    p->abi_version = FL_ABI_VERSION;
    p->struct_size = sizeof *p;
    p->name = fl_emu_profile.name;
    p->vendor = fl_emu_profile.vendor;
    p->version = "0.1.0";
    p->description = fl_emu_profile.description;
    p->emulated = 1;
    p->device_count = device_count;
    p->device_props = device_props;
    p->malloc = emu_malloc;
    p->free = emu_free;
    p->memory_used = memory_used;
    p->copy_h2d = copy;
    p->copy_d2h = copy;
    p->copy_d2d = copy;
    p->stream_create = stream_create;
    p->stream_destroy = stream_destroy;
    p->stream_synchronize = stream_sync;
    p->event_create = event_create;
    p->event_destroy = event_destroy;
    p->event_record = event_record;
    p->event_synchronize = event_sync;
    p->event_query = event_query;
    p->synchronize = synchronize;
    p->rng_set_state = rng_set;
    p->rng_get_state = rng_get;
    p->kernel_count = kernel_count;
    p->kernel_get = kernel_get;
    p->last_error = fl_host_last_error;
    p->jit_compile = jit_compile;
    p->mem_set = mem_set;
    if (real_streams()) { /* copies overlap with compute; in the asynchronous mode kernels too */
        p->copy_h2d = p->copy_d2h = p->copy_d2d = async_copy;
        p->stream_create = async_stream_create;
        p->stream_destroy = async_stream_destroy;
        p->stream_synchronize = async_stream_sync;
        p->event_create = async_event_create;
        p->event_destroy = async_event_destroy;
        p->event_record = async_event_record;
        p->event_synchronize = async_event_sync;
        p->event_query = async_event_query;
        p->synchronize = async_synchronize;
        p->event_elapsed = event_elapsed;
        p->host_alloc = host_alloc;
        p->host_free = host_free;
        p->copy_d2h_async = copy_d2h_async;
    }
    /* a wait queued on a stream orders that stream's later work only where kernels go through the streams
     * too (the asynchronous mode); otherwise kernels run at their call and the runtime waits on the host */
    if (fl_emu_async_on()) p->stream_wait_event = async_stream_wait_event;
    if (fl_emu_profile.collectives) fl_emu_comm_install(p);
    if (fl_emu_async_on()) fl_emu_async_wrap_comm(p);
    return FL_OK;
}
