/*
 * api/grpc/grpc-methods.c — the methods of inference.GRPCInferenceService other than inference:
 * health, metadata, model configuration, statistics and the model repository, answered from
 * the same model table (api/serving.h) and under the same token scopes as the HTTP endpoints.
 *
 * Each request message is unpacked by protobuf-c (its size was checked against the limit when
 * its prefix arrived), answered with one message or a status, and freed. The system shared-memory
 * methods are in grpc-shm.c. Methods kilnd does not implement (CUDA shared memory, trace, logging)
 * answer UNIMPLEMENTED, saying so.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "grpc-impl.h"
#include "grpc_service.pb-c.h"

#define SERVICE "/inference.GRPCInferenceService/"
#define MAX_VERSIONS 16

/* 0 when the call may go on with scope need; otherwise it is finished with the status. */
static int authorize(struct grpc_stream *s, enum kd_auth_scope need)
{
    struct kd_serving *sv = s->conn->g->o.serving;
    switch (kd_auth_check(sv ? kd_serving_auth(sv) : NULL, s->authorization ? s->authorization : "", need)) {
    case KD_AUTH_ALLOWED: return 0;
    case KD_AUTH_MISSING:
        kd_grpc_finish(s, GRPC_UNAUTHENTICATED, "this call needs \"authorization: Bearer <token>\" metadata");
        return -1;
    case KD_AUTH_NOT_BEARER:
    case KD_AUTH_UNKNOWN: kd_grpc_finish(s, GRPC_UNAUTHENTICATED, "invalid bearer token"); return -1;
    case KD_AUTH_INSUFFICIENT: break;
    }
    kd_grpc_finish(s, GRPC_PERMISSION_DENIED, "this token lacks the admin scope");
    return -1;
}

static void reply_or_fail(struct grpc_stream *s, const ProtobufCMessage *m)
{
    if (kd_grpc_reply(s, m) != 0)
        kd_grpc_finish(s, GRPC_RESOURCE_EXHAUSTED, "out of memory for the response");
    else
        kd_grpc_finish_ok(s);
}

/* The model a request names, or NULL with the call finished. */
static struct kd_sched_model *model_for(struct grpc_stream *s, const char *name, const char *version)
{
    struct kd_serving *sv = s->conn->g->o.serving;
    int64_t v = kd_serving_parse_version(version);
    if (v < 0) {
        kd_grpc_finish(s, GRPC_INVALID_ARGUMENT, "invalid model version '%.64s': %s", version,
                       KD_SERVING_VERSION_RULE);
        return NULL;
    }
    int status = 0;
    char msg[1024];
    struct kd_sched_model *m = kd_serving_model(sv, name ? name : "", v, &status, msg, sizeof msg);
    if (!m)
        kd_grpc_finish(s, kd_grpc_code_of_http(status), "%s", msg);
    return m;
}

/* ---- health and metadata ---------------------------------------------------------------- */

static void server_live(struct grpc_stream *s)
{
    Inference__ServerLiveResponse r = INFERENCE__SERVER_LIVE_RESPONSE__INIT;
    r.live = 1;
    reply_or_fail(s, &r.base);
}

static void server_ready(struct grpc_stream *s)
{
    struct kd_serving *sv = s->conn->g->o.serving;
    Inference__ServerReadyResponse r = INFERENCE__SERVER_READY_RESPONSE__INIT;
    /* as /v2/health/ready: not before the models found at start have finished loading */
    r.ready = sv && kd_serving_accepting(sv) && !s->conn->g->draining && kd_serving_startup_loads(sv) == 0;
    reply_or_fail(s, &r.base);
}

