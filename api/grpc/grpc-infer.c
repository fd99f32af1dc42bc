/*
 * api/grpc/grpc-infer.c — ModelInfer and ModelStreamInfer: a ModelInferRequest into the same
 * struct kd_sched_request the HTTP decoder makes, queued through the same accounting
 * (kd_serving_submit) to the same scheduler; the finished request back into a
 * ModelInferResponse, packed on the worker (as the HTTP body is) and sent by the loop.
 *
 * The checks are the HTTP decoder's (api/infer.c), made on the decoded message: the input count
 * and names, the datatype against the model's, each dim against the model's shape and
 * limits.max_tensor_elements (overflow-checked) before anything is allocated from it, the batch
 * dim against max_batch_size and across inputs, and the data's size: raw_input_contents must be
 * exactly the shape's bytes, typed contents exactly its element count. Outputs travel in
 * raw_output_contents, as Triton sends them.
 *
 * A stream's requests are answered in the order they came, each carrying its id: a request that
 * finishes early waits on its stream until those before it have been sent.
 *
 * raw_input_contents are not copied: protobuf-c would copy each into its own allocation when
 * unpacking, and the decoder again into the tensor. The message's top-level fields are walked
 * first (split_raw); raw_input_contents (field 7) become views into the received message, whose
 * buffer the job takes over from the stream and frees when it is done, and only the other fields
 * are unpacked. The scheduler reads inputs only (kiln_from_data copies them into the device
 * tensor), so the tensors borrow the views. A message that does not walk cleanly is unpacked
 * whole, as before, and refused or served by the copying path.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "classify.h"
#include "grpc-impl.h"
#include "grpc_service.pb-c.h"
#include "shm.h"

struct grpc_job {
    struct kd_sched_request r; /* first: the scheduler hands this pointer back */
    struct kd_serving *sv;
    struct grpc_stream *s; /* NULL once the call has gone */
    struct grpc_job *next;
    atomic_bool cancelled;
    bool streaming, queued, done, client_deadline, encoded;
    struct kd_output_asks asks; /* what it asks of each output (binary: unused over gRPC) */
    char *id;
    int64_t version;
    struct kd_buf resp; /* the framed response, packed by the worker */
    enum grpc_code code;
    char msg[sizeof((struct kd_sched_request *)0)->error]; /* a run's failure whole */
    struct kd_shm_use shm; /* the shared-memory regions its tensors use, held until done */
    struct kd_buf held;    /* the received message its inputs point into, until done */
    int coding;            /* the answer's compression (enum kd_http_coding), the stream's */
    int shm_status;        /* 400 when an output could not go into its region */
    size_t request_bytes;  /* its message's, counted in the stream's running_bytes until answered */
};

#define FAIL(status, ...)                                                                                         \
    do {                                                                                                          \
        snprintf(msg, msglen, __VA_ARGS__);                                                                       \
        rc = (status);                                                                                            \
        goto done;                                                                                                \
    } while (0)

/* Copies typed contents into t (dtype and element count set). 0, or -1 with why (pointing at
 * static text or into buf). */
