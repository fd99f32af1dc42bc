/*
 * common/half.h — f16 and bf16 conversions shared by every host-side backend and reader,
 * so that all of them round the same way (to nearest, ties to even, NaN kept quiet).
 */
#ifndef KILN_HALF_H
#define KILN_HALF_H

#include <stdint.h>
#include <string.h>

static inline float kiln_bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t kiln_f32_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float kiln_bf16_to_f32(uint16_t h)
{
    return kiln_bits_to_f32((uint32_t)h << 16);
}

static inline uint16_t kiln_f32_to_bf16(float f)
{
    uint32_t u = kiln_f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN */
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float kiln_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0)
            return kiln_bits_to_f32(sign);
        /* subnormal: value = man * 2^-24 */
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (exp == 31)
        return kiln_bits_to_f32(sign | 0x7f800000u | (man << 13));
    return kiln_bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t kiln_f32_to_f16(float f)
{
    uint32_t u = kiln_f32_to_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) /* rounds to >= 65520: infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {                           /* below the smallest normal 2^-14: subnormal or zero */
        float v = kiln_bits_to_f32(a) * 16777216.0f; /* scale by 2^24: units of 2^-24 */
        /* round half to even on the integer count of 2^-24 units */
        uint32_t q = (uint32_t)v;
        float rem = v - (float)q;
        if (rem > 0.5f || (rem == 0.5f && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t exp = (a >> 23) - 112u;
    uint32_t man = a & 0x7fffffu;
    uint32_t h = (exp << 10) | (man >> 13);
    uint32_t rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++; /* may carry into the exponent, which is the correct result */
    return (uint16_t)(sign | h);
}

#endif /* KILN_HALF_H */
