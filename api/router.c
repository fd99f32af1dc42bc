/*
 * api/router.c — matching a request's method and path against a route table. Tables are small
 * (tens of routes), so a linear scan with memcmp beats any cleverer structure here.
 */
#include <stdio.h>
#include <string.h>

#include "router.h"

static const struct {
    unsigned bit;
    const char *name;
} method_names[] = {
    {KD_HTTP_GET, "GET"},       {KD_HTTP_HEAD, "HEAD"},   {KD_HTTP_POST, "POST"},       {KD_HTTP_PUT, "PUT"},
    {KD_HTTP_DELETE, "DELETE"}, {KD_HTTP_PATCH, "PATCH"}, {KD_HTTP_OPTIONS, "OPTIONS"},
};

unsigned kd_http_method_from_name(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof method_names / sizeof method_names[0]; i++)
        if (strlen(method_names[i].name) == len && memcmp(method_names[i].name, name, len) == 0)
            return method_names[i].bit;
    return KD_HTTP_OTHER;
}

enum kd_route_result kd_router_match(const struct kd_router *r, unsigned method, const char *path, size_t len,
                                     size_t *index)
{
    for (size_t i = 0; i < r->count; i++) {
        const struct kd_route *rt = &r->routes[i];
        size_t n = strlen(rt->path);
        bool prefix = n > 0 && rt->path[n - 1] == '*';
        if (prefix ? (len < n - 1 || memcmp(rt->path, path, n - 1) != 0)
                   : (n != len || memcmp(rt->path, path, len) != 0))
            continue;
        *index = i;
        return (kd_router_methods(r, i, path, len) & method) ? KD_ROUTE_FOUND : KD_ROUTE_METHOD_NOT_ALLOWED;
    }
    *index = r->count;
    return KD_ROUTE_NOT_FOUND;
}

unsigned kd_router_methods(const struct kd_router *r, size_t index, const char *path, size_t path_len)
{
    if (index >= r->count)
        return 0;
    const struct kd_route *rt = &r->routes[index];
    size_t n = strlen(rt->path);
    unsigned m = rt->methods;
    if (rt->methods_at && n > 0 && rt->path[n - 1] == '*' && path_len >= n - 1) {
        unsigned at = rt->methods_at(path + n - 1, path_len - (n - 1));
        if (at)
            m = at & rt->methods;
    }
    /* RFC 9110 9.3.2: a server that answers GET answers HEAD the same way, without the body
     * (http-conn.c runs the GET handler and cuts the body), so no table lists HEAD itself. */
    return m & KD_HTTP_GET ? m | KD_HTTP_HEAD : m;
}

void kd_router_allow(const struct kd_router *r, size_t index, const char *path, size_t path_len, char *buf,
                     size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    if (index >= r->count)
        return;
    unsigned methods = kd_router_methods(r, index, path, path_len);
    for (size_t i = 0; i < sizeof method_names / sizeof method_names[0] && used < len; i++)
        if (methods & method_names[i].bit)
            used += (size_t)snprintf(buf + used, len - used, "%s%s", used ? ", " : "", method_names[i].name);
}

static int hex_value(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

int kd_http_path_decode(const char *path, size_t len, char *out, size_t *out_len, const char **why)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (path[i] != '%') {
            out[n++] = path[i];
            continue;
        }
        int hi = i + 2 < len ? hex_value(path[i + 1]) : -1, lo = hi >= 0 ? hex_value(path[i + 2]) : -1;
        if (lo < 0) {
            *why = "malformed percent-encoding in the request path: '%' must be followed by two hex digits";
            return -1;
        }
        char ch = (char)(hi * 16 + lo);
        /* Decoded once only: "%252F" stays "%2F" text, so nothing decodes into a separator later. */
        if (ch == '/' || ch == '\0') {
            *why = ch == '/' ? "an encoded '/' (%2F) in the request path is not accepted: no name holds a '/'"
                             : "an encoded NUL (%00) in the request path is not accepted";
            return -1;
        }
        out[n++] = ch;
        i += 2;
    }
    *out_len = n;
    return 0;
}
