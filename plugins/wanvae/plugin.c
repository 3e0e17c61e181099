/* plugin.c: the `wanvae` vae plugin (encoder.h): the Wan2.1 or Wan2.2 VAE of wanvae.h, read
 * from `path` or, for the embedded demo, drawn at random from a small layout (`random`). */
#include <config.h>

#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/encoder.h>
#include <gh200core/mempolicy.h>
#include <gh200core/plugin.h>
#include <gh200core/run.h>

#include "wanvae.h"

static const struct ghc_cfg_key wanvae_random_keys[] = {
    { "version", GHC_CFG_INT, "21", "21 (z 16) or 22 (z 48)", NULL },
    { "base_dim", GHC_CFG_INT, "8", "1 to 4096", NULL },
    { "num_res_blocks", GHC_CFG_INT, "1", "1 to 16", NULL },
    { "seed", GHC_CFG_INT, "7", "0 or more", NULL },
    { NULL, 0, NULL, NULL, NULL }
};

static const struct ghc_cfg_key wanvae_keys[] = {
    { "path", GHC_CFG_STRING, NULL, "a .safetensors file (ComfyUI or diffusers names) or a sharded index", NULL },
    { "random", GHC_CFG_GROUP, NULL, NULL, wanvae_random_keys },
    { "device", GHC_CFG_INT, "(0 with CUDA device memory, else -1)", "-1 to 1023", NULL },
    { "dtype", GHC_CFG_STRING, "(f32 on the CPU, bf16 on a GPU)", "f32, bf16", NULL },
    { "tile", GHC_CFG_INT, "0", "0 to 65536", NULL },
    { "tile_stride", GHC_CFG_INT, "(3/4 of tile)", "0 to 65536", NULL },
    { NULL, 0, NULL, NULL, NULL }
};

static int wanvae_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    static const char *const dtypes[] = { "f32", "bf16", NULL };
    const char *path = NULL;
    ghc_cfg_t *rnd = NULL;
    int64_t device = ghc_mem_default_device(core), tile, stride;
    int rc, dt;
    if ((rc = ghc_cfg_get_string(cfg, "path", NULL, &path)) < 0 ||
        (rc = ghc_cfg_get_group(cfg, "random", wanvae_random_keys, &rnd)) < 0 ||
        (ghc_cfg_has(cfg, "device") &&
         (rc = ghc_cfg_get_int(cfg, "device", GHC_DEVICE_CPU, GHC_DEVICE_CPU, 1023, &device)) < 0) ||
        (rc = ghc_cfg_get_choice(cfg, "dtype", device == GHC_DEVICE_CPU ? 0 : 1, dtypes, &dt)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "tile", 0, 0, 65536, &tile)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "tile_stride", 0, 0, 65536, &stride)) < 0)   /* 0: the VAE's default */
        return rc;
    if (tile % 8 || (tile && stride && (stride % 8 || stride < 8 || stride > tile)))
        return ghc_error_set(core, GHC_ECONFIG, "%s: vae: 'tile' %lld and 'tile_stride' %lld: expected multiples of 8 "
                             "(16 for the Wan2.2 VAE) with 8 <= tile_stride <= tile (or tile = 0: no tiling)",
                             ghc_cfg_where(cfg, "tile"), (long long)tile, (long long)stride);
    if (!path == !rnd)
        return ghc_error_set(core, GHC_ECONFIG, "%s: vae: give either 'path' (the VAE's .safetensors) or 'random' "
                             "{ ... } (a small random VAE), not %s", ghc_cfg_where(cfg, NULL), path ? "both" : "neither");
    struct ghc_wanvae_opts opts = { .device = (int)device, .dtype = dt ? GHC_DTYPE_BF16 : GHC_DTYPE_F32,
                                    .tile = tile, .tile_stride = stride };
    struct ghc_wanvae_config lay = { 0 };
    char abs[4096] = "random Wan VAE";
    if (rnd) {
        int64_t v, base, blocks, seed;
        if ((rc = ghc_cfg_get_int(rnd, "version", 21, 21, 22, &v)) < 0 ||
            (rc = ghc_cfg_get_int(rnd, "base_dim", 8, 1, 4096, &base)) < 0 ||
            (rc = ghc_cfg_get_int(rnd, "num_res_blocks", 1, 1, 16, &blocks)) < 0 ||
            (rc = ghc_cfg_get_int(rnd, "seed", 7, 0, INT64_MAX, &seed)) < 0)
            return rc;
        lay = (struct ghc_wanvae_config){ .version = (int)v, .base_dim = base, .dec_base_dim = base,
                                          .patch = v == 22 ? 2 : 1, .dim_mult = { 1, 2, 4, 4 },
                                          .num_res_blocks = blocks, .temporal_down = { false, true, true },
                                          .z_dim = v == 22 ? 48 : 16 };
        opts.random = &lay;
        opts.seed = (uint64_t)seed;
    } else if ((rc = ghc_cfg_resolve_path(cfg, "path", path, abs, sizeof(abs))) < 0) {
        return rc;
    }
    ghc_wanvae_t *vae = ghc_wanvae_init(core, abs, &opts);
    if (!vae)
        return ghc_error_code(core) < 0 ? ghc_error_code(core) : GHC_EIO;
    *self = vae;
    return 0;
}

static int wanvae_info(void *self, struct ghc_vae_info *out)
{
    const struct ghc_wanvae_config *c = ghc_wanvae_config(self);
    struct ghc_vae_info in = { .struct_size = sizeof(in), .z_dim = c->z_dim, .t_stride = 4, .s_stride = 8 * c->patch };
    snprintf(in.summary, sizeof(in.summary), "Wan%s VAE (z %lld)", c->version == 22 ? "2.2" : "2.1", (long long)c->z_dim);
    size_t n = out->struct_size < sizeof(in) ? out->struct_size : sizeof(in);
    memcpy((char *)out + sizeof(uint32_t), (const char *)&in + sizeof(uint32_t), n - sizeof(uint32_t));
    return 0;
}

static int wanvae_encode(void *self, const ghc_tensor_t *video, ghc_tensor_t **latent)
{
    return ghc_wanvae_encode(self, video, latent);
}

static int wanvae_decode(void *self, const ghc_tensor_t *latent, ghc_tensor_t **video)
{
    return ghc_wanvae_decode(self, latent, video);
}

static void wanvae_free(void *self) { ghc_wanvae_free(self); }

static const struct ghc_vae_ops wanvae_ops = {
    .struct_size = sizeof(struct ghc_vae_ops),
    .name = "wanvae",
    .keys = wanvae_keys,
    .init = wanvae_init,
    .info = wanvae_info,
    .encode = wanvae_encode,
    .decode = wanvae_decode,
    .free = wanvae_free,
};

static int wanvae_plugin_init(ghc_core_t *core) { return ghc_register_vae(core, &wanvae_ops); }

GHC_PLUGIN_EXPORT const struct ghc_plugin ghc_plugin_wanvae = {
    .abi = GHC_PLUGIN_ABI,
    .api = GHC_API_VERSION,
    .struct_size = sizeof(struct ghc_plugin),
    .kinds = GHC_KIND_BIT(GHC_KIND_VAE),
    .name = "wanvae",
    .version = GHC_VERSION,
    .description = "the Wan2.1 (z 16) and Wan2.2 (z 48) video VAEs, CPU or CUDA",
    .init = wanvae_plugin_init,
};
