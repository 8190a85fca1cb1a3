/* test_tls.c - the TLS side of the HTTP core (http/http.c, http/tls.c) from C:
 * what only a handler can see (sp_http_req_tls, sp_http_req_client_cn), the reload
 * API and the create-time errors. Certificates come from the openssl command in
 * the test's directory (skipped without it); the black-box cases are in
 * tests/py/test_tls.py. */
#include "test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "http/http.h"

static char dir[512];

static void
path(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", dir, name);
}

/* A CA, a server certificate for 127.0.0.1 and a client certificate with CN
 * "tenant-a" from the same CA. */
static void
make_certs(void)
{
    if (system("command -v openssl >/dev/null 2>&1") != 0) {
        SKIP("the openssl command is missing");
    }
    snprintf(dir, sizeof dir, "%s", sp_test_tmpdir());
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "exec >/dev/null 2>&1; cd '%s' && K='-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes' && "
             "openssl req -x509 $K -keyout ca.key -out ca.pem -days 1 -subj /CN=test-ca && "
             "openssl req $K -keyout srv.key -out srv.csr -subj /CN=localhost && "
             "printf 'subjectAltName=IP:127.0.0.1\\n' > srv.ext && "
             "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -set_serial 1 -days 1 "
             "-extfile srv.ext -out srv.pem && "
             "openssl req $K -keyout cli.key -out cli.csr -subj /O=acme/CN=tenant-a && "
             "openssl x509 -req -in cli.csr -CA ca.pem -CAkey ca.key -set_serial 2 -days 1 "
             "-out cli.pem",
             dir);
    if (system(cmd) != 0) {
        SKIP("openssl could not make the test certificates");
    }
}

/* The handler says what it sees of the connection. */
static void
echo_tls(sp_http_req_t *r, void *ud)
{
    (void)ud;
    char body[400];
    int n = snprintf(body, sizeof body, "tls=%d cn=[%s]", sp_http_req_tls(r) ? 1 : 0,
                     sp_http_req_client_cn(r));
    sp_http_respond(r, 200, "text/plain", body, (size_t)n);
}

static int
connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT(fd >= 0);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    return fd;
}

/* One GET over TLS (client certificate `cert` or none); the response, or "" when
 * the handshake or the exchange failed. */
static void
tls_get(int port, const char *cert, char *out, size_t cap)
{
    char ca[600], crt[600], key[600];
    path(ca, sizeof ca, "ca.pem");
    out[0] = '\0';
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    ASSERT(ctx != NULL);
    ASSERT(SSL_CTX_load_verify_locations(ctx, ca, NULL) == 1);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (cert) {
        snprintf(crt, sizeof crt, "%s/%s.pem", dir, cert);
        snprintf(key, sizeof key, "%s/%s.key", dir, cert);
        ASSERT(SSL_CTX_use_certificate_file(ctx, crt, SSL_FILETYPE_PEM) == 1);
        ASSERT(SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) == 1);
    }
    int fd = connect_to(port);
    SSL *ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    size_t len = 0;
    if (SSL_connect(ssl) == 1) {
        static const char req[] = "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        if (SSL_write(ssl, req, (int)sizeof req - 1) > 0) {
            int n;
            while (len + 1 < cap && (n = SSL_read(ssl, out + len, (int)(cap - 1 - len))) > 0) {
                len += (size_t)n;
            }
        }
    }
    out[len] = '\0';
    SSL_free(ssl);
    close(fd);
    SSL_CTX_free(ctx);
    ERR_clear_error();
}

static sp_http_server_t *
start(const char *client_ca, char *err, size_t err_len, sp_status_t *st)
{
    static char cert[600], key[600], ca[600];
    path(cert, sizeof cert, "srv.pem");
    path(key, sizeof key, "srv.key");
    path(ca, sizeof ca, client_ca ? client_ca : "");
    sp_http_server_params_t p = sp_http_default_server_params();
    p.handler = echo_tls;
    p.tls_cert = cert;
    p.tls_key = key;
    p.tls_client_ca = client_ca ? ca : NULL;
    sp_http_server_t *s = NULL;
    *st = sp_http_server_create(&p, "127.0.0.1", 0, &s, err, err_len);
    if (*st == SP_OK) {
        ASSERT_OK(sp_http_server_start(s, err, err_len));
    }
    return s;
}

