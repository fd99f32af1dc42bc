/*
 * storage/checkpoint.c — training checkpoints that survive a crash at any instant.
 *
 * A checkpoint is a folder <root>/step-<9+ digits>/ (format in kiln/record.h). The write
 * protocol is what makes "the last good checkpoint is always loadable" true:
 *   1. create <root>/.tmp-step-N-XXXXXX; every file is written through the atomic-file
 *      helpers (temp name, fsync, rename, fsync of the folder);
 *   2. MANIFEST goes last: a first line "kiln-checkpoint 1 <xxh3 of the rest>" and a JSON
 *      body listing each file's size and XXH3-64, so a torn or flipped manifest is caught;
 *   3. the folder is renamed to step-N and the root fsynced.
 * Readers only consider step-* folders whose manifest verifies and whose files match it,
 * so a crash before step 3 leaves a .tmp- folder that is reported and never chosen, and
 * a crash after it leaves a complete checkpoint. Removal renames to .trash- first, so a
 * half-deleted folder is never mistaken for a checkpoint either. Listing, "latest good"
 * and retention are in checkpoint-list.c.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "checkpoint-impl.h"
#include "error-impl.h"
#include "kiln/record.h"
#include "storage-impl.h"

#define MANIFEST "MANIFEST"
#define MANIFEST_MAGIC "kiln-checkpoint 1 "
#define MANIFEST_MAX (1u << 20)
#define SMALL_JSON_MAX (64u << 20)
#define CKPT_MAX_COUNT ((int64_t)1 << 53) /* largest step or epoch a JSON number holds exactly */

struct kiln_ckpt {
    char *path;
    int64_t step, epoch;
    kiln_record *model, *optim;
    char *scheduler, *metrics_history;
    int rng_n;
    kiln_generator *rng;
    cJSON *metrics; /* latest values from the manifest */
};

/* The files a complete checkpoint holds besides the manifest. */
static const char *const ckpt_files[] = {"model.kiln", "optimizer.kiln", "trainer.json", "metrics.json"};
#define CKPT_NFILES (int)(sizeof ckpt_files / sizeof ckpt_files[0])

char *kiln__ckpt_path_join(const char *a, const char *b)
{
    size_t len = strlen(a) + strlen(b) + 2;
    char *p = malloc(len);
    if (p)
        snprintf(p, len, "%s/%s", a, b);
    return p;
}

static int mkdir_p(const char *path)
{
    char *copy = strdup(path);
    if (!copy)
        return kiln__error_set_code(KILN_ENOMEM, "create '%s': out of memory", path);
    for (char *p = copy + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(copy, 0777) != 0 && errno != EEXIST) {
                kiln__error_set("create folder '%s': %s", copy, strerror(errno));
                free(copy);
                return KILN_EIO;
            }
            *p = c;
            if (c == '\0')
                break;
        }
    }
    free(copy);
    return 0;
}

/* XXH3-64 and size of a file, streamed. */
static int hash_file(const char *path, uint64_t *hash, uint64_t *size)
{
    int fd = kiln__open_regular(path, NULL);
    if (fd == KILN__NOT_REGULAR)
        return kiln__error_set("%s: not a regular file", path), KILN_EIO;
    if (fd < 0)
        return kiln__error_set("%s: %s", path, strerror(errno)), KILN_EIO;
    XXH3_state_t *st = XXH3_createState();
    unsigned char *buf = malloc(1 << 20);
    if (!st || !buf) {
        XXH3_freeState(st);
        free(buf);
        close(fd);
        return kiln__error_set_code(KILN_ENOMEM, "%s: out of memory", path);
    }
    XXH3_64bits_reset(st);
    uint64_t total = 0;
    int rc = 0;
    for (;;) {
        ssize_t r = read(fd, buf, 1 << 20);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = kiln__error_set("read '%s': %s", path, strerror(errno));
            rc = KILN_EIO;
            break;
        }
        if (r == 0)
            break;
        XXH3_64bits_update(st, buf, (size_t)r);
        total += (uint64_t)r;
    }
    *hash = XXH3_64bits_digest(st);
    *size = total;
    XXH3_freeState(st);
    free(buf);
    close(fd);
    return rc;
}

