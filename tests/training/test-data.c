/*
 * tests/training/test-data.c — data set readers against small files written here (IDX
 * raw and gzipped, a truncated IDX, CSV good and bad rows), transforms (split and
 * shuffle reproducibility, windows, normalize), the loader's determinism across worker
 * counts and its last-batch policy, and the classification metrics against confusion
 * matrices counted by hand.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "kiln/kiln.h"

static int failures;
#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: check failed: %s (%s)\n", __FILE__, __LINE__, #cond, kiln_error()); \
            failures++;                                                              \
        }                                                                            \
    } while (0)

static char dir[256];

static void path_of(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", dir, name);
}

/* An IDX u8 file of n images h x w with pixel (i, k) = (i * 7 + k) % 256 and labels i % 3. */
static void write_idx(const char *name, const char *labels, int n, int h, int w, bool gz, long truncate_to)
{
    size_t len = 16 + (size_t)n * h * w;
    unsigned char *buf = malloc(len);
    unsigned char hdr[16] = {0, 0, 8, 3, 0, 0, 0, (unsigned char)n, 0, 0, 0, (unsigned char)h, 0, 0, 0, (unsigned char)w};
    memcpy(buf, hdr, 16);
    for (size_t k = 0; k < (size_t)n * h * w; k++)
        buf[16 + k] = (unsigned char)(((k / (size_t)(h * w)) * 7 + k % (size_t)(h * w)) % 256);
    if (truncate_to >= 0)
        len = (size_t)truncate_to;
    char p[512];
    path_of(p, sizeof p, name);
    if (gz) {
        gzFile f = gzopen(p, "wb");
        gzwrite(f, buf, (unsigned)len);
        gzclose(f);
    } else {
        FILE *f = fopen(p, "wb");
        fwrite(buf, 1, len, f);
        fclose(f);
    }
    free(buf);
    unsigned char lb[8 + 256] = {0, 0, 8, 1, 0, 0, 0, (unsigned char)n};
    for (int i = 0; i < n; i++)
        lb[8 + i] = (unsigned char)(i % 3);
    path_of(p, sizeof p, labels);
    FILE *f = fopen(p, "wb");
    fwrite(lb, 1, 8 + (size_t)n, f);
    fclose(f);
}

static void write_text(const char *name, const char *text)
{
    char p[512];
    path_of(p, sizeof p, name);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
}

static void test_idx(void)
{
    char im[512], lb[512];
    for (int gz = 0; gz < 2; gz++) {
        write_idx(gz ? "im.gz" : "im.raw", "lb.raw", 5, 3, 4, gz, -1);
        path_of(im, sizeof im, gz ? "im.gz" : "im.raw");
        path_of(lb, sizeof lb, "lb.raw");
        kiln_dataset *ds = kiln_dataset_idx(im, lb);
        CHECK(ds != NULL);
        if (!ds)
            continue;
        kiln_dataset_info in = kiln_dataset_get_info(ds);
        CHECK(in.length == 5 && in.ndim == 3 && in.shape[0] == 1 && in.shape[1] == 3 && in.shape[2] == 4);
        CHECK(in.num_classes == 3);
        float x[12];
        double t;
        CHECK(kiln_dataset_get(ds, 4, x, &t, 0) == 0);
        CHECK(t == 1.0);
        CHECK(fabsf(x[5] - (float)((4 * 7 + 5) % 256) / 255.0f) < 1e-7f);
        CHECK(kiln_dataset_get(ds, 5, x, &t, 0) < 0 && strstr(kiln_error(), "out of range"));
        kiln_dataset_free(ds);
    }
    /* truncated: the message names the file, what the header promised and where the data
     * stopped */
    write_idx("trunc.gz", "lb.raw", 5, 3, 4, true, 16 + 30);
    path_of(im, sizeof im, "trunc.gz");
    CHECK(kiln_dataset_idx(im, lb) == NULL);
    CHECK(strstr(kiln_error(), "trunc.gz") &&
          strstr(kiln_error(), "truncated: header says 76 bytes, file has 46"));
    write_idx("hdr.raw", "lb.raw", 5, 3, 4, false, 10);
    path_of(im, sizeof im, "hdr.raw");
    CHECK(kiln_dataset_idx(im, lb) == NULL && strstr(kiln_error(), "hdr.raw"));
    /* data past what the header describes: appended bytes, and a second gzip member */
    for (int gz = 0; gz < 2; gz++) {
        const char *name = gz ? "long.gz" : "long.raw";
        write_idx(name, "lb.raw", 5, 3, 4, gz, -1);
        path_of(im, sizeof im, name);
        if (gz) {
            gzFile f = gzopen(im, "ab");
            gzwrite(f, "xyz", 3);
            gzclose(f);
        } else {
            FILE *f = fopen(im, "ab");
            fwrite("xyz", 1, 3, f);
            fclose(f);
        }
        CHECK(kiln_dataset_idx(im, lb) == NULL && strstr(kiln_error(), name) &&
              strstr(kiln_error(), "data continues past byte 76"));
    }
    path_of(im, sizeof im, "missing.gz");
    CHECK(kiln_dataset_idx(im, lb) == NULL && strstr(kiln_error(), "missing.gz"));
}

