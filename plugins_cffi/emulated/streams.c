/* Asynchronous streams for the emulated devices: each stream is a worker
 * thread running its queue in order (copies, event markers, and in the
 * asynchronous mode of async.c kernels, fills and frees), so work enqueued on
 * a stream really proceeds while the caller goes on. Events complete when the
 * worker reaches them and are stamped with the time it did: event_elapsed is
 * the time between two stamps, device time rather than the caller's.
 *
 * The NULL stream: in the synchronous emulators it means "now" (a copy runs
 * before the call returns, an event completes when recorded). In the
 * asynchronous mode (FL_EMU_ASYNC=1) it is each device's default stream, a
 * worker like the others, and a NULL-stream copy waits for the work before it
 * (fl_plugin.h's copy contract).
 *
 * A task that fails on a worker (a kernel that found an index out of range)
 * leaves its status and message on the stream; the next call that waits for
 * that stream returns them, as CUDA reports device-side errors.
 *
 * Threading: any thread may enqueue or wait; one mutex per stream guards its
 * queue, one condition variable signals progress. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "emu.h"

typedef struct fl_emu_event fl_emu_event_t;
typedef struct task {
    int kind;
    void *dst;
    const void *src;
    size_t n;
    int value;
    fl_emu_event_t *event;
    fl_emu_job_fn job;  /* FL_EMU_TASK_JOB */
    void *job_arg;
    uint64_t seq;       /* TASK_EVENT: the marker's number; TASK_WAIT: the marker of event it waits for */
    int *done_status;   /* a task the caller waits for: its status lands here, then *done_flag = 1 */
    int *done_flag;
    char *done_msg;     /* 512 bytes */
    struct task *next;
} task_t;

enum { TASK_COPY = 0, TASK_EVENT = 1, TASK_FILL = 2, TASK_JOB = 3, TASK_WAIT = 4 };

typedef struct fl_emu_stream {
    int device;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    task_t *head, *tail;
    int busy, stop;
    int err_status;     /* the first failure since the last wait, FL_OK if none */
    char err_msg[512];
    struct fl_emu_stream *next_stream;
} stream_t;

struct fl_emu_event {
    int device;
    int recorded;       /* recorded at least once */
    uint64_t pending;   /* markers enqueued and not yet reached */
    double stamp_ms;    /* when the last marker was reached (CLOCK_MONOTONIC) */
    stream_t *stream;
    /* under waits_mu: markers are numbered as recorded; a stream waiting on the event (stream_wait_event)
     * waits for the number it was recorded with then, not for a later re-record */
    uint64_t recorded_seq, reached_seq;
    int waiters;        /* TASK_WAITs still queued on it: destroying the event waits for them */
};

/* One lock and condition for the waits between streams: a marker reached anywhere may release a wait
 * queued on any stream's worker. */
static pthread_mutex_t waits_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t waits_cv = PTHREAD_COND_INITIALIZER;

