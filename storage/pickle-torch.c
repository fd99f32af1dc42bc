/*
 * storage/pickle-torch.c — what the restricted unpickler (pickle.c) lets a weights file call:
 * the fixed table of globals a state_dict needs (OrderedDict, torch's tensor and parameter
 * rebuilders, the storage classes, the dtypes _rebuild_tensor_v3 names), persistent ids
 * naming storages, and REDUCE of those globals building plain values. Anything else is
 * refused before it runs; a dtype or storage class is only ever a name in a table here.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "pickle-vm.h"

static const struct {
    const char *module, *name;
} pk_globals[] = {
    [PK_G_ORDERED_DICT] = {"collections", "OrderedDict"},
    [PK_G_REBUILD_TENSOR] = {"torch._utils", "_rebuild_tensor"},
    [PK_G_REBUILD_TENSOR_V2] = {"torch._utils", "_rebuild_tensor_v2"},
    [PK_G_REBUILD_TENSOR_V3] = {"torch._utils", "_rebuild_tensor_v3"},
    [PK_G_REBUILD_PARAMETER] = {"torch._utils", "_rebuild_parameter"},
    [PK_G_REBUILD_PARAMETER_WITH_STATE] = {"torch._utils", "_rebuild_parameter_with_state"},
};

/* torch's storage classes. The typed ones kiln cannot compute in still resolve, so that a
 * file holding, say, an int16 buffer opens and only loading that tensor fails with a
 * precise message (as the safetensors reader does for I16). UntypedStorage is bytes: torch
 * (>= 2.1) saves the dtypes that have no typed storage class (uint16, float8, ...) on one,
 * through _rebuild_tensor_v3, which names the dtype; on its own it reads as bytes (u8), as
 * torch reads it. */
static const struct {
    const char *module, *name;
    int dtype;
    size_t size;
} pk_storages[] = {
    {"torch", "FloatStorage", KILN_F32, 4},
    {"torch", "DoubleStorage", KILN_F64, 8},
    {"torch", "HalfStorage", KILN_F16, 2},
    {"torch", "BFloat16Storage", KILN_BF16, 2},
    {"torch", "LongStorage", KILN_I64, 8},
    {"torch", "IntStorage", KILN_I32, 4},
    {"torch", "ByteStorage", KILN_U8, 1},
    {"torch", "BoolStorage", KILN_BOOL, 1},
    {"torch", "CharStorage", -1, 1},
    {"torch", "ShortStorage", -1, 2},
    {"torch", "ComplexFloatStorage", -1, 8},
    {"torch", "ComplexDoubleStorage", -1, 16},
    {"torch.storage", "UntypedStorage", KILN_U8, 1},
};
#define PK_NSTORAGES (sizeof pk_storages / sizeof pk_storages[0])
#define PK_UNTYPED (PK_NSTORAGES - 1) /* the pk_storages row of UntypedStorage */

/* torch dtypes, as _rebuild_tensor_v3's dtype argument names them (GLOBAL torch.<name>),
 * with the element size the storage's bytes are read at; storage is how
 * kiln_torch_storage_type reports a tensor rebuilt with it. */
#define PK_DT(name, dtype, size) name, dtype, size, "UntypedStorage(" name ")"
static const struct {
    const char *name;
    int dtype;
    size_t size;
    const char *storage;
} pk_dtypes[] = {
    {PK_DT("float32", KILN_F32, 4)},
    {PK_DT("float64", KILN_F64, 8)},
    {PK_DT("float16", KILN_F16, 2)},
    {PK_DT("bfloat16", KILN_BF16, 2)},
    {PK_DT("int64", KILN_I64, 8)},
    {PK_DT("int32", KILN_I32, 4)},
    {PK_DT("uint8", KILN_U8, 1)},
    {PK_DT("bool", KILN_BOOL, 1)},
    {PK_DT("int8", -1, 1)},
    {PK_DT("int16", -1, 2)},
    {PK_DT("uint16", -1, 2)},
    {PK_DT("uint32", -1, 4)},
    {PK_DT("uint64", -1, 8)},
    {PK_DT("float8_e4m3fn", -1, 1)},
    {PK_DT("float8_e5m2", -1, 1)},
    {PK_DT("float8_e4m3fnuz", -1, 1)},
    {PK_DT("float8_e5m2fnuz", -1, 1)},
    {PK_DT("float8_e8m0fnu", -1, 1)},
    {PK_DT("float4_e2m1fn_x2", -1, 1)},
    {PK_DT("complex32", -1, 4)},
    {PK_DT("complex64", -1, 8)},
    {PK_DT("complex128", -1, 16)},
    {PK_DT("bits8", -1, 1)},
    {PK_DT("bits16", -1, 2)},
    {PK_DT("bits1x8", -1, 1)},
    {PK_DT("bits2x4", -1, 1)},
    {PK_DT("bits4x2", -1, 1)},
};
#define PK_NDTYPES (sizeof pk_dtypes / sizeof pk_dtypes[0])
/* Global numbers: the fixed globals, then one per storage class, then one per dtype. */
#define PK_G_DTYPE (PK_G_STORAGE + (int)PK_NSTORAGES)

