/*
 * tests/storage/test_file_safety.c — what every storage reader and writer does with the file
 * system around it: readers refuse a FIFO (or anything but a regular file) at once instead
 * of blocking forever, writers give new files the umask's mode and keep a replaced file's
 * mode, and a save removes the temporary files a killed save of the same file left behind.
 */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kiln/data.h"
#include "kiln/kiln.h"
#include "kiln/onnx.h"
#include "kiln/record.h"
#include "storage-impl.h"

static kiln_device *dev;
static char dir[64];

static int setup(void **state)
{
    (void)state;
    dev = kiln_device_open("cpu");
    snprintf(dir, sizeof dir, "/tmp/kiln-files-XXXXXX");
    /* a reader that blocks on a FIFO would hang the suite: fail it instead */
    alarm(60);
    return dev && mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    alarm(0);
    kiln__remove_tree(dir);
    kiln_device_close(dev);
    return 0;
}

static void in_dir(char *out, size_t len, const char *name)
{
    if (snprintf(out, len, "%s/%s", dir, name) >= (int)len)
        fail_msg("path of %s too long", name);
}

static void save_tensor(const char *path, unsigned flags)
{
    kiln_tensor *t = kiln_arange(dev, KILN_F32, 0, 16, 1);
    const char *names[] = {"t"};
    if (kiln_record_save(path, 1, names, &t, NULL, flags) != 0)
        fail_msg("save %s: %s", path, kiln_error());
    kiln_tensor_release(t);
}

static void expect_not_regular(const void *handle, const char *what)
{
    if (handle)
        fail_msg("%s opened a FIFO", what);
    if (!strstr(kiln_error(), "not a regular file"))
        fail_msg("%s: '%s' does not say 'not a regular file'", what, kiln_error());
}

/* A FIFO with no writer: open(2) without O_NONBLOCK waits for one forever (in kilnd, a FIFO
 * in the model repository stopped the event loop). Every reader refuses it at once. */
static void test_readers_refuse_fifo(void **state)
{
    (void)state;
    char fifo[128];
    in_dir(fifo, sizeof fifo, "weights.safetensors");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    time_t start = time(NULL);
    kiln_error_clear();
    expect_not_regular(kiln_safetensors_open(fifo), "kiln_safetensors_open");
    expect_not_regular(kiln_safetensors_open_mapped(fifo), "kiln_safetensors_open_mapped");
    expect_not_regular(kiln_record_open(fifo), "kiln_record_open");
    expect_not_regular(kiln_torch_open(fifo, NULL), "kiln_torch_open");
    char *text = NULL;
    assert_int_not_equal(kiln__read_file(fifo, 1 << 20, &text, NULL), 0);
    expect_not_regular(text, "kiln__read_file");
    /* the model and data readers outside storage: ONNX, IDX (gzip or plain) and CSV */
    expect_not_regular(kiln_onnx_load(fifo, dev, NULL), "kiln_onnx_load");
    expect_not_regular(kiln_dataset_idx(fifo, fifo), "kiln_dataset_idx");
    expect_not_regular(kiln_dataset_csv(fifo, NULL, 0, NULL), "kiln_dataset_csv");
    /* a folder is refused the same way */
    expect_not_regular(kiln_safetensors_open(dir), "kiln_safetensors_open on a folder");

    /* a checkpoint whose MANIFEST, then whose model file, is a FIFO */
    char root[128], step[160], p[200];
    in_dir(root, sizeof root, "ckpt");
    kiln_tensor *w = kiln_ones(dev, KILN_F32, KILN_SHAPE(2));
    const char *mn[] = {"w"};
    kiln_ckpt_state s = {.step = 1, .model_n = 1, .model_names = mn, .model_tensors = &w};
    assert_int_equal(kiln_ckpt_save(root, &s, step, sizeof step), 0);
    kiln_tensor_release(w);
    snprintf(p, sizeof p, "%s/MANIFEST", step);
    char saved[200];
    snprintf(saved, sizeof saved, "%s/MANIFEST.good", root);
    assert_int_equal(rename(p, saved), 0);
    assert_int_equal(mkfifo(p, 0600), 0);
    expect_not_regular(kiln_ckpt_open(step), "kiln_ckpt_open (MANIFEST)");
    assert_null(kiln_ckpt_open_latest(root, NULL, NULL));
    assert_int_equal(unlink(p), 0);
    assert_int_equal(rename(saved, p), 0);
    snprintf(p, sizeof p, "%s/model.kiln", step);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(mkfifo(p, 0600), 0);
    expect_not_regular(kiln_ckpt_open(step), "kiln_ckpt_open (model.kiln)");
    kiln_ckpt_info *list;
    int n;
    assert_int_equal(kiln_ckpt_list(root, true, NULL, &list, &n), 0);
    assert_int_equal(n, 1);
    assert_false(list[0].valid);
    assert_non_null(strstr(list[0].why, "not a regular file"));
    kiln_ckpt_list_free(list, n);
    assert_true(time(NULL) - start < 30);
}

