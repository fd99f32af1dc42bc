/*
 * backends/vulkan/vk-queue.c — queues: the open command buffer each records into, batched
 * submission ordered by the queue's timeline semaphore, the host-visible ring that holds
 * dispatch parameters and staged uploads/downloads, events, sync, the errors kept for the
 * next sync, and the device-side index checks read back at sync.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk-impl.h"

#define KVK_CHUNK_BYTES ((VkDeviceSize)4 << 20)
/* Host ring memory a queue may hold before it waits for its work to reuse what it has. */
#define KVK_RING_LIMIT ((VkDeviceSize)256 << 20)
#define KVK_CHECKS 32

/* ------------------------------------------------------------------ errors */

void kvk_queue_fail(kvk_queue *q, int code, const char *fmt, ...)
{
    if (q->err)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(q->err_msg, sizeof q->err_msg, fmt, ap);
    va_end(ap);
    q->err = code;
}

int kvk_queue_take_error(kvk_queue *q)
{
    if (q->err) {
        int rc = q->err;
        kiln__error_set_code(rc, "%s", q->err_msg);
        q->err = 0;
        q->err_msg[0] = '\0';
        return rc;
    }
    if (atomic_load(&q->d->lost)) {
        return kiln__error_set_code(
            KILN_EDEVICE, "vulkan: the device '%s' was lost (VK_ERROR_DEVICE_LOST); close it and open it again",
            q->d->name);
    }
    return 0;
}

/* Keep the error just set on the thread for the next sync, and return code. */
static int keep(kvk_queue *q, int code)
{
    kvk_queue_fail(q, code, "%s", kiln_error());
    return code;
}

/* ------------------------------------------------------------------ batches */

uint64_t kvk_completed(kvk_queue *q)
{
    uint64_t v = 0;
    VkResult r = vkGetSemaphoreCounterValue(q->d->dev, q->timeline, &v);
    if (r != VK_SUCCESS) {
        keep(q, kvk_vk_error(q->d, "vulkan", "vkGetSemaphoreCounterValue", r));
        return 0;
    }
    while (q->inflight && q->inflight->value <= v) {
        kvk_batch *b = q->inflight;
        q->inflight = b->next;
        b->next = q->spare;
        q->spare = b;
    }
    return v;
}

int kvk_wait_value(kvk_queue *q, uint64_t value, const char *op)
{
    if (value == 0)
        return 0;
    VkSemaphoreWaitInfo wi = {
        .sType = VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO,
        .semaphoreCount = 1,
        .pSemaphores = &q->timeline,
        .pValues = &value,
    };
    VkResult r = vkWaitSemaphores(q->d->dev, &wi, UINT64_MAX);
    if (r != VK_SUCCESS)
        return keep(q, kvk_vk_error(q->d, op, "vkWaitSemaphores", r));
    kvk_completed(q);
    return 0;
}

static void full_barrier(VkCommandBuffer cmd)
{
    VkMemoryBarrier mb = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
        .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_WRITE_BIT,
        .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                         VK_ACCESS_TRANSFER_WRITE_BIT,
    };
    vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
                         VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0, NULL,
                         0, NULL);
}

VkCommandBuffer kvk_record(kvk_queue *q, const char *op)
{
    if (atomic_load(&q->d->lost)) {
        kiln__error_set_code(KILN_EDEVICE, "%s: the vulkan device '%s' was lost (VK_ERROR_DEVICE_LOST)", op,
                             q->d->name);
        return VK_NULL_HANDLE;
    }
    if (q->open && q->open->ncmds >= KVK_BATCH_MAX && kvk_flush(q, op) < 0)
        return VK_NULL_HANDLE;
    if (!q->open) {
        kvk_completed(q);
        kvk_batch *b = q->spare;
        VkResult r;
        if (b) {
            q->spare = b->next;
            r = vkResetCommandBuffer(b->cmd, 0);
        } else {
            b = calloc(1, sizeof *b);
            if (!b) {
                kiln__error_set_code(KILN_ENOMEM, "%s: out of host memory", op);
                return VK_NULL_HANDLE;
            }
            VkCommandBufferAllocateInfo ai = {
                .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                .commandPool = q->pool,
                .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                .commandBufferCount = 1,
            };
            r = vkAllocateCommandBuffers(q->d->dev, &ai, &b->cmd);
        }
        if (r == VK_SUCCESS) {
            VkCommandBufferBeginInfo bi = {
                .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT,
            };
            r = vkBeginCommandBuffer(b->cmd, &bi);
        }
        if (r != VK_SUCCESS) {
            if (b->cmd)
                vkFreeCommandBuffers(q->d->dev, q->pool, 1, &b->cmd);
            free(b);
            kvk_vk_error(q->d, op, "recording a command buffer", r);
            return VK_NULL_HANDLE;
        }
        b->next = NULL;
        b->ncmds = 0;
        b->value = q->next_value;
        q->open = b;
    }
    /* every command follows everything recorded or submitted before it on the VkQueue */
    full_barrier(q->open->cmd);
    q->open->ncmds++;
    return q->open->cmd;
}

