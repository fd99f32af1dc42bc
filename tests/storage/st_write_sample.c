/*
 * tests/storage/st_write_sample.c — writes the safetensors file that
 * check_python_reads.py opens with Python's safetensors package: the same tensors the
 * torch fixture holds (arange(-5, 7) as 3×4 in every dtype), a transposed view, and
 * metadata. Usage: st_write_sample OUT.safetensors
 */
#include <stdio.h>

#include "kiln/kiln.h"
#include "kiln/record.h"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT.safetensors\n", argv[0]);
        return 2;
    }
    kiln_device *dev = kiln_device_open("cpu");
    if (!dev)
        dev = kiln_device_open("ref");
    if (!dev) {
        fprintf(stderr, "st_write_sample: %s\n", kiln_error());
        return 1;
    }
    kiln_scope_begin();
    kiln_tensor *base = kiln_reshape(kiln_arange(dev, KILN_I64, -5, 7, 1), KILN_SHAPE(3, 4));
    kiln_tensor *ts[KILN_DTYPE_COUNT + 1];
    char names[KILN_DTYPE_COUNT + 1][32];
    const char *name_ptrs[KILN_DTYPE_COUNT + 1];
    for (int dt = 0; dt < KILN_DTYPE_COUNT; dt++) {
        ts[dt] = dt == KILN_BOOL ? kiln_eq(kiln_remainder(base, kiln_full(dev, KILN_I64, 0, NULL, 3)),
                                          kiln_zeros(dev, KILN_I64, 0, NULL))
                                 : kiln_cast(base, (kiln_dtype)dt);
        snprintf(names[dt], sizeof names[dt], "t.%s", kiln_dtype_name((kiln_dtype)dt));
        name_ptrs[dt] = names[dt];
    }
    ts[KILN_DTYPE_COUNT] = kiln_transpose(ts[KILN_F32], 0, 1);
    snprintf(names[KILN_DTYPE_COUNT], 32, "view");
    name_ptrs[KILN_DTYPE_COUNT] = names[KILN_DTYPE_COUNT];
    const char *keys[] = {"writer"}, *vals[] = {"kiln"};
    int rc = kiln_safetensors_save(argv[1], KILN_DTYPE_COUNT + 1, name_ptrs, ts, 1, keys, vals);
    if (rc != 0)
        fprintf(stderr, "st_write_sample: %s\n", kiln_error());
    kiln_scope_end();
    kiln_device_close(dev);
    return rc == 0 ? 0 : 1;
}
