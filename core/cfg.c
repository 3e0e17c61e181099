/* cfg.c: the run's configuration: a libconfig file, --set overrides, key checks with
 * file:line, typed getters with defaults and bounds, and the resolved file written out.
 * Plugins never see libconfig: they get a ghc_cfg_t for their own section. */
#include <config.h>

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core_impl.h"

/* ---- handles and locations ---------------------------------------------------------------- */

/* "data.datasets[1].path": the names joined by dots, an element of a list as [i]. */
static char *setting_path(config_setting_t *s)
{
    config_setting_t *chain[64];
    int n = 0;
    size_t len = 1;
    for (config_setting_t *p = s; p && config_setting_parent(p) && n < 64; p = config_setting_parent(p)) {
        const char *nm = config_setting_name(p);
        chain[n++] = p;
        len += nm ? strlen(nm) + 1 : 14;   /* "[-2147483648]" */
    }
    char *path = malloc(len);
    if (!path)
        return NULL;
    size_t at = 0;
    path[0] = '\0';
    for (int i = n - 1; i >= 0; i--) {
        const char *nm = config_setting_name(chain[i]);
        int w = nm ? snprintf(path + at, len - at, "%s%s", at ? "." : "", nm)
                   : snprintf(path + at, len - at, "[%d]", config_setting_index(chain[i]));
        at += w > 0 ? (size_t)w : 0;
    }
    return path;
}

ghc_cfg_t *ghc_cfg_wrap(ghc_core_t *core, config_setting_t *s)
{
    struct ghc_config *c = core->config;
    for (ghc_cfg_t *h = c->handles; h; h = h->next)
        if (h->s == s)
            return h;
    ghc_cfg_t *h = calloc(1, sizeof(*h));
    if (!h || !(h->path = setting_path(s))) {
        free(h);
        ghc_error_set(core, GHC_ENOMEM, "config: out of memory");
        return NULL;
    }
    h->core = core;
    h->s = s;
    h->next = c->handles;
    c->handles = h;
    return h;
}

/* The --set path that produced `s` (or one of its parents), or NULL. */
static const char *override_of(const struct ghc_config *c, const config_setting_t *s)
{
    for (; s; s = config_setting_parent((config_setting_t *)s))
        for (int i = 0; i < c->n_overrides; i++)
            if (c->overridden[i] == s)
                return c->override_path[i];
    return NULL;
}

/* The file as the user can find it. libconfig resolves every @include (nested ones too)
 * against the main file's folder, and reports the name as written: prefix that folder.
 * NULL means the main file. */
static const char *include_path(const struct ghc_config *c, const char *file, char *buf, size_t n)
{
    if (!file || strcmp(file, c->file) == 0)
        return c->file;
    if (file[0] == '/' || strcmp(c->dir, ".") == 0)
        return file;
    snprintf(buf, n, "%s/%s", c->dir, file);
    return buf;
}

static const char *where_setting(const struct ghc_config *c, config_setting_t *s, char *buf, size_t n)
{
    const char *ov = override_of(c, s);
    if (ov) {
        snprintf(buf, n, "--set %s", ov);
        return buf;
    }
    /* Values recorded as defaults have no line: report the nearest parent that has one. */
    while (s && config_setting_source_line(s) == 0 && config_setting_parent(s))
        s = config_setting_parent(s);
    const char *file = s ? config_setting_source_file(s) : NULL;
    unsigned line = s ? config_setting_source_line(s) : 0;
    char path[4096], q[4096];
    file = ghc_path_quote(include_path(c, file, path, sizeof(path)), q, sizeof(q));
    if (line)
        snprintf(buf, n, "%s:%u", file, line);
    else
        snprintf(buf, n, "%s", file);
    return buf;
}

const char *ghc_cfg_where(ghc_cfg_t *cfg, const char *key)
{
    config_setting_t *s = key ? config_setting_get_member(cfg->s, key) : NULL;
    return where_setting(cfg->core->config, s ? s : cfg->s, cfg->where, sizeof(cfg->where));
}

const char *ghc_cfg_path(const ghc_cfg_t *cfg) { return cfg->path; }

ghc_core_t *ghc_cfg_core(const ghc_cfg_t *cfg) { return cfg->core; }

bool ghc_cfg_has(const ghc_cfg_t *cfg, const char *key)
{
    return config_setting_get_member(cfg->s, key) != NULL;
}

/* ---- types -------------------------------------------------------------------------------- */

static const char *lc_type_name(int t)
{
    switch (t) {
    case CONFIG_TYPE_INT:
    case CONFIG_TYPE_INT64:  return "an integer";
    case CONFIG_TYPE_FLOAT:  return "a float";
    case CONFIG_TYPE_BOOL:   return "a boolean";
    case CONFIG_TYPE_STRING: return "a string";
    case CONFIG_TYPE_ARRAY:
    case CONFIG_TYPE_LIST:   return "a list";
    case CONFIG_TYPE_GROUP:  return "a group";
    default:                 return "nothing";
    }
}

static const char *key_type_name(enum ghc_cfg_type t)
{
    switch (t) {
    case GHC_CFG_INT:    return "an integer";
    case GHC_CFG_FLOAT:  return "a number";
    case GHC_CFG_BOOL:   return "a boolean (true or false)";
    case GHC_CFG_STRING: return "a string";
    case GHC_CFG_LIST:   return "a list [ ... ]";
    case GHC_CFG_GROUP:  return "a group { ... }";
    }
    return "?";
}

static bool type_ok(enum ghc_cfg_type want, int t)
{
    switch (want) {
    case GHC_CFG_INT:    return t == CONFIG_TYPE_INT || t == CONFIG_TYPE_INT64;
    case GHC_CFG_FLOAT:  return t == CONFIG_TYPE_INT || t == CONFIG_TYPE_INT64 || t == CONFIG_TYPE_FLOAT;
    case GHC_CFG_BOOL:   return t == CONFIG_TYPE_BOOL;
    case GHC_CFG_STRING: return t == CONFIG_TYPE_STRING;
    case GHC_CFG_LIST:   return t == CONFIG_TYPE_LIST || t == CONFIG_TYPE_ARRAY;
    case GHC_CFG_GROUP:  return t == CONFIG_TYPE_GROUP;
    }
    return false;
}

static const struct ghc_cfg_key *key_find(const struct ghc_cfg_key *keys, const char *name)
{
    for (; keys && keys->name; keys++)
        if (strcmp(keys->name, name) == 0)
            return keys;
    return NULL;
}

static void key_suggest(const struct ghc_cfg_key *keys, const char *name, const char **best, int *dist)
{
    for (; keys && keys->name; keys++) {
        int d = ghc_edit_distance(name, keys->name);
        if (d < *dist) {
            *dist = d;
            *best = keys->name;
        }
    }
}

