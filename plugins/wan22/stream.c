/* stream.c: the wan22 side of streaming weights and saved activations through the memory
 * policy: each block's weights declared as one group, and a block's weights mapped to where
 * the policy holds them for the block's compute (offload: a ring buffer on the device; with
 * any other policy map() is the identity and the block's own tensors are used unchanged); and
 * each block's saved unit (wan22_unit: its input, and with "block_attn" its attention output)
 * opened where the policy gives it (offload: a device buffer of its saved ring, copied home
 * when a forward closes it and back ahead of the backward; elsewhere the unit in place). */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include "wan22_impl.h"

#define BLOCK_FIELDS (1 + 2 * WAN22_TARGETS + 6)

/* The tensor fields of a block, in a fixed order. */
static void block_fields(struct wan22_block_w *bw, ghc_tensor_t **f[BLOCK_FIELDS])
{
    int n = 0;
    f[n++] = &bw->mod;
    for (int k = 0; k < WAN22_TARGETS; k++) {
        f[n++] = &bw->w[k];
        f[n++] = &bw->b[k];
    }
    f[n++] = &bw->norm_q;
    f[n++] = &bw->norm_k;
    f[n++] = &bw->cnorm_q;
    f[n++] = &bw->cnorm_k;
    f[n++] = &bw->norm3_w;
    f[n++] = &bw->norm3_b;
}

int wan22_weights_group(struct wan22 *m, int32_t expert)
{
    ghc_mempolicy_t *mp = ghc_mempolicy_get(m->core);
    struct wan22_weights *w = &m->experts[expert];
    if (!mp || !w->blocks)
        return 0;
    for (int64_t i = 0; i < m->d.layers; i++) {
        ghc_tensor_t **f[BLOCK_FIELDS];
        void *ptrs[BLOCK_FIELDS];
        size_t bytes[BLOCK_FIELDS];
        int n = 0, rc;
        block_fields(&w->blocks[i], f);
        for (int k = 0; k < BLOCK_FIELDS; k++)
            if (*f[k]) {
                ptrs[n] = ghc_tensor_data(*f[k]);
                bytes[n++] = ghc_tensor_nbytes(*f[k]);
            }
        if ((rc = ghc_mem_group(mp, (int64_t)expert * m->d.layers + i, ptrs, bytes, n)) < 0)
            return rc;
    }
    return 0;
}

int wan22_block_map(struct wan22 *m, const struct wan22_block_w *bw, struct wan22_block_w *tmp,
                    const struct wan22_block_w **out)
{
    ghc_mempolicy_t *mp = ghc_mempolicy_get(m->core);
    ghc_tensor_t **src[BLOCK_FIELDS], **dst[BLOCK_FIELDS];
    bool moved = false;
    *out = bw;
    if (!mp)
        return 0;
    *tmp = *bw;
    block_fields((struct wan22_block_w *)bw, src);
    block_fields(tmp, dst);
    for (int k = 0; k < BLOCK_FIELDS; k++)
        *dst[k] = NULL;
    for (int k = 0; k < BLOCK_FIELDS; k++) {
        ghc_tensor_t *t = *src[k];
        void *at = t ? ghc_mem_map(mp, ghc_tensor_data(t)) : NULL;
        if (!t || at == ghc_tensor_data(t)) {
            *dst[k] = t;
            continue;
        }
        *dst[k] = ghc_tensor_wrap(m->core, ghc_tensor_dtype(t), ghc_tensor_ndim(t), ghc_tensor_shape(t),
                                  ghc_tensor_device(t), at);
        if (!*dst[k]) {
            for (int j = 0; j < k; j++)
                if (*dst[j] != *src[j])
                    ghc_tensor_free(*dst[j]);
            return ghc_error_code(m->core);
        }
        moved = true;
    }
    if (moved) {
        *out = tmp;
    } else {
        memset(tmp, 0, sizeof(*tmp));
    }
    return 0;
}

void wan22_block_unmap(const struct wan22_block_w *bw, struct wan22_block_w *tmp)
{
    ghc_tensor_t **src[BLOCK_FIELDS], **dst[BLOCK_FIELDS];
    if (!tmp)
        return;
    block_fields((struct wan22_block_w *)bw, src);
    block_fields(tmp, dst);
    for (int k = 0; k < BLOCK_FIELDS; k++)   /* only the wrappers wan22_block_map made */
        if (*dst[k] != *src[k])
            ghc_tensor_free(*dst[k]);
}