int kvk_flush(kvk_queue *q, const char *op)
{
    kvk_batch *b = q->open;
    if (!b)
        return 0;
    q->open = NULL;
    /* results become visible to the host reads that follow a wait on this batch */
    VkMemoryBarrier mb = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
        .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
        .dstAccessMask = VK_ACCESS_HOST_READ_BIT,
    };
    vkCmdPipelineBarrier(b->cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
    VkResult r = vkEndCommandBuffer(b->cmd);
    if (r == VK_SUCCESS) {
        VkPipelineStageFlags stages[KVK_MAX_WAITS];
        for (int i = 0; i < q->nwaits; i++)
            stages[i] = VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
        VkTimelineSemaphoreSubmitInfo ts = {
            .sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
            .waitSemaphoreValueCount = (uint32_t)q->nwaits,
            .pWaitSemaphoreValues = q->wait_value,
            .signalSemaphoreValueCount = 1,
            .pSignalSemaphoreValues = &b->value,
        };
        VkSubmitInfo si = {
            .sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
            .pNext = &ts,
            .waitSemaphoreCount = (uint32_t)q->nwaits,
            .pWaitSemaphores = q->wait_sem,
            .pWaitDstStageMask = stages,
            .commandBufferCount = 1,
            .pCommandBuffers = &b->cmd,
            .signalSemaphoreCount = 1,
            .pSignalSemaphores = &q->timeline,
        };
        pthread_mutex_lock(&q->d->submit_lock);
        r = vkQueueSubmit(q->d->vkq, 1, &si, VK_NULL_HANDLE);
        pthread_mutex_unlock(&q->d->submit_lock);
    }
    q->nwaits = 0;
    if (r != VK_SUCCESS) {
        /* the batch never runs: its value is never signalled, so nothing may wait on it;
         * the queue keeps the error and goes on from the same value */
        vkFreeCommandBuffers(q->d->dev, q->pool, 1, &b->cmd);
        free(b);
        return keep(q, kvk_vk_error(q->d, op, "vkQueueSubmit", r));
    }
    q->next_value++;
    kvk_batch **tail = &q->inflight;
    while (*tail)
        tail = &(*tail)->next;
    *tail = b;
    return 0;
}

/* ------------------------------------------------------------------ host ring */

static kvk_host_chunk *chunk_new(kvk_queue *q, VkDeviceSize size, const char *op)
{
    kvk_device *d = q->d;
    kvk_host_chunk *c = calloc(1, sizeof *c);
    if (!c) {
        kiln__error_set_code(KILN_ENOMEM, "%s: out of host memory", op);
        return NULL;
    }
    VkBufferCreateInfo bci = {
        .sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
        .size = size,
        .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                 VK_BUFFER_USAGE_TRANSFER_DST_BIT,
        .sharingMode = VK_SHARING_MODE_EXCLUSIVE,
    };
    VkResult r = vkCreateBuffer(d->dev, &bci, NULL, &c->buf);
    if (r != VK_SUCCESS) {
        free(c);
        kvk_vk_error(d, op, "vkCreateBuffer (staging)", r);
        return NULL;
    }
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(d->dev, c->buf, &req);
    VkMemoryPropertyFlags vis = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    int type = kvk_memory_type(d, req.memoryTypeBits, vis | VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
    if (type < 0)
        type = kvk_memory_type(d, req.memoryTypeBits, vis);
    if (type < 0) {
        vkDestroyBuffer(d->dev, c->buf, NULL);
        free(c);
        kiln__error_set("%s: device '%s' has no host-visible coherent memory for staging", op, d->name);
        return NULL;
    }
    VkMemoryAllocateInfo mai = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
        .allocationSize = req.size,
        .memoryTypeIndex = (uint32_t)type,
    };
    r = vkAllocateMemory(d->dev, &mai, NULL, &c->mem);
    if (r == VK_SUCCESS)
        r = vkBindBufferMemory(d->dev, c->buf, c->mem, 0);
    if (r == VK_SUCCESS)
        r = vkMapMemory(d->dev, c->mem, 0, VK_WHOLE_SIZE, 0, &c->map);
    if (r != VK_SUCCESS) {
        if (c->mem)
            vkFreeMemory(d->dev, c->mem, NULL);
        vkDestroyBuffer(d->dev, c->buf, NULL);
        free(c);
        kvk_vk_error(d, op, "allocating staging memory", r);
        return NULL;
    }
    c->size = size;
    return c;
}

