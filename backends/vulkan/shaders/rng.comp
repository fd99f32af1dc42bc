// rng with float arithmetic (devices without shaderFloat64).
#version 450
#define RNG_DOUBLE 0
#include "rng.glsl"
