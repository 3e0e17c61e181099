/* wanvae.h: the Wan video VAEs: Wan2.1's (z = 16, stride 4 x 8 x 8; the VAE of Wan2.2
 * T2V/I2V-A14B) and Wan2.2's (z = 48, stride 4 x 16 x 16; TI2V-5B). Loading the weights and
 * encoding clips to normalised latents / decoding latents to clips, chunk by chunk with Wan's
 * causal feature cache, through the ops of libgh200core_ops (so the same code runs wherever the
 * ops do: the CPU or a CUDA device). doc/vae.md has the user's side: files, namings, dtypes,
 * memory.
 *
 * Not installed: the module of the `wanvae` vae plugin (plugin.c). One clip
 * per call (no batch). Spatial tiling (ghc_wanvae_opts.tile; both VAEs) runs encode/decode per
 * tile with overlap and blending as diffusers does, which changes results (spec encoders.md
 * 2.9). */
#ifndef GHC_WANVAE_H
#define GHC_WANVAE_H

#include <gh200core/core.h>     /* defines: ghc_core_t, GHC_E* */
#include <gh200core/tensor.h>   /* defines: ghc_tensor_t */

GHC_BEGIN_DECLS

typedef struct ghc_wanvae ghc_wanvae_t;

/* The tensor names a checkpoint uses (doc/vae.md, "Files"). */
enum ghc_wanvae_names {
    GHC_WANVAE_NAMES_OFFICIAL = 0,   /* Wan2.x_VAE.pth's, ComfyUI's wan_2.1_vae / wan2.2_vae.safetensors */
    GHC_WANVAE_NAMES_DIFFUSERS,      /* AutoencoderKLWan: vae/diffusion_pytorch_model.safetensors */
};

/* What the loader read from the weights' shapes. Wan2.1: version 21, base_dim 96 (decoder 96),
 * dim_mult {1, 2, 4, 4}, num_res_blocks 2, temporal_down {false, true, true}, z_dim 16, patch 1.
 * Wan2.2: version 22, base_dim 160, dec_base_dim 256, the same multipliers, blocks and flags,
 * z_dim 48, patch 2. */
struct ghc_wanvae_config {
    int     version;              /* 21 or 22 */
    int64_t base_dim;             /* width of the encoder's first stage */
    int64_t dec_base_dim;         /* decoder widths = dec_base_dim * dim_mult[3, 3, 2, 1, 0] */
    int64_t patch;                /* clips enter and leave as patch x patch pixel patches (1: none) */
    int64_t dim_mult[4];          /* stage widths = base_dim * dim_mult[i] */
    int64_t num_res_blocks;       /* per encoder stage; the decoder has one more */
    bool    temporal_down[3];     /* encoder stages 0..2 halve the frames (decoder: reversed) */
    int64_t z_dim;                /* latent channels (16 or 48) */
    enum ghc_wanvae_names names;
    char    prefix[64];           /* what every tensor name starts with ("" for the usual files) */
};

/* Options of ghc_wanvae_init; NULL: the defaults (zeroed struct = CPU). */
struct ghc_wanvae_opts {
    int device;                   /* GHC_DEVICE_CPU (-1) or a CUDA ordinal: weights and activations there */
    enum ghc_dtype dtype;         /* the activations: GHC_DTYPE_F32 (0, the default) or GHC_DTYPE_BF16 */
    /* NULL, or a layout (version, base_dim, dec_base_dim, patch, dim_mult, num_res_blocks,
     * temporal_down, z_dim) whose weights are drawn from `seed` instead of read (norms 1, biases
     * 0, the rest normal with variance 1 / fan-in): the embedded demo's tiny VAE. `path` then
     * only names it in messages. */
    const struct ghc_wanvae_config *random;
    uint64_t seed;
    /* Spatial tiling as diffusers' AutoencoderKLWan.enable_tiling(tile, tile, tile_stride,
     * tile_stride): 0 off; else a clip wider or taller than `tile` pixels is encoded (a latent
     * of more than tile / s rows or columns decoded) as overlapping tiles, each with its own
     * feature cache, blended linearly over the overlap and cropped to the stride. Wan2.1: tiles
     * of tile x tile pixels every tile_stride, blended over (tile - tile_stride) / 8 latent
     * elements or tile - tile_stride pixels. Wan2.2 (patch 2), where diffusers counts these in
     * patches: the encoder's tiles are 2 tile pixels every 2 tile_stride, the decoder's tile / 16
     * latent elements every tile_stride / 16, blended over (tile - tile_stride) / 2 patch rows
     * before the patches become pixels. tile_stride 0: 3/4 of tile, rounded down to a multiple
     * of s (at least s). Multiples of s = 8 patch, s <= tile_stride <= tile (else GHC_EINVAL).
     * Bounds the activations and caches by the tile's size; changes results near the seams. */
    int64_t tile, tile_stride;
};

