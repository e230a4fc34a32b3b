/* bincache.c — the OpenCL plugin's on-disk cache of program binaries.
 *
 * Building OpenCL C is slow on some drivers (pocl: hundreds of milliseconds a program), and the plugin
 * builds its own programs and the device JIT's kernels in every process. So a program's binary, as the
 * driver returns it after a build, is kept under a name derived from everything the build depends on
 * (the SHA-256 of the platform's and the device's names and versions, the build options and the source);
 * a later process hands it back to the driver (clCreateProgramWithBinary) instead of compiling.
 *
 * The cache holds code every torch_fl process of this user runs, so it follows the host JIT cache's rules
 * (plugins_cffi/host/jit.c, docs/security.md), in an `opencl` subfolder of the same place:
 *  - $FL_JIT_CACHE/opencl, else $FL_CACHE_DIR/jit/opencl, else $XDG_CACHE_HOME/torch_fl/jit/opencl, else
 *    ~/.cache/torch_fl/jit/opencl with the home folder from HOME or the password database, and only when
 *    there is no home folder /tmp/torch_fl-<uid>/jit/opencl. Missing folders are created 0700; the folder
 *    must be owned by this user (not reached through another user's symbolic link), checked on every use;
 *    a looser mode of our own folder is tightened to 0700, a foreign folder is refused;
 *  - files are created with O_CREAT|O_EXCL|O_NOFOLLOW under a temporary name and renamed into place;
 *  - each NAME.bin lies beside NAME.bin.sha256, the digest of the bytes the driver produced. Before a load
 *    both must be regular files of ours that others cannot write, and the bytes read (the very bytes then
 *    given to the driver) must match the digest; anything else is rebuilt from source, with a note on stderr
 *    (a binary without a digest is rebuilt silently).
 * The cache never fails an op: when it cannot be used (a foreign folder, no room, no permission) programs
 * are built from source and stderr says why, once per process.
 *
 * FL_OPENCL_CACHE=0 turns the cache off, =1 on for every program; unset, it is on, except that with a driver
 * that keeps its own cache of built programs (pocl with POCL_KERNEL_CACHE on) only programs of a few kernels,
 * the JIT's, are stored: for pocl's sake (opencl.c, build_identity). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bincache.h"
#include "fl_host.h" /* fl_sha256_*, fl_cache_dir (plugins_cffi/host/sha256.c, cachedir.c, compiled in) */

#define PATH_CAP 1024
#define MAX_BINARY (512u << 20) /* larger files are not read back */

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int noted; /* the one note a process prints when the cache cannot be used */

static void note_once(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note_once(const char *fmt, ...) {
    if (atomic_exchange(&noted, 1)) return;
    char msg[PATH_CAP + 256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "torch_fl OpenCL: not using the program cache: %s; programs are built from source "
            "(FL_OPENCL_CACHE=0 turns the cache off)\n", msg);
}

/* ---- where the cache is (jit.c's order, with an `opencl` subfolder) ---- */
static int cache_dir(char *out, size_t n) { return fl_cache_dir(out, n, "/opencl", 128); }


/* the cache folder, opened: 0 and *dirfd, or -1 with the one-time note saying why. Only a store creates
 * it (`create`): a lookup in a folder that does not exist is a silent miss, so a process that builds
 * nothing worth storing leaves no folder behind */
static int open_cache(char *dir, size_t n, int *dirfd, int create) {
    uid_t me = geteuid();
    struct stat link, st;
    if (cache_dir(dir, n)) { note_once("the cache folder's path is too long"); return -1; }
    if (!create && lstat(dir, &link) && errno == ENOENT) return -1;
    if ((create && fl_make_dirs(dir)) || lstat(dir, &link)) {
        note_once("cannot create the cache folder %s: %s", dir, strerror(errno));
        return -1;
    }
    if (S_ISLNK(link.st_mode) && link.st_uid != me && link.st_uid != 0) {
        note_once("the cache folder %s is a symbolic link owned by another user (uid %u); torch_fl runs code "
                  "from it, so it must be private: remove it or set FL_JIT_CACHE", dir, (unsigned)link.st_uid);
        return -1;
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st)) {
        note_once("cannot open the cache folder %s: %s", dir, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    if (st.st_uid != me) {
        close(fd);
        note_once("the cache folder %s is owned by another user (uid %u), who could plant code in it; it must be "
                  "yours (mode 0700): remove it or set FL_JIT_CACHE to a folder of your own", dir, (unsigned)st.st_uid);
        return -1;
    }
    if ((st.st_mode & 077) && fchmod(fd, 0700)) {
        note_once("cannot make the cache folder %s private: %s", dir, strerror(errno));
        close(fd);
        return -1;
    }
    *dirfd = fd;
    return 0;
}

/* A regular file of ours that nobody else can write, opened without following links: the fd, -1 when it
 * does not exist, -2 when it exists but must not be trusted. */
static int open_trusted(int dirfd, const char *name) {
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0) return errno == ENOENT ? -1 : -2;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022)) {
        close(fd);
        return -2;
    }
    return fd;
}

static void digest_of(const void *p, size_t n, char hex[65]) {
    fl_sha256_t s;
    fl_sha256_init(&s);
    fl_sha256_update(&s, p, n);
    fl_sha256_hex(&s, hex);
}

void ocl_cache_name(const char *const *parts, int n, char name[OCL_CACHE_NAME]) {
    fl_sha256_t s;
    char hex[65];
    fl_sha256_init(&s);
    fl_sha256_update(&s, "torch_fl opencl binary 1", 25); /* the format of this cache, its NUL included */
    for (int i = 0; i < n; i++) fl_sha256_update(&s, parts[i], strlen(parts[i]) + 1);
    fl_sha256_hex(&s, hex);
    snprintf(name, OCL_CACHE_NAME, "ocl_%.40s.bin", hex);
}