static void chunk_free(kvk_device *d, kvk_host_chunk *c)
{
    vkDestroyBuffer(d->dev, c->buf, NULL);
    vkFreeMemory(d->dev, c->mem, NULL);
    free(c);
}

void *kvk_host_stage(kvk_queue *q, size_t n, VkBuffer *buf, VkDeviceSize *off, const char *op)
{
    /* a full batch is submitted now, not by the kvk_record that follows: what is staged
     * here must belong to the batch that reads it (its value guards the chunk's reuse) */
    if (q->open && q->open->ncmds >= KVK_BATCH_MAX && kvk_flush(q, op) < 0)
        return NULL;
    VkDeviceSize align = q->d->feat.align;
    VkDeviceSize need = (n + align - 1) / align * align;
    if (need == 0)
        need = align;
    kvk_host_chunk *c = q->chunks;
    if (!c || (c->used + align - 1) / align * align + need > c->size) {
        /* another chunk: a finished one that is large enough, else a new one */
        uint64_t done = kvk_completed(q);
        VkDeviceSize held = 0;
        kvk_host_chunk **pick = NULL;
        for (kvk_host_chunk **pp = &q->chunks; *pp; pp = &(*pp)->next) {
            held += (*pp)->size;
            if (!pick && (*pp)->last_value <= done && (*pp)->size >= need && *pp != q->chunks)
                pick = pp;
        }
        if (!pick && held + need > KVK_RING_LIMIT && q->chunks) {
            /* the ring is full of work in flight: wait for it, then reuse the first that fits */
            if (kvk_flush(q, op) < 0 || kvk_wait_value(q, q->next_value - 1, op) < 0)
                return NULL;
            for (kvk_host_chunk **pp = &q->chunks; *pp && !pick; pp = &(*pp)->next)
                if ((*pp)->size >= need)
                    pick = pp;
            /* drop the oversized ones that do not fit either, to bound what is held */
        }
        if (pick) {
            c = *pick;
            *pick = c->next;
        } else {
            c = chunk_new(q, need > KVK_CHUNK_BYTES ? need : KVK_CHUNK_BYTES, op);
            if (!c)
                return NULL;
        }
        c->used = 0;
        c->next = q->chunks;
        q->chunks = c;
        /* oversized chunks that finished are not worth keeping */
        for (kvk_host_chunk **pp = &c->next; *pp;) {
            if ((*pp)->size > KVK_CHUNK_BYTES && (*pp)->last_value <= done) {
                kvk_host_chunk *x = *pp;
                *pp = x->next;
                chunk_free(q->d, x);
            } else {
                pp = &(*pp)->next;
            }
        }
    }
    VkDeviceSize at = (c->used + align - 1) / align * align;
    c->used = at + need;
    c->last_value = q->next_value;
    *buf = c->buf;
    *off = at;
    return (char *)c->map + at;
}

/* ------------------------------------------------------------------ device-side checks */

int kvk_check_slot(kvk_queue *q, const char *op, const char *noun, int64_t lo, int64_t hi)
{
    if (!q->check_buf) {
        q->check_buf = kvk_buffer_alloc_device(q->d, KVK_CHECKS * 16, op);
        if (!q->check_buf)
            return -1;
        VkCommandBuffer cmd = kvk_record(q, op);
        if (!cmd)
            return -1;
        vkCmdFillBuffer(cmd, q->check_buf->vkbuf, q->check_buf->offset, KVK_CHECKS * 16, 0);
    }
    if (q->ncheck == KVK_CHECKS && kvk_sync(q) < 0)
        return -1;
    int k = q->ncheck++;
    q->check_op[k] = op;
    q->check_noun[k] = noun;
    q->check_lo[k] = lo;
    q->check_hi[k] = hi;
    return k;
}

