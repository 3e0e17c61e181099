/* core_impl.h: bodies of the core's opaque handles and the core's internal functions.
 * Never installed: plugins see only include/gh200core/. */
#ifndef GHC_CORE_IMPL_H
#define GHC_CORE_IMPL_H

#include <libconfig.h>

#include <gh200core/gh200core.h>

#define GHC_ERRMSG_MAX GHC_ERROR_MAX

/* ---- plugins and the registry ------------------------------------------------------------- */

struct ghc_loaded {                  /* one plugin file that passed its checks */
    char                    *path;
    char                    *name;
    void                    *handle;    /* dlopen handle; never closed after init */
    struct ghc_plugin        desc;      /* copy of the plugin's min(struct_size, sizeof) bytes */
    uint32_t                 registered; /* GHC_KIND_BIT()s registered by init */
};

struct ghc_registered {              /* one ops struct, copied to the core's sizeof */
    enum ghc_kind      kind;
    void              *ops;          /* malloc'ed copy, zero-extended */
    struct ghc_loaded *plugin;       /* index into core->plugins is unstable: this is stable */
};

/* Every kind's ops start with these members (doc/plugin-guide.md section 3); init is the same
 * for all. */
struct ghc_ops_head {
    uint32_t                  struct_size;
    const char               *name;
    const struct ghc_cfg_key *keys;
    int (*init)(ghc_core_t *core, ghc_cfg_t *cfg, void **self);
};

/* A run's instance of one kind; the typed handles (ghc_mempolicy_t...) are this struct. */
#define GHC_EXPERT_NAMES 8   /* experts a model may name (more: "") */

struct ghc_instance {
    ghc_core_t          *core;
    enum ghc_kind        kind;
    const void          *ops;        /* the registered copy */
    void                *self;
    ghc_cfg_t           *cfg;
    void               (*free)(void *self);
    void                *hook;       /* model: the adapter hook ghc_model_set_hook installed */
    char                 expert_name[GHC_EXPERT_NAMES][64];   /* model: ghc_model_expert_name's */
    int                  expert_name_told;                    /* model: a bad name was logged */
};

/* ---- configuration -------------------------------------------------------------------------- */

struct ghc_cfg {                     /* a handle to one group of the configuration */
    ghc_core_t         *core;
    config_setting_t   *s;
    char               *path;        /* dotted path, "" for the root */
    char                where[4352]; /* scratch for ghc_cfg_where() */
    struct ghc_cfg     *next;        /* all handles, for freeing */
};

struct ghc_config {
    config_t            lc;
    char               *file;        /* the name messages use */
    char               *dir;         /* folder of the file: @include and relative paths */
    config_setting_t  **overridden;  /* settings set by --set, with their paths */
    char              **override_path;
    int                 n_overrides;
    struct ghc_cfg     *handles;
    ghc_cfg_t          *root;
};

/* ---- the core --------------------------------------------------------------------------- */

struct ghc_core {
    char                   err[GHC_ERRMSG_MAX];
    int                    err_code;
    uint64_t               err_seq;        /* +1 per ghc_error_set(): "set since" tests */
    ghc_log_sink_fn        sink;
    void                  *sink_user;
    enum ghc_log_level     level;

    char                 **paths_cli;      /* --plugin-path, in order */
    int                    n_paths_cli;
    char                 **paths;          /* the resolved search path (rebuilt on demand) */
    int                    n_paths;

    struct ghc_loaded    **plugins;
    int                    n_plugins;
    struct ghc_loaded     *loading;        /* the plugin whose init() runs now */
    struct ghc_registered *reg;
    int                    n_reg;

    struct ghc_config     *config;
    struct ghc_instance   *inst[GHC_KIND_COUNT];
};

/* ---- internal functions ------------------------------------------------------------------- */

/* The ops of (kind, name), or NULL. */
const struct ghc_registered *ghc_registry_find(ghc_core_t *core, enum ghc_kind kind, const char *name);
/* The loaded plugin named `name`, or NULL. */
struct ghc_loaded *ghc_plugin_find(ghc_core_t *core, const char *name);
/* The kinds loaded plugin `name` registered, as "model, network" ("nothing") into buf; returns
 * its path ("?" when not loaded). For "provides ..., not ..." messages. */
const char *ghc_plugin_kinds_text(ghc_core_t *core, const char *name, char *buf, size_t len);
/* The ops of kind `kind` that plugin `name` registers under its name, the plugin loaded if
 * needed (the plugin-level members, which need no instance). Returns 0, or GHC_ELOAD / GHC_EABI
 * with a message that starts with the kind. */
int ghc_plugin_ops(ghc_core_t *core, enum ghc_kind kind, const char *name, const void **ops);
/* Check the keys of group `cfg` against `keys` plus `extra` (may be NULL): unknown key, type.
 * `what` names the owner in messages ("optimizer \"adamw\""). */
int ghc_cfg_check_keys(ghc_cfg_t *cfg, const struct ghc_cfg_key *keys,
                       const struct ghc_cfg_key *extra, const char *what);
/* A handle for a libconfig group under cfg's configuration. NULL on ENOMEM (error set). */
ghc_cfg_t *ghc_cfg_wrap(ghc_core_t *core, config_setting_t *s);
void ghc_config_free(struct ghc_config *c);
/* Rebuild core->paths from the CLI folders, the config, the environment and pluginsdir. */
int ghc_plugin_paths_resolve(ghc_core_t *core);
/* Where the error buffer stands: every ghc_error_set() moves it on. A wrapper takes it before
 * it calls a plugin member, for ghc_error_member() after. */
static inline uint64_t ghc_error_seq(const ghc_core_t *core) { return core->err_seq; }
/* Every failure a core wrapper passes on carries its reason. When a member returned rc < 0
 * and set no message since `seq` (or left the buffer empty), the message names the instance
 * (`kind` "`name`", or `kind` alone with name NULL), the member, and `object` (a file or a
 * target; NULL for none): `network "lycoris": hook forward on blocks.0.self_attn.q failed:
 * invalid argument (code -1, no message from the plugin)`. A member that set one keeps it.
 * Returns rc. */
int ghc_error_member(ghc_core_t *core, uint64_t seq, int rc, const char *kind, const char *name,
                     const char *member, const char *object);
/* Duplicate a string; NULL on ENOMEM. */
char *ghc_strdup(const char *s);
/* Levenshtein distance, capped at 100 (for "did you mean"). */
int ghc_edit_distance(const char *a, const char *b);
/* A tensor or metadata name made safe for a one-line message in buf (safetensors.c, for the
 * reader and the writer): control bytes become '?', long names are cut. Returns buf. */
const char *ghc_st_esc(const char *s, char *buf, size_t len);

#endif /* GHC_CORE_IMPL_H */
