/*
 * backends/remote/remote-exec.c — a remote session's buffers on its device, and the checks that
 * stand between untrusted messages and the backend interface.
 *
 * Ids are the client's choice (any non-zero 64-bit value), kept in an open-addressing table owned
 * by the session, so one session can neither name nor guess another's buffers: an id it did not
 * allocate is "unknown" whatever other sessions hold. Buffers are untyped bytes, as the backend
 * interface's are; a view is checked in elements of its own dtype against its buffer's bytes.
 *
 * Index operands (gather, scatter, index_select, index_add, max-pool backward) are read before the
 * primitive runs, because the backend interface promises backends that index values are in
 * range. On a host-memory device they are read in place; otherwise the touched range is
 * downloaded. Reading them waits for earlier work on the device, which only costs time on an
 * asynchronous device.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "remote-exec.h"

struct entry {
    uint64_t id; /* 0: empty slot */
    kiln_buffer *buf;
    uint64_t nbytes;
};

struct kiln__tstate {
    struct kiln__tstate_limits lim;
    uint16_t version;
    kiln_device *dev; /* where the buffers live (set by the first exec) */
    struct entry *tab;
    size_t cap; /* a power of two */
    size_t count;
    uint64_t live_bytes;
};

/* ---- the id table ------------------------------------------------------------------------- */

static size_t slot_of(uint64_t id, size_t cap)
{
    uint64_t h = id * 0x9E3779B97F4A7C15ull; /* ids are client-chosen: spread them */
    return (size_t)(h >> 17) & (cap - 1);
}

static struct entry *find(struct kiln__tstate *st, uint64_t id)
{
    if (id == 0 || st->cap == 0)
        return NULL;
    for (size_t i = slot_of(id, st->cap);; i = (i + 1) & (st->cap - 1)) {
        if (st->tab[i].id == id)
            return &st->tab[i];
        if (st->tab[i].id == 0)
            return NULL;
    }
}

static int grow(struct kiln__tstate *st)
{
    size_t ncap = st->cap ? st->cap * 2 : 64;
    struct entry *nt = calloc(ncap, sizeof *nt);
    if (!nt)
        return -1;
    for (size_t i = 0; i < st->cap; i++) {
        if (!st->tab[i].id)
            continue;
        size_t j = slot_of(st->tab[i].id, ncap);
        while (nt[j].id)
            j = (j + 1) & (ncap - 1);
        nt[j] = st->tab[i];
    }
    free(st->tab);
    st->tab = nt;
    st->cap = ncap;
    return 0;
}

static int insert(struct kiln__tstate *st, uint64_t id, kiln_buffer *buf, uint64_t nbytes)
{
    if ((st->count + 1) * 4 > st->cap * 3 && grow(st) != 0)
        return -1;
    size_t i = slot_of(id, st->cap);
    while (st->tab[i].id)
        i = (i + 1) & (st->cap - 1);
    st->tab[i] = (struct entry){id, buf, nbytes};
    st->count++;
    st->live_bytes += nbytes;
    return 0;
}

/* Backward-shift deletion keeps probe chains intact without tombstones. */
static void erase(struct kiln__tstate *st, struct entry *e)
{
    size_t i = (size_t)(e - st->tab);
    st->count--;
    st->live_bytes -= e->nbytes;
    for (size_t j = (i + 1) & (st->cap - 1);; j = (j + 1) & (st->cap - 1)) {
        if (!st->tab[j].id)
            break;
        size_t home = slot_of(st->tab[j].id, st->cap);
        /* Move j into the hole at i when its home is not within (i, j]. */
        bool between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!between) {
            st->tab[i] = st->tab[j];
            i = j;
        }
    }
    st->tab[i] = (struct entry){0};
}

struct kiln__tstate *kiln__tstate_new(const struct kiln__tstate_limits *lim, uint16_t version)
{
    struct kiln__tstate *st = calloc(1, sizeof *st);
    if (!st)
        return NULL;
    st->lim = *lim;
    st->version = version;
    return st;
}