static int copy_typed(struct kd_sched_tensor *t, const Inference__InferTensorContents *c, int64_t numel,
                      const char **why, char *buf, size_t bl)
{
    size_t n = (size_t)numel, have;
    /* Every typed field but the datatype's own must be empty: elements in another one (int64
     * contents for an FP32 input) were meant for a different datatype, and ignoring them
     * would run on whatever the right field holds. */
    static const struct {
        kiln_dtype dt;
        const char *field;
    } fields[] = {{KILN_F32, "fp32_contents"}, {KILN_F64, "fp64_contents"}, {KILN_I64, "int64_contents"},
                  {KILN_I32, "int_contents"},  {KILN_U8, "uint_contents"},  {KILN_BOOL, "bool_contents"}};
    const size_t counts[] = {c->n_fp32_contents, c->n_fp64_contents, c->n_int64_contents,
                             c->n_int_contents,  c->n_uint_contents, c->n_bool_contents};
    const char *own = NULL;
    for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++)
        if (fields[k].dt == t->dtype)
            own = fields[k].field;
    if (!own) {
        *why = "this datatype has no typed contents field: send it in raw_input_contents";
        return -1;
    }
    for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++)
        if (counts[k] && fields[k].dt != t->dtype) {
            snprintf(buf, bl, "the contents are in %s; this datatype's field is %s", fields[k].field, own);
            *why = buf;
            return -1;
        }
    switch (t->dtype) {
    case KILN_F32: have = c->n_fp32_contents; break;
    case KILN_F64: have = c->n_fp64_contents; break;
    case KILN_I64: have = c->n_int64_contents; break;
    case KILN_I32: have = c->n_int_contents; break;
    case KILN_U8: have = c->n_uint_contents; break;
    default: have = c->n_bool_contents; break;
    }
    if (have != n) {
        snprintf(buf, bl, "%s holds %zu elements; the shape needs %zu", own, have, n);
        *why = buf;
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        switch (t->dtype) {
        case KILN_F32: ((float *)t->data)[i] = c->fp32_contents[i]; break;
        case KILN_F64: ((double *)t->data)[i] = c->fp64_contents[i]; break;
        case KILN_I64: ((int64_t *)t->data)[i] = c->int64_contents[i]; break;
        case KILN_I32: ((int32_t *)t->data)[i] = c->int_contents[i]; break;
        case KILN_BOOL: ((uint8_t *)t->data)[i] = c->bool_contents[i] ? 1 : 0; break;
        default:
            if (c->uint_contents[i] > 255) {
                *why = "UINT8 contents must be in 0..255";
                return -1;
            }
            ((uint8_t *)t->data)[i] = (uint8_t)c->uint_contents[i];
        }
    }
    return 0;
}

/* The parameter called name in a map of parameters (entries of any of the three tensor kinds). */
#define PARAM_OF(entries, n, name, out)                                                                           \
    do {                                                                                                          \
        (out) = NULL;                                                                                             \
        for (size_t i_ = 0; i_ < (n); i_++)                                                                       \
            if ((entries)[i_]->key && strcmp((entries)[i_]->key, (name)) == 0)                                    \
                (out) = (entries)[i_]->value;                                                                     \
    } while (0)

/*
 * A tensor's shared_memory_region / _offset / _byte_size parameters, as Triton's system
 * shared-memory extension sends them: 0 with *in_shm false when there is no region; 0 with the
 * slice retained into *out; or 400 with msg. An input's byte size must be exactly need.
 */
static int shm_params(struct kd_shm_table *t, const Inference__InferParameter *region,
                      const Inference__InferParameter *offset, const Inference__InferParameter *size,
                      const char *tensor, bool is_input, uint64_t need, bool *in_shm, struct kd_shm_slice *out,
                      char *msg, size_t msglen)
{
    *in_shm = region != NULL;
    if (!region)
        return 0;
    char what[KD_MODEL_NAME_MAX + 16];
    snprintf(what, sizeof what, "%s '%s'", is_input ? "input" : "output", tensor);
    if (region->parameter_choice_case != INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM) {
        snprintf(msg, msglen, "%s: shared_memory_region must be a string_param naming a registered region", what);
        return 400;
    }
    bool ok = size && size->parameter_choice_case == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM &&
              size->int64_param >= 0 &&
              (!offset ||
               (offset->parameter_choice_case == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM &&
                offset->int64_param >= 0));
    if (!ok) {
        snprintf(msg, msglen,
                 "%s: shared_memory_byte_size (and shared_memory_offset, if given) must be "
                 "non-negative int64_params",
                 what);
        return 400;
    }
    if (out->region) {
        snprintf(msg, msglen, "%s is requested twice", what);
        return 400;
    }
    uint64_t bytes = (uint64_t)size->int64_param;
    if (is_input && bytes != need) {
        snprintf(msg, msglen, "%s: shared_memory_byte_size is %llu; its shape and datatype need %llu", what,
                 (unsigned long long)bytes, (unsigned long long)need);
        return 400;
    }
    return kd_shm_slice_get(t, region->string_param, offset ? (uint64_t)offset->int64_param : 0, bytes, what, out,
                            msg, msglen);
}

/* q into r for model config c; fills asks and, for tensors in shared memory, use. 0, or an
 * HTTP status with msg (r cleared; the caller releases use). */
