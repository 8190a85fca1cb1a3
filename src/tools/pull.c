/*
 * pull.c - `sampan pull`, `sampan list` and `sampan rm`: GGUF models by name
 * from Hugging Face in the hub cache that huggingface_hub shares
 * (serving/hub.h does the work; docs/operations.md lists the environment).
 *
 *   sampan pull hf://ORG/REPO[/FILE.gguf | :QUANT]   download, print the local path
 *   sampan list [--json]                              cached GGUF files
 *   sampan rm hf://ORG/REPO[/FILE.gguf | :QUANT]      remove from the cache
 *
 * Single-threaded; the list is printed as it is walked.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "serving/hub.h"
#include "tools/tools.h"

static const char pull_usage[] =
    "usage: sampan pull hf://ORG/REPO[/FILE.gguf | :QUANT]\n"
    "  Download a GGUF model from Hugging Face into the hub cache and print its path.\n"
    "  hf://ORG/REPO/path/file.gguf   that file (every part of a split one)\n"
    "  hf://ORG/REPO:Q4_K_M           the GGUF file whose name carries the tag\n"
    "  hf://ORG/REPO                  Q4_K_M, else Q8_0, else the first GGUF file\n"
    "Environment: HF_ENDPOINT, HF_TOKEN, HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE,\n"
    "HF_HUB_ETAG_TIMEOUT, HF_HUB_DOWNLOAD_TIMEOUT, SAMPAN_HF_RETRIES (docs/operations.md).\n";

static const char list_usage[] =
    "usage: sampan list [--json]\n"
    "  The GGUF files in the Hugging Face hub cache: repository, file, size, revision.\n";

static const char rm_usage[] =
    "usage: sampan rm hf://ORG/REPO[/FILE.gguf | :QUANT]\n"
    "  Remove a repository, or one model file (all its parts), from the hub cache.\n";

static int
parse_one(int argc, char **argv, const char *usage, sp_hub_ref_t *ref)
{
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(usage, stdout);
        return 0;
    }
    if (argc != 2) {
        fputs(usage, stderr);
        return 2;
    }
    char err[512];
    if (sp_hub_parse(argv[1], ref, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan %s: %s\n%s", argv[0], err, usage);
        return 2;
    }
    return -1;
}

int
sp_cmd_pull(int argc, char **argv)
{
    sp_hub_ref_t ref;
    int rc = parse_one(argc, argv, pull_usage, &ref);
    if (rc >= 0) {
        return rc;
    }
    char path[4096], err[1024];
    int parts = 1;
    if (sp_hub_fetch(&ref, true, path, sizeof path, &parts, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan pull: %s\n", err);
        return 1;
    }
    if (parts > 1) {
        fprintf(stderr, "sampan pull: a split model: %d parts, the first is printed\n", parts);
    }
    puts(path);
    return 0;
}

static void
human(char *buf, size_t len, uint64_t b)
{
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
}

static void
print_row(const sp_hub_entry_t *e, void *ud)
{
    int *n = ud;
    if ((*n)++ == 0) {
        printf("%-40s %-50s %10s  %s\n", "REPO", "FILE", "SIZE", "REVISION");
    }
    char sz[32];
    human(sz, sizeof sz, e->size);
    printf("%-40s %-50s %10s  %.12s%s%s\n", e->repo, e->file, e->size ? sz : "missing",
           e->commit, e->ref[0] ? " " : "", e->ref);
}

static void
add_json(const sp_hub_entry_t *e, void *ud)
{
    json_array_append_new(ud, json_pack("{s:s, s:s, s:I, s:s, s:s, s:s}", "repo", e->repo, "file",
                                        e->file, "size", (json_int_t)e->size, "commit", e->commit,
                                        "ref", e->ref, "path", e->path));
}

int
sp_cmd_list(int argc, char **argv)
{
    bool as_json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            as_json = true;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(list_usage, stdout);
            return 0;
        } else {
            fprintf(stderr, "sampan list: unknown option '%s'\n%s", argv[i], list_usage);
            return 2;
        }
    }
    char err[1024];
    sp_status_t st;
    if (as_json) {
        json_t *a = json_array();
        st = sp_hub_list(add_json, a, err, sizeof err);
        if (st == SP_OK) {
            char *s = json_dumps(a, JSON_INDENT(2));
            if (s) {
                puts(s);
                free(s);
            }
        }
        json_decref(a);
    } else {
        int n = 0;
        st = sp_hub_list(print_row, &n, err, sizeof err);
        if (st == SP_OK && n == 0) {
            char hub[4096];
            if (sp_hub_cache_dir(hub, sizeof hub, NULL, 0) == SP_OK) {
                fprintf(stderr, "no GGUF models in %s\n", hub);
            }
        }
    }
    if (st != SP_OK) {
        fprintf(stderr, "sampan list: %s\n", err);
        return 1;
    }
    return 0;
}

int
sp_cmd_rm(int argc, char **argv)
{
    sp_hub_ref_t ref;
    int rc = parse_one(argc, argv, rm_usage, &ref);
    if (rc >= 0) {
        return rc;
    }
    char err[1024];
    int removed = 0;
    if (sp_hub_remove(&ref, &removed, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan rm: %s\n", err);
        return 1;
    }
    if (ref.file[0] == '\0' && ref.quant[0] == '\0') {
        printf("removed %s from the cache\n", ref.repo);
    } else {
        printf("removed %d file%s of %s\n", removed, removed == 1 ? "" : "s", ref.repo);
    }
    return 0;
}
