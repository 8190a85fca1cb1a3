/* s3repo.c - a model repository in an S3-compatible object store, mirrored locally (s3repo.h). */
#include "serving/s3repo.h"

#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libxml/parser.h>
#include <libxml/tree.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/jbuf.h"
#include "core/json.h"
#include "sampan/log.h"
#include "sampan/version.h"

enum {
    KEY_MAX = 1024,       /* bytes of an object key (S3's own limit) */
    DEPTH_MAX = 8,        /* path segments below the prefix */
    OBJECTS_MAX = 100000, /* objects in one repository */
    PAGES_MAX = 1000,     /* ListObjectsV2 pages in one sync */
};
#define LIST_BYTES_MAX ((size_t)16 << 20)   /* one listing page */
#define ERROR_BYTES_MAX ((size_t)64 << 10)  /* an error body kept for its message */
#define OBJECT_BYTES_MAX ((int64_t)1 << 40) /* one object (1 TiB) */
#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

typedef struct s3obj {
    char *rel;  /* the key below the prefix: a checked relative path */
    char etag[80];
    int64_t size;
} s3obj_t;

struct sp_s3repo {
    char bucket[64];
    char prefix[KEY_MAX]; /* "" or ending in '/' */
    char region[64];
    char endpoint[512];   /* scheme://host[:port], no trailing '/'; "" = AWS virtual-hosted */
    char key_id[128], secret[256], token[2048];
    char dir[1024];       /* mirror root (the repository the scanner reads) */
    char manifest[1100];  /* <dir>.manifest.json */
    s3obj_t *have;        /* what the mirror holds (from the manifest and the last sync) */
    int n_have;
};

bool
sp_s3repo_is_url(const char *url)
{
    return url != NULL && strncmp(url, "s3://", 5) == 0;
}

/* ------------------------------------------------------------------ small helpers */

static void
hex(const unsigned char *p, size_t n, char *out)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[p[i] >> 4];
        out[2 * i + 1] = d[p[i] & 15];
    }
    out[2 * n] = '\0';
}

static void
sha256_hex(const void *p, size_t n, char out[65])
{
    unsigned char h[SHA256_DIGEST_LENGTH];
    SHA256(p, n, h);
    hex(h, sizeof h, out);
}

static void
hmac(const void *key, size_t klen, const char *msg, unsigned char out[32])
{
    unsigned int n = 32;
    HMAC(EVP_sha256(), key, (int)klen, (const unsigned char *)msg, strlen(msg), out, &n);
}

/* SigV4's URI encoding: everything but A-Z a-z 0-9 - . _ ~ as %XX (uppercase); '/' kept
 * when keep_slash (object paths). */
static void
uri_encode(sp_jbuf_t *b, const char *s, bool keep_slash)
{
    static const char d[] = "0123456789ABCDEF";
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned char c = *p;
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
            c == '.' || c == '_' || c == '~' || (keep_slash && c == '/')) {
            sp_jbuf_raw(b, (const char *)&c, 1);
        } else {
            char e[3] = {'%', d[c >> 4], d[c & 15]};
            sp_jbuf_raw(b, e, 3);
        }
    }
}

/* A key below the prefix that may become a path: segments non-empty, not "." or "..",
 * no control byte or backslash, at most DEPTH_MAX of them. */
static bool
rel_ok(const char *rel)
{
    size_t n = strlen(rel);
    if (n == 0 || n >= KEY_MAX || rel[0] == '/' || rel[n - 1] == '/') {
        return false;
    }
    int depth = 1;
    const char *seg = rel;
    for (const char *p = rel;; p++) {
        if (*p == '/' || *p == '\0') {
            size_t sl = (size_t)(p - seg);
            if (sl == 0 || (sl == 1 && seg[0] == '.') || (sl == 2 && seg[0] == '.' && seg[1] == '.')) {
                return false;
            }
            if (*p == '\0') {
                break;
            }
            if (++depth > DEPTH_MAX) {
                return false;
            }
            seg = p + 1;
        } else if ((unsigned char)*p < 0x20 || *p == 0x7f || *p == '\\') {
            return false;
        }
    }
    /* the mirror's own temporaries never come from the store */
    return !(n > 5 && strcmp(rel + n - 5, ".part") == 0);
}

