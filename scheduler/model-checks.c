/*
 * scheduler/model-checks.c — what a model's load checks before it is served: an ONNX graph's
 * inputs against config.json, its outputs learned or checked by dry runs on zeros, and whether
 * either format batches (kd_sched_check_batching).
 *
 * A dry run costs what a request of its size costs (a ResNet's, a BERT's), and readiness waits
 * for it, so a load asks for runs by their sizes and each size runs at most once (struct
 * kd_sched_probe). When the batching check runs the model at dry_batches (2 and 3, the inputs'
 * other free dims at 1), the outputs are learned from those same runs and one at batch 1 (every
 * free dim at 1, the plain pair's first), instead of from the plain pair (every free dim at 1,
 * then at 2): three runs where there were four. A run is added only for what the batch runs
 * cannot tell: whether an output follows a free dim beside the batch (a sequence), which they
 * hold at 1. Where a batch run fails, the outputs come from the plain pair, as for a model that does not
 * batch, so that such a model is described or refused with the plain pair's message.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "sched-impl.h"
#include "tensor-impl.h"

/* The batch sizes of check_batching's two dry runs: two, so that an output whose dim 0 is some
 * other size can match neither by chance, and above 1, where size-1 broadcasting could hide it. */
static const int64_t dry_batches[2] = {2, 3};

/* The sizes of a dry run: every input's free dim 0 is batch, every other free dim is other. */
struct dry_size {
    int64_t batch, other;
};

/* What one dry run gave: each graph output's datatype and shape, or why it failed. */
struct dry_run {
    struct dry_size size;
    bool ok;
    char error[400];
    kiln_dtype dtype[KD_SCHED_MAX_IO];
    int ndim[KD_SCHED_MAX_IO];
    int64_t shape[KD_SCHED_MAX_IO][KILN_MAX_DIMS];
};

/* The sizes a load can ask for: dry_batches with the other dims at 1, the plain pair (every free
 * dim at 1, then at 2; the second is also the sequence run), so four runs at most. */
#define MAX_DRY_RUNS 4

struct kd_sched_probe {
    kiln_onnx_model *g;
    kiln_device *dev;
    const kd_model_tensor_spec *ins; /* the graph's inputs, in graph order */
    int nins;
    bool batch_free, other_free; /* some input's dim 0 is free; some input's other dim is */
    bool batch_runs;             /* the batching check runs at dry_batches */
    int nruns;
    struct dry_run runs[MAX_DRY_RUNS];
    struct dry_run beyond; /* a failed run, for a size past MAX_DRY_RUNS (none is asked for) */
};

struct kd_sched_probe *kd_sched_probe_new(kiln_onnx_model *g, kiln_device *dev, const kd_model_tensor_spec *ins,
                                          int nins, bool check_batching)
{
    struct kd_sched_probe *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->g = g;
    p->dev = dev;
    p->ins = ins;
    p->nins = nins;
    bool batchable = nins > 0;
    for (int i = 0; i < nins; i++) {
        bool free_dim0 = ins[i].ndim >= 1 && ins[i].shape[0] < 0;
        batchable &= free_dim0;
        p->batch_free |= free_dim0;
        for (int d = 1; d < ins[i].ndim; d++)
            p->other_free |= ins[i].shape[d] < 0;
    }
    p->batch_runs = check_batching && batchable;
    return p;
}

void kd_sched_probe_free(struct kd_sched_probe *p)
{
    free(p);
}

/* The run at size, when one was made: sizes that only differ where no input is free are one. */
static struct dry_run *made_at(struct kd_sched_probe *p, struct dry_size size)
{
    for (int i = 0; i < p->nruns; i++) {
        const struct dry_size *s = &p->runs[i].size;
        if ((!p->batch_free || s->batch == size.batch) && (!p->other_free || s->other == size.other))
            return &p->runs[i];
    }
    return NULL;
}