static int decode(const struct kd_serving_options *lim, const kd_model_config *c,
                  const Inference__ModelInferRequest *q, const ProtobufCBinaryData *raw_in, size_t n_raw_in,
                  bool borrow, struct kd_shm_table *shm, struct kd_shm_use *use, struct kd_sched_request *r,
                  struct kd_output_asks *asks, char *msg, size_t msglen)
{
    int rc = 0;
    bool raw = n_raw_in > 0;
    size_t nraw = 0; /* the inputs not in shared memory: raw_input_contents has one entry for each */
    /* Named before counted, as over HTTP (api/infer.c). */
    for (size_t i = 0; i < q->n_inputs; i++) {
        if (kd_infer_find_spec(c->inputs, c->ninputs, q->inputs[i]->name) < 0) {
            char list[512];
            FAIL(400, "the model has no input '%.64s' (its inputs: %s)", q->inputs[i]->name,
                 kd_infer_input_list(c, list, sizeof list));
        }
        for (size_t j = 0; j < i; j++)
            if (strcmp(q->inputs[i]->name, q->inputs[j]->name) == 0)
                FAIL(400, "input '%.64s' is given twice", q->inputs[i]->name);
    }
    if (q->n_inputs != (size_t)c->ninputs) {
        /* every name given is the model's and given once (above): so one of the model's is missing */
        for (int k = 0; k < c->ninputs; k++) {
            bool given = false;
            for (size_t i = 0; i < q->n_inputs && !given; i++)
                given = strcmp(q->inputs[i]->name, c->inputs[k].name) == 0;
            if (!given)
                FAIL(400, "input '%.64s' is missing: the model takes %d input(s), the request has %zu",
                     c->inputs[k].name, c->ninputs, q->n_inputs);
        }
        FAIL(400, "the model takes %d input(s), the request has %zu", c->ninputs, q->n_inputs);
    }
    for (size_t i = 0; i < q->n_inputs; i++) {
        const Inference__InferParameter *p;
        PARAM_OF(q->inputs[i]->parameters, q->inputs[i]->n_parameters, "shared_memory_region", p);
        nraw += p == NULL;
    }
    if (raw && n_raw_in != nraw)
        FAIL(400, "raw_input_contents has %zu entries for %zu inputs not in shared memory", n_raw_in, nraw);
    size_t next_raw = 0;
    r->ninputs = c->ninputs;
    int64_t batch = -1;
    for (size_t i = 0; i < q->n_inputs; i++) {
        const Inference__ModelInferRequest__InferInputTensor *in = q->inputs[i];
        int k = kd_infer_find_spec(c->inputs, c->ninputs, in->name);
        if (k < 0)
            FAIL(400, "the model has no input '%.64s'", in->name);
        if (r->inputs[k].data)
            FAIL(400, "input '%.64s' is given twice", in->name);
        const kd_model_tensor_spec *sp = &c->inputs[k];
        if (strcmp(in->datatype, sp->datatype) != 0)
            FAIL(400, "input '%s' has datatype %.32s; the model expects %s", sp->name, in->datatype, sp->datatype);
        int want = kd_sched_dtype_of(sp->datatype);
        if (want < 0)
            FAIL(400, "datatype %s is not supported", sp->datatype);
        if (in->n_shape != (size_t)sp->ndim)
            FAIL(400, "input '%s' has %zu dims; the model expects %d", sp->name, in->n_shape, sp->ndim);
        struct kd_sched_tensor *t = &r->inputs[k];
        int64_t numel = 1;
        for (int d = 0; d < sp->ndim; d++) {
            int64_t v = in->shape[d];
            if (v < 0)
                FAIL(400, "input '%s': shape entries must be non-negative integers", sp->name);
            if (v > lim->max_tensor_elements)
                FAIL(413, "input '%s': dim %d is larger than limits.max_tensor_elements (%lld)", sp->name, d,
                     (long long)lim->max_tensor_elements);
            if (sp->shape[d] >= 0 && sp->shape[d] != v)
                FAIL(400, "input '%s': dim %d is %lld; the model expects %lld", sp->name, d, (long long)v,
                     (long long)sp->shape[d]);
            if (__builtin_mul_overflow(numel, v, &numel) || numel > lim->max_tensor_elements)
                FAIL(413, "input '%s' has more than limits.max_tensor_elements (%lld) elements", sp->name,
                     (long long)lim->max_tensor_elements);
            t->shape[d] = v;
        }
        t->ndim = sp->ndim;
        if (c->max_batch_size > 0) {
            if (t->ndim < 1 || t->shape[0] < 1 || t->shape[0] > c->max_batch_size)
                FAIL(400, "input '%s': batch dim must be 1..%d", sp->name, c->max_batch_size);
            if (batch >= 0 && t->shape[0] != batch)
                FAIL(400, "inputs disagree on the batch size");
            batch = t->shape[0];
        }
        t->dtype = (kiln_dtype)want;
        t->nbytes = (size_t)numel * kiln_dtype_size(t->dtype);
        const Inference__InferParameter *region, *offset, *size;
        PARAM_OF(in->parameters, in->n_parameters, "shared_memory_region", region);
        PARAM_OF(in->parameters, in->n_parameters, "shared_memory_offset", offset);
        PARAM_OF(in->parameters, in->n_parameters, "shared_memory_byte_size", size);
        bool in_shm = false;
        if ((rc = shm_params(shm, region, offset, size, sp->name, true, t->nbytes, &in_shm, &use->in[k], msg,
                             msglen)))
            goto done;
        if (in_shm) {
            if (in->contents)
                FAIL(400, "input '%s' has contents beside shared_memory_region", sp->name);
            const void *src = kd_shm_slice_ptr(&use->in[k], msg, msglen);
            if (!src) {
                rc = 400; /* msg names the region */
                goto done;
            }
            t->data = malloc(t->nbytes ? t->nbytes : 1);
            if (!t->data)
                FAIL(500, "out of memory");
            memcpy(t->data, src, t->nbytes);
            continue;
        }
        size_t ri = next_raw++;
        if (raw) {
            if (in->contents)
                FAIL(400, "input '%s' has contents beside raw_input_contents", sp->name);
            if (raw_in[ri].len != t->nbytes)
                FAIL(400, "input '%s': raw_input_contents holds %zu bytes; its shape and datatype need %zu",
                     sp->name, raw_in[ri].len, t->nbytes);
            if (borrow && t->nbytes) {
                t->data = raw_in[ri].data; /* read only; the job holds the message until done */
                t->borrowed = true;
                continue;
            }
        } else if (!in->contents) {
            FAIL(400, "input '%s' has neither contents nor raw_input_contents", sp->name);
        }
        t->data = malloc(t->nbytes ? t->nbytes : 1);
        if (!t->data)
            FAIL(500, "out of memory");
        const char *why = NULL;
        char whybuf[128];
        if (raw)
            memcpy(t->data, raw_in[ri].data, t->nbytes);
        else if (copy_typed(t, in->contents, numel, &why, whybuf, sizeof whybuf) != 0)
            FAIL(400, "input '%s': %s", sp->name, why);
    }
    for (int o = 0; o < c->noutputs; o++) {
        asks->want[o] = q->n_outputs == 0;
        asks->binary[o] = false;
        asks->classes[o] = 0;
    }
    for (size_t i = 0; i < q->n_outputs; i++) {
        int k = kd_infer_find_spec(c->outputs, c->noutputs, q->outputs[i]->name);
        if (k < 0)
            FAIL(400, "unknown output '%.64s'", q->outputs[i]->name);
        asks->want[k] = true;
        const Inference__ModelInferRequest__InferRequestedOutputTensor *ro = q->outputs[i];
        const Inference__InferParameter *region, *offset, *size, *classification;
        PARAM_OF(ro->parameters, ro->n_parameters, "shared_memory_region", region);
        PARAM_OF(ro->parameters, ro->n_parameters, "shared_memory_offset", offset);
        PARAM_OF(ro->parameters, ro->n_parameters, "shared_memory_byte_size", size);
        bool in_shm = false;
        if ((rc = shm_params(shm, region, offset, size, c->outputs[k].name, false, 0, &in_shm, &use->out[k], msg,
                             msglen)))
            goto done;
        /* tritonclient's class_count: an int64_param (a uint64_param is taken too) */
        PARAM_OF(ro->parameters, ro->n_parameters, "classification", classification);
        if (classification) {
            int64_t count = -1;
            if (classification->parameter_choice_case == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM)
                count = classification->int64_param;
            else if (classification->parameter_choice_case ==
                     INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_UINT64_PARAM)
                count = classification->uint64_param > INT64_MAX ? INT64_MAX
                                                                 : (int64_t)classification->uint64_param;
            else
                FAIL(400, "output '%.64s': classification must be an int64_param, the number of classes",
                     c->outputs[k].name);
            if ((rc = kd_infer_check_classes(c, k, count, in_shm, msg, msglen)) != 0)
                goto done;
            asks->classes[k] = count;
        }
    }
done:
    if (rc != 0)
        kd_sched_request_clear(r);
    return rc;
}

