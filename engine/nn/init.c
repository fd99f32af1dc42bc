/*
 * engine/nn/init.c — weight initializers (PyTorch's torch.nn.init semantics: fans
 * from [out, in, k...] shapes, gains per nonlinearity) and the default initialization
 * each layer uses. All draws go through a kiln_generator, so a seed reproduces a model
 * bit for bit on every backend.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn-impl.h"

void kiln__fans(int ndim, const int64_t *shape, double *fan_in, double *fan_out)
{
    double recept = 1;
    for (int i = 2; i < ndim; i++)
        recept *= (double)shape[i];
    if (ndim < 2) {
        /* PyTorch refuses fans for 1-d tensors; treating a vector as [n, 1] keeps the
         * helpers total and matches how the bias bound is computed from the weight. */
        *fan_in = ndim == 1 ? (double)shape[0] : 1;
        *fan_out = *fan_in;
        return;
    }
    *fan_in = (double)shape[1] * recept;
    *fan_out = (double)shape[0] * recept;
}

double kiln_init_gain(kiln_nonlinearity nl, double param)
{
    switch (nl) {
    case KILN_GAIN_RELU:
        return sqrt(2.0);
    case KILN_GAIN_LEAKY_RELU:
        return sqrt(2.0 / (1 + param * param));
    case KILN_GAIN_TANH:
        return 5.0 / 3.0;
    case KILN_GAIN_SELU:
        return 0.75;
    case KILN_GAIN_LINEAR:
    case KILN_GAIN_SIGMOID:
    default:
        return 1.0;
    }
}

kiln_tensor *kiln_init_constant(kiln_device *dev, int ndim, const int64_t *shape, double value)
{
    return kiln_full(dev, KILN_F32, ndim, shape, value);
}

kiln_tensor *kiln_init_zeros(kiln_device *dev, int ndim, const int64_t *shape)
{
    return kiln_zeros(dev, KILN_F32, ndim, shape);
}

kiln_tensor *kiln_init_ones(kiln_device *dev, int ndim, const int64_t *shape)
{
    return kiln_ones(dev, KILN_F32, ndim, shape);
}

kiln_tensor *kiln_init_uniform(kiln_device *dev, int ndim, const int64_t *shape, double low, double high,
                               kiln_generator *gen)
{
    kiln_generator fb;
    return kiln_rand_uniform(dev, KILN_F32, ndim, shape, low, high, kiln__gen_or_default(gen, &fb));
}

kiln_tensor *kiln_init_normal(kiln_device *dev, int ndim, const int64_t *shape, double mean, double std,
                              kiln_generator *gen)
{
    kiln_generator fb;
    return kiln_rand_normal(dev, KILN_F32, ndim, shape, mean, std, kiln__gen_or_default(gen, &fb));
}

kiln_tensor *kiln_init_xavier_uniform(kiln_device *dev, int ndim, const int64_t *shape, double gain,
                                      kiln_generator *gen)
{
    double fi, fo;
    kiln__fans(ndim, shape, &fi, &fo);
    double bound = gain * sqrt(6.0 / (fi + fo));
    return kiln_init_uniform(dev, ndim, shape, -bound, bound, gen);
}

kiln_tensor *kiln_init_xavier_normal(kiln_device *dev, int ndim, const int64_t *shape, double gain,
                                     kiln_generator *gen)
{
    double fi, fo;
    kiln__fans(ndim, shape, &fi, &fo);
    return kiln_init_normal(dev, ndim, shape, 0, gain * sqrt(2.0 / (fi + fo)), gen);
}

static double kaiming_std(int ndim, const int64_t *shape, double a, kiln_fan_mode mode, kiln_nonlinearity nl)
{
    double fi, fo;
    kiln__fans(ndim, shape, &fi, &fo);
    double fan = mode == KILN_FAN_OUT ? fo : fi;
    return kiln_init_gain(nl, a) / sqrt(fan > 0 ? fan : 1);
}

kiln_tensor *kiln_init_kaiming_uniform(kiln_device *dev, int ndim, const int64_t *shape, double a,
                                       kiln_fan_mode mode, kiln_nonlinearity nl, kiln_generator *gen)
{
    double bound = sqrt(3.0) * kaiming_std(ndim, shape, a, mode, nl);
    return kiln_init_uniform(dev, ndim, shape, -bound, bound, gen);
}

