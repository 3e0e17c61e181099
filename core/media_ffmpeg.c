/* media_ffmpeg.c: decoding for media.h with FFmpeg's libraries: a decoder per thread
 * (libavformat + libavcodec), frames converted to RGB24 at their own size with libswscale
 * (bilinear chroma, as PyAV's to_image() which musubi-tuner uses), then resized and
 * centre-cropped to the bucket by media_resize.c as they come. Built without FFmpeg
 * (GHC_HAVE_FFMPEG undefined) the decoder's entry points return GHC_EUNSUPPORTED. */
#include <config.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/media.h>

#include "media_impl.h"

#ifdef GHC_HAVE_FFMPEG

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libswscale/swscale.h>

static int grow(uint8_t **p, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    uint8_t *q = realloc(*p, need);
    if (!q)
        return GHC_ENOMEM;
    *p = q;
    *cap = need;
    return 0;
}

/* ---- the decoder ---------------------------------------------------------------------------- */

struct ghc_media_decoder {
    int                 threads;
    char                err[GHC_ERROR_MAX];
    char               *path;
    enum ghc_media_kind kind;
    bool                used;          /* read once: the next read opens the file again */
    bool                flushing;      /* the demuxer is at its end, the decoder drained */
    AVFormatContext    *fmt;
    AVCodecContext     *dec;
    int                 stream;
    AVPacket           *pkt;
    AVFrame            *frame;
    struct SwsContext  *to_rgb;        /* a decoded frame -> RGB24 at its own size */
    uint8_t            *src;           /* that RGB24 frame, rows src_stride bytes apart */
    size_t              src_cap;
    int                 src_stride;
    uint8_t            *scratch;       /* the resizer's */
    size_t              scratch_cap;
    uint8_t            *rgb;           /* the frames read */
    size_t              rgb_cap;
    struct ghc_media_clip *clips;
    int64_t             clips_cap;
    bool                crop_random;   /* random_crop: the corner drawn from crop_seed */
    uint64_t            crop_seed;
};

/* Record the message (prefixed with the file) and return code. */
static int fail(ghc_media_decoder_t *d, int code, const char *fmt, ...) GHC_PRINTF(3, 4);
static int fail(ghc_media_decoder_t *d, int code, const char *fmt, ...)
{
    char q[GHC_ERROR_MAX / 2];
    int n = snprintf(d->err, sizeof(d->err), "media: %s: ", ghc_path_quote(d->path ? d->path : "?", q, sizeof(q)));
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof(d->err))
        vsnprintf(d->err + n, sizeof(d->err) - (size_t)n, fmt, ap);
    va_end(ap);
    return code;
}

static const char *av_reason(int averr, char *buf, size_t n)
{
    if (av_strerror(averr, buf, n) < 0)
        snprintf(buf, n, "FFmpeg error %d", averr);
    return buf;
}

ghc_media_decoder_t *ghc_media_decoder_init(int threads)
{
    ghc_media_decoder_t *d = calloc(1, sizeof(*d));
    if (!d)
        return NULL;
    d->threads = threads < 0 ? 0 : threads;
    d->pkt = av_packet_alloc();
    d->frame = av_frame_alloc();
    if (!d->pkt || !d->frame) {
        ghc_media_decoder_free(d);
        return NULL;
    }
    return d;
}

static void decoder_close(ghc_media_decoder_t *d)
{
    avcodec_free_context(&d->dec);
    avformat_close_input(&d->fmt);
    d->used = d->flushing = false;
}

void ghc_media_decoder_free(ghc_media_decoder_t *d)
{
    if (!d)
        return;
    decoder_close(d);
    av_packet_free(&d->pkt);
    av_frame_free(&d->frame);
    sws_freeContext(d->to_rgb);
    free(d->scratch);
    free(d->src);
    free(d->rgb);
    free(d->clips);
    free(d->path);
    free(d);
}

const char *ghc_media_decoder_error(const ghc_media_decoder_t *d)
{
    return d ? d->err : "";
}

