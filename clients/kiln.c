/*
 * clients/kiln.c — the kiln command-line client. A small blocking HTTP/1.1 client (one request
 * per connection, Connection: close) is all it needs to ask a kilnd about its health, metadata
 * and metrics; clients/jobs.c adds training jobs, models and prediction on top of it,
 * clients/watch.c and clients/dashboard.c follow a job. The address and the bearer token come
 * from --url/--token, else KILN_URL/KILN_TOKEN, else the CLI's config file (KILN_CLI_CONFIG;
 * KILN_CONFIG is kilnd's), else http://127.0.0.1:8080 and no token.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "chunked.h"
#include "cli.h"

#define DEFAULT_URL "http://127.0.0.1:8080"
#define TIMEOUT_MS 10000
/* How long the answer to a request that makes kilnd work may take: a job's checks open its device
 * and read its model, a load reads a model, an inference runs to kilnd's own deadline. Given up
 * sooner, the CLI would say "did not answer" of a job kilnd then accepts, inviting a second. */
#define WORK_TIMEOUT_MS 300000
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
        long port = strtol(u->port, NULL, 10);
        if (port < 1 || port > 65535) {
            fprintf(stderr, "kiln: port %s in '%s' is outside 1..65535\n", u->port, text);
            return -1;
        }
    } else {
        snprintf(u->port, sizeof u->port, "80");
    }
    return 0;
bad:
    fprintf(stderr, "kiln: cannot parse URL '%s'\n", text);
    return -1;
}

/* connect() that gives up after timeout_ms: a host that drops SYNs (a firewall, a full
 * backlog) would otherwise hold the CLI for the kernel's two minutes of retries, and the
 * dashboard's screen with it. Returns 0, or -1 with errno set (ETIMEDOUT past the limit). */
static int connect_within(int fd, const struct sockaddr *addr, socklen_t len, int timeout_ms)
{
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
        return -1;
    if (connect(fd, addr, len) != 0) {
        if (errno != EINPROGRESS)
            return -1;
        /* A signal ends the wait (errno EINTR): where one is caught (watch's Ctrl-C), the caller
         * stops at once instead of after the whole timeout. */
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int rc = poll(&p, 1, timeout_ms);
        if (rc == 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        int so_error = 0;
        socklen_t so_len = sizeof so_error;
        if (rc < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &so_len) != 0)
            return -1;
        if (so_error != 0) {
            errno = so_error;
            return -1;
        }
    }
    return fcntl(fd, F_SETFL, flags);
}

int kiln_cli_connect(const struct kiln_client *cl)
{
    const struct url *u = &cl->u;
    const char *shown = cl->shown;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(u->host, u->port, &hints, &res);
    if (rc != 0) {
        if (!cl->quiet)
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
        if (connect_within(fd, ai->ai_addr, ai->ai_addrlen,
                           cl->connect_timeout_ms ? cl->connect_timeout_ms : TIMEOUT_MS) != 0) {
            err = errno;
            close(fd);
            fd = -1;
            if (err == EINTR)
                break;
        }
    }
    if (fd < 0 && err == EINTR) {
        freeaddrinfo(res);
        return -1; /* interrupted: the caller says so */
    }
    freeaddrinfo(res);
    /* KILN_CONFIG is kilnd's file: one who set it for the CLI learns where the CLI's is */
    const char *kilnd_config = getenv("KILN_CONFIG"), *cli_config = getenv("KILN_CLI_CONFIG");
    bool hint = kilnd_config && kilnd_config[0] && !(cli_config && cli_config[0]);
    if (fd < 0 && !cl->quiet)
        fprintf(stderr, "kiln: cannot reach kilnd at %s: %s (is kilnd running? set --url or KILN_URL%s)\n", shown,
                strerror(err), hint ? "; the CLI's config file is KILN_CLI_CONFIG, KILN_CONFIG is kilnd's" : "");
    return fd;
}

static int wait_fd(int fd, short events, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = events};
    int rc;
    do
        rc = poll(&p, 1, timeout_ms);
    while (rc < 0 && errno == EINTR);
    return rc > 0 ? 0 : -1;
}

