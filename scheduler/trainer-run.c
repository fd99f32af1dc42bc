/*
 * scheduler/trainer-run.c — one training job on the daemon's training thread: data sets,
 * model, optimizer and Learner built from the spec, resume, fit, and the result registered.
 *
 * Cancellation is a flag the Learner's subscriber reads after each step, which is the
 * granularity the Learner offers (kiln_learner_cancel stops before the next step). Resuming
 * uses the Learner's exact resume: the loaders' order is a function of (seed, epoch), so a job
 * restarted after a crash repeats the batches it lost and ends with the model an uninterrupted
 * run would have produced.
 */
#include <errno.h>
#include <stdarg.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <zlib.h>

#include "kiln/autodiff.h"
#include "kiln/data.h"
#include "kiln/loss.h"
#include "kiln/nn.h"
#include "kiln/record.h"
#include "kiln/train.h"
#include "repository.h"
#include "trainer-impl.h"

/* ---- the data's items and the model's answer to one ---------------------------------------- */

/* An IDX header (gzipped or not): its element type and dims. 0, or -1 when it does not read as one. */
static int idx_header(gzFile f, int *type, int *ndim, int64_t *dims)
{
    unsigned char hdr[4], raw[4 * KILN_MAX_DIMS];
    if (gzread(f, hdr, 4) != 4 || hdr[0] || hdr[1] || hdr[3] < 1 || hdr[3] > KILN_MAX_DIMS)
        return -1;
    *type = hdr[2];
    *ndim = hdr[3];
    if (gzread(f, raw, 4u * (unsigned)*ndim) != 4 * *ndim)
        return -1;
    for (int d = 0; d < *ndim; d++)
        dims[d] = (int64_t)raw[4 * d] << 24 | (int64_t)raw[4 * d + 1] << 16 | (int64_t)raw[4 * d + 2] << 8 |
                  raw[4 * d + 3];
    return 0;
}

/* IDX images: an item's shape as kiln_dataset_idx gives it ([1, H, W] for a 3-D file); returns the
 * item count, -1 when the header does not read. */
static int64_t idx_items(const char *path, struct kd_trainer_items *out)
{
    gzFile f = gzopen(path, "rb");
    int type, ndim;
    int64_t dims[KILN_MAX_DIMS], count = -1;
    if (f && idx_header(f, &type, &ndim, dims) == 0 && ndim >= 2) {
        out->ndim = ndim == 3 ? 3 : ndim - 1;
        for (int d = 0; d < out->ndim; d++)
            out->shape[d] = ndim == 3 ? (d == 0 ? 1 : dims[d]) : dims[d + 1];
        count = dims[0];
    }
    if (f)
        gzclose(f);
    return count;
}

/* IDX labels of unsigned bytes (MNIST's kind, one byte an item): the class count, largest + 1;
 * returns the label count of a 1-d file of any type, -1 when the header does not read as one. */
static int64_t idx_classes(const char *path, struct kd_trainer_items *out)
{
    gzFile f = gzopen(path, "rb");
    int type, ndim;
    int64_t dims[KILN_MAX_DIMS], count = -1;
    if (f && idx_header(f, &type, &ndim, dims) == 0 && ndim == 1)
        count = dims[0];
    if (count >= 0 && type == 0x08) {
        unsigned char buf[65536];
        int64_t left = dims[0], largest = -1;
        int got = 0;
        while (left > 0 && (got = gzread(f, buf, left < (int64_t)sizeof buf ? (unsigned)left : sizeof buf)) > 0) {
            for (int i = 0; i < got; i++)
                largest = buf[i] > largest ? buf[i] : largest;
            left -= got;
        }
        if (left == 0)
            out->num_classes = largest + 1;
    }
    if (f)
        gzclose(f);
    return count;
}

/* The CSV header line: every column but the label is a feature. A header without the label
 * column is the spec's problem (data.label_column), told with the columns there are. */
