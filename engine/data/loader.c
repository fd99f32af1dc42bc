/*
 * engine/data/loader.c — batches of items into device tensors, produced by worker
 * threads ahead of the consumer through a bounded ring.
 *
 * Determinism: batch b of epoch e always holds the items order[b*B .. b*B+B-1] of the
 * permutation kiln_data_permutation(seed, e), and item position p draws its random
 * transforms from key mix(mix(seed, e), p). Workers only decide *when* a batch is
 * produced, never *what* it holds, and the consumer takes batches strictly in order, so
 * the sequence is the same for 0, 1 or N workers.
 *
 * Memory: the ring holds `prefetch` host batches; a worker waits before claiming a batch
 * more than prefetch ahead of the consumer, so memory is bounded whatever the speeds.
 * Workers run for one epoch: kiln_loader_start joins the previous epoch's workers and
 * launches new ones, which keeps the state machine small (thread start-up is a few
 * microseconds per epoch).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data-impl.h"
#include "error-impl.h"
#include "kiln/autodiff.h"

enum { SLOT_EMPTY = 0, SLOT_FILLING, SLOT_READY, SLOT_FAILED };

typedef struct slot {
    int state;
    int64_t batch;
    int64_t n;
    float *x;
    double *t;
    char err[KILN_ERROR_MAX];
} slot;

struct kiln_loader {
    kiln_dataset *ds;
    kiln_loader_config cfg;
    kiln_device *dev;
    kiln_dataset_info info;
    int64_t tslots;
    int64_t nbatches;
    int64_t *order;
    uint64_t epoch_key;
    int nslots;
    slot *slots;
    /* epoch state, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t next_claim, next_take;
    bool stop, running;
    pthread_t *threads;
    int nthreads;
};

kiln_loader_config kiln_loader_config_default(void)
{
    return (kiln_loader_config){.batch_size = 32, .shuffle = true};
}

/* Produce batch b into s (no lock held). */
static int fill(kiln_loader *ld, int64_t b, slot *s)
{
    int64_t B = ld->cfg.batch_size, n0 = b * B;
    int64_t n = ld->info.length - n0 < B ? ld->info.length - n0 : B;
    int64_t fnum = ld->info.feature_numel;
    s->n = n;
    for (int64_t k = 0; k < n; k++) {
        int64_t pos = n0 + k;
        uint64_t key = kiln__data_mix(ld->epoch_key, (uint64_t)pos);
        if (kiln_dataset_get(ld->ds, ld->order[pos], s->x + k * fnum, s->t + k * ld->tslots, key) < 0) {
            snprintf(s->err, sizeof s->err, "loader: batch %lld, item %lld: %s", (long long)b,
                     (long long)ld->order[pos], kiln_error());
            return -1;
        }
    }
    return 0;
}

static void *worker(void *arg)
{
    kiln_loader *ld = arg;
    pthread_mutex_lock(&ld->mu);
    for (;;) {
        while (!ld->stop && ld->next_claim < ld->nbatches && ld->next_claim >= ld->next_take + ld->nslots)
            pthread_cond_wait(&ld->cv, &ld->mu);
        if (ld->stop || ld->next_claim >= ld->nbatches)
            break;
        int64_t b = ld->next_claim++;
        slot *s = &ld->slots[b % ld->nslots];
        s->state = SLOT_FILLING;
        s->batch = b;
        pthread_mutex_unlock(&ld->mu);
        int rc = fill(ld, b, s);
        pthread_mutex_lock(&ld->mu);
        s->state = rc == 0 ? SLOT_READY : SLOT_FAILED;
        pthread_cond_broadcast(&ld->cv);
    }
    pthread_mutex_unlock(&ld->mu);
    return NULL;
}

static void stop_workers(kiln_loader *ld)
{
    if (!ld->running)
        return;
    pthread_mutex_lock(&ld->mu);
    ld->stop = true;
    pthread_cond_broadcast(&ld->cv);
    pthread_mutex_unlock(&ld->mu);
    for (int i = 0; i < ld->nthreads; i++)
        pthread_join(ld->threads[i], NULL);
    ld->nthreads = 0;
    ld->running = false;
}

