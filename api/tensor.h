/*
 * api/tensor.h — the remote tensor endpoint: GET /v1/tensor upgrades to a WebSocket carrying the
 * binary protocol of docs/remote-protocol.md, one session per connection.
 *
 * The loop thread authenticates the upgrade (the same bearer tokens as the HTTP API; the read
 * scope, which inference needs, is enough), enforces the session count, decodes each message's
 * header (a malformed one closes the connection) and queues the message on the session. A session
 * lives on one device worker of the scheduler (kd_sched_task_submit): everything it queued since
 * its last hop runs there as one task, in order, against the session's own id table
 * (backends/remote/remote-exec.h), and the replies (reads, syncs, errors) come back through the loop. A
 * disconnect frees everything the session held, on its worker, once the task in flight is done.
 *
 * Thread affinity: everything here runs on the I/O loop thread.
 */
#ifndef KD_API_TENSOR_H
#define KD_API_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "buf.h"
#include "config.h"
#include "metrics.h"
#include "router.h"
#include "scheduler.h"

struct kd_tensor_service_options {
    struct kd_sched *sched;           /* borrowed */
    struct kd_metrics *metrics;       /* borrowed */
    const struct kd_strlist *tokens;  /* "admin:T", "read:T" or "T" (read) */
    const struct kd_strlist *devices; /* the configured devices (those without options are offered) */
    struct kd_config_remote limits;
    /* The loop that runs each waiting session's stall deadline (ws.h); NULL: no stall limit. */
    uv_loop_t *loop;
    /* A session whose client reads none of its replies this long is closed (0: never). */
    uint64_t stall_timeout_ms;
    void (*log)(void *ud, enum kd_log_level level, const char *msg);
    void *log_ud;
};

struct kd_tensor_service;

struct kd_tensor_service *kd_tensor_service_new(const struct kd_tensor_service_options *o, char *err,
                                                size_t errlen);
/* After every connection closed and the scheduler delivered its last completions. */
void kd_tensor_service_free(struct kd_tensor_service *ts);
/* While draining, new sessions are refused with 503. */
void kd_tensor_service_set_accepting(struct kd_tensor_service *ts, bool accepting);
size_t kd_tensor_service_sessions(const struct kd_tensor_service *ts);

/* Route handler for GET /v1/tensor; ctx is the service. */
int kd_tensor_service_handle(void *ctx, const struct kd_request *req, struct kd_buf *out);

#endif /* KD_API_TENSOR_H */
