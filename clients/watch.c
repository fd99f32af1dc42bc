/*
 * clients/watch.c — `kiln watch`: follows a job's server-sent events. On a terminal it hands
 * over to the dashboard (clients/dashboard.c); otherwise, or with --plain, it prints one line
 * per event. When the connection drops before the job is over (kilnd restarted, a proxy cut it)
 * it reconnects with Last-Event-ID, so no event is shown twice or lost: kilnd keeps every event
 * in its job store.
 */
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sse.h"
#include "watch.h"

#define SERIES_CAP 8192

static double num_of(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static const char *str_of(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static void series_add(struct kiln_series *s, double x, double y)
{
    if (!isfinite(x) || !isfinite(y))
        return;
    if (s->n == s->cap) {
        if (s->cap >= SERIES_CAP) {
            /* Keep every other point: the plot is at most a few hundred dots wide anyway. */
            size_t k = 0;
            for (size_t i = 0; i < s->n; i += 2, k++) {
                s->x[k] = s->x[i];
                s->y[k] = s->y[i];
            }
            s->n = k;
        } else {
            size_t cap = s->cap ? s->cap * 2 : 256;
            double *nx = realloc(s->x, cap * sizeof *nx);
            if (!nx)
                return;
            s->x = nx;
            double *ny = realloc(s->y, cap * sizeof *ny);
            if (!ny)
                return;
            s->y = ny;
            s->cap = cap;
        }
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
}

void kiln_watch_log(struct kiln_watch *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->logs[w->nlogs % KILN_WATCH_LOGS], sizeof w->logs[0], fmt, ap);
    va_end(ap);
    w->nlogs++;
}

const char *kiln_watch_log_line(const struct kiln_watch *w, int i)
{
    if (i < 0 || i >= w->nlogs || i >= KILN_WATCH_LOGS)
        return NULL;
    return w->logs[(w->nlogs - 1 - i) % KILN_WATCH_LOGS];
}

double kiln_watch_progress(const struct kiln_watch *w, double *eta_job, double *eta_epoch)
{
    *eta_job = *eta_epoch = NAN;
    if (!strcmp(w->state, "succeeded"))
        return 1;
    if (!w->have_step || !(w->batches > 0) || !(w->epochs > 0))
        return 0;
    double total = w->epochs * w->batches;
    double done = (w->epoch - 1) * w->batches + w->batch + 1;
    if (w->step_rate > 0 && !w->done) {
        *eta_job = (total - done) / w->step_rate;
        *eta_epoch = (w->batches - w->batch - 1) / w->step_rate;
    }
    double f = done / total;
    return f < 0 ? 0 : f > 1 ? 1 : f;
}

static bool final_state(const char *st)
{
    return !strcmp(st, "succeeded") || !strcmp(st, "failed") || !strcmp(st, "cancelled");
}

void kiln_watch_apply(struct kiln_watch *w, const char *type, const char *data, bool print)
{
    cJSON *o = cJSON_Parse(data);
    if (!o)
        return;
    w->events++;
    if (!strcmp(type, "state")) {
        const char *st = str_of(o, "state");
        const char *err = str_of(o, "error");
        snprintf(w->state, sizeof w->state, "%s", st ? st : "?");
        if (err)
            snprintf(w->error, sizeof w->error, "%s", err);
        kiln_watch_log(w, "job %lld: %s%s%s", w->id, w->state, err ? ": " : "", err ? err : "");
        if (print)
            printf("job %lld: %s%s%s\n", w->id, w->state, err ? ": " : "", err ? err : "");
        if (final_state(w->state)) {
            w->done = true;
            w->exit_code = strcmp(w->state, "succeeded") == 0 ? 0 : 1;
            const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "metrics");
            if (m && isfinite(num_of(m, "valid_accuracy"))) {
                snprintf(w->final_metrics, sizeof w->final_metrics,
                         "final valid_accuracy %.4f valid_loss %.4f train_loss %.4f", num_of(m, "valid_accuracy"),
                         num_of(m, "valid_loss"), num_of(m, "train_loss"));
                if (print)
                    printf("job %lld: %s\n", w->id, w->final_metrics);
            }
        }
    } else if (!strcmp(type, "log")) {
        const char *msg = str_of(o, "message") ? str_of(o, "message") : "";
        kiln_watch_log(w, "%s", msg);
        if (print)
            printf("job %lld: %s\n", w->id, msg);
    } else if (!strcmp(type, "step")) {
        w->have_step = true;
        w->epoch = num_of(o, "epoch");
        w->batch = num_of(o, "batch");
        w->batches = num_of(o, "batches");
        w->step = num_of(o, "step");
        w->loss = num_of(o, "loss");
        w->acc = num_of(o, "accuracy");
        w->lr = num_of(o, "lr");
        w->items_per_sec = num_of(o, "items_per_sec");
        if (isfinite(w->items_per_sec) && w->batch_size > 0) {
            double r = w->items_per_sec / w->batch_size;
            w->step_rate = w->step_rate > 0 ? 0.7 * w->step_rate + 0.3 * r : r;
        }
        series_add(&w->train_loss, w->step, w->loss);
        series_add(&w->train_acc, w->step, w->acc);
        if (print)
            printf("epoch %.0f/%.0f  batch %.0f/%.0f  step %.0f  loss %.4f  acc %.3f  lr %.3g  %.0f items/s\n",
                   w->epoch, w->epochs, w->batch + 1, w->batches, w->step, w->loss, w->acc, w->lr,
                   w->items_per_sec);
    } else if (!strcmp(type, "epoch")) {
        w->have_epoch = true;
        w->ep_epoch = num_of(o, "epoch");
        w->ep_train_loss = num_of(o, "train_loss");
        w->ep_train_acc = num_of(o, "train_accuracy");
        w->ep_valid_loss = num_of(o, "valid_loss");
        w->ep_valid_acc = num_of(o, "valid_accuracy");
        w->peak_rss_mb = num_of(o, "peak_rss_mb");
        w->epoch_seconds = num_of(o, "epoch_seconds");
        /* Validation runs at the end of an epoch, i.e. at the epoch's last step. */
        double x = w->have_step ? w->step : w->ep_epoch;
        series_add(&w->valid_loss, x, w->ep_valid_loss);
        series_add(&w->valid_acc, x, w->ep_valid_acc);
        kiln_watch_log(w, "epoch %.0f: train_loss %.4f valid_loss %.4f valid_acc %.4f (%.1fs)", w->ep_epoch,
                       w->ep_train_loss, w->ep_valid_loss, w->ep_valid_acc, w->epoch_seconds);
        if (print)
            printf("epoch %.0f/%.0f done  train_loss %.4f  train_acc %.3f  valid_loss %.4f  valid_acc %.3f  %.2fs\n",
                   w->ep_epoch, w->epochs, w->ep_train_loss, w->ep_train_acc, w->ep_valid_loss, w->ep_valid_acc,
                   w->epoch_seconds);
    } else if (!strcmp(type, "checkpoint")) {
        kiln_watch_log(w, "checkpoint at step %.0f", num_of(o, "step"));
        if (print)
            printf("checkpoint at step %.0f\n", num_of(o, "step"));
    } else if (!strcmp(type, "model")) {
        const char *name = str_of(o, "name") ? str_of(o, "name") : "?";
        kiln_watch_log(w, "model %s version %.0f registered; serving at /v2/models/%s/infer", name,
                       num_of(o, "version"), name);
        if (print)
            printf("model %s version %.0f registered; serving at /v2/models/%s/infer\n", name, num_of(o, "version"),
                   name);
    }
    if (print)
        fflush(stdout);
    cJSON_Delete(o);
}

int kiln_watch_fetch(const struct kiln_client *cl, struct kiln_watch *w, long long id)
{
    char path[48];
    snprintf(path, sizeof path, "/v1/jobs/%lld", id);
    struct response r;
    if (kiln_cli_request(cl, "GET", path, NULL, 0, &r) != 0)
        return 2;
    if (r.status != 200) {
        kiln_cli_print_error("watch", &r);
        free(r.raw);
        return 1;
    }
    cJSON *j = cJSON_ParseWithLength(r.body, r.body_len);
    const cJSON *spec = cJSON_GetObjectItemCaseSensitive(j, "spec");
    w->id = id;
    w->epochs = isfinite(num_of(spec, "epochs")) ? num_of(spec, "epochs") : 1;
    w->batch_size = isfinite(num_of(spec, "batch_size")) ? num_of(spec, "batch_size") : 0;
    const char *name = str_of(j, "register_as") ? str_of(j, "register_as") : str_of(spec, "register_as");
    snprintf(w->name, sizeof w->name, "%s", name ? name : "");
    snprintf(w->state, sizeof w->state, "%s", str_of(j, "state") ? str_of(j, "state") : "?");
    cJSON_Delete(j);
    free(r.raw);
    return 0;
}

void kiln_watch_free(struct kiln_watch *w)
{
    struct kiln_series *all[] = {&w->train_loss, &w->train_acc, &w->valid_loss, &w->valid_acc};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        free(all[i]->x);
        free(all[i]->y);
        all[i]->x = all[i]->y = NULL;
        all[i]->n = all[i]->cap = 0;
    }
}

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