static int write_json_file(const char *dir, const char *name, cJSON *json)
{
    char *text = cJSON_Print(json);
    char *path = kiln__ckpt_path_join(dir, name);
    int rc;
    if (!text || !path)
        rc = kiln__error_set_code(KILN_ENOMEM, "checkpoint: out of memory writing %s", name);
    else
        rc = kiln__write_file_atomic(path, text, strlen(text));
    free(text);
    free(path);
    return rc;
}

/* One JSON value with nothing but whitespace after it (cJSON_Parse alone would drop the
 * "trailing" of "{} trailing" without a word). */
static cJSON *parse_whole(const char *text)
{
    return cJSON_ParseWithOpts(text, NULL, true);
}

/* Parse caller JSON, falling back to dflt when NULL; NULL plus a message when invalid. */
static cJSON *parse_or(const char *text, const char *dflt, const char *what)
{
    cJSON *j = parse_whole(text ? text : dflt);
    if (!j)
        kiln__error_set("checkpoint save: %s is not valid JSON", what);
    return j;
}

/* A step or epoch as an exact decimal: cJSON prints numbers with 15 significant digits
 * when that reads back within a relative epsilon, which turns 2^53 into 9.00719925474099e+15
 * (a different integer). */
static void add_count(cJSON *obj, const char *name, int64_t v)
{
    char text[24];
    snprintf(text, sizeof text, "%" PRId64, v);
    cJSON_AddRawToObject(obj, name, text);
}

static int write_manifest(const char *dir, const kiln_ckpt_state *s)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *files = cJSON_AddObjectToObject(root, "files");
    cJSON *metrics = cJSON_AddObjectToObject(root, "metrics");
    char created[32];
    time_t now = time(NULL);
    struct tm tmv;
    strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tmv));
    cJSON_AddNumberToObject(root, "format", 1);
    add_count(root, "step", s->step);
    add_count(root, "epoch", s->epoch);
    cJSON_AddStringToObject(root, "created", created);
    int rc = 0;
    for (int i = 0; i < s->metric_n; i++) {
        double v = s->metric_values[i];
        /* JSON has no inf or NaN (cJSON would write null, read back as no metric, and a
         * diverged loss would drop out of keep-best unseen): they go as strings */
        if (isfinite(v))
            cJSON_AddNumberToObject(metrics, s->metric_names[i], v);
        else
            cJSON_AddStringToObject(metrics, s->metric_names[i], isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
    }
    for (int i = 0; i < CKPT_NFILES && rc == 0; i++) {
        char *p = kiln__ckpt_path_join(dir, ckpt_files[i]);
        uint64_t h = 0, size = 0;
        rc = p ? hash_file(p, &h, &size) : KILN_ENOMEM;
        free(p);
        char hex[17];
        snprintf(hex, sizeof hex, "%016" PRIx64, h);
        cJSON *e = cJSON_AddObjectToObject(files, ckpt_files[i]);
        cJSON_AddNumberToObject(e, "size", (double)size);
        cJSON_AddStringToObject(e, "xxh3", hex);
    }
    char *body = rc == 0 ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (rc != 0)
        return rc;
    if (!body)
        return kiln__error_set_code(KILN_ENOMEM, "checkpoint: out of memory for the manifest");
    size_t blen = strlen(body);
    size_t len = sizeof MANIFEST_MAGIC + 17 + blen + 1;
    char *text = malloc(len);
    char *path = kiln__ckpt_path_join(dir, MANIFEST);
    if (!text || !path)
        rc = kiln__error_set_code(KILN_ENOMEM, "checkpoint: out of memory for the manifest");
    else {
        int n = snprintf(text, len, "%s%016" PRIx64 "\n%s", MANIFEST_MAGIC, (uint64_t)XXH3_64bits(body, blen), body);
        rc = kiln__write_file_atomic(path, text, (size_t)n);
    }
    free(body);
    free(text);
    free(path);
    return rc;
}

