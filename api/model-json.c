/*
 * api/model-json.c — a served model as the JSON the KServe v2 and Triton endpoints return: its
 * tensor specs (metadata), its statistics, and its configuration in the shape of Triton's model
 * configuration JSON (GET /v2/models/<name>[/versions/<v>]/config, which tritonclient's
 * get_model_config reads), rendered from what kilnd actually runs, not from config.json as
 * written: the scheduler's effective config (max_batch_size forced to 0 for a model that cannot
 * batch, say).
 *
 * The values that name software are kiln's own: backend "kiln", platform the format the model was
 * loaded from ("kiln" or "onnx", as the metadata endpoint says), since kilnd runs both itself.
 * As in Triton, dims leave the batch dim out when max_batch_size > 0, and dynamic_batching is
 * present exactly when requests are batched (kilnd batches whenever max_batch_size > 0).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serving.h"

/* Triton's data_type for a KServe datatype: "TYPE_" + the name, except BYTES, which is TYPE_STRING. */
static const char *triton_type(const char *datatype, char *buf, size_t n)
{
    snprintf(buf, n, "TYPE_%s", strcmp(datatype, "BYTES") == 0 ? "STRING" : datatype);
    return buf;
}

static int put_tensors(struct kd_buf *b, const char *key, const kd_model_tensor_spec *sp, int n, bool batched,
                       bool input)
{
    int rc = kd_buf_printf(b, ",\"%s\":[", key);
    for (int i = 0; i < n; i++) {
        char type[32];
        rc |= kd_buf_puts(b, i ? ",{\"name\":\"" : "{\"name\":\"");
        rc |= kd_buf_json_escape(b, sp[i].name, strlen(sp[i].name));
        rc |= kd_buf_printf(b, "\",\"data_type\":\"%s\",%s\"dims\":[",
                            triton_type(sp[i].datatype, type, sizeof type),
                            input ? "\"format\":\"FORMAT_NONE\"," : "");
        for (int d = batched ? 1 : 0; d < sp[i].ndim; d++)
            rc |= kd_buf_printf(b, "%s%lld", d > (batched ? 1 : 0) ? "," : "", (long long)sp[i].shape[d]);
        if (input) {
            rc |= kd_buf_puts(b, "],\"is_shape_tensor\":false,\"allow_ragged_batch\":false,\"optional\":false}");
        } else {
            const char *labels = sp[i].label_filename ? sp[i].label_filename : "";
            rc |= kd_buf_puts(b, "],\"label_filename\":\"");
            rc |= kd_buf_json_escape(b, labels, strlen(labels));
            rc |= kd_buf_puts(b, "\",\"is_shape_tensor\":false}");
        }
    }
    return rc | kd_buf_puts(b, "]");
}

static int put_version_policy(struct kd_buf *b, const kd_model_config *c)
{
    switch (c->policy) {
    case KD_VERSION_ALL: return kd_buf_puts(b, ",\"version_policy\":{\"all\":{}}");
    case KD_VERSION_SPECIFIC: {
        int rc = kd_buf_puts(b, ",\"version_policy\":{\"specific\":{\"versions\":[");
        for (int i = 0; i < c->nspecific; i++)
            rc |= kd_buf_printf(b, "%s%lld", i ? "," : "", (long long)c->specific[i]);
        return rc | kd_buf_puts(b, "]}}");
    }
    default:
        return kd_buf_printf(b, ",\"version_policy\":{\"latest\":{\"num_versions\":%d}}",
                             c->latest_n > 0 ? c->latest_n : 1);
    }
}

/* KIND_CPU for the cpu device; KIND_GPU with its index for cuda:N, hip:N, vulkan:N. */
static int put_instance_group(struct kd_buf *b, const char *name, const kd_model_config *c)
{
    const char *dev = c->device && c->device[0] ? c->device : "cpu";
    const char *colon = strchr(dev, ':');
    bool cpu = strncmp(dev, "cpu", 3) == 0;
    int rc = kd_buf_puts(b, ",\"instance_group\":[{\"name\":\"");
    rc |= kd_buf_json_escape(b, name, strlen(name));
    rc |= kd_buf_printf(b, "_0\",\"kind\":\"%s\",\"count\":%d,\"gpus\":[", cpu ? "KIND_CPU" : "KIND_GPU",
                        c->instance_count > 0 ? c->instance_count : 1);
    if (!cpu)
        rc |= kd_buf_printf(b, "%d", colon ? atoi(colon + 1) : 0);
    return rc | kd_buf_puts(b, "]}]");
}

