/*
 * clients/kiln.c — the kiln command-line client. A small blocking HTTP/1.1 client (one request
 * per connection, Connection: close) is all it needs to ask a kilnd about its health, metadata
 * and metrics; clients/jobs.c adds training jobs, models and prediction on top of it. The
 * address comes from --url, else KILN_URL, else http://127.0.0.1:8080; the bearer token from
 * --token, else KILN_TOKEN.
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"

#define DEFAULT_URL "http://127.0.0.1:8080"
#define TIMEOUT_MS 10000
#define MAX_RESPONSE (64u << 20)

static int parse_url(const char *text, struct url *u)
{
    if (strncmp(text, "http://", 7) != 0) {
        fprintf(stderr, "kiln: only http:// URLs are supported (got '%s')\n", text);
        return -1;
    }
    const char *h = text + 7;
    const char *slash = strchr(h, '/');
    size_t hostport = slash ? (size_t)(slash - h) : strlen(h);
    snprintf(u->base, sizeof u->base, "%s", slash ? slash : "");
    size_t bl = strlen(u->base);
    while (bl && u->base[bl - 1] == '/')
        u->base[--bl] = '\0';
    const char *colon = NULL;
    if (h[0] == '[') { /* [::1]:8080 */
        const char *close = memchr(h, ']', hostport);
        if (!close)
            goto bad;
        snprintf(u->host, sizeof u->host, "%.*s", (int)(close - h - 1), h + 1);
        colon = close + 1 < h + hostport && close[1] == ':' ? close + 1 : NULL;
    } else {
        colon = memchr(h, ':', hostport);
        size_t hl = colon ? (size_t)(colon - h) : hostport;
        if (hl == 0 || hl >= sizeof u->host)
            goto bad;
        snprintf(u->host, sizeof u->host, "%.*s", (int)hl, h);
    }
    if (colon) {
        size_t pl = (size_t)(h + hostport - colon - 1);
        if (pl == 0 || pl >= sizeof u->port || strspn(colon + 1, "0123456789") < pl)
            goto bad;
        snprintf(u->port, sizeof u->port, "%.*s", (int)pl, colon + 1);
    } else {
        snprintf(u->port, sizeof u->port, "80");
    }
    return 0;
bad:
    fprintf(stderr, "kiln: cannot parse URL '%s'\n", text);
    return -1;
}

int kiln_cli_connect(const struct url *u, const char *shown)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(u->host, u->port, &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "kiln: cannot resolve %s: %s\n", u->host, gai_strerror(rc));
        return -1;
    }
    int fd = -1, err = 0;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
            err = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        fprintf(stderr, "kiln: cannot reach kilnd at %s: %s (is kilnd running? set --url or KILN_URL)\n", shown,
                strerror(err));
    return fd;
}

static int wait_fd(int fd, short events)
{
    struct pollfd p = {.fd = fd, .events = events};
    int rc;
    do
        rc = poll(&p, 1, TIMEOUT_MS);
    while (rc < 0 && errno == EINTR);
    return rc > 0 ? 0 : -1;
}

int kiln_cli_send_all(int fd, const char *p, size_t n, const char *shown)
{
    for (size_t off = 0; off < n;) {
        ssize_t w = send(fd, p + off, n - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            fprintf(stderr, "kiln: sending to %s failed: %s\n", shown, strerror(errno));
            return -1;
        }
        off += (size_t)w;
    }
    return 0;
}

