/*
 * engine/data/images.c — image folders (PNG through libspng, JPEG through libjpeg) and
 * the random image transforms: crop with padding, horizontal flip, affine.
 *
 * Every random choice is drawn from the item's key (kiln__data_uniform), never from a
 * shared generator, so workers may produce items in any order and still agree.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdio.h> /* before jpeglib.h, which uses FILE */

#include <jpeglib.h>
#include <spng.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "data-impl.h"
#include "error-impl.h"

kiln_dataset *kiln__dataset_arrays_take(const kiln_dataset_info *info, float *x, double *t, const char *name);

/* ------------------------------------------------------------------- decoding */

/* Decoded pixels: h x w x c bytes (c = 1 or 3). */
typedef struct image {
    unsigned char *px;
    int w, h, c;
} image;

static int decode_png(const char *path, image *out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return kiln__error_set("image: %s: cannot open: %s", path, strerror(errno));
    spng_ctx *ctx = spng_ctx_new(0);
    int rc = -1;
    struct spng_ihdr ihdr;
    size_t size = 0;
    int err = ctx ? spng_set_png_file(ctx, f) : SPNG_EMEM;
    if (!err)
        err = spng_get_ihdr(ctx, &ihdr);
    if (!err)
        err = spng_decoded_image_size(ctx, SPNG_FMT_RGB8, &size);
    if (!err) {
        out->px = malloc(size);
        if (!out->px)
            err = SPNG_EMEM;
    }
    if (!err)
        err = spng_decode_image(ctx, out->px, size, SPNG_FMT_RGB8, SPNG_DECODE_TRNS);
    if (err) {
        free(out->px);
        out->px = NULL;
        kiln__error_set("image: %s: PNG: %s", path, spng_strerror(err));
    } else {
        out->w = (int)ihdr.width;
        out->h = (int)ihdr.height;
        out->c = 3;
        rc = 0;
    }
    spng_ctx_free(ctx);
    fclose(f);
    return rc;
}

typedef struct jpeg_err {
    struct jpeg_error_mgr mgr;
    jmp_buf jump;
} jpeg_err;

static void jpeg_fail(j_common_ptr cinfo)
{
    longjmp(((jpeg_err *)cinfo->err)->jump, 1);
}

static int decode_jpeg(const char *path, image *out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return kiln__error_set("image: %s: cannot open: %s", path, strerror(errno));
    struct jpeg_decompress_struct cinfo;
    jpeg_err jerr;
    unsigned char *volatile px = NULL;
    cinfo.err = jpeg_std_error(&jerr.mgr);
    jerr.mgr.error_exit = jpeg_fail;
    if (setjmp(jerr.jump)) {
        char msg[JMSG_LENGTH_MAX];
        jerr.mgr.format_message((j_common_ptr)&cinfo, msg);
        jpeg_destroy_decompress(&cinfo);
        free(px);
        fclose(f);
        return kiln__error_set("image: %s: JPEG: %s", path, msg);
    }
    jpeg_create_decompress(&cinfo);
    jpeg_stdio_src(&cinfo, f);
    jpeg_read_header(&cinfo, TRUE);
    cinfo.out_color_space = JCS_RGB;
    jpeg_start_decompress(&cinfo);
    size_t stride = (size_t)cinfo.output_width * 3;
    px = malloc(stride * cinfo.output_height);
    if (!px)
        jpeg_fail((j_common_ptr)&cinfo);
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW row = px + stride * cinfo.output_scanline;
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
    out->px = px;
    out->w = (int)cinfo.output_width;
    out->h = (int)cinfo.output_height;
    out->c = 3;
    jpeg_destroy_decompress(&cinfo);
    fclose(f);
    return 0;
}

static bool has_ext(const char *name, const char *ext)
{
    size_t n = strlen(name), e = strlen(ext);
    return n > e && strcasecmp(name + n - e, ext) == 0;
}

static bool is_image(const char *name)
{
    return has_ext(name, ".png") || has_ext(name, ".jpg") || has_ext(name, ".jpeg");
}

