/* test_media.c: raw media (media.h): the folder scan and its captions, musubi-tuner's buckets,
 * the frame extraction table computed here on its own, the settings from a config, the VAE's
 * input, the resize against Pillow's and OpenCV's bytes (tests/fixtures/media), and (with
 * FFmpeg) decoding of files written at test time by the library's writer (media.h): lossless
 * FFV1/Matroska, MPEG-4/MP4, a variable frame rate clip, PNG with alpha, JPEG, odd sizes, a
 * corrupt and a truncated file, a clip too short. Without FFmpeg, decoding says so. */
#include <config.h>

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <gh200core/gh200core.h>
#include <gh200core/media.h>
#include <gh200core/safetensors.h>
#include <gh200core/tensor.h>

#include "testutil.h"
#include "media_write.h"

#ifdef GHC_HAVE_FFMPEG
#include <libavutil/log.h>          /* defines: av_log_set_level */
#endif

/* ---- helpers -------------------------------------------------------------------------------- */

static char *path_in(const char *dir, const char *name)
{
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    ck_assert_ptr_nonnull(p);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

static void write_bytes(const char *dir, const char *name, const void *b, size_t n)
{
    char *p = path_in(dir, name);
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(b, 1, n, f), n);
    fclose(f);
    free(p);
}

static struct ghc_media_settings settings(int w, int h, enum ghc_media_extraction e, const int32_t *t, int nt)
{
    struct ghc_media_settings s;
    ghc_media_settings_default(&s);
    s.width = w;
    s.height = h;
    s.frame_extraction = e;
    s.n_target_frames = nt;
    memcpy(s.target_frames, t, (size_t)nt * sizeof(*t));
    return s;
}

/* ---- the extraction table, on its own --------------------------------------------------------- */

/* The clips of the table in doc/media.md for targets t (already 4k + 1, ascending), written
 * from the table, not from the library: returns the count, clips in (start, len). */
static int table_clips(enum ghc_media_extraction e, int n, const int *t, int nt, int stride, int sample,
                       int max_frames, int (*out)[2])
{
    int c = 0;
    if (e == GHC_MEDIA_FULL) {
        int m = n < max_frames ? n : max_frames;
        out[c][0] = 0, out[c][1] = (m - 1) / 4 * 4 + 1, c++;
        return c;
    }
    for (int k = 0; k < nt; k++) {
        int f = t[k];
        if (f > n)
            continue;
        if (e == GHC_MEDIA_HEAD || (e == GHC_MEDIA_UNIFORM && sample == 1)) {
            out[c][0] = 0, out[c][1] = f, c++;
        } else if (e == GHC_MEDIA_CHUNK) {
            for (int i = 0; i + f <= n; i += f)
                out[c][0] = i, out[c][1] = f, c++;
        } else if (e == GHC_MEDIA_SLIDE) {
            for (int i = 0; i <= n - f; i += stride)
                out[c][0] = i, out[c][1] = f, c++;
        } else {   /* uniform: floor(i (n - f) / (sample - 1)), exact in integers, equal ones once */
            for (int i = 0; i < sample; i++) {
                int st = i * (n - f) / (sample - 1);
                if (!c || out[c - 1][1] != f || out[c - 1][0] != st)
                    out[c][0] = st, out[c][1] = f, c++;
            }
        }
    }
    return c;
}

START_TEST(clips_table)
{
    const int32_t given[] = { 9, 1, 26, 17, 19 };    /* -> 1, 9, 17, 25 */
    const int expect_t[] = { 1, 9, 17, 25 };
    int32_t t[GHC_MEDIA_MAX_TARGETS];
    ck_assert_int_eq(ghc_media_target_frames(given, 5, t), 4);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(t[i], expect_t[i]);
    const int ns[] = { 1, 4, 9, 20, 33, 81, 130, 200 };
    for (int e = GHC_MEDIA_HEAD; e <= GHC_MEDIA_FULL; e++)
        for (int k = 0; k < 8; k++)
            for (int stride = 1; stride <= 7; stride += 3)
                for (int sample = 1; sample <= 5; sample += 2) {
                    struct ghc_media_settings s = settings(832, 480, e, given, 5);
                    s.frame_stride = stride;
                    s.frame_sample = sample;
                    s.max_frames = 129;
                    static int want[4096][2];
                    static struct ghc_media_clip got[4096];
                    int nw = table_clips(e, ns[k], expect_t, 4, stride, sample, 129, want);
                    int64_t ng = ghc_media_clips(&s, ns[k], got, 4096);
                    ck_assert_msg(ng == nw, "%s n=%d stride=%d sample=%d: %lld clips, want %d",
                                  ghc_media_extraction_name(e), ns[k], stride, sample, (long long)ng, nw);
                    for (int i = 0; i < nw; i++)
                        ck_assert_msg(got[i].start == want[i][0] && got[i].frames == want[i][1],
                                      "%s n=%d clip %d: (%lld, %d), want (%d, %d)", ghc_media_extraction_name(e),
                                      ns[k], i, (long long)got[i].start, got[i].frames, want[i][0], want[i][1]);
                    /* counting only (max 0) gives the same number */
                    ck_assert_int_eq(ghc_media_clips(&s, ns[k], NULL, 0), nw);
                }
    /* numpy: np.linspace(0, 20 - 9, 4, dtype=int) = [0, 3, 7, 11] */
    const int32_t nine = 9;
    struct ghc_media_settings s = settings(832, 480, GHC_MEDIA_UNIFORM, &nine, 1);
    s.frame_sample = 4;
    struct ghc_media_clip c[8];
    ck_assert_int_eq(ghc_media_clips(&s, 20, c, 8), 4);
    ck_assert_int_eq(c[1].start, 3);
    ck_assert_int_eq(c[2].start, 7);
    ck_assert_int_eq(c[3].start, 11);
    /* full: min(200, 129) = 129 -> 129; 130 -> 129; 12 -> 9; 3 -> 1 */
    s.frame_extraction = GHC_MEDIA_FULL;
    ck_assert_int_eq(ghc_media_clips(&s, 200, c, 8), 1);
    ck_assert_int_eq(c[0].frames, 129);
    ghc_media_clips(&s, 12, c, 8);
    ck_assert_int_eq(c[0].frames, 9);
    ghc_media_clips(&s, 3, c, 8);
    ck_assert_int_eq(c[0].frames, 1);
    /* too short: no clip */
    s.frame_extraction = GHC_MEDIA_HEAD;
    ck_assert_int_eq(ghc_media_clips(&s, 8, c, 8), 0);
}
END_TEST

