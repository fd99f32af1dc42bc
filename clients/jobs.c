/*
 * clients/jobs.c — the kiln CLI's training and model commands: train submit, jobs, job, cancel,
 * watch, models, predict.
 *
 * watch follows GET /v1/jobs/{id}/events (server-sent events) and prints one plain line per
 * event. When the connection drops before the job is over (kilnd restarted, a proxy cut it) it
 * reconnects with Last-Event-ID, so no event is printed twice or lost; kilnd keeps every event
 * in its job store, which is what makes that possible.
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"

const char kiln_cli_jobs_usage[] =
    "  train submit SPEC.json [--watch]   submit a training job (docs/jobs.md); --watch follows it\n"
    "  jobs [--state S]                   list jobs (S: queued, running, succeeded, failed, cancelled)\n"
    "  job ID                             one job: state, progress, latest metrics, checkpoints, error\n"
    "  cancel ID                          cancel a queued or running job\n"
    "  resume ID                          continue a failed or cancelled job from its checkpoint\n"
    "  watch ID                           follow a job's progress until it ends\n"
    "  models                             the model repository and what is loaded\n"
    "  predict MODEL --json JSON          run inference: a KServe v2 request body, or a nested array\n"
    "                                     of numbers for a model with one input\n";

static const char *const commands[] = {"train", "jobs", "job", "cancel", "resume", "watch", "models", "predict", NULL};

bool kiln_cli_jobs_known(const char *cmd)
{
    for (int i = 0; commands[i]; i++)
        if (strcmp(commands[i], cmd) == 0)
            return true;
    return false;
}

static cJSON *parse_body(const struct response *r)
{
    return cJSON_ParseWithLength(r->body, r->body_len);
}

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

static bool valid_id(const char *s)
{
    return s && *s && strspn(s, "0123456789") == strlen(s) && strlen(s) < 19;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "kiln: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += got;
        if (n + 1 == cap) {
            char *g = realloc(buf, cap * 2);
            if (!g) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = g;
            cap *= 2;
        }
    }
    if (f != stdin)
        fclose(f);
    if (buf)
        buf[n] = '\0';
    *len = n;
    return buf;
}

/* ---- watch ------------------------------------------------------------------------------ */

struct watch {
    long long id;
    double epochs;           /* from the spec: the events carry the epoch, not the total */
    bool done;
    int exit_code;
    char last_id[32];
};

static void print_event(struct watch *w, const char *type, const char *data)
{
    cJSON *o = cJSON_Parse(data);
    if (!o)
        return;
    if (!strcmp(type, "state")) {
        const char *st = str_of(o, "state");
        const char *err = str_of(o, "error");
        printf("job %lld: %s%s%s\n", w->id, st ? st : "?", err ? ": " : "", err ? err : "");
        if (st && (!strcmp(st, "succeeded") || !strcmp(st, "failed") || !strcmp(st, "cancelled"))) {
            w->done = true;
            w->exit_code = strcmp(st, "succeeded") == 0 ? 0 : 1;
            const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "metrics");
            if (m && isfinite(num_of(m, "valid_accuracy")))
                printf("job %lld: final valid_accuracy %.4f valid_loss %.4f train_loss %.4f\n", w->id,
                       num_of(m, "valid_accuracy"), num_of(m, "valid_loss"), num_of(m, "train_loss"));
        }
    } else if (!strcmp(type, "log")) {
        printf("job %lld: %s\n", w->id, str_of(o, "message") ? str_of(o, "message") : "");
    } else if (!strcmp(type, "step")) {
        printf("epoch %.0f/%.0f  batch %.0f/%.0f  step %.0f  loss %.4f  acc %.3f  lr %.3g  %.0f items/s\n",
               num_of(o, "epoch"), w->epochs, num_of(o, "batch") + 1, num_of(o, "batches"), num_of(o, "step"),
               num_of(o, "loss"), num_of(o, "accuracy"), num_of(o, "lr"), num_of(o, "items_per_sec"));
    } else if (!strcmp(type, "epoch")) {
        printf("epoch %.0f/%.0f done  train_loss %.4f  train_acc %.3f  valid_loss %.4f  valid_acc %.3f  %.2fs\n",
               num_of(o, "epoch"), w->epochs, num_of(o, "train_loss"), num_of(o, "train_accuracy"),
               num_of(o, "valid_loss"), num_of(o, "valid_accuracy"), num_of(o, "epoch_seconds"));
    } else if (!strcmp(type, "checkpoint")) {
        printf("checkpoint at step %.0f\n", num_of(o, "step"));
    } else if (!strcmp(type, "model")) {
        printf("model %s version %.0f registered; serving at /v2/models/%s/infer\n", str_of(o, "name"),
               num_of(o, "version"), str_of(o, "name"));
    }
    fflush(stdout);
    cJSON_Delete(o);
}

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* One connection's worth of the stream. 0 when it ended (job over or connection closed),
 * -1 when it could not be opened or kilnd refused it (printed), -2 when interrupted. */
