/* test_loader.c: the plugin loader and registry: a good plugin, and every failure
 * (missing file, not a shared object, undefined symbol, missing entry symbol, ABI and API
 * mismatch, wrong name, duplicate name, missing required member, oversized ops, undeclared
 * and unregistered kinds, failing init), each one line naming the file and the symbol.
 * Also the shipped host and constant plugins through their instances. */
#include <sys/stat.h>

#include <gh200core/gh200core.h>

#include "testutil.h"

static char plugin_path[4096];

static const char *tp(const char *dirvar, const char *name)
{
    snprintf(plugin_path, sizeof(plugin_path), "%s/ghc_%s.so", tu_env(dirvar), name);
    return plugin_path;
}

/* Load a broken plugin; expect `code` and a one-line message naming the file, the symbol
 * (when there is one to name) and containing `why`. Nothing may be registered. */
static void expect_fail(const char *name, int code, const char *why, bool names_symbol)
{
    ghc_core_t *core = ghc_core_init();
    const char *path = tp("GHC_TEST_BADPLUGINS", name);
    int rc = ghc_plugin_load_file(core, path);
    const char *msg = ghc_error_message(core);
    ck_assert_msg(rc == code, "%s: rc %d, want %d (%s)", name, rc, code, msg);
    ck_assert_msg(strstr(msg, path) != NULL, "message lacks the path: %s", msg);
    ck_assert_msg(strstr(msg, why) != NULL, "message lacks '%s': %s", why, msg);
    ck_assert_msg(strchr(msg, '\n') == NULL, "message is not one line: %s", msg);
    if (names_symbol) {
        char sym[96];
        snprintf(sym, sizeof(sym), "ghc_plugin_%s", name);
        ck_assert_msg(strstr(msg, sym) != NULL, "message lacks the symbol %s: %s", sym, msg);
    }
    struct ghc_plugin_info info;
    ck_assert(!ghc_plugin_info_at(core, 0, &info));
    ghc_core_free(core);
}

/* ---- good plugins ------------------------------------------------------------------------- */

START_TEST(good_by_path)
{
    ghc_core_t *core = ghc_core_init();
    const char *path = tp("GHC_TEST_PLUGINS", "good");
    ck_assert_int_eq(ghc_plugin_load_file(core, path), 0);
    ck_assert_int_eq(ghc_plugin_load_file(core, path), 0);   /* again: a no-op */
    struct ghc_plugin_info info;
    ck_assert(ghc_plugin_info_at(core, 0, &info));
    ck_assert_int_eq(info.kind, GHC_KIND_SCHEDULER);
    ck_assert_str_eq(info.name, "good");
    ck_assert_str_eq(info.plugin, "good");
    ck_assert_str_eq(info.version, "9.9.9");
    ck_assert_str_eq(info.path, path);
    ck_assert(!ghc_plugin_info_at(core, 1, &info));
    ghc_core_free(core);
}
END_TEST

START_TEST(good_by_name_on_search_path)
{
    ghc_core_t *core = ghc_core_init();
    ck_assert_int_eq(ghc_plugin_add_path(core, "/nonexistent/dir"), 0);
    ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_TEST_PLUGINS")), 0);
    ck_assert_str_eq(ghc_plugin_path_at(core, 0), "/nonexistent/dir");
    ck_assert_str_eq(ghc_plugin_path_at(core, 1), tu_env("GHC_TEST_PLUGINS"));
    ck_assert_int_eq(ghc_plugin_load(core, "good"), 0);
    struct ghc_plugin_info info;
    ck_assert(ghc_plugin_info_at(core, 0, &info));
    ck_assert_str_eq(info.path, tp("GHC_TEST_PLUGINS", "good"));
    ghc_core_free(core);
}
END_TEST

START_TEST(env_path_is_searched)
{
    ghc_core_t *core = ghc_core_init();
    char env[4200];
    snprintf(env, sizeof(env), "/nowhere:%s", tu_env("GHC_TEST_PLUGINS"));
    setenv("GHC_PLUGIN_PATH", env, 1);
    int rc = ghc_plugin_load(core, "good");
    unsetenv("GHC_PLUGIN_PATH");
    ck_assert_msg(rc == 0, "%s", ghc_error_message(core));
    ghc_core_free(core);
}
END_TEST

