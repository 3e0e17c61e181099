/* test_prepare.c: `gh200core prepare` (doc/prepare.md) through the CLI, with the `wanvae` and
 * `umt5` plugins at small random sizes, on media written at test time (tests/media_write.h): a
 * video and an image with captions become clips of latents and text embeddings of the right
 * shapes; the last line's times (encoding, waiting for decoding, loading) add up; a second run
 * encodes nothing; an edited caption re-encodes that file only; a removed clip length removes
 * its files; a lost manifest (a killed run) re-encodes; a corrupt
 * file stops the run naming it, or is skipped with skip_bad_samples; a training run then reads
 * the caches (and runs prepare first itself). musubi_cache: musubi-tuner's files beside ours
 * (names, keys, metadata, the same bytes), kept by the manifest, read once beside ours and
 * read alone as musubi-tuner's. flip_x / flip_y: each clip also encoded mirrored, the same bits
 * as the encoding of a mirrored file written here, the text cache linked, kept and removed by
 * the manifest, the samples served twice (four times). random_crop: a crop of the picture at a
 * seeded corner, not the centre's. refresh_each_epoch: other latents each epoch for the
 * augmented samples, the same for the others, the same losses run to run; disable_cache:
 * nothing of the augmented clips written, training runs. Without FFmpeg: that prepare says so. */
#include <config.h>

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <gh200core/gh200core.h>
#include <gh200core/dataset.h>
#include <gh200core/run.h>
#include <gh200core/safetensors.h>

#include "testutil.h"
#include "media_write.h"

static const char cfg_text[] =
    "seed = 1;\n"
    "output_dir = \"out\";\n"
    "vae = { plugin = \"wanvae\"; random = { base_dim = 4; }; };\n"
    "text_encoder = { plugin = \"umt5\"; random = { d_model = 32; }; };\n"
    "mempolicy = { plugin = \"host\"; };\n"
    "model = { plugin = \"wan22\"; dtype = \"f32\"; device = -1; checkpointing = \"off\";\n"
    "  random = { dim = 32; ffn_dim = 64; heads = 2; layers = 1; in_channels = 16; out_channels = 16;\n"
    "             text_dim = 32; freq_dim = 32; experts = 1; seed = 3; }; };\n"
    "network = { plugin = \"lycoris\"; algo = \"lora\"; rank = 2; alpha = 2.0; };\n"
    "optimizer = { plugin = \"adamw\"; lr = 1e-3; };\n"
    "scheduler = { plugin = \"constant\"; };\n"
    "train = { steps = 3; save_every = 0; };\n"
    "data = { datasets = ( { path = \"clips\"; resolution = [48, 32]; target_frames = [1, 5]; } ); };\n";

/* Run the CLI in dir with `args`; the exit status, the output in *out (caller frees). */
static int cli(const char *dir, char **out, const char *args)
{
    char cmd[8192];
    snprintf(cmd, sizeof(cmd), "cd '%s' && GHC_PLUGIN_PATH='%s' '%s' %s", dir, tu_env("GHC_BUILD_PLUGINS"),
             tu_env("GHC_CLI"), args);
    return tu_run(cmd, out);
}

/* The shape of tensor `name` in dir/file as "[a, b, ...] DTYPE", or "absent". */
static const char *shape_of(const char *dir, const char *file, const char *name)
{
    char path[4300];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    return tu_st_shape(path, name);
}

static bool exists(const char *dir, const char *file)
{
    char path[4300];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    return stat(path, &st) == 0;
}

/* Metadata `key` of dir/file, or "absent" (a static buffer). */
static const char *meta_of(const char *dir, const char *file, const char *key)
{
    static char buf[256];
    char path[4300];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    ghc_core_t *core = ghc_core_init();
    ghc_st_t *st = ghc_st_open(core, path);
    const char *v = st ? ghc_st_metadata(st, key) : NULL;
    snprintf(buf, sizeof(buf), "%s", v ? v : "absent");
    ghc_st_free(st);
    ghc_core_free(core);
    return buf;
}

/* Whether tensor k1 of dir/f1 and k2 of dir/f2 hold the same bytes (and dtype and shape). */
static bool same_tensor(const char *dir, const char *f1, const char *k1, const char *f2, const char *k2)
{
    char p1[4300], p2[4300];
    snprintf(p1, sizeof(p1), "%s/%s", dir, f1);
    snprintf(p2, sizeof(p2), "%s/%s", dir, f2);
    ghc_core_t *core = ghc_core_init();
    ghc_st_t *a = ghc_st_open(core, p1), *b = ghc_st_open(core, p2);
    struct ghc_st_info x, y;
    bool same = a && b && ghc_st_find(a, k1, &x) && ghc_st_find(b, k2, &y) && x.dtype == y.dtype &&
                x.ndim == y.ndim && x.nbytes == y.nbytes && x.nbytes > 0 &&
                memcmp(x.shape, y.shape, (size_t)x.ndim * sizeof(*x.shape)) == 0 &&
                memcmp(ghc_st_raw(a, k1), ghc_st_raw(b, k2), (size_t)x.nbytes) == 0;
    ghc_st_free(a);
    ghc_st_free(b);
    ghc_core_free(core);
    return same;
}

/* The inode of dir/file (a rewrite renames a new file into place), or 0. */
static unsigned long long inode_of(const char *dir, const char *file)
{
    char path[4300];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    return stat(path, &st) == 0 ? (unsigned long long)st.st_ino : 0;
}

#ifdef GHC_HAVE_FFMPEG

/* The last line's times (doc/prepare.md, "Progress"): "in T s (encoding E s, waiting for decoding
 * W s, loading the encoders L s)", each >= 0 and E + W + L <= T (each printed to 0.1 s: up to
 * 0.2 s of rounding); the files' own lines, "encoded in X s" (to 0.01 s), add up to E + W + L. */