static int stream_once(const struct kiln_client *cl, struct watch *w)
{
    char path[64], hdr[64] = "";
    snprintf(path, sizeof path, "/v1/jobs/%lld/events", w->id);
    if (w->last_id[0])
        snprintf(hdr, sizeof hdr, "Last-Event-ID: %s\r\n", w->last_id);
    int fd = kiln_cli_send_request(cl, "GET", path, NULL, 0, hdr);
    if (fd < 0)
        return -1;
    char buf[8192];
    size_t len = 0;
    bool headers = true;
    char type[64] = "message";
    char *data = NULL;
    size_t dlen = 0;
    int rc = 0;
    for (;;) {
        if (interrupted) {
            rc = -2;
            break;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int pr = poll(&p, 1, 500);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr == 0)
            continue;
        ssize_t got = recv(fd, buf + len, sizeof buf - len - 1, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        len += (size_t)got;
        buf[len] = '\0';
        if (headers) {
            char *end = strstr(buf, "\r\n\r\n");
            if (!end) {
                if (len + 1 >= sizeof buf) {
                    rc = -1;
                    break;
                }
                continue;
            }
            int status = strncmp(buf, "HTTP/1.", 7) == 0 ? atoi(buf + 9) : 0;
            if (status != 200) {
                /* An error answer: read the rest and show it. */
                size_t cap = len + 4096;
                char *all = malloc(cap);
                if (all) {
                    memcpy(all, buf, len);
                    size_t n = len;
                    ssize_t g;
                    while (n + 1 < cap && (g = recv(fd, all + n, cap - n - 1, 0)) > 0)
                        n += (size_t)g;
                    all[n] = '\0';
                    char *e = strstr(all, "\r\n\r\n");
                    struct response r = {status, all, e ? e + 4 : all + n, e ? n - (size_t)(e + 4 - all) : 0};
                    kiln_cli_print_error("watch", &r);
                    free(all);
                }
                rc = -1;
                break;
            }
            size_t skip = (size_t)(end + 4 - buf);
            memmove(buf, buf + skip, len - skip + 1);
            len -= skip;
            headers = false;
        }
        char *line;
        while ((line = memchr(buf, '\n', len))) {
            *line = '\0';
            size_t ll = (size_t)(line - buf);
            if (ll && buf[ll - 1] == '\r')
                buf[ll - 1] = '\0';
            if (buf[0] == '\0') {
                if (data)
                    print_event(w, type, data);
                free(data);
                data = NULL;
                dlen = 0;
                snprintf(type, sizeof type, "message");
            } else if (!strncmp(buf, "id: ", 4)) {
                snprintf(w->last_id, sizeof w->last_id, "%.30s", buf + 4);
            } else if (!strncmp(buf, "event: ", 7)) {
                snprintf(type, sizeof type, "%.60s", buf + 7);
            } else if (!strncmp(buf, "data: ", 6)) {
                size_t n = strlen(buf + 6);
                char *g = realloc(data, dlen + n + 2);
                if (g) {
                    data = g;
                    if (dlen)
                        data[dlen++] = '\n';
                    memcpy(data + dlen, buf + 6, n + 1);
                    dlen += n;
                }
            }
            size_t used = ll + 1;
            memmove(buf, buf + used, len - used + 1);
            len -= used;
        }
        if (len + 1 >= sizeof buf) /* a line longer than the buffer: not from kilnd */
            len = 0;
        if (w->done)
            break;
    }
    free(data);
    close(fd);
    return rc;
}

static int watch_job(const struct kiln_client *cl, long long id)
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
    cJSON *j = parse_body(&r);
    struct watch w = {.id = id, .epochs = 1};
    double e = num_of(cJSON_GetObjectItemCaseSensitive(j, "spec"), "epochs");
    if (isfinite(e))
        w.epochs = e;
    cJSON_Delete(j);
    free(r.raw);
    struct sigaction sa = {.sa_handler = on_sigint};
    sigaction(SIGINT, &sa, NULL);
    int failures = 0;
    while (!w.done) {
        int rc = stream_once(cl, &w);
        if (rc == -2) {
            fprintf(stderr, "kiln: stopped watching; job %lld goes on (kiln cancel %lld stops it)\n", id, id);
            return 130;
        }
        if (w.done)
            break;
        /* The connection ended before the job: kilnd restarted or drained. Reconnect. */
        if (rc == -1 && ++failures > 30)
            return 2;
        if (rc == 0)
            failures = 0;
        usleep(rc == 0 ? 100000 : 1000000);
    }
    return w.exit_code;
}