/* ---- where plugins come from -------------------------------------------------------------- */

/* A private folder holding a copy of ghc_good.so, modes set explicitly (not left to the
 * umask: a group-writable tree is what the loader refuses). Returns the folder; *so the copy. */
static char *good_copy(char **so)
{
    char *dir = tu_tmpdir(), cmd[8400];
    ck_assert_int_eq(chmod(dir, 0700), 0);
    snprintf(cmd, sizeof(cmd), "cp '%s' '%s/ghc_good.so'", tp("GHC_TEST_PLUGINS", "good"), dir);
    ck_assert_int_eq(system(cmd), 0);
    *so = malloc(strlen(dir) + 16);
    sprintf(*so, "%s/ghc_good.so", dir);
    ck_assert_int_eq(chmod(*so, 0755), 0);
    return dir;
}

static int load_copy(const char *so, const char *config, char **msg)
{
    ghc_core_t *core = ghc_core_init();
    if (config)
        ck_assert_int_eq(ghc_config_load_string(core, config, "t.cfg", NULL, NULL, 0), 0);
    int rc = ghc_plugin_load_file(core, so);
    *msg = strdup(ghc_error_message(core));
    ghc_core_free(core);
    return rc;
}

/* A plugin file or folder that another user could have written is not loaded (sudo's rule),
 * unless the configuration allows it. */
START_TEST(insecure_refused)
{
    char *so, *msg, want[8400];
    char *dir = good_copy(&so);
    ck_assert_int_eq(load_copy(so, NULL, &msg), 0);
    free(msg);
    ck_assert_int_eq(chmod(so, 0775), 0);
    ck_assert_int_eq(load_copy(so, NULL, &msg), GHC_ELOAD);
    snprintf(want, sizeof(want), "%s: refused: the file is writable by group or others (uid %u, mode 0775)", so,
             (unsigned)geteuid());
    ck_assert_msg(strstr(msg, want) && strstr(msg, "allow_insecure_plugins = true") && !strchr(msg, '\n'), "%s", msg);
    free(msg);
    ck_assert_int_eq(chmod(so, 0755), 0);
    ck_assert_int_eq(chmod(dir, 0777), 0);
    ck_assert_int_eq(load_copy(so, NULL, &msg), GHC_ELOAD);
    snprintf(want, sizeof(want), "%s: refused: its folder %s is writable by group or others", so, dir);
    ck_assert_msg(strstr(msg, want), "%s", msg);
    free(msg);
    ck_assert_int_eq(load_copy(so, "allow_insecure_plugins = true;", &msg), 0);
    free(msg);
    ck_assert_int_eq(chmod(dir, 0700), 0);
    if (geteuid() == 0) {   /* only root can give the file away */
        ck_assert_int_eq(chown(so, 65534, 65534), 0);
        ck_assert_int_eq(load_copy(so, NULL, &msg), GHC_ELOAD);
        ck_assert_msg(strstr(msg, "the file is owned by another user (uid 65534"), "%s", msg);
        free(msg);
    }
    free(so);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* Only absolute folders: "" made "/ghc_<name>.so", a relative one depends on the working
 * directory. */
START_TEST(relative_folder_refused)
{
    ghc_core_t *core = ghc_core_init();
    ck_assert_int_eq(ghc_plugin_add_path(core, ""), GHC_ELOAD);
    ck_assert_str_eq(ghc_error_message(core), "plugins: search path entry '' is not an absolute folder (plugins "
                     "load only from absolute folders)");
    ck_assert_int_eq(ghc_plugin_add_path(core, "tests/plugins"), GHC_ELOAD);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "entry 'tests/plugins' is not an absolute folder"));
    ghc_core_free(core);
    core = ghc_core_init();
    setenv("GHC_PLUGIN_PATH", "/nowhere:plugins", 1);
    ck_assert_ptr_null(ghc_plugin_path_at(core, 0));
    unsetenv("GHC_PLUGIN_PATH");
    ck_assert_int_eq(ghc_error_code(core), GHC_ELOAD);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "GHC_PLUGIN_PATH entry 'plugins' is not an absolute"));
    ghc_core_free(core);
}
END_TEST