static mode_t mode_of(const char *path)
{
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    return sb.st_mode & 07777;
}

/* New files got 0644 whatever the umask, and replacing a private 0600 file made it 0644. */
static void test_file_modes(void **state)
{
    (void)state;
    char a[128], b[128];
    in_dir(a, sizeof a, "a.kiln");
    in_dir(b, sizeof b, "b.kiln");
    mode_t old = umask(027);
    save_tensor(a, 0);
    umask(0);
    save_tensor(b, KILN_RECORD_ZSTD);
    umask(old);
    assert_int_equal(mode_of(a), 0640);
    assert_int_equal(mode_of(b), 0666);
    /* replacing keeps the file's own mode, whatever the umask says */
    assert_int_equal(chmod(a, 0600), 0);
    assert_int_equal(chmod(b, 0604), 0);
    umask(0);
    save_tensor(a, KILN_RECORD_ZSTD);
    save_tensor(b, 0);
    umask(old);
    assert_int_equal(mode_of(a), 0600);
    assert_int_equal(mode_of(b), 0604);
    /* and the contents are the new save's */
    kiln_record *rec = kiln_record_open(a);
    assert_non_null(rec);
    assert_true(kiln_record_compressed(rec));
    kiln_record_close(rec);
}

/* A compressed record whose frame lost a byte: zstd alone decoded many such frames into other
 * bytes (a weight of 1547 read as 7e39), so the frame carries its content checksum and every
 * flip is refused at open, whichever byte of the frame it hits. */
static void test_flipped_compressed_byte_refused(void **state)
{
    (void)state;
    char p[128];
    in_dir(p, sizeof p, "z.kiln");
    kiln_generator gen = kiln_generator_make(5);
    kiln_tensor *t = kiln_rand_normal(dev, KILN_F32, 2, (int64_t[]){64, 64}, 0.0, 1.0, &gen);
    const char *names[] = {"w"};
    assert_int_equal(kiln_record_save(p, 1, names, &t, NULL, KILN_RECORD_ZSTD), 0);
    kiln_tensor_release(t);
    char *data = NULL;
    size_t len = 0;
    assert_int_equal(kiln__read_file(p, 1u << 24, &data, &len), 0);
    int opened = 0, tried = 0;
    for (size_t at = 16 + 6; at < len; at += len / 41 + 1) { /* past the magic, the size and the frame's header */
        data[at] ^= 0x04;
        assert_int_equal(kiln__write_file_atomic(p, data, len), 0);
        data[at] ^= 0x04;
        kiln_record *rec = kiln_record_open(p);
        tried++;
        if (rec) {
            opened++;
            kiln_record_close(rec);
        } else if (!strstr(kiln_error(), "corrupt compressed record")) {
            fail_msg("byte %zu: '%s' does not say the record is corrupt", at, kiln_error());
        }
    }
    free(data);
    assert_true(tried >= 30);
    assert_int_equal(opened, 0);
}

/* A file of another format given to the record or safetensors reader says what it is and
 * which call reads it: the header length "PK\3\4..." makes (some 10^17 bytes) said nothing. */
