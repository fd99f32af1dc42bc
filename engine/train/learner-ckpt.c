/*
 * engine/train/learner-ckpt.c — writing the learner's state through the storage
 * module's checkpoints (kiln_ckpt_*) and reading it back for an exact resume.
 *
 * What a resume needs besides the weights: the model's buffers (BatchNorm statistics),
 * the optimizer's moments and step counts, the scheduler's step, the generators (the
 * learner's, then every module's: dropout draws from its module's own stream), the
 * epoch, the next batch of a partly done epoch with that epoch's partial sums, and the
 * metric history (from which keep-best and early stopping are recomputed). The position
 * and history travel in the checkpoint's metrics.json as
 *   {"history": [...], "batch": 312, "partial": {"loss": .., "n": .., "correct": ..},
 *    "generators": ["", "fc1", "drop", ...],
 *    "confusion": {"classes": 10, "cells": [[label, prediction, count], ...]}}
 * where "generators" names the module of each generator after the learner's (rng[1..])
 * so that a resume into a differently built model is refused rather than misassigned.
 * Checkpoints written before the module generators were saved lack that key; they resume
 * as they always did (the modules keep their current streams), with a notice.
 * "confusion" holds the nonzero cells of the latest validation's confusion matrix (a
 * classifier's, as the report shows it) and the metrics come back from the history's last
 * epoch, so that a finished run resumed reports what it reported before. The model
 * record's config is the model's JSON spec when it was built from one
 * (kiln_model_spec_json), so that a checkpoint alone makes the model again.
 *
 * A resume is all or nothing: everything is read and checked before the first change.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "kiln/record.h"
#include "kiln/autodiff.h"
#include "learner-impl.h"
#include "tensor-impl.h"

static char *position_json(const kiln_learner *L, int ngen, const char *const *gen_paths)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddItemToObject(o, "history", cJSON_Duplicate(L->history, true));
    cJSON *g = cJSON_AddArrayToObject(o, "generators");
    for (int i = 0; g && i < ngen; i++)
        cJSON_AddItemToArray(g, cJSON_CreateString(gen_paths[i]));
    cJSON_AddNumberToObject(o, "batch", (double)L->batch_pos);
    cJSON *p = cJSON_AddObjectToObject(o, "partial");
    /* %.17g round-trips a double, so the resumed epoch's mean loss is the same number */
    char buf[64];
    snprintf(buf, sizeof buf, "%.17g", L->part_loss);
    cJSON_AddItemToObject(p, "loss", cJSON_CreateRaw(buf));
    cJSON_AddNumberToObject(p, "n", (double)L->part_n);
    cJSON_AddNumberToObject(p, "correct", (double)L->part_correct);
    if (L->cm.counts) {
        /* the nonzero cells only: a matrix of 1000 classes has a million */
        cJSON *cmo = cJSON_AddObjectToObject(o, "confusion");
        int64_t c = L->cm.classes;
        cJSON_AddNumberToObject(cmo, "classes", (double)c);
        cJSON *cm = cJSON_AddArrayToObject(cmo, "cells");
        for (int64_t k = 0; cm && k < c * c; k++)
            if (L->cm.counts[k]) {
                const double cell[3] = {(double)(k / c), (double)(k % c), (double)L->cm.counts[k]};
                cJSON_AddItemToArray(cm, cJSON_CreateDoubleArray(cell, 3));
            }
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

int kiln__learner_save(kiln_learner *L, bool at_epoch_end)
{
    int n = kiln_module_state_dict(L->model, NULL, 0);
    kiln_named_tensor *sd = calloc((size_t)n + 1, sizeof *sd);
    const char **names = calloc((size_t)n + 1, sizeof *names);
    kiln_tensor **ts = calloc((size_t)n + 1, sizeof *ts);
    kiln_optim_state os = {0};
    char *sched = L->sched ? kiln_sched_state_export(L->sched) : NULL;
    /* The learner's generator first (where older checkpoints have their only one), then
     * every module's, in kiln_module_generators order. */
    int ngen = kiln_module_generators(L->model, NULL, NULL, 0);
    kiln_generator **gens = calloc((size_t)ngen + 1, sizeof *gens);
    const char **gen_paths = calloc((size_t)ngen + 1, sizeof *gen_paths);
    kiln_generator *rngs = calloc((size_t)ngen + 1, sizeof *rngs);
    char *pos = NULL;
    /* The spec when the model was built from one; other models (a layer, an ONNX graph)
     * save "{}" as before. */
    char *spec = kiln_model_spec_json(L->model);
    int rc = -1;
    if (gens && gen_paths && rngs) {
        kiln_module_generators(L->model, gens, gen_paths, ngen);
        rngs[0] = L->rng;
        for (int i = 0; i < ngen; i++)
            rngs[i + 1] = *gens[i];
        pos = position_json(L, ngen, gen_paths);
    }
    if (!sd || !names || !ts || !pos || (L->sched && !sched)) {
        kiln__error_set("checkpoint: out of memory");
        goto done;
    }
    kiln_module_state_dict(L->model, sd, n);
    for (int i = 0; i < n; i++) {
        names[i] = sd[i].name;
        ts[i] = sd[i].tensor;
    }
    if (kiln_optim_state_export(L->opt, &os) < 0)
        goto done;
    kiln_ckpt_state s = {
        .step = L->step,
        .epoch = L->epoch,
        .model_n = n,
        .model_names = names,
        .model_tensors = ts,
        .model_config = spec,
        .optim_n = os.n,
        .optim_names = (const char *const *)os.names,
        .optim_tensors = os.tensors,
        .optim_config = os.json,
        .scheduler_json = sched,
        .rng_n = ngen + 1,
        .rng = rngs,
        .metrics_json = pos,
        .metric_n = at_epoch_end ? L->nm : 0,
        .metric_names = L->mnames,
        .metric_values = L->mvals,
    };
    char path[4200];
    if (kiln_ckpt_save(L->ckpt_dir, &s, path, sizeof path) < 0)
        goto done;
    snprintf(L->last_ckpt, sizeof L->last_ckpt, "%s", path);
    kiln_ckpt_retention keep = {.keep_last = L->cfg.keep_last, .best_metric = L->best_metric,
                                .best_max = L->cfg.best_max, .keep_best = L->best_metric ? 1 : 0};
    if (kiln_ckpt_retain(L->ckpt_dir, &keep, NULL) < 0)
        goto done;
    kiln_train_event ev = {.kind = KILN_EVENT_CHECKPOINT, .epoch = L->epoch, .step = L->step,
                           .batch = L->batch_pos, .batches = kiln_loader_batches(L->train), .path = path};
    kiln__learner_emit(L, &ev);
    rc = 0;
done:
    kiln_optim_state_free(&os);
    free(sched);
    free(spec);
    free(pos);
    free(gens);
    free(gen_paths);
    free(rngs);
    free(sd);
    free(names);
    free(ts);
    return rc;
}

/* Load every tensor of a record (all of them, by name) onto dev. */
static int load_all(const kiln_record *rec, kiln_device *dev, int *n_out, char ***names_out, kiln_tensor ***ts_out)
{
    const kiln_safetensors *st = kiln_record_tensors(rec);
    int n = kiln_safetensors_count(st);
    char **names = calloc((size_t)n + 1, sizeof *names);
    kiln_tensor **ts = calloc((size_t)n + 1, sizeof *ts);
    int rc = names && ts ? 0 : kiln__error_set("resume: out of memory");
    for (int i = 0; rc == 0 && i < n; i++) {
        names[i] = strdup(kiln_safetensors_name(st, i));
        ts[i] = names[i] ? kiln_safetensors_load(st, names[i], dev) : NULL;
        if (!ts[i])
            rc = -1;
    }
    if (rc != 0) {
        for (int i = 0; names && ts && i < n; i++) {
            free(names[i]);
            kiln_tensor_release(ts[i]);
        }
        free(names);
        free(ts);
        return -1;
    }
    *n_out = n;
    *names_out = names;
    *ts_out = ts;
    return 0;
}

static void free_all(int n, char **names, kiln_tensor **ts)
{
    for (int i = 0; i < n; i++) {
        free(names[i]);
        kiln_tensor_release(ts[i]);
    }
    free(names);
    free(ts);
}

/* The model's tensors and, for each, the checkpoint's value in the model tensor's dtype:
 * everything checked (names, shapes) and converted before anything is written. */
typedef struct model_plan {
    int n;
    kiln_tensor **dst; /* borrowed: the model's own tensors */
    kiln_tensor **src; /* owned: converted copies */
} model_plan;

static void plan_free(model_plan *p)
{
    for (int i = 0; p->src && i < p->n; i++)
        kiln_tensor_release(p->src[i]);
    free(p->dst);
    free(p->src);
    memset(p, 0, sizeof *p);
}

/* The first checkpoint tensor the model does not have, for a message: "" when none. */
static void first_unexpected(const kiln_named_tensor *sd, int nm, int n, char **names, kiln_tensor **ts, char *out,
                             size_t len)
{
    out[0] = 0;
    for (int j = 0; j < n && !out[0]; j++) {
        bool known = false;
        for (int i = 0; i < nm && !known; i++)
            known = strcmp(names[j], sd[i].name) == 0;
        if (!known) {
            char d[96];
            snprintf(out, len, "'%.200s' %s", names[j], kiln_tensor_describe(ts[j], d, sizeof d));
        }
    }
}

/* Match the checkpoint's tensors to the model's by name and shape. The first model tensor
 * that is missing or shaped otherwise is named with both sides, so that a checkpoint of
 * another model (an MLP's resumed into a CNN) says which tensors differ. */
static int plan_model(kiln_module *m, int n, char **names, kiln_tensor **ts, model_plan *plan)
{
    int nm = kiln_module_state_dict(m, NULL, 0);
    kiln_named_tensor *sd = calloc((size_t)nm + 1, sizeof *sd);
    plan->dst = calloc((size_t)nm + 1, sizeof *plan->dst);
    plan->src = calloc((size_t)nm + 1, sizeof *plan->src);
    plan->n = nm;
    if (!sd || !plan->dst || !plan->src) {
        free(sd);
        return kiln__error_set("out of memory");
    }
    kiln_module_state_dict(m, sd, nm);
    int rc = 0;
    char a[96], b[96], extra[320];
    kiln_no_grad_begin();
    for (int i = 0; rc == 0 && i < nm; i++) {
        int k = -1;
        for (int j = 0; j < n && k < 0; j++)
            if (strcmp(names[j], sd[i].name) == 0)
                k = j;
        if (k < 0) {
            first_unexpected(sd, nm, n, names, ts, extra, sizeof extra);
            rc = kiln__error_set("the checkpoint holds another model: model tensor '%s' %s is not in the "
                                 "checkpoint%s%s%s",
                                 sd[i].name, kiln_tensor_describe(sd[i].tensor, a, sizeof a),
                                 extra[0] ? " (whose tensors include " : "", extra,
                                 extra[0] ? ", not in the model)" : "");
            break;
        }
        kiln_tensor *dst = sd[i].tensor, *src = ts[k];
        bool same = kiln_tensor_ndim(src) == kiln_tensor_ndim(dst);
        for (int d = 0; same && d < kiln_tensor_ndim(dst); d++)
            same = kiln_tensor_dim(src, d) == kiln_tensor_dim(dst, d);
        if (!same) {
            rc = kiln__error_set("the checkpoint holds another model: '%s': checkpoint %s, model %s", sd[i].name,
                                 kiln_tensor_describe(src, a, sizeof a), kiln_tensor_describe(dst, b, sizeof b));
            break;
        }
        plan->dst[i] = dst;
        plan->src[i] = kiln_keep(kiln_cast(src, kiln_tensor_dtype(dst)));
        if (!plan->src[i])
            rc = -1;
    }
    kiln_no_grad_end();
    if (rc == 0 && n != nm) {
        /* every model tensor is there: the checkpoint has more */
        first_unexpected(sd, nm, n, names, ts, extra, sizeof extra);
        rc = kiln__error_set("the checkpoint holds another model: it has %d model tensors, the model %d; "
                             "checkpoint tensor %s is not in the model",
                             n, nm, extra[0] ? extra : "(a repeated name)");
    }
    free(sd);
    return rc < 0 ? -1 : 0;
}

/* Copy the planned values into the model's own tensors, in place as
 * kiln_module_load_state_dict does, so every holder of a parameter (the optimizer above
 * all) stays in step; planned first, so that nothing is written before all is checked. */
static int write_model(const model_plan *plan)
{
    int rc = 0;
    kiln_no_grad_begin();
    for (int i = 0; rc == 0 && i < plan->n; i++)
        rc = kiln__copy_into(plan->dst[i], plan->src[i], "learner_resume") < 0 ? -1 : 0;
    kiln_no_grad_end();
    return rc;
}

/* Check the checkpoint's generators against the model's modules: 1 when the module
 * generators are there and match (their states in rng[1..]), 0 for a checkpoint from
 * before they were saved, -1 plus a message when they belong to another model. */
static int check_generators(kiln_module *model, const cJSON *paths, int rng_n)
{
    if (!paths)
        return 0;
    int ng = kiln_module_generators(model, NULL, NULL, 0);
    const char **mine = calloc((size_t)ng + 1, sizeof *mine);
    if (!mine)
        return kiln__error_set("out of memory");
    kiln_module_generators(model, NULL, mine, ng);
    int rc = 1;
    if (!cJSON_IsArray(paths) || cJSON_GetArraySize(paths) != rng_n - 1)
        rc = kiln__error_set("metrics.json's \"generators\" does not match trainer.json's %d generators", rng_n);
    else if (cJSON_GetArraySize(paths) != ng)
        rc = kiln__error_set("the checkpoint holds the generators of %d modules, the model has %d modules",
                             cJSON_GetArraySize(paths), ng);
    for (int i = 0; rc == 1 && i < ng; i++) {
        const cJSON *p = cJSON_GetArrayItem(paths, i);
        if (!cJSON_IsString(p) || strcmp(p->valuestring, mine[i]) != 0)
            rc = kiln__error_set("generator %d belongs to module '%s' in the checkpoint, '%s' in the model", i + 1,
                                 cJSON_IsString(p) ? p->valuestring : "?", mine[i]);
    }
    free(mine);
    return rc;
}

/* The learner's notices go where its progress goes, else to stderr. */
static FILE *notice_stream(const kiln_learner *L)
{
    return L->cfg.progress ? L->cfg.progress : stderr;
}

/* A newer checkpoint that does not verify (a crash while it was written, a damaged file) is
 * passed over for an older one; a run that silently goes back that far would look like one
 * that lost its latest steps for no reason. */
static void report_skipped(const char *path, const char *why, void *ud)
{
    fprintf(notice_stream(ud), "kiln: learner_resume: passed over %s: %s\n", path, why);
}

/* The matrix saved by position_json into a new array of classes^2 counts; *out stays NULL
 * when there is nothing to restore: none saved (an older checkpoint), or one of another class
 * count than this learner keeps. 0, or -1 plus a message for cells that do not read. */
static int read_confusion(const kiln_learner *L, const cJSON *saved, int64_t **out)
{
    *out = NULL;
    int64_t c = L->cm.classes;
    const cJSON *cells = cJSON_GetObjectItemCaseSensitive(saved, "cells");
    if (!saved || !L->cm.counts ||
        cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(saved, "classes")) != (double)c)
        return 0;
    if (!cJSON_IsArray(cells))
        return kiln__error_set("metrics.json's \"confusion\" has no \"cells\" array");
    int64_t *counts = calloc((size_t)(c * c), sizeof *counts);
    if (!counts)
        return kiln__error_set("out of memory");
    const cJSON *cell;
    cJSON_ArrayForEach(cell, cells)
    {
        double v[3] = {-1, -1, -1};
        for (int k = 0; k < 3 && cJSON_GetArraySize(cell) == 3; k++)
            v[k] = cJSON_GetNumberValue(cJSON_GetArrayItem(cell, k));
        if (!(v[0] >= 0 && v[0] < (double)c && v[1] >= 0 && v[1] < (double)c && v[2] >= 0 && v[2] <= 0x1p53) ||
            v[0] != floor(v[0]) || v[1] != floor(v[1]) || v[2] != floor(v[2])) {
            free(counts);
            return kiln__error_set("metrics.json's \"confusion\" has a cell that is not [label, prediction, "
                                   "count] within %lld classes",
                                   (long long)c);
        }
        counts[(int64_t)v[0] * c + (int64_t)v[1]] = (int64_t)v[2];
    }
    *out = counts;
    return 0;
}

