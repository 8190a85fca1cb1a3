/*
 * chat_input.c - the chat inputs of an OpenAI-style request checked and
 * gathered for the template (see chat_input.h).
 *
 * Threads: none; callers gather on a preparation worker. Memory: the
 * sp_chat_input_t's arrays and stores (sp_malloc), freed by
 * sp_chat_input_free; the extra variables' text is jansson's.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/json.h"
#include "api/chat_input.h"

void
sp_chat_input_init(sp_chat_input_t *ci)
{
    memset(ci, 0, sizeof *ci);
}

void
sp_chat_input_free(sp_chat_input_t *ci)
{
    sp_free(ci->msgs);
    sp_free(ci->offs);
    sp_jbuf_free(&ci->store);
    sp_jbuf_free(&ci->tc);
    sp_chat_input_init(ci);
}

static sp_status_t SP_PRINTF(4, 5)
fail(const char **param, char *err, size_t cap, const char *fmt, ...)
{
    *param = "messages";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return SP_ERR_INVALID;
}

static sp_status_t
nomem(const char **param, char *err, size_t cap)
{
    *param = NULL;
    snprintf(err, cap, "out of memory");
    return SP_ERR_NOMEM;
}

/* Message i's content (a string, or a list of text parts joined) appended
 * to store as a C string at *off (SIZE_MAX: null or absent). */
static sp_status_t
content_of(const json_t *c, size_t i, sp_jbuf_t *store, size_t *off, const char **param,
           char *err, size_t cap)
{
    *off = SIZE_MAX;
    if (c == NULL || json_is_null(c)) {
        return SP_OK;
    }
    size_t start = store->len;
    if (json_is_string(c)) {
        sp_jbuf_raw(store, json_string_value(c), json_string_length(c));
    } else if (json_is_array(c)) {
        for (size_t k = 0; k < json_array_size(c); k++) {
            const json_t *part = json_array_get(c, k);
            const char *type = NULL, *text = NULL;
            size_t tl = 0;
            sp_json_err_t e;
            if (json_is_object(part) && sp_json_get_str(part, "type", &type, NULL, &e) > 0 &&
                strcmp(type, "text") != 0) {
                return fail(param, err, cap,
                            "messages[%zu].content[%zu]: '%.32s' parts are not supported (the "
                            "served models take text only: parts {\"type\": \"text\", "
                            "\"text\": ...})", i, k, type);
            }
            if (!json_is_object(part) || type == NULL ||
                sp_json_get_str(part, "text", &text, &tl, &e) <= 0) {
                return fail(param, err, cap,
                            "messages[%zu].content: only parts {\"type\": \"text\", "
                            "\"text\": ...} are supported", i);
            }
            sp_jbuf_raw(store, text, tl);
        }
    } else {
        return fail(param, err, cap, "messages[%zu].content must be a string or a list of parts",
                    i);
    }
    if (memchr(store->p != NULL ? store->p + start : "", '\0', store->len - start) != NULL) {
        return fail(param, err, cap, "messages[%zu].content may not contain NUL", i);
    }
    sp_jbuf_raw(store, "", 1); /* the NUL that ends it: contents are C strings in store */
    *off = start;
    return SP_OK;
}

