/*
 * api/listener.c — accepting connections, and pausing instead of spinning when the process is out
 * of file descriptors (listener.h says why libuv's own accept is not used).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "listener.h"

/* Connections accepted per readable event before the loop gets a turn for other work. */
#define ACCEPT_BATCH 64
#define LISTEN_BACKLOG 511

static int resolve(uv_loop_t *loop, const char *host, int port, struct sockaddr_storage *addr)
{
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)addr) == 0)
        return 0;
    if (uv_ip6_addr(host, port, (struct sockaddr_in6 *)addr) == 0)
        return 0;
    uv_getaddrinfo_t req;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    int rc = uv_getaddrinfo(loop, &req, NULL, host, NULL, &hints);
    if (rc != 0)
        return rc;
    memcpy(addr, req.addrinfo->ai_addr, req.addrinfo->ai_addrlen);
    if (addr->ss_family == AF_INET)
        ((struct sockaddr_in *)addr)->sin_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in6 *)addr)->sin6_port = htons((uint16_t)port);
    uv_freeaddrinfo(req.addrinfo);
    return 0;
}

/* A socket bound to addr and listening, or a negative libuv error code. */
static int listen_socket(const struct sockaddr_storage *addr, int *bound_port)
{
    int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return uv_translate_sys_error(errno);
    int on = 1;
    socklen_t len = addr->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    struct sockaddr_storage bound;
    socklen_t bound_len = sizeof bound;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0 ||
        bind(fd, (const struct sockaddr *)addr, len) != 0 || listen(fd, LISTEN_BACKLOG) != 0 ||
        getsockname(fd, (struct sockaddr *)&bound, &bound_len) != 0) {
        int rc = uv_translate_sys_error(errno);
        close(fd);
        return rc;
    }
    *bound_port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                    : ((struct sockaddr_in *)&bound)->sin_port);
    return fd;
}

static void on_readable(uv_poll_t *h, int status, int events);

static void on_retry(uv_timer_t *t)
{
    struct kd_listener *l = t->data;
    if (!l->closing)
        uv_poll_start(&l->poll, UV_READABLE, on_readable);
}

static void pause_accepting(struct kd_listener *l, int err)
{
    l->exhausted_attempts++;
    uv_poll_stop(&l->poll);
    uv_timer_start(&l->retry, on_retry, KD_LISTENER_RETRY_MS, 0);
    if (l->exhausted_since_ns == 0) {
        l->exhausted_since_ns = uv_hrtime();
        struct rlimit lim = {0};
        getrlimit(RLIMIT_NOFILE, &lim);
        char limit[32] = "unlimited";
        if (lim.rlim_cur != RLIM_INFINITY)
            snprintf(limit, sizeof limit, "%llu", (unsigned long long)lim.rlim_cur);
        kd_api_logf(l->log, l->log_ud, KD_LOG_WARN,
                    "%s: cannot accept connections: %s (open-file limit %s); new connections wait in the "
                    "listen backlog and are accepted once descriptors are free (retried every %u ms or when "
                    "a connection closes); this line is not repeated until then",
                    l->what, strerror(err), limit, KD_LISTENER_RETRY_MS);
    }
}

static void accepted_again(struct kd_listener *l)
{
    if (l->exhausted_since_ns == 0)
        return;
    kd_api_logf(l->log, l->log_ud, KD_LOG_INFO,
                "%s: accepting connections again after %.1f s without a free file descriptor (%llu accept "
                "attempts failed)",
                l->what, (double)(uv_hrtime() - l->exhausted_since_ns) / 1e9,
                (unsigned long long)l->exhausted_attempts);
    l->exhausted_since_ns = 0;
    l->exhausted_attempts = 0;
}

static void on_readable(uv_poll_t *h, int status, int events)
{
    (void)status;
    (void)events;
    struct kd_listener *l = h->data;
    for (int i = 0; i < ACCEPT_BATCH && !l->closing; i++) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            accepted_again(l);
            l->on_accept(l->ud, fd);
            continue;
        }
        int err = errno;
        if (err == EAGAIN || err == EWOULDBLOCK)
            return;
        /* the connection failed before it was accepted: the next one may be fine */
        if (err == EINTR || err == ECONNABORTED || err == EPROTO || err == EPERM)
            continue;
        /* EMFILE, ENFILE, ENOBUFS, ENOMEM: retrying at once would fail the same way for as long as
         * the condition lasts, so watching the socket again has to wait */
        pause_accepting(l, err);
        return;
    }
}

int kd_listener_open(struct kd_listener *l, uv_loop_t *loop, const char *host, int port, const char *what,
                     void (*on_accept)(void *ud, int fd), void *ud, kd_log_sink_fn log, void *log_ud,
                     int *bound_port, char *err, size_t errlen)
{
    *l = (struct kd_listener){
        .loop = loop, .fd = -1, .what = what, .on_accept = on_accept, .ud = ud, .log = log, .log_ud = log_ud};
    struct sockaddr_storage addr;
    int rc = resolve(loop, host, port, &addr);
    if (rc != 0) {
        snprintf(err, errlen, "cannot resolve host '%s': %s", host, uv_strerror(rc));
        return rc;
    }
    int fd = listen_socket(&addr, bound_port);
    if (fd < 0) {
        snprintf(err, errlen, "cannot listen on %s:%d: %s", host, port, uv_strerror(fd));
        return fd;
    }
    rc = uv_poll_init(loop, &l->poll, fd);
    if (rc != 0) {
        close(fd);
        snprintf(err, errlen, "cannot watch the socket on %s:%d: %s", host, port, uv_strerror(rc));
        return rc;
    }
    uv_timer_init(loop, &l->retry);
    l->poll.data = l->retry.data = l;
    l->fd = fd;
    l->open_handles = 2;
    uv_poll_start(&l->poll, UV_READABLE, on_readable);
    return 0;
}

static void on_handle_closed(uv_handle_t *h)
{
    struct kd_listener *l = h->data;
    if (--l->open_handles > 0)
        return;
    /* the socket goes only now: a poll handle must not watch a closed descriptor */
    close(l->fd);
    l->fd = -1;
    if (l->closed)
        l->closed(l->closed_ud);
}

void kd_listener_close(struct kd_listener *l, void (*closed)(void *ud), void *ud)
{
    if (l->closing || l->open_handles == 0)
        return;
    l->closing = true;
    l->closed = closed;
    l->closed_ud = ud;
    uv_close((uv_handle_t *)&l->poll, on_handle_closed);
    uv_close((uv_handle_t *)&l->retry, on_handle_closed);
}

void kd_listener_descriptor_freed(struct kd_listener *l)
{
    if (l->closing || l->open_handles == 0 || l->exhausted_since_ns == 0 ||
        !uv_is_active((uv_handle_t *)&l->retry))
        return;
    uv_timer_stop(&l->retry);
    uv_poll_start(&l->poll, UV_READABLE, on_readable);
}
