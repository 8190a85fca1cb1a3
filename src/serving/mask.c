/*
 * mask.c - sp_mask_text (mask.h): what --log-prompts writes
 * of a prompt or an output, with personal data and secrets replaced.
 *
 * Each kind is a PCRE2 pattern (compiled once, JIT when available) and, where
 * the shape alone would catch too much, a check of the candidate: the Luhn
 * digit for card numbers, ISO 7064 mod-97 for IBANs, digit counts for phone
 * numbers. Kinds are tried in the order of the table, so a JWT inside
 * "Bearer ..." is one [token], a key is never half taken by the phone
 * pattern, and a card number is not also a phone number; a candidate that
 * overlaps an earlier kind's match is skipped. Everything a match covers is
 * replaced, never a part of it.
 *
 * It fails closed: if a pattern cannot run (out of memory, a match limit
 * hit), the whole text is withheld rather than written unmasked.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/alloc.h"
#include "serving/mask.h"

/* The candidate s[0..n) of a kind (n is the pattern's whole match) and the
 * text after it (s[n..end)): how many bytes to mask from s, 0 to refuse. */
typedef size_t (*check_fn)(const char *s, size_t n, const char *end);

typedef struct kind {
    const char *label;
    const char *pattern;
    check_fn check; /* NULL: the pattern's match as it is */
} kind_t;

static bool
digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Luhn's check digit over the digits of s[0..n) (separators skipped). */
static bool
luhn_ok(const char *s, size_t n)
{
    int sum = 0, k = 0;
    for (size_t i = n; i-- > 0;) {
        if (!digit(s[i])) {
            continue;
        }
        int d = s[i] - '0';
        if (k++ & 1) {
            d *= 2;
            d -= d > 9 ? 9 : 0;
        }
        sum += d;
    }
    return sum % 10 == 0;
}

/* A card number: 13 to 19 digits, spaces or dashes between, passing Luhn.
 * The pattern takes the longest run; a shorter prefix ending before a
 * non-digit is tried too ("4111 1111 1111 1111 12 2025": the card, then an
 * expiry date that is left as it is). */
static size_t
check_card(const char *s, size_t n, const char *end)
{
    (void)end;
    for (size_t len = n; len > 0; len--) {
        if (!digit(s[len - 1]) || (len < n && digit(s[len]))) {
            continue;
        }
        int digits = 0;
        for (size_t i = 0; i < len; i++) {
            digits += digit(s[i]);
        }
        if (digits < 13) {
            break;
        }
        if (digits <= 19 && luhn_ok(s, len)) {
            return len;
        }
    }
    return 0;
}

/* An IBAN: country, check digits, 11 to 30 letters or digits (spaces in
 * groups allowed), valid under mod 97 (ISO 13616). The longest prefix that
 * passes is taken, so a capitalised word after it stays text. */
static size_t
check_iban(const char *s, size_t n, const char *end)
{
    (void)end;
    for (size_t len = n; len >= 15; len--) {
        if (s[len - 1] == ' ' || (len < n && s[len] != ' ')) {
            continue; /* end at a group boundary */
        }
        /* Rearranged: the body, then country and check digits; letters are
         * 10..35; the remainder is kept below 97 as we go. */
        unsigned rem = 0;
        size_t chars = 0;
        for (size_t pass = 0; pass < 2; pass++) {
            size_t a = pass == 0 ? 4 : 0, b = pass == 0 ? len : 4;
            for (size_t i = a; i < b; i++) {
                char c = s[i];
                if (c == ' ') {
                    continue;
                }
                chars++;
                if (digit(c)) {
                    rem = (rem * 10 + (unsigned)(c - '0')) % 97;
                } else {
                    unsigned v = (unsigned)(c - 'A') + 10;
                    rem = (rem * 100 + v) % 97;
                }
            }
        }
        if (chars >= 15 && chars <= 34 && rem == 1) {
            return len;
        }
    }
    return 0;
}

