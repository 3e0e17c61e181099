/* test_lycoris.c: the lycoris network plugin on the CPU (the golden cases and the wan22 checks
 * are in lycoris_cases.h, which tests/test_lycoris_cuda.c runs on the GPU too):
 *   - factorization against values worked out by hand from LyCORIS's factorization();
 *   - golden cases from the Python LyCORIS library (tests/fixtures/make_lycoris_fixtures.py):
 *     output, input gradient, adapter gradients and delta-W of LoRA (plain, rs_lora), LoHa and
 *     LoKr (factor -1, 4, 16; full, low-rank W2, both decomposed, full_matrix), read from the
 *     files LyCORIS saved (so loading LyCORIS files is tested too); the hook's plan per
 *     algorithm, its members' returns, and the parts written (forward write, backward
 *     accumulate false) as well as added, or refused where the plan does not offer it;
 *   - saving in the three namings (key names checked against the patterns ComfyUI's Wan
 *     loader takes, alpha a 0-dim F32, diffusers with the scale folded in) and loading back, also
 *     into a network of another alpha;
 *   - which tools load the files: C transcriptions of the Wan loaders of ComfyUI, musubi-tuner
 *     and diffusers played on the default file (LoRA: all three; LoHa, LoKr: ComfyUI and
 *     musubi-tuner), on other namings, subsets, extra_formats and DoRA, against what the
 *     network says at attach; DoRA files store dora_scale for ComfyUI and read back;
 *   - presets: "full" adds targets outside the blocks, and on Wan2.2 equals "attn_ffn";
 *   - malformed adapter files: clear errors naming the tensor, nothing changed;
 *   - target selection (presets, include/exclude, overrides), dropout, config errors;
 *   - end to end on the tiny wan22 model: the wan22 fixture's LoRA (diffusers + peft goldens)
 *     loaded through the network gives the fixture's prediction and gradients, and on a random
 *     model the adapter gradients match central finite differences of the loss; the ways the
 *     core may take (linear.h, forced with ghc_linear_ways: fold, K-concatenation, written
 *     first, added after) against each other, and the H kept from the forward. */
#include <config.h>

#include "lycoris_cases.h"   /* the golden cases and the wan22 checks */

/* ---- factorization ------------------------------------------------------------------------- */


START_TEST(factorization)
{
    /* LyCORIS's factorization() worked out by hand (rows 5120, 13824, 1536, 360 and 64) */
    static const struct { int64_t d, f, m, n; } v[] = {
        { 5120, -1, 64, 80 }, { 5120, 4, 4, 1280 }, { 5120, 12, 10, 512 }, { 5120, 16, 16, 320 },
        { 5120, 100, 64, 80 }, { 5120, 128, 40, 128 }, { 13824, -1, 108, 128 }, { 13824, 8, 8, 1728 },
        { 13824, 100, 96, 144 }, { 1536, 64, 24, 64 }, { 1536, 128, 12, 128 }, { 360, -1, 18, 20 },
        { 360, 16, 15, 24 }, { 64, 64, 1, 64 }, { 64, 16, 4, 16 }, { 64, 100, 8, 8 }, { 30720, 100, 96, 320 },
        { 8960, 12, 10, 896 }, { 256, 32, 8, 32 },
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        int64_t m, n;
        lyc_factorization(v[i].d, v[i].f, &m, &n);
        ck_assert_msg(m == v[i].m && n == v[i].n, "factorization(%lld, %lld) = (%lld, %lld), expected (%lld, %lld)",
                      (long long)v[i].d, (long long)v[i].f, (long long)m, (long long)n, (long long)v[i].m,
                      (long long)v[i].n);
    }
}
END_TEST

/* ---- files ------------------------------------------------------------------------------------ */

/* Does `key` have one of the forms ComfyUI loads for Wan (doc/lycoris.md, "Which tool loads
 * which file"): module name `diffusion_model.<path>` or `lora_unet_<path with _>`, then a
 * LoRA/LoHa/LoKr tensor or alpha? */
static bool comfy_key(const char *key)
{
    static const char *const sfx[] = { ".lora_up.weight", ".lora_down.weight", ".alpha", ".hada_w1_a", ".hada_w1_b",
                                       ".hada_w2_a", ".hada_w2_b", ".lokr_w1", ".lokr_w1_a", ".lokr_w1_b", ".lokr_w2",
                                       ".lokr_w2_a", ".lokr_w2_b" };
    const char *mod;
    if (strncmp(key, "diffusion_model.blocks.", 23) == 0)
        mod = key + 23;
    else if (strncmp(key, "lora_unet_blocks_", 17) == 0)
        mod = key + 17;
    else
        return false;
    char *end;
    strtol(mod, &end, 10);
    if (end == mod)
        return false;
    bool dotted = key[0] == 'd';
    static const char *const lin[] = { "self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q",
                                       "cross_attn.k", "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2" };
    for (size_t i = 0; i < 10; i++) {
        char want[32];
        snprintf(want, sizeof(want), "%c%s", dotted ? '.' : '_', lin[i]);
        if (!dotted)
            for (char *c = want; *c; c++)
                if (*c == '.')
                    *c = '_';
        if (strncmp(end, want, strlen(want)) == 0)
            for (size_t k = 0; k < sizeof(sfx) / sizeof(sfx[0]); k++)
                if (strcmp(end + strlen(want), sfx[k]) == 0)
                    return true;
    }
    return false;
}

/* 30 wan22-like targets (3 blocks of 10; dim 64, ffn 96). */
static struct ghc_model_target *fake_targets(int32_t *n)
{
    static const char *const lin[] = { "self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q",
                                       "cross_attn.k", "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2" };
    static const char *const dif[] = { "attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q",
                                       "attn2.to_k", "attn2.to_v", "attn2.to_out.0", "ffn.net.0.proj", "ffn.net.2" };
    static char names[30][2][48];
    static struct ghc_model_target t[30];
    for (int i = 0; i < 30; i++) {
        snprintf(names[i][0], 48, "blocks.%d.%s", i / 10, lin[i % 10]);
        snprintf(names[i][1], 48, "blocks.%d.%s", i / 10, dif[i % 10]);
        t[i] = (struct ghc_model_target){ .name = names[i][0], .alias = names[i][1], .block = i / 10,
                                          .in_features = i % 10 == 9 ? 96 : 64, .out_features = i % 10 == 8 ? 96 : 64 };
    }
    *n = 30;
    return t;
}

/* Random values for every param (so saved files are not all zeros). */
static void randomise(ghc_core_t *core, ghc_network_t *net, uint64_t seed)
{
    struct ghc_param *ps;
    int32_t np;
    ok(core, ghc_network_params(net, 0, &ps, &np));
    for (int32_t k = 0; k < np; k++)
        ok(core, ghc_op_rand_normal(ps[k].value, &(struct ghc_rng){ seed, (uint64_t)k << 20 }, NULL));
}

/* The output of every target of `net` for the same input, concatenated (CPU f32, caller frees).
 * With `ref` set, the inputs and outputs go into it as x.<target> and y.<target>. */
static float *outputs_ref(ghc_core_t *core, ghc_network_t *net, const struct ghc_model_target *t, int32_t n,
                          size_t *len, ghc_st_writer_t *ref)
{
    struct ghc_adapter_hook hook;
    ok(core, ghc_network_hook(net, 0, &hook));
    float *all = NULL;
    *len = 0;
    for (int32_t i = 0; i < n; i++) {
        ghc_tensor_t *x = mk(core, -1, GHC_DTYPE_F32, 3, (const int64_t[]){ 1, 3, t[i].in_features });
        ghc_tensor_t *y = mk(core, -1, GHC_DTYPE_F32, 3, (const int64_t[]){ 1, 3, t[i].out_features });
        ok(core, ghc_op_rand_normal(x, &(struct ghc_rng){ 9, (uint64_t)i }, NULL));
        ok(core, ghc_op_fill(y, 0.0, NULL));
        did(core, hook.forward(hook.user, i, x, y, false, NULL), 1);
        if (ref) {
            char nm[128];
            snprintf(nm, sizeof(nm), "x.%s", t[i].name);
            ok(core, ghc_st_writer_add(ref, nm, x));
            snprintf(nm, sizeof(nm), "y.%s", t[i].name);
            ok(core, ghc_st_writer_add(ref, nm, y));
        }
        all = realloc(all, (*len + (size_t)ghc_tensor_numel(y)) * sizeof(float));
        memcpy(all + *len, ghc_tensor_cdata(y), ghc_tensor_nbytes(y));
        *len += (size_t)ghc_tensor_numel(y);
        ghc_tensor_free(x);
        ghc_tensor_free(y);
    }
    return all;
}

