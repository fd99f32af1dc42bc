/*
 * scheduler/model.c — what a worker does with a model: build an instance from a repository
 * version, and run a batch through it.
 *
 * Formats: "kiln" — model.kiln, a kiln record whose config is the model's JSON spec
 * (kiln_model_from_json) and whose tensors are its state dict, loaded strictly by name.
 * "onnx" — model.onnx through kiln_onnx_load, run with kiln_onnx_run. config.json may leave out
 * the inputs and outputs of an ONNX model: the graph declares its inputs (a symbolic dim is -1),
 * and the outputs' datatypes and shapes come from two dry runs at load with the symbolic dims set
 * to 1 and then 2 (a dim that follows them is reported as -1).
 *
 * Batching (either format, max_batch_size > 0): requests are concatenated along dim 0 and every
 * output is split back along dim 0, which is right only when each output's dim 0 is the batch.
 * The first instance's load checks it (check_batching): every input needs a free dim 0, and for
 * ONNX dry runs on zeros at two batch sizes must give every output a dim 0 of that size and the
 * same other dims (a kiln record's config.json must declare every output's dim 0 free). A model that fails is served unbatched (max_batch_size 0, which the metadata and config
 * endpoints then report) with a warning naming the input or output and why: an output such as
 * x.mean(0) would otherwise hand every client the mean over everyone's rows.
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

static const char *datatype_of(kiln_dtype dt)
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
    for (int i = 0; i < n; i++) {
        (*dst)[i] = src[i];
        (*dst)[i].name = strdup(src[i].name ? src[i].name : "");
        (*dst)[i].datatype = strdup(src[i].datatype ? src[i].datatype : "");
        if (!(*dst)[i].name || !(*dst)[i].datatype)
            return -1;
    }
    return 0;
}

void kd_sched_config_free(kd_model_config *c)
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
        kd_sched_config_free(dst);
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

/*
 * Check a config.json input against what the graph declares for it: the same datatype and
 * rank, and every dim the graph fixes given that size (config.json may fix a symbolic dim,
 * never widen a fixed one: requests of its advertised shape would then fail inside the
 * model, and the client would be blamed). A graph input with no declared type or rank takes
 * config.json's word. 0, or -1 with why.
 */
static int check_input(kiln_onnx_model *g, int k, const kd_model_tensor_spec *want, char *why, size_t n)
{
    int nd = -1;
    int64_t shape[KILN_MAX_DIMS];
    int dt = kiln_onnx_input_info(g, k, &nd, shape);
    const char *declared = dt < 0 ? NULL : datatype_of((kiln_dtype)dt);
    if (declared && strcmp(declared, want->datatype) != 0) {
        snprintf(why, n, "config.json input '%.64s' is %s; model.onnx takes %s", want->name, want->datatype,
                 declared);
        return -1;
    }
    bool fits = nd < 0 || nd == want->ndim;
    for (int d = 0; fits && nd >= 0 && d < nd; d++)
        fits = shape[d] < 0 || shape[d] == want->shape[d];
    if (!fits) {
        char a[160], b[160];
        snprintf(why, n, "config.json input '%.64s' has shape %s; model.onnx takes %s (-1: any size)", want->name,
                 kiln__shape_str(want->ndim, want->shape, a, sizeof a), kiln__shape_str(nd, shape, b, sizeof b));
        return -1;
    }
    return 0;
}

/*
 * The graph's inputs as specs (names borrowed from g), checked against and shaped by the
 * ones config.json lists (cfg_in, ncfg_in; none: the graph's declarations), and with
 * want_outputs the outputs' datatypes and shapes by dry runs on zeros. 0 or -1 with why.
 */
