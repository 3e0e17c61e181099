/* media.h: raw media for `prepare`: a folder of videos and images with `<stem>.txt` captions,
 * decoded with FFmpeg's libraries (libavformat, libavcodec, libswscale) into uint8 RGB frames
 * resized and centre-cropped to a resolution bucket, and cut into clips of 4k + 1 frames, by
 * musubi-tuner's rules (doc/media.md): its buckets, its fps conversion, its frame extraction
 * modes (head, chunk, slide, uniform, full) and its normalisation for the VAE.
 *
 * Also writes media (videos and images, for the embedded demo and tests).
 *
 * Since API 16. Built without FFmpeg (configure --without-ffmpeg), everything but decoding and
 * writing works; the decoder and the writers return GHC_EUNSUPPORTED and say so.
 *
 * Threads: there is no global state. The pure functions (buckets, clips, normalisation) may be
 * called from any thread. A decoder belongs to one thread at a time; decoders are independent,
 * so a pool of threads, each with its own decoder, decodes files in parallel. A decoder keeps
 * its own message (ghc_media_decoder_error), so worker threads never touch the core's error
 * buffer; the caller passes it on (ghc_error_set) from its own thread.
 *
 * Bad samples: a missing, empty or non-UTF-8 caption, an unreadable or corrupt file, a clip too
 * short for every target: one line that names the file and what was wrong, and the status
 * GHC_EFORMAT, so that the caller applies `skip_bad_samples` as the dataset does (skip with a
 * warning, or stop with the message). Other statuses are not the sample's fault. */
#ifndef GHC_MEDIA_H
#define GHC_MEDIA_H

#include <stddef.h>
#include <stdint.h>

#include <gh200core/core.h>     /* defines: ghc_core_t, ghc_cfg_t, struct ghc_cfg_key, GHC_API */

GHC_BEGIN_DECLS

/* ---- settings ------------------------------------------------------------------------------ */

/* The most target_frames values a dataset may list. */
#define GHC_MEDIA_MAX_TARGETS 32

enum ghc_media_kind {
    GHC_MEDIA_NONE = 0,          /* not a media file */
    GHC_MEDIA_IMAGE,             /* png, jpg, jpeg, webp, bmp, avif, jxl: one frame */
    GHC_MEDIA_VIDEO,             /* mp4, webm, avi, mkv, mov, flv, wmv, m4v, mpg, mpeg */
};

/* musubi-tuner's frame_extraction values. */
enum ghc_media_extraction {
    GHC_MEDIA_HEAD = 0,          /* (0, f) for each f <= N; only max(f) frames decoded */
    GHC_MEDIA_CHUNK,             /* (i, f) for i = 0, f, 2f, ... with i + f <= N */
    GHC_MEDIA_SLIDE,             /* (i, f) for i = 0, s, 2s, ... <= N - f (s = frame_stride) */
    GHC_MEDIA_UNIFORM,           /* frame_sample starts spread evenly over 0 .. N - f */
    GHC_MEDIA_FULL,              /* (0, min(N, max_frames) rounded down to 4k + 1) */
};

/* How a dataset's media become frames. Fill with ghc_media_settings_default() (musubi-tuner's
 * defaults) or ghc_media_settings_read(), then change members. Members are only ever
 * appended. */
struct ghc_media_settings {
    int32_t width, height;               /* resolution (W, H); default 960 x 544 */
    bool    enable_bucket;               /* images: buckets of equal area (default false:
                                            the one bucket `resolution`); videos always use
                                            buckets, as musubi-tuner does */
    bool    bucket_no_upscale;           /* images smaller than the resolution's area keep
                                            their size, floored to multiples of 16 */
    int32_t n_target_frames;             /* 1 to GHC_MEDIA_MAX_TARGETS */
    int32_t target_frames[GHC_MEDIA_MAX_TARGETS]; /* clip lengths; rounded down to 4k + 1,
                                            sorted and made distinct where used */
    enum ghc_media_extraction frame_extraction;   /* default head */
    int32_t frame_stride;                /* slide: the step between starts (default 1) */
    int32_t frame_sample;                /* uniform: clips per length (default 1; uniform with
                                            1 is head, as in musubi-tuner) */
    int32_t max_frames;                  /* full: the longest clip (default 129) */
    double  source_fps;                  /* > 0: drop frames to target_fps, taking the video
                                            to be at this rate; 0: no conversion (default) */
    double  target_fps;                  /* 16 (Wan) */
    char    caption_extension[32];       /* ".txt" */
    bool    flip_x, flip_y;              /* (since API 17) augmentations (ai-toolkit's): each clip also
                                            encoded mirrored left-right / upside down (both:
                                            also both at once); default false */
};

