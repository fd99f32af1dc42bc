/*
 * daemon/folders.c — the files and folders a start reads and writes, checked the same way by a
 * start and by --check-config: the log file, the model folders (model_repository,
 * example_models), the data folder and its lock.
 *
 * A check leaves nothing behind that a start would not: what it creates to find out whether it
 * can (a log file, a missing data folder, the write probe) it removes again.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"

#define LOCK_FILE "kilnd.lock"

/* "uid 1000 (kiln), gid 0 (root)": who kilnd runs as, for messages about permissions. */
static void describe_user(char *out, size_t outlen)
{
    uid_t uid = geteuid();
    gid_t gid = getegid();
    struct passwd *pw = getpwuid(uid);
    struct group *gr = getgrgid(gid);
    snprintf(out, outlen, "uid %ld (%s), gid %ld (%s)", (long)uid, pw ? pw->pw_name : "no passwd entry", (long)gid,
             gr ? gr->gr_name : "no group entry");
}

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

int kd_daemon_check_log_file(const char *path, char *err, size_t errlen)
{
    if (!path || !path[0])
        return 0;
    /* O_NONBLOCK: a FIFO with no reader yet answers ENXIO here instead of blocking the check */
    int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC | O_NONBLOCK);
    bool created = false;
    if (fd < 0 && errno == ENOENT) {
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666); /* as kd_log_open makes it */
        created = fd >= 0;
    }
    int saved = errno;
    if (fd >= 0)
        close(fd);
    if (created)
        unlink(path);
    if (fd >= 0 || saved == ENXIO || saved == EEXIST) /* EEXIST: someone else created it meanwhile */
        return 0;
    /* the words kd_log_open uses when the start fails the same way */
    snprintf(err, errlen, "log_file: cannot open %s: %s", path, strerror(saved));
    return -1;
}

char *kd_daemon_models_root(const struct kd_config *cfg)
{
    if (cfg->model_repository && cfg->model_repository[0])
        return strdup(cfg->model_repository);
    return join(cfg->data_dir, "models");
}

char *kd_daemon_job_store_path(const struct kd_config *cfg)
{
    return join(cfg->data_dir, "kiln.db");
}

/* key's folder must be one kilnd can list; missing is fine only where kilnd creates it. */
static int check_folder(const char *key, const char *path, bool may_be_missing, const char *missing_hint,
                        char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        int saved = errno;
        if ((saved == ENOENT || saved == ENOTDIR) && may_be_missing)
            return 0;
        char dangling[600];
        if (saved == ENOENT && kd_daemon_dangling_link(path, dangling, sizeof dangling)) {
            snprintf(err, errlen, "%s %s is %s%s", key, path, dangling, missing_hint);
            return -1;
        }
        if (saved == ENOENT || saved == ENOTDIR) {
            snprintf(err, errlen, "%s %s does not exist%s", key, path, missing_hint);
            return -1;
        }
        char who[160];
        describe_user(who, sizeof who);
        snprintf(err, errlen, "%s %s cannot be read by kilnd, running as %s: %s", key, path, who, strerror(saved));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "%s %s is not a folder", key, path);
        return -1;
    }
    DIR *d = opendir(path);
    if (!d) {
        int saved = errno;
        char who[160];
        describe_user(who, sizeof who);
        snprintf(err, errlen, "%s %s cannot be read by kilnd, running as %s: %s", key, path, who, strerror(saved));
        return -1;
    }
    closedir(d);
    return 0;
}

int kd_daemon_check_model_folders(const struct kd_config *cfg, char *err, size_t errlen)
{
    bool configured = cfg->model_repository && cfg->model_repository[0];
    char *root = kd_daemon_models_root(cfg);
    if (!root) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    /* A configured repository is served as it is: kilnd never creates it, so a mistyped path
     * stops the start instead of serving an empty folder made on the spot. */
    int rc = check_folder(configured ? "model_repository" : "data_dir: model folder", root, !configured,
                          ": kilnd serves a model_repository as it finds it and never creates one; create it, or "
                          "leave model_repository empty to serve <data_dir>/models",
                          err, errlen);
    free(root);
    if (rc == 0 && cfg->example_models && cfg->example_models[0])
        rc = check_folder("example_models", cfg->example_models, false,
                          " (a folder of <name>/<version>/ model folders, copied into <data_dir>/models)", err,
                          errlen);
    return rc;
}

