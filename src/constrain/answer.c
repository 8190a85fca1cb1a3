/*
 * answer.c - a chat answer split into reasoning, content and tool calls
 * (answer.h has the contract and the streaming rule).
 *
 * Threads: pure functions. Memory: the sp_answer_t's buffers (sp_jbuf) and
 * call list; nothing else outlives a call.
 */
#include "constrain/answer.h"

#include <string.h>

#include "constrain/toolcall.h"

typedef struct tags {
    const char *open, *close;
} tags_t;

/* The open and close tags of the formats that wrap their thinking in a pair. */
static const tags_t *
think_tags(sp_chat_reasoning_t r)
{
    static const tags_t think = {"<think>", "</think>"};
    static const tags_t seed = {"<seed:think>", "</seed:think>"};
    static const tags_t mistral = {"[THINK]", "[/THINK]"};
    static const tags_t command = {"<|START_THINKING|>", "<|END_THINKING|>"};
    static const tags_t gemma4 = {"<|channel>thought", "<channel|>"};
    static const tags_t minimax = {"<mm:think>", "</mm:think>"};
    static const tags_t apriel = {"Here are my reasoning steps:", "[BEGIN FINAL RESPONSE]"};
    switch (r) {
    case SP_CHAT_REASONING_THINK:
    case SP_CHAT_REASONING_GRANITE: return &think;
    case SP_CHAT_REASONING_SEED: return &seed;
    case SP_CHAT_REASONING_MISTRAL: return &mistral;
    case SP_CHAT_REASONING_COMMAND: return &command;
    case SP_CHAT_REASONING_GEMMA4: return &gemma4;
    case SP_CHAT_REASONING_MINIMAX: return &minimax;
    case SP_CHAT_REASONING_APRIEL: return &apriel;
    case SP_CHAT_REASONING_HARMONY:
    case SP_CHAT_REASONING_NONE: break;
    }
    return NULL;
}

/* The markers some families wrap the answer in (either may be NULL); they
 * are markup, not content. */
static const tags_t *
answer_wrap(sp_chat_reasoning_t r)
{
    static const tags_t command = {"<|START_RESPONSE|>", "<|END_RESPONSE|>"};
    static const tags_t apriel = {NULL, "[END FINAL RESPONSE]"};
    static const tags_t granite = {"<response>", "</response>"};
    switch (r) {
    case SP_CHAT_REASONING_COMMAND: return &command;
    case SP_CHAT_REASONING_APRIEL: return &apriel;
    case SP_CHAT_REASONING_GRANITE: return &granite;
    default: return NULL;
    }
}

static bool
is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Length of the longest suffix of text that is a proper prefix of m. */
static size_t
tail_of(const char *text, size_t len, const char *m)
{
    size_t mlen = strlen(m);
    for (size_t k = mlen - 1; k > 0; k--) {
        if (k <= len && memcmp(text + len - k, m, k) == 0) {
            return k;
        }
    }
    return 0;
}

static bool
at(const char *text, size_t len, size_t p, const char *m)
{
    size_t n = strlen(m);
    return len - p >= n && memcmp(text + p, m, n) == 0;
}

static size_t
find_from(const char *text, size_t len, size_t p, const char *m)
{
    const char *q = memmem(text + p, len - p, m, strlen(m));
    return q ? (size_t)(q - text) : len;
}

/* The answer text after the thinking: content, and calls when tools are on. */
static void
answer_region(const sp_answer_fmt_t *f, const char *t, size_t n, bool partial, sp_answer_t *a)
{
    if (!f->parse_tools) {
        sp_jbuf_raw(&a->content, t, n);
        return;
    }
    size_t cs = 0, ce;
    if (partial) {
        ce = sp_toolcall_safe_prefix(f->tools, t, n, &cs, &a->in_call);
    } else {
        sp_toolcall_parse(f->tools, f->tool_list, t, n, &a->calls, &cs, &ce);
    }
    if (ce > cs) {
        sp_jbuf_raw(&a->content, t + cs, ce - cs);
    }
}

