/*
 * tls.c - OpenSSL 3 server contexts, handshake errors and client names for
 * the HTTP core (the choices are explained in docs/security.md, "Transport").
 *
 * Everything OpenSSL-specific lives here so that http.c keeps one code path
 * for plain and TLS connections: it wraps accepted sockets with libevent's
 * bufferevent_openssl and asks this file for the context and the texts.
 */
#include "http/tls.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "sampan/log.h"

/* TLS 1.2 suites: ECDHE key exchange (forward secrecy) with an AEAD cipher,
 * the TLS 1.2 part of Mozilla's "intermediate" profile. TLS 1.3 keeps
 * OpenSSL's defaults, which are all of that kind already. */
static const char TLS12_CIPHERS[] =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";

/* The first error OpenSSL queued is the specific one ("no start line");
 * later ones only say which layer passed it on ("PEM lib"). */
static const char *
ossl_reason(void)
{
    unsigned long e = ERR_peek_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    return r ? r : "unknown OpenSSL error";
}

/* A key with a passphrase would make OpenSSL prompt on the terminal and
 * block start-up (or a SIGHUP reload): refuse it instead. */
static int
no_passphrase(char *buf, int size, int rwflag, void *ud)
{
    (void)buf;
    (void)size;
    (void)rwflag;
    (void)ud;
    return 0;
}

/* Choose HTTP/1.1 when the client offers it; otherwise go on without ALPN
 * (a client offering only h2 then decides whether HTTP/1.1 will do). */
static int
alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen, const unsigned char *in,
            unsigned int inlen, void *arg)
{
    (void)ssl;
    (void)arg;
    static const unsigned char h11[] = "\x08http/1.1";
    unsigned char *sel = NULL;
    if (SSL_select_next_proto(&sel, outlen, h11, sizeof h11 - 1, in, inlen) ==
        OPENSSL_NPN_NEGOTIATED) {
        *out = sel;
        return SSL_TLSEXT_ERR_OK;
    }
    return SSL_TLSEXT_ERR_NOACK;
}

/* Say "cannot open: No such file" rather than OpenSSL's BIO error chain. */
static bool
readable(const char *flag, const char *path, char *err, size_t err_len)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        sp_errf(err, err_len, SP_ERR_INVALID, "%s %s: cannot open: %s", flag, path,
                strerror(errno));
        return false;
    }
    fclose(f);
    return true;
}

static bool
key_mismatch(unsigned long e)
{
    return ERR_GET_LIB(e) == ERR_LIB_X509 &&
           (ERR_GET_REASON(e) == X509_R_KEY_VALUES_MISMATCH ||
            ERR_GET_REASON(e) == X509_R_KEY_TYPE_MISMATCH);
}

sp_status_t
sp_tls_ctx_create(const char *cert, const char *key, const char *client_ca,
                  struct ssl_ctx_st **out, char *err, size_t err_len)
{
    *out = NULL;
    sp_status_t st = SP_ERR_INVALID;
    if (cert == NULL || cert[0] == '\0' || key == NULL || key[0] == '\0') {
        return sp_errf(err, err_len, SP_ERR_INVALID,
                       "TLS needs both --tls-cert and --tls-key");
    }
    if (!readable("--tls-cert", cert, err, err_len) || !readable("--tls-key", key, err, err_len) ||
        (client_ca && client_ca[0] && !readable("--tls-client-ca", client_ca, err, err_len))) {
        return SP_ERR_INVALID;
    }
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == NULL) {
        return sp_errf(err, err_len, SP_ERR_NOMEM, "TLS: cannot create a context: %s",
                       ossl_reason());
    }
    SSL_CTX_set_default_passwd_cb(ctx, no_passphrase);
    /* OpenSSL 3 already builds without compression and refuses client
     * renegotiation; the options make both independent of the build.
     * IGNORE_UNEXPECTED_EOF: a client that closes without close_notify is
     * an EOF (as with OpenSSL 1.1), not a protocol error; request bodies
     * are framed by HTTP, so no truncation goes unnoticed. */
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION |
                                 SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_IGNORE_UNEXPECTED_EOF);
    /* Idle keep-alive connections then hold no 34 KiB read/write buffers. */
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1 ||
        SSL_CTX_set_cipher_list(ctx, TLS12_CIPHERS) != 1) {
        sp_errf(err, err_len, SP_ERR_INVALID, "TLS: cannot set the protocol versions: %s",
                ossl_reason());
        goto fail;
    }
    /* Sessions resumed with a client certificate need an id context. */
    static const unsigned char sid[] = "sampan";
    SSL_CTX_set_session_id_context(ctx, sid, sizeof sid - 1);
    SSL_CTX_set_alpn_select_cb(ctx, alpn_select, NULL);

    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        sp_errf(err, err_len, SP_ERR_INVALID, "--tls-cert %s: no usable PEM certificate (%s)", cert,
                ossl_reason());
        goto fail;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
        if (key_mismatch(ERR_peek_error())) {
            sp_errf(err, err_len, SP_ERR_INVALID,
                    "--tls-key %s does not match the certificate in --tls-cert %s", key, cert);
        } else {
            sp_errf(err, err_len, SP_ERR_INVALID,
                    "--tls-key %s: no usable PEM private key (%s; keys with a passphrase are "
                    "not supported)", key, ossl_reason());
        }
        goto fail;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        sp_errf(err, err_len, SP_ERR_INVALID,
                "--tls-key %s does not match the certificate in --tls-cert %s", key, cert);
        goto fail;
    }
    if (client_ca && client_ca[0]) {
        STACK_OF(X509_NAME) *names = NULL;
        if (SSL_CTX_load_verify_locations(ctx, client_ca, NULL) != 1 ||
            (names = SSL_load_client_CA_file(client_ca)) == NULL) {
            sp_errf(err, err_len, SP_ERR_INVALID,
                    "--tls-client-ca %s: no usable PEM CA certificate (%s)", client_ca,
                    ossl_reason());
            goto fail;
        }
        /* The names go to clients in the CertificateRequest, so a client
         * with several certificates can pick the right one. */
        SSL_CTX_set_client_CA_list(ctx, names);
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    }
    X509 *leaf = SSL_CTX_get0_certificate(ctx);
    if (leaf && X509_cmp_current_time(X509_get0_notAfter(leaf)) < 0) {
        /* Served anyway (clients decide), but an operator should know. */
        SP_LOG_WARN("event=tls_cert_expired file=%s", sp_log_str(cert));
    }
    ERR_clear_error();
    *out = ctx;
    return SP_OK;
