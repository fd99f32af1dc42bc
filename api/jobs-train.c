/*
 * api/jobs-train.c — the training thread: it takes queued jobs oldest first, runs each through
 * scheduler/trainer (resuming from a checkpoint when there is one), and records how it ended; a
 * job that added a model version is handed to the loop, which records it succeeded once the
 * version answers (jobs-finish.c), and the thread waits for that before the next job. A job
 * requeued by a restart after its version was written is not trained again: its version is
 * found by its source.json and handed on the same way.
 *
 * Inference preempts training: a job holds a training slot on its device for its whole run and
 * goes through the scheduler's training gate before every step (scheduler.h). The trainer calls
 * the progress hook once after every step, so that hook is where one step's turn ends and the
 * next one's begins; the first turn is taken before the run starts.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "jobs-impl.h"
#include "repository.h"

/* ---- the training thread ------------------------------------------------------------------- */

struct job_run {
    struct kd_jobs *j;
    int64_t id;
    uint64_t last_progress_ns;
    struct kd_sched_training gate;
    double progress; /* the latest fraction the trainer reported */
    bool unstored;   /* ...which the store has not taken yet (stores are at most two a second) */
};

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void hook_event(void *ud, const char *type, const char *json)
{
    struct job_run *r = ud;
    kd_jobs_emit(r->j, r->id, type, json);
}

static void store_progress(struct job_run *r)
{
    kd_jobs_store_lock(r->j);
    kd_jobstore_job_set_progress(r->j->o.store, r->id, r->progress, NULL, 0);
    kd_jobs_store_unlock(r->j);
    r->unstored = false;
}

static void hook_progress(void *ud, double f)
{
    struct job_run *r = ud;
    /* Between two steps: give the device to inference if any is waiting for it. A cancelled
     * wait needs nothing more here; the trainer sees the same flag before the next step. */
    kd_sched_training_release(&r->gate);
    kd_sched_training_acquire(&r->gate);
    uint64_t t = mono_ns();
    r->progress = f < 0 ? 0 : f > 1 ? 1 : f;
    r->unstored = true;
    if (t - r->last_progress_ns < 500000000u && f < 1.0)
        return;
    r->last_progress_ns = t;
    store_progress(r);
}

static void hook_checkpoint(void *ud, const char *path, int64_t step)
{
    struct job_run *r = ud;
    kd_jobs_store_lock(r->j);
    kd_jobstore_checkpoint_add(r->j->o.store, r->id, path, step, NAN, NULL, 0);
    kd_jobs_store_unlock(r->j);
}

/* A problem the run went on past (a damaged checkpoint passed over on resume): the job's log has
 * it as an event already; kilnd's log gets it too, for an operator who reads no job's events. */
static void hook_warn(void *ud, const char *message)
{
    struct job_run *r = ud;
    kd_jobs_log(r->j, KD_LOG_WARN, "job %lld: %s", (long long)r->id, message);
}

/*
 * The version a previous run of this job added before kilnd stopped, found by the source.json it
 * wrote (0: none); fills res as that run had (its final metrics are in the file).
 */
static int64_t version_written_before(struct kd_jobs *j, const char *name, const char *source,
                                      struct kd_trainer_result *res)
{
    kd_repository *repo = kd_repository_open(j->models_dir);
    char *text = NULL;
    int64_t v = repo ? kd_repository_find_source(repo, name, source, &text) : 0;
    kd_repository_close(repo);
    if (v <= 0) {
        free(text);
        return 0;
    }
    cJSON *o = cJSON_Parse(text);
    char *metrics = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(o, "metrics"));
    res->metrics_json = metrics ? strdup(metrics) : NULL;
    cJSON_free(metrics);
    cJSON_Delete(o);
    free(text);
    res->version = v;
    snprintf(res->stop_reason, sizeof res->stop_reason, "completed");
    return v;
}

/*
 * A job that added version res->version of name: the loop loads it and records the job succeeded
 * (or failed), and this thread waits for that, so that the next job starts after this one is
 * final. Without serving, nothing needs loading and the job is recorded here.
 */
