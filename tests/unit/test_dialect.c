/* test_dialect.c - what the request translators share (api/dialect.h): the
 * translation record's refusals and a content given as a string or a list
 * of text parts turned into chat text parts, with the part types one API
 * accepts. The translators themselves are checked against the real server
 * in tests/py/test_anthropic.py, test_responses.py and test_ollama.py. */
#include <string.h>

#include "test.h"

#include "api/dialect.h"

static const char *const text_types[] = {"input_text", "output_text", NULL};
static const char *const media_types[] = {"input_image", NULL};
static const sp_dialect_parts_t parts = {
    .param = "input",
    .noun = "content parts",
    .text = text_types,
    .refusal = "refusal",
    .media = media_types,
    .media_kinds = "images",
    .accepted = "input_text, output_text, refusal",
};

/* Translate content (JSON text): the parts' texts joined by '|' in out, or
 * the refusal's message; the return of sp_dialect_text_parts. */
static int
run(const char *content, sp_dialect_tx_t *tx, char *out, size_t cap)
{
    json_t *c = json_loads(content, JSON_DECODE_ANY, NULL);
    ASSERT(c != NULL);
    memset(tx, 0, sizeof *tx);
    json_t *ps = NULL;
    int rc = sp_dialect_text_parts(tx, c, "input[1].content", &parts, &ps);
    out[0] = '\0';
    size_t i;
    const json_t *p;
    json_array_foreach(ps, i, p) {
        ASSERT(strcmp(json_string_value(json_object_get(p, "type")), "text") == 0);
        if (i) {
            strncat(out, "|", cap - strlen(out) - 1);
        }
        strncat(out, json_string_value(json_object_get(p, "text")), cap - strlen(out) - 1);
    }
    json_decref(ps);
    json_decref(c);
    return rc;
}

TEST(dialect_text_parts_accepted)
{
    sp_dialect_tx_t tx;
    char out[256];
    ASSERT_EQ(run("\"hello\"", &tx, out, sizeof out), 0);
    ASSERT(strcmp(out, "hello") == 0);
    ASSERT_EQ(run("[{\"type\": \"input_text\", \"text\": \"a\"}, {\"type\": \"output_text\", "
                  "\"text\": \"b\"}, {\"type\": \"refusal\", \"refusal\": \"c\"}]", &tx, out, sizeof out), 0);
    ASSERT(strcmp(out, "a|b|c") == 0);
    ASSERT_EQ(run("[]", &tx, out, sizeof out), 0);
    ASSERT(strcmp(out, "") == 0);
    ASSERT_EQ(tx.status, 0);
}

TEST(dialect_text_parts_refused)
{
    sp_dialect_tx_t tx;
    char out[256];
    ASSERT_EQ(run("3", &tx, out, sizeof out), -1);
    ASSERT(tx.status == 400 && strcmp(tx.param, "input") == 0);
    ASSERT(strstr(tx.msg, "input[1].content must be a string or a list of content parts") != NULL);
    ASSERT_EQ(run("[{\"type\": \"input_text\", \"text\": \"a\"}, {\"type\": \"input_image\"}]", &tx, out,
                  sizeof out), -1);
    ASSERT(tx.status == 400 && strstr(tx.msg, "input[1].content[1]: 'input_image'") != NULL &&
           strstr(tx.msg, "images") != NULL);
    ASSERT_EQ(run("[{\"type\": \"tool_use\"}]", &tx, out, sizeof out), -1);
    ASSERT(strstr(tx.msg, "'tool_use' are not supported here (input_text, output_text, refusal)") != NULL);
    ASSERT_EQ(run("[\"x\"]", &tx, out, sizeof out), -1);
    ASSERT(strstr(tx.msg, "type '(none)'") != NULL);
    ASSERT_EQ(run("[{\"type\": \"refusal\", \"text\": \"x\"}]", &tx, out, sizeof out), -1);
    ASSERT(strstr(tx.msg, "a 'refusal' part needs a string 'refusal'") != NULL);
    ASSERT_EQ(run("[{\"type\": \"input_text\", \"text\": 1}]", &tx, out, sizeof out), -1);
    ASSERT(strstr(tx.msg, "a 'input_text' part needs a string 'text'") != NULL);
}

TEST(dialect_tx_record)
{
    sp_dialect_tx_t tx = {0};
    ASSERT_EQ(sp_dialect_fail(&tx, 404, "previous_response_id", "no %s", "such"), -1);
    ASSERT(tx.status == 404 && strcmp(tx.param, "previous_response_id") == 0 &&
           strcmp(tx.msg, "no such") == 0);
    ASSERT_EQ(sp_dialect_nomem(&tx), -1);
    ASSERT(tx.status == 503 && tx.param == NULL && strcmp(tx.msg, "out of memory") == 0);
    json_t *o = json_object();
    memset(&tx, 0, sizeof tx);
    ASSERT_EQ(sp_dialect_set(&tx, o, "k", json_integer(3)), 0);
    ASSERT_EQ(json_integer_value(json_object_get(o, "k")), 3);
    ASSERT_EQ(sp_dialect_set(&tx, o, "k", NULL), -1); /* a failed allocation upstream */
    ASSERT_EQ(tx.status, 503);
    json_decref(o);
}
