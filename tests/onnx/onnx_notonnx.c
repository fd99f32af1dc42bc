/*
 * onnx_notonnx.c — what kiln_onnx_load says of a file that is not ONNX at all:
 *
 *     onnx_notonnx SCRATCH_DIR
 *
 * A JSON file saved as model.onnx was "malformed model: unsupported wire type (groups are not
 * used by ONNX)" and a torch.save checkpoint "malformed model: field number out of range".
 * Now a file that does not parse as a ModelProto and does not begin like one is "not an ONNX
 * model", with what it looks like when its first bytes say (zip: a PyTorch checkpoint, JSON,
 * a pickle, safetensors); a damaged ONNX file (truncated) keeps the decoder's exact fault.
 */
#include <stdio.h>
#include <string.h>

#include "kiln/kiln.h"
#include "onnx-build.h"
#include "onnx-check.h"

static kiln_device *dev;
static const char *scratch;

/* Loads the bytes from memory and from SCRATCH/model.onnx; the error must hold every
 * '|'-separated part of want and none of the parts of unwanted ('' for none). */
static void expect(const char *what, const void *b, size_t n, const char *want, const char *unwanted)
{
    char path[512];
    snprintf(path, sizeof path, "%s/model.onnx", scratch);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n) {
        CHECK(0, "cannot write %s", path);
        if (f)
            fclose(f);
        return;
    }
    fclose(f);
    for (int from_file = 0; from_file < 2; from_file++) {
        kiln_onnx_model *m = from_file ? kiln_onnx_load(path, dev, NULL) : kiln_onnx_load_memory(b, n, dev, NULL);
        const char *e = m ? "(loaded)" : kiln_error();
        char parts[256];
        bool ok = !m;
        snprintf(parts, sizeof parts, "%s", want);
        for (char *p = strtok(parts, "|"); ok && p; p = strtok(NULL, "|"))
            ok = strstr(e, p) != NULL;
        snprintf(parts, sizeof parts, "%s", unwanted);
        for (char *p = strtok(parts, "|"); ok && p; p = strtok(NULL, "|"))
            ok = strstr(e, p) == NULL;
        CHECK(ok, "%s (%s): want '%s' without '%s', got: %s", what, from_file ? "file" : "memory", want, unwanted,
              e);
        kiln_onnx_free(m);
    }
    remove(path);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: onnx_notonnx SCRATCH_DIR\n");
        return 2;
    }
    scratch = argv[1];
    dev = kiln_device_open("cpu");
    if (!dev) {
        fprintf(stderr, "%s\n", kiln_error());
        return 1;
    }
    const char json[] = "{\"name\": \"mlp\", \"layers\": [{\"type\": \"linear\", \"in\": 4, \"out\": 2}]}\n";
    expect("JSON object", json, sizeof json - 1, "not an ONNX model|JSON", "malformed");
    const char json_arr[] = "\n  [1, 2, 3]";
    expect("JSON array", json_arr, sizeof json_arr - 1, "not an ONNX model|JSON", "malformed");
    /* torch.save's zip: a local file header, then archive/data.pkl */
    const char zip[] = "PK\x03\x04\x00\x00\x08\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00archive/data.pkl";
    expect("zip (torch.save)", zip, sizeof zip - 1, "not an ONNX model|PyTorch checkpoint|zip", "malformed");
    /* torch.save(_use_new_zipfile_serialization=False) and plain pickles: protocol 2 */
    const unsigned char pkl[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e};
    expect("pickle", pkl, sizeof pkl, "not an ONNX model|pickle", "malformed");
    /* safetensors: a little-endian u64 header length, the JSON header, the data */
    unsigned char st[64] = {0};
    const char hdr[] = "{\"__metadata__\":{}}";
    st[0] = (unsigned char)(sizeof hdr - 1);
    memcpy(st + 8, hdr, sizeof hdr - 1);
    expect("safetensors", st, 8 + sizeof hdr - 1, "not an ONNX model|safetensors", "malformed");
    const char text[] = "hello, this is a README saved under the wrong name\n";
    expect("text", text, sizeof text - 1, "not an ONNX model|do not parse as an ONNX ModelProto", "malformed");
    expect("empty", "", 0, "not an ONNX model|empty", "malformed");

    /* A real model, whole and then cut short: damaged ONNX keeps the decoder's detail. */
    static pb g, m;
    const int64_t xd[2] = {2, 3};
    ob_input(&g, "x", OB_FLOAT, 2, xd, NULL);
    ob_node(&g, "Relu", "relu", (const char *[]){"x", NULL}, (const char *[]){"y", NULL}, NULL);
    ob_output(&g, "y");
    ob_model(&m, &g, 17);
    kiln_onnx_model *ok = kiln_onnx_load_memory(m.b, m.n, dev, NULL);
    CHECK(ok, "the whole model: %s", kiln_error());
    kiln_onnx_free(ok);
    expect("truncated ONNX", m.b, m.n - 5, "malformed model|length past the end", "not an ONNX model");
    expect("ONNX without its graph", m.b, 2, "malformed model|no graph", "not an ONNX model");
    kiln_device_close(dev);
    if (failures)
        fprintf(stderr, "%d failures\n", failures);
    else
        printf("not-ONNX files: ok\n");
    return failures ? 1 : 0;
}
