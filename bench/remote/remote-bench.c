/*
 * bench/remote/remote-bench.c — the remote backend on loopback, each figure beside a peer
 * measured in the same run (bench/remote/remote.bench starts the kilnd and passes its spec):
 *
 *   - pipelined small ops: N adds of two 16-element f32 tensors, then one sync, from one client;
 *     ops per second on remote://.../cpu beside the same ops on local cpu;
 *   - read round trip: reading a 16-element tensor back (one DOWNLOAD, one DATA), p50 and p99,
 *     beside a 64-byte ping-pong over a loopback TCP connection with Nagle off (the floor any
 *     request/answer over the same socket path pays);
 *   - a training step of the Fashion-MNIST MLP (784-256-128-10, batch 64, Adam, cross-entropy,
 *     the loss read back every step as a training loop does) remote beside local.
 *
 *     remote-bench remote://127.0.0.1:PORT/cpu
 *
 * Prints bench/run's JSON lines on stdout.
 */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kiln/kiln.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void die(const char *what)
{
    fprintf(stderr, "remote-bench: %s: %s\n", what, kiln_error());
    exit(1);
}

/* ---- pipelined adds ----------------------------------------------------------------------------- */

static double adds_per_second(kiln_device *d, int n)
{
    kiln_tensor *a = kiln_full(d, KILN_F32, KILN_SHAPE(16), 1.0);
    kiln_tensor *b = kiln_full(d, KILN_F32, KILN_SHAPE(16), 2.0);
    if (!a || !b || kiln_device_sync(d) != 0)
        die("setup");
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_s();
        for (int i = 0; i < n; i++) {
            kiln_tensor *c = kiln_add(a, b);
            if (!c)
                die("add");
            kiln_tensor_release(c);
        }
        if (kiln_device_sync(d) != 0)
            die("sync");
        double rate = n / (now_s() - t0);
        if (rate > best)
            best = rate;
    }
    kiln_tensor_release(a);
    kiln_tensor_release(b);
    return best;
}

/* ---- read round trips --------------------------------------------------------------------------- */

static void read_latency(kiln_device *d, int n, double *p50, double *p99)
{
    kiln_tensor *a = kiln_full(d, KILN_F32, KILN_SHAPE(16), 3.0);
    float v[16];
    double *t = malloc((size_t)n * sizeof *t);
    for (int i = 0; i < 50; i++) /* warm up */
        if (kiln_to_data(a, v, sizeof v) != 0)
            die("read");
    for (int i = 0; i < n; i++) {
        double t0 = now_s();
        if (kiln_to_data(a, v, sizeof v) != 0)
            die("read");
        t[i] = (now_s() - t0) * 1e6;
    }
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    *p50 = t[n / 2];
    *p99 = t[n * 99 / 100];
    free(t);
    kiln_tensor_release(a);
}

static void *echo_thread(void *arg)
{
    int fd = accept(*(int *)arg, NULL, NULL);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char buf[64];
    for (;;) {
        size_t got = 0;
        while (got < sizeof buf) {
            ssize_t r = read(fd, buf + got, sizeof buf - got);
            if (r <= 0) {
                close(fd);
                return NULL;
            }
            got += (size_t)r;
        }
        if (write(fd, buf, sizeof buf) != (ssize_t)sizeof buf)
            break;
    }
    close(fd);
    return NULL;
}

/* 64 bytes there and back over loopback TCP, between two threads of this process. */
static void tcp_latency(int n, double *p50, double *p99)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(ls, 1) != 0 ||
        getsockname(ls, (struct sockaddr *)&sa, &sl) != 0) {
        fprintf(stderr, "remote-bench: loopback socket failed\n");
        exit(1);
    }
    pthread_t th;
    pthread_create(&th, NULL, echo_thread, &ls);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        fprintf(stderr, "remote-bench: loopback connect failed\n");
        exit(1);
    }
    double *t = malloc((size_t)n * sizeof *t);
    char buf[64] = {0};
    for (int i = -50; i < n; i++) {
        double t0 = now_s();
        if (write(fd, buf, sizeof buf) != (ssize_t)sizeof buf)
            break;
        size_t got = 0;
        while (got < sizeof buf) {
            ssize_t r = read(fd, buf + got, sizeof buf - got);
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        if (i >= 0)
            t[i] = (now_s() - t0) * 1e6;
    }
    close(fd);
    pthread_join(th, NULL);
    close(ls);
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    *p50 = t[n / 2];
    *p99 = t[n * 99 / 100];
    free(t);
}

/* ---- MLP training step -------------------------------------------------------------------------- */

