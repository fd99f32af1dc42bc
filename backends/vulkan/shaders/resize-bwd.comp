#version 450
/* resize-bwd.comp — the input gradient of interpolation; the kernel is resize.glsl. */
#define BACKWARD
#include "nn-common.glsl"
#include "resize.glsl"