static int decoder_start(ghc_media_decoder_t *d, struct ghc_media_info *info)
{
    char why[256];
    int r = avformat_open_input(&d->fmt, d->path, NULL, NULL);
    if (r < 0)
        return fail(d, GHC_EFORMAT, "cannot open: %s", av_reason(r, why, sizeof(why)));
    if ((r = avformat_find_stream_info(d->fmt, NULL)) < 0)
        return fail(d, GHC_EFORMAT, "cannot read the streams: %s", av_reason(r, why, sizeof(why)));
    const AVCodec *codec = NULL;
    r = av_find_best_stream(d->fmt, AVMEDIA_TYPE_VIDEO, -1, -1, &codec, 0);
    if (r < 0)
        return fail(d, GHC_EFORMAT, "no video stream or picture: %s", av_reason(r, why, sizeof(why)));
    d->stream = r;
    AVStream *st = d->fmt->streams[r];
    if (!codec)
        return fail(d, GHC_EFORMAT, "no decoder for codec %s in this FFmpeg", avcodec_get_name(st->codecpar->codec_id));
    if (!(d->dec = avcodec_alloc_context3(codec)))
        return fail(d, GHC_ENOMEM, "out of memory");
    if ((r = avcodec_parameters_to_context(d->dec, st->codecpar)) < 0)
        return fail(d, GHC_EFORMAT, "bad codec parameters: %s", av_reason(r, why, sizeof(why)));
    d->dec->thread_count = d->threads;
    if ((r = avcodec_open2(d->dec, codec, NULL)) < 0)
        return fail(d, GHC_EFORMAT, "cannot open the %s decoder: %s", codec->name, av_reason(r, why, sizeof(why)));
    if (info) {
        memset(info, 0, sizeof(*info));
        info->width = st->codecpar->width;
        info->height = st->codecpar->height;
        info->is_image = d->kind == GHC_MEDIA_IMAGE;
        info->codec = avcodec_get_name(st->codecpar->codec_id);
        AVRational fr = st->avg_frame_rate.num > 0 ? st->avg_frame_rate : st->r_frame_rate;
        info->fps = fr.num > 0 && fr.den > 0 ? av_q2d(fr) : 0.0;
        if (st->duration != AV_NOPTS_VALUE && st->duration > 0)
            info->duration = (double)st->duration * av_q2d(st->time_base);
        else if (d->fmt->duration != AV_NOPTS_VALUE && d->fmt->duration > 0)
            info->duration = (double)d->fmt->duration / AV_TIME_BASE;
        if (info->is_image) {
            info->frames = 1;
            info->frames_exact = true;
        } else if (st->nb_frames > 0) {
            info->frames = st->nb_frames;
            info->frames_exact = true;
        } else {
            info->frames = (int64_t)(info->duration * info->fps + 0.5);
        }
    }
    return 0;
}

int ghc_media_decoder_open(ghc_media_decoder_t *d, const char *path, struct ghc_media_info *info)
{
    decoder_close(d);
    d->err[0] = '\0';
    char *p = strdup(path);
    if (!p)
        return fail(d, GHC_ENOMEM, "out of memory");
    free(d->path);
    d->path = p;               /* path may have been d->path: use p from here */
    d->kind = ghc_media_kind_of(p);
    int rc = decoder_start(d, info);
    if (rc < 0)
        decoder_close(d);
    return rc;
}

/* The next decoded frame into d->frame: 1, 0 at the end, or an AVERROR. */
static int next_frame(ghc_media_decoder_t *d)
{
    for (;;) {
        int r = avcodec_receive_frame(d->dec, d->frame);
        if (r == 0)
            return 1;
        if (r == AVERROR_EOF)
            return 0;
        if (r != AVERROR(EAGAIN))
            return r;
        if (d->flushing)
            return 0;
        r = av_read_frame(d->fmt, d->pkt);
        if (r == AVERROR_EOF) {
            d->flushing = true;
            if ((r = avcodec_send_packet(d->dec, NULL)) < 0)
                return r;
            continue;
        }
        if (r < 0)
            return r;
        if (d->pkt->stream_index == d->stream)
            r = avcodec_send_packet(d->dec, d->pkt);
        av_packet_unref(d->pkt);
        if (r < 0)
            return r;
    }
}

/* d->frame as packed RGB24 at its own size in d->src (alpha dropped). */
static int frame_to_rgb(ghc_media_decoder_t *d)
{
    AVFrame *f = d->frame;
    d->to_rgb = sws_getCachedContext(d->to_rgb, f->width, f->height, f->format, f->width, f->height,
                                     AV_PIX_FMT_RGB24, SWS_BILINEAR, NULL, NULL, NULL);
    if (!d->to_rgb)
        return fail(d, GHC_EFORMAT, "cannot convert its pixel format %s to RGB",
                    av_get_pix_fmt_name(f->format) ? av_get_pix_fmt_name(f->format) : "?");
    /* swscale's SIMD stores run past a row's end: rows padded to 64 bytes, and 64 more after */
    d->src_stride = (f->width * 3 + 63) / 64 * 64;
    if (grow(&d->src, &d->src_cap, (size_t)d->src_stride * f->height + 64) < 0)
        return fail(d, GHC_ENOMEM, "out of memory for a %dx%d frame", f->width, f->height);
    uint8_t *const out[4] = { d->src, NULL, NULL, NULL };
    const int ls[4] = { d->src_stride, 0, 0, 0 };
    if (sws_scale(d->to_rgb, (const uint8_t *const *)f->data, f->linesize, 0, f->height, out, ls) != f->height)
        return fail(d, GHC_EFORMAT, "cannot convert a frame to RGB");
    return 0;
}

