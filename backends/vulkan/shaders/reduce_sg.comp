// reduce with subgroup sums in the dtype's own precision.
#version 450
#define KVK_SUBGROUP 1
#include "reduce.glsl"