static void csv_items(const char *path, const char *label_column, struct kd_trainer_items *out)
{
    FILE *f = fopen(path, "r");
    char line[65536];
    if (f && fgets(line, sizeof line, f) && strchr(line, '\n')) {
        int cells = 0;
        bool has_label = false;
        char columns[256] = "";
        size_t used = 0;
        for (char *save = NULL, *c = strtok_r(line, ",\r\n", &save); c; c = strtok_r(NULL, ",\r\n", &save)) {
            size_t n = strlen(c);
            if (n >= 2 && c[0] == '"' && c[n - 1] == '"') {
                c[n - 1] = '\0';
                c++;
            }
            cells++;
            has_label = has_label || (label_column && strcmp(c, label_column) == 0);
            if (used < sizeof columns) {
                int w = snprintf(columns + used, sizeof columns - used, "%s'%s'", cells > 1 ? ", " : "", c);
                used += w > 0 ? (size_t)w : 0;
            }
        }
        if (used >= sizeof columns) /* cut short: say so rather than end mid-name */
            memcpy(columns + sizeof columns - 4, "...", 4);
        if (has_label && cells > 1) {
            out->ndim = 1;
            out->shape[0] = cells - 1;
        } else if (!has_label && label_column) {
            out->problem_field = "data.label_column";
            snprintf(out->problem, sizeof out->problem, "'%.200s' is not a column of %.900s (its header has %s)",
                     label_column, path, columns);
        }
    }
    if (f)
        fclose(f);
}

void kd_trainer_probe_items(const struct kd_jobspec *s, struct kd_trainer_items *out)
{
    memset(out, 0, sizeof *out);
    if (!s->data_type || !s->train_a)
        return;
    if (strcmp(s->data_type, "csv") == 0) {
        csv_items(s->train_a, s->label_column, out);
        return;
    }
    char im[PATH_MAX + 64], lb[PATH_MAX + 64];
    const char *images = s->train_a, *labels = s->train_b;
    if (strcmp(s->data_type, "fashion_mnist") == 0) {
        snprintf(im, sizeof im, "%s/train-images-idx3-ubyte.gz", s->train_a);
        snprintf(lb, sizeof lb, "%s/train-labels-idx1-ubyte.gz", s->train_a);
        images = im;
        labels = lb;
    } else if (strcmp(s->data_type, "idx") != 0) {
        return;
    }
    int64_t items = idx_items(images, out);
    int64_t count = labels ? idx_classes(labels, out) : -1;
    if (items >= 0 && count >= 0 && items != count) {
        out->problem_field = "data";
        snprintf(out->problem, sizeof out->problem, "%.900s holds %lld items but %.900s holds %lld labels", images,
                 (long long)items, labels, (long long)count);
    }
}

static void shape_text(char *out, size_t len, int ndim, const int64_t *shape)
{
    size_t used = 0;
    out[0] = '\0';
    for (int d = 0; d < ndim && used + 24 < len; d++)
        used += (size_t)snprintf(out + used, len - used, "%s%lld", d ? ", " : "", (long long)shape[d]);
}

int64_t kd_trainer_output_width(kiln_module *model, kiln_device *dev, const struct kd_trainer_items *items,
                                char *why, size_t len)
{
    int64_t shape[KILN_MAX_DIMS + 1] = {1};
    for (int d = 0; d < items->ndim; d++)
        shape[d + 1] = items->shape[d];
    char in[160], out_shape[160];
    shape_text(in, sizeof in, items->ndim + 1, shape);
    bool was = kiln_module_is_training(model);
    kiln_module_train(model, false); /* batch-norm statistics of one item are no statistics */
    kiln_no_grad_begin();
    kiln_scope_begin();
    kiln_tensor *x = kiln_zeros(dev, KILN_F32, items->ndim + 1, shape);
    kiln_tensor *y = x ? kiln_module_forward(model, x) : NULL;
    int64_t width = -1;
    if (!y) {
        snprintf(why, len, "does not take the data's items (one item is a [%s] input): %s", in, kiln_error());
    } else if (kiln_tensor_ndim(y) != 2 || kiln_tensor_dim(y, 0) != 1) {
        int64_t dims[KILN_MAX_DIMS];
        for (int d = 0; d < kiln_tensor_ndim(y) && d < KILN_MAX_DIMS; d++)
            dims[d] = kiln_tensor_dim(y, d);
        shape_text(out_shape, sizeof out_shape, kiln_tensor_ndim(y), dims);
        snprintf(why, len, "gives [%s] for a [%s] input; a classifier gives [batch, classes] (here [1, classes])",
                 out_shape, in);
    } else if (kiln_tensor_dim(y, 1) < items->num_classes) {
        snprintf(
            why, len,
            "gives %lld class scores an item but the data has %lld classes (labels 0..%lld): the output needs "
            "at least %lld",
            (long long)kiln_tensor_dim(y, 1), (long long)items->num_classes, (long long)items->num_classes - 1,
            (long long)items->num_classes);
    } else {
        width = kiln_tensor_dim(y, 1);
    }
    kiln_scope_end();
    kiln_no_grad_end();
    kiln_module_train(model, was);
    return width;
}

