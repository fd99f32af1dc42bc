/*
 * tests/training/test-learner.c — the Learner end to end.
 *
 *   resume:  two epochs on synthetic data with a checkpoint after epoch 1; a fresh
 *            learner (other initial weights) resumed from it must produce epoch 2's
 *            per-step losses bit for bit; the same from a mid-epoch step checkpoint.
 *   fashion: a 2,000-image Fashion-MNIST subset, one epoch of the MLP, test accuracy
 *            on 2,000 test images clearly above chance (skipped, exit 77, when the
 *            dataset-fashion-mnist package is absent).
 *
 *     test-learner resume | fashion
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/kiln.h"

static int failures;
#define CHECK(cond)                                                                                   \
    do {                                                                                              \
        if (!(cond)) {                                                                                \
            fprintf(stderr, "%s:%d: check failed: %s (%s)\n", __FILE__, __LINE__, #cond, kiln_error()); \
            failures++;                                                                               \
        }                                                                                             \
    } while (0)

static const char NET[] =
    "{\"inputs\": [\"x\"], \"nodes\": ["
    "{\"name\": \"fc1\", \"layer\": \"Linear\", \"config\": {\"in_features\": 8, \"out_features\": 16}, \"inputs\": [\"x\"]},"
    "{\"name\": \"bn\", \"layer\": \"BatchNorm1d\", \"config\": {\"num_features\": 16}, \"inputs\": [\"fc1\"]},"
    "{\"name\": \"a\", \"op\": \"relu\", \"inputs\": [\"bn\"]},"
    "{\"name\": \"fc2\", \"layer\": \"Linear\", \"config\": {\"in_features\": 16, \"out_features\": 3}, \"inputs\": [\"a\"]}"
    "], \"outputs\": [\"fc2\"]}";

typedef struct losses {
    double v[256];
    int64_t epoch[256];
    int n;
} losses;

static void record(void *ud, const kiln_train_event *ev)
{
    losses *l = ud;
    if (ev->kind == KILN_EVENT_STEP && l->n < 256 && strcmp(ev->names[0], "loss") == 0) {
        l->epoch[l->n] = ev->epoch;
        l->v[l->n++] = ev->values[0];
    }
}

typedef struct run_cfg {
    uint64_t init_seed;
    const char *ckdir;
    int64_t every_steps;
    const char *resume_from;
    int64_t cancel_after; /* steps; 0 = never */
} run_cfg;

typedef struct cancel_ctx {
    kiln_learner *L;
    int64_t after;
} cancel_ctx;

static void canceller(void *ud, const kiln_train_event *ev)
{
    cancel_ctx *c = ud;
    if (ev->kind == KILN_EVENT_STEP && c->after > 0 && ev->step >= c->after)
        kiln_learner_cancel(c->L);
}

/* Train NET on ds for 2 epochs (Adam, cosine per step, grad_accum 2); the per-step
 * losses go to out. */
static int run(kiln_device *dev, kiln_dataset *train, kiln_dataset *valid, const run_cfg *rc, losses *out)
{
    kiln_generator gen = kiln_generator_make(rc->init_seed);
    kiln_module *m = kiln_model_from_json(NET, dev, &gen);
    kiln_optim_config oc = kiln_optim_config_default(KILN_OPTIM_ADAM);
    oc.lr = 0.01;
    kiln_optim *opt = m ? kiln_optim_create_module(&oc, m) : NULL;
    kiln_loader_config lc = kiln_loader_config_default();
    lc.batch_size = 10;
    lc.seed = 77;
    lc.workers = 2;
    kiln_loader *tl = kiln_loader_create(train, &lc, dev);
    lc.shuffle = false;
    kiln_loader *vl = kiln_loader_create(valid, &lc, dev);
    kiln_sched_config sc = kiln_sched_config_default(KILN_SCHED_COSINE);
    sc.t_max = 20;
    kiln_sched *sched = opt ? kiln_sched_create(&sc, opt) : NULL;
    kiln_learner_config cfg = kiln_learner_config_default();
    cfg.epochs = 2;
    cfg.num_classes = 3;
    cfg.topk = 2;
    cfg.grad_accum = 2;
    cfg.checkpoint_dir = rc->ckdir;
    cfg.checkpoint_every_steps = rc->every_steps;
    cfg.keep_last = 10;
    cfg.best_metric = "valid_accuracy";
    kiln_learner *L = sched && tl && vl ? kiln_learner_create(&cfg, m, opt, sched, tl, vl) : NULL;
    cancel_ctx cc = {L, rc->cancel_after};
    int r = L ? 0 : -1;
    if (r == 0)
        r = kiln_learner_subscribe(L, record, out);
    if (r == 0)
        r = kiln_learner_subscribe(L, canceller, &cc);
    if (r == 0 && rc->resume_from)
        r = kiln_learner_resume(L, rc->resume_from);
    if (r == 0)
        r = kiln_learner_fit(L);
    if (r == 0 && !rc->cancel_after) {
        CHECK(strcmp(kiln_learner_stop_reason(L), "completed") == 0);
        char *rep = kiln_learner_report_json(L);
        CHECK(rep && strstr(rep, "\"valid_confusion\"") && strstr(rep, "\"best\"") && strstr(rep, "valid_f1"));
        free(rep);
    }
    kiln_learner_free(L);
    kiln_sched_free(sched);
    kiln_loader_free(tl);
    kiln_loader_free(vl);
    kiln_optim_free(opt);
    kiln_module_free(m);
    return r;
}

