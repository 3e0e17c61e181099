/* media_impl.h: what media.c, media_resize.c, media_ffmpeg.c and media_write.c share (not
 * installed). */
#ifndef GHC_MEDIA_IMPL_H
#define GHC_MEDIA_IMPL_H

#include <gh200core/media.h>

/* The end of the message of a call that needs FFmpeg in a build without it. */
#define NO_FFMPEG "built without FFmpeg (configure found no libavformat, libavcodec, libswscale: " \
                  "Debian: apt-get install libavformat-dev libavcodec-dev libswscale-dev libavutil-dev)"

/* ghc_media_resize_crop with a caller's scratch buffer (*scratch, *cap bytes; grown with
 * realloc, freed by the caller), for a decoder that resizes frame after frame, and the crop's
 * corner (left, top) in the resized picture: ghc_media_fit()'s centre where left < 0. */
int ghc_media_resize_into(const uint8_t *src, int32_t w, int32_t h, ptrdiff_t stride, uint8_t *dst, int32_t bw,
                          int32_t bh, int32_t left, int32_t top, uint8_t **scratch, size_t *cap);

/* random_crop (an augmentation, ai-toolkit's): the corner of a bucket's crop drawn from `seed`
 * instead of centred: left uniform in [0, rw - bw], top in [0, rh - bh] (ghc_media_fit's sizes).
 * The same seed gives the same corner. */
void ghc_media_crop_draw(uint64_t seed, int32_t rw, int32_t rh, int32_t bw, int32_t bh, int32_t *left, int32_t *top);

/* For the next reads of decoder d (with settings): every frame cropped at a corner drawn by
 * ghc_media_crop_draw(seed) (random true), or centred as musubi-tuner (false, the default).
 * (Core-internal: prepare and the dataset's augmentations.) */
void ghc_media_decoder_crop(ghc_media_decoder_t *d, bool random, uint64_t seed);

#endif /* GHC_MEDIA_IMPL_H */
