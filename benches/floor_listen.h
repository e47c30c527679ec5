/* The loopback listener every C floor in benches/ answers on, so the floors differ
 * only in what they do with a connection. */
#ifndef FLOOR_LISTEN_H
#define FLOOR_LISTEN_H

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

/* A listening socket on 127.0.0.1:port, or -1. Close-on-exec: no program a floor
 * starts inherits it. */
static int listen_on_loopback(int port, int backlog) {
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (listener < 0) return -1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons(port)};
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listener, (struct sockaddr *)&address, sizeof address) || listen(listener, backlog)) {
        close(listener);
        return -1;
    }
    return listener;
}

#endif
