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
        [GHC_KIND_SCHEDULER] = "scheduler", [GHC_KIND_VAE] = "vae",
        [GHC_KIND_TEXT_ENCODER] = "text_encoder",
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

/* The length of the UTF-8 character at s (2 to 4), or 0 when s starts no valid one (a stray
 * continuation byte, an overlong form, a surrogate, past U+10FFFF, or cut short). */
static int utf8_len(const unsigned char *s)
{
    int n = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;
    if (!n || s[0] > 0xf4)
        return 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] > 0x9f) ||
        (s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] > 0x8f))
        return 0;
    return n;
}

/* src as one line of printable text in dst (ghc_path_quote). fold: line breaks, with the
 * indentation after them, become "; " and trailing ones go (a message a plugin wrote over
 * several lines); otherwise they are escaped like every other control byte. */
static const char *text_escape(const char *src, char *dst, size_t len, bool fold)
{
    const unsigned char *s = (const unsigned char *)src;
    size_t j = 0;
    while (*s) {
        char esc[8];
        size_t n = 1;
        int u = *s >= 0x80 ? utf8_len(s) : 0;
        if (fold && (*s == '\n' || *s == '\r')) {
            while (*s == '\n' || *s == '\r' || *s == ' ' || *s == '\t')
                s++;
            if (!*s)
                break;
            memcpy(esc, "; ", 3);
            n = 0;
        } else if (u) {
            memcpy(esc, s, (size_t)u);
            esc[u] = '\0';
            n = (size_t)u;
        } else if (*s == '\n' || *s == '\r' || *s == '\t') {
            snprintf(esc, sizeof(esc), "\\%c", *s == '\n' ? 'n' : *s == '\r' ? 'r' : 't');
        } else if (*s < 0x20 || *s >= 0x7f) {
            snprintf(esc, sizeof(esc), "\\x%02x", *s);
        } else {
            esc[0] = (char)*s;
            esc[1] = '\0';
        }
        size_t el = strlen(esc);
        if (j + el >= len)
            break;
        memcpy(dst + j, esc, el);
        j += el;
        s += n;
    }
    if (len)
        dst[j] = '\0';
    return dst;
}

const char *ghc_path_quote(const char *path, char *buf, size_t len)
{
    return text_escape(path, buf, len, false);
}

/* Every message is one line of printable text: what a format put in raw (a plugin's line
 * breaks, a name with control bytes) is folded or escaped here, once for all. */
int ghc_error_set(ghc_core_t *core, int code, const char *fmt, ...)
{
    if (!core)
        return code;
    va_list ap;
    va_start(ap, fmt);
    char tmp[GHC_ERRMSG_MAX];     /* the format may quote the old message */
    vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    text_escape(tmp, core->err, sizeof(core->err), true);
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
    char raw[2048], msg[2048];
    vsnprintf(raw, sizeof(raw), fmt, ap);
    if (raw[0] == '\r')   /* the trainer's progress line: its '\r' and '\n' are for the terminal */
        memcpy(msg, raw, sizeof(msg));
    else
        text_escape(raw, msg, sizeof(msg), true);
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