kiln_tensor *kiln_init_kaiming_normal(kiln_device *dev, int ndim, const int64_t *shape, double a,
                                      kiln_fan_mode mode, kiln_nonlinearity nl, kiln_generator *gen)
{
    return kiln_init_normal(dev, ndim, shape, 0, kaiming_std(ndim, shape, a, mode, nl), gen);
}

kiln_tensor *kiln_init_orthogonal(kiln_device *dev, int ndim, const int64_t *shape, double gain,
                                  kiln_generator *gen)
{
    if (ndim < 2) {
        kiln__error_set("init_orthogonal: needs at least 2 dims (got %d)", ndim);
        return NULL;
    }
    int64_t rows = shape[0], numel = 1;
    for (int i = 0; i < ndim; i++)
        numel *= shape[i];
    int64_t cols = rows ? numel / rows : 0;
    kiln_tensor *flat = kiln_keep(kiln_init_normal(dev, KILN_SHAPE(rows, cols), 0, 1, gen));
    float *a = malloc((size_t)(numel ? numel : 1) * sizeof *a);
    double *q = malloc((size_t)(numel ? numel : 1) * sizeof *q);
    kiln_tensor *out = NULL;
    if (!flat || !a || !q || kiln_to_data(flat, a, (size_t)numel * sizeof *a) < 0) {
        if (flat && (!a || !q))
            kiln__error_set("init_orthogonal: out of memory");
        goto done;
    }
    /* Orthonormalize the vectors along the shorter side with modified Gram-Schmidt (a
     * QR whose R has a positive diagonal, which is what PyTorch's sign fix-up yields). */
    bool by_rows = rows <= cols;
    int64_t nvec = by_rows ? rows : cols, len = by_rows ? cols : rows;
    for (int64_t v = 0; v < nvec; v++)
        for (int64_t k = 0; k < len; k++)
            q[v * len + k] = by_rows ? a[v * cols + k] : a[k * cols + v];
    for (int64_t v = 0; v < nvec; v++) {
        double *qv = q + v * len;
        for (int64_t u = 0; u < v; u++) {
            const double *qu = q + u * len;
            double dot = 0;
            for (int64_t k = 0; k < len; k++)
                dot += qu[k] * qv[k];
            for (int64_t k = 0; k < len; k++)
                qv[k] -= dot * qu[k];
        }
        double nrm = 0;
        for (int64_t k = 0; k < len; k++)
            nrm += qv[k] * qv[k];
        nrm = sqrt(nrm);
        for (int64_t k = 0; k < len; k++)
            qv[k] = nrm > 0 ? qv[k] / nrm : 0;
    }
    for (int64_t v = 0; v < nvec; v++)
        for (int64_t k = 0; k < len; k++) {
            float x = (float)(gain * q[v * len + k]);
            if (by_rows)
                a[v * cols + k] = x;
            else
                a[k * cols + v] = x;
        }
    out = kiln_from_data(dev, KILN_F32, ndim, shape, a, (size_t)numel * sizeof *a);
done:
    kiln_tensor_release(flat);
    free(a);
    free(q);
    return out;
}

/* Layers own their parameters: the helpers below hand back tensors outside any scope. */

kiln_tensor *kiln__uniform(kiln_device *dev, int ndim, const int64_t *shape, double lo, double hi,
                           kiln_generator *gen)
{
    return kiln_keep(kiln_init_uniform(dev, ndim, shape, lo, hi, gen));
}

kiln_tensor *kiln__default_weight(kiln_device *dev, int ndim, const int64_t *shape, kiln_generator *gen)
{
    return kiln_keep(kiln_init_kaiming_uniform(dev, ndim, shape, sqrt(5.0), KILN_FAN_IN, KILN_GAIN_LEAKY_RELU, gen));
}

kiln_tensor *kiln__default_bias(kiln_device *dev, int64_t n, double fan_in, kiln_generator *gen)
{
    double bound = fan_in > 0 ? 1.0 / sqrt(fan_in) : 0;
    return kiln__uniform(dev, KILN_SHAPE(n), -bound, bound, gen);
}
