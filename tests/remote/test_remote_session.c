/*
 * tests/remote/test_remote_session.c — what the remote backend makes of a session's settings
 * (suite 'remote').
 *
 *     test_remote_session KILND secrets|limits|checks|timeouts
 *
 * secrets: a bearer token given in the spec never shows in the device's name nor in a message
 * (a refused open, tensors on two devices), while two tokens still make two sessions and the
 * same token one.
 * limits: the session's max_live_bytes and max_ids, known from WELCOME, refuse an allocation at
 * once, naming its size and the limit; freed buffers make room again, and nothing is left to fail
 * on the server at a later read.
 * checks: an index out of range is reported by the next sync under the engine's op (embedding,
 * one_hot, gather), not under the primitive it was lowered to, and the session goes on; more checks
 * between two reads than the device keeps slots for.
 * timeouts: a server that never answers; the message names where the timeout was set.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kiln/kiln.h"
#include "test_remote_client_daemon.h"

static const char *g_kilnd;
static int g_failed;

#define CHECK(cond, ...)                                                                                          \
    do {                                                                                                          \
        if (!(cond)) {                                                                                            \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                       \
            fprintf(stderr, __VA_ARGS__);                                                                         \
            fprintf(stderr, "\n");                                                                                \
            g_failed++;                                                                                           \
        }                                                                                                         \
    } while (0)

static bool has(const char *s, const char *needle)
{
    return s && strstr(s, needle) != NULL;
}

/* The sum of four ones computed on dev, read back: the session works. */
static double sum_of_ones(kiln_device *dev)
{
    kiln_tensor *t = kiln_ones(dev, KILN_F32, KILN_SHAPE(4));
    kiln_tensor *s = kiln_sum(t, KILN_ALL_DIMS, false);
    double v = s ? kiln_item(s) : -1.0;
    kiln_tensor_release(s);
    kiln_tensor_release(t);
    return v;
}

/* ---- secrets -------------------------------------------------------------------------------------- */

static int test_secrets(void)
{
    unsetenv("KILN_TOKEN");
    unsetenv("KILN_REMOTE_TOKEN");
    const char *env[] = {"KILN_API_TOKENS=read:first-s3cret,read:second-s3cret", NULL};
    test_daemon dm;
    if (test_daemon_start(&dm, g_kilnd, NULL, env) != 0)
        return 1;
    char spec[200], masked[200];
    snprintf(masked, sizeof masked, "%s?token=***", dm.spec);

    snprintf(spec, sizeof spec, "%s?token=WRONGsecret99", dm.spec);
    kiln_device *wrong = kiln_device_open(spec);
    CHECK(!wrong && has(kiln_error(), "401") && has(kiln_error(), masked) && !has(kiln_error(), "WRONGsecret99"),
          "wrong token: %s", wrong ? "opened" : kiln_error());
    printf("wrong token: %s\n", kiln_error());

    snprintf(spec, sizeof spec, "%s?token=first-s3cret", dm.spec);
    kiln_device *first = kiln_device_open(spec);
    CHECK(first && !strcmp(kiln_device_name(first), masked), "first: %s",
          first ? kiln_device_name(first) : kiln_error());
    CHECK(kiln_device_open(spec) == first, "the same spec and token share the device");
    kiln_device_close(first);

    snprintf(spec, sizeof spec, "%s?token=second-s3cret", dm.spec);
    kiln_device *second = kiln_device_open(spec);
    CHECK(second && second != first, "another token is another session: %s", second ? "shared" : kiln_error());
    CHECK(second && !strcmp(kiln_device_name(second), masked), "second: %s",
          second ? kiln_device_name(second) : kiln_error());
    CHECK(kiln_device_open_opts(dm.spec, "token=second-s3cret") == second, "the token given apart: same device");
    kiln_device_close(second);
    CHECK(second && sum_of_ones(second) == 4.0, "the second session computes: %s", kiln_error());

    /* a message naming the device, as a log would carry it */
    kiln_device *cpu = kiln_device_open("cpu");
    kiln_tensor *a = first ? kiln_ones(first, KILN_F32, KILN_SHAPE(2)) : NULL;
    kiln_tensor *b = kiln_ones(cpu, KILN_F32, KILN_SHAPE(2));
    kiln_tensor *sum = kiln_add(a, b);
    CHECK(a && !sum && has(kiln_error(), "different devices") && has(kiln_error(), masked) &&
              !has(kiln_error(), "s3cret"),
          "mixed devices: %s", kiln_error());
    printf("mixed devices: %s\n", kiln_error());
    kiln_tensor_release(a);
    kiln_tensor_release(b);

    /* a token from the environment is not part of the name at all */
    setenv("KILN_REMOTE_TOKEN", "first-s3cret", 1);
    kiln_device *from_env = kiln_device_open(dm.spec);
    CHECK(from_env && !strcmp(kiln_device_name(from_env), dm.spec), "token from the environment: %s",
          from_env ? kiln_device_name(from_env) : kiln_error());
    unsetenv("KILN_REMOTE_TOKEN");
    kiln_device_close(from_env);

    kiln_device_close(cpu);
    kiln_device_close(second);
    kiln_device_close(first);
    test_daemon_stop(&dm);
    return g_failed ? 1 : 0;
}