kiln_loader *kiln_loader_create(kiln_dataset *ds, const kiln_loader_config *cfg, kiln_device *dev)
{
    if (!ds || !cfg || !dev)
        return kiln__error_set("loader_create: NULL argument"), NULL;
    if (cfg->batch_size < 1 || cfg->workers < 0 || cfg->workers > 64 || cfg->prefetch < 0)
        return kiln__error_set("loader_create: batch_size %lld, workers %d, prefetch %d out of range",
                               (long long)cfg->batch_size, cfg->workers, cfg->prefetch),
               NULL;
    /* A slot holds one batch, never more items than the data set has; its byte count is
     * checked, as a wrapped one would size the ring too small for what workers write. */
    int64_t per_slot = cfg->batch_size < ds->info.length ? cfg->batch_size : ds->info.length, xn, tn;
    if (per_slot < 1)
        per_slot = 1;
    if (!kiln__data_count(per_slot, ds->info.feature_numel, sizeof(float), &xn) ||
        !kiln__data_count(per_slot, kiln__target_slots(&ds->info), sizeof(double), &tn))
        return kiln__error_set("loader_create: batches of %lld items of %s (%lld features each) are too large "
                               "to address",
                               (long long)per_slot, ds->name, (long long)ds->info.feature_numel),
               NULL;
    kiln_loader *ld = calloc(1, sizeof *ld);
    if (!ld)
        return kiln__error_set("loader_create: out of memory"), NULL;
    ld->ds = kiln_dataset_retain(ds);
    ld->cfg = *cfg;
    ld->dev = dev;
    ld->info = ds->info;
    ld->tslots = kiln__target_slots(&ld->info);
    int64_t n = ld->info.length;
    /* not (n + batch_size - 1) / batch_size: that sum overflows for a large batch_size */
    ld->nbatches = n / cfg->batch_size + (!cfg->drop_last && n % cfg->batch_size != 0);
    ld->nslots = cfg->workers == 0 ? 1 : (cfg->prefetch > 0 ? cfg->prefetch : 2 * cfg->workers);
    if (ld->nslots < cfg->workers)
        ld->nslots = cfg->workers; /* fewer slots than workers would idle the extra ones */
    ld->order = malloc((size_t)(n + 1) * sizeof *ld->order);
    ld->slots = calloc((size_t)ld->nslots, sizeof *ld->slots);
    ld->threads = calloc((size_t)(cfg->workers + 1), sizeof *ld->threads);
    bool ok = ld->order && ld->slots && ld->threads;
    for (int i = 0; ok && i < ld->nslots; i++) {
        ld->slots[i].x = malloc((size_t)xn * sizeof(float) + 1);
        ld->slots[i].t = malloc((size_t)tn * sizeof(double) + 1);
        ok = ld->slots[i].x && ld->slots[i].t;
    }
    pthread_mutex_init(&ld->mu, NULL);
    pthread_cond_init(&ld->cv, NULL);
    if (!ok) {
        kiln_loader_free(ld);
        return kiln__error_set("loader_create: out of memory for %d batches of %lld items", cfg->workers,
                               (long long)cfg->batch_size),
               NULL;
    }
    ld->next_claim = ld->next_take = ld->nbatches; /* no epoch started */
    return ld;
}

int64_t kiln_loader_batches(const kiln_loader *ld)
{
    return ld ? ld->nbatches : 0;
}

int kiln_loader_start(kiln_loader *ld, int64_t epoch, int64_t first_batch)
{
    if (!ld)
        return kiln__error_set("loader_start: NULL loader");
    if (first_batch < 0 || first_batch > ld->nbatches)
        return kiln__error_set("loader_start: first batch %lld outside [0, %lld]", (long long)first_batch,
                               (long long)ld->nbatches);
    stop_workers(ld);
    int64_t n = ld->info.length;
    if (ld->cfg.shuffle) {
        kiln_data_permutation(ld->cfg.seed, epoch, n, ld->order);
    } else {
        for (int64_t i = 0; i < n; i++)
            ld->order[i] = i;
    }
    ld->epoch_key = kiln__data_mix(ld->cfg.seed, 0xe90c0000ull ^ (uint64_t)epoch);
    for (int i = 0; i < ld->nslots; i++)
        ld->slots[i].state = SLOT_EMPTY;
    ld->next_claim = ld->next_take = first_batch;
    ld->stop = false;
    for (int i = 0; i < ld->cfg.workers; i++) {
        if (pthread_create(&ld->threads[i], NULL, worker, ld) != 0) {
            ld->running = true;
            stop_workers(ld);
            return kiln__error_set("loader_start: cannot start worker thread %d", i);
        }
        ld->nthreads = i + 1;
        ld->running = true;
    }
    return 0;
}

