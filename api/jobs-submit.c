/*
 * api/jobs-submit.c — POST /v1/jobs: the spec checked whole before it is stored, so that a job
 * that is queued can run.
 *
 * Two steps. On the loop: the spec is parsed (JSON, keys given twice, ranges, paths, the job a
 * resume continues), which only reads the body and the file system. Then, on libuv's thread
 * pool, what a spec needs to run at all (kd_jobspec_check_runnable: its device opens, its JSON
 * model builds once on the ref device), and what would otherwise only fail once it has trained:
 * the checkpoint resume_from_job names is not past its epochs and holds its model, and a job that
 * registers a model can write to the repository. Those can take long — a large model's
 * initialisation, a GPU's first context, a remote device's connection — and the loop serves every
 * other client meanwhile, so the response is deferred and written when the check is back on the
 * loop, where the job is stored and queued.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "jobs-impl.h"
#include "kiln/nn.h"

/*
 * resume_from_job at submission: the job must exist and have a checkpoint, or the new job would
 * start from step 0 while its spec says it continues (the run fails it if the checkpoint has gone
 * by the time it starts, rather than starting over).
 */
static int resumable(void *ud, int64_t id, char *why, size_t len)
{
    struct kd_jobs *j = ud;
    struct kd_job job;
    char err[256];
    kd_jobs_store_lock(j);
    int rc = kd_jobstore_job_get(j->o.store, id, &job, err, sizeof err);
    kd_jobs_store_unlock(j);
    if (rc == KD_JOBSTORE_NOT_FOUND)
        return snprintf(why, len, "%lld: there is no job %lld", (long long)id, (long long)id), -1;
    if (rc != 0)
        return snprintf(why, len, "%lld: job store: %s", (long long)id, err), -1;
    kd_jobstore_job_clear(&job);
    if (!kd_jobs_has_checkpoint(j, id))
        return snprintf(why, len, "%lld: job %lld has no checkpoint to resume from", (long long)id, (long long)id),
               -1;
    return 0;
}

/* The 400 body for problem lines ("field: message\n..."): {"error": the first, "problems": all}.
 * Consumes problems (its newlines are cut). NULL when out of memory. */
static char *problems_body(char *problems)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *list = cJSON_AddArrayToObject(o, "problems");
    char first[600] = "";
    for (char *line = problems, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        if (!first[0])
            snprintf(first, sizeof first, "%.500s", line);
        cJSON_AddItemToArray(list, cJSON_CreateString(line));
    }
    int np = cJSON_GetArraySize(list);
    char msg[700];
    snprintf(msg, sizeof msg, "invalid job spec: %s%s", first, np > 1 ? " (and more, see problems)" : "");
    cJSON_AddStringToObject(o, "error", msg);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

/* Store and queue the checked spec (body; resumes: its resume_from_job, 0 for none): 201 {"id",
 * "state"} into out, or an error. */
static int store_job(struct kd_jobs *j, const char *body, int64_t resumes, struct kd_buf *out, bool keep_alive)
{
    int64_t id = 0;
    char err[256];
    int rc = kd_jobs_create(j, body, resumes, &id, err, sizeof err);
    if (rc != 0) {
        /* the job it resumes from was purged while the spec was checked */
        bool gone = rc == KD_JOBSTORE_NOT_FOUND;
        char msg[320];
        snprintf(msg, sizeof msg, "%s: %s", gone ? "invalid job spec: resume_from_job" : "job store", err);
        int status = gone ? 400 : kd_jobs_store_status(rc, 500);
        if (!gone)
            kd_jobs_log(j, status == 507 ? KD_LOG_WARN : KD_LOG_ERROR, "/v1/jobs: %d %s", status, msg);
        return out ? kd_resp_error(out, status, msg, keep_alive, NULL) : status;
    }
    kd_jobs_emit_state(j, id, KD_JOB_QUEUED, NULL, NULL, NULL);
    /* said before the training thread is woken, or its "starts" (or "failed") came first */
    if (resumes > 0)
        kd_jobs_log(j, KD_LOG_INFO, "job %lld queued, to resume from job %lld's checkpoints", (long long)id,
                    (long long)resumes);
    else
        kd_jobs_log(j, KD_LOG_INFO, "job %lld queued", (long long)id);
    pthread_mutex_lock(&j->mu);
    j->queued_seq++;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (!out)
        return 201;
    char text[96];
    snprintf(text, sizeof text, "{\"id\":%lld,\"state\":\"%s\"}", (long long)id, KD_JOB_QUEUED);
    return kd_resp_append(out, 201, "application/json", text, strlen(text), keep_alive, NULL);
}