static bool pk_is_storage_class(const kiln__pk_value *v)
{
    return v->kind == KILN__PK_GLOBAL && v->u.global >= PK_G_STORAGE && v->u.global < PK_G_DTYPE;
}

kiln__pk_value *kiln__pk_global(pk_state *s, const char *module, size_t mlen, const char *name, size_t nlen)
{
    int which = -1;
    for (int g = 0; g < PK_G_STORAGE; g++)
        if (strlen(pk_globals[g].module) == mlen && memcmp(pk_globals[g].module, module, mlen) == 0 &&
            strlen(pk_globals[g].name) == nlen && memcmp(pk_globals[g].name, name, nlen) == 0)
            which = g;
    for (size_t k = 0; k < PK_NSTORAGES; k++)
        if (strlen(pk_storages[k].module) == mlen && memcmp(pk_storages[k].module, module, mlen) == 0 &&
            strlen(pk_storages[k].name) == nlen && memcmp(pk_storages[k].name, name, nlen) == 0)
            which = PK_G_STORAGE + (int)k;
    if (mlen == 5 && memcmp(module, "torch", 5) == 0)
        for (size_t k = 0; k < PK_NDTYPES; k++)
            if (strlen(pk_dtypes[k].name) == nlen && memcmp(pk_dtypes[k].name, name, nlen) == 0)
                which = PK_G_DTYPE + (int)k;
    if (which < 0) {
        /* Print at most 100 bytes of each part, with anything unprintable as '?'. */
        char m[101], n[101];
        size_t i;
        for (i = 0; i < mlen && i < 100; i++)
            m[i] = module[i] >= 0x20 && module[i] < 0x7f ? module[i] : '?';
        m[i] = 0;
        for (i = 0; i < nlen && i < 100; i++)
            n[i] = name[i] >= 0x20 && name[i] < 0x7f ? name[i] : '?';
        n[i] = 0;
        /* A class (Python's capitalised names) is what torch.save(model) pickles: the
         * module's own class and its layers'. Say how to save what kiln reads; a function
         * (os.system) gets no such hint. */
        bool is_class = n[0] >= 'A' && n[0] <= 'Z';
        kiln__pk_fail(s, "global '%s.%s' is not allowed in a weights file%s", m, n,
                      is_class ? " (a pickled object, such as a whole model from torch.save(model)? save "
                                 "model.state_dict() instead)"
                               : "");
        return NULL;
    }
    kiln__pk_value *v = kiln__pk_new(s, KILN__PK_GLOBAL);
    if (v)
        v->u.global = which;
    return v;
}

const char *kiln__pk_global_name(int g, char *buf, size_t len)
{
    if (g < 0)
        snprintf(buf, len, "(no global)");
    else if (g >= PK_G_DTYPE)
        snprintf(buf, len, "torch.%s", pk_dtypes[g - PK_G_DTYPE].name);
    else if (g >= PK_G_STORAGE)
        snprintf(buf, len, "%s.%s", pk_storages[g - PK_G_STORAGE].module, pk_storages[g - PK_G_STORAGE].name);
    else
        snprintf(buf, len, "%s.%s", pk_globals[g].module, pk_globals[g].name);
    return buf;
}

