/* bincache.h — the OpenCL plugin's on-disk cache of program binaries (bincache.c). It knows files and
 * digests only; ocl_launch.c (build_program) asks the driver for the binaries and hands them back to it. */
#ifndef FL_OPENCL_BINCACHE_H
#define FL_OPENCL_BINCACHE_H
#include <stddef.h>

#define OCL_CACHE_NAME 64 /* room for an entry's file name */

/* the entry's file name ("ocl_<digest>.bin") for a build: the SHA-256 of the n strings, each ended by its NUL */
void ocl_cache_name(const char *const *parts, int n, char name[OCL_CACHE_NAME]);
/* 1 with a malloc'ed copy of the cached binary, its bytes checked against the recorded digest; 0 when there is
 * none to use (no entry, the cache off or unusable, or an entry that failed its check: then it is removed,
 * with a note on stderr) */
int ocl_cache_load(const char *name, unsigned char **bin, size_t *n);
/* records a binary the driver produced (best effort: a cache that cannot be written is noted once on stderr) */
void ocl_cache_store(const char *name, const void *bin, size_t n);
/* removes an entry the driver refused to load, saying why on stderr */
void ocl_cache_drop(const char *name, const char *why);

#endif
