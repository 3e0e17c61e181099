/* main.c: the gh200core command line. The only place that prints to stdout and turns a
 * status into an exit code; everything else returns GHC_E* with a message in the core. */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <gh200core/gh200core.h>
#include <gh200core/train.h>

#include "cli.h"
#include "dist.h"

/* Exit codes (documented in --help and doc/gh200core.1). */
enum {
    EXIT_OK      = 0,
    EXIT_FAIL    = 1,   /* any other failure */
    EXIT_USAGE   = 2,   /* bad command line */
    EXIT_CONFIG  = 3,   /* configuration error */
    EXIT_PLUGIN  = 4,   /* a plugin could not be loaded or registered */
    EXIT_IO      = 5,   /* a file could not be read or written, or is malformed */
    EXIT_EXISTS  = 6,   /* the output exists and would be overwritten */
    EXIT_NOFIT   = 7,   /* estimate --device-memory: the run does not fit the card */
};

static int exit_code(int status)
{
    switch (status) {
    case GHC_OK:        return EXIT_OK;
    case GHC_ECONFIG:   return EXIT_CONFIG;
    case GHC_ELOAD:
    case GHC_EABI:      return EXIT_PLUGIN;
    case GHC_EIO:
    case GHC_ENOTFOUND:
    case GHC_EFORMAT:   return EXIT_IO;
    case GHC_EEXIST:    return EXIT_EXISTS;
    default:            return EXIT_FAIL;
    }
}

static const char usage_text[] =
    "usage: gh200core [OPTIONS] -c FILE        train as the configuration says\n"
    "       gh200core [OPTIONS] prepare -c FILE\n"
    "                                          encode the media datasets of `data` (videos and\n"
    "                                          images with captions) into caches with the `vae`\n"
    "                                          and `text_encoder` sections; what is up to date\n"
    "                                          is kept (doc/prepare.md). `-c FILE` alone runs it\n"
    "                                          first too (data.prepare = auto, never, always;\n"
    "                                          the demo's run prepares its generated media)\n"
    "       gh200core [OPTIONS] plugins        list the plugins on the search path\n"
    "       gh200core [OPTIONS] plugins --keys the keys each plugin and core section declares\n"
    "       gh200core inspect FILE             header, tensors and totals of a .safetensors file\n"
    "                                          (or a sharded checkpoint's .index.json)\n"
    "       gh200core diag [--json FILE] [--oversubscription-scale X] [--skip-allocation]\n"
    "                                          GPU, platform, managed memory and bandwidth checks\n"
    "       gh200core estimate -c FILE [--batch N] [--tokens N] [--device-memory GIB]\n"
    "                          [--host-memory GIB]\n"
    "                                          memory by role and location, before loading;\n"
    "                                          with the card's GiB: whether it fits, and if not\n"
    "                                          the --set arguments of a plan that does; with\n"
    "                                          plan = \"auto\", the plan for that card and host\n"
    "                                          (default: this machine's memory)\n"
    "       gh200core merge --base CKPT --adapter FILE --out OUT.safetensors\n"
    "                       [--multiplier M] [--dtype keep|bf16|f16|f32]\n"
    "                       [--network NAME] [--model NAME]\n"
    "                                          write CKPT (a .safetensors or sharded .index.json)\n"
    "                                          with the adapter merged in, W + M delta-W, as one\n"
    "                                          file; --dtype: of the merged weights (default keep);\n"
    "                                          the network plugin reads the adapter (default\n"
    "                                          lycoris), the model plugin names the base's modules\n"
    "                                          (default wan22)\n"
    "       gh200core --help | --version\n"
    "\n"
    "Fine-tunes diffusion transformers (Wan2.2) with LoRA/LyCORIS adapters; every part of a run\n"
    "is a plugin named in a libconfig file.\n"
    "\n"
    "options:\n"
    "  -c, --config FILE       the run's configuration (libconfig; @include allowed)\n"
    "  -s, --set KEY=VALUE     override a setting, e.g. --set optimizer.lr=1e-4 (repeatable)\n"
    "  -P, --plugin-path DIR   search DIR for plugins first (repeatable)\n"
    "  -n, --dry-run           check the configuration and load its plugins, train nothing,\n"
    "                          write nothing\n"
    "  -r, --resume DIR        continue a run from its checkpoint folder (output_dir/checkpoint-N)\n"
    "      --overwrite         write into an output_dir that holds files (not the --resume\n"
    "                          checkpoint's own folder): the run's files of the same names are\n"
    "                          replaced, nothing else is removed\n"
    "      --nproc N           start N local ranks of this run (one per GPU), as torchrun would:\n"
    "                          signals are passed on, the first failure is the exit status;\n"
    "                          ranks above 0 print warnings and errors only (doc/distributed.md)\n"
    "  -v, --verbose           debug messages (and plugin descriptions in `plugins`)\n"
    "  -q, --quiet             errors only\n"
    "  -h, --help              this text\n"
    "  -V, --version           package, API and plugin ABI versions\n"
    "\n"
    "plugin search path: --plugin-path, the config's plugin_path, $GHC_PLUGIN_PATH (':' list),\n"
    "then " GHC_PLUGINSDIR ".\n"
    "\n"
    "exit status: 0 success, 1 failure, 2 usage, 3 configuration error, 4 plugin error,\n"
    "5 file error, 6 output exists, 7 the run does not fit estimate's --device-memory,\n"
    "130 / 143 stopped by SIGINT / SIGTERM after writing a checkpoint.\n"
    "\n"
    "See gh200core(1), doc/config.md and doc/plugin-guide.md.\n";

