/*
 * tests/fusion/test-autotune.c — the autotune cache (engine/autotune.c) through the cpu's
 * fused block size: the first large program of a shape class times its candidates and
 * writes the winner to <dir>/autotune.tsv; a warmed entry is used as it is (the file is
 * left alone); a corrupt file and a stale kiln version are ignored and replaced; results
 * are the same whatever the cache holds; a warmed file merges into the cache
 * (kiln_autotune_merge_file) without overriding what was timed here. The block size is
 * the interpreter's: these run with the compiled loops off (KILN_CPU_JIT=off).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fusion-test.h"
#include "kiln/kiln.h"

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void spit(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* y = relu(x * 3 + 1) on 1024 x 1024 (a tuned size) through dev; y's first values. */
static void run_chain(kiln_device *dev, float out[4])
{
    kiln_scope_begin();
    kiln_tensor *x = kiln_arange(dev, KILN_F32, -512, 512, 1.0 / 1024);
    kiln_device_sync(dev);
    kiln_scope_begin();
    kiln_tensor *y = kiln_keep(kiln_relu(kiln_add_scalar(kiln_mul_scalar(x, 3), 1)));
    kiln_scope_end();
    int64_t at = 1024 * 512 - 2; /* around x = 0: -2/1024 .. 1/1024 */
    CHECK(kiln_to_data(kiln_slice(y, 0, at, at + 4, 1), out, 4 * sizeof(float)) == 0, "chain: %s", kiln_error());
    kiln_tensor_release(y);
    kiln_scope_end();
}

static void check_values(const float v[4], const char *when)
{
    bool ok = true;
    for (int i = 0; i < 4; i++) {
        float x = (float)(i - 2) / 1024.0f;
        float want = x * 3.0f + 1.0f;
        ok = ok && v[i] == (want > 0 ? want : 0);
    }
    CHECK(ok, "%s: relu(x * 3 + 1) wrong (%g %g %g %g)", when, v[0], v[1], v[2], v[3]);
}

/* Outputs of 2^21 elements and more are written with non-temporal stores whose width
 * follows the kernel table (16, 8 or 4 floats) and whose block size is tuned (each
 * candidate on several segments): on every table, an odd-length program that is both
 * streamed and tuned equals the unfused device element for element. */
static void streamed_outputs(void)
{
    const char *tables[] = {"auto", "avx2", "base"};
    const int64_t n = ((int64_t)1 << 21) + 37;
    float *want = malloc((size_t)n * sizeof *want), *got = malloc((size_t)n * sizeof *got);
    for (int t = 0; t < 3 && want && got; t++) {
        char fspec[64], pspec[64];
        snprintf(fspec, sizeof fspec, "cpu?fusion=on&kernels=%s", tables[t]);
        snprintf(pspec, sizeof pspec, "cpu?kernels=%s", tables[t]);
        kiln_device *fd = kiln_device_open(fspec), *pd = kiln_device_open(pspec);
        CHECK(fd && pd, "open %s and %s: %s", fspec, pspec, kiln_error());
        for (int round = 0; fd && pd && round < 3; round++) { /* tuning runs: three block sizes */
            float *out[2] = {got, want};
            kiln_device *d[2] = {fd, pd};
            for (int k = 0; k < 2; k++) {
                kiln_scope_begin();
                kiln_generator g = kiln_generator_make(11);
                kiln_tensor *x = kiln_rand_uniform(d[k], KILN_F32, 1, &n, -4, 4, &g);
                kiln_device_sync(d[k]);
                kiln_scope_begin();
                kiln_tensor *y = kiln_keep(
                    kiln_mul(kiln_gelu(kiln_add_scalar(kiln_mul_scalar(x, 0.75), 0.5), false), x));
                kiln_scope_end();
                CHECK(kiln_to_data(y, out[k], (size_t)n * sizeof(float)) == 0, "%s: %s", k ? pspec : fspec,
                      kiln_error());
                kiln_tensor_release(y);
                kiln_scope_end();
            }
            int64_t bad = -1;
            for (int64_t i = 0; i < n && bad < 0; i++)
                if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
                    bad = i;
            CHECK(bad < 0, "%s run %d: element %lld is %.9g fused, %.9g unfused", fspec, round, (long long)bad,
                  bad < 0 ? 0.0 : (double)got[bad], bad < 0 ? 0.0 : (double)want[bad]);
        }
        if (fd)
            kiln_device_close(fd);
        if (pd)
            kiln_device_close(pd);
    }
    free(want);
    free(got);
}

/* Runs the chain until path holds a fused-block entry timed by this kiln version (at most
 * 40 runs), checking every result; the number of runs it took. */
static int tune_class(kiln_device *dev, const char *path, float v[4], const char *when)
{
    int runs = 0;
    for (;;) {
        run_chain(dev, v);
        runs++;
        char what[96];
        snprintf(what, sizeof what, "%s, run %d", when, runs);
        check_values(v, what);
        const char *text = slurp(path);
        if ((text && strstr(text, "fused-block n2^20") && strstr(text, kiln_version())) || runs >= 40)
            return runs;
    }
}