static sp_status_t
mkdirs(const char *path, char *err, size_t err_len)
{
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST) {
                return sp_errf(err, err_len, SP_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
            }
            *p = '/';
        }
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) {
        return sp_errf(err, err_len, SP_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    }
    return SP_OK;
}

static char *
dupstr(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = sp_malloc(n);
    if (d) {
        memcpy(d, s, n);
    }
    return d;
}

static void
free_objs(s3obj_t *o, int n)
{
    for (int i = 0; i < n; i++) {
        sp_free(o[i].rel);
    }
    sp_free(o);
}

/* ------------------------------------------------------------------ open */

static void
env_copy(char *dst, size_t cap, const char *a, const char *b, const char *def)
{
    const char *v = getenv(a);
    if ((v == NULL || !*v) && b) {
        v = getenv(b);
    }
    snprintf(dst, cap, "%s", v && *v ? v : def);
}

sp_status_t
sp_s3repo_open(const char *url, const char *cache_root, sp_s3repo_t **out, char *local_dir,
               size_t local_cap, char *err, size_t err_len)
{
    *out = NULL;
    if (!sp_s3repo_is_url(url)) {
        return sp_errf(err, err_len, SP_ERR_INVALID, "'%s' is not an s3:// URL", url);
    }
    const char *b = url + 5;
    const char *slash = strchr(b, '/');
    size_t bl = slash ? (size_t)(slash - b) : strlen(b);
    /* S3's bucket names: 3-63 of [a-z0-9.-] (Ceph allows a little more: '_' too) */
    bool ok = bl >= 3 && bl <= 63;
    for (size_t i = 0; i < bl && ok; i++) {
        char c = b[i];
        ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
    }
    if (!ok) {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "%s: the bucket name must be 3 to 63 characters of a-z, 0-9, '.', '-'", url);
    }
    /* Reference-counted by libcurl, and safe beside other threads in the libcurl Debian
     * ships (7.88: CURL_VERSION_THREADSAFE); the tracer's call, if any, came first. */
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        return sp_errf(err, err_len, SP_ERR_IO, "libcurl failed to initialise");
    }
    sp_s3repo_t *r = sp_calloc(1, sizeof *r);
    if (r == NULL) {
        curl_global_cleanup();
        return sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    }
    memcpy(r->bucket, b, bl);
    const char *pre = slash ? slash + 1 : "";
    size_t pl = strlen(pre);
    if (pl + 2 >= sizeof r->prefix || (pl > 0 && pre[pl - 1] != '/' && !rel_ok(pre)) ||
        (pl > 1 && pre[pl - 1] == '/' && pre[pl - 2] == '/')) {
        sp_s3repo_close(r);
        return sp_errf(err, err_len, SP_ERR_INVALID, "%s: the prefix is not a usable path", url);
    }
    snprintf(r->prefix, sizeof r->prefix, "%s%s", pre, pl > 0 && pre[pl - 1] != '/' ? "/" : "");
    env_copy(r->region, sizeof r->region, "AWS_REGION", "AWS_DEFAULT_REGION", "us-east-1");
    env_copy(r->endpoint, sizeof r->endpoint, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "");
    size_t el = strlen(r->endpoint);
    while (el > 0 && r->endpoint[el - 1] == '/') {
        r->endpoint[--el] = '\0';
    }
    if (el > 0 && strncmp(r->endpoint, "http://", 7) != 0 && strncmp(r->endpoint, "https://", 8) != 0) {
        sp_errf(err, err_len, SP_ERR_INVALID,
                "AWS_ENDPOINT_URL must start with http:// or https://, got '%s'", r->endpoint);
        sp_s3repo_close(r);
        return SP_ERR_INVALID;
    }
    env_copy(r->key_id, sizeof r->key_id, "AWS_ACCESS_KEY_ID", NULL, "");
    env_copy(r->secret, sizeof r->secret, "AWS_SECRET_ACCESS_KEY", NULL, "");
    env_copy(r->token, sizeof r->token, "AWS_SESSION_TOKEN", NULL, "");
    if ((r->key_id[0] != '\0') != (r->secret[0] != '\0')) {
        sp_s3repo_close(r);
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be given together");
    }
    char root[900];
    if (cache_root && cache_root[0]) {
        snprintf(root, sizeof root, "%s", cache_root);
    } else if (getenv("XDG_CACHE_HOME") && getenv("XDG_CACHE_HOME")[0] == '/') {
        snprintf(root, sizeof root, "%.800s/sampan/s3", getenv("XDG_CACHE_HOME"));
    } else if (getenv("HOME") && getenv("HOME")[0] == '/') {
        snprintf(root, sizeof root, "%.800s/.cache/sampan/s3", getenv("HOME"));
    } else {
        snprintf(root, sizeof root, "/tmp/sampan-s3-%u", (unsigned)getuid());
    }
    /* One mirror per endpoint, bucket and prefix: a digest names it. */
    char idsrc[1700], id[65];
    snprintf(idsrc, sizeof idsrc, "%s\n%s\n%s", r->endpoint, r->bucket, r->prefix);
    sha256_hex(idsrc, strlen(idsrc), id);
    snprintf(r->dir, sizeof r->dir, "%s/%s-%.16s", root, r->bucket, id);
    snprintf(r->manifest, sizeof r->manifest, "%s.manifest.json", r->dir);
    sp_status_t st = mkdirs(r->dir, err, err_len);
    if (st != SP_OK) {
        sp_s3repo_close(r);
        return st;
    }
    /* The manifest of an earlier run: what the mirror holds, by key and ETag. */
    FILE *f = fopen(r->manifest, "rb");
    if (f != NULL) {
        json_error_t je;
        json_t *m = json_loadf(f, 0, &je);
        fclose(f);
        const json_t *objs = m ? json_object_get(m, "objects") : NULL;
        size_t n = json_is_array(objs) ? json_array_size(objs) : 0;
        r->have = n ? sp_calloc(n, sizeof *r->have) : NULL;
        for (size_t i = 0; i < n && r->have; i++) {
            const json_t *o = json_array_get(objs, i);
            const char *k = json_string_value(json_object_get(o, "key"));
            const char *e = json_string_value(json_object_get(o, "etag"));
            json_int_t sz = json_integer_value(json_object_get(o, "size"));
            if (k && e && rel_ok(k) && strlen(e) < sizeof r->have[0].etag && sz >= 0) {
                s3obj_t *h = &r->have[r->n_have++];
                h->rel = dupstr(k);
                snprintf(h->etag, sizeof h->etag, "%s", e);
                h->size = sz;
            }
        }
        json_decref(m);
    }
    snprintf(local_dir, local_cap, "%s", r->dir);
    *out = r;
    return SP_OK;
}

