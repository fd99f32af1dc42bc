/*
 * scheduler/model.c — what a worker does with a model: build an instance from a repository
 * version, and run a batch through it.
 *
 * Formats: "kiln" — model.kiln, a kiln record whose config is the model's JSON spec
 * (kiln_model_from_json) and whose tensors are its state dict, loaded strictly by name.
 * "onnx" — model.onnx through kiln_onnx_load, run with kiln_onnx_run. config.json may leave out
 * the inputs and outputs of an ONNX model: the graph declares its inputs (a symbolic dim is -1),
 * and the outputs' datatypes and shapes come from dry runs on zeros at load (a dim that follows
 * the inputs' free dims is reported as -1); outputs it lists are checked against dry runs.
 *
 * Batching (either format, max_batch_size > 0): requests are concatenated along dim 0 and every
 * output is split back along dim 0, which is right only when each output's dim 0 is the batch.
 * The first instance's load checks it (kd_sched_check_batching): every input needs a free dim 0,
 * and for ONNX dry runs on zeros at two batch sizes must give every output a dim 0 of that size
 * and the same other dims (a kiln record's config.json must declare every output's dim 0 free).
 * A model that fails is served unbatched (max_batch_size 0, which the metadata and config
 * endpoints then report) with a warning naming the input or output and why: an output such as
 * x.mean(0) would otherwise hand every client the mean over everyone's rows.
 *
 * The dry runs, and the checks made with them, are model-checks.c's: the runs the batching check
 * makes, and one at batch 1, also give the outputs, so a model is run at most three times at load
 * and not at all by the loads of its other instances (four times when config.json leaves out
 * outputs and the inputs have free dims beside the batch).
 *
 * Either format may ship autotune.tsv beside the model file: kernel choices merged into the
 * autotune cache when the model loads (kiln_autotune_merge_file).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/autodiff.h"
#include "kiln/kiln.h"
#include "kiln/record.h"
#include "sched-impl.h"
#include "tensor-impl.h"

static const struct {
    const char *name;
    kiln_dtype dtype;
} datatypes[] = {
    {"FP32", KILN_F32}, {"FP64", KILN_F64}, {"FP16", KILN_F16}, {"BF16", KILN_BF16},
    {"INT64", KILN_I64}, {"INT32", KILN_I32}, {"UINT8", KILN_U8}, {"BOOL", KILN_BOOL},
};

int kd_sched_dtype_of(const char *datatype)
{
    for (size_t i = 0; datatype && i < sizeof datatypes / sizeof datatypes[0]; i++)
        if (strcmp(datatypes[i].name, datatype) == 0)
            return (int)datatypes[i].dtype;
    return -1;
}

const char *kd_sched_datatype_of(kiln_dtype dt)
{
    for (size_t i = 0; i < sizeof datatypes / sizeof datatypes[0]; i++)
        if (datatypes[i].dtype == dt)
            return datatypes[i].name;
    return NULL;
}

static int copy_specs(kd_model_tensor_spec **dst, const kd_model_tensor_spec *src, int n)
{
    *dst = calloc(n > 0 ? (size_t)n : 1, sizeof **dst);
    if (!*dst)
        return -1;
    for (int i = 0; i < n; i++)
        if (kd_model_tensor_spec_copy(&(*dst)[i], &src[i]) != 0)
            return -1;
    return 0;
}

int kd_sched_config_copy(kd_model_config *dst, const kd_model_config *src)
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
        kd_repository_config_free(dst);
        return -1;
    }
    return 0;
}

static int build_kiln(struct kd_sched_model *m, kiln_device *dev, kiln_module **out, char *why, size_t n)
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

/* Every output as model.onnx declares it (a type kilnd serves and a rank) into outs; false
 * when one is not declared so. */