static float *outputs(ghc_core_t *core, ghc_network_t *net, const struct ghc_model_target *t, int32_t n, size_t *len)
{
    return outputs_ref(core, net, t, n, len, NULL);
}

static double max_rel(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---- which tools load a file: their loaders' rules, as their code states them -------------------
 * Each checker takes the file's keys and the model's linear weights (official names) and plays
 * the tool's own loader on the names: which modules it applies and whether a key is left over
 * (the tools warn and drop it: for a dora_scale that is a DoRA applied as a plain LoRA). */

struct keyset {
    int          n;
    char       **k;
    bool        *used;
};

static struct keyset ks_open(ghc_core_t *core, const char *path)
{
    ghc_st_t *st = ghc_st_open(core, path);
    ck_assert_msg(st != NULL, "%s", ghc_error_message(core));
    struct keyset ks = { .n = ghc_st_count(st) };
    ks.k = calloc((size_t)ks.n, sizeof(char *));
    ks.used = calloc((size_t)ks.n, sizeof(bool));
    for (int i = 0; i < ks.n; i++) {
        struct ghc_st_info info;
        ghc_st_info_at(st, i, &info);
        ks.k[i] = strdup(info.name);
    }
    ghc_st_free(st);
    return ks;
}

static void ks_free(struct keyset *ks)
{
    for (int i = 0; i < ks->n; i++)
        free(ks->k[i]);
    free(ks->k);
    free(ks->used);
}

static bool ks_has(const struct keyset *ks, const char *name)
{
    for (int i = 0; i < ks->n; i++)
        if (strcmp(ks->k[i], name) == 0)
            return true;
    return false;
}

/* Mark `prefix` + `sfx` used; false when absent. */
static bool ks_take(struct keyset *ks, const char *prefix, const char *sfx)
{
    char name[256];
    snprintf(name, sizeof(name), "%s.%s", prefix, sfx);
    for (int i = 0; i < ks->n; i++)
        if (strcmp(ks->k[i], name) == 0)
            return ks->used[i] = true;
    return false;
}

static int ks_left(const struct keyset *ks, const char **first)
{
    int n = 0;
    for (int i = 0; i < ks->n; i++)
        if (!ks->used[i] && !n++)
            *first = ks->k[i];
    return n;
}

static bool ks_any_prefix(const struct keyset *ks, const char *prefix)
{
    for (int i = 0; i < ks->n; i++)
        if (strncmp(ks->k[i], prefix, strlen(prefix)) == 0)
            return true;
    return false;
}

/* "blocks.0.self_attn.q" -> "lora_unet_blocks_0_self_attn_q" (both tools build it this way). */
static void underscored(const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "lora_unet_%s", name);
    for (char *c = buf + 10; *c; c++)
        if (*c == '.')
            *c = '_';
}

/* musubi-tuner (kohya-ss/musubi-tuner 30c658c, utils/lora_utils.py
 * load_safetensors_with_lora_and_fp8; networks/loha.py and networks/lokr.py
 * merge_weights_to_tensor): the network type is the first key holding "lora_down", "hada_w1_a" or
 * "lokr_w1"; for every model weight "<path>.weight" the module "lora_unet_<path with _>" is
 * merged: LoRA needs lora_down and lora_up (alpha optional), LoHa hada_w1_a, _w1_b, _w2_a, _w2_b,
 * LoKr lokr_w1 with lokr_w2_a and _w2_b or lokr_w2; consumed keys are removed and any key left
 * is reported "not all LoRA keys are used". Returns the modules merged; *left the keys left. */
static int musubi_rule(struct keyset *ks, const struct ghc_model_target *t, int32_t n, int *left, const char **first)
{
    int type = 0;   /* lora */
    for (int i = 0; i < ks->n; i++) {
        if (strstr(ks->k[i], "lora_down")) { type = 0; break; }
        if (strstr(ks->k[i], "hada_w1_a")) { type = 1; break; }
        if (strstr(ks->k[i], "lokr_w1")) { type = 2; break; }
    }
    int merged = 0;
    for (int32_t m = 0; m < n; m++) {
        char ln[160];
        underscored(t[m].name, ln, sizeof(ln));
        char k[200];
        if (type == 1) {
            snprintf(k, sizeof(k), "%s.hada_w1_a", ln);
            if (!ks_has(ks, k))
                continue;
            bool all = ks_take(ks, ln, "hada_w1_a") & ks_take(ks, ln, "hada_w1_b") & ks_take(ks, ln, "hada_w2_a") &
                       ks_take(ks, ln, "hada_w2_b");
            ck_assert_msg(all, "musubi-tuner: %s: a LoHa factor is missing (KeyError)", ln);
            ks_take(ks, ln, "alpha");
            merged++;
        } else if (type == 2) {
            char w1[200], w2a[200], w2[200];
            snprintf(w1, sizeof(w1), "%s.lokr_w1", ln);
            snprintf(w2a, sizeof(w2a), "%s.lokr_w2_a", ln);
            snprintf(w2, sizeof(w2), "%s.lokr_w2", ln);
            if (!ks_has(ks, w1) || (!ks_has(ks, w2a) && !ks_has(ks, w2)))
                continue;
            ks_take(ks, ln, "lokr_w1");
            if (ks_has(ks, w2a))
                ck_assert_msg(ks_take(ks, ln, "lokr_w2_a") && ks_take(ks, ln, "lokr_w2_b"), "musubi-tuner: %s: KeyError",
                              ln);
            else
                ks_take(ks, ln, "lokr_w2");
            ks_take(ks, ln, "alpha");
            merged++;
        } else {
            char d[200], u[200];
            snprintf(d, sizeof(d), "%s.lora_down.weight", ln);
            snprintf(u, sizeof(u), "%s.lora_up.weight", ln);
            if (!ks_has(ks, d) || !ks_has(ks, u))
                continue;
            ks_take(ks, ln, "lora_down.weight");
            ks_take(ks, ln, "lora_up.weight");
            ks_take(ks, ln, "alpha");
            merged++;
        }
    }
    *left = ks_left(ks, first);
    return merged;
}

/* ComfyUI (Comfy-Org/ComfyUI a125cd8, comfy/lora.py model_lora_keys_unet and load_lora;
 * comfy/weight_adapter/lora.py, loha.py, lokr.py LoRAAdapter.load, ...): every model weight
 * "diffusion_model.<path>.weight" is reachable as "lora_unet_<path with _>" and as
 * "diffusion_model.<path>" (no diffusers names for Wan: unet_to_diffusers gives none without
 * num_res_blocks); for each, <x>.alpha and <x>.dora_scale are read, then LoRA (<x>.lora_up.weight
 * with <x>.lora_down.weight, or lora_B/lora_A), LoHa (<x>.hada_w1_a and the other three), LoKr
 * (any lokr_w*); keys never read are logged "lora key not loaded". Returns the patches made. */
static int comfy_rule(struct keyset *ks, const struct ghc_model_target *t, int32_t n, int *left, const char **first)
{
    int patches = 0;
    for (int32_t m = 0; m < n; m++) {
        char x[2][160];
        underscored(t[m].name, x[0], sizeof(x[0]));
        snprintf(x[1], sizeof(x[1]), "diffusion_model.%s", t[m].name);
        for (int v = 0; v < 2; v++) {
            ks_take(ks, x[v], "alpha");
            ks_take(ks, x[v], "dora_scale");
            char k[400];
            bool lora = false, loha = false, lokr = false;
            snprintf(k, sizeof(k), "%s.lora_up.weight", x[v]);
            if (ks_has(ks, k))
                lora = ks_take(ks, x[v], "lora_up.weight") && ks_take(ks, x[v], "lora_down.weight");
            snprintf(k, sizeof(k), "%s.lora_B.weight", x[v]);
            if (!lora && ks_has(ks, k))
                lora = ks_take(ks, x[v], "lora_B.weight") && ks_take(ks, x[v], "lora_A.weight");
            snprintf(k, sizeof(k), "%s.hada_w1_a", x[v]);
            if (ks_has(ks, k))
                loha = ks_take(ks, x[v], "hada_w1_a") & ks_take(ks, x[v], "hada_w1_b") &
                       ks_take(ks, x[v], "hada_w2_a") & ks_take(ks, x[v], "hada_w2_b");
            bool w1 = ks_take(ks, x[v], "lokr_w1"), w1a = ks_take(ks, x[v], "lokr_w1_a");
            bool w1b = ks_take(ks, x[v], "lokr_w1_b"), w2 = ks_take(ks, x[v], "lokr_w2");
            bool w2a = ks_take(ks, x[v], "lokr_w2_a"), w2b = ks_take(ks, x[v], "lokr_w2_b");
            lokr = (w1 || (w1a && w1b)) && (w2 || (w2a && w2b));
            patches += lora || loha || lokr;
        }
    }
    *left = ks_left(ks, first);
    return patches;
}

