/* probe: run from inside a test container; each check prints "name=OK" or "name=<ERRNO>".
 * Built with `cc -static` by tests/support/mod.rs. Arguments are chosen so that, without a
 * seccomp filter, the result differs from EPERM wherever the kernel allows it (the test
 * containers hold CAP_SYS_ADMIN, CAP_NET_RAW and CAP_SYS_PTRACE for that reason).
 *
 *   probe syscalls        every h5i-v1 check
 *   probe write PATH      open(PATH, O_WRONLY|O_CREAT|O_TRUNC)
 *   probe read PATH       open(PATH, O_RDONLY)
 *   probe bind PORT       bind a TCP socket to 0.0.0.0:PORT
 *   probe unix            socket(AF_UNIX) and socketpair(AF_UNIX)
 *   probe inet            socket(AF_INET, SOCK_STREAM)
 *   probe gate            every family the socket gate rules on, then whether this process
 *                         holds a seccomp listener descriptor (notify_fd=FOUND|NONE)
 *   probe wait            block in pause() until a signal ends it (an image with no shell)
 *   probe setid DIR       every way to make a set-id file in DIR, each by its raw syscall
 *                         (umask 0, so only a filter can strip the bits), then openat2, then
 *                         the plain modes that must keep working
 *   probe families        socket(N, type, 0) for every family number 0..63 and the four
 *                         common types: "family_N=<stream>,<dgram>,<seqpacket>,<raw>"
 *   probe forkloop MAX    fork children that wait, until fork fails or MAX; prints
 *                         forked=N and fork=<ERRNO|OK>, then kills and reaps them
 *   probe unlisted        calls the h5i-v2 base leaves out, each one that an unfiltered kernel
 *                         answers with something other than ENOSYS (kcmp and name_to_handle_at
 *                         succeed or EOVERFLOW for anyone; syslog and modify_ldt read state)
 *   probe stdio OUT       what fds 0, 1 and 2 are (type, device, access mode, tty) and what a
 *                         one-byte write to each (and a non-blocking read of 0) gets, written
 *                         to OUT only after every descriptor was examined (OUT's own open
 *                         must not fill a closed standard descriptor first)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <poll.h>
#include <sys/personality.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <dirent.h>
#include <linux/netlink.h>
#include <linux/vm_sockets.h>
#include <linux/openat2.h>
#include <sys/stat.h>

static void report(const char *name, long rc) {
    if (rc >= 0)
        printf("%s=OK\n", name);
    else
        printf("%s=%s\n", name, strerrorname_np(errno));
    fflush(stdout);
}

static long raw_clone(unsigned long flags) {
    long pid = syscall(SYS_clone, flags | SIGCHLD, 0, 0, 0, 0);
    if (pid == 0) _exit(0);
    if (pid > 0) waitpid((pid_t)pid, NULL, 0);
    return pid;
}

static void syscalls(void) {
    char buf[8] = {0}, dst[8];
    struct iovec local = {dst, sizeof dst}, remote = {buf, sizeof buf};

    /* ptrace on a process we do not trace: ESRCH when allowed, EPERM when filtered. */
    report("ptrace", ptrace(PTRACE_CONT, getpid(), 0, 0));
    report("process_vm_readv", process_vm_readv(getpid(), &local, 1, &remote, 1, 0));
    report("process_vm_writev", process_vm_writev(getpid(), &remote, 1, &local, 1, 0));
    /* unshare(0) is a no-op that succeeds when allowed. */
    report("unshare", syscall(SYS_unshare, 0));
    report("setns", syscall(SYS_setns, -1, 0));
    report("clone_newuser", raw_clone(CLONE_NEWUSER));
    report("clone_newns", raw_clone(CLONE_NEWNS));
    report("clone_newnet", raw_clone(CLONE_NEWNET));
    /* A 64-bit flags value with high garbage: the kernel uses the low 32 bits. */
    report("clone_newpid_highbits", raw_clone(CLONE_NEWPID | (0xabcdUL << 32)));
    report("clone_plain", raw_clone(0));
    {
        struct clone_args args;
        memset(&args, 0, sizeof args);
        args.exit_signal = SIGCHLD;
        long pid = syscall(SYS_clone3, &args, sizeof args);
        if (pid == 0) _exit(0);
        if (pid > 0) waitpid((pid_t)pid, NULL, 0);
        report("clone3", pid);
    }
    report("mount", mount("none", "/mnt", "tmpfs", 0, NULL));
    report("umount2", umount2("/mnt", MNT_DETACH));
    report("pivot_root", syscall(SYS_pivot_root, "/nonexistent", "/nonexistent"));
    report("open_tree", syscall(SYS_open_tree, AT_FDCWD, "/", 0));
    report("fsopen", syscall(SYS_fsopen, "tmpfs", 0));
    report("fspick", syscall(SYS_fspick, AT_FDCWD, "/", 0));
    report("mount_setattr", syscall(SYS_mount_setattr, -1, "", 0, NULL, 0));
    report("keyctl", syscall(SYS_keyctl, 0 /* KEYCTL_GET_KEYRING_ID */, -2, 0));
    report("add_key", syscall(SYS_add_key, "user", "h5i", "v", 1, -2));
    report("request_key", syscall(SYS_request_key, "user", "h5i-none", NULL, 0));
    report("bpf", syscall(SYS_bpf, 0, NULL, 0));
    report("perf_event_open", syscall(SYS_perf_event_open, NULL, 0, -1, -1, 0));
    report("userfaultfd", syscall(SYS_userfaultfd, 0));
    report("io_uring_setup", syscall(SYS_io_uring_setup, 1, NULL));
    report("kexec_load", syscall(SYS_kexec_load, 0, 0, NULL, 0));
    report("init_module", syscall(SYS_init_module, NULL, 0, ""));
    report("delete_module", syscall(SYS_delete_module, "h5i_none", 0));
    report("personality_query", syscall(SYS_personality, 0xffffffffUL));
    report("personality_linux", syscall(SYS_personality, 0UL));
    report("personality_addr_no_randomize", syscall(SYS_personality, 0x0040000UL));
    {
        char c = 'x';
        report("ioctl_tiocsti", syscall(SYS_ioctl, 0, (unsigned long)TIOCSTI, &c));
        report("ioctl_tiocsti_highbits", syscall(SYS_ioctl, 0, (unsigned long)TIOCSTI | (1UL << 32), &c));
        report("ioctl_tioclinux", syscall(SYS_ioctl, 0, (unsigned long)TIOCLINUX, &c));
        report("ioctl_fionread", syscall(SYS_ioctl, 0, (unsigned long)FIONREAD, &c));
    }
    report("socket_packet", socket(AF_PACKET, SOCK_RAW, 0));
    report("socket_inet_raw", socket(AF_INET, SOCK_RAW, IPPROTO_ICMP));
    report("socket_inet6_raw_cloexec", socket(AF_INET6, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_ICMPV6));
    report("socket_inet_stream", socket(AF_INET, SOCK_STREAM, 0));
}

