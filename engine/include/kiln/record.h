/*
 * kiln/record.h — tensors on disk: the safetensors format, records (a module's tensors
 * plus its JSON config, version-tolerant loading) and training checkpoints. Records and
 * checkpoints are described in their own sections below.
 *
 *     kiln_safetensors *st = kiln_safetensors_open("model.safetensors");
 *     if (!st) { fprintf(stderr, "%s\n", kiln_error()); return 1; }
 *     kiln_tensor *w = kiln_safetensors_load(st, "fc.weight", dev);
 *     kiln_safetensors_close(st);   // loaded tensors keep what they need; closing is safe
 *
 *     kiln_tensor *ts[] = {w, b};
 *     const char *names[] = {"fc.weight", "fc.bias"};
 *     kiln_safetensors_save("out.safetensors", 2, names, ts, 0, NULL, NULL);
 *
 * Files are untrusted input. Opening one checks everything before any tensor is read:
 * the header length against the file, the header is a JSON object of entries with a
 * known dtype, a shape of non-negative integers and two offsets inside the data area,
 * shape × dtype size equal to the byte range, no duplicate names, ranges that neither
 * overlap nor leave holes (as the reference implementation requires), __metadata__
 * holding only strings and no key twice, and the whole header valid UTF-8 (names, keys
 * and values included). Anything else is refused with a message naming the file, the
 * entry and the problem; nothing is ever read out of bounds. Only regular files are
 * opened: a FIFO, a device or a folder is refused at once ("not a regular file"), never
 * waited on.
 *
 * Writing goes to a temporary name in the same folder, is fsynced, renamed over the
 * destination and the folder fsynced, so a crash leaves either the old file or the new
 * one, never a torn one.
 */
#ifndef KILN_RECORD_H
#define KILN_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

KILN_API_BEGIN

/** An opened, validated safetensors file. */
typedef struct kiln_safetensors kiln_safetensors;

/**
 * Open and validate a file. NULL plus kiln_error() when it cannot be read or is malformed.
 * Only the header is read; the handle keeps the file open, and each load reads its tensor
 * into memory the tensor owns. A loaded tensor therefore never changes, and never faults,
 * when the file is later rewritten in place, truncated or removed.
 */
kiln_safetensors *kiln_safetensors_open(const char *path);
/**
 * Open a file memory-mapped, for zero-copy loads (see kiln_safetensors_load): opening a
 * many-gigabyte model costs page-table entries, and pages are read only when touched.
 * The contract: the file must not be modified in place or truncated while this handle or
 * any tensor it lent lives. A change in place shows up in those tensors' values, and
 * truncating the file kills the process with SIGBUS when a lent page is touched. Replacing
 * the file by rename (what kiln's own writers do) is safe. When in doubt, use
 * kiln_safetensors_open.
 */
kiln_safetensors *kiln_safetensors_open_mapped(const char *path);
/**
 * Validate bytes already in memory (for network payloads and fuzzing). The bytes are
 * not copied: they must outlive the handle.
 */
kiln_safetensors *kiln_safetensors_open_memory(const void *data, size_t len);
void kiln_safetensors_close(kiln_safetensors *st);

/** Number of tensors in the file. */
int kiln_safetensors_count(const kiln_safetensors *st);
/** Name of tensor i (0 <= i < count), in header order; NULL when out of range. */
const char *kiln_safetensors_name(const kiln_safetensors *st, int i);
/** Index of the tensor called name, or -1. */
int kiln_safetensors_find(const kiln_safetensors *st, const char *name);
/**
 * Describe tensor i: its dtype (or -1 when the file's dtype has no kiln equivalent,
 * e.g. I16), rank and shape (shape must hold KILN_MAX_DIMS entries). Returns 0 or -1.
 */
int kiln_safetensors_info(const kiln_safetensors *st, int i, int *dtype, int *ndim, int64_t *shape);
/** The file's dtype string of tensor i ("F32", "I16", ...). */
const char *kiln_safetensors_dtype_string(const kiln_safetensors *st, int i);
/**
 * The named tensor on dev, owning its memory: it stays valid after kiln_safetensors_close
 * and two loads never alias. NULL plus a message when absent, not loadable (a dtype kiln
 * has no equivalent of), or when the file no longer holds the bytes (it shrank after it
 * was opened). The exception is a handle from kiln_safetensors_open_mapped: there the first
 * load of an entry onto a host-memory device (cpu, ref) uses the mapped bytes in place when
 * they are 64-byte aligned (kiln's writer aligns the data area): no copy, under that
 * function's contract. The mapping is private: writing to such a tensor never changes the
 * file. Later loads of the same entry are copies.
 */
