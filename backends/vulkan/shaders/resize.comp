#version 450
/* resize.comp — interpolation; the kernel is resize.glsl. */
#include "nn-common.glsl"
#include "resize.glsl"