/* ---- the answer, packed on the worker --------------------------------------------------------- */

static void finish_on_worker(struct kd_sched_request *r)
{
    struct grpc_job *j = (struct grpc_job *)r;
    if (r->outcome != KD_SCHED_OK)
        return;
    const kd_model_config *c = kd_sched_model_config(r->model);
    bool any_shm = kd_shm_use_any(&j->shm);
    if (any_shm && (j->shm_status = kd_shm_write_outputs(&j->shm, c, r, r->error, sizeof r->error)) != 0)
        return;
    char version[24];
    snprintf(version, sizeof version, "%lld", (long long)kd_sched_model_version(r->model));
    Inference__ModelInferResponse res = INFERENCE__MODEL_INFER_RESPONSE__INIT;
    Inference__ModelInferResponse__InferOutputTensor out[KD_SCHED_MAX_IO], *outp[KD_SCHED_MAX_IO];
    ProtobufCBinaryData raw[KD_SCHED_MAX_IO];
    /* outputs asked as classes: BYTES in Triton's serialized layout, raw as any output */
    struct kd_classes classes[KD_SCHED_MAX_IO]; /* only those of outputs asked as classes are set */
    for (int o = 0; o < c->noutputs && o < r->noutputs; o++)
        if (j->asks.want[o] && j->asks.classes[o] > 0 &&
            kd_classify(&r->outputs[o], c->max_batch_size > 0, j->asks.classes[o],
                        (const char *const *)c->outputs[o].labels, c->outputs[o].nlabels, &classes[o]) != 0) {
            for (int k = 0; k < o; k++)
                if (j->asks.want[k] && j->asks.classes[k] > 0)
                    kd_classes_free(&classes[k]);
            return; /* not encoded: answered as out of memory */
        }
    res.model_name = (char *)kd_sched_model_name(r->model);
    res.model_version = version;
    res.id = j->id ? j->id : "";
    /* The outputs sent raw first, then those written into shared memory (no raw contents; their
     * parameters say where): a client pairs raw_output_contents with outputs by position. */
    Inference__InferParameter shm_param[KD_SCHED_MAX_IO][3];
    Inference__ModelInferResponse__InferOutputTensor__ParametersEntry shm_entry[KD_SCHED_MAX_IO][3],
        *shm_entryp[KD_SCHED_MAX_IO][3];
    size_t n = 0, nraw = 0;
    for (int pass = 0; pass < (any_shm ? 2 : 1); pass++) {
        for (int o = 0; o < c->noutputs && o < r->noutputs; o++) {
            const struct kd_shm_slice *sl = &j->shm.out[o];
            if (!j->asks.want[o] || (sl->region != NULL) != (pass == 1))
                continue;
            const struct kd_classes *cl = j->asks.classes[o] > 0 ? &classes[o] : NULL;
            inference__model_infer_response__infer_output_tensor__init(&out[n]);
            out[n].name = c->outputs[o].name;
            out[n].datatype = cl ? "BYTES" : c->outputs[o].datatype;
            out[n].n_shape = (size_t)(cl ? cl->ndim : r->outputs[o].ndim);
            out[n].shape = cl ? (int64_t *)cl->shape : (int64_t *)r->outputs[o].shape;
            outp[n] = &out[n];
            if (pass == 0) {
                raw[nraw].len = cl ? cl->wire_len : r->outputs[o].nbytes;
                raw[nraw].data = cl ? (uint8_t *)cl->wire : r->outputs[o].data;
                nraw++;
            } else {
                static const char *const keys[3] = {"shared_memory_region", "shared_memory_byte_size",
                                                    "shared_memory_offset"};
                for (int k = 0; k < 3; k++) {
                    inference__infer_parameter__init(&shm_param[n][k]);
                    inference__model_infer_response__infer_output_tensor__parameters_entry__init(&shm_entry[n][k]);
                    shm_entry[n][k].key = (char *)keys[k];
                    shm_entry[n][k].value = &shm_param[n][k];
                    shm_entryp[n][k] = &shm_entry[n][k];
                }
                shm_param[n][0].parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM;
                shm_param[n][0].string_param = (char *)kd_shm_slice_region_name(sl);
                shm_param[n][1].parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM;
                shm_param[n][1].int64_param = (int64_t)r->outputs[o].nbytes;
                shm_param[n][2].parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM;
                shm_param[n][2].int64_param = (int64_t)sl->offset;
                out[n].n_parameters = sl->offset ? 3 : 2;
                out[n].parameters = shm_entryp[n];
            }
            n++;
        }
    }
    res.n_outputs = n;
    res.outputs = outp;
    res.n_raw_output_contents = nraw;
    res.raw_output_contents = raw;
    if (j->streaming) {
        Inference__ModelStreamInferResponse sr = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
        sr.infer_response = &res;
        j->encoded = kd_grpc_frame_coded(&j->resp, &sr.base, j->coding) == 0;
    } else {
        j->encoded = kd_grpc_frame_coded(&j->resp, &res.base, j->coding) == 0;
    }
    for (int o = 0; o < c->noutputs && o < r->noutputs; o++)
        if (j->asks.want[o] && j->asks.classes[o] > 0)
            kd_classes_free(&classes[o]);
}

