/*
 * backends/vulkan/vk-fused.c — the Vulkan backend's fused_run: a kiln_fused_program
 * (backends/fused-program.h) generated as a GLSL compute shader, compiled to SPIR-V with
 * libshaderc at run time, and run as one dispatch. Built only with libshaderc.
 *
 * The body comes from the shared emitter (backends/fused/fused-codegen.c); this file
 * writes the GLSL spellings it uses. The shader #includes common.glsl (and
 * math-double.glsl where the device has shaderFloat64), embedded at build time
 * (vk-glsl-text.c), so the ops call the very helpers the prebuilt kernels use (kvk_tanh,
 * kvk_erf, kvk_fmod ...). Row statistics (softmax, sum, mean) accumulate in double where
 * the device has it, in float otherwise. pow is left to the unfused kernels (its float
 * path lives in unary.comp, not in common.glsl): a program with one is refused and the
 * fusion layer replays it. So is one over more buffers than a dispatch binds
 * (KVK_MAX_BUFS), or whose indices do not fit int32 (the shaders' index type).
 *
 * Caches, both keyed by what the program's kernel depends on and nothing else:
 *   - in memory, per device: the pipeline by the program's key (kiln__fused_codegen_key)
 *     and the shader's feature flags, guarded by the device's pipe_lock;
 *   - on disk, beside the persisted pipeline cache (vk-pipeline.c's directory): the SPIR-V
 *     in vulkan-fused-<hash>.spv, the hash taken over the generated source and the
 *     embedded headers, so a changed generator or header never reads a stale module. The
 *     file starts with the full key text, compared on reading (a hash collision is a
 *     miss), and is written to a temporary name and renamed. The driver's compilation of
 *     that SPIR-V lands in the VkPipelineCache, which vk-pipeline.c saves at close.
 * A new process therefore skips shaderc for every program it saw before, and the driver
 * compile too where the driver honours its cache.
 */
#include <shaderc/shaderc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error-impl.h"
#include "fused-codegen.h"
#include "vk-impl.h"

/* Mirrors KFParams of the generated shader (std430: every member 4 bytes, arrays of them). */
typedef struct kf_params {
    int32_t n, inner;
    int32_t in_off[KILN_FUSED_MAX_INPUTS];
    int32_t out_off[KILN_FUSED_MAX_OUTPUTS];
    int32_t nd[KILN_FUSED_MAX_INPUTS];
    int32_t shape[KILN_FUSED_MAX_INPUTS * KILN_MAX_DIMS];
    int32_t stride[KILN_FUSED_MAX_INPUTS * KILN_MAX_DIMS];
    float k[KILN_FUSED_MAX_INSTRS * 2];
} kf_params;

/* The most element index a kernel computes: a grid-stride step past n stays in int32. */
#define MAX_INDEX ((int64_t)INT32_MAX - (int64_t)KVK_GROUPS_MAX * KVK_WG - 1)

typedef struct fused_pipe {
    char *key;
    uint64_t hash;
    VkShaderModule module;
    VkPipeline pipe; /* VK_NULL_HANDLE: the kernel could not be made, groups replay */
    struct fused_pipe *next;
} fused_pipe;

#define BUCKETS 64

struct kvk_fused_cache {
    fused_pipe *bucket[BUCKETS];
};

/* The loop iterations of one invocation of p's kernel: its share of the elements (or of
 * the rows, each walked once, or three times under a softmax, KVK_WG apart), each element
 * reading its inputs through a loop over their dims at most. */
static int64_t fused_steps(const kiln_fused_program *p)
{
    int64_t per_element = 1;
    for (int i = 0; i < p->ninputs; i++)
        per_element += p->inputs[i].ndim;
    if (p->reduce_inner <= 0)
        return (p->n + (int64_t)KVK_GROUPS_MAX * KVK_WG - 1) / ((int64_t)KVK_GROUPS_MAX * KVK_WG) * per_element;
    int64_t passes = 1;
    for (int i = 0; i < p->ninstrs; i++)
        passes += p->instrs[i].code == KILN_FUSED_SOFTMAX ? 2 : 0;
    int64_t rows = p->n / p->reduce_inner;
    int64_t rounds = (rows + KVK_GROUPS_MAX - 1) / KVK_GROUPS_MAX;
    return rounds * (passes * ((p->reduce_inner + KVK_WG - 1) / KVK_WG) * per_element + 32);
}

