/* load.c: the Wan VAEs' weights: which file it is (Wan2.1 or Wan2.2 VAE; official/ComfyUI or
 * diffusers names, an optional common prefix; a .pth refused with a pointer to what to use), the
 * configuration read from the shapes, and every tensor checked against the shape the layout
 * needs (spec encoders.md 2.5, 2.6, 2.9, 3.4, 3.5, 3.7), converted to f32 and placed on the
 * VAE's device. */
#include <config.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/safetensors.h>

#include "wanvae_impl.h"

/* The latent normalisation constants of the Wan2.1 VAE (spec encoders.md 2.8) and of the Wan2.2
 * VAE (3.6). */
static const float LATENT_MEAN[16] = { -0.7571f, -0.7089f, -0.9113f, 0.1075f, -0.1745f, 0.9653f, -0.1517f, 1.5508f,
                                       0.4134f, -0.0715f, 0.5517f, -0.3632f, -0.1922f, -0.9497f, 0.2503f, -0.2921f };
static const float LATENT_STD[16] = { 2.8184f, 1.4541f, 2.3275f, 2.6558f, 1.2196f, 1.7708f, 2.6052f, 2.0743f,
                                      3.2687f, 2.1526f, 2.8652f, 1.5579f, 1.6382f, 1.1253f, 2.8251f, 1.9160f };
static const float LATENT_MEAN48[48] = {
    -0.2289f, -0.0052f, -0.1323f, -0.2339f, -0.2799f, 0.0174f, 0.1838f, 0.1557f, -0.1382f, 0.0542f, 0.2813f, 0.0891f,
    0.1570f, -0.0098f, 0.0375f, -0.1825f, -0.2246f, -0.1207f, -0.0698f, 0.5109f, 0.2665f, -0.2108f, -0.2158f, 0.2502f,
    -0.2055f, -0.0322f, 0.1109f, 0.1567f, -0.0729f, 0.0899f, -0.2799f, -0.1230f, -0.0313f, -0.1649f, 0.0117f, 0.0723f,
    -0.2839f, -0.2083f, -0.0520f, 0.3748f, 0.0152f, 0.1957f, 0.1433f, -0.2944f, 0.3573f, -0.0548f, -0.1681f, -0.0667f };
static const float LATENT_STD48[48] = {
    0.4765f, 1.0364f, 0.4514f, 1.1677f, 0.5313f, 0.4990f, 0.4818f, 0.5013f, 0.8158f, 1.0344f, 0.5894f, 1.0901f,
    0.6885f, 0.6165f, 0.8454f, 0.4978f, 0.5759f, 0.3523f, 0.7135f, 0.6804f, 0.5833f, 1.4146f, 0.8986f, 0.5659f,
    0.7069f, 0.5338f, 0.4889f, 0.4917f, 0.4069f, 0.4999f, 0.6866f, 0.4093f, 0.5709f, 0.6065f, 0.6415f, 0.4944f,
    0.5726f, 1.2042f, 0.5458f, 1.6887f, 0.3971f, 1.0600f, 0.3943f, 0.5537f, 0.5444f, 0.4089f, 0.7468f, 0.7744f };

/* A name every Wan VAE file has, per naming (ComfyUI detects the official one by it). */
#define KEY_OFFICIAL "decoder.middle.0.residual.0.gamma"
#define KEY_DIFFUSERS "decoder.mid_block.resnets.0.norm1.gamma"
/* ... and a name only the Wan2.2 VAE has (its nested stages), per naming */
#define KEY22_OFFICIAL "decoder.upsamples.0.upsamples.0.residual.2.weight"
#define KEY22_DIFFUSERS "encoder.down_blocks.0.resnets.0.conv1.weight"

struct loader {
    ghc_wanvae_t *vae;
    ghc_st_t     *st;
    const char   *path;
    bool          synth;   /* the weights drawn (ghc_wanvae_opts.random), not read */
    uint64_t      seed;
};

/* A drawn weight for official tensor `name` of `shape` (the layout's): norms' gamma 1, biases 0,
 * the rest normal with variance 1 / fan-in, seeded by the seed and the name. */
static ghc_tensor_t *synth(struct loader *L, const char *name, int ndim, const int64_t *shape)
{
    ghc_wanvae_t *vae = L->vae;
    ghc_tensor_t *t = ghc_tensor_init(vae->core, GHC_DTYPE_F32, ndim, shape, vae->device, GHC_ROLE_ENCODER_WEIGHTS);
    if (!t)
        return NULL;
    size_t n = strlen(name);
    bool gamma = n >= 5 && !strcmp(name + n - 5, "gamma"), bias = n >= 4 && !strcmp(name + n - 4, "bias");
    uint64_t h = L->seed ^ UINT64_C(1469598103934665603);
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)name[i]) * UINT64_C(1099511628211);
    struct ghc_rng rng = { .seed = h, .offset = 0 };
    int64_t fan = ghc_tensor_numel(t) / (shape[0] ? shape[0] : 1);
    int rc = gamma || bias ? ghc_op_fill(t, gamma ? 1.0 : 0.0, NULL) : ghc_op_rand_normal(t, &rng, NULL);
    if (rc == 0 && !gamma && !bias)
        rc = ghc_op_scale(t, t, (float)(1.0 / sqrt((double)(fan > 0 ? fan : 1))), NULL);
    if (rc < 0) {
        ghc_tensor_free(t);
        return NULL;
    }
    return wv_own(vae, t);
}

