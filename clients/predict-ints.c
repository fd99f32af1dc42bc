/*
 * clients/predict-ints.c — integer inputs of `kiln predict` read exactly from the text (see
 * predict-ints.h). The text is walked with kilnd's own strict scanner (api/jscan.c), so a request
 * with an integer input is held to the JSON kilnd accepts; each number is converted here from its
 * digits.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jscan.h"
#include "predict-ints.h"

struct int_datatype {
    const char *name;
    bool is_signed;
    uint64_t max;           /* the largest value */
    uint64_t min_magnitude; /* the magnitude of the smallest: 0 for the unsigned ones */
};

static const struct int_datatype int_datatypes[] = {
    {"INT8", true, INT8_MAX, 128u},          {"INT16", true, INT16_MAX, 32768u},
    {"INT32", true, INT32_MAX, 2147483648u}, {"INT64", true, INT64_MAX, (uint64_t)INT64_MAX + 1},
    {"UINT8", false, UINT8_MAX, 0},          {"UINT16", false, UINT16_MAX, 0},
    {"UINT32", false, UINT32_MAX, 0},        {"UINT64", false, UINT64_MAX, 0},
};

static const struct int_datatype *find_int_datatype(const char *name)
{
    for (size_t i = 0; name && i < sizeof int_datatypes / sizeof int_datatypes[0]; i++)
        if (strcmp(int_datatypes[i].name, name) == 0)
            return &int_datatypes[i];
    return NULL;
}

bool kiln_cli_int_datatype(const char *datatype)
{
    return find_int_datatype(datatype) != NULL;
}

/* Reading one input's data: where the scanner is, whose data it is, which element comes next. */
struct int_reader {
    struct kd_jscan s;
    const struct int_datatype *type;
    const char *input;
    long long element; /* row-major index of the next number */
    char *msg;
    size_t msglen;
};

/* Fails the reader with "input 'x' (INT64): element N <why>", the element's text quoted. */
static int element_error(struct int_reader *r, const char *token, size_t token_len, const char *why)
{
    int shown = token_len > 40 ? 40 : (int)token_len;
    snprintf(r->msg, r->msglen, "input '%s' (%s): element %lld%s%.*s%s%s", r->input, r->type->name, r->element,
             token ? " is " : "", token ? shown : 0, token ? token : "", token && token_len > 40 ? "..." : "",
             why);
    kd_jscan_fail(&r->s, "bad element"); /* releases what the scanner holds */
    return -1;
}

/* The number at the scanner as exact integer text for r's datatype, appended to into. */
static int read_integer(struct int_reader *r, cJSON *into)
{
    const char *token = r->s.p;
    if (kd_jscan_skip(&r->s) != 0)
        return -1;
    size_t token_len = (size_t)(r->s.p - token);
    bool negative;
    uint64_t magnitude;
    enum kd_json_whole w = kd_json_whole_of(token, r->s.p, &negative, &magnitude);
    if (w == KD_WHOLE_FRACTION)
        return element_error(r, token, token_len, ", which is not an integer");
    bool in_range = w == KD_WHOLE_OK &&
                    (negative ? magnitude <= r->type->min_magnitude : magnitude <= r->type->max);
    if (!in_range) {
        char range[96];
        if (r->type->is_signed)
            snprintf(range, sizeof range, ", outside the %s range -%" PRIu64 "..%" PRIu64, r->type->name,
                     r->type->min_magnitude, r->type->max);
        else
            snprintf(range, sizeof range, ", outside the %s range 0..%" PRIu64, r->type->name, r->type->max);
        return element_error(r, token, token_len, range);
    }
    char text[24];
    snprintf(text, sizeof text, "%s%" PRIu64, negative && magnitude ? "-" : "", magnitude);
    cJSON *item = cJSON_CreateRaw(text);
    if (!item || !cJSON_AddItemToArray(into, item)) {
        cJSON_Delete(item);
        snprintf(r->msg, r->msglen, "out of memory");
        return kd_jscan_fail(&r->s, "out of memory");
    }
    r->element++;
    return 0;
}