static void gate(void) {
    int sv[2];
    report("inet_stream", socket(AF_INET, SOCK_STREAM, 0));
    report("inet_dgram", socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, IPPROTO_UDP));
    report("inet6_stream", socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK, IPPROTO_TCP));
    report("inet6_dgram", socket(AF_INET6, SOCK_DGRAM, 0));
    report("inet_raw", socket(AF_INET, SOCK_RAW, IPPROTO_ICMP));
    report("inet6_raw", socket(AF_INET6, SOCK_RAW, IPPROTO_ICMPV6));
    report("inet_icmp_dgram", socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP));
    report("packet", socket(AF_PACKET, SOCK_RAW, 0));
    report("netlink", socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE));
    report("vsock", socket(AF_VSOCK, SOCK_STREAM, 0));
    report("family_45", socket(45, SOCK_STREAM, 0));
    report("unix", socket(AF_UNIX, SOCK_STREAM, 0));
    report("socketpair_unix", socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    report("socketpair_inet", socketpair(AF_INET, SOCK_STREAM, 0, sv));

    /* A seccomp listener inside the box could answer its own notifications. */
    int found = 0;
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        char link[64], target[256];
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n > 0) {
            target[n] = 0;
            if (strstr(target, "seccomp notify")) found = 1;
        }
    }
    if (d) closedir(d);
    printf("notify_fd=%s\n", d ? (found ? "FOUND" : "NONE") : "UNKNOWN");
}

#ifndef SYS_fchmodat2
#define SYS_fchmodat2 452
#endif

static void fresh(char *out, size_t len, const char *dir, const char *name) {
    snprintf(out, len, "%s/%s", dir, name);
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) close(fd);
}

