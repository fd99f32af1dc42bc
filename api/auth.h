/*
 * api/auth.h — bearer tokens: the one set of rules every endpoint that needs a token applies.
 *
 * Tokens come from the configuration (api_tokens) as "admin:SECRET", "read:SECRET" or a bare
 * "SECRET" (read). The admin scope includes read. Rules:
 *   - no tokens configured: every request is allowed (kilnd then refuses to listen beyond
 *     loopback, see kd_auth_listen_allowed);
 *   - otherwise the request needs "Authorization: Bearer SECRET" (the scheme name in any case;
 *     spaces or tabs after the secret are the field's whitespace, not part of the secret):
 *     none, or another scheme, is 401 with WWW-Authenticate: Bearer; an unknown secret is 401
 *     with error="invalid_token"; a known secret without the scope asked for is 403.
 * Secrets are compared in time that does not depend on where they differ, and every configured
 * token is compared on every request.
 *
 *     struct kd_auth *a = kd_auth_new(&cfg.api_tokens, err, sizeof err);
 *     int st = kd_auth_require(a, req, KD_AUTH_ADMIN, "loading needs the admin scope", out);
 *     if (st != 0) return st;     // the 401/403 is in out
 *
 * Thread affinity: read-only once made; any thread.
 */
#ifndef KD_API_AUTH_H
#define KD_API_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include "buf.h"
#include "config.h"
#include "router.h"

enum kd_auth_scope {
    KD_AUTH_NONE = 0,  /* no token, or an unknown one */
    KD_AUTH_READ = 1,  /* metadata, inference, statistics, remote tensor sessions */
    KD_AUTH_ADMIN = 2, /* also model load and unload, training jobs */
};

struct kd_auth;

/* Parses the configured tokens (tokens may be NULL: none). NULL with err filled for an empty secret or no memory. */
struct kd_auth *kd_auth_new(const struct kd_strlist *tokens, char *err, size_t errlen);
void kd_auth_free(struct kd_auth *a);

/* Whether any token is configured (then every request must carry one). */
bool kd_auth_enabled(const struct kd_auth *a);

/* The first admin token's secret (for requests kilnd makes to itself), or NULL. */
const char *kd_auth_admin_secret(const struct kd_auth *a);

/* The scope an Authorization header value grants (KD_AUTH_NONE for a missing, malformed or unknown one). */
enum kd_auth_scope kd_auth_scope_of(const struct kd_auth *a, const char *authorization);

/* What a request's Authorization value (NULL or "" when absent) gets when scope need is asked:
 * one decision for every protocol, each of which words its own answer. */
enum kd_auth_verdict {
    KD_AUTH_ALLOWED,      /* tokens are off, or the token has the scope */
    KD_AUTH_MISSING,      /* no Authorization value */
    KD_AUTH_NOT_BEARER,   /* a value of another scheme */
    KD_AUTH_UNKNOWN,      /* a bearer token that is none of the configured ones */
    KD_AUTH_INSUFFICIENT, /* a known token without the scope */
};
enum kd_auth_verdict kd_auth_check(const struct kd_auth *a, const char *authorization, enum kd_auth_scope need);

/*
 * 0 when req may go on with scope need; otherwise the 401 or 403 JSON error is appended to out
 * (forbidden is the 403's message) and its status returned, or -1 when out of memory.
 */
int kd_auth_require(const struct kd_auth *a, const struct kd_request *req, enum kd_auth_scope need,
                    const char *forbidden, struct kd_buf *out);

/* a == b, in time that depends on the length of a only. */
bool kd_auth_same_secret(const char *a, const char *b);

/* True for loopback listen addresses: "localhost", 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104. */
bool kd_auth_host_is_loopback(const char *host);

/* Whether kilnd may listen on host with ntokens tokens: beyond loopback only with tokens. */
bool kd_auth_listen_allowed(const char *host, size_t ntokens);

#endif /* KD_API_AUTH_H */
