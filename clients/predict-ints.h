/*
 * clients/predict-ints.h — the integer inputs of `kiln predict`, read exactly from the text the
 * user gave. cJSON keeps every number as a double, which holds an integer exactly only up to
 * 2^53: sent on through it, INT64 9007199254740993 would reach the model as 9007199254740992.
 * These read each element of an integer input (INT8..INT64, UINT8..UINT64) from the text itself,
 * refuse one that is not a whole number in the datatype's range, naming the input and the
 * element, and put the exact values into the request as raw JSON numbers.
 */
#ifndef KILN_CLIENTS_PREDICT_INTS_H
#define KILN_CLIENTS_PREDICT_INTS_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

/* Whether datatype (a KServe name such as "INT64") is one of the integer datatypes. */
bool kiln_cli_int_datatype(const char *datatype);

/*
 * req is the KServe request body cJSON parsed from text (len bytes). Each input of it whose
 * datatype is an integer one gets its "data" replaced by the same nesting of the integers the
 * text holds there, exactly. 0, or -1 with the reason in msg (the text is not strict JSON, or an
 * element is not a whole number in range).
 */
int kiln_cli_exact_int_inputs(cJSON *req, const char *text, size_t len, char *msg, size_t msglen);

/*
 * The nested array that text (len bytes, the whole document) holds, as a flat array of its
 * integers in row-major order, exactly, for the input named input of integer datatype datatype.
 * NULL with the reason in msg.
 */
cJSON *kiln_cli_exact_int_array(const char *text, size_t len, const char *input, const char *datatype, char *msg,
                                size_t msglen);

#endif /* KILN_CLIENTS_PREDICT_INTS_H */
