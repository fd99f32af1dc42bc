/*
 * clients/sse.c — reads GET /v1/jobs/{id}/events (server-sent events) without blocking.
 *
 * kilnd answers a running job's stream with Connection: close and no length, and a finished
 * job's stream as one ordinary response; the client asked for Connection: close, so in both
 * cases the stream ends when the socket closes. Only the fields kilnd sends are understood
 * (id, event, data, comments); a line longer than the buffer limit ends the stream as an error.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sse.h"

#define SSE_MAX_BUFFER (4u << 20)

void kiln_sse_init(struct kiln_sse *s)
{
    memset(s, 0, sizeof *s);
    s->fd = -1;
    snprintf(s->type, sizeof s->type, "message");
}

static void reset_stream(struct kiln_sse *s)
{
    free(s->buf);
    free(s->data);
    s->buf = s->data = NULL;
    s->len = s->cap = s->dlen = 0;
    s->status = 0;
    s->chunked = false;
    memset(&s->dechunk, 0, sizeof s->dechunk);
    snprintf(s->type, sizeof s->type, "message");
}

void kiln_sse_close(struct kiln_sse *s)
{
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    reset_stream(s);
}

int kiln_sse_open(struct kiln_sse *s, const struct kiln_client *cl, const char *path)
{
    kiln_sse_close(s);
    s->error[0] = '\0';
    char hdr[64] = "";
    if (s->last_id[0])
        snprintf(hdr, sizeof hdr, "Last-Event-ID: %s\r\n", s->last_id);
    struct kiln_client quiet = *cl;
    quiet.quiet = true;
    s->fd = kiln_cli_send_request(&quiet, "GET", path, NULL, 0, hdr);
    if (s->fd < 0) {
        snprintf(s->error, sizeof s->error, "cannot reach kilnd at %s", cl->shown);
        return -1;
    }
    int fl = fcntl(s->fd, F_GETFL);
    if (fl < 0 || fcntl(s->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        snprintf(s->error, sizeof s->error, "fcntl: %s", strerror(errno));
        kiln_sse_close(s);
        return -1;
    }
    return 0;
}

/* The headers are in s->buf up to END; 0 for a 200, -1 otherwise (the body is read first). */
static int take_headers(struct kiln_sse *s, char *end)
{
    s->status = strncmp(s->buf, "HTTP/1.", 7) == 0 && s->len > 12 ? atoi(s->buf + 9) : -1;
    if (s->status == 200) {
        size_t skip = (size_t)(end + 4 - s->buf);
        s->chunked = kiln_is_chunked(s->buf, end + 2);
        memmove(s->buf, s->buf + skip, s->len - skip);
        s->len -= skip;
        long n = s->chunked ? kiln_dechunk(&s->dechunk, s->buf, s->len, s->buf) : (long)s->len;
        if (n < 0) {
            snprintf(s->error, sizeof s->error, "the event stream's chunked framing is broken");
            s->status = -1;
            return -1;
        }
        s->len = (size_t)n;
        s->buf[s->len] = '\0';
        return 0;
    }
    if (s->status < 0)
        snprintf(s->error, sizeof s->error, "kilnd did not answer with HTTP");
    return -1;
}

static void refused(struct kiln_sse *s)
{
    char *end = s->buf ? strstr(s->buf, "\r\n\r\n") : NULL;
    const char *body = end ? end + 4 : "";
    cJSON *j = cJSON_Parse(body);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    snprintf(s->error, sizeof s->error, "HTTP %d: %s", s->status, cJSON_IsString(e) ? e->valuestring : body);
    cJSON_Delete(j);
}

static void dispatch_line(struct kiln_sse *s, char *line, kiln_sse_event_fn fn, void *ctx)
{
    if (line[0] == '\0') {
        if (s->data)
            fn(ctx, s->type, s->data);
        free(s->data);
        s->data = NULL;
        s->dlen = 0;
        snprintf(s->type, sizeof s->type, "message");
        return;
    }
    if (line[0] == ':')
        return;
    char *colon = strchr(line, ':');
    const char *value = "";
    if (colon) {
        *colon = '\0';
        value = colon[1] == ' ' ? colon + 2 : colon + 1;
    }
    if (!strcmp(line, "id")) {
        snprintf(s->last_id, sizeof s->last_id, "%.30s", value);
    } else if (!strcmp(line, "event")) {
        snprintf(s->type, sizeof s->type, "%.60s", value);
    } else if (!strcmp(line, "data")) {
        size_t n = strlen(value);
        char *g = realloc(s->data, s->dlen + n + 2);
        if (!g)
            return;
        s->data = g;
        if (s->dlen)
            s->data[s->dlen++] = '\n';
        memcpy(s->data + s->dlen, value, n + 1);
        s->dlen += n;
    }
}

int kiln_sse_pump(struct kiln_sse *s, kiln_sse_event_fn fn, void *ctx)
{
    if (s->fd < 0)
        return 0;
    for (;;) {
        if (s->cap - s->len < 4096) {
            size_t cap = s->cap ? s->cap * 2 : 16384;
            char *g = cap <= SSE_MAX_BUFFER ? realloc(s->buf, cap) : NULL;
            if (!g) {
                snprintf(s->error, sizeof s->error, "an event stream line is too long");
                return -1;
            }
            s->buf = g;
            s->cap = cap;
        }
        ssize_t got = recv(s->fd, s->buf + s->len, s->cap - s->len - 1, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 1;
        if (got < 0) {
            snprintf(s->error, sizeof s->error, "reading the event stream: %s", strerror(errno));
            return -1;
        }
        if (got == 0) {
            if (s->status != 200) {
                if (s->status > 0)
                    refused(s);
                else
                    snprintf(s->error, sizeof s->error, "kilnd closed the connection without an answer");
                return -1;
            }
            return 0;
        }
        if (s->status == 200 && s->chunked) {
            long n = kiln_dechunk(&s->dechunk, s->buf + s->len, (size_t)got, s->buf + s->len);
            if (n < 0) {
                snprintf(s->error, sizeof s->error, "the event stream's chunked framing is broken");
                return -1;
            }
            got = n;
        }
        s->len += (size_t)got;
        s->buf[s->len] = '\0';
        if (s->status == 0) {
            char *end = strstr(s->buf, "\r\n\r\n");
            if (!end)
                continue;
            if (take_headers(s, end) != 0 && s->status < 0)
                return -1;
        }
        if (s->status != 200)
            continue; /* an error body: read it whole, then say what it was */
        size_t off = 0;
        char *nl;
        while ((nl = memchr(s->buf + off, '\n', s->len - off))) {
            *nl = '\0';
            if (nl > s->buf + off && nl[-1] == '\r')
                nl[-1] = '\0';
            dispatch_line(s, s->buf + off, fn, ctx);
            off = (size_t)(nl - s->buf) + 1;
        }
        memmove(s->buf, s->buf + off, s->len - off);
        s->len -= off;
        s->buf[s->len] = '\0';
    }
}
