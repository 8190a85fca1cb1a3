/*
 * hub.c - the Hugging Face hub client behind `sampan pull`, `list`, `rm` and
 * `serve --model hf://...` (hub.h; the design is in docs/design.md).
 *
 * Resolution: an exact path is taken as given; otherwise the repository's
 * file list (GET {endpoint}/api/models/ORG/REPO/tree/main?recursive=true,
 * following the Link header's next pages) and sp_hub_pick choose the file.
 * Each file is then described by a HEAD of {endpoint}/ORG/REPO/resolve/main/FILE
 * without following redirects (the hub answers with X-Repo-Commit,
 * X-Linked-Etag and X-Linked-Size before sending the client to its storage)
 * and fetched by a GET of the same URL that follows at most five redirects.
 *
 * Cache layout (huggingface_hub's): HUB/models--ORG--REPO/blobs/ETAG holds the
 * bytes, snapshots/COMMIT/FILE is a relative symbolic link to it, refs/main
 * holds the commit. A download goes to blobs/ETAG.incomplete and resumes from
 * its length with a Range request after a cut connection (in the same run,
 * up to SAMPAN_HF_RETRIES tries, or in a later one); the finished file's
 * SHA-256 (a 64-hex ETag, the LFS object id) or git blob SHA-1 (a 40-hex
 * one) must match, else the file is deleted and the pull fails. A lock file
 * under HUB/.locks keeps two processes from writing one blob.
 *
 * Hostile servers: only http and https, for redirects too; five redirects at
 * most; header values copied into fixed buffers and refused when longer;
 * listing pages bounded to 16 MiB and 100 pages; a download never writes past
 * the announced size; the ETag and commit are used as file names only when
 * they are hex of the right length, and a repository path only when
 * sp_hub_valid_path holds. The token goes only to the endpoint's host
 * (libcurl drops Authorization when a redirect changes host).
 *
 * Threads and memory: see hub.h. Each call owns its curl handles and buffers.
 */
#include "serving/hub.h"

#include <ctype.h>
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "core/alloc.h"
#include "core/json.h"
#include "serving/config.h"
#include "sampan/log.h"
#include "sampan/version.h"

#define HUB_PATH 4096
#define HUB_MAX_REDIRS 5
#define HUB_MAX_PAGE (16u << 20)
#define HUB_MAX_PAGES 100
#define HUB_MAX_FILES 100000

/* ------------------------------------------------------------ names */

bool
sp_hub_is_uri(const char *s)
{
    return s != NULL && strncmp(s, SP_HUB_SCHEME, strlen(SP_HUB_SCHEME)) == 0;
}

/* An ORG or REPO name: what the hub allows, and safe inside a directory name. */
static bool
valid_name(const char *s, size_t n)
{
    if (n == 0 || n > 96 || s[0] == '.' || s[0] == '-') {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!(isalnum(c) || c == '.' || c == '_' || c == '-')) {
            return false;
        }
    }
    return memmem(s, n, "..", 2) == NULL && memmem(s, n, "--", 2) == NULL;
}

bool
sp_hub_valid_path(const char *path)
{
    size_t n = strlen(path);
    if (n == 0 || n > 500 || path[0] == '/') {
        return false;
    }
    const char *seg = path;
    for (size_t i = 0; i <= n; i++) {
        unsigned char c = (unsigned char)path[i];
        if (c == '/' || c == '\0') {
            size_t sl = (size_t)(path + i - seg);
            if (sl == 0 || (sl == 1 && seg[0] == '.') || (sl == 2 && seg[0] == '.' && seg[1] == '.')) {
                return false;
            }
            seg = path + i + 1;
        } else if (c < 0x20 || c == 0x7F || c == '\\') {
            return false;
        }
    }
    return true;
}

sp_status_t
sp_hub_parse(const char *uri, sp_hub_ref_t *ref, char *err, size_t err_len)
{
    memset(ref, 0, sizeof *ref);
    if (!sp_hub_is_uri(uri)) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "'%s' is not an hf:// reference", uri);
    }
    const char *p = uri + strlen(SP_HUB_SCHEME);
    const char *s1 = strchr(p, '/');
    if (s1 == NULL) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "'%s': expected hf://ORG/REPO[/FILE.gguf | :QUANT]", uri);
    }
    const char *r = s1 + 1;
    size_t rl = strcspn(r, "/:");
    if (!valid_name(p, (size_t)(s1 - p)) || !valid_name(r, rl)) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "'%s': ORG and REPO are letters, digits, '.', '_' and '-'", uri);
    }
    snprintf(ref->repo, sizeof ref->repo, "%.*s/%.*s", (int)(s1 - p), p, (int)rl, r);
    const char *rest = r + rl;
    if (*rest == ':') {
        rest++;
        size_t ql = strlen(rest);
        if (ql == 0 || ql >= sizeof ref->quant) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "'%s': empty or long quant tag", uri);
        }
        for (size_t i = 0; i < ql; i++) {
            if (!isalnum((unsigned char)rest[i]) && rest[i] != '_') {
                return sp_errf(err, err_len, SP_ERR_INVALID,
                               "'%s': a quant tag is letters, digits and '_' (e.g. Q4_K_M)", uri);
            }
        }
        memcpy(ref->quant, rest, ql + 1);
    } else if (*rest == '/') {
        rest++;
        if (*rest != '\0') {
            if (!sp_hub_valid_path(rest) || strlen(rest) >= sizeof ref->file) {
                return sp_errf(err, err_len, SP_ERR_INVALID,
                               "'%s': the file path may not be absolute or contain '.', '..', "
                               "empty components, backslashes or control characters", uri);
            }
            snprintf(ref->file, sizeof ref->file, "%s", rest);
        }
    }
    return SP_OK;
}

bool
sp_hub_split(const char *path, int *part, int *count, size_t *prefix_len)
{
    /* NAME-00001-of-00003.gguf: the tail is 20 bytes. */
    size_t n = strlen(path);
    if (n <= 20 || strcasecmp(path + n - 5, ".gguf") != 0) {
        return false;
    }
    const char *t = path + n - 20;
    if (t[0] != '-' || strncasecmp(t + 6, "-of-", 4) != 0) {
        return false;
    }
    int k = 0, c = 0;
    for (int i = 0; i < 5; i++) {
        if (!isdigit((unsigned char)t[1 + i]) || !isdigit((unsigned char)t[10 + i])) {
            return false;
        }
        k = k * 10 + (t[1 + i] - '0');
        c = c * 10 + (t[10 + i] - '0');
    }
    if (k < 1 || c < 1 || k > c) {
        return false;
    }
    *part = k;
    *count = c;
    *prefix_len = n - 20;
    return true;
}

static bool
is_model_gguf(const char *path)
{
    size_t n = strlen(path);
    if (n < 5 || strcasecmp(path + n - 5, ".gguf") != 0) {
        return false;
    }
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    return strcasestr(base, "mmproj") == NULL && strcasestr(base, "imatrix") == NULL;
}

static bool
first_part(const char *path)
{
    int k, c;
    size_t pl;
    return !sp_hub_split(path, &k, &c, &pl) || k == 1;
}

/* The file name holds TAG followed by '.' or '-', case-insensitive. */
static bool
has_tag(const char *path, const char *tag)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t tl = strlen(tag);
    for (const char *p = base; (p = strcasestr(p, tag)) != NULL; p++) {
        if (p[tl] == '.' || p[tl] == '-') {
            return true;
        }
    }
    return false;
}