/* ---- completion and delivery, in request order -------------------------------------------------- */

static void job_free(struct grpc_job *j)
{
    kd_shm_use_release(&j->shm);
    kd_buf_free(&j->held);
    kd_buf_free(&j->resp);
    free(j->id);
    free(j);
}

/* A streaming call's error: a ModelStreamInferResponse carrying it and, in its infer_response,
 * the request's id (a client matching answers to requests by id needs it on errors too), the
 * stream going on. */
static void stream_error(struct grpc_stream *s, const char *msg, const char *id)
{
    Inference__ModelStreamInferResponse sr = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
    Inference__ModelInferResponse r = INFERENCE__MODEL_INFER_RESPONSE__INIT;
    sr.error_message = (char *)msg;
    if (id && id[0]) {
        r.id = (char *)id;
        sr.infer_response = &r;
    }
    if (kd_grpc_reply(s, &sr.base) != 0)
        kd_grpc_finish(s, GRPC_RESOURCE_EXHAUSTED, "out of memory for the response");
}

static void deliver(struct grpc_stream *s)
{
    while (s->jobs && s->jobs->done) {
        struct grpc_job *j = s->jobs;
        s->jobs = j->next;
        if (!s->jobs)
            s->jobs_tail = NULL;
        s->running_bytes -= j->request_bytes;
        if (!j->streaming) {
            if (j->code == GRPC_OK && kd_grpc_reply_buf(s, &j->resp) == 0)
                kd_grpc_finish_ok(s);
            else
                kd_grpc_finish(s, j->code == GRPC_OK ? GRPC_RESOURCE_EXHAUSTED : j->code, "%s",
                               j->code == GRPC_OK ? "out of memory for the response" : j->msg);
        } else if (j->code == GRPC_OK) {
            if (kd_grpc_reply_buf(s, &j->resp) != 0)
                kd_grpc_finish(s, GRPC_RESOURCE_EXHAUSTED, "out of memory for the response");
        } else {
            stream_error(s, j->msg, j->id);
        }
        job_free(j);
    }
    if (s->streaming)
        kd_grpc_stream_maybe_end(s);
}