/* Nearest-neighbour resize of RGB bytes into channels x height x width floats in [0, 1]. */
static void to_features(const image *im, int channels, int height, int width, float *x)
{
    for (int y = 0; y < height; y++) {
        int sy = (int)((int64_t)y * im->h / height);
        for (int xx = 0; xx < width; xx++) {
            int sx = (int)((int64_t)xx * im->w / width);
            const unsigned char *p = im->px + ((size_t)sy * (size_t)im->w + (size_t)sx) * 3;
            if (channels == 1) {
                x[(size_t)y * width + xx] = (0.299f * p[0] + 0.587f * p[1] + 0.114f * p[2]) / 255.0f;
            } else {
                for (int c = 0; c < 3; c++)
                    x[((size_t)c * height + y) * width + xx] = p[c] / 255.0f;
            }
        }
    }
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted names of the entries of dir that pass keep (files or folders). */
static int list_dir(const char *dir, bool folders, char ***out)
{
    DIR *d = opendir(dir);
    if (!d)
        return kiln__error_set("image folder: %s: cannot open: %s", dir, strerror(errno));
    char **names = NULL;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path)
            continue; /* longer than any path the system can open */
        DIR *sub = folders ? opendir(path) : NULL;
        bool ok = folders ? sub != NULL : is_image(e->d_name);
        if (sub)
            closedir(sub);
        if (!ok)
            continue;
        char **nn = realloc(names, (size_t)(n + 1) * sizeof *names);
        if (!nn || !(nn[n] = strdup(e->d_name))) {
            names = nn ? nn : names;
            for (int i = 0; i < n; i++)
                free(names[i]);
            free(names);
            closedir(d);
            return kiln__error_set("image folder: out of memory");
        }
        names = nn;
        n++;
    }
    closedir(d);
    if (n > 1)
        qsort(names, (size_t)n, sizeof *names, cmp_str);
    *out = names;
    return n;
}

typedef struct folder_self {
    float *x;
    double *t;
    int nclasses;
    char **classes;
} folder_self;

static int folder_get(const kiln_dataset *ds, int64_t i, float *x, double *target, uint64_t key)
{
    const folder_self *s = ds->self;
    int64_t fnum = ds->info.feature_numel;
    memcpy(x, s->x + i * fnum, (size_t)fnum * sizeof *x);
    target[0] = s->t[i];
    return 0;
}

static void folder_destroy(void *self)
{
    folder_self *s = self;
    if (!s)
        return;
    for (int c = 0; c < s->nclasses; c++)
        free(s->classes[c]);
    free(s->classes);
    free(s->x);
    free(s->t);
    free(s);
}

static const kiln__dataset_class folder_class = {"image_folder", folder_get, folder_destroy};

kiln_dataset *kiln_dataset_image_folder(const char *root, int channels, int height, int width)
{
    if (!root || (channels != 1 && channels != 3) || height < 1 || width < 1)
        return kiln__error_set("image folder: need a root, channels 1 or 3 and a positive size"), NULL;
    folder_self *s = calloc(1, sizeof *s);
    if (!s)
        return kiln__error_set("image folder: out of memory"), NULL;
    int nc = list_dir(root, true, &s->classes);
    if (nc < 0) {
        free(s);
        return NULL;
    }
    s->nclasses = nc;
    if (nc == 0) {
        folder_destroy(s);
        return kiln__error_set("image folder: %s: no class sub-folders", root), NULL;
    }
    /* channels * height * width of two large ints overflows int64: checked, as it sizes
     * every image's slot */
    int64_t fnum = kiln__data_numel(3, (int64_t[]){channels, height, width}), n = 0, cap = 0;
    if (fnum < 0) {
        folder_destroy(s);
        return kiln__error_set("image folder: %dx%dx%d images are too large to address", channels, height, width),
               NULL;
    }
    for (int c = 0; c < nc; c++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s", root, s->classes[c]);
        char **files = NULL;
        int nf = list_dir(dir, false, &files);
        if (nf < 0) {
            folder_destroy(s);
            return NULL;
        }
        int rc = 0;
        for (int k = 0; k < nf; k++) {
            char path[8192];
            snprintf(path, sizeof path, "%s/%s", dir, files[k]);
            image im = {0};
            if (rc == 0)
                rc = has_ext(files[k], ".png") ? decode_png(path, &im) : decode_jpeg(path, &im);
            int64_t xn = 0;
            if (rc == 0 && n == cap && !kiln__data_count(cap ? cap * 2 : 64, fnum, sizeof(float), &xn))
                rc = kiln__error_set("image folder: %s: too many images of %lld values to address", path,
                                     (long long)fnum);
            if (rc == 0 && n == cap) {
                cap = cap ? cap * 2 : 64;
                float *nx = realloc(s->x, (size_t)xn * sizeof *nx);
                double *nt = nx ? realloc(s->t, (size_t)cap * sizeof *nt) : NULL;
                if (nx)
                    s->x = nx;
                if (nt)
                    s->t = nt;
                if (!nx || !nt)
                    rc = kiln__error_set("image folder: out of memory at %s", path);
            }
            if (rc == 0) {
                to_features(&im, channels, height, width, s->x + n * fnum);
                s->t[n++] = c;
            }
            free(im.px);
            free(files[k]);
        }
        free(files);
        if (rc != 0) {
            folder_destroy(s);
            return NULL;
        }
    }
    kiln_dataset_info info = {.length = n, .ndim = 3, .shape = {channels, height, width}, .num_classes = nc};
    char name[200];
    snprintf(name, sizeof name, "image_folder(%.150s)", root);
    return kiln__dataset_new(&folder_class, s, NULL, &info, name);
}