fail:
    ERR_clear_error();
    SSL_CTX_free(ctx);
    return st;
}

void
sp_tls_ctx_free(struct ssl_ctx_st *ctx)
{
    SSL_CTX_free(ctx); /* NULL is a no-op */
}

struct ssl_st *
sp_tls_ssl_new(struct ssl_ctx_st *ctx)
{
    return SSL_new(ctx);
}

bool
sp_tls_error_known(unsigned long e)
{
    return ERR_reason_error_string(e) != NULL;
}

bool
sp_tls_error_is_http(unsigned long e)
{
    return ERR_GET_LIB(e) == ERR_LIB_SSL &&
           (ERR_GET_REASON(e) == SSL_R_HTTP_REQUEST ||
            ERR_GET_REASON(e) == SSL_R_HTTPS_PROXY_REQUEST);
}

const char *
sp_tls_error_text(unsigned long e, struct ssl_st *ssl, char *buf, size_t cap)
{
    const char *r = ERR_reason_error_string(e);
    char code[32];
    if (r == NULL) {
        snprintf(code, sizeof code, "error %08lx", e);
        r = code;
    }
    if (ssl && ERR_GET_LIB(e) == ERR_LIB_SSL &&
        ERR_GET_REASON(e) == SSL_R_CERTIFICATE_VERIFY_FAILED) {
        long v = SSL_get_verify_result(ssl);
        snprintf(buf, cap, "%s: %s", r, X509_verify_cert_error_string(v));
    } else {
        snprintf(buf, cap, "%s", r);
    }
    return buf;
}

size_t
sp_tls_peer_cn(struct ssl_st *ssl, char *out, size_t cap)
{
    out[0] = '\0';
    X509 *cert = ssl ? SSL_get1_peer_certificate(ssl) : NULL;
    if (cert == NULL) {
        return 0;
    }
    size_t n = 0;
    X509_NAME *name = X509_get_subject_name(cert);
    int i = X509_NAME_get_index_by_NID(name, NID_commonName, -1);
    if (i >= 0 && X509_NAME_get_index_by_NID(name, NID_commonName, i) < 0) {
        unsigned char *utf8 = NULL;
        int len = ASN1_STRING_to_UTF8(&utf8, X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, i)));
        bool ok = len > 0 && (size_t)len < cap;
        for (int k = 0; ok && k < len; k++) {
            ok = utf8[k] >= 0x20 && utf8[k] != 0x7f;
        }
        if (ok) {
            memcpy(out, utf8, (size_t)len);
            out[len] = '\0';
            n = (size_t)len;
        }
        OPENSSL_free(utf8);
    }
    X509_free(cert);
    return n;
}

size_t
sp_tls_read_buffered(struct ssl_st *ssl, char *buf, size_t cap)
{
    if (ssl == NULL || cap == 0 || !SSL_has_pending(ssl)) {
        return 0;
    }
    /* A record only partly received makes this try the socket once (non-
     * blocking); an error or EOF is left for libevent's next read to find. */
    int n = SSL_read(ssl, buf, cap > INT32_MAX ? INT32_MAX : (int)cap);
    if (n <= 0) {
        ERR_clear_error();
        return 0;
    }
    return (size_t)n;
}

void
sp_tls_close_notify(struct ssl_st *ssl)
{
    if (ssl) {
        (void)SSL_shutdown(ssl); /* one try: a full socket just means no alert */
    }
    ERR_clear_error();
}
