/* elem.h: element access to float data of any float dtype as f32, with the exact conversions
 * of tensor.h. Shared by core/tensor.c and the CPU kernels (kernels/cpu/cpu.h); never
 * installed. */
#ifndef GHC_ELEM_H
#define GHC_ELEM_H

#include <gh200core/tensor.h>   /* defines: enum ghc_dtype, ghc_bf16_to_f32 ... */

/* Element i of float data `p` of dtype `dt`, as f32. */
static inline float ghc_cpu_load(const void *p, enum ghc_dtype dt, int64_t i)
{
    switch (dt) {
    case GHC_DTYPE_F32:     return ((const float *)p)[i];
    case GHC_DTYPE_BF16:    return ghc_bf16_to_f32(((const uint16_t *)p)[i]);
    case GHC_DTYPE_F16:     return ghc_f16_to_f32(((const uint16_t *)p)[i]);
    case GHC_DTYPE_F8_E4M3: return ghc_e4m3_to_f32(((const uint8_t *)p)[i]);
    case GHC_DTYPE_F8_E5M2: return ghc_e5m2_to_f32(((const uint8_t *)p)[i]);
    default:                return 0.0f;
    }
}

/* Store v as element i of `p` of dtype `dt`, rounding to nearest even. */
static inline void ghc_cpu_store(void *p, enum ghc_dtype dt, int64_t i, float v)
{
    switch (dt) {
    case GHC_DTYPE_F32:     ((float *)p)[i] = v; break;
    case GHC_DTYPE_BF16:    ((uint16_t *)p)[i] = ghc_f32_to_bf16(v); break;
    case GHC_DTYPE_F16:     ((uint16_t *)p)[i] = ghc_f32_to_f16(v); break;
    case GHC_DTYPE_F8_E4M3: ((uint8_t *)p)[i] = ghc_f32_to_e4m3(v); break;
    case GHC_DTYPE_F8_E5M2: ((uint8_t *)p)[i] = ghc_f32_to_e5m2(v); break;
    default:                break;
    }
}

#endif /* GHC_ELEM_H */
