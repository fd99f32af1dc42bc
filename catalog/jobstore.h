/*
 * catalog/jobstore.h — kilnd's job store: <data_dir>/kiln.db, an SQLite database in WAL mode that
 * holds jobs, job events, job metrics, the checkpoint index and the model registry. Opening it
 * applies any migrations the file has not seen yet, each in its own transaction, and records
 * the result in schema_version. Every write below is one transaction: after a crash (SIGKILL
 * at any instant) the file passes integrity_check and holds every write that returned 0.
 *
 * Thread affinity: one thread uses a store at a time (kilnd's jobs service serializes its calls
 * under one mutex, store_mu in api/jobs-impl.h).
 * Errors: functions return 0, or a code with a message in err: a negative one when the store
 * failed (KD_JOBSTORE_FULL when its disk is full, else KD_JOBSTORE_FAILED), a positive one for a
 * refusal where said (KD_JOBSTORE_NOT_FOUND, ...). Callers decide by the code, never by the text;
 * err may be NULL when the caller does not want the text.
 *
 *     struct kd_jobstore *js;
 *     char err[256];
 *     if (kd_jobstore_open(&js, "var/kiln.db", err, sizeof err) != 0) fail(err);
 *     int64_t id, seq;
 *     kd_jobstore_job_create(js, "{\"model\":\"mlp\"}", "alice", &id, err, sizeof err);
 *     kd_jobstore_job_set_state(js, id, "running", NULL, err, sizeof err);
 *     kd_jobstore_event_append(js, id, "epoch", "{\"epoch\":1}", &seq, err, sizeof err);
 *     struct kd_job *jobs; int n;
 *     kd_jobstore_job_list(js, "running", 0, 50, &jobs, &n, err, sizeof err);  // page 1
 *     kd_jobstore_job_list_free(jobs, n);
 *     kd_jobstore_close(js);
 */
#ifndef KD_CATALOG_JOBSTORE_H
#define KD_CATALOG_JOBSTORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kd_jobstore;

/* Creates the file when missing. A file from a newer kiln (higher schema version) is refused. */
int kd_jobstore_open(struct kd_jobstore **out, const char *path, char *err, size_t errlen);
/* What a start would refuse in the file at path, checked read-only (it may be in use): damage
 * anywhere in it, or a schema newer than this build's. 0 when it is sound or missing. */
int kd_jobstore_check(const char *path, char *err, size_t errlen);
int kd_jobstore_schema_version(const struct kd_jobstore *js);
/* The newest schema version this build knows. */
int kd_jobstore_latest_version(void);
void kd_jobstore_close(struct kd_jobstore *js);

/* The codes the calls below return besides 0. A failure is negative: */
/* The store failed (SQLite's error, out of memory, a bad argument); err says how. */
#define KD_JOBSTORE_FAILED (-1)
/* A write failed because the disk holding the job store is full (SQLite's "database or disk is
 * full"; ENOSPC or EDQUOT from the file system; EFBIG past the process's file size limit): the
 * store is left as it was before the write, and writes work again once space is freed, without a
 * reopen. err says so in words; the API answers 507 Insufficient Storage. */
#define KD_JOBSTORE_FULL (-2)
/* A refusal is positive, where a call says it gives one: */
/* Returned by get/update calls when the job id does not exist. */
#define KD_JOBSTORE_NOT_FOUND 1

/* Job states. "queued" -> "running" -> one of the three final states ("cancelled" also from
 * "queued"). A final state is never left. */
#define KD_JOB_QUEUED "queued"
#define KD_JOB_RUNNING "running"
#define KD_JOB_SUCCEEDED "succeeded"
#define KD_JOB_FAILED "failed"
#define KD_JOB_CANCELLED "cancelled"

/* A job row; strings are malloc'd (free with kd_jobstore_job_clear). Times: Unix ms, 0 = not yet. */
struct kd_job {
    int64_t id;
    char *spec; /* JSON as submitted */
    char *state;
    char *owner;
    char *error;     /* NULL unless set with the state */
    double progress; /* 0..1 */
    int64_t created_ms, started_ms, finished_ms;
    int64_t cancel_requested_ms; /* when a cancel of the running job was asked for; 0: never */
};

struct kd_job_event {
    int64_t job_id, seq, time_ms;
    char *type;
    char *payload; /* JSON */
};

struct kd_job_metric {
    int64_t step, epoch;
    const char *name;
    double value;
};

/* spec must be valid JSON; owner may be NULL. The new job is queued; *id receives its id. */
int kd_jobstore_job_create(struct kd_jobstore *js, const char *spec, const char *owner, int64_t *id, char *err,
                           size_t errlen);
