/* Asynchronous streams for the emulated devices that declare
 * FL_FEATURE_ASYNC_COPY: each stream is a worker thread running its queue of
 * copies and event markers in order, so a copy enqueued on a stream really
 * proceeds while the caller computes (the emulator's kernels run on the
 * calling thread). Events complete when the worker reaches them. A NULL
 * stream means "now": the copy runs before the call returns.
 *
 * Threading: any thread may enqueue or wait; one mutex per stream guards its
 * queue, one condition variable signals progress. */
#include <pthread.h>
#include <stdlib.h>

#include "emu.h"

typedef struct fl_emu_event fl_emu_event_t;
typedef struct task {
    int kind; /* 0 copy, 1 event marker */
    void *dst;
    const void *src;
    size_t n;
    fl_emu_event_t *event;
    struct task *next;
} task_t;

typedef struct fl_emu_stream {
    int device;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    task_t *head, *tail;
    int busy, stop;
    struct fl_emu_stream *next_stream;
} stream_t;

struct fl_emu_event {
    int device;
    int recorded; /* recorded at least once */
    uint64_t pending; /* markers enqueued and not yet reached */
    stream_t *stream;
};

static pthread_mutex_t streams_mu = PTHREAD_MUTEX_INITIALIZER;
static stream_t *streams;

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
        if (t->kind == 0 && t->n) memmove(t->dst, t->src, t->n);
        pthread_mutex_lock(&s->mu);
        if (t->kind == 1) t->event->pending--;
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
    if (t->kind == 1) t->event->pending++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return FL_OK;
}

int fl_emu_stream_create(int device, fl_stream_t *out) {
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
    *out = (fl_stream_t)s;
    return FL_OK;
}

int fl_emu_stream_synchronize(int device, fl_stream_t stream) {
    (void)device;
    stream_t *s = (stream_t *)stream;
    if (!s) return FL_OK;
    pthread_mutex_lock(&s->mu);
    while (s->head || s->busy) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return FL_OK;
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

int fl_emu_copy_async(int device, void *dst, const void *src, size_t n, fl_stream_t stream) {
    (void)device;
    if (n && (!dst || !src)) FL_FAIL(FL_ERR_INVALID, "%s: copy of %zu bytes with a NULL pointer", fl_emu_profile.name, n);
    if (!stream) {
        memmove(dst, src, n);
        return FL_OK;
    }
    task_t *t = calloc(1, sizeof *t);
    if (!t) FL_FAIL(FL_ERR_OOM, "%s: cannot queue a copy", fl_emu_profile.name);
    t->kind = 0;
    t->dst = dst;
    t->src = src;
    t->n = n;
    return enqueue((stream_t *)stream, t);
}

int fl_emu_event_create(int device, fl_event_t *out) {
    fl_emu_event_t *e = calloc(1, sizeof *e);
    if (!e) FL_FAIL(FL_ERR_OOM, "%s: cannot allocate an event", fl_emu_profile.name);
    e->device = device;
    *out = (fl_event_t)e;
    return FL_OK;
}

int fl_emu_event_record(int device, fl_event_t event, fl_stream_t stream) {
    (void)device;
    fl_emu_event_t *e = (fl_emu_event_t *)event;
    if (!e) FL_FAIL(FL_ERR_INVALID, "%s: event_record of a NULL event", fl_emu_profile.name);
    e->recorded = 1;
    e->stream = (stream_t *)stream;
    if (!stream) return FL_OK; /* the NULL stream has nothing in flight */
    task_t *t = calloc(1, sizeof *t);
    if (!t) FL_FAIL(FL_ERR_OOM, "%s: cannot queue an event", fl_emu_profile.name);
    t->kind = 1;
    t->event = e;
    return enqueue(e->stream, t);
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
    pthread_mutex_unlock(&s->mu);
    return FL_OK;
}

int fl_emu_event_destroy(int device, fl_event_t event) {
    fl_emu_event_t *e = (fl_emu_event_t *)event;
    if (!e) return FL_OK;
    fl_emu_event_synchronize(device, event); /* a queued marker still points at it */
    free(e);
    return FL_OK;
}

int fl_emu_synchronize_all(int device) {
    pthread_mutex_lock(&streams_mu);
    for (stream_t *s = streams; s; s = s->next_stream)
        if (s->device == device) fl_emu_stream_synchronize(device, (fl_stream_t)s);
    pthread_mutex_unlock(&streams_mu);
    return FL_OK;
}