/* The dry run at size: the one made before, or a new run of the graph on zeros. */
static const struct dry_run *run_at(struct kd_sched_probe *p, struct dry_size size)
{
    struct dry_run *r = made_at(p, size);
    if (r)
        return r;
    if (p->nruns == MAX_DRY_RUNS) {
        snprintf(p->beyond.error, sizeof p->beyond.error, "more than %d dry runs asked for", MAX_DRY_RUNS);
        return &p->beyond;
    }
    r = &p->runs[p->nruns++];
    r->size = size;
    const char *names[KD_SCHED_MAX_IO];
    kiln_tensor *in[KD_SCHED_MAX_IO] = {0}, *out[KD_SCHED_MAX_IO] = {0};
    int gout = kiln_onnx_output_count(p->g);
    int rc = 0;
    kiln_no_grad_begin();
    kiln_scope_begin();
    for (int i = 0; i < p->nins && rc == 0; i++) {
        const kd_model_tensor_spec *sp = &p->ins[i];
        int64_t shape[KILN_MAX_DIMS];
        for (int d = 0; d < sp->ndim; d++)
            shape[d] = sp->shape[d] >= 0 ? sp->shape[d] : d == 0 ? size.batch : size.other;
        names[i] = sp->name;
        in[i] = kiln_zeros(p->dev, (kiln_dtype)kd_sched_dtype_of(sp->datatype), sp->ndim, shape);
        rc = in[i] ? 0 : -1;
    }
    if (rc == 0)
        rc = kiln_onnx_run(p->g, p->nins, names, in, gout, out);
    r->ok = rc == 0;
    if (!r->ok)
        snprintf(r->error, sizeof r->error, "%s", kiln_error());
    for (int o = 0; r->ok && o < gout; o++) {
        r->dtype[o] = kiln_tensor_dtype(out[o]);
        r->ndim[o] = kiln_tensor_ndim(out[o]);
        memcpy(r->shape[o], kiln_tensor_shape(out[o]), (size_t)r->ndim[o] * sizeof r->shape[o][0]);
    }
    for (int o = 0; o < gout; o++)
        kiln_tensor_release(out[o]);
    kiln_scope_end();
    kiln_no_grad_end();
    kiln_error_clear();
    return r;
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
    const char *declared = dt < 0 ? NULL : kd_sched_datatype_of((kiln_dtype)dt);
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

int kd_sched_onnx_inputs(kiln_onnx_model *g, const kd_model_tensor_spec *cfg_in, int ncfg_in,
                         kd_model_tensor_spec *ins, char *why, size_t n)
{
    int gin = kiln_onnx_input_count(g);
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
            sp->datatype = dt < 0 ? NULL : (char *)kd_sched_datatype_of((kiln_dtype)dt);
        }
        sp->name = (char *)name;
        if (sp->ndim < 0 || !sp->datatype) {
            snprintf(why, n, "model.onnx input '%.64s' has %s; list the inputs in config.json", sp->name,
                     sp->ndim < 0 ? "no declared rank" : "a datatype kilnd does not serve");
            return -1;
        }
    }
    return 0;
}

enum {
    LEARNED = 0,
    LEARN_FAILED = -2,
    RUN_FAILED = -3
};

/* The outputs' datatypes and shapes over the runs at sizes, in order (a dim that differs between
 * them is -1). LEARNED; LEARN_FAILED with why for an output kilnd cannot describe; RUN_FAILED with
 * why when a run failed (nothing is run when one of the sizes already failed). */
static int learn_at(struct kd_sched_probe *p, const struct dry_size *sizes, int nsizes, kd_model_tensor_spec *outs,
                    char *why, size_t n)
{
    const struct dry_run *failed = NULL;
    for (int i = 0; i < nsizes && !failed; i++) {
        const struct dry_run *r = made_at(p, sizes[i]);
        failed = r && !r->ok ? r : NULL;
    }
    int gout = kiln_onnx_output_count(p->g);
    for (int i = 0; i < nsizes && !failed; i++) {
        const struct dry_run *r = run_at(p, sizes[i]);
        if (!r->ok) {
            failed = r;
            break;
        }
        for (int o = 0; o < gout; o++) {
            kd_model_tensor_spec *sp = &outs[o];
            if (i == 0) {
                sp->name = (char *)kiln_onnx_output_name(p->g, o);
                sp->datatype = (char *)kd_sched_datatype_of(r->dtype[o]);
                sp->ndim = r->ndim[o];
                memcpy(sp->shape, r->shape[o], (size_t)r->ndim[o] * sizeof r->shape[o][0]);
                if (!sp->datatype) {
                    snprintf(why, n, "model.onnx output '%.64s' has a datatype kilnd does not serve", sp->name);
                    return LEARN_FAILED;
                }
            } else if (sp->ndim >= 0 && r->ndim[o] != sp->ndim) {
                sp->ndim = -1;
            } else {
                for (int d = 0; d < sp->ndim; d++)
                    if (r->shape[o][d] != sp->shape[d])
                        sp->shape[d] = -1;
            }
        }
    }
    if (failed) {
        snprintf(why, n, "model.onnx dry run on zeros (to learn its outputs; or list them in config.json): %s",
                 failed->error);
        return RUN_FAILED;
    }
    for (int o = 0; o < gout; o++)
        if (outs[o].ndim < 0) {
            snprintf(why, n,
                     "model.onnx output '%.64s' changes rank with the input size; list the outputs in "
                     "config.json",
                     outs[o].name);
            return LEARN_FAILED;
        }
    return LEARNED;
}

