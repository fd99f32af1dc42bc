/*
 * clients/jobs.c — the kiln CLI's training and model commands: train submit, jobs, jobs rm, job,
 * cancel, resume, models, load, unload, predict (watch is clients/watch.c).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "predict-ints.h"
#include "predict-output.h"

const char kiln_cli_jobs_usage[] =
    "  train submit SPEC.json [--watch] [--plain]\n"
    "                                     submit a training job (docs/jobs.md); --watch follows it\n"
    "  jobs [--state S]                   list jobs (S: queued, running, succeeded, failed, cancelled)\n"
    "  jobs rm ID                         remove an ended job: its record, checkpoints, metrics and events\n"
    "                                     (a model version it registered stays in the repository)\n"
    "  job ID                             one job: state, progress, latest metrics, checkpoints, error\n"
    "  cancel ID                          cancel a queued or running job\n"
    "  resume ID                          continue a failed or cancelled job from its checkpoint\n"
    "  watch ID [--plain] [--exit-on-end] follow a job: a live dashboard on a terminal (q quits),\n"
    "                                     one line per event otherwise or with --plain\n"
    "  models                             the model repository and what is loaded\n"
    "  load MODEL / unload MODEL          load a repository model for serving, or unload it\n"
    "  predict MODEL --json JSON | --file FILE\n"
    "                                     run inference: a KServe v2 request body, or a nested array\n"
    "                                     of numbers for a model with one input (FILE: the same JSON);\n"
    "                                     integer inputs are sent exactly, out-of-range ones refused\n";

static const char *const commands[] = {"train", "jobs", "job", "cancel", "resume", "watch", "models", "load", "unload", "predict", NULL};

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

bool kiln_cli_job_id_valid(const char *s)
{
    /* job ids start at 1: 0 (or 000) names no job, so it is a usage error like -1 */
    return s && *s && strspn(s, "0123456789") == strlen(s) && strlen(s) < 19 && s[0] != '0';
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "kiln: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    /* fopen takes a folder; reading it is what fails */
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "kiln: cannot read %s: %s\n", path, strerror(EISDIR));
        if (f != stdin)
            fclose(f);
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
    if (buf && ferror(f)) {
        fprintf(stderr, "kiln: cannot read %s: %s\n", path, strerror(errno));
        free(buf);
        buf = NULL;
    }
    if (f != stdin)
        fclose(f);
    if (buf)
        buf[n] = '\0';
    *len = n;
    return buf;
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
    bool watch = false, plain = false;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--watch"))
            watch = true;
        else if (!strcmp(argv[i], "--plain"))
            plain = true;
        else if (!file && (argv[i][0] != '-' || !strcmp(argv[i], "-")))
            file = argv[i];
        else {
            fprintf(stderr, "kiln: train submit: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!file) {
        fprintf(stderr, "kiln: usage: kiln train submit SPEC.json [--watch] [--plain]\n");
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
    return watch ? kiln_cli_watch(cl, id, kiln_cli_is_tty() && !plain, false) : 0;
}

static void print_progress_bar(double f)
{
    int filled = (int)(f * 20 + 0.5);
    printf("[");
    for (int i = 0; i < 20; i++)
        putchar(i < filled ? '#' : '.');
    printf("] %3.0f%%", f * 100);
}

/* kiln jobs rm ID: DELETE /v1/jobs/ID?purge=true. A job that has not ended is the server's 409,
 * printed as it gives it (cancel first, then rm). */
static int cmd_jobs_rm(const struct kiln_client *cl, int argc, char **argv)
{
    if (argc != 1 || !kiln_cli_job_id_valid(argv[0])) {
        fprintf(stderr, "kiln: usage: kiln jobs rm JOB_ID (a job id: 1, 2, ...)\n");
        return 2;
    }
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%s?purge=true", argv[0]);
    cJSON *j = NULL;
    int rc = simple(cl, "DELETE", path, "jobs rm", &j);
    if (rc)
        return rc;
    double bytes = num_of(j, "bytes_freed");
    printf("job %s removed: %.0f files, %.0f bytes freed, %.0f events\n", argv[0], num_of(j, "files_removed"),
           isfinite(bytes) ? bytes : 0, num_of(j, "events_removed"));
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "model_kept");
    if (cJSON_IsObject(m))
        printf("  model %s version %.0f, which it registered, stays in the repository\n", str_of(m, "name"),
               num_of(m, "version"));
    if (str_of(j, "left_behind"))
        fprintf(stderr, "kiln: jobs rm: left behind: %s\n", str_of(j, "left_behind"));
    cJSON_Delete(j);
    return 0;
}

