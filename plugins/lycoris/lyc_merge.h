/* lyc_merge.h: the lycoris plugin's adapter reader for merging, the interface `gh200core merge`
 * (core/merge.c) calls. An adapter file in any naming the plugin writes or loads is read into
 * modules (algorithm, shapes and scale inferred from the keys and shapes, as the loaders do) whose
 * delta-W comes from the plugin's own math (algo.c). Never installed; plain C types only. */
#ifndef GHC_LYC_MERGE_H
#define GHC_LYC_MERGE_H

#include <gh200core/tensor.h>   /* defines: ghc_tensor_t, ghc_core_t */

typedef struct lyc_adapter lyc_adapter_t;

struct lyc_adapter_module {
    const char *key;      /* the module's name as in the file ("diffusion_model.blocks.0.ffn.0") */
    const char *name;     /* without the naming's prefix: "blocks.0.ffn.0", "blocks.0.attn1.to_q", or
                           * for musubi names the part after "lora_unet_" ("blocks_0_ffn_0") */
    bool        musubi;   /* name is underscored (lora_unet_) */
    const char *algo;     /* "lora", "loha", "lokr", "dora" (LoRA with dora_scale) */
    int64_t     out, in;  /* delta-W's shape */
    float       scale;    /* s: alpha / rank, 1 without alpha and for both-full LoKr */
};

/* Read `path` (CPU, f32 factors). Tensors with no known adapter suffix are kept as skipped;
 * an incomplete or inconsistent module, a malformed alpha, an input-axis or non-LoRA
 * dora_scale are GHC_EFORMAT / GHC_EUNSUPPORTED naming the tensor. Returns 0 or GHC_E*;
 * *out is freed with lyc_adapter_free(). */
int lyc_adapter_open(ghc_core_t *core, const char *path, lyc_adapter_t **out);
/* Modules in file order of their first key, and skipped keys. Borrowed until lyc_adapter_free(). */
int32_t lyc_adapter_count(const lyc_adapter_t *a);
void lyc_adapter_module(const lyc_adapter_t *a, int32_t i, struct lyc_adapter_module *out);
int32_t lyc_adapter_skipped_count(const lyc_adapter_t *a);
const char *lyc_adapter_skipped(const lyc_adapter_t *a, int32_t i);
/* w (CPU f32 [out, in], in place) <- W + m delta-W, DoRA: W + m (W_new - W). Returns 0 or GHC_E*. */
int lyc_adapter_merge(lyc_adapter_t *a, int32_t i, ghc_tensor_t *w, float m);
/* NULL is a no-op. */
void lyc_adapter_free(lyc_adapter_t *a);

#endif /* GHC_LYC_MERGE_H */
