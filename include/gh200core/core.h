/* core.h: the core's public API: handles, status codes, errors, logging and configuration.
 *
 * Everything a plugin or an embedding program needs to talk to libgh200core, apart from the
 * plugin descriptor (plugin.h) and the per-kind ops structs (<kind>.h). Handles are opaque:
 * their bodies live in core/ and are never installed. */
#ifndef GHC_CORE_H
#define GHC_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <gh200core/version.h>   /* defines: GHC_VERSION, GHC_API_VERSION, GHC_PLUGIN_ABI */

#ifdef __cplusplus
#define GHC_BEGIN_DECLS extern "C" {
#define GHC_END_DECLS   }
#else
#define GHC_BEGIN_DECLS
#define GHC_END_DECLS
#endif

#if defined(__GNUC__)
#define GHC_API           __attribute__((visibility("default")))
#define GHC_PRINTF(f, a)  __attribute__((format(printf, f, a)))
#else
#define GHC_API
#define GHC_PRINTF(f, a)
#endif

GHC_BEGIN_DECLS

/* ---- handles ------------------------------------------------------------------------------ */

typedef struct ghc_core   ghc_core_t;    /* one per process: registry, error buffer, log sink */
typedef struct ghc_cfg    ghc_cfg_t;     /* one section of the run's configuration */
typedef struct ghc_tensor ghc_tensor_t;  /* a tensor (tensor.h) */

/* ---- status codes ------------------------------------------------------------------------- */

/* Actions return 0 or one of these (negative); the reason is in ghc_error_message(core). */
enum ghc_status {
    GHC_OK           = 0,
    GHC_EINVAL       = -1,   /* bad argument or value */
    GHC_ENOMEM       = -2,   /* out of memory (host or device) */
    GHC_EIO          = -3,   /* reading or writing a file failed */
    GHC_ECONFIG      = -4,   /* configuration: syntax, unknown key, type, range */
    GHC_ELOAD        = -5,   /* a plugin could not be found, opened or registered */
    GHC_EABI         = -6,   /* a plugin was built for another ABI or a newer API */
    GHC_ENOTFOUND    = -7,   /* a named thing (file, key, plugin, tensor) does not exist */
    GHC_EEXIST       = -8,   /* it exists already and would be overwritten */
    GHC_EFORMAT      = -9,   /* a file is malformed */
    GHC_EUNSUPPORTED = -10,  /* valid, but not supported by this build or device */
    GHC_ECUDA        = -11,  /* a CUDA call failed */
    GHC_EINTERNAL    = -12,  /* a bug: an invariant did not hold */
    GHC_EINTERRUPTED = -13,  /* stopped on request (a signal); the state was saved */
};

/* A short fixed description of a status code ("configuration error"). Never NULL; static. */
GHC_API const char *ghc_status_string(int code);

/* ---- the core ----------------------------------------------------------------------------- */

/* Create a core. Returns NULL only when out of memory. Free with ghc_core_free(). */
GHC_API ghc_core_t *ghc_core_init(void);
/* Release the core, its plugins' instances, registry and configuration. NULL is a no-op.
 * Plugins that were initialised stay mapped (CUDA plugins must not be unloaded at exit). */
GHC_API void ghc_core_free(ghc_core_t *core);

/* The run-time API version of the library (GHC_API_VERSION it was built with). */
GHC_API int ghc_api_version(void);
/* The package version string ("0.1.0"). Static; do not free. */
GHC_API const char *ghc_version(void);

/* ---- errors ------------------------------------------------------------------------------- */

/* Record a message for `code` in the core's error buffer and return `code`, so that
 * `return ghc_error_set(core, GHC_EINVAL, "...")` works. The message is one line; it should
 * name the object (file, key, tensor) and what was expected. What the format puts in is made
 * one line of text: line breaks (with the indentation after them) become "; ", trailing ones
 * go, other control bytes and bytes that are not UTF-8 are escaped (\t, \x1b, \xff). */
