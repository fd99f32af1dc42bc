/*
 * api/auth.c — bearer-token checking for every endpoint that needs it (auth.h has the rules).
 * Serving, training jobs and the remote tensor endpoint each hold a struct kiln_auth made from
 * the same configured list, so a rule changed here changes for all three.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "auth.h"
#include "responses.h"

struct kiln_auth {
    size_t n;
    char **secret;
    enum kiln_auth_scope *scope;
};

struct kiln_auth *kiln_auth_new(const struct kiln_strlist *tokens, char *err, size_t errlen)
{
    size_t nt = tokens ? tokens->count : 0;
    struct kiln_auth *a = calloc(1, sizeof *a);
    if (a) {
        a->secret = calloc(nt + 1, sizeof *a->secret);
        a->scope = calloc(nt + 1, sizeof *a->scope);
    }
    if (!a || !a->secret || !a->scope) {
        snprintf(err, errlen, "out of memory");
        kiln_auth_free(a);
        return NULL;
    }
    for (size_t i = 0; i < nt; i++) {
        const char *t = tokens->items[i];
        enum kiln_auth_scope sc = KILN_AUTH_READ;
        if (strncmp(t, "admin:", 6) == 0) {
            sc = KILN_AUTH_ADMIN;
            t += 6;
        } else if (strncmp(t, "read:", 5) == 0) {
            t += 5;
        }
        if (!*t || !(a->secret[a->n] = strdup(t))) {
            snprintf(err, errlen, *t ? "out of memory" : "api_tokens: entry %zu has an empty token", i + 1);
            kiln_auth_free(a);
            return NULL;
        }
        a->scope[a->n++] = sc;
    }
    return a;
}

void kiln_auth_free(struct kiln_auth *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->n; i++)
        free(a->secret[i]);
    free(a->secret);
    free(a->scope);
    free(a);
}

bool kiln_auth_enabled(const struct kiln_auth *a)
{
    return a && a->n > 0;
}

const char *kiln_auth_admin_secret(const struct kiln_auth *a)
{
    for (size_t i = 0; a && i < a->n; i++)
        if (a->scope[i] == KILN_AUTH_ADMIN)
            return a->secret[i];
    return NULL;
}

bool kiln_auth_same_secret(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    unsigned char diff = na != nb;
    /* Every byte of a is compared (with b repeated when shorter), so the time says nothing about
     * where, or whether, the two first differ. */
    for (size_t i = 0; i < na; i++)
        diff |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
    return diff == 0;
}

/* The secret after "Bearer " (scheme name in any case, then one or more spaces), or NULL. */
static const char *bearer_secret(const char *h)
{
    if (!h || strncasecmp(h, "Bearer ", 7) != 0)
        return NULL;
    h += 7;
    while (*h == ' ')
        h++;
    return h;
}

enum kiln_auth_scope kiln_auth_scope_of(const struct kiln_auth *a, const char *authorization)
{
    const char *tok = bearer_secret(authorization);
    enum kiln_auth_scope have = KILN_AUTH_NONE;
    if (!tok || !a)
        return have;
    for (size_t i = 0; i < a->n; i++) /* no early exit: each secret costs the same */
        if (kiln_auth_same_secret(tok, a->secret[i]) && a->scope[i] > have)
            have = a->scope[i];
    return have;
}

int kiln_auth_require(const struct kiln_auth *a, const struct kiln_request *req, enum kiln_auth_scope need,
                      const char *forbidden, struct kiln_buf *out)
{
    if (!kiln_auth_enabled(a))
        return 0;
    const char *h = req->headers ? req->headers->authorization : "";
    if (!bearer_secret(h))
        return kiln_resp_error(out, 401, "a bearer token is required", req->keep_alive,
                               "WWW-Authenticate: Bearer\r\n");
    enum kiln_auth_scope have = kiln_auth_scope_of(a, h);
    if (have == KILN_AUTH_NONE)
        return kiln_resp_error(out, 401, "invalid bearer token", req->keep_alive,
                               "WWW-Authenticate: Bearer error=\"invalid_token\"\r\n");
    if (have < need)
        return kiln_resp_error(out, 403, forbidden ? forbidden : "this token lacks the scope this needs",
                               req->keep_alive, "WWW-Authenticate: Bearer error=\"insufficient_scope\"\r\n");
    return 0;
}

bool kiln_auth_host_is_loopback(const char *host)
{
    if (strcmp(host, "localhost") == 0)
        return true;
    unsigned char addr[16];
    if (inet_pton(AF_INET, host, addr) == 1)
        return addr[0] == 127;
    if (inet_pton(AF_INET6, host, addr) != 1)
        return false; /* a name other than localhost may resolve anywhere */
    static const unsigned char loop6[16] = {[15] = 1};
    static const unsigned char mapped[12] = {[10] = 0xff, [11] = 0xff};
    return memcmp(addr, loop6, 16) == 0 || (memcmp(addr, mapped, 12) == 0 && addr[12] == 127);
}

bool kiln_auth_listen_allowed(const char *host, size_t ntokens)
{
    return ntokens > 0 || kiln_auth_host_is_loopback(host);
}