static char shadow_log[4096];
static void shadow_sink(void *user, enum ghc_log_level lvl, const char *msg)
{
    (void)user;
    if (lvl == GHC_LOG_WARN)
        snprintf(shadow_log + strlen(shadow_log), sizeof(shadow_log) - strlen(shadow_log), "%s\n", msg);
}

/* The same plugin name in two folders: one warning line naming both files. */
START_TEST(shadow_named)
{
    char *a_so, *b_so, want[8400];
    char *a = good_copy(&a_so), *b = good_copy(&b_so);
    snprintf(want, sizeof(want), "plugins: %s shadows %s (the same plugin name 'good'; the first on the search "
             "path is loaded)\n", a_so, b_so);
    for (int by_name = 0; by_name < 2; by_name++) {
        ghc_core_t *core = ghc_core_init();
        ghc_log_set_sink(core, shadow_sink, NULL);
        shadow_log[0] = '\0';
        if (by_name) {
            ck_assert_int_eq(ghc_plugin_add_path(core, a), 0);
            ck_assert_int_eq(ghc_plugin_add_path(core, b), 0);
            ck_assert_int_eq(ghc_plugin_load(core, "good"), 0);
        } else {   /* as `gh200core plugins` does: every file of every folder */
            ck_assert_int_eq(ghc_plugin_load_file(core, a_so), 0);
            ck_assert_int_eq(ghc_plugin_load_file(core, b_so), 0);
        }
        ck_assert_str_eq(shadow_log, want);
        struct ghc_plugin_info info;
        ck_assert(ghc_plugin_info_at(core, 0, &info));
        ck_assert_str_eq(info.path, a_so);
        ghc_core_free(core);
    }
    free(a_so);
    free(b_so);
    tu_rm_rf(a);
    tu_rm_rf(b);
    free(a);
    free(b);
}
END_TEST

/* ---- failures ----------------------------------------------------------------------------- */

START_TEST(missing_by_name)
{
    ghc_core_t *core = ghc_core_init();
    ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_TEST_PLUGINS")), 0);
    ck_assert_int_eq(ghc_plugin_load(core, "nonexistent"), GHC_ELOAD);
    const char *msg = ghc_error_message(core);
    ck_assert_msg(strstr(msg, "ghc_nonexistent.so not found in") != NULL, "%s", msg);
    ck_assert_msg(strstr(msg, tu_env("GHC_TEST_PLUGINS")) != NULL, "%s", msg);
    ck_assert_int_eq(ghc_plugin_load(core, "Bad/Name"), GHC_ELOAD);
    ck_assert_msg(strstr(ghc_error_message(core), "invalid name") != NULL, "%s", ghc_error_message(core));
    ghc_core_free(core);
}
END_TEST

/* A name within two edits of a plugin on the search path, or of one loaded, gets a suggestion;
 * a name close to none gets none. */
START_TEST(missing_suggests_a_name)
{
    ghc_core_t *core = ghc_core_init();
    ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_TEST_PLUGINS")), 0);
    ck_assert_int_eq(ghc_plugin_load(core, "godo"), GHC_ELOAD);
    const char *msg = ghc_error_message(core);
    ck_assert_msg(strstr(msg, "plugin 'godo': ghc_godo.so not found in") && strstr(msg, "; did you mean 'good'?"),
                  "%s", msg);
    ck_assert_msg(strchr(msg, '\n') == NULL, "message is not one line: %s", msg);
    ck_assert_int_eq(ghc_plugin_load(core, "unrelated"), GHC_ELOAD);
    ck_assert_msg(!strstr(ghc_error_message(core), "did you mean"), "%s", ghc_error_message(core));
    ghc_core_free(core);

    core = ghc_core_init();   /* only loaded, not on the search path */
    ck_assert_int_eq(ghc_plugin_load_file(core, tp("GHC_TEST_PLUGINS", "good")), 0);
    ck_assert_int_eq(ghc_plugin_load(core, "goods"), GHC_ELOAD);
    ck_assert_msg(strstr(ghc_error_message(core), "did you mean 'good'?"), "%s", ghc_error_message(core));
    ghc_core_free(core);
}
END_TEST