static void test_csv(void)
{
    char p[512];
    write_text("good.csv", "a,b,label,c\n1,2,cat,3\n4,5.5,dog,6\n\n7,8,cat,9\n");
    path_of(p, sizeof p, "good.csv");
    kiln_dataset *ds = kiln_dataset_csv(p, "label", 0, NULL);
    CHECK(ds && kiln_dataset_length(ds) == 3);
    if (ds) {
        kiln_dataset_info in = kiln_dataset_get_info(ds);
        CHECK(in.num_classes == 2 && in.shape[0] == 3);
        float x[3];
        double t;
        CHECK(kiln_dataset_get(ds, 1, x, &t, 0) == 0 && x[0] == 4 && x[1] == 5.5f && x[2] == 6 && t == 1);
        kiln_dataset_free(ds);
    }
    /* named feature columns, no label */
    const char *cols[] = {"c", "a"};
    ds = kiln_dataset_csv(p, NULL, 2, cols);
    CHECK(ds != NULL);
    if (ds) {
        float x[2];
        double t;
        CHECK(kiln_dataset_get(ds, 2, x, &t, 0) == 0 && x[0] == 9 && x[1] == 7);
        kiln_dataset_free(ds);
    }
    write_text("bad.csv", "a,b,label\n1,2,0\n3,x4,1\n");
    path_of(p, sizeof p, "bad.csv");
    CHECK(kiln_dataset_csv(p, "label", 0, NULL) == NULL);
    CHECK(strstr(kiln_error(), "bad.csv") && strstr(kiln_error(), "line 3"));
    write_text("short.csv", "a,b,label\n1,2,0\n3,1\n");
    path_of(p, sizeof p, "short.csv");
    CHECK(kiln_dataset_csv(p, "label", 0, NULL) == NULL && strstr(kiln_error(), "line 3"));
    path_of(p, sizeof p, "good.csv");
    CHECK(kiln_dataset_csv(p, "nope", 0, NULL) == NULL && strstr(kiln_error(), "nope"));
    /* the label as a feature, a feature twice, a name the header gives two columns */
    const char *with_label[] = {"a", "label"}, *twice[] = {"b", "b"}, *null_name[] = {"a", NULL};
    CHECK(kiln_dataset_csv(p, "label", 2, with_label) == NULL && strstr(kiln_error(), "label column"));
    CHECK(kiln_dataset_csv(p, NULL, 2, twice) == NULL && strstr(kiln_error(), "'b' is listed twice"));
    CHECK(kiln_dataset_csv(p, NULL, 2, null_name) == NULL && strstr(kiln_error(), "NULL"));
    write_text("dup.csv", "a,b,a,label\n1,2,3,0\n");
    path_of(p, sizeof p, "dup.csv");
    ds = kiln_dataset_csv(p, "label", 0, NULL); /* every other column: the names do not matter */
    CHECK(ds && kiln_dataset_get_info(ds).feature_numel == 3);
    kiln_dataset_free(ds);
    const char *named_a[] = {"a"};
    CHECK(kiln_dataset_csv(p, "label", 1, named_a) == NULL && strstr(kiln_error(), "columns 1 and 3"));
    CHECK(kiln_dataset_csv(p, "a", 0, NULL) == NULL && strstr(kiln_error(), "both named 'a'"));
}

static kiln_dataset *counting(int64_t n)
{
    float *x = malloc((size_t)n * 2 * sizeof *x);
    int64_t *y = malloc((size_t)n * sizeof *y);
    for (int64_t i = 0; i < n; i++) {
        x[2 * i] = (float)i;
        x[2 * i + 1] = (float)(i * 10);
        y[i] = i % 4;
    }
    kiln_dataset *ds = kiln_dataset_from_arrays(n, 1, (int64_t[]){2}, x, y, 4, NULL, 0);
    free(x);
    free(y);
    return ds;
}

/* A map whose output depends on the key, to see that augmentation is reproducible. */
static int add_noise(void *ud, float *x, double *t, uint64_t key)
{
    x[1] += (float)(key % 1000) / 1000.0f;
    return 0;
}