/* BINPERSID: ('storage', <torch.XStorage>, key, location, numel) as torch.save writes it. */
kiln__pk_value *kiln__pk_persistent(pk_state *s, const kiln__pk_value *pid)
{
    if (!pid || pid->kind != KILN__PK_TUPLE || pid->u.seq.n != 5) {
        kiln__pk_fail(s, "persistent id is not a 5-tuple ('storage', type, key, location, numel)");
        return NULL;
    }
    kiln__pk_value *const *it = pid->u.seq.items;
    if (!kiln__pk_is_str(it[0]) || strcmp(it[0]->u.str.s, "storage") != 0) {
        kiln__pk_fail(s, "persistent id does not name a storage");
        return NULL;
    }
    if (!pk_is_storage_class(it[1])) {
        kiln__pk_fail(s, "persistent id's storage type is not a torch storage class");
        return NULL;
    }
    const kiln__pk_value *key = it[2];
    if (!kiln__pk_is_str(key) || key->u.str.len == 0 || key->u.str.len > 255 ||
        strlen(key->u.str.s) != key->u.str.len || strchr(key->u.str.s, '/')) {
        kiln__pk_fail(s, "storage key must be a non-empty string of at most 255 bytes without '/'");
        return NULL;
    }
    if (it[4]->kind != KILN__PK_INT || it[4]->u.i < 0) {
        kiln__pk_fail(s, "storage '%s' has no valid element count", key->u.str.s);
        return NULL;
    }
    size_t k = (size_t)(it[1]->u.global - PK_G_STORAGE);
    uint64_t numel = (uint64_t)it[4]->u.i, bytes;
    if (__builtin_mul_overflow(numel, (uint64_t)pk_storages[k].size, &bytes) || bytes > (UINT64_C(1) << 62)) {
        kiln__pk_fail(s, "storage '%s' claims %" PRIu64 " elements, too many", key->u.str.s, numel);
        return NULL;
    }
    kiln__pk_value *v = kiln__pk_new(s, KILN__PK_STORAGE);
    if (!v)
        return NULL;
    v->u.storage.key = key->u.str.s;
    v->u.storage.type_name = pk_storages[k].name;
    v->u.storage.dtype = pk_storages[k].dtype;
    v->u.storage.elem_size = pk_storages[k].size;
    v->u.storage.numel = numel;
    v->u.storage.untyped = k == PK_UNTYPED;
    return v;
}

/* _rebuild_tensor_v3's storage: the untyped storage's bytes read as dtype (a dtype global),
 * as a storage value of its own (one untyped storage could back views of several dtypes).
 * NULL with s failed. */
static const kiln__pk_value *pk_retype(pk_state *s, const kiln__pk_value *st, const kiln__pk_value *dtype)
{
    if (dtype->kind != KILN__PK_GLOBAL || dtype->u.global < PK_G_DTYPE) {
        kiln__pk_fail(s, "_rebuild_tensor_v3's dtype argument is not a torch dtype");
        return NULL;
    }
    if (st->kind != KILN__PK_STORAGE || !st->u.storage.untyped) {
        kiln__pk_fail(s, "_rebuild_tensor_v3 called on %s, not an UntypedStorage",
                      st->kind == KILN__PK_STORAGE ? st->u.storage.type_name : "something that is not a storage");
        return NULL;
    }
    size_t k = (size_t)(dtype->u.global - PK_G_DTYPE);
    uint64_t bytes = st->u.storage.numel; /* an untyped storage counts bytes */
    if (bytes % pk_dtypes[k].size != 0) {
        kiln__pk_fail(s, "untyped storage '%s' holds %" PRIu64 " bytes, not a whole number of %s elements",
                      st->u.storage.key, bytes, pk_dtypes[k].name);
        return NULL;
    }
    kiln__pk_value *v = kiln__pk_new(s, KILN__PK_STORAGE);
    if (!v)
        return NULL;
    v->u.storage = st->u.storage;
    v->u.storage.type_name = pk_dtypes[k].storage;
    v->u.storage.dtype = pk_dtypes[k].dtype;
    v->u.storage.elem_size = pk_dtypes[k].size;
    v->u.storage.numel = bytes / pk_dtypes[k].size;
    v->u.storage.untyped = false;
    return v;
}

/* A tuple (or list) of non-negative ints, of any length: a rank above KILN_MAX_DIMS is a
 * tensor kiln cannot load, not a malformed file (pk_tensor). */
static bool pk_int_seq(const kiln__pk_value *v)
{
    if (!v || (v->kind != KILN__PK_TUPLE && v->kind != KILN__PK_LIST))
        return false;
    for (size_t i = 0; i < v->u.seq.n; i++)
        if (v->u.seq.items[i]->kind != KILN__PK_INT || v->u.seq.items[i]->u.i < 0)
            return false;
    return true;
}

/*
 * _rebuild_tensor_v2's seventh argument: the tensor's metadata, which torch.save writes for a
 * lazily negated or conjugated view ({"neg": True} for torch._neg_view(x), {"conj": True}):
 * the stored values are the original's, and the view's are their negatives (or conjugates).
 * kiln reads the storage as it is, so such a tensor would load with its signs flipped; it is
 * refused instead, saying how to save it resolved. None, an empty dict or false flags are
 * plain tensors. 0, or -1 with s failed.
 */
