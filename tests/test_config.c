/* test_config.c: the configuration: typed getters with defaults and bounds, wrong types,
 * unknown keys with file:line and "did you mean", syntax errors, --set overrides (values,
 * types, new groups, their own locations), @include, and the resolved file written out; lists
 * of groups and the setters. */
#include <sys/stat.h>

#include <gh200core/gh200core.h>

#include "testutil.h"

static ghc_core_t *load_text(const char *text, int want, const char *const *sets, int n)
{
    ghc_core_t *core = ghc_core_init();
    int rc = ghc_config_load_string(core, text, "t.cfg", NULL, sets, n);
    ck_assert_msg(rc == want, "rc %d, want %d: %s", rc, want, ghc_error_message(core));
    return core;
}

static void expect_msg(ghc_core_t *core, const char *what)
{
    const char *msg = ghc_error_message(core);
    ck_assert_msg(strstr(msg, what) != NULL, "message lacks '%s': %s", what, msg);
    ck_assert_msg(strchr(msg, '\n') == NULL, "message is not one line: %s", msg);
}

/* ---- getters ------------------------------------------------------------------------------ */

static const char good_text[] =
    "seed = 7;\n"
    "scheduler = {\n"
    "  plugin = \"x\";\n"
    "  depth = 12;\n"
    "  alpha = 3;\n"          /* an integer where a float is wanted: accepted */
    "  label = \"hello\";\n"
    "  enabled = false;\n"
    "  mode = \"exact\";\n"
    "  tags = [\"a\", \"b\"];\n"
    "  weights = (1, 2.5);\n"
    "  sub = { width = 3; };\n"
    "};\n";

START_TEST(getters_values)
{
    ghc_core_t *core = load_text(good_text, 0, NULL, 0);
    ghc_cfg_t *s = ghc_config_section(core, "scheduler");
    ck_assert_ptr_nonnull(s);
    ck_assert_str_eq(ghc_cfg_path(s), "scheduler");
    ck_assert_ptr_eq(ghc_cfg_core(s), core);
    int64_t i;
    double f;
    bool b;
    const char *str;
    int choice, n;
    ck_assert_int_eq(ghc_cfg_get_int(s, "depth", 1, 0, 100, &i), 0);
    ck_assert_int_eq(i, 12);
    ck_assert_int_eq(ghc_cfg_get_float(s, "alpha", 0.5, 0, 10, &f), 0);
    ck_assert_double_eq(f, 3.0);
    ck_assert_int_eq(ghc_cfg_get_string(s, "label", "none", &str), 0);
    ck_assert_str_eq(str, "hello");
    ck_assert_int_eq(ghc_cfg_get_bool(s, "enabled", true, &b), 0);
    ck_assert(!b);
    static const char *const modes[] = { "fast", "exact", NULL };
    ck_assert_int_eq(ghc_cfg_get_choice(s, "mode", 0, modes, &choice), 0);
    ck_assert_int_eq(choice, 1);
    ck_assert_int_eq(ghc_cfg_list_len(s, "tags", &n), 0);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(ghc_cfg_list_string(s, "tags", 1, &str), 0);
    ck_assert_str_eq(str, "b");
    ck_assert_int_eq(ghc_cfg_list_len(s, "weights", &n), 0);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(ghc_cfg_list_float(s, "weights", 0, &f), 0);
    ck_assert_double_eq(f, 1.0);
    ck_assert_int_eq(ghc_cfg_list_float(s, "weights", 1, &f), 0);
    ck_assert_double_eq(f, 2.5);
    ck_assert_int_eq(ghc_cfg_list_float(s, "weights", 2, &f), GHC_ECONFIG);
    expect_msg(core, "t.cfg:10: scheduler.weights has no element 2");
    static const struct ghc_cfg_key sub_keys[] = { { "width", GHC_CFG_INT, NULL, NULL, NULL }, { NULL, 0, NULL, NULL, NULL } };
    ghc_cfg_t *sub;
    ck_assert_int_eq(ghc_cfg_get_group(s, "sub", sub_keys, &sub), 0);
    ck_assert_ptr_nonnull(sub);
    ck_assert_str_eq(ghc_cfg_path(sub), "scheduler.sub");
    ck_assert_int_eq(ghc_cfg_get_int(sub, "width", 1, 1, 10, &i), 0);
    ck_assert_int_eq(i, 3);
    ck_assert_int_eq(ghc_cfg_get_group(s, "absent", sub_keys, &sub), 0);
    ck_assert_ptr_null(sub);
    ck_assert_str_eq(ghc_cfg_where(s, "label"), "t.cfg:6");
    ghc_core_free(core);
}
END_TEST

START_TEST(getters_defaults)
{
    ghc_core_t *core = load_text("scheduler = { plugin = \"x\"; };\n", 0, NULL, 0);
    ghc_cfg_t *s = ghc_config_section(core, "scheduler");
    int64_t i;
    double f;
    bool b;
    const char *str;
    int n, choice;
    static const char *const modes[] = { "fast", "exact", NULL };
    ck_assert_int_eq(ghc_cfg_get_int(s, "depth", 9, 0, 100, &i), 0);
    ck_assert_int_eq(i, 9);
    ck_assert_int_eq(ghc_cfg_get_float(s, "alpha", 0.125, 0, 1, &f), 0);
    ck_assert_double_eq(f, 0.125);
    ck_assert_int_eq(ghc_cfg_get_bool(s, "enabled", true, &b), 0);
    ck_assert(b);
    ck_assert_int_eq(ghc_cfg_get_string(s, "label", "dflt", &str), 0);
    ck_assert_str_eq(str, "dflt");
    ck_assert_int_eq(ghc_cfg_get_string(s, "nolabel", NULL, &str), 0);
    ck_assert_ptr_null(str);
    ck_assert_int_eq(ghc_cfg_get_choice(s, "mode", 1, modes, &choice), 0);
    ck_assert_int_eq(choice, 1);
    ck_assert_int_eq(ghc_cfg_list_len(s, "tags", &n), 0);
    ck_assert_int_eq(n, 0);
    /* defaults are recorded: present now, and read back the same */
    ck_assert(ghc_cfg_has(s, "depth"));
    ck_assert(ghc_cfg_has(s, "mode"));
    ck_assert(!ghc_cfg_has(s, "nolabel"));
    ck_assert_int_eq(ghc_cfg_get_int(s, "depth", 1, 0, 100, &i), 0);
    ck_assert_int_eq(i, 9);
    ck_assert_int_eq(ghc_cfg_get_string(s, "mode", "x", &str), 0);
    ck_assert_str_eq(str, "exact");
    ck_assert_str_eq(ghc_config_output_dir(core), "output");
    ghc_core_free(core);
}
END_TEST

