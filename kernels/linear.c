/* kernels/linear.c: a model's frozen linears with the network's adapters (linear.h). The hook's
 * plan of each target is asked once, when the hook is installed; each call then takes the
 * first way the plan and the linear allow, in the order measured fastest on an H100 (a 40-block
 * A14B expert at 4096 tokens, doc/lycoris.md): K-concatenation puts the adapter's factors into
 * the model's own GEMMs, so no pass of the adapter's own reads and writes y or dx; writing the
 * adapter's part first and letting the GEMM add its product (beta 1) saves the one
 * read-modify-write pass that adding it afterwards costs. Fold is not a speed choice but the
 * user's numerical one (the network plans it only where its config asks). */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <gh200core/linear.h>
#include <gh200core/ops.h>

struct ghc_linears {
    ghc_core_t             *core;
    int                     device;
    enum ghc_dtype          base;
    int32_t                 n;
    int64_t                 max_weight;
    bool                    has_hook, again;
    struct ghc_adapter_hook hook;
    struct ghc_adapter_plan *plan;   /* [n] */
    int32_t                *rank;    /* [n] the rank each target concatenates with (0: none) */
    ghc_tensor_t           *scratch; /* dequantised or folded weight, max_weight elements of base */
    ghc_tensor_t           *bias16;  /* an f32 bias rounded to bf16 for a bf16 output (grown as needed) */
};

static unsigned linear_ways = GHC_LINEAR_ALL;

void ghc_linear_ways(unsigned ways) { linear_ways = ways & GHC_LINEAR_ALL; }

static int nomem(ghc_linears_t *l)
{
    return ghc_error_code(l->core) < 0 ? ghc_error_code(l->core)
                                       : ghc_error_set(l->core, GHC_ENOMEM, "linear: out of memory");
}

ghc_linears_t *ghc_linears_new(ghc_core_t *core, int device, enum ghc_dtype base, int32_t n_targets,
                               int64_t max_weight)
{
    if (n_targets < 0 || max_weight < 0 || (base != GHC_DTYPE_BF16 && base != GHC_DTYPE_F32)) {
        ghc_error_set(core, GHC_EINVAL, "linear: ghc_linears_new: %d targets, weights of %lld elements, "
                      "operand dtype %s (expected bf16 or f32)", (int)n_targets, (long long)max_weight,
                      ghc_dtype_name(base));
        return NULL;
    }
    ghc_linears_t *l = calloc(1, sizeof(*l));
    if (l && n_targets > 0) {
        l->plan = calloc((size_t)n_targets, sizeof(*l->plan));
        l->rank = calloc((size_t)n_targets, sizeof(*l->rank));
    }
    if (!l || (n_targets > 0 && (!l->plan || !l->rank))) {
        ghc_linears_free(l);
        ghc_error_set(core, GHC_ENOMEM, "linear: out of memory");
        return NULL;
    }
    *l = (struct ghc_linears){ .core = core, .device = device, .base = base, .n = n_targets,
                               .max_weight = max_weight, .plan = l->plan, .rank = l->rank };
    return l;
}

void ghc_linears_free(ghc_linears_t *l)
{
    if (!l)
        return;
    ghc_tensor_free(l->scratch);
    ghc_tensor_free(l->bias16);
    free(l->plan);
    free(l->rank);
    free(l);
}

int ghc_linears_set_hook(ghc_linears_t *l, const struct ghc_adapter_hook *hook, const int64_t *room)
{
    memset(l->plan, 0, (size_t)l->n * sizeof(*l->plan));
    memset(l->rank, 0, (size_t)l->n * sizeof(*l->rank));
    l->has_hook = false;
    if (!hook)
        return 0;
    if (hook->struct_size < sizeof(struct ghc_adapter_hook) || !hook->plan || !hook->forward || !hook->backward)
        return ghc_error_set(l->core, GHC_EINVAL, "linear: an adapter hook needs struct_size = %zu (has %u) and the "
                             "members plan, forward and backward", sizeof(struct ghc_adapter_hook),
                             (unsigned)hook->struct_size);
    l->hook = *hook;
    int concat = 0;
    for (int32_t t = 0; t < l->n; t++) {
        struct ghc_adapter_plan *p = &l->plan[t];
        p->struct_size = sizeof(*p);
        int rc = hook->plan(hook->user, t, p);
        if (rc < 0)
            return rc;
        p->struct_size = sizeof(*p);
        if (!p->adapted) {
            *p = (struct ghc_adapter_plan){ .struct_size = sizeof(*p) };
            continue;
        }
        if (!(linear_ways & GHC_LINEAR_WRITE))
            p->forward_writes = p->backward_writes = false;
        if (p->fold && (!(linear_ways & GHC_LINEAR_FOLD) || !hook->fold || !hook->grads))
            p->fold = false;
        if (p->concat_rank > 0 && !p->fold && (linear_ways & GHC_LINEAR_CONCAT) && hook->concat_forward &&
            hook->concat_backward && room && room[t] >= p->concat_rank) {
            l->rank[t] = p->concat_rank;
            concat++;
        }
    }
    l->has_hook = true;
    return concat;
}