void
sp_s3repo_close(sp_s3repo_t *r)
{
    if (r == NULL) {
        return;
    }
    free_objs(r->have, r->n_have);
    OPENSSL_cleanse(r->secret, sizeof r->secret);
    sp_free(r);
    curl_global_cleanup();
}

/* ------------------------------------------------------------------ requests */

typedef struct sink {
    sp_jbuf_t *buf; /* the body in memory (a listing, an error), or */
    FILE *file;     /* streamed to a file, */
    EVP_MD_CTX *md5;
    size_t max;
    size_t got;
    bool over;
} sink_t;

static size_t
on_body(char *p, size_t size, size_t n, void *ud)
{
    sink_t *s = ud;
    size_t len = size * n;
    if (s->got + len > s->max) {
        s->over = true;
        return 0; /* aborts the transfer */
    }
    s->got += len;
    if (s->file) {
        if (fwrite(p, 1, len, s->file) != len) {
            return 0;
        }
        EVP_DigestUpdate(s->md5, p, len);
    } else {
        sp_jbuf_raw(s->buf, p, len);
    }
    return len;
}

/* GET {key} (or the bucket itself with a query) signed with SigV4. query: the canonical
 * query string, already sorted and encoded ("" for none). The body goes to *sink.
 * Returns the HTTP status, or -1 with err filled for a transport failure. */