sp_status_t
sp_chat_input_gather(sp_chat_input_t *ci, const json_t *messages, const char **param, char *err,
                     size_t cap)
{
    size_t n = json_array_size(messages);
    ci->msgs = sp_calloc(n > 0 ? n : 1, sizeof *ci->msgs);
    ci->offs = sp_calloc(n > 0 ? 2 * n : 1, sizeof *ci->offs);
    if (ci->msgs == NULL || ci->offs == NULL) {
        return nomem(param, err, cap);
    }
    ci->n = n;
    sp_chat_msg_t *msgs = ci->msgs;
    size_t *offs = ci->offs;
    for (size_t i = 0; i < n; i++) {
        const json_t *mo = json_array_get(messages, i);
        sp_json_err_t e;
        const char *role = NULL;
        if (!json_is_object(mo) || sp_json_get_str(mo, "role", &role, NULL, &e) <= 0) {
            return fail(param, err, cap, "messages[%zu] must be an object with a string 'role'", i);
        }
        msgs[i].role = role;
        sp_status_t st = content_of(json_object_get(mo, "content"), i, &ci->store, &offs[2 * i],
                                    param, err, cap);
        if (st != SP_OK) {
            return st;
        }
        static const char *const keys[2] = {"name", "tool_call_id"};
        const char **dst[2] = {&msgs[i].name, &msgs[i].tool_call_id};
        for (int k = 0; k < 2; k++) {
            *dst[k] = NULL;
            if (sp_json_get_str(mo, keys[k], dst[k], NULL, &e) < 0) {
                return fail(param, err, cap, "messages[%zu].%s must be a string", i, keys[k]);
            }
        }
        const json_t *calls = json_object_get(mo, "tool_calls");
        offs[2 * i + 1] = SIZE_MAX;
        if (calls != NULL && !json_is_null(calls)) {
            offs[2 * i + 1] = ci->tc.len;
            sp_jbuf_json(&ci->tc, calls);
            sp_jbuf_raw(&ci->tc, "", 1);
        }
    }
    if (ci->store.oom || ci->tc.oom) {
        return nomem(param, err, cap);
    }
    for (size_t i = 0; i < n; i++) { /* the stores may have moved while growing */
        msgs[i].content = offs[2 * i] == SIZE_MAX ? NULL : ci->store.p + offs[2 * i];
        msgs[i].tool_calls = offs[2 * i + 1] == SIZE_MAX ? NULL : ci->tc.p + offs[2 * i + 1];
    }
    return SP_OK;
}

sp_status_t
sp_chat_input_options(const json_t *body, const json_t **kwargs, const char **effort,
                      const char **param, char *err, size_t cap)
{
    const json_t *kw = json_object_get(body, "chat_template_kwargs");
    const json_t *re = json_object_get(body, "reasoning_effort");
    *kwargs = NULL;
    *effort = NULL;
    if (kw != NULL && !json_is_null(kw)) {
        if (!json_is_object(kw)) {
            *param = "chat_template_kwargs";
            snprintf(err, cap, "'chat_template_kwargs' must be an object");
            return SP_ERR_INVALID;
        }
        *kwargs = kw;
    }
    if (re != NULL && !json_is_null(re)) {
        const char *v = json_string_value(re);
        if (v == NULL || (strcmp(v, "low") != 0 && strcmp(v, "medium") != 0 &&
                          strcmp(v, "high") != 0)) {
            *param = "reasoning_effort";
            snprintf(err, cap, "'reasoning_effort' must be \"low\", \"medium\" or \"high\"");
            return SP_ERR_INVALID;
        }
        *effort = v;
    }
    return SP_OK;
}

sp_status_t
sp_chat_input_extra_json(const json_t *kwargs, const char *effort, char **out)
{
    *out = NULL;
    if (kwargs == NULL && effort == NULL) {
        return SP_OK;
    }
    /* a deep copy: the request's JSON is left as it is (its reference counts
     * too, which the loop thread owns) */
    json_t *vars = kwargs != NULL ? json_deep_copy(kwargs) : json_object();
    if (vars == NULL) {
        return SP_ERR_NOMEM;
    }
    /* the client's own chat_template_kwargs.reasoning_effort wins */
    if (effort != NULL && json_object_get(vars, "reasoning_effort") == NULL &&
        json_object_set_new(vars, "reasoning_effort", json_string(effort)) != 0) {
        json_decref(vars);
        return SP_ERR_NOMEM;
    }
    *out = json_dumps(vars, JSON_COMPACT);
    json_decref(vars);
    return *out != NULL ? SP_OK : SP_ERR_NOMEM;
}