static void plain_event(void *ctx, const char *type, const char *data)
{
    kiln_watch_apply(ctx, type, data, true);
}

static int watch_plain(const struct kiln_client *cl, struct kiln_watch *w)
{
    struct sigaction sa = {.sa_handler = on_sigint};
    sigaction(SIGINT, &sa, NULL);
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld/events", w->id);
    struct kiln_sse s;
    kiln_sse_init(&s);
    int failures = 0, rc = 0;
    while (!w->done && !interrupted) {
        if (kiln_sse_open(&s, cl, path) != 0) {
            if (++failures > 30) {
                fprintf(stderr,
                        "kiln: watch: gave up after 30 s without kilnd: %s. The job goes on if kilnd does; kiln "
                        "watch %lld follows it again\n",
                        s.error[0] ? s.error : "no answer", w->id);
                rc = 2;
                break;
            }
            if (!interrupted)
                sleep(1);
            continue;
        }
        int pr = 1;
        while (pr == 1 && !w->done && !interrupted) {
            struct pollfd p = {.fd = s.fd, .events = POLLIN};
            if (poll(&p, 1, 500) > 0)
                pr = kiln_sse_pump(&s, plain_event, w);
        }
        if (pr < 0 && s.status != 200 && s.status > 0) {
            /* kilnd refused the stream (no such job, no permission): retrying will not help. */
            fprintf(stderr, "kiln: watch: %s\n", s.error);
            rc = 1;
            break;
        }
        kiln_sse_close(&s);
        if (!w->done && !interrupted) {
            /* The connection ended before the job: kilnd restarted or drained. Reconnect. */
            failures = pr == 0 ? 0 : failures + 1;
            usleep(pr == 0 ? 100000 : 1000000);
        }
    }
    kiln_sse_close(&s);
    if (interrupted) {
        fprintf(stderr, "kiln: stopped watching; job %lld goes on (kiln cancel %lld stops it)\n", w->id, w->id);
        return 130;
    }
    return rc ? rc : w->exit_code;
}

