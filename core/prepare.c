/* prepare.c: `gh200core prepare` (train.h, doc/prepare.md): every media dataset of the `data`
 * section (a folder of videos and images with captions, media.h) encoded once by the run's `vae`
 * and `text_encoder` plugins (encoder.h) into the project's cache format beside the media:
 * per clip <stem>.latent.safetensors (`latent`, the normalised posterior mean, bf16) and
 * <stem>.text.safetensors (`text_embed` [L, D], bf16, trimmed to its true length), which the
 * dataset then reads like any gh200core cache. A hidden manifest per media file
 * (.<name>.prepare.json) holds the content hash of the media bytes, the caption and the
 * settings (media keys, encoder sections) and the files made: a second run with the same hash
 * reads nothing else, an edited caption or setting re-encodes that file, and since the
 * manifest is written last (and every file atomically), a killed run leaves nothing served
 * stale. With a dataset's musubi_cache, musubi-tuner's files of the same encodings are written
 * too (musubi-tuner's names, keys and metadata) and listed in the manifest like ours. With its
 * flip_x / flip_y each clip is also encoded mirrored (<stem>_flipx, _flipy, _flipxy), its text
 * cache hard-linked under that stem; with random_crop the crop's corner is drawn (seeded by the
 * data seed and the file's name) instead of centred. That is augmentations_cache_mode "static";
 * with "disable_cache" or "refresh_each_epoch" the augmented clips are not encoded here but
 * listed in the manifest ("aug") with one text cache per clip, for the dataset to encode
 * when training (data_aug.c).
 * The next media files are hashed and decoded on threads while one is encoded; the last line
 * says where the time of the files encoded went (encoding, waiting for their decoding, loading
 * the encoders), so a run tells whether the encoders or the decoding limited it. */
#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include <gh200core/dataset.h>
#include <gh200core/encoder.h>
#include <gh200core/media.h>
#include <gh200core/ops.h>
#include <gh200core/run.h>
#include <gh200core/safetensors.h>
#include <gh200core/train.h>

#include "dataset_impl.h"   /* defines: ghc_data_aug_mode, ghc_data_aug_encode_clip */
#include "media_impl.h"     /* defines: ghc_media_decoder_crop */
#include "train_impl.h"

/* ---- hashes and fingerprints ------------------------------------------------------------------ */

static uint64_t fnv_str(uint64_t h, const char *s) { return ghc_fnv1a(h, s, strlen(s) + 1); }

/* The hash of a file's bytes into *h (any thread). Returns 0 or an errno value. */
static int hash_file(const char *path, uint64_t *h)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return errno ? errno : EIO;
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        *h = ghc_fnv1a(*h, buf, n);
    int bad = ferror(f);
    fclose(f);
    return bad ? EIO : 0;
}

/* What makes an encoder section's output, appended to buf: its settings, and the size and time
 * of the files it names (path, tokenizer). */
static void section_fp(ghc_core_t *core, const char *name, char *buf, size_t len)
{
    ghc_cfg_t *s = ghc_config_section(core, name);
    size_t n = strlen(buf);
    if (!s)
        return;
    n += (size_t)snprintf(buf + n, len > n ? len - n : 0, "%s:", name);
    int k = ghc_cfg_text(s, buf + (n < len ? n : len), len > n ? len - n : 0);
    n += (size_t)(k > 0 ? k : 0);
    static const char *const files[] = { "path", "tokenizer", NULL };
    for (int i = 0; files[i]; i++) {
        const char *v;
        char abs[4096];
        struct stat st = { 0 };
        if (!ghc_cfg_has(s, files[i]) || ghc_cfg_get_string(s, files[i], NULL, &v) < 0 || !v ||
            ghc_cfg_resolve_path(s, files[i], v, abs, sizeof(abs)) < 0 || stat(abs, &st) != 0)
            continue;
        n += (size_t)snprintf(buf + n, len > n ? len - n : 0, "|%s:%lld:%lld", files[i], (long long)st.st_size,
                              (long long)st.st_mtime);
    }
    ghc_error_clear(core);
}

