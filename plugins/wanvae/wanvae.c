/* wanvae.c: encode and decode with the Wan VAEs, chunk by chunk as the official code does
 * (spec encoders.md 2.7, 3.5): the encoder sees frame 0, then 4 frames at a time; the decoder one
 * latent frame at a time. Between chunks, the feature cache carries the frames each temporal
 * convolution needs from the past: one slot per causal conv, holding the last pad_t frames of
 * its input (zeros at the start, which is what the official cache amounts to: a k3 conv pads
 * with zero frames where the cache is short, and upsample3d's 'Rep' marker means "zeros"). The
 * temporal resamplers skip their time_conv on the first chunk: downsample3d passes frame 0
 * through and remembers it, upsample3d passes latent frame 0 through without doubling it. The
 * Wan2.2 VAE's stage shortcuts (AvgDown3D, DupUp3D) work within a chunk, the decoder's dropping
 * its first frame on the first chunk; its clips enter and leave as 2 x 2 patches.
 * Activations are [1, C, T, H, W] f32 tensors, each freed as soon as the next one exists. */
#include <config.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "wanvae_impl.h"

/* One encode or decode: the VAE and the cache slots of the side that runs. */
struct run {
    ghc_wanvae_t  *vae;
    ghc_tensor_t **slot;     /* [1, Ci, pad_t, H, W], made (zeroed) at first use */
    bool          *primed;   /* a resampler's slot has seen its first chunk */
    int            n;
    ghc_tensor_t  *saved;    /* a Wan2.2 stage's input, for its shortcut */
    bool           first;    /* the first chunk runs */
};

#define TRY(expr) do { if ((rc = (expr)) < 0) goto out; } while (0)

static ghc_tensor_t *act(ghc_wanvae_t *vae, int64_t c, int64_t t, int64_t h, int64_t w)
{
    return ghc_tensor_init(vae->core, GHC_DTYPE_F32, 5, (const int64_t[]){ 1, c, t, h, w }, vae->device,
                           GHC_ROLE_ACTIVATIONS);
}

/* The status of the failure just reported (an allocation that set no message: ENOMEM). */
static int last_error(const ghc_wanvae_t *vae)
{
    return ghc_error_code(vae->core) < 0 ? ghc_error_code(vae->core) : GHC_ENOMEM;
}

/* Replace *x by y (freeing the old tensor). */
static void swap_in(ghc_tensor_t **x, ghc_tensor_t *y)
{
    ghc_tensor_free(*x);
    *x = y;
}

/* ---- the feature cache ----------------------------------------------------------------------- */

/* The slot of conv c for input x (x's dtype: the stem's input may be bf16), made and zeroed on
 * first use. NULL: ENOMEM (message set). */
static ghc_tensor_t *slot(struct run *r, const struct wv_conv *c, const ghc_tensor_t *x)
{
    ghc_tensor_t **s = &r->slot[c->slot];
    if (!*s) {
        *s = ghc_tensor_init(r->vae->core, ghc_tensor_dtype(x), 5,
                             (const int64_t[]){ 1, ghc_tensor_dim(x, 1), c->geo.pad_t, ghc_tensor_dim(x, 3),
                                                ghc_tensor_dim(x, 4) },
                             r->vae->device, GHC_ROLE_ACTIVATIONS);
        if (*s && ghc_op_fill(*s, 0.0, NULL) < 0) {
            ghc_tensor_free(*s);
            *s = NULL;
        }
    }
    return *s;
}

/* The slot becomes the last P frames of [slot, x]. */
static int remember(ghc_tensor_t *s, const ghc_tensor_t *x)
{
    const int64_t P = ghc_tensor_dim(s, 2), T = ghc_tensor_dim(x, 2);
    int rc;
    if (T >= P)
        return ghc_op_copy_frames(s, 0, x, T - P, P, NULL);
    if ((rc = ghc_op_copy_frames(s, 0, s, T, P - T, NULL)) < 0)
        return rc;
    return ghc_op_copy_frames(s, P - T, x, 0, T, NULL);
}

