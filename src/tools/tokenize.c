/*
 * tokenize.c - `sampan tokenize`: the tokenizer of a GGUF file on stdin, for
 * comparing with other implementations.
 *
 *   sampan tokenize -m FILE [--no-bos] [--special] [--decode]
 *
 * Reads all of stdin. Default: the text (UTF-8, any bytes accepted) becomes
 * token ids, printed space-separated on one line; BOS (and EOS/SEP where the
 * vocabulary asks for them) are added unless --no-bos; --special parses
 * control-token texts such as "<|im_start|>" as single tokens. --decode: stdin
 * holds ids (separated by white space or commas) and the text they stand for
 * is written as raw bytes; --special then also prints control tokens' texts.
 * Exit 0 ok, 1 a bad file or input, 2 bad usage.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "gguf/gguf.h"
#include "text/tokenizer.h"
#include "tools/cli.h"

static const char tokenize_usage[] =
    "usage: sampan tokenize -m FILE [--no-bos] [--special] [--decode]\n"
    "  reads UTF-8 text on stdin and prints its token ids on one line\n"
    "  --no-bos   do not add BOS (nor EOS/SEP where the vocabulary adds them)\n"
    "  --special  parse special-token texts (\"<|im_start|>\") as single tokens;\n"
    "             with --decode, print the texts of control tokens too\n"
    "  --decode   read token ids on stdin and print the text they stand for\n";

/* All of f into a new buffer (sp_free); NULL on a read error or no memory. */
static char *
read_all(FILE *f, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = sp_malloc(cap);
    while (buf != NULL) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) {
            if (ferror(f)) {
                break;
            }
            *len = n;
            return buf;
        }
        size_t bigger;
        if (sp_mul_size(cap, 2, &bigger)) {
            break;
        }
        char *b = sp_realloc(buf, bigger);
        if (b == NULL) {
            break;
        }
        buf = b;
        cap = bigger;
    }
    sp_free(buf);
    return NULL;
}

static int
encode(const sp_tokenizer_t *t, const char *text, size_t len, bool bos, bool special)
{
    int64_t n = sp_tokenizer_encode(t, text, len, bos, special, NULL, 0);
    if (n < 0) {
        fprintf(stderr, "sampan tokenize: %s\n", sp_status_str((sp_status_t)n));
        return 1;
    }
    int32_t *ids = sp_calloc(n > 0 ? (size_t)n : 1, sizeof(int32_t));
    if (ids == NULL) {
        fprintf(stderr, "sampan tokenize: out of memory\n");
        return 1;
    }
    sp_tokenizer_encode(t, text, len, bos, special, ids, n);
    for (int64_t i = 0; i < n; i++) {
        printf(i ? " %d" : "%d", (int)ids[i]);
    }
    putchar('\n');
    sp_free(ids);
    return 0;
}

static int
decode(const sp_tokenizer_t *t, char *text, bool special)
{
    char buf[SP_TOKEN_MAX_BYTES + 8];
    sp_detok_t d = {0};
    for (char *p = text;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == ',') {
            p++;
        }
        if (*p == '\0') {
            break;
        }
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno != 0 || v < 0 || v >= sp_tokenizer_n_vocab(t)) {
            fprintf(stderr, "sampan tokenize: not a token id of this vocabulary: \"%.20s\"\n", p);
            return 1;
        }
        int32_t n = sp_detok_push(t, &d, (int32_t)v, special, buf, (int32_t)sizeof buf);
        fwrite(buf, 1, (size_t)n, stdout);
        p = end;
    }
    int32_t n = sp_detok_flush(&d, buf, (int32_t)sizeof buf);
    fwrite(buf, 1, (size_t)n, stdout);
    return 0;
}

int
sp_cmd_tokenize(int argc, char **argv)
{
    const char *path = NULL;
    bool bos = true, special = false, dec = false;
    for (int i = 1; i < argc; i++) {
        if ((strcmp(argv[i], "-m") == 0 || strcmp(argv[i], "--model") == 0) && i + 1 < argc) {
            path = argv[++i];
        } else if (strcmp(argv[i], "--no-bos") == 0) {
            bos = false;
        } else if (strcmp(argv[i], "--special") == 0) {
            special = true;
        } else if (strcmp(argv[i], "--decode") == 0) {
            dec = true;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(tokenize_usage, stdout);
            return 0;
        } else {
            fprintf(stderr, "sampan tokenize: unknown option %s\n%s", argv[i], tokenize_usage);
            return 2;
        }
    }
    if (path == NULL) {
        fputs(tokenize_usage, stderr);
        return 2;
    }

    int rc = 1;
    char err[512];
    sp_gguf_t *g = NULL;
    sp_tokenizer_t *t = NULL;
    char *text = NULL;
    size_t len = 0;
    if (sp_gguf_open(path, &g, err, sizeof err) != SP_OK ||
        sp_tokenizer_from_gguf(g, &t, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan tokenize: %s\n", err);
        goto done;
    }
    if ((text = read_all(stdin, &len)) == NULL) {
        fprintf(stderr, "sampan tokenize: cannot read stdin\n");
        goto done;
    }
    if (dec) {
        char *z = sp_realloc(text, len + 1); /* NUL-terminate for strtol */
        if (z == NULL) {
            fprintf(stderr, "sampan tokenize: out of memory\n");
            goto done;
        }
        text = z;
        text[len] = '\0';
        if (strlen(text) != len) {
            fprintf(stderr, "sampan tokenize: NUL byte in the ids\n");
            goto done;
        }
        rc = decode(t, text, special);
    } else {
        rc = encode(t, text, len, bos, special);
    }
done:
    fflush(stdout);
    sp_free(text);
    sp_tokenizer_destroy(t);
    sp_gguf_close(g);
    return rc;
}
