/*
 * bench/engine/vulkan-gpu.c — kiln's figures on a GPU's vulkan:0 for the bench/gpu/vulkan_*
 * entries, which put them beside the device's own copy bandwidth or PyTorch on CUDA measured in
 * the same run.
 *
 *     vulkan-gpu elementwise            add and gelu on 256 MiB f32, and a 256 MiB copy
 *     vulkan-gpu matmul N               N x N x N f32
 *     vulkan-gpu onnx MODEL.onnx BATCH  one inference of an image model (3 x 224 x 224 input)
 *     vulkan-gpu cnn-step [BATCH]       one Fashion-MNIST CNN training step (Adam)
 *
 * Prints one JSON object per figure on stdout: {"name", "ms" (median), plus "gbps" or
 * "tflops" where they apply}. Exits 77 with a line on stderr, printing nothing, when no GPU
 * Vulkan device exists: vulkan:0 does not open, or the loader's first physical device (the
 * one vulkan:0 names) is a CPU implementation such as lavapipe, whose figures say nothing
 * about a GPU. KILN_BENCH_ANY_VULKAN=1
 * measures such a device anyway (to check the entry itself). Every figure is taken after
 * warm-up, each repetition in its own scope (buffers come back to the pool) and ending with
 * a device sync; KILN_BENCH_SECONDS (default 2) bounds the time per figure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <vulkan/vulkan.h>

#include "kiln/kiln.h"
#include "kiln/loss.h"

static kiln_device *g_dev;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void die(const char *what)
{
    fprintf(stderr, "vulkan-gpu: %s: %s\n", what, kiln_error());
    exit(1);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef int (*work_fn)(void *ud);

/* Median ms of fn over repetitions after 3 warm-ups, bounded by KILN_BENCH_SECONDS. */
static double time_median(work_fn fn, void *ud)
{
    const char *env = getenv("KILN_BENCH_SECONDS");
    double budget = (env ? atof(env) : 2.0) * 1e3, t[200];
    int n = 0;
    for (int i = 0; i < 3; i++)
        if (fn(ud) != 0 || kiln_device_sync(g_dev) != 0)
            die("warm-up");
    double start = now_ms();
    while (n < 200 && (n < 5 || now_ms() - start < budget)) {
        double t0 = now_ms();
        if (fn(ud) != 0 || kiln_device_sync(g_dev) != 0)
            die("run");
        t[n++] = now_ms() - t0;
    }
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return t[n / 2];
}

/* ------------------------------------------------------------ elementwise */

typedef struct ew {
    kiln_tensor *a, *b;
    int kind; /* 0 copy, 1 add, 2 gelu */
} ew;

static int ew_run(void *ud)
{
    ew *e = ud;
    kiln_scope_begin();
    kiln_tensor *r = e->kind == 0   ? kiln_clone(e->a)
                     : e->kind == 1 ? kiln_add(e->a, e->b)
                                    : kiln_gelu(e->a, false);
    kiln_scope_end();
    return r ? 0 : -1;
}

static void bench_elementwise(void)
{
    const int64_t n = (int64_t)256 * 1024 * 1024 / 4;
    kiln_generator g = kiln_generator_make(1);
    ew e = {kiln_rand_uniform(g_dev, KILN_F32, KILN_SHAPE(n), -2, 2, &g),
            kiln_rand_uniform(g_dev, KILN_F32, KILN_SHAPE(n), -2, 2, &g), 0};
    if (!e.a || !e.b)
        die("inputs");
    static const char *names[3] = {"copy_256MiB_f32", "add_256MiB_f32", "gelu_256MiB_f32"};
    static const double moved[3] = {2, 3, 2}; /* bytes read + written, in 256 MiB units */
    for (int k = 0; k < 3; k++) {
        e.kind = k;
        double ms = time_median(ew_run, &e);
        printf("{\"name\": \"%s\", \"ms\": %.4f, \"gbps\": %.2f}\n", names[k], ms,
               moved[k] * (double)n * 4 / (ms * 1e-3) / 1e9);
        fflush(stdout);
    }
    kiln_tensor_release(e.a);
    kiln_tensor_release(e.b);
}

/* ------------------------------------------------------------ matmul */

typedef struct mm {
    kiln_tensor *a, *b;
} mm;

static int mm_run(void *ud)
{
    mm *m = ud;
    kiln_scope_begin();
    kiln_tensor *r = kiln_matmul(m->a, m->b);
    kiln_scope_end();
    return r ? 0 : -1;
}

static void bench_matmul(int64_t n)
{
    kiln_generator g = kiln_generator_make(2);
    mm m = {kiln_rand_uniform(g_dev, KILN_F32, KILN_SHAPE(n, n), -1, 1, &g),
            kiln_rand_uniform(g_dev, KILN_F32, KILN_SHAPE(n, n), -1, 1, &g)};
    if (!m.a || !m.b)
        die("inputs");
    double ms = time_median(mm_run, &m);
    printf("{\"name\": \"matmul_%lld_f32\", \"ms\": %.4f, \"tflops\": %.3f}\n", (long long)n, ms,
           2.0 * (double)n * (double)n * (double)n / (ms * 1e-3) / 1e12);
    kiln_tensor_release(m.a);
    kiln_tensor_release(m.b);
}

/* ------------------------------------------------------------ onnx */

typedef struct onnx_run {
    kiln_onnx_model *m;
    const char *name;
    kiln_tensor *x;
} onnx_run;

static int onnx_once(void *ud)
{
    onnx_run *o = ud;
    kiln_tensor *out[1] = {NULL};
    int rc = kiln_onnx_run(o->m, 1, &o->name, &o->x, 1, out);
    kiln_tensor_release(out[0]);
    return rc;
}

