/* test_cli.c: the gh200core command line as a user meets it: exit codes, one-line errors,
 * the plugins listing, -c with the resolved configuration written once and never over. */
#include <sys/stat.h>

#include <gh200core/gh200core.h>

#include "testutil.h"

/* Run the CLI with `args`; the environment's GHC_PLUGIN_PATH is empty (tests/local.mk). */
static int cli(char **out, const char *fmt, ...) GHC_PRINTF(2, 3);
static int cli(char **out, const char *fmt, ...)
{
    char args[4096], cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof(cmd), "'%s' %s", tu_env("GHC_CLI"), args);
    return tu_run(cmd, out);
}

/* An error run: exactly one line, "gh200core: error: ...", containing `what`. */
static void expect_one_error(const char *out, const char *what)
{
    ck_assert_msg(strncmp(out, "gh200core: error: ", 18) == 0, "output: %s", out);
    ck_assert_msg(tu_lines(out) == 1, "not one line: %s", out);
    ck_assert_msg(strstr(out, what) != NULL, "lacks '%s': %s", what, out);
}

START_TEST(version_and_help)
{
    char *out;
    ck_assert_int_eq(cli(&out, "--version"), 0);
    char want[128];
    snprintf(want, sizeof(want), "gh200core %s (API %d, plugin ABI %d)\n", GHC_VERSION, GHC_API_VERSION,
             GHC_PLUGIN_ABI);
    ck_assert_str_eq(out, want);
    free(out);
    ck_assert_int_eq(cli(&out, "-h"), 0);
    ck_assert_msg(strstr(out, "usage: gh200core") && strstr(out, "--set KEY=VALUE") &&
                  strstr(out, "exit status: 0 success"), "%s", out);
    free(out);
}
END_TEST

START_TEST(usage_errors)
{
    char *out;
    ck_assert_int_eq(cli(&out, "%s", ""), 2);
    ck_assert_msg(strstr(out, "nothing to do"), "%s", out);
    free(out);
    ck_assert_int_eq(cli(&out, "--no-such-option"), 2);
    free(out);
    ck_assert_int_eq(cli(&out, "frobnicate"), 2);
    ck_assert_msg(strstr(out, "unknown command 'frobnicate'"), "%s", out);
    free(out);
    ck_assert_int_eq(cli(&out, "plugins extra"), 2);
    free(out);
    ck_assert_int_eq(cli(&out, "-c"), 2);
    free(out);
    ck_assert_int_eq(cli(&out, "--set a=1 plugins"), 2);
    ck_assert_msg(strstr(out, "--set needs a configuration"), "%s", out);
    free(out);
}
END_TEST