/* Connects and sends one request (headers, then body); returns the socket or -1. */
int kiln_cli_send_request(const struct kiln_client *cl, const char *method, const char *path, const char *body,
                          size_t body_len, const char *extra_headers)
{
    int fd = kiln_cli_connect(&cl->u, cl->shown);
    if (fd < 0)
        return -1;
    char auth[600] = "";
    if (cl->token && cl->token[0])
        snprintf(auth, sizeof auth, "Authorization: Bearer %.500s\r\n", cl->token);
    char req[2048];
    int n = snprintf(req, sizeof req,
                     "%s %s%s HTTP/1.1\r\nHost: %s:%s\r\nUser-Agent: kiln/%s\r\nAccept: */*\r\n%s%s"
                     "Content-Length: %zu\r\n%sConnection: close\r\n\r\n",
                     method, cl->u.base, path, cl->u.host, cl->u.port, KILN_VERSION, auth,
                     body ? "Content-Type: application/json\r\n" : "", body_len, extra_headers ? extra_headers : "");
    if (n < 0 || n >= (int)sizeof req || kiln_cli_send_all(fd, req, (size_t)n, cl->shown) != 0 ||
        (body_len && kiln_cli_send_all(fd, body, body_len, cl->shown) != 0)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Reads until the peer closes (we asked for Connection: close). */
int kiln_cli_request(const struct kiln_client *cl, const char *method, const char *path, const char *body,
                     size_t body_len, struct response *r)
{
    memset(r, 0, sizeof *r);
    const char *shown = cl->shown;
    int fd = kiln_cli_send_request(cl, method, path, body, body_len, NULL);
    if (fd < 0)
        return -1;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf || len + 1 >= MAX_RESPONSE) {
            fprintf(stderr, "kiln: response from %s too large\n", shown);
            goto fail;
        }
        if (len + 1 == cap) {
            char *grown = realloc(buf, cap * 2);
            if (!grown)
                goto fail;
            buf = grown;
            cap *= 2;
        }
        if (wait_fd(fd, POLLIN) != 0) {
            fprintf(stderr, "kiln: %s did not answer within %d ms\n", shown, TIMEOUT_MS);
            goto fail;
        }
        ssize_t got = recv(fd, buf + len, cap - len - 1, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            fprintf(stderr, "kiln: reading from %s failed: %s\n", shown, strerror(errno));
            goto fail;
        }
        if (got == 0)
            break;
        len += (size_t)got;
    }
    close(fd);
    buf[len] = '\0';
    char *end = strstr(buf, "\r\n\r\n");
    if (strncmp(buf, "HTTP/1.", 7) != 0 || len < 12 || !end) {
        fprintf(stderr, "kiln: %s did not answer with HTTP\n", shown);
        free(buf);
        return -1;
    }
    r->status = atoi(buf + 9);
    r->raw = buf;
    r->body = end + 4;
    r->body_len = len - (size_t)(r->body - buf);
    return 0;
fail:
    free(buf);
    close(fd);
    return -1;
}

static int request(const struct url *u, const char *shown, const char *path, struct response *r)
{
    struct kiln_client cl = {*u, shown, getenv("KILN_TOKEN")};
    return kiln_cli_request(&cl, "GET", path, NULL, 0, r);
}

/* The "error" field of a JSON error body, or the body itself. */
void kiln_cli_print_error(const char *what, const struct response *r)
{
    cJSON *j = cJSON_ParseWithLength(r->body, r->body_len);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    fprintf(stderr, "kiln: %s: HTTP %d: %.*s\n", what, r->status, cJSON_IsString(e) ? (int)strlen(e->valuestring) : (int)r->body_len,
            cJSON_IsString(e) ? e->valuestring : r->body);
    cJSON_Delete(j);
}

static int cmd_health(const struct url *u, const char *shown)
{
    struct response live, ready;
    if (request(u, shown, "/v2/health/live", &live) != 0)
        return 2;
    int rc = request(u, shown, "/v2/health/ready", &ready);
    if (rc != 0) {
        free(live.raw);
        return 2;
    }
    printf("live:  %s\nready: %s\n", live.status == 200 ? "yes" : "no", ready.status == 200 ? "yes" : "no");
    if (ready.status != 200)
        kiln_cli_print_error("ready", &ready);
    int code = live.status == 200 && ready.status == 200 ? 0 : 1;
    free(live.raw);
    free(ready.raw);
    return code;
}

