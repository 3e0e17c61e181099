/* data_aug.c: augmented clips (flip_x, flip_y, random_crop) encoded at training time, for the
 * two augmentations_cache_mode values that do not cache them (doc/prepare.md,
 * "Augmentations"): `disable_cache` encodes a sample's clip each time it is drawn, with a crop
 * drawn anew; `refresh_each_epoch` encodes every augmented clip once per epoch, the next
 * epoch's on a thread of its own while this one trains, swapped in at the epoch boundary.
 * prepare records the augmented clips in its manifests (.<media>.prepare.json, "aug") and
 * writes their text caches; the dataset adds them as samples whose latent comes from here,
 * never from the cache plugin (which binds them without a latent file). One function,
 * ghc_data_aug_encode_clip, turns frames into a latent for prepare and for both modes. */
#include <config.h>

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include <gh200core/encoder.h>
#include <gh200core/media.h>
#include <gh200core/ops.h>
#include <gh200core/run.h>

#include "dataset_impl.h"
#include "media_impl.h"     /* defines: ghc_media_decoder_crop */

/* ---- shared with prepare -------------------------------------------------------------------- */

static const char *const aug_modes[] = { "static", "disable_cache", "refresh_each_epoch", NULL };

int ghc_data_aug_mode(ghc_cfg_t *data, ghc_cfg_t *entry, int *mode)
{
    ghc_cfg_t *cfg = entry && ghc_cfg_has(entry, "augmentations_cache_mode") ? entry : data;
    *mode = GHC_DATA_AUG_STATIC;
    return cfg ? ghc_cfg_get_choice(cfg, "augmentations_cache_mode", GHC_DATA_AUG_STATIC, aug_modes, mode) : 0;
}

uint64_t ghc_data_aug_seed(uint64_t seed, const char *media, int64_t epoch, int64_t draw)
{
    uint64_t h = 0xcbf29ce484222325ull;
    const unsigned char *p = (const unsigned char *)media;
    for (; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    uint64_t v[3] = { seed, (uint64_t)epoch, (uint64_t)draw };
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 8; b++)
            h = (h ^ ((v[i] >> (8 * b)) & 0xff)) * 0x100000001b3ull;
    return h;
}

int ghc_data_aug_encode_clip(ghc_core_t *core, ghc_vae_t *vae, const uint8_t *frames, int32_t f, int32_t h,
                             int32_t w, int flip, uint8_t *mirror, ghc_tensor_t **lat)
{
    int64_t vs[4] = { 3, f, h, w };
    *lat = NULL;
    ghc_tensor_t *video = ghc_tensor_init(core, GHC_DTYPE_F32, 4, vs, GHC_DEVICE_CPU, GHC_ROLE_ENCODER_ACTIVATIONS);
    if (!video)
        return ghc_error_code(core) < 0 ? ghc_error_code(core) : GHC_ENOMEM;
    if (flip) {
        ghc_media_flip(frames, f, h, w, flip & 1, flip & 2, mirror);
        frames = mirror;
    }
    ghc_media_to_vae_f32(frames, f, h, w, ghc_tensor_data(video));
    int rc = ghc_vae_encode(vae, video, lat);
    ghc_tensor_free(video);
    return rc;
}

/* ---- the items ------------------------------------------------------------------------------- */

struct aug_item {
    int64_t  sample;             /* its index in ds->samples */
    int32_t  set;                /* its dataset */
    char    *media;              /* the media file's path */
    char    *name;               /* its file name, which seeds the crop */
    int64_t  start;              /* the clip: first frame and length */
    int32_t  frames;
    int      flip;               /* bit 0 flip_x, bit 1 flip_y */
};

struct aug_set {                 /* what a dataset's augmented clips are made with */
    int      mode;               /* GHC_DATA_AUG_* */
    bool     random_crop;
    struct ghc_media_settings m;
};

