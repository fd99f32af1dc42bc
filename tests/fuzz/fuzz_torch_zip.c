/*
 * tests/fuzz/fuzz_torch_zip.c — libFuzzer target for the whole PyTorch (.pt) reader:
 * libzip over a memory buffer, the unpickler, flattening, the rename and skip rules and
 * strided loads.
 *
 * Any byte string must either be refused with a message or open cleanly; when it opens,
 * every accessor and a load of every tensor must stay in bounds.
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
    /* rules that fire on the seed files, so renaming runs on every input that opens */
    static const char *from[] = {"^model\\.", "([a-z]+)([0-9])", "x*"};
    static const char *to[] = {"", "\\2_\\1", "-"};
    static const char *skip[] = {"num_batches_tracked$"};
    kiln_torch_options o = {.n_renames = 3, .rename_patterns = from, .rename_replacements = to,
                            .n_skips = 1, .skip_patterns = skip};
    kiln_torch_file *pt = kiln_torch_open_memory(data, size, size % 2 ? &o : NULL);
    if (!pt)
        return 0;
    for (int i = 0; i < kiln_torch_count(pt); i++) {
        int dtype, ndim = 0;
        int64_t shape[KILN_MAX_DIMS];
        if (kiln_torch_info(pt, i, &dtype, &ndim, shape) < 0) /* more dims than kiln has: listed, not loadable */
            ndim = 0;
        (void)kiln_torch_storage_type(pt, i);
        (void)kiln_torch_source_name(pt, i);
        int64_t numel = 1;
        for (int d = 0; d < ndim; d++)
            numel *= shape[d];
        if (numel <= (1 << 20)) /* the loader's own checks run on every entry; cap the copy */
            kiln_tensor_release(kiln_torch_load(pt, kiln_torch_name(pt, i), dev));
    }
    for (int i = 0; i < kiln_torch_other_count(pt); i++) {
        (void)kiln_torch_other_name(pt, i);
        (void)kiln_torch_other_value(pt, i);
    }
    kiln_torch_close(pt);
    return 0;
}
