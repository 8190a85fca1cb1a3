/*
 * budget.h - the reasoning budget as a chat request asks for it, turned into
 * the generation parameters that enforce it (engine/gen.h).
 *
 * Request fields (llama-server's names; Anthropic's thinking.budget_tokens
 * and the other translators write reasoning_budget_tokens):
 *   reasoning_budget, reasoning_budget_tokens, thinking_budget_tokens
 *       an integer >= -1: -1 no limit, 0 no thinking (the close marker comes
 *       first), N at most N generated tokens per thinking part;
 *   reasoning_budget_message
 *       text written before the close marker when the budget ends a part.
 * A model whose template has no thinking markup has no part to limit (the
 * budget holds trivially); one whose thinking has no close marker the
 * engine can force (gpt-oss harmony channels) refuses a budget >= 0.
 *
 * Threads: none of its own; parse runs on the request's loop, apply on a
 * preparation worker (it tokenizes). Memory: the message points into the
 * body, which must outlive the request.
 */
#ifndef SP_API_BUDGET_H
#define SP_API_BUDGET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "chat/chat.h"
#include "engine/gen.h"
#include "sampan/status.h"
#include "text/tokenizer.h"

typedef struct sp_budget_req {
    int32_t budget;      /* -1: none */
    const char *message; /* NULL or "": none */
    size_t message_len;
} sp_budget_req_t;

/* Read the fields from body into *out; absent or -1: the server's default
 * (--reasoning-budget, -1 none), which harmony models leave out. 0, or -1
 * with *param and err set (the caller answers 400). Several budget fields
 * given must agree. */
int sp_budget_parse(const json_t *body, sp_chat_reasoning_t family, int64_t server_default,
                    sp_budget_req_t *out, const char **param, char *err, size_t cap);

/* Set g's reasoning-budget fields for the family's markers: the forced
 * tokens are the message and the close marker, tokenized with special
 * tokens recognised; think_in_prompt: the prompt ends inside a thinking part.
 * Nothing to do without a budget or thinking markup. SP_OK, or
 * SP_ERR_INVALID (err says why; the parameter is reasoning_budget_message). */
sp_status_t sp_budget_apply(const sp_budget_req_t *r, sp_chat_reasoning_t family,
                            bool think_in_prompt, const sp_tokenizer_t *tok, sp_gen_params_t *g,
                            char *err, size_t cap);

#endif /* SP_API_BUDGET_H */
