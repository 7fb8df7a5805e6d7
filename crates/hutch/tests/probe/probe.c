/* Test probe run inside sandboxes by the integration tests.
 *   probe syscalls     try privileged syscalls; print "<name> <result>" per line
 *   probe hog MIB      allocate and touch MIB mebibytes, then print "survived"
 *   probe spin SECS    burn CPU for SECS seconds of wall time
 *   probe burn SECS    burn CPU until this process has used SECS seconds of CPU time
 *                      (whatever else the host runs), then print "burnt"
 *   probe hold MIB SECS  allocate and touch MIB mebibytes, hold them SECS seconds of wall
 *                      time, then print "held" and exit
 *   probe connect SRC DST PORT   TCP connect from source address SRC (bound with
 *                      IP_FREEBIND, so any address is accepted locally) to DST:PORT within
 *                      2 s; prints "connect OK" or "connect <errno name>"
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <fcntl.h>

static void report(const char *name, long rc) {
    if (rc < 0) {
        printf("%s %s\n", name, strerrorname_np(errno) ? strerrorname_np(errno) : "E?");
    } else {
        printf("%s OK\n", name);
    }
    fflush(stdout);
}

static int syscalls(void) {
    report("mount", mount("none", "/mnt", "tmpfs", 0, NULL));
    report("umount2", umount2("/proc", MNT_DETACH));
    report("unshare_user", unshare(CLONE_NEWUSER));
    report("unshare_ns", unshare(CLONE_NEWNS));
    report("setns", syscall(SYS_setns, 0, 0));
    report("ptrace", syscall(SYS_ptrace, 0 /* TRACEME */, 0, 0, 0));
    report("keyctl", syscall(SYS_keyctl, 0, -3, 0));
    report("add_key", syscall(SYS_add_key, "user", "k", "v", 1, -3));
    report("bpf", syscall(SYS_bpf, 0, 0, 0));
    report("perf_event_open", syscall(SYS_perf_event_open, 0, 0, -1, -1, 0));
    report("io_uring_setup", syscall(SYS_io_uring_setup, 1, 0));
    report("userfaultfd", syscall(SYS_userfaultfd, 0));
    report("open_by_handle_at", syscall(SYS_open_by_handle_at, 0, 0, 0));
    report("init_module", syscall(SYS_init_module, 0, 0, ""));
    report("kexec_load", syscall(SYS_kexec_load, 0, 0, 0, 0));
    report("socket_packet", socket(AF_PACKET, SOCK_RAW, 0));
    report("socket_raw", socket(AF_INET, SOCK_RAW, 1));
    report("sethostname", sethostname("evil", 4));
    report("chroot", chroot("/tmp"));
    report("clone3", syscall(SYS_clone3, 0, 0));
    report("clone_newuser", syscall(SYS_clone, CLONE_NEWUSER | 17, 0, 0, 0, 0));
    report("settimeofday", syscall(SYS_settimeofday, 0, 0));
    return 0;
}

static int hog(long mib) {
    for (long i = 0; i < mib; i++) {
        char *p = malloc(1 << 20);
        if (!p) { printf("malloc failed at %ld MiB\n", i); return 2; }
        memset(p, 1, 1 << 20);
    }
    printf("survived\n");
    return 0;
}

static int spin(double secs) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    volatile unsigned long n = 0;
    do {
        for (int i = 0; i < 100000; i++) n++;
        clock_gettime(CLOCK_MONOTONIC, &b);
    } while ((b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9 < secs);
    printf("spun\n");
    return 0;
}

static int burn(double secs) {
    struct timespec t;
    volatile unsigned long n = 0;
    do {
        for (int i = 0; i < 100000; i++) n++;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    } while (t.tv_sec + t.tv_nsec / 1e9 < secs);
    printf("burnt\n");
    return 0;
}

static int hold(long mib, double secs) {
    for (long i = 0; i < mib; i++) {
        char *p = malloc(1 << 20);
        if (!p) { printf("malloc failed at %ld MiB\n", i); return 2; }
        memset(p, 1, 1 << 20);
    }
    struct timespec d = {.tv_sec = (time_t)secs, .tv_nsec = (long)((secs - (time_t)secs) * 1e9)};
    while (nanosleep(&d, &d) < 0 && errno == EINTR) {}
    printf("held\n");
    return 0;
}

/* Refuse to run anywhere but inside a Hutch sandbox: on the host, as root, the privileged
 * calls above would succeed and change the machine (mount, umount2 /proc, sethostname). */
static int inside_sandbox(void) {
    char buf[256] = {0};
    FILE *f = fopen("/proc/1/cmdline", "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    return n > 0 && strstr(buf, "hutch-agent") != NULL && getenv("HUTCH_SANDBOX_ID") != NULL;
}

static int connect_from(const char *src, const char *dst, int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET}, b = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (fd < 0 || setsockopt(fd, IPPROTO_IP, IP_FREEBIND, &one, sizeof one) < 0) { report("connect", -1); return 1; }
    inet_pton(AF_INET, src, &a.sin_addr);
    inet_pton(AF_INET, dst, &b.sin_addr);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0) { report("connect", -1); return 1; }
    fcntl(fd, F_SETFL, O_NONBLOCK);
    if (connect(fd, (struct sockaddr *)&b, sizeof b) < 0 && errno != EINPROGRESS) { report("connect", -1); return 1; }
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    if (poll(&p, 1, 2000) <= 0) { errno = ETIMEDOUT; report("connect", -1); return 1; }
    int err = 0; socklen_t len = sizeof err;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    errno = err;
    report("connect", err ? -1 : 0);
    return err != 0;
}

int main(int argc, char **argv) {
    if (!inside_sandbox()) {
        fprintf(stderr, "probe: refusing to run outside a Hutch sandbox\n");
        return 70;
    }
    if (argc >= 2 && !strcmp(argv[1], "syscalls")) return syscalls();
    if (argc >= 3 && !strcmp(argv[1], "hog")) return hog(atol(argv[2]));
    if (argc >= 3 && !strcmp(argv[1], "spin")) return spin(atof(argv[2]));
    if (argc >= 3 && !strcmp(argv[1], "burn")) return burn(atof(argv[2]));
    if (argc >= 4 && !strcmp(argv[1], "hold")) return hold(atol(argv[2]), atof(argv[3]));
    if (argc >= 5 && !strcmp(argv[1], "connect")) return connect_from(argv[2], argv[3], atoi(argv[4]));
    fprintf(stderr, "usage: probe syscalls | hog MIB | spin SECS | burn SECS | hold MIB SECS\n");
    return 64;
}
