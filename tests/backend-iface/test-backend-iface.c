/*
 * tests/backend-iface/test-backend-iface.c — the parts of the backend interface a new
 * backend leans on, checked through the counting decorator ("counting:SPEC"):
 *
 *  - decorators compose: counting:cpu and counting:ref compute what cpu and ref do;
 *  - one training step of the MLP and of the CNN of examples/fashion_mnist.c (same
 *    specs) reads the device once: the loss (index and target checks run on the device),
 *    and clipping by the global norm of all gradients reads once more, not once per tensor;
 *  - capabilities: a device told to refuse an entry or a dtype (hide=) either takes the
 *    documented fallback (softmax composed, same values) or fails with a message naming
 *    the op, the dtype and the device, and never crashes;
 *  - device options: "cpu?threads=2" works, a bad value or unknown key is refused with a
 *    message naming it;
 *  - queues and events: a tensor made on one thread's queue and used on another's is
 *    ordered by events (counted), and kiln_to_device between devices goes through
 *    host_alloc memory when no device-to-device copy exists.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/kiln.h"

static int failures, checks;

#define CHECK(cond, ...)                                                                                             \
    do {                                                                                                             \
        checks++;                                                                                                    \
        if (!(cond)) {                                                                                               \
            failures++;                                                                                              \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                        \
            fprintf(stderr, __VA_ARGS__);                                                                            \
            fprintf(stderr, " (last error: %s)\n", kiln_error());                                                    \
        }                                                                                                            \
    } while (0)

static const char MLP[] =
    "{\"inputs\": [\"x\"], \"nodes\": ["
    "{\"name\": \"flat\", \"op\": \"flatten\", \"start_dim\": 1, \"end_dim\": -1, \"inputs\": [\"x\"]},"
    "{\"name\": \"fc1\", \"layer\": \"Linear\", \"config\": {\"in_features\": 784, \"out_features\": 256}, "
    "\"inputs\": [\"flat\"]},"
    "{\"name\": \"a1\", \"op\": \"relu\", \"inputs\": [\"fc1\"]},"
    "{\"name\": \"fc2\", \"layer\": \"Linear\", \"config\": {\"in_features\": 256, \"out_features\": 128}, "
    "\"inputs\": [\"a1\"]},"
    "{\"name\": \"a2\", \"op\": \"relu\", \"inputs\": [\"fc2\"]},"
    "{\"name\": \"fc3\", \"layer\": \"Linear\", \"config\": {\"in_features\": 128, \"out_features\": 10}, "
    "\"inputs\": [\"a2\"]}"
    "], \"outputs\": [\"fc3\"]}";

static const char CNN[] =
    "{\"inputs\": [\"x\"], \"nodes\": ["
    "{\"name\": \"conv1\", \"layer\": \"Conv2d\", \"config\": {\"in_channels\": 1, \"out_channels\": 32, "
    "\"kernel_size\": 3, \"padding\": 1}, \"inputs\": [\"x\"]},"
    "{\"name\": \"bn1\", \"layer\": \"BatchNorm2d\", \"config\": {\"num_features\": 32}, \"inputs\": [\"conv1\"]},"
    "{\"name\": \"a1\", \"op\": \"relu\", \"inputs\": [\"bn1\"]},"
    "{\"name\": \"pool1\", \"layer\": \"MaxPool2d\", \"config\": {\"kernel_size\": 2}, \"inputs\": [\"a1\"]},"
    "{\"name\": \"conv2\", \"layer\": \"Conv2d\", \"config\": {\"in_channels\": 32, \"out_channels\": 64, "
    "\"kernel_size\": 3, \"padding\": 1}, \"inputs\": [\"pool1\"]},"
    "{\"name\": \"bn2\", \"layer\": \"BatchNorm2d\", \"config\": {\"num_features\": 64}, \"inputs\": [\"conv2\"]},"
    "{\"name\": \"a2\", \"op\": \"relu\", \"inputs\": [\"bn2\"]},"
    "{\"name\": \"pool2\", \"layer\": \"MaxPool2d\", \"config\": {\"kernel_size\": 2}, \"inputs\": [\"a2\"]},"
    "{\"name\": \"flat\", \"op\": \"flatten\", \"start_dim\": 1, \"end_dim\": -1, \"inputs\": [\"pool2\"]},"
    "{\"name\": \"fc1\", \"layer\": \"Linear\", \"config\": {\"in_features\": 3136, \"out_features\": 128}, "
    "\"inputs\": [\"flat\"]},"
    "{\"name\": \"a3\", \"op\": \"relu\", \"inputs\": [\"fc1\"]},"
    "{\"name\": \"fc2\", \"layer\": \"Linear\", \"config\": {\"in_features\": 128, \"out_features\": 10}, "
    "\"inputs\": [\"a3\"]}"
    "], \"outputs\": [\"fc2\"]}";

static kiln_device_counters counters(kiln_device *dev)
{
    kiln_device_counters c;
    memset(&c, 0, sizeof c);
    CHECK(kiln_device_counters_get(dev, &c, NULL, NULL) == 0, "counters of %s", kiln_device_name(dev));
    return c;
}

/* One step (upload a batch, forward, loss, backward, Adam, zero_grad, read the loss);
 * returns the loss and the host reads the step made. */
