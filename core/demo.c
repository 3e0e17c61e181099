/* demo.c: the embedded demo's dataset, made before training when the configuration has a
 * `demo` section. Two kinds:
 *
 * Media (demo.videos + demo.images > 0, in a build with FFmpeg): a folder of small generated
 * videos and images of coloured shapes, each with a caption saying what it shows, written with
 * media.h's writer (FFV1 in .mkv, PNG) at data.datasets[0]'s resolution and longest
 * target_frames; data.datasets[0].path is pointed at it and `prepare` encodes it with the run's
 * `vae` and `text_encoder` (doc/prepare.md), so the run trains plain flow matching on the
 * caches, as it would on a user's folder. Written afresh by each run with the same bytes, so
 * that a second run's prepare finds every file up to date.
 *
 * Latent (otherwise; a build without FFmpeg says why in one line): a teacher = the run's model
 * plus a planted low-rank adapter (random A [r, in], B [out, r] on every target:
 * y += (x A^T) B^T) gives each sample a velocity v = teacher(x_sigma, t) at a random noisy
 * latent x_sigma and sigma; the sample stores
 *   latent x0 = x_sigma - sigma v,  noise = x_sigma + (1 - sigma) v,  timestep t = 1000 sigma
 * so that the trainer's flow-matching target noise - x0 at that (x_sigma, t) is exactly the
 * teacher's output. Training a fresh adapter of rank >= r recovers the planted one and the
 * loss falls towards zero. Files go to <output_dir>/demo-data in the dataset format
 * (doc/dataset.md), and the `data` section is pointed at that folder. */
#include <config.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <gh200core/dataset.h>
#include <gh200core/gh200core.h>
#include <gh200core/media.h>
#include <gh200core/ops.h>
#include <gh200core/safetensors.h>
#include <gh200core/tensor.h>
#include <gh200core/train.h>

#include "train_impl.h"

const struct ghc_cfg_key ghc_demo_keys[] = {
    { "samples",   GHC_CFG_INT,   "16",   "1 to 100000", NULL },
    { "channels",  GHC_CFG_INT,   "16",   "1 to 4096",   NULL },
    { "frames",    GHC_CFG_INT,   "1",    "1 to 4096",   NULL },
    { "height",    GHC_CFG_INT,   "8",    "1 to 4096",   NULL },
    { "width",     GHC_CFG_INT,   "8",    "1 to 4096",   NULL },
    { "text_len",  GHC_CFG_INT,   "8",    "1 to 512",    NULL },
    { "text_dim",  GHC_CFG_INT,   "4096", "1 to 2^20",   NULL },   /* the model's text_dim */
    { "rank",      GHC_CFG_INT,   "2",    "1 to 4096",   NULL },   /* of the planted adapter */
    { "strength",  GHC_CFG_FLOAT, "0.5",  "0 to 1e38",   NULL },   /* std of the planted B's entries x sqrt(rank) */
    { "sigma_min", GHC_CFG_FLOAT, "0.05", "1e-6 to 1",   NULL },
    { "sigma_max", GHC_CFG_FLOAT, "0.95", "1e-6 to 1",   NULL },
    { "videos",    GHC_CFG_INT,   "0",    "0 to 10000",  NULL },   /* generated media: the media demo */
    { "images",    GHC_CFG_INT,   "0",    "0 to 10000",  NULL },
    { NULL, 0, NULL, NULL, NULL }
};

struct planted {
    ghc_core_t   *core;
    int32_t       n;
    ghc_tensor_t **a, **b;            /* per target: A [r, in], B [out, r], f32 */
    int64_t       rank;
};

/* The planted adapter is on every target, its part added after the model's GEMM. */
static int planted_plan(void *user, int32_t target, struct ghc_adapter_plan *out)
{
    (void)target;
    out->adapted = ((struct planted *)user)->n > 0;
    return 1;
}