static bool declared_outputs(kiln_onnx_model *g, kd_model_tensor_spec *outs)
{
    for (int o = 0; o < kiln_onnx_output_count(g); o++) {
        int nd = -1;
        int64_t shape[KILN_MAX_DIMS];
        int dt = kiln_onnx_output_info(g, o, &nd, shape);
        const char *datatype = dt >= 0 ? kd_sched_datatype_of((kiln_dtype)dt) : NULL;
        if (!datatype || nd < 0)
            return false;
        outs[o].name = (char *)kiln_onnx_output_name(g, o);
        outs[o].datatype = (char *)datatype;
        outs[o].ndim = nd;
        memcpy(outs[o].shape, shape, (size_t)nd * sizeof shape[0]);
    }
    return true;
}

/*
 * Builds an ONNX instance, filling the inputs and outputs config.json leaves out (the first
 * build) or checking the outputs it lists against dry runs. With check_batch (this build checks
 * whether the model batches) the verdict goes to unbatched: empty when it batches, else why not.
 */
static int build_onnx(struct kd_sched_model *m, kiln_device *dev, struct kd_sched_exec *e, bool check_batch,
                      char *unbatched, size_t un, char *why, size_t n)
{
    size_t len = strlen(m->path) + 16;
    char *file = malloc(len);
    if (!file) {
        snprintf(why, n, "out of memory");
        return -1;
    }
    snprintf(file, len, "%s/model.onnx", m->path);
    kiln_onnx_model *g = kiln_onnx_load(file, dev, NULL);
    free(file);
    if (!g) {
        snprintf(why, n, "model.onnx: %s", kiln_error());
        kiln_error_clear();
        return -1;
    }
    int gin = kiln_onnx_input_count(g), gout = kiln_onnx_output_count(g);
    if (gin > KD_SCHED_MAX_IO || gout > KD_SCHED_MAX_IO || gout < 1) {
        snprintf(why, n,
                 "model.onnx has %d inputs and %d outputs; kilnd serves 1..%d outputs and at most %d inputs", gin,
                 gout, KD_SCHED_MAX_IO, KD_SCHED_MAX_IO);
        kiln_onnx_free(g);
        return -1;
    }
    /* Another instance of the same version may be filling cfg on its own worker right now.
     * Inputs and outputs config.json lists never change after that (filled ones are the
     * graph's), so the listed outputs are checked without the lock. */
    pthread_mutex_lock(&m->sched->mu);
    bool need_out = m->cfg.noutputs == 0;
    bool check_out = !need_out && !m->outputs_checked;
    const kd_model_tensor_spec *cfg_in = m->cfg.inputs;
    int ncfg_in = m->cfg.ninputs;
    pthread_mutex_unlock(&m->sched->mu);
    kd_model_tensor_spec ins[KD_SCHED_MAX_IO] = {0}, outs[KD_SCHED_MAX_IO] = {0};
    int rc = kd_sched_onnx_inputs(g, cfg_in, ncfg_in, ins, why, n);
    /* One probe for the outputs and the batching check: each size of dry run is made once. */
    struct kd_sched_probe *probe = rc == 0 ? kd_sched_probe_new(g, dev, ins, gin, check_batch) : NULL;
    if (rc == 0 && !probe)
        rc = -1;
    if (rc == 0 && need_out) {
        rc = kd_sched_probe_outputs(probe, true, outs, why, n) < 0 ? -1 : 0;
        /* A graph the dry runs cannot run with its free dims at 1 and 2 (an exporter fixed a
         * sequence length inside a Reshape) still declares its outputs: they are taken as
         * declared, as if config.json listed them, and each run's datatypes are checked. */
        if (rc != 0 && probe && declared_outputs(g, outs)) {
            kd_sched_logf(m->sched, KD_LOG_WARN,
                          "model %s version %lld: %s; its outputs are taken as model.onnx declares them", m->name,
                          (long long)m->version, why);
            why[0] = '\0';
            rc = 0;
        }
    }
    if (rc == 0 && check_out)
        rc = kd_sched_probe_check_outputs(probe, &m->cfg, why, n);

    pthread_mutex_lock(&m->sched->mu);
    kd_model_config *c = &m->cfg;
    if (rc == 0 && c->ninputs == 0) {
        kd_model_tensor_spec *copy = NULL;
        rc = copy_specs(&copy, ins, gin);
        free(c->inputs); /* the empty array config_copy made */
        c->inputs = copy; /* free skips the zeroed entries a failed copy leaves */
        c->ninputs = rc == 0 ? gin : 0;
    }
    if (rc == 0 && c->noutputs == 0 && need_out) {
        kd_model_tensor_spec *copy = NULL;
        rc = copy_specs(&copy, outs, gout);
        free(c->outputs);
        c->outputs = copy;
        c->noutputs = rc == 0 ? gout : 0;
    }
    if (rc != 0 && !why[0])
        snprintf(why, n, "out of memory");
    /* Learned or checked once: the other instances run the same graph on the same device. */
    if (rc == 0 && (need_out || check_out))
        m->outputs_checked = true;
    /* config.json may name a subset of the outputs, in any order; the inputs must all be
     * there (kd_sched_onnx_inputs checked the ones it lists). */
    e->onnx_nout = gout;
    for (int o = 0; rc == 0 && o < c->noutputs; o++) {
        e->onnx_out[o] = -1;
        for (int k = 0; k < gout; k++)
            if (strcmp(kiln_onnx_output_name(g, k), c->outputs[o].name) == 0)
                e->onnx_out[o] = k;
        if (e->onnx_out[o] < 0) {
            snprintf(why, n, "config.json output '%.64s' is not an output of model.onnx", c->outputs[o].name);
            rc = -1;
        }
    }
    pthread_mutex_unlock(&m->sched->mu);
    /* cfg is complete now, and only this build changes max_batch_size (after the verdict) */
    if (rc == 0 && check_batch)
        kd_sched_check_batching(c, e, probe, unbatched, un);
    kd_sched_probe_free(probe);
    if (rc != 0) {
        kiln_onnx_free(g);
        return -1;
    }
    e->onnx = g;
    return 0;
}