struct cli {
    /* diag and estimate */
    const char  *json;
    struct ghc_probe_opts probe;
    struct ghc_estimate_opts est;
    double       host_gib;   /* estimate --host-memory (plan = "auto"); 0: this machine's */
    const char  *config;
    const char **sets;
    int          n_sets;
    const char  *resume;
    bool         dry_run;
    bool         overwrite;
    bool         keys;
    int          verbosity;   /* 0 info, <0 quiet, >0 verbose */
    int          nproc;       /* --nproc: local ranks to start (0: none, this is one) */
    struct ghc_merge_opts merge;
    int          argc;             /* the command line as given, for the resume command */
    char       **argv;
};

static void log_sink(void *user, enum ghc_log_level lvl, const char *msg)
{
    (void)user;
    if (msg[0] == '\r') {
        /* the trainer's progress line for a terminal: drawn over the last one, padded to wipe a
         * longer one out; '\n' ends it */
        size_t n = strlen(msg + 1);
        bool end = n > 0 && msg[n] == '\n';
        fprintf(stderr, "\r%-110.*s%s", (int)(n - end), msg + 1, end ? "\n" : "");
        fflush(stderr);
    } else if (lvl <= GHC_LOG_WARN)
        fprintf(stderr, "gh200core: %s: %s\n", ghc_log_level_name(lvl), msg);
    else
        fprintf(stderr, "gh200core: %s\n", msg);
}

static int fail(ghc_core_t *core, int status)
{
    fprintf(stderr, "gh200core: error: %s\n", ghc_error_message(core));
    return exit_code(status);
}