static int cmd_get(const struct url *u, const char *shown, const char *path, bool json)
{
    struct response r;
    if (request(u, shown, path, &r) != 0)
        return 2;
    int code = 0;
    if (r.status != 200) {
        kiln_cli_print_error(path, &r);
        code = 1;
    } else if (json) {
        cJSON *j = cJSON_ParseWithLength(r.body, r.body_len);
        char *pretty = j ? cJSON_Print(j) : NULL;
        if (pretty)
            printf("%s\n", pretty);
        else
            fwrite(r.body, 1, r.body_len, stdout);
        cJSON_free(pretty);
        cJSON_Delete(j);
    } else {
        fwrite(r.body, 1, r.body_len, stdout);
    }
    free(r.raw);
    return code;
}

static int cmd_version(const struct url *u, const char *shown)
{
    printf("kiln client %s\n", KILN_VERSION);
    struct response r;
    if (request(u, shown, "/v2", &r) != 0)
        return 2;
    cJSON *j = cJSON_ParseWithLength(r.body, r.body_len);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "version");
    printf("kilnd server %s (%s)\n", cJSON_IsString(v) ? v->valuestring : "unknown", shown);
    cJSON_Delete(j);
    free(r.raw);
    return 0;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kiln [--url URL] COMMAND\n\n"
            "Commands:\n"
            "  health     is kilnd live and ready? (exit 0 when both)\n"
            "  server     server metadata (KServe v2 GET /v2)\n"
            "  metrics    Prometheus metrics (GET /metrics)\n"
            "  version    client and server versions\n"
            "%s\n"
            "Options:\n"
            "  --url URL  kilnd address (default: $KILN_URL, else %s)\n"
            "  --token T  bearer token (default: $KILN_TOKEN)\n"
            "  --help     this text\n\n"
            "Exit status: 0 success, 1 the server answered with an error, 2 it could not be reached.\n",
            kiln_cli_jobs_usage, DEFAULT_URL);
}

int main(int argc, char **argv)
{
    const char *url = getenv("KILN_URL");
    const char *token = getenv("KILN_TOKEN");
    const char *cmd = NULL;
    /* Options may come anywhere; what is not ours goes to the command, in order. */
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    int nrest = 0;
    if (!rest)
        return 2;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--url") == 0 && i + 1 < argc) {
            url = argv[++i];
        } else if (strncmp(argv[i], "--url=", 6) == 0) {
            url = argv[i] + 6;
        } else if (strcmp(argv[i], "--token") == 0 && i + 1 < argc) {
            token = argv[++i];
        } else if (strncmp(argv[i], "--token=", 8) == 0) {
            token = argv[i] + 8;
        } else if (!cmd && argv[i][0] != '-') {
            cmd = argv[i];
        } else if (cmd) {
            rest[nrest++] = argv[i];
        } else {
            fprintf(stderr, "kiln: unexpected argument '%s'\n\n", argv[i]);
            usage(stderr);
            free(rest);
            return 2;
        }
    }
    if (!cmd) {
        usage(stderr);
        free(rest);
        return 2;
    }
    if (!url || !url[0])
        url = DEFAULT_URL;
    struct url u;
    bool basic = !strcmp(cmd, "version") || !strcmp(cmd, "health") || !strcmp(cmd, "server") || !strcmp(cmd, "metrics");
    if (!basic && !kiln_cli_jobs_known(cmd)) {
        fprintf(stderr, "kiln: unknown command '%s'\n\n", cmd);
        usage(stderr);
        free(rest);
        return 2;
    }
    if (basic && nrest) {
        fprintf(stderr, "kiln: unexpected argument '%s'\n\n", rest[0]);
        usage(stderr);
        free(rest);
        return 2;
    }
    if (parse_url(url, &u) != 0) {
        free(rest);
        return 2;
    }
    if (!basic) {
        struct kiln_client cl = {u, url, token};
        int rc = kiln_cli_jobs_main(&cl, cmd, nrest, rest);
        free(rest);
        return rc;
    }
    free(rest);
    if (strcmp(cmd, "health") == 0)
        return cmd_health(&u, url);
    if (strcmp(cmd, "server") == 0)
        return cmd_get(&u, url, "/v2", true);
    if (strcmp(cmd, "metrics") == 0)
        return cmd_get(&u, url, "/metrics", false);
    return cmd_version(&u, url);
}