/* ---- type and range errors ---------------------------------------------------------------- */

START_TEST(wrong_types)
{
    ghc_core_t *core = load_text("scheduler = {\n plugin = \"x\";\n depth = \"four\";\n alpha = true;\n"
                                 " enabled = 1;\n label = 3;\n tags = \"a\";\n mixed = [1, 2];\n"
                                 " sub = 5;\n};\n", 0, NULL, 0);
    ghc_cfg_t *s = ghc_config_section(core, "scheduler");
    int64_t i;
    double f;
    bool b;
    const char *str;
    int n;
    ghc_cfg_t *g;
    ck_assert_int_eq(ghc_cfg_get_int(s, "depth", 1, 0, 10, &i), GHC_ECONFIG);
    expect_msg(core, "t.cfg:3: scheduler.depth: expected an integer, got a string");
    ck_assert_int_eq(ghc_cfg_get_float(s, "alpha", 1, 0, 10, &f), GHC_ECONFIG);
    expect_msg(core, "t.cfg:4: scheduler.alpha: expected a number, got a boolean");
    ck_assert_int_eq(ghc_cfg_get_bool(s, "enabled", true, &b), GHC_ECONFIG);
    expect_msg(core, "t.cfg:5: scheduler.enabled: expected a boolean (true or false), got an integer");
    ck_assert_int_eq(ghc_cfg_get_string(s, "label", "", &str), GHC_ECONFIG);
    expect_msg(core, "t.cfg:6: scheduler.label: expected a string, got an integer");
    ck_assert_int_eq(ghc_cfg_list_len(s, "tags", &n), GHC_ECONFIG);
    expect_msg(core, "t.cfg:7: scheduler.tags: expected a list [ ... ], got a string");
    ck_assert_int_eq(ghc_cfg_list_string(s, "mixed", 0, &str), GHC_ECONFIG);
    expect_msg(core, "t.cfg:8: scheduler.mixed[0]: expected a string, got an integer");
    ck_assert_int_eq(ghc_cfg_get_group(s, "sub", NULL, &g), GHC_ECONFIG);
    expect_msg(core, "t.cfg:9: scheduler.sub: expected a group { ... }, got an integer");
    ghc_core_free(core);
}
END_TEST

START_TEST(out_of_range)
{
    ghc_core_t *core = load_text("scheduler = {\n plugin = \"x\";\n depth = 65;\n alpha = -0.5;\n"
                                 " mode = \"fsat\";\n};\n", 0, NULL, 0);
    ghc_cfg_t *s = ghc_config_section(core, "scheduler");
    int64_t i;
    double f;
    int c;
    ck_assert_int_eq(ghc_cfg_get_int(s, "depth", 1, 1, 64, &i), GHC_ECONFIG);
    expect_msg(core, "t.cfg:3: scheduler.depth = 65 is out of range [1, 64]");
    ck_assert_int_eq(ghc_cfg_get_float(s, "alpha", 1, 0, 1, &f), GHC_ECONFIG);
    expect_msg(core, "t.cfg:4: scheduler.alpha = -0.5 is out of range [0, 1]");
    static const char *const modes[] = { "fast", "exact", NULL };
    ck_assert_int_eq(ghc_cfg_get_choice(s, "mode", 0, modes, &c), GHC_ECONFIG);
    expect_msg(core, "t.cfg:5: scheduler.mode = \"fsat\" is not one of: fast, exact (did you mean 'fast'?)");
    ghc_core_free(core);
}
END_TEST

/* ---- keys --------------------------------------------------------------------------------- */

START_TEST(unknown_keys)
{
    ghc_core_t *core = load_text("seed = 1;\n\noptimiser = { plugin = \"x\"; };\n", GHC_ECONFIG, NULL, 0);
    expect_msg(core, "t.cfg:3: top level: unknown key 'optimiser' (did you mean 'optimizer'?)");
    ghc_core_free(core);
    core = load_text("zzzz = 1;\n", GHC_ECONFIG, NULL, 0);
    expect_msg(core, "t.cfg:1: top level: unknown key 'zzzz'");
    ck_assert_ptr_null(strstr(ghc_error_message(core), "did you mean"));
    ghc_core_free(core);
    core = load_text("seed = \"x\";\n", GHC_ECONFIG, NULL, 0);
    expect_msg(core, "t.cfg:1: top level: key 'seed' must be an integer, got a string");
    ghc_core_free(core);

    /* a section's keys against the plugin's declared ones, before its init runs */
    core = load_text("scheduler = {\n plugin = \"good\";\n alhpa = 0.3;\n};\n", 0, NULL, 0);
    ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_TEST_PLUGINS")), 0);
    ck_assert_int_eq(ghc_run_init(core), GHC_ECONFIG);
    expect_msg(core, "t.cfg:3: scheduler \"good\": unknown key 'alhpa' (did you mean 'alpha'?)");
    ck_assert_ptr_null(ghc_scheduler_get(core));
    ghc_core_free(core);
}
END_TEST

