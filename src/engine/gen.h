/*
 * gen.h - one generation: everything between a sequence's logits and the text
 * its client sees.
 *
 * A sp_gen_t owns the per-sequence decisions: the sampler (penalties, seed),
 * the JSON-object constraint (tokens that would make the output an invalid
 * JSON prefix are masked before sampling), log-probabilities, streaming
 * detokenisation (never half a UTF-8 character), stop strings (never split
 * across tokens: text that could still become a stop string is held back
 * until it cannot) and the limits that end it (max tokens, end-of-generation
 * token). It does not own a model context: the caller (the `run` tool, the
 * scheduler) evaluates tokens and passes the resulting logits to sp_gen_step,
 * so the same logic serves one sequence or a batch of them. Everything is
 * sized at create: a step allocates nothing.
 */
#ifndef SP_ENGINE_GEN_H
#define SP_ENGINE_GEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "constrain/grammar.h"
#include "engine/sampler.h"
#include "text/tokenizer.h"
#include "sampan/status.h"

#define SP_GEN_MAX_STOP 16         /* stop strings per request (OpenAI allows 4) */
#define SP_GEN_MAX_STOP_LEN 256    /* bytes per stop string */
#define SP_GEN_MAX_TOP_LOGPROBS 20 /* OpenAI's limit for top_logprobs */
#define SP_GEN_MAX_THINK_TAG 64    /* bytes of a thinking part's open or close marker */
#define SP_GEN_MAX_THINK_FORCE 128 /* tokens forced to end a thinking part */

typedef enum sp_finish {
    SP_FINISH_NONE = 0, /* still generating */
    SP_FINISH_STOP,     /* end-of-generation token, stop string, or a complete JSON object */
    SP_FINISH_LENGTH,   /* max_tokens reached */
} sp_finish_t;

/*
 * The JSON constraint's view of a vocabulary: every token's piece, sorted.
 * About 30 bytes per token (~3 MiB for 100k tokens), built in ~8 ms for 32k
 * tokens and ~25 ms for 100k: a server builds it once per model and shares it
 * (read-only, any threads) between generations. A json_object generation
 * given none builds its own at create.
 */
typedef struct sp_gen_vocab sp_gen_vocab_t;

typedef struct sp_gen_params {
    sp_sampler_params_t sampling;
    int32_t max_tokens;       /* > 0 */
    /* Stop strings, copied at create: the first n_stop entries, or with n_stop = 0
     * the entries up to the first NULL. Each non-empty, valid UTF-8, at most
     * SP_GEN_MAX_STOP_LEN bytes. */
    const char *stop[SP_GEN_MAX_STOP];
    int n_stop;
    int32_t top_logprobs;     /* < 0: no log-probabilities; 0..SP_GEN_MAX_TOP_LOGPROBS:
                                 the chosen token's and this many most likely alternatives */
    bool json_object;         /* constrain the output to one JSON object (RFC 8259); it ends
                                 the generation (STOP) when it closes; near max_tokens only
                                 tokens that let it close in time pass, so a generation cut by
                                 the budget still ends in a whole object, with LENGTH */
    bool ignore_eos;          /* keep going past end-of-generation tokens (benchmarks) */
    bool special_text;        /* control tokens other than end-of-generation ones are part
                                 of the text (chat answers whose markup is written in them:
                                 gpt-oss channels, [TOOL_CALLS], [THINK]); else they are "" */
    const sp_gen_vocab_t *vocab; /* optional, for json_object and grammar: a shared table of
                                    the same tokenizer (must outlive the generation) */
    sp_grammar_t *grammar;    /* optional (not with json_object): the output is a sentence of
                                 this grammar (grammar.h). Tokens that would leave it are
                                 masked; end-of-generation tokens pass only where the grammar
                                 may end; a sentence that cannot go on ends the generation
                                 (STOP); near max_tokens only tokens that let it end in time
                                 pass (as for json_object). sp_gen_create takes a reference.
                                 Unlike the rest of a step, the matcher's tables may grow
                                 (bounded; docs/structured-output.md). */
    /* Reasoning budget (docs/design.md): with reasoning_budget >= 0 and
     * n_think_force > 0, a thinking part - the generated text after the
     * think_open marker, or from the start with think_in_prompt, up to the
     * think_close marker - gets at most reasoning_budget generated tokens
     * (plus the few that finish a UTF-8 character, or the close marker,
     * that the last one began); then
     * the think_force tokens (the close marker, maybe after a message) are
     * emitted as the next tokens, whatever the logits say, and the model goes
     * on with its answer. A later open marker starts a new part with a fresh
     * budget. Markers are matched in the text (as the answer parser sees
     * it), so special_text must be on where they are control tokens. Where
     * json_object or a grammar masks a forced token, the constraint wins. */
    int32_t reasoning_budget;  /* < 0: no budget (the default) */
    char think_open[SP_GEN_MAX_THINK_TAG + 1];  /* NUL-terminated; "" with think_in_prompt
                                                   only: a part cannot reopen */
    char think_close[SP_GEN_MAX_THINK_TAG + 1]; /* non-empty when the budget is on */
    bool think_in_prompt;      /* the prompt ends inside a thinking part */
    int32_t think_force[SP_GEN_MAX_THINK_FORCE];
    int32_t n_think_force;
} sp_gen_params_t;

