/* backend.h: the data-backend plugin interface: the dataset's bytes, by name (a relative
 * path such as "clip01.latent.safetensors"), from a local directory or staged in RAM. */
#ifndef GHC_BACKEND_H
#define GHC_BACKEND_H

#include <gh200core/plugin.h>   /* defines: ghc_core_t, ghc_cfg_t, struct ghc_cfg_key */

GHC_BEGIN_DECLS

/* Called by list() once per entry; a non-zero return stops the listing and is returned. */
typedef int (*ghc_backend_visit_fn)(void *user, const char *name, uint64_t size);

struct ghc_backend_ops {
    uint32_t struct_size;                 /* required: sizeof(struct ghc_backend_ops) */
    const char *name;                     /* required */
    const struct ghc_cfg_key *keys;       /* optional: keys of the [backend] section */
    /* required; once per run, after the mempolicy. *self belongs to the core. */
    int (*init)(ghc_core_t *core, ghc_cfg_t *cfg, void **self);
    /* required; entries whose name starts with `prefix` ("" for all), in name order. */
    int (*list)(void *self, const char *prefix, ghc_backend_visit_fn visit, void *user);
    /* required; size of an entry, GHC_ENOTFOUND when absent. */
    int (*stat)(void *self, const char *name, uint64_t *size);
    /* required; up to `len` bytes from `offset` into `buf`; *got is the count read. */
    int (*read)(void *self, const char *name, uint64_t offset, void *buf, size_t len, size_t *got);
    /* optional; a read-only view of the whole entry, valid until free() (in_memory, mmap). */
    int (*map)(void *self, const char *name, const void **data, uint64_t *size);
    /* optional; create or replace an entry atomically. NULL: the backend is read-only. */
    int (*write)(void *self, const char *name, const void *buf, size_t len);
    /* optional; once, last. */
    void (*free)(void *self);
};

typedef struct ghc_backend ghc_backend_t;

/* The run's backend, or NULL. Borrowed. */
GHC_API ghc_backend_t *ghc_backend_get(ghc_core_t *core);

GHC_END_DECLS

#endif /* GHC_BACKEND_H */
