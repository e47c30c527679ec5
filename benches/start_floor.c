/* The floor of the `cold start` row in scripts/bench: the least a server can do before
 * its first answer (bind, listen, accept, answer 200), started and polled exactly as
 * agent-sandbox is, so the row says what our own start costs beyond exec and the
 * harness. Usage: start_floor PORT */
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "floor_listen.h"

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    int listener = listen_on_loopback(atoi(argv[1]), 128);
    if (listener < 0) return 1;
    static const char answer[] = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    for (;;) {
        int client = accept(listener, 0, 0);
        if (client < 0) continue;
        char request[1024];
        if (read(client, request, sizeof request) > 0) write(client, answer, sizeof answer - 1);
        close(client);
    }
}
