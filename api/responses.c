/*
 * api/responses.c — status reasons and whole-response builders.
 */
#include <stdio.h>
#include <string.h>

#include "responses.h"

/* Every status kilnd sends, and the other common server errors, so that no status line reads
 * "Unknown" (clients print the line as they got it). Phrases as RFC 9110 section 15 spells them. */
const char *kd_http_reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Content";
    case 426: return "Upgrade Required";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    case 507: return "Insufficient Storage"; /* RFC 4918 */
    }
    return "Unknown";
}

int kd_resp_append(struct kd_buf *out, int status, const char *content_type, const void *body, size_t body_len,
                   bool keep_alive, const char *extra_headers)
{
    size_t mark = out->len;
    int rc = kd_buf_printf(out,
                           "HTTP/1.1 %d %s\r\n"
                           "Server: kiln\r\n"
                           "%s%s%s"
                           "Content-Length: %zu\r\n"
                           "Connection: %s\r\n"
                           "%s\r\n",
                           status, kd_http_reason(status), content_type ? "Content-Type: " : "",
                           content_type ? content_type : "", content_type ? "\r\n" : "", body_len,
                           keep_alive ? "keep-alive" : "close", extra_headers ? extra_headers : "");
    if (rc == 0)
        rc = kd_buf_append(out, body, body_len);
    if (rc != 0) {
        out->len = mark; /* never leave half a response behind */
        return -1;
    }
    return status;
}

int kd_resp_error(struct kd_buf *out, int status, const char *msg, bool keep_alive, const char *extra_headers)
{
    char body[1280];
    /* Messages are short and ours, so a capped stack buffer is enough. */
    size_t n = 0;
    n += (size_t)snprintf(body, sizeof body, "{\"error\":\"");
    for (const char *p = msg; *p && n < sizeof body - 8; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\') {
            body[n++] = '\\';
            body[n++] = (char)c;
        } else if (c < 0x20 || c >= 0x7f) {
            body[n++] = '?'; /* keeps the body valid JSON whatever bytes a reason quotes */
        } else {
            body[n++] = (char)c;
        }
    }
    memcpy(body + n, "\"}", 2);
    n += 2;
    return kd_resp_append(out, status, "application/json", body, n, keep_alive, extra_headers);
}