/* ---- buckets ----------------------------------------------------------------------------------- */

START_TEST(bucket_lists)
{
    int32_t b[256][2];
    int n = ghc_media_buckets(832, 480, true, b, 256);
    ck_assert_int_eq(n, 42);
    ck_assert_int_eq(b[0][0], 304);
    ck_assert_int_eq(b[0][1], 1312);
    ck_assert_int_eq(b[n - 1][0], 1312);
    ck_assert_int_eq(b[n - 1][1], 304);
    bool has = false;
    for (int i = 0; i < n; i++) {
        has = has || (b[i][0] == 832 && b[i][1] == 480);
        ck_assert_int_eq(b[i][0] % 16, 0);
        ck_assert_int_eq(b[i][1] % 16, 0);
        ck_assert_int_le((int64_t)b[i][0] * b[i][1], 832 * 480);
        if (i)
            ck_assert(b[i][0] > b[i - 1][0] || (b[i][0] == b[i - 1][0] && b[i][1] > b[i - 1][1]));
    }
    ck_assert(has);
    ck_assert_int_eq(ghc_media_buckets(1280, 720, true, b, 256), 61);
    ck_assert_int_eq(ghc_media_buckets(1280, 720, true, NULL, 0), 61);
    ck_assert_int_eq(ghc_media_buckets(1280, 720, false, b, 256), 1);
    ck_assert_int_eq(b[0][0], 1280);
    ck_assert_int_eq(ghc_media_buckets(20, 20, true, b, 256), GHC_EINVAL);
    ck_assert_int_eq(ghc_media_buckets(0, 20, false, b, 256), GHC_EINVAL);
}
END_TEST

START_TEST(bucket_choice)
{
    /* expected from musubi-tuner's BucketSelector(resolution=(832, 480), architecture="wan")
     * run in Python (numpy argmin over its sorted list) */
    static const struct { int w, h, bw, bh; } cases[] = {
        { 1920, 1080, 832, 480 }, { 1080, 1920, 480, 832 }, { 832, 480, 832, 480 },
        { 640, 640, 624, 640 }, { 37, 23, 800, 496 }, { 4000, 1000, 1248, 320 },
        { 100, 1000, 304, 1312 }, { 64, 48, 720, 544 },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int32_t bw, bh;
        ck_assert_int_eq(ghc_media_bucket_select(832, 480, true, false, cases[i].w, cases[i].h, &bw, &bh), 0);
        ck_assert_msg(bw == cases[i].bw && bh == cases[i].bh, "%dx%d -> %dx%d, want %dx%d", cases[i].w,
                      cases[i].h, (int)bw, (int)bh, cases[i].bw, cases[i].bh);
    }
    int32_t bw, bh;
    /* without buckets: the resolution whatever the picture */
    ck_assert_int_eq(ghc_media_bucket_select(832, 480, false, true, 37, 23, &bw, &bh), 0);
    ck_assert(bw == 832 && bh == 480);
    /* no upscale: a smaller picture keeps its size floored to 16; a larger one a bucket */
    ck_assert_int_eq(ghc_media_bucket_select(832, 480, true, true, 500, 301, &bw, &bh), 0);
    ck_assert(bw == 496 && bh == 288);
    ck_assert_int_eq(ghc_media_bucket_select(832, 480, true, true, 1920, 1080, &bw, &bh), 0);
    ck_assert(bw == 832 && bh == 480);
    ck_assert_int_eq(ghc_media_bucket_select(832, 480, true, true, 37, 15, &bw, &bh), GHC_EFORMAT);
    /* geometry: scale = max, int(x + 0.5), crop at //2 */
    int32_t rw, rh, l, t;
    ghc_media_fit(1920, 1080, 848, 480, &rw, &rh, &l, &t);
    ck_assert(rw == 853 && rh == 480 && l == 2 && t == 0);
    ghc_media_fit(1920, 1080, 832, 480, &rw, &rh, &l, &t);   /* 832 / 1920 < 480 / 1080 */
    ck_assert(rw == 853 && rh == 480 && l == 10 && t == 0);
    ghc_media_fit(37, 23, 800, 496, &rw, &rh, &l, &t);   /* scale 800/37 = 21.62: 23 * 21.62 = 497.3 */
    ck_assert(rw == 800 && rh == 497 && l == 0 && t == 0);
    ghc_media_fit(40, 16, 32, 16, &rw, &rh, &l, &t);
    ck_assert(rw == 40 && rh == 16 && l == 4 && t == 0);
}
END_TEST

/* ---- settings from a config ----------------------------------------------------------------- */

static ghc_core_t *core_cfg(const char *text, int want_rc)
{
    ghc_core_t *core = ghc_core_init();
    ck_assert_ptr_nonnull(core);
    ghc_log_set_level(core, GHC_LOG_ERROR);
    ck_assert_int_eq(ghc_config_load_string(core, text, "t.cfg", NULL, NULL, 0), 0);
    return core;
}