static void job_done(struct kd_sched_request *r)
{
    struct grpc_job *j = (struct grpc_job *)r;
    kd_serving_account_done(j->sv, r, false);
    switch (r->outcome) {
    case KD_SCHED_OK:
        if (j->shm_status) {
            j->code = kd_grpc_code_of_http(j->shm_status);
            snprintf(j->msg, sizeof j->msg, "%s", r->error);
            break;
        }
        j->code = j->encoded ? GRPC_OK : GRPC_RESOURCE_EXHAUSTED;
        if (j->encoded)
            j->msg[0] = '\0';
        else
            snprintf(j->msg, sizeof j->msg, "out of memory for the response");
        break;
    case KD_SCHED_FAILED: {
        char lost[320];
        bool gone = r->model && kd_sched_model_lost(r->model, lost, sizeof lost);
        /* as over HTTP (serving-routes.c): a lost device and memory are the server's, and so
         * is a buffer past a device's limit, though a smaller request may fit */
        j->code = gone                                   ? GRPC_UNAVAILABLE
                  : r->fault == KD_SCHED_FAULT_MEMORY    ? GRPC_RESOURCE_EXHAUSTED
                  : r->fault == KD_SCHED_FAULT_TOO_LARGE ? GRPC_RESOURCE_EXHAUSTED
                  : r->fault == KD_SCHED_FAULT_INTERNAL  ? GRPC_INTERNAL
                                                         : GRPC_INVALID_ARGUMENT;
        snprintf(j->msg, sizeof j->msg, "%s", r->error);
        break;
    }
    case KD_SCHED_TIMEOUT:
        j->code = j->client_deadline ? GRPC_DEADLINE_EXCEEDED : GRPC_UNAVAILABLE;
        snprintf(j->msg, sizeof j->msg, "%s", r->error[0] ? r->error : "timed out in the queue");
        break;
    case KD_SCHED_CANCELLED:
        j->code = GRPC_CANCELLED;
        snprintf(j->msg, sizeof j->msg, "cancelled before it ran");
        break;
    default:
        j->code = GRPC_UNAVAILABLE;
        snprintf(j->msg, sizeof j->msg, "%s", kd_sched_outcome_to_str(r->outcome));
    }
    struct kd_sched_model *m = r->model;
    kd_sched_request_clear(r);
    kd_sched_model_release(m);
    kd_shm_use_release(&j->shm);
    j->done = true;
    struct grpc_stream *s = j->s;
    if (!s) {
        job_free(j);
        return;
    }
    deliver(s);
    kd_grpc_flush(s->conn);
}