static int test_resume(void)
{
    kiln_device *dev = kiln_device_open("cpu");
    enum { N = 100 };
    float x[N * 8];
    int64_t y[N];
    kiln_generator g = kiln_generator_make(3);
    kiln_tensor *r = kiln_rand_normal(dev, KILN_F32, KILN_SHAPE(N, 8), 0, 1, &g);
    kiln_to_data(r, x, sizeof x);
    kiln_tensor_release(r);
    for (int i = 0; i < N; i++)
        y[i] = (x[i * 8] + x[i * 8 + 1] > 0.5f) + (x[i * 8 + 2] > 0);
    kiln_dataset *ds = kiln_dataset_from_arrays(N, 1, (int64_t[]){8}, x, y, 3, NULL, 0);
    kiln_dataset *train, *valid;
    CHECK(kiln_dataset_split(ds, 0.2, 1, &train, &valid) == 0);

    char root[] = "/tmp/kiln-learner-test-XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    char a_dir[300], b_dir[300], c_dir[300];
    snprintf(a_dir, sizeof a_dir, "%s/a", root);
    snprintf(b_dir, sizeof b_dir, "%s/b", root);
    snprintf(c_dir, sizeof c_dir, "%s/c", root);

    /* uninterrupted, checkpointing every epoch (8 batches, 4 updates per epoch) */
    losses full = {0};
    run_cfg ra = {.init_seed = 11, .ckdir = a_dir};
    CHECK(run(dev, train, valid, &ra, &full) == 0);
    CHECK(full.n == 16);
    /* resume from the epoch-1 checkpoint (step 4) with a model initialized differently */
    char ck1[400];
    snprintf(ck1, sizeof ck1, "%s/step-%09d", a_dir, 4);
    losses resumed = {0};
    run_cfg rb = {.init_seed = 999, .ckdir = b_dir, .resume_from = ck1};
    CHECK(run(dev, train, valid, &rb, &resumed) == 0);
    CHECK(resumed.n == 8);
    int same = 0;
    for (int i = 0; i < resumed.n && i + 8 < full.n; i++)
        same += memcmp(&resumed.v[i], &full.v[i + 8], sizeof(double)) == 0 && resumed.epoch[i] == 2;
    CHECK(same == 8);
    if (same != 8)
        for (int i = 0; i < resumed.n; i++)
            fprintf(stderr, "  step %d: uninterrupted %.17g resumed %.17g\n", i, full.v[i + 8], resumed.v[i]);

    /* cancelled mid-epoch after a step checkpoint (every 3 updates: step 6 = batch 12 of
     * 16), then resumed from that root: the remaining steps repeat the uninterrupted run */
    losses part = {0}, rest = {0};
    run_cfg rc1 = {.init_seed = 11, .ckdir = c_dir, .every_steps = 3, .cancel_after = 6};
    CHECK(run(dev, train, valid, &rc1, &part) == 0);
    CHECK(part.n == 12);
    run_cfg rc2 = {.init_seed = 5, .ckdir = c_dir, .every_steps = 3, .resume_from = c_dir};
    CHECK(run(dev, train, valid, &rc2, &rest) == 0);
    CHECK(rest.n == 4);
    int same2 = 0;
    for (int i = 0; i < rest.n; i++)
        same2 += memcmp(&rest.v[i], &full.v[12 + i], sizeof(double)) == 0;
    CHECK(same2 == 4);

    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
    kiln_dataset_free(train);
    kiln_dataset_free(valid);
    kiln_dataset_free(ds);
    kiln_device_close(dev);
    return failures ? 1 : 0;
}