/* Whether this build checks if m batches: the first one to ask, when config.json lets it batch. */
static bool claim_batching_check(struct kd_sched_model *m)
{
    pthread_mutex_lock(&m->sched->mu);
    bool mine = !m->batch_decided && m->cfg.max_batch_size > 0;
    m->batch_decided = true;
    pthread_mutex_unlock(&m->sched->mu);
    return mine;
}

/* A model that cannot batch (why) is served unbatched, with a warning. The load completes only
 * after every instance's build, so no request sees max_batch_size before the decision. */
static void serve_unbatched(struct kd_sched_model *m, const char *why)
{
    pthread_mutex_lock(&m->sched->mu);
    int asked = m->cfg.max_batch_size;
    m->cfg.max_batch_size = 0;
    pthread_mutex_unlock(&m->sched->mu);
    kd_sched_logf(m->sched, KD_LOG_WARN,
                  "model %s version %lld is served unbatched (max_batch_size %d in config.json taken as 0; "
                  "requests run one at a time): %s",
                  m->name, (long long)m->version, asked, why);
}

int kd_sched_build(struct kd_sched_model *m, kiln_device *dev, struct kd_sched_exec *out, char *why, size_t n)
{
    if (m->cfg.ninputs > KD_SCHED_MAX_IO || m->cfg.noutputs > KD_SCHED_MAX_IO) {
        snprintf(why, n, "more than %d inputs or outputs", KD_SCHED_MAX_IO);
        return -1;
    }
    /* A warmed autotune file shipped beside the model: its kernel choices (timed on the
     * machine it was made on) are taken where this one has none of its own. A corrupt or
     * stale file never stops the load: it is ignored with a warning in kilnd's log. */
    size_t tlen = strlen(m->path) + 16;
    char *tune = malloc(tlen);
    if (tune) {
        snprintf(tune, tlen, "%s/autotune.tsv", m->path);
        if (kiln_autotune_merge_file(tune) < 0)
            kd_sched_logf(m->sched, KD_LOG_WARN,
                          "model %s version %lld: the kernel choices shipped with it are not used: %s", m->name,
                          (long long)m->version, kiln_error());
        free(tune);
    }
    /* Claimed before the build: an ONNX build makes its dry runs at the check's sizes. */
    bool check_batch = claim_batching_check(m);
    char unbatched[400] = "";
    bool onnx = m->format && strcmp(m->format, "onnx") == 0;
    int rc = onnx ? build_onnx(m, dev, out, check_batch, unbatched, sizeof unbatched, why, n)
                  : build_kiln(m, dev, &out->module, why, n);
    if (rc == 0 && check_batch && !onnx)
        kd_sched_check_batching(&m->cfg, out, NULL, unbatched, sizeof unbatched);
    if (rc == 0 && unbatched[0])
        serve_unbatched(m, unbatched);
    return rc;
}

