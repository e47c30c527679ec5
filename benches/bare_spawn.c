/* The floor for `POST /shell {"command": "true"}` in scripts/bench: the least an HTTP
 * server can do per request that runs a program. One thread, epoll, keep-alive; every
 * complete request (any method, body skipped by Content-Length) is answered after a
 * bare fork + execve("/bin/true") + waitpid, with a fixed JSON body of the same shape
 * /shell returns. No parsing beyond that, no JSON, no pipes: what is left is the spawn.
 *
 *   cc -O2 -o bare_spawn bare_spawn.c && ./bare_spawn PORT
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "floor_listen.h"

#define MAX_CONN 1024
#define BUF 65536

static char bufs[MAX_CONN][BUF];
static size_t lens[MAX_CONN];

static const char reply[] =
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 39\r\n\r\n"
    "{\"stdout\":\"\",\"stderr\":\"\",\"exit_code\":0}";

static int run_true(void) {
    pid_t pid = fork();
    if (pid == 0) {
        char *argv[] = {"true", NULL};
        char *envp[] = {"PATH=/usr/bin:/bin", NULL};
        execve("/bin/true", argv, envp);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0) return -1;
    return WEXITSTATUS(status);
}

/* Serves every complete request in the connection's buffer. */
static int serve(int fd) {
    for (;;) {
        char *buf = bufs[fd];
        char *end = memmem(buf, lens[fd], "\r\n\r\n", 4);
        if (!end) return 0;
        size_t head = (size_t)(end - buf) + 4, body = 0;
        char *cl = memmem(buf, head, "Content-Length:", 15);
        if (cl) body = strtoul(cl + 15, NULL, 10);
        if (lens[fd] < head + body) return 0;
        run_true();
        if (write(fd, reply, sizeof reply - 1) < 0) return -1;
        memmove(buf, buf + head + body, lens[fd] - head - body);
        lens[fd] -= head + body;
    }
}

int main(int argc, char **argv) {
    int port = argc > 1 ? atoi(argv[1]) : 9100;
    int listener = listen_on_loopback(port, 512), one = 1;
    if (listener < 0) {
        perror("bare_spawn: listen");
        return 1;
    }
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = listener};
    epoll_ctl(ep, EPOLL_CTL_ADD, listener, &ev);
    struct epoll_event events[64];
    for (;;) {
        int n = epoll_wait(ep, events, 64, -1);
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == listener) {
                int c = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
                if (c < 0 || c >= MAX_CONN) {
                    if (c >= 0) close(c);
                    continue;
                }
                setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                lens[c] = 0;
                struct epoll_event cev = {.events = EPOLLIN, .data.fd = c};
                epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
                continue;
            }
            ssize_t got = read(fd, bufs[fd] + lens[fd], BUF - lens[fd]);
            if (got <= 0 || (lens[fd] += (size_t)got, serve(fd) < 0) || lens[fd] == BUF) {
                epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
                close(fd);
            }
        }
    }
}
