// backends/vulkan/shaders/math-double.glsl — double-precision exp, log, sin, cos and the
// functions built on them, which GLSL provides in float only. Relative error about
// 1e-15 over the ranges kiln's ops meet (sin/cos reduce by pi/2 in three parts: exact
// enough below 1e9; beyond that kvk_reduce_huge in common.glsl takes over).
// Included by shaders compiled with KVK_DOUBLE.

const double KD_LN2_HI = 6.93147180369123816490e-01LF;
const double KD_LN2_LO = 1.90821492927058770002e-10LF;
const double KD_INV_LN2 = 1.44269504088896338700e+00LF;
#define KD_INF (double(uintBitsToFloat(0x7f800000u)))
#define KD_NAN (double(uintBitsToFloat(0x7fc00000u)))

double kd_exp(double x)
{
    if (isnan(x)) return x;
    if (x > 709.782712893384LF) return KD_INF;
    if (x < -745.2LF) return 0.0LF;
    double k = floor(x * KD_INV_LN2 + 0.5LF);
    double r = (x - k * KD_LN2_HI) - k * KD_LN2_LO;
    // Taylor series of e^r, |r| <= 0.35: 15 terms
    double term = 1.0LF, sum = 1.0LF;
    for (int n = 1; n <= 15; n++) {
        term *= r / double(n);
        sum += term;
    }
    int ki = int(k);
    // two steps so 2^k never overflows on its own near the limits
    int k1 = ki / 2;
    return ldexp(ldexp(sum, k1), ki - k1);
}

double kd_log(double x)
{
    if (isnan(x) || x < 0.0LF) return KD_NAN;
    if (x == 0.0LF) return -KD_INF;
    if (isinf(x)) return x;
    int e;
    double m = frexp(x, e); // m in [0.5, 1)
    if (m < 0.70710678118654752440LF) {
        m *= 2.0LF;
        e -= 1;
    }
    double f = (m - 1.0LF) / (m + 1.0LF), f2 = f * f;
    double term = f, sum = f;
    for (int n = 3; n <= 41; n += 2) {
        term *= f2;
        sum += term / double(n);
    }
    return double(e) * KD_LN2_HI + (double(e) * KD_LN2_LO + 2.0LF * sum);
}

// r (>= +0, or NaN) with the sign bit of x, as kvk_with_sign
double kd_with_sign(double r, double x)
{
    uvec2 b = unpackDouble2x32(r);
    b.y |= unpackDouble2x32(x).y & 0x80000000u;
    return packDouble2x32(b);
}

double kd_expm1(double x)
{
    if (x == 0.0LF) return x; // -0 stays -0 (the series' x + 0 gives +0)
    if (abs(x) < 0.35LF) {
        double term = x, sum = x;
        for (int n = 2; n <= 18; n++) {
            term *= x / double(n);
            sum += term;
        }
        return sum;
    }
    return kd_exp(x) - 1.0LF;
}

double kd_log1p(double x)
{
    if (x < -1.0LF) return KD_NAN;
    if (x == -1.0LF) return -KD_INF;
    double u = 1.0LF + x;
    if (u == 1.0LF) return x;
    if (isinf(u)) return u;
    return kd_log(u) - ((u - 1.0LF) - x) / u;
}

double kvk_reduce_huge(double x, out int quadrant)
{
    double a = abs(x);
    int e;
    double f = frexp(a, e);
    uint64_t m = uint64_t(f * 9007199254740992.0LF);
    uvec2 mw = unpackUint2x32(m);
    uvec2 frac = kvk_reduce_bits(mw.y, mw.x, e - 53, quadrant);
    double fr = double(packUint2x32(frac)) * 5.42101086242752217e-20LF; // 2^-64
    if (fr >= 0.5LF) {
        fr -= 1.0LF;
        quadrant += 1;
    }
    double r = fr * 1.57079632679489661923LF;
    if (x < 0.0LF) {
        r = -r;
        quadrant = -quadrant;
    }
    quadrant &= 3;
    return r;
}

// sin and cos of r in [-pi/4, pi/4]
double kd_sin_small(double r)
{
    double r2 = r * r, term = r, sum = r;
    for (int n = 1; n <= 11; n++) {
        term *= -r2 / double((2 * n) * (2 * n + 1));
        sum += term;
    }
    return sum;
}
double kd_cos_small(double r)
{
    double r2 = r * r, term = 1.0LF, sum = 1.0LF;
    for (int n = 1; n <= 11; n++) {
        term *= -r2 / double((2 * n - 1) * (2 * n));
        sum += term;
    }
    return sum;
}