void kd_grpc_detach_jobs(struct grpc_stream *s)
{
    for (struct grpc_job *j = s->jobs, *next; j; j = next) {
        next = j->next;
        if (j->done) {
            job_free(j);
        } else {
            atomic_store(&j->cancelled, true);
            j->s = NULL;
        }
    }
    s->jobs = s->jobs_tail = NULL;
    s->running_bytes = 0;
}

const char kd_grpc_drain_stream_end[] =
    "kilnd is shutting down: the stream ends here, every request it carried answered";

void kd_grpc_stream_maybe_end(struct grpc_stream *s)
{
    if (s->client_done && !s->jobs)
        kd_grpc_finish_ok(s);
    else if (s->conn->g->draining && !s->jobs) /* every answer it was owed is sent: ends the stop's wait */
        kd_grpc_finish(s, GRPC_UNAVAILABLE, "%s", kd_grpc_drain_stream_end);
}

/* ---- queueing ------------------------------------------------------------------------------- */

static void refuse(struct grpc_job *j, enum grpc_code code, const char *msg)
{
    j->code = code;
    snprintf(j->msg, sizeof j->msg, "%s", msg);
    j->done = true;
}

/* A varint at *p (before end) into *v; false when malformed. */
static bool read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80))
            return true;
    }
    return false;
}

/*
 * Walks the top-level fields of a ModelInferRequest: raw_input_contents (field 7) become views into
 * msg (in order, at most max), every other field is copied to rest. false when the message does not
 * walk cleanly or has more than max of them (the caller then unpacks it whole).
 */
static bool split_raw(const uint8_t *msg, size_t len, struct kd_buf *rest, ProtobufCBinaryData *raw, size_t *nraw,
                      size_t max)
{
    const uint8_t *p = msg, *end = msg + len;
    *nraw = 0;
    while (p < end) {
        const uint8_t *start = p;
        uint64_t tag, n;
        if (!read_varint(&p, end, &tag) || tag >> 3 == 0)
            return false;
        switch (tag & 7) {
        case 0:
            if (!read_varint(&p, end, &n))
                return false;
            break;
        case 1:
            if (end - p < 8)
                return false;
            p += 8;
            break;
        case 5:
            if (end - p < 4)
                return false;
            p += 4;
            break;
        case 2:
            if (!read_varint(&p, end, &n) || n > (uint64_t)(end - p))
                return false;
            if (tag >> 3 == 7) {
                if (*nraw == max)
                    return false;
                raw[*nraw].data = (uint8_t *)(uintptr_t)p;
                raw[(*nraw)++].len = (size_t)n;
                p += n;
                continue;
            }
            p += n;
            break;
        default: return false; /* groups: not in this message */
        }
        if (kd_buf_append(rest, start, (size_t)(p - start)) != 0)
            return false;
    }
    return true;
}

Inference__ModelInferRequest *kd_grpc_infer_unpack(const uint8_t *data, size_t len, struct kd_buf *holder,
                                                   struct kd_buf *held, ProtobufCBinaryData *views, size_t *nviews,
                                                   bool *split)
{
    struct kd_buf rest = {0};
    *nviews = 0;
    *split = holder && split_raw(data, len, &rest, views, nviews, KD_SCHED_MAX_IO);
    Inference__ModelInferRequest *q = *split ? inference__model_infer_request__unpack(
                                                   NULL, rest.len, (const uint8_t *)(rest.data ? rest.data : ""))
                                             : inference__model_infer_request__unpack(NULL, len, data);
    kd_buf_free(&rest);
    if (*split) {
        *held = *holder; /* the views point into it */
        *holder = (struct kd_buf){0};
    }
    return q;
}