ghc_tensor_t *wv_own(ghc_wanvae_t *vae, ghc_tensor_t *t)
{
    if (!t)
        return NULL;
    if (vae->n_owned == vae->cap_owned) {
        int cap = vae->cap_owned ? 2 * vae->cap_owned : 256;
        ghc_tensor_t **p = realloc(vae->owned, (size_t)cap * sizeof(*p));
        if (!p) {
            ghc_tensor_free(t);
            ghc_error_set(vae->core, GHC_ENOMEM, "wanvae: out of memory");
            return NULL;
        }
        vae->owned = p;
        vae->cap_owned = cap;
    }
    return vae->owned[vae->n_owned++] = t;
}

/* ---- names ------------------------------------------------------------------------------------ */

static bool starts(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

/* A residual block's member under its official name (`residual.0.gamma`, ...) as diffusers
 * names it (`norm1.gamma`, ...). */
static void rb_diffusers(const char *tail, char *out, size_t len)
{
    static const char *const map[][2] = { { "residual.0.", "norm1." }, { "residual.2.", "conv1." },
                                          { "residual.3.", "norm2." }, { "residual.6.", "conv2." },
                                          { "shortcut.", "conv_shortcut." } };
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (starts(tail, map[i][0])) {
            snprintf(out, len, "%s%s", map[i][1], tail + strlen(map[i][0]));
            return;
        }
    snprintf(out, len, "%s", tail);
}

/* The diffusers name of official name `off` (spec encoders.md 2.9 and 3.7, the AutoencoderKLWan
 * tables); R = num_res_blocks. */
static void to_diffusers(const char *off, int64_t R, char *out, size_t len)
{
    char t[192];
    int n = 0, j = 0, k = 0;
    if (starts(off, "conv1.")) {
        snprintf(out, len, "quant_conv.%s", off + 6);
        return;
    }
    if (starts(off, "conv2.")) {
        snprintf(out, len, "post_quant_conv.%s", off + 6);
        return;
    }
    const char *side = starts(off, "encoder.") ? "encoder" : "decoder", *rest = off + 8;
    if (starts(rest, "conv1."))
        snprintf(out, len, "%s.conv_in.%s", side, rest + 6);
    else if (starts(rest, "head.0."))
        snprintf(out, len, "%s.norm_out.%s", side, rest + 7);
    else if (starts(rest, "head.2."))
        snprintf(out, len, "%s.conv_out.%s", side, rest + 7);
    else if (starts(rest, "middle.1."))
        snprintf(out, len, "%s.mid_block.attentions.0.%s", side, rest + 9);
    else if (sscanf(rest, "downsamples.%d.downsamples.%d.%n", &n, &j, &k) == 2 && k > 0) {   /* Wan2.2 */
        rb_diffusers(rest + k, t, sizeof(t));
        if (j < R)
            snprintf(out, len, "encoder.down_blocks.%d.resnets.%d.%s", n, j, t);
        else
            snprintf(out, len, "encoder.down_blocks.%d.downsampler.%s", n, rest + k);
    } else if (sscanf(rest, "upsamples.%d.upsamples.%d.%n", &n, &j, &k) == 2 && k > 0) {
        rb_diffusers(rest + k, t, sizeof(t));
        if (j <= R)
            snprintf(out, len, "decoder.up_blocks.%d.resnets.%d.%s", n, j, t);
        else
            snprintf(out, len, "decoder.up_blocks.%d.upsampler.%s", n, rest + k);
    } else if (sscanf(rest, "middle.%d.%n", &n, &k) == 1 && k > 0) {
        rb_diffusers(rest + k, t, sizeof(t));
        snprintf(out, len, "%s.mid_block.resnets.%d.%s", side, n / 2, t);
    } else if (sscanf(rest, "downsamples.%d.%n", &n, &k) == 1 && k > 0) {
        rb_diffusers(rest + k, t, sizeof(t));
        snprintf(out, len, "encoder.down_blocks.%d.%s", n, t);
    } else if (sscanf(rest, "upsamples.%d.%n", &n, &k) == 1 && k > 0) {
        const int64_t stage = n / (R + 2), at = n % (R + 2);   /* R + 1 blocks, then the resample */
        if (at <= R) {
            rb_diffusers(rest + k, t, sizeof(t));
            snprintf(out, len, "decoder.up_blocks.%lld.resnets.%lld.%s", (long long)stage, (long long)at, t);
        } else {
            snprintf(out, len, "decoder.up_blocks.%lld.upsamplers.0.%s", (long long)stage, rest + k);
        }
    } else {
        snprintf(out, len, "%s", off);
    }
}

/* The file's name for official name `off` (names are short: a longer one would only miss). */
static void file_name(const ghc_wanvae_t *vae, const char *off, char *out, size_t len)
{
    char d[256];
    if (vae->cfg.names == GHC_WANVAE_NAMES_DIFFUSERS) {
        to_diffusers(off, vae->cfg.num_res_blocks, d, sizeof(d));
        off = d;
    }
    if (snprintf(out, len, "%s%s", vae->cfg.prefix, off) >= (int)len)
        out[0] = '\0';
}

/* Entry of official name `off` in the file; false when absent. */
static bool find(const struct loader *L, const char *off, struct ghc_st_info *info)
{
    char name[328];
    file_name(L->vae, off, name, sizeof(name));
    return ghc_st_find(L->st, name, info);
}

static const char *shape_str(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim; i++)
        n += (size_t)snprintf(buf + n, len > n ? len - n : 0, "%s%lld", i ? ", " : "", (long long)shape[i]);
    snprintf(buf + n, len > n ? len - n : 0, "]");
    return buf;
}

