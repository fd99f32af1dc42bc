/*
 * common/philox.h — the Philox4x32-10 counter-based generator (Salmon et al.,
 * "Parallel random numbers: as easy as 1, 2, 3", SC'11) and the transforms kiln uses to
 * turn its output into uniform, normal, Bernoulli and integer draws.
 *
 * Element i of a draw uses counter (offset + i) under key seed, so the value of an
 * element depends only on (seed, offset, i): identical on every backend, thread count
 * and chunking. Device backends include this header in their kernels.
 */
#ifndef KILN_PHILOX_H
#define KILN_PHILOX_H

#include <math.h>
#include <stdint.h>

#ifndef KILN_HOST_DEVICE
#define KILN_HOST_DEVICE
#endif

typedef struct kiln_philox_out {
    uint32_t v[4];
} kiln_philox_out;

static inline KILN_HOST_DEVICE kiln_philox_out kiln_philox4x32(uint64_t counter, uint64_t seed)
{
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    kiln_philox_out r = {{c0, c1, c2, c3}};
    return r;
}

/** Uniform double in [0, 1) with 53 random bits. */
static inline KILN_HOST_DEVICE double kiln_philox_u01(uint32_t hi, uint32_t lo)
{
    uint64_t bits = ((uint64_t)hi << 21) ^ (uint64_t)(lo >> 11);
    return (double)(bits & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

/** Uniform in [0, 1) for element at counter. */
static inline KILN_HOST_DEVICE double kiln_rng_uniform01(uint64_t counter, uint64_t seed)
{
    kiln_philox_out r = kiln_philox4x32(counter, seed);
    return kiln_philox_u01(r.v[0], r.v[1]);
}

/** Standard normal for element at counter (Box-Muller on one Philox block). */
static inline KILN_HOST_DEVICE double kiln_rng_normal01(uint64_t counter, uint64_t seed)
{
    kiln_philox_out r = kiln_philox4x32(counter, seed);
    double u1 = kiln_philox_u01(r.v[0], r.v[1]);
    double u2 = kiln_philox_u01(r.v[2], r.v[3]);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

/** Integer uniform in [low, high) for element at counter (high > low). */
static inline KILN_HOST_DEVICE int64_t kiln_rng_int(uint64_t counter, uint64_t seed, int64_t low, int64_t high)
{
    kiln_philox_out r = kiln_philox4x32(counter, seed);
    uint64_t range = (uint64_t)(high - low);
    uint64_t x = ((uint64_t)r.v[0] << 32) | r.v[1];
    return low + (int64_t)(x % range); /* bias < range / 2^64: negligible for tensor sizes */
}

#endif /* KILN_PHILOX_H */
