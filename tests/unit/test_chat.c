/*
 * test_chat.c - messages -> prompt: the built-in templates, real templates of
 * popular model families (tests/data/chat/, see its README for origins),
 * selection from a GGUF file, and bad messages.
 *
 * Every expected prompt below was written by hand from the template text and
 * Jinja's semantics (trim_blocks, lstrip_blocks), not copied from our output.
 */
#include "core/alloc.h"
#include "chat/chat.h"
#include "test.h"

static char g_err[512];

#define SYS "You are a helpful assistant."

/* A system message, then a multi-turn conversation (the assistant's answer
 * has blanks on both sides, to show which templates trim). */
static const sp_chat_msg_t conv_sys[] = {
    {"system", SYS, NULL, NULL, NULL},
    {"user", "Hello", NULL, NULL, NULL},
    {"assistant", " Hi there. ", NULL, NULL, NULL},
    {"user", "What is 2+2?", NULL, NULL, NULL},
};
#define CONV_NOSYS (conv_sys + 1)

static const char *weather_tool =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
    "\"Get the weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "
    "{\"type\": \"string\"}}, \"required\": [\"city\"]}}}]";

/* A tool round trip: question, call, result. */
static const sp_chat_msg_t conv_tool[] = {
    {"user", "Weather in Paris?", NULL, NULL, NULL},
    {"assistant", NULL,
     "[{\"id\": \"call00001\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
     "\"arguments\": {\"city\": \"Paris\"}}}]",
     NULL, NULL},
    {"tool", "22C", NULL, NULL, "call00001"},
};

static char *
apply(const sp_chat_template_t *t, const sp_chat_msg_t *m, size_t n, bool gen, const char *bos,
      const char *eos, const char *tools, const char *extra)
{
    sp_jinja_opts_t o = sp_jinja_default_opts();
    o.now = 1721952000; /* 2024-07-26 UTC, for templates that print today's date */
    sp_chat_params_t p = {gen, bos, eos, tools, extra, &o};
    char *out = NULL;
    size_t len = 0;
    sp_status_t st = sp_chat_apply_ex(t, m, n, &p, &out, &len, g_err, sizeof g_err);
    if (st != SP_OK) {
        SP_TEST_FAIL("%s: status %d: %s", sp_chat_template_name(t), (int)st, g_err);
    }
    ASSERT_EQ(strlen(out), len);
    return out;
}

static void
check(const char *what, char *got, const char *want)
{
    if (strcmp(got, want) != 0) {
        fprintf(stderr, "  %s\n  got  [%s]\n  want [%s]\n", what, got, want);
        exit(1);
    }
    sp_free(got);
}

static sp_chat_template_t *
builtin(const char *name)
{
    sp_chat_template_t *t = NULL;
    ASSERT_OK(sp_chat_template_builtin(name, &t, g_err, sizeof g_err));
    ASSERT_STR_EQ(sp_chat_template_name(t), name);
    return t;
}

static sp_chat_template_t *
fixture(const char *file)
{
    char path[256];
    snprintf(path, sizeof path, "tests/data/chat/%s", file);
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        SP_TEST_FAIL("cannot open %s", path);
    }
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    sp_chat_template_t *t = NULL;
    if (sp_chat_template_compile(buf, n, &t, g_err, sizeof g_err) != SP_OK) {
        SP_TEST_FAIL("%s: %s", file, g_err);
    }
    return t;
}

/* ---- built-ins -------------------------------------------------------- */
#define LLAMA2_SYS                                                                        \
    "<s>[INST] <<SYS>>\n" SYS "\n<</SYS>>\n\nHello [/INST] Hi there. </s>"                \
    "<s>[INST] What is 2+2? [/INST]"
#define LLAMA3_SYS                                                                        \
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" SYS "<|eot_id|>"   \
    "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"                         \
    "<|start_header_id|>assistant<|end_header_id|>\n\nHi there.<|eot_id|>"                \
    "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
