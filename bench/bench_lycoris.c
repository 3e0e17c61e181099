/* bench_lycoris.c: the lycoris adapters' cost on one Wan2.2 A14B block on the GPU. Not a test.
 *
 *   bench_lycoris [--iters N]
 *
 * For the 10 block linears (q, k, v, o of self- and cross-attention 5120 x 5120, ffn.0
 * 13824 x 5120, ffn.2 5120 x 13824) at 4096 and 32760 tokens, bf16 inputs as the model gives
 * them: the frozen linears' GEMMs (forward x W^T and input gradient dy W, bf16 x bf16 -> f32)
 * against the adapters' hook members forward (adding) + backward (adding to dx, with dy and its
 * bf16 cast g, as the core calls them; through the plugin). The share is adapter / (frozen
 * linears + adapter); the block's whole step also has attention, norms and the rest, so the
 * share of the block's step is lower than this. Then LoKr (factor 16, both factors full)
 * against a dense LoRA of about the same parameter count (rank 12).
 * "fold" rows: the network's fold = true (its plan's fold), as the core calls it: delta-W
 * folded into a copy of the weight in the forward and again in the backward (the frozen GEMMs
 * then run on the copy, at the same cost), and grads with dy in bf16 instead of forward and
 * backward. "H not kept": LoRA's backward on a copy of x, where the H = X A^T the forward kept
 * does not serve, so it computes H again.
 * Times: host clock around N iterations after 2 warm-up ones, with a device sync at each end.
 * Then the share the issue asks for, on the real model: the wan22 training step (forward with
 * block checkpointing, the recomputation and the backward; bf16, A14B dims, random weights) at
 * 4096 tokens (latent 2 x 64 x 128) and 32760 (21 x 60 x 104) with no network, and LoRA r16 on
 * the 10 linears of every block (the default preset) in each way the core may take
 * (linear.h; ghc_linear_ways for all but fold): its default, K-concatenation (H and the factors
 * in the model's own GEMMs, with ghc_op_lora_fwd and ghc_op_lora_cast_bwd: H, its kept copy
 * and B in one pass over x, and the cast of dy with dH and dB in one pass over dy); without
 * it, the adapter's parts written before the model's GEMMs ("written first"); without that
 * too, added after them ("added after"); and with the network's fold = true. A block's time is
 * the difference of a 3-block
 * and a 1-block model (what the blocks share cancels), median of N. The "paired" columns: the
 * 3-block model with the network and the one without, loaded side by side in one process, step
 * in turn; the median of the N differences over 3 is the adapter's time per block (both steps of
 * a pair see the same clocks and neighbours; its share uses the no-network block time).
 *   bench_lycoris [--iters N] [--only linears|model] [--tokens 4096|32760] [--what NAME]
 * (--tokens: the model part at that token count only; --what NAME: only the row of that name,
 * e.g. "LoRA r16", for a profiler.)
 * Needs GHC_BUILD_PLUGINS pointing at plugins/.libs (the device policy, ghc_lycoris, ghc_wan22). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <gh200core/gh200core.h>
#include <gh200core/linear.h>
#include <gh200core/model.h>
#include <gh200core/network.h>
#include <gh200core/ops.h>

static ghc_core_t *core;
static int iters = 10;
static long only_tokens;   /* --tokens: the model part at this token count only (0: both) */
static const char *only_what;   /* --what: the model part's row of this name only */

