/* optim_common.c: the param table, group settings and state file of the optimizer plugins
 * (optim_common.h). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim_common.h"

#define OPTIM_FORMAT "gh200core-optimizer-1"

const char *const optim_group_prefix[3] = { "high_noise_", "low_noise_", "" };

int optim_cfg_group_float(ghc_cfg_t *cfg, const char *key, double def, double min, double max, double out[3])
{
    int rc;
    char k[96];
    if ((rc = ghc_cfg_get_float(cfg, key, def, min, max, &out[2])) < 0)
        return rc;
    for (int g = 0; g < 2; g++) {
        snprintf(k, sizeof(k), "%s%s", optim_group_prefix[g], key);
        if ((rc = ghc_cfg_get_float(cfg, k, out[2], min, max, &out[g])) < 0)
            return rc;
    }
    return 0;
}

ghc_tensor_t *optim_state_new(struct optim *o, const ghc_tensor_t *like, enum ghc_dtype dt, int ndim,
                              const int64_t *shape, const void *fill)
{
    int dev = ghc_tensor_device(like);
    ghc_tensor_t *t = ghc_tensor_init(o->core, dt, ndim, shape, dev, GHC_ROLE_OPTIMIZER_STATE);
    ghc_tensor_t *host = dev == GHC_DEVICE_CPU ? t : NULL;
    if (!t)
        return NULL;
    if (!host && !(host = ghc_tensor_init(o->core, dt, ndim, shape, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE)))
        goto fail;
    size_t es = ghc_dtype_size(dt);
    int64_t n = ghc_tensor_numel(t);
    char *d = ghc_tensor_data(host);
    if (!fill)
        memset(d, 0, (size_t)n * es);
    else
        for (int64_t i = 0; i < n; i++)
            memcpy(d + (size_t)i * es, fill, es);
    if (host != t) {
        if (ghc_op_copy(t, host, NULL) < 0 || ghc_op_sync(o->core, dev, NULL) < 0)
            goto fail;
        ghc_tensor_free(host);
    }
    return t;
fail:
    if (host != t)
        ghc_tensor_free(host);
    ghc_tensor_free(t);
    return NULL;
}

int optim_add(struct optim *o, struct ghc_param *params, int32_t n,
              int (*init_state)(void *self, struct optim_param *op), void *self)
{
    if (n < 0 || (n > 0 && !params))
        return ghc_error_set(o->core, GHC_EINVAL, "%s: add_params: bad list (n = %d)", o->name, (int)n);
    for (int32_t i = 0; i < n; i++) {
        struct ghc_param *p = &params[i];
        if (!p->name || !p->value)
            return ghc_error_set(o->core, GHC_EINVAL, "%s: add_params: param %d has no %s", o->name, (int)i,
                                 p->name ? "value" : "name");
        for (int32_t j = 0; j < o->n; j++)
            if (!strcmp(o->ps[j].p->name, p->name))
                return ghc_error_set(o->core, GHC_EINVAL, "%s: add_params: param '%s' given twice", o->name, p->name);
        enum ghc_dtype dt = ghc_tensor_dtype(p->value);
        if (dt != GHC_DTYPE_F32 && dt != GHC_DTYPE_BF16)
            return ghc_error_set(o->core, GHC_EINVAL, "%s: param '%s' is %s, expected F32 or BF16", o->name, p->name,
                                 ghc_dtype_name(dt));
        if (o->n == o->cap) {
            int32_t cap = o->cap ? o->cap * 2 : 64;
            struct optim_param *ps = realloc(o->ps, sizeof(*ps) * (size_t)cap);
            if (!ps)
                return ghc_error_set(o->core, GHC_ENOMEM, "%s: out of memory", o->name);
            o->ps = ps;
            o->cap = cap;
        }
        struct optim_param *op = &o->ps[o->n];
        *op = (struct optim_param){ .p = p, .index = o->n };
        int rc = init_state(self, op);
        if (rc < 0) {
            for (int s = 0; s < OPTIM_STATES; s++)
                ghc_tensor_free(op->state[s]);
            return rc;
        }
        o->n++;
    }
    return 0;
}

struct ghc_rng optim_rng(const struct optim *o, const struct optim_param *op, int64_t step)
{
    /* a distinct key per param, a distinct counter range (2^28 blocks) per step */
    return (struct ghc_rng){ .seed = o->seed + UINT64_C(0x9E3779B97F4A7C15) * (uint64_t)(op->index + 1),
                             .offset = (uint64_t)step << 28 };
}

