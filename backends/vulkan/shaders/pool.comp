#version 450
/* pool.comp — max and average pooling, sums in the element's compute type; the kernel is pool.glsl. */
#include "nn-common.glsl"
#include "pool.glsl"
