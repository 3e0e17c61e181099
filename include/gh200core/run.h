/* run.h: driving a run from a program: load a configuration, load the plugins it names and
 * create their instances, list plugins. The CLI (core/main.c) is one user of this API. */
#ifndef GHC_RUN_H
#define GHC_RUN_H

#include <gh200core/plugin.h>   /* defines: ghc_core_t, enum ghc_kind, struct ghc_plugin */

GHC_BEGIN_DECLS

/* ---- configuration ------------------------------------------------------------------------ */

/* Read a libconfig file (with @include relative to its folder), apply `overrides`
 * ("a.b=value", from --set), and check the top-level keys. Replaces any earlier
 * configuration. Returns 0, GHC_EIO (unreadable) or GHC_ECONFIG ("file:line: ..."). */
GHC_API int ghc_config_load(ghc_core_t *core, const char *path, const char *const *overrides,
                            int n_overrides);
/* The same from text in memory; `name` stands for the file name in messages. @include is
 * resolved against `dir` (NULL: the current directory). */
GHC_API int ghc_config_load_string(ghc_core_t *core, const char *text, const char *name,
                                   const char *dir, const char *const *overrides, int n_overrides);
/* Write the configuration in effect (includes expanded, overrides applied, and the defaults
 * the plugins read) to `path`, atomically. Returns 0 or GHC_EIO. */
GHC_API int ghc_config_write(ghc_core_t *core, const char *path);
/* The section of a top-level key ("optimizer"), or NULL when absent or no config is loaded.
 * Belongs to the core. */
GHC_API ghc_cfg_t *ghc_config_section(ghc_core_t *core, const char *name);
/* (since API 13) The top level itself (seed, output_dir, the sections), for the ghc_cfg_*
 * getters and setters, or NULL when no config is loaded. Belongs to the core. */
GHC_API ghc_cfg_t *ghc_config_root(ghc_core_t *core);
/* (since API 13) The folder of the configuration file as given ("configs"; "." for the working
 * directory; ghc_config_load_string's `dir`), which the file's relative paths are relative to,
 * or NULL when no config is loaded. Borrowed. */
GHC_API const char *ghc_config_dir(ghc_core_t *core);
/* The run's output directory (config key output_dir, default "output"). Borrowed. */
GHC_API const char *ghc_config_output_dir(ghc_core_t *core);
/* (since API 11) Where a path of the configuration points: `value`, read from `key` of section
 * `cfg` (a string, or an element of a list of strings), made absolute: a relative path written in
 * the configuration file (or a file it includes) is relative to the folder of the
 * configuration file, one given with --set relative to the working directory. Into buf (len
 * bytes). Returns 0, or GHC_EINVAL when it does not fit. */
GHC_API int ghc_cfg_resolve_path(ghc_cfg_t *cfg, const char *key, const char *value, char *buf, size_t len);
/* (since API 11) Make output_dir absolute in the configuration in effect by that rule (the
 * default "output" counts as given on the command line), so that resolved.cfg, the trainer, the demo
 * and ghc_config_output_dir() name one folder. ghc_train() calls it; a program that looks at
 * the folder first calls it before. Calling it again changes nothing. Returns 0 or GHC_E*. */
GHC_API int ghc_config_resolve_output_dir(ghc_core_t *core);

/* (since API 13) Setters, for a program that fills in the configuration before the run (the
 * demo points data.datasets at the data it writes): the getters read what is set, and
 * ghc_config_write() writes it. A value added has no line of its own: ghc_cfg_where() names
 * the nearest section that has one. Each returns 0, GHC_EINVAL (`key` is not a valid key name, the
 * message says where) or GHC_ENOMEM. */
/* `key` = the string `value`. A string there keeps its place; any other value is replaced. */
GHC_API int ghc_cfg_set_string(ghc_cfg_t *cfg, const char *key, const char *value);
/* (since API 17) Remove `key` (a value or a section with everything in it); 0 also when it is
 * absent. Handles into a removed section are no longer valid. */