/* ---- the run ------------------------------------------------------------------------------- */

struct run_ctx {
    const struct kd_trainer_run *run;
    kiln_learner *L;
    uint64_t last_step_ns;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A "log" event with the message; a warning also goes to the warn hook (kilnd's log). */
static void vlog(const struct kd_trainer_run *run, bool warning, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
static void vlog(const struct kd_trainer_run *run, bool warning, const char *fmt, va_list ap)
{
    char msg[640];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (warning && run->hooks.warn)
        run->hooks.warn(run->hooks.ud, msg);
    if (!run->hooks.event)
        return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "message", msg);
    if (warning)
        cJSON_AddStringToObject(o, "level", "warning");
    char *text = cJSON_PrintUnformatted(o);
    if (text)
        run->hooks.event(run->hooks.ud, "log", text);
    cJSON_free(text);
    cJSON_Delete(o);
}

static void logf_(const struct kd_trainer_run *run, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(const struct kd_trainer_run *run, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(run, false, fmt, ap);
    va_end(ap);
}

/* Where the data's classes have names (a CSV's text labels, numbered in order of first appearance),
 * which name each class index the model answers with stands for: the one record of that mapping a
 * user has, kept with the job's logs. */
static void log_class_names(const struct kd_trainer_run *run, const kiln_dataset *train, int64_t num_classes)
{
    if (!kiln_dataset_class_name(train, 0))
        return;
    char text[1024];
    size_t used = 0;
    int64_t c = 0;
    for (; c < num_classes && used < sizeof text - 80; c++) {
        const char *name = kiln_dataset_class_name(train, c);
        int w = snprintf(text + used, sizeof text - used, "%s%lld = %.64s", c ? ", " : "", (long long)c,
                         name ? name : "?");
        used += w > 0 ? (size_t)w : 0;
    }
    if (c < num_classes)
        snprintf(text + used, sizeof text - used, ", ... (%lld classes)", (long long)num_classes);
    logf_(run, "classes: %s", text);
}

static void warnf(const struct kd_trainer_run *run, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warnf(const struct kd_trainer_run *run, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(run, true, fmt, ap);
    va_end(ap);
}

/* A newer checkpoint passed over because it does not verify (damaged, or cut short by a
 * crash): the run goes back further than the job's history says, so the user is told which
 * one and why. */
static void skipped_checkpoint(const char *path, const char *why, void *ud)
{
    warnf(ud, "passed over checkpoint %.300s: %.250s", path, why);
}

static void on_event(void *ud, const kiln_train_event *ev)
{
    struct run_ctx *c = ud;
    const struct kd_trainer_hooks *h = &c->run->hooks;
    if (atomic_load(c->run->cancel))
        kiln_learner_cancel(c->L);
    switch (ev->kind) {
    case KILN_EVENT_STEP: {
        double total = (double)(c->run->spec->epochs * ev->batches);
        if (h->progress && total > 0)
            h->progress(h->ud, ((double)(ev->epoch - 1) * (double)ev->batches + (double)ev->batch + 1) / total);
        /* Every step is too many rows for the store on a fast model: at most five a second,
         * plus each epoch's last step. */
        uint64_t t = now_ns();
        if (h->event && (t - c->last_step_ns > 200000000u || ev->batch + 1 == ev->batches)) {
            c->last_step_ns = t;
            h->event(h->ud, "step", ev->json);
        }
        break;
    }
    case KILN_EVENT_EPOCH:
        if (h->event)
            h->event(h->ud, "epoch", ev->json);
        break;
    case KILN_EVENT_CHECKPOINT:
        if (h->event)
            h->event(h->ud, "checkpoint", ev->json);
        if (h->checkpoint && ev->path)
            h->checkpoint(h->ud, ev->path, ev->step);
        break;
    case KILN_EVENT_DONE:
        break;
    }
}

static kiln_dataset *open_set(const struct kd_jobspec *s, const char *a, const char *b, const char *fashion_prefix,
                              int64_t limit)
{
    kiln_dataset *ds = NULL;
    if (strcmp(s->data_type, "fashion_mnist") == 0) {
        char im[PATH_MAX + 64], lb[PATH_MAX + 64];
        snprintf(im, sizeof im, "%s/%s-images-idx3-ubyte.gz", a, fashion_prefix);
        snprintf(lb, sizeof lb, "%s/%s-labels-idx1-ubyte.gz", a, fashion_prefix);
        kiln_dataset *raw = kiln_dataset_idx(im, lb);
        ds = raw && s->normalize ? kiln_dataset_normalize(raw, 1, (const float[]){0.2860f}, (const float[]){0.3530f})
                                 : (raw ? kiln_dataset_retain(raw) : NULL);
        kiln_dataset_free(raw);
    } else if (strcmp(s->data_type, "idx") == 0) {
        ds = kiln_dataset_idx(a, b);
    } else {
        ds = kiln_dataset_csv(a, s->label_column, 0, NULL);
    }
    if (ds && limit > 0 && limit < kiln_dataset_length(ds)) {
        kiln_dataset *sub = kiln_dataset_range(ds, 0, limit);
        kiln_dataset_free(ds);
        ds = sub;
    }
    return ds;
}

static char *final_metrics(kiln_learner *L)
{
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; kd_trainer_metrics[i]; i++) {
        double v = kiln_learner_metric(L, kd_trainer_metrics[i]);
        if (isfinite(v))
            cJSON_AddNumberToObject(o, kd_trainer_metrics[i], v);
    }
    cJSON_AddNumberToObject(o, "epochs", (double)kiln_learner_epoch(L));
    cJSON_AddNumberToObject(o, "steps", (double)kiln_learner_step(L));
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    char *copy = text ? strdup(text) : NULL;
    cJSON_free(text);
    return copy;
}

/* A repository version's weights (every tensor of its record) into model, strictly. */
static int load_weights(kiln_module *model, const char *path, kiln_device *dev)
{
    kiln_record *rec = kiln_record_open(path);
    if (!rec)
        return -1;
    const kiln_safetensors *st = kiln_record_tensors(rec);
    int n = kiln_safetensors_count(st), rc = -1;
    const char **names = calloc((size_t)n + 1, sizeof *names);
    kiln_tensor **ts = calloc((size_t)n + 1, sizeof *ts);
    if (names && ts) {
        rc = 0;
        for (int i = 0; i < n && rc == 0; i++) {
            names[i] = kiln_safetensors_name(st, i);
            ts[i] = kiln_safetensors_load(st, names[i], dev);
            rc = ts[i] ? 0 : -1;
        }
        if (rc == 0)
            rc = kiln_module_load_state_dict(model, n, names, ts, true, NULL);
    }
    for (int i = 0; ts && i < n; i++)
        kiln_tensor_release(ts[i]);
    free(names);
    free(ts);
    kiln_record_close(rec);
    return rc;
}

static kiln_tensor *smoothed_ce(void *ud, kiln_tensor *output, kiln_tensor *target)
{
    kiln_loss_ce_opts o = kiln_loss_ce_opts_default();
    o.label_smoothing = *(const double *)ud;
    return kiln_loss_cross_entropy(output, target, &o);
}

int kd_trainer_run(const struct kd_trainer_run *run, struct kd_trainer_result *res)
{
    const struct kd_jobspec *s = run->spec;
    memset(res, 0, sizeof *res);
    snprintf(res->stop_reason, sizeof res->stop_reason, "error");
    kiln_device *dev = kiln_device_open(s->device);
    /* the training thread's own queue: its steps overlap inference on an async device
     * (the gate still decides who goes first between steps) */
    kiln_queue *queue = dev ? kiln_queue_open(dev) : NULL;
    if (queue)
        kiln_queue_use(dev, queue);
    kiln_dataset *train = NULL, *valid = NULL;
    kiln_module *model = NULL;
    kiln_optim *opt = NULL;
    kiln_sched *sched = NULL;
    kiln_loader *tl = NULL, *vl = NULL;
    kiln_learner *L = NULL;
    int rc = -1;
    if (!dev) {
        snprintf(res->error, sizeof res->error, "device: %s", kiln_error());
        goto out;
    }
    logf_(run, "loading %s data", s->data_type);
    train = open_set(s, s->train_a, s->train_b, "train", s->limit);
    if (train && strcmp(s->data_type, "fashion_mnist") == 0)
        valid = open_set(s, s->train_a, NULL, "t10k", s->valid_limit);
    else if (train && s->valid_a)
        valid = open_set(s, s->valid_a, s->valid_b, NULL, s->valid_limit);
    if (!train || (!valid && (s->valid_a || strcmp(s->data_type, "fashion_mnist") == 0))) {
        snprintf(res->error, sizeof res->error, "data: %s", kiln_error());
        goto out;
    }
    if (s->valid_split > 0) {
        kiln_dataset *tr = NULL, *va = NULL;
        if (kiln_dataset_split(train, s->valid_split, s->seed, &tr, &va) != 0) {
            snprintf(res->error, sizeof res->error, "data.valid_split: %s", kiln_error());
            goto out;
        }
        kiln_dataset_free(train);
        train = tr;
        valid = va;
    }
    kiln_dataset_info info = kiln_dataset_get_info(train);
    if (info.num_classes <= 0) {
        snprintf(res->error, sizeof res->error, "data: the training set has no class labels");
        goto out;
    }
    kiln_generator gen = kiln_generator_make(s->seed);
    if (s->model_onnx) {
        char why[400];
        model = kd_trainer_onnx_module(s->model_onnx, dev, why, sizeof why);
        if (!model) {
            snprintf(res->error, sizeof res->error, "model: %s", why);
            goto out;
        }
    } else {
        model = kiln_model_from_json(s->model_json, dev, &gen);
        if (!model) {
            snprintf(res->error, sizeof res->error, "model: %s", kiln_error());
            goto out;
        }
        if (s->init_weights && load_weights(model, s->init_weights, dev) != 0) {
            snprintf(res->error, sizeof res->error, "model: the weights of %.40s version %lld: %.300s", s->base_model,
                     (long long)s->base_version, kiln_error());
            goto out;
        }
    }
    /* One item through the model before any step: a model that does not fit the data fails
     * here naming both shapes, not at the first step with the engine's message about a layer. */
    struct kd_trainer_items items = {.ndim = info.ndim, .num_classes = info.num_classes};
    memcpy(items.shape, info.shape, sizeof items.shape);
    char why[400];
    int64_t width = kd_trainer_output_width(model, dev, &items, why, sizeof why);
    if (width < 0) {
        snprintf(res->error, sizeof res->error, "model: %s", why);
        goto out;
    }
    if (s->base_model)
        logf_(run, "fine-tuning %s version %lld", s->base_model, (long long)s->base_version);
    else if (s->model_onnx)
        logf_(run, "fine-tuning the ONNX graph %s", s->model_onnx);
    opt = kiln_optim_create_module(&s->optim, model);
    kiln_loader_config lc = kiln_loader_config_default();
    lc.batch_size = s->batch_size;
    lc.seed = s->seed;
    lc.workers = s->workers;
    tl = opt ? kiln_loader_create(train, &lc, dev) : NULL;
    lc.shuffle = false;
    lc.batch_size = s->batch_size > 256 ? s->batch_size : 256;
    vl = tl && valid ? kiln_loader_create(valid, &lc, dev) : NULL;
    if (!tl || (valid && !vl)) {
        snprintf(res->error, sizeof res->error, "%s", kiln_error());
        goto out;
    }
    if (s->has_sched) {
        kiln_sched_config sc = s->sched;
        /* per step: optimizer updates, one per grad_accum batches and one for an epoch's rest */
        int64_t updates = (kiln_loader_batches(tl) + s->grad_accum - 1) / s->grad_accum;
        if (sc.kind == KILN_SCHED_COSINE && sc.t_max <= 0)
            sc.t_max = s->sched_per_step ? s->epochs * updates : s->epochs;
        sched = kiln_sched_create(&sc, opt);
        if (!sched) {
            snprintf(res->error, sizeof res->error, "scheduler: %s", kiln_error());
            goto out;
        }
    }
    mkdir(run->checkpoint_dir, 0777);
    kiln_learner_config cfg = kiln_learner_config_default();
    cfg.epochs = s->epochs;
    cfg.num_classes = info.num_classes;
    cfg.grad_accum = s->grad_accum;
    /* a model gone NaN would be registered and answer nulls: the job fails naming the step */
    cfg.fail_on_nonfinite_loss = true;
    cfg.sched_per_step = s->sched_per_step;
    cfg.checkpoint_dir = run->checkpoint_dir;
    cfg.checkpoint_every_epochs = s->ckpt_every_epochs;
    cfg.checkpoint_every_steps = s->ckpt_every_steps;
    cfg.keep_last = s->keep_last;
    cfg.best_metric = s->best_metric;
    cfg.best_max = s->best_max;
    cfg.early_stop_metric = s->early_metric;
    cfg.early_stop_max = s->early_max;
    cfg.patience = s->patience;
    cfg.min_delta = s->min_delta;
    cfg.seed = s->seed;
    L = kiln_learner_create(&cfg, model, opt, sched, tl, vl);
    if (!L) {
        snprintf(res->error, sizeof res->error, "%s", kiln_error());
        goto out;
    }
    double smoothing = s->label_smoothing;
    if (smoothing > 0)
        kiln_learner_set_loss(L, smoothed_ce, &smoothing);
    struct run_ctx ctx = {run, L, 0};
    kiln_learner_subscribe(L, on_event, &ctx);
    if (run->resume_dir) {
        kiln_ckpt *ck = kiln_ckpt_open_latest(run->resume_dir, skipped_checkpoint, (void *)run);
        if (ck) {
            int64_t step = kiln_ckpt_step(ck);
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s", kiln_ckpt_path(ck));
            kiln_ckpt_close(ck);
            if (kiln_learner_resume(L, path) != 0) {
                snprintf(res->error, sizeof res->error, "resuming from %.200s: %.250s", path, kiln_error());
                goto out;
            }
            res->resumed = true;
            res->resumed_step = step;
            /* the learner counts epochs completed; every other line names epochs from 1 */
            int64_t done = kiln_learner_epoch(L);
            logf_(run,
                  "resumed from checkpoint at step %lld (%lld epoch%s completed; training goes on in epoch %lld)",
                  (long long)step, (long long)done, done == 1 ? "" : "s", (long long)(done + 1));
        } else {
            /* The caller found one there; starting from step 0 now would silently be another run. */
            snprintf(res->error, sizeof res->error, "resuming: no checkpoint in %.200s verifies any more: %.250s",
                     run->resume_dir, kiln_error());
            goto out;
        }
    }
    if (atomic_load(run->cancel)) {
        snprintf(res->stop_reason, sizeof res->stop_reason, "cancelled");
        rc = 0;
        goto out;
    }
    log_class_names(run, train, info.num_classes);
    logf_(run, "training %lld parameters on %lld items (%lld validation), %lld batches per epoch on %s",
          (long long)kiln_module_parameter_count(model, true), (long long)kiln_dataset_length(train),
          (long long)(valid ? kiln_dataset_length(valid) : 0), (long long)kiln_loader_batches(tl),
          kiln_device_name(dev));
    if (kiln_learner_fit(L) != 0) {
        snprintf(res->error, sizeof res->error, "%s", kiln_error());
        goto out;
    }
    snprintf(res->stop_reason, sizeof res->stop_reason, "%s", kiln_learner_stop_reason(L));
    res->metrics_json = final_metrics(L);
    rc = 0;
    if (strcmp(res->stop_reason, "cancelled") != 0 && s->register_as) {
        kiln_module_train(model, false);
        rc = kd_trainer_register(run, model, train, &info, width, res);
        if (rc == 0)
            logf_(run, "model registered as %s version %lld", s->register_as, (long long)res->version);
    }
out:
    if (rc != 0)
        snprintf(res->stop_reason, sizeof res->stop_reason, "error");
    kiln_learner_free(L);
    kiln_sched_free(sched);
    kiln_loader_free(vl);
    kiln_loader_free(tl);
    kiln_optim_free(opt);
    kiln_module_free(model);
    kiln_dataset_free(train);
    kiln_dataset_free(valid);
    kiln_queue_close(queue);
    if (dev)
        kiln_device_close(dev);
    return rc;
}
