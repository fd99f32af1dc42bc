/*
 * backends/remote/remote-conn.c — the remote backend's connection to a kilnd: a TCP socket with
 * Nagle off, the HTTP/1.1 upgrade of GET /v1/tensor (RFC 6455 section 4.1), and wslay's event API
 * in client mode for the framing and masking.
 *
 * The socket is non-blocking and every wait goes through poll() with the connection's timeout, so
 * a peer that stops answering turns into an error message instead of a hang. wslay never touches
 * the socket: its send callback appends frames to an output buffer that is then written in as few
 * write calls as the kernel allows (one per flush in the common case), and its receive callback
 * hands out bytes already read into an input buffer, saying "would block" when they run out.
 */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <wslay/wslay.h>

#include "ws-key.h"

#include "remote-impl.h"

struct kiln__rconn {
    int fd;
    int timeout_ms;
    char timeout_from[96]; /* where timeout_ms was set, for the messages of waits */
    wslay_event_context_ptr ws;
    kiln__rconn_msg_fn on_msg;
    void *ud;
    uint64_t delivered;             /* messages handed to on_msg so far */
    uint64_t mask_state;            /* xorshift state for frame masks */
    /* bytes read, not yet given to wslay: in[in_off, in_len) */
    uint8_t *in;
    size_t in_off, in_len, in_cap;
    /* frames wslay produced, not yet written: out[out_off, out_len) */
    uint8_t *out;
    size_t out_off, out_len, out_cap;
    bool out_failed;
    bool closed;                    /* the peer sent a close frame */
    char close_reason[160];
};

/* ---- buffers and waits --------------------------------------------------------------------------- */

static int grow(uint8_t **p, size_t *cap, size_t need)
{
    if (*cap >= need)
        return 0;
    size_t c = *cap ? *cap : 65536;
    while (c < need) {
        if (c > SIZE_MAX / 2)
            return -1;
        c *= 2;
    }
    uint8_t *q = realloc(*p, c);
    if (!q)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int fail(char *why, size_t wl, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(char *why, size_t wl, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, wl, fmt, ap);
    va_end(ap);
    return -1;
}

/* Reads what the socket has into the input buffer. 1: bytes read; 0: none yet; -1: error or EOF. */
static int read_some(struct kiln__rconn *c, char *why, size_t wl)
{
    if (c->in_off == c->in_len)
        c->in_off = c->in_len = 0;
    if (c->in_cap - c->in_len < 16384 && grow(&c->in, &c->in_cap, c->in_len + 65536) != 0)
        return fail(why, wl, "out of memory reading from the server");
    ssize_t r = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
    if (r > 0) {
        c->in_len += (size_t)r;
        return 1;
    }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return 0;
    if (r == 0)
        return fail(why, wl, "the server closed the connection%s%s", c->close_reason[0] ? ": " : "",
                    c->close_reason);
    return fail(why, wl, "reading from the server: %s", strerror(errno));
}

/* Writes the output buffer out, reading on the side so that neither peer can wedge the other. */
static int write_out(struct kiln__rconn *c, char *why, size_t wl)
{
    int64_t deadline = now_ms() + c->timeout_ms;
    while (c->out_off < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (w > 0) {
            c->out_off += (size_t)w;
            deadline = now_ms() + c->timeout_ms;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return fail(why, wl, "writing to the server: %s", strerror(errno));
        int64_t left = deadline - now_ms();
        if (left <= 0)
            return fail(why, wl, "the server took no data for %d ms (%s)", c->timeout_ms, c->timeout_from);
        struct pollfd pf = {.fd = c->fd, .events = POLLOUT | POLLIN};
        int pr = poll(&pf, 1, (int)left);
        if (pr < 0 && errno != EINTR)
            return fail(why, wl, "poll: %s", strerror(errno));
        if (pr > 0 && (pf.revents & POLLIN) && read_some(c, why, wl) < 0)
            return -1;
    }
    c->out_off = c->out_len = 0;
    return 0;
}

/* Waits until the socket is readable (or the timeout passes) and reads. 0 or -1. */
static int wait_read(struct kiln__rconn *c, char *why, size_t wl)
{
    int64_t deadline = now_ms() + c->timeout_ms;
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0)
            return fail(why, wl, "no answer from the server within %d ms (%s)", c->timeout_ms, c->timeout_from);
        struct pollfd pf = {.fd = c->fd, .events = POLLIN};
        int pr = poll(&pf, 1, (int)left);
        if (pr < 0 && errno != EINTR)
            return fail(why, wl, "poll: %s", strerror(errno));
        if (pr <= 0)
            continue;
        int r = read_some(c, why, wl);
        if (r != 0)
            return r < 0 ? -1 : 0;
    }
}

