/*
 * daemon/notify.h — readiness, stopping and watchdog notifications to a service manager
 * (systemd's Type=notify protocol over $NOTIFY_SOCKET). Loop thread only.
 *
 *     struct kd_notify n;
 *     kd_notify_open(&n, loop, getenv("NOTIFY_SOCKET"), getenv("WATCHDOG_USEC"),
 *                      getenv("WATCHDOG_PID"), err, sizeof err);
 *     kd_notify_status(&n, "READY=1", "serving on 0.0.0.0:8080");
 *     ...
 *     kd_notify_close(&n, NULL);     // before the loop's last run
 */
#ifndef KD_DAEMON_NOTIFY_H
#define KD_DAEMON_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <uv.h>

struct kd_notify {
    int fd; /* -1: no service manager asked for notifications */
    struct sockaddr_un addr;
    socklen_t addr_len;
    uint64_t watchdog_usec; /* 0: no watchdog */
    uv_timer_t timer;       /* WATCHDOG=1 every watchdog_usec / 2 while the loop turns */
    bool timer_ready;
};

/* Reads the three values systemd sets (NULL or "" when unset). A socket path that is not
 * absolute or abstract ('@'), or a malformed WATCHDOG_USEC, is an error naming the value; with
 * no socket the notifier is inert and every send returns 0. */
int kd_notify_open(struct kd_notify *n, uv_loop_t *loop, const char *socket_path, const char *watchdog_usec,
                   const char *watchdog_pid, char *err, size_t errlen);
/* Sends one datagram ("READY=1", "WATCHDOG=1", ...). 0, or a negative errno. */
int kd_notify_send(struct kd_notify *n, const char *message);
/* Sends state_line (may be NULL) and a STATUS= line together. */
int kd_notify_status(struct kd_notify *n, const char *state_line, const char *status);
/* Stops the watchdog timer (closed is its uv_close callback, may be NULL) and the socket. */
void kd_notify_close(struct kd_notify *n, void (*closed)(uv_handle_t *));

#endif /* KD_DAEMON_NOTIFY_H */