static void finish_registered(struct kd_jobs *j, int64_t id, const char *name, struct kd_trainer_result *res)
{
    kd_jobs_log(j, KD_LOG_INFO, "job %lld: loading %s version %lld for serving", (long long)id, name,
                (long long)res->version);
    if (!j->o.serving) {
        kd_jobs_succeed(j, id, name, res->version, res->metrics_json, res->stop_reason);
        return;
    }
    struct kd_jobs_finish *f = calloc(1, sizeof *f);
    if (!f) {
        /* Stays running: the next start finds the version by its source.json. */
        kd_jobs_log(j, KD_LOG_ERROR, "job %lld: out of memory handing its model to the loop", (long long)id);
        return;
    }
    *f = (struct kd_jobs_finish){.j = j, .id = id, .version = res->version, .metrics_json = res->metrics_json};
    res->metrics_json = NULL;
    snprintf(f->name, sizeof f->name, "%s", name);
    snprintf(f->stop_reason, sizeof f->stop_reason, "%s", res->stop_reason);
    pthread_mutex_lock(&j->mu);
    j->finished = 0;
    struct kd_jobs_finish **tail = &j->to_finish;
    while (*tail)
        tail = &(*tail)->next;
    *tail = f;
    pthread_mutex_unlock(&j->mu);
    uv_async_send(&j->async);
    pthread_mutex_lock(&j->mu);
    /* Stopping: the job stays running in the store and the next start finishes it. */
    while (!j->stopping && j->finished != id)
        pthread_cond_wait(&j->cv, &j->mu);
    pthread_mutex_unlock(&j->mu);
}

static int64_t next_queued(struct kd_jobs *j)
{
    struct kd_job *jobs = NULL;
    int n = 0;
    kd_jobs_store_lock(j);
    int rc = kd_jobstore_job_list(j->o.store, KD_JOB_QUEUED, 0, 1, &jobs, &n, NULL, 0);
    kd_jobs_store_unlock(j);
    int64_t id = rc == 0 && n > 0 ? jobs[0].id : 0;
    kd_jobstore_job_list_free(jobs, n);
    return id;
}

/*
 * The run of job id has ended: from now on a DELETE is answered 409, since the outcome is decided
 * here (under mu, as cancel requests are accepted). True when the user's cancel was accepted
 * before: then the job ends cancelled, whatever the run ended with. *stopping: kilnd is stopping.
 */
static bool decide_outcome(struct kd_jobs *j, int64_t id, bool *stopping)
{
    pthread_mutex_lock(&j->mu);
    bool cancelled = j->cancel_requested;
    *stopping = j->stopping;
    j->finishing = id;
    pthread_mutex_unlock(&j->mu);
    return cancelled;
}

/* The outcome is recorded (or handed to the loop, which has recorded it by now). */
static void outcome_recorded(struct kd_jobs *j)
{
    pthread_mutex_lock(&j->mu);
    j->finishing = 0;
    pthread_mutex_unlock(&j->mu);
}

/*
 * The checkpoint a run continues from: this job's own newest (a restart), else the newest of the
 * job it continues (resume_from_job). *resume is NULL when there is none, *step and *epoch where
 * it stands (0 then).
 * A continuation whose checkpoint is gone, or is past the epochs this job trains to, writes why
 * into lost: starting over from step 0, or registering the old model as if trained, would both
 * be another job than the spec says.
 */
static void find_resume(const struct kd_jobspec *spec, const char *own, const char *from, const char **resume,
                        int64_t *step, int64_t *epoch, char *lost, size_t len)
{
    *resume = NULL;
    *step = *epoch = 0;
    kiln_ckpt *ck = own && kd_jobs_dir_exists(own) ? kiln_ckpt_open_latest(own, NULL, NULL) : NULL;
    if (ck) {
        *resume = own;
    } else if (from) {
        ck = kd_jobs_dir_exists(from) ? kiln_ckpt_open_latest(from, NULL, NULL) : NULL;
        if (!ck)
            snprintf(lost, len, "resume_from_job: job %lld has no checkpoint to resume from any more (%.200s)",
                     (long long)spec->resume_from_job, kd_jobs_dir_exists(from) ? kiln_error() : "no checkpoints");
        else if (kiln_ckpt_epoch(ck) > spec->epochs)
            snprintf(lost, len,
                     "resume_from_job: job %lld's checkpoint is at epoch %lld, past this job's epochs (%lld): "
                     "nothing is left to train",
                     (long long)spec->resume_from_job, (long long)kiln_ckpt_epoch(ck), (long long)spec->epochs);
        else
            *resume = from;
    }
    if (*resume) {
        *step = kiln_ckpt_step(ck);
        *epoch = kiln_ckpt_epoch(ck);
    }
    kiln_ckpt_close(ck);
}

