/*
 * storage/storage-impl.h — helpers shared by the storage modules (not public).
 */
#ifndef KILN_STORAGE_IMPL_H
#define KILN_STORAGE_IMPL_H

#include <stddef.h>

/**
 * A file being written under a temporary name beside its destination. Commit makes it
 * durable and visible in one step: fsync the data, rename over the destination, fsync
 * the folder. Abort (or a crash at any instant) leaves the destination as it was.
 */
typedef struct kiln__atomic_file {
    int fd;
    char *tmp_path;
    char *final_path;
} kiln__atomic_file;

/** Create the temporary file; 0 or a negative code with the error message set. */
int kiln__atomic_open(kiln__atomic_file *f, const char *path);
/** Write all n bytes (retrying short writes and EINTR). */
int kiln__atomic_write(kiln__atomic_file *f, const void *buf, size_t n);
/** fsync, rename into place, fsync the folder; the handle is finished either way. */
int kiln__atomic_commit(kiln__atomic_file *f);
/** Remove the temporary file; safe after a failed open or commit. */
void kiln__atomic_abort(kiln__atomic_file *f);
/** fsync the folder that holds path (so a rename or create in it is durable). */
int kiln__fsync_parent(const char *path);

#endif /* KILN_STORAGE_IMPL_H */
