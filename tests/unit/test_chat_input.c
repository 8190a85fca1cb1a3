/* test_chat_input.c - the chat messages' checks and gathering, and the
 * template's extra variables (api/chat_input.c); the routes that use them are
 * checked against the real server in tests/py/test_tokenize_routes.py. */
#include <string.h>

#include "test.h"

#include "core/jfree.h"
#include "core/json.h"
#include "api/chat_input.h"

static json_t *
parse(const char *text)
{
    json_t *v = NULL;
    char err[256];
    if (sp_json_parse(text, strlen(text), 64, &v, err, sizeof err) != SP_OK) {
        return NULL;
    }
    return v;
}

/* Gather text's messages; the status, with param and err filled on failure. */
static sp_status_t
gather(const char *text, sp_chat_input_t *ci, const char **param, char *err, size_t cap)
{
    json_t *ms = parse(text);
    sp_chat_input_init(ci);
    if (ms == NULL) {
        return SP_ERR_FORMAT; /* a broken test case, not a gathering error */
    }
    *param = NULL;
    err[0] = '\0';
    sp_status_t st = sp_chat_input_gather(ci, ms, param, err, cap);
    json_decref(ms); /* the messages' role and name pointed into it: not read after */
    return st;
}

TEST(chat_input_gathers_contents_and_calls)
{
    json_t *ms = parse("[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi \"},"
                       "{\"type\":\"text\",\"text\":\"there\"}],\"name\":\"bob\"},"
                       "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\"}]},"
                       "{\"role\":\"tool\",\"content\":\"42\",\"tool_call_id\":\"c1\"}]");
    ASSERT(ms != NULL);
    sp_chat_input_t ci;
    sp_chat_input_init(&ci);
    const char *param = NULL;
    char err[256];
    ASSERT_OK(sp_chat_input_gather(&ci, ms, &param, err, sizeof err));
    ASSERT_EQ(ci.n, 4);
    ASSERT_STR_EQ(ci.msgs[0].role, "system");
    ASSERT_STR_EQ(ci.msgs[0].content, "Be brief.");
    ASSERT_STR_EQ(ci.msgs[1].content, "Hi there"); /* parts joined */
    ASSERT_STR_EQ(ci.msgs[1].name, "bob");
    ASSERT(ci.msgs[2].content == NULL);
    ASSERT_STR_EQ(ci.msgs[2].tool_calls, "[{\"id\":\"c1\"}]");
    ASSERT(ci.msgs[3].tool_calls == NULL);
    ASSERT_STR_EQ(ci.msgs[3].tool_call_id, "c1");
    ASSERT(ci.msgs[0].name == NULL && ci.msgs[0].tool_call_id == NULL);
    sp_chat_input_free(&ci);
    json_decref(ms);
}

TEST(chat_input_errors_name_the_message)
{
    static const struct {
        const char *json, *message;
    } bad[] = {
        {"[{\"role\":\"user\",\"content\":\"x\"},{\"content\":\"y\"}]",
         "messages[1] must be an object with a string 'role'"},
        {"[3]", "messages[0] must be an object with a string 'role'"},
        {"[{\"role\":\"user\",\"content\":3}]",
         "messages[0].content must be a string or a list of parts"},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]",
         "messages[0].content[0]: 'image_url' parts are not supported (the served models take text "
         "only: parts {\"type\": \"text\", \"text\": ...})"},
        {"[{\"role\":\"user\",\"content\":[\"a\"]}]",
         "messages[0].content: only parts {\"type\": \"text\", \"text\": ...} are supported"},
        {"[{\"role\":\"user\",\"content\":\"a\",\"name\":5}]", "messages[0].name must be a string"},
        {"[{\"role\":\"user\",\"content\":\"a\",\"tool_call_id\":[]}]",
         "messages[0].tool_call_id must be a string"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sp_chat_input_t ci;
        const char *param;
        char err[256];
        ASSERT_EQ(gather(bad[i].json, &ci, &param, err, sizeof err), SP_ERR_INVALID);
        ASSERT_STR_EQ(param, "messages");
        ASSERT_STR_EQ(err, bad[i].message);
        sp_chat_input_free(&ci);
    }
}

TEST(chat_input_refuses_nul_in_content)
{
    /* the server's parser refuses \u0000 already; a JSON value built with
     * one (jansson allows it) is refused here too */
    json_t *ms = json_array();
    json_t *mo = json_object();
    json_object_set_new(mo, "role", json_string("user"));
    json_object_set_new(mo, "content", json_stringn("a\0b", 3));
    json_array_append_new(ms, mo);
    sp_chat_input_t ci;
    sp_chat_input_init(&ci);
    const char *param = NULL;
    char err[256];
    ASSERT_EQ(sp_chat_input_gather(&ci, ms, &param, err, sizeof err), SP_ERR_INVALID);
    ASSERT_STR_EQ(param, "messages");
    ASSERT_STR_EQ(err, "messages[0].content may not contain NUL");
    sp_chat_input_free(&ci);
    json_decref(ms);
}

TEST(chat_input_options_and_extra_variables)
{
    const json_t *kw;
    const char *effort, *param = NULL;
    char err[256];
    json_t *b = parse("{\"chat_template_kwargs\":{\"enable_thinking\":false},"
                      "\"reasoning_effort\":\"high\"}");
    ASSERT_OK(sp_chat_input_options(b, &kw, &effort, &param, err, sizeof err));
    ASSERT(kw != NULL);
    ASSERT_STR_EQ(effort, "high");
    char *extra = NULL;
    ASSERT_OK(sp_chat_input_extra_json(kw, effort, &extra));
    ASSERT_STR_EQ(extra, "{\"enable_thinking\":false,\"reasoning_effort\":\"high\"}");
    sp_jfree(extra);
    json_decref(b);

    /* the kwargs' own reasoning_effort wins */
    b = parse("{\"chat_template_kwargs\":{\"reasoning_effort\":\"low\"},\"reasoning_effort\":\"high\"}");
    ASSERT_OK(sp_chat_input_options(b, &kw, &effort, &param, err, sizeof err));
    ASSERT_OK(sp_chat_input_extra_json(kw, effort, &extra));
    ASSERT_STR_EQ(extra, "{\"reasoning_effort\":\"low\"}");
    sp_jfree(extra);
    json_decref(b);

    /* neither: no extra variables; null is absent */
    b = parse("{\"chat_template_kwargs\":null,\"reasoning_effort\":null}");
    ASSERT_OK(sp_chat_input_options(b, &kw, &effort, &param, err, sizeof err));
    ASSERT(kw == NULL && effort == NULL);
    ASSERT_OK(sp_chat_input_extra_json(kw, effort, &extra));
    ASSERT(extra == NULL);
    json_decref(b);

    static const struct {
        const char *json, *param;
    } bad[] = {
        {"{\"chat_template_kwargs\":[]}", "chat_template_kwargs"},
        {"{\"chat_template_kwargs\":\"x\"}", "chat_template_kwargs"},
        {"{\"reasoning_effort\":\"extreme\"}", "reasoning_effort"},
        {"{\"reasoning_effort\":\"\"}", "reasoning_effort"},
        {"{\"reasoning_effort\":1}", "reasoning_effort"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        b = parse(bad[i].json);
        ASSERT_EQ(sp_chat_input_options(b, &kw, &effort, &param, err, sizeof err), SP_ERR_INVALID);
        ASSERT_STR_EQ(param, bad[i].param);
        json_decref(b);
    }
}
