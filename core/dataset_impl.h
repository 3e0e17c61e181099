/* dataset_impl.h: the body of ghc_dataset_t and what the dataset's files share: dataset.c
 * (the section, discovery, open), data_formats.c (the formats' table, listings, header
 * checks), data_aitk.c (ai-toolkit's names), data_order.c (buckets, the epoch order, the
 * position) and data_batch.c (batches). Never installed. */
#ifndef GHC_DATASET_IMPL_H
#define GHC_DATASET_IMPL_H

#include <string.h>

#include <gh200core/dataset.h>
#include <gh200core/encoder.h>      /* defines: ghc_vae_t */
#include <gh200core/gh200core.h>
#include <gh200core/safetensors.h>     /* defines: struct ghc_st_info */

/* ---- the dataset ----------------------------------------------------------------------------- */

struct data_set {                /* one entry of data.datasets */
    char                 *path;  /* absolute */
    int64_t               repeats;
    double                weight;
    enum ghc_compression  compression;
    int64_t               first, n;   /* its samples: [first, first + n) */
    int64_t               slots;      /* per epoch: round(n * repeats * weight) */
    char                 *trigger_word;    /* ai-toolkit's, for its caption hash; NULL: none */
    char                 *default_caption; /* ai-toolkit's, likewise; NULL: none */
    char                 *blank_file;      /* an ai-toolkit dropout-caption embedding, or NULL */
    char                 *blank_caption;   /* the caption it was made from */
    ghc_tensor_t         *empty;           /* blank_file's embedding [L, D] f32, or NULL */
};

struct data_sample {
    int32_t              ds;
    enum ghc_data_format format;
    char                *file[GHC_SAMPLE_KIND_COUNT];
    char                *key[GHC_SAMPLE_KIND_COUNT];
    char                *caption;
    enum ghc_dtype       lat_dtype, txt_dtype;
    int64_t              lat_shape[4];
    int64_t              txt_len, txt_dim;
    int32_t              bucket;
    int64_t              aug1;   /* an augmented clip encoded at training time: its item + 1
                                  * (data_aug.c); 0: none, the latent is the file's */
};

struct data_bucket {
    enum ghc_dtype dtype;            /* as served (ghc_data_served_dtype) */
    int64_t        shape[4];
    int64_t        count;            /* samples */
};

struct data_order_batch {
    int64_t start;                   /* offset into order[] == cursor of the first sample */
    int32_t n;
};

struct ghc_dataset {
    ghc_core_t        *core;
    ghc_backend_t     *backend;      /* the run's, or own_backend */
    ghc_backend_t     *own_backend;
    ghc_cache_t       *cache;        /* the run's, or NULL: decode on each use */
    struct data_aug   *aug;          /* augmented clips encoded at training time, or NULL */

    int64_t            batch_size;
    uint64_t           seed;
    double             text_dropout;
    bool               skip_bad, shuffle;
    ghc_tensor_t      *empty;        /* the empty prompt's embedding [L, D], or NULL: zeros */
    int64_t            text_dim;

    struct data_set   *sets;
    int32_t            n_sets;
    struct data_sample *samples;
    int64_t            n_samples, cap_samples;
    struct data_bucket *buckets;
    int32_t            n_buckets;
    int64_t            epoch_size;

    /* the order of epoch `order_epoch` */
    int64_t            order_epoch;  /* -1: none yet */
    int64_t           *order;        /* [epoch_size] sample indices */
    struct data_order_batch *batches;
    int64_t            n_batches;

    /* the position: the next batch is batches[pos_batch] of epoch pos_epoch */
    int64_t            pos_epoch, pos_batch;

    struct ghc_data_stats st;
};

/* The dtype a stored tensor has in a batch: f16 is widened to f32 (exactly), because the
 * trainer's ops take f32 and bf16 only; bf16 and f32 stay as they are. */
static inline enum ghc_dtype ghc_data_served_dtype(enum ghc_dtype dt)
{
    return dt == GHC_DTYPE_F16 ? GHC_DTYPE_F32 : dt;
}

/* Whether s ends with suf. */
static inline bool ghc_data_ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && memcmp(s + a - b, suf, b) == 0;
}