int kiln_cli_watch(const struct kiln_client *cl, long long id, bool dashboard, bool exit_on_end)
{
    struct kiln_watch w = {0};
    int rc = kiln_watch_fetch(cl, &w, id);
    if (rc == 0)
        rc = dashboard ? kiln_dashboard_run(cl, &w, exit_on_end) : watch_plain(cl, &w);
    kiln_watch_free(&w);
    return rc;
}

int kiln_cli_watch_main(const struct kiln_client *cl, int argc, char **argv)
{
    const char *id = NULL;
    bool plain = false, exit_on_end = false;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--plain"))
            plain = true;
        else if (!strcmp(argv[i], "--exit-on-end"))
            exit_on_end = true;
        else if (!id && kiln_cli_job_id_valid(argv[i]))
            id = argv[i];
        else if (!id && argv[i][0] != '-') { /* meant as the id: say what an id is */
            fprintf(stderr, "kiln: watch: '%s' is not a job id\n", argv[i]);
            break;
        } else {
            fprintf(stderr, "kiln: watch: unexpected argument '%s'\n", argv[i]);
            id = NULL;
            break;
        }
    }
    if (!id) {
        fprintf(stderr, "kiln: usage: kiln watch JOB_ID [--plain] [--exit-on-end] (a job id: 1, 2, ...)\n");
        return 2;
    }
    return kiln_cli_watch(cl, atoll(id), kiln_cli_is_tty() && !plain, exit_on_end);
}

bool kiln_cli_is_tty(void)
{
    const char *term = getenv("TERM");
    return isatty(STDIN_FILENO) && isatty(STDOUT_FILENO) && term && term[0] && strcmp(term, "dumb") != 0;
}
