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
 * Activations are [1, C, T, H, W] tensors in the VAE's dtype (f32 or bf16) on its device, each freed
 * as soon as the next one exists; clips and latents from the CPU are copied to the device and
 * the results back (as f32). */
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
    return ghc_tensor_init(vae->core, vae->dtype, 5, (const int64_t[]){ 1, c, t, h, w }, vae->device,
                           GHC_ROLE_ENCODER_ACTIVATIONS);
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
                             r->vae->device, GHC_ROLE_ENCODER_ACTIVATIONS);
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

/* y = conv c of x (with its cache slot, which then takes x's last frames), plus res where not
 * NULL (a residual connection, added in the convolution's last pass). */
static int conv(struct run *r, const struct wv_conv *c, const ghc_tensor_t *x, const ghc_tensor_t *res,
                ghc_tensor_t **y)
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
    rc = res ? ghc_op_conv3d_add(*y, x, s, c->w, c->b, res, g, NULL) : ghc_op_conv3d(*y, x, s, c->w, c->b, g, NULL);
    if (rc == 0 && s)
        rc = remember(s, x);
    if (rc < 0) {
        ghc_tensor_free(*y);
        *y = NULL;
    }
    return rc;
}

/* y = SiLU(RMS(x) gamma), then the causal conv c (+ res where not NULL): the pre-activation
 * part of a residual block and of the heads. */
static int norm_silu_conv(struct run *r, const ghc_tensor_t *gamma, const struct wv_conv *c, const ghc_tensor_t *x,
                          const ghc_tensor_t *res, ghc_tensor_t **y)
{
    ghc_tensor_t *t = ghc_tensor_init(r->vae->core, r->vae->dtype, 5, ghc_tensor_shape(x), r->vae->device,
                                      GHC_ROLE_ENCODER_ACTIVATIONS);
    int rc = t ? 0 : last_error(r->vae);
    *y = NULL;
    if (rc == 0 && (rc = ghc_op_channel_rmsnorm_silu(t, x, gamma, NULL)) == 0)
        rc = conv(r, c, t, res, y);
    ghc_tensor_free(t);
    return rc;
}