START_TEST(nested_unknown_key)
{
    ghc_core_t *core = load_text("scheduler = {\n plugin = \"x\";\n sub = {\n  widht = 2;\n };\n};\n", 0, NULL, 0);
    ghc_cfg_t *s = ghc_config_section(core, "scheduler"), *g;
    static const struct ghc_cfg_key sub_keys[] = { { "width", GHC_CFG_INT, NULL, NULL, NULL }, { NULL, 0, NULL, NULL, NULL } };
    ck_assert_int_eq(ghc_cfg_get_group(s, "sub", sub_keys, &g), GHC_ECONFIG);
    expect_msg(core, "t.cfg:4: scheduler.sub: unknown key 'widht' (did you mean 'width'?)");
    ghc_core_free(core);
}
END_TEST

START_TEST(syntax_error)
{
    ghc_core_t *core = load_text("seed = 1;\nscheduler = {\n  plugin = \"x\";\n  depth = ;\n};\n", GHC_ECONFIG, NULL, 0);
    expect_msg(core, "t.cfg:4: syntax error");
    ghc_core_free(core);
}
END_TEST

START_TEST(missing_file)
{
    ghc_core_t *core = ghc_core_init();
    ck_assert_int_eq(ghc_config_load(core, "/nonexistent/train.cfg", NULL, 0), GHC_EIO);
    expect_msg(core, "/nonexistent/train.cfg: cannot read the configuration: No such file or directory");
    ghc_core_free(core);
}
END_TEST

/* ---- overrides ---------------------------------------------------------------------------- */

START_TEST(overrides)
{
    const char *sets[] = { "scheduler.depth=7", "scheduler.alpha=1", "scheduler.label=some/path",
                           "scheduler.mode=\"fast\"", "optimizer.plugin=adamw", "scheduler.tags=[\"x\"]",
                           "scheduler.enabled=true", "output_dir=out dir" };
    ghc_core_t *core = load_text("scheduler = {\n plugin = \"x\";\n depth = 3;\n alpha = 0.5;\n"
                                 " label = \"1\";\n};\n", 0, sets, 8);
    ghc_cfg_t *s = ghc_config_section(core, "scheduler");
    int64_t i;
    double f;
    bool b;
    const char *str;
    int n;
    ck_assert_int_eq(ghc_cfg_get_int(s, "depth", 1, 0, 100, &i), 0);
    ck_assert_int_eq(i, 7);
    ck_assert_str_eq(ghc_cfg_where(s, "depth"), "--set scheduler.depth");
    ck_assert_int_eq(ghc_cfg_get_float(s, "alpha", 0, 0, 10, &f), 0);   /* stays a float */
    ck_assert_double_eq(f, 1.0);
    ck_assert_int_eq(ghc_cfg_get_string(s, "label", "", &str), 0);
    ck_assert_str_eq(str, "some/path");
    ck_assert_int_eq(ghc_cfg_get_string(s, "mode", "", &str), 0);
    ck_assert_str_eq(str, "fast");
    ck_assert_int_eq(ghc_cfg_list_len(s, "tags", &n), 0);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(ghc_cfg_get_bool(s, "enabled", false, &b), 0);
    ck_assert(b);
    ghc_cfg_t *o = ghc_config_section(core, "optimizer");
    ck_assert_ptr_nonnull(o);
    ck_assert_int_eq(ghc_cfg_get_string(o, "plugin", NULL, &str), 0);
    ck_assert_str_eq(str, "adamw");
    ck_assert_str_eq(ghc_config_output_dir(core), "out dir");
    ck_assert_str_eq(ghc_cfg_where(s, "plugin"), "t.cfg:2");
    ghc_core_free(core);
}
END_TEST

/* An @include in a --set value is not followed: the value is a string (libconfig's scanner would
 * open "/", a directory, and end the process; found by fuzz_config). */
START_TEST(override_include_is_a_string)
{
    const char *sets[] = { "scheduler.label={}\n@include \"/\"{}", "output_dir=@include \"/\"" };
    ghc_core_t *core = load_text("scheduler = { plugin = \"x\"; };\n", 0, sets, 2);
    ghc_cfg_t *s = ghc_config_section(core, "scheduler");
    const char *str;
    ck_assert_int_eq(ghc_cfg_get_string(s, "label", "", &str), 0);
    ck_assert_str_eq(str, "{}\n@include \"/\"{}");
    ck_assert_str_eq(ghc_config_output_dir(core), "@include \"/\"");
    ghc_core_free(core);
}
END_TEST