int32_t ghc_linears_concat_rank(const ghc_linears_t *l, int32_t target, int32_t *wanted)
{
    bool in = l->has_hook && target >= 0 && target < l->n;
    if (wanted)
        *wanted = in && !l->plan[target].fold ? l->plan[target].concat_rank : 0;
    return in ? l->rank[target] : 0;
}

bool ghc_linears_adapted(const ghc_linears_t *l, int32_t target)
{
    return l->has_hook && target >= 0 && target < l->n && l->plan[target].adapted;
}

void ghc_linears_recompute(ghc_linears_t *l, bool again) { l->again = again; }

/* ---- pieces ------------------------------------------------------------------------------------ */

/* Rows [r0, r0 + nr) and columns [c0, c0 + nc) of a stored 2-D weight (a column view unless all
 * its columns). */
static ghc_tensor_t *wsub(ghc_linears_t *l, const ghc_tensor_t *t, int64_t r0, int64_t nr, int64_t c0, int64_t nc)
{
    const int64_t ld = ghc_tensor_dim(t, -1);
    char *p = (char *)ghc_tensor_cdata(t) + (size_t)(r0 * ld) * ghc_dtype_size(ghc_tensor_dtype(t));
    ghc_tensor_t *rows = ghc_tensor_wrap(l->core, ghc_tensor_dtype(t), 2, (const int64_t[]){ nr, ld },
                                         ghc_tensor_device(t), p);
    if (!rows || (c0 == 0 && nc == ld))
        return rows;
    ghc_tensor_t *v = ghc_tensor_view_cols(rows, c0, nc);
    ghc_tensor_free(rows);
    return v;
}

/* The first numel elements of the scratch as a tensor shaped like w ([out, in]). */
static ghc_tensor_t *scratch_like(ghc_linears_t *l, const ghc_tensor_t *w)
{
    const int64_t n = ghc_tensor_numel(w);
    if (n > l->max_weight) {
        ghc_error_set(l->core, GHC_EINVAL, "linear: a weight of %lld elements, more than the %lld given to "
                      "ghc_linears_new", (long long)n, (long long)l->max_weight);
        return NULL;
    }
    if (!l->scratch && !(l->scratch = ghc_tensor_init(l->core, l->base, 1, &l->max_weight, l->device,
                                                      GHC_ROLE_WORKSPACE)))
        return NULL;
    return ghc_tensor_wrap(l->core, l->base, 2, (const int64_t[]){ ghc_tensor_dim(w, 0), ghc_tensor_dim(w, 1) },
                           l->device, ghc_tensor_data(l->scratch));
}

/* The weight the GEMMs take: w itself, or an e4m3 w dequantised into the scratch (*own). Then,
 * where the plan folds, w + delta-W (in place in the scratch, or into it from w): *folded. */
static const ghc_tensor_t *gemm_weight(ghc_linears_t *l, int32_t t, const ghc_tensor_t *w, float scale,
                                       ghc_tensor_t **own, int *folded, void *stream)
{
    *own = NULL;
    *folded = 0;
    if (ghc_tensor_dtype(w) == GHC_DTYPE_F8_E4M3) {
        if (!(*own = scratch_like(l, w)) || ghc_op_cast(*own, w, scale, NULL, stream) < 0)
            return NULL;
        w = *own;
    }
    if (t < 0 || !l->has_hook || !l->plan[t].fold)
        return w;
    ghc_tensor_t *wf = *own;
    if (!wf && !(wf = *own = scratch_like(l, w)))
        return NULL;
    int rc = l->hook.fold(l->hook.user, t, w, wf, stream);
    if (rc < 0)
        return NULL;
    *folded = rc == 1;
    return *folded ? wf : w;
}

