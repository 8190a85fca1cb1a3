/*
 * mask.h - what --log-prompts writes instead of the raw text: personal data
 * and secrets replaced (mask.c, PCRE2).
 *
 * Threads: any; the compiled patterns are shared and read-only once built.
 */
#ifndef SP_SERVING_MASK_H
#define SP_SERVING_MASK_H

#include <stddef.h>

/* Copy text into out with personal data and secrets replaced, each match
 * whole: PEM blocks, keys (sk-..., AKIA..., ghp_...) and tokens (JWTs,
 * Bearer ...) by [key] and [token], e-mail addresses by [email], IBANs
 * (mod-97) by [iban], card numbers (Luhn) by [card], US SSNs and UK NI
 * numbers by [id], phone numbers by [phone]. When a pattern cannot run the
 * whole text is withheld. Returns the length written. */
size_t sp_mask_text(const char *s, size_t n, char *out, size_t cap);

#endif /* SP_SERVING_MASK_H */
