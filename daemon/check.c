/*
 * daemon/check.c — the checks a start makes of its configuration before it serves, shared with
 * --check-config, so that "configuration OK" means the same configuration starts: the listening
 * rule (beyond loopback only with api_tokens), the tokens themselves, device_options and the
 * devices (each opened once and closed again, as the scheduler opens them at start).
 */
#include <stdio.h>
#include <string.h>

#include "auth.h"
#include "daemon.h"
#include "kiln/kiln.h"

int kd_daemon_check_listen(const struct kd_config *cfg, char *err, size_t errlen)
{
    if (kd_auth_listen_allowed(cfg->host, cfg->api_tokens.count))
        return 0;
    snprintf(err, errlen,
             "refusing to listen on %s without api_tokens: set KILN_API_TOKENS (\"admin:TOKEN\" or "
             "\"read:TOKEN\" entries) or listen on 127.0.0.1",
             cfg->host);
    return -1;
}

int kd_daemon_apply_device_options(const struct kd_config *cfg, char *err, size_t errlen)
{
    /* the backends' defaults, set before any device opens (and checked when one does, so a bad
     * value stops the start with its name) */
    for (size_t i = 0; i < cfg->device_options.count; i++) {
        const char *e = cfg->device_options.items[i], *colon = strchr(e, ':');
        char backend[32];
        if (!colon || colon == e || (size_t)(colon - e) >= sizeof backend) {
            snprintf(err, errlen, "device_options: '%s' is not BACKEND:key=value", e);
            return -1;
        }
        memcpy(backend, e, (size_t)(colon - e));
        backend[colon - e] = '\0';
        if (kiln_device_defaults_set(backend, colon + 1) != 0) {
            snprintf(err, errlen, "device_options: %s", kiln_error());
            return -1;
        }
    }
    return 0;
}

int kd_daemon_check(const struct kd_config *cfg, char *err, size_t errlen)
{
    /* in the order a start meets them, so the first problem is the one a start would report */
    if (kd_daemon_check_listen(cfg, err, errlen) != 0 || kd_daemon_apply_device_options(cfg, err, errlen) != 0)
        return -1;
    /* Opening is what checks a device's options and that it exists (cuda:5 on a machine with
     * one GPU); the message is the one the scheduler logs when a start fails the same way. */
    for (size_t i = 0; i < cfg->devices.count; i++) {
        kiln_device *dev = kiln_device_open(cfg->devices.items[i]);
        if (!dev) {
            snprintf(err, errlen, "scheduler: device '%s': %s", cfg->devices.items[i], kiln_error());
            return -1;
        }
        kiln_device_close(dev);
    }
    struct kd_auth *auth = kd_auth_new(&cfg->api_tokens, err, errlen);
    if (!auth)
        return -1;
    kd_auth_free(auth);
    return 0;
}