/* ---- wslay callbacks ----------------------------------------------------------------------------- */

static ssize_t recv_cb(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, int flags, void *user)
{
    struct kiln__rconn *c = user;
    size_t have = c->in_len - c->in_off;
    if (have == 0) {
        wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
        return -1;
    }
    size_t n = have < len ? have : len;
    memcpy(buf, c->in + c->in_off, n);
    c->in_off += n;
    return (ssize_t)n;
}

static ssize_t send_cb(wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags, void *user)
{
    struct kiln__rconn *c = user;
    if (grow(&c->out, &c->out_cap, c->out_len + len) != 0) {
        c->out_failed = true;
        wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
        return -1;
    }
    memcpy(c->out + c->out_len, data, len);
    c->out_len += len;
    return (ssize_t)len;
}

/* Masks only need to be unpredictable to intermediaries that might cache: a xorshift stream
 * seeded from the kernel's generator is plenty, and cheap enough for every frame. */
static int genmask_cb(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, void *user)
{
    struct kiln__rconn *c = user;
    for (size_t i = 0; i < len; i++) {
        uint64_t x = c->mask_state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c->mask_state = x;
        buf[i] = (uint8_t)(x >> 24);
    }
    return 0;
}

static void msg_cb(wslay_event_context_ptr ctx, const struct wslay_event_on_msg_recv_arg *arg, void *user)
{
    struct kiln__rconn *c = user;
    if (arg->opcode == WSLAY_BINARY_FRAME) {
        c->delivered++;
        c->on_msg(c->ud, arg->msg, arg->msg_length);
    } else if (arg->opcode == WSLAY_CONNECTION_CLOSE) {
        c->closed = true;
        /* the payload is the 2-byte status code, then the reason */
        size_t n = arg->msg_length > 2 ? arg->msg_length - 2 : 0;
        if (n >= sizeof c->close_reason - 24)
            n = sizeof c->close_reason - 24;
        snprintf(c->close_reason, sizeof c->close_reason, "close code %u%s%.*s", (unsigned)arg->status_code,
                 n ? ", " : "", (int)n, n ? (const char *)arg->msg + 2 : "");
    }
    /* text frames are not part of the protocol; ping and pong are wslay's business */
}

static const struct wslay_event_callbacks callbacks = {
    .recv_callback = recv_cb,
    .send_callback = send_cb,
    .genmask_callback = genmask_cb,
    .on_msg_recv_callback = msg_cb,
};

/* ---- connect and upgrade ------------------------------------------------------------------------- */

static int tcp_connect(const char *host, int port, int timeout_ms, const char *timeout_from, char *why, size_t wl)
{
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int gr = getaddrinfo(host, ps, &hints, &res);
    if (gr != 0)
        return fail(why, wl, "cannot resolve '%s': %s", host, gai_strerror(gr));
    int fd = -1;
    int err = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int r = connect(fd, a->ai_addr, a->ai_addrlen);
        if (r != 0 && errno == EINPROGRESS) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            int pr;
            do
                pr = poll(&pf, 1, timeout_ms);
            while (pr < 0 && errno == EINTR);
            if (pr == 0) {
                err = ETIMEDOUT;
            } else {
                socklen_t sl = sizeof err;
                err = 0;
                if (pr < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl) != 0)
                    err = errno;
            }
            r = err ? -1 : 0;
        } else if (r != 0) {
            err = errno;
        }
        if (r == 0)
            break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0 && err == ETIMEDOUT)
        return fail(why, wl, "cannot connect to %s:%d: timed out after %d ms (%s)", host, port, timeout_ms,
                    timeout_from);
    if (fd < 0)
        return fail(why, wl, "cannot connect to %s:%d: %s", host, port, strerror(err ? err : ECONNREFUSED));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* The value of header `name` in the response head (NUL-terminated), copied into out. */
static bool header_value(const char *head, const char *name, char *out, size_t outlen)
{
    size_t nl = strlen(name);
    for (const char *p = strstr(head, "\r\n"); p && p[2]; p = strstr(p + 2, "\r\n")) {
        const char *line = p + 2;
        if (strncasecmp(line, name, nl) == 0 && line[nl] == ':') {
            const char *v = line + nl + 1;
            while (*v == ' ' || *v == '\t')
                v++;
            const char *e = strstr(v, "\r\n");
            size_t n = e ? (size_t)(e - v) : strlen(v);
            while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
                n--;
            if (n >= outlen)
                n = outlen - 1;
            memcpy(out, v, n);
            out[n] = '\0';
            return true;
        }
    }
    return false;
}