/* ------------------------------------------------------------------ source */

static const char prelude_head[] = "#version 450\n";

static const char prelude_body[] =
    "#include \"common.glsl\"\n"
    "#define KF_IDX int\n"
    "#define KF_FN\n"
    "#define KF_PDECL\n"
    "#define KF_PARG\n"
    "layout(std430, set = 0, binding = 0) readonly buffer KFParams {\n"
    "    int n, inner;\n"
    "    int in_off[16];\n"
    "    int out_off[16];\n"
    "    int nd[16];\n"
    "    int shape[128];\n"
    "    int stride[128];\n"
    "    float k[128];\n"
    "} P;\n"
    "#define KF_N (P.n)\n"
    "#define KF_INNER (P.inner)\n"
    "#define KF_GID int(gl_GlobalInvocationID.x)\n"
    "#define KF_GSTRIDE int(gl_NumWorkGroups.x * gl_WorkGroupSize.x)\n"
    "#define KF_GROUP int(gl_WorkGroupID.x)\n"
    "#define KF_NGROUPS int(gl_NumWorkGroups.x)\n"
    "#define KF_LID int(gl_LocalInvocationID.x)\n"
    "#define KF_LSIZE int(gl_WorkGroupSize.x)\n"
    "#define KF_K(j) (P.k[j])\n"
    "#define KF_NDIM(k) (P.nd[k])\n"
    "#define KF_SHAPE(k, d) (P.shape[(k) * 8 + (d)])\n"
    "#define KF_STRIDE(k, d) (P.stride[(k) * 8 + (d)])\n"
    /* the ops: unary.comp's and binary.comp's f32 formulas over common.glsl's helpers */
    "float ku_neg(float x, float A, float B) { return -x; }\n"
    "float ku_abs(float x, float A, float B) { return abs(x); }\n"
    "float ku_sign(float x, float A, float B) { return float(x > 0.0) - float(x < 0.0); }\n"
    "float ku_exp(float x, float A, float B) { return exp(x); }\n"
    "float ku_log(float x, float A, float B) { return kvk_log(x); }\n"
    "float ku_log1p(float x, float A, float B) { return kvk_log1p(x); }\n"
    "float ku_expm1(float x, float A, float B) { return kvk_expm1(x); }\n"
    "float ku_sqrt(float x, float A, float B) { return x < 0.0 ? KVK_NAN : sqrt(x); }\n"
    "float ku_rsqrt(float x, float A, float B) { return x < 0.0 ? KVK_NAN : 1.0 / sqrt(x); }\n"
    "float ku_square(float x, float A, float B) { return x * x; }\n"
    "float ku_reciprocal(float x, float A, float B) { return 1.0 / x; }\n"
    "float ku_sin(float x, float A, float B) { return kvk_sin_f(x); }\n"
    "float ku_cos(float x, float A, float B) { return kvk_cos_f(x); }\n"
    "float ku_tanh(float x, float A, float B) { return kvk_tanh(x); }\n"
    "float ku_sigmoid(float x, float A, float B) { return kvk_sigmoid(x); }\n"
    "float ku_relu(float x, float A, float B) { return x < 0.0 ? 0.0 : x; }\n"
    "float ku_leaky_relu(float x, float A, float B) { return x > 0.0 ? x : A * x; }\n"
    "float ku_elu(float x, float A, float B) { return x > 0.0 ? x : A * kvk_expm1(x); }\n"
    "float ku_gelu(float x, float A, float B)\n"
    "{ return 0.5 * x * (1.0 + kvk_erf(x * 0.70710678118654752440)); }\n"
    "float ku_gelu_tanh(float x, float A, float B)\n"
    "{ return 0.5 * x * (1.0 + kvk_tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x))); }\n"
    "float ku_silu(float x, float A, float B) { return x * kvk_sigmoid(x); }\n"
    "float ku_softplus(float x, float A, float B) { return x * A > B ? x : kvk_log1p(exp(x * A)) / A; }\n"
    "float ku_erf(float x, float A, float B) { return kvk_erf(x); }\n"
    "float ku_floor(float x, float A, float B) { return floor(x); }\n"
    "float ku_ceil(float x, float A, float B) { return ceil(x); }\n"
    "float ku_round(float x, float A, float B) { return roundEven(x); }\n"
    "float ku_clamp(float x, float A, float B)\n"
    "{ if (isnan(x)) return x; float y = x < A ? A : x; return y > B ? B : y; }\n"
    "float ku_add_scalar(float x, float A, float B) { return x + A; }\n"
    "float ku_mul_scalar(float x, float A, float B) { return x * A; }\n"
    "float kb_add(float a, float b) { return a + b; }\n"
    "float kb_sub(float a, float b) { return a - b; }\n"
    "float kb_mul(float a, float b) { return a * b; }\n"
    "float kb_div(float a, float b) { return a / b; }\n"
    "float kb_remainder(float a, float b)\n"
    "{ float m = kvk_fmod(a, b); if (m != 0.0 && ((b < 0.0) != (m < 0.0))) m += b; return m; }\n"
    "float kb_maximum(float a, float b) { return isnan(a) || isnan(b) ? a + b : (a < b ? b : a); }\n"
    "float kb_minimum(float a, float b) { return isnan(a) || isnan(b) ? a + b : (b < a ? b : a); }\n"
    /* group reductions: a fixed tree in shared memory, every invocation calls them */
    "shared KF_ACC kf_part[gl_WorkGroupSize.x];\n"
    "KF_ACC kf_nanmax(KF_ACC a, KF_ACC b) { return isnan(a) ? a : isnan(b) ? b : (b > a ? b : a); }\n"
    "KF_ACC kf_group_max(KF_ACC v)\n"
    "{\n"
    "    uint t = gl_LocalInvocationID.x;\n"
    "    barrier();\n"
    "    kf_part[t] = v;\n"
    "    barrier();\n"
    "    for (uint s = gl_WorkGroupSize.x / 2; s > 0; s >>= 1) {\n"
    "        if (t < s) kf_part[t] = kf_nanmax(kf_part[t], kf_part[t + s]);\n"
    "        barrier();\n"
    "    }\n"
    "    return kf_part[0];\n"
    "}\n"
    "KF_ACC kf_group_sum(KF_ACC v)\n"
    "{\n"
    "    uint t = gl_LocalInvocationID.x;\n"
    "    barrier();\n"
    "    kf_part[t] = v;\n"
    "    barrier();\n"
    "    for (uint s = gl_WorkGroupSize.x / 2; s > 0; s >>= 1) {\n"
    "        if (t < s) kf_part[t] += kf_part[t + s];\n"
    "        barrier();\n"
    "    }\n"
    "    return kf_part[0];\n"
    "}\n"
    "#define KF_KERNEL_BEGIN void main() {\n"
    "#define KF_KERNEL_END }\n";