/* Write every file of the checkpoint into the (temporary) folder dir. */
static int write_contents(const char *dir, const kiln_ckpt_state *s)
{
    char *p = kiln__ckpt_path_join(dir, "model.kiln");
    int rc = p ? kiln_record_save(p, s->model_n, s->model_names, s->model_tensors, s->model_config,
                                  s->record_flags)
               : KILN_ENOMEM;
    free(p);
    if (rc != 0)
        return rc;
    p = kiln__ckpt_path_join(dir, "optimizer.kiln");
    rc = p ? kiln_record_save(p, s->optim_n, s->optim_names, s->optim_tensors, s->optim_config, s->record_flags)
           : KILN_ENOMEM;
    free(p);
    if (rc != 0)
        return rc;

    cJSON *trainer = cJSON_CreateObject();
    cJSON *sched = parse_or(s->scheduler_json, "{}", "the scheduler state");
    if (!sched) {
        cJSON_Delete(trainer);
        return KILN_EINVAL;
    }
    cJSON_AddNumberToObject(trainer, "format", 1);
    add_count(trainer, "step", s->step);
    add_count(trainer, "epoch", s->epoch);
    cJSON *rng = cJSON_AddArrayToObject(trainer, "rng");
    for (int i = 0; i < s->rng_n; i++) {
        /* u64 as decimal strings: JSON numbers lose bits above 2^53. */
        char seed[24], offset[24];
        snprintf(seed, sizeof seed, "%" PRIu64, s->rng[i].seed);
        snprintf(offset, sizeof offset, "%" PRIu64, s->rng[i].offset);
        cJSON *g = cJSON_CreateObject();
        cJSON_AddStringToObject(g, "seed", seed);
        cJSON_AddStringToObject(g, "offset", offset);
        cJSON_AddItemToArray(rng, g);
    }
    cJSON_AddItemToObject(trainer, "scheduler", sched);
    rc = write_json_file(dir, "trainer.json", trainer);
    cJSON_Delete(trainer);
    if (rc != 0)
        return rc;
    cJSON *hist = parse_or(s->metrics_json, "[]", "the metric history");
    if (!hist)
        return KILN_EINVAL;
    rc = write_json_file(dir, "metrics.json", hist);
    cJSON_Delete(hist);
    if (rc != 0)
        return rc;
    return write_manifest(dir, s);
}

/* Move a folder out of sight (.trash-*) and delete it; the rename makes it vanish atomically. */
int kiln__ckpt_discard_dir(const char *root, const char *path)
{
    char *trash = kiln__ckpt_path_join(root, ".trash-XXXXXX");
    if (!trash)
        return KILN_ENOMEM;
    int rc = 0;
    if (!mkdtemp(trash)) {
        rc = (kiln__error_set("checkpoint: create '%s': %s", trash, strerror(errno)), KILN_EIO);
    } else if (kiln__io.rename(path, trash) != 0) {
        rc = (kiln__error_set("checkpoint: rename '%s': %s", path, strerror(errno)), KILN_EIO);
        rmdir(trash);
    } else {
        rc = kiln__fsync_dir(root);
        int rrc = kiln__remove_tree(trash);
        if (rc == 0)
            rc = rrc;
    }
    free(trash);
    return rc;
}

static bool is_json_or_null(const char *text)
{
    if (!text)
        return true;
    cJSON *j = parse_whole(text);
    cJSON_Delete(j);
    return j != NULL;
}