static void bench_onnx(const char *path, int64_t batch)
{
    kiln_onnx_model *m = kiln_onnx_load(path, g_dev, NULL);
    if (!m)
        die("load the model");
    kiln_generator g = kiln_generator_make(3);
    onnx_run o = {m, kiln_onnx_input_name(m, 0),
                  kiln_rand_uniform(g_dev, KILN_F32, KILN_SHAPE(batch, 3, 224, 224), 0, 1, &g)};
    if (!o.x)
        die("input");
    kiln_no_grad_begin();
    double ms = time_median(onnx_once, &o);
    kiln_no_grad_end();
    const char *base = strrchr(path, '/');
    printf("{\"name\": \"%s_b%lld_f32\", \"ms\": %.4f}\n", base ? base + 1 : path, (long long)batch, ms);
    kiln_tensor_release(o.x);
    kiln_onnx_free(m);
}

/* ------------------------------------------------------------ CNN training step */

static const char cnn_spec[] =
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
    "\"inputs\": [\"a3\"]}], \"outputs\": [\"fc2\"]}";

typedef struct step {
    kiln_module *model;
    kiln_optim *opt;
    kiln_tensor *x, *y;
} step;

static int step_once(void *ud)
{
    step *s = ud;
    kiln_scope_begin();
    kiln_tensor *loss = kiln_loss_cross_entropy(kiln_module_forward(s->model, s->x), s->y, NULL);
    int rc = loss ? kiln_backward(loss, NULL) : -1;
    if (rc == 0 && kiln_optim_step(s->opt) < 0)
        rc = -1;
    kiln_optim_zero_grad(s->opt);
    if (rc == 0)
        (void)kiln_item(loss); /* a training loop reads its loss once per step */
    kiln_scope_end();
    return rc;
}

static void bench_cnn_step(int64_t batch)
{
    kiln_generator g = kiln_generator_make(4);
    step s = {kiln_model_from_json(cnn_spec, g_dev, &g), NULL, NULL, NULL};
    if (!s.model)
        die("build the model");
    kiln_optim_config oc = kiln_optim_config_default(KILN_OPTIM_ADAM);
    s.opt = kiln_optim_create_module(&oc, s.model);
    s.x = kiln_rand_normal(g_dev, KILN_F32, KILN_SHAPE(batch, 1, 28, 28), 0, 1, &g);
    s.y = kiln_rand_int(g_dev, KILN_I64, KILN_SHAPE(batch), 0, 10, &g);
    if (!s.opt || !s.x || !s.y)
        die("optimizer and inputs");
    double ms = time_median(step_once, &s);
    printf("{\"name\": \"fashion_cnn_train_step_b%lld_f32\", \"ms\": %.4f}\n", (long long)batch, ms);
    kiln_tensor_release(s.x);
    kiln_tensor_release(s.y);
    kiln_optim_free(s.opt);
    kiln_module_free(s.model);
}

/* The type and name of the loader's first physical device, asked of Vulkan itself: the
 * public kiln API names a device by its spec only. false when none can be listed. */
static bool first_device(VkPhysicalDeviceType *type, char *name, size_t len)
{
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .apiVersion = VK_API_VERSION_1_1};
    VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    VkInstance inst;
    if (vkCreateInstance(&ci, NULL, &inst) != VK_SUCCESS)
        return false;
    uint32_t n = 1;
    VkPhysicalDevice phys;
    VkResult r = vkEnumeratePhysicalDevices(inst, &n, &phys);
    bool ok = (r == VK_SUCCESS || r == VK_INCOMPLETE) && n >= 1;
    if (ok) {
        VkPhysicalDeviceProperties props;
        vkGetPhysicalDeviceProperties(phys, &props);
        *type = props.deviceType;
        snprintf(name, len, "%s", props.deviceName);
    }
    vkDestroyInstance(inst, NULL);
    return ok;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s elementwise | matmul N | onnx MODEL.onnx BATCH | cnn-step [BATCH]\n", argv[0]);
        return 2;
    }
    g_dev = kiln_device_open("vulkan:0");
    if (!g_dev) {
        fprintf(stderr, "vulkan-gpu: skipped: vulkan:0 does not open (%s)\n", kiln_error());
        return 77;
    }
    VkPhysicalDeviceType type = VK_PHYSICAL_DEVICE_TYPE_OTHER;
    char name[VK_MAX_PHYSICAL_DEVICE_NAME_SIZE] = "?";
    const char *any = getenv("KILN_BENCH_ANY_VULKAN");
    if (first_device(&type, name, sizeof name) && type == VK_PHYSICAL_DEVICE_TYPE_CPU &&
        !(any && !strcmp(any, "1"))) {
        fprintf(stderr, "vulkan-gpu: skipped: vulkan:0 is a CPU implementation (%s), not a GPU\n", name);
        kiln_device_close(g_dev);
        return 77;
    }
    fprintf(stderr, "vulkan-gpu: %s on %s\n", argv[1], name);
    if (!strcmp(argv[1], "elementwise"))
        bench_elementwise();
    else if (!strcmp(argv[1], "matmul") && argc > 2)
        bench_matmul(atoll(argv[2]));
    else if (!strcmp(argv[1], "onnx") && argc > 3)
        bench_onnx(argv[2], atoll(argv[3]));
    else if (!strcmp(argv[1], "cnn-step"))
        bench_cnn_step(argc > 2 ? atoll(argv[2]) : 64);
    else {
        fprintf(stderr, "vulkan-gpu: unknown mode %s\n", argv[1]);
        return 2;
    }
    kiln_device_close(g_dev);
    return 0;
}