START_TEST(settings_from_config)
{
    ghc_core_t *core = core_cfg("data = { resolution = [832, 480]; enable_bucket = true; target_frames = [1, 25, 46];\n"
                                "frame_extraction = \"slide\"; frame_stride = 10; max_frames = 81; source_fps = 30.0;\n"
                                "caption_extension = \".caption\"; };", 0);
    struct ghc_media_settings s;
    ck_assert_int_eq(ghc_media_settings_read(ghc_config_section(core, "data"), &s), 0);
    ck_assert(s.width == 832 && s.height == 480 && s.enable_bucket && !s.bucket_no_upscale);
    ck_assert_int_eq(s.n_target_frames, 3);
    ck_assert(s.target_frames[0] == 1 && s.target_frames[1] == 25 && s.target_frames[2] == 45);
    ck_assert_int_eq(s.frame_extraction, GHC_MEDIA_SLIDE);
    ck_assert(s.frame_stride == 10 && s.frame_sample == 1 && s.max_frames == 81);
    ck_assert(s.source_fps == 30.0 && s.target_fps == 16.0);
    ck_assert_str_eq(s.caption_extension, ".caption");
    ck_assert(!s.flip_x && !s.flip_y);
    ghc_core_free(core);
    core = core_cfg("data = { flip_x = true; };", 0);
    ck_assert_int_eq(ghc_media_settings_read(ghc_config_section(core, "data"), &s), 0);
    ck_assert(s.flip_x && !s.flip_y);
    ghc_core_free(core);

    /* defaults: musubi-tuner's */
    core = core_cfg("data = { };", 0);
    ck_assert_int_eq(ghc_media_settings_read(ghc_config_section(core, "data"), &s), 0);
    ck_assert(s.width == 960 && s.height == 544 && !s.enable_bucket && s.n_target_frames == 1 &&
              s.target_frames[0] == 1 && s.frame_extraction == GHC_MEDIA_HEAD && s.max_frames == 129 &&
              s.source_fps == 0.0);
    ck_assert_str_eq(s.caption_extension, ".txt");
    ghc_core_free(core);

    /* uniform with frame_sample 1 is head */
    core = core_cfg("data = { frame_extraction = \"uniform\"; };", 0);
    ck_assert_int_eq(ghc_media_settings_read(ghc_config_section(core, "data"), &s), 0);
    ck_assert_int_eq(s.frame_extraction, GHC_MEDIA_HEAD);
    ghc_core_free(core);

    static const struct { const char *cfg, *msg; } bad[] = {
        { "data = { resolution = [832]; };", "t.cfg:1: data.resolution: expected [width, height], got 1 element" },
        { "data = { resolution = [832, 0]; };", "data.resolution[1] = 0: expected a whole number from 1 to 8192" },
        { "data = { resolution = 832; };", "resolution" },
        { "data = { resolution = [16, 16]; enable_bucket = true; };", "no bucket fits" },
        { "data = { target_frames = [0]; };", "data.target_frames[0] = 0: expected a whole number from 1 to 100000" },
        { "data = { target_frames = []; };", "data.target_frames: expected 1 to 32 frame counts, got 0 elements" },
        { "data = { frame_extraction = \"heads\"; };", "is not one of: head, chunk, slide, uniform, full" },
        { "data = { frame_stride = 0; };", "frame_stride" },
        { "data = { caption_extension = \"\"; };", "data.caption_extension = \"\": expected a file name ending" },
        { "data = { source_fps = -1.0; };", "source_fps" },
        { "data = { flip_y = 1; };", "flip_y" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        core = core_cfg(bad[i].cfg, 0);
        ck_assert_int_eq(ghc_media_settings_read(ghc_config_section(core, "data"), &s), GHC_ECONFIG);
        ck_assert_msg(strstr(ghc_error_message(core), bad[i].msg), "%s: %s", bad[i].cfg, ghc_error_message(core));
        ghc_core_free(core);
    }
}
END_TEST

/* ---- augmentations ---------------------------------------------------------------------------- */

/* Each pixel of each frame lands where the mirror puts it; the frames keep their order. */
START_TEST(flip_frames)
{
    enum { F = 2, H = 3, W = 5 };
    uint8_t px[F * H * W * 3], out[F * H * W * 3], back[F * H * W * 3];
    for (int i = 0; i < F * H * W * 3; i++)
        px[i] = (uint8_t)(i * 37 % 251);
    for (int v = 0; v < 4; v++) {
        bool fx = v & 1, fy = v & 2;
        memset(out, 0, sizeof(out));
        ghc_media_flip(px, F, H, W, fx, fy, out);
        for (int f = 0; f < F; f++)
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++)
                    for (int c = 0; c < 3; c++) {
                        int sy = fy ? H - 1 - y : y, sx = fx ? W - 1 - x : x;
                        ck_assert_int_eq(out[((f * H + y) * W + x) * 3 + c], px[((f * H + sy) * W + sx) * 3 + c]);
                    }
        /* twice: the frames again; and not the frames once, but for the copy */
        ghc_media_flip(out, F, H, W, fx, fy, back);
        ck_assert(memcmp(back, px, sizeof(px)) == 0);
        ck_assert(v == 0 ? memcmp(out, px, sizeof(px)) == 0 : memcmp(out, px, sizeof(px)) != 0);
    }
}
END_TEST

/* ---- the VAE's input -------------------------------------------------------------------------- */

START_TEST(vae_input)
{
    enum { F = 2, H = 3, W = 5 };
    uint8_t px[F * H * W * 3];
    for (int i = 0; i < F * H * W * 3; i++)
        px[i] = (uint8_t)(i * 37 % 256);
    px[0] = 0, px[1] = 255;
    static float out[3 * F * H * W];
    static uint16_t ob[3 * F * H * W];
    ghc_media_to_vae_f32(px, F, H, W, out);
    ghc_media_to_vae_bf16(px, F, H, W, ob);
    for (int f = 0; f < F; f++)
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++)
                for (int c = 0; c < 3; c++) {
                    int v = px[((f * H + y) * W + x) * 3 + c];
                    size_t o = (size_t)((c * F + f) * H + y) * W + x;
                    ck_assert_float_eq_tol(out[o], v / 127.5 - 1.0, 1e-6);
                    /* bf16: within one bf16 step of the exact value, and on the bf16 grid */
                    float b = ghc_bf16_to_f32(ob[o]);
                    ck_assert_float_eq_tol(b, v / 127.5 - 1.0, 1.0 / 128);
                    ck_assert_uint_eq(ghc_f32_to_bf16(b), ob[o]);
                }
    ck_assert_float_eq(out[0], -1.0f);
    ck_assert_float_eq(out[F * H * W], 1.0f);
    ck_assert_float_eq(ghc_bf16_to_f32(ob[0]), -1.0f);
    ck_assert_float_eq(ghc_bf16_to_f32(ob[F * H * W]), 1.0f);
    /* torch 2.11: (torch.arange(256, dtype=uint8).to(bfloat16) / 127.5 - 1).view(int16) gives
     * -16514 for 1, -16804 for 100, 16246 for 250 (the same on the 256 values as here) */
    const uint8_t v[3] = { 1, 100, 250 };
    const int16_t want[3] = { -16514, -16804, 16246 };
    uint16_t o[3];
    ghc_media_to_vae_bf16(v, 1, 1, 1, o);   /* [1, 1, 1, 3] -> [3, 1, 1, 1] */
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq((int16_t)o[i], want[i]);
}
END_TEST

