/* loader.c: finding, opening and checking plugins, and the registry of ops by kind and name.
 * Boring and loud (doc/plugin-guide.md section 2): plain dlopen(RTLD_NOW | RTLD_LOCAL), one
 * exported descriptor per file, and every failure one line naming the file, the symbol and
 * the cause. */
#include <config.h>

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core_impl.h"

#ifndef GHC_PLUGINSDIR
#error "GHC_PLUGINSDIR must be defined by the build (Makefile.am)"
#endif

/* ---- search path ---------------------------------------------------------------------------- */

static int path_push(ghc_core_t *core, char ***v, int *n, const char *dir, size_t len)
{
    char **nv = realloc(*v, (size_t)(*n + 1) * sizeof(**v));
    if (!nv)
        return ghc_error_set(core, GHC_ENOMEM, "plugins: out of memory");
    *v = nv;
    if (!(nv[*n] = malloc(len + 1)))
        return ghc_error_set(core, GHC_ENOMEM, "plugins: out of memory");
    memcpy(nv[*n], dir, len);
    nv[*n][len] = '\0';
    (*n)++;
    return 0;
}

/* Only absolute folders are searched: "" would make "/ghc_<name>.so", and a relative folder
 * would depend on where the program happens to run. `from` says where the entry came from. */
static int path_check(ghc_core_t *core, const char *dir, size_t len, const char *from)
{
    if (len && dir[0] == '/')
        return 0;
    char raw[4096], q[4096];
    snprintf(raw, sizeof(raw), "%.*s", (int)len, dir);
    return ghc_error_set(core, GHC_ELOAD, "plugins: %s entry '%s' is not an absolute folder (plugins load only "
                         "from absolute folders)", from, ghc_path_quote(raw, q, sizeof(q)));
}

int ghc_plugin_add_path(ghc_core_t *core, const char *dir)
{
    int rc = path_check(core, dir, strlen(dir), "search path");
    if (rc == 0)
        rc = path_push(core, &core->paths_cli, &core->n_paths_cli, dir, strlen(dir));
    return rc < 0 ? rc : ghc_plugin_paths_resolve(core);
}

int ghc_plugin_paths_resolve(ghc_core_t *core)
{
    for (int i = 0; i < core->n_paths; i++)
        free(core->paths[i]);
    free(core->paths);
    core->paths = NULL;
    core->n_paths = 0;
    int rc;
    for (int i = 0; i < core->n_paths_cli; i++)
        if ((rc = path_push(core, &core->paths, &core->n_paths, core->paths_cli[i],
                            strlen(core->paths_cli[i]))) < 0)
            return rc;
    struct ghc_config *c = core->config;
    int n = 0;
    if (c && ghc_cfg_list_len(c->root, "plugin_path", &n) < 0)
        n = 0;
    for (int i = 0; i < n; i++) {
        const char *p;
        if (ghc_cfg_list_string(c->root, "plugin_path", i, &p) < 0)
            continue;
        /* Already absolute: ghc_config_load made relative folders absolute. */
        if ((rc = path_push(core, &core->paths, &core->n_paths, p, strlen(p))) < 0)
            return rc;
    }
    const char *env = getenv("GHC_PLUGIN_PATH");
    while (env && *env) {
        const char *colon = strchr(env, ':');
        size_t len = colon ? (size_t)(colon - env) : strlen(env);
        if (len && ((rc = path_check(core, env, len, "GHC_PLUGIN_PATH")) < 0 ||
                    (rc = path_push(core, &core->paths, &core->n_paths, env, len)) < 0))
            return rc;
        env = colon ? colon + 1 : NULL;
    }
    return path_push(core, &core->paths, &core->n_paths, GHC_PLUGINSDIR, strlen(GHC_PLUGINSDIR));
}

const char *ghc_plugin_path_at(ghc_core_t *core, int i)
{
    if (!core->paths && ghc_plugin_paths_resolve(core) < 0)
        return NULL;
    return i >= 0 && i < core->n_paths ? core->paths[i] : NULL;
}

