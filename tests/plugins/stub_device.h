/* The device every test plugin here starts from: one device whose memory is host memory (calloc, free,
 * copies by memmove), a kernel table and a last-error message. A plugin describes itself in a
 * stub_spec_t, calls stub_init from its fl_plugin_init, then replaces the entry points its test is about
 * (a malloc that breaks the contract, copies that accept NULL, memory accounting, ...).
 * tests/conftest.py (build_test_plugin) compiles every plugin with this folder on the include path. */
#ifndef FL_TEST_STUB_DEVICE_H
#define FL_TEST_STUB_DEVICE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_plugin.h"

typedef struct {
    const char *name, *description, *device_name;
    size_t memory;   /* the device's memory: its total_memory, and the most one malloc serves */
    const char *oom; /* malloc's message for a larger request (NULL: "<name>: out of memory") */
    uint32_t dtypes, features;
    int emulated;    /* 1 keeps a test plugin from being the "auto" choice of a folder on FL_PLUGIN_PATH */
    const fl_kernel_entry_t *kernels;
    int n_kernels;
} stub_spec_t;

static const stub_spec_t *stub;
static char stub_msg[256];

/* status, with "<name>: <what>" for last_error */
static int stub_fail(int status, const char *what) {
    snprintf(stub_msg, sizeof stub_msg, "%s: %s", stub->name, what);
    return status;
}
static int stub_device_count(int *n) {
    *n = 1;
    return FL_OK;
}
static int stub_device_props(int d, fl_device_props_t *p) {
    if (d != 0) return stub_fail(FL_ERR_INVALID, "one device");
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", stub->device_name);
    p->total_memory = stub->memory;
    p->dtypes = stub->dtypes;
    p->features = stub->features;
    return FL_OK;
}
static int stub_malloc(int d, size_t n, void **p) {
    (void)d;
    if (n > stub->memory) {
        if (!stub->oom) return stub_fail(FL_ERR_OOM, "out of memory");
        snprintf(stub_msg, sizeof stub_msg, "%s", stub->oom);
        return FL_ERR_OOM;
    }
    *p = calloc(1, n ? n : 1);
    return *p ? FL_OK : stub_fail(FL_ERR_OOM, "host out of memory");
}
static int stub_free(int d, void *p) {
    (void)d;
    free(p);
    return FL_OK;
}
static int stub_copy(int d, void *dst, const void *src, size_t n, fl_stream_t s) {
    (void)d; (void)s;
    if (n && (!dst || !src)) return stub_fail(FL_ERR_INVALID, "NULL pointer");
    memmove(dst, src, n);
    return FL_OK;
}
static int stub_kernel_count(int *n) {
    *n = stub->n_kernels;
    return FL_OK;
}
static int stub_kernel_get(int i, fl_kernel_entry_t *e) {
    if (i < 0 || i >= stub->n_kernels) return stub_fail(FL_ERR_INVALID, "no such kernel");
    *e = stub->kernels[i];
    return FL_OK;
}
static const char *stub_last_error(void) { return stub_msg; }

int fl_plugin_abi_version(void) { return FL_ABI_VERSION; }

/* p filled with the stub's entry points and spec's description (vendor "tests", version "0") */
static int stub_init(fl_plugin_t *p, const stub_spec_t *spec) {
    stub = spec;
    memset(p, 0, sizeof *p);
    p->abi_version = FL_ABI_VERSION;
    p->struct_size = sizeof *p;
    p->name = spec->name;
    p->vendor = "tests";
    p->version = "0";
    p->description = spec->description;
    p->emulated = spec->emulated;
    p->device_count = stub_device_count;
    p->device_props = stub_device_props;
    p->malloc = stub_malloc;
    p->free = stub_free;
    p->copy_h2d = stub_copy;
    p->copy_d2h = stub_copy;
    p->copy_d2d = stub_copy;
    p->kernel_count = stub_kernel_count;
    p->kernel_get = stub_kernel_get;
    p->last_error = stub_last_error;
    return FL_OK;
}

#endif
