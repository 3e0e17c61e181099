/* media_resize.c: resize and centre crop to a bucket (media.h), the two filters musubi-tuner
 * uses, written here so that the pixels are the same as its own: enlarging as Pillow's
 * Image.resize(LANCZOS) computes it (a Lanczos-3 kernel, coefficients normalised per output
 * pixel and rounded to 22-bit fixed point, the horizontal pass first into 8-bit rows, then the
 * vertical pass), shrinking as OpenCV's resize(INTER_AREA) computes it (area coverage weights in
 * float, rows weighted in the order OpenCV adds them; an integer factor averages whole blocks).
 * No FFmpeg needed. */
#include <config.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/media.h>

#include "media_impl.h"

/* ---- enlarging: Pillow's LANCZOS --------------------------------------------------------------- */

#define PREC 22                        /* Pillow's PRECISION_BITS for 8-bit pictures: 32 - 8 - 2 */

static double sinc(double x)
{
    if (x == 0.0)
        return 1.0;
    x *= M_PI;
    return sin(x) / x;
}

static double lanczos3(double x)
{
    return x >= -3.0 && x < 3.0 ? sinc(x) * sinc(x / 3.0) : 0.0;
}

/* Per output pixel of one axis (in -> out): the first input index, how many, and the fixed-point
 * weights (ksize per pixel). Returns ksize, or -1 out of memory. */
static int lanczos_coeffs(int in, int out, int **bounds, int32_t **kk)
{
    double scale = (double)in / out, fscale = scale < 1.0 ? 1.0 : scale;
    double support = 3.0 * fscale;
    int ksize = (int)ceil(support) * 2 + 1;
    double *k = malloc((size_t)out * ksize * sizeof(double));
    *bounds = malloc((size_t)out * 2 * sizeof(int));
    *kk = malloc((size_t)out * ksize * sizeof(int32_t));
    if (!k || !*bounds || !*kk) {
        free(k);
        return -1;
    }
    for (int xx = 0; xx < out; xx++) {
        double center = (xx + 0.5) * scale, ww = 0.0, ss = 1.0 / fscale;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        if (xmin < 0)
            xmin = 0;
        if (xmax > in)
            xmax = in;
        xmax -= xmin;
        double *kx = k + (size_t)xx * ksize;
        for (int x = 0; x < xmax; x++) {
            kx[x] = lanczos3((x + xmin - center + 0.5) * ss);
            ww += kx[x];
        }
        for (int x = 0; x < ksize; x++) {
            double v = x < xmax ? (ww != 0.0 ? kx[x] / ww : kx[x]) : 0.0;
            (*kk)[(size_t)xx * ksize + x] = (int32_t)(v < 0 ? -0.5 + v * (1 << PREC) : 0.5 + v * (1 << PREC));
        }
        (*bounds)[2 * xx] = xmin;
        (*bounds)[2 * xx + 1] = xmax;
    }
    free(k);
    return ksize;
}

