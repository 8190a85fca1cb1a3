/*
 * test_answer.c - chat answers taken apart (constrain/answer.h, toolcall.h)
 * and template families recognised (chat/family.c): for each family a
 * model-like answer, written as the family's template renders an assistant
 * turn, gives the expected reasoning, content and calls; and the same text
 * streamed one byte at a time gives, at every prefix, reasoning and content
 * that are prefixes of the one-shot parse, whose deltas add up to it.
 */
#include <jansson.h>

#include "test.h"
#include "chat/chat.h"
#include "constrain/answer.h"
#include "constrain/toolcall.h"
#include "core/alloc.h"
#include "gguf/gguf.h"
#include "text/tokenizer.h"

#define DS(x) "<\xef\xbd\x9ctool\xe2\x96\x81" x "\xef\xbd\x9c>"

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
    "\"days\":{\"type\":\"integer\"}}}}}]";

static bool
prefix_of(const sp_jbuf_t *a, const sp_jbuf_t *b)
{
    return a->len <= b->len && (a->len == 0 || memcmp(a->p, b->p, a->len) == 0);
}

static void
expect_buf(const sp_jbuf_t *b, const char *want, const char *what, const char *text)
{
    size_t n = strlen(want);
    if (b->oom || b->len != n || (n && memcmp(b->p, want, n) != 0)) {
        SP_TEST_FAIL("%s of <<%s>>: got \"%.*s\", want \"%s\"", what, text, (int)b->len,
                     b->p ? b->p : "", want);
    }
}

/*
 * One answer: the one-shot parse is (reasoning, content, calls); then the
 * stream, byte by byte, as openai.c sends it: deltas of the partial parses,
 * then the rest from the final parse.
 */
static void
check(const sp_answer_fmt_t *f0, const char *text, const char *reasoning, const char *content,
      const char *calls)
{
    sp_answer_fmt_t f = *f0;
    json_t *tools = json_loads(TOOLS, 0, NULL);
    f.tool_list = tools;
    size_t len = strlen(text);
    sp_answer_t whole = {0};
    sp_answer_parse(&f, text, len, false, &whole);
    expect_buf(&whole.reasoning, reasoning, "reasoning", text);
    expect_buf(&whole.content, content, "content", text);
    if (calls == NULL) {
        if (whole.calls != NULL) {
            char *s = json_dumps(whole.calls, JSON_COMPACT);
            SP_TEST_FAIL("calls of <<%s>>: got %s, want none", text, s);
        }
    } else {
        json_t *want = json_loads(calls, 0, NULL);
        ASSERT(want != NULL);
        if (!json_equal(want, whole.calls)) {
            char *s = whole.calls ? json_dumps(whole.calls, JSON_COMPACT) : NULL;
            SP_TEST_FAIL("calls of <<%s>>: got %s, want %s", text, s ? s : "none", calls);
        }
        json_decref(want);
    }
    /* streamed a byte at a time */
    sp_jbuf_t r = {0}, c = {0};
    sp_answer_t part = {0};
    for (size_t k = 0; k <= len; k++) {
        sp_answer_parse(&f, text, k, true, &part);
        if (!prefix_of(&part.reasoning, &whole.reasoning) || !prefix_of(&part.content, &whole.content)) {
            SP_TEST_FAIL("<<%s>> cut at %zu: \"%.*s\" / \"%.*s\" is not a prefix of the whole "
                         "answer's reasoning / content", text, k, (int)part.reasoning.len,
                         part.reasoning.p ? part.reasoning.p : "", (int)part.content.len,
                         part.content.p ? part.content.p : "");
        }
        if (part.reasoning.len > r.len) {
            sp_jbuf_raw(&r, part.reasoning.p + r.len, part.reasoning.len - r.len);
        }
        if (part.content.len > c.len) {
            sp_jbuf_raw(&c, part.content.p + c.len, part.content.len - c.len);
        }
        ASSERT(part.calls == NULL);
    }
    if (whole.reasoning.len > r.len) {
        sp_jbuf_raw(&r, whole.reasoning.p + r.len, whole.reasoning.len - r.len);
    }
    if (whole.content.len > c.len) {
        sp_jbuf_raw(&c, whole.content.p + c.len, whole.content.len - c.len);
    }
    expect_buf(&r, reasoning, "streamed reasoning", text);
    expect_buf(&c, content, "streamed content", text);
    sp_jbuf_free(&r);
    sp_jbuf_free(&c);
    sp_answer_free(&part);
    sp_answer_free(&whole);
    json_decref(tools);
}