/* ---- tensors ---------------------------------------------------------------------------------- */

/* Load official tensor `off` (under the file's name for it), which must have exactly `shape`,
 * as f32 on the VAE's device, owned by the VAE. NULL with the message set. */
static ghc_tensor_t *load(struct loader *L, const char *off, int ndim, const int64_t *shape)
{
    ghc_wanvae_t *vae = L->vae;
    char name[328], got[96], want[96];
    struct ghc_st_info info;
    file_name(vae, off, name, sizeof(name));
    if (L->synth)
        return synth(L, name, ndim, shape);
    if (!ghc_st_find(L->st, name, &info)) {
        ghc_error_set(vae->core, GHC_ENOTFOUND, "%s: missing tensor '%s' (%s names%s%s%s), expected %s", L->path,
                      name, vae->cfg.names == GHC_WANVAE_NAMES_DIFFUSERS ? "diffusers" : "official",
                      *vae->cfg.prefix ? ", prefix '" : "", vae->cfg.prefix, *vae->cfg.prefix ? "'" : "",
                      shape_str(ndim, shape, want, sizeof(want)));
        return NULL;
    }
    bool same = info.ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = info.shape[i] == shape[i];
    if (!same) {
        ghc_error_set(vae->core, GHC_EFORMAT, "%s: tensor '%s' is %s, expected %s for this VAE (base_dim %lld, "
                      "dim_mult [%lld, %lld, %lld, %lld], z_dim %lld)", L->path, name,
                      shape_str(info.ndim, info.shape, got, sizeof(got)), shape_str(ndim, shape, want, sizeof(want)),
                      (long long)vae->cfg.base_dim, (long long)vae->cfg.dim_mult[0], (long long)vae->cfg.dim_mult[1],
                      (long long)vae->cfg.dim_mult[2], (long long)vae->cfg.dim_mult[3], (long long)vae->cfg.z_dim);
        return NULL;
    }
    if (info.dtype != GHC_DTYPE_F32 && info.dtype != GHC_DTYPE_BF16 && info.dtype != GHC_DTYPE_F16) {
        ghc_error_set(vae->core, GHC_EFORMAT, "%s: tensor '%s' is %s, expected F32, BF16 or F16", L->path, name,
                      ghc_dtype_name(info.dtype));
        return NULL;
    }
    bool cpu = vae->device == GHC_DEVICE_CPU;
    ghc_tensor_t *h = ghc_st_load(L->st, name, GHC_DTYPE_F32, GHC_ROLE_ENCODER_WEIGHTS);
    if (!h)
        return NULL;
    if (ghc_tensor_find_nonfinite(h) >= 0) {
        ghc_error_set(vae->core, GHC_EFORMAT, "%s: tensor '%s' holds a NaN or infinite value at element %lld",
                      L->path, name, (long long)ghc_tensor_find_nonfinite(h));
        ghc_tensor_free(h);
        return NULL;
    }
    if (!cpu) {
        ghc_tensor_t *d = ghc_tensor_init(vae->core, GHC_DTYPE_F32, ndim, shape, vae->device, GHC_ROLE_ENCODER_WEIGHTS);
        if (!d || ghc_op_copy(d, h, NULL) < 0 || ghc_op_sync(vae->core, vae->device, NULL) < 0) {
            ghc_tensor_free(d);
            ghc_tensor_free(h);
            return NULL;
        }
        ghc_tensor_free(h);
        h = d;
    }
    return wv_own(vae, h);
}
#define LOAD(L, off, ...) \
    load(L, off, (int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)), (const int64_t[]){ __VA_ARGS__ })

/* A convolution `off`.weight/.bias: k = 3 (k3 causal, a slot), 1 (1x1x1), or 2 for a Conv2d
 * k3 (file shape [Co, Ci, 3, 3]) and -1 for a Conv2d 1x1; time_conv is loaded by resample(). */