void kiln__tstate_free(struct kiln__tstate *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->cap; i++)
        if (st->tab[i].id && st->dev)
            kiln__device_iface(st->dev)->buffer_free(kiln__device_ctx(st->dev), st->tab[i].buf);
    free(st->tab);
    free(st);
}

uint64_t kiln__tstate_live_bytes(const struct kiln__tstate *st)
{
    return st->live_bytes;
}

uint64_t kiln__tstate_ids(const struct kiln__tstate *st)
{
    return st->count;
}

uint32_t kiln__tstate_dtype_mask(const kiln_device *dev)
{
    uint32_t mask = 0;
    for (int d = 0; d < KILN_DTYPE_COUNT; d++)
        if (kiln__device_caps(dev)->dtype[d])
            mask |= 1u << d;
    return mask;
}

/* ---- replies ------------------------------------------------------------------------------ */

struct ctx {
    struct kiln__tstate *st;
    kiln_device *dev;
    kiln_wire_buf *out;
    const kiln_wire_msg *m;
    bool oom;
};

static int reply_error(struct ctx *c, kiln_wire_err code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int reply_error(struct ctx *c, kiln_wire_err code, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    kiln_wire_msg r = {.h = {.version = c->st->version, .type = KILN_WIRE_ERROR, .seq = c->m->h.seq}};
    r.u.error.code = (uint32_t)code;
    r.u.error.failed_type = c->m->h.type;
    r.u.error.text_len = (uint16_t)strlen(text);
    r.u.error.text = (const uint8_t *)text;
    char why[128];
    if (kiln_wire_encode(c->out, &r, why, sizeof why) != 0)
        c->oom = true;
    return -1;
}

/* ---- views -------------------------------------------------------------------------------- */

/* Resolves operand k of the op into d; NULL id only where the primitive allows it. */
static int resolve(struct ctx *c, int k, kiln_tdesc *d, const kiln_tdesc **slot)
{
    const kiln_wire_op *op = &c->m->u.op;
    const kiln_wire_td *w = &op->td[k];
    *slot = NULL;
    if (w->id == 0) {
        const kiln_wire_prim_info *pi = kiln_wire_prim_lookup(op->prim);
        if (!pi || !(pi->optional & (1u << k)))
            return reply_error(c, KILN_WIRE_ERR_BAD_ID, "%s: operand %d needs a buffer id", pi ? pi->name : "op",
                               k);
        return 0;
    }
    struct entry *e = find(c->st, w->id);
    if (!e)
        return reply_error(c, KILN_WIRE_ERR_BAD_ID, "unknown id %" PRIu64, w->id);
    if ((unsigned)w->dtype >= KILN_DTYPE_COUNT || !kiln__device_caps(c->dev)->dtype[w->dtype])
        return reply_error(c, KILN_WIRE_ERR_NOT_SUPPORTED, "operand %d: %s does not compute %s", k,
                           kiln__device_iface(c->dev)->name, kiln_dtype_name(w->dtype));
    size_t es = kiln_wire_dtype_size(w->dtype);
    int64_t lo, hi;
    bool empty;
    if (es == 0 || kiln_wire_td_span(w, &lo, &hi, &empty) != 0)
        return reply_error(c, KILN_WIRE_ERR_BAD_RANGE, "operand %d (id %" PRIu64 "): view arithmetic overflows", k,
                           w->id);
    uint64_t elems = e->nbytes / es;
    if (empty) {
        /* Touches nothing, but a backend may still form the base address. */
        if (w->offset < 0 || (uint64_t)w->offset > elems)
            return reply_error(c, KILN_WIRE_ERR_BAD_RANGE,
                               "operand %d (id %" PRIu64 "): offset %" PRId64 " outside its buffer of %" PRIu64
                               " bytes",
                               k, w->id, w->offset, e->nbytes);
    } else if (lo < 0 || (uint64_t)hi >= elems) {
        return reply_error(c, KILN_WIRE_ERR_BAD_RANGE,
                           "operand %d (id %" PRIu64 "): view reaches elements %" PRId64 "..%" PRId64
                           " of a buffer holding %" PRIu64 " %s elements",
                           k, w->id, lo, hi, elems, kiln_dtype_name(w->dtype));
    }
    d->buf = e->buf;
    d->offset = w->offset;
    d->dtype = w->dtype;
    d->ndim = w->ndim;
    for (int i = 0; i < w->ndim; i++) {
        d->shape[i] = w->shape[i];
        /* A stride of a size-1 dim (or of an empty view) addresses nothing, so the span check
         * does not bound it; backends still step by it once past the end. Zero it. */
        d->strides[i] = empty || w->shape[i] == 1 ? 0 : w->strides[i];
    }
    *slot = d;
    return 0;
}

static int64_t numel(const kiln_tdesc *d)
{
    int64_t n = 1;
    for (int i = 0; i < d->ndim; i++)
        n *= d->shape[i]; /* checked not to overflow by kiln_wire_td_span */
    return n;
}

/* Whether two operands of the op share bytes of one buffer. Views are checked in elements of their
 * own dtypes, so the comparison is in bytes. */
static bool operands_overlap(const kiln_wire_op *op, int a, int b)
{
    const kiln_wire_td *x = &op->td[a], *y = &op->td[b];
    if (x->id == 0 || x->id != y->id)
        return false;
    int64_t xl, xh, yl, yh;
    bool xe, ye;
    if (kiln_wire_td_span(x, &xl, &xh, &xe) != 0 || kiln_wire_td_span(y, &yl, &yh, &ye) != 0)
        return true; /* resolve() has refused these already; stay on the safe side */
    if (xe || ye)
        return false;
    int64_t xs = (int64_t)kiln_wire_dtype_size(x->dtype), ys = (int64_t)kiln_wire_dtype_size(y->dtype);
    return xl * xs < (yh + 1) * ys && yl * ys < (xh + 1) * xs;
}

/*
 * Every value of the i64 view idx (the op's operand `which`, already inside its buffer) lies in
 * [0, bound). On a host-memory device it is read in place, otherwise its touched range is
 * downloaded. The index must not share bytes with the output (operand 0) either: a primitive
 * that writes its output while it still reads the index would otherwise turn checked values
 * into unchecked ones halfway through.
 */
static int check_index_values(struct ctx *c, int which, const kiln_tdesc *idx, int64_t bound, const char *what)
{
    if (operands_overlap(&c->m->u.op, 0, which))
        return reply_error(c, KILN_WIRE_ERR_BAD_RANGE, "%s: the index (operand %d) shares memory with the output",
                           what, which);
    if (idx->dtype != KILN_I64)
        return reply_error(c, KILN_WIRE_ERR_BAD_SHAPE, "%s: index must be i64, not %s", what,
                           kiln_dtype_name(idx->dtype));
    int64_t n = numel(idx);
    if (n == 0)
        return 0;
    int64_t lo = idx->offset, hi = idx->offset;
    for (int i = 0; i < idx->ndim; i++) {
        int64_t ext = (idx->shape[i] - 1) * idx->strides[i];
        if (ext < 0)
            lo += ext;
        else
            hi += ext;
    }
    const kiln_backend_iface *be = kiln__device_iface(c->dev);
    const int64_t *base = NULL;
    int64_t *copy = NULL;
    if (kiln__device_caps(c->dev)->host_memory && be->buffer_host_ptr) {
        if (be->sync(kiln__device_ctx(c->dev)) != 0)
            return reply_error(c, KILN_WIRE_ERR_DEVICE, "%s: %s", what, kiln_error());
        base = (const int64_t *)be->buffer_host_ptr(kiln__device_ctx(c->dev), idx->buf) + lo;
    } else {
        size_t count = (size_t)(hi - lo + 1);
        copy = malloc(count * sizeof *copy);
        if (!copy)
            return reply_error(c, KILN_WIRE_ERR_DEVICE, "%s: out of memory reading the index", what);
        if (be->buffer_download(kiln__device_ctx(c->dev), idx->buf, (size_t)lo * 8u, copy, count * 8u) != 0) {
            free(copy);
            return reply_error(c, KILN_WIRE_ERR_DEVICE, "%s: %s", what, kiln_error());
        }
        base = copy;
    }
    int64_t pos[KILN_MAX_DIMS] = {0};
    int64_t off = idx->offset - lo;
    int rc = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t v = base[off];
        if (v < 0 || v >= bound) {
            rc = reply_error(c, KILN_WIRE_ERR_BAD_RANGE, "%s: index value %" PRId64 " outside [0, %" PRId64 ")",
                             what, v, bound);
            break;
        }
        for (int d = idx->ndim - 1; d >= 0; d--) {
            if (++pos[d] < idx->shape[d]) {
                off += idx->strides[d];
                break;
            }
            off -= (pos[d] - 1) * idx->strides[d];
            pos[d] = 0;
        }
    }
    free(copy);
    return rc;
}