/* The word after key in header[0, n) (up to a blank or '<'), or NULL. */
static const char *
header_word(const char *h, size_t n, const char *key, size_t *wlen)
{
    const char *k = memmem(h, n, key, strlen(key));
    if (k == NULL) {
        return NULL;
    }
    const char *w = k + strlen(key), *e = w, *end = h + n;
    while (e < end && !is_space(*e) && *e != '<') {
        e++;
    }
    *wlen = (size_t)(e - w);
    return w;
}

/*
 * gpt-oss's harmony: messages "<|channel|>NAME[ to=RECIPIENT][ <|constrain|>json]<|message|>BODY"
 * ended by <|end|> (then "<|start|>assistant" and the next), <|call|> or
 * <|return|> (end-of-generation tokens, so usually absent). analysis is the
 * reasoning; a message to functions.NAME is a call with BODY its arguments;
 * final and commentary without recipient are content.
 */
static void
parse_harmony(const sp_answer_fmt_t *f, const char *text, size_t len, bool partial,
              sp_answer_t *a)
{
    static const char *const ends[] = {"<|end|>", "<|call|>", "<|return|>"};
    size_t p = 0, cut = len; /* inline: the raw text before the first call (or the held part) */
    json_t *calls = json_array();
    while (p < len) {
        if (!at(text, len, p, "<|start|>") && !at(text, len, p, "<|channel|>")) {
            /* plain text up to the next header */
            size_t q = find_from(text, len, p, "<|start|>");
            size_t q2 = find_from(text, len, p, "<|channel|>");
            q = q2 < q ? q2 : q;
            size_t e = q;
            if (q == len && partial) {
                size_t h1 = tail_of(text + p, len - p, "<|start|>");
                size_t h2 = tail_of(text + p, len - p, "<|channel|>");
                e = len - (h1 > h2 ? h1 : h2);
                cut = e;
            }
            if (!f->inline_reasoning) {
                sp_jbuf_raw(&a->content, text + p, e - p);
            }
            p = q;
            continue;
        }
        size_t msg = find_from(text, len, p, "<|message|>");
        if (msg == len) { /* a header without its body */
            if (partial) {
                cut = p;
            } else if (!f->inline_reasoning) {
                sp_jbuf_raw(&a->content, text + p, len - p);
            }
            break;
        }
        size_t body = msg + strlen("<|message|>"), bend = len, next = len;
        for (size_t k = 0; k < sizeof ends / sizeof ends[0]; k++) {
            size_t e = find_from(text, len, body, ends[k]);
            if (e < bend) {
                bend = e;
                next = e + strlen(ends[k]);
            }
        }
        if (bend == len && partial) {
            size_t hold = 0;
            for (size_t k = 0; k < sizeof ends / sizeof ends[0]; k++) {
                size_t h = tail_of(text + body, len - body, ends[k]);
                hold = h > hold ? h : hold;
            }
            bend = len - hold;
        }
        size_t cl = 0, rl = 0;
        const char *channel = header_word(text + p, msg - p, "<|channel|>", &cl);
        const char *to = header_word(text + p, msg - p, "to=", &rl);
        if (to != NULL && rl > 10 && memcmp(to, "functions.", 10) == 0) {
            if (partial) {
                a->in_call = true;
                cut = p < cut ? p : cut;
                break;
            }
            json_error_t e;
            json_t *args = json_loadb(text + body, bend - body, JSON_DECODE_ANY, &e);
            json_t *name = json_stringn(to + 10, rl - 10);
            if (json_is_object(args) && name != NULL && calls != NULL &&
                json_array_size(calls) < SP_TOOLCALL_MAX_CALLS &&
                json_array_append_new(calls, json_pack("{s:o,s:o}", "name", name, "arguments",
                                                       args)) == 0) {
                cut = p < cut ? p : cut;
            } else { /* not a call after all: its text stays */
                json_decref(args);
                json_decref(name);
                if (!f->inline_reasoning) {
                    sp_jbuf_raw(&a->content, text + p, next - p);
                }
            }
        } else if (!f->inline_reasoning) {
            bool analysis = channel != NULL && cl == 8 && memcmp(channel, "analysis", 8) == 0;
            sp_jbuf_raw(analysis ? &a->reasoning : &a->content, text + body, bend - body);
        }
        if (partial && bend < len && next == len) {
            break; /* a held marker */
        }
        p = next;
    }
    if (f->inline_reasoning) {
        sp_jbuf_raw(&a->content, text, cut);
    }
    if (!partial && json_array_size(calls) > 0) {
        a->calls = calls;
    } else {
        json_decref(calls);
    }
}

