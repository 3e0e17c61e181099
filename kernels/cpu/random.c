/* kernels/cpu/random.c: the Philox4x32-10 generator, fills, casts (with stochastic rounding
 * to bf16) and uniform/normal random tensors: the CPU reference the CUDA kernels match bit
 * for bit (except normals, which differ by the last-ulp error of the device's log/sin/cos).
 *
 * Stream layout (ops.h): element i of a call takes 32-bit lane i % 4 of the Philox block for
 * counter (lo32(n), hi32(n), 0, 0), n = offset + i / 4, key (lo32(seed), hi32(seed)).
 * Stochastic rounding of f32 x to bf16 with lane r: bf16 = (bits(x) + (r >> 16)) >> 16, i.e.
 * 16 random bits are added below the bf16 mantissa and the sum is truncated; this rounds the
 * magnitude up with probability equal to the discarded fraction. NaN stays NaN (rounded
 * normally), inf stays inf, and the largest finite values may round up to inf. */
#include <config.h>

#include <math.h>

#include "cpu.h"

/* ---- Philox4x32-10 ------------------------------------------------------------------------ */

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void ghc_philox4x32(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The four lanes of block n of the stream of `rng`. */
static void philox_block(const struct ghc_rng *rng, uint64_t n, uint32_t out[4])
{
    uint32_t ctr[4] = { (uint32_t)n, (uint32_t)(n >> 32), 0, 0 };
    uint32_t key[2] = { (uint32_t)rng->seed, (uint32_t)(rng->seed >> 32) };
    ghc_philox4x32(ctr, key, out);
}

/* ---- fill and cast ------------------------------------------------------------------------ */

int ghc_cpu_fill(ghc_tensor_t *t, double value)
{
    int64_t n = ghc_tensor_numel(t);
    enum ghc_dtype dt = ghc_tensor_dtype(t);
    void *p = ghc_tensor_data(t);
    unsigned char one[4];
    size_t es = ghc_dtype_size(dt);
    ghc_cpu_store(one, dt, 0, (float)value);
    for (int64_t i = 0; i < n; i++)
        memcpy((char *)p + (size_t)i * es, one, es);
    return 0;
}

/* f32 -> bf16 by stochastic rounding with the 32 random bits r (see the file comment). */
static uint16_t bf16_stochastic(float x, uint32_t r)
{
    if (isnan(x))
        return ghc_f32_to_bf16(x);
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) == 0x7f800000u)
        return (uint16_t)(u >> 16);
    return (uint16_t)((u + (r >> 16)) >> 16);
}

int ghc_cpu_cast(ghc_tensor_t *dst, const ghc_tensor_t *src, float scale, const struct ghc_rng *rng)
{
    int64_t n = ghc_tensor_numel(src);
    enum ghc_dtype sd = ghc_tensor_dtype(src), dd = ghc_tensor_dtype(dst);
    const void *s = ghc_tensor_cdata(src);
    void *d = ghc_tensor_data(dst);
    const int64_t D = ghc_tensor_dim(src, -1), lds = ghc_tensor_row_stride(src), ldd = ghc_tensor_row_stride(dst);
    if (lds != D || ldd != ghc_tensor_dim(dst, -1)) {   /* column views (ops.c: no rng, both last dims D) */
        for (int64_t r = 0; r < n / D; r++)
            for (int64_t j = 0; j < D; j++)
                ghc_cpu_store(d, dd, r * ldd + j, ghc_cpu_load(s, sd, r * lds + j) * scale);
        return 0;
    }
    if (!rng) {
        /* src and dst may be the same memory only with equal dtypes; go backwards when the
         * destination elements are wider, so that nothing unread is overwritten */
        if (ghc_dtype_size(dd) > ghc_dtype_size(sd)) {
            for (int64_t i = n - 1; i >= 0; i--)
                ghc_cpu_store(d, dd, i, ghc_cpu_load(s, sd, i) * scale);
        } else {
            for (int64_t i = 0; i < n; i++)
                ghc_cpu_store(d, dd, i, ghc_cpu_load(s, sd, i) * scale);
        }
        return 0;
    }
    uint16_t *o = d;
    uint32_t lanes[4];
    for (int64_t i = 0; i < n; i++) {
        if (i % 4 == 0)
            philox_block(rng, rng->offset + (uint64_t)(i / 4), lanes);
        o[i] = bf16_stochastic(ghc_cpu_load(s, sd, i) * scale, lanes[i % 4]);
    }
    return 0;
}

/* ---- random tensors ----------------------------------------------------------------------- */

int ghc_cpu_rand_uniform(ghc_tensor_t *t, const struct ghc_rng *rng)
{
    int64_t n = ghc_tensor_numel(t);
    uint32_t lanes[4];
    for (int64_t i = 0; i < n; i++) {
        if (i % 4 == 0)
            philox_block(rng, rng->offset + (uint64_t)(i / 4), lanes);
        GHC_CPU_SET(t, i, (float)(lanes[i % 4] >> 8) * 0x1p-24f);
    }
    return 0;
}

int ghc_cpu_rand_normal(ghc_tensor_t *t, const struct ghc_rng *rng)
{
    int64_t n = ghc_tensor_numel(t);
    uint32_t lanes[4];
    for (int64_t i = 0; i < n; i++) {
        if (i % 4 == 0)
            philox_block(rng, rng->offset + (uint64_t)(i / 4), lanes);
        int l = (int)(i % 4), p = l & ~1;
        double u1 = lanes[p] * 0x1p-32, u2 = lanes[p + 1] * 0x1p-32;
        double r = sqrt(-2.0 * log(1.0 - u1)), a = 6.283185307179586476925 * u2;
        GHC_CPU_SET(t, i, (float)(l & 1 ? r * sin(a) : r * cos(a)));
    }
    return 0;
}
