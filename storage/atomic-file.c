/*
 * storage/atomic-file.c — crash-safe replacement of a file.
 *
 * Every file kiln cares about (records, checkpoints, configs it writes) goes through
 * here: written to "<path>.tmp.XXXXXX" in the same folder (so the rename cannot cross
 * file systems), fsynced, renamed over the destination, then the folder fsynced so the
 * rename itself survives a power cut. A reader therefore sees the old file or the new
 * one, never a prefix of the new one.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error-impl.h"
#include "backend.h"
#include "storage-impl.h"

int kiln__fsync_parent(const char *path)
{
    char *copy = strdup(path);
    if (!copy)
        return kiln__error_set("fsync folder of '%s': out of memory", path), KILN_ENOMEM;
    const char *dir = dirname(copy);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        kiln__error_set("open folder '%s': %s", dir, strerror(errno));
        free(copy);
        return KILN_EIO;
    }
    int rc = 0;
    if (fsync(fd) != 0 && errno != EINVAL) { /* some file systems cannot fsync folders */
        kiln__error_set("fsync folder '%s': %s", dir, strerror(errno));
        rc = KILN_EIO;
    }
    close(fd);
    free(copy);
    return rc;
}

int kiln__atomic_open(kiln__atomic_file *f, const char *path)
{
    f->fd = -1;
    f->tmp_path = NULL;
    f->final_path = strdup(path);
    size_t len = strlen(path) + sizeof ".tmp.XXXXXX";
    f->tmp_path = malloc(len);
    if (!f->final_path || !f->tmp_path) {
        kiln__atomic_abort(f);
        return kiln__error_set("write '%s': out of memory", path), KILN_ENOMEM;
    }
    snprintf(f->tmp_path, len, "%s.tmp.XXXXXX", path);
    f->fd = mkostemp(f->tmp_path, O_CLOEXEC);
    if (f->fd < 0) {
        kiln__error_set("create a temporary file beside '%s': %s", path, strerror(errno));
        free(f->tmp_path);
        f->tmp_path = NULL; /* nothing was created, so abort must not unlink */
        kiln__atomic_abort(f);
        return KILN_EIO;
    }
    /* mkstemp creates 0600; records are ordinary data files. */
    (void)fchmod(f->fd, 0644);
    return 0;
}

int kiln__atomic_write(kiln__atomic_file *f, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(f->fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return kiln__error_set("write '%s': %s", f->final_path, strerror(errno)), KILN_EIO;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int kiln__atomic_commit(kiln__atomic_file *f)
{
    int rc = 0;
    if (fsync(f->fd) != 0) {
        rc = KILN_EIO;
        kiln__error_set("fsync '%s': %s", f->tmp_path, strerror(errno));
    }
    if (close(f->fd) != 0 && rc == 0) {
        rc = KILN_EIO;
        kiln__error_set("close '%s': %s", f->tmp_path, strerror(errno));
    }
    f->fd = -1;
    if (rc == 0 && rename(f->tmp_path, f->final_path) != 0) {
        rc = KILN_EIO;
        kiln__error_set("rename '%s' to '%s': %s", f->tmp_path, f->final_path, strerror(errno));
    }
    if (rc == 0) {
        free(f->tmp_path);
        f->tmp_path = NULL; /* renamed: nothing left to clean up */
        rc = kiln__fsync_parent(f->final_path);
    }
    kiln__atomic_abort(f);
    return rc;
}

void kiln__atomic_abort(kiln__atomic_file *f)
{
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
    if (f->tmp_path)
        unlink(f->tmp_path);
    free(f->tmp_path);
    free(f->final_path);
    f->tmp_path = NULL;
    f->final_path = NULL;
}