static int make_batch(kiln_loader *ld, slot *s, kiln_batch *out)
{
    const kiln_dataset_info *in = &ld->info;
    int64_t shape[KILN_MAX_DIMS + 1];
    shape[0] = s->n;
    for (int d = 0; d < in->ndim; d++)
        shape[d + 1] = in->shape[d];
    out->n = s->n;
    out->index = s->batch;
    out->y = NULL;
    out->x = kiln_from_data(ld->dev, KILN_F32, in->ndim + 1, shape, s->x,
                            (size_t)(s->n * in->feature_numel) * sizeof(float));
    if (!out->x)
        return -1;
    if (in->num_classes > 0) {
        int64_t *lab = malloc((size_t)s->n * sizeof *lab + 1);
        if (!lab)
            return kiln__error_set("loader: out of memory");
        for (int64_t k = 0; k < s->n; k++)
            lab[k] = (int64_t)s->t[k];
        out->y = kiln_from_data(ld->dev, KILN_I64, 1, (int64_t[]){s->n}, lab, (size_t)s->n * sizeof *lab);
        free(lab);
    } else if (in->target_numel > 0) {
        int64_t tn = in->target_numel;
        float *v = malloc((size_t)(s->n * tn) * sizeof *v + 1);
        if (!v)
            return kiln__error_set("loader: out of memory");
        for (int64_t k = 0; k < s->n * tn; k++)
            v[k] = (float)s->t[k];
        out->y = kiln_from_data(ld->dev, KILN_F32, 2, (int64_t[]){s->n, tn}, v, (size_t)(s->n * tn) * sizeof *v);
        free(v);
    } else {
        return 0;
    }
    return out->y ? 0 : -1;
}

int kiln_loader_next(kiln_loader *ld, kiln_batch *out)
{
    if (!ld || !out)
        return kiln__error_set("loader_next: NULL argument");
    memset(out, 0, sizeof *out);
    if (ld->next_take >= ld->nbatches)
        return 0;
    int64_t b = ld->next_take;
    slot *s = &ld->slots[b % ld->nslots];
    if (ld->cfg.workers == 0) {
        s->batch = b;
        if (fill(ld, b, s) < 0)
            return kiln__error_set("%s", s->err);
        s->state = SLOT_READY;
    } else {
        pthread_mutex_lock(&ld->mu);
        while (!(s->batch == b && (s->state == SLOT_READY || s->state == SLOT_FAILED)))
            pthread_cond_wait(&ld->cv, &ld->mu);
        pthread_mutex_unlock(&ld->mu);
        if (s->state == SLOT_FAILED)
            return kiln__error_set("%s", s->err);
    }
    /* Built in a private scope and handed over as views, so the outcome is the same
     * whether or not the caller has a scope open, and a failure leaks nothing. */
    kiln_scope_begin();
    int rc = make_batch(ld, s, out);
    kiln_tensor *x = rc == 0 ? kiln_keep(out->x) : NULL, *y = rc == 0 && out->y ? kiln_keep(out->y) : NULL;
    kiln_scope_end();
    out->x = x ? kiln_detach(x) : NULL;
    out->y = y ? kiln_detach(y) : NULL;
    kiln_tensor_release(x);
    kiln_tensor_release(y);
    if (rc == 0 && (!out->x || (y && !out->y)))
        rc = -1;
    pthread_mutex_lock(&ld->mu);
    s->state = SLOT_EMPTY;
    s->batch = -1;
    ld->next_take++;
    pthread_cond_broadcast(&ld->cv);
    pthread_mutex_unlock(&ld->mu);
    if (rc < 0) {
        memset(out, 0, sizeof *out);
        return -1;
    }
    return 1;
}

void kiln_loader_free(kiln_loader *ld)
{
    if (!ld)
        return;
    stop_workers(ld);
    for (int i = 0; ld->slots && i < ld->nslots; i++) {
        free(ld->slots[i].x);
        free(ld->slots[i].t);
    }
    free(ld->slots);
    free(ld->order);
    free(ld->threads);
    pthread_mutex_destroy(&ld->mu);
    pthread_cond_destroy(&ld->cv);
    kiln_dataset_free(ld->ds);
    free(ld);
}
