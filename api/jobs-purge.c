/*
 * api/jobs-purge.c — removing ended jobs: DELETE /v1/jobs/{id}?purge=true, the retention rules
 * (jobs.retention_count, jobs.retention_days) applied at start and after each job ends, and the
 * sweep at start of checkpoint folders no job owns any more.
 *
 * Why the rows go first and the files second: a purge removes the job's rows (the job, its
 * events, metric points and checkpoint index) in one store transaction, then its folders
 * (checkpoints/job-<id>, and the scratch folder tmp/job-<id>-model a crash may have left). Should
 * kilnd die between the two, what is left is folders with no job: no request reaches them (the
 * job answers 404, a resume_from_job must name a job that exists, and AUTOINCREMENT never gives
 * the id again), and the next start removes them (kd_jobs_sweep_orphans). The other order could
 * leave a job whose checkpoints are gone, which GET would show and a resume would pick, to fail
 * once it ran.
 *
 * Only ids this store issued are swept. A folder past the store's last id was made under another
 * kiln.db (replaced, deleted, restored from an older backup, or emptied): its checkpoints may be
 * all that is left of that training, so it is kept and said once, and the store's next id is
 * moved past it so that no new job meets it as its own.
 *
 * A model version the job registered stays: it belongs to the model repository, is served from
 * there, and outlives the job that trained it (its registry row stays too, with no source job).
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "jobs-impl.h"

#define DAY_MS (24LL * 60 * 60 * 1000)
#define RETENTION_BATCH 64

/*
 * Removes path and everything under it, following no symlink; the files removed and their bytes
 * are added to *files and *bytes (folders are not counted). A path that is not there is nothing to
 * do. 0, or -1 with the first failure in why (and whatever else could go, gone).
 */
static int remove_counted(const char *path, int64_t *files, int64_t *bytes, char *why, size_t len)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT)
            return 0;
        snprintf(why, len, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        if (unlink(path) != 0 && errno != ENOENT) {
            snprintf(why, len, "%s: %s", path, strerror(errno));
            return -1;
        }
        *files += 1;
        *bytes += (int64_t)sb.st_size;
        return 0;
    }
    DIR *d = opendir(path);
    if (!d) {
        snprintf(why, len, "%s: %s", path, strerror(errno));
        return -1;
    }
    int rc = 0;
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        char *child = kd_jobs_path(path, "%s", de->d_name);
        int crc = child ? remove_counted(child, files, bytes, rc ? NULL : why, rc ? 0 : len)
                        : (snprintf(why, len, "out of memory"), -1);
        free(child);
        if (crc != 0)
            rc = -1;
    }
    closedir(d);
    if (rc == 0 && rmdir(path) != 0) {
        snprintf(why, len, "%s: %s", path, strerror(errno));
        rc = -1;
    }
    return rc;
}

/* The folders of job id that a purge removes (checkpoints, a crashed run's scratch folder). */
static int remove_job_files(struct kd_jobs *j, int64_t id, struct kd_jobs_purged *p)
{
    char *folders[] = {
        kd_jobs_path(j->data_dir, "checkpoints/job-%lld", (long long)id),
        kd_jobs_path(j->data_dir, "tmp/job-%lld-model", (long long)id),
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof folders / sizeof folders[0]; i++) {
        if (!folders[i]) {
            snprintf(p->left_behind, sizeof p->left_behind, "out of memory");
            rc = -1;
        } else if (remove_counted(folders[i], &p->files_removed, &p->bytes_freed, rc ? NULL : p->left_behind,
                                  rc ? 0 : sizeof p->left_behind) != 0) {
            rc = -1;
        }
        free(folders[i]);
    }
    return rc;
}

int kd_jobs_purge_rows(struct kd_jobs *j, int64_t id, struct kd_jobs_purged *p, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    p->id = id;
    kd_jobs_store_lock(j);
    int rc = kd_jobstore_job_purge(j->o.store, id, &p->rows, err, errlen);
    kd_jobs_store_unlock(j);
    return rc;
}

/* The log line of a purge that happened (why: "" or " by retention (...)"). */
static void log_purged(struct kd_jobs *j, const struct kd_jobs_purged *p, const char *why)
{
    char model[200] = "";
    if (p->rows.model_name[0])
        snprintf(model, sizeof model, "; model %s version %lld, which it registered, stays in the repository",
                 p->rows.model_name, (long long)p->rows.model_version);
    kd_jobs_log(j, KD_LOG_INFO, "job %lld (%s) purged%s: %lld events, %lld files, %lld bytes freed%s",
                (long long)p->id, p->rows.state, why, (long long)p->rows.events, (long long)p->files_removed,
                (long long)p->bytes_freed, model);
    if (p->left_behind[0])
        kd_jobs_log(j, KD_LOG_WARN,
                    "job %lld: not every file of the purged job could be removed (%s); the next "
                    "start removes what is left",
                    (long long)p->id, p->left_behind);
}

