/*
 * storage/storage-impl.h — storage's file helpers, internal to libkiln (not installed).
 *
 * The storage modules share them, and the engine writes and reads its own files (training
 * reports, JSON model specs) through them rather than with stdio, so every file libkiln
 * writes is crash-safe the same way and fault injection reaches all of them.
 */
#ifndef KILN_STORAGE_IMPL_H
#define KILN_STORAGE_IMPL_H

#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

/**
 * The system calls that make files durable, behind a replaceable table so that tests can
 * inject I/O faults the way SQLite does: fail the 1st, 2nd, 3rd ... write/fsync/rename and
 * check that each failure is a clean error that leaves no temporary files behind and the
 * previous good state intact. Production code never changes the table.
 */
typedef struct kiln__io_ops {
    ssize_t (*write)(int fd, const void *buf, size_t n);
    int (*fsync)(int fd);
    int (*rename)(const char *from, const char *to);
} kiln__io_ops;

/** The table every storage module calls through (initialized to the plain system calls). */
extern kiln__io_ops kiln__io;

/**
 * Test hook: count every call made through kiln__io and make call number nth (1-based)
 * fail with EIO; with persistent, that call and every later one fail. nth = 0 restores the
 * plain system calls. Not thread-safe: for single-threaded tests only.
 */
void kiln__io_fault_set(long nth, int persistent);
/** Calls counted since the last kiln__io_fault_set (to know when a sweep is complete). */
long kiln__io_fault_calls(void);

/** Remove a folder and everything under it (no symlinks followed). 0 or KILN_EIO. */
int kiln__remove_tree(const char *path);

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

/**
 * Create the temporary file "<path>.tmp.<pid>.<6 random characters>"; 0 or a negative code
 * with the error message set. A new file gets the mode open(2) gives 0666 under the
 * process's umask (the kernel applies it, so no thread reads or changes the umask); a file
 * that replaces an existing regular file takes that file's permission bits, so a private
 * 0600 file stays private. Temporary files of the same destination left by a writer that
 * died (see kiln__remove_stale_temps) are removed first.
 */
int kiln__atomic_open(kiln__atomic_file *f, const char *path);
/** Write all n bytes (retrying short writes and EINTR). */
int kiln__atomic_write(kiln__atomic_file *f, const void *buf, size_t n);
/** fsync, rename into place, fsync the folder; the handle is finished either way. */
int kiln__atomic_commit(kiln__atomic_file *f);
/** Remove the temporary file; safe after a failed open or commit. */
void kiln__atomic_abort(kiln__atomic_file *f);
/** fsync the folder that holds path (so a rename or create in it is durable). */
int kiln__fsync_parent(const char *path);
/** fsync a folder itself (after creating or renaming entries inside it). */
int kiln__fsync_dir(const char *dir);
/**
 * Write a whole small file atomically (atomic_open + write + commit). 0 or a negative code;
 * on failure the destination is untouched and no temporary file remains.
 */
int kiln__write_file_atomic(const char *path, const void *buf, size_t n);
/**
 * Read a whole file (at most max bytes) into a NUL-terminated malloc'd buffer. Anything but
 * a regular file (a FIFO, a device, a folder) is refused at once ("not a regular file").
 */
int kiln__read_file(const char *path, size_t max, char **out, size_t *len);

/** kiln__open_regular's answer for a path that exists but is not a regular file. */
#define KILN__NOT_REGULAR (-2)
/**
 * Open path read-only, refusing what is not a regular file before anything could block:
 * opening a FIFO without a writer (or reading one) waits forever, which in kilnd would stop
 * the event loop. The open is non-blocking, fstat decides, and the flag is cleared again for
 * the regular file. Returns the descriptor (sb filled when given); -1 with errno set when it
 * cannot be opened; KILN__NOT_REGULAR when it is something else. Sets no error message.
 */
int kiln__open_regular(const char *path, struct stat *sb);

/**
 * Create a folder named templ, whose last six characters "XXXXXX" are replaced by random
 * ones (as mkdtemp), with mode 0777 under the umask (mkdtemp's 0700 would make every
 * checkpoint private). 0, or -1 with errno set.
 */
int kiln__mkdir_unique(char *templ);

/** How long a dead writer's temporary file must have been left unmodified before a later
 *  save of the same destination removes it (seconds). */
#define KILN__STALE_TEMP_AGE 600
/**
 * Remove the temporary files a killed save of path left behind: "<path>.tmp.<pid>.*" (a
 * file being written) and "<path>.tmp.raw.<pid>.*" (a compressed record's plain image),
 * when they are regular files, process <pid> no longer exists on this machine, and they
 * have not been modified for KILN__STALE_TEMP_AGE seconds (the age protects a live writer
 * whose pid this machine cannot see, in another pid namespace or on another host sharing
 * the folder). Best effort: errors are ignored. Returns how many were removed.
 */
int kiln__remove_stale_temps(const char *path);

#endif /* KILN_STORAGE_IMPL_H */