/*
 * A job that ran before kilnd stopped continues from step: what it recorded after that step is
 * removed, since the run records it again, so its history holds each epoch and step once.
 */
static void prune_history(struct kd_jobs *j, int64_t id, int64_t step, int64_t epoch)
{
    char msg[200], err[256];
    snprintf(msg, sizeof msg,
             "{\"message\":\"continuing from step %lld: the steps, epochs and checkpoints recorded after it are "
             "removed from the history and trained again\"}",
             (long long)step);
    int64_t removed = 0;
    kd_jobs_store_lock(j);
    int rc = kd_jobstore_events_prune_after(j->o.store, id, step, epoch, msg, &removed, err, sizeof err);
    kd_jobs_store_unlock(j);
    if (rc != 0)
        kd_jobs_log(j, KD_LOG_WARN, "job %lld: its history after step %lld stays: %s", (long long)id,
                    (long long)step, err);
    else if (removed)
        uv_async_send(&j->async);
}

/* How a run that ended is recorded: cancelled (the user asked, whatever the run ended with),
 * failed, interrupted by a shutdown (left running for the next start), succeeded. */
static void record_outcome(struct kd_jobs *j, const struct kd_job *job, const struct kd_jobspec *spec, int rc,
                           struct kd_trainer_result *res)
{
    int64_t id = job->id;
    bool stopping, cancelled = decide_outcome(j, id, &stopping);
    if (cancelled) {
        /* An accepted cancel always takes effect, also when it came after the last step: a
         * version the run added already is taken back. */
        if (res->version > 0)
            kd_jobs_remove_version_of(j, job, spec->register_as);
        if (rc != 0)
            kd_jobs_log(j, KD_LOG_WARN, "job %lld failed after it was asked to cancel: %s", (long long)id,
                        res->error);
        if (kd_jobs_transition(j, id, KD_JOB_CANCELLED, NULL, NULL, NULL) == 0)
            kd_jobs_log(j, KD_LOG_INFO, "job %lld cancelled", (long long)id);
    } else if (rc != 0) {
        char why[400], error[sizeof res->error];
        /* metrics are set once training is over: the failure came from adding the version */
        if (res->metrics_json && spec->register_as &&
            kd_jobs_repository_writable(j->models_dir, spec->register_as, why, sizeof why) != 0) {
            snprintf(error, sizeof error, "register_as: %.300s (%.150s)", why, res->error);
            snprintf(res->error, sizeof res->error, "%s", error);
        }
        kd_jobs_log(j, KD_LOG_WARN, "job %lld failed: %s", (long long)id, res->error);
        kd_jobs_transition(j, id, KD_JOB_FAILED, res->error, NULL, NULL);
    } else if (strcmp(res->stop_reason, "cancelled") == 0 && stopping) {
        /* kilnd is shutting down, not the user cancelling: the job stays running in the store
         * and the next kilnd picks it up from its checkpoint. */
        kd_jobs_log(j, KD_LOG_INFO, "job %lld interrupted by shutdown; it resumes on the next start",
                    (long long)id);
    } else if (strcmp(res->stop_reason, "cancelled") == 0) {
        if (kd_jobs_transition(j, id, KD_JOB_CANCELLED, NULL, NULL, NULL) == 0)
            kd_jobs_log(j, KD_LOG_INFO, "job %lld cancelled", (long long)id);
    } else if (res->version > 0) {
        finish_registered(j, id, spec->register_as, res);
    } else if (kd_jobs_transition(j, id, KD_JOB_SUCCEEDED, NULL, "metrics", res->metrics_json) == 0) {
        kd_jobs_log(j, KD_LOG_INFO, "job %lld succeeded (%s)", (long long)id, res->stop_reason);
    }
    outcome_recorded(j);
}

/* Runs job id to its end. -1 when the store would not even mark it running (it is still queued):
 * the caller waits before trying again rather than spin. */