static int conv(struct loader *L, struct wv_side *s, const char *off, int64_t co, int64_t ci, int k,
                struct wv_conv *c)
{
    char wn[160], bn[160];
    snprintf(wn, sizeof(wn), "%s.weight", off);
    snprintf(bn, sizeof(bn), "%s.bias", off);
    c->slot = -1;
    memset(&c->geo, 0, sizeof(c->geo));
    if (k == 3) {
        c->w = LOAD(L, wn, co, ci, 3, 3, 3);
        c->geo = (struct ghc_conv3d){ .pad_t = 2, .pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1 };
        c->slot = s->n_slots++;
    } else if (k == 1) {
        c->w = LOAD(L, wn, co, ci, 1, 1, 1);
    } else {
        int64_t kk = k == 2 ? 3 : 1;
        c->w = LOAD(L, wn, co, ci, kk, kk);
        if (c->w && ghc_tensor_reshape(c->w, 5, (const int64_t[]){ co, ci, 1, kk, kk }) < 0)
            return ghc_error_code(L->vae->core);
    }
    if (!c->w || !(c->b = LOAD(L, bn, co)))
        return ghc_error_code(L->vae->core);
    return 0;
}

/* Residual block `off` (e.g. "encoder.downsamples.3"), ci -> co. */
static int rb(struct loader *L, struct wv_side *s, const char *off, int64_t ci, int64_t co, struct wv_rb *r)
{
    char n[128];
    int rc;
    snprintf(n, sizeof(n), "%s.residual.0.gamma", off);
    if (!(r->g1 = LOAD(L, n, ci, 1, 1, 1)))
        return ghc_error_code(L->vae->core);
    snprintf(n, sizeof(n), "%s.residual.2", off);
    if ((rc = conv(L, s, n, co, ci, 3, &r->c1)) < 0)
        return rc;
    snprintf(n, sizeof(n), "%s.residual.3.gamma", off);
    if (!(r->g2 = LOAD(L, n, co, 1, 1, 1)))
        return ghc_error_code(L->vae->core);
    snprintf(n, sizeof(n), "%s.residual.6", off);
    if ((rc = conv(L, s, n, co, co, 3, &r->c2)) < 0)
        return rc;
    r->has_sc = ci != co;
    snprintf(n, sizeof(n), "%s.shortcut", off);
    return r->has_sc ? conv(L, s, n, co, ci, 1, &r->sc) : 0;
}

/* Resample `off` of mode m on c channels (Wan2.1's upsample convs halve them, Wan2.2's keep). */
static int resample(struct loader *L, struct wv_side *s, const char *off, enum wv_mode m, int64_t c,
                    struct wv_resample *r)
{
    const bool halve = L->vae->cfg.version == 21;
    char n[128], wn[160], bn[160];
    int rc;
    bool up = m == WV_UP2D || m == WV_UP3D;
    r->mode = m;
    snprintf(n, sizeof(n), "%s.resample.1", off);
    if ((rc = conv(L, s, n, up && halve ? c / 2 : c, c, 2, &r->conv)) < 0)
        return rc;
    if (up)
        r->conv.geo = (struct ghc_conv3d){ .pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1 };
    else   /* ZeroPad2d(0, 1, 0, 1), then stride 2 */
        r->conv.geo = (struct ghc_conv3d){ .stride_h = 2, .stride_w = 2, .pad_bottom = 1, .pad_right = 1 };
    if (m != WV_DOWN3D && m != WV_UP3D)
        return 0;
    snprintf(wn, sizeof(wn), "%s.time_conv.weight", off);
    snprintf(bn, sizeof(bn), "%s.time_conv.bias", off);
    int64_t co = m == WV_UP3D ? 2 * c : c;
    if (!(r->time.w = LOAD(L, wn, co, c, 3, 1, 1)) || !(r->time.b = LOAD(L, bn, co)))
        return ghc_error_code(L->vae->core);
    /* downsample3d: stride 2 over [last frame of the previous chunk, x]; upsample3d: causal */
    r->time.geo = m == WV_DOWN3D ? (struct ghc_conv3d){ .stride_t = 2, .pad_t = 1 } : (struct ghc_conv3d){ .pad_t = 2 };
    r->time.slot = s->n_slots++;
    return 0;
}

static int attn(struct loader *L, struct wv_side *s, const char *off, int64_t c, struct wv_attn *a)
{
    char n[128];
    int rc;
    snprintf(n, sizeof(n), "%s.norm.gamma", off);
    if (!(a->gamma = LOAD(L, n, c, 1, 1)))
        return ghc_error_code(L->vae->core);
    snprintf(n, sizeof(n), "%s.to_qkv", off);
    if ((rc = conv(L, s, n, 3 * c, c, -1, &a->qkv)) < 0)
        return rc;
    snprintf(n, sizeof(n), "%s.proj", off);
    return conv(L, s, n, c, c, -1, &a->proj);
}

