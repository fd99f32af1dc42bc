/*
 * api/conn-limit.c — the client connection limit both listeners share (conn-limit.h says why and
 * how a connection past it is refused).
 */
#include <stdio.h>
#include <string.h>

#include <sys/resource.h>

#include <uv.h>

#include "conn-limit.h"
#include "server.h"

static double connections_open(void *ctx)
{
    return (double)((const struct kd_conn_limit *)ctx)->open;
}

static double connections_max(void *ctx)
{
    return (double)((const struct kd_conn_limit *)ctx)->max;
}

int kd_conn_limit_init(struct kd_conn_limit *l, size_t max, struct kd_metrics *metrics, kd_log_sink_fn log,
                       void *log_ud)
{
    *l = (struct kd_conn_limit){.max = max ? max : 1, .log = log, .log_ud = log_ud};
    if (!metrics)
        return 0;
    l->refused = kd_metrics_family(metrics, "kiln_connections_refused_total",
                                   "Client connections refused because limits.max_connections were open, by "
                                   "listener (http, grpc).",
                                   KD_METRIC_COUNTER, (const char *const[]){"listener", NULL}, NULL, 0);
    if (!l->refused)
        return -1;
    /* both listeners' series from the start, at 0: a rate over a series that appears with its
     * first refusal misses that refusal, and an alert on it reads "no data" until then */
    if (!kd_metrics_series(l->refused, (const char *const[]){"http", NULL}) ||
        !kd_metrics_series(l->refused, (const char *const[]){"grpc", NULL}))
        return -1;
    /* what is open against the limit, HTTP and gRPC together as the limit counts them (each
     * listener's own gauge shows only its part); read on the loop thread, as /metrics renders */
    if (kd_metrics_gauge_fn(metrics, "kiln_connections_open",
                            "Client connections open, HTTP and gRPC together, as limits.max_connections counts "
                            "them.",
                            connections_open, l) != 0 ||
        kd_metrics_gauge_fn(metrics, "kiln_connections_max", "limits.max_connections.", connections_max, l) != 0)
        return -1;
    return 0;
}

static void count_refusal(struct kd_conn_limit *l, const char *what, int fd)
{
    if (l->refused) {
        /* the label in lower case, as Prometheus labels go: "http", "grpc" */
        char label[16];
        size_t i = 0;
        for (; what[i] && i + 1 < sizeof label; i++)
            label[i] = (char)(what[i] >= 'A' && what[i] <= 'Z' ? what[i] - 'A' + 'a' : what[i]);
        label[i] = '\0';
        struct kd_metric_series *s = kd_metrics_series(l->refused, (const char *const[]){label, NULL});
        if (s)
            kd_metric_add(s, 1);
    }
    if (l->run_refused++ > 0)
        return;
    l->run_since_ns = uv_hrtime();
    char peer[64];
    kd_peer_name(fd, peer, sizeof peer);
    kd_api_logf(l->log, l->log_ud, KD_LOG_WARN,
                "%s: refused a connection from %s: limits.max_connections (%zu) client connections are open "
                "(HTTP and gRPC together); further refusals are not logged until a connection is served again",
                what, peer, l->max);
}

enum kd_conn_admission kd_conn_limit_admit(struct kd_conn_limit *l, const char *what, int fd)
{
    if (!l)
        return KD_CONN_SERVE;
    if (l->open < l->max) {
        l->open++;
        return KD_CONN_SERVE;
    }
    count_refusal(l, what, fd);
    if (l->refusing >= KD_CONN_REFUSING_MAX)
        return KD_CONN_DROP;
    l->refusing++;
    return KD_CONN_REFUSE;
}

void kd_conn_limit_release(struct kd_conn_limit *l, enum kd_conn_admission how)
{
    if (!l)
        return;
    if (how == KD_CONN_SERVE && l->open > 0)
        l->open--;
    else if (how == KD_CONN_REFUSE && l->refusing > 0)
        l->refusing--;
    if (l->run_refused && l->open < l->max) {
        /* Said when room frees, which is when the run of refusals ends, by either listener: the
         * limit is HTTP's and gRPC's together, so the line names neither. */
        kd_api_logf(l->log, l->log_ud, KD_LOG_INFO,
                    "serving connections again (one closed); %llu were refused in %.1f s at "
                    "limits.max_connections (%zu, HTTP and gRPC together)",
                    (unsigned long long)l->run_refused, (double)(uv_hrtime() - l->run_since_ns) / 1e9, l->max);
        l->run_refused = 0;
    }
}

size_t kd_conn_limit_fit_descriptors(size_t wanted, char *note, size_t notelen, enum kd_log_level *level)
{
    note[0] = '\0';
    *level = KD_LOG_INFO;
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY)
        return wanted;
    rlim_t need = (rlim_t)wanted + KD_CONN_REFUSING_MAX + KD_CONN_RESERVED_FDS;
    if (lim.rlim_cur >= need)
        return wanted;
    rlim_t was = lim.rlim_cur;
    rlim_t can = lim.rlim_max == RLIM_INFINITY || lim.rlim_max >= need ? need : lim.rlim_max;
    if (can > lim.rlim_cur) {
        struct rlimit raised = {.rlim_cur = can, .rlim_max = lim.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &raised) == 0)
            lim.rlim_cur = can;
    }
    if (lim.rlim_cur >= need) {
        snprintf(note, notelen,
                 "raised the open-file limit from %llu to %llu: room for limits.max_connections (%zu) and %u "
                 "descriptors more",
                 (unsigned long long)was, (unsigned long long)lim.rlim_cur, wanted,
                 KD_CONN_REFUSING_MAX + KD_CONN_RESERVED_FDS);
        return wanted;
    }
    /* Short even raised: fewer connections, so that running out of descriptors (which pauses
     * accepting, listener.h) stays the exception and a refusal says why instead. */
    rlim_t spare = KD_CONN_REFUSING_MAX + KD_CONN_RESERVED_FDS;
    size_t fit = lim.rlim_cur > 2 * spare ? (size_t)(lim.rlim_cur - spare) : (size_t)(lim.rlim_cur / 4);
    if (fit < 1)
        fit = 1;
    *level = KD_LOG_WARN;
    char hard[32] = "unlimited";
    if (lim.rlim_max != RLIM_INFINITY)
        snprintf(hard, sizeof hard, "%llu", (unsigned long long)lim.rlim_max);
    snprintf(note, notelen,
             "limits.max_connections %zu lowered to %zu: the open-file limit is %llu (hard limit %s), and %llu "
             "descriptors are kept for kilnd's own files and for refusing connections; raise the limit "
             "(ulimit -n, LimitNOFILE=) to serve %zu",
             wanted, fit, (unsigned long long)lim.rlim_cur, hard, (unsigned long long)spare, wanted);
    return fit;
}