/* diffusers (huggingface/diffusers 58eb52c, loaders/lora_pipeline.py WanLoraLoaderMixin
 * .lora_state_dict and load_lora_weights; loaders/lora_conversion_utils.py): a file with a
 * "diffusion_model." key goes through _convert_non_diffusers_wan_lora_to_diffusers (per block
 * from the lowest to the highest number, the 10 linears' lora_down / lora_up (or lora_A / lora_B)
 * and alpha where present; anything left but ".diff" keys raises ValueError), one with a
 * "lora_unet_" key through _convert_musubi_wan_lora_to_diffusers (blocks 0 to N-1, N the number
 * of distinct block numbers, each with all 10 linears' lora_down, lora_up and alpha, else
 * KeyError; anything left raises ValueError), any other file is taken as peft names
 * ("transformer.<diffusers path>.lora_A.weight"); then every key must hold "lora". Returns the
 * LoRA modules it loads, or -1 with the reason in why. */
static int diffusers_rule(struct keyset *ks, const struct ghc_model_target *t, int32_t n, char *why, size_t len)
{
    static const char *const lin[] = { "self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q",
                                       "cross_attn.k", "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2" };
    const char *first = NULL;
    int mods = 0;
    if (ks_any_prefix(ks, "diffusion_model.")) {
        long lo = 1L << 30, hi = -1;
        for (int i = 0; i < ks->n; i++)
            if (strncmp(ks->k[i], "diffusion_model.blocks.", 23) == 0) {
                long b = strtol(ks->k[i] + 23, NULL, 10);
                lo = b < lo ? b : lo;
                hi = b > hi ? b : hi;
            }
        bool ab = false;
        for (int i = 0; i < ks->n; i++)
            ab |= strstr(ks->k[i], "lora_A") != NULL;
        for (long b = lo; b <= hi; b++)
            for (int j = 0; j < 10; j++) {
                char x[160];
                snprintf(x, sizeof(x), "diffusion_model.blocks.%ld.%s", b, lin[j]);
                bool a = ks_take(ks, x, ab ? "lora_A.weight" : "lora_down.weight");
                bool u = ks_take(ks, x, ab ? "lora_B.weight" : "lora_up.weight");
                bool al = ks_take(ks, x, "alpha");
                if (al && (!a || !u)) {
                    snprintf(why, len, "KeyError: %s without its factors", x);
                    return -1;
                }
                mods += a && u;
            }
        if (ks_left(ks, &first)) {
            snprintf(why, len, "ValueError: state_dict should be empty at this point but has %s", first);
            return -1;
        }
    } else if (ks_any_prefix(ks, "lora_unet_")) {
        char seen[1024] = { 0 };
        int nb = 0;
        for (int i = 0; i < ks->n; i++) {
            const char *p = strstr(ks->k[i], "blocks_");
            if (!p) {
                snprintf(why, len, "IndexError: %s has no blocks_", ks->k[i]);
                return -1;
            }
            long b = strtol(p + 7, NULL, 10);
            if (b >= 0 && b < 1024 && !seen[b]++)
                nb++;
        }
        for (int b = 0; b < nb; b++)
            for (int j = 0; j < 10; j++) {
                char name[64], x[160];
                snprintf(name, sizeof(name), "blocks.%d.%s", b, lin[j]);
                underscored(name, x, sizeof(x));
                if (!ks_take(ks, x, "lora_down.weight") || !ks_take(ks, x, "lora_up.weight") ||
                    !ks_take(ks, x, "alpha")) {
                    snprintf(why, len, "KeyError: %s.lora_down.weight, lora_up.weight or alpha", x);
                    return -1;
                }
                mods++;
            }
        if (ks_left(ks, &first)) {
            snprintf(why, len, "ValueError: state_dict should be empty at this point but has %s", first);
            return -1;
        }
    } else {   /* the converters' output has lora_A / lora_B names only; a peft file is checked as it is */
        for (int i = 0; i < ks->n; i++)
            if (!strstr(ks->k[i], "lora")) {
                snprintf(why, len, "ValueError: Invalid LoRA checkpoint (%s)", ks->k[i]);
                return -1;
            }
        for (int32_t m = 0; m < n; m++) {
            char x[160];
            snprintf(x, sizeof(x), "transformer.%s", t[m].alias);
            mods += ks_take(ks, x, "lora_A.weight") && ks_take(ks, x, "lora_B.weight");
        }
        if (ks_left(ks, &first)) {
            snprintf(why, len, "%s matches no module of WanTransformer3DModel", first);
            return -1;
        }
    }
    return mods;
}

/* Which tools apply the file at path as trained (enum lyc_tool bits), by the three rules above:
 * every module of the network (n_mods) merged and no key left. */
static unsigned tools_loading(ghc_core_t *core, const char *path, const struct ghc_model_target *t, int32_t n,
                              int n_mods, const char *what)
{
    unsigned tools = 0;
    int left;
    const char *first = "";
    char why[512] = "";
    struct keyset ks = ks_open(core, path);
    int c = comfy_rule(&ks, t, n, &left, &first);
    printf("%s: ComfyUI applies %d of %d modules, %d keys not loaded%s%s\n", what, c, n_mods, left, left ? ", e.g. " : "",
           left ? first : "");
    tools |= c == n_mods && !left ? LYC_TOOL_COMFYUI : 0;
    ks_free(&ks);
    ks = ks_open(core, path);
    c = musubi_rule(&ks, t, n, &left, &first);
    printf("%s: musubi-tuner merges %d of %d modules, %d keys unused%s%s\n", what, c, n_mods, left, left ? ", e.g. " : "",
           left ? first : "");
    tools |= c == n_mods && !left ? LYC_TOOL_MUSUBI : 0;
    ks_free(&ks);
    ks = ks_open(core, path);
    c = diffusers_rule(&ks, t, n, why, sizeof(why));
    printf("%s: diffusers loads %d of %d modules%s%s\n", what, c < 0 ? 0 : c, n_mods, c < 0 ? ": " : "", why);
    tools |= c == n_mods ? LYC_TOOL_DIFFUSERS : 0;
    ks_free(&ks);
    return tools;
}

/* Log lines collected by log_grab (tests read what the network says at attach). */
static char grabbed[16384];

static void log_grab(void *user, enum ghc_log_level lvl, const char *msg)
{
    (void)user;
    size_t o = strlen(grabbed);
    snprintf(grabbed + o, sizeof(grabbed) - o, "%s%s\n", lvl == GHC_LOG_WARN ? "W: " : "I: ", msg);
}

/* The tools the network's attach message says load its files (INFO "... load in A, B" or WARN
 * "... they load in: A, B"). */
static unsigned tools_claimed(void)
{
    const char *p = strstr(grabbed, "load in: ");
    p = p ? p + 9 : strstr(grabbed, ") load in ");
    ck_assert_msg(p != NULL, "no loaders line in:\n%s", grabbed);
    if (*p == ')')
        p += 10;
    const char *end = strchr(p, '\n');
    unsigned tools = 0;
    static const char *const name[] = { "ComfyUI", "musubi-tuner", "diffusers" };
    for (int t = 0; t < 3; t++) {
        const char *q = strstr(p, name[t]);
        tools |= q && q < end ? 1u << t : 0;
    }
    return tools;
}