/* Read the checks parked since the last sync (their slots: a flag word, then the first
 * offending value as int64), report the first violation, and clear them. The caller has
 * recorded nothing after; this adds a copy and a clear to the open batch. */
static int collect_checks(kvk_queue *q, const uint32_t **slots, VkBuffer *sbuf)
{
    VkDeviceSize soff;
    (void)sbuf;
    void *p = kvk_host_stage(q, KVK_CHECKS * 16, sbuf, &soff, "sync");
    if (!p)
        return KILN_ENOMEM;
    VkCommandBuffer cmd = kvk_record(q, "sync");
    if (!cmd)
        return KILN_EDEVICE;
    VkBufferCopy region = {.srcOffset = q->check_buf->offset, .dstOffset = soff, .size = KVK_CHECKS * 16};
    vkCmdCopyBuffer(cmd, q->check_buf->vkbuf, *sbuf, 1, &region);
    cmd = kvk_record(q, "sync");
    if (!cmd)
        return KILN_EDEVICE;
    vkCmdFillBuffer(cmd, q->check_buf->vkbuf, q->check_buf->offset, KVK_CHECKS * 16, 0);
    *slots = p;
    return 0;
}

static int sync_locked(kvk_queue *q);

int kvk_sync(void *vq)
{
    kvk_queue *q = vq;
    return KVK_LOCKED(q, sync_locked(q));
}

static int sync_locked(kvk_queue *q)
{
    const uint32_t *slots = NULL;
    int nchecks = q->ncheck;
    if (nchecks) {
        VkBuffer sbuf;
        int rc = collect_checks(q, &slots, &sbuf);
        if (rc < 0)
            return rc;
        q->ncheck = 0;
    }
    if (kvk_flush(q, "sync") < 0 || kvk_wait_value(q, q->next_value - 1, "sync") < 0)
        return kvk_queue_take_error(q);
    int rc = kvk_queue_take_error(q);
    if (rc < 0)
        return rc;
    for (int k = 0; k < nchecks; k++) {
        const uint32_t *s = slots + 4 * k;
        if (s[0]) {
            int64_t v = (int64_t)((uint64_t)s[2] | ((uint64_t)s[3] << 32));
            kiln__index_error(q->check_op[k], q->check_noun[k], v, q->check_lo[k], q->check_hi[k]);
            return KILN_EINVAL;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ queues */

void *kvk_queue_open(void *ctx)
{
    kvk_device *d = ctx;
    kvk_queue *q = calloc(1, sizeof *q);
    if (!q) {
        kiln__error_set("vulkan: out of memory opening a queue");
        return NULL;
    }
    q->d = d;
    q->next_value = 1;
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&q->lock, &ma);
    pthread_mutexattr_destroy(&ma);
    VkCommandPoolCreateInfo pci = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
        .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
        .queueFamilyIndex = d->family,
    };
    VkResult r = vkCreateCommandPool(d->dev, &pci, NULL, &q->pool);
    if (r != VK_SUCCESS) {
        free(q);
        kvk_vk_error(d, "queue_open", "vkCreateCommandPool", r);
        return NULL;
    }
    VkSemaphoreTypeCreateInfo tci = {
        .sType = VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO,
        .semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE,
        .initialValue = 0,
    };
    VkSemaphoreCreateInfo sci = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO, .pNext = &tci};
    r = vkCreateSemaphore(d->dev, &sci, NULL, &q->timeline);
    if (r != VK_SUCCESS) {
        vkDestroyCommandPool(d->dev, q->pool, NULL);
        free(q);
        kvk_vk_error(d, "queue_open", "vkCreateSemaphore", r);
        return NULL;
    }
    pthread_mutex_lock(&d->queues_lock);
    q->next = d->queues;
    d->queues = q;
    pthread_mutex_unlock(&d->queues_lock);
    return q;
}

