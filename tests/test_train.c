/* test_train.c: the trainer's pieces and the trainer itself: sigma samplers (ranges, moments,
 * acceptance, the hard error), TensorBoard records (framing, CRC-32C, decoded values), the
 * lr schedule and the gradient_ramp scheduler's windows, and whole runs of the tiny model
 * (the demo learns, resume is bit-for-bit, signals, NaN skipping, expert routing), what a
 * resume checks (the configuration against resolved.cfg, trainer.json, non-finite values) and
 * the samples checked against the model at open. */
#include <config.h>

#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <dirent.h>
#include <stddef.h>
#include <sys/stat.h>

#include <gh200core/gh200core.h>
#include <gh200core/media.h>
#include <gh200core/safetensors.h>
#include <gh200core/train.h>

#include "../core/train_impl.h"
#include "testutil.h"

static void ok(ghc_core_t *core, int rc)
{
    ck_assert_msg(rc == 0, "failed (%d): %s", rc, ghc_error_message(core));
}

/* ---- samplers ------------------------------------------------------------------------------- */

static struct ghc_sampler sampler(enum ghc_sampler_family fam, double lo, double hi)
{
    return (struct ghc_sampler){ .family = fam, .base = GHC_SAMPLER_BASE_SIGMOID, .scale = 1.0, .mean = 0.0,
                                 .std = 1.0, .shift = 1.0, .lo = lo, .hi = hi, .seed = 1234,
                                 .max_tries = 100000 };
}

/* E[sigma | in range] from the family's CDF (the mean of a variable in [lo, hi] is
 * lo + integral of (1 - F_cond)). */
static double cond_mean(const struct ghc_sampler *s, double k)
{
    double flo = ghc_sampler_cdf(s, k, s->lo), fhi = ghc_sampler_cdf(s, k, s->hi), acc = s->lo;
    int n = 20000;
    double h = (s->hi - s->lo) / n;
    for (int i = 0; i < n; i++) {
        double x = s->lo + (i + 0.5) * h;
        acc += h * (1.0 - (ghc_sampler_cdf(s, k, x) - flo) / (fhi - flo));
    }
    return acc;
}

/* Draws n values: all in range, mean within 5 standard errors of the analytic one, and the
 * empirical CDF within 0.02 of the analytic one at 9 points (a KS-style check). */
static void check_family(struct ghc_sampler s, double k)
{
    ghc_core_t *core = ghc_core_init();
    enum { N = 40000 };
    static double x[N];
    double sum = 0.0, sum2 = 0.0;
    for (int i = 0; i < N; i++) {
        ok(core, ghc_sampler_draw(core, &s, k, &x[i]));
        ck_assert_msg(x[i] >= s.lo && (x[i] < s.hi || (s.hi >= 1.0 && x[i] <= 1.0)),
                      "%s: %g outside [%g, %g)", ghc_sampler_family_names[s.family], x[i], s.lo, s.hi);
        sum += x[i];
        sum2 += x[i] * x[i];
    }
    double mean = sum / N, sd = sqrt(sum2 / N - mean * mean), want = cond_mean(&s, k);
    ck_assert_msg(fabs(mean - want) < 5.0 * sd / sqrt((double)N) + 1e-9,
                  "%s on [%g, %g): mean %.6f, analytic %.6f", ghc_sampler_family_names[s.family], s.lo, s.hi, mean, want);
    double flo = ghc_sampler_cdf(&s, k, s.lo), fhi = ghc_sampler_cdf(&s, k, s.hi);
    for (int q = 1; q <= 9; q++) {
        double at = s.lo + (s.hi - s.lo) * q / 10.0;
        int below = 0;
        for (int i = 0; i < N; i++)
            below += x[i] < at;
        double emp = (double)below / N, th = (ghc_sampler_cdf(&s, k, at) - flo) / (fhi - flo);
        ck_assert_msg(fabs(emp - th) < 0.02, "%s: CDF at %g: %.4f drawn, %.4f analytic",
                      ghc_sampler_family_names[s.family], at, emp, th);
    }
    ghc_core_free(core);
}

START_TEST(test_sampler_families)
{
    /* each family unrestricted, and cut to the high (>= 0.875) and low (< 0.875) experts */
    double ranges[3][2] = { { 0.0, 1.0 }, { 0.875, 1.0 }, { 0.0, 0.875 } };
    for (int r = 0; r < 3; r++) {
        check_family(sampler(GHC_SAMPLER_UNIFORM, ranges[r][0], ranges[r][1]), 1.0);
        check_family(sampler(GHC_SAMPLER_SIGMOID, ranges[r][0], ranges[r][1]), 1.0);
        struct ghc_sampler ln = sampler(GHC_SAMPLER_LOGIT_NORMAL, ranges[r][0], ranges[r][1]);
        ln.mean = 0.5, ln.std = 1.2;
        check_family(ln, 1.0);
        check_family(sampler(GHC_SAMPLER_SHIFT, ranges[r][0], ranges[r][1]), 3.0);
        struct ghc_sampler su = sampler(GHC_SAMPLER_SHIFT, ranges[r][0], ranges[r][1]);
        su.base = GHC_SAMPLER_BASE_UNIFORM;
        check_family(su, 5.0);
        check_family(sampler(GHC_SAMPLER_FLUX_SHIFT, ranges[r][0], ranges[r][1]), ghc_sampler_flux_k(1560));
    }
}
END_TEST

START_TEST(test_sampler_acceptance)
{
    /* the share of draws above 0.875 and 0.9 (the experts' boundaries), worked out per family */
    struct { enum ghc_sampler_family f; enum ghc_sampler_base b; double k, p875, p900; } t[] = {
        { GHC_SAMPLER_UNIFORM, 0, 1.0, 0.125, 0.100 },
        { GHC_SAMPLER_SIGMOID, 0, 1.0, 0.026, 0.014 },
        { GHC_SAMPLER_SHIFT, GHC_SAMPLER_BASE_SIGMOID, 3.0, 0.198, 0.136 },
        { GHC_SAMPLER_SHIFT, GHC_SAMPLER_BASE_SIGMOID, 5.0, 0.368, 0.278 },
        { GHC_SAMPLER_SHIFT, GHC_SAMPLER_BASE_SIGMOID, 12.0, 0.705, 0.613 },
        { GHC_SAMPLER_SHIFT, GHC_SAMPLER_BASE_UNIFORM, 3.0, 0.300, 0.250 },
        { GHC_SAMPLER_SHIFT, GHC_SAMPLER_BASE_UNIFORM, 5.0, 0.417, 0.357 },
        { GHC_SAMPLER_SHIFT, GHC_SAMPLER_BASE_UNIFORM, 12.0, 0.632, 0.571 },
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        struct ghc_sampler s = sampler(t[i].f, 0.875, 1.0);
        s.base = t[i].b;
        ck_assert_msg(fabs(ghc_sampler_acceptance(&s, t[i].k) - t[i].p875) < 0.0006, "row %zu: %.4f", i,
                      ghc_sampler_acceptance(&s, t[i].k));
        s.lo = 0.9;
        ck_assert_msg(fabs(ghc_sampler_acceptance(&s, t[i].k) - t[i].p900) < 0.0006, "row %zu: %.4f", i,
                      ghc_sampler_acceptance(&s, t[i].k));
    }
    /* flux_shift's k for 480x832 and 720x1280 latents */
    ck_assert(fabs(ghc_sampler_flux_k(1560) - 2.06) < 0.01);
    ck_assert(fabs(ghc_sampler_flux_k(3600) - 2.90) < 0.01);
}
END_TEST

START_TEST(test_sampler_state_and_error)
{
    ghc_core_t *core = ghc_core_init();
    struct ghc_sampler a = sampler(GHC_SAMPLER_SIGMOID, 0.875, 1.0), b;
    double x[64], y[64];
    for (int i = 0; i < 32; i++)
        ok(core, ghc_sampler_draw(core, &a, 1.0, &x[i]));
    b = a;   /* the counter is the whole state: a copy continues identically */
    for (int i = 32; i < 64; i++) {
        ok(core, ghc_sampler_draw(core, &a, 1.0, &x[i]));
        ok(core, ghc_sampler_draw(core, &b, 1.0, &y[i]));
        ck_assert(x[i] == y[i]);
    }
    /* a range the family cannot reach: a hard error that says so, never an unrestricted draw */
    struct ghc_sampler s = sampler(GHC_SAMPLER_SIGMOID, 0.875, 1.0);
    s.scale = 1e-3;   /* sigma ~ 0.5 always */
    s.max_tries = 1000;
    double v = -1.0;
    ck_assert_int_eq(ghc_sampler_draw(core, &s, 1.0, &v), GHC_EINVAL);
    ck_assert(v == -1.0);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "none fell in the expert's range"));
    ghc_core_free(core);
}
END_TEST

/* ---- TensorBoard ---------------------------------------------------------------------------- */

static uint64_t rd_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint64_t rd_varint(const uint8_t **p)
{
    uint64_t v = 0;
    for (int s = 0;; s += 7) {
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << s;
        if (!(b & 0x80))
            return v;
    }
}