static int planted_fwd(void *user, int32_t target, const ghc_tensor_t *x, ghc_tensor_t *y, bool write, void *stream)
{
    struct planted *p = user;
    (void)write;   /* never asked to write: the plan does not offer it */
    ghc_core_t *core = p->core;
    if (target < 0 || target >= p->n)
        return ghc_error_set(core, GHC_EINTERNAL, "demo: target %d out of range", target);
    int rc = 0;
    const int64_t *xs = ghc_tensor_shape(x);
    int64_t hs[3] = { xs[0], xs[1], p->rank };
    ghc_tensor_t *xf = NULL, *h = ghc_tensor_init(core, GHC_DTYPE_F32, 3, hs, ghc_tensor_device(x), GHC_ROLE_WORKSPACE);
    const ghc_tensor_t *xin = x;
    if (!h)
        return ghc_error_code(core);
    if (ghc_tensor_dtype(x) != GHC_DTYPE_F32) {
        if (!(xf = ghc_tensor_init(core, GHC_DTYPE_F32, 3, xs, ghc_tensor_device(x), GHC_ROLE_WORKSPACE)))
            rc = ghc_error_code(core);
        else
            rc = ghc_op_cast(xf, x, 1.0f, NULL, stream);
        xin = xf;
    }
    struct ghc_gemm g1 = { .trans_b = true };
    struct ghc_gemm g2 = { .trans_b = true, .beta = 1.0f };
    if (rc == 0 && (rc = ghc_op_gemm(h, xin, p->a[target], &g1, stream)) == 0)
        rc = ghc_op_gemm(y, h, p->b[target], &g2, stream);
    ghc_tensor_free(xf);
    ghc_tensor_free(h);
    return rc < 0 ? rc : 1;
}

/* The demo's forwards keep nothing: no backward runs through the planted adapter. */
static int planted_bwd(void *user, int32_t target, const ghc_tensor_t *x, const ghc_tensor_t *dy,
                       const ghc_tensor_t *g, ghc_tensor_t *dx, bool accumulate, void *stream)
{
    (void)x, (void)dy, (void)g, (void)dx, (void)accumulate, (void)stream;
    return ghc_error_set(((struct planted *)user)->core, GHC_EINTERNAL, "demo: a backward through the planted "
                         "adapter (target %d)", (int)target);
}

static void planted_free(struct planted *p)
{
    for (int32_t i = 0; i < p->n; i++) {
        if (p->a)
            ghc_tensor_free(p->a[i]);
        if (p->b)
            ghc_tensor_free(p->b[i]);
    }
    free(p->a);
    free(p->b);
}

static int fill_normal(ghc_tensor_t *t, struct ghc_rng *rng, float scale)
{
    int rc = ghc_op_rand_normal(t, rng, NULL);
    rng->offset += (uint64_t)(ghc_tensor_numel(t) + 3) / 4;
    if (rc == 0 && scale != 1.0f)
        rc = ghc_op_scale(t, t, scale, NULL);
    return rc;
}

static int plant(ghc_core_t *core, ghc_model_t *model, int device, int64_t rank, double strength,
                 struct ghc_rng *rng, struct planted *p)
{
    const struct ghc_model_target *targets;
    int32_t n;
    int rc = ghc_model_targets(model, &targets, &n);
    if (rc < 0)
        return rc;
    p->core = core;
    p->rank = rank;
    p->n = n;
    if (!(p->a = calloc((size_t)n, sizeof(*p->a))) || !(p->b = calloc((size_t)n, sizeof(*p->b))))
        return ghc_error_set(core, GHC_ENOMEM, "demo: out of memory");
    for (int32_t i = 0; i < n && rc == 0; i++) {
        int64_t as[2] = { rank, targets[i].in_features }, bs[2] = { targets[i].out_features, rank };
        if (!(p->a[i] = ghc_tensor_init(core, GHC_DTYPE_F32, 2, as, device, GHC_ROLE_WORKSPACE)) ||
            !(p->b[i] = ghc_tensor_init(core, GHC_DTYPE_F32, 2, bs, device, GHC_ROLE_WORKSPACE)))
            return ghc_error_code(core);
        /* x A^T keeps unit scale for unit inputs; B's entries carry the strength */
        if ((rc = fill_normal(p->a[i], rng, (float)(1.0 / sqrt((double)targets[i].in_features)))) == 0)
            rc = fill_normal(p->b[i], rng, (float)(strength / sqrt((double)rank)));
    }
    return rc;
}

