/* load.c: an expert's weights: from a checkpoint (official/ComfyUI or diffusers names, with or
 * without a prefix, one file or shards through the index JSON, any float dtype per tensor,
 * ComfyUI fp8 "scaled" weights dequantised with their per-tensor scale), or random for tests
 * and the demo. Each tensor is converted on the host into its dtype (the base dtype for block
 * and text linears, f32 for everything else: doc/wan22.md, "Precision") and placed on the model's
 * device through the memory policy. */
#include <config.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/safetensors.h>

#include "wan22_impl.h"

/* ---- placing a tensor ----------------------------------------------------------------------- */

ghc_tensor_t *wan22_tensor(struct wan22 *m, enum ghc_dtype dt, int ndim, const int64_t *shape,
                           enum ghc_mem_role role)
{
    return ghc_tensor_init(m->core, dt, ndim, shape, m->device, role);
}

/* Convert host tensor `h` (owned; consumed) to `want` times `scale` and put it on the model's
 * device with `role` into *slot. */
static int place(struct wan22 *m, ghc_tensor_t *h, enum ghc_dtype want, float scale, enum ghc_mem_role role,
                 ghc_tensor_t **slot)
{
    int rc = 0;
    ghc_tensor_t *c = h, *d = NULL;
    bool cpu = m->device == GHC_DEVICE_CPU;
    if (ghc_tensor_dtype(h) != want || scale != 1.0f) {
        c = ghc_tensor_init(m->core, want, ghc_tensor_ndim(h), ghc_tensor_shape(h), GHC_DEVICE_CPU,
                            cpu ? role : GHC_ROLE_WORKSPACE);
        if (!c) {
            rc = ghc_error_code(m->core);
            goto out;
        }
        if ((rc = ghc_tensor_convert_cpu(c, h, scale)) < 0)
            goto out;
    }
    if (cpu) {
        *slot = c;
        if (c == h)
            h = NULL;
        c = NULL;
        goto out;
    }
    if (!(d = wan22_tensor(m, want, ghc_tensor_ndim(c), ghc_tensor_shape(c), role))) {
        rc = ghc_error_code(m->core);
        goto out;
    }
    if ((rc = ghc_op_copy(d, c, NULL)) < 0 || (rc = ghc_op_sync(m->core, m->device, NULL)) < 0) {
        ghc_tensor_free(d);
        goto out;
    }
    *slot = d;
out:
    if (c != h)
        ghc_tensor_free(c);
    ghc_tensor_free(h);
    return rc < 0 ? rc : 0;
}

/* The dtype a tensor of `kind` is kept in. */
static enum ghc_dtype kind_dtype(const struct wan22 *m, enum wan22_kind kind)
{
    switch (kind) {
    case WAN22_T_F32:   return GHC_DTYPE_F32;
    case WAN22_T_BLOCK: return m->fp8 ? GHC_DTYPE_F8_E4M3 : m->base;
    default:            return m->base;
    }
}

/* fp8: quantise host tensor `h` (consumed; values h * in_scale) to e4m3 with one per-tensor
 * scale amax / 448, place it, and return the scale in *scale. */
static int quantize(struct wan22 *m, ghc_tensor_t *h, float in_scale, enum ghc_mem_role role, ghc_tensor_t **slot,
                    float *scale)
{
    int rc = 0;
    ghc_tensor_t *f = h, *q = NULL;
    if (ghc_tensor_dtype(h) != GHC_DTYPE_F32) {
        f = ghc_tensor_init(m->core, GHC_DTYPE_F32, ghc_tensor_ndim(h), ghc_tensor_shape(h), GHC_DEVICE_CPU,
                            GHC_ROLE_WORKSPACE);
        if (!f || (rc = ghc_tensor_convert_cpu(f, h, 1.0f)) < 0) {
            rc = rc < 0 ? rc : ghc_error_code(m->core);
            goto out;
        }
    }
    const float *v = ghc_tensor_cdata(f);
    float amax = 0.0f;
    for (int64_t i = 0; i < ghc_tensor_numel(f); i++)
        amax = fmaxf(amax, fabsf(v[i] * in_scale));
    float s = amax > 0.0f && isfinite(amax) ? amax / 448.0f : 1.0f;
    if (!(q = ghc_tensor_init(m->core, GHC_DTYPE_F8_E4M3, ghc_tensor_ndim(f), ghc_tensor_shape(f), GHC_DEVICE_CPU,
                              m->device == GHC_DEVICE_CPU ? role : GHC_ROLE_WORKSPACE))) {
        rc = ghc_error_code(m->core);
        goto out;
    }
    if ((rc = ghc_tensor_convert_cpu(q, f, in_scale / s)) < 0) {
        ghc_tensor_free(q);
        goto out;
    }
    *scale = s;
    rc = place(m, q, GHC_DTYPE_F8_E4M3, 1.0f, role, slot);
out:
    if (f != h)
        ghc_tensor_free(f);
    ghc_tensor_free(h);
    return rc;
}

