/* test_cli.c: the gh200core command line as a user meets it: exit codes, one-line errors,
 * the plugins listing, -c with the resolved configuration written once and never over. */
#include <sys/stat.h>

#include <gh200core/gh200core.h>

#include "testutil.h"

/* Run the CLI with `args` in an empty folder of its own (the default output_dir "output" is
 * relative to the working directory: the build tree's, after `make demo`, holds a run); the
 * environment's GHC_PLUGIN_PATH is empty (tests/local.mk). */
static int cli(char **out, const char *fmt, ...) GHC_PRINTF(2, 3);
static int cli(char **out, const char *fmt, ...)
{
    static char *cwd;
    char args[4096], cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    if (!cwd)
        cwd = tu_tmpdir();
    snprintf(cmd, sizeof(cmd), "cd '%s' && '%s' %s", cwd, tu_env("GHC_CLI"), args);
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
    /* the range fixed, a dry run goes on to what the run checks next: this file cannot train */
    ck_assert_int_eq(cli(&out, "-q -n -P '%s' -c %s --set scheduler.micro_batches=2", tu_env("GHC_BUILD_PLUGINS"), cfg), 3);
    expect_one_error(out, "train: the configuration has no `model` section");
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

    /* a plugin whose init fails (with a message over three lines): exit 4, one line */
    cfg = tu_write(dir, "init.cfg", "scheduler = { plugin = \"initfail\"; };\n");
    ck_assert_int_eq(cli(&out, "-n -P '%s' -c %s", tu_env("GHC_TEST_BADPLUGINS"), cfg), 4);
    expect_one_error(out, "ghc_initfail.so: ghc_plugin_initfail: init failed: cannot start: no widget "
                     "attached; tried /dev/widget0; tried /dev/widget1\n");
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
                                       "undeclared", "noregister", "initfail", "undef", "tinysym" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        char want[256];
        snprintf(want, sizeof(want), "gh200core: error: %s/ghc_%s.so: ", tu_env("GHC_TEST_BADPLUGINS"), bad[i]);
        ck_assert_msg(strstr(out, want), "no error line for %s: %s", bad[i], out);
    }
    ck_assert_msg(strstr(out, "12 plugin files failed to load"), "%s", out);
    free(out);
}
END_TEST

/* The smallest training run: the tiny model, a LoRA, AdamW, one step on a 2-sample demo set. */
#define TINY_RUN "model = { plugin = \"wan22\"; dtype = \"f32\"; device = -1; random = { dim = 64; ffn_dim = 128; " \
                 "heads = 2; layers = 1; in_channels = 16; out_channels = 16; text_dim = 32; freq_dim = 64; }; };\n" \
                 "network = { plugin = \"lycoris\"; rank = 2; };\noptimizer = { plugin = \"adamw\"; };\n" \
                 "demo = { samples = 2; height = 4; width = 4; text_len = 4; text_dim = 32; };\n" \
                 "train = { steps = 1; tensorboard = false; };\n"

/* Where plugins may come from: -P '' (which loaded from /) is refused; a config's folder in
 * plugin_path that holds a plugin of a name found later on the path says which file shadows
 * which, and is refused when others can write it. */
