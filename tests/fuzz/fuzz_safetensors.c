/*
 * tests/fuzz/fuzz_safetensors.c — libFuzzer target for the safetensors reader.
 *
 * Any byte string must either be refused with a message or open cleanly; when it
 * opens, every accessor and a load of every tensor must stay in bounds.
 */
#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"
#include "kiln/record.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kiln_device *dev; /* opened once: the fuzzer calls this millions of times */
    if (!dev)
        dev = kiln_device_open("ref");
    kiln_safetensors *st = kiln_safetensors_open_memory(data, size);
    if (!st)
        return 0;
    for (int i = 0; i < kiln_safetensors_count(st); i++) {
        int dtype, ndim;
        int64_t shape[KILN_MAX_DIMS];
        kiln_safetensors_info(st, i, &dtype, &ndim, shape);
        (void)kiln_safetensors_dtype_string(st, i);
        int64_t numel = 1;
        for (int d = 0; d < ndim; d++)
            numel *= shape[d];
        if (numel <= (1 << 20)) /* the loader's own checks run on every entry; cap the copy */
            kiln_tensor_release(kiln_safetensors_load(st, kiln_safetensors_name(st, i), dev));
    }
    for (int i = 0; i < kiln_safetensors_metadata_count(st); i++)
        (void)kiln_safetensors_metadata(st, kiln_safetensors_metadata_key(st, i));
    kiln_safetensors_close(st);
    return 0;
}
