/*
 * family.c - which tool-call and reasoning conventions a chat template's
 * models follow, read from the markers the template itself writes (the
 * template shows the model its own past turns, so the shapes it renders are
 * the shapes the model answers in).
 *
 * Threads: pure functions of their arguments. Memory: none.
 */
#include <string.h>

#include "chat/chat.h"

static bool
has(const char *src, size_t len, const char *m)
{
    return memmem(src, len, m, strlen(m)) != NULL;
}

void
sp_chat_detect_family(const char *src, size_t len, sp_chat_tools_t *tools,
                      sp_chat_reasoning_t *reasoning)
{
    /* Most specific markers first: several families also write <tool_call>. */
    sp_chat_tools_t f = SP_CHAT_TOOLS_HERMES;
    if (has(src, len, "<|channel|>")) {
        f = SP_CHAT_TOOLS_HARMONY;
    } else if (has(src, len, "<seed:tool_call>")) {
        f = SP_CHAT_TOOLS_SEED;
    } else if (has(src, len, "<arg_key>")) {
        f = SP_CHAT_TOOLS_GLM;
    } else if (has(src, len, "<function=") && has(src, len, "<parameter=")) {
        f = SP_CHAT_TOOLS_QWEN3_CODER;
    } else if (has(src, len, "[TOOL_CALLS]")) {
        f = SP_CHAT_TOOLS_MISTRAL;
    } else if (has(src, len, "tool\xe2\x96\x81" "calls\xe2\x96\x81" "begin")) {
        f = SP_CHAT_TOOLS_DEEPSEEK;
    } else if (has(src, len, "<|tool_calls_section_begin|>")) {
        f = SP_CHAT_TOOLS_KIMI;
    } else if (has(src, len, "<|START_ACTION|>")) {
        f = SP_CHAT_TOOLS_COMMAND_R7B;
    } else if (has(src, len, ">>>all")) {
        f = SP_CHAT_TOOLS_FUNCTIONARY_V32;
    } else if (has(src, len, "<function=")) {
        f = SP_CHAT_TOOLS_FUNCTIONARY_V31;
    } else if (has(src, len, "<|tool_call|>")) {
        f = SP_CHAT_TOOLS_GRANITE;
    } else if (has(src, len, "<tool_calls>")) {
        f = SP_CHAT_TOOLS_APRIEL;
    } else if (has(src, len, "functools[")) {
        f = SP_CHAT_TOOLS_FIREFUNCTION;
    } else if (has(src, len, "<tool_call>")) {
        f = SP_CHAT_TOOLS_HERMES;
    } else if (has(src, len, "<|python_tag|>") || has(src, len, "ipython")) {
        f = SP_CHAT_TOOLS_LLAMA3;
    }
    *tools = f;

    sp_chat_reasoning_t r = SP_CHAT_REASONING_NONE;
    if (has(src, len, "<|channel|>")) {
        r = SP_CHAT_REASONING_HARMONY;
    } else if (has(src, len, "<seed:think>")) {
        r = SP_CHAT_REASONING_SEED;
    } else if (has(src, len, "[THINK]")) {
        r = SP_CHAT_REASONING_MISTRAL;
    } else if (has(src, len, "<|START_THINKING|>")) {
        r = SP_CHAT_REASONING_COMMAND;
    } else if (has(src, len, "<|channel>thought")) {
        r = SP_CHAT_REASONING_GEMMA4;
    } else if (has(src, len, "<mm:think>")) {
        r = SP_CHAT_REASONING_MINIMAX;
    } else if (has(src, len, "[BEGIN FINAL RESPONSE]")) {
        r = SP_CHAT_REASONING_APRIEL;
    } else if (has(src, len, "<think>") && has(src, len, "<response>")) {
        r = SP_CHAT_REASONING_GRANITE;
    } else if (has(src, len, "<think>") || has(src, len, "</think>")) {
        r = SP_CHAT_REASONING_THINK;
    }
    *reasoning = r;
}

const char *
sp_chat_tools_name(sp_chat_tools_t f)
{
    static const char *const names[] = {
        "hermes", "llama3", "mistral", "qwen3-coder", "seed-oss", "harmony", "deepseek",
        "kimi-k2", "glm", "functionary-v3.1", "functionary-v3.2", "command-r7b", "granite",
        "apriel", "firefunction-v2",
    };
    return (size_t)f < sizeof names / sizeof names[0] ? names[f] : "hermes";
}

const char *
sp_chat_reasoning_name(sp_chat_reasoning_t r)
{
    static const char *const names[] = {
        "none", "think", "seed-think", "mistral-think", "command-thinking", "gemma4-thought",
        "harmony", "minimax-think", "apriel", "granite-think",
    };
    return (size_t)r < sizeof names / sizeof names[0] ? names[r] : "none";
}