// x = q * pi/2 + r: returns r, q mod 4 in quadrant.
double kd_reduce(double x, out int quadrant)
{
    const double PIO2_1 = 1.57079632673412561417e+00LF;
    const double PIO2_2 = 6.07710050650619224932e-11LF;
    const double PIO2_3 = 2.02226624879595063154e-21LF;
    double q = floor(x * 6.36619772367581382433e-01LF + 0.5LF);
    double r = ((x - q * PIO2_1) - q * PIO2_2) - q * PIO2_3;
    quadrant = int(mod(q, 4.0LF));
    return r;
}

double kd_sincos(double x, bool want_cos)
{
    if (isnan(x) || isinf(x)) return KD_NAN;
    int quadrant;
    double r = abs(x) < 1e9LF ? kd_reduce(x, quadrant) : kvk_reduce_huge(x, quadrant);
    if (want_cos) quadrant += 1;
    quadrant &= 3;
    double v = (quadrant & 1) == 0 ? kd_sin_small(r) : kd_cos_small(r);
    return quadrant >= 2 ? -v : v;
}
double kd_sin(double x) { return x == 0.0LF ? x : kd_sincos(x, false); } // -0 stays -0
double kd_cos(double x) { return kd_sincos(x, true); }

double kd_tanh(double x)
{
    if (isnan(x)) return x;
    double a = abs(x), r;
    if (a < 0.55LF) {
        double e = kd_expm1(2.0LF * a);
        r = e / (e + 2.0LF);
    } else if (a > 40.0LF) {
        r = 1.0LF;
    } else {
        r = 1.0LF - 2.0LF / (kd_exp(2.0LF * a) + 1.0LF);
    }
    return kd_with_sign(r, x);
}

double kd_sigmoid(double x) { return 1.0LF / (1.0LF + kd_exp(-x)); }

double kd_erf(double x)
{
    if (isnan(x)) return x;
    double a = abs(x), r;
    if (a < 2.5LF) {
        // Maclaurin series
        double x2 = a * a, term = a, sum = a;
        for (int n = 1; n < 80; n++) {
            term *= -x2 / double(n);
            double t = term / double(2 * n + 1);
            sum += t;
            if (abs(t) < 1e-17LF * abs(sum)) break;
        }
        r = sum * 1.12837916709551257390LF;
    } else if (a > 6.0LF) {
        r = 1.0LF;
    } else {
        // erfc by its continued fraction (modified Lentz)
        double tiny = 1e-300LF;
        double f = a, C = a, D = 0.0LF;
        for (int n = 1; n < 200; n++) {
            double an = double(n) * 0.5LF;
            D = a + an * D;
            C = a + an / C;
            if (D == 0.0LF) D = tiny;
            D = 1.0LF / D;
            double delta = C * D;
            f *= delta;
            if (abs(delta - 1.0LF) < 1e-16LF) break;
        }
        double erfc = kd_exp(-a * a) / f * 0.56418958354775628695LF;
        r = 1.0LF - erfc;
    }
    return kd_with_sign(r, x);
}

// pow with C's special cases; integral exponents up to 2^20 by repeated squaring.
double kd_pow(double x, double y)
{
    if (y == 0.0LF || x == 1.0LF) return 1.0LF;
    if (isnan(x) || isnan(y)) return x + y;
    bool yint = y == floor(y);
    bool yodd = yint && abs(y) < 9007199254740992.0LF && mod(y, 2.0LF) == 1.0LF;
    if (isinf(y)) {
        double ax = abs(x);
        if (ax == 1.0LF) return 1.0LF;
        return (ax > 1.0LF) == (y > 0.0LF) ? KD_INF : 0.0LF;
    }
    if (x == 0.0LF || isinf(x)) {
        bool neg = x < 0.0LF || (x == 0.0LF && (unpackDouble2x32(x).y & 0x80000000u) != 0u);
        double mag = (x == 0.0LF) == (y < 0.0LF) ? KD_INF : 0.0LF;
        return neg && yodd ? -mag : mag;
    }
    if (x < 0.0LF && !yint) return KD_NAN;
    if (yint && abs(y) <= 1048576.0LF) {
        int e = int(abs(y));
        double r = 1.0LF, b = x;
        while (e > 0) {
            if ((e & 1) != 0) r *= b;
            b *= b;
            e >>= 1;
        }
        return y < 0.0LF ? 1.0LF / r : r;
    }
    double r = kd_exp(y * kd_log(abs(x)));
    return x < 0.0LF && yodd ? -r : r;
}
