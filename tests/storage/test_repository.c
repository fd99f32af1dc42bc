/*
 * tests/storage/test_repository.c — the model repository: a scan over valid and invalid
 * models (each invalid one with its reason, the scan never stopping), names from outside
 * ("../x", "a/../../b", a leading dot), a symlink pointing outside the root, version
 * policies (latest N, all, specific), adding/removing versions atomically, finding a
 * version by the source its source.json names, a root served as found (never created, files
 * beside the models passed over) and a model folder that cannot be read saying so.
 */
#include <grp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kiln/kiln.h"
#include "repository.h"
#include "storage-impl.h"

static char base[64], root[96], outside[96];
static kiln_device *dev;

static const char *config_text(const char *policy)
{
    static char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"inputs\": [{\"name\": \"x\", \"datatype\": \"FP32\", \"shape\": [-1, 4]}],"
             " \"outputs\": [{\"name\": \"y\", \"datatype\": \"FP32\", \"shape\": [-1, 2]}],"
             " \"max_batch_size\": 8, \"dynamic_batching\": {\"max_queue_delay_us\": 500,"
             " \"preferred_batch_sizes\": [4, 8]}, \"device\": \"cpu\", \"instance_count\": 2%s%s}",
             policy ? ", \"version_policy\": " : "", policy ? policy : "");
    return buf;
}

static void write_text(const char *path, const char *text)
{
    assert_int_equal(kiln__write_file_atomic(path, text, strlen(text)), 0);
}

/* models/<name>/<version>/ with a kiln record and (optionally) config.json. */
static void make_version(const char *name, const char *version, const char *config)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", root, name);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/%s/%s", root, name, version);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/%s/%s/model.kiln", root, name, version);
    kiln_tensor *w = kiln_zeros(dev, KILN_F32, KILN_SHAPE(2, 4));
    const char *names[] = {"fc.weight"};
    assert_int_equal(kiln_record_save(p, 1, names, &w, "{\"kind\": \"linear\"}", 0), 0);
    kiln_tensor_release(w);
    if (config) {
        snprintf(p, sizeof p, "%s/%s/%s/config.json", root, name, version);
        write_text(p, config);
    }
}

static int setup(void **state)
{
    (void)state;
    dev = kiln_device_open("cpu");
    snprintf(base, sizeof base, "/tmp/kiln-repo-XXXXXX");
    if (!mkdtemp(base))
        return -1;
    snprintf(root, sizeof root, "%s/models", base);
    snprintf(outside, sizeof outside, "%s/outside", base);
    mkdir(root, 0755);
    mkdir(outside, 0755);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kiln__remove_tree(base);
    kiln_device_close(dev);
    return 0;
}