/* ---- the other commands -------------------------------------------------------------------- */

static int simple(const struct kiln_client *cl, const char *method, const char *path, const char *what,
                  cJSON **out)
{
    struct response r;
    if (kiln_cli_request(cl, method, path, NULL, 0, &r) != 0)
        return 2;
    int rc = 0;
    if (r.status >= 300) {
        kiln_cli_print_error(what, &r);
        rc = 1;
    } else if (out) {
        *out = parse_body(&r);
    }
    free(r.raw);
    return rc;
}

static int cmd_submit(const struct kiln_client *cl, int argc, char **argv)
{
    const char *file = NULL;
    bool watch = false;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--watch"))
            watch = true;
        else if (!file && (argv[i][0] != '-' || !strcmp(argv[i], "-")))
            file = argv[i];
        else {
            fprintf(stderr, "kiln: train submit: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!file) {
        fprintf(stderr, "kiln: usage: kiln train submit SPEC.json [--watch]\n");
        return 2;
    }
    size_t len;
    char *body = read_file(file, &len);
    if (!body)
        return 2;
    struct response r;
    int rc = kiln_cli_request(cl, "POST", "/v1/jobs", body, len, &r);
    free(body);
    if (rc != 0)
        return 2;
    cJSON *j = parse_body(&r);
    if (r.status != 201) {
        kiln_cli_print_error("train submit", &r);
        const cJSON *probs = cJSON_GetObjectItemCaseSensitive(j, "problems");
        const cJSON *p;
        if (cJSON_GetArraySize(probs) > 1)
            cJSON_ArrayForEach(p, probs) if (cJSON_IsString(p)) fprintf(stderr, "  %s\n", p->valuestring);
        cJSON_Delete(j);
        free(r.raw);
        return 1;
    }
    long long id = (long long)num_of(j, "id");
    cJSON_Delete(j);
    free(r.raw);
    printf("job %lld queued\n", id);
    fflush(stdout);
    return watch ? watch_job(cl, id) : 0;
}

static void print_progress_bar(double f)
{
    int filled = (int)(f * 20 + 0.5);
    printf("[");
    for (int i = 0; i < 20; i++)
        putchar(i < filled ? '#' : '.');
    printf("] %3.0f%%", f * 100);
}

static int cmd_jobs(const struct kiln_client *cl, int argc, char **argv)
{
    char path[128] = "/v1/jobs?limit=1000";
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--state") && i + 1 < argc && strspn(argv[i + 1], "abcdefghijklmnopqrstuvwxyz") ==
                                                             strlen(argv[i + 1]) && strlen(argv[i + 1]) < 20)
            snprintf(path, sizeof path, "/v1/jobs?limit=1000&state=%s", argv[++i]);
        else {
            fprintf(stderr, "kiln: jobs: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    cJSON *j = NULL;
    int rc = simple(cl, "GET", path, "jobs", &j);
    if (rc)
        return rc;
    const cJSON *jobs = cJSON_GetObjectItemCaseSensitive(j, "jobs"), *it;
    printf("%-6s %-10s %-30s %s\n", "ID", "STATE", "PROGRESS", "MODEL");
    cJSON_ArrayForEach(it, jobs)
    {
        printf("%-6.0f %-10s ", num_of(it, "id"), str_of(it, "state") ? str_of(it, "state") : "?");
        print_progress_bar(isfinite(num_of(it, "progress")) ? num_of(it, "progress") : 0);
        printf("  %s\n", str_of(it, "register_as") ? str_of(it, "register_as") : "-");
    }
    if (cJSON_GetArraySize(jobs) == 0)
        printf("(no jobs)\n");
    cJSON_Delete(j);
    return 0;
}

static int cmd_job(const struct kiln_client *cl, const char *id)
{
    char path[48];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    cJSON *j = NULL;
    int rc = simple(cl, "GET", path, "job", &j);
    if (rc)
        return rc;
    printf("job %s: %s  ", id, str_of(j, "state"));
    print_progress_bar(num_of(j, "progress"));
    printf("\n");
    if (str_of(j, "register_as"))
        printf("  register as: %s\n", str_of(j, "register_as"));
    if (str_of(j, "error"))
        printf("  error: %s\n", str_of(j, "error"));
    const cJSON *ep = cJSON_GetObjectItemCaseSensitive(j, "latest_epoch");
    if (cJSON_IsObject(ep))
        printf("  epoch %.0f: train_loss %.4f  train_acc %.4f  valid_loss %.4f  valid_acc %.4f\n",
               num_of(ep, "epoch"), num_of(ep, "train_loss"), num_of(ep, "train_accuracy"), num_of(ep, "valid_loss"),
               num_of(ep, "valid_accuracy"));
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "latest_step");
    if (cJSON_IsObject(st))
        printf("  step %.0f: loss %.4f  lr %.3g\n", num_of(st, "step"), num_of(st, "loss"), num_of(st, "lr"));
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "model");
    if (cJSON_IsObject(m))
        printf("  model: %s version %.0f\n", str_of(m, "name"), num_of(m, "version"));
    const cJSON *cks = cJSON_GetObjectItemCaseSensitive(j, "checkpoints"), *c;
    cJSON_ArrayForEach(c, cks) printf("  checkpoint: step %.0f (epoch %.0f) %s\n", num_of(c, "step"),
                                      num_of(c, "epoch"), str_of(c, "path"));
    const cJSON *logs = cJSON_GetObjectItemCaseSensitive(j, "logs"), *l;
    cJSON_ArrayForEach(l, logs) if (cJSON_IsString(l)) printf("  log: %s\n", l->valuestring);
    cJSON_Delete(j);
    return 0;
}