/* ---- the registry --------------------------------------------------------------------------- */

/* Per kind: the core's sizeof, and the required function members by offset. */
struct kind_info {
    size_t size;
    struct { size_t off; const char *name; } req[8];
};

#define REQ(type, m) { offsetof(struct type, m), #m }
static const struct kind_info kinds[GHC_KIND_COUNT] = {
    [GHC_KIND_MEMPOLICY] = { sizeof(struct ghc_mempolicy_ops),
        { REQ(ghc_mempolicy_ops, init), REQ(ghc_mempolicy_ops, alloc), REQ(ghc_mempolicy_ops, release) } },
    [GHC_KIND_BACKEND] = { sizeof(struct ghc_backend_ops),
        { REQ(ghc_backend_ops, init), REQ(ghc_backend_ops, mount), REQ(ghc_backend_ops, list),
          REQ(ghc_backend_ops, stat), REQ(ghc_backend_ops, read) } },
    [GHC_KIND_CACHE] = { sizeof(struct ghc_cache_ops),
        { REQ(ghc_cache_ops, init), REQ(ghc_cache_ops, bind), REQ(ghc_cache_ops, count),
          REQ(ghc_cache_ops, get), REQ(ghc_cache_ops, release) } },
    [GHC_KIND_MODEL] = { sizeof(struct ghc_model_ops),
        { REQ(ghc_model_ops, init), REQ(ghc_model_ops, experts), REQ(ghc_model_ops, expert_for),
          REQ(ghc_model_ops, targets), REQ(ghc_model_ops, set_hook), REQ(ghc_model_ops, forward),
          REQ(ghc_model_ops, backward) } },
    [GHC_KIND_NETWORK] = { sizeof(struct ghc_network_ops),
        { REQ(ghc_network_ops, init), REQ(ghc_network_ops, attach), REQ(ghc_network_ops, hook),
          REQ(ghc_network_ops, params), REQ(ghc_network_ops, save) } },
    [GHC_KIND_OPTIMIZER] = { sizeof(struct ghc_optimizer_ops),
        { REQ(ghc_optimizer_ops, init), REQ(ghc_optimizer_ops, add_params), REQ(ghc_optimizer_ops, step) } },
    [GHC_KIND_SCHEDULER] = { sizeof(struct ghc_scheduler_ops),
        { REQ(ghc_scheduler_ops, init), REQ(ghc_scheduler_ops, micro_batches),
          REQ(ghc_scheduler_ops, lr_factor) } },
    [GHC_KIND_VAE] = { sizeof(struct ghc_vae_ops),
        { REQ(ghc_vae_ops, init), REQ(ghc_vae_ops, info), REQ(ghc_vae_ops, encode) } },
    [GHC_KIND_TEXT_ENCODER] = { sizeof(struct ghc_text_encoder_ops),
        { REQ(ghc_text_encoder_ops, init), REQ(ghc_text_encoder_ops, info), REQ(ghc_text_encoder_ops, encode) } },
};
#undef REQ

const struct ghc_registered *ghc_registry_find(ghc_core_t *core, enum ghc_kind kind, const char *name)
{
    for (int i = 0; i < core->n_reg; i++)
        if (core->reg[i].kind == kind && strcmp(((struct ghc_ops_head *)core->reg[i].ops)->name, name) == 0)
            return &core->reg[i];
    return NULL;
}

/* "ghc_x.so: ghc_plugin_x: " for messages about the plugin being registered. */
#define LOADING_FMT "%s: ghc_plugin_%s: "
#define LOADING_ARGS(core) (core)->loading->path, (core)->loading->name

