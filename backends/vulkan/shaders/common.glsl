// backends/vulkan/shaders/common.glsl — what every kiln compute shader shares.
//
// dtypes. KVK_DOUBLE is 1 when one of the variant's dtypes is f64 (double helpers).
// A shader is compiled once per variant; variant "f32_i64" defines KVK_DT0=f32 and
// KVK_DT1=i64. For slot k (0..3): Sk is the storage type (what the buffer holds), Ck the
// compute type (float for f16/bf16/f32, double for f64, int64_t for i64, int for i32,
// uint for u8 and bool), LDk(x) turns a stored value into Ck, STk(x) a Ck into storage
// (bf16 rounds to nearest even, bool stores x != 0), KVK_ISFk is 1 for float dtypes.
// Nothing here uses double or int64 outside a dtype's own macros, so a module only needs
// the capabilities of the dtypes it was compiled for (int64 is the one exception: index
// math is int64 everywhere, and the backend refuses a device without shaderInt64).
//
// Layout. Binding 0 is the params block (std430, mirrored in C), bindings 1.. the
// operands. The workgroup size is specialization constants 0..2.
#extension GL_EXT_shader_explicit_arithmetic_types : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;

#define KVK_MAX_DIMS 8

// A strided view (kvk_view in vk-impl.h).
struct KView {
    int offset;
    int ndim;
    int numel;
    int contig;
    int shape[KVK_MAX_DIMS];
    int strides[KVK_MAX_DIMS];
};

// A scalar in every form (kvk_scalar in vk-impl.h).
struct KScalar {
    float f;
    int i;
    uint dlo, dhi;
    uint llo, lhi;
};

#define KVK_PARAMS layout(std430, set = 0, binding = 0) readonly buffer KParams
#define KVK_BUF_RO(b, T, name) layout(std430, set = 0, binding = b) readonly buffer KBuf##b { T name[]; }
#define KVK_BUF_WO(b, T, name) layout(std430, set = 0, binding = b) writeonly buffer KBuf##b { T name[]; }
#define KVK_BUF_RW(b, T, name) layout(std430, set = 0, binding = b) buffer KBuf##b { T name[]; }
#define KVK_SPEC(id, name, def) layout(constant_id = id) const uint name = def

// Element offset of flat (row-major) index i in view v. Index math is int32: the host
// refuses views whose offsets or sizes do not fit (kvk_view_of).
int kvk_at(KView v, int i)
{
    if (v.contig != 0)
        return v.offset + i;
    int off = v.offset;
    for (int d = v.ndim - 1; d >= 0; d--) {
        int s = v.shape[d];
        int q = i / s;
        off += (i - q * s) * v.strides[d];
        i = q;
    }
    return off;
}

// Grid-stride loop over n items of a 1-D launch.
#define KVK_FOR_EACH(i, n) \
    for (int i = int(gl_GlobalInvocationID.x); i < (n); i += int(gl_NumWorkGroups.x * gl_WorkGroupSize.x))

// float -> int64 as a C cast made total: truncation, NaN 0, saturation.
#if KVK_DOUBLE
int64_t kvk_f2l(double x)
{
    if (isnan(x)) return 0l;
    if (x >= 9223372036854775808.0lf) return 0x7fffffffffffffffl;
    if (x < -9223372036854775808.0lf) return -0x7fffffffffffffffl - 1l;
    return int64_t(x);
}
#endif
int64_t kvk_f2l(float x)
{
    if (isnan(x)) return 0l;
    if (x >= 9223372036854775808.0) return 0x7fffffffffffffffl;
    if (x < -9223372036854775808.0) return -0x7fffffffffffffffl - 1l;
    return int64_t(x);
}

