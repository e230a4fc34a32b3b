/* jit_compile for the host plugin and the emulators: C source in, a kernel
 * function out. The source is compiled with the system C compiler ($CC or
 * cc) into a shared library named after a hash of the source, in the JIT
 * cache ($FL_JIT_CACHE, else $FL_CACHE_DIR/jit, else ~/.cache/torch_fl/jit),
 * so a kernel compiles once per machine; later calls (and processes) load
 * the cached library. A compiler error is returned as FL_ERR_INTERNAL with
 * the compiler's message. Serialised by a mutex: compiling is rare. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fl_host.h"

static pthread_mutex_t jit_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) { h ^= (unsigned char)*s; h *= 1099511628211ull; }
    return h;
}

static int mkdirs(const char *path) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') { *p = 0; if (mkdir(buf, 0755) && errno != EEXIST) return -1; *p = '/'; }
    }
    return (mkdir(buf, 0755) && errno != EEXIST) ? -1 : 0;
}

static void cache_dir(char *out, size_t n) {
    const char *j = getenv("FL_JIT_CACHE"), *c = getenv("FL_CACHE_DIR"), *home = getenv("HOME");
    if (j && *j) snprintf(out, n, "%s", j);
    else if (c && *c) snprintf(out, n, "%s/jit", c);
    else snprintf(out, n, "%s/.cache/torch_fl/jit", home && *home ? home : "/tmp");
}

int fl_host_jit_compile(const char *source, const char *symbol, fl_kernel_fn *fn) {
    if (!source || !symbol || !fn) FL_FAIL(FL_ERR_INVALID, "jit_compile: NULL source, symbol or output");
    char dir[900], so[1024], tmp_so[1100], src[1100], err[1100];
    cache_dir(dir, sizeof dir);
    uint64_t h = fnv1a(source);
    snprintf(so, sizeof so, "%s/jit_%016llx.so", dir, (unsigned long long)h);
    pthread_mutex_lock(&jit_mu);
    if (access(so, R_OK) != 0) {
        if (mkdirs(dir)) {
            pthread_mutex_unlock(&jit_mu);
            FL_FAIL(FL_ERR_INTERNAL, "jit_compile: cannot create the cache folder %s", dir);
        }
        snprintf(src, sizeof src, "%s/jit_%016llx_%d.c", dir, (unsigned long long)h, (int)getpid());
        snprintf(tmp_so, sizeof tmp_so, "%s/jit_%016llx_%d.so", dir, (unsigned long long)h, (int)getpid());
        snprintf(err, sizeof err, "%s/jit_%016llx_%d.err", dir, (unsigned long long)h, (int)getpid());
        FILE *f = fopen(src, "w");
        if (!f) { pthread_mutex_unlock(&jit_mu); FL_FAIL(FL_ERR_INTERNAL, "jit_compile: cannot write %s", src); }
        fputs(source, f);
        fclose(f);
        const char *cc = getenv("CC");
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "%s -O2 -shared -fPIC -o '%s' '%s' -lm 2> '%s'", cc && *cc ? cc : "cc", tmp_so, src,
                 err);
        int rc = system(cmd);
        if (rc != 0) {
            char msg[400] = "";
            FILE *e = fopen(err, "r");
            if (e) { size_t k = fread(msg, 1, sizeof msg - 1, e); msg[k] = 0; fclose(e); }
            unlink(src); unlink(err); unlink(tmp_so);
            pthread_mutex_unlock(&jit_mu);
            FL_FAIL(FL_ERR_INTERNAL, "jit_compile: the C compiler failed (status %d): %s", rc, msg);
        }
        unlink(src); unlink(err);
        if (rename(tmp_so, so) != 0) {
            unlink(tmp_so);
            pthread_mutex_unlock(&jit_mu);
            FL_FAIL(FL_ERR_INTERNAL, "jit_compile: cannot move the kernel into %s", so);
        }
    }
    void *lib = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    pthread_mutex_unlock(&jit_mu);
    if (!lib) FL_FAIL(FL_ERR_INTERNAL, "jit_compile: cannot load %s: %s", so, dlerror());
    void *sym = dlsym(lib, symbol);
    if (!sym) FL_FAIL(FL_ERR_INTERNAL, "jit_compile: %s defines no symbol %s", so, symbol);
    *fn = (fl_kernel_fn)sym;
    return FL_OK;
}
