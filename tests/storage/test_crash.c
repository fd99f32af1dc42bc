/*
 * tests/storage/test_crash.c — SIGKILL at random instants (suite 'crash').
 *
 *   test_crash ckpt WRITER [KILLS]   checkpoints: after each kill the latest good checkpoint
 *                                    opens and verifies, is never a partial folder, is at
 *                                    least as new as the last acknowledged save, and its
 *                                    payload is the one written for its step.
 *   test_crash jobs WRITER [KILLS]   job store: after each kill integrity_check is ok and every
 *                                    acknowledged job, event, metric and state is there intact.
 *
 * The delays come from a fixed seed (printed; KILN_CRASH_SEED overrides it) so a failing run
 * can be replayed. The writer acknowledges each completed write on a pipe; what it
 * acknowledged before dying is what the store promised to keep.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "kiln/kiln.h"
#include "kiln/record.h"
#include "jobstore.h"
#include "storage-impl.h"

#define CHECK(cond, ...)                                                                                     \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            fprintf(stderr, "test_crash: kill %d: check failed: %s: ", kill_no, #cond);                     \
            fprintf(stderr, __VA_ARGS__);                                                                    \
            fprintf(stderr, "\n");                                                                           \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

static int kill_no;
static uint64_t rng_state;

static uint64_t next_rand(void)
{
    /* xorshift64*: tiny, seedable, good enough to spread kill instants. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

/* Run the writer, kill it after delay_us, return everything it acknowledged (malloc'd). */
static char *run_and_kill(const char *writer, const char *mode, const char *path, long delay_us, int *status)
{
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe: %s", strerror(errno));
    pid_t pid = fork();
    CHECK(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execl(writer, writer, mode, path, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    /* the delay counts from the writer's "started" line, once its libraries are loaded */
    char started[8];
    size_t got = 0;
    while (got < sizeof started) {
        ssize_t r = read(fds[0], started + got, sizeof started - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    CHECK(got == sizeof started && memcmp(started, "started\n", sizeof started) == 0,
          "the writer did not start (%zu bytes of its first line)", got);
    struct timespec ts = {delay_us / 1000000, (delay_us % 1000000) * 1000};
    nanosleep(&ts, NULL);
    kill(pid, SIGKILL);
    CHECK(waitpid(pid, status, 0) == pid, "waitpid: %s", strerror(errno));
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 1024 > cap)
            buf = realloc(buf, cap *= 2);
        ssize_t r = read(fds[0], buf + len, cap - len - 1);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    buf[len] = '\0';
    close(fds[0]);
    return buf;
}

/* ------------------------------------------------------------------- checkpoints */

static void check_float_tensor(const kiln_record *rec, const char *name, double base, double per_index,
                               kiln_device *dev)
{
    kiln_record_slot slot = {.name = name, .dtype = KILN_F32, .ndim = -1};
    kiln_tensor *t = NULL;
    CHECK(kiln_record_load_slots(rec, 1, &slot, dev, KILN_RECORD_LENIENT, &t, NULL) == 0 && t, "load %s: %s", name,
          kiln_error());
    int64_t n = kiln_tensor_numel(t);
    float *v = malloc((size_t)n * sizeof *v);
    CHECK(kiln_to_data(t, v, (size_t)n * sizeof *v) == 0, "read %s", name);
    for (int64_t i = 0; i < n; i++)
        CHECK(v[i] == (float)(base + per_index * (double)i), "%s[%lld] = %g, want %g", name, (long long)i, v[i],
              base + per_index * (double)i);
    free(v);
    kiln_tensor_release(t);
}

static int skipped_partial;

static void on_skip(const char *path, const char *why, void *user)
{
    (void)user;
    (void)why;
    if (strstr(path, "/.tmp-"))
        skipped_partial++;
}

static int crash_ckpt(const char *writer, int kills)
{
    char root[64];
    snprintf(root, sizeof root, "/tmp/kiln-crash-ckpt-XXXXXX");
    if (!mkdtemp(root))
        return 1;
    kiln_device *dev = kiln_device_open("cpu");
    int64_t acked_max = 0;
    int no_progress = 0;
    for (kill_no = 1; kill_no <= kills; kill_no++) {
        long delay = 2000 + (long)(next_rand() % 250000); /* 2..252 ms */
        int status;
        char *acks = run_and_kill(writer, "ckpt", root, delay, &status);
        CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "the writer died on its own (status %d)", status);
        int64_t before = acked_max;
        for (char *line = strtok(acks, "\n"); line; line = strtok(NULL, "\n")) {
            int64_t s = strtoll(line, NULL, 10);
            CHECK(s > acked_max, "acknowledged step %lld after %lld", (long long)s, (long long)acked_max);
            acked_max = s;
        }
        free(acks);
        no_progress += acked_max == before;

        kiln_ckpt *ck = kiln_ckpt_open_latest(root, on_skip, NULL);
        if (acked_max == 0 && !ck)
            continue; /* killed before the first save finished */
        CHECK(ck != NULL, "no usable checkpoint after %lld were acknowledged: %s", (long long)acked_max,
              kiln_error());
        int64_t step = kiln_ckpt_step(ck);
        const char *base = strrchr(kiln_ckpt_path(ck), '/') + 1;
        CHECK(strncmp(base, "step-", 5) == 0, "chose %s", kiln_ckpt_path(ck));
        CHECK(step >= acked_max, "latest good step %lld is older than acknowledged %lld", (long long)step,
              (long long)acked_max);
        CHECK(step <= acked_max + 1, "step %lld was never started", (long long)step);
        check_float_tensor(kiln_ckpt_model(ck), "w", (double)step, 0, dev);
        check_float_tensor(kiln_ckpt_model(ck), "v", (double)step, 1, dev);
        check_float_tensor(kiln_ckpt_optimizer(ck), "m", -(double)step, 0, dev);
        kiln_generator g;
        CHECK(kiln_ckpt_rng(ck, &g, 1) == 1 && g.seed == (uint64_t)step && g.offset == (uint64_t)step * 3,
              "rng state of step %lld", (long long)step);
        char want[64];
        snprintf(want, sizeof want, "{\"step\": %" PRId64 "}", step);
        CHECK(strcmp(kiln_record_config(kiln_ckpt_model(ck)), want) == 0, "config %s",
              kiln_record_config(kiln_ckpt_model(ck)));
        /* The writer resumes from here; a save that completed but was not acknowledged counts. */
        acked_max = step;
        kiln_ckpt_close(ck);
    }
    printf("checkpoint crash test: %d kills, last step %lld, %d partial (.tmp) folders passed over by latest-good, "
           "%d kills before any new save completed\n",
           kills, (long long)acked_max, skipped_partial, no_progress);
    kiln_device_close(dev);
    kiln__remove_tree(root);
    /* Sanitizer builds are slow; a handful of completed saves is enough to have exercised it. */
    return acked_max >= 5 ? 0 : (fprintf(stderr, "test_crash: too little progress\n"), 1);
}

/* --------------------------------------------------------------------- job store */

static int64_t query_i64(sqlite3 *db, const char *sql, int64_t a, int64_t b)
{
    sqlite3_stmt *st;
    CHECK(sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(db));
    sqlite3_bind_int64(st, 1, a);
    sqlite3_bind_int64(st, 2, b);
    CHECK(sqlite3_step(st) == SQLITE_ROW, "%s", sql);
    int64_t v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

static int crash_jobs(const char *writer, int kills)
{
    char dir[64], db[96];
    snprintf(dir, sizeof dir, "/tmp/kiln-crash-jobs-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    snprintf(db, sizeof db, "%s/kiln.db", dir);
    int64_t jobs = 0, events = 0, metrics = 0, states = 0;
    for (kill_no = 1; kill_no <= kills; kill_no++) {
        long delay = 1000 + (long)(next_rand() % 60000); /* 1..61 ms */
        int status;
        char *acks = run_and_kill(writer, "jobs", db, delay, &status);
        CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "the writer died on its own (status %d)", status);
        if (access(db, F_OK) != 0) {
            /* Killed before the writer created the file: nothing may have been acknowledged. */
            CHECK(acks[0] == '\0', "acknowledged writes but %s does not exist", db);
            free(acks);
            continue;
        }
        sqlite3 *h;
        CHECK(sqlite3_open_v2(db, &h, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK, "open %s", db);
        sqlite3_stmt *st;
        CHECK(sqlite3_prepare_v2(h, "PRAGMA integrity_check", -1, &st, NULL) == SQLITE_OK, "prepare");
        CHECK(sqlite3_step(st) == SQLITE_ROW && strcmp((const char *)sqlite3_column_text(st, 0), "ok") == 0,
              "integrity_check: %s", sqlite3_column_text(st, 0));
        sqlite3_finalize(st);
        if (query_i64(h, "SELECT count(*) FROM sqlite_master WHERE name = 'job_events' AND ?1 = ?2", 0, 0) == 0) {
            /* Killed before the first migration committed: nothing may have been acknowledged. */
            CHECK(acks[0] == '\0', "acknowledged writes but the schema is missing");
            sqlite3_close(h);
            free(acks);
            continue;
        }
        for (char *line = strtok(acks, "\n"); line; line = strtok(NULL, "\n")) {
            char kind;
            long long a, b;
            CHECK(sscanf(line, "%c %lld %lld", &kind, &a, &b) == 3, "bad ack '%s'", line);
            if (kind == 'J') {
                CHECK(query_i64(h, "SELECT count(*) FROM jobs WHERE id = ?1 AND json_extract(spec, '$.n') = ?2", a,
                                b) == 1, "job %lld (n = %lld) lost or damaged", a, b);
                jobs++;
            } else if (kind == 'E') {
                CHECK(query_i64(h, "SELECT count(*) FROM job_events WHERE job_id = ?1 AND seq = ?2 AND "
                                   "json_extract(payload, '$.job') = ?1 AND json_extract(payload, '$.e') = ?2 - 1",
                                a, b) == 1, "event %lld/%lld lost or damaged", a, b);
                events++;
            } else if (kind == 'M') {
                CHECK(query_i64(h, "SELECT count(*) FROM job_metrics WHERE job_id = ?1 AND step = ?2 AND "
                                   "((name = 'loss' AND value = ?2) OR (name = 'acc' AND value = -?2))",
                                a, b) == 2, "metrics of job %lld lost or damaged", a);
                metrics++;
            } else if (kind == 'S') {
                CHECK(query_i64(h, "SELECT count(*) FROM jobs WHERE id = ?1 AND state = 'succeeded' AND "
                                   "finished_ms IS NOT NULL AND ?2 >= 0", a, b) == 1, "state of job %lld lost", a);
                states++;
            }
        }
        /* No half transactions: every job has 0..3 events numbered from 1 without gaps. */
        CHECK(query_i64(h, "SELECT count(*) FROM (SELECT job_id, max(seq) AS m, count(*) AS c FROM job_events "
                           "GROUP BY job_id) WHERE m != c OR c > 3", 0, 0) == 0, "event sequences with gaps");
        CHECK(query_i64(h, "SELECT count(*) FROM (SELECT job_id, step, count(*) AS c FROM job_metrics "
                           "GROUP BY job_id, step) WHERE c != 2", 0, 0) == 0, "a metrics batch was split");
        sqlite3_close(h);
        free(acks);
    }
    printf("job store crash test: %d kills; verified %lld acknowledged jobs, %lld events, %lld metric batches, "
           "%lld state changes\n", kills, (long long)jobs, (long long)events, (long long)metrics, (long long)states);
    kiln__remove_tree(dir);
    return jobs > 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: test_crash ckpt|jobs WRITER [KILLS]\n");
        return 2;
    }
    int kills = argc > 3 ? atoi(argv[3]) : 60;
    const char *env = getenv("KILN_CRASH_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : 0x6b696c6e2d636bull;
    if (seed == 0)
        seed = 1;
    rng_state = seed;
    printf("test_crash %s: seed 0x%016" PRIx64 " (replay with KILN_CRASH_SEED=0x%016" PRIx64 "), %d kills\n",
           argv[1], seed, seed, kills);
    fflush(stdout);
    if (strcmp(argv[1], "ckpt") == 0)
        return crash_ckpt(argv[2], kills);
    if (strcmp(argv[1], "jobs") == 0)
        return crash_jobs(argv[2], kills);
    return 2;
}