/* The accumulator's spellings: double where the device has it, float otherwise. */
static const char acc_double[] = "#define KVK_DOUBLE 1\n"
                                 "#define KF_ACC double\n"
                                 "#define KF_NEG_INF double(uintBitsToFloat(0xff800000u))\n"
                                 "#define kf_acc(x) double(x)\n"
                                 "#define kf_acc_n(x) double(x)\n"
                                 "#define kf_acc_exp(x) kd_exp(x)\n"
                                 "#define kf_acc_log(x) kd_log(x)\n";
static const char acc_float[] = "#define KF_ACC float\n"
                                "#define KF_NEG_INF uintBitsToFloat(0xff800000u)\n"
                                "#define kf_acc(x) float(x)\n"
                                "#define kf_acc_n(x) float(x)\n"
                                "#define kf_acc_exp(x) exp(x)\n"
                                "#define kf_acc_log(x) kvk_log(x)\n";

/* Binding slots: each distinct buffer once (1..KVK_MAX_BUFS), with its element type. */
typedef struct slots {
    kiln_buffer *buf[KVK_MAX_BUFS];
    kiln_dtype dt[KVK_MAX_BUFS];
    int n;
    int in_slot[KILN_FUSED_MAX_INPUTS], out_slot[KILN_FUSED_MAX_OUTPUTS];
} slots;