static sp_answer_fmt_t
fmt(sp_chat_tools_t t, sp_chat_reasoning_t r)
{
    return (sp_answer_fmt_t){.tools = t, .reasoning = r, .parse_tools = true};
}

#define PARIS "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}]"

TEST(answer_think)
{
    sp_answer_fmt_t f = fmt(SP_CHAT_TOOLS_HERMES, SP_CHAT_REASONING_THINK);
    f.parse_tools = false;
    check(&f, "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?",
          "The user greets me.", "Hello! How can I help?", NULL);
    /* a cut at the budget: the thinking so far, no content */
    check(&f, "<think>\nLet me count: 1, 2", "Let me count: 1, 2", "", NULL);
    /* Qwen3 with enable_thinking false: an empty block */
    check(&f, "<think>\n\n</think>\n\nHi.", "", "Hi.", NULL);
    /* no block: all content; a tag later in the text is just text */
    check(&f, "Plain answer about <think> tags.", "", "Plain answer about <think> tags.", NULL);
    check(&f, "<thin", "", "<thin", NULL);
    /* the prompt ended with <think>\n (QwQ, DeepSeek-R1): no open tag in the answer */
    f.think_open = true;
    check(&f, "Okay, 2+2 is 4.\n</think>\n\nIt is **4**.", "Okay, 2+2 is 4.", "It is **4**.", NULL);
    /* reasoning_format none: as written */
    f.think_open = false;
    f.inline_reasoning = true;
    check(&f, "<think>\nhmm\n</think>\n\nYes.", "", "<think>\nhmm\n</think>\n\nYes.", NULL);
    check(&f, "<think>\nhmm", "", "<think>\nhmm", NULL);
}

TEST(answer_think_tags_per_family)
{
    sp_answer_fmt_t f = fmt(SP_CHAT_TOOLS_SEED, SP_CHAT_REASONING_SEED);
    f.parse_tools = false;
    check(&f, "<seed:think>plan</seed:think>Done.", "plan", "Done.", NULL);
    f.reasoning = SP_CHAT_REASONING_MISTRAL;
    check(&f, "[THINK]Check units.[/THINK]42 km", "Check units.", "42 km", NULL);
    f.reasoning = SP_CHAT_REASONING_COMMAND;
    check(&f, "<|START_THINKING|>Look it up.<|END_THINKING|>Here.", "Look it up.", "Here.", NULL);
    f.reasoning = SP_CHAT_REASONING_GEMMA4;
    check(&f, "<|channel>thought\nShort.<channel|>Answer.", "Short.", "Answer.", NULL);
    f.reasoning = SP_CHAT_REASONING_MINIMAX;
    check(&f, "<mm:think>Brief.</mm:think>\n\nOK.", "Brief.", "OK.", NULL);
    /* Command R7B wraps the answer too */
    f.reasoning = SP_CHAT_REASONING_COMMAND;
    check(&f, "<|START_THINKING|>Easy.<|END_THINKING|><|START_RESPONSE|>It is 4.<|END_RESPONSE|>",
          "Easy.", "It is 4.", NULL);
    check(&f, "<|START_RESPONSE|>Hi.", "", "Hi.", NULL);
    /* Granite 3.3 with thinking: the answer in <response> */
    f.reasoning = SP_CHAT_REASONING_GRANITE;
    check(&f, "<think>Recall the capital.</think><response>Paris.</response>", "Recall the capital.",
          "Paris.", NULL);
    check(&f, "Paris.", "", "Paris.", NULL);
    /* Apriel 1.6: the prompt ends with "Here are my reasoning steps:\n" */
    f.reasoning = SP_CHAT_REASONING_APRIEL;
    f.think_open = true;
    check(&f, "1. Add.\n[BEGIN FINAL RESPONSE]\nFour.\n[END FINAL RESPONSE]", "1. Add.", "Four.\n", NULL);
}