/* ---- messages ----------------------------------------------------------------------------- */

static int do_alloc(struct ctx *c)
{
    struct kiln__tstate *st = c->st;
    uint64_t id = c->m->u.alloc.id, nbytes = c->m->u.alloc.nbytes;
    if (id == 0 || find(st, id))
        return reply_error(
            c, KILN_WIRE_ERR_BAD_ID,
            id ? "id %" PRIu64 " is already in use" : "id %" PRIu64 " is reserved for an absent operand", id);
    if (st->count >= st->lim.max_ids)
        return reply_error(c, KILN_WIRE_ERR_QUOTA, "the session holds %zu ids, its limit (remote.max_ids)",
                           st->count);
    if (nbytes > st->lim.max_live_bytes || st->live_bytes > st->lim.max_live_bytes - nbytes)
        return reply_error(c, KILN_WIRE_ERR_QUOTA,
                           "allocating %" PRIu64 " bytes would take the session past %" PRIu64
                           " live bytes (remote.max_live_bytes; %" PRIu64 " in use)",
                           nbytes, st->lim.max_live_bytes, st->live_bytes);
    const kiln_backend_iface *be = kiln__device_iface(c->dev);
    kiln_buffer *b = be->buffer_alloc(kiln__device_ctx(c->dev), nbytes ? (size_t)nbytes : 1);
    if (!b)
        return reply_error(c, KILN_WIRE_ERR_DEVICE, "cannot allocate %" PRIu64 " bytes: %s", nbytes, kiln_error());
    int rc;
    if (c->m->u.alloc.has_data) {
        rc = nbytes ? be->buffer_upload(kiln__device_ctx(c->dev), b, 0, c->m->u.alloc.data, (size_t)nbytes) : 0;
    } else {
        /* New buffers read as zeros, as a client's freshly allocated memory would not otherwise. */
        kiln_tdesc z = {.buf = b, .dtype = KILN_U8, .ndim = 1, .shape = {(int64_t)nbytes}, .strides = {1}};
        rc = nbytes ? be->fill(kiln__device_ctx(c->dev), &z, 0.0) : 0;
    }
    if (rc != 0 || insert(st, id, b, nbytes) != 0) {
        be->buffer_free(kiln__device_ctx(c->dev), b);
        return reply_error(c, KILN_WIRE_ERR_DEVICE, "allocating id %" PRIu64 ": %s", id,
                           rc ? kiln_error() : "out of memory");
    }
    return 0;
}

