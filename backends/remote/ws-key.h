/*
 * backends/remote/ws-key.h — the WebSocket opening handshake's key arithmetic (RFC 6455 section
 * 4.2.2), shared by kilnd's /v1/tensor endpoint (api/ws.c), which answers with the accept value,
 * and the remote backend's connection (remote-conn.c), which sends a key and checks the answer.
 */
#ifndef KILN_REMOTE_WS_KEY_H
#define KILN_REMOTE_WS_KEY_H

#include <stddef.h>
#include <stdint.h>

/* Standard base64 (with '=' padding) of n bytes into out, which holds 4 * ceil(n / 3) + 1 bytes. */
void kiln__ws_base64(const uint8_t *p, size_t n, char *out);

/* Sec-WebSocket-Accept for a Sec-WebSocket-Key: base64(SHA-1(key + the RFC's GUID)), 28
 * characters and a NUL. Keys longer than 128 bytes are cut there (valid keys have 24). */
void kiln__ws_accept_key(const char *key, char out[29]);

#endif /* KILN_REMOTE_WS_KEY_H */