int kd_jobs_purge(struct kd_jobs *j, int64_t id, const char *why, struct kd_jobs_purged *p, char *err,
                  size_t errlen)
{
    int rc = kd_jobs_purge_rows(j, id, p, err, errlen);
    if (rc != 0)
        return rc;
    remove_job_files(j, id, p);
    log_purged(j, p, why);
    return 0;
}

/* ---- retention ------------------------------------------------------------------------------ */

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void kd_jobs_apply_retention(struct kd_jobs *j)
{
    int64_t keep = j->o.retention_count, days = j->o.retention_days;
    if (keep <= 0 && days <= 0)
        return;
    char rule[160], why[200], err[256];
    if (keep > 0 && days > 0)
        snprintf(rule, sizeof rule, "jobs.retention_count %lld, jobs.retention_days %lld", (long long)keep,
                 (long long)days);
    else if (keep > 0)
        snprintf(rule, sizeof rule, "jobs.retention_count %lld keeps the newest %lld ended jobs", (long long)keep,
                 (long long)keep);
    else
        snprintf(rule, sizeof rule, "jobs.retention_days %lld keeps ended jobs %lld days", (long long)days,
                 (long long)days);
    snprintf(why, sizeof why, " by retention (%s)", rule);
    /* Batches until none is left; a batch in which nothing could be purged ends the round, so a
     * store that refuses every delete is not asked again and again. */
    for (;;) {
        int64_t ids[RETENTION_BATCH];
        int n = 0, purged = 0;
        int64_t before = days > 0 ? wall_ms() - days * DAY_MS : 0;
        kd_jobs_store_lock(j);
        int rc = kd_jobstore_jobs_past_retention(j->o.store, keep, before, ids, RETENTION_BATCH, &n, err,
                                                 sizeof err);
        kd_jobs_store_unlock(j);
        if (rc != 0) {
            kd_jobs_log(j, KD_LOG_WARN, "retention: %s", err);
            return;
        }
        for (int i = 0; i < n; i++) {
            pthread_mutex_lock(&j->mu);
            bool stopping = j->stopping;
            pthread_mutex_unlock(&j->mu);
            if (stopping)
                return; /* the next start goes on */
            struct kd_jobs_purged p;
            int prc = kd_jobs_purge(j, ids[i], why, &p, err, sizeof err);
            if (prc == 0)
                purged++;
            else if (prc != KD_JOBSTORE_NOT_FOUND)
                kd_jobs_log(j, KD_LOG_WARN, "retention: job %lld is kept: %s", (long long)ids[i], err);
        }
        if (n < RETENTION_BATCH || purged == 0)
            return;
    }
}

struct retention_op {
    uv_work_t work;
    struct kd_jobs *j;
};

static void retention_on_pool(uv_work_t *w)
{
    struct retention_op *op = w->data;
    kd_jobs_apply_retention(op->j);
}

static void retention_done(uv_work_t *w, int status)
{
    (void)status;
    free(w->data);
}

