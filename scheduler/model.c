/*
 * scheduler/model.c — what a worker does with a model: build an instance from a repository
 * version, and run a batch through it.
 *
 * Formats: "kiln" — model.kiln, a kiln record whose config is the model's JSON spec
 * (kiln_model_from_json) and whose tensors are its state dict, loaded strictly by name.
 * "onnx" versions are recognised by the repository; their runtime (kiln/onnx.h) is not part
 * of libkiln yet, so building one fails with a reason the repository index shows. Adding it
 * means one more branch in kiln__sched_build that yields a kiln_module (or a run function).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/autodiff.h"
#include "kiln/record.h"
#include "sched-impl.h"

static const struct {
    const char *name;
    kiln_dtype dtype;
} datatypes[] = {
    {"FP32", KILN_F32}, {"FP64", KILN_F64}, {"FP16", KILN_F16}, {"BF16", KILN_BF16},
    {"INT64", KILN_I64}, {"INT32", KILN_I32}, {"UINT8", KILN_U8}, {"BOOL", KILN_BOOL},
};

int kiln_sched_dtype_of(const char *datatype)
{
    for (size_t i = 0; datatype && i < sizeof datatypes / sizeof datatypes[0]; i++)
        if (strcmp(datatypes[i].name, datatype) == 0)
            return (int)datatypes[i].dtype;
    return -1;
}

static int copy_specs(kiln_model_tensor_spec **dst, const kiln_model_tensor_spec *src, int n)
{
    *dst = calloc(n > 0 ? (size_t)n : 1, sizeof **dst);
    if (!*dst)
        return -1;
    for (int i = 0; i < n; i++) {
        (*dst)[i] = src[i];
        (*dst)[i].name = strdup(src[i].name ? src[i].name : "");
        (*dst)[i].datatype = strdup(src[i].datatype ? src[i].datatype : "");
        if (!(*dst)[i].name || !(*dst)[i].datatype)
            return -1;
    }
    return 0;
}

void kiln__sched_config_free(kiln_model_config *c)
{
    for (int i = 0; c->inputs && i < c->ninputs; i++) {
        free(c->inputs[i].name);
        free(c->inputs[i].datatype);
    }
    for (int i = 0; c->outputs && i < c->noutputs; i++) {
        free(c->outputs[i].name);
        free(c->outputs[i].datatype);
    }
    free(c->inputs);
    free(c->outputs);
    free(c->device);
    free(c->specific);
    memset(c, 0, sizeof *c);
}

int kiln__sched_config_copy(kiln_model_config *dst, const kiln_model_config *src)
{
    *dst = *src;
    dst->inputs = dst->outputs = NULL;
    dst->specific = NULL;
    dst->device = strdup(src->device ? src->device : "cpu");
    int rc = dst->device ? 0 : -1;
    if (rc == 0)
        rc = copy_specs(&dst->inputs, src->inputs, src->ninputs);
    if (rc == 0)
        rc = copy_specs(&dst->outputs, src->outputs, src->noutputs);
    if (rc != 0) {
        /* copy_specs leaves zeroed entries behind a failure, which free skips. */
        kiln__sched_config_free(dst);
        return -1;
    }
    return 0;
}

static int build_kiln(struct kiln_sched_model *m, kiln_device *dev, kiln_module **out, char *why, size_t n)
{
    size_t len = strlen(m->path) + 16;
    char *file = malloc(len);
    if (!file) {
        snprintf(why, n, "out of memory");
        return -1;
    }
    snprintf(file, len, "%s/model.kiln", m->path);
    kiln_record *rec = kiln_record_open(file);
    free(file);
    if (!rec) {
        snprintf(why, n, "model.kiln: %s", kiln_error());
        return -1;
    }
    kiln_module *mod = kiln_model_from_json(kiln_record_config(rec), dev, NULL);
    if (!mod) {
        snprintf(why, n, "model.kiln spec: %s", kiln_error());
        kiln_record_close(rec);
        return -1;
    }
    const kiln_safetensors *st = kiln_record_tensors(rec);
    int count = kiln_safetensors_count(st);
    const char **names = calloc(count > 0 ? (size_t)count : 1, sizeof *names);
    kiln_tensor **ts = calloc(count > 0 ? (size_t)count : 1, sizeof *ts);
    int rc = names && ts ? 0 : -1;
    for (int i = 0; rc == 0 && i < count; i++) {
        names[i] = kiln_safetensors_name(st, i);
        ts[i] = kiln_safetensors_load(st, names[i], dev);
        if (!ts[i])
            rc = -1;
    }
    kiln_load_report rep;
    if (rc == 0)
        rc = kiln_module_load_state_dict(mod, count, names, ts, true, &rep);
    if (rc != 0)
        snprintf(why, n, "model.kiln weights: %s", kiln_error());
    for (int i = 0; ts && i < count; i++)
        kiln_tensor_release(ts[i]);
    free(names);
    free(ts);
    kiln_record_close(rec);
    if (rc != 0) {
        kiln_module_free(mod);
        return -1;
    }
    kiln_module_train(mod, false);
    *out = mod;
    return 0;
}

