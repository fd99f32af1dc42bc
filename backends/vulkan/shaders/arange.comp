// arange computed in float (devices without shaderFloat64).
#version 450
#define ARANGE_DOUBLE 0
#include "arange.glsl"