struct data_aug {
    struct aug_item *items;
    int64_t          n, cap;
    struct aug_set  *sets;       /* [ds->n_sets] */
    uint64_t         seed;
    /* disable_cache: the run's VAE, on the caller's thread */
    ghc_media_decoder_t *dec;
    /* refresh_each_epoch: epoch cur_epoch's latents (bf16 CPU, [n], NULL for the items of
     * the other mode) and the next epoch's, made by the thread on a core of its own */
    bool             refresh;
    ghc_tensor_t   **cur, **next;
    int64_t          cur_epoch, next_epoch;
    ghc_core_t      *enc_core;
    ghc_media_decoder_t *enc_dec;
    bool             enc_gpu;    /* its VAE computes on a GPU: encoded on the run's thread */
    pthread_t        thread;
    bool             running;
    atomic_bool      stop, done;   /* asked to stop; next[] complete (or failed) */
    int              rc;
    char             msg[GHC_ERROR_MAX];
    double           seconds;    /* the last epoch's encoding */
};

/* A clip's latent as the dataset serves it: bf16 (what prepare writes), from the VAE's f32. */
static int to_bf16(ghc_core_t *core, ghc_tensor_t *lat, ghc_tensor_t **out)
{
    *out = ghc_tensor_init(core, GHC_DTYPE_BF16, ghc_tensor_ndim(lat), ghc_tensor_shape(lat), GHC_DEVICE_CPU,
                           GHC_ROLE_LATENTS);
    int rc = !*out ? (ghc_error_code(core) < 0 ? ghc_error_code(core) : GHC_ENOMEM)
                   : ghc_op_cast(*out, lat, 1.0f, NULL, NULL);
    if (rc < 0) {
        ghc_tensor_free(*out);
        *out = NULL;
    }
    return rc;
}

/* Items [i, j) of one media file (consecutive), decoded once with the crop of `crop_seed` and
 * encoded by vae on `core`: out[k] for each item k that `want` (NULL: all). Failures name the
 * file in core's message. */
static int encode_items(struct data_aug *a, ghc_core_t *core, ghc_vae_t *vae, ghc_media_decoder_t *dec, int64_t i,
                        int64_t j, uint64_t crop_seed, ghc_tensor_t **out)
{
    const struct aug_item *it = &a->items[i];
    const struct aug_set *set = &a->sets[it->set];
    struct ghc_media_frames fr;
    ghc_media_decoder_crop(dec, set->random_crop, crop_seed);
    if (ghc_media_decoder_open(dec, it->media, NULL) < 0 || ghc_media_decoder_read(dec, &set->m, &fr) < 0)
        return ghc_error_set(core, GHC_EFORMAT, "%s", ghc_media_decoder_error(dec));
    uint8_t *mirror = malloc((size_t)fr.frames * (size_t)fr.height * (size_t)fr.width * 3);
    int rc = mirror ? 0 : ghc_error_set(core, GHC_ENOMEM, "data: out of memory");
    for (int64_t k = i; k < j && rc == 0; k++) {
        const struct aug_item *x = &a->items[k];
        const struct ghc_media_clip *cl = NULL;
        for (int64_t c = 0; c < fr.n_clips && !cl; c++)
            if (fr.clips[c].start == x->start && fr.clips[c].frames == x->frames)
                cl = &fr.clips[c];
        if (!cl) {
            rc = ghc_error_set(core, GHC_EFORMAT, "%s: no clip of %d frames at frame %lld any more (run prepare again)",
                               x->media, (int)x->frames, (long long)x->start);
            break;
        }
        ghc_tensor_t *lat = NULL;
        const uint8_t *px = fr.rgb + (size_t)cl->start * (size_t)fr.height * (size_t)fr.width * 3;
        if ((rc = ghc_data_aug_encode_clip(core, vae, px, cl->frames, fr.height, fr.width, x->flip, mirror, &lat)) == 0)
            rc = to_bf16(core, lat, &out[k - i]);
        ghc_tensor_free(lat);
    }
    free(mirror);
    return rc;
}

/* ---- discovery ---------------------------------------------------------------------------------- */

static int json_i64(json_t *o, const char *k, int64_t *v)
{
    json_t *x = json_object_get(o, k);
    if (!json_is_integer(x))
        return -1;
    *v = json_integer_value(x);
    return 0;
}

