/*
 * storage/safetensors-write.c — writing the safetensors format (the reader is safetensors.c).
 *
 * The header is built with cJSON, padded with spaces so that the data area starts 64-byte
 * aligned in the file, and the whole file goes through the atomic-file helpers. Names and
 * metadata are checked first: what kiln writes must open in every reader, Python's too, so
 * invalid UTF-8 and a metadata key given twice (readers disagree on which one wins) are
 * refused rather than written.
 */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "kiln/record.h"
#include "safetensors-impl.h"
#include "storage-impl.h"

static char *st_build_header(int n, const char *const *names, kiln_tensor *const *tensors, int nmeta,
                             const char *const *meta_keys, const char *const *meta_values)
{
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return NULL;
    if (nmeta > 0) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        for (int i = 0; meta && i < nmeta; i++)
            if (!cJSON_AddStringToObject(meta, meta_keys[i], meta_values[i]))
                meta = NULL;
        if (!meta)
            goto fail;
    }
    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_AddObjectToObject(root, names[i]);
        if (!e)
            goto fail;
        kiln_dtype dt = kiln_tensor_dtype(tensors[i]);
        uint64_t bytes = (uint64_t)kiln_tensor_numel(tensors[i]) * kiln_dtype_size(dt);
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
        if (!cJSON_AddStringToObject(e, "dtype", kiln__st_dtype_string(dt)) || !shape || !offs)
            goto fail;
        for (int d = 0; d < kiln_tensor_ndim(tensors[i]); d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)kiln_tensor_dim(tensors[i], d)));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(offset + bytes)));
        offset += bytes;
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
fail:
    cJSON_Delete(root);
    return NULL;
}

int kiln_safetensors_save(const char *path, int n, const char *const *names, kiln_tensor *const *tensors,
                          int nmeta, const char *const *meta_keys, const char *const *meta_values)
{
    if (!path || n < 0 || nmeta < 0 || (n > 0 && (!names || !tensors)) ||
        (nmeta > 0 && (!meta_keys || !meta_values)))
        return kiln__error_set("safetensors save: invalid arguments"), KILN_EINVAL;
    for (int i = 0; i < n; i++) {
        if (!tensors[i])
            return kiln__error_set("safetensors save %s: tensor '%s' is NULL", path,
                                   names[i] ? names[i] : "(null)"),
                   KILN_EINVAL;
        if (!names[i] || !names[i][0] || strcmp(names[i], "__metadata__") == 0)
            return kiln__error_set("safetensors save %s: tensor %d has an invalid name", path, i), KILN_EINVAL;
        for (int j = 0; j < i; j++)
            if (strcmp(names[i], names[j]) == 0)
                return kiln__error_set("safetensors save %s: duplicate name '%s'", path, names[i]), KILN_EINVAL;
    }
    char shown[220];
    for (int i = 0; i < n; i++)
        if (!kiln__utf8_string(names[i]))
            return kiln__error_set("safetensors save %s: tensor name '%s' is not valid UTF-8", path,
                                   kiln__printable(names[i], shown, sizeof shown)),
                   KILN_EINVAL;
    for (int i = 0; i < nmeta; i++) {
        if (!meta_keys[i] || !meta_values[i])
            return kiln__error_set("safetensors save %s: metadata pair %d is NULL", path, i), KILN_EINVAL;
        if (!kiln__utf8_string(meta_keys[i]))
            return kiln__error_set("safetensors save %s: metadata key '%s' is not valid UTF-8", path,
                                   kiln__printable(meta_keys[i], shown, sizeof shown)),
                   KILN_EINVAL;
        if (!kiln__utf8_string(meta_values[i]))
            return kiln__error_set("safetensors save %s: the value of metadata key '%.200s' is not valid UTF-8",
                                   path, meta_keys[i]),
                   KILN_EINVAL;
    }
    bool oom;
    const char *dup = kiln__first_duplicate(meta_keys, nmeta, &oom);
    if (oom)
        return kiln__error_set_code(KILN_ENOMEM, "safetensors save %s: out of memory", path);
    if (dup)
        return kiln__error_set("safetensors save %s: metadata key '%.200s' is given more than once", path, dup),
               KILN_EINVAL;

    char *header = st_build_header(n, names, tensors, nmeta, meta_keys, meta_values);
    if (!header)
        return kiln__error_set_code(KILN_ENOMEM, "safetensors save %s: out of memory building the header", path);
    /* Pad the header with spaces (JSON whitespace) so the data area starts 64-byte
     * aligned in the file: readers that map it can then use tensors in place. */
    size_t hlen = strlen(header);
    size_t padded = ((hlen + 8 + 63) & ~(size_t)63) - 8;
    int rc = 0;
    kiln__atomic_file f;
    unsigned char *buf = NULL;
    if ((rc = kiln__atomic_open(&f, path)) != 0) {
        free(header);
        return rc;
    }
    uint64_t hlen64 = padded;
    char spaces[64];
    memset(spaces, ' ', sizeof spaces);
    rc = kiln__atomic_write(&f, &hlen64, 8);
    if (rc == 0)
        rc = kiln__atomic_write(&f, header, hlen);
    if (rc == 0)
        rc = kiln__atomic_write(&f, spaces, padded - hlen);
    for (int i = 0; i < n && rc == 0; i++) {
        size_t bytes = (size_t)kiln_tensor_numel(tensors[i]) * kiln_dtype_size(kiln_tensor_dtype(tensors[i]));
        if (bytes == 0)
            continue;
        unsigned char *next = realloc(buf, bytes);
        if (!next) {
            rc = kiln__error_set("safetensors save %s: out of memory for '%s'", path, names[i]);
            rc = KILN_ENOMEM;
            break;
        }
        buf = next;
        if (kiln_to_data(tensors[i], buf, bytes) != 0) {
            rc = KILN_EINVAL; /* kiln_to_data set the message */
            break;
        }
        rc = kiln__atomic_write(&f, buf, bytes);
    }
    free(buf);
    free(header);
    if (rc == 0)
        return kiln__atomic_commit(&f);
    kiln__atomic_abort(&f);
    return rc;
}
