/*
 * tests/conformance/cases-selftest.c — faults planted on purpose on every device other
 * than ref (`conformance --self-test`), each of which the harness must report: a value
 * off by a little, NaN where ref has a number, a write into an input, a wrong shape, a
 * wrong dtype, an integer off by one, noise above the NMSE bound.
 */
#include <math.h>
#include <string.h>

#include "conformance.h"

static int one(kiln_tensor **out, kiln_tensor *t)
{
    out[0] = t;
    return t ? 1 : -1;
}

static int b_fault(const conf_case *c, kiln_device *dev, kiln_tensor **in, kiln_tensor **out)
{
    bool faulty = dev != conf_ref_device();
    kiln_tensor *x = in[0];
    if (!faulty)
        return one(out, c->p[0] == 6 ? kiln_matmul(x, in[1]) : kiln_clone(x));
    switch (c->p[0]) {
    case 0: return one(out, kiln_add_scalar(x, 1e-3));
    case 1: return one(out, kiln_masked_fill(x, kiln_gt(x, kiln_full_like(x, 0.9)), NAN));
    case 2: { /* batch_norm in training mode updates running stats in place: in[1], in[2] */
        if (!kiln_batch_norm(x, in[1], in[2], NULL, NULL, true, 0.5, 1e-5))
            return -1;
        return one(out, kiln_clone(x));
    }
    case 3: return one(out, kiln_reshape(x, KILN_SHAPE(-1)));
    case 4: return one(out, kiln_cast(x, KILN_F64));
    case 5: return one(out, kiln_add_scalar(x, 1));
    case 6: { /* about 1% noise: NMSE ~1e-4, far above the f32 bound */
        kiln_tensor *y = kiln_matmul(x, in[1]);
        return one(out, kiln_mul(y, kiln_add_scalar(kiln_mul_scalar(in[2], 0.02), 0.99)));
    }
    }
    return -1;
}

static void fault(int kind, const char *what, kiln_dtype dt)
{
    conf_case c = conf_make("selftest", dt, b_fault);
    c.p[0] = kind;
    c.expect_mismatch = true;
    if (kind == 6) {
        conf_in(&c, -1, KILN_SHAPE(16, 24), G_UNI, -1, 1, V_NONE);
        conf_in(&c, -1, KILN_SHAPE(24, 12), G_UNI, -1, 1, V_NONE);
        conf_in(&c, -1, KILN_SHAPE(16, 12), G_UNI, 0, 1, V_NONE);
        c.tol = TOL_NMSE;
    } else {
        conf_in(&c, -1, KILN_SHAPE(4, 3, 5), dt == KILN_I64 ? G_INT : G_UNI, -1, 1, V_NONE);
    }
    if (kind == 2) {
        conf_in(&c, KILN_F32, KILN_SHAPE(3), G_UNI, -1, 1, V_NONE);
        conf_in(&c, KILN_F32, KILN_SHAPE(3), G_UNI, 0.5, 2, V_NONE);
    }
    conf_push(&c, "%s", what);
}

void conf_cases_selftest(void)
{
    fault(0, "value off by 1e-3", KILN_F32);
    fault(1, "NaN where ref has a number", KILN_F32);
    fault(2, "writes into an input", KILN_F32);
    fault(3, "wrong shape", KILN_F32);
    fault(4, "wrong dtype", KILN_F32);
    fault(5, "integer off by one", KILN_I64);
    fault(6, "1% noise under an NMSE bound", KILN_F32);
}
