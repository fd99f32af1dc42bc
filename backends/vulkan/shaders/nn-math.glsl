/*
 * nn-math.glsl — exp and log in double, which GLSL does not provide (its exp and log
 * take float only), for the f64 variants of softmax. Both reduce the argument to a small
 * range and sum a series to well under one double ulp there:
 *   exp(x) = 2^k · exp(r), r = x − k·ln2 with ln2 split in two so r is exact, |r| ≤ ln2/2,
 *            Taylor series to r^13 (error < 2e-17 relative);
 *   log(x) = e·ln2 + 2·atanh(t), x = m·2^e with m in [√½, √2), t = (m − 1)/(m + 1),
 *            |t| ≤ 0.172, odd series to t^25.
 * Special values follow C: exp(−inf) = 0, exp(+inf) = inf, exp(NaN) = NaN, log(0) = −inf,
 * log(inf) = inf, log of a negative or NaN is NaN. The float overloads are GLSL's own.
 */
float nn_exp(float x) { return exp(x); }
float nn_log(float x) { return log(x); }

double nn_exp(double x)
{
    if (isnan(x))
        return x;
    if (x > 709.8)
        return 1.0LF / 0.0LF;
    if (x < -745.2)
        return 0.0LF;
    const double ln2_hi = 6.93147180369123816490e-01LF, ln2_lo = 1.90821492927058770002e-10LF;
    double k = floor(x * 1.44269504088896338700LF + 0.5LF);
    double r = (x - k * ln2_hi) - k * ln2_lo;
    double term = 1.0LF, sum = 1.0LF;
    for (int i = 1; i <= 13; i++) {
        term *= r / double(i);
        sum += term;
    }
    int ki = int(k);
    /* split the scaling so 2^k never overflows on its own near the range ends */
    return ldexp(ldexp(sum, ki / 2), ki - ki / 2);
}

double nn_log(double x)
{
    if (isnan(x) || x < 0.0LF)
        return 0.0LF / 0.0LF;
    if (x == 0.0LF)
        return -1.0LF / 0.0LF;
    if (isinf(x))
        return x;
    int e;
    double m = frexp(x, e); /* x = m · 2^e, m in [0.5, 1) */
    if (m < 0.70710678118654752440LF) {
        m *= 2.0LF;
        e -= 1;
    }
    double t = (m - 1.0LF) / (m + 1.0LF), t2 = t * t, term = t, sum = 0.0LF;
    for (int i = 1; i <= 25; i += 2) {
        sum += term / double(i);
        term *= t2;
    }
    return double(e) * 6.93147180559945309417e-01LF + 2.0LF * sum;
}