static int cmd_models(const struct kiln_client *cl)
{
    struct response r;
    if (kiln_cli_request(cl, "POST", "/v2/repository/index", "{}", 2, &r) != 0)
        return 2;
    if (r.status != 200) {
        kiln_cli_print_error("models", &r);
        free(r.raw);
        return 1;
    }
    cJSON *j = parse_body(&r), *it;
    printf("%-24s %-8s %-12s %s\n", "NAME", "VERSION", "STATE", "REASON");
    cJSON_ArrayForEach(it, j)
    {
        printf("%-24s %-8s %-12s %s\n", str_of(it, "name") ? str_of(it, "name") : "?",
               str_of(it, "version") ? str_of(it, "version") : "-", str_of(it, "state") ? str_of(it, "state") : "?",
               str_of(it, "reason") ? str_of(it, "reason") : "");
    }
    cJSON_Delete(j);
    free(r.raw);
    return 0;
}

/* Shape of a nested array of numbers; false when ragged or not numbers. */
static bool nested_shape(const cJSON *a, int depth, long long *shape, int *ndim, cJSON *flat)
{
    if (cJSON_IsNumber(a)) {
        if (*ndim != depth && *ndim != -1)
            return false;
        *ndim = depth;
        cJSON_AddItemToArray(flat, cJSON_CreateNumber(a->valuedouble));
        return true;
    }
    if (!cJSON_IsArray(a) || depth >= 8)
        return false;
    long long n = cJSON_GetArraySize(a);
    if (shape[depth] == -1)
        shape[depth] = n;
    else if (shape[depth] != n)
        return false;
    const cJSON *x;
    cJSON_ArrayForEach(x, a) if (!nested_shape(x, depth + 1, shape, ndim, flat)) return false;
    return true;
}