static double train_step(kiln_device *dev, kiln_module *m, kiln_optim *opt, int64_t batch, uint64_t *reads,
                         uint64_t *calls)
{
    float *x = malloc((size_t)batch * 784 * sizeof *x);
    int64_t *y = malloc((size_t)batch * sizeof *y);
    for (int64_t i = 0; i < batch * 784; i++)
        x[i] = (float)((i * 37 % 101) / 101.0 - 0.5);
    for (int64_t i = 0; i < batch; i++)
        y[i] = i % 10;
    kiln_device_counters before = counters(dev);
    kiln_scope_begin();
    kiln_tensor *xt = kiln_from_data(dev, KILN_F32, 4, (int64_t[]){batch, 1, 28, 28}, x, (size_t)batch * 784 * 4);
    kiln_tensor *yt = kiln_from_data(dev, KILN_I64, 1, (int64_t[]){batch}, y, (size_t)batch * 8);
    kiln_tensor *loss = kiln_loss_cross_entropy(kiln_module_forward(m, xt), yt, NULL);
    int rc = loss ? kiln_backward(loss, NULL) : -1;
    /* clipping by the global norm of every parameter's gradient: one read for all */
    kiln_device_counters pre = counters(dev);
    double norm = rc == 0 ? kiln_optim_clip_grad_norm(opt, 1e6, 2.0) : -1;
    kiln_device_counters post = counters(dev);
    CHECK(norm > 0 && post.downloads - pre.downloads == 1, "clip_grad_norm: norm %g, %llu reads", norm,
          (unsigned long long)(post.downloads - pre.downloads));
    if (rc == 0)
        rc = kiln_optim_step(opt) < 0 ? -1 : 0;
    kiln_optim_zero_grad(opt);
    double v = rc == 0 ? kiln_item(loss) : NAN;
    kiln_scope_end();
    kiln_device_counters after = counters(dev);
    *reads = after.downloads - before.downloads - (post.downloads - pre.downloads);
    *calls = after.calls - before.calls;
    free(x);
    free(y);
    return v;
}

static void step_reads(const char *spec, const char *model_json, const char *name)
{
    kiln_device *dev = kiln_device_open(spec);
    CHECK(dev != NULL, "open %s", spec);
    if (!dev)
        return;
    kiln_generator gen = kiln_generator_make(7);
    kiln_module *m = kiln_model_from_json(model_json, dev, &gen);
    CHECK(m != NULL, "%s model", name);
    kiln_optim_config cfg = kiln_optim_config_default(KILN_OPTIM_ADAM);
    kiln_optim *opt = m ? kiln_optim_create_module(&cfg, m) : NULL;
    CHECK(opt != NULL, "%s optimizer", name);
    if (m && opt) {
        kiln_module_train(m, true);
        uint64_t reads = 0, calls = 0;
        double l1 = train_step(dev, m, opt, 16, &reads, &calls);
        CHECK(isfinite(l1), "%s step 1 loss", name);
        CHECK(reads == 1, "%s on %s: one training step made %llu host reads, expected 1 (the loss)", name, spec,
              (unsigned long long)reads);
        CHECK(calls > 20, "%s on %s: the step reached the device through the decorator (%llu calls)", name, spec,
              (unsigned long long)calls);
        double l2 = train_step(dev, m, opt, 16, &reads, &calls);
        CHECK(reads == 1 && isfinite(l2) && l2 < l1, "%s on %s: second step: %llu reads, loss %g after %g", name, spec,
              (unsigned long long)reads, l2, l1);
    }
    kiln_optim_free(opt);
    kiln_module_free(m);
    kiln_device_close(dev);
}