TEST(tls_request_sees_tls_and_client_cn)
{
    make_certs();
    char err[512], resp[4096];
    sp_status_t st;
    sp_http_server_t *s = start("ca.pem", err, sizeof err, &st);
    ASSERT_OK(st);
    int port = sp_http_server_port(s);
    ASSERT_EQ(sp_http_server_tls_port(s), port);

    tls_get(port, "cli", resp, sizeof resp);
    if (strstr(resp, "tls=1 cn=[tenant-a]") == NULL) {
        SP_TEST_FAIL("response: %s", resp);
    }
    /* Mutual TLS: without a certificate there is no answer at all. */
    tls_get(port, NULL, resp, sizeof resp);
    ASSERT(strstr(resp, "HTTP/1.1 200") == NULL);

    /* A reload from files that went bad keeps the old context and says why. */
    ASSERT_OK(sp_http_server_reload_tls(s, err, sizeof err));
    char cert[600], saved[600];
    path(cert, sizeof cert, "srv.pem");
    path(saved, sizeof saved, "srv.pem.saved");
    ASSERT(rename(cert, saved) == 0);
    ASSERT_EQ(sp_http_server_reload_tls(s, err, sizeof err), SP_ERR_INVALID);
    ASSERT(strstr(err, "srv.pem") != NULL && strstr(err, "cannot open") != NULL);
    tls_get(port, "cli", resp, sizeof resp);
    ASSERT(strstr(resp, "tls=1 cn=[tenant-a]") != NULL);
    ASSERT(rename(saved, cert) == 0);
    sp_http_server_destroy(s);
}

TEST(tls_without_client_ca_has_no_cn)
{
    make_certs();
    char err[512], resp[4096];
    sp_status_t st;
    sp_http_server_t *s = start(NULL, err, sizeof err, &st);
    ASSERT_OK(st);
    /* A certificate the server did not ask for is never sent, so no CN. */
    tls_get(sp_http_server_port(s), "cli", resp, sizeof resp);
    if (strstr(resp, "tls=1 cn=[]") == NULL) {
        SP_TEST_FAIL("response: %s", resp);
    }
    sp_http_server_destroy(s);
}

TEST(tls_plain_server_and_bad_settings)
{
    make_certs();
    char err[512];
    /* Plain server: no TLS port, reload refused. */
    sp_http_server_params_t p = sp_http_default_server_params();
    p.handler = echo_tls;
    sp_http_server_t *s = NULL;
    ASSERT_OK(sp_http_server_create(&p, "127.0.0.1", 0, &s, err, sizeof err));
    ASSERT_EQ(sp_http_server_tls_port(s), 0);
    ASSERT_EQ(sp_http_server_reload_tls(s, err, sizeof err), SP_ERR_INVALID);
    sp_http_server_destroy(s);

    /* A key without a certificate, and a key that is not the certificate's. */
    char key[600], cert[600], other[600];
    path(key, sizeof key, "srv.key");
    path(cert, sizeof cert, "srv.pem");
    path(other, sizeof other, "cli.key");
    p.tls_key = key;
    s = NULL;
    ASSERT_EQ(sp_http_server_create(&p, "127.0.0.1", 0, &s, err, sizeof err), SP_ERR_INVALID);
    ASSERT(s == NULL);
    p.tls_cert = cert;
    p.tls_key = other;
    ASSERT_EQ(sp_http_server_create(&p, "127.0.0.1", 0, &s, err, sizeof err), SP_ERR_INVALID);
    ASSERT(s == NULL && strstr(err, "cli.key") != NULL && strstr(err, "does not match") != NULL);
    ASSERT_EQ(sp_http_tls_check(cert, other, NULL, err, sizeof err), SP_ERR_INVALID);
    ASSERT_OK(sp_http_tls_check(cert, key, NULL, err, sizeof err));
}
