/*
 * engine/optim/optim-state.c — optimizer state for checkpoints: export as named tensors
 * plus a JSON document, import back, and both in one safetensors file.
 *
 * The JSON holds everything that is not a tensor: the kind and every hyperparameter
 * (a scheduler may have changed lr or momentum, and PyTorch's load_state_dict restores
 * them too), the update count, the accumulation counter and each parameter's name,
 * shape and step. Tensors are named "<param>.<slot>" with PyTorch's slot names, plus
 * "<param>.grad_accum" for gradients accumulated since the last update. A slot that was
 * never created is simply absent, and stays absent after import, so a restored run takes
 * exactly the same path as the uninterrupted one.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "kiln/record.h"
#include "optim-impl.h"
#include "tensor-impl.h"

#define FORMAT "kiln-optim-1"
#define ACCUM_SLOT "grad_accum"

void kiln_optim_state_free(kiln_optim_state *st)
{
    if (!st)
        return;
    for (int i = 0; i < st->n; i++) {
        free(st->names[i]);
        kiln_tensor_release(st->tensors[i]);
    }
    free(st->names);
    free(st->tensors);
    free(st->json);
    memset(st, 0, sizeof *st);
}

static cJSON *config_json(const kiln_optim_config *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "kind", kiln_optim_kind_name(c->kind));
    cJSON_AddNumberToObject(o, "lr", c->lr);
    cJSON_AddNumberToObject(o, "weight_decay", c->weight_decay);
    cJSON_AddNumberToObject(o, "momentum", c->momentum);
    cJSON_AddNumberToObject(o, "dampening", c->dampening);
    cJSON_AddBoolToObject(o, "nesterov", c->nesterov);
    cJSON_AddNumberToObject(o, "beta1", c->beta1);
    cJSON_AddNumberToObject(o, "beta2", c->beta2);
    cJSON_AddNumberToObject(o, "eps", c->eps);
    cJSON_AddBoolToObject(o, "amsgrad", c->amsgrad);
    cJSON_AddNumberToObject(o, "alpha", c->alpha);
    cJSON_AddBoolToObject(o, "centered", c->centered);
    cJSON_AddNumberToObject(o, "lr_decay", c->lr_decay);
    cJSON_AddNumberToObject(o, "initial_accumulator_value", c->initial_accumulator_value);
    cJSON_AddBoolToObject(o, "maximize", c->maximize);
    cJSON_AddNumberToObject(o, "accumulate_steps", c->accumulate_steps);
    return o;
}

/* cJSON prints numbers with 17 significant digits, so doubles round-trip exactly. */
static int get_num(const cJSON *o, const char *key, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v))
        return kiln__error_set("optim_state_import: config field \"%s\" missing or not a number", key);
    *out = v->valuedouble;
    return 0;
}

static int get_bool(const cJSON *o, const char *key, bool *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsBool(v))
        return kiln__error_set("optim_state_import: config field \"%s\" missing or not a boolean", key);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int config_from_json(const cJSON *o, kiln_optim_config *c)
{
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(o, "kind");
    int kind = cJSON_IsString(k) ? kiln_optim_kind_from_name(k->valuestring) : -1;
    if (kind < 0)
        return kiln__error_set("optim_state_import: unknown or missing optimizer kind");
    c->kind = (kiln_optim_kind)kind;
    double acc = 1;
    if (get_num(o, "lr", &c->lr) < 0 || get_num(o, "weight_decay", &c->weight_decay) < 0 ||
        get_num(o, "momentum", &c->momentum) < 0 || get_num(o, "dampening", &c->dampening) < 0 ||
        get_bool(o, "nesterov", &c->nesterov) < 0 || get_num(o, "beta1", &c->beta1) < 0 ||
        get_num(o, "beta2", &c->beta2) < 0 || get_num(o, "eps", &c->eps) < 0 ||
        get_bool(o, "amsgrad", &c->amsgrad) < 0 || get_num(o, "alpha", &c->alpha) < 0 ||
        get_bool(o, "centered", &c->centered) < 0 || get_num(o, "lr_decay", &c->lr_decay) < 0 ||
        get_num(o, "initial_accumulator_value", &c->initial_accumulator_value) < 0 ||
        get_bool(o, "maximize", &c->maximize) < 0 || get_num(o, "accumulate_steps", &acc) < 0)
        return -1;
    if (!(acc >= 1 && acc <= 1e9))
        return kiln__error_set("optim_state_import: invalid accumulate_steps %g", acc);
    c->accumulate_steps = (int)acc;
    return kiln__optim_check_config(c, "optim_state_import");
}

