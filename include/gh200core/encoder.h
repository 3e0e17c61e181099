/* encoder.h: the encoder plugin kinds (since API 16): a `vae` turns clips into the model's
 * latents (and back), a `text_encoder` turns captions into text embeddings. `gh200core prepare`
 * runs them over the media of the `data` section to make the caches the trainer reads
 * (doc/prepare.md). Their instances are made when first asked for (ghc_vae_get,
 * ghc_text_encoder_get), not by ghc_run_init: a training run whose caches exist never loads
 * an encoder's weights. Tensors in and out are f32 on the CPU; a plugin computes where it
 * likes in between. */
#ifndef GHC_ENCODER_H
#define GHC_ENCODER_H

#include <gh200core/core.h>     /* defines: ghc_core_t, ghc_cfg_t, struct ghc_cfg_key */
#include <gh200core/tensor.h>   /* defines: ghc_tensor_t */

GHC_BEGIN_DECLS

/* ---- the VAE -------------------------------------------------------------------------------- */

/* What a VAE makes of a clip. The caller sets struct_size = sizeof(struct ghc_vae_info) and
 * zeroes the rest; the plugin fills at most struct_size bytes. */
struct ghc_vae_info {
    uint32_t struct_size;
    int64_t  z_dim;       /* latent channels (Wan2.1: 16, Wan2.2: 48) */
    int64_t  t_stride;    /* a clip of F = 1 + t_stride k frames has 1 + k latent frames (4) */
    int64_t  s_stride;    /* pixels per latent row and column (Wan2.1: 8, Wan2.2: 16) */
    char     summary[64]; /* for people: "Wan2.1 VAE (z 16)" */
};

struct ghc_vae_ops {
    uint32_t struct_size;                 /* required: sizeof(struct ghc_vae_ops) */
    const char *name;                     /* required */
    const struct ghc_cfg_key *keys;       /* optional: keys of the [vae] section */
    /* required; once, when the VAE is first asked for. */
    int (*init)(ghc_core_t *core, ghc_cfg_t *cfg, void **self);
    /* required */
    int (*info)(void *self, struct ghc_vae_info *out);
    /* required; video [3, F, H, W] f32 RGB in [-1, 1] on the CPU, F = 1 + t_stride k, H and W
     * multiples of s_stride: *latent a new f32 CPU tensor [z_dim, 1 + k, H / s, W / s], the
     * normalised posterior mean (what the model trains on), which the caller frees. */
    int (*encode)(void *self, const ghc_tensor_t *video, ghc_tensor_t **latent);
    /* optional; the inverse: latent [z_dim, T, h, w] to a new f32 CPU clip in [-1, 1]. */
    int (*decode)(void *self, const ghc_tensor_t *latent, ghc_tensor_t **video);
    /* optional; once, last. */
    void (*free)(void *self);
};

typedef struct ghc_vae ghc_vae_t;

/* The run's VAE, made from the configuration's `vae` section on the first call (NULL with
 * the reason in ghc_error_message when there is no such section or its plugin fails). */
GHC_API ghc_vae_t *ghc_vae_get(ghc_core_t *core);
GHC_API int ghc_vae_info(ghc_vae_t *vae, struct ghc_vae_info *out);
/* Check video's shape against the VAE's strides, then encode (GHC_EINVAL naming the shape). */
GHC_API int ghc_vae_encode(ghc_vae_t *vae, const ghc_tensor_t *video, ghc_tensor_t **latent);
/* GHC_EUNSUPPORTED where the plugin has no decoder. */
GHC_API int ghc_vae_decode(ghc_vae_t *vae, const ghc_tensor_t *latent, ghc_tensor_t **video);

/* ---- the text encoder ------------------------------------------------------------------------ */

/* The caller sets struct_size and zeroes the rest; the plugin fills at most struct_size bytes. */
struct ghc_text_encoder_info {
    uint32_t struct_size;
    int64_t  dim;         /* embedding width (umT5-XXL: 4096) */
    int32_t  max_len;     /* rows at most, the end of text included (Wan: 512) */
    char     summary[64]; /* for people: "umT5-XXL" */
};

struct ghc_text_encoder_ops {
    uint32_t struct_size;                 /* required: sizeof(struct ghc_text_encoder_ops) */
    const char *name;                     /* required */
    const struct ghc_cfg_key *keys;       /* optional: keys of the [text_encoder] section */
    /* required; once, when the text encoder is first asked for. */
    int (*init)(ghc_core_t *core, ghc_cfg_t *cfg, void **self);
    /* required */
    int (*info)(void *self, struct ghc_text_encoder_info *out);
    /* required; text: a caption in UTF-8 ("" is the empty prompt): *embed a new f32 CPU tensor
     * [L, dim], L >= 1 its true length (padding trimmed), which the caller frees. */
    int (*encode)(void *self, const char *text, ghc_tensor_t **embed);
    /* optional; once, last. */
    void (*free)(void *self);
};

typedef struct ghc_text_encoder ghc_text_encoder_t;

/* The run's text encoder from the `text_encoder` section, made on the first call (as
 * ghc_vae_get). */
GHC_API ghc_text_encoder_t *ghc_text_encoder_get(ghc_core_t *core);
GHC_API int ghc_text_encoder_info(ghc_text_encoder_t *te, struct ghc_text_encoder_info *out);
GHC_API int ghc_text_encoder_encode(ghc_text_encoder_t *te, const char *text, ghc_tensor_t **embed);

GHC_END_DECLS

#endif /* GHC_ENCODER_H */