int kd_sched_probe_outputs(struct kd_sched_probe *p, bool every_dim, kd_model_tensor_spec *outs, char *why,
                           size_t n)
{
    /* The plain pair: every free dim at 1, then at 2, for a model that does not batch or whose
     * batch runs failed. The second is also the batch runs' sequence run. */
    static const struct dry_size plain[2] = {{1, 1}, {2, 2}};
    int rc = RUN_FAILED;
    bool partial = false;
    if (p->batch_runs) {
        /* The batching check's runs vary only the batch: dims that follow nothing else are
         * learned from them, with one run at batch 1 before them, since an output may lose a
         * dim at batch 1 only (a Squeeze without axes) and the batcher runs single rows; a dim
         * that follows another free dim needs a run with it at 2. */
        const struct dry_size sizes[4] = {plain[0], {dry_batches[0], 1}, {dry_batches[1], 1}, plain[1]};
        partial = p->other_free && !every_dim;
        rc = learn_at(p, sizes, p->other_free && every_dim ? 4 : 3, outs, why, n);
    }
    if (rc == RUN_FAILED) {
        partial = false;
        rc = learn_at(p, plain, 2, outs, why, n);
    }
    return rc != LEARNED ? -1 : partial ? 1 : 0;
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

int kd_sched_probe_check_outputs(struct kd_sched_probe *p, const kd_model_config *c, char *why, size_t n)
{
    kd_model_tensor_spec outs[KD_SCHED_MAX_IO] = {0};
    int got = kd_sched_probe_outputs(p, false, outs, why, n);
    /* Learned with the dims beside the batch at 1, an output config.json fixes at another size
     * may follow them: a run with them at 2 says. */
    if (got == 1 && check_outputs(p->g, c, outs, why, n) != 0)
        got = kd_sched_probe_outputs(p, true, outs, why, n);
    if (got < 0) {
        /* config.json lists the outputs, which is the way around a model the dry runs cannot
         * run (zeros, free dims at 1 and 2): then only the run checks their datatypes */
        why[0] = '\0';
        return 0;
    }
    return check_outputs(p->g, c, outs, why, n);
}

int kd_sched_check_batching(const kd_model_config *c, const struct kd_sched_exec *e, struct kd_sched_probe *p,
                            char *why, size_t n)
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
    const struct dry_run *first = NULL;
    for (int pass = 0; pass < 2; pass++) {
        int64_t rows = dry_batches[pass];
        const struct dry_run *r = run_at(p, (struct dry_size){rows, 1});
        if (!r->ok) {
            snprintf(why, n, "a dry run on zeros at batch %lld failed: %.160s", (long long)rows,
                     r->error[0] ? r->error : "too few outputs");
            return -1;
        }
        for (int o = 0; o < c->noutputs; o++) {
            int k = e->onnx_out[o], nd = r->ndim[k];
            const int64_t *shape = r->shape[k];
            if (nd < 1 || shape[0] != rows) {
                snprintf(why, n,
                         "output '%.64s' has shape %s for a batch of %lld rows: its dim 0 is not the batch",
                         c->outputs[o].name, kiln__shape_str(nd, shape, a, sizeof a), (long long)rows);
                return -1;
            }
            if (first && (nd != first->ndim[k] ||
                          memcmp(first->shape[k] + 1, shape + 1, (size_t)(nd - 1) * sizeof shape[0]))) {
                snprintf(why, n,
                         "output '%.64s' has shape %s for a batch of %lld rows and %s for %lld: more than "
                         "its dim 0 changes with the batch",
                         c->outputs[o].name, kiln__shape_str(first->ndim[k], first->shape[k], a, sizeof a),
                         (long long)dry_batches[0], kiln__shape_str(nd, shape, b, sizeof b), (long long)rows);
                return -1;
            }
        }
        first = r;
    }
    return 0;
}