static int add_entry(kiln_optim_state *st, const char *pname, const char *slot, kiln_tensor *t)
{
    size_t len = strlen(pname) + strlen(slot) + 2;
    char *name = malloc(len);
    kiln_tensor *copy = kiln_clone(t);
    if (!name || !copy) {
        free(name);
        kiln_tensor_release(copy);
        return copy ? kiln__error_set("optim_state_export: out of memory") : -1;
    }
    snprintf(name, len, "%s.%s", pname, slot);
    st->names[st->n] = name;
    st->tensors[st->n] = kiln_keep(copy);
    st->n++;
    return 0;
}

int kiln_optim_state_export(const kiln_optim *opt, kiln_optim_state *out)
{
    if (!opt || !out)
        return kiln__error_set("optim_state_export: NULL argument");
    memset(out, 0, sizeof *out);
    size_t cap = (size_t)opt->n * (KILN_OPTIM_SLOTS + 1) + 1;
    out->names = calloc(cap, sizeof *out->names);
    out->tensors = calloc(cap, sizeof *out->tensors);
    cJSON *root = cJSON_CreateObject();
    if (!out->names || !out->tensors || !root) {
        cJSON_Delete(root);
        kiln_optim_state_free(out);
        return kiln__error_set("optim_state_export: out of memory");
    }
    cJSON_AddStringToObject(root, "format", FORMAT);
    cJSON_AddItemToObject(root, "config", config_json(&opt->cfg));
    cJSON_AddNumberToObject(root, "steps", (double)opt->steps);
    cJSON_AddNumberToObject(root, "accum_count", opt->accum_count);
    cJSON *params = cJSON_AddArrayToObject(root, "params");
    int rc = 0;
    for (int i = 0; i < opt->n && rc == 0; i++) {
        const kiln__optim_pstate *p = &opt->p[i];
        cJSON *pj = cJSON_CreateObject();
        cJSON_AddStringToObject(pj, "name", p->name);
        cJSON_AddNumberToObject(pj, "step", (double)p->step);
        cJSON *shape = cJSON_AddArrayToObject(pj, "shape");
        for (int d = 0; d < p->param->ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)p->param->shape[d]));
        cJSON_AddItemToArray(params, pj);
        for (int s = 0; s < KILN_OPTIM_SLOTS && rc == 0; s++)
            if (p->slot[s])
                rc = add_entry(out, p->name, kiln__optim_slot_name(opt->cfg.kind, s), p->slot[s]);
        if (rc == 0 && p->accum)
            rc = add_entry(out, p->name, ACCUM_SLOT, p->accum);
    }
    out->json = rc == 0 ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (rc < 0 || !out->json) {
        kiln_optim_state_free(out);
        return rc < 0 ? rc : kiln__error_set("optim_state_export: out of memory");
    }
    return 0;
}

static kiln_tensor *find_tensor(int n, const char *const *names, kiln_tensor *const *tensors, const char *pname,
                                const char *slot)
{
    size_t pl = strlen(pname);
    for (int i = 0; i < n; i++)
        if (names[i] && strncmp(names[i], pname, pl) == 0 && names[i][pl] == '.' &&
            strcmp(names[i] + pl + 1, slot) == 0)
            return tensors[i];
    return NULL;
}

/* A private copy of t with p's shape, dtype and device, or NULL plus a message. */
static kiln_tensor *adopt(const kiln__optim_pstate *p, kiln_tensor *t, const char *slot)
{
    char a[128], b[128];
    if (!t)
        return NULL;
    if (t->ndim != p->param->ndim || memcmp(t->shape, p->param->shape, sizeof(int64_t) * (size_t)t->ndim)) {
        kiln__error_set("optim_state_import: \"%s.%s\" is %s but the parameter is %s", p->name, slot,
                        kiln__describe(t, a, sizeof a), kiln__describe(p->param, b, sizeof b));
        return NULL;
    }
    /* Always a fresh storage: the caller's tensors must never alias live state. */
    return kiln_clone(kiln_cast(kiln_to_device(t, kiln__dev(p->param)), p->param->dtype));
}

