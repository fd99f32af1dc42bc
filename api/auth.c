/*
 * api/auth.c — bearer-token checking for every endpoint that needs it (auth.h has the rules).
 * Serving, training jobs and the remote tensor endpoint each hold a struct kd_auth made from
 * the same configured list, so a rule changed here changes for all three.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "auth.h"
#include "responses.h"

struct kd_auth {
    size_t n;
    char **secret;
    enum kd_auth_scope *scope;
};

struct kd_auth *kd_auth_new(const struct kd_strlist *tokens, char *err, size_t errlen)
{
    size_t nt = tokens ? tokens->count : 0;
    struct kd_auth *a = calloc(1, sizeof *a);
    if (a) {
        a->secret = calloc(nt + 1, sizeof *a->secret);
        a->scope = calloc(nt + 1, sizeof *a->scope);
    }
    if (!a || !a->secret || !a->scope) {
        snprintf(err, errlen, "out of memory");
        kd_auth_free(a);
        return NULL;
    }
    for (size_t i = 0; i < nt; i++) {
        const char *t = tokens->items[i];
        enum kd_auth_scope sc = KD_AUTH_READ;
        if (strncmp(t, "admin:", 6) == 0) {
            sc = KD_AUTH_ADMIN;
            t += 6;
        } else if (strncmp(t, "read:", 5) == 0) {
            t += 5;
        }
        if (!*t || !(a->secret[a->n] = strdup(t))) {
            snprintf(err, errlen, *t ? "out of memory" : "api_tokens: entry %zu has an empty token", i + 1);
            kd_auth_free(a);
            return NULL;
        }
        a->scope[a->n++] = sc;
    }
    return a;
}

void kd_auth_free(struct kd_auth *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->n; i++)
        free(a->secret[i]);
    free(a->secret);
    free(a->scope);
    free(a);
}

bool kd_auth_enabled(const struct kd_auth *a)
{
    return a && a->n > 0;
}

const char *kd_auth_admin_secret(const struct kd_auth *a)
{
    for (size_t i = 0; a && i < a->n; i++)
        if (a->scope[i] == KD_AUTH_ADMIN)
            return a->secret[i];
    return NULL;
}

/* Whether the na bytes at a are the secret b (see kd_auth_same_secret). */
static bool same_secret_n(const char *a, size_t na, const char *b)
{
    size_t nb = strlen(b);
    unsigned char diff = na != nb;
    /* Every byte of a is compared (with b repeated when shorter), so the time says nothing about
     * where, or whether, the two first differ. */
    for (size_t i = 0; i < na; i++)
        diff |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
    return diff == 0;
}

bool kd_auth_same_secret(const char *a, const char *b)
{
    return same_secret_n(a, strlen(a), b);
}

/*
 * The secret after "Bearer " (scheme name in any case, then one or more spaces), or NULL; *len
 * is its length without trailing spaces and tabs: RFC 9110 5.5 makes the whitespace around a
 * field value no part of it, and the parser leaves trailing whitespace in the value it hands on.
 */
static const char *bearer_secret(const char *h, size_t *len)
{
    if (!h || strncasecmp(h, "Bearer ", 7) != 0)
        return NULL;
    h += 7;
    while (*h == ' ')
        h++;
    size_t n = strlen(h);
    while (n > 0 && (h[n - 1] == ' ' || h[n - 1] == '\t'))
        n--;
    *len = n;
    return h;
}

enum kd_auth_scope kd_auth_scope_of(const struct kd_auth *a, const char *authorization)
{
    size_t len = 0;
    const char *tok = bearer_secret(authorization, &len);
    enum kd_auth_scope have = KD_AUTH_NONE;
    if (!tok || !a)
        return have;
    for (size_t i = 0; i < a->n; i++) /* no early exit: each secret costs the same */
        if (same_secret_n(tok, len, a->secret[i]) && a->scope[i] > have)
            have = a->scope[i];
    return have;
}

enum kd_auth_verdict kd_auth_check(const struct kd_auth *a, const char *authorization, enum kd_auth_scope need)
{
    if (!kd_auth_enabled(a))
        return KD_AUTH_ALLOWED;
    if (!authorization || !authorization[0])
        return KD_AUTH_MISSING;
    size_t len;
    if (!bearer_secret(authorization, &len))
        return KD_AUTH_NOT_BEARER;
    enum kd_auth_scope have = kd_auth_scope_of(a, authorization);
    if (have == KD_AUTH_NONE)
        return KD_AUTH_UNKNOWN;
    return have < need ? KD_AUTH_INSUFFICIENT : KD_AUTH_ALLOWED;
}

int kd_auth_require(const struct kd_auth *a, const struct kd_request *req, enum kd_auth_scope need,
                    const char *forbidden, struct kd_buf *out)
{
    switch (kd_auth_check(a, req->headers ? req->headers->authorization : "", need)) {
    case KD_AUTH_ALLOWED: return 0;
    case KD_AUTH_MISSING:
    case KD_AUTH_NOT_BEARER:
        return kd_resp_error(out, 401, "a bearer token is required", req->keep_alive,
                             "WWW-Authenticate: Bearer\r\n");
    case KD_AUTH_UNKNOWN:
        return kd_resp_error(out, 401, "invalid bearer token", req->keep_alive,
                             "WWW-Authenticate: Bearer error=\"invalid_token\"\r\n");
    case KD_AUTH_INSUFFICIENT: break;
    }
    return kd_resp_error(out, 403, forbidden ? forbidden : "this token lacks the scope this needs",
                         req->keep_alive, "WWW-Authenticate: Bearer error=\"insufficient_scope\"\r\n");
}

bool kd_auth_host_is_loopback(const char *host)
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

bool kd_auth_listen_allowed(const char *host, size_t ntokens)
{
    return ntokens > 0 || kd_auth_host_is_loopback(host);
}