static void check_times(const char *out)
{
    const char *line = strstr(out, " skipped as bad, in ");
    double t, e, w, l, files = 0;
    int n = 0;
    ck_assert_msg(line && sscanf(line, " skipped as bad, in %lf s (encoding %lf s, waiting for decoding %lf s, "
                                       "loading the encoders %lf s)", &t, &e, &w, &l) == 4, "no times in:\n%s", out);
    ck_assert_msg(e >= 0 && w >= 0 && l >= 0 && e + w + l <= t + 0.2 + 1e-9, "times %g %g %g of %g in:\n%s", e, w, l, t,
                  out);
    for (const char *at = out; (at = strstr(at, ": encoded in ")); at++, n++) {
        double x;
        ck_assert_int_eq(sscanf(at, ": encoded in %lf s", &x), 1);
        files += x;
    }
    double d = files - (e + w + l);
    ck_assert_msg(n > 0 && (d < 0 ? -d : d) <= 0.15 + 0.005 * n + 1e-9, "the %d files' times add up to %g, not %g + %g "
                  "+ %g, in:\n%s", n, files, e, w, l, out);
}

/* In folder clips, at the bucket's size (48 x 32): a.mkv, 9 frames of the test pattern, and
 * b.png, its frame 3, with their captions. */
static void write_ab(const char *clips)
{
    char path[4300];
    snprintf(path, sizeof(path), "%s/a.mkv", clips);
    tu_write_video(path, 48, 32, 9, 16, NULL, tu_fill_pattern);
    uint8_t px[32 * 48 * 3];
    tu_fill_pattern(3, 48, 32, px);
    snprintf(path, sizeof(path), "%s/b.png", clips);
    tu_write_image(path, 48, 32, 3, px);
    free(tu_write(clips, "a.txt", "a red ball\n"));
    free(tu_write(clips, "b.txt", "a blue cube"));
}

START_TEST(prepare_media_to_caches)
{
    char *dir = tu_tmpdir(), clips[4200], path[4300], *out;
    snprintf(clips, sizeof(clips), "%s/clips", dir);
    ck_assert_int_eq(mkdir(clips, 0755), 0);
    free(tu_write(dir, "train.cfg", cfg_text));
    write_ab(clips);

    /* first run: a.mkv's clips of 1 and 5 frames (head), b.png's image */
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg") == 0, "%s", out);
    ck_assert_msg(strstr(out, "prepare: 2 media files: 2 encoded (3 clips), 0 up to date, 0 skipped as bad"), "%s", out);
    check_times(out);
    free(out);
    ck_assert_str_eq(shape_of(clips, "a_00000-005.latent.safetensors", "latent"), "[16, 2, 4, 6] BF16");
    ck_assert_str_eq(shape_of(clips, "a_00000-001.latent.safetensors", "latent"), "[16, 1, 4, 6] BF16");
    ck_assert_str_eq(shape_of(clips, "b.latent.safetensors", "latent"), "[16, 1, 4, 6] BF16");
    /* the byte ids of "a red ball" and the end of text */
    ck_assert_str_eq(shape_of(clips, "a_00000-005.text.safetensors", "text_embed"), "[11, 32] BF16");
    ck_assert_str_eq(shape_of(clips, ".gh200core-empty-prompt.safetensors", "text_embed"), "[1, 32] BF16");
    ck_assert(exists(clips, ".a.mkv.prepare.json") && exists(clips, ".b.png.prepare.json"));

    /* nothing changed: nothing encoded */
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg") == 0, "%s", out);
    ck_assert_msg(strstr(out, "2 media files: 0 encoded (0 clips), 2 up to date"), "%s", out);
    /* only the files encoded count: none */
    ck_assert_msg(strstr(out, "(encoding 0.0 s, waiting for decoding 0.0 s, loading the encoders 0.0 s)"), "%s", out);
    free(out);
    /* an edited caption: that file again */
    free(tu_write(clips, "b.txt", "a blue cube on a table"));
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg") == 0, "%s", out);
    ck_assert_msg(strstr(out, "2 media files: 1 encoded (1 clips), 1 up to date"), "%s", out);
    free(out);
    ck_assert_str_eq(shape_of(clips, "b.text.safetensors", "text_embed"), "[23, 32] BF16");
    /* a killed run leaves no manifest for the file it was on: encoded again */
    snprintf(path, sizeof(path), "%s/.a.mkv.prepare.json", clips);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg") == 0, "%s", out);
    ck_assert_msg(strstr(out, "2 media files: 1 encoded (2 clips), 1 up to date"), "%s", out);
    free(out);
    /* a clip length dropped: its files go */
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg --set 'data.datasets=( { path = \"clips\"; "
                                 "resolution = [48, 32]; target_frames = [1]; } )'") == 0, "%s", out);
    ck_assert_msg(strstr(out, "a_00000-005.latent.safetensors (no longer made by these settings)"), "%s", out);
    free(out);
    ck_assert(!exists(clips, "a_00000-005.latent.safetensors") && exists(clips, "a_00000-001.latent.safetensors"));

    /* training reads the caches (prepare finds them up to date first) */
    ck_assert_msg(cli(dir, &out, "-c train.cfg") == 0, "%s", out);
    ck_assert_msg(strstr(out, "up to date") && strstr(out, "train: done: 3 steps"), "%s", out);
    free(out);

    /* a corrupt file stops prepare naming it; skip_bad_samples skips it */
    free(tu_write(clips, "c.mp4", "not a video at all"));
    free(tu_write(clips, "c.txt", "broken"));
    ck_assert_int_eq(cli(dir, &out, "prepare -c train.cfg"), 5);
    ck_assert_msg(strstr(out, "c.mp4") && strstr(out, "skip_bad_samples"), "%s", out);
    free(out);
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg --set data.skip_bad_samples=true") == 0, "%s", out);
    ck_assert_msg(strstr(out, "3 media files: 0 encoded (0 clips), 2 up to date, 1 skipped as bad"), "%s", out);
    free(out);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* `gh200core prepare` outside a training run: the encoders allocate through the configured
 * memory policy (a GPU encoder needs one for device memory): a host policy limited to 1 MiB
 * stops the run with its own error naming the encoders' roles, and nothing is served (no
 * manifest). */
