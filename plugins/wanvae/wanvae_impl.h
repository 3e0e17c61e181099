/* wanvae_impl.h: the Wan VAEs' insides, shared by load.c (names, configuration, weights) and
 * wanvae.c (encode, decode, the feature cache). Layers follow the official module tree (spec
 * encoders.md 2.3-2.6, 3.3-3.5); every weight is f32 on the VAE's device, conv weights 5-D;
 * activations are in the VAE's dtype (f32 or bf16). */
#ifndef GHC_WANVAE_IMPL_H
#define GHC_WANVAE_IMPL_H

#include <gh200core/ops.h>

#include "wanvae.h"

/* A convolution and, for a causal one with front frames, its feature-cache slot. */
struct wv_conv {
    ghc_tensor_t     *w, *b;   /* w [Co, Ci, kT, kH, kW] (Conv2d weights get kT = 1), b [Co] */
    struct ghc_conv3d geo;
    int               slot;    /* index into the run's cache, -1: none */
};

/* ResidualBlock: shortcut (1x1x1 when the widths differ), RMS, SiLU, k3 conv, twice. */
struct wv_rb {
    ghc_tensor_t  *g1, *g2;
    struct wv_conv c1, c2, sc;
    bool           has_sc;
};

enum wv_mode { WV_DOWN2D, WV_DOWN3D, WV_UP2D, WV_UP3D };

/* Resample: the per-frame Conv2d, and for the 3-D modes the time_conv with its slot. */
struct wv_resample {
    enum wv_mode   mode;
    struct wv_conv conv, time;
};

/* The middle blocks' single-head attention. */
struct wv_attn {
    ghc_tensor_t  *gamma;
    struct wv_conv qkv, proj;
};

/* A layer of a side's flat list. A Wan2.2 stage is [SAVE, blocks, resample, AVG_DOWN or
 * DUP_UP]: the stage's input is kept, then its shortcut added to the stage's output. */
enum wv_kind { WV_RB, WV_RESAMPLE, WV_SAVE, WV_AVG_DOWN, WV_DUP_UP };

struct wv_layer {
    enum wv_kind       kind;
    struct wv_rb       rb;
    struct wv_resample rs;
    int64_t            co;        /* AVG_DOWN, DUP_UP: the shortcut's output channels */
    int32_t            ft, fs;    /* ... and its factors in time and space */
};

/* One side (encoder or decoder): stem, stages, middle, head. */
struct wv_side {
    struct wv_conv   conv_in;
    struct wv_layer *layers;
    int              n_layers;
    struct wv_rb     mid0, mid2;
    struct wv_attn   attn;
    ghc_tensor_t    *head_g;
    struct wv_conv   head;
    int              n_slots;
};

struct ghc_wanvae {
    ghc_core_t              *core;
    int                      device;
    enum ghc_dtype           dtype;        /* the activations' */
    int64_t                  tile, tile_stride;   /* spatial tiling (pixels; 0: off) */
    struct ghc_wanvae_config cfg;
    struct wv_side           enc, dec;
    struct wv_conv           quant;        /* conv1: only its first z_dim rows (the mean) */
    struct wv_conv           post_quant;   /* conv2 */
    ghc_tensor_t            *enc_scale, *enc_shift, *dec_scale, *dec_shift;   /* [z_dim] f32 */
    ghc_tensor_t           **owned;        /* every tensor above, freed with the VAE */
    int                      n_owned, cap_owned;
};

/* load.c: read the configuration and every weight of `path` into vae (core, device set); with
 * `random`, that layout's weights drawn from `seed` instead (path names it in messages).
 * Returns 0 or GHC_E* with the message set. */
int wv_load(ghc_wanvae_t *vae, const char *path, const struct ghc_wanvae_config *random, uint64_t seed);
/* Keep t with the VAE (freed by ghc_wanvae_free). Returns t, or NULL (t freed) on ENOMEM. */
ghc_tensor_t *wv_own(ghc_wanvae_t *vae, ghc_tensor_t *t);

#endif /* GHC_WANVAE_IMPL_H */