/* A CPU copy of a state tensor (the tensor itself when on the CPU). */
/* The key suffix of state s of a param. */
static const char *suffix_of(const struct optim *o, const struct optim_param *op, int s)
{
    if (o->kinds[s].suffix_1d && ghc_tensor_ndim(op->p->value) < 2)
        return o->kinds[s].suffix_1d;
    return o->kinds[s].suffix;
}

static ghc_tensor_t *host_copy(struct optim *o, ghc_tensor_t *t)
{
    if (ghc_tensor_device(t) == GHC_DEVICE_CPU)
        return t;
    ghc_tensor_t *h = ghc_tensor_init(o->core, ghc_tensor_dtype(t), ghc_tensor_ndim(t), ghc_tensor_shape(t),
                                      GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
    if (h && (ghc_op_copy(h, t, NULL) < 0 || ghc_op_sync(o->core, ghc_tensor_device(t), NULL) < 0)) {
        ghc_tensor_free(h);
        return NULL;
    }
    return h;
}

int optim_save(struct optim *o, const char *path, const char *const *meta)
{
    int rc = 0;
    char key[512], num[32];
    ghc_st_writer_t *w = ghc_st_writer_init(o->core);
    if (!w)
        return ghc_error_set(o->core, GHC_ENOMEM, "%s: out of memory", o->name);
    snprintf(num, sizeof(num), "%d", (int)o->n);
    if ((rc = ghc_st_writer_metadata(w, "optimizer", o->name)) < 0 ||
        (rc = ghc_st_writer_metadata(w, "format", OPTIM_FORMAT)) < 0 ||
        (rc = ghc_st_writer_metadata(w, "params", num)) < 0)
        goto out;
    for (int i = 0; meta && meta[i] && meta[i + 1]; i += 2)
        if ((rc = ghc_st_writer_metadata(w, meta[i], meta[i + 1])) < 0)
            goto out;
    for (int32_t i = 0; i < o->n; i++) {
        struct optim_param *op = &o->ps[i];
        snprintf(key, sizeof(key), "%s.step", op->p->name);
        if ((rc = ghc_st_writer_add_raw(w, key, GHC_DTYPE_I64, 0, NULL, &op->k)) < 0)
            goto out;
        for (int s = 0; s < OPTIM_STATES; s++) {
            if (!op->state[s] || !o->kinds[s].suffix)
                continue;
            ghc_tensor_t *h = host_copy(o, op->state[s]);
            if (!h) {
                rc = ghc_error_code(o->core) ? ghc_error_code(o->core) : GHC_ENOMEM;
                goto out;
            }
            snprintf(key, sizeof(key), "%s.%s", op->p->name, suffix_of(o, op, s));
            rc = ghc_st_writer_add(w, key, h);
            if (h != op->state[s])
                ghc_tensor_free(h);
            if (rc < 0)
                goto out;
        }
    }
    if ((rc = ghc_st_writer_finish(w, path)) < 0) {
        char msg[1024];
        snprintf(msg, sizeof(msg), "%s", ghc_error_message(o->core));
        rc = ghc_error_set(o->core, rc, "%s: saving state: %s", o->name, msg);
    }
out:
    ghc_st_writer_free(w);
    return rc;
}

static const char *shape_str(int nd, const int64_t *sh, enum ghc_dtype dt, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < nd && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%" PRId64, i ? ", " : "", sh[i]);
    if (n < len)
        snprintf(buf + n, len - n, "] %s", ghc_dtype_name(dt));
    return buf;
}

/* Entry `key` of the file must exist like `t` (dtype, shape; t NULL: an I64 scalar). */
static int check_entry(struct optim *o, ghc_st_t *st, const char *path, const char *key, const char *param,
                       const ghc_tensor_t *t)
{
    struct ghc_st_info info;
    char want[160], got[160];
    enum ghc_dtype dt = t ? ghc_tensor_dtype(t) : GHC_DTYPE_I64;
    int nd = t ? ghc_tensor_ndim(t) : 0;
    const int64_t *sh = t ? ghc_tensor_shape(t) : NULL;
    if (!ghc_st_find(st, key, &info))
        return ghc_error_set(o->core, GHC_EFORMAT, "%s: missing tensor \"%s\" (state of param '%s')", path, key, param);
    bool ok = info.dtype == dt && info.ndim == nd;
    for (int d = 0; ok && d < nd; d++)
        ok = info.shape[d] == sh[d];
    if (!ok)
        return ghc_error_set(o->core, GHC_EFORMAT, "%s: tensor \"%s\" is %s, expected %s (param '%s')", path, key,
                             shape_str(info.ndim, info.shape, info.dtype, got, sizeof(got)),
                             shape_str(nd, sh, dt, want, sizeof(want)), param);
    return 0;
}

int optim_load(struct optim *o, const char *path)
{
    int rc = 0, expected = 0;
    char key[512];
    ghc_st_t *st = ghc_st_open(o->core, path);
    if (!st)
        return ghc_error_code(o->core) ? ghc_error_code(o->core) : GHC_EIO;
    const char *opt = ghc_st_metadata(st, "optimizer"), *fmt = ghc_st_metadata(st, "format");
    if (!fmt || strcmp(fmt, OPTIM_FORMAT)) {
        rc = ghc_error_set(o->core, GHC_EFORMAT, "%s: not an optimizer state file (metadata \"format\" is %s%s%s, expected \"%s\")",
                           path, fmt ? "\"" : "", fmt ? fmt : "absent", fmt ? "\"" : "", OPTIM_FORMAT);
        goto out;
    }
    if (!opt || strcmp(opt, o->name)) {
        rc = ghc_error_set(o->core, GHC_EFORMAT, "%s: state of optimizer \"%s\", this run's optimizer is \"%s\"", path,
                           opt ? opt : "?", o->name);
        goto out;
    }
    /* validate everything before touching any state */
    for (int32_t i = 0; i < o->n; i++) {
        struct optim_param *op = &o->ps[i];
        snprintf(key, sizeof(key), "%s.step", op->p->name);
        if ((rc = check_entry(o, st, path, key, op->p->name, NULL)) < 0)
            goto out;
        expected++;
        for (int s = 0; s < OPTIM_STATES; s++) {
            if (!op->state[s] || !o->kinds[s].suffix)
                continue;
            snprintf(key, sizeof(key), "%s.%s", op->p->name, suffix_of(o, op, s));
            if ((rc = check_entry(o, st, path, key, op->p->name, op->state[s])) < 0)
                goto out;
            expected++;
        }
    }
    if (ghc_st_count(st) != expected) {
        /* name an entry that belongs to no param of this run */
        struct ghc_st_info info;
        const char *extra = "?";
        for (int j = 0; j < ghc_st_count(st) && ghc_st_info_at(st, j, &info); j++) {
            bool known = false;
            for (int32_t i = 0; i < o->n && !known; i++) {
                size_t l = strlen(o->ps[i].p->name);
                known = !strncmp(info.name, o->ps[i].p->name, l) && info.name[l] == '.';
                if (known) {
                    const char *suf = info.name + l + 1;
                    known = !strcmp(suf, "step");
                    for (int s = 0; s < OPTIM_STATES && !known; s++)
                        known = o->ps[i].state[s] && o->kinds[s].suffix && !strcmp(suf, suffix_of(o, &o->ps[i], s));
                }
            }
            if (!known) {
                extra = info.name;
                break;
            }
        }
        rc = ghc_error_set(o->core, GHC_EFORMAT, "%s: tensor \"%s\" belongs to no param of this run (%d entries, expected %d)",
                           path, extra, ghc_st_count(st), expected);
        goto out;
    }
    for (int32_t i = 0; i < o->n; i++) {
        struct optim_param *op = &o->ps[i];
        snprintf(key, sizeof(key), "%s.step", op->p->name);
        memcpy(&op->k, ghc_st_raw(st, key), sizeof(int64_t));
        for (int s = 0; s < OPTIM_STATES; s++) {
            if (!op->state[s] || !o->kinds[s].suffix)
                continue;
            snprintf(key, sizeof(key), "%s.%s", op->p->name, suffix_of(o, op, s));
            ghc_tensor_t *t = op->state[s];
            if (ghc_tensor_device(t) == GHC_DEVICE_CPU) {
                rc = ghc_st_load_into(st, key, t);
            } else {
                ghc_tensor_t *h = ghc_st_load(st, key, ghc_tensor_dtype(t), GHC_ROLE_WORKSPACE);
                rc = h ? ghc_op_copy(t, h, NULL) : GHC_ENOMEM;
                if (rc >= 0)
                    rc = ghc_op_sync(o->core, ghc_tensor_device(t), NULL);
                ghc_tensor_free(h);
            }
            if (rc < 0)
                goto out;
        }
    }
out:
    ghc_st_free(st);
    return rc;
}

void optim_free(struct optim *o)
{
    for (int32_t i = 0; i < o->n; i++)
        for (int s = 0; s < OPTIM_STATES; s++)
            ghc_tensor_free(o->ps[i].state[s]);
    free(o->ps);
    o->ps = NULL;
    o->n = o->cap = 0;
}