/* ---- scanning ------------------------------------------------------------------------------- */

START_TEST(scan_folder)
{
    char *dir = tu_tmpdir();
    static const unsigned char fake[] = "not decoded by the scan";
    const char *media[] = { "a.mp4", "b.png", "c.jpg", "d.mkv", ".hidden.mp4", "F.MP4", "g.Mp4", "h.webm" };
    for (int i = 0; i < 8; i++)
        write_bytes(dir, media[i], fake, sizeof(fake));
    free(tu_write(dir, "a.txt", " \t hello world\r\nsecond line  \n\n"));
    free(tu_write(dir, "c.txt", "  \n\t \xe3\x80\x80 \n"));   /* spaces and an ideographic space */
    free(tu_write(dir, "d.txt", "caf\xc3\xa9 \xff\xfe bad"));
    free(tu_write(dir, "F.txt", "upper"));
    write_bytes(dir, "i.bmp", fake, sizeof(fake));
    write_bytes(dir, "i.txt", "ab\0cd", 5);
    free(tu_write(dir, "h.caption", "other extension"));
    free(tu_write(dir, "e.txt", "a caption alone"));
    free(tu_write(dir, "notes.md", "not media"));
    ghc_core_t *core = ghc_core_init();
    ghc_media_list_t *l;
    ck_assert_int_eq(ghc_media_scan(core, dir, ".txt", &l), 0);
    ck_assert_int_eq(ghc_media_list_len(l), 7);   /* F.MP4 a.mp4 b.png c.jpg d.mkv h.webm i.bmp */
    const char *order[] = { "F.MP4", "a.mp4", "b.png", "c.jpg", "d.mkv", "h.webm", "i.bmp" };
    for (int i = 0; i < 7; i++)
        ck_assert_str_eq(ghc_media_list_at(l, i)->name, order[i]);
    ck_assert_ptr_null(ghc_media_list_at(l, 7));
    ck_assert_msg(strstr(ghc_media_list_at(l, 6)->bad, "i.bmp: caption i.txt holds a NUL byte (byte 2)"), "%s",
                  ghc_media_list_at(l, 6)->bad);
    const struct ghc_media_item *it = ghc_media_list_at(l, 0);
    ck_assert_int_eq(it->kind, GHC_MEDIA_VIDEO);
    ck_assert_str_eq(it->caption, "upper");
    it = ghc_media_list_at(l, 1);
    ck_assert_str_eq(it->caption, "hello world\nsecond line");
    ck_assert_ptr_null(it->bad);
    char *p = path_in(dir, "a.mp4");
    ck_assert_str_eq(it->path, p);
    free(p);
    it = ghc_media_list_at(l, 2);
    ck_assert_int_eq(it->kind, GHC_MEDIA_IMAGE);
    ck_assert_ptr_null(it->caption);
    ck_assert_msg(strstr(it->bad, "b.png: no caption b.txt"), "%s", it->bad);
    ck_assert_msg(strstr(ghc_media_list_at(l, 3)->bad, "c.jpg: caption c.txt is empty"), "%s", ghc_media_list_at(l, 3)->bad);
    ck_assert_msg(strstr(ghc_media_list_at(l, 4)->bad, "d.mkv: caption d.txt is not valid UTF-8 (byte 6)"), "%s",
                  ghc_media_list_at(l, 4)->bad);
    ck_assert_msg(strstr(ghc_media_list_at(l, 5)->bad, "h.webm: no caption h.txt"), "%s", ghc_media_list_at(l, 5)->bad);
    ck_assert(!strchr(ghc_media_list_at(l, 4)->bad, '\n'));
    ck_assert_int_eq(ghc_media_list_bad(l), 5);
    ghc_media_list_free(l);

    /* another caption extension */
    ck_assert_int_eq(ghc_media_scan(core, dir, ".caption", &l), 0);
    ck_assert_str_eq(ghc_media_list_at(l, 5)->caption, "other extension");
    ck_assert_int_eq(ghc_media_list_bad(l), 6);
    ghc_media_list_free(l);

    /* no folder */
    char *missing = path_in(dir, "missing");
    ck_assert_int_eq(ghc_media_scan(core, missing, ".txt", &l), GHC_ENOTFOUND);
    ck_assert_ptr_null(l);
    ck_assert_msg(strstr(ghc_error_message(core), "missing: cannot read the folder"), "%s", ghc_error_message(core));
    free(missing);
    ghc_core_free(core);

    ck_assert_int_eq(ghc_media_kind_of("x/y.JPEG"), GHC_MEDIA_IMAGE);
    ck_assert_int_eq(ghc_media_kind_of("x.y/z"), GHC_MEDIA_NONE);
    ck_assert_int_eq(ghc_media_kind_of(".mp4"), GHC_MEDIA_NONE);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* musubi-tuner's resize by Pillow and OpenCV (tests/fixtures/make_media_fixtures.py): the same
 * bytes */
static uint8_t media_pixel(int x, int y, int c)
{
    return (uint8_t)((x * 37 + y * 91 + c * 53 + (x * y % 17) * 7 + (x * x % 11) * 3) % 256);
}

START_TEST(resize_fixture)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/tests/fixtures/media/resize.safetensors", tu_env("GHC_TOP_SRCDIR"));
    ghc_core_t *core = ghc_core_init();
    ghc_st_t *st = ghc_st_open(core, path);
    ck_assert_msg(st != NULL, "%s", ghc_error_message(core));
    int n = ghc_st_count(st);
    ck_assert_int_ge(n, 8);
    for (int i = 0; i < n; i++) {
        struct ghc_st_info info;
        ck_assert(ghc_st_info_at(st, i, &info));
        int w, h, bw, bh;
        ck_assert_int_eq(sscanf(info.name, "%dx%d_to_%dx%d", &w, &h, &bw, &bh), 4);
        ck_assert(info.dtype == GHC_DTYPE_U8 && info.ndim == 3 && info.shape[0] == bh && info.shape[1] == bw);
        uint8_t *src = malloc((size_t)w * h * 3), *dst = malloc((size_t)bw * bh * 3);
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++)
                for (int c = 0; c < 3; c++)
                    src[(y * w + x) * 3 + c] = media_pixel(x, y, c);
        ck_assert_int_eq(ghc_media_resize_crop(src, w, h, (ptrdiff_t)w * 3, dst, bw, bh), 0);
        const uint8_t *want = ghc_st_raw(st, info.name);
        for (int k = 0; k < bw * bh * 3; k++)
            ck_assert_msg(dst[k] == want[k], "%s: byte %d (x %d, y %d, channel %d): %d, Pillow/OpenCV %d", info.name, k,
                          k / 3 % bw, k / 3 / bw, k % 3, dst[k], want[k]);
        free(src);
        free(dst);
    }
    ghc_st_free(st);
    ghc_core_free(core);
}
END_TEST