/* Sample i's two files (CPU tensors): latent, noise and timestep; the text embedding. */
static int save_sample(ghc_core_t *core, const char *dir, int64_t i, ghc_tensor_t *x0, ghc_tensor_t *noise,
                       float t, ghc_tensor_t *text)
{
    char path[8400];
    int rc;
    int64_t one = 1;
    ghc_tensor_t *ts = ghc_tensor_wrap(core, GHC_DTYPE_F32, 1, &one, GHC_DEVICE_CPU, &t);
    ghc_st_writer_t *w = ghc_st_writer_init(core);
    if (!ts || !w) {
        rc = GHC_ENOMEM;
        goto out;
    }
    snprintf(path, sizeof(path), "%s/sample%04lld.latent.safetensors", dir, (long long)i);
    if ((rc = ghc_st_writer_add(w, "latent", x0)) < 0 || (rc = ghc_st_writer_add(w, "noise", noise)) < 0 ||
        (rc = ghc_st_writer_add(w, "timestep", ts)) < 0 ||
        (rc = ghc_st_writer_metadata(w, "made_by", "gh200core demo (planted adapter)")) < 0 ||
        (rc = ghc_st_writer_finish(w, path)) < 0)
        goto out;
    ghc_st_writer_free(w);
    if (!(w = ghc_st_writer_init(core))) {
        rc = GHC_ENOMEM;
        goto out;
    }
    snprintf(path, sizeof(path), "%s/sample%04lld.text.safetensors", dir, (long long)i);
    if ((rc = ghc_st_writer_add(w, "text_embed", text)) == 0)
        rc = ghc_st_writer_finish(w, path);
out:
    ghc_st_writer_free(w);
    ghc_tensor_free(ts);
    return rc;
}

/* Points data.datasets at `dir` (one dataset), creating the `data` section when absent. */
static int point_data_at(ghc_core_t *core, const char *dir)
{
    ghc_cfg_t *data, *set;
    int rc;
    if ((rc = ghc_cfg_set_group(ghc_config_root(core), "data", &data)) < 0 ||
        (rc = ghc_cfg_set_group_list(data, "datasets", 1, &set)) < 0)
        return rc;
    return ghc_cfg_set_string(set, "path", dir);
}

/* <output_dir>/demo-data, created (with output_dir) when `make`, as an absolute path in abs
 * (8192 bytes). */
static int demo_dir(ghc_core_t *core, bool make, char *abs)
{
    char dir[8192];
    snprintf(dir, sizeof(dir), "%s/demo-data", ghc_config_output_dir(core));
    if (make && mkdir(ghc_config_output_dir(core), 0777) != 0 && errno != EEXIST)
        return ghc_error_set(core, GHC_EIO, "%s: cannot create: %s", ghc_config_output_dir(core), strerror(errno));
    if (make && mkdir(dir, 0777) != 0 && errno != EEXIST)
        return ghc_error_set(core, GHC_EIO, "%s: cannot create: %s", dir, strerror(errno));
    if (!realpath(dir, abs))
        return ghc_error_set(core, GHC_EIO, "%s: %s%s", dir, strerror(errno), make ? "" : " (rank 0 writes the demo's "
                             "data there)");
    return 0;
}

/* ---- the media demo ------------------------------------------------------------------------ */

bool ghc_demo_media(const struct ghc_demo_opts *o)
{
#ifdef GHC_HAVE_FFMPEG
    return o->videos + o->images > 0;
#else
    (void)o;
    return false;
#endif
}

/* data.datasets[0], whose resolution and target_frames size the media: its section and
 * settings. Returns 0 or GHC_ECONFIG (no such dataset). */