TEST(answer_harmony)
{
    sp_answer_fmt_t f = fmt(SP_CHAT_TOOLS_HARMONY, SP_CHAT_REASONING_HARMONY);
    check(&f, "<|channel|>analysis<|message|>User asks 2+2. Simple.<|end|>"
              "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.",
          "User asks 2+2. Simple.", "2 + 2 = 4.", NULL);
    check(&f, "<|channel|>analysis<|message|>Need the weather tool.<|end|>"
              "<|start|>assistant<|channel|>commentary to=functions.get_weather "
              "<|constrain|>json<|message|>{\"city\":\"Paris\"}",
          "Need the weather tool.", "", PARIS);
    /* the recipient in the header before the channel; a preamble on commentary */
    check(&f, "<|channel|>commentary<|message|>Checking.<|end|>"
              "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
              "{\"city\":\"Paris\"}<|call|>",
          "", "Checking.", PARIS);
    /* arguments that are not JSON: the message stays as content */
    check(&f, "<|channel|>commentary to=functions.get_weather<|message|>{oops",
          "", "<|channel|>commentary to=functions.get_weather<|message|>{oops", NULL);
    /* unfinished thinking (the budget ran out) */
    check(&f, "<|channel|>analysis<|message|>Hmm", "Hmm", "", NULL);
    f.inline_reasoning = true;
    check(&f, "<|channel|>analysis<|message|>A<|end|><|start|>assistant<|channel|>final<|message|>B",
          "", "<|channel|>analysis<|message|>A<|end|><|start|>assistant<|channel|>final<|message|>B",
          NULL);
}

TEST(answer_hermes_qwen)
{
    sp_answer_fmt_t f = fmt(SP_CHAT_TOOLS_HERMES, SP_CHAT_REASONING_THINK);
    check(&f, "<think>\nI should call the tool.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
              "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
          "I should call the tool.", "", PARIS);
    check(&f, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
              "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
              "{\"city\": \"Oslo\"}}\n</tool_call>",
          "", "Let me check.\n",
          "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}},"
          "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}]");
    /* unparseable: content, never an error */
    check(&f, "<tool_call>\n{\"name\": get_weather}\n</tool_call>", "",
          "<tool_call>\n{\"name\": get_weather}\n</tool_call>", NULL);
    /* arguments as a string holding an object */
    check(&f, "<tool_call>{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}"
              "</tool_call>", "", "", PARIS);
}

TEST(answer_llama3)
{
    sp_answer_fmt_t f = fmt(SP_CHAT_TOOLS_LLAMA3, SP_CHAT_REASONING_NONE);
    check(&f, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", "", PARIS);
    check(&f, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "",
          "", PARIS);
    check(&f, "\n {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", "", PARIS);
    check(&f, "The weather is fine.", "", "The weather is fine.", NULL);
    check(&f, "{\"not\": \"a call\"}", "", "{\"not\": \"a call\"}", NULL);
}

TEST(answer_qwen3_coder_xml)
{
    sp_answer_fmt_t f = fmt(SP_CHAT_TOOLS_QWEN3_CODER, SP_CHAT_REASONING_THINK);
    check(&f, "I will look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
              "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
          "", "I will look.\n",
          "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":3}}]");
    /* a string parameter that looks like a number stays a string; an
     * undeclared one holding JSON is read as JSON */
    check(&f, "<tool_call>\n<function=get_weather>\n<parameter=city>\n1234\n</parameter>\n"
              "<parameter=opts>\n{\"a\": [1]}\n</parameter>\n</function>\n</tool_call>",
          "", "", "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"1234\",\"opts\":{\"a\":[1]}}}]");
    f.tools = SP_CHAT_TOOLS_SEED;
    f.reasoning = SP_CHAT_REASONING_SEED;
    check(&f, "<seed:think>Use the tool.</seed:think><seed:tool_call>\n<function=get_weather>\n"
              "<parameter=city>\nParis\n</parameter>\n</function>\n</seed:tool_call>",
          "Use the tool.", "", PARIS);
}

