/*
 * daemon/notify.c — the service manager's readiness and watchdog protocol (sd_notify), spoken
 * directly: one datagram per state change on the AF_UNIX socket named by $NOTIFY_SOCKET, as
 * systemd documents it. kilnd sends READY=1 once it answers /v2/health/ready with 200,
 * STOPPING=1 when it starts to drain, a STATUS= line with each, and WATCHDOG=1 from a timer on
 * the event loop every half $WATCHDOG_USEC, so a loop that stops turning stops the pings and the
 * manager restarts the service. Without $NOTIFY_SOCKET every call is a no-op.
 *
 * The protocol is small enough that a library (libsystemd) would add a dependency and a
 * container-image package for nothing; the datagram format is the whole of it.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "notify.h"

static void on_watchdog(uv_timer_t *t)
{
    kd_notify_send(t->data, "WATCHDOG=1");
}

int kd_notify_open(struct kd_notify *n, uv_loop_t *loop, const char *socket_path, const char *watchdog_usec,
                   const char *watchdog_pid, char *err, size_t errlen)
{
    memset(n, 0, sizeof *n);
    n->fd = -1;
    if (!socket_path || !socket_path[0])
        return 0;
    size_t len = strlen(socket_path);
    if ((socket_path[0] != '/' && socket_path[0] != '@') || len >= sizeof n->addr.sun_path) {
        snprintf(err, errlen, "NOTIFY_SOCKET '%s' is neither an absolute path nor an abstract name ('@...') "
                 "of at most %zu bytes", socket_path, sizeof n->addr.sun_path - 1);
        return -1;
    }
    n->addr.sun_family = AF_UNIX;
    memcpy(n->addr.sun_path, socket_path, len);
    if (socket_path[0] == '@')
        n->addr.sun_path[0] = '\0'; /* Linux's abstract namespace: no file, a leading NUL */
    n->addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + (socket_path[0] == '/' ? 1 : 0));
    n->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (n->fd < 0) {
        snprintf(err, errlen, "NOTIFY_SOCKET: cannot make a datagram socket: %s", strerror(errno));
        return -1;
    }
    /* WATCHDOG_PID names the process the pings must come from; a value for another process
     * (inherited through a wrapper) means this one is not watched. */
    bool watched = watchdog_usec && watchdog_usec[0];
    if (watched && watchdog_pid && watchdog_pid[0]) {
        char *end;
        errno = 0;
        long long pid = strtoll(watchdog_pid, &end, 10);
        watched = errno == 0 && *end == '\0' && pid == (long long)getpid();
    }
    if (watched) {
        char *end;
        errno = 0;
        unsigned long long usec = strtoull(watchdog_usec, &end, 10);
        if (errno != 0 || *end != '\0' || usec == 0 || watchdog_usec[0] == '-') {
            snprintf(err, errlen, "WATCHDOG_USEC '%s' is not a positive number of microseconds", watchdog_usec);
            close(n->fd);
            n->fd = -1;
            return -1;
        }
        n->watchdog_usec = usec;
        uint64_t every_ms = usec / 2000;
        uv_timer_init(loop, &n->timer);
        n->timer.data = n;
        n->timer_ready = true;
        uv_timer_start(&n->timer, on_watchdog, every_ms ? every_ms : 1, every_ms ? every_ms : 1);
    }
    return 0;
}

int kd_notify_send(struct kd_notify *n, const char *message)
{
    if (!n || n->fd < 0)
        return 0;
    ssize_t sent;
    do
        sent = sendto(n->fd, message, strlen(message), MSG_NOSIGNAL, (const struct sockaddr *)&n->addr, n->addr_len);
    while (sent < 0 && errno == EINTR);
    return sent < 0 ? -errno : 0;
}

int kd_notify_status(struct kd_notify *n, const char *state_line, const char *status)
{
    if (!n || n->fd < 0)
        return 0;
    char msg[512];
    snprintf(msg, sizeof msg, "%s%sSTATUS=%s", state_line ? state_line : "", state_line ? "\n" : "", status);
    return kd_notify_send(n, msg);
}

void kd_notify_close(struct kd_notify *n, void (*closed)(uv_handle_t *))
{
    if (n->timer_ready) {
        uv_timer_stop(&n->timer);
        if (!uv_is_closing((uv_handle_t *)&n->timer))
            uv_close((uv_handle_t *)&n->timer, closed);
        n->timer_ready = false;
    }
    if (n->fd >= 0)
        close(n->fd);
    n->fd = -1;
}