static int register_ops(ghc_core_t *core, enum ghc_kind kind, const void *ops)
{
    if (!core->loading)
        return ghc_error_set(core, GHC_ELOAD, "register %s: only a plugin's init() may register",
                             ghc_kind_name(kind));
    if (!ops)
        return ghc_error_set(core, GHC_ELOAD, LOADING_FMT "registers a NULL %s ops struct",
                             LOADING_ARGS(core), ghc_kind_name(kind));
    if (!(core->loading->desc.kinds & GHC_KIND_BIT(kind)))
        return ghc_error_set(core, GHC_ELOAD, LOADING_FMT "registers kind %s, which its descriptor does not declare",
                             LOADING_ARGS(core), ghc_kind_name(kind));
    const struct kind_info *ki = &kinds[kind];
    const struct ghc_ops_head *head = ops;
    if (head->struct_size > ki->size)
        return ghc_error_set(core, GHC_EABI, LOADING_FMT "%s ops struct_size %u is larger than this core's %zu (plugin built against a newer gh200core)",
                             LOADING_ARGS(core), ghc_kind_name(kind), head->struct_size, ki->size);
    if (head->struct_size < sizeof(struct ghc_ops_head))
        return ghc_error_set(core, GHC_EABI, LOADING_FMT "%s ops struct_size %u is too small (is struct_size set?)",
                             LOADING_ARGS(core), ghc_kind_name(kind), head->struct_size);
    if (!head->name || !*head->name)
        return ghc_error_set(core, GHC_ELOAD, LOADING_FMT "%s ops has no name", LOADING_ARGS(core),
                             ghc_kind_name(kind));
    const struct ghc_registered *dup = ghc_registry_find(core, kind, head->name);
    if (dup)
        return ghc_error_set(core, GHC_ELOAD, LOADING_FMT "%s '%s' is already registered by %s",
                             LOADING_ARGS(core), ghc_kind_name(kind), head->name, dup->plugin->path);
    char *copy = calloc(1, ki->size);
    if (!copy)
        return ghc_error_set(core, GHC_ENOMEM, "register: out of memory");
    memcpy(copy, ops, head->struct_size);
    for (int i = 0; i < 8 && ki->req[i].name; i++) {
        void (*fn)(void);
        memcpy(&fn, copy + ki->req[i].off, sizeof(fn));
        if (ki->req[i].off + sizeof(fn) > head->struct_size || !fn) {
            free(copy);
            return ghc_error_set(core, GHC_ELOAD, LOADING_FMT "%s '%s' lacks required member '%s'",
                                 LOADING_ARGS(core), ghc_kind_name(kind), head->name, ki->req[i].name);
        }
    }
    struct ghc_registered *nr = realloc(core->reg, (size_t)(core->n_reg + 1) * sizeof(*nr));
    if (!nr) {
        free(copy);
        return ghc_error_set(core, GHC_ENOMEM, "register: out of memory");
    }
    core->reg = nr;
    nr[core->n_reg++] = (struct ghc_registered){ .kind = kind, .ops = copy, .plugin = core->loading };
    core->loading->registered |= GHC_KIND_BIT(kind);
    return 0;
}

int ghc_register_mempolicy(ghc_core_t *core, const struct ghc_mempolicy_ops *ops)
{
    /* saved activations: both members or neither (a begin without an end would leak the ring) */
    size_t end = offsetof(struct ghc_mempolicy_ops, saved_end) + sizeof(ops->saved_end);
    if (core->loading && ops && ops->struct_size >= end && !ops->saved_begin != !ops->saved_end)
        return ghc_error_set(core, GHC_ELOAD, LOADING_FMT "mempolicy '%s' has %s without %s (both or neither)",
                             LOADING_ARGS(core), ops->name ? ops->name : "?",
                             ops->saved_begin ? "saved_begin" : "saved_end", ops->saved_begin ? "saved_end" : "saved_begin");
    return register_ops(core, GHC_KIND_MEMPOLICY, ops);
}
int ghc_register_backend(ghc_core_t *core, const struct ghc_backend_ops *ops)
{ return register_ops(core, GHC_KIND_BACKEND, ops); }
int ghc_register_cache(ghc_core_t *core, const struct ghc_cache_ops *ops)
{ return register_ops(core, GHC_KIND_CACHE, ops); }
int ghc_register_model(ghc_core_t *core, const struct ghc_model_ops *ops)
{ return register_ops(core, GHC_KIND_MODEL, ops); }
int ghc_register_network(ghc_core_t *core, const struct ghc_network_ops *ops)
{ return register_ops(core, GHC_KIND_NETWORK, ops); }
int ghc_register_optimizer(ghc_core_t *core, const struct ghc_optimizer_ops *ops)
{ return register_ops(core, GHC_KIND_OPTIMIZER, ops); }
int ghc_register_scheduler(ghc_core_t *core, const struct ghc_scheduler_ops *ops)
{ return register_ops(core, GHC_KIND_SCHEDULER, ops); }
int ghc_register_vae(ghc_core_t *core, const struct ghc_vae_ops *ops)
{ return register_ops(core, GHC_KIND_VAE, ops); }
int ghc_register_text_encoder(ghc_core_t *core, const struct ghc_text_encoder_ops *ops)
{ return register_ops(core, GHC_KIND_TEXT_ENCODER, ops); }

