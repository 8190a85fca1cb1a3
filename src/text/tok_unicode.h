/*
 * tok_unicode.h - Unicode tables for the WordPiece (BERT) normalizer; the data
 * is generated (scripts/gen_tok_unicode.py -> tok_unicode.c).
 */
#ifndef SP_TEXT_TOK_UNICODE_H
#define SP_TEXT_TOK_UNICODE_H

#include <stddef.h>
#include <stdint.h>

#define SP__UNI_CONTROL 1 /* category C*, except tab, LF, CR: dropped */
#define SP__UNI_SPACE 2   /* White_Space, tab, LF, CR: separates words */
#define SP__UNI_PUNCT 4   /* ASCII punctuation or category P*: a word of its own */
#define SP__UNI_CJK 8     /* CJK ideograph: a word of its own */

typedef struct sp__tok_unicode_fold {
    uint32_t cp;  /* code point */
    uint32_t off; /* into sp__tok_unicode_fold_pool */
    uint32_t n;   /* code points it becomes (0: dropped) */
} sp__tok_unicode_fold_t;

extern const uint16_t sp__tok_unicode_stage1[0x110000 >> 7];
extern const uint8_t sp__tok_unicode_stage2[][128];
extern const sp__tok_unicode_fold_t sp__tok_unicode_fold[]; /* sorted by cp */
extern const uint32_t sp__tok_unicode_fold_pool[];
extern const size_t sp__tok_unicode_n_fold;

static inline unsigned
sp__tok_unicode_flags(uint32_t cp)
{
    return cp < 0x110000 ? sp__tok_unicode_stage2[sp__tok_unicode_stage1[cp >> 7]][cp & 127] : SP__UNI_CONTROL;
}

#endif /* SP_TEXT_TOK_UNICODE_H */
