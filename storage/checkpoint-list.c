/*
 * storage/checkpoint-list.c — the checkpoint folders under a root: listing them with their
 * validity, opening the newest that verifies, and retention (which ones to remove). The
 * folder format and the write protocol are in checkpoint.c.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint-impl.h"
#include "error-impl.h"
#include "kiln/record.h"
#include "storage-impl.h"

void kiln_ckpt_list_free(kiln_ckpt_info *list, int n)
{
    for (int i = 0; list && i < n; i++) {
        free(list[i].path);
        free(list[i].why);
    }
    free(list);
}

static int info_cmp(const void *a, const void *b)
{
    const kiln_ckpt_info *x = a, *y = b;
    if (x->step != y->step)
        return x->step < y->step ? -1 : 1;
    if (x->valid != y->valid) /* at equal steps, a finished one sorts after the debris */
        return x->valid ? 1 : -1;
    return strcmp(x->path, y->path);
}

static void info_fill(kiln_ckpt_info *e, const char *name, bool verify, const char *metric)
{
    int64_t tmp_step = kiln__ckpt_name_step(name, ".tmp-step-");
    if (tmp_step >= 0 || strncmp(name, ".trash-", 7) == 0) {
        e->step = tmp_step;
        e->why = strdup(tmp_step >= 0 ? "partial: temporary folder of a save that did not finish"
                                      : "partial: a removal that did not finish");
        return;
    }
    e->step = kiln__ckpt_name_step(name, "step-");
    cJSON *man = kiln__ckpt_read_manifest(e->path);
    if (man) {
        kiln__ckpt_json_i64(cJSON_GetObjectItemCaseSensitive(man, "step"), &e->step);
        kiln__ckpt_json_i64(cJSON_GetObjectItemCaseSensitive(man, "epoch"), &e->epoch);
        const cJSON *m = metric ? cJSON_GetObjectItemCaseSensitive(
                                      cJSON_GetObjectItemCaseSensitive(man, "metrics"), metric)
                                : NULL;
        if (kiln__ckpt_metric_of(m, &e->metric))
            e->has_metric = true;
        if (e->step != kiln__ckpt_name_step(name, "step-"))
            kiln__error_set("manifest step does not match the folder name");
        else if (!verify || kiln__ckpt_verify_files(e->path, man) == 0)
            e->valid = true;
        cJSON_Delete(man);
    }
    if (!e->valid)
        e->why = strdup(kiln_error());
}

int kiln_ckpt_list(const char *root, bool verify, const char *metric, kiln_ckpt_info **out, int *n)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(root);
    if (!d) {
        if (errno == ENOENT)
            return 0; /* no checkpoints yet */
        return kiln__error_set("checkpoint list '%s': %s", root, strerror(errno)), KILN_EIO;
    }
    kiln_ckpt_info *list = NULL;
    int count = 0, cap = 0, rc = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *name = de->d_name;
        if (strncmp(name, "step-", 5) != 0 && strncmp(name, ".tmp-step-", 10) != 0 &&
            strncmp(name, ".trash-", 7) != 0)
            continue;
        if (count == cap) {
            cap = cap ? cap * 2 : 16;
            kiln_ckpt_info *next = realloc(list, (size_t)cap * sizeof *list);
            if (!next) {
                rc = KILN_ENOMEM;
                break;
            }
            list = next;
        }
        kiln_ckpt_info *e = &list[count];
        memset(e, 0, sizeof *e);
        e->step = -1;
        if (!(e->path = kiln__ckpt_path_join(root, name))) {
            rc = KILN_ENOMEM;
            break;
        }
        count++;
        info_fill(e, name, verify, metric);
    }
    closedir(d);
    if (rc != 0) {
        kiln_ckpt_list_free(list, count);
        return kiln__error_set("checkpoint list '%s': out of memory", root), rc;
    }
    if (count > 1)
        qsort(list, (size_t)count, sizeof *list, info_cmp);
    *out = list;
    *n = count;
    return 0;
}

kiln_ckpt *kiln_ckpt_open_latest(const char *root, kiln_ckpt_skip_fn skip, void *user)
{
    kiln_ckpt_info *list;
    int n;
    if (!root || kiln_ckpt_list(root, false, NULL, &list, &n) != 0)
        return root ? NULL : (kiln__error_set("checkpoint: NULL root"), NULL);
    kiln_ckpt *ck = NULL;
    for (int i = n - 1; i >= 0 && !ck; i--) {
        if (!list[i].valid) {
            if (skip)
                skip(list[i].path, list[i].why ? list[i].why : "invalid", user);
            continue;
        }
        ck = kiln_ckpt_open(list[i].path);
        if (!ck && skip)
            skip(list[i].path, kiln_error(), user);
    }
    kiln_ckpt_list_free(list, n);
    if (!ck)
        kiln__error_set("checkpoint: no usable checkpoint under '%s'", root);
    return ck;
}