typedef struct sp_gen_logprob {
    int32_t token;
    float logprob; /* natural log of the probability after penalties and constraint,
                      before temperature/top-k/top-p (as OpenAI and vLLM report) */
} sp_gen_logprob_t;

/* What one step produced. Pointers stay valid until the next step or destroy. */
typedef struct sp_gen_token {
    int32_t token;       /* the sampled token (also on the last step: an end-of-generation
                            token, the token that completed a stop string) */
    sp_gen_logprob_t chosen;                          /* with top_logprobs >= 0 */
    sp_gen_logprob_t top[SP_GEN_MAX_TOP_LOGPROBS];    /* most likely first */
    int32_t n_top;       /* may be less than asked when fewer tokens are possible */
    const char *text;    /* text released by this step, NUL-terminated (may be empty while
                            held back; never ends inside a UTF-8 character but on the last step) */
    size_t text_len;
    sp_finish_t finish;  /* != NONE: this was the last step; evaluate no more tokens */
} sp_gen_token_t;

typedef struct sp_gen sp_gen_t;

sp_status_t sp_gen_vocab_create(const sp_tokenizer_t *tok, sp_gen_vocab_t **out, char *err,
                                size_t err_len);
void sp_gen_vocab_destroy(sp_gen_vocab_t *v);

/* Sampler defaults, max_tokens 16 (OpenAI's default), no stops, no logprobs. */
sp_gen_params_t sp_gen_default_params(void);
/* SP_ERR_INVALID with err naming the parameter for bad values. */
sp_status_t sp_gen_create(const sp_tokenizer_t *tok, const sp_gen_params_t *p, sp_gen_t **out,
                          char *err, size_t err_len);
void sp_gen_destroy(sp_gen_t *g);
/* Record prompt tokens for the penalties (call before the first step). The last
 * one also matters for text: right after BOS, a SentencePiece vocabulary's first
 * piece drops its dummy-prefix space (as `sampan run` always printed it). */
void sp_gen_accept_prompt(sp_gen_t *g, const int32_t *tokens, int64_t n);
/*
 * Choose the next token from n_vocab logits (used as scratch and modified),
 * update the state and fill *out. When out->finish is SP_FINISH_NONE the
 * caller evaluates out->token and calls again with the new logits.
 * Errors (the generation is over; sp_gen_error says why): SP_ERR_INVALID when
 * called after the last step or when no logit is finite, SP_ERR_UNSUPPORTED
 * when json_object or the grammar leaves no token the vocabulary and the
 * model allow.
 */
sp_status_t sp_gen_step(sp_gen_t *g, float *logits, sp_gen_token_t *out);
/*
 * Sampling from the best few logits (the GPU returns them instead of the row:
 * docs/cuda.md "Candidates"). sp_gen_candidates: how many best logits the next
 * step needs (sp_sampler_candidates), or 0 when it needs the whole row (a
 * JSON or grammar constraint, log-probabilities, penalties, no top_k <= 64).
 * sp_gen_step_candidates: sp_gen_step from n >= that many candidates, ids[]
 * and their logits vals[] best first (larger value, then lower id): the same
 * token and text as sp_gen_step on the whole row. SP_ERR_INVALID (and the
 * generation is over) when the step needs the row or n is too small.
 */
int32_t sp_gen_candidates(const sp_gen_t *g);
sp_status_t sp_gen_step_candidates(sp_gen_t *g, const int32_t *ids, const float *vals, int32_t n,
                                   sp_gen_token_t *out);
int32_t sp_gen_n_generated(const sp_gen_t *g);
/* Whether sp_gen_step on g reads and writes only g's own state and the
 * shared immutable tokenizer, so steps of different generations may run at
 * the same time on different threads (the scheduler samples a step's rows in
 * parallel). False with a JSON or grammar constraint: their shared vocabulary
 * tables and matchers are kept to one thread. */
bool sp_gen_step_is_private(const sp_gen_t *g);
/* Tokens the reasoning budget forced so far (0 without a budget). */
int32_t sp_gen_n_forced(const sp_gen_t *g);
/* The stop string that ended the generation (its index in the params' stop
 * list), or -1: none did (yet). */
int sp_gen_stop_index(const sp_gen_t *g);
/* One line describing the last sp_gen_step error ("" when none). */
const char *sp_gen_error(const sp_gen_t *g);

#endif /* SP_ENGINE_GEN_H */