/* counting:X computes what X computes: a few ops compared value for value. */
static void decorator_matches(const char *inner)
{
    char spec[64];
    snprintf(spec, sizeof spec, "counting:%s", inner);
    kiln_device *a = kiln_device_open(inner), *b = kiln_device_open(spec);
    CHECK(a && b, "open %s and %s", inner, spec);
    if (!a || !b)
        goto out;
    float x[24];
    for (int i = 0; i < 24; i++)
        x[i] = (float)(i % 7) - 2.5f;
    float ra[8], rb[8];
    kiln_tensor *r[2];
    kiln_device *devs[2] = {a, b};
    kiln_scope_begin();
    for (int k = 0; k < 2; k++) {
        kiln_tensor *t = kiln_from_data(devs[k], KILN_F32, 2, (int64_t[]){4, 6}, x, sizeof x);
        kiln_tensor *w = kiln_from_data(devs[k], KILN_F32, 2, (int64_t[]){6, 2}, x, 12 * sizeof(float));
        r[k] = kiln_softmax(kiln_matmul(kiln_tanh(t), w), -1);
    }
    CHECK(kiln_to_data(r[0], ra, sizeof ra) == 0 && kiln_to_data(r[1], rb, sizeof rb) == 0, "read back");
    CHECK(!memcmp(ra, rb, sizeof ra), "counting:%s differs from %s", inner, inner);
    uint64_t mm = 0;
    kiln_device_counters c;
    CHECK(kiln_device_counters_get(b, &c, "matmul", &mm) == 0 && mm == 1 && c.uploads == 2 && c.downloads == 1,
          "counting:%s counted %llu matmul, %llu uploads, %llu downloads", inner, (unsigned long long)mm,
          (unsigned long long)c.uploads, (unsigned long long)c.downloads);
    CHECK(kiln_device_counters_get(a, &c, NULL, NULL) < 0 && strstr(kiln_error(), "keeps no counters"),
          "a plain device has no counters");
    kiln_scope_end();
out:
    kiln_device_close(a);
    kiln_device_close(b);
}

