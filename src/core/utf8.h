/*
 * utf8.h - validating UTF-8 (RFC 3629: no overlong forms, no surrogates,
 * nothing above U+10FFFF).
 *
 * The one UTF-8 module: the template interpreter (string length and slicing
 * by code point), the request checks (a BYTES prompt must be text), the
 * tokenizers (decoding and encoding code points, holding back the unfinished
 * tail of a streamed piece) and the JSON writer all use these.
 */
#ifndef SP_CORE_UTF8_H
#define SP_CORE_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Length of the valid sequence that starts s[0..n) (1 to 4), or 0 when none does. */
size_t sp_utf8_seq(const unsigned char *s, size_t n);

/* Offset of the first byte of s[0..n) that starts no valid sequence, or n. */
size_t sp_utf8_invalid_at(const char *s, size_t n);

/* Byte-at-a-time validation, for text that is checked as it is made (the
 * JSON mode of generation): the continuation bytes a lead byte c needs (0:
 * c starts no multi-byte character) with the range class of the first one
 * in *range; each continuation byte is then checked with sp_utf8_cont_ok,
 * class 0 after the first. The classes encode RFC 3629's table (no
 * overlong forms, no surrogates, nothing above U+10FFFF). */
int sp_utf8_lead(unsigned c, uint8_t *range);
bool sp_utf8_cont_ok(uint8_t range, unsigned c);

/* Byte length of the character at s[0..n) (n >= 1) as SentencePiece splits
 * text: the length its lead byte announces (llama.cpp's table: 0xC_/0xD_ 2,
 * 0xE_ 3, 0xF_ 4) when that many bytes remain and all the announced
 * continuation bytes are 10xxxxxx; otherwise 1. Lenient on purpose (no
 * overlong or surrogate checks): token ids must match the reference
 * tokenizer's on any input, and checking the continuation bytes keeps a stray
 * lead byte from swallowing the next character. */
size_t sp_utf8_char_len(const unsigned char *s, size_t n);

/* Decode the character at s[0..n) (n >= 1): its length, with *cp set; an
 * invalid or truncated sequence decodes as one byte of U+FFFD. */
size_t sp_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

/* Write cp (at most U+10FFFF) as 1 to 4 bytes at dst; returns the count. */
size_t sp_utf8_encode(char *dst, uint32_t cp);

/* Bytes at the end of s[0..n) that start a character not finished yet (a
 * lead byte and fewer continuation bytes than it needs): what a stream holds
 * back until the next piece. 0 when s ends on a character boundary or on
 * bytes that can never become a character. */
size_t sp_utf8_unfinished_tail(const char *s, size_t n);

#endif
