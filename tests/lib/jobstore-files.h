/*
 * tests/lib/jobstore-files.h — removing a test's job store: the SQLite file, its WAL and
 * shared-memory files, and the temporary folder that held them (the job store tests each
 * make one under a mkdtemp folder).
 */
#ifndef KILN_TESTS_JOBSTORE_FILES_H
#define KILN_TESTS_JOBSTORE_FILES_H

#include <stdio.h>
#include <unistd.h>

static inline void jobstore_files_remove(const char *db, const char *dir)
{
    char path[256];
    const char *suffixes[] = {"", "-wal", "-shm"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s%s", db, suffixes[i]);
        unlink(path);
    }
    rmdir(dir);
}

#endif /* KILN_TESTS_JOBSTORE_FILES_H */
