/* file.c - read a whole regular file (file.h). */
#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"

sp_status_t
sp_file_read(const char *path, const char *label, size_t max, char **out, size_t *len, char *err,
             size_t err_len)
{
    *out = NULL;
    *len = 0;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        return sp_errf(err, err_len, errno == ENOENT ? SP_ERR_NOT_FOUND : SP_ERR_IO, "%s: %s",
                       label, strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: not a regular file", label);
    }
    if ((uint64_t)sb.st_size > max) {
        close(fd);
        return sp_errf(err, err_len, SP_ERR_TOO_LARGE, "%s: larger than %zu bytes", label, max);
    }
    char *buf = sp_malloc((size_t)sb.st_size + 1);
    if (!buf) {
        close(fd);
        return sp_errf(err, err_len, SP_ERR_NOMEM, "%s: out of memory", label);
    }
    size_t got = 0;
    while (got < (size_t)sb.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)sb.st_size - got);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            break; /* shrank while we read: what is there */
        }
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';
    *out = buf;
    *len = got;
    return SP_OK;
}

bool
sp_file_same(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}
