/*
 * tests/unit/sched-loop-util.h — what the scheduler tests (test_sched_gate.c,
 * test_sched_worker.c, test_sched_load_runs.c) share: turning the loop until a completion the
 * scheduler posts has arrived.
 */
#ifndef KILN_TESTS_SCHED_LOOP_UTIL_H
#define KILN_TESTS_SCHED_LOOP_UTIL_H

#include <stdbool.h>

#include <uv.h>

static inline void sched_test_tick(uv_timer_t *t)
{
    (void)t;
}

/* The scheduler's async handle does not keep the loop alive, so a test waiting for a
 * completion keeps tick (a timer initialised on loop) running while it turns the loop. */
static inline void sched_test_run_until(uv_loop_t *loop, uv_timer_t *tick, const bool *flag)
{
    uv_timer_start(tick, sched_test_tick, 1, 1);
    while (!*flag)
        uv_run(loop, UV_RUN_ONCE);
    uv_timer_stop(tick);
}

#endif /* KILN_TESTS_SCHED_LOOP_UTIL_H */