static int slot_of(slots *s, const kiln_tdesc *d)
{
    for (int i = 0; i < s->n; i++)
        if (s->buf[i] == d->buf)
            return s->dt[i] == d->dtype ? i : -1;
    if (s->n == KVK_MAX_BUFS)
        return -1;
    s->buf[s->n] = d->buf;
    s->dt[s->n] = d->dtype;
    return s->n++;
}

/* The binding layout depends on which operands share a buffer: part of the key. */
static int assign_slots(slots *s, const kiln_fused_program *p)
{
    s->n = 0;
    for (int i = 0; i < p->ninputs; i++)
        if ((s->in_slot[i] = slot_of(s, &p->inputs[i])) < 0)
            return KILN_ENOTSUP;
    for (int i = 0; i < p->noutputs; i++)
        if ((s->out_slot[i] = slot_of(s, &p->outputs[i])) < 0)
            return KILN_ENOTSUP;
    return 0;
}

static int check(const kiln_fused_program *p)
{
    if (kiln__fused_codegen_check(p, MAX_INDEX) < 0)
        return KILN_ENOTSUP;
    for (int i = 0; i < p->ninstrs; i++) {
        const kiln_fused_instr *in = &p->instrs[i];
        if ((in->code == KILN_FUSED_UNARY && in->op == KILN_UNARY_POW_SCALAR) ||
            (in->code == KILN_FUSED_BINARY && in->op == KILN_BINARY_POW))
            return KILN_ENOTSUP;
    }
    return 0;
}