TEST(answer_mistral)
{
    sp_answer_fmt_t f = fmt(SP_CHAT_TOOLS_MISTRAL, SP_CHAT_REASONING_NONE);
    check(&f, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]", "",
          "", PARIS);
    check(&f, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}", "", "", PARIS);
    f.reasoning = SP_CHAT_REASONING_MISTRAL;
    check(&f, "[THINK]Weather needed.[/THINK][TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}"
              "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}",
          "Weather needed.", "",
          "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}},"
          "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}]");
    check(&f, "Sure [TOOL_CALLS]broken[ARGS]{", "", "Sure [TOOL_CALLS]broken[ARGS]{", NULL);
}

TEST(answer_deepseek_kimi_glm)
{
    sp_answer_fmt_t f = fmt(SP_CHAT_TOOLS_DEEPSEEK, SP_CHAT_REASONING_THINK);
    f.think_open = true;
    check(&f, "The user wants weather.\n</think>\n\n" DS("calls\xe2\x96\x81" "begin") DS(
              "call\xe2\x96\x81" "begin") "function" DS("sep") "get_weather\n```json\n{\"city\": "
              "\"Paris\"}\n```" DS("call\xe2\x96\x81" "end") DS("calls\xe2\x96\x81" "end"),
          "The user wants weather.", "", PARIS);
    /* V3.1: the name before the separator, bare JSON after it */
    f = fmt(SP_CHAT_TOOLS_DEEPSEEK, SP_CHAT_REASONING_THINK);
    check(&f, "Sure." DS("calls\xe2\x96\x81" "begin") DS("call\xe2\x96\x81" "begin")
              "get_weather" DS("sep") "{\"city\": \"Paris\"}" DS("call\xe2\x96\x81" "end")
              DS("calls\xe2\x96\x81" "end"),
          "", "Sure.", PARIS);
    f = fmt(SP_CHAT_TOOLS_KIMI, SP_CHAT_REASONING_NONE);
    check(&f, "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
              "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|>"
              "<|tool_calls_section_end|>",
          "", "Checking.", PARIS);
    f = fmt(SP_CHAT_TOOLS_GLM, SP_CHAT_REASONING_THINK);
    check(&f, "<think>Need weather.</think><tool_call>get_weather\n<arg_key>city</arg_key>\n"
              "<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n"
              "</tool_call>",
          "Need weather.", "",
          "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":2}}]");
}

TEST(answer_functionary_command_granite_apriel)
{
    sp_answer_fmt_t f = fmt(SP_CHAT_TOOLS_FUNCTIONARY_V31, SP_CHAT_REASONING_NONE);
    check(&f, "<function=get_weather>{\"city\": \"Paris\"}</function>", "", "", PARIS);
    check(&f, "<|python_tag|>print(1)", "", "",
          "[{\"name\":\"python\",\"arguments\":{\"code\":\"print(1)\"}}]");
    f = fmt(SP_CHAT_TOOLS_FUNCTIONARY_V32, SP_CHAT_REASONING_NONE);
    check(&f, "all\nThe sky is blue.", "", "The sky is blue.", NULL);
    check(&f, "get_weather\n{\"city\": \"Paris\"}", "", "", PARIS);
    check(&f, "all\nLet me see.>>>get_weather\n{\"city\": \"Paris\"}", "", "Let me see.", PARIS);
    f = fmt(SP_CHAT_TOOLS_COMMAND_R7B, SP_CHAT_REASONING_COMMAND);
    check(&f, "<|START_THINKING|>I will look it up.<|END_THINKING|><|START_ACTION|>[\n    "
              "{\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", \"parameters\": "
              "{\"city\": \"Paris\"}}\n]<|END_ACTION|>",
          "I will look it up.", "", PARIS);
    f = fmt(SP_CHAT_TOOLS_GRANITE, SP_CHAT_REASONING_THINK);
    check(&f, "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]", "",
          "", PARIS);
    f = fmt(SP_CHAT_TOOLS_APRIEL, SP_CHAT_REASONING_NONE);
    check(&f, "<tool_calls>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]"
              "</tool_calls>", "", "", PARIS);
    f = fmt(SP_CHAT_TOOLS_FIREFUNCTION, SP_CHAT_REASONING_NONE);
    check(&f, "Sure. functools[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
          "", "Sure. ", PARIS);
    f = fmt(SP_CHAT_TOOLS_APRIEL, SP_CHAT_REASONING_NONE);
    /* MiniMax-M1: one object a line */
    check(&f, "<tool_calls>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
              "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_calls>",
          "", "",
          "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}},"
          "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}]");
}

