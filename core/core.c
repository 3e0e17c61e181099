/* core.c: the core handle: lifetime, versions, status strings, the error buffer and logging. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core_impl.h"

/* ---- versions and names --------------------------------------------------------------------- */

int ghc_api_version(void) { return GHC_API_VERSION; }

const char *ghc_version(void) { return GHC_VERSION; }

const char *ghc_status_string(int code)
{
    switch (code) {
    case GHC_OK:           return "success";
    case GHC_EINVAL:       return "invalid argument";
    case GHC_ENOMEM:       return "out of memory";
    case GHC_EIO:          return "input/output error";
    case GHC_ECONFIG:      return "configuration error";
    case GHC_ELOAD:        return "plugin load error";
    case GHC_EABI:         return "plugin ABI mismatch";
    case GHC_ENOTFOUND:    return "not found";
    case GHC_EEXIST:       return "already exists";
    case GHC_EFORMAT:      return "malformed file";
    case GHC_EUNSUPPORTED: return "not supported";
    case GHC_ECUDA:        return "CUDA error";
    case GHC_EINTERNAL:    return "internal error";
    case GHC_EINTERRUPTED: return "interrupted";
    default:               return "unknown status";
    }
}

const char *ghc_kind_name(enum ghc_kind kind)
{
    static const char *const names[GHC_KIND_COUNT] = {
        [GHC_KIND_MEMPOLICY] = "mempolicy", [GHC_KIND_BACKEND] = "backend",
        [GHC_KIND_CACHE] = "cache",         [GHC_KIND_MODEL] = "model",
        [GHC_KIND_NETWORK] = "network",     [GHC_KIND_OPTIMIZER] = "optimizer",
        [GHC_KIND_SCHEDULER] = "scheduler",
    };
    return (unsigned)kind < GHC_KIND_COUNT ? names[kind] : "?";
}

char *ghc_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

int ghc_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64)
        return 100;
    int row[65];
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int sub = diag + (a[i - 1] != b[j - 1]);
            int del = row[j] + 1, ins = row[j - 1] + 1;
            row[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
            diag = up;
        }
    }
    return row[lb];
}

/* ---- lifetime ----------------------------------------------------------------------------- */

ghc_core_t *ghc_core_init(void)
{
    ghc_core_t *core = calloc(1, sizeof(*core));
    if (core)
        core->level = GHC_LOG_INFO;
    return core;
}

void ghc_core_free(ghc_core_t *core)
{
    if (!core)
        return;
    ghc_run_free(core);
    for (int i = 0; i < core->n_reg; i++)
        free(core->reg[i].ops);
    free(core->reg);
    for (int i = 0; i < core->n_plugins; i++) {
        /* The handle stays open on purpose: CUDA plugins must not be unloaded at exit. */
        free(core->plugins[i]->path);
        free(core->plugins[i]->name);
        free(core->plugins[i]);
    }
    free(core->plugins);
    for (int i = 0; i < core->n_paths_cli; i++)
        free(core->paths_cli[i]);
    free(core->paths_cli);
    for (int i = 0; i < core->n_paths; i++)
        free(core->paths[i]);
    free(core->paths);
    ghc_config_free(core->config);
    free(core);
}

/* ---- errors ------------------------------------------------------------------------------- */

int ghc_error_set(ghc_core_t *core, int code, const char *fmt, ...)
{
    if (!core)
        return code;
    va_list ap;
    va_start(ap, fmt);
    char tmp[GHC_ERRMSG_MAX];     /* the format may quote the old message */
    vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    memcpy(core->err, tmp, sizeof(tmp));
    core->err_code = code;
    core->err_seq++;
    return code;
}

int ghc_error_member(ghc_core_t *core, uint64_t seq, int rc, const char *kind, const char *name,
                     const char *member, const char *object)
{
    if (rc >= 0 || (core->err_seq != seq && core->err[0]))
        return rc;
    return ghc_error_set(core, rc, "%s%s%s%s: %s%s%s failed: %s (code %d, no message from the plugin)", kind,
                         name ? " \"" : "", name ? name : "", name ? "\"" : "", member, object && *object ? " " : "",
                         object ? object : "", ghc_status_string(rc), rc);
}

const char *ghc_error_message(const ghc_core_t *core) { return core ? core->err : ""; }

int ghc_error_code(const ghc_core_t *core) { return core ? core->err_code : 0; }

void ghc_error_clear(ghc_core_t *core)
{
    core->err[0] = '\0';
    core->err_code = 0;
}

/* ---- logging ------------------------------------------------------------------------------ */

const char *ghc_log_level_name(enum ghc_log_level lvl)
{
    static const char *const names[] = { "error", "warn", "info", "debug" };
    return (unsigned)lvl <= GHC_LOG_DEBUG ? names[lvl] : "?";
}

void ghc_logv(ghc_core_t *core, enum ghc_log_level lvl, const char *fmt, va_list ap)
{
    if (core && lvl > core->level)
        return;
    char msg[2048];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    if (core && core->sink)
        core->sink(core->sink_user, lvl, msg);
    else if (lvl <= GHC_LOG_WARN)
        fprintf(stderr, "gh200core: %s: %s\n", ghc_log_level_name(lvl), msg);
}

void ghc_log(ghc_core_t *core, enum ghc_log_level lvl, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ghc_logv(core, lvl, fmt, ap);
    va_end(ap);
}

void ghc_log_set_sink(ghc_core_t *core, ghc_log_sink_fn sink, void *user)
{
    core->sink = sink;
    core->sink_user = user;
}

void ghc_log_set_level(ghc_core_t *core, enum ghc_log_level lvl) { core->level = lvl; }

enum ghc_log_level ghc_log_get_level(const ghc_core_t *core) { return core->level; }