static void test_transforms(void)
{
    kiln_dataset *ds = counting(100);
    kiln_dataset *tr1, *va1, *tr2, *va2;
    CHECK(kiln_dataset_split(ds, 0.2, 9, &tr1, &va1) == 0);
    CHECK(kiln_dataset_split(ds, 0.2, 9, &tr2, &va2) == 0);
    CHECK(kiln_dataset_length(tr1) == 80 && kiln_dataset_length(va1) == 20);
    bool same = true, seen[100] = {0};
    for (int64_t i = 0; i < 20; i++) {
        float a[2], b[2];
        double t;
        kiln_dataset_get(va1, i, a, &t, 0);
        kiln_dataset_get(va2, i, b, &t, 0);
        same &= a[0] == b[0];
        seen[(int)a[0]] = true;
    }
    for (int64_t i = 0; i < 80; i++) {
        float a[2];
        double t;
        kiln_dataset_get(tr1, i, a, &t, 0);
        CHECK(!seen[(int)a[0]]); /* disjoint */
        seen[(int)a[0]] = true;
    }
    CHECK(same);
    kiln_dataset *s1 = kiln_dataset_shuffle(ds, 5), *s2 = kiln_dataset_shuffle(ds, 5), *s3 = kiln_dataset_shuffle(ds, 6);
    int equal12 = 0, equal13 = 0;
    for (int64_t i = 0; i < 100; i++) {
        float a[2], b[2], c[2];
        double t;
        kiln_dataset_get(s1, i, a, &t, 0);
        kiln_dataset_get(s2, i, b, &t, 0);
        kiln_dataset_get(s3, i, c, &t, 0);
        equal12 += a[0] == b[0];
        equal13 += a[0] == c[0];
    }
    CHECK(equal12 == 100 && equal13 < 20);
    kiln_dataset *w = kiln_dataset_windows(ds, 3, 2);
    CHECK(w && kiln_dataset_length(w) == 49);
    if (w) {
        float x[6];
        double t;
        CHECK(kiln_dataset_get(w, 2, x, &t, 0) == 0 && x[0] == 4 && x[2] == 5 && x[4] == 6 && t == 6 % 4);
    }
    kiln_dataset *nm = kiln_dataset_normalize(ds, 1, (const float[]){1}, (const float[]){2});
    float x[2];
    double t;
    CHECK(nm && kiln_dataset_get(nm, 3, x, &t, 0) == 0 && x[0] == 1.0f && x[1] == 14.5f);
    kiln_dataset *sub = kiln_dataset_subset(ds, 2, (const int64_t[]){7, 3});
    CHECK(sub && kiln_dataset_get(sub, 1, x, &t, 0) == 0 && x[0] == 3);
    CHECK(kiln_dataset_subset(ds, 1, (const int64_t[]){100}) == NULL);
    kiln_dataset *objs[] = {tr1, va1, tr2, va2, s1, s2, s3, w, nm, sub, ds};
    for (size_t i = 0; i < sizeof objs / sizeof *objs; i++)
        kiln_dataset_free(objs[i]);
}

/* Every batch of two epochs, flattened, for a loader with `workers` workers. */
static void run_loader(kiln_device *dev, kiln_dataset *ds, int workers, bool drop_last, float *out, int64_t *nb)
{
    kiln_loader_config lc = kiln_loader_config_default();
    lc.batch_size = 7;
    lc.seed = 99;
    lc.workers = workers;
    lc.prefetch = workers ? 2 : 0;
    lc.drop_last = drop_last;
    kiln_loader *ld = kiln_loader_create(ds, &lc, dev);
    CHECK(ld != NULL);
    int64_t k = 0, batches = 0;
    for (int64_t e = 0; ld && e < 2; e++) {
        CHECK(kiln_loader_start(ld, e, 0) == 0);
        kiln_batch b;
        kiln_scope_begin();
        while (kiln_loader_next(ld, &b) == 1) {
            int64_t nx = kiln_tensor_numel(b.x);
            kiln_to_data(b.x, out + k, (size_t)nx * sizeof(float));
            CHECK(kiln_tensor_dtype(b.y) == KILN_I64 && kiln_tensor_dim(b.y, 0) == b.n);
            k += nx;
            batches++;
        }
        kiln_scope_end();
    }
    *nb = batches;
    kiln_loader_free(ld);
}

