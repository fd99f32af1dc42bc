/*
 * api/endpoints.h — the routes kilnd serves today: KServe v2 health and server metadata, and
 * Prometheus /metrics. Responses that never change are rendered once, at init and on each
 * readiness change, so the probe hot path is a memcpy.
 *
 * Thread affinity: everything here runs on the I/O loop thread.
 */
#ifndef KILN_API_ENDPOINTS_H
#define KILN_API_ENDPOINTS_H

#include <stdbool.h>

#include "buf.h"
#include "metrics.h"
#include "router.h"

struct kiln_api {
    struct kiln_metrics *metrics;   /* borrowed */
    struct kiln_router router;
    /* [0]: Connection: close, [1]: keep-alive */
    struct kiln_buf live[2];
    struct kiln_buf ready[2];       /* 200 or 503, per the current state */
    struct kiln_buf meta[2];
    struct kiln_buf scratch;        /* /metrics is rendered here, reusing its capacity */
    struct kiln_serving *serving;   /* borrowed; NULL until the model endpoints are up */
    struct kiln_jobs *jobs;         /* borrowed; NULL until the job endpoints are up */
    struct kiln_tensor_service *tensor; /* borrowed; NULL until /v1/tensor is up */
};

/* extensions is the NULL-terminated list advertised by GET /v2. Starts not ready ("starting"). */
int kiln_api_init(struct kiln_api *api, struct kiln_metrics *metrics, const char *const *extensions);
void kiln_api_free(struct kiln_api *api);

/* Readiness as /v2/health/ready reports it; state names why it is not ready ("draining"). */
int kiln_api_set_ready(struct kiln_api *api, bool ready, const char *state);

#endif /* KILN_API_ENDPOINTS_H */