START_TEST(prepare_memory_policy)
{
    char *dir = tu_tmpdir(), clips[4200], *out;
    snprintf(clips, sizeof(clips), "%s/clips", dir);
    ck_assert_int_eq(mkdir(clips, 0755), 0);
    free(tu_write(dir, "train.cfg", cfg_text));
    write_ab(clips);
    ck_assert_int_ne(cli(dir, &out, "prepare -c train.cfg --set mempolicy.limit_mib=1"), 0);
    ck_assert_msg(strstr(out, "would exceed limit_mib") && strstr(out, "encoder_"), "%s", out);
    free(out);
    ck_assert(!exists(clips, ".a.mkv.prepare.json") && !exists(clips, ".b.png.prepare.json"));
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* Files read ahead on several threads (GHC_PREPARE_AHEAD) give the bytes of two: the same
 * caches, encoded and logged in the folder's order. */
static uint64_t file_hash(const char *dir, const char *name)
{
    char path[4300];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f, "%s", path);
    uint64_t h = 1469598103934665603ull;
    int c;
    while ((c = fgetc(f)) != EOF)
        h = (h ^ (uint64_t)c) * 1099511628211ull;
    fclose(f);
    return h;
}

START_TEST(prepare_read_ahead)
{
    char *dir = tu_tmpdir(), clips[4200], path[4300], *out;
    snprintf(clips, sizeof(clips), "%s/clips", dir);
    ck_assert_int_eq(mkdir(clips, 0755), 0);
    free(tu_write(dir, "train.cfg", cfg_text));
    const int n = 7;
    for (int k = 0; k < n; k++) {   /* videos and images, alternately */
        char cap[64];
        if (k % 2 == 0) {
            snprintf(path, sizeof(path), "%s/m%d.mkv", clips, k);
            tu_write_video(path, 48, 32, 5 + k, 16, NULL, tu_fill_pattern);
        } else {
            uint8_t px[32 * 48 * 3];
            tu_fill_pattern(k, 48, 32, px);
            snprintf(path, sizeof(path), "%s/m%d.png", clips, k);
            tu_write_image(path, 48, 32, 3, px);
        }
        snprintf(path, sizeof(path), "m%d.txt", k);
        snprintf(cap, sizeof(cap), "caption number %d", k);
        free(tu_write(clips, path, cap));
    }
    uint64_t h[2][2 * 7];
    for (int pass = 0; pass < 2; pass++) {
        char args[256];
        snprintf(args, sizeof(args), "prepare -c train.cfg --set data.prepare='\"always\"'");
        setenv("GHC_PREPARE_AHEAD", pass ? "2" : "5", 1);
        ck_assert_msg(cli(dir, &out, args) == 0, "%s", out);
        unsetenv("GHC_PREPARE_AHEAD");
        ck_assert_msg(strstr(out, "7 media files: 7 encoded"), "%s", out);
        check_times(out);
        const char *at = out;
        for (int k = 0; k < n; k++) {   /* [k+1/7] m<k>: the folder's order */
            char want[64];
            snprintf(want, sizeof(want), "[%d/%d] m%d.%s: encoded", k + 1, n, k, k % 2 ? "png" : "mkv");
            const char *f = strstr(at, want);
            ck_assert_msg(f, "no '%s' after the lines before it in:\n%s", want, out);
            at = f;
        }
        free(out);
        for (int k = 0; k < n; k++) {
            char lat[64], txt[64];
            snprintf(lat, sizeof(lat), k % 2 ? "m%d.latent.safetensors" : "m%d_00000-005.latent.safetensors", k);
            snprintf(txt, sizeof(txt), k % 2 ? "m%d.text.safetensors" : "m%d_00000-005.text.safetensors", k);
            h[pass][2 * k] = file_hash(clips, lat);
            h[pass][2 * k + 1] = file_hash(clips, txt);
        }
    }
    for (int i = 0; i < 2 * n; i++)
        ck_assert_msg(h[0][i] == h[1][i], "file %d differs between 5 and 2 files read ahead", i);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

#define MUSUBI_SET(frames) "--set 'data.datasets=( { path = \"clips\"; resolution = [48, 32]; " \
                           "target_frames = " frames "; musubi_cache = true; } )'"

/* musubi_cache: musubi-tuner's files beside ours from the same encodings, kept up to date by
 * the manifest; training reads each sample once, and reads musubi's files alone. */
START_TEST(prepare_musubi_layout)
{
    char *dir = tu_tmpdir(), clips[4200], mus[4200], path[4300], cmd[9000], *out;
    snprintf(clips, sizeof(clips), "%s/clips", dir);
    snprintf(mus, sizeof(mus), "%s/mus", dir);
    ck_assert_int_eq(mkdir(clips, 0755), 0);
    free(tu_write(dir, "train.cfg", cfg_text));
    snprintf(path, sizeof(path), "%s/a.mkv", clips);
    tu_write_video(path, 48, 32, 9, 16, NULL, tu_fill_pattern);
    uint8_t px[64 * 96 * 3];   /* resized to the 48 x 32 bucket; musubi's names keep 96 x 64 */
    tu_fill_pattern(3, 96, 64, px);
    snprintf(path, sizeof(path), "%s/b.png", clips);
    tu_write_image(path, 96, 64, 3, px);
    free(tu_write(clips, "a.txt", "a red ball\n"));
    free(tu_write(clips, "b.txt", "a blue cube"));

    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg " MUSUBI_SET("[1, 5]")) == 0, "%s", out);
    ck_assert_msg(strstr(out, "2 media files: 2 encoded (3 clips)"), "%s", out);
    free(out);
    /* names, keys, shapes, dtypes */
    ck_assert_str_eq(shape_of(clips, "a_00000-005_0048x0032_wan.safetensors", "latents_2x4x6_bfloat16"),
                     "[16, 2, 4, 6] BF16");
    ck_assert_str_eq(shape_of(clips, "a_00000-001_0048x0032_wan.safetensors", "latents_1x4x6_bfloat16"),
                     "[16, 1, 4, 6] BF16");
    ck_assert_str_eq(shape_of(clips, "b_0096x0064_wan.safetensors", "latents_1x4x6_bfloat16"), "[16, 1, 4, 6] BF16");
    ck_assert_str_eq(shape_of(clips, "a_wan_te.safetensors", "varlen_t5_bfloat16"), "[11, 32] BF16");
    ck_assert_str_eq(shape_of(clips, "b_wan_te.safetensors", "varlen_t5_bfloat16"), "[12, 32] BF16");
    ck_assert(!exists(clips, "a_00000-005_wan_te.safetensors"));   /* one text cache per media file */
    /* metadata */
    ck_assert_str_eq(meta_of(clips, "a_00000-005_0048x0032_wan.safetensors", "architecture"), "wan");
    ck_assert_str_eq(meta_of(clips, "a_00000-005_0048x0032_wan.safetensors", "format_version"), "1.0.1");
    ck_assert_str_eq(meta_of(clips, "a_00000-005_0048x0032_wan.safetensors", "frame_count"), "5");
    ck_assert_str_eq(meta_of(clips, "a_00000-001_0048x0032_wan.safetensors", "frame_count"), "1");
    ck_assert_str_eq(meta_of(clips, "b_0096x0064_wan.safetensors", "width"), "96");
    ck_assert_str_eq(meta_of(clips, "b_0096x0064_wan.safetensors", "height"), "64");
    ck_assert_str_eq(meta_of(clips, "b_0096x0064_wan.safetensors", "frame_count"), "absent");
    ck_assert_str_eq(meta_of(clips, "a_wan_te.safetensors", "architecture"), "wan");
    ck_assert_str_eq(meta_of(clips, "a_wan_te.safetensors", "caption1"), "a red ball");
    ck_assert_str_eq(meta_of(clips, "a_wan_te.safetensors", "format_version"), "1.0.1");
    /* the same encodings, bit for bit */
    ck_assert(same_tensor(clips, "a_00000-005.latent.safetensors", "latent", "a_00000-005_0048x0032_wan.safetensors",
                          "latents_2x4x6_bfloat16"));
    ck_assert(same_tensor(clips, "b.latent.safetensors", "latent", "b_0096x0064_wan.safetensors",
                          "latents_1x4x6_bfloat16"));
    ck_assert(same_tensor(clips, "a_00000-001.text.safetensors", "text_embed", "a_wan_te.safetensors",
                          "varlen_t5_bfloat16"));
    ck_assert(same_tensor(clips, "b.text.safetensors", "text_embed", "b_wan_te.safetensors", "varlen_t5_bfloat16"));

    /* a second run writes nothing */
    unsigned long long ino_a = inode_of(clips, "a_wan_te.safetensors"), ino_b = inode_of(clips, "b_wan_te.safetensors");
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg " MUSUBI_SET("[1, 5]")) == 0, "%s", out);
    ck_assert_msg(strstr(out, "2 media files: 0 encoded (0 clips), 2 up to date"), "%s", out);
    free(out);
    ck_assert(ino_a && inode_of(clips, "a_wan_te.safetensors") == ino_a && inode_of(clips, "b_wan_te.safetensors") == ino_b);
    /* an edited caption rewrites that file's text cache, and only that file's */
    free(tu_write(clips, "b.txt", "a blue cube on a table"));
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg " MUSUBI_SET("[1, 5]")) == 0, "%s", out);
    ck_assert_msg(strstr(out, "2 media files: 1 encoded (1 clips), 1 up to date"), "%s", out);
    free(out);
    ck_assert_str_eq(shape_of(clips, "b_wan_te.safetensors", "varlen_t5_bfloat16"), "[23, 32] BF16");
    ck_assert_str_eq(meta_of(clips, "b_wan_te.safetensors", "caption1"), "a blue cube on a table");
    ck_assert(inode_of(clips, "a_wan_te.safetensors") == ino_a);
    /* a clip length dropped: musubi's file of it goes too */
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg " MUSUBI_SET("[1]")) == 0, "%s", out);
    ck_assert_msg(strstr(out, "a_00000-005_0048x0032_wan.safetensors (no longer made"), "%s", out);
    free(out);
    ck_assert(!exists(clips, "a_00000-005_0048x0032_wan.safetensors") &&
              exists(clips, "a_00000-001_0048x0032_wan.safetensors"));

    /* both layouts in one folder: each sample once, the gh200core file */
    ck_assert_msg(cli(dir, &out, "-c train.cfg " MUSUBI_SET("[1]")) == 0, "%s", out);
    ck_assert_msg(strstr(out, "2 musubi-tuner latents not read") && strstr(out, "): 2 samples, gh200core format\n") &&
                  strstr(out, "train: done: 3 steps"), "%s", out);
    free(out);

    /* musubi's files alone, in a folder without media: read as musubi-tuner's caches */
    ck_assert_int_eq(mkdir(mus, 0755), 0);
    snprintf(cmd, sizeof(cmd), "cp '%s'/*_wan.safetensors '%s'/*_wan_te.safetensors '%s'/", clips, clips, mus);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_msg(cli(dir, &out, "-c train.cfg --set output_dir=\"out2\" --set 'data.datasets=( { path = \"mus\"; } )'") == 0, "%s", out);
    ck_assert_msg(strstr(out, "): 2 samples, musubi-tuner cache\n") && strstr(out, "train: done: 3 steps"), "%s", out);
    free(out);
    /* musubi_cache turned off: its files go */
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg") == 0, "%s", out);
    ck_assert_msg(strstr(out, "2 media files: 2 encoded"), "%s", out);
    free(out);
    ck_assert(!exists(clips, "a_wan_te.safetensors") && !exists(clips, "b_0096x0064_wan.safetensors") &&
              exists(clips, "b.latent.safetensors"));
    tu_rm_rf(dir);
    free(dir);
}
END_TEST


/* The test pattern mirrored by its formula (not by the code under test): left-right with fx,
 * upside down with fy. */
static void fill_flipped(int k, int w, int h, uint8_t *rgb, bool fx, bool fy)
{
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *p = rgb + ((size_t)y * w + x) * 3;
            int sx = fx ? w - 1 - x : x, sy = fy ? h - 1 - y : y;
            p[0] = (uint8_t)(6 * sx), p[1] = (uint8_t)(10 * sy), p[2] = (uint8_t)(20 * k + 3);
        }
}