/* ---- layers -------------------------------------------------------------------------------- */

/* y = conv c of x (with its cache slot, which then takes x's last frames). */
static int conv(struct run *r, const struct wv_conv *c, const ghc_tensor_t *x, ghc_tensor_t **y)
{
    ghc_wanvae_t *vae = r->vae;
    const struct ghc_conv3d *g = &c->geo;
    const int64_t st = g->stride_t ? g->stride_t : 1, sh = g->stride_h ? g->stride_h : 1,
                  sw = g->stride_w ? g->stride_w : 1;
    const int64_t To = (g->pad_t + ghc_tensor_dim(x, 2) - ghc_tensor_dim(c->w, 2)) / st + 1;
    const int64_t Ho = (ghc_tensor_dim(x, 3) + g->pad_top + g->pad_bottom - ghc_tensor_dim(c->w, 3)) / sh + 1;
    const int64_t Wo = (ghc_tensor_dim(x, 4) + g->pad_left + g->pad_right - ghc_tensor_dim(c->w, 4)) / sw + 1;
    ghc_tensor_t *s = NULL;
    int rc;
    *y = NULL;
    if (c->slot >= 0 && !(s = slot(r, c, x)))
        return last_error(vae);
    if (!(*y = act(vae, ghc_tensor_dim(c->w, 0), To, Ho, Wo)))
        return last_error(vae);
    if ((rc = ghc_op_conv3d(*y, x, s, c->w, c->b, g, NULL)) == 0 && s)
        rc = remember(s, x);
    if (rc < 0) {
        ghc_tensor_free(*y);
        *y = NULL;
    }
    return rc;
}

/* y = SiLU(RMS(x) gamma), then the causal conv c: the pre-activation part of a residual block
 * and of the heads. */
static int norm_silu_conv(struct run *r, const ghc_tensor_t *gamma, const struct wv_conv *c, const ghc_tensor_t *x,
                          ghc_tensor_t **y)
{
    ghc_tensor_t *t = ghc_tensor_init(r->vae->core, GHC_DTYPE_F32, 5, ghc_tensor_shape(x), r->vae->device,
                                      GHC_ROLE_ACTIVATIONS);
    int rc = t ? 0 : last_error(r->vae);
    *y = NULL;
    if (rc == 0 && (rc = ghc_op_channel_rmsnorm(t, x, gamma, NULL)) == 0 && (rc = ghc_op_silu(t, t, NULL)) == 0)
        rc = conv(r, c, t, y);
    ghc_tensor_free(t);
    return rc;
}

static int rb_fwd(struct run *r, const struct wv_rb *b, ghc_tensor_t **x)
{
    ghc_tensor_t *h = NULL, *t = NULL, *y = NULL;
    int rc;
    if (b->has_sc)
        TRY(conv(r, &b->sc, *x, &h));
    TRY(norm_silu_conv(r, b->g1, &b->c1, *x, &t));
    TRY(norm_silu_conv(r, b->g2, &b->c2, t, &y));
    TRY(ghc_op_add(y, y, h ? h : *x, 1.0f, 1.0f, NULL));
    swap_in(x, y);
    y = NULL;
out:
    ghc_tensor_free(h);
    ghc_tensor_free(t);
    ghc_tensor_free(y);
    return rc;
}

static int attn_fwd(struct run *r, const struct wv_attn *a, ghc_tensor_t **x)
{
    ghc_wanvae_t *vae = r->vae;
    const int64_t C = ghc_tensor_dim(*x, 1);
    ghc_tensor_t *t = act(vae, C, ghc_tensor_dim(*x, 2), ghc_tensor_dim(*x, 3), ghc_tensor_dim(*x, 4));
    ghc_tensor_t *qkv = NULL, *y = NULL;
    int rc = t ? 0 : last_error(vae);
    if (rc < 0)
        goto out;
    TRY(ghc_op_channel_rmsnorm(t, *x, a->gamma, NULL));
    TRY(conv(r, &a->qkv, t, &qkv));
    TRY(ghc_op_frame_attention(t, qkv, (float)(1.0 / sqrt((double)C)), NULL));
    TRY(conv(r, &a->proj, t, &y));
    TRY(ghc_op_add(y, y, *x, 1.0f, 1.0f, NULL));
    swap_in(x, y);
    y = NULL;
out:
    ghc_tensor_free(t);
    ghc_tensor_free(qkv);
    ghc_tensor_free(y);
    return rc;
}