/* The parameter's shape as the state recorded it must be the live parameter's. */
static int check_shape(const char *op, const kiln__optim_pstate *p, const cJSON *shape)
{
    int n = cJSON_IsArray(shape) ? cJSON_GetArraySize(shape) : -1;
    if (n < 0 || n > KILN_MAX_DIMS)
        return kiln__error_set("%s: parameter \"%s\": missing or invalid shape", op, p->name);
    int64_t dims[KILN_MAX_DIMS];
    bool same = n == p->param->ndim;
    for (int d = 0; d < n; d++) {
        const cJSON *v = cJSON_GetArrayItem(shape, d);
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= 0x1p62) ||
            v->valuedouble != floor(v->valuedouble))
            return kiln__error_set("%s: parameter \"%s\": missing or invalid shape", op, p->name);
        dims[d] = (int64_t)v->valuedouble;
        same = same && dims[d] == p->param->shape[d];
    }
    if (same)
        return 0;
    char a[160], b[160];
    return kiln__error_set("%s: parameter \"%s\" has shape %s in the state but %s here", op, p->name,
                           kiln__shape_str(n, dims, a, sizeof a),
                           kiln__shape_str(p->param->ndim, p->param->shape, b, sizeof b));
}

int kiln_optim_state_import(kiln_optim *opt, int n, const char *const *names, kiln_tensor *const *tensors,
                            const char *json)
{
    const char *op = "optim_state_import";
    if (!opt || !json || n < 0 || (n > 0 && (!names || !tensors)))
        return kiln__error_set("%s: bad arguments", op);
    cJSON *root = cJSON_Parse(json);
    if (!root)
        return kiln__error_set("%s: the state is not valid JSON", op);
    int rc = 0;
    kiln_optim_config cfg = opt->cfg;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "params");
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(root, "steps");
    const cJSON *accum = cJSON_GetObjectItemCaseSensitive(root, "accum_count");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, FORMAT) != 0)
        rc = kiln__error_set("%s: not a %s document", op, FORMAT);
    else if (config_from_json(cJSON_GetObjectItemCaseSensitive(root, "config"), &cfg) < 0)
        rc = -1;
    else if (cfg.kind != opt->cfg.kind)
        rc = kiln__error_set("%s: the state is for %s, the optimizer is %s", op, kiln_optim_kind_name(cfg.kind),
                             kiln_optim_kind_name(opt->cfg.kind));
    else if (!cJSON_IsArray(params) || cJSON_GetArraySize(params) != opt->n)
        rc = kiln__error_set("%s: the state has %d parameters, the optimizer %d", op,
                             cJSON_IsArray(params) ? cJSON_GetArraySize(params) : -1, opt->n);
    else if (!cJSON_IsNumber(steps) || steps->valuedouble < 0 || !cJSON_IsNumber(accum) ||
             accum->valuedouble < 0 || accum->valuedouble >= cfg.accumulate_steps)
        rc = kiln__error_set("%s: missing or invalid step counters", op);

    /* Build every new tensor first (scope-held), then swap all of them in. */
    kiln_scope_begin();
    int ns = opt->n * (KILN_OPTIM_SLOTS + 1);
    kiln_tensor **fresh = calloc(ns ? (size_t)ns : 1, sizeof *fresh);
    int64_t *pstep = calloc(opt->n ? (size_t)opt->n : 1, sizeof *pstep);
    if (rc == 0 && (!fresh || !pstep))
        rc = kiln__error_set("%s: out of memory", op);
    for (int i = 0; i < opt->n && rc == 0; i++) {
        const kiln__optim_pstate *p = &opt->p[i];
        const cJSON *pj = cJSON_GetArrayItem(params, i);
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(pj, "name");
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(pj, "step");
        if (!cJSON_IsString(nm) || strcmp(nm->valuestring, p->name) != 0) {
            rc = kiln__error_set("%s: parameter %d is \"%s\" in the state but \"%s\" here", op, i,
                                 cJSON_IsString(nm) ? nm->valuestring : "?", p->name);
            break;
        }
        if (!cJSON_IsNumber(st) || st->valuedouble < 0) {
            rc = kiln__error_set("%s: parameter \"%s\": missing step", op, p->name);
            break;
        }
        pstep[i] = (int64_t)st->valuedouble;
        /* Checked here, not only through the slot tensors: a state with no slot yet (Adam
         * before its first step, plain SGD) carries no tensor whose shape could disagree. */
        if (check_shape(op, p, cJSON_GetObjectItemCaseSensitive(pj, "shape")) < 0) {
            rc = -1;
            break;
        }
        for (int s = 0; s <= KILN_OPTIM_SLOTS && rc == 0; s++) {
            const char *slot = s < KILN_OPTIM_SLOTS ? kiln__optim_slot_name(cfg.kind, s) : ACCUM_SLOT;
            if (!slot)
                continue;
            kiln_tensor *t = find_tensor(n, names, tensors, p->name, slot);
            if (!t)
                continue;
            kiln_tensor *c = adopt(p, t, slot);
            if (!c)
                rc = -1;
            fresh[i * (KILN_OPTIM_SLOTS + 1) + s] = c;
        }
    }
    if (rc == 0) {
        opt->cfg = cfg;
        opt->steps = (int64_t)steps->valuedouble;
        opt->accum_count = (int)accum->valuedouble;
        for (int i = 0; i < opt->n; i++) {
            kiln__optim_pstate *p = &opt->p[i];
            p->step = pstep[i];
            for (int s = 0; s <= KILN_OPTIM_SLOTS; s++) {
                kiln_tensor **dst = s < KILN_OPTIM_SLOTS ? &p->slot[s] : &p->accum;
                kiln_tensor *t = fresh[i * (KILN_OPTIM_SLOTS + 1) + s];
                kiln_tensor_release(*dst);
                *dst = t ? kiln_keep(t) : NULL;
            }
        }
    }
    free(fresh);
    free(pstep);
    kiln_scope_end();
    cJSON_Delete(root);
    return rc;
}

