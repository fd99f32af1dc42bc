/*
 * api/serving-load-checks.c — what a model load checks and says before and as its versions load:
 * a version its policy selects that is not valid (which fails the load), a "specific" policy
 * naming a version with no folder, a device no worker drives, a batching delay past the request
 * timeout. Kept apart from serving.c's model table, which acts on what these decide.
 */
#include <stdio.h>
#include <string.h>

#include "logf.h"
#include "serving-impl.h"

#define vlog(sv, level, ...) kd_api_logf((sv)->o.log, (sv)->o.log_ud, (level), __VA_ARGS__)

/* A dynamic batching delay longer than the request timeout is a configuration that only works
 * because the batcher sends a batch early for its oldest request's deadline: said once per load. */
void kd_serving_warn_batching_delay(struct kd_serving *sv, struct kd_sched_model *m)
{
    const kd_model_config *c = kd_sched_model_config(m);
    if (c->max_batch_size > 0 && c->max_queue_delay_us / 1000 >= sv->o.infer_timeout_ms)
        vlog(sv, KD_LOG_WARN,
             "model %s version %lld: dynamic_batching.max_queue_delay_us (%lld) is not shorter than "
             "limits.infer_timeout_ms (%lld ms): a batch then goes when its oldest request's deadline "
             "comes near, rather than after the delay",
             kd_sched_model_name(m), (long long)kd_sched_model_version(m), (long long)c->max_queue_delay_us,
             (long long)sv->o.infer_timeout_ms);
}

/* The version policy the repository applies: the newest valid version's config (the model
 * folder's when it has none); NULL when no version is valid. */
static const kd_model_config *policy_config(const kd_model_info *info)
{
    for (int i = info->nversions - 1; i >= 0; i--)
        if (info->versions[i].valid)
            return &info->versions[i].config;
    return NULL;
}

/* Whether a "specific" version policy lists version. */
static bool policy_lists(const kd_model_config *pc, int64_t version)
{
    for (int k = 0; k < pc->nspecific; k++)
        if (pc->specific[k] == version)
            return true;
    return false;
}

/*
 * The newest version folder the model's version policy selects that is not valid, or NULL.
 *
 * The repository marks only valid versions served, so a newest version that is broken would
 * leave the choice to an older one, and a load would answer 200 while the version it was asked
 * to bring in was never tried. As Triton applies its policy to the version folders present, the
 * policy is applied here to every version folder, valid or not, and one it selects that is not
 * valid fails the load (what was served before stays served). The policy is the one the
 * repository read: the newest valid version's config (the model folder's when it has none).
 */
const kd_model_version *kd_serving_selected_invalid(const kd_model_info *info)
{
    const kd_model_config *pc = policy_config(info);
    if (!pc)
        return NULL; /* no valid version: the model's own reason names the newest one */
    int selected = 0;
    for (int i = info->nversions - 1; i >= 0; i--) {
        const kd_model_version *v = &info->versions[i];
        bool chosen = pc->policy == KD_VERSION_ALL      ? true
                      : pc->policy == KD_VERSION_LATEST ? selected < pc->latest_n
                                                        : policy_lists(pc, v->version);
        selected += chosen;
        if (chosen && !v->valid)
            return v;
    }
    return NULL;
}

static void list_device(void *ctx, const char *spec, kiln_device *dev)
{
    (void)dev;
    struct kd_buf *b = ctx;
    char shown[200];
    kiln_device_spec_redact(spec, shown, sizeof shown);
    if ((b->len && kd_buf_append(b, ", ", 2)) || kd_buf_append(b, shown, strlen(shown)))
        b->len = 0; /* out of memory: no list rather than half of one */
}

/* A "specific" policy that lists a version with no folder loads the others; said, so that a
 * version number mistyped in config.json does not go unseen. */
void kd_serving_warn_unlisted_specific(struct kd_serving *sv, const kd_model_info *info)
{
    const kd_model_config *pc = policy_config(info);
    for (int k = 0; pc && pc->policy == KD_VERSION_SPECIFIC && k < pc->nspecific; k++) {
        bool present = false;
        for (int i = 0; i < info->nversions && !present; i++)
            present = info->versions[i].version == pc->specific[k];
        if (!present)
            vlog(sv, KD_LOG_WARN,
                 "model %s: version_policy.specific lists version %lld, which has no folder; the other versions "
                 "it lists are served",
                 info->name, (long long)pc->specific[k]);
    }
}

/* A model version's device that no worker drives, said with the model, the version and the devices
 * that are configured, as a job spec's device is (trainer-spec.c), so that the fix is in the message. */
void kd_serving_unknown_device(struct kd_serving *sv, const char *name, int64_t version, const char *device,
                               char *why, size_t n)
{
    struct kd_buf list = {0};
    kd_sched_each_device(sv->o.sched, list_device, &list);
    char shown[200];
    snprintf(
        why, n,
        "model '%s' version %lld: device '%s' is not one of the configured devices (%.*s: the devices setting; "
        "write a model's device as it is written there, or as the device names itself, e.g. vulkan:0 for vulkan)",
        name, (long long)version, kiln_device_spec_redact(device, shown, sizeof shown),
        list.len ? (int)(list.len > 400 ? 400 : list.len) : 4, list.len ? list.data : "none");
    kd_buf_free(&list);
}