/* Drop what a failed init() registered. */
static void unregister_plugin(ghc_core_t *core, struct ghc_loaded *p)
{
    int j = 0;
    for (int i = 0; i < core->n_reg; i++) {
        if (core->reg[i].plugin == p)
            free(core->reg[i].ops);
        else
            core->reg[j++] = core->reg[i];
    }
    core->n_reg = j;
}

bool ghc_plugin_info_at(ghc_core_t *core, int i, struct ghc_plugin_info *out)
{
    if (i < 0 || i >= core->n_reg)
        return false;
    const struct ghc_registered *r = &core->reg[i];
    const struct ghc_plugin *d = &r->plugin->desc;
    *out = (struct ghc_plugin_info){
        .kind = r->kind, .name = ((struct ghc_ops_head *)r->ops)->name, .plugin = d->name,
        .version = d->version, .description = d->description ? d->description : "",
        .path = r->plugin->path, .keys = ((struct ghc_ops_head *)r->ops)->keys,
    };
    return true;
}

/* ---- loading -------------------------------------------------------------------------------- */

struct ghc_loaded *ghc_plugin_find(ghc_core_t *core, const char *name)
{
    for (int i = 0; i < core->n_plugins; i++)
        if (strcmp(core->plugins[i]->name, name) == 0)
            return core->plugins[i];
    return NULL;
}

const char *ghc_plugin_kinds_text(ghc_core_t *core, const char *name, char *buf, size_t len)
{
    struct ghc_loaded *p = ghc_plugin_find(core, name);
    buf[0] = '\0';
    for (int k = 0; k < GHC_KIND_COUNT; k++)
        if (p && (p->registered & GHC_KIND_BIT(k))) {
            size_t l = strlen(buf);
            snprintf(buf + l, len - l, "%s%s", l ? ", " : "", ghc_kind_name((enum ghc_kind)k));
        }
    if (!buf[0])
        snprintf(buf, len, "nothing");
    return p ? p->path : "?";
}

static bool valid_name(const char *name)
{
    if (!*name || strlen(name) > 64)
        return false;
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_'))
            return false;
    return true;
}

/* The plugin name in ".../ghc_<name>.so", or NULL when the file is not named so. */
static char *name_from_path(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t len = strlen(base);
    if (strncmp(base, "ghc_", 4) != 0 || len < 8 || strcmp(base + len - 3, ".so") != 0)
        return NULL;
    char *name = malloc(len - 6);
    if (name) {
        memcpy(name, base + 4, len - 7);
        name[len - 7] = '\0';
    }
    return name;
}

