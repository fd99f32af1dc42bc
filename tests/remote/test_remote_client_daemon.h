/*
 * tests/remote/test_remote_client_daemon.h — starting and stopping a real kilnd for the remote
 * backend's tests: `kilnd --port 0 --data-dir DIR` in a fresh temporary folder, the port read
 * from DIR/kilnd.port once it appears. Header-only so each test program stays one file.
 */
#ifndef TEST_REMOTE_CLIENT_DAEMON_H
#define TEST_REMOTE_CLIENT_DAEMON_H

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct test_daemon {
    pid_t pid;
    int port;
    char dir[256];
    char spec[128];         /* remote://127.0.0.1:PORT/cpu */
} test_daemon;

/* Starts kilnd with extra flags (NULL-terminated) and NAME=VALUE environment entries (NULL-terminated).
 * 0, or -1 with a message printed. */
static inline int test_daemon_start(test_daemon *d, const char *kilnd, const char *const *flags,
                                    const char *const *env)
{
    memset(d, 0, sizeof *d);
    const char *tmp = getenv("TMPDIR");
    snprintf(d->dir, sizeof d->dir, "%s/kiln-remote-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(d->dir)) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    char log[300];
    snprintf(log, sizeof log, "%s/kilnd.log", d->dir);
    fflush(NULL); /* the child must not flush the parent's buffered output a second time */
    d->pid = fork();
    if (d->pid < 0)
        return -1;
    if (d->pid == 0) {
        const char *argv[32] = {kilnd, "--port", "0", "--data-dir", d->dir};
        int n = 5;
        for (int i = 0; flags && flags[i] && n < 31; i++)
            argv[n++] = flags[i];
        argv[n] = NULL;
        for (int i = 0; env && env[i]; i++)
            putenv((char *)env[i]);
        if (!freopen(log, "w", stderr) || !freopen("/dev/null", "w", stdout))
            _exit(126);
        execv(kilnd, (char *const *)argv);
        _exit(127);
    }
    char portfile[300];
    snprintf(portfile, sizeof portfile, "%s/kilnd.port", d->dir);
    for (int i = 0; i < 2000; i++) { /* up to 20 s */
        FILE *f = fopen(portfile, "r");
        if (f) {
            int ok = fscanf(f, "%d", &d->port);
            fclose(f);
            if (ok == 1 && d->port > 0) {
                snprintf(d->spec, sizeof d->spec, "remote://127.0.0.1:%d/cpu", d->port);
                return 0;
            }
        }
        int st;
        if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
            fprintf(stderr, "kilnd exited at start; see %s\n", log);
            d->pid = 0;
            return -1;
        }
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    fprintf(stderr, "kilnd did not write %s\n", portfile);
    return -1;
}

/* Stops kilnd with sig (SIGTERM for a clean stop, SIGKILL for a crash) and waits for it. */
static inline void test_daemon_kill(test_daemon *d, int sig)
{
    if (d->pid > 0) {
        kill(d->pid, sig);
        int st;
        waitpid(d->pid, &st, 0);
        d->pid = 0;
    }
}

/* Stops kilnd and removes its folder. */
static inline void test_daemon_stop(test_daemon *d)
{
    test_daemon_kill(d, SIGTERM);
    if (d->dir[0]) {
        char cmd[320];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", d->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", d->dir);
        d->dir[0] = '\0';
    }
}

#endif /* TEST_REMOTE_CLIENT_DAEMON_H */