int kiln_cli_send_all(const struct kiln_client *cl, int fd, const char *p, size_t n)
{
    for (size_t off = 0; off < n;) {
        ssize_t w = send(fd, p + off, n - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (!cl->quiet)
                fprintf(stderr, "kiln: sending to %s failed: %s\n", cl->shown, strerror(errno));
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
    int fd = kiln_cli_connect(cl);
    if (fd < 0)
        return -1;
    /* the token whole, however long: kilnd takes any that fits its header limit */
    bool with_token = cl->token && cl->token[0];
    const char *token = with_token ? cl->token : "";
    static const char form[] = "%s %s%s HTTP/1.1\r\nHost: %s:%s\r\nUser-Agent: kiln/%s\r\nAccept: */*\r\n%s%s%s"
                               "%sContent-Length: %zu\r\n%sConnection: close\r\n\r\n";
#define REQUEST_ARGS                                                                                              \
    method, cl->u.base, path, cl->u.host, cl->u.port, KILN_VERSION, with_token ? "Authorization: Bearer " : "",   \
        token, with_token ? "\r\n" : "", body ? "Content-Type: application/json\r\n" : "", body_len,              \
        extra_headers ? extra_headers : ""
    int n = snprintf(NULL, 0, form, REQUEST_ARGS);
    char *req = n > 0 ? malloc((size_t)n + 1) : NULL;
    if (!req) {
        close(fd);
        return -1;
    }
    snprintf(req, (size_t)n + 1, form, REQUEST_ARGS);
#undef REQUEST_ARGS
    int rc = kiln_cli_send_all(cl, fd, req, (size_t)n);
    free(req);
    if (rc != 0 || (body_len && kiln_cli_send_all(cl, fd, body, body_len) != 0)) {
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
    int answer_ms = strcmp(method, "GET") == 0 ? TIMEOUT_MS : WORK_TIMEOUT_MS;
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
        if (wait_fd(fd, POLLIN, answer_ms) != 0) {
            fprintf(stderr, "kiln: %s did not answer within %d s%s\n", shown, answer_ms / 1000,
                    answer_ms == WORK_TIMEOUT_MS
                        ? "; what was asked may still be done (kiln jobs, kiln models show it)"
                        : "");
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
    if (kiln_is_chunked(buf, end + 2)) {
        /* a proxy's framing (kilnd sends lengths): the payload, decoded where it lies */
        struct kiln_dechunk d = {0};
        long n = kiln_dechunk(&d, end + 4, r->body_len, end + 4);
        if (n < 0) {
            fprintf(stderr, "kiln: %s answered with a broken chunked body\n", shown);
            free(buf);
            memset(r, 0, sizeof *r);
            return -1;
        }
        r->body_len = (size_t)n;
        end[4 + n] = '\0';
    }
    return 0;
fail:
    free(buf);
    close(fd);
    return -1;
}

static int request(const struct kiln_client *cl, const char *path, struct response *r)
{
    return kiln_cli_request(cl, "GET", path, NULL, 0, r);
}

/* The "error" field of a JSON error body, or the body itself. */
cJSON *kiln_cli_parse_json(const char *text, size_t len, char *whyb, size_t whylen)
{
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    size_t at = end && end >= text ? (size_t)(end - text) : 0;
    if (!j) {
        snprintf(whyb, whylen, "is not valid JSON (at byte %zu)", at);
        return NULL;
    }
    while (at < len && (text[at] == ' ' || text[at] == '\t' || text[at] == '\r' || text[at] == '\n'))
        at++;
    if (at < len && text[at] != '\0') {
        cJSON_Delete(j);
        snprintf(whyb, whylen,
                 "has more after its JSON value (at byte %zu): give one value, e.g. [[1, 2], [3, 4]] for a batch "
                 "of two rows",
                 at);
        return NULL;
    }
    return j;
}

void kiln_cli_print_error(const char *what, const struct response *r)
{
    cJSON *j = cJSON_ParseWithLength(r->body, r->body_len);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (cJSON_IsString(e))
        fprintf(stderr, "kiln: %s: HTTP %d: %s\n", what, r->status, e->valuestring);
    else
        /* not kilnd's JSON error: whatever answered (a proxy, another server) is shown, or said
         * to have answered nothing */
        fprintf(stderr, "kiln: %s: HTTP %d %s%.*s\n", what, r->status,
                r->body_len ? "from something that is not kilnd: "
                            : "with no body: not kilnd's answer (is the URL right?)",
                (int)(r->body_len > 300 ? 300 : r->body_len), r->body);
    cJSON_Delete(j);
}

static int cmd_health(const struct kiln_client *cl)
{
    struct response live, ready;
    if (request(cl, "/v2/health/live", &live) != 0)
        return 2;
    int rc = request(cl, "/v2/health/ready", &ready);
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

static int cmd_get(const struct kiln_client *cl, const char *path, bool json)
{
    struct response r;
    if (request(cl, path, &r) != 0)
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

static int cmd_version(const struct kiln_client *cl)
{
    printf("kiln client %s\n", KILN_VERSION);
    struct response r;
    if (request(cl, "/v2", &r) != 0)
        return 2;
    if (r.status != 200) {
        kiln_cli_print_error("version", &r);
        free(r.raw);
        return 1;
    }
    cJSON *j = cJSON_ParseWithLength(r.body, r.body_len);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "version"),
                *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    int rc = 0;
    if (cJSON_IsString(v) && cJSON_IsString(name) && !strcmp(name->valuestring, "kiln")) {
        printf("kilnd server %s (%s)\n", v->valuestring, cl->shown);
    } else {
        /* a 200 from something else (a proxy's page, another server's /v2) is not kilnd's version */
        fprintf(stderr, "kiln: version: %s/v2 did not answer as kilnd does (server metadata named \"kiln\")\n",
                cl->shown);
        rc = 1;
    }
    cJSON_Delete(j);
    free(r.raw);
    return rc;
}

/* The CLI's config file: $KILN_CLI_CONFIG, else $XDG_CONFIG_HOME/kiln/cli.json, else
 * ~/.config/kiln/cli.json; {"url": "...", "token": "..."}. KILN_CONFIG names kilnd's file, whose
 * keys are others: the CLI never reads it. A missing default file is not an error; a file that is
 * there but unreadable, not such an object or with another key is (the user meant something by
 * it: a misspelt "token" would otherwise end in a 401 with no hint). */
static int read_config(char **url, char **token)
{
    char path[4096];
    const char *explicit = getenv("KILN_CLI_CONFIG"), *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    if (explicit && explicit[0])
        snprintf(path, sizeof path, "%s", explicit);
    else if (xdg && xdg[0])
        snprintf(path, sizeof path, "%s/kiln/cli.json", xdg);
    else if (home && home[0])
        snprintf(path, sizeof path, "%s/.config/kiln/cli.json", home);
    else
        return 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT && !(explicit && explicit[0]))
            return 0;
        fprintf(stderr, "kiln: cannot open config file %s: %s\n", path, strerror(errno));
        return -1;
    }
    char text[16384];
    size_t n = fread(text, 1, sizeof text - 1, f);
    bool big = n == sizeof text - 1 && fgetc(f) != EOF;
    if (ferror(f)) {
        fprintf(stderr, "kiln: cannot read config file %s: %s\n", path, strerror(errno));
        fclose(f);
        return -1;
    }
    fclose(f);
    char bad[300] = "";
    cJSON *j = big ? NULL : kiln_cli_parse_json(text, n, bad, sizeof bad);
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "url"), *t = cJSON_GetObjectItemCaseSensitive(j, "token");
    if (!cJSON_IsObject(j) || (u && !cJSON_IsString(u)) || (t && !cJSON_IsString(t))) {
        fprintf(stderr, "kiln: config file %s: expected a JSON object {\"url\": \"http://...\", \"token\": \"...\"}\n",
                path);
        cJSON_Delete(j);
        return -1;
    }
    int unknown = 0;
    char names[512] = "";
    for (const cJSON *c = j->child; c; c = c->next) {
        size_t used = strlen(names);
        if (strcmp(c->string, "url") != 0 && strcmp(c->string, "token") != 0)
            snprintf(names + used, sizeof names - used, "%s'%.100s'", unknown++ ? ", " : "", c->string);
    }
    if (unknown) {
        fprintf(stderr,
                "kiln: config file %s: unknown key%s %s (it may hold url and token; kilnd's file is "
                "another, named by KILN_CONFIG)\n",
                path, unknown > 1 ? "s" : "", names);
        cJSON_Delete(j);
        return -1;
    }
    *url = u ? strdup(u->valuestring) : NULL;
    *token = t ? strdup(t->valuestring) : NULL;
    cJSON_Delete(j);
    return 0;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kiln [--url URL] [--token T] COMMAND [ARGS]\n\n"
            "Commands:\n"
            "  health     is kilnd live and ready? (exit 0 when both)\n"
            "  server     server metadata (KServe v2 GET /v2)\n"
            "  metrics    Prometheus metrics (GET /metrics)\n"
            "  version    client and server versions\n"
            "%s\n"
            "Options:\n"
            "  --url URL  kilnd address\n"
            "  --token T  bearer token\n"
            "  --help     this text\n"
            "  --version  this client's version (the command version asks the server too)\n\n"
            "The address and token come from the flags, else $KILN_URL and $KILN_TOKEN, else the CLI's\n"
            "config file ($KILN_CLI_CONFIG, else $XDG_CONFIG_HOME/kiln/cli.json or ~/.config/kiln/cli.json:\n"
            "{\"url\": \"http://host:port\", \"token\": \"...\"}, no other keys; $KILN_CONFIG is kilnd's file\n"
            "and is not read); the address defaults to %s.\n\n"
            "Exit status: 0 success (watch: the job succeeded), 1 the server answered with an error (watch:\n"
            "the job failed or was cancelled), 2 it could not be reached or the command itself was wrong (a\n"
            "usage error, a local file that cannot be read), 3 watch left with q while the job goes on,\n"
            "130 interrupted by Ctrl-C while watching (143 for SIGTERM; the job goes on either way).\n",
            kiln_cli_jobs_usage, DEFAULT_URL);
}

static int run(int argc, char **argv, char **rest)
{
    const char *url = NULL, *token = NULL, *cmd = NULL;
    int nrest = 0;
    /* Options may come anywhere; what is not ours goes to the command, in order. */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--version") == 0) { /* this program's own, asking no server */
            printf("kiln %s\n", KILN_VERSION);
            return 0;
        } else if ((strcmp(argv[i], "--url") == 0 || strcmp(argv[i], "--token") == 0) && i + 1 == argc) {
            fprintf(stderr, "kiln: option %s needs a value\n\n", argv[i]);
            usage(stderr);
            return 2;
        } else if (strcmp(argv[i], "--url") == 0) {
            url = argv[++i];
        } else if (strncmp(argv[i], "--url=", 6) == 0) {
            url = argv[i] + 6;
        } else if (strcmp(argv[i], "--token") == 0) {
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
            return 2;
        }
    }
    if (!cmd) {
        usage(stderr);
        return 2;
    }
    bool basic = !strcmp(cmd, "version") || !strcmp(cmd, "health") || !strcmp(cmd, "server") || !strcmp(cmd, "metrics");
    if (!basic && !kiln_cli_jobs_known(cmd)) {
        fprintf(stderr, "kiln: unknown command '%s'\n\n", cmd);
        usage(stderr);
        return 2;
    }
    if (basic && nrest) {
        fprintf(stderr, "kiln: unexpected argument '%s'\n\n", rest[0]);
        usage(stderr);
        return 2;
    }
    /* Flags, then the environment, then the config file (read only when something is missing). */
    if (!url || !url[0])
        url = getenv("KILN_URL");
    const char *token_from = "--token";
    if (!token || !token[0]) {
        token = getenv("KILN_TOKEN");
        token_from = "KILN_TOKEN";
    }
    char *cfg_url = NULL, *cfg_token = NULL;
    if ((!url || !url[0] || !token || !token[0]) && read_config(&cfg_url, &cfg_token) != 0)
        return 2;
    if (!url || !url[0])
        url = cfg_url;
    if (!token || !token[0]) {
        token = cfg_token;
        token_from = "the config file's \"token\"";
    }
    if (!url || !url[0])
        url = DEFAULT_URL;
    struct kiln_client cl = {.shown = url, .token = token};
    int rc = 2;
    size_t bad_at = token ? strcspn(token, "\x01\x02\x03\x04\x05\x06\x07\x08\t\n\x0b\x0c\r\x0e\x0f\x10\x11\x12"
                                           "\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f\x7f ")
                          : 0;
    if (token && token[bad_at]) {
        /* sent as it is, a newline would end the header and the rest would be read as another */
        fprintf(stderr,
                "kiln: the token from %s holds %s at character %zu; a token is printable characters only (a "
                "newline at its end, from a file or echo, is the usual cause)\n",
                token_from, token[bad_at] == ' ' ? "a space" : "a control character", bad_at + 1);
        rc = 2;
    } else if (parse_url(url, &cl.u) != 0)
        rc = 2;
    else if (!basic)
        rc = kiln_cli_jobs_main(&cl, cmd, nrest, rest);
    else if (strcmp(cmd, "health") == 0)
        rc = cmd_health(&cl);
    else if (strcmp(cmd, "server") == 0)
        rc = cmd_get(&cl, "/v2", true);
    else if (strcmp(cmd, "metrics") == 0)
        rc = cmd_get(&cl, "/metrics", false);
    else
        rc = cmd_version(&cl);
    free(cfg_url);
    free(cfg_token);
    return rc;
}

int main(int argc, char **argv)
{
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest)
        return 2;
    int rc = run(argc, argv, rest);
    free(rest);
    return rc;
}