int kiln_ckpt_save(const char *root, const kiln_ckpt_state *s, char *path_out, size_t len)
{
    if (!root || !s || s->model_n < 0 || s->optim_n < 0 || s->rng_n < 0 || s->metric_n < 0 ||
        (s->rng_n > 0 && !s->rng) || (s->metric_n > 0 && (!s->metric_names || !s->metric_values)))
        return kiln__error_set("checkpoint save: invalid arguments"), KILN_EINVAL;
    /* The manifest holds step and epoch as JSON numbers, which the reader takes only in
     * 0..2^53 (exact in a double): anything else would be saved and never read back. */
    if (s->step < 0 || s->step > CKPT_MAX_COUNT)
        return kiln__error_set("checkpoint save: step %" PRId64 " is outside 0..2^53", s->step), KILN_EINVAL;
    if (s->epoch < 0 || s->epoch > CKPT_MAX_COUNT)
        return kiln__error_set("checkpoint save: epoch %" PRId64 " is outside 0..2^53", s->epoch), KILN_EINVAL;
    for (int i = 0; i < s->metric_n; i++)
        if (!s->metric_names[i] || !s->metric_names[i][0])
            return kiln__error_set("checkpoint save: metric %d has no name", i), KILN_EINVAL;
    if (!is_json_or_null(s->scheduler_json) || !is_json_or_null(s->metrics_json))
        return kiln__error_set("checkpoint save: scheduler or metric history is not valid JSON"), KILN_EINVAL;
    int rc = mkdir_p(root);
    if (rc != 0)
        return rc;
    char name[48], tmpname[64];
    snprintf(name, sizeof name, "step-%09" PRId64, s->step);
    snprintf(tmpname, sizeof tmpname, ".tmp-%s-XXXXXX", name);
    char *tmp = kiln__ckpt_path_join(root, tmpname);
    char *final = kiln__ckpt_path_join(root, name);
    if (!tmp || !final) {
        free(tmp);
        free(final);
        return kiln__error_set_code(KILN_ENOMEM, "checkpoint save: out of memory");
    }
    if (kiln__mkdir_unique(tmp) != 0) { /* not mkdtemp: its 0700 would make the checkpoint private */
        rc = (kiln__error_set("checkpoint save: create '%s': %s", tmp, strerror(errno)), KILN_EIO);
        goto out;
    }
    rc = write_contents(tmp, s);
    if (rc == 0)
        rc = kiln__fsync_dir(tmp);
    struct stat sb;
    char *trash = NULL;
    if (rc == 0 && lstat(final, &sb) == 0) {
        /* Same step saved again (a resumed job re-reaching it): move the old one aside
         * (rename over an empty mkdtemp folder), and put it back if the new one fails. */
        trash = kiln__ckpt_path_join(root, ".trash-XXXXXX");
        if (!trash || !mkdtemp(trash))
            rc = (kiln__error_set("checkpoint save: cannot create a folder in '%s'", root), KILN_EIO);
        else if (kiln__io.rename(final, trash) != 0) {
            rc = (kiln__error_set("checkpoint save: rename '%s': %s", final, strerror(errno)), KILN_EIO);
            rmdir(trash);
            free(trash);
            trash = NULL;
        }
    }
    if (rc == 0 && kiln__io.rename(tmp, final) != 0)
        rc = (kiln__error_set("checkpoint save: rename '%s' to '%s': %s", tmp, final, strerror(errno)), KILN_EIO);
    else if (rc == 0 && (rc = kiln__fsync_dir(root)) != 0) {
        /* Not known to be durable: undo the rename so the caller's error is the truth. */
        (void)rename(final, tmp);
    }
    if (rc != 0) {
        (void)kiln__remove_tree(tmp);
        if (trash && rename(trash, final) != 0)
            (void)kiln__remove_tree(trash);
    } else if (trash) {
        (void)kiln__remove_tree(trash);
    }
    free(trash);
    if (rc == 0 && path_out && len)
        snprintf(path_out, len, "%s", final);
out:
    free(tmp);
    free(final);
    return rc;
}

/* --------------------------------------------------------------------- reading */