static int check_descriptor(ghc_core_t *core, const char *path, const char *sym, const char *name,
                            const struct ghc_plugin *d)
{
    if (d->abi != GHC_PLUGIN_ABI)
        return ghc_error_set(core, GHC_EABI, "%s: %s: plugin ABI %u, this gh200core %s expects ABI %d (rebuild the plugin against the installed headers)",
                             path, sym, d->abi, GHC_VERSION, GHC_PLUGIN_ABI);
    if (d->api > GHC_API_VERSION)
        return ghc_error_set(core, GHC_EABI, "%s: %s: built against API %u, this gh200core %s provides API %d (upgrade gh200core)",
                             path, sym, d->api, GHC_VERSION, GHC_API_VERSION);
    if (d->struct_size > sizeof(struct ghc_plugin) || d->struct_size < offsetof(struct ghc_plugin, init) + sizeof(d->init))
        return ghc_error_set(core, GHC_EABI, "%s: %s: descriptor struct_size %u, expected %zu",
                             path, sym, d->struct_size, sizeof(struct ghc_plugin));
    if (!d->name || strcmp(d->name, name) != 0)
        return ghc_error_set(core, GHC_ELOAD, "%s: %s: descriptor name '%s' does not match the file name (expected '%s')",
                             path, sym, d->name ? d->name : "(null)", name);
    if (!d->version)
        return ghc_error_set(core, GHC_ELOAD, "%s: %s: descriptor lacks required member 'version'", path, sym);
    if (!d->init)
        return ghc_error_set(core, GHC_ELOAD, "%s: %s: descriptor lacks required member 'init'", path, sym);
    if (!d->kinds || (d->kinds >> GHC_KIND_COUNT))
        return ghc_error_set(core, GHC_ELOAD, "%s: %s: descriptor kinds 0x%x names no known kind",
                             path, sym, d->kinds);
    return 0;
}

/* One warning line naming both files: which one loads, which one it hides. */
static void log_shadow(ghc_core_t *core, const char *first, const char *later, const char *name)
{
    char q0[4096], q1[4096];
    ghc_log(core, GHC_LOG_WARN, "plugins: %s shadows %s (the same plugin name '%s'; the first on the search "
            "path is loaded)", ghc_path_quote(first, q0, sizeof(q0)), ghc_path_quote(later, q1, sizeof(q1)), name);
}

/* Like sudo with its plugins: a file that someone else could have replaced is not loaded. The
 * file and its folder must belong to the user running or to root, and be writable by neither
 * group nor others, unless the configuration says `allow_insecure_plugins = true`. */
static int check_trusted(ghc_core_t *core, const char *path, const char *qp)
{
    bool allow = false;
    if (core->config && ghc_cfg_get_bool(core->config->root, "allow_insecure_plugins", false, &allow) < 0)
        return GHC_ECONFIG;
    if (allow)
        return 0;
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else
        snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path), path);
    const char *const what[2] = { path, dir };
    for (int i = 0; i < 2; i++) {
        struct stat st;
        if (stat(what[i], &st) < 0)
            continue;   /* a missing file gets its own message below */
        const char *who = st.st_uid != geteuid() && st.st_uid != 0 ? "owned by another user" :
                          st.st_mode & (S_IWGRP | S_IWOTH) ? "writable by group or others" : NULL;
        if (who) {
            char qd[4096];
            return ghc_error_set(core, GHC_ELOAD, "%s: refused: %s%s is %s (uid %u, mode %04o); only files and "
                                 "folders of yours or root's that only their owner can write are loaded (or "
                                 "allow_insecure_plugins = true)", qp, i ? "its folder " : "",
                                 i ? ghc_path_quote(dir, qd, sizeof(qd)) : "the file", who, (unsigned)st.st_uid,
                                 (unsigned)(st.st_mode & 07777));
        }
    }
    return 0;
}

