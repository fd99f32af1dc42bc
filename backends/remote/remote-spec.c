/*
 * backends/remote/remote-spec.c — remote://host:port/device taken apart (remote-spec.h).
 */
#include "remote-spec.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define FORM "remote://host:port/device, an IPv6 address in brackets: remote://[::1]:8080/cpu"

static int refuse(char *why, size_t why_len, const char *what)
{
    snprintf(why, why_len, "%s (expected " FORM ")", what);
    return -1;
}

int kiln_remote_spec_parse(const char *spec, kiln_remote_addr *out, char *why, size_t why_len)
{
    static const char scheme[] = "remote://";
    if (!spec || strncmp(spec, scheme, sizeof scheme - 1) != 0)
        return refuse(why, why_len, "not a remote spec");
    const char *host = spec + sizeof scheme - 1, *host_end, *colon;
    bool bracketed = host[0] == '[';
    if (bracketed) {
        const char *close = strchr(host, ']');
        if (!close || close == host + 1 || close[1] != ':')
            return refuse(why, why_len, "an IPv6 address goes in brackets before the port");
        host++;
        host_end = close;
        colon = close + 1;
    } else {
        colon = strchr(host, ':');
        host_end = colon;
    }
    if (!colon || host_end == host)
        return refuse(why, why_len, "no host and port");
    const char *slash = strchr(colon, '/');
    if (!slash || slash == colon + 1)
        return refuse(why, why_len, slash ? "no port" : "no device after the port");
    const char *device = slash + 1;
    if (*device == '\0')
        return refuse(why, why_len, "no device after the port");
    if (strchr(device, '/'))
        return refuse(why, why_len, "the device is one name after the port, as remote://host:port/cpu");
    size_t host_len = (size_t)(host_end - host);
    if (host_len > KILN_REMOTE_HOST_MAX)
        return refuse(why, why_len, "the host is longer than 255 characters");
    if (strlen(device) > KILN_REMOTE_DEVICE_MAX)
        return refuse(why, why_len, "the device name is longer than 63 characters");
    long port = 0;
    for (const char *p = colon + 1; p < slash; p++) {
        if (*p < '0' || *p > '9')
            return refuse(why, why_len, "the port is not a number");
        if ((port = port * 10 + (*p - '0')) > 65535)
            break;
    }
    if (port < 1 || port > 65535)
        return refuse(why, why_len, "the port is out of range 1..65535");
    memcpy(out->host, host, host_len);
    out->host[host_len] = '\0';
    out->port = (int)port;
    snprintf(out->device, sizeof out->device, "%s", device);
    return 0;
}