/* The default file and its variants against the three loaders: LoRA, LoHa and LoKr with default
 * keys load in every tool that takes the algorithm (LoRA: all three; LoHa, LoKr: ComfyUI and
 * musubi-tuner); what a selection or naming costs, DoRA, and extra_formats; and the network's
 * message at attach names the same tools. */
START_TEST(default_file_loaders)
{
    static const unsigned ALL = LYC_TOOL_COMFYUI | LYC_TOOL_MUSUBI | LYC_TOOL_DIFFUSERS;
    static const unsigned CM = LYC_TOOL_COMFYUI | LYC_TOOL_MUSUBI;
    static const struct { const char *cfg; unsigned want, extra; bool model; } v[] = {
        { "", ALL, 0, false },                                              /* the default file */
        { "algo = \"loha\";", CM, 0, false },
        { "algo = \"lokr\"; rank = 2; factor = 4;", CM, 0, false },
        { "algo = \"lokr\"; rank = 100; factor = 8;", CM, 0, false },        /* both factors full */
        { "algo = \"lokr\"; rank = 1; factor = 4; decompose_both = true;", LYC_TOOL_COMFYUI, 0, false },
        { "preset = \"attn\";", CM, 0, false },                             /* diffusers: incomplete blocks */
        { "preset = \"attn\"; extra_formats = [ \"diffusers\" ];", CM, LYC_TOOL_DIFFUSERS, false },
        { "format = \"comfyui\";", LYC_TOOL_COMFYUI | LYC_TOOL_DIFFUSERS, 0, false },
        { "format = \"comfyui\"; extra_formats = [ \"musubi\" ];", LYC_TOOL_COMFYUI | LYC_TOOL_DIFFUSERS, ALL, false },
        { "format = \"diffusers\";", LYC_TOOL_DIFFUSERS, 0, false },
        { "dora_wd = true;", LYC_TOOL_COMFYUI, 0, true },                    /* the others drop dora_scale */
    };
    char *dir = tu_tmpdir();
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        char mcfg[1024], path[4200], extra[4300];
        ghc_core_t *core = core_with(v[i].cfg, v[i].model ? wan22_cfg(mcfg, sizeof(mcfg), true) : NULL);
        ghc_network_t *net = ghc_network_get(core);
        const struct ghc_model_target *t;
        int32_t n;
        if (v[i].model)
            ok(core, ghc_model_targets(ghc_model_get(core), &t, &n));
        else
            t = fake_targets(&n);
        grabbed[0] = '\0';
        ghc_log_set_sink(core, log_grab, NULL);
        ok(core, ghc_network_attach(net, 0, t, n));
        randomise(core, net, i + 1);
        struct ghc_param *ps;
        int32_t np;
        ok(core, ghc_network_params(net, 0, &ps, &np));
        int mods = 0;
        for (int32_t k = 0; k < np; k++)   /* modules: their first slot */
            mods += strstr(ps[k].name, ".lora_down.weight") || strstr(ps[k].name, ".hada_w1_a") ||
                    (strstr(ps[k].name, ".lokr_w1") && !strstr(ps[k].name, ".lokr_w1_b"));
        snprintf(path, sizeof(path), "%s/f%zu.safetensors", dir, i);
        ok(core, ghc_network_save(net, 0, path));
        printf("-- %s\n%s", *v[i].cfg ? v[i].cfg : "(defaults)", grabbed);
        unsigned got = tools_loading(core, path, t, n, mods, "file");
        ck_assert_msg(got == v[i].want, "%s: the file loads in tools %#x, expected %#x", v[i].cfg, got, v[i].want);
        unsigned all = got;
        if (v[i].extra) {
            lyc_extra_path(path, strstr(v[i].cfg, "\"diffusers\" ]") ? LYC_FMT_DIFFUSERS : LYC_FMT_MUSUBI, extra,
                           sizeof(extra));
            unsigned ge = tools_loading(core, extra, t, n, mods, "extra file");
            ck_assert_msg(ge == v[i].extra, "%s: the extra file %s loads in %#x, expected %#x", v[i].cfg, extra, ge,
                          v[i].extra);
            all |= ge;
        }
        ck_assert_msg(tools_claimed() == all, "%s: the network says its files load in %#x, the loaders' rules give "
                      "%#x:\n%s", v[i].cfg, tools_claimed(), all, grabbed);
        ghc_core_free(core);
    }
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* Save in each naming, check the keys and alpha, load back into a network with another alpha
 * and get the same outputs. */
