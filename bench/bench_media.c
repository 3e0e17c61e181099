/* bench_media.c: how long `gh200core prepare` takes to decode and resize a clip on one thread
 * (its decoder thread: ghc_media_decoder with one FFmpeg thread), to set beside the GPU's
 * encode time per clip (bench/vae.sh, bench/umt5.sh): prepare decodes the next media file while
 * the current one encodes, so it is limited by the GPU where a clip decodes faster than it
 * encodes.
 *
 *     bench/bench_media [CLIPS [FRAMES [WIDTH HEIGHT [BUCKET_W BUCKET_H]]]]
 *     (defaults: 10 clips of 81 frames at 1280 x 720, to the 832 x 480 bucket)
 *
 * The clips are written first (ghc_media_write_video: MPEG-4 Part 2 .mp4, a moving pattern
 * with noise, so the coder cannot skip blocks), then each is opened and decoded to the bucket
 * with Wan's 81-frame head extraction. Prints the seconds per clip (decode + resize) and the
 * frames per second. Needs a build with FFmpeg. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <gh200core/gh200core.h>
#include <gh200core/media.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    const int clips = argc > 1 ? atoi(argv[1]) : 10, frames = argc > 2 ? atoi(argv[2]) : 81;
    const int W = argc > 4 ? atoi(argv[3]) : 1280, H = argc > 4 ? atoi(argv[4]) : 720;
    const int bw = argc > 6 ? atoi(argv[5]) : 832, bh = argc > 6 ? atoi(argv[6]) : 480;
    if (clips < 1 || frames < 1 || W < 16 || H < 16 || bw < 16 || bh < 16) {
        fprintf(stderr, "usage: %s [CLIPS [FRAMES [WIDTH HEIGHT [BUCKET_W BUCKET_H]]]]\n", argv[0]);
        return 2;
    }
    char dir[] = "/tmp/ghc-bench-media-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    ghc_core_t *core = ghc_core_init();
    if (!core) {
        fprintf(stderr, "bench_media: no core\n");
        return 1;
    }
    uint8_t *rgb = malloc((size_t)frames * W * H * 3);
    if (!rgb)
        return 1;
    uint64_t r = 0x9e3779b97f4a7c15ull;
    double t0 = now_s();
    for (int c = 0; c < clips; c++) {
        for (int f = 0; f < frames; f++)
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++) {
                    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
                    uint8_t *p = rgb + (((size_t)f * H + y) * W + x) * 3;
                    p[0] = (uint8_t)(x + 3 * f + c * 17 + (r & 15));
                    p[1] = (uint8_t)(y + 2 * f + ((r >> 4) & 15));
                    p[2] = (uint8_t)((x ^ y) + f + ((r >> 8) & 15));
                }
        char path[4200];
        snprintf(path, sizeof(path), "%s/clip%03d.mp4", dir, c);
        if (ghc_media_write_video(core, path, rgb, frames, W, H, 16, NULL) < 0) {
            fprintf(stderr, "bench_media: %s\n", ghc_error_message(core));
            return 1;
        }
    }
    printf("wrote %d clips of %d frames at %d x %d in %.1f s (%s)\n", clips, frames, W, H, now_s() - t0, dir);

    struct ghc_media_settings s;
    ghc_media_settings_default(&s);
    s.width = bw;
    s.height = bh;
    s.n_target_frames = 1;
    s.target_frames[0] = frames;
    ghc_media_decoder_t *d = ghc_media_decoder_init(1);
    double total = 0.0, best = 1e30;
    int64_t decoded = 0;
    for (int c = 0; c < clips && d; c++) {
        char path[4200];
        snprintf(path, sizeof(path), "%s/clip%03d.mp4", dir, c);
        struct ghc_media_frames out;
        const double a = now_s();
        if (ghc_media_decoder_open(d, path, NULL) < 0 || ghc_media_decoder_read(d, &s, &out) < 0) {
            fprintf(stderr, "bench_media: %s\n", ghc_media_decoder_error(d));
            return 1;
        }
        const double t = now_s() - a;
        total += t;
        best = t < best ? t : best;
        decoded += out.frames;
        if (c == 0)
            printf("bucket %d x %d, %lld frames a clip\n", out.width, out.height, (long long)out.frames);
        unlink(path);
    }
    printf("RESULT decode_s_per_clip=%.4f best_s=%.4f frames_per_s=%.1f clips=%d (one decoder thread)\n",
           total / clips, best, (double)decoded / total, clips);
    ghc_media_decoder_free(d);
    free(rgb);
    rmdir(dir);
    ghc_core_free(core);
    return 0;
}
