/*
 * engine/optim/optim-autograd.c — the optimizer entry points tied to other engine
 * areas: those that read and write the parameters' autodiff gradients (kiln_grad /
 * kiln_set_grad / kiln_zero_grad), and the constructor from an nn module tree. The
 * arithmetic lives in optim.c and clip.c, which take gradients explicitly; this file
 * only fetches them, so optim.c stays usable with any parameter list.
 */
#include <stdlib.h>

#include "error-impl.h"
#include "kiln/autodiff.h"
#include "kiln/nn.h"
#include "optim-impl.h"
#include "tensor-impl.h"

/* The parameters' current gradients (scope-held; NULL where none), in a new array. */
static kiln_tensor **fetch_grads(kiln_optim *opt, const char *op)
{
    kiln_tensor **g = calloc(opt->n ? (size_t)opt->n : 1, sizeof *g);
    if (!g) {
        kiln__error_set("%s: out of memory", op);
        return NULL;
    }
    for (int i = 0; i < opt->n; i++)
        g[i] = kiln_grad(opt->p[i].param);
    return g;
}

/* A parameter nothing but the optimizer holds any more: the module it was listed from put
 * another tensor in its place (kiln_module_to_device, kiln_module_map) and released this one.
 * Stepping it would report an update that no model ever sees, so it is an error. */
static int check_not_orphaned(const kiln_optim *opt)
{
    for (int i = 0; i < opt->n; i++)
        if (atomic_load(&opt->p[i].param->refcount) == 1)
            return kiln__error_set("optim_step: %s: parameter \"%s\" is held by this optimizer alone: the "
                                   "module it came from replaced it (kiln_module_to_device or kiln_module_map "
                                   "after the optimizer was created), so a step would train a tensor no model "
                                   "uses; create the optimizer after moving the model",
                                   kiln_optim_kind_name(opt->cfg.kind), opt->p[i].name);
    return 0;
}

int kiln_optim_step(kiln_optim *opt)
{
    if (!opt)
        return kiln__error_set("optim_step: optimizer is NULL");
    if (check_not_orphaned(opt) < 0)
        return -1;
    kiln_scope_begin();
    kiln_tensor **g = fetch_grads(opt, "optim_step");
    int rc = g ? kiln_optim_step_grads(opt, g) : -1;
    free(g);
    kiln_scope_end();
    return rc;
}

void kiln_optim_zero_grad(kiln_optim *opt)
{
    for (int i = 0; opt && i < opt->n; i++)
        kiln_zero_grad(opt->p[i].param);
}

/* Clip copies of the gradients, then hand them back with kiln_set_grad: correct
 * whether kiln_grad returns the stored gradient or a copy of it. */
static int clip_and_set(kiln_optim *opt, bool by_norm, double limit, double norm_type, double *norm)
{
    const char *op = by_norm ? "clip_grad_norm" : "clip_grad_value";
    if (!opt)
        return kiln__error_set("%s: optimizer is NULL", op);
    kiln_scope_begin();
    kiln_tensor **g = fetch_grads(opt, op);
    int rc = g ? 0 : -1;
    for (int i = 0; rc == 0 && i < opt->n; i++)
        if (g[i] && !(g[i] = kiln_clone(g[i])))
            rc = -1;
    if (rc == 0) {
        if (by_norm) {
            *norm = kiln_grads_clip_norm(opt->n, g, limit, norm_type);
            rc = *norm < 0 ? -1 : 0;
        } else {
            rc = kiln_grads_clip_value(opt->n, g, limit);
        }
    }
    for (int i = 0; rc == 0 && i < opt->n; i++)
        if (g[i])
            rc = kiln_set_grad(opt->p[i].param, g[i]) < 0 ? -1 : 0;
    free(g);
    kiln_scope_end();
    return rc;
}

double kiln_optim_clip_grad_norm(kiln_optim *opt, double max_norm, double norm_type)
{
    double norm = -1;
    return clip_and_set(opt, true, max_norm, norm_type, &norm) < 0 ? -1 : norm;
}

int kiln_optim_clip_grad_value(kiln_optim *opt, double clip)
{
    return clip_and_set(opt, false, clip, 0, NULL);
}

kiln_optim *kiln_optim_create_module(const kiln_optim_config *cfg, kiln_module *m)
{
    if (!m) {
        kiln__error_set("optim_create: module is NULL");
        return NULL;
    }
    int n = kiln_module_parameters(m, NULL, 0);
    if (n < 0)
        return NULL;
    kiln_named_tensor *nt = calloc(n ? (size_t)n : 1, sizeof *nt);
    kiln_tensor **ps = calloc(n ? (size_t)n : 1, sizeof *ps);
    const char **names = calloc(n ? (size_t)n : 1, sizeof *names);
    kiln_optim *opt = NULL;
    if (!nt || !ps || !names) {
        kiln__error_set("optim_create: out of memory");
    } else if (kiln_module_parameters(m, nt, n) == n) {
        for (int i = 0; i < n; i++) {
            ps[i] = nt[i].tensor;
            names[i] = nt[i].name;
        }
        opt = kiln_optim_create(cfg, n, ps, names); /* copies the names */
    } else {
        kiln__error_set("optim_create: the module's parameter list changed while being read");
    }
    free(nt);
    free(ps);
    free(names);
    return opt;
}