static void setid(const char *dir) {
    char p[4096];
    umask(0);
    fresh(p, sizeof p, dir, "chmod6755");
    report("chmod_6755", syscall(SYS_chmod, p, 06755));
    fresh(p, sizeof p, dir, "chmod4755");
    report("chmod_u+s", syscall(SYS_chmod, p, 04755));
    fresh(p, sizeof p, dir, "chmod2755");
    report("chmod_g+s", syscall(SYS_chmod, p, 02755));
    fresh(p, sizeof p, dir, "chmod_highbits");
    report("chmod_highbits", syscall(SYS_chmod, p, 04755UL | (1UL << 32)));
    fresh(p, sizeof p, dir, "fchmod");
    {
        int fd = open(p, O_RDONLY);
        report("fchmod_4755", syscall(SYS_fchmod, fd, 04755));
        if (fd >= 0) close(fd);
    }
    fresh(p, sizeof p, dir, "fchmodat");
    report("fchmodat_2755", syscall(SYS_fchmodat, AT_FDCWD, p, 02755));
    fresh(p, sizeof p, dir, "fchmodat2");
    report("fchmodat2_6755", syscall(SYS_fchmodat2, AT_FDCWD, p, 06755, 0));
    snprintf(p, sizeof p, "%s/open", dir);
    report("open_creat_4755", syscall(SYS_open, p, O_CREAT | O_WRONLY, 04755));
    snprintf(p, sizeof p, "%s/openat", dir);
    report("openat_creat_2755", syscall(SYS_openat, AT_FDCWD, p, O_CREAT | O_WRONLY, 02755));
    snprintf(p, sizeof p, "%s/creat", dir);
    report("creat_6755", syscall(SYS_creat, p, 06755));
    report("openat_tmpfile_4755", syscall(SYS_openat, AT_FDCWD, dir, O_TMPFILE | O_WRONLY, 04755));
    snprintf(p, sizeof p, "%s/mkdir", dir);
    report("mkdir_2755", syscall(SYS_mkdir, p, 02755));
    snprintf(p, sizeof p, "%s/mkdirat", dir);
    report("mkdirat_6755", syscall(SYS_mkdirat, AT_FDCWD, p, 06755));
    snprintf(p, sizeof p, "%s/mknod", dir);
    report("mknod_4755", syscall(SYS_mknod, p, S_IFREG | 04755, 0));
    snprintf(p, sizeof p, "%s/mknodat", dir);
    report("mknodat_2755", syscall(SYS_mknodat, AT_FDCWD, p, S_IFREG | 02755, 0));
    {
        struct open_how how;
        memset(&how, 0, sizeof how);
        how.flags = O_CREAT | O_WRONLY;
        how.mode = 04755;
        snprintf(p, sizeof p, "%s/openat2", dir);
        report("openat2", syscall(SYS_openat2, AT_FDCWD, p, &how, sizeof how));
    }
    fresh(p, sizeof p, dir, "plain");
    report("chmod_755", syscall(SYS_chmod, p, 0755));
    report("chmod_1777", syscall(SYS_chmod, p, 01777));
    snprintf(p, sizeof p, "%s/plain-open", dir);
    report("open_creat_644", syscall(SYS_openat, AT_FDCWD, p, O_CREAT | O_WRONLY, 0644));
    snprintf(p, sizeof p, "%s/plain-dir", dir);
    report("mkdir_755", syscall(SYS_mkdir, p, 0755));
}

static void families(void) {
    static const int types[4] = {SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET, SOCK_RAW};
    for (int n = 0; n < 64; n++) {
        printf("family_%d=", n);
        for (int i = 0; i < 4; i++) {
            int s = socket(n, types[i], 0);
            printf("%s%s", i ? "," : "", s >= 0 ? "OK" : strerrorname_np(errno));
            if (s >= 0) close(s);
        }
        printf("\n");
    }
    fflush(stdout);
}

static void forkloop(long max) {
    static pid_t kids[65536];
    long n = 0;
    if (max > 65536) max = 65536;
    long rc = 0;
    while (n < max) {
        pid_t pid = fork();
        if (pid == 0) {
            pause();
            _exit(0);
        }
        if (pid < 0) {
            rc = -1;
            break;
        }
        kids[n++] = pid;
    }
    printf("forked=%ld\n", n);
    report("fork", rc);
    for (long i = 0; i < n; i++) kill(kids[i], SIGKILL);
    for (long i = 0; i < n; i++) waitpid(kids[i], NULL, 0);
}

