/*
 * catalog/jobstore-history.c — what a job records as it runs: its events (numbered per job, from
 * 1), its metric points, the index of its checkpoint folders, and the cut back to a checkpoint a
 * resumed run makes. Every write is one IMMEDIATE transaction, as in jobstore.c.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "jobstore-impl.h"

/* The insert of kd_jobstore_event_append, inside a transaction the caller holds. */
int kd_js_append_event_in(struct kd_jobstore *js, int64_t job_id, const char *type, const char *payload,
                          int64_t *seq, char *err, size_t errlen)
{
    char cur[32];
    int rc = kd_js_current_state(js, job_id, cur, sizeof cur, err, errlen);
    sqlite3_stmt *st = NULL;
    if (rc == 0)
        rc = prepare(js,
                     "INSERT INTO job_events (job_id, seq, time_ms, type, payload) "
                     "SELECT ?1, coalesce(max(seq), 0) + 1, ?2, ?3, ?4 FROM job_events WHERE job_id = ?1 "
                     "RETURNING seq",
                     "event append", &st, err, errlen);
    if (rc == 0) {
        sqlite3_bind_int64(st, 1, job_id);
        sqlite3_bind_int64(st, 2, now_ms());
        sqlite3_bind_text(st, 3, type, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 4, payload ? payload : "{}", -1, SQLITE_TRANSIENT);
        int s = sqlite3_step(st);
        if (s == SQLITE_ROW) {
            if (seq)
                *seq = sqlite3_column_int64(st, 0);
            s = sqlite3_step(st);
        }
        if (s == SQLITE_CONSTRAINT)
            rc = seterr(err, errlen, "event append: the payload is not valid JSON");
        else if (s != SQLITE_DONE)
            rc = fail(js->db, "event append", err, errlen);
    }
    sqlite3_finalize(st);
    return rc;
}

int kd_jobstore_event_append(struct kd_jobstore *js, int64_t job_id, const char *type, const char *payload,
                             int64_t *seq, char *err, size_t errlen)
{
    if (!js || !type || !type[0])
        return seterr(err, errlen, "event append: invalid arguments");
    int rc = begin(js, "event append", err, errlen);
    if (rc != 0)
        return rc;
    return finish(js, kd_js_append_event_in(js, job_id, type, payload, seq, err, errlen), "event append", err,
                  errlen);
}

/* The position a prune keeps: ?1 job, ?2 step, ?3 epoch, ?4 the id of the event that recorded
 * the checkpoint (0: not recorded), ?5 the log event's id. */
struct prune_at {
    int64_t id, step, epoch, cut, seq;
};

/* One statement of the prune below (binding a parameter a statement lacks does nothing); the
 * first column of its row into *value when given. 0 or a negative code. */
static int prune_step(struct kd_jobstore *js, const char *sql, const struct prune_at *at, int64_t *value,
                      char *err, size_t errlen)
{
    sqlite3_stmt *st;
    int rc = prepare(js, sql, "events prune", &st, err, errlen);
    if (rc != 0)
        return rc;
    const int64_t params[] = {at->id, at->step, at->epoch, at->cut, at->seq};
    for (int i = 0; i < 5; i++)
        sqlite3_bind_int64(st, i + 1, params[i]);
    int s = sqlite3_step(st);
    if (value && s == SQLITE_ROW)
        *value = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return s == SQLITE_DONE || (value && s == SQLITE_ROW) ? 0 : fail(js->db, "events prune", err, errlen);
}

/* What came after the checkpoint: the events recorded after the checkpoint's own event (an epoch's
 * event follows its checkpoint's, so epochs are also compared), or without that event, by step. */
#define PRUNED_EVENTS                                                                                             \
    "FROM job_events WHERE job_id = ?1 AND ("                                                                     \
    "(type = 'epoch' AND json_extract(payload, '$.epoch') > ?3 AND seq > ?4) OR "                                 \
    "(type IN ('step', 'checkpoint') AND CASE WHEN ?4 > 0 THEN seq > ?4 "                                         \
    "ELSE json_extract(payload, '$.step') > ?2 END))"