const char *kiln_dataset_class_name(const kiln_dataset *ds, int64_t c)
{
    if (ds && ds->class_names)
        return c >= 0 && c < ds->nclass_names ? ds->class_names[c] : NULL;
    if (!ds || ds->cls != &folder_class)
        return ds && ds->source ? kiln_dataset_class_name(ds->source, c) : NULL;
    const folder_self *s = ds->self;
    return c >= 0 && c < s->nclasses ? s->classes[c] : NULL;
}

/* ------------------------------------------------------------ image transforms */

static int need_image(const kiln_dataset *ds, const char *op)
{
    if (!ds)
        return kiln__error_set("%s: NULL data set", op);
    if (ds->info.ndim != 3)
        return kiln__error_set("%s: %s: items need [C, H, W] features, have %d dims", op, ds->name, ds->info.ndim);
    return 0;
}

typedef struct crop_self {
    int h, w, pad;
    int64_t sc, sh, sw;
} crop_self;

static int crop_get(const kiln_dataset *ds, int64_t i, float *x, double *target, uint64_t key)
{
    const crop_self *s = ds->self;
    int64_t snum = s->sc * s->sh * s->sw;
    float *tmp = malloc((size_t)snum * sizeof *tmp);
    if (!tmp)
        return kiln__error_set("random_crop: out of memory");
    if (kiln_dataset_get(ds->source, i, tmp, target, key) < 0) {
        free(tmp);
        return -1;
    }
    int64_t range_y = s->sh + 2 * (int64_t)s->pad - s->h, range_x = s->sw + 2 * (int64_t)s->pad - s->w;
    int64_t oy = (int64_t)(kiln__data_uniform(key, 0xc401) * (double)(range_y + 1)) - s->pad;
    int64_t ox = (int64_t)(kiln__data_uniform(key, 0xc402) * (double)(range_x + 1)) - s->pad;
    for (int64_t c = 0; c < s->sc; c++)
        for (int64_t y = 0; y < s->h; y++)
            for (int64_t xx = 0; xx < s->w; xx++) {
                int64_t sy = y + oy, sx = xx + ox;
                bool in = sy >= 0 && sy < s->sh && sx >= 0 && sx < s->sw;
                x[(c * s->h + y) * s->w + xx] = in ? tmp[(c * s->sh + sy) * s->sw + sx] : 0.0f;
            }
    free(tmp);
    return 0;
}

kiln_dataset *kiln_dataset_random_crop(kiln_dataset *ds, int height, int width, int pad)
{
    if (need_image(ds, "random_crop") < 0)
        return NULL;
    if (height < 1 || width < 1 || pad < 0 || height > ds->info.shape[1] + 2 * (int64_t)pad ||
        width > ds->info.shape[2] + 2 * (int64_t)pad)
        return kiln__error_set("random_crop: %s: %dx%d with pad %d does not fit %lldx%lld", ds->name, height, width,
                               pad, (long long)ds->info.shape[1], (long long)ds->info.shape[2]),
               NULL;
    static const kiln__dataset_class cls = {"random_crop", crop_get, free};
    crop_self *s = malloc(sizeof *s);
    if (!s)
        return kiln__error_set("random_crop: out of memory"), NULL;
    *s = (crop_self){height, width, pad, ds->info.shape[0], ds->info.shape[1], ds->info.shape[2]};
    kiln_dataset_info info = ds->info;
    info.shape[1] = height;
    info.shape[2] = width;
    return kiln__dataset_new(&cls, s, ds, &info, "random_crop");
}

typedef struct flip_self {
    double p;
} flip_self;

