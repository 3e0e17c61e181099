/* test_docs.c: the documentation and the example configurations against the code:
 * - every key a shipped plugin or a core section declares (`gh200core plugins --keys`) has a
 *   row in doc/config.md, in the part for that plugin or section;
 * - every key used in etc/*.cfg is declared by the plugin (or core section) it belongs to, and
 *   every plugin named there exists. */
#include <config.h>

#include <dirent.h>
#include <libconfig.h>

#include "testutil.h"

struct key { char section[32], name[64], key[64]; };

static struct key keys[1024];
static int n_keys;

static void load_keys(void)
{
    if (n_keys)
        return;
    char cmd[4096], *out;
    snprintf(cmd, sizeof(cmd), "GHC_PLUGIN_PATH='%s' '%s' plugins --keys", tu_env("GHC_BUILD_PLUGINS"), tu_env("GHC_CLI"));
    ck_assert_int_eq(tu_run(cmd, &out), 0);
    char *save, *line = strtok_r(out, "\n", &save);
    for (line = strtok_r(NULL, "\n", &save); line && n_keys < 1024; line = strtok_r(NULL, "\n", &save)) {
        struct key *k = &keys[n_keys];
        char type[32];
        if (sscanf(line, "%31s %63s %63s %31s", k->section, k->name, k->key, type) == 4)
            n_keys++;
    }
    free(out);
    ck_assert_int_gt(n_keys, 100);
}

static bool declared(const char *section, const char *name, const char *key)
{
    for (int i = 0; i < n_keys; i++)
        if (!strcmp(keys[i].section, section) && !strcmp(keys[i].name, name) && !strcmp(keys[i].key, key))
            return true;
    return false;
}