/* A phone number: 7 to 15 digits in all (E.164's longest is 15). */
static size_t
check_phone(const char *s, size_t n, const char *end)
{
    (void)end;
    int digits = 0;
    for (size_t i = 0; i < n; i++) {
        digits += digit(s[i]);
    }
    return digits >= 7 && digits <= 15 ? n : 0;
}

/* Tried in this order; an earlier kind's match wins an overlap. */
static const kind_t kinds[] = {
    /* PEM blocks (private keys, certificates): the whole block; one cut by
     * the 256-byte window is masked to the end of the text, or from its start. */
    {"[key]", "-----BEGIN [A-Z0-9 ]{1,40}-----[\\s\\S]*?(?:-----END [A-Z0-9 ]{1,40}-----|\\z)", NULL},
    {"[key]", "\\A[A-Za-z0-9+/=\\s]{16,}-----END [A-Z0-9 ]{1,40}-----", NULL},
    /* JSON Web Tokens: three base64url parts, the first a JSON object ("eyJ"). */
    {"[token]", "\\beyJ[A-Za-z0-9_-]{5,}\\.[A-Za-z0-9_-]{5,}\\.[A-Za-z0-9_-]*", NULL},
    /* An Authorization value: the scheme's word and the credentials, which
     * hold a digit or run to 16 characters (so "token generation" is prose). */
    {"[token]", "(?i)\\b(?:bearer|basic|token)[ \\t]+(?=[A-Za-z._~+/=-]*[0-9]|[A-Za-z0-9._~+/=-]{16})"
                "[A-Za-z0-9._~+/=-]{8,}", NULL},
    /* Common API key formats, each whole: OpenAI-style sk-/sk-proj-/sk-sampan-,
     * Stripe, AWS access key ids, GitHub, Slack, Google. */
    {"[key]", "\\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}", NULL},
    {"[key]", "\\bsk-[A-Za-z0-9_-]{16,}", NULL},
    {"[key]", "\\b(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\\b", NULL},
    {"[key]", "\\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})", NULL},
    {"[key]", "\\bxox[abposr]-[A-Za-z0-9-]{10,}", NULL},
    {"[key]", "\\bAIza[0-9A-Za-z_-]{35}", NULL},
    /* A key or token cut by the end of the 256-byte window: too short for its
     * full pattern, still a secret's first characters. */
    {"[key]", "\\b(?:sk-|[sr]k_(?:live|test)_|AKIA|ASIA|gh[pousr]_|github_pat_|xox[abposr]-|AIza|eyJ)"
              "[A-Za-z0-9_.~+/=-]*\\z", NULL},
    /* E-mail addresses: a dotted domain ending in a letters-only TLD. */
    {"[email]", "[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\\.[A-Za-z0-9-]+)*\\.[A-Za-z]{2,}", NULL},
    {"[iban]", "\\b[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]){11,30}", check_iban},
    /* A card number starts a number: not after a letter or digit, nor after
     * a digit group and a separator (the middle of a longer grouped number). */
    {"[card]", "(?<![0-9A-Za-z])(?<![0-9][ -])[0-9](?:[ -]?[0-9]){12,18}(?![0-9])", check_card},
    /* National ids: US social security numbers (dashed; never 000, 666 or 9xx
     * in the area, 00 in the group, 0000 in the serial) and UK national
     * insurance numbers. */
    {"[id]", "(?<![0-9-])(?!000|666|9)[0-9]{3}-(?!00)[0-9]{2}-(?!0000)[0-9]{4}(?![0-9-])", NULL},
    {"[id]", "\\b[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?[0-9]{2} ?[0-9]{2} ?[0-9]{2} ?[A-D]\\b", NULL},
    /* Phone numbers: international (+), an area code in parentheses,
     * 3-3-4 groups, or a national number starting with 0 in groups; the
     * last two, like cards, only where a number starts. */
    {"[phone]", "\\+[0-9]{1,3}(?:[ .-]?(?:\\([0-9]{1,4}\\)|[0-9]{1,4})){2,6}(?![0-9])", check_phone},
    {"[phone]", "\\([0-9]{2,4}\\)[ .-]?[0-9]{3,4}[ .-]?[0-9]{3,4}(?![0-9])", check_phone},
    {"[phone]", "(?<![0-9A-Za-z.-])(?<![0-9][ .-])[0-9]{3}([.-]|[ ])[0-9]{3}\\1[0-9]{4}(?![0-9])",
     check_phone},
    {"[phone]", "(?<![0-9A-Za-z.-])(?<![0-9][ .-])0[0-9]{2,4}[ /-][0-9]{3,4}[ -]?[0-9]{3,5}(?![0-9])",
     check_phone},
};

