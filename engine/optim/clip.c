/*
 * engine/optim/clip.c — gradient clipping on explicit gradient tensors, by global norm
 * (torch.nn.utils.clip_grad_norm_) and by value (clip_grad_value_).
 *
 * The global norm is the norm of the per-tensor norms, as PyTorch computes it, so a
 * parameter list split differently gives the same answer. The per-tensor norms are
 * computed on the device and read back together, one read for the whole list (the
 * coefficient is needed as a number to return it anyway, and combining on the host
 * keeps the arithmetic in double).
 */
#include <math.h>
#include <stdlib.h>

#include "error-impl.h"
#include "kiln/autodiff.h"
#include "optim-impl.h"
#include "tensor-impl.h"

/* Global norm of n gradients; NULL entries skipped. -1 plus a message on error. Called
 * inside a scope. The per-tensor norms of each device are stacked (as f64) and read with
 * one download, so the whole list costs one wait per device instead of one per tensor;
 * they are then combined in double exactly as before. */
static double global_norm(int n, kiln_tensor *const *grads, double p, const char *op)
{
    double acc = 0;
    kiln_tensor **norms = calloc((size_t)(n ? n : 1), sizeof *norms);
    double *vals = calloc((size_t)(n ? n : 1), sizeof *vals);
    bool *done = calloc((size_t)(n ? n : 1), sizeof *done);
    int rc = norms && vals && done ? 0 : kiln__error_set("%s: out of memory", op);
    for (int i = 0; i < n && rc == 0; i++) {
        if (!grads[i])
            continue;
        if (!kiln_dtype_is_float(grads[i]->dtype)) {
            char b[128];
            rc = kiln__error_set("%s: gradient %d is %s, not floating", op, i, kiln__describe(grads[i], b, sizeof b));
            break;
        }
        norms[i] = kiln_cast(kiln_norm(grads[i], p, KILN_ALL_DIMS, false), KILN_F64);
        if (!norms[i])
            rc = -1;
    }
    /* one stacked read per device (normally one device) */
    for (int i = 0; i < n && rc == 0; i++) {
        if (!norms[i] || done[i])
            continue;
        kiln_tensor **same = calloc((size_t)n, sizeof *same);
        int *where = calloc((size_t)n, sizeof *where);
        int k = 0;
        for (int j = i; same && where && j < n; j++)
            if (norms[j] && !done[j] && kiln_tensor_device(norms[j]) == kiln_tensor_device(norms[i])) {
                where[k] = j;
                same[k++] = norms[j];
            }
        double *got = k ? calloc((size_t)k, sizeof *got) : NULL;
        kiln_tensor *st = got ? kiln_stack(same, k, 0) : NULL;
        rc = st && kiln_to_data(st, got, (size_t)k * sizeof *got) == 0 ? 0 : -1;
        for (int m = 0; rc == 0 && m < k; m++) {
            vals[where[m]] = got[m];
            done[where[m]] = true;
        }
        if (!got && rc == 0)
            rc = kiln__error_set("%s: out of memory", op);
        free(got);
        free(same);
        free(where);
    }
    for (int i = 0; i < n && rc == 0; i++) {
        if (!norms[i])
            continue;
        double v = vals[i];
        if (isinf(p))
            /* keep a NaN visible, as PyTorch's stack + norm does (fmax would drop it); an
             * infinite norm stays infinite */
            acc = isnan(v) || isnan(acc) ? NAN : fmax(acc, v);
        else
            acc += pow(v, p);
    }
    free(norms);
    free(vals);
    free(done);
    if (rc < 0)
        return -1;
    return isinf(p) ? acc : pow(acc, 1 / p);
}

double kiln_grads_clip_norm(int n, kiln_tensor *const *grads, double max_norm, double norm_type)
{
    const char *op = "clip_grad_norm";
    if (n < 0 || (n > 0 && !grads))
        return kiln__error_set("%s: bad gradient list", op);
    if (!(norm_type > 0))
        return kiln__error_set("%s: norm_type must be positive (got %g)", op, norm_type);
    kiln_no_grad_begin();
    kiln_scope_begin();
    double total = global_norm(n, grads, norm_type, op);
    int rc = total < 0 ? -1 : 0;
    double coef = max_norm / (total + 1e-6);
    /* PyTorch multiplies by min(coef, 1) always; skipping the multiply by exactly 1
     * gives the same values. A NaN coefficient (NaN norm) still multiplies. */
    if (rc == 0 && !(coef >= 1)) {
        for (int i = 0; i < n && rc == 0; i++)
            if (grads[i])
                rc = kiln__optim_write(grads[i], kiln_mul_scalar(grads[i], coef), op);
    }
    kiln_scope_end();
    kiln_no_grad_end();
    return rc < 0 ? -1 : total;
}

int kiln_grads_clip_value(int n, kiln_tensor *const *grads, double clip)
{
    const char *op = "clip_grad_value";
    if (n < 0 || (n > 0 && !grads))
        return kiln__error_set("%s: bad gradient list", op);
    if (!(clip >= 0))
        return kiln__error_set("%s: clip value must be non-negative (got %g)", op, clip);
    int rc = 0;
    kiln_no_grad_begin();
    kiln_scope_begin();
    for (int i = 0; i < n && rc == 0; i++)
        if (grads[i])
            rc = kiln__optim_write(grads[i], kiln_clamp(grads[i], -clip, clip), op);
    kiln_scope_end();
    kiln_no_grad_end();
    return rc < 0 ? -1 : 0;
}