int
sp_hub_pick(const char *const *paths, size_t n, const char *quant)
{
    static const char *const defaults[] = {"Q4_K_M", "Q8_0"};
    const char *const *tags = defaults;
    size_t nt = 2;
    if (quant != NULL && quant[0] != '\0') {
        tags = &quant;
        nt = 1;
    }
    for (size_t t = 0; t < nt; t++) {
        for (size_t i = 0; i < n; i++) {
            if (is_model_gguf(paths[i]) && first_part(paths[i]) && has_tag(paths[i], tags[t])) {
                return (int)i;
            }
        }
    }
    if (tags == defaults) {
        for (size_t i = 0; i < n; i++) {
            if (is_model_gguf(paths[i]) && first_part(paths[i])) {
                return (int)i;
            }
        }
    }
    return -1;
}

/* --------------------------------------------------------- environment */

static bool
env_true(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && (strcmp(v, "1") == 0 || strcasecmp(v, "true") == 0 ||
                         strcasecmp(v, "yes") == 0 || strcasecmp(v, "on") == 0);
}

static long
env_seconds(const char *name, long dflt, long hi)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0') {
        return dflt;
    }
    char *end;
    double d = strtod(v, &end);
    if (*end != '\0' || !(d > 0)) {
        SP_LOG_WARN("event=hf_env name=%s value=%s note=\"not a positive number; using %ld\"",
                    name, sp_log_str(v), dflt);
        return dflt;
    }
    return d > (double)hi ? hi : (long)(d + 0.999);
}

static sp_status_t
hf_home(char *out, size_t len, char *err, size_t err_len)
{
    const char *h = getenv("HF_HOME");
    int n;
    if (h && *h) {
        n = snprintf(out, len, "%s", h);
    } else if ((h = getenv("XDG_CACHE_HOME")) && *h) {
        n = snprintf(out, len, "%s/huggingface", h);
    } else if ((h = getenv("HOME")) && *h) {
        n = snprintf(out, len, "%s/.cache/huggingface", h);
    } else {
        return sp_errf(err, err_len, SP_ERR_INVALID, "set HF_HOME (no HOME to find the cache)");
    }
    if (n < 0 || (size_t)n >= len) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "HF_HOME is too long");
    }
    return SP_OK;
}

sp_status_t
sp_hub_cache_dir(char *out, size_t out_len, char *err, size_t err_len)
{
    const char *c = getenv("HF_HUB_CACHE");
    if (c && *c) {
        if (strlen(c) >= out_len) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "HF_HUB_CACHE is too long");
        }
        snprintf(out, out_len, "%s", c);
        return SP_OK;
    }
    char home[HUB_PATH];
    sp_status_t st = hf_home(home, sizeof home, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    if ((size_t)snprintf(out, out_len, "%s/hub", home) >= out_len) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "HF_HOME is too long");
    }
    return SP_OK;
}

/* HF_TOKEN, else the first line of HF_HOME/token (huggingface-cli login). */
static void
read_token(char *out, size_t len)
{
    out[0] = '\0';
    const char *t = getenv("HF_TOKEN");
    char buf[1024];
    if (t == NULL || *t == '\0') {
        char home[HUB_PATH], path[HUB_PATH + 8];
        if (hf_home(home, sizeof home, NULL, 0) != SP_OK) {
            return;
        }
        snprintf(path, sizeof path, "%s/token", home);
        FILE *f = fopen(path, "r");
        if (f == NULL) {
            return;
        }
        t = fgets(buf, sizeof buf, f);
        fclose(f);
        if (t == NULL) {
            return;
        }
        buf[strcspn(buf, "\r\n")] = '\0';
    }
    /* A token is one header value: printable ASCII without spaces. */
    size_t n = strlen(t);
    if (n == 0 || n >= len) {
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (t[i] <= 0x20 || t[i] >= 0x7F) {
            SP_LOG_WARN("event=hf_token note=\"the token holds spaces or control characters; "
                        "not sent\"");
            return;
        }
    }
    memcpy(out, t, n + 1);
}

static void
endpoint(char *out, size_t len)
{
    const char *e = getenv("HF_ENDPOINT");
    snprintf(out, len, "%s", e && *e ? e : "https://huggingface.co");
    size_t n = strlen(out);
    while (n > 0 && out[n - 1] == '/') {
        out[--n] = '\0';
    }
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static bool curl_ok;

static void
curl_init_once(void)
{
    curl_ok = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
}

/* ---------------------------------------------------------- file system */

static bool
is_hex(const char *s, size_t n)
{
    if (strlen(s) != n) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (!isxdigit((unsigned char)s[i]) || isupper((unsigned char)s[i])) {
            return false;
        }
    }
    return true;
}

/* mkdir -p of the directory part of path (dir_only: of path itself). */
static sp_status_t
mkdirs(const char *path, bool dir_only, char *err, size_t err_len)
{
    char tmp[HUB_PATH];
    snprintf(tmp, sizeof tmp, "%s", path);
    if (!dir_only) {
        char *s = strrchr(tmp, '/');
        if (s == NULL) {
            return SP_OK;
        }
        *s = '\0';
    }
    for (char *p = tmp + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char saved = *p;
            *p = '\0';
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST) {
                return sp_errf(err, err_len, SP_ERR_IO, "cannot create %s: %s", tmp,
                               strerror(errno));
            }
            *p = saved;
            if (saved == '\0') {
                break;
            }
        }
    }
    return SP_OK;
}

static sp_status_t
repo_dir(const sp_hub_ref_t *ref, char *out, size_t len, char *err, size_t err_len)
{
    char hub[HUB_PATH];
    sp_status_t st = sp_hub_cache_dir(hub, sizeof hub, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    const char *slash = strchr(ref->repo, '/');
    if ((size_t)snprintf(out, len, "%s/models--%.*s--%s", hub, (int)(slash - ref->repo), ref->repo,
                         slash + 1) >= len) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "cache path too long");
    }
    return SP_OK;
}

static bool
read_commit(const char *rdir, char *commit)
{
    char path[HUB_PATH + 16];
    snprintf(path, sizeof path, "%s/refs/main", rdir);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return false;
    }
    char buf[64] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    buf[strcspn(buf, "\r\n \t")] = '\0';
    if (!is_hex(buf, 40)) {
        return false;
    }
    memcpy(commit, buf, 41);
    return true;
}

static sp_status_t
write_ref(const char *rdir, const char *commit, char *err, size_t err_len)
{
    char path[HUB_PATH + 16], tmp[HUB_PATH + 32];
    snprintf(path, sizeof path, "%s/refs/main", rdir);
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    sp_status_t st = mkdirs(path, false, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    FILE *f = fopen(tmp, "w");
    if (f == NULL || fputs(commit, f) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
        if (f) {
            unlink(tmp);
        }
        return sp_errf(err, err_len, SP_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    }
    return SP_OK;
}

/* snapshots/COMMIT/FILE -> ../../blobs/ETAG (one more ../ per directory of FILE). */
static sp_status_t
link_snapshot(const char *rdir, const char *commit, const char *file, const char *etag,
              char *out, size_t out_len, char *err, size_t err_len)
{
    char ptr[HUB_PATH], target[HUB_PATH];
    if ((size_t)snprintf(ptr, sizeof ptr, "%s/snapshots/%s/%s", rdir, commit, file) >= sizeof ptr) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "cache path too long");
    }
    size_t t = 0;
    for (const char *p = file; *p; p++) {
        if (*p == '/') {
            t += (size_t)snprintf(target + t, sizeof target - t, "../");
        }
    }
    snprintf(target + t, sizeof target - t, "../../blobs/%s", etag);
    sp_status_t st = mkdirs(ptr, false, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    char cur[HUB_PATH];
    ssize_t n = readlink(ptr, cur, sizeof cur - 1);
    if (n >= 0) {
        cur[n] = '\0';
        if (strcmp(cur, target) == 0) {
            goto done;
        }
    }
    if ((unlink(ptr) != 0 && errno != ENOENT) || symlink(target, ptr) != 0) {
        return sp_errf(err, err_len, SP_ERR_IO, "cannot link %s: %s", ptr, strerror(errno));
    }
done:
    if (out != NULL) {
        if (strlen(ptr) >= out_len) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "cache path too long");
        }
        snprintf(out, out_len, "%s", ptr);
    }
    return SP_OK;
}