/* Creates one folder of the path. 0777: the umask alone decides what group and others get (0002 in
 * the image, so that another uid in group 0 can use the folder later), and the kernel applies it,
 * so no thread has to read or change the process-wide umask. */
static int make_folder(const char *path, char *err, size_t errlen)
{
    if (mkdir(path, 0777) == 0)
        return 1;
    if (errno == EEXIST)
        return 0;
    int saved = errno;
    char who[160];
    describe_user(who, sizeof who);
    snprintf(err, errlen, "data_dir: cannot create %s as %s: %s", path, who, strerror(saved));
    return -1;
}

/* The data folder must take new files before kilnd binds: a folder mounted read-only or owned by
 * another user would otherwise fail later, after "listening", with a bare EACCES. The probe is a
 * real create and unlink, so read-only mounts, ACLs and SELinux labels count, not only mode bits. */
size_t kd_daemon_dangling_link(const char *path, char *out, size_t len)
{
    struct stat st;
    char target[512];
    ssize_t n;
    out[0] = '\0';
    if (lstat(path, &st) != 0 || !S_ISLNK(st.st_mode) || stat(path, &st) == 0 || errno != ENOENT ||
        (n = readlink(path, target, sizeof target - 1)) < 0)
        return 0;
    target[n] = '\0';
    return (size_t)snprintf(out, len, "a symbolic link to %s, which does not exist", target);
}

static int check_writable(const char *dir, char *err, size_t errlen)
{
    size_t n = strlen(dir) + 48;
    char *probe = malloc(n);
    if (!probe) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    snprintf(probe, n, "%s/.kilnd-write-probe-%ld", dir, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    int saved = errno;
    if (fd >= 0) {
        close(fd);
        unlink(probe);
    }
    free(probe);
    if (fd >= 0)
        return 0;
    if (saved == EROFS) {
        /* no owner or mode mends this one */
        snprintf(err, errlen,
                 "data_dir %s is on a read-only file system: mount it read-write, or choose another "
                 "data_dir",
                 dir);
        return -1;
    }
    char who[160];
    describe_user(who, sizeof who);
    snprintf(err, errlen,
             "data_dir %s is not writable by kilnd, running as %s: %s. Make it writable by that user or group "
             "(chown, or chmod g+w for a group-0 folder under an arbitrary uid), or choose another data_dir",
             dir, who, strerror(saved));
    return -1;
}

int kd_daemon_make_data_dir(const char *dir, bool check_only, char *err, size_t errlen)
{
    char *copy = strdup(dir);
    if (!copy) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = 0;
    size_t first_made = 0; /* length of the shortest prefix this call created; 0: none */
    for (char *p = copy + 1; rc == 0; p++) {
        bool end = *p == '\0';
        if (*p != '/' && !end)
            continue;
        *p = '\0';
        int made = make_folder(copy, err, errlen);
        if (made < 0)
            rc = -1;
        else if (made && !first_made)
            first_made = strlen(copy);
        if (end)
            break;
        *p = '/';
    }
    struct stat st;
    if (rc == 0 && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))) {
        char dangling[600];
        if (kd_daemon_dangling_link(dir, dangling, sizeof dangling))
            snprintf(err, errlen, "data_dir: %s is %s: create that folder, or point the link at one", dir,
                     dangling);
        else
            snprintf(err, errlen, "data_dir: %s is not a folder", dir);
        rc = -1;
    }
    if (rc == 0)
        rc = check_writable(dir, err, errlen);
    /* a check removes the folders it made, deepest first, up to the first it made */
    if (check_only && first_made) {
        snprintf(copy, strlen(dir) + 1, "%s", dir);
        for (size_t len = strlen(copy); len >= first_made && len > 0;) {
            rmdir(copy);
            char *slash = strrchr(copy, '/');
            if (!slash)
                break;
            *slash = '\0';
            len = strlen(copy);
        }
    }
    free(copy);
    return rc;
}

