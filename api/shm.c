/*
 * api/shm.c — the table of registered system shared-memory regions (see shm.h for the rules), and
 * the copy of a finished request's outputs into the slices it named.
 *
 * A region is one mapping of [offset, offset + byte_size) of a POSIX shared-memory object, with
 * a reference count: the table holds one while it is registered and each request that uses it
 * holds one. The descriptor stays open so that each use can check, with fstat, that the object
 * still covers the mapping: touching a page past a shrunk object's end would be SIGBUS.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shm.h"

struct kd_shm_region {
    atomic_int refs;
    char name[KD_SHM_NAME_MAX + 1];
    char key[KD_SHM_KEY_MAX + 2];
    uint64_t offset, byte_size;
    int fd;
    void *map; /* from the page holding offset */
    size_t map_len;
    uint8_t *base;              /* the region's first byte: map + (offset - its page start) */
    struct kd_shm_region *next; /* the table's list, in registration order */
};

struct kd_shm_table {
    struct kd_shm_region *head;
    int count;
};

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.';
}

static bool word_valid(const char *s, size_t max)
{
    size_t n = 0;
    for (; s[n]; n++)
        if (n >= max || !name_char(s[n]))
            return false;
    return n > 0;
}

bool kd_shm_name_valid(const char *name)
{
    return name && word_valid(name, KD_SHM_NAME_MAX);
}

static bool key_valid(const char *key)
{
    return key && key[0] == '/' && word_valid(key + 1, KD_SHM_KEY_MAX) && strcmp(key, "/.") != 0 &&
           strcmp(key, "/..") != 0;
}

struct kd_shm_table *kd_shm_table_new(void)
{
    return calloc(1, sizeof(struct kd_shm_table));
}

static void region_release(struct kd_shm_region *r)
{
    if (atomic_fetch_sub(&r->refs, 1) != 1)
        return;
    munmap(r->map, r->map_len);
    close(r->fd);
    free(r);
}

void kd_shm_table_free(struct kd_shm_table *t)
{
    if (!t)
        return;
    kd_shm_unregister(t, NULL, NULL, 0);
    free(t);
}

static struct kd_shm_region *find(const struct kd_shm_table *t, const char *name)
{
    for (struct kd_shm_region *r = t->head; r; r = r->next)
        if (strcmp(r->name, name) == 0)
            return r;
    return NULL;
}

int kd_shm_count(const struct kd_shm_table *t)
{
    return t->count;
}

int kd_shm_register(struct kd_shm_table *t, const char *name, const char *key, uint64_t offset, uint64_t byte_size,
                    char *msg, size_t n)
{
    if (!kd_shm_name_valid(name)) {
        snprintf(msg, n, "a region name is 1 to %d characters of A-Z a-z 0-9 _ . -", KD_SHM_NAME_MAX);
        return 400;
    }
    if (!key_valid(key)) {
        snprintf(msg, n, "a shared-memory key is '/' then 1 to %d characters of A-Z a-z 0-9 _ . -",
                 KD_SHM_KEY_MAX);
        return 400;
    }
    if (byte_size == 0) {
        snprintf(msg, n, "byte_size must be positive");
        return 400;
    }
    uint64_t end;
    if (__builtin_add_overflow(offset, byte_size, &end) || end > (uint64_t)INT64_MAX || byte_size > SIZE_MAX / 2) {
        snprintf(msg, n, "offset + byte_size is out of range");
        return 400;
    }
    if (find(t, name)) {
        snprintf(msg, n, "shared memory region '%s' is already registered", name);
        return 409;
    }
    if (t->count >= KD_SHM_MAX_REGIONS) {
        snprintf(msg, n, "at most %d shared memory regions may be registered", KD_SHM_MAX_REGIONS);
        return 429;
    }
    int fd = shm_open(key, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(msg, n, "unable to open shared memory key '%s': %s", key, strerror(errno));
        return 400;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(msg, n, "shared memory key '%s' is not a shared-memory object kilnd can map", key);
        close(fd);
        return 400;
    }
    if ((uint64_t)st.st_size < end) {
        snprintf(msg, n, "shared memory key '%s' holds %lld bytes, fewer than offset + byte_size (%llu)", key,
                 (long long)st.st_size, (unsigned long long)end);
        close(fd);
        return 400;
    }
    long page = sysconf(_SC_PAGESIZE);
    uint64_t start = offset - offset % (uint64_t)(page > 0 ? page : 4096);
    size_t len = (size_t)(end - start);
    void *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)start);
    if (map == MAP_FAILED) {
        snprintf(msg, n, "unable to map shared memory key '%s': %s", key, strerror(errno));
        close(fd);
        return 500;
    }
    struct kd_shm_region *r = calloc(1, sizeof *r);
    if (!r) {
        munmap(map, len);
        close(fd);
        snprintf(msg, n, "out of memory");
        return 500;
    }
    atomic_init(&r->refs, 1);
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->key, sizeof r->key, "%s", key);
    r->offset = offset;
    r->byte_size = byte_size;
    r->fd = fd;
    r->map = map;
    r->map_len = len;
    r->base = (uint8_t *)map + (offset - start);
    struct kd_shm_region **tail = &t->head;
    while (*tail)
        tail = &(*tail)->next;
    *tail = r;
    t->count++;
    return 0;
}

