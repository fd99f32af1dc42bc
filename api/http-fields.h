/*
 * api/http-fields.h — the request header fields a connection keeps (internal to http-conn.c).
 *
 * Each kept field's value is gathered whole, in a buffer of the connection's, as llhttp hands it
 * over in spans; the header block's bound (max_header_bytes, counted by http-conn.c) is the only
 * bound on them. Once the block is complete, kd_http_fields_keep hands the values to handlers
 * through conn->headers and checks the ones the connection itself acts on.
 */
#ifndef KD_API_HTTP_FIELDS_H
#define KD_API_HTTP_FIELDS_H

#include <stdbool.h>
#include <stddef.h>

#include "http-conn.h"

/* Kept fields the connection reads itself, for kd_http_field. */
enum kd_http_field_id {
    KD_FIELD_EXPECT = KD_HTTP_KEPT_FIELDS - 2,
    KD_FIELD_TRANSFER_ENCODING = KD_HTTP_KEPT_FIELDS - 1,
};

/* A new request: every kept field empty, conn->headers all "". */
void kd_http_fields_reset(struct kd_http_conn *c);

/*
 * One span of a field value; line_start for the first span of a field line. The field's name is
 * in conn->header_name. Kept when it is one kilnd reads and the header block is not over yet
 * (trailer fields are never kept). 0, or -1 when out of memory.
 */
int kd_http_fields_add(struct kd_http_conn *c, const char *at, size_t n, bool line_start);

/*
 * The header block is complete: fills conn->headers and checks Transfer-Encoding. 0; a status
 * with *why set when the request is refused (400, 415, 501); -1 when out of memory.
 */
int kd_http_fields_keep(struct kd_http_conn *c, const char **why);

/* A kept field's value after kd_http_fields_keep: NUL-terminated, "" when absent. */
const char *kd_http_field(const struct kd_http_conn *c, enum kd_http_field_id id);

#endif /* KD_API_HTTP_FIELDS_H */
