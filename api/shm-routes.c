/*
 * api/shm-routes.c — Triton's system shared-memory extension over HTTP, on the table in shm.c:
 *
 *   GET  /v2/systemsharedmemory[/region/<name>]/status      read scope: [{"name","key","offset","byte_size"}]
 *   POST /v2/systemsharedmemory/region/<name>/register       admin scope, body {"key","offset","byte_size"}
 *   POST /v2/systemsharedmemory[/region/<name>]/unregister   admin scope (no name: every region)
 *
 * The CUDA shared-memory extension (/v2/cudasharedmemory) answers 501: kilnd maps no device
 * memory a client hands it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "json-keys-impl.h"
#include "serving-impl.h"
#include "shm.h"

static int answer(struct kd_buf *out, const struct kd_request *req, const char *rid, int status, const char *body,
                  const char *msg)
{
    if (status != 200)
        return kd_serving_error_with_id(out, status, msg, req->keep_alive, rid, NULL);
    char hdr[256];
    snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n", rid);
    return kd_resp_append(out, 200, "application/json", body, strlen(body), req->keep_alive, hdr);
}

struct status_json {
    struct kd_buf b;
    int rc;
};

static void status_row(void *ud, const char *name, const char *key, uint64_t offset, uint64_t byte_size)
{
    struct status_json *s = ud;
    s->rc |= kd_buf_puts(&s->b, s->b.len > 1 ? ",{\"name\":\"" : "{\"name\":\"");
    s->rc |= kd_buf_json_escape(&s->b, name, strlen(name));
    s->rc |= kd_buf_puts(&s->b, "\",\"key\":\"");
    s->rc |= kd_buf_json_escape(&s->b, key, strlen(key));
    s->rc |= kd_buf_printf(&s->b, "\",\"offset\":%llu,\"byte_size\":%llu}", (unsigned long long)offset,
                           (unsigned long long)byte_size);
}

/* A JSON number that is a whole number in 0..2^53 into *v; false otherwise (absent: def). */
static bool size_member(const cJSON *j, const char *key, bool required, uint64_t def, uint64_t *v)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!x) {
        *v = def;
        return !required;
    }
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 9007199254740992.0 ||
        x->valuedouble != (double)(uint64_t)x->valuedouble)
        return false;
    *v = (uint64_t)x->valuedouble;
    return true;
}

/* The member of offset and byte_size that is a number past what a double holds exactly (2^53),
 * or NULL: no region is that large, and the register body's generic shape would not say which
 * value was wrong. */
static const cJSON *too_large(const cJSON *j)
{
    static const char *const keys[] = {"offset", "byte_size"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, keys[i]);
        if (cJSON_IsNumber(x) && x->valuedouble > 9007199254740992.0)
            return x;
    }
    return NULL;
}

static int do_register(struct kd_shm_table *t, const char *name, const struct kd_request *req, char *msg, size_t n)
{
    cJSON *j = req->body_len ? cJSON_ParseWithLength(req->body, req->body_len) : NULL;
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(j, "key");
    uint64_t offset = 0, size = 0;
    int st = 400;
    const cJSON *big = cJSON_IsObject(j) ? too_large(j) : NULL;
    if (j && kiln__json_nul_escape_at(req->body, req->body_len) >= 0) /* "/k\u0000../x" read as "/k" */
        snprintf(msg, n, "the register body holds \\u0000 (a NUL character) in a string; a key cannot");
    else if (big)
        snprintf(msg, n, "%s is %g, larger than any shared-memory region (2^53 bytes at most)", big->string,
                 big->valuedouble);
    else if (!cJSON_IsObject(j) || !cJSON_IsString(key) || !size_member(j, "offset", false, 0, &offset) ||
             !size_member(j, "byte_size", true, 0, &size))
        snprintf(msg, n,
                 "the register body is {\"key\": string, \"offset\": non-negative integer (optional), "
                 "\"byte_size\": positive integer}");
    else
        st = kd_shm_register(t, name, key->valuestring, offset, size, msg, n);
    cJSON_Delete(j);
    return st;
}

int kd_serving_handle_shm(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    struct kd_serving *sv = ctx;
    char rid[KD_HTTP_SHORT_HEADER_MAX], msg[320], name[KD_SHM_NAME_MAX + 1] = "";
    kd_serving_request_id(sv, req, rid, sizeof rid);
    static const char prefix[] = "/v2/systemsharedmemory/";
    static const char region[] = "region/";
    const char *p = req->path + sizeof prefix - 1;
    size_t len = req->path_len - (sizeof prefix - 1);
    if (req->path_len < sizeof prefix - 1 || memcmp(req->path, prefix, sizeof prefix - 1) != 0)
        return answer(out, req, rid, 404, NULL, "no route for this shared-memory path");
    bool named = len > sizeof region - 1 && memcmp(p, region, sizeof region - 1) == 0;
    if (named) {
        p += sizeof region - 1;
        len -= sizeof region - 1;
        const char *slash = memchr(p, '/', len);
        size_t nl = slash ? (size_t)(slash - p) : len;
        if (!slash || nl > KD_SHM_NAME_MAX)
            return answer(out, req, rid, slash ? 400 : 404, NULL,
                          slash ? "invalid shared memory region name" : "no route for this shared-memory path");
        memcpy(name, p, nl);
        name[nl] = '\0';
        if (!kd_shm_name_valid(name))
            return answer(out, req, rid, 400, NULL, "invalid shared memory region name");
        p += nl + 1;
        len -= nl + 1;
    }
    enum {
        STATUS,
        REGISTER,
        UNREGISTER,
        NONE
    } action = NONE;
    if (len == 6 && memcmp(p, "status", 6) == 0)
        action = STATUS;
    else if (len == 8 && memcmp(p, "register", 8) == 0 && named)
        action = REGISTER;
    else if (len == 10 && memcmp(p, "unregister", 10) == 0)
        action = UNREGISTER;
    if (action == NONE)
        return answer(out, req, rid, 404, NULL, "no route for this shared-memory path");
    unsigned want = action == STATUS ? KD_HTTP_GET : KD_HTTP_POST;
    if (!(req->method & want))
        return kd_serving_error_with_id(out, 405, action == STATUS ? "use GET" : "use POST", req->keep_alive, rid,
                                        action == STATUS ? "Allow: GET\r\n" : "Allow: POST\r\n");
    int st = kd_serving_authorize(sv, req, action == STATUS ? KD_AUTH_READ : KD_AUTH_ADMIN, out);
    if (st != 0)
        return st;
    struct kd_shm_table *t = kd_serving_shm(sv);
    if (action == REGISTER) {
        st = do_register(t, name, req, msg, sizeof msg);
        return answer(out, req, rid, st ? st : 200, "{}", msg);
    }
    if (action == UNREGISTER) {
        st = kd_shm_unregister(t, name, msg, sizeof msg);
        return answer(out, req, rid, st ? st : 200, "{}", msg);
    }
    struct status_json s = {0};
    s.rc = kd_buf_puts(&s.b, "[");
    st = kd_shm_status(t, name, status_row, &s, msg, sizeof msg);
    s.rc |= kd_buf_append(&s.b, "]", 2); /* with the NUL */
    int rc = s.rc ? answer(out, req, rid, 500, NULL, "out of memory")
                  : answer(out, req, rid, st ? st : 200, s.b.data, msg);
    kd_buf_free(&s.b);
    return rc;
}