static int tensor_flagged(pk_state *s, const kiln__pk_value *meta)
{
    if (meta->kind == KILN__PK_NONE)
        return 0;
    if (meta->kind != KILN__PK_DICT)
        return kiln__pk_fail(s, "tensor metadata is not a dict"), -1;
    for (size_t i = 0; i < meta->u.dict.n; i++) {
        const kiln__pk_value *k = meta->u.dict.keys[i], *v = meta->u.dict.vals[i];
        bool set = v->kind == KILN__PK_BOOL  ? v->u.b
                   : v->kind == KILN__PK_INT ? v->u.i != 0
                                             : v->kind != KILN__PK_NONE;
        if (!set)
            continue;
        const char *name = k->kind == KILN__PK_STR ? k->u.str.s : "?";
        if (!strcmp(name, "neg") || !strcmp(name, "conj"))
            return kiln__pk_fail(s,
                                 "a tensor is saved as a lazily %s view (metadata '%s'): its stored values are "
                                 "not its values; save it resolved (x.resolve_neg() / x.resolve_conj()) or as "
                                 "x.clone()",
                                 !strcmp(name, "neg") ? "negated" : "conjugated", name),
                   -1;
        return kiln__pk_fail(s, "a tensor carries metadata '%.32s' kiln does not know", name), -1;
    }
    return 0;
}

/* _rebuild_tensor(_v2, _v3)(storage, offset, size, stride, ...): a view of st (a[0], or
 * its retyped copy for v3), checked against the storage's claimed element count here and
 * against the record's real size on open. */
static kiln__pk_value *pk_tensor(pk_state *s, const kiln__pk_value *st, kiln__pk_value *const *a)
{
    if (st->kind != KILN__PK_STORAGE) {
        kiln__pk_fail(s, "tensor rebuilt from something that is not a storage");
        return NULL;
    }
    if (a[1]->kind != KILN__PK_INT || a[1]->u.i < 0) {
        kiln__pk_fail(s, "tensor on storage '%s' has a negative or non-integer offset", st->u.storage.key);
        return NULL;
    }
    kiln__pk_tensor t = {.storage = st, .offset = (uint64_t)a[1]->u.i};
    if (!pk_int_seq(a[2]) || !pk_int_seq(a[3]) || a[2]->u.seq.n != a[3]->u.seq.n) {
        kiln__pk_fail(s,
                      "tensor on storage '%s' needs size and stride tuples of equal length of non-negative "
                      "integers",
                      st->u.storage.key);
        return NULL;
    }
    size_t nd = a[2]->u.seq.n;
    kiln__pk_value *const *size = a[2]->u.seq.items, *const *stride = a[3]->u.seq.items;
    /* numel, and the last element the view touches: offset + sum((size - 1) * stride). */
    uint64_t numel = 1, last = t.offset;
    for (size_t d = 0; d < nd; d++)
        if (__builtin_mul_overflow(numel, (uint64_t)size[d]->u.i, &numel))
            numel = UINT64_MAX;
    if (numel > 0) {
        for (size_t d = 0; d < nd; d++) {
            uint64_t step;
            if (__builtin_mul_overflow((uint64_t)(size[d]->u.i - 1), (uint64_t)stride[d]->u.i, &step) ||
                __builtin_add_overflow(last, step, &last))
                last = UINT64_MAX;
        }
        /* Outside its storage: the file is damaged or hostile, so it is refused whole. */
        if (last >= st->u.storage.numel) {
            kiln__pk_fail(s, "tensor view reaches element %" PRIu64 " of storage '%s', which holds %" PRIu64, last,
                          st->u.storage.key, st->u.storage.numel);
            return NULL;
        }
    }
    /* The two views below are valid torch but not loadable by kiln. They are kept, with
     * the reason, so that the file opens and the rest of its tensors load; kiln_torch_load
     * names the tensor when asked for one of these (its key is not known yet here). */
    if (nd > KILN_MAX_DIMS) {
        t.too_many_dims = true;
        snprintf(t.refused, sizeof t.refused, "has %zu dimensions, more than the %d kiln supports", nd,
                 KILN_MAX_DIMS);
    } else {
        t.ndim = (int)nd;
        for (size_t d = 0; d < nd; d++) {
            t.size[d] = size[d]->u.i;
            t.stride[d] = stride[d]->u.i;
        }
        /* kiln loads a contiguous copy; a view with more elements than its storage (an
         * expand()ed tensor) would multiply memory on load. */
        if (numel > st->u.storage.numel)
            snprintf(t.refused, sizeof t.refused,
                     "is a view with %" PRIu64 " elements of a storage of %" PRIu64
                     " (an expand()ed tensor), which kiln does not load; save x.contiguous() instead",
                     numel, st->u.storage.numel);
    }
    kiln__pk_value *v = kiln__pk_new(s, KILN__PK_TENSOR);
    if (!v)
        return NULL;
    v->u.tensor = malloc(sizeof t);
    if (!v->u.tensor) {
        kiln__pk_oom(s);
        return NULL;
    }
    *v->u.tensor = t;
    return v;
}