/* A refused upgrade: the status and, when the body is kiln's JSON error, its text. */
static int refused(struct kiln__rconn *c, const char *head, size_t head_len, char *why, size_t wl)
{
    int status = 0;
    sscanf(head, "HTTP/%*d.%*d %d", &status);
    char cl[32] = "";
    size_t want = header_value(head, "Content-Length", cl, sizeof cl) ? (size_t)strtoul(cl, NULL, 10) : 0;
    if (want > 4096)
        want = 4096;
    /* the body follows the head; read what is promised, within the timeout */
    while (c->in_len - head_len < want) {
        char tmp[160];
        if (wait_read(c, tmp, sizeof tmp) != 0)
            break;
    }
    size_t have = c->in_len - head_len < want ? c->in_len - head_len : want;
    char body[4097];
    memcpy(body, c->in + head_len, have);
    body[have] = '\0';
    const char *msg = body;
    char text[512] = "";
    const char *e = strstr(body, "\"error\"");
    if (e && (e = strchr(e + 7, '"')) != NULL) {
        size_t n = 0;
        for (e++; *e && *e != '"' && n + 1 < sizeof text; e++)
            text[n++] = *e == '\\' && e[1] ? *++e : *e;
        text[n] = '\0';
        msg = text;
    } else {
        /* not kilnd's JSON (an HTML page from a proxy or another server): its title, or its
         * first line of text, control bytes made spaces, rather than the page in the message */
        size_t n = 0;
        const char *p = strstr(body, "<title>");
        char end = p ? '<' : '\n';
        p = p ? p + 7 : body;
        while (*p == '\r' || *p == '\n' || *p == ' ')
            p++;
        for (; *p && *p != end && *p != '\n' && n + 1 < 120; p++)
            text[n++] = (unsigned char)*p < 0x20 ? ' ' : *p;
        text[n] = '\0';
        msg = text;
    }
    return fail(why, wl, "the server refused the session: HTTP %d%s%.300s%s", status, *msg ? ": " : "", msg,
                status == 404 && msg == text && !strstr(body, "\"error\"")
                    ? " (is it a kilnd? it has no /v1/tensor)"
                    : "");
}