static void fill_x(int k, int w, int h, uint8_t *rgb) { fill_flipped(k, w, h, rgb, true, false); }

#define FLIP_SET(flips) "--set 'data.datasets=( { path = \"clips\"; resolution = [48, 32]; " \
                        "target_frames = [1, 5]; " flips " } )'"

/* flip_x / flip_y: the flipped clips are the encodings of the mirrored media, each with its
 * clip's text; made once, removed when turned off; the dataset serves them all. */
START_TEST(prepare_flips)
{
    char *dir = tu_tmpdir(), clips[4200], mirror[4200], path[4300], *out;
    snprintf(clips, sizeof(clips), "%s/clips", dir);
    snprintf(mirror, sizeof(mirror), "%s/mirror", dir);
    ck_assert_int_eq(mkdir(clips, 0755), 0);
    ck_assert_int_eq(mkdir(mirror, 0755), 0);
    free(tu_write(dir, "train.cfg", cfg_text));
    /* at the bucket's size: the flip after the resize is the flip of the file */
    write_ab(clips);
    snprintf(path, sizeof(path), "%s/ax.mkv", mirror);
    tu_write_video(path, 48, 32, 9, 16, NULL, fill_x);
    free(tu_write(mirror, "ax.txt", "a red ball"));
    static const char *const mirrored[] = { "bx", "by", "bxy" }, *const ours[] = { "b_flipx", "b_flipy", "b_flipxy" };
    uint8_t px[32 * 48 * 3];
    for (int v = 1; v < 4; v++) {
        fill_flipped(3, 48, 32, px, v & 1, v & 2);
        snprintf(path, sizeof(path), "%s/%s.png", mirror, mirrored[v - 1]);
        tu_write_image(path, 48, 32, 3, px);
        snprintf(path, sizeof(path), "%s.txt", mirrored[v - 1]);
        free(tu_write(mirror, path, "a blue cube"));
    }

    /* plain first, then flip_x turned on: every clip also mirrored */
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg") == 0, "%s", out);
    free(out);
    ck_assert(!exists(clips, "b_flipx.latent.safetensors"));
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg " FLIP_SET("flip_x = true;")) == 0, "%s", out);
    ck_assert_msg(strstr(out, "2 media files: 2 encoded (6 clips), 0 up to date"), "%s", out);
    free(out);
    ck_assert(exists(clips, "a_00000-001_flipx.latent.safetensors") && !exists(clips, "b_flipy.latent.safetensors"));
    /* its text: the clip's own file, linked */
    ck_assert(same_tensor(clips, "a_00000-005_flipx.text.safetensors", "text_embed", "a_00000-005.text.safetensors",
                          "text_embed"));
    ck_assert(inode_of(clips, "b_flipx.text.safetensors") == inode_of(clips, "b.text.safetensors"));
    /* a second run encodes nothing */
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg " FLIP_SET("flip_x = true;")) == 0, "%s", out);
    ck_assert_msg(strstr(out, "2 media files: 0 encoded (0 clips), 2 up to date"), "%s", out);
    free(out);
    /* the dataset serves each clip twice, each with its text */
    ck_assert_msg(cli(dir, &out, "-c train.cfg " FLIP_SET("flip_x = true;")) == 0, "%s", out);
    ck_assert_msg(strstr(out, "): 6 samples, gh200core format\n") && strstr(out, "train: done: 3 steps"), "%s", out);
    free(out);

    /* both: ai-toolkit's four copies (none, x, y, x and y) */
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg " FLIP_SET("flip_x = true; flip_y = true;")) == 0, "%s", out);
    ck_assert_msg(strstr(out, "2 media files: 2 encoded (12 clips)"), "%s", out);
    free(out);
    /* the mirrored files, encoded as they are: the same bits */
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg --set 'data.datasets=( { path = \"mirror\"; "
                                 "resolution = [48, 32]; target_frames = [1, 5]; } )'") == 0, "%s", out);
    free(out);
    for (int v = 0; v < 3; v++) {
        char f1[128], f2[128];
        snprintf(f1, sizeof(f1), "%s.latent.safetensors", ours[v]);
        snprintf(f2, sizeof(f2), "../mirror/%s.latent.safetensors", mirrored[v]);
        ck_assert_msg(same_tensor(clips, f1, "latent", f2, "latent"), "%s vs %s", f1, f2);
        ck_assert_msg(!same_tensor(clips, "b.latent.safetensors", "latent", f1, "latent"), "%s", f1);
    }
    ck_assert(same_tensor(mirror, "../clips/a_00000-005_flipx.latent.safetensors", "latent",
                          "ax_00000-005.latent.safetensors", "latent"));
    ck_assert(same_tensor(mirror, "../clips/a_00000-001_flipx.latent.safetensors", "latent",
                          "ax_00000-001.latent.safetensors", "latent"));
    ck_assert_msg(cli(dir, &out, "-c train.cfg --set output_dir=\"out2\" " FLIP_SET("flip_x = true; flip_y = true;")) == 0,
                  "%s", out);
    ck_assert_msg(strstr(out, "): 12 samples, gh200core format\n"), "%s", out);
    free(out);
    /* musubi-tuner's layout has no flips */
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg " FLIP_SET("flip_x = true; musubi_cache = true;")) == 0, "%s", out);
    free(out);
    ck_assert(exists(clips, "b_0048x0032_wan.safetensors") && exists(clips, "b_flipx.latent.safetensors") &&
              !exists(clips, "b_flipx_0048x0032_wan.safetensors") && !exists(clips, "b_flipy.latent.safetensors"));

    /* turned off: the flipped files go */
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg") == 0, "%s", out);
    ck_assert_msg(strstr(out, "b_flipx.latent.safetensors (no longer made"), "%s", out);
    free(out);
    static const char *const gone[] = { "a_00000-005_flipx.latent.safetensors", "a_00000-001_flipx.text.safetensors",
                                        "b_flipx.latent.safetensors", "b_flipx.text.safetensors", NULL };
    for (int i = 0; gone[i]; i++)
        ck_assert_msg(!exists(clips, gone[i]), "%s", gone[i]);
    ck_assert(exists(clips, "b.latent.safetensors") && exists(clips, "b.text.safetensors"));
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* ---- random_crop and the three cache modes ------------------------------------------------- */

