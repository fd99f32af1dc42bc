/*
 * api/grpc/grpc-shm.c — SystemSharedMemoryStatus, SystemSharedMemoryRegister and
 * SystemSharedMemoryUnregister: Triton's system shared-memory extension over gRPC, on the one
 * table of regions the HTTP routes use too (api/shm.h). Statuses follow HTTP's: a malformed name
 * or key, a key that does not exist or is too small, INVALID_ARGUMENT; an unknown region,
 * NOT_FOUND; a name taken, ALREADY_EXISTS; the region limit, RESOURCE_EXHAUSTED.
 */
#include <stdio.h>
#include <stdlib.h>

#include "grpc-impl.h"
#include "grpc_service.pb-c.h"
#include "shm.h"

static void finish_empty(struct grpc_stream *s, const ProtobufCMessage *m)
{
    if (kd_grpc_reply(s, m) != 0)
        kd_grpc_finish(s, GRPC_RESOURCE_EXHAUSTED, "out of memory for the response");
    else
        kd_grpc_finish_ok(s);
}

struct status_rows {
    Inference__SystemSharedMemoryStatusResponse__RegionsEntry *entries, **ptrs;
    Inference__SystemSharedMemoryStatusResponse__RegionStatus *rows;
    char *text; /* names and keys, copied: each row's two strings */
    size_t n;
};

static void status_row(void *ud, const char *name, const char *key, uint64_t offset, uint64_t byte_size)
{
    struct status_rows *t = ud;
    size_t i = t->n++;
    char *nm = t->text + i * (KD_SHM_NAME_MAX + KD_SHM_KEY_MAX + 4), *ky = nm + KD_SHM_NAME_MAX + 1;
    snprintf(nm, KD_SHM_NAME_MAX + 1, "%s", name);
    snprintf(ky, KD_SHM_KEY_MAX + 3, "%s", key);
    inference__system_shared_memory_status_response__region_status__init(&t->rows[i]);
    t->rows[i].name = nm;
    t->rows[i].key = ky;
    t->rows[i].offset = offset;
    t->rows[i].byte_size = byte_size;
    inference__system_shared_memory_status_response__regions_entry__init(&t->entries[i]);
    t->entries[i].key = nm;
    t->entries[i].value = &t->rows[i];
    t->ptrs[i] = &t->entries[i];
}

void kd_grpc_shm_status(struct grpc_stream *s, const Inference__SystemSharedMemoryStatusRequest *q)
{
    struct kd_shm_table *t = kd_serving_shm(s->conn->g->o.serving);
    size_t cap = (size_t)kd_shm_count(t) + 1;
    struct status_rows rows = {
        .entries = calloc(cap, sizeof *rows.entries),
        .ptrs = calloc(cap, sizeof *rows.ptrs),
        .rows = calloc(cap, sizeof *rows.rows),
        .text = calloc(cap, KD_SHM_NAME_MAX + KD_SHM_KEY_MAX + 4),
    };
    char msg[320];
    if (!rows.entries || !rows.ptrs || !rows.rows || !rows.text) {
        kd_grpc_finish(s, GRPC_RESOURCE_EXHAUSTED, "out of memory");
    } else {
        int st = kd_shm_status(t, q->name, status_row, &rows, msg, sizeof msg);
        if (st != 0) {
            kd_grpc_finish(s, kd_grpc_code_of_http(st), "%s", msg);
        } else {
            Inference__SystemSharedMemoryStatusResponse r = INFERENCE__SYSTEM_SHARED_MEMORY_STATUS_RESPONSE__INIT;
            r.n_regions = rows.n;
            r.regions = rows.ptrs;
            finish_empty(s, &r.base);
        }
    }
    free(rows.entries);
    free(rows.ptrs);
    free(rows.rows);
    free(rows.text);
}

void kd_grpc_shm_register(struct grpc_stream *s, const Inference__SystemSharedMemoryRegisterRequest *q)
{
    char msg[320];
    int st = kd_shm_register(kd_serving_shm(s->conn->g->o.serving), q->name, q->key, q->offset, q->byte_size, msg,
                             sizeof msg);
    if (st != 0) {
        kd_grpc_finish(s, kd_grpc_code_of_http(st), "%s", msg);
        return;
    }
    Inference__SystemSharedMemoryRegisterResponse r = INFERENCE__SYSTEM_SHARED_MEMORY_REGISTER_RESPONSE__INIT;
    finish_empty(s, &r.base);
}

void kd_grpc_shm_unregister(struct grpc_stream *s, const Inference__SystemSharedMemoryUnregisterRequest *q)
{
    char msg[320];
    int st = kd_shm_unregister(kd_serving_shm(s->conn->g->o.serving), q->name, msg, sizeof msg);
    if (st != 0) {
        kd_grpc_finish(s, kd_grpc_code_of_http(st), "%s", msg);
        return;
    }
    Inference__SystemSharedMemoryUnregisterResponse r = INFERENCE__SYSTEM_SHARED_MEMORY_UNREGISTER_RESPONSE__INIT;
    finish_empty(s, &r.base);
}