/* The byte range [offset, offset + length) of id; NULL (error sent) when outside it. */
static struct entry *byte_range(struct ctx *c, uint64_t id, uint64_t offset, uint64_t length)
{
    struct entry *e = find(c->st, id);
    if (!e) {
        reply_error(c, KILN_WIRE_ERR_BAD_ID, "unknown id %" PRIu64, id);
        return NULL;
    }
    if (offset > e->nbytes || length > e->nbytes - offset) {
        reply_error(c, KILN_WIRE_ERR_BAD_RANGE,
                    "bytes %" PRIu64 "+%" PRIu64 " lie outside id %" PRIu64 " (%" PRIu64 " bytes)", offset, length,
                    id, e->nbytes);
        return NULL;
    }
    return e;
}

/* An UPLOAD's or DOWNLOAD's range (the decoded message's members are anonymous structs). */
struct xfer {
    uint64_t id, offset, length;
    const uint8_t *data;
};

static int do_upload(struct ctx *c)
{
    const struct xfer x = {c->m->u.upload.id, c->m->u.upload.offset, c->m->u.upload.length, c->m->u.upload.data};
    struct entry *e = byte_range(c, x.id, x.offset, x.length);
    if (!e)
        return -1;
    if (x.length && kiln__device_iface(c->dev)->buffer_upload(kiln__device_ctx(c->dev), e->buf, (size_t)x.offset,
                                                              x.data, (size_t)x.length) != 0)
        return reply_error(c, KILN_WIRE_ERR_DEVICE, "upload into id %" PRIu64 ": %s", x.id, kiln_error());
    return 0;
}