/* upsample3d's time_conv: [1, C, T] -> conv to [1, 2C, T] -> frames [a_0, b_0, a_1, b_1, ...]
 * (a = the first C output channels, b = the last C; spec encoders.md 2.4). */
static int time_up(struct run *r, const struct wv_resample *rs, ghc_tensor_t **x)
{
    ghc_wanvae_t *vae = r->vae;
    const int64_t C = ghc_tensor_dim(*x, 1), T = ghc_tensor_dim(*x, 2), H = ghc_tensor_dim(*x, 3),
                  W = ghc_tensor_dim(*x, 4);
    ghc_tensor_t *y2 = NULL, *half[2] = { NULL, NULL }, *y = NULL;
    int rc;
    TRY(conv(r, &rs->time, *x, &y2));
    if (!(y = act(vae, C, 2 * T, H, W))) {
        rc = last_error(vae);
        goto out;
    }
    for (int s = 0; s < 2; s++)   /* channel halves of a [1, 2C, ...] tensor are contiguous */
        if (!(half[s] = ghc_tensor_wrap(vae->core, GHC_DTYPE_F32, 5, (const int64_t[]){ 1, C, T, H, W }, vae->device,
                                        (float *)ghc_tensor_data(y2) + (size_t)(s * C * T * H * W)))) {
            rc = last_error(vae);
            goto out;
        }
    for (int64_t t = 0; t < T; t++)
        for (int s = 0; s < 2; s++)
            TRY(ghc_op_copy_frames(y, 2 * t + s, half[s], t, 1, NULL));
    swap_in(x, y);
    y = NULL;
out:
    ghc_tensor_free(half[0]);
    ghc_tensor_free(half[1]);
    ghc_tensor_free(y2);
    ghc_tensor_free(y);
    return rc;
}

static int resample_fwd(struct run *r, const struct wv_resample *rs, ghc_tensor_t **x)
{
    ghc_wanvae_t *vae = r->vae;
    ghc_tensor_t *y = NULL;
    int rc = 0;
    bool up = rs->mode == WV_UP2D || rs->mode == WV_UP3D;
    if (rs->mode == WV_UP3D) {
        if (r->primed[rs->time.slot])
            TRY(time_up(r, rs, x));
        r->primed[rs->time.slot] = true;   /* first chunk: 'Rep', frame 0 passes untouched */
    }
    if (up) {
        if (!(y = act(vae, ghc_tensor_dim(*x, 1), ghc_tensor_dim(*x, 2), 2 * ghc_tensor_dim(*x, 3),
                      2 * ghc_tensor_dim(*x, 4)))) {
            rc = last_error(vae);
            goto out;
        }
        TRY(ghc_op_upsample2x(y, *x, NULL));
        swap_in(x, y);
        y = NULL;
    }
    TRY(conv(r, &rs->conv, *x, &y));
    swap_in(x, y);
    y = NULL;
    if (rs->mode == WV_DOWN3D) {
        if (!r->primed[rs->time.slot]) {   /* first chunk: frame 0 passes, and is remembered */
            ghc_tensor_t *s = slot(r, &rs->time, *x);
            r->primed[rs->time.slot] = true;
            rc = s ? remember(s, *x) : last_error(vae);
        } else {
            TRY(conv(r, &rs->time, *x, &y));
            swap_in(x, y);
            y = NULL;
        }
    }
out:
    ghc_tensor_free(y);
    return rc;
}

static int middle_fwd(struct run *r, const struct wv_side *s, ghc_tensor_t **x)
{
    int rc;
    if ((rc = rb_fwd(r, &s->mid0, x)) < 0 || (rc = attn_fwd(r, &s->attn, x)) < 0)
        return rc;
    return rb_fwd(r, &s->mid2, x);
}