static pthread_mutex_t streams_mu = PTHREAD_MUTEX_INITIALIZER;
static stream_t *streams;
static stream_t *default_streams[FL_EMU_MAX_DEVICES]; /* asynchronous mode only */

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void *worker(void *arg) {
    stream_t *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head && s->stop) break;
        task_t *t = s->head;
        s->head = t->next;
        if (!s->head) s->tail = NULL;
        s->busy = 1;
        pthread_mutex_unlock(&s->mu);
        int st = FL_OK;
        char msg[512] = "";
        double stamp = 0;
        switch (t->kind) {
        case TASK_COPY: if (t->n) memmove(t->dst, t->src, t->n); break;
        case TASK_FILL: if (t->n) memset(t->dst, t->value, t->n); break;
        case TASK_EVENT:
            stamp = now_ms();
            pthread_mutex_lock(&waits_mu);
            if (t->seq > t->event->reached_seq) t->event->reached_seq = t->seq;
            pthread_cond_broadcast(&waits_cv);
            pthread_mutex_unlock(&waits_mu);
            break;
        case TASK_WAIT: /* this stream's later work waits for another stream's marker */
            pthread_mutex_lock(&waits_mu);
            while (t->event->reached_seq < t->seq) pthread_cond_wait(&waits_cv, &waits_mu);
            t->event->waiters--;
            pthread_cond_broadcast(&waits_cv);
            pthread_mutex_unlock(&waits_mu);
            break;
        case TASK_JOB:
            st = t->job(t->job_arg);
            if (st != FL_OK) snprintf(msg, sizeof msg, "%s", fl_host_last_error());
            break;
        }
        pthread_mutex_lock(&s->mu);
        if (t->kind == TASK_EVENT) {
            t->event->stamp_ms = stamp;
            t->event->pending--;
        }
        if (t->done_flag) { /* the caller waits for this one task and takes its status itself */
            *t->done_status = st;
            if (t->done_msg) memcpy(t->done_msg, msg, sizeof msg);
            *t->done_flag = 1;
        } else if (st != FL_OK && s->err_status == FL_OK) {
            s->err_status = st;
            memcpy(s->err_msg, msg, sizeof msg);
        }
        s->busy = 0;
        free(t);
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static int enqueue(stream_t *s, task_t *t) {
    t->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = t;
    else s->head = t;
    s->tail = t;
    if (t->kind == TASK_EVENT) t->event->pending++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return FL_OK;
}

/* The status a waiting call returns: the stream's first failure since the last wait (then cleared). */
static int take_error_locked(stream_t *s) {
    int st = s->err_status;
    if (st == FL_OK) return FL_OK;
    s->err_status = FL_OK;
    fl_host_set_error("%s: an earlier asynchronous kernel failed: %s", fl_emu_profile.name, s->err_msg);
    return st;
}

static int new_stream(int device, stream_t **out) {
    stream_t *s = calloc(1, sizeof *s);
    if (!s) FL_FAIL(FL_ERR_OOM, "%s: cannot allocate a stream", fl_emu_profile.name);
    s->device = device;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->thread, NULL, worker, s) != 0) {
        free(s);
        FL_FAIL(FL_ERR_INTERNAL, "%s: cannot start a stream thread", fl_emu_profile.name);
    }
    pthread_mutex_lock(&streams_mu);
    s->next_stream = streams;
    streams = s;
    pthread_mutex_unlock(&streams_mu);
    *out = s;
    return FL_OK;
}

int fl_emu_stream_create(int device, fl_stream_t *out) {
    stream_t *s = NULL;
    int st = new_stream(device, &s);
    if (st) return st;
    *out = (fl_stream_t)s;
    return FL_OK;
}

int fl_emu_default_streams_start(int n_devices) {
    for (int d = 0; d < n_devices && d < FL_EMU_MAX_DEVICES; d++) {
        if (default_streams[d]) continue;
        int st = new_stream(d, &default_streams[d]);
        if (st) return st;
    }
    return FL_OK;
}

/* The queue a call on `stream` goes to: the stream itself, the device's default stream for NULL in the
 * asynchronous mode, or NULL ("now") for NULL otherwise. */
static stream_t *resolve(int device, fl_stream_t stream) {
    if (stream) return (stream_t *)stream;
    return device >= 0 && device < FL_EMU_MAX_DEVICES ? default_streams[device] : NULL;
}

static int wait_idle(stream_t *s) {
    pthread_mutex_lock(&s->mu);
    while (s->head || s->busy) pthread_cond_wait(&s->cv, &s->mu);
    int st = take_error_locked(s);
    pthread_mutex_unlock(&s->mu);
    return st;
}

int fl_emu_stream_synchronize(int device, fl_stream_t stream) {
    stream_t *s = resolve(device, stream);
    return s ? wait_idle(s) : FL_OK;
}

int fl_emu_stream_destroy(int device, fl_stream_t stream) {
    stream_t *s = (stream_t *)stream;
    if (!s) return FL_OK;
    fl_emu_stream_synchronize(device, stream);
    pthread_mutex_lock(&streams_mu);
    for (stream_t **pp = &streams; *pp; pp = &(*pp)->next_stream)
        if (*pp == s) { *pp = s->next_stream; break; }
    pthread_mutex_unlock(&streams_mu);
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    return FL_OK;
}

