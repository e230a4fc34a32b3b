/* jit_compile for the host plugin and the emulators: C source in, a kernel function out.
 *
 * The source is compiled with the system C compiler ($CC, else cc) into a shared library named
 * after a SHA-256 of the compiler and the source, in the JIT cache, so a kernel compiles once per
 * machine; later calls (and processes) load the cached library.
 *
 * The cache holds code every torch_fl process of this user loads, so (docs/security.md):
 *  - it is private: $FL_JIT_CACHE, else $FL_CACHE_DIR/jit, else $XDG_CACHE_HOME/torch_fl/jit, else
 *    ~/.cache/torch_fl/jit with the home folder from HOME or the password database, and only when
 *    there is no home folder /tmp/torch_fl-<uid>/jit. Missing folders are created 0700; the folder
 *    must be owned by this user (not reached through another user's symbolic link), on every call;
 *    a looser mode of our own folder is tightened to 0700, a foreign folder is refused;
 *  - the compiler runs without a shell (posix_spawnp with an argument vector: no path or $CC is
 *    ever parsed by a shell), in a fresh private build folder (mkdtemp); files are created with
 *    O_CREAT|O_EXCL|O_NOFOLLOW and renamed into place, so no planted link is written through;
 *  - each library is stored beside NAME.so.sha256, the digest of the bytes this compiler produced.
 *    Before a load both files must be regular files of ours that others cannot write, and the
 *    library's bytes must match the digest; anything else (truncated, replaced, foreign) is rebuilt,
 *    with a note on stderr. A library without a digest (an older torch_fl's) is rebuilt silently.
 * A compiler failure returns FL_ERR_INTERNAL with the compiler's own message. Serialised by a
 * mutex: compiling is rare. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <pwd.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fl_host.h"

extern char **environ;

static pthread_mutex_t jit_mu = PTHREAD_MUTEX_INITIALIZER;

#define PATH_CAP 1024
#define MAX_CC_ARGS 32

/* ---- where the cache is ---- */
static int cache_dir(char *out, size_t n) { return fl_cache_dir(out, n, "", 64); }

/* ---- a private folder, checked on every use ---- */
static int open_private_dir(const char *path, int *dirfd) {
    uid_t me = geteuid();
    struct stat link, st;
    if (fl_make_dirs(path) || lstat(path, &link))
        FL_FAIL(FL_ERR_INTERNAL, "jit_compile: cannot create the cache folder %s: %s (set FL_JIT_CACHE)", path,
                strerror(errno));
    if (S_ISLNK(link.st_mode) && link.st_uid != me && link.st_uid != 0)
        FL_FAIL(FL_ERR_INTERNAL, "jit_compile: the cache folder %s is a symbolic link owned by another user (uid %u); "
                "torch_fl loads code from it, so it must be private: remove it or set FL_JIT_CACHE", path,
                (unsigned)link.st_uid);
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st)) {
        if (fd >= 0) close(fd);
        FL_FAIL(FL_ERR_INTERNAL, "jit_compile: cannot open the cache folder %s: %s", path, strerror(errno));
    }
    if (st.st_uid != me) {
        close(fd);
        FL_FAIL(FL_ERR_INTERNAL, "jit_compile: the cache folder %s is owned by another user (uid %u), who could plant "
                "code in it; torch_fl loads code from it, so it must be yours (mode 0700): remove it or set "
                "FL_JIT_CACHE to a folder of your own", path, (unsigned)st.st_uid);
    }
    if ((st.st_mode & 077) && fchmod(fd, 0700)) {
        close(fd);
        FL_FAIL(FL_ERR_INTERNAL, "jit_compile: cannot make the cache folder %s private: %s", path, strerror(errno));
    }
    *dirfd = fd;
    return FL_OK;
}

/* A regular file of ours that nobody else can write, opened without following links: the fd, -1 when
 * it does not exist, -2 when it exists but must not be trusted. */
static int open_trusted(int dirfd, const char *name) {
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0) return -1;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022)) {
        close(fd);
        return -2;
    }
    return fd;
}

static int sha256_fd(int fd, char hex[65]) {
    fl_sha256_t s;
    unsigned char buf[65536];
    off_t off = 0;
    ssize_t n;
    fl_sha256_init(&s);
    while ((n = pread(fd, buf, sizeof buf, off)) > 0) {
        fl_sha256_update(&s, buf, (size_t)n);
        off += n;
    }
    if (n < 0) return -1;
    fl_sha256_hex(&s, hex);
    return 0;
}

