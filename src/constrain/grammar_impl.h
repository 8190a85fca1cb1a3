/*
 * grammar_impl.h - the compiled grammar as grammar.c builds it and gmatch.c
 * runs it: the element encoding, byte sets and struct sp_grammar. Private to
 * src/constrain. A compiled grammar is immutable (its reference count aside),
 * so any number of matchers on any threads may read it at once.
 */
#ifndef SP_CONSTRAIN_GRAMMAR_IMPL_H
#define SP_CONSTRAIN_GRAMMAR_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "constrain/grammar.h"

/* ---- elements ------------------------------------------------------------ */

#define E_END 0u
#define E_KIND(e) ((e) >> 30)
#define E_ARG(e) ((e) & 0x3FFFFFFFu)
#define K_BYTES 1u
#define K_REF 2u
#define E_BYTES(set) (K_BYTES << 30 | (uint32_t)(set))
#define E_REF(rule) (K_REF << 30 | (uint32_t)(rule))
#define LEN_INF (1u << 30) /* "never ends"; sums saturate here */

typedef struct bset {
    uint64_t w[4];
} bset_t;

static inline bool
bset_has(const bset_t *s, unsigned c)
{
    return (s->w[c >> 6] >> (c & 63)) & 1u;
}

struct sp_grammar {
    _Atomic int refs;
    uint32_t *elems;     /* (n_elems) every alternative, END-terminated, rule after rule */
    uint32_t n_elems;
    uint32_t *alt_start; /* (n_alts) element index of each alternative */
    uint32_t *rule_alt;  /* (n_rules + 1) alternatives of rule r: rule_alt[r] .. rule_alt[r+1] */
    uint32_t n_rules, n_alts;
    uint32_t *rest;      /* (n_elems) fewest bytes from this element to its END */
    bset_t *sets;
    uint32_t n_sets;
    /* Bytes every set treats alike share a class: fed from one state they
     * lead to one state, so the matcher caches transitions per class (all ten
     * digits, all letters of a [a-z] are one feed). */
    uint8_t byte_class[256];
    uint32_t root;
    size_t bytes;
};

static inline uint32_t
sat_add(uint32_t a, uint32_t b)
{
    uint64_t s = (uint64_t)a + b;
    return s >= LEN_INF ? LEN_INF : (uint32_t)s;
}

#endif /* SP_CONSTRAIN_GRAMMAR_IMPL_H */