/* Runs t on s and waits for that task alone; its status (and message) is the call's. */
static int run_and_wait(stream_t *s, task_t *t) {
    int status = FL_OK, done = 0;
    char msg[512] = "";
    t->done_status = &status;
    t->done_flag = &done;
    t->done_msg = msg;
    enqueue(s, t);
    pthread_mutex_lock(&s->mu);
    while (!done) pthread_cond_wait(&s->cv, &s->mu);
    int earlier = take_error_locked(s);
    pthread_mutex_unlock(&s->mu);
    if (earlier) return earlier;
    if (status != FL_OK) fl_host_set_error("%s", msg);
    return status;
}

int fl_emu_submit(int device, fl_stream_t stream, fl_emu_job_fn job, void *arg, int wait) {
    stream_t *s = resolve(device, stream);
    if (!s) {
        int st = job(arg);
        return st;
    }
    task_t *t = calloc(1, sizeof *t);
    if (!t) FL_FAIL(FL_ERR_OOM, "%s: cannot queue a kernel", fl_emu_profile.name);
    t->kind = TASK_JOB;
    t->job = job;
    t->job_arg = arg;
    return wait ? run_and_wait(s, t) : enqueue(s, t);
}

/* A copy on stream s: now (s NULL: a synchronous emulator's NULL stream), or queued, and waited for when wait. */
static int copy_on(stream_t *s, void *dst, const void *src, size_t n, int wait) {
    if (n && (!dst || !src)) FL_FAIL(FL_ERR_INVALID, "%s: copy of %zu bytes with a NULL pointer", fl_emu_profile.name, n);
    if (!s) {
        memmove(dst, src, n);
        return FL_OK;
    }
    task_t *t = calloc(1, sizeof *t);
    if (!t) FL_FAIL(FL_ERR_OOM, "%s: cannot queue a copy", fl_emu_profile.name);
    t->kind = TASK_COPY;
    t->dst = dst;
    t->src = src;
    t->n = n;
    return wait ? run_and_wait(s, t) : enqueue(s, t);
}

int fl_emu_copy_async(int device, void *dst, const void *src, size_t n, fl_stream_t stream) {
    /* the NULL stream: ordered after the work before it, and done on return (the copy contract) */
    return copy_on(resolve(device, stream), dst, src, n, stream == NULL);
}

/* Queued on the stream (NULL: the device's default stream) without waiting, whatever the stream. */
int fl_emu_copy_async_on(int device, void *dst, const void *src, size_t n, fl_stream_t stream) {
    return copy_on(resolve(device, stream), dst, src, n, 0);
}

int fl_emu_fill(int device, void *dst, int value, size_t n, fl_stream_t stream) {
    if (n && !dst) FL_FAIL(FL_ERR_INVALID, "%s: mem_set of %zu bytes at NULL", fl_emu_profile.name, n);
    stream_t *s = resolve(device, stream);
    if (!s) {
        memset(dst, value, n);
        return FL_OK;
    }
    task_t *t = calloc(1, sizeof *t);
    if (!t) FL_FAIL(FL_ERR_OOM, "%s: cannot queue a fill", fl_emu_profile.name);
    t->kind = TASK_FILL;
    t->dst = dst;
    t->value = value;
    t->n = n;
    return enqueue(s, t);
}

int fl_emu_event_create(int device, fl_event_t *out) {
    fl_emu_event_t *e = calloc(1, sizeof *e);
    if (!e) FL_FAIL(FL_ERR_OOM, "%s: cannot allocate an event", fl_emu_profile.name);
    e->device = device;
    *out = (fl_event_t)e;
    return FL_OK;
}

