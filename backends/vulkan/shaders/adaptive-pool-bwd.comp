#version 450
/* adaptive-pool-bwd.comp — the input gradient of adaptive average pooling; the kernel is adaptive-pool.glsl. */
#define BACKWARD
#include "nn-common.glsl"
#include "adaptive-pool.glsl"
