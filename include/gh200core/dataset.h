/* dataset.h: the training data: sample discovery in one or more dataset directories (the
 * project's format, musubi-tuner and ai-toolkit caches, detected by name and keys), buckets of
 * equal latent shape, seeded shuffling, repeats and weights, text-embedding dropout, batches
 * on a device, and a position (epoch, cursor) from which the order resumes exactly.
 *
 * Configured by the top-level `data` section (doc/dataset.md, doc/config.md); reads through
 * the run's backend and cache instances when configured, else straight from the directories.
 * In libgh200core_train (with the trainer), which links libgh200core_ops: batches go to a CUDA
 * device through ghc_op_copy. */
#ifndef GHC_DATASET_H
#define GHC_DATASET_H

#include <gh200core/cache.h>    /* defines: ghc_backend_t, ghc_cache_t, ghc_tensor_t */

GHC_BEGIN_DECLS

typedef struct ghc_dataset ghc_dataset_t;

/* One batch: samples of one bucket (equal latent shape and dtype). Tensors belong to the
 * dataset until ghc_data_batch_release(). */
struct ghc_data_batch {
    int32_t       n;            /* samples in the batch */
    ghc_tensor_t *latents;      /* [B, C, F, H, W], bf16 or f32: as stored, f16 widened to f32 */
    ghc_tensor_t *text_embed;   /* [B, L, D], zero-padded to the longest L of the batch; bf16
                                   when every embedding of the batch is, else f32 */
    ghc_tensor_t *text_mask;    /* [B, L] f32, 1 = token, 0 = padding */
    ghc_tensor_t *noise;        /* NULL, or the samples' stored noise [B, C, F, H, W] in the
                                   latents' dtype (every sample of the batch has the optional
                                   key `noise`) */
    ghc_tensor_t *timesteps;    /* NULL, or the samples' stored t [B] f32 (optional key `timestep`) */
    int64_t       epoch, cursor;/* position of the first sample */
    const int64_t *index;       /* [n] the samples (ghc_dataset_sample_at); borrowed like the tensors */
    const bool    *text_dropped;/* [n] true where the text embedding was dropped */
    int32_t        skipped;     /* samples of this batch left out as bad (skip_bad_samples) */
    void          *priv;        /* the dataset's; do not touch */
};

/* Open the dataset the run's `data` section describes: list the dataset directories through
 * the run's backend (mounting them; without a backend section, the `local` backend reads
 * them directly), detect each sample's format, read every header, check shapes and dtypes,
 * form the buckets, and bind the samples to the run's cache when one is configured. A bad
 * sample is an error that names its file, or with skip_bad_samples a counted skip. Returns
 * 0 or GHC_E* (message in ghc_error_message(core)); on success *out belongs to the caller,
 * who frees it with ghc_dataset_free() before ghc_run_free(). */
GHC_API int  ghc_dataset_open(ghc_core_t *core, ghc_dataset_t **out);
/* (since API 3) The same for another top-level section with the keys of `data` (the trainer's
 * held-out `validation` data): its folders are read through a `local` backend of its own,
 * without the run's backend and cache. */
GHC_API int  ghc_dataset_open_section(ghc_core_t *core, const char *section, ghc_dataset_t **out);
/* The keys of the `data` section (entry false) or of one `data.datasets` entry (true). */
GHC_API const struct ghc_cfg_key *ghc_dataset_keys(bool entry);
/* Release the dataset (batches not released are released). NULL is a no-op. */
GHC_API void ghc_dataset_free(ghc_dataset_t *ds);
/* Samples per epoch, repeats and weights included. */
GHC_API int64_t ghc_dataset_size(ghc_dataset_t *ds);

/* The next batch (batch_size samples of one bucket, fewer at a bucket's end), tensors on
 * `device` (GHC_DEVICE_CPU or a CUDA ordinal; on a device their copies are queued on `stream`
 * and complete in its order). Crossing the end of an epoch starts the next one. Then the
 * following batch's samples are prefetched through the cache (toward `device`, on `stream`)
 * while the caller computes. Returns 0 or GHC_E*
 * (a bad sample without skip_bad_samples: the message names the file). Release the batch
 * with ghc_data_batch_release(). */