/* The GLSL source of p's kernel (malloc'd), or NULL (out of memory). */
static char *glsl_source(const kiln_fused_program *p, const slots *s, bool f64, const char *key)
{
    kiln__sbuf b = {.p = malloc(16384), .cap = 16384, .ok = true};
    if (!b.p)
        return NULL;
    b.p[0] = '\0';
    kiln__sbuf_printf(&b, "%s// generated by kiln for the fused program %.3000s\n%s%s", prelude_head, key,
                      f64 ? acc_double : acc_float, prelude_body);
    for (int i = 0; i < s->n; i++)
        kiln__sbuf_printf(&b, "layout(std430, set = 0, binding = %d) buffer KFB%d { %s v[]; } b%d;\n", i + 1, i,
                          s->dt[i] == KILN_BOOL ? "uint8_t" : "float", i);
    for (int k = 0; k < p->ninputs; k++) {
        if (p->inputs[k].dtype == KILN_BOOL)
            kiln__sbuf_printf(&b,
                              "#define KF_LD%d(idx) (b%d.v[P.in_off[%d] + (idx)] != uint8_t(0) ? 1.0f : 0.0f)\n",
                              k, s->in_slot[k], k);
        else
            kiln__sbuf_printf(&b, "#define KF_LD%d(idx) (b%d.v[P.in_off[%d] + (idx)])\n", k, s->in_slot[k], k);
    }
    for (int k = 0; k < p->noutputs; k++) {
        if (p->outputs[k].dtype == KILN_BOOL)
            kiln__sbuf_printf(
                &b, "#define KF_ST%d(idx, val) (b%d.v[P.out_off[%d] + (idx)] = uint8_t((val) != 0.0f ? 1 : 0))\n",
                k, s->out_slot[k], k);
        else
            kiln__sbuf_printf(&b, "#define KF_ST%d(idx, val) (b%d.v[P.out_off[%d] + (idx)] = (val))\n", k,
                              s->out_slot[k], k);
    }
    kiln__fused_emit_body(&b, p);
    if (!b.ok) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/* ------------------------------------------------------------------ shaderc */

static shaderc_include_result *include_resolve(void *ud, const char *requested, int type, const char *from,
                                               size_t depth)
{
    (void)ud, (void)type, (void)from, (void)depth;
    shaderc_include_result *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    for (const kvk_glsl_text *t = kvk_glsl_texts; t->name; t++)
        if (!strcmp(t->name, requested)) {
            r->source_name = t->name;
            r->source_name_length = strlen(t->name);
            r->content = t->text;
            r->content_length = t->len;
            return r;
        }
    static const char missing[] = "kiln embeds no such header";
    r->source_name = "";
    r->content = missing;
    r->content_length = sizeof missing - 1;
    return r;
}

static void include_release(void *ud, shaderc_include_result *r)
{
    (void)ud;
    free(r);
}

/* SPIR-V of source (malloc'd, *nbytes), or NULL with the error set quoting shaderc. */
static uint32_t *compile_glsl(const char *source, const char *name, size_t *nbytes)
{
    shaderc_compiler_t c = shaderc_compiler_initialize();
    shaderc_compile_options_t o = c ? shaderc_compile_options_initialize() : NULL;
    if (!o) {
        if (c)
            shaderc_compiler_release(c);
        kiln__error_set("fused on vulkan: cannot start the shader compiler (shaderc)");
        return NULL;
    }
    shaderc_compile_options_set_target_env(o, shaderc_target_env_vulkan, shaderc_env_version_vulkan_1_2);
    shaderc_compile_options_set_optimization_level(o, shaderc_optimization_level_performance);
    shaderc_compile_options_set_include_callbacks(o, include_resolve, include_release, NULL);
    shaderc_compilation_result_t r = shaderc_compile_into_spv(c, source, strlen(source), shaderc_compute_shader,
                                                              name, "main", o);
    uint32_t *code = NULL;
    if (r && shaderc_result_get_compilation_status(r) == shaderc_compilation_status_success) {
        *nbytes = shaderc_result_get_length(r);
        if ((code = malloc(*nbytes)))
            memcpy(code, shaderc_result_get_bytes(r), *nbytes);
        else
            kiln__error_set("fused on vulkan: out of memory");
    } else {
        kiln__error_set("fused on vulkan: shaderc failed on %s: %.600s", name,
                        r ? shaderc_result_get_error_message(r) : "no result");
    }
    if (r)
        shaderc_result_release(r);
    shaderc_compile_options_release(o);
    shaderc_compiler_release(c);
    return code;
}

/* ------------------------------------------------------------------ the disk cache */

/* vulkan-fused-<hash>.spv in the cache directory (where the pipeline cache file lives,
 * made if missing), or "" when there is none. */
static void disk_path(uint64_t h, char *path, size_t len)
{
    char dir[900];
    path[0] = '\0';
    if (kiln__fused_cache_dir(dir, sizeof dir, true))
        snprintf(path, len, "%s/vulkan-fused-%016llx.spv", dir, (unsigned long long)h);
}

/* The file is "<key>\n" then the SPIR-V. */
static uint32_t *disk_read(const char *path, const char *key, size_t *nbytes)
{
    FILE *f = path[0] ? fopen(path, "rb") : NULL;
    if (!f)
        return NULL;
    size_t klen = strlen(key);
    char *head = malloc(klen + 1);
    uint32_t *code = NULL;
    long len = -1;
    if (head && fread(head, 1, klen + 1, f) == klen + 1 && !memcmp(head, key, klen) && head[klen] == '\n' &&
        fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) > (long)(klen + 1 + 20) &&
        fseek(f, (long)(klen + 1), SEEK_SET) == 0) {
        size_t n = (size_t)len - klen - 1;
        if (n % 4 == 0 && (code = malloc(n)) && fread(code, 1, n, f) == n && code[0] == 0x07230203u) {
            *nbytes = n;
        } else {
            free(code);
            code = NULL;
        }
    }
    free(head);
    fclose(f);
    return code;
}

