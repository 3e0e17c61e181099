/* media_write.c: writing media for media.h with FFmpeg's libraries (libavformat, libavcodec,
 * libswscale): the embedded demo's generated dataset and the test suites' media, so that no
 * ffmpeg program is needed. The codec follows the file's extension; every choice is lossless or
 * nearly so and in every Debian FFmpeg (FFV1, PNG; MPEG-4 Part 2 and JPEG at quantiser 2), and
 * the bytes are a function of the pictures alone (FFmpeg's bit-exact mode: no muxer version,
 * time or random id), so that `prepare`'s content hash sees an unchanged file. Built without
 * FFmpeg (GHC_HAVE_FFMPEG undefined) both calls return GHC_EUNSUPPORTED. */
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <gh200core/media.h>

#include "media_impl.h"

#ifdef GHC_HAVE_FFMPEG

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libswscale/swscale.h>

/* ---- shared --------------------------------------------------------------------------------- */

/* The extension of path ("" when none), without the dot. */
static const char *ext_of(const char *path)
{
    const char *base = strrchr(path, '/'), *dot;
    base = base ? base + 1 : path;
    dot = strrchr(base, '.');
    return dot && dot != base ? dot + 1 : "";
}

static int av_fail(ghc_core_t *core, const char *path, const char *what, int averr)
{
    char why[256];
    if (av_strerror(averr, why, sizeof(why)) < 0)
        snprintf(why, sizeof(why), "FFmpeg error %d", averr);
    return ghc_error_set(core, averr == AVERROR(ENOMEM) ? GHC_ENOMEM : GHC_EIO, "media: %s: %s: %s", path, what, why);
}

/* An encoder for w x h pictures in `pix`, opened; NULL with the core's error set. */
static AVCodecContext *encoder_open(ghc_core_t *core, const char *path, enum AVCodecID id, enum AVPixelFormat pix,
                                    int w, int h, AVRational tb, AVRational fps, bool global_header)
{
    const AVCodec *codec = avcodec_find_encoder(id);
    AVCodecContext *c = codec ? avcodec_alloc_context3(codec) : NULL;
    if (!c) {
        ghc_error_set(core, codec ? GHC_ENOMEM : GHC_EUNSUPPORTED, "media: %s: this FFmpeg has no %s encoder", path,
                      avcodec_get_name(id));
        return NULL;
    }
    c->width = w;
    c->height = h;
    c->pix_fmt = pix;
    c->time_base = tb;
    c->framerate = fps;
    c->gop_size = 4;
    c->max_b_frames = 0;
    c->thread_count = 1;
    c->flags |= AV_CODEC_FLAG_BITEXACT;
    if (id == AV_CODEC_ID_MPEG4 || id == AV_CODEC_ID_MJPEG) {
        c->flags |= AV_CODEC_FLAG_QSCALE;
        c->global_quality = FF_QP2LAMBDA * 2;
    }
    if (id == AV_CODEC_ID_MJPEG)
        c->color_range = AVCOL_RANGE_JPEG;
    if (global_header)
        c->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    int e = avcodec_open2(c, codec, NULL);
    if (e < 0) {
        av_fail(core, path, "cannot open the encoder", e);
        avcodec_free_context(&c);
    }
    return c;
}

/* A frame of `pix` made from packed pictures of `in_pix` (converted by libswscale). */
struct converter {
    AVFrame           *frame;
    struct SwsContext *sws;
    uint8_t           *padded;     /* swscale's SIMD loads read past the end of a picture */
    int                w, h, bpp;
};

static int converter_init(struct converter *cv, enum AVPixelFormat in_pix, enum AVPixelFormat pix, int w, int h)
{
    cv->w = w;
    cv->h = h;
    cv->bpp = in_pix == AV_PIX_FMT_RGBA ? 4 : 3;
    cv->frame = av_frame_alloc();
    cv->sws = sws_getContext(w, h, in_pix, w, h, pix, SWS_BILINEAR, NULL, NULL, NULL);
    cv->padded = calloc(1, (size_t)w * (size_t)h * (size_t)cv->bpp + 64);
    if (!cv->frame || !cv->sws || !cv->padded)
        return AVERROR(ENOMEM);
    cv->frame->format = pix;
    cv->frame->width = w;
    cv->frame->height = h;
    return av_frame_get_buffer(cv->frame, 0);
}