static int flip_get(const kiln_dataset *ds, int64_t i, float *x, double *target, uint64_t key)
{
    const flip_self *s = ds->self;
    if (kiln_dataset_get(ds->source, i, x, target, key) < 0)
        return -1;
    if (kiln__data_uniform(key, 0xf11b) >= s->p)
        return 0;
    int64_t rows = ds->info.shape[0] * ds->info.shape[1], w = ds->info.shape[2];
    for (int64_t r = 0; r < rows; r++) {
        float *row = x + r * w;
        for (int64_t a = 0, b = w - 1; a < b; a++, b--) {
            float t = row[a];
            row[a] = row[b];
            row[b] = t;
        }
    }
    return 0;
}

kiln_dataset *kiln_dataset_random_flip(kiln_dataset *ds, double p)
{
    if (need_image(ds, "random_flip") < 0)
        return NULL;
    if (!(p >= 0 && p <= 1))
        return kiln__error_set("random_flip: p = %g outside [0, 1]", p), NULL;
    static const kiln__dataset_class cls = {"random_flip", flip_get, free};
    flip_self *s = malloc(sizeof *s);
    if (!s)
        return kiln__error_set("random_flip: out of memory"), NULL;
    s->p = p;
    return kiln__dataset_new(&cls, s, ds, &ds->info, "random_flip");
}

typedef struct affine_self {
    double degrees, translate, scale_lo, scale_hi;
} affine_self;

static int affine_get(const kiln_dataset *ds, int64_t i, float *x, double *target, uint64_t key)
{
    const affine_self *s = ds->self;
    int64_t C = ds->info.shape[0], H = ds->info.shape[1], W = ds->info.shape[2], num = C * H * W;
    float *src = malloc((size_t)num * sizeof *src);
    if (!src)
        return kiln__error_set("random_affine: out of memory");
    if (kiln_dataset_get(ds->source, i, src, target, key) < 0) {
        free(src);
        return -1;
    }
    double ang = (2 * kiln__data_uniform(key, 0xaff1) - 1) * s->degrees * M_PI / 180.0;
    double tx = (2 * kiln__data_uniform(key, 0xaff2) - 1) * s->translate * (double)W;
    double ty = (2 * kiln__data_uniform(key, 0xaff3) - 1) * s->translate * (double)H;
    double sc = s->scale_lo + (s->scale_hi - s->scale_lo) * kiln__data_uniform(key, 0xaff4);
    double cx = (double)(W - 1) / 2, cy = (double)(H - 1) / 2;
    double ca = cos(ang) / sc, sa = sin(ang) / sc; /* inverse map: output -> source */
    for (int64_t y = 0; y < H; y++)
        for (int64_t xx = 0; xx < W; xx++) {
            double dx = (double)xx - cx - tx, dy = (double)y - cy - ty;
            double sx = ca * dx + sa * dy + cx, sy = -sa * dx + ca * dy + cy;
            int64_t x0 = (int64_t)floor(sx), y0 = (int64_t)floor(sy);
            double fx = sx - (double)x0, fy = sy - (double)y0;
            for (int64_t c = 0; c < C; c++) {
                const float *p = src + c * H * W;
                double v = 0;
                for (int k = 0; k < 4; k++) {
                    int64_t yy = y0 + (k >> 1), xk = x0 + (k & 1);
                    double wgt = ((k >> 1) ? fy : 1 - fy) * ((k & 1) ? fx : 1 - fx);
                    if (yy >= 0 && yy < H && xk >= 0 && xk < W)
                        v += wgt * p[yy * W + xk];
                }
                x[(c * H + y) * W + xx] = (float)v;
            }
        }
    free(src);
    return 0;
}

kiln_dataset *kiln_dataset_random_affine(kiln_dataset *ds, double degrees, double translate, double scale_lo,
                                         double scale_hi)
{
    if (need_image(ds, "random_affine") < 0)
        return NULL;
    if (!(degrees >= 0) || !(translate >= 0 && translate <= 1) || !(scale_lo > 0) || !(scale_hi >= scale_lo))
        return kiln__error_set("random_affine: degrees %g, translate %g, scale [%g, %g] out of range", degrees,
                               translate, scale_lo, scale_hi),
               NULL;
    static const kiln__dataset_class cls = {"random_affine", affine_get, free};
    affine_self *s = malloc(sizeof *s);
    if (!s)
        return kiln__error_set("random_affine: out of memory"), NULL;
    *s = (affine_self){degrees, translate, scale_lo, scale_hi};
    return kiln__dataset_new(&cls, s, ds, &ds->info, "random_affine");
}