/* "scheduler.depth" for `key` in section "scheduler"; "seed" at the top level. */
static const char *qualified(const ghc_cfg_t *cfg, const char *key, char *buf, size_t n)
{
    snprintf(buf, n, "%s%s%s", cfg->path, *cfg->path ? "." : "", key);
    return buf;
}

static int type_error(ghc_cfg_t *cfg, config_setting_t *s, const char *key, const char *want)
{
    char where[4352], q[256];
    return ghc_error_set(cfg->core, GHC_ECONFIG, "%s: %s: expected %s, got %s",
                         where_setting(cfg->core->config, s, where, sizeof(where)),
                         qualified(cfg, key, q, sizeof(q)), want, lc_type_name(config_setting_type(s)));
}

int ghc_cfg_check_keys(ghc_cfg_t *cfg, const struct ghc_cfg_key *keys,
                       const struct ghc_cfg_key *extra, const char *what)
{
    struct ghc_config *c = cfg->core->config;
    char where[4352];
    /* The getters hold their defaults and bounds against this table (declared_*). libconfig's
     * hook is a setting's one user pointer; nothing else in gh200core uses it. */
    config_setting_set_hook(cfg->s, (void *)keys);
    int n = config_setting_length(cfg->s);
    for (int i = 0; i < n; i++) {
        config_setting_t *s = config_setting_get_elem(cfg->s, i);
        const char *name = config_setting_name(s);
        const struct ghc_cfg_key *k = key_find(keys, name);
        if (!k)
            k = key_find(extra, name);
        if (!k) {
            const char *best = NULL;
            int dist = 3;
            key_suggest(keys, name, &best, &dist);
            key_suggest(extra, name, &best, &dist);
            if (best && dist > (int)strlen(name) / 2)
                best = NULL;
            return ghc_error_set(cfg->core, GHC_ECONFIG, "%s: %s: unknown key '%s'%s%s%s",
                                 where_setting(c, s, where, sizeof(where)), what, name,
                                 best ? " (did you mean '" : "", best ? best : "", best ? "'?)" : "");
        }
        if (!type_ok(k->type, config_setting_type(s)))
            return ghc_error_set(cfg->core, GHC_ECONFIG, "%s: %s: key '%s' must be %s, got %s",
                                 where_setting(c, s, where, sizeof(where)), what, name,
                                 key_type_name(k->type), lc_type_name(config_setting_type(s)));
    }
    return 0;
}

/* ---- declared defaults and ranges ------------------------------------------------------------ */

/* A key table's def and range are what `gh200core plugins --keys` shows; the getters hold them
 * against the default and bounds the code passes, so that the listing stays true. A difference
 * is the table's fault, never the user's: it is logged, not returned. */

/* The entry for `key` in the table the section was checked against, or NULL. */
static const struct ghc_cfg_key *declared(const ghc_cfg_t *cfg, const char *key)
{
    return key_find(config_setting_get_hook(cfg->s), key);
}

/* "(...)" is a description for people, not a value. */
static bool is_prose(const char *s) { return !s || *s == '('; }

/* A number as tables write it, the whole of s[0, n): a C number ("1e-4", "-1"), 2^N or 2^N-1
 * (N <= 64), each with an optional '-'. Long double holds every int64_t exactly. */
static bool decl_number(const char *s, size_t n, long double *out)
{
    char buf[64], *end;
    if (n == 0 || n >= sizeof(buf))
        return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    const char *p = buf[0] == '-' ? buf + 1 : buf;
    long double v;
    if (p[0] == '2' && p[1] == '^') {
        long e = strtol(p + 2, &end, 10);
        if (end == p + 2 || e < 0 || e > 64)
            return false;
        v = ldexpl(1.0L, (int)e);
        if (strcmp(end, "-1") == 0)
            v -= 1.0L;
        else if (*end)
            return false;
    } else {
        v = strtold(p, &end);
        if (end == p || *end)
            return false;
    }
    *out = buf[0] == '-' ? -v : v;
    return true;
}

/* "LO to HI" with two numbers; false for anything else (prose, choices). */
static bool decl_range(const char *r, long double *lo, long double *hi)
{
    const char *to = r && !is_prose(r) ? strstr(r, " to ") : NULL;
    return to && decl_number(r, (size_t)(to - r), lo) && decl_number(to + 4, strlen(to + 4), hi);
}

static bool near(long double a, long double b)
{
    return a == b || fabsl(a - b) <= 1e-6L * fmaxl(fabsl(a), fabsl(b));
}

static void decl_mismatch(ghc_cfg_t *cfg, const char *key, const char *what, const char *table, const char *code)
{
    char q[256];
    ghc_log(cfg->core, GHC_LOG_WARN, "config: %s: its key table declares the %s %s, the code uses %s "
            "(`gh200core plugins --keys` is wrong about it)", qualified(cfg, key, q, sizeof(q)), what, table, code);
}

static void declared_number(ghc_cfg_t *cfg, const char *key, bool integer, long double def, long double min,
                            long double max)
{
    const struct ghc_cfg_key *k = declared(cfg, key);
    long double v, lo, hi;
    char code[128];
    if (!k)
        return;
    if (!is_prose(k->def) && !(decl_number(k->def, strlen(k->def), &v) && (integer ? v == def : near(v, def)))) {
        snprintf(code, sizeof(code), integer ? "%.0Lf" : "%.9Lg", def);
        decl_mismatch(cfg, key, "default", k->def, code);
    }
    if (decl_range(k->range, &lo, &hi) && !(integer ? lo == min && hi == max : near(lo, min) && near(hi, max))) {
        snprintf(code, sizeof(code), integer ? "%.0Lf to %.0Lf" : "%.9Lg to %.9Lg", min, max);
        decl_mismatch(cfg, key, "range", k->range, code);
    }
}

static void declared_text(ghc_cfg_t *cfg, const char *key, const char *def)
{
    const struct ghc_cfg_key *k = declared(cfg, key);
    if (k && !is_prose(k->def) && !(def && strcmp(k->def, def) == 0))
        decl_mismatch(cfg, key, "default", k->def, def ? def : "none");
}

/* A choice's range lists its choices: "off, block". */
static void declared_choices(ghc_cfg_t *cfg, const char *key, const char *const *choices)
{
    const struct ghc_cfg_key *k = declared(cfg, key);
    if (!k || is_prose(k->range) || strstr(k->range, " to "))
        return;
    char list[512] = "";
    for (int i = 0; choices[i]; i++) {
        size_t l = strlen(list);
        snprintf(list + l, sizeof(list) - l, "%s%s", i ? ", " : "", choices[i]);
    }
    if (strcmp(k->range, list) != 0)
        decl_mismatch(cfg, key, "choices", k->range, list);
}

/* ---- getters -------------------------------------------------------------------------------- */