/* Append text[b, e) without its leading and trailing blanks. */
static void
put_trimmed(sp_jbuf_t *out, const char *text, size_t b, size_t e)
{
    while (b < e && is_space(text[b])) {
        b++;
    }
    while (e > b && is_space(text[e - 1])) {
        e--;
    }
    sp_jbuf_raw(out, text + b, e - b);
}

void
sp_answer_parse(const sp_answer_fmt_t *f, const char *text, size_t len, bool partial,
                sp_answer_t *a)
{
    sp_jbuf_reset(&a->reasoning);
    sp_jbuf_reset(&a->content);
    json_decref(a->calls);
    a->calls = NULL;
    a->in_call = false;
    if (f->reasoning == SP_CHAT_REASONING_HARMONY) {
        parse_harmony(f, text, len, partial, a);
        return;
    }
    const tags_t *tg = think_tags(f->reasoning);
    size_t region = 0; /* where the answer after the thinking starts */
    if (tg != NULL) {
        bool in = f->think_open;
        size_t body = 0, olen = strlen(tg->open), clen = strlen(tg->close);
        if (!in) {
            size_t i = 0;
            while (i < len && is_space(text[i])) {
                i++;
            }
            if (len - i >= olen && memcmp(text + i, tg->open, olen) == 0) {
                in = true;
                body = i + olen;
            } else if (partial && len - i < olen && memcmp(text + i, tg->open, len - i) == 0) {
                return; /* blanks, or the open tag arriving: nothing is certain yet */
            }
        }
        if (in) {
            const char *cl = memmem(text + body, len - body, tg->close, clen);
            size_t rend = cl ? (size_t)(cl - text) : len;
            if (cl == NULL && partial) {
                rend -= tail_of(text + body, len - body, tg->close);
            }
            if (f->inline_reasoning) {
                if (cl == NULL) {
                    sp_jbuf_raw(&a->content, text, rend);
                    return;
                }
                region = rend + clen;
                sp_jbuf_raw(&a->content, text, region);
            } else {
                put_trimmed(&a->reasoning, text, body, rend);
                if (cl == NULL) {
                    return;
                }
                region = rend + clen;
                while (region < len && is_space(text[region])) {
                    region++; /* the blank line between thinking and answer */
                }
            }
        }
    }
    size_t end = len;
    const tags_t *w = answer_wrap(f->reasoning);
    if (w != NULL && !f->inline_reasoning) {
        if (w->open != NULL) {
            size_t i = region, olen = strlen(w->open);
            while (i < len && is_space(text[i])) {
                i++;
            }
            if (len - i >= olen && memcmp(text + i, w->open, olen) == 0) {
                region = i + olen;
            } else if (partial && len - i < olen && memcmp(text + i, w->open, len - i) == 0) {
                return; /* maybe the wrapper arriving */
            }
        }
        const char *e = memmem(text + region, len - region, w->close, strlen(w->close));
        if (e != NULL) {
            end = (size_t)(e - text);
        } else if (partial) {
            end -= tail_of(text + region, len - region, w->close);
        }
    }
    answer_region(f, text + region, end - region, partial, a);
}

void
sp_answer_free(sp_answer_t *a)
{
    sp_jbuf_free(&a->reasoning);
    sp_jbuf_free(&a->content);
    json_decref(a->calls);
    a->calls = NULL;
}

bool
sp_answer_opens_thinking(sp_chat_reasoning_t r, const char *prompt, size_t len)
{
    const tags_t *tg = think_tags(r);
    if (tg == NULL || prompt == NULL) {
        return false;
    }
    while (len > 0 && is_space(prompt[len - 1])) {
        len--;
    }
    size_t n = strlen(tg->open);
    return len >= n && memcmp(prompt + len - n, tg->open, n) == 0;
}

bool
sp_answer_think_markers(sp_chat_reasoning_t r, const char **open, const char **close)
{
    const tags_t *tg = think_tags(r);
    *open = tg ? tg->open : NULL;
    *close = tg ? tg->close : NULL;
    return tg != NULL;
}