static const char MLP[] =
    "{\"inputs\": [\"x\"], \"nodes\": ["
    "{\"name\": \"flat\", \"op\": \"flatten\", \"start_dim\": 1, \"end_dim\": -1, \"inputs\": [\"x\"]},"
    "{\"name\": \"fc1\", \"layer\": \"Linear\", \"config\": {\"in_features\": 784, \"out_features\": 256}, \"inputs\": [\"flat\"]},"
    "{\"name\": \"a1\", \"op\": \"relu\", \"inputs\": [\"fc1\"]},"
    "{\"name\": \"fc2\", \"layer\": \"Linear\", \"config\": {\"in_features\": 256, \"out_features\": 128}, \"inputs\": [\"a1\"]},"
    "{\"name\": \"a2\", \"op\": \"relu\", \"inputs\": [\"fc2\"]},"
    "{\"name\": \"fc3\", \"layer\": \"Linear\", \"config\": {\"in_features\": 128, \"out_features\": 10}, \"inputs\": [\"a2\"]}"
    "], \"outputs\": [\"fc3\"]}";

/* Milliseconds per step (the median of `steps` steps after a warm-up); *loss gets the last loss. */
static double mlp_step_ms(kiln_device *d, int steps, double *loss)
{
    kiln_generator gen = kiln_generator_make(42);
    kiln_module *model = kiln_model_from_json(MLP, d, &gen);
    kiln_optim_config oc = kiln_optim_config_default(KILN_OPTIM_ADAM);
    kiln_optim *opt = model ? kiln_optim_create_module(&oc, model) : NULL;
    if (!opt)
        die("model");
    /* one synthetic batch per step, drawn on the host as a data loader would hand it over */
    enum { B = 64 };
    float *x = malloc(sizeof(float) * B * 784);
    int64_t y[B];
    uint64_t s = 7;
    double *t = malloc((size_t)steps * sizeof *t);
    for (int i = -5; i < steps; i++) {
        for (int k = 0; k < B * 784; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            x[k] = (float)((s >> 40) % 1000) / 500.0f - 1.0f;
        }
        for (int k = 0; k < B; k++)
            y[k] = (int64_t)((s >> (k % 50)) % 10);
        double t0 = now_s();
        kiln_scope_begin();
        kiln_tensor *xt = kiln_from_data(d, KILN_F32, KILN_SHAPE(B, 1, 28, 28), x, sizeof(float) * B * 784);
        kiln_tensor *yt = kiln_from_data(d, KILN_I64, KILN_SHAPE(B), y, sizeof y);
        kiln_loss_ce_opts o = kiln_loss_ce_opts_default();
        kiln_tensor *l = kiln_loss_cross_entropy(kiln_module_forward(model, xt), yt, &o);
        kiln_optim_zero_grad(opt);
        if (kiln_backward(l, NULL) != 0 || kiln_optim_step(opt) < 0)
            die("step");
        *loss = kiln_item(l);
        kiln_scope_end();
        if (i >= 0)
            t[i] = (now_s() - t0) * 1e3;
    }
    qsort(t, (size_t)steps, sizeof *t, cmp_double);
    double med = t[steps / 2];
    free(t);
    free(x);
    kiln_optim_free(opt);
    kiln_module_free(model);
    return med;
}

static void row(const char *name, const char *unit, double kiln, double peer, const char *peer_name, double ratio,
                double target)
{
    printf("{\"name\": \"%s\", \"unit\": \"%s\", \"kiln\": %.4g, \"peer\": %.4g, \"peer_name\": \"%s\", "
           "\"ratio\": %.4g",
           name, unit, kiln, peer, peer_name, ratio);
    if (target > 0)
        printf(", \"target\": %.4g", target);
    printf("}\n");
    fflush(stdout);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: remote-bench remote://HOST:PORT/cpu\n");
        return 2;
    }
    kiln_device *local = kiln_device_open("cpu");
    kiln_device *remote = kiln_device_open(argv[1]);
    if (!local || !remote)
        die("open");

    fprintf(stderr, "remote-bench: pipelined adds...\n");
    double r_ops = adds_per_second(remote, 100000), l_ops = adds_per_second(local, 100000);
    row("pipelined add, 16 f32, ops/s", "ops/s", r_ops, l_ops, "local cpu, same ops", r_ops / l_ops, 0);

    fprintf(stderr, "remote-bench: read round trips...\n");
    double p50, p99, t50, t99;
    read_latency(remote, 5000, &p50, &p99);
    tcp_latency(5000, &t50, &t99);
    row("read 16 f32 round trip p50", "us", p50, t50, "64-byte TCP ping-pong, loopback", t50 / p50, 0);
    row("read 16 f32 round trip p99", "us", p99, t99, "64-byte TCP ping-pong, loopback", t99 / p99, 0);

    fprintf(stderr, "remote-bench: MLP training steps...\n");
    double rl = 0, ll = 0;
    double r_ms = mlp_step_ms(remote, 60, &rl), l_ms = mlp_step_ms(local, 60, &ll);
    if (rl != ll) {
        fprintf(stderr, "remote-bench: the remote loss %.17g differs from the local %.17g\n", rl, ll);
        return 1;
    }
    row("Fashion-MNIST MLP train step, batch 64", "ms", r_ms, l_ms, "local cpu, same step", l_ms / r_ms, 0);
    kiln_device_close(remote);
    kiln_device_close(local);
    return 0;
}
