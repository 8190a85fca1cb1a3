/*
 * utf8.h - validating UTF-8 (RFC 3629: no overlong forms, no surrogates,
 * nothing above U+10FFFF).
 *
 * Shared by the template interpreter (string length and slicing by code
 * point) and the request checks (a BYTES prompt must be text).
 */
#ifndef SP_CORE_UTF8_H
#define SP_CORE_UTF8_H

#include <stddef.h>

/* Length of the valid sequence that starts s[0..n) (1 to 4), or 0 when none does. */
size_t sp_utf8_seq(const unsigned char *s, size_t n);

/* Offset of the first byte of s[0..n) that starts no valid sequence, or n. */
size_t sp_utf8_invalid_at(const char *s, size_t n);

#endif