/* The pid a running kilnd wrote into its lock file, or -1 when the file holds none. */
static long lock_owner_pid(int fd)
{
    char text[32];
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    if (n <= 0)
        return -1;
    text[n] = '\0';
    char *end;
    long pid = strtol(text, &end, 10);
    return pid > 0 && (*end == '\n' || *end == '\0') ? pid : -1;
}

/* 1 when an open file description other than fd's holds the lock, 0 when none does, -1 on error.
 * F_OFD_GETLK only asks: it takes nothing, so --check-config never stands in a start's way. */
static int lock_held_elsewhere(int fd)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0)
        return -1;
    return fl.l_type != F_UNLCK;
}

static void in_use_message(const char *dir, long pid, char *err, size_t errlen)
{
    char who[32] = "pid unknown";
    if (pid > 0)
        snprintf(who, sizeof who, "pid %ld", pid);
    snprintf(err, errlen,
             "data_dir %s is in use by another kilnd (%s): two would run the same jobs and overwrite each "
             "other's files. Stop that one first, or give this one its own data_dir",
             dir, who);
}

/* The pid in dir's lock file, when it can be read and holds one; -1 otherwise. */
static long lock_file_pid(const char *dir)
{
    char *path = join(dir, LOCK_FILE);
    int fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    free(path);
    long pid = fd >= 0 ? lock_owner_pid(fd) : -1;
    if (fd >= 0)
        close(fd);
    return pid;
}

/* The process holding an flock() on the folder open as fd, from /proc/locks (which names it even
 * after its kilnd.lock was removed); -1 when not found. */
static long folder_lock_pid(int fd)
{
    struct stat st;
    FILE *f = fstat(fd, &st) == 0 ? fopen("/proc/locks", "re") : NULL;
    long found = -1;
    char line[256];
    while (f && found < 0 && fgets(line, sizeof line, f)) {
        char kind[16];
        long pid;
        unsigned maj, min;
        unsigned long ino;
        if (sscanf(line, "%*d: %15s %*s %*s %ld %x:%x:%lu", kind, &pid, &maj, &min, &ino) == 5 &&
            strcmp(kind, "FLOCK") == 0 && pid > 0 && maj == major(st.st_dev) && min == minor(st.st_dev) &&
            ino == (unsigned long)st.st_ino)
            found = pid;
    }
    if (f)
        fclose(f);
    return found;
}

/*
 * The lock on the folder itself. The lock file alone was lost to a user who removed kilnd.lock as
 * a stale file: the next kilnd made a new one, locked that, and ran beside the first. A folder
 * cannot be removed while it holds the data, and flock() takes a folder opened read-only, where
 * fcntl's write locks need a file open for writing. 0 with *folder_fd set, -1 with err when
 * another process holds it, 1 when the file system takes no flock (the file's lock still holds).
 */
static int lock_folder(const char *dir, int *folder_fd, char *err, size_t errlen)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return 1; /* made and checked a moment ago: what fails next says why */
    /* asked a few times: kilnd --check-config holds a shared lock for a moment to ask */
    for (int tries = 0; tries < 5; tries++) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
            *folder_fd = fd;
            return 0;
        }
        if (errno != EWOULDBLOCK) {
            close(fd);
            return 1;
        }
        nanosleep(&(struct timespec){.tv_nsec = 20 * 1000 * 1000}, NULL);
    }
    long pid = folder_lock_pid(fd);
    close(fd);
    in_use_message(dir, pid > 0 ? pid : lock_file_pid(dir), err, errlen);
    return -1;
}

