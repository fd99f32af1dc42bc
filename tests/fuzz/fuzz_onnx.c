/*
 * tests/fuzz/fuzz_onnx.c — libFuzzer target for the ONNX loader: protobuf decoding,
 * graph ordering (cycles), constant folding and fusion on arbitrary bytes. Every input
 * must either be refused with a message or load; a loaded model's accessors must stay
 * in bounds. Running the graph is left out: a model may legitimately ask for tensors
 * of any size, which is the caller's limit to set, not the loader's.
 */
#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"
#include "kiln/onnx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kiln_device *dev; /* opened once: the fuzzer calls this millions of times */
    if (!dev)
        dev = kiln_device_open("ref");
    kiln_onnx_options opts = kiln_onnx_options_default();
    opts.max_file_bytes = 1u << 20;
    kiln_onnx_model *m = kiln_onnx_load_memory(data, size, dev, &opts);
    if (!m)
        return 0;
    (void)kiln_onnx_opset(m);
    (void)kiln_onnx_node_count(m);
    for (int i = 0; i < kiln_onnx_input_count(m); i++) {
        int ndim;
        int64_t shape[KILN_MAX_DIMS];
        (void)kiln_onnx_input_name(m, i);
        (void)kiln_onnx_input_info(m, i, &ndim, shape);
    }
    for (int i = 0; i < kiln_onnx_output_count(m); i++)
        (void)kiln_onnx_output_name(m, i);
    for (int i = 0; i < kiln_onnx_param_count(m); i++) {
        (void)kiln_onnx_param_name(m, i);
        (void)kiln_onnx_param(m, i);
    }
    kiln_onnx_free(m);
    return 0;
}