static int media_dataset(ghc_core_t *core, ghc_cfg_t **set, struct ghc_media_settings *m)
{
    ghc_cfg_t *data = NULL;
    int n = 0, rc = ghc_cfg_get_group(ghc_config_root(core), "data", ghc_dataset_keys(false), &data);
    if (rc == 0 && data)
        rc = ghc_cfg_list_len(data, "datasets", &n);
    if (rc < 0)
        return rc;
    if (n < 1)
        return ghc_error_set(core, GHC_ECONFIG, "%s: demo.videos and demo.images need data.datasets = ( { resolution = "
                             "[W, H]; target_frames = [F]; } ): the media's size (its path is the demo's folder)",
                             ghc_cfg_where(data ? data : ghc_config_root(core), NULL));
    if ((rc = ghc_cfg_list_group(data, "datasets", 0, ghc_dataset_keys(true), set)) < 0)
        return rc;
    return ghc_media_settings_read(*set, m);
}

int ghc_demo_media_check(ghc_core_t *core)
{
    ghc_cfg_t *set;
    struct ghc_media_settings m;
    return media_dataset(core, &set, &m);
}

/* What the generated media show: a shape of one colour on a background of another. */
struct paint {
    const char *name;
    uint8_t     rgb[3];
};
static const struct paint shape_colours[] = {
    { "red", { 220, 40, 40 } }, { "green", { 40, 200, 70 } }, { "blue", { 50, 90, 235 } }, { "yellow", { 240, 215, 40 } },
};
static const struct paint backgrounds[] = {
    { "black", { 12, 12, 12 } }, { "grey", { 128, 128, 128 } }, { "white", { 245, 245, 245 } },
};
static const char *const shape_names[] = { "ball", "square" };
static const char *const motions[] = { "from left to right", "from top to bottom", "from right to left",
                                       "from bottom to top" };

/* One w x h RGB picture: shape `shape` of colour `fg` centred at (cx, cy), half-size r, on bg. */
static void paint_frame(uint8_t *rgb, int w, int h, int shape, const uint8_t *fg, const uint8_t *bg, double cx,
                        double cy, double r)
{
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            double dx = x + 0.5 - cx, dy = y + 0.5 - cy;
            bool in = shape == 0 ? dx * dx + dy * dy <= r * r : fabs(dx) <= r && fabs(dy) <= r;
            memcpy(rgb + ((size_t)y * (size_t)w + (size_t)x) * 3, in ? fg : bg, 3);
        }
}

static int write_caption(ghc_core_t *core, const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    bool ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f) != 0)
        ok = false;
    return ok ? 0 : ghc_error_set(core, GHC_EIO, "%s: cannot write: %s", path, strerror(errno));
}

/* Video v (frames n) or image v (n = 0) with its caption, into dir: picture p's shape, colour,
 * background and motion (p = v for a video, v + 1 for an image). */
static int write_medium(ghc_core_t *core, const char *dir, int64_t v, int w, int h, int n, uint8_t *rgb)
{
    int64_t p = n ? v : v + 1;
    int shape = (int)((p / 2 + p / 4) % 2), motion = (int)(p % 4);
    const struct paint *fg = &shape_colours[p % 4], *bg = &backgrounds[p % 3];
    double r = (w < h ? w : h) / 4.0;
    char path[8400], caption[256];
    for (int k = 0; k < (n ? n : 1); k++) {
        double t = n > 1 ? (double)k / (n - 1) : 0.5, cx = w / 2.0, cy = h / 2.0;
        if (motion % 2 == 0)
            cx = r + (motion == 0 ? t : 1 - t) * (w - 2 * r);
        else
            cy = r + (motion == 1 ? t : 1 - t) * (h - 2 * r);
        paint_frame(rgb + (size_t)k * (size_t)w * (size_t)h * 3, w, h, shape, fg->rgb, bg->rgb, cx, cy, r);
    }
    int rc;
    if (n) {
        snprintf(caption, sizeof(caption), "a %s %s moves %s on a %s background", fg->name, shape_names[shape],
                 motions[motion], bg->name);
        snprintf(path, sizeof(path), "%s/video_%03lld.mkv", dir, (long long)v);
        rc = ghc_media_write_video(core, path, rgb, n, w, h, 16, NULL);
    } else {
        snprintf(caption, sizeof(caption), "a %s %s in the middle of a %s background", fg->name, shape_names[shape],
                 bg->name);
        snprintf(path, sizeof(path), "%s/image_%03lld.png", dir, (long long)v);
        rc = ghc_media_write_image(core, path, rgb, w, h, 3);
    }
    if (rc == 0) {
        snprintf(strrchr(path, '.'), 5, ".txt");
        rc = write_caption(core, path, caption);
    }
    return rc;
}