static void media_fp(const struct ghc_media_settings *m, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "media=%dx%d:%d:%d:%s:%d:%d:%d:%.6g:%.6g:[", m->width, m->height,
                                m->enable_bucket, m->bucket_no_upscale, ghc_media_extraction_name(m->frame_extraction),
                                m->frame_stride, m->frame_sample, m->max_frames, m->source_fps, m->target_fps);
    for (int i = 0; i < m->n_target_frames; i++)
        n += (size_t)snprintf(buf + n, len > n ? len - n : 0, "%d,", m->target_frames[i]);
    snprintf(buf + n, len > n ? len - n : 0, "];");
}

/* ---- files ---------------------------------------------------------------------------------- */

/* `t` (f32, CPU) written as bf16 under `key` to `path` atomically, with the prepare hash and
 * the metadata `meta` (NULL, or key, value, ..., NULL). */
static int write_bf16(ghc_core_t *core, const char *path, const char *key, const ghc_tensor_t *t, const char *hash,
                      const char *const *meta)
{
    ghc_tensor_t *b = ghc_tensor_init(core, GHC_DTYPE_BF16, ghc_tensor_ndim(t), ghc_tensor_shape(t), GHC_DEVICE_CPU,
                                      GHC_ROLE_ENCODER_ACTIVATIONS);
    ghc_st_writer_t *w = b ? ghc_st_writer_init(core) : NULL;
    int rc = !b || !w ? (ghc_error_code(core) < 0 ? ghc_error_code(core) : GHC_ENOMEM) : 0;
    if (rc == 0 && (rc = ghc_op_cast(b, t, 1.0f, NULL, NULL)) == 0 && (rc = ghc_st_writer_add(w, key, b)) == 0)
        rc = ghc_st_writer_metadata(w, "gh200core.prepare", hash);
    for (int i = 0; meta && meta[i] && rc == 0; i += 2)
        rc = ghc_st_writer_metadata(w, meta[i], meta[i + 1]);
    if (rc == 0)
        rc = ghc_st_writer_finish(w, path);
    ghc_st_writer_free(w);
    ghc_tensor_free(b);
    return rc;
}

/* The manifest of media file `name` in dir: "dir/.name.prepare.json". */
static void manifest_path(const char *dir, const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "%s/.%s.prepare.json", dir, name);
}

/* Whether the manifest holds `hash` and every file it lists exists. */
static bool up_to_date(const char *dir, const char *mpath, const char *hash)
{
    json_t *j = json_load_file(mpath, 0, NULL);
    const char *h = j ? json_string_value(json_object_get(j, "hash")) : NULL;
    json_t *files = j ? json_object_get(j, "files") : NULL;
    bool ok = h && !strcmp(h, hash) && json_is_array(files) && json_array_size(files) > 0;
    for (size_t i = 0; ok && i < json_array_size(files); i++) {
        const char *f = json_string_value(json_array_get(files, i));
        char p[8400];
        struct stat st;
        snprintf(p, sizeof(p), "%s/%s", dir, f ? f : "");
        ok = f && !strchr(f, '/') && stat(p, &st) == 0;
    }
    json_decref(j);
    return ok;
}

/* The text cache of a clip's augmented variants that are encoded at training time (after
 * "<name>"): a name no format of the dataset claims (a lone text file), listed by every backend. */
#define AUG_TEXT ".aug-text.safetensors"

/* Files an older manifest lists that `now` (NULL-terminated names) does not: removed. */
static void remove_stale(ghc_core_t *core, const char *dir, const char *mpath, char **now, int n_now)
{
    json_t *j = json_load_file(mpath, 0, NULL);
    json_t *files = j ? json_object_get(j, "files") : NULL;
    for (size_t i = 0; json_is_array(files) && i < json_array_size(files); i++) {
        const char *f = json_string_value(json_array_get(files, i));
        bool keep = !f || strchr(f, '/') || f[0] == '.';
        for (int k = 0; !keep && k < n_now; k++)
            keep = !strcmp(now[k], f);
        if (keep)
            continue;
        char p[8400];
        snprintf(p, sizeof(p), "%s/%s", dir, f);
        if (unlink(p) == 0)
            ghc_log(core, GHC_LOG_INFO, "prepare: removed %s (no longer made by these settings)", p);
    }
    json_decref(j);
}

/* The manifest: the hash, the files made and (aug, NULL for none; taken) the augmented clips
 * the dataset encodes at training time. */