/* Seconds of a monotonic clock, for the statistics. */
double ghc_data_seconds(void);
/* The file on disk behind a backend entry "<dataset>/<name>", for messages. Returns buf. */
const char *ghc_data_disk_name(const ghc_dataset_t *ds, const char *entry, char *buf, size_t n);
/* A bad sample: an error (returns rc, "data: " + the message), or with skip_bad_samples a
 * warning and a count (returns 1, the error cleared). A message already set is passed in
 * as the reason ("%s", ghc_error_message(core)). */
int ghc_data_bad_sample(ghc_dataset_t *ds, int rc, const char *fmt, ...) GHC_PRINTF(3, 4);
/* The seed of the `data` section: data.seed, else the top-level seed, else 42. 0 or GHC_ECONFIG. */
int ghc_data_seed(ghc_core_t *core, ghc_cfg_t *data, uint64_t *seed);
/* Room for element n of the array *p (*cap elements of `size` bytes; doubled, from 256, when
 * full). Returns 0 or GHC_ENOMEM. */
int ghc_data_reserve(ghc_dataset_t *ds, void **p, int64_t *cap, int64_t n, size_t size);
/* Free a sample's strings and zero it. */
void ghc_data_sample_clear(struct data_sample *s);

/* ---- augmentations encoded at training time (data_aug.c) -------------------------------------- */

/* augmentations_cache_mode values (ai-toolkit's GH200 fork's names). */
enum { GHC_DATA_AUG_STATIC = 0, GHC_DATA_AUG_DISABLE_CACHE, GHC_DATA_AUG_REFRESH };
/* augmentations_cache_mode of dataset entry `entry` (else of `data`) into *mode. Returns 0 or
 * GHC_ECONFIG (one line naming the key). */
int ghc_data_aug_mode(ghc_cfg_t *data, ghc_cfg_t *entry, int *mode);
/* The seed of a random crop: the data seed, the media file's name, the epoch (-1: static) and
 * the draw (disable_cache: its position + 1; else 0). */
uint64_t ghc_data_aug_seed(uint64_t seed, const char *media, int64_t epoch, int64_t draw);
/* Clip frames [f, h, w, 3] (uint8) flipped by `flip` (bit 0 left-right, bit 1 upside down;
 * mirror: f * h * w * 3 bytes of scratch when flip is not 0) and encoded by vae on core: *lat a
 * new f32 CPU latent the caller frees. Shared by prepare and the modes below. 0 or GHC_E*. */
int ghc_data_aug_encode_clip(ghc_core_t *core, ghc_vae_t *vae, const uint8_t *frames, int32_t f, int32_t h,
                             int32_t w, int flip, uint8_t *mirror, ghc_tensor_t **lat);
/* Dataset d's augmented clips that its mode (disable_cache, refresh_each_epoch; static: none)
 * encodes at training time, from prepare's manifests in its folder, appended to the samples
 * (their text files checked). 0 or GHC_E*. */
int  ghc_data_aug_discover(ghc_dataset_t *ds, int32_t d, ghc_cfg_t *data, ghc_cfg_t *entry);
/* refresh_each_epoch: make `epoch`'s latents the ones served, waiting for their encoding (a log
 * line) when it is not done, and start the next epoch's. 0 or GHC_E*. */
int  ghc_data_aug_epoch(ghc_dataset_t *ds, int64_t epoch);
/* The latent of augmented sample idx at (epoch, cursor): a new bf16 CPU tensor (a view of the
 * epoch's for refresh_each_epoch; encoded now for disable_cache), freed with ghc_tensor_free. */
int  ghc_data_aug_latent(ghc_dataset_t *ds, int64_t idx, int64_t epoch, int64_t cursor, ghc_tensor_t **out);
/* Stops the encoding thread; NULL ds->aug is a no-op. */
void ghc_data_aug_free(ghc_dataset_t *ds);

/* ---- the formats (data_formats.c) ---------------------------------------------------------------
 *
 * A listing holds a dataset's entries that some format claims and its "<stem>.txt" captions,
 * each with the stem that pairs a latent with its text file and caption. It is sorted by
 * (stem, class), and a dataset's samples come in that order; so the classes follow the
 * formats' enum order (latent before text, captions last), not the table's, and a seed's
 * epoch order does not depend on where a format stands in the table. */