void kvk_queue_close(void *vq)
{
    kvk_queue *q = vq;
    if (!q)
        return;
    kvk_device *d = q->d;
    pthread_mutex_lock(&q->lock);
    kvk_flush(q, "queue_close");
    if (!atomic_load(&d->lost))
        kvk_wait_value(q, q->next_value - 1, "queue_close");
    else
        vkDeviceWaitIdle(d->dev);
    if (q->check_buf)
        kvk_buffer_free(q, q->check_buf);
    kvk_alloc_forget_queue(d, q);
    for (kvk_batch *lists[2] = {q->inflight, q->spare}, **l = lists; l < lists + 2; l++)
        for (kvk_batch *b = *l; b;) {
            kvk_batch *n = b->next;
            free(b);
            b = n;
        }
    while (q->chunks) {
        kvk_host_chunk *c = q->chunks;
        q->chunks = c->next;
        chunk_free(d, c);
    }
    vkDestroyCommandPool(d->dev, q->pool, NULL);
    vkDestroySemaphore(d->dev, q->timeline, NULL);
    pthread_mutex_unlock(&q->lock);
    pthread_mutex_destroy(&q->lock);
    pthread_mutex_lock(&d->queues_lock);
    for (kvk_queue **pp = &d->queues; *pp; pp = &(*pp)->next)
        if (*pp == q) {
            *pp = q->next;
            break;
        }
    pthread_mutex_unlock(&d->queues_lock);
    free(q);
}

/* ------------------------------------------------------------------ events */

kiln_backend_event *kvk_event_record(void *vq)
{
    kvk_queue *q = vq;
    pthread_mutex_lock(&q->lock);
    int rc = kvk_flush(q, "event_record");
    uint64_t value = q->next_value - 1;
    pthread_mutex_unlock(&q->lock);
    if (rc < 0)
        return NULL;
    kiln_backend_event *ev = malloc(sizeof *ev);
    if (!ev) {
        kiln__error_set("event_record: out of memory");
        return NULL;
    }
    ev->q = q;
    ev->value = value;
    return ev;
}

static int event_wait_locked(kvk_queue *q, kiln_backend_event *ev);

int kvk_event_wait(void *vq, kiln_backend_event *ev)
{
    kvk_queue *q = vq;
    return KVK_LOCKED(q, event_wait_locked(q, ev));
}

static int event_wait_locked(kvk_queue *q, kiln_backend_event *ev)
{
    if (ev->q == q || ev->value == 0)
        return 0;
    for (int i = 0; i < q->nwaits; i++)
        if (q->wait_sem[i] == ev->q->timeline) {
            if (q->wait_value[i] < ev->value)
                q->wait_value[i] = ev->value;
            return 0;
        }
    if (q->nwaits == KVK_MAX_WAITS) {
        /* the open batch has as many waits as it takes: submit it (with them) first */
        if (q->open) {
            if (kvk_flush(q, "event_wait") < 0)
                return kvk_queue_take_error(q);
        } else {
            /* no work to carry them: wait on the host for the oldest instead */
            VkSemaphoreWaitInfo wi = {
                .sType = VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO,
                .semaphoreCount = (uint32_t)q->nwaits,
                .pSemaphores = q->wait_sem,
                .pValues = q->wait_value,
            };
            VkResult r = vkWaitSemaphores(q->d->dev, &wi, UINT64_MAX);
            q->nwaits = 0;
            if (r != VK_SUCCESS)
                return kvk_vk_error(q->d, "event_wait", "vkWaitSemaphores", r);
        }
    }
    q->wait_sem[q->nwaits] = ev->q->timeline;
    q->wait_value[q->nwaits] = ev->value;
    q->nwaits++;
    return 0;
}

int kvk_event_sync(void *vq, kiln_backend_event *ev)
{
    kvk_queue *q = vq;
    kvk_queue *home = ev->q;
    VkSemaphoreWaitInfo wi = {
        .sType = VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO,
        .semaphoreCount = 1,
        .pSemaphores = &home->timeline,
        .pValues = &ev->value,
    };
    if (ev->value) {
        VkResult r = vkWaitSemaphores(q->d->dev, &wi, UINT64_MAX);
        if (r != VK_SUCCESS)
            return kvk_vk_error(q->d, "event_sync", "vkWaitSemaphores", r);
    }
    return KVK_LOCKED(q, kvk_queue_take_error(q));
}

int kvk_event_query(void *vq, kiln_backend_event *ev)
{
    kvk_queue *q = vq;
    if (atomic_load(&q->d->lost))
        return KVK_LOCKED(q, kvk_queue_take_error(q));
    uint64_t v = 0;
    VkResult r = vkGetSemaphoreCounterValue(q->d->dev, ev->q->timeline, &v);
    if (r != VK_SUCCESS)
        return kvk_vk_error(q->d, "event_query", "vkGetSemaphoreCounterValue", r);
    return v >= ev->value ? 1 : 0;
}

void kvk_event_free(void *vq, kiln_backend_event *ev)
{
    (void)vq;
    free(ev);
}