START_TEST(override_errors)
{
    const char *bad_type[] = { "scheduler.depth=\"deep\"" };
    ghc_core_t *core = load_text("scheduler = { plugin = \"x\"; depth = 3; };\n", 0, bad_type, 1);
    int64_t i;
    ck_assert_int_eq(ghc_cfg_get_int(ghc_config_section(core, "scheduler"), "depth", 1, 0, 9, &i), GHC_ECONFIG);
    expect_msg(core, "--set scheduler.depth: scheduler.depth: expected an integer, got a string");
    ghc_core_free(core);

    const char *range[] = { "scheduler.depth=99" };
    core = load_text("scheduler = { plugin = \"x\"; depth = 3; };\n", 0, range, 1);
    ck_assert_int_eq(ghc_cfg_get_int(ghc_config_section(core, "scheduler"), "depth", 1, 0, 9, &i), GHC_ECONFIG);
    expect_msg(core, "--set scheduler.depth: scheduler.depth = 99 is out of range [0, 9]");
    ghc_core_free(core);

    const char *noeq[] = { "scheduler.depth" };
    core = load_text("seed = 1;\n", GHC_ECONFIG, noeq, 1);
    expect_msg(core, "--set scheduler.depth: expected KEY=VALUE");
    ghc_core_free(core);

    const char *badpath[] = { "scheduler..depth=1" };
    core = load_text("seed = 1;\n", GHC_ECONFIG, badpath, 1);
    expect_msg(core, "expected KEY=VALUE with KEY a dotted path");
    ghc_core_free(core);

    const char *notgroup[] = { "seed.x=1" };
    core = load_text("seed = 1;\n", GHC_ECONFIG, notgroup, 1);
    expect_msg(core, "--set seed.x: 'seed' is an integer, not a group");
    ghc_core_free(core);

    const char *badname[] = { "1a=1" };
    core = load_text("seed = 1;\n", GHC_ECONFIG, badname, 1);
    expect_msg(core, "--set 1a: '1a' is not a valid key name");
    ghc_core_free(core);

    /* a group that only --set created is blamed on --set, not on the file */
    const char *newgroup[] = { "scheduler.micro_batches=0" };
    core = load_text("seed = 1;\n", 0, newgroup, 1);
    ck_assert_str_eq(ghc_cfg_where(ghc_config_section(core, "scheduler"), NULL), "--set scheduler.micro_batches");
    ghc_core_free(core);

    /* top-level keys are named without a leading dot */
    core = load_text("seed = -1;\n", GHC_ECONFIG, NULL, 0);
    expect_msg(core, "t.cfg:1: seed = -1 is out of range");
    ghc_core_free(core);

    const char *unknown[] = { "sede=1" };
    core = load_text("seed = 1;\n", GHC_ECONFIG, unknown, 1);
    expect_msg(core, "--set sede: top level: unknown key 'sede' (did you mean 'seed'?)");
    ghc_core_free(core);
}
END_TEST

/* ---- lists of groups and the setters --------------------------------------------------------- */

static const struct ghc_cfg_key item_keys[] = {
    { "path", GHC_CFG_STRING, NULL, NULL, NULL },
    { "n",    GHC_CFG_INT,    "1",  NULL, NULL },
    { NULL, 0, NULL, NULL, NULL }
};

START_TEST(list_of_groups)
{
    ghc_core_t *core = load_text("scheduler = {\n plugin = \"x\";\n items = ( { path = \"a\"; },\n"
                                 "  { path = \"b\"; n = 2; },\n  { paht = \"c\"; },\n  \"d\" );\n};\n", 0, NULL, 0);
    ghc_cfg_t *s = ghc_config_section(core, "scheduler"), *g;
    const char *str;
    int64_t i;
    int n;
    ck_assert_int_eq(ghc_cfg_list_len(s, "items", &n), 0);
    ck_assert_int_eq(n, 4);
    ck_assert_int_eq(ghc_cfg_list_group(s, "items", 1, item_keys, &g), 0);
    ck_assert_str_eq(ghc_cfg_path(g), "scheduler.items[1]");
    ck_assert_str_eq(ghc_cfg_where(g, "n"), "t.cfg:4");
    ck_assert_int_eq(ghc_cfg_get_string(g, "path", NULL, &str), 0);
    ck_assert_str_eq(str, "b");
    ck_assert_int_eq(ghc_cfg_get_int(g, "n", 1, 1, 1, &i), GHC_ECONFIG);
    expect_msg(core, "t.cfg:4: scheduler.items[1].n = 2 is out of range [1, 1]");
    ck_assert_int_eq(ghc_cfg_list_group(s, "items", 2, item_keys, &g), GHC_ECONFIG);
    ck_assert_ptr_null(g);
    expect_msg(core, "t.cfg:5: scheduler.items[2]: unknown key 'paht' (did you mean 'path'?)");
    ck_assert_int_eq(ghc_cfg_list_group(s, "items", 3, item_keys, &g), GHC_ECONFIG);
    expect_msg(core, "t.cfg:6: scheduler.items[3]: expected a group { ... }, got a string");
    ck_assert_int_eq(ghc_cfg_list_group(s, "items", 4, item_keys, &g), GHC_ECONFIG);
    expect_msg(core, "t.cfg:3: scheduler.items has no element 4");
    ck_assert_int_eq(ghc_cfg_list_group(s, "plugin", 0, item_keys, &g), GHC_ECONFIG);
    expect_msg(core, "t.cfg:2: scheduler.plugin: expected a list [ ... ], got a string");
    ghc_core_free(core);
}
END_TEST