static uint8_t clip8(int32_t v)
{
    v >>= PREC;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* One 8-bit plane w x h -> W x H (planes packed, `cn` bytes apart: 3 for RGB24). */
static int lanczos_plane(const uint8_t *src, int w, int h, ptrdiff_t stride, int cn, uint8_t *dst, int W, int H,
                         ptrdiff_t dstride)
{
    int *bh = NULL, *bv = NULL, rc = -1;
    int32_t *kh = NULL, *kv = NULL;
    uint8_t *tmp = NULL;
    int ksh = lanczos_coeffs(w, W, &bh, &kh), ksv = lanczos_coeffs(h, H, &bv, &kv);
    if (ksh < 0 || ksv < 0)
        goto out;
    /* the rows the vertical pass reads, resampled horizontally into 8-bit rows */
    int y0 = bv[0], y1 = bv[2 * (H - 1)] + bv[2 * (H - 1) + 1];
    if (!(tmp = malloc((size_t)(y1 - y0) * W * cn)))
        goto out;
    for (int y = y0; y < y1; y++) {
        const uint8_t *s = src + y * stride;
        uint8_t *o = tmp + (size_t)(y - y0) * W * cn;
        for (int xx = 0; xx < W; xx++) {
            const int32_t *k = kh + (size_t)xx * ksh;
            int xmin = bh[2 * xx], n = bh[2 * xx + 1];
            for (int c = 0; c < cn; c++) {
                int32_t ss = 1 << (PREC - 1);
                for (int x = 0; x < n; x++)
                    ss += s[(x + xmin) * cn + c] * k[x];
                o[xx * cn + c] = clip8(ss);
            }
        }
    }
    for (int yy = 0; yy < H; yy++) {
        const int32_t *k = kv + (size_t)yy * ksv;
        int ymin = bv[2 * yy] - y0, n = bv[2 * yy + 1];
        uint8_t *o = dst + yy * dstride;
        for (int xx = 0; xx < W * cn; xx++) {
            int32_t ss = 1 << (PREC - 1);
            for (int y = 0; y < n; y++)
                ss += tmp[(size_t)(y + ymin) * W * cn + xx] * k[y];
            o[xx] = clip8(ss);
        }
    }
    rc = 0;
out:
    free(tmp);
    free(bh);
    free(bv);
    free(kh);
    free(kv);
    return rc;
}

/* ---- shrinking: OpenCV's INTER_AREA -------------------------------------------------------------- */

struct area_tab {
    int   di, si;
    float alpha;
};

/* OpenCV's area table of one axis: for each output index, the input cells it covers and the
 * share of each. Returns the number of entries (at most 2 * in). */
static int area_tab(int in, int out, double scale, struct area_tab *tab)
{
    int k = 0;
    for (int dx = 0; dx < out; dx++) {
        double fsx1 = dx * scale, fsx2 = fsx1 + scale;
        double cell = scale < in - fsx1 ? scale : in - fsx1;
        int sx1 = (int)ceil(fsx1), sx2 = (int)floor(fsx2);
        if (sx2 > in - 1)
            sx2 = in - 1;
        if (sx1 > sx2)
            sx1 = sx2;
        if (sx1 - fsx1 > 1e-3)
            tab[k++] = (struct area_tab){ dx, sx1 - 1, (float)((sx1 - fsx1) / cell) };
        for (int sx = sx1; sx < sx2; sx++)
            tab[k++] = (struct area_tab){ dx, sx, (float)(1.0 / cell) };
        if (fsx2 - sx2 > 1e-3) {
            double a = fsx2 - sx2 < 1.0 ? fsx2 - sx2 : 1.0;
            tab[k++] = (struct area_tab){ dx, sx2, (float)((a < cell ? a : cell) / cell) };
        }
    }
    return k;
}

static uint8_t round8(float v)
{
    long r = lrintf(v);
    return (uint8_t)(r < 0 ? 0 : r > 255 ? 255 : r);
}

/* Packed cn-channel w x h -> W x H by area, as OpenCV. */
static int area_resize(const uint8_t *src, int w, int h, ptrdiff_t stride, int cn, uint8_t *dst, int W, int H,
                       ptrdiff_t dstride)
{
    double sx = (double)w / W, sy = (double)h / H;
    int ix = (int)sx, iy = (int)sy;
    if (sx == ix && sy == iy) {
        /* whole blocks: the sum of ix x iy pixels, then (2 x 2) (s + 2) >> 2 or s * (1 / area) rounded */
        float inv = 1.f / (float)(ix * iy);
        int *acc = malloc((size_t)W * cn * sizeof(int));
        if (!acc)
            return -1;
        for (int yy = 0; yy < H; yy++) {
            memset(acc, 0, (size_t)W * cn * sizeof(int));
            for (int j = 0; j < iy; j++) {
                const uint8_t *row = src + (yy * iy + j) * stride;
                for (int xx = 0; xx < W; xx++)
                    for (int i = 0; i < ix; i++)
                        for (int c = 0; c < cn; c++)
                            acc[xx * cn + c] += row[(xx * ix + i) * cn + c];
            }
            uint8_t *o = dst + yy * dstride;
            for (int x = 0; x < W * cn; x++)
                o[x] = ix == 2 && iy == 2 ? (uint8_t)((acc[x] + 2) >> 2) : round8((float)acc[x] * inv);
        }
        free(acc);
        return 0;
    }
    struct area_tab *xt = malloc((size_t)2 * w * sizeof(*xt)), *yt = malloc((size_t)2 * h * sizeof(*yt));
    float *buf = malloc((size_t)W * cn * sizeof(float)), *sum = malloc((size_t)W * cn * sizeof(float));
    int rc = -1;
    if (!xt || !yt || !buf || !sum)
        goto out;
    int nx = area_tab(w, W, sx, xt), ny = area_tab(h, H, sy, yt);
    for (int j = 0; j < ny;) {
        int dy = yt[j].di;
        for (int x = 0; x < W * cn; x++)
            sum[x] = 0.f;
        for (; j < ny && yt[j].di == dy; j++) {
            const uint8_t *s = src + yt[j].si * stride;
            float beta = yt[j].alpha;
            for (int x = 0; x < W * cn; x++)
                buf[x] = 0.f;
            for (int k = 0; k < nx; k++) {
                const uint8_t *sp = s + xt[k].si * cn;
                float *bp = buf + xt[k].di * cn, a = xt[k].alpha;
                for (int c = 0; c < cn; c++)
                    bp[c] = bp[c] + (float)sp[c] * a;
            }
            for (int x = 0; x < W * cn; x++)
                sum[x] += beta * buf[x];
        }
        uint8_t *o = dst + dy * dstride;
        for (int x = 0; x < W * cn; x++)
            o[x] = round8(sum[x]);
    }
    rc = 0;
out:
    free(xt);
    free(yt);
    free(buf);
    free(sum);
    return rc;
}

/* ---- resize and crop ----------------------------------------------------------------------------- */

int ghc_media_resize_into(const uint8_t *src, int32_t w, int32_t h, ptrdiff_t stride, uint8_t *dst, int32_t bw,
                          int32_t bh, int32_t left, int32_t top, uint8_t **scratch, size_t *cap)
{
    int32_t rw, rh, cl, ct;
    if (!src || !dst || w < 1 || h < 1 || bw < 1 || bh < 1)
        return GHC_EINVAL;
    ghc_media_fit(w, h, bw, bh, &rw, &rh, &cl, &ct);
    if (rw < bw || rh < bh)
        return GHC_EINVAL;
    if (left < 0)
        left = cl, top = ct;
    left = left > rw - bw ? rw - bw : left;   /* a corner drawn for another frame's size */
    top = top < 0 ? 0 : top > rh - bh ? rh - bh : top;
    if (rw == w && rh == h) {
        for (int32_t y = 0; y < bh; y++)
            memcpy(dst + (size_t)y * bw * 3, src + (y + top) * stride + (size_t)left * 3, (size_t)bw * 3);
        return 0;
    }
    size_t need = (size_t)rw * rh * 3;
    if (need > *cap) {
        uint8_t *p = realloc(*scratch, need);
        if (!p)
            return GHC_ENOMEM;
        *scratch = p;
        *cap = need;
    }
    double scale = (double)bw / w > (double)bh / h ? (double)bw / w : (double)bh / h;
    int r = scale > 1.0 ? lanczos_plane(src, w, h, stride, 3, *scratch, rw, rh, (ptrdiff_t)rw * 3)
                        : area_resize(src, w, h, stride, 3, *scratch, rw, rh, (ptrdiff_t)rw * 3);
    if (r < 0)
        return GHC_ENOMEM;
    for (int32_t y = 0; y < bh; y++)
        memcpy(dst + (size_t)y * bw * 3, *scratch + ((size_t)(y + top) * rw + left) * 3, (size_t)bw * 3);
    return 0;
}

int ghc_media_resize_crop(const uint8_t *src, int32_t w, int32_t h, ptrdiff_t stride, uint8_t *dst, int32_t bw,
                          int32_t bh)
{
    uint8_t *scratch = NULL;
    size_t cap = 0;
    int rc = ghc_media_resize_into(src, w, h, stride, dst, bw, bh, -1, -1, &scratch, &cap);
    free(scratch);
    return rc;
}

/* splitmix64's finaliser: a seed's bits spread over the word. */
static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void ghc_media_crop_draw(uint64_t seed, int32_t rw, int32_t rh, int32_t bw, int32_t bh, int32_t *left, int32_t *top)
{
    uint64_t a = mix64(seed), b = mix64(a);
    *left = rw > bw ? (int32_t)(a % (uint64_t)(rw - bw + 1)) : 0;
    *top = rh > bh ? (int32_t)(b % (uint64_t)(rh - bh + 1)) : 0;
}