/* Record a default in the tree so that the resolved configuration shows every value in use. */
static config_setting_t *record(ghc_cfg_t *cfg, const char *key, int type)
{
    if (config_setting_type(cfg->s) != CONFIG_TYPE_GROUP)
        return NULL;
    return config_setting_add(cfg->s, key, type);
}

int ghc_cfg_get_int(ghc_cfg_t *cfg, const char *key, int64_t def, int64_t min, int64_t max, int64_t *out)
{
    char q[256];
    declared_number(cfg, key, true, def, min, max);
    config_setting_t *s = config_setting_get_member(cfg->s, key);
    if (!s) {
        config_setting_t *r = record(cfg, key, (def >= INT32_MIN && def <= INT32_MAX)
                                                   ? CONFIG_TYPE_INT : CONFIG_TYPE_INT64);
        if (r)
            config_setting_set_int64(r, def);
        *out = def;
        return 0;
    }
    if (!type_ok(GHC_CFG_INT, config_setting_type(s)))
        return type_error(cfg, s, key, "an integer");
    int64_t v = config_setting_get_int64(s);
    if (v < min || v > max)
        return ghc_error_set(cfg->core, GHC_ECONFIG,
                             "%s: %s = %" PRId64 " is out of range [%" PRId64 ", %" PRId64 "]",
                             ghc_cfg_where(cfg, key), qualified(cfg, key, q, sizeof(q)), v, min, max);
    *out = v;
    return 0;
}

int ghc_cfg_get_float(ghc_cfg_t *cfg, const char *key, double def, double min, double max, double *out)
{
    char q[256];
    declared_number(cfg, key, false, def, min, max);
    config_setting_t *s = config_setting_get_member(cfg->s, key);
    if (!s) {
        config_setting_t *r = record(cfg, key, CONFIG_TYPE_FLOAT);
        if (r)
            config_setting_set_float(r, def);
        *out = def;
        return 0;
    }
    int t = config_setting_type(s);
    if (!type_ok(GHC_CFG_FLOAT, t))
        return type_error(cfg, s, key, "a number");
    double v = t == CONFIG_TYPE_FLOAT ? config_setting_get_float(s) : (double)config_setting_get_int64(s);
    if (!(v >= min && v <= max))  /* NaN fails too */
        return ghc_error_set(cfg->core, GHC_ECONFIG, "%s: %s = %g is out of range [%g, %g]",
                             ghc_cfg_where(cfg, key), qualified(cfg, key, q, sizeof(q)), v, min, max);
    *out = v;
    return 0;
}

int ghc_cfg_get_bool(ghc_cfg_t *cfg, const char *key, bool def, bool *out)
{
    declared_text(cfg, key, def ? "true" : "false");
    config_setting_t *s = config_setting_get_member(cfg->s, key);
    if (!s) {
        config_setting_t *r = record(cfg, key, CONFIG_TYPE_BOOL);
        if (r)
            config_setting_set_bool(r, def);
        *out = def;
        return 0;
    }
    if (config_setting_type(s) != CONFIG_TYPE_BOOL)
        return type_error(cfg, s, key, "a boolean (true or false)");
    *out = config_setting_get_bool(s) != 0;
    return 0;
}

int ghc_cfg_get_string(ghc_cfg_t *cfg, const char *key, const char *def, const char **out)
{
    declared_text(cfg, key, def);
    config_setting_t *s = config_setting_get_member(cfg->s, key);
    if (!s) {
        config_setting_t *r = def ? record(cfg, key, CONFIG_TYPE_STRING) : NULL;
        if (r) {
            config_setting_set_string(r, def);
            def = config_setting_get_string(r);  /* owned by the tree from now on */
        }
        *out = def;
        return 0;
    }
    if (config_setting_type(s) != CONFIG_TYPE_STRING)
        return type_error(cfg, s, key, "a string");
    *out = config_setting_get_string(s);
    return 0;
}

int ghc_cfg_get_choice(ghc_cfg_t *cfg, const char *key, int def, const char *const *choices, int *out)
{
    const char *v;
    declared_choices(cfg, key, choices);
    int rc = ghc_cfg_get_string(cfg, key, choices[def], &v);
    if (rc < 0)
        return rc;
    char list[512] = "";
    const char *best = NULL;
    int dist = 3;
    for (int i = 0; choices[i]; i++) {
        if (strcmp(choices[i], v) == 0) {
            *out = i;
            return 0;
        }
        int d = ghc_edit_distance(v, choices[i]);
        if (d < dist) {
            dist = d;
            best = choices[i];
        }
        size_t l = strlen(list);
        snprintf(list + l, sizeof(list) - l, "%s%s", i ? ", " : "", choices[i]);
    }
    char q[256];
    return ghc_error_set(cfg->core, GHC_ECONFIG, "%s: %s = \"%s\" is not one of: %s%s%s%s",
                         ghc_cfg_where(cfg, key), qualified(cfg, key, q, sizeof(q)), v, list,
                         best ? " (did you mean '" : "", best ? best : "", best ? "'?)" : "");
}

static int list_get(ghc_cfg_t *cfg, const char *key, config_setting_t **out)
{
    config_setting_t *s = config_setting_get_member(cfg->s, key);
    *out = s;
    if (s && !type_ok(GHC_CFG_LIST, config_setting_type(s)))
        return type_error(cfg, s, key, "a list [ ... ]");
    return 0;
}

int ghc_cfg_list_len(ghc_cfg_t *cfg, const char *key, int *out)
{
    config_setting_t *s;
    int rc = list_get(cfg, key, &s);
    *out = (rc == 0 && s) ? config_setting_length(s) : 0;
    return rc;
}

static int list_elem(ghc_cfg_t *cfg, const char *key, int i, config_setting_t **out)
{
    char q[256];
    config_setting_t *s;
    int rc = list_get(cfg, key, &s);
    if (rc < 0)
        return rc;
    config_setting_t *e = s ? config_setting_get_elem(s, (unsigned)i) : NULL;
    if (!e)
        return ghc_error_set(cfg->core, GHC_ECONFIG, "%s: %s has no element %d",
                             ghc_cfg_where(cfg, key), qualified(cfg, key, q, sizeof(q)), i);
    *out = e;
    return 0;
}

int ghc_cfg_list_string(ghc_cfg_t *cfg, const char *key, int i, const char **out)
{
    char q[256];
    config_setting_t *e;
    int rc = list_elem(cfg, key, i, &e);
    if (rc < 0)
        return rc;
    if (config_setting_type(e) != CONFIG_TYPE_STRING)
        return ghc_error_set(cfg->core, GHC_ECONFIG, "%s: %s[%d]: expected a string, got %s",
                             ghc_cfg_where(cfg, key), qualified(cfg, key, q, sizeof(q)), i,
                             lc_type_name(config_setting_type(e)));
    *out = config_setting_get_string(e);
    return 0;
}