/* In folder `dir`: w.png, a 64 x 32 picture (wider than the 48 x 32 bucket: its crop's corner
 * goes from 0 to 16) and v.mkv, 9 frames of 64 x 32, with captions. */
static void write_wide(const char *dir)
{
    char path[4300];
    uint8_t px[32 * 64 * 3];
    tu_fill_pattern(3, 64, 32, px);
    snprintf(path, sizeof(path), "%s/w.png", dir);
    tu_write_image(path, 64, 32, 3, px);
    snprintf(path, sizeof(path), "%s/v.mkv", dir);
    tu_write_video(path, 64, 32, 9, 16, NULL, tu_fill_pattern);
    free(tu_write(dir, "w.txt", "a wide picture"));
    free(tu_write(dir, "v.txt", "a wide video"));
}

/* A test's folder (returned; the caller frees it) with train.cfg and two empty folders, their
 * paths in a and b (4200 bytes each). */
static char *two_folders(const char *an, char *a, const char *bn, char *b)
{
    char *dir = tu_tmpdir();
    snprintf(a, 4200, "%s/%s", dir, an);
    snprintf(b, 4200, "%s/%s", dir, bn);
    ck_assert(mkdir(a, 0755) == 0 && mkdir(b, 0755) == 0);
    free(tu_write(dir, "train.cfg", cfg_text));
    return dir;
}