/* A Wan2.2 stage's shortcut: *x += AvgDown3D or DupUp3D of the stage's input (then released). */
static int shortcut_fwd(struct run *r, const struct wv_layer *l, ghc_tensor_t **x)
{
    ghc_wanvae_t *vae = r->vae;
    const ghc_tensor_t *in = r->saved;
    const int32_t drop = l->kind == WV_DUP_UP && r->first ? l->ft - 1 : 0;
    const int64_t T = ghc_tensor_dim(in, 2), H = ghc_tensor_dim(in, 3), W = ghc_tensor_dim(in, 4);
    ghc_tensor_t *y = l->kind == WV_AVG_DOWN ? act(vae, l->co, (T + l->ft - 1) / l->ft, H / l->fs, W / l->fs)
                                             : act(vae, l->co, T * l->ft - drop, H * l->fs, W * l->fs);
    int rc = y ? 0 : last_error(vae);
    if (rc == 0)
        rc = l->kind == WV_AVG_DOWN ? ghc_op_avg_down3d(y, in, l->ft, l->fs, NULL)
                                    : ghc_op_dup_up3d(y, in, l->ft, l->fs, drop, NULL);
    if (rc == 0)
        rc = ghc_op_add(*x, *x, y, 1.0f, 1.0f, NULL);
    ghc_tensor_free(y);
    ghc_tensor_free(r->saved);
    r->saved = NULL;
    return rc;
}

static int layer_fwd(struct run *r, const struct wv_layer *l, ghc_tensor_t **x)
{
    switch (l->kind) {
    case WV_RB:       return rb_fwd(r, &l->rb, x);
    case WV_RESAMPLE: return resample_fwd(r, &l->rs, x);
    case WV_SAVE:
        ghc_tensor_free(r->saved);
        if (!(r->saved = act(r->vae, ghc_tensor_dim(*x, 1), ghc_tensor_dim(*x, 2), ghc_tensor_dim(*x, 3),
                             ghc_tensor_dim(*x, 4))))
            return last_error(r->vae);
        return ghc_op_copy(r->saved, *x, NULL);
    default:          return shortcut_fwd(r, l, x);
    }
}

/* One chunk through a side: stem, stages then middle (encoder) or middle then stages (decoder),
 * head. *x is replaced by the output. */
static int side_fwd(struct run *r, const struct wv_side *s, ghc_tensor_t **x)
{
    const bool dec = s == &r->vae->dec;
    ghc_tensor_t *y = NULL;
    int rc;
    TRY(conv(r, &s->conv_in, *x, &y));
    swap_in(x, y);
    y = NULL;
    if (dec)
        TRY(middle_fwd(r, s, x));
    for (int i = 0; i < s->n_layers; i++)
        TRY(layer_fwd(r, &s->layers[i], x));
    if (!dec)
        TRY(middle_fwd(r, s, x));
    TRY(norm_silu_conv(r, s->head_g, &s->head, *x, &y));
    swap_in(x, y);
    y = NULL;
out:
    return rc;
}

/* ---- runs ------------------------------------------------------------------------------------- */

static int run_init(struct run *r, ghc_wanvae_t *vae, const struct wv_side *s)
{
    r->vae = vae;
    r->n = s->n_slots;
    r->slot = calloc((size_t)(r->n ? r->n : 1), sizeof(*r->slot));
    r->primed = calloc((size_t)(r->n ? r->n : 1), sizeof(*r->primed));
    if (!r->slot || !r->primed)
        return ghc_error_set(vae->core, GHC_ENOMEM, "wanvae: out of memory");
    return 0;
}

static void run_free(struct run *r)
{
    ghc_tensor_free(r->saved);
    for (int i = 0; r->slot && i < r->n; i++)
        ghc_tensor_free(r->slot[i]);
    free(r->slot);
    free(r->primed);
}