kiln_tensor *kiln_safetensors_load(const kiln_safetensors *st, const char *name, kiln_device *dev);
/** How many tensors this handle has lent without a copy so far (0 unless it was opened
 *  with kiln_safetensors_open_mapped). */
int kiln_safetensors_zero_copy_count(const kiln_safetensors *st);
/** The __metadata__ value for key, or NULL. */
const char *kiln_safetensors_metadata(const kiln_safetensors *st, const char *key);
/** Number of __metadata__ entries, and the i-th key. */
int kiln_safetensors_metadata_count(const kiln_safetensors *st);
const char *kiln_safetensors_metadata_key(const kiln_safetensors *st, int i);

/**
 * Write n named tensors (any device, any layout) and nmeta metadata pairs to path,
 * atomically (see above). Names must be unique, non-empty and valid UTF-8; metadata keys
 * unique, and keys and values valid UTF-8 (Python's reader refuses anything else, and
 * readers disagree on which of two equal keys wins). Returns 0, or a negative code plus a
 * message naming the offending name or key; on failure the destination is untouched. A
 * new file gets mode 0666 under the umask; a replaced file keeps its permission bits.
 */
int kiln_safetensors_save(const char *path, int n, const char *const *names, kiln_tensor *const *tensors,
                          int nmeta, const char *const *meta_keys, const char *const *meta_values);

/* ===================================================================== records
 *
 * A record is a module's saved state: named tensors plus the module's JSON config, in one
 * file. The file is a safetensors file whose __metadata__ holds "kiln.record" = "1" and
 * "kiln.config" = the config text, so any safetensors reader can open it. With
 * KILN_RECORD_ZSTD the whole file is zstd-compressed behind an 8-byte magic "KILNZSTD" and
 * the uncompressed size; kiln_record_open detects either form.
 *
 *     const char *names[] = {"fc.weight", "fc.bias"};
 *     kiln_tensor *ts[] = {w, b};
 *     kiln_record_save("fc.kiln", 2, names, ts, "{\"in\":4,\"out\":2}", KILN_RECORD_ZSTD);
 *
 *     kiln_record *rec = kiln_record_open("fc.kiln");
 *     kiln_record_slot slots[] = {
 *         {.name = "fc.weight", .dtype = KILN_F32, .ndim = 2, .shape = {2, 4}},
 *         {.name = "fc.bias", .dtype = KILN_F32, .ndim = 1, .shape = {2}},
 *     };
 *     kiln_tensor *out[2];
 *     kiln_record_report rep;
 *     if (kiln_record_load_slots(rec, 2, slots, dev, KILN_RECORD_LENIENT, out, &rep) != 0) ...
 *     // rep.missing / rep.unexpected list what did not match; rep.converted the casts made
 *     kiln_record_report_free(&rep);
 *     kiln_record_close(rec);
 *
 * Loading is version tolerant: a file written by an older or newer model may lack tensors
 * the code expects (missing) or carry tensors it no longer has (unexpected). Strict mode
 * refuses both; lenient mode loads what matches and lists the rest. A stored dtype that
 * differs from the slot's is converted (an f16 file into an f32 slot); a shape that
 * differs is always an error naming the key, since no conversion could be right.
 */

/** kiln_record_save flags. */
enum {
    KILN_RECORD_ZSTD = 1 << 0, /* compress the whole record with zstd */
};

/** An opened record: validated, its tensors readable through kiln_record_tensors. */
typedef struct kiln_record kiln_record;

/**
 * Write n named tensors and a JSON config (NULL for "{}"; it must be one JSON object with
 * nothing but whitespace after it) to path, atomically. flags: 0 or KILN_RECORD_ZSTD. 0, or
 * a negative code plus kiln_error().
 */
int kiln_record_save(const char *path, int n, const char *const *names, kiln_tensor *const *tensors,
                     const char *config_json, unsigned flags);
/**
 * Open and validate a record (compressed or not). NULL plus kiln_error() on any problem; a
 * path that is not a regular file (a FIFO, a folder) is refused at once. Tensors loaded
 * from the record own their memory, as kiln_safetensors_open's do.
 */
kiln_record *kiln_record_open(const char *path);
/** Open a record image already in memory (copied, so data may be freed afterwards). */
kiln_record *kiln_record_open_memory(const void *data, size_t len);
void kiln_record_close(kiln_record *rec);
/** The JSON config text stored with the tensors ("{}" when the file had none). */
const char *kiln_record_config(const kiln_record *rec);
/** True when the file on disk was zstd-compressed. */
bool kiln_record_compressed(const kiln_record *rec);
/** The tensors, as a safetensors handle owned by the record (names, shapes, loads). */
const kiln_safetensors *kiln_record_tensors(const kiln_record *rec);

