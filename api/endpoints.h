/*
 * api/endpoints.h — the routes kilnd serves today: KServe v2 health and server metadata, and
 * Prometheus /metrics. Responses that never change are rendered once, at init and on each
 * readiness change, so the probe hot path is a memcpy.
 *
 * Thread affinity: everything here runs on the I/O loop thread.
 */
#ifndef KD_API_ENDPOINTS_H
#define KD_API_ENDPOINTS_H

#include <stdbool.h>

#include "buf.h"
#include "metrics.h"
#include "router.h"

struct kd_api {
    struct kd_metrics *metrics; /* borrowed */
    struct kd_router router;
    /* the index of the models route in router, whose /infer requests the HTTP metrics label
     * apart (kd_http_service.split_route) */
    size_t models_route;
    /* [0]: Connection: close, [1]: keep-alive */
    struct kd_buf live[2];
    struct kd_buf ready[2]; /* 200 or 503, per the current state */
    struct kd_buf meta[2];
    struct kd_buf scratch;            /* /metrics is rendered here, reusing its capacity */
    struct kd_serving *serving;       /* borrowed; NULL until the model endpoints are up */
    struct kd_jobs *jobs;             /* borrowed; NULL until the job endpoints are up */
    /* why jobs is still NULL after the start ("": it is not): a full disk kept the job store
     * shut, and the job routes answer 507 with this */
    char jobs_unavailable[640];
    struct kd_tensor_service *tensor; /* borrowed; NULL until /v1/tensor is up */
    struct kd_sched *sched;           /* borrowed; readiness also asks its devices' health */
    /* device allocators' figures and the idle trims of their pools, sampled from the
     * scheduler's devices at each /metrics */
    struct kd_metric_family *device_memory, *device_memory_peak, *device_allocs, *device_reuses;
    struct kd_metric_family *pool_trims, *pool_released;
};

/* extensions is the NULL-terminated list advertised by GET /v2. Starts not ready ("starting"). */
int kd_api_init(struct kd_api *api, struct kd_metrics *metrics, const char *const *extensions);
void kd_api_free(struct kd_api *api);

/* Readiness as /v2/health/ready reports it; state names why it is not ready ("draining"). */
int kd_api_set_ready(struct kd_api *api, bool ready, const char *state);

#endif /* KD_API_ENDPOINTS_H */