static int converter_run(struct converter *cv, const uint8_t *px)
{
    int e = av_frame_make_writable(cv->frame);
    if (e < 0)
        return e;
    memcpy(cv->padded, px, (size_t)cv->w * (size_t)cv->h * (size_t)cv->bpp);
    const uint8_t *in[4] = { cv->padded, NULL, NULL, NULL };
    const int ls[4] = { cv->w * cv->bpp, 0, 0, 0 };
    sws_scale(cv->sws, in, ls, 0, cv->h, cv->frame->data, cv->frame->linesize);
    return 0;
}

static void converter_free(struct converter *cv)
{
    free(cv->padded);
    sws_freeContext(cv->sws);
    av_frame_free(&cv->frame);
}

/* ---- video ---------------------------------------------------------------------------------- */

int ghc_media_write_video(ghc_core_t *core, const char *path, const uint8_t *rgb, int32_t frames, int32_t width,
                          int32_t height, int32_t fps, const int64_t *pts_ms)
{
    const char *ext = ext_of(path), *muxer;
    enum AVCodecID id;
    enum AVPixelFormat pix;
    if (!strcasecmp(ext, "mkv"))
        muxer = "matroska", id = AV_CODEC_ID_FFV1, pix = AV_PIX_FMT_BGR0;
    else if (!strcasecmp(ext, "mp4"))
        muxer = "mp4", id = AV_CODEC_ID_MPEG4, pix = AV_PIX_FMT_YUV420P;
    else
        return ghc_error_set(core, GHC_EINVAL, "media: %s: cannot write videos as '.%s' (.mkv: FFV1, .mp4: MPEG-4)",
                             path, ext);
    if (frames < 1 || width < 1 || height < 1 || fps < 1 || !rgb)
        return ghc_error_set(core, GHC_EINVAL, "media: %s: %d frames of %d x %d at %d fps: each must be at least 1",
                             path, (int)frames, (int)width, (int)height, (int)fps);
    if (id == AV_CODEC_ID_MPEG4 && (width % 2 || height % 2))
        return ghc_error_set(core, GHC_EINVAL, "media: %s: MPEG-4 in 4:2:0 needs an even width and height, not %d x %d",
                             path, (int)width, (int)height);
    AVFormatContext *oc = NULL;
    AVCodecContext *c = NULL;
    AVPacket *pkt = av_packet_alloc();
    struct converter cv = { 0 };
    int rc = 0, e = avformat_alloc_output_context2(&oc, NULL, muxer, path);
    if (e < 0 || !pkt) {
        rc = av_fail(core, path, "cannot start the file", e < 0 ? e : AVERROR(ENOMEM));
        goto out;
    }
    oc->flags |= AVFMT_FLAG_BITEXACT;
    AVRational tb = pts_ms ? (AVRational){ 1, 1000 } : (AVRational){ 1, fps };
    if (!(c = encoder_open(core, path, id, pix, width, height, tb, (AVRational){ fps, 1 },
                           (oc->oformat->flags & AVFMT_GLOBALHEADER) != 0))) {
        rc = ghc_error_code(core);
        goto out;
    }
    AVStream *st = avformat_new_stream(oc, NULL);
    if (!st || (e = avcodec_parameters_from_context(st->codecpar, c)) < 0) {
        rc = av_fail(core, path, "cannot add the stream", st ? e : AVERROR(ENOMEM));
        goto out;
    }
    st->time_base = c->time_base;
    if ((e = converter_init(&cv, AV_PIX_FMT_RGB24, pix, width, height)) < 0) {
        rc = av_fail(core, path, "cannot convert the pictures", e);
        goto out;
    }
    if ((e = avio_open(&oc->pb, path, AVIO_FLAG_WRITE)) < 0) {
        rc = av_fail(core, path, "cannot create", e);
        goto out;
    }
    if ((e = avformat_write_header(oc, NULL)) < 0) {
        rc = av_fail(core, path, "cannot write", e);
        goto out_close;
    }
    size_t frame_bytes = (size_t)width * (size_t)height * 3;
    for (int32_t k = 0; k <= frames && rc == 0; k++) {
        if (k < frames) {
            if ((e = converter_run(&cv, rgb + (size_t)k * frame_bytes)) < 0) {
                rc = av_fail(core, path, "cannot convert a picture", e);
                break;
            }
            cv.frame->pts = pts_ms ? pts_ms[k] : k;
        }
        if ((e = avcodec_send_frame(c, k < frames ? cv.frame : NULL)) < 0) {
            rc = av_fail(core, path, "cannot encode", e);
            break;
        }
        while (rc == 0 && avcodec_receive_packet(c, pkt) == 0) {
            if (!pts_ms)
                pkt->duration = 1;
            av_packet_rescale_ts(pkt, c->time_base, st->time_base);
            pkt->stream_index = st->index;
            if ((e = av_interleaved_write_frame(oc, pkt)) < 0)
                rc = av_fail(core, path, "cannot write", e);
        }
    }
    if (rc == 0 && (e = av_write_trailer(oc)) < 0)
        rc = av_fail(core, path, "cannot write", e);
out_close:
    avio_closep(&oc->pb);
    if (rc < 0)
        unlink(path);   /* no half-written file for a scan to find */
out:
    converter_free(&cv);
    av_packet_free(&pkt);
    avcodec_free_context(&c);
    avformat_free_context(oc);
    return rc;
}