GHC_API int  ghc_dataset_next(ghc_dataset_t *ds, int device, void *stream, struct ghc_data_batch *out);
/* Give a batch's memory back and zero *b. A zeroed batch is a no-op. */
GHC_API void ghc_data_batch_release(ghc_dataset_t *ds, struct ghc_data_batch *b);

/* The position of the next batch. Returns 0 (or GHC_ENOMEM rebuilding an epoch's order). */
GHC_API int  ghc_dataset_tell(ghc_dataset_t *ds, int64_t *epoch, int64_t *cursor);
/* Continue from a position that tell() (or a batch's epoch and cursor) gave. The order, the
 * weighted picks and the dropout decisions are pure functions of (seed, epoch, cursor), so
 * the batches that follow are exactly those that followed the position before. cursor =
 * ghc_dataset_size() means the start of the next epoch. Returns 0 or GHC_EINVAL (a cursor
 * that is not the start of a batch of that epoch; the message says the nearest ones). */
GHC_API int  ghc_dataset_seek(ghc_dataset_t *ds, int64_t epoch, int64_t cursor);

/* Statistics. The caller sets struct_size = sizeof(struct ghc_data_stats); the rest is
 * filled (members are only ever appended). */
struct ghc_data_stats {
    uint32_t struct_size;
    int64_t  samples;            /* distinct samples found (after skips) */
    int64_t  skipped;            /* bad samples skipped (skip_bad_samples), at open and since */
    int64_t  epoch_size;         /* ghc_dataset_size() */
    int32_t  datasets;
    int32_t  buckets;
    int64_t  batches;            /* served by ghc_dataset_next */
    int64_t  text_dropped;       /* samples served with a dropped text embedding */
    double   wait_seconds;       /* time ghc_dataset_next spent waiting for a batch */
    double   max_wait_seconds;   /* its longest single wait */
    double   open_seconds;       /* ghc_dataset_open, staging included */
    uint64_t bytes;              /* bytes of tensors served */
};
GHC_API int  ghc_dataset_stats(ghc_dataset_t *ds, struct ghc_data_stats *out);

/* ---- samples ------------------------------------------------------------------------------ */

enum ghc_data_format {
    GHC_DATA_FORMAT_NATIVE = 0,  /* <stem>.latent.safetensors (latent) + <stem>.text.safetensors */
    GHC_DATA_FORMAT_MUSUBI,      /* <stem>_WxH_wan.safetensors + <stem>_wan_te.safetensors */
    GHC_DATA_FORMAT_AITK,        /* _latent_cache/<stem>_<hash>.safetensors + _t_e_cache/... */
};
/* "gh200core", "musubi-tuner", "ai-toolkit". Static. */
GHC_API const char *ghc_data_format_name(enum ghc_data_format f);

struct ghc_data_sample_info {
    int32_t              dataset;        /* index into data.datasets */
    enum ghc_data_format format;
    const char          *latent_file;    /* backend entry names ("0/a.latent.safetensors") */
    const char          *text_file;
    const char          *caption_file;   /* NULL when there is no <stem>.txt */
    const char          *latent_key, *text_key;
    enum ghc_dtype       latent_dtype, text_dtype;   /* as stored (batches widen f16 to f32) */
    int64_t              latent_shape[4];/* C, F, H, W */
    int64_t              text_len, text_dim;
    int32_t              bucket;
    bool                 has_noise, has_timestep;
};
/* Distinct samples (after skips). */
GHC_API int64_t ghc_dataset_samples(ghc_dataset_t *ds);
/* Sample i; strings borrowed until ghc_dataset_free(). False out of range. */
GHC_API bool ghc_dataset_sample_at(ghc_dataset_t *ds, int64_t i, struct ghc_data_sample_info *out);

GHC_END_DECLS

#endif /* GHC_DATASET_H */