/* ---- what the pool checks besides kd_jobspec_check_runnable --------------------------------- */

/* One more "field: problem" line, in the form kd_jobspec_check_runnable writes them. */
static void add_problem(char *problems, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void add_problem(char *problems, size_t len, const char *fmt, ...)
{
    size_t used = strlen(problems);
    if (used + 2 >= len)
        return;
    if (used)
        problems[used++] = '\n';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(problems + used, len - used, fmt, ap);
    va_end(ap);
}

/* why = the formatted reason; -1. */
static int refuse(char *why, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int refuse(char *why, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
    return -1;
}

/* The newest checkpoint of job id whose manifest is valid (the one a run resumes from unless its
 * files turn out damaged): its folder into path and its epoch; false when there is none. */
static bool newest_checkpoint(const char *data_dir, int64_t id, char *path, size_t len, int64_t *epoch)
{
    char *dir = kd_jobs_path(data_dir, "checkpoints/job-%lld", (long long)id);
    kiln_ckpt_info *list = NULL;
    int n = 0;
    bool found = false;
    if (kd_jobs_dir_exists(dir) && kiln_ckpt_list(dir, false, NULL, &list, &n) == 0) {
        for (int i = n - 1; i >= 0 && !found; i--) /* oldest step first */
            if (list[i].valid) {
                found = true;
                snprintf(path, len, "%s", list[i].path);
                *epoch = list[i].epoch;
            }
        kiln_ckpt_list_free(list, n);
    }
    free(dir);
    return found;
}

static char *read_text(const char *path)
{
    FILE *f = path ? fopen(path, "rb") : NULL;
    char *text = NULL;
    long n = f && fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (text = malloc((size_t)n + 1)) != NULL) {
        if (fread(text, 1, (size_t)n, f) != (size_t)n) {
            free(text);
            text = NULL;
        } else {
            text[n] = '\0';
        }
    }
    if (f)
        fclose(f);
    return text;
}

/* The modules that draw random numbers, as the checkpoint's metrics.json names them (the
 * Learner's resume refuses a model whose modules differ): 0 when they match the model's or the
 * checkpoint names none, -1 with why. */
static int same_generators(kiln_module *m, const char *ckpt, char *why, size_t len)
{
    char *path = kd_jobs_path(ckpt, "%s", "metrics.json");
    char *text = read_text(path);
    free(path);
    cJSON *pos = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *names = cJSON_GetObjectItemCaseSensitive(pos, "generators");
    int ng = kiln_module_generators(m, NULL, NULL, 0), rc = 0;
    const char **mine = calloc((size_t)ng + 1, sizeof *mine);
    if (cJSON_IsArray(names) && mine) {
        kiln_module_generators(m, NULL, mine, ng);
        if (cJSON_GetArraySize(names) != ng)
            rc = refuse(why, len, "the checkpoint holds the random generators of %d modules, the model has %d",
                        cJSON_GetArraySize(names), ng);
        for (int i = 0; rc == 0 && i < ng; i++) {
            const cJSON *name = cJSON_GetArrayItem(names, i);
            if (!cJSON_IsString(name) || strcmp(name->valuestring, mine[i]) != 0)
                rc = refuse(why, len, "the checkpoint's module '%.100s' is '%.100s' in the model",
                            cJSON_IsString(name) ? name->valuestring : "?", mine[i]);
        }
    }
    free(mine);
    cJSON_Delete(pos);
    return rc;
}

/* "[4, 16]" */
static void shape_text(int ndim, const int64_t *shape, char *out, size_t len)
{
    size_t used = (size_t)snprintf(out, len, "[");
    for (int d = 0; d < ndim && used < len; d++)
        used += (size_t)snprintf(out + used, len - used, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (used < len)
        snprintf(out + used, len - used, "]");
}

/*
 * Whether the checkpoint in folder ckpt fits the JSON model: the tensors the Learner's resume
 * loads (each name, each shape) and the modules with random generators. The model is built once
 * on the ref device, as kd_jobspec_check_runnable does; the checkpoint's model record is read by
 * its header only. 0 when it fits or cannot be told here (the run then checks), -1 with why.
 */
static int model_fits(const char *model_json, const char *ckpt, char *why, size_t len)
{
    char *path = kd_jobs_path(ckpt, "%s", "model.kiln");
    kiln_record *rec = path ? kiln_record_open(path) : NULL;
    free(path);
    kiln_device *dev = rec ? kiln_device_open("ref") : NULL;
    kiln_generator gen = kiln_generator_make(0);
    kiln_module *m = dev ? kiln_model_from_json(model_json, dev, &gen) : NULL;
    int nm = m ? kiln_module_state_dict(m, NULL, 0) : 0, rc = 0;
    kiln_named_tensor *sd = m ? calloc((size_t)nm + 1, sizeof *sd) : NULL;
    if (sd) {
        kiln_module_state_dict(m, sd, nm);
        const kiln_safetensors *st = kiln_record_tensors(rec);
        int nc = kiln_safetensors_count(st);
        if (nc != nm)
            rc = refuse(why, len, "the checkpoint holds %d model tensors, the model has %d", nc, nm);
        for (int i = 0; rc == 0 && i < nm; i++) {
            int k = kiln_safetensors_find(st, sd[i].name), dtype, ndim = 0;
            int64_t shape[KILN_MAX_DIMS], mine[KILN_MAX_DIMS];
            if (k < 0 || kiln_safetensors_info(st, k, &dtype, &ndim, shape) != 0) {
                rc = refuse(why, len, "the model's tensor '%.100s' is not in the checkpoint", sd[i].name);
                break;
            }
            bool same = ndim == kiln_tensor_ndim(sd[i].tensor);
            for (int d = 0; d < kiln_tensor_ndim(sd[i].tensor) && d < KILN_MAX_DIMS; d++) {
                mine[d] = kiln_tensor_dim(sd[i].tensor, d);
                same = same && mine[d] == shape[d];
            }
            if (!same) {
                char a[96], b[96];
                shape_text(ndim, shape, a, sizeof a);
                shape_text(kiln_tensor_ndim(sd[i].tensor), mine, b, sizeof b);
                rc = refuse(why, len, "'%.100s' is %s in the checkpoint, %s in the model", sd[i].name, a, b);
            }
        }
        if (rc == 0)
            rc = same_generators(m, ckpt, why, len);
    }
    free(sd);
    kiln_module_free(m);
    if (dev)
        kiln_device_close(dev);
    kiln_record_close(rec);
    return rc;
}

/*
 * resume_from_job, beyond its having a checkpoint (checked on the loop): that checkpoint is not
 * past the epochs this job trains to (the Learner would run no step and the job would register
 * the old model as if trained), and it holds the model this spec builds (the run would fail
 * when it resumes). Both read only the checkpoint's manifest and headers.
 */
static void check_resume(const struct kd_jobs *j, const struct kd_jobspec *spec, char *problems, size_t len)
{
    char ckpt[4096], why[400];
    int64_t epoch = 0;
    if (spec->resume_from_job <= 0 ||
        !newest_checkpoint(j->data_dir, spec->resume_from_job, ckpt, sizeof ckpt, &epoch))
        return;
    if (epoch > spec->epochs)
        add_problem(
            problems, len,
            "resume_from_job: job %lld's newest checkpoint is at epoch %lld, past this job's epochs (%lld); "
            "epochs counts from the start of the first run, so set it above %lld to train on",
            (long long)spec->resume_from_job, (long long)epoch, (long long)spec->epochs, (long long)epoch);
    if (spec->model_json && model_fits(spec->model_json, ckpt, why, sizeof why) != 0)
        add_problem(problems, len,
                    "resume_from_job: job %lld's checkpoint holds another model than this spec's: %s",
                    (long long)spec->resume_from_job, why);
}

/* A submission whose spec parsed, waiting for kd_jobspec_check_runnable on the thread pool. */
struct submit_op {
    uv_work_t work;
    struct kd_jobs *j;
    struct kd_http_pending *pending;
    char *body; /* the spec as sent: what is stored */
    struct kd_jobspec spec;
    int rc; /* kd_jobspec_check_runnable's */
    char problems[4096];
};

static void check_on_pool(uv_work_t *w)
{
    struct submit_op *op = w->data;
    op->rc = kd_jobspec_check_runnable(&op->spec, op->problems, sizeof op->problems);
    check_resume(op->j, &op->spec, op->problems, sizeof op->problems);
    char why[400];
    /* A job that would train to the end and only then find it cannot add its version. */
    if (op->spec.register_as &&
        kd_jobs_repository_writable(op->j->models_dir, op->spec.register_as, why, sizeof why) != 0)
        add_problem(op->problems, sizeof op->problems,
                    "register_as: %s; leave register_as out, or make the folder writable for kilnd", why);
    if (op->problems[0])
        op->rc = -1;
}

/* Back on the loop: store the job, or answer the problems. A daemon that began to stop in the
 * meantime stores nothing (its jobs module has closed its loop handles). */
static void check_done(uv_work_t *w, int status)
{
    struct submit_op *op = w->data;
    struct kd_jobs *j = op->j;
    struct kd_buf *out = kd_http_pending_out(op->pending);
    bool keep_alive = kd_http_pending_keep_alive(op->pending);
    pthread_mutex_lock(&j->mu);
    bool stopping = j->stopping;
    pthread_mutex_unlock(&j->mu);
    int st;
    if (status != 0 || stopping) {
        st = out ? kd_resp_error(out, 503, "kilnd is stopping; submit the job again once it is back", keep_alive,
                                 NULL)
                 : 503;
    } else if (op->rc != 0) {
        char *text = problems_body(op->problems);
        st = !out   ? 400
             : text ? kd_resp_append(out, 400, "application/json", text, strlen(text), keep_alive, NULL)
                    : kd_resp_error(out, 500, "out of memory", keep_alive, NULL);
        cJSON_free(text);
    } else {
        /* also when the client has gone: it sent the job, and a retry after a lost answer
         * finds it in GET /v1/jobs */
        st = store_job(j, op->body, op->spec.resume_from_job, out, keep_alive);
    }
    kd_http_pending_finish(op->pending, out ? st : -1);
    kd_jobspec_free(&op->spec);
    free(op->body);
    free(op);
}

int kd_jobs_handle_submit(struct kd_jobs *j, const struct kd_request *req, struct kd_buf *out)
{
    /* The request body is a byte range, not a C string: copy it whole and terminate it
     * (strndup would read past the range looking for a NUL, and stop early at one). */
    if (req->body_len && memchr(req->body, '\0', req->body_len))
        return kd_jobs_errorf(out, req, 400, "job spec: the body contains a NUL byte");
    struct submit_op *op = calloc(1, sizeof *op);
    char *body = op ? malloc(req->body_len + 1) : NULL;
    if (!body) {
        free(op);
        return kd_jobs_errorf(out, req, 500, "out of memory");
    }
    if (req->body_len)
        memcpy(body, req->body, req->body_len);
    body[req->body_len] = '\0';
    struct kd_jobspec_env env = kd_jobs_spec_env(j);
    env.submit = true;
    env.resumable = resumable;
    env.resumable_ud = j;
    if (kd_jobspec_parse(body, &env, &op->spec, op->problems, sizeof op->problems) != 0) {
        free(body);
        char *text = problems_body(op->problems);
        free(op);
        int rc = text ? kd_resp_append(out, 400, "application/json", text, strlen(text), req->keep_alive, NULL)
                      : kd_resp_error(out, 500, "out of memory", req->keep_alive, NULL);
        cJSON_free(text);
        return rc;
    }
    /* The device is the server's: one kilnd knows is lost (the handle an open would reuse is
     * dead) is a 503 naming it, as inference answers, not a job that would fail at its first op. */
    char lost[400];
    if (op->spec.device && kd_sched_device_lost(j->o.sched, op->spec.device, lost, sizeof lost)) {
        kd_jobspec_free(&op->spec);
        free(body);
        free(op);
        return kd_jobs_errorf(out, req, 503,
                              "job spec: device: the device is lost (%s); kilnd cannot train on it until it "
                              "restarts with the device working",
                              lost);
    }
    op->j = j;
    op->body = body;
    op->work.data = op;
    op->pending = kd_http_defer(req);
    if (!op->pending) {
        kd_jobspec_free(&op->spec);
        free(body);
        free(op);
        return kd_jobs_errorf(out, req, 500, "out of memory");
    }
    int rc = uv_queue_work(j->o.loop, &op->work, check_on_pool, check_done);
    if (rc != 0) { /* the response is deferred already: it goes where a late one would */
        struct kd_buf *late = kd_http_pending_out(op->pending);
        char msg[160];
        snprintf(msg, sizeof msg, "cannot check the job spec: %s", uv_strerror(rc));
        int st = late ? kd_resp_error(late, 500, msg, kd_http_pending_keep_alive(op->pending), NULL) : -1;
        kd_http_pending_finish(op->pending, st);
        kd_jobspec_free(&op->spec);
        free(body);
        free(op);
    }
    return KD_HTTP_DEFERRED;
}