/* the whole file into a malloc'ed buffer; -1 when it cannot be read or is too large */
static int read_all(int fd, unsigned char **out, size_t *n) {
    struct stat st;
    if (fstat(fd, &st) || st.st_size <= 0 || (uint64_t)st.st_size > MAX_BINARY) return -1;
    size_t sz = (size_t)st.st_size, got = 0;
    unsigned char *b = malloc(sz);
    if (!b) return -1;
    while (got < sz) {
        ssize_t k = pread(fd, b + got, sz - got, (off_t)got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { free(b); return -1; }
        got += (size_t)k;
    }
    *out = b;
    *n = sz;
    return 0;
}

static void unlink_entry(int dirfd, const char *name) {
    char sum[OCL_CACHE_NAME + 8];
    snprintf(sum, sizeof sum, "%s.sha256", name);
    unlinkat(dirfd, name, 0);
    unlinkat(dirfd, sum, 0);
}

int ocl_cache_load(const char *name, unsigned char **bin, size_t *n) {
    *bin = NULL;
    *n = 0;
    char dir[PATH_CAP], sum_name[OCL_CACHE_NAME + 8], recorded[65] = "", actual[65];
    const char *why = NULL;
    int dirfd, found = 0;
    snprintf(sum_name, sizeof sum_name, "%s.sha256", name);
    pthread_mutex_lock(&cache_mu);
    if (open_cache(dir, sizeof dir, &dirfd, 0)) { pthread_mutex_unlock(&cache_mu); return 0; }
    int b = open_trusted(dirfd, name), s = b == -1 ? -1 : open_trusted(dirfd, sum_name);
    if (b == -1 || (b >= 0 && s == -1)) {
        /* nothing cached, or a binary without its digest: built again (and recorded) silently */
    } else if (b < 0 || s < 0) {
        why = "it or its digest is not a regular file of yours that only you can write";
    } else if (read_all(b, bin, n) || pread(s, recorded, 64, 0) != 64) {
        why = "it cannot be read back";
    } else {
        digest_of(*bin, *n, actual);
        if (memcmp(recorded, actual, 64)) why = "its bytes do not match the digest recorded when it was built "
                                                "(truncated or changed)";
        else found = 1;
    }
    if (b >= 0) close(b);
    if (s >= 0) close(s);
    if (!found) {
        free(*bin);
        *bin = NULL;
        *n = 0;
    }
    if (why) {
        fprintf(stderr, "torch_fl OpenCL: not loading the cached program %s/%s: %s; rebuilding it\n", dir, name, why);
        unlink_entry(dirfd, name);
    }
    close(dirfd);
    pthread_mutex_unlock(&cache_mu);
    return found;
}

/* a new file of ours under a temporary name in the folder (never through a planted link); 0 and its name */
static int write_temp(int dirfd, const char *name, const void *data, size_t n, char *tmp, size_t ntmp) {
    static atomic_uint counter;
    int fd = -1;
    for (int attempt = 0; attempt < 8 && fd < 0; attempt++) {
        snprintf(tmp, ntmp, ".%s.%ld.%u.tmp", name, (long)getpid(), atomic_fetch_add(&counter, 1));
        fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST) return -1;
    }
    if (fd < 0) return -1;
    const char *p = data;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { close(fd); unlinkat(dirfd, tmp, 0); return -1; }
        p += k;
        n -= (size_t)k;
    }
    if (close(fd)) { unlinkat(dirfd, tmp, 0); return -1; }
    return 0;
}

void ocl_cache_store(const char *name, const void *bin, size_t n) {
    if (!bin || !n || n > MAX_BINARY) return;
    char dir[PATH_CAP], sum_name[OCL_CACHE_NAME + 8], digest[66], tb[OCL_CACHE_NAME + 48], ts[OCL_CACHE_NAME + 48];
    int dirfd;
    digest_of(bin, n, digest);
    digest[64] = '\n';
    snprintf(sum_name, sizeof sum_name, "%s.sha256", name);
    pthread_mutex_lock(&cache_mu);
    if (open_cache(dir, sizeof dir, &dirfd, 1)) { pthread_mutex_unlock(&cache_mu); return; }
    int bad = write_temp(dirfd, name, bin, n, tb, sizeof tb);
    if (!bad && write_temp(dirfd, sum_name, digest, 65, ts, sizeof ts)) { unlinkat(dirfd, tb, 0); bad = 1; }
    /* the digest first: a reader never meets a new binary beside no digest */
    if (!bad && (renameat(dirfd, ts, dirfd, sum_name) || renameat(dirfd, tb, dirfd, name))) {
        int e = errno;
        unlinkat(dirfd, ts, 0);
        unlinkat(dirfd, tb, 0);
        errno = e;
        bad = 1;
    }
    if (bad) note_once("cannot store a program in %s: %s", dir, strerror(errno));
    close(dirfd);
    pthread_mutex_unlock(&cache_mu);
}

void ocl_cache_drop(const char *name, const char *why) {
    char dir[PATH_CAP];
    int dirfd;
    pthread_mutex_lock(&cache_mu);
    if (!open_cache(dir, sizeof dir, &dirfd, 0)) {
        fprintf(stderr, "torch_fl OpenCL: not loading the cached program %s/%s: %s; rebuilding it\n", dir, name, why);
        unlink_entry(dirfd, name);
        close(dirfd);
    }
    pthread_mutex_unlock(&cache_mu);
}