#define LLAMA3_GEN "<|start_header_id|>assistant<|end_header_id|>\n\n"
#define CHATML_SYS                                                                        \
    "<|im_start|>system\n" SYS "<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"          \
    "<|im_start|>assistant\n Hi there. <|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
#define MISTRAL_SYS                                                                       \
    "<s>[INST] Hello[/INST] Hi there.</s>[INST] " SYS "\n\nWhat is 2+2?[/INST]"
#define PHI3_SYS                                                                          \
    "<|system|>\n" SYS "<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\n Hi there. <|end|>\n" \
    "<|user|>\nWhat is 2+2?<|end|>\n"
#define ZEPHYR_SYS                                                                        \
    "<|system|>\n" SYS "</s>\n<|user|>\nHello</s>\n<|assistant|>\n Hi there. </s>\n"      \
    "<|user|>\nWhat is 2+2?</s>\n"

TEST(chat_builtin_names)
{
    size_t n;
    const char *const *names = sp_chat_builtin_names(&n);
    const char *want[] = {"llama2", "llama3", "chatml", "mistral", "gemma", "phi3", "zephyr"};
    ASSERT_EQ(n, 7);
    for (size_t i = 0; i < n; i++) {
        ASSERT_STR_EQ(names[i], want[i]);
        sp_chat_template_destroy(builtin(names[i]));
    }
    sp_chat_template_t *t = (sp_chat_template_t *)1;
    ASSERT_EQ(sp_chat_template_builtin("vicuna", &t, g_err, sizeof g_err), SP_ERR_NOT_FOUND);
    ASSERT(t == NULL);
    ASSERT(strstr(g_err, "vicuna") != NULL);
    sp_chat_template_destroy(NULL);
}

TEST(chat_builtin_llama2)
{
    sp_chat_template_t *t = builtin("llama2");
    check("gen", apply(t, conv_sys, 4, true, "<s>", "</s>", NULL, NULL), LLAMA2_SYS);
    check("no gen", apply(t, conv_sys, 4, false, "<s>", "</s>", NULL, NULL), LLAMA2_SYS);
    check("no system", apply(t, CONV_NOSYS, 3, true, "<s>", "</s>", NULL, NULL),
          "<s>[INST] Hello [/INST] Hi there. </s><s>[INST] What is 2+2? [/INST]");
    sp_chat_template_destroy(t);
}

TEST(chat_builtin_llama3)
{
    sp_chat_template_t *t = builtin("llama3");
    check("gen", apply(t, conv_sys, 4, true, "<|begin_of_text|>", "<|eot_id|>", NULL, NULL),
          LLAMA3_SYS LLAMA3_GEN);
    check("no gen", apply(t, conv_sys, 4, false, "<|begin_of_text|>", "<|eot_id|>", NULL, NULL),
          LLAMA3_SYS);
    check("tools", apply(t, conv_tool, 3, true, "<|begin_of_text|>", "", NULL, NULL),
          "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWeather in Paris?<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n"
          "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>"
          "<|start_header_id|>ipython<|end_header_id|>\n\n22C<|eot_id|>" LLAMA3_GEN);
    sp_chat_template_destroy(t);
}

TEST(chat_builtin_chatml)
{
    sp_chat_template_t *t = builtin("chatml");
    check("gen", apply(t, conv_sys, 4, true, "", "<|im_end|>", NULL, NULL),
          CHATML_SYS "<|im_start|>assistant\n");
    check("no gen", apply(t, conv_sys, 4, false, "", "<|im_end|>", NULL, NULL), CHATML_SYS);
    check("tools", apply(t, conv_tool, 3, true, "", "", NULL, NULL),
          "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
          "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
          "{\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
          "<|im_start|>tool\n22C<|im_end|>\n<|im_start|>assistant\n");
    sp_chat_template_destroy(t);
}