#define CROP_SET(extra) "--set 'data.datasets=( { path = \"clips\"; resolution = [48, 32]; target_frames = [1]; " \
                        "random_crop = true; " extra " } )'"

/* static random_crop: the crop of a picture at a corner drawn by the seed (not the centre),
 * the same corner from the same seed, another from another; a second prepare encodes nothing. */
START_TEST(prepare_random_crop)
{
    char clips[4200], crops[4200], path[4300], *out, *dir = two_folders("clips", clips, "crops", crops);
    write_wide(clips);
    /* every crop of w.png the bucket can take, as pictures of their own */
    uint8_t px[32 * 64 * 3], crop[32 * 48 * 3];
    tu_fill_pattern(3, 64, 32, px);
    for (int l = 0; l <= 16; l++) {
        for (int y = 0; y < 32; y++)
            memcpy(crop + y * 48 * 3, px + (y * 64 + l) * 3, 48 * 3);
        snprintf(path, sizeof(path), "%s/c%02d.png", crops, l);
        tu_write_image(path, 48, 32, 3, crop);
        snprintf(path, sizeof(path), "c%02d.txt", l);
        free(tu_write(crops, path, "a wide picture"));
    }
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg --set 'data.datasets=( { path = \"crops\"; "
                                 "resolution = [48, 32]; target_frames = [1]; } )'") == 0, "%s", out);
    free(out);

    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg " CROP_SET("")) == 0, "%s", out);
    ck_assert_msg(strstr(out, "2 media files: 2 encoded (2 clips)"), "%s", out);
    free(out);
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg " CROP_SET("")) == 0, "%s", out);
    ck_assert_msg(strstr(out, "2 media files: 0 encoded (0 clips), 2 up to date"), "%s", out);
    free(out);
    /* w's latent is the encoding of exactly one crop, not the centre's (corner 8) */
    int match = -1, n = 0;
    for (int l = 0; l <= 16; l++) {
        snprintf(path, sizeof(path), "../crops/c%02d.latent.safetensors", l);
        if (same_tensor(clips, "w.latent.safetensors", "latent", path, "latent"))
            match = l, n++;
    }
    ck_assert_msg(n == 1 && match != 8, "%d matches, the last at %d", n, match);
    /* the same seed, the same corner: a copy of the folder prepared again */
    char again[4300];
    snprintf(again, sizeof(again), "%s/again", dir);
    ck_assert_int_eq(mkdir(again, 0755), 0);
    write_wide(again);
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg --set 'data.datasets=( { path = \"again\"; "
                                 "resolution = [48, 32]; target_frames = [1]; random_crop = true; } )'") == 0, "%s", out);
    free(out);
    ck_assert(same_tensor(clips, "w.latent.safetensors", "latent", "../again/w.latent.safetensors", "latent"));
    ck_assert(same_tensor(clips, "v_00000-001.latent.safetensors", "latent", "../again/v_00000-001.latent.safetensors",
                          "latent"));
    /* another seed: the settings changed, both encoded again, at another corner */
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg --set data.seed=7 " CROP_SET("")) == 0, "%s", out);
    ck_assert_msg(strstr(out, "2 media files: 2 encoded (2 clips)"), "%s", out);
    free(out);
    snprintf(path, sizeof(path), "../crops/c%02d.latent.safetensors", match);
    ck_assert(!same_tensor(clips, "w.latent.safetensors", "latent", path, "latent"));
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* A hash of every latent the dataset serves over `epochs` epochs (batch 1, in order): h[e][i]
 * for sample i in epoch e; *aug: whether sample i is in dataset 0 (the augmented one). */
