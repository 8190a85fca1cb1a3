/*
 * cli.h - the subcommands of the `sampan` binary that generate text.
 * Each takes argv with argv[0] = the subcommand name and returns an exit code.
 */
#ifndef SP_TOOLS_CLI_H
#define SP_TOOLS_CLI_H

int sp_cmd_run(int argc, char **argv);
int sp_cmd_eval(int argc, char **argv);
/* sampan tokenize -m FILE [--no-bos] [--special] [--decode]: text on stdin <-> token ids. */
int sp_cmd_tokenize(int argc, char **argv);
/* sampan bench [--url URL --concurrency N ...]: a serving benchmark client (src/tools/bench.c). */
int sp_cmd_bench(int argc, char **argv);

/* Length of the longest prefix of buf[0..len) that does not end inside a
 * UTF-8 sequence: what a stream may print now, holding the rest back. */
size_t sp_utf8_complete_prefix(const char *buf, size_t len);

#endif /* SP_TOOLS_CLI_H */
