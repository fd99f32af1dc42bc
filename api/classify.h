/*
 * api/classify.h — Triton's classification extension: an output asked for with
 * "parameters": {"classification": N} (tritonclient's class_count=N) is answered as the N
 * highest scores instead of the scores themselves, each a string "<value>:<index>[:<label>]",
 * datatype BYTES, shape [batch, N] for a model that batches and [N] for one that does not. The
 * label is the index's line of the output's label_filename, where its config.json names one.
 *
 *     struct kd_classes cl;
 *     if (kd_classify(&r->outputs[o], c->max_batch_size > 0, 3, labels, nlabels, &cl) == 0) {
 *         // cl.wire holds cl.n strings, each a 4-byte little-endian length and then its bytes
 *         kd_classes_free(&cl);
 *     }
 *
 * HTTP and gRPC write the same strings (JSON strings, or cl.wire as binary data or
 * raw_output_contents); the value is written as Triton writes it (a float with six decimals,
 * an integer as it is). Ties keep the lower index first.
 */
#ifndef KD_API_CLASSIFY_H
#define KD_API_CLASSIFY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "scheduler.h"

/* The largest count a request may ask for (more than any output's classes is cut to them). */
#define KD_CLASSIFY_MAX_COUNT (INT64_C(1) << 20)

/** An output's classification: n strings in Triton's serialized BYTES layout. */
struct kd_classes {
    int ndim;         /* 2 ([batch, count]) or 1 ([count]) */
    int64_t shape[2]; /* count is min(asked, classes per item) */
    int64_t n;        /* strings: the product of shape */
    char *wire;       /* n times: uint32 little-endian length, then that many bytes */
    size_t wire_len;
};

/* Whether an output of this KServe datatype can be classified (a number: not BOOL or BYTES). */
bool kd_classify_datatype_ok(const char *datatype);

/*
 * The top count classes of t into *out: per batch item (the first dimension) when batched, of
 * the whole tensor otherwise. labels[0..nlabels) name indexes (NULL/0: none; an index past
 * them has no label). 0, or -1 when out of memory or t's dtype holds no numbers (*out is then
 * empty).
 */
int kd_classify(const struct kd_sched_tensor *t, bool batched, int64_t count, const char *const *labels,
                int64_t nlabels, struct kd_classes *out);
void kd_classes_free(struct kd_classes *c);

/* The string at *pos of a wire (advancing *pos), for writers that need them one by one. */
const char *kd_classes_next(const struct kd_classes *c, size_t *pos, uint32_t *len);

#endif /* KD_API_CLASSIFY_H */
