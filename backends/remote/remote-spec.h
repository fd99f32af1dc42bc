/*
 * backends/remote/remote-spec.h — the one parser of a remote device's spec,
 * "remote://host:port/device" (an IPv6 host in brackets: "remote://[::1]:8080/cpu").
 *
 * The engine checks a spec with it before it picks the backend (engine/device.c), and the
 * remote backend takes the host, port and device from it when it connects (remote.c), so the
 * two never disagree about what a spec means. Options ("?token=...") are cut off by the
 * engine before either sees the spec.
 */
#ifndef KILN_REMOTE_SPEC_H
#define KILN_REMOTE_SPEC_H

#include <stddef.h>

#define KILN_REMOTE_HOST_MAX 255
#define KILN_REMOTE_DEVICE_MAX 63 /* KILN_WIRE_NAME_MAX: the name travels in the hello */

typedef struct kiln_remote_addr {
    char host[KILN_REMOTE_HOST_MAX + 1];     /* without brackets, as getaddrinfo takes it */
    int port;                                /* 1..65535 */
    char device[KILN_REMOTE_DEVICE_MAX + 1]; /* the server's device spec, one name ("cpu", "cuda:0") */
} kiln_remote_addr;

/* Parses spec into *out. Returns 0, or -1 with a message in why (why_len bytes) naming what is
 * wrong with the spec and showing the form expected; the message does not quote the spec. */
int kiln_remote_spec_parse(const char *spec, kiln_remote_addr *out, char *why, size_t why_len);

#endif