/* The SHA-256 (64-hex etag) or git blob SHA-1 (40-hex etag) of a file. */
static sp_status_t
file_digest(const char *path, size_t hex_len, uint64_t size, char *hex, char *err, size_t err_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return sp_errf(err, err_len, SP_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    }
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned char *buf = sp_malloc(1u << 20);
    sp_status_t st = SP_OK;
    if (ctx == NULL || buf == NULL ||
        !EVP_DigestInit_ex(ctx, hex_len == 64 ? EVP_sha256() : EVP_sha1(), NULL)) {
        st = sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory hashing %s", path);
        goto out;
    }
    if (hex_len == 40) {
        char pre[48];
        int pl = snprintf(pre, sizeof pre, "blob %" PRIu64, size);
        EVP_DigestUpdate(ctx, pre, (size_t)pl + 1); /* the NUL is part of git's header */
    }
    for (;;) {
        ssize_t r = read(fd, buf, 1u << 20);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            st = sp_errf(err, err_len, SP_ERR_IO, "cannot read %s: %s", path, strerror(errno));
            goto out;
        }
        if (r == 0) {
            break;
        }
        EVP_DigestUpdate(ctx, buf, (size_t)r);
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int ml = 0;
    EVP_DigestFinal_ex(ctx, md, &ml);
    for (unsigned int i = 0; i < ml; i++) {
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    }
out:
    EVP_MD_CTX_free(ctx);
    sp_free(buf);
    close(fd);
    return st;
}

/* -------------------------------------------------------------- HTTP */

/* What one exchange learned from the headers of its last response. */
typedef struct hdrs {
    char commit[48];
    char etag[80];
    char linked_size[24];
    char content_length[24];
    char content_range[96];
    char location[2048]; /* "" when longer */
    char error_code[64];
    char next[2048]; /* the Link header's rel="next" URL */
    bool too_long;   /* a header we read did not fit its buffer */
} hdrs_t;

static bool
hdr_take(const char *line, size_t n, const char *name, char *dst, size_t dst_len, bool *too_long)
{
    size_t nl = strlen(name);
    if (n <= nl || strncasecmp(line, name, nl) != 0 || line[nl] != ':') {
        return false;
    }
    const char *v = line + nl + 1;
    const char *e = line + n;
    while (v < e && (*v == ' ' || *v == '\t')) {
        v++;
    }
    while (e > v && (e[-1] == '\r' || e[-1] == '\n' || e[-1] == ' ' || e[-1] == '\t')) {
        e--;
    }
    if ((size_t)(e - v) >= dst_len) {
        *too_long = true;
        dst[0] = '\0';
        return true;
    }
    memcpy(dst, v, (size_t)(e - v));
    dst[e - v] = '\0';
    return true;
}

static size_t
header_cb(char *buf, size_t size, size_t nitems, void *ud)
{
    hdrs_t *h = ud;
    size_t n = size * nitems;
    if (n >= 5 && strncmp(buf, "HTTP/", 5) == 0) {
        memset(h, 0, sizeof *h); /* a new response (after a redirect) */
        return n;
    }
    char link[2048];
    bool tl = false;
    if (hdr_take(buf, n, "X-Repo-Commit", h->commit, sizeof h->commit, &h->too_long) ||
        hdr_take(buf, n, "X-Linked-Etag", h->etag, sizeof h->etag, &h->too_long) ||
        hdr_take(buf, n, "X-Linked-Size", h->linked_size, sizeof h->linked_size, &h->too_long) ||
        hdr_take(buf, n, "Content-Length", h->content_length, sizeof h->content_length,
                 &h->too_long) ||
        hdr_take(buf, n, "Content-Range", h->content_range, sizeof h->content_range,
                 &h->too_long) ||
        hdr_take(buf, n, "Location", h->location, sizeof h->location, &tl) ||
        hdr_take(buf, n, "X-Error-Code", h->error_code, sizeof h->error_code, &tl)) {
        /* A long Location (a storage host's signed URL) or error code is only
         * left empty: the HEAD follows relative redirects alone, and libcurl
         * follows the others from its own copy. */
        return n;
    }
    if (h->etag[0] == '\0' && strncasecmp(buf, "ETag:", 5) == 0) {
        hdr_take(buf, n, "ETag", h->etag, sizeof h->etag, &h->too_long);
        return n;
    }
    if (hdr_take(buf, n, "Link", link, sizeof link, &tl) && !tl) {
        /* <URL>; rel="next" (one of possibly several, comma-separated) */
        char *r = strstr(link, "rel=\"next\"");
        if (r != NULL) {
            *r = '\0';
            char *lt = strrchr(link, '<');
            char *gt = lt ? strchr(lt, '>') : NULL;
            if (lt && gt && (size_t)(gt - lt - 1) < sizeof h->next) {
                memcpy(h->next, lt + 1, (size_t)(gt - lt - 1));
                h->next[gt - lt - 1] = '\0';
            }
        }
    }
    return n;
}

typedef struct client {
    char endpoint[1024];
    char auth[1100];
    bool has_token;
    long meta_timeout;
    long dl_timeout;
    struct curl_slist *hdr;
    char ua[64];
} client_t;

static void
client_init(client_t *c)
{
    memset(c, 0, sizeof *c);
    endpoint(c->endpoint, sizeof c->endpoint);
    char tok[1024];
    read_token(tok, sizeof tok);
    if (tok[0]) {
        snprintf(c->auth, sizeof c->auth, "Authorization: Bearer %s", tok);
        c->has_token = true;
        c->hdr = curl_slist_append(c->hdr, c->auth);
    }
    c->hdr = curl_slist_append(c->hdr, "Accept-Encoding: identity");
    c->meta_timeout = env_seconds("HF_HUB_ETAG_TIMEOUT", 10, 3600);
    c->dl_timeout = env_seconds("HF_HUB_DOWNLOAD_TIMEOUT", 10, 3600);
    snprintf(c->ua, sizeof c->ua, "sampan/%s", SAMPAN_VERSION);
}

static void
client_fini(client_t *c)
{
    curl_slist_free_all(c->hdr);
    c->hdr = NULL;
}

static CURL *
easy(const client_t *c, const char *url, hdrs_t *h, char *errbuf)
{
    CURL *e = curl_easy_init();
    if (e == NULL) {
        return NULL;
    }
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_MAXREDIRS, (long)HUB_MAX_REDIRS);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, c->hdr);
    curl_easy_setopt(e, CURLOPT_USERAGENT, c->ua);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, c->meta_timeout);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, header_cb);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, h);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
    errbuf[0] = '\0';
    return e;
}

