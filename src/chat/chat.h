/*
 * chat.h - OpenAI-style messages to the prompt text a model expects.
 *
 * A chat template is compiled once per model: from the GGUF file's
 * `tokenizer.chat_template` (untrusted; rendered by the sandboxed engine of
 * jinja.h), or from one of our built-ins ("llama2", "llama3", "chatml",
 * "mistral", "gemma", "phi3", "zephyr") chosen by name or, when the file has
 * no template, detected from the vocabulary. A compiled template is
 * immutable: sp_chat_apply may run on many threads at once.
 *
 *     sp_chat_template_t *t;
 *     sp_chat_template_from_gguf(gguf, NULL, &t, err, sizeof err);
 *     sp_chat_msg_t msgs[] = {{"system", "Be brief.", NULL, NULL, NULL},
 *                             {"user", "Hi", NULL, NULL, NULL}};
 *     char *prompt; size_t len;
 *     sp_chat_apply(t, msgs, 2, true, "<s>", "</s>", &prompt, &len, err, sizeof err);
 *     ... tokenize prompt (parse special tokens) with
 *         sp_chat_add_bos(tok, prompt, len) as add_bos, sp_free(prompt) ...
 *     sp_chat_template_destroy(t);
 *
 * docs/chat-templates.md describes the supported Jinja subset and the limits.
 */
#ifndef SP_CHAT_CHAT_H
#define SP_CHAT_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "gguf/gguf.h"
#include "chat/jinja.h"
#include "text/tokenizer.h"
#include "sampan/status.h"

#define SP_CHAT_MAX_TEMPLATE_BYTES (64u * 1024u)  /* bigger: SP_ERR_TOO_LARGE */
#define SP_CHAT_MAX_CONTEXT_BYTES  (16u << 20)    /* messages + tools as JSON */

/* One message. Strings are NUL-terminated UTF-8 and borrowed for the call. */
typedef struct sp_chat_msg {
    const char *role;         /* "system", "user", "assistant" or "tool" */
    const char *content;      /* NULL only for an assistant turn that has tool_calls */
    const char *tool_calls;   /* NULL, or a JSON array (OpenAI's tool_calls) */
    const char *name;         /* NULL, or the speaker's / tool's name */
    const char *tool_call_id; /* NULL, or the call a "tool" message answers */
} sp_chat_msg_t;

typedef struct sp_chat_template sp_chat_template_t;

/* Compile template text (a custom template, or one read from a file). */
sp_status_t sp_chat_template_compile(const char *src, size_t len, sp_chat_template_t **out,
                                     char *err, size_t err_len);
/* A built-in by name; SP_ERR_NOT_FOUND for an unknown name. */
sp_status_t sp_chat_template_builtin(const char *name, sp_chat_template_t **out, char *err,
                                     size_t err_len);
/*
 * The template for a model: the built-in `name` when not NULL, else the
 * file's tokenizer.chat_template, else the built-in that
 * sp_chat_detect_builtin picks. A file template that does not compile is an
 * error (SP_ERR_INVALID / SP_ERR_TOO_LARGE), not a silent fallback.
 */
sp_status_t sp_chat_template_from_gguf(const sp_gguf_t *g, const char *name,
                                       sp_chat_template_t **out, char *err, size_t err_len);
/* The built-in that fits a model without a template, from its special tokens
 * (<|eot_id|>: llama3, <|im_start|>: chatml, <start_of_turn>: gemma,
 * <|end|> + <|assistant|>: phi3, [INST]: mistral, <|user|>: zephyr), its
 * architecture and name; "llama2" for arch llama, else "chatml". Never NULL. */
const char *sp_chat_detect_builtin(const sp_gguf_t *g);
/* The built-in names, in a fixed order. */
const char *const *sp_chat_builtin_names(size_t *n);
/* How a template's models write tool calls (docs/structured-output.md has
 * each shape): HERMES <tool_call>{"name": .., "arguments": {..}}</tool_call>
 * (ChatML, Qwen2.5/3, Hermes, and our built-ins without a convention of their
 * own), LLAMA3 a bare {"name": .., "parameters": {..}} (templates with
 * <|python_tag|> / ipython), MISTRAL [TOOL_CALLS][{..}] or
 * [TOOL_CALLS]name[ARGS]{..}, QWEN3_CODER <tool_call><function=name>
 * <parameter=k>v</parameter>.. (Qwen3-Coder, Qwen3.5, Nemotron), SEED the same
 * inside <seed:tool_call>, HARMONY gpt-oss's commentary channel, DEEPSEEK
 * <｜tool▁calls▁begin｜>.., KIMI <|tool_calls_section_begin|>.., GLM
 * <tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>.., FUNCTIONARY_V31
 * <function=name>{..}</function>, FUNCTIONARY_V32 >>>name\n{..},
 * COMMAND_R7B <|START_ACTION|>[..]<|END_ACTION|>, GRANITE <|tool_call|>[..],
 * APRIEL <tool_calls>[..]</tool_calls> (also MiniMax-M1's objects a line),
 * FIREFUNCTION functools[..] (FireFunction v2). Read from the template's source at
 * compile time (sp_chat_detect_family). */