/* musubi-tuner's defaults, with caption_extension ".txt" and target_fps 16. */
GHC_API void ghc_media_settings_default(struct ghc_media_settings *s);
/* The keys ghc_media_settings_read() reads, for a section's key table (ends with { NULL }).
 * Static. */
GHC_API const struct ghc_cfg_key *ghc_media_keys(void);
/* Read those keys from `cfg` (absent ones keep musubi-tuner's defaults): resolution = [W, H],
 * enable_bucket, bucket_no_upscale, target_frames (a list: [1, 25, 45]), frame_extraction
 * ("head", "chunk", "slide", "uniform", "full"), frame_stride, frame_sample, max_frames,
 * source_fps, caption_extension, flip_x, flip_y. target_frames are rounded down to 4k + 1, sorted and made
 * distinct (a warning when that changed them), and uniform with frame_sample = 1 becomes head
 * (a warning), as musubi-tuner does. Returns 0 or GHC_ECONFIG ("train.cfg:12: data.resolution:
 * expected [width, height] ..."). */
GHC_API int  ghc_media_settings_read(ghc_cfg_t *cfg, struct ghc_media_settings *out);
/* The name of an extraction mode ("head" ...). Static. */
GHC_API const char *ghc_media_extraction_name(enum ghc_media_extraction e);

/* ---- scanning ------------------------------------------------------------------------------ */

/* The kind of a file by its extension, all lower or all upper case as musubi-tuner lists them
 * ("a.MP4" is a video, "a.Mp4" nothing). */
GHC_API enum ghc_media_kind ghc_media_kind_of(const char *name);

/* One media file of a scanned folder. Strings belong to the list. */
struct ghc_media_item {
    const char          *path;       /* dir/name */
    const char          *name;       /* the file name */
    enum ghc_media_kind  kind;
    const char          *caption;    /* its caption: UTF-8, surrounding white space removed as
                                        Python's str.strip() does, "\r\n" and "\r" read as
                                        "\n"; NULL when bad */
    const char          *bad;        /* NULL, or one line naming the file and what was wrong
                                        (no caption, an empty one, one that is not UTF-8
                                        or holds a NUL byte) */
};
typedef struct ghc_media_list ghc_media_list_t;

/* The media files of folder `dir` (not its subfolders, as musubi-tuner; names starting with
 * "." skipped), sorted by name (bytewise), each with its caption `<stem><caption_extension>`
 * read. A file with a bad caption is listed with `bad` set: the caller skips it or stops
 * (skip_bad_samples). Returns 0 or GHC_E* (the folder cannot be read: GHC_ENOTFOUND or GHC_EIO,
 * message in ghc_error_message(core)); on success *out belongs to the caller, who frees it with
 * ghc_media_list_free(). */
GHC_API int ghc_media_scan(ghc_core_t *core, const char *dir, const char *caption_extension,
                           ghc_media_list_t **out);
GHC_API int64_t ghc_media_list_len(const ghc_media_list_t *l);
/* Item i (borrowed until ghc_media_list_free), or NULL out of range. */
GHC_API const struct ghc_media_item *ghc_media_list_at(const ghc_media_list_t *l, int64_t i);
/* The items with `bad` set. */
GHC_API int64_t ghc_media_list_bad(const ghc_media_list_t *l);
/* NULL is a no-op. */
GHC_API void ghc_media_list_free(ghc_media_list_t *l);

/* ---- buckets, resize and crop ----------------------------------------------------------------- */

/* musubi-tuner's buckets for a resolution (step 16), sorted by (width, height): with
 * enable_bucket, pairs of area about width x height around the square; without, the
 * resolution alone. Writes up to `max` pairs (w, h) into out (out may be NULL when max is 0).
 * Returns how many there are (more than max: only max written), or GHC_EINVAL for a resolution
 * with no bucket (below 32 x 32 in area with enable_bucket; a side below 1). */
GHC_API int ghc_media_buckets(int32_t width, int32_t height, bool enable_bucket, int32_t (*out)[2],
                              int max);