kiln__pk_value *kiln__pk_reduce(pk_state *s, const kiln__pk_value *fn, const kiln__pk_value *args)
{
    char gname[96];
    if (fn->kind != KILN__PK_GLOBAL) {
        kiln__pk_fail(s, "REDUCE of a value that is not a callable");
        return NULL;
    }
    if (args->kind != KILN__PK_TUPLE) {
        kiln__pk_fail(s, "REDUCE arguments for %s are not a tuple",
                      kiln__pk_global_name(fn->u.global, gname, sizeof gname));
        return NULL;
    }
    size_t n = args->u.seq.n;
    kiln__pk_value *const *a = args->u.seq.items;
    switch (fn->u.global) {
    case PK_G_ORDERED_DICT: {
        kiln__pk_value *d = kiln__pk_new(s, KILN__PK_DICT);
        if (!d || n == 0)
            return d;
        /* OrderedDict([(k, v), ...]) */
        if (n == 1 && (a[0]->kind == KILN__PK_LIST || a[0]->kind == KILN__PK_TUPLE)) {
            for (size_t i = 0; i < a[0]->u.seq.n; i++) {
                const kiln__pk_value *kv = a[0]->u.seq.items[i];
                if ((kv->kind != KILN__PK_TUPLE && kv->kind != KILN__PK_LIST) || kv->u.seq.n != 2) {
                    kiln__pk_fail(s, "OrderedDict argument is not a sequence of pairs");
                    return NULL;
                }
                if (kiln__pk_dict_add(s, d, kv->u.seq.items[0], kv->u.seq.items[1]) < 0)
                    return NULL;
            }
            return d;
        }
        kiln__pk_fail(s, "OrderedDict called with unsupported arguments");
        return NULL;
    }
    case PK_G_REBUILD_TENSOR:
    case PK_G_REBUILD_TENSOR_V2:
        if ((fn->u.global == PK_G_REBUILD_TENSOR && n != 4) ||
            (fn->u.global == PK_G_REBUILD_TENSOR_V2 && n != 6 && n != 7)) {
            kiln__pk_fail(s, "%s called with %zu arguments",
                          kiln__pk_global_name(fn->u.global, gname, sizeof gname), n);
            return NULL;
        }
        if (n == 7 && tensor_flagged(s, a[6]) < 0)
            return NULL;
        return pk_tensor(s, a[0], a);
    case PK_G_REBUILD_TENSOR_V3: {
        /* (storage, offset, size, stride, requires_grad, hooks, dtype[, metadata]) */
        if (n != 7 && n != 8) {
            kiln__pk_fail(s, "%s called with %zu arguments",
                          kiln__pk_global_name(fn->u.global, gname, sizeof gname), n);
            return NULL;
        }
        if (n == 8 && tensor_flagged(s, a[7]) < 0)
            return NULL;
        const kiln__pk_value *st = pk_retype(s, a[0], a[6]);
        return st ? pk_tensor(s, st, a) : NULL;
    }
    case PK_G_REBUILD_PARAMETER:
    case PK_G_REBUILD_PARAMETER_WITH_STATE:
        /* (data, requires_grad, backward_hooks[, state]): the parameter is its data. */
        if (n != (fn->u.global == PK_G_REBUILD_PARAMETER ? 3u : 4u) || a[0]->kind != KILN__PK_TENSOR) {
            kiln__pk_fail(s, "%s called with unsupported arguments",
                          kiln__pk_global_name(fn->u.global, gname, sizeof gname));
            return NULL;
        }
        return a[0];
    default:
        kiln__pk_fail(s, "%s cannot be called in a weights file",
                      kiln__pk_global_name(fn->u.global, gname, sizeof gname));
        return NULL;
    }
}