void kd_jobs_apply_retention_soon(struct kd_jobs *j)
{
    if (j->o.retention_count <= 0 && j->o.retention_days <= 0)
        return;
    struct retention_op *op = calloc(1, sizeof *op);
    if (op) {
        *op = (struct retention_op){.j = j};
        op->work.data = op;
        if (uv_queue_work(j->o.loop, &op->work, retention_on_pool, retention_done) == 0)
            return;
        free(op);
    }
    /* no pool to hand it to: the training thread applies it once it is between jobs */
    pthread_mutex_lock(&j->mu);
    j->retention_due = true;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* ---- folders no job owns --------------------------------------------------------------------- */

/* The id in name when it is prefix + a job id as kilnd writes one + suffix; 0 otherwise. */
static int64_t folder_job_id(const char *name, const char *prefix, const char *suffix)
{
    size_t pl = strlen(prefix), sl = strlen(suffix), nl = strlen(name);
    if (nl <= pl + sl || strncmp(name, prefix, pl) != 0 || strcmp(name + nl - sl, suffix) != 0)
        return 0;
    size_t digits = nl - pl - sl;
    if (digits > 18 || name[pl] == '0' || strspn(name + pl, "0123456789") != digits)
        return 0;
    return strtoll(name + pl, NULL, 10);
}

/* What a sweep of one folder met that no job owns. */
struct sweep_tally {
    int64_t issued;       /* the store's last issued id; folders past it are another store's */
    int64_t highest_kept; /* the highest id among those */
    int kept;             /* how many such folders were kept */
    char first_kept[64];  /* one of them, named in the log */
};

/* In folder sub of the data folder: the entries prefix<id>suffix whose job is not in the store. */
static void sweep_folder(struct kd_jobs *j, const char *sub, const char *prefix, const char *suffix,
                         struct sweep_tally *t)
{
    char *dir = kd_jobs_path(j->data_dir, "%s", sub);
    DIR *d = dir ? opendir(dir) : NULL;
    for (struct dirent *de; d && (de = readdir(d)) != NULL;) {
        int64_t id = folder_job_id(de->d_name, prefix, suffix);
        if (!id)
            continue;
        if (id > t->issued) {
            if (!t->kept++)
                snprintf(t->first_kept, sizeof t->first_kept, "%.16s/%.40s", sub, de->d_name);
            if (id > t->highest_kept)
                t->highest_kept = id;
            continue;
        }
        bool exists = true;
        char err[256];
        kd_jobs_store_lock(j);
        int rc = kd_jobstore_job_exists(j->o.store, id, &exists, err, sizeof err);
        kd_jobs_store_unlock(j);
        if (rc != 0) {
            kd_jobs_log(j, KD_LOG_WARN, "%s/%s is kept: %s", sub, de->d_name, err);
            continue;
        }
        if (exists)
            continue;
        char *path = kd_jobs_path(dir, "%s", de->d_name), why[512] = "";
        int64_t files = 0, bytes = 0;
        int removed = path ? remove_counted(path, &files, &bytes, why, sizeof why) : -1;
        kd_jobs_log(j, removed == 0 ? KD_LOG_INFO : KD_LOG_WARN,
                    "%s/%s belongs to no job in the job store (job %lld was purged before kilnd stopped): %s, "
                    "%lld files, %lld bytes%s%s",
                    sub, de->d_name, (long long)id, removed == 0 ? "removed" : "not wholly removed",
                    (long long)files, (long long)bytes, why[0] ? ": " : "", path ? why : "out of memory");
        free(path);
    }
    if (d)
        closedir(d);
    free(dir);
}

void kd_jobs_sweep_orphans(struct kd_jobs *j)
{
    struct sweep_tally t = {0};
    char err[256];
    kd_jobs_store_lock(j);
    int rc = kd_jobstore_jobs_issued(j->o.store, &t.issued, err, sizeof err);
    kd_jobs_store_unlock(j);
    if (rc != 0) {
        kd_jobs_log(j, KD_LOG_WARN, "checkpoint folders no job owns are kept this time: %s", err);
        return;
    }
    sweep_folder(j, "checkpoints", "job-", "", &t);
    sweep_folder(j, "tmp", "job-", "-model", &t);
    if (!t.kept)
        return;
    kd_jobs_store_lock(j);
    rc = kd_jobstore_jobs_reserve_through(j->o.store, t.highest_kept, err, sizeof err);
    kd_jobs_store_unlock(j);
    kd_jobs_log(j, KD_LOG_WARN,
                "%d job folder(s) (%s among them, up to job %lld) were made under another kiln.db: this job store "
                "issued job ids up to %lld only. They are kept, since their checkpoints may be all that is left "
                "of those trainings; delete them when they are not needed. %s%s",
                t.kept, t.first_kept, (long long)t.highest_kept, (long long)t.issued,
                rc == 0 ? "New jobs take ids past them." : "New jobs could not be moved past their ids: ",
                rc == 0 ? "" : err);
}

/* ---- DELETE /v1/jobs/{id}?purge=true ---------------------------------------------------------- */

/* The files of a purge whose rows are gone, removed on libuv's thread pool; answered on the loop. */
struct purge_op {
    uv_work_t work;
    struct kd_jobs *j;
    struct kd_http_pending *pending;
    struct kd_jobs_purged p;
};

static int purge_answer(const struct kd_jobs_purged *p, struct kd_buf *out, bool keep_alive)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)p->id);
    cJSON_AddTrueToObject(o, "purged");
    cJSON_AddStringToObject(o, "state", p->rows.state);
    cJSON_AddNumberToObject(o, "bytes_freed", (double)p->bytes_freed);
    cJSON_AddNumberToObject(o, "files_removed", (double)p->files_removed);
    cJSON_AddNumberToObject(o, "events_removed", (double)p->rows.events);
    cJSON_AddNumberToObject(o, "metrics_removed", (double)p->rows.metrics);
    if (p->rows.model_name[0]) {
        cJSON *m = cJSON_AddObjectToObject(o, "model_kept");
        cJSON_AddStringToObject(m, "name", p->rows.model_name);
        cJSON_AddNumberToObject(m, "version", (double)p->rows.model_version);
        char note[300];
        snprintf(note, sizeof note,
                 "model %s version %lld, which this job registered, stays in the model repository: it belongs "
                 "to the repository, not to the job",
                 p->rows.model_name, (long long)p->rows.model_version);
        cJSON_AddStringToObject(o, "note", note);
    } else {
        cJSON_AddNullToObject(o, "model_kept");
    }
    if (p->left_behind[0]) {
        char left[700];
        snprintf(left, sizeof left, "%s; the next start of kilnd removes what is left", p->left_behind);
        cJSON_AddStringToObject(o, "left_behind", left);
    }
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!text)
        return kd_resp_error(out, 500, "out of memory", keep_alive, NULL);
    int rc = kd_resp_append(out, 200, "application/json", text, strlen(text), keep_alive, NULL);
    cJSON_free(text);
    return rc;
}