/* The bias the GEMM writing y takes: b itself, or for a bf16 y and an f32 b, b rounded to bf16
 * into bias16 (*own, a view of it), cast on the stream in every call (the weights, and so the
 * bias at an address, may change between calls: the offload policy streams each block's into
 * the same buffers). cuBLASLt fuses only a bias of C's dtype; the others take a pass of their
 * own after the product. The scratch grows at most a few times a run, after the stream's work
 * that may still read it. */
static int gemm_bias(ghc_linears_t *l, const ghc_tensor_t *b, const ghc_tensor_t *y, const ghc_tensor_t **bias,
                     ghc_tensor_t **own, void *stream)
{
    *bias = b;
    *own = NULL;
    if (!b || ghc_tensor_dtype(y) != GHC_DTYPE_BF16 || ghc_tensor_dtype(b) != GHC_DTYPE_F32)
        return 0;
    int64_t n = ghc_tensor_numel(b);
    int rc;
    if (!l->bias16 || ghc_tensor_numel(l->bias16) < n) {
        if (l->bias16 && (rc = ghc_op_sync(l->core, l->device, stream)) < 0)
            return rc;
        ghc_tensor_free(l->bias16);
        if (!(l->bias16 = ghc_tensor_init(l->core, GHC_DTYPE_BF16, 1, &n, l->device, GHC_ROLE_WORKSPACE)))
            return nomem(l);
    }
    if (!(*own = ghc_tensor_wrap(l->core, GHC_DTYPE_BF16, ghc_tensor_ndim(b), ghc_tensor_shape(b), l->device,
                                 ghc_tensor_data(l->bias16))))
        return nomem(l);
    *bias = *own;
    return ghc_op_cast(*own, b, 1.0f, NULL, stream);
}

/* ---- forward ----------------------------------------------------------------------------------- */

/* The product that writes all of y: with gelu and a bias (beta 0), also gelu_tanh(y) into gelu in
 * its epilogue (*fused = true). */
static int gemm_all(ghc_tensor_t *y, ghc_tensor_t *gelu, const ghc_tensor_t *a, const ghc_tensor_t *b,
                    const struct ghc_gemm *g, bool *fused, void *stream)
{
    if (!gelu || !g->bias || g->beta != 0.0f)
        return ghc_op_gemm(y, a, b, g, stream);
    struct ghc_gemm f = *g;
    f.epilogue = GHC_EPI_BIAS_GELU;
    f.pre_gelu = y;
    *fused = true;
    return ghc_op_gemm(gelu, a, b, &f, stream);
}

/* y = [x | H] [W | B]^T + b (gelu: see gemm_all). Returns 1 when done, 0 when the hook had
 * nothing this step. */
static int concat_forward(ghc_linears_t *l, const struct ghc_linear *lin, ghc_tensor_t *y, ghc_tensor_t *gelu,
                          const ghc_tensor_t *x, ghc_tensor_t *xp, const struct ghc_gemm *g, bool *fused, void *stream)
{
    const int32_t r = l->rank[lin->target];
    const int64_t off = lin->spare_col;
    ghc_tensor_t *h = ghc_tensor_view_cols(xp, off, r), *wc = wsub(l, lin->w, 0, lin->out, off, r);
    ghc_tensor_t *xa = ghc_tensor_view_cols(xp, 0, off + r), *wa = wsub(l, lin->w, 0, lin->out, 0, off + r);
    int rc = !h || !wc || !xa || !wa ? nomem(l)
                                     : l->hook.concat_forward(l->hook.user, lin->target, x, h, wc, l->again, stream);
    if (rc == 1 && (rc = gemm_all(y, gelu, xa, wa, g, fused, stream)) == 0)
        rc = 1;
    ghc_tensor_free(h);
    ghc_tensor_free(wc);
    ghc_tensor_free(xa);
    ghc_tensor_free(wa);
    return rc;
}

/* The linear keeps room for the target's rank r: r spare columns from spare_col, r spare rows. */
static bool has_room(const ghc_linears_t *l, const struct ghc_linear *lin)
{
    const int64_t r = l->rank[lin->target];
    return r > 0 && lin->spare >= r && ghc_tensor_ndim(lin->w) == 2 &&
           ghc_tensor_dim(lin->w, 1) >= lin->spare_col + lin->spare && ghc_tensor_dim(lin->w, 0) >= lin->out + lin->spare;
}