/* ---- limits --------------------------------------------------------------------------------------- */

static int test_limits(void)
{
    const char *flags[] = {"--remote-max-live-bytes", "1000000", "--remote-max-ids", "8", NULL};
    test_daemon dm;
    if (test_daemon_start(&dm, g_kilnd, flags, NULL) != 0)
        return 1;
    kiln_device *d = kiln_device_open(dm.spec);
    CHECK(d, "open: %s", kiln_error());
    if (!d) {
        test_daemon_stop(&dm);
        return 1;
    }
    /* 4 TB: no tensor handed back, the size and the server's limit named */
    kiln_tensor *huge = kiln_zeros(d, KILN_U8, KILN_SHAPE(4LL << 40));
    CHECK(!huge && has(kiln_error(), "zeros: cannot allocate") &&
              has(kiln_error(),
                  "4398046511104 bytes is more than the server lets a session hold (1000000 bytes, its "
                  "remote.max_live_bytes)"),
          "4 TB: %s", huge ? "allocated" : kiln_error());
    printf("4 TB: %s\n", kiln_error());

    /* two that fit alone but not together: the second is refused at once */
    kiln_tensor *a = kiln_zeros(d, KILN_U8, KILN_SHAPE(600000));
    CHECK(a, "600 kB: %s", kiln_error());
    kiln_tensor *b = kiln_zeros(d, KILN_U8, KILN_SHAPE(600000));
    CHECK(!b && has(kiln_error(), "600000 bytes more would take the session past the 1000000 bytes") &&
              has(kiln_error(), "600000 in use"),
          "the second 600 kB: %s", b ? "allocated" : kiln_error());
    printf("past the limit: %s\n", kiln_error());
    /* freeing the first makes room */
    kiln_tensor_release(a);
    b = kiln_full(d, KILN_U8, KILN_SHAPE(600000), 3.0);
    CHECK(b, "after a free: %s", kiln_error());
    uint8_t last = 0;
    kiln_tensor *tail = kiln_slice(b, 0, 599999, 600000, 1);
    CHECK(tail && kiln_to_data(tail, &last, 1) == 0 && last == 3, "read back: %s, %u", kiln_error(), last);
    kiln_tensor_release(tail);
    kiln_tensor_release(b);

    /* ids: eight buffers at once, a ninth is refused at once */
    kiln_tensor *held[9] = {0};
    int made = 0;
    for (int i = 0; i < 9; i++) {
        held[i] = kiln_full(d, KILN_F32, KILN_SHAPE(4), (double)i);
        made += held[i] != NULL;
    }
    CHECK(made == 8 && !held[8] &&
              has(kiln_error(), "the session holds 8 buffers, the most the server allows (8, its "
                                "remote.max_ids)"),
          "ids: %d made, %s", made, kiln_error());
    printf("past max_ids: %s\n", kiln_error());
    float v[4] = {0};
    CHECK(held[7] && kiln_to_data(held[7], v, sizeof v) == 0 && v[0] == 7.0f && v[3] == 7.0f, "the eighth: %s, %g",
          kiln_error(), v[0]);
    for (int i = 0; i < 9; i++)
        kiln_tensor_release(held[i]);
    /* nothing was left to fail on the server */
    CHECK(kiln_device_sync(d) == 0, "sync: %s", kiln_error());
    CHECK(sum_of_ones(d) == 4.0, "after the limits: %s", kiln_error());

    /* an operand with more elements than the session's bytes (a broadcast view) */
    kiln_tensor *one = kiln_ones(d, KILN_F32, KILN_SHAPE(1));
    kiln_tensor *wide = kiln_expand(one, KILN_SHAPE(2000000));
    kiln_tensor *total = kiln_sum(wide, KILN_ALL_DIMS, false);
    CHECK(!total && has(kiln_error(), "more elements than the server lets an operand have (1000000"),
          "a 2M-element operand: %s", total ? "queued" : kiln_error());
    printf("wide operand: %s\n", kiln_error());
    kiln_tensor_release(wide);
    kiln_tensor_release(one);
    CHECK(kiln_device_sync(d) == 0, "sync: %s", kiln_error());

    kiln_device_close(d);
    test_daemon_stop(&dm);
    return g_failed ? 1 : 0;
}