void kd_sched_unbuild(struct kd_sched_exec *e)
{
    kiln_module_free(e->module);
    kiln_onnx_free(e->onnx);
    memset(e, 0, sizeof *e);
}

/*
 * The class of a failure that came without a code, by the engine's words for it. Most of the
 * engine's messages are set without a code still (a host allocation deep in an op, a check of
 * its arguments), and a remote device relays a failure on its server in the server's words,
 * since the engine's code does not travel over the wire: those words name memory or a limit
 * as the code would. One buffer past a limit (the address space, vulkan's largest storage
 * buffer, what a remote server lets a session hold) comes first: its message says "cannot
 * allocate" too.
 */
static enum kd_sched_fault fault_of_text(const char *msg)
{
    static const char *const too_large[] = {"exceeds the device's maxStorageBufferRange",
                                            "is more than the server lets a session hold", "too large to address"};
    static const char *const memory[] = {"cannot allocate", "out of memory", "out of device memory",
                                         "out of host memory"};
    for (size_t i = 0; i < sizeof too_large / sizeof too_large[0]; i++)
        if (strstr(msg, too_large[i]))
            return KD_SCHED_FAULT_TOO_LARGE;
    for (size_t i = 0; i < sizeof memory / sizeof memory[0]; i++)
        if (strstr(msg, memory[i]))
            return KD_SCHED_FAULT_MEMORY;
    return strstr(msg, ") does not support ") ? KD_SCHED_FAULT_INTERNAL : KD_SCHED_FAULT_INPUT;
}

/*
 * Memory that ran out may free up; one buffer past a limit of the device is the request's size,
 * which a smaller batch avoids; a backend without the op, a device that failed (one that was lost
 * is answered before the fault is read) and a connection or file that failed are the server's;
 * an argument the engine refused is the request's.
 */
enum kd_sched_fault kd_sched_fault_of(int code, const char *msg)
{
    switch (code) {
    case KILN_ENOMEM: return KD_SCHED_FAULT_MEMORY;
    case KILN_ETOOLARGE: return KD_SCHED_FAULT_TOO_LARGE;
    case KILN_ENOTSUP:
    case KILN_EDEVICE:
    case KILN_EIO: return KD_SCHED_FAULT_INTERNAL;
    case KILN_EINVAL: return KD_SCHED_FAULT_INPUT;
    default: return fault_of_text(msg ? msg : "");
    }
}

static void fail_all(struct kd_sched_request **reqs, int n, enum kd_sched_fault fault, const char *fmt,
                     const char *detail)
{
    for (int i = 0; i < n; i++) {
        reqs[i]->outcome = KD_SCHED_FAILED;
        reqs[i]->fault = fault;
        snprintf(reqs[i]->error, sizeof reqs[i]->error, fmt, detail);
        for (int o = 0; o < reqs[i]->noutputs; o++) {
            free(reqs[i]->outputs[o].data);
            reqs[i]->outputs[o].data = NULL;
        }
        reqs[i]->noutputs = 0;
    }
}