static bool has_plugin(const char *section, const char *name)
{
    char cmd[4096], *out;
    snprintf(cmd, sizeof(cmd), "GHC_PLUGIN_PATH='%s' '%s' plugins", tu_env("GHC_BUILD_PLUGINS"), tu_env("GHC_CLI"));
    ck_assert_int_eq(tu_run(cmd, &out), 0);
    char want[256];
    snprintf(want, sizeof(want), "\n%-10s %-16s ", section, name);
    bool found = strstr(out, want) != NULL;
    free(out);
    return found;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot read %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    ck_assert_int_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

/* The part of doc/config.md under the heading that names this section (and plugin): from
 * that heading to the next heading of the same or a higher level. NULL when absent. */
static char *doc_part(const char *doc, const char *section, const char *name)
{
    const char *p = doc;
    while ((p = strstr(p, "\n#"))) {
        p++;
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        char head[512];
        snprintf(head, sizeof(head), "%.*s", (int)(len < 511 ? len : 511), p);
        int level = (int)strspn(head, "#");
        bool match;
        char q1[96], q2[96];
        if (!strcmp(name, "-") || !strcmp(name, "datasets")) {
            snprintf(q1, sizeof(q1), "`%s`", section);
            snprintf(q2, sizeof(q2), "## %s", section);
            match = strstr(head, q1) || !strcmp(head, q2);
        } else {
            snprintf(q1, sizeof(q1), "`%s`", name);
            snprintf(q2, sizeof(q2), "\"%s\"", name);
            match = strstr(head, section) && (strstr(head, q1) || strstr(head, q2));
        }
        if (match) {
            const char *end = eol;
            while (end && (end = strstr(end, "\n#"))) {
                if ((int)strspn(end + 1, "#") <= level)
                    break;
                end++;
            }
            size_t n = end ? (size_t)(end - p) : strlen(p);
            char *part = malloc(n + 1);
            memcpy(part, p, n);
            part[n] = '\0';
            return part;
        }
    }
    return NULL;
}

START_TEST(test_config_md_documents_every_key)
{
    load_keys();
    char path[4096];
    snprintf(path, sizeof(path), "%s/doc/config.md", tu_env("GHC_TOP_SRCDIR"));
    char *doc = slurp(path);
    int missing = 0;
    for (int i = 0; i < n_keys; i++) {
        char *part = doc_part(doc, keys[i].section, keys[i].name);
        char want[96];
        if (!strcmp(keys[i].name, "datasets"))
            snprintf(want, sizeof(want), "`datasets[i].%s`", keys[i].key);
        else
            snprintf(want, sizeof(want), "`%s`", keys[i].key);
        if (!part) {
            fprintf(stderr, "doc/config.md: no part for %s %s\n", keys[i].section, keys[i].name);
            missing++;
        } else if (!strstr(part, want)) {
            fprintf(stderr, "doc/config.md: %s %s: key %s is not documented\n", keys[i].section, keys[i].name, keys[i].key);
            missing++;
        }
        free(part);
    }
    free(doc);
    ck_assert_msg(missing == 0, "%d declared keys are not documented in doc/config.md (listed above)", missing);
}
END_TEST

static const char *const kinds[] = { "mempolicy", "backend", "cache", "model", "network", "optimizer", "scheduler", NULL };

static int check_group(const char *file, config_setting_t *g, const char *section, const char *name)
{
    int bad = 0;
    for (int i = 0; i < config_setting_length(g); i++) {
        config_setting_t *m = config_setting_get_elem(g, (unsigned)i);
        const char *k = config_setting_name(m);
        if (!strcmp(k, "plugin") && strcmp(name, "-"))
            continue;
        if (!declared(section, name, k)) {
            fprintf(stderr, "%s:%d: %s %s: key '%s' is not declared\n", file, config_setting_source_line(m), section, name, k);
            bad++;
        }
    }
    return bad;
}

START_TEST(test_example_configs_use_declared_keys)
{
    load_keys();
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s/etc", tu_env("GHC_TOP_SRCDIR"));
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    int files = 0, bad = 0;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".cfg") != 0)
            continue;
        char path[8192];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        config_t c;
        config_init(&c);
        config_set_include_dir(&c, dir);
        ck_assert_msg(config_read_file(&c, path) == CONFIG_TRUE, "%s:%d: %s", path, config_error_line(&c), config_error_text(&c));
        config_setting_t *root = config_root_setting(&c);
        for (int i = 0; kinds[i]; i++) {
            config_setting_t *g = config_setting_get_member(root, kinds[i]);
            const char *plugin;
            if (!g)
                continue;
            ck_assert_msg(config_setting_lookup_string(g, "plugin", &plugin), "%s: %s has no plugin", path, kinds[i]);
#ifndef GHC_HAVE_CUDA
            /* a CPU-only build has no CUDA plugin to ask for its keys (configure --without-cuda) */
            if (!strcmp(plugin, "gh200_uvm") || !strcmp(plugin, "offload") || !strcmp(plugin, "device"))
                if (!has_plugin(kinds[i], plugin))
                    continue;
#endif
            ck_assert_msg(has_plugin(kinds[i], plugin), "%s: %s plugin '%s' is not built", path, kinds[i], plugin);
            bad += check_group(path, g, kinds[i], plugin);
        }
        static const char *const core_sections[] = { "train", "demo", "data", NULL };
        for (int i = 0; core_sections[i]; i++) {
            config_setting_t *g = config_setting_get_member(root, core_sections[i]);
            if (g)
                bad += check_group(path, g, core_sections[i], "-");
            config_setting_t *sets = g && !strcmp(core_sections[i], "data") ? config_setting_get_member(g, "datasets") : NULL;
            for (int j = 0; sets && j < config_setting_length(sets); j++)
                bad += check_group(path, config_setting_get_elem(sets, (unsigned)j), "data", "datasets");
        }
        config_destroy(&c);
        files++;
    }
    closedir(d);
    ck_assert_int_ge(files, 5);
    ck_assert_msg(bad == 0, "%d keys in etc/*.cfg are not declared (listed above)", bad);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("docs");
    TCase *tc = tcase_create("docs");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_config_md_documents_every_key);
    tcase_add_test(tc, test_example_configs_use_declared_keys);
    suite_add_tcase(s, tc);
    return tu_run_suite(s, false);
}