static long
s3_get(sp_s3repo_t *r, const char *key, const char *query, sink_t *sink, char *err, size_t err_len)
{
    sp_jbuf_t path, url, canon;
    sp_jbuf_init(&path);
    sp_jbuf_init(&url);
    sp_jbuf_init(&canon);
    char host[512];
    if (r->endpoint[0]) {
        /* path-style: {endpoint}/{bucket}/{key} */
        const char *h = strstr(r->endpoint, "://") + 3;
        snprintf(host, sizeof host, "%s", h);
        sp_jbuf_lit(&path, "/");
        uri_encode(&path, r->bucket, false);
        sp_jbuf_lit(&path, "/");
        sp_jbuf_raw(&url, r->endpoint, strlen(r->endpoint));
    } else {
        snprintf(host, sizeof host, "%s.s3.%s.amazonaws.com", r->bucket, r->region);
        sp_jbuf_lit(&path, "/");
        sp_jbuf_lit(&url, "https://");
        sp_jbuf_raw(&url, host, strlen(host));
    }
    uri_encode(&path, key, true);
    sp_jbuf_raw(&url, path.p, path.len);
    if (query[0]) {
        sp_jbuf_lit(&url, "?");
        sp_jbuf_raw(&url, query, strlen(query));
    }
    sp_jbuf_raw(&url, "", 1); /* NUL */

    char amz_date[32], date[16];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(amz_date, sizeof amz_date, "%Y%m%dT%H%M%SZ", &tm);
    strftime(date, sizeof date, "%Y%m%d", &tm);

    struct curl_slist *hdrs = NULL;
    char line[2300];
    snprintf(line, sizeof line, "Host: %s", host);
    hdrs = curl_slist_append(hdrs, line);
    snprintf(line, sizeof line, "x-amz-date: %s", amz_date);
    hdrs = curl_slist_append(hdrs, line);
    hdrs = curl_slist_append(hdrs, "x-amz-content-sha256: " EMPTY_SHA256);
    if (r->token[0]) {
        snprintf(line, sizeof line, "x-amz-security-token: %s", r->token);
        hdrs = curl_slist_append(hdrs, line);
    }
    if (r->key_id[0]) {
        /* canonical request -> string to sign -> signature (SigV4) */
        char sts_hash[65], sig[65];
        const char *signed_hdrs = r->token[0] ? "host;x-amz-content-sha256;x-amz-date;x-amz-security-token"
                                              : "host;x-amz-content-sha256;x-amz-date";
        sp_jbuf_lit(&canon, "GET\n");
        sp_jbuf_raw(&canon, path.p, path.len);
        sp_jbuf_lit(&canon, "\n");
        sp_jbuf_raw(&canon, query, strlen(query));
        snprintf(line, sizeof line, "\nhost:%s\nx-amz-content-sha256:%s\nx-amz-date:%s\n", host,
                 EMPTY_SHA256, amz_date);
        sp_jbuf_raw(&canon, line, strlen(line));
        if (r->token[0]) {
            snprintf(line, sizeof line, "x-amz-security-token:%s\n", r->token);
            sp_jbuf_raw(&canon, line, strlen(line));
        }
        snprintf(line, sizeof line, "\n%s\n%s", signed_hdrs, EMPTY_SHA256);
        sp_jbuf_raw(&canon, line, strlen(line));
        sha256_hex(canon.p, canon.len, sts_hash);
        char scope[128], sts[400];
        snprintf(scope, sizeof scope, "%s/%s/s3/aws4_request", date, r->region);
        snprintf(sts, sizeof sts, "AWS4-HMAC-SHA256\n%s\n%s\n%s", amz_date, scope, sts_hash);
        char k0[300];
        snprintf(k0, sizeof k0, "AWS4%s", r->secret);
        unsigned char k1[32], k2[32], k3[32], k4[32], s[32];
        hmac(k0, strlen(k0), date, k1);
        hmac(k1, 32, r->region, k2);
        hmac(k2, 32, "s3", k3);
        hmac(k3, 32, "aws4_request", k4);
        hmac(k4, 32, sts, s);
        hex(s, 32, sig);
        snprintf(line, sizeof line,
                 "Authorization: AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s",
                 r->key_id, scope, signed_hdrs, sig);
        hdrs = curl_slist_append(hdrs, line);
        OPENSSL_cleanse(k0, sizeof k0);
    }
    long code = -1;
    char cerr[CURL_ERROR_SIZE] = "";
    CURL *h = curl_easy_init();
    if (h == NULL || hdrs == NULL) {
        sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
    } else {
        curl_easy_setopt(h, CURLOPT_URL, url.p);
        curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(h, CURLOPT_USERAGENT, "sampan/" SAMPAN_VERSION);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, sink);
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cerr);
        curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
        /* a stalled transfer ends: under 1 KiB/s for 60 s */
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
        CURLcode rc = curl_easy_perform(h);
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
        if (code >= 300) {
            /* an answer with a status: the caller reports it (its body may be cut short) */
        } else if (sink->over) {
            sp_errf(err, err_len, SP_ERR_TOO_LARGE, "s3://%s/%s: the answer is larger than %zu bytes",
                    r->bucket, key, sink->max - (sink->file ? 1 : 0));
            code = -1;
        } else if (rc != CURLE_OK) {
            sp_errf(err, err_len, SP_ERR_IO, "s3://%s/%s%s: %s", r->bucket, key, query[0] ? "?" : "",
                    cerr[0] ? cerr : curl_easy_strerror(rc));
            code = -1;
        }
    }
    if (h) {
        curl_easy_cleanup(h);
    }
    curl_slist_free_all(hdrs);
    sp_jbuf_free(&path);
    sp_jbuf_free(&url);
    sp_jbuf_free(&canon);
    return code;
}