/* The media demo (rank 0): its media written, data.datasets[0] pointed at them, prepared. */
static int media_generate(ghc_core_t *core, const struct ghc_demo_opts *o)
{
    ghc_cfg_t *set;
    struct ghc_media_settings m;
    char abs[8192];
    int rc = media_dataset(core, &set, &m), mode = GHC_PREPARE_AUTO;
    if (rc < 0 || (rc = demo_dir(core, true, abs)) < 0)
        return rc;
    int w = m.width, h = m.height, n = 1;
    for (int i = 0; i < m.n_target_frames; i++)
        n = m.target_frames[i] > n ? m.target_frames[i] : n;
    uint8_t *rgb = malloc((size_t)w * (size_t)h * 3 * (size_t)n);
    if (!rgb)
        return ghc_error_set(core, GHC_ENOMEM, "demo: out of memory for %d frames of %d x %d", n, w, h);
    ghc_log(core, GHC_LOG_INFO, "demo: writing %lld videos of %d frames and %lld images, %d x %d, with captions to %s",
            (long long)o->videos, n, (long long)o->images, w, h, abs);
    for (int64_t v = 0; v < o->videos && rc == 0; v++)
        rc = write_medium(core, abs, v, w, h, n, rgb);
    for (int64_t v = 0; v < o->images && rc == 0; v++)
        rc = write_medium(core, abs, v, w, h, 0, rgb);
    free(rgb);
    if (rc == 0)
        rc = ghc_cfg_set_string(set, "path", abs);
    if (rc == 0)
        rc = ghc_prepare_mode(core, &mode);
    if (rc == 0 && mode != GHC_PREPARE_NEVER)
        rc = ghc_prepare(core, mode == GHC_PREPARE_ALWAYS, NULL);
    return rc;
}

/* ---- both ---------------------------------------------------------------------------------- */

int ghc_demo_read(ghc_cfg_t *s, struct ghc_demo_opts *o)
{
    static const char *const shape_keys[GHC_DEMO_SHAPES] = { "channels", "frames", "height", "width", "text_len",
                                                             "text_dim" };
    static const int64_t defs[GHC_DEMO_SHAPES] = { 16, 1, 8, 8, 8, 4096 },
                         maxs[GHC_DEMO_SHAPES] = { 4096, 4096, 4096, 4096, 512, 1 << 20 };
    int rc;
    memset(o, 0, sizeof(*o));
    for (int i = 0; i < GHC_DEMO_SHAPES; i++) {
        o->shape_key[i] = shape_keys[i];
        o->given[i] = ghc_cfg_has(s, shape_keys[i]);
        if ((rc = ghc_cfg_get_int(s, shape_keys[i], defs[i], 1, maxs[i], &o->shape[i])) < 0)
            return rc;
    }
    if ((rc = ghc_cfg_get_int(s, "samples", 16, 1, 100000, &o->samples)) < 0 ||
        (rc = ghc_cfg_get_int(s, "rank", 2, 1, 4096, &o->rank)) < 0 ||
        (rc = ghc_cfg_get_float(s, "strength", 0.5, 0.0, 1e38, &o->strength)) < 0 ||
        (rc = ghc_cfg_get_float(s, "sigma_min", 0.05, 1e-6, 1.0, &o->sigma_min)) < 0 ||
        (rc = ghc_cfg_get_float(s, "sigma_max", 0.95, 1e-6, 1.0, &o->sigma_max)) < 0 ||
        (rc = ghc_cfg_get_int(s, "videos", 0, 0, 10000, &o->videos)) < 0 ||
        (rc = ghc_cfg_get_int(s, "images", 0, 0, 10000, &o->images)) < 0)
        return rc;
    if (o->sigma_min > o->sigma_max)
        return ghc_error_set(ghc_cfg_core(s), GHC_ECONFIG, "%s: sigma_min > sigma_max", ghc_cfg_where(s, "sigma_min"));
    return 0;
}

