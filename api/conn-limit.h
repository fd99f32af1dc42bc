/*
 * api/conn-limit.h — one bound on the client connections kilnd holds open, HTTP and gRPC counted
 * together (limits.max_connections), so that a flood of connections cannot take every file
 * descriptor the process has, and the models, the job store and the log keep theirs.
 *
 * Each listener's owner asks kd_conn_limit_admit for every connection it accepts. Within the
 * limit the connection is served and counted until it closes. Past it the connection is refused
 * in the listener's own protocol (HTTP: 503 with Retry-After; gRPC: GOAWAY ENHANCE_YOUR_CALM),
 * which takes a moment: the answer is written, the write side shut, and what the client still
 * sends is read and dropped briefly so that closing does not reset the connection before the
 * client has read why. At most KD_CONN_REFUSING_MAX refusals are under way at once; a
 * connection past that is closed at once, unanswered, so refusing costs a bounded number of
 * descriptors too. A run of refusals is logged once, when it starts (naming the listener), and
 * once more when a connection closes and makes room, with the count and how long it lasted
 * (naming neither: the limit is both listeners'); /metrics counts each in
 * kiln_connections_refused_total{listener}.
 *
 * Thread affinity: the loop thread (both listeners run on the daemon's one loop), so the counts
 * need no lock. The struct is plain data its owner (the daemon) holds; nothing here is global.
 *
 *     struct kd_conn_limit lim;
 *     kd_conn_limit_init(&lim, 1024, metrics, log, log_ud);
 *     enum kd_conn_admission a = kd_conn_limit_admit(&lim, "HTTP", fd);   // in on_accept
 *     ... KD_CONN_DROP: close(fd); otherwise serve or refuse, then when it has closed:
 *     kd_conn_limit_release(&lim, a);
 */
#ifndef KD_API_CONN_LIMIT_H
#define KD_API_CONN_LIMIT_H

#include <stddef.h>
#include <stdint.h>

#include "logf.h"
#include "metrics.h"

/* Refused connections that may be closing at once (answered, lingering); past it they are cut. */
#define KD_CONN_REFUSING_MAX 64u
/* Descriptors kept for everything but client connections: the log, the job store, model and
 * checkpoint files, devices, the loop's own, a training job's data. */
#define KD_CONN_RESERVED_FDS 256u
/* How long a refused connection reads and drops what its client sends before it is closed. */
#define KD_CONN_REFUSAL_LINGER_MS 1000u

enum kd_conn_admission {
    KD_CONN_SERVE,  /* counted while open; kd_conn_limit_release when it has closed */
    KD_CONN_REFUSE, /* past the limit: tell the client, close; kd_conn_limit_release when it has closed */
    KD_CONN_DROP,   /* past the limit with KD_CONN_REFUSING_MAX refusals under way: close it now */
};

struct kd_conn_limit {
    size_t max;      /* connections served at once, both listeners together */
    size_t open;     /* served now */
    size_t refusing; /* refused and not yet closed */
    /* The run of refusals since a connection was last served: when it began and how many. */
    uint64_t run_since_ns;
    uint64_t run_refused;
    kd_log_sink_fn log;
    void *log_ud;
    struct kd_metric_family *refused; /* kiln_connections_refused_total; NULL without metrics */
};

/* max >= 1. metrics may be NULL. 0, or -1 when out of memory. */
int kd_conn_limit_init(struct kd_conn_limit *l, size_t max, struct kd_metrics *metrics, kd_log_sink_fn log,
                       void *log_ud);
/*
 * A connection the listener `what` ("HTTP", "gRPC") accepted as fd (read for the client's address
 * when a line is logged). l may be NULL: every connection is served.
 */
enum kd_conn_admission kd_conn_limit_admit(struct kd_conn_limit *l, const char *what, int fd);
/* A connection admitted as `how` (SERVE or REFUSE) has closed. l may be NULL. */
void kd_conn_limit_release(struct kd_conn_limit *l, enum kd_conn_admission how);

/*
 * The connection limit the process's open-file limit allows for `wanted` connections: when the
 * soft limit is short of wanted + KD_CONN_REFUSING_MAX + KD_CONN_RESERVED_FDS it is raised toward
 * the hard limit; when that is still short, a smaller limit that fits is returned. A line saying
 * what was done (empty when nothing was) goes to note, at *level.
 */
size_t kd_conn_limit_fit_descriptors(size_t wanted, char *note, size_t notelen, enum kd_log_level *level);

#endif /* KD_API_CONN_LIMIT_H */
