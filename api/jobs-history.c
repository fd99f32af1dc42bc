/*
 * api/jobs-history.c — a job's history as plain JSON pages: GET /v1/jobs/{id}/metrics (the
 * epoch metrics, or with ?kind=step the sampled step metrics) and GET /v1/jobs/{id}/logs.
 *
 * Both read the job's stored events, the store's single record of what a run reported, so a
 * page after a restart, a live stream and these answers always agree. Each answer carries a
 * cursor, next_after: the id of the last event it looked at. Passing it back as ?after= gives
 * only what came since, which is how a client polls a running job without reading its whole
 * history again; "more" says the page was cut at limit and the next one holds rows already.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "jobs-impl.h"

#define HISTORY_CHUNK 2000        /* events read from the store per locked section */
#define HISTORY_LIMIT_MAX 10000
#define HISTORY_LIMIT_DEFAULT 1000

struct history_page {
    const char *type;             /* the event type kept: "epoch", "step" or "log" */
    int64_t after, limit;
    cJSON *rows;                  /* the kept events' payloads, each with its event id and time */
    int64_t next_after;           /* the last event looked at */
    bool more;                    /* stopped at limit with another row after the page */
};

/* Reads the query's after and limit; 0, or the status of the 400 written to out. */
static int page_params(const struct kd_request *req, const struct kd_jobs_query *q, struct kd_buf *out,
                       int64_t *after, int64_t *limit)
{
    const char *num;
    *after = 0;
    *limit = HISTORY_LIMIT_DEFAULT;
    if ((num = kd_jobs_query_get(q, "after")) && !kd_jobs_parse_i64(num, after))
        return kd_jobs_errorf(out, req, 400, "after: must be an event id (a whole number >= 0)");
    if ((num = kd_jobs_query_get(q, "limit")) &&
        (!kd_jobs_parse_i64(num, limit) || *limit < 1 || *limit > HISTORY_LIMIT_MAX))
        return kd_jobs_errorf(out, req, 400, "limit: must be within 1..%d", HISTORY_LIMIT_MAX);
    return 0;
}

/* The stored payload with its event id and time added, as raw JSON: the numbers stay the
 * exact text the trainer wrote (a parse and print would round them to 15 digits). NULL when
 * the payload is not a JSON object, which the trainer never stores. */
static cJSON *row_of(const struct kd_job_event *ev)
{
    cJSON *o = cJSON_Parse(ev->payload);
    bool object = cJSON_IsObject(o), empty = object && !o->child;
    cJSON_Delete(o);
    const char *close = object ? strrchr(ev->payload, '}') : NULL;
    if (!close)
        return NULL;
    size_t head = (size_t)(close - ev->payload), n = head + 80;
    char *text = malloc(n);
    if (!text)
        return NULL;
    snprintf(text, n, "%.*s%s\"event_id\":%lld,\"time_ms\":%lld}", (int)head, ev->payload, empty ? "" : ",",
             (long long)ev->seq, (long long)ev->time_ms);
    cJSON *row = cJSON_CreateRaw(text);
    free(text);
    return row;
}

/* Scan the job's events after pg->after and keep those of pg->type; 0 or the store's code (why in
 * err). */
static int read_page(struct kd_jobs *j, int64_t id, struct history_page *pg, char *err, size_t errlen)
{
    pg->next_after = pg->after;
    pg->more = false;
    int64_t kept = 0;
    for (;;) {
        struct kd_job_event *ev = NULL;
        int n = 0;
        kd_jobs_store_lock(j);
        int rc = kd_jobstore_events_since(j->o.store, id, pg->next_after, HISTORY_CHUNK, &ev, &n, err, errlen);
        kd_jobs_store_unlock(j);
        if (rc != 0)
            return rc;
        int i = 0;
        for (; i < n; i++) {
            bool match = strcmp(ev[i].type, pg->type) == 0;
            if (match && kept == pg->limit) {
                pg->more = true; /* a row is left over: the next page starts with it */
                break;
            }
            /* Past the page's last row, events of other types are consumed, so a poller's
             * cursor moves over them. */
            pg->next_after = ev[i].seq;
            if (!match)
                continue;
            cJSON *row = row_of(&ev[i]);
            if (!row)
                continue;
            cJSON_AddItemToArray(pg->rows, row);
            kept++;
        }
        kd_jobstore_events_free(ev, n);
        if (i < n || n < HISTORY_CHUNK)
            return 0;
    }
}

/* The common part of both answers; 0, or the status of the answer already written. */
static int history(struct kd_jobs *j, int64_t id, const char *type, const char *key, const char *kind,
                   const struct kd_jobs_query *q, const struct kd_request *req, struct kd_buf *out)
{
    struct history_page pg = {.type = type};
    int st = page_params(req, q, out, &pg.after, &pg.limit);
    if (st)
        return st;
    struct kd_job job;
    st = kd_jobs_get_job(j, id, &job, req, out);
    if (st)
        return st;
    char state[32];
    snprintf(state, sizeof state, "%s", job.state);
    kd_jobstore_job_clear(&job);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)id);
    cJSON_AddStringToObject(o, "state", state);
    if (kind)
        cJSON_AddStringToObject(o, "kind", kind);
    pg.rows = cJSON_AddArrayToObject(o, key);
    char err[256];
    int rc = read_page(j, id, &pg, err, sizeof err);
    if (rc != 0) {
        cJSON_Delete(o);
        return kd_jobs_store_errorf(j, out, req, rc, 500, "job store: %s", err);
    }
    cJSON_AddNumberToObject(o, "next_after", (double)pg.next_after);
    cJSON_AddBoolToObject(o, "more", pg.more);
    return kd_jobs_send_json(out, 200, o, req);
}

int kd_jobs_handle_metrics(struct kd_jobs *j, int64_t id, const struct kd_request *req, struct kd_buf *out)
{
    static const char *const params[] = {"kind", "after", "limit", NULL};
    struct kd_jobs_query q;
    int st = kd_jobs_query_read(req, params, &q, out);
    if (st)
        return st;
    const char *kind = kd_jobs_query_get(&q, "kind");
    if (!kind)
        kind = "epoch";
    if (strcmp(kind, "epoch") != 0 && strcmp(kind, "step") != 0)
        return kd_jobs_errorf(out, req, 400, "kind: must be \"epoch\" or \"step\"");
    return history(j, id, kind, "metrics", kind, &q, req, out);
}

int kd_jobs_handle_logs(struct kd_jobs *j, int64_t id, const struct kd_request *req, struct kd_buf *out)
{
    static const char *const params[] = {"after", "limit", NULL};
    struct kd_jobs_query q;
    int st = kd_jobs_query_read(req, params, &q, out);
    return st ? st : history(j, id, "log", "logs", NULL, &q, req, out);
}
