/*
 * hub.h - models by name from Hugging Face: `hf://ORG/REPO[/FILE | :QUANT]`
 * resolved to GGUF files, downloaded into the Hugging Face hub cache (the
 * layout huggingface_hub uses, so both share one cache), listed and removed.
 *
 * Threads: every call blocks (network and disk) and is meant for the command
 * line and for `serve` before its loops start; calls share no state beyond a
 * once-only libcurl initialisation, so two threads may fetch different models.
 * Memory: results go to caller buffers; nothing is kept between calls.
 *
 * Environment (read at each call): HF_ENDPOINT (default https://huggingface.co),
 * HF_TOKEN (else the file HF_HOME/token), HF_HOME (default
 * $XDG_CACHE_HOME/huggingface or ~/.cache/huggingface), HF_HUB_CACHE (default
 * HF_HOME/hub), HF_HUB_OFFLINE (1/true/yes/on: the cache only),
 * HF_HUB_ETAG_TIMEOUT (seconds for the listing and metadata requests,
 * default 10), HF_HUB_DOWNLOAD_TIMEOUT (seconds without progress before a
 * download is cut and retried, default 10), SAMPAN_HF_RETRIES (tries per
 * file, default 5).
 */
#ifndef SP_SERVING_HUB_H
#define SP_SERVING_HUB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sampan/status.h"

#define SP_HUB_SCHEME "hf://"

/* A parsed `hf://` reference. At most one of file and quant is set; neither
 * means the default choice (see sp_hub_pick). */
typedef struct sp_hub_ref {
    char repo[200];  /* ORG/REPO */
    char file[512];  /* a path inside the repository, or "" */
    char quant[64];  /* a quantisation tag such as Q4_K_M, or "" */
} sp_hub_ref_t;

/* True when s starts with hf:// . */
bool sp_hub_is_uri(const char *s);

/* Parse hf://ORG/REPO, hf://ORG/REPO/PATH/FILE.gguf or hf://ORG/REPO:QUANT.
 * ORG and REPO are [A-Za-z0-9._-] (not starting with '.' or '-'); a PATH
 * passes sp_hub_valid_path; QUANT is [A-Za-z0-9_]. SP_ERR_INVALID otherwise. */
sp_status_t sp_hub_parse(const char *uri, sp_hub_ref_t *ref, char *err, size_t err_len);

/* A path inside a repository that is safe to use under a directory: relative,
 * no empty, "." or ".." component, no backslash or control character, at
 * most 500 bytes. Paths from a server are used only when this holds. */
bool sp_hub_valid_path(const char *path);

/* The model file to take among a repository's paths: with a quant, the first
 * GGUF model file (not mmproj/imatrix) whose name holds QUANT followed by '.'
 * or '-' (case-insensitive); without one, the same for Q4_K_M, then Q8_0,
 * then the first GGUF model file. Of a split model only part 1 is chosen.
 * Returns the index, or -1 when nothing fits. */
int sp_hub_pick(const char *const *paths, size_t n, const char *quant);

/* For NAME-0000K-of-0000N.gguf: *part = K, *count = N, and the length of
 * NAME in *prefix_len; returns false for a file that is not split. */
bool sp_hub_split(const char *path, int *part, int *count, size_t *prefix_len);

/* The hub cache directory (HF_HUB_CACHE, HF_HOME/hub, ...). */
sp_status_t sp_hub_cache_dir(char *out, size_t out_len, char *err, size_t err_len);

/* Resolve ref and make its files present in the cache (downloading what is
 * missing, every part of a split model, the checksum checked), or with
 * HF_HUB_OFFLINE find them in the cache only. Writes the local path of the
 * model file (part 1 of a split one) to out and the number of parts to
 * *parts (may be NULL). progress: draw a progress bar on stderr when it is a
 * terminal (log lines otherwise). Errors: SP_ERR_INVALID (bad reference,
 * a 401/403: gated or private repository), SP_ERR_NOT_FOUND (no such
 * repository or file, nothing cached offline), SP_ERR_FORMAT (the server's
 * answer is malformed or hostile, a checksum mismatch), SP_ERR_IO. */
sp_status_t sp_hub_fetch(const sp_hub_ref_t *ref, bool progress, char *out, size_t out_len,
                         int *parts, char *err, size_t err_len);

/* One cached GGUF file, as sp_hub_list reports it. */
typedef struct sp_hub_entry {
    const char *repo;     /* ORG/REPO */
    const char *file;     /* path inside the repository */
    const char *commit;   /* the snapshot's commit */
    const char *ref;      /* "main" when refs/main names this commit, else "" */
    const char *path;     /* the local path (snapshots/COMMIT/FILE) */
    uint64_t size;        /* bytes of the blob; 0 when the blob is missing */
} sp_hub_entry_t;

/* Call fn for every GGUF file of every model snapshot in the cache (sorted by
 * repository, then commit, then file). A missing cache is an empty one. */
sp_status_t sp_hub_list(void (*fn)(const sp_hub_entry_t *e, void *ud), void *ud, char *err,
                        size_t err_len);

/* Remove from the cache: the whole repository when ref names no file or
 * quant; otherwise the named file (every part of a split one) from every
 * snapshot, and each blob no remaining snapshot links to. *removed counts
 * the files removed. SP_ERR_NOT_FOUND when there was nothing to remove. */
sp_status_t sp_hub_remove(const sp_hub_ref_t *ref, int *removed, char *err, size_t err_len);

struct sp_serve_config;
/* Every --model whose file is an hf:// reference: fetched (or found in the
 * cache offline) and its path replaced by the local file. A split model is
 * refused: the loader reads one file. Called by serve before its loops. */
sp_status_t sp_hub_resolve_models(struct sp_serve_config *cfg, char *err, size_t err_len);

#endif /* SP_SERVING_HUB_H */