int ghc_cfg_list_float(ghc_cfg_t *cfg, const char *key, int i, double *out)
{
    char q[256];
    config_setting_t *e;
    int rc = list_elem(cfg, key, i, &e);
    if (rc < 0)
        return rc;
    int t = config_setting_type(e);
    if (!type_ok(GHC_CFG_FLOAT, t))
        return ghc_error_set(cfg->core, GHC_ECONFIG, "%s: %s[%d]: expected a number, got %s",
                             ghc_cfg_where(cfg, key), qualified(cfg, key, q, sizeof(q)), i, lc_type_name(t));
    *out = t == CONFIG_TYPE_FLOAT ? config_setting_get_float(e) : (double)config_setting_get_int64(e);
    return 0;
}

int ghc_cfg_list_group(ghc_cfg_t *cfg, const char *key, int i, const struct ghc_cfg_key *keys, ghc_cfg_t **out)
{
    char where[4352], q[256];
    config_setting_t *e;
    *out = NULL;
    int rc = list_elem(cfg, key, i, &e);
    if (rc < 0)
        return rc;
    if (config_setting_type(e) != CONFIG_TYPE_GROUP)
        return ghc_error_set(cfg->core, GHC_ECONFIG, "%s: %s[%d]: expected a group { ... }, got %s",
                             where_setting(cfg->core->config, e, where, sizeof(where)),
                             qualified(cfg, key, q, sizeof(q)), i, lc_type_name(config_setting_type(e)));
    ghc_cfg_t *g = ghc_cfg_wrap(cfg->core, e);
    if (!g)
        return GHC_ENOMEM;
    rc = ghc_cfg_check_keys(g, keys, NULL, g->path);
    if (rc == 0)
        *out = g;
    return rc;
}

int ghc_cfg_get_group(ghc_cfg_t *cfg, const char *key, const struct ghc_cfg_key *keys, ghc_cfg_t **out)
{
    config_setting_t *s = config_setting_get_member(cfg->s, key);
    *out = NULL;
    if (!s)
        return 0;
    if (config_setting_type(s) != CONFIG_TYPE_GROUP)
        return type_error(cfg, s, key, "a group { ... }");
    ghc_cfg_t *g = ghc_cfg_wrap(cfg->core, s);
    if (!g)
        return GHC_ENOMEM;
    int rc = ghc_cfg_check_keys(g, keys, NULL, g->path);
    if (rc == 0)
        *out = g;
    return rc;
}

/* ---- overrides (--set a.b=value) ------------------------------------------------------------ */

static int copy_value(config_setting_t *dst, const config_setting_t *src);

static config_setting_t *copy_into(config_setting_t *parent, const char *name, const config_setting_t *src)
{
    config_setting_t *d = config_setting_add(parent, name, config_setting_type(src));
    if (d && copy_value(d, src) < 0)
        return NULL;
    return d;
}

static int copy_value(config_setting_t *dst, const config_setting_t *src)
{
    switch (config_setting_type(src)) {
    case CONFIG_TYPE_INT:
    case CONFIG_TYPE_INT64:  return config_setting_set_int64(dst, config_setting_get_int64(src)) ? 0 : -1;
    case CONFIG_TYPE_FLOAT:  return config_setting_set_float(dst, config_setting_get_float(src)) ? 0 : -1;
    case CONFIG_TYPE_BOOL:   return config_setting_set_bool(dst, config_setting_get_bool(src)) ? 0 : -1;
    case CONFIG_TYPE_STRING: return config_setting_set_string(dst, config_setting_get_string(src)) ? 0 : -1;
    default: {
        int n = config_setting_length(src);
        bool group = config_setting_type(src) == CONFIG_TYPE_GROUP;
        for (int i = 0; i < n; i++) {
            const config_setting_t *e = config_setting_get_elem(src, (unsigned)i);
            if (!copy_into(dst, group ? config_setting_name(e) : NULL, e))
                return -1;
        }
        return 0;
    }
    }
}

static bool valid_path(const char *p, size_t n)
{
    if (n == 0 || p[0] == '.' || p[n - 1] == '.')
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                  ch == '_' || ch == '-' || ch == '*' || (ch == '.' && p[i + 1] != '.');
        if (!ok)
            return false;
    }
    return true;
}

/* Remember that `s` came from `--set arg` (the key part, up to `eq`). */
static int override_record(ghc_core_t *core, config_setting_t *s, const char *arg, const char *eq)
{
    struct ghc_config *c = core->config;
    config_setting_t **ov = realloc(c->overridden, (size_t)(c->n_overrides + 1) * sizeof(*ov));
    if (ov)
        c->overridden = ov;
    char **op = realloc(c->override_path, (size_t)(c->n_overrides + 1) * sizeof(*op));
    if (op)
        c->override_path = op;
    char *p = ghc_strdup(arg);
    if (!ov || !op || !p) {
        free(p);
        return ghc_error_set(core, GHC_ENOMEM, "--set %s: out of memory", arg);
    }
    p[eq - arg] = '\0';
    c->overridden[c->n_overrides] = s;
    c->override_path[c->n_overrides++] = p;
    return 0;
}

/* libconfig's rule for names: [A-Za-z*][-A-Za-z0-9_*]* */
static bool valid_key_name(const char *name)
{
    if (!((*name >= 'a' && *name <= 'z') || (*name >= 'A' && *name <= 'Z') || *name == '*'))
        return false;
    for (const char *p = name + 1; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '_' || *p == '-' || *p == '*'))
            return false;
    return true;
}

