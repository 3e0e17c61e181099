/* fuzz.h: what every libFuzzer target of tests/fuzz shares: one quiet core, the input as a file
 * (a memfd, or a file in a private folder when a name or neighbours matter), and the rule every
 * target enforces: a failure is one line of message, never a crash, a sanitizer report, an empty
 * or a multi-line message. Header-only on purpose: static functions, one copy per target (each
 * target is its own program). Build and run: tests/fuzz/README.md. */
#ifndef GHC_FUZZ_H
#define GHC_FUZZ_H

#define _GNU_SOURCE
#include <ftw.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gh200core/gh200core.h>
#include <gh200core/run.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_quiet(void *user, enum ghc_log_level lvl, const char *msg)
{
    (void)user;
    (void)lvl;
    (void)msg;
}

/* A core whose log goes nowhere (a warning per input would drown the fuzzer's own output). */
static ghc_core_t *fuzz_core_init(void)
{
    ghc_core_t *core = ghc_core_init();
    if (!core)
        abort();
    ghc_log_set_sink(core, fuzz_quiet, NULL);
    return core;
}

static void fuzz_write_fd(int fd, const void *data, size_t size)
{
    for (size_t off = 0; off < size;) {
        ssize_t k = write(fd, (const uint8_t *)data + off, size - off);
        if (k <= 0)
            abort();
        off += (size_t)k;
    }
}

/* The input as a nameless file: returns its descriptor (close it), its path in path[64]. */
static int fuzz_memfd(const void *data, size_t size, char *path)
{
    int fd = memfd_create("fuzz", MFD_CLOEXEC);
    if (fd < 0)
        abort();
    fuzz_write_fd(fd, data, size);
    snprintf(path, 64, "/proc/self/fd/%d", fd);
    return fd;
}

static int fuzz_rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

/* Remove `dir` and everything under it (not following links). */
static void fuzz_rm_tree(const char *dir) { nftw(dir, fuzz_rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static char fuzz_dir_path[64];

static void fuzz_dir_remove(void) { fuzz_rm_tree(fuzz_dir_path); }

/* A private folder for the whole run (made once, mode 0700, removed at exit), for inputs that
 * need a name or files beside them: in /dev/shm when there is one (a file written per input
 * stays in memory; on a disk's file system the replace-and-close of each input costs more
 * than most parsers do), else in /tmp. Returns its path (static). */
static const char *fuzz_dir(void)
{
    if (!fuzz_dir_path[0]) {
        snprintf(fuzz_dir_path, sizeof(fuzz_dir_path), "/dev/shm/ghc-fuzz-XXXXXX");
        if (!mkdtemp(fuzz_dir_path)) {
            snprintf(fuzz_dir_path, sizeof(fuzz_dir_path), "/tmp/ghc-fuzz-XXXXXX");
            if (!mkdtemp(fuzz_dir_path))
                abort();
        }
        atexit(fuzz_dir_remove);
    }
    return fuzz_dir_path;
}

/* Write dir/name (replaced) with `size` bytes; the path in path[4096]. */
static void fuzz_file(const char *dir, const char *name, const void *data, size_t size, char *path)
{
    snprintf(path, 4096, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0)
        abort();
}

/* Copy a fixture file to dir/name (the seed corpus' neighbours, e.g. shards). */
static void fuzz_copy(const char *from, const char *dir, const char *name)
{
    FILE *f = fopen(from, "rb");
    if (!f) {
        fprintf(stderr, "fuzz: cannot open %s (run from the source tree's top folder, or set GHC_TOP_SRCDIR)\n",
                from);
        abort();
    }
    char *buf = NULL;
    size_t len = 0, cap = 0, k;
    char chunk[65536];
    while ((k = fread(chunk, 1, sizeof(chunk), f)) > 0) {
        if (len + k > cap && !(buf = realloc(buf, cap = (len + k) * 2)))
            abort();
        memcpy(buf + len, chunk, k);
        len += k;
    }
    fclose(f);
    char path[4096];
    fuzz_file(dir, name, buf, len, path);
    free(buf);
}

/* The source tree (for fixtures): $GHC_TOP_SRCDIR, else the current folder. */
static const char *fuzz_srcdir(void)
{
    const char *s = getenv("GHC_TOP_SRCDIR");
    return s && *s ? s : ".";
}

/* A core with a run of `cfg`: the plugins from tests/fuzz/plugins beside the executable (made
 * by `make fuzz`, instrumented), the configuration loaded and the instances created; aborts,
 * with the reason, when that fails. */
static ghc_core_t *fuzz_run_init(const char *cfg)
{
    ghc_core_t *core = fuzz_core_init();
    char exe[4096], dir[4200];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        abort();
    exe[n] = '\0';
    *strrchr(exe, '/') = '\0';
    snprintf(dir, sizeof(dir), "%s/plugins", exe);
    if (ghc_plugin_add_path(core, dir) < 0 || ghc_config_load_string(core, cfg, "fuzz.cfg", NULL, NULL, 0) < 0 ||
        ghc_run_init(core) < 0) {
        fprintf(stderr, "fuzz: setup: %s\n", ghc_error_message(core));
        abort();
    }
    return core;
}

/* The input as a NUL-terminated string (caller frees). */
static char *fuzz_text(const uint8_t *data, size_t size)
{
    char *t = malloc(size + 1);
    if (!t)
        abort();
    memcpy(t, data, size);
    t[size] = '\0';
    return t;
}

/* The rule: a status < 0 comes with one non-empty line of message; anything else aborts (the
 * fuzzer keeps the input as a crash). */
static void fuzz_check(ghc_core_t *core, int rc)
{
    if (rc >= 0)
        return;
    const char *msg = ghc_error_message(core);
    if (!*msg || strchr(msg, '\n') || ghc_error_code(core) != rc) {
        fprintf(stderr, "fuzz: status %d with a bad message (code %d): \"%s\"\n", rc, ghc_error_code(core), msg);
        abort();
    }
}

/* Setup that must work (a seed saved, a run opened): abort with the reason otherwise. */
static void fuzz_must(ghc_core_t *core, int rc, const char *what)
{
    if (rc < 0) {
        fprintf(stderr, "fuzz: %s: %s\n", what, ghc_error_message(core));
        abort();
    }
}

/* FUZZ_SEED_OUT=FILE asks a target to save its own valid input there (seeds.sh): true when
 * it is set, with the path in *path. */
static bool fuzz_seed_out(const char **path)
{
    *path = getenv("FUZZ_SEED_OUT");
    return *path && **path;
}

/* The targets whose setup is a quiet core (`core`) and the private folder define
 * FUZZ_PLAIN_INIT before including this file. */
#ifdef FUZZ_PLAIN_INIT
static ghc_core_t *core __attribute__((unused));
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    core = fuzz_core_init();
    fuzz_dir();
    return 0;
}
#endif

#endif /* GHC_FUZZ_H */
