/*
 * tests/autodiff/gradcheck.h — a finite-difference gradient checker for the autodiff
 * tests.
 *
 * A case is a function of n f64 leaf tensors (the shapes given) returning one tensor y.
 * The checker reduces y to a scalar loss = sum(y * W) with fixed random weights W (so
 * every output element matters with a different weight), takes the analytic gradient
 * of each input with kiln_backward, and compares it, element by element, with the
 * central difference (loss(x + h) - loss(x - h)) / 2h computed with recording off. It
 * runs every case on both the ref and the cpu device. Inputs are contiguous leaves; a
 * case that wants a non-contiguous operand builds it (permute, slice with step, expand)
 * inside its function, which checks the view's backward too.
 */
#ifndef KILN_GRADCHECK_H
#define KILN_GRADCHECK_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kiln/autodiff.h"
#include "kiln/tensor.h"

#define GC_MAX_IN 6

/* How the checker fills an input. */
enum { GC_NORMAL = 0, GC_POSITIVE, GC_UNIT };

typedef struct gc_in {
    int ndim;
    const int64_t *shape;
    int kind;            /* GC_NORMAL: N(0, 1); GC_POSITIVE: |N| + 0.5; GC_UNIT: in (0.2, 0.8) */
} gc_in;

#define GC_IN(...) ((gc_in){KILN_SHAPE(__VA_ARGS__), GC_NORMAL})
#define GC_POS(...) ((gc_in){KILN_SHAPE(__VA_ARGS__), GC_POSITIVE})
#define GC_UNITV(...) ((gc_in){KILN_SHAPE(__VA_ARGS__), GC_UNIT})
#define GC_SCALAR ((gc_in){0, NULL, GC_NORMAL})

typedef kiln_tensor *(*gc_fn)(kiln_device *dev, kiln_tensor **in, const void *ud);

static const char *const gc_devices[] = {"ref", "cpu"};

static int64_t gc_numel(const gc_in *in)
{
    int64_t n = 1;
    for (int i = 0; i < in->ndim; i++)
        n *= in->shape[i];
    return n;
}

static kiln_tensor *gc_tensor(kiln_device *dev, const gc_in *in, const double *host)
{
    return kiln_from_data(dev, KILN_F64, in->ndim, in->shape, host, (size_t)gc_numel(in) * sizeof(double));
}

/* loss = sum(y * W), with recording as the caller left it. */
static kiln_tensor *gc_loss(kiln_device *dev, gc_fn f, const void *ud, kiln_tensor **t, kiln_tensor **w)
{
    kiln_tensor *y = f(dev, t, ud);
    if (!y)
        return NULL;
    if (!*w) {
        kiln_generator gen = kiln_generator_make(77);
        *w = kiln_keep(kiln_rand_normal(dev, KILN_F64, kiln_tensor_ndim(y), kiln_tensor_shape(y), 0, 1, &gen));
    }
    return kiln_sum(kiln_mul(kiln_cast(y, KILN_F64), *w), KILN_ALL_DIMS, false);
}