static void model_ready(struct grpc_stream *s, const Inference__ModelReadyRequest *q)
{
    struct kd_serving *sv = s->conn->g->o.serving;
    int64_t v = kd_serving_parse_version(q->version);
    if (v < 0) { /* as HTTP's .../versions/abc/ready: a malformed version is the caller's error */
        kd_grpc_finish(s, GRPC_INVALID_ARGUMENT, "invalid model version '%.64s': %s", q->version,
                       KD_SERVING_VERSION_RULE);
        return;
    }
    int status = 0;
    char msg[1024];
    Inference__ModelReadyResponse r = INFERENCE__MODEL_READY_RESPONSE__INIT;
    r.ready = v >= 0 && kd_serving_model(sv, q->name, v, &status, msg, sizeof msg) && kd_serving_accepting(sv);
    reply_or_fail(s, &r.base);
}

static void server_metadata(struct grpc_stream *s)
{
    const char *const *ext = s->conn->g->o.extensions;
    size_t n = 0;
    while (ext && ext[n])
        n++;
    Inference__ServerMetadataResponse r = INFERENCE__SERVER_METADATA_RESPONSE__INIT;
    r.name = "kiln";
    r.version = KILN_VERSION;
    r.n_extensions = n;
    r.extensions = (char **)ext;
    reply_or_fail(s, &r.base);
}

static Inference__ModelMetadataResponse__TensorMetadata *tensor_meta(const kd_model_tensor_spec *sp, int n)
{
    Inference__ModelMetadataResponse__TensorMetadata *t = calloc((size_t)n + 1, sizeof *t);
    for (int i = 0; t && i < n; i++) {
        inference__model_metadata_response__tensor_metadata__init(&t[i]);
        t[i].name = sp[i].name;
        t[i].datatype = sp[i].datatype;
        t[i].n_shape = (size_t)sp[i].ndim;
        t[i].shape = (int64_t *)sp[i].shape;
    }
    return t;
}

/* An array of pointers to n consecutive elements of size each, from base (for repeated fields). */
static void **pointers_to(void *base, size_t size, size_t n)
{
    void **p = calloc(n + 1, sizeof *p);
    for (size_t i = 0; p && i < n; i++)
        p[i] = (char *)base + i * size;
    return p;
}

static void model_metadata(struct grpc_stream *s, const Inference__ModelMetadataRequest *q)
{
    struct kd_sched_model *m = model_for(s, q->name, q->version);
    if (!m)
        return;
    struct kd_sched_model *vs[MAX_VERSIONS];
    int nv = kd_serving_versions(s->conn->g->o.serving, q->name, vs, MAX_VERSIONS);
    char vtext[MAX_VERSIONS][24];
    char *vptr[MAX_VERSIONS];
    for (int i = 0; i < nv; i++) {
        snprintf(vtext[i], sizeof vtext[i], "%lld", (long long)kd_sched_model_version(vs[i]));
        vptr[i] = vtext[i];
    }
    const kd_model_config *c = kd_sched_model_config(m);
    Inference__ModelMetadataResponse r = INFERENCE__MODEL_METADATA_RESPONSE__INIT;
    r.name = q->name;
    r.n_versions = (size_t)nv;
    r.versions = vptr;
    r.platform = (char *)kd_sched_model_format(m);
    Inference__ModelMetadataResponse__TensorMetadata *in = tensor_meta(c->inputs, c->ninputs);
    Inference__ModelMetadataResponse__TensorMetadata *out = tensor_meta(c->outputs, c->noutputs);
    r.n_inputs = (size_t)c->ninputs;
    r.inputs = (void *)pointers_to(in, sizeof *in, r.n_inputs);
    r.n_outputs = (size_t)c->noutputs;
    r.outputs = (void *)pointers_to(out, sizeof *out, r.n_outputs);
    if (in && out && r.inputs && r.outputs)
        reply_or_fail(s, &r.base);
    else
        kd_grpc_finish(s, GRPC_RESOURCE_EXHAUSTED, "out of memory for the response");
    free(in);
    free(out);
    free(r.inputs);
    free(r.outputs);
}

/* ---- configuration and statistics ----------------------------------------------------------- */

static Inference__DataType data_type_of(const char *datatype)
{
    char name[40];
    snprintf(name, sizeof name, "TYPE_%s", datatype);
    const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value_by_name(&inference__data_type__descriptor,
                                                                               name);
    return v ? (Inference__DataType)v->value : INFERENCE__DATA_TYPE__TYPE_INVALID;
}