/* The middle blocks of side `sd` ("encoder"/"decoder") at width c. */
static int middle(struct loader *L, struct wv_side *s, const char *sd, int64_t c)
{
    char n[64];
    int rc;
    snprintf(n, sizeof(n), "%s.middle.0", sd);
    if ((rc = rb(L, s, n, c, c, &s->mid0)) < 0)
        return rc;
    snprintf(n, sizeof(n), "%s.middle.1", sd);
    if ((rc = attn(L, s, n, c, &s->attn)) < 0)
        return rc;
    snprintf(n, sizeof(n), "%s.middle.2", sd);
    return rb(L, s, n, c, c, &s->mid2);
}

/* The head of side `sd`: RMS norm at width c, SiLU, k3 conv to co. */
static int head(struct loader *L, struct wv_side *s, const char *sd, int64_t c, int64_t co)
{
    char n[64];
    snprintf(n, sizeof(n), "%s.head.0.gamma", sd);
    if (!(s->head_g = LOAD(L, n, c, 1, 1, 1)))
        return ghc_error_code(L->vae->core);
    snprintf(n, sizeof(n), "%s.head.2", sd);
    return conv(L, s, n, co, c, 3, &s->head);
}

/* ---- the two sides ---------------------------------------------------------------------------- */

/* The next free layer of side s, of kind k. */
static struct wv_layer *layer(struct wv_side *s, enum wv_kind k)
{
    struct wv_layer *l = &s->layers[s->n_layers++];
    l->kind = k;
    return l;
}

/* Stage i of side s: `blocks` residual blocks ci -> co (then co -> co) and, unless mode < 0, a
 * resample of that mode. Wan2.1: the next entries of the flat list `list` ("encoder.downsamples",
 * "decoder.upsamples"); Wan2.2: `list`.i.`inner`.j, inside a shortcut of factors ft, fs (fs = 0:
 * none) from ci to co around the stage. */
static int stage(struct loader *L, struct wv_side *s, const char *list, const char *inner, int i, int64_t blocks,
                 int64_t ci, int64_t co, int mode, int32_t ft, int32_t fs)
{
    const bool nested = L->vae->cfg.version == 22;
    const int64_t ci0 = ci;
    char n[80];
    int rc, j = 0;
    if (nested && fs)
        layer(s, WV_SAVE);
    for (; j < blocks; j++, ci = co) {
        if (nested)
            snprintf(n, sizeof(n), "%s.%d.%s.%d", list, i, inner, j);
        else
            snprintf(n, sizeof(n), "%s.%d", list, s->n_layers);
        if ((rc = rb(L, s, n, ci, co, &layer(s, WV_RB)->rb)) < 0)
            return rc;
    }
    if (mode >= 0) {
        if (nested)
            snprintf(n, sizeof(n), "%s.%d.%s.%d", list, i, inner, j);
        else
            snprintf(n, sizeof(n), "%s.%d", list, s->n_layers);
        if ((rc = resample(L, s, n, (enum wv_mode)mode, co, &layer(s, WV_RESAMPLE)->rs)) < 0)
            return rc;
    }
    if (nested && fs) {
        struct wv_layer *l = layer(s, mode == WV_UP2D || mode == WV_UP3D ? WV_DUP_UP : WV_AVG_DOWN);
        const int64_t phi = (int64_t)ft * fs * fs;
        l->co = co, l->ft = ft, l->fs = fs;
        if (l->kind == WV_AVG_DOWN ? (ci0 * phi) % co : (co * phi) % ci0)
            return ghc_error_set(L->vae->core, GHC_EFORMAT, "%s: stage %d of %s: widths %lld -> %lld do not fit its "
                                 "shortcut (factor %lld)", L->path, i, list, (long long)ci0, (long long)co,
                                 (long long)phi);
    }
    return 0;
}

static int encoder(struct loader *L)
{
    ghc_wanvae_t *vae = L->vae;
    const struct ghc_wanvae_config *g = &vae->cfg;
    struct wv_side *s = &vae->enc;
    int rc;
    if ((rc = conv(L, s, "encoder.conv1", g->base_dim, 3 * g->patch * g->patch, 3, &s->conv_in)) < 0)
        return rc;
    if (!(s->layers = calloc((size_t)(4 * g->num_res_blocks + 12), sizeof(*s->layers))))
        return ghc_error_set(vae->core, GHC_ENOMEM, "wanvae: out of memory");
    int64_t ci = g->base_dim, co = ci;
    for (int i = 0; i < 4; i++, ci = co) {
        co = g->base_dim * g->dim_mult[i];
        const bool t = i < 3 && g->temporal_down[i];
        int mode = i == 3 ? -1 : t ? WV_DOWN3D : WV_DOWN2D;
        /* Wan2.2: every stage has the shortcut (the last one with factors 1, 1) */
        if ((rc = stage(L, s, "encoder.downsamples", "downsamples", i, g->num_res_blocks, ci, co, mode, t ? 2 : 1,
                        i == 3 ? 1 : 2)) < 0)
            return rc;
    }
    if ((rc = middle(L, s, "encoder", co)) < 0)
        return rc;
    return head(L, s, "encoder", co, 2 * g->z_dim);
}

