/* media_write.h: media written at test time (test_media, test_prepare) through the library's
 * writer (media.h: ghc_media_write_video, ghc_media_write_image), so that no ffmpeg program is
 * needed: frames made by a fill function, a failure a test failure. With FFmpeg only
 * (GHC_HAVE_FFMPEG); the tests link libgh200core_train. */
#ifndef GHC_TESTS_MEDIA_WRITE_H
#define GHC_TESTS_MEDIA_WRITE_H

#ifdef GHC_HAVE_FFMPEG
#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include <gh200core/gh200core.h>
#include <gh200core/media.h>

typedef void (*tu_fill_fn)(int k, int w, int h, uint8_t *rgb);   /* frame k as packed RGB24 */

/* n frames made by fill into `path` (.mkv: FFV1, .mp4: MPEG-4), at k / fps, or at pts_ms[k]
 * milliseconds when given. */
static inline void tu_write_video(const char *path, int w, int h, int n, int fps, const int64_t *pts_ms, tu_fill_fn fill)
{
    size_t one = (size_t)w * (size_t)h * 3;
    uint8_t *rgb = malloc(one * (size_t)n);
    ck_assert_ptr_nonnull(rgb);
    for (int k = 0; k < n; k++)
        fill(k, w, h, rgb + (size_t)k * one);
    ghc_core_t *core = ghc_core_init();
    int rc = ghc_media_write_video(core, path, rgb, n, w, h, fps, pts_ms);
    ck_assert_msg(rc == 0, "%s", ghc_error_message(core));
    ghc_core_free(core);
    free(rgb);
}

/* One picture of `channels` 3 (RGB) or 4 (RGBA) as `path` (.png, .jpg). */
static inline void tu_write_image(const char *path, int w, int h, int channels, const uint8_t *px)
{
    ghc_core_t *core = ghc_core_init();
    int rc = ghc_media_write_image(core, path, px, w, h, channels);
    ck_assert_msg(rc == 0, "%s", ghc_error_message(core));
    ghc_core_free(core);
}

/* R = 6x, G = 10y, B = 20k + 3: every pixel says where it is */
static inline void tu_fill_pattern(int k, int w, int h, uint8_t *rgb)
{
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *p = rgb + ((size_t)y * w + x) * 3;
            p[0] = (uint8_t)(6 * x), p[1] = (uint8_t)(10 * y), p[2] = (uint8_t)(20 * k + 3);
        }
}

#endif /* GHC_HAVE_FFMPEG */

#endif /* GHC_TESTS_MEDIA_WRITE_H */
