/*
 * backends/vulkan/vk-pipeline.c — compute pipelines built on first use per (shader,
 * variant, specialization constants) from the SPIR-V embedded at build time, the
 * VkPipelineCache persisted between runs, and kvk_dispatch, the one way a kernel runs.
 *
 * The pipeline cache lives in a file named after the device's pipelineCacheUUID under the
 * data directory: $KILN_DATA_DIR/cache/ when that is set, else $XDG_CACHE_HOME/kiln/ (or
 * ~/.cache/kiln/). A file whose header does not match this device and driver, or that the
 * driver refuses, is ignored with one line on stderr and replaced at close; a missing
 * directory only means no cache. The file is written to a temporary name and renamed, so
 * a crash never leaves half a cache behind.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error-impl.h"
#include "vk-impl.h"

#define KVK_PIPE_BUCKETS 256

typedef struct kvk_pipeline {
    char shader[48];
    char variant[32];
    kvk_spec spec;
    VkShaderModule module;
    VkPipeline pipe;
    struct kvk_pipeline *next;
} kvk_pipeline;

/* ------------------------------------------------------------------ the cache file */

static int mkdir_p(const char *path)
{
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    return mkdir(tmp, 0755) < 0 && errno != EEXIST ? -1 : 0;
}

static void cache_path_of(kvk_device *d)
{
    char dir[900];
    const char *data = getenv("KILN_DATA_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (data && *data)
        snprintf(dir, sizeof dir, "%s/cache", data);
    else if (xdg && *xdg)
        snprintf(dir, sizeof dir, "%s/kiln", xdg);
    else if (home && *home)
        snprintf(dir, sizeof dir, "%s/.cache/kiln", home);
    else
        return;
    char uuid[2 * VK_UUID_SIZE + 1];
    for (unsigned i = 0; i < VK_UUID_SIZE; i++)
        snprintf(uuid + 2 * i, 3, "%02x", d->props.pipelineCacheUUID[i]);
    snprintf(d->cache_path, sizeof d->cache_path, "%s/vulkan-pipelines-%04x-%04x-%s.bin", dir, d->props.vendorID,
             d->props.deviceID, uuid);
}

/* The file's bytes when its header (VkPipelineCacheHeaderVersionOne) matches this device,
 * else NULL with *why saying what was wrong (NULL *why: there is no file). */
static void *read_cache(kvk_device *d, size_t *n, const char **why)
{
    *why = NULL;
    FILE *f = fopen(d->cache_path, "rb");
    if (!f)
        return NULL;
    void *data = NULL;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        len = ftell(f);
    if (len < 32 || len > (64L << 20) || fseek(f, 0, SEEK_SET) != 0) {
        *why = "its size is not a pipeline cache's";
        fclose(f);
        return NULL;
    }
    data = malloc((size_t)len);
    if (!data || fread(data, 1, (size_t)len, f) != (size_t)len) {
        *why = "it cannot be read";
        free(data);
        fclose(f);
        return NULL;
    }
    fclose(f);
    const unsigned char *h = data;
    uint32_t hlen, version, vendor, device;
    memcpy(&hlen, h, 4);
    memcpy(&version, h + 4, 4);
    memcpy(&vendor, h + 8, 4);
    memcpy(&device, h + 12, 4);
    if (hlen < 32 || hlen > (uint32_t)len || version != VK_PIPELINE_CACHE_HEADER_VERSION_ONE ||
        vendor != d->props.vendorID || device != d->props.deviceID ||
        memcmp(h + 16, d->props.pipelineCacheUUID, VK_UUID_SIZE) != 0) {
        *why = "its header does not match this device and driver";
        free(data);
        return NULL;
    }
    *n = (size_t)len;
    return data;
}

int kvk_pipelines_init(kvk_device *d)
{
    d->pipelines = calloc(KVK_PIPE_BUCKETS, sizeof(kvk_pipeline *));
    if (!d->pipelines)
        return kiln__error_set_code(KILN_ENOMEM, "vulkan: out of memory");
    cache_path_of(d);
    size_t n = 0;
    const char *why = NULL;
    void *data = d->cache_path[0] ? read_cache(d, &n, &why) : NULL;
    VkPipelineCacheCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO,
        .initialDataSize = data ? n : 0,
        .pInitialData = data,
    };
    VkResult r = vkCreatePipelineCache(d->dev, &ci, NULL, &d->cache);
    if (r != VK_SUCCESS && data) {
        why = "the driver refused it";
        ci.initialDataSize = 0;
        ci.pInitialData = NULL;
        r = vkCreatePipelineCache(d->dev, &ci, NULL, &d->cache);
    } else if (data) {
        d->cache_loaded = true;
    }
    free(data);
    if (why)
        kiln__warn("vulkan: ignoring the pipeline cache %s: %s", d->cache_path, why);
    if (r != VK_SUCCESS) {
        d->cache = VK_NULL_HANDLE;
        return kvk_vk_error(d, "vulkan", "vkCreatePipelineCache", r);
    }
    return 0;
}