static int decoder(struct loader *L)
{
    ghc_wanvae_t *vae = L->vae;
    const struct ghc_wanvae_config *g = &vae->cfg;
    struct wv_side *s = &vae->dec;
    const int64_t b = g->dec_base_dim;
    /* widths from the latent side: mult[3], mult[3], mult[2], mult[1], mult[0] */
    const int64_t dims[5] = { b * g->dim_mult[3], b * g->dim_mult[3], b * g->dim_mult[2], b * g->dim_mult[1],
                              b * g->dim_mult[0] };
    int rc;
    if ((rc = conv(L, s, "decoder.conv1", dims[0], g->z_dim, 3, &s->conv_in)) < 0)
        return rc;
    if ((rc = middle(L, s, "decoder", dims[0])) < 0)
        return rc;
    if (!(s->layers = calloc((size_t)(4 * g->num_res_blocks + 16), sizeof(*s->layers))))
        return ghc_error_set(vae->core, GHC_ENOMEM, "wanvae: out of memory");
    for (int i = 0; i < 4; i++) {
        /* Wan2.1: each upsample conv halves the width, so stages 1-3 start at half */
        int64_t ci = i == 0 || g->version == 22 ? dims[i] : dims[i] / 2;
        const bool t = i < 3 && g->temporal_down[2 - i];
        int mode = i == 3 ? -1 : t ? WV_UP3D : WV_UP2D;
        if ((rc = stage(L, s, "decoder.upsamples", "upsamples", i, g->num_res_blocks + 1, ci, dims[i + 1], mode,
                        t ? 2 : 1, i == 3 ? 0 : 2)) < 0)
            return rc;
    }
    return head(L, s, "decoder", dims[4], 3 * g->patch * g->patch);
}

/* ---- configuration ------------------------------------------------------------------------------- */

/* The naming and prefix: the name of a tensor every Wan VAE has, found as a suffix. */
static int detect_names(struct loader *L)
{
    ghc_wanvae_t *vae = L->vae;
    struct ghc_st_info info;
    for (int i = 0; i < ghc_st_count(L->st); i++) {
        ghc_st_info_at(L->st, i, &info);
        size_t n = strlen(info.name);
        static const struct { const char *key; enum ghc_wanvae_names names; } keys[] = {
            { KEY_OFFICIAL, GHC_WANVAE_NAMES_OFFICIAL }, { KEY_DIFFUSERS, GHC_WANVAE_NAMES_DIFFUSERS } };
        for (int k = 0; k < 2; k++) {
            size_t m = strlen(keys[k].key);
            if (n >= m && strcmp(info.name + n - m, keys[k].key) == 0 && n - m < sizeof(vae->cfg.prefix)) {
                vae->cfg.names = keys[k].names;
                snprintf(vae->cfg.prefix, sizeof(vae->cfg.prefix), "%.*s", (int)(n - m), info.name);
                return 0;
            }
        }
    }
    return ghc_error_set(vae->core, GHC_EFORMAT, "%s: not a Wan VAE checkpoint (no tensor '%s' or '%s')", L->path,
                         KEY_OFFICIAL, KEY_DIFFUSERS);
}