/* The bucket of a w x h picture: the bucket whose aspect ratio is nearest w / h (the first of
 * equals in the order above); with `no_upscale` (and enable_bucket) a picture of at most the
 * resolution's area keeps its size floored to multiples of 16. Returns 0, GHC_EINVAL (bad
 * resolution or size) or GHC_EFORMAT (no_upscale and a side below 16: too small). */
GHC_API int ghc_media_bucket_select(int32_t width, int32_t height, bool enable_bucket, bool no_upscale,
                                    int32_t w, int32_t h, int32_t *bw, int32_t *bh);

/* Where a w x h picture goes for bucket bw x bh: scale = max(bw / w, bh / h), resized to
 * (int)(w * scale + 0.5) x (int)(h * scale + 0.5), then cropped at (left, top) =
 * ((rw - bw) / 2, (rh - bh) / 2). Any output pointer may be NULL. */
GHC_API void ghc_media_fit(int32_t w, int32_t h, int32_t bw, int32_t bh, int32_t *rw, int32_t *rh,
                           int32_t *left, int32_t *top);
/* Resize a packed RGB24 picture (w x h, `stride` bytes per row) by ghc_media_fit() and
 * centre-crop it into `dst` (bw x bh x 3, packed), with musubi-tuner's filters and the same
 * bytes: Pillow's LANCZOS when enlarging (scale > 1), OpenCV's INTER_AREA otherwise; a picture
 * that keeps its size is only cropped. Needs no FFmpeg. Returns 0, GHC_EINVAL or GHC_ENOMEM. */
GHC_API int ghc_media_resize_crop(const uint8_t *src, int32_t w, int32_t h, ptrdiff_t stride,
                                  uint8_t *dst, int32_t bw, int32_t bh);

/* ---- frame extraction ------------------------------------------------------------------------- */

/* target_frames rounded down to 4k + 1, sorted and made distinct (values below 1 dropped).
 * Writes into out (n entries at most). Returns how many. */
GHC_API int ghc_media_target_frames(const int32_t *in, int n, int32_t *out);

struct ghc_media_clip {
    int64_t start;               /* the first frame, of the decoded (fps-converted) frames */
    int32_t frames;              /* its length, 4k + 1 */
};
/* The clips of a video of n decoded frames by s's frame_extraction (the table in doc/media.md:
 * per target in ascending order, starts ascending; uniform's equal starts once). Writes up to
 * `max` into out. Returns how many there are (0: too short for every target). */
GHC_API int64_t ghc_media_clips(const struct ghc_media_settings *s, int64_t n, struct ghc_media_clip *out,
                                int64_t max);

/* ---- decoding ----------------------------------------------------------------------------------- */

typedef struct ghc_media_decoder ghc_media_decoder_t;

/* What a file holds, from its container (before decoding). */
struct ghc_media_info {
    int32_t width, height;       /* the video stream's coded picture */
    int64_t frames;              /* the container's frame count, else duration x fps (an
                                    estimate; 1 for an image) */
    bool    frames_exact;        /* frames came from the container's count */
    double  fps;                 /* average frame rate (0 when unknown) */
    double  duration;            /* seconds (0 when unknown) */
    bool    is_image;            /* by extension: decoded as one frame */
    const char *codec;           /* "h264", "png" ...; static */
};

/* The decoded frames of the file opened, at the bucket, and its clips. Borrowed from the
 * decoder until its next open, read or free. */
struct ghc_media_frames {
    int32_t width, height;       /* the bucket (or the source size, read without settings) */
    int32_t src_width, src_height;  /* the first frame's size before resizing */
    int64_t frames;              /* N, decoded (after fps conversion) */
    const uint8_t *rgb;          /* [N, height, width, 3] uint8; clip c is
                                    rgb + clips[c].start * height * width * 3 */
    int64_t n_clips;
    const struct ghc_media_clip *clips;
};

/* A decoder for one thread (FFmpeg decoding threads: `threads`, 0 = FFmpeg's choice; 1 suits a
 * pool of decoders). NULL when out of memory. */
GHC_API ghc_media_decoder_t *ghc_media_decoder_init(int threads);
/* NULL is a no-op. */
GHC_API void ghc_media_decoder_free(ghc_media_decoder_t *d);
/* The last failure's message (one line naming the file), or "". Borrowed until the next call
 * on d. */
GHC_API const char *ghc_media_decoder_error(const ghc_media_decoder_t *d);

