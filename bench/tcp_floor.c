/*
 * tcp_floor.c - the floor under any HTTP server on this machine: one thread,
 * epoll, one read() and one write() per request, and no work at all between
 * them (the answer is a fixed KServe v2 body of the same size as the fraud
 * model's). bench/fraud.sh drives it with the same load generator as the real
 * servers, so its requests per second (on one pinned CPU) bound what any front
 * end here can reach, and its CPU per request is what the kernel's loopback
 * TCP, epoll and the syscalls themselves cost.
 *
 *   tcp_floor --port P [--host 127.0.0.1]
 *
 * Requests are framed by their Content-Length (the load generator's are
 * small and never chunked); anything else closes the connection. Not a
 * server: a measuring stick.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_EVENTS 256
#define BUF_CAP 16384

typedef struct conn {
    int fd;
    size_t len;
    char buf[BUF_CAP];
} conn_t;

/* The shape of the fraud model's JSON answer (one FP32 output), so the bytes
 * on the wire match the real server's. */
static const char BODY[] =
    "{\"model_name\":\"fraud\",\"model_version\":\"1\",\"id\":\"\",\"parameters\":"
    "{\"queue_time_us\":5,\"compute_time_us\":20},\"outputs\":[{\"name\":\"output__0\","
    "\"datatype\":\"FP32\",\"shape\":[1],\"data\":[0.000123456]}]}";

static char answer[512];
static size_t answer_len;

/* Bytes of the first complete request in c->buf, 0 when incomplete, -1 bad. */
static long
request_len(const conn_t *c)
{
    const char *eoh = memmem(c->buf, c->len, "\r\n\r\n", 4);
    if (eoh == NULL) {
        return c->len == BUF_CAP ? -1 : 0;
    }
    size_t hlen = (size_t)(eoh - c->buf) + 4;
    long clen = 0;
    for (const char *l = memchr(c->buf, '\n', hlen); l && l < eoh;
         l = memchr(l, '\n', (size_t)(eoh - l))) {
        l++;
        if (strncasecmp(l, "content-length:", 15) == 0) {
            clen = strtol(l + 15, NULL, 10);
        }
    }
    if (clen < 0 || hlen + (size_t)clen > BUF_CAP) {
        return -1;
    }
    return c->len >= hlen + (size_t)clen ? (long)(hlen + (size_t)clen) : 0;
}

static void
drop(int ep, conn_t *c)
{
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    free(c);
}

static void
on_readable(int ep, conn_t *c)
{
    ssize_t n = read(c->fd, c->buf + c->len, BUF_CAP - c->len);
    if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            return;
        }
        drop(ep, c);
        return;
    }
    c->len += (size_t)n;
    for (;;) {
        long r = request_len(c);
        if (r < 0) {
            drop(ep, c);
            return;
        }
        if (r == 0) {
            return;
        }
        /* Loopback with small answers: the socket buffer always has room. */
        if (write(c->fd, answer, answer_len) != (ssize_t)answer_len) {
            drop(ep, c);
            return;
        }
        memmove(c->buf, c->buf + r, c->len - (size_t)r);
        c->len -= (size_t)r;
    }
}

int
main(int argc, char **argv)
{
    const char *host = "127.0.0.1";
    int port = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--port") == 0 && i + 1 < argc) {
            port = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--host") == 0 && i + 1 < argc) {
            host = argv[++i];
        } else {
            fprintf(stderr, "usage: tcp_floor --port P [--host 127.0.0.1]\n");
            return 2;
        }
    }
    if (port <= 0 || port > 65535) {
        fprintf(stderr, "tcp_floor: --port is required\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    answer_len = (size_t)snprintf(answer, sizeof answer,
                                  "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                  "Content-Length: %zu\r\n\r\n%s",
                                  sizeof BODY - 1, BODY);
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1 ||
        bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 4096) != 0) {
        perror("tcp_floor: bind/listen");
        return 1;
    }
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    struct epoll_event evs[MAX_EVENTS];
    for (;;) {
        int n = epoll_wait(ep, evs, MAX_EVENTS, -1);
        if (n < 0 && errno != EINTR) {
            perror("tcp_floor: epoll_wait");
            return 1;
        }
        for (int i = 0; i < n; i++) {
            if (evs[i].data.ptr == NULL) {
                int fd;
                while ((fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    conn_t *c = calloc(1, sizeof *c);
                    if (c == NULL) {
                        close(fd);
                        continue;
                    }
                    c->fd = fd;
                    struct epoll_event ce = {.events = EPOLLIN, .data.ptr = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ce);
                }
                continue;
            }
            on_readable(ep, evs[i].data.ptr);
        }
    }
}
