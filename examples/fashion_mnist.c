/*
 * examples/fashion_mnist.c — train an MLP or a small CNN on Fashion-MNIST with the
 * Learner, print per-epoch metrics, checkpoint every epoch, save the final model.
 *
 *     fashion_mnist mlp 10                  # MLP 784-256-128-10, Adam
 *     fashion_mnist cnn 8 --workers 2       # 2 conv + batch norm + 2 fc
 *     fashion_mnist cnn 8 --resume          # continue from fashion-out/checkpoints (--out DIR:
 *                                           # DIR/checkpoints)
 *     fashion_mnist mlp 1 --device remote://127.0.0.1:8080/cpu   # train inside a kilnd
 *     fashion_mnist cnn 3 --device vulkan:0 # on a GPU through Vulkan; same seed, same
 *                                           # batches: the loss and test accuracy match a
 *                                           # cpu run's (tests/vulkan-nn/fashion-cnn.py
 *                                           # checks a short run of it)
 *
 * Options: --data DIR (the IDX files; default $KILN_FASHION_MNIST or Debian's
 * dataset-fashion-mnist location), --out DIR (default fashion-out), --batch N (64),
 * --lr X (1e-3), --subset N (first N training images), --workers N (2), --device SPEC,
 * --resume, --json (one JSON line with the results on stdout at the end), --test-subset N (first N
 * test images), --print-losses (each step's training loss on stdout, all 17 digits, so two runs
 * can be compared exactly: a remote run's losses equal a local run's).
 *
 * Numbers are read whole: a value that is not a number, or is out of range (epochs, batch,
 * subsets at least 1; workers 0 to 256; lr a finite number above 0), prints the usage and
 * exits with status 2 before anything runs.
 *
 * The test set is the validation set, so "valid_accuracy" is the test accuracy.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "kiln/kiln.h"

static const char MLP[] =
    "{\"inputs\": [\"x\"], \"nodes\": ["
    "{\"name\": \"flat\", \"op\": \"flatten\", \"start_dim\": 1, \"end_dim\": -1, \"inputs\": [\"x\"]},"
    "{\"name\": \"fc1\", \"layer\": \"Linear\", \"config\": {\"in_features\": 784, \"out_features\": 256}, \"inputs\": [\"flat\"]},"
    "{\"name\": \"a1\", \"op\": \"relu\", \"inputs\": [\"fc1\"]},"
    "{\"name\": \"fc2\", \"layer\": \"Linear\", \"config\": {\"in_features\": 256, \"out_features\": 128}, \"inputs\": [\"a1\"]},"
    "{\"name\": \"a2\", \"op\": \"relu\", \"inputs\": [\"fc2\"]},"
    "{\"name\": \"fc3\", \"layer\": \"Linear\", \"config\": {\"in_features\": 128, \"out_features\": 10}, \"inputs\": [\"a2\"]}"
    "], \"outputs\": [\"fc3\"]}";

static const char CNN[] =
    "{\"inputs\": [\"x\"], \"nodes\": ["
    "{\"name\": \"conv1\", \"layer\": \"Conv2d\", \"config\": {\"in_channels\": 1, \"out_channels\": 32, \"kernel_size\": 3, \"padding\": 1}, \"inputs\": [\"x\"]},"
    "{\"name\": \"bn1\", \"layer\": \"BatchNorm2d\", \"config\": {\"num_features\": 32}, \"inputs\": [\"conv1\"]},"
    "{\"name\": \"a1\", \"op\": \"relu\", \"inputs\": [\"bn1\"]},"
    "{\"name\": \"pool1\", \"layer\": \"MaxPool2d\", \"config\": {\"kernel_size\": 2}, \"inputs\": [\"a1\"]},"
    "{\"name\": \"conv2\", \"layer\": \"Conv2d\", \"config\": {\"in_channels\": 32, \"out_channels\": 64, \"kernel_size\": 3, \"padding\": 1}, \"inputs\": [\"pool1\"]},"
    "{\"name\": \"bn2\", \"layer\": \"BatchNorm2d\", \"config\": {\"num_features\": 64}, \"inputs\": [\"conv2\"]},"
    "{\"name\": \"a2\", \"op\": \"relu\", \"inputs\": [\"bn2\"]},"
    "{\"name\": \"pool2\", \"layer\": \"MaxPool2d\", \"config\": {\"kernel_size\": 2}, \"inputs\": [\"a2\"]},"
    "{\"name\": \"flat\", \"op\": \"flatten\", \"start_dim\": 1, \"end_dim\": -1, \"inputs\": [\"pool2\"]},"
    "{\"name\": \"fc1\", \"layer\": \"Linear\", \"config\": {\"in_features\": 3136, \"out_features\": 128}, \"inputs\": [\"flat\"]},"
    "{\"name\": \"a3\", \"op\": \"relu\", \"inputs\": [\"fc1\"]},"
    "{\"name\": \"fc2\", \"layer\": \"Linear\", \"config\": {\"in_features\": 128, \"out_features\": 10}, \"inputs\": [\"a3\"]}"
    "], \"outputs\": [\"fc2\"]}";

/* --print-losses: one line per training step. */
static void print_loss(void *ud, const kiln_train_event *ev)
{
    if (ev->kind != KILN_EVENT_STEP)
        return;
    for (int i = 0; i < ev->n; i++)
        if (strcmp(ev->names[i], "loss") == 0)
            printf("step %lld loss %.17g\n", (long long)ev->step, ev->values[i]);
}