/* Open `path` (its kind by ghc_media_kind_of; an unknown extension is read as a video) and
 * describe it in *info (may be NULL). Closes any file opened before. Returns 0, GHC_EFORMAT (a
 * bad sample: cannot be opened or holds no video stream, FFmpeg's reason in the message),
 * GHC_ENOMEM or GHC_EUNSUPPORTED (built without FFmpeg). */
GHC_API int ghc_media_decoder_open(ghc_media_decoder_t *d, const char *path, struct ghc_media_info *info);
/* Decode the file opened into *out, once for all its clips. With settings: an image is one
 * frame at the bucket of s (enable_bucket, bucket_no_upscale) and one clip (0, 1); a video's
 * bucket is chosen from its first frame with buckets and upscaling always (as musubi-tuner),
 * every frame resized to it as decoded, frames dropped by musubi-tuner's fps rule when
 * s->source_fps > 0, only as many frames decoded as the extraction mode can use (head:
 * max(target_frames); full: max_frames), and the clips of ghc_media_clips(). Without settings
 * (s NULL): every frame at its own size (all frames the first one's size) and one clip of all.
 * Alpha is dropped (the first three channels). Returns 0, GHC_EFORMAT (a bad sample: a decoding
 * error with FFmpeg's reason, no frame, a clip too short for every target, a picture too small
 * for its bucket), GHC_EINVAL (bad settings), GHC_ENOMEM or GHC_EUNSUPPORTED. */
GHC_API int ghc_media_decoder_read(ghc_media_decoder_t *d, const struct ghc_media_settings *s,
                                   struct ghc_media_frames *out);

/* ---- writing ------------------------------------------------------------------------------------ */

/* (since API 17) Write `frames` packed RGB24 pictures (rgb: [frames, height, width, 3]) as a video at `path`,
 * the codec by its extension (any case): .mkv Matroska with FFV1 (lossless), .mp4 MP4 with
 * MPEG-4 Part 2 at quantiser 2 in 4:2:0 (even sides). Frame k is at k / fps seconds, or at
 * pts_ms[k] milliseconds when pts_ms is given (a variable frame rate). The bytes depend on the
 * pictures and arguments alone (FFmpeg's bit-exact mode). Returns 0, GHC_EINVAL
 * (an extension or size it cannot write), GHC_EIO (cannot create or write: the message names
 * the path), GHC_ENOMEM or GHC_EUNSUPPORTED (built without FFmpeg); the message is in
 * ghc_error_message(core). */
GHC_API int ghc_media_write_video(ghc_core_t *core, const char *path, const uint8_t *rgb, int32_t frames,
                                  int32_t width, int32_t height, int32_t fps, const int64_t *pts_ms);
/* (since API 17) Write one packed picture of `channels` 3 (RGB24) or 4 (RGBA, PNG only) as an image at `path`:
 * .png PNG (lossless), .jpg / .jpeg JPEG at quantiser 2 in 4:4:4, full range.
 * Returns as ghc_media_write_video(). */
GHC_API int ghc_media_write_image(ghc_core_t *core, const char *path, const uint8_t *px, int32_t width,
                                  int32_t height, int32_t channels);

/* ---- augmentations ---------------------------------------------------------------------------- */

/* (since API 17) Packed RGB24 frames src [f, h, w, 3] mirrored into dst (the same size; not overlapping):
 * left-right with flip_x, upside down with flip_y, both with both, a copy with neither. The
 * frames keep their order. */
GHC_API void ghc_media_flip(const uint8_t *src, int64_t f, int32_t h, int32_t w, bool flip_x, bool flip_y,
                            uint8_t *dst);

/* ---- the VAE's input ---------------------------------------------------------------------------- */

/* uint8 frames [f, h, w, 3] -> the VAE's input [3, f, h, w] (channels first), x / 127.5 - 1 in
 * f32, as musubi-tuner computes it. */
GHC_API void ghc_media_to_vae_f32(const uint8_t *frames, int64_t f, int32_t h, int32_t w, float *out);
/* The same in bf16 as musubi-tuner computes it in the VAE's bf16: x / 127.5 rounded to bf16,
 * then - 1 rounded to bf16 (round to nearest even). */
GHC_API void ghc_media_to_vae_bf16(const uint8_t *frames, int64_t f, int32_t h, int32_t w, uint16_t *out);

GHC_END_DECLS

#endif /* GHC_MEDIA_H */