static void purge_files_on_pool(uv_work_t *w)
{
    struct purge_op *op = w->data;
    remove_job_files(op->j, op->p.id, &op->p);
}

static void purge_files_done(uv_work_t *w, int status)
{
    (void)status; /* the rows are gone either way; files left behind go at the next start */
    struct purge_op *op = w->data;
    log_purged(op->j, &op->p, "");
    struct kd_buf *out = kd_http_pending_out(op->pending);
    int st = out ? purge_answer(&op->p, out, kd_http_pending_keep_alive(op->pending)) : -1;
    kd_http_pending_finish(op->pending, st);
    free(op);
}

int kd_jobs_handle_purge(struct kd_jobs *j, int64_t id, const struct kd_request *req, struct kd_buf *out)
{
    char unsaved[16];
    if (kd_jobs_unsaved_state(j, id, unsaved, sizeof unsaved, NULL, 0))
        return kd_jobs_errorf(out, req, 409,
                              "job %lld is %s, but the job store has not taken that yet; purge it once it has",
                              (long long)id, unsaved);
    struct purge_op *op = calloc(1, sizeof *op);
    if (!op)
        return kd_jobs_errorf(out, req, 500, "out of memory");
    char err[256];
    int rc = kd_jobs_purge_rows(j, id, &op->p, err, sizeof err);
    if (rc != 0) {
        struct kd_job_purge rows = op->p.rows;
        free(op);
        if (rc == KD_JOBSTORE_NOT_FOUND)
            return kd_jobs_errorf(out, req, 404, "no job %lld", (long long)id);
        if (rc == KD_JOBSTORE_NOT_ENDED)
            return kd_jobs_errorf(out, req, 409,
                                  "job %lld is %s: only an ended job (succeeded, failed or cancelled) is purged; "
                                  "cancel it first (DELETE /v1/jobs/%lld), then purge it once it has ended",
                                  (long long)id, rows.state, (long long)id);
        if (rc == KD_JOBSTORE_RESUMED_BY)
            return kd_jobs_errorf(out, req, 409,
                                  "job %lld cannot be purged: job %lld resumes from its checkpoints and has not "
                                  "ended; cancel job %lld or let it end, then purge job %lld",
                                  (long long)id, (long long)rows.resumed_by, (long long)rows.resumed_by,
                                  (long long)id);
        return kd_jobs_store_errorf(j, out, req, rc, 500, "job store: %s (nothing was removed)", err);
    }
    op->j = j;
    op->work.data = op;
    op->pending = kd_http_defer(req);
    if (op->pending && uv_queue_work(j->o.loop, &op->work, purge_files_on_pool, purge_files_done) == 0)
        return KD_HTTP_DEFERRED;
    /* No thread pool to hand the files to: they go here, and the answer with them. */
    remove_job_files(j, id, &op->p);
    log_purged(j, &op->p, "");
    int st;
    if (op->pending) {
        struct kd_buf *late = kd_http_pending_out(op->pending);
        st = late ? purge_answer(&op->p, late, kd_http_pending_keep_alive(op->pending)) : -1;
        kd_http_pending_finish(op->pending, st);
        st = KD_HTTP_DEFERRED;
    } else {
        st = purge_answer(&op->p, out, req->keep_alive);
    }
    free(op);
    return st;
}
