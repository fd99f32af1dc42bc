/*
 * storage/atomic-file.c — crash-safe replacement of a file.
 *
 * Every file kiln cares about (records, checkpoints, configs it writes) goes through
 * here: written to "<path>.tmp.XXXXXX" in the same folder (so the rename cannot cross
 * file systems), fsynced, renamed over the destination, then the folder fsynced so the
 * rename itself survives a power cut. A reader therefore sees the old file or the new
 * one, never a prefix of the new one.
 *
 * The durable system calls go through kiln__io so tests can make the Nth one fail.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error-impl.h"
#include "kiln/tensor.h"
#include "storage-impl.h"

static ssize_t sys_write(int fd, const void *buf, size_t n)
{
    return write(fd, buf, n);
}

static int sys_fsync(int fd)
{
    return fsync(fd);
}

static int sys_rename(const char *from, const char *to)
{
    return rename(from, to);
}

kiln__io_ops kiln__io = {.write = sys_write, .fsync = sys_fsync, .rename = sys_rename};

/* ------------------------------------------------------------ fault injection */

static long fault_nth, fault_calls;
static int fault_persistent;

/* True when this call is the one (or, persistent, one of those) chosen to fail. */
static int fault_hit(void)
{
    fault_calls++;
    if (fault_calls == fault_nth || (fault_persistent && fault_calls > fault_nth)) {
        errno = EIO;
        return 1;
    }
    return 0;
}

static ssize_t fault_write(int fd, const void *buf, size_t n)
{
    return fault_hit() ? -1 : write(fd, buf, n);
}

static int fault_fsync(int fd)
{
    return fault_hit() ? -1 : fsync(fd);
}

static int fault_rename(const char *from, const char *to)
{
    return fault_hit() ? -1 : rename(from, to);
}

void kiln__io_fault_set(long nth, int persistent)
{
    fault_nth = nth;
    fault_persistent = persistent;
    fault_calls = 0;
    if (nth > 0)
        kiln__io = (kiln__io_ops){.write = fault_write, .fsync = fault_fsync, .rename = fault_rename};
    else
        kiln__io = (kiln__io_ops){.write = sys_write, .fsync = sys_fsync, .rename = sys_rename};
}

long kiln__io_fault_calls(void)
{
    return fault_calls;
}

/* ------------------------------------------------------------------- folders */

int kiln__fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return kiln__error_set("open folder '%s': %s", dir, strerror(errno)), KILN_EIO;
    int rc = 0;
    if (kiln__io.fsync(fd) != 0 && errno != EINVAL) { /* some file systems cannot fsync folders */
        kiln__error_set("fsync folder '%s': %s", dir, strerror(errno));
        rc = KILN_EIO;
    }
    close(fd);
    return rc;
}

int kiln__remove_tree(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) != 0)
        return errno == ENOENT ? 0 : (kiln__error_set("remove '%s': %s", path, strerror(errno)), KILN_EIO);
    if (!S_ISDIR(sb.st_mode)) {
        if (unlink(path) != 0 && errno != ENOENT)
            return kiln__error_set("remove '%s': %s", path, strerror(errno)), KILN_EIO;
        return 0;
    }
    DIR *d = opendir(path);
    if (!d)
        return kiln__error_set("open folder '%s': %s", path, strerror(errno)), KILN_EIO;
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        size_t len = strlen(path) + strlen(de->d_name) + 2;
        char *child = malloc(len);
        if (!child) {
            rc = KILN_ENOMEM;
            break;
        }
        snprintf(child, len, "%s/%s", path, de->d_name);
        int crc = kiln__remove_tree(child);
        free(child);
        if (crc != 0 && rc == 0)
            rc = crc;
    }
    closedir(d);
    if (rc == 0 && rmdir(path) != 0)
        rc = (kiln__error_set("remove folder '%s': %s", path, strerror(errno)), KILN_EIO);
    return rc;
}

int kiln__write_file_atomic(const char *path, const void *buf, size_t n)
{
    kiln__atomic_file f;
    int rc = kiln__atomic_open(&f, path);
    if (rc != 0)
        return rc;
    rc = kiln__atomic_write(&f, buf, n);
    if (rc != 0) {
        kiln__atomic_abort(&f);
        return rc;
    }
    return kiln__atomic_commit(&f);
}

int kiln__read_file(const char *path, size_t max, char **out, size_t *len)
{
    *out = NULL;
    if (len)
        *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kiln__error_set("open '%s': %s", path, strerror(errno)), KILN_EIO;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return kiln__error_set("read '%s': not a regular file", path), KILN_EIO;
    }
    if ((uint64_t)sb.st_size > max) {
        close(fd);
        return kiln__error_set("read '%s': %lld bytes is over the limit of %zu", path,
                               (long long)sb.st_size, max), KILN_EINVAL;
    }
    size_t n = (size_t)sb.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return kiln__error_set("read '%s': out of memory", path), KILN_ENOMEM;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            kiln__error_set("read '%s': %s", path, r < 0 ? strerror(errno) : "file shrank while reading");
            free(buf);
            close(fd);
            return KILN_EIO;
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *out = buf;
    if (len)
        *len = n;
    return 0;
}

int kiln__fsync_parent(const char *path)
{
    char *copy = strdup(path);
    if (!copy)
        return kiln__error_set("fsync folder of '%s': out of memory", path), KILN_ENOMEM;
    int rc = kiln__fsync_dir(dirname(copy));
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
        ssize_t w = kiln__io.write(f->fd, p, n);
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
    if (kiln__io.fsync(f->fd) != 0) {
        rc = KILN_EIO;
        kiln__error_set("fsync '%s': %s", f->tmp_path, strerror(errno));
    }
    if (close(f->fd) != 0 && rc == 0) {
        rc = KILN_EIO;
        kiln__error_set("close '%s': %s", f->tmp_path, strerror(errno));
    }
    f->fd = -1;
    if (rc == 0 && kiln__io.rename(f->tmp_path, f->final_path) != 0) {
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