int kiln__sched_build(struct kiln_sched_model *m, kiln_device *dev, kiln_module **out, char *why, size_t n)
{
    if (m->cfg.ninputs > KILN_SCHED_MAX_IO || m->cfg.noutputs > KILN_SCHED_MAX_IO) {
        snprintf(why, n, "more than %d inputs or outputs", KILN_SCHED_MAX_IO);
        return -1;
    }
    size_t len = strlen(m->path) + 16;
    char *file = malloc(len);
    if (!file) {
        snprintf(why, n, "out of memory");
        return -1;
    }
    snprintf(file, len, "%s/model.kiln", m->path);
    FILE *f = fopen(file, "rb");
    free(file);
    if (f) {
        fclose(f);
        return build_kiln(m, dev, out, why, n);
    }
    snprintf(why, n, "no model.kiln in version %lld (ONNX models are not served by this build yet)",
             (long long)m->version);
    return -1;
}

static void fail_all(struct kiln_sched_request **reqs, int n, const char *fmt, const char *detail)
{
    for (int i = 0; i < n; i++) {
        reqs[i]->outcome = KILN_SCHED_FAILED;
        snprintf(reqs[i]->error, sizeof reqs[i]->error, fmt, detail);
        for (int o = 0; o < reqs[i]->noutputs; o++) {
            free(reqs[i]->outputs[o].data);
            reqs[i]->outputs[o].data = NULL;
        }
        reqs[i]->noutputs = 0;
    }
}

/* Copies rows [off, off+len) of t (or all of t when !batched) into r's output o. */
static int take_output(struct kiln_sched_request *r, int o, kiln_tensor *t, bool batched, int64_t off, int64_t len)
{
    kiln_tensor *v = batched ? kiln_narrow(t, 0, off, len) : kiln_tensor_retain(t);
    if (!v)
        return -1;
    struct kiln_sched_tensor *dst = &r->outputs[o];
    dst->dtype = kiln_tensor_dtype(v);
    dst->ndim = kiln_tensor_ndim(v);
    memcpy(dst->shape, kiln_tensor_shape(v), (size_t)dst->ndim * sizeof dst->shape[0]);
    dst->nbytes = (size_t)kiln_tensor_numel(v) * kiln_dtype_size(dst->dtype);
    dst->data = malloc(dst->nbytes ? dst->nbytes : 1);
    int rc = dst->data ? kiln_to_data(v, dst->data, dst->nbytes) : -1;
    r->noutputs = o + 1;
    return rc;
}

void kiln__sched_run(struct kiln_sched_model *m, kiln_module *module, kiln_device *dev,
                     struct kiln_sched_request **reqs, int n, int64_t rows)
{
    const kiln_model_config *c = &m->cfg;
    bool batched = c->max_batch_size > 0;
    if (batched && rows > c->max_batch_size) {
        fail_all(reqs, n, "batch of %s rows exceeds max_batch_size", "too many");
        return;
    }
    kiln_no_grad_begin();
    kiln_scope_begin();
    kiln_tensor *in[KILN_SCHED_MAX_IO] = {0};
    kiln_tensor *parts[256];
    const char *failed = NULL;
    for (int i = 0; i < c->ninputs && !failed; i++) {
        int want = kiln_sched_dtype_of(c->inputs[i].datatype);
        for (int k = 0; k < n && !failed; k++) {
            const struct kiln_sched_tensor *t = &reqs[k]->inputs[i];
            parts[k] = kiln_from_data(dev, t->dtype, t->ndim, t->shape, t->data, t->nbytes);
            if (parts[k] && want >= 0 && (int)t->dtype != want)
                parts[k] = kiln_cast(parts[k], (kiln_dtype)want);
            if (!parts[k])
                failed = "input";
        }
        if (!failed)
            in[i] = n == 1 ? parts[0] : kiln_cat(parts, n, 0);
        if (!in[i])
            failed = "input";
    }
    kiln_tensor *out[KILN_SCHED_MAX_IO] = {0};
    int nout = failed ? -1 : kiln_module_forward_n(module, c->ninputs, in, KILN_SCHED_MAX_IO, out);
    if (!failed && nout < 0)
        failed = "model";
    if (!failed && nout < c->noutputs) {
        kiln_scope_end();
        kiln_no_grad_end();
        fail_all(reqs, n, "the model produced fewer outputs than config.json declares%s", "");
        return;
    }
    for (int o = 0; o < c->noutputs && !failed; o++) {
        int want = kiln_sched_dtype_of(c->outputs[o].datatype);
        if (want >= 0 && kiln_tensor_dtype(out[o]) != (kiln_dtype)want)
            out[o] = kiln_cast(out[o], (kiln_dtype)want);
        if (!out[o] || (batched && (kiln_tensor_ndim(out[o]) < 1 || kiln_tensor_dim(out[o], 0) != rows))) {
            failed = "output";
            break;
        }
        int64_t off = 0;
        for (int k = 0; k < n && !failed; k++) {
            int64_t b = batched ? reqs[k]->inputs[0].shape[0] : 0;
            if (take_output(reqs[k], o, out[o], batched, off, b) != 0)
                failed = "output";
            off += b;
        }
    }
    if (failed) {
        char msg[200];
        snprintf(msg, sizeof msg, "%s", kiln_error()[0] ? kiln_error() : "outputs do not split along the batch");
        kiln_scope_end();
        kiln_no_grad_end();
        for (int i = 0; i < n; i++) {
            reqs[i]->outcome = KILN_SCHED_FAILED;
            snprintf(reqs[i]->error, sizeof reqs[i]->error, "%s failed: %s", failed, msg);
            for (int o = 0; o < reqs[i]->noutputs; o++) {
                free(reqs[i]->outputs[o].data);
                reqs[i]->outputs[o].data = NULL;
            }
            reqs[i]->noutputs = 0;
        }
        kiln_error_clear();
        return;
    }
    kiln_scope_end();
    kiln_no_grad_end();
}