static void stdio_facts(const char *out_path) {
    char buf[2048];
    size_t n = 0;
    for (int fd = 0; fd < 3; fd++) {
        struct stat st;
        const char *type = "closed";
        char dev[32] = "-";
        if (fstat(fd, &st) == 0) {
            switch (st.st_mode & S_IFMT) {
            case S_IFCHR: type = "chr"; break;
            case S_IFIFO: type = "fifo"; break;
            case S_IFREG: type = "reg"; break;
            case S_IFSOCK: type = "sock"; break;
            default: type = "other"; break;
            }
            if (S_ISCHR(st.st_mode))
                snprintf(dev, sizeof dev, "%u:%u", major(st.st_rdev), minor(st.st_rdev));
        }
        int fl = fcntl(fd, F_GETFL);
        const char *acc = fl < 0 ? strerrorname_np(errno)
                          : (fl & O_ACCMODE) == O_RDONLY ? "r"
                          : (fl & O_ACCMODE) == O_WRONLY ? "w" : "rw";
        int tty = isatty(fd);
        long w = write(fd, "x", 1);
        const char *wr = w == 1 ? "OK" : strerrorname_np(errno);
        const char *rd = "-";
        if (fd == 0) {
            struct pollfd p = { .fd = 0, .events = POLLIN };
            char c;
            if (poll(&p, 1, 0) <= 0 || !(p.revents & (POLLIN | POLLHUP)))
                rd = "not-ready";
            else {
                long r = read(0, &c, 1);
                rd = r == 1 ? "byte" : r == 0 ? "eof" : strerrorname_np(errno);
            }
        }
        n += snprintf(buf + n, sizeof buf - n, "fd%d type=%s dev=%s acc=%s tty=%d write=%s read=%s\n",
                      fd, type, dev, acc, tty, wr, rd);
    }
    int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (o < 0 || write(o, buf, n) != (long)n)
        _exit(3);
    close(o);
}

static void unlisted(void) {
    /* kcmp(self, self, KCMP_FILE, 0, 0): 0 (same file) without a filter. */
    report("kcmp", syscall(SYS_kcmp, getpid(), getpid(), 0, 0, 0));
    {
        /* A zero-sized handle: EOVERFLOW (with the size needed) without a filter. */
        struct { unsigned int bytes; int type; } h = {0, 0};
        int mount_id;
        report("name_to_handle_at", syscall(SYS_name_to_handle_at, AT_FDCWD, "/", &h, &mount_id, 0));
    }
    /* SYSLOG_ACTION_SIZE_BUFFER (10): the ring size, or EPERM under dmesg_restrict. */
    report("syslog", syscall(SYS_syslog, 10, NULL, 0));
#ifdef SYS_modify_ldt
    {
        char ldt[16];
        report("modify_ldt", syscall(SYS_modify_ldt, 0, ldt, sizeof ldt));
    }
#endif
    /* The deny list's own answer survives the base: EPERM, not the base's ENOSYS. */
    report("unshare", syscall(SYS_unshare, 0));
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "syscalls") == 0) {
        syscalls();
    } else if (argc >= 3 && strcmp(argv[1], "write") == 0) {
        report("write", open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644));
    } else if (argc >= 3 && strcmp(argv[1], "read") == 0) {
        report("read", open(argv[2], O_RDONLY));
    } else if (argc >= 3 && strcmp(argv[1], "bind") == 0) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_port = htons((uint16_t)atoi(argv[2]));
        report("bind", s < 0 ? s : bind(s, (struct sockaddr *)&a, sizeof a));
    } else if (argc >= 2 && strcmp(argv[1], "unix") == 0) {
        int sv[2];
        report("socket_unix", socket(AF_UNIX, SOCK_STREAM, 0));
        report("socketpair_unix", socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    } else if (argc >= 2 && strcmp(argv[1], "inet") == 0) {
        report("inet_stream", socket(AF_INET, SOCK_STREAM, 0));
    } else if (argc >= 2 && strcmp(argv[1], "gate") == 0) {
        gate();
    } else if (argc >= 3 && strcmp(argv[1], "stdio") == 0) {
        stdio_facts(argv[2]);
        _exit(0);
    } else if (argc >= 2 && strcmp(argv[1], "wait") == 0) {
        pause();
    } else if (argc >= 3 && strcmp(argv[1], "setid") == 0) {
        setid(argv[2]);
    } else if (argc >= 2 && strcmp(argv[1], "unlisted") == 0) {
        unlisted();
    } else if (argc >= 2 && strcmp(argv[1], "families") == 0) {
        families();
    } else if (argc >= 3 && strcmp(argv[1], "forkloop") == 0) {
        forkloop(atol(argv[2]));
    } else {
        fprintf(stderr, "usage: probe syscalls|write PATH|read PATH|bind PORT|unix|inet|gate|wait|setid DIR|families|forkloop MAX|unlisted|stdio OUT\n");
        return 2;
    }
    return 0;
}
