/*
 * tests/optim/learner-fixture.h — shared by the Learner tests (learner-ckpt, learner-state):
 * the device under test (argv[1], "cpu?threads=1" by default), a small three-class data set
 * of four features whose labels follow from the features, and a scratch folder for
 * checkpoints, removed at teardown.
 */
#ifndef KILN_TEST_OPTIM_LEARNER_FIXTURE_H
#define KILN_TEST_OPTIM_LEARNER_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "kiln/kiln.h"

static const char *dev_spec = "cpu?threads=1";
static kiln_device *dev;
static kiln_dataset *train_ds, *valid_ds;
static char root[256];

/* n rows of N(0, 1) features; the label is (x0 + x1 > 0) + (x2 > 1), so 0..2 */
static kiln_dataset *make_data(int n, uint64_t seed)
{
    float *x = malloc((size_t)n * 4 * sizeof *x);
    int64_t *y = malloc((size_t)n * sizeof *y);
    kiln_generator g = kiln_generator_make(seed);
    kiln_tensor *r = kiln_rand_normal(dev, KILN_F32, KILN_SHAPE(n, 4), 0, 1, &g);
    assert_int_equal(kiln_to_data(r, x, (size_t)n * 4 * sizeof *x), 0);
    kiln_tensor_release(r);
    for (int i = 0; i < n; i++)
        y[i] = (x[i * 4] + x[i * 4 + 1] > 0) + (x[i * 4 + 2] > 1);
    kiln_dataset *d = kiln_dataset_from_arrays(n, 1, (int64_t[]){4}, x, y, 3, NULL, 0);
    free(x);
    free(y);
    return d;
}

/* Opens the device, makes the two data sets and /tmp/kiln-<tag>-XXXXXX; 0 or -1. */
static int learner_fixture_open(int ntrain, int nvalid, const char *tag)
{
    dev = kiln_device_open(dev_spec);
    if (!dev)
        return -1;
    train_ds = make_data(ntrain, 1);
    valid_ds = make_data(nvalid, 2);
    snprintf(root, sizeof root, "/tmp/kiln-%s-XXXXXX", tag);
    return train_ds && valid_ds && mkdtemp(root) ? 0 : -1;
}

static int learner_fixture_close(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    kiln_dataset_free(train_ds);
    kiln_dataset_free(valid_ds);
    kiln_device_close(dev);
    return 0;
}

#endif
