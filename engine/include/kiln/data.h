/*
 * kiln/data.h — data sets, transforms and the batching loader.
 *
 *     kiln_dataset *train = kiln_dataset_idx("train-images-idx3-ubyte.gz",
 *                                            "train-labels-idx1-ubyte.gz");
 *     if (!train) { fprintf(stderr, "%s\n", kiln_error()); return 1; }   // names file + offset
 *     kiln_dataset *norm = kiln_dataset_normalize(train, 1, (float[]){0.2860f}, (float[]){0.3530f});
 *     kiln_dataset_free(train);            // norm holds its own reference to train
 *
 *     kiln_loader_config lc = kiln_loader_config_default();
 *     lc.batch_size = 64; lc.seed = 7; lc.workers = 2;
 *     kiln_loader *ld = kiln_loader_create(norm, &lc, dev);
 *     kiln_loader_start(ld, epoch, 0);      // order = f(seed, epoch), whatever the workers
 *     kiln_batch b;
 *     while (kiln_loader_next(ld, &b) == 1) {
 *         kiln_scope_begin();               // b.x, b.y belong to the innermost scope
 *         ...
 *         kiln_scope_end();
 *     }
 *     kiln_loader_free(ld);
 *     kiln_dataset_free(norm);
 *
 * Items. A data set is a random-access list of items. Every item has features of one
 * fixed shape (kiln_dataset_info: f32 on the host, e.g. [1, 28, 28] for an image) and a
 * target: a class index (num_classes > 0) or a vector of target_numel floats. Items are
 * produced into caller buffers by kiln_dataset_get, which is safe to call from several
 * threads at once: every data set here is read-only after creation.
 *
 * Randomness. Random transforms (crop, flip, affine) draw from a key the caller passes
 * with each item; the loader derives it from (seed, epoch, position), so an epoch's
 * augmented batches are a pure function of the seed and the epoch number — the property
 * that lets a resumed run repeat an uninterrupted one exactly.
 *
 * Ownership. Data sets are reference counted; a transform holds a reference to its
 * source, so the caller may free its own handle right after wrapping it.
 *
 * Errors. A data set that cannot be read (missing file, truncated IDX, a bad CSV row)
 * gives NULL and a message naming the file and the position (byte offset, line, entry).
 */
#ifndef KILN_DATA_H
#define KILN_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

KILN_API_BEGIN

typedef struct kiln_dataset kiln_dataset;

/** What a data set's items look like. */
typedef struct kiln_dataset_info {
    int64_t length;                   /* number of items */
    int ndim;                         /* feature dims of one item */
    int64_t shape[KILN_MAX_DIMS];
    int64_t feature_numel;            /* product of shape */
    int64_t num_classes;              /* > 0: the target is a class index */
    int64_t target_numel;             /* num_classes == 0: floats per target (0 = none) */
} kiln_dataset_info;

kiln_dataset_info kiln_dataset_get_info(const kiln_dataset *ds);
int64_t kiln_dataset_length(const kiln_dataset *ds);
/** A short description, e.g. "idx(train-images-idx3-ubyte.gz)|normalize". */
const char *kiln_dataset_name(const kiln_dataset *ds);

/**
 * Item i into x (feature_numel floats) and target (max(1, target_numel) doubles; a class
 * index is written as a double). key seeds random transforms. 0, or -1 plus a message.
 */
int kiln_dataset_get(const kiln_dataset *ds, int64_t i, float *x, double *target, uint64_t key);

kiln_dataset *kiln_dataset_retain(kiln_dataset *ds);
/** Drop a reference. NULL is a no-op. */
void kiln_dataset_free(kiln_dataset *ds);

/* ---------------------------------------------------------------------- sources */