static int do_download(struct ctx *c)
{
    const struct xfer x = {c->m->u.download.id, c->m->u.download.offset, c->m->u.download.length, NULL};
    struct entry *e = byte_range(c, x.id, x.offset, x.length);
    if (!e)
        return -1;
    if (c->st->lim.max_data_bytes && x.length > c->st->lim.max_data_bytes)
        return reply_error(c, KILN_WIRE_ERR_QUOTA,
                           "DOWNLOAD of %" PRIu64 " bytes: one DATA message carries at most %" PRIu64
                           " (remote.max_message_bytes less the header); read it in pieces",
                           x.length, c->st->lim.max_data_bytes);
    uint8_t *tmp = malloc(x.length ? (size_t)x.length : 1);
    if (!tmp)
        return reply_error(c, KILN_WIRE_ERR_DEVICE, "out of memory reading %" PRIu64 " bytes", x.length);
    if (x.length && kiln__device_iface(c->dev)->buffer_download(kiln__device_ctx(c->dev), e->buf, (size_t)x.offset,
                                                                tmp, (size_t)x.length) != 0) {
        free(tmp);
        return reply_error(c, KILN_WIRE_ERR_DEVICE, "download from id %" PRIu64 ": %s", x.id, kiln_error());
    }
    kiln_wire_msg r = {.h = {.version = c->st->version, .type = KILN_WIRE_DATA, .seq = c->m->h.seq}};
    r.u.data.length = x.length;
    r.u.data.data = tmp;
    char why[128];
    if (kiln_wire_encode(c->out, &r, why, sizeof why) != 0)
        c->oom = true;
    free(tmp);
    return 0;
}

static int do_release(struct ctx *c)
{
    int rc = 0;
    for (uint32_t i = 0; i < c->m->u.release.count; i++) {
        uint64_t id = kiln_wire_release_id(c->m, i);
        struct entry *e = find(c->st, id);
        if (!e) {
            if (rc == 0) /* one error per message is enough; the known ids are still released */
                rc = reply_error(c, KILN_WIRE_ERR_BAD_ID, "release of unknown id %" PRIu64, id);
            continue;
        }
        kiln__device_iface(c->dev)->buffer_free(kiln__device_ctx(c->dev), e->buf);
        erase(c->st, e);
    }
    return rc;
}