/* base_dim, z_dim, num_res_blocks, dim_mult and the temporal flags from the shapes. */
static int detect_config(struct loader *L)
{
    ghc_wanvae_t *vae = L->vae;
    struct ghc_wanvae_config *g = &vae->cfg;
    struct ghc_st_info info;
    char name[328], fname[328];
    const bool dif = g->names == GHC_WANVAE_NAMES_DIFFUSERS;
    /* the Wan2.2 VAE: nested (official) or residual (diffusers) stages; read with the prefix only,
     * since mapping these names needs num_res_blocks */
    snprintf(name, sizeof(name), "%s%s", g->prefix, dif ? KEY22_DIFFUSERS : KEY22_OFFICIAL);
    g->version = ghc_st_find(L->st, name, &info) ? 22 : 21;
    if (!find(L, "encoder.conv1.weight", &info) || info.ndim != 5 || (info.shape[1] != 3 && info.shape[1] != 12)) {
        file_name(vae, "encoder.conv1.weight", name, sizeof(name));
        return ghc_error_set(vae->core, GHC_EFORMAT, "%s: tensor '%s' missing or not [C, 3 or 12, 3, 3, 3]", L->path,
                             name);
    }
    g->base_dim = info.shape[0];
    g->patch = info.shape[1] == 12 ? 2 : 1;
    if (!find(L, "conv2.weight", &info) || info.ndim != 5) {
        file_name(vae, "conv2.weight", name, sizeof(name));
        return ghc_error_set(vae->core, GHC_EFORMAT, "%s: tensor '%s' missing or not [z, z, 1, 1, 1]", L->path, name);
    }
    g->z_dim = info.shape[0];
    if (g->z_dim != (g->version == 22 ? 48 : 16))
        return ghc_error_set(vae->core, GHC_EUNSUPPORTED, "%s: z_dim %lld in a Wan%s VAE layout; the Wan2.1 VAE has 16 "
                             "latent channels and the Wan2.2 VAE 48 (the normalisation constants known)", L->path,
                             (long long)g->z_dim, g->version == 22 ? "2.2" : "2.1");
    /* Wan2.1: where the first downsampling layer sits, after num_res_blocks blocks; Wan2.2: how
     * many blocks stage 0 has (the names mapped as if there could be 16) */
    if (g->version == 22) {
        int64_t j = 0;
        for (g->num_res_blocks = 16; j < 16; j++) {
            snprintf(name, sizeof(name), "encoder.downsamples.0.downsamples.%lld.residual.2.weight", (long long)j);
            if (!find(L, name, &info))
                break;
        }
        g->num_res_blocks = j ? j : 17;
    } else {
        for (g->num_res_blocks = 1; g->num_res_blocks <= 16; g->num_res_blocks++) {
            snprintf(name, sizeof(name), "encoder.downsamples.%lld.resample.1.weight", (long long)g->num_res_blocks);
            if (find(L, name, &info))
                break;
        }
    }
    if (g->num_res_blocks > 16)
        return ghc_error_set(vae->core, GHC_EFORMAT, "%s: no encoder stage found (a tensor like '%s')",
                             L->path, g->version == 22 ? "encoder.downsamples.0.downsamples.0.residual.2.weight"
                                                       : "encoder.downsamples.2.resample.1.weight");
    const int64_t R = g->num_res_blocks;
    for (int i = 0; i < 4; i++) {
        if (g->version == 22)
            snprintf(name, sizeof(name), "encoder.downsamples.%d.downsamples.0.residual.2.weight", i);
        else
            snprintf(name, sizeof(name), "encoder.downsamples.%lld.residual.2.weight", (long long)(i * (R + 1)));
        if (!find(L, name, &info) || info.ndim != 5 || info.shape[0] % g->base_dim != 0) {
            file_name(vae, name, fname, sizeof(fname));
            return ghc_error_set(vae->core, GHC_EFORMAT, "%s: tensor '%s' missing or not [k * %lld, C, 3, 3, 3] "
                                 "(encoder stage %d)", L->path, fname, (long long)g->base_dim, i);
        }
        g->dim_mult[i] = info.shape[0] / g->base_dim;
    }
    for (int i = 0; i < 3; i++) {
        if (g->version == 22)
            snprintf(name, sizeof(name), "encoder.downsamples.%d.downsamples.%lld.time_conv.weight", i, (long long)R);
        else
            snprintf(name, sizeof(name), "encoder.downsamples.%lld.time_conv.weight", (long long)(i * (R + 1) + R));
        g->temporal_down[i] = find(L, name, &info);
    }
    if (!find(L, "decoder.head.0.gamma", &info) || info.ndim < 1 || info.shape[0] % g->dim_mult[0] != 0) {
        file_name(vae, "decoder.head.0.gamma", fname, sizeof(fname));
        return ghc_error_set(vae->core, GHC_EFORMAT, "%s: tensor '%s' missing or not [k * %lld, 1, 1, 1]", L->path,
                             fname, (long long)g->dim_mult[0]);
    }
    g->dec_base_dim = info.shape[0] / g->dim_mult[0];
    return 0;
}

/* The first bytes of a PyTorch checkpoint: a zip archive (torch.save since 1.6) or a pickle. */
static bool is_pickle(const char *path)
{
    unsigned char m[4] = { 0 };
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    size_t n = fread(m, 1, sizeof(m), f);
    fclose(f);
    return n >= 2 && ((m[0] == 'P' && m[1] == 'K') || (m[0] == 0x80 && m[1] >= 2 && m[1] <= 5));
}

static bool has_ext(const char *path, const char *ext)
{
    size_t a = strlen(path), b = strlen(ext);
    return a >= b && strcmp(path + a - b, ext) == 0;
}