START_TEST(plugin_locations)
{
    char *dir = tu_tmpdir(), *out, *cfg, cmd[8400], want[8400];
    ck_assert_int_eq(chmod(dir, 0700), 0);
    ck_assert_int_eq(cli(&out, "-P '' plugins"), 4);
    expect_one_error(out, "plugins: search path entry '' is not an absolute folder");
    free(out);
    cfg = tu_write(dir, "empty.cfg", "plugin_path = [\"\"];\n");
    ck_assert_int_eq(cli(&out, "-c '%s' plugins", cfg), 3);
    expect_one_error(out, "empty.cfg:1: plugin_path[0] is empty (a folder expected)");
    free(out);
    free(cfg);

    snprintf(cmd, sizeof(cmd), "cp '%s/ghc_good.so' '%s/' && chmod 0755 '%s/ghc_good.so'", tu_env("GHC_TEST_PLUGINS"),
             dir, dir);
    ck_assert_int_eq(system(cmd), 0);
    cfg = tu_write(dir, "t.cfg", "plugin_path = [\".\"];\nscheduler = { plugin = \"good\"; };\n"
                   "mempolicy = { plugin = \"host\"; };\n" TINY_RUN);
    snprintf(want, sizeof(want), "gh200core: warn: plugins: %s/ghc_good.so shadows %s/ghc_good.so (the same plugin "
             "name 'good'; the first on the search path is loaded)\n", dir, tu_env("GHC_TEST_PLUGINS"));
    for (int listing = 0; listing < 2; listing++) {
        snprintf(cmd, sizeof(cmd), "GHC_PLUGIN_PATH='%s:%s' '%s' -c '%s' %s", tu_env("GHC_TEST_PLUGINS"),
                 tu_env("GHC_BUILD_PLUGINS"), tu_env("GHC_CLI"), cfg, listing ? "plugins" : "-n --set output_dir=/nowhere/run");
        ck_assert_int_eq(tu_run(cmd, &out), 0);
        ck_assert_msg(strstr(out, want), "%s", out);
        free(out);
    }
    ck_assert_int_eq(chmod(dir, 0770), 0);
    snprintf(cmd, sizeof(cmd), "GHC_PLUGIN_PATH='%s' '%s' -q -c '%s' -n --set output_dir=/nowhere/run",
             tu_env("GHC_BUILD_PLUGINS"), tu_env("GHC_CLI"), cfg);
    ck_assert_int_eq(tu_run(cmd, &out), 4);
    snprintf(want, sizeof(want), "%s/ghc_good.so: refused: its folder %s is writable by group or others", dir, dir);
    expect_one_error(out, want);
    free(out);
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

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

/* A folder's entries, sorted, one per line ("" when it does not exist): to compare it before
 * and after a run. */
static char *listing(const char *dir)
{
    char cmd[4400], *out;
    snprintf(cmd, sizeof(cmd), "ls -A '%s' 2>/dev/null | sort", dir);
    tu_run(cmd, &out);
    return out;
}

START_TEST(errors_found_before_writing)
{
    /* errors of the train and data sections: found before output_dir is touched, and by
     * --dry-run too, with the same message and exit status */
    static const struct { const char *text, *what; int status; } bad[] = {
        { "train = { steps = 1; tensorbord = false; };\n", "train: unknown key 'tensorbord' (did you mean 'tensorboard'?)", 3 },
        { "train = { steps = 1; };\ndata = { datasets = ( { path = \"no/such/folder\"; } ); };\n", "no/such/folder", 0 },
    };
    char *dir = tu_tmpdir(), *out, *out2, *cfg, run[4200];
    snprintf(run, sizeof(run), "%s/run", dir);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char text[4096];
        snprintf(text, sizeof(text), "mempolicy = { plugin = \"host\"; };\n"
                 "model = { plugin = \"wan22\"; dtype = \"f32\"; device = -1; random = { dim = 64; ffn_dim = 128; "
                 "heads = 2; layers = 1; in_channels = 16; out_channels = 16; text_dim = 32; freq_dim = 64; }; };\n"
                 "network = { plugin = \"lycoris\"; rank = 2; };\noptimizer = { plugin = \"adamw\"; };\n%s", bad[i].text);
        cfg = tu_write(dir, "bad.cfg", text);
        int st = cli(&out, "-P '%s' -c %s --set output_dir='%s'", tu_env("GHC_BUILD_PLUGINS"), cfg, run);
        ck_assert_msg(st != 0 && (!bad[i].status || st == bad[i].status), "exit %d: %s", st, out);
        ck_assert_msg(strstr(out, bad[i].what), "lacks '%s': %s", bad[i].what, out);
        char *l = listing(run);
        ck_assert_msg(!*l, "the failed run wrote into %s: %s", run, l);
        free(l);
        ck_assert_int_eq(cli(&out2, "-q -n -P '%s' -c %s --set output_dir='%s'", tu_env("GHC_BUILD_PLUGINS"), cfg, run), st);
        expect_one_error(out2, bad[i].what);
        free(out);
        free(out2);
        free(cfg);
    }
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(failed_run_leaves_folder)
{
    char *dir = tu_tmpdir(), *out, run[4200], p[4400];
    struct stat st;
    snprintf(run, sizeof(run), "%s/run", dir);
    /* a planted strength of 1e38 makes the demo's latents non-finite: the first batch names the
     * file and the run stops before its first checkpoint, taking back what it wrote
     * (resolved.cfg, metrics, the demo's data, the folder it made) */
    char *cfg = tu_write(dir, "nan.cfg", "mempolicy = { plugin = \"host\"; };\nscheduler = { plugin = \"constant\"; };\n"
                         TINY_RUN);
#define NAN_RUN "--set demo.strength=1e38 --set train.max_bad_steps=2 --set train.steps=4"
    ck_assert_int_eq(cli(&out, "-q -P '%s' -c %s --set output_dir='%s' " NAN_RUN, tu_env("GHC_BUILD_PLUGINS"), cfg, run), 5);
    expect_one_error(out, "(a non-finite value)");
    free(out);
    ck_assert_int_ne(stat(run, &st), 0);
    /* a folder that holds the user's file is refused, naming it (it used to be written into) */
    ck_assert_int_eq(mkdir(run, 0777), 0);
    char *keep = tu_write(run, "notes.txt", "mine\n"), *before = listing(run), *after;
    ck_assert_int_eq(cli(&out, "-q -P '%s' -c %s --set output_dir='%s' " NAN_RUN, tu_env("GHC_BUILD_PLUGINS"), cfg, run), 6);
    snprintf(p, sizeof(p), "output_dir '%s' is not empty: it holds notes.txt; choose another folder", run);
    expect_one_error(out, p);
    free(out);
    /* with --overwrite it runs; failing, it leaves the folder as it was */
    ck_assert_int_eq(cli(&out, "-q -P '%s' -c %s --set output_dir='%s' --overwrite " NAN_RUN, tu_env("GHC_BUILD_PLUGINS"),
                         cfg, run), 5);
    free(out);
    after = listing(run);
    ck_assert_str_eq(after, before);
    free(after);
    /* and the next run into it with --overwrite is not refused; the user's file stays */
    ck_assert_int_eq(cli(&out, "-q -P '%s' -c %s --set output_dir='%s' --set train.steps=4 --overwrite",
                         tu_env("GHC_BUILD_PLUGINS"), cfg, run), 0);
    free(out);
    snprintf(p, sizeof(p), "%s/checkpoint-4", run);
    ck_assert_int_eq(stat(p, &st), 0);
    ck_assert_int_eq(stat(keep, &st), 0);
    /* a folder that holds a run is refused, the message naming a checkpoint that exists */
    snprintf(p, sizeof(p), "%s/checkpoint-2", run);
    ck_assert_int_eq(mkdir(p, 0777), 0);
    ck_assert_int_eq(cli(&out, "-q -n -P '%s' -c %s --set output_dir='%s'", tu_env("GHC_BUILD_PLUGINS"), cfg, run), 6);
    snprintf(p, sizeof(p), "continue it with --resume %s/checkpoint-4 ", run);
    expect_one_error(out, p);
    free(out);
    /* one without a checkpoint (killed before its first): says so, and how to start over */
    snprintf(p, sizeof(p), "rm -r '%s'/checkpoint-*", run);
    ck_assert_int_eq(system(p), 0);
    ck_assert_int_eq(cli(&out, "-q -P '%s' -c %s --set output_dir='%s'", tu_env("GHC_BUILD_PLUGINS"), cfg, run), 6);
    expect_one_error(out, "left no checkpoint");
    ck_assert_msg(strstr(out, "rm -r") && !strstr(out, "checkpoint-N"), "%s", out);
    free(out);
    free(keep);
    free(before);
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* File names with a line break, an escape sequence and a byte that is not UTF-8: every error
 * line shows them escaped (\n, \x1b, \xff), one line, whatever the file is. */
#define ODD "odd\n\x1b[31m\xff"
#define ODD_SHOWN "odd\\n\\x1b[31m\\xff"
START_TEST(odd_file_names_escaped)
{
    char *dir = tu_tmpdir(), *out, *f, want[4400];
    /* a configuration, a safetensors file */
    static const struct { const char *suffix, *text, *command; int code; const char *what; } cases[] = {
        { ".cfg", "seed = ;\n", "-c", 3, ":1: syntax error" },
        { ".safetensors", "abc", "inspect", 5, ": file is 3 bytes" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        snprintf(want, sizeof(want), ODD "%s", cases[i].suffix);
        f = tu_write(dir, want, cases[i].text);
        ck_assert_int_eq(cli(&out, "%s '%s'", cases[i].command, f), cases[i].code);
        snprintf(want, sizeof(want), "%s/" ODD_SHOWN "%s%s", dir, cases[i].suffix, cases[i].what);
        expect_one_error(out, want);
        free(out);
        free(f);
    }
    /* dataset: a sample whose latent is not a safetensors file */
    char sub[4400];
    snprintf(sub, sizeof(sub), "%s/data", dir);
    ck_assert_int_eq(mkdir(sub, 0700), 0);
    free(tu_write(sub, ODD ".latent.safetensors", "abc"));
    free(tu_write(sub, ODD ".text.safetensors", "abc"));
    f = tu_write(dir, "data.cfg", "mempolicy = { plugin = \"host\"; };\nscheduler = { plugin = \"constant\"; };\n"
                 "model = { plugin = \"wan22\"; dtype = \"f32\"; device = -1; random = { dim = 64; ffn_dim = 128; "
                 "heads = 2; layers = 1; in_channels = 16; out_channels = 16; text_dim = 32; freq_dim = 64; }; };\n"
                 "network = { plugin = \"lycoris\"; rank = 2; };\noptimizer = { plugin = \"adamw\"; };\n"
                 "data = { datasets = ( { path = \"data\"; } ); };\ntrain = { steps = 1; };\n");
    ck_assert_int_eq(cli(&out, "-q -n -P '%s' -c '%s' --set output_dir='%s/run'", tu_env("GHC_BUILD_PLUGINS"), f,
                         dir), 5);
    snprintf(want, sizeof(want), "data: %s/data/" ODD_SHOWN ".latent.safetensors: file is 3 bytes", dir);
    expect_one_error(out, want);
    free(out);
    free(f);
    /* a plugin file in a folder of that name */
    snprintf(sub, sizeof(sub), "%s/" ODD, dir);
    ck_assert_int_eq(mkdir(sub, 0700), 0);
    f = tu_write(sub, "ghc_junk.so", "not an ELF file\n");
    ck_assert_int_eq(chmod(f, 0600), 0);
    ck_assert_int_eq(cli(&out, "-P '%s' plugins", sub), 4);
    snprintf(want, sizeof(want), "gh200core: error: %s/" ODD_SHOWN "/ghc_junk.so: cannot load: ", dir);
    ck_assert_msg(strstr(out, want) && !strchr(out, '\x1b') && !strchr(out, '\xff'), "%s", out);
    free(out);
    free(f);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(data_checked_against_model)
{
    /* a dataset that does not fit the model: found at the start, by --dry-run too, the message
     * naming the sample's file and the setting behind the model's number */
    char *dir = tu_tmpdir(), *out, p[4400];
    struct stat st;
    char *gen = tu_write(dir, "gen.cfg", "mempolicy = { plugin = \"host\"; };\nscheduler = { plugin = \"constant\"; };\n"
                         TINY_RUN);
    ck_assert_int_eq(cli(&out, "-q -P '%s' -c %s --set output_dir='%s/gen'", tu_env("GHC_BUILD_PLUGINS"), gen, dir), 0);
    free(out);
    char text[4096];
    snprintf(text, sizeof(text), "mempolicy = { plugin = \"host\"; };\n"
             "model = { plugin = \"wan22\"; dtype = \"f32\"; device = -1;\n"
             "  random = { dim = 64; ffn_dim = 128; heads = 2; layers = 1; in_channels = 16; out_channels = 16;\n"
             "             text_dim = 48; freq_dim = 64; }; };\n"
             "network = { plugin = \"lycoris\"; rank = 2; };\noptimizer = { plugin = \"adamw\"; };\n"
             "data = { batch_size = 2; datasets = ( { path = \"gen/demo-data\"; } ); };\ntrain = { steps = 1; };\n");
    char *cfg = tu_write(dir, "t.cfg", text);
    for (int dry = 0; dry < 2; dry++) {
        ck_assert_int_eq(cli(&out, "-q %s -P '%s' -c %s --set output_dir='%s/run'", dry ? "-n" : "",
                             tu_env("GHC_BUILD_PLUGINS"), cfg, dir), 3);
        snprintf(p, sizeof(p), "data: %s/gen/demo-data/sample0000.text.safetensors: the text embedding is [4, 32], 32 "
                 "wide; the model's text width is 48 (model.random.text_dim at %s:4); and 1 more sample that does not "
                 "fit", dir, cfg);
        expect_one_error(out, p);
        free(out);
        snprintf(p, sizeof(p), "%s/run", dir);
        ck_assert_int_ne(stat(p, &st), 0);
    }
    ck_assert_int_eq(cli(&out, "-q -n -P '%s' -c %s --set model.random.text_dim=32 --set model.random.in_channels=32 "
                         "--set model.random.out_channels=32 --set output_dir='%s/run'", tu_env("GHC_BUILD_PLUGINS"),
                         cfg, dir), 3);
    snprintf(p, sizeof(p), "sample0000.latent.safetensors: the latent [16, 1, 4, 4] has 16 channels; the model takes 32 "
             "(--set model.random.in_channels)");
    expect_one_error(out, p);
    free(out);
    /* the demo's shapes, before its data is generated */
    ck_assert_int_eq(cli(&out, "-q -n -P '%s' -c %s --set demo.text_dim=64 --set output_dir='%s/run'",
                         tu_env("GHC_BUILD_PLUGINS"), gen, dir), 3);
    expect_one_error(out, "--set demo.text_dim: demo.text_dim = 64: the model's text width is 32 (model.random.text_dim at ");
    free(out);
    ck_assert_int_eq(cli(&out, "-q -n -P '%s' -c %s --set demo.height=5 --set output_dir='%s/run'",
                         tu_env("GHC_BUILD_PLUGINS"), gen, dir), 3);
    expect_one_error(out, "demo.height = 5: the model takes multiples of 2 (Wan2.2's patches of 1 x 2 x 2");
    free(out);
    free(gen);
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(output_dir_rule)
{
    /* a relative path written in the file (output_dir, model.checkpoint) is relative to the
     * file's folder; one given with --set relative to the working directory */
    char *dir = tu_tmpdir(), *out, cmd[8192], p[4400];
    struct stat st;
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s/conf' '%s/cwd'", dir, dir);
    ck_assert_int_eq(system(cmd), 0);
    char *cfg = tu_write(dir, "conf/t.cfg", "output_dir = \"runs/a\";\nmempolicy = { plugin = \"host\"; };\n"
                         "scheduler = { plugin = \"constant\"; };\n" TINY_RUN);
    snprintf(cmd, sizeof(cmd), "cd '%s/cwd' && '%s' -q -P '%s' -c ../conf/t.cfg", dir, tu_env("GHC_CLI"),
             tu_env("GHC_BUILD_PLUGINS"));
    ck_assert_int_eq(tu_run(cmd, &out), 0);
    free(out);
    snprintf(p, sizeof(p), "%s/conf/runs/a/checkpoint-1", dir);
    ck_assert_msg(stat(p, &st) == 0, "no %s", p);
    snprintf(cmd, sizeof(cmd), "cd '%s/cwd' && '%s' -q -P '%s' -c ../conf/t.cfg --set output_dir=runs/b", dir,
             tu_env("GHC_CLI"), tu_env("GHC_BUILD_PLUGINS"));
    ck_assert_int_eq(tu_run(cmd, &out), 0);
    free(out);
    snprintf(p, sizeof(p), "%s/cwd/runs/b/checkpoint-1", dir);
    ck_assert_msg(stat(p, &st) == 0, "no %s", p);
    /* resolved.cfg names the folder absolutely, so that it means the same from anywhere */
    snprintf(cmd, sizeof(cmd), "grep '^output_dir' '%s/cwd/runs/b/resolved.cfg'", dir);
    ck_assert_int_eq(tu_run(cmd, &out), 0);
    snprintf(p, sizeof(p), "output_dir = \"%s/cwd/runs/b\";\n", dir);
    ck_assert_str_eq(out, p);
    free(out);
    /* the same for the model's checkpoint (a 1-block Wan of the tiny shape) */
    snprintf(cmd, sizeof(cmd), "ln -s '%s/tests/fixtures/wan22/weights_official.safetensors' '%s/conf/w.safetensors'",
             tu_env("GHC_TOP_SRCDIR"), dir);
    ck_assert_int_eq(system(cmd), 0);
    char *ck = tu_write(dir, "conf/c.cfg", "mempolicy = { plugin = \"host\"; };\n"
                        "model = { plugin = \"wan22\"; checkpoint = \"w.safetensors\"; heads = 2; dtype = \"f32\"; device = -1; };\n"
                        "network = { plugin = \"lycoris\"; rank = 2; };\noptimizer = { plugin = \"adamw\"; };\n"
                        "demo = { samples = 2; height = 4; width = 4; text_len = 4; text_dim = 32; };\n"
                        "train = { steps = 1; tensorboard = false; };\n");
    snprintf(cmd, sizeof(cmd), "cd '%s/cwd' && '%s' -q -n -P '%s' -c ../conf/c.cfg", dir, tu_env("GHC_CLI"),
             tu_env("GHC_BUILD_PLUGINS"));
    ck_assert_msg(tu_run(cmd, &out) == 0, "%s", out);
    free(out);
    /* and a mismatch names the checkpoint with the key and line that chose it */
    snprintf(cmd, sizeof(cmd), "cd '%s/cwd' && '%s' -q -n -P '%s' -c ../conf/c.cfg --set demo.text_dim=48", dir,
             tu_env("GHC_CLI"), tu_env("GHC_BUILD_PLUGINS"));
    ck_assert_int_eq(tu_run(cmd, &out), 3);
    snprintf(p, sizeof(p), "the model's text width is 32 (text_embedding.0.weight of the checkpoint %s/conf/w.safetensors "
             "(model.checkpoint at ../conf/c.cfg:2))", dir);
    expect_one_error(out, p);
    free(out);
    free(ck);
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(diag_without_gpu)
{
    /* the CUDA runtime's "driver version is insufficient" on a machine without a driver, and
     * its other no-GPU answers, as lines that say what is missing */
    static const struct { const char *driver, *want; } cases[] = {
        { "0", "no NVIDIA driver is installed (libcuda.so.1 not found): this machine has no usable GPU" },
        { "12020", "the NVIDIA driver supports CUDA 12.2, older than the runtime's 12.8" },
        { "12080", "no NVIDIA GPU is visible (driver for CUDA 12.8 loaded)" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char cmd[8192], *out;
        snprintf(cmd, sizeof(cmd), "GHC_FAKE_CUDA_DRIVER=%s '%s' diag -P '%s/tests/diagplugins/.libs' --skip-allocation",
                 cases[i].driver, tu_env("GHC_CLI"), tu_env("GHC_TOP_BUILDDIR"));
        ck_assert_int_eq(tu_run(cmd, &out), 1);
        ck_assert_msg(strstr(out, "FAIL devices") && strstr(out, cases[i].want), "lacks '%s': %s", cases[i].want, out);
        ck_assert_msg(!strstr(out, "insufficient"), "%s", out);
        free(out);
    }
}
END_TEST

/* `plugins --keys`: each key with its default and range, nested groups as GROUP.KEY, and the
 * `validation` section with the keys of `data`. */
START_TEST(plugins_keys_listing)
{
    char *out;
    ck_assert_int_eq(cli(&out, "plugins --keys -P '%s'", tu_env("GHC_BUILD_PLUGINS")), 0);
    static const char *const want[] = {
        "SECTION    NAME             KEY                              TYPE   DEFAULT    RANGE\n",
        "\ntrain      -                steps                            int    100        1 to 2^40\n",
        "\ntrain      -                mode                             string \"single\"   single, separate, shared\n",
        "\nmodel      wan22            random                           group  -          -\n",
        "\nmodel      wan22            random.dim                       int    256        2 to 65536\n",
        "\nvalidation -                batch_size                       int    1          1 to 2^20\n",
        "\nvalidation datasets         repeats                          int    1          1 to 1000000\n",
        "\noptimizer  adamw            lr                               float  1e-3       0 to 1e3\n",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(*want); i++)
        ck_assert_msg(strstr(out, want[i]), "lacks '%s':\n%s", want[i], out);
    free(out);
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
    tcase_add_test(tc, plugin_locations);
    tcase_add_test(tc, train_writes_resolved_once);
    tcase_add_test(tc, resolved_reruns_elsewhere);
    tcase_add_test(tc, errors_found_before_writing);
    tcase_add_test(tc, failed_run_leaves_folder);
    tcase_add_test(tc, data_checked_against_model);
    tcase_add_test(tc, odd_file_names_escaped);
    tcase_add_test(tc, output_dir_rule);
    tcase_add_test(tc, diag_without_gpu);
    tcase_add_test(tc, plugins_keys_listing);
    suite_add_tcase(s, tc);
    return tu_run_suite(s, false);
}