static int apply_override(ghc_core_t *core, const char *arg)
{
    struct ghc_config *c = core->config;
    const char *eq = strchr(arg, '=');
    if (!eq || !valid_path(arg, (size_t)(eq - arg)))
        return ghc_error_set(core, GHC_ECONFIG,
                             "--set %s: expected KEY=VALUE with KEY a dotted path such as optimizer.lr", arg);
    char path[256];
    if ((size_t)(eq - arg) >= sizeof(path))
        return ghc_error_set(core, GHC_ECONFIG, "--set %s: key too long", arg);
    memcpy(path, arg, (size_t)(eq - arg));
    path[eq - arg] = '\0';
    const char *value = eq + 1;

    /* Walk to the parent group, creating groups the file lacks (they count as --set's own). */
    config_setting_t *cur = config_root_setting(&c->lc);
    char *save = NULL, *seg = strtok_r(path, ".", &save);
    char *next;
    int rc;
    for (; (next = strtok_r(NULL, ".", &save)); seg = next) {
        config_setting_t *ch = config_setting_get_member(cur, seg);
        if (ch && config_setting_type(ch) != CONFIG_TYPE_GROUP)
            return ghc_error_set(core, GHC_ECONFIG, "--set %.*s: '%s' is %s, not a group",
                                 (int)(eq - arg), arg, seg, lc_type_name(config_setting_type(ch)));
        if (!ch) {
            if (!(ch = config_setting_add(cur, seg, CONFIG_TYPE_GROUP)))
                return ghc_error_set(core, GHC_ECONFIG, "--set %.*s: '%s' is not a valid key name "
                                     "(a letter or '*' first, then letters, digits, '_', '-', '*')",
                                     (int)(eq - arg), arg, seg);
            if ((rc = override_record(core, ch, arg, eq)) < 0)
                return rc;
        }
        cur = ch;
    }
    if (!valid_key_name(seg))
        return ghc_error_set(core, GHC_ECONFIG, "--set %.*s: '%s' is not a valid key name "
                             "(a letter or '*' first, then letters, digits, '_', '-', '*')",
                             (int)(eq - arg), arg, seg);

    /* Parse the value as libconfig would; anything that does not parse is a string, and so is
     * an unquoted value for a key the file holds as a string. */
    config_setting_t *old = config_setting_get_member(cur, seg);
    config_t tmp;
    config_init(&tmp);
    size_t n = strlen(value) + 8;
    char *text = malloc(n);
    if (!text) {
        config_destroy(&tmp);
        return ghc_error_set(core, GHC_ENOMEM, "--set %s: out of memory", arg);
    }
    snprintf(text, n, "v = %s;", value);
    /* an @include in a value is no value: libconfig would open it (a directory ends the
     * process in its scanner), so such a value stays a string */
    bool parsed = *value && !strstr(value, "@include") && config_read_string(&tmp, text) == CONFIG_TRUE &&
                  config_setting_length(config_root_setting(&tmp)) == 1;
    free(text);
    config_setting_t *src = parsed ? config_lookup(&tmp, "v") : NULL;
    if (src && old && config_setting_type(old) == CONFIG_TYPE_STRING && value[0] != '"')
        src = NULL;
    bool to_float = src && old && config_setting_type(old) == CONFIG_TYPE_FLOAT &&
                    (config_setting_type(src) == CONFIG_TYPE_INT || config_setting_type(src) == CONFIG_TYPE_INT64);

    if (old && config_setting_remove(cur, seg) != CONFIG_TRUE) {
        config_destroy(&tmp);
        return ghc_error_set(core, GHC_ECONFIG, "--set %s: cannot replace the value", arg);
    }
    config_setting_t *dst;
    if (!src) {
        dst = config_setting_add(cur, seg, CONFIG_TYPE_STRING);
        if (dst)
            config_setting_set_string(dst, value);
    } else if (to_float) {
        dst = config_setting_add(cur, seg, CONFIG_TYPE_FLOAT);
        if (dst)
            config_setting_set_float(dst, (double)config_setting_get_int64(src));
    } else {
        dst = copy_into(cur, seg, src);
    }
    config_destroy(&tmp);
    if (!dst)
        return ghc_error_set(core, GHC_ENOMEM, "--set %s: out of memory", arg);

    return override_record(core, dst, arg, eq);
}

/* ---- setters -------------------------------------------------------------------------------- */

/* Drop what points at `s` or into it, which is about to go: handles (freed) and --set marks.
 * Compares pointers only: a mark may point at a value an earlier --set replaced. */
static void forget(struct ghc_config *c, config_setting_t *s)
{
    for (ghc_cfg_t **hp = &c->handles; *hp;) {
        ghc_cfg_t *h = *hp;
        if (h->s == s) {
            *hp = h->next;
            free(h->path);
            free(h);
        } else {
            hp = &h->next;
        }
    }
    for (int i = 0; i < c->n_overrides; i++)
        if (c->overridden[i] == s)
            c->overridden[i] = NULL;
    int n = config_setting_is_aggregate(s) ? config_setting_length(s) : 0;
    for (int i = 0; i < n; i++)
        forget(c, config_setting_get_elem(s, (unsigned)i));
}

/* `key` of the section as a setting of `type`: the one there when `keep` and it has that type,
 * else a new one in place of what was there. */
static int set_key(ghc_cfg_t *cfg, const char *key, int type, bool keep, config_setting_t **out)
{
    char q[256];
    *out = NULL;
    if (!valid_key_name(key))
        return ghc_error_set(cfg->core, GHC_EINVAL, "%s: %s: not a valid key name (a letter or '*' first, then "
                             "letters, digits, '_', '-', '*')", ghc_cfg_where(cfg, NULL),
                             qualified(cfg, key, q, sizeof(q)));
    config_setting_t *s = config_setting_get_member(cfg->s, key);
    if (s && keep && config_setting_type(s) == type) {
        *out = s;
        return 0;
    }
    if (s) {
        forget(cfg->core->config, s);
        if (config_setting_remove(cfg->s, key) != CONFIG_TRUE)
            return ghc_error_set(cfg->core, GHC_EINTERNAL, "%s: %s: cannot replace the value",
                                 ghc_cfg_where(cfg, NULL), qualified(cfg, key, q, sizeof(q)));
    }
    if (!(*out = config_setting_add(cfg->s, key, type)))
        return ghc_error_set(cfg->core, GHC_ENOMEM, "config: out of memory");
    return 0;
}

int ghc_cfg_set_string(ghc_cfg_t *cfg, const char *key, const char *value)
{
    config_setting_t *s;
    int rc = set_key(cfg, key, CONFIG_TYPE_STRING, true, &s);
    if (rc == 0 && !config_setting_set_string(s, value))
        rc = ghc_error_set(cfg->core, GHC_ENOMEM, "config: out of memory");
    return rc;
}

int ghc_cfg_remove(ghc_cfg_t *cfg, const char *key)
{
    char q[256];
    config_setting_t *s = config_setting_get_member(cfg->s, key);
    if (!s)
        return 0;
    forget(cfg->core->config, s);
    if (config_setting_remove(cfg->s, key) != CONFIG_TRUE)
        return ghc_error_set(cfg->core, GHC_EINTERNAL, "%s: %s: cannot remove it", ghc_cfg_where(cfg, NULL),
                             qualified(cfg, key, q, sizeof(q)));
    return 0;
}

int ghc_cfg_set_int(ghc_cfg_t *cfg, const char *key, int64_t value)
{
    config_setting_t *s;
    int rc = set_key(cfg, key, CONFIG_TYPE_INT64, true, &s);
    if (rc == 0 && !config_setting_set_int64(s, value))
        rc = ghc_error_set(cfg->core, GHC_ENOMEM, "config: out of memory");
    return rc;
}

int ghc_cfg_set_group(ghc_cfg_t *cfg, const char *key, ghc_cfg_t **out)
{
    config_setting_t *s;
    *out = NULL;
    int rc = set_key(cfg, key, CONFIG_TYPE_GROUP, true, &s);
    if (rc < 0)
        return rc;
    return (*out = ghc_cfg_wrap(cfg->core, s)) ? 0 : GHC_ENOMEM;
}

