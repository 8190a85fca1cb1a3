/*
 * fim_prompt.c - a fill-in-the-middle prompt's tokens in llama-server's
 * /infill layout (tokenizer.h, sp_fim_encode, has the order).
 *
 * Threads: a pure function of its arguments (the tokenizer is shared
 * read-only). Memory: writes only the caller's buffer; a file name and its
 * line break go through a bounded stack buffer.
 */
#include <string.h>

#include "text/tokenizer_impl.h"

typedef struct fim_out {
    const sp_tokenizer_t *t;
    int32_t *ids;
    int64_t cap, n;
    sp_status_t st; /* the first tokenizer error */
} fim_out_t;

static void
put_id(fim_out_t *o, int32_t id)
{
    if (o->n < o->cap) {
        o->ids[o->n] = id;
    }
    o->n++;
}

static void
put_text(fim_out_t *o, const char *text, size_t len)
{
    if (len == 0 || o->st != SP_OK) {
        return;
    }
    int64_t room = o->n < o->cap ? o->cap - o->n : 0;
    int64_t k = sp_tokenizer_encode(o->t, text, len, false, false, o->ids + (o->n < o->cap ? o->n : 0),
                                    room);
    if (k < 0) {
        o->st = (sp_status_t)k;
        return;
    }
    o->n += k; /* past cap the ids are only counted (the encode contract) */
}

int64_t
sp_fim_encode(const sp_tokenizer_t *t, const sp_fim_prompt_t *p, int32_t *out, int64_t cap)
{
    const sp_fim_ids_t f = t->fim;
    if (f.pre < 0 || f.suf < 0 || f.mid < 0) {
        return SP_ERR_UNSUPPORTED;
    }
    fim_out_t o = {t, out, cap, 0, SP_OK};
    if (p->repo) {
        if (f.rep >= 0) {
            put_id(&o, f.rep);
            put_text(&o, "myproject\n", 10);
        }
        for (int i = 0; i < p->n_extra; i++) {
            const sp_fim_chunk_t *c = &p->extra[i];
            if (f.sep >= 0) {
                put_id(&o, f.sep);
                /* the name and its line break as one text, as llama-server does */
                char name[SP_FIM_MAX_FILENAME + 1];
                size_t nl = c->filename ? c->filename_len : 3;
                if (nl > SP_FIM_MAX_FILENAME) {
                    return SP_ERR_INVALID;
                }
                memcpy(name, c->filename ? c->filename : "tmp", nl);
                name[nl] = '\n';
                put_text(&o, name, nl + 1);
            } else {
                put_text(&o, "\n\n--- snippet ---\n\n", 19);
            }
            put_text(&o, c->text, c->text_len);
        }
        if (f.sep >= 0) {
            put_id(&o, f.sep);
            put_text(&o, "filename\n", 9);
        }
    }
    if (t->add_bos && t->bos >= 0) {
        put_id(&o, t->bos);
    }
    put_id(&o, f.pre);
    if (p->prefix != NULL) {
        put_text(&o, p->prefix, p->prefix_len);
    } else {
        for (int64_t i = 0; i < p->n_prefix_ids; i++) {
            put_id(&o, p->prefix_ids[i]);
        }
    }
    if (p->middle != NULL) {
        put_text(&o, p->middle, p->middle_len);
    }
    put_id(&o, f.suf);
    put_text(&o, p->suffix, p->suffix_len);
    put_id(&o, f.mid);
    return o.st != SP_OK ? o.st : o.n;
}
