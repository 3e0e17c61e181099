/* test_dist.c: several ranks without a GPU (issue 25): the rank from each launcher's
 * environment and its errors, the TCP rendezvous between forked processes on loopback (all
 * come, one never comes, a wrong world size, a rank twice, another configuration, a rank that
 * dies in a barrier), the share of a step each rank trains, `gh200core --nproc`, and training
 * the tiny demo on two CPU ranks (as one process, stopped together, one killed). Links
 * core/dist.c (internal to the CLI). Every case is bounded: Check's timeout, alarm() in each
 * forked rank. */
#include <config.h>

#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

#include <gh200core/gh200core.h>

#include "../core/dist.h"
#include "testutil.h"

/* ---- the environment ------------------------------------------------------------------------ */

/* Parse `env` (a NULL-terminated list); the status, the message in *msg (static). */
static int parse(const char *const *env, struct ghc_dist *d, const char **msg)
{
    static char buf[GHC_ERROR_MAX];
    ghc_core_t *core = ghc_core_init();
    ck_assert_ptr_nonnull(core);
    int rc = ghc_dist_from_env(core, env, d);
    snprintf(buf, sizeof(buf), "%s", rc < 0 ? ghc_error_message(core) : "");
    *msg = buf;
    ghc_core_free(core);
    return rc;
}

static void parse_fails(const char *const *env, const char *what)
{
    struct ghc_dist d;
    const char *msg;
    ck_assert_int_eq(parse(env, &d, &msg), GHC_EINVAL);
    ck_assert_msg(strstr(msg, what) && strncmp(msg, "dist: ", 6) == 0 && !strchr(msg, '\n'), "lacks '%s': %s", what,
                  msg);
}

START_TEST(env_none)
{
    const char *env[] = { "PATH=/bin", "RANKING=3", NULL };
    struct ghc_dist d;
    const char *msg;
    ck_assert_int_eq(parse(env, &d, &msg), 0);
    ck_assert_int_eq(d.rank, 0);
    ck_assert_int_eq(d.world, 1);
    ck_assert_str_eq(d.launcher, "none");
    const char *one[] = { "RANK=0", "WORLD_SIZE=1", NULL };   /* no address needed */
    ck_assert_int_eq(parse(one, &d, &msg), 0);
    ck_assert_int_eq(d.world, 1);
}
END_TEST

START_TEST(env_torchrun)
{
    const char *env[] = { "RANK=5", "WORLD_SIZE=8", "LOCAL_RANK=1", "MASTER_ADDR=node-a", "MASTER_PORT=1234",
                          "SLURM_PROCID=0", "SLURM_NTASKS=2", "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2", NULL };
    struct ghc_dist d;
    const char *msg;
    ck_assert_int_eq(parse(env, &d, &msg), 0);
    ck_assert_str_eq(d.launcher, "torchrun");
    ck_assert_int_eq(d.rank, 5);
    ck_assert_int_eq(d.world, 8);
    ck_assert_int_eq(d.local_rank, 1);
    ck_assert_str_eq(d.addr, "node-a");
    ck_assert_int_eq(d.port, 1234);
    ck_assert(d.timeout == GHC_DIST_TIMEOUT);
    /* no LOCAL_RANK: the rank (one node); no MASTER_PORT: the default */
    const char *bare[] = { "RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=h", "GHC_DIST_TIMEOUT=2.5", NULL };
    ck_assert_int_eq(parse(bare, &d, &msg), 0);
    ck_assert_int_eq(d.local_rank, 1);
    ck_assert_int_eq(d.port, GHC_DIST_PORT);
    ck_assert(d.timeout == 2.5);
}
END_TEST

START_TEST(env_slurm)
{
    const char *env[] = { "SLURM_PROCID=3", "SLURM_NTASKS=8", "SLURM_LOCALID=3",
                          "SLURM_JOB_NODELIST=gpu[01-04,07],cpu3", NULL };
    struct ghc_dist d;
    const char *msg;
    ck_assert_int_eq(parse(env, &d, &msg), 0);
    ck_assert_str_eq(d.launcher, "Slurm");
    ck_assert_int_eq(d.rank, 3);
    ck_assert_int_eq(d.world, 8);
    ck_assert_int_eq(d.local_rank, 3);
    ck_assert_str_eq(d.addr, "gpu01");
    ck_assert_int_eq(d.port, GHC_DIST_PORT);
    const char *given[] = { "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_NODELIST=gpu[01-02]",
                            "MASTER_ADDR=login1", "MASTER_PORT=4000", NULL };
    ck_assert_int_eq(parse(given, &d, &msg), 0);
    ck_assert_str_eq(d.addr, "login1");
    ck_assert_int_eq(d.port, 4000);
    /* Open MPI's variables come before Slurm's (mpirun inside an allocation) */
    const char *both[] = { "SLURM_PROCID=0", "SLURM_NTASKS=1", "OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2",
                           "OMPI_COMM_WORLD_LOCAL_RANK=0", "MASTER_ADDR=n1", NULL };
    ck_assert_int_eq(parse(both, &d, &msg), 0);
    ck_assert_str_eq(d.launcher, "Open MPI");
    ck_assert_int_eq(d.rank, 1);
    ck_assert_int_eq(d.local_rank, 0);
}
END_TEST