START_TEST(missing_file)
{
    ghc_core_t *core = ghc_core_init();
    ck_assert_int_eq(ghc_plugin_load_file(core, "/nonexistent/ghc_x.so"), GHC_ELOAD);
    ck_assert_msg(strstr(ghc_error_message(core), "/nonexistent/ghc_x.so: cannot open: No such file") != NULL,
                  "%s", ghc_error_message(core));
    ck_assert_int_eq(ghc_plugin_load_file(core, "/tmp/libfoo.so"), GHC_ELOAD);
    ck_assert_msg(strstr(ghc_error_message(core), "not a plugin file name") != NULL, "%s", ghc_error_message(core));
    ghc_core_free(core);
}
END_TEST

START_TEST(not_a_shared_object)
{
    char *dir = tu_tmpdir();
    char *path = tu_write(dir, "ghc_junk.so", "this is not an ELF file\n");
    ghc_core_t *core = ghc_core_init();
    ck_assert_int_eq(ghc_plugin_load_file(core, path), GHC_ELOAD);
    const char *msg = ghc_error_message(core);
    ck_assert_msg(strstr(msg, path) && strstr(msg, "cannot load"), "%s", msg);
    ghc_core_free(core);
    free(path);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(undefined_symbol)   { expect_fail("undef", GHC_ELOAD, "undefined symbol", false); }
END_TEST
START_TEST(missing_entry)      { expect_fail("nosym", GHC_ELOAD, "not found", true); }
END_TEST
/* ghc_plugin_tinysym is a 4-byte object: refused before a member past it is read */
START_TEST(tiny_symbol)        { expect_fail("tinysym", GHC_EABI, "the symbol is a 4-byte object, not a plugin descriptor", true); }
END_TEST
START_TEST(abi_mismatch)       { expect_fail("badabi", GHC_EABI, "plugin ABI 99, this gh200core", true); }
END_TEST
START_TEST(api_too_new)        { expect_fail("newapi", GHC_EABI, "built against API 999", true); }
END_TEST
START_TEST(name_mismatch)      { expect_fail("badname", GHC_ELOAD, "descriptor name 'other'", true); }
END_TEST
START_TEST(missing_required)   { expect_fail("noreq", GHC_ELOAD, "lacks required member 'lr_factor'", true); }
END_TEST
START_TEST(ops_too_large)      { expect_fail("bigops", GHC_EABI, "is larger than this core's", true); }
END_TEST
START_TEST(undeclared_kind)    { expect_fail("undeclared", GHC_ELOAD, "registers kind optimizer, which its descriptor does not declare", true); }
END_TEST
START_TEST(unregistered_kind)  { expect_fail("noregister", GHC_ELOAD, "declares kind optimizer but its init() registered none", true); }
END_TEST
/* a failing init is a plugin error whatever its code; its lines folded into one */
START_TEST(init_fails)         { expect_fail("initfail", GHC_ELOAD, "init failed: cannot start: no widget attached; "
                                             "tried /dev/widget0; tried /dev/widget1", true); }
END_TEST

START_TEST(duplicate_name)
{
    ghc_core_t *core = ghc_core_init();
    const char *good = tp("GHC_TEST_PLUGINS", "good");
    char goodpath[4096];
    snprintf(goodpath, sizeof(goodpath), "%s", good);
    ck_assert_int_eq(ghc_plugin_load_file(core, goodpath), 0);
    const char *dup = tp("GHC_TEST_BADPLUGINS", "dup");
    ck_assert_int_eq(ghc_plugin_load_file(core, dup), GHC_ELOAD);
    const char *msg = ghc_error_message(core);
    ck_assert_msg(strstr(msg, dup) && strstr(msg, "ghc_plugin_dup") &&
                  strstr(msg, "scheduler 'good' is already registered by") && strstr(msg, goodpath), "%s", msg);
    struct ghc_plugin_info info;
    ck_assert(ghc_plugin_info_at(core, 0, &info));
    ck_assert_str_eq(info.path, goodpath);          /* the first one stays */
    ck_assert(!ghc_plugin_info_at(core, 1, &info));
    ghc_core_free(core);
}
END_TEST

START_TEST(register_outside_init)
{
    ghc_core_t *core = ghc_core_init();
    static const struct ghc_scheduler_ops ops = { .struct_size = sizeof(ops), .name = "x" };
    ck_assert_int_eq(ghc_register_scheduler(core, &ops), GHC_ELOAD);
    ck_assert_msg(strstr(ghc_error_message(core), "only a plugin's init() may register"), "%s",
                  ghc_error_message(core));
    ghc_core_free(core);
}
END_TEST

/* ---- instances ---------------------------------------------------------------------------- */

static ghc_core_t *core_with(const char *text)
{
    ghc_core_t *core = ghc_core_init();
    ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_TEST_PLUGINS")), 0);
    ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")), 0);
    int rc = ghc_config_load_string(core, text, "test.cfg", NULL, NULL, 0);
    ck_assert_msg(rc == 0, "%s", ghc_error_message(core));
    return core;
}

START_TEST(instance_of_good)
{
    ghc_core_t *core = core_with("scheduler = { plugin = \"good\"; depth = 5; alpha = 0.25; };\n");
    ck_assert_ptr_null(ghc_scheduler_get(core));
    ck_assert_msg(ghc_run_init(core) == 0, "%s", ghc_error_message(core));
    ghc_scheduler_t *s = ghc_scheduler_get(core);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(ghc_scheduler_micro_batches(s, 2), 7);
    ck_assert_float_eq(ghc_scheduler_lr_factor(s, 0), 0.25f);
    ck_assert_ptr_null(ghc_mempolicy_get(core));
    ghc_run_free(core);
    ck_assert_ptr_null(ghc_scheduler_get(core));
    ghc_core_free(core);
}
END_TEST

START_TEST(wrong_kind)
{
    ghc_core_t *core = core_with("seed = 1;\noptimizer = { plugin = \"good\"; };\n");
    ck_assert_int_eq(ghc_run_init(core), GHC_ELOAD);
    const char *msg = ghc_error_message(core);
    ck_assert_msg(strstr(msg, "test.cfg:2: optimizer: plugin 'good'") &&
                  strstr(msg, "provides scheduler, not optimizer 'good'"), "%s", msg);
    ghc_core_free(core);
}
END_TEST

START_TEST(missing_plugin_key)
{
    ghc_core_t *core = core_with("\nscheduler = { depth = 3; };\n");
    ck_assert_int_eq(ghc_run_init(core), GHC_ECONFIG);
    ck_assert_msg(strstr(ghc_error_message(core), "test.cfg:2: scheduler: missing key 'plugin'"), "%s",
                  ghc_error_message(core));
    ghc_core_free(core);
}
END_TEST

START_TEST(instance_init_fails)
{
    ghc_core_t *core = core_with("scheduler = {\n  plugin = \"refuse\";\n};\n");
    ck_assert_int_eq(ghc_run_init(core), GHC_EINVAL);
    ck_assert_msg(strstr(ghc_error_message(core), "test.cfg:1: refuse: refusing on purpose"), "%s",
                  ghc_error_message(core));
    ck_assert_ptr_null(ghc_scheduler_get(core));
    ghc_core_free(core);
}
END_TEST

/* Members that fail without a message get one from the core's wrappers, naming the plugin and
 * the member; a message left from before the call does not stand in for it. */
START_TEST(member_fails_silently)
{
    ghc_core_t *core = core_with("mempolicy = { plugin = \"silent\"; };\n");
    ck_assert_msg(ghc_run_init(core) == 0, "%s", ghc_error_message(core));
    ghc_mempolicy_t *mp = ghc_mempolicy_get(core);
    ck_assert_ptr_nonnull(mp);
    void *p = &p;
    ck_assert_int_eq(ghc_mem_alloc(mp, 64, GHC_ROLE_WORKSPACE, GHC_DEVICE_CPU, &p), GHC_ENOMEM);
    ck_assert_ptr_null(p);
    char want[256];
    snprintf(want, sizeof(want), "mempolicy \"silent\": alloc failed: %s (code %d, no message from the plugin)",
             ghc_status_string(GHC_ENOMEM), GHC_ENOMEM);
    ck_assert_str_eq(ghc_error_message(core), want);
    ghc_error_set(core, GHC_EINVAL, "an earlier failure, handled");
    ck_assert_int_eq(ghc_mem_phase(mp, GHC_PHASE_STEP_BEGIN, 0), GHC_EIO);
    snprintf(want, sizeof(want), "mempolicy \"silent\": phase failed: %s (code %d, no message from the plugin)",
             ghc_status_string(GHC_EIO), GHC_EIO);
    ck_assert_str_eq(ghc_error_message(core), want);
    ck_assert_int_eq(ghc_error_code(core), GHC_EIO);
    /* optional members the plugin lacks: no-ops, the message stays */
    ck_assert_int_eq(ghc_mem_trim(mp, false), 0);
    ck_assert_str_eq(ghc_error_message(core), want);
    ghc_core_free(core);
}
END_TEST

START_TEST(host_mempolicy)
{
    ghc_core_t *core = core_with("mempolicy = { plugin = \"host\"; limit_mib = 1; };\n");
    ck_assert_msg(ghc_run_init(core) == 0, "%s", ghc_error_message(core));
    ghc_mempolicy_t *mp = ghc_mempolicy_get(core);
    ck_assert_ptr_nonnull(mp);
    void *a, *b, *c;
    ck_assert_int_eq(ghc_mem_alloc(mp, 1000, GHC_ROLE_LATENTS, GHC_DEVICE_CPU, &a), 0);
    ck_assert_int_eq(((uintptr_t)a) % 256, 0);
    memset(a, 0xab, 1000);
    ck_assert_int_eq(ghc_mem_alloc(mp, 3000, GHC_ROLE_ADAPTER, GHC_DEVICE_CPU, &b), 0);
    struct ghc_mem_stats st = { .struct_size = sizeof(st) };
    ck_assert_int_eq(ghc_mem_stats(mp, &st), 0);
    ck_assert_uint_eq(st.bytes_role[GHC_ROLE_LATENTS], 1000);
    ck_assert_uint_eq(st.bytes_role[GHC_ROLE_ADAPTER], 3000);
    ck_assert_uint_eq(st.bytes_host, 4000);
    /* the per-role arrays keep their room whatever the number of roles; n_roles says how many */
    ck_assert_uint_eq(st.n_roles, GHC_ROLE_COUNT);
    ck_assert_uint_eq(sizeof(st.bytes_role), GHC_ROLE_MAX * sizeof(uint64_t));
    ck_assert_uint_eq(sizeof(st.bytes_role_managed), GHC_ROLE_MAX * sizeof(uint64_t));
    char use[256];
    ck_assert_str_eq(ghc_mem_usage_text(st.bytes_role, (int32_t)st.n_roles, use, sizeof(use)),
                     "adapter 2.9 KiB, latents 1000.0 B");
    ck_assert_str_eq(ghc_mem_usage_text(st.bytes_role, GHC_ROLE_LATENTS, use, sizeof(use)), "adapter 2.9 KiB");
    ck_assert_int_eq(ghc_mem_advise(mp, a, 1000, (enum ghc_mem_role)GHC_ROLE_COUNT), GHC_EINVAL);
    ck_assert_int_eq(ghc_mem_advise(mp, a, 1000, GHC_ROLE_TEXT_EMBEDS), 0);
    ck_assert_int_eq(ghc_mem_stats(mp, &st), 0);
    ck_assert_uint_eq(st.bytes_role[GHC_ROLE_LATENTS], 0);
    ck_assert_uint_eq(st.bytes_role[GHC_ROLE_TEXT_EMBEDS], 1000);
    /* over the 1 MiB limit, and a CUDA device: clear errors, no pointer */
    ck_assert_int_eq(ghc_mem_alloc(mp, 2u << 20, GHC_ROLE_WEIGHTS, GHC_DEVICE_CPU, &c), GHC_ENOMEM);
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(ghc_error_message(core), "would exceed limit_mib"), "%s", ghc_error_message(core));
    ck_assert_int_eq(ghc_mem_alloc(mp, 16, GHC_ROLE_WEIGHTS, 0, &c), GHC_EUNSUPPORTED);
    ck_assert_int_eq(ghc_mem_prefetch(mp, a, 1000, GHC_DEVICE_CPU, NULL), 0);  /* optional: no-op */
    ghc_mem_release(mp, a);
    ghc_mem_release(mp, b);
    ghc_mem_release(mp, NULL);
    ck_assert_int_eq(ghc_mem_stats(mp, &st), 0);
    ck_assert_uint_eq(st.bytes_host, 0);
    ck_assert_uint_eq(st.bytes_peak, 4000);
    ghc_core_free(core);
}
END_TEST