static kiln_dataset *load(const char *dir, const char *prefix, int64_t subset)
{
    char im[4096], lb[4096];
    snprintf(im, sizeof im, "%s/%s-images-idx3-ubyte.gz", dir, prefix);
    snprintf(lb, sizeof lb, "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
    kiln_dataset *raw = kiln_dataset_idx(im, lb);
    if (!raw)
        return NULL;
    /* Fashion-MNIST's training-set mean and standard deviation */
    kiln_dataset *ds = kiln_dataset_normalize(raw, 1, (const float[]){0.2860f}, (const float[]){0.3530f});
    kiln_dataset_free(raw);
    if (ds && subset > 0 && subset < kiln_dataset_length(ds)) {
        kiln_dataset *sub = kiln_dataset_range(ds, 0, subset);
        kiln_dataset_free(ds);
        ds = sub;
    }
    return ds;
}

static int usage(FILE *to, const char *prog)
{
    fprintf(to,
            "usage: %s mlp|cnn [epochs] [--data DIR] [--out DIR] [--batch N] [--lr X] "
            "[--subset N] [--test-subset N] [--workers N] [--device SPEC] [--resume] [--json] "
            "[--print-losses]\n",
            prog);
    return 2;
}

/* A whole decimal integer in [lo, hi] into *out; otherwise a message naming the option and
 * false. */
static bool parse_int(const char *opt, const char *text, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end || errno == ERANGE || v < lo || v > hi) {
        fprintf(stderr, "fashion_mnist: %s \"%s\" is not a whole number from %lld to %lld\n", opt, text,
                (long long)lo, (long long)hi);
        return false;
    }
    *out = v;
    return true;
}