void kd_grpc_infer(struct grpc_stream *s, const uint8_t *data, size_t len, struct kd_buf *holder)
{
    struct kd_serving *sv = s->conn->g->o.serving;
    struct grpc_job *j = calloc(1, sizeof *j);
    if (!j) {
        kd_grpc_finish(s, GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    j->sv = sv;
    j->s = s;
    j->streaming = s->streaming;
    j->coding = s->resp_coding;
    j->request_bytes = len;
    s->running_bytes += len;
    if (s->jobs_tail)
        s->jobs_tail->next = j;
    else
        s->jobs = j;
    s->jobs_tail = j;

    char msg[1024];
    ProtobufCBinaryData views[KD_SCHED_MAX_IO];
    size_t nviews = 0;
    bool split = false;
    Inference__ModelInferRequest *q = kd_grpc_infer_unpack(data, len, holder, &j->held, views, &nviews, &split);
    struct kd_sched_model *m = NULL;
    int64_t version = 0;
    if (!q) {
        refuse(j, GRPC_INVALID_ARGUMENT, "malformed ModelInferRequest message");
        goto out;
    }
    /* the id is echoed in every answer: as long as HTTP's may be, or refused (and not echoed) */
    size_t id_len = q->id ? strlen(q->id) : 0;
    bool id_ok = id_len <= (size_t)kd_serving_limits(sv)->max_string_bytes;
    j->id = strdup(id_ok && q->id ? q->id : "");
    if (!j->id) {
        refuse(j, GRPC_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    version = kd_serving_parse_version(q->model_version);
    if (version < 0) {
        snprintf(msg, sizeof msg, "invalid model version '%.64s': %s", q->model_version, KD_SERVING_VERSION_RULE);
        refuse(j, GRPC_INVALID_ARGUMENT, msg);
        goto out;
    }
    int status = 0;
    m = kd_serving_model(sv, q->model_name, version, &status, msg, sizeof msg);
    if (!m) {
        refuse(j, kd_grpc_code_of_http(status), msg);
        goto out;
    }
    const struct kd_serving_options *lim = kd_serving_limits(sv);
    /* checked once the model is known, as HTTP checks it in the body of a model's URL: a
     * refusal of a request to a model is counted as one */
    if (!id_ok) {
        snprintf(msg, sizeof msg, "id must be a string of at most %lld bytes (got %zu)",
                 (long long)lim->max_string_bytes, id_len);
        kd_serving_count_rejected(sv, m);
        refuse(j, GRPC_INVALID_ARGUMENT, msg);
        goto out;
    }
    /* Served while draining too: the GOAWAY sent at the drain names the last stream accepted,
     * nghttp2 refuses later ones, and a stream at or below it is one the server promised to finish. */
    const ProtobufCBinaryData *raw_in = split ? views : q->raw_input_contents;
    size_t n_raw_in = split ? nviews : q->n_raw_input_contents;
    if ((status = decode(lim, kd_sched_model_config(m), q, raw_in, n_raw_in, split, kd_serving_shm(sv), &j->shm,
                         &j->r, &j->asks, msg, sizeof msg)) != 0) {
        kd_shm_use_release(&j->shm);
        kd_serving_count_rejected(sv, m);
        refuse(j, kd_grpc_code_of_http(status), msg);
        goto out;
    }
    uint64_t now = uv_hrtime(), server_deadline = now + (uint64_t)lim->infer_timeout_ms * 1000000u;
    j->client_deadline = s->deadline_ns && s->deadline_ns < server_deadline;
    j->r.model = kd_sched_model_retain(m);
    j->r.cancelled = &j->cancelled;
    j->r.deadline_ns = j->client_deadline ? s->deadline_ns : server_deadline;
    j->r.done = job_done;
    j->r.finish = finish_on_worker;
    if (kd_serving_submit(sv, &j->r) != 0) {
        kd_sched_model_release(m);
        kd_sched_request_clear(&j->r);
        kd_shm_use_release(&j->shm);
        refuse(j, GRPC_UNAVAILABLE, "the model's queue is full; retry later");
        goto out;
    }
    j->queued = true;
out:
    if (q)
        inference__model_infer_request__free_unpacked(q, NULL);
    deliver(s);
}