static int rb_fwd(struct run *r, const struct wv_rb *b, ghc_tensor_t **x)
{
    ghc_tensor_t *h = NULL, *t = NULL, *y = NULL;
    int rc;
    if (b->has_sc)
        TRY(conv(r, &b->sc, *x, NULL, &h));
    TRY(norm_silu_conv(r, b->g1, &b->c1, *x, NULL, &t));
    TRY(norm_silu_conv(r, b->g2, &b->c2, t, h ? h : *x, &y));   /* + the shortcut */
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
    TRY(conv(r, &a->qkv, t, NULL, &qkv));
    TRY(ghc_op_frame_attention(t, qkv, (float)(1.0 / sqrt((double)C)), NULL));
    TRY(conv(r, &a->proj, t, *x, &y));   /* + the block's input */
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
    TRY(conv(r, &rs->time, *x, NULL, &y2));
    if (!(y = act(vae, C, 2 * T, H, W))) {
        rc = last_error(vae);
        goto out;
    }
    for (int s = 0; s < 2; s++)   /* channel halves of a [1, 2C, ...] tensor are contiguous */
        if (!(half[s] = ghc_tensor_wrap(vae->core, ghc_tensor_dtype(y2), 5, (const int64_t[]){ 1, C, T, H, W },
                                        vae->device, (char *)ghc_tensor_data(y2) + (size_t)(s * C * T * H * W) *
                                                         ghc_dtype_size(ghc_tensor_dtype(y2))))) {
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
    TRY(conv(r, &rs->conv, *x, NULL, &y));
    swap_in(x, y);
    y = NULL;
    if (rs->mode == WV_DOWN3D) {
        if (!r->primed[rs->time.slot]) {   /* first chunk: frame 0 passes, and is remembered */
            ghc_tensor_t *s = slot(r, &rs->time, *x);
            r->primed[rs->time.slot] = true;
            rc = s ? remember(s, *x) : last_error(vae);
        } else {
            TRY(conv(r, &rs->time, *x, NULL, &y));
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
    TRY(conv(r, &s->conv_in, *x, NULL, &y));
    swap_in(x, y);
    y = NULL;
    if (dec)
        TRY(middle_fwd(r, s, x));
    for (int i = 0; i < s->n_layers; i++)
        TRY(layer_fwd(r, &s->layers[i], x));
    if (!dec)
        TRY(middle_fwd(r, s, x));
    TRY(norm_silu_conv(r, s->head_g, &s->head, *x, NULL, &y));
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
    if (ghc_tensor_device(t) != vae->device && ghc_tensor_device(t) != GHC_DEVICE_CPU)
        return ghc_error_set(vae->core, GHC_EINVAL, "wanvae: %s: %s is %s, expected it on the CPU or the VAE's "
                             "device", op, what, buf);
    if (ghc_tensor_row_stride(t) != ghc_tensor_dim(t, -1))
        return ghc_error_set(vae->core, GHC_EINVAL, "wanvae: %s: %s is a column view, expected a dense tensor", op,
                             what);
    return 0;
}

/* t on the VAE's device: t itself, or a copy of a CPU tensor (*copy, which the caller frees).
 * NULL: ENOMEM or a failed copy (message set). */
static const ghc_tensor_t *on_device(ghc_wanvae_t *vae, const ghc_tensor_t *t, ghc_tensor_t **copy)
{
    *copy = NULL;
    if (ghc_tensor_device(t) == vae->device)
        return t;
    ghc_tensor_t *d = ghc_tensor_init(vae->core, ghc_tensor_dtype(t), ghc_tensor_ndim(t), ghc_tensor_shape(t),
                                      vae->device, GHC_ROLE_ENCODER_ACTIVATIONS);
    if (!d || ghc_op_copy(d, t, NULL) < 0) {
        ghc_tensor_free(d);
        return NULL;
    }
    return *copy = d;
}

/* *t (the VAE's dtype and device) as a new f32 tensor of shape [d0, d1, d2, d3] on `device`
 * (role), replacing *t; the stream is done when a CPU result returns. */
static int to_result(ghc_wanvae_t *vae, ghc_tensor_t **t, int device, enum ghc_mem_role role, const int64_t shape[4])
{
    int rc = ghc_tensor_reshape(*t, 4, shape);
    if (rc < 0)
        return rc;
    if (vae->dtype != GHC_DTYPE_F32) {
        ghc_tensor_t *f = ghc_tensor_init(vae->core, GHC_DTYPE_F32, 4, shape, vae->device, role);
        if (!f || (rc = ghc_op_cast(f, *t, 1.0f, NULL, NULL)) < 0) {
            ghc_tensor_free(f);
            return f ? rc : last_error(vae);
        }
        swap_in(t, f);
    }
    if (device != vae->device) {
        ghc_tensor_t *h = ghc_tensor_init(vae->core, GHC_DTYPE_F32, 4, shape, device, role);
        if (!h || (rc = ghc_op_copy(h, *t, NULL)) < 0 || (rc = ghc_op_sync(vae->core, vae->device, NULL)) < 0) {
            ghc_tensor_free(h);
            return h ? rc : last_error(vae);
        }
        swap_in(t, h);
    }
    return 0;
}

/* x (a chunk in the input's dtype) in the VAE's dtype, replacing it. */
static int to_dtype(ghc_wanvae_t *vae, ghc_tensor_t **x)
{
    if (ghc_tensor_dtype(*x) == vae->dtype)
        return 0;
    ghc_tensor_t *y = ghc_tensor_init(vae->core, vae->dtype, 5, ghc_tensor_shape(*x), vae->device,
                                      GHC_ROLE_ENCODER_ACTIVATIONS);
    int rc = y ? ghc_op_cast(y, *x, 1.0f, NULL, NULL) : last_error(vae);
    if (rc < 0) {
        ghc_tensor_free(y);
        return rc;
    }
    swap_in(x, y);
    return 0;
}

static int encode_whole(ghc_wanvae_t *vae, const ghc_tensor_t *video, ghc_tensor_t **latent)
{
    struct run r = { 0 };
    ghc_tensor_t *v = NULL, *x = NULL, *enc = NULL, *mu = NULL, *up = NULL;
    const ghc_tensor_t *dv;
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
    if (!(dv = on_device(vae, video, &up)) || !(v = batch1(vae, dv)) || !(enc = act(vae, 2 * z, T, H / st, W / st))) {
        rc = last_error(vae);
        goto out;
    }
    for (int64_t i = 0; i < T; i++) {   /* chunk 0: frame 0; chunk i: frames [1 + 4 (i - 1), 1 + 4 i) */
        const int64_t t0 = i == 0 ? 0 : 1 + 4 * (i - 1), n = i == 0 ? 1 : 4;
        if (!(x = ghc_tensor_init(vae->core, ghc_tensor_dtype(video), 5, (const int64_t[]){ 1, 3, n, H, W },
                                  vae->device, GHC_ROLE_ENCODER_ACTIVATIONS))) {
            rc = last_error(vae);
            goto out;
        }
        TRY(ghc_op_copy_frames(x, 0, v, t0, n, NULL));
        TRY(to_dtype(vae, &x));
        if (p > 1) {   /* Wan2.2: 2 x 2 patches, 12 channels */
            ghc_tensor_t *y = act(vae, 3 * p * p, n, H / p, W / p);
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
    TRY(conv(&r, &vae->quant, enc, NULL, &mu));   /* the mean's rows of conv1 */
    TRY(ghc_op_channel_affine(mu, mu, vae->enc_scale, vae->enc_shift, NULL));
    TRY(to_result(vae, &mu, ghc_tensor_device(video), GHC_ROLE_LATENTS, (const int64_t[]){ z, T, H / st, W / st }));
    *latent = mu;
    mu = NULL;
out:
    run_free(&r);
    ghc_tensor_free(v);
    ghc_tensor_free(up);
    ghc_tensor_free(x);
    ghc_tensor_free(enc);
    ghc_tensor_free(mu);
    return rc;
}

/* raw: a tile of a tiled decode, left as the decoder made it (Wan2.2: 3 p p channels of patches,
 * [3 p p, F, 8 h, 8 w]) and unclamped: the tiles are blended in patch space, then unpatchified
 * and clamped once joined. */
static int decode_whole(ghc_wanvae_t *vae, const ghc_tensor_t *latent, ghc_tensor_t **video, bool raw)
{
    struct run r = { 0 };
    ghc_tensor_t *zv = NULL, *x = NULL, *xq = NULL, *out_ = NULL, *c = NULL, *up = NULL;
    const ghc_tensor_t *dz;
    int rc;
    *video = NULL;
    if ((rc = check_input(vae, "decode", "the latent", latent, vae->cfg.z_dim)) < 0)
        return rc;
    const int64_t T = ghc_tensor_dim(latent, 1), h = ghc_tensor_dim(latent, 2), w = ghc_tensor_dim(latent, 3);
    if (T < 1 || h < 1 || w < 1)
        return ghc_error_set(vae->core, GHC_EINVAL, "wanvae: decode: the latent is [%lld, %lld, %lld, %lld], "
                             "expected at least one frame of at least 1 x 1", (long long)vae->cfg.z_dim, (long long)T,
                             (long long)h, (long long)w);
    const int64_t F = 1 + 4 * (T - 1), p = raw ? 1 : vae->cfg.patch, st = 8 * p;
    const int64_t co = raw ? 3 * vae->cfg.patch * vae->cfg.patch : 3;
    TRY(run_init(&r, vae, &vae->dec));
    if (!(dz = on_device(vae, latent, &up)) || !(zv = batch1(vae, dz)) || !(x = act(vae, vae->cfg.z_dim, T, h, w)) ||
        !(out_ = act(vae, co, F, st * h, st * w))) {
        rc = last_error(vae);
        goto out;
    }
    TRY(ghc_op_channel_affine(x, zv, vae->dec_scale, vae->dec_shift, NULL));   /* denormalise */
    TRY(conv(&r, &vae->post_quant, x, NULL, &xq));
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
    if (!raw)
        TRY(ghc_op_clamp(out_, out_, -1.0f, 1.0f, NULL));
    TRY(to_result(vae, &out_, ghc_tensor_device(latent), GHC_ROLE_ENCODER_ACTIVATIONS,
                  (const int64_t[]){ co, F, st * h, st * w }));
    *video = out_;
    out_ = NULL;
out:
    run_free(&r);
    ghc_tensor_free(zv);
    ghc_tensor_free(up);
    ghc_tensor_free(x);
    ghc_tensor_free(xq);
    ghc_tensor_free(c);
    ghc_tensor_free(out_);
    return rc;
}

/* ---- spatial tiling (diffusers' tiled_encode / tiled_decode) ------------------------------------ */

/* A new host f32 tensor [C, F, h, w] with rows [i, i + h) and columns [j, j + w) of t (host f32
 * [C, F, H, W]). NULL: ENOMEM (message set). */
static ghc_tensor_t *crop(ghc_wanvae_t *vae, const ghc_tensor_t *t, int64_t i, int64_t j, int64_t h, int64_t w)
{
    const int64_t C = ghc_tensor_dim(t, 0), F = ghc_tensor_dim(t, 1), H = ghc_tensor_dim(t, 2), W = ghc_tensor_dim(t, 3);
    ghc_tensor_t *o = ghc_tensor_init(vae->core, GHC_DTYPE_F32, 4, (const int64_t[]){ C, F, h, w }, GHC_DEVICE_CPU,
                                      GHC_ROLE_ENCODER_ACTIVATIONS);
    if (!o)
        return NULL;
    const float *src = ghc_tensor_cdata(t);
    float *dst = ghc_tensor_data(o);
    for (int64_t p = 0; p < C * F; p++)
        for (int64_t y = 0; y < h; y++)
            memcpy(dst + (p * h + y) * w, src + (p * H + i + y) * W + j, (size_t)w * sizeof(float));
    return o;
}

/* diffusers' blend_v (vertical) or blend_h, in place: the first e rows (columns) of b, e = min(a's,
 * b's, extent), become a's last e ones times (1 - k / e) plus b's times k / e, the weights
 * rounded to f32 as PyTorch takes a Python float. a and b host f32 [C, F, h, w] of one column
 * (vertical: the same widths) or one row of tiles (the same heights). */
static void blend(const ghc_tensor_t *a, ghc_tensor_t *b, int64_t extent, bool vertical)
{
    const int d = vertical ? 2 : 3;
    const int64_t planes = ghc_tensor_dim(b, 0) * ghc_tensor_dim(b, 1);
    const int64_t ah = ghc_tensor_dim(a, 2), aw = ghc_tensor_dim(a, 3), bh = ghc_tensor_dim(b, 2), bw = ghc_tensor_dim(b, 3);
    int64_t e = extent < ghc_tensor_dim(a, d) ? extent : ghc_tensor_dim(a, d);
    e = e < ghc_tensor_dim(b, d) ? e : ghc_tensor_dim(b, d);
    const float *pa = ghc_tensor_cdata(a);
    float *pb = ghc_tensor_data(b);
    for (int64_t k = 0; k < e; k++) {
        const float wa = (float)(1.0 - (double)k / (double)e), wb = (float)((double)k / (double)e);
        for (int64_t p = 0; p < planes; p++) {
            if (vertical) {
                const float *ra = pa + (p * ah + ah - e + k) * aw;
                float *rb = pb + (p * bh + k) * bw;
                for (int64_t x = 0; x < bw; x++)
                    rb[x] = ra[x] * wa + rb[x] * wb;
            } else {
                for (int64_t y = 0; y < bh; y++) {
                    float *v = pb + (p * bh + y) * bw + k;
                    *v = pa[(p * ah + y) * aw + aw - e + k] * wa + *v * wb;
                }
            }
        }
    }
}

/* t as a host f32 tensor: itself, or a copy in *own (freed by the caller). NULL on failure. */
static const ghc_tensor_t *host_f32(ghc_wanvae_t *vae, const ghc_tensor_t *t, ghc_tensor_t **own)
{
    *own = NULL;
    if (ghc_tensor_device(t) == GHC_DEVICE_CPU && ghc_tensor_dtype(t) == GHC_DTYPE_F32)
        return t;
    ghc_tensor_t *h = ghc_tensor_init(vae->core, ghc_tensor_dtype(t), 4, ghc_tensor_shape(t), GHC_DEVICE_CPU,
                                      GHC_ROLE_ENCODER_ACTIVATIONS);
    if (!h || ghc_op_copy(h, t, NULL) < 0 || ghc_op_sync(vae->core, ghc_tensor_device(t), NULL) < 0) {
        ghc_tensor_free(h);
        return NULL;
    }
    if (ghc_tensor_dtype(h) != GHC_DTYPE_F32) {
        ghc_tensor_t *f = ghc_tensor_init(vae->core, GHC_DTYPE_F32, 4, ghc_tensor_shape(t), GHC_DEVICE_CPU,
                                          GHC_ROLE_ENCODER_ACTIVATIONS);
        if (!f || ghc_op_cast(f, h, 1.0f, NULL, NULL) < 0) {
            ghc_tensor_free(f);
            ghc_tensor_free(h);
            return NULL;
        }
        swap_in(&h, f);
    }
    return *own = h;
}

/* *t (host f32 [3 p p, F, h, w], patches) as the clip [3, F, p h, p w], replacing it. */
static int unpatchify_host(ghc_wanvae_t *vae, ghc_tensor_t **t)
{
    const int64_t p = vae->cfg.patch, F = ghc_tensor_dim(*t, 1), h = ghc_tensor_dim(*t, 2), w = ghc_tensor_dim(*t, 3);
    ghc_tensor_t *y = ghc_tensor_init(vae->core, GHC_DTYPE_F32, 5, (const int64_t[]){ 1, 3, F, p * h, p * w },
                                      GHC_DEVICE_CPU, ghc_tensor_role(*t));
    int rc = y ? ghc_tensor_reshape(*t, 5, (const int64_t[]){ 1, 3 * p * p, F, h, w }) : last_error(vae);
    if (rc == 0 && (rc = ghc_op_vae_unpatchify(y, *t, (int32_t)p, NULL)) == 0)
        rc = ghc_tensor_reshape(y, 4, (const int64_t[]){ 3, F, p * h, p * w });
    if (rc < 0) {
        ghc_tensor_free(y);
        return rc;
    }
    swap_in(t, y);
    return 0;
}

/* Encode (dec false: x a clip [3, F, H, W]) or decode (x a latent [z, T, h, w]) in tiles, as
 * diffusers' tiled_encode / tiled_decode. With p the patch size (1, or 2 for the Wan2.2 VAE) and
 * tile, tile_stride as given to diffusers' enable_tiling: encoding cuts the clip into tiles of p
 * tile pixels every p tile_stride (diffusers cuts the patchified clip into tiles of tile every
 * tile_stride: the same pixels), decoding cuts the latent into tiles of tile / 8p every
 * tile_stride / 8p. Each tile runs whole with its own feature cache (decoded raw: in patch space,
 * unclamped); the tiles are blended in place in order (with the tile above, then with the one to
 * the left) over (tile - tile_stride) / 8 latent elements or (tile - tile_stride) / p patch-space
 * pixels, cropped to tile_stride / 8 or tile_stride / p and joined on the host; a decode is then
 * unpatchified and clamped. The result is on x's device. */
static int run_tiled(ghc_wanvae_t *vae, const ghc_tensor_t *x, bool dec, ghc_tensor_t **out)
{
    const int64_t p = vae->cfg.patch;
    const int64_t tmin = dec ? vae->tile / (8 * p) : p * vae->tile, tstep = dec ? vae->tile_stride / (8 * p)
                                                                              : p * vae->tile_stride;
    const int64_t ostep = dec ? vae->tile_stride / p : vae->tile_stride / 8;
    const int64_t extent = dec ? (vae->tile - vae->tile_stride) / p : (vae->tile - vae->tile_stride) / 8;
    const int64_t H = ghc_tensor_dim(x, 2), W = ghc_tensor_dim(x, 3);
    const int64_t rows = (H + tstep - 1) / tstep, cols = (W + tstep - 1) / tstep;
    const int64_t OH = dec ? H * 8 : H / (8 * p), OW = dec ? W * 8 : W / (8 * p);   /* decode: patch space */
    ghc_tensor_t *own = NULL, **grid = calloc((size_t)(rows * cols), sizeof(*grid)), *res = NULL;
    const ghc_tensor_t *hx = grid ? host_f32(vae, x, &own) : NULL;
    int rc = grid && hx ? 0 : last_error(vae);
    for (int64_t r = 0; r < rows && rc == 0; r++)
        for (int64_t c = 0; c < cols && rc == 0; c++) {
            const int64_t i = r * tstep, j = c * tstep;
            ghc_tensor_t *t = crop(vae, hx, i, j, H - i < tmin ? H - i : tmin, W - j < tmin ? W - j : tmin);
            rc = !t ? last_error(vae) : dec ? decode_whole(vae, t, &grid[r * cols + c], true)
                                            : encode_whole(vae, t, &grid[r * cols + c]);
            ghc_tensor_free(t);
        }
    if (rc == 0 && !(res = ghc_tensor_init(vae->core, GHC_DTYPE_F32, 4,
                                           (const int64_t[]){ ghc_tensor_dim(grid[0], 0), ghc_tensor_dim(grid[0], 1),
                                                              OH, OW },
                                           GHC_DEVICE_CPU, dec ? GHC_ROLE_ENCODER_ACTIVATIONS : GHC_ROLE_LATENTS)))
        rc = last_error(vae);
    for (int64_t r = 0; r < rows && rc == 0; r++)
        for (int64_t c = 0; c < cols; c++) {
            ghc_tensor_t *t = grid[r * cols + c];
            if (r > 0)
                blend(grid[(r - 1) * cols + c], t, extent, true);
            if (c > 0)
                blend(grid[r * cols + c - 1], t, extent, false);
            const int64_t planes = ghc_tensor_dim(t, 0) * ghc_tensor_dim(t, 1), th = ghc_tensor_dim(t, 2),
                          tw = ghc_tensor_dim(t, 3), y0 = r * ostep, x0 = c * ostep;
            const int64_t hh = th < ostep ? th : ostep, ww = tw < ostep ? tw : ostep;
            for (int64_t q = 0; q < planes; q++)
                for (int64_t y = 0; y < hh && y0 + y < OH; y++)
                    memcpy((float *)ghc_tensor_data(res) + (q * OH + y0 + y) * OW + x0,
                           (const float *)ghc_tensor_cdata(t) + (q * th + y) * tw,
                           (size_t)(x0 + ww <= OW ? ww : OW - x0) * sizeof(float));
        }
    if (rc == 0 && dec && p > 1)
        rc = unpatchify_host(vae, &res);
    if (rc == 0 && dec)
        rc = ghc_op_clamp(res, res, -1.0f, 1.0f, NULL);
    if (rc == 0 && ghc_tensor_device(x) != GHC_DEVICE_CPU) {   /* back to x's device */
        ghc_tensor_t *d = ghc_tensor_init(vae->core, GHC_DTYPE_F32, 4, ghc_tensor_shape(res), ghc_tensor_device(x),
                                          ghc_tensor_role(res));
        rc = d ? ghc_op_copy(d, res, NULL) : last_error(vae);
        if (rc == 0)
            rc = ghc_op_sync(vae->core, ghc_tensor_device(x), NULL);
        swap_in(&res, d);
    }
    for (int64_t k = 0; grid && k < rows * cols; k++)
        ghc_tensor_free(grid[k]);
    free(grid);
    ghc_tensor_free(own);
    if (rc < 0) {
        ghc_tensor_free(res);
        res = NULL;
    }
    *out = res;
    return rc;
}

int ghc_wanvae_encode(ghc_wanvae_t *vae, const ghc_tensor_t *video, ghc_tensor_t **latent)
{
    *latent = NULL;
    int rc = check_input(vae, "encode", "the video", video, 3);
    if (rc < 0)
        return rc;
    const int64_t H = ghc_tensor_dim(video, 2), W = ghc_tensor_dim(video, 3), st = 8 * vae->cfg.patch;
    if (vae->tile && (H > vae->tile || W > vae->tile) && H % st == 0 && W % st == 0)   /* as diffusers: pixels */
        return run_tiled(vae, video, false, latent);
    return encode_whole(vae, video, latent);   /* (also where the shape is wrong: its message) */
}

int ghc_wanvae_decode(ghc_wanvae_t *vae, const ghc_tensor_t *latent, ghc_tensor_t **video)
{
    *video = NULL;
    int rc = check_input(vae, "decode", "the latent", latent, vae->cfg.z_dim);
    if (rc < 0)
        return rc;
    const int64_t tl = vae->tile / (8 * vae->cfg.patch);   /* the tile in latent elements */
    if (vae->tile && (ghc_tensor_dim(latent, 2) > tl || ghc_tensor_dim(latent, 3) > tl))
        return run_tiled(vae, latent, true, video);
    return decode_whole(vae, latent, video, false);
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
    vae->dtype = opts ? opts->dtype : GHC_DTYPE_F32;
    vae->tile = opts ? opts->tile : 0;
    vae->tile_stride = opts ? opts->tile_stride : 0;
    int rc = 0;
    if (vae->dtype != GHC_DTYPE_F32 && vae->dtype != GHC_DTYPE_BF16)
        rc = ghc_error_set(core, GHC_EINVAL, "wanvae: %s: activations in %s, expected F32 or BF16", path,
                           ghc_dtype_name(vae->dtype));
    else if ((rc = wv_load(vae, path, opts ? opts->random : NULL, opts ? opts->seed : 0)) == 0 && vae->tile) {
        const int64_t m = 8 * vae->cfg.patch;   /* tiles are whole latent elements: 8, 16 for Wan2.2 */
        if (!vae->tile_stride)
            vae->tile_stride = vae->tile * 3 / 4 / m * m > m ? vae->tile * 3 / 4 / m * m : m;
        if (vae->tile < 0 || vae->tile % m || vae->tile_stride % m || vae->tile_stride < m ||
            vae->tile_stride > vae->tile)
            rc = ghc_error_set(core, GHC_EINVAL, "wanvae: %s: tiles of %lld pixels every %lld, expected multiples of "
                               "%lld (the Wan%s VAE's stride) with %lld <= stride <= tile", path, (long long)vae->tile,
                               (long long)vae->tile_stride, (long long)m, vae->cfg.patch > 1 ? "2.2" : "2.1",
                               (long long)m);
    }
    if (rc < 0) {
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