int ghc_plugin_load_file(ghc_core_t *core, const char *path)
{
    int rc = 0;
    char sym[96], qp[4096];
    char *name = name_from_path(path);
    ghc_path_quote(path, qp, sizeof(qp));   /* the file as messages show it */
    if (!name || !valid_name(name)) {
        free(name);
        return ghc_error_set(core, GHC_ELOAD, "%s: not a plugin file name (expected ghc_<name>.so, name in [a-z0-9_])", qp);
    }
    struct ghc_loaded *prev = ghc_plugin_find(core, name);
    if (prev) {
        /* the first of a name wins; later ones on the path are shadowed: say so */
        if (strcmp(prev->path, path) != 0)
            log_shadow(core, prev->path, path, name);
        free(name);
        return 0;
    }
    snprintf(sym, sizeof(sym), "ghc_plugin_%s", name);
    if (access(path, R_OK) != 0) {
        rc = ghc_error_set(core, GHC_ELOAD, "%s: cannot open: %s", qp, strerror(errno));
        goto out_name;
    }
    if ((rc = check_trusted(core, path, qp)) < 0)
        goto out_name;
    dlerror();
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        rc = ghc_error_set(core, GHC_ELOAD, "%s: cannot load: %s (check its dependencies with ldd)", qp, dlerror());
        goto out_name;
    }
    dlerror();
    const struct ghc_plugin *d = dlsym(h, sym);
    if (!d) {
        const char *e = dlerror();
        rc = ghc_error_set(core, GHC_ELOAD, "%s: symbol %s not found: %s (not a gh200core plugin, or misnamed)",
                           qp, sym, e ? e : "NULL");
        goto out_close;
    }
    /* The symbol must be a whole descriptor before any member is read: a 4-byte object under
     * the descriptor's name would otherwise be read past its end. */
    Dl_info di;
    const ElfW(Sym) *es = NULL;
    if (dladdr1(d, &di, (void **)&es, RTLD_DL_SYMENT) && es && di.dli_saddr == (void *)d &&
        es->st_size < sizeof(struct ghc_plugin)) {
        rc = ghc_error_set(core, GHC_EABI, "%s: %s: the symbol is a %llu-byte object, not a plugin descriptor "
                           "(struct ghc_plugin, %zu bytes)", qp, sym, (unsigned long long)es->st_size,
                           sizeof(struct ghc_plugin));
        goto out_close;
    }
    if ((rc = check_descriptor(core, qp, sym, name, d)) < 0)
        goto out_close;

    struct ghc_loaded *p = calloc(1, sizeof(*p));
    struct ghc_loaded **np = realloc(core->plugins, (size_t)(core->n_plugins + 1) * sizeof(*np));
    if (np)
        core->plugins = np;
    if (!p || !np || !(p->path = ghc_strdup(path))) {
        free(p);
        rc = ghc_error_set(core, GHC_ENOMEM, "plugins: out of memory");
        goto out_close;
    }
    p->name = name;
    p->handle = h;
    memcpy(&p->desc, d, d->struct_size);   /* members the plugin lacks stay zero */
    d = &p->desc;
    core->loading = p;
    uint64_t seq = ghc_error_seq(core);
    rc = d->init(core);
    core->loading = NULL;
    if (rc == 0 && p->registered != d->kinds) {
        uint32_t missing = d->kinds & ~p->registered;
        int k = 0;
        while (!(missing & GHC_KIND_BIT(k)))
            k++;
        rc = ghc_error_set(core, GHC_ELOAD, "%s: %s: declares kind %s but its init() registered none",
                           qp, sym, ghc_kind_name((enum ghc_kind)k));
    } else if (rc < 0) {
        /* a plugin that cannot start is a plugin error (exit status 4) whatever code its init
         * returned; out of memory and a refused registration keep theirs. The message is one
         * line: ghc_error_set folded the plugin's line breaks. */
        int code = rc == GHC_ENOMEM || rc == GHC_EABI ? rc : GHC_ELOAD;
        char msg[GHC_ERRMSG_MAX];
        if (ghc_error_seq(core) != seq && *ghc_error_message(core))
            snprintf(msg, sizeof(msg), "%s", ghc_error_message(core));
        else
            snprintf(msg, sizeof(msg), "%s (code %d, no message from the plugin)", ghc_status_string(rc), rc);
        if (strstr(msg, qp))
            rc = ghc_error_set(core, code, "%s", msg);
        else
            rc = ghc_error_set(core, code, "%s: %s: init failed: %s", qp, sym, msg);
    }
    if (rc < 0) {
        /* init ran: the plugin stays mapped (it may have started threads or CUDA). */
        unregister_plugin(core, p);
        free(p->path);
        free(p);
        free(name);
        return rc;
    }
    core->plugins[core->n_plugins++] = p;
    ghc_log(core, GHC_LOG_DEBUG, "plugins: loaded %s %s from %s", d->name, d->version, path);
    return 0;

