/*
 * backends/cuda/cuda-profile.c — where a queue's GPU time goes, by backend entry.
 *
 * With the device option profile=on (KILN_CUDA_PROFILE=on) every entry that queues work on a
 * stream (cuda-serial.inc) is bracketed by two timing events on that stream. At the queue's
 * next wait (sync, a download) or when the pending pairs fill up, their elapsed times are
 * summed per entry; when the queue closes the sums go to stderr, largest first. These are
 * device times, the kernels' own, which a host-side profile (KILN_ONNX_PROFILE) cannot
 * separate from launch and wait costs. Nothing is timed while the queue records a graph
 * (events in a capture have no times); run the model op by op (KILN_ONNX_GRAPHS=0) to see
 * its kernels. Off by default: a pair of events costs about a microsecond a call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda-impl.h"

#define PROF_PENDING 512
#define PROF_ROWS 64

typedef struct prof_row {
    const char *name;
    int64_t calls;
    double ms;      /* GPU time between the entry's two events */
    double host_ms; /* time the host spent inside the entry */
} prof_row;

struct kiln__cuda_profile {
    cudaEvent_t ev[2 * PROF_PENDING];
    const char *pending[PROF_PENDING];
    int npending;
    int open; /* the pair of the entry running now (its start recorded), or -1 */
    struct timespec host_start;
    prof_row rows[PROF_ROWS];
    int nrows;
    int64_t dropped; /* calls whose entry did not fit the table */
};

bool kiln__cuda_prof_begin(kiln_cuda_queue *q)
{
    if (!q->dev->profile || q->recording || q->prof_failed)
        return false;
    kiln__cuda_profile *p = q->prof;
    if (!p) {
        p = calloc(1, sizeof *p);
        int made = 0;
        while (p && made < 2 * PROF_PENDING && cudaEventCreate(&p->ev[made]) == cudaSuccess)
            made++;
        if (!p || made < 2 * PROF_PENDING) {
            (void)cudaGetLastError();
            for (int i = 0; p && i < made; i++)
                cudaEventDestroy(p->ev[i]);
            free(p);
            fprintf(stderr,
                    "kiln: cuda profile on %s: cannot make its timing events; this queue is not profiled\n",
                    q->dev->name);
            q->prof_failed = true;
            return false;
        }
        p->open = -1;
        q->prof = p;
    }
    if (p->npending == PROF_PENDING)
        kiln__cuda_prof_resolve(q);
    if (cudaEventRecord(p->ev[2 * p->npending], q->stream) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    p->open = p->npending;
    clock_gettime(CLOCK_MONOTONIC, &p->host_start);
    return true;
}

static prof_row *row_of(kiln__cuda_profile *p, const char *name);

void kiln__cuda_prof_end(kiln_cuda_queue *q, const char *name)
{
    kiln__cuda_profile *p = q->prof;
    if (!p || p->open < 0)
        return;
    int i = p->open;
    p->open = -1;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    prof_row *r = row_of(p, name);
    if (r)
        r->host_ms += (double)(now.tv_sec - p->host_start.tv_sec) * 1e3 +
                      (double)(now.tv_nsec - p->host_start.tv_nsec) * 1e-6;
    /* an entry that began a recording (its events would belong to the capture) is not timed */
    if (q->recording)
        return;
    if (cudaEventRecord(p->ev[2 * i + 1], q->stream) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    p->pending[i] = name;
    p->npending = i + 1;
}

static prof_row *row_of(kiln__cuda_profile *p, const char *name)
{
    for (int i = 0; i < p->nrows; i++)
        if (p->rows[i].name == name || !strcmp(p->rows[i].name, name))
            return &p->rows[i];
    if (p->nrows == PROF_ROWS)
        return NULL;
    p->rows[p->nrows] = (prof_row){.name = name};
    return &p->rows[p->nrows++];
}

/* An entry that waits (a download) resolves while its own pair is open: that pair's start
 * moves to the first slot, which the entry's end then completes. */
static void keep_open_pair(kiln__cuda_profile *p)
{
    if (p->open > 0) {
        cudaEvent_t t = p->ev[0];
        p->ev[0] = p->ev[2 * p->open];
        p->ev[2 * p->open] = t;
        p->open = 0;
    }
}

void kiln__cuda_prof_resolve(kiln_cuda_queue *q)
{
    kiln__cuda_profile *p = q->prof;
    if (!p || p->npending == 0)
        return;
    /* the last end event completes after every earlier one on the stream */
    if (cudaEventSynchronize(p->ev[2 * p->npending - 1]) != cudaSuccess) {
        (void)cudaGetLastError(); /* a fault is the queue's to report, at its own wait */
        p->npending = 0;
        keep_open_pair(p);
        return;
    }
    for (int i = 0; i < p->npending; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, p->ev[2 * i], p->ev[2 * i + 1]) != cudaSuccess) {
            (void)cudaGetLastError();
            continue;
        }
        prof_row *r = row_of(p, p->pending[i]);
        if (!r) {
            p->dropped++;
            continue;
        }
        r->calls++;
        r->ms += ms;
    }
    p->npending = 0;
    keep_open_pair(p);
}

static int by_time(const void *a, const void *b)
{
    double x = ((const prof_row *)a)->ms, y = ((const prof_row *)b)->ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

void kiln__cuda_prof_report(kiln_cuda_queue *q)
{
    kiln__cuda_profile *p = q->prof;
    if (!p)
        return;
    kiln__cuda_prof_resolve(q);
    double total = 0;
    int64_t calls = 0;
    for (int i = 0; i < p->nrows; i++) {
        total += p->rows[i].ms;
        calls += p->rows[i].calls;
    }
    qsort(p->rows, (size_t)p->nrows, sizeof p->rows[0], by_time);
    fprintf(stderr,
            "cuda profile %s: GPU time by entry, %lld calls, %.3f ms in all (a GPU interval also holds any "
            "time the GPU waited for the host to queue the entry's work; host: time inside the entry)\n",
            q->dev->name, (long long)calls, total);
    for (int i = 0; i < p->nrows; i++) {
        const prof_row *r = &p->rows[i];
        double per = r->calls ? 1000.0 / (double)r->calls : 0.0;
        fprintf(stderr,
                "cuda profile %s: %-24s %8lld calls %10.3f ms %5.1f%% %9.2f us a call, host %9.2f us a call\n",
                q->dev->name, r->name, (long long)r->calls, r->ms, total > 0 ? 100.0 * r->ms / total : 0.0,
                r->ms * per, r->host_ms * per);
    }
    if (p->dropped)
        fprintf(stderr, "cuda profile %s: %lld calls of entries beyond the table's %d not counted\n", q->dev->name,
                (long long)p->dropped, PROF_ROWS);
    for (int i = 0; i < 2 * PROF_PENDING; i++)
        cudaEventDestroy(p->ev[i]);
    free(p);
    q->prof = NULL;
}