static int do_sync(struct ctx *c)
{
    if (kiln__device_iface(c->dev)->sync(kiln__device_ctx(c->dev)) != 0)
        return reply_error(c, KILN_WIRE_ERR_DEVICE, "sync: %s", kiln_error());
    kiln_wire_msg r = {.h = {.version = c->st->version, .type = KILN_WIRE_SYNC_DONE, .seq = c->m->h.seq}};
    char why[128];
    if (kiln_wire_encode(c->out, &r, why, sizeof why) != 0)
        c->oom = true;
    return 0;
}

static void conv_params(const kiln_wire_op *op, kiln_conv_params *p)
{
    p->nspatial = (int)op->i[0];
    for (int k = 0; k < 3; k++) {
        p->stride[k] = op->i[1 + k];
        p->padding[k] = op->i[4 + k];
        p->dilation[k] = op->i[7 + k];
    }
    p->groups = op->i[10];
}

static void pool_params(const kiln_wire_op *op, kiln_pool_params *p)
{
    p->nspatial = (int)op->i[0];
    p->kind = (kiln_pool_kind)op->sub;
    for (int k = 0; k < 3; k++) {
        p->kernel[k] = op->i[1 + k];
        p->stride[k] = op->i[4 + k];
        p->padding[k] = op->i[7 + k];
        p->dilation[k] = op->i[10 + k];
    }
    p->count_include_pad = (op->flags & KILN_WIRE_OPF_COUNT_PAD) != 0;
}

/* The plane size a max-pool index addresses: the product of x's spatial dims. */
static int64_t plane_of(const kiln_tdesc *x, int nspatial)
{
    int64_t n = 1;
    for (int d = x->ndim - nspatial; d < x->ndim; d++)
        n *= x->shape[d];
    return n;
}