/* 1: the cached library is the one we built; 0: none (or one from before digests); -1: it must
 * not be loaded (why in `why`). */
static int verify_cached(int dirfd, const char *so_name, char *why, size_t nwhy) {
    char sum_name[128], recorded[65] = "", actual[65];
    snprintf(sum_name, sizeof sum_name, "%s.sha256", so_name);
    int so = open_trusted(dirfd, so_name);
    if (so == -1) return 0;
    int sum = open_trusted(dirfd, sum_name);
    if (so >= 0 && sum == -1) { close(so); return 0; }
    int ok = so >= 0 && sum >= 0;
    if (!ok) snprintf(why, nwhy, "it or its digest is not a regular file of yours that only you can write");
    if (ok && (pread(sum, recorded, 64, 0) != 64 || sha256_fd(so, actual) || memcmp(recorded, actual, 64) != 0)) {
        snprintf(why, nwhy, "its bytes do not match the digest recorded when it was built (truncated or changed)");
        ok = 0;
    }
    if (so >= 0) close(so);
    if (sum >= 0) close(sum);
    return ok ? 1 : -1;
}

/* ---- building ---- */
static int write_new(const char *path, const void *data, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    const char *p = data;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { close(fd); return -1; }
        p += k;
        n -= (size_t)k;
    }
    return close(fd);
}

/* argv: $CC split at spaces (e.g. "ccache gcc"), never through a shell */
static int compiler_argv(char *cc_buf, size_t n, char **argv, const char *out_so, const char *src) {
    const char *cc = getenv("CC");
    snprintf(cc_buf, n, "%s", cc && *cc ? cc : "cc");
    int argc = 0;
    char *save = NULL;
    for (char *tok = strtok_r(cc_buf, " \t", &save); tok && argc < MAX_CC_ARGS - 8; tok = strtok_r(NULL, " \t", &save))
        argv[argc++] = tok;
    if (!argc) argv[argc++] = "cc";
    const char *flags[] = {"-O2", "-fopenmp", "-shared", "-fPIC", "-o", out_so, src, "-lm"};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) argv[argc++] = (char *)flags[i];
    argv[argc] = NULL;
    return argc;
}