/* The augmented samples one manifest lists (prepare's "aug"), appended to ds->samples. */
static int add_manifest(ghc_dataset_t *ds, int32_t d, const char *mfile)
{
    struct data_aug *a = ds->aug;
    const struct data_set *set = &ds->sets[d];
    char mpath[8400], media[8400], name[4200];
    snprintf(mpath, sizeof(mpath), "%s/%s", set->path, mfile);
    size_t nl = strlen(mfile) - strlen(".prepare.json") - 1;
    snprintf(name, sizeof(name), "%.*s", (int)nl, mfile + 1);
    snprintf(media, sizeof(media), "%s/%s", set->path, name);
    json_t *j = json_load_file(mpath, 0, NULL), *list = j ? json_object_get(j, "aug") : NULL;
    int rc = 0;
    for (size_t e = 0; json_is_array(list) && e < json_array_size(list) && rc == 0; e++) {
        json_t *o = json_array_get(list, e), *shape = json_object_get(o, "shape");
        const char *sample = json_string_value(json_object_get(o, "sample"));
        const char *text = json_string_value(json_object_get(o, "text"));
        int64_t start, frames, flip, sh[4];
        bool ok = sample && text && !strchr(sample, '/') && !strchr(text, '/') && json_i64(o, "start", &start) == 0 &&
                  json_i64(o, "frames", &frames) == 0 && json_i64(o, "flip", &flip) == 0 && json_is_array(shape) &&
                  json_array_size(shape) == 4 && flip >= 0 && flip < 4 && frames >= 1 && start >= 0;
        for (int k = 0; ok && k < 4; k++) {
            json_t *x = json_array_get(shape, (size_t)k);
            ok = json_is_integer(x) && (sh[k] = json_integer_value(x)) >= 1;
        }
        if (!ok) {
            char q[8500];
            if ((rc = ghc_data_bad_sample(ds, GHC_EFORMAT, "%s: entry %zu of \"aug\" is not what prepare writes (run "
                                          "prepare again)", ghc_path_quote(mpath, q, sizeof(q)), e)) > 0)
                rc = 0;
            continue;
        }
        if ((rc = ghc_data_reserve(ds, (void **)&ds->samples, &ds->cap_samples, ds->n_samples,
                                   sizeof(*ds->samples))) < 0 ||
            (rc = ghc_data_reserve(ds, (void **)&a->items, &a->cap, a->n, sizeof(*a->items))) < 0)
            break;
        struct data_sample *s = &ds->samples[ds->n_samples];
        char lat[4400], txt[4400];
        memset(s, 0, sizeof(*s));
        snprintf(lat, sizeof(lat), "%d/%s.latent.safetensors", (int)d, sample);   /* never on disk: named for messages */
        snprintf(txt, sizeof(txt), "%d/%s", (int)d, text);
        s->ds = d;
        s->format = GHC_DATA_FORMAT_NATIVE;
        s->lat_dtype = GHC_DTYPE_BF16;
        memcpy(s->lat_shape, sh, sizeof(sh));
        struct aug_item *it = &a->items[a->n];
        *it = (struct aug_item){ .sample = ds->n_samples, .set = d, .start = start, .frames = (int32_t)frames,
                                 .flip = (int)flip };
        if (!(s->file[GHC_SAMPLE_LATENT] = strdup(lat)) || !(s->key[GHC_SAMPLE_LATENT] = strdup("latent")) ||
            !(s->file[GHC_SAMPLE_TEXT_EMBED] = strdup(txt)) || !(it->media = strdup(media)) ||
            !(it->name = strdup(name))) {
            free(it->media);
            free(it->name);
            ghc_data_sample_clear(s);
            rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
            break;
        }
        if ((rc = ghc_data_text_check(ds, s)) != 0) {
            free(it->media);
            free(it->name);
            ghc_data_sample_clear(s);
            rc = rc > 0 ? 0 : rc;
            continue;
        }
        s->aug1 = ++a->n;
        ds->n_samples++;
    }
    json_decref(j);
    return rc;
}

static int only_manifests(const struct dirent *e)
{
    size_t n = strlen(e->d_name), k = strlen(".prepare.json");
    return e->d_name[0] == '.' && n > k + 1 && !strcmp(e->d_name + n - k, ".prepare.json");
}