static void model_config(struct grpc_stream *s, const Inference__ModelConfigRequest *q)
{
    struct kd_sched_model *m = model_for(s, q->name, q->version);
    if (!m)
        return;
    const kd_model_config *c = kd_sched_model_config(m);
    bool batched = c->max_batch_size > 0;
    int skip = batched ? 1 : 0; /* Triton's dims leave the batch dim out when the model batches */
    char filename[32];
    snprintf(filename, sizeof filename, "model.%s", kd_sched_model_format(m));
    Inference__ModelConfig mc = INFERENCE__MODEL_CONFIG__INIT;
    mc.name = q->name;
    mc.platform = (char *)kd_sched_model_format(m);
    mc.backend = "kiln";
    mc.max_batch_size = batched ? c->max_batch_size : 0;
    mc.default_model_filename = filename;
    Inference__ModelInput *in = calloc((size_t)c->ninputs + 1, sizeof *in);
    Inference__ModelOutput *out = calloc((size_t)c->noutputs + 1, sizeof *out);
    for (int i = 0; in && i < c->ninputs; i++) {
        inference__model_input__init(&in[i]);
        in[i].name = c->inputs[i].name;
        in[i].data_type = data_type_of(c->inputs[i].datatype);
        in[i].n_dims = (size_t)(c->inputs[i].ndim > skip ? c->inputs[i].ndim - skip : 0);
        in[i].dims = (int64_t *)c->inputs[i].shape + skip;
    }
    for (int i = 0; out && i < c->noutputs; i++) {
        inference__model_output__init(&out[i]);
        out[i].name = c->outputs[i].name;
        out[i].data_type = data_type_of(c->outputs[i].datatype);
        out[i].n_dims = (size_t)(c->outputs[i].ndim > skip ? c->outputs[i].ndim - skip : 0);
        out[i].dims = (int64_t *)c->outputs[i].shape + skip;
        if (c->outputs[i].label_filename)
            out[i].label_filename = c->outputs[i].label_filename;
    }
    mc.n_input = (size_t)c->ninputs;
    mc.input = (void *)pointers_to(in, sizeof *in, mc.n_input);
    mc.n_output = (size_t)c->noutputs;
    mc.output = (void *)pointers_to(out, sizeof *out, mc.n_output);
    Inference__ModelDynamicBatching db = INFERENCE__MODEL_DYNAMIC_BATCHING__INIT;
    int32_t preferred[16];
    if (batched) {
        for (int i = 0; i < c->npreferred && i < 16; i++)
            preferred[i] = (int32_t)c->preferred_batch_sizes[i];
        db.n_preferred_batch_size = (size_t)(c->npreferred < 16 ? c->npreferred : 16);
        db.preferred_batch_size = preferred;
        db.max_queue_delay_microseconds = (uint64_t)c->max_queue_delay_us;
        mc.scheduling_choice_case = INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE_DYNAMIC_BATCHING;
        mc.dynamic_batching = &db;
    }
    /* The version policy and instance group, as model-json.c shows them over HTTP. */
    Inference__ModelVersionPolicy vp = INFERENCE__MODEL_VERSION_POLICY__INIT;
    Inference__ModelVersionPolicy__Latest latest = INFERENCE__MODEL_VERSION_POLICY__LATEST__INIT;
    Inference__ModelVersionPolicy__All all = INFERENCE__MODEL_VERSION_POLICY__ALL__INIT;
    Inference__ModelVersionPolicy__Specific specific = INFERENCE__MODEL_VERSION_POLICY__SPECIFIC__INIT;
    if (c->policy == KD_VERSION_ALL) {
        vp.policy_choice_case = INFERENCE__MODEL_VERSION_POLICY__POLICY_CHOICE_ALL;
        vp.all = &all;
    } else if (c->policy == KD_VERSION_SPECIFIC) {
        specific.n_versions = (size_t)c->nspecific;
        specific.versions = c->specific;
        vp.policy_choice_case = INFERENCE__MODEL_VERSION_POLICY__POLICY_CHOICE_SPECIFIC;
        vp.specific = &specific;
    } else {
        latest.num_versions = (uint32_t)(c->latest_n > 0 ? c->latest_n : 1);
        vp.policy_choice_case = INFERENCE__MODEL_VERSION_POLICY__POLICY_CHOICE_LATEST;
        vp.latest = &latest;
    }
    mc.version_policy = &vp;
    const char *dev = c->device && c->device[0] ? c->device : "cpu";
    const char *colon = strchr(dev, ':');
    bool cpu = strncmp(dev, "cpu", 3) == 0;
    char group_name[KD_MODEL_NAME_MAX + 8];
    snprintf(group_name, sizeof group_name, "%s_0", q->name);
    int32_t gpu = colon ? atoi(colon + 1) : 0;
    Inference__ModelInstanceGroup ig = INFERENCE__MODEL_INSTANCE_GROUP__INIT, *igp = &ig;
    ig.name = group_name;
    ig.kind = cpu ? INFERENCE__MODEL_INSTANCE_GROUP__KIND__KIND_CPU
                  : INFERENCE__MODEL_INSTANCE_GROUP__KIND__KIND_GPU;
    ig.count = c->instance_count > 0 ? c->instance_count : 1;
    ig.n_gpus = cpu ? 0 : 1;
    ig.gpus = &gpu;
    mc.n_instance_group = 1;
    mc.instance_group = &igp;
    Inference__ModelConfigResponse r = INFERENCE__MODEL_CONFIG_RESPONSE__INIT;
    r.config = &mc;
    if (in && out && mc.input && mc.output)
        reply_or_fail(s, &r.base);
    else
        kd_grpc_finish(s, GRPC_RESOURCE_EXHAUSTED, "out of memory for the response");
    free(in);
    free(out);
    free(mc.input);
    free(mc.output);
}