static int describe_onnx(kiln_onnx_model *g, kiln_device *dev, const kd_model_tensor_spec *cfg_in, int ncfg_in,
                         bool want_outputs, kd_model_tensor_spec *ins, kd_model_tensor_spec *outs, char *why,
                         size_t n)
{
    int gin = kiln_onnx_input_count(g), gout = kiln_onnx_output_count(g);
    bool symbolic = false;
    if (ncfg_in > 0 && ncfg_in != gin) {
        snprintf(why, n, "config.json lists %d inputs; model.onnx takes %d", ncfg_in, gin);
        return -1;
    }
    for (int i = 0; i < gin; i++) {
        kd_model_tensor_spec *sp = &ins[i];
        const char *name = kiln_onnx_input_name(g, i);
        const kd_model_tensor_spec *listed = NULL;
        for (int k = 0; k < ncfg_in && !listed; k++)
            if (strcmp(cfg_in[k].name, name) == 0)
                listed = &cfg_in[k];
        if (ncfg_in > 0 && !listed) {
            snprintf(why, n, "model.onnx input '%.64s' is not listed in config.json", name);
            return -1;
        }
        if (listed) {
            if (check_input(g, i, listed, why, n) != 0)
                return -1;
            *sp = *listed;
        } else {
            int dt = kiln_onnx_input_info(g, i, &sp->ndim, sp->shape);
            sp->datatype = dt < 0 ? NULL : (char *)datatype_of((kiln_dtype)dt);
        }
        sp->name = (char *)name;
        if (sp->ndim < 0 || !sp->datatype) {
            snprintf(why, n, "model.onnx input '%.64s' has %s; list the inputs in config.json", sp->name,
                     sp->ndim < 0 ? "no declared rank" : "a datatype kilnd does not serve");
            return -1;
        }
        for (int d = 0; d < sp->ndim; d++)
            symbolic |= sp->shape[d] < 0;
    }
    if (!want_outputs)
        return 0;
    const char *names[KD_SCHED_MAX_IO];
    kiln_tensor *in[KD_SCHED_MAX_IO] = {0}, *out[KD_SCHED_MAX_IO] = {0};
    int rc = 0;
    for (int pass = 0; rc == 0 && pass < (symbolic ? 2 : 1); pass++) {
        kiln_no_grad_begin();
        kiln_scope_begin();
        for (int i = 0; i < gin && rc == 0; i++) {
            int64_t shape[KILN_MAX_DIMS];
            for (int d = 0; d < ins[i].ndim; d++)
                shape[d] = ins[i].shape[d] < 0 ? pass + 1 : ins[i].shape[d];
            names[i] = ins[i].name;
            in[i] = kiln_zeros(dev, (kiln_dtype)kd_sched_dtype_of(ins[i].datatype), ins[i].ndim, shape);
            rc = in[i] ? 0 : -1;
        }
        if (rc == 0)
            rc = kiln_onnx_run(g, gin, names, in, gout, out);
        for (int o = 0; rc == 0 && o < gout; o++) {
            kd_model_tensor_spec *sp = &outs[o];
            int nd = kiln_tensor_ndim(out[o]);
            const int64_t *shape = kiln_tensor_shape(out[o]);
            if (pass == 0) {
                sp->name = (char *)kiln_onnx_output_name(g, o);
                sp->datatype = (char *)datatype_of(kiln_tensor_dtype(out[o]));
                sp->ndim = nd;
                memcpy(sp->shape, shape, (size_t)nd * sizeof shape[0]);
                if (!sp->datatype) {
                    snprintf(why, n, "model.onnx output '%.64s' has a datatype kilnd does not serve", sp->name);
                    rc = -2;
                }
            } else if (nd != sp->ndim) {
                sp->ndim = -1;
            } else {
                for (int d = 0; d < nd; d++)
                    if (shape[d] != sp->shape[d])
                        sp->shape[d] = -1;
            }
        }
        for (int o = 0; o < gout; o++) {
            kiln_tensor_release(out[o]);
            out[o] = NULL;
        }
        kiln_scope_end();
        kiln_no_grad_end();
    }
    for (int o = 0; rc == 0 && o < gout; o++)
        if (outs[o].ndim < 0) {
            snprintf(why, n, "model.onnx output '%.64s' changes rank with the input size; list the outputs in "
                             "config.json", outs[o].name);
            rc = -2;
        }
    if (rc == -1)
        snprintf(why, n, "model.onnx dry run on zeros (to learn its outputs; or list them in config.json): %s",
                 kiln_error());
    kiln_error_clear();
    return rc == 0 ? 0 : -2;
}

/* Check config.json's outputs against what the dry runs found (outs, by graph index): the
 * same datatype and rank, and no dim both fix at different sizes. 0, or -1 with why. */
static int check_outputs(kiln_onnx_model *g, const kd_model_config *c, const kd_model_tensor_spec *outs, char *why,
                         size_t n)
{
    for (int o = 0; o < c->noutputs; o++) {
        const kd_model_tensor_spec *want = &c->outputs[o], *got = NULL;
        for (int k = 0; k < kiln_onnx_output_count(g) && !got; k++)
            if (strcmp(kiln_onnx_output_name(g, k), want->name) == 0)
                got = &outs[k];
        if (!got)
            continue; /* named in the error build_onnx gives */
        if (strcmp(got->datatype, want->datatype) != 0) {
            snprintf(why, n, "config.json output '%.64s' is %s; model.onnx gives %s", want->name, want->datatype,
                     got->datatype);
            return -1;
        }
        bool fits = got->ndim == want->ndim;
        for (int d = 0; fits && d < got->ndim; d++)
            fits = got->shape[d] < 0 || want->shape[d] < 0 || got->shape[d] == want->shape[d];
        if (!fits) {
            char a[160], b[160];
            snprintf(why, n,
                     "config.json output '%.64s' has shape %s; model.onnx gives %s (-1: varies with the input)",
                     want->name, kiln__shape_str(want->ndim, want->shape, a, sizeof a),
                     kiln__shape_str(got->ndim, got->shape, b, sizeof b));
            return -1;
        }
    }
    return 0;
}

