/*
 * catalog/jobstore-purge.c — removing ended jobs from kiln.db: one job on request (a purge), and
 * the list of those a retention rule no longer keeps.
 *
 * A purge is one IMMEDIATE transaction that checks the job has ended and that no queued or
 * running job resumes from it, then deletes its rows: a reader sees the job whole or not at all,
 * and a continuation stored a moment before is seen by the check. The rows go explicitly (not by
 * relying on ON DELETE CASCADE), so the result does not depend on the foreign_keys pragma of the
 * connection. Files are not the store's business: the caller removes the job's folders once the
 * rows are gone (api/jobs-purge.c says why in that order).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <sqlite3.h>

#include "jobstore-impl.h"

/* The queued and running jobs whose spec resumes from job ?1. */
#define RESUMING_JOBS                                                                                             \
    "FROM jobs WHERE state IN ('queued', 'running') AND json_extract(spec, '$.resume_from_job') = ?1"

/* One statement about job id (bound to ?1): the first columns of its row into values[0..nvalues)
 * when it returns one (*row says whether it did; may be NULL). 0 or a negative code (what failed:
 * what). */
static int job_statement(struct kd_jobstore *js, const char *sql, const char *what, int64_t id, int64_t *values,
                         int nvalues, bool *row, char *err, size_t errlen)
{
    sqlite3_stmt *st;
    int rc = prepare(js, sql, what, &st, err, errlen);
    if (rc != 0)
        return rc;
    sqlite3_bind_int64(st, 1, id);
    int s = sqlite3_step(st);
    if (row)
        *row = s == SQLITE_ROW;
    for (int i = 0; s == SQLITE_ROW && i < nvalues; i++)
        values[i] = sqlite3_column_int64(st, i);
    sqlite3_finalize(st);
    return s == SQLITE_DONE || s == SQLITE_ROW ? 0 : fail(js->db, what, err, errlen);
}

/* The newest model version job id registered, into out (none: model_name stays ""). 0 or a
 * negative code. */
static int registered_model(struct kd_jobstore *js, int64_t id, struct kd_job_purge *out, char *err, size_t errlen)
{
    sqlite3_stmt *st;
    int rc = prepare(js,
                     "SELECT name, version FROM model_registry WHERE source_job = ?1 "
                     "ORDER BY created_ms DESC, version DESC LIMIT 1",
                     "job purge", &st, err, errlen);
    if (rc != 0)
        return rc;
    sqlite3_bind_int64(st, 1, id);
    int s = sqlite3_step(st);
    if (s == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(st, 0); /* NULL only out of memory */
        snprintf(out->model_name, sizeof out->model_name, "%s", name ? name : "");
        out->model_version = sqlite3_column_int64(st, 1);
    }
    sqlite3_finalize(st);
    return s == SQLITE_DONE || s == SQLITE_ROW ? 0 : fail(js->db, "job purge", err, errlen);
}

/* The checks and deletes of kd_jobstore_job_purge, inside its transaction. */
static int purge_in(struct kd_jobstore *js, int64_t id, struct kd_job_purge *out, char *err, size_t errlen)
{
    int rc = kd_js_current_state(js, id, out->state, sizeof out->state, err, errlen);
    if (rc != 0)
        return rc;
    if (!final_state(out->state))
        return (seterr(err, errlen, "job %lld is %s: it has not ended", (long long)id, out->state),
                KD_JOBSTORE_NOT_ENDED);
    bool resumed = false;
    rc = job_statement(js, "SELECT id " RESUMING_JOBS " ORDER BY id LIMIT 1", "job purge", id, &out->resumed_by, 1,
                       &resumed, err, errlen);
    if (rc != 0)
        return rc;
    if (resumed)
        return (seterr(err, errlen, "job %lld resumes from job %lld's checkpoints and has not ended",
                       (long long)out->resumed_by, (long long)id),
                KD_JOBSTORE_RESUMED_BY);
    int64_t counts[3] = {0, 0, 0};
    if ((rc = registered_model(js, id, out, err, errlen)) != 0 ||
        (rc = job_statement(js,
                            "SELECT (SELECT count(*) FROM job_events WHERE job_id = ?1), "
                            /* the metric history GET /v1/jobs/ID/metrics reads: its step and epoch
                             * events (events_removed counts them too), and any rows of the older
                             * job_metrics table */
                            "(SELECT count(*) FROM job_events WHERE job_id = ?1 AND type IN ('step', 'epoch')) + "
                            "(SELECT count(*) FROM job_metrics WHERE job_id = ?1), "
                            "(SELECT count(*) FROM checkpoints WHERE job_id = ?1)",
                            "job purge", id, counts, 3, NULL, err, errlen)) != 0)
        return rc;
    out->events = counts[0];
    out->metrics = counts[1];
    out->checkpoints = counts[2];
    static const char *const deletes[] = {
        "DELETE FROM job_events WHERE job_id = ?1",
        "DELETE FROM job_metrics WHERE job_id = ?1",
        "DELETE FROM checkpoints WHERE job_id = ?1",
        /* the version stays in the registry as in the repository, no longer pointing at the job */
        "UPDATE model_registry SET source_job = NULL WHERE source_job = ?1",
        "DELETE FROM jobs WHERE id = ?1",
    };
    for (size_t i = 0; i < sizeof deletes / sizeof deletes[0]; i++)
        if ((rc = job_statement(js, deletes[i], "job purge", id, NULL, 0, NULL, err, errlen)) != 0)
            return rc;
    return 0;
}