/**
 * IDX files (MNIST, Fashion-MNIST), gzipped or not (detected by the magic). images: an
 * unsigned-byte IDX of [N, d1, ...] scaled to [0, 1] (or f32/f64/i32 IDX kept as is),
 * features shaped [1, d1, d2] for 3-D files; labels: a 1-D IDX of class indices (may be
 * NULL: then no target). num_classes is max label + 1. A header whose dimensions promise
 * more data than the file holds is an error ("truncated: header says N bytes, file has
 * M") found before the data is allocated; so is data continuing past the end the
 * header's dimensions give (a header that is not this file's).
 */
kiln_dataset *kiln_dataset_idx(const char *images_path, const char *labels_path);

/**
 * A CSV file with a header line. label_column names the class column or NULL for none;
 * feature_columns lists the nfeatures columns to use (NULL or nfeatures 0: every other
 * column; nfeatures < 0 is an error). A column named (label or feature) must be named by
 * exactly one header cell; the label column cannot also be a feature, nor a feature be
 * listed twice. Cells must be numbers; a bad row is an error naming the file and the line.
 *
 * Labels. The column's first label decides its kind. If it is a number, the column is
 * numeric: every label must then be an integer in [0, 1000000), written any way strtod
 * reads it ("1", "1.0", "01" and "1e0" are all class 1), and is that class index as is;
 * num_classes is the largest label + 1. A label that is negative, fractional, too large
 * or not a number is an error naming the line and the label (labels are never
 * renumbered). Otherwise the labels are names: any non-empty strings, mapped to classes
 * 0, 1, ... in order of first appearance (a name that looks like a number is just a
 * name there). An empty label is an error either way.
 */
kiln_dataset *kiln_dataset_csv(const char *path, const char *label_column, int nfeatures,
                               const char *const *feature_columns);

/**
 * An image folder: root/<class>/<image>.png|.jpg|.jpeg, classes in sorted order of the
 * sub-folder names, images sorted by name. Every image is decoded at creation and
 * resized (nearest) to height x width, channels 1 (grey) or 3 (RGB); pixels in [0, 1],
 * features [channels, height, width].
 */
kiln_dataset *kiln_dataset_image_folder(const char *root, int channels, int height, int width);
/**
 * The name of class c where the data's classes have names: an image folder's sub-folder, a CSV's
 * label name (labels that are names, numbered in order of first appearance); asked through
 * transforms, splits and subsets to their source. NULL for classes without names (IDX, numeric CSV
 * labels, arrays), c out of range, or a NULL data set. The string lives as long as the data set.
 */
const char *kiln_dataset_class_name(const kiln_dataset *ds, int64_t c);

/**
 * In-memory arrays (copied): n items of feature shape (ndim, shape); targets either
 * class indices (labels, num_classes > 0) or target_numel floats per item (targets).
 * Pass NULL for the kind not used. A shape whose n items cannot be addressed (the element
 * count overflows) is an error here, naming the shape.
 */
kiln_dataset *kiln_dataset_from_arrays(int64_t n, int ndim, const int64_t *shape, const float *features,
                                       const int64_t *labels, int64_t num_classes, const float *targets,
                                       int64_t target_numel);

/**
 * Tensors in a safetensors file: features_name [N, ...] (any dtype, cast to f32) and
 * target_name (NULL for none): integer [N] gives class indices, floating [N, ...] gives
 * target vectors.
 */
kiln_dataset *kiln_dataset_safetensors(const char *path, const char *features_name, const char *target_name);

/* ------------------------------------------------------------------- transforms */
/* Each returns a new data set holding a reference to ds (NULL plus a message on error). */

/** fn rewrites one item in place (x has feature_numel floats, target as in get). fn must be
 *  thread-safe and deterministic in (x, target, key); it returns 0 or -1 with an error. */