void kiln_ckpt_close(kiln_ckpt *ck)
{
    if (!ck)
        return;
    kiln_record_close(ck->model);
    kiln_record_close(ck->optim);
    free(ck->path);
    free(ck->scheduler);
    free(ck->metrics_history);
    free(ck->rng);
    cJSON_Delete(ck->metrics);
    free(ck);
}

bool kiln__ckpt_json_i64(const cJSON *j, int64_t *out)
{
    if (!cJSON_IsNumber(j) || j->valuedouble < 0 || j->valuedouble > (double)CKPT_MAX_COUNT ||
        j->valuedouble != (double)(int64_t)j->valuedouble)
        return false;
    *out = (int64_t)j->valuedouble;
    return true;
}

/* Read and check MANIFEST: the checksum line, the JSON, the step. Returns the JSON body. */
cJSON *kiln__ckpt_read_manifest(const char *dir)
{
    char *p = kiln__ckpt_path_join(dir, MANIFEST);
    char *text = NULL;
    size_t len = 0;
    int rc = p ? kiln__read_file(p, MANIFEST_MAX, &text, &len) : KILN_ENOMEM;
    if (rc != 0) {
        if (rc == KILN_EIO && access(dir, F_OK) == 0 && access(p, F_OK) != 0 && errno == ENOENT)
            kiln__error_set("no readable manifest (the save did not finish)");
        free(p);
        return NULL;
    }
    free(p);
    size_t mlen = strlen(MANIFEST_MAGIC);
    cJSON *json = NULL;
    if (len < mlen + 17 || memcmp(text, MANIFEST_MAGIC, mlen) != 0 || text[mlen + 16] != '\n') {
        kiln__error_set("manifest: bad first line");
    } else {
        char hex[17];
        memcpy(hex, text + mlen, 16);
        hex[16] = '\0';
        const char *body = text + mlen + 17;
        size_t blen = len - mlen - 17;
        char want[17];
        snprintf(want, sizeof want, "%016" PRIx64, (uint64_t)XXH3_64bits(body, blen));
        if (strcmp(hex, want) != 0)
            kiln__error_set("manifest: checksum mismatch (damaged manifest)");
        else if (!(json = cJSON_Parse(body)))
            kiln__error_set("manifest: not valid JSON");
    }
    free(text);
    if (!json)
        return NULL;
    int64_t step, epoch;
    if (!kiln__ckpt_json_i64(cJSON_GetObjectItemCaseSensitive(json, "step"), &step) ||
        !kiln__ckpt_json_i64(cJSON_GetObjectItemCaseSensitive(json, "epoch"), &epoch) ||
        !cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(json, "files"))) {
        kiln__error_set("manifest: missing step, epoch or files");
        cJSON_Delete(json);
        return NULL;
    }
    return json;
}

/* Every listed file exists with the recorded size and hash; every required file is listed. */
int kiln__ckpt_verify_files(const char *dir, const cJSON *manifest)
{
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(manifest, "files");
    for (int i = 0; i < CKPT_NFILES; i++)
        if (!cJSON_GetObjectItemCaseSensitive(files, ckpt_files[i]))
            return kiln__error_set("manifest does not list %s", ckpt_files[i]), KILN_EINVAL;
    const cJSON *e;
    cJSON_ArrayForEach(e, files) {
        const char *name = e->string;
        if (!name || !name[0] || strchr(name, '/') || strcmp(name, "..") == 0 || strcmp(name, ".") == 0)
            return kiln__error_set("manifest names a file outside the folder"), KILN_EINVAL;
        int64_t size;
        const cJSON *hx = cJSON_GetObjectItemCaseSensitive(e, "xxh3");
        if (!kiln__ckpt_json_i64(cJSON_GetObjectItemCaseSensitive(e, "size"), &size) || !cJSON_IsString(hx))
            return kiln__error_set("manifest entry %s is malformed", name), KILN_EINVAL;
        char *p = kiln__ckpt_path_join(dir, name);
        uint64_t h, got;
        int rc = p ? hash_file(p, &h, &got) : KILN_ENOMEM;
        free(p);
        if (rc != 0) {
            char why[KILN_ERROR_MAX];
            snprintf(why, sizeof why, "%s", kiln_error());
            return kiln__error_set("%s is missing or unreadable (%s)", name, why), KILN_EIO;
        }
        if ((int64_t)got != size)
            return kiln__error_set("%s has %" PRIu64 " bytes, the manifest says %" PRId64 " (truncated?)", name,
                                   got, size), KILN_EINVAL;
        char hex[17];
        snprintf(hex, sizeof hex, "%016" PRIx64, h);
        if (strcmp(hex, hx->valuestring) != 0)
            return kiln__error_set("%s checksum mismatch (damaged file)", name), KILN_EINVAL;
    }
    return 0;
}