int kd_jobstore_job_get(struct kd_jobstore *js, int64_t id, struct kd_job *out, char *err, size_t errlen);
/*
 * Jobs with id > after_id (0 for the first page), oldest first, at most limit (1..10000); state
 * NULL for any. The next page starts after the last id returned (keyset pagination, stable
 * while jobs are added).
 */
int kd_jobstore_job_list(struct kd_jobstore *js, const char *state, int64_t after_id, int limit,
                         struct kd_job **out, int *n, char *err, size_t errlen);
/* Move a job to state (error: a message kept with it, or NULL). Sets started/finished times. */
int kd_jobstore_job_set_state(struct kd_jobstore *js, int64_t id, const char *state, const char *error, char *err,
                              size_t errlen);
/*
 * kd_jobstore_job_set_state and the append of its "state" event (payload JSON; its seq in *seq
 * when seq is not NULL) in one transaction: a reader sees both or neither, so a job that reads
 * final has its final event stored, whatever instant the process dies at.
 */
int kd_jobstore_job_transition(struct kd_jobstore *js, int64_t id, const char *state, const char *error,
                               const char *payload, int64_t *seq, char *err, size_t errlen);
/* kd_jobstore_job_transition, made only when the job is in state from (KD_JOBSTORE_FAILED, "job 3 is
 * running, not queued", otherwise): a queued job cancelled at once can never be one the trainer has taken. */
int kd_jobstore_job_transition_from(struct kd_jobstore *js, int64_t id, const char *from, const char *state,
                                    const char *error, const char *payload, int64_t *seq, char *err,
                                    size_t errlen);
/* Record that the user asked a job that is not final to stop (its cancel_requested_ms; the first
 * request's time is kept). KD_JOBSTORE_FAILED for a final job, KD_JOBSTORE_NOT_FOUND for a missing one. */
int kd_jobstore_job_request_cancel(struct kd_jobstore *js, int64_t id, char *err, size_t errlen);
/* The queued or running jobs whose spec continues job id (its "resume_from_job"), oldest first,
 * at most max of them into ids; their number in *n. */
int kd_jobstore_job_continuations(struct kd_jobstore *js, int64_t id, int64_t *ids, int max, int *n, char *err,
                                  size_t errlen);
/*
 * A job that produced a model version becomes succeeded in one transaction: the registry row for
 * (name, version) from source_job id with metrics (JSON or NULL; replacing the row an earlier try
 * of the same job left), a "model" event (model_payload), the state and its "state" event
 * (state_payload). A reader sees the job succeeded only with its model recorded. A job already
 * in a final state is refused (KD_JOBSTORE_FAILED), a missing one is KD_JOBSTORE_NOT_FOUND.
 */
int kd_jobstore_job_succeed_with_model(struct kd_jobstore *js, int64_t id, const char *name, int64_t version,
                                       const char *metrics, const char *model_payload, const char *state_payload,
                                       char *err, size_t errlen);
/* A job that was running when its process died goes back to queued (only from running;
 * KD_JOBSTORE_NOT_FOUND when the job is missing or in another state). */
int kd_jobstore_job_requeue(struct kd_jobstore *js, int64_t id, char *err, size_t errlen);
int kd_jobstore_job_set_progress(struct kd_jobstore *js, int64_t id, double progress, char *err, size_t errlen);
void kd_jobstore_job_clear(struct kd_job *job);
void kd_jobstore_job_list_free(struct kd_job *jobs, int n);

/* Append an event (payload JSON) with the job's next sequence number (from 1), returned in *seq. */
int kd_jobstore_event_append(struct kd_jobstore *js, int64_t job_id, const char *type, const char *payload,
                             int64_t *seq, char *err, size_t errlen);
/* Events with seq > after_seq, in order, at most limit (1..10000). */
int kd_jobstore_events_since(struct kd_jobstore *js, int64_t job_id, int64_t after_seq, int limit,
                             struct kd_job_event **out, int *n, char *err, size_t errlen);
void kd_jobstore_events_free(struct kd_job_event *events, int n);
/*
 * A run that resumes from its checkpoint at step (after epoch completed epochs; 0 and 0 for a run
 * that starts over): the "step", "epoch" and "checkpoint" events recorded after that checkpoint
 * (and the metric points and checkpoint index rows past its step) are removed in one
 * transaction, since the resumed run records them again: the history is then the one an
 * uninterrupted run records. When any event goes, log_payload is appended first as a "log"
 * event, so event ids keep increasing and are never given twice. *removed (may be NULL): how
 * many events went.
 */
