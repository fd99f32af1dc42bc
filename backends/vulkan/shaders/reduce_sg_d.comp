// reduce with subgroup sums, accumulating in double (devices with both).
#version 450
#define KVK_DOUBLE 1
#define KVK_SUBGROUP 1
#include "reduce.glsl"
