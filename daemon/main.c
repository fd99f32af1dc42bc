/*
 * daemon/main.c — kilnd's entry point: read the configuration, answer --help, --version,
 * --check-config and --print-config-doc, or run the daemon until it is told to stop.
 */
#include <signal.h>
#include <stdio.h>

#include "daemon.h"

extern char **environ;

int main(int argc, char **argv)
{
    struct kd_config cfg;
    char err[1024];
    enum kd_config_action act = kd_config_load(&cfg, argc, argv, environ, err, sizeof err);
    switch (act) {
    case KD_CONFIG_ERROR: fprintf(stderr, "kilnd: configuration error: %s\n", err); return 1;
    case KD_CONFIG_HELP:
        kd_config_print_help(stdout, "kilnd");
        kd_config_free(&cfg);
        return 0;
    case KD_CONFIG_VERSION:
        printf("kilnd %s\n", KILN_VERSION);
        kd_config_free(&cfg);
        return 0;
    case KD_CONFIG_PRINT_DOC:
        kd_config_print_doc(stdout);
        kd_config_free(&cfg);
        return 0;
    case KD_CONFIG_CHECK:
        /* the warnings a start would log: valid, but probably not what was meant */
        for (const char *line = cfg.notes; line && *line; line += strcspn(line, "\n") + 1)
            fprintf(stderr, "kilnd: warning: %.*s\n", (int)strcspn(line, "\n"), line);
        /* What a start checks before it serves, so "OK" is not said of one that would refuse. */
        if (kd_daemon_check(&cfg, err, sizeof err) != 0) {
            fprintf(stderr, "kilnd: configuration error: %s\n", err);
            kd_config_free(&cfg);
            return 1;
        }
        if (cfg.config_file)
            printf("kilnd: configuration OK (%s)\n", cfg.config_file);
        else
            printf("kilnd: configuration OK\n");
        /* Said, not refused: a kilnd running on the folder is no fault of the configuration,
         * and checking a new one before restarting the running kilnd is what the check is for. */
        long holder = kd_daemon_data_dir_user(cfg.data_dir);
        if (holder > 0)
            printf("kilnd: note: data_dir %s is in use by a running kilnd (pid %ld); a start is refused until it "
                   "stops\n",
                   cfg.data_dir, holder);
        else if (holder < 0)
            printf("kilnd: note: data_dir %s is in use by a running kilnd; a start is refused until it stops\n",
                   cfg.data_dir);
        kd_config_free(&cfg);
        return 0;
    case KD_CONFIG_RUN: break;
    }

    /* A peer that resets mid-write must cost one connection, not the process. */
    signal(SIGPIPE, SIG_IGN);
    /* A file size limit (RLIMIT_FSIZE) reached by a write must fail that write (EFBIG), which every
     * writer reports as it does a full disk, rather than kill the process. */
    signal(SIGXFSZ, SIG_IGN);

    struct kd_daemon d;
    int rc = 1;
    if (kd_daemon_init(&d, &cfg) == 0)
        rc = kd_daemon_run(&d);
    kd_daemon_free(&d);
    return rc;
}