/* A finite number above 0 (a learning rate) into *out; otherwise a message and false. */
static bool parse_positive(const char *opt, const char *text, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno == ERANGE || !isfinite(v) || !(v > 0)) {
        fprintf(stderr, "fashion_mnist: %s \"%s\" is not a finite number above 0\n", opt, text);
        return false;
    }
    *out = v;
    return true;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout, argv[0]);
            return 0;
        }
    const char *kind = argc > 1 ? argv[1] : "mlp";
    int64_t epochs = 10;
    if (argc > 2 && !parse_int("epochs", argv[2], 1, 1000000, &epochs))
        return usage(stderr, argv[0]);
    const char *env = getenv("KILN_FASHION_MNIST");
    const char *data = env ? env : "/usr/share/datasets/fashion-mnist";
    const char *out = "fashion-out", *devspec = "cpu";
    int64_t batch = 64, subset = 0, test_subset = 0;
    int64_t workers = 2;
    double lr = 1e-3;
    bool resume = false, json = false, print_losses = false;
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (!strcmp(a, "--resume"))
            resume = true;
        else if (!strcmp(a, "--json"))
            json = true;
        else if (!strcmp(a, "--print-losses"))
            print_losses = true;
        else if (v && !strcmp(a, "--test-subset") && ++i)
            ok = parse_int(a, v, 1, INT64_MAX, &test_subset);
        else if (v && !strcmp(a, "--data") && ++i)
            data = v;
        else if (v && !strcmp(a, "--out") && ++i)
            out = v;
        else if (v && !strcmp(a, "--batch") && ++i)
            ok = parse_int(a, v, 1, INT32_MAX, &batch);
        else if (v && !strcmp(a, "--subset") && ++i)
            ok = parse_int(a, v, 1, INT64_MAX, &subset);
        else if (v && !strcmp(a, "--workers") && ++i)
            ok = parse_int(a, v, 0, 256, &workers);
        else if (v && !strcmp(a, "--lr") && ++i)
            ok = parse_positive(a, v, &lr);
        else if (v && !strcmp(a, "--device") && ++i)
            devspec = v;
        else
            ok = false;
        if (!ok)
            return usage(stderr, argv[0]);
    }
    if (strcmp(kind, "mlp") != 0 && strcmp(kind, "cnn") != 0) {
        fprintf(stderr, "fashion_mnist: model \"%s\" must be mlp or cnn\n", kind);
        return usage(stderr, argv[0]);
    }
    kiln_device *dev = kiln_device_open(devspec);
    kiln_dataset *train = dev ? load(data, "train", subset) : NULL;
    kiln_dataset *test = train ? load(data, "t10k", test_subset) : NULL;
    if (!test) {
        fprintf(stderr, "fashion_mnist: %s\n", kiln_error());
        return 1;
    }
    kiln_generator gen = kiln_generator_make(42);
    kiln_module *model = kiln_model_from_json(strcmp(kind, "mlp") == 0 ? MLP : CNN, dev, &gen);
    kiln_optim_config oc = kiln_optim_config_default(KILN_OPTIM_ADAM);
    oc.lr = lr;
    kiln_optim *opt = model ? kiln_optim_create_module(&oc, model) : NULL;
    kiln_loader_config lc = kiln_loader_config_default();
    lc.batch_size = batch;
    lc.seed = 1234;
    lc.workers = (int)workers;
    kiln_loader *tl = opt ? kiln_loader_create(train, &lc, dev) : NULL;
    lc.shuffle = false;
    lc.batch_size = 500;
    kiln_loader *vl = tl ? kiln_loader_create(test, &lc, dev) : NULL;
    /* cosine decay over the whole run, per optimizer step */
    kiln_sched_config sc = kiln_sched_config_default(KILN_SCHED_COSINE);
    sc.t_max = epochs * (tl ? kiln_loader_batches(tl) : 1);
    kiln_sched *sched = vl ? kiln_sched_create(&sc, opt) : NULL;
    if (!sched) {
        fprintf(stderr, "fashion_mnist: %s\n", kiln_error());
        return 1;
    }
    mkdir(out, 0755);
    char ckdir[4200], model_path[4200], report_path[4200];
    snprintf(ckdir, sizeof ckdir, "%s/checkpoints", out);
    snprintf(model_path, sizeof model_path, "%s/%s.safetensors", out, kind);
    snprintf(report_path, sizeof report_path, "%s/report.json", out);
    kiln_learner_config cfg = kiln_learner_config_default();
    cfg.epochs = epochs;
    cfg.num_classes = 10;
    cfg.checkpoint_dir = ckdir;
    cfg.best_metric = "valid_accuracy";
    cfg.progress = stderr;
    kiln_learner *L = kiln_learner_create(&cfg, model, opt, sched, tl, vl);
    int rc = L ? 0 : -1;
    if (rc == 0 && print_losses)
        rc = kiln_learner_subscribe(L, print_loss, NULL);
    fprintf(stderr, "%s: %lld parameters, %lld training / %lld test images, batch %lld, %d workers, %s\n", kind,
            (long long)kiln_module_parameter_count(model, true), (long long)kiln_dataset_length(train),
            (long long)kiln_dataset_length(test), (long long)batch, (int)workers, kiln_device_name(dev));
    if (rc == 0 && resume) {
        rc = kiln_learner_resume(L, ckdir);
        if (rc == 0)
            fprintf(stderr, "resumed after epoch %lld (step %lld)\n", (long long)kiln_learner_epoch(L),
                    (long long)kiln_learner_step(L));
    }
    if (rc == 0)
        rc = kiln_learner_fit(L);
    if (rc == 0)
        rc = kiln_module_save_safetensors(model, model_path);
    if (rc == 0)
        rc = kiln_learner_write_report(L, report_path);
    if (rc == 0) {
        printf("%s: test accuracy %.4f after %lld epochs (%s); model %s, report %s\n", kind,
               kiln_learner_metric(L, "valid_accuracy"), (long long)kiln_learner_epoch(L),
               kiln_learner_stop_reason(L), model_path, report_path);
        if (json) {
            struct rusage ru;
            getrusage(RUSAGE_SELF, &ru);
            printf("{\"model\":\"%s\",\"epochs\":%lld,\"epoch_seconds\":%.4f,\"test_accuracy\":%.4f,"
                   "\"train_loss\":%.5f,\"peak_rss_mb\":%.1f}\n",
                   kind, (long long)kiln_learner_epoch(L), kiln_learner_metric(L, "epoch_seconds"),
                   kiln_learner_metric(L, "valid_accuracy"), kiln_learner_metric(L, "train_loss"),
                   (double)ru.ru_maxrss / 1024.0);
        }
    } else {
        fprintf(stderr, "fashion_mnist: %s\n", kiln_error());
    }
    kiln_learner_free(L);
    kiln_sched_free(sched);
    kiln_loader_free(vl);
    kiln_loader_free(tl);
    kiln_optim_free(opt);
    kiln_module_free(model);
    kiln_dataset_free(train);
    kiln_dataset_free(test);
    kiln_device_close(dev);
    return rc == 0 ? 0 : 1;
}
