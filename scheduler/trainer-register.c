/*
 * scheduler/trainer-register.c — a trained model into the repository as its next version:
 * model.kiln (the spec as the record's config, the state dict as its tensors), a config.json
 * the serving scheduler reads, labels.txt where the data's classes have names, and a source.json
 * naming the run, staged in a scratch folder and added in one step.
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

#include "kiln/data.h"
#include "kiln/loss.h"
#include "kiln/nn.h"
#include "kiln/record.h"
#include "kiln/train.h"
#include "repository.h"
#include "trainer-impl.h"

#define LABELS_FILE "labels.txt"

static int write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    int rc = fputs(text, f) < 0 ? -1 : 0;
    if (fclose(f) != 0)
        rc = -1;
    return rc;
}

/* The served model's config.json: one input shaped like an item, one output of class logits
 * (width of them: the model's, which may be wider than the data's classes), naming labels.txt
 * when there is one. */
static char *serving_config(const struct kd_jobspec *s, const kiln_dataset_info *info, int64_t width, bool labels)
{
    cJSON *spec = cJSON_Parse(s->model_json);
    const cJSON *in = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(spec, "inputs"), 0), *out = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(spec, "outputs"), 0);
    cJSON *c = cJSON_CreateObject();
    cJSON *ins = cJSON_AddArrayToObject(c, "inputs"), *outs = cJSON_AddArrayToObject(c, "outputs");
    cJSON *i0 = cJSON_CreateObject(), *o0 = cJSON_CreateObject();
    cJSON_AddStringToObject(i0, "name", cJSON_IsString(in) ? in->valuestring : "x");
    cJSON_AddStringToObject(i0, "datatype", "FP32");
    cJSON *shape = cJSON_AddArrayToObject(i0, "shape");
    cJSON_AddItemToArray(shape, cJSON_CreateNumber(-1));
    for (int d = 0; d < info->ndim; d++)
        cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)info->shape[d]));
    cJSON_AddStringToObject(o0, "name", cJSON_IsString(out) ? out->valuestring : "logits");
    cJSON_AddStringToObject(o0, "datatype", "FP32");
    shape = cJSON_AddArrayToObject(o0, "shape");
    cJSON_AddItemToArray(shape, cJSON_CreateNumber(-1));
    cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)width));
    if (labels)
        cJSON_AddStringToObject(o0, "label_filename", LABELS_FILE);
    cJSON_AddItemToArray(ins, i0);
    cJSON_AddItemToArray(outs, o0);
    cJSON_AddNumberToObject(c, "max_batch_size", s->max_batch_size);
    cJSON_AddStringToObject(c, "device", s->device);
    char *text = cJSON_Print(c);
    cJSON_Delete(c);
    cJSON_Delete(spec);
    return text;
}

/* labels.txt: the name of each class index the model answers, a line each (a class the data
 * names none for, or a model wider than the data's classes, gets an empty line: no label). A
 * line break inside a name would shift every later class, so it becomes a space. 0, or -1. */
static int write_labels(const char *path, const kiln_dataset *train, int64_t width)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    for (int64_t c = 0; c < width; c++) {
        const char *name = kiln_dataset_class_name(train, c);
        for (const char *p = name ? name : ""; *p; p++)
            fputc(*p == '\n' || *p == '\r' ? ' ' : *p, f);
        fputc('\n', f);
    }
    int rc = ferror(f) ? -1 : 0;
    if (fclose(f) != 0)
        rc = -1;
    return rc;
}

/* The config.json of a fine-tuned ONNX graph: the serving loader reads the inputs and outputs
 * from the graph itself, so only what the job decides is written. */
static char *onnx_config(const struct kd_jobspec *s)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "max_batch_size", s->max_batch_size);
    cJSON_AddStringToObject(c, "device", s->device);
    char *text = cJSON_Print(c);
    cJSON_Delete(c);
    return text;
}

