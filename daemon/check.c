/*
 * daemon/check.c — the checks a start makes of its configuration before it serves, shared with
 * --check-config, so that "configuration OK" means the same configuration starts: the log file,
 * the listening rule (beyond loopback only with api_tokens; the host resolves; HTTP and gRPC on
 * two ports), the model folders, the data folder
 * (folders.c), device_options, the devices (each opened once and closed again, as the scheduler
 * opens them at start) and the tokens themselves.
 */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "daemon.h"
#include "kiln/kiln.h"

int kd_daemon_check_listen(const struct kd_config *cfg, char *err, size_t errlen)
{
    if (!kd_auth_listen_allowed(cfg->host, cfg->api_tokens.count)) {
        snprintf(err, errlen,
                 "refusing to listen on %s without api_tokens: set KILN_API_TOKENS (\"admin:TOKEN\" or "
                 "\"read:TOKEN\" entries) or listen on 127.0.0.1",
                 cfg->host);
        return -1;
    }
    /* HTTP and gRPC each listen on a port of their own: the same one twice failed as "gRPC:
     * address already in use", kilnd's own HTTP listener holding it */
    if (cfg->port > 0 && cfg->grpc_port == cfg->port) {
        snprintf(err, errlen, "port and grpc_port are both %lld: the gRPC service needs a port of its own",
                 (long long)cfg->port);
        return -1;
    }
    /* as the listener resolves it (a name, or an address such as 127.0.0.300 that is none) */
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE},
                    *res = NULL;
    int rc = getaddrinfo(cfg->host, NULL, &hints, &res);
    if (rc != 0) {
        snprintf(err, errlen, "cannot resolve host '%s': %s", cfg->host, gai_strerror(rc));
        return -1;
    }
    freeaddrinfo(res);
    return 0;
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
    /* in the order a start meets them, so the first problem is the one a start would report; the
     * data folder is made and removed again when missing, so a check leaves nothing behind */
    if (kd_daemon_check_log_file(cfg->log_file, err, errlen) != 0 ||
        kd_daemon_check_listen(cfg, err, errlen) != 0 || kd_daemon_check_model_folders(cfg, err, errlen) != 0 ||
        kd_daemon_make_data_dir(cfg->data_dir, true, err, errlen) != 0 ||
        kd_daemon_apply_device_options(cfg, err, errlen) != 0)
        return -1;
    char *db = kd_daemon_job_store_path(cfg);
    if (!db) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    char why[900];
    int store_rc = kd_jobstore_check(db, why, sizeof why);
    free(db);
    if (store_rc != 0) {
        snprintf(err, errlen, "job store: %s", why);
        return -1;
    }
    /* Opening is what checks a device's options and that it exists (cuda:5 on a machine with
     * one GPU); the message is the one the scheduler logs when a start fails the same way. */
    kiln_device **open = calloc(cfg->devices.count ? cfg->devices.count : 1, sizeof *open);
    if (!open) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; i < cfg->devices.count && rc == 0; i++) {
        open[i] = kiln_device_open(cfg->devices.items[i]);
        /* a configured spec may hold a secret (a remote token): messages show it masked */
        char shown[512], other[512];
        kiln_device_spec_redact(cfg->devices.items[i], shown, sizeof shown);
        if (!open[i]) {
            snprintf(err, errlen, "scheduler: device '%s': %s", shown, kiln_error());
            rc = -1;
        }
        /* as the scheduler refuses one device listed under two spellings */
        for (size_t j = 0; j < i && rc == 0; j++)
            if (open[j] == open[i]) {
                snprintf(err, errlen, "scheduler: devices: '%s' and '%s' are the same device (%s); list it once",
                         kiln_device_spec_redact(cfg->devices.items[j], other, sizeof other), shown,
                         kiln_device_name(open[i]));
                rc = -1;
            }
    }
    for (size_t i = 0; i < cfg->devices.count; i++)
        if (open[i])
            kiln_device_close(open[i]);
    free(open);
    if (rc != 0)
        return -1;
    struct kd_auth *auth = kd_auth_new(&cfg->api_tokens, err, errlen);
    if (!auth)
        return -1;
    kd_auth_free(auth);
    return 0;
}