static int check_linear(ghc_linears_t *l, const struct ghc_linear *lin)
{
    if (!lin || !lin->w || ghc_tensor_ndim(lin->w) != 2 || ghc_tensor_dim(lin->w, 0) < lin->out ||
        ghc_tensor_dim(lin->w, 1) < lin->in || lin->out <= 0 || lin->in <= 0 || lin->target >= l->n ||
        (lin->spare > 0 && lin->spare_col < lin->in))
    {
        char buf[160];
        return ghc_error_set(l->core, GHC_EINVAL, "linear: a linear [%lld, %lld] of target %d (of %d) with weight %s "
                             "(expected a 2-D weight of at least [out, in], spare columns from in on)",
                             lin ? (long long)lin->out : 0LL, lin ? (long long)lin->in : 0LL,
                             lin ? (int)lin->target : -1, (int)l->n,
                             lin && lin->w ? ghc_tensor_describe(lin->w, buf, sizeof(buf)) : "NULL");
    }
    return 0;
}

/* ghc_linear_forward into y, and with gelu (ghc_linear_forward_gelu; y its pre) gelu_tanh(y)
 * into gelu where one product writes all of y (*fused; the caller applies it otherwise). */
static int forward(ghc_linears_t *l, const struct ghc_linear *lin, ghc_tensor_t *y, ghc_tensor_t *gelu,
                   const ghc_tensor_t *x, ghc_tensor_t *xp, bool *fused, void *stream)
{
    int rc = check_linear(l, lin);
    if (rc < 0)
        return rc;
    const int32_t t = lin->target;
    const bool adapted = t >= 0 && l->has_hook && l->plan[t].adapted;
    if (adapted && ghc_tensor_dtype(y) == GHC_DTYPE_BF16 && !l->plan[t].fold && !(xp && has_room(l, lin))) {
        /* the hook adds its part before or after the product: into an f32 y, then rounded once
         * (its rank-r products into a bf16 y find no cuBLASLt algorithm on the GPU for small r) */
        ghc_tensor_t *y32 = ghc_tensor_init(l->core, GHC_DTYPE_F32, ghc_tensor_ndim(y), ghc_tensor_shape(y),
                                            ghc_tensor_device(y), GHC_ROLE_WORKSPACE);
        bool unfused = false;
        if (!y32)
            return nomem(l);
        if ((rc = forward(l, lin, y32, NULL, x, xp, &unfused, stream)) == 0)
            rc = ghc_op_cast(y, y32, 1.0f, NULL, stream);
        ghc_tensor_free(y32);
        return rc < 0 ? rc : 0;
    }
    ghc_tensor_t *wv = NULL, *own = NULL, *xq = NULL, *b16 = NULL;
    struct ghc_gemm g = { .trans_b = true, .epilogue = lin->b ? GHC_EPI_BIAS : GHC_EPI_NONE };
    if ((rc = gemm_bias(l, lin->b, y, &g.bias, &b16, stream)) < 0)
        goto out;
    const ghc_tensor_t *w = lin->w;
    int folded = 0, done = 0;
    bool asked = false;   /* the adapter was asked to write its part before the GEMM */
    if (adapted && xp && has_room(l, lin)) {
        if ((rc = concat_forward(l, lin, y, gelu, x, xp, &g, fused, stream)) != 0)
            goto out;
    }
    if (ghc_tensor_dim(w, 0) != lin->out || ghc_tensor_dim(w, 1) != lin->in) {   /* the linear within its room */
        if (!(wv = wsub(l, w, 0, lin->out, 0, lin->in))) {
            rc = nomem(l);
            goto out;
        }
        w = wv;
    }
    if (lin->x_e4m3 && ghc_tensor_dtype(w) == GHC_DTYPE_F8_E4M3) {
        /* x cast to e4m3 with a static scale of 1 (saturating at +-448, like ComfyUI's
         * fp8_e4m3fn_fast), times the e4m3 weight with its scale; the adapter sees x as given */
        g.scale_a = 1.0f;
        g.scale_b = lin->w_scale;
        if (ghc_tensor_numel(lin->x_e4m3) < ghc_tensor_numel(x) || ghc_tensor_dtype(lin->x_e4m3) != GHC_DTYPE_F8_E4M3) {
            rc = ghc_error_set(l->core, GHC_EINVAL, "linear: x_e4m3 must be an e4m3 scratch of at least %lld elements",
                               (long long)ghc_tensor_numel(x));
            goto out;
        }
        if (!(xq = ghc_tensor_wrap(l->core, GHC_DTYPE_F8_E4M3, ghc_tensor_ndim(x), ghc_tensor_shape(x),
                                   ghc_tensor_device(x), ghc_tensor_data(lin->x_e4m3)))) {
            rc = nomem(l);
            goto out;
        }
        if ((rc = ghc_op_cast(xq, x, 1.0f, NULL, stream)) == 0)
            rc = ghc_op_gemm(y, xq, w, &g, stream);
    } else {
        const ghc_tensor_t *wd = gemm_weight(l, t, w, lin->w_scale, &own, &folded, stream);
        if (!wd) {
            rc = nomem(l);
            goto out;
        }
        if (adapted && !folded && l->plan[t].forward_writes) {   /* y = the adapter's part, then += x W^T + b */
            asked = true;
            if ((rc = done = l->hook.forward(l->hook.user, t, x, y, true, stream)) < 0)
                goto out;
            g.beta = done == 1 ? 1.0f : 0.0f;
        }
        /* nothing added after: the product writes all of y where the hook wrote nothing first */
        rc = adapted && !folded && !asked ? ghc_op_gemm(y, x, wd, &g, stream)
                                          : gemm_all(y, gelu, x, wd, &g, fused, stream);
    }
    if (rc == 0 && adapted && !folded && !asked)   /* y += the adapter's part */
        rc = l->hook.forward(l->hook.user, t, x, y, false, stream);
out:
    ghc_tensor_free(xq);
    ghc_tensor_free(own);
    ghc_tensor_free(wv);
    ghc_tensor_free(b16);
    return rc < 0 ? rc : 0;
}

