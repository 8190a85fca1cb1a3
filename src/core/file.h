/*
 * file.h - read a whole (small) regular file: config files, tenants files, texts;
 * tell whether a file is still the one seen before.
 */
#ifndef SP_CORE_FILE_H
#define SP_CORE_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>

#include "sampan/status.h"

/*
 * Read the regular file at path, at most max bytes, into *out (NUL-terminated,
 * sp_free it) with its length in *len.
 * A FIFO or device is refused without blocking on it. Errors name the file by
 * label: SP_ERR_NOT_FOUND, SP_ERR_IO, SP_ERR_INVALID (not a regular file),
 * SP_ERR_TOO_LARGE, SP_ERR_NOMEM. A file that shrinks while it is read gives
 * what was there.
 */
sp_status_t sp_file_read(const char *path, const char *label, size_t max, char **out, size_t *len,
                         char *err, size_t err_len);

/* The same file, unchanged as far as stat tells: device, inode, size and
 * modification time (to the nanosecond) all equal. */
bool sp_file_same(const struct stat *a, const struct stat *b);

#endif /* SP_CORE_FILE_H */