int ghc_cfg_set_group_list(ghc_cfg_t *cfg, const char *key, int n, ghc_cfg_t **out)
{
    char q[256];
    config_setting_t *list;
    if (n < 0)
        return ghc_error_set(cfg->core, GHC_EINVAL, "config: %s: a list of %d groups",
                             qualified(cfg, key, q, sizeof(q)), n);
    int rc = set_key(cfg, key, CONFIG_TYPE_LIST, false, &list);
    for (int i = 0; rc == 0 && i < n; i++) {
        config_setting_t *g = config_setting_add(list, NULL, CONFIG_TYPE_GROUP);
        if (!g)
            rc = ghc_error_set(cfg->core, GHC_ENOMEM, "config: out of memory");
        else if (!(out[i] = ghc_cfg_wrap(cfg->core, g)))
            rc = GHC_ENOMEM;
    }
    return rc;
}

/* ---- loading -------------------------------------------------------------------------------- */

static const struct ghc_cfg_key core_keys[] = {
    { "plugin_path", GHC_CFG_LIST,   NULL,     NULL,          NULL },
    { "allow_insecure_plugins", GHC_CFG_BOOL, "false", NULL,  NULL },
    { "output_dir",  GHC_CFG_STRING, "output", NULL,          NULL },
    { "seed",        GHC_CFG_INT,    "42",     "0 to 2^63-1", NULL },
    /* "auto": the trainer picks the memory policy and checkpointing that fit (estimate.c) */
    { "plan",        GHC_CFG_STRING, "configured", "configured, auto", NULL },
    { "mempolicy",   GHC_CFG_GROUP,  NULL,     NULL,          NULL },
    { "backend",     GHC_CFG_GROUP,  NULL,     NULL,          NULL },
    { "cache",       GHC_CFG_GROUP,  NULL,     NULL,          NULL },
    { "model",       GHC_CFG_GROUP,  NULL,     NULL,          NULL },
    { "network",     GHC_CFG_GROUP,  NULL,     NULL,          NULL },
    { "optimizer",   GHC_CFG_GROUP,  NULL,     NULL,          NULL },
    { "scheduler",   GHC_CFG_GROUP,  NULL,     NULL,          NULL },
    { "vae",         GHC_CFG_GROUP,  NULL,     NULL,          NULL },  /* the encoders: made on demand (prepare) */
    { "text_encoder", GHC_CFG_GROUP, NULL,     NULL,          NULL },
    { "data",        GHC_CFG_GROUP,  NULL,     NULL,          NULL },  /* the dataset (core/dataset.c checks its keys) */
    { "validation",  GHC_CFG_GROUP,  NULL,     NULL,          NULL },  /* held-out data, the keys of `data` */
    { "train",       GHC_CFG_GROUP,  NULL,     NULL,          NULL },
    { "demo",        GHC_CFG_GROUP,  NULL,     NULL,          NULL },
    { NULL, 0, NULL, NULL, NULL }
};

void ghc_config_free(struct ghc_config *c)
{
    if (!c)
        return;
    config_destroy(&c->lc);
    for (ghc_cfg_t *h = c->handles, *nx; h; h = nx) {
        nx = h->next;
        free(h->path);
        free(h);
    }
    for (int i = 0; i < c->n_overrides; i++)
        free(c->override_path[i]);
    free(c->override_path);
    free(c->overridden);
    free(c->file);
    free(c->dir);
    free(c);
}

static int parse_error(ghc_core_t *core, struct ghc_config *c)
{
    char path[4096], q[4096];
    return ghc_error_set(core, GHC_ECONFIG, "%s:%d: %s",
                         ghc_path_quote(include_path(c, config_error_file(&c->lc), path, sizeof(path)), q,
                                        sizeof(q)),
                         config_error_line(&c->lc), config_error_text(&c->lc));
}

static int config_start(ghc_core_t *core, const char *name, const char *dir, struct ghc_config **out)
{
    struct ghc_config *c = calloc(1, sizeof(*c));
    if (!c)
        return ghc_error_set(core, GHC_ENOMEM, "config: out of memory");
    config_init(&c->lc);
    c->file = ghc_strdup(name);
    c->dir = ghc_strdup(dir ? dir : ".");
    if (!c->file || !c->dir) {
        ghc_config_free(c);
        return ghc_error_set(core, GHC_ENOMEM, "config: out of memory");
    }
    config_set_include_dir(&c->lc, c->dir);
    *out = c;
    return 0;
}

/* Install `c` as the core's configuration, apply overrides, check the top-level keys. */
static int config_finish(ghc_core_t *core, struct ghc_config *c, const char *const *overrides, int n)
{
    ghc_run_free(core);
    ghc_config_free(core->config);
    core->config = c;
    c->root = ghc_cfg_wrap(core, config_root_setting(&c->lc));
    if (!c->root)
        return GHC_ENOMEM;
    int rc;
    for (int i = 0; i < n; i++)
        if ((rc = apply_override(core, overrides[i])) < 0)
            return rc;
    if ((rc = ghc_cfg_check_keys(c->root, core_keys, NULL, "top level")) < 0)
        return rc;
    int64_t seed;
    const char *out;
    if ((rc = ghc_cfg_get_int(c->root, "seed", 42, 0, INT64_MAX, &seed)) < 0 ||
        (rc = ghc_cfg_get_string(c->root, "output_dir", "output", &out)) < 0)
        return rc;
    if (!*out)
        return ghc_error_set(core, GHC_ECONFIG, "%s: output_dir must not be empty",
                             ghc_cfg_where(c->root, "output_dir"));
    int np;
    if ((rc = ghc_cfg_list_len(c->root, "plugin_path", &np)) < 0)
        return rc;
    /* Relative folders are relative to the configuration file: make them absolute now, so
     * that the resolved file written elsewhere still points at them. */
    char base[4096];
    if (!realpath(c->dir, base))
        snprintf(base, sizeof(base), "%s", c->dir);
    for (int i = 0; i < np; i++) {
        const char *p;
        if ((rc = ghc_cfg_list_string(c->root, "plugin_path", i, &p)) < 0)
            return rc;
        if (!*p)   /* as -P '': no folder at all, not the configuration's */
            return ghc_error_set(core, GHC_ECONFIG, "%s: plugin_path[%d] is empty (a folder expected)",
                                 ghc_cfg_where(c->root, "plugin_path"), i);
        if (p[0] != '/') {
            char abs[8200];
            while (!strncmp(p, "./", 2))
                p += 2;
            bool here = strcmp(p, ".") == 0;   /* the configuration's folder itself */
            snprintf(abs, sizeof(abs), "%s%s%s", base, here ? "" : "/", here ? "" : p);
            config_setting_t *list = config_setting_get_member(config_root_setting(&c->lc), "plugin_path");
            if (!config_setting_set_string(config_setting_get_elem(list, (unsigned)i), abs))
                return ghc_error_set(core, GHC_ENOMEM, "config: out of memory");
        }
    }
    return ghc_plugin_paths_resolve(core);
}