TEST(chat_builtin_mistral)
{
    sp_chat_template_t *t = builtin("mistral");
    check("gen", apply(t, conv_sys, 4, true, "<s>", "</s>", NULL, NULL), MISTRAL_SYS);
    check("no gen", apply(t, conv_sys, 4, false, "<s>", "</s>", NULL, NULL), MISTRAL_SYS);
    check("no system", apply(t, CONV_NOSYS, 3, true, "<s>", "</s>", NULL, NULL),
          "<s>[INST] Hello[/INST] Hi there.</s>[INST] What is 2+2?[/INST]");
    sp_chat_template_destroy(t);
}

TEST(chat_builtin_gemma)
{
    sp_chat_template_t *t = builtin("gemma");
    const char *body = "<bos><start_of_turn>user\n" SYS "\n\nHello<end_of_turn>\n"
                       "<start_of_turn>model\nHi there.<end_of_turn>\n"
                       "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n";
    char want[1024];
    snprintf(want, sizeof want, "%s<start_of_turn>model\n", body);
    check("gen", apply(t, conv_sys, 4, true, "<bos>", "<eos>", NULL, NULL), want);
    check("no gen", apply(t, conv_sys, 4, false, "<bos>", "<eos>", NULL, NULL), body);
    sp_chat_template_destroy(t);
}

TEST(chat_builtin_phi3)
{
    sp_chat_template_t *t = builtin("phi3");
    check("gen", apply(t, conv_sys, 4, true, "<s>", "<|endoftext|>", NULL, NULL),
          PHI3_SYS "<|assistant|>\n");
    check("no gen", apply(t, conv_sys, 4, false, "<s>", "<|endoftext|>", NULL, NULL),
          PHI3_SYS "<|endoftext|>");
    sp_chat_template_destroy(t);
}

TEST(chat_builtin_zephyr)
{
    sp_chat_template_t *t = builtin("zephyr");
    check("gen", apply(t, conv_sys, 4, true, "<s>", "</s>", NULL, NULL),
          ZEPHYR_SYS "<|assistant|>\n");
    check("no gen", apply(t, conv_sys, 4, false, "<s>", "</s>", NULL, NULL), ZEPHYR_SYS);
    sp_chat_template_destroy(t);
}

TEST(chat_builtin_role_errors)
{
    /* Families without a tool role say so instead of rendering garbage
     * (llama2 has one: tool results are <tool_response> user turns). */
    const char *names[] = {"mistral", "gemma", "phi3", "zephyr"};
    for (size_t i = 0; i < 4; i++) {
        sp_chat_template_t *t = builtin(names[i]);
        char *out = NULL;
        size_t len;
        ASSERT_EQ(sp_chat_apply(t, conv_tool, 3, true, "<s>", "</s>", &out, &len, g_err,
                                sizeof g_err),
                  SP_ERR_INVALID);
        ASSERT(out == NULL);
        ASSERT(strstr(g_err, "role") != NULL);
        sp_chat_template_destroy(t);
    }
    sp_chat_template_t *t = builtin("llama2");
    char *out = NULL;
    size_t len;
    ASSERT_OK(sp_chat_apply(t, conv_tool, 3, true, "<s>", "</s>", &out, &len, g_err, sizeof g_err));
    ASSERT(strstr(out, "<tool_response>") != NULL && strstr(out, "<tool_call>") != NULL);
    sp_free(out);
    sp_chat_template_destroy(t);
}

/* ---- real templates --------------------------------------------------- */
TEST(chat_real_llama2)
{
    sp_chat_template_t *t = fixture("meta-llama-Llama-2-7b-chat.jinja");
    check("llama2", apply(t, conv_sys, 4, true, "<s>", "</s>", NULL, NULL), LLAMA2_SYS);
    /* Two user turns in a row break its alternation check. */
    sp_chat_msg_t bad[] = {{"user", "a", NULL, NULL, NULL}, {"user", "b", NULL, NULL, NULL}};
    char *out;
    size_t len;
    ASSERT_EQ(sp_chat_apply(t, bad, 2, true, "<s>", "</s>", &out, &len, g_err, sizeof g_err),
              SP_ERR_INVALID);
    ASSERT(strstr(g_err, "Conversation roles must alternate") != NULL);
    sp_chat_template_destroy(t);
}