int ghc_data_aug_discover(ghc_dataset_t *ds, int32_t d, ghc_cfg_t *data, ghc_cfg_t *entry)
{
    int mode, rc;
    bool crop = false;
    if ((rc = ghc_data_aug_mode(data, entry, &mode)) < 0 || (rc = ghc_cfg_get_bool(entry, "random_crop", false, &crop)) < 0)
        return rc;
    if (mode == GHC_DATA_AUG_STATIC)
        return 0;
    if (!ds->aug) {
        if (!(ds->aug = calloc(1, sizeof(*ds->aug))) ||
            !(ds->aug->sets = calloc((size_t)ds->n_sets, sizeof(*ds->aug->sets))))
            return ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
        ds->aug->seed = ds->seed;
        ds->aug->cur_epoch = ds->aug->next_epoch = -1;
    }
    struct aug_set *set = &ds->aug->sets[d];
    set->mode = mode;
    set->random_crop = crop;
    if ((rc = ghc_media_settings_read(entry, &set->m)) < 0)
        return rc;
    ds->aug->refresh |= mode == GHC_DATA_AUG_REFRESH;
    struct dirent **names = NULL;
    int n = scandir(ds->sets[d].path, &names, only_manifests, alphasort), first = (int)ds->aug->n;
    for (int i = 0; i < n; i++) {
        if (rc == 0)
            rc = add_manifest(ds, d, names[i]->d_name);
        free(names[i]);
    }
    free(names);
    if (rc == 0 && ds->aug->n > first)
        ghc_log(ds->core, GHC_LOG_INFO, "data: dataset %d (%s): %lld augmented clips encoded at training time (%s)",
                (int)d, ds->sets[d].path, (long long)(ds->aug->n - first), aug_modes[mode]);
    return rc;
}

bool ghc_data_aug_is(const ghc_dataset_t *ds, int64_t idx) { return ds->samples[idx].aug1 > 0; }

/* ---- refresh_each_epoch: the next epoch on a thread -------------------------------------------- */

static void log_fwd(void *user, enum ghc_log_level lvl, const char *msg)
{
    ghc_log(user, lvl, "%s", msg);
}

/* The encoder's own core: the `vae` and `mempolicy` sections of the run's configuration (the
 * VAE's path made absolute), the same plugin path, its log lines the run's. Nothing in it is
 * shared with the run's core, so its thread touches only it. */
