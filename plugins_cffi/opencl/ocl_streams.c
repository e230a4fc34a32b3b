/* The OpenCL plugin: streams (in-order profiling queues) and events (markers).
 * Shared declarations: ocl.h. */
#include "ocl.h"

/* ------------------------------------------------------------------ streams and events */

int stream_create(int device, fl_stream_t *s) {
    DEV(device);
    if (!s) return fail(FL_ERR_INVALID, NAME ": stream_create(NULL)");
    cl_int e = 0;
    cl_command_queue q = cl.clCreateCommandQueue(D->ctx, D->id, CL_QUEUE_PROFILING_ENABLE, &e);
    if (!q || e) return fail(FL_ERR_INTERNAL, NAME ": clCreateCommandQueue failed with OpenCL error %d", e);
    pthread_mutex_lock(&D->klock);
    if (D->nstreams == D->capstreams) {
        int nc = D->capstreams ? 2 * D->capstreams : 16;
        cl_command_queue *ns = realloc(D->streams, (size_t)nc * sizeof *ns);
        if (!ns) { pthread_mutex_unlock(&D->klock); cl.clReleaseCommandQueue(q); return fail(FL_ERR_OOM, NAME ": host out of memory"); }
        D->streams = ns; D->capstreams = nc;
    }
    D->streams[D->nstreams++] = q;
    pthread_mutex_unlock(&D->klock);
    *s = (fl_stream_t)q;
    return FL_OK;
}
int stream_destroy(int device, fl_stream_t s) {
    DEV(device);
    if (!s) return FL_OK;
    pthread_mutex_lock(&D->klock);
    int found = 0;
    for (int i = 0; i < D->nstreams; i++)
        if (D->streams[i] == (cl_command_queue)s) { D->streams[i] = D->streams[--D->nstreams]; found = 1; break; }
    pthread_mutex_unlock(&D->klock);
    if (!found) return fail(FL_ERR_INVALID, NAME ": stream_destroy: unknown stream %p", s);
    cl.clFinish((cl_command_queue)s);
    cl.clReleaseCommandQueue((cl_command_queue)s);
    return FL_OK;
}
int stream_sync(int device, fl_stream_t s) {
    DEV(device);
    cl_int e = cl.clFinish(qof(D, s));
    if (e) return fail(FL_ERR_INTERNAL, NAME ": clFinish failed with OpenCL error %d", e);
    return FL_OK;
}
typedef struct { cl_event e; } ev_t;
int event_create(int device, fl_event_t *ev) {
    DEV(device); (void)D;
    if (!ev) return fail(FL_ERR_INVALID, NAME ": event_create(NULL)");
    ev_t *x = calloc(1, sizeof *x);
    if (!x) return fail(FL_ERR_OOM, NAME ": host out of memory");
    *ev = x;
    return FL_OK;
}
int event_destroy(int device, fl_event_t ev) {
    DEV(device); (void)D;
    ev_t *x = ev;
    if (!x) return FL_OK;
    if (x->e) cl.clReleaseEvent(x->e);
    free(x);
    return FL_OK;
}
int event_record(int device, fl_event_t ev, fl_stream_t s) {
    DEV(device);
    ev_t *x = ev;
    if (!x) return fail(FL_ERR_INVALID, NAME ": event_record(NULL)");
    cl_event ne = NULL;
    cl_int e = cl.clEnqueueMarkerWithWaitList(qof(D, s), 0, NULL, &ne);
    if (e) return fail(FL_ERR_INTERNAL, NAME ": clEnqueueMarkerWithWaitList failed with OpenCL error %d", e);
    if (x->e) cl.clReleaseEvent(x->e);
    x->e = ne;
    cl.clFlush(qof(D, s));
    return FL_OK;
}
/* Later commands on the stream's queue wait for the event: a marker with a wait list, which on an in-order
 * queue (torch_fl creates only those) holds back everything enqueued after it. */
int stream_wait_event(int device, fl_stream_t s, fl_event_t ev) {
    DEV(device);
    ev_t *x = ev;
    if (!x) return fail(FL_ERR_INVALID, NAME ": stream_wait_event(NULL event)");
    if (!x->e) return FL_OK; /* never recorded: complete */
    cl_int e = cl.clEnqueueMarkerWithWaitList(qof(D, s), 1, &x->e, NULL);
    if (e) return fail(FL_ERR_INTERNAL, NAME ": clEnqueueMarkerWithWaitList (a wait on an event) failed with OpenCL error %d", e);
    return FL_OK;
}
int event_sync(int device, fl_event_t ev) {
    DEV(device); (void)D;
    ev_t *x = ev;
    if (!x || !x->e) return FL_OK;
    cl_int e = cl.clWaitForEvents(1, &x->e);
    if (e) return fail(FL_ERR_INTERNAL, NAME ": clWaitForEvents failed with OpenCL error %d (a kernel before this event failed)", e);
    return FL_OK;
}
int event_query(int device, fl_event_t ev, int *done) {
    DEV(device); (void)D;
    ev_t *x = ev;
    if (!done) return fail(FL_ERR_INVALID, NAME ": event_query(NULL)");
    *done = 1;
    if (!x || !x->e) return FL_OK;
    cl_int st = 0;
    cl_int e = cl.clGetEventInfo(x->e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL);
    if (e) return fail(FL_ERR_INTERNAL, NAME ": clGetEventInfo failed with OpenCL error %d", e);
    if (st < 0) return fail(FL_ERR_INTERNAL, NAME ": work before this event failed (OpenCL status %d)", st);
    *done = st == CL_COMPLETE;
    return FL_OK;
}
int event_elapsed(int device, fl_event_t a, fl_event_t b, double *ms) {
    DEV(device); (void)D;
    ev_t *x = a, *y = b;
    if (!ms) return fail(FL_ERR_INVALID, NAME ": event_elapsed(NULL)");
    if (!x || !y || !x->e || !y->e) return fail(FL_ERR_INVALID, NAME ": event_elapsed on an event never recorded");
    cl.clWaitForEvents(1, &x->e);
    cl.clWaitForEvents(1, &y->e);
    cl_ulong t0 = 0, t1 = 0;
    cl_int e1 = cl.clGetEventProfilingInfo(x->e, CL_PROFILING_COMMAND_END, sizeof t0, &t0, NULL);
    cl_int e2 = cl.clGetEventProfilingInfo(y->e, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
    if (e1 || e2) return fail(FL_ERR_INTERNAL, NAME ": clGetEventProfilingInfo failed with OpenCL error %d", e1 ? e1 : e2);
    *ms = ((double)t1 - (double)t0) / 1e6;
    return FL_OK;
}
int synchronize(int device) {
    DEV(device);
    cl_int e = cl.clFinish(D->q);
    pthread_mutex_lock(&D->klock);
    int n = D->nstreams;
    cl_command_queue qs[64];
    if (n > 64) n = 64;
    memcpy(qs, D->streams, (size_t)n * sizeof *qs);
    pthread_mutex_unlock(&D->klock);
    for (int i = 0; i < n && !e; i++) e = cl.clFinish(qs[i]);
    if (e) return fail(FL_ERR_INTERNAL, NAME ": clFinish failed with OpenCL error %d (a queued kernel failed)", e);
    return FL_OK;
}
