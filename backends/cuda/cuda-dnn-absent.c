/*
 * backends/cuda/cuda-dnn-absent.c — the convolution entries of a cuda backend built
 * without cuDNN: supports() says no, so the engine reports convolutions as unsupported
 * on the device (naming it) instead of calling these; a direct call gets the same answer.
 */
#include "cuda-impl.h"

bool kiln__cuda_conv_supports(const kiln_conv_params *p, kiln_dtype dt)
{
    (void)p;
    (void)dt;
    return false;
}

static int absent(void *vq, const char *op)
{
    kiln_cuda_queue *q = vq;
    kiln__error_set("%s on %s: this build has no cuDNN, so convolutions are not supported", op, q->dev->name);
    return KILN_ENOTSUP;
}

int kiln__cuda_conv(void *q, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x,
                    const kiln_tdesc *w, const kiln_tdesc *bias)
{
    return absent(q, "conv");
}

int kiln__cuda_conv_backward_input(void *q, const kiln_conv_params *p, const kiln_tdesc *grad_x,
                                   const kiln_tdesc *grad_out, const kiln_tdesc *w)
{
    return absent(q, "conv_backward_input");
}

int kiln__cuda_conv_backward_weight(void *q, const kiln_conv_params *p, const kiln_tdesc *grad_w,
                                    const kiln_tdesc *x, const kiln_tdesc *grad_out)
{
    return absent(q, "conv_backward_weight");
}

void kiln__cuda_dnn_queue_fini(kiln_cuda_queue *q)
{
    (void)q;
}

void kiln__cuda_dnn_device_fini(kiln_cuda_device *dev)
{
    (void)dev;
}