static void log_tail(const char *log, char *msg, size_t n) {
    msg[0] = 0;
    int fd = open(log, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return;
    off_t end = lseek(fd, 0, SEEK_END), start = end > (off_t)n - 1 ? end - (off_t)n + 1 : 0;
    ssize_t k = pread(fd, msg, n - 1, start);
    msg[k > 0 ? k : 0] = 0;
    close(fd);
}

static int run_compiler(const char *work, char *msg, size_t nmsg) {
    char src[PATH_CAP + 16], so[PATH_CAP + 16], log[PATH_CAP + 16], cc_buf[512], *argv[MAX_CC_ARGS];
    snprintf(src, sizeof src, "%s/k.c", work);
    snprintf(so, sizeof so, "%s/k.so", work);
    snprintf(log, sizeof log, "%s/cc.log", work);
    compiler_argv(cc_buf, sizeof cc_buf, argv, so, src);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int err = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (err) {
        snprintf(msg, nmsg, "cannot run the C compiler '%s': %s (install a C compiler or set CC)", argv[0],
                 strerror(err));
        return -1;
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
    char tail[360];
    log_tail(log, tail, sizeof tail);
    if (!tail[0]) snprintf(tail, sizeof tail, "(it printed nothing)");
    if (WIFEXITED(status))
        snprintf(msg, nmsg, "the C compiler '%s' exited with status %d: %s", argv[0], WEXITSTATUS(status), tail);
    else
        snprintf(msg, nmsg, "the C compiler '%s' was killed by signal %d: %s", argv[0], WTERMSIG(status), tail);
    return -1;
}

static void remove_work(const char *work) {
    const char *names[] = {"k.c", "k.so", "k.so.sha256", "cc.log"};
    char path[PATH_CAP + 16];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(path, sizeof path, "%s/%s", work, names[i]);
        unlink(path);
    }
    rmdir(work);
}

/* Compiles `source` in a private build folder and renames the library and its digest into the
 * cache as so_name (+ ".sha256"). */
static int build(const char *dir, int dirfd, const char *so_name, const char *source) {
    char work[PATH_CAP + 32], path[PATH_CAP + 48], msg[480], digest[66];
    snprintf(work, sizeof work, "%s/.build-XXXXXX", dir);
    if (!mkdtemp(work)) FL_FAIL(FL_ERR_INTERNAL, "jit_compile: cannot create a build folder in %s: %s", dir,
                                strerror(errno));
    snprintf(path, sizeof path, "%s/k.c", work);
    if (write_new(path, source, strlen(source))) {
        remove_work(work);
        FL_FAIL(FL_ERR_INTERNAL, "jit_compile: cannot write %s: %s", path, strerror(errno));
    }
    if (run_compiler(work, msg, sizeof msg)) {
        remove_work(work);
        FL_FAIL(FL_ERR_INTERNAL, "jit_compile: %s", msg);
    }
    snprintf(path, sizeof path, "%s/k.so", work);
    int so = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    int bad = so < 0 || sha256_fd(so, digest);
    if (so >= 0) close(so);
    digest[64] = '\n';
    char sum_path[PATH_CAP + 48], sum_name[160];
    snprintf(sum_path, sizeof sum_path, "%s/k.so.sha256", work);
    snprintf(sum_name, sizeof sum_name, "%s.sha256", so_name);
    bad = bad || write_new(sum_path, digest, 65) || renameat(AT_FDCWD, sum_path, dirfd, sum_name) ||
          renameat(AT_FDCWD, path, dirfd, so_name);
    int e = errno;
    remove_work(work);
    if (bad) FL_FAIL(FL_ERR_INTERNAL, "jit_compile: cannot store the kernel in %s: %s", dir, strerror(e));
    return FL_OK;
}

static void kernel_name(const char *source, char *out, size_t n) {
    const char *cc = getenv("CC");
    char hex[65];
    fl_sha256_t s;
    fl_sha256_init(&s);
    fl_sha256_update(&s, cc && *cc ? cc : "cc", strlen(cc && *cc ? cc : "cc"));
    fl_sha256_update(&s, "", 1);
    fl_sha256_update(&s, source, strlen(source));
    fl_sha256_hex(&s, hex);
    snprintf(out, n, "jit_%.32s.so", hex);
}

static int compile_locked(const char *source, char *so_path, size_t n) {
    char dir[PATH_CAP], so_name[64], why[160];
    if (cache_dir(dir, sizeof dir)) FL_FAIL(FL_ERR_INTERNAL, "jit_compile: the cache folder path is too long");
    int dirfd, st = open_private_dir(dir, &dirfd);
    if (st) return st;
    kernel_name(source, so_name, sizeof so_name);
    snprintf(so_path, n, "%s/%s", dir, so_name);
    int cached = verify_cached(dirfd, so_name, why, sizeof why);
    if (cached < 0) {
        fprintf(stderr, "torch_fl JIT: not loading the cached kernel %s: %s; rebuilding it\n", so_path, why);
        char sum_name[96];
        snprintf(sum_name, sizeof sum_name, "%s.sha256", so_name);
        unlinkat(dirfd, so_name, 0);
        unlinkat(dirfd, sum_name, 0);
    }
    if (cached <= 0) {
        st = build(dir, dirfd, so_name, source);
        if (!st && verify_cached(dirfd, so_name, why, sizeof why) != 1)
            st = (fl_host_set_error("jit_compile: the kernel just built in %s fails its own check: %s", dir, why),
                  FL_ERR_INTERNAL);
    }
    close(dirfd);
    return st;
}

int fl_host_jit_compile(const char *source, const char *symbol, fl_kernel_fn *fn) {
    if (!source || !symbol || !fn) FL_FAIL(FL_ERR_INVALID, "jit_compile: NULL source, symbol or output");
    char so[PATH_CAP + 64];
    pthread_mutex_lock(&jit_mu);
    int st = compile_locked(source, so, sizeof so);
    /* verified above, in a folder only this user can write: dlopen by path keeps each library's
     * own name (a /proc/self/fd name would be reused, and dlopen matches loaded libraries by name) */
    void *lib = st ? NULL : dlopen(so, RTLD_NOW | RTLD_LOCAL);
    pthread_mutex_unlock(&jit_mu);
    if (st) return st;
    if (!lib) FL_FAIL(FL_ERR_INTERNAL, "jit_compile: cannot load %s: %s", so, dlerror());
    void *sym = dlsym(lib, symbol);
    if (!sym) FL_FAIL(FL_ERR_INTERNAL, "jit_compile: %s defines no symbol %s", so, symbol);
    *fn = (fl_kernel_fn)sym;
    return FL_OK;
}
