/*
 * tests/storage/crash_writer.c — the victim of the crash tests: writes checkpoints (or job
 * store rows) in an endless loop until test_crash kills it with SIGKILL at a random instant.
 *
 *   crash_writer ckpt <root>   checkpoints with ~3 MB of tensors whose values encode the step
 *   crash_writer jobs <db>     jobs, events and metrics, one transaction each
 *
 * After each write returns success it prints one acknowledgement line to stdout with
 * write(2), so the driver knows exactly what was reported durable before the kill.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/kiln.h"
#include "kiln/record.h"
#include "jobstore.h"

#define CRASH_ROWS 512
#define CRASH_COLS 512

static void ack(const char *fmt, int64_t a, int64_t b)
{
    char line[64];
    int n = snprintf(line, sizeof line, fmt, a, b);
    if (write(1, line, (size_t)n) != n)
        exit(3);
}

static int run_ckpt(const char *root)
{
    kiln_device *dev = kiln_device_open("cpu");
    if (!dev)
        return 2;
    kiln_ckpt *last = kiln_ckpt_open_latest(root, NULL, NULL);
    int64_t step = last ? kiln_ckpt_step(last) : 0;
    kiln_ckpt_close(last);
    for (;;) {
        step++;
        kiln_scope_begin();
        /* w = step everywhere; v = i + step; m = -step: a torn mix of two saves would show. */
        kiln_tensor *w = kiln_full(dev, KILN_F32, KILN_SHAPE(CRASH_ROWS, CRASH_COLS), (double)step);
        kiln_tensor *v = kiln_add_scalar(kiln_arange(dev, KILN_F32, 0, CRASH_ROWS * CRASH_COLS, 1), (double)step);
        kiln_tensor *m = kiln_full(dev, KILN_F32, KILN_SHAPE(CRASH_ROWS, CRASH_COLS), -(double)step);
        const char *mn[] = {"w", "v"}, *on[] = {"m"};
        kiln_tensor *mt[] = {w, v};
        kiln_generator g = {.seed = (uint64_t)step, .offset = (uint64_t)step * 3};
        const char *metric_names[] = {"acc"};
        double metric_values[] = {(double)(step % 7)};
        char config[64];
        snprintf(config, sizeof config, "{\"step\": %" PRId64 "}", step);
        kiln_ckpt_state s = {
            .step = step, .epoch = step / 10,
            .model_n = 2, .model_names = mn, .model_tensors = mt, .model_config = config,
            .optim_n = 1, .optim_names = on, .optim_tensors = &m,
            .rng_n = 1, .rng = &g,
            .metric_n = 1, .metric_names = metric_names, .metric_values = metric_values,
            .record_flags = step % 2 ? KILN_RECORD_ZSTD : 0,
        };
        int rc = kiln_ckpt_save(root, &s, NULL, 0);
        kiln_scope_end();
        if (rc != 0) {
            fprintf(stderr, "crash_writer: save %" PRId64 ": %s\n", step, kiln_error());
            return 2;
        }
        ack("%" PRId64 " %" PRId64 "\n", step, 0);
        kiln_ckpt_retention keep = {.keep_last = 3, .best_metric = "acc", .best_max = true};
        if (kiln_ckpt_retain(root, &keep, NULL) != 0) {
            fprintf(stderr, "crash_writer: retain: %s\n", kiln_error());
            return 2;
        }
    }
}

static int run_jobs(const char *db)
{
    struct kd_jobstore *js;
    char err[256];
    if (kd_jobstore_open(&js, db, err, sizeof err) != 0) {
        fprintf(stderr, "crash_writer: %s\n", err);
        return 2;
    }
    for (int64_t i = 0;; i++) {
        char spec[96];
        snprintf(spec, sizeof spec, "{\"n\": %" PRId64 ", \"pad\": \"%040d\"}", i, 7);
        int64_t id;
        if (kd_jobstore_job_create(js, spec, "crash", &id, err, sizeof err) != 0)
            break;
        ack("J %" PRId64 " %" PRId64 "\n", id, i);
        for (int e = 0; e < 3; e++) {
            char payload[64];
            snprintf(payload, sizeof payload, "{\"e\": %d, \"job\": %" PRId64 "}", e, id);
            int64_t seq;
            if (kd_jobstore_event_append(js, id, "progress", payload, &seq, err, sizeof err) != 0)
                goto fail;
            ack("E %" PRId64 " %" PRId64 "\n", id, seq);
        }
        struct kd_job_metric m[2] = {{.step = i, .epoch = 0, .name = "loss", .value = (double)i},
                                     {.step = i, .epoch = 0, .name = "acc", .value = (double)-i}};
        if (kd_jobstore_metrics_append(js, id, 2, m, err, sizeof err) != 0)
            goto fail;
        ack("M %" PRId64 " %" PRId64 "\n", id, i);
        if (kd_jobstore_job_set_state(js, id, "succeeded", NULL, err, sizeof err) != 0)
            goto fail;
        ack("S %" PRId64 " %" PRId64 "\n", id, i);
    }
fail:
    fprintf(stderr, "crash_writer: %s\n", err);
    kd_jobstore_close(js);
    return 2;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: crash_writer ckpt|jobs PATH\n");
        return 1;
    }
    /* The parent's kill delay starts here, not at fork: loading the shared libraries (the
     * GPU toolkits' among them) takes longer than many of the delays. */
    if (write(1, "started\n", 8) != 8)
        return 3;
    if (strcmp(argv[1], "ckpt") == 0)
        return run_ckpt(argv[2]);
    if (strcmp(argv[1], "jobs") == 0)
        return run_jobs(argv[2]);
    return 1;
}