static int write_manifest(ghc_core_t *core, const char *mpath, const char *hash, char **files, int n, json_t *aug)
{
    json_t *j = json_object(), *a = json_array();
    char tmp[8500];
    int rc = 0;
    if (!j || !a) {
        json_decref(j);
        json_decref(a);
        json_decref(aug);
        return ghc_error_set(core, GHC_ENOMEM, "prepare: out of memory");
    }
    if (aug)
        json_object_set_new(j, "aug", aug);
    json_object_set_new(j, "format", json_string("gh200core-prepare"));
    json_object_set_new(j, "hash", json_string(hash));
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_string(files[i]));
    json_object_set_new(j, "files", a);
    snprintf(tmp, sizeof(tmp), "%s.tmp", mpath);
    if (json_dump_file(j, tmp, JSON_INDENT(1)) != 0 || rename(tmp, mpath) != 0) {
        unlink(tmp);
        rc = ghc_error_set(core, GHC_EIO, "prepare: %s: cannot write: %s", mpath, strerror(errno));
    }
    json_decref(j);
    return rc;
}

/* ---- one media file: read (a worker thread), then encode (the caller's) -------------------- */

struct prep {
    ghc_core_t            *core;
    bool                   force, skip_bad;
    uint64_t               seed;            /* the data seed: random crops */
    struct ghc_prepare_stats *st;
    char                   enc_fp[8192];    /* the encoder sections' fingerprint */
    /* seconds of the files encoded, on the encoding thread (doc/prepare.md, "Decoding beside
     * encoding"): in job_encode, in job_wait for their reading, loading the encoders */
    double                 encode_s, wait_s, load_s;
};

/* The reading of one media file, done on a thread of its own while the file before it is
 * encoded: its hash, whether its caches are up to date, and (when not) its frames decoded.
 * Touches neither the core nor its error buffer: failures go to msg. */
struct job {
    const struct prep *p;
    const char        *dir, *mfp;
    bool               musubi;         /* musubi-tuner's files too (musubi_cache) */
    bool               random_crop;
    int                aug_mode;       /* GHC_DATA_AUG_*: static encodes the augmented clips */
    const struct ghc_media_settings *m;
    const struct ghc_media_item *it;
    ghc_media_decoder_t *dec;          /* owned by the caller, one per job slot */
    char               hash[24], mpath[8400];
    bool               current;        /* up to date: nothing to encode */
    int                rc;             /* 0, or the failure (msg) */
    char               msg[GHC_ERROR_MAX];
    struct ghc_media_frames fr;
    pthread_t          thread;
    bool               running;
};

static void *job_read(void *arg)
{
    struct job *j = arg;
    const struct ghc_media_item *it = j->it;
    j->rc = 0;
    j->current = false;
    if (it->bad) {
        j->rc = GHC_EFORMAT;
        snprintf(j->msg, sizeof(j->msg), "%s", it->bad);
        return NULL;
    }
    uint64_t h = GHC_FNV1A_BASIS;
    int e = hash_file(it->path, &h);
    if (e) {
        j->rc = GHC_EIO;
        snprintf(j->msg, sizeof(j->msg), "prepare: %s: %s", it->path, strerror(e));
        return NULL;
    }
    h = fnv_str(fnv_str(fnv_str(h, it->caption), j->mfp), j->p->enc_fp);
    snprintf(j->hash, sizeof(j->hash), "%016llx", (unsigned long long)h);
    manifest_path(j->dir, it->name, j->mpath, sizeof(j->mpath));
    if (!j->p->force && up_to_date(j->dir, j->mpath, j->hash)) {
        j->current = true;
        return NULL;
    }
    /* static: the crop drawn once (its epoch -1); the other modes draw theirs when training,
     * the frames here only say the clips */
    ghc_media_decoder_crop(j->dec, j->random_crop && j->aug_mode == GHC_DATA_AUG_STATIC,
                           ghc_data_aug_seed(j->p->seed, it->name, -1, 0));
    if ((j->rc = ghc_media_decoder_open(j->dec, it->path, NULL)) < 0 ||
        (j->rc = ghc_media_decoder_read(j->dec, j->m, &j->fr)) < 0)
        snprintf(j->msg, sizeof(j->msg), "%s", ghc_media_decoder_error(j->dec));
    return NULL;
}