static void autotune_cache(void)
{
    char dir[] = "/tmp/kiln-autotune-XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(false, "mkdtemp failed");
        return;
    }
    char path[128];
    snprintf(path, sizeof path, "%s/autotune.tsv", dir);
    CHECK(kiln_autotune_dir_set(dir) == 0, "set the autotune folder");
    kiln_device *dev = kiln_device_open("fused:cpu");
    CHECK(dev != NULL, "open fused:cpu: %s", kiln_error());
    if (!dev)
        return;
    float v[4];

    /* first sight of the class: its first runs each time one candidate (every result right),
     * and the winner is stored once all have run */
    int runs = tune_class(dev, path, v, "first sight");
    CHECK(runs > 1 && runs < 40, "the class was tuned over %d runs, more than one", runs);
    char *text = slurp(path);
    CHECK(text && !strncmp(text, "kiln-autotune 1\n", 16) && strstr(text, "fused-block") &&
              strstr(text, kiln_version()),
          "the winner is written with the kiln version: '%s'", text ? text : "(no file)");
    char saved[8192] = "";
    if (text)
        snprintf(saved, sizeof saved, "%s", text);

    /* a warmed entry (here 1024, a valid candidate) is used: the file stays as it is */
    char warmed[8192];
    snprintf(warmed, sizeof warmed, "%s", saved);
    char *tab = strrchr(warmed, '\t');
    if (tab)
        snprintf(tab + 1, warmed + sizeof warmed - tab - 1, "1024\n");
    spit(path, warmed);
    kiln_autotune_dir_set(dir);
    run_chain(dev, v);
    check_values(v, "warmed run");
    text = slurp(path);
    CHECK(text && !strcmp(text, warmed), "a warmed entry is not timed again");

    /* a corrupt file is ignored (with a line on stderr) and replaced by a good one */
    spit(path, "kiln-autotune 1\nthis line is not four fields\n");
    kiln_autotune_dir_set(dir);
    tune_class(dev, path, v, "corrupt cache");
    text = slurp(path);
    CHECK(text && !strncmp(text, "kiln-autotune 1\n", 16) && !strstr(text, "not four"),
          "a corrupt file is replaced: '%s'", text ? text : "(no file)");
    spit(path, "\x01\x02garbage");
    kiln_autotune_dir_set(dir);
    run_chain(dev, v);
    check_values(v, "binary garbage in the cache");

    /* entries of another kiln version are dropped and timed again */
    spit(path, "kiln-autotune 1\n0.0.1\tcpu/x/1t\tfused-block n2^20 i4 r1 g0 cached\t4096\n");
    kiln_autotune_dir_set(dir);
    tune_class(dev, path, v, "stale cache");
    text = slurp(path);
    CHECK(text && !strstr(text, "0.0.1\t") && strstr(text, kiln_version()), "stale entries are dropped: '%s'",
          text ? text : "(no file)");

    /* a warmed file merged in (as kilnd does with one shipped beside a model): the entries
     * the cache lacks are taken and persisted, the ones it has are kept */
    char shipped[160];
    snprintf(shipped, sizeof shipped, "%s/shipped.tsv", dir);
    char warm[512];
    snprintf(warm, sizeof warm,
             "kiln-autotune 1\n%s\tcpu/shipped/1t\tfused-block n2^30 i4 r1 g0 cached\t2048\n"
             "%s\tcpu/shipped/1t\tfused-block n2^31 i4 r1 g0 cached\t4096\n0.0.1\tcpu/old/1t\tk\t8\n",
             kiln_version(), kiln_version());
    spit(shipped, warm);
    CHECK(kiln_autotune_merge_file(shipped) == 2, "a shipped file's two entries are taken: %s", kiln_error());
    text = slurp(path);
    CHECK(text && strstr(text, "cpu/shipped/1t\tfused-block n2^30 i4 r1 g0 cached\t2048") &&
              strstr(text, "n2^31 i4 r1 g0 cached\t4096") && !strstr(text, "cpu/old"),
          "merged entries are written to the cache, the stale one is not: '%s'", text ? text : "(no file)");
    CHECK(kiln_autotune_merge_file(shipped) == 0, "merging the same file again takes nothing");
    CHECK(kiln_autotune_merge_file("/nonexistent-folder/autotune.tsv") == 0, "a missing file takes nothing");
    spit(shipped, "kiln-autotune 1\nnot four fields\n");
    CHECK(kiln_autotune_merge_file(shipped) == -1 && strstr(kiln_error(), "corrupt") &&
              strstr(kiln_error(), "shipped.tsv"),
          "a corrupt file is refused naming it: '%s'", kiln_error());
    CHECK(kiln_autotune_merge_file(NULL) == -1 && strstr(kiln_error(), "no file"), "NULL is refused: '%s'",
          kiln_error());
    unlink(shipped);

    CHECK(kiln_autotune_dir_set(NULL) == 0, "unset the autotune folder");
    kiln_device_close(dev);
    unlink(path);
    rmdir(dir);
}

void test_autotune(void)
{
    /* streamed programs through the compiled loops (cpu-fused-jit.c, where a compiler is
     * present) and through the block interpreter; the block size is tuned only in the
     * interpreter, so the cache is checked with the compiled loops off */
    streamed_outputs();
    setenv("KILN_CPU_JIT", "off", 1);
    streamed_outputs();
    autotune_cache();
    unsetenv("KILN_CPU_JIT");
}