int ghc_demo_point(ghc_core_t *core)
{
    char abs[8192];
    ghc_cfg_t *s, *set;
    struct ghc_demo_opts opt;
    struct ghc_media_settings m;
    int rc = ghc_cfg_get_group(ghc_config_root(core), "demo", ghc_demo_keys, &s);
    if (rc < 0 || !s || (rc = ghc_demo_read(s, &opt)) < 0 || (rc = demo_dir(core, false, abs)) < 0)
        return rc;
    if (!ghc_demo_media(&opt))
        return point_data_at(core, abs);
    /* rank 0 prepared the media: this prepare finds them up to date and sets data.empty_prompt */
    if ((rc = media_dataset(core, &set, &m)) < 0 || (rc = ghc_cfg_set_string(set, "path", abs)) < 0)
        return rc;
    return ghc_prepare(core, false, NULL);
}

int ghc_demo_generate(ghc_core_t *core)
{
    ghc_cfg_t *s;
    struct ghc_demo_opts opt;
    int rc = ghc_cfg_get_group(ghc_config_root(core), "demo", ghc_demo_keys, &s);
    if (rc < 0 || !s)
        return rc;
    if ((rc = ghc_demo_read(s, &opt)) < 0)
        return rc;
    if (ghc_demo_media(&opt))
        return media_generate(core, &opt);
    if (opt.videos + opt.images > 0)
        ghc_log(core, GHC_LOG_INFO, "demo: this gh200core was built without FFmpeg (configure --without-ffmpeg), "
                "which writes and decodes media: the latent-only demo instead (doc/training.md)");
    int64_t samples = opt.samples, c = opt.shape[0], f = opt.shape[1], h = opt.shape[2], w = opt.shape[3],
            l = opt.shape[4], d = opt.shape[5], rank = opt.rank;
    double strength = opt.strength, smin = opt.sigma_min, smax = opt.sigma_max;
    ghc_model_t *model = ghc_model_get(core);
    if (!model)
        return ghc_error_set(core, GHC_ECONFIG, "demo: the configuration needs a `model` section");
    int64_t seed = 42;
    if ((rc = ghc_cfg_get_int(ghc_config_root(core), "seed", 42, 0, INT64_MAX, &seed)) < 0)
        return rc;

    char abs[8192];
    if ((rc = demo_dir(core, true, abs)) < 0)
        return rc;

    int device = ghc_model_device(model);
    struct ghc_rng rng = { .seed = (uint64_t)seed ^ 0xa4093822299f31d0ull, .offset = 0 };
    struct planted p = { 0 };
    int64_t ls[5] = { 1, c, f, h, w }, ts[3] = { 1, l, d }, ms[2] = { 1, l };
    ghc_tensor_t *xs = NULL, *text = NULL, *mask = NULL, *v = NULL, *x0 = NULL, *noise = NULL, *tt = NULL;
    ghc_tensor_t *x0h = NULL, *nh = NULL, *th = NULL;
    float tval;
    int64_t one = 1;
    if ((rc = plant(core, model, device, rank, strength, &rng, &p)) < 0)
        goto out;
    if (!(xs = ghc_tensor_init(core, GHC_DTYPE_F32, 5, ls, device, GHC_ROLE_ACTIVATIONS)) ||
        !(v = ghc_tensor_init(core, GHC_DTYPE_F32, 5, ls, device, GHC_ROLE_ACTIVATIONS)) ||
        !(x0 = ghc_tensor_init(core, GHC_DTYPE_F32, 5, ls, device, GHC_ROLE_ACTIVATIONS)) ||
        !(noise = ghc_tensor_init(core, GHC_DTYPE_F32, 5, ls, device, GHC_ROLE_ACTIVATIONS)) ||
        !(text = ghc_tensor_init(core, GHC_DTYPE_F32, 3, ts, device, GHC_ROLE_TEXT_EMBEDS)) ||
        !(mask = ghc_tensor_init(core, GHC_DTYPE_F32, 2, ms, device, GHC_ROLE_MASKS)) ||
        !(x0h = ghc_tensor_init(core, GHC_DTYPE_F32, 4, ls + 1, GHC_DEVICE_CPU, GHC_ROLE_LATENTS)) ||
        !(nh = ghc_tensor_init(core, GHC_DTYPE_F32, 4, ls + 1, GHC_DEVICE_CPU, GHC_ROLE_LATENTS)) ||
        !(th = ghc_tensor_init(core, GHC_DTYPE_F32, 2, ts + 1, GHC_DEVICE_CPU, GHC_ROLE_TEXT_EMBEDS)) ||
        !(tt = ghc_tensor_wrap(core, GHC_DTYPE_F32, 1, &one, GHC_DEVICE_CPU, &tval))) {
        rc = ghc_error_code(core) ? ghc_error_code(core) : GHC_ENOMEM;
        goto out;
    }
    if ((rc = ghc_op_fill(mask, 1.0, NULL)) < 0)
        goto out;
    struct ghc_adapter_hook hook = { .struct_size = sizeof(hook), .user = &p, .plan = planted_plan,
                                     .forward = planted_fwd, .backward = planted_bwd };
    if ((rc = ghc_model_set_hook(model, &hook)) < 0)
        goto out;
    ghc_log(core, GHC_LOG_INFO, "demo: writing %lld samples [%lld, %lld, %lld, %lld] with a planted rank-%lld adapter to %s",
            (long long)samples, (long long)c, (long long)f, (long long)h, (long long)w, (long long)rank, abs);
    for (int64_t i = 0; i < samples && rc == 0; i++) {
        double u[1];
        uint32_t ctr[4] = { (uint32_t)i, 0, 0, 1 }, key[2] = { (uint32_t)seed, (uint32_t)((uint64_t)seed >> 32) }, o[4];
        ghc_philox4x32(ctr, key, o);
        u[0] = ((double)(o[0] >> 8) + 0.5) * 0x1p-24;
        double sigma = smin + (smax - smin) * u[0];
        tval = (float)(1000.0 * sigma);
        sigma = (double)tval / 1000.0;   /* the sigma the trainer will read back from t */
        if ((rc = fill_normal(xs, &rng, 1.0f)) < 0 || (rc = fill_normal(text, &rng, 1.0f)) < 0)
            break;
        struct ghc_model_batch b = { .noisy = xs, .timesteps = tt, .text_embed = text, .text_mask = mask };
        if ((rc = ghc_model_forward(model, 0, &b, v, false, NULL)) < 0 ||
            (rc = ghc_op_add(x0, xs, v, 1.0f, (float)-sigma, NULL)) < 0 ||
            (rc = ghc_op_add(noise, xs, v, 1.0f, (float)(1.0 - sigma), NULL)) < 0)
            break;
        ghc_tensor_t *src[3] = { x0, noise, text }, *dst[3] = { x0h, nh, th };
        for (int k = 0; k < 3 && rc == 0; k++) {
            ghc_tensor_t *flat = ghc_tensor_wrap(core, GHC_DTYPE_F32, ghc_tensor_ndim(dst[k]), ghc_tensor_shape(dst[k]),
                                                 device, ghc_tensor_data(src[k]));
            rc = flat ? ghc_op_copy(dst[k], flat, NULL) : GHC_ENOMEM;
            ghc_tensor_free(flat);
        }
        if (rc == 0 && (rc = ghc_op_sync(core, device, NULL)) == 0)
            rc = save_sample(core, abs, i, x0h, nh, tval, th);
    }
    /* removing the hook clears the error message: keep it */
    char msg[1024];
    snprintf(msg, sizeof(msg), "%s", ghc_error_message(core));
    int rc2 = ghc_model_set_hook(model, NULL);
    if (rc < 0)
        ghc_error_set(core, rc, "%s", msg);
    else
        rc = rc2;
    if (rc == 0)
        rc = point_data_at(core, abs);
out:
    planted_free(&p);
    ghc_tensor_free(xs);
    ghc_tensor_free(v);
    ghc_tensor_free(x0);
    ghc_tensor_free(noise);
    ghc_tensor_free(text);
    ghc_tensor_free(mask);
    ghc_tensor_free(x0h);
    ghc_tensor_free(nh);
    ghc_tensor_free(th);
    ghc_tensor_free(tt);
    return rc;
}
