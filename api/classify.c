/*
 * api/classify.c — Triton's classification extension (classify.h): the highest scores of an
 * output as "<value>:<index>[:<label>]" strings.
 *
 * Each item's top count is kept in a bounded heap whose root is the worst kept so far, so an
 * output of C classes costs C log(count) comparisons, not a sort of all C. NaN sorts below
 * every number (a comparison with it is always false, which would leave the order up to the
 * heap's history).
 */
#include "classify.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "kiln/tensor.h"

bool kd_classify_datatype_ok(const char *datatype)
{
    static const char *const numbers[] = {"FP32", "FP64", "FP16", "BF16", "INT64", "INT32", "UINT8"};
    for (size_t i = 0; i < sizeof numbers / sizeof numbers[0]; i++)
        if (strcmp(datatype, numbers[i]) == 0)
            return true;
    return false;
}

/* Element i of t as a double, for comparing; false for a dtype that holds no numbers. */
static bool value_of(const struct kd_sched_tensor *t, int64_t i, double *v)
{
    switch (t->dtype) {
    case KILN_F32: *v = ((const float *)t->data)[i]; return true;
    case KILN_F64: *v = ((const double *)t->data)[i]; return true;
    case KILN_F16: *v = kiln_f16_to_f32(((const uint16_t *)t->data)[i]); return true;
    case KILN_BF16: *v = kiln_bf16_to_f32(((const uint16_t *)t->data)[i]); return true;
    case KILN_I64: *v = (double)((const int64_t *)t->data)[i]; return true;
    case KILN_I32: *v = ((const int32_t *)t->data)[i]; return true;
    case KILN_U8: *v = ((const uint8_t *)t->data)[i]; return true;
    default: return false;
    }
}

/* Element i written as Triton writes a class's value: floats with six decimals
 * (std::to_string), integers whole. */
static int format_value(const struct kd_sched_tensor *t, int64_t i, char *buf, size_t cap)
{
    switch (t->dtype) {
    case KILN_I64: return snprintf(buf, cap, "%lld", (long long)((const int64_t *)t->data)[i]);
    case KILN_I32: return snprintf(buf, cap, "%d", ((const int32_t *)t->data)[i]);
    case KILN_U8: return snprintf(buf, cap, "%u", ((const uint8_t *)t->data)[i]);
    default: {
        double v = 0;
        (void)value_of(t, i, &v);
        return snprintf(buf, cap, "%f", v);
    }
    }
}

struct ranked {
    double v;
    int64_t index;
};

/* a ranks above b: a higher value, NaN lowest, ties to the lower index */
static bool above(const struct ranked *a, const struct ranked *b)
{
    bool an = isnan(a->v), bn = isnan(b->v);
    if (an != bn)
        return bn;
    if (!an && a->v != b->v)
        return a->v > b->v;
    return a->index < b->index;
}

/* Restores the heap below slot i (the root holds the lowest ranked kept). */
static void sift_down(struct ranked *h, int64_t n, int64_t i)
{
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, low = i;
        if (l < n && above(&h[low], &h[l]))
            low = l;
        if (r < n && above(&h[low], &h[r]))
            low = r;
        if (low == i)
            return;
        struct ranked tmp = h[i];
        h[i] = h[low];
        h[low] = tmp;
        i = low;
    }
}

static void sift_up(struct ranked *h, int64_t i)
{
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!above(&h[p], &h[i]))
            return;
        struct ranked tmp = h[i];
        h[i] = h[p];
        h[p] = tmp;
        i = p;
    }
}

/* The top k of elements [base, base + width) into best[0..k), highest first. */
static void top_of_item(const struct kd_sched_tensor *t, int64_t base, int64_t width, int64_t k,
                        struct ranked *best)
{
    int64_t n = 0;
    for (int64_t c = 0; c < width; c++) {
        struct ranked e = {0, c};
        (void)value_of(t, base + c, &e.v);
        if (n < k) {
            best[n] = e;
            sift_up(best, n++);
        } else if (above(&e, &best[0])) {
            best[0] = e;
            sift_down(best, n, 0);
        }
    }
    /* popping the lowest to the back leaves the array highest first */
    while (n > 1) {
        struct ranked tmp = best[0];
        best[0] = best[n - 1];
        best[n - 1] = tmp;
        sift_down(best, --n, 0);
    }
}

