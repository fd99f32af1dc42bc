/*
 * nn-epilogue.glsl — the activations of kiln_epilogue_act (backends/backend.h), applied
 * to a value that already holds its bias and residual. Each matches the engine's own op:
 * relu keeps NaN (NaN < 0 is false), clamp keeps NaN, hard_sigmoid and hard_swish round
 * after the multiply and after the add (precise forbids fusing them into one fma).
 */
#define EPI_NONE 0
#define EPI_RELU 1
#define EPI_LEAKY_RELU 2
#define EPI_CLAMP 3
#define EPI_HARD_SIGMOID 4
#define EPI_HARD_SWISH 5
#define EPI_SIGMOID 6

float epi_clamp01(float t)
{
    return isnan(t) ? t : (t < 0.0 ? 0.0 : (t > 1.0 ? 1.0 : t));
}

float epi_apply(int act, float v, float a, float b)
{
    precise float t;
    switch (act) {
    case EPI_RELU:
        return v < 0.0 ? 0.0 : v;
    case EPI_LEAKY_RELU:
        t = v * a;
        return v < 0.0 ? t : v;
    case EPI_CLAMP:
        return isnan(v) ? v : (v < a ? min(a, b) : (v > b ? b : v));
    case EPI_HARD_SIGMOID:
        t = v * a;
        t = t + b;
        return epi_clamp01(t);
    case EPI_HARD_SWISH:
        t = v * (1.0 / 6.0);
        t = t + 0.5;
        t = epi_clamp01(t);
        t = v * t;
        return t;
    case EPI_SIGMOID:
        return 1.0 / (1.0 + exp(-v));
    default:
        return v;
    }
}
