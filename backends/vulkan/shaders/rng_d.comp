// rng with double arithmetic.
#version 450
#define RNG_DOUBLE 1
#define KVK_DOUBLE 1
#include "rng.glsl"
