// arange computed in double.
#version 450
#define ARANGE_DOUBLE 1
#define KVK_DOUBLE 1
#include "arange.glsl"