static void test_loader(kiln_device *dev)
{
    kiln_dataset *base = counting(100);
    kiln_dataset *ds = kiln_dataset_map(base, add_noise, NULL);
    float *a = calloc(400, sizeof *a), *b = calloc(400, sizeof *b), *c = calloc(400, sizeof *c);
    int64_t na, nb, nc;
    run_loader(dev, ds, 0, false, a, &na);
    run_loader(dev, ds, 1, false, b, &nb);
    run_loader(dev, ds, 3, false, c, &nc);
    CHECK(na == 30 && nb == 30 && nc == 30); /* 15 batches per epoch, the last one short */
    CHECK(memcmp(a, b, 400 * sizeof *a) == 0);
    CHECK(memcmp(a, c, 400 * sizeof *a) == 0);
    /* the two epochs differ in order, and each is a permutation */
    CHECK(memcmp(a, a + 200, 200 * sizeof *a) != 0);
    float sum = 0;
    for (int i = 0; i < 200; i += 2)
        sum += a[i];
    CHECK(sum == 4950);
    run_loader(dev, ds, 3, true, c, &nc);
    CHECK(nc == 28);
    /* the permutation is a pure function of (seed, epoch) */
    int64_t p1[50], p2[50];
    kiln_data_permutation(3, 7, 50, p1);
    kiln_data_permutation(3, 7, 50, p2);
    CHECK(memcmp(p1, p2, sizeof p1) == 0);
    free(a);
    free(b);
    free(c);
    kiln_dataset_free(ds);
    kiln_dataset_free(base);
}

static void test_metrics(void)
{
    /* labels / predictions:    (0,0) (0,0) (0,1) (1,1) (1,2) (2,2) (2,2) (2,0)
     * confusion rows = label: [2 1 0; 0 1 1; 1 0 2]
     * precision: c0 2/3, c1 1/2, c2 2/3 -> macro 0.6111
     * recall:    c0 2/3, c1 1/2, c2 2/3 -> 0.6111; F1 per class equals precision here */
    kiln_confusion cm;
    CHECK(kiln_confusion_init(&cm, 3) == 0);
    const int64_t lab[] = {0, 0, 0, 1, 1, 2, 2, 2}, pred[] = {0, 0, 1, 1, 2, 2, 2, 0};
    for (int i = 0; i < 8; i++)
        kiln_confusion_add(&cm, lab[i], pred[i]);
    const int64_t want[9] = {2, 1, 0, 0, 1, 1, 1, 0, 2};
    CHECK(memcmp(cm.counts, want, sizeof want) == 0);
    CHECK(fabs(kiln_confusion_accuracy(&cm) - 5.0 / 8) < 1e-12);
    CHECK(fabs(kiln_confusion_precision(&cm) - (2.0 / 3 + 0.5 + 2.0 / 3) / 3) < 1e-12);
    CHECK(fabs(kiln_confusion_recall(&cm) - (2.0 / 3 + 0.5 + 2.0 / 3) / 3) < 1e-12);
    CHECK(fabs(kiln_confusion_f1(&cm) - (2.0 / 3 + 0.5 + 2.0 / 3) / 3) < 1e-12);
    /* asymmetric: [3 0; 2 1]: precision c0 3/5, c1 1/1; recall c0 1, c1 1/3;
     * F1 c0 = 2*.6*1/1.6 = 0.75, c1 = 2*(1/3)/(4/3) = 0.5 */
    kiln_confusion c2;
    kiln_confusion_init(&c2, 2);
    const int64_t l2[] = {0, 0, 0, 1, 1, 1}, p2[] = {0, 0, 0, 0, 0, 1};
    for (int i = 0; i < 6; i++)
        kiln_confusion_add(&c2, l2[i], p2[i]);
    CHECK(fabs(kiln_confusion_precision(&c2) - 0.8) < 1e-12);
    CHECK(fabs(kiln_confusion_recall(&c2) - 2.0 / 3) < 1e-12);
    CHECK(fabs(kiln_confusion_f1(&c2) - 0.625) < 1e-12);
    const float logits[] = {0.1f, 0.5f, 0.2f, 0.9f, 0.0f, 0.3f, 0.2f, 0.1f};
    const int64_t tl[] = {2, 1};
    CHECK(kiln_topk_hits(logits, 2, 4, tl, 1) == 1); /* row 0: 0.2 is third; row 1: 0.3 is first */
    CHECK(kiln_topk_hits(logits, 2, 4, tl, 2) == 1);
    CHECK(kiln_topk_hits(logits, 2, 4, tl, 3) == 2);
    kiln_confusion_free(&cm);
    kiln_confusion_free(&c2);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/kiln-data-test-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    kiln_device *dev = kiln_device_open("cpu");
    test_idx();
    test_csv();
    test_transforms();
    test_loader(dev);
    test_metrics();
    kiln_device_close(dev);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    if (failures)
        fprintf(stderr, "%d checks failed\n", failures);
    return failures ? 1 : 0;
}