/** Load strictness: strict errors on missing or unexpected keys; lenient lists them. */
typedef enum kiln_record_mode {
    KILN_RECORD_STRICT = 0,
    KILN_RECORD_LENIENT,
} kiln_record_mode;

/** What the caller expects under one name. */
typedef struct kiln_record_slot {
    const char *name;
    int dtype;                     /* kiln_dtype to convert into, or -1 to keep the stored one;
                                      anything else is an error */
    int ndim;                      /* -1: accept any shape */
    int64_t shape[KILN_MAX_DIMS];
    bool optional;                 /* missing is fine even in strict mode (e.g. a new buffer) */
} kiln_record_slot;

/** What a load found; arrays of malloc'd names, freed by kiln_record_report_free. */
typedef struct kiln_record_report {
    int nmissing;
    char **missing;     /* slots with no tensor in the file (their out[i] is NULL) */
    int nunexpected;
    char **unexpected;  /* tensors in the file no slot asked for */
    int nconverted;
    char **converted;   /* slots whose dtype was converted on load */
} kiln_record_report;

/**
 * Load n slots into out[0..n-1] (new references). On error every out[i] is NULL and the
 * message names the offending key(s): a shape mismatch always; missing (non-optional) or
 * unexpected keys in strict mode. report may be NULL; when given it is filled even on error
 * and must be freed with kiln_record_report_free.
 */
int kiln_record_load_slots(const kiln_record *rec, int n, const kiln_record_slot *slots, kiln_device *dev,
                           kiln_record_mode mode, kiln_tensor **out, kiln_record_report *report);
void kiln_record_report_free(kiln_record_report *report);

/* ================================================================= checkpoints
 *
 * A checkpoint is one folder under a checkpoint root, <root>/step-000001200/, holding
 *   model.kiln       the model record (tensors + config)
 *   optimizer.kiln   the optimizer state record (tensors + its JSON)
 *   trainer.json     progress (epoch, step), RNG generators, scheduler state
 *   metrics.json     the metric history (any JSON the trainer keeps)
 *   MANIFEST         written last: a checksum line, then JSON with the size and xxHash64
 *                    of every other file, the step, epoch and the latest metric values
 * It is written into <root>/.tmp-step-*, each file fsynced, the manifest last, then the
 * folder is fsynced, renamed into place and the root fsynced. A folder whose manifest is
 * missing, malformed or does not match the files is never chosen; a crash at any instant
 * leaves the last completed checkpoint loadable.
 *
 *     kiln_ckpt_state s = {.step = 1200, .epoch = 3, .model_n = n, .model_names = names,
 *                                .model_tensors = ts, .model_config = spec};
 *     if (kiln_ckpt_save("var/checkpoints/job-7", &s, NULL, 0) != 0) ...
 *     kiln_ckpt *ck = kiln_ckpt_open_latest("var/checkpoints/job-7", NULL, NULL);
 *     kiln_record_load_slots(kiln_ckpt_model(ck), ...);
 *     kiln_ckpt_close(ck);
 *
 * The names say "ckpt" to stay apart from kiln_checkpoint() in kiln/autodiff.h, which is
 * activation checkpointing (recompute in backward), an unrelated idea.
 *
 * One writer per root at a time (the job's storage thread); readers may run concurrently.
 */

/** Everything a training loop needs to resume. Pointers are borrowed for the call. */
typedef struct kiln_ckpt_state {
    int64_t step;
    int64_t epoch;
    int model_n;
    const char *const *model_names;
    kiln_tensor *const *model_tensors;
    const char *model_config;        /* JSON; NULL for {} */
    int optim_n;
    const char *const *optim_names;
    kiln_tensor *const *optim_tensors;
    const char *optim_config;        /* JSON (hyper-parameters, step counts); NULL for {} */
    const char *scheduler_json;      /* NULL for {} */
    int rng_n;
    const kiln_generator *rng;
    const char *metrics_json;        /* history; NULL for [] */
    int metric_n;                    /* latest values, used by keep-best retention; any double,
                                        inf and NaN included (a diverged loss): JSON has no such
                                        numbers, so the manifest holds them as the strings "inf",
                                        "-inf" and "nan", and they read back as written */
    const char *const *metric_names;
    const double *metric_values;
    unsigned record_flags;           /* KILN_RECORD_ZSTD to compress the two records */
} kiln_ckpt_state;

