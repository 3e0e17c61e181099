/* estimate.c: pardit's plugin-level members (model.h), called without an instance:
 *   estimate     what a training run of the configured model takes, from the [model] section
 *                alone (pardit loads no checkpoint): the numbers follow what pardit.c
 *                allocates, plin_init (the weights with their spare room) and act_ensure (the
 *                activations and the backward's buffers, all made once per batch shape), so a
 *                change there changes these formulas;
 *   merge_names  the adapter module names of a base checkpoint's tensor, for `gh200core merge`.
 * pardit keeps every activation (no gradient checkpointing) and computes in f32. */
#include <stdio.h>
#include <string.h>

#include "pardit.h"   /* defines: struct pardit_cfg, pardit_cfg_read, pardit_target_shape */

/* ---- estimate -------------------------------------------------------------------------------- */

/* Elements of a linear as plin_init stores it: a target keeps `spare` rows after its weight and
 * `spare` columns from spare_col; the bias has out. */
static uint64_t lin_numel(int64_t out, int64_t in, int64_t spare_col, int64_t spare, bool target)
{
    const int64_t rows = target ? out + spare : out, cols = target ? spare_col + spare : in;
    return (uint64_t)(rows * cols + out);
}

/* Adds n targets of [in -> out] to the shapes, merging equal ones. */
static void shape_add(struct ghc_model_memory *r, int64_t in, int64_t out, int64_t n)
{
    for (int32_t k = 0; k < r->n_shapes; k++)
        if (r->shapes[k].in_features == in && r->shapes[k].out_features == out) {
            r->shapes[k].count += n;
            return;
        }
    if (r->n_shapes < GHC_MODEL_MEMORY_SHAPES)
        r->shapes[r->n_shapes++] = (struct ghc_target_shape){ .in_features = in, .out_features = out, .count = n };
}

int pardit_estimate(ghc_core_t *core, ghc_cfg_t *cfg, int64_t batch, int64_t tokens, struct ghc_model_memory *out)
{
    struct pardit_cfg c;
    int rc = pardit_cfg_read(core, cfg, &c);
    if (rc < 0)
        return rc;
    const int64_t D = c.D, M = c.M, C = c.C, s = c.spare, nm = 3 * c.nb + 2, nt = pardit_n_targets(&c);
    struct ghc_model_memory r = { .struct_size = out->struct_size, .experts = 1, .checkpoint_every = 0 };

    /* weights: the targets with their room, embed, time_in, mod, head and I_C */
    uint64_t block = 0, w = 0;
    for (int32_t t = 0; t < nt; t++) {
        int64_t o, i, sc;
        pardit_target_shape(&c, t, &o, &i, &sc);
        uint64_t n = lin_numel(o, i, sc, s, true);
        w += n;
        block += t < SLOTS ? n : 0;
        shape_add(&r, i, o, 1);
    }
    w += lin_numel(D, C, C, 0, false) + lin_numel(D, c.Ft, c.Ft, 0, false) + lin_numel(nm * D, D, D, 0, false) +
         lin_numel(C, D, D, 0, false) + (uint64_t)(C * C);
    r.weights = 4 * w;
    r.block = 4 * block;

    /* activations for B samples of L video tokens: S = L + Lt rows each in the joint stream */
    const uint64_t B = (uint64_t)batch, L = (uint64_t)tokens, S = L + (uint64_t)c.Lt;
    const uint64_t uD = (uint64_t)D, uM = (uint64_t)M, uC = (uint64_t)C, us = (uint64_t)s;
    const uint64_t wide = (uint64_t)(3 * D > M ? (3 * D > C ? 3 * D : C) : (M > C ? M : C));
    uint64_t per_block = S * (2 + (uD + 2 * us) + 3 * uD + 3 * uD + (uD + us) + uD + uM + (uM + us) + uD) +
                         (uint64_t)c.H * S;   /* st, xn, qkv, q k v, xo, ya, u, xg, ym; lse */
    uint64_t fwd = L * (uC + uC + 3 * uD)                                /* lat, tok, pos, hpos (host), ev */
                 + (uint64_t)c.Lt * ((uint64_t)c.Dt + us + uD)           /* txp, et */
                 + 1 + 2 * (uint64_t)c.Ft + 2 * uD + 2 * (uint64_t)nm * uD   /* th, sinus, tpre, temb, modo, mod */
                 + ((uint64_t)c.nb + 1) * S * uD                         /* the residual stream */
                 + (uint64_t)c.nb * per_block
                 + L * (uD + 2 + uD + uC + uC);                          /* hv, fst, nf, ho, out */
    uint64_t bwd = L * (uC + uC + uD + uD) + S * (uD + uD + uM + uM + uD + uD + 3 * uD + 3 * uD) +
                   S * (wide + us) + (uint64_t)c.Lt * uD + L * (uD + uC);
    /* dout, dho, dnf, dhv; dh, dyo, dg, du, dn, dao, dq dk dv, dqkv; gp; det; dev, dtok */
    r.activations_full = r.activations_ckpt = 4 * B * fwd;   /* no checkpointing: the same */
    r.backward_scratch = 4 * B * bwd;
    r.text_embeds = 4 * B * (uint64_t)c.Lt * (uint64_t)c.Dt;
    r.latents = 4 * 4 * B * uC * L;   /* noisy, the output, its gradient, dnoisy */
    snprintf(r.summary, sizeof(r.summary), "dim %lld, mlp %lld, %lld parallel blocks, %lld targets (spare %lld), "
             "%llu f32 weights", (long long)D, (long long)M, (long long)c.nb, (long long)nt, (long long)s,
             (unsigned long long)w);
    memcpy(out, &r, out->struct_size < sizeof(r) ? out->struct_size : sizeof(r));
    return 0;
}

/* ---- merge_names ----------------------------------------------------------------------------- */

/* A 2-D <module>.weight in pardit's naming ("blocks.0.attn.qkv.weight", "text_in.weight") is
 * that module, dotted and underscored (musubi-tuner's lora_unet_ names: "blocks_0_attn_qkv");
 * anything else takes no adapter. */
int pardit_merge_names(ghc_core_t *core, const char *tensor, int32_t ndim, const int64_t *shape,
                       struct ghc_merge_names *out)
{
    (void)core;
    (void)shape;   /* the core checks it against the adapter's delta-W */
    struct ghc_merge_names n = { .struct_size = out->struct_size };
    const size_t l = strlen(tensor), sl = strlen(".weight");
    if (ndim == 2 && l > sl && l - sl < sizeof(n.name[0]) && strcmp(tensor + l - sl, ".weight") == 0) {
        for (int u = 0; u < 2; u++) {
            snprintf(n.name[u], sizeof(n.name[u]), "%.*s", (int)(l - sl), tensor);
            for (char *p = n.name[u]; u && *p; p++)
                if (*p == '.')
                    *p = '_';
            n.underscored[u] = u;
        }
        n.n = 2;
    }
    memcpy(out, &n, out->struct_size < sizeof(n) ? out->struct_size : sizeof(n));
    return 0;
}