static int test_fashion(void)
{
    const char *env = getenv("KILN_FASHION_MNIST");
    const char *dir = env ? env : "/usr/share/datasets/fashion-mnist";
    char im[512], lb[512], tim[512], tlb[512];
    snprintf(im, sizeof im, "%s/train-images-idx3-ubyte.gz", dir);
    snprintf(lb, sizeof lb, "%s/train-labels-idx1-ubyte.gz", dir);
    snprintf(tim, sizeof tim, "%s/t10k-images-idx3-ubyte.gz", dir);
    snprintf(tlb, sizeof tlb, "%s/t10k-labels-idx1-ubyte.gz", dir);
    if (access(im, R_OK) != 0 || access(tim, R_OK) != 0) {
        printf("skipped: Fashion-MNIST not found in %s (install dataset-fashion-mnist)\n", dir);
        return 77;
    }
    kiln_device *dev = kiln_device_open("cpu");
    kiln_dataset *all = kiln_dataset_idx(im, lb), *tall = kiln_dataset_idx(tim, tlb);
    kiln_dataset *train = all ? kiln_dataset_range(all, 0, 2000) : NULL;
    kiln_dataset *test = tall ? kiln_dataset_range(tall, 0, 2000) : NULL;
    CHECK(train && test);
    static const char MLP[] =
        "{\"inputs\": [\"x\"], \"nodes\": ["
        "{\"name\": \"flat\", \"op\": \"flatten\", \"start_dim\": 1, \"end_dim\": -1, \"inputs\": [\"x\"]},"
        "{\"name\": \"fc1\", \"layer\": \"Linear\", \"config\": {\"in_features\": 784, \"out_features\": 256}, \"inputs\": [\"flat\"]},"
        "{\"name\": \"a1\", \"op\": \"relu\", \"inputs\": [\"fc1\"]},"
        "{\"name\": \"fc2\", \"layer\": \"Linear\", \"config\": {\"in_features\": 256, \"out_features\": 128}, \"inputs\": [\"a1\"]},"
        "{\"name\": \"a2\", \"op\": \"relu\", \"inputs\": [\"fc2\"]},"
        "{\"name\": \"fc3\", \"layer\": \"Linear\", \"config\": {\"in_features\": 128, \"out_features\": 10}, \"inputs\": [\"a2\"]}"
        "], \"outputs\": [\"fc3\"]}";
    kiln_generator gen = kiln_generator_make(1);
    kiln_module *m = kiln_model_from_json(MLP, dev, &gen);
    kiln_optim_config oc = kiln_optim_config_default(KILN_OPTIM_ADAM);
    kiln_optim *opt = m ? kiln_optim_create_module(&oc, m) : NULL;
    kiln_loader_config lc = kiln_loader_config_default();
    lc.batch_size = 32;
    lc.workers = 2;
    kiln_loader *tl = train ? kiln_loader_create(train, &lc, dev) : NULL;
    lc.shuffle = false;
    lc.batch_size = 250;
    kiln_loader *vl = test ? kiln_loader_create(test, &lc, dev) : NULL;
    kiln_learner_config cfg = kiln_learner_config_default();
    cfg.num_classes = 10;
    kiln_learner *L = opt && tl && vl ? kiln_learner_create(&cfg, m, opt, NULL, tl, vl) : NULL;
    CHECK(L && kiln_learner_fit(L) == 0);
    double acc = kiln_learner_metric(L, "valid_accuracy");
    printf("Fashion-MNIST MLP, 2000 images, 1 epoch: test accuracy %.4f, %.0f items/s\n", acc,
           kiln_learner_metric(L, "items_per_sec"));
    CHECK(acc > 0.6);
    kiln_learner_free(L);
    kiln_loader_free(tl);
    kiln_loader_free(vl);
    kiln_optim_free(opt);
    kiln_module_free(m);
    kiln_dataset_free(train);
    kiln_dataset_free(test);
    kiln_dataset_free(all);
    kiln_dataset_free(tall);
    kiln_device_close(dev);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "fashion") == 0)
        return test_fashion();
    return test_resume();
}