int kd_jobstore_job_purge(struct kd_jobstore *js, int64_t id, struct kd_job_purge *out, char *err, size_t errlen)
{
    if (!js || !out)
        return seterr(err, errlen, "job purge: invalid arguments");
    memset(out, 0, sizeof *out);
    int rc = begin(js, "job purge", err, errlen);
    if (rc != 0)
        return rc;
    return finish(js, purge_in(js, id, out, err, errlen), "job purge", err, errlen);
}

int kd_jobstore_jobs_past_retention(struct kd_jobstore *js, int64_t keep_count, int64_t ended_before_ms,
                                    int64_t *ids, int max, int *n, char *err, size_t errlen)
{
    if (!js || !ids || !n || max < 1 || keep_count < 0 || ended_before_ms < 0)
        return seterr(err, errlen, "jobs past retention: invalid arguments");
    *n = 0;
    if (keep_count == 0 && ended_before_ms == 0)
        return 0;
    /* A final state always sets finished_ms; created_ms stands in should a row lack it. */
    sqlite3_stmt *st;
    int rc = prepare(js,
                     "WITH ended AS (SELECT id, coalesce(finished_ms, created_ms) AS ended_ms, "
                     "row_number() OVER (ORDER BY coalesce(finished_ms, created_ms) DESC, id DESC) "
                     "AS newest_first FROM jobs WHERE state IN ('succeeded', 'failed', 'cancelled')) "
                     "SELECT id FROM ended WHERE ((?1 > 0 AND newest_first > ?1) OR (?2 > 0 AND ended_ms < ?2)) "
                     "AND id NOT IN (SELECT json_extract(spec, '$.resume_from_job') FROM jobs "
                     "WHERE state IN ('queued', 'running') AND "
                     "json_extract(spec, '$.resume_from_job') IS NOT NULL) "
                     "ORDER BY ended_ms, id LIMIT ?3",
                     "jobs past retention", &st, err, errlen);
    if (rc != 0)
        return rc;
    sqlite3_bind_int64(st, 1, keep_count);
    sqlite3_bind_int64(st, 2, ended_before_ms);
    sqlite3_bind_int(st, 3, max);
    int s;
    while ((s = sqlite3_step(st)) == SQLITE_ROW)
        ids[(*n)++] = sqlite3_column_int64(st, 0);
    rc = s == SQLITE_DONE ? 0 : fail(js->db, "jobs past retention", err, errlen);
    sqlite3_finalize(st);
    return rc;
}

int kd_jobstore_job_exists(struct kd_jobstore *js, int64_t id, bool *exists, char *err, size_t errlen)
{
    if (!js || !exists)
        return seterr(err, errlen, "job exists: invalid arguments");
    return job_statement(js, "SELECT 1 FROM jobs WHERE id = ?1", "job exists", id, NULL, 0, exists, err, errlen);
}

/* The one integer sql answers (with text bound to ?1 when not NULL) into *out. */
static int query_int64(struct kd_jobstore *js, const char *sql, const char *text, const char *what, int64_t *out,
                       char *err, size_t errlen)
{
    sqlite3_stmt *st;
    int rc = prepare(js, sql, what, &st, err, errlen);
    if (rc != 0)
        return rc;
    if (text)
        sqlite3_bind_text(st, 1, text, -1, SQLITE_STATIC);
    int s = sqlite3_step(st);
    *out = s == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    rc = s == SQLITE_ROW ? 0 : fail(js->db, what, err, errlen);
    sqlite3_finalize(st);
    return rc;
}

int kd_jobstore_jobs_issued(struct kd_jobstore *js, int64_t *last_id, char *err, size_t errlen)
{
    if (!js || !last_id)
        return seterr(err, errlen, "jobs issued: invalid arguments");
    /* AUTOINCREMENT keeps the highest id ever handed out in sqlite_sequence, purged jobs included;
     * the row appears with the first job, so a store that never made one has none. */
    return query_int64(js, "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'jobs'), 0)", NULL,
                       "jobs issued", last_id, err, errlen);
}

int kd_jobstore_jobs_reserve_through(struct kd_jobstore *js, int64_t id, char *err, size_t errlen)
{
    if (!js || id < 1)
        return seterr(err, errlen, "jobs reserve: invalid arguments");
    int rc = begin(js, "jobs reserve", err, errlen);
    if (rc != 0)
        return rc;
    sqlite3_stmt *st = NULL;
    /* sqlite_sequence has no key: the row is updated when there is one, inserted otherwise */
    rc = prepare(js, "UPDATE sqlite_sequence SET seq = max(seq, ?1) WHERE name = 'jobs'", "jobs reserve", &st, err,
                 errlen);
    if (rc == 0) {
        sqlite3_bind_int64(st, 1, id);
        rc = run(js, st, "jobs reserve", err, errlen);
    }
    if (rc == 0 && sqlite3_changes(js->db) == 0 &&
        (rc = prepare(js, "INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', ?1)", "jobs reserve", &st, err,
                      errlen)) == 0) {
        sqlite3_bind_int64(st, 1, id);
        rc = run(js, st, "jobs reserve", err, errlen);
    }
    return finish(js, rc, "jobs reserve", err, errlen);
}

int kd_jobstore_model_highest_version(struct kd_jobstore *js, const char *name, int64_t *version, char *err,
                                      size_t errlen)
{
    if (!js || !name || !version)
        return seterr(err, errlen, "model highest version: invalid arguments");
    return query_int64(js, "SELECT coalesce(max(version), 0) FROM model_registry WHERE name = ?1", name,
                       "model highest version", version, err, errlen);
}