TEST(answer_opens_thinking)
{
    const char *qwq = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n";
    ASSERT(sp_answer_opens_thinking(SP_CHAT_REASONING_THINK, qwq, strlen(qwq)));
    const char *off = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    ASSERT(!sp_answer_opens_thinking(SP_CHAT_REASONING_THINK, off, strlen(off)));
    ASSERT(!sp_answer_opens_thinking(SP_CHAT_REASONING_NONE, qwq, strlen(qwq)));
    ASSERT(!sp_answer_opens_thinking(SP_CHAT_REASONING_HARMONY, qwq, strlen(qwq)));
    const char *apriel = "<|begin_assistant|>\nHere are my reasoning steps:\n";
    ASSERT(sp_answer_opens_thinking(SP_CHAT_REASONING_APRIEL, apriel, strlen(apriel)));
}

/* The families read from the templates of the models people download. */
TEST(family_from_templates)
{
    static const struct {
        const char *file;
        sp_chat_tools_t tools;
        sp_chat_reasoning_t reasoning;
    } cases[] = {
        {"Qwen-Qwen3-0.6B", SP_CHAT_TOOLS_HERMES, SP_CHAT_REASONING_THINK},
        {"Qwen-QwQ-32B", SP_CHAT_TOOLS_HERMES, SP_CHAT_REASONING_THINK},
        {"Qwen-Qwen2.5-7B-Instruct", SP_CHAT_TOOLS_HERMES, SP_CHAT_REASONING_NONE},
        {"Qwen3-Coder", SP_CHAT_TOOLS_QWEN3_CODER, SP_CHAT_REASONING_NONE},
        {"Qwen3.5-4B", SP_CHAT_TOOLS_QWEN3_CODER, SP_CHAT_REASONING_THINK},
        {"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", SP_CHAT_TOOLS_QWEN3_CODER, SP_CHAT_REASONING_THINK},
        {"openai-gpt-oss-120b", SP_CHAT_TOOLS_HARMONY, SP_CHAT_REASONING_HARMONY},
        {"HuggingFaceTB-SmolLM3-3B", SP_CHAT_TOOLS_HERMES, SP_CHAT_REASONING_THINK},
        {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", SP_CHAT_TOOLS_DEEPSEEK, SP_CHAT_REASONING_THINK},
        {"llama-cpp-deepseek-r1", SP_CHAT_TOOLS_DEEPSEEK, SP_CHAT_REASONING_THINK},
        {"meta-llama-Llama-3.1-8B-Instruct", SP_CHAT_TOOLS_LLAMA3, SP_CHAT_REASONING_NONE},
        {"meta-llama-Llama-3.2-3B-Instruct", SP_CHAT_TOOLS_LLAMA3, SP_CHAT_REASONING_NONE},
        {"meta-llama-Llama-3.3-70B-Instruct", SP_CHAT_TOOLS_LLAMA3, SP_CHAT_REASONING_NONE},
        {"fireworks-ai-llama-3-firefunction-v2", SP_CHAT_TOOLS_FIREFUNCTION, SP_CHAT_REASONING_NONE},
        {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", SP_CHAT_TOOLS_HERMES, SP_CHAT_REASONING_NONE},
        {"mistralai-Mistral-Nemo-Instruct-2407", SP_CHAT_TOOLS_MISTRAL, SP_CHAT_REASONING_NONE},
        {"mistralai-Ministral-3-14B-Reasoning-2512", SP_CHAT_TOOLS_MISTRAL, SP_CHAT_REASONING_MISTRAL},
        {"ByteDance-Seed-OSS", SP_CHAT_TOOLS_SEED, SP_CHAT_REASONING_SEED},
        {"moonshotai-Kimi-K2", SP_CHAT_TOOLS_KIMI, SP_CHAT_REASONING_NONE},
        {"GLM-4.7-Flash", SP_CHAT_TOOLS_GLM, SP_CHAT_REASONING_THINK},
        {"meetkai-functionary-medium-v3.1", SP_CHAT_TOOLS_FUNCTIONARY_V31, SP_CHAT_REASONING_NONE},
        {"meetkai-functionary-medium-v3.2", SP_CHAT_TOOLS_FUNCTIONARY_V32, SP_CHAT_REASONING_NONE},
        {"CohereForAI-c4ai-command-r7b-12-2024-tool_use", SP_CHAT_TOOLS_COMMAND_R7B,
         SP_CHAT_REASONING_COMMAND},
        {"ibm-granite-granite-3.3-2B-Instruct", SP_CHAT_TOOLS_GRANITE, SP_CHAT_REASONING_GRANITE},
        {"unsloth-Apriel-1.5", SP_CHAT_TOOLS_APRIEL, SP_CHAT_REASONING_APRIEL},
        {"google-gemma-4-31B-it", SP_CHAT_TOOLS_HERMES, SP_CHAT_REASONING_GEMMA4},
        {"Apriel-1.6-15b-Thinker-fixed", SP_CHAT_TOOLS_APRIEL, SP_CHAT_REASONING_APRIEL},
        {"MiniMax-M1", SP_CHAT_TOOLS_APRIEL, SP_CHAT_REASONING_NONE},
        {"Cohere2MoE", SP_CHAT_TOOLS_COMMAND_R7B, SP_CHAT_REASONING_COMMAND},
    };
    /* the shared test data beside the checkout (the lead's copy or a worktree) */
    static const char *const dirs[] = {"../shared/testdata/chat-templates",
                                       "../../shared/testdata/chat-templates"};
    int found = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        FILE *fp = NULL;
        for (size_t d = 0; d < 2 && fp == NULL; d++) {
            char path[512];
            snprintf(path, sizeof path, "%s/%s.jinja", dirs[d], cases[i].file);
            fp = fopen(path, "rb");
        }
        if (fp == NULL) {
            continue;
        }
        static char buf[1 << 20];
        size_t n = fread(buf, 1, sizeof buf, fp);
        fclose(fp);
        sp_chat_tools_t t;
        sp_chat_reasoning_t r;
        sp_chat_detect_family(buf, n, &t, &r);
        if (t != cases[i].tools || r != cases[i].reasoning) {
            SP_TEST_FAIL("%s: %s/%s, want %s/%s", cases[i].file, sp_chat_tools_name(t),
                         sp_chat_reasoning_name(r), sp_chat_tools_name(cases[i].tools),
                         sp_chat_reasoning_name(cases[i].reasoning));
        }
        found++;
    }
    if (found == 0) {
        SKIP("the chat-templates test data is not there");
    }
}

/* Hostile answers in every family and mode: no crash, no leak (ASan), and the
 * streaming rule holds on each (a prefix's parts are prefixes of the whole's). */
TEST(answer_hostile_inputs)
{
    static const char *const texts[] = {
        "<think><think></think></think>",
        "</think>",
        "<tool_call><tool_call></tool_call>",
        "<tool_call>\n<function=\n<parameter=",
        "<tool_call>\n<function=f>\n<parameter=k>\n\xff\xfe\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>f<arg_key>\xc3</arg_key><arg_value>1</arg_value></tool_call>",
        "[TOOL_CALLS][TOOL_CALLS][ARGS]",
        "[TOOL_CALLS][1, 2, {\"name\": 3}]",
        DS("calls\xe2\x96\x81" "begin") DS("call\xe2\x96\x81" "begin") DS("sep") DS("sep"),
        "<|tool_calls_section_begin|><|tool_call_begin|>:<|tool_call_argument_begin|>{}",
        "<|channel|><|message|><|end|><|start|><|channel|>analysis to=functions.<|message|>{}",
        "<|start|>assistant to=functions.f<|channel|>commentary<|message|>\"x\"",
        ">>>>>>all\n>>>",
        "<|START_ACTION|>{\"tool_name\": \"\"}",
        "<function=f>{}</function><function=>{}",
        "<|python_tag|>",
        "{\"name\": \"f\", \"parameters\": []}",
        "",
    };
    json_t *tools = json_loads(TOOLS, 0, NULL);
    for (int t = SP_CHAT_TOOLS_HERMES; t <= SP_CHAT_TOOLS_FIREFUNCTION; t++) {
        for (int r = SP_CHAT_REASONING_NONE; r <= SP_CHAT_REASONING_GRANITE; r++) {
            for (int mode = 0; mode < 4; mode++) {
                sp_answer_fmt_t f = {.tools = (sp_chat_tools_t)t, .reasoning = (sp_chat_reasoning_t)r,
                                     .parse_tools = true, .tool_list = tools,
                                     .inline_reasoning = mode & 1, .think_open = mode & 2};
                for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
                    size_t len = strlen(texts[i]);
                    sp_answer_t whole = {0}, part = {0};
                    sp_answer_parse(&f, texts[i], len, false, &whole);
                    for (size_t k = 0; k <= len; k++) {
                        sp_answer_parse(&f, texts[i], k, true, &part);
                        if (!prefix_of(&part.reasoning, &whole.reasoning) ||
                            !prefix_of(&part.content, &whole.content)) {
                            SP_TEST_FAIL("%s/%s mode %d: <<%s>> cut at %zu is not a prefix",
                                         sp_chat_tools_name(f.tools),
                                         sp_chat_reasoning_name(f.reasoning), mode, texts[i], k);
                        }
                    }
                    sp_answer_free(&part);
                    sp_answer_free(&whole);
                }
            }
        }
    }
    json_decref(tools);
}