uint16_t kvk_f2bf(float f)
{
    uint u = floatBitsToUint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return uint16_t((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}
float kvk_bf2f(uint16_t h) { return uintBitsToFloat(uint(h) << 16); }

// ---- per-dtype macros (storage S, compute C, load LD, store ST, float flag ISF, and
// conversions FROMF from a float or double and FROML from any integer compute type)
#define KVK_S_f32 float
#define KVK_C_f32 float
#define KVK_LD_f32(x) (x)
#define KVK_ST_f32(x) (x)
#define KVK_ISF_f32 1
#define KVK_FROMF_f32(x) float(x)
#define KVK_FROML_f32(x) float(x)

#define KVK_S_f16 float16_t
#define KVK_C_f16 float
#define KVK_LD_f16(x) float(x)
#define KVK_ST_f16(x) float16_t(x)
#define KVK_ISF_f16 1
#define KVK_FROMF_f16(x) float(x)
#define KVK_FROML_f16(x) float(x)

#define KVK_S_bf16 uint16_t
#define KVK_C_bf16 float
#define KVK_LD_bf16(x) kvk_bf2f(x)
#define KVK_ST_bf16(x) kvk_f2bf(x)
#define KVK_ISF_bf16 1
#define KVK_FROMF_bf16(x) float(x)
#define KVK_FROML_bf16(x) float(x)

#define KVK_S_f64 double
#define KVK_C_f64 double
#define KVK_LD_f64(x) (x)
#define KVK_ST_f64(x) (x)
#define KVK_ISF_f64 1
#define KVK_FROMF_f64(x) double(x)
#define KVK_FROML_f64(x) double(x)

#define KVK_S_i64 int64_t
#define KVK_C_i64 int64_t
#define KVK_LD_i64(x) (x)
#define KVK_ST_i64(x) (x)
#define KVK_ISF_i64 0
#define KVK_FROMF_i64(x) kvk_f2l(x)
#define KVK_FROML_i64(x) int64_t(x)

#define KVK_S_i32 int
#define KVK_C_i32 int
#define KVK_LD_i32(x) (x)
#define KVK_ST_i32(x) (x)
#define KVK_ISF_i32 0
#define KVK_FROMF_i32(x) int(kvk_f2l(x))
#define KVK_FROML_i32(x) int(x)

#define KVK_S_u8 uint8_t
#define KVK_C_u8 uint
#define KVK_LD_u8(x) uint(x)
#define KVK_ST_u8(x) uint8_t(x)
#define KVK_ISF_u8 0
#define KVK_FROMF_u8(x) uint(kvk_f2l(x))
#define KVK_FROML_u8(x) uint(x)

#define KVK_S_bool uint8_t
#define KVK_C_bool uint
#define KVK_LD_bool(x) uint(x != uint8_t(0))
#define KVK_ST_bool(x) uint8_t((x) != 0 ? 1 : 0)
#define KVK_ISF_bool 0
#define KVK_FROMF_bool(x) uint((x) != 0.0 ? 1 : 0)
#define KVK_FROML_bool(x) uint((x) != 0 ? 1 : 0)

// KVK_Fk (0 or 1: slot k is a float dtype) comes from the build with the dtypes, since
// the preprocessor's #if cannot look inside a pasted name.
#ifndef KVK_F0
#define KVK_F0 0
#endif
#ifndef KVK_F1
#define KVK_F1 0
#endif
#ifndef KVK_F2
#define KVK_F2 0
#endif
#ifndef KVK_F3
#define KVK_F3 0
#endif

// int64 of an integer compute value (i32 sign-extends by hand: one driver zero-extended
// int64_t(int) in testing)
#define KVK_TOL_i64(x) (x)
#define KVK_TOL_i32(x) packInt2x32(ivec2((x), (x) >> 31))
#define KVK_TOL_u8(x) int64_t(x)
#define KVK_TOL_bool(x) int64_t(x)

#define KVK_CAT_(a, b) a##b
#define KVK_CAT(a, b) KVK_CAT_(a, b)

#ifdef KVK_DT0
#define S0 KVK_CAT(KVK_S_, KVK_DT0)
#define C0 KVK_CAT(KVK_C_, KVK_DT0)
#define LD0(x) KVK_CAT(KVK_LD_, KVK_DT0)(x)
#define ST0(x) KVK_CAT(KVK_ST_, KVK_DT0)(x)
#define FROMF0(x) KVK_CAT(KVK_FROMF_, KVK_DT0)(x)
#define FROML0(x) KVK_CAT(KVK_FROML_, KVK_DT0)(x)
#define TOL0(x) KVK_CAT(KVK_TOL_, KVK_DT0)(x)
#endif
#ifdef KVK_DT1
#define S1 KVK_CAT(KVK_S_, KVK_DT1)
#define C1 KVK_CAT(KVK_C_, KVK_DT1)
#define LD1(x) KVK_CAT(KVK_LD_, KVK_DT1)(x)
#define ST1(x) KVK_CAT(KVK_ST_, KVK_DT1)(x)
#define FROMF1(x) KVK_CAT(KVK_FROMF_, KVK_DT1)(x)
#define FROML1(x) KVK_CAT(KVK_FROML_, KVK_DT1)(x)
#define TOL1(x) KVK_CAT(KVK_TOL_, KVK_DT1)(x)
#endif
#ifdef KVK_DT2
#define S2 KVK_CAT(KVK_S_, KVK_DT2)
#define C2 KVK_CAT(KVK_C_, KVK_DT2)
#define LD2(x) KVK_CAT(KVK_LD_, KVK_DT2)(x)
#define ST2(x) KVK_CAT(KVK_ST_, KVK_DT2)(x)
#define FROMF2(x) KVK_CAT(KVK_FROMF_, KVK_DT2)(x)
#define FROML2(x) KVK_CAT(KVK_FROML_, KVK_DT2)(x)
#define TOL2(x) KVK_CAT(KVK_TOL_, KVK_DT2)(x)
#endif
#ifdef KVK_DT3
#define S3 KVK_CAT(KVK_S_, KVK_DT3)
#define C3 KVK_CAT(KVK_C_, KVK_DT3)
#define LD3(x) KVK_CAT(KVK_LD_, KVK_DT3)(x)
#define ST3(x) KVK_CAT(KVK_ST_, KVK_DT3)(x)
#define FROMF3(x) KVK_CAT(KVK_FROMF_, KVK_DT3)(x)
#define FROML3(x) KVK_CAT(KVK_FROML_, KVK_DT3)(x)
#define TOL3(x) KVK_CAT(KVK_TOL_, KVK_DT3)(x)
#endif

// A scalar in slot 0's compute type.
#if defined(KVK_DT0)
#define KVK_SCALAR_f32(s) (s).f
#define KVK_SCALAR_f16(s) (s).f
#define KVK_SCALAR_bf16(s) (s).f
#define KVK_SCALAR_f64(s) packDouble2x32(uvec2((s).dlo, (s).dhi))
#define KVK_SCALAR_i64(s) int64_t(packUint2x32(uvec2((s).llo, (s).lhi)))
#define KVK_SCALAR_i32(s) int((s).llo)
#define KVK_SCALAR_u8(s) ((s).llo & 0xffu)
#define KVK_SCALAR_bool(s) uint((s).dlo != 0u || ((s).dhi & 0x7fffffffu) != 0u)
#define KVK_SCALAR_C0(s) KVK_CAT(KVK_SCALAR_, KVK_DT0)(s)
#endif

// ---- float math the GLSL library lacks or does loosely (float precision)
// r (>= +0, or NaN) with the sign bit of x: odd functions computed on |x| keep -0's sign,
// which a test x < 0 loses.
float kvk_with_sign(float r, float x)
{
    return uintBitsToFloat(floatBitsToUint(r) | (floatBitsToUint(x) & 0x80000000u));
}
// Below |x| = 0.5 expm1 and log1p come from series, not from the usual corrections
// (u - 1) x / log(u) with u = exp(x) or 1 + x: those need an exact log of the rounded u,
// which a driver's log need not be (lavapipe's log(1 - 1e-6) is 1% off), and compilers
// fold log(exp(x)) to x, undoing the correction (expm1(-1e-6) came out 7% off, and tanh,
// elu and gelu's tanh form with it). x times the series keeps -0 as -0.
// expm1: x (1 + x/2 + ... + x^7/8!), truncation below 1.1e-8 relative.
float kvk_expm1(float x)
{
    if (abs(x) < 0.5) {
        float p = 2.4801587301587302e-05; // 1/8!
        p = p * x + 1.9841269841269841e-04;
        p = p * x + 1.3888888888888889e-03;
        p = p * x + 8.3333333333333333e-03;
        p = p * x + 4.1666666666666667e-02;
        p = p * x + 1.6666666666666667e-01;
        p = p * x + 0.5;
        p = p * x + 1.0;
        return x * p;
    }
    return exp(x) - 1.0;
}
#define KVK_NAN uintBitsToFloat(0x7fc00000u)
float kvk_log(float x)
{
    if (x < 0.0) return KVK_NAN;
    if (x == 0.0) return uintBitsToFloat(0xff800000u);
    return log(x);
}
float kvk_sqrt(float x) { return x < 0.0 ? KVK_NAN : sqrt(x); }
float kvk_log1p(float x)
{
    if (x < -1.0) return KVK_NAN;
    if (x == -1.0) return uintBitsToFloat(0xff800000u);
    if (abs(x) < 0.5) {
        // 2 atanh(s), s = x / (2 + x) in (-1/3, 1/5): 2 s (1 + s^2/3 + ... + s^14/15),
        // truncation below 2e-9 relative
        float s = x / (2.0 + x), z = s * s;
        float p = 1.0 / 15.0;
        p = p * z + 1.0 / 13.0;
        p = p * z + 1.0 / 11.0;
        p = p * z + 1.0 / 9.0;
        p = p * z + 1.0 / 7.0;
        p = p * z + 1.0 / 5.0;
        p = p * z + 1.0 / 3.0;
        p = p * z + 1.0;
        return 2.0 * s * p;
    }
    float u = 1.0 + x; // exact below 0 (Sterbenz); above, log's error dominates anyway
    if (isinf(u)) return u;
    return log(u);
}
float kvk_tanh(float x)
{
    if (isnan(x)) return x;
    float a = abs(x);
    float r;
    if (a < 0.55) {
        float e = kvk_expm1(2.0 * a);
        r = e / (e + 2.0);
    } else if (a > 20.0) {
        r = 1.0;
    } else {
        r = 1.0 - 2.0 / (exp(2.0 * a) + 1.0);
    }
    return kvk_with_sign(r, x);
}
float kvk_erf(float x)
{
    if (isnan(x)) return x;
    float a = abs(x);
    float r;
    if (a < 0.5) {
        // Maclaurin series: 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1))
        float x2 = a * a, term = a, sum = a;
        for (int n = 1; n < 10; n++) {
            term *= -x2 / float(n);
            sum += term / float(2 * n + 1);
        }
        r = sum * 1.1283791670955126;
    } else if (a > 6.0) {
        r = 1.0;
    } else {
        // erfc by the Chebyshev fit of Numerical Recipes (fractional error < 1.2e-7)
        float t = 1.0 / (1.0 + 0.5 * a);
        float y = t * exp(-a * a - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
                  t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 +
                  t * (-0.82215223 + t * 0.17087277)))))))));
        r = 1.0 - y;
    }
    return kvk_with_sign(r, x);
}
float kvk_sigmoid(float x) { return 1.0 / (1.0 + exp(-x)); }