int kiln_optim_state_save(const kiln_optim *opt, const char *path)
{
    kiln_optim_state st;
    if (kiln_optim_state_export(opt, &st) < 0)
        return -1;
    const char *key = "kiln.optim";
    const char *val = st.json;
    int rc = kiln_safetensors_save(path, st.n, (const char *const *)st.names, st.tensors, 1, &key, &val);
    kiln_optim_state_free(&st);
    return rc < 0 ? -1 : 0;
}

int kiln_optim_state_load(kiln_optim *opt, const char *path)
{
    if (!opt)
        return kiln__error_set("optim_state_load: optimizer is NULL");
    kiln_safetensors *sf = kiln_safetensors_open(path);
    if (!sf)
        return -1;
    const char *json = kiln_safetensors_metadata(sf, "kiln.optim");
    int n = kiln_safetensors_count(sf);
    int rc = 0;
    if (!json)
        rc = kiln__error_set("optim_state_load: %s has no kiln.optim metadata", path);
    kiln_scope_begin();
    const char **names = calloc(n ? (size_t)n : 1, sizeof *names);
    kiln_tensor **ts = calloc(n ? (size_t)n : 1, sizeof *ts);
    if (rc == 0 && (!names || !ts))
        rc = kiln__error_set("optim_state_load: out of memory");
    kiln_device *dev = opt->n > 0 ? kiln__dev(opt->p[0].param) : NULL;
    for (int i = 0; i < n && rc == 0; i++) {
        names[i] = kiln_safetensors_name(sf, i);
        if (dev && !(ts[i] = kiln_safetensors_load(sf, names[i], dev)))
            rc = -1;
    }
    if (rc == 0)
        rc = kiln_optim_state_import(opt, n, names, ts, json);
    kiln_scope_end();
    free(names);
    free(ts);
    kiln_safetensors_close(sf);
    return rc;
}