typedef int (*kiln_dataset_map_fn)(void *ud, float *x, double *target, uint64_t key);
kiln_dataset *kiln_dataset_map(kiln_dataset *ds, kiln_dataset_map_fn fn, void *ud);
/** A fixed permutation drawn from seed. */
kiln_dataset *kiln_dataset_shuffle(kiln_dataset *ds, uint64_t seed);
/** Items [start, start + count). */
kiln_dataset *kiln_dataset_range(kiln_dataset *ds, int64_t start, int64_t count);
/** Items by index (copied list). */
kiln_dataset *kiln_dataset_subset(kiln_dataset *ds, int64_t n, const int64_t *indices);
/**
 * Train/validation split: shuffle with seed, then the first round(fraction * length)
 * items go to *valid and the rest to *train. 0, or -1 plus a message.
 */
int kiln_dataset_split(kiln_dataset *ds, double valid_fraction, uint64_t seed, kiln_dataset **train,
                       kiln_dataset **valid);
/** Sliding windows of size consecutive items with step stride: features [size, shape...],
 *  the target of the window's last item. */
kiln_dataset *kiln_dataset_windows(kiln_dataset *ds, int64_t size, int64_t stride);
/** (x - mean[c]) / std[c] per channel (dim 0 of the features); nchannels 1 = scalar. */
kiln_dataset *kiln_dataset_normalize(kiln_dataset *ds, int nchannels, const float *mean, const float *std);
/** Pad [C, H, W] images by pad on each side with zeros and crop a random height x width. */
kiln_dataset *kiln_dataset_random_crop(kiln_dataset *ds, int height, int width, int pad);
/** Mirror [C, H, W] images left-right with probability p. */
kiln_dataset *kiln_dataset_random_flip(kiln_dataset *ds, double p);
/** Random affine of [C, H, W] images: rotation in ±degrees, translation up to ±translate of
 *  the size, scale in [scale_lo, scale_hi]; bilinear, zeros outside. */
kiln_dataset *kiln_dataset_random_affine(kiln_dataset *ds, double degrees, double translate, double scale_lo,
                                         double scale_hi);

/* ----------------------------------------------------------------------- loader */

typedef struct kiln_loader_config {
    int64_t batch_size;   /* 32 */
    bool shuffle;         /* true: a fresh permutation per epoch from (seed, epoch) */
    uint64_t seed;        /* 0 */
    int workers;          /* 0: items are produced on the calling thread */
    int prefetch;         /* batches produced ahead (bounded queue), 2 per worker when 0 */
    bool drop_last;       /* false: the last, short batch is kept */
} kiln_loader_config;

kiln_loader_config kiln_loader_config_default(void);

typedef struct kiln_loader kiln_loader;

/** One batch: x f32 [n, shape...]; y i64 [n] (classes), f32 [n, target_numel] or NULL. */
typedef struct kiln_batch {
    kiln_tensor *x;
    kiln_tensor *y;
    int64_t n;
    int64_t index;        /* batch number within the epoch */
} kiln_batch;

/** A loader over ds (a reference is taken) producing tensors on dev. */
kiln_loader *kiln_loader_create(kiln_dataset *ds, const kiln_loader_config *cfg, kiln_device *dev);
/** Batches per epoch under the last-batch policy. */
int64_t kiln_loader_batches(const kiln_loader *ld);
/**
 * Begin epoch (any number, in any order), from batch first_batch (for a resume in the
 * middle of an epoch). Stops any epoch still running. 0 or -1.
 */
int kiln_loader_start(kiln_loader *ld, int64_t epoch, int64_t first_batch);
/** The next batch: 1 with *out filled (tensors owned by the innermost scope, or by the
 *  caller when none is open), 0 at the end of the epoch, -1 plus a message on error. */
int kiln_loader_next(kiln_loader *ld, kiln_batch *out);
/** Stop the workers and free. NULL is a no-op. */
void kiln_loader_free(kiln_loader *ld);

/** The permutation the loader uses for (seed, epoch): out[n], a pure function of both. */
void kiln_data_permutation(uint64_t seed, int64_t epoch, int64_t n, int64_t *out);

KILN_API_END

#ifdef __cplusplus
}
#endif
#endif /* KILN_DATA_H */
