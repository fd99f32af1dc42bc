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
    struct kiln_config cfg;
    char err[1024];
    enum kiln_config_action act = kiln_config_load(&cfg, argc, argv, environ, err, sizeof err);
    switch (act) {
    case KILN_CONFIG_ERROR:
        fprintf(stderr, "kilnd: configuration error: %s\n", err);
        return 1;
    case KILN_CONFIG_HELP:
        kiln_config_print_help(stdout, "kilnd");
        kiln_config_free(&cfg);
        return 0;
    case KILN_CONFIG_VERSION:
        printf("kilnd %s\n", KILN_VERSION);
        kiln_config_free(&cfg);
        return 0;
    case KILN_CONFIG_PRINT_DOC:
        kiln_config_print_doc(stdout);
        kiln_config_free(&cfg);
        return 0;
    case KILN_CONFIG_CHECK:
        if (cfg.config_file)
            printf("kilnd: configuration OK (%s)\n", cfg.config_file);
        else
            printf("kilnd: configuration OK\n");
        kiln_config_free(&cfg);
        return 0;
    case KILN_CONFIG_RUN:
        break;
    }

    /* A peer that resets mid-write must cost one connection, not the process. */
    signal(SIGPIPE, SIG_IGN);

    struct kiln_daemon d;
    int rc = 1;
    if (kiln_daemon_init(&d, &cfg) == 0)
        rc = kiln_daemon_run(&d);
    kiln_daemon_free(&d);
    return rc;
}