/* A failed exchange's message, by status and the hub's X-Error-Code. */
static sp_status_t
http_error(const client_t *c, const sp_hub_ref_t *ref, const char *what, long code,
           const hdrs_t *h, char *err, size_t err_len)
{
    if (code == 401 || code == 403) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "%s: HTTP %ld: the repository %s is gated or private and %s", what, code,
                       ref->repo,
                       c->has_token ? "the token in HF_TOKEN was refused (wrong, expired, or "
                                      "without access: accept the model's terms on its page)"
                                    : "no token was given: set HF_TOKEN");
    }
    if (code == 404) {
        if (strcmp(h->error_code, "EntryNotFound") == 0) {
            return sp_errf(err, err_len, SP_ERR_NOT_FOUND, "%s: no such file in %s (HTTP 404)",
                           what, ref->repo);
        }
        return sp_errf(err, err_len, SP_ERR_NOT_FOUND,
                       "%s: HTTP 404: no repository or file (a private repository also needs "
                       "HF_TOKEN)", what);
    }
    return sp_errf(err, err_len, SP_ERR_IO, "%s: HTTP %ld from %s", what, code, c->endpoint);
}

typedef struct membuf {
    char *p;
    size_t n;
    bool over;
} membuf_t;

static size_t
mem_cb(char *buf, size_t size, size_t nitems, void *ud)
{
    membuf_t *m = ud;
    size_t n = size * nitems;
    if (m->n + n > HUB_MAX_PAGE) {
        m->over = true;
        return 0;
    }
    char *q = sp_realloc(m->p, m->n + n + 1);
    if (q == NULL) {
        m->over = true;
        return 0;
    }
    memcpy(q + m->n, buf, n);
    m->n += n;
    q[m->n] = '\0';
    m->p = q;
    return n;
}

typedef struct strlist {
    char **v;
    size_t n, cap;
} strlist_t;

static bool
strlist_add(strlist_t *l, const char *s)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        char **v = sp_realloc(l->v, cap * sizeof *v);
        if (v == NULL) {
            return false;
        }
        l->v = v;
        l->cap = cap;
    }
    size_t n = strlen(s);
    char *d = sp_malloc(n + 1);
    if (d == NULL) {
        return false;
    }
    memcpy(d, s, n + 1);
    l->v[l->n++] = d;
    return true;
}

static void
strlist_free(strlist_t *l)
{
    for (size_t i = 0; i < l->n; i++) {
        sp_free(l->v[i]);
    }
    sp_free(l->v);
    memset(l, 0, sizeof *l);
}

static int
cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The repository's file paths at main, from the tree API (all pages). */
static sp_status_t
list_remote(const client_t *c, const sp_hub_ref_t *ref, strlist_t *out, char *err,
            size_t err_len)
{
    char url[2048];
    snprintf(url, sizeof url, "%s/api/models/%s/tree/main?recursive=true", c->endpoint, ref->repo);
    char what[300];
    snprintf(what, sizeof what, "listing %s", ref->repo);
    for (int page = 0; page < HUB_MAX_PAGES; page++) {
        hdrs_t h;
        memset(&h, 0, sizeof h);
        membuf_t m = {0};
        char eb[CURL_ERROR_SIZE];
        CURL *e = easy(c, url, &h, eb);
        if (e == NULL) {
            return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
        }
        curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(e, CURLOPT_TIMEOUT, c->meta_timeout * 3);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, mem_cb);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, &m);
        CURLcode rc = curl_easy_perform(e);
        long code = 0;
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
        curl_easy_cleanup(e);
        sp_status_t st = SP_OK;
        if (m.over) {
            st = sp_errf(err, err_len, SP_ERR_FORMAT, "%s: the answer is over %u MiB", what,
                         HUB_MAX_PAGE >> 20);
        } else if (rc != CURLE_OK) {
            st = sp_errf(err, err_len, SP_ERR_IO, "%s at %s: %s", what, c->endpoint,
                         eb[0] ? eb : curl_easy_strerror(rc));
        } else if (code != 200) {
            st = http_error(c, ref, what, code, &h, err, err_len);
        }
        json_t *root = NULL;
        if (st == SP_OK) {
            json_error_t je;
            root = json_loadb(m.p ? m.p : "", m.n, 0, &je);
            if (!json_is_array(root)) {
                st = sp_errf(err, err_len, SP_ERR_FORMAT, "%s: the answer is not a JSON array",
                             what);
            }
        }
        sp_free(m.p);
        if (st != SP_OK) {
            json_decref(root);
            return st;
        }
        size_t i;
        json_t *it;
        json_array_foreach(root, i, it) {
            const char *type = json_string_value(json_object_get(it, "type"));
            const char *path = json_string_value(json_object_get(it, "path"));
            if (path == NULL || (type != NULL && strcmp(type, "file") != 0)) {
                continue;
            }
            if (!sp_hub_valid_path(path)) {
                SP_LOG_WARN("event=hf_listing repo=%s note=\"a path the server listed is not a "
                            "safe relative path; skipped\"", ref->repo);
                continue;
            }
            if (out->n >= HUB_MAX_FILES || !strlist_add(out, path)) {
                json_decref(root);
                return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: too many files", what);
            }
        }
        json_decref(root);
        if (h.next[0] == '\0') {
            qsort(out->v, out->n, sizeof *out->v, cmp_str);
            return SP_OK;
        }
        /* The next page must stay on the endpoint. */
        size_t el = strlen(c->endpoint);
        if (strncmp(h.next, c->endpoint, el) != 0 || h.next[el] != '/') {
            return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: the next page is on another host",
                           what);
        }
        snprintf(url, sizeof url, "%s", h.next);
    }
    return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: more than %d pages", what, HUB_MAX_PAGES);
}

/* Percent-encode a repository path for a URL ('/' kept). */
static void
url_path(char *out, size_t len, const char *path)
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)path; *p && o + 4 < len; p++) {
        if (isalnum(*p) || strchr("-._~/", *p)) {
            out[o++] = (char)*p;
        } else {
            o += (size_t)snprintf(out + o, len - o, "%%%02X", *p);
        }
    }
    out[o] = '\0';
}

typedef struct meta {
    char commit[41];
    char etag[65];
    uint64_t size;
} meta_t;

static bool
parse_u64(const char *s, uint64_t *v)
{
    if (*s < '0' || *s > '9') {
        return false;
    }
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0') {
        return false;
    }
    *v = x;
    return true;
}