static int cmd_predict(const struct kiln_client *cl, int argc, char **argv)
{
    const char *model = NULL, *json = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else if (!model && argv[i][0] != '-')
            model = argv[i];
        else {
            fprintf(stderr, "kiln: predict: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!model || !json || strspn(model, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") !=
                               strlen(model) || strlen(model) > 128) {
        fprintf(stderr, "kiln: usage: kiln predict MODEL --json '{\"inputs\": [...]}' | '[[...]]'\n");
        return 2;
    }
    cJSON *in = cJSON_Parse(json);
    if (!in) {
        fprintf(stderr, "kiln: predict: --json is not valid JSON\n");
        return 2;
    }
    char path[200];
    if (cJSON_IsArray(in)) {
        /* A bare tensor: the model's metadata names its one input. */
        snprintf(path, sizeof path, "/v2/models/%s", model);
        cJSON *meta = NULL;
        int rc = simple(cl, "GET", path, "predict", &meta);
        if (rc) {
            cJSON_Delete(in);
            return rc;
        }
        const cJSON *inputs = cJSON_GetObjectItemCaseSensitive(meta, "inputs");
        const cJSON *i0 = cJSON_GetArrayItem(inputs, 0);
        long long shape[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
        int ndim = -1;
        cJSON *flat = cJSON_CreateArray();
        if (cJSON_GetArraySize(inputs) != 1 || !nested_shape(in, 0, shape, &ndim, flat) || ndim < 1) {
            fprintf(stderr, "kiln: predict: give a KServe request body, or a rectangular nested array for a model "
                            "with one input\n");
            cJSON_Delete(flat);
            cJSON_Delete(meta);
            cJSON_Delete(in);
            return 2;
        }
        cJSON *req = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(req, "inputs"), *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "name", str_of(i0, "name") ? str_of(i0, "name") : "x");
        cJSON_AddStringToObject(t, "datatype", str_of(i0, "datatype") ? str_of(i0, "datatype") : "FP32");
        cJSON *sh = cJSON_AddArrayToObject(t, "shape");
        for (int d = 0; d < ndim; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)shape[d]));
        cJSON_AddItemToObject(t, "data", flat);
        cJSON_AddItemToArray(arr, t);
        cJSON_Delete(in);
        cJSON_Delete(meta);
        in = req;
    }
    char *body = cJSON_PrintUnformatted(in);
    cJSON_Delete(in);
    snprintf(path, sizeof path, "/v2/models/%s/infer", model);
    struct response r;
    int rc = body ? kiln_cli_request(cl, "POST", path, body, strlen(body), &r) : -1;
    cJSON_free(body);
    if (rc != 0)
        return 2;
    if (r.status != 200) {
        kiln_cli_print_error("predict", &r);
        free(r.raw);
        return 1;
    }
    cJSON *j = parse_body(&r), *o;
    cJSON_ArrayForEach(o, cJSON_GetObjectItemCaseSensitive(j, "outputs"))
    {
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(o, "shape"), *data = cJSON_GetObjectItemCaseSensitive(o, "data");
        int nd = cJSON_GetArraySize(shape);
        long long rows = nd == 2 ? (long long)cJSON_GetArrayItem(shape, 0)->valuedouble : 1;
        long long cols = nd == 2 ? (long long)cJSON_GetArrayItem(shape, 1)->valuedouble : cJSON_GetArraySize(data);
        printf("%s (%s", str_of(o, "name"), str_of(o, "datatype"));
        for (int d = 0; d < nd; d++)
            printf("%s%.0f", d ? "x" : " ", cJSON_GetArrayItem(shape, d)->valuedouble);
        printf("):\n");
        for (long long rr = 0; rr < rows; rr++) {
            long long best = 0;
            double bv = -INFINITY;
            printf("  [");
            for (long long c = 0; c < cols; c++) {
                const cJSON *v = cJSON_GetArrayItem(data, (int)(rr * cols + c));
                double x = cJSON_IsNumber(v) ? v->valuedouble : NAN;
                printf("%s%.4f", c ? ", " : "", x);
                if (x > bv) {
                    bv = x;
                    best = c;
                }
            }
            printf("]");
            if (nd == 2 && cols > 1)
                printf("  -> class %lld", best);
            printf("\n");
        }
    }
    cJSON_Delete(j);
    free(r.raw);
    return 0;
}

