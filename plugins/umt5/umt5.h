/* umt5.h: the umT5 text encoder of Wan2.x (umT5-XXL, doc/text-encoder.md): its tokenizer
 * (SentencePiece through libsentencepiece, after Wan's prompt cleaning) and its encoder
 * forward through libgh200core_ops: on the CPU in f32 (the reference) or on a CUDA device in f32 or
 * bf16 (struct ghc_umt5_place). The module of the `umt5`
 * text_encoder plugin (plugin.c); not installed. Errors go to the core's message (ghc_error_message),
 * one line naming the file, tensor or text position. */
#ifndef GHC_UMT5_H
#define GHC_UMT5_H

#include <gh200core/tensor.h>   /* defines: ghc_tensor_t, ghc_core_t, GHC_BEGIN_DECLS */

GHC_BEGIN_DECLS

/* Wan's text length: prompts are cut to 511 pieces plus the EOS. */
#define GHC_UMT5_TEXT_LEN 512
#define GHC_UMT5_PAD_ID   0
#define GHC_UMT5_EOS_ID   1

/* ---- text cleaning ------------------------------------------------------------------------- */

/* Wan's prompt cleaning (clean='whitespace': ftfy.fix_text, html.unescape twice, \s+ to one
 * space, strip) as far as C does it; doc/text-encoder.md lists what ftfy does that this does
 * not (mojibake repair, NFC). `text` is UTF-8 (GHC_EINVAL naming the byte
 * offset when it is not). Returns a new NUL-terminated UTF-8 string (free()) or NULL. */
char *ghc_umt5_clean(ghc_core_t *core, const char *text);

/* ---- tokenizer ------------------------------------------------------------------------------ */

typedef struct ghc_umt5_tok ghc_umt5_tok_t;

/* Load a SentencePiece model (`spiece.model` / `tokenizer.model`; a `tokenizer.json` is
 * refused with a message naming the file to use instead). GHC_EIO for a missing file,
 * GHC_EFORMAT for one libsentencepiece cannot parse, GHC_EUNSUPPORTED in a build without
 * libsentencepiece (configure --without-sentencepiece). NULL on error; free with
 * ghc_umt5_tok_free. */
ghc_umt5_tok_t *ghc_umt5_tok_init(ghc_core_t *core, const char *path);
/* The same from the serialized model in memory (ComfyUI's `spiece_model` U8 tensor); `name`
 * stands for it in messages. The bytes are copied. */
ghc_umt5_tok_t *ghc_umt5_tok_init_bytes(ghc_core_t *core, const char *name, const void *data, size_t len);
/* NULL is a no-op. */
void ghc_umt5_tok_free(ghc_umt5_tok_t *tok);
/* The model's number of pieces (ids are below it). */
int32_t ghc_umt5_tok_size(const ghc_umt5_tok_t *tok);

/* Wan's tokenisation (padding='max_length', truncation, max_length=text_len): the text
 * cleaned with ghc_umt5_clean (unless `clean` is false), SentencePiece ids of its pieces cut
 * to text_len - 1, then the EOS (1), then the pad id (0) up to text_len; mask 1 for the
 * pieces and the EOS, 0 for padding. ids and mask (mask may be NULL) hold text_len entries;
 * text_len >= 1. Returns L, the true length (1..text_len, the encoder's rows to keep), or a
 * negative GHC_E*. */
int ghc_umt5_tok_encode(ghc_umt5_tok_t *tok, const char *text, bool clean, int32_t text_len, int32_t *ids,
                        int32_t *mask);

/* ---- encoder -------------------------------------------------------------------------------- */

/* The shape of a T5-family encoder (umT5: per-layer relative-position tables, gated GELU-tanh
 * FFN, RMS norms, unscaled attention, no biases). */
struct ghc_umt5_config {
    int64_t vocab;          /* embedding rows */
    int64_t d_model;
    int64_t d_kv;           /* per head */
    int64_t d_ff;
    int64_t layers;
    int64_t heads;
    int32_t num_buckets;    /* relative-position buckets (bidirectional) */
    int32_t max_distance;   /* not in the weights */
    float   eps;            /* RMS norm epsilon; not in the weights */
};

