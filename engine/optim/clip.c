/*
 * engine/optim/clip.c — gradient clipping on explicit gradient tensors, by global norm
 * (torch.nn.utils.clip_grad_norm_) and by value (clip_grad_value_).
 *
 * The global norm is the norm of the per-tensor norms, as PyTorch computes it, so a
 * parameter list split differently gives the same answer. The per-tensor norms are
 * read back to the host (one scalar each): the coefficient is needed as a number to
 * return it anyway, and it keeps the arithmetic in double.
 */
#include <math.h>

#include "error-impl.h"
#include "kiln/autodiff.h"
#include "optim-impl.h"
#include "tensor-impl.h"

/* Global norm of n gradients; NULL entries skipped. -1 plus a message on error. */
static double global_norm(int n, kiln_tensor *const *grads, double p, const char *op)
{
    double acc = 0;
    for (int i = 0; i < n; i++) {
        if (!grads[i])
            continue;
        if (!kiln_dtype_is_float(grads[i]->dtype)) {
            char b[128];
            kiln__error_set("%s: gradient %d is %s, not floating", op, i, kiln__describe(grads[i], b, sizeof b));
            return -1;
        }
        kiln_tensor *nt = kiln_norm(grads[i], p, KILN_ALL_DIMS, false);
        if (!nt)
            return -1;
        double v = kiln_item(nt);
        if (isinf(p))
            acc = fmax(acc, v) + 0 * v; /* keep a NaN visible, as PyTorch's stack + norm does */
        else
            acc += pow(v, p);
    }
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