/* ---- plugins -------------------------------------------------------------------------------- */

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Load every ghc_*.so in one folder (sorted); failures are reported and counted. */
static int load_dir(ghc_core_t *core, const char *dir, int *failed)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    char **names = NULL;
    int n = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "ghc_", 4) != 0 || len < 8 || strcmp(e->d_name + len - 3, ".so") != 0)
            continue;
        char **nn = realloc(names, (size_t)(n + 1) * sizeof(*nn));
        if (!nn || !(nn[n] = malloc(strlen(dir) + len + 2))) {
            free(nn ? nn : names);
            names = NULL;
            rc = ghc_error_set(core, GHC_ENOMEM, "plugins: out of memory");
            n = 0;
            break;
        }
        names = nn;
        sprintf(names[n++], "%s/%s", dir, e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof(*names), name_cmp);
    for (int i = 0; i < n; i++) {
        if (ghc_plugin_load_file(core, names[i]) < 0) {
            fprintf(stderr, "gh200core: error: %s\n", ghc_error_message(core));
            (*failed)++;
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

static const char *const cfg_type_names[] = { "?", "int", "float", "bool", "string", "list", "group" };

/* One line per key: SECTION NAME KEY TYPE DEFAULT RANGE, "-" where the table declares none, a
 * string default in quotes. A group's own keys follow it as GROUP.KEY (three levels at most:
 * a table that names itself ends there). */
static void print_keys(const char *section, const char *name, const char *prefix, int depth,
                       const struct ghc_cfg_key *k)
{
    for (; k && k->name; k++) {
        int t = k->type >= GHC_CFG_INT && k->type <= GHC_CFG_GROUP ? (int)k->type : 0;
        char key[256], def[256];
        snprintf(key, sizeof(key), "%s%s", prefix, k->name);
        if (!k->def)
            snprintf(def, sizeof(def), "-");
        else
            snprintf(def, sizeof(def), t == GHC_CFG_STRING && k->def[0] != '(' ? "\"%s\"" : "%s", k->def);
        printf("%-10s %-16s %-32s %-6s %-10s %s\n", section, name, key, cfg_type_names[t], def,
               k->range ? k->range : "-");
        if (t == GHC_CFG_GROUP && k->keys && depth < 3) {
            char sub[260];
            snprintf(sub, sizeof(sub), "%s.", key);
            print_keys(section, name, sub, depth + 1, k->keys);
        }
    }
}

static int cmd_plugins(ghc_core_t *core, bool keys)
{
    int failed = 0, rc;
    const char *dir;
    if (!ghc_plugin_path_at(core, 0))   /* the search path itself is wrong ($GHC_PLUGIN_PATH) */
        return fail(core, ghc_error_code(core));
    for (int i = 0; (dir = ghc_plugin_path_at(core, i)); i++)
        if ((rc = load_dir(core, dir, &failed)) < 0)
            return fail(core, rc);
    struct ghc_plugin_info info;
    if (keys) {
        /* plugin sections by kind and plugin, then the core's own; `validation` takes the keys
         * of `data` */
        printf("%-10s %-16s %-32s %-6s %-10s %s\n", "SECTION", "NAME", "KEY", "TYPE", "DEFAULT", "RANGE");
        for (int i = 0; ghc_plugin_info_at(core, i, &info); i++)
            print_keys(ghc_kind_name(info.kind), info.name, "", 0, info.keys);
        static const char *const data_sections[] = { "data", "validation" };
        for (int i = 0; i < 2; i++) {
            print_keys(data_sections[i], "-", "", 0, ghc_dataset_keys(false));
            print_keys(data_sections[i], "datasets", "", 0, ghc_dataset_keys(true));
        }
        print_keys("train", "-", "", 0, ghc_train_section_keys("train"));
        print_keys("demo", "-", "", 0, ghc_train_section_keys("demo"));
        return failed ? EXIT_PLUGIN : EXIT_OK;
    }
    char q[4096];
    printf("%-10s %-16s %-9s %s\n", "KIND", "NAME", "VERSION", "PATH");
    for (int i = 0; ghc_plugin_info_at(core, i, &info); i++) {
        printf("%-10s %-16s %-9s %s\n", ghc_kind_name(info.kind), info.name, info.version,
               ghc_path_quote(info.path, q, sizeof(q)));
        if (*info.description && ghc_log_get_level(core) >= GHC_LOG_DEBUG)
            printf("%-10s %s\n", "", info.description);
    }
    printf("search path:");
    for (int i = 0; (dir = ghc_plugin_path_at(core, i)); i++) {
        struct stat st;
        printf(" %s%s", ghc_path_quote(dir, q, sizeof(q)), stat(dir, &st) == 0 ? "" : " (absent)");
    }
    printf("\n");
    if (failed) {
        fprintf(stderr, "gh200core: error: %d plugin file%s failed to load\n", failed, failed == 1 ? "" : "s");
        return EXIT_PLUGIN;
    }
    return EXIT_OK;
}

/* ---- train ---------------------------------------------------------------------------------- */

static void on_signal(int sig) { ghc_train_request_stop(sig); }

/* Appends `arg` to buf quoted for a POSIX shell: as it is when it holds only characters no
 * shell treats specially, else in single quotes (a ' inside as '\''). */
static void shell_quote(char *buf, size_t len, const char *arg)
{
    size_t at = strlen(buf);
    bool plain = *arg != '\0';
    for (const char *c = arg; *c && plain; c++)
        plain = strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-", *c) != NULL;
    at += (size_t)snprintf(buf + at, at < len ? len - at : 0, "%s%s", at ? " " : "", plain ? arg : "'");
    for (const char *c = arg; !plain && *c && at < len; c++)
        at += (size_t)snprintf(buf + at, len - at, *c == '\'' ? "'\\''" : "%c", *c);
    if (!plain && at < len)
        snprintf(buf + at, len - at, "'");
}

/* The command line that continues an interrupted run: this one's arguments as given (argv,
 * before getopt reordered it), without any --resume, then --resume CHECKPOINT. */
static void resume_command(const struct cli *cli, const char *checkpoint, char *buf, size_t len)
{
    buf[0] = '\0';
    /* from a build tree argv[0] is libtool's binary in .libs/ (its libraries not on the
     * path): name the wrapper script beside .libs instead */
    char self[4096];
    const char *lt = strstr(cli->argv[0], "/.libs/");
    snprintf(self, sizeof(self), "%s", cli->argv[0]);
    if (lt) {
        const char *base = lt + 7;
        snprintf(self + (lt - cli->argv[0]), sizeof(self) - (size_t)(lt - cli->argv[0]), "/%s",
                 strncmp(base, "lt-", 3) ? base : base + 3);
        if (access(self, X_OK) != 0)
            snprintf(self, sizeof(self), "%s", cli->argv[0]);
    }
    shell_quote(buf, len, self);
    for (int i = 1; i < cli->argc; i++) {
        const char *a = cli->argv[i];
        size_t n = strlen(a);
        if (!strcmp(a, "--")) {   /* operands follow */
            for (; i < cli->argc; i++)
                shell_quote(buf, len, cli->argv[i]);
            break;
        }
        if (a[0] == '-' && a[1] == '-') {
            const char *eq = strchr(a, '=');
            size_t name = eq ? (size_t)(eq - a) - 2 : n - 2;
            bool resume = name > 0 && !strncmp(a + 2, "resume", name) && name <= 6;
            /* getopt_long takes any unique prefix; the options with an argument */
            static const char *const with_arg[] = { "config", "set", "plugin-path", "json", "oversubscription-scale",
                                                    "batch", "tokens", "base", "adapter", "out", "multiplier",
                                                    "dtype", "network", "model", "nproc", NULL };
            bool takes = resume;
            for (int k = 0; with_arg[k] && !takes; k++)
                takes = name > 0 && !strncmp(a + 2, with_arg[k], name) && name <= strlen(with_arg[k]);
            if (!resume)
                shell_quote(buf, len, a);
            if (takes && !eq && i + 1 < cli->argc && !resume)
                shell_quote(buf, len, cli->argv[i + 1]);
            if (takes && !eq)
                i++;
            continue;
        }
        if (a[0] == '-' && a[1]) {
            /* a cluster of short options: -r takes the rest (or the next argument) */
            char kept[256] = "-";
            size_t k = 1;
            const char *arg_of = NULL;
            bool drop_next = false, keep_next = false;
            for (size_t j = 1; j < n; j++) {
                if (strchr("csP", a[j])) {
                    if (k + 1 < sizeof(kept))
                        kept[k++] = a[j];
                    if (a[j + 1])
                        arg_of = a + j + 1;
                    else
                        keep_next = true;
                    break;
                }
                if (a[j] == 'r') {
                    drop_next = !a[j + 1];
                    break;
                }
                if (k + 1 < sizeof(kept))
                    kept[k++] = a[j];
            }
            kept[k] = '\0';
            if (k > 1 || arg_of) {
                char opt[4096];
                snprintf(opt, sizeof(opt), "%s%s", kept, arg_of ? arg_of : "");
                shell_quote(buf, len, opt);
            }
            if (keep_next && i + 1 < cli->argc)
                shell_quote(buf, len, cli->argv[++i]);
            if (drop_next)
                i++;
            continue;
        }
        shell_quote(buf, len, a);
    }
    shell_quote(buf, len, "--resume");
    shell_quote(buf, len, checkpoint);
}

/* ---- several ranks ------------------------------------------------------------------------- */

/* What a rank keeps of the others: the control channel, NCCL, and the trainer's side of them. */
struct dist_run {
    ghc_core_t        *core;
    const struct ghc_dist *d;
    ghc_dist_comm_t   *comm;
    struct ghc_nccl   *nccl;
    struct ghc_train_dist td;
};

/* A sum over the ranks of host floats through the control channel: rank 0 adds them up in rank
 * order and hands the sum back, so every rank has the same bits. */
static int host_allreduce(struct dist_run *r, float *buf, int64_t n)
{
    size_t len = (size_t)n * sizeof(float);
    float *all = r->d->rank == 0 ? malloc(len * (size_t)r->d->world) : NULL;
    if (r->d->rank == 0 && !all)
        return ghc_error_set(r->core, GHC_ENOMEM, "dist: out of memory");
    int rc = ghc_dist_gather(r->comm, buf, len, all);
    if (rc == 0 && r->d->rank == 0)
        for (int64_t i = 0; i < n; i++) {
            float v = all[i];
            for (int k = 1; k < r->d->world; k++)
                v += all[(size_t)k * (size_t)n + (size_t)i];
            buf[i] = v;
        }
    free(all);
    return rc < 0 ? rc : ghc_dist_broadcast(r->comm, buf, len);
}

static int dist_allreduce(void *user, float *buf, int64_t n, int device, void *stream)
{
    struct dist_run *r = user;
    if (device == GHC_DEVICE_CPU)
        return host_allreduce(r, buf, n);
#ifdef GHC_HAVE_NCCL
    return ghc_nccl_allreduce(r->core, r->nccl, r->d->rank, r->d->world, buf, n, device, stream);
#else
    (void)stream;
    return ghc_error_set(r->core, GHC_EUNSUPPORTED, "several ranks on CUDA devices need a build with NCCL "
                         "(configure --with-nccl); this build has none (on the CPU they need none)");
#endif
}

static int dist_gather(void *user, const void *mine, size_t len, void *all)
{
    struct dist_run *r = user;
    return ghc_dist_gather(r->comm, mine, len, all);
}

static int dist_barrier(void *user)
{
    struct dist_run *r = user;
    return ghc_dist_barrier(r->comm);
}

/* One GPU per rank, before anything touches CUDA: the LOCAL_RANK-th of CUDA_VISIBLE_DEVICES (of
 * all GPUs when it is unset) becomes this process's only one, device 0 of the configuration. A
 * list of one (the launcher chose) is kept. */
static int dist_pick_gpu(ghc_core_t *core, const struct ghc_dist *d)
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    char pick[64];
    if (!v) {
        snprintf(pick, sizeof(pick), "%d", d->local_rank);
    } else {
        int n = 0;
        const char *p = v, *at = NULL;
        size_t len = 0;
        while (*p) {
            size_t l = strcspn(p, ",");
            if (n == d->local_rank)
                at = p, len = l;
            n++;
            p += l + (p[l] == ',');
        }
        if (n <= 1)
            return 0;
        if (!at)
            return ghc_error_set(core, GHC_EINVAL, "dist: LOCAL_RANK %d needs GPU %d, but CUDA_VISIBLE_DEVICES=%s names %d",
                                 d->local_rank, d->local_rank, v, n);
        if (len >= sizeof(pick))
            return ghc_error_set(core, GHC_EINVAL, "dist: CUDA_VISIBLE_DEVICES=%s: entry %d is too long", v, d->local_rank);
        memcpy(pick, at, len);
        pick[len] = 0;
    }
    setenv("CUDA_VISIBLE_DEVICES", pick, 1);
    ghc_log(core, GHC_LOG_DEBUG, "dist: rank %d uses GPU %s (CUDA_VISIBLE_DEVICES)", d->rank, pick);
    return 0;
}

/* Several ranks (from the launcher's environment): meet the others (rank 0 hands out NCCL's
 * unique id), and watch them while training. One rank: nothing to do. */
static int dist_start(ghc_core_t *core, const struct ghc_dist *d, struct dist_run *r)
{
    *r = (struct dist_run){ .core = core, .d = d };
    if (d->world == 1)
        return 0;
    uint64_t fp;
    unsigned char blob[GHC_DIST_BLOB] = { 0 };
    int rc = ghc_dist_config_fingerprint(core, &fp);
    if (rc < 0)
        return rc;
#ifdef GHC_HAVE_NCCL
    if (d->rank == 0 && (rc = ghc_nccl_id(core, blob, sizeof(blob))) < 0)
        return rc;
#endif
    if ((rc = ghc_dist_rendezvous(core, d, fp, blob, sizeof(blob), &r->comm)) < 0)
        return rc;
    ghc_log(core, GHC_LOG_INFO, "dist: rank %d of %d (%s): every rank came to %s:%d", d->rank, d->world, d->launcher,
            d->addr, d->port);
#ifdef GHC_HAVE_NCCL
    if ((rc = ghc_nccl_new(core, blob, sizeof(blob), &r->nccl)) < 0)
        return rc;
#endif
    r->td = (struct ghc_train_dist){ .struct_size = sizeof(r->td), .rank = d->rank, .world = d->world, .user = r,
                                     .allreduce = dist_allreduce, .gather = dist_gather, .barrier = dist_barrier };
    if ((rc = ghc_dist_barrier(r->comm)) < 0 || (rc = ghc_dist_watch(r->comm, true)) < 0)
        return rc;
    return 0;
}

/* The end of a run of several ranks: after `status` (0 when this rank trained to the end), all
 * meet once more, stop watching, meet again (so no rank's close looks like a death), and close. */
static int dist_end(struct dist_run *r, int status)
{
    int rc = 0;
    if (r->comm && status == 0) {
        if ((rc = ghc_dist_barrier(r->comm)) == 0 && (rc = ghc_dist_watch(r->comm, false)) == 0)
            rc = ghc_dist_barrier(r->comm);
    }
#ifdef GHC_HAVE_NCCL
    ghc_nccl_free(r->nccl);
#endif
    ghc_dist_comm_free(r->comm);
    *r = (struct dist_run){ 0 };
    return rc;
}

static int train_ranked(ghc_core_t *core, const struct cli *cli, const struct ghc_train_dist *dist);

static int cmd_train(ghc_core_t *core, const struct cli *cli, const struct ghc_dist *dist)
{
    struct dist_run dr;
    int rc;
    if ((rc = dist_start(core, dist, &dr)) < 0) {
        fail(core, rc);
        dist_end(&dr, rc);
        return EXIT_FAIL;   /* a socket's GHC_EIO is no file error */
    }
    rc = train_ranked(core, cli, dr.comm ? &dr.td : NULL);
    /* done, or stopped together after a checkpoint (128 + the signal): the ranks leave
     * together, once rank 0 has written; a rank that failed leaves at once, and the others see
     * its connection close */
    if (dr.comm && (rc == EXIT_OK || rc > 128)) {
        int e = dist_end(&dr, 0);
        if (e < 0)
            return fail(core, e);
    }
    dist_end(&dr, rc);
    return rc;
}

/* The training run of this rank (dist NULL: the only one). Returns the exit code. */
static int train_ranked(ghc_core_t *core, const struct cli *cli, const struct ghc_train_dist *dist)
{
    int rc;
    struct ghc_train_opts opts = { .resume = cli->resume, .progress = isatty(STDERR_FILENO) && cli->verbosity >= 0,
                                   .overwrite = cli->overwrite, .dist = dist };
    /* a folder that holds a run is refused before the plugins load (a model may take minutes);
     * by rank 0, which alone writes it */
    if ((rc = ghc_train_check_output(core, &opts)) < 0)
        return fail(core, rc);
    /* media datasets encoded first (data.prepare): by rank 0, then by the others, who find it
     * done (and point data.empty_prompt where rank 0 put it); the demo's, once the run has
     * written them */
    int mode = GHC_PREPARE_AUTO;
    if ((rc = ghc_prepare_mode(core, &mode)) < 0)
        return fail(core, rc);
    if (mode != GHC_PREPARE_NEVER && !cli->dry_run && !ghc_config_section(core, "demo")) {
        bool first = !dist || dist->rank == 0;
        if ((first && (rc = ghc_prepare(core, mode == GHC_PREPARE_ALWAYS, NULL)) < 0) ||
            (dist && (rc = dist->barrier(dist->user)) < 0) || (!first && (rc = ghc_prepare(core, false, NULL)) < 0))
            return fail(core, rc);
    }
    /* plan = "auto": the policy and checkpointing that fit this card, before the plugins load */
    char chosen[512];
    if ((rc = ghc_cli_plan_auto(core, &(struct ghc_plan_opts){ 0 }, chosen, sizeof(chosen))) < 0)
        return fail(core, rc);
    if (*chosen)
        ghc_log(core, GHC_LOG_INFO, "%s", chosen);
    if ((rc = ghc_run_init(core)) < 0)
        return fail(core, rc);
    int n = 0;
    for (int k = 0; k < GHC_KIND_COUNT; k++) {
        ghc_cfg_t *s = ghc_config_section(core, ghc_kind_name((enum ghc_kind)k));
        const char *name;
        if (s && ghc_cfg_get_string(s, "plugin", NULL, &name) == 0) {
            ghc_log(core, GHC_LOG_INFO, "%s: %s", ghc_kind_name((enum ghc_kind)k), name);
            n++;
        }
    }
    if (cli->dry_run) {
        /* the checks of a run, in the same order and with the same messages */
        if ((rc = ghc_train_check(core, &opts)) < 0)
            return fail(core, rc);
        ghc_log(core, GHC_LOG_INFO, "%s: configuration valid, %d plugin%s loaded (dry run: nothing trained or written)",
                cli->config, n, n == 1 ? "" : "s");
        return EXIT_OK;
    }
    struct sigaction sa = { .sa_handler = on_signal };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    rc = ghc_train(core, &opts);
    if (rc == GHC_EINTERRUPTED && dist && dist->rank > 0) {
        fprintf(stderr, "gh200core: %s\n", ghc_error_message(core));
        return 128 + ghc_train_stop_signal();
    }
    if (rc == GHC_EINTERRUPTED) {
        /* the message ends with the checkpoint: "... continue with --resume DIR/checkpoint-N" */
        char cmd[16384];
        const char *ck = strstr(ghc_error_message(core), "--resume ");
        resume_command(cli, ck ? ck + 9 : ghc_config_output_dir(core), cmd, sizeof(cmd));
        fprintf(stderr, "gh200core: %s\ngh200core: continue with: %s\n", ghc_error_message(core), cmd);
        return 128 + ghc_train_stop_signal();
    }
    return rc < 0 ? fail(core, rc) : EXIT_OK;
}

/* ---- main ----------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "config", required_argument, NULL, 'c' },
        { "set", required_argument, NULL, 's' },
        { "plugin-path", required_argument, NULL, 'P' },
        { "dry-run", no_argument, NULL, 'n' },
        { "resume", required_argument, NULL, 'r' },
        { "keys", no_argument, NULL, 'K' },
        { "verbose", no_argument, NULL, 'v' },
        { "quiet", no_argument, NULL, 'q' },
        { "help", no_argument, NULL, 'h' },
        { "version", no_argument, NULL, 'V' },
        { "json", required_argument, NULL, 1001 },
        { "oversubscription-scale", required_argument, NULL, 1002 },
        { "skip-allocation", no_argument, NULL, 1003 },
        { "batch", required_argument, NULL, 1004 },
        { "tokens", required_argument, NULL, 1005 },
        { "base", required_argument, NULL, 1006 },       /* merge */
        { "adapter", required_argument, NULL, 1007 },
        { "out", required_argument, NULL, 1008 },
        { "multiplier", required_argument, NULL, 1009 },
        { "dtype", required_argument, NULL, 1010 },
        { "network", required_argument, NULL, 1011 },
        { "model", required_argument, NULL, 1012 },
        { "device-memory", required_argument, NULL, 1013 },
        { "overwrite", no_argument, NULL, 1014 },
        { "nproc", required_argument, NULL, 1015 },
        { "host-memory", required_argument, NULL, 1016 },
        { NULL, 0, NULL, 0 },
    };
    struct cli cli = { .probe = { .struct_size = sizeof(struct ghc_probe_opts), .oversubscription_scale = 0.25 },
                       .est = { .batch = 1, .tokens = 32760, .adapters = true },
                       .merge = { .multiplier = 1.0, .dtype = -1 } };
    int status = EXIT_OK, opt;
    ghc_core_t *core = ghc_core_init();
    if (!core) {
        fprintf(stderr, "gh200core: error: out of memory\n");
        return EXIT_FAIL;
    }
    ghc_log_set_sink(core, log_sink, NULL);
    cli.sets = calloc((size_t)argc, sizeof(*cli.sets));
    cli.argv = calloc((size_t)argc + 1, sizeof(*cli.argv));
    if (!cli.sets || !cli.argv) {
        fprintf(stderr, "gh200core: error: out of memory\n");
        status = EXIT_FAIL;
        goto out;
    }
    cli.argc = argc;
    memcpy(cli.argv, argv, (size_t)argc * sizeof(*argv));   /* getopt_long reorders argv */
    while ((opt = getopt_long(argc, argv, "c:s:P:nr:vqhV", longopts, NULL)) != -1) {
        switch (opt) {
        case 'c': cli.config = optarg; break;
        case 's': cli.sets[cli.n_sets++] = optarg; break;
        case 'P': {
            /* relative to the working directory, as every path of the command line; the
             * library takes absolute folders only ("" is none) */
            char abs[8200], cwd[4096];
            int rc;
            if (optarg[0] && optarg[0] != '/' && getcwd(cwd, sizeof(cwd)))
                snprintf(abs, sizeof(abs), "%s/%s", cwd, optarg);
            else
                snprintf(abs, sizeof(abs), "%s", optarg);
            if ((rc = ghc_plugin_add_path(core, abs)) < 0) {
                status = fail(core, rc);
                goto out;
            }
            break;
        }
        case 'n': cli.dry_run = true; break;
        case 'r': cli.resume = optarg; break;
        case 'K': cli.keys = true; break;
        case 1001: cli.json = optarg; break;
        case 1002:
        case 1004:
        case 1005:
        case 1013:
        case 1016: {
            char *end;
            double v = strtod(optarg, &end);
            if (*end || !(v > 0) || v > 1e12) {
                fprintf(stderr, "gh200core: error: --%s '%s': expected a number > 0\n",
                        opt == 1002 ? "oversubscription-scale" : opt == 1004 ? "batch" :
                        opt == 1005 ? "tokens" : opt == 1013 ? "device-memory" : "host-memory", optarg);
                status = EXIT_USAGE;
                goto out;
            }
            if (opt == 1002)
                cli.probe.oversubscription_scale = v;
            else if (opt == 1013)
                cli.est.device_gib = v;
            else if (opt == 1016)
                cli.host_gib = v;
            else
                *(opt == 1004 ? &cli.est.batch : &cli.est.tokens) = (int64_t)v;
            break;
        }
        case 1003: cli.probe.skip_allocation = true; break;
        case 1014: cli.overwrite = true; break;
        case 1015: {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || end == optarg || v < 1 || v > 1024) {
                fprintf(stderr, "gh200core: error: --nproc '%s': expected a number of ranks, 1 to 1024\n", optarg);
                status = EXIT_USAGE;
                goto out;
            }
            cli.nproc = (int)v;
            break;
        }
        case 1006: cli.merge.base = optarg; break;      /* merge */
        case 1007: cli.merge.adapter = optarg; break;
        case 1008: cli.merge.out = optarg; break;
        case 1011: cli.merge.network = optarg; break;
        case 1012: cli.merge.model = optarg; break;
        case 1009:
        case 1010: {
            char *end;
            static const char *const dts[] = { "keep", "bf16", "f16", "f32" };
            static const int dtv[] = { -1, GHC_DTYPE_BF16, GHC_DTYPE_F16, GHC_DTYPE_F32 };
            int k = 0;
            while (opt == 1010 && k < 4 && strcmp(optarg, dts[k]) != 0)
                k++;
            if (opt == 1009 && ((cli.merge.multiplier = strtod(optarg, &end)), *end || end == optarg ||
                                !(cli.merge.multiplier > -1e6 && cli.merge.multiplier < 1e6))) {
                fprintf(stderr, "gh200core: error: --multiplier '%s': expected a number\n", optarg);
                status = EXIT_USAGE;
                goto out;
            }
            if (opt == 1010 && k == 4) {
                fprintf(stderr, "gh200core: error: --dtype '%s': expected keep, bf16, f16 or f32\n", optarg);
                status = EXIT_USAGE;
                goto out;
            }
            if (opt == 1010)
                cli.merge.dtype = dtv[k];
            break;
        }
        case 'v': cli.verbosity++; break;
        case 'q': cli.verbosity = -1; break;
        case 'h': fputs(usage_text, stdout); goto out;
        case 'V':
            printf("gh200core %s (API %d, plugin ABI %d)\n", ghc_version(), ghc_api_version(), GHC_PLUGIN_ABI);
            goto out;
        default:
            fprintf(stderr, "Try 'gh200core --help'.\n");
            status = EXIT_USAGE;
            goto out;
        }
    }
    ghc_log_set_level(core, cli.verbosity < 0 ? GHC_LOG_ERROR
                            : cli.verbosity == 0 ? GHC_LOG_INFO : GHC_LOG_DEBUG);
    const char *cmd = optind < argc ? argv[optind++] : NULL;
    const char *operand = NULL;
    if (cmd && strcmp(cmd, "inspect") == 0) {
        if (optind >= argc) {
            fprintf(stderr, "gh200core: error: inspect needs a FILE\nTry 'gh200core --help'.\n");
            status = EXIT_USAGE;
            goto out;
        }
        operand = argv[optind++];
    }
    if (optind < argc) {
        fprintf(stderr, "gh200core: error: unexpected argument '%s'\nTry 'gh200core --help'.\n", argv[optind]);
        status = EXIT_USAGE;
        goto out;
    }
    if (cmd && strcmp(cmd, "plugins") != 0 && strcmp(cmd, "inspect") != 0 && strcmp(cmd, "diag") != 0 &&
        strcmp(cmd, "estimate") != 0 && strcmp(cmd, "merge") != 0 && strcmp(cmd, "prepare") != 0) {
        fprintf(stderr, "gh200core: error: unknown command '%s' (known: plugins, inspect, diag, estimate, merge, "
                "prepare)\n"
                "Try 'gh200core --help'.\n", cmd);
        status = EXIT_USAGE;
        goto out;
    }
    if (operand) {
        int rc = ghc_cli_inspect(core, operand, stdout);
        status = rc < 0 ? fail(core, rc) : EXIT_OK;
        goto out;
    }
    if (cmd && strcmp(cmd, "diag") == 0) {
        int failed = 0, rc = ghc_cli_diag(core, &cli.probe, cli.json, stdout, &failed);
        status = rc < 0 ? fail(core, rc) : failed ? EXIT_FAIL : EXIT_OK;
        goto out;
    }
    if (cmd && strcmp(cmd, "merge") == 0) {
        if (!cli.merge.base || !cli.merge.adapter || !cli.merge.out || cli.config) {
            fprintf(stderr, "gh200core: error: merge needs --base CKPT --adapter FILE --out FILE (and no -c)\n"
                    "Try 'gh200core --help'.\n");
            status = EXIT_USAGE;
            goto out;
        }
        int rc = ghc_cli_merge(core, &cli.merge, stdout);
        status = rc < 0 ? fail(core, rc) : EXIT_OK;
        goto out;
    }
    if (cmd && strcmp(cmd, "estimate") == 0 && !cli.config) {
        fprintf(stderr, "gh200core: error: estimate needs a configuration (-c FILE)\n");
        status = EXIT_USAGE;
        goto out;
    }
    if (!cmd && !cli.config) {
        fprintf(stderr, "gh200core: error: nothing to do: give -c FILE or a command\nTry 'gh200core --help'.\n");
        status = EXIT_USAGE;
        goto out;
    }
    if (cli.nproc && (cmd || !cli.config)) {
        fprintf(stderr, "gh200core: error: --nproc goes with a training run (-c FILE, no command)\n"
                "Try 'gh200core --help'.\n");
        status = EXIT_USAGE;
        goto out;
    }
    if (cli.nproc) {
        /* the ranks read the configuration; the launcher only starts and waits */
        status = ghc_cli_launch(cli.nproc, cli.argc, cli.argv);
        goto out;
    }
    struct ghc_dist dist = { .world = 1 };
    if (!cmd) {
        extern char **environ;
        int rc = ghc_dist_from_env(core, (const char *const *)environ, &dist);
        if (rc < 0) {
            status = fail(core, rc);
            goto out;
        }
        /* rank 0 is the one users read */
        if (dist.rank > 0 && cli.verbosity == 0)
            ghc_log_set_level(core, GHC_LOG_WARN);
        if (dist.world > 1 && (rc = dist_pick_gpu(core, &dist)) < 0) {
            status = fail(core, rc);
            goto out;
        }
    }
    if (!cli.config && cli.n_sets) {
        fprintf(stderr, "gh200core: error: --set needs a configuration (-c FILE)\n");
        status = EXIT_USAGE;
        goto out;
    }
    if (cli.config) {
        int rc = ghc_config_load(core, cli.config, (const char *const *)cli.sets, cli.n_sets);
        if (rc < 0) {
            status = fail(core, rc);
            goto out;
        }
    }
    if (cmd && strcmp(cmd, "prepare") == 0) {
        int mode = GHC_PREPARE_AUTO, rc;
        if (!cli.config) {
            fprintf(stderr, "gh200core: error: prepare needs a configuration (-c FILE)\nTry 'gh200core --help'.\n");
            status = EXIT_USAGE;
            goto out;
        }
        struct ghc_prepare_stats st = { 0 };
        if (ghc_config_section(core, "demo"))
            rc = ghc_error_set(core, GHC_ECONFIG, "prepare: %s: the `demo` section's data are made by the training run, "
                               "which prepares them itself (gh200core -c %s)", cli.config, cli.config);
        else if ((rc = ghc_prepare_mode(core, &mode)) == 0)
            rc = ghc_prepare(core, mode == GHC_PREPARE_ALWAYS, &st);
        if (rc == 0 && st.files == 0)
            rc = ghc_error_set(core, GHC_ECONFIG, "prepare: %s: no media in the folders of data.datasets (videos or "
                               "images with captions: doc/prepare.md)", cli.config);
        status = rc < 0 ? fail(core, rc) : EXIT_OK;
        goto out;
    }
    if (cmd && strcmp(cmd, "estimate") == 0) {
        struct ghc_estimate est;
        /* plan = "auto": the plan the trainer would take for these tokens and this card */
        struct ghc_plan_opts po = { .batch = cli.est.batch > 0 ? cli.est.batch : 1,
                                    .tokens = cli.est.tokens > 0 ? cli.est.tokens : 32760,
                                    .device_gib = cli.est.device_gib, .host_gib = cli.host_gib };
        char chosen[512];
        int rc = ghc_cli_plan_auto(core, &po, chosen, sizeof(chosen));
        if (rc == 0 && *chosen)
            printf("%s\n", chosen);
        if (rc == 0)
            rc = ghc_cli_estimate(core, &cli.est, &est, stdout);
        status = rc < 0 ? fail(core, rc) : est.fits == 0 ? EXIT_NOFIT : EXIT_OK;
        goto out;
    }
    if (cli.keys && (!cmd || strcmp(cmd, "plugins") != 0)) {
        fprintf(stderr, "gh200core: error: --keys goes with the plugins command\nTry 'gh200core --help'.\n");
        status = EXIT_USAGE;
        goto out;
    }
    status = cmd ? cmd_plugins(core, cli.keys) : cmd_train(core, &cli, &dist);
out:
    free(cli.sets);
    free(cli.argv);
    ghc_core_free(core);
    return status;
}