/* The latest epoch's metrics, as fit left them, from the restored history's last epoch (a
 * resumed run reports them until it completes an epoch of its own: a finished run resumed
 * has no other). The names point into L->history, which holds them until it is replaced, and
 * fit sets its own names before it adds to it; non-finite values were saved as null. */
static void restore_metrics(kiln_learner *L)
{
    L->nm = 0;
    const cJSON *last = cJSON_GetArrayItem(L->history, cJSON_GetArraySize(L->history) - 1);
    for (const cJSON *it = last ? last->child : NULL; it && L->nm < KILN__MAX_METRICS; it = it->next)
        if (cJSON_IsNumber(it) || cJSON_IsNull(it)) {
            L->mnames[L->nm] = it->string;
            L->mvals[L->nm++] = cJSON_IsNumber(it) ? it->valuedouble : NAN;
        }
}

int kiln_learner_resume(kiln_learner *L, const char *path)
{
    if (!L || !path)
        return kiln__error_set("learner_resume: NULL argument");
    kiln_ckpt *ck = kiln_ckpt_open(path);
    if (!ck) {
        char first[KILN_ERROR_MAX];
        snprintf(first, sizeof first, "%s", kiln_error());
        ck = kiln_ckpt_open_latest(path, report_skipped, L);
        if (!ck)
            return kiln__error_set("learner_resume: %s is neither a usable checkpoint (%s) nor a root with one (%s)",
                                   path, first, kiln_error());
    }
    int rc = -1, mn = 0, on = 0, rng_n = 0, has_gens = 0;
    char **mnames = NULL, **onames = NULL;
    kiln_tensor **mts = NULL, **ots = NULL;
    kiln_generator *rngs = NULL, **gens = NULL;
    int64_t *confusion = NULL;
    model_plan plan = {0};
    cJSON *pos = NULL;
    /* ---- read and check everything; nothing of the learner, model, optimizer or
     * scheduler changes until all of it passed */
    kiln_named_tensor first;
    kiln_device *dev = kiln_module_state_dict(L->model, &first, 1) > 0 ? kiln_tensor_device(first.tensor) : NULL;
    if (!dev) {
        kiln__error_set("learner_resume: the model has no tensors");
        goto done;
    }
    pos = cJSON_Parse(kiln_ckpt_metrics_history(ck));
    const cJSON *hist = cJSON_GetObjectItemCaseSensitive(pos, "history");
    const cJSON *part = cJSON_GetObjectItemCaseSensitive(pos, "partial");
    if (!cJSON_IsArray(hist) || !cJSON_IsObject(part)) {
        kiln__error_set("metrics.json lacks the learner's history and position");
        goto fail;
    }
    if (read_confusion(L, cJSON_GetObjectItemCaseSensitive(pos, "confusion"), &confusion) < 0)
        goto fail;
    /* The tensors first: a checkpoint of another model is best told by the first tensor that
     * differs, which the generator check below would only count modules for. */
    if (load_all(kiln_ckpt_model(ck), dev, &mn, &mnames, &mts) < 0 ||
        plan_model(L->model, mn, mnames, mts, &plan) < 0)
        goto fail;
    rng_n = kiln_ckpt_rng(ck, NULL, 0);
    rngs = calloc((size_t)(rng_n > 0 ? rng_n : 1), sizeof *rngs);
    if (!rngs) {
        kiln__error_set("out of memory");
        goto fail;
    }
    if (kiln_ckpt_rng(ck, rngs, rng_n) < 1) {
        kiln__error_set("no generator state");
        goto fail;
    }
    has_gens = check_generators(L->model, cJSON_GetObjectItemCaseSensitive(pos, "generators"), rng_n);
    if (has_gens < 0)
        goto fail;
    int ngen = has_gens ? rng_n - 1 : 0;
    gens = calloc((size_t)ngen + 1, sizeof *gens);
    if (!gens) {
        kiln__error_set("out of memory");
        goto fail;
    }
    kiln_module_generators(L->model, gens, NULL, ngen);
    if (load_all(kiln_ckpt_optimizer(ck), dev, &on, &onames, &ots) < 0)
        goto fail;
    const char *sj = L->sched ? kiln_ckpt_scheduler(ck) : NULL;
    bool has_sched = sj && strcmp(sj, "{}") != 0;
    if (has_sched && kiln_sched_state_check(L->sched, sj) < 0)
        goto fail;
    /* ---- apply. The optimizer's import checks its state (kind, names, shapes) and changes
     * nothing when that fails, so it goes first; what follows was checked above and can
     * fail only for lack of memory or a device error. */
    if (kiln_optim_state_import(L->opt, on, (const char *const *)onames, ots,
                                kiln_record_config(kiln_ckpt_optimizer(ck))) < 0)
        goto fail;
    if ((has_sched && kiln_sched_state_import(L->sched, sj) < 0) || write_model(&plan) < 0)
        goto fail;
    L->rng = rngs[0];
    for (int i = 0; i < ngen; i++)
        *gens[i] = rngs[i + 1];
    if (!has_gens) {
        /* An older checkpoint: the learner's generator only. The run goes on, but dropout
         * masks after the resume differ from the uninterrupted run's. */
        fprintf(notice_stream(L),
                "kiln: learner_resume: %s predates saved module generators; dropout after the resume "
                "will not repeat the original run's draws\n",
                kiln_ckpt_path(ck));
    }
    cJSON_Delete(L->history);
    L->history = cJSON_Duplicate(hist, true);
    L->epoch = kiln_ckpt_epoch(ck);
    L->step = kiln_ckpt_step(ck);
    L->batch_pos = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(pos, "batch"));
    L->part_loss = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(part, "loss"));
    L->part_n = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(part, "n"));
    L->part_correct = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(part, "correct"));
    if (!isfinite(L->part_loss))
        L->part_loss = 0;
    L->has_best = L->es_has = false;
    L->es_bad = 0;
    L->best_ckpt[0] = 0;
    const cJSON *ep;
    cJSON_ArrayForEach(ep, L->history) kiln__learner_track(L, ep);
    restore_metrics(L);
    if (confusion)
        memcpy(L->cm.counts, confusion, (size_t)(L->cm.classes * L->cm.classes) * sizeof *confusion);
    snprintf(L->last_ckpt, sizeof L->last_ckpt, "%s", kiln_ckpt_path(ck));
    rc = 0;
    goto done;
fail:;
    char msg[KILN_ERROR_MAX];
    snprintf(msg, sizeof msg, "%s", kiln_error());
    kiln__error_restate("learner_resume: %s: %s", kiln_ckpt_path(ck), msg);
done:
    cJSON_Delete(pos);
    plan_free(&plan);
    free(confusion);
    free(rngs);
    free(gens);
    if (mnames)
        free_all(mn, mnames, mts);
    if (onames)
        free_all(on, onames, ots);
    kiln_ckpt_close(ck);
    return rc;
}
