/* media_impl.h: what media.c, media_resize.c, media_ffmpeg.c and media_write.c share (not
 * installed). */
#ifndef GHC_MEDIA_IMPL_H
#define GHC_MEDIA_IMPL_H

#include <gh200core/media.h>

/* The end of the message of a call that needs FFmpeg in a build without it. */
#define NO_FFMPEG "built without FFmpeg (configure found no libavformat, libavcodec, libswscale: " \
                  "Debian: apt-get install libavformat-dev libavcodec-dev libswscale-dev libavutil-dev)"

/* ghc_media_resize_crop with a caller's scratch buffer (*scratch, *cap bytes; grown with
 * realloc, freed by the caller), for a decoder that resizes frame after frame. */
int ghc_media_resize_into(const uint8_t *src, int32_t w, int32_t h, ptrdiff_t stride, uint8_t *dst, int32_t bw,
                          int32_t bh, uint8_t **scratch, size_t *cap);

#endif /* GHC_MEDIA_IMPL_H */
