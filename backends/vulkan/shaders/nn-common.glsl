/*
 * nn-common.glsl — what the neural-network shaders (matmul, convolution, pooling,
 * resizing, normalization, optimizer) share on top of common.glsl: short names for slot
 * 0's dtype, which is the one dtype of every variant they are built as.
 *
 *   ELEM         what a buffer holds (bf16 is stored as its 16 raw bits)
 *   ACC          what arithmetic runs in: float for f32 and the 16-bit types (so a sum
 *                over many terms rounds once, at the store), double for f64, the integer
 *                itself for i32 and i64 (wrapping, as the reference)
 *   LD(v), ST(v) ELEM to ACC and back (common.glsl's LD0 / ST0)
 *   STAT         the dtype of layer norm's mean and rstd outputs: double for f64, else float
 * glslang does not expand a pasted macro inside #if, so what differs between float and
 * double is written as overloads on ACC (nn_scalar here, nn_exp / nn_log in nn-math.glsl).
 *
 * Offsets and sizes are int32 (kvk_view_of refuses what does not fit); each kernel's
 * params block is mirrored by a struct in its C wrapper, int32 and float members only.
 */
#include "common.glsl"

#define ELEM S0
#define ACC C0
#define LD(v) LD0(v)
#define ST(v) ST0(v)
#define ACC_ZERO ACC(0)

/* layer norm's statistics: float for f32 and the 16-bit types, double for f64 */
#define STAT C0

/* A double parameter in ACC: the float copy, or the double rebuilt from its bits. The
 * first argument picks the overload (pass ACC_ZERO); an overload a variant never calls
 * is not emitted, so an f32 module does not need Float64. */
float nn_scalar(float pick, float f, uint lo, uint hi) { return f; }
double nn_scalar(double pick, float f, uint lo, uint hi) { return packDouble2x32(uvec2(lo, hi)); }

/* Item index of a 1-D launch whose workgroups past KVK_GROUPS_MAX continue in y; the
 * host adds `base` when it splits a launch larger than one grid. */
int nn_item(int base)
{
    return base + int(gl_GlobalInvocationID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x);
}
/* Workgroup index of a launch with one workgroup per item, the same way. */
int nn_group(int base)
{
    return base + int(gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x);
}
