/*
 * tls.h - OpenSSL 3 for the HTTP core (http.c): the server context, the
 * text of a failed handshake, the client certificate's name.
 *
 * http.c never includes OpenSSL headers: it holds contexts and connections
 * as the opaque struct pointers below, which is also how libevent's
 * bufferevent_ssl.h declares them.
 *
 * Threads: a context is immutable once built and reference-counted by
 * OpenSSL (every SSL made from it holds a reference), so all loop threads
 * share it and a reload simply builds a new one; the old one goes when its
 * last connection does. The other functions work on one connection, on its
 * loop thread.
 */
#ifndef SP_HTTP_TLS_H
#define SP_HTTP_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include "sampan/status.h"

struct ssl_ctx_st;
struct ssl_st;

/* Build a server context from PEM files: the certificate chain (leaf first),
 * its private key (unencrypted: nobody is there to type a passphrase) and,
 * when client_ca is non-empty, the CAs whose client certificates are
 * required (mutual TLS). TLS 1.2 and 1.3 only, no compression, no
 * renegotiation, forward-secret AEAD ciphers for TLS 1.2 (OpenSSL's TLS 1.3
 * defaults), ALPN "http/1.1". The error names the flag and the file:
 * unreadable, no PEM object, or a key that does not match the certificate.
 * *out is NULL on failure. */
sp_status_t sp_tls_ctx_create(const char *cert, const char *key, const char *client_ca,
                              struct ssl_ctx_st **out, char *err, size_t err_len);
/* Drop our reference (connections still using it keep theirs). NULL: no-op. */
void sp_tls_ctx_free(struct ssl_ctx_st *ctx);
/* A new server-side connection object of ctx (NULL when out of memory). */
struct ssl_st *sp_tls_ssl_new(struct ssl_ctx_st *ctx);

/* Text for a failed handshake from the OpenSSL error code e (libevent's
 * bufferevent_get_openssl_error): the reason ("http request", "unsupported
 * protocol", "peer did not return a certificate", ...), with the
 * verification error for a rejected client certificate. Returns buf. */
const char *sp_tls_error_text(unsigned long e, struct ssl_st *ssl, char *buf, size_t cap);
/* true when OpenSSL has a reason text for e. */
bool sp_tls_error_known(unsigned long e);
/* true when e says the client spoke plain HTTP to the TLS port. */
bool sp_tls_error_is_http(unsigned long e);
/* The subject CN of the verified client certificate into out ("" when
 * there is none, more than one CN, or one with control bytes or NUL:
 * an ambiguous name is no name). Returns its length. */
size_t sp_tls_peer_cn(struct ssl_st *ssl, char *out, size_t cap);
/* Decrypted (or received, unprocessed) bytes OpenSSL holds for this
 * connection: read up to cap of them into buf without waiting. Returns the
 * count, 0 when there are none. For http.c's pipelining: libevent stops
 * reading at the input's high-water mark and, when reading resumes, waits
 * for the socket, which stays quiet if the rest of the client's bytes are
 * already inside OpenSSL. */
size_t sp_tls_read_buffered(struct ssl_st *ssl, char *buf, size_t cap);
/* Send close_notify once, without waiting for the peer's (the socket
 * closes next); clears this thread's OpenSSL error queue. */
void sp_tls_close_notify(struct ssl_st *ssl);

#endif /* SP_HTTP_TLS_H */
