/*
 * tests/fuzz/fuzz_record.c — libFuzzer target for kiln records (model.kiln files, checkpoints'
 * model and optimizer state; storage/record.c): plain or "KILNZSTD"-compressed images must be
 * refused with a message or open, and an opened record must load its tensors, leniently by
 * their stored dtypes and shapes and converted to f32 (the version-tolerant path a model
 * takes when its code moved on), without reading outside the image or leaking.
 *
 * A compressed image that declares more than 64 MiB uncompressed is passed over: what such a
 * claim costs is the allocator's to refuse, not a parser path.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "kiln/record.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_SLOTS 16

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kiln_device *dev; /* opened once: the fuzzer calls this millions of times */
    if (!dev)
        dev = kiln_device_open("ref");
    if (!dev)
        return 0;
    if (size >= 16 && memcmp(data, "KILNZSTD", 8) == 0) {
        uint64_t raw;
        memcpy(&raw, data + 8, 8);
        if (raw > ((uint64_t)64 << 20))
            return 0;
    }
    kiln_error_clear();
    kiln_record *rec = kiln_record_open_memory(data, size);
    if (!rec) {
        if (!kiln_error()[0])
            __builtin_trap(); /* a refusal names what was wrong */
        return 0;
    }
    if (!kiln_record_config(rec))
        __builtin_trap();
    const kiln_safetensors *st = kiln_record_tensors(rec);
    int n = kiln_safetensors_count(st);
    kiln_record_slot slots[MAX_SLOTS + 1];
    int ns = 0;
    for (int i = 0; i < n && ns < MAX_SLOTS; i++) {
        int dtype, ndim;
        int64_t shape[KILN_MAX_DIMS];
        kiln_safetensors_info(st, i, &dtype, &ndim, shape);
        int64_t numel = 1;
        for (int d = 0; d < ndim; d++)
            numel *= shape[d];
        if (numel > (1 << 16)) /* the checks run on every entry at open; cap the copies */
            continue;
        slots[ns++] = (kiln_record_slot){.name = kiln_safetensors_name(st, i), .dtype = -1, .ndim = -1};
    }
    /* one slot the record lacks, as a model that grew a buffer asks */
    slots[ns++] = (kiln_record_slot){
        .name = "(not in the file)", .dtype = KILN_F32, .ndim = 1, .shape = {1}, .optional = true};
    kiln_tensor *out[MAX_SLOTS + 1];
    kiln_record_report rep;
    if (kiln_record_load_slots(rec, ns, slots, dev, KILN_RECORD_LENIENT, out, &rep) == 0)
        for (int i = 0; i < ns; i++)
            kiln_tensor_release(out[i]);
    kiln_record_report_free(&rep);
    /* the same into f32 slots: every stored dtype converts, or is refused naming the key */
    for (int i = 0; i + 1 < ns; i++)
        slots[i].dtype = KILN_F32;
    if (kiln_record_load_slots(rec, ns, slots, dev, KILN_RECORD_STRICT, out, NULL) == 0)
        for (int i = 0; i < ns; i++)
            kiln_tensor_release(out[i]);
    kiln_record_close(rec);
    return 0;
}