static int upgrade(struct kiln__rconn *c, const char *host, int port, const char *token, char *why, size_t wl)
{
    uint8_t nonce[16];
    if (getrandom(nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce)
        for (size_t i = 0; i < sizeof nonce; i++)
            nonce[i] = (uint8_t)(rand() ^ (int)now_ms());
    char key[32];
    kiln__ws_base64(nonce, sizeof nonce, key);
    size_t tl = token ? strlen(token) : 0;
    size_t cap = 512 + strlen(host) + tl;
    if (grow(&c->out, &c->out_cap, cap) != 0)
        return fail(why, wl, "out of memory");
    int n = snprintf((char *)c->out, cap,
                     "GET /v1/tensor HTTP/1.1\r\nHost: %s%s%s:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n%s%s%s\r\n",
                     strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "", port, key,
                     tl ? "Authorization: Bearer " : "", tl ? token : "", tl ? "\r\n" : "");
    if (n < 0 || (size_t)n >= cap)
        return fail(why, wl, "request too long");
    c->out_off = 0;
    c->out_len = (size_t)n;
    if (write_out(c, why, wl) != 0)
        return -1;
    /* The response head ends at the first blank line; what follows may already be frames. */
    size_t head_len = 0;
    for (;;) {
        if (c->in_len >= 4) {
            uint8_t *e = memmem(c->in, c->in_len, "\r\n\r\n", 4);
            if (e) {
                head_len = (size_t)(e - c->in) + 4;
                break;
            }
        }
        if (c->in_len > 16384)
            return fail(why, wl, "the server's response head is too long");
        if (wait_read(c, why, wl) != 0) {
            if (c->in_len == 0)
                snprintf(why + strlen(why), wl - strlen(why), " (during the WebSocket upgrade)");
            return -1;
        }
    }
    char head[16385];
    memcpy(head, c->in, head_len);
    head[head_len] = '\0';
    if (strncmp(head, "HTTP/1.1 101", 12) != 0)
        return refused(c, head, head_len, why, wl);
    char accept[64] = "", upg[32] = "";
    if (!header_value(head, "Upgrade", upg, sizeof upg) || strcasecmp(upg, "websocket") != 0)
        return fail(why, wl, "the server answered 101 without upgrading to websocket");
    char expect[29];
    kiln__ws_accept_key(key, expect);
    if (!header_value(head, "Sec-WebSocket-Accept", accept, sizeof accept) || strcmp(accept, expect) != 0)
        return fail(why, wl, "the server's Sec-WebSocket-Accept does not match the key sent");
    c->in_off = head_len;
    return 0;
}

struct kiln__rconn *kiln__rconn_open(const char *host, int port, const char *token, int timeout_ms,
                                     const char *timeout_from, kiln__rconn_msg_fn on_msg, void *ud, char *why,
                                     size_t wl)
{
    struct kiln__rconn *c = calloc(1, sizeof *c);
    if (!c) {
        fail(why, wl, "out of memory");
        return NULL;
    }
    c->fd = -1;
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : 30000;
    snprintf(c->timeout_from, sizeof c->timeout_from, "%s", timeout_from);
    c->on_msg = on_msg;
    c->ud = ud;
    if (getrandom(&c->mask_state, sizeof c->mask_state, 0) != (ssize_t)sizeof c->mask_state || !c->mask_state)
        c->mask_state = 0x9E3779B97F4A7C15ull ^ (uint64_t)now_ms();
    c->fd = tcp_connect(host, port, c->timeout_ms, c->timeout_from, why, wl);
    if (c->fd < 0 || upgrade(c, host, port, token, why, wl) != 0) {
        kiln__rconn_close(c);
        return NULL;
    }
    if (wslay_event_context_client_init(&c->ws, &callbacks, c) != 0) {
        fail(why, wl, "out of memory");
        kiln__rconn_close(c);
        return NULL;
    }
    return c;
}

/* ---- messages ------------------------------------------------------------------------------------ */

int kiln__rconn_send(struct kiln__rconn *c, const uint8_t *p, size_t n, char *why, size_t wl)
{
    if (c->closed)
        return fail(why, wl, "the server closed the session (%s)", c->close_reason);
    struct wslay_event_msg m = {.opcode = WSLAY_BINARY_FRAME, .msg = p, .msg_length = n};
    if (wslay_event_queue_msg(c->ws, &m) != 0)
        return fail(why, wl, "cannot queue a message of %zu bytes (out of memory, or the session is closing)", n);
    if (wslay_event_send(c->ws) != 0 || c->out_failed)
        return fail(why, wl, "framing a message of %zu bytes failed (out of memory)", n);
    return write_out(c, why, wl);
}

/* Gives wslay the bytes read so far; answers it wants to send (pong, close) go out at once. */
static int feed(struct kiln__rconn *c, char *why, size_t wl)
{
    if (c->in_off == c->in_len)
        return 0;
    if (wslay_event_recv(c->ws) != 0)
        return fail(why, wl, "the server's frames could not be read (out of memory)");
    if (c->in_off < c->in_len && !wslay_event_get_read_enabled(c->ws))
        c->in_off = c->in_len; /* nothing after a close, or a violation, is read */
    if (wslay_event_want_write(c->ws)) {
        if (wslay_event_send(c->ws) != 0 || c->out_failed)
            return fail(why, wl, "framing a control message failed");
        if (write_out(c, why, wl) != 0)
            return -1;
    }
    if (!wslay_event_get_read_enabled(c->ws) && !c->closed)
        return fail(why, wl, "the server broke the WebSocket framing");
    return 0;
}

int kiln__rconn_pump(struct kiln__rconn *c, int wait, char *why, size_t wl)
{
    uint64_t before = c->delivered;
    if (feed(c, why, wl) != 0)
        return -1;
    if (c->closed)
        return fail(why, wl, "the server closed the session (%s)", c->close_reason);
    if (c->delivered != before)
        return 0;
    int r = wait ? wait_read(c, why, wl) : read_some(c, why, wl);
    if (r < 0)
        return -1;
    if (feed(c, why, wl) != 0)
        return -1;
    if (c->closed && c->delivered == before)
        return fail(why, wl, "the server closed the session (%s)", c->close_reason);
    return 0;
}

void kiln__rconn_close(struct kiln__rconn *c)
{
    if (!c)
        return;
    if (c->ws && c->fd >= 0 && !c->closed && !c->out_failed) {
        /* A polite close; the server frees the session's buffers either way. */
        if (wslay_event_queue_close(c->ws, WSLAY_CODE_NORMAL_CLOSURE, NULL, 0) == 0 &&
            wslay_event_send(c->ws) == 0 && c->out_len > c->out_off)
            (void)send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    if (c->ws)
        wslay_event_context_free(c->ws);
    if (c->fd >= 0)
        close(c->fd);
    free(c->in);
    free(c->out);
    free(c);
}