/* A device that refuses an entry or a dtype: the fallback or a clear error. */
static void limited(void)
{
    kiln_device *full = kiln_device_open("ref");
    kiln_device *lim = kiln_device_open("counting:ref?hide=softmax,matmul,f16");
    CHECK(full && lim, "open the limited device");
    if (!full || !lim)
        goto out;
    CHECK(strcmp(kiln_device_name(lim), "counting:ref?hide=softmax,matmul,f16") == 0, "name %s",
          kiln_device_name(lim));
    kiln_scope_begin();
    float x[12];
    for (int i = 0; i < 12; i++)
        x[i] = (float)i * 0.25f - 1.0f;
    /* softmax has a documented fallback: the composed ops, with ref's values */
    kiln_tensor *s1 = kiln_softmax(kiln_from_data(full, KILN_F32, 2, (int64_t[]){3, 4}, x, sizeof x), 1);
    kiln_tensor *s2 = kiln_softmax(kiln_from_data(lim, KILN_F32, 2, (int64_t[]){3, 4}, x, sizeof x), 1);
    float a[12], b[12];
    CHECK(s1 && s2 && kiln_to_data(s1, a, sizeof a) == 0 && kiln_to_data(s2, b, sizeof b) == 0, "softmax both");
    double worst = 0;
    for (int i = 0; i < 12; i++)
        worst = fmax(worst, fabs((double)a[i] - b[i]));
    CHECK(worst < 1e-6, "composed softmax differs by %g", worst);
    uint64_t n = 0;
    kiln_device_counters c;
    CHECK(kiln_device_counters_get(lim, &c, "softmax", &n) == 0 && n == 0, "softmax entry called %llu times",
          (unsigned long long)n);
    /* matmul has none: an error naming op, entry, dtype and device */
    kiln_tensor *m = kiln_from_data(lim, KILN_F32, 2, (int64_t[]){3, 4}, x, sizeof x);
    kiln_tensor *mm = kiln_matmul(m, kiln_transpose(m, 0, 1));
    CHECK(mm == NULL && strstr(kiln_error(), "matmul") && strstr(kiln_error(), "f32") &&
              strstr(kiln_error(), "counting:ref"),
          "matmul on a device without it");
    /* a hidden dtype: the op fails naming it */
    kiln_tensor *h = kiln_cast(m, KILN_F16);
    kiln_tensor *e = h ? kiln_exp(h) : NULL;
    CHECK(e == NULL && strstr(kiln_error(), "f16"), "f16 on a device without it");
    /* entries without a fallback, refused through supports(): each names op and device */
    kiln_device *lim2 = kiln_device_open("counting:cpu?hide=gather,pool,conv_backward_weight,sort");
    kiln_tensor *src = lim2 ? kiln_from_data(lim2, KILN_F32, 2, (int64_t[]){3, 4}, x, sizeof x) : NULL;
    int64_t ix[2] = {0, 1};
    kiln_tensor *it = src ? kiln_from_data(lim2, KILN_I64, 2, (int64_t[]){1, 2}, ix, sizeof ix) : NULL;
    CHECK(it && kiln_gather(src, 1, it) == NULL && strstr(kiln_error(), "gather") &&
              strstr(kiln_error(), "counting:cpu"),
          "gather refused");
    kiln_tensor *sv = NULL, *si = NULL;
    CHECK(src && kiln_sort(src, 1, false, &sv, &si) < 0 && strstr(kiln_error(), "sort"), "sort refused");
    kiln_tensor *img = lim2 ? kiln_ones(lim2, KILN_F32, 4, (int64_t[]){1, 1, 4, 4}) : NULL;
    kiln_tensor *wt = lim2 ? kiln_ones(lim2, KILN_F32, 4, (int64_t[]){1, 1, 3, 3}) : NULL;
    kiln_requires_grad(wt, true);
    kiln_tensor *y = img && wt ? kiln_conv2d(img, wt, NULL, NULL) : NULL;
    CHECK(y != NULL, "conv forward is there");
    CHECK(y && kiln_backward(kiln_sum(y, KILN_ALL_DIMS, false), NULL) < 0 &&
              strstr(kiln_error(), "conv_backward_weight") && strstr(kiln_error(), "f32"),
          "conv's weight gradient refused, by name");
    kiln_scope_end();
    kiln_device_close(lim2);
    kiln_scope_begin();
out:
    kiln_device_close(full);
    kiln_device_close(lim);
}