int kiln_cli_jobs_main(const struct kiln_client *cl, const char *cmd, int argc, char **argv)
{
    if (!strcmp(cmd, "train")) {
        if (argc < 1 || strcmp(argv[0], "submit") != 0) {
            fprintf(stderr, "kiln: usage: kiln train submit SPEC.json [--watch]\n");
            return 2;
        }
        return cmd_submit(cl, argc - 1, argv + 1);
    }
    if (!strcmp(cmd, "jobs"))
        return cmd_jobs(cl, argc, argv);
    if (!strcmp(cmd, "models"))
        return argc ? (fprintf(stderr, "kiln: models takes no arguments\n"), 2) : cmd_models(cl);
    if (!strcmp(cmd, "predict"))
        return cmd_predict(cl, argc, argv);
    /* job, cancel, resume, watch: one job id */
    if (argc != 1 || !valid_id(argv[0])) {
        fprintf(stderr, "kiln: usage: kiln %s JOB_ID\n", cmd);
        return 2;
    }
    if (!strcmp(cmd, "job"))
        return cmd_job(cl, argv[0]);
    if (!strcmp(cmd, "watch"))
        return watch_job(cl, atoll(argv[0]));
    char path[64];
    if (!strcmp(cmd, "cancel")) {
        snprintf(path, sizeof path, "/v1/jobs/%s", argv[0]);
        cJSON *j = NULL;
        int rc = simple(cl, "DELETE", path, "cancel", &j);
        if (rc == 0)
            printf("job %s: %s\n", argv[0], str_of(j, "state") ? str_of(j, "state") : "?");
        cJSON_Delete(j);
        return rc;
    }
    snprintf(path, sizeof path, "/v1/jobs/%s/resume", argv[0]);
    cJSON *j = NULL;
    int rc = simple(cl, "POST", path, "resume", &j);
    if (rc == 0)
        printf("job %.0f queued, resuming job %s\n", num_of(j, "id"), argv[0]);
    cJSON_Delete(j);
    return rc;
}
