/* Where torch_fl's compiled-code caches live, for the C side: the host JIT (jit.c) and the opencl
 * plugin's program binaries (plugins_cffi/opencl/bincache.c) resolve the same folder in the same order
 * as the Python side (torch_fl/runtime/private.py): $FL_JIT_CACHE, else $FL_CACHE_DIR/jit, else
 * $XDG_CACHE_HOME/torch_fl/jit, else ~/.cache/torch_fl/jit with the home folder from HOME or the
 * password database, and only when there is no home folder /tmp/torch_fl-<uid>/jit (docs/security.md).
 * The checks on the folder itself stay with each user: they report in their own words. */
#define _GNU_SOURCE
#include <errno.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fl_host.h"

static const char *home_dir(char *buf, size_t n) {
    const char *home = getenv("HOME");
    if (home && home[0] == '/') return home;
    struct passwd pw, *found = NULL;
    if (getpwuid_r(geteuid(), &pw, buf, n, &found) == 0 && found && found->pw_dir && found->pw_dir[0] == '/')
        return found->pw_dir;
    return NULL;
}

int fl_cache_dir(char *out, size_t n, const char *sub, size_t room) {
    const char *j = getenv("FL_JIT_CACHE"), *c = getenv("FL_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME");
    char pwbuf[2048];
    const char *home;
    int k;
    if (j && *j) k = snprintf(out, n, "%s%s", j, sub);
    else if (c && *c) k = snprintf(out, n, "%s/jit%s", c, sub);
    else if (x && x[0] == '/') k = snprintf(out, n, "%s/torch_fl/jit%s", x, sub);
    else if ((home = home_dir(pwbuf, sizeof pwbuf))) k = snprintf(out, n, "%s/.cache/torch_fl/jit%s", home, sub);
    else k = snprintf(out, n, "/tmp/torch_fl-%u/jit%s", (unsigned)geteuid(), sub);
    return k > 0 && (size_t)k + room < n ? 0 : -1;
}

int fl_make_dirs(const char *path) {
    char buf[1024];
    int k = snprintf(buf, sizeof buf, "%s", path);
    if (k <= 0 || (size_t)k >= sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0700) && errno != EEXIST) return -1;
        *p = '/';
    }
    return (mkdir(buf, 0700) && errno != EEXIST) ? -1 : 0;
}