/* ---- saved activations ----------------------------------------------------------------------- */

static void uview_clear(struct wan22_uview *v)
{
    ghc_tensor_free(v->v4);
    ghc_tensor_free(v->v);
    ghc_tensor_free(v->kb);
    ghc_tensor_free(v->qb);
    ghc_tensor_free(v->o);   /* a view of op, or op's place when there are no spare columns */
    ghc_tensor_free(v->op);
    ghc_tensor_free(v->lse);
    ghc_tensor_free(v->x);
    memset(v, 0, sizeof(*v));
}

int wan22_unit_begin(struct wan22 *m, int64_t i, bool write, struct wan22_uview *v, void *stream)
{
    struct wan22_state *s = &m->st;
    const struct wan22_unit *u = &s->units[i];
    const int64_t B = s->B, L = s->L, D = m->d.dim, H = m->d.heads, P = m->concat ? m->pad : 0;
    void *home = ghc_tensor_data(u->home), *at = NULL;
    int rc = ghc_mem_saved_begin(ghc_mempolicy_get(m->core), home, u->bytes, i, write, stream, &at);
    if (rc < 0)
        return rc;
    *v = (struct wan22_uview){ .open = true, .unit = i, .at = at };
    const int dev = ghc_tensor_device(u->home);
    if (!(v->x = ghc_tensor_wrap(m->core, GHC_DTYPE_F32, 3, (const int64_t[]){ B, L, D }, dev, at)))
        goto fail;
    if (u->off_o) {
        char *o = (char *)at + u->off_o;
        if (P) {
            if (!(v->op = ghc_tensor_wrap(m->core, m->base, 3, (const int64_t[]){ B, L, D + P }, dev, o)) ||
                !(v->o = ghc_tensor_view_cols(v->op, 0, D)))
                goto fail;
        } else if (!(v->o = ghc_tensor_wrap(m->core, m->base, 3, (const int64_t[]){ B, L, D }, dev, o))) {
            goto fail;
        }
        if (!(v->lse = ghc_tensor_wrap(m->core, GHC_DTYPE_F32, 3, (const int64_t[]){ B, H, L }, dev,
                                       (char *)at + u->off_lse)))
            goto fail;
    }
    if (u->off_qb) {
        const int64_t sh[3] = { B, L, D };
        char *vp = (char *)at + u->off_v;
        if (!(v->qb = ghc_tensor_wrap(m->core, m->base, 3, sh, dev, (char *)at + u->off_qb)) ||
            !(v->kb = ghc_tensor_wrap(m->core, m->base, 3, sh, dev, (char *)at + u->off_kb)) ||
            !(v->v = ghc_tensor_wrap(m->core, m->base, 3, sh, dev, vp)) ||
            !(v->v4 = ghc_tensor_wrap(m->core, m->base, 4, (const int64_t[]){ B, L, H, D / H }, dev, vp)))
            goto fail;
    }
    return 0;
fail:
    rc = ghc_error_code(m->core) < 0 ? ghc_error_code(m->core) : GHC_ENOMEM;
    wan22_unit_end(m, v, stream);
    return rc;
}

int wan22_unit_end(struct wan22 *m, struct wan22_uview *v, void *stream)
{
    if (!v->open)
        return 0;
    int rc = ghc_mem_saved_end(ghc_mempolicy_get(m->core), ghc_tensor_data(m->st.units[v->unit].home), stream);
    uview_clear(v);
    return rc;
}

struct wan22_act *wan22_unit_act(struct wan22 *m, struct wan22_act *a, const struct wan22_uview *v,
                                 struct wan22_act *tmp)
{
    (void)m;
    if (!v->o)
        return a;
    *tmp = *a;
    tmp->o = v->o;
    tmp->op = v->op;
    tmp->lse = v->lse;
    if (v->qb) {
        tmp->qb = v->qb;
        tmp->kb = v->kb;
        tmp->v = v->v;
        tmp->v4 = v->v4;
    }
    return tmp;
}