static void disk_write(const char *path, const char *key, const uint32_t *code, size_t nbytes)
{
    if (!path[0])
        return;
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return; /* a cache that cannot be written only costs a compile next time */
    bool ok = fprintf(f, "%s\n", key) > 0 && fwrite(code, 1, nbytes, f) == nbytes;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0)
        unlink(tmp);
}

/* ------------------------------------------------------------------ the pipeline cache */

static fused_pipe *lookup(kvk_device *d, const char *key, uint64_t h)
{
    if (!d->fused)
        return NULL;
    for (fused_pipe *f = d->fused->bucket[h % BUCKETS]; f; f = f->next)
        if (f->hash == h && !strcmp(f->key, key))
            return f;
    return NULL;
}

static uint64_t hash_more(uint64_t h, const char *text, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)text[i];
        h *= 1099511628211ull;
    }
    return h;
}

static fused_pipe *build(kvk_device *d, const kiln_fused_program *p, const slots *s, const char *key, uint64_t h,
                         int *rc)
{
    char *src = glsl_source(p, s, d->feat.f64, key);
    if (!src) {
        *rc = kiln__error_set("fused on vulkan: out of memory");
        return NULL;
    }
    uint64_t sh = kiln__fused_hash(src);
    for (const kvk_glsl_text *t = kvk_glsl_texts; t->name; t++)
        sh = hash_more(sh, t->text, t->len);
    char path[1100];
    disk_path(sh, path, sizeof path);
    size_t nbytes = 0;
    uint32_t *code = disk_read(path, key, &nbytes);
    if (!code) {
        char name[40];
        snprintf(name, sizeof name, "kf_%016llx.comp", (unsigned long long)h);
        code = compile_glsl(src, name, &nbytes);
        if (code)
            disk_write(path, key, code, nbytes);
    }
    free(src);
    fused_pipe *f = calloc(1, sizeof *f);
    if (!f || !(f->key = strdup(key))) {
        free(f);
        free(code);
        *rc = kiln__error_set("fused on vulkan: out of memory");
        return NULL;
    }
    f->hash = h;
    if (code) {
        kvk_spec spec = kvk_spec_1d(0, NULL);
        f->pipe = kvk_pipeline_from_spirv(d, "fused", code, nbytes, &spec, &f->module);
        free(code);
        if (!f->pipe && atomic_load(&d->lost)) {
            free(f->key);
            free(f);
            *rc = KILN_EDEVICE;
            return NULL;
        }
    }
    /* a shader shaderc or the driver refuses is the generator's or the toolchain's fault,
     * not the program's: said once, and the key kept with no pipeline, so its groups
     * replay from then on */
    if (!f->pipe)
        kiln__warn("fused on vulkan:%d: %s; such groups run unfused", d->index, kiln_error());
    return f;
}

static void pipe_free(kvk_device *d, fused_pipe *f)
{
    vkDestroyPipeline(d->dev, f->pipe, NULL);
    vkDestroyShaderModule(d->dev, f->module, NULL);
    free(f->key);
    free(f);
}

