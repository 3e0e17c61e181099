/* rope.cuh: Wan's RoPE angles on the device (rope.cu's ghc_op_rope, norm.cu's fused
 * ghc_op_rmsnorm_rope_*), computed as kernels/cpu/rope.c computes them. */
#pragma once

/* cs[0], cs[1] = cos, +-sin of pair p (p < Dh / 2) of token l of an (f, hh, ww) grid: angles,
 * cos and sin in f64, rounded to f32. */
__device__ __forceinline__ void ghc_rope_angle(float *cs, int p, int Dh, int64_t l, int64_t hh, int64_t ww, bool inverse)
{
    const int64_t pos_t = l / (hh * ww), pos_h = (l / ww) % hh, pos_w = l % ww;
    const int d_hw = 2 * (Dh / 6), d_t = Dh - 2 * d_hw;
    int j, d_axis;
    int64_t pos;
    if (2 * p < d_t) {
        j = p, d_axis = d_t, pos = pos_t;
    } else if (2 * p < d_t + d_hw) {
        j = p - d_t / 2, d_axis = d_hw, pos = pos_h;
    } else {
        j = p - (d_t + d_hw) / 2, d_axis = d_hw, pos = pos_w;
    }
    double theta = (double)pos * pow(10000.0, -2.0 * (double)j / (double)d_axis);
    double sn, cn;
    sincos(theta, &sn, &cn);
    cs[0] = (float)cn;
    cs[1] = (float)(inverse ? -sn : sn);
}

/* The Dh / 2 pairs of token l into cs[2p], cs[2p + 1]; the block's threads share the pairs. */
__device__ __forceinline__ void ghc_rope_angles(float *cs, int Dh, int64_t l, int64_t hh, int64_t ww, bool inverse)
{
    for (int p = threadIdx.x; p < Dh / 2; p += blockDim.x)
        ghc_rope_angle(cs + 2 * p, p, Dh, l, hh, ww, inverse);
}

/* The rotation of one pair (a, b) by (c, s). */
__device__ __forceinline__ void ghc_rope_rotate(float &a, float &b, float c, float s)
{
    const float x0 = a, x1 = b;
    a = x0 * c - x1 * s;
    b = x0 * s + x1 * c;
}