/* One version's statistics, as model-json.c's kd_serving_stats_json shows them over HTTP. */
struct stats_msg {
    Inference__ModelStatistics ms;
    Inference__InferStatistics is;
    Inference__StatisticDuration d[8];
    Inference__InferBatchStatistics b[KD_SCHED_BATCH_SIZES];
    Inference__StatisticDuration bd[KD_SCHED_BATCH_SIZES][3];
    Inference__InferBatchStatistics *bp[KD_SCHED_BATCH_SIZES];
    char version[24];
};

static void fill_stats(struct stats_msg *x, struct kd_sched_model *m)
{
    struct kd_sched_stats st;
    kd_sched_model_stats(m, &st);
    inference__model_statistics__init(&x->ms);
    inference__infer_statistics__init(&x->is);
    for (int i = 0; i < 8; i++)
        inference__statistic_duration__init(&x->d[i]);
    snprintf(x->version, sizeof x->version, "%lld", (long long)kd_sched_model_version(m));
    x->ms.name = (char *)kd_sched_model_name(m);
    x->ms.version = x->version;
    x->ms.last_inference = st.last_inference_ms;
    x->ms.inference_count = st.inference_count;
    x->ms.execution_count = st.execution_count;
    x->d[0] = (Inference__StatisticDuration){x->d[0].base, st.success_count, st.success_ns};
    x->d[1] = (Inference__StatisticDuration){x->d[1].base, st.fail_count, st.fail_ns};
    x->d[2] = (Inference__StatisticDuration){x->d[2].base, st.queue_count, st.queue_ns};
    x->d[3] = (Inference__StatisticDuration){x->d[3].base, st.compute_count, 0};
    x->d[4] = (Inference__StatisticDuration){x->d[4].base, st.compute_count, st.compute_request_ns};
    x->d[5] = (Inference__StatisticDuration){x->d[5].base, st.compute_count, 0};
    x->is.success = &x->d[0];
    x->is.fail = &x->d[1];
    x->is.queue = &x->d[2];
    x->is.compute_input = &x->d[3];
    x->is.compute_infer = &x->d[4];
    x->is.compute_output = &x->d[5];
    x->is.cache_hit = &x->d[6];
    x->is.cache_miss = &x->d[7];
    x->ms.inference_stats = &x->is;
    size_t nb = 0;
    for (int i = 0; i < st.nbatches; i++) {
        /* Runs by their exact batch size, as over HTTP */
        Inference__InferBatchStatistics *b = &x->b[nb];
        inference__infer_batch_statistics__init(b);
        for (int k = 0; k < 3; k++)
            inference__statistic_duration__init(&x->bd[nb][k]);
        x->bd[nb][1].count = st.batches[i].count;
        x->bd[nb][1].ns = st.batches[i].compute_ns;
        b->batch_size = (uint64_t)st.batches[i].size;
        b->compute_input = &x->bd[nb][0];
        b->compute_infer = &x->bd[nb][1];
        b->compute_output = &x->bd[nb][2];
        x->bp[nb++] = b;
    }
    x->ms.n_batch_stats = nb;
    x->ms.batch_stats = x->bp;
}

