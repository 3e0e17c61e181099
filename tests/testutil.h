/* testutil.h: helpers shared by the Check suites: environment paths, temporary files, and
 * running the CLI with its exit status and output captured. Header-only on purpose: static
 * functions, one copy per test program. */
#ifndef GHC_TESTUTIL_H
#define GHC_TESTUTIL_H

#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gh200core/run.h>
#include <gh200core/safetensors.h>

/* An environment variable the test harness sets (tests/local.mk); fails the test if unset. */
static inline const char *tu_env(const char *name)
{
    const char *v = getenv(name);
    ck_assert_msg(v != NULL, "%s is not set: run through `make check`", name);
    return v;
}

/* The path of tests/fixtures/<dir>/<name> in the source tree; the caller frees it. */
static inline char *tu_fixture(const char *dir, const char *name)
{
    char *p = malloc(1024);
    ck_assert_ptr_nonnull(p);
    snprintf(p, 1024, "%s/tests/fixtures/%s/%s", tu_env("GHC_TOP_SRCDIR"), dir, name);
    return p;
}

/* Tensor `name` of the fixture file tests/fixtures/<dir>/<file> as f32 on the CPU (the test
 * fails where it cannot be read); the caller frees it. */
static inline ghc_tensor_t *tu_fixture_tensor(ghc_core_t *core, const char *dir, const char *file, const char *name)
{
    char *path = tu_fixture(dir, file);
    ghc_st_t *st = ghc_st_open(core, path);
    ck_assert_msg(st != NULL, "%s", ghc_error_message(core));
    ghc_tensor_t *t = ghc_st_load(st, name, GHC_DTYPE_F32, GHC_ROLE_WORKSPACE);
    ck_assert_msg(t != NULL, "%s: %s", path, ghc_error_message(core));
    ghc_st_free(st);
    free(path);
    return t;
}

/* Fill host f32 t with pixel-like levels, exact in f32: element i is (l - 128) / 128, l the top
 * byte of (i * 2654435761) mod 2^32 (the clip of tests/fixtures/wanvae/case22_tiled, which
 * make_wanvae_fixtures.py's video22() makes the same way instead of storing it). Returns t. */
static inline ghc_tensor_t *tu_fill_levels(ghc_tensor_t *t)
{
    for (int64_t i = 0; i < ghc_tensor_numel(t); i++)
        ((float *)ghc_tensor_data(t))[i] = ((float)(((uint32_t)i * 2654435761u) >> 24) - 128.0f) / 128.0f;
    return t;
}

/* A fresh temporary folder; the caller frees the string. */
static inline char *tu_tmpdir(void)
{
    char *d = strdup("/tmp/ghc-test-XXXXXX");
    ck_assert_ptr_nonnull(d);
    ck_assert_ptr_nonnull(mkdtemp(d));
    return d;
}

/* Write `text` to dir/name; returns the path (caller frees). */
static inline char *tu_write(const char *dir, const char *name, const char *text)
{
    char *path = malloc(strlen(dir) + strlen(name) + 2);
    ck_assert_ptr_nonnull(path);
    sprintf(path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
    return path;
}

static inline void tu_rm_rf(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* Run a shell command line; stdout and stderr land in *out (caller frees). Returns the
 * exit status, or 128 + signal when killed (a crash is never a pass). */
static inline int tu_run(const char *cmdline, char **out)
{
    char cmd[8192];
    snprintf(cmd, sizeof(cmd), "%s 2>&1", cmdline);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    size_t n;
    while ((n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += n;
        if (cap - len < 1024) {
            cap *= 2;
            buf = realloc(buf, cap);
            ck_assert_ptr_nonnull(buf);
        }
    }
    buf[len] = '\0';
    int st = pclose(p);
    *out = buf;
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return WEXITSTATUS(st);
}

/* Number of lines in s: newlines, plus one for an unterminated last line. */
static inline int tu_lines(const char *s)
{
    int n = 0;
    size_t len = strlen(s);
    for (size_t i = 0; i < len; i++)
        n += s[i] == '\n';
    return n + (len && s[len - 1] != '\n');
}

/* The shape and dtype of tensor `name` in the safetensors file `path` as "[a, b, ...] DTYPE",
 * or "absent" (no such file or tensor). Static buffer: valid until the next call. */
static inline const char *tu_st_shape(const char *path, const char *name)
{
    static char buf[128];
    ghc_core_t *core = ghc_core_init();
    ghc_st_t *st = ghc_st_open(core, path);
    struct ghc_st_info in;
    snprintf(buf, sizeof(buf), "absent");
    if (st && ghc_st_find(st, name, &in)) {
        size_t n = (size_t)snprintf(buf, sizeof(buf), "[");
        for (int i = 0; i < in.ndim; i++)
            n += (size_t)snprintf(buf + n, sizeof(buf) - n, "%s%lld", i ? ", " : "", (long long)in.shape[i]);
        snprintf(buf + n, sizeof(buf) - n, "] %s", ghc_dtype_name(in.dtype));
    }
    ghc_st_free(st);
    ghc_core_free(core);
    return buf;
}

/* A core whose run has the `device` memory policy (CUDA tensors), the plugin found through
 * GHC_BUILD_PLUGINS. NULL, with the reason on stderr, when that fails. */
static inline ghc_core_t *tu_device_core(void)
{
    const char *plugins = getenv("GHC_BUILD_PLUGINS");
    if (!plugins) {
        fprintf(stderr, "GHC_BUILD_PLUGINS is not set: run through `make check`\n");
        return NULL;
    }
    ghc_core_t *core = ghc_core_init();
    if (!core || ghc_plugin_add_path(core, plugins) ||
        ghc_config_load_string(core, "mempolicy = { plugin = \"device\"; };", "t.cfg", NULL, NULL, 0) ||
        ghc_run_init(core)) {
        fprintf(stderr, "setup: %s\n", core ? ghc_error_message(core) : "no core");
        ghc_core_free(core);
        return NULL;
    }
    return core;
}

/* The "loss" of each line of a metrics.jsonl into v (at most n); their number. every: each
 * line must have one (else lines without are skipped). */
static inline int tu_losses(const char *path, double *v, int n, bool every)
{
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "%s", path);
    char line[4096];
    int k = 0;
    while (k < n && fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, "\"loss\":");
        ck_assert_msg(p != NULL || !every, "%s: %s", path, line);
        if (p)
            v[k++] = strtod(p + 7, NULL);
    }
    fclose(f);
    return k;
}

/* Run a suite; returns the program's exit status. nofork: run in-process (CUDA suites:
 * CUDA does not survive fork()). */
static inline int tu_run_suite(Suite *s, bool nofork)
{
    SRunner *sr = srunner_create(s);
    if (nofork)
        srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif /* GHC_TESTUTIL_H */