static void test_scan_valid_and_invalid(void **state)
{
    (void)state;
    make_version("good", "1", config_text(NULL));
    make_version("good", "2", config_text(NULL));
    make_version("noconfig", "1", NULL);
    make_version("badconfig", "1", "{\"inputs\": [], \"outputs\": []}");
    make_version("badtype", "1",
                 "{\"inputs\": [{\"name\": \"x\", \"datatype\": \"FP31\", \"shape\": [1]}],"
                 " \"outputs\": [{\"name\": \"y\", \"datatype\": \"FP32\", \"shape\": [1]}]}");
    char p[256];
    snprintf(p, sizeof p, "%s/empty", root);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/good/007", root); /* not a version name: ignored */
    mkdir(p, 0755);
    /* A model folder that is a symlink to somewhere outside the root. */
    snprintf(p, sizeof p, "%s/escape", root);
    assert_int_equal(symlink(outside, p), 0);
    /* A version whose model file links outside. */
    make_version("sneaky", "1", config_text(NULL));
    snprintf(p, sizeof p, "%s/sneaky/1/model.kiln", root);
    unlink(p);
    char target[256];
    snprintf(target, sizeof target, "%s/secret", outside);
    write_text(target, "secret");
    assert_int_equal(symlink(target, p), 0);

    kd_repository *repo = kd_repository_open(root);
    assert_non_null(repo);
    assert_int_equal(kd_repository_count(repo), 7);
    const kd_model_info *m = kd_repository_find(repo, "good");
    assert_true(m->valid);
    assert_int_equal(m->nversions, 2);
    assert_true(!m->versions[0].served && m->versions[1].served); /* latest 1 by default */
    const kd_model_config *c = &m->versions[1].config;
    assert_string_equal(m->versions[1].format, "kiln");
    assert_int_equal(c->max_batch_size, 8);
    assert_int_equal(c->max_queue_delay_us, 500);
    assert_int_equal(c->npreferred, 2);
    assert_int_equal(c->instance_count, 2);
    assert_string_equal(c->device, "cpu");
    assert_int_equal(c->inputs[0].shape[0], -1);
    assert_string_equal(c->outputs[0].datatype, "FP32");

    struct { const char *name, *why; } bad[] = {
        {"noconfig", "config.json"}, {"badconfig", "non-empty"}, {"badtype", "FP31"},
        {"empty", "no version"}, {"escape", "outside"}, {"sneaky", "outside"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        m = kd_repository_find(repo, bad[i].name);
        assert_non_null(m);
        assert_false(m->valid);
        const char *why = m->why;
        if (m->nversions > 0 && m->versions[0].why)
            why = m->versions[0].why;
        if (!strstr(why, bad[i].why) && !strstr(m->why, bad[i].why))
            fail_msg("%s: reason '%s' / '%s' lacks '%s'", bad[i].name, m->why, why, bad[i].why);
    }
    kd_repository_close(repo);
}

static void test_names_from_outside(void **state)
{
    (void)state;
    const char *bad[] = {"../x", "a/../../b", "..", ".hidden", "", "a/b", "x\n", "a..b"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_false(kd_repository_name_valid(bad[i]));
    char longname[200];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    assert_false(kd_repository_name_valid(longname));
    assert_true(kd_repository_name_valid("resnet-50_v1.2"));

    kd_repository *repo = kd_repository_open(root);
    char src[128];
    snprintf(src, sizeof src, "%s/src", base);
    mkdir(src, 0755);
    assert_int_not_equal(kd_repository_add_version(repo, "../x", src, 0, NULL), 0);
    assert_int_not_equal(kd_repository_add_version(repo, "a/../../b", src, 0, NULL), 0);
    assert_int_not_equal(kd_repository_remove_version(repo, "../outside", 1), 0);
    assert_int_not_equal(kd_repository_remove_version(repo, "good", 0), 0);
    /* Nothing was created outside the root. */
    char p[256];
    snprintf(p, sizeof p, "%s/x", base);
    assert_int_not_equal(access(p, F_OK), 0);
    kd_repository_close(repo);
}

static void test_version_policies(void **state)
{
    (void)state;
    const char *policies[] = {"{\"latest\": {\"num_versions\": 2}}", "{\"all\": {}}",
                              "{\"specific\": {\"versions\": [1, 3, 9]}}"};
    const bool want[3][3] = {{false, true, true}, {true, true, true}, {true, false, true}};
    for (int k = 0; k < 3; k++) {
        char name[16];
        snprintf(name, sizeof name, "m%d", k);
        for (int v = 1; v <= 3; v++) {
            char vs[16]; /* room for any int, so -Wformat-truncation stays quiet at -O1 */
            snprintf(vs, sizeof vs, "%d", v);
            make_version(name, vs, config_text(policies[k]));
        }
    }
    kd_repository *repo = kd_repository_open(root);
    for (int k = 0; k < 3; k++) {
        char name[16];
        snprintf(name, sizeof name, "m%d", k);
        const kd_model_info *m = kd_repository_find(repo, name);
        assert_true(m->valid);
        for (int v = 0; v < 3; v++)
            if (m->versions[v].served != want[k][v])
                fail_msg("%s version %d served %d", name, v + 1, m->versions[v].served);
    }
    kd_repository_close(repo);
}

static void test_add_and_remove(void **state)
{
    (void)state;
    char src[128], p[256];
    snprintf(src, sizeof src, "%s/src", base);
    mkdir(src, 0755);
    snprintf(p, sizeof p, "%s/model.onnx", src);
    write_text(p, "\x08\x07onnx-bytes");
    kd_repository *repo = kd_repository_open(root);
    /* With a bad config the candidate is invalid: refused, nothing left behind. (An ONNX model
     * needs no config.json at all; the server reads its inputs and outputs from the graph.) */
    snprintf(p, sizeof p, "%s/config.json", src);
    write_text(p, "{\"max_batch_size\": -1}");
    assert_int_not_equal(kd_repository_add_version(repo, "net", src, 0, NULL), 0);
    assert_non_null(strstr(kiln_error(), "config.json"));
    const kd_model_info *m = kd_repository_find(repo, "net");
    assert_null(m);
    /* nor the model folder made for it: an empty one would be listed as a model with no version */
    snprintf(p, sizeof p, "%s/net", root);
    struct stat sb;
    assert_int_equal(lstat(p, &sb), -1);
    snprintf(p, sizeof p, "%s/config.json", src);
    write_text(p, config_text(NULL));
    int64_t v;
    assert_int_equal(kd_repository_add_version(repo, "net", src, 0, &v), 0);
    assert_int_equal(v, 1);
    assert_int_equal(kd_repository_add_version(repo, "net", src, 0, &v), 0);
    assert_int_equal(v, 2);
    /* above a floor a registry knows (versions whose folders are gone), never below the folders */
    assert_int_equal(kd_repository_add_version_above(repo, "other", src, 6, &v), 0);
    assert_int_equal(v, 7);
    assert_int_equal(kd_repository_add_version_above(repo, "other", src, 3, &v), 0);
    assert_int_equal(v, 8);
    assert_int_equal(kd_repository_remove_version(repo, "other", 7), 0);
    assert_int_equal(kd_repository_remove_version(repo, "other", 8), 0);
    assert_int_not_equal(kd_repository_add_version(repo, "net", src, 2, NULL), 0); /* exists */
    m = kd_repository_find(repo, "net");
    assert_true(m->valid);
    assert_int_equal(m->nversions, 2);
    assert_string_equal(m->versions[1].format, "onnx");
    assert_int_equal(kd_repository_remove_version(repo, "net", 2), 0);
    m = kd_repository_find(repo, "net");
    assert_int_equal(m->nversions, 1);
    assert_true(m->versions[0].served);
    assert_int_not_equal(kd_repository_remove_version(repo, "net", 2), 0);
    kd_repository_close(repo);
}

/* source.json: the version a producer added is found again by its source, never another's. */
static void test_find_source(void **state)
{
    (void)state;
    char src[128], p[256];
    snprintf(src, sizeof src, "%s/src", base);
    mkdir(src, 0755);
    snprintf(p, sizeof p, "%s/model.onnx", src);
    write_text(p, "\x08\x07onnx-bytes");
    kd_repository *repo = kd_repository_open(root);
    snprintf(p, sizeof p, "%s/" KD_REPOSITORY_SOURCE_FILE, src);
    const char *sources[] = {"job 1", "job 2", NULL};
    for (int i = 0; i < 3; i++) {
        if (sources[i]) {
            char text[128];
            snprintf(text, sizeof text, "{\"source\": \"%s\", \"metrics\": {\"acc\": 0.%d}}", sources[i], i + 1);
            write_text(p, text);
        } else {
            unlink(p);
        }
        assert_int_equal(kd_repository_add_version(repo, "net", src, 0, NULL), 0);
    }
    char *json = NULL;
    assert_int_equal(kd_repository_find_source(repo, "net", "job 2", &json), 2);
    assert_non_null(strstr(json, "0.2"));
    free(json);
    assert_int_equal(kd_repository_find_source(repo, "net", "job 1", NULL), 1);
    assert_int_equal(kd_repository_find_source(repo, "net", "job 3", &json), 0);
    assert_null(json);
    assert_int_equal(kd_repository_find_source(repo, "missing", "job 1", NULL), 0);
    assert_true(kd_repository_find_source(repo, "../net", "job 1", NULL) < 0);
    assert_true(kd_repository_find_source(repo, "net", NULL, NULL) < 0);
    /* a malformed file says nothing */
    snprintf(p, sizeof p, "%s/net/3/" KD_REPOSITORY_SOURCE_FILE, root);
    write_text(p, "{\"source\": ");
    assert_int_equal(kd_repository_scan(repo), 0);
    assert_int_equal(kd_repository_find_source(repo, "net", "job 2", NULL), 2);
    /* a symlink out of the repository is not followed */
    char out[160];
    snprintf(out, sizeof out, "%s/source.json", outside);
    write_text(out, "{\"source\": \"job 9\"}");
    unlink(p);
    assert_int_equal(symlink(out, p), 0);
    assert_int_equal(kd_repository_find_source(repo, "net", "job 9", NULL), 0);
    kd_repository_close(repo);
}

/* What is in a model folder that is no version: a file named by a number is passed over (it made
 * the whole model invalid when newest), and a model with no version folder says what it found:
 * a folder named like a version but not one ("01", "v2"), or a model file put in the model
 * folder itself. */
static void test_entries_that_are_no_versions(void **state)
{
    (void)state;
    char p[256];
    make_version("noted", "4", config_text(NULL));
    snprintf(p, sizeof p, "%s/noted/5", root);
    write_text(p, "a note named 5\n");
    make_version("padded", "01", config_text(NULL));
    make_version("loose", "1", config_text(NULL));
    char from[256];
    snprintf(from, sizeof from, "%s/loose/1/model.kiln", root);
    snprintf(p, sizeof p, "%s/loose/model.kiln", root);
    assert_int_equal(rename(from, p), 0);
    snprintf(p, sizeof p, "%s/loose/1", root);
    assert_int_equal(kiln__remove_tree(p), 0);
    kd_repository *repo = kd_repository_open(root);
    assert_non_null(repo);
    const kd_model_info *m = kd_repository_find(repo, "noted");
    assert_true(m && m->valid && m->nversions == 1 && m->versions[0].version == 4);
    m = kd_repository_find(repo, "padded");
    assert_true(m && !m->valid);
    assert_non_null(strstr(m->why, "no version folders: '01' is not a version"));
    m = kd_repository_find(repo, "loose");
    assert_true(m && !m->valid);
    assert_non_null(strstr(m->why, "a model file sits in the model folder itself; move it into a version folder, "
                                   "such as loose/1/"));
    kd_repository_close(repo);
}

/* A model folder's config.json, read by every version without its own, is named as the model
 * folder's when it is wrong (it was blamed on a version's config.json that does not exist), and
 * text that is no JSON is said with where it went wrong. */
static void test_model_folder_config_named(void **state)
{
    (void)state;
    char p[256];
    make_version("shared", "1", NULL);
    snprintf(p, sizeof p, "%s/shared/config.json", root);
    write_text(p, "{\"max_batch_sise\": 4}");
    make_version("comma", "1", NULL);
    snprintf(p, sizeof p, "%s/comma/config.json", root);
    write_text(p, "{\n  \"max_batch_size\": 4,\n}\n");
    kd_repository *repo = kd_repository_open(root);
    assert_non_null(repo);
    const kd_model_info *m = kd_repository_find(repo, "shared");
    assert_true(m && !m->valid);
    assert_non_null(strstr(m->why, "version 1: the model folder's config.json: unknown key 'max_batch_sise'"));
    m = kd_repository_find(repo, "comma");
    assert_true(m && !m->valid);
    assert_non_null(strstr(m->why, "the model folder's config.json: not valid JSON (line 3, byte"));
    kd_repository_close(repo);
}

/* The root is served as it is found: never created, and only its folders are models. */
static void test_root_as_found(void **state)
{
    (void)state;
    char missing[160], p[256];
    snprintf(missing, sizeof missing, "%s/no-such-models", base);
    assert_null(kd_repository_open(missing));
    assert_non_null(strstr(kiln_error(), "No such file or directory"));
    assert_int_not_equal(access(missing, F_OK), 0); /* not made on the spot */
    snprintf(p, sizeof p, "%s/README.md", root);
    write_text(p, "# models\n");
    assert_null(kd_repository_open(p));
    assert_non_null(strstr(kiln_error(), "not a folder"));

    /* files beside the model folders, a hidden one and a symlink to a file are no models */
    snprintf(p, sizeof p, "%s/.gitattributes", root);
    write_text(p, "* binary\n");
    char target[256];
    snprintf(target, sizeof target, "%s/LICENSE", root);
    write_text(target, "license");
    snprintf(p, sizeof p, "%s/COPYING", root);
    assert_int_equal(symlink(target, p), 0);
    make_version("good", "1", config_text(NULL));
    kd_repository *repo = kd_repository_open(root);
    assert_non_null(repo);
    assert_int_equal(kd_repository_count(repo), 1);
    assert_string_equal(kd_repository_model(repo, 0)->name, "good");
    assert_true(kd_repository_model(repo, 0)->valid);
    assert_null(kd_repository_find(repo, "README.md"));
    kd_repository_close(repo);
}

/* 0 when a model folder kilnd cannot list is reported with the reason, checked in a child that
 * runs as another user when this runs as root (for whom mode 000 opens anyway). */
static int unreadable_reason_seen(void)
{
    kd_repository *repo = kd_repository_open(root);
    const kd_model_info *m = repo ? kd_repository_find(repo, "locked") : NULL;
    int rc = m && !m->valid && m->why && strstr(m->why, "cannot read: Permission denied") ? 0 : 1;
    if (rc)
        fprintf(stderr, "locked: %s\n", m && m->why ? m->why : repo ? "not listed" : kiln_error());
    kd_repository_close(repo);
    return rc;
}

static void test_unreadable_model_folder(void **state)
{
    (void)state;
    make_version("locked", "1", config_text(NULL));
    char p[256];
    snprintf(p, sizeof p, "%s/locked", root);
    assert_int_equal(chmod(p, 0), 0);
    assert_int_equal(chmod(base, 0755), 0); /* mkdtemp's 0700 would stop the other user at the top */
    if (geteuid() != 0) {
        assert_int_equal(unreadable_reason_seen(), 0);
    } else {
        pid_t child = fork();
        assert_true(child >= 0);
        if (child == 0) {
            if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0)
                _exit(2);
            _exit(unreadable_reason_seen());
        }
        int status = 0;
        assert_int_equal(waitpid(child, &status, 0), child);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    assert_int_equal(chmod(p, 0755), 0); /* for the teardown's removal */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_scan_valid_and_invalid, setup, teardown),
        cmocka_unit_test_setup_teardown(test_names_from_outside, setup, teardown),
        cmocka_unit_test_setup_teardown(test_version_policies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_add_and_remove, setup, teardown),
        cmocka_unit_test_setup_teardown(test_find_source, setup, teardown),
        cmocka_unit_test_setup_teardown(test_entries_that_are_no_versions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_model_folder_config_named, setup, teardown),
        cmocka_unit_test_setup_teardown(test_root_as_found, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unreadable_model_folder, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