START_TEST(test_tensorboard)
{
    /* CRC-32C check value of "123456789" (RFC 3720) */
    ck_assert_uint_eq(ghc_crc32c("123456789", 9), 0xe3069283u);
    ghc_core_t *core = ghc_core_init();
    char *dir = tu_tmpdir();
    ghc_tboard_t *tb;
    ok(core, ghc_tboard_open(core, dir, &tb));
    float vals[3] = { 1.5f, -0.25f, 3e-7f };
    for (int i = 0; i < 3; i++)
        ok(core, ghc_tboard_scalar(tb, i == 1 ? "train/lr" : "train/loss", 10 * i + 1, vals[i]));
    char path[4096];
    snprintf(path, sizeof(path), "%s", ghc_tboard_path(tb));
    ghc_tboard_free(tb);
    ck_assert_ptr_nonnull(strstr(path, "/events.out.tfevents."));
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    static uint8_t buf[65536];
    size_t len = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    /* record by record: length, masked CRC of the length, data, masked CRC of the data */
    size_t off = 0;
    int rec = 0;
    while (off < len) {
        ck_assert(off + 12 <= len);
        uint64_t n = rd_le(buf + off, 8);
        ck_assert_uint_eq(rd_le(buf + off + 8, 4), ghc_crc32c_masked(buf + off, 8));
        ck_assert(off + 12 + n + 4 <= len);
        const uint8_t *d = buf + off + 12, *e = d + n;
        ck_assert_uint_eq(rd_le(e, 4), ghc_crc32c_masked(d, n));
        /* decode the Event */
        int64_t step = -1;
        char tag[64] = "", version[64] = "";
        float value = NAN;
        bool wall = false;
        while (d < e) {
            uint64_t key = rd_varint(&d);
            if (key == (1 << 3 | 1)) {
                double w;
                memcpy(&w, d, 8);
                ck_assert(w > 1.6e9);
                wall = true;
                d += 8;
            } else if (key == (2 << 3 | 0)) {
                step = (int64_t)rd_varint(&d);
            } else if (key == (3 << 3 | 2)) {
                uint64_t l = rd_varint(&d);
                memcpy(version, d, l);
                d += l;
            } else if (key == (5 << 3 | 2)) {           /* Summary { Value value = 1; } */
                uint64_t l = rd_varint(&d);
                const uint8_t *se = d + l;
                ck_assert_uint_eq(rd_varint(&d), 1 << 3 | 2);
                uint64_t vl = rd_varint(&d);
                ck_assert(d + vl == se);
                ck_assert_uint_eq(rd_varint(&d), 1 << 3 | 2);   /* tag */
                uint64_t tl = rd_varint(&d);
                memcpy(tag, d, tl);
                d += tl;
                ck_assert_uint_eq(rd_varint(&d), 2 << 3 | 5);   /* simple_value */
                memcpy(&value, d, 4);
                d += 4;
            } else {
                ck_abort_msg("unexpected field key %llu", (unsigned long long)key);
            }
        }
        ck_assert(wall);
        if (rec == 0) {
            ck_assert_str_eq(version, "brain.Event:2");
        } else {
            ck_assert_int_eq(step, 10 * (rec - 1) + 1);
            ck_assert_str_eq(tag, rec == 2 ? "train/lr" : "train/loss");
            ck_assert(value == vals[rec - 1]);
        }
        off += 12 + n + 4;
        rec++;
    }
    ck_assert_int_eq(rec, 4);
    tu_rm_rf(dir);
    free(dir);
    ghc_core_free(core);
}
END_TEST

/* ---- schedules ------------------------------------------------------------------------------ */

static ghc_core_t *sched_core(const char *sched)
{
    ghc_core_t *core = ghc_core_init();
    ck_assert_ptr_nonnull(core);
    ok(core, ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")));
    ok(core, ghc_config_load_string(core, sched, "t.cfg", NULL, NULL, 0));
    ok(core, ghc_run_init(core));
    return core;
}

START_TEST(test_gradient_ramp)
{
    /* a ramp worked out by hand, indexed by optimizer step (b = 1, E0 = 4, E1 = 32, R = 400) */
    ghc_core_t *core = sched_core("scheduler = { plugin = \"gradient_ramp\"; initial_effective_batch_size = 4; "
                                  "target_effective_batch_size = 32; batch_rampup_steps = 400; };");
    ghc_scheduler_t *s = ghc_scheduler_get(core);
    int64_t steps[] = { 0, 1, 75, 100, 200, 300, 399, 400, 5000 };
    int32_t want[] = { 4, 5, 5, 6, 11, 20, 32, 32, 32 };
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++)
        ck_assert_msg(ghc_scheduler_micro_batches(s, steps[i]) == want[i], "step %lld: %d, want %d",
                      (long long)steps[i], ghc_scheduler_micro_batches(s, steps[i]), want[i]);
    ck_assert(ghc_scheduler_lr_factor(s, 0) == 1.0f);
    ghc_core_free(core);
    /* in samples with micro-batches of 4 (data.batch_size), linear ease, and downwards */
    core = sched_core("data = { batch_size = 4; };\nscheduler = { plugin = \"gradient_ramp\"; ease = \"linear\"; "
                      "initial_effective_batch_size = 64; target_effective_batch_size = 8; batch_rampup_steps = 10; };");
    s = ghc_scheduler_get(core);
    int32_t down[] = { 16, 14, 13, 11, 10, 9, 7, 6, 4, 3, 2, 2 };   /* floor(16 - 14 s / 10) */
    for (int i = 0; i < 12; i++)
        ck_assert_msg(ghc_scheduler_micro_batches(s, i) == down[i], "step %d: %d", i, ghc_scheduler_micro_batches(s, i));
    ghc_core_free(core);
}
END_TEST

START_TEST(test_lr_schedule)
{
    ghc_core_t *core = sched_core("scheduler = { plugin = \"constant\"; warmup_steps = 4; lr_decay = \"cosine\"; "
                                  "decay_steps = 104; min_lr_factor = 0.1; };");
    ghc_scheduler_t *s = ghc_scheduler_get(core);
    ck_assert(fabsf(ghc_scheduler_lr_factor(s, 0) - 0.25f) < 1e-7f);
    ck_assert(fabsf(ghc_scheduler_lr_factor(s, 3) - 1.0f) < 1e-7f);
    ck_assert(fabsf(ghc_scheduler_lr_factor(s, 4) - 1.0f) < 1e-7f);
    ck_assert(fabsf(ghc_scheduler_lr_factor(s, 54) - 0.55f) < 1e-6f);   /* half way: 0.1 + 0.9 / 2 */
    ck_assert(fabsf(ghc_scheduler_lr_factor(s, 104) - 0.1f) < 1e-7f);
    ck_assert(fabsf(ghc_scheduler_lr_factor(s, 1000) - 0.1f) < 1e-7f);
    ghc_core_free(core);
    /* cosine without a decay horizon is a configuration error that names the key */
    core = ghc_core_init();
    ok(core, ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")));
    ok(core, ghc_config_load_string(core, "scheduler = { plugin = \"constant\";\n  lr_decay = \"cosine\"; };", "t.cfg",
                                    NULL, NULL, 0));
    ck_assert_int_eq(ghc_run_init(core), GHC_ECONFIG);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "t.cfg:"));
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "decay_steps"));
    ghc_core_free(core);
}
END_TEST


/* ---- whole runs of the tiny model (the CLI) ------------------------------------------------- */

/* A tiny run's configuration: etc/tiny.cfg's model (1 or 2 experts), LoRA, AdamW, 2
 * micro-batches per step, with `train` as the train section's body and `more` appended. */
static char *tiny_cfg(const char *dir, const char *name, int experts, const char *train, const char *more)
{
    char text[8192];
    snprintf(text, sizeof(text),
             "seed = 42;\noutput_dir = \"%s/%s.out\";\nmempolicy = { plugin = \"host\"; };\n"
             "model = { plugin = \"wan22\"; dtype = \"f32\"; device = -1;\n"
             "  random = { dim = 64; ffn_dim = 128; heads = 2; layers = 2; in_channels = 16; out_channels = 16;\n"
             "             text_dim = 32; freq_dim = 64; seed = 7; experts = %d; }; };\n"
             "network = { plugin = \"lycoris\"; algo = \"lora\"; rank = 4; alpha = 4.0; };\n"
             "optimizer = { plugin = \"adamw\"; lr = 1e-2; weight_decay = 0.0; };\n"
             "scheduler = { plugin = \"constant\"; micro_batches = 2; };\n"
             "train = { %s };\n%s\n", dir, name, experts, train, more);
    return tu_write(dir, name, text);
}

static int cli(const char *args, char **out)
{
    char cmd[8192];
    snprintf(cmd, sizeof(cmd), "GHC_PLUGIN_PATH='%s' '%s' %s", tu_env("GHC_BUILD_PLUGINS"), tu_env("GHC_CLI"), args);
    return tu_run(cmd, out);
}

/* The metrics.jsonl lines of a run that carry a loss: step, loss (as printed, %.9g), expert,
 * skipped. Returns the count. */
struct mline { long long step; char loss[40]; int expert; int skipped; };

static int read_metrics(const char *path, struct mline *m, int max)
{
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "no %s", path);
    char line[2048];
    int n = 0;
    while (fgets(line, sizeof(line), f) && n < max) {
        char *l = strstr(line, "\"loss\":"), *e = strstr(line, "\"expert\":"), *k = strstr(line, "\"skipped\":");
        if (!l)
            continue;
        m[n].step = atoll(line + 8);
        sscanf(l + 7, "%39[^,]", m[n].loss);
        m[n].expert = e ? atoi(e + 9) : -9;
        m[n].skipped = k && !strncmp(k + 10, "true", 4);
        n++;
    }
    fclose(f);
    return n;
}

static bool files_equal(const char *a, const char *b)
{
    char cmd[8400];
    snprintf(cmd, sizeof(cmd), "cmp -s '%s' '%s'", a, b);
    return system(cmd) == 0;
}

/* Two safetensors files with the same tensors, byte for byte (headers may differ in their
 * metadata: the adapter files carry their date). */
static bool tensors_equal(const char *a, const char *b)
{
    ghc_core_t *core = ghc_core_init();
    ghc_st_t *sa = ghc_st_open(core, a), *sb = ghc_st_open(core, b);
    ck_assert_msg(sa && sb, "%s", ghc_error_message(core));
    bool same = ghc_st_count(sa) == ghc_st_count(sb);
    for (int i = 0; same && i < ghc_st_count(sa); i++) {
        struct ghc_st_info ia, ib;
        ghc_st_info_at(sa, i, &ia);
        same = ghc_st_find(sb, ia.name, &ib) && ia.dtype == ib.dtype && ia.nbytes == ib.nbytes &&
               memcmp(ghc_st_raw(sa, ia.name), ghc_st_raw(sb, ia.name), ia.nbytes) == 0;
    }
    ghc_st_free(sa);
    ghc_st_free(sb);
    ghc_core_free(core);
    return same;
}

