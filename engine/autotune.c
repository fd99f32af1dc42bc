/*
 * engine/autotune.c — the autotune cache: the winners of kernel choices timed once per
 * shape class, kept per device identity and persisted in a folder.
 *
 * A backend with a choice to make (the cpu's fused block size, later a GPU's workgroup
 * size or GEMM tile) asks kiln__autotune_lookup(device, key); on a miss it times its
 * candidates once and records the winner with kiln__autotune_store. device names the
 * device and its driver ("cpu/avx512/2t": kernel table and thread count; a GPU's name
 * and driver version), key the kernel and shape class. Every entry also carries the
 * kiln version that timed it.
 *
 * The file is <dir>/autotune.tsv, dir from kiln_autotune_dir_set (kilnd passes its data
 * directory) or KILN_AUTOTUNE_DIR; with neither, choices live in memory for the process.
 * A model folder can ship a warmed file: copying it into the data directory is all it
 * takes. Format: a first line "kiln-autotune 1", then one entry per line,
 * "<kiln version>\t<device>\t<key>\t<value>". It is read once, at the first lookup. A file
 * that is malformed anywhere (corrupt) is ignored whole with one line on stderr, and is
 * replaced at the next store; entries timed by another kiln version (stale) are dropped
 * with one line. Stores rewrite the whole file through a temporary name, fsync and
 * rename, so a crash leaves the old file or the new one.
 *
 * One lock guards the table: lookups happen once per kernel launch at most, and stores
 * once per shape class.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "autotune-impl.h"
#include "error-impl.h"
#include "kiln/kiln.h"

#define FIELD_MAX 96

typedef struct tune_entry {
    char device[FIELD_MAX];
    char key[FIELD_MAX];
    int64_t value;
} tune_entry;

static pthread_mutex_t tune_lock = PTHREAD_MUTEX_INITIALIZER;
static tune_entry *entries; /* this kiln version's, and other devices' too */
static int nentries, capentries;
static bool loaded;
static char dir_set[1024]; /* kiln_autotune_dir_set's, "" when unset */

static const char *cache_dir(void)
{
    if (dir_set[0])
        return dir_set;
    const char *env = getenv("KILN_AUTOTUNE_DIR");
    return env && *env ? env : NULL;
}

static int put_entry(const char *device, const char *key, int64_t value)
{
    for (int i = 0; i < nentries; i++)
        if (!strcmp(entries[i].device, device) && !strcmp(entries[i].key, key)) {
            entries[i].value = value;
            return 0;
        }
    if (nentries == capentries) {
        int cap = capentries ? capentries * 2 : 32;
        tune_entry *grown = realloc(entries, (size_t)cap * sizeof *grown);
        if (!grown)
            return -1;
        entries = grown;
        capentries = cap;
    }
    tune_entry *e = &entries[nentries++];
    snprintf(e->device, sizeof e->device, "%s", device);
    snprintf(e->key, sizeof e->key, "%s", key);
    e->value = value;
    return 0;
}

/* Split a line into n tab-separated fields in place; false when it has another count
 * or a field is empty or too long. */
static bool split(char *line, char **f, int n)
{
    for (int i = 0; i < n; i++) {
        f[i] = line;
        char *tab = strchr(line, '\t');
        if ((tab != NULL) != (i < n - 1))
            return false;
        if (tab)
            *tab = '\0';
        if (!*f[i] || strlen(f[i]) >= FIELD_MAX)
            return false;
        line = tab ? tab + 1 : line + strlen(line);
    }
    return true;
}

/* Parse the autotune file f: this kiln version's entries into *kept (nkept of them),
 * the count of other versions' into *stale; the reason it is corrupt, or NULL. */
static const char *parse(FILE *f, tune_entry **kept_out, int *nkept_out, int *stale_out, int *lineno_out)
{
    char line[512];
    int lineno = 0, stale = 0;
    const char *bad = NULL;
    tune_entry *kept = NULL;
    int nkept = 0;
    while (!bad && fgets(line, sizeof line, f)) {
        lineno++;
        size_t len = strlen(line);
        if (len == 0 || line[len - 1] != '\n') {
            bad = "a line is cut or too long";
            break;
        }
        line[len - 1] = '\0';
        if (lineno == 1) {
            if (strcmp(line, "kiln-autotune 1"))
                bad = "the first line is not \"kiln-autotune 1\"";
            continue;
        }
        char *fld[4], *end = NULL;
        if (!split(line, fld, 4)) {
            bad = "a line is not four tab-separated fields";
            break;
        }
        errno = 0;
        long long v = strtoll(fld[3], &end, 10);
        if (errno || *end || v <= 0) {
            bad = "a value is not a positive whole number";
            break;
        }
        if (strcmp(fld[0], kiln_version())) {
            stale++;
            continue;
        }
        tune_entry *grown = realloc(kept, ((size_t)nkept + 1) * sizeof *grown);
        if (!grown) {
            bad = "out of memory";
            break;
        }
        kept = grown;
        snprintf(kept[nkept].device, FIELD_MAX, "%s", fld[1]);
        snprintf(kept[nkept].key, FIELD_MAX, "%s", fld[2]);
        kept[nkept++].value = v;
    }
    if (!bad && ferror(f))
        bad = "it cannot be read";
    if (!bad && lineno == 0)
        bad = "it is empty";
    *kept_out = kept;
    *nkept_out = nkept;
    *stale_out = stale;
    *lineno_out = lineno;
    return bad;
}