out_close:
    dlclose(h);
out_name:
    free(name);
    return rc;
}

static void suggest_consider(const char *name, const char *known, int *dist, char *best, size_t n)
{
    int d = ghc_edit_distance(name, known);
    if (d < *dist && d < (int)strlen(name)) {
        *dist = d;
        snprintf(best, n, "%s", known);
    }
}

/* The known plugin name closest to a mistyped `name`: among the plugins loaded and the
 * ghc_<name>.so files in the search path's folders, the nearest within 2 edits (and fewer
 * edits than `name` has letters). "" when none is. */
static void plugin_suggest(ghc_core_t *core, const char *name, char *best, size_t n)
{
    int dist = 3;
    best[0] = '\0';
    for (int i = 0; i < core->n_plugins; i++)
        suggest_consider(name, core->plugins[i]->name, &dist, best, n);
    for (int i = 0; i < core->n_paths; i++) {
        DIR *d = opendir(core->paths[i]);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            char *known = name_from_path(e->d_name);
            if (known && valid_name(known))
                suggest_consider(name, known, &dist, best, n);
            free(known);
        }
        if (d)
            closedir(d);
    }
}

int ghc_plugin_load(ghc_core_t *core, const char *name)
{
    if (!valid_name(name))
        return ghc_error_set(core, GHC_ELOAD, "plugin '%s': invalid name (letters a-z, digits and '_')", name);
    if (ghc_plugin_find(core, name))
        return 0;
    if (!core->paths && ghc_plugin_paths_resolve(core) < 0)
        return GHC_ENOMEM;
    char tried[1024] = "";
    for (int i = 0; i < core->n_paths; i++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/ghc_%s.so", core->paths[i], name);
        if (access(path, F_OK) == 0) {
            for (int j = i + 1; j < core->n_paths; j++) {   /* the same name later on the path */
                char later[4096];
                snprintf(later, sizeof(later), "%s/ghc_%s.so", core->paths[j], name);
                if (access(later, F_OK) == 0 && strcmp(core->paths[i], core->paths[j]) != 0)
                    log_shadow(core, path, later, name);
            }
            return ghc_plugin_load_file(core, path);
        }
        size_t l = strlen(tried);
        snprintf(tried + l, sizeof(tried) - l, "%s%s", i ? ", " : "", core->paths[i]);
    }
    char best[80];
    plugin_suggest(core, name, best, sizeof(best));
    return ghc_error_set(core, GHC_ELOAD, "plugin '%s': ghc_%s.so not found in: %s (set plugin_path, --plugin-path or GHC_PLUGIN_PATH)%s%s%s",
                         name, name, tried, *best ? "; did you mean '" : "", best, *best ? "'?" : "");
}

int ghc_plugin_ops(ghc_core_t *core, enum ghc_kind kind, const char *name, const void **ops)
{
    const char *kname = ghc_kind_name(kind);
    int rc;
    *ops = NULL;
    if ((rc = ghc_plugin_load(core, name)) < 0) {
        char msg[GHC_ERRMSG_MAX];
        snprintf(msg, sizeof(msg), "%s", ghc_error_message(core));
        return ghc_error_set(core, rc, "%s: %s", kname, msg);
    }
    const struct ghc_registered *r = ghc_registry_find(core, kind, name);
    if (!r) {
        char has[256];
        const char *path = ghc_plugin_kinds_text(core, name, has, sizeof(has));
        return ghc_error_set(core, GHC_ELOAD, "%s: plugin '%s' (%s) provides %s, not %s '%s'", kname, name, path, has,
                             kname, name);
    }
    *ops = r->ops;
    return 0;
}
