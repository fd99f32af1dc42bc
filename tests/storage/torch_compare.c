/*
 * tests/storage/torch_compare.c — compare every tensor kiln reads from a torch.save file
 * with the same tensors written by PyTorch's safetensors (the reference), bit for bit.
 *
 *   torch_compare FILE.pt REFERENCE.safetensors
 *
 * Both sides must hold the same names; each pair must agree in dtype, shape and bytes.
 * Prints one summary line; exits 0 when everything matches, 1 otherwise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "kiln/record.h"

static int compare_one(kiln_torch_file *pt, kiln_safetensors *ref, const char *name, kiln_device *dev)
{
    kiln_tensor *a = kiln_torch_load(pt, name, dev);
    kiln_tensor *b = kiln_safetensors_load(ref, name, dev);
    int bad = 0;
    if (!a || !b) {
        fprintf(stderr, "%s: cannot load: %s\n", name, kiln_error());
        bad = 1;
    } else {
        char da[200], db[200];
        kiln_tensor_describe(a, da, sizeof da);
        kiln_tensor_describe(b, db, sizeof db);
        size_t n = (size_t)kiln_tensor_numel(a) * kiln_dtype_size(kiln_tensor_dtype(a));
        if (strcmp(da, db) != 0) {
            fprintf(stderr, "%s: kiln read %s, the reference holds %s\n", name, da, db);
            bad = 1;
        } else {
            unsigned char *x = malloc(n + 1), *y = malloc(n + 1);
            if (!x || !y || kiln_to_data(a, x, n) < 0 || kiln_to_data(b, y, n) < 0 || memcmp(x, y, n) != 0) {
                fprintf(stderr, "%s (%s): bytes differ from the reference\n", name, da);
                bad = 1;
            }
            free(x);
            free(y);
        }
    }
    kiln_tensor_release(a);
    kiln_tensor_release(b);
    return bad;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s FILE.pt REFERENCE.safetensors\n", argv[0]);
        return 2;
    }
    kiln_device *dev = kiln_device_open("ref");
    kiln_torch_file *pt = kiln_torch_open(argv[1], NULL);
    if (!pt) {
        fprintf(stderr, "%s\n", kiln_error());
        return 1;
    }
    kiln_safetensors *ref = kiln_safetensors_open(argv[2]);
    if (!ref) {
        fprintf(stderr, "%s\n", kiln_error());
        return 1;
    }
    int bad = 0, n = kiln_safetensors_count(ref);
    if (kiln_torch_count(pt) != n) {
        fprintf(stderr, "kiln reads %d tensors, the reference holds %d\n", kiln_torch_count(pt), n);
        bad++;
    }
    for (int i = 0; i < n; i++)
        bad += compare_one(pt, ref, kiln_safetensors_name(ref, i), dev);
    printf("%s: %d tensors compared with %s, %d mismatches\n", argv[1], n, argv[2], bad);
    kiln_safetensors_close(ref);
    kiln_torch_close(pt);
    kiln_device_close(dev);
    return bad ? 1 : 0;
}