GHC_API int ghc_error_set(ghc_core_t *core, int code, const char *fmt, ...) GHC_PRINTF(3, 4);
/* The last message set, or "" when none. Borrowed; valid until the next ghc_error_set(). */
GHC_API const char *ghc_error_message(const ghc_core_t *core);
/* (since API 13) The size of the error buffer: a message copied into char[GHC_ERROR_MAX] is
 * whole. */
#define GHC_ERROR_MAX 1024
/* The code of the last ghc_error_set(), or 0. */
GHC_API int ghc_error_code(const ghc_core_t *core);
/* Forget the last error. */
GHC_API void ghc_error_clear(ghc_core_t *core);
/* (since API 15) A file name made safe for a one-line message, in buf (len bytes): control
 * bytes as C escapes (\n, \r, \t, \x1b), bytes that are not UTF-8 as \xNN; printable text,
 * UTF-8 characters and '\\' stay as they are, and nothing is cut inside an escape. Use it for
 * every file name a message shows. (ghc_error_set() and ghc_log() make what is left one line
 * anyway: line breaks folded into "; ", other control bytes escaped.) Returns buf. */
GHC_API const char *ghc_path_quote(const char *path, char *buf, size_t len);

/* ---- logging ------------------------------------------------------------------------------ */

enum ghc_log_level {
    GHC_LOG_ERROR = 0,
    GHC_LOG_WARN  = 1,
    GHC_LOG_INFO  = 2,
    GHC_LOG_DEBUG = 3,
};

/* A sink receives each message at or below the core's level, without a trailing newline (the
 * trainer's progress bar is the one exception: see `progress` in train.h). */
typedef void (*ghc_log_sink_fn)(void *user, enum ghc_log_level lvl, const char *msg);

/* Log through the installed sink. Messages start with the module or plugin name
 * ("lora: rank=16 on 400 modules"). Without a sink, WARN and ERROR go to stderr. */
GHC_API void ghc_log(ghc_core_t *core, enum ghc_log_level lvl, const char *fmt, ...) GHC_PRINTF(3, 4);
GHC_API void ghc_logv(ghc_core_t *core, enum ghc_log_level lvl, const char *fmt, va_list ap);
/* Install a sink (NULL restores the default). `user` is borrowed and passed back. */
GHC_API void ghc_log_set_sink(ghc_core_t *core, ghc_log_sink_fn sink, void *user);
/* Messages more verbose than `lvl` are dropped (default GHC_LOG_INFO). */
GHC_API void ghc_log_set_level(ghc_core_t *core, enum ghc_log_level lvl);
GHC_API enum ghc_log_level ghc_log_get_level(const ghc_core_t *core);
/* "error", "warn", "info", "debug". Static. */
GHC_API const char *ghc_log_level_name(enum ghc_log_level lvl);

/* ---- configuration ------------------------------------------------------------------------ */

/* Types a key may be declared with. An INT value is accepted where FLOAT is declared. */
enum ghc_cfg_type {
    GHC_CFG_INT = 1,     /* integer (64-bit) */
    GHC_CFG_FLOAT,       /* floating point; integers accepted */
    GHC_CFG_BOOL,        /* true / false */
    GHC_CFG_STRING,      /* "text" */
    GHC_CFG_LIST,        /* [ ... ] or ( ... ) of scalars */
    GHC_CFG_GROUP,       /* { ... }, a nested section */
};

/* A declared key. Arrays of these end with { NULL, 0 }. The members after `type` are optional
 * (since API 10; an initialiser that leaves them out gets NULL) and describe the key to
 * people: `gh200core plugins --keys` prints them. Written as in a configuration file, so that
 * the core can hold them against the getters: when a getter reads a key whose table declares
 * a def or a checkable range that differs from the default or bounds it is given, the core
 * logs a warning naming both (the table is then wrong, not the user's file). */
struct ghc_cfg_key {
    const char       *name;
    enum ghc_cfg_type type;
    const char       *def;    /* the default: "100", "1e-4", "true", a string unquoted ("adamw");
                               * "(...)" is prose, not checked ("(the top-level seed)");
                               * NULL: none (required, or absent means off) */
    const char       *range;  /* "1 to 2^40", "-1 to 1023" (numbers or 2^N, 2^N-1: checked
                               * against min and max), "off, block" (checked against the
                               * choices of ghc_cfg_get_choice), anything else is prose */
    const struct ghc_cfg_key *keys;   /* a GHC_CFG_GROUP's own keys (ghc_cfg_get_group), so
                                       * that listings show them nested; NULL when unknown */
};

