/*
 * clients/predict-output.h — how `kiln predict` prints kilnd's answer: each output by its
 * datatype, whether its values came as JSON or as binary data (the binary tensor extension,
 * asked with "binary_data_output" or an output's "binary_data").
 */
#ifndef KILN_CLIENTS_PREDICT_OUTPUT_H
#define KILN_CLIENTS_PREDICT_OUTPUT_H

#include "cli.h"

/* Prints every output of r, a 200 answer to POST /v2/models/M/infer. 0, or -1 after printing
 * "kiln: WHAT: ..." when the answer cannot be read (not JSON, binary parts that do not add up). */
int kiln_cli_print_infer_response(const struct response *r, const char *what);

#endif /* KILN_CLIENTS_PREDICT_OUTPUT_H */