/* ---- @include: regular files only ------------------------------------------------------------ */

/* The whole of a regular file, NUL-terminated (NULL where it cannot be read: libconfig then
 * says why). */
static char *read_text(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    size_t n = 0, cap = 4096;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n < cap - 1)
            break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    if (buf)
        buf[n] = '\0';
    fclose(f);
    return buf;
}

/* libconfig (1.5 has no include hook) would fopen() every @include as it is: a FIFO blocks
 * it (also under --dry-run) and a directory ends in "input in flex scanner failed". Before it
 * parses, every `@include "file"` line of `text` (shown as `shown`), and of the regular files
 * it includes, is resolved as libconfig does (against the main file's folder) and anything
 * that exists and is not a regular file is refused, naming the line and the path. Paths that
 * do not exist are left to libconfig's own message. */
static int check_includes(ghc_core_t *core, const struct ghc_config *c, const char *text, const char *shown,
                          int depth)
{
    int line = 1, rc = 0;
    for (const char *p = text; *p && rc == 0; line++) {
        const char *q = p + strspn(p, " \t");
        const char *eol = strchr(p, '\n');
        if (strncmp(q, "@include", 8) == 0 && (q[8] == ' ' || q[8] == '\t')) {
            q += 8 + strspn(q + 8, " \t");
            const char *end = *q == '"' ? strchr(q + 1, '"') : NULL;
            if (end && (!eol || end < eol)) {
                char name[4096], path[8192];
                snprintf(name, sizeof(name), "%.*s", (int)(end - q - 1), q + 1);
                if (strchr(name, '\\')) {
                    /* libconfig reads escapes in the name ("\/" is "/"): the path it would open
                     * is not this one, so no check here could hold for it */
                    char qs[4096], qn[4096];
                    rc = ghc_error_set(core, GHC_ECONFIG, "%s:%d: @include \"%s\": a backslash in an @include "
                                       "path is not supported", ghc_path_quote(shown, qs, sizeof(qs)), line,
                                       ghc_path_quote(name, qn, sizeof(qn)));
                    break;
                }
                if (name[0] == '/' || !c->dir || strcmp(c->dir, ".") == 0)
                    snprintf(path, sizeof(path), "%s", name);
                else
                    snprintf(path, sizeof(path), "%s/%s", c->dir, name);
                struct stat sb;
                if (stat(path, &sb) == 0) {
                    if (!S_ISREG(sb.st_mode)) {
                        char qs[4096], qn[4096], qp[4096];
                        rc = ghc_error_set(core, GHC_ECONFIG, "%s:%d: @include \"%s\": %s is not a regular file%s",
                                           ghc_path_quote(shown, qs, sizeof(qs)), line,
                                           ghc_path_quote(name, qn, sizeof(qn)), ghc_path_quote(path, qp, sizeof(qp)),
                                           S_ISDIR(sb.st_mode) ? " (a directory)" : "");
                    } else if (depth < 10) {
                        char *sub = read_text(path);
                        if (sub)
                            rc = check_includes(core, c, sub, path, depth + 1);
                        free(sub);
                    }
                }
            }
        }
        if (!eol)
            break;
        p = eol + 1;
    }
    return rc;
}

int ghc_config_load(ghc_core_t *core, const char *path, const char *const *overrides, int n_overrides)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        char q[4096];
        return ghc_error_set(core, GHC_EIO, "%s: cannot read the configuration: %s",
                             ghc_path_quote(path, q, sizeof(q)), strerror(errno));
    }
    fclose(f);
    char *dir = ghc_strdup(path);
    if (!dir)
        return ghc_error_set(core, GHC_ENOMEM, "config: out of memory");
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[slash == dir] = '\0';
    struct ghc_config *c;
    int rc = config_start(core, path, slash ? dir : ".", &c);
    free(dir);
    if (rc < 0)
        return rc;
    struct stat sb;
    char *text = stat(path, &sb) == 0 && S_ISREG(sb.st_mode) ? read_text(path) : NULL;
    rc = text ? check_includes(core, c, text, path, 0) : 0;
    free(text);
    if (rc < 0) {
        ghc_config_free(c);
        return rc;
    }
    if (config_read_file(&c->lc, path) != CONFIG_TRUE) {
        rc = parse_error(core, c);
        ghc_config_free(c);
        return rc;
    }
    return config_finish(core, c, overrides, n_overrides);
}

int ghc_config_load_string(ghc_core_t *core, const char *text, const char *name, const char *dir,
                           const char *const *overrides, int n_overrides)
{
    struct ghc_config *c;
    int rc = config_start(core, name, dir, &c);
    if (rc < 0)
        return rc;
    if ((rc = check_includes(core, c, text, name, 0)) < 0) {
        ghc_config_free(c);
        return rc;
    }
    if (config_read_string(&c->lc, text) != CONFIG_TRUE) {
        rc = parse_error(core, c);
        ghc_config_free(c);
        return rc;
    }
    return config_finish(core, c, overrides, n_overrides);
}