static int enc_core_make(ghc_dataset_t *ds)
{
    ghc_core_t *core = ds->core, *c = ghc_core_init();
    static const char *const sections[] = { "vae", "mempolicy", NULL };
    size_t cap = 1 << 16, n = 0;
    char *text = malloc(cap);
    int rc = c && text ? 0 : ghc_error_set(core, GHC_ENOMEM, "data: out of memory");
    for (int i = 0; rc == 0 && sections[i]; i++) {
        ghc_cfg_t *s = ghc_config_section(core, sections[i]);
        if (!s)
            continue;
        n += (size_t)snprintf(text + n, n < cap ? cap - n : 0, "%s = { ", sections[i]);
        int k = ghc_cfg_text(s, text + (n < cap ? n : cap - 1), n < cap ? cap - n : 1);
        n += (size_t)(k > 0 ? k : 0);
        n += (size_t)snprintf(text + (n < cap ? n : cap - 1), n < cap ? cap - n : 1, " };\n");
    }
    if (rc == 0 && n >= cap)
        rc = ghc_error_set(core, GHC_EINVAL, "data: the vae section is too long to copy");
    const char *dir;
    for (int i = 0; rc == 0 && (dir = ghc_plugin_path_at(core, i)); i++)
        rc = ghc_plugin_add_path(c, dir);
    if (rc == 0) {
        ghc_log_set_sink(c, log_fwd, core);
        ghc_log_set_level(c, ghc_log_get_level(core));
        rc = ghc_config_load_string(c, text, "the augmentations' encoder", ghc_config_dir(core), NULL, 0);
    }
    ghc_cfg_t *v = rc == 0 ? ghc_config_section(core, "vae") : NULL;
    ghc_cfg_t *cv = rc == 0 ? ghc_config_section(c, "vae") : NULL;
    const char *p;
    char abs[4096];
    if (rc == 0 && v && cv && ghc_cfg_has(v, "path") && ghc_cfg_get_string(v, "path", NULL, &p) == 0 && p &&
        ghc_cfg_resolve_path(v, "path", p, abs, sizeof(abs)) == 0)
        rc = ghc_cfg_set_string(cv, "path", abs);
    if (rc == 0 && (rc = ghc_run_init(c)) == 0 && !ghc_vae_get(c))
        rc = ghc_error_code(c) < 0 ? ghc_error_code(c) : GHC_ECONFIG;
    if (rc < 0 && c && ghc_error_code(c) < 0)
        rc = ghc_error_set(core, rc, "data: the augmentations' encoder: %s", ghc_error_message(c));
    free(text);
    if (rc < 0) {
        ghc_core_free(c);
        return rc;
    }
    ds->aug->enc_core = c;
    /* A VAE on a GPU shares the run's CUDA stream and the kernels' per-stream scratch and
     * library handles, which one thread at a time may use: it encodes on the run's thread,
     * between epochs, instead of beside the steps (found on an H200: NaN losses from epoch 1) */
    int64_t dev = ghc_mem_default_device(c);
    ghc_cfg_t *vs = ghc_config_section(c, "vae");
    if (vs && ghc_cfg_has(vs, "device"))   /* the plugin's init took it: it reads */
        (void)ghc_cfg_get_int(vs, "device", dev, GHC_DEVICE_CPU, 1023, &dev);
    ds->aug->enc_gpu = dev != GHC_DEVICE_CPU;
    if (ds->aug->enc_gpu)
        ghc_log(core, GHC_LOG_INFO, "data: the augmented clips' VAE computes on cuda:%lld, as the run does: each "
                "epoch's clips are encoded on the run's thread before the epoch, not beside the steps", (long long)dev);
    return 0;
}

/* The thread: every refresh item's latent for epoch next_epoch into next[]. */
static void *refresh_run(void *arg)
{
    struct data_aug *a = arg;
    ghc_core_t *c = a->enc_core;
    ghc_vae_t *vae = ghc_vae_get(c);
    double t0 = ghc_data_seconds();
    int rc = vae ? 0 : GHC_ECONFIG;
    for (int64_t i = 0, j; i < a->n && rc == 0; i = j) {
        for (j = i + 1; j < a->n && !strcmp(a->items[j].media, a->items[i].media); j++)
            ;
        if (a->sets[a->items[i].set].mode != GHC_DATA_AUG_REFRESH)
            continue;
        if (atomic_load(&a->stop))
            rc = GHC_EINTERRUPTED;
        else
            rc = encode_items(a, c, vae, a->enc_dec, i, j,
                              ghc_data_aug_seed(a->seed, a->items[i].name, a->next_epoch, 0), a->next + i);
    }
    a->rc = rc;
    if (rc < 0)
        snprintf(a->msg, sizeof(a->msg), "%s", ghc_error_message(c));
    a->seconds = ghc_data_seconds() - t0;
    atomic_store(&a->done, true);
    return NULL;
}

static void refresh_clear(struct data_aug *a, ghc_tensor_t **t)
{
    for (int64_t i = 0; i < a->n; i++) {
        ghc_tensor_free(t[i]);
        t[i] = NULL;
    }
}

/* Start the encoding of `epoch` into next[]: on a thread, or inline (a VAE on a GPU; when no
 * thread can be made). */
static void refresh_start(struct data_aug *a, int64_t epoch)
{
    refresh_clear(a, a->next);
    a->next_epoch = epoch;
    a->rc = 0;
    atomic_store(&a->stop, false);
    atomic_store(&a->done, false);
    a->running = !a->enc_gpu && pthread_create(&a->thread, NULL, refresh_run, a) == 0;
    if (!a->running)
        refresh_run(a);
}

static void refresh_join(struct data_aug *a)
{
    if (a->running)
        pthread_join(a->thread, NULL);
    a->running = false;
}