struct model_list {
    struct kd_sched_model **m;
    size_t n, cap;
    bool oom;
};

static void add_model(struct model_list *t, struct kd_sched_model *m)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 8;
        struct kd_sched_model **r = realloc(t->m, cap * sizeof *r);
        if (!r) {
            t->oom = true;
            return;
        }
        t->m = r;
        t->cap = cap;
    }
    t->m[t->n++] = m;
}

static void add_loaded(void *ud, struct kd_sched_model *m)
{
    add_model(ud, m);
}

static void model_statistics(struct grpc_stream *s, const Inference__ModelStatisticsRequest *q)
{
    struct kd_serving *sv = s->conn->g->o.serving;
    struct model_list t = {0};
    if (q->name && q->name[0]) {
        if (!model_for(s, q->name, q->version))
            return;
        int64_t want = kd_serving_parse_version(q->version);
        struct kd_sched_model *vs[MAX_VERSIONS];
        int nv = kd_serving_versions(sv, q->name, vs, MAX_VERSIONS);
        for (int i = 0; i < nv; i++)
            if (!want || kd_sched_model_version(vs[i]) == want)
                add_model(&t, vs[i]);
    } else {
        kd_serving_each_loaded(sv, add_loaded, &t);
    }
    struct stats_msg *rows = calloc(t.n + 1, sizeof *rows);
    Inference__ModelStatistics **ptrs = calloc(t.n + 1, sizeof *ptrs);
    for (size_t i = 0; rows && ptrs && i < t.n; i++) {
        fill_stats(&rows[i], t.m[i]);
        ptrs[i] = &rows[i].ms;
    }
    Inference__ModelStatisticsResponse r = INFERENCE__MODEL_STATISTICS_RESPONSE__INIT;
    r.n_model_stats = t.n;
    r.model_stats = ptrs;
    if (!t.oom && rows && ptrs)
        reply_or_fail(s, &r.base);
    else
        kd_grpc_finish(s, GRPC_RESOURCE_EXHAUSTED, "out of memory for the response");
    free(t.m);
    free(rows);
    free(ptrs);
}

/* ---- the model repository ------------------------------------------------------------------- */

struct index_rows {
    Inference__RepositoryIndexResponse__ModelIndex *rows;
    size_t n, cap;
    struct kd_buf text; /* the rows' strings, NUL-separated; offsets until the end */
    bool oom;
};

static size_t keep_text(struct index_rows *t, const char *s)
{
    size_t at = t->text.len;
    if (kd_buf_append(&t->text, s, strlen(s) + 1) != 0)
        t->oom = true;
    return at;
}