/* ---- checks --------------------------------------------------------------------------------------- */

static kiln_tensor *indices(kiln_device *dev, int64_t n, const int64_t *vals)
{
    return kiln_from_data(dev, KILN_I64, KILN_SHAPE(n), vals, (size_t)n * sizeof *vals);
}

/* Runs one bad indexing call on d; the sync after it must fail naming want, not avoid. */
static void expect_sync_error(kiln_device *d, kiln_tensor *out, const char *want, const char *avoid)
{
    CHECK(out, "%s is queued without waiting: %s", want, kiln_error());
    int rc = kiln_device_sync(d);
    CHECK(rc != 0 && has(kiln_error(), want) && !has(kiln_error(), avoid), "%s: rc %d, %s", want, rc,
          kiln_error());
    printf("%s\n", kiln_error());
    kiln_tensor_release(out);
    CHECK(kiln_device_sync(d) == 0, "reported once: %s", kiln_error());
}

static int test_checks(void)
{
    test_daemon dm;
    if (test_daemon_start(&dm, g_kilnd, NULL, NULL) != 0)
        return 1;
    kiln_device *d = kiln_device_open(dm.spec);
    CHECK(d, "open: %s", kiln_error());
    if (!d) {
        test_daemon_stop(&dm);
        return 1;
    }
    static const float rows[] = {1, 2, 3, 4, 5, 6};
    kiln_tensor *weight = kiln_from_data(d, KILN_F32, KILN_SHAPE(3, 2), rows, sizeof rows);
    static const int64_t good[] = {2, 0}, bad[] = {1, 9};
    kiln_tensor *ok = indices(d, 2, good), *nine = indices(d, 2, bad);

    /* embedding runs index_select on the device: the error names embedding all the same */
    expect_sync_error(d, kiln_embedding(weight, nine), "embedding: index 9 is out of bounds for size 3",
                      "index_select");
    expect_sync_error(d, kiln_one_hot(nine, 4, KILN_I64), "one_hot: index 9 is out of bounds for size 4", "equal");
    expect_sync_error(d, kiln_index_select(weight, 0, nine), "index_select: index 9 is out of bounds for size 3",
                      "bad range");

    /* the session goes on: a good lookup reads back its rows */
    kiln_tensor *looked = kiln_embedding(weight, ok);
    float v[4] = {0};
    CHECK(looked && kiln_to_data(looked, v, sizeof v) == 0 && v[0] == 5 && v[1] == 6 && v[2] == 1 && v[3] == 2,
          "a good lookup: %s, %g %g %g %g", kiln_error(), v[0], v[1], v[2], v[3]);
    kiln_tensor_release(looked);

    /* more checks between two reads than the device keeps slots for (256): the first violation,
     * made after 600 good lookups, is still the one reported */
    for (int i = 0; i < 600; i++)
        kiln_tensor_release(kiln_embedding(weight, ok));
    kiln_tensor *first_bad = kiln_embedding(weight, nine);
    static const int64_t minus[] = {-1};
    kiln_tensor *neg = kiln_from_data(d, KILN_I64, KILN_SHAPE(1, 1), minus, sizeof minus);
    kiln_tensor *second_bad = kiln_gather(weight, 0, neg);
    expect_sync_error(d, first_bad, "embedding: index 9 is out of bounds for size 3", "gather");
    kiln_tensor_release(second_bad);
    kiln_tensor_release(neg);

    kiln_tensor_release(ok);
    kiln_tensor_release(nine);
    kiln_tensor_release(weight);
    kiln_device_close(d);
    test_daemon_stop(&dm);
    return g_failed ? 1 : 0;
}