/* HEAD of the resolve URL: the commit, the blob's ETag and size. */
static sp_status_t
head_file(const client_t *c, const sp_hub_ref_t *ref, const char *file, meta_t *m, char *url,
          size_t url_len, char *err, size_t err_len)
{
    char enc[1600], what[700];
    url_path(enc, sizeof enc, file);
    snprintf(what, sizeof what, "%s/%s", ref->repo, file);
    int un = snprintf(url, url_len, "%s/%s/resolve/main/%s", c->endpoint, ref->repo, enc);
    if (un < 0 || (size_t)un >= url_len) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: the URL is too long", what);
    }
    for (int hop = 0;; hop++) {
        hdrs_t h;
        memset(&h, 0, sizeof h);
        char eb[CURL_ERROR_SIZE];
        CURL *e = easy(c, url, &h, eb);
        if (e == NULL) {
            return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
        }
        curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
        curl_easy_setopt(e, CURLOPT_TIMEOUT, c->meta_timeout);
        CURLcode rc = curl_easy_perform(e);
        long code = 0;
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
        curl_easy_cleanup(e);
        if (rc != CURLE_OK) {
            return sp_errf(err, err_len, SP_ERR_IO, "%s at %s: %s", what, c->endpoint,
                           eb[0] ? eb : curl_easy_strerror(rc));
        }
        if (h.too_long) {
            return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: a response header is too long",
                           what);
        }
        if (code >= 300 && code < 400 && h.commit[0] == '\0' && h.location[0] == '/') {
            /* A renamed repository: a relative redirect on the hub itself. */
            if (hop >= HUB_MAX_REDIRS) {
                return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: too many redirects", what);
            }
            un = snprintf(url, url_len, "%s%s", c->endpoint, h.location);
            if (un < 0 || (size_t)un >= url_len) {
                return sp_errf(err, err_len, SP_ERR_FORMAT, "%s: a redirect too long", what);
            }
            continue;
        }
        if (code >= 400 || code < 200) {
            return http_error(c, ref, what, code, &h, err, err_len);
        }
        /* W/"abc" or "abc" -> abc */
        char *t = h.etag;
        if (strncmp(t, "W/", 2) == 0) {
            t += 2;
        }
        size_t tl = strlen(t);
        if (tl >= 2 && t[0] == '"' && t[tl - 1] == '"') {
            t[tl - 1] = '\0';
            t++;
        }
        if (!is_hex(h.commit, 40)) {
            return sp_errf(err, err_len, SP_ERR_FORMAT,
                           "%s: the server sent no valid X-Repo-Commit (40 hex digits)", what);
        }
        if (!is_hex(t, 64) && !is_hex(t, 40)) {
            return sp_errf(err, err_len, SP_ERR_FORMAT,
                           "%s: the server sent no valid X-Linked-Etag/ETag (a SHA-256 or "
                           "SHA-1 in hex)", what);
        }
        const char *sz = h.linked_size[0] ? h.linked_size : h.content_length;
        if (!parse_u64(sz, &m->size)) {
            return sp_errf(err, err_len, SP_ERR_FORMAT,
                           "%s: the server sent no valid X-Linked-Size/Content-Length", what);
        }
        memcpy(m->commit, h.commit, 41);
        memcpy(m->etag, t, strlen(t) + 1);
        return SP_OK;
    }
}

/* ------------------------------------------------------------ download */

typedef struct dl {
    CURL *e;
    int fd;
    uint64_t have;    /* bytes in the .incomplete file before this try */
    uint64_t got;     /* bytes written by this try */
    uint64_t total;
    bool checked;     /* the response status was looked at */
    bool bad;         /* the body was refused (why says why) */
    char why[200];
    hdrs_t h;
    /* progress */
    bool bar;
    const char *label;
    double t0, last;
    uint64_t at0;
} dl_t;