/* 1 when another process holds the folder's lock, 0 when none does or it cannot be told. */
static int folder_locked_elsewhere(const char *dir, long *pid)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    int held = 0;
    if (flock(fd, LOCK_SH | LOCK_NB) == 0)
        flock(fd, LOCK_UN);
    else if (errno == EWOULDBLOCK)
        held = 1;
    *pid = held ? folder_lock_pid(fd) : 0;
    close(fd);
    return held;
}

/* The lock on dir's kilnd.lock, which names this process: as kd_daemon_lock_data_dir returns. */
static int lock_file(const char *dir, int *lock_fd, char *err, size_t errlen)
{
    char *path = join(dir, LOCK_FILE);
    if (!path) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = -1;
    /* 0666 under the umask, as every file kilnd creates: a kilnd run later as another uid of the
     * same group must open it read-write to take the lock */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        /* left by a kilnd that ran as another user: say whether one still holds it */
        int saved = errno;
        int ro = open(path, O_RDONLY | O_CLOEXEC);
        if (ro >= 0 && lock_held_elsewhere(ro) == 1) {
            in_use_message(dir, lock_owner_pid(ro), err, errlen);
        } else {
            char who[160];
            describe_user(who, sizeof who);
            snprintf(err, errlen, "data_dir: cannot open %s as %s: %s%s", path, who, strerror(saved),
                     ro >= 0 ? ". No kilnd holds it now: remove it (it holds only a process id) or run kilnd as "
                               "the user that owns it"
                             : "");
        }
        if (ro >= 0)
            close(ro);
        free(path);
        return -1;
    }
    /* An open-file-description lock: held until the last descriptor of this open goes, which the
     * kernel does when the process ends however it ends, so a killed kilnd never blocks the next. */
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (fcntl(fd, F_OFD_SETLK, &fl) != 0) {
        if (errno == EAGAIN || errno == EACCES) {
            in_use_message(dir, lock_owner_pid(fd), err, errlen);
        } else {
            /* a file system without locks: kilnd runs, but cannot tell whether it runs alone */
            snprintf(err, errlen,
                     "data_dir: cannot lock %s: %s; kilnd cannot tell whether another kilnd uses this data_dir",
                     path, strerror(errno));
            rc = 1;
        }
        close(fd);
        free(path);
        return rc;
    }
    char text[24];
    int len = snprintf(text, sizeof text, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)len, 0) != len) {
        /* the lock holds without the pid; only a refused start's message misses it */
        snprintf(err, errlen, "data_dir: cannot write the process id into %s: %s", path, strerror(errno));
        rc = 1;
    } else {
        rc = 0;
    }
    *lock_fd = fd;
    free(path);
    return rc;
}

int kd_daemon_lock_data_dir(const char *dir, int *lock_fd, int *folder_fd, char *err, size_t errlen)
{
    *lock_fd = -1;
    *folder_fd = -1;
    if (lock_folder(dir, folder_fd, err, errlen) < 0)
        return -1;
    int rc = lock_file(dir, lock_fd, err, errlen);
    if (rc < 0 && *folder_fd >= 0) {
        close(*folder_fd);
        *folder_fd = -1;
    }
    return rc;
}

void kd_daemon_unlock_data_dir(int lock_fd, int folder_fd)
{
    if (folder_fd >= 0)
        close(folder_fd);
    if (lock_fd < 0)
        return;
    /* emptied first, so the file never names a process that has gone */
    if (ftruncate(lock_fd, 0) != 0) {
        /* nothing to do: the next kilnd overwrites it */
    }
    close(lock_fd);
}

long kd_daemon_data_dir_user(const char *dir)
{
    long folder_pid = 0;
    if (folder_locked_elsewhere(dir, &folder_pid))
        return folder_pid > 0 ? folder_pid : -1;
    char *path = join(dir, LOCK_FILE);
    int fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    free(path);
    if (fd < 0)
        return 0;
    long pid = lock_held_elsewhere(fd) == 1 ? lock_owner_pid(fd) : 0;
    close(fd);
    return pid;
}