/* Copies rows [off, off+len) of t (or all of t when !batched) into r's output o. */
static int take_output(struct kd_sched_request *r, int o, kiln_tensor *t, bool batched, int64_t off, int64_t len)
{
    /* The narrow view is scoped (the run's scope frees it); the whole tensor is used as it is. */
    kiln_tensor *v = batched ? kiln_narrow(t, 0, off, len) : t;
    if (!v)
        return -1;
    struct kd_sched_tensor *dst = &r->outputs[o];
    dst->dtype = kiln_tensor_dtype(v);
    dst->ndim = kiln_tensor_ndim(v);
    memcpy(dst->shape, kiln_tensor_shape(v), (size_t)dst->ndim * sizeof dst->shape[0]);
    dst->nbytes = (size_t)kiln_tensor_numel(v) * kiln_dtype_size(dst->dtype);
    dst->data = malloc(dst->nbytes ? dst->nbytes : 1);
    int rc = dst->data ? kiln_to_data(v, dst->data, dst->nbytes) : -2;
    r->noutputs = o + 1;
    return rc;
}

/* Runs the instance on in (the configured inputs, in order): out gets the configured outputs, and
 * owned the references the caller must release (ONNX outputs are not scoped). Outputs or -1. */
static int forward(const kd_model_config *c, struct kd_sched_exec *e, kiln_tensor **in, kiln_tensor **out,
                   kiln_tensor **owned)
{
    if (e->module)
        return kiln_module_forward_n(e->module, c->ninputs, in, KD_SCHED_MAX_IO, out);
    const char *names[KD_SCHED_MAX_IO];
    for (int i = 0; i < c->ninputs; i++)
        names[i] = c->inputs[i].name;
    if (kiln_onnx_run(e->onnx, c->ninputs, names, in, e->onnx_nout, owned) != 0)
        return -1;
    for (int o = 0; o < c->noutputs; o++)
        out[o] = owned[e->onnx_out[o]];
    return c->noutputs;
}

static void release_all(kiln_tensor **ts, int n)
{
    for (int i = 0; i < n; i++) {
        kiln_tensor_release(ts[i]);
        ts[i] = NULL;
    }
}

