/* netprobe: network checks run from inside a supervised test box. Each prints one line
 * "NAME=RESULT", RESULT being OK (with what was read, for tcp), an errno name, or TIMEOUT.
 * Built with `cc -static` by hooks/tests/support/mod.rs.
 *
 *   netprobe tcp ADDR PORT          connect (5 s bound), read the greeting line
 *   netprobe udp ADDR PORT          connected UDP: send one datagram, wait 2 s for an answer
 *   netprobe socket FAMILY TYPE PROTO   socket(2) with numeric arguments
 *   netprobe socketpair             socketpair(AF_UNIX, SOCK_STREAM)
 *   netprobe fetch ADDR PORT        connect and read to EOF; prints the byte count and the
 *                                   milliseconds from connect to EOF
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int fail(const char *name) {
    printf("%s=%s\n", name, strerrorname_np(errno));
    return 0;
}

static int dial(const char *name, int type, const char *addr, int port) {
    struct sockaddr_storage ss;
    socklen_t len;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, addr, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((unsigned short)port);
        len = sizeof *a4;
    } else if (inet_pton(AF_INET6, addr, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((unsigned short)port);
        len = sizeof *a6;
    } else {
        printf("%s=EINVAL\n", name);
        return -1;
    }
    int s = socket(ss.ss_family, type | SOCK_NONBLOCK, 0);
    if (s < 0) {
        fail(name);
        return -1;
    }
    if (connect(s, (struct sockaddr *)&ss, len) != 0) {
        if (errno != EINPROGRESS) {
            fail(name);
            return -1;
        }
        struct pollfd p = {s, POLLOUT, 0};
        if (poll(&p, 1, 5000) == 0) {
            printf("%s=TIMEOUT\n", name);
            return -1;
        }
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &el);
        if (err) {
            errno = err;
            fail(name);
            return -1;
        }
    }
    fcntl(s, F_SETFL, 0);
    return s;
}

static int wait_readable(int s, int ms) {
    struct pollfd p = {s, POLLIN, 0};
    return poll(&p, 1, ms);
}

int main(int argc, char **argv) {
    char name[128];
    if (argc == 4 && strcmp(argv[1], "tcp") == 0) {
        snprintf(name, sizeof name, "tcp %s:%s", argv[2], argv[3]);
        int s = dial(name, SOCK_STREAM, argv[2], atoi(argv[3]));
        if (s < 0) return 0;
        /* The greeting may arrive in pieces: read to its newline or EOF. */
        char buf[128] = {0};
        size_t got = 0;
        while (got < sizeof buf - 1 && !memchr(buf, '\n', got)) {
            if (wait_readable(s, 5000) <= 0) {
                printf("%s=TIMEOUT\n", name);
                return 0;
            }
            ssize_t n = read(s, buf + got, sizeof buf - 1 - got);
            if (n < 0) return fail(name);
            if (n == 0) break;
            got += (size_t)n;
        }
        buf[strcspn(buf, "\n")] = 0;
        printf("%s=OK %s\n", name, buf);
    } else if (argc == 4 && strcmp(argv[1], "udp") == 0) {
        snprintf(name, sizeof name, "udp %s:%s", argv[2], argv[3]);
        int s = dial(name, SOCK_DGRAM, argv[2], atoi(argv[3]));
        if (s < 0) return 0;
        if (send(s, "ping\n", 5, 0) < 0) return fail(name);
        if (wait_readable(s, 2000) <= 0) {
            printf("%s=TIMEOUT\n", name);
            return 0;
        }
        char buf[128] = {0};
        if (recv(s, buf, sizeof buf - 1, 0) < 0) return fail(name);
        buf[strcspn(buf, "\n")] = 0;
        printf("%s=OK %s\n", name, buf);
    } else if (argc == 5 && strcmp(argv[1], "socket") == 0) {
        snprintf(name, sizeof name, "socket %s %s %s", argv[2], argv[3], argv[4]);
        int s = socket(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
        if (s < 0) return fail(name);
        printf("%s=OK\n", name);
    } else if (argc == 2 && strcmp(argv[1], "socketpair") == 0) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return fail("socketpair");
        printf("socketpair=OK\n");
    } else if (argc == 4 && strcmp(argv[1], "fetch") == 0) {
        snprintf(name, sizeof name, "fetch %s:%s", argv[2], argv[3]);
        int s = dial(name, SOCK_STREAM, argv[2], atoi(argv[3]));
        if (s < 0) return 0;
        static char buf[1 << 16];
        unsigned long long total = 0;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            ssize_t n = read(s, buf, sizeof buf);
            if (n < 0) return fail(name);
            if (n == 0) break;
            total += (unsigned long long)n;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
        printf("%s=OK %llu %ld\n", name, total, ms);
    } else {
        fprintf(stderr, "usage: netprobe tcp|udp ADDR PORT | socket F T P | socketpair | fetch ADDR PORT\n");
        return 2;
    }
    return 0;
}