static int do_op(struct ctx *c)
{
    const kiln_wire_op *op = &c->m->u.op;
    const kiln_wire_prim_info *pi = kiln_wire_prim_lookup(op->prim);
    char why[256];
    if (!pi)
        return reply_error(c, KILN_WIRE_ERR_MALFORMED, "unknown primitive %u", (unsigned)op->prim);
    if (kiln_wire_op_check_shapes(op, why, sizeof why) != 0)
        return reply_error(c, KILN_WIRE_ERR_BAD_SHAPE, "%s", why);
    kiln_tdesc d[KILN_WIRE_MAX_TD];
    const kiln_tdesc *t[KILN_WIRE_MAX_TD] = {0};
    for (int k = 0; k < op->ntd; k++)
        if (resolve(c, k, &d[k], &t[k]) != 0)
            return -1;
    /* A view inside its buffer can still name endless work through zero strides; no real operand
     * has more elements than the session may hold bytes. */
    for (int k = 0; k < op->ntd; k++)
        if (t[k] && (uint64_t)numel(t[k]) > c->st->lim.max_live_bytes)
            return reply_error(c, KILN_WIRE_ERR_QUOTA,
                               "%s: operand %d has %" PRId64 " elements, more than the session's %" PRIu64
                               " (remote.max_live_bytes)",
                               pi->name, k, numel(t[k]), c->st->lim.max_live_bytes);
    const kiln_backend_iface *be = kiln__device_iface(c->dev);
    void *x = kiln__device_ctx(c->dev);
    /* a device whose backend leaves this entry NULL answers "not supported", never a call
     * through NULL (the wire's primitive names are the entries' names) */
    for (int e = 0; e < KILN_ENTRY_COUNT; e++)
        if (strcmp(kiln__entry_name((kiln_entry)e), pi->name) == 0 && !kiln__iface_has(be, (kiln_entry)e))
            return reply_error(c, KILN_WIRE_ERR_NOT_SUPPORTED, "%s: device '%s' does not support %s", pi->name,
                               kiln_device_name(c->dev), pi->name);
    int rc = KILN_ENOTSUP;
    switch ((kiln_wire_prim)op->prim) {
    case KILN_WIRE_P_FILL: rc = be->fill(x, t[0], op->f[0]); break;
    case KILN_WIRE_P_ARANGE: rc = be->arange(x, t[0], op->f[0], op->f[1]); break;
    case KILN_WIRE_P_COPY: rc = be->copy(x, t[0], t[1]); break;
    case KILN_WIRE_P_RNG:
        rc = be->rng(x, (kiln_rng_kind)op->sub, t[0], (uint64_t)op->i[0], (uint64_t)op->i[1], op->f[0], op->f[1]);
        break;
    case KILN_WIRE_P_UNARY: rc = be->unary(x, (kiln_unary_op)op->sub, t[0], t[1], op->f[0], op->f[1]); break;
    case KILN_WIRE_P_BINARY: rc = be->binary(x, (kiln_binary_op)op->sub, t[0], t[1], t[2]); break;
    case KILN_WIRE_P_WHERE: rc = be->where(x, t[0], t[1], t[2], t[3]); break;
    case KILN_WIRE_P_REDUCE:
        rc = be->reduce(x, (kiln_reduce_op)op->sub, t[0], t[1], (uint32_t)op->i[0], op->f[0]);
        break;
    case KILN_WIRE_P_ARG_REDUCE:
        rc = be->arg_reduce(x, (op->flags & KILN_WIRE_OPF_IS_MAX) != 0, t[0], t[1], (int)op->i[0]);
        break;
    case KILN_WIRE_P_CUMSUM: rc = be->cumsum(x, t[0], t[1], (int)op->i[0]); break;
    case KILN_WIRE_P_SORT:
        rc = be->sort(x, t[0], t[1], t[2], (int)op->i[0], (op->flags & KILN_WIRE_OPF_DESCENDING) != 0);
        break;
    case KILN_WIRE_P_GATHER:
        if (check_index_values(c, 2, t[2], t[1]->shape[op->i[0]], "gather") != 0)
            return -1;
        rc = be->gather(x, t[0], t[1], (int)op->i[0], t[2]);
        break;
    case KILN_WIRE_P_SCATTER:
        if (check_index_values(c, 1, t[1], t[0]->shape[op->i[0]], "scatter") != 0)
            return -1;
        rc = be->scatter(x, t[0], (int)op->i[0], t[1], t[2], (op->flags & KILN_WIRE_OPF_ACCUMULATE) != 0);
        break;
    case KILN_WIRE_P_INDEX_SELECT:
        if (check_index_values(c, 2, t[2], t[1]->shape[op->i[0]], "index_select") != 0)
            return -1;
        rc = be->index_select(x, t[0], t[1], (int)op->i[0], t[2]);
        break;
    case KILN_WIRE_P_INDEX_ADD:
        if (check_index_values(c, 1, t[1], t[0]->shape[op->i[0]], "index_add") != 0)
            return -1;
        rc = be->index_add(x, t[0], (int)op->i[0], t[1], t[2]);
        break;
    case KILN_WIRE_P_MATMUL: rc = be->matmul(x, t[0], t[1], t[2]); break;
    case KILN_WIRE_P_CONV:
    case KILN_WIRE_P_CONV_BWD_INPUT:
    case KILN_WIRE_P_CONV_BWD_WEIGHT: {
        kiln_conv_params p;
        conv_params(op, &p);
        if (op->prim == KILN_WIRE_P_CONV)
            rc = be->conv(x, &p, t[0], t[1], t[2], t[3]);
        else if (op->prim == KILN_WIRE_P_CONV_BWD_INPUT)
            rc = be->conv_backward_input(x, &p, t[0], t[1], t[2]);
        else
            rc = be->conv_backward_weight(x, &p, t[0], t[1], t[2]);
        break;
    }
    case KILN_WIRE_P_POOL: {
        kiln_pool_params p;
        pool_params(op, &p);
        rc = be->pool(x, &p, t[0], t[1], t[2]);
        break;
    }
    case KILN_WIRE_P_POOL_BWD: {
        kiln_pool_params p;
        pool_params(op, &p);
        if (t[2] && check_index_values(c, 2, t[2], plane_of(t[0], p.nspatial), "pool_backward") != 0)
            return -1;
        rc = be->pool_backward(x, &p, t[0], t[1], t[2]);
        break;
    }
    case KILN_WIRE_P_ADAPTIVE_AVG_POOL: rc = be->adaptive_avg_pool(x, (int)op->i[0], t[0], t[1]); break;
    case KILN_WIRE_P_ADAPTIVE_AVG_POOL_BWD:
        rc = be->adaptive_avg_pool_backward(x, (int)op->i[0], t[0], t[1]);
        break;
    case KILN_WIRE_P_INTERPOLATE:
        rc = be->interpolate(x, (kiln_interp_mode)op->sub, (op->flags & KILN_WIRE_OPF_ALIGN_CORNERS) != 0, t[0],
                             t[1]);
        break;
    case KILN_WIRE_P_INTERPOLATE_BWD:
        rc = be->interpolate_backward(x, (kiln_interp_mode)op->sub, (op->flags & KILN_WIRE_OPF_ALIGN_CORNERS) != 0,
                                      t[0], t[1]);
        break;
    case KILN_WIRE_P_PAD: rc = be->pad(x, (kiln_pad_mode)op->sub, t[0], t[1], op->i, op->f[0]); break;
    case KILN_WIRE_P_SOFTMAX:
        if (!be->softmax)
            return reply_error(c, KILN_WIRE_ERR_NOT_SUPPORTED, "softmax: not a primitive of %s", be->name);
        rc = be->softmax(x, (op->flags & KILN_WIRE_OPF_LOG) != 0, t[0], t[1], (int)op->i[0]);
        break;
    case KILN_WIRE_P_LAYER_NORM:
        if (!be->layer_norm)
            return reply_error(c, KILN_WIRE_ERR_NOT_SUPPORTED, "layer_norm: not a primitive of %s", be->name);
        rc = be->layer_norm(x, t[0], t[1], t[2], t[3], t[4], t[5], op->i[0], op->f[0]);
        break;
    case KILN_WIRE_P_COUNT: break;
    }
    if (rc != 0)
        return reply_error(c, rc == KILN_ENOTSUP ? KILN_WIRE_ERR_NOT_SUPPORTED : KILN_WIRE_ERR_DEVICE, "%s: %s",
                           pi->name, kiln_error());
    return 0;
}