/* A 4-D clip or latent [C, F, H, W] seen as [1, C, F, H, W] (a view over its memory). */
static ghc_tensor_t *batch1(ghc_wanvae_t *vae, const ghc_tensor_t *t)
{
    const int64_t *d = ghc_tensor_shape(t);
    return ghc_tensor_wrap(vae->core, ghc_tensor_dtype(t), 5, (const int64_t[]){ 1, d[0], d[1], d[2], d[3] },
                           ghc_tensor_device(t), (void *)ghc_tensor_cdata(t));
}

/* What encode/decode take: a dense 4-D f32 or bf16 tensor on the VAE's device with c channels. */
static int check_input(ghc_wanvae_t *vae, const char *op, const char *what, const ghc_tensor_t *t, int64_t c)
{
    char buf[160];
    if (!t)
        return ghc_error_set(vae->core, GHC_EINVAL, "wanvae: %s: %s is NULL", op, what);
    ghc_tensor_describe(t, buf, sizeof(buf));
    if (ghc_tensor_ndim(t) != 4 || ghc_tensor_dim(t, 0) != c)
        return ghc_error_set(vae->core, GHC_EINVAL, "wanvae: %s: %s is %s, expected [%lld, %s]", op, what, buf,
                             (long long)c, c == 3 ? "F, H, W]" : "T, h, w]");
    if (ghc_tensor_dtype(t) != GHC_DTYPE_F32 && ghc_tensor_dtype(t) != GHC_DTYPE_BF16)
        return ghc_error_set(vae->core, GHC_EINVAL, "wanvae: %s: %s is %s, expected F32 or BF16", op, what, buf);
    if (ghc_tensor_device(t) != vae->device)
        return ghc_error_set(vae->core, GHC_EINVAL, "wanvae: %s: %s is %s, expected it on the VAE's device", op,
                             what, buf);
    if (ghc_tensor_row_stride(t) != ghc_tensor_dim(t, -1))
        return ghc_error_set(vae->core, GHC_EINVAL, "wanvae: %s: %s is a column view, expected a dense tensor", op,
                             what);
    return 0;
}

int ghc_wanvae_encode(ghc_wanvae_t *vae, const ghc_tensor_t *video, ghc_tensor_t **latent)
{
    struct run r = { 0 };
    ghc_tensor_t *v = NULL, *x = NULL, *enc = NULL, *mu = NULL;
    int rc;
    *latent = NULL;
    if ((rc = check_input(vae, "encode", "the video", video, 3)) < 0)
        return rc;
    const int64_t F = ghc_tensor_dim(video, 1), H = ghc_tensor_dim(video, 2), W = ghc_tensor_dim(video, 3);
    const int64_t z = vae->cfg.z_dim, p = vae->cfg.patch, st = 8 * p;
    if (F < 1 || (F - 1) % 4 != 0 || H < st || H % st != 0 || W < st || W % st != 0)
        return ghc_error_set(vae->core, GHC_EINVAL, "wanvae: encode: the video is [3, %lld, %lld, %lld], expected "
                             "1 + 4k frames (1, 5, 9, ..., 81) and a height and width that are multiples of %lld",
                             (long long)F, (long long)H, (long long)W, (long long)st);
    const int64_t T = 1 + (F - 1) / 4;
    TRY(run_init(&r, vae, &vae->enc));
    if (!(v = batch1(vae, video)) || !(enc = act(vae, 2 * z, T, H / st, W / st))) {
        rc = last_error(vae);
        goto out;
    }
    for (int64_t i = 0; i < T; i++) {   /* chunk 0: frame 0; chunk i: frames [1 + 4 (i - 1), 1 + 4 i) */
        const int64_t t0 = i == 0 ? 0 : 1 + 4 * (i - 1), n = i == 0 ? 1 : 4;
        if (!(x = ghc_tensor_init(vae->core, ghc_tensor_dtype(video), 5, (const int64_t[]){ 1, 3, n, H, W },
                                  vae->device, GHC_ROLE_ACTIVATIONS))) {
            rc = last_error(vae);
            goto out;
        }
        TRY(ghc_op_copy_frames(x, 0, v, t0, n, NULL));
        if (p > 1) {   /* Wan2.2: 2 x 2 patches, 12 channels */
            ghc_tensor_t *y = ghc_tensor_init(vae->core, ghc_tensor_dtype(video), 5,
                                              (const int64_t[]){ 1, 3 * p * p, n, H / p, W / p }, vae->device,
                                              GHC_ROLE_ACTIVATIONS);
            if (!y) {
                rc = last_error(vae);
                goto out;
            }
            rc = ghc_op_vae_patchify(y, x, (int32_t)p, NULL);
            swap_in(&x, y);
            if (rc < 0)
                goto out;
        }
        r.first = i == 0;
        TRY(side_fwd(&r, &vae->enc, &x));
        TRY(ghc_op_copy_frames(enc, i, x, 0, 1, NULL));
        ghc_tensor_free(x);
        x = NULL;
    }
    TRY(conv(&r, &vae->quant, enc, &mu));   /* the mean's rows of conv1 */
    TRY(ghc_op_channel_affine(mu, mu, vae->enc_scale, vae->enc_shift, NULL));
    TRY(ghc_tensor_reshape(mu, 4, (const int64_t[]){ z, T, H / st, W / st }));
    *latent = mu;
    mu = NULL;
out:
    run_free(&r);
    ghc_tensor_free(v);
    ghc_tensor_free(x);
    ghc_tensor_free(enc);
    ghc_tensor_free(mu);
    return rc;
}