/* ---- timeouts ------------------------------------------------------------------------------------- */

/* A TCP port that accepts connections (the kernel completes them) and never answers. */
static int silent_listener(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 8) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        perror("listener");
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

/* One connection answered as a web server that is not kilnd answers /v1/tensor: a 404 page. */
static void *not_kilnd(void *arg)
{
    int fd = *(int *)arg;
    int c = accept(fd, NULL, NULL);
    if (c < 0)
        return NULL;
    char req[2048];
    (void)!read(c, req, sizeof req);
    static const char page[] =
        "<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n<center><h1>404 Not "
        "Found</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n";
    char resp[512];
    int n = snprintf(resp, sizeof resp,
                     "HTTP/1.1 404 Not Found\r\nContent-Type: text/html\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(page), page);
    (void)!write(c, resp, (size_t)n);
    close(c);
    return NULL;
}

static int test_timeouts(void)
{
    {
        int port = 0, lfd = silent_listener(&port);
        if (lfd < 0)
            return 1;
        pthread_t t;
        pthread_create(&t, NULL, not_kilnd, &lfd);
        char spec[96];
        snprintf(spec, sizeof spec, "remote://127.0.0.1:%d/cpu?timeout_ms=5000", port);
        kiln_device *d = kiln_device_open(spec);
        CHECK(!d && has(kiln_error(), "HTTP 404: 404 Not Found (is it a kilnd? it has no /v1/tensor)") &&
                  !has(kiln_error(), "<") && !has(kiln_error(), "\n"),
              "a web server that is not kilnd: %s", d ? "opened" : kiln_error());
        printf("not a kilnd: %s\n", kiln_error());
        pthread_join(t, NULL);
        close(lfd);
    }

    int port = 0;
    int fd = silent_listener(&port);
    if (fd < 0)
        return 1;
    unsetenv("KILN_REMOTE_TIMEOUT_MS");
    char spec[160];
    snprintf(spec, sizeof spec, "remote://127.0.0.1:%d/cpu?timeout_ms=200&token=t0ps3cret", port);
    kiln_device *d = kiln_device_open(spec);
    CHECK(!d && has(kiln_error(), "within 200 ms (timeout_ms from the spec)") &&
              !has(kiln_error(), "KILN_REMOTE_TIMEOUT_MS") && !has(kiln_error(), "t0ps3cret"),
          "from the spec: %s", d ? "opened" : kiln_error());
    printf("from the spec: %s\n", kiln_error());

    snprintf(spec, sizeof spec, "remote://127.0.0.1:%d/cpu", port);
    d = kiln_device_open_opts(spec, "timeout_ms=150");
    CHECK(!d && has(kiln_error(), "within 150 ms (timeout_ms from the options)"), "from the options: %s",
          d ? "opened" : kiln_error());

    setenv("KILN_REMOTE_TIMEOUT_MS", "100", 1);
    d = kiln_device_open(spec);
    CHECK(!d && has(kiln_error(), "within 100 ms (timeout_ms from KILN_REMOTE_TIMEOUT_MS)"),
          "from the environment: %s", d ? "opened" : kiln_error());
    printf("from the environment: %s\n", kiln_error());
    unsetenv("KILN_REMOTE_TIMEOUT_MS");

    CHECK(kiln_device_defaults_set("remote", "timeout_ms=120") == 0, "defaults: %s", kiln_error());
    d = kiln_device_open(spec);
    CHECK(!d && has(kiln_error(), "within 120 ms (timeout_ms from device_options)"), "from device_options: %s",
          d ? "opened" : kiln_error());
    kiln_device_defaults_set("remote", NULL);
    close(fd);
    return g_failed ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s KILND secrets|limits|checks|timeouts\n", argv[0]);
        return 2;
    }
    g_kilnd = argv[1];
    const char *what = argv[2];
    int rc = !strcmp(what, "secrets")    ? test_secrets()
             : !strcmp(what, "limits")   ? test_limits()
             : !strcmp(what, "checks")   ? test_checks()
             : !strcmp(what, "timeouts") ? test_timeouts()
                                         : 2;
    if (rc == 0)
        printf("%s: all passed\n", what);
    return rc;
}
