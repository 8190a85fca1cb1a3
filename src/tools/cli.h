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

#endif /* SP_TOOLS_CLI_H */