static int build_onnx(struct kd_sched_model *m, kiln_device *dev, struct kd_sched_exec *e, char *why, size_t n)
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
     * Inputs config.json lists never change after that (filled ones are the graph's). */
    pthread_mutex_lock(&m->sched->mu);
    bool need_out = m->cfg.noutputs == 0;
    bool check_out = !need_out && !m->outputs_checked;
    const kd_model_tensor_spec *cfg_in = m->cfg.inputs;
    int ncfg_in = m->cfg.ninputs;
    pthread_mutex_unlock(&m->sched->mu);
    kd_model_tensor_spec ins[KD_SCHED_MAX_IO] = {0}, outs[KD_SCHED_MAX_IO] = {0};
    int rc = describe_onnx(g, dev, cfg_in, ncfg_in, need_out || check_out, ins, outs, why, n);
    if (rc == -2 && !need_out) {
        /* config.json lists the outputs, which is the way around a model the dry runs cannot
         * run (zeros, symbolic dims at 1 and 2): then only the run checks their datatypes */
        why[0] = '\0';
        rc = 0;
        check_out = false;
    }

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
    /* config.json may name a subset of the outputs, in any order; the inputs must all be
     * there (describe_onnx checked the ones it lists). */
    if (rc == 0 && check_out) {
        rc = check_outputs(g, c, outs, why, n);
        m->outputs_checked = rc == 0;
    }
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
    if (rc != 0) {
        kiln_onnx_free(g);
        return -1;
    }
    e->onnx = g;
    return 0;
}

static void decide_batching(struct kd_sched_model *m, struct kd_sched_exec *e, kiln_device *dev);

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
    int rc = m->format && strcmp(m->format, "onnx") == 0 ? build_onnx(m, dev, out, why, n)
                                                         : build_kiln(m, dev, &out->module, why, n);
    if (rc == 0)
        decide_batching(m, out, dev);
    return rc;
}

void kd_sched_unbuild(struct kd_sched_exec *e)
{
    kiln_module_free(e->module);
    kiln_onnx_free(e->onnx);
    memset(e, 0, sizeof *e);
}

/*
 * The engine's messages for a buffer it could not have, newest cause last: one buffer past a
 * device's own limit (vulkan's largest storage buffer, what a remote server lets a session hold,
 * the address space) is the request's size, which a smaller batch avoids; any other failed
 * allocation is memory in use now, which may free up. A backend without the op is the server's.
 * Text, not codes: a failed op returns NULL and leaves only kiln_error().
 */
enum kd_sched_fault kd_sched_fault_of(const char *msg)
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

/* The batch sizes of check_batching's two dry runs: two, so that an output whose dim 0 is some
 * other size can match neither by chance, and above 1, where size-1 broadcasting could hide it. */
static const int64_t dry_batches[2] = {2, 3};

/*
 * Whether c's model batches: every input has a free dim 0 and, for an ONNX graph, over dry runs
 * on zeros at dry_batches (the inputs' other free dims 1), every configured output's dim 0 is the
 * batch and its other dims stay the same (a kiln record: config.json declares every output's dim
 * 0 free). 0, or -1 with why naming the input or output at fault.
 */
