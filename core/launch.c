/* launch.c: `gh200core --nproc N -c FILE`, the launcher of N local ranks (issue 25): each rank
 * is this program again, without --nproc, with the environment torchrun would give it (RANK,
 * WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free MASTER_PORT). Their
 * output is theirs, unprefixed (ranks above 0 log warnings and errors only, core/main.c).
 * SIGINT and SIGTERM are passed on; the first rank that fails gives the exit status, and the
 * others get GHC_LAUNCH_GRACE seconds to notice (their connection to rank 0 closes), then
 * SIGTERM, then SIGKILL. */
#include <config.h>

#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

#define GHC_LAUNCH_GRACE 10.0   /* seconds */

static volatile sig_atomic_t pending_signal;

static void on_signal(int sig) { pending_signal = sig; }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A TCP port of 127.0.0.1 free now (the kernel's pick), or 0. */
static int free_port(void)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* argv without --nproc and its value (any unique prefix, "--nproc N" or "--nproc=N"). */
static char **rank_argv(int argc, char *const *argv)
{
    char **out = calloc((size_t)argc + 1, sizeof(*out));
    int k = 0;
    bool operands = false;   /* after "--" */
    for (int i = 0; out && i < argc; i++) {
        const char *a = argv[i];
        bool opt = i > 0 && !operands && a[0] == '-' && a[1] == '-';
        size_t name = opt ? strcspn(a + 2, "=") : 0;
        bool nproc = opt && name >= 2 && name <= 5 && !strncmp(a + 2, "nproc", name);
        operands = operands || (opt && a[2] == '\0');
        if (nproc) {
            if (!strchr(a, '='))
                i++;
            continue;
        }
        out[k++] = argv[i];
    }
    return out;
}

/* In the forked child: the signals back to their defaults, unblocked (one that came since the
 * fork is then delivered: it was meant for the rank), the environment, exec. */
static void start_rank(char **args, int rank, int n, int port, const sigset_t *mask)
{
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    sigprocmask(SIG_SETMASK, mask, NULL);
    char v[32];
    snprintf(v, sizeof(v), "%d", rank);
    setenv("RANK", v, 1);
    setenv("LOCAL_RANK", v, 1);
    snprintf(v, sizeof(v), "%d", n);
    setenv("WORLD_SIZE", v, 1);
    setenv("LOCAL_WORLD_SIZE", v, 1);
    snprintf(v, sizeof(v), "%d", port);
    setenv("MASTER_PORT", v, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    execv("/proc/self/exe", args);
    execvp(args[0], args);
    fprintf(stderr, "gh200core: error: rank %d: cannot run %s: %s\n", rank, args[0], strerror(errno));
    _exit(127);
}

static void signal_all(const pid_t *pid, int n, int sig)
{
    for (int r = 0; r < n; r++)
        if (pid[r] > 0)
            kill(pid[r], sig);
}

/* Wait for every rank; returns the first non-zero status (128 + signal for a killed rank). */
static int wait_ranks(pid_t *pid, int n)
{
    int live = n, first = 0, stage = 0;
    double grace_end = -1.0;
    while (live > 0) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            int r = 0;
            while (r < n && pid[r] != p)
                r++;
            if (r == n)
                continue;
            pid[r] = 0;
            live--;
            int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            if (WIFSIGNALED(st) && stage == 0)   /* each, whichever is reaped first */
                fprintf(stderr, "gh200core: error: rank %d was killed by signal %d\n", r, WTERMSIG(st));
            if (code && !first) {
                first = code;
                if (live && stage == 0)
                    grace_end = now_s() + GHC_LAUNCH_GRACE;
            }
            continue;
        }
        if (pending_signal) {
            int sig = pending_signal;
            pending_signal = 0;
            signal_all(pid, n, sig);
        }
        if (grace_end > 0.0 && now_s() > grace_end && stage < 2) {
            stage++;
            fprintf(stderr, "gh200core: error: %d rank%s still running %g s after the first failure: %s\n", live,
                    live == 1 ? "" : "s", GHC_LAUNCH_GRACE * stage, stage == 1 ? "sending SIGTERM" : "sending SIGKILL");
            signal_all(pid, n, stage == 1 ? SIGTERM : SIGKILL);
            grace_end = stage == 1 ? now_s() + GHC_LAUNCH_GRACE : -1.0;
        }
        nanosleep(&(struct timespec){ .tv_nsec = 20 * 1000 * 1000 }, NULL);
    }
    return first;
}

int ghc_cli_launch(int nproc, int argc, char *const *argv)
{
    int port = free_port(), status = 1, started = 0;
    char **args = rank_argv(argc, argv);
    pid_t *pid = calloc((size_t)nproc, sizeof(*pid));
    if (!args || !pid || !port) {
        fprintf(stderr, "gh200core: error: --nproc: %s\n", port ? "out of memory" : "no free port on 127.0.0.1");
        goto out;
    }
    struct sigaction sa = { .sa_handler = on_signal }, old_int, old_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    /* held while forking, so that none is caught by a child's copy of on_signal and lost */
    sigset_t hold, mask;
    sigemptyset(&hold);
    sigaddset(&hold, SIGINT);
    sigaddset(&hold, SIGTERM);
    sigprocmask(SIG_BLOCK, &hold, &mask);
    fflush(NULL);
    for (; started < nproc; started++) {
        if ((pid[started] = fork()) == 0)
            start_rank(args, started, nproc, port, &mask);
        if (pid[started] < 0) {
            fprintf(stderr, "gh200core: error: --nproc: cannot start rank %d: %s\n", started, strerror(errno));
            pid[started] = 0;
            signal_all(pid, started, SIGTERM);
            break;
        }
    }
    sigprocmask(SIG_SETMASK, &mask, NULL);
    status = wait_ranks(pid, started);
    if (started < nproc && !status)
        status = 1;
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
out:
    free(args);
    free(pid);
    return status;
}