TEST(chat_real_llama3)
{
    sp_chat_template_t *t = fixture("meta-llama-Meta-Llama-3-8B-Instruct.jinja");
    check("gen", apply(t, conv_sys, 4, true, "<|begin_of_text|>", "<|eot_id|>", NULL, NULL),
          LLAMA3_SYS LLAMA3_GEN);
    check("no gen", apply(t, conv_sys, 4, false, "<|begin_of_text|>", "<|eot_id|>", NULL, NULL),
          LLAMA3_SYS);
    sp_chat_template_destroy(t);
}

TEST(chat_real_llama32)
{
    sp_chat_template_t *t = fixture("meta-llama-Llama-3.2-3B-Instruct.jinja");
    check("chat", apply(t, conv_sys, 4, true, "<|begin_of_text|>", "<|eot_id|>", NULL, NULL),
          "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
          "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n" SYS "<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\nHi there.<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>" LLAMA3_GEN);
    /* With tools: they go into the first user turn as indented JSON. */
    check("tools", apply(t, conv_tool, 1, true, "<|begin_of_text|>", "<|eot_id|>", weather_tool,
                         NULL),
          "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
          "Environment: ipython\nCutting Knowledge Date: December 2023\n"
          "Today Date: 26 Jul 2024\n\n<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\n"
          "Given the following functions, please respond with a JSON for a function call "
          "with its proper arguments that best answers the given prompt.\n\n"
          "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument "
          "name and its value}.Do not use variables.\n\n"
          "{\n    \"type\": \"function\",\n    \"function\": {\n"
          "        \"name\": \"get_weather\",\n        \"description\": \"Get the weather\",\n"
          "        \"parameters\": {\n            \"type\": \"object\",\n"
          "            \"properties\": {\n                \"city\": {\n"
          "                    \"type\": \"string\"\n                }\n            },\n"
          "            \"required\": [\n                \"city\"\n            ]\n"
          "        }\n    }\n}\n\nWeather in Paris?<|eot_id|>" LLAMA3_GEN);
    sp_chat_template_destroy(t);
}

