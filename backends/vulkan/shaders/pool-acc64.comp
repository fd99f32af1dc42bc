#version 450
/* pool-acc64.comp — pool.glsl with average windows summed in double, as the reference does. */
#include "nn-common.glsl"
#define SUM double
#include "pool.glsl"