/* The text of a direct child element, or NULL. */
static const char *
child_text(xmlNode *n, const char *name, xmlChar **hold)
{
    for (xmlNode *c = n->children; c; c = c->next) {
        if (c->type == XML_ELEMENT_NODE && strcmp((const char *)c->name, name) == 0) {
            *hold = xmlNodeGetContent(c);
            return (const char *)*hold;
        }
    }
    return NULL;
}

/* "AccessDenied: Access Denied" from an S3 error document, else the HTTP status. */
static void
s3_error_text(const sp_jbuf_t *body, long code, char *out, size_t cap)
{
    snprintf(out, cap, "HTTP %ld", code);
    if (body->len == 0) {
        return;
    }
    xmlDoc *d = xmlReadMemory(body->p, (int)body->len, "error.xml", NULL,
                              XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
    xmlNode *root = d ? xmlDocGetRootElement(d) : NULL;
    if (root && strcmp((const char *)root->name, "Error") == 0) {
        xmlChar *c = NULL, *m = NULL;
        const char *cs = child_text(root, "Code", &c);
        const char *ms = child_text(root, "Message", &m);
        snprintf(out, cap, "HTTP %ld %.100s%s%.300s", code, cs ? cs : "", ms ? ": " : "", ms ? ms : "");
        xmlFree(c);
        xmlFree(m);
    }
    if (d) {
        xmlFreeDoc(d);
    }
}

static int
obj_cmp(const void *a, const void *b)
{
    return strcmp(((const s3obj_t *)a)->rel, ((const s3obj_t *)b)->rel);
}

/* Every object under the prefix (ListObjectsV2, all pages), sorted by key. */
static sp_status_t
list_all(sp_s3repo_t *r, s3obj_t **out, int *n_out, char *err, size_t err_len)
{
    *out = NULL;
    *n_out = 0;
    s3obj_t *objs = NULL;
    int n = 0, cap = 0;
    char token[2048] = "";
    sp_status_t st = SP_OK;
    for (int page = 0; st == SP_OK; page++) {
        if (page >= PAGES_MAX) {
            st = sp_errf(err, err_len, SP_ERR_TOO_LARGE, "s3://%s/%s: more than %d listing pages",
                         r->bucket, r->prefix, PAGES_MAX);
            break;
        }
        sp_jbuf_t q, body;
        sp_jbuf_init(&q);
        sp_jbuf_init(&body);
        if (token[0]) {
            sp_jbuf_lit(&q, "continuation-token=");
            uri_encode(&q, token, false);
            sp_jbuf_lit(&q, "&");
        }
        sp_jbuf_lit(&q, "list-type=2&prefix=");
        uri_encode(&q, r->prefix, false);
        sp_jbuf_raw(&q, "", 1);
        sink_t sink = {&body, NULL, NULL, LIST_BYTES_MAX, 0, false};
        long code = s3_get(r, "", q.p, &sink, err, err_len);
        sp_jbuf_free(&q);
        if (code < 0) {
            st = SP_ERR_IO;
        } else if (code != 200) {
            char why[512];
            s3_error_text(&body, code, why, sizeof why);
            st = sp_errf(err, err_len, code == 404 ? SP_ERR_NOT_FOUND : SP_ERR_IO,
                         "s3://%s/%s: listing refused: %s", r->bucket, r->prefix, why);
        }
        xmlDoc *d = st == SP_OK ? xmlReadMemory(body.p, (int)body.len, "list.xml", NULL,
                                                XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING)
                                : NULL;
        xmlNode *root = d ? xmlDocGetRootElement(d) : NULL;
        if (st == SP_OK && (root == NULL || strcmp((const char *)root->name, "ListBucketResult") != 0)) {
            st = sp_errf(err, err_len, SP_ERR_INVALID, "s3://%s/%s: the listing is not a ListBucketResult",
                         r->bucket, r->prefix);
        }
        bool more = false;
        for (xmlNode *c = root && st == SP_OK ? root->children : NULL; c && st == SP_OK; c = c->next) {
            if (c->type != XML_ELEMENT_NODE) {
                continue;
            }
            xmlChar *t = NULL, *e = NULL, *z = NULL;
            if (strcmp((const char *)c->name, "Contents") == 0) {
                const char *key = child_text(c, "Key", &t);
                const char *etag = child_text(c, "ETag", &e);
                const char *size = child_text(c, "Size", &z);
                size_t pl = strlen(r->prefix);
                char *end = NULL;
                long long sz = size ? strtoll(size, &end, 10) : -1;
                if (key == NULL || etag == NULL || size == NULL || end == size || *end || sz < 0 ||
                    sz > OBJECT_BYTES_MAX || strncmp(key, r->prefix, pl) != 0) {
                    st = sp_errf(err, err_len, SP_ERR_INVALID,
                                 "s3://%s/%s: a listing entry without a usable Key, ETag or Size%s%s",
                                 r->bucket, r->prefix, key ? ": " : "", key ? key : "");
                } else if (key[strlen(key) - 1] == '/') {
                    /* a "folder" marker object: nothing to mirror */
                } else if (!rel_ok(key + pl)) {
                    st = sp_errf(err, err_len, SP_ERR_INVALID,
                                 "s3://%s/%s: key '%s' cannot be a path in the repository (empty, '.' or "
                                 "'..' segment, control character or backslash, deeper than %d)",
                                 r->bucket, r->prefix, key, DEPTH_MAX);
                } else if (n >= OBJECTS_MAX) {
                    st = sp_errf(err, err_len, SP_ERR_TOO_LARGE, "s3://%s/%s: more than %d objects",
                                 r->bucket, r->prefix, OBJECTS_MAX);
                } else {
                    if (n == cap) {
                        cap = cap ? cap * 2 : 64;
                        s3obj_t *g = sp_realloc(objs, (size_t)cap * sizeof *objs);
                        if (g == NULL) {
                            st = sp_errf(err, err_len, SP_ERR_NOMEM, "out of memory");
                        } else {
                            objs = g;
                        }
                    }
                    if (st == SP_OK) {
                        s3obj_t *o = &objs[n++];
                        o->rel = dupstr(key + pl);
                        /* ETags come quoted ("..."); kept bare */
                        const char *es = etag[0] == '"' ? etag + 1 : etag;
                        size_t el = strlen(es);
                        el = el > 0 && es[el - 1] == '"' ? el - 1 : el;
                        snprintf(o->etag, sizeof o->etag, "%.*s", (int)(el < 79 ? el : 79), es);
                        o->size = sz;
                    }
                }
            } else if (strcmp((const char *)c->name, "IsTruncated") == 0) {
                t = xmlNodeGetContent(c);
                more = t && strcmp((const char *)t, "true") == 0;
            } else if (strcmp((const char *)c->name, "NextContinuationToken") == 0) {
                t = xmlNodeGetContent(c);
                snprintf(token, sizeof token, "%s", t ? (const char *)t : "");
            }
            xmlFree(t);
            xmlFree(e);
            xmlFree(z);
        }
        if (d) {
            xmlFreeDoc(d);
        }
        sp_jbuf_free(&body);
        if (st != SP_OK || !more) {
            break;
        }
        if (token[0] == '\0') {
            st = sp_errf(err, err_len, SP_ERR_INVALID,
                         "s3://%s/%s: a truncated listing without a continuation token", r->bucket, r->prefix);
        }
    }
    if (st != SP_OK) {
        free_objs(objs, n);
        return st;
    }
    qsort(objs, (size_t)n, sizeof *objs, obj_cmp);
    for (int i = 1; i < n; i++) {
        if (strcmp(objs[i].rel, objs[i - 1].rel) == 0) {
            free_objs(objs, n);
            return sp_errf(err, err_len, SP_ERR_INVALID, "s3://%s/%s: key '%s' listed twice", r->bucket,
                           r->prefix, objs[i].rel);
        }
    }
    *out = objs;
    *n_out = n;
    return SP_OK;
}

/* Remove the directories above <dir>/<rel> that are empty, deepest first. */
static void
prune_dirs(sp_s3repo_t *r, const char *rel)
{
    char path[2200];
    snprintf(path, sizeof path, "%s/%s", r->dir, rel);
    for (char *s = strrchr(path, '/'); s && (size_t)(s - path) > strlen(r->dir); s = strrchr(path, '/')) {
        *s = '\0';
        if (rmdir(path) != 0) {
            break;
        }
    }
}

/* Download one object to <dir>/<rel>.part, check it, rename it into place. */
static sp_status_t
fetch(sp_s3repo_t *r, const s3obj_t *o, char *err, size_t err_len)
{
    char path[2200], part[2300];
    snprintf(path, sizeof path, "%s/%s", r->dir, o->rel);
    snprintf(part, sizeof part, "%s.part", path);
    char *slash = strrchr(path, '/');
    *slash = '\0';
    sp_status_t st = mkdirs(path, err, err_len);
    *slash = '/';
    if (st != SP_OK) {
        return st;
    }
    FILE *f = fopen(part, "wb");
    if (f == NULL) {
        return sp_errf(err, err_len, SP_ERR_IO, "cannot write %s: %s", part, strerror(errno));
    }
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    EVP_DigestInit_ex(md, EVP_md5(), NULL);
    sp_jbuf_t ebody;
    sp_jbuf_init(&ebody);
    char key[KEY_MAX + 8];
    snprintf(key, sizeof key, "%s%s", r->prefix, o->rel);
    sink_t sink = {&ebody, f, md, (size_t)o->size + 1, 0, false};
    long code = s3_get(r, key, "", &sink, err, err_len);
    bool write_ok = fclose(f) == 0;
    unsigned char dg[EVP_MAX_MD_SIZE];
    unsigned int dl = 0;
    EVP_DigestFinal_ex(md, dg, &dl);
    EVP_MD_CTX_free(md);
    char md5[33];
    hex(dg, 16, md5);
    if (code < 0) {
        st = SP_ERR_IO;
    } else if (code != 200) {
        /* an error body went to the file: read its message from there */
        sp_jbuf_t eb;
        sp_jbuf_init(&eb);
        FILE *g = fopen(part, "rb");
        char tmp[4096];
        size_t k;
        while (g && (k = fread(tmp, 1, sizeof tmp, g)) > 0 && eb.len < ERROR_BYTES_MAX) {
            sp_jbuf_raw(&eb, tmp, k);
        }
        if (g) {
            fclose(g);
        }
        char why[512];
        s3_error_text(&eb, code, why, sizeof why);
        sp_jbuf_free(&eb);
        st = sp_errf(err, err_len, SP_ERR_IO, "s3://%s/%s: download refused: %s", r->bucket, key, why);
    } else if (!write_ok) {
        st = sp_errf(err, err_len, SP_ERR_IO, "cannot write %s", part);
    } else if ((int64_t)sink.got != o->size) {
        st = sp_errf(err, err_len, SP_ERR_INVALID, "s3://%s/%s: got %zu bytes, the listing says %lld",
                     r->bucket, key, sink.got, (long long)o->size);
    } else if (strchr(o->etag, '-') == NULL && strlen(o->etag) == 32 && strcasecmp(o->etag, md5) != 0) {
        /* a single-part upload's ETag is the MD5 of its bytes; a multipart one ("...-N") is
         * not, and only its size is checked */
        st = sp_errf(err, err_len, SP_ERR_INVALID,
                     "s3://%s/%s: checksum mismatch: the bytes' MD5 is %s, the ETag says %s", r->bucket,
                     key, md5, o->etag);
    } else if (rename(part, path) != 0) {
        st = sp_errf(err, err_len, SP_ERR_IO, "cannot rename %s: %s", part, strerror(errno));
    }
    sp_jbuf_free(&ebody);
    if (st != SP_OK) {
        unlink(part);
        prune_dirs(r, o->rel); /* a directory made for it alone would look like a version */
    }
    return st;
}

static sp_status_t
save_manifest(sp_s3repo_t *r, char *err, size_t err_len)
{
    json_t *objs = json_array();
    for (int i = 0; i < r->n_have; i++) {
        json_array_append_new(objs, json_pack("{s:s, s:s, s:I}", "key", r->have[i].rel, "etag",
                                              r->have[i].etag, "size", (json_int_t)r->have[i].size));
    }
    json_t *m = json_pack("{s:s, s:s, s:o}", "bucket", r->bucket, "prefix", r->prefix, "objects", objs);
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp", r->manifest);
    int rc = m ? json_dump_file(m, tmp, JSON_COMPACT) : -1;
    json_decref(m);
    if (rc != 0 || rename(tmp, r->manifest) != 0) {
        unlink(tmp);
        return sp_errf(err, err_len, SP_ERR_IO, "cannot write %s", r->manifest);
    }
    return SP_OK;
}

/* Remove <dir>/<rel> and the directories it leaves empty. */
static void
remove_local(sp_s3repo_t *r, const char *rel)
{
    char path[2200];
    snprintf(path, sizeof path, "%s/%s", r->dir, rel);
    unlink(path);
    prune_dirs(r, rel);
}

static const s3obj_t *
find_have(const sp_s3repo_t *r, const char *rel)
{
    for (int i = 0; i < r->n_have; i++) {
        if (strcmp(r->have[i].rel, rel) == 0) {
            return &r->have[i];
        }
    }
    return NULL;
}

sp_status_t
sp_s3repo_sync(sp_s3repo_t *r, int *changed, char *err, size_t err_len)
{
    int nchg = 0;
    if (changed) {
        *changed = 0;
    }
    s3obj_t *objs;
    int n;
    sp_status_t st = list_all(r, &objs, &n, err, err_len);
    if (st != SP_OK) {
        return st;
    }
    /* Keep the files whose objects are unchanged (same ETag and size, file present). */
    for (int i = 0; i < n && st == SP_OK; i++) {
        const s3obj_t *h = find_have(r, objs[i].rel);
        char path[2200];
        snprintf(path, sizeof path, "%s/%s", r->dir, objs[i].rel);
        struct stat sb;
        if (h && strcmp(h->etag, objs[i].etag) == 0 && h->size == objs[i].size && stat(path, &sb) == 0 &&
            S_ISREG(sb.st_mode) && sb.st_size == objs[i].size) {
            continue;
        }
        st = fetch(r, &objs[i], err, err_len);
        if (st == SP_OK) {
            nchg++;
            SP_LOG_INFO("event=s3_fetched bucket=%s key=%s%s bytes=%lld", sp_log_str(r->bucket),
                        sp_log_str(r->prefix), sp_log_str(objs[i].rel), (long long)objs[i].size);
        }
    }
    if (st != SP_OK) {
        /* what was fetched stays (its file is right); the manifest keeps the old ETags of
         * the rest, so the next sync tries them again */
        free_objs(objs, n);
        return st;
    }
    /* Files whose objects are gone. */
    for (int i = 0; i < r->n_have; i++) {
        s3obj_t key = {r->have[i].rel, "", 0};
        if (bsearch(&key, objs, (size_t)n, sizeof *objs, obj_cmp) == NULL) {
            remove_local(r, r->have[i].rel);
            nchg++;
            SP_LOG_INFO("event=s3_removed bucket=%s key=%s%s", sp_log_str(r->bucket), sp_log_str(r->prefix),
                        sp_log_str(r->have[i].rel));
        }
    }
    free_objs(r->have, r->n_have);
    r->have = objs;
    r->n_have = n;
    if (changed) {
        *changed = nchg;
    }
    return nchg > 0 ? save_manifest(r, err, err_len) : SP_OK;
}