START_TEST(resize_pixels)
{
    /* a crop without scaling: 40x16 -> 32x16 keeps pixels, shifted by (40 - 32) / 2 = 4 */
    uint8_t src[64 * 32 * 3], dst[64 * 32 * 3];
    for (int y = 0; y < 16; y++)
        for (int x = 0; x < 40; x++)
            src[(y * 40 + x) * 3] = (uint8_t)x, src[(y * 40 + x) * 3 + 1] = (uint8_t)y, src[(y * 40 + x) * 3 + 2] = 9;
    ck_assert_int_eq(ghc_media_resize_crop(src, 40, 16, 40 * 3, dst, 32, 16), 0);
    for (int y = 0; y < 16; y++)
        for (int x = 0; x < 32; x++)
            ck_assert(dst[(y * 32 + x) * 3] == x + 4 && dst[(y * 32 + x) * 3 + 1] == y);
    /* halving 64x32 -> 32x16 by area: the mean of each 2x2 block (+-1 for rounding) */
    for (int i = 0; i < 64 * 32 * 3; i++)
        src[i] = (uint8_t)((i * 2654435761u) >> 24);
    ck_assert_int_eq(ghc_media_resize_crop(src, 64, 32, 64 * 3, dst, 32, 16), 0);
    for (int y = 0; y < 16; y++)
        for (int x = 0; x < 32; x++)
            for (int c = 0; c < 3; c++) {
                int s = 0;
                for (int j = 0; j < 2; j++)
                    for (int i = 0; i < 2; i++)
                        s += src[((2 * y + j) * 64 + 2 * x + i) * 3 + c];
                ck_assert_msg(abs(dst[(y * 32 + x) * 3 + c] * 4 - s) <= 4 + 2, "(%d, %d, %d): %d vs mean %g", x, y, c,
                              dst[(y * 32 + x) * 3 + c], s / 4.0);
            }
    /* doubling a linear ramp by Lanczos: the ramp at the new pixel centres, inside the border */
    for (int y = 0; y < 16; y++)
        for (int x = 0; x < 32; x++)
            for (int c = 0; c < 3; c++)
                src[(y * 32 + x) * 3 + c] = (uint8_t)(c == 0 ? 40 + 5 * x : c == 1 ? 30 + 8 * y : 77);
    ck_assert_int_eq(ghc_media_resize_crop(src, 32, 16, 32 * 3, dst, 64, 32), 0);
    for (int y = 6; y < 26; y++)
        for (int x = 6; x < 58; x++) {
            double sx = (x + 0.5) / 2 - 0.5, sy = (y + 0.5) / 2 - 0.5;
            ck_assert_msg(fabs(dst[(y * 64 + x) * 3] - (40 + 5 * sx)) <= 1.5, "R(%d, %d) = %d, want %g", x, y,
                          dst[(y * 64 + x) * 3], 40 + 5 * sx);
            ck_assert_msg(fabs(dst[(y * 64 + x) * 3 + 1] - (30 + 8 * sy)) <= 1.5, "G(%d, %d) = %d", x, y,
                          dst[(y * 64 + x) * 3 + 1]);
            ck_assert_int_eq(dst[(y * 64 + x) * 3 + 2], 77);
        }
    ck_assert_int_eq(ghc_media_resize_crop(src, 0, 16, 0, dst, 64, 32), GHC_EINVAL);
}
END_TEST

#ifdef GHC_HAVE_FFMPEG

/* a read that must succeed; else the decoder's message */
#define READ_OK(d, s, fr) \
    ck_assert_msg(ghc_media_decoder_read((d), (s), (fr)) == 0, "%s", ghc_media_decoder_error(d))

/* a solid colour per frame, far apart from frame to frame */
static void solid(int k, uint8_t c[3])
{
    c[0] = (uint8_t)(16 + 11 * k), c[1] = (uint8_t)(230 - 9 * k), c[2] = (uint8_t)(40 + 7 * (k % 20));
}

static void fill_solid(int k, int w, int h, uint8_t *rgb)
{
    uint8_t c[3];
    solid(k, c);
    for (int i = 0; i < w * h; i++)
        memcpy(rgb + 3 * i, c, 3);
}

/* every pixel of frame `f` of fr is colour c within tol */
static void assert_solid(const struct ghc_media_frames *fr, int64_t f, const uint8_t c[3], int tol, const char *what)
{
    const uint8_t *p = fr->rgb + (size_t)f * fr->width * fr->height * 3;
    for (int i = 0; i < fr->width * fr->height; i++)
        for (int ch = 0; ch < 3; ch++)
            ck_assert_msg(abs(p[3 * i + ch] - c[ch]) <= tol, "%s: frame %lld pixel %d channel %d: %d, want %d +- %d",
                          what, (long long)f, i, ch, p[3 * i + ch], c[ch], tol);
}

/* ---- decoding --------------------------------------------------------------------------------- */