int wv_load(ghc_wanvae_t *vae, const char *path, const struct ghc_wanvae_config *random, uint64_t seed)
{
    struct loader L = { vae, NULL, path, random != NULL, seed };
    int rc;
    if (random) {
        vae->cfg = *random;
        vae->cfg.names = GHC_WANVAE_NAMES_OFFICIAL;
        vae->cfg.prefix[0] = '\0';
        if ((vae->cfg.version != 21 && vae->cfg.version != 22) || vae->cfg.z_dim != (vae->cfg.version == 22 ? 48 : 16) ||
            vae->cfg.base_dim < 1 || vae->cfg.dec_base_dim < 1 || vae->cfg.num_res_blocks < 1 ||
            vae->cfg.patch != (vae->cfg.version == 22 ? 2 : 1))
            return ghc_error_set(vae->core, GHC_EINVAL, "%s: a random Wan VAE needs version 21 (z_dim 16, patch 1) or "
                                 "22 (z_dim 48, patch 2) and widths and blocks >= 1", path);
        if ((rc = encoder(&L)) < 0 || (rc = decoder(&L)) < 0)
            return rc;
        goto tail;
    }
    if (is_pickle(path) || has_ext(path, ".pth") || has_ext(path, ".pt") || has_ext(path, ".ckpt"))
        return ghc_error_set(vae->core, GHC_EUNSUPPORTED, "%s: a PyTorch pickle checkpoint (.pth); gh200core reads "
                             "safetensors only: use ComfyUI's split_files/vae/wan_2.1_vae.safetensors (Wan2.2 VAE: "
                             "wan2.2_vae.safetensors) or diffusers' vae/diffusion_pytorch_model.safetensors", path);
    if (!(L.st = ghc_st_open(vae->core, path)))
        return ghc_error_code(vae->core) < 0 ? ghc_error_code(vae->core) : GHC_EIO;
    if ((rc = detect_names(&L)) < 0 || (rc = detect_config(&L)) < 0 || (rc = encoder(&L)) < 0 ||
        (rc = decoder(&L)) < 0)
        goto out;
tail:;
    const int64_t z = vae->cfg.z_dim;
    /* conv1 (the posterior's 1x1x1): only the mean's rows are used, a prefix of weight and bias */
    ghc_tensor_t *qw = LOAD(&L, "conv1.weight", 2 * z, 2 * z, 1, 1, 1), *qb = qw ? LOAD(&L, "conv1.bias", 2 * z) : NULL;
    if (!qb || !(vae->quant.w = wv_own(vae, ghc_tensor_wrap(vae->core, GHC_DTYPE_F32, 5,
                                                             (const int64_t[]){ z, 2 * z, 1, 1, 1 }, vae->device,
                                                             ghc_tensor_data(qw)))) ||
        !(vae->quant.b = wv_own(vae, ghc_tensor_wrap(vae->core, GHC_DTYPE_F32, 1, &z, vae->device,
                                                      ghc_tensor_data(qb))))) {
        rc = ghc_error_code(vae->core);
        goto out;
    }
    vae->quant.slot = -1;
    if ((rc = conv(&L, &vae->dec, "conv2", z, z, 1, &vae->post_quant)) < 0)
        goto out;
    /* normalisation: z = (mu - mean) * inv_std, decoded mu = z / inv_std + mean, inv_std = 1 / std in f32 */
    const float *mean = z == 48 ? LATENT_MEAN48 : LATENT_MEAN, *std = z == 48 ? LATENT_STD48 : LATENT_STD;
    float es[48], eh[48], ds[48];
    for (int c = 0; c < z; c++) {
        float inv = 1.0f / std[c];
        es[c] = inv;
        eh[c] = -mean[c] * inv;
        ds[c] = 1.0f / inv;
    }
    const float *src[4] = { es, eh, ds, mean };
    ghc_tensor_t **dst[4] = { &vae->enc_scale, &vae->enc_shift, &vae->dec_scale, &vae->dec_shift };
    for (int k = 0; k < 4; k++) {
        ghc_tensor_t *h = ghc_tensor_wrap(vae->core, GHC_DTYPE_F32, 1, &z, GHC_DEVICE_CPU, (void *)src[k]);
        ghc_tensor_t *d = ghc_tensor_init(vae->core, GHC_DTYPE_F32, 1, &z, vae->device, GHC_ROLE_ENCODER_WEIGHTS);
        rc = h && d ? ghc_op_copy(d, h, NULL) : ghc_error_code(vae->core);
        if (rc == 0)
            rc = ghc_op_sync(vae->core, vae->device, NULL);
        ghc_tensor_free(h);
        if (rc < 0 || !(*dst[k] = wv_own(vae, d))) {
            if (rc < 0)
                ghc_tensor_free(d);
            rc = rc < 0 ? rc : ghc_error_code(vae->core);
            goto out;
        }
    }
    ghc_log(vae->core, GHC_LOG_INFO, "wanvae: %s: Wan%s VAE, %s names%s%s%s, base_dim %lld (decoder %lld), dim_mult "
            "[%lld, %lld, %lld, %lld], %lld res blocks, z_dim %lld, %d tensors", path, vae->cfg.version == 22 ? "2.2" : "2.1",
            vae->cfg.names == GHC_WANVAE_NAMES_DIFFUSERS ? "diffusers" : "official", *vae->cfg.prefix ? " (prefix '" : "",
            vae->cfg.prefix, *vae->cfg.prefix ? "')" : "", (long long)vae->cfg.base_dim, (long long)vae->cfg.dec_base_dim,
            (long long)vae->cfg.dim_mult[0],
            (long long)vae->cfg.dim_mult[1], (long long)vae->cfg.dim_mult[2], (long long)vae->cfg.dim_mult[3],
            (long long)vae->cfg.num_res_blocks, (long long)z, L.st ? ghc_st_count(L.st) : 0);
out:
    ghc_st_free(L.st);
    return rc;
}