START_TEST(config_errors)
{
    char *dir = tu_tmpdir(), *out, *cfg;
    ck_assert_int_eq(cli(&out, "-c %s/absent.cfg", dir), 5);
    expect_one_error(out, "absent.cfg: cannot read the configuration");
    free(out);

    cfg = tu_write(dir, "syntax.cfg", "seed = 1;\nscheduler = { plugin = ; };\n");
    ck_assert_int_eq(cli(&out, "-c %s", cfg), 3);
    expect_one_error(out, "syntax.cfg:2: syntax error");
    free(out);
    free(cfg);

    cfg = tu_write(dir, "unknown.cfg", "seed = 1;\nscheduler = {\n  plugin = \"constant\";\n  warmup_step = 3;\n};\n");
    ck_assert_int_eq(cli(&out, "-P '%s' -c %s", tu_env("GHC_BUILD_PLUGINS"), cfg), 3);
    expect_one_error(out, "unknown.cfg:4: scheduler \"constant\": unknown key 'warmup_step' (did you mean 'warmup_steps'?)");
    free(out);
    ck_assert_int_eq(cli(&out, "-P '%s' -c %s --set scheduler.warmup_step=-1", tu_env("GHC_BUILD_PLUGINS"), cfg), 3);
    free(out);
    free(cfg);

    cfg = tu_write(dir, "range.cfg", "scheduler = {\n  plugin = \"constant\";\n  micro_batches = 0;\n};\n");
    ck_assert_int_eq(cli(&out, "-P '%s' -c %s", tu_env("GHC_BUILD_PLUGINS"), cfg), 3);
    expect_one_error(out, "range.cfg:3: scheduler.micro_batches = 0 is out of range [1, 65536]");
    free(out);
    ck_assert_int_eq(cli(&out, "-q -n -P '%s' -c %s --set scheduler.micro_batches=2", tu_env("GHC_BUILD_PLUGINS"), cfg), 0);
    ck_assert_str_eq(out, "");
    free(out);
    ck_assert_int_eq(cli(&out, "-P '%s' -c %s -s scheduler.micro_batches=x", tu_env("GHC_BUILD_PLUGINS"), cfg), 3);
    expect_one_error(out, "--set scheduler.micro_batches: scheduler \"constant\": key 'micro_batches' must be an integer, got a string");
    free(out);
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(plugin_errors)
{
    char *dir = tu_tmpdir(), *out, *cfg;
    cfg = tu_write(dir, "missing.cfg", "optimizer = { plugin = \"nosuch\"; };\n");
    ck_assert_int_eq(cli(&out, "-c %s", cfg), 4);
    expect_one_error(out, "missing.cfg:1: optimizer: plugin 'nosuch': ghc_nosuch.so not found in:");
    free(out);
    free(cfg);

    cfg = tu_write(dir, "abi.cfg", "\nscheduler = { plugin = \"badabi\"; };\n");
    ck_assert_int_eq(cli(&out, "-P '%s' -c %s", tu_env("GHC_TEST_BADPLUGINS"), cfg), 4);
    expect_one_error(out, "abi.cfg:2: scheduler: ");
    ck_assert_msg(strstr(out, "ghc_badabi.so: ghc_plugin_badabi: plugin ABI 99"), "%s", out);
    free(out);
    free(cfg);

    cfg = tu_write(dir, "kind.cfg", "model = { plugin = \"good\"; };\n");
    ck_assert_int_eq(cli(&out, "-P '%s' -c %s", tu_env("GHC_TEST_PLUGINS"), cfg), 4);
    expect_one_error(out, "kind.cfg:1: model: plugin 'good'");
    ck_assert_msg(strstr(out, "provides scheduler, not model 'good'"), "%s", out);
    free(out);
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(plugins_listing)
{
    char *out;
    ck_assert_int_eq(cli(&out, "plugins -P '%s'", tu_env("GHC_BUILD_PLUGINS")), 0);
    ck_assert_msg(strstr(out, "KIND") && strstr(out, "mempolicy  host") && strstr(out, "scheduler  constant"),
                  "%s", out);
    ck_assert_msg(strstr(out, "ghc_host.so") && strstr(out, "search path: "), "%s", out);
    free(out);

    /* through the environment */
    char cmd[8192];
    snprintf(cmd, sizeof(cmd), "GHC_PLUGIN_PATH='/nowhere:%s' '%s' plugins", tu_env("GHC_TEST_PLUGINS"),
             tu_env("GHC_CLI"));
    ck_assert_int_eq(tu_run(cmd, &out), 0);
    ck_assert_msg(strstr(out, "scheduler  good") && strstr(out, "/nowhere (absent)"), "%s", out);
    free(out);

    /* broken plugins: each reported on its own line, the good ones still listed, exit 4 */
    ck_assert_int_eq(cli(&out, "plugins -P '%s' -P '%s'", tu_env("GHC_TEST_PLUGINS"), tu_env("GHC_TEST_BADPLUGINS")), 4);
    ck_assert_msg(strstr(out, "scheduler  good"), "%s", out);
    static const char *const bad[] = { "badabi", "newapi", "nosym", "badname", "dup", "noreq", "bigops",
                                       "undeclared", "noregister", "initfail", "undef" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        char want[256];
        snprintf(want, sizeof(want), "gh200core: error: %s/ghc_%s.so: ", tu_env("GHC_TEST_BADPLUGINS"), bad[i]);
        ck_assert_msg(strstr(out, want), "no error line for %s: %s", bad[i], out);
    }
    ck_assert_msg(strstr(out, "11 plugin files failed to load"), "%s", out);
    free(out);
}
END_TEST

/* The smallest training run: the tiny model, a LoRA, AdamW, one step on a 2-sample demo set. */
#define TINY_RUN "model = { plugin = \"wan22\"; dtype = \"f32\"; device = -1; random = { dim = 64; ffn_dim = 128; " \
                 "heads = 2; layers = 1; in_channels = 16; out_channels = 16; text_dim = 32; freq_dim = 64; }; };\n" \
                 "network = { plugin = \"lycoris\"; rank = 2; };\noptimizer = { plugin = \"adamw\"; };\n" \
                 "demo = { samples = 2; height = 4; width = 4; text_len = 4; text_dim = 32; };\n" \
                 "train = { steps = 1; tensorboard = false; };\n"

START_TEST(resolved_reruns_elsewhere)
{
    /* plugin_path relative to the config file becomes absolute in resolved.cfg, so that the
     * resolved file, kept in another folder, runs again */
    char *dir = tu_tmpdir(), *out, cmd[8192];
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s/conf' && ln -s '%s' '%s/conf/plugs'", dir, tu_env("GHC_BUILD_PLUGINS"), dir);
    ck_assert_int_eq(system(cmd), 0);
    char *cfg = tu_write(dir, "conf/t.cfg", "plugin_path = [\"plugs\"];\nmempolicy = { plugin = \"host\"; };\n"
                         "scheduler = { plugin = \"constant\"; };\n" TINY_RUN);
    ck_assert_int_eq(cli(&out, "-q -c %s --set output_dir='%s/runs/a/b'", cfg, dir), 0);
    free(out);
    ck_assert_int_eq(cli(&out, "-q -n -c '%s/runs/a/b/resolved.cfg' --set output_dir='%s/runs/c'", dir, dir), 0);
    ck_assert_str_eq(out, "");
    free(out);
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(train_writes_resolved_once)
{
    char *dir = tu_tmpdir(), *out;
    char *inc = tu_write(dir, "common.cfg", "mempolicy = { plugin = \"host\"; };\n");
    char *cfg = tu_write(dir, "t.cfg", "@include \"common.cfg\"\nscheduler = { plugin = \"constant\"; };\n" TINY_RUN);
    char resolved[4200];
    snprintf(resolved, sizeof(resolved), "%s/run/resolved.cfg", dir);

    /* dry run: checks, writes nothing */
    ck_assert_int_eq(cli(&out, "-n -P '%s' -c %s --set output_dir='%s/run'", tu_env("GHC_BUILD_PLUGINS"), cfg, dir), 0);
    ck_assert_msg(strstr(out, "configuration valid, 5 plugins loaded"), "%s", out);
    free(out);
    struct stat st;
    ck_assert_int_ne(stat(resolved, &st), 0);

    ck_assert_int_eq(cli(&out, "-P '%s' -c %s --set output_dir='%s/run' --set scheduler.warmup_steps=5",
                         tu_env("GHC_BUILD_PLUGINS"), cfg, dir), 0);
    free(out);
    ck_assert_int_eq(stat(resolved, &st), 0);
    char cmd[8192];
    snprintf(cmd, sizeof(cmd), "cat '%s'", resolved);
    ck_assert_int_eq(tu_run(cmd, &out), 0);
    ck_assert_msg(strstr(out, "plugin = \"host\"") && strstr(out, "warmup_steps = 5") &&
                  strstr(out, "micro_batches = 1") && strstr(out, "limit_mib = 0"), "%s", out);
    char *first = out;

    /* a second run into the same folder is refused, a dry run too, and the file stays as it was */
    ck_assert_int_eq(cli(&out, "-n -P '%s' -c %s --set output_dir='%s/run'", tu_env("GHC_BUILD_PLUGINS"), cfg, dir), 6);
    free(out);
    ck_assert_int_eq(cli(&out, "-P '%s' -c %s --set output_dir='%s/run'", tu_env("GHC_BUILD_PLUGINS"), cfg, dir), 6);
    ck_assert_msg(strstr(out, "resolved.cfg exists"), "%s", out);
    free(out);
    ck_assert_int_eq(tu_run(cmd, &out), 0);
    ck_assert_str_eq(out, first);
    free(out);
    free(first);

    /* the resolved file runs again as it is */
    ck_assert_int_eq(cli(&out, "-n -P '%s' -c '%s' --set output_dir='%s/run2'", tu_env("GHC_BUILD_PLUGINS"), resolved, dir), 0);
    free(out);
    free(inc);
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cli");
    TCase *tc = tcase_create("cli");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, version_and_help);
    tcase_add_test(tc, usage_errors);
    tcase_add_test(tc, config_errors);
    tcase_add_test(tc, plugin_errors);
    tcase_add_test(tc, plugins_listing);
    tcase_add_test(tc, train_writes_resolved_once);
    tcase_add_test(tc, resolved_reruns_elsewhere);
    suite_add_tcase(s, tc);
    return tu_run_suite(s, false);
}