typedef enum sp_chat_tools {
    SP_CHAT_TOOLS_HERMES = 0,
    SP_CHAT_TOOLS_LLAMA3,
    SP_CHAT_TOOLS_MISTRAL,
    SP_CHAT_TOOLS_QWEN3_CODER,
    SP_CHAT_TOOLS_SEED,
    SP_CHAT_TOOLS_HARMONY,
    SP_CHAT_TOOLS_DEEPSEEK,
    SP_CHAT_TOOLS_KIMI,
    SP_CHAT_TOOLS_GLM,
    SP_CHAT_TOOLS_FUNCTIONARY_V31,
    SP_CHAT_TOOLS_FUNCTIONARY_V32,
    SP_CHAT_TOOLS_COMMAND_R7B,
    SP_CHAT_TOOLS_GRANITE,
    SP_CHAT_TOOLS_APRIEL,
    SP_CHAT_TOOLS_FIREFUNCTION,
} sp_chat_tools_t;
/* How a template's models write their thinking before the answer: THINK
 * <think>..</think> (Qwen3, QwQ, DeepSeek-R1, SmolLM3, GLM, Nemotron, ...),
 * SEED <seed:think>..</seed:think>, MISTRAL [THINK]..[/THINK], COMMAND
 * <|START_THINKING|>..<|END_THINKING|> (and the answer in <|START_RESPONSE|>..
 * <|END_RESPONSE|>), GEMMA4 <|channel>thought..<channel|>, MINIMAX
 * <mm:think>..</mm:think>, APRIEL "Here are my reasoning steps:"..
 * "[BEGIN FINAL RESPONSE]" (the answer up to "[END FINAL RESPONSE]"), GRANITE
 * <think>..</think> and the answer in <response>..</response> (Granite 3.x),
 * HARMONY gpt-oss's analysis channel; NONE: no thinking markup. */
typedef enum sp_chat_reasoning {
    SP_CHAT_REASONING_NONE = 0,
    SP_CHAT_REASONING_THINK,
    SP_CHAT_REASONING_SEED,
    SP_CHAT_REASONING_MISTRAL,
    SP_CHAT_REASONING_COMMAND,
    SP_CHAT_REASONING_GEMMA4,
    SP_CHAT_REASONING_HARMONY,
    SP_CHAT_REASONING_MINIMAX,
    SP_CHAT_REASONING_APRIEL,
    SP_CHAT_REASONING_GRANITE,
} sp_chat_reasoning_t;
/* Both conventions from a template's source text (family.c), as llama.cpp
 * recognises a family: by the markers the template writes. */
void sp_chat_detect_family(const char *src, size_t len, sp_chat_tools_t *tools,
                           sp_chat_reasoning_t *reasoning);
/* The family's name ("hermes", "think", ...), for logs and /v1/models. */
const char *sp_chat_tools_name(sp_chat_tools_t f);
const char *sp_chat_reasoning_name(sp_chat_reasoning_t r);
sp_chat_reasoning_t sp_chat_reasoning_format(const sp_chat_template_t *t);
sp_chat_tools_t sp_chat_tool_format(const sp_chat_template_t *t);
/* The built-in's name, "gguf" (from a file) or "custom". */
const char *sp_chat_template_name(const sp_chat_template_t *t);
/* The Jinja source it was compiled from (*len bytes, NUL-terminated); "" for NULL. */
const char *sp_chat_template_source(const sp_chat_template_t *t, size_t *len);
void sp_chat_template_destroy(sp_chat_template_t *t); /* NULL is a no-op */

typedef struct sp_chat_params {
    bool add_generation_prompt;   /* end with the header of an assistant turn */
    const char *bos_text;         /* bos_token; NULL = "" */
    const char *eos_text;         /* eos_token; NULL = "" */
    const char *tools_json;       /* NULL, or a JSON array: the `tools` variable */
    const char *extra_json;       /* NULL, or a JSON object of more variables
                                     (e.g. {"enable_thinking": false}); ours win on clashes */
    const sp_jinja_opts_t *opts;  /* NULL: sp_jinja_default_opts() */
} sp_chat_params_t;

/*
 * Render msgs[0..n) into *out (NUL-terminated, from sp_malloc; free with
 * sp_free). Messages are checked first: an unknown role, missing content,
 * invalid UTF-8 or a tool_calls that is not a JSON array is SP_ERR_INVALID
 * with "message N: ..." in err. Template errors (raise_exception, type
 * errors) are SP_ERR_INVALID, limits SP_ERR_TOO_LARGE; *out is NULL then.
 */
sp_status_t sp_chat_apply(const sp_chat_template_t *t, const sp_chat_msg_t *msgs, size_t n,
                          bool add_generation_prompt, const char *bos_text, const char *eos_text,
                          char **out, size_t *out_len, char *err, size_t err_len);
sp_status_t sp_chat_apply_ex(const sp_chat_template_t *t, const sp_chat_msg_t *msgs, size_t n,
                             const sp_chat_params_t *p, char **out, size_t *out_len, char *err,
                             size_t err_len);

/*
 * The BOS rule: whether to ask sp_tokenizer_encode for a BOS token in front of a
 * prompt. The vocabulary decides first (sp_tokenizer_add_bos). A rendered
 * chat template (rendered[0..len), from sp_chat_apply) usually writes the BOS
 * text itself (bos_token in the template): then it is tokenized from the text
 * as a special token and no second one is added. A plain prompt passes
 * rendered = NULL: its text is never taken for a BOS token.
 */
bool sp_chat_add_bos(const sp_tokenizer_t *tok, const char *rendered, size_t len);

#endif /* SP_CHAT_CHAT_H */