#ifdef GHC_HAVE_FFMPEG
/* The whole of file `path` (NUL-terminated; caller frees), *n its size; NULL when unreadable. */
static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    *n = 0;
    if (f && fseek(f, 0, SEEK_END) == 0) {
        long len = ftell(f);
        rewind(f);
        if (len >= 0 && (buf = malloc((size_t)len + 1)) && fread(buf, 1, (size_t)len, f) == (size_t)len) {
            buf[len] = '\0';
            *n = (size_t)len;
        } else {
            free(buf);
            buf = NULL;
        }
    }
    if (f)
        fclose(f);
    return buf;
}

#endif

/* The mean loss of metrics lines [from, to). */
static double mean_loss(const struct mline *m, int from, int to)
{
    double sum = 0.0;
    for (int i = from; i < to; i++)
        sum += atof(m[i].loss);
    return sum / (to - from);
}

START_TEST(test_demo_learns)
{
    /* the README's demo itself, etc/tiny.cfg. With FFmpeg: generated videos and images with
     * captions, prepared into caches by the tiny random encoders, a LoRA trained on them by
     * plain flow matching whose loss falls clearly, and a second run into the folder that
     * writes the same media bytes and encodes nothing. Without FFmpeg: one line says why, and
     * the latent-only demo's LoRA recovers its planted adapter (the loss falls over 5x). */
    char *dir = tu_tmpdir(), *out, args[8192], p[8400];
    snprintf(args, sizeof(args), "-c '%s/etc/tiny.cfg' --set output_dir='\"%s/tiny\"'", tu_env("GHC_TOP_SRCDIR"), dir);
    int rc = cli(args, &out);
    ck_assert_msg(rc == 0, "demo failed (%d): %s", rc, out);
    snprintf(p, sizeof(p), "%s/tiny/metrics.jsonl", dir);
    static struct mline m[4096];
    int n = read_metrics(p, m, 4096);
    ck_assert_int_ge(n, 100);
#ifdef GHC_HAVE_FFMPEG
    ck_assert_msg(strstr(out, "demo: writing 4 videos of 9 frames and 4 images, 48 x 32, with captions") &&
                  strstr(out, "prepare: 8 media files: 8 encoded (8 clips), 0 up to date, 0 skipped as bad"), "%s", out);
    free(out);
    /* the media show what their captions say: video 0's red ball on black is at the left in
     * its first frame and at the right in its last; image 0's green ball is in the middle of
     * grey */
    size_t len;
    snprintf(p, sizeof(p), "%s/tiny/demo-data/video_000.txt", dir);
    char *cap = slurp(p, &len);
    ck_assert_str_eq(cap ? cap : "(none)", "a red ball moves from left to right on a black background\n");
    free(cap);
    snprintf(p, sizeof(p), "%s/tiny/demo-data/image_000.txt", dir);
    cap = slurp(p, &len);
    ck_assert_str_eq(cap ? cap : "(none)", "a green ball in the middle of a grey background\n");
    free(cap);
    ghc_media_decoder_t *d = ghc_media_decoder_init(1);
    struct ghc_media_frames fr;
    snprintf(p, sizeof(p), "%s/tiny/demo-data/video_000.mkv", dir);
    ck_assert_msg(ghc_media_decoder_open(d, p, NULL) == 0 && ghc_media_decoder_read(d, NULL, &fr) == 0, "%s",
                  ghc_media_decoder_error(d));
    ck_assert(fr.frames == 9 && fr.width == 48 && fr.height == 32);
    const uint8_t *f0 = fr.rgb, *f8 = fr.rgb + (size_t)8 * 48 * 32 * 3;
    size_t left = (16 * 48 + 6) * 3, right = (16 * 48 + 41) * 3;
    ck_assert(f0[left] > 200 && f0[left + 1] < 60 && f0[right] < 30);
    ck_assert(f8[right] > 200 && f8[right + 1] < 60 && f8[left] < 30);
    snprintf(p, sizeof(p), "%s/tiny/demo-data/image_000.png", dir);
    ck_assert_msg(ghc_media_decoder_open(d, p, NULL) == 0 && ghc_media_decoder_read(d, NULL, &fr) == 0, "%s",
                  ghc_media_decoder_error(d));
    const uint8_t *mid = fr.rgb + (16 * 48 + 24) * 3, *corner = fr.rgb;
    ck_assert(mid[0] == 40 && mid[1] == 200 && mid[2] == 70 && corner[0] == 128 && corner[1] == 128);
    ghc_media_decoder_free(d);
    /* the caches prepare made: 9 frames of 48 x 32 -> 3 x 4 x 6 latents of 16 channels, an image 1
     * frame; the random text encoder's ids are the caption's bytes and the end of text */
    snprintf(p, sizeof(p), "%s/tiny/demo-data/video_000_00000-009.latent.safetensors", dir);
    ck_assert_str_eq(tu_st_shape(p, "latent"), "[16, 3, 4, 6] BF16");
    snprintf(p, sizeof(p), "%s/tiny/demo-data/video_000_00000-009.text.safetensors", dir);
    ck_assert_str_eq(tu_st_shape(p, "text_embed"), "[58, 32] BF16");
    snprintf(p, sizeof(p), "%s/tiny/demo-data/image_002.latent.safetensors", dir);
    ck_assert_str_eq(tu_st_shape(p, "latent"), "[16, 1, 4, 6] BF16");
    snprintf(p, sizeof(p), "%s/tiny/demo-data/.gh200core-empty-prompt.safetensors", dir);
    ck_assert_str_eq(tu_st_shape(p, "text_embed"), "[1, 32] BF16");
    /* plain flow matching: the first steps' loss about 2x the last ones' (seen: 2.59 and 1.26) */
    double first = mean_loss(m, 0, 5), last = mean_loss(m, n - 20, n);
    ck_assert_msg(first > 1.5 * last, "the demo's loss fell from %g to %g only", first, last);
    /* again into the same folder: the same media bytes, nothing encoded */
    snprintf(p, sizeof(p), "%s/tiny/demo-data/video_001.mkv", dir);
    char *before = slurp(p, &len), *after;
    size_t len2;
    snprintf(args, sizeof(args), "-c '%s/etc/tiny.cfg' --set output_dir='\"%s/tiny\"' --overwrite --set train.steps=2",
             tu_env("GHC_TOP_SRCDIR"), dir);
    rc = cli(args, &out);
    ck_assert_msg(rc == 0 && strstr(out, "prepare: 8 media files: 0 encoded (0 clips), 8 up to date"), "%s", out);
    after = slurp(p, &len2);
    ck_assert_msg(before && after && len == len2 && !memcmp(before, after, len), "%s changed", p);
    free(before);
    free(after);
#else
    ck_assert_msg(strstr(out, "demo: this gh200core was built without FFmpeg"), "%s", out);
    double first = mean_loss(m, 0, 5), last = mean_loss(m, n - 5, n);   /* seen: 0.25 and 0.030 */
    ck_assert_msg(first > 5.0 * last, "the latent demo's loss fell from %g to %g only", first, last);
#endif
    free(out);
    snprintf(p, sizeof(p), "%s/tiny/adapter.safetensors", dir);
    struct stat st;
    ck_assert_int_eq(stat(p, &st), 0);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(test_resume_bitwise)
{
    /* 12 steps straight; 6 steps, then --resume to 12: the same losses and the same adapter bytes */
    char *dir = tu_tmpdir(), *out, args[8400], p[8400], q[8400];
    char *cfg = tiny_cfg(dir, "a.cfg", 1, "steps = 12; save_every = 6; keep_last = 0; max_grad_norm = 1.0;",
                         "demo = { samples = 6; height = 4; width = 4; text_len = 4; text_dim = 32; };\ndata = { batch_size = 2; seed = 3; };");
    snprintf(args, sizeof(args), "-q -c '%s'", cfg);
    ck_assert_msg(cli(args, &out) == 0, "%s", out);
    free(out);
    /* the second run continues a copy of the first's step-6 checkpoint in another folder */
    snprintf(args, sizeof(args), "-q -c '%s' --set output_dir='\"%s/b.out\"' --resume '%s/a.cfg.out/checkpoint-6'",
             cfg, dir, dir);
    ck_assert_msg(cli(args, &out) == 0, "%s", out);
    free(out);
    struct mline a[64], b[64];
    snprintf(p, sizeof(p), "%s/a.cfg.out/metrics.jsonl", dir);
    snprintf(q, sizeof(q), "%s/b.out/metrics.jsonl", dir);
    int na = read_metrics(p, a, 64), nb = read_metrics(q, b, 64);
    ck_assert_int_eq(na, 12);
    ck_assert_int_eq(nb, 6);
    for (int i = 0; i < 6; i++) {
        ck_assert_int_eq(b[i].step, a[6 + i].step);
        ck_assert_msg(!strcmp(a[6 + i].loss, b[i].loss), "step %lld: %s uninterrupted, %s resumed", a[6 + i].step,
                      a[6 + i].loss, b[i].loss);
    }
    snprintf(p, sizeof(p), "%s/a.cfg.out/adapter.safetensors", dir);
    snprintf(q, sizeof(q), "%s/b.out/adapter.safetensors", dir);
    ck_assert_msg(tensors_equal(p, q), "the resumed run's adapter differs from the uninterrupted one's");
    snprintf(p, sizeof(p), "%s/a.cfg.out/checkpoint-12/optimizer.safetensors", dir);
    snprintf(q, sizeof(q), "%s/b.out/checkpoint-12/optimizer.safetensors", dir);
    ck_assert_msg(files_equal(p, q), "the optimizer states differ");
    /* a second run into the same folder is refused, nothing overwritten */
    snprintf(args, sizeof(args), "-q -c '%s'", cfg);
    ck_assert_int_eq(cli(args, &out), 6);
    free(out);
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(test_signal_stops_with_checkpoint)
{
    char *dir = tu_tmpdir(), *out, cmd[8400], p[8400];
    /* a name the shell must quote */
    char *cfg = tiny_cfg(dir, "s 1.cfg", 1, "steps = 100000; log_every = 1;",
                         "demo = { samples = 4; height = 4; width = 4; text_len = 4; text_dim = 32; };\ndata = { batch_size = 2; };");
    /* start, wait for the first steps, SIGTERM, expect 143 and a resumable checkpoint */
    snprintf(cmd, sizeof(cmd),
             "GHC_PLUGIN_PATH='%s' '%s' -q -c '%s' 2>&1 & pid=$!; "
             "for i in $(seq 300); do grep -q '\"step\":3,' '%s/s 1.cfg.out/metrics.jsonl' 2>/dev/null && break; sleep 0.1; done; "
             "kill -TERM $pid; wait $pid", tu_env("GHC_BUILD_PLUGINS"), tu_env("GHC_CLI"), cfg, dir);
    int rc = tu_run(cmd, &out);
    ck_assert_msg(rc == 143, "exit %d: %s", rc, out);
    /* the whole command that continues the run, ready for the shell */
    char *line = strstr(out, "gh200core: continue with: "), resume[8400];
    ck_assert_msg(line != NULL, "%s", out);
    snprintf(resume, sizeof(resume), "%.*s", (int)strcspn(line + 26, "\n"), line + 26);
    free(out);
    DIR *d;
    snprintf(p, sizeof(p), "%s/s 1.cfg.out", dir);
    ck_assert_ptr_nonnull(d = opendir(p));
    struct dirent *e;
    char ck[512] = "";
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "checkpoint-", 11) && !strstr(e->d_name, ".tmp"))
            snprintf(ck, sizeof(ck), "%s", e->d_name);
    closedir(d);
    ck_assert_msg(*ck, "no checkpoint after SIGTERM");
    snprintf(p, sizeof(p), "%s/s 1.cfg.out/%s/trainer.json", dir, ck);
    struct stat st;
    ck_assert_int_eq(stat(p, &st), 0);
    snprintf(p, sizeof(p), "%s -q -c '%s/s 1.cfg' --resume '%s/s 1.cfg.out/%s'", tu_env("GHC_CLI"), dir, dir, ck);
    ck_assert_str_eq(resume, p);
    /* it runs (one step more) */
    snprintf(cmd, sizeof(cmd), "GHC_PLUGIN_PATH='%s' %s --set train.steps=%lld", tu_env("GHC_BUILD_PLUGINS"), resume,
             atoll(ck + 11) + 1);
    rc = tu_run(cmd, &out);
    ck_assert_msg(rc == 0, "%s: exit %d: %s", cmd, rc, out);
    free(out);
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(test_experts_alternate)
{
    const char *demo = "demo = { samples = 4; height = 4; width = 4; text_len = 4; text_dim = 32; sigma_min = 0.9; sigma_max = 0.95; };\n"
                       "data = { batch_size = 1; };";
    char *dir = tu_tmpdir(), *out, args[8400], p[8400];
    /* stored timesteps that all route high: the low-noise turn refuses them with a clear error */
    char *cfg = tiny_cfg(dir, "e.cfg", 2, "steps = 8; mode = \"separate\"; switch_every = 2;", demo);
    snprintf(args, sizeof(args), "-q -c '%s'", cfg);
    ck_assert_int_ne(cli(args, &out), 0);
    ck_assert_msg(strstr(out, "routes to the high-noise expert") != NULL, "%s", out);
    free(out);
    free(cfg);
    /* drawn sigmas: the experts alternate every 2 steps, one adapter file each */
    cfg = tiny_cfg(dir, "f.cfg", 2, "steps = 8; mode = \"separate\"; switch_every = 2; stored_noise = false;", demo);
    snprintf(args, sizeof(args), "-q -c '%s'", cfg);
    ck_assert_msg(cli(args, &out) == 0, "%s", out);
    free(out);
    struct mline m[16];
    snprintf(p, sizeof(p), "%s/f.cfg.out/metrics.jsonl", dir);
    ck_assert_int_eq(read_metrics(p, m, 16), 8);
    for (int i = 0; i < 8; i++)
        ck_assert_msg(m[i].expert == (i / 2) % 2, "step %d trained expert %d", i, m[i].expert);
    struct stat st;
    snprintf(p, sizeof(p), "%s/f.cfg.out/adapter_high_noise.safetensors", dir);
    ck_assert_int_eq(stat(p, &st), 0);
    snprintf(p, sizeof(p), "%s/f.cfg.out/adapter_low_noise.safetensors", dir);
    ck_assert_int_eq(stat(p, &st), 0);
    free(cfg);
    /* one expert only (low): every step on expert 1, one file */
    cfg = tiny_cfg(dir, "g.cfg", 2, "steps = 3; mode = \"single\"; expert = \"low\"; stored_noise = false;", demo);
    snprintf(args, sizeof(args), "-q -c '%s'", cfg);
    ck_assert_msg(cli(args, &out) == 0, "%s", out);
    free(out);
    snprintf(p, sizeof(p), "%s/g.cfg.out/metrics.jsonl", dir);
    ck_assert_int_eq(read_metrics(p, m, 16), 3);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(m[i].expert, 1);
    snprintf(p, sizeof(p), "%s/g.cfg.out/adapter_high_noise.safetensors", dir);
    ck_assert_int_ne(stat(p, &st), 0);
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* Saved activations (the block inputs, with "block_attn" the attention outputs) through the
 * host policy's ring (copied home and back, every buffer NaN-poisoned when handed out for
 * writing and once its unit left it) and "block_attn" (the recomputation restores o and lse):
 * the same losses, validation losses and adapter bytes as "block" in place, with a LoRA that
 * K-concatenates (rank 4 in the model's spare room), 2 micro-batches a step and validation
 * forwards (no keep) between the training steps. ("off" is not compared: the text context's
 * spare columns are shared by the blocks, so a kept block's cross-attention k/v lora_up
 * gradients read a later block's H; recomputed blocks write theirs again.) */
START_TEST(test_saved_activations)
{
    enum { RUNS = 7 };
    static const char *const sets[RUNS] = {
        "--set model.checkpointing='\"block\"'",
        /* blocks kept, not recomputed: the shared text context's K-concatenated H written
         * again before their backward (ghc_linear_restore) */
        "--set model.checkpointing='\"off\"'",
        "--set model.checkpointing='\"block\"' --set model.checkpoint_every=2",
        "--set model.checkpointing='\"block\"' --set mempolicy.saved_ring=3",
        "--set model.checkpointing='\"block_attn\"'",
        "--set model.checkpointing='\"block_attn\"' --set mempolicy.saved_ring=2 --set mempolicy.saved_ahead=1",
        "--set model.checkpointing='\"block_attn\"' --set mempolicy.saved_ring=4 --set mempolicy.saved_ahead=3 "
        "--set mempolicy.saved_poison=false",
    };
    char *dir = tu_tmpdir(), *out, args[8400], p[8400], q[8500];
    char *cfg = tiny_cfg(dir, "v.cfg", 1, "steps = 4; validate_every = 2; validation_sigmas = [0.3, 0.8];",
                         "demo = { samples = 4; height = 4; width = 4; text_len = 4; text_dim = 32; };\n"
                         "data = { batch_size = 1; };\n"
                         "validation = { batch_size = 1; datasets = ( { path = \"v.cfg.out/demo-data\"; } ); };");
    /* the first run (into v.cfg.out) writes the demo data that every run's validation reads */
    static struct mline m[RUNS][16];
    for (int k = 0; k < RUNS; k++) {
        if (k)
            snprintf(args, sizeof(args), "-q -c '%s' %s --set output_dir='\"%s/run%d\"'", cfg, sets[k], dir, k);
        else
            snprintf(args, sizeof(args), "-q -c '%s' %s", cfg, sets[k]);
        ck_assert_msg(cli(args, &out) == 0, "%s: %s", sets[k], out);
        free(out);
        if (k)
            snprintf(p, sizeof(p), "%s/run%d/metrics.jsonl", dir, k);
        else
            snprintf(p, sizeof(p), "%s/v.cfg.out/metrics.jsonl", dir);
        ck_assert_int_eq(read_metrics(p, m[k], 16), 4);
        snprintf(q, sizeof(q), "grep -c validation_loss '%s'", p);
        ck_assert_int_eq(tu_run(q, &out), 0);
        ck_assert_msg(atoi(out) >= 2, "%s: no validation in %s", sets[k], out);
        free(out);
    }
    for (int k = 1; k < RUNS; k++) {
        for (int i = 0; i < 4; i++)
            ck_assert_msg(!strcmp(m[0][i].loss, m[k][i].loss), "%s: step %d loss %s, in place %s", sets[k], i,
                          m[k][i].loss, m[0][i].loss);
        snprintf(p, sizeof(p), "grep -o '\"validation_loss\":[^,}]*' '%s/v.cfg.out/metrics.jsonl' > '%s/va' && "
                 "grep -o '\"validation_loss\":[^,}]*' '%s/run%d/metrics.jsonl' | cmp -s - '%s/va'",
                 dir, dir, dir, k, dir);
        ck_assert_msg(system(p) == 0, "%s: the validation losses differ", sets[k]);
        snprintf(p, sizeof(p), "%s/v.cfg.out/adapter.safetensors", dir);
        snprintf(q, sizeof(q), "%s/run%d/adapter.safetensors", dir, k);
        ck_assert_msg(tensors_equal(p, q), "%s: the adapter differs", sets[k]);
    }
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* dir/<stem>.latent.safetensors [lat] of f32 `fill` and dir/<stem>.text.safetensors [txt] of f32 zeros. */
static void write_shaped(const char *dir, const char *stem, const int64_t *lat, const int64_t *txt, float fill)
{
    static float buf[16 * 2 * 8 * 8 + 600 * 40];
    for (size_t i = 0; i < sizeof(buf) / sizeof(buf[0]); i++)
        buf[i] = 0.0f;
    for (int64_t i = 0; i < lat[0] * lat[1] * lat[2] * lat[3]; i++)
        buf[i] = fill;
    ghc_core_t *core = ghc_core_init();
    char p[4200];
    for (int k = 0; k < 2; k++) {
        ghc_st_writer_t *w = ghc_st_writer_init(core);
        ck_assert_int_eq(ghc_st_writer_add_raw(w, k ? "text_embed" : "latent", GHC_DTYPE_F32, k ? 2 : 4, k ? txt : lat,
                                               k ? buf + 16 * 2 * 8 * 8 : buf), 0);
        snprintf(p, sizeof(p), "%s/%s.%s.safetensors", dir, stem, k ? "text" : "latent");
        ck_assert_msg(ghc_st_writer_finish(w, p) == 0, "%s", ghc_error_message(core));
        ghc_st_writer_free(w);
    }
    ghc_core_free(core);
}

START_TEST(test_nan_skipped)
{
    /* latents of 1e30 (finite in the files) drive the loss to inf or NaN: every step
     * non-finite, the run stops after max_bad_steps with the message, and the earlier
     * checkpoint stays (a run without one leaves output_dir as it was: tests/test_cli.c) */
    char *dir = tu_tmpdir(), *out, args[8400], p[8400];
    static const int64_t lat[4] = { 16, 1, 4, 4 }, txt[2] = { 4, 32 };
    snprintf(p, sizeof(p), "%s/set", dir);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    write_shaped(p, "a", lat, txt, 1e30f);
    write_shaped(p, "b", lat, txt, 1e30f);
    char *cfg = tiny_cfg(dir, "n.cfg", 1, "steps = 10; max_bad_steps = 3; save_every = 1;",
                         "data = { batch_size = 1; datasets = ( { path = \"set\"; } ); };");
    snprintf(args, sizeof(args), "-q -c '%s'", cfg);
    ck_assert_int_eq(cli(args, &out), 1);
    ck_assert_msg(strstr(out, "3 non-finite losses in a row (max_bad_steps): stopping; the last good checkpoint is "
                         "intact") != NULL, "%s", out);
    free(out);
    struct mline m[16];
    snprintf(p, sizeof(p), "%s/n.cfg.out/metrics.jsonl", dir);
    ck_assert_int_eq(read_metrics(p, m, 16), 2);   /* the third aborts before it is logged */
    ck_assert(m[0].skipped && m[1].skipped);
    struct stat st;
    snprintf(p, sizeof(p), "%s/n.cfg.out/checkpoint-2/trainer.json", dir);
    ck_assert_int_eq(stat(p, &st), 0);
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(test_profile_without_gpu)
{
    /* train.profile_steps on a model that computes on the CPU: one warning, the run goes on,
     * no profile.md; a negative count is a configuration error naming the key */
    char *dir = tu_tmpdir(), *out, args[8400], p[8400];
    static const int64_t lat[4] = { 16, 1, 4, 4 }, txt[2] = { 4, 32 };
    snprintf(p, sizeof(p), "%s/set", dir);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    write_shaped(p, "a", lat, txt, 0.5f);
    char *cfg = tiny_cfg(dir, "p.cfg", 1, "steps = 3; profile_steps = 1; profile_skip = 1;",
                         "data = { batch_size = 1; datasets = ( { path = \"set\"; } ); };");
    snprintf(args, sizeof(args), "-q -n -c '%s' --set train.profile_steps=-1", cfg);
    ck_assert_int_eq(cli(args, &out), 3);
    ck_assert_msg(strstr(out, "profile_steps") != NULL, "%s", out);
    free(out);
    snprintf(args, sizeof(args), "-c '%s' 2>&1", cfg);
    ck_assert_int_eq(cli(args, &out), 0);
    ck_assert_msg(strstr(out, "profile_steps: the model computes on the CPU: no profile") != NULL, "%s", out);
    free(out);
    struct stat st;
    snprintf(p, sizeof(p), "%s/p.cfg.out/profile.md", dir);
    ck_assert_int_ne(stat(p, &st), 0);
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(test_shared_and_validation)
{
    /* one adapter shared by both experts: the base follows each micro-batch's first sigma (a
     * uniform base shifted by 5 lands 42% of draws on the high expert), one file, no suffix;
     * validation at fixed sigmas every 2 steps */
    char *dir = tu_tmpdir(), *out, args[8400], p[8400];
    char *cfg = tiny_cfg(dir, "h.cfg", 2,
                         "steps = 10; mode = \"shared\"; stored_noise = false; sampler = \"shift\"; "
                         "shift_base = \"uniform\"; shift = 5.0; validate_every = 2; validation_sigmas = [0.3, 0.95];",
                         "demo = { samples = 4; height = 4; width = 4; text_len = 4; text_dim = 32; };\n"
                         "data = { batch_size = 1; };\n"
                         "validation = { batch_size = 2; datasets = ( { path = \"h.cfg.out/demo-data\"; } ); };");
    snprintf(args, sizeof(args), "-c '%s'", cfg);
    ck_assert_msg(cli(args, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "validation: 4 samples") != NULL, "the held-out validation data was not opened: %s", out);
    free(out);
    struct mline m[32];
    snprintf(p, sizeof(p), "%s/h.cfg.out/metrics.jsonl", dir);
    ck_assert_int_eq(read_metrics(p, m, 32), 10);
    int high = 0, low = 0;
    for (int i = 0; i < 10; i++)
        m[i].expert == 0 ? high++ : low++;
    ck_assert_msg(high > 0 && low > 0, "the shared adapter trained on one expert only (%d high, %d low)", high, low);
    struct stat st;
    snprintf(p, sizeof(p), "%s/h.cfg.out/adapter.safetensors", dir);
    ck_assert_int_eq(stat(p, &st), 0);
    snprintf(p, sizeof(p), "%s/h.cfg.out/adapter_high_noise.safetensors", dir);
    ck_assert_int_ne(stat(p, &st), 0);
    /* 5 validations x 2 sigmas, each a finite loss, the same sigma's loss at every validation
     * computed on the same samples and noise (so they differ only through training) */
    snprintf(p, sizeof(p), "%s/h.cfg.out/metrics.jsonl", dir);
    FILE *f = fopen(p, "r");
    char line[2048];
    int nv = 0;
    while (fgets(line, sizeof(line), f)) {
        char *v = strstr(line, "\"validation_loss\":");
        if (!v)
            continue;
        double x = atof(v + 18);
        ck_assert_msg(isfinite(x) && x > 0.0, "%s", line);
        nv++;
    }
    fclose(f);
    ck_assert_int_eq(nv, 10);
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* A `data` or `validation` batch_size above the trainer's 4096 samples is refused before any
 * run (also under --dry-run), naming the key and its file:line; it used to overrun fixed
 * arrays of 4096 in the validation (NaN validation losses, a stack overflow under ASan). */
START_TEST(test_batch_size_limit)
{
    char *dir = tu_tmpdir(), *out, args[8400];
    static const char *const sec[2] = { "validation", "data" };
    for (int k = 0; k < 2; k++) {
        char name[32], more[1024];
        snprintf(name, sizeof(name), "b%d.cfg", k);
        snprintf(more, sizeof(more),
                 "demo = { samples = 4; height = 4; width = 4; text_len = 4; text_dim = 32; };\n"
                 "data = { batch_size = %d; };\n"
                 "validation = {\n  batch_size = %d;\n  datasets = ( { path = \"%s.out/demo-data\"; } ); };",
                 k ? 5000 : 1, k ? 1 : 4097, name);
        char *cfg = tiny_cfg(dir, name, 1, "steps = 1; validate_every = 1; validation_sigmas = [0.5]; stored_noise = false;", more);
        for (int dry = 0; dry < 2; dry++) {
            snprintf(args, sizeof(args), "%s-q -c '%s'", dry ? "--dry-run " : "", cfg);
            ck_assert_msg(cli(args, &out) != 0, "%s batch_size accepted: %s", sec[k], out);
            char want[256];
            snprintf(want, sizeof(want), "%s.batch_size = %d", sec[k], k ? 5000 : 4097);
            ck_assert_msg(strstr(out, want) && strstr(out, "at most 4096"), "%s", out);
            snprintf(want, sizeof(want), "%s:%d", name, k ? 12 : 14);
            ck_assert_msg(strstr(out, want) != NULL, "no %s in: %s", want, out);
            free(out);
        }
        free(cfg);
    }
    /* 4096 is fine */
    char *cfg = tiny_cfg(dir, "ok.cfg", 1, "steps = 1; validate_every = 1; validation_sigmas = [0.5]; stored_noise = false;",
                         "demo = { samples = 4; height = 4; width = 4; text_len = 4; text_dim = 32; };\n"
                         "data = { batch_size = 4096; };\n"
                         "validation = { batch_size = 4096; datasets = ( { path = \"ok.cfg.out/demo-data\"; } ); };");
    snprintf(args, sizeof(args), "-q -c '%s'", cfg);
    ck_assert_msg(cli(args, &out) == 0, "%s", out);
    free(out);
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* The step of a serialised Event (field 2) and whether it carries `tag`. */
static int64_t event_step(const uint8_t *p, size_t len)
{
    const uint8_t *q = p, *end = p + len;
    while (q < end) {
        uint64_t key = rd_varint(&q), v;
        switch (key & 7) {
        case 0:
            v = rd_varint(&q);
            if (key >> 3 == 2)
                return (int64_t)v;
            break;
        case 1: q += 8; break;
        case 2: v = rd_varint(&q); q += v; break;
        case 5: q += 4; break;
        default: return -1;
        }
    }
    return 0;
}

START_TEST(test_resume_logs_each_step_once)
{
    /* 6 steps with a checkpoint at 3, then resumed from checkpoint-3 into the same folder:
     * metrics.jsonl and the TensorBoard files hold each of the 6 steps once */
    char *dir = tu_tmpdir(), *out, args[8400], p[8400];
    char *cfg = tiny_cfg(dir, "r.cfg", 1, "steps = 6; save_every = 3; keep_last = 0;",
                         "demo = { samples = 4; height = 4; width = 4; text_len = 4; text_dim = 32; };\ndata = { batch_size = 2; };");
    snprintf(args, sizeof(args), "-q -c '%s'", cfg);
    ck_assert_msg(cli(args, &out) == 0, "%s", out);
    free(out);
    sleep(1);   /* an event file is named by the second its run starts in */
    snprintf(args, sizeof(args), "-q -c '%s' --resume '%s/r.cfg.out/checkpoint-3'", cfg, dir);
    ck_assert_msg(cli(args, &out) == 0, "%s", out);
    free(out);
    struct mline m[64];
    snprintf(p, sizeof(p), "%s/r.cfg.out/metrics.jsonl", dir);
    ck_assert_int_eq(read_metrics(p, m, 64), 6);
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(m[i].step, i + 1);
    int count[8] = { 0 }, files = 0;
    snprintf(p, sizeof(p), "%s/r.cfg.out", dir);
    DIR *d = opendir(p);
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    static uint8_t buf[1 << 20];
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "events.out.tfevents.", 20) != 0)
            continue;
        files++;
        snprintf(p, sizeof(p), "%s/r.cfg.out/%s", dir, e->d_name);
        FILE *f = fopen(p, "rb");
        ck_assert_ptr_nonnull(f);
        size_t n = fread(buf, 1, sizeof(buf), f);
        fclose(f);
        for (size_t i = 0; i + 16 <= n; ) {
            uint64_t len = rd_le(buf + i, 8);
            const uint8_t *ev = buf + i + 12;
            int64_t step = event_step(ev, (size_t)len);
            if (memmem(ev, (size_t)len, "train/loss", 10) && step >= 0 && step < 8)
                count[step]++;
            i += 16 + (size_t)len;
        }
    }
    closedir(d);
    ck_assert_int_eq(files, 2);
    for (int s = 1; s <= 6; s++)
        ck_assert_msg(count[s] == 1, "train/loss of step %d is in the event files %d times", s, count[s]);
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* ---- whose output_dir is (issue 26: files lost or overwritten without asking) --------------- */

/* Whether the path printf(fmt, ...) exists. */
static bool exists(const char *fmt, ...) GHC_PRINTF(1, 2);
static bool exists(const char *fmt, ...)
{
    char p[8400];
    struct stat st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p, sizeof(p), fmt, ap);
    va_end(ap);
    return lstat(p, &st) == 0;
}

static void sh(const char *fmt, ...) GHC_PRINTF(1, 2);
static void sh(const char *fmt, ...)
{
    char cmd[8400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    ck_assert_msg(system(cmd) == 0, "%s", cmd);
}

/* An error run with -q: one line, "gh200core: error: ...", containing `what`. */
static void one_error(const char *out, const char *what)
{
    ck_assert_msg(!strncmp(out, "gh200core: error: ", 18) && tu_lines(out) == 1, "output: %s", out);
    ck_assert_msg(strstr(out, what) != NULL, "lacks '%s': %s", what, out);
}

/* `args` (with -q) and its --dry-run both end with exit `status` and one error line holding `what`. */
static void both_fail(const char *args, int status, const char *what)
{
    char a[8400], *out;
    for (int dry = 0; dry < 2; dry++) {
        snprintf(a, sizeof(a), "-q %s%s", dry ? "-n " : "", args);
        ck_assert_int_eq(cli(a, &out), status);
        one_error(out, what);
        free(out);
    }
}

#define SMALL_DEMO "demo = { samples = 4; height = 4; width = 4; text_len = 4; text_dim = 32; };\ndata = { batch_size = 2; };"

/* A tiny run's configuration (SMALL_DEMO's data), written and run once, successfully. */
static char *run_once(const char *dir, const char *name, const char *train)
{
    char *cfg = tiny_cfg(dir, name, 1, train, SMALL_DEMO), *out, args[8400];
    snprintf(args, sizeof(args), "-q -c '%s'", cfg);
    ck_assert_msg(cli(args, &out) == 0, "%s", out);
    free(out);
    return cfg;
}

/* --resume A/checkpoint-2 with output_dir = another run's folder B is refused, B as it was
 * (it overwrote B's adapter, resolved.cfg and checkpoints and appended to its metrics, exit 0) */
START_TEST(test_resume_into_another_run)
{
    char *dir = tu_tmpdir(), *out, args[8400];
    char *a = run_once(dir, "a.cfg", "steps = 4; save_every = 2; tensorboard = false;");
    char *b = run_once(dir, "b.cfg", "steps = 2; tensorboard = false;");
    sh("cp -a '%s/b.cfg.out' '%s/b.copy'", dir, dir);
    char want[8400];
    snprintf(args, sizeof(args), "-c '%s' --set output_dir='\"%s/b.cfg.out\"' --resume '%s/a.cfg.out/checkpoint-2'", a,
             dir, dir);
    snprintf(want, sizeof(want), "output_dir '%s/b.cfg.out' holds another run (adapter.safetensors, checkpoint-2/, "
             "demo-data/, metrics.jsonl and 2 more): --resume %s/a.cfg.out/checkpoint-2 would write over it", dir, dir);
    both_fail(args, 6, want);
    sh("diff -r '%s/b.cfg.out' '%s/b.copy'", dir, dir);
    /* into a new folder it goes on */
    snprintf(args, sizeof(args), "-q -c '%s' --set output_dir='\"%s/c.out\"' --resume '%s/a.cfg.out/checkpoint-2'", a, dir, dir);
    ck_assert_msg(cli(args, &out) == 0, "%s", out);
    free(out);
    free(a);
    free(b);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* The user's files in output_dir: refused; with --overwrite, a folder this tool did not write
 * (checkpoint-0/) and another run's checkpoint-100 stay, and keep_last counts only the run's
 * own checkpoints (checkpoint-0 was deleted; checkpoint-100 made it prune all of its own) */
START_TEST(test_user_files_kept)
{
    char *dir = tu_tmpdir(), *out, args[8400];
    char *other = run_once(dir, "o.cfg", "steps = 1; tensorboard = false;");
    char *cfg = tiny_cfg(dir, "u.cfg", 1, "steps = 4; save_every = 1; keep_last = 2; tensorboard = false;", SMALL_DEMO);
    sh("mkdir -p '%s/u.cfg.out/checkpoint-0' && echo mine > '%s/u.cfg.out/checkpoint-0/notes.txt' && "
       "echo mine > '%s/u.cfg.out/adapter.safetensors' && echo mine > '%s/u.cfg.out/metrics.jsonl'", dir, dir, dir, dir);
    char want[8400];
    snprintf(args, sizeof(args), "-c '%s'", cfg);
    snprintf(want, sizeof(want), "output_dir '%s/u.cfg.out' is not empty: it holds adapter.safetensors, checkpoint-0/ "
             "and metrics.jsonl; choose another folder (--set output_dir=DIR), or give --overwrite", dir);
    both_fail(args, 6, want);
    sh("grep -q mine '%s/u.cfg.out/adapter.safetensors' && grep -q mine '%s/u.cfg.out/metrics.jsonl'", dir, dir);
    sh("cp -a '%s/o.cfg.out/checkpoint-1' '%s/u.cfg.out/checkpoint-100'", dir, dir);
    snprintf(args, sizeof(args), "-c '%s' --overwrite", cfg);
    ck_assert_msg(cli(args, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "--overwrite: output_dir") && strstr(out, "nothing else is removed"), "%s", out);
    free(out);
    sh("grep -q mine '%s/u.cfg.out/checkpoint-0/notes.txt'", dir);
    ck_assert(exists("%s/u.cfg.out/checkpoint-100/trainer.json", dir));
    ck_assert(exists("%s/u.cfg.out/checkpoint-3/trainer.json", dir));
    ck_assert(exists("%s/u.cfg.out/checkpoint-4/trainer.json", dir));
    ck_assert(!exists("%s/u.cfg.out/checkpoint-2", dir) && !exists("%s/u.cfg.out/checkpoint-1", dir));
    free(other);
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* Resumed from an older checkpoint into its folder: the newer ones of the abandoned
 * continuation go (said), the new ones are kept by keep_last (it kept the stale checkpoint-8
 * and pruned the one just written) */
START_TEST(test_resume_older_checkpoint)
{
    char *dir = tu_tmpdir(), *out, args[8400];
    char *cfg = run_once(dir, "r.cfg", "steps = 8; save_every = 2; keep_last = 0; tensorboard = false;");
    snprintf(args, sizeof(args), "-c '%s' --set train.steps=6 --set train.keep_last=1 --resume '%s/r.cfg.out/checkpoint-4'",
             cfg, dir);
    ck_assert_msg(cli(args, &out) == 0, "%s", out);
    char want[8400];
    snprintf(want, sizeof(want), "train: removed %s/r.cfg.out/checkpoint-8: newer than checkpoint-4, which this run "
             "continues from", dir);
    ck_assert_msg(strstr(out, want), "lacks '%s': %s", want, out);
    free(out);
    ck_assert(exists("%s/r.cfg.out/checkpoint-6/trainer.json", dir));
    for (int s = 2; s <= 8; s += 2)
        ck_assert_msg(s == 6 || !exists("%s/r.cfg.out/checkpoint-%d", dir, s), "checkpoint-%d is left", s);
    ck_assert(!exists("%s/r.cfg.out/checkpoint-8.trash", dir));
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* train.name is checked against the files beside the adapters: "optimizer" made every
 * checkpoint's adapter overwrite its optimizer state */
START_TEST(test_name_collisions)
{
    static const char *const bad[] = { "optimizer", "params", "trainer", "metrics", "resolved", "..", ".",
                                       "events.out.tfevents.x", "a/b", "" };
    char *dir = tu_tmpdir(), args[8400];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char train[256], want[256];
        snprintf(train, sizeof(train), "steps = 1; name = \"%s\";", bad[i]);
        char *cfg = tiny_cfg(dir, "n.cfg", 1, train, SMALL_DEMO);
        snprintf(args, sizeof(args), "-c '%s'", cfg);
        snprintf(want, sizeof(want), "n.cfg:10: train.name = \"%s\": the adapter file's name: ", bad[i]);
        both_fail(args, 3, want);
        ck_assert(!exists("%s/n.cfg.out", dir));
        free(cfg);
    }
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* Pruning renames first and a failure to remove is a warning (it aborted the run); what a
 * stopped run left (checkpoint-N.tmp/, .trash, *.tmp.XXXXXX) is cleaned at the next start,
 * only this tool's names */
START_TEST(test_prune_failure_and_leftovers)
{
    char *dir = tu_tmpdir(), *out, args[8400];
    char *cfg = run_once(dir, "p.cfg", "steps = 2; save_every = 1; keep_last = 0; tensorboard = false;");
    const char *o = "p.cfg.out";
    sh("cd '%s/%s' && mkdir checkpoint-7.tmp checkpoint-9.trash checkpoint-x.tmp && touch checkpoint-7.tmp/a "
       "checkpoint-9.trash/b adapter.safetensors.tmp.AbC123 resolved.cfg.tmp.Zz9Zz9 notes.tmp.AbC123", dir, o);
    /* a path too long to open below checkpoint-1: its removal fails, whoever runs the test */
    sh("cd '%s/%s/checkpoint-1' && p=$(printf 'd%%.0s' $(seq 250)) && q=$p && for i in $(seq 20); do q=$q/$p; done && "
       "mkdir -p $q", dir, o);
    snprintf(args, sizeof(args), "-c '%s' --set train.steps=3 --set train.keep_last=1 --resume '%s/%s/checkpoint-2'", cfg,
             dir, o);
    int rc = cli(args, &out);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
    char want[8400];
    snprintf(want, sizeof(want), "warn: train: %s/%s/checkpoint-1: not removed (", dir, o);
    ck_assert_msg(strstr(out, want) && strstr(out, "the run goes on"), "lacks '%s': %s", want, out);
    snprintf(want, sizeof(want), "train: removed %s/%s/checkpoint-7.tmp (left by a run that was stopped)", dir, o);
    ck_assert_msg(strstr(out, want), "lacks '%s': %s", want, out);
    free(out);
    ck_assert(!exists("%s/%s/checkpoint-1", dir, o) && exists("%s/%s/checkpoint-1.trash", dir, o));
    ck_assert(!exists("%s/%s/checkpoint-2", dir, o) && exists("%s/%s/checkpoint-3/trainer.json", dir, o));
    ck_assert(!exists("%s/%s/checkpoint-7.tmp", dir, o) && !exists("%s/%s/checkpoint-9.trash", dir, o));
    ck_assert(!exists("%s/%s/adapter.safetensors.tmp.AbC123", dir, o) && !exists("%s/%s/resolved.cfg.tmp.Zz9Zz9", dir, o));
    ck_assert(exists("%s/%s/notes.tmp.AbC123", dir, o) && exists("%s/%s/checkpoint-x.tmp", dir, o));
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* A full disk under metrics.jsonl stops the run at the first failed write, with a checkpoint
 * and a non-zero exit (the run went on with truncated metrics, exit 0) */
START_TEST(test_disk_full_stops)
{
    char *dir = tu_tmpdir(), *out, args[8400];
    char *cfg = tiny_cfg(dir, "f.cfg", 1, "steps = 5;", SMALL_DEMO);
    sh("mkdir '%s/f.cfg.out' && ln -s /dev/full '%s/f.cfg.out/metrics.jsonl'", dir, dir);
    snprintf(args, sizeof(args), "-q -c '%s' --overwrite", cfg);
    ck_assert_int_eq(cli(args, &out), 5);
    char want[8400];
    snprintf(want, sizeof(want), "%s/f.cfg.out/metrics.jsonl: cannot write: No space left on device: stopped at step 1 "
             "with checkpoint %s/f.cfg.out/checkpoint-1; continue with --resume %s/f.cfg.out/checkpoint-1", dir, dir, dir);
    one_error(out, want);
    free(out);
    ck_assert(exists("%s/f.cfg.out/checkpoint-1/trainer.json", dir));
    ck_assert(!exists("%s/f.cfg.out/adapter.safetensors", dir));
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(test_model_input_spec)
{
    /* what wan22 says it takes (an I2V-shaped random model), and where each number came from */
    ghc_core_t *core = ghc_core_init();
    ok(core, ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")));
    ok(core, ghc_config_load_string(core, "mempolicy = { plugin = \"host\"; };\n"
                                    "model = { plugin = \"wan22\"; dtype = \"f32\"; device = -1;\n"
                                    "  random = { dim = 64; ffn_dim = 128; heads = 2; layers = 1; in_channels = 36;\n"
                                    "             out_channels = 16; freq_dim = 64; }; };\n", "m.cfg", NULL, NULL, 0));
    ok(core, ghc_run_init(core));
    struct ghc_model_input in = { .struct_size = sizeof(in) };
    ok(core, ghc_model_input_spec(ghc_model_get(core), &in));
    ck_assert_int_eq(in.channels, 16);
    ck_assert_int_eq(in.cond_channels, 20);
    ck_assert_int_eq(in.text_dim, 4096);
    ck_assert_int_eq(in.text_len, 512);
    ck_assert(in.patch[0] == 1 && in.patch[1] == 2 && in.patch[2] == 2);
    ck_assert_str_eq(in.channels_from, "model.random.in_channels at m.cfg:3 and model.random.out_channels at m.cfg:4");
    ck_assert_str_eq(in.text_dim_from, "model.random.text_dim (default 4096)");
    ck_assert_ptr_nonnull(in.text_len_from);
    ck_assert_ptr_nonnull(in.patch_from);
    /* a caller built against a smaller struct gets its part and nothing past it */
    struct { uint32_t struct_size; int64_t channels; int64_t after; } small = {
        .struct_size = (uint32_t)offsetof(struct ghc_model_input, cond_channels), .after = 77 };
    ok(core, ghc_model_input_spec(ghc_model_get(core), (struct ghc_model_input *)&small));
    ck_assert_int_eq(small.channels, 16);
    ck_assert_int_eq(small.after, 77);
    ghc_core_free(core);
}
END_TEST

/* ---- resuming: what a checkpoint holds is checked before it is used ------------------------- */

/* `--dry-run --resume ck` of cfg into a fresh folder, with more arguments (not quiet: the
 * warnings are looked for); returns the status. */
static int resume_dry(const char *dir, const char *cfg, const char *ck, const char *more, char **out)
{
    static int k;
    char args[8400];
    snprintf(args, sizeof(args), "-c '%s' --dry-run --set output_dir='\"%s/dry%d.out\"' --resume '%s' %s", cfg,
             dir, k++, ck, more);
    return cli(args, out);
}

/* A copy of checkpoint `ck` as dir/<sub>/checkpoint-2 with `sed` applied to its trainer.json
 * (NULL: none). Returns the copy's path (static). */
static const char *ck_copy(const char *dir, const char *ck, const char *sub, const char *sed)
{
    static char p[4200];
    char cmd[9000];
    snprintf(p, sizeof(p), "%s/%s/checkpoint-2", dir, sub);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s/%s' && mkdir -p '%s/%s' && cp -r '%s' '%s'", dir, sub, dir, sub, ck, p);
    ck_assert_int_eq(system(cmd), 0);
    if (sed) {
        snprintf(cmd, sizeof(cmd), "sed -i '%s' '%s/trainer.json'", sed, p);
        ck_assert_int_eq(system(cmd), 0);
    }
    return p;
}

/* Rewrite file `path` with element 0 of its first float tensor (or of tensor `name`) set to v. */
static void spoil_tensor(const char *path, const char *name, float v)
{
    ghc_core_t *core = ghc_core_init();
    ghc_st_t *st = ghc_st_open(core, path);
    ck_assert_msg(st != NULL, "%s", ghc_error_message(core));
    ghc_st_writer_t *w = ghc_st_writer_init(core);
    bool done = false;
    for (int i = 0; i < ghc_st_count(st); i++) {
        struct ghc_st_info t;
        ghc_st_info_at(st, i, &t);
        if (done || !ghc_dtype_is_float(t.dtype) || (name && strcmp(t.name, name) != 0)) {
            ck_assert_int_eq(ghc_st_writer_add_raw(w, t.name, t.dtype, t.ndim, t.shape, ghc_st_raw(st, t.name)), 0);
            continue;
        }
        ghc_tensor_t *f = ghc_st_load(st, t.name, GHC_DTYPE_F32, GHC_ROLE_WORKSPACE);
        ghc_tensor_t *o = ghc_tensor_init(core, t.dtype, t.ndim, t.shape, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
        ck_assert(f && o);
        ((float *)ghc_tensor_data(f))[0] = v;
        ck_assert_int_eq(ghc_tensor_convert_cpu(o, f, 1.0f), 0);
        ck_assert_int_eq(ghc_st_writer_add(w, t.name, o), 0);
        ghc_tensor_free(f);
        ghc_tensor_free(o);
        done = true;
    }
    ck_assert(done);
    char tmp[4500];
    snprintf(tmp, sizeof(tmp), "%s.new", path);
    ck_assert_msg(ghc_st_writer_finish(w, tmp) == 0, "%s", ghc_error_message(core));
    ck_assert_int_eq(rename(tmp, path), 0);
    ghc_st_writer_free(w);
    ghc_st_free(st);
    ghc_core_free(core);
}

/* --resume compares the configuration with the checkpoint's resolved.cfg (another seed, model
 * or network is refused naming the key and both values; what may change is one warning), checks
 * every field of trainer.json, and refuses a NaN or an infinity in the params, the optimizer's
 * state or the adapter file, naming the file and the tensor. Each was accepted before, exit 0. */
START_TEST(test_resume_checks)
{
    char *dir = tu_tmpdir(), *out, ck[4200];
    char *cfg = tiny_cfg(dir, "k.cfg", 1, "steps = 4; save_every = 2; keep_last = 0;",
                         "demo = { samples = 4; height = 4; width = 4; text_len = 4; text_dim = 32; };\n"
                         "data = { batch_size = 2; };");
    snprintf(ck, sizeof(ck), "-q -c '%s'", cfg);
    ck_assert_msg(cli(ck, &out) == 0, "%s", out);
    free(out);
    snprintf(ck, sizeof(ck), "%s/k.cfg.out/checkpoint-2", dir);
    ck_assert_msg(resume_dry(dir, cfg, ck, "", &out) == 0, "%s", out);
    free(out);

    /* the configuration */
    static const struct { const char *set, *want; int code; } conf[] = {
        { "--set seed=43", "resolved.cfg: seed = 42, but this configuration has seed = 43", 3 },
        { "--set network.rank=8", "network.rank = 4, but this configuration has network.rank = 8", 3 },
        { "--set network.algo='\"loha\"'", "network.algo = \"lora\", but", 3 },
        { "--set model.random.seed=8", "model.random.seed = 7, but", 3 },
        { "--set train.steps=8 --set optimizer.lr=0.001",
          "4 settings changed from its resolved.cfg: optimizer.lr 0.001 (was 0.01), optimizer.high_noise_lr", 0 },
    };
    for (size_t c = 0; c < sizeof(conf) / sizeof(conf[0]); c++) {
        int rc = resume_dry(dir, cfg, ck, conf[c].set, &out);
        ck_assert_msg(rc == conf[c].code && strstr(out, conf[c].want), "%s: exit %d: %s", conf[c].set, rc, out);
        free(out);
    }

    /* trainer.json: each field's type, range and agreement */
    static const struct { const char *sed, *want; } state[] = {
        { "s/\"step\": 2,/\"step\": -5,/", "trainer.json: \"step\" is -5: expected an integer from 0 to 4 (train.steps)" },
        { "s/\"step\": 2,/\"step\": 1e18,/", "\"step\" is 1e" },
        { "s/\"step\": 2,/\"step\": 1000000000000000000,/", "\"step\" is 1000000000000000000: expected" },
        { "s/\"step\": 2,/\"step\": 3,/", "\"step\" is 3, but the folder is" },
        { "s/\"bad_total\": 0,/\"bad_total\": 0.5,/", "\"bad_total\" is 0.5: expected an integer from 0 to 2" },
        { "s/\"data_epoch\": [0-9]*,/\"data_epoch\": -1,/", "\"data_epoch\" is -1" },
        { "s/\"noise_offset\": \"[0-9]*\",/\"noise_offset\": \"-3\",/", "\"noise_offset\" must be a string of decimal digits" },
        { "s/\"loss_ema\": [0-9.e-]*,/\"loss_ema\": -1.0,/", "\"loss_ema\" is -1.0: expected a finite number" },
        { "s/\"version\": 1/\"version\": 2/", "\"version\" is 2" },
        { "/\"samples_seen\"/d", "\"samples_seen\" is missing" },
    };
    for (size_t c = 0; c < sizeof(state) / sizeof(state[0]); c++) {
        const char *p = ck_copy(dir, ck, "state", state[c].sed);
        int rc = resume_dry(dir, cfg, p, "", &out);
        ck_assert_msg(rc == 5 && strstr(out, state[c].want) && strstr(out, p), "%s: exit %d: %s", state[c].sed, rc,
                      out);
        free(out);
    }

    /* non-finite values in the files: the file and the tensor named */
    static const char *const files[] = { "params.safetensors", "optimizer.safetensors", "adapter.safetensors" };
    for (size_t c = 0; c < 3; c++) {
        char f[4400];
        for (int inf = 0; inf < 2; inf++) {
            const char *p = ck_copy(dir, ck, "nan", NULL);
            snprintf(f, sizeof(f), "%s/%s", p, files[c]);
            spoil_tensor(f, NULL, inf ? INFINITY : NAN);
            int rc = resume_dry(dir, cfg, p, "", &out);
            ck_assert_msg(rc == 5 && strstr(out, f) && strstr(out, "tensor '") &&
                          strstr(out, inf ? "element 0 is inf" : "element 0 is nan"), "%s: exit %d: %s", f, rc, out);
            free(out);
        }
    }
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* A sample the model cannot take (odd height, other channels, no frames, too many or too wide
 * text rows) is found when the data is opened, by --dry-run too, naming its file; with
 * skip_bad_samples it is left out there with one line and the run goes on (it used to pass
 * the open and --dry-run and stop the run mid-way, or skip_bad_samples did not skip it). */
START_TEST(test_samples_against_model)
{
    static const struct { int64_t lat[4], txt[2]; const char *file, *what; int code; } cases[] = {
        { { 16, 1, 3, 4 }, { 4, 32 }, "bad.latent.safetensors", "its height, 3, is not a multiple of 2", 3 },
        { { 8, 1, 4, 4 }, { 4, 32 }, "bad.latent.safetensors", "has 8 channels; the model takes 16", 3 },
        { { 16, 0, 4, 4 }, { 4, 32 }, "bad.latent.safetensors", "is [16, 0, 4, 4] F32, expected [C, F, H, W]", 5 },
        { { 16, 1, 4, 4 }, { 513, 32 }, "bad.text.safetensors", "has 513 rows; the model takes at most 512", 3 },
        { { 16, 1, 4, 4 }, { 4, 33 }, "bad.text.safetensors", "has width 33, but", 5 },
    };
    static const int64_t good_lat[4] = { 16, 1, 4, 4 }, good_txt[2] = { 4, 32 };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char *dir = tu_tmpdir(), *out, data[4200], args[9000], want[4400];
        snprintf(data, sizeof(data), "%s/set", dir);
        ck_assert_int_eq(mkdir(data, 0755), 0);
        write_shaped(data, "g1", good_lat, good_txt, 0.0f);
        write_shaped(data, "g2", good_lat, good_txt, 0.0f);
        write_shaped(data, "g3", good_lat, good_txt, 0.0f);
        write_shaped(data, "bad", cases[c].lat, cases[c].txt, 0.0f);
        for (int skip = 0; skip < 2; skip++) {
            char more[4400];
            snprintf(more, sizeof(more), "data = { batch_size = 1; skip_bad_samples = %s; datasets = ( { path = \"set\"; } ); };",
                     skip ? "true" : "false");
            char *cfg = tiny_cfg(dir, "s.cfg", 1, "steps = 2;", more);
            snprintf(args, sizeof(args), "-c '%s' --dry-run", cfg);
            int rc = cli(args, &out);
            snprintf(want, sizeof(want), "%s%s/%s: ", skip ? "skipping a bad sample: " : "error: data: ", data,
                     cases[c].file);
            ck_assert_msg(rc == (skip ? 0 : cases[c].code) && strstr(out, want) && strstr(out, cases[c].what),
                          "case %zu, skip %d: exit %d, want '%s': %s", c, skip, rc, want, out);
            free(out);
            free(cfg);
        }
        tu_rm_rf(dir);
        free(dir);
    }
}
END_TEST

static Suite *train_suite(void)
{
    Suite *s = suite_create("train");
    TCase *tc = tcase_create("parts");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_sampler_families);
    tcase_add_test(tc, test_sampler_acceptance);
    tcase_add_test(tc, test_sampler_state_and_error);
    tcase_add_test(tc, test_tensorboard);
    tcase_add_test(tc, test_gradient_ramp);
    tcase_add_test(tc, test_lr_schedule);
    tcase_add_test(tc, test_model_input_spec);
    suite_add_tcase(s, tc);
    TCase *tr = tcase_create("runs");
    tcase_set_timeout(tr, 600);
    tcase_add_test(tr, test_demo_learns);
    tcase_add_test(tr, test_resume_bitwise);
    tcase_add_test(tr, test_signal_stops_with_checkpoint);
    tcase_add_test(tr, test_experts_alternate);
    tcase_add_test(tr, test_nan_skipped);
    tcase_add_test(tr, test_profile_without_gpu);
    tcase_add_test(tr, test_shared_and_validation);
    tcase_add_test(tr, test_saved_activations);
    tcase_add_test(tr, test_resume_logs_each_step_once);
    tcase_add_test(tr, test_resume_into_another_run);
    tcase_add_test(tr, test_user_files_kept);
    tcase_add_test(tr, test_resume_older_checkpoint);
    tcase_add_test(tr, test_prune_failure_and_leftovers);
    tcase_add_test(tr, test_disk_full_stops);
    tcase_add_test(tr, test_resume_checks);
    suite_add_tcase(s, tr);
    TCase *tl = tcase_create("limits");
    tcase_set_timeout(tl, 120);
    tcase_add_test(tl, test_batch_size_limit);
    tcase_add_test(tl, test_name_collisions);
    tcase_add_test(tl, test_samples_against_model);
    suite_add_tcase(s, tl);
    return s;
}

int main(void)
{
    return tu_run_suite(train_suite(), false);
}