static void index_row(void *ud, const char *name, int64_t version, const char *state, const char *why)
{
    struct index_rows *t = ud;
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        void *r = realloc(t->rows, cap * sizeof *t->rows);
        if (!r) {
            t->oom = true;
            return;
        }
        t->rows = r;
        t->cap = cap;
    }
    Inference__RepositoryIndexResponse__ModelIndex *row = &t->rows[t->n++];
    inference__repository_index_response__model_index__init(row);
    char v[24] = "";
    if (version > 0)
        snprintf(v, sizeof v, "%lld", (long long)version);
    /* offsets now; pointers once the text has stopped moving */
    row->name = (char *)(uintptr_t)keep_text(t, name);
    row->version = (char *)(uintptr_t)keep_text(t, v);
    row->state = (char *)(uintptr_t)keep_text(t, state);
    row->reason = (char *)(uintptr_t)keep_text(t, why);
}

static void repository_index(struct grpc_stream *s, const Inference__RepositoryIndexRequest *q)
{
    struct index_rows t = {0};
    kd_serving_index(s->conn->g->o.serving, q->ready, index_row, &t);
    Inference__RepositoryIndexResponse__ModelIndex **ptrs = calloc(t.n + 1, sizeof *ptrs);
    for (size_t i = 0; ptrs && !t.oom && i < t.n; i++) {
        Inference__RepositoryIndexResponse__ModelIndex *row = &t.rows[i];
        row->name = t.text.data + (uintptr_t)row->name;
        row->version = t.text.data + (uintptr_t)row->version;
        row->state = t.text.data + (uintptr_t)row->state;
        row->reason = t.text.data + (uintptr_t)row->reason;
        ptrs[i] = row;
    }
    Inference__RepositoryIndexResponse r = INFERENCE__REPOSITORY_INDEX_RESPONSE__INIT;
    r.n_models = t.n;
    r.models = ptrs;
    if (ptrs && !t.oom)
        reply_or_fail(s, &r.base);
    else
        kd_grpc_finish(s, GRPC_RESOURCE_EXHAUSTED, "out of memory for the response");
    free(ptrs);
    free(t.rows);
    kd_buf_free(&t.text);
}

static void load_done(void *ud, int status, const char *msg)
{
    struct grpc_load *ld = ud;
    struct grpc_stream *s = ld->s;
    free(ld);
    if (!s)
        return; /* the client left; the load went on */
    s->load = NULL;
    if (status == 200) {
        Inference__RepositoryModelLoadResponse r = INFERENCE__REPOSITORY_MODEL_LOAD_RESPONSE__INIT;
        reply_or_fail(s, &r.base);
    } else {
        kd_grpc_finish(s, kd_grpc_code_of_http(status), "%s", msg ? msg : "load failed");
    }
    kd_grpc_flush(s->conn);
}