int ghc_linear_forward(ghc_linears_t *l, const struct ghc_linear *lin, ghc_tensor_t *y, const ghc_tensor_t *x,
                       ghc_tensor_t *xp, void *stream)
{
    bool fused = false;
    return forward(l, lin, y, NULL, x, xp, &fused, stream);
}

int ghc_linear_forward_gelu(ghc_linears_t *l, const struct ghc_linear *lin, ghc_tensor_t *g, ghc_tensor_t *pre,
                            const ghc_tensor_t *x, ghc_tensor_t *xp, void *stream)
{
    const enum ghc_dtype dt = g && pre ? ghc_tensor_dtype(pre) : GHC_DTYPE_F32;
    if (!g || !pre || ghc_tensor_dtype(g) != dt || (dt != GHC_DTYPE_F32 && dt != GHC_DTYPE_BF16) ||
        !ghc_tensor_same_shape(g, pre) || ghc_tensor_row_stride(pre) != ghc_tensor_dim(pre, -1)) {
        char bg[160], bp[160];
        return ghc_error_set(l->core, GHC_EINVAL, "linear: ghc_linear_forward_gelu: g %s and pre %s (expected tensors "
                             "of one shape, both f32 or both bf16, pre dense)",
                             g ? ghc_tensor_describe(g, bg, sizeof(bg)) : "NULL",
                             pre ? ghc_tensor_describe(pre, bp, sizeof(bp)) : "NULL");
    }
    bool fused = false;
    int rc = forward(l, lin, pre, g, x, xp, &fused, stream);
    return rc < 0 || fused ? rc : ghc_op_gelu_tanh(g, pre, stream);
}

int ghc_linear_restore(ghc_linears_t *l, const struct ghc_linear *lin, const ghc_tensor_t *x, ghc_tensor_t *xp,
                       void *stream)
{
    int rc = check_linear(l, lin);
    if (rc < 0)
        return rc;
    const int32_t t = lin->target;
    if (t < 0 || !l->has_hook || !l->plan[t].adapted || !xp || !has_room(l, lin))
        return 0;   /* nothing of the adapter's in xp's spare columns */
    const int32_t r = l->rank[t];
    ghc_tensor_t *h = ghc_tensor_view_cols(xp, lin->spare_col, r), *wc = wsub(l, lin->w, 0, lin->out, lin->spare_col, r);
    rc = !h || !wc ? nomem(l) : l->hook.concat_forward(l->hook.user, t, x, h, wc, true, stream);
    ghc_tensor_free(h);
    ghc_tensor_free(wc);
    return rc < 0 ? rc : 0;
}

/* ---- backward ---------------------------------------------------------------------------------- */

/* dx (+)= [g | dH] [W ; A], with g = dy cast by the hook into gp's first out columns. Returns 1
 * when done, 0 when the hook had nothing this step (g not written). */