int kd_jobstore_events_prune_after(struct kd_jobstore *js, int64_t id, int64_t step, int64_t epoch,
                                   const char *log_payload, int64_t *removed, char *err, size_t errlen)
{
    if (removed)
        *removed = 0;
    if (!js || step < 0 || epoch < 0)
        return seterr(err, errlen, "events prune: invalid arguments");
    int rc = begin(js, "events prune", err, errlen);
    if (rc != 0)
        return rc;
    char cur[32];
    struct prune_at at = {id, step, epoch, 0, 0};
    int64_t count = 0;
    rc = kd_js_current_state(js, id, cur, sizeof cur, err, errlen);
    if (rc == 0 && step > 0)
        rc = prune_step(js,
                        "SELECT coalesce(max(seq), 0) FROM job_events WHERE job_id = ?1 AND type = 'checkpoint' "
                        "AND json_extract(payload, '$.step') = ?2",
                        &at, &at.cut, err, errlen);
    if (rc == 0)
        rc = prune_step(js, "SELECT count(*) " PRUNED_EVENTS, &at, &count, err, errlen);
    /* The log event goes in first: the job's newest event id stays above every one removed. */
    if (rc == 0 && count > 0)
        rc = kd_js_append_event_in(js, id, "log", log_payload, &at.seq, err, errlen);
    if (rc == 0 && count > 0)
        rc = prune_step(js, "DELETE " PRUNED_EVENTS " AND seq < ?5", &at, NULL, err, errlen);
    if (rc == 0)
        rc = prune_step(js, "DELETE FROM job_metrics WHERE job_id = ?1 AND step > ?2", &at, NULL, err, errlen);
    if (rc == 0)
        rc = prune_step(js, "DELETE FROM checkpoints WHERE job_id = ?1 AND step > ?2", &at, NULL, err, errlen);
    rc = finish(js, rc, "events prune", err, errlen);
    if (rc == 0 && removed)
        *removed = count;
    return rc;
}

void kd_jobstore_events_free(struct kd_job_event *events, int n)
{
    for (int i = 0; events && i < n; i++) {
        free(events[i].type);
        free(events[i].payload);
    }
    free(events);
}

int kd_jobstore_events_since(struct kd_jobstore *js, int64_t job_id, int64_t after_seq, int limit,
                             struct kd_job_event **out, int *n, char *err, size_t errlen)
{
    if (!js || !out || !n || limit < 1 || limit > 10000)
        return seterr(err, errlen, "events since: invalid arguments (limit 1..10000)");
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st;
    int rc = prepare(js,
                     "SELECT job_id, seq, time_ms, type, payload FROM job_events "
                     "WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                     "events since", &st, err, errlen);
    if (rc != 0)
        return rc;
    sqlite3_bind_int64(st, 1, job_id);
    sqlite3_bind_int64(st, 2, after_seq);
    sqlite3_bind_int(st, 3, limit);
    struct kd_job_event *ev = calloc((size_t)limit, sizeof *ev);
    int count = 0, s = SQLITE_DONE;
    rc = ev ? 0 : seterr(err, errlen, "events since: out of memory");
    while (rc == 0 && (s = sqlite3_step(st)) == SQLITE_ROW) {
        struct kd_job_event *e = &ev[count++];
        e->job_id = sqlite3_column_int64(st, 0);
        e->seq = sqlite3_column_int64(st, 1);
        e->time_ms = sqlite3_column_int64(st, 2);
        e->type = col_dup(st, 3);
        e->payload = col_dup(st, 4);
        if (!e->type || !e->payload)
            rc = seterr(err, errlen, "events since: out of memory");
    }
    if (rc == 0 && s != SQLITE_DONE)
        rc = fail(js->db, "events since", err, errlen);
    sqlite3_finalize(st);
    if (rc != 0) {
        kd_jobstore_events_free(ev, count);
        return rc;
    }
    *out = ev;
    *n = count;
    return 0;
}

int kd_jobstore_metrics_append(struct kd_jobstore *js, int64_t job_id, int n, const struct kd_job_metric *m,
                               char *err, size_t errlen)
{
    if (!js || n < 0 || (n > 0 && !m))
        return seterr(err, errlen, "metrics append: invalid arguments");
    for (int i = 0; i < n; i++)
        if (!m[i].name || !m[i].name[0] || !isfinite(m[i].value))
            return seterr(err, errlen, "metrics append: point %d needs a name and a finite value", i);
    int rc = begin(js, "metrics append", err, errlen);
    if (rc != 0)
        return rc;
    char cur[32];
    rc = kd_js_current_state(js, job_id, cur, sizeof cur, err, errlen);
    sqlite3_stmt *st = NULL;
    if (rc == 0)
        rc = prepare(js, "INSERT INTO job_metrics (job_id, step, epoch, name, value) VALUES (?, ?, ?, ?, ?)",
                     "metrics append", &st, err, errlen);
    for (int i = 0; rc == 0 && i < n; i++) {
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, job_id);
        sqlite3_bind_int64(st, 2, m[i].step);
        sqlite3_bind_int64(st, 3, m[i].epoch);
        sqlite3_bind_text(st, 4, m[i].name, -1, SQLITE_TRANSIENT);
        sqlite3_bind_double(st, 5, m[i].value);
        if (sqlite3_step(st) != SQLITE_DONE)
            rc = fail(js->db, "metrics append", err, errlen);
    }
    sqlite3_finalize(st);
    return finish(js, rc, "metrics append", err, errlen);
}