static void gc_run_device(const char *name, const char *spec, gc_fn f, const void *ud, int n,
                          const gc_in *ins, double rtol, double atol)
{
    /* A failed check leaves its no-grad section open; start each run with grad on. */
    while (!kiln_grad_enabled())
        kiln_no_grad_end();
    kiln_device *dev = kiln_device_open(spec);
    if (!dev)
        fail_msg("%s: cannot open %s: %s", name, spec, kiln_error());
    double *host[GC_MAX_IN] = {0}, *grad[GC_MAX_IN] = {0};
    kiln_generator gen = kiln_generator_make(1234);
    kiln_device *refdev = kiln_device_open("ref");
    for (int i = 0; i < n; i++) {
        int64_t m = gc_numel(&ins[i]);
        host[i] = calloc((size_t)(m ? m : 1), sizeof(double));
        grad[i] = calloc((size_t)(m ? m : 1), sizeof(double));
        kiln_tensor *r = kiln_rand_normal(refdev, KILN_F64, ins[i].ndim, ins[i].shape, 0, 1, &gen);
        assert_non_null(r);
        assert_int_equal(kiln_to_data(r, host[i], (size_t)m * sizeof(double)), 0);
        kiln_tensor_release(r);
        for (int64_t j = 0; j < m; j++) {
            if (ins[i].kind == GC_POSITIVE)
                host[i][j] = fabs(host[i][j]) + 0.5;
            else if (ins[i].kind == GC_UNIT)
                host[i][j] = 0.5 + 0.3 * tanh(host[i][j]);
        }
    }
    kiln_device_close(refdev);

    /* Analytic gradients. */
    kiln_tensor *w = NULL;
    kiln_scope_begin();
    kiln_tensor *t[GC_MAX_IN];
    for (int i = 0; i < n; i++) {
        t[i] = kiln_requires_grad(gc_tensor(dev, &ins[i], host[i]), true);
        assert_non_null(t[i]);
    }
    kiln_tensor *loss = gc_loss(dev, f, ud, t, &w);
    if (!loss)
        fail_msg("%s on %s: forward failed: %s", name, spec, kiln_error());
    if (kiln_backward(loss, NULL) != 0)
        fail_msg("%s on %s: backward failed: %s", name, spec, kiln_error());
    for (int i = 0; i < n; i++) {
        kiln_tensor *g = kiln_grad(t[i]);
        int64_t m = gc_numel(&ins[i]);
        if (g) {
            assert_int_equal(kiln_tensor_numel(g), m);
            assert_int_equal(kiln_tensor_dtype(g), KILN_F64);
            assert_int_equal(kiln_to_data(g, grad[i], (size_t)m * sizeof(double)), 0);
        }
    }
    kiln_scope_end();

    /* Central differences, with recording off. */
    const double h = 1e-6;
    kiln_no_grad_begin();
    for (int i = 0; i < n; i++) {
        int64_t m = gc_numel(&ins[i]);
        for (int64_t j = 0; j < m; j++) {
            double keep = host[i][j], lv[2];
            for (int s = 0; s < 2; s++) {
                host[i][j] = keep + (s ? -h : h);
                kiln_scope_begin();
                for (int k = 0; k < n; k++)
                    t[k] = gc_tensor(dev, &ins[k], host[k]);
                kiln_tensor *l = gc_loss(dev, f, ud, t, &w);
                lv[s] = l ? kiln_item(l) : NAN;
                if (l && kiln_tensor_requires_grad(l))
                    fail_msg("%s: recorded under no-grad", name);
                kiln_scope_end();
            }
            host[i][j] = keep;
            double num = (lv[0] - lv[1]) / (2 * h);
            double ana = grad[i][j];
            if (!(fabs(ana - num) <= atol + rtol * fabs(num)))
                fail_msg("%s on %s: input %d element %lld: analytic %.10g, numeric %.10g", name, spec, i,
                         (long long)j, ana, num);
        }
    }
    kiln_no_grad_end();
    kiln_tensor_release(w);
    for (int i = 0; i < n; i++) {
        free(host[i]);
        free(grad[i]);
    }
    kiln_device_close(dev);
}

/* Check f's gradients with respect to every input, on every device. */
static void gradcheck_tol(const char *name, gc_fn f, const void *ud, int n, const gc_in *ins, double rtol,
                          double atol)
{
    for (size_t d = 0; d < sizeof gc_devices / sizeof gc_devices[0]; d++)
        gc_run_device(name, gc_devices[d], f, ud, n, ins, rtol, atol);
}

static void gradcheck(const char *name, gc_fn f, const void *ud, int n, const gc_in *ins)
{
    gradcheck_tol(name, f, ud, n, ins, 1e-6, 1e-5);
}

#define GRADCHECK(name, f, ud, ...)                                                        \
    gradcheck((name), (f), (ud), (int)(sizeof((gc_in[]){__VA_ARGS__}) / sizeof(gc_in)),     \
              (const gc_in[]){__VA_ARGS__})

#endif