int kd_serving_config_json(struct kd_buf *b, const char *name, const char *format, const kd_model_config *c)
{
    bool batched = c->max_batch_size > 0;
    int rc = kd_buf_puts(b, "{\"name\":\"");
    rc |= kd_buf_json_escape(b, name, strlen(name));
    rc |= kd_buf_printf(b, "\",\"platform\":\"%s\",\"backend\":\"kiln\"", format);
    rc |= put_version_policy(b, c);
    rc |= kd_buf_printf(b, ",\"max_batch_size\":%d", batched ? c->max_batch_size : 0);
    rc |= put_tensors(b, "input", c->inputs, c->ninputs, batched, true);
    rc |= put_tensors(b, "output", c->outputs, c->noutputs, batched, false);
    if (batched) {
        rc |= kd_buf_puts(b, ",\"dynamic_batching\":{\"preferred_batch_size\":[");
        for (int i = 0; i < c->npreferred; i++)
            rc |= kd_buf_printf(b, "%s%lld", i ? "," : "", (long long)c->preferred_batch_sizes[i]);
        rc |= kd_buf_printf(b, "],\"max_queue_delay_microseconds\":%lld,\"preserve_ordering\":false}",
                            (long long)c->max_queue_delay_us);
    }
    rc |= put_instance_group(b, name, c);
    rc |= kd_buf_printf(b, ",\"default_model_filename\":\"model.%s\"}", format);
    return rc;
}

/* ---- metadata and statistics ---- */

int kd_serving_specs_json(struct kd_buf *b, const char *key, const kd_model_tensor_spec *sp, int n)
{
    int rc = kd_buf_printf(b, ",\"%s\":[", key);
    for (int i = 0; i < n; i++) {
        rc |= kd_buf_puts(b, i ? ",{\"name\":\"" : "{\"name\":\"");
        rc |= kd_buf_json_escape(b, sp[i].name, strlen(sp[i].name));
        rc |= kd_buf_printf(b, "\",\"datatype\":\"%s\",\"shape\":[", sp[i].datatype);
        for (int d = 0; d < sp[i].ndim; d++)
            rc |= kd_buf_printf(b, "%s%lld", d ? "," : "", (long long)sp[i].shape[d]);
        rc |= kd_buf_puts(b, "]}");
    }
    return rc | kd_buf_puts(b, "]");
}

/*
 * Triton's statistics for one version. kilnd times a run as a whole: compute_infer holds it, and
 * compute_input/compute_output count the same runs with their time included there (ns 0). No
 * response cache exists, so cache_hit and cache_miss are 0.
 */
int kd_serving_stats_json(struct kd_buf *b, struct kd_sched_model *m)
{
    struct kd_sched_stats st;
    kd_sched_model_stats(m, &st);
    int rc = kd_buf_puts(b, "{\"name\":\"");
    rc |= kd_buf_json_escape(b, kd_sched_model_name(m), strlen(kd_sched_model_name(m)));
    rc |= kd_buf_printf(
        b,
        "\",\"version\":\"%lld\",\"last_inference\":%llu,\"inference_count\":%llu,"
        "\"execution_count\":%llu,\"inference_stats\":{"
        "\"success\":{\"count\":%llu,\"ns\":%llu},\"fail\":{\"count\":%llu,\"ns\":%llu},"
        "\"queue\":{\"count\":%llu,\"ns\":%llu},\"compute_input\":{\"count\":%llu,\"ns\":0},"
        "\"compute_infer\":{\"count\":%llu,\"ns\":%llu},\"compute_output\":{\"count\":%llu,\"ns\":0},"
        "\"cache_hit\":{\"count\":0,\"ns\":0},\"cache_miss\":{\"count\":0,\"ns\":0}},"
        "\"batch_stats\":[",
        (long long)kd_sched_model_version(m), (unsigned long long)st.last_inference_ms,
        (unsigned long long)st.inference_count, (unsigned long long)st.execution_count,
        (unsigned long long)st.success_count, (unsigned long long)st.success_ns, (unsigned long long)st.fail_count,
        (unsigned long long)st.fail_ns, (unsigned long long)st.queue_count, (unsigned long long)st.queue_ns,
        (unsigned long long)st.compute_count, (unsigned long long)st.compute_count,
        (unsigned long long)st.compute_request_ns, (unsigned long long)st.compute_count);
    for (int i = 0; i < st.nbatches; i++) /* runs by their exact batch size, as Triton counts them */
        rc |= kd_buf_printf(b, "%s{\"batch_size\":%lld,\"compute_infer\":{\"count\":%llu,\"ns\":%llu}}",
                            i ? "," : "", (long long)st.batches[i].size, (unsigned long long)st.batches[i].count,
                            (unsigned long long)st.batches[i].compute_ns);
    return rc | kd_buf_puts(b, "]}");
}