void kd_sched_run(struct kd_sched_model *m, struct kd_sched_exec *e, kiln_device *dev,
                  struct kd_sched_request **reqs, int n, int64_t rows)
{
    const kd_model_config *c = &m->cfg;
    bool batched = c->max_batch_size > 0;
    if (batched && rows > c->max_batch_size) {
        fail_all(reqs, n, KD_SCHED_FAULT_INPUT, "batch of %s rows exceeds max_batch_size", "too many");
        return;
    }
    kiln_no_grad_begin();
    kiln_scope_begin();
    kiln_tensor *in[KD_SCHED_MAX_IO] = {0};
    kiln_tensor *owned[KD_SCHED_MAX_IO] = {0};
    kiln_tensor *parts[256];
    const char *failed = NULL;
    for (int i = 0; i < c->ninputs && !failed; i++) {
        int want = kd_sched_dtype_of(c->inputs[i].datatype);
        for (int k = 0; k < n && !failed; k++) {
            const struct kd_sched_tensor *t = &reqs[k]->inputs[i];
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
    kiln_tensor *out[KD_SCHED_MAX_IO] = {0};
    char detail[200] = "";
    enum kd_sched_fault fault = KD_SCHED_FAULT_INPUT; /* when detail says why; else from the message */
    int nout = failed ? -1 : forward(c, e, in, out, owned);
    if (!failed && nout < 0)
        failed = "model";
    if (!failed && nout < c->noutputs) {
        kiln_scope_end();
        kiln_no_grad_end();
        release_all(owned, KD_SCHED_MAX_IO);
        fail_all(reqs, n, KD_SCHED_FAULT_INTERNAL, "the model produced fewer outputs than config.json declares%s",
                 "");
        return;
    }
    /* One request takes its outputs whole; several split them along dim 0. The load checked that
     * the model's outputs follow the batch, but an output whose size depends on the data can
     * still miss it: the requests were fine, so each then runs alone rather than failing. */
    bool split = batched && n > 1;
    for (int o = 0; split && !failed && o < c->noutputs; o++) {
        if (!out[o] || (kiln_tensor_ndim(out[o]) >= 1 && kiln_tensor_dim(out[o], 0) == rows))
            continue;
        if (!atomic_exchange(&m->split_warned, true)) {
            char sh[160];
            kd_sched_logf(m->sched, KD_LOG_WARN,
                          "model %s version %lld: output '%s' has shape %s for a batch of %lld rows, which "
                          "does not split along dim 0; such batches run one request at a time",
                          m->name, (long long)m->version, c->outputs[o].name,
                          kiln__shape_str(kiln_tensor_ndim(out[o]), kiln_tensor_shape(out[o]), sh, sizeof sh),
                          (long long)rows);
        }
        kiln_scope_end();
        kiln_no_grad_end();
        release_all(owned, KD_SCHED_MAX_IO);
        for (int k = 0; k < n; k++)
            kd_sched_run(m, e, dev, &reqs[k], 1, kd_sched_rows_of(m, reqs[k]));
        return;
    }
    for (int o = 0; o < c->noutputs && !failed; o++) {
        /* never a cast: logits cast to INT32 would answer zeros as if they were results */
        int want = kd_sched_dtype_of(c->outputs[o].datatype);
        if (out[o] && want >= 0 && kiln_tensor_dtype(out[o]) != (kiln_dtype)want) {
            const char *gives = kd_sched_datatype_of(kiln_tensor_dtype(out[o]));
            snprintf(detail, sizeof detail, "the model gives %s for output '%.64s'; config.json declares %s",
                     gives ? gives : kiln_dtype_name(kiln_tensor_dtype(out[o])), c->outputs[o].name,
                     c->outputs[o].datatype);
            fault = KD_SCHED_FAULT_INTERNAL; /* the model's files disagree, not the request */
            failed = "output";
            break;
        }
        if (!out[o]) {
            snprintf(detail, sizeof detail, "the model gave no tensor for output '%.64s'", c->outputs[o].name);
            fault = KD_SCHED_FAULT_INTERNAL;
            failed = "output";
            break;
        }
        int64_t off = 0;
        for (int k = 0; k < n && !failed; k++) {
            int64_t b = split ? reqs[k]->inputs[0].shape[0] : 0;
            int rc = take_output(reqs[k], o, out[o], split, off, b);
            if (rc == -2) {
                snprintf(detail, sizeof detail, "out of host memory for output '%.64s' (%zu bytes)",
                         c->outputs[o].name, reqs[k]->outputs[o].nbytes);
                fault = KD_SCHED_FAULT_MEMORY;
            }
            if (rc != 0)
                failed = "output";
            off += b;
        }
    }
    if (failed) {
        /* the engine's message whole (KILN_ERROR_MAX, 512), and room for "output failed: " before
         * it in the request's error: a cut one hid which limit a buffer passed */
        char msg[sizeof reqs[0]->error - 32];
        snprintf(msg, sizeof msg, "%s",
                 detail[0]         ? detail
                 : kiln_error()[0] ? kiln_error()
                                   : "the model gave no tensor for an output");
        if (!detail[0])
            fault = kiln_error()[0] ? kd_sched_fault_of(kiln_error_code(), msg) : KD_SCHED_FAULT_INTERNAL;
        kiln_scope_end();
        kiln_no_grad_end();
        release_all(owned, KD_SCHED_MAX_IO);
        for (int i = 0; i < n; i++) {
            reqs[i]->outcome = KD_SCHED_FAILED;
            reqs[i]->fault = fault;
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
    release_all(owned, KD_SCHED_MAX_IO);
}