/* Typed getters. Each reads `key` from the section `cfg`; when it is absent, *out gets `def`
 * (and the default is recorded in the resolved configuration). A present value of the wrong
 * type, or outside [min, max], is GHC_ECONFIG with a message that starts "file:line: ".
 * Returns 0 or GHC_ECONFIG. */
GHC_API int ghc_cfg_get_int(ghc_cfg_t *cfg, const char *key, int64_t def, int64_t min, int64_t max,
                            int64_t *out);
GHC_API int ghc_cfg_get_float(ghc_cfg_t *cfg, const char *key, double def, double min, double max,
                              double *out);
GHC_API int ghc_cfg_get_bool(ghc_cfg_t *cfg, const char *key, bool def, bool *out);
/* *out is borrowed from the configuration; valid until ghc_core_free(). `def` may be NULL
 * (then *out is NULL when the key is absent and nothing is recorded). */
GHC_API int ghc_cfg_get_string(ghc_cfg_t *cfg, const char *key, const char *def, const char **out);
/* A string that must be one of `choices` (NULL-terminated). *out is its index.
 * `def` is an index into `choices`. */
GHC_API int ghc_cfg_get_choice(ghc_cfg_t *cfg, const char *key, int def, const char *const *choices,
                               int *out);
/* The number of elements of a list key, 0 when absent. A present non-list is GHC_ECONFIG. */
GHC_API int ghc_cfg_list_len(ghc_cfg_t *cfg, const char *key, int *out);
/* Element `i` of a list of strings. *out is borrowed; valid until ghc_core_free(). */
GHC_API int ghc_cfg_list_string(ghc_cfg_t *cfg, const char *key, int i, const char **out);
/* Element `i` of a list of numbers, as a double (integers converted). */
GHC_API int ghc_cfg_list_float(ghc_cfg_t *cfg, const char *key, int i, double *out);
/* (since API 13) Element `i` of a list of groups (`datasets = ( { path = "a"; }, { ... } );`),
 * validated against `keys` as ghc_cfg_get_group() does; its path is "data.datasets[1]". An
 * element that is not a group is GHC_ECONFIG. The handle belongs to the core. */
GHC_API int ghc_cfg_list_group(ghc_cfg_t *cfg, const char *key, int i, const struct ghc_cfg_key *keys,
                               ghc_cfg_t **out);
/* The nested section `key` (a group), validated against `keys` (unknown keys are errors).
 * *out is NULL when the key is absent. The handle belongs to the core. */
GHC_API int ghc_cfg_get_group(ghc_cfg_t *cfg, const char *key, const struct ghc_cfg_key *keys,
                              ghc_cfg_t **out);
/* True when `key` is present in the section. */
GHC_API bool ghc_cfg_has(const ghc_cfg_t *cfg, const char *key);
/* "train.cfg:42" for `key` in this section (or the section itself when key is NULL), or
 * "--set model.rank" for a value from the command line. Borrowed; valid until the next call
 * on this section. */
GHC_API const char *ghc_cfg_where(ghc_cfg_t *cfg, const char *key);
/* The section's dotted path ("optimizer", "network.targets"). Borrowed, valid with cfg. */
GHC_API const char *ghc_cfg_path(const ghc_cfg_t *cfg);
/* (since API 16) The section's settings as text, in file order ("path=\"a\";random={seed=7;};"),
 * into buf (len bytes, cut short when it does not fit): what identifies them, for a hash.
 * Returns the length it needs (as snprintf). */
GHC_API int ghc_cfg_text(ghc_cfg_t *cfg, char *buf, size_t len);
/* The core that owns this section. */
GHC_API ghc_core_t *ghc_cfg_core(const ghc_cfg_t *cfg);

GHC_END_DECLS

#endif /* GHC_CORE_H */
