/*
 * api/tensor.h — the remote tensor endpoint: GET /v1/tensor upgrades to a WebSocket carrying the
 * binary protocol of docs/remote-protocol.md, one session per connection.
 *
 * The loop thread authenticates the upgrade (the same bearer tokens as the HTTP API; the read
 * scope, which inference needs, is enough), enforces the session count, decodes each message's
 * header (a malformed one closes the connection) and queues the message on the session. A session
 * lives on one device worker of the scheduler (kiln_sched_task_submit): everything it queued since
 * its last hop runs there as one task, in order, against the session's own id table
 * (backends/remote/remote-exec.h), and the replies (reads, syncs, errors) come back through the loop. A
 * disconnect frees everything the session held, on its worker, once the task in flight is done.
 *
 * Thread affinity: everything here runs on the I/O loop thread.
 */
#ifndef KILN_API_TENSOR_H
#define KILN_API_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "config.h"
#include "metrics.h"
#include "router.h"
#include "scheduler.h"

struct kiln_tensor_options {
    struct kiln_sched *sched;                   /* borrowed */
    struct kiln_metrics *metrics;               /* borrowed */
    const struct kiln_strlist *tokens;          /* "admin:T", "read:T" or "T" (read) */
    const struct kiln_strlist *devices;         /* the devices sessions may name */
    struct kiln_config_remote limits;
    void (*log)(void *ud, enum kiln_log_level level, const char *msg);
    void *log_ud;
};

struct kiln_tensor_service;

struct kiln_tensor_service *kiln_tensor_new(const struct kiln_tensor_options *o, char *err, size_t errlen);
/* After every connection closed and the scheduler delivered its last completions. */
void kiln_tensor_free(struct kiln_tensor_service *ts);
/* While draining, new sessions are refused with 503. */
void kiln_tensor_set_accepting(struct kiln_tensor_service *ts, bool accepting);
size_t kiln_tensor_sessions(const struct kiln_tensor_service *ts);

/* Route handler for GET /v1/tensor; ctx is the service. */
int kiln_tensor_handle(void *ctx, const struct kiln_request *req, struct kiln_buf *out);

#endif /* KILN_API_TENSOR_H */