enum { GHC_DATA_N_FORMATS = GHC_DATA_FORMAT_AITK + 1 };
#define GHC_DATA_CLASS_CAPTION (2 * GHC_DATA_N_FORMATS)

/* The class of a format's latent (kind GHC_SAMPLE_LATENT) or text file (GHC_SAMPLE_TEXT_EMBED). */
static inline int ghc_data_class(enum ghc_data_format format, enum ghc_sample_kind kind)
{
    return 2 * (int)format + (kind == GHC_SAMPLE_TEXT_EMBED);
}

struct data_found {              /* one listed entry with its class and pairing stem */
    char                *name;   /* the backend entry */
    char                *stem;   /* "<dataset>/<stem>" */
    int                  cls;    /* ghc_data_class() or GHC_DATA_CLASS_CAPTION */
    enum ghc_data_format format; /* the two below: not for a caption */
    enum ghc_sample_kind kind;
    bool                 used, stale;  /* ai-toolkit texts: matched a caption hash / matched none */
};

struct data_listing {
    struct data_found *f;
    size_t             n, cap;
    int32_t            ds;
    bool               oom;    /* the visitor ran out of memory (it has no core to say so) */
};

/* Which tensor of a file is the latent or the text embedding. */
struct data_key_rule {
    bool (*match)(const char *key);  /* the first of a header's keys it is true for */
    const char *hint;                /* names the key in messages: "\"latent\"" */
    /* Optional: checks beyond the shape and dtype every format's tensors must have (a key
     * that names its shape or dtype must agree). 0 or ghc_data_bad_sample's result. */
    int  (*check)(ghc_dataset_t *ds, const char *disk, const char *key, const struct ghc_st_info *info);
};

/* One layout of sample files. Adding a format: an enum value in dataset.h, one entry in
 * data_formats.c's table (where it stands there decides which format claims a name two of
 * them fit) and the functions it names. */
struct data_format {
    enum ghc_data_format format;
    const char *name;            /* ghc_data_format_name() */
    const char *what;            /* in a dataset's log line: "musubi-tuner cache" */
    const char *latents;         /* what its latents are ("posterior means"), for a warning where
                                  * a dataset mixes two kinds; NULL: not known */
    /* Whether backend entry `name` is one of its files: 1 with the file's kind (LATENT or
     * TEXT_EMBED) and its stem "<dataset>/<stem>" (malloc'ed), 0 if not, or GHC_ENOMEM. */
    int  (*classify)(const char *name, enum ghc_sample_kind *kind, char **stem);
    struct data_key_rule latent, text;
    /* The text file of latent `lat` in `ls` (which it may mark): 0 with *text (NULL: none),
     * 1 (a bad sample, skipped) or GHC_E*. */
    int  (*pair)(ghc_dataset_t *ds, struct data_listing *ls, const struct data_found *lat,
                 const struct data_found **text);
    const char *text_name;       /* after the stem: the text file pair() wants, for messages */
    const char *lone_text;       /* after the stem: the latent a text file without one lacks (a
                                  * bad sample); NULL: a lone text file is nothing to report */
    /* Optional: after a dataset's samples are found, a word on its files no sample took. */
    void (*report)(ghc_dataset_t *ds, int32_t d, const struct data_listing *ls);
};

/* The format's table entry; NULL for a value out of range. */
const struct data_format *ghc_data_format_of(enum ghc_data_format format);
/* List dataset d's entries into ls (zeroed by the caller, ls->ds = d), sorted. Returns 0 or
 * GHC_E*; ls is freed with ghc_data_listing_free either way. */