/* The "too short" line: "5 frames (after fps conversion), too short for target_frames 9, 17". */
static int too_short(ghc_media_decoder_t *d, const struct ghc_media_settings *s, int64_t n)
{
    int32_t t[GHC_MEDIA_MAX_TARGETS];
    int nt = ghc_media_target_frames(s->target_frames, s->n_target_frames, t);
    char list[GHC_MEDIA_MAX_TARGETS * 8] = "";
    for (int i = 0; i < nt; i++)
        snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%d", i ? ", " : "", (int)t[i]);
    return fail(d, GHC_EFORMAT, "%lld frame%s%s, too short for target_frames %s (frame_extraction %s)",
                (long long)n, n == 1 ? "" : "s", s->source_fps > 0 ? " after fps conversion" : "", list,
                ghc_media_extraction_name(s->frame_extraction));
}

int ghc_media_decoder_read(ghc_media_decoder_t *d, const struct ghc_media_settings *s, struct ghc_media_frames *out)
{
    int rc;
    char why[256];
    memset(out, 0, sizeof(*out));
    d->err[0] = '\0';
    if (!d->path)
        return fail(d, GHC_EINVAL, "no file opened (ghc_media_decoder_open)");
    if ((d->used || !d->fmt) && (rc = ghc_media_decoder_open(d, d->path, NULL)) < 0)
        return rc;
    d->used = true;
    bool image = d->kind == GHC_MEDIA_IMAGE;
    int32_t t[GHC_MEDIA_MAX_TARGETS];
    int nt = s ? ghc_media_target_frames(s->target_frames, s->n_target_frames, t) : 0;
    if (s && (nt < 1 || s->width < 1 || s->height < 1))
        return fail(d, GHC_EINVAL, "bad settings: %d target_frames, resolution %dx%d", nt, (int)s->width,
                    (int)s->height);
    /* how much to decode: head stops at the first (fps-converted) index past max(target_frames),
     * as musubi-tuner; full needs max_frames frames at most; an image one */
    int64_t index_limit = -1, count_limit = image ? 1 : -1;
    if (s && !image) {
        enum ghc_media_extraction m = s->frame_extraction;
        if (m == GHC_MEDIA_HEAD || (m == GHC_MEDIA_UNIFORM && s->frame_sample <= 1))
            index_limit = t[nt - 1];
        else if (m == GHC_MEDIA_FULL)
            count_limit = s->max_frames;
    }
    bool fps = s && !image && s->source_fps > 0 && s->target_fps > 0;
    double delta = fps ? s->target_fps / s->source_fps : 1.0, acc = 0.0;
    int64_t prev = -1, seen = 0, n = 0;
    int32_t bw = 0, bh = 0, sw = 0, sh = 0, left = -1, top = -1;
    for (;;) {
        int r = next_frame(d);
        if (r < 0)
            return fail(d, GHC_EFORMAT, "decoding failed after %lld frame%s: %s", (long long)seen,
                        seen == 1 ? "" : "s", av_reason(r, why, sizeof(why)));
        if (r == 0)
            break;
        seen++;
        int64_t index = seen - 1;
        if (fps) {     /* keep frame i iff int(sum of delta) moved on; the sum as a float */
            index = (int64_t)acc;
            acc += delta;
            if (index == prev)
                continue;
            prev = index;
        }
        if ((index_limit >= 0 && index >= index_limit) || (count_limit >= 0 && n >= count_limit))
            break;
        if ((rc = frame_to_rgb(d)) < 0)
            return rc;
        int32_t fw = d->frame->width, fh = d->frame->height;
        if (n == 0) {
            sw = fw, sh = fh;
            bw = fw, bh = fh;
            if (s) {
                rc = image ? ghc_media_bucket_select(s->width, s->height, s->enable_bucket, s->bucket_no_upscale,
                                                     fw, fh, &bw, &bh)
                           : ghc_media_bucket_select(s->width, s->height, true, false, fw, fh, &bw, &bh);
                if (rc == GHC_EFORMAT)
                    return fail(d, rc, "%dx%d is too small for bucket_no_upscale (sides of 16 or more)", fw, fh);
                if (rc < 0)
                    return fail(d, rc, "no bucket for %dx%d at resolution %dx%d", fw, fh, (int)s->width,
                                (int)s->height);
            }
        } else if (!s && (fw != sw || fh != sh)) {
            return fail(d, GHC_EFORMAT, "frame %lld is %dx%d, the first %dx%d (read without settings, "
                        "frames are not resized)", (long long)n, fw, fh, (int)sw, (int)sh);
        }
        size_t fb = (size_t)bw * bh * 3;
        if ((size_t)(n + 1) * fb > d->rgb_cap) {
            size_t want = d->rgb_cap * 2 > (size_t)(n + 1) * fb ? d->rgb_cap * 2 : (size_t)(n + 1) * fb;
            if (grow(&d->rgb, &d->rgb_cap, want) < 0)
                return fail(d, GHC_ENOMEM, "out of memory for %lld frames of %dx%d", (long long)(n + 1),
                            (int)bw, (int)bh);
        }
        if (n == 0) {   /* one corner for all the frames: the first one's geometry */
            left = top = -1;
            if (s && d->crop_random) {
                int32_t rw, rh;
                ghc_media_fit(fw, fh, bw, bh, &rw, &rh, NULL, NULL);
                ghc_media_crop_draw(d->crop_seed, rw, rh, bw, bh, &left, &top);
            }
        }
        if ((rc = ghc_media_resize_into(d->src, fw, fh, d->src_stride, d->rgb + (size_t)n * fb, bw, bh, left, top,
                                        &d->scratch, &d->scratch_cap)) < 0)
            return fail(d, rc, "cannot resize %dx%d to %dx%d", fw, fh, (int)bw, (int)bh);
        n++;
    }
    if (n == 0)
        return fail(d, GHC_EFORMAT, "no frame could be decoded%s", seen ? " (all dropped by the fps conversion)" : "");
    int64_t nc = 1;
    if (s && !image)
        nc = ghc_media_clips(s, n, NULL, 0);
    if (nc == 0)
        return too_short(d, s, n);
    if (nc > d->clips_cap) {
        struct ghc_media_clip *c = realloc(d->clips, (size_t)nc * sizeof(*c));
        if (!c)
            return fail(d, GHC_ENOMEM, "out of memory for %lld clips", (long long)nc);
        d->clips = c;
        d->clips_cap = nc;
    }
    if (s && !image)
        ghc_media_clips(s, n, d->clips, nc);
    else
        d->clips[0] = (struct ghc_media_clip){ 0, (int32_t)n };
    out->width = bw;
    out->height = bh;
    out->src_width = sw;
    out->src_height = sh;
    out->frames = n;
    out->rgb = d->rgb;
    out->n_clips = nc;
    out->clips = d->clips;
    return 0;
}