static double
now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void
human(char *buf, size_t len, double b)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024.0 && i < 4) {
        b /= 1024.0;
        i++;
    }
    snprintf(buf, len, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

static void
draw_bar(dl_t *d, bool final)
{
    double t = now_s();
    if (!final && t - d->last < 0.2) {
        return;
    }
    d->last = t;
    uint64_t at = d->have + d->got;
    double rate = t > d->t0 ? (double)(at - d->at0) / (t - d->t0) : 0;
    char a[32], b[32], r[32], eta[32] = "--:--";
    human(a, sizeof a, (double)at);
    human(b, sizeof b, (double)d->total);
    human(r, sizeof r, rate);
    if (rate > 0 && d->total >= at) {
        long s = (long)((double)(d->total - at) / rate);
        if (s >= 3600) {
            snprintf(eta, sizeof eta, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
        } else {
            snprintf(eta, sizeof eta, "%ld:%02ld", s / 60, s % 60);
        }
    }
    const char *base = strrchr(d->label, '/');
    base = base ? base + 1 : d->label;
    int pct = d->total ? (int)(100.0 * (double)at / (double)d->total) : 100;
    int fill = pct / 5;
    char bar[21];
    for (int i = 0; i < 20; i++) {
        bar[i] = i < fill ? '#' : '.';
    }
    bar[20] = '\0';
    fprintf(stderr, "\r%-28.28s [%s] %3d%% %10s / %-10s %10s/s ETA %s\033[K%s", base, bar, pct, a,
            b, r, eta, final ? "\n" : "");
    fflush(stderr);
}

static int
xfer_cb(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow)
{
    dl_t *d = ud;
    if (d->bar) {
        draw_bar(d, false);
    }
    return 0;
}

static size_t
write_cb(char *buf, size_t size, size_t nitems, void *ud)
{
    dl_t *d = ud;
    size_t n = size * nitems;
    if (!d->checked) {
        d->checked = true;
        long code = 0;
        curl_easy_getinfo(d->e, CURLINFO_RESPONSE_CODE, &code);
        if (code == 206) {
            /* bytes START-END/TOTAL: must start where the file ends */
            unsigned long long s = 0;
            if (sscanf(d->h.content_range, "bytes %llu-", &s) != 1 || s != d->have) {
                snprintf(d->why, sizeof d->why, "a partial answer that does not start at byte "
                         "%" PRIu64, d->have);
                d->bad = true;
                return 0;
            }
        } else if (code == 200) {
            if (d->have > 0) { /* the server ignored the Range: start over */
                if (ftruncate(d->fd, 0) != 0) {
                    snprintf(d->why, sizeof d->why, "truncate: %s", strerror(errno));
                    d->bad = true;
                    return 0;
                }
                d->have = 0;
                d->at0 = 0;
            }
        } else {
            snprintf(d->why, sizeof d->why, "HTTP %ld", code);
            d->bad = true;
            return 0;
        }
    }
    if (d->have + d->got + n > d->total) {
        snprintf(d->why, sizeof d->why, "more bytes than the announced %" PRIu64, d->total);
        d->bad = true;
        return 0;
    }
    size_t off = 0;
    while (off < n) {
        ssize_t w = pwrite(d->fd, buf + off, n - off, (off_t)(d->have + d->got + off));
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            snprintf(d->why, sizeof d->why, "write: %s", strerror(errno));
            d->bad = true;
            return 0;
        }
        off += (size_t)w;
    }
    d->got += n;
    return n;
}

/* Fetch url into path (the .incomplete file), resuming from its length. */
static sp_status_t
download(const client_t *c, const sp_hub_ref_t *ref, const char *url, const char *path,
         const char *label, uint64_t total, bool progress, char *err, size_t err_len)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        return sp_errf(err, err_len, SP_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    }
    long tries = env_seconds("SAMPAN_HF_RETRIES", 5, 100);
    bool tty = progress && isatty(2);
    sp_status_t st = SP_OK;
    double t_start = now_s();
    uint64_t first_have = 0;
    for (long attempt = 1;; attempt++) {
        struct stat sb;
        if (fstat(fd, &sb) != 0) {
            st = sp_errf(err, err_len, SP_ERR_IO, "%s: %s", path, strerror(errno));
            break;
        }
        uint64_t have = (uint64_t)sb.st_size;
        if (have > total) {
            if (ftruncate(fd, 0) != 0) {
                st = sp_errf(err, err_len, SP_ERR_IO, "%s: %s", path, strerror(errno));
                break;
            }
            have = 0;
        }
        if (attempt == 1) {
            first_have = have;
            SP_LOG_INFO("event=hf_download file=%s bytes=%" PRIu64 " resume_from=%" PRIu64,
                        sp_log_str(label), total, have);
        }
        if (have == total) {
            break;
        }
        dl_t d;
        memset(&d, 0, sizeof d);
        d.fd = fd;
        d.have = have;
        d.total = total;
        d.bar = tty;
        d.label = label;
        d.t0 = d.last = now_s();
        d.at0 = have;
        char eb[CURL_ERROR_SIZE];
        d.e = easy(c, url, &d.h, eb);
        if (d.e == NULL) {
            st = sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
            break;
        }
        char range[48];
        snprintf(range, sizeof range, "%" PRIu64 "-", have);
        if (have > 0) {
            curl_easy_setopt(d.e, CURLOPT_RANGE, range);
        }
        curl_easy_setopt(d.e, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(d.e, CURLOPT_FAILONERROR, 1L);
        curl_easy_setopt(d.e, CURLOPT_WRITEFUNCTION, write_cb);
        curl_easy_setopt(d.e, CURLOPT_WRITEDATA, &d);
        curl_easy_setopt(d.e, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(d.e, CURLOPT_XFERINFOFUNCTION, xfer_cb);
        curl_easy_setopt(d.e, CURLOPT_XFERINFODATA, &d);
        /* Cut a stalled transfer: under 1 byte/s for the download timeout. */
        curl_easy_setopt(d.e, CURLOPT_LOW_SPEED_LIMIT, 1L);
        curl_easy_setopt(d.e, CURLOPT_LOW_SPEED_TIME, c->dl_timeout);
        CURLcode rc = curl_easy_perform(d.e);
        long code = 0;
        curl_easy_getinfo(d.e, CURLINFO_RESPONSE_CODE, &code);
        curl_easy_cleanup(d.e);
        if (tty) {
            draw_bar(&d, true); /* ends the line, so a retry's log line starts clean */
        }
        if (rc == CURLE_OK && d.have + d.got == total) {
            break;
        }
        if (d.h.too_long) {
            st = sp_errf(err, err_len, SP_ERR_FORMAT, "%s: a response header is too long", label);
            break;
        }
        if (d.bad && strncmp(d.why, "write", 5) == 0) {
            st = sp_errf(err, err_len, SP_ERR_IO, "%s: %s", label, d.why);
            break;
        }
        if (d.bad && strncmp(d.why, "more bytes", 10) == 0) {
            st = sp_errf(err, err_len, SP_ERR_FORMAT, "%s: the server sent %s", label, d.why);
            break;
        }
        if (rc == CURLE_HTTP_RETURNED_ERROR && code >= 400 && code < 500 && code != 408 &&
            code != 429) {
            st = http_error(c, ref, label, code, &d.h, err, err_len);
            break;
        }
        const char *why = d.bad ? d.why : rc != CURLE_OK ? (eb[0] ? eb : curl_easy_strerror(rc))
                                                          : "the connection ended early";
        if (attempt >= tries) {
            st = sp_errf(err, err_len, SP_ERR_IO,
                         "%s: %s after %ld tries (the partial file %s is kept; pull again to "
                         "resume)", label, why, attempt, path);
            break;
        }
        SP_LOG_WARN("event=hf_retry file=%s try=%ld bytes_so_far=%" PRIu64 " error=%s",
                    sp_log_str(label), attempt, d.have + d.got, sp_log_str(why));
        struct timespec ts = {0, 250000000L * (attempt < 4 ? attempt : 4)};
        nanosleep(&ts, NULL);
    }
    close(fd);
    if (st == SP_OK) {
        double dt = now_s() - t_start;
        SP_LOG_INFO("event=hf_downloaded file=%s bytes=%" PRIu64 " seconds=%.2f mib_per_s=%.1f",
                    sp_log_str(label), total, dt,
                    dt > 0 ? (double)(total - first_have) / dt / 1048576.0 : 0.0);
    }
    return st;
}

/* One file of the repository into the cache: HEAD, download unless the blob
 * is there, check, link. The snapshot path goes to out (may be NULL). */
static sp_status_t
fetch_file(const client_t *c, const sp_hub_ref_t *ref, const char *rdir, const char *file,
           bool progress, char *commit, char *out, size_t out_len, char *err, size_t err_len)
{
    meta_t m;
    char url[2048];
    sp_status_t st = head_file(c, ref, file, &m, url, sizeof url, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    if (commit[0] && strcmp(commit, m.commit) != 0) {
        return sp_errf(err, err_len, SP_ERR_IO,
                       "%s changed while it was downloaded (commit %s, then %s): pull again",
                       ref->repo, commit, m.commit);
    }
    memcpy(commit, m.commit, 41);
    char blob[HUB_PATH + 80], part[HUB_PATH + 96], lockp[HUB_PATH * 2 + 80], label[800];
    snprintf(blob, sizeof blob, "%s/blobs/%s", rdir, m.etag);
    snprintf(part, sizeof part, "%s.incomplete", blob);
    snprintf(label, sizeof label, "%s:%s", ref->repo, file);
    char hub[HUB_PATH];
    if ((st = sp_hub_cache_dir(hub, sizeof hub, err, err_len)) != SP_OK) {
        return st;
    }
    const char *rname = strrchr(rdir, '/') + 1;
    snprintf(lockp, sizeof lockp, "%s/.locks/%s/%s.lock", hub, rname, m.etag);
    if ((st = mkdirs(blob, false, err, err_len)) != SP_OK ||
        (st = mkdirs(lockp, false, err, err_len)) != SP_OK) {
        return st;
    }
    int lfd = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lfd < 0) {
        return sp_errf(err, err_len, SP_ERR_IO, "cannot open %s: %s", lockp, strerror(errno));
    }
    if (flock(lfd, LOCK_EX | LOCK_NB) != 0) {
        SP_LOG_INFO("event=hf_wait file=%s note=\"another process is downloading it\"",
                    sp_log_str(label));
        flock(lfd, LOCK_EX);
    }
    struct stat sb;
    if (stat(blob, &sb) == 0 && (uint64_t)sb.st_size == m.size) {
        SP_LOG_INFO("event=hf_cached file=%s bytes=%" PRIu64, sp_log_str(label), m.size);
    } else {
        st = download(c, ref, url, part, label, m.size, progress, err, err_len);
        if (st == SP_OK) {
            char got[130] = {0};
            size_t hl = strlen(m.etag);
            st = file_digest(part, hl, m.size, got, err, err_len);
            if (st == SP_OK && strcmp(got, m.etag) != 0) {
                unlink(part);
                st = sp_errf(err, err_len, SP_ERR_FORMAT,
                             "%s: checksum mismatch: the server announced %s %s, the file has "
                             "%s; the download was deleted", label,
                             hl == 64 ? "sha256" : "git sha1", m.etag, got);
            }
            if (st == SP_OK && rename(part, blob) != 0) {
                st = sp_errf(err, err_len, SP_ERR_IO, "cannot rename %s: %s", part,
                             strerror(errno));
            }
        }
    }
    close(lfd);
    if (st != SP_OK) {
        return st;
    }
    return link_snapshot(rdir, m.commit, file, m.etag, out, out_len, err, err_len);
}

/* ------------------------------------------------------------- offline */

static strlist_t *walk_list;
static size_t walk_root;

static int
walk_cb(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    if ((type == FTW_F || type == FTW_SL) && strlen(path) > walk_root) {
        if (!strlist_add(walk_list, path + walk_root)) {
            return 1;
        }
    }
    return 0;
}

static pthread_mutex_t walk_lock = PTHREAD_MUTEX_INITIALIZER;

/* The files of one snapshot directory, relative to it, sorted. */
static sp_status_t
snapshot_files(const char *sdir, strlist_t *out, char *err, size_t err_len)
{
    pthread_mutex_lock(&walk_lock); /* nftw has no user pointer */
    walk_list = out;
    walk_root = strlen(sdir) + 1;
    int r = nftw(sdir, walk_cb, 16, FTW_PHYS);
    pthread_mutex_unlock(&walk_lock);
    if (r != 0) {
        return sp_errf(err, err_len, SP_ERR_IO, "cannot read %s", sdir);
    }
    qsort(out->v, out->n, sizeof *out->v, cmp_str);
    return SP_OK;
}

/* ------------------------------------------------------------- resolve */

/* The files to fetch for ref among the listed paths (all parts of a split
 * model, part 1 first); the model file's index is 0 of out. */
static sp_status_t
choose(const sp_hub_ref_t *ref, const strlist_t *all, strlist_t *out, const char *where,
       char *err, size_t err_len)
{
    const char *want = ref->file;
    if (want[0] == '\0') {
        int i = sp_hub_pick((const char *const *)all->v, all->n, ref->quant);
        if (i < 0) {
            char names[600] = "";
            size_t o = 0;
            for (size_t k = 0; k < all->n && o + 80 < sizeof names; k++) {
                if (is_model_gguf(all->v[k])) {
                    o += (size_t)snprintf(names + o, sizeof names - o, "%s%s", o ? ", " : "",
                                          all->v[k]);
                }
            }
            return sp_errf(err, err_len, SP_ERR_NOT_FOUND, "%s%s: no GGUF model file%s%s (%s: %s)",
                           SP_HUB_SCHEME, ref->repo, ref->quant[0] ? " for quant " : "",
                           ref->quant, where, names[0] ? names : "no GGUF files");
        }
        want = all->v[i];
    }
    int k, cnt;
    size_t pl;
    if (!sp_hub_split(want, &k, &cnt, &pl)) {
        return strlist_add(out, want) ? SP_OK : sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    /* Every part, named as the first one is. */
    char name[600];
    for (int p = 1; p <= cnt; p++) {
        snprintf(name, sizeof name, "%.*s-%05d-of-%05d.gguf", (int)pl, want, p, cnt);
        if (!strlist_add(out, name)) {
            return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
        }
    }
    if (k != 1) {
        SP_LOG_INFO("event=hf_split file=%s note=\"a split model: all %d parts are fetched\"",
                    sp_log_str(want), cnt);
    }
    return SP_OK;
}

static sp_status_t
fetch_offline(const sp_hub_ref_t *ref, const char *rdir, char *out, size_t out_len, int *parts,
              char *err, size_t err_len)
{
    char commit[41];
    if (!read_commit(rdir, commit)) {
        return sp_errf(err, err_len, SP_ERR_NOT_FOUND,
                       "HF_HUB_OFFLINE is set and %s is not in the cache (no %s/refs/main)",
                       ref->repo, rdir);
    }
    char sdir[HUB_PATH + 64];
    snprintf(sdir, sizeof sdir, "%s/snapshots/%s", rdir, commit);
    strlist_t all = {0}, want = {0};
    sp_status_t st = snapshot_files(sdir, &all, err, err_len);
    if (st == SP_OK) {
        st = choose(ref, &all, &want, "HF_HUB_OFFLINE is set, and the cache has", err, err_len);
    }
    for (size_t i = 0; st == SP_OK && i < want.n; i++) {
        char p[HUB_PATH * 2];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", sdir, want.v[i]);
        if (stat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            st = sp_errf(err, err_len, SP_ERR_NOT_FOUND,
                         "HF_HUB_OFFLINE is set and %s/%s is not in the cache (no %s)",
                         ref->repo, want.v[i], p);
        } else if (i == 0) {
            if (strlen(p) >= out_len) {
                st = sp_errf(err, err_len, SP_ERR_INVALID, "cache path too long");
            } else {
                snprintf(out, out_len, "%s", p);
            }
        }
    }
    if (st == SP_OK && parts) {
        *parts = (int)want.n;
    }
    strlist_free(&all);
    strlist_free(&want);
    return st;
}

sp_status_t
sp_hub_fetch(const sp_hub_ref_t *ref, bool progress, char *out, size_t out_len, int *parts,
             char *err, size_t err_len)
{
    char rdir[HUB_PATH];
    sp_status_t st = repo_dir(ref, rdir, sizeof rdir, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    if (env_true("HF_HUB_OFFLINE")) {
        return fetch_offline(ref, rdir, out, out_len, parts, err, err_len);
    }
    pthread_once(&curl_once, curl_init_once);
    if (!curl_ok) {
        return sp_errf(err, err_len, SP_ERR_IO, "libcurl failed to initialise");
    }
    client_t c;
    client_init(&c);
    strlist_t all = {0}, want = {0};
    if (ref->file[0] == '\0') {
        st = list_remote(&c, ref, &all, err, err_len);
    }
    if (st == SP_OK) {
        st = choose(ref, &all, &want, "the repository has", err, err_len);
    }
    char commit[41] = "";
    for (size_t i = 0; st == SP_OK && i < want.n; i++) {
        st = fetch_file(&c, ref, rdir, want.v[i], progress, commit, i == 0 ? out : NULL, out_len,
                        err, err_len);
    }
    if (st == SP_OK) {
        st = write_ref(rdir, commit, err, err_len);
    }
    if (st == SP_OK && parts) {
        *parts = (int)want.n;
    }
    strlist_free(&all);
    strlist_free(&want);
    client_fini(&c);
    return st;
}

/* -------------------------------------------------------- list and rm */

static void
repo_from_dir(const char *d, char *out, size_t len)
{
    /* models--ORG--REPO -> ORG/REPO */
    const char *p = d + 8;
    const char *sep = strstr(p, "--");
    if (sep == NULL) {
        snprintf(out, len, "%s", p);
    } else {
        snprintf(out, len, "%.*s/%s", (int)(sep - p), p, sep + 2);
    }
}

static int
cmp_dirent(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

static int
only_models(const struct dirent *d)
{
    return strncmp(d->d_name, "models--", 8) == 0;
}

static int
only_commits(const struct dirent *d)
{
    return is_hex(d->d_name, 40);
}

sp_status_t
sp_hub_list(void (*fn)(const sp_hub_entry_t *e, void *ud), void *ud, char *err, size_t err_len)
{
    char hub[HUB_PATH];
    sp_status_t st = sp_hub_cache_dir(hub, sizeof hub, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    struct dirent **repos = NULL;
    int nr = scandir(hub, &repos, only_models, cmp_dirent);
    if (nr < 0) {
        return errno == ENOENT ? SP_OK
                               : sp_errf(err, err_len, SP_ERR_IO, "cannot read %s: %s", hub,
                                         strerror(errno));
    }
    for (int i = 0; i < nr; i++) {
        char rdir[HUB_PATH + 300], sdirs[HUB_PATH + 320], repo[300], main_c[41] = "";
        if (strlen(hub) + strlen(repos[i]->d_name) + 100 > HUB_PATH) {
            free(repos[i]);
            continue;
        }
        snprintf(rdir, sizeof rdir, "%s/%s", hub, repos[i]->d_name);
        snprintf(sdirs, sizeof sdirs, "%s/snapshots", rdir);
        repo_from_dir(repos[i]->d_name, repo, sizeof repo);
        read_commit(rdir, main_c);
        struct dirent **snaps = NULL;
        int ns = scandir(sdirs, &snaps, only_commits, cmp_dirent);
        for (int j = 0; j < ns; j++) {
            char sdir[HUB_PATH + 600];
            snprintf(sdir, sizeof sdir, "%s/%s", sdirs, snaps[j]->d_name);
            strlist_t files = {0};
            if (st == SP_OK) {
                st = snapshot_files(sdir, &files, err, err_len);
            }
            for (size_t k = 0; st == SP_OK && k < files.n; k++) {
                size_t fl = strlen(files.v[k]);
                if (fl < 5 || strcasecmp(files.v[k] + fl - 5, ".gguf") != 0) {
                    continue;
                }
                char p[HUB_PATH * 2];
                snprintf(p, sizeof p, "%s/%s", sdir, files.v[k]);
                struct stat sb;
                sp_hub_entry_t e = {
                    .repo = repo,
                    .file = files.v[k],
                    .commit = snaps[j]->d_name,
                    .ref = strcmp(main_c, snaps[j]->d_name) == 0 ? "main" : "",
                    .path = p,
                    .size = stat(p, &sb) == 0 ? (uint64_t)sb.st_size : 0,
                };
                fn(&e, ud);
            }
            strlist_free(&files);
            free(snaps[j]);
        }
        free(snaps);
        free(repos[i]);
    }
    free(repos);
    return st;
}

static int
rm_cb(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    return remove(path) == 0 || errno == ENOENT ? 0 : 1;
}

/* Is the blob still named by a link in any snapshot? */
static bool
blob_used(const char *rdir, const char *etag)
{
    char sdirs[HUB_PATH + 16];
    snprintf(sdirs, sizeof sdirs, "%s/snapshots", rdir);
    struct dirent **snaps = NULL;
    int ns = scandir(sdirs, &snaps, only_commits, cmp_dirent);
    bool used = false;
    for (int j = 0; j < ns; j++) {
        char sdir[HUB_PATH + 300];
        snprintf(sdir, sizeof sdir, "%s/%s", sdirs, snaps[j]->d_name);
        strlist_t files = {0};
        if (!used && snapshot_files(sdir, &files, NULL, 0) == SP_OK) {
            for (size_t k = 0; k < files.n && !used; k++) {
                char p[HUB_PATH * 2], t[HUB_PATH];
                snprintf(p, sizeof p, "%s/%s", sdir, files.v[k]);
                ssize_t n = readlink(p, t, sizeof t - 1);
                if (n > 0) {
                    t[n] = '\0';
                    const char *b = strrchr(t, '/');
                    used = strcmp(b ? b + 1 : t, etag) == 0;
                }
            }
        }
        strlist_free(&files);
        free(snaps[j]);
    }
    free(snaps);
    return used;
}

sp_status_t
sp_hub_remove(const sp_hub_ref_t *ref, int *removed, char *err, size_t err_len)
{
    *removed = 0;
    char rdir[HUB_PATH];
    sp_status_t st = repo_dir(ref, rdir, sizeof rdir, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    struct stat sb;
    if (stat(rdir, &sb) != 0) {
        return sp_errf(err, err_len, SP_ERR_NOT_FOUND, "%s is not in the cache (no %s)",
                       ref->repo, rdir);
    }
    if (ref->file[0] == '\0' && ref->quant[0] == '\0') {
        if (nftw(rdir, rm_cb, 16, FTW_DEPTH | FTW_PHYS) != 0) {
            return sp_errf(err, err_len, SP_ERR_IO, "cannot remove %s: %s", rdir, strerror(errno));
        }
        *removed = 1;
        return SP_OK;
    }
    /* The files to remove: as offline resolution would name them. */
    strlist_t want = {0};
    if (ref->file[0]) {
        st = choose(ref, &(strlist_t){0}, &want, "", err, err_len);
    } else {
        char commit[41];
        if (!read_commit(rdir, commit)) {
            return sp_errf(err, err_len, SP_ERR_NOT_FOUND, "%s has no cached revision main",
                           ref->repo);
        }
        char sdir[HUB_PATH + 64];
        snprintf(sdir, sizeof sdir, "%s/snapshots/%s", rdir, commit);
        strlist_t all = {0};
        st = snapshot_files(sdir, &all, err, err_len);
        if (st == SP_OK) {
            st = choose(ref, &all, &want, "cached files", err, err_len);
        }
        strlist_free(&all);
    }
    char sdirs[HUB_PATH + 16];
    snprintf(sdirs, sizeof sdirs, "%s/snapshots", rdir);
    struct dirent **snaps = NULL;
    int ns = st == SP_OK ? scandir(sdirs, &snaps, only_commits, cmp_dirent) : 0;
    for (size_t i = 0; st == SP_OK && i < want.n; i++) {
        for (int j = 0; j < ns; j++) {
            char p[HUB_PATH * 2], t[HUB_PATH];
            snprintf(p, sizeof p, "%s/%s/%s", sdirs, snaps[j]->d_name, want.v[i]);
            ssize_t n = readlink(p, t, sizeof t - 1);
            if (lstat(p, &sb) != 0) {
                continue;
            }
            if (unlink(p) != 0) {
                st = sp_errf(err, err_len, SP_ERR_IO, "cannot remove %s: %s", p, strerror(errno));
                break;
            }
            (*removed)++;
            if (n > 0) {
                t[n] = '\0';
                const char *b = strrchr(t, '/');
                b = b ? b + 1 : t;
                if ((is_hex(b, 64) || is_hex(b, 40)) && !blob_used(rdir, b)) {
                    char bp[HUB_PATH * 2 + 80];
                    snprintf(bp, sizeof bp, "%s/blobs/%s", rdir, b);
                    unlink(bp);
                }
            }
        }
    }
    for (int j = 0; j < ns; j++) {
        free(snaps[j]);
    }
    free(snaps);
    strlist_free(&want);
    if (st == SP_OK && *removed == 0) {
        return sp_errf(err, err_len, SP_ERR_NOT_FOUND, "%s%s/%s is not in the cache",
                       SP_HUB_SCHEME, ref->repo, ref->file[0] ? ref->file : ref->quant);
    }
    return st;
}

sp_status_t
sp_hub_resolve_models(struct sp_serve_config *cfg, char *err, size_t err_len)
{
    for (int i = 0; i < cfg->n_models; i++) {
        sp_serve_model_cfg_t *m = &cfg->models[i];
        if (!sp_hub_is_uri(m->path)) {
            continue;
        }
        sp_hub_ref_t ref;
        char e[1024], path[sizeof m->path];
        int parts = 1;
        if (sp_hub_parse(m->path, &ref, e, sizeof e) != SP_OK ||
            sp_hub_fetch(&ref, true, path, sizeof path, &parts, e, sizeof e) != SP_OK) {
            return sp_errf(err, err_len, SP_ERR_INVALID, "model %s: %s", m->name, e);
        }
        if (parts > 1) {
            return sp_errf(err, err_len, SP_ERR_UNSUPPORTED,
                           "model %s: %s is split in %d files, and Sampan loads one GGUF file: "
                           "merge the parts (llama-gguf-split --merge) or pick another file",
                           m->name, m->path, parts);
        }
        SP_LOG_INFO("event=hf_model name=%s ref=%s path=%s", sp_log_str(m->name),
                    sp_log_str(m->path), sp_log_str(path));
        snprintf(m->path, sizeof m->path, "%s", path);
    }
    return SP_OK;
}
