/*
 * tests/conformance/cases-threads.c — the engine is documented as safe to call from
 * several threads on distinct tensors. These cases run the same chains of ops on two
 * threads at once (each with its own scope and its own inputs' views) and compare what
 * each thread got with ref, which catches races in a backend's thread pool, buffer pool
 * or per-device state.
 */
#include <pthread.h>
#include <string.h>

#include "conformance.h"

typedef struct worker {
    int kind;
    int iters;
    kiln_tensor *a, *b;
    double shift;
    kiln_tensor *result; /* owned reference, outside any scope */
} worker;

static void *work(void *p)
{
    worker *w = p;
    for (int it = 0; it < w->iters; it++) {
        kiln_scope_begin();
        kiln_tensor *y = NULL;
        switch (w->kind) {
        case 0: /* matmul -> bias -> softmax */
            y = kiln_softmax(kiln_add_scalar(kiln_matmul(w->a, w->b), w->shift), -1);
            break;
        case 1: /* elementwise chain over a large tensor */
            y = kiln_gelu(kiln_mul(kiln_add_scalar(w->a, w->shift), w->b), false);
            break;
        case 2: /* reductions and layer norm */
            y = kiln_add(kiln_layer_norm(w->a, 1, NULL, NULL, 1e-5),
                         kiln_mean(kiln_mul_scalar(w->a, w->shift), KILN_DIMS(-1), true));
            break;
        case 3: { /* conv + pool */
            kiln_conv_opts o = {.padding = {1, 1}};
            kiln_pool_opts po = {.kernel = {2, 2}};
            y = kiln_max_pool2d(kiln_relu(kiln_add_scalar(kiln_conv2d(w->a, w->b, NULL, &o), w->shift)), &po,
                                NULL);
            break;
        }
        }
        if (it == w->iters - 1) {
            kiln_tensor_release(w->result);
            w->result = y ? kiln_keep(y) : NULL;
        }
        kiln_scope_end();
    }
    return NULL;
}

static int b_threads(const conf_case *c, kiln_device *dev, kiln_tensor **in, kiln_tensor **out)
{
    enum { NT = 2 };
    worker w[NT];
    pthread_t th[NT];
    for (int t = 0; t < NT; t++) {
        memset(&w[t], 0, sizeof w[t]);
        w[t].kind = (int)c->p[0];
        w[t].iters = (int)c->p[1];
        w[t].a = in[0];
        w[t].b = in[1];
        w[t].shift = 0.25 * (t + 1);
    }
    int started = 0;
    for (int t = 0; t < NT; t++)
        if (pthread_create(&th[t], NULL, work, &w[t]) == 0)
            started++;
        else
            work(&w[t]);
    for (int t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    int n = 0;
    for (int t = 0; t < NT; t++) {
        out[t] = w[t].result ? kiln_clone(w[t].result) : NULL;
        kiln_tensor_release(w[t].result);
        if (out[t])
            n++;
    }
    return n == NT ? NT : -1;
}

void conf_cases_threads(void)
{
    conf_case c = conf_make("threads", KILN_F32, b_threads);
    c.p[0] = 0;
    c.p[1] = 8;
    conf_in(&c, -1, KILN_SHAPE(129, 200), G_UNI, -1, 1, V_NONE);
    conf_in(&c, -1, KILN_SHAPE(200, 131), G_UNI, -1, 1, V_T);
    c.tol = TOL_REL;
    c.tol_a = 1e-4;
    c.tol_b = 1e-6;
    conf_push(&c, "two threads: matmul -> add -> softmax, 8 rounds");

    c = conf_make("threads", KILN_F32, b_threads);
    c.p[0] = 1;
    c.p[1] = 8;
    conf_in(&c, -1, KILN_SHAPE(300, 517), G_UNI, -3, 3, V_NONE);
    conf_in(&c, -1, KILN_SHAPE(517), G_UNI, -2, 2, V_NONE);
    c.tol = TOL_REL;
    c.tol_a = 1e-5;
    c.tol_b = 1e-6;
    conf_push(&c, "two threads: add -> mul (broadcast) -> gelu, 8 rounds");

    c = conf_make("threads", KILN_F32, b_threads);
    c.p[0] = 2;
    c.p[1] = 8;
    conf_in(&c, -1, KILN_SHAPE(64, 1000), G_UNI, -3, 3, V_NONE);
    c.tol = TOL_REL;
    c.tol_a = 1e-4;
    c.tol_b = 1e-5;
    conf_push(&c, "two threads: layer_norm + mean, 8 rounds");

    c = conf_make("threads", KILN_F32, b_threads);
    c.p[0] = 3;
    c.p[1] = 4;
    conf_in(&c, -1, KILN_SHAPE(2, 8, 24, 24), G_UNI, -1, 1, V_NONE);
    conf_in(&c, -1, KILN_SHAPE(8, 8, 3, 3), G_UNI, -0.5, 0.5, V_NONE);
    c.tol = TOL_REL;
    c.tol_a = 1e-4;
    c.tol_b = 1e-5;
    conf_push(&c, "two threads: conv2d -> relu -> max_pool2d, 4 rounds");
}