static int check_batching(const kd_model_config *c, struct kd_sched_exec *e, kiln_device *dev, char *why, size_t n)
{
    char a[160], b[160];
    if (c->ninputs < 1) {
        snprintf(why, n, "the model has no inputs to concatenate");
        return -1;
    }
    for (int i = 0; i < c->ninputs; i++)
        if (c->inputs[i].ndim < 1 || c->inputs[i].shape[0] >= 0) {
            snprintf(why, n,
                     "input '%.64s' has a fixed batch (shape %s), so a batch of requests could not be fed to it",
                     c->inputs[i].name, kiln__shape_str(c->inputs[i].ndim, c->inputs[i].shape, a, sizeof a));
            return -1;
        }
    if (e->module) {
        /* A kiln record declares its outputs in config.json, and kilnd runs nothing at its load
         * (a dry run would also be the first work a device sees, and could fail it): the
         * declared dim 0 must be free. */
        for (int o = 0; o < c->noutputs; o++)
            if (c->outputs[o].ndim < 1 || c->outputs[o].shape[0] >= 0) {
                snprintf(
                    why, n, "config.json declares output '%.64s' with shape %s: its dim 0 is not the batch (-1)",
                    c->outputs[o].name, kiln__shape_str(c->outputs[o].ndim, c->outputs[o].shape, a, sizeof a));
                return -1;
            }
        return 0;
    }
    int first_nd[KD_SCHED_MAX_IO] = {0};
    int64_t first[KD_SCHED_MAX_IO][KILN_MAX_DIMS];
    int rc = 0;
    for (int pass = 0; rc == 0 && pass < 2; pass++) {
        int64_t rows = dry_batches[pass];
        kiln_tensor *in[KD_SCHED_MAX_IO] = {0}, *out[KD_SCHED_MAX_IO] = {0}, *owned[KD_SCHED_MAX_IO] = {0};
        kiln_no_grad_begin();
        kiln_scope_begin();
        for (int i = 0; i < c->ninputs && rc == 0; i++) {
            const kd_model_tensor_spec *sp = &c->inputs[i];
            int64_t shape[KILN_MAX_DIMS];
            for (int d = 0; d < sp->ndim; d++)
                shape[d] = d == 0 ? rows : sp->shape[d] < 0 ? 1 : sp->shape[d];
            in[i] = kiln_zeros(dev, (kiln_dtype)kd_sched_dtype_of(sp->datatype), sp->ndim, shape);
            rc = in[i] ? 0 : -1;
        }
        int nout = rc == 0 ? forward(c, e, in, out, owned) : -1;
        if (nout < c->noutputs) {
            snprintf(why, n, "a dry run on zeros at batch %lld failed: %.160s", (long long)rows,
                     kiln_error()[0] ? kiln_error() : "too few outputs");
            rc = -1;
        }
        for (int o = 0; rc == 0 && o < c->noutputs; o++) {
            int nd = kiln_tensor_ndim(out[o]);
            const int64_t *shape = kiln_tensor_shape(out[o]);
            if (nd < 1 || shape[0] != rows) {
                snprintf(why, n,
                         "output '%.64s' has shape %s for a batch of %lld rows: its dim 0 is not the batch",
                         c->outputs[o].name, kiln__shape_str(nd, shape, a, sizeof a), (long long)rows);
                rc = -1;
            } else if (pass == 0) {
                first_nd[o] = nd;
                memcpy(first[o], shape, (size_t)nd * sizeof shape[0]);
            } else if (nd != first_nd[o] || memcmp(first[o] + 1, shape + 1, (size_t)(nd - 1) * sizeof shape[0])) {
                snprintf(why, n,
                         "output '%.64s' has shape %s for a batch of %lld rows and %s for %lld: more than "
                         "its dim 0 changes with the batch",
                         c->outputs[o].name, kiln__shape_str(first_nd[o], first[o], a, sizeof a),
                         (long long)dry_batches[0], kiln__shape_str(nd, shape, b, sizeof b), (long long)rows);
                rc = -1;
            }
        }
        kiln_scope_end();
        kiln_no_grad_end();
        release_all(owned, KD_SCHED_MAX_IO);
    }
    kiln_error_clear();
    return rc;
}

/*
 * After an instance of m is built on dev: the first one to get here checks whether m batches
 * (check_batching) and, when not, serves it unbatched with a warning. The load completes only
 * after every instance's build, so no request sees max_batch_size before the decision.
 */
static void decide_batching(struct kd_sched_model *m, struct kd_sched_exec *e, kiln_device *dev)
{
    pthread_mutex_lock(&m->sched->mu);
    int asked = m->cfg.max_batch_size;
    bool mine = !m->batch_decided && asked > 0;
    m->batch_decided = true;
    pthread_mutex_unlock(&m->sched->mu);
    char why[400];
    if (!mine || check_batching(&m->cfg, e, dev, why, sizeof why) == 0)
        return;
    pthread_mutex_lock(&m->sched->mu);
    m->cfg.max_batch_size = 0;
    pthread_mutex_unlock(&m->sched->mu);
    kd_sched_logf(m->sched, KD_LOG_WARN,
                  "model %s version %lld is served unbatched (max_batch_size %d in config.json taken as 0; "
                  "requests run one at a time): %s",
                  m->name, (long long)m->version, asked, why);
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
            const char *gives = datatype_of(kiln_tensor_dtype(out[o]));
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
            fault = kiln_error()[0] ? kd_sched_fault_of(msg) : KD_SCHED_FAULT_INTERNAL;
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