int ghc_config_write(ghc_core_t *core, const char *path)
{
    if (!core->config)
        return ghc_error_set(core, GHC_EINVAL, "config: nothing loaded to write");
    size_t n = strlen(path) + 16;
    char *tmp = malloc(n);
    if (!tmp)
        return ghc_error_set(core, GHC_ENOMEM, "config: out of memory");
    snprintf(tmp, n, "%s.tmp.XXXXXX", path);
    int rc = 0;
    int fd = mkstemp(tmp);
    if (fd < 0) {
        rc = ghc_error_set(core, GHC_EIO, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        rc = ghc_error_set(core, GHC_EIO, "%s: %s", tmp, strerror(errno));
        goto out_unlink;
    }
    fprintf(f, "# gh200core %s: the resolved configuration of this run (includes expanded,\n"
               "# --set overrides applied, defaults filled in, plugin_path absolute). Run it again\n"
               "# with: gh200core -c THIS_FILE --set output_dir=NEW_DIR\n", GHC_VERSION);
    config_write(&core->config->lc, f);
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
        rc = ghc_error_set(core, GHC_EIO, "%s: cannot write: %s", tmp, strerror(errno));
        fclose(f);
        goto out_unlink;
    }
    if (fclose(f) != 0) {
        rc = ghc_error_set(core, GHC_EIO, "%s: cannot write: %s", tmp, strerror(errno));
        goto out_unlink;
    }
    if (rename(tmp, path) != 0) {
        rc = ghc_error_set(core, GHC_EIO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        goto out_unlink;
    }
    goto out;
out_unlink:
    unlink(tmp);
out:
    free(tmp);
    return rc;
}

ghc_cfg_t *ghc_config_section(ghc_core_t *core, const char *name)
{
    if (!core->config)
        return NULL;
    config_setting_t *s = config_setting_get_member(config_root_setting(&core->config->lc), name);
    if (!s || config_setting_type(s) != CONFIG_TYPE_GROUP)
        return NULL;
    return ghc_cfg_wrap(core, s);
}

ghc_cfg_t *ghc_config_root(ghc_core_t *core) { return core->config ? core->config->root : NULL; }

const char *ghc_config_dir(ghc_core_t *core) { return core->config ? core->config->dir : NULL; }

const char *ghc_config_output_dir(ghc_core_t *core)
{
    const char *out = "output";
    if (core->config)
        ghc_cfg_get_string(core->config->root, "output_dir", "output", &out);
    return out;
}

/* ---- comparing with a written configuration ------------------------------------------------- */

/* The value of a setting as text: scalars as libconfig writes them, lists, arrays and groups
 * whole. Into buf (n bytes, cut to fit). */
static void value_text(const config_setting_t *s, char *buf, size_t n)
{
    size_t at = strlen(buf);
    if (at + 1 >= n)
        return;
    int t = config_setting_type(s);
    switch (t) {
    case CONFIG_TYPE_INT:
    case CONFIG_TYPE_INT64:
        snprintf(buf + at, n - at, "%lld", (long long)config_setting_get_int64(s));
        return;
    case CONFIG_TYPE_FLOAT:
        snprintf(buf + at, n - at, "%.17g", config_setting_get_float(s));
        return;
    case CONFIG_TYPE_BOOL:
        snprintf(buf + at, n - at, "%s", config_setting_get_bool(s) ? "true" : "false");
        return;
    case CONFIG_TYPE_STRING:
        snprintf(buf + at, n - at, "\"%s\"", config_setting_get_string(s));
        return;
    default:
        break;
    }
    snprintf(buf + at, n - at, "%s", t == CONFIG_TYPE_GROUP ? "{ " : t == CONFIG_TYPE_LIST ? "( " : "[ ");
    for (int i = 0; i < config_setting_length(s); i++) {
        const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
        at = strlen(buf);
        if (t == CONFIG_TYPE_GROUP)
            snprintf(buf + at, n - at, "%s = ", config_setting_name(e));
        else if (i)
            snprintf(buf + at, n - at, ", ");
        value_text(e, buf, n);
        if (t == CONFIG_TYPE_GROUP) {
            at = strlen(buf);
            snprintf(buf + at, n - at, "; ");
        }
    }
    at = strlen(buf);
    snprintf(buf + at, n - at, "%s", t == CONFIG_TYPE_GROUP ? "}" : t == CONFIG_TYPE_LIST ? " )" : " ]");
}

/* Each setting that the groups `a` (the configuration in effect) and `b` (the file) both have
 * and that differs, recursing into groups both have. */
static int diff_group(const config_setting_t *a, const config_setting_t *b, const char *prefix,
                      ghc_config_diff_fn visit, void *user)
{
    int rc = 0;
    for (int i = 0; i < config_setting_length(a) && rc == 0; i++) {
        const config_setting_t *x = config_setting_get_elem(a, (unsigned)i);
        const config_setting_t *y = config_setting_get_member(b, config_setting_name(x));
        if (!y)
            continue;
        char key[512], va[1024] = "", vb[1024] = "";
        snprintf(key, sizeof(key), "%s%s%s", prefix, *prefix ? "." : "", config_setting_name(x));
        if (config_setting_type(x) == CONFIG_TYPE_GROUP && config_setting_type(y) == CONFIG_TYPE_GROUP) {
            rc = diff_group(x, y, key, visit, user);
            continue;
        }
        value_text(x, va, sizeof(va));
        value_text(y, vb, sizeof(vb));
        if (strcmp(va, vb) != 0)
            rc = visit(user, key, va, vb);
    }
    return rc;
}

int ghc_config_diff(ghc_core_t *core, const char *path, ghc_config_diff_fn visit, void *user)
{
    if (!core->config)
        return ghc_error_set(core, GHC_EINVAL, "config: nothing loaded to compare with %s", path);
    config_t other;
    config_init(&other);
    int rc = 0;
    if (config_read_file(&other, path) != CONFIG_TRUE)
        rc = config_error_type(&other) == CONFIG_ERR_FILE_IO
           ? ghc_error_set(core, GHC_EIO, "%s: cannot read", path)
           : ghc_error_set(core, GHC_ECONFIG, "%s:%d: %s", path, config_error_line(&other), config_error_text(&other));
    else
        rc = diff_group(config_root_setting(&core->config->lc), config_root_setting(&other), "", visit, user);
    config_destroy(&other);
    return rc;
}

/* ---- a section as text ------------------------------------------------------------------------ */

static void text_of(const config_setting_t *s, char *buf, size_t len, size_t *n)
{
#define PUT(...) (*n += (size_t)snprintf(buf + (*n < len ? *n : len), *n < len ? len - *n : 0, __VA_ARGS__))
    const char *name = config_setting_name(s);
    if (name)
        PUT("%s=", name);
    switch (config_setting_type(s)) {
    case CONFIG_TYPE_INT:    PUT("%d", config_setting_get_int(s)); break;
    case CONFIG_TYPE_INT64:  PUT("%lld", (long long)config_setting_get_int64(s)); break;
    case CONFIG_TYPE_FLOAT:  PUT("%.17g", config_setting_get_float(s)); break;
    case CONFIG_TYPE_BOOL:   PUT("%s", config_setting_get_bool(s) ? "true" : "false"); break;
    case CONFIG_TYPE_STRING: PUT("\"%s\"", config_setting_get_string(s)); break;
    default: {
        int t = config_setting_type(s);
        PUT("%s", t == CONFIG_TYPE_GROUP ? "{" : t == CONFIG_TYPE_ARRAY ? "[" : "(");
        for (int i = 0; i < config_setting_length(s); i++)
            text_of(config_setting_get_elem(s, i), buf, len, n);
        PUT("%s", t == CONFIG_TYPE_GROUP ? "}" : t == CONFIG_TYPE_ARRAY ? "]" : ")");
    }
    }
    PUT(";");
#undef PUT
}

int ghc_cfg_text(ghc_cfg_t *cfg, char *buf, size_t len)
{
    size_t n = 0;
    if (len)
        buf[0] = '\0';
    for (int i = 0; i < config_setting_length(cfg->s); i++)
        text_of(config_setting_get_elem(cfg->s, i), buf, len, &n);
    return (int)n;
}