int ghc_data_aug_epoch(ghc_dataset_t *ds, int64_t epoch)
{
    struct data_aug *a = ds->aug;
    int rc;
    if (!a || !a->refresh || a->cur_epoch == epoch)
        return 0;
    if (!a->enc_core) {
        if ((rc = enc_core_make(ds)) < 0)
            return rc;
        if (!(a->cur = calloc((size_t)a->n, sizeof(*a->cur))) || !(a->next = calloc((size_t)a->n, sizeof(*a->next))) ||
            !(a->enc_dec = ghc_media_decoder_init(1)))
            return ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
    }
    if (a->next_epoch != epoch || (!a->running && a->rc < 0)) {   /* a seek: what was made is for another epoch */
        atomic_store(&a->stop, true);
        refresh_join(a);
        refresh_start(a, epoch);
    }
    if (a->running && !atomic_load(&a->done)) {
        double t0 = ghc_data_seconds();
        ghc_log(ds->core, GHC_LOG_INFO, "data: waiting for epoch %lld's augmented clips (their encoding is not done)",
                (long long)epoch);
        refresh_join(a);
        ghc_log(ds->core, GHC_LOG_INFO, "data: epoch %lld's augmented clips ready after %.2f s more", (long long)epoch,
                ghc_data_seconds() - t0);
    }
    refresh_join(a);
    if (a->rc < 0)
        return ghc_error_set(ds->core, a->rc, "data: the augmented clips of epoch %lld: %s", (long long)epoch, a->msg);
    ghc_log(ds->core, GHC_LOG_DEBUG, "data: epoch %lld's augmented clips encoded in %.2f s", (long long)epoch, a->seconds);
    ghc_tensor_t **t = a->cur;
    a->cur = a->next;
    a->next = t;
    a->cur_epoch = epoch;
    refresh_start(a, epoch + 1);   /* while this epoch trains */
    return 0;
}

/* ---- serving ------------------------------------------------------------------------------------- */

int ghc_data_aug_latent(ghc_dataset_t *ds, int64_t idx, int64_t epoch, int64_t cursor, ghc_tensor_t **out)
{
    struct data_aug *a = ds->aug;
    int64_t k = ds->samples[idx].aug1 - 1;
    const struct aug_item *it = &a->items[k];
    *out = NULL;
    if (a->sets[it->set].mode == GHC_DATA_AUG_REFRESH) {
        int rc = ghc_data_aug_epoch(ds, epoch);
        if (rc < 0)
            return rc;
        const ghc_tensor_t *t = a->cur[k];
        *out = t ? ghc_tensor_wrap(ds->core, ghc_tensor_dtype(t), ghc_tensor_ndim(t), ghc_tensor_shape(t),
                                   GHC_DEVICE_CPU, (void *)ghc_tensor_cdata(t)) : NULL;
        return *out ? 0 : ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
    }
    /* disable_cache: this draw's own crop, on the run's VAE */
    ghc_vae_t *vae = ghc_vae_get(ds->core);
    if (!vae)
        return ghc_error_code(ds->core) < 0 ? ghc_error_code(ds->core) : GHC_ECONFIG;
    if (!a->dec && !(a->dec = ghc_media_decoder_init(0)))
        return ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
    return encode_items(a, ds->core, vae, a->dec, k, k + 1, ghc_data_aug_seed(a->seed, it->name, epoch, cursor + 1), out);
}

void ghc_data_aug_free(ghc_dataset_t *ds)
{
    struct data_aug *a = ds->aug;
    if (!a)
        return;
    atomic_store(&a->stop, true);
    refresh_join(a);
    if (a->cur)
        refresh_clear(a, a->cur);
    if (a->next)
        refresh_clear(a, a->next);
    free(a->cur);
    free(a->next);
    for (int64_t i = 0; i < a->n; i++) {
        free(a->items[i].media);
        free(a->items[i].name);
    }
    free(a->items);
    free(a->sets);
    ghc_media_decoder_free(a->dec);
    ghc_media_decoder_free(a->enc_dec);
    ghc_core_free(a->enc_core);   /* after its tensors (cur, next) */
    free(a);
    ds->aug = NULL;
}
