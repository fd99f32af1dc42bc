/*
 * catalog/repository.c — kilnd's model repository: scanning, validating, versions in and out
 * (each version's config.json is read by repository-config.c).
 *
 * Everything here treats the folder as untrusted: names are checked before they are joined
 * into paths, every folder and model file is resolved with realpath and must stay under the
 * resolved root (a symlink may point inside the repository, never outside), and a broken
 * model is recorded with its reason instead of ending the scan. Adding a version writes a
 * .tmp-add-* folder, validates it as a version, fsyncs it and renames it into place, so a
 * reader never sees half a version.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/utf8.h"
#include "error-impl.h"
#include "kiln/record.h"
#include "repository-impl.h"
#include "storage-impl.h"

#define CONFIG_MAX (1u << 20)
#define LABELS_MAX (16u << 20) /* a label file: a million classes of 16 bytes */

struct kd_repository {
    char *root; /* resolved */
    int count;
    kd_model_info *models;
};

bool kd_repository_name_valid(const char *name)
{
    size_t len = name ? strlen(name) : 0;
    if (len == 0 || len > KD_MODEL_NAME_MAX || name[0] == '.' || strstr(name, ".."))
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
              c == '-'))
            return false;
    }
    return true;
}

/* A version folder name: a positive integer, no sign, no leading zero, at most 18 digits. */
static int64_t parse_version(const char *s)
{
    size_t len = strlen(s);
    if (len == 0 || len > 18 || s[0] == '0')
        return -1;
    int64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

static char *join(const char *a, const char *b)
{
    size_t len = strlen(a) + strlen(b) + 2;
    char *p = malloc(len);
    if (p)
        snprintf(p, len, "%s/%s", a, b);
    return p;
}

/* realpath(path) when it lies under root (or is root); NULL otherwise, with why set. */
static char *confined(const kd_repository *repo, const char *path, const char **why)
{
    char *real = realpath(path, NULL);
    if (!real) {
        *why = "cannot be resolved";
        return NULL;
    }
    size_t rl = strlen(repo->root);
    if (strncmp(real, repo->root, rl) != 0 || (real[rl] != '/' && real[rl] != '\0')) {
        free(real);
        *why = "resolves outside the repository (symlink escape)";
        return NULL;
    }
    return real;
}

/* The class names of an output's label_filename: a line each (a '\r' before the '\n' dropped,
 * a last line without '\n' kept, an empty last line not counted), read from the version folder
 * or else the model folder. 0, or -1 with why filled. */
static int load_labels(const kd_repository *repo, kd_model_tensor_spec *s, const char *version_path,
                       const char *model_path, char *why, size_t wl)
{
    char *path = join(version_path, s->label_filename);
    struct stat sb;
    if (path && lstat(path, &sb) != 0 && errno == ENOENT) {
        free(path);
        path = join(model_path, s->label_filename);
    }
    if (!path)
        return snprintf(why, wl, "out of memory"), -1;
    const char *cwhy = NULL;
    char *real = NULL, *text = NULL;
    size_t len = 0;
    int missing = lstat(path, &sb) != 0 ? errno : 0;
    if (missing == ENOENT)
        snprintf(why, wl, "output '%.64s': label_filename '%s' is in neither the version nor the model folder",
                 s->name, s->label_filename);
    else if (missing)
        snprintf(why, wl, "output '%.64s': label_filename '%s': %s", s->name, s->label_filename,
                 strerror(missing));
    else if (!(real = confined(repo, path, &cwhy)))
        snprintf(why, wl, "output '%.64s': label_filename '%s' %s", s->name, s->label_filename, cwhy);
    else if (kiln__read_file(real, LABELS_MAX, &text, &len) != 0)
        snprintf(why, wl, "output '%.64s': label_filename '%s': %s", s->name, s->label_filename, kiln_error());
    free(path);
    free(real);
    if (!text)
        return -1;
    if (memchr(text, '\0', len)) {
        free(text);
        return snprintf(why, wl, "output '%.64s': label_filename '%s' holds a NUL byte: not a text file", s->name,
                        s->label_filename),
               -1;
    }
    /* labels go into JSON answers as they are: bytes that are no UTF-8 would make them invalid */
    long bad = kiln_utf8_invalid_at((const unsigned char *)text, len);
    if (bad >= 0) {
        int64_t line_no = 1;
        for (long i = 0; i < bad; i++)
            line_no += text[i] == '\n';
        free(text);
        return snprintf(why, wl,
                        "output '%.64s': label_filename '%s' is not UTF-8 text (line %lld, byte %ld): save it as "
                        "UTF-8",
                        s->name, s->label_filename, (long long)line_no, bad),
               -1;
    }
    int64_t lines = 0;
    for (size_t i = 0; i < len; i++)
        lines += text[i] == '\n';
    lines += len > 0 && text[len - 1] != '\n';
    s->labels = malloc((size_t)(lines ? lines : 1) * sizeof *s->labels);
    if (!s->labels) {
        free(text);
        return snprintf(why, wl, "out of memory"), -1;
    }
    s->label_text = text;
    char *line = text;
    for (int64_t k = 0; k < lines; k++) {
        char *nl = memchr(line, '\n', len - (size_t)(line - text));
        char *end = nl ? nl : text + len;
        if (end > line && end[-1] == '\r')
            end--;
        *end = '\0';
        s->labels[k] = line;
        line = nl ? nl + 1 : text + len;
    }
    s->nlabels = lines;
    return 0;
}

/* Validate one version folder (real path already confined); fills v. */
static void check_version(const kd_repository *repo, kd_model_version *v, const char *model_path,
                          const char *model_config)
{
    char why[512] = "";
    const char *cwhy = NULL;
    char *kd_path = join(v->path, "model.kiln"), *onnx_path = join(v->path, "model.onnx");
    char *cfg_path = join(v->path, "config.json");
    struct stat sb;
    char *real = NULL, *text = NULL;
    if (!kd_path || !onnx_path || !cfg_path) {
        snprintf(why, sizeof why, "out of memory");
    } else if (lstat(kd_path, &sb) == 0) {
        if (!(real = confined(repo, kd_path, &cwhy)))
            snprintf(why, sizeof why, "model.kiln %s", cwhy);
        else {
            kiln_record *rec = kiln_record_open(real);
            if (!rec)
                snprintf(why, sizeof why, "model.kiln: %s", kiln_error());
            kiln_record_close(rec);
            v->format = "kiln";
        }
    } else if (errno != ENOENT) {
        /* only ENOENT means "no such file": a folder kilnd may not search (mode 000, another
         * user's) answers EACCES here, and saying it holds no model would hide the fix */
        snprintf(why, sizeof why, "cannot read: %s", strerror(errno));
    } else if (lstat(onnx_path, &sb) == 0) {
        if (!(real = confined(repo, onnx_path, &cwhy)))
            snprintf(why, sizeof why, "model.onnx %s", cwhy);
        else if (stat(real, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size == 0)
            snprintf(why, sizeof why, "model.onnx is empty or not a regular file");
        v->format = "onnx";
    } else if (errno != ENOENT) {
        snprintf(why, sizeof why, "cannot read: %s", strerror(errno));
    } else {
        snprintf(why, sizeof why, "no model.kiln or model.onnx");
    }
    free(real);
    real = NULL;
    if (!why[0]) {
        if (lstat(cfg_path, &sb) == 0) {
            if (!(real = confined(repo, cfg_path, &cwhy)))
                snprintf(why, sizeof why, "config.json %s", cwhy);
            else if (kiln__read_file(real, CONFIG_MAX, &text, NULL) != 0)
                snprintf(why, sizeof why, "config.json: %s", kiln_error());
        } else if (errno != ENOENT) {
            snprintf(why, sizeof why, "config.json: cannot read: %s", strerror(errno));
        } else if (!model_config && strcmp(v->format, "onnx") != 0) {
            snprintf(why, sizeof why, "no config.json in the version or the model folder");
        }
        /* An ONNX model needs no config.json at all: the defaults, and the graph's inputs and outputs. */
        bool onnx = strcmp(v->format, "onnx") == 0;
        const char *config = text ? text : model_config ? model_config : "{}";
        if (!why[0])
            kd_repository_config_parse(config, &v->config, onnx, why, sizeof why);
        /* the model folder's file, which every version without its own reads: named as such, not
         * as a config.json of the version that does not exist */
        if (why[0] && !text && model_config && strncmp(why, "config.json", 11) == 0) {
            char rest[512];
            snprintf(rest, sizeof rest, "%s", why + 11);
            snprintf(why, sizeof why, "the model folder's config.json%.460s", rest);
        }
        for (int o = 0; !why[0] && o < v->config.noutputs; o++)
            if (v->config.outputs[o].label_filename)
                (void)load_labels(repo, &v->config.outputs[o], v->path, model_path, why, sizeof why);
    }
    free(real);
    free(text);
    free(kd_path);
    free(onnx_path);
    free(cfg_path);
    v->valid = !why[0];
    if (!v->valid) {
        v->format = NULL;
        v->why = strdup(why);
    }
}

static void model_free(kd_model_info *m)
{
    for (int i = 0; i < m->nversions; i++) {
        free(m->versions[i].path);
        free(m->versions[i].why);
        kd_repository_config_free(&m->versions[i].config);
    }
    free(m->versions);
    free(m->name);
    free(m->path);
    free(m->why);
    memset(m, 0, sizeof *m);
}

static int version_cmp(const void *a, const void *b)
{
    int64_t x = ((const kd_model_version *)a)->version, y = ((const kd_model_version *)b)->version;
    return x < y ? -1 : x > y;
}

static void set_why(kd_model_info *m, const char *why)
{
    m->valid = false;
    free(m->why);
    m->why = strdup(why);
}

static void scan_model(const kd_repository *repo, kd_model_info *m)
{
    const char *cwhy;
    if (!kd_repository_name_valid(m->name)) {
        set_why(m, "invalid model name (allowed: A-Z a-z 0-9 _ . -, no leading dot, no '..')");
        return;
    }
    char *joined = join(repo->root, m->name);
    cwhy = "out of memory";
    m->path = joined ? confined(repo, joined, &cwhy) : NULL;
    free(joined);
    if (!m->path) {
        set_why(m, cwhy);
        return;
    }
    struct stat sb;
    if (stat(m->path, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        set_why(m, "not a folder");
        return;
    }
    char *model_config = NULL;
    char *cfg = join(m->path, "config.json");
    bool has_cfg = cfg && lstat(cfg, &sb) == 0;
    if (cfg && !has_cfg && errno != ENOENT) { /* a folder kilnd may not search: the real reason */
        char why[160];
        snprintf(why, sizeof why, "cannot read: %s", strerror(errno));
        free(cfg);
        set_why(m, why);
        return;
    }
    char *pbtxt = has_cfg ? NULL : join(m->path, "config.pbtxt");
    if (pbtxt && lstat(pbtxt, &sb) == 0) {
        /* Triton's protobuf text: served without it, its batching and version policy would be
         * dropped without a word. Refused, saying what kilnd reads instead. */
        free(pbtxt);
        free(cfg);
        set_why(m, "config.pbtxt is Triton's model configuration, which kilnd does not read: write its settings "
                   "as config.json (max_batch_size, dynamic_batching, version_policy, inputs, outputs; "
                   "docs/storage.md) and remove config.pbtxt");
        return;
    }
    free(pbtxt);
    if (has_cfg) {
        char *real = confined(repo, cfg, &cwhy);
        if (!real || kiln__read_file(real, CONFIG_MAX, &model_config, NULL) != 0) {
            free(real);
            free(cfg);
            set_why(m, "config.json in the model folder cannot be read or escapes the repository");
            return;
        }
        free(real);
    }
    free(cfg);
    DIR *d = opendir(m->path);
    if (!d) { /* the real reason (a folder of another user's, mode 000), not "no version folders" */
        char why[160];
        snprintf(why, sizeof why, "cannot read: %s", strerror(errno));
        free(model_config);
        set_why(m, why);
        return;
    }
    struct dirent *de;
    int cap = 0;
    /* what the folder holds that looks meant as a version, for the message when none is found */
    char not_version[64] = "";
    bool loose_model = false;
    while ((de = readdir(d)) != NULL) {
        int64_t ver = parse_version(de->d_name);
        if (ver > 0) {
            /* a file with a number for a name (a note, a download) is no version folder */
            char *p = join(m->path, de->d_name);
            struct stat lsb;
            /* a link goes on to be resolved below, which says why one that leads nowhere fails */
            bool folder = p && ((stat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) ||
                                (lstat(p, &lsb) == 0 && S_ISLNK(lsb.st_mode)));
            free(p);
            if (!folder)
                continue;
        }
        if (ver < 0) { /* config.json, labels, .tmp-add-*, notes: not versions */
            loose_model |= !strcmp(de->d_name, "model.onnx") || !strcmp(de->d_name, "model.kiln");
            char *p = de->d_name[0] != '.' && !not_version[0] ? join(m->path, de->d_name) : NULL;
            if (p && stat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
                snprintf(not_version, sizeof not_version, "%.60s", de->d_name);
            free(p);
            continue;
        }
        if (m->nversions == cap) {
            cap = cap ? cap * 2 : 8;
            kd_model_version *next = realloc(m->versions, (size_t)cap * sizeof *next);
            if (!next)
                break;
            m->versions = next;
        }
        kd_model_version *v = &m->versions[m->nversions++];
        memset(v, 0, sizeof *v);
        v->version = ver;
        char *p = join(m->path, de->d_name);
        cwhy = "out of memory";
        v->path = p ? confined(repo, p, &cwhy) : NULL;
        free(p);
        if (!v->path) {
            v->why = strdup(cwhy);
            continue;
        }
        if (stat(v->path, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            v->why = strdup("not a folder");
            continue;
        }
        check_version(repo, v, m->path, model_config);
    }
    closedir(d);
    free(model_config);
    if (m->nversions > 1)
        qsort(m->versions, (size_t)m->nversions, sizeof *m->versions, version_cmp);
    /* The policy comes from the newest valid version's config (the model-level one when it has none). */
    const kd_model_config *pc = NULL;
    for (int i = m->nversions - 1; i >= 0 && !pc; i--)
        if (m->versions[i].valid)
            pc = &m->versions[i].config;
    if (!pc) {
        /* the newest version's reason, so that a load answers why, not only that */
        const kd_model_version *newest = m->nversions ? &m->versions[m->nversions - 1] : NULL;
        char why[600];
        snprintf(why, sizeof why, "no valid version (version %lld: %s)", newest ? (long long)newest->version : 0LL,
                 newest && newest->why ? newest->why : "?");
        if (!newest && loose_model)
            snprintf(why, sizeof why,
                     "no version folders: a model file sits in the model folder itself; move it into a version "
                     "folder, such as %s/1/",
                     m->name);
        else if (!newest && not_version[0])
            snprintf(why, sizeof why,
                     "no version folders: '%s' is not a version (a version folder is named by a positive integer "
                     "without leading zeros: 1, 2, ...)",
                     not_version);
        set_why(m, newest || loose_model || not_version[0] ? why : "no version folders");
        return;
    }
    m->policy = pc->policy;
    int served = 0;
    for (int i = m->nversions - 1; i >= 0; i--) {
        kd_model_version *v = &m->versions[i];
        if (!v->valid)
            continue;
        if (pc->policy == KD_VERSION_ALL)
            v->served = true;
        else if (pc->policy == KD_VERSION_LATEST)
            v->served = served < pc->latest_n;
        else
            for (int k = 0; k < pc->nspecific; k++)
                v->served |= pc->specific[k] == v->version;
        served += v->served;
    }
    if (served == 0) {
        set_why(m, "the version policy selects no valid version");
        return;
    }
    m->valid = true;
}

static void models_free(kd_repository *repo)
{
    for (int i = 0; i < repo->count; i++)
        model_free(&repo->models[i]);
    free(repo->models);
    repo->models = NULL;
    repo->count = 0;
}

static int model_cmp(const void *a, const void *b)
{
    return strcmp(((const kd_model_info *)a)->name, ((const kd_model_info *)b)->name);
}

/* A folder or a symlink to one; one that cannot be followed stays, for the scan to say why. */
static bool is_folder_entry(const kd_repository *repo, const char *name)
{
    char *path = join(repo->root, name);
    struct stat sb;
    bool folder = !path || stat(path, &sb) != 0 || S_ISDIR(sb.st_mode);
    free(path);
    return folder;
}

int kd_repository_scan(kd_repository *repo)
{
    models_free(repo);
    DIR *d = opendir(repo->root);
    if (!d)
        return kiln__error_set("repository '%s': %s", repo->root, strerror(errno)), KILN_EIO;
    struct dirent *de;
    int cap = 0;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue; /* ".", "..", and hidden work folders are never models */
        if (!is_folder_entry(repo, de->d_name))
            continue; /* a README.md or LICENSE beside the models, as Triton repositories hold */
        if (repo->count == cap) {
            cap = cap ? cap * 2 : 16;
            kd_model_info *next = realloc(repo->models, (size_t)cap * sizeof *next);
            if (!next)
                break;
            repo->models = next;
        }
        kd_model_info *m = &repo->models[repo->count++];
        memset(m, 0, sizeof *m);
        m->name = strdup(de->d_name);
        if (m->name)
            scan_model(repo, m);
        else
            repo->count--;
    }
    closedir(d);
    if (repo->count > 1)
        qsort(repo->models, (size_t)repo->count, sizeof *repo->models, model_cmp);
    return 0;
}

kd_repository *kd_repository_open(const char *root)
{
    if (!root)
        return kiln__error_set("repository: NULL root"), NULL;
    /* Never created here: a repository is served as it is found, and a mistyped path must fail,
     * not turn into an empty repository. (kilnd makes its default <data_dir>/models itself.) */
    struct stat sb;
    const char *why = stat(root, &sb) != 0 ? strerror(errno) : S_ISDIR(sb.st_mode) ? NULL : "not a folder";
    if (why)
        return kiln__error_set("repository '%s': %s", root, why), NULL;
    kd_repository *repo = calloc(1, sizeof *repo);
    if (!repo || !(repo->root = realpath(root, NULL))) {
        free(repo);
        return kiln__error_set("repository '%s': cannot resolve the folder", root), NULL;
    }
    if (kd_repository_scan(repo) != 0) {
        kd_repository_close(repo);
        return NULL;
    }
    return repo;
}

void kd_repository_close(kd_repository *repo)
{
    if (!repo)
        return;
    models_free(repo);
    free(repo->root);
    free(repo);
}

int kd_repository_count(const kd_repository *repo)
{
    return repo ? repo->count : 0;
}

const kd_model_info *kd_repository_model(const kd_repository *repo, int i)
{
    return repo && i >= 0 && i < repo->count ? &repo->models[i] : NULL;
}

const kd_model_info *kd_repository_find(const kd_repository *repo, const char *name)
{
    for (int i = 0; repo && name && i < repo->count; i++)
        if (strcmp(repo->models[i].name, name) == 0)
            return &repo->models[i];
    return NULL;
}

/* ------------------------------------------------------------------ add / remove */

static int copy_files(const char *src, const char *dst)
{
    DIR *d = opendir(src);
    if (!d)
        return kiln__error_set("add version: open '%s': %s", src, strerror(errno)), KILN_EIO;
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        char *from = join(src, de->d_name), *to = join(dst, de->d_name);
        struct stat sb;
        char *buf = NULL;
        size_t len = 0;
        if (!from || !to)
            rc = KILN_ENOMEM;
        else if (lstat(from, &sb) != 0 || !S_ISREG(sb.st_mode))
            rc = (kiln__error_set("add version: '%s' is not a regular file (no folders or symlinks)", from),
                  KILN_EINVAL);
        else if ((rc = kiln__read_file(from, (size_t)1 << 40, &buf, &len)) == 0)
            rc = kiln__write_file_atomic(to, buf, len);
        free(buf);
        free(from);
        free(to);
    }
    closedir(d);
    return rc;
}

static int add_version(kd_repository *repo, const char *name, const char *src_dir, int64_t version, int64_t floor,
                       int64_t *out_version);

int kd_repository_add_version(kd_repository *repo, const char *name, const char *src_dir, int64_t version,
                              int64_t *out_version)
{
    return add_version(repo, name, src_dir, version, 0, out_version);
}

int kd_repository_add_version_above(kd_repository *repo, const char *name, const char *src_dir, int64_t floor,
                                    int64_t *out_version)
{
    if (floor < 0)
        return kiln__error_set("add version: invalid version floor %" PRId64, floor), KILN_EINVAL;
    return add_version(repo, name, src_dir, 0, floor, out_version);
}

static int add_version(kd_repository *repo, const char *name, const char *src_dir, int64_t version, int64_t floor,
                       int64_t *out_version)
{
    if (!repo || !src_dir || !kd_repository_name_valid(name) || version < 0)
        return kiln__error_set("add version: invalid model name '%s' or version", name ? name : "(null)"),
               KILN_EINVAL;
    char *mdir = join(repo->root, name);
    if (!mdir)
        return KILN_ENOMEM;
    /* 0777 and kiln__mkdir_unique below: the umask alone decides what group and others get, so a
     * kilnd run later as another uid of the same group (0002 in the image) can serve and replace
     * the versions; mkdtemp's fixed 0700 would lock them to this uid. */
    bool made = mkdir(mdir, 0777) == 0;
    if (made)
        (void)kiln__fsync_dir(repo->root);
    const char *cwhy;
    char *real = confined(repo, mdir, &cwhy);
    free(mdir);
    if (!real)
        return kiln__error_set("add version: model folder of '%s' %s", name, cwhy), KILN_EINVAL;
    if (version == 0) {
        version = floor;
        DIR *d = opendir(real);
        struct dirent *de;
        while (d && (de = readdir(d)) != NULL) {
            int64_t v = parse_version(de->d_name);
            if (v > version)
                version = v;
        }
        if (d)
            closedir(d);
        version++;
    }
    char vname[24];
    snprintf(vname, sizeof vname, "%" PRId64, version);
    char *final = join(real, vname), *tmp = join(real, ".tmp-add-XXXXXX");
    int rc = 0;
    struct stat sb;
    if (!final || !tmp)
        rc = KILN_ENOMEM;
    else if (lstat(final, &sb) == 0)
        rc = (kiln__error_set("add version: %s version %" PRId64 " already exists", name, version), KILN_EINVAL);
    else if (kiln__mkdir_unique(tmp) != 0) {
        rc = (kiln__error_set("add version: %s", strerror(errno)), KILN_EIO);
        free(tmp);
        tmp = NULL;
    }
    if (rc == 0)
        rc = copy_files(src_dir, tmp);
    if (rc == 0) {
        /* Validate the candidate exactly as a scan would, with the model-level config. */
        char *mcfg_path = join(real, "config.json"), *mcfg = NULL;
        if (mcfg_path && lstat(mcfg_path, &sb) == 0)
            (void)kiln__read_file(mcfg_path, CONFIG_MAX, &mcfg, NULL);
        kd_model_version v = {.version = version, .path = tmp};
        check_version(repo, &v, real, mcfg);
        if (!v.valid)
            rc = (kiln__error_set("add version: %s version %" PRId64 " is invalid: %s", name, version, v.why),
                  KILN_EINVAL);
        free(v.why);
        kd_repository_config_free(&v.config);
        free(mcfg);
        free(mcfg_path);
    }
    if (rc == 0)
        rc = kiln__fsync_dir(tmp);
    if (rc == 0 && kiln__io.rename(tmp, final) != 0)
        rc = (kiln__error_set("add version: rename into '%s': %s", final, strerror(errno)), KILN_EIO);
    if (rc == 0)
        rc = kiln__fsync_dir(real);
    if (rc != 0 && tmp)
        (void)kiln__remove_tree(tmp);
    /* a model folder made for a version that failed goes with it: left empty, a scan would list a
     * model with no version */
    if (rc != 0 && made)
        (void)rmdir(real);
    if (rc == 0 && out_version)
        *out_version = version;
    free(tmp);
    free(final);
    free(real);
    return rc == 0 ? kd_repository_scan(repo) : rc;
}

int kd_repository_remove_version(kd_repository *repo, const char *name, int64_t version)
{
    if (!repo || !kd_repository_name_valid(name) || version < 1)
        return kiln__error_set("remove version: invalid model name or version"), KILN_EINVAL;
    char vname[24];
    snprintf(vname, sizeof vname, "%s/%" PRId64, name, version);
    char *path = join(repo->root, vname);
    const char *cwhy = "";
    char *real = path ? confined(repo, path, &cwhy) : NULL;
    free(path);
    if (!real)
        return kiln__error_set("remove version: %s %s", vname, cwhy), KILN_EINVAL;
    char *parent = strdup(real);
    char *slash = parent ? strrchr(parent, '/') : NULL;
    int rc = 0;
    if (!slash)
        rc = KILN_ENOMEM;
    else {
        *slash = '\0';
        char *trash = join(parent, ".trash-XXXXXX");
        if (!trash || kiln__mkdir_unique(trash) != 0)
            rc = (kiln__error_set("remove version: cannot create a folder beside '%s'", real), KILN_EIO);
        else if (kiln__io.rename(real, trash) != 0) {
            rc = (kiln__error_set("remove version: rename '%s': %s", real, strerror(errno)), KILN_EIO);
            rmdir(trash);
        } else {
            rc = kiln__fsync_dir(parent);
            int r2 = kiln__remove_tree(trash);
            if (rc == 0)
                rc = r2;
        }
        free(trash);
    }
    free(parent);
    free(real);
    return rc == 0 ? kd_repository_scan(repo) : rc;
}

/* ------------------------------------------------------------------ provenance */

/* True when the version folder's source.json (confined, bounded) names source; its text in *json. */
static bool version_from(const kd_repository *repo, const kd_model_version *v, const char *source, char **json)
{
    char *path = join(v->path, KD_REPOSITORY_SOURCE_FILE), *real = NULL, *text = NULL;
    const char *cwhy;
    struct stat sb;
    bool match = false;
    if (path && lstat(path, &sb) == 0 && (real = confined(repo, path, &cwhy)) != NULL &&
        kiln__read_file(real, CONFIG_MAX, &text, NULL) == 0) {
        cJSON *j = cJSON_Parse(text);
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "source");
        match = cJSON_IsString(s) && strcmp(s->valuestring, source) == 0;
        cJSON_Delete(j);
    }
    if (match && json) {
        *json = text;
        text = NULL;
    }
    free(text);
    free(real);
    free(path);
    return match;
}

int64_t kd_repository_find_source(const kd_repository *repo, const char *name, const char *source, char **json)
{
    if (json)
        *json = NULL;
    if (!repo || !source || !kd_repository_name_valid(name))
        return kiln__error_set("find source: invalid model name '%s' or no source", name ? name : "(null)"),
               KILN_EINVAL;
    const kd_model_info *m = kd_repository_find(repo, name);
    for (int i = m ? m->nversions - 1 : -1; i >= 0; i--)
        if (m->versions[i].path && version_from(repo, &m->versions[i], source, json))
            return m->versions[i].version;
    return 0;
}
