// reduce accumulating in double (devices with shaderFloat64), as the host does.
#version 450
#define KVK_DOUBLE 1
#include "reduce.glsl"
