/* media_write.h: writing media with libavcodec and libavformat at test time (test_media,
 * test_prepare), so that no ffmpeg program is needed. With FFmpeg only (GHC_HAVE_FFMPEG). */
#ifndef GHC_TESTS_MEDIA_WRITE_H
#define GHC_TESTS_MEDIA_WRITE_H

#ifdef GHC_HAVE_FFMPEG
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libswscale/swscale.h>

/* ---- writing media with libavcodec ------------------------------------------------------------ */

typedef void (*tu_fill_fn)(int k, int w, int h, uint8_t *rgb);   /* frame k as packed RGB24 */

/* Encode n frames (pts in 1/1000 s from `pts_ms`, else k / fps) into `path`. */
static inline void tu_write_video(const char *path, const char *muxer, enum AVCodecID id, enum AVPixelFormat pix, int w, int h,
                        int n, int fps, const int64_t *pts_ms, tu_fill_fn fill)
{
    AVFormatContext *oc = NULL;
    ck_assert_int_ge(avformat_alloc_output_context2(&oc, NULL, muxer, path), 0);
    const AVCodec *codec = avcodec_find_encoder(id);
    ck_assert_ptr_nonnull(codec);
    AVStream *st = avformat_new_stream(oc, NULL);
    AVCodecContext *c = avcodec_alloc_context3(codec);
    c->width = w;
    c->height = h;
    c->pix_fmt = pix;
    c->time_base = pts_ms ? (AVRational){ 1, 1000 } : (AVRational){ 1, fps };
    c->framerate = (AVRational){ fps, 1 };
    c->gop_size = 4;
    c->max_b_frames = 0;
    if (id == AV_CODEC_ID_MPEG4) {
        c->flags |= AV_CODEC_FLAG_QSCALE;
        c->global_quality = FF_QP2LAMBDA * 2;
    }
    if (oc->oformat->flags & AVFMT_GLOBALHEADER)
        c->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    ck_assert_int_ge(avcodec_open2(c, codec, NULL), 0);
    ck_assert_int_ge(avcodec_parameters_from_context(st->codecpar, c), 0);
    st->time_base = c->time_base;
    ck_assert_int_ge(avio_open(&oc->pb, path, AVIO_FLAG_WRITE), 0);
    ck_assert_int_ge(avformat_write_header(oc, NULL), 0);
    AVFrame *fr = av_frame_alloc();
    fr->format = pix;
    fr->width = w;
    fr->height = h;
    ck_assert_int_ge(av_frame_get_buffer(fr, 0), 0);
    struct SwsContext *sws = sws_getContext(w, h, AV_PIX_FMT_RGB24, w, h, pix, SWS_BILINEAR, NULL, NULL, NULL);
    uint8_t *rgb = malloc((size_t)w * h * 3 + 64);   /* swscale's SIMD loads read past the end */
    AVPacket *pkt = av_packet_alloc();
    for (int k = 0; k <= n; k++) {
        if (k < n) {
            ck_assert_int_ge(av_frame_make_writable(fr), 0);
            fill(k, w, h, rgb);
            const uint8_t *in[4] = { rgb, NULL, NULL, NULL };
            const int ls[4] = { w * 3, 0, 0, 0 };
            sws_scale(sws, in, ls, 0, h, fr->data, fr->linesize);
            fr->pts = pts_ms ? pts_ms[k] : k;
        }
        ck_assert_int_ge(avcodec_send_frame(c, k < n ? fr : NULL), 0);
        while (avcodec_receive_packet(c, pkt) == 0) {
            if (!pts_ms)
                pkt->duration = 1;
            av_packet_rescale_ts(pkt, c->time_base, st->time_base);
            pkt->stream_index = st->index;
            ck_assert_int_ge(av_interleaved_write_frame(oc, pkt), 0);
        }
    }
    ck_assert_int_ge(av_write_trailer(oc), 0);
    avio_closep(&oc->pb);
    av_packet_free(&pkt);
    free(rgb);
    sws_freeContext(sws);
    av_frame_free(&fr);
    avcodec_free_context(&c);
    avformat_free_context(oc);
}

/* One picture as a file (PNG or JPEG packets are whole files); `px` packed in `pix`
 * (rgb24 / rgba), converted when the codec needs another format. */
static inline void tu_write_image(const char *path, enum AVCodecID id, enum AVPixelFormat in_pix, enum AVPixelFormat pix,
                        int w, int h, const uint8_t *px)
{
    const AVCodec *codec = avcodec_find_encoder(id);
    ck_assert_ptr_nonnull(codec);
    AVCodecContext *c = avcodec_alloc_context3(codec);
    c->width = w;
    c->height = h;
    c->pix_fmt = pix;
    c->time_base = (AVRational){ 1, 25 };
    if (id == AV_CODEC_ID_MJPEG) {
        c->flags |= AV_CODEC_FLAG_QSCALE;
        c->global_quality = FF_QP2LAMBDA * 2;
        c->color_range = AVCOL_RANGE_JPEG;
    }
    ck_assert_int_ge(avcodec_open2(c, codec, NULL), 0);
    AVFrame *fr = av_frame_alloc();
    fr->format = pix;
    fr->width = w;
    fr->height = h;
    ck_assert_int_ge(av_frame_get_buffer(fr, 0), 0);
    int bpp = in_pix == AV_PIX_FMT_RGBA ? 4 : 3;
    struct SwsContext *sws = sws_getContext(w, h, in_pix, w, h, pix, SWS_BILINEAR, NULL, NULL, NULL);
    uint8_t *padded = calloc(1, (size_t)w * h * bpp + 64);   /* swscale's SIMD loads read past the end */
    memcpy(padded, px, (size_t)w * h * bpp);
    const uint8_t *in[4] = { padded, NULL, NULL, NULL };
    const int ls[4] = { w * bpp, 0, 0, 0 };
    sws_scale(sws, in, ls, 0, h, fr->data, fr->linesize);
    free(padded);
    AVPacket *pkt = av_packet_alloc();
    ck_assert_int_ge(avcodec_send_frame(c, fr), 0);
    ck_assert_int_ge(avcodec_send_frame(c, NULL), 0);
    ck_assert_int_eq(avcodec_receive_packet(c, pkt), 0);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fwrite(pkt->data, 1, (size_t)pkt->size, f);
    fclose(f);
    av_packet_free(&pkt);
    sws_freeContext(sws);
    av_frame_free(&fr);
    avcodec_free_context(&c);
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