/* ---- images --------------------------------------------------------------------------------- */

int ghc_media_write_image(ghc_core_t *core, const char *path, const uint8_t *px, int32_t width, int32_t height,
                          int32_t channels)
{
    const char *ext = ext_of(path);
    enum AVCodecID id;
    enum AVPixelFormat in_pix = channels == 4 ? AV_PIX_FMT_RGBA : AV_PIX_FMT_RGB24, pix;
    if (!strcasecmp(ext, "png"))
        id = AV_CODEC_ID_PNG, pix = in_pix;
    else if (!strcasecmp(ext, "jpg") || !strcasecmp(ext, "jpeg"))
        id = AV_CODEC_ID_MJPEG, pix = AV_PIX_FMT_YUVJ444P;
    else
        return ghc_error_set(core, GHC_EINVAL, "media: %s: cannot write images as '.%s' (.png, .jpg)", path, ext);
    if (width < 1 || height < 1 || !px || (channels != 3 && channels != 4) || (channels == 4 && id != AV_CODEC_ID_PNG))
        return ghc_error_set(core, GHC_EINVAL, "media: %s: a %d x %d picture of %d channels: 3 (RGB), or 4 (RGBA) for "
                             "PNG, and sides of at least 1 are expected", path, (int)width, (int)height, (int)channels);
    AVCodecContext *c = encoder_open(core, path, id, pix, width, height, (AVRational){ 1, 25 }, (AVRational){ 25, 1 },
                                     false);
    AVPacket *pkt = av_packet_alloc();
    struct converter cv = { 0 };
    FILE *f = NULL;
    int rc = 0, e;
    if (!c || !pkt) {
        rc = c ? ghc_error_set(core, GHC_ENOMEM, "media: %s: out of memory", path) : ghc_error_code(core);
        goto out;
    }
    if ((e = converter_init(&cv, in_pix, pix, width, height)) < 0 || (e = converter_run(&cv, px)) < 0) {
        rc = av_fail(core, path, "cannot convert the picture", e);
        goto out;
    }
    /* a PNG or JPEG packet is the whole file */
    if ((e = avcodec_send_frame(c, cv.frame)) < 0 || (e = avcodec_send_frame(c, NULL)) < 0 ||
        (e = avcodec_receive_packet(c, pkt)) < 0) {
        rc = av_fail(core, path, "cannot encode", e);
        goto out;
    }
    if (!(f = fopen(path, "wb")) || fwrite(pkt->data, 1, (size_t)pkt->size, f) != (size_t)pkt->size) {
        rc = ghc_error_set(core, GHC_EIO, "media: %s: cannot write: %s", path, strerror(errno));
        goto out;
    }
out:
    if (f && fclose(f) != 0 && rc == 0)
        rc = ghc_error_set(core, GHC_EIO, "media: %s: cannot write: %s", path, strerror(errno));
    if (f && rc < 0)
        unlink(path);
    converter_free(&cv);
    av_packet_free(&pkt);
    avcodec_free_context(&c);
    return rc;
}

#else /* !GHC_HAVE_FFMPEG */

int ghc_media_write_video(ghc_core_t *core, const char *path, const uint8_t *rgb, int32_t frames, int32_t width,
                          int32_t height, int32_t fps, const int64_t *pts_ms)
{
    return ghc_error_set(core, GHC_EUNSUPPORTED, "media: %s: cannot write: this gh200core was " NO_FFMPEG, path);
}

int ghc_media_write_image(ghc_core_t *core, const char *path, const uint8_t *px, int32_t width, int32_t height,
                          int32_t channels)
{
    return ghc_error_set(core, GHC_EUNSUPPORTED, "media: %s: cannot write: this gh200core was " NO_FFMPEG, path);
}

#endif