START_TEST(decode_lossless_odd_size)
{
    char *dir = tu_tmpdir();
    char *mkv = path_in(dir, "odd.mkv");
    tu_write_video(mkv, 37, 23, 7, 25, NULL, tu_fill_pattern);
    ghc_media_decoder_t *d = ghc_media_decoder_init(1);
    struct ghc_media_info info;
    ck_assert_int_eq(ghc_media_decoder_open(d, mkv, &info), 0);
    ck_assert(info.width == 37 && info.height == 23 && !info.is_image);
    ck_assert_str_eq(info.codec, "ffv1");
    ck_assert_double_eq_tol(info.fps, 25.0, 1e-9);
    ck_assert_int_ge(info.frames, 6);
    ck_assert_int_le(info.frames, 8);
    struct ghc_media_frames fr;
    READ_OK(d, NULL, &fr);
    ck_assert(fr.width == 37 && fr.height == 23 && fr.frames == 7 && fr.n_clips == 1 && fr.clips[0].frames == 7);
    uint8_t *want = malloc(37 * 23 * 3);
    for (int k = 0; k < 7; k++) {
        tu_fill_pattern(k, 37, 23, want);
        ck_assert_msg(!memcmp(fr.rgb + (size_t)k * 37 * 23 * 3, want, 37 * 23 * 3), "frame %d differs", k);
    }
    /* a second read decodes again (the file is opened anew) */
    READ_OK(d, NULL, &fr);
    ck_assert_int_eq(fr.frames, 7);

    /* at a bucket: 37x23 with resolution 64x48 -> 64x48 area buckets, nearest aspect 1.6087 */
    const int32_t five = 5;
    struct ghc_media_settings s = settings(64, 48, GHC_MEDIA_HEAD, &five, 1);
    int32_t bw, bh;
    ck_assert_int_eq(ghc_media_bucket_select(64, 48, true, false, 37, 23, &bw, &bh), 0);
    READ_OK(d, &s, &fr);
    ck_assert(fr.width == bw && fr.height == bh && fr.src_width == 37 && fr.src_height == 23);
    ck_assert_int_eq(fr.frames, 5);   /* head: only max(target_frames) decoded */
    /* the same frames resized one by one through the public resizer */
    uint8_t *one = malloc((size_t)bw * bh * 3);
    for (int k = 0; k < 5; k++) {
        tu_fill_pattern(k, 37, 23, want);
        ck_assert_int_eq(ghc_media_resize_crop(want, 37, 23, 37 * 3, one, bw, bh), 0);
        ck_assert(!memcmp(fr.rgb + (size_t)k * bw * bh * 3, one, (size_t)bw * bh * 3));
        /* blue is constant per frame: stays exact through the filter */
        ck_assert_int_eq(one[(bh / 2 * bw + bw / 2) * 3 + 2], 20 * k + 3);
    }
    free(one);
    free(want);
    ghc_media_decoder_free(d);
    free(mkv);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(decode_modes_mp4)
{
    char *dir = tu_tmpdir();
    char *mp4 = path_in(dir, "clip.mp4");
    enum { N = 22 };
    tu_write_video(mp4, 64, 48, N, 30, NULL, fill_solid);
    ghc_media_decoder_t *d = ghc_media_decoder_init(0);
    struct ghc_media_info info;
    ck_assert_int_eq(ghc_media_decoder_open(d, mp4, &info), 0);
    ck_assert(info.frames == N && info.frames_exact);
    ck_assert_double_eq_tol(info.fps, 30.0, 1e-6);
    const int32_t t[] = { 5, 9 };
    const int tt[] = { 5, 9 };
    static int want[256][2];
    for (int e = GHC_MEDIA_HEAD; e <= GHC_MEDIA_FULL; e++) {
        struct ghc_media_settings s = settings(64, 48, e, t, 2);
        s.frame_stride = 3;
        s.frame_sample = 3;
        s.max_frames = 14;
        struct ghc_media_frames fr;
        READ_OK(d, &s, &fr);
        ck_assert(fr.width == 64 && fr.height == 48);
        int decoded = e == GHC_MEDIA_HEAD ? 9 : e == GHC_MEDIA_FULL ? 14 : N;
        ck_assert_msg(fr.frames == decoded, "%s: %lld frames decoded", ghc_media_extraction_name(e), (long long)fr.frames);
        int nw = table_clips(e, decoded, tt, 2, 3, 3, 14, want);
        ck_assert_int_eq(fr.n_clips, nw);
        for (int c = 0; c < nw; c++) {
            ck_assert(fr.clips[c].start == want[c][0] && fr.clips[c].frames == want[c][1]);
            /* the clip's frames are the source frames start .. start + len - 1 */
            for (int k = 0; k < fr.clips[c].frames; k += fr.clips[c].frames - 1 > 0 ? fr.clips[c].frames - 1 : 1) {
                uint8_t col[3];
                solid((int)fr.clips[c].start + k, col);
                assert_solid(&fr, fr.clips[c].start + k, col, 6, ghc_media_extraction_name(e));
            }
        }
    }
    /* fps conversion: 30 -> 16 by musubi-tuner's rule, computed here on its own */
    struct ghc_media_settings s = settings(64, 48, GHC_MEDIA_CHUNK, t, 1);
    s.source_fps = 30.0;
    struct ghc_media_frames fr;
    READ_OK(d, &s, &fr);
    int kept[N], nk = 0, prev = -1;
    double acc = 0;
    for (int i = 0; i < N; i++) {
        int ti = (int)acc;
        acc += 16.0 / 30.0;
        if (ti != prev)
            kept[nk++] = i;
        prev = ti;
    }
    ck_assert_int_eq(fr.frames, nk);
    ck_assert_int_eq(nk, 12);
    for (int k = 0; k < nk; k++) {
        uint8_t col[3];
        solid(kept[k], col);
        assert_solid(&fr, k, col, 6, "fps");
    }
    ck_assert_int_eq(fr.n_clips, 2);   /* chunk of 5 in 12 frames: 0, 5 */

    /* too short: 22 frames for 25 and 33 */
    const int32_t long_t[] = { 25, 33 };
    s = settings(64, 48, GHC_MEDIA_HEAD, long_t, 2);
    ck_assert_int_eq(ghc_media_decoder_read(d, &s, &fr), GHC_EFORMAT);
    ck_assert_msg(strstr(ghc_media_decoder_error(d), "clip.mp4: 22 frames, too short for target_frames 25, 33 "
                         "(frame_extraction head)"), "%s", ghc_media_decoder_error(d));
    ck_assert_int_eq(fr.frames, 0);

    /* upscaled to a bucket of 832x480: a solid colour stays itself after Lanczos */
    s = settings(832, 480, GHC_MEDIA_HEAD, t, 1);
    READ_OK(d, &s, &fr);
    ck_assert(fr.width == 720 && fr.height == 544 && fr.frames == 5);   /* aspect 4:3 in 832x480's list */
    uint8_t col[3];
    solid(4, col);
    assert_solid(&fr, 4, col, 6, "upscaled");

    /* truncated: the MP4 index (at the end) is gone */
    FILE *f = fopen(mp4, "rb");
    static unsigned char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    write_bytes(dir, "cut.mp4", buf, n / 2);
    char *cut = path_in(dir, "cut.mp4");
    ck_assert_int_eq(ghc_media_decoder_open(d, cut, NULL), GHC_EFORMAT);
    ck_assert_msg(strstr(ghc_media_decoder_error(d), "cut.mp4: cannot open: "), "%s", ghc_media_decoder_error(d));
    ghc_media_decoder_free(d);
    free(cut);
    free(mp4);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* a variable frame rate: timestamps 0, 10, 50, 60, 200 ... ms. musubi-tuner counts decoded frames
 * (PyAV's decode order), not timestamps: every frame is kept, and the fps conversion goes by
 * the source_fps given, whatever the timestamps say. */
START_TEST(decode_vfr)
{
    char *dir = tu_tmpdir();
    char *mkv = path_in(dir, "vfr.mkv");
    const int64_t pts[] = { 0, 10, 50, 60, 200, 210, 400, 410, 420, 800, 810, 1000, 1500 };
    enum { N = 13 };
    tu_write_video(mkv, 32, 32, N, 25, pts, tu_fill_pattern);
    ghc_media_decoder_t *d = ghc_media_decoder_init(1);
    ck_assert_int_eq(ghc_media_decoder_open(d, mkv, NULL), 0);
    const int32_t t[] = { 13 };
    struct ghc_media_settings s = settings(32, 32, GHC_MEDIA_HEAD, t, 1);
    struct ghc_media_frames fr;
    READ_OK(d, &s, &fr);
    ck_assert_int_eq(fr.frames, N);
    for (int k = 0; k < N; k++)   /* no frame doubled or lost: blue is the frame number */
        ck_assert_int_eq(fr.rgb[(size_t)k * 32 * 32 * 3 + 2], 20 * k + 3);
    ghc_media_decoder_free(d);
    free(mkv);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(decode_images)
{
    char *dir = tu_tmpdir();
    enum { W = 37, H = 23 };
    uint8_t rgba[W * H * 4];
    for (int i = 0; i < W * H; i++) {
        rgba[4 * i + 0] = (uint8_t)(i % 251), rgba[4 * i + 1] = (uint8_t)(i * 7 % 256);
        rgba[4 * i + 2] = (uint8_t)(255 - i % 200), rgba[4 * i + 3] = (uint8_t)(i % 3 ? 0 : 128);
    }
    char *png = path_in(dir, "alpha.PNG");
    tu_write_image(png, W, H, 4, rgba);
    ghc_media_decoder_t *d = ghc_media_decoder_init(1);
    struct ghc_media_info info;
    ck_assert_int_eq(ghc_media_decoder_open(d, png, &info), 0);
    ck_assert(info.is_image && info.frames == 1 && info.width == W && info.height == H);
    struct ghc_media_frames fr;
    READ_OK(d, NULL, &fr);
    ck_assert(fr.frames == 1 && fr.width == W && fr.height == H);
    for (int i = 0; i < W * H; i++)   /* alpha dropped, colour as stored (not composited) */
        ck_assert(fr.rgb[3 * i] == rgba[4 * i] && fr.rgb[3 * i + 1] == rgba[4 * i + 1] &&
                  fr.rgb[3 * i + 2] == rgba[4 * i + 2]);
    /* target_frames do not apply to images: one frame, one clip */
    const int32_t t[] = { 9 };
    struct ghc_media_settings s = settings(832, 480, GHC_MEDIA_CHUNK, t, 1);
    s.enable_bucket = true;
    READ_OK(d, &s, &fr);
    ck_assert(fr.width == 800 && fr.height == 496 && fr.frames == 1 && fr.n_clips == 1 && fr.clips[0].frames == 1);
    /* without buckets, the resolution; with no_upscale, its own size floored to 16 */
    s.enable_bucket = false;
    READ_OK(d, &s, &fr);
    ck_assert(fr.width == 832 && fr.height == 480);
    s.enable_bucket = true;
    s.bucket_no_upscale = true;
    READ_OK(d, &s, &fr);
    ck_assert(fr.width == 32 && fr.height == 16);
    /* crop offsets: 37x23 -> 32x16: scale max(32/37, 16/23) = 0.8649, 32x20 (int(19.9 + 0.5)),
     * top (20 - 16) / 2 = 2 */
    int32_t rw, rh, l, top;
    ghc_media_fit(W, H, 32, 16, &rw, &rh, &l, &top);
    ck_assert(rw == 32 && rh == 20 && l == 0 && top == 2);

    /* JPEG: a solid colour within JPEG's error */
    uint8_t rgb[40 * 30 * 3];
    for (int i = 0; i < 40 * 30; i++)
        rgb[3 * i] = 200, rgb[3 * i + 1] = 120, rgb[3 * i + 2] = 40;
    char *jpg = path_in(dir, "solid.jpg");
    tu_write_image(jpg, 40, 30, 3, rgb);
    ck_assert_int_eq(ghc_media_decoder_open(d, jpg, &info), 0);
    READ_OK(d, NULL, &fr);
    const uint8_t col[3] = { 200, 120, 40 };
    assert_solid(&fr, 0, col, 4, "jpeg");

    /* garbage with a video extension: FFmpeg's reason, the file named */
    static const char junk[] = "this is not a video at all, just text bytes \x01\x02\x03";
    write_bytes(dir, "junk.mp4", junk, sizeof(junk));
    char *bad = path_in(dir, "junk.mp4");
    ck_assert_int_eq(ghc_media_decoder_open(d, bad, NULL), GHC_EFORMAT);
    ck_assert_msg(strstr(ghc_media_decoder_error(d), "junk.mp4: cannot open: Invalid data found when processing input"),
                  "%s", ghc_media_decoder_error(d));
    ck_assert_int_eq(ghc_media_decoder_read(d, NULL, &fr), GHC_EFORMAT);   /* still that file */
    ghc_media_decoder_free(d);
    free(bad);
    free(png);
    free(jpg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* The writer: the same bytes for the same pictures (prepare's hash then sees no change), and
 * one line naming the file for what it cannot write. */
START_TEST(write_media)
{
    char *dir = tu_tmpdir(), *a = path_in(dir, "a.MKV"), *b = path_in(dir, "b.mkv");
    tu_write_video(a, 32, 16, 5, 16, NULL, tu_fill_pattern);
    tu_write_video(b, 32, 16, 5, 16, NULL, tu_fill_pattern);
    char cmd[9000];
    snprintf(cmd, sizeof(cmd), "cmp -s '%s' '%s'", a, b);
    ck_assert_msg(system(cmd) == 0, "two writes of the same frames differ");
    uint8_t px[16 * 32 * 3];
    tu_fill_pattern(2, 32, 16, px);
    free(a);
    free(b);
    a = path_in(dir, "a.png");
    b = path_in(dir, "b.png");
    tu_write_image(a, 32, 16, 3, px);
    tu_write_image(b, 32, 16, 3, px);
    snprintf(cmd, sizeof(cmd), "cmp -s '%s' '%s'", a, b);
    ck_assert_msg(system(cmd) == 0, "two writes of the same picture differ");

    ghc_core_t *core = ghc_core_init();
    ck_assert_int_eq(ghc_media_write_video(core, "x.avi", px, 1, 32, 16, 16, NULL), GHC_EINVAL);
    ck_assert_str_eq(ghc_error_message(core), "media: x.avi: cannot write videos as '.avi' (.mkv: FFV1, .mp4: MPEG-4)");
    ck_assert_int_eq(ghc_media_write_video(core, "x.mp4", px, 1, 31, 16, 16, NULL), GHC_EINVAL);
    ck_assert_msg(strstr(ghc_error_message(core), "x.mp4: MPEG-4 in 4:2:0 needs an even width and height, not 31 x 16"),
                  "%s", ghc_error_message(core));
    ck_assert_int_eq(ghc_media_write_video(core, "x.mkv", px, 0, 32, 16, 16, NULL), GHC_EINVAL);
    ck_assert_int_eq(ghc_media_write_image(core, "x.jpg", px, 8, 8, 4), GHC_EINVAL);
    ck_assert_int_eq(ghc_media_write_image(core, "x.gif", px, 8, 8, 3), GHC_EINVAL);
    ck_assert_str_eq(ghc_error_message(core), "media: x.gif: cannot write images as '.gif' (.png, .jpg)");
    char *nodir = path_in(dir, "no/such.mkv");
    ck_assert_int_eq(ghc_media_write_video(core, nodir, px, 1, 32, 16, 16, NULL), GHC_EIO);
    ck_assert_msg(strstr(ghc_error_message(core), "no/such.mkv: cannot create: No such file or directory"), "%s",
                  ghc_error_message(core));
    free(nodir);
    nodir = path_in(dir, "no/such.png");
    ck_assert_int_eq(ghc_media_write_image(core, nodir, px, 32, 16, 3), GHC_EIO);
    ck_assert_msg(strstr(ghc_error_message(core), "no/such.png: cannot write: No such file or directory"), "%s",
                  ghc_error_message(core));
    ghc_core_free(core);
    free(nodir);
    free(a);
    free(b);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

#else /* !GHC_HAVE_FFMPEG */

START_TEST(no_ffmpeg)
{
    ghc_media_decoder_t *d = ghc_media_decoder_init(1);
    ck_assert_ptr_nonnull(d);
    ck_assert_int_eq(ghc_media_decoder_open(d, "x.mp4", NULL), GHC_EUNSUPPORTED);
    ck_assert_msg(strstr(ghc_media_decoder_error(d), "x.mp4: cannot decode: this gh200core was built without FFmpeg"),
                  "%s", ghc_media_decoder_error(d));
    ghc_media_decoder_free(d);
    /* nor written */
    ghc_core_t *core = ghc_core_init();
    uint8_t px[4 * 4 * 3] = { 0 };
    ck_assert_int_eq(ghc_media_write_image(core, "x.png", px, 4, 4, 3), GHC_EUNSUPPORTED);
    ck_assert_msg(strstr(ghc_error_message(core), "x.png: cannot write: this gh200core was built without FFmpeg"),
                  "%s", ghc_error_message(core));
    ck_assert_int_eq(ghc_media_write_video(core, "x.mkv", px, 1, 4, 4, 16, NULL), GHC_EUNSUPPORTED);
    ghc_core_free(core);
}
END_TEST

#endif

int main(void)
{
    Suite *s = suite_create("media");
    TCase *tc = tcase_create("rules");
    tcase_add_test(tc, clips_table);
    tcase_add_test(tc, bucket_lists);
    tcase_add_test(tc, bucket_choice);
    tcase_add_test(tc, settings_from_config);
    tcase_add_test(tc, vae_input);
    tcase_add_test(tc, flip_frames);
    tcase_add_test(tc, scan_folder);
    tcase_add_test(tc, resize_pixels);
    tcase_add_test(tc, resize_fixture);
    suite_add_tcase(s, tc);
    tc = tcase_create("decode");
    tcase_set_timeout(tc, 60);
#ifdef GHC_HAVE_FFMPEG
    av_log_set_level(AV_LOG_QUIET);   /* the corrupt files' complaints are expected */
    tcase_add_test(tc, decode_lossless_odd_size);
    tcase_add_test(tc, decode_modes_mp4);
    tcase_add_test(tc, decode_vfr);
    tcase_add_test(tc, decode_images);
    tcase_add_test(tc, write_media);
#else
    tcase_add_test(tc, no_ffmpeg);
#endif
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