/* Start job j (on a thread; inline when none can be made). */
static void job_start(struct job *j)
{
    j->running = pthread_create(&j->thread, NULL, job_read, j) == 0;
    if (!j->running)
        job_read(j);
}

static void job_wait(struct job *j)
{
    if (j->running)
        pthread_join(j->thread, NULL);
    j->running = false;
}

/* Media files read ahead, each on a thread with a decoder of its own, while one is encoded: a
 * decode and resize on one thread takes longer than the GPU's encode of the clip (81 frames of
 * 1280 x 720 to 832 x 480: 1.7 s on one core, bench/bench_media, against 0.57 s for the Wan2.1
 * VAE on an H200), so half the processors, 2 to 8 (GHC_PREPARE_AHEAD overrides). */
#define PREP_MAX_AHEAD 8
static int prep_ahead(void)
{
    const char *e = getenv("GHC_PREPARE_AHEAD");   /* doc/prepare.md; the tests */
    long n = e && *e ? strtol(e, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN) / 2;
    return n < 2 ? 2 : n > PREP_MAX_AHEAD ? PREP_MAX_AHEAD : (int)n;
}

/* The stem of a media file name: the name without its extension. */
static void stem_of(const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "%s", name);
    char *dot = strrchr(buf, '.');
    if (dot && dot != buf)
        *dot = '\0';
}

/* A bad sample: counted and skipped (skip_bad_samples) or the run's error. */
static int bad_sample(struct prep *p, int rc, const char *msg)
{
    if (!p->skip_bad)
        return ghc_error_set(p->core, rc, "%s (data.skip_bad_samples = true skips such files)", msg);
    ghc_log(p->core, GHC_LOG_WARN, "%s: skipped", msg);
    p->st->skipped++;
    return 0;
}

/* Add "name" to the manifest's list (files[*nf]) and write `t` there as bf16 under `key`. */
static int add_file(ghc_core_t *core, const struct job *j, char **files, int *nf, const char *name, const char *key,
                    const ghc_tensor_t *t, const char *const *meta)
{
    char path[8400];
    if (!(files[*nf] = strdup(name)))
        return ghc_error_set(core, GHC_ENOMEM, "prepare: out of memory");
    snprintf(path, sizeof(path), "%s/%s", j->dir, files[(*nf)++]);
    return write_bf16(core, path, key, t, j->hash, meta);
}

/* The suffix of a clip's variant (bit 0 flip_x, bit 1 flip_y) in its file names. */
static const char *const flip_suffix[4] = { "", "_flipx", "_flipy", "_flipxy" };

/* The text cache of a flipped clip, "name": the clip's own (`target`, written before), as a
 * hard link (a copy where the file system has none), so that the dataset pairs each latent
 * with the text file of its own stem as for any gh200core cache. */
static int add_text_link(ghc_core_t *core, const struct job *j, char **files, int *nf, const char *name,
                         const char *target, const ghc_tensor_t *text)
{
    char path[8400], from[8400];
    if (!(files[*nf] = strdup(name)))
        return ghc_error_set(core, GHC_ENOMEM, "prepare: out of memory");
    snprintf(path, sizeof(path), "%s/%s", j->dir, files[(*nf)++]);
    snprintf(from, sizeof(from), "%s/%s", j->dir, target);
    unlink(path);   /* an older one (the manifest is written after: a crash re-encodes) */
    if (link(from, path) == 0)
        return 0;
    return write_bf16(core, path, "text_embed", text, j->hash, NULL);
}

/* musubi-tuner's latent cache of a clip named `name` (musubi's item key: the stem, with
 * "_<start:05d>-<frames:03d>" for a video clip): "<name>_<W:04d>x<H:04d>_wan.safetensors", W x H
 * the media's size before resizing, key "latents_<F>x<H>x<W>_bfloat16" of the latent's sizes;
 * the metadata of its cache_io.py (format 1.0.1), frame_count for a video clip. */
