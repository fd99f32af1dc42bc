/*
 * tests/backend-ref/test-ref.h — a tiny harness for driving the ref backend through
 * kiln_backend_iface with hand-built descriptors. Expected values are computed by hand
 * (or with a formula quoted next to them), never by calling ref itself.
 */
#ifndef KILN_TEST_REF_H
#define KILN_TEST_REF_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "common/half.h"

extern const kiln_backend_iface *R;
extern void *C;
extern int test_failures;

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);     \
            test_failures++;                                                             \
        }                                                                                \
    } while (0)

/* Equal within tol, NaN equal to NaN, infinities compared exactly. */
#define CHECK_NEAR(got, want, tol)                                                       \
    do {                                                                                 \
        double g_ = (got), w_ = (want);                                                  \
        int ok_ = (isnan(g_) && isnan(w_)) || g_ == w_ || fabs(g_ - w_) <= (tol);        \
        if (!ok_) {                                                                      \
            fprintf(stderr, "%s:%d: %s = %.17g, want %.17g\n", __FILE__, __LINE__, #got,  \
                    g_, w_);                                                             \
            test_failures++;                                                             \
        }                                                                                \
    } while (0)

#define CHECK_OK(call)                                                                   \
    do {                                                                                 \
        int rc_ = (call);                                                                \
        if (rc_ != 0) {                                                                  \
            fprintf(stderr, "%s:%d: %s returned %d\n", __FILE__, __LINE__, #call, rc_);   \
            test_failures++;                                                             \
        }                                                                                \
    } while (0)

#define N_(a) ((int)(sizeof(a) / sizeof((a)[0])))

/** A buffer holding a copy of n bytes of data (zeroed when data is NULL). */
kiln_buffer *tbuf(const void *data, size_t n);
/** A descriptor; strides NULL means contiguous. */
kiln_tdesc tdesc(kiln_buffer *b, kiln_dtype dt, int64_t offset, int ndim, const int64_t *shape,
                 const int64_t *strides);
/** A fresh zeroed contiguous tensor. */
kiln_tdesc tnew(kiln_dtype dt, int ndim, const int64_t *shape);
/** Element i (raw element index into the buffer) as double / int64. */
double tget(const kiln_tdesc *t, int64_t i);
int64_t tgeti(const kiln_tdesc *t, int64_t i);
void tfree_all(void);

void test_ref_ops(void);

#endif