int kd_shm_unregister(struct kd_shm_table *t, const char *name, char *msg, size_t n)
{
    bool all = !name || !name[0];
    if (!all && !find(t, name)) {
        snprintf(msg, n, "no shared memory region '%.*s' is registered", KD_SHM_NAME_MAX, name);
        return 404;
    }
    for (struct kd_shm_region **p = &t->head; *p;) {
        struct kd_shm_region *r = *p;
        if (all || strcmp(r->name, name) == 0) {
            *p = r->next;
            t->count--;
            region_release(r);
        } else {
            p = &r->next;
        }
    }
    return 0;
}

int kd_shm_status(struct kd_shm_table *t, const char *name,
                  void (*row)(void *ud, const char *name, const char *key, uint64_t offset, uint64_t byte_size),
                  void *ud, char *msg, size_t n)
{
    bool all = !name || !name[0];
    if (!all && !find(t, name)) {
        snprintf(msg, n, "no shared memory region '%.*s' is registered", KD_SHM_NAME_MAX, name);
        return 404;
    }
    for (struct kd_shm_region *r = t->head; r; r = r->next)
        if (all || strcmp(r->name, name) == 0)
            row(ud, r->name, r->key, r->offset, r->byte_size);
    return 0;
}

int kd_shm_slice_get(struct kd_shm_table *t, const char *name, uint64_t offset, uint64_t size, const char *what,
                     struct kd_shm_slice *out, char *msg, size_t n)
{
    struct kd_shm_region *r = t && name ? find(t, name) : NULL;
    if (!r) {
        snprintf(msg, n, "%s: no shared memory region '%.*s' is registered", what, KD_SHM_NAME_MAX,
                 name ? name : "");
        return 400;
    }
    uint64_t end;
    if (__builtin_add_overflow(offset, size, &end) || end > r->byte_size) {
        snprintf(msg, n,
                 "%s: shared_memory_offset %llu + shared_memory_byte_size %llu is past the end of region '%s' "
                 "(%llu bytes)",
                 what, (unsigned long long)offset, (unsigned long long)size, r->name,
                 (unsigned long long)r->byte_size);
        return 400;
    }
    atomic_fetch_add(&r->refs, 1);
    out->region = r;
    out->offset = offset;
    out->size = size;
    return 0;
}

void *kd_shm_slice_ptr(const struct kd_shm_slice *s, char *msg, size_t n)
{
    const struct kd_shm_region *r = s->region;
    struct stat st;
    if (fstat(r->fd, &st) != 0 || (uint64_t)st.st_size < r->offset + r->byte_size) {
        snprintf(msg, n, "shared memory region '%s' has shrunk below its registered size", r->name);
        return NULL;
    }
    return r->base + s->offset;
}

const char *kd_shm_slice_region_name(const struct kd_shm_slice *s)
{
    return s->region ? s->region->name : "";
}

void kd_shm_slice_release(struct kd_shm_slice *s)
{
    if (s->region)
        region_release(s->region);
    s->region = NULL;
}

void kd_shm_use_release(struct kd_shm_use *u)
{
    for (int i = 0; i < KD_SCHED_MAX_IO; i++) {
        kd_shm_slice_release(&u->in[i]);
        kd_shm_slice_release(&u->out[i]);
    }
}

bool kd_shm_use_any(const struct kd_shm_use *u)
{
    for (int i = 0; i < KD_SCHED_MAX_IO; i++)
        if (u->in[i].region || u->out[i].region)
            return true;
    return false;
}

int kd_shm_write_outputs(const struct kd_shm_use *u, const kd_model_config *c, const struct kd_sched_request *r,
                         char *msg, size_t msglen)
{
    for (int o = 0; o < c->noutputs && o < r->noutputs; o++) {
        const struct kd_shm_slice *s = &u->out[o];
        if (!s->region)
            continue;
        if (r->outputs[o].nbytes > s->size) {
            snprintf(msg, msglen, "output '%s' holds %zu bytes; its shared_memory_byte_size is %llu",
                     c->outputs[o].name, r->outputs[o].nbytes, (unsigned long long)s->size);
            return 400;
        }
        void *dst = kd_shm_slice_ptr(s, msg, msglen);
        if (!dst)
            return 400;
        memcpy(dst, r->outputs[o].data, r->outputs[o].nbytes);
    }
    return 0;
}