static void served_latents(const char *dir, const char *const *sets, int epochs, uint64_t h[][16], bool *aug, int *n)
{
    char path[4300];
    snprintf(path, sizeof(path), "%s/train.cfg", dir);
    ghc_core_t *core = ghc_core_init();
    ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")), 0);
    const char *ov[] = { "data.shuffle=false", sets[0] };
    ck_assert_msg(ghc_config_load(core, path, ov, 2) == 0, "%s", ghc_error_message(core));
    ghc_dataset_t *ds;
    ck_assert_msg(ghc_dataset_open(core, &ds) == 0, "%s", ghc_error_message(core));
    *n = (int)ghc_dataset_size(ds);
    ck_assert_int_le(*n, 16);
    for (int e = 0; e < epochs; e++)
        for (int k = 0; k < *n; k++) {
            struct ghc_data_batch b;
            struct ghc_data_sample_info si;
            ck_assert_msg(ghc_dataset_next(ds, GHC_DEVICE_CPU, NULL, &b) == 0, "%s", ghc_error_message(core));
            ck_assert(b.n == 1 && b.epoch == e && ghc_dataset_sample_at(ds, b.index[0], &si));
            uint64_t x = 1469598103934665603ull;
            const uint8_t *p = ghc_tensor_cdata(b.latents);
            for (size_t i = 0; i < ghc_tensor_nbytes(b.latents); i++)
                x = (x ^ p[i]) * 1099511628211ull;
            h[e][b.index[0]] = x;
            aug[b.index[0]] = si.dataset == 0;
            ghc_data_batch_release(ds, &b);
        }
    ghc_dataset_free(ds);
    ghc_core_free(core);
}

#define MODE_SET(mode) "data.datasets=( { path = \"clips\"; resolution = [48, 32]; target_frames = [1]; " \
                       "random_crop = true; flip_x = true; augmentations_cache_mode = \"" mode "\"; }, " \
                       "{ path = \"plain\"; resolution = [48, 32]; target_frames = [1]; } )"

/* refresh_each_epoch: the augmented clips (a random crop, mirrored or not) are encoded for
 * each epoch, none written as latents; the plain dataset's are the same every epoch; a
 * training run's losses are the same run to run. */