START_TEST(save_load_formats)
{
    static const struct { const char *cfg, *key0, *algo; } fm[] = {
        { "algo = \"lora\"; rank = 4; alpha = 2.0; format = \"comfyui\"; save_dtype = \"f32\";",
          "diffusion_model.blocks.0.self_attn.q.lora_down.weight", "lora" },
        { "algo = \"lora\"; rank = 4; alpha = 2.0; format = \"musubi\"; save_dtype = \"f32\";",
          "lora_unet_blocks_0_self_attn_q.lora_down.weight", "lora" },
        { "algo = \"lora\"; rank = 4; alpha = 2.0; format = \"diffusers\"; save_dtype = \"f32\";",
          "transformer.blocks.0.attn1.to_q.lora_A.weight", "lora" },
        { "algo = \"loha\"; rank = 2; alpha = 1.0; format = \"comfyui\"; save_dtype = \"f32\";",
          "diffusion_model.blocks.0.self_attn.q.hada_w1_a", "loha" },
        { "algo = \"lokr\"; rank = 2; alpha = 1.0; factor = 4; decompose_both = true; save_dtype = \"f32\";",
          "lora_unet_blocks_0_self_attn_q.lokr_w2_a", "lokr" },
        { "algo = \"lokr\"; rank = 100; factor = 8; format = \"musubi\"; save_dtype = \"f32\";",
          "lora_unet_blocks_2_ffn_2.lokr_w2", "lokr" },
        { "algo = \"lora\"; rank = 4; alpha = 2.0;", "lora_unet_blocks_2_ffn_0.lora_up.weight", "lora" },
    };
    char *dir = tu_tmpdir();
    int32_t n;
    struct ghc_model_target *t = fake_targets(&n);
    for (size_t f = 0; f < sizeof(fm) / sizeof(fm[0]); f++) {
        ghc_core_t *core = core_with(fm[f].cfg, NULL);
        ghc_network_t *net = ghc_network_get(core);
        ok(core, ghc_network_attach(net, 0, t, n));
        randomise(core, net, f + 1);
        char path[4200];
        snprintf(path, sizeof(path), "%s/a%zu.safetensors", dir, f);
        ok(core, ghc_network_save(net, 0, path));
        size_t len;
        /* GHC_LYCORIS_KEEP=dir keeps the files and the layer outputs for
         * tests/fixtures/check_lycoris_load.py (doc/lycoris.md) */
        const char *keep = getenv("GHC_LYCORIS_KEEP");
        ghc_st_writer_t *ref = keep ? ghc_st_writer_init(core) : NULL;
        float *want = outputs_ref(core, net, t, n, &len, ref);
        if (keep) {
            char kp[4200];
            snprintf(kp, sizeof(kp), "%s/a%zu.safetensors", keep, f);
            ok(core, ghc_network_save(net, 0, kp));
            snprintf(kp, sizeof(kp), "%s/a%zu.ref.safetensors", keep, f);
            ok(core, ghc_st_writer_finish(ref, kp));
            ghc_st_writer_free(ref);
        }

        ghc_st_t *st = ghc_st_open(core, path);
        ck_assert_msg(st != NULL, "%s", ghc_error_message(core));
        struct ghc_st_info info;
        ck_assert_msg(ghc_st_find(st, fm[f].key0, &info), "%s: no key %s", fm[f].cfg, fm[f].key0);
        bool peft = strstr(fm[f].cfg, "diffusers") != NULL;
        int alphas = 0;
        for (int i = 0; i < ghc_st_count(st); i++) {
            ghc_st_info_at(st, i, &info);
            if (!peft)
                ck_assert_msg(comfy_key(info.name), "key '%s' is not a form ComfyUI loads for Wan", info.name);
            else
                ck_assert_msg(strncmp(info.name, "transformer.blocks.", 19) == 0 && strstr(info.name, ".lora_"),
                              "diffusers key '%s'", info.name);
            if (strstr(info.name, ".alpha")) {
                ck_assert_int_eq(info.ndim, 0);
                ck_assert_int_eq(info.dtype, GHC_DTYPE_F32);
                alphas++;
            } else {
                ck_assert_int_eq(info.dtype, strstr(fm[f].cfg, "save_dtype") ? GHC_DTYPE_F32 : GHC_DTYPE_BF16);
            }
        }
        ck_assert_int_eq(alphas, peft ? 0 : 30);
        ck_assert_str_eq(ghc_st_metadata(st, "ss_network_args") ? strstr(ghc_st_metadata(st, "ss_network_args"),
                         fm[f].algo) ? fm[f].algo : "?" : "-", fm[f].algo);
        ck_assert_str_eq(ghc_st_metadata(st, "ss_base_model_version"), "wan");
        if (f == 5) {   /* both-full LoKr: the defensive alpha out_k // out_l = 8 // 8... for ffn.2: 64 = (8, 8) */
            ghc_tensor_t *a = load(core, st, "lora_unet_blocks_2_ffn_2.alpha");
            ck_assert_float_eq(*(const float *)ghc_tensor_cdata(a), 1.0f);
            ghc_tensor_free(a);
        }
        if (f == 0) {   /* alpha = alpha (rank 4, alpha 2) */
            ghc_tensor_t *a = load(core, st, "diffusion_model.blocks.1.ffn.0.alpha");
            ck_assert_float_eq(*(const float *)ghc_tensor_cdata(a), 2.0f);
            ghc_tensor_free(a);
        }
        ghc_st_free(st);
        ghc_core_free(core);

        /* load into a network of another alpha: same outputs (scale difference folded in) */
        char cfg2[512];
        snprintf(cfg2, sizeof(cfg2), "%s", fm[f].cfg);
        char *p = strstr(cfg2, "alpha = ");
        if (p)   /* blank the old alpha */
            memset(p, ' ', strcspn(p, ";") + 1);
        strcat(cfg2, " alpha = 7.0;");
        core = core_with(cfg2, NULL);
        net = ghc_network_get(core);
        ok(core, ghc_network_attach(net, 0, t, n));
        ok(core, ghc_network_load(net, 0, path));
        size_t len2;
        float *got = outputs(core, net, t, n, &len2);
        ck_assert_uint_eq(len, len2);
        double e = max_rel(got, want, len);
        printf("%s: reloaded (alpha 7) outputs rel err %.3g\n", fm[f].cfg, e);
        ck_assert_msg(e < (strstr(fm[f].cfg, "save_dtype") ? 1e-6 : 1e-2), "%s: reload rel err %g", fm[f].cfg, e);
        free(got);
        free(want);
        ghc_core_free(core);
    }
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* Write a one-module file for target blocks.0.self_attn.q (in 64, out 48) with tensors given as
 * "name:rows:cols" (cols 0: a 0-dim alpha). */
static char *write_file(ghc_core_t *core, const char *dir, const char *fname, const char *const *spec, int n)
{
    ghc_st_writer_t *w = ghc_st_writer_init(core);
    for (int i = 0; i < n; i++) {
        char name[128];
        int rows, cols;
        ck_assert_int_eq(sscanf(spec[i], "%127[^:]:%d:%d", name, &rows, &cols), 3);
        float *v = calloc((size_t)(rows * (cols ? cols : 1)), sizeof(float));
        v[0] = 1.0f;
        ok(core, ghc_st_writer_add_raw(w, name, GHC_DTYPE_F32, cols ? 2 : 0, (const int64_t[]){ rows, cols }, v));
        free(v);
    }
    char *path = malloc(strlen(dir) + strlen(fname) + 2);
    sprintf(path, "%s/%s", dir, fname);
    ok(core, ghc_st_writer_finish(w, path));
    ghc_st_writer_free(w);
    return path;
}

/* DoRA files: g (and the factors) saved by a network on the wan22 fixture model and loaded by
 * another give the same layer outputs (base W x + b included); dora_scale is F32 [out, 1].
 * With GHC_LYCORIS_KEEP=dir also writes dir/dN.safetensors and dir/dN.ref.safetensors (x.<t>,
 * y.<t>, w.<t>, b.<t>) for check_lycoris_load.py. */
static float *dora_outputs(ghc_core_t *core, ghc_st_writer_t *ref, size_t *len)
{
    ghc_model_t *model = ghc_model_get(core);
    ghc_network_t *net = ghc_network_get(core);
    const struct ghc_model_target *tg;
    int32_t n;
    struct ghc_adapter_hook hook;
    ok(core, ghc_model_targets(model, &tg, &n));
    ok(core, ghc_network_hook(net, 0, &hook));
    size_t total = 0, o = 0;
    for (int32_t t = 0; t < n; t++)
        total += 5 * (size_t)tg[t].out_features;
    float *all = malloc(total * sizeof(float));
    for (int32_t t = 0; t < n; t++) {
        const ghc_tensor_t *w, *b;
        float sc;
        ok(core, ghc_model_target_weight(model, 0, t, &w, &sc, &b));
        ck_assert(sc == 1.0f && b != NULL);
        ghc_tensor_t *xh = mk(core, GHC_DEVICE_CPU, GHC_DTYPE_F32, 3, (const int64_t[]){ 1, 5, tg[t].in_features });
        ok(core, ghc_op_rand_normal(xh, &(struct ghc_rng){ 99, (uint64_t)t << 20 }, NULL));
        ghc_tensor_t *x = on(core, xh, dev, GHC_DTYPE_F32);
        ghc_tensor_t *y = base_linear(core, x, w, b);
        did(core, hook.forward(hook.user, t, x, y, false, NULL), 1);
        ghc_tensor_t *yh = on(core, y, GHC_DEVICE_CPU, GHC_DTYPE_F32);
        memcpy(all + o, ghc_tensor_cdata(yh), 5 * (size_t)tg[t].out_features * sizeof(float));
        o += 5 * (size_t)tg[t].out_features;
        if (ref) {
            char k[128];
            /* again: the model's weight view is its own and the hook's DoRA asked for another */
            ok(core, ghc_model_target_weight(model, 0, t, &w, &sc, &b));
            ghc_tensor_t *wh = on(core, w, GHC_DEVICE_CPU, GHC_DTYPE_F32), *bh = on(core, b, GHC_DEVICE_CPU, GHC_DTYPE_F32);
            snprintf(k, sizeof(k), "x.%s", tg[t].name);
            ok(core, ghc_st_writer_add(ref, k, xh));
            snprintf(k, sizeof(k), "y.%s", tg[t].name);
            ok(core, ghc_st_writer_add(ref, k, yh));
            snprintf(k, sizeof(k), "w.%s", tg[t].name);
            ok(core, ghc_st_writer_add(ref, k, wh));
            snprintf(k, sizeof(k), "b.%s", tg[t].name);
            ok(core, ghc_st_writer_add(ref, k, bh));
            ghc_tensor_free(wh);
            ghc_tensor_free(bh);
        }
        ghc_tensor_free(xh);
        ghc_tensor_free(x);
        ghc_tensor_free(y);
        ghc_tensor_free(yh);
    }
    *len = total;
    return all;
}

START_TEST(dora_save_load)
{
    static const char *const cfgs[] = {
        "algo = \"lora\"; rank = 4; alpha = 2.0; dora_wd = true; save_dtype = \"f32\";",
        "algo = \"lora\"; rank = 4; alpha = 2.0; dora_wd = true; format = \"comfyui\";",
    };
    const char *cfg = cfgs[_i];
    char mcfg[1024], path[4200], kp[4200];
    char *dir = tu_tmpdir();
    snprintf(path, sizeof(path), "%s/dora.safetensors", dir);
    ghc_core_t *core = core_with(cfg, wan22_cfg(mcfg, sizeof(mcfg), true));
    ghc_network_t *net = ghc_network_get(core);
    const struct ghc_model_target *tg;
    int32_t n;
    ok(core, ghc_model_targets(ghc_model_get(core), &tg, &n));
    ok(core, ghc_network_attach(net, 0, tg, n));
    randomise(core, net, 7 + (uint64_t)_i);
    const char *keep = getenv("GHC_LYCORIS_KEEP");
    ghc_st_writer_t *ref = keep ? ghc_st_writer_init(core) : NULL;
    size_t len, len2;
    float *y1 = dora_outputs(core, ref, &len);
    ok(core, ghc_network_save(net, 0, path));
    if (keep) {
        snprintf(kp, sizeof(kp), "%s/d%d.safetensors", keep, _i);
        ok(core, ghc_network_save(net, 0, kp));
        snprintf(kp, sizeof(kp), "%s/d%d.ref.safetensors", keep, _i);
        ok(core, ghc_st_writer_finish(ref, kp));
        ghc_st_writer_free(ref);
    }
    ghc_st_t *st = ghc_st_open(core, path);
    struct ghc_st_info info;
    ck_assert(ghc_st_find(st, _i ? "diffusion_model.blocks.1.ffn.0.dora_scale" : "lora_unet_blocks_1_ffn_0.dora_scale",
                          &info));
    ck_assert_str_eq(ghc_st_metadata(st, LYC_DORA_NORM_KEY), "base_weight");
    /* the wan22 model claims Wan's architecture (its architecture member): Wan's metadata */
    ck_assert_str_eq(ghc_st_metadata(st, "ss_base_model_version"), "wan");
    ck_assert_str_eq(ghc_st_metadata(st, "modelspec.architecture"), "wan2.1/lora");
    ck_assert_str_eq(ghc_st_metadata(st, "modelspec.implementation"), "https://github.com/Wan-Video/Wan2.1");
    ck_assert_int_eq(info.dtype, GHC_DTYPE_F32);
    ck_assert_int_eq(info.ndim, 2);
    ck_assert_int_eq(info.shape[0], 176);
    ck_assert_int_eq(info.shape[1], 1);
    ghc_st_free(st);
    ghc_core_free(core);

    core = core_with(cfg, wan22_cfg(mcfg, sizeof(mcfg), true));
    net = ghc_network_get(core);
    ok(core, ghc_model_targets(ghc_model_get(core), &tg, &n));
    ok(core, ghc_network_attach(net, 0, tg, n));
    ok(core, ghc_network_load(net, 0, path));
    float *y2 = dora_outputs(core, NULL, &len2);
    ck_assert_uint_eq(len, len2);
    double e = max_rel(y2, y1, len);
    printf("dora save/load (%s): max rel diff %.3g\n", cfg, e);
    ck_assert_msg(e < (_i ? 2e-2 : 1e-6), "dora reload: %g", e);
    /* a dora_norm the reader does not know: refused, nothing loaded */
    st = ghc_st_open(core, path);
    ghc_st_writer_t *bw = ghc_st_writer_init(core);
    for (int k = 0; k < ghc_st_count(st); k++) {
        struct ghc_st_info t;
        ghc_st_info_at(st, k, &t);
        ok(core, ghc_st_writer_add_raw(bw, t.name, t.dtype, t.ndim, t.shape, ghc_st_raw(st, t.name)));
    }
    ok(core, ghc_st_writer_metadata(bw, LYC_DORA_NORM_KEY, "row_norms"));
    snprintf(kp, sizeof(kp), "%s/bad_norm.safetensors", dir);
    ok(core, ghc_st_writer_finish(bw, kp));
    ghc_st_writer_free(bw);
    ghc_st_free(st);
    ck_assert_int_eq(ghc_network_load(net, 0, kp), GHC_EFORMAT);
    ck_assert_msg(strstr(ghc_error_message(core), "gh200core.dora_norm = 'row_norms'"), "%s", ghc_error_message(core));
    free(y1);
    free(y2);
    ghc_core_free(core);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(malformed_files)
{
    static const struct { const char *what; const char *t[4]; int n; const char *msg; } bad[] = {
        { "missing up", { "diffusion_model.blocks.0.self_attn.q.lora_down.weight:4:64",
                          "diffusion_model.blocks.0.self_attn.q.alpha:1:0" }, 2, "'lora_up.weight' is missing" },
        { "missing down", { "lora_unet_blocks_0_self_attn_q.lora_up.weight:48:4" }, 1, "'lora_down.weight' is missing" },
        { "wrong shape", { "diffusion_model.blocks.0.self_attn.q.lora_down.weight:4:65",
                           "diffusion_model.blocks.0.self_attn.q.lora_up.weight:48:4" }, 2,
          "lora_down.weight': shape [4, 65] F32, expected [4, 64]" },
        { "wrong rank", { "diffusion_model.blocks.0.self_attn.q.lora_down.weight:8:64",
                          "diffusion_model.blocks.0.self_attn.q.lora_up.weight:48:8" }, 2, "expected [4, 64]" },
        { "unknown algorithm", { "diffusion_model.blocks.0.self_attn.q.oft_blocks:4:12" }, 1,
          "unknown adapter tensor 'oft_blocks'" },
        { "other algorithm", { "diffusion_model.blocks.0.self_attn.q.hada_w1_a:48:4" }, 1,
          "the file holds LoHa tensors, the network is configured for algo \"lora\"" },
        { "dora", { "diffusion_model.blocks.0.self_attn.q.dora_scale:48:1" }, 1, "set dora_wd = true to load it" },
        { "no tensors", { "diffusion_model.blocks.7.self_attn.q.lora_up.weight:48:4" }, 1,
          "no adapter tensors for module 'blocks.0.self_attn.q'" },
        { "bad alpha", { "diffusion_model.blocks.0.self_attn.q.lora_down.weight:4:64",
                         "diffusion_model.blocks.0.self_attn.q.lora_up.weight:48:4",
                         "diffusion_model.blocks.0.self_attn.q.alpha:2:2" }, 3, "alpha must be one float" },
    };
    char *dir = tu_tmpdir();
    ghc_core_t *core = core_with("algo = \"lora\"; rank = 4;", NULL);
    ghc_network_t *net = ghc_network_get(core);
    ok(core, ghc_network_attach(net, 0, &one_target, 1));
    randomise(core, net, 3);
    size_t len;
    float *before = outputs(core, net, &one_target, 1, &len);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *path = write_file(core, dir, "bad.safetensors", bad[i].t, bad[i].n);
        int rc = ghc_network_load(net, 0, path);
        const char *msg = ghc_error_message(core);
        printf("%s: %s\n", bad[i].what, msg);
        ck_assert_msg(rc == GHC_EFORMAT, "%s: rc %d (%s)", bad[i].what, rc, msg);
        ck_assert_msg(strstr(msg, bad[i].msg) && strstr(msg, path), "%s: message '%s' lacks '%s' or the path",
                      bad[i].what, msg, bad[i].msg);
        free(path);
    }
    /* nothing changed */
    float *after = outputs(core, net, &one_target, 1, &len);
    ck_assert(memcmp(before, after, len * sizeof(float)) == 0);
    /* not a safetensors file; absent file */
    char *junk = tu_write(dir, "junk.safetensors", "not a file");
    ck_assert_int_eq(ghc_network_load(net, 0, junk), GHC_EFORMAT);
    ck_assert_int_lt(ghc_network_load(net, 0, "/nonexistent/a.safetensors"), 0);
    /* a LoKr layout mismatch: full W2 in the file, low-rank in the network */
    ghc_core_t *c2 = core_with("algo = \"lokr\"; rank = 2; factor = 4;", NULL);
    ok(c2, ghc_network_attach(ghc_network_get(c2), 0, &one_target, 1));
    static const char *const lk[] = { "diffusion_model.blocks.0.self_attn.q.lokr_w1:4:4",
                                      "diffusion_model.blocks.0.self_attn.q.lokr_w2:12:16" };
    char *path = write_file(c2, dir, "lk.safetensors", lk, 2);
    ck_assert_int_eq(ghc_network_load(ghc_network_get(c2), 0, path), GHC_EFORMAT);
    printf("lokr layout: %s\n", ghc_error_message(c2));
    ck_assert(strstr(ghc_error_message(c2), "lokr_w2") != NULL);
    free(path);
    ghc_core_free(c2);
    free(junk);
    free(before);
    free(after);
    ghc_core_free(core);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* ---- targets, dropout, config ----------------------------------------------------------------- */

START_TEST(target_selection)
{
    static const struct { const char *cfg; int mods; const char *has, *hasnt; } v[] = {
        { "", 30, "blocks.2.ffn.2.lora_up.weight", NULL },
        { "preset = \"attn\";", 24, "blocks.1.cross_attn.o.lora_up.weight", "blocks.0.ffn.0.lora_up.weight" },
        { "preset = \"attn\"; include = [ \"blocks.0.ffn.*\" ];", 26, "blocks.0.ffn.2.lora_up.weight",
          "blocks.1.ffn.0.lora_up.weight" },
        { "exclude = [ \"*.cross_attn.k\", \"*.cross_attn.v\" ];", 24, "blocks.0.cross_attn.q.lora_up.weight",
          "blocks.2.cross_attn.v.lora_up.weight" },
        { "exclude = [ \"blocks.2.*\" ];", 20, "blocks.1.ffn.2.lora_down.weight", "blocks.2.self_attn.q.lora_up.weight" },
    };
    int32_t n;
    struct ghc_model_target *t = fake_targets(&n);
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        ghc_core_t *core = core_with(v[i].cfg, NULL);
        ghc_network_t *net = ghc_network_get(core);
        ok(core, ghc_network_attach(net, 1, t, n));
        struct ghc_param *ps;
        int32_t np;
        ok(core, ghc_network_params(net, 1, &ps, &np));
        ck_assert_msg(np == 2 * v[i].mods, "%s: %d params", v[i].cfg, np);
        bool has = false, hasnt = false;
        for (int32_t k = 0; k < np; k++) {
            has |= strcmp(ps[k].name, v[i].has) == 0;
            hasnt |= v[i].hasnt && strcmp(ps[k].name, v[i].hasnt) == 0;
            ck_assert_int_eq(ps[k].group, 1);
        }
        ck_assert_msg(has && !hasnt, "%s", v[i].cfg);
        ck_assert_int_eq(ghc_network_params(net, 0, &ps, &np), GHC_EINVAL);   /* expert 0 not attached */
        ghc_core_free(core);
    }
    /* overrides: ffn rank 2 alpha 8 -> alpha file 8, scale 4 */
    ghc_core_t *core = core_with("rank = 4; overrides = [ \"*.ffn.*:2:8\", \"blocks.0.self_attn.q:6\" ];", NULL);
    ghc_network_t *net = ghc_network_get(core);
    ok(core, ghc_network_attach(net, 0, t, n));
    struct ghc_param *ps;
    int32_t np;
    ok(core, ghc_network_params(net, 0, &ps, &np));
    for (int32_t k = 0; k < np; k++) {
        int64_t r = strstr(ps[k].name, "down") ? ghc_tensor_dim(ps[k].value, 0) : ghc_tensor_dim(ps[k].value, 1);
        int64_t want = strstr(ps[k].name, ".ffn.") ? 2 : strncmp(ps[k].name, "blocks.0.self_attn.q", 20) == 0 ? 6 : 4;
        ck_assert_msg(r == want, "%s: rank %lld, expected %lld", ps[k].name, (long long)r, (long long)want);
    }
    char *dir = tu_tmpdir(), path[4200];
    snprintf(path, sizeof(path), "%s/o.safetensors", dir);
    ok(core, ghc_network_save(net, 0, path));
    ghc_st_t *st = ghc_st_open(core, path);
    ghc_tensor_t *a = load(core, st, "lora_unet_blocks_1_ffn_0.alpha");
    ck_assert_float_eq(*(const float *)ghc_tensor_cdata(a), 8.0f);   /* the override's alpha, per layer */
    ghc_tensor_free(a);
    a = load(core, st, "lora_unet_blocks_0_self_attn_q.alpha");
    ck_assert_float_eq(*(const float *)ghc_tensor_cdata(a), 6.0f);   /* alpha unset: = rank */
    ghc_tensor_free(a);
    ghc_st_free(st);
    ghc_core_free(core);
    /* nothing selected */
    core = core_with("preset = \"attn\"; exclude = [ \"*attn*\" ];", NULL);
    ck_assert_int_eq(ghc_network_attach(ghc_network_get(core), 0, t, n), GHC_EINVAL);
    ck_assert(strstr(ghc_error_message(core), "no target selected") != NULL);
    ghc_core_free(core);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* preset "full" selects every target the model offers: on a model with targets outside its
 * blocks it adds them to attn_ffn's; the wan22 model offers only the 10 linears of each block,
 * so there "full" selects exactly what "attn_ffn" does, and attach says so. */
START_TEST(preset_full)
{
    int32_t n;
    struct ghc_model_target *t30 = fake_targets(&n), t[32];
    memcpy(t, t30, 30 * sizeof(*t));
    t[30] = (struct ghc_model_target){ .name = "time_projection.1", .in_features = 64, .out_features = 96, .block = -1 };
    t[31] = (struct ghc_model_target){ .name = "head.head", .in_features = 64, .out_features = 64, .block = -1 };
    static const struct { const char *cfg; int mods; const char *says; } v[] = {
        { "preset = \"attn_ffn\";", 30, "preset \"attn_ffn\": 30 of the model's 32 targets" },
        { "preset = \"full\";", 32, "preset \"full\": 32 of the model's 32 targets (30 block linears, 24 of them "
          "attention); 2 of them outside the blocks (not in \"attn_ffn\")" },
        { "preset = \"attn\";", 24, "preset \"attn\": 24 of the model's 32 targets" },
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        ghc_core_t *core = core_with(v[i].cfg, NULL);
        grabbed[0] = '\0';
        ghc_log_set_sink(core, log_grab, NULL);
        ok(core, ghc_network_attach(ghc_network_get(core), 0, t, 32));
        struct ghc_param *ps;
        int32_t np;
        ok(core, ghc_network_params(ghc_network_get(core), 0, &ps, &np));
        ck_assert_msg(np == 2 * v[i].mods, "%s: %d params", v[i].cfg, np);
        ck_assert_msg(strstr(grabbed, v[i].says), "%s: attach said:\n%s", v[i].cfg, grabbed);
        ghc_core_free(core);
    }
    /* the wan22 model: full = attn_ffn, module for module */
    char mcfg[1024], *names[2] = { NULL, NULL };
    for (int k = 0; k < 2; k++) {
        ghc_core_t *core = core_with(k ? "preset = \"full\";" : "", wan22_cfg(mcfg, sizeof(mcfg), true));
        const struct ghc_model_target *tg;
        int32_t nt;
        ok(core, ghc_model_targets(ghc_model_get(core), &tg, &nt));
        grabbed[0] = '\0';
        ghc_log_set_sink(core, log_grab, NULL);
        ok(core, ghc_network_attach(ghc_network_get(core), 0, tg, nt));
        struct ghc_param *ps;
        int32_t np;
        ok(core, ghc_network_params(ghc_network_get(core), 0, &ps, &np));
        size_t len = 0;
        for (int32_t j = 0; j < np; j++)
            len += strlen(ps[j].name) + 1;
        names[k] = calloc(len + 1, 1);
        for (int32_t j = 0; j < np; j++)
            strcat(strcat(names[k], ps[j].name), "\n");
        ck_assert_int_eq(np, 2 * nt);
        if (k)
            ck_assert_msg(strstr(grabbed, "the model offers no target outside its blocks, so \"full\" selects what "
                                 "\"attn_ffn\" does here"), "wan22, full: attach said:\n%s", grabbed);
        ghc_core_free(core);
    }
    ck_assert_str_eq(names[0], names[1]);
    free(names[0]);
    free(names[1]);
}
END_TEST

/* The adapter's contribution to y of target 0 for an input of ones, at step `step`; the forward
 * returns 1, or 0 where module dropout skips the module (y untouched). */
static float *delta_at(ghc_core_t *core, ghc_network_t *net, int64_t step, int want)
{
    struct ghc_adapter_hook hook;
    ok(core, ghc_network_hook(net, 0, &hook));
    ok(core, ghc_network_begin_step(net, step));
    ghc_tensor_t *x = mk(core, -1, GHC_DTYPE_F32, 3, (const int64_t[]){ 1, 2, 64 });
    ghc_tensor_t *y = mk(core, -1, GHC_DTYPE_F32, 3, (const int64_t[]){ 1, 2, 48 });
    ok(core, ghc_op_fill(x, 1.0, NULL));
    ok(core, ghc_op_fill(y, 0.0, NULL));
    did(core, hook.forward(hook.user, 0, x, y, false, NULL), want);
    float *v = malloc(96 * sizeof(float));
    memcpy(v, ghc_tensor_cdata(y), 96 * sizeof(float));
    ghc_tensor_free(x);
    ghc_tensor_free(y);
    return v;
}

START_TEST(dropout)
{
    ghc_core_t *c0 = core_with("rank = 4; seed = 3;", NULL);
    ghc_core_t *c1 = core_with("rank = 4; seed = 3; rank_dropout = 0.5;", NULL);
    ghc_core_t *c2 = core_with("rank = 4; seed = 3; module_dropout = 1.0;", NULL);
    ghc_core_t *c3 = core_with("rank = 4; seed = 3; rank_dropout = 0.5; rank_dropout_scale = true;", NULL);
    ghc_core_t *cs[] = { c0, c1, c2, c3 };
    for (int i = 0; i < 4; i++) {
        ok(cs[i], ghc_network_attach(ghc_network_get(cs[i]), 0, &one_target, 1));
        randomise(cs[i], ghc_network_get(cs[i]), 11);
    }
    float *full = delta_at(c0, ghc_network_get(c0), 1, 1);
    float *a = delta_at(c1, ghc_network_get(c1), 1, 1), *a2 = delta_at(c1, ghc_network_get(c1), 1, 1);
    float *b = delta_at(c1, ghc_network_get(c1), 2, 1), *off = delta_at(c2, ghc_network_get(c2), 1, 0);
    float *sc = delta_at(c3, ghc_network_get(c3), 1, 1);
    ck_assert(memcmp(a, a2, 96 * sizeof(float)) == 0);          /* same step: same masks (recomputation) */
    ck_assert(memcmp(a, b, 96 * sizeof(float)) != 0);           /* another step: other masks */
    int kept = 0;
    for (int k = 0; k < 48; k++) {
        bool on = a[k] != 0.0f;
        kept += on;
        for (int row = 0; row < 2; row++)   /* a whole output row of delta-W is kept or dropped */
            ck_assert_float_eq(a[row * 48 + k], on ? full[row * 48 + k] : 0.0f);
    }
    ck_assert_msg(kept > 10 && kept < 38, "kept %d of 48 rows at p = 0.5", kept);
    for (int k = 0; k < 48; k++)   /* d / mean(d): kept rows scaled by 48 / kept */
        if (a[k] != 0.0f)
            ck_assert_float_eq_tol(sc[k], full[k] * 48.0f / (float)kept, 1e-4f * fabsf(full[k]) + 1e-6f);
    for (int k = 0; k < 96; k++)
        ck_assert_float_eq(off[k], 0.0f);                        /* module dropout 1: skipped */
    float *ptrs[] = { full, a, a2, b, off, sc };
    for (int i = 0; i < 6; i++)
        free(ptrs[i]);
    for (int i = 0; i < 4; i++)
        ghc_core_free(cs[i]);
}
END_TEST

START_TEST(config_errors)
{
    static const struct { const char *cfg, *msg; } v[] = {
        { "algo = \"loha\"; dora_wd = true;", "dora_wd is implemented for algo" },
        { "dora_wd = true; rank_dropout = 0.1;", "dora_wd is implemented for algo" },
        { "dora_wd = true; format = \"diffusers\";", "dora_wd is implemented for algo" },
        { "algo = \"lokr\"; format = \"diffusers\";", "format \"diffusers\" holds LoRA only" },
        { "extra_formats = [ \"kohya\" ];", "extra_formats: 'kohya' is not one of" },
        { "extra_formats = [ \"musubi\" ];", "extra_formats: 'musubi' is already written" },
        { "extra_formats = [ \"comfyui\", \"comfyui\" ];", "extra_formats: 'comfyui' is already written" },
        { "algo = \"loha\"; extra_formats = [ \"diffusers\" ];", "\"diffusers\" holds plain LoRA only" },
        { "dora_wd = true; extra_formats = [ \"diffusers\" ];", "\"diffusers\" holds plain LoRA only" },
        { "algo = \"oft\";", "algo" },
        { "overrides = [ \"*.ffn.*\" ];", "expected \"pattern:rank\"" },
        { "overrides = [ \"*.ffn.*:0\" ];", "rank >= 1" },
        { "factor = 0;", "factor must be -1" },
        { "rank = 0;", "rank" },
        { "rank_dropout = 1.5;", "rank_dropout" },
        { "ranks = 4;", "unknown key 'ranks'" },
        /* gone with the core's choice of way (linear.h): H always kept, K-concatenation wherever
         * the plan and the model allow, dy always cast by concat_backward */
        { "keep_h = false;", "unknown key 'keep_h'" },
        { "concat = false;", "unknown key 'concat'" },
        { "fuse_cast = false;", "unknown key 'fuse_cast'" },
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        ghc_core_t *core = ghc_core_init();
        ok(core, ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")));
        char text[1024];
        snprintf(text, sizeof(text), "mempolicy = { plugin = \"host\"; };\nnetwork = { plugin = \"lycoris\"; %s };\n",
                 v[i].cfg);
        ok(core, ghc_config_load_string(core, text, "t.cfg", NULL, NULL, 0));
        ck_assert_int_lt(ghc_run_init(core), 0);
        printf("%s -> %s\n", v[i].cfg, ghc_error_message(core));
        ck_assert_msg(strstr(ghc_error_message(core), v[i].msg) && strstr(ghc_error_message(core), "t.cfg:"),
                      "%s: '%s'", v[i].cfg, ghc_error_message(core));
        ghc_core_free(core);
    }
    /* wrappers: expert out of range with a model; hook before attach */
    char mcfg[1024];
    ghc_core_t *core = core_with("", wan22_cfg(mcfg, sizeof(mcfg), false));
    ghc_network_t *net = ghc_network_get(core);
    struct ghc_adapter_hook h;
    ck_assert_int_eq(ghc_network_attach(net, 1, &one_target, 1), GHC_EINVAL);   /* one expert */
    ck_assert_int_eq(ghc_network_hook(net, 0, &h), GHC_EINVAL);
    ck_assert(strstr(ghc_error_message(core), "attach first") != NULL);
    ghc_core_free(core);
}
END_TEST

/* The key prefixes of the three namings. */
START_TEST(key_names)
{
    struct lyc_module md = { .name = "blocks.12.cross_attn.o", .alias = "blocks.12.attn2.to_out.0" };
    char buf[128];
    ck_assert_str_eq(lyc_key_prefix(&md, LYC_FMT_COMFYUI, buf, sizeof(buf)), "diffusion_model.blocks.12.cross_attn.o");
    ck_assert_str_eq(lyc_key_prefix(&md, LYC_FMT_MUSUBI, buf, sizeof(buf)), "lora_unet_blocks_12_cross_attn_o");
    ck_assert_str_eq(lyc_key_prefix(&md, LYC_FMT_DIFFUSERS, buf, sizeof(buf)), "transformer.blocks.12.attn2.to_out.0");
}
END_TEST

static Suite *lycoris_suite(void)
{
    Suite *s = suite_create("lycoris");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, factorization);
    tcase_add_test(tc, key_names);
    tcase_add_loop_test(tc, golden, 0, N_GCASES);
    tcase_add_loop_test(tc, golden_bf16_input, 0, N_GCASES);
    tcase_add_test(tc, save_load_formats);
    tcase_add_test(tc, default_file_loaders);
    tcase_add_loop_test(tc, dora_save_load, 0, 2);
    tcase_add_test(tc, malformed_files);
    tcase_add_test(tc, target_selection);
    tcase_add_test(tc, preset_full);
    tcase_add_test(tc, dropout);
    tcase_add_test(tc, config_errors);
    tcase_add_loop_test(tc, wan22_fixture_lora, 0, 3);
    tcase_add_loop_test(tc, wan22_finite_differences, 0, 5);
    tcase_add_loop_test(tc, wan22_first_vs_after, 0, (int)(sizeof(first_cfgs) / sizeof(first_cfgs[0])));
    tcase_add_loop_test(tc, wan22_keep_h, 0, 2);
    tcase_add_loop_test(tc, wan22_concat, 0, (int)(sizeof(concat_cfgs) / sizeof(concat_cfgs[0])));
    tcase_add_loop_test(tc, linear_gelu, 0, N_LG_CASES);
    tcase_add_test(tc, linear_bf16_bias);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tu_run_suite(lycoris_suite(), false);
}
