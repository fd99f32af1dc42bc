#version 450
/*
 * nn-pack.comp — moves one operand of the nn kernels between a strided view and a plain
 * (contiguous, from element 0) scratch buffer, element for element in its own dtype:
 * unpack 0 reads the view into the scratch (an input made plain), unpack 1 writes the
 * scratch into the view (a result stored into a strided output).
 */
#include "nn-common.glsl"

layout(local_size_x = 64) in;

KVK_PARAMS {
    KView v;
    int unpack, n;
} P;
layout(std430, binding = 1) buffer Dst { ELEM dst[]; };
layout(std430, binding = 2) readonly buffer Src { ELEM src[]; };

void main()
{
    int i = nn_item(0);
    if (i >= P.n)
        return;
    if (P.unpack == 0)
        dst[i] = src[kvk_at(P.v, i)];
    else
        dst[kvk_at(P.v, i)] = src[i];
}