int kvk_pipeline_cache_save(kvk_device *d)
{
    if (!d->cache || !d->cache_path[0])
        return 0;
    size_t n = 0;
    if (vkGetPipelineCacheData(d->dev, d->cache, &n, NULL) != VK_SUCCESS || n == 0)
        return 0;
    void *data = malloc(n);
    if (!data)
        return KILN_ENOMEM;
    int rc = 0;
    if (vkGetPipelineCacheData(d->dev, d->cache, &n, data) == VK_SUCCESS) {
        char dir[1024], tmp[1100];
        snprintf(dir, sizeof dir, "%s", d->cache_path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = '\0';
        snprintf(tmp, sizeof tmp, "%s.tmp%ld", d->cache_path, (long)getpid());
        FILE *f = NULL;
        if (mkdir_p(dir) == 0)
            f = fopen(tmp, "wb");
        if (f) {
            bool ok = fwrite(data, 1, n, f) == n;
            ok = fflush(f) == 0 && ok;
            ok = fsync(fileno(f)) == 0 && ok;
            ok = fclose(f) == 0 && ok;
            if (!ok || rename(tmp, d->cache_path) != 0) {
                unlink(tmp);
                rc = KILN_EIO;
            }
        } else {
            rc = KILN_EIO;
        }
    }
    free(data);
    return rc;
}

void kvk_pipelines_destroy(kvk_device *d)
{
    if (kvk_fused_destroy)
        kvk_fused_destroy(d);
    if (d->pipelines) {
        for (int i = 0; i < KVK_PIPE_BUCKETS; i++) {
            kvk_pipeline *p = d->pipelines[i];
            while (p) {
                kvk_pipeline *n = p->next;
                vkDestroyPipeline(d->dev, p->pipe, NULL);
                vkDestroyShaderModule(d->dev, p->module, NULL);
                free(p);
                p = n;
            }
        }
        free(d->pipelines);
        d->pipelines = NULL;
    }
    if (d->cache) {
        kvk_pipeline_cache_save(d);
        vkDestroyPipelineCache(d->dev, d->cache, NULL);
        d->cache = VK_NULL_HANDLE;
    }
}

/* ------------------------------------------------------------------ pipelines */

static uint32_t hash_key(const char *shader, const char *variant, const kvk_spec *s)
{
    uint32_t h = 2166136261u;
    for (const char *p = shader; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    for (const char *p = variant; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    for (int i = 0; i < 3; i++)
        h = (h ^ s->wg[i]) * 16777619u;
    for (uint32_t i = 0; i < s->n; i++)
        h = (h ^ s->c[i]) * 16777619u;
    return h % KVK_PIPE_BUCKETS;
}

static bool same_spec(const kvk_spec *a, const kvk_spec *b)
{
    if (a->n != b->n || memcmp(a->wg, b->wg, sizeof a->wg) != 0)
        return false;
    return memcmp(a->c, b->c, a->n * sizeof a->c[0]) == 0;
}

static kvk_pipeline *build(kvk_device *d, const char *op, const char *shader, const char *variant,
                           const kvk_spec *spec)
{
    size_t nbytes = 0;
    const uint32_t *code = kvk_shader_code(shader, variant, &nbytes);
    if (!code) {
        kiln__error_set("%s: the vulkan backend has no kernel '%s' for %s", op, shader, variant);
        return NULL;
    }
    kvk_pipeline *p = calloc(1, sizeof *p);
    if (!p) {
        kiln__error_set_code(KILN_ENOMEM, "%s: out of host memory", op);
        return NULL;
    }
    snprintf(p->shader, sizeof p->shader, "%s", shader);
    snprintf(p->variant, sizeof p->variant, "%s", variant);
    p->spec = *spec;
    p->pipe = kvk_pipeline_from_spirv(d, op, code, nbytes, spec, &p->module);
    if (!p->pipe) {
        free(p);
        return NULL;
    }
    return p;
}

VkPipeline kvk_pipeline_from_spirv(kvk_device *d, const char *op, const uint32_t *code, size_t nbytes,
                                   const kvk_spec *spec, VkShaderModule *module)
{
    VkShaderModuleCreateInfo mci = {
        .sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
        .codeSize = nbytes,
        .pCode = code,
    };
    VkResult r = vkCreateShaderModule(d->dev, &mci, NULL, module);
    if (r != VK_SUCCESS) {
        kvk_vk_error(d, op, "vkCreateShaderModule", r);
        return VK_NULL_HANDLE;
    }
    VkSpecializationMapEntry map[3 + KVK_SPEC_MAX];
    uint32_t values[3 + KVK_SPEC_MAX];
    uint32_t nmap = 3 + spec->n;
    for (uint32_t i = 0; i < nmap; i++) {
        map[i] = (VkSpecializationMapEntry){.constantID = i, .offset = 4 * i, .size = 4};
        values[i] = i < 3 ? (spec->wg[i] ? spec->wg[i] : 1) : spec->c[i - 3];
    }
    VkSpecializationInfo si = {
        .mapEntryCount = nmap,
        .pMapEntries = map,
        .dataSize = 4 * nmap,
        .pData = values,
    };
    VkComputePipelineCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage =
            {
                .sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                .module = *module,
                .pName = "main",
                .pSpecializationInfo = &si,
            },
        .layout = d->pipe_layout,
    };
    VkPipeline pipe = VK_NULL_HANDLE;
    r = vkCreateComputePipelines(d->dev, d->cache, 1, &ci, NULL, &pipe);
    if (r != VK_SUCCESS) {
        vkDestroyShaderModule(d->dev, *module, NULL);
        *module = VK_NULL_HANDLE;
        kvk_vk_error(d, op, "vkCreateComputePipelines", r);
        return VK_NULL_HANDLE;
    }
    return pipe;
}

static VkPipeline pipeline_for(kvk_device *d, const char *op, const char *shader, const char *variant,
                               const kvk_spec *spec)
{
    uint32_t h = hash_key(shader, variant, spec);
    pthread_mutex_lock(&d->pipe_lock);
    kvk_pipeline *p = d->pipelines[h];
    while (p && !(strcmp(p->shader, shader) == 0 && strcmp(p->variant, variant) == 0 && same_spec(&p->spec, spec)))
        p = p->next;
    if (!p) {
        p = build(d, op, shader, variant, spec);
        if (p) {
            p->next = d->pipelines[h];
            d->pipelines[h] = p;
        }
    }
    pthread_mutex_unlock(&d->pipe_lock);
    return p ? p->pipe : VK_NULL_HANDLE;
}

/* ------------------------------------------------------------------ dispatch */

static int record_dispatch(kvk_queue *q, const char *op, VkPipeline pipe, kiln_buffer *const *bufs, int nbufs,
                           const void *params, size_t params_bytes, uint32_t gx, uint32_t gy, uint32_t gz);

int kvk_dispatch(kvk_queue *q, const char *op, const char *shader, const char *variant, const kvk_spec *spec,
                 kiln_buffer *const *bufs, int nbufs, const void *params, size_t params_bytes, uint32_t gx,
                 uint32_t gy, uint32_t gz)
{
    kvk_device *d = q->d;
    if (nbufs < 0 || nbufs > KVK_MAX_BUFS)
        return kiln__error_set("%s: %d operand buffers (the vulkan backend binds at most %d)", op, nbufs,
                               KVK_MAX_BUFS),
               KILN_EINVAL;
    kvk_spec s1 = kvk_spec_1d(0, NULL);
    if (!spec)
        spec = &s1;
    if (spec->n > KVK_SPEC_MAX)
        return kiln__error_set("%s: %u specialization constants (at most %d)", op, spec->n, KVK_SPEC_MAX),
               KILN_EINVAL;
    VkPipeline pipe = pipeline_for(d, op, shader, variant, spec);
    if (!pipe)
        return atomic_load(&d->lost) ? KILN_EDEVICE : KILN_ENOTSUP;
    pthread_mutex_lock(&q->lock);
    int rc = record_dispatch(q, op, pipe, bufs, nbufs, params, params_bytes, gx, gy, gz);
    pthread_mutex_unlock(&q->lock);
    return rc;
}

int kvk_dispatch_pipeline(kvk_queue *q, const char *op, VkPipeline pipe, kiln_buffer *const *bufs, int nbufs,
                          const void *params, size_t params_bytes, uint32_t gx, uint32_t gy, uint32_t gz)
{
    if (nbufs < 0 || nbufs > KVK_MAX_BUFS)
        return kiln__error_set("%s: %d operand buffers (the vulkan backend binds at most %d)", op, nbufs,
                               KVK_MAX_BUFS),
               KILN_EINVAL;
    pthread_mutex_lock(&q->lock);
    int rc = record_dispatch(q, op, pipe, bufs, nbufs, params, params_bytes, gx, gy, gz);
    pthread_mutex_unlock(&q->lock);
    return rc;
}

static int record_dispatch(kvk_queue *q, const char *op, VkPipeline pipe, kiln_buffer *const *bufs, int nbufs,
                           const void *params, size_t params_bytes, uint32_t gx, uint32_t gy, uint32_t gz)
{
    kvk_device *d = q->d;
    VkBuffer pbuf;
    VkDeviceSize poff;
    size_t pbytes = params_bytes ? params_bytes : 4;
    void *p = kvk_host_stage(q, pbytes, &pbuf, &poff, op);
    if (!p)
        return KILN_ENOMEM;
    if (params_bytes)
        memcpy(p, params, params_bytes);
    else
        memset(p, 0, 4);
    VkCommandBuffer cmd = kvk_record(q, op);
    if (!cmd)
        return KILN_EDEVICE;
    VkDescriptorBufferInfo info[KVK_MAX_BUFS + 1];
    VkWriteDescriptorSet w[KVK_MAX_BUFS + 1];
    info[0] = (VkDescriptorBufferInfo){.buffer = pbuf, .offset = poff, .range = pbytes};
    for (int i = 0; i < nbufs; i++) {
        kiln_buffer *b = bufs[i] ? bufs[i] : d->dummy;
        VkDeviceSize range = b->nbytes ? (b->nbytes + 3) / 4 * 4 : 4;
        if (range > b->cls)
            range = b->cls;
        info[i + 1] = (VkDescriptorBufferInfo){.buffer = b->vkbuf, .offset = b->offset, .range = range};
    }
    for (int i = 0; i <= nbufs; i++)
        w[i] = (VkWriteDescriptorSet){
            .sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
            .dstBinding = (uint32_t)i,
            .descriptorCount = 1,
            .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
            .pBufferInfo = &info[i],
        };
    vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
    d->push_descriptors(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, d->pipe_layout, 0, (uint32_t)nbufs + 1, w);
    vkCmdDispatch(cmd, gx ? gx : 1, gy ? gy : 1, gz ? gz : 1);
    return 0;
}