START_TEST(prepare_refresh_each_epoch)
{
    char clips[4200], plain[4200], a[4400], b[4400], *out, *dir = two_folders("clips", clips, "plain", plain);
    write_wide(clips);
    write_wide(plain);
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg --set '" MODE_SET("refresh_each_epoch") "'") == 0, "%s", out);
    ck_assert_msg(strstr(out, "4 media files: 4 encoded (2 clips)"), "%s", out);   /* plain's alone */
    free(out);
    /* nothing of the augmented clips but their text and the manifest */
    ck_assert(!exists(clips, "w.latent.safetensors") && !exists(clips, "w_flipx.latent.safetensors") &&
              exists(clips, "w.aug-text.safetensors") && exists(plain, "w.latent.safetensors"));
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg --set '" MODE_SET("refresh_each_epoch") "'") == 0, "%s", out);
    ck_assert_msg(strstr(out, "4 media files: 0 encoded (0 clips), 4 up to date"), "%s", out);
    free(out);

    static uint64_t h[3][16];
    bool aug[16] = { false };
    int n, n_aug = 0;
    const char *sets[] = { MODE_SET("refresh_each_epoch") };
    served_latents(dir, sets, 3, h, aug, &n);
    ck_assert_int_eq(n, 6);   /* w and v, each as it is (cropped) and mirrored; plain's two */
    for (int i = 0; i < n; i++) {
        n_aug += aug[i];
        if (aug[i])
            ck_assert_msg(h[0][i] != h[1][i] && h[1][i] != h[2][i] && h[0][i] != h[2][i], "sample %d", i);
        else
            ck_assert_msg(h[0][i] == h[1][i] && h[1][i] == h[2][i], "sample %d", i);
    }
    ck_assert_int_eq(n_aug, 4);
    /* again: the same latents, epoch by epoch */
    static uint64_t h2[3][16];
    served_latents(dir, sets, 3, h2, aug, &n);
    ck_assert(memcmp(h, h2, sizeof(h)) == 0);

    /* training over three epochs: the same losses twice */
    ck_assert_msg(cli(dir, &out, "-c train.cfg --set train.steps=18 --set output_dir=\"r1\" --set '"
                                 MODE_SET("refresh_each_epoch") "'") == 0, "%s", out);
    ck_assert_msg(strstr(out, "train: done: 18 steps") && strstr(out, "waiting for epoch 0's augmented clips") &&
                  strstr(out, "4 augmented clips encoded at training time (refresh_each_epoch)"), "%s", out);
    free(out);
    ck_assert_msg(cli(dir, &out, "-c train.cfg --set train.steps=18 --set output_dir=\"r2\" --set '"
                                 MODE_SET("refresh_each_epoch") "'") == 0, "%s", out);
    free(out);
    snprintf(a, sizeof(a), "%s/r1/metrics.jsonl", dir);
    snprintf(b, sizeof(b), "%s/r2/metrics.jsonl", dir);
    double x[32], y[32];
    ck_assert_int_eq(tu_losses(a, x, 32, false), 18);
    ck_assert_int_eq(tu_losses(b, y, 32, false), 18);
    for (int i = 0; i < 18; i++)
        ck_assert_msg(x[i] == y[i], "step %d: %.9g vs %.9g", i, x[i], y[i]);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* disable_cache: the augmented clips encoded each time they are drawn (a crop drawn each
 * time), never written; training runs. */
START_TEST(prepare_disable_cache)
{
    char clips[4200], plain[4200], *out, *dir = two_folders("clips", clips, "plain", plain);
    write_wide(clips);
    write_wide(plain);
    ck_assert_msg(cli(dir, &out, "-c train.cfg --set train.steps=8 --set '" MODE_SET("disable_cache") "'") == 0,
                  "%s", out);
    ck_assert_msg(strstr(out, "train: done: 8 steps") && strstr(out, "4 augmented clips encoded at training time"),
                  "%s", out);
    free(out);
    static const char *const never[] = { "w.latent.safetensors", "w_flipx.latent.safetensors",
                                         "v_00000-001.latent.safetensors", "v_00000-001_flipx.latent.safetensors", NULL };
    for (int i = 0; never[i]; i++)
        ck_assert_msg(!exists(clips, never[i]), "%s", never[i]);
    static uint64_t h[3][16];
    bool aug[16] = { false };
    int n;
    const char *sets[] = { MODE_SET("disable_cache") };
    served_latents(dir, sets, 3, h, aug, &n);
    ck_assert_int_eq(n, 6);
    /* a draw's corner is one of 17: over three epochs an augmented sample takes two or more */
    for (int i = 0; i < n; i++)
        ck_assert_msg(aug[i] ? h[0][i] != h[1][i] || h[1][i] != h[2][i]
                             : h[0][i] == h[1][i] && h[1][i] == h[2][i], "sample %d", i);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

#else

START_TEST(prepare_without_ffmpeg)
{
    char *dir = tu_tmpdir(), clips[4200], *out;
    snprintf(clips, sizeof(clips), "%s/clips", dir);
    ck_assert_int_eq(mkdir(clips, 0755), 0);
    free(tu_write(dir, "train.cfg", cfg_text));
    free(tu_write(clips, "a.mp4", "not decoded"));
    free(tu_write(clips, "a.txt", "a caption"));
    ck_assert_int_ne(cli(dir, &out, "prepare -c train.cfg"), 0);
    ck_assert_msg(strstr(out, "FFmpeg"), "%s", out);
    free(out);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

#endif

/* Configuration errors name the section. */
START_TEST(prepare_config_errors)
{
    char *dir = tu_tmpdir(), clips[4200], *out;
    snprintf(clips, sizeof(clips), "%s/clips", dir);
    ck_assert_int_eq(mkdir(clips, 0755), 0);
    free(tu_write(dir, "train.cfg", cfg_text));
    ck_assert_int_eq(cli(dir, &out, "prepare"), 2);
    ck_assert_msg(strstr(out, "prepare needs a configuration (-c FILE)"), "%s", out);
    free(out);
    /* a folder without media: nothing to do, said so, no encoder loaded */
    ck_assert_int_eq(cli(dir, &out, "prepare -c train.cfg --set 'vae.plugin=\"nosuch\"'"), 3);
    ck_assert_msg(strstr(out, "no media in the folders of data.datasets") && !strstr(out, "nosuch"), "%s", out);
    free(out);
    free(tu_write(clips, "a.png", "x"));
    free(tu_write(clips, "a.txt", "a caption"));
    ck_assert_int_ne(cli(dir, &out, "prepare -c train.cfg --set 'data.prepare=\"sometimes\"'"), 0);
    ck_assert_msg(strstr(out, "prepare") && strstr(out, "sometimes"), "%s", out);
    free(out);
    /* the augmentations' cache modes: all three taken (on to the media: a.png is no picture),
     * in `data` or per dataset; an unknown one lists them, naming the key */
    ck_assert_int_eq(cli(dir, &out, "prepare -c train.cfg --set 'data.augmentations_cache_mode=\"refresh_each_epoch\"'"), 5);
    ck_assert_msg(strstr(out, "a.png") && !strstr(out, "augmentations_cache_mode"), "%s", out);
    free(out);
    ck_assert_int_eq(cli(dir, &out, "prepare -c train.cfg --set 'data.datasets=( { path = \"clips\"; "
                                    "augmentations_cache_mode = \"disable_cache\"; random_crop = true; } )'"), 5);
    ck_assert_msg(strstr(out, "a.png") && !strstr(out, "augmentations_cache_mode"), "%s", out);
    free(out);
    ck_assert_int_ne(cli(dir, &out, "prepare -c train.cfg --set 'data.datasets=( { path = \"clips\"; "
                                    "random_crop = 1; } )'"), 0);
    ck_assert_msg(strstr(out, "random_crop"), "%s", out);
    free(out);
    ck_assert_int_ne(cli(dir, &out, "prepare -c train.cfg --set 'data.augmentations_cache_mode=\"dynamic\"'"), 0);
    ck_assert_msg(strstr(out, "augmentations_cache_mode") && strstr(out, "refresh_each_epoch"), "%s", out);
    free(out);
    /* static is the default, and may be said: on to the media (a.png is no picture) */
    ck_assert_int_eq(cli(dir, &out, "prepare -c train.cfg --set 'data.augmentations_cache_mode=\"static\"'"), 5);
    ck_assert_msg(strstr(out, "a.png") && !strstr(out, "augmentations_cache_mode"), "%s", out);
    free(out);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("prepare");
    TCase *tc = tcase_create("prepare");
    tcase_set_timeout(tc, 120);
#ifdef GHC_HAVE_FFMPEG
    tcase_add_test(tc, prepare_media_to_caches);
    tcase_add_test(tc, prepare_read_ahead);
    tcase_add_test(tc, prepare_memory_policy);
    tcase_add_test(tc, prepare_musubi_layout);
    tcase_add_test(tc, prepare_flips);
    tcase_add_test(tc, prepare_random_crop);
    tcase_add_test(tc, prepare_refresh_each_epoch);
    tcase_add_test(tc, prepare_disable_cache);
#else
    tcase_add_test(tc, prepare_without_ffmpeg);
#endif
    tcase_add_test(tc, prepare_config_errors);
    suite_add_tcase(s, tc);
    return tu_run_suite(s, false);
}