GHC_API int ghc_cfg_remove(ghc_cfg_t *cfg, const char *key);
/* (since API 17) `key` = the integer `value`. An integer there keeps its place; any other
 * value is replaced. */
GHC_API int ghc_cfg_set_int(ghc_cfg_t *cfg, const char *key, int64_t value);
/* The nested section `key`, added empty when absent. A group there is kept as it is; any other
 * value is replaced. The handle belongs to the core. */
GHC_API int ghc_cfg_set_group(ghc_cfg_t *cfg, const char *key, ghc_cfg_t **out);
/* `key` = a list of `n` empty groups, their handles (the core's) in out[0..n-1], to fill with
 * the setters. Whatever `key` held is replaced; handles into it are no longer valid. */
GHC_API int ghc_cfg_set_group_list(ghc_cfg_t *cfg, const char *key, int n, ghc_cfg_t **out);

/* (since API 15) Compare the configuration in effect with the configuration file `path` (a
 * resolved.cfg): `visit` gets each setting both have whose values differ, with its dotted
 * key ("network.rank") and both values as text (lists and groups whole), in the order of the
 * configuration in effect; a nonzero return stops the walk and is returned. Settings only one
 * of them has are not visited. Returns 0, visit's result, GHC_EIO or GHC_ECONFIG (file:line). */
typedef int (*ghc_config_diff_fn)(void *user, const char *key, const char *mine, const char *theirs);
GHC_API int ghc_config_diff(ghc_core_t *core, const char *path, ghc_config_diff_fn visit, void *user);

/* ---- plugins -------------------------------------------------------------------------------- */

/* Add a folder to the search path, after those added before and ahead of the config's
 * plugin_path. The search order: these folders (the CLI's --plugin-path), the config's
 * plugin_path (relative folders are relative to the config file), $GHC_PLUGIN_PATH
 * (a ':' list), then the installed pluginsdir. Copied. Returns 0 or GHC_ENOMEM. */
GHC_API int ghc_plugin_add_path(ghc_core_t *core, const char *dir);
/* The search path, one folder per call: i = 0, 1, ... until NULL. Borrowed. */
GHC_API const char *ghc_plugin_path_at(ghc_core_t *core, int i);
/* Load plugin `name` (file ghc_<name>.so, symbol ghc_plugin_<name>) from the search path.
 * Loading a plugin that is loaded already is a no-op. Returns 0, GHC_ELOAD or GHC_EABI;
 * the message names the file, the symbol and the cause. */
GHC_API int ghc_plugin_load(ghc_core_t *core, const char *name);
/* Load one plugin file by path. Same checks and results. */
GHC_API int ghc_plugin_load_file(ghc_core_t *core, const char *path);

/* What `gh200core plugins` shows: one registered ops struct. */
struct ghc_plugin_info {
    enum ghc_kind kind;
    const char   *name;         /* the ops name (what `plugin = "..."` selects) */
    const char   *plugin;       /* the plugin's name */
    const char   *version;
    const char   *description;  /* may be "" */
    const char   *path;         /* the file it came from */
    const struct ghc_cfg_key *keys; /* (since API 3) the keys its section declares, or NULL */
};
/* Registered entry `i` (0, 1, ...), in load order. Returns false past the end. The strings
 * are borrowed; valid until ghc_core_free(). */
GHC_API bool ghc_plugin_info_at(ghc_core_t *core, int i, struct ghc_plugin_info *out);

/* ---- the run -------------------------------------------------------------------------------- */

/* For each kind section present in the configuration (mempolicy, backend, cache, model,
 * network, optimizer, scheduler, in that order): load its plugin, check the section's keys
 * against the ops' declared keys, and create the instance. Returns 0 or GHC_E*; on failure
 * the instances made so far are released. */
GHC_API int ghc_run_init(ghc_core_t *core);
/* Release the run's instances in reverse order. Safe to call twice. */
GHC_API void ghc_run_free(ghc_core_t *core);

GHC_END_DECLS

#endif /* GHC_RUN_H */
