/*
 * main.c - the `sampan` binary: one subcommand per job.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"
#include "sampan/version.h"
#include "tools/cli.h"
#include "tools/tools.h"


static const char usage[] =
    "sampan " SAMPAN_VERSION " - an inference server for generative AI\n"
    "usage: sampan COMMAND [options]\n"
    "  serve     serve models over HTTP: the OpenAI API and health routes\n"
    "  run       generate text from a prompt, streamed to the terminal\n"
    "  eval      evaluate token ids: logits and timings (tests, benchmarks)\n"
    "  inspect   describe a GGUF file: metadata, tensors, memory estimate\n"
    "  quantize  convert a GGUF model's weights to f16, bf16, q8_0, q4_0, q4_k or q6_k\n"
    "  optimize  FP16 and calibrated INT8 copies of an ONNX model, with accuracy and speed\n"
    "  tokenize  text on stdin to token ids (or ids back to text) with a GGUF vocabulary\n"
    "  bench     serving benchmark: concurrent streamed requests to an OpenAI-compatible server\n"
    "  devices   list the CPU, GPUs and MIG instances with total, budget, used and free memory\n"
    "  encrypt   encrypt a GGUF model (AES-256-GCM) for transparent loading; --gen-key makes a key\n"
    "  decrypt   check (--check) or decrypt an encrypted model file\n"
    "  keys      manage the tenants file: API keys (hashed), scopes, tiers and limits\n"
    "  perplexity  a model's perplexity on a text file (quality of quantised weights or KV)\n"
    "  pull      download a GGUF model from Hugging Face (hf://ORG/REPO[/FILE | :QUANT])\n"
    "  list      the GGUF models in the Hugging Face cache\n"
    "  rm        remove a model from the Hugging Face cache\n"
    "  version   print the version\n"
    "Run 'sampan COMMAND --help' for a command's options.\n";

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
} command_t;

static const command_t commands[] = {
    {"serve", sp_cmd_serve},
    {"run", sp_cmd_run},
    {"eval", sp_cmd_eval},
    {"inspect", sp_cmd_inspect},
    {"quantize", sp_cmd_quantize},
    {"optimize", sp_cmd_optimize},
    {"tokenize", sp_cmd_tokenize},
    {"bench", sp_cmd_bench},
    {"devices", sp_cmd_devices},
    {"encrypt", sp_cmd_encrypt},
    {"decrypt", sp_cmd_decrypt},
    {"keys", sp_cmd_keys},
    {"perplexity", sp_cmd_perplexity},
    {"pull", sp_cmd_pull},
    {"list", sp_cmd_list},
    {"rm", sp_cmd_rm},
};

int
main(int argc, char **argv)
{
    /* The ONNX plugin's oneDNN runs on OpenMP (libgomp), which reads its settings once when it
     * loads. Its default, workers spinning between parallel regions, takes whole cores from the
     * server's other threads and collapses when the host is shared (a ResNet-50 8x slower on a
     * loaded 2-core machine); waiting passively costs a wake-up per region. Set before any
     * thread starts; an operator's own OMP_WAIT_POLICY wins. */
    setenv("OMP_WAIT_POLICY", "passive", 0);
    if (argc < 2 || strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "-h") == 0) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "version") == 0 || strcmp(argv[1], "--version") == 0) {
        puts("sampan " SAMPAN_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name) == 0) {
            return commands[i].fn(argc - 1, argv + 1);
        }
    }
    fprintf(stderr, "sampan: unknown command '%s'\n%s", argv[1], usage);
    return 2;
}