START_TEST(setters)
{
    ghc_core_t *core = load_text("output_dir = \"o\";\nscheduler = {\n plugin = \"x\";\n"
                                 " items = ( { path = \"a\"; } );\n};\n", 0, NULL, 0);
    ghc_cfg_t *top = ghc_config_root(core), *s, *d, *g[2], *h;
    const char *str;
    int n;
    ck_assert_ptr_nonnull(top);
    ck_assert_str_eq(ghc_cfg_path(top), "");
    ck_assert_str_eq(ghc_config_dir(core), ".");
    /* a string keeps its place */
    ck_assert_int_eq(ghc_cfg_set_string(top, "output_dir", "p"), 0);
    ck_assert_str_eq(ghc_config_output_dir(core), "p");
    ck_assert_str_eq(ghc_cfg_where(top, "output_dir"), "t.cfg:1");
    /* a group there is kept as it is; an absent one is added */
    ck_assert_int_eq(ghc_cfg_set_group(top, "scheduler", &s), 0);
    ck_assert_ptr_eq(s, ghc_config_section(core, "scheduler"));
    ck_assert(ghc_cfg_has(s, "plugin"));
    ck_assert_ptr_null(ghc_config_section(core, "data"));
    ck_assert_int_eq(ghc_cfg_set_group(top, "data", &d), 0);
    ck_assert_ptr_eq(d, ghc_config_section(core, "data"));
    /* a list of groups replaces what was there; set values have the line of their section */
    ck_assert_int_eq(ghc_cfg_list_group(s, "items", 0, item_keys, &h), 0);
    ck_assert_int_eq(ghc_cfg_set_group_list(s, "items", 2, g), 0);
    ck_assert_int_eq(ghc_cfg_set_string(g[0], "path", "x"), 0);
    ck_assert_int_eq(ghc_cfg_set_string(g[1], "path", "y"), 0);
    ck_assert_int_eq(ghc_cfg_list_len(s, "items", &n), 0);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(ghc_cfg_list_group(s, "items", 1, item_keys, &h), 0);
    ck_assert_ptr_eq(h, g[1]);
    ck_assert_str_eq(ghc_cfg_path(h), "scheduler.items[1]");
    ck_assert_int_eq(ghc_cfg_get_string(h, "path", NULL, &str), 0);
    ck_assert_str_eq(str, "y");
    ck_assert_str_eq(ghc_cfg_where(h, "path"), "t.cfg:2");
    /* a value of another type is replaced */
    ck_assert_int_eq(ghc_cfg_set_string(d, "items", "z"), 0);
    ck_assert_int_eq(ghc_cfg_set_group_list(d, "items", 0, NULL), 0);
    ck_assert_int_eq(ghc_cfg_list_len(d, "items", &n), 0);
    ck_assert_int_eq(n, 0);
    ck_assert_int_eq(ghc_cfg_set_string(s, "items", "z"), 0);
    ck_assert_int_eq(ghc_cfg_list_len(s, "items", &n), GHC_ECONFIG);
    ck_assert_int_eq(ghc_cfg_set_string(s, "items", "w"), 0);
    ck_assert_int_eq(ghc_cfg_get_string(s, "items", NULL, &str), 0);
    ck_assert_str_eq(str, "w");
    /* a bad name */
    ck_assert_int_eq(ghc_cfg_set_string(s, "1x", "v"), GHC_EINVAL);
    expect_msg(core, "t.cfg:2: scheduler.1x: not a valid key name");
    ck_assert_int_eq(ghc_cfg_set_group_list(s, "items", -1, NULL), GHC_EINVAL);

    /* the resolved file holds what was set */
    char *dir = tu_tmpdir(), out[4200];
    ck_assert_int_eq(ghc_cfg_set_group_list(d, "items", 1, g), 0);
    ck_assert_int_eq(ghc_cfg_set_string(g[0], "path", "q"), 0);
    snprintf(out, sizeof(out), "%s/resolved.cfg", dir);
    ck_assert_int_eq(ghc_config_write(core, out), 0);
    ghc_core_free(core);
    core = ghc_core_init();
    ck_assert_ptr_null(ghc_config_root(core));
    ck_assert_ptr_null(ghc_config_dir(core));
    ck_assert_msg(ghc_config_load(core, out, NULL, 0) == 0, "%s", ghc_error_message(core));
    ck_assert_str_eq(ghc_config_dir(core), dir);
    ck_assert_str_eq(ghc_config_output_dir(core), "p");
    ck_assert_int_eq(ghc_cfg_list_group(ghc_config_section(core, "data"), "items", 0, item_keys, &h), 0);
    ck_assert_int_eq(ghc_cfg_get_string(h, "path", NULL, &str), 0);
    ck_assert_str_eq(str, "q");
    ghc_core_free(core);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* ---- include and the resolved file ---------------------------------------------------------- */

/* @include of a FIFO used to block in libconfig's fopen() (also under --dry-run), and of a
 * directory to end in "input in flex scanner failed": both are refused before parsing, naming
 * the including file's line and the path. Nothing here opens the FIFO, and the test case's
 * timeout ends a hang. */
START_TEST(include_not_regular)
{
    char *dir = tu_tmpdir(), fifo[4200], sub[4200], want[9000];
    snprintf(fifo, sizeof(fifo), "%s/pipe.cfg", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    snprintf(sub, sizeof(sub), "%s/sub", dir);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    char *main_cfg = tu_write(dir, "train.cfg", "# main\n@include \"pipe.cfg\"\noutput_dir = \"o\";\n");
    ghc_core_t *core = ghc_core_init();
    ck_assert_int_eq(ghc_config_load(core, main_cfg, NULL, 0), GHC_ECONFIG);
    snprintf(want, sizeof(want), "%s:2: @include \"pipe.cfg\": %s is not a regular file", main_cfg, fifo);
    expect_msg(core, want);
    ghc_core_free(core);
    /* nested: the included file's line is named */
    char *mid = tu_write(dir, "mid.cfg", "seed = 3;\n\n  @include \"sub\"\n");
    free(tu_write(dir, "train.cfg", "@include \"mid.cfg\"\noutput_dir = \"o\";\n"));
    core = ghc_core_init();
    ck_assert_int_eq(ghc_config_load(core, main_cfg, NULL, 0), GHC_ECONFIG);
    snprintf(want, sizeof(want), "%s:3: @include \"sub\": %s is not a regular file (a directory)", mid, sub);
    expect_msg(core, want);
    ck_assert_msg(!strstr(ghc_error_message(core), "flex"), "%s", ghc_error_message(core));
    ghc_core_free(core);
    /* from a string, relative to its folder; an absolute path too */
    core = ghc_core_init();
    ck_assert_int_eq(ghc_config_load_string(core, "seed = 1;\n@include \"pipe.cfg\"\n", "s.cfg", dir, NULL, 0), GHC_ECONFIG);
    snprintf(want, sizeof(want), "s.cfg:2: @include \"pipe.cfg\": %s is not a regular file", fifo);
    expect_msg(core, want);
    /* an escape in the name: libconfig would open another path ("\/" is "/", a directory whose
     * scanner ends the process; found by fuzz_config) */
    ck_assert_int_eq(ghc_config_load_string(core, "seed = 1;\n@include \"//\\/\"\n", "s.cfg", dir, NULL, 0), GHC_ECONFIG);
    expect_msg(core, "s.cfg:2: @include \"//\\/\": a backslash in an @include path is not supported");
    char text[4400];
    snprintf(text, sizeof(text), "@include \"%s\"\n", fifo);
    ck_assert_int_eq(ghc_config_load_string(core, text, "s.cfg", dir, NULL, 0), GHC_ECONFIG);
    expect_msg(core, "is not a regular file");
    ghc_core_free(core);
    /* a regular file still includes, and an absent one is libconfig's error as before */
    free(tu_write(dir, "mid.cfg", "seed = 3;\n"));
    core = ghc_core_init();
    ck_assert_msg(ghc_config_load(core, main_cfg, NULL, 0) == 0, "%s", ghc_error_message(core));
    ghc_core_free(core);
    free(mid);
    free(main_cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(include_and_resolved)
{
    char *dir = tu_tmpdir();
    char *inc = tu_write(dir, "common.cfg", "seed = 3;\nscheduler = {\n  plugin = \"x\";\n  depth = 2;\n};\n");
    char *main_cfg = tu_write(dir, "train.cfg", "# main\n@include \"common.cfg\"\noutput_dir = \"o\";\n");
    const char *sets[] = { "scheduler.alpha=0.75" };
    ghc_core_t *core = ghc_core_init();
    int rc = ghc_config_load(core, main_cfg, sets, 1);
    ck_assert_msg(rc == 0, "%s", ghc_error_message(core));
    ghc_cfg_t *s = ghc_config_section(core, "scheduler");
    int64_t i;
    double f;
    ck_assert_int_eq(ghc_cfg_get_int(s, "depth", 1, 0, 9, &i), 0);
    ck_assert_int_eq(i, 2);
    char want[4200];
    snprintf(want, sizeof(want), "%s:4", inc);        /* the line in the included file */
    ck_assert_str_eq(ghc_cfg_where(s, "depth"), want);
    ck_assert_int_eq(ghc_cfg_get_int(s, "width", 5, 0, 9, &i), 0);   /* a default */
    ck_assert_int_eq(ghc_cfg_get_float(s, "alpha", 0, 0, 1, &f), 0);
    char out[4200];
    snprintf(out, sizeof(out), "%s/resolved.cfg", dir);
    ck_assert_int_eq(ghc_config_write(core, out), 0);
    ghc_core_free(core);

    /* the resolved file stands alone: includes expanded, overrides and defaults in it */
    core = ghc_core_init();
    rc = ghc_config_load(core, out, NULL, 0);
    ck_assert_msg(rc == 0, "%s", ghc_error_message(core));
    s = ghc_config_section(core, "scheduler");
    ck_assert_int_eq(ghc_cfg_get_int(s, "depth", 1, 0, 9, &i), 0);
    ck_assert_int_eq(i, 2);
    ck_assert_int_eq(ghc_cfg_get_int(s, "width", 1, 0, 9, &i), 0);
    ck_assert_int_eq(i, 5);
    ck_assert_int_eq(ghc_cfg_get_float(s, "alpha", 0, 0, 1, &f), 0);
    ck_assert_double_eq(f, 0.75);
    ck_assert_str_eq(ghc_config_output_dir(core), "o");
    ck_assert(!ghc_cfg_has(s, "@include"));
    ghc_core_free(core);

    /* an error inside the included file names that file and line */
    free(tu_write(dir, "common.cfg", "seed = 3;\nscheduler = {\n  plugin = \"x\";\n  depth = ;\n};\n"));
    core = ghc_core_init();
    ck_assert_int_eq(ghc_config_load(core, main_cfg, NULL, 0), GHC_ECONFIG);
    snprintf(want, sizeof(want), "%s:4: syntax error", inc);
    expect_msg(core, want);
    ghc_core_free(core);

    /* writing where we cannot: an error, and no stray temporary file */
    core = ghc_core_init();
    ck_assert_int_eq(ghc_config_load(core, out, NULL, 0), 0);
    ck_assert_int_eq(ghc_config_write(core, "/nonexistent/dir/resolved.cfg"), GHC_EIO);
    expect_msg(core, "/nonexistent/dir/resolved.cfg.tmp.");
    ghc_core_free(core);

    free(inc);
    free(main_cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(plugin_path_relative_to_config)
{
    char *dir = tu_tmpdir();
    char *cfg = tu_write(dir, "t.cfg", "plugin_path = [\"plugs\", \"/abs/plugs\"];\n");
    ghc_core_t *core = ghc_core_init();
    ck_assert_int_eq(ghc_plugin_add_path(core, "/cli"), 0);
    ck_assert_int_eq(ghc_config_load(core, cfg, NULL, 0), 0);
    char want[4200];
    char real[4096];
    ck_assert_ptr_nonnull(realpath(dir, real));
    snprintf(want, sizeof(want), "%s/plugs", real);
    ck_assert_str_eq(ghc_plugin_path_at(core, 0), "/cli");
    ck_assert_str_eq(ghc_plugin_path_at(core, 1), want);
    ck_assert_str_eq(ghc_plugin_path_at(core, 2), "/abs/plugs");
    const char *last = NULL, *p;
    for (int i = 3; (p = ghc_plugin_path_at(core, i)); i++)
        last = p;
    ck_assert_ptr_nonnull(last);
    ck_assert_str_eq(last, GHC_PLUGINSDIR);   /* the installed folder comes last */
    ghc_core_free(core);
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(errors_and_log)
{
    ghc_core_t *core = ghc_core_init();
    ck_assert_str_eq(ghc_error_message(core), "");
    ck_assert_int_eq(ghc_error_set(core, GHC_EIO, "x: %d", 3), GHC_EIO);
    ck_assert_str_eq(ghc_error_message(core), "x: 3");
    ck_assert_int_eq(ghc_error_code(core), GHC_EIO);
    /* a message may quote the previous one */
    ghc_error_set(core, GHC_EIO, "outer: %s", ghc_error_message(core));
    ck_assert_str_eq(ghc_error_message(core), "outer: x: 3");
    ghc_error_clear(core);
    ck_assert_int_eq(ghc_error_code(core), 0);
    for (int c = 0; c >= GHC_EINTERNAL; c--)
        ck_assert_str_ne(ghc_status_string(c), "unknown status");
    ck_assert_str_eq(ghc_status_string(-99), "unknown status");
    ck_assert_int_eq(ghc_api_version(), GHC_API_VERSION);
    ck_assert_str_eq(ghc_version(), GHC_VERSION);
    ck_assert_str_eq(ghc_kind_name(GHC_KIND_NETWORK), "network");
    ck_assert_str_eq(ghc_kind_name(GHC_KIND_COUNT), "?");
    ghc_core_free(core);
    ghc_core_free(NULL);
}
END_TEST

struct captured { int n; enum ghc_log_level lvl; char msg[256]; };

static void capture(void *user, enum ghc_log_level lvl, const char *msg)
{
    struct captured *c = user;
    c->n++;
    c->lvl = lvl;
    snprintf(c->msg, sizeof(c->msg), "%s", msg);
}

START_TEST(log_sink_and_level)
{
    ghc_core_t *core = ghc_core_init();
    struct captured c = { 0 };
    ghc_log_set_sink(core, capture, &c);
    ghc_log(core, GHC_LOG_INFO, "lora: rank=%d", 16);
    ck_assert_int_eq(c.n, 1);
    ck_assert_int_eq(c.lvl, GHC_LOG_INFO);
    ck_assert_str_eq(c.msg, "lora: rank=16");
    ghc_log(core, GHC_LOG_DEBUG, "hidden");
    ck_assert_int_eq(c.n, 1);
    ghc_log_set_level(core, GHC_LOG_DEBUG);
    ck_assert_int_eq(ghc_log_get_level(core), GHC_LOG_DEBUG);
    ghc_log(core, GHC_LOG_DEBUG, "shown");
    ck_assert_int_eq(c.n, 2);
    ghc_log_set_level(core, GHC_LOG_ERROR);
    ghc_log(core, GHC_LOG_WARN, "dropped");
    ck_assert_int_eq(c.n, 2);
    ghc_core_free(core);
}
END_TEST

/* ---- declared defaults and ranges ---------------------------------------------------------- */

struct warnings { int n; char text[4096]; };

static void collect_warnings(void *user, enum ghc_log_level lvl, const char *msg)
{
    struct warnings *w = user;
    if (lvl != GHC_LOG_WARN)
        return;
    size_t l = strlen(w->text);
    snprintf(w->text + l, sizeof(w->text) - l, "%s\n", msg);
    w->n++;
}

/* A getter given another default or other bounds than its key table declares is logged with
 * both; prose, absent members and agreeing ones are quiet. */
START_TEST(declared_defaults_checked)
{
    static const char *const modes[] = { "off", "block", NULL };
    static const struct ghc_cfg_key keys[] = {
        { "n",     GHC_CFG_INT,    "16",        "1 to 2^40",   NULL },
        { "big",   GHC_CFG_INT,    "0",         "0 to 2^63-1", NULL },
        { "x",     GHC_CFG_FLOAT,  "1e-4",      "-1e3 to 0.9", NULL },
        { "b",     GHC_CFG_BOOL,   "true",      NULL,          NULL },
        { "s",     GHC_CFG_STRING, "adamw",     NULL,          NULL },
        { "mode",  GHC_CFG_STRING, "block",     "off, block",  NULL },
        { "p",     GHC_CFG_INT,    "(dim / 2)", "(even)",      NULL },
        { "q",     GHC_CFG_INT,    NULL,        NULL,          NULL },
        { NULL, 0, NULL, NULL, NULL }
    };
    ghc_core_t *core = load_text("scheduler = { plugin = \"x\"; sub = { n = 3; }; };\n", 0, NULL, 0);
    struct warnings w = { 0 };
    ghc_log_set_sink(core, collect_warnings, &w);
    ghc_cfg_t *s = ghc_config_section(core, "scheduler"), *g;
    int64_t i;
    double f;
    bool b;
    const char *str;
    int c;
    ck_assert_int_eq(ghc_cfg_get_group(s, "sub", keys, &g), 0);
    ck_assert_int_eq(ghc_cfg_get_int(g, "n", 16, 1, INT64_C(1) << 40, &i), 0);
    ck_assert_int_eq(ghc_cfg_get_int(g, "big", 0, 0, INT64_MAX, &i), 0);
    ck_assert_int_eq(ghc_cfg_get_float(g, "x", 1e-4, -1e3, 0.9f, &f), 0);   /* a float's 0.9 is near enough */
    ck_assert_int_eq(ghc_cfg_get_bool(g, "b", true, &b), 0);
    ck_assert_int_eq(ghc_cfg_get_string(g, "s", "adamw", &str), 0);
    ck_assert_int_eq(ghc_cfg_get_choice(g, "mode", 1, modes, &c), 0);
    ck_assert_int_eq(ghc_cfg_get_int(g, "p", 7, 0, 99, &i), 0);
    ck_assert_int_eq(ghc_cfg_get_int(g, "q", 7, 0, 99, &i), 0);
    ck_assert_msg(w.n == 0, "%s", w.text);

    ck_assert_int_eq(ghc_cfg_get_int(g, "n", 8, 1, INT64_C(1) << 40, &i), 0);
    ck_assert_int_eq(i, 3);   /* the user's value, whatever the table says */
    ck_assert_int_eq(ghc_cfg_get_int(g, "big", 0, 0, INT64_MAX - 1, &i), 0);
    ck_assert_int_eq(ghc_cfg_get_float(g, "x", 1e-3, -1e3, 0.9, &f), 0);
    ck_assert_int_eq(ghc_cfg_get_bool(g, "b", false, &b), 0);
    ck_assert_int_eq(ghc_cfg_get_string(g, "s", NULL, &str), 0);
    static const char *const other[] = { "off", "block", "full", NULL };
    ck_assert_int_eq(ghc_cfg_get_choice(g, "mode", 1, other, &c), 0);
    ck_assert_msg(w.n == 6, "%d warnings:\n%s", w.n, w.text);
    static const char *const want[] = {
        "config: scheduler.sub.n: its key table declares the default 16, the code uses 8",
        "config: scheduler.sub.big: its key table declares the range 0 to 2^63-1, the code uses 0 to 9223372036854775806",
        "config: scheduler.sub.x: its key table declares the default 1e-4, the code uses 0.001",
        "config: scheduler.sub.b: its key table declares the default true, the code uses false",
        "config: scheduler.sub.s: its key table declares the default adamw, the code uses none",
        "config: scheduler.sub.mode: its key table declares the choices off, block, the code uses off, block, full",
    };
    for (size_t k = 0; k < sizeof(want) / sizeof(*want); k++)
        ck_assert_msg(strstr(w.text, want[k]), "lacks '%s':\n%s", want[k], w.text);
    ghc_core_free(core);
}
END_TEST

/* The shipped plugins' and the core sections' tables against their getters: a one-step demo
 * run through every plugin this build has (each memory policy, backend, cache, optimizer and
 * scheduler in turn; plugins that cannot start here, such as CUDA ones without a device, still
 * read their keys first) logs no disagreement. */
START_TEST(declared_defaults_true)
{
    static const char *const sections[][2] = {
        { "", "" },
        { "optimizer", "automagic" }, { "scheduler", "gradient_ramp" },
        { "backend", "in_memory" }, { "backend", "local" }, { "cache", "disk" }, { "cache", "unified_memory" },
        { "mempolicy", "device" }, { "mempolicy", "offload" }, { "mempolicy", "gh200_uvm" },
    };
    const char *plugins = tu_env("GHC_BUILD_PLUGINS");
    char *dir = tu_tmpdir();
    char *cfg = tu_write(dir, "t.cfg",
        "mempolicy = { plugin = \"host\"; };\n"
        "model = { plugin = \"wan22\"; dtype = \"f32\"; device = -1; checkpointing = \"off\";\n"
        "  random = { dim = 64; ffn_dim = 128; heads = 2; layers = 1; text_dim = 32; freq_dim = 64; }; };\n"
        "network = { plugin = \"lycoris\"; rank = 2; };\n"
        "optimizer = { plugin = \"adamw\"; };\n"
        "scheduler = { plugin = \"constant\"; };\n"
        "demo = { samples = 2; height = 4; width = 4; text_len = 4; text_dim = 32; };\n"
        "train = { steps = 1; tensorboard = false; validate_every = 1; };\n");
    for (size_t i = 0; i < sizeof(sections) / sizeof(*sections); i++) {
        char so[4200], cmd[8000], *out;
        snprintf(so, sizeof(so), "%s/ghc_%s.so", plugins, sections[i][1]);
        if (*sections[i][1] && access(so, F_OK) != 0)
            continue;   /* not in this build */
        if (*sections[i][1])
            snprintf(cmd, sizeof(cmd), "'%s' -P '%s' -c '%s' --set output_dir='%s/run%zu' --set '%s={ plugin = \"%s\"; }'",
                     tu_env("GHC_CLI"), plugins, cfg, dir, i, sections[i][0], sections[i][1]);
        else
            snprintf(cmd, sizeof(cmd), "'%s' -P '%s' -c '%s' --set output_dir='%s/run%zu'", tu_env("GHC_CLI"),
                     plugins, cfg, dir, i);
        int rc = tu_run(cmd, &out);
        ck_assert_msg(!strstr(out, "key table declares"), "%s:\n%s", cmd, out);
        if (!strcmp(sections[i][0], "") || !strcmp(sections[i][0], "optimizer") ||
            !strcmp(sections[i][0], "scheduler"))
            ck_assert_msg(rc == 0, "%s: exit %d:\n%s", cmd, rc, out);
        free(out);
    }
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("getters");
    tcase_add_test(tc, getters_values);
    tcase_add_test(tc, getters_defaults);
    tcase_add_test(tc, wrong_types);
    tcase_add_test(tc, out_of_range);
    suite_add_tcase(s, tc);
    tc = tcase_create("keys");
    tcase_add_test(tc, unknown_keys);
    tcase_add_test(tc, nested_unknown_key);
    tcase_add_test(tc, syntax_error);
    tcase_add_test(tc, missing_file);
    tcase_add_test(tc, list_of_groups);
    suite_add_tcase(s, tc);
    tc = tcase_create("setters");
    tcase_add_test(tc, setters);
    suite_add_tcase(s, tc);
    tc = tcase_create("overrides");
    tcase_add_test(tc, overrides);
    tcase_add_test(tc, override_include_is_a_string);
    tcase_add_test(tc, override_errors);
    suite_add_tcase(s, tc);
    tc = tcase_create("files");
    tcase_add_test(tc, include_and_resolved);
    tcase_add_test(tc, plugin_path_relative_to_config);
    suite_add_tcase(s, tc);
    tc = tcase_create("not_regular");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, include_not_regular);
    suite_add_tcase(s, tc);
    tc = tcase_create("declared");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, declared_defaults_checked);
    tcase_add_test(tc, declared_defaults_true);
    suite_add_tcase(s, tc);
    tc = tcase_create("errors");
    tcase_add_test(tc, errors_and_log);
    tcase_add_test(tc, log_sink_and_level);
    suite_add_tcase(s, tc);
    return tu_run_suite(s, false);
}