int kd_jobstore_checkpoint_add(struct kd_jobstore *js, int64_t job_id, const char *path, int64_t step,
                               double metric, char *err, size_t errlen)
{
    if (!js || !path || !path[0] || step < 0)
        return seterr(err, errlen, "checkpoint add: invalid arguments");
    sqlite3_stmt *st;
    int rc = prepare(js,
                     "INSERT INTO checkpoints (job_id, path, step, metric, created_ms) "
                     "VALUES (?, ?, ?, ?, ?) ON CONFLICT (path) DO UPDATE SET "
                     "job_id = excluded.job_id, step = excluded.step, metric = excluded.metric, "
                     "created_ms = excluded.created_ms",
                     "checkpoint add", &st, err, errlen);
    if (rc != 0)
        return rc;
    sqlite3_bind_int64(st, 1, job_id);
    sqlite3_bind_text(st, 2, path, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 3, step);
    if (isnan(metric))
        sqlite3_bind_null(st, 4);
    else
        sqlite3_bind_double(st, 4, metric);
    sqlite3_bind_int64(st, 5, now_ms());
    return run(js, st, "checkpoint add", err, errlen);
}

int kd_jobstore_job_counts(struct kd_jobstore *js, struct kd_job_counts *out, char *err, size_t errlen)
{
    if (!js || !out)
        return seterr(err, errlen, "job counts: invalid arguments");
    memset(out, 0, sizeof *out);
    sqlite3_stmt *st;
    int rc = prepare(js, "SELECT state, count(*) FROM jobs GROUP BY state", "job counts", &st, err, errlen);
    if (rc != 0)
        return rc;
    int s;
    while ((s = sqlite3_step(st)) == SQLITE_ROW) {
        const char *state = (const char *)sqlite3_column_text(st, 0);
        int64_t n = sqlite3_column_int64(st, 1);
        int64_t *slot = !state                                 ? NULL
                        : strcmp(state, KD_JOB_QUEUED) == 0    ? &out->queued
                        : strcmp(state, KD_JOB_RUNNING) == 0   ? &out->running
                        : strcmp(state, KD_JOB_SUCCEEDED) == 0 ? &out->succeeded
                        : strcmp(state, KD_JOB_FAILED) == 0    ? &out->failed
                        : strcmp(state, KD_JOB_CANCELLED) == 0 ? &out->cancelled
                                                               : NULL;
        if (slot)
            *slot = n;
    }
    rc = s == SQLITE_DONE ? 0 : fail(js->db, "job counts", err, errlen);
    sqlite3_finalize(st);
    return rc;
}