/**
 * Write a checkpoint for state->step under root (created when missing). A checkpoint of the
 * same step already there is replaced. path_out (may be NULL) receives the final folder.
 * step and epoch must lie in 0..2^53 (the manifest stores them as JSON numbers, exact up
 * to there); the JSON texts must each be one JSON value with nothing after it. 0, or a
 * negative code with kiln_error(); on failure no temporary folder remains and the earlier
 * checkpoints are untouched.
 */
int kiln_ckpt_save(const char *root, const kiln_ckpt_state *state, char *path_out, size_t len);

/** An opened, verified checkpoint. */
typedef struct kiln_ckpt kiln_ckpt;

/** Open one checkpoint folder, verifying the manifest and every file's checksum. */
kiln_ckpt *kiln_ckpt_open(const char *dir);
/** Called for each folder kiln_ckpt_open_latest passes over, with the reason. */
typedef void (*kiln_ckpt_skip_fn)(const char *path, const char *why, void *user);
/**
 * Open the newest checkpoint under root that verifies; skipped (damaged, partial) folders
 * are reported to skip when given. NULL with kiln_error() when none is usable.
 */
kiln_ckpt *kiln_ckpt_open_latest(const char *root, kiln_ckpt_skip_fn skip, void *user);
void kiln_ckpt_close(kiln_ckpt *ck);
const char *kiln_ckpt_path(const kiln_ckpt *ck);
int64_t kiln_ckpt_step(const kiln_ckpt *ck);
int64_t kiln_ckpt_epoch(const kiln_ckpt *ck);
const kiln_record *kiln_ckpt_model(const kiln_ckpt *ck);
const kiln_record *kiln_ckpt_optimizer(const kiln_ckpt *ck);
/** JSON texts, owned by the checkpoint. */
const char *kiln_ckpt_scheduler(const kiln_ckpt *ck);
const char *kiln_ckpt_metrics_history(const kiln_ckpt *ck);
/** Copy up to max generators into out; returns how many the checkpoint holds. */
int kiln_ckpt_rng(const kiln_ckpt *ck, kiln_generator *out, int max);
/** The latest value of a metric (inf and NaN as saved); 0, or -1 when the checkpoint has
 *  none by that name. */
int kiln_ckpt_metric(const kiln_ckpt *ck, const char *name, double *value);

/** One folder under a root, as kiln_ckpt_list sees it. */
typedef struct kiln_ckpt_info {
    char *path;
    int64_t step;        /* -1 when unknown (no readable manifest) */
    int64_t epoch;
    bool valid;
    char *why;           /* why it is not valid; NULL when valid */
    bool has_metric;     /* the metric asked of kiln_ckpt_list was recorded */
    double metric;
} kiln_ckpt_info;

/**
 * List the checkpoint folders under root (finished and partial), oldest step first.
 * verify: also check every file's checksum (reads everything); otherwise only the
 * manifest. metric (may be NULL) fills has_metric/metric. 0 or a negative code.
 */
int kiln_ckpt_list(const char *root, bool verify, const char *metric, kiln_ckpt_info **out,
                         int *n);
void kiln_ckpt_list_free(kiln_ckpt_info *list, int n);

/** Which checkpoints kiln_ckpt_retain keeps. */
typedef struct kiln_ckpt_retention {
    int keep_last;           /* the newest K valid checkpoints (0 keeps none by age) */
    const char *best_metric; /* NULL: no keep-best */
    bool best_max;           /* true: higher is better (accuracy); false: lower (loss) */
    int keep_best;           /* how many of the best to keep (default 1 when best_metric set);
                                a NaN metric is worst either way and never kept as a best */
    bool remove_damaged;     /* also remove folders that fail verification and stale temp folders */
} kiln_ckpt_retention;

/**
 * Apply a retention policy; removed (may be NULL) receives the count removed. 0 or negative.
 * The newest checkpoint that verifies (every file's checksum, not the manifest alone) is
 * always kept: without remove_damaged, checkpoints are judged by their manifests except
 * from the newest down to the first that verifies, whose files are checked too.
 */
int kiln_ckpt_retain(const char *root, const kiln_ckpt_retention *policy, int *removed);

/* ------------------------------------------------------------------ PyTorch import */