/* ---- checkpoints ---------------------------------------------------------------------------- */

/* The per-tensor scale of an fp8 weight `fname` (X.weight -> X.scale_weight, ComfyUI's legacy
 * name, or X.weight_scale, comfy_quant's). Returns 0 and *scale, or GHC_EFORMAT. */
static int fp8_scale(struct wan22 *m, ghc_st_t *st, const char *path, const char *fname, enum ghc_dtype dt,
                     float *scale)
{
    char base[256], s1[300], s2[300];
    size_t n = strlen(fname);
    snprintf(base, sizeof(base), "%.*s", (int)(n > 7 && strcmp(fname + n - 7, ".weight") == 0 ? n - 7 : n), fname);
    snprintf(s1, sizeof(s1), "%s.scale_weight", base);
    snprintf(s2, sizeof(s2), "%s.weight_scale", base);
    const char *sn = NULL;
    struct ghc_st_info info;
    if (ghc_st_find(st, s1, &info))
        sn = s1;
    else if (ghc_st_find(st, s2, &info))
        sn = s2;
    if (!sn)
        return ghc_error_set(m->core, GHC_EFORMAT, "%s: tensor '%s' is %s without a per-tensor scale ('%s' or '%s')",
                             path, fname, ghc_dtype_name(dt), s1, s2);
    int64_t numel = 1;
    for (int i = 0; i < info.ndim; i++)
        numel *= info.shape[i];
    if (numel != 1)
        return ghc_error_set(m->core, GHC_EUNSUPPORTED, "%s: scale '%s' has %lld elements; only per-tensor scales "
                             "(one element) are supported", path, sn, (long long)numel);
    ghc_tensor_t *t = ghc_st_load(st, sn, GHC_DTYPE_F32, GHC_ROLE_WORKSPACE);
    if (!t)
        return ghc_error_code(m->core);
    *scale = *(const float *)ghc_tensor_cdata(t);
    ghc_tensor_free(t);
    return 0;
}

