/* backend.h: the data-backend plugin interface: the dataset's bytes, by name, from local
 * directories or staged in RAM.
 *
 * A run may read several datasets (directories), each with its own compression. The dataset
 * mounts them once, in order (mount()); from then on an entry is named "<root index>/<path
 * relative to that root>", e.g. "0/clip01.latent.safetensors" or
 * "1/images/_latent_cache/cat_AbC.safetensors". Names use '/', never start with '/', and
 * never hold "." or ".." components; hidden files (a component starting with '.') are not
 * listed. */
#ifndef GHC_BACKEND_H
#define GHC_BACKEND_H

#include <gh200core/plugin.h>   /* defines: ghc_core_t, ghc_cfg_t, struct ghc_cfg_key */

GHC_BEGIN_DECLS

/* Compression of a root's bytes where the backend keeps them (in_memory). */
enum ghc_compression {
    GHC_COMPRESSION_NONE = 0,
    GHC_COMPRESSION_LZ4,
    GHC_COMPRESSION_ZLIB,
    GHC_COMPRESSION_SNAPPY,
    GHC_COMPRESSION_COUNT
};

/* "none", "lz4", "zlib", "snappy". Static; "?" when out of range. */
GHC_API const char *ghc_compression_name(enum ghc_compression c);
/* The compression named `name`; false for an unknown name. */
GHC_API bool ghc_compression_from_name(const char *name, enum ghc_compression *out);

/* One dataset root. Strings are borrowed for the mount() call. */
struct ghc_backend_root {
    const char          *path;         /* an absolute directory */
    enum ghc_compression compression;  /* a hint: backends that keep no copy ignore it */
};

/* Statistics. The caller sets struct_size = sizeof(struct ghc_backend_stats) and zeroes the
 * rest; the backend fills what it knows (members are only ever appended). */
struct ghc_backend_stats {
    uint32_t struct_size;
    uint64_t files;               /* entries */
    uint64_t raw_bytes;           /* their size */
    uint64_t stored_bytes;        /* what the backend holds for them (compressed), 0: nothing */
    double   stage_seconds;       /* time spent staging (in_memory), 0: none */
    uint64_t reads;               /* read() and map() calls served */
    uint64_t read_bytes;
};

/* Called by list() once per entry; a non-zero return stops the listing and is returned. */
typedef int (*ghc_backend_visit_fn)(void *user, const char *name, uint64_t size);

struct ghc_backend_ops {
    uint32_t struct_size;                 /* required: sizeof(struct ghc_backend_ops) */
    const char *name;                     /* required */
    const struct ghc_cfg_key *keys;       /* optional: keys of the [backend] section */
    /* required; once per run, after the mempolicy. *self belongs to the core. `cfg` may be
     * NULL (the dataset's fallback when no backend section is configured): use defaults. */
    int (*init)(ghc_core_t *core, ghc_cfg_t *cfg, void **self);
    /* required; once, before any call below: the dataset roots, in order. A backend that
     * stages (in_memory) reads everything here. Errors name the root or the file. */
    int (*mount)(void *self, const struct ghc_backend_root *roots, int32_t n);
    /* required; entries whose name starts with `prefix` ("" for all), in name order
     * (strcmp). Thread-safe. */
    int (*list)(void *self, const char *prefix, ghc_backend_visit_fn visit, void *user);
    /* required; size of an entry, GHC_ENOTFOUND when absent. Thread-safe. */
    int (*stat)(void *self, const char *name, uint64_t *size);
    /* required; up to `len` bytes from `offset` into `buf`; *got is the count read (short
     * only at the end of the entry). Thread-safe. */
    int (*read)(void *self, const char *name, uint64_t offset, void *buf, size_t len, size_t *got);
    /* optional; a read-only view of the whole entry, valid until free() (an uncompressed
     * in_memory entry). GHC_EUNSUPPORTED when this entry has none: use read(). */
    int (*map)(void *self, const char *name, const void **data, uint64_t *size);
    /* optional; create or replace an entry atomically. NULL: the backend is read-only. */
    int (*write)(void *self, const char *name, const void *buf, size_t len);
    /* optional; any time. */
    int (*stats)(void *self, struct ghc_backend_stats *out);
    /* optional; once, last. */
    void (*free)(void *self);
};

/* ---- the run's instance (core wrappers; core/backend.c) ---------------------------------- */

typedef struct ghc_backend ghc_backend_t;

/* The run's backend, or NULL. Borrowed. */
GHC_API ghc_backend_t *ghc_backend_get(ghc_core_t *core);
/* The wrappers call the member of the same name; a failure the plugin did not explain gets
 * a message naming the backend and the entry. Return 0 or GHC_E*. */
GHC_API int ghc_backend_mount(ghc_backend_t *b, const struct ghc_backend_root *roots, int32_t n);
GHC_API int ghc_backend_list(ghc_backend_t *b, const char *prefix, ghc_backend_visit_fn visit,
                             void *user);
GHC_API int ghc_backend_stat(ghc_backend_t *b, const char *name, uint64_t *size);
GHC_API int ghc_backend_read(ghc_backend_t *b, const char *name, uint64_t offset, void *buf,
                             size_t len, size_t *got);
/* GHC_EUNSUPPORTED when the backend or the entry has no mapping. */
GHC_API int ghc_backend_map(ghc_backend_t *b, const char *name, const void **data, uint64_t *size);
/* GHC_EUNSUPPORTED for a read-only backend. */
GHC_API int ghc_backend_write(ghc_backend_t *b, const char *name, const void *buf, size_t len);
/* Zeroes what the backend does not fill; sets struct_size. */
GHC_API int ghc_backend_stats(ghc_backend_t *b, struct ghc_backend_stats *out);
/* The whole entry in memory: a mapping when the backend has one (*owned = NULL), else a
 * malloc'ed copy that the caller frees (*owned = the same pointer). At most `max` bytes
 * (0: no limit): a prefix when the entry is longer; *size is the entry's full size. */
GHC_API int ghc_backend_fetch(ghc_backend_t *b, const char *name, uint64_t max, const void **data,
                              void **owned, size_t *len, uint64_t *size);
/* The backend's name ("local"). Static. */
GHC_API const char *ghc_backend_name(const ghc_backend_t *b);

/* The `local` backend (directories read with pread), which the core also uses when no backend
 * is configured; the `local` plugin registers this table. Static. */
GHC_API const struct ghc_backend_ops *ghc_backend_local_ops(void);
/* A backend instance of `ops` outside the run (cfg may be NULL: defaults), for the dataset's
 * fallback and for tools. Free with ghc_backend_free(). NULL on failure (message set). */
GHC_API ghc_backend_t *ghc_backend_init(ghc_core_t *core, const struct ghc_backend_ops *ops,
                                        ghc_cfg_t *cfg);
/* Release an instance made by ghc_backend_init(); never the run's. NULL is a no-op. */
GHC_API void ghc_backend_free(ghc_backend_t *b);

GHC_END_DECLS

#endif /* GHC_BACKEND_H */
