/*
 * tools.h - the model-file subcommands of the `sampan` binary.
 * Each takes argv with argv[0] = the subcommand name and returns an exit code
 * (0 ok, 1 a bad or unreadable file / failed conversion, 2 bad usage).
 */
#ifndef SP_TOOLS_TOOLS_H
#define SP_TOOLS_TOOLS_H

/* sampan inspect FILE [--tensors] [--json] [--ctx N]: metadata, tensors, memory estimate. */
int sp_cmd_inspect(int argc, char **argv);
/* sampan quantize IN OUT TYPE [--threads N] [--progress]: convert the weights of a model. */
int sp_cmd_quantize(int argc, char **argv);
/* sampan devices [--json] [--budget F]: the CPU, GPUs and MIG instances with their memory. */
int sp_cmd_devices(int argc, char **argv);
/* sampan encrypt IN OUT --key-file K | --gen-key K: encrypted model files (crypto/enc.h). */
int sp_cmd_encrypt(int argc, char **argv);
/* sampan decrypt IN (OUT | --check) --key-file K: authenticate, and write the plaintext. */
int sp_cmd_decrypt(int argc, char **argv);
/* sampan keys add|list|revoke --tenants FILE ...: API keys, scopes, tiers and limits. */
int sp_cmd_keys(int argc, char **argv);
/* sampan perplexity -m FILE -f TEXT [-c N] [--kv-type T] [--json]: a model's perplexity on a text. */
int sp_cmd_perplexity(int argc, char **argv);
/* sampan pull hf://ORG/REPO[/FILE | :QUANT]: a GGUF model from Hugging Face into the hub cache. */
int sp_cmd_pull(int argc, char **argv);
/* sampan list [--json]: the GGUF files in the hub cache. */
int sp_cmd_list(int argc, char **argv);
/* sampan rm hf://ORG/REPO[/FILE | :QUANT]: remove a repository or a file from the hub cache. */
int sp_cmd_rm(int argc, char **argv);
/* sampan optimize MODEL.onnx [--calib X.npy] [--eval X.npy --labels Y.npy] ...: FP16 and calibrated
 * INT8 copies of an ONNX model (the work is in the ONNX backend plugin, loaded at run time). */
int sp_cmd_optimize(int argc, char **argv);

#endif /* SP_TOOLS_TOOLS_H */