static int load_trainer(kiln_ckpt *ck)
{
    char *p = kiln__ckpt_path_join(ck->path, "trainer.json");
    char *text = NULL;
    int rc = p ? kiln__read_file(p, SMALL_JSON_MAX, &text, NULL) : KILN_ENOMEM;
    free(p);
    if (rc != 0)
        return rc;
    cJSON *t = cJSON_Parse(text);
    free(text);
    if (!t)
        return kiln__error_set("trainer.json is not valid JSON"), KILN_EINVAL;
    const cJSON *rng = cJSON_GetObjectItemCaseSensitive(t, "rng");
    const cJSON *sched = cJSON_GetObjectItemCaseSensitive(t, "scheduler");
    int64_t step;
    if (!cJSON_IsArray(rng) || !sched ||
        !kiln__ckpt_json_i64(cJSON_GetObjectItemCaseSensitive(t, "step"), &step) || step != ck->step) {
        cJSON_Delete(t);
        return kiln__error_set("trainer.json is malformed or disagrees with the manifest"), KILN_EINVAL;
    }
    ck->rng_n = cJSON_GetArraySize(rng);
    ck->rng = calloc((size_t)ck->rng_n + 1, sizeof *ck->rng);
    ck->scheduler = cJSON_PrintUnformatted(sched);
    rc = ck->rng && ck->scheduler ? 0 : KILN_ENOMEM;
    for (int i = 0; i < ck->rng_n && rc == 0; i++) {
        const cJSON *g = cJSON_GetArrayItem(rng, i);
        const cJSON *seed = cJSON_GetObjectItemCaseSensitive(g, "seed");
        const cJSON *off = cJSON_GetObjectItemCaseSensitive(g, "offset");
        if (!cJSON_IsString(seed) || !cJSON_IsString(off))
            rc = KILN_EINVAL;
        else {
            ck->rng[i].seed = strtoull(seed->valuestring, NULL, 10);
            ck->rng[i].offset = strtoull(off->valuestring, NULL, 10);
        }
    }
    cJSON_Delete(t);
    if (rc != 0)
        kiln__error_set("trainer.json: malformed rng state");
    return rc;
}

/* The step encoded in a folder name ("step-000001200"), or -1. */
int64_t kiln__ckpt_name_step(const char *name, const char *prefix)
{
    size_t pl = strlen(prefix);
    if (strncmp(name, prefix, pl) != 0)
        return -1;
    const char *d = name + pl;
    int64_t v = 0;
    int digits = 0;
    for (; *d >= '0' && *d <= '9' && digits < 18; d++, digits++)
        v = v * 10 + (*d - '0');
    return digits > 0 && (*d == '\0' || *d == '-') ? v : -1;
}

