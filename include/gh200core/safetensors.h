/* safetensors.h: reading and writing safetensors files (the format of checkpoints, adapters
 * and caches). The reader maps the file and validates the whole header strictly before any
 * tensor is touched; tensors load lazily, converted on load. Sharded checkpoints open through
 * their *.safetensors.index.json. The writer replaces its target atomically. */
#ifndef GHC_SAFETENSORS_H
#define GHC_SAFETENSORS_H

#include <gh200core/tensor.h>   /* defines: ghc_tensor_t, enum ghc_dtype */

GHC_BEGIN_DECLS

/* Header length limit (bytes of JSON after the 8-byte length). */
#define GHC_ST_MAX_HEADER (100u * 1024 * 1024)

typedef struct ghc_st ghc_st_t;

/* One tensor's entry. Strings and shape are borrowed; valid until ghc_st_free(). */
struct ghc_st_info {
    const char     *name;
    enum ghc_dtype  dtype;
    int             ndim;
    const int64_t  *shape;
    uint64_t        offset;    /* from the start of the data section of its file */
    uint64_t        nbytes;
    const char     *file;      /* the shard that holds it */
};

/* Open a .safetensors file, or a sharded checkpoint through its .safetensors.index.json.
 * Validates the whole header before returning: the header length (>= 2, <= GHC_ST_MAX_HEADER,
 * inside the file), a well-formed UTF-8 JSON object without duplicate keys, "__metadata__" a
 * map of strings, and for every tensor exactly the members dtype (known to this build), shape
 * (at most GHC_TENSOR_MAX_DIMS non-negative integers, product x dtype size without int64
 * overflow) and data_offsets [begin, end] with end - begin = numel * dtype size. As upstream
 * safetensors requires, the tensors sorted by offset cover the data section exactly: no
 * overlap, no hole, no trailing bytes. Offsets need not be aligned for the dtype.
 * An index is {"weight_map": {tensor: shard file relative to the index's folder}, "metadata":
 * {...}}; each shard is opened (and validated) once and must hold the tensors mapped to it.
 * Its metadata: the index's "metadata" (numbers as their JSON text), then the shards'
 * __metadata__ keys not seen before.
 * Every failure is GHC_EFORMAT (GHC_EIO for the file system) with one line
 * "path: what (tensor \"name\")" in the core's message.
 * The file stays mapped until ghc_st_free(): truncating it meanwhile is undefined (SIGBUS).
 * Returns NULL on failure; free with ghc_st_free(). */
GHC_API ghc_st_t *ghc_st_open(ghc_core_t *core, const char *path);
/* The same validation over bytes in memory (a backend's entry; borrowed, must outlive the
 * handle); `name` stands for the file in messages. `len` may be shorter than `file_size`, the
 * whole entry's size: a prefix holding at least the 8-byte length and the header, enough to
 * list tensors, shapes and metadata. The layout is checked against file_size; tensors whose
 * bytes lie past `len` give NULL from ghc_st_raw and GHC_EINVAL from the loaders.
 * Returns NULL on failure; free with ghc_st_free(). */
GHC_API ghc_st_t *ghc_st_open_memory(ghc_core_t *core, const char *name, const void *data,
                                     size_t len, uint64_t file_size);
/* Release the mapping(s). NULL is a no-op. */
GHC_API void ghc_st_free(ghc_st_t *st);

/* Number of tensors, and entry i in name order. */
GHC_API int  ghc_st_count(const ghc_st_t *st);
GHC_API bool ghc_st_info_at(const ghc_st_t *st, int i, struct ghc_st_info *out);
/* The entry named `name`; false when absent. */
GHC_API bool ghc_st_find(const ghc_st_t *st, const char *name, struct ghc_st_info *out);
/* The raw bytes of a tensor inside the mapping (little-endian, possibly unaligned for the
 * dtype), or NULL for an absent name. Borrowed; valid until ghc_st_free(). */
GHC_API const void *ghc_st_raw(const ghc_st_t *st, const char *name);
/* A metadata value, or NULL. Borrowed. */
GHC_API const char *ghc_st_metadata(const ghc_st_t *st, const char *key);
/* Metadata entry i (0, 1, ...), false past the end. Borrowed. */
GHC_API bool ghc_st_metadata_at(const ghc_st_t *st, int i, const char **key, const char **value);

/* Load tensor `name` into a new CPU tensor of `dtype` (a float dtype converts from any float
 * dtype in the file; other dtypes must match), with memory of `role`. NULL on failure
 * (GHC_ENOTFOUND for an absent name, GHC_EINVAL for an impossible conversion). */
GHC_API ghc_tensor_t *ghc_st_load(ghc_st_t *st, const char *name, enum ghc_dtype dtype,
                                  enum ghc_mem_role role);
/* Load into an existing CPU tensor of the same numel (converted to its dtype). */
GHC_API int ghc_st_load_into(ghc_st_t *st, const char *name, ghc_tensor_t *dst);

/* ---- writing -------------------------------------------------------------------------------- */

typedef struct ghc_st_writer ghc_st_writer_t;

/* Start a file; nothing touches `path` until ghc_st_writer_finish(). NULL on ENOMEM. */
GHC_API ghc_st_writer_t *ghc_st_writer_init(ghc_core_t *core);
/* Add a tensor (CPU; copied now) under `name` (UTF-8, not "__metadata__"). Duplicate names,
 * a device tensor or an invalid name are GHC_EINVAL. */
GHC_API int ghc_st_writer_add(ghc_st_writer_t *w, const char *name, const ghc_tensor_t *t);
/* Add raw bytes of a given dtype and shape (numel * dtype size bytes, copied now; `data` may
 * be NULL for zero elements). Returns 0, GHC_EINVAL or GHC_ENOMEM. */
GHC_API int ghc_st_writer_add_raw(ghc_st_writer_t *w, const char *name, enum ghc_dtype dtype,
                                  int ndim, const int64_t *shape, const void *data);
/* Set a __metadata__ string (copied; a later value for the same key replaces it). */
GHC_API int ghc_st_writer_metadata(ghc_st_writer_t *w, const char *key, const char *value);
/* Write everything to `path` atomically: a temporary file "path.tmp.XXXXXX" beside it (mode
 * 0644), fsync, rename, fsync of the folder. On failure the temporary file is removed and
 * `path` is as it was. The layout is Python safetensors' (the same tensors give the same
 * bytes): "__metadata__" first (keys sorted; omitted when empty), tensors by dtype, widest
 * first, then by name, so each is aligned to its element size; the header is padded with
 * spaces to a multiple of 8. The writer stays usable. Returns 0, GHC_EIO (file system),
 * GHC_EINVAL (header over GHC_ST_MAX_HEADER) or GHC_ENOMEM. */
GHC_API int ghc_st_writer_finish(ghc_st_writer_t *w, const char *path);
/* Release the writer (whether or not finished). NULL is a no-op. */
GHC_API void ghc_st_writer_free(ghc_st_writer_t *w);

GHC_END_DECLS

#endif /* GHC_SAFETENSORS_H */