static int concat_backward(ghc_linears_t *l, const struct ghc_linear *lin, ghc_tensor_t *dx, const ghc_tensor_t *x,
                           ghc_tensor_t *xp, const ghc_tensor_t *dy, ghc_tensor_t *gp, bool accumulate, void *stream)
{
    const int32_t r = l->rank[lin->target];
    const int64_t N = lin->out, K = lin->in, off = lin->spare_col;
    ghc_tensor_t *gv = ghc_tensor_view_cols(gp, 0, N), *dh = ghc_tensor_view_cols(gp, N, r);
    ghc_tensor_t *h = ghc_tensor_view_cols(xp, off, r), *wr = wsub(l, lin->w, N, r, 0, K);
    ghc_tensor_t *ga = dx ? ghc_tensor_view_cols(gp, 0, N + r) : NULL, *wa = dx ? wsub(l, lin->w, 0, N + r, 0, K) : NULL;
    int rc = !gv || !dh || !h || !wr || (dx && (!ga || !wa))
                 ? nomem(l)
                 : l->hook.concat_backward(l->hook.user, lin->target, x, h, dy, gv, dh, wr, stream);
    if (rc == 1 && dx) {
        struct ghc_gemm gm = { .beta = accumulate ? 1.0f : 0.0f };
        if ((rc = ghc_op_gemm(dx, ga, wa, &gm, stream)) == 0)
            rc = 1;
    }
    ghc_tensor_free(gv);
    ghc_tensor_free(dh);
    ghc_tensor_free(h);
    ghc_tensor_free(wr);
    ghc_tensor_free(ga);
    ghc_tensor_free(wa);
    return rc;
}

int ghc_linear_backward(ghc_linears_t *l, const struct ghc_linear *lin, ghc_tensor_t *dx, const ghc_tensor_t *x,
                        ghc_tensor_t *xp, const ghc_tensor_t *dy, ghc_tensor_t *cast, ghc_tensor_t *gp, bool accumulate,
                        void *stream)
{
    int rc = check_linear(l, lin);
    if (rc < 0)
        return rc;
    const int32_t t = lin->target;
    const bool adapted = t >= 0 && l->has_hook && l->plan[t].adapted;
    if (!dx && !adapted)
        return 0;   /* no input gradient and nothing to learn */
    if (adapted && xp && gp && has_room(l, lin)) {
        if ((rc = concat_backward(l, lin, dx, x, xp, dy, gp, accumulate, stream)) != 0)
            return rc < 0 ? rc : 0;
    }
    ghc_tensor_t *wv = NULL, *own = NULL;
    const ghc_tensor_t *w = lin->w, *g = dy;   /* g: dy in the GEMM's operand dtype */
    int folded = 0, done = 0;
    bool asked = false;
    if (ghc_tensor_dim(w, 0) != lin->out || ghc_tensor_dim(w, 1) != lin->in) {
        if (!(wv = wsub(l, w, 0, lin->out, 0, lin->in)))
            return nomem(l);
        w = wv;
    }
    if (dx) {
        const ghc_tensor_t *wd = gemm_weight(l, t, w, lin->w_scale, &own, &folded, stream);   /* dx gets a fold's part */
        if (!wd) {
            rc = nomem(l);
            goto out;
        }
        if (ghc_tensor_dtype(wd) != GHC_DTYPE_F32) {
            if ((rc = ghc_op_cast(cast, dy, 1.0f, NULL, stream)) < 0)
                goto out;
            g = cast;
        }
        if (adapted && !folded && l->plan[t].backward_writes) {   /* dx (+)= the adapter's part */
            asked = true;
            if ((rc = done = l->hook.backward(l->hook.user, t, x, dy, g != dy ? g : NULL, dx, accumulate, stream)) < 0)
                goto out;
        }
        struct ghc_gemm gm = { .beta = accumulate || done == 1 ? 1.0f : 0.0f };
        if ((rc = ghc_op_gemm(dx, g, wd, &gm, stream)) < 0)
            goto out;
    } else if (l->base != GHC_DTYPE_F32) {   /* the adapter's products in the operand dtype */
        if ((rc = ghc_op_cast(cast, dy, 1.0f, NULL, stream)) < 0)
            goto out;
        g = cast;
    }
    if (folded)   /* dx holds the adapter's part: only its parameter gradients */
        rc = l->hook.grads(l->hook.user, t, x, g, stream);
    else if (adapted && !asked)
        rc = l->hook.backward(l->hook.user, t, x, dy, g != dy ? g : NULL, dx, true, stream);
out:
    ghc_tensor_free(own);
    ghc_tensor_free(wv);
    return rc < 0 ? rc : 0;
}