int wan22_load(struct wan22 *m, const char *path, int64_t heads, struct wan22_weights *w, enum ghc_mem_role role,
               struct wan22_detected *det)
{
    int rc = 0, n = 0, nspec = 0, n_fp8 = 0;
    struct wan22_tensor_desc *desc = NULL;
    struct wan22_tspec *spec = NULL;
    ghc_st_t *st = ghc_st_open(m->core, path);
    if (!st)
        return ghc_error_code(m->core) < 0 ? ghc_error_code(m->core) : GHC_EIO;
    n = ghc_st_count(st);
    if (!(desc = calloc((size_t)(n ? n : 1), sizeof(*desc)))) {
        rc = ghc_error_set(m->core, GHC_ENOMEM, "wan22: out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        struct ghc_st_info info;
        ghc_st_info_at(st, i, &info);
        desc[i] = (struct wan22_tensor_desc){ info.name, info.ndim, info.shape };
    }
    if ((rc = wan22_detect(m->core, path, desc, n, heads, det)) < 0)
        goto out;
    const struct wan22_dims *d = &det->dims;
    if (m->d.dim == 0) {
        m->d = *d;
        m->variant = det->variant;
    } else if (memcmp(&m->d, d, sizeof(*d)) != 0) {
        rc = ghc_error_set(m->core, GHC_EFORMAT,
                           "%s: dims differ from the first expert's (dim %lld/%lld, ffn %lld/%lld, layers %lld/%lld, "
                           "in %lld/%lld, out %lld/%lld)", path, (long long)d->dim, (long long)m->d.dim,
                           (long long)d->ffn_dim, (long long)m->d.ffn_dim, (long long)d->layers,
                           (long long)m->d.layers, (long long)d->in_ch, (long long)m->d.in_ch,
                           (long long)d->out_ch, (long long)m->d.out_ch);
        goto out;
    }
    if (!(w->blocks = calloc((size_t)d->layers, sizeof(*w->blocks)))) {
        rc = ghc_error_set(m->core, GHC_ENOMEM, "wan22: out of memory");
        goto out;
    }
    if ((rc = wan22_tensor_list(m->core, d, w, &spec, &nspec)) < 0)
        goto out;
    for (int i = 0; i < nspec; i++) {
        char nm[160], fname[256];
        struct ghc_st_info info;
        if (det->layout == WAN22_LAYOUT_DIFFUSERS)
            wan22_name_diffusers(spec[i].name, nm, sizeof(nm));
        else
            snprintf(nm, sizeof(nm), "%s", spec[i].name);
        snprintf(fname, sizeof(fname), "%s%s", det->prefix, nm);
        if (!ghc_st_find(st, fname, &info)) {   /* detection checked this: a bug if it happens */
            rc = ghc_error_set(m->core, GHC_EINTERNAL, "%s: tensor '%s' vanished", path, fname);
            goto out;
        }
        enum ghc_dtype want = kind_dtype(m, spec[i].kind);
        float scale = 1.0f;
        if (spec[i].scale)
            *spec[i].scale = 1.0f;
        if (info.dtype == GHC_DTYPE_F8_E4M3 || info.dtype == GHC_DTYPE_F8_E5M2) {
            if ((rc = fp8_scale(m, st, path, fname, info.dtype, &scale)) < 0)
                goto out;
            n_fp8++;
        } else if (!ghc_dtype_is_float(info.dtype)) {
            rc = ghc_error_set(m->core, GHC_EFORMAT, "%s: tensor '%s' is %s, expected a float dtype", path, fname,
                               ghc_dtype_name(info.dtype));
            goto out;
        }
        /* fp8 kept as the file has it (e4m3 and its scale), else through f32 when scaled */
        bool as_is = want == GHC_DTYPE_F8_E4M3 && info.dtype == GHC_DTYPE_F8_E4M3;
        enum ghc_dtype ld = as_is ? want : want == GHC_DTYPE_F8_E4M3 || scale != 1.0f ? GHC_DTYPE_F32 : want;
        ghc_tensor_t *h = ghc_st_load(st, fname, ld, m->device == GHC_DEVICE_CPU ? role : GHC_ROLE_WORKSPACE);
        if (!h) {
            rc = ghc_error_code(m->core) < 0 ? ghc_error_code(m->core) : GHC_EIO;
            goto out;
        }
        if (as_is) {
            *spec[i].scale = scale;
            rc = place(m, h, want, 1.0f, role, spec[i].slot);
        } else if (want == GHC_DTYPE_F8_E4M3) {
            rc = quantize(m, h, scale, role, spec[i].slot, spec[i].scale);
        } else {
            rc = place(m, h, want, scale, role, spec[i].slot);
        }
        if (rc < 0)
            goto out;
    }
    det->fp8_scaled = n_fp8 > 0;
    ghc_log(m->core, GHC_LOG_INFO,
            "wan22: %s: %s, %s names%s%s%s, dim %lld, ffn %lld, %lld heads, %lld layers, in %lld, out %lld, "
            "text %lld; %d of %d tensors used%s", path, wan22_variant_name(det->variant),
            det->layout == WAN22_LAYOUT_DIFFUSERS ? "diffusers" : "official", *det->prefix ? " (prefix '" : "",
            det->prefix, *det->prefix ? "')" : "", (long long)d->dim, (long long)d->ffn_dim, (long long)d->heads,
            (long long)d->layers, (long long)d->in_ch, (long long)d->out_ch, (long long)d->text_dim, nspec, n,
            n_fp8 ? (m->fp8 ? ", fp8 scaled weights kept" : ", fp8 scaled weights dequantised") : "");
out:
    free(spec);
    free(desc);
    ghc_st_free(st);
    return rc;
}

/* ---- random weights --------------------------------------------------------------------------- */

static bool ends(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* The GPU path of wan22_random for v = a n (no offset, not fp8): N(0, 1) made on the device in
 * f32 chunks of RAND_CHUNK elements (element c of the tensor uses Philox block offset + c / 4,
 * as one call over the whole tensor would), each cast with scale a into the weight: the same
 * values as the host path, without a host pass over every element. */
#define RAND_CHUNK ((int64_t)1 << 22)

static int random_on_device(struct wan22 *m, const struct wan22_tspec *s, const struct ghc_rng *rng, float a,
                            enum ghc_dtype want, enum ghc_mem_role role)
{
    ghc_tensor_t *d = wan22_tensor(m, want, s->ndim, s->shape, role), *tmp = NULL;
    int64_t numel = 1;
    int rc = 0;
    for (int k = 0; k < s->ndim; k++)
        numel *= s->shape[k];
    const int64_t chunk[1] = { numel < RAND_CHUNK ? numel : RAND_CHUNK };
    if (!d || !(tmp = ghc_tensor_init(m->core, GHC_DTYPE_F32, 1, chunk, m->device, GHC_ROLE_WORKSPACE))) {
        rc = ghc_error_code(m->core);
        goto out;
    }
    for (int64_t c = 0; c < numel && rc == 0; c += RAND_CHUNK) {
        const int64_t len[1] = { numel - c < RAND_CHUNK ? numel - c : RAND_CHUNK };
        struct ghc_rng r = { rng->seed, rng->offset + (uint64_t)c / 4 };
        ghc_tensor_t *src = ghc_tensor_wrap(m->core, GHC_DTYPE_F32, 1, len, m->device, ghc_tensor_data(tmp));
        ghc_tensor_t *dst = ghc_tensor_wrap(m->core, want, 1, len, m->device,
                                            (char *)ghc_tensor_data(d) + c * (int64_t)ghc_dtype_size(want));
        if (!src || !dst)
            rc = ghc_error_code(m->core);
        else if ((rc = ghc_op_rand_normal(src, &r, NULL)) == 0)
            rc = ghc_op_cast(dst, src, a, NULL, NULL);
        ghc_tensor_free(src);
        ghc_tensor_free(dst);
    }
    if (rc == 0)
        rc = ghc_op_sync(m->core, m->device, NULL);
out:
    ghc_tensor_free(tmp);
    if (rc < 0) {
        ghc_tensor_free(d);
        return rc;
    }
    *s->slot = d;
    return 0;
}

int wan22_random(struct wan22 *m, uint64_t seed, struct wan22_weights *w, enum ghc_mem_role role)
{
    int rc = 0, nspec = 0;
    struct wan22_tspec *spec = NULL;
    struct ghc_rng rng = { seed, 0 };
    if (!(w->blocks = calloc((size_t)m->d.layers, sizeof(*w->blocks))))
        return ghc_error_set(m->core, GHC_ENOMEM, "wan22: out of memory");
    if ((rc = wan22_tensor_list(m->core, &m->d, w, &spec, &nspec)) < 0)
        goto out;
    for (int i = 0; i < nspec; i++) {
        const struct wan22_tspec *s = &spec[i];
        enum ghc_dtype want = kind_dtype(m, s->kind);
        float a, b = 0.0f;
        /* v = a n + b: Linear weights 1/sqrt(fan_in); norms near 1; biases and modulation small */
        if (ends(s->name, "norm_q.weight") || ends(s->name, "norm_k.weight") || ends(s->name, "norm3.weight"))
            a = 0.1f, b = 1.0f;
        else if (ends(s->name, ".bias"))
            a = 0.02f;
        else if (ends(s->name, "modulation"))
            a = 0.1f;
        else
            a = 1.0f / sqrtf((float)(s->shape[1] * (s->ndim == 5 ? WAN22_PATCH : 1)));
        if (s->scale)
            *s->scale = 1.0f;
        if (m->device != GHC_DEVICE_CPU && b == 0.0f && want != GHC_DTYPE_F8_E4M3) {
            int64_t numel = 1;
            for (int k = 0; k < s->ndim; k++)
                numel *= s->shape[k];
            if ((rc = random_on_device(m, s, &rng, a, want, role)) < 0)
                goto out;
            rng.offset += (uint64_t)(numel + 3) / 4;
            continue;
        }
        ghc_tensor_t *h = ghc_tensor_init(m->core, GHC_DTYPE_F32, s->ndim, s->shape, GHC_DEVICE_CPU,
                                          m->device == GHC_DEVICE_CPU ? role : GHC_ROLE_WORKSPACE);
        if (!h) {
            rc = ghc_error_code(m->core);
            goto out;
        }
        int64_t numel = ghc_tensor_numel(h);
        if ((rc = ghc_op_rand_normal(h, &rng, NULL)) < 0) {
            ghc_tensor_free(h);
            goto out;
        }
        rng.offset += (uint64_t)(numel + 3) / 4;
        float *v = ghc_tensor_data(h);
        for (int64_t j = 0; j < numel; j++)
            v[j] = a * v[j] + b;
        rc = want == GHC_DTYPE_F8_E4M3 ? quantize(m, h, 1.0f, role, s->slot, s->scale)
                                       : place(m, h, want, 1.0f, role, s->slot);
        if (rc < 0)
            goto out;
    }
    ghc_log(m->core, GHC_LOG_INFO, "wan22: random weights (seed %llu): dim %lld, ffn %lld, %lld heads, %lld layers, "
            "in %lld, out %lld, text %lld, freq %lld", (unsigned long long)seed, (long long)m->d.dim,
            (long long)m->d.ffn_dim, (long long)m->d.heads, (long long)m->d.layers, (long long)m->d.in_ch,
            (long long)m->d.out_ch, (long long)m->d.text_dim, (long long)m->d.freq_dim);
out:
    free(spec);
    return rc;
}

/* ---- spare room for K-concatenation ----------------------------------------------------------- */

ghc_tensor_t *wan22_wsub(struct wan22 *m, const ghc_tensor_t *t, int64_t r0, int64_t nr, int64_t c0, int64_t nc)
{
    const int64_t ld = ghc_tensor_dim(t, -1);
    char *p = (char *)ghc_tensor_cdata(t) + (size_t)(r0 * ld) * ghc_dtype_size(ghc_tensor_dtype(t));
    ghc_tensor_t *rows = ghc_tensor_wrap(m->core, ghc_tensor_dtype(t), 2, (const int64_t[]){ nr, ld },
                                         ghc_tensor_device(t), p);
    if (!rows || (c0 == 0 && nc == ld))
        return rows;
    ghc_tensor_t *v = ghc_tensor_view_cols(rows, c0, nc);
    ghc_tensor_free(rows);
    if (!v && ghc_error_code(m->core) >= 0)
        ghc_error_set(m->core, GHC_EINTERNAL, "wan22: columns [%lld, %lld) of a weight with %lld", (long long)c0,
                      (long long)(c0 + nc), (long long)ld);
    return v;
}

int wan22_pad_weights(struct wan22 *m, struct wan22_weights *w, enum ghc_mem_role role)
{
    if (!m->pad || !w->blocks)
        return 0;
    for (int64_t i = 0; i < m->d.layers; i++)
        for (int j = 0; j < WAN22_TARGETS; j++) {
            ghc_tensor_t **slot = &w->blocks[i].w[j], *t = *slot, *p = NULL, *v = NULL;
            const int64_t pc = wan22_pad_cols(m, j), N = ghc_tensor_dim(t, 0), K = ghc_tensor_dim(t, 1);
            if (!pc)
                continue;
            int rc = 0;
            if (!(p = wan22_tensor(m, ghc_tensor_dtype(t), 2, (const int64_t[]){ N + m->pad, K + pc }, role)) ||
                !(v = wan22_wsub(m, p, 0, N, 0, K)))
                rc = ghc_error_code(m->core) < 0 ? ghc_error_code(m->core) : GHC_ENOMEM;
            else if ((rc = ghc_op_fill(p, 0.0, NULL)) == 0 && (rc = ghc_op_copy(v, t, NULL)) == 0)
                rc = ghc_op_sync(m->core, m->device, NULL);
            ghc_tensor_free(v);
            if (rc < 0) {
                ghc_tensor_free(p);
                return rc;
            }
            ghc_tensor_free(t);
            *slot = p;
        }
    return 0;
}

/* ---- release and iteration -------------------------------------------------------------------- */

int wan22_weights_each(struct wan22 *m, struct wan22_weights *w, int (*fn)(void *user, ghc_tensor_t *t), void *user)
{
    int rc = 0, nspec = 0;
    struct wan22_tspec *spec = NULL;
    if (!w || !w->blocks)
        return 0;
    if ((rc = wan22_tensor_list(m->core, &m->d, w, &spec, &nspec)) < 0)
        return rc;
    for (int i = 0; i < nspec && rc == 0; i++)
        if (*spec[i].slot)
            rc = fn(user, *spec[i].slot);
    free(spec);
    return rc;
}

static int free_one(void *user, ghc_tensor_t *t)
{
    (void)user;
    ghc_tensor_free(t);
    return 0;
}

void wan22_weights_free(struct wan22 *m, struct wan22_weights *w)
{
    if (!w)
        return;
    wan22_weights_each(m, w, free_one, NULL);
    free(w->blocks);
    memset(w, 0, sizeof(*w));
}
