/*
 * budget.c - the reasoning budget's request fields and generation parameters
 * (budget.h has the contract; engine/gen.c enforces it token by token).
 *
 * Threads: pure functions of their arguments (the tokenizer is shared
 * read-only). Memory: a bounded stack buffer for the forced text.
 */
#include "api/budget.h"

#include <stdio.h>
#include <string.h>

#include "constrain/answer.h"
#include "core/json.h"

int
sp_budget_parse(const json_t *body, sp_chat_reasoning_t family, int64_t server_default,
                sp_budget_req_t *out, const char **param, char *err, size_t cap)
{
    static const char *const keys[] = {"reasoning_budget", "reasoning_budget_tokens",
                                       "thinking_budget_tokens", NULL};
    out->budget = -1;
    out->message = NULL;
    out->message_len = 0;
    const char *seen = NULL;
    for (int i = 0; keys[i]; i++) {
        sp_json_err_t e = {{0}, NULL};
        int64_t v;
        int rc = sp_json_get_int(body, keys[i], -1, INT32_MAX, &v, &e);
        if (rc < 0) {
            *param = keys[i];
            snprintf(err, cap, "'%s' must be an integer >= -1 (-1: no limit, 0: no thinking)",
                     keys[i]);
            return -1;
        }
        if (rc == 0) {
            continue;
        }
        if (seen != NULL && v != out->budget) {
            *param = keys[i];
            snprintf(err, cap, "'%s' and '%s' give different budgets", seen, keys[i]);
            return -1;
        }
        seen = keys[i];
        out->budget = (int32_t)v;
    }
    const json_t *m = json_object_get(body, "reasoning_budget_message");
    if (m != NULL && !json_is_null(m)) {
        if (!json_is_string(m)) {
            *param = "reasoning_budget_message";
            snprintf(err, cap, "'reasoning_budget_message' must be a string");
            return -1;
        }
        out->message = json_string_value(m);
        out->message_len = json_string_length(m);
    }
    const char *open, *close;
    bool forcible = family == SP_CHAT_REASONING_NONE || sp_answer_think_markers(family, &open, &close);
    if (out->budget < 0 && server_default >= 0 && forcible) {
        out->budget = (int32_t)server_default;
    }
    if (out->budget >= 0 && !forcible) {
        *param = seen;
        snprintf(err, cap, "this model's thinking (harmony channels) has no close marker a "
                 "reasoning budget can force; leave '%s' out", seen);
        return -1;
    }
    return 0;
}

sp_status_t
sp_budget_apply(const sp_budget_req_t *r, sp_chat_reasoning_t family, bool think_in_prompt,
                const sp_tokenizer_t *tok, sp_gen_params_t *g, char *err, size_t cap)
{
    const char *open, *close;
    if (r->budget < 0 || !sp_answer_think_markers(family, &open, &close)) {
        return SP_OK; /* no budget, or no thinking part to limit */
    }
    size_t lo = strlen(open), lc = strlen(close);
    if (lo > SP_GEN_MAX_THINK_TAG || lc > SP_GEN_MAX_THINK_TAG) {
        return sp_errf(err, cap, SP_ERR_INVALID, "a thinking marker is longer than %d bytes",
                       SP_GEN_MAX_THINK_TAG);
    }
    /* the message, then the marker, as one text: tokenized together they
     * read as the model would have written them */
    char text[SP_GEN_MAX_THINK_FORCE * 8];
    size_t ml = r->message ? r->message_len : 0;
    if (ml + lc >= sizeof text) {
        return sp_errf(err, cap, SP_ERR_INVALID,
                       "'reasoning_budget_message' is longer than %zu bytes",
                       sizeof text - lc - 1);
    }
    if (ml > 0) {
        memcpy(text, r->message, ml);
    }
    memcpy(text + ml, close, lc);
    int64_t n = sp_tokenizer_encode(tok, text, ml + lc, false, true, g->think_force,
                                    SP_GEN_MAX_THINK_FORCE);
    if (n < 0) {
        return sp_errf(err, cap, SP_ERR_INVALID,
                       "'reasoning_budget_message' cannot be tokenized (%s)",
                       sp_status_str((sp_status_t)n));
    }
    if (n == 0 || n > SP_GEN_MAX_THINK_FORCE) {
        return sp_errf(err, cap, SP_ERR_INVALID,
                       "'reasoning_budget_message' and the close marker take %lld tokens; at "
                       "most %d", (long long)n, SP_GEN_MAX_THINK_FORCE);
    }
    g->n_think_force = (int32_t)n;
    memcpy(g->think_open, open, lo + 1);
    memcpy(g->think_close, close, lc + 1);
    g->think_in_prompt = think_in_prompt;
    g->reasoning_budget = r->budget;
    return SP_OK;
}