static int cmd_jobs(const struct kiln_client *cl, int argc, char **argv)
{
    if (argc >= 1 && !strcmp(argv[0], "rm"))
        return cmd_jobs_rm(cl, argc - 1, argv + 1);
    const char *state = NULL;
    static const char states[] = "queued, running, succeeded, failed or cancelled";
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--state") && i + 1 == argc) {
            fprintf(stderr, "kiln: jobs: --state needs a value: %s\n", states);
            return 2;
        }
        if (!strcmp(argv[i], "--state") && state) {
            fprintf(stderr, "kiln: jobs: --state is given twice; give one state\n");
            return 2;
        }
        if (!strcmp(argv[i], "--state")) {
            const char *v = argv[++i];
            if (strcmp(v, "queued") && strcmp(v, "running") && strcmp(v, "succeeded") && strcmp(v, "failed") &&
                strcmp(v, "cancelled")) {
                fprintf(stderr, "kiln: jobs: --state '%.40s' is no job state: %s (lower case)\n", v, states);
                return 2;
            }
            state = v;
        } else {
            fprintf(stderr, "kiln: jobs: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    /* Every page, oldest first, following next_after: the newest jobs are the last page's. The
     * header comes with the first answer, so a kilnd that cannot be reached prints only why. */
    long long shown = 0;
    char after[32] = "";
    for (;;) {
        char path[160];
        snprintf(path, sizeof path, "/v1/jobs?limit=1000%s%s%s%s", state ? "&state=" : "", state ? state : "",
                 after[0] ? "&after=" : "", after);
        cJSON *j = NULL;
        int rc = simple(cl, "GET", path, "jobs", &j);
        if (rc)
            return rc;
        if (!after[0])
            printf("%-6s %-10s %-27s  %s\n", "ID", "STATE", "PROGRESS", "MODEL");
        const cJSON *jobs = cJSON_GetObjectItemCaseSensitive(j, "jobs"), *it;
        cJSON_ArrayForEach(it, jobs)
        {
            printf("%-6.0f %-10s ", num_of(it, "id"), str_of(it, "state") ? str_of(it, "state") : "?");
            print_progress_bar(isfinite(num_of(it, "progress")) ? num_of(it, "progress") : 0);
            printf("  %s\n", str_of(it, "register_as") ? str_of(it, "register_as") : "-");
            shown++;
        }
        const cJSON *next = cJSON_GetObjectItemCaseSensitive(j, "next_after");
        bool more = cJSON_IsNumber(next) && cJSON_GetArraySize(jobs) > 0;
        if (more)
            snprintf(after, sizeof after, "%.0f", next->valuedouble);
        cJSON_Delete(j);
        if (!more)
            break;
    }
    if (shown == 0)
        printf("(no jobs)\n");
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

/* POST /v2/repository/models/NAME/load or .../unload (the KServe repository extension). */
static int cmd_load(const struct kiln_client *cl, const char *cmd, int argc, char **argv)
{
    if (argc != 1) {
        fprintf(stderr, "kiln: usage: kiln %s MODEL\n", cmd);
        return 2;
    }
    if (strspn(argv[0], "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") != strlen(argv[0]) ||
        !argv[0][0] || strlen(argv[0]) > 128) {
        fprintf(stderr, "kiln: %s: '%.140s' is no model name: 1 to 128 of A-Z a-z 0-9 _ . -\n", cmd, argv[0]);
        return 2;
    }
    char path[200];
    snprintf(path, sizeof path, "/v2/repository/models/%s/%s", argv[0], cmd);
    struct response r;
    if (kiln_cli_request(cl, "POST", path, "{}", 2, &r) != 0)
        return 2;
    int rc = 0;
    if (r.status != 200) {
        kiln_cli_print_error(cmd, &r);
        rc = 1;
    } else {
        printf("model %s %s\n", argv[0], !strcmp(cmd, "load") ? "loaded" : "unloaded");
    }
    free(r.raw);
    return rc;
}

/* Shape of a nested array of numbers or booleans; false when ragged or not numbers. */
static bool nested_shape(const cJSON *a, int depth, long long *shape, int *ndim, cJSON *flat)
{
    if (cJSON_IsNumber(a) || cJSON_IsBool(a)) { /* booleans for a BOOL input; kilnd checks the datatype */
        if (*ndim != depth && *ndim != -1)
            return false;
        *ndim = depth;
        cJSON_AddItemToArray(flat, cJSON_IsBool(a) ? cJSON_CreateBool(cJSON_IsTrue(a))
                                                   : cJSON_CreateNumber(a->valuedouble));
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

/* A number cJSON read as infinite (1e400): sent, it would be null, which kilnd refuses as "not a
 * number" without saying why. */
static const cJSON *first_non_finite(const cJSON *j)
{
    if (cJSON_IsNumber(j))
        return isfinite(j->valuedouble) ? NULL : j;
    for (const cJSON *c = j ? j->child : NULL; c; c = c->next) {
        const cJSON *f = first_non_finite(c);
        if (f)
            return f;
    }
    return NULL;
}

static int cmd_predict(const struct kiln_client *cl, int argc, char **argv)
{
    const char *model = NULL, *json = NULL, *file = NULL;
    for (int i = 0; i < argc; i++) {
        bool takes_value = !strcmp(argv[i], "--json") || !strcmp(argv[i], "--file");
        if (takes_value && i + 1 == argc) {
            fprintf(stderr, "kiln: predict: %s needs a value\n", argv[i]);
            return 2;
        }
        if (takes_value && (json || file)) {
            fprintf(stderr, "kiln: predict: give one of --json and --file, once\n");
            return 2;
        }
        if (!strcmp(argv[i], "--json") && i + 1 < argc && !json && !file)
            json = argv[++i];
        else if (!strcmp(argv[i], "--file") && i + 1 < argc && !json && !file)
            file = argv[++i];
        else if (!model && argv[i][0] != '-')
            model = argv[i];
        else {
            fprintf(stderr, "kiln: predict: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (model &&
        (strspn(model, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") != strlen(model) ||
         strlen(model) > 128)) {
        fprintf(stderr, "kiln: predict: '%.140s' is no model name: 1 to 128 of A-Z a-z 0-9 _ . -\n", model);
        return 2;
    }
    if (!model || (!json && !file)) {
        fprintf(stderr, "kiln: usage: kiln predict MODEL --json '{\"inputs\": [...]}' | '[[...]]' | --file FILE\n");
        return 2;
    }
    size_t flen = 0;
    char *ftext = file ? read_file(file, &flen) : NULL;
    if (file && !ftext)
        return 2;
    char bad[300];
    cJSON *in = kiln_cli_parse_json(file ? ftext : json, file ? flen : strlen(json), bad, sizeof bad);
    const cJSON *huge = in ? first_non_finite(in) : NULL;
    if (!in || huge) {
        fprintf(stderr, "kiln: predict: %s%s %s\n", file ? file : "--json", file ? "" : " value",
                in ? "holds a number too large for any float type (past 1.8e308)" : bad);
        cJSON_Delete(in);
        free(ftext);
        return 2;
    }
    /* the text itself, for the integer inputs: cJSON's doubles round them past 2^53 */
    const char *text = file ? ftext : json;
    size_t text_len = file ? flen : strlen(json);
    char why[512];
    char path[200];
    if (cJSON_IsArray(in)) {
        /* A bare tensor: the model's metadata names its one input. */
        snprintf(path, sizeof path, "/v2/models/%s", model);
        cJSON *meta = NULL;
        int rc = simple(cl, "GET", path, "predict", &meta);
        if (rc) {
            cJSON_Delete(in);
            free(ftext);
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
            free(ftext);
            return 2;
        }
        const char *input_name = str_of(i0, "name") ? str_of(i0, "name") : "x";
        if (kiln_cli_int_datatype(str_of(i0, "datatype"))) {
            cJSON_Delete(flat);
            flat = kiln_cli_exact_int_array(text, text_len, input_name, str_of(i0, "datatype"), why, sizeof why);
            if (!flat) {
                fprintf(stderr, "kiln: predict: %s\n", why);
                cJSON_Delete(meta);
                cJSON_Delete(in);
                free(ftext);
                return 2;
            }
        }
        cJSON *req = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(req, "inputs"), *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "name", input_name);
        cJSON_AddStringToObject(t, "datatype", str_of(i0, "datatype") ? str_of(i0, "datatype") : "FP32");
        cJSON *sh = cJSON_AddArrayToObject(t, "shape");
        for (int d = 0; d < ndim; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)shape[d]));
        cJSON_AddItemToObject(t, "data", flat);
        cJSON_AddItemToArray(arr, t);
        cJSON_Delete(in);
        cJSON_Delete(meta);
        in = req;
    } else if (kiln_cli_exact_int_inputs(in, text, text_len, why, sizeof why) != 0) {
        fprintf(stderr, "kiln: predict: %s\n", why);
        cJSON_Delete(in);
        free(ftext);
        return 2;
    }
    free(ftext);
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
    rc = kiln_cli_print_infer_response(&r, "predict") == 0 ? 0 : 1;
    free(r.raw);
    return rc;
}

int kiln_cli_jobs_main(const struct kiln_client *cl, const char *cmd, int argc, char **argv)
{
    if (!strcmp(cmd, "train")) {
        if (argc < 1 || strcmp(argv[0], "submit") != 0) {
            fprintf(stderr, "kiln: usage: kiln train submit SPEC.json [--watch] [--plain]\n");
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
    if (!strcmp(cmd, "watch"))
        return kiln_cli_watch_main(cl, argc, argv);
    if (!strcmp(cmd, "load") || !strcmp(cmd, "unload"))
        return cmd_load(cl, cmd, argc, argv);
    /* job, cancel, resume, watch: one job id */
    if (argc != 1 || !kiln_cli_job_id_valid(argv[0])) {
        fprintf(stderr, "kiln: usage: kiln %s JOB_ID (a job id: 1, 2, ...)\n", cmd);
        return 2;
    }
    if (!strcmp(cmd, "job"))
        return cmd_job(cl, argv[0]);
    char path[64];
    if (!strcmp(cmd, "cancel")) {
        snprintf(path, sizeof path, "/v1/jobs/%s", argv[0]);
        struct response r;
        if (kiln_cli_request(cl, "DELETE", path, NULL, 0, &r) != 0)
            return 2;
        int rc = 0;
        if (r.status == 409 && memmem(r.body, r.body_len, "?purge=true", 11)) {
            /* an ended job: kilnd names its API's purge; the CLI's own command does it */
            kiln_cli_print_error("cancel", &r);
            fprintf(stderr, "kiln: cancel: job %s has ended; kiln jobs rm %s removes it\n", argv[0], argv[0]);
            rc = 1;
        } else if (r.status >= 300) {
            kiln_cli_print_error("cancel", &r);
            rc = 1;
        } else {
            cJSON *j = parse_body(&r);
            printf("job %s: %s\n", argv[0], str_of(j, "state") ? str_of(j, "state") : "?");
            cJSON_Delete(j);
        }
        free(r.raw);
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