#define N_KINDS (sizeof kinds / sizeof kinds[0])
#define MATCH_LIMIT 200000 /* per pattern and text: far above what 256 bytes need */

static pcre2_code *codes[N_KINDS];
static pcre2_match_context *mctx;
static bool compiled_ok;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void
compile_all(void)
{
    mctx = pcre2_match_context_create(NULL);
    if (mctx == NULL) {
        return;
    }
    pcre2_set_match_limit(mctx, MATCH_LIMIT);
    for (size_t k = 0; k < N_KINDS; k++) {
        int ec;
        PCRE2_SIZE eo;
        codes[k] = pcre2_compile((PCRE2_SPTR)kinds[k].pattern, PCRE2_ZERO_TERMINATED, 0, &ec, &eo,
                                 NULL);
        if (codes[k] == NULL) {
            return; /* a bug in the table: tests/unit/test_log.c would fail */
        }
        (void)pcre2_jit_compile(codes[k], PCRE2_JIT_COMPLETE); /* the interpreter otherwise */
    }
    compiled_ok = true;
}

size_t
sp_mask_text(const char *s, size_t n, char *out, size_t cap)
{
    static const char withheld[] = "[withheld: masking failed]";
    size_t j = 0;
#define OUT(str, len)                                                                              \
    do {                                                                                           \
        size_t l_ = (len);                                                                         \
        if (j + l_ < cap) {                                                                        \
            memcpy(out + j, (str), l_);                                                            \
            j += l_;                                                                               \
        }                                                                                          \
    } while (0)
    pthread_once(&once, compile_all);
    /* owner[i]: 1 + the kind that masks byte i, 0 for none. */
    uint8_t *owner = n ? sp_calloc(n, 1) : NULL;
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    bool failed = !compiled_ok || md == NULL || (n > 0 && owner == NULL);
    for (size_t k = 0; k < N_KINDS && !failed; k++) {
        PCRE2_SIZE at = 0;
        while (at < n) {
            int rc = pcre2_match(codes[k], (PCRE2_SPTR)s, n, at, 0, md, mctx);
            if (rc == PCRE2_ERROR_NOMATCH) {
                break;
            }
            if (rc < 0) {
                failed = true; /* fail closed: never write what could not be checked */
                break;
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t a = ov[0], b = ov[1];
            size_t len = b > a ? (kinds[k].check ? kinds[k].check(s + a, b - a, s + n) : b - a) : 0;
            bool free_ = len > 0;
            for (size_t i = a; free_ && i < a + len; i++) {
                free_ = owner[i] == 0;
            }
            if (!free_) {
                at = a + 1; /* refused or taken: a candidate may start later */
                continue;
            }
            for (size_t i = a; i < a + len; i++) {
                owner[i] = (uint8_t)(k + 1);
            }
            at = a + len;
        }
    }
    pcre2_match_data_free(md);
    if (failed) {
        sp_free(owner);
        OUT(withheld, sizeof withheld - 1);
    } else {
        for (size_t i = 0; i < n;) {
            if (owner[i] == 0) {
                OUT(s + i, 1);
                i++;
                continue;
            }
            uint8_t o = owner[i];
            const char *label = kinds[o - 1].label;
            OUT(label, strlen(label));
            while (i < n && owner[i] == o) {
                i++;
            }
        }
        sp_free(owner);
    }
#undef OUT
    if (cap) {
        out[j < cap ? j : cap - 1] = '\0';
    }
    return j;
}