kiln_ckpt *kiln_ckpt_open(const char *dir)
{
    if (!dir)
        return kiln__error_set("checkpoint open: NULL folder"), NULL;
    kiln_ckpt *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->path = strdup(dir))) {
        free(ck);
        return kiln__error_set("checkpoint open: out of memory"), NULL;
    }
    cJSON *man = kiln__ckpt_read_manifest(dir);
    if (!man)
        goto fail;
    kiln__ckpt_json_i64(cJSON_GetObjectItemCaseSensitive(man, "step"), &ck->step);
    kiln__ckpt_json_i64(cJSON_GetObjectItemCaseSensitive(man, "epoch"), &ck->epoch);
    const char *base = strrchr(dir, '/');
    base = base ? base + 1 : dir;
    int64_t ns = kiln__ckpt_name_step(base, "step-");
    if (ns >= 0 && ns != ck->step) {
        kiln__error_set("manifest step %" PRId64 " does not match the folder name", ck->step);
        goto fail_man;
    }
    if (kiln__ckpt_verify_files(dir, man) != 0)
        goto fail_man;
    ck->metrics = cJSON_DetachItemFromObjectCaseSensitive(man, "metrics");
    cJSON_Delete(man);
    man = NULL;
    char *p = kiln__ckpt_path_join(dir, "model.kiln");
    ck->model = p ? kiln_record_open(p) : NULL;
    free(p);
    p = ck->model ? kiln__ckpt_path_join(dir, "optimizer.kiln") : NULL;
    ck->optim = p ? kiln_record_open(p) : NULL;
    free(p);
    if (!ck->model || !ck->optim || load_trainer(ck) != 0)
        goto fail;
    p = kiln__ckpt_path_join(dir, "metrics.json");
    int rc = p ? kiln__read_file(p, SMALL_JSON_MAX, &ck->metrics_history, NULL) : KILN_ENOMEM;
    free(p);
    if (rc != 0)
        goto fail;
    return ck;
fail_man:
    cJSON_Delete(man);
fail:;
    /* Prefix the reason with the folder so a caller's log line stands alone. */
    char why[KILN_ERROR_MAX];
    snprintf(why, sizeof why, "%s", kiln_error());
    kiln__error_set("checkpoint %s: %s", dir, why);
    kiln_ckpt_close(ck);
    return NULL;
}

const char *kiln_ckpt_path(const kiln_ckpt *ck) { return ck ? ck->path : NULL; }
int64_t kiln_ckpt_step(const kiln_ckpt *ck) { return ck ? ck->step : -1; }
int64_t kiln_ckpt_epoch(const kiln_ckpt *ck) { return ck ? ck->epoch : -1; }
const kiln_record *kiln_ckpt_model(const kiln_ckpt *ck) { return ck ? ck->model : NULL; }
const kiln_record *kiln_ckpt_optimizer(const kiln_ckpt *ck) { return ck ? ck->optim : NULL; }
const char *kiln_ckpt_scheduler(const kiln_ckpt *ck) { return ck ? ck->scheduler : NULL; }
const char *kiln_ckpt_metrics_history(const kiln_ckpt *ck) { return ck ? ck->metrics_history : NULL; }

int kiln_ckpt_rng(const kiln_ckpt *ck, kiln_generator *out, int max)
{
    if (!ck)
        return 0;
    for (int i = 0; i < ck->rng_n && i < max && out; i++)
        out[i] = ck->rng[i];
    return ck->rng_n;
}

/* A metric as write_manifest stores it: a number, or "inf", "-inf" or "nan". */
bool kiln__ckpt_metric_of(const cJSON *m, double *value)
{
    const char *s = cJSON_IsString(m) ? m->valuestring : "";
    double v = cJSON_IsNumber(m)    ? m->valuedouble
               : !strcmp(s, "inf")  ? INFINITY
               : !strcmp(s, "-inf") ? -INFINITY
                                    : NAN;
    if (!cJSON_IsNumber(m) && strcmp(s, "nan") && !isinf(v))
        return false;
    if (value)
        *value = v;
    return true;
}

int kiln_ckpt_metric(const kiln_ckpt *ck, const char *name, double *value)
{
    const cJSON *m = ck && name ? cJSON_GetObjectItemCaseSensitive(ck->metrics, name) : NULL;
    return kiln__ckpt_metric_of(m, value) ? 0 : -1;
}