static int run_job(struct kd_jobs *j, int64_t id)
{
    struct kd_job job;
    char err[256], problems[2048];
    kd_jobs_store_lock(j);
    int rc = kd_jobstore_job_get(j->o.store, id, &job, err, sizeof err);
    kd_jobs_store_unlock(j);
    if (rc != 0) {
        if (j->unreadable_id != id || strcmp(j->unreadable_why, err) != 0)
            kd_jobs_log(j, KD_LOG_ERROR,
                        "job %lld cannot be read from the job store: %s; tried again every %d s, "
                        "logged again when that changes",
                        (long long)id, err, RETRY_MS / 1000);
        j->unreadable_id = id;
        snprintf(j->unreadable_why, sizeof j->unreadable_why, "%s", err);
        return -1;
    }
    if (j->unreadable_id) {
        kd_jobs_log(j, KD_LOG_INFO, "job %lld can be read from the job store again", (long long)j->unreadable_id);
        j->unreadable_id = 0;
    }
    if (job.cancel_requested_ms) {
        /* asked to stop before this process took it: it ends cancelled without training */
        pthread_mutex_lock(&j->mu);
        j->cancel_requested = true;
        atomic_store(&j->cancel, true);
        pthread_mutex_unlock(&j->mu);
    }
    bool restarted = job.started_ms != 0;
    struct kd_jobspec spec;
    struct kd_jobspec_env env = kd_jobs_spec_env(j);
    if (kd_jobspec_parse(job.spec, &env, &spec, problems, sizeof problems) != 0) {
        /* Checked at submission; a data file removed since makes it fail here. */
        for (char *c = problems; *c; c++)
            if (*c == '\n')
                *c = ';';
        bool stopping, cancelled = decide_outcome(j, id, &stopping);
        if (kd_jobs_set_state(j, id, KD_JOB_RUNNING, NULL) == 0)
            kd_jobs_transition(j, id, cancelled ? KD_JOB_CANCELLED : KD_JOB_FAILED, cancelled ? NULL : problems,
                               NULL, NULL);
        outcome_recorded(j);
        kd_jobstore_job_clear(&job);
        return 0;
    }
    if (kd_jobs_transition(j, id, KD_JOB_RUNNING, NULL, NULL, NULL) != 0) {
        kd_jobspec_free(&spec);
        kd_jobstore_job_clear(&job);
        /* a job cancelled meanwhile is final; one still queued met a store that writes nothing */
        return next_queued(j) == id ? -1 : 0;
    }
    char source[96];
    kd_jobs_source(&job, source, sizeof source);
    struct kd_trainer_result res;
    memset(&res, 0, sizeof res);
    bool written = restarted && spec.register_as && version_written_before(j, spec.register_as, source, &res) > 0;
    if (written)
        kd_jobs_log(j, KD_LOG_INFO,
                    "job %lld resumes after a restart: it had written %s version %lld, which "
                    "is loaded instead of training again",
                    (long long)id, spec.register_as, (long long)res.version);
    else
        kd_jobs_log(j, KD_LOG_INFO, "job %lld %s", (long long)id,
                    restarted ? "resumes after a restart" : "starts");
    char *ckpt = kd_jobs_path(j->data_dir, "checkpoints/job-%lld", (long long)id);
    char *from = spec.resume_from_job > 0
                     ? kd_jobs_path(j->data_dir, "checkpoints/job-%lld", (long long)spec.resume_from_job)
                     : NULL;
    char *scratch = kd_jobs_path(j->data_dir, "tmp/job-%lld-model", (long long)id);
    char *models = strdup(j->models_dir); /* the model repository, maybe outside data_dir */
    char *tmp = kd_jobs_path(j->data_dir, "%s", "tmp");
    char *cks = kd_jobs_path(j->data_dir, "%s", "checkpoints");
    /* 0777 less the umask, as every folder kilnd makes: group-writable under the container image's
     * umask 0002, so that another uid of the group can run on the same data folder */
    if (tmp)
        mkdir(tmp, 0777);
    if (cks)
        mkdir(cks, 0777);
    /* Our own checkpoints win over the ones of the job this one continues. */
    const char *resume = NULL;
    int64_t resume_step = 0, resume_epoch = 0;
    char lost[320] = "";
    if (!written)
        find_resume(&spec, ckpt, from, &resume, &resume_step, &resume_epoch, lost, sizeof lost);
    if (restarted && !written && !lost[0])
        prune_history(j, id, resume_step, resume_epoch);
    /* A version number the registry gave once is never given again, though a user deleted its
     * folder: a client that knew "version 3" must not get other weights under it. */
    int64_t floor = 0;
    if (spec.register_as && spec.register_as[0]) {
        char ferr[256];
        kd_jobs_store_lock(j);
        int frc = kd_jobstore_model_highest_version(j->o.store, spec.register_as, &floor, ferr, sizeof ferr);
        kd_jobs_store_unlock(j);
        if (frc != 0)
            kd_jobs_log(j, KD_LOG_WARN, "job %lld: %s; its version follows the repository's folders only",
                        (long long)id, ferr);
    }
    struct job_run jr = {j, id, 0, {0}, 0, false};
    struct kd_trainer_run run = {
        .spec = &spec,
        .checkpoint_dir = ckpt,
        .resume_dir = resume,
        .models_root = models,
        .version_floor = floor,
        .scratch_dir = scratch,
        .source = source,
        .cancel = &j->cancel,
        .hooks = {&jr, hook_event, hook_progress, hook_checkpoint, hook_warn},
    };
    if (written) {
        rc = 0;
    } else if (!ckpt || !scratch || !models) {
        snprintf(res.error, sizeof res.error, "out of memory");
        rc = -1;
    } else if (lost[0]) {
        snprintf(res.error, sizeof res.error, "%s", lost);
        rc = -1;
    } else if (kd_sched_training_begin(j->o.sched, spec.device, &j->cancel, &jr.gate) != 0) {
        /* Cancelled (or shutting down) while another job held the device. */
        snprintf(res.stop_reason, sizeof res.stop_reason, "cancelled");
        rc = 0;
    } else {
        kd_sched_training_acquire(&jr.gate);
        rc = kd_trainer_run(&run, &res);
        kd_sched_training_end(&jr.gate);
        /* a run that ends between two stores (a loss gone NaN at step 5, within the first
         * half second) shows where it got to, not where the store last looked */
        if (jr.unstored)
            store_progress(&jr);
        if (jr.gate.yields)
            kd_jobs_log(j, KD_LOG_INFO,
                        "job %lld yielded to inference before %llu steps (%llu ran after "
                        "training.max_wait_ms), waiting %.3f s in all",
                        (long long)id, (unsigned long long)jr.gate.yields, (unsigned long long)jr.gate.forced,
                        (double)jr.gate.wait_ns / 1e9);
    }
    record_outcome(j, &job, &spec, rc, &res);
    uv_async_send(&j->async);
    free(res.metrics_json);
    free(ckpt);
    free(from);
    free(scratch);
    free(models);
    free(tmp);
    free(cks);
    kd_jobspec_free(&spec);
    kd_jobstore_job_clear(&job);
    return 0;
}