// Philox4x32-10 (common/philox.h), with 32-bit multiplies only.
uvec4 kvk_philox(uvec2 counter, uvec2 key)
{
    uint c0 = counter.x, c1 = counter.y, c2 = 0u, c3 = 0u, k0 = key.x, k1 = key.y;
    for (int r = 0; r < 10; r++) {
        uint hi0, lo0, hi1, lo1;
        umulExtended(0xD2511F53u, c0, hi0, lo0);
        umulExtended(0xCD9E8D57u, c2, hi1, lo1);
        uint n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return uvec4(c0, c1, c2, c3);
}

// ---- coordinates, for the indexing kernels (views kept unmerged: kvk_view_exact)
void kvk_coords(KView v, int i, out int c[KVK_MAX_DIMS])
{
    for (int d = KVK_MAX_DIMS - 1; d >= 0; d--) {
        c[d] = 0;
        if (d < v.ndim) {
            int q = i / v.shape[d];
            c[d] = i - q * v.shape[d];
            i = q;
        }
    }
}
int kvk_off(KView v, int c[KVK_MAX_DIMS])
{
    int off = v.offset;
    for (int d = 0; d < v.ndim; d++)
        off += c[d] * v.strides[d];
    return off;
}

// ---- argument reduction for sin/cos of huge arguments (Payne-Hanek): x * 2/pi with
// the bits of 2/pi that matter, 128 at a time, against x's integer mantissa.
const uint KVK_TWO_OVER_PI[40] = uint[](
    0xa2f9836eu, 0x4e441529u, 0xfc2757d1u, 0xf534ddc0u, 0xdb629599u, 0x3c439041u,
    0xfe5163abu, 0xdebbc561u, 0xb7246e3au, 0x424dd2e0u, 0x06492eeau, 0x09d1921cu,
    0xfe1deb1cu, 0xb129a73eu, 0xe88235f5u, 0x2ebb4484u, 0xe99c7026u, 0xb45f7e41u,
    0x3991d639u, 0x835339f4u, 0x9c845f8bu, 0xbdf9283bu, 0x1ff897ffu, 0xde05980fu,
    0xef2f118bu, 0x5a0a6d1fu, 0x6d367ecfu, 0x27cb09b7u, 0x4f463f66u, 0x9e5fea2du,
    0x7527bac7u, 0xebe5f17bu, 0x3d0739f7u, 0x8a5292eau, 0x6bfb5fb1u, 0x1f8d5d08u,
    0x56033046u, 0xfc7b6babu, 0xf0cfbc20u, 0x9af4361du);

// bit i (1-based) of 2/pi onward, 32 of them
uint kvk_tp_word(int i)
{
    int a = (i - 1) / 32, sh = (i - 1) % 32;
    uint hi = a < 40 ? KVK_TWO_OVER_PI[a] : 0u;
    uint lo = a + 1 < 40 ? KVK_TWO_OVER_PI[a + 1] : 0u;
    return sh == 0 ? hi : (hi << sh) | (lo >> (32 - sh));
}

// 64 bits of the 192-bit little-endian word array p (6 words) from bit `low` up
uvec2 kvk_bits64(uint p[6], int low)
{
    uvec2 r = uvec2(0u);
    for (int b = 0; b < 2; b++) {
        int pos = low + 32 * b, w = pos / 32, sh = pos % 32;
        uint lo = w < 6 ? p[w] : 0u, hi = w + 1 < 6 ? p[w + 1] : 0u;
        uint v = sh == 0 ? lo : (lo >> sh) | (hi << (32 - sh));
        if (b == 0) r.x = v; else r.y = v;
    }
    return r;
}

// x = m * 2^E (m = mhi:mlo, below 2^53): the quadrant of x / (pi/2) (mod 4) and its
// fraction's top 64 bits (hi word in .y)
uvec2 kvk_reduce_bits(uint mhi, uint mlo, int E, out int quadrant)
{
    int i0 = max(1, E - 1);
    uint w[4];
    for (int k = 0; k < 4; k++) w[k] = kvk_tp_word(i0 + 32 * k); // w[0] most significant
    // product m * W, W = w0:w1:w2:w3 (big-endian words) -> p little-endian words
    uint p[6] = uint[](0u, 0u, 0u, 0u, 0u, 0u);
    uint m[2] = uint[](mlo, mhi);
    for (int a = 0; a < 2; a++) {
        uint carry = 0u;
        for (int k = 0; k < 4; k++) {
            uint hi, lo;
            umulExtended(m[a], w[3 - k], hi, lo);
            uint s1 = p[a + k] + lo;
            uint c1 = s1 < lo ? 1u : 0u;
            uint s2 = s1 + carry;
            uint c2 = s2 < s1 ? 1u : 0u;
            p[a + k] = s2;
            carry = hi + c1 + c2;
        }
        p[a + 4] += carry;
    }
    int s = i0 + 127 - E; // the product's binary point
    quadrant = int(kvk_bits64(p, s).x & 3u);
    return kvk_bits64(p, s - 64);
}

float kvk_reduce_huge_f(float x, out int quadrant)
{
    float a = abs(x);
    int e;
    float f = frexp(a, e); // a = f * 2^e, f in [0.5, 1)
    uint m = uint(f * 16777216.0);
    uvec2 frac = kvk_reduce_bits(0u, m, e - 24, quadrant);
    float fr = float(frac.y) * 2.3283064365386963e-10;
    if (fr >= 0.5) {
        fr -= 1.0;
        quadrant += 1;
    }
    float r = fr * 1.5707963267948966;
    if (x < 0.0) {
        r = -r;
        quadrant = -quadrant;
    }
    quadrant &= 3;
    return r;
}

// sin and cos on [-pi/4, pi/4] as polynomials (Cephes' sinf/cosf coefficients): a GPU's
// built-in sin and cos may be approximations good to about 1e-6 absolute only (NVIDIA's are)
float kvk_sin_poly(float r)
{
    float z = r * r;
    return r + r * z * ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1);
}
float kvk_cos_poly(float r)
{
    float z = r * r;
    return 1.0 - 0.5 * z + z * z * ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2);
}
// sin(r + q * pi/2)
float kvk_sin_quadrant(float r, int q)
{
    q &= 3;
    float v = (q & 1) == 0 ? kvk_sin_poly(r) : kvk_cos_poly(r);
    return q >= 2 ? -v : v;
}
// x = r + q * pi/2 with |r| <= pi/4: Cody-Waite below 8192 (pi/2 in three parts whose first
// two multiply any such q exactly), Payne-Hanek above
float kvk_reduce_f(float x, out int quadrant)
{
    if (abs(x) >= 8192.0) return kvk_reduce_huge_f(x, quadrant);
    float k = round(x * 0.636619772367581343);
    quadrant = int(k);
    return ((x - k * 1.5703125) - k * 4.837512969970703125e-4) - k * 7.54978995489188216e-8;
}
float kvk_sin_f(float x)
{
    if (x == 0.0) return x; // -0 stays -0 (the polynomial's r + r z p gives +0)
    if (isinf(x) || isnan(x)) return sin(x);
    int q;
    float r = kvk_reduce_f(x, q);
    return kvk_sin_quadrant(r, q);
}
float kvk_cos_f(float x)
{
    if (isinf(x) || isnan(x)) return cos(x);
    int q;
    float r = kvk_reduce_f(x, q);
    return kvk_sin_quadrant(r, q + 1);
}

// C's fmod, exact: subtract b scaled to r's binade until r < |b| (Sterbenz makes each
// subtraction exact)
#define KVK_FMOD(T, NAME) \
T NAME(T a, T b) \
{ \
    if (isnan(a) || isnan(b) || isinf(a) || b == T(0)) return T(KVK_NAN); \
    if (isinf(b)) return a; \
    T r = abs(a), ab = abs(b); \
    int eb; \
    frexp(ab, eb); \
    while (r >= ab) { \
        int er; \
        frexp(r, er); \
        T t = ldexp(ab, er - eb); \
        if (t > r) t = ldexp(ab, er - eb - 1); \
        r -= t; \
    } \
    return a < T(0) ? -r : r; \
}
KVK_FMOD(float, kvk_fmod)

#if KVK_DOUBLE
#include "math-double.glsl"
KVK_FMOD(double, kd_fmod)
#endif