static VkPipeline pipeline_for(kvk_device *d, const kiln_fused_program *p, const slots *s, int *rc)
{
    /* the key: the program's, which operands share a binding, and the accumulator type */
    char key[4096];
    kiln__fused_codegen_key(p, key, sizeof key - 64);
    size_t at = strlen(key);
    if (at >= sizeof key - 65) {
        *rc = KILN_ENOTSUP; /* too long to be sure the key is whole: never cached under it */
        return VK_NULL_HANDLE;
    }
    at += (size_t)snprintf(key + at, sizeof key - at, " b:");
    for (int i = 0; i < p->ninputs; i++)
        key[at++] = (char)('0' + s->in_slot[i]);
    key[at++] = '/';
    for (int i = 0; i < p->noutputs; i++)
        key[at++] = (char)('0' + s->out_slot[i]);
    snprintf(key + at, sizeof key - at, " %s", d->feat.f64 ? "f64" : "f32");
    uint64_t h = kiln__fused_hash(key);
    pthread_mutex_lock(&d->pipe_lock);
    fused_pipe *f = lookup(d, key, h);
    pthread_mutex_unlock(&d->pipe_lock);
    if (f && !f->pipe)
        *rc = KILN_ENOTSUP;
    if (f)
        return f->pipe;
    fused_pipe *fresh = build(d, p, s, key, h, rc);
    if (!fresh)
        return VK_NULL_HANDLE;
    pthread_mutex_lock(&d->pipe_lock);
    if (!d->fused)
        d->fused = calloc(1, sizeof *d->fused);
    f = d->fused ? lookup(d, key, h) : NULL;
    if (d->fused && !f) {
        fresh->next = d->fused->bucket[h % BUCKETS];
        d->fused->bucket[h % BUCKETS] = f = fresh;
        fresh = NULL;
    }
    pthread_mutex_unlock(&d->pipe_lock);
    if (fresh) /* another thread built the same key meanwhile, or no memory for the table */
        pipe_free(d, fresh);
    if (!f)
        *rc = kiln__error_set("fused on vulkan: out of memory");
    else if (!f->pipe)
        *rc = KILN_ENOTSUP;
    return f ? f->pipe : VK_NULL_HANDLE;
}

void kvk_fused_destroy(kvk_device *d)
{
    if (!d->fused)
        return;
    for (int b = 0; b < BUCKETS; b++)
        for (fused_pipe *f = d->fused->bucket[b], *next; f; f = next) {
            next = f->next;
            pipe_free(d, f);
        }
    free(d->fused);
    d->fused = NULL;
}

/* ------------------------------------------------------------------ run */

int kvk_fused_run(void *vq, const kiln_fused_program *p)
{
    kvk_queue *q = vq;
    kvk_device *d = q->d;
    slots s;
    if (check(p) < 0 || assign_slots(&s, p) < 0)
        return KILN_ENOTSUP;
    if (atomic_load(&d->lost))
        return kiln__error_set_code(KILN_EDEVICE, "fused on vulkan:%d: the device was lost", d->index);
    if (p->n == 0)
        return 0;
    if (d->feat.loop_limit && fused_steps(p) >= d->feat.loop_limit - d->feat.loop_limit / 16)
        return KILN_ENOTSUP; /* replayed op by op, whose kernels split long rows or refuse them */
    int rc = 0;
    VkPipeline pipe = pipeline_for(d, p, &s, &rc);
    if (!pipe)
        return rc < 0 ? rc : KILN_EINVAL;
    kf_params P;
    memset(&P, 0, sizeof P);
    P.n = (int32_t)p->n;
    P.inner = (int32_t)p->reduce_inner;
    for (int i = 0; i < p->ninputs; i++) {
        const kiln_tdesc *t = &p->inputs[i];
        P.in_off[i] = (int32_t)t->offset;
        P.nd[i] = t->ndim;
        for (int k = 0; k < t->ndim; k++) {
            P.shape[i * KILN_MAX_DIMS + k] = (int32_t)t->shape[k];
            P.stride[i * KILN_MAX_DIMS + k] = (int32_t)t->strides[k];
        }
    }
    for (int i = 0; i < p->noutputs; i++)
        P.out_off[i] = (int32_t)p->outputs[i].offset;
    for (int i = 0; i < p->ninstrs; i++) {
        P.k[2 * i] = (float)p->instrs[i].alpha;
        P.k[2 * i + 1] = (float)p->instrs[i].beta;
    }
    int64_t rows = p->reduce_inner > 0 ? p->n / p->reduce_inner : 0;
    uint32_t groups = rows ? (rows > KVK_GROUPS_MAX ? KVK_GROUPS_MAX : (uint32_t)rows) : kvk_groups(p->n, KVK_WG);
    return kvk_dispatch_pipeline(q, "fused", pipe, s.buf, s.n, &P, sizeof P, groups, 1, 1);
}