/* Load the VAE from `path`: a .safetensors file (or a sharded index) with official/ComfyUI or
 * diffusers names, optionally under a common prefix, tensors in f32, bf16 or f16 (kept in f32);
 * which VAE it is comes from the names and shapes. Errors (NULL, message in
 * ghc_error_message(core)): a PyTorch pickle (.pth/.pt/.ckpt) is GHC_EUNSUPPORTED naming the
 * safetensors files to use instead; a file that is no Wan VAE GHC_EFORMAT; a missing tensor
 * GHC_ENOTFOUND and a tensor of the wrong shape or dtype GHC_EFORMAT, both naming the file and
 * the tensor. Free with ghc_wanvae_free(). */
ghc_wanvae_t *ghc_wanvae_init(ghc_core_t *core, const char *path, const struct ghc_wanvae_opts *opts);
/* Release the weights. NULL is a no-op. */
void ghc_wanvae_free(ghc_wanvae_t *vae);
/* The configuration read at load. Borrowed; valid until ghc_wanvae_free(). */
const struct ghc_wanvae_config *ghc_wanvae_config(const ghc_wanvae_t *vae);

/* Encode a clip: video [3, F, H, W] (RGB in [-1, 1], f32 or bf16, on the VAE's device or the CPU) with
 * F = 1 + 4k (an image is F = 1) and H, W multiples of s = 8 patch (8 for Wan2.1, 16 for
 * Wan2.2), to the normalised posterior mean (z - mean_c) / std_c, a new f32 tensor [z_dim,
 * 1 + (F - 1) / 4, H / s, W / s] (role GHC_ROLE_LATENTS; what the VAE computes with is
 * GHC_ROLE_ENCODER_ACTIVATIONS, its weights GHC_ROLE_ENCODER_WEIGHTS) on the video's device (a CPU
 * video is copied to the VAE's device and its latent back) in *latent, which the caller frees.
 * Runs chunk by chunk as Wan does
 * (frame 0, then 4 frames at a time) with the causal feature cache, so the activations held
 * are those of one chunk plus the cache (doc/vae.md, "Memory"). Returns 0 or GHC_E* (a bad
 * shape is GHC_EINVAL naming what was expected); *latent is NULL on failure. */
int ghc_wanvae_encode(ghc_wanvae_t *vae, const ghc_tensor_t *video, ghc_tensor_t **latent);
/* Decode normalised latents z [z_dim, T, h, w] (f32 or bf16, on the VAE's device or the CPU) to a
 * new f32 clip [3, 1 + 4 (T - 1), s h, s w] clamped to [-1, 1] (role GHC_ROLE_ENCODER_ACTIVATIONS) on the
 * latent's device in *video, which the caller frees;
 * one latent frame per chunk, as Wan does. Returns 0 or GHC_E*; *video is NULL on failure. */
int ghc_wanvae_decode(ghc_wanvae_t *vae, const ghc_tensor_t *latent, ghc_tensor_t **video);

/* The feature cache's size in bytes (f32) of the encoder or the decoder of a VAE of configuration
 * cfg for frames of H x W pixels: what a run holds besides the weights and one chunk's
 * activations (doc/vae.md, "Memory"; 2.24 GB for the Wan2.1 encoder at 480 x 832). Only the
 * fields that set the layout are read (version, base_dim, dec_base_dim, patch, dim_mult,
 * num_res_blocks, temporal_down, z_dim). */
uint64_t ghc_wanvae_cache_bytes(const struct ghc_wanvae_config *cfg, bool decoder, int64_t H, int64_t W);

GHC_END_DECLS

#endif /* GHC_WANVAE_H */