static void model_load(struct grpc_stream *s, const Inference__RepositoryModelLoadRequest *q)
{
    /* As over HTTP: a configuration or files sent with the load are refused, not ignored. */
    for (size_t i = 0; i < q->n_parameters; i++) {
        const char *k = q->parameters[i]->key ? q->parameters[i]->key : "";
        if (strcmp(k, "config") == 0 || strncmp(k, "file:", 5) == 0) {
            kd_grpc_finish(s, GRPC_UNIMPLEMENTED,
                           "kilnd does not take a model configuration or files with a load request: put "
                           "config.json and the model file in the model's repository folder, then load");
            return;
        }
    }
    struct grpc_load *ld = calloc(1, sizeof *ld);
    if (!ld) {
        kd_grpc_finish(s, GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    ld->s = s;
    s->load = ld;
    char msg[1024];
    int st = kd_serving_load(s->conn->g->o.serving, q->model_name ? q->model_name : "", 0, load_done, ld, msg,
                             sizeof msg);
    if (st != 0) {
        s->load = NULL;
        free(ld);
        kd_grpc_finish(s, kd_grpc_code_of_http(st), "%s", msg);
    }
}

static void model_unload(struct grpc_stream *s, const Inference__RepositoryModelUnloadRequest *q)
{
    char msg[1024];
    int st = kd_serving_unload(s->conn->g->o.serving, q->model_name ? q->model_name : "", msg, sizeof msg);
    if (st != 0) {
        kd_grpc_finish(s, kd_grpc_code_of_http(st), "%s", msg);
        return;
    }
    Inference__RepositoryModelUnloadResponse r = INFERENCE__REPOSITORY_MODEL_UNLOAD_RESPONSE__INIT;
    reply_or_fail(s, &r.base);
}

/* ---- dispatch ------------------------------------------------------------------------------- */

enum method {
    M_LIVE,
    M_READY,
    M_MODEL_READY,
    M_SERVER_META,
    M_MODEL_META,
    M_INFER,
    M_STREAM_INFER,
    M_CONFIG,
    M_STATS,
    M_INDEX,
    M_LOAD,
    M_UNLOAD,
    M_SHM_STATUS,
    M_SHM_REGISTER,
    M_SHM_UNREGISTER,
    M_COUNT
};

static const struct {
    const char *name;
    const ProtobufCMessageDescriptor *request;
    enum kd_auth_scope scope;
} methods[M_COUNT] = {
    [M_LIVE] = {"ServerLive", &inference__server_live_request__descriptor, KD_AUTH_NONE},
    [M_READY] = {"ServerReady", &inference__server_ready_request__descriptor, KD_AUTH_NONE},
    [M_MODEL_READY] = {"ModelReady", &inference__model_ready_request__descriptor, KD_AUTH_READ},
    [M_SERVER_META] = {"ServerMetadata", &inference__server_metadata_request__descriptor, KD_AUTH_READ},
    [M_MODEL_META] = {"ModelMetadata", &inference__model_metadata_request__descriptor, KD_AUTH_READ},
    [M_INFER] = {"ModelInfer", NULL, KD_AUTH_READ},
    [M_STREAM_INFER] = {"ModelStreamInfer", NULL, KD_AUTH_READ},
    [M_CONFIG] = {"ModelConfig", &inference__model_config_request__descriptor, KD_AUTH_READ},
    [M_STATS] = {"ModelStatistics", &inference__model_statistics_request__descriptor, KD_AUTH_READ},
    [M_INDEX] = {"RepositoryIndex", &inference__repository_index_request__descriptor, KD_AUTH_READ},
    [M_LOAD] = {"RepositoryModelLoad", &inference__repository_model_load_request__descriptor, KD_AUTH_ADMIN},
    [M_UNLOAD] = {"RepositoryModelUnload", &inference__repository_model_unload_request__descriptor, KD_AUTH_ADMIN},
    [M_SHM_STATUS] = {"SystemSharedMemoryStatus", &inference__system_shared_memory_status_request__descriptor,
                      KD_AUTH_READ},
    [M_SHM_REGISTER] = {"SystemSharedMemoryRegister",
                        &inference__system_shared_memory_register_request__descriptor, KD_AUTH_ADMIN},
    [M_SHM_UNREGISTER] = {"SystemSharedMemoryUnregister",
                          &inference__system_shared_memory_unregister_request__descriptor, KD_AUTH_ADMIN},
};

static int method_of(const char *path)
{
    if (strncmp(path, SERVICE, sizeof SERVICE - 1) != 0)
        return -1;
    for (int i = 0; i < M_COUNT; i++)
        if (strcmp(path + sizeof SERVICE - 1, methods[i].name) == 0)
            return i;
    return -1;
}

bool kd_grpc_is_streaming(const char *path)
{
    return method_of(path) == M_STREAM_INFER;
}

_Static_assert(M_COUNT < KD_GRPC_METHOD_SLOTS, "a call-metrics slot for every method, and one for the rest");

int kd_grpc_method_slot(const char *path, const char **label)
{
    int m = method_of(path);
    *label = m < 0 ? "other" : methods[m].name;
    return m < 0 ? KD_GRPC_METHOD_SLOTS - 1 : m;
}

bool kd_grpc_refuse_unknown_method(struct grpc_stream *s)
{
    if (method_of(s->path) >= 0)
        return false;
    bool ours = strncmp(s->path, SERVICE, sizeof SERVICE - 1) == 0;
    bool cuda = ours && strncmp(s->path + sizeof SERVICE - 1, "CudaSharedMemory", 16) == 0;
    kd_grpc_finish(s, GRPC_UNIMPLEMENTED,
                   cuda   ? "kilnd does not implement %s: CUDA shared memory is not served; use system "
                            "shared memory or send tensors in the request"
                   : ours ? "kilnd does not implement %s (trace and logging are not served over gRPC)"
                          : "unknown service or method %s",
                   s->path);
    return true;
}

void kd_grpc_dispatch(struct grpc_stream *s, const uint8_t *msg, size_t len, struct kd_buf *holder)
{
    if (kd_grpc_refuse_unknown_method(s)) /* refused at the headers already, unless fed otherwise */
        return;
    int m = method_of(s->path);
    if (methods[m].scope != KD_AUTH_NONE && authorize(s, methods[m].scope) != 0)
        return;
    const ProtobufCMessageDescriptor *desc = methods[m].request ? methods[m].request
                                                                : &inference__model_infer_request__descriptor;
    if ((m == M_INFER || m == M_STREAM_INFER) && s->conn->g->o.serving) {
        kd_grpc_infer(s, msg, len, holder);
        return;
    }
    ProtobufCMessage *q;
    struct kd_buf held = {0};
    if (m == M_INFER || m == M_STREAM_INFER) {
        /* no model table (the fuzzer's service): still walked and unpacked as ModelInfer does */
        ProtobufCBinaryData views[KD_SCHED_MAX_IO];
        size_t nviews;
        bool split;
        Inference__ModelInferRequest *iq = kd_grpc_infer_unpack(msg, len, holder, &held, views, &nviews, &split);
        q = iq ? &iq->base : NULL;
        kd_buf_free(&held);
    } else {
        q = protobuf_c_message_unpack(desc, NULL, len, msg);
    }
    if (!q) {
        kd_grpc_finish(s, GRPC_INVALID_ARGUMENT, "malformed %s request message", methods[m].name);
        return;
    }
    if ((methods[m].scope != KD_AUTH_NONE || m == M_READY) && !s->conn->g->o.serving) {
        /* no model table (the fuzzer's service): the message was still decoded */
        kd_grpc_finish(s, GRPC_UNAVAILABLE, "no model table is being served");
        protobuf_c_message_free_unpacked(q, NULL);
        return;
    }
    switch ((enum method)m) {
    case M_LIVE: server_live(s); break;
    case M_READY: server_ready(s); break;
    case M_MODEL_READY: model_ready(s, (const Inference__ModelReadyRequest *)q); break;
    case M_SERVER_META: server_metadata(s); break;
    case M_MODEL_META: model_metadata(s, (const Inference__ModelMetadataRequest *)q); break;
    case M_CONFIG: model_config(s, (const Inference__ModelConfigRequest *)q); break;
    case M_STATS: model_statistics(s, (const Inference__ModelStatisticsRequest *)q); break;
    case M_INDEX: repository_index(s, (const Inference__RepositoryIndexRequest *)q); break;
    case M_LOAD: model_load(s, (const Inference__RepositoryModelLoadRequest *)q); break;
    case M_UNLOAD: model_unload(s, (const Inference__RepositoryModelUnloadRequest *)q); break;
    case M_SHM_STATUS: kd_grpc_shm_status(s, (const Inference__SystemSharedMemoryStatusRequest *)q); break;
    case M_SHM_REGISTER: kd_grpc_shm_register(s, (const Inference__SystemSharedMemoryRegisterRequest *)q); break;
    case M_SHM_UNREGISTER:
        kd_grpc_shm_unregister(s, (const Inference__SystemSharedMemoryUnregisterRequest *)q);
        break;
    default: kd_grpc_finish(s, GRPC_INTERNAL, "unreachable method"); break;
    }
    protobuf_c_message_free_unpacked(q, NULL);
}
