/* The relay floor of the `pty keystroke` rows in scripts/bench: the least a
 * WebSocket-to-PTY server can do for a keystroke. One process per connection (as
 * websocketd), the program on a PTY of its own, a poll loop that unmasks each client
 * frame into the PTY master and sends what the master gives as one binary frame: no
 * JSON, no buffering, no threads. It crosses the same CPUs as the servers it is set
 * beside (client on CPU 1, relay and program on CPU 0), so its round trip is what the
 * path costs before any server's own work.
 * Usage: pty_relay_floor PORT PROGRAM (PROGRAM runs under sh -c). */
#define _GNU_SOURCE /* strcasestr */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "floor_listen.h"

/* SHA-1 (FIPS 180-1), for the handshake's Sec-WebSocket-Accept. */
static void sha1(const unsigned char *data, size_t len, unsigned char out[20]) {
    uint32_t h[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0};
    size_t total = ((len + 8) / 64 + 1) * 64;
    unsigned char *msg = calloc(total, 1);
    memcpy(msg, data, len);
    msg[len] = 0x80;
    uint64_t bits = (uint64_t)len * 8;
    for (int i = 0; i < 8; i++) msg[total - 1 - i] = (unsigned char)(bits >> (8 * i));
    for (size_t chunk = 0; chunk < total; chunk += 64) {
        uint32_t w[80];
        for (int i = 0; i < 16; i++)
            w[i] = (uint32_t)msg[chunk + 4 * i] << 24 | (uint32_t)msg[chunk + 4 * i + 1] << 16 |
                   (uint32_t)msg[chunk + 4 * i + 2] << 8 | msg[chunk + 4 * i + 3];
        for (int i = 16; i < 80; i++) {
            uint32_t x = w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16];
            w[i] = x << 1 | x >> 31;
        }
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
        for (int i = 0; i < 80; i++) {
            uint32_t f, k;
            if (i < 20) f = (b & c) | (~b & d), k = 0x5A827999;
            else if (i < 40) f = b ^ c ^ d, k = 0x6ED9EBA1;
            else if (i < 60) f = (b & c) | (b & d) | (c & d), k = 0x8F1BBCDC;
            else f = b ^ c ^ d, k = 0xCA62C1D6;
            uint32_t t = (a << 5 | a >> 27) + f + e + k + w[i];
            e = d, d = c, c = b << 30 | b >> 2, b = a, a = t;
        }
        h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e;
    }
    free(msg);
    for (int i = 0; i < 20; i++) out[i] = (unsigned char)(h[i / 4] >> (24 - 8 * (i % 4)));
}

static void base64(const unsigned char *in, size_t len, char *out) {
    static const char table[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < len ? (uint32_t)in[i + 1] << 8 : 0) |
                     (i + 2 < len ? in[i + 2] : 0);
        out[o++] = table[v >> 18 & 63];
        out[o++] = table[v >> 12 & 63];
        out[o++] = i + 1 < len ? table[v >> 6 & 63] : '=';
        out[o++] = i + 2 < len ? table[v & 63] : '=';
    }
    out[o] = 0;
}

static int write_all(int fd, const unsigned char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) return -1;
        p += w, n -= (size_t)w;
    }
    return 0;
}

static int handshake(int client) {
    char request[4096];
    size_t have = 0;
    while (have < sizeof request - 1) {
        ssize_t r = read(client, request + have, sizeof request - 1 - have);
        if (r <= 0) return -1;
        have += (size_t)r;
        request[have] = 0;
        if (strstr(request, "\r\n\r\n")) break;
    }
    char *key = strcasestr(request, "Sec-WebSocket-Key:");
    if (!key) return -1;
    key += strlen("Sec-WebSocket-Key:");
    while (*key == ' ') key++;
    size_t key_len = strcspn(key, "\r\n");
    unsigned char joined[128], digest[20];
    if (key_len > 64) return -1;
    memcpy(joined, key, key_len);
    memcpy(joined + key_len, "258EAFA5-E914-47DA-95CA-C5AB0DC85B11", 36);
    sha1(joined, key_len + 36, digest);
    char accept[32], answer[256];
    base64(digest, 20, accept);
    int n = snprintf(answer, sizeof answer,
                     "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     "Sec-WebSocket-Accept: %s\r\n\r\n", accept);
    return write_all(client, (unsigned char *)answer, (size_t)n);
}

/* Relays until either side closes. Client frames are small here (one keystroke each);
 * a frame split across reads is kept until it is whole. */
static void relay(int client, int master) {
    unsigned char in[65536], out[65536 + 10];
    size_t have = 0;
    struct pollfd fds[2] = {{client, POLLIN, 0}, {master, POLLIN, 0}};
    for (;;) {
        if (poll(fds, 2, -1) < 0) return;
        if (fds[0].revents) {
            ssize_t r = read(client, in + have, sizeof in - have);
            if (r <= 0) return;
            have += (size_t)r;
            size_t at = 0;
            while (have - at >= 6) {
                unsigned char *f = in + at;
                size_t len = f[1] & 0x7F, head = 2;
                if (len == 126) {
                    if (have - at < 8) break;
                    len = (size_t)f[2] << 8 | f[3], head = 4;
                } else if (len == 127) {
                    return; /* no keystroke is that long */
                }
                if (have - at < head + 4 + len) break;
                unsigned char *mask = f + head, *payload = f + head + 4;
                for (size_t i = 0; i < len; i++) payload[i] ^= mask[i % 4];
                if ((f[0] & 0x0F) == 8) return; /* close */
                if (write_all(master, payload, len)) return;
                at += head + 4 + len;
            }
            memmove(in, in + at, have - at);
            have -= at;
        }
        if (fds[1].revents) {
            ssize_t r = read(master, out + 10, 65536);
            if (r <= 0) return;
            size_t n = (size_t)r, head;
            unsigned char *f;
            if (n < 126) {
                f = out + 8, head = 2, f[1] = (unsigned char)n;
            } else {
                f = out + 6, head = 4, f[1] = 126, f[2] = (unsigned char)(n >> 8), f[3] = (unsigned char)n;
            }
            f[0] = 0x82;
            if (write_all(client, f, head + n)) return;
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    signal(SIGCHLD, SIG_IGN);
    int listener = listen_on_loopback(atoi(argv[1]), 128), one = 1;
    if (listener < 0) return 1;
    for (;;) {
        int client = accept(listener, 0, 0);
        if (client < 0) continue;
        if (fork() == 0) {
            close(listener);
            setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            if (handshake(client)) _exit(1);
            int master;
            pid_t child = forkpty(&master, 0, 0, 0);
            if (child == 0) {
                execl("/bin/sh", "sh", "-c", argv[2], (char *)0);
                _exit(127);
            }
            if (child < 0) _exit(1);
            relay(client, master);
            kill(child, SIGKILL);
            _exit(0);
        }
        close(client);
    }
}