static void options(void)
{
    kiln_device *d = kiln_device_open("cpu?threads=1&conv=direct");
    CHECK(d != NULL, "cpu with options");
    if (d)
        CHECK(strcmp(kiln_device_name(d), "cpu?conv=direct&threads=1") == 0, "canonical name %s", kiln_device_name(d));
    kiln_device *d2 = kiln_device_open_opts("cpu?conv=direct", "threads=1");
    CHECK(d2 == d, "the same options name the same device");
    kiln_device_close(d2);
    kiln_device_close(d);
    static const struct {
        const char *spec, *want1, *want2;
    } bad[] = {
        {"cpu?threads=zero", "threads", "zero"},
        {"cpu?threads=0", "threads", "'0'"},
        {"cpu?conv=packd", "conv", "packd"},
        {"cpu?spin_us=-1", "spin_us", "-1"},
        {"cpu?colour=blue", "unknown option 'colour'", "cpu"},
        {"ref?threads=2", "unknown option 'threads'", "ref"},
        {"cpu?threads", "threads", "no value"},
        {"counting:cpu?hide=nothing", "hide", "nothing"},
        {"counting:cpu?kernels=avx9", "kernels", "avx9"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kiln_error_clear();
        kiln_device *b = kiln_device_open(bad[i].spec);
        CHECK(b == NULL && strstr(kiln_error(), bad[i].want1) && strstr(kiln_error(), bad[i].want2),
              "bad spec %s", bad[i].spec);
        kiln_device_close(b);
    }
    /* the environment sets defaults; the message names the variable */
    setenv("KILN_CPU_THREADS", "many", 1);
    kiln_device *e = kiln_device_open("cpu?conv=auto");
    CHECK(e == NULL && strstr(kiln_error(), "KILN_CPU_THREADS") && strstr(kiln_error(), "many"), "env default");
    kiln_device *o = kiln_device_open("cpu?conv=auto&threads=1");
    CHECK(o != NULL, "the spec wins over the environment");
    kiln_device_close(o);
    /* a program's defaults (kilnd's device_options) beat the environment, lose to the spec */
    CHECK(kiln_device_defaults_set("cpu", "threads=zero") == 0, "set defaults");
    setenv("KILN_CPU_THREADS", "1", 1);
    kiln_device *p = kiln_device_open("cpu?conv=direct");
    CHECK(p == NULL && strstr(kiln_error(), "device_options") && strstr(kiln_error(), "zero"), "program defaults");
    p = kiln_device_open("cpu?conv=direct&threads=1");
    CHECK(p != NULL, "the spec wins over the program's defaults");
    kiln_device_close(p);
    CHECK(kiln_device_defaults_set("cpu", "threads") < 0 && strstr(kiln_error(), "no value"), "malformed defaults");
    CHECK(kiln_device_defaults_set("cpu", NULL) == 0, "clear defaults");
    p = kiln_device_open("cpu?conv=direct");
    CHECK(p != NULL, "cleared: the environment's threads=1 serves");
    kiln_device_close(p);
    unsetenv("KILN_CPU_THREADS");
}

/* Two threads, two queues on one device: the second uses what the first made. */
typedef struct shared {
    kiln_device *dev;
    kiln_tensor *made;
    float sum;
} shared;

static void *consumer(void *arg)
{
    shared *s = arg;
    kiln_queue *q = kiln_queue_open(s->dev);
    kiln_queue_use(s->dev, q);
    kiln_tensor *t = kiln_sum(s->made, KILN_ALL_DIMS, false);
    s->sum = t ? (float)kiln_item(t) : NAN;
    kiln_tensor_release(t);
    kiln_queue_close(q);
    return NULL;
}

static void queues(void)
{
    kiln_device *dev = kiln_device_open("counting:cpu");
    CHECK(dev != NULL, "open");
    if (!dev)
        return;
    kiln_queue *mine = kiln_queue_open(dev);
    CHECK(mine && kiln_queue_use(dev, mine) == NULL && kiln_queue_current(dev) == mine, "use a queue");
    shared s = {.dev = dev};
    s.made = kiln_full(dev, KILN_F32, 1, (int64_t[]){100}, 0.5);
    kiln_device_counters before = counters(dev);
    pthread_t th;
    pthread_create(&th, NULL, consumer, &s);
    pthread_join(th, NULL);
    kiln_device_counters after = counters(dev);
    CHECK(s.sum == 50.0f, "sum %g", s.sum);
    CHECK(after.event_waits > before.event_waits, "the other queue waited on an event (%llu waits)",
          (unsigned long long)(after.event_waits - before.event_waits));
    kiln_event *ev = kiln_event_record(mine);
    CHECK(ev && kiln_event_sync(ev) == 0 && kiln_event_query(ev) == 1, "event on cpu completes at once");
    kiln_event_free(ev);
    CHECK(kiln_queue_sync(mine) == 0 && kiln_device_sync(dev) == 0, "syncs");
    kiln_tensor_release(s.made);
    kiln_queue_use(dev, NULL);
    CHECK(kiln_queue_current(dev) != mine, "back to the default queue");
    kiln_queue_close(mine);

    /* bad calls: errors, no crash */
    kiln_device *other = kiln_device_open("ref");
    kiln_queue *oq = other ? kiln_queue_open(other) : NULL;
    kiln_error_clear();
    CHECK(oq && kiln_queue_use(dev, oq) == NULL && strstr(kiln_error(), "another device") &&
              kiln_queue_current(dev) != oq,
          "a queue of another device");
    CHECK(kiln_queue_sync(NULL) < 0 && kiln_event_record(NULL) == NULL && kiln_event_sync(NULL) < 0 &&
              kiln_event_query(NULL) < 0 && kiln_event_wait(NULL, NULL) < 0 && kiln_queue_open(NULL) == NULL &&
              kiln_host_alloc(NULL, 8) == NULL,
          "NULL arguments");
    kiln_queue_close(NULL);
    kiln_event_free(NULL);
    kiln_queue_close(oq);
    kiln_device_close(other);

    /* across devices: through host memory, values intact */
    kiln_device *ref = kiln_device_open("ref");
    kiln_tensor *a = kiln_arange(dev, KILN_F32, 0, 10, 1);
    kiln_tensor *b = a ? kiln_to_device(a, ref) : NULL;
    float v[10] = {0};
    CHECK(b && kiln_to_data(b, v, sizeof v) == 0 && v[9] == 9.0f && v[3] == 3.0f, "to_device");
    /* two devices of one backend without device-to-device copies: the fallback, counted */
    kiln_device *dst = kiln_device_open("counting:cpu?threads=1");
    kiln_device_counters d0 = dst ? counters(dst) : (kiln_device_counters){0};
    kiln_tensor *c = dst && a ? kiln_to_device(a, dst) : NULL;
    kiln_device_counters d1 = dst ? counters(dst) : (kiln_device_counters){0};
    float w[10] = {0};
    CHECK(c && kiln_to_data(c, w, sizeof w) == 0 && w[9] == 9.0f && d1.peer_copies == d0.peer_copies &&
              d1.uploads == d0.uploads + 1,
          "to_device between two counting:cpu devices: %llu peer copies, %llu uploads",
          (unsigned long long)(d1.peer_copies - d0.peer_copies), (unsigned long long)(d1.uploads - d0.uploads));
    kiln_tensor_release(c);
    kiln_device_close(dst);
    void *p = kiln_host_alloc(dev, 100);
    CHECK(p && ((uintptr_t)p & 63) == 0, "host_alloc is aligned");
    kiln_host_free(dev, p);
    kiln_tensor_release(a);
    kiln_tensor_release(b);
    kiln_device_close(ref);
    kiln_device_close(dev);
}

/* An index out of range: reported with the op's name, without a read to the host. */
static void index_checks(void)
{
    kiln_device *dev = kiln_device_open("counting:cpu");
    if (!dev)
        return;
    kiln_scope_begin();
    kiln_tensor *t = kiln_arange(dev, KILN_F32, 0, 6, 1);
    int64_t good[2] = {1, 5}, bad[2] = {1, 6};
    kiln_device_counters before = counters(dev);
    kiln_tensor *g = kiln_index_select(t, 0, kiln_from_data(dev, KILN_I64, 1, (int64_t[]){2}, good, sizeof good));
    kiln_tensor *x = kiln_index_select(t, 0, kiln_from_data(dev, KILN_I64, 1, (int64_t[]){2}, bad, sizeof bad));
    kiln_device_counters after = counters(dev);
    CHECK(g != NULL, "in range");
    CHECK(x == NULL && strstr(kiln_error(), "index_select: index 6 is out of bounds for size 6"), "out of range");
    CHECK(after.downloads == before.downloads, "the checks read nothing back (%llu reads)",
          (unsigned long long)(after.downloads - before.downloads));
    kiln_scope_end();
    kiln_device_close(dev);
}

/* An asynchronous device without index_check: the check is parked and read with the
 * next read, which fails naming the op; the op itself waits for nothing. */
static void deferred_checks(void)
{
    kiln_device *dev = kiln_device_open("counting:cpu?async=1&hide=index_check");
    CHECK(dev != NULL, "open");
    if (!dev)
        return;
    kiln_scope_begin();
    kiln_tensor *t = kiln_arange(dev, KILN_F32, 0, 6, 1);
    int64_t good[2] = {1, 5}, bad[3] = {0, 9, 2};
    kiln_tensor *ig = kiln_from_data(dev, KILN_I64, 1, (int64_t[]){2}, good, sizeof good);
    kiln_tensor *ib = kiln_from_data(dev, KILN_I64, 1, (int64_t[]){3}, bad, sizeof bad);
    kiln_device_counters c0 = counters(dev);
    kiln_tensor *g = kiln_index_select(t, 0, ig);
    kiln_tensor *h = kiln_one_hot(ib, 6, KILN_F32);
    kiln_device_counters c1 = counters(dev);
    CHECK(g && h && c1.downloads == c0.downloads, "the ops wait for nothing (%llu reads)",
          (unsigned long long)(c1.downloads - c0.downloads));
    float v[2] = {0};
    CHECK(kiln_to_data(g, v, sizeof v) < 0 && strstr(kiln_error(), "one_hot: index 9 is out of bounds for size 6"),
          "the next read reports the violation");
    kiln_device_counters c2 = counters(dev);
    CHECK(c2.downloads - c1.downloads == 1, "one read for the parked checks (%llu)",
          (unsigned long long)(c2.downloads - c1.downloads));
    /* what the queue wrote since it last drained cleanly may have used the bad op's result:
     * it stays unreadable (test-deferred-errors.c); the inputs, made from nothing, do not */
    CHECK(kiln_to_data(g, v, sizeof v) < 0 && strstr(kiln_error(), "lost to an earlier error"),
          "a value written in the failing stretch stays spoiled");
    kiln_tensor *g2 = kiln_index_select(t, 0, ig);
    CHECK(g2 && kiln_device_sync(dev) == 0, "a good index passes the sync");
    CHECK(kiln_to_data(g2, v, sizeof v) == 0 && v[0] == 1.0f && v[1] == 5.0f, "then reads go on");
    /* (one_hot, not a gather: the cpu kernels behind this pretend-async device are not
     * written to survive a bad index, as a real asynchronous backend's must be) */
    kiln_tensor *h2 = kiln_one_hot(ib, 4, KILN_F32);
    CHECK(h2 && kiln_device_sync(dev) < 0 && strstr(kiln_error(), "one_hot: index 9 is out of bounds for size 4"),
          "sync reports it too");
    kiln_scope_end();
    kiln_device_close(dev);
}

/* ------------------------------------------------------- device sync racing closes */

struct sync_race {
    kiln_device *dev;
    atomic_bool done;
    long closes, syncs, failures;
};

static void *open_use_close(void *arg)
{
    struct sync_race *r = arg;
    while (!atomic_load(&r->done)) {
        kiln_queue *q = kiln_queue_open(r->dev);
        if (!q) {
            r->failures++;
            break;
        }
        kiln_queue_use(r->dev, q);
        kiln_scope_begin();
        kiln_tensor *t = kiln_ones(r->dev, KILN_F32, KILN_SHAPE(16));
        if (!t || kiln_item(kiln_sum(t, KILN_ALL_DIMS, false)) != 16.0)
            r->failures++;
        kiln_scope_end();
        kiln_queue_close(q); /* on the thread that uses it: the default queue is current again */
        r->closes++;
    }
    return NULL;
}

static void *sync_all(void *arg)
{
    struct sync_race *r = arg;
    while (!atomic_load(&r->done)) {
        if (kiln_device_sync(r->dev) != 0)
            r->failures++;
        r->syncs++;
    }
    return NULL;
}

/* kiln_device_sync while another thread closes its own queue: the sync took a reference on a
 * queue whose last one was being dropped, closing and freeing it twice and releasing the device
 * once too often (glibc's "double free" abort within a second or two; the sanitizers at once). */
static void sync_races_close(const char *spec)
{
    struct sync_race r = {.dev = kiln_device_open(spec)};
    if (!r.dev) {
        printf("  %s: skipped (%s)\n", spec, kiln_error());
        return;
    }
    atomic_init(&r.done, false);
    pthread_t a, b;
    pthread_create(&a, NULL, open_use_close, &r);
    pthread_create(&b, NULL, sync_all, &r);
    struct timespec pause = {1, 500000000};
    nanosleep(&pause, NULL);
    atomic_store(&r.done, true);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    CHECK(r.failures == 0 && r.closes > 0 && r.syncs > 0, "%s: %ld queues closed, %ld syncs, %ld failures", spec,
          r.closes, r.syncs, r.failures);
    kiln_device_close(r.dev);
}

int main(void)
{
    decorator_matches("cpu");
    decorator_matches("ref");
    step_reads("counting:cpu", MLP, "MLP");
    step_reads("counting:cpu", CNN, "CNN");
    limited();
    options();
    queues();
    index_checks();
    deferred_checks();
    sync_races_close("fused:cpu");
    sync_races_close("vulkan:0");
    printf("backend-iface: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
