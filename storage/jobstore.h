/*
 * storage/jobstore.h — the job store: <data_dir>/kiln.db, an SQLite database in WAL mode that
 * will hold jobs, job events and the model registry. Opening it applies any migrations the file
 * has not seen yet, each in its own transaction, and records the result in schema_version.
 *
 * Thread affinity: one thread uses a store at a time (the daemon's storage thread, later).
 *
 *     struct kiln_jobstore *js;
 *     char err[256];
 *     if (kiln_jobstore_open(&js, "var/kiln.db", err, sizeof err) != 0) fail(err);
 *     kiln_jobstore_close(js);
 */
#ifndef KILN_STORAGE_JOBSTORE_H
#define KILN_STORAGE_JOBSTORE_H

#include <stddef.h>

struct kiln_jobstore;

/* Creates the file when missing. A file from a newer kiln (higher schema version) is refused. */
int kiln_jobstore_open(struct kiln_jobstore **out, const char *path, char *err, size_t errlen);
int kiln_jobstore_schema_version(const struct kiln_jobstore *js);
/* The newest schema version this build knows. */
int kiln_jobstore_latest_version(void);
void kiln_jobstore_close(struct kiln_jobstore *js);

#endif /* KILN_STORAGE_JOBSTORE_H */