/* umT5-XXL: vocab 256384, d_model 4096, d_kv 64, d_ff 10240, 24 layers, 64 heads, 32 buckets,
 * max distance 128, eps 1e-6. */
void ghc_umt5_config_xxl(struct ghc_umt5_config *cfg);

typedef struct ghc_umt5 ghc_umt5_t;

/* Where an encoder computes: `device` GHC_DEVICE_CPU (-1) or a CUDA ordinal (its tensors come
 * from the run's memory policy), `dtype` GHC_DTYPE_F32 or GHC_DTYPE_BF16: the linears' weights
 * and the activations between the norms. The residual stream, the norms, the bias tables, the
 * attention's softmax and the output are f32 either way. A NULL place is the CPU in f32. */
struct ghc_umt5_place {
    int            device;
    enum ghc_dtype dtype;
};

/* Load an encoder from a .safetensors file or a sharded checkpoint's .safetensors.index.json:
 * transformers/diffusers/ComfyUI names (shared.weight, encoder.block.{i}.layer...) or Wan's
 * official names (token_embedding.weight, blocks.{i}..., optionally under "encoder."), any
 * float dtype, ComfyUI fp8 "scaled" weights dequantised with their scale_weight (in f32, then
 * rounded once to the place's dtype). Linears are kept in place->dtype, norms and bias tables
 * in f32, the embedding in its file dtype when that is bf16 or f16 (else place->dtype), all on
 * place->device, one tensor at a time through host memory. The
 * shape comes from the tensors; `want` (NULL: none) fixes fields: each non-zero one must
 * match the file (GHC_EFORMAT otherwise), max_distance and eps (not in the file) default to
 * umT5's 128 and 1e-6. A PyTorch .pth/.pt/.bin is refused naming the safetensors files to use.
 * NULL on error (a missing tensor or a wrong shape names the tensor); free with ghc_umt5_free. */
ghc_umt5_t *ghc_umt5_init(ghc_core_t *core, const char *path, const struct ghc_umt5_config *want,
                          const struct ghc_umt5_place *place);
/* An encoder of shape cfg (max_distance 0 and eps 0: umT5's) with weights drawn from `seed`
 * (norms 1, the rest normal with variance 1 / fan-in; the embedding standard normal; drawn in
 * f32 on the CPU, so the same weights on every place, rounded once to its dtype): the embedded
 * demo's tiny text encoder. NULL on error (a field out of range). */
ghc_umt5_t *ghc_umt5_init_random(ghc_core_t *core, const struct ghc_umt5_config *cfg, uint64_t seed,
                                 const struct ghc_umt5_place *place);
/* NULL is a no-op. */
void ghc_umt5_free(ghc_umt5_t *enc);
/* The loaded shape. Borrowed; valid until ghc_umt5_free. */
const struct ghc_umt5_config *ghc_umt5_get_config(const ghc_umt5_t *enc);

/* The encoder's last hidden state for one prompt of n ids (1 <= n): a new f32 CPU tensor
 * [L, d_model] (ghc_tensor_free). mask NULL: all n positions are tokens, L = n (Wan's rule:
 * run the true tokens only). mask set (n entries of 1s then 0s, as ghc_umt5_tok_encode
 * writes): every position runs with the padding keys masked, as Wan and transformers run a
 * padded batch, and the output is trimmed to L = the number of 1s. NULL on error (an id out of
 * range names its position). */
ghc_tensor_t *ghc_umt5_encode(ghc_umt5_t *enc, const int32_t *ids, const int32_t *mask, int32_t n);
/* B prompts at once (one forward over B n rows, the GEMMs B times taller): ids [B, n] and mask
 * (NULL, or [B, n] of rows as above) row-major; out[b] = prompt b's new f32 CPU tensor [L_b,
 * d_model] (each its own; the caller frees them). A row without a mask runs all n positions.
 * Returns 0, or a negative GHC_E* with every out[b] NULL (an id or mask entry out of range
 * names its prompt and position). The ids and masks are checked on the host; a device encoder
 * copies them over, runs, and waits for the output. */
int ghc_umt5_encode_batch(ghc_umt5_t *enc, const int32_t *ids, const int32_t *mask, int32_t B, int32_t n,
                          ghc_tensor_t **out);

GHC_END_DECLS

#endif /* GHC_UMT5_H */