/* model.kiln: the spec as the record's config, the state dict as its tensors. */
static int save_kiln(const char *path, kiln_module *model, const struct kd_jobspec *s, char *err, size_t errlen)
{
    int n = kiln_module_state_dict(model, NULL, 0);
    kiln_named_tensor *nt = calloc((size_t)(n > 0 ? n : 1), sizeof *nt);
    const char **names = calloc((size_t)(n > 0 ? n : 1), sizeof *names);
    kiln_tensor **ts = calloc((size_t)(n > 0 ? n : 1), sizeof *ts);
    int rc = nt && names && ts ? 0 : -1;
    if (rc == 0) {
        kiln_module_state_dict(model, nt, n);
        for (int i = 0; i < n; i++) {
            names[i] = nt[i].name;
            ts[i] = nt[i].tensor;
        }
        rc = kiln_record_save(path, n, names, ts, s->model_json, 0);
    }
    free(nt);
    free(names);
    free(ts);
    if (rc != 0)
        snprintf(err, errlen, "saving the model: %s", kiln_error());
    return rc;
}

/* source.json: who made the version and the metrics it ended with (kiln/repository.h). */
static char *source_json(const char *source, const char *metrics_json)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "source", source);
    cJSON *m = metrics_json ? cJSON_Parse(metrics_json) : NULL;
    cJSON_AddItemToObject(o, "metrics", m ? m : cJSON_CreateObject());
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

/* model.kiln (or, for a fine-tuned ONNX graph, model.onnx), config.json and source.json staged
 * in scratch, then added to the repository as its next version. */
int kd_trainer_register(const struct kd_trainer_run *run, kiln_module *model, const kiln_dataset *train,
                        const kiln_dataset_info *info, int64_t width, struct kd_trainer_result *res)
{
    const struct kd_jobspec *s = run->spec;
    mkdir(run->scratch_dir, 0777);
    char mpath[PATH_MAX], cpath[PATH_MAX];
    snprintf(mpath, sizeof mpath, "%s/%s", run->scratch_dir, s->model_onnx ? "model.onnx" : "model.kiln");
    snprintf(cpath, sizeof cpath, "%s/config.json", run->scratch_dir);
    int rc = s->model_onnx ? kd_trainer_onnx_write(model, s->model_onnx, mpath, res->error, sizeof res->error)
                           : save_kiln(mpath, model, s, res->error, sizeof res->error);
    /* a fine-tuned ONNX graph's config lists no outputs (the loader reads them from the graph),
     * so its classes' names stay in the job's log only */
    bool labels = !s->model_onnx && kiln_dataset_class_name(train, 0) != NULL;
    char lpath[PATH_MAX];
    snprintf(lpath, sizeof lpath, "%s/" LABELS_FILE, run->scratch_dir);
    if (rc == 0 && labels && write_labels(lpath, train, width) != 0) {
        snprintf(res->error, sizeof res->error, "writing %.300s: %.100s", lpath, strerror(errno));
        rc = -1;
    }
    char *cfg = rc == 0 ? (s->model_onnx ? onnx_config(s) : serving_config(s, info, width, labels)) : NULL;
    if (rc == 0 && (!cfg || write_text(cpath, cfg) != 0)) {
        snprintf(res->error, sizeof res->error, "writing %.300s: %.100s", cpath, strerror(errno));
        rc = -1;
    }
    free(cfg);
    char spath[PATH_MAX];
    snprintf(spath, sizeof spath, "%s/" KD_REPOSITORY_SOURCE_FILE, run->scratch_dir);
    if (rc == 0 && run->source) {
        char *src = source_json(run->source, res->metrics_json);
        if (!src || write_text(spath, src) != 0) {
            snprintf(res->error, sizeof res->error, "writing %.300s: %.100s", spath, src ? strerror(errno) : "out of memory");
            rc = -1;
        }
        cJSON_free(src);
    }
    int64_t version = 0;
    if (rc == 0) {
        kd_repository *repo = kd_repository_open(run->models_root);
        rc = repo ? kd_repository_add_version_above(repo, s->register_as, run->scratch_dir, run->version_floor,
                                                    &version)
                  : -1;
        if (rc != 0)
            snprintf(res->error, sizeof res->error, "adding the model to the repository: %s", kiln_error());
        kd_repository_close(repo);
    }
    unlink(mpath);
    unlink(cpath);
    unlink(lpath);
    unlink(spath);
    rmdir(run->scratch_dir);
    res->version = rc == 0 ? version : 0;
    return rc == 0 ? 0 : -1;
}