void ghc_media_decoder_crop(ghc_media_decoder_t *d, bool random, uint64_t seed)
{
    d->crop_random = random;
    d->crop_seed = seed;
}

#else /* !GHC_HAVE_FFMPEG */

struct ghc_media_decoder {
    char err[GHC_ERROR_MAX];
};

ghc_media_decoder_t *ghc_media_decoder_init(int threads)
{
    return calloc(1, sizeof(ghc_media_decoder_t));
}

void ghc_media_decoder_free(ghc_media_decoder_t *d)
{
    free(d);
}

const char *ghc_media_decoder_error(const ghc_media_decoder_t *d)
{
    return d ? d->err : "";
}

int ghc_media_decoder_open(ghc_media_decoder_t *d, const char *path, struct ghc_media_info *info)
{
    char q[4096];
    snprintf(d->err, sizeof(d->err), "media: %s: cannot decode: this gh200core was " NO_FFMPEG,
             ghc_path_quote(path, q, sizeof(q)));
    return GHC_EUNSUPPORTED;
}

int ghc_media_decoder_read(ghc_media_decoder_t *d, const struct ghc_media_settings *s, struct ghc_media_frames *out)
{
    memset(out, 0, sizeof(*out));
    snprintf(d->err, sizeof(d->err), "media: cannot decode: this gh200core was " NO_FFMPEG);
    return GHC_EUNSUPPORTED;
}

void ghc_media_decoder_crop(ghc_media_decoder_t *d, bool random, uint64_t seed)
{
    (void)d, (void)random, (void)seed;
}

#endif