/*
 * Weights saved by torch.save (the zip format of PyTorch >= 1.6), read without Python:
 *
 *     const char *from[] = {"^model\\.", "^fc\\.(.*)"}, *to[] = {"", "head.\\1"};
 *     const char *skip[] = {"num_batches_tracked$"};
 *     kiln_torch_options o = {.n_renames = 2, .rename_patterns = from,
 *                             .rename_replacements = to, .n_skips = 1, .skip_patterns = skip};
 *     kiln_torch_file *pt = kiln_torch_open("resnet18.pt", &o);
 *     kiln_tensor *w = kiln_torch_load(pt, "conv1.weight", dev);
 *     kiln_torch_close(pt);
 *
 * The file's data.pkl is interpreted by a restricted unpickler that runs no code and
 * resolves only the globals a state_dict needs (collections.OrderedDict,
 * torch._utils._rebuild_tensor[_v2], _rebuild_parameter[_with_state], torch.*Storage);
 * any other global refuses the file (a whole pickled nn.Module among them: save
 * model.state_dict() instead). Nested dicts (a checkpoint {"model": state_dict,
 * "epoch": 3}) and lists are flattened to dotted names ("model.layer1.0.conv1.weight");
 * other leaves (ints, floats, strings) are listed separately. Every tensor view is
 * checked against its storage record before anything is read, and a view reaching
 * outside its storage refuses the file; tensors load as contiguous copies with the
 * file's dtype and shape. A tensor kiln cannot load does not refuse the file: it is
 * listed, the others load, and only kiln_torch_load of that one fails, naming it and the
 * reason. That covers a dtype kiln has no equivalent of (int8, int16, complex, float8:
 * kiln_torch_info gives dtype -1), an expand()ed view (stride 0, more elements than its
 * storage: save x.contiguous()) and more than KILN_MAX_DIMS dimensions (kiln_torch_info
 * fails too, as the shape does not fit). Big-endian files, the legacy non-zip format and
 * TorchScript archives are refused with a message saying so.
 *
 * Names are rewritten on open: skip patterns (POSIX extended regexes) drop every entry
 * whose name as stored in the file matches; then each rename rule, in order, replaces
 * all matches of its pattern in the current name, with \0-\9 in the replacement
 * standing for the match and its groups. Two entries renamed to one name is an error.
 */
typedef struct kiln_torch_file kiln_torch_file;

typedef struct kiln_torch_options {
    int n_renames;
    const char *const *rename_patterns;     /* n_renames regexes */
    const char *const *rename_replacements; /* n_renames replacements */
    int n_skips;
    const char *const *skip_patterns;       /* n_skips regexes */
} kiln_torch_options;

/** Open a .pt/.pth file; opts may be NULL. NULL plus kiln_error() when refused. */
kiln_torch_file *kiln_torch_open(const char *path, const kiln_torch_options *opts);
/** The same from bytes in memory (not copied: they must outlive the handle). */
kiln_torch_file *kiln_torch_open_memory(const void *data, size_t len, const kiln_torch_options *opts);
void kiln_torch_close(kiln_torch_file *pt);

/** Number of tensors (after skipping), in the order the file stores them. */
int kiln_torch_count(const kiln_torch_file *pt);
/** Name of tensor i after renaming; NULL when out of range. */
const char *kiln_torch_name(const kiln_torch_file *pt, int i);
/** Name of tensor i as stored in the file (before renaming). */
const char *kiln_torch_source_name(const kiln_torch_file *pt, int i);
/** Index of the tensor called name (after renaming), or -1. */
int kiln_torch_find(const kiln_torch_file *pt, const char *name);
/**
 * Describe tensor i: dtype (-1 when torch's dtype has no kiln equivalent, e.g. int16),
 * rank and shape (KILN_MAX_DIMS entries). Returns 0, or -1 plus a message when i is out of
 * range or the tensor has more than KILN_MAX_DIMS dimensions.
 */
int kiln_torch_info(const kiln_torch_file *pt, int i, int *dtype, int *ndim, int64_t *shape);
/** torch's storage class of tensor i ("FloatStorage", "ShortStorage", ...). */
const char *kiln_torch_storage_type(const kiln_torch_file *pt, int i);
/** A contiguous copy of the named tensor on dev. NULL plus a message when absent or unloadable
 *  (see above), or when pt or dev is NULL. */
kiln_tensor *kiln_torch_load(const kiln_torch_file *pt, const char *name, kiln_device *dev);

/** Non-tensor leaves (after skipping and renaming): count, name, value as Python prints it. */
int kiln_torch_other_count(const kiln_torch_file *pt);
const char *kiln_torch_other_name(const kiln_torch_file *pt, int i);
const char *kiln_torch_other_value(const kiln_torch_file *pt, int i);

KILN_API_END

#ifdef __cplusplus
}
#endif
#endif /* KILN_RECORD_H */