START_TEST(constant_scheduler)
{
    ghc_core_t *core = core_with("scheduler = { plugin = \"constant\"; micro_batches = 3; warmup_steps = 4; };\n");
    ck_assert_msg(ghc_run_init(core) == 0, "%s", ghc_error_message(core));
    ghc_scheduler_t *s = ghc_scheduler_get(core);
    ck_assert_int_eq(ghc_scheduler_micro_batches(s, 0), 3);
    ck_assert_int_eq(ghc_scheduler_micro_batches(s, 1000), 3);
    ck_assert_float_eq(ghc_scheduler_lr_factor(s, 0), 0.25f);
    ck_assert_float_eq(ghc_scheduler_lr_factor(s, 2), 0.75f);
    ck_assert_float_eq(ghc_scheduler_lr_factor(s, 3), 1.0f);
    ck_assert_float_eq(ghc_scheduler_lr_factor(s, 100), 1.0f);
    ghc_core_free(core);
    core = core_with("scheduler = { plugin = \"constant\";\n micro_batches = 0; };\n");
    ck_assert_int_eq(ghc_run_init(core), GHC_ECONFIG);
    ck_assert_msg(strstr(ghc_error_message(core), "test.cfg:2: scheduler.micro_batches = 0 is out of range [1, 65536]"),
                  "%s", ghc_error_message(core));
    ghc_core_free(core);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("loader");
    TCase *tc = tcase_create("good");
    tcase_add_test(tc, good_by_path);
    tcase_add_test(tc, good_by_name_on_search_path);
    tcase_add_test(tc, env_path_is_searched);
    tcase_add_test(tc, insecure_refused);
    tcase_add_test(tc, relative_folder_refused);
    tcase_add_test(tc, shadow_named);
    suite_add_tcase(s, tc);
    tc = tcase_create("failures");
    tcase_add_test(tc, missing_by_name);
    tcase_add_test(tc, missing_suggests_a_name);
    tcase_add_test(tc, missing_file);
    tcase_add_test(tc, not_a_shared_object);
    tcase_add_test(tc, undefined_symbol);
    tcase_add_test(tc, missing_entry);
    tcase_add_test(tc, tiny_symbol);
    tcase_add_test(tc, abi_mismatch);
    tcase_add_test(tc, api_too_new);
    tcase_add_test(tc, name_mismatch);
    tcase_add_test(tc, missing_required);
    tcase_add_test(tc, ops_too_large);
    tcase_add_test(tc, undeclared_kind);
    tcase_add_test(tc, unregistered_kind);
    tcase_add_test(tc, init_fails);
    tcase_add_test(tc, duplicate_name);
    tcase_add_test(tc, register_outside_init);
    suite_add_tcase(s, tc);
    tc = tcase_create("instances");
    tcase_add_test(tc, instance_of_good);
    tcase_add_test(tc, wrong_kind);
    tcase_add_test(tc, missing_plugin_key);
    tcase_add_test(tc, instance_init_fails);
    tcase_add_test(tc, member_fails_silently);
    tcase_add_test(tc, host_mempolicy);
    tcase_add_test(tc, constant_scheduler);
    suite_add_tcase(s, tc);
    return tu_run_suite(s, false);
}