static int append(struct kd_classes *c, size_t *cap, const char *s, size_t len)
{
    if (c->wire_len + 4 + len > *cap) {
        size_t want = (*cap ? *cap * 2 : 256) + 4 + len;
        char *p = realloc(c->wire, want);
        if (!p)
            return -1;
        c->wire = p;
        *cap = want;
    }
    unsigned char *at = (unsigned char *)c->wire + c->wire_len;
    at[0] = (unsigned char)(len & 0xff);
    at[1] = (unsigned char)((len >> 8) & 0xff);
    at[2] = (unsigned char)((len >> 16) & 0xff);
    at[3] = (unsigned char)((len >> 24) & 0xff);
    memcpy(at + 4, s, len);
    c->wire_len += 4 + len;
    return 0;
}

int kd_classify(const struct kd_sched_tensor *t, bool batched, int64_t count, const char *const *labels,
                int64_t nlabels, struct kd_classes *out)
{
    memset(out, 0, sizeof *out);
    switch (t->dtype) {
    case KILN_F32:
    case KILN_F64:
    case KILN_F16:
    case KILN_BF16:
    case KILN_I64:
    case KILN_I32:
    case KILN_U8: break;
    default: return -1; /* no numbers to rank */
    }
    size_t esize = kiln_dtype_size(t->dtype);
    int64_t numel = esize ? (int64_t)(t->nbytes / esize) : 0;
    int64_t items = batched && t->ndim >= 1 ? t->shape[0] : 1;
    int64_t width = items > 0 ? numel / items : 0;
    int64_t k = count < width ? count : width;
    if (batched && t->ndim >= 1) {
        out->ndim = 2;
        out->shape[0] = items;
        out->shape[1] = k;
    } else {
        out->ndim = 1;
        out->shape[0] = k;
    }
    out->n = items * k;
    struct ranked *best = malloc(sizeof *best * (size_t)(k ? k : 1));
    if (!best)
        return -1;
    size_t cap = 0;
    int rc = 0;
    for (int64_t b = 0; b < items && rc == 0; b++) {
        top_of_item(t, b * width, width, k, best);
        for (int64_t j = 0; j < k && rc == 0; j++) {
            char text[96];
            int len = format_value(t, b * width + best[j].index, text, sizeof text);
            len += snprintf(text + len, sizeof text - (size_t)len, ":%lld", (long long)best[j].index);
            const char *label = labels && best[j].index < nlabels ? labels[best[j].index] : NULL;
            if (label && label[0]) {
                size_t ll = strlen(label);
                char *full = malloc((size_t)len + 1 + ll + 1);
                if (!full) {
                    rc = -1;
                    break;
                }
                memcpy(full, text, (size_t)len);
                full[len] = ':';
                memcpy(full + len + 1, label, ll + 1);
                rc = append(out, &cap, full, (size_t)len + 1 + ll);
                free(full);
            } else {
                rc = append(out, &cap, text, (size_t)len);
            }
        }
    }
    free(best);
    if (rc != 0)
        kd_classes_free(out);
    return rc;
}

void kd_classes_free(struct kd_classes *c)
{
    free(c->wire);
    memset(c, 0, sizeof *c);
}

const char *kd_classes_next(const struct kd_classes *c, size_t *pos, uint32_t *len)
{
    if (*pos + 4 > c->wire_len)
        return NULL;
    const unsigned char *at = (const unsigned char *)c->wire + *pos;
    *len = (uint32_t)at[0] | (uint32_t)at[1] << 8 | (uint32_t)at[2] << 16 | (uint32_t)at[3] << 24;
    *pos += 4 + *len;
    return (const char *)at + 4;
}