int fl_emu_event_record(int device, fl_event_t event, fl_stream_t stream) {
    fl_emu_event_t *e = (fl_emu_event_t *)event;
    if (!e) FL_FAIL(FL_ERR_INVALID, "%s: event_record of a NULL event", fl_emu_profile.name);
    fl_emu_event_synchronize(device, event); /* one marker in flight per event: re-recording waits */
    e->recorded = 1;
    e->stream = resolve(device, stream);
    task_t *t = e->stream ? calloc(1, sizeof *t) : NULL;
    if (e->stream && !t) FL_FAIL(FL_ERR_OOM, "%s: cannot queue an event", fl_emu_profile.name);
    pthread_mutex_lock(&waits_mu);
    uint64_t seq = ++e->recorded_seq;
    if (!e->stream) e->reached_seq = seq; /* "now": nothing in flight */
    pthread_mutex_unlock(&waits_mu);
    if (!e->stream) {
        e->stamp_ms = now_ms();
        return FL_OK;
    }
    t->kind = TASK_EVENT;
    t->event = e;
    t->seq = seq;
    return enqueue(e->stream, t);
}

int fl_emu_stream_wait_event(int device, fl_stream_t stream, fl_event_t event) {
    fl_emu_event_t *e = (fl_emu_event_t *)event;
    if (!e) FL_FAIL(FL_ERR_INVALID, "%s: stream_wait_event on a NULL event", fl_emu_profile.name);
    stream_t *s = resolve(device, stream);
    if (!s) return fl_emu_event_synchronize(device, event); /* the NULL stream is "now": wait here */
    task_t *t = calloc(1, sizeof *t);
    if (!t) FL_FAIL(FL_ERR_OOM, "%s: cannot queue a wait", fl_emu_profile.name);
    t->kind = TASK_WAIT;
    t->event = e;
    pthread_mutex_lock(&waits_mu);
    t->seq = e->recorded_seq; /* an event never recorded is complete: seq 0 is reached */
    e->waiters++;
    pthread_mutex_unlock(&waits_mu);
    return enqueue(s, t);
}

int fl_emu_event_query(int device, fl_event_t event, int *done) {
    (void)device;
    fl_emu_event_t *e = (fl_emu_event_t *)event;
    if (!e || !e->stream) { *done = 1; return FL_OK; }
    pthread_mutex_lock(&e->stream->mu);
    *done = e->pending == 0;
    pthread_mutex_unlock(&e->stream->mu);
    return FL_OK;
}

int fl_emu_event_synchronize(int device, fl_event_t event) {
    (void)device;
    fl_emu_event_t *e = (fl_emu_event_t *)event;
    if (!e || !e->stream) return FL_OK;
    stream_t *s = e->stream;
    pthread_mutex_lock(&s->mu);
    while (e->pending) pthread_cond_wait(&s->cv, &s->mu);
    int st = take_error_locked(s);
    pthread_mutex_unlock(&s->mu);
    return st;
}

int fl_emu_event_elapsed(int device, fl_event_t start, fl_event_t end, double *ms) {
    fl_emu_event_t *a = (fl_emu_event_t *)start, *b = (fl_emu_event_t *)end;
    if (!a || !b || !a->recorded || !b->recorded)
        FL_FAIL(FL_ERR_INVALID, "%s: event_elapsed of an event that was never recorded", fl_emu_profile.name);
    int st = fl_emu_event_synchronize(device, start);
    if (!st) st = fl_emu_event_synchronize(device, end);
    if (st) return st;
    *ms = b->stamp_ms - a->stamp_ms;
    return FL_OK;
}

int fl_emu_event_destroy(int device, fl_event_t event) {
    fl_emu_event_t *e = (fl_emu_event_t *)event;
    if (!e) return FL_OK;
    fl_emu_event_synchronize(device, event); /* a queued marker still points at it */
    pthread_mutex_lock(&waits_mu);
    while (e->waiters) pthread_cond_wait(&waits_cv, &waits_mu); /* and so may queued waits */
    pthread_mutex_unlock(&waits_mu);
    free(e);
    return FL_OK;
}

int fl_emu_synchronize_all(int device) {
    int first = FL_OK;
    char msg[512] = "";
    pthread_mutex_lock(&streams_mu);
    for (stream_t *s = streams; s; s = s->next_stream)
        if (s->device == device) {
            int st = wait_idle(s);
            if (st && !first) {
                first = st;
                snprintf(msg, sizeof msg, "%s", fl_host_last_error());
            }
        }
    pthread_mutex_unlock(&streams_mu);
    if (first) fl_host_set_error("%s", msg);
    return first;
}