int ghc_wanvae_decode(ghc_wanvae_t *vae, const ghc_tensor_t *latent, ghc_tensor_t **video)
{
    struct run r = { 0 };
    ghc_tensor_t *zv = NULL, *x = NULL, *xq = NULL, *out_ = NULL, *c = NULL;
    int rc;
    *video = NULL;
    if ((rc = check_input(vae, "decode", "the latent", latent, vae->cfg.z_dim)) < 0)
        return rc;
    const int64_t T = ghc_tensor_dim(latent, 1), h = ghc_tensor_dim(latent, 2), w = ghc_tensor_dim(latent, 3);
    if (T < 1 || h < 1 || w < 1)
        return ghc_error_set(vae->core, GHC_EINVAL, "wanvae: decode: the latent is [%lld, %lld, %lld, %lld], "
                             "expected at least one frame of at least 1 x 1", (long long)vae->cfg.z_dim, (long long)T,
                             (long long)h, (long long)w);
    const int64_t F = 1 + 4 * (T - 1), p = vae->cfg.patch, st = 8 * p;
    TRY(run_init(&r, vae, &vae->dec));
    if (!(zv = batch1(vae, latent)) || !(x = act(vae, vae->cfg.z_dim, T, h, w)) ||
        !(out_ = act(vae, 3, F, st * h, st * w))) {
        rc = last_error(vae);
        goto out;
    }
    TRY(ghc_op_channel_affine(x, zv, vae->dec_scale, vae->dec_shift, NULL));   /* denormalise */
    TRY(conv(&r, &vae->post_quant, x, &xq));
    for (int64_t i = 0, f = 0; i < T; i++) {   /* one latent frame per chunk */
        if (!(c = act(vae, vae->cfg.z_dim, 1, h, w))) {
            rc = last_error(vae);
            goto out;
        }
        TRY(ghc_op_copy_frames(c, 0, xq, i, 1, NULL));
        r.first = i == 0;
        TRY(side_fwd(&r, &vae->dec, &c));
        const int64_t n = ghc_tensor_dim(c, 2);
        if (p > 1) {   /* Wan2.2: 12 channels of 2 x 2 patches back to RGB */
            ghc_tensor_t *y = act(vae, 3, n, st * h, st * w);
            if (!y) {
                rc = last_error(vae);
                goto out;
            }
            rc = ghc_op_vae_unpatchify(y, c, (int32_t)p, NULL);
            swap_in(&c, y);
            if (rc < 0)
                goto out;
        }
        TRY(ghc_op_copy_frames(out_, f, c, 0, n, NULL));
        f += n;
        ghc_tensor_free(c);
        c = NULL;
    }
    TRY(ghc_op_clamp(out_, out_, -1.0f, 1.0f, NULL));
    TRY(ghc_tensor_reshape(out_, 4, (const int64_t[]){ 3, F, st * h, st * w }));
    *video = out_;
    out_ = NULL;
out:
    run_free(&r);
    ghc_tensor_free(zv);
    ghc_tensor_free(x);
    ghc_tensor_free(xq);
    ghc_tensor_free(c);
    ghc_tensor_free(out_);
    return rc;
}