/* Idle: wait under mu until a job is queued after seen, retention is due, or kilnd stops. With
 * jobs.retention_days set, retention also falls due every hour, so that jobs age out of an idle
 * kilnd too. */
static void wait_for_work(struct kd_jobs *j, uint64_t seen)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 3600;
    while (!j->stopping && j->queued_seq == seen && !j->retention_due) {
        if (j->o.retention_days <= 0)
            pthread_cond_wait(&j->cv, &j->mu);
        else if (pthread_cond_timedwait(&j->cv, &j->mu, &until) == ETIMEDOUT)
            j->retention_due = true;
    }
}

void *kd_jobs_trainer_main(void *ud)
{
    struct kd_jobs *j = ud;
    pthread_mutex_lock(&j->mu);
    while (!j->stopping) {
        if (j->retention_due) {
            /* on this thread, between jobs: removing a large job's files takes time the loop
             * must not spend */
            j->retention_due = false;
            pthread_mutex_unlock(&j->mu);
            kd_jobs_apply_retention(j);
            pthread_mutex_lock(&j->mu);
            continue;
        }
        uint64_t seen = j->queued_seq;
        pthread_mutex_unlock(&j->mu);
        int64_t id = next_queued(j);
        pthread_mutex_lock(&j->mu);
        if (j->stopping)
            break;
        if (!id) {
            wait_for_work(j, seen);
            continue;
        }
        j->current = id;
        j->cancel_requested = false;
        atomic_store(&j->cancel, false);
        pthread_mutex_unlock(&j->mu);
        int rc = run_job(j, id);
        kd_jobs_retry_unsaved(j, true); /* between jobs: final states the store refused before */
        pthread_mutex_lock(&j->mu);
        j->current = 0;
        j->cancel_requested = false;
        /* the job has ended (or is among the unsaved, which retention passes over until stored) */
        j->retention_due = j->o.retention_count > 0 || j->o.retention_days > 0;
        if (rc != 0) {
            /* The store takes nothing: look again in a while, not at once. */
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += RETRY_MS / 1000;
            while (!j->stopping && pthread_cond_timedwait(&j->cv, &j->mu, &until) == 0) {
            }
        }
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}
