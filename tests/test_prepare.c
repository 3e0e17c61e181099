/* test_prepare.c: `gh200core prepare` (doc/prepare.md) through the CLI, with the `wanvae` and
 * `umt5` plugins at small random sizes, on media written at test time (tests/media_write.h): a
 * video and an image with captions become clips of latents and text embeddings of the right
 * shapes; a second run encodes nothing; an edited caption re-encodes that file only; a
 * removed clip length removes its files; a lost manifest (a killed run) re-encodes; a corrupt
 * file stops the run naming it, or is skipped with skip_bad_samples; a training run then reads
 * the caches (and runs prepare first itself). Without FFmpeg: that prepare says so. */
#include <config.h>

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <gh200core/gh200core.h>
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

#ifdef GHC_HAVE_FFMPEG

START_TEST(prepare_media_to_caches)
{
    char *dir = tu_tmpdir(), clips[4200], path[4300], *out;
    snprintf(clips, sizeof(clips), "%s/clips", dir);
    ck_assert_int_eq(mkdir(clips, 0755), 0);
    free(tu_write(dir, "train.cfg", cfg_text));
    snprintf(path, sizeof(path), "%s/a.mkv", clips);
    tu_write_video(path, 48, 32, 9, 16, NULL, tu_fill_pattern);
    uint8_t px[32 * 48 * 3];
    tu_fill_pattern(3, 48, 32, px);
    snprintf(path, sizeof(path), "%s/b.png", clips);
    tu_write_image(path, 48, 32, 3, px);
    free(tu_write(clips, "a.txt", "a red ball\n"));
    free(tu_write(clips, "b.txt", "a blue cube"));

    /* first run: a.mkv's clips of 1 and 5 frames (head), b.png's image */
    ck_assert_msg(cli(dir, &out, "prepare -c train.cfg") == 0, "%s", out);
    ck_assert_msg(strstr(out, "prepare: 2 media files: 2 encoded (3 clips), 0 up to date, 0 skipped as bad"), "%s", out);
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
#else
    tcase_add_test(tc, prepare_without_ffmpeg);
#endif
    tcase_add_test(tc, prepare_config_errors);
    suite_add_tcase(s, tc);
    return tu_run_suite(s, false);
}