/* ---- life cycle --------------------------------------------------------------------------------- */

ghc_wanvae_t *ghc_wanvae_init(ghc_core_t *core, const char *path, const struct ghc_wanvae_opts *opts)
{
    ghc_wanvae_t *vae = calloc(1, sizeof(*vae));
    if (!vae) {
        ghc_error_set(core, GHC_ENOMEM, "wanvae: out of memory");
        return NULL;
    }
    vae->core = core;
    vae->device = opts ? opts->device : GHC_DEVICE_CPU;
    if (wv_load(vae, path, opts ? opts->random : NULL, opts ? opts->seed : 0) < 0) {
        ghc_wanvae_free(vae);
        return NULL;
    }
    return vae;
}

void ghc_wanvae_free(ghc_wanvae_t *vae)
{
    if (!vae)
        return;
    for (int i = vae->n_owned - 1; i >= 0; i--)
        ghc_tensor_free(vae->owned[i]);
    free(vae->owned);
    free(vae->enc.layers);
    free(vae->dec.layers);
    free(vae);
}

const struct ghc_wanvae_config *ghc_wanvae_config(const ghc_wanvae_t *vae) { return &vae->cfg; }

/* Slots per conv: a k3 conv keeps 2 frames of its input, downsample3d's time_conv 1 (after the
 * spatial halving), upsample3d's 2 (before the doubling); followed through the layout of
 * load.c's encoder() and decoder() at each stage's resolution (Wan2.2: from H / 2 x W / 2). */
uint64_t ghc_wanvae_cache_bytes(const struct ghc_wanvae_config *g, bool decoder, int64_t H, int64_t W)
{
    const int64_t R = g->num_res_blocks, b = g->base_dim, p = g->patch > 0 ? g->patch : 1;
    const bool v22 = g->version == 22;
    uint64_t n = 0;
    int64_t px = decoder ? (H / (8 * p)) * (W / (8 * p)) : (H / p) * (W / p);   /* pixels per frame here */
#define KEEP(c, frames) (n += (uint64_t)((c) * (frames) * px))
    if (!decoder) {
        int64_t ci = b;
        KEEP(3 * p * p, 2);
        for (int i = 0; i < 4; i++) {
            const int64_t co = b * g->dim_mult[i];
            for (int64_t j = 0; j < R; j++, ci = co)
                KEEP(ci + co, 2);
            if (i == 3)
                break;
            px /= 4;
            if (g->temporal_down[i])
                KEEP(co, 1);
        }
        KEEP(4 * ci, 2);   /* middle: two blocks, two convs each */
        KEEP(ci, 2);       /* head */
    } else {
        const int64_t d = g->dec_base_dim;
        const int64_t dims[5] = { d * g->dim_mult[3], d * g->dim_mult[3], d * g->dim_mult[2], d * g->dim_mult[1],
                                  d * g->dim_mult[0] };
        int64_t co = dims[0];
        KEEP(g->z_dim, 2);
        KEEP(4 * dims[0], 2);
        for (int i = 0; i < 4; i++) {
            int64_t ci = i == 0 || v22 ? dims[i] : dims[i] / 2;
            co = dims[i + 1];
            for (int64_t j = 0; j <= R; j++, ci = co)
                KEEP(ci + co, 2);
            if (i == 3)
                break;
            if (g->temporal_down[2 - i])
                KEEP(co, 2);
            px *= 4;
        }
        KEEP(co, 2);
    }
#undef KEEP
    return n * sizeof(float);
}
