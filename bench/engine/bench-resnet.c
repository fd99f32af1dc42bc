/*
 * bench/engine/bench-resnet.c — ResNet-50 (torchvision's layout: the stride on each
 * bottleneck's 3x3 convolution, "v1.5") built with the C API from kiln's layers: Conv2d
 * without bias, BatchNorm2d, ReLU, MaxPool2d, Residual, AdaptiveAvgPool2d, Flatten, Linear.
 * fusion-bench times its inference; fusion_torch.py times torchvision's resnet50 on the
 * same input shape.
 */
#include "bench-resnet.h"

#include <stdio.h>

#include "kiln/autodiff.h"

/* A failed init frees whatever was built so far through append's ownership rule; the
 * caller sees NULL and kiln_error(). */
static int append(kiln_module *seq, kiln_module *child)
{
    return child ? kiln_sequential_append(seq, child) : -1;
}

static kiln_module *conv(int64_t in, int64_t out, int64_t k, int64_t stride, kiln_device *dev, kiln_generator *g)
{
    kiln_conv_config c = kiln_conv2d_config_default();
    c.in_channels = in;
    c.out_channels = out;
    c.kernel_size[0] = c.kernel_size[1] = k;
    c.stride[0] = c.stride[1] = stride;
    c.padding[0] = c.padding[1] = k / 2;
    c.bias = false;
    return kiln_conv2d_init(&c, dev, g);
}

/* momentum 1: bench_resnet_calibrate's one training-mode pass sets the running
 * statistics to that batch's, as a trained network's are (activations of unit scale, not
 * shrinking through fifty layers towards subnormal numbers) */
static kiln_module *bn(int64_t channels, kiln_device *dev, kiln_generator *g)
{
    kiln_batch_norm_config c = kiln_batch_norm2d_config_default();
    c.num_features = channels;
    c.momentum = 1.0;
    return kiln_batch_norm2d_init(&c, dev, g);
}

static kiln_module *relu(kiln_device *dev, kiln_generator *g)
{
    kiln_empty_config c = kiln_relu_config_default();
    return kiln_relu_init(&c, dev, g);
}

/* conv, batch norm, then a ReLU unless relu_after is false */
static int conv_bn(kiln_module *seq, int64_t in, int64_t out, int64_t k, int64_t stride, bool relu_after,
                   kiln_device *dev, kiln_generator *g)
{
    if (append(seq, conv(in, out, k, stride, dev, g)) < 0 || append(seq, bn(out, dev, g)) < 0)
        return -1;
    return relu_after ? append(seq, relu(dev, g)) : 0;
}

/* relu(body(x) + shortcut(x)): body 1x1 (width), 3x3 (width, stride), 1x1 (4 width); the
 * shortcut a strided 1x1 convolution and batch norm where the shape changes */
static int bottleneck(kiln_module *stage, int64_t in, int64_t width, int64_t stride, kiln_device *dev,
                      kiln_generator *g)
{
    int64_t out = 4 * width;
    kiln_module *body = kiln_sequential_new(), *shortcut = NULL;
    if (!body || conv_bn(body, in, width, 1, 1, true, dev, g) < 0 ||
        conv_bn(body, width, width, 3, stride, true, dev, g) < 0 ||
        conv_bn(body, width, out, 1, 1, false, dev, g) < 0)
        goto fail;
    if (stride != 1 || in != out) {
        shortcut = kiln_sequential_new();
        if (!shortcut || conv_bn(shortcut, in, out, 1, stride, false, dev, g) < 0)
            goto fail;
    }
    kiln_module *block = kiln_residual_new(body, shortcut);
    body = shortcut = NULL;
    if (append(stage, block) < 0)
        return -1;
    return append(stage, relu(dev, g));
fail:
    kiln_module_free(body);
    kiln_module_free(shortcut);
    return -1;
}

kiln_module *bench_resnet50(kiln_device *dev, kiln_generator *g, int64_t classes)
{
    static const int blocks[4] = {3, 4, 6, 3};
    kiln_module *net = kiln_sequential_new();
    if (!net || conv_bn(net, 3, 64, 7, 2, true, dev, g) < 0)
        goto fail;
    kiln_pool_config pc = kiln_max_pool2d_config_default();
    pc.kernel_size[0] = pc.kernel_size[1] = 3;
    pc.stride[0] = pc.stride[1] = 2;
    pc.padding[0] = pc.padding[1] = 1;
    if (append(net, kiln_max_pool2d_init(&pc, dev, g)) < 0)
        goto fail;
    int64_t in = 64;
    for (int s = 0; s < 4; s++) {
        int64_t width = 64 << s;
        for (int b = 0; b < blocks[s]; b++) {
            if (bottleneck(net, in, width, b == 0 && s > 0 ? 2 : 1, dev, g) < 0)
                goto fail;
            in = 4 * width;
        }
    }
    kiln_adaptive_pool_config ac = kiln_adaptive_avg_pool2d_config_default();
    ac.output_size[0] = ac.output_size[1] = 1;
    kiln_flatten_config fc = kiln_flatten_config_default();
    fc.start_dim = 1;
    kiln_linear_config lc = kiln_linear_config_default();
    lc.in_features = in;
    lc.out_features = classes;
    if (append(net, kiln_adaptive_avg_pool2d_init(&ac, dev, g)) < 0 ||
        append(net, kiln_flatten_init(&fc, dev, g)) < 0 || append(net, kiln_linear_init(&lc, dev, g)) < 0)
        goto fail;
    return net;
fail:
    kiln_module_free(net);
    return NULL;
}

int bench_resnet_calibrate(kiln_module *net, kiln_tensor *batch)
{
    kiln_module_train(net, true);
    kiln_no_grad_begin();
    kiln_scope_begin();
    kiln_tensor *y = kiln_module_forward(net, batch);
    int rc = y && kiln_device_sync(kiln_tensor_device(y)) >= 0 ? 0 : -1;
    kiln_scope_end();
    kiln_no_grad_end();
    kiln_module_train(net, false);
    return rc;
}
