/* The floor of the `cold start` row in scripts/bench: the least a server can do before
 * its first answer (bind, listen, accept, answer 200), started and polled exactly as
 * agent-sandbox is, so the row says what our own start costs beyond exec and the
 * harness. Usage: start_floor PORT */
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in address = {0};
    address.sin_family = AF_INET;
    address.sin_port = htons(atoi(argv[1]));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listener, (struct sockaddr *)&address, sizeof address) || listen(listener, 128)) return 1;
    static const char answer[] = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    for (;;) {
        int client = accept(listener, 0, 0);
        if (client < 0) continue;
        char request[1024];
        if (read(client, request, sizeof request) > 0) write(client, answer, sizeof answer - 1);
        close(client);
    }
}
