/* The host plugin "cpu": a real torch_fl backend whose device memory is host
 * memory. Kernels live in k_*.c; this file holds the device, memory, copy,
 * stream, RNG and table entry points. Streams are synchronous: every kernel
 * has finished when its call returns. */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "fl_host.h"

/* ---- devices and memory ---- */
static atomic_uint_fast64_t used_bytes;
static uint64_t limit_bytes;

/* FL_CPU_MEMORY_LIMIT (validated and normalised to bytes by torch_fl), else physical memory */
static int total_memory(uint64_t *out) {
    if (!limit_bytes) {
        uint64_t v;
        int st = fl_host_env_size("FL_CPU_MEMORY_LIMIT", 0, &v);
        if (st) return st;
        if (!v) v = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
        limit_bytes = v;
    }
    *out = limit_bytes;
    return FL_OK;
}

static int device_count(int *count) { *count = 1; return FL_OK; }

static int check_device(int device) {
    if (device != 0) FL_FAIL(FL_ERR_INVALID, "cpu plugin has one device (0), got device %d", device);
    return FL_OK;
}

static int device_props(int device, fl_device_props_t *p) {
    int st = check_device(device);
    if (st) return st;
    uint64_t total;
    st = total_memory(&total);
    if (st) return st;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "host CPU (%ld cores)", sysconf(_SC_NPROCESSORS_ONLN));
    p->total_memory = total;
    p->dtypes = FL_ALL_DTYPES | FL_COMPLEX;
    p->features = FL_FEATURE_HOST_ACCESSIBLE;
    p->compute_units = (int32_t)sysconf(_SC_NPROCESSORS_ONLN);
    return FL_OK;
}

/* Each block carries its size in a 64-byte header so free can account it. */
#define HDR 64
static int host_malloc(int device, size_t nbytes, void **ptr) {
    int st = check_device(device);
    if (st) return st;
    uint64_t total;
    st = total_memory(&total);
    if (st) return st;
    uint64_t now = atomic_fetch_add(&used_bytes, nbytes) + nbytes;
    if (now > total) {
        atomic_fetch_sub(&used_bytes, nbytes);
        FL_FAIL(FL_ERR_OOM, "cpu: cannot allocate %zu bytes: %llu of %llu bytes in use", nbytes,
                (unsigned long long)(now - nbytes), (unsigned long long)total);
    }
    void *block = NULL;
    if (posix_memalign(&block, 64, nbytes + HDR) != 0) {
        atomic_fetch_sub(&used_bytes, nbytes);
        FL_FAIL(FL_ERR_OOM, "cpu: the operating system refused %zu bytes", nbytes);
    }
    *(size_t *)block = nbytes;
    *ptr = (char *)block + HDR;
    return FL_OK;
}

static int host_free(int device, void *ptr) {
    int st = check_device(device);
    if (st) return st;
    if (!ptr) return FL_OK;
    void *block = (char *)ptr - HDR;
    atomic_fetch_sub(&used_bytes, *(size_t *)block);
    free(block);
    return FL_OK;
}

static int memory_used(int device, uint64_t *bytes) {
    int st = check_device(device);
    if (st) return st;
    *bytes = atomic_load(&used_bytes);
    return FL_OK;
}

static int copy_any(int device, void *dst, const void *src, size_t n, fl_stream_t s) {
    (void)s;
    int st = check_device(device);
    if (st) return st;
    if (n && (!dst || !src)) FL_FAIL(FL_ERR_INVALID, "cpu: copy of %zu bytes with a NULL pointer", n);
    memmove(dst, src, n);
    return FL_OK;
}

FL_SYNC_STREAMS(check_device)

/* ---- RNG ---- */
static uint64_t rng_seed = 67280421310721ull, rng_offset;
static int rng_set(int device, uint64_t seed, uint64_t offset) {
    int st = check_device(device);
    if (st) return st;
    rng_seed = seed; rng_offset = offset;
    return FL_OK;
}
static int rng_get(int device, uint64_t *seed, uint64_t *offset) {
    int st = check_device(device);
    if (st) return st;
    *seed = rng_seed; *offset = rng_offset;
    return FL_OK;
}
uint64_t fl_host_rng_reserve(int device, uint64_t count, uint64_t *seed) {
    (void)device;
    uint64_t start = rng_offset;
    rng_offset += count;
    *seed = rng_seed;
    return start;
}

/* ---- kernel table ---- */
static int kernel_count(int *count) {
    int n = 0;
    for (int g = 0; g < fl_host_ngroups; g++) n += fl_host_groups[g]->count;
    *count = n;
    return FL_OK;
}
static int kernel_get(int index, fl_kernel_entry_t *entry) {
    for (int g = 0; g < fl_host_ngroups; g++) {
        if (index < fl_host_groups[g]->count) { *entry = fl_host_groups[g]->entries[index]; return FL_OK; }
        index -= fl_host_groups[g]->count;
    }
    FL_FAIL(FL_ERR_INVALID, "cpu: kernel index out of range");
}

int fl_plugin_abi_version(void) { return FL_ABI_VERSION; }

int fl_plugin_init(fl_plugin_t *p) {
    memset(p, 0, sizeof *p);
    p->abi_version = FL_ABI_VERSION;
    p->struct_size = sizeof *p;
    p->name = "cpu";
    p->vendor = "torch_fl";
    p->version = "0.1.0";
    p->description = "host CPU: C kernels, BLAS-backed GEMM and convolution";
    p->emulated = 0;
    p->device_count = device_count;
    p->device_props = device_props;
    p->malloc = host_malloc;
    p->free = host_free;
    p->memory_used = memory_used;
    p->copy_h2d = copy_any;
    p->copy_d2h = copy_any;
    p->copy_d2d = copy_any;
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
    p->jit_compile = fl_host_jit_compile;
    return FL_OK;
}