int kiln__tstate_exec(struct kiln__tstate *st, kiln_device *dev, const uint8_t *msg, size_t len,
                      kiln_wire_buf *replies)
{
    if (!st->dev)
        st->dev = dev;
    size_t off = 0;
    while (off < len) {
        kiln_wire_msg m;
        size_t used = 0;
        char why[256];
        int rc = kiln_wire_decode(msg + off, len - off, st->version, &m, &used, why, sizeof why);
        struct ctx c = {.st = st, .dev = dev, .out = replies, .m = &m};
        if (rc == KILN_WIRE_EFRAME || used == 0 || used > len - off)
            return -1;
        if (rc == KILN_WIRE_EMSG) {
            reply_error(&c, KILN_WIRE_ERR_MALFORMED, "%s", why);
        } else {
            switch (m.h.type) {
            case KILN_WIRE_ALLOC: do_alloc(&c); break;
            case KILN_WIRE_UPLOAD: do_upload(&c); break;
            case KILN_WIRE_OP: do_op(&c); break;
            case KILN_WIRE_DOWNLOAD: do_download(&c); break;
            case KILN_WIRE_RELEASE: do_release(&c); break;
            case KILN_WIRE_SYNC: do_sync(&c); break;
            default:
                reply_error(&c, KILN_WIRE_ERR_PROTOCOL, "a client may not send %s here",
                            kiln_wire_type_name(m.h.type));
                break;
            }
        }
        if (c.oom)
            return -1;
        off += used;
    }
    return 0;
}
