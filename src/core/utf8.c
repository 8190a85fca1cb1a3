/* utf8.c - validating, decoding and encoding UTF-8 (utf8.h). */
#include "core/utf8.h"

/* The allowed range of the next continuation byte, by class (RFC 3629 table):
 * any; after E0 (no overlong); after ED (no surrogate); after F0 (no
 * overlong); after F4 (nothing above U+10FFFF). */
static const unsigned char cont_lo[5] = {0x80, 0xA0, 0x80, 0x90, 0x80};
static const unsigned char cont_hi[5] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};

int
sp_utf8_lead(unsigned c, uint8_t *range)
{
    *range = 0;
    if (c >= 0xC2 && c <= 0xDF) {
        return 1;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        *range = c == 0xE0 ? 1 : c == 0xED ? 2 : 0;
        return 2;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        *range = c == 0xF0 ? 3 : c == 0xF4 ? 4 : 0;
        return 3;
    }
    return 0;
}

bool
sp_utf8_cont_ok(uint8_t range, unsigned c)
{
    return range < 5 && c >= cont_lo[range] && c <= cont_hi[range];
}

size_t
sp_utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80) {
        return 1;
    }
    size_t len;
    unsigned min;
    if ((c & 0xE0) == 0xC0) {
        len = 2, min = 0x80, c &= 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3, min = 0x800, c &= 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
        len = 4, min = 0x10000, c &= 0x07;
    } else {
        return 0;
    }
    if (n < len) {
        return 0;
    }
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            return 0;
        }
        c = (c << 6) | (s[i] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
        return 0;
    }
    return len;
}

size_t
sp_utf8_invalid_at(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    for (size_t l; i < n && (l = sp_utf8_seq(u + i, n - i)) != 0;) {
        i += l;
    }
    return i;
}

size_t
sp_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp)
{
    size_t len = sp_utf8_seq(s, n);
    if (len == 0) {
        *cp = 0xFFFD;
        return 1;
    }
    static const unsigned char mask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
    uint32_t v = s[0] & mask[len];
    for (size_t i = 1; i < len; i++) {
        v = v << 6 | (s[i] & 0x3F);
    }
    *cp = v;
    return len;
}

size_t
sp_utf8_encode(char *dst, uint32_t cp)
{
    if (cp < 0x80) {
        dst[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        dst[0] = (char)(0xC0 | cp >> 6);
        dst[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        dst[0] = (char)(0xE0 | cp >> 12);
        dst[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        dst[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    dst[0] = (char)(0xF0 | cp >> 18);
    dst[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    dst[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    dst[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t
sp_utf8_unfinished_tail(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned c = u[n - back];
        if ((c & 0xC0) == 0x80) {
            continue; /* a continuation byte: look further back for its lead */
        }
        size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

size_t
sp_utf8_char_len(const unsigned char *s, size_t n)
{
    static const uint8_t len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    size_t k = len[s[0] >> 4];
    if (k > n) {
        return 1;
    }
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            return 1;
        }
    }
    return k;
}
