/*
 * storage/atomic-file.c — crash-safe replacement of a file.
 *
 * Every file kiln cares about (records, checkpoints, configs it writes) goes through
 * here: written to "<path>.tmp.XXXXXX" in the same folder (so the rename cannot cross
 * file systems), fsynced, renamed over the destination, then the folder fsynced so the
 * rename itself survives a power cut. A reader therefore sees the old file or the new
 * one, never a prefix of the new one.
 *
 * Temporary names carry the writer's pid ("<path>.tmp.<pid>.XXXXXX"), so that a later save
 * of the same destination can tell the leftovers of a killed writer from a live one's.
 *
 * The durable system calls go through kiln__io so tests can make the Nth one fail.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
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

int kiln__open_regular(const char *path, struct stat *sb)
{
    struct stat local;
    sb = sb ? sb : &local;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return -1;
    if (fstat(fd, sb) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    if (!S_ISREG(sb->st_mode)) {
        close(fd);
        return KILN__NOT_REGULAR;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

int kiln__read_file(const char *path, size_t max, char **out, size_t *len)
{
    *out = NULL;
    if (len)
        *len = 0;
    struct stat sb;
    int fd = kiln__open_regular(path, &sb);
    if (fd == KILN__NOT_REGULAR)
        return kiln__error_set("read '%s': not a regular file", path), KILN_EIO;
    if (fd < 0)
        return kiln__error_set("open '%s': %s", path, strerror(errno)), KILN_EIO;
    if ((uint64_t)sb.st_size > max) {
        close(fd);
        return kiln__error_set("read '%s': %lld bytes is over the limit of %zu", path,
                               (long long)sb.st_size, max), KILN_EINVAL;
    }
    size_t n = (size_t)sb.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return kiln__error_set_code(KILN_ENOMEM, "read '%s': out of memory", path);
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
        return kiln__error_set_code(KILN_ENOMEM, "fsync folder of '%s': out of memory", path);
    int rc = kiln__fsync_dir(dirname(copy));
    free(copy);
    return rc;
}

/* ------------------------------------------------------------ temporary names */

/* Replace the six characters at x with random letters and digits (getrandom; a clock and
 * counter mix where it is unavailable: the names need only be unlikely to collide, since
 * every create is exclusive and retried). */
static void random_suffix(char *x)
{
    static const char chars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    static unsigned long counter;
    unsigned char r[6];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t v = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15u ^ (uint64_t)getpid() << 20 ^
                     __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
        for (size_t i = 0; i < sizeof r; i++, v >>= 8)
            r[i] = (unsigned char)v;
    }
    for (size_t i = 0; i < sizeof r; i++)
        x[i] = chars[r[i] % (sizeof chars - 1)];
}

int kiln__mkdir_unique(char *templ)
{
    size_t n = strlen(templ);
    if (n < 6 || strcmp(templ + n - 6, "XXXXXX") != 0) {
        errno = EINVAL;
        return -1;
    }
    for (int tries = 0; tries < 100; tries++) {
        random_suffix(templ + n - 6);
        if (mkdir(templ, 0777) == 0)
            return 0;
        if (errno != EEXIST)
            return -1;
    }
    return -1; /* errno is EEXIST */
}

/* The pid in a temporary name's tail "<pid>.<rest>" or "raw.<pid>.<rest>", or 0. */
static long temp_writer_pid(const char *tail)
{
    if (strncmp(tail, "raw.", 4) == 0)
        tail += 4;
    long pid = 0;
    int digits = 0;
    for (; *tail >= '0' && *tail <= '9' && digits < 10; tail++, digits++)
        pid = pid * 10 + (*tail - '0');
    return digits > 0 && *tail == '.' && tail[1] ? pid : 0;
}

int kiln__remove_stale_temps(const char *path)
{
    char *copy = strdup(path), *copy2 = strdup(path);
    DIR *d = NULL;
    int removed = 0;
    if (!copy || !copy2)
        goto out;
    const char *base = basename(copy2);
    d = opendir(dirname(copy));
    if (!d)
        goto out;
    size_t blen = strlen(base);
    time_t now = time(NULL);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *name = de->d_name;
        if (strncmp(name, base, blen) != 0 || strncmp(name + blen, ".tmp.", 5) != 0)
            continue;
        long pid = temp_writer_pid(name + blen + 5);
        /* kill(pid, 0) fails with ESRCH only when no such process exists; EPERM is a live
         * process of another user */
        if (pid <= 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        struct stat sb;
        if (fstatat(dirfd(d), name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode) ||
            now - sb.st_mtime < KILN__STALE_TEMP_AGE)
            continue;
        if (unlinkat(dirfd(d), name, 0) == 0)
            removed++;
    }
out:
    if (d)
        closedir(d);
    free(copy);
    free(copy2);
    return removed;
}

int kiln__atomic_open(kiln__atomic_file *f, const char *path)
{
    f->fd = -1;
    f->tmp_path = NULL;
    f->final_path = strdup(path);
    size_t len = strlen(path) + sizeof ".tmp..XXXXXX" + 24;
    f->tmp_path = malloc(len);
    if (!f->final_path || !f->tmp_path) {
        kiln__atomic_abort(f);
        return kiln__error_set_code(KILN_ENOMEM, "write '%s': out of memory", path);
    }
    (void)kiln__remove_stale_temps(path);
    int n = snprintf(f->tmp_path, len, "%s.tmp.%ld.XXXXXX", path, (long)getpid());
    /* open(2) rather than mkstemp: O_CREAT applies the umask to 0666 in the kernel, where
     * mkstemp's fixed 0600 would have to be widened by reading the process-wide umask. */
    for (int tries = 0; tries < 100; tries++) {
        random_suffix(f->tmp_path + n - 6);
        f->fd = open(f->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, 0666);
        if (f->fd >= 0 || errno != EEXIST)
            break;
    }
    if (f->fd < 0) {
        kiln__error_set("create a temporary file beside '%s': %s", path, strerror(errno));
        free(f->tmp_path);
        f->tmp_path = NULL; /* nothing was created, so abort must not unlink */
        kiln__atomic_abort(f);
        return KILN_EIO;
    }
    /* Replacing a file keeps its permissions (a private 0600 file stays private). We own
     * the new file, so fchmod fails only where the file system has no modes to keep. */
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode))
        (void)fchmod(f->fd, sb.st_mode & 0777);
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