START_TEST(env_openmpi)
{
    const char *env[] = { "OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=0",
                          "MASTER_ADDR=10.0.0.1", NULL };
    struct ghc_dist d;
    const char *msg;
    ck_assert_int_eq(parse(env, &d, &msg), 0);
    ck_assert_str_eq(d.launcher, "Open MPI");
    ck_assert_int_eq(d.rank, 2);
    ck_assert_int_eq(d.world, 4);
    ck_assert_str_eq(d.addr, "10.0.0.1");
    const char *noaddr[] = { "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2", NULL };
    parse_fails(noaddr, "MASTER_ADDR is not set");
    parse_fails(noaddr, "mpirun -x MASTER_ADDR");
}
END_TEST

START_TEST(env_errors)
{
    const char *nan[] = { "RANK=one", "WORLD_SIZE=2", "MASTER_ADDR=h", NULL };
    parse_fails(nan, "RANK='one'");
    const char *neg[] = { "RANK=-1", "WORLD_SIZE=2", "MASTER_ADDR=h", NULL };
    parse_fails(neg, "RANK='-1'");
    const char *big[] = { "RANK=2", "WORLD_SIZE=2", "MASTER_ADDR=h", NULL };
    parse_fails(big, "RANK=2 is not below WORLD_SIZE=2");
    const char *zero[] = { "RANK=0", "WORLD_SIZE=0", NULL };
    parse_fails(zero, "WORLD_SIZE=0");
    const char *half[] = { "RANK=0", NULL };
    parse_fails(half, "WORLD_SIZE=(unset)");
    const char *noaddr[] = { "RANK=0", "WORLD_SIZE=2", NULL };
    parse_fails(noaddr, "MASTER_ADDR is not set");
    const char *port[] = { "RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=70000", NULL };
    parse_fails(port, "MASTER_PORT=70000");
    const char *local[] = { "RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=2x", "MASTER_ADDR=h", NULL };
    parse_fails(local, "LOCAL_RANK='2x'");
    const char *slurm[] = { "SLURM_PROCID=9", "SLURM_NTASKS=4", "SLURM_JOB_NODELIST=a", NULL };
    parse_fails(slurm, "SLURM_PROCID=9 is not below SLURM_NTASKS=4 (Slurm)");
    const char *list[] = { "SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_JOB_NODELIST=gpu[01", NULL };
    parse_fails(list, "SLURM_JOB_NODELIST='gpu[01'");
    const char *timeout[] = { "RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "GHC_DIST_TIMEOUT=soon", NULL };
    parse_fails(timeout, "GHC_DIST_TIMEOUT='soon'");
}
END_TEST

START_TEST(nodelist)
{
    static const char *const cases[][2] = {
        { "gpu[01-04,07],cpu3", "gpu01" }, { "node7", "node7" }, { "a,b", "a" }, { "x[5]", "x5" },
        { "rack[2-3]-n[08-09]", "rack2-n08" }, { "gpu[07,01-04]", "gpu07" }, { "n-1,n-2", "n-1" },
    };
    char out[64];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ck_assert_msg(ghc_dist_first_host(cases[i][0], out, sizeof(out)) == 0, "%s", cases[i][0]);
        ck_assert_str_eq(out, cases[i][1]);
    }
    static const char *const bad[] = { "", "gpu[01", "gpu]", "a[[1]]", ",a" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(ghc_dist_first_host(bad[i], out, sizeof(out)) < 0, "'%s' accepted", bad[i]);
    ck_assert_int_lt(ghc_dist_first_host("averyveryverylongname", out, 8), 0);
}
END_TEST

/* ---- the rendezvous between forked ranks ---------------------------------------------------- */

enum { RUN_BARRIER, RUN_DIE, RUN_COLLECT };

struct proc {
    pid_t pid;
    char  out[256];   /* what the rank says: "ok BLOBHASH ..." or "error MESSAGE" */
};

static int free_port(void)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static void say(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* The body of a forked rank: meet, then `run`; says the outcome into `path`. */
static void rank_main(const char *path, int port, double timeout, int rank, int world, uint64_t fp, int run)
{
    alarm(30);
    ghc_core_t *core = ghc_core_init();
    struct ghc_dist d = { .rank = rank, .world = world, .local_rank = rank, .port = port, .launcher = "test",
                          .timeout = timeout };
    snprintf(d.addr, sizeof(d.addr), "127.0.0.1");
    unsigned char blob[GHC_DIST_BLOB];
    for (size_t i = 0; i < sizeof(blob); i++)
        blob[i] = rank == 0 ? (unsigned char)(i * 7 + (size_t)port) : 0;
    ghc_dist_comm_t *c;
    char text[GHC_ERROR_MAX + 64];
    int rc = ghc_dist_rendezvous(core, &d, fp, blob, sizeof(blob), &c);
    if (rc == 0 && run == RUN_DIE)
        _exit(3);   /* the others are in the barrier */
    if (rc == 0 && run == RUN_COLLECT) {
        int32_t mine = 10 * rank + 1, all[8] = { 0 }, sum = 0;
        if ((rc = ghc_dist_gather(c, &mine, sizeof(mine), all)) == 0) {
            for (int r = 0; r < world && rank == 0; r++)
                sum += all[r];
            rc = ghc_dist_broadcast(c, &sum, sizeof(sum));
        }
        snprintf(text, sizeof(text), "sum %d\n", (int)sum);
    }
    if (rc == 0)
        rc = ghc_dist_barrier(c);
    if (rc == 0 && run == RUN_COLLECT)
        say(path, text);
    else if (rc == 0) {
        snprintf(text, sizeof(text), "ok %016llx\n", (unsigned long long)ghc_dist_hash(blob, sizeof(blob)));
        say(path, text);
    } else {
        snprintf(text, sizeof(text), "error %s\n", ghc_error_message(core));
        say(path, text);
    }
    ghc_dist_comm_free(c);
    ghc_core_free(core);
    _exit(rc == 0 ? 0 : 1);
}

static void spawn(struct proc *p, const char *dir, int i, int port, double timeout, int rank, int world, uint64_t fp,
                  int run)
{
    snprintf(p->out, sizeof(p->out), "%s/p%d.txt", dir, i);
    fflush(NULL);
    p->pid = fork();
    ck_assert_int_ge(p->pid, 0);
    if (p->pid == 0)
        rank_main(p->out, port, timeout, rank, world, fp, run);
}

/* Wait for the process; its exit status; its words into buf. */
static int finish(struct proc *p, char *buf, size_t len)
{
    int st;
    ck_assert_int_eq(waitpid(p->pid, &st, 0), p->pid);
    buf[0] = '\0';
    FILE *f = fopen(p->out, "r");
    if (f) {
        size_t n = fread(buf, 1, len - 1, f);
        buf[n] = '\0';
        fclose(f);
    }
    ck_assert_msg(WIFEXITED(st), "rank process killed by signal %d", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    return WEXITSTATUS(st);
}

static void expect_error(struct proc *p, const char *what)
{
    char buf[2048];
    ck_assert_int_ne(finish(p, buf, sizeof(buf)), 0);
    ck_assert_msg(strncmp(buf, "error dist: ", 12) == 0 && strstr(buf, what) && tu_lines(buf) == 1,
                  "lacks '%s': %s", what, buf);
}

START_TEST(all_come)
{
    char *dir = tu_tmpdir();
    int port = free_port();
    struct proc p[4];
    for (int r = 3; r >= 0; r--)   /* the others before rank 0: they retry */
        spawn(&p[r], dir, r, port, 10.0, r, 4, 77, RUN_BARRIER);
    char first[2048] = "", buf[2048];
    for (int r = 0; r < 4; r++) {
        ck_assert_int_eq(finish(&p[r], buf, sizeof(buf)), 0);
        ck_assert_msg(strncmp(buf, "ok ", 3) == 0, "rank %d: %s", r, buf);
        if (r == 0)
            snprintf(first, sizeof(first), "%s", buf);
        ck_assert_str_eq(buf, first);   /* the same blob everywhere */
    }
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(gather_broadcast)
{
    char *dir = tu_tmpdir();
    int port = free_port();
    struct proc p[3];
    for (int r = 0; r < 3; r++)
        spawn(&p[r], dir, r, port, 10.0, r, 3, 5, RUN_COLLECT);
    char buf[2048];
    for (int r = 0; r < 3; r++) {
        ck_assert_int_eq(finish(&p[r], buf, sizeof(buf)), 0);
        ck_assert_str_eq(buf, "sum 33\n");   /* 1 + 11 + 21 */
    }
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* One process of a scenario: what it says it is, and what it must report (NULL: only its exit
 * status, `status`). */
struct who {
    int         rank, world;
    uint64_t    fp;
    int         run, status;
    const char *want;
};

/* The processes of `w` (up to 4) meet on a fresh port, in that order, each within `timeout`. */
static void meet(double timeout, int n, const struct who *w)
{
    char *dir = tu_tmpdir(), buf[64];
    int port = free_port();
    struct proc p[4];
    for (int i = 0; i < n; i++)
        spawn(&p[i], dir, i, port, timeout, w[i].rank, w[i].world, w[i].fp, w[i].run);
    for (int i = 0; i < n; i++) {
        if (w[i].want)
            expect_error(&p[i], w[i].want);
        else
            ck_assert_int_eq(finish(&p[i], buf, sizeof(buf)), w[i].status);
    }
    tu_rm_rf(dir);
    free(dir);
}

START_TEST(rank_never_comes)
{
    const struct who three_of_four[] = {
        { 0, 4, 1, RUN_BARRIER, 1, "rank 2 never came to 127.0.0.1:" },
        { 1, 4, 1, RUN_BARRIER, 1, "rank 0 gave up: rank 2 never came" },
        { 3, 4, 1, RUN_BARRIER, 1, "rank 0 gave up" },
    };
    meet(1.0, 3, three_of_four);
    const struct who no_root[] = { { 1, 2, 1, RUN_BARRIER, 1, "rank 1 could not reach rank 0 at 127.0.0.1:" } };
    meet(0.5, 1, no_root);
}
END_TEST

START_TEST(wrong_world)
{
    const struct who w[] = {
        { 0, 2, 1, RUN_BARRIER, 1, "rank 1 says the world size is 3, rank 0 says 2" },
        { 1, 3, 1, RUN_BARRIER, 1, "rank 0 gave up: rank 1 says the world size is 3" },
    };
    meet(5.0, 2, w);
}
END_TEST

START_TEST(duplicate_rank)
{
    const struct who w[] = {
        { 0, 3, 1, RUN_BARRIER, 1, "two processes say they are rank 1" },
        { 1, 3, 1, RUN_BARRIER, 1, "rank 0 gave up: two processes say they are rank 1" },
        { 1, 3, 1, RUN_BARRIER, 1, "rank 0 gave up: two processes say they are rank 1" },
    };
    meet(5.0, 3, w);
}
END_TEST

START_TEST(other_config)
{
    const struct who w[] = {
        { 0, 2, 0x1111, RUN_BARRIER, 1, "rank 1's configuration differs from rank 0's" },
        { 1, 2, 0x2222, RUN_BARRIER, 1, "rank 0 gave up: rank 1's configuration differs" },
    };
    meet(5.0, 2, w);
}
END_TEST

START_TEST(rank_dies_in_barrier)
{
    const struct who other[] = {
        { 0, 3, 1, RUN_BARRIER, 1, "rank 2 closed its connection (it died or stopped)" },
        { 1, 3, 1, RUN_BARRIER, 1, "rank 0 stopped the run: rank 2 closed its connection" },
        { 2, 3, 1, RUN_DIE, 3, NULL },
    };
    meet(5.0, 3, other);
    const struct who root[] = {
        { 0, 2, 1, RUN_DIE, 3, NULL },
        { 1, 2, 1, RUN_BARRIER, 1, "rank 0 closed its connection (it died or stopped)" },
    };
    meet(5.0, 2, root);
}
END_TEST

/* ---- the share of a step -------------------------------------------------------------------- */

START_TEST(shard_whole_batches)
{
    /* GA 4 micro-batches of 2, 2 ranks: two whole micro-batches each */
    const struct ghc_dist_span step[] = { { 0, 0, 2 }, { 0, 6, 2 }, { 0, 2, 2 }, { 0, 4, 2 } };
    struct ghc_dist_span out[5];
    ck_assert_int_eq(ghc_dist_shard_step(step, 4, 0, 2, out), 2);
    ck_assert(out[0].start == 0 && out[0].n == 2 && out[1].start == 6 && out[1].n == 2);
    ck_assert_int_eq(ghc_dist_shard_step(step, 4, 1, 2, out), 2);
    ck_assert(out[0].start == 2 && out[0].n == 2 && out[1].start == 4 && out[1].n == 2);
    /* one micro-batch of 4 across 2 ranks: halves; a step across two epochs keeps each span's */
    const struct ghc_dist_span one[] = { { 3, 8, 4 } };
    ck_assert_int_eq(ghc_dist_shard_step(one, 1, 1, 2, out), 1);
    ck_assert(out[0].epoch == 3 && out[0].start == 10 && out[0].n == 2);
    ck_assert_int_eq(ghc_dist_shard_step(one, 1, 2, 2, out), -1);
    ck_assert_int_eq(ghc_dist_shard_step(one, 1, 0, 0, out), -1);
}
END_TEST

START_TEST(shard_covers_the_step)
{
    /* any micro-batch sizes (bucket tails are short) and any world: the ranks' spans, rank
     * after rank, are the step's samples in order, each once, balanced to one sample */
    uint64_t x = 12345;
    for (int trial = 0; trial < 500; trial++) {
        struct ghc_dist_span step[16], out[17];
        int64_t want[128], got[128], ng = 0, nw = 0;
        int n = 1 + (int)((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 60);
        for (int i = 0; i < n; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            step[i] = (struct ghc_dist_span){ .epoch = (int64_t)(x >> 63), .start = (int64_t)((x >> 20) % 1000),
                                              .n = 1 + (int64_t)((x >> 40) % 5) };
            for (int64_t k = 0; k < step[i].n; k++)
                want[nw++] = step[i].epoch * 100000 + step[i].start + k;
        }
        int world = 1 + trial % 6;
        for (int r = 0; r < world; r++) {
            int k = ghc_dist_shard_step(step, n, r, world, out);
            ck_assert_int_ge(k, 0);
            ck_assert_int_le(k, n);
            int64_t mine = 0;
            for (int j = 0; j < k; j++) {
                ck_assert_int_gt(out[j].n, 0);
                for (int64_t s = 0; s < out[j].n; s++)
                    got[ng++] = out[j].epoch * 100000 + out[j].start + s;
                mine += out[j].n;
            }
            ck_assert_int_ge(mine, nw / world);
            ck_assert_int_le(mine, (nw + world - 1) / world);
        }
        ck_assert_int_eq(ng, nw);
        ck_assert_msg(memcmp(got, want, (size_t)nw * sizeof(*got)) == 0, "trial %d: the ranks' samples differ", trial);
    }
}
END_TEST

/* ---- gh200core --nproc ---------------------------------------------------------------------- */

static int count(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

/* Run the CLI in `dir` with `env` and `args` (@SRC@ there: the source tree), bounded by
 * timeout(1); the status must be `status`. The output (caller frees). */
static char *cli(const char *dir, int status, const char *env, const char *args)
{
    char cmd[8192], *out, *a = strdup(args), *at;
    while ((at = strstr(a, "@SRC@"))) {
        char *b = malloc(strlen(a) + strlen(tu_env("GHC_TOP_SRCDIR")) + 1);
        sprintf(b, "%.*s%s%s", (int)(at - a), a, tu_env("GHC_TOP_SRCDIR"), at + 5);
        free(a);
        a = b;
    }
    snprintf(cmd, sizeof(cmd), "cd '%s' && GHC_PLUGIN_PATH='%s' %s timeout 60 '%s' %s", dir, tu_env("GHC_BUILD_PLUGINS"),
             env, tu_env("GHC_CLI"), a);
    ck_assert_msg(tu_run(cmd, &out) == status, "%s: %s", a, out);
    free(a);
    return out;
}

/* Start argv (argv[0] the program) with its output in the file `log`; its pid. */
static pid_t spawn_cli(const char *log, const char *const *argv)
{
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

START_TEST(nproc_usage)
{
    char *dir = tu_tmpdir();
    /* two ranks check the configuration; rank 0 is the one users read, rank 1 only with -v */
    char *out = cli(dir, 0, "", "--nproc 2 -c '@SRC@/etc/tiny.cfg' --dry-run");
    ck_assert_msg(strstr(out, "dist: rank 0 of 2 (torchrun)") && !strstr(out, "rank 1 of 2") &&
                  count(out, "configuration valid") == 1, "%s", out);
    free(out);
    out = cli(dir, 0, "", "-v --nproc=2 -c '@SRC@/etc/tiny.cfg' --dry-run");
    ck_assert_msg(strstr(out, "dist: rank 1 of 2") && count(out, "configuration valid") == 2, "%s", out);
    free(out);
    /* usage */
    out = cli(dir, 2, "", "--nproc 0 -c x.cfg");
    ck_assert_msg(strstr(out, "--nproc '0'"), "%s", out);
    free(out);
    out = cli(dir, 2, "", "--nproc 2 plugins");
    ck_assert_msg(strstr(out, "--nproc goes with a training run"), "%s", out);
    free(out);
    /* a bad launcher environment is one line, exit 1, before anything else */
    out = cli(dir, 1, "RANK=3 WORLD_SIZE=2", "-c '@SRC@/etc/tiny.cfg'");
    ck_assert_str_eq(out, "gh200core: error: dist: RANK=3 is not below WORLD_SIZE=2 (torchrun)\n");
    free(out);
    out = cli(dir, 1, "GHC_DIST_TIMEOUT=0.2 RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "
              "CUDA_VISIBLE_DEVICES=3", "-c '@SRC@/etc/tiny.cfg'");
    ck_assert_msg(strstr(out, "could not reach rank 0") && !strstr(out, "CUDA_VISIBLE_DEVICES"),
                  "a list of one GPU is the launcher's choice: %s", out);
    free(out);
    out = cli(dir, 1, "RANK=1 WORLD_SIZE=3 LOCAL_RANK=2 MASTER_ADDR=127.0.0.1 CUDA_VISIBLE_DEVICES=4,5",
              "-c '@SRC@/etc/tiny.cfg'");
    ck_assert_str_eq(out, "gh200core: error: dist: LOCAL_RANK 2 needs GPU 2, but CUDA_VISIBLE_DEVICES=4,5 names 2\n");
    free(out);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* ---- training on several ranks (CPU) ------------------------------------------------------ */

static void same_losses(const char *a, const char *b, int steps)
{
    double x[64], y[64];
    ck_assert_int_eq(tu_losses(a, x, 64, true), steps);
    ck_assert_int_eq(tu_losses(b, y, 64, true), steps);
    for (int i = 0; i < steps; i++)
        ck_assert_msg(fabs(x[i] - y[i]) <= 1e-5 * fabs(x[i]), "step %d: loss %.9g in %s, %.9g in %s", i + 1, x[i], a,
                      y[i], b);
}

/* Two ranks train the tiny demo as one process does: the same global batch of 3 micro-batches
 * of 1 sample each (rank 0 trains 1 sample of a step, rank 1 2), the same losses step by step
 * (summed in another order), adapters the same on both ranks at each checkpoint, rank 0 the
 * only writer. A checkpoint of 2 ranks resumes on 1, the data position carried over. Two
 * experts in shared mode likewise. */
START_TEST(two_ranks_train_as_one)
{
    char *dir = tu_tmpdir(), args[8192], a[4200], b[4200];
    const char *set = "--set data.batch_size=1 --set scheduler.micro_batches=3 --set train.steps=6 "
                      "--set train.save_every=3";
    snprintf(args, sizeof(args), "-c '@SRC@/etc/tiny.cfg' %s --set 'output_dir=\"%s/one\"'", set, dir);
    free(cli(dir, 0, "", args));
    snprintf(args, sizeof(args), "--nproc 2 -c '@SRC@/etc/tiny.cfg' %s --set 'output_dir=\"%s/two\"'", set, dir);
    char *out = cli(dir, 0, "", args);
    ck_assert_msg(strstr(out, "dist: the adapters are the same on all 2 ranks after step 3 (checksum") &&
                  strstr(out, "dist: the adapters are the same on all 2 ranks after step 6 (checksum") &&
                  count(out, "train: done: 6 steps") == 1, "%s", out);
    free(out);
    snprintf(a, sizeof(a), "%s/one/metrics.jsonl", dir);
    snprintf(b, sizeof(b), "%s/two/metrics.jsonl", dir);
    same_losses(a, b, 6);
    /* what rank 0 wrote, once: the same files as one process */
    snprintf(args, sizeof(args), "cd '%s/one' && ls -R | grep -v tfevents | sed 's#/one#/X#' > ../one.ls && cd ../two && "
             "ls -R | grep -v tfevents | sed 's#/two#/X#' > ../two.ls && cmp ../one.ls ../two.ls", dir);
    ck_assert_int_eq(tu_run(args, &out), 0);
    free(out);
    /* checkpoint-3 of two ranks, resumed by one process */
    snprintf(args, sizeof(args), "-c '@SRC@/etc/tiny.cfg' %s --set 'output_dir=\"%s/two\"' --resume '%s/two/checkpoint-3'",
             set, dir, dir);
    out = cli(dir, 0, "", args);
    ck_assert_msg(strstr(out, "checkpoint-3 was trained by 2 ranks, this run has 1: the data position carries over"),
                  "%s", out);
    free(out);
    same_losses(a, b, 6);
    /* two experts in one adapter (shared): each batch routes by its first sample, on its rank */
    set = "--set data.batch_size=1 --set scheduler.micro_batches=3 --set train.steps=4 --set model.random.experts=2 "
          "--set 'train.mode=\"shared\"'";
    snprintf(args, sizeof(args), "-c '@SRC@/etc/tiny.cfg' %s --set 'output_dir=\"%s/one2\"'", set, dir);
    free(cli(dir, 0, "", args));
    snprintf(args, sizeof(args), "--nproc 2 -c '@SRC@/etc/tiny.cfg' %s --set 'output_dir=\"%s/two2\"'", set, dir);
    free(cli(dir, 0, "", args));
    snprintf(a, sizeof(a), "%s/one2/metrics.jsonl", dir);
    snprintf(b, sizeof(b), "%s/two2/metrics.jsonl", dir);
    same_losses(a, b, 4);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* Start `gh200core --nproc 2` on the tiny demo for many steps into dir/out, its output in
 * dir/log.txt; return once rank 0 has logged two steps. The launcher's pid. */
static pid_t start_long_run(const char *dir)
{
    char outdir[4200], log[4200], set[4300], cfg[4200], metrics[4300];
    snprintf(outdir, sizeof(outdir), "%s/out", dir);
    snprintf(log, sizeof(log), "%s/log.txt", dir);
    snprintf(set, sizeof(set), "output_dir=\"%s\"", outdir);
    snprintf(cfg, sizeof(cfg), "%s/etc/tiny.cfg", tu_env("GHC_TOP_SRCDIR"));
    snprintf(metrics, sizeof(metrics), "%s/metrics.jsonl", outdir);
    const char *argv[] = { tu_env("GHC_CLI"), "--nproc", "2", "-P", tu_env("GHC_BUILD_PLUGINS"), "-c", cfg, "--set", set,
                           "--set", "train.steps=100000", NULL };
    pid_t pid = spawn_cli(log, argv);
    for (int i = 0; i < 400; i++) {
        FILE *f = fopen(metrics, "r");
        char line[4096];
        int n = 0;
        if (f) {
            while (fgets(line, sizeof(line), f))
                n++;
            fclose(f);
        }
        if (n >= 2)
            return pid;
        nanosleep(&(struct timespec){ .tv_nsec = 100 * 1000 * 1000 }, NULL);
    }
    kill(pid, SIGKILL);
    ck_abort_msg("no two steps logged in %s within 40 s", metrics);
    return -1;
}

/* The number after the first `key` in s, -1 without one. */
static __attribute__((noinline)) long number_after(const char *s, const char *key)
{
    const char *p = strstr(s, key);
    return p ? strtol(p + strlen(key), NULL, 10) : -1;
}

static char *read_log(const char *dir)
{
    char path[4200], *out;
    snprintf(path, sizeof(path), "cat '%s/log.txt'", dir);
    tu_run(path, &out);
    return out;
}

/* SIGTERM to the launcher: both ranks finish the same step, rank 0 writes its checkpoint, the
 * status says the signal. */
START_TEST(two_ranks_stop_together)
{
    char *dir = tu_tmpdir();
    pid_t pid = start_long_run(dir);
    int st;
    ck_assert_int_eq(kill(pid, SIGTERM), 0);
    alarm(30);
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    alarm(0);
    char *out = read_log(dir);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGTERM, "status %d: %s", st, out);
    long step = number_after(out, "train: stopped by signal 15 at step ");
    ck_assert_msg(step > 0, "%s", out);
    char want[128], ck[4300];
    snprintf(want, sizeof(want), "train: stopped at step %ld; rank 0 wrote the checkpoint", step);
    ck_assert_msg(strstr(out, want), "rank 1 stopped at another step than rank 0: %s", out);
    snprintf(ck, sizeof(ck), "%s/out/checkpoint-%ld/trainer.json", dir, step);
    struct stat sb;
    ck_assert_msg(stat(ck, &sb) == 0, "%s: %s", ck, out);
    free(out);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* A rank killed mid-run: the other one stops with a line naming it, no hang; no checkpoint was
 * written, so the output folder is removed again. */
START_TEST(two_ranks_one_dies)
{
    char *dir = tu_tmpdir(), kids[64], line[256] = "";
    pid_t pid = start_long_run(dir);
    snprintf(kids, sizeof(kids), "/proc/%d/task/%d/children", (int)pid, (int)pid);
    FILE *f = fopen(kids, "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
    fclose(f);
    /* the second child the launcher started: rank 1 */
    char *sp = strchr(line, ' ');
    ck_assert_ptr_nonnull(sp);
    pid_t r1 = (pid_t)strtol(sp + 1, NULL, 10);
    ck_assert_int_gt(r1, 0);
    ck_assert_int_eq(kill(r1, SIGKILL), 0);
    int st;
    alarm(30);
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    alarm(0);
    char *out = read_log(dir);
    /* the launcher's status is the first failure it reaps: rank 1's kill, or rank 0's stop */
    ck_assert_msg(WIFEXITED(st) && (WEXITSTATUS(st) == 128 + SIGKILL || WEXITSTATUS(st) == 5), "status %d: %s", st, out);
    ck_assert_msg(strstr(out, "gh200core: error: rank 1 was killed by signal 9") &&
                  strstr(out, "dist: rank 1 closed its connection (it died or stopped)"), "%s", out);
    char od[4200];
    struct stat sb;
    snprintf(od, sizeof(od), "%s/out", dir);
    ck_assert_msg(stat(od, &sb) != 0, "%s is left: %s", od, out);
    free(out);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(nproc_passes_sigterm)
{
    /* the ranks block opening a FIFO as their configuration: only a signal ends them */
    char *dir = tu_tmpdir(), fifo[4200], log[4200];
    snprintf(fifo, sizeof(fifo), "%s/cfg.fifo", dir);
    snprintf(log, sizeof(log), "%s/out.txt", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    const char *argv[] = { tu_env("GHC_CLI"), "--nproc", "2", "-c", fifo, NULL };
    pid_t pid = spawn_cli(log, argv);
    /* until the launcher has its two ranks (Linux lists a task's children), then a moment */
    char kids[64], line[256] = "";
    snprintf(kids, sizeof(kids), "/proc/%d/task/%d/children", (int)pid, (int)pid);
    for (int i = 0; i < 100; i++) {
        FILE *f = fopen(kids, "r");
        line[0] = '\0';
        if (f) {
            if (!fgets(line, sizeof(line), f))
                line[0] = '\0';
            fclose(f);
        }
        if (count(line, " ") >= 2)
            break;
        nanosleep(&(struct timespec){ .tv_nsec = 100 * 1000 * 1000 }, NULL);
    }
    nanosleep(&(struct timespec){ .tv_nsec = 500 * 1000 * 1000 }, NULL);
    int st;
    ck_assert_int_eq(waitpid(pid, &st, WNOHANG), 0);   /* still waiting for its ranks */
    ck_assert_int_eq(kill(pid, SIGTERM), 0);
    alarm(20);
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    alarm(0);
    ck_assert_msg(WIFEXITED(st), "the launcher died of signal %d instead of passing it on",
                  WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    ck_assert_int_eq(WEXITSTATUS(st), 128 + SIGTERM);   /* the ranks' status: killed by SIGTERM */
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("dist");
    TCase *tc = tcase_create("env");
    tcase_add_test(tc, env_none);
    tcase_add_test(tc, env_torchrun);
    tcase_add_test(tc, env_slurm);
    tcase_add_test(tc, env_openmpi);
    tcase_add_test(tc, env_errors);
    tcase_add_test(tc, nodelist);
    suite_add_tcase(s, tc);
    tc = tcase_create("rendezvous");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, all_come);
    tcase_add_test(tc, gather_broadcast);
    tcase_add_test(tc, rank_never_comes);
    tcase_add_test(tc, wrong_world);
    tcase_add_test(tc, duplicate_rank);
    tcase_add_test(tc, other_config);
    tcase_add_test(tc, rank_dies_in_barrier);
    suite_add_tcase(s, tc);
    tc = tcase_create("shard");
    tcase_add_test(tc, shard_whole_batches);
    tcase_add_test(tc, shard_covers_the_step);
    suite_add_tcase(s, tc);
    tc = tcase_create("nproc");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, nproc_usage);
    tcase_add_test(tc, nproc_passes_sigterm);
    suite_add_tcase(s, tc);
    tc = tcase_create("train");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, two_ranks_train_as_one);
    tcase_add_test(tc, two_ranks_stop_together);
    tcase_add_test(tc, two_ranks_one_dies);
    suite_add_tcase(s, tc);
    return tu_run_suite(s, false);
}