/* gpt-oss's vocabulary: <|end|> separates the thinking from the final message,
 * so it must not end the generation; <|return|> and <|call|> do. */
TEST(harmony_end_of_generation)
{
    static const char *const tokens[] = {"<unk>", "<s>", "</s>", "<|start|>", "<|end|>",
                                         "<|return|>", "<|call|>", "<|message|>", "a"};
    enum { N = sizeof tokens / sizeof tokens[0] };
    float scores[N] = {0};
    int32_t types[N] = {2, 3, 3, 3, 3, 3, 3, 3, 1};
    char err[256];
    for (int harmony = 0; harmony < 2; harmony++) {
        sp_gguf_writer_t *w;
        ASSERT_OK(sp_gguf_writer_create(&w));
        ASSERT_OK(sp_gguf_writer_set_str(w, "general.architecture", "llama"));
        ASSERT_OK(sp_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama"));
        /* without <|return|> and <|call|> (phi3's vocabulary) <|end|> stays an end */
        uint64_t n = harmony ? N : 5;
        ASSERT_OK(sp_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, n));
        ASSERT_OK(sp_gguf_writer_set_arr(w, "tokenizer.ggml.scores", SP_GGUF_TYPE_FLOAT32, n, scores));
        ASSERT_OK(sp_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", SP_GGUF_TYPE_INT32, n, types));
        ASSERT_OK(sp_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1));
        ASSERT_OK(sp_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2));
        void *mem;
        size_t len;
        ASSERT_OK(sp_gguf_writer_write_mem(w, &mem, &len, err, sizeof err));
        sp_gguf_writer_destroy(w);
        sp_gguf_t *g;
        ASSERT_OK(sp_gguf_open_mem(mem, len, "harmony", &g, err, sizeof err));
        sp_tokenizer_t *t;
        if (sp_tokenizer_from_gguf(g, &t, err, sizeof err) != SP_OK) {
            SP_TEST_FAIL("tokenizer: %s", err);
        }
        ASSERT(sp_tokenizer_is_eog(t, 2));
        ASSERT_EQ(sp_tokenizer_is_eog(t, 4), !harmony);
        if (harmony) {
            ASSERT(sp_tokenizer_is_eog(t, 5) && sp_tokenizer_is_eog(t, 6));
            ASSERT(!sp_tokenizer_is_eog(t, 7));
        }
        sp_tokenizer_destroy(t);
        sp_gguf_close(g);
        sp_free(mem);
    }
}