static void die(const char *what)
{
    fprintf(stderr, "bench_lycoris: %s: %s\n", what, ghc_error_message(core));
    exit(EXIT_FAILURE);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static ghc_tensor_t *gpu(enum ghc_dtype dt, int ndim, const int64_t *shape)
{
    ghc_tensor_t *t = ghc_tensor_init(core, dt, ndim, shape, 0, GHC_ROLE_ACTIVATIONS);
    if (!t)
        die("tensor");
    struct ghc_rng r = { 7, 0 };
    if (ghc_op_rand_normal(t, &r, NULL))
        die("rand");
    return t;
}

static const char *const lin[10] = { "self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q",
                                     "cross_attn.k", "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2" };

static struct ghc_model_target targets[10];

struct bufs {
    int64_t N;
    ghc_tensor_t *xd, *xf;       /* bf16 inputs [1, N, 5120], [1, N, 13824] */
    ghc_tensor_t *xd2, *xf2;     /* their copies: inputs the forward did not see ("H not kept") */
    ghc_tensor_t *yd, *yf;       /* f32 outputs / output gradients */
    ghc_tensor_t *dxd, *dxf;     /* f32 input gradients */
    ghc_tensor_t *gd, *gf;       /* bf16 output gradients for the frozen backward GEMM */
    ghc_tensor_t *w[10];         /* bf16 weights */
    ghc_tensor_t *wf;            /* bf16 scratch for a folded weight (the largest) */
};

static ghc_tensor_t *v2(ghc_tensor_t *t, int64_t cols)
{
    int64_t s[2] = { ghc_tensor_numel(t) / cols, cols };
    return ghc_tensor_wrap(core, ghc_tensor_dtype(t), 2, s, 0, ghc_tensor_data(t));
}

/* Seconds per iteration of the frozen linears' forward + input-gradient GEMMs. */
static double time_base(struct bufs *b)
{
    double t0 = 0;
    for (int it = 0; it < iters + 2; it++) {
        if (it == 2) {
            ghc_op_sync(core, 0, NULL);
            t0 = now();
        }
        for (int j = 0; j < 10; j++) {
            bool fin = j == 9, fout = j == 8;
            ghc_tensor_t *x = v2(fin ? b->xf : b->xd, fin ? 13824 : 5120);
            ghc_tensor_t *y = v2(fout ? b->yf : b->yd, fout ? 13824 : 5120);
            ghc_tensor_t *g = v2(fout ? b->gf : b->gd, fout ? 13824 : 5120);
            ghc_tensor_t *dx = v2(fin ? b->dxf : b->dxd, fin ? 13824 : 5120);
            if (ghc_op_gemm(y, x, b->w[j], &(struct ghc_gemm){ .trans_b = true }, NULL) ||
                ghc_op_gemm(dx, g, b->w[j], NULL, NULL))
                die("base gemm");
            ghc_tensor_free(x);
            ghc_tensor_free(y);
            ghc_tensor_free(g);
            ghc_tensor_free(dx);
        }
    }
    ghc_op_sync(core, 0, NULL);
    return (now() - t0) / iters;
}

/* Seconds per iteration of the adapters' forward + backward on the 10 targets (fold and grads
 * where the plan folds); fresh_x: the backward on a copy of x. */
static double time_adapter(const char *net_cfg, bool fresh_x, struct bufs *b, int64_t *params)
{
    char text[1024];
    ghc_core_t *c = ghc_core_init();
    snprintf(text, sizeof(text), "mempolicy = { plugin = \"device\"; };\nnetwork = { plugin = \"lycoris\"; device = 0; %s };\n",
             net_cfg);
    if (ghc_plugin_add_path(c, getenv("GHC_BUILD_PLUGINS") ? getenv("GHC_BUILD_PLUGINS") : "plugins/.libs") ||
        ghc_config_load_string(c, text, "bench.cfg", NULL, NULL, 0) || ghc_run_init(c)) {
        fprintf(stderr, "bench_lycoris: %s\n", ghc_error_message(c));
        exit(EXIT_FAILURE);
    }
    ghc_network_t *net = ghc_network_get(c);
    struct ghc_adapter_hook h;
    struct ghc_adapter_plan plan = { .struct_size = sizeof(plan) };
    struct ghc_param *ps;
    int32_t np;
    if (ghc_network_attach(net, 0, targets, 10) || ghc_network_hook(net, 0, &h) ||
        ghc_network_params(net, 0, &ps, &np) || h.plan(h.user, 0, &plan) < 0) {
        fprintf(stderr, "bench_lycoris: %s\n", ghc_error_message(c));
        exit(EXIT_FAILURE);
    }
    *params = 0;
    for (int32_t k = 0; k < np; k++) {
        *params += ghc_tensor_numel(ps[k].value);
        struct ghc_rng r = { 3, (uint64_t)k << 24 };
        ghc_op_rand_normal(ps[k].value, &r, NULL);   /* non-zero B: the work is the same either way */
    }
    double t0 = 0;
    for (int it = 0; it < iters + 2; it++) {
        if (it == 2) {
            ghc_op_sync(c, 0, NULL);
            t0 = now();
        }
        for (int j = 0; j < 10 && plan.fold; j++) {
            bool fin = j == 9, fout = j == 8;
            ghc_tensor_t *wf = ghc_tensor_wrap(c, GHC_DTYPE_BF16, 2, ghc_tensor_shape(b->w[j]), 0, ghc_tensor_data(b->wf));
            if (!wf || h.fold(h.user, j, b->w[j], wf, NULL) != 1 || h.fold(h.user, j, b->w[j], wf, NULL) != 1 ||
                h.grads(h.user, j, fin ? b->xf : b->xd, fout ? b->gf : b->gd, NULL) != 1) {
                fprintf(stderr, "bench_lycoris: fold: %s\n", ghc_error_message(c));
                exit(EXIT_FAILURE);
            }
            ghc_tensor_free(wf);
        }
        for (int j = 0; j < 10 && !plan.fold; j++) {
            bool fin = j == 9, fout = j == 8;
            const ghc_tensor_t *x = fin ? b->xf : b->xd, *xb = fresh_x ? (fin ? b->xf2 : b->xd2) : x;
            if (h.forward(h.user, j, x, fout ? b->yf : b->yd, false, NULL) != 1 ||
                h.backward(h.user, j, xb, fout ? b->yf : b->yd, fout ? b->gf : b->gd, fin ? b->dxf : b->dxd, true,
                           NULL) != 1) {
                fprintf(stderr, "bench_lycoris: forward, backward: %s\n", ghc_error_message(c));
                exit(EXIT_FAILURE);
            }
        }
    }
    ghc_op_sync(c, 0, NULL);
    double t = (now() - t0) / iters;
    ghc_core_free(c);
    return t;
}

/* ---- the real model's training step ---------------------------------------------------------- */

static ghc_tensor_t *dev_normal(ghc_core_t *c, int ndim, const int64_t *shape, float scale, uint64_t seed)
{
    ghc_tensor_t *t = ghc_tensor_init(c, GHC_DTYPE_F32, ndim, shape, 0, GHC_ROLE_ACTIVATIONS);
    struct ghc_rng r = { seed, 0 };
    if (!t || ghc_op_rand_normal(t, &r, NULL) || (scale != 1.0f && ghc_op_scale(t, t, scale, NULL)))
        return NULL;
    return t;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One timed training step (forward with keep, backward), synchronised at both ends; exits on
 * error. */
static double model_step(ghc_core_t *c, ghc_model_t *m, const struct ghc_model_batch *b, ghc_tensor_t *out,
                         const ghc_tensor_t *dout)
{
    ghc_op_sync(c, 0, NULL);
    double t0 = now();
    if (ghc_model_forward(m, 0, b, out, true, NULL) || ghc_model_backward(m, 0, dout, NULL, NULL)) {
        fprintf(stderr, "bench_lycoris: model step: %s\n", ghc_error_message(c));
        exit(EXIT_FAILURE);
    }
    ghc_op_sync(c, 0, NULL);
    return now() - t0;
}

/* An A14B-dims model with `layers` blocks on a latent [1, 16, f, h, w], its inputs, and the
 * network of net_cfg attached (NULL: no network). */
struct bmodel {
    ghc_core_t *c;
    ghc_model_t *m;
    bool net;
    ghc_tensor_t *t[5];   /* noisy, out, dout, text, timesteps */
    struct ghc_model_batch b;
    int64_t step;
};

static void bmodel_init(struct bmodel *bm, int layers, const int64_t lat[3], const char *net_cfg)
{
    char text[1024];
    snprintf(text, sizeof(text),
             "mempolicy = { plugin = \"device\"; };\n"
             "model = { plugin = \"wan22\"; dtype = \"bf16\"; device = 0; checkpointing = \"block\";\n"
             "  random = { dim = 5120; ffn_dim = 13824; heads = 40; layers = %d; seed = 1; }; };\n%s%s%s",
             layers, net_cfg ? "network = { plugin = \"lycoris\"; device = 0; " : "", net_cfg ? net_cfg : "",
             net_cfg ? " };\n" : "");
    memset(bm, 0, sizeof(*bm));
    ghc_core_t *c = bm->c = ghc_core_init();
    if (ghc_plugin_add_path(c, getenv("GHC_BUILD_PLUGINS") ? getenv("GHC_BUILD_PLUGINS") : "plugins/.libs") ||
        ghc_config_load_string(c, text, "bench.cfg", NULL, NULL, 0) || ghc_run_init(c)) {
        fprintf(stderr, "bench_lycoris: model: %s\n", ghc_error_message(c));
        exit(EXIT_FAILURE);
    }
    bm->m = ghc_model_get(c);
    bm->net = net_cfg != NULL;
    if (net_cfg) {
        ghc_network_t *net = ghc_network_get(c);
        const struct ghc_model_target *tg;
        int32_t nt;
        struct ghc_adapter_hook h;
        struct ghc_param *ps;
        int32_t np;
        if (ghc_model_targets(bm->m, &tg, &nt) || ghc_network_attach(net, 0, tg, nt) || ghc_network_hook(net, 0, &h) ||
            ghc_model_set_hook(bm->m, &h) || ghc_network_params(net, 0, &ps, &np)) {
            fprintf(stderr, "bench_lycoris: network: %s\n", ghc_error_message(c));
            exit(EXIT_FAILURE);
        }
        for (int32_t k = 0; k < np; k++) {   /* non-zero B, small values: the work is the same */
            struct ghc_rng r = { 3, (uint64_t)k << 24 };
            ghc_op_rand_normal(ps[k].value, &r, NULL);
            ghc_op_scale(ps[k].value, ps[k].value, 1e-2f, NULL);
        }
    }
    const int64_t shape[5] = { 1, 16, lat[0], lat[1], lat[2] };
    bm->t[0] = dev_normal(c, 5, shape, 1.0f, 11);
    bm->t[1] = dev_normal(c, 5, shape, 1.0f, 12);
    bm->t[2] = dev_normal(c, 5, shape, 1e-3f, 13);
    bm->t[3] = dev_normal(c, 3, (const int64_t[]){ 1, 512, 4096 }, 0.5f, 14);
    bm->t[4] = dev_normal(c, 1, (const int64_t[]){ 1 }, 0.0f, 15);
    for (int k = 0; k < 5; k++)
        if (!bm->t[k]) {
            fprintf(stderr, "bench_lycoris: model inputs: %s\n", ghc_error_message(c));
            exit(EXIT_FAILURE);
        }
    ghc_op_fill(bm->t[4], 500.0f, NULL);
    bm->b = (struct ghc_model_batch){ .noisy = bm->t[0], .timesteps = bm->t[4], .text_embed = bm->t[3] };
}

static double bmodel_step(struct bmodel *bm)
{
    if (bm->net && ghc_network_begin_step(ghc_network_get(bm->c), bm->step)) {
        fprintf(stderr, "bench_lycoris: %s\n", ghc_error_message(bm->c));
        exit(EXIT_FAILURE);
    }
    bm->step++;
    return model_step(bm->c, bm->m, &bm->b, bm->t[1], bm->t[2]);
}

static void bmodel_free(struct bmodel *bm)
{
    for (int k = 0; k < 5; k++)
        ghc_tensor_free(bm->t[k]);
    ghc_core_free(bm->c);
}

/* Median seconds of a training step of the model (2 warm-up steps, then N). */
static double time_model(int layers, const int64_t lat[3], const char *net_cfg)
{
    struct bmodel bm;
    bmodel_init(&bm, layers, lat, net_cfg);
    double t[64];
    int n = iters < 64 ? iters : 64;
    for (int it = -2; it < n; it++) {
        double dt = bmodel_step(&bm);
        if (it >= 0)
            t[it] = dt;
    }
    bmodel_free(&bm);
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    return t[n / 2];
}

/* The 3-block model with the network and the one without, loaded side by side, stepping in
 * turn (2 warm-up pairs): the median of the N differences over 3 blocks. */
static double time_paired(const int64_t lat[3], const char *net_cfg)
{
    struct bmodel with, base;
    bmodel_init(&with, 3, lat, net_cfg);
    bmodel_init(&base, 3, lat, NULL);
    double d[64];
    int n = iters < 64 ? iters : 64;
    for (int it = -2; it < n; it++) {
        double tw = bmodel_step(&with), tb = bmodel_step(&base);
        if (it >= 0)
            d[it] = tw - tb;
    }
    bmodel_free(&with);
    bmodel_free(&base);
    qsort(d, (size_t)n, sizeof(double), cmp_double);
    return d[n / 2] / 3;
}

static void bench_model(void)
{
    static const int64_t lats[2][3] = { { 2, 64, 128 }, { 21, 60, 104 } };
    static const struct { const char *what, *cfg; unsigned ways; } a[] = {   /* ways: linear.h */
        { "no network", NULL, GHC_LINEAR_ALL },
        { "LoRA r16", "algo = \"lora\"; rank = 16;", GHC_LINEAR_ALL },
        { "LoRA r16 written first", "algo = \"lora\"; rank = 16;", GHC_LINEAR_ALL & ~GHC_LINEAR_CONCAT },
        { "LoRA r16 added after", "algo = \"lora\"; rank = 16;", GHC_LINEAR_FOLD },
        { "LoRA r16 fold", "algo = \"lora\"; rank = 16; fold = true;", GHC_LINEAR_ALL },
    };
    printf("tokens,what,step_1_block_ms,step_3_blocks_ms,block_ms,adapter_ms_per_block,share_of_block_step,"
           "paired_adapter_ms_per_block,paired_share\n");
    for (int k = 0; k < 2; k++) {
        int64_t N = lats[k][0] * lats[k][1] / 2 * lats[k][2] / 2;
        if (only_tokens && only_tokens != N)
            continue;
        double base = 0;
        for (size_t j = 0; j < sizeof(a) / sizeof(a[0]); j++) {
            if (only_what && strcmp(only_what, a[j].what) != 0)
                continue;
            ghc_linear_ways(a[j].ways);   /* read when the models install the hook */
            double t1 = time_model(1, lats[k], a[j].cfg), t3 = time_model(3, lats[k], a[j].cfg);
            double blk = (t3 - t1) / 2, pa = a[j].cfg ? time_paired(lats[k], a[j].cfg) : 0;
            ghc_linear_ways(GHC_LINEAR_ALL);
            if (j == 0)
                base = blk;
            printf("%lld,%s,%.3f,%.3f,%.3f,%.3f,%.2f%%,%.3f,%.2f%%\n", (long long)N, a[j].what, t1 * 1e3, t3 * 1e3,
                   blk * 1e3, (blk - base) * 1e3, 100.0 * (blk - base) / blk, pa * 1e3, 100.0 * pa / (base + pa));
            fflush(stdout);
        }
    }
}

int main(int argc, char **argv)
{
    const char *only = NULL;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--tokens") == 0 && i + 1 < argc)
            only_tokens = atol(argv[++i]);
        else if (strcmp(argv[i], "--what") == 0 && i + 1 < argc)
            only_what = argv[++i];
    if (only && strcmp(only, "model") == 0) {
        bench_model();
        return 0;
    }
    static char names[10][32];
    for (int j = 0; j < 10; j++) {
        snprintf(names[j], sizeof(names[j]), "blocks.0.%s", lin[j]);
        targets[j] = (struct ghc_model_target){ .name = names[j], .block = 0, .in_features = j == 9 ? 13824 : 5120,
                                                .out_features = j == 8 ? 13824 : 5120 };
    }
    core = ghc_core_init();
    if (ghc_plugin_add_path(core, getenv("GHC_BUILD_PLUGINS") ? getenv("GHC_BUILD_PLUGINS") : "plugins/.libs") ||
        ghc_config_load_string(core, "mempolicy = { plugin = \"device\"; };", "bench.cfg", NULL, NULL, 0) ||
        ghc_run_init(core))
        die("setup");
    const int64_t Ns[2] = { 4096, 32760 };
    printf("tokens,what,ms_per_step,params,share_of_linears\n");
    for (int n = 0; n < 2; n++) {
        struct bufs b = { .N = Ns[n] };
        int64_t N = Ns[n];
        b.xd = gpu(GHC_DTYPE_BF16, 3, (const int64_t[]){ 1, N, 5120 });
        b.xf = gpu(GHC_DTYPE_BF16, 3, (const int64_t[]){ 1, N, 13824 });
        b.xd2 = gpu(GHC_DTYPE_BF16, 3, (const int64_t[]){ 1, N, 5120 });
        b.xf2 = gpu(GHC_DTYPE_BF16, 3, (const int64_t[]){ 1, N, 13824 });
        b.yd = gpu(GHC_DTYPE_F32, 3, (const int64_t[]){ 1, N, 5120 });
        b.yf = gpu(GHC_DTYPE_F32, 3, (const int64_t[]){ 1, N, 13824 });
        b.dxd = gpu(GHC_DTYPE_F32, 3, (const int64_t[]){ 1, N, 5120 });
        b.dxf = gpu(GHC_DTYPE_F32, 3, (const int64_t[]){ 1, N, 13824 });
        b.gd = gpu(GHC_DTYPE_BF16, 3, (const int64_t[]){ 1, N, 5120 });
        b.gf = gpu(GHC_DTYPE_BF16, 3, (const int64_t[]){ 1, N, 13824 });
        b.wf = gpu(GHC_DTYPE_BF16, 1, (const int64_t[]){ 13824 * 5120 });
        for (int j = 0; j < 10; j++)
            b.w[j] = gpu(GHC_DTYPE_BF16, 2, (const int64_t[]){ targets[j].out_features, targets[j].in_features });
        double base = time_base(&b);
        printf("%lld,frozen linears fwd+dx GEMMs,%.3f,0,\n", (long long)N, base * 1e3);
        static const struct { const char *what, *cfg; bool fresh_x; } a[] = {
            { "LoRA r16", "algo = \"lora\"; rank = 16;", false },
            { "LoRA r16 H not kept", "algo = \"lora\"; rank = 16;", true },
            { "LoRA r16 fold", "algo = \"lora\"; rank = 16; fold = true;", false },
            { "LoRA r12", "algo = \"lora\"; rank = 12;", false },
            { "LoKr factor 16 full", "algo = \"lokr\"; rank = 10000; factor = 16;", false },
            { "LoKr factor -1 full", "algo = \"lokr\"; rank = 10000; factor = -1;", false },
            { "LoHa r8", "algo = \"loha\"; rank = 8;", false },
        };
        for (size_t k = 0; k < sizeof(a) / sizeof(a[0]); k++) {
            int64_t params;
            double t = time_adapter(a[k].cfg, a[k].fresh_x, &b, &params);
            printf("%lld,%s fwd+bwd,%.3f,%lld,%.2f%%\n", (long long)N, a[k].what, t * 1e3, (long long)params,
                   100.0 * t / (base + t));
            fflush(stdout);
        }
        ghc_tensor_t *all[] = { b.xd, b.xf, b.xd2, b.xf2, b.yd, b.yf, b.dxd, b.dxf, b.gd, b.gf, b.wf };
        for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
            ghc_tensor_free(all[k]);
        for (int j = 0; j < 10; j++)
            ghc_tensor_free(b.w[j]);
    }
    ghc_core_free(core);
    if (!only || strcmp(only, "linears") != 0)
        bench_model();
    return 0;
}