int  ghc_data_listing_read(ghc_dataset_t *ds, int32_t d, struct data_listing *ls);
void ghc_data_listing_free(struct data_listing *ls);
/* An entry of class `cls` and stem `stem`, or NULL. */
const struct data_found *ghc_data_listing_find(const struct data_listing *ls, int cls, const char *stem);
/* All entries of class `cls` and stem `stem`: [*lo, *hi) of the listing; false for none. */
bool ghc_data_listing_range(const struct data_listing *ls, int cls, const char *stem, size_t *lo, size_t *hi);
/* Check sample s's latent and text headers by its format's rules and fill its keys, dtypes
 * and shapes (and its stored noise and timestep). 0, 1 (a bad sample, skipped) or GHC_E*. */
int  ghc_data_sample_check(ghc_dataset_t *ds, struct data_sample *s);
/* The text half of that: the sample's text file only. */
int  ghc_data_text_check(ghc_dataset_t *ds, struct data_sample *s);

/* ---- ai-toolkit (data_aitk.c) ---------------------------------------------------------------- */

/* ai-toolkit's members of the table (struct data_format says what each does). */
int  ghc_aitk_classify(const char *name, enum ghc_sample_kind *kind, char **stem);
int  ghc_aitk_pair(ghc_dataset_t *ds, struct data_listing *ls, const struct data_found *lat,
                   const struct data_found **text);
void ghc_aitk_report(ghc_dataset_t *ds, int32_t d, const struct data_listing *ls);
/* Whether s is UTF-8 as Python's strict decoder reads it (ai-toolkit hashes a caption's UTF-8). */
bool ghc_utf8_valid(const char *s);

/* ---- the order (data_order.c) and batches (data_batch.c) ------------------------------------- */

/* Sort the samples into buckets (served dtype and latent shape) and size the epoch. */
int  ghc_data_buckets_make(ghc_dataset_t *ds);
/* Make the order of `epoch` the current one (nothing to do when it is). Returns 0 or GHC_ENOMEM. */
int  ghc_data_order_build(ghc_dataset_t *ds, int64_t epoch);
/* Whether the text of the sample at (epoch, cursor) is dropped. */
bool ghc_data_text_dropped(const ghc_dataset_t *ds, int64_t epoch, int64_t cursor);
/* Load each dataset's ai-toolkit blank embedding for its dropped texts (where no
 * data.empty_prompt is given). Returns 0 or GHC_ENOMEM; a file that cannot serve is a warning. */
int  ghc_data_blanks_load(ghc_dataset_t *ds);

/* ---- for the trainer (train_check.c) --------------------------------------------------------- */

/* Whether the model can take sample `si`; when not, the reason (naming the sample's file) in
 * why (len bytes). */
typedef bool (*ghc_data_fit_fn)(void *user, const struct ghc_data_sample_info *si, char *why, size_t len);
/* ghc_dataset_open_section with each sample checked by `fit` (NULL: none) before the buckets
 * are made: with skip_bad_samples a sample that does not fit is a bad sample (one warning,
 * counted, left out); without, GHC_ECONFIG "<section>: <the first reason>; and N more ...". */
int ghc_dataset_open_fit(ghc_core_t *core, const char *section, ghc_data_fit_fn fit, void *user, ghc_dataset_t **out);

/* ---- for the trainer with several ranks (train.c) --------------------------------------------- */

/* One batch of a step's plan: positions [start, start + n) of epoch `epoch`'s order. */
struct ghc_data_plan {
    int64_t epoch, start;
    int32_t n;
    int64_t latent_shape[4];    /* C, F, H, W of the batch's bucket */
    bool    has_noise, has_timestep;  /* its samples store noise, a timestep (the first one's) */
};
/* The next k batches from the position, the way ghc_dataset_next() walks the order, into
 * out[0..k), without reading a sample; advance: the position moves past them. Returns 0 or
 * GHC_ENOMEM. */
int ghc_data_plan(ghc_dataset_t *ds, int32_t k, bool advance, struct ghc_data_plan *out);
/* Positions [start, start + n) of epoch `epoch`'s order, all within one batch, assembled and
 * served as ghc_dataset_next() serves a batch (bad samples the same way: fewer samples, or
 * none, with skip_bad_samples). The position does not move. */
int ghc_data_serve(ghc_dataset_t *ds, int64_t epoch, int64_t start, int32_t n, int device, void *stream,
                   struct ghc_data_batch *out);

#endif /* GHC_DATASET_IMPL_H */