TEST(chat_real_qwen25)
{
    sp_chat_template_t *t = fixture("Qwen-Qwen2.5-7B-Instruct.jinja");
    check("chat", apply(t, conv_sys, 4, true, "", "<|im_end|>", NULL, NULL),
          CHATML_SYS "<|im_start|>assistant\n");
    check("default system", apply(t, CONV_NOSYS, 1, true, "", "<|im_end|>", NULL, NULL),
          "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
          "assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
    check("tools", apply(t, conv_tool, 3, true, "", "<|im_end|>", weather_tool, NULL),
          "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
          "assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
          "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
          "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
          "\"description\": \"Get the weather\", \"parameters\": {\"type\": \"object\", "
          "\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n"
          "</tools>\n\nFor each function call, return a json object with function name and "
          "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
          "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
          "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
          "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
          "{\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
          "<|im_start|>user\n<tool_response>\n22C\n</tool_response><|im_end|>\n"
          "<|im_start|>assistant\n");
    sp_chat_template_destroy(t);
}

TEST(chat_real_qwen3_thinking)
{
    sp_chat_template_t *t = fixture("Qwen-Qwen3-0.6B.jinja");
    const sp_chat_msg_t think[] = {
        {"user", "Hi", NULL, NULL, NULL},
        {"assistant", "<think>\nhmm\n</think>\n\nHello!", NULL, NULL, NULL},
        {"user", "And?", NULL, NULL, NULL},
        {"assistant", "<think>\nagain\n</think>\n\nMore.", NULL, NULL, NULL},
    };
    /* Reasoning of earlier turns is dropped; the last answer keeps it. */
    check("history", apply(t, think, 4, false, "", "", NULL, NULL),
          "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
          "<|im_start|>user\nAnd?<|im_end|>\n"
          "<|im_start|>assistant\n<think>\nagain\n</think>\n\nMore.<|im_end|>\n");
    check("no thinking", apply(t, conv_sys, 2, true, "", "", NULL, "{\"enable_thinking\": false}"),
          "<|im_start|>system\n" SYS "<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
          "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    sp_chat_template_destroy(t);
}

TEST(chat_real_mistral)
{
    sp_chat_template_t *t = fixture("mistralai-Mistral-7B-Instruct-v0.3.jinja");
    check("v0.3", apply(t, conv_sys, 4, true, "<s>", "</s>", NULL, NULL), MISTRAL_SYS);
    sp_chat_template_destroy(t);
    t = fixture("mistralai-Mistral-7B-Instruct-v0.2.jinja");
    check("v0.2", apply(t, CONV_NOSYS, 3, true, "<s>", "</s>", NULL, NULL),
          "<s>[INST] Hello [/INST] Hi there. </s>[INST] What is 2+2? [/INST]");
    char *out;
    size_t len;
    ASSERT_EQ(sp_chat_apply(t, conv_sys, 4, true, "<s>", "</s>", &out, &len, g_err, sizeof g_err),
              SP_ERR_INVALID);
    ASSERT(strstr(g_err, "Conversation roles must alternate") != NULL);
    sp_chat_template_destroy(t);
}

TEST(chat_real_gemma2)
{
    sp_chat_template_t *t = fixture("google-gemma-2-2b-it.jinja");
    check("gemma2", apply(t, CONV_NOSYS, 3, true, "<bos>", "<eos>", NULL, NULL),
          "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi there."
          "<end_of_turn>\n<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n");
    char *out;
    size_t len;
    ASSERT_EQ(sp_chat_apply(t, conv_sys, 4, true, "<bos>", "<eos>", &out, &len, g_err,
                            sizeof g_err),
              SP_ERR_INVALID);
    ASSERT(strstr(g_err, "System role not supported") != NULL);
    sp_chat_template_destroy(t);
}

TEST(chat_real_phi35)
{
    sp_chat_template_t *t = fixture("microsoft-Phi-3.5-mini-instruct.jinja");
    check("gen", apply(t, conv_sys, 4, true, "<s>", "<|endoftext|>", NULL, NULL),
          PHI3_SYS "<|assistant|>\n");
    check("no gen", apply(t, conv_sys, 4, false, "<s>", "<|endoftext|>", NULL, NULL),
          PHI3_SYS "<|endoftext|>");
    sp_chat_template_destroy(t);
}

TEST(chat_real_zephyr)
{
    sp_chat_template_t *t = fixture("HuggingFaceH4-zephyr-7b-beta.jinja");
    check("gen", apply(t, conv_sys, 4, true, "<s>", "</s>", NULL, NULL),
          ZEPHYR_SYS "<|assistant|>\n");
    check("no gen", apply(t, conv_sys, 4, false, "<s>", "</s>", NULL, NULL), ZEPHYR_SYS);
    sp_chat_template_destroy(t);
}

TEST(chat_real_hermes3_macros)
{
    sp_chat_template_t *t = fixture("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja");
    check("tools", apply(t, conv_tool, 3, true, "<|begin_of_text|>", "", weather_tool, NULL),
          "<|begin_of_text|><|im_start|>system\nYou are a function calling AI model. You are "
          "provided with function signatures within <tools></tools> XML tags. You may call one "
          "or more functions to assist with the user query. Don't make assumptions about what "
          "values to plug into functions. Here are the available tools: <tools> "
          "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
          "\"get_weather(city: str) - Get the weather\n\n    Args:\n        city(str): \", "
          "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
          "\"string\"}}, \"required\": [\"city\"]}} </tools>"
          "Use the following pydantic model json schema for each tool call you will make: "
          "{\"properties\": {\"name\": {\"title\": \"Name\", \"type\": \"string\"}, \"arguments\": "
          "{\"title\": \"Arguments\", \"type\": \"object\"}}, \"required\": [\"name\", "
          "\"arguments\"], \"title\": \"FunctionCall\", \"type\": \"object\"}}\n"
          "For each function call return a json object with function name and arguments within "
          "<tool_call></tool_call> XML tags as follows:\n<tool_call>\n"
          "{\"name\": <function-name>, \"arguments\": <args-dict>}\n</tool_call><|im_end|>\n"
          "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
          "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
          "{\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
          "<|im_start|>tool\n<tool_response>\n22C\n</tool_response><|im_end|>"
          "<|im_start|>assistant\n");
    sp_chat_template_destroy(t);
}

/* ---- bad messages and bad templates ----------------------------------- */
static void
expect_msg_error(const sp_chat_template_t *t, const sp_chat_msg_t *m, size_t n,
                 const char *needle)
{
    char *out = (char *)1;
    size_t len;
    ASSERT_EQ(sp_chat_apply(t, m, n, true, "<s>", "</s>", &out, &len, g_err, sizeof g_err),
              SP_ERR_INVALID);
    ASSERT(out == NULL);
    if (strstr(g_err, needle) == NULL) {
        SP_TEST_FAIL("error [%s] lacks [%s]", g_err, needle);
    }
}

TEST(chat_bad_messages)
{
    sp_chat_template_t *t = builtin("chatml");
    sp_chat_msg_t m[2] = {{"user", "ok", NULL, NULL, NULL}, {"wizard", "x", NULL, NULL, NULL}};
    expect_msg_error(t, m, 2, "message 1: unknown role 'wizard'");
    m[1].role = NULL;
    expect_msg_error(t, m, 2, "message 1: missing role");
    m[1].role = "user";
    m[1].content = NULL;
    expect_msg_error(t, m, 2, "message 1 (user): missing content");
    m[1].role = "assistant";
    expect_msg_error(t, m, 2, "missing content");
    m[1].content = "bad \xff utf-8";
    expect_msg_error(t, m, 2, "content is not valid UTF-8");
    m[1].content = "fine";
    m[1].tool_calls = "{\"not\": \"an array\"}";
    expect_msg_error(t, m, 2, "tool_calls must be a JSON array");
    m[1].tool_calls = "[{\"broken\": }]";
    expect_msg_error(t, m, 2, "tool_calls");
    m[1].tool_calls = NULL;
    sp_chat_params_t p = {true, "", "", "{\"not\": \"a list\"}", NULL, NULL};
    char *out;
    size_t len;
    ASSERT_EQ(sp_chat_apply_ex(t, m, 2, &p, &out, &len, g_err, sizeof g_err), SP_ERR_INVALID);
    ASSERT(strstr(g_err, "tools must be a JSON array") != NULL);
    p.tools_json = NULL;
    p.extra_json = "[1]";
    ASSERT_EQ(sp_chat_apply_ex(t, m, 2, &p, &out, &len, g_err, sizeof g_err), SP_ERR_INVALID);
    /* Control characters and quotes in content travel through the JSON context intact. */
    m[1].content = "a\"b\\c\n\x01";
    check("escapes", apply(t, m, 2, false, "", "", NULL, NULL),
          "<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\na\"b\\c\n\x01<|im_end|>\n");
    /* No messages at all is allowed: the template decides. */
    check("empty", apply(t, m, 0, true, "", "", NULL, NULL), "<|im_start|>assistant\n");
    sp_chat_template_destroy(t);
}

TEST(chat_bad_templates)
{
    sp_chat_template_t *t = NULL;
    const char *src = "{% for m in messages %}{{ m.content }";
    ASSERT_EQ(sp_chat_template_compile(src, strlen(src), &t, g_err, sizeof g_err), SP_ERR_INVALID);
    ASSERT(t == NULL);
    ASSERT(strstr(g_err, "line 1") != NULL);
    size_t big = SP_CHAT_MAX_TEMPLATE_BYTES + 1;
    char *huge = malloc(big);
    memset(huge, 'x', big);
    ASSERT_EQ(sp_chat_template_compile(huge, big, &t, g_err, sizeof g_err), SP_ERR_TOO_LARGE);
    free(huge);
    /* A hostile template from a model file: a loop bomb fails fast with a message. */
    src = "{% for a in messages %}{% for b in range(100000) %}{% for c in range(100000) %}"
          "{% endfor %}{% endfor %}{% endfor %}";
    ASSERT_OK(sp_chat_template_compile(src, strlen(src), &t, g_err, sizeof g_err));
    char *out;
    size_t len;
    ASSERT_EQ(sp_chat_apply(t, conv_sys, 4, true, "", "", &out, &len, g_err, sizeof g_err),
              SP_ERR_TOO_LARGE);
    ASSERT(strstr(g_err, "limit") != NULL);
    sp_chat_template_destroy(t);
}

/* ---- selection from a GGUF file --------------------------------------- */
static sp_gguf_t *
make_gguf(const char *arch, const char *const *tokens, size_t n_tokens, const char *tmpl,
          void **mem)
{
    sp_gguf_writer_t *w;
    ASSERT_OK(sp_gguf_writer_create(&w));
    ASSERT_OK(sp_gguf_writer_set_str(w, "general.architecture", arch));
    if (n_tokens > 0) {
        ASSERT_OK(sp_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, n_tokens));
    }
    if (tmpl != NULL) {
        ASSERT_OK(sp_gguf_writer_set_str(w, "tokenizer.chat_template", tmpl));
    }
    size_t len;
    ASSERT_OK(sp_gguf_writer_write_mem(w, mem, &len, g_err, sizeof g_err));
    sp_gguf_writer_destroy(w);
    sp_gguf_t *g;
    ASSERT_OK(sp_gguf_open_mem(*mem, len, "test", &g, g_err, sizeof g_err));
    return g;
}

TEST(chat_detect_and_select)
{
    static const struct {
        const char *arch;
        const char *tokens[3];
        const char *want;
    } cases[] = {
        {"llama", {"<unk>", "<|eot_id|>", "a"}, "llama3"},
        {"qwen2", {"<|im_start|>", "<|im_end|>", "a"}, "chatml"},
        {"gemma2", {"<bos>", "<start_of_turn>", "<end_of_turn>"}, "gemma"},
        {"phi3", {"<|end|>", "<|assistant|>", "a"}, "phi3"},
        {"llama", {"<s>", "[INST]", "[/INST]"}, "mistral"},
        {"llama", {"<s>", "</s>", "a"}, "llama2"},
        {"gpt2", {"a", "b", "c"}, "chatml"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        void *mem;
        sp_gguf_t *g = make_gguf(cases[i].arch, cases[i].tokens, 3, NULL, &mem);
        ASSERT_STR_EQ(sp_chat_detect_builtin(g), cases[i].want);
        sp_chat_template_t *t;
        ASSERT_OK(sp_chat_template_from_gguf(g, NULL, &t, g_err, sizeof g_err));
        ASSERT_STR_EQ(sp_chat_template_name(t), cases[i].want);
        sp_chat_template_destroy(t);
        sp_gguf_close(g);
        sp_free(mem);
    }
    /* The file's own template wins over detection; a name wins over both. */
    void *mem;
    const char *toks[] = {"<|im_start|>"};
    sp_gguf_t *g = make_gguf("qwen2", toks, 1, "{{ messages | length }} messages", &mem);
    sp_chat_template_t *t;
    ASSERT_OK(sp_chat_template_from_gguf(g, NULL, &t, g_err, sizeof g_err));
    ASSERT_STR_EQ(sp_chat_template_name(t), "gguf");
    check("file template", apply(t, conv_sys, 4, true, "", "", NULL, NULL), "4 messages");
    sp_chat_template_destroy(t);
    ASSERT_OK(sp_chat_template_from_gguf(g, "zephyr", &t, g_err, sizeof g_err));
    ASSERT_STR_EQ(sp_chat_template_name(t), "zephyr");
    sp_chat_template_destroy(t);
    sp_gguf_close(g);
    sp_free(mem);
    /* A broken template in the file is an error, not a silent fallback. */
    g = make_gguf("llama", toks, 1, "{% if %}", &mem);
    ASSERT_EQ(sp_chat_template_from_gguf(g, NULL, &t, g_err, sizeof g_err), SP_ERR_INVALID);
    ASSERT(t == NULL);
    sp_gguf_close(g);
    sp_free(mem);
}

/* The BOS rule (sp_chat_add_bos): a template that writes the BOS text gets no
 * second BOS; one that does not, and a plain prompt, get the vocabulary's. */
TEST(chat_add_bos_rule)
{
    sp_gguf_t *g;
    sp_tokenizer_t *tok;
    ASSERT_OK(sp_gguf_open("tests/data/tokenizer/ggml-vocab-llama-spm.gguf", &g, g_err,
                           sizeof g_err));
    ASSERT_OK(sp_tokenizer_from_gguf(g, &tok, g_err, sizeof g_err));
    ASSERT(sp_tokenizer_add_bos(tok));
    const int32_t bos = sp_tokenizer_bos(tok);
    ASSERT(bos >= 0);
    sp_str_t bt = sp_tokenizer_token_text(tok, bos);
    ASSERT_EQ(bt.len, 3u); /* "<s>" */

    /* llama2 writes bos_token at the start of every turn. */
    sp_chat_template_t *t;
    ASSERT_OK(sp_chat_template_builtin("llama2", &t, g_err, sizeof g_err));
    char *p = apply(t, CONV_NOSYS, 1, true, "<s>", "</s>", NULL, NULL);
    ASSERT(strncmp(p, "<s>", 3) == 0);
    ASSERT(!sp_chat_add_bos(tok, p, strlen(p)));
    /* Tokenized with the rule, the prompt starts with exactly one BOS. */
    int32_t ids[256];
    int64_t n = sp_tokenizer_encode(tok, p, strlen(p), sp_chat_add_bos(tok, p, strlen(p)), true, ids,
                                    256);
    ASSERT(n >= 2 && n <= 256);
    ASSERT_EQ(ids[0], bos);
    ASSERT(ids[1] != bos);
    /* Only the rendered text's start counts: a prefix shorter than the BOS text
     * or the BOS text later on still gets one. */
    ASSERT(sp_chat_add_bos(tok, p, 2));
    ASSERT(sp_chat_add_bos(tok, p + 1, strlen(p) - 1));
    sp_free(p);
    sp_chat_template_destroy(t);

    /* chatml never writes it: the vocabulary's BOS is added. */
    ASSERT_OK(sp_chat_template_builtin("chatml", &t, g_err, sizeof g_err));
    p = apply(t, CONV_NOSYS, 1, true, "<s>", "</s>", NULL, NULL);
    ASSERT(sp_chat_add_bos(tok, p, strlen(p)));
    sp_free(p);
    sp_chat_template_destroy(t);

    /* A plain prompt: its text is never taken for the BOS token. */
    ASSERT(sp_chat_add_bos(tok, NULL, 0));
    sp_tokenizer_destroy(tok);
    sp_gguf_close(g);

    /* A vocabulary that asks for no BOS gets none, whatever the text. */
    ASSERT_OK(sp_gguf_open("tests/data/tokenizer/ggml-vocab-gpt-2.gguf", &g, g_err, sizeof g_err));
    ASSERT_OK(sp_tokenizer_from_gguf(g, &tok, g_err, sizeof g_err));
    ASSERT(!sp_tokenizer_add_bos(tok));
    ASSERT(!sp_chat_add_bos(tok, NULL, 0));
    ASSERT(!sp_chat_add_bos(tok, "hello", 5));
    sp_tokenizer_destroy(tok);
    sp_gguf_close(g);
}
