/*
 * api/responses.h — building HTTP/1.1 responses. Every response is produced whole (status line,
 * headers, body) into one buffer so it leaves in a single write; error bodies are always
 * {"error": "..."} with Content-Type application/json.
 */
#ifndef KD_API_RESPONSES_H
#define KD_API_RESPONSES_H

#include <stdbool.h>
#include <stddef.h>

#include "buf.h"

const char *kd_http_reason(int status);

/*
 * Appends a complete response; content_type may be NULL for an empty body. extra_headers is NULL or CRLF-terminated header lines.
 * Returns status, or -1 when out of memory.
 */
int kd_resp_append(struct kd_buf *out, int status, const char *content_type, const void *body, size_t body_len,
                   bool keep_alive, const char *extra_headers);

/* Appends {"error": msg} with the given status. Returns status, or -1. */
int kd_resp_error(struct kd_buf *out, int status, const char *msg, bool keep_alive, const char *extra_headers);

#endif /* KD_API_RESPONSES_H */