/*
 * The value at the scanner, a number or an array nested to any depth, appended to into: each
 * array as an array of its own, or, when flatten, only its numbers, in order.
 */
static int read_value(struct int_reader *r, cJSON *into, bool flatten)
{
    switch (kd_jscan_peek(&r->s)) {
    case KD_J_NUMBER: return read_integer(r, into);
    case KD_J_ARRAY: {
        cJSON *array = flatten ? into : cJSON_CreateArray();
        if (!array || (!flatten && !cJSON_AddItemToArray(into, array))) {
            cJSON_Delete(array);
            snprintf(r->msg, r->msglen, "out of memory");
            return kd_jscan_fail(&r->s, "out of memory");
        }
        if (kd_jscan_array_begin(&r->s) != 0)
            return -1;
        int more;
        for (int i = 0; (more = kd_jscan_element(&r->s, i)) == 1; i++)
            if (read_value(r, array, flatten) != 0)
                return -1;
        return more;
    }
    case KD_J_NONE: return kd_jscan_fail(&r->s, "expected a value");
    default: return element_error(r, NULL, 0, " is not a number");
    }
}

/* msg for a scanner that stopped: its own message, unless an element's is there already. */
static void syntax_error(const struct kd_jscan *s, size_t offset, char *msg, size_t msglen)
{
    if (s->err && strcmp(s->err, "bad element") != 0 && strcmp(s->err, "out of memory") != 0)
        snprintf(msg, msglen, "the request is not valid JSON: %s at byte %zu", s->err, offset + s->err_at);
}

/* One input's data at text + offset, its nesting kept: a cJSON value, or NULL with msg. */
static cJSON *exact_data(const char *text, size_t len, size_t offset, const struct int_datatype *type,
                         const char *input, char *msg, size_t msglen)
{
    struct int_reader r = {.type = type, .input = input, .msg = msg, .msglen = msglen};
    kd_jscan_init(&r.s, text + offset, len - offset);
    cJSON *holder = cJSON_CreateArray();
    if (!holder) {
        snprintf(msg, msglen, "out of memory");
        return NULL;
    }
    if (read_value(&r, holder, false) != 0) {
        syntax_error(&r.s, offset, msg, msglen);
        cJSON_Delete(holder);
        return NULL;
    }
    cJSON *data = cJSON_DetachItemFromArray(holder, 0);
    cJSON_Delete(holder);
    return data;
}

cJSON *kiln_cli_exact_int_array(const char *text, size_t len, const char *input, const char *datatype, char *msg,
                                size_t msglen)
{
    const struct int_datatype *type = find_int_datatype(datatype);
    if (!type) {
        snprintf(msg, msglen, "input '%s': %s is not an integer datatype", input, datatype ? datatype : "(none)");
        return NULL;
    }
    struct int_reader r = {.type = type, .input = input, .msg = msg, .msglen = msglen};
    kd_jscan_init(&r.s, text, len);
    cJSON *flat = cJSON_CreateArray();
    if (!flat) {
        snprintf(msg, msglen, "out of memory");
        return NULL;
    }
    if (kd_jscan_peek(&r.s) != KD_J_ARRAY) {
        kd_jscan_fail(&r.s, "expected an array");
        syntax_error(&r.s, 0, msg, msglen);
        cJSON_Delete(flat);
        return NULL;
    }
    if (read_value(&r, flat, true) != 0 || kd_jscan_finish(&r.s) != 0) {
        syntax_error(&r.s, 0, msg, msglen);
        cJSON_Delete(flat);
        return NULL;
    }
    return flat;
}

/* Where the value of each input's "data" starts in the text, in the order of "inputs". */
struct data_spans {
    size_t *at; /* offset of the value, or SIZE_MAX for an input without "data" */
    size_t count, cap;
};

static int add_span(struct data_spans *spans, size_t at)
{
    if (spans->count == spans->cap) {
        size_t cap = spans->cap ? spans->cap * 2 : 8;
        size_t *grown = realloc(spans->at, cap * sizeof *grown);
        if (!grown)
            return -1;
        spans->at = grown;
        spans->cap = cap;
    }
    spans->at[spans->count++] = at;
    return 0;
}