static void test_other_formats_named(void **state)
{
    (void)state;
    /* adjacent literals end each hex escape: "\x00" "archive", not "\x00a" */
#define FILE_BYTES(s) s, sizeof s - 1
    static const struct {
        const char *bytes;
        size_t n;
        const char *says;
    } files[] = {
        {FILE_BYTES("PK\x03\x04\x14\x00\x00\x00\x08\x00"
                    "archive/data.pkl"),
         "a zip archive, as torch.save writes a PyTorch checkpoint: read it with kiln_torch_open"},
        {FILE_BYTES("\x80\x02}q\x00(X\x06\x00\x00\x00"
                    "weightq\x01"),
         "a Python pickle"},
        {FILE_BYTES("\x08\x08\x12\x07pytorch\x1a\x05"
                    "2.1.0"),
         "an ONNX model, it seems: load it with kiln_onnx_load"},
    };
#undef FILE_BYTES
    char p[128];
    in_dir(p, sizeof p, "other.bin");
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        assert_int_equal(kiln__write_file_atomic(p, files[i].bytes, files[i].n), 0);
        kiln_record *rec = kiln_record_open(p);
        if (rec || !strstr(kiln_error(), files[i].says))
            fail_msg("record %zu: '%s' does not say '%s'", i, rec ? "opened" : kiln_error(), files[i].says);
        kiln_safetensors *st = kiln_safetensors_open(p);
        if (st || !strstr(kiln_error(), files[i].says))
            fail_msg("safetensors %zu: '%s' does not say '%s'", i, st ? "opened" : kiln_error(), files[i].says);
    }
}

/* Create name in dir as a small regular file last modified age seconds ago. */
static void make_temp(const char *name, time_t age)
{
    char p[256];
    in_dir(p, sizeof p, name);
    assert_int_equal(kiln__write_file_atomic(p, "partial", 7), 0);
    struct timespec times[2] = {{.tv_sec = time(NULL) - age}, {.tv_sec = time(NULL) - age}};
    assert_int_equal(utimensat(AT_FDCWD, p, times, 0), 0);
}

static bool exists(const char *name)
{
    char p[256];
    in_dir(p, sizeof p, name);
    struct stat sb;
    return lstat(p, &sb) == 0;
}

/* A save killed by SIGKILL leaves x.kiln.tmp.<pid>.* (and, for a compressed record,
 * x.kiln.tmp.raw.<pid>.*) behind, which nothing ever removed. The next save of x.kiln
 * removes those whose writer is gone and that have not changed for a while, and nothing
 * else. */
static void test_stale_temps_removed(void **state)
{
    (void)state;
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0)
        _exit(0);
    assert_int_equal(waitpid(child, NULL, 0), child); /* its pid now names no process */
    long dead = (long)child, alive = (long)getpid();
    const time_t old = KILN__STALE_TEMP_AGE + 60;
    char names[9][96];
    snprintf(names[0], sizeof names[0], "x.kiln.tmp.%ld.Ab3dE9", dead);                     /* removed */
    snprintf(names[1], sizeof names[1], "x.kiln.tmp.raw.%ld.0", dead);                      /* removed */
    snprintf(names[2], sizeof names[2], "x.kiln.tmp.raw.%ld.0.tmp.%ld.qq7Rt2", dead, dead); /* removed */
    snprintf(names[3], sizeof names[3], "x.kiln.tmp.%ld.recent", dead);                     /* too recent */
    snprintf(names[4], sizeof names[4], "x.kiln.tmp.%ld.Zz9Zz9", alive);                    /* writer alive */
    snprintf(names[5], sizeof names[5], "x.kiln.tmp.Q1w2E3");                               /* no pid in it */
    snprintf(names[6], sizeof names[6], "y.kiln.tmp.%ld.Ab3dE9", dead);                     /* another file's */
    snprintf(names[7], sizeof names[7], "x.kiln.tmp.%ld.", dead);                           /* not a temp name */
    snprintf(names[8], sizeof names[8], "x.kiln.tmp.%ld.fifo0", dead);                      /* not a file */
    for (int i = 0; i < 8; i++)
        make_temp(names[i], i == 3 ? 5 : old);
    char fifo[256];
    in_dir(fifo, sizeof fifo, names[8]);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    char path[128];
    in_dir(path, sizeof path, "x.kiln");
    save_tensor(path, KILN_RECORD_ZSTD);
    for (int i = 0; i < 9; i++)
        if (exists(names[i]) != (i >= 3))
            fail_msg("%s was %s", names[i], i >= 3 ? "removed" : "left behind");
    /* the save itself left nothing beside its file */
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d)) != NULL)
        n += de->d_name[0] != '.';
    closedir(d);
    assert_int_equal(n, 7); /* x.kiln and the six kept */
    assert_int_equal(kiln__remove_stale_temps(path), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_readers_refuse_fifo, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_modes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flipped_compressed_byte_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_formats_named, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_temps_removed, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