static int add_musubi_latent(ghc_core_t *core, const struct job *j, const struct ghc_media_frames *fr,
                             const struct ghc_media_clip *cl, char **files, int *nf, const char *name,
                             const ghc_tensor_t *lat)
{
    char file[4300], key[128], w[16], h[16], frames[16];
    const int64_t *sh = ghc_tensor_shape(lat);
    snprintf(file, sizeof(file), "%s_%04dx%04d_wan.safetensors", name, fr->src_width, fr->src_height);
    snprintf(key, sizeof(key), "latents_%lldx%lldx%lld_bfloat16", (long long)sh[1], (long long)sh[2], (long long)sh[3]);
    snprintf(w, sizeof(w), "%d", fr->src_width);
    snprintf(h, sizeof(h), "%d", fr->src_height);
    snprintf(frames, sizeof(frames), "%d", cl->frames);
    const char *meta[] = { "architecture", "wan", "width", w, "height", h, "format_version", "1.0.1",
                           j->it->kind == GHC_MEDIA_VIDEO ? "frame_count" : NULL, frames, NULL };
    return add_file(core, j, files, nf, file, key, lat, meta);
}

/* Encode what job j read (after job_wait) and write its caches and manifest. */
static int job_encode(struct prep *p, struct job *j)
{
    ghc_core_t *core = p->core;
    const struct ghc_media_item *it = j->it;
    int rc;
    if (j->rc < 0)
        return j->rc == GHC_EFORMAT ? bad_sample(p, j->rc, j->msg) : ghc_error_set(core, j->rc, "%s", j->msg);
    if (j->current) {
        p->st->up_to_date++;
        return 0;
    }
    const struct ghc_media_frames *fr = &j->fr;
    char stem[4096];
    stem_of(it->name, stem, sizeof(stem));
    const double tl = ghc_progress_now();   /* the encoders load on demand, with the first file encoded */
    ghc_vae_t *vae = ghc_vae_get(core);
    ghc_text_encoder_t *te = vae ? ghc_text_encoder_get(core) : NULL;
    p->load_s += ghc_progress_now() - tl;
    if (!te)
        return ghc_error_code(core) < 0 ? ghc_error_code(core) : GHC_ECONFIG;
    ghc_tensor_t *text = NULL;
    int variants = (1 + j->m->flip_x) * (1 + j->m->flip_y);
    char **files = calloc((size_t)((2 * variants + 1) * fr->n_clips + 2), sizeof(*files));
    uint8_t *mirror = NULL;   /* a clip's frames flipped */
    int nf = 0;
    if (variants > 1) {
        int32_t longest = 0;
        for (int64_t c = 0; c < fr->n_clips; c++)
            longest = fr->clips[c].frames > longest ? fr->clips[c].frames : longest;
        mirror = malloc((size_t)longest * (size_t)fr->height * (size_t)fr->width * 3);
    }
    if (!files || (variants > 1 && !mirror)) {
        free(files);
        free(mirror);
        return ghc_error_set(core, GHC_ENOMEM, "prepare: out of memory");
    }
    struct ghc_vae_info vi = { .struct_size = sizeof(vi) };
    json_t *aug = j->aug_mode != GHC_DATA_AUG_STATIC ? json_array() : NULL;   /* clips encoded when training */
    if (j->aug_mode != GHC_DATA_AUG_STATIC && !aug) {
        rc = ghc_error_set(core, GHC_ENOMEM, "prepare: out of memory");
        goto out;
    }
    if ((rc = ghc_vae_info(vae, &vi)) < 0 || (rc = ghc_text_encoder_encode(te, it->caption, &text)) < 0)
        goto out;
    for (int64_t c = 0; c < fr->n_clips && rc == 0; c++) {
        const struct ghc_media_clip *cl = &fr->clips[c];
        const uint8_t *frames = fr->rgb + (size_t)cl->start * (size_t)fr->height * (size_t)fr->width * 3;
        char name[4200], file[4300], text_file[4300];
        bool base_text = false, aug_text = false;   /* text_file written; aug_file */
        if (it->kind == GHC_MEDIA_VIDEO)
            snprintf(name, sizeof(name), "%s_%05lld-%03d", stem, (long long)cl->start, cl->frames);
        else
            snprintf(name, sizeof(name), "%s", stem);
        snprintf(text_file, sizeof(text_file), "%s.text.safetensors", name);
        /* variant v: bit 0 mirrored left-right, bit 1 upside down (ai-toolkit's list: flip_x
         * copies the files, flip_y then copies them all, the x-flipped ones too) */
        for (int v = 0; v < 4 && rc == 0; v++) {
            if (((v & 1) && !j->m->flip_x) || ((v & 2) && !j->m->flip_y))
                continue;
            if ((v || j->random_crop) && j->aug_mode != GHC_DATA_AUG_STATIC) {
                /* augmented, encoded at training time: its text cache and a manifest entry */
                char aug_file[4300];
                snprintf(aug_file, sizeof(aug_file), "%s" AUG_TEXT, name);
                if (!aug_text)
                    rc = base_text ? add_text_link(core, j, files, &nf, aug_file, text_file, text)
                                   : add_file(core, j, files, &nf, aug_file, "text_embed", text, NULL);
                aug_text = true;
                snprintf(file, sizeof(file), "%s%s", name, flip_suffix[v]);
                json_t *e = json_pack("{s:s, s:s, s:I, s:i, s:i, s:[I, I, I, I]}", "sample", file, "text", aug_file,
                                      "start", (json_int_t)cl->start, "frames", (int)cl->frames, "flip", v,
                                      "shape", (json_int_t)vi.z_dim, (json_int_t)((cl->frames - 1) / vi.t_stride + 1),
                                      (json_int_t)(fr->height / vi.s_stride), (json_int_t)(fr->width / vi.s_stride));
                if (rc == 0 && (!e || json_array_append_new(aug, e) != 0))
                    rc = ghc_error_set(core, GHC_ENOMEM, "prepare: out of memory");
                continue;
            }
            ghc_tensor_t *lat = NULL;
            rc = ghc_data_aug_encode_clip(core, vae, frames, cl->frames, fr->height, fr->width, v, mirror, &lat);
            snprintf(file, sizeof(file), "%s%s.latent.safetensors", name, flip_suffix[v]);
            if (rc == 0)
                rc = add_file(core, j, files, &nf, file, "latent", lat, NULL);
            snprintf(file, sizeof(file), "%s%s.text.safetensors", name, flip_suffix[v]);
            if (rc == 0)
                rc = v ? add_text_link(core, j, files, &nf, file, text_file, text)
                       : add_file(core, j, files, &nf, file, "text_embed", text, NULL);
            base_text |= rc == 0 && !v;
            if (rc == 0 && j->musubi && !v)   /* musubi-tuner has no flips */
                rc = add_musubi_latent(core, j, fr, cl, files, &nf, name, lat);
            ghc_tensor_free(lat);
            p->st->clips++;
        }
    }
    /* musubi-tuner's text cache: one per media file, "<stem>_wan_te.safetensors" */
    if (rc == 0 && j->musubi) {
        char file[4300];
        const char *meta[] = { "architecture", "wan", "caption1", it->caption, "format_version", "1.0.1", NULL };
        snprintf(file, sizeof(file), "%s_wan_te.safetensors", stem);
        rc = add_file(core, j, files, &nf, file, "varlen_t5_bfloat16", text, meta);
    }
    if (rc == 0) {
        remove_stale(core, j->dir, j->mpath, files, nf);
        rc = write_manifest(core, j->mpath, j->hash, files, nf, aug);
        aug = NULL;
    }
    if (rc == 0) {
        p->st->encoded++;
        ghc_log(core, GHC_LOG_DEBUG, "prepare: %s: %lld clip%s at %dx%d", it->path, (long long)fr->n_clips,
                fr->n_clips == 1 ? "" : "s", fr->width, fr->height);
    }
out:
    json_decref(aug);
    ghc_tensor_free(text);
    free(mirror);
    for (int i = 0; i < nf; i++)
        free(files[i]);
    free(files);
    return rc;
}

