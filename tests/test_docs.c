/* test_docs.c: the documentation and the example configurations against the code:
 * - every key a shipped plugin or a core section declares (`gh200core plugins --keys`) has a
 *   row in doc/config.md, in the part for that plugin or section;
 * - every key used in etc/*.cfg is declared by the plugin (or core section) it belongs to, and
 *   every plugin named there exists;
 * - the table of the nine kinds in doc/plugin-guide.md names exactly the members of each
 *   `struct ghc_<kind>_ops` in its header, required and optional as the header's comments say. */
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

static const char *const kinds[] = { "mempolicy", "backend", "cache", "model", "network", "optimizer", "scheduler",
                                     "vae", "text_encoder", NULL };

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

/* ---- doc/plugin-guide.md's table of the kinds against the headers ---------------------------- */

#define MAX_MEMBERS 64

struct members {
    int  n[2];                        /* [0] required, [1] optional */
    char name[2][MAX_MEMBERS][40];
};

static void add_member(struct members *m, int opt, const char *s, size_t len)
{
    ck_assert_int_lt(m->n[opt], MAX_MEMBERS);
    ck_assert_int_lt(len, sizeof(m->name[0][0]));
    memcpy(m->name[opt][m->n[opt]], s, len);
    m->name[opt][m->n[opt]++][len] = '\0';
}

static bool has_member(const struct members *m, int opt, const char *name)
{
    for (int i = 0; i < m->n[opt]; i++)
        if (strcmp(m->name[opt][i], name) == 0)
            return true;
    return false;
}

/* The function-pointer members of struct ghc_<kind>_ops, each under the last comment that
 * started with "required" or "optional" (init left out: every kind has it). */
static void header_members(const char *kind, struct members *m)
{
    char path[4096], open[64];
    /* each kind's header is its name, but for the encoders' one */
    bool enc = !strcmp(kind, "vae") || !strcmp(kind, "text_encoder");
    snprintf(path, sizeof(path), "%s/include/gh200core/%s.h", tu_env("GHC_TOP_SRCDIR"), enc ? "encoder" : kind);
    snprintf(open, sizeof(open), "struct ghc_%s_ops {", kind);
    char *h = slurp(path), *p = strstr(h, open);
    ck_assert_msg(p != NULL, "%s: no %s", path, open);
    char *end = strstr(p, "\n};");
    ck_assert_msg(end != NULL, "%s: %s does not end", path, open);
    int state = -1;
    while ((p = strpbrk(p, "/(")) && p < end) {
        if (p[0] == '/' && p[1] == '*') {
            const char *c = p + 2;
            while (*c == ' ')
                c++;
            if (strncmp(c, "required", 8) == 0)
                state = 0;
            else if (strncmp(c, "optional", 8) == 0)
                state = 1;
            p = strstr(p, "*/");
            ck_assert_ptr_nonnull(p);
        } else if (p[0] == '(' && p[1] == '*') {
            const char *s = p + 2;
            size_t len = strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789_");
            ck_assert_msg(state >= 0, "%s: member %.*s has no \"required\" or \"optional\" comment before it",
                          path, (int)len, s);
            if (len != 4 || strncmp(s, "init", 4) != 0)
                add_member(m, state, s, len);
        }
        p++;
    }
    free(h);
}

/* The `identifiers` of one table cell (words with a space or a dot are prose). */
static void cell_members(const char *cell, size_t cell_len, int opt, struct members *m)
{
    const char *p = cell, *end = cell + cell_len;
    while ((p = memchr(p, '`', (size_t)(end - p))) && p < end) {
        const char *q = memchr(p + 1, '`', (size_t)(end - p - 1));
        ck_assert_ptr_nonnull(q);
        size_t len = (size_t)(q - p - 1);
        if (len > 0 && strspn(p + 1, "abcdefghijklmnopqrstuvwxyz0123456789_") == len)
            add_member(m, opt, p + 1, len);
        p = q + 1;
    }
}

START_TEST(test_plugin_guide_lists_every_member)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/doc/plugin-guide.md", tu_env("GHC_TOP_SRCDIR"));
    char *doc = slurp(path);
    int bad = 0;
    for (int k = 0; kinds[k]; k++) {
        char row[64];
        snprintf(row, sizeof(row), "| %d | %s |", k + 1, kinds[k]);
        const char *r = strstr(doc, row);
        ck_assert_msg(r != NULL, "%s: no table row \"%s\"", path, row);
        const char *eol = strchr(r, '\n'), *col[6];
        int nc = 0;
        for (const char *c = r; c && c < eol && nc < 6; c = strchr(c + 1, '|'))
            col[nc++] = c;
        ck_assert_msg(nc == 6, "%s: the row of %s has %d columns, expected 6", path, kinds[k], nc - 1);
        struct members doc_m = { { 0, 0 } }, hdr = { { 0, 0 } };
        cell_members(col[3], (size_t)(col[4] - col[3]), 0, &doc_m);
        cell_members(col[4], (size_t)(col[5] - col[4]), 1, &doc_m);
        header_members(kinds[k], &hdr);
        for (int o = 0; o < 2; o++) {
            for (int i = 0; i < hdr.n[o]; i++)
                if (!has_member(&doc_m, o, hdr.name[o][i])) {
                    fprintf(stderr, "plugin-guide.md: %s's %s member `%s` is missing from its %s column\n", kinds[k],
                            o ? "optional" : "required", hdr.name[o][i], o ? "optional" : "required");
                    bad++;
                }
            for (int i = 0; i < doc_m.n[o]; i++)
                if (!has_member(&hdr, o, doc_m.name[o][i])) {
                    fprintf(stderr, "plugin-guide.md: `%s` in %s's %s column is not a%s member of struct ghc_%s_ops\n",
                            doc_m.name[o][i], kinds[k], o ? "optional" : "required", o ? "n optional" : " required",
                            kinds[k]);
                    bad++;
                }
        }
    }
    free(doc);
    ck_assert_msg(bad == 0, "%d differences between doc/plugin-guide.md's table and the headers (listed above)", bad);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("docs");
    TCase *tc = tcase_create("docs");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_config_md_documents_every_key);
    tcase_add_test(tc, test_example_configs_use_declared_keys);
    tcase_add_test(tc, test_plugin_guide_lists_every_member);
    suite_add_tcase(s, tc);
    return tu_run_suite(s, false);
}