int kd_jobstore_events_prune_after(struct kd_jobstore *js, int64_t id, int64_t step, int64_t epoch,
                                   const char *log_payload, int64_t *removed, char *err, size_t errlen);

/* Append n metric points in one transaction. */
int kd_jobstore_metrics_append(struct kd_jobstore *js, int64_t job_id, int n, const struct kd_job_metric *m,
                               char *err, size_t errlen);
/* Index a checkpoint folder written for a job (metric: NAN when none). Re-adding a path updates it. */
int kd_jobstore_checkpoint_add(struct kd_jobstore *js, int64_t job_id, const char *path, int64_t step,
                               double metric, char *err, size_t errlen);
/* Record a model version in the registry (source_job 0 when not from a job; metrics JSON or NULL). */
int kd_jobstore_model_register(struct kd_jobstore *js, const char *name, int64_t version, int64_t source_job,
                               const char *metrics, char *err, size_t errlen);

/* The highest version of name the registry ever recorded, into *version (0: none). Rows outlive
 * their folders, so a version a user deleted from the repository is still counted. */
int kd_jobstore_model_highest_version(struct kd_jobstore *js, const char *name, int64_t *version, char *err,
                                      size_t errlen);

/* How many jobs the store holds in each state. */
struct kd_job_counts {
    int64_t queued, running, succeeded, failed, cancelled;
};
int kd_jobstore_job_counts(struct kd_jobstore *js, struct kd_job_counts *out, char *err, size_t errlen);

/* ---- removing ended jobs (jobstore-purge.c) ---- */

/* kd_jobstore_job_purge's refusals, besides KD_JOBSTORE_NOT_FOUND and the failures. */
#define KD_JOBSTORE_NOT_ENDED 2  /* the job is queued or running */
#define KD_JOBSTORE_RESUMED_BY 3 /* a queued or running job resumes from it (resume_from_job) */

/* What a purge removed, or why it removed nothing. */
struct kd_job_purge {
    char state[16];                       /* the job's state (final when it was removed) */
    /* rows removed: events; the metric history (its step and epoch events, counted in events
     * too, and job_metrics rows); the checkpoint index */
    int64_t events, metrics, checkpoints;
    int64_t resumed_by;                   /* KD_JOBSTORE_RESUMED_BY: the job that resumes from it */
    char model_name[129];                 /* the newest version the job registered ("" none): it stays */
    int64_t model_version;
};

/*
 * Removes ended job id (succeeded, failed or cancelled) with its events, metric points and
 * checkpoint index rows, in one transaction, and says what went in *out. Model registry rows
 * that name the job as their source stay, without it: a version belongs to the repository, not
 * to the job that trained it. The id is never given to another job (AUTOINCREMENT). Refused:
 * KD_JOBSTORE_NOT_ENDED for a queued or running job, KD_JOBSTORE_RESUMED_BY (out->resumed_by
 * set) while a queued or running job resumes from it, KD_JOBSTORE_NOT_FOUND; err says why. The
 * job's files (its checkpoint folders) are the caller's, to remove once this has returned 0.
 */
int kd_jobstore_job_purge(struct kd_jobstore *js, int64_t id, struct kd_job_purge *out, char *err, size_t errlen);
/*
 * Ended jobs a retention rule no longer keeps, the earliest ended first, at most max of them into
 * ids (their number in *n): those beyond the keep_count ended jobs that ended last (0: no limit
 * by count) and those that ended before ended_before_ms (Unix ms; 0: no limit by age). A job a
 * queued or running job resumes from is never among them.
 */
int kd_jobstore_jobs_past_retention(struct kd_jobstore *js, int64_t keep_count, int64_t ended_before_ms,
                                    int64_t *ids, int max, int *n, char *err, size_t errlen);
/* Whether job id is in the store, into *exists (a read error is a failure's code, never "missing"). */
int kd_jobstore_job_exists(struct kd_jobstore *js, int64_t id, bool *exists, char *err, size_t errlen);
/* The highest job id this store ever issued, purged jobs included, into *last_id (0: none yet).
 * A folder named for a job past it was made under another store. */
int kd_jobstore_jobs_issued(struct kd_jobstore *js, int64_t *last_id, char *err, size_t errlen);
/* Makes the next job's id greater than id (no change when it already is), so a new job never
 * takes the id of files an earlier store left in the data folder. */
int kd_jobstore_jobs_reserve_through(struct kd_jobstore *js, int64_t id, char *err, size_t errlen);

#endif /* KD_CATALOG_JOBSTORE_H */