/* ---- the command ------------------------------------------------------------------------------- */

static const char *const prepare_modes[] = { "auto", "never", "always", NULL };

int ghc_prepare_mode(ghc_core_t *core, int *mode)
{
    ghc_cfg_t *root = ghc_config_root(core), *data = NULL;
    *mode = GHC_PREPARE_AUTO;
    int rc = root ? ghc_cfg_get_group(root, "data", ghc_dataset_keys(false), &data) : 0;
    if (rc < 0 || !data)
        return rc;
    return ghc_cfg_get_choice(data, "prepare", GHC_PREPARE_AUTO, prepare_modes, mode);
}

int ghc_prepare(ghc_core_t *core, bool force, struct ghc_prepare_stats *out)
{
    struct ghc_prepare_stats st = { 0 };
    ghc_cfg_t *root = ghc_config_root(core), *data = NULL;
    int rc, n_sets = 0;
    double t0 = ghc_progress_now();
    if (!root)
        return ghc_error_set(core, GHC_EINVAL, "prepare: no configuration loaded");
    if ((rc = ghc_cfg_get_group(root, "data", ghc_dataset_keys(false), &data)) < 0)
        return rc;
    if (!data || (rc = ghc_cfg_list_len(data, "datasets", &n_sets)) < 0 || n_sets == 0)
        return rc;   /* nothing to prepare (the dataset says what is missing when it opens) */
    struct prep p = { .core = core, .force = force, .st = &st };
    ghc_media_decoder_t *dec[PREP_MAX_AHEAD] = { NULL };
    const int ahead = prep_ahead();
    if ((rc = ghc_cfg_get_bool(data, "skip_bad_samples", false, &p.skip_bad)) < 0 ||
        (rc = ghc_data_seed(core, data, &p.seed)) < 0)
        return rc;
    section_fp(core, "vae", p.enc_fp, sizeof(p.enc_fp));
    section_fp(core, "text_encoder", p.enc_fp, sizeof(p.enc_fp));
    char first_dir[4096] = "";
    for (int i = 0; i < n_sets && rc == 0; i++) {
        ghc_cfg_t *g;
        const char *path;
        char dir[4096], mfp[1024];
        bool musubi = false, crop = false;
        int mode = GHC_DATA_AUG_STATIC;
        struct ghc_media_settings m;
        ghc_media_list_t *list = NULL;
        if ((rc = ghc_cfg_list_group(data, "datasets", i, ghc_dataset_keys(true), &g)) < 0 ||
            (rc = ghc_cfg_get_string(g, "path", NULL, &path)) < 0)
            break;
        if (!path) {
            rc = ghc_error_set(core, GHC_ECONFIG, "%s: %s: missing key 'path'", ghc_cfg_where(g, NULL), ghc_cfg_path(g));
            break;
        }
        if ((rc = ghc_cfg_resolve_path(g, "path", path, dir, sizeof(dir))) < 0 || (rc = ghc_media_settings_read(g, &m)) < 0 ||
            (rc = ghc_cfg_get_bool(g, "musubi_cache", false, &musubi)) < 0 ||
            (rc = ghc_cfg_get_bool(g, "random_crop", false, &crop)) < 0 || (rc = ghc_data_aug_mode(data, g, &mode)) < 0)
            break;
        if ((rc = ghc_media_scan(core, dir, m.caption_extension, &list)) == GHC_ENOTFOUND) {
            ghc_error_clear(core);   /* no folder, no media: the dataset says so when it opens */
            rc = 0;
            continue;
        }
        if (rc < 0)
            break;
        int64_t n = ghc_media_list_len(list);
        if (n > 0) {
            media_fp(&m, mfp, sizeof(mfp));
            /* the files made are part of the settings: turning these on or off re-encodes */
            if (musubi)
                snprintf(mfp + strlen(mfp), sizeof(mfp) - strlen(mfp), "musubi;");
            if (m.flip_x || m.flip_y)
                snprintf(mfp + strlen(mfp), sizeof(mfp) - strlen(mfp), "flip=%d%d;", m.flip_x, m.flip_y);
            if (crop)   /* the seed draws the static crop */
                snprintf(mfp + strlen(mfp), sizeof(mfp) - strlen(mfp), "random_crop:%llu;", (unsigned long long)p.seed);
            if ((crop || m.flip_x || m.flip_y) && mode != GHC_DATA_AUG_STATIC)   /* both make the same files */
                snprintf(mfp + strlen(mfp), sizeof(mfp) - strlen(mfp), "aug=when-training;");
            if (!first_dir[0])
                snprintf(first_dir, sizeof(first_dir), "%s", dir);
            for (int k = 0; k < ahead && rc == 0; k++)
                if (!dec[k] && !(dec[k] = ghc_media_decoder_init(0)))
                    rc = ghc_error_set(core, GHC_ENOMEM, "prepare: out of memory");
            ghc_log(core, GHC_LOG_INFO, "prepare: %s: %lld media file%s", dir, (long long)n, n == 1 ? "" : "s");
        }
        /* files k + 1 .. k + ahead - 1 are read (hashed, decoded) on threads while file k is
         * encoded; file k's slot then reads file k + ahead */
        struct job jobs[PREP_MAX_AHEAD];
        for (int k = 0; k < ahead; k++) {
            jobs[k] = (struct job){ .p = &p, .dir = dir, .mfp = mfp, .musubi = musubi, .m = &m, .dec = dec[k],
                                    .random_crop = crop, .aug_mode = mode };
            if (k < n && rc == 0) {
                jobs[k].it = ghc_media_list_at(list, k);
                job_start(&jobs[k]);
            }
        }
        for (int64_t k = 0; k < n && rc == 0; k++) {
            struct job *cur = &jobs[k % ahead];
            double tk = ghc_progress_now();
            int64_t before = st.encoded;
            job_wait(cur);
            const double tw = ghc_progress_now(), load0 = p.load_s;
            rc = job_encode(&p, cur);   /* adds the encoders' loading to p.load_s */
            const double te = ghc_progress_now();
            const char *name = cur->it->name;
            if (rc == 0 && k + ahead < n) {
                cur->it = ghc_media_list_at(list, k + ahead);
                job_start(cur);
            }
            st.files++;
            if (rc == 0 && st.encoded > before) {
                double per = (ghc_progress_now() - t0) / (double)st.files;
                p.wait_s += tw - tk;
                p.encode_s += te - tw - (p.load_s - load0);
                ghc_log(core, GHC_LOG_INFO, "prepare: [%lld/%lld] %s: encoded in %.2f s; ETA %.0f s", (long long)(k + 1),
                        (long long)n, name, te - tk, per * (double)(n - k - 1));
            } else {
                p.load_s = load0;   /* only the files encoded count */
            }
        }
        for (int k = 0; k < ahead; k++)
            job_wait(&jobs[k]);   /* a failure leaves the files read ahead to finish */
        ghc_media_list_free(list);
    }
    /* the empty prompt, for text dropout: beside the first media dataset, a hidden file */
    if (rc == 0 && first_dir[0]) {
        char path[8400], hash[24];
        uint64_t h = fnv_str(GHC_FNV1A_BASIS, p.enc_fp);
        snprintf(hash, sizeof(hash), "%016llx", (unsigned long long)h);
        snprintf(path, sizeof(path), "%s/.gh200core-empty-prompt.safetensors", first_dir);
        ghc_st_t *old = access(path, F_OK) == 0 ? ghc_st_open(core, path) : NULL;
        bool same = old && ghc_st_metadata(old, "gh200core.prepare") &&
                    !strcmp(ghc_st_metadata(old, "gh200core.prepare"), hash);
        ghc_st_free(old);
        ghc_error_clear(core);
        if (!same || force) {
            ghc_text_encoder_t *te = ghc_text_encoder_get(core);
            ghc_tensor_t *e = NULL;
            rc = !te ? (ghc_error_code(core) < 0 ? ghc_error_code(core) : GHC_ECONFIG) : ghc_text_encoder_encode(te, "", &e);
            if (rc == 0)
                rc = write_bf16(core, path, "text_embed", e, hash, NULL);
            ghc_tensor_free(e);
        }
        if (rc == 0 && !ghc_cfg_has(data, "empty_prompt"))
            rc = ghc_cfg_set_string(data, "empty_prompt", path);
    }
    for (int k = 0; k < PREP_MAX_AHEAD; k++)
        ghc_media_decoder_free(dec[k]);
    st.seconds = ghc_progress_now() - t0;
    if (rc == 0 && st.files)
        ghc_log(core, GHC_LOG_INFO, "prepare: %lld media files: %lld encoded (%lld clips), %lld up to date, %lld "
                "skipped as bad, in %.1f s (encoding %.1f s, waiting for decoding %.1f s, loading the encoders %.1f s)",
                (long long)st.files, (long long)st.encoded, (long long)st.clips, (long long)st.up_to_date,
                (long long)st.skipped, st.seconds, p.encode_s, p.wait_s, p.load_s);
    if (out)
        *out = st;
    return rc;
}
