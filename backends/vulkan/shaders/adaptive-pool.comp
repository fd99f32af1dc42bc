#version 450
/* adaptive-pool.comp — adaptive average pooling; the kernel is adaptive-pool.glsl. */
#include "nn-common.glsl"
#include "adaptive-pool.glsl"
