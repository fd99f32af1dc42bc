// reduce in the dtype's own precision (float for f16/bf16/f32).
#version 450
#include "reduce.glsl"