/* Read <dir>/autotune.tsv into the table (tune_lock held). */
static void load(void)
{
    loaded = true;
    const char *dir = cache_dir();
    if (!dir)
        return;
    char path[1100];
    snprintf(path, sizeof path, "%s/autotune.tsv", dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    tune_entry *kept = NULL;
    int nkept = 0, stale = 0, lineno = 0;
    const char *bad = parse(f, &kept, &nkept, &stale, &lineno);
    fclose(f);
    if (bad) {
        kiln__warn("autotune cache %s ignored (corrupt at line %d: %s); kernels are timed again", path, lineno,
                   bad);
    } else {
        if (stale)
            kiln__warn("autotune cache %s: %d entries from another kiln version dropped", path, stale);
        for (int i = 0; i < nkept; i++)
            if (put_entry(kept[i].device, kept[i].key, kept[i].value) < 0)
                break;
    }
    free(kept);
}

/* Rewrite the file from the table (tune_lock held); failures cost only the persistence. */
static void save(void)
{
    const char *dir = cache_dir();
    if (!dir)
        return;
    char path[1100], tmp[1120];
    snprintf(path, sizeof path, "%s/autotune.tsv", dir);
    snprintf(tmp, sizeof tmp, "%s/autotune.tsv.%ld.tmp", dir, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        kiln__warn("autotune cache %s not written: %s", path, strerror(errno));
        return;
    }
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        unlink(tmp);
        return;
    }
    bool ok = fprintf(f, "kiln-autotune 1\n") > 0;
    for (int i = 0; ok && i < nentries; i++)
        ok = fprintf(f, "%s\t%s\t%s\t%lld\n", kiln_version(), entries[i].device, entries[i].key,
                     (long long)entries[i].value) > 0;
    ok = fflush(f) == 0 && ok && fsync(fd) == 0;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        kiln__warn("autotune cache %s not written: %s", path, strerror(errno));
        unlink(tmp);
        return;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
}

int kiln__autotune_lookup(const char *device, const char *key, int64_t *value)
{
    int found = 0;
    pthread_mutex_lock(&tune_lock);
    if (!loaded)
        load();
    for (int i = 0; i < nentries && !found; i++)
        if (!strcmp(entries[i].device, device) && !strcmp(entries[i].key, key)) {
            *value = entries[i].value;
            found = 1;
        }
    pthread_mutex_unlock(&tune_lock);
    return found;
}

void kiln__autotune_store(const char *device, const char *key, int64_t value)
{
    if (!device || !key || !*device || !*key || strlen(device) >= FIELD_MAX || strlen(key) >= FIELD_MAX ||
        strpbrk(device, "\t\n") || strpbrk(key, "\t\n") || value <= 0)
        return;
    pthread_mutex_lock(&tune_lock);
    if (!loaded)
        load();
    if (put_entry(device, key, value) == 0)
        save();
    pthread_mutex_unlock(&tune_lock);
}

int kiln_autotune_merge_file(const char *path)
{
    if (!path || !*path)
        return kiln__error_set("autotune: no file named to merge");
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT)
            return 0;
        return kiln__error_set("autotune: %s cannot be opened: %s", path, strerror(errno));
    }
    tune_entry *kept = NULL;
    int nkept = 0, stale = 0, lineno = 0;
    const char *bad = parse(f, &kept, &nkept, &stale, &lineno);
    fclose(f);
    if (bad) {
        free(kept);
        return kiln__error_set("autotune: %s is corrupt at line %d (%s): ignored", path, lineno, bad);
    }
    if (stale)
        kiln__warn("autotune file %s: %d entries from another kiln version dropped", path, stale);
    int taken = 0;
    pthread_mutex_lock(&tune_lock);
    if (!loaded)
        load();
    for (int i = 0; i < nkept; i++) {
        bool have = false;
        for (int k = 0; k < nentries && !have; k++)
            have = !strcmp(entries[k].device, kept[i].device) && !strcmp(entries[k].key, kept[i].key);
        if (!have && put_entry(kept[i].device, kept[i].key, kept[i].value) == 0)
            taken++;
    }
    if (taken)
        save();
    pthread_mutex_unlock(&tune_lock);
    free(kept);
    return taken;
}

int kiln_autotune_dir_set(const char *dir)
{
    if (dir && strlen(dir) >= sizeof dir_set) {
        return kiln__error_set("autotune: folder name longer than %zu bytes", sizeof dir_set - 1);
    }
    pthread_mutex_lock(&tune_lock);
    snprintf(dir_set, sizeof dir_set, "%s", dir ? dir : "");
    /* the next lookup reads the new folder's file */
    free(entries);
    entries = NULL;
    nentries = capentries = 0;
    loaded = false;
    pthread_mutex_unlock(&tune_lock);
    return 0;
}