/* --------------------------------------------------------------------- retention */

/* The manifest and every file of one checkpoint folder; 0 or negative with the reason. */
static int verify_folder(const char *path)
{
    cJSON *man = kiln__ckpt_read_manifest(path);
    if (!man)
        return KILN_EINVAL;
    int rc = kiln__ckpt_verify_files(path, man);
    cJSON_Delete(man);
    return rc;
}

typedef struct rank {
    int index;
    double metric;
} rank;

/* Ties go to the newer checkpoint (higher index), so the choice does not depend on qsort. */
static int rank_cmp_min(const void *a, const void *b)
{
    const rank *x = a, *y = b;
    if (x->metric != y->metric)
        return x->metric < y->metric ? -1 : 1;
    return y->index - x->index;
}

static int rank_cmp_max(const void *a, const void *b)
{
    const rank *x = a, *y = b;
    if (x->metric != y->metric)
        return x->metric > y->metric ? -1 : 1;
    return y->index - x->index;
}

int kiln_ckpt_retain(const char *root, const kiln_ckpt_retention *policy, int *removed)
{
    if (removed)
        *removed = 0;
    if (!root || !policy || policy->keep_last < 0 || policy->keep_best < 0)
        return kiln__error_set("checkpoint retain: invalid arguments"), KILN_EINVAL;
    kiln_ckpt_info *list;
    int n;
    int rc = kiln_ckpt_list(root, policy->remove_damaged, policy->best_metric, &list, &n);
    if (rc != 0)
        return rc;
    /* Without remove_damaged the list judged validity by the manifests alone, so a newest
     * checkpoint whose files were damaged after they were written counted as valid and
     * newest, and every good one could go. Verify from the newest down until one really
     * verifies: that one is kept below; the damaged ones above it count as invalid. */
    for (int i = n - 1; i >= 0 && !policy->remove_damaged; i--) {
        if (!list[i].valid)
            continue;
        if (verify_folder(list[i].path) == 0)
            break;
        list[i].valid = false;
        list[i].why = strdup(kiln_error());
    }
    bool *keep = calloc((size_t)n + 1, sizeof *keep);
    rank *ranks = calloc((size_t)n + 1, sizeof *ranks);
    if (!keep || !ranks) {
        free(keep);
        free(ranks);
        kiln_ckpt_list_free(list, n);
        return kiln__error_set_code(KILN_ENOMEM, "checkpoint retain: out of memory");
    }
    /* The newest valid checkpoint is always kept, whatever the policy: it is what a
     * resumed job starts from. */
    int kept_last = 0, newest = -1, nranks = 0;
    for (int i = n - 1; i >= 0; i--) {
        if (!list[i].valid)
            continue;
        if (newest < 0)
            newest = i;
        if (kept_last < policy->keep_last) {
            keep[i] = true;
            kept_last++;
        }
        /* NaN is worst whichever way is better: never kept for its metric (and a NaN in
         * the comparisons below would leave qsort without an order) */
        if (list[i].has_metric && !isnan(list[i].metric))
            ranks[nranks++] = (rank){i, list[i].metric};
    }
    if (newest >= 0)
        keep[newest] = true;
    if (policy->best_metric) {
        int want = policy->keep_best > 0 ? policy->keep_best : 1;
        qsort(ranks, (size_t)nranks, sizeof *ranks, policy->best_max ? rank_cmp_max : rank_cmp_min);
        for (int r = 0; r < nranks && r < want; r++)
            keep[ranks[r].index] = true;
    }
    int count = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (keep[i] || (!list[i].valid && !policy->remove_damaged))
            continue;
        const char *base = strrchr(list[i].path, '/') + 1;
        /* Debris (.tmp-, .trash-) is already out of sight: delete it directly. */
        rc = base[0] == '.' ? kiln__remove_tree(list[i].path) : kiln__ckpt_discard_dir(root, list[i].path);
        if (rc == 0)
            count++;
    }
    if (removed)
        *removed = count;
    free(keep);
    free(ranks);
    kiln_ckpt_list_free(list, n);
    return rc;
}