/* One input object at the scanner: records where its "data" starts. */
static int scan_input(struct kd_jscan *s, const char *text, struct data_spans *spans)
{
    size_t data_at = SIZE_MAX;
    if (kd_jscan_peek(s) == KD_J_OBJECT) {
        struct kd_jkeys keys;
        if (kd_jscan_object_begin_keys(s, &keys) != 0)
            return -1;
        char key[16];
        int more;
        for (int i = 0; (more = kd_jscan_member(s, i, key, sizeof key)) == 1; i++) {
            if (strcmp(key, "data") == 0 && kd_jscan_peek(s) != KD_J_NONE)
                data_at = (size_t)(s->p - text);
            if (kd_jscan_skip(s) != 0)
                return -1;
        }
        if (more != 0)
            return -1;
    } else if (kd_jscan_skip(s) != 0) {
        return -1;
    }
    if (add_span(spans, data_at) != 0)
        return kd_jscan_fail(s, "out of memory");
    return 0;
}

/* The whole request: the spans of the inputs of its top-level "inputs" array. */
static int scan_request(struct kd_jscan *s, const char *text, struct data_spans *spans)
{
    struct kd_jkeys keys;
    if (kd_jscan_peek(s) != KD_J_OBJECT)
        return kd_jscan_fail(s, "expected an object");
    if (kd_jscan_object_begin_keys(s, &keys) != 0)
        return -1;
    char key[16];
    int more;
    for (int i = 0; (more = kd_jscan_member(s, i, key, sizeof key)) == 1; i++) {
        if (strcmp(key, "inputs") != 0 || kd_jscan_peek(s) != KD_J_ARRAY) {
            if (kd_jscan_skip(s) != 0)
                return -1;
            continue;
        }
        if (kd_jscan_array_begin(s) != 0)
            return -1;
        int element;
        for (int j = 0; (element = kd_jscan_element(s, j)) == 1; j++)
            if (scan_input(s, text, spans) != 0)
                return -1;
        if (element != 0)
            return -1;
    }
    if (more != 0)
        return -1;
    return kd_jscan_finish(s);
}

int kiln_cli_exact_int_inputs(cJSON *req, const char *text, size_t len, char *msg, size_t msglen)
{
    const cJSON *inputs = cJSON_GetObjectItemCaseSensitive(req, "inputs"), *in;
    bool any = false;
    cJSON_ArrayForEach(in, inputs)
    {
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(in, "datatype");
        any = any || (cJSON_IsString(dt) && find_int_datatype(dt->valuestring));
    }
    if (!any)
        return 0;
    struct kd_jscan s;
    struct data_spans spans = {0};
    kd_jscan_init(&s, text, len);
    if (scan_request(&s, text, &spans) != 0) {
        snprintf(msg, msglen, "the request is not valid JSON: %s at byte %zu", s.err ? s.err : "?", s.err_at);
        free(spans.at);
        return -1;
    }
    /* The scanner refuses a repeated key, so its "inputs" and each input's "data" are the ones
     * cJSON took, in the same order. */
    size_t i = 0;
    cJSON *input;
    int rc = 0;
    cJSON_ArrayForEach(input, inputs)
    {
        size_t at = i < spans.count ? spans.at[i] : SIZE_MAX;
        i++;
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(input, "datatype"),
                    *name = cJSON_GetObjectItemCaseSensitive(input, "name");
        const struct int_datatype *type = cJSON_IsString(dt) ? find_int_datatype(dt->valuestring) : NULL;
        if (!type || at == SIZE_MAX)
            continue; /* kilnd says what is wrong with an input that has no data */
        char unnamed[32];
        snprintf(unnamed, sizeof unnamed, "#%zu", i);
        cJSON *data = exact_data(text, len, at, type, cJSON_IsString(name) ? name->valuestring : unnamed, msg,
                                 msglen);
        if (!data || !cJSON_ReplaceItemInObjectCaseSensitive(input, "data", data)) {
            cJSON_Delete(data);
            rc = -1;
            break;
        }
    }
    free(spans.at);
    return rc;
}
