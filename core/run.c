/* run.c: the run's plugin instances, one per configured kind, created in kind order
 * (mempolicy first: everything later allocates through it; the encoders when first asked for)
 * and released in reverse; and the core wrappers through which the rest of the program calls
 * them. */
#include <config.h>

#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core_impl.h"

/* Each kind's free member, found by offset: its position differs per ops struct. */
static void (*ops_free(enum ghc_kind kind, const void *ops))(void *)
{
    switch (kind) {
    case GHC_KIND_MEMPOLICY: return ((const struct ghc_mempolicy_ops *)ops)->free;
    case GHC_KIND_BACKEND:   return ((const struct ghc_backend_ops *)ops)->free;
    case GHC_KIND_CACHE:     return ((const struct ghc_cache_ops *)ops)->free;
    case GHC_KIND_MODEL:     return ((const struct ghc_model_ops *)ops)->free;
    case GHC_KIND_NETWORK:   return ((const struct ghc_network_ops *)ops)->free;
    case GHC_KIND_OPTIMIZER: return ((const struct ghc_optimizer_ops *)ops)->free;
    case GHC_KIND_SCHEDULER: return ((const struct ghc_scheduler_ops *)ops)->free;
    case GHC_KIND_VAE:       return ((const struct ghc_vae_ops *)ops)->free;
    case GHC_KIND_TEXT_ENCODER: return ((const struct ghc_text_encoder_ops *)ops)->free;
    default:                 return NULL;
    }
}

static const struct ghc_cfg_key plugin_key[] = { { "plugin", GHC_CFG_STRING }, { NULL, 0 } };

static int instance_create(ghc_core_t *core, enum ghc_kind kind, ghc_cfg_t *cfg)
{
    const char *kname = ghc_kind_name(kind);
    const char *name;
    int rc;
    if (!ghc_cfg_has(cfg, "plugin"))
        return ghc_error_set(core, GHC_ECONFIG, "%s: %s: missing key 'plugin' (the %s plugin to use, e.g. plugin = \"name\";)",
                             ghc_cfg_where(cfg, NULL), kname, kname);
    if ((rc = ghc_cfg_get_string(cfg, "plugin", NULL, &name)) < 0)
        return rc;
    if ((rc = ghc_plugin_load(core, name)) < 0) {
        char msg[GHC_ERRMSG_MAX];
        snprintf(msg, sizeof(msg), "%s", ghc_error_message(core));
        return ghc_error_set(core, rc, "%s: %s: %s", ghc_cfg_where(cfg, "plugin"), kname, msg);
    }
    const struct ghc_registered *r = ghc_registry_find(core, kind, name);
    if (!r) {
        char has[256];
        const char *path = ghc_plugin_kinds_text(core, name, has, sizeof(has));
        return ghc_error_set(core, GHC_ELOAD, "%s: %s: plugin '%s' (%s) provides %s, not %s '%s'",
                             ghc_cfg_where(cfg, "plugin"), kname, name, path, has, kname, name);
    }
    const struct ghc_ops_head *head = r->ops;
    char what[160];
    snprintf(what, sizeof(what), "%s \"%s\"", kname, name);
    if ((rc = ghc_cfg_check_keys(cfg, head->keys, plugin_key, what)) < 0)
        return rc;

    struct ghc_instance *in = calloc(1, sizeof(*in));
    if (!in)
        return ghc_error_set(core, GHC_ENOMEM, "run: out of memory");
    *in = (struct ghc_instance){ .core = core, .kind = kind, .ops = r->ops, .cfg = cfg,
                                 .free = ops_free(kind, r->ops) };
    ghc_error_clear(core);
    uint64_t seq = ghc_error_seq(core);
    if ((rc = head->init(core, cfg, &in->self)) < 0) {
        ghc_error_member(core, seq, rc, kname, name, "init", NULL);
        free(in);
        return rc;
    }
    core->inst[kind] = in;
    ghc_log(core, GHC_LOG_DEBUG, "run: %s ready", what);
    return 0;
}

int ghc_run_init(ghc_core_t *core)
{
    if (!core->config)
        return ghc_error_set(core, GHC_EINVAL, "run: no configuration loaded");
    ghc_run_free(core);
    for (int k = 0; k < GHC_KIND_COUNT; k++) {
        ghc_cfg_t *cfg = ghc_config_section(core, ghc_kind_name((enum ghc_kind)k));
        if (!cfg || k == GHC_KIND_VAE || k == GHC_KIND_TEXT_ENCODER)   /* on demand: on_demand() */
            continue;
        int rc = instance_create(core, (enum ghc_kind)k, cfg);
        if (rc < 0) {
            char msg[GHC_ERRMSG_MAX];
            snprintf(msg, sizeof(msg), "%s", ghc_error_message(core));
            ghc_run_free(core);
            return ghc_error_set(core, rc, "%s", msg);
        }
    }
    return 0;
}

void ghc_run_free(ghc_core_t *core)
{
    for (int k = GHC_KIND_COUNT - 1; k >= 0; k--) {
        struct ghc_instance *in = core->inst[k];
        if (!in)
            continue;
        if (in->free)
            in->free(in->self);
        free(in->hook);
        free(in);
        core->inst[k] = NULL;
    }
}

/* ---- paths ---------------------------------------------------------------------------------- */

/* One rule for every relative path of a configuration: the file's are relative to its folder
 * (they travel with it), the command line's relative to where the command runs. */
int ghc_cfg_resolve_path(ghc_cfg_t *cfg, const char *key, const char *value, char *buf, size_t len)
{
    ghc_core_t *core = cfg->core;
    config_setting_t *s = config_setting_get_member(cfg->s, key);
    /* --set values, and defaults filled in (libconfig gives them no line), are the command's */
    bool cli = !s || config_setting_source_line(s) == 0 || !strncmp(ghc_cfg_where(cfg, key), "--set ", 6);
    char base[4096];
    int n;
    if (value[0] == '/') {
        n = snprintf(buf, len, "%s", value);
    } else {
        const char *dir = cli || !core->config ? "." : core->config->dir;
        if (!realpath(dir, base))
            snprintf(base, sizeof(base), "%s", dir);
        while (!strncmp(value, "./", 2))
            value += 2;
        n = snprintf(buf, len, "%s%s%s", base, *value && strcmp(base, "/") ? "/" : "", value);
    }
    if (n < 0 || (size_t)n >= len)
        return ghc_error_set(core, GHC_EINVAL, "%s: the path '%s' is too long", ghc_cfg_where(cfg, key), value);
    while (n > 1 && buf[n - 1] == '/')   /* the folder's name, for messages and comparisons */
        buf[--n] = '\0';
    return 0;
}

int ghc_config_resolve_output_dir(ghc_core_t *core)
{
    ghc_cfg_t *root = ghc_config_root(core);
    if (!root)
        return ghc_error_set(core, GHC_EINVAL, "run: no configuration loaded");
    const char *out;
    char abs[4096];
    int rc;
    if ((rc = ghc_cfg_get_string(root, "output_dir", "output", &out)) < 0 ||
        (rc = ghc_cfg_resolve_path(root, "output_dir", out, abs, sizeof(abs))) < 0)
        return rc;
    if (!strcmp(abs, out))
        return 0;
    return ghc_cfg_set_string(root, "output_dir", abs);   /* a string: keeps its place */
}

/* ---- typed handles -------------------------------------------------------------------------- */

/* The typed instance handles are all struct ghc_instance. */
#define INSTANCE_GETTER(type, kind)                                                      \
    type##_t *type##_get(ghc_core_t *core) { return (type##_t *)core->inst[kind]; }
INSTANCE_GETTER(ghc_mempolicy, GHC_KIND_MEMPOLICY)
INSTANCE_GETTER(ghc_backend, GHC_KIND_BACKEND)
INSTANCE_GETTER(ghc_cache, GHC_KIND_CACHE)
INSTANCE_GETTER(ghc_model, GHC_KIND_MODEL)
INSTANCE_GETTER(ghc_network, GHC_KIND_NETWORK)
INSTANCE_GETTER(ghc_optimizer, GHC_KIND_OPTIMIZER)
INSTANCE_GETTER(ghc_scheduler, GHC_KIND_SCHEDULER)
#undef INSTANCE_GETTER

/* ---- the encoders, made on demand ------------------------------------------------------------- */

static struct ghc_instance *on_demand(ghc_core_t *core, enum ghc_kind kind)
{
    if (core->inst[kind])
        return core->inst[kind];
    if (!core->config) {
        ghc_error_set(core, GHC_EINVAL, "run: no configuration loaded");
        return NULL;
    }
    ghc_cfg_t *cfg = ghc_config_section(core, ghc_kind_name(kind));
    if (!cfg) {
        ghc_error_set(core, GHC_ECONFIG, "%s: the configuration has no `%s` section (e.g. %s = { plugin = \"%s\"; "
                      "path = \"...\"; };)", core->config->file, ghc_kind_name(kind), ghc_kind_name(kind),
                      kind == GHC_KIND_VAE ? "wanvae" : "umt5");
        return NULL;
    }
    /* outside a run (gh200core prepare) the memory policy the encoders allocate through,
     * where the configuration names one: without it a GPU encoder would have no device memory */
    ghc_cfg_t *mc = ghc_config_section(core, ghc_kind_name(GHC_KIND_MEMPOLICY));
    if (!core->inst[GHC_KIND_MEMPOLICY] && mc && instance_create(core, GHC_KIND_MEMPOLICY, mc) < 0)
        return NULL;
    return instance_create(core, kind, cfg) < 0 ? NULL : core->inst[kind];
}

#define EN_OPS(type, x) ((const struct type *)((struct ghc_instance *)(x))->ops)
#define EN_SELF(x) (((struct ghc_instance *)(x))->self)
#define EN_CORE(x) (((struct ghc_instance *)(x))->core)

ghc_vae_t *ghc_vae_get(ghc_core_t *core) { return (ghc_vae_t *)on_demand(core, GHC_KIND_VAE); }

int ghc_vae_info(ghc_vae_t *vae, struct ghc_vae_info *out)
{
    uint64_t seq = ghc_error_seq(EN_CORE(vae));
    int rc = EN_OPS(ghc_vae_ops, vae)->info(EN_SELF(vae), out);
    return rc < 0 ? ghc_error_member(EN_CORE(vae), seq, rc, "vae", EN_OPS(ghc_vae_ops, vae)->name, "info", NULL) : rc;
}

int ghc_vae_encode(ghc_vae_t *vae, const ghc_tensor_t *video, ghc_tensor_t **latent)
{
    ghc_core_t *core = EN_CORE(vae);
    struct ghc_vae_info in = { .struct_size = sizeof(in) };
    *latent = NULL;
    int rc = ghc_vae_info(vae, &in);
    if (rc < 0)
        return rc;
    const int64_t *sh = ghc_tensor_shape(video);
    if (ghc_tensor_ndim(video) != 4 || sh[0] != 3 || in.t_stride < 1 || in.s_stride < 1 || (sh[1] - 1) % in.t_stride ||
        sh[2] % in.s_stride || sh[3] % in.s_stride || ghc_tensor_dtype(video) != GHC_DTYPE_F32 ||
        ghc_tensor_device(video) != GHC_DEVICE_CPU)
        return ghc_error_set(core, GHC_EINVAL, "vae: a clip [3, F, H, W] of f32 on the CPU with F = 1 + %lld k and H, W "
                             "multiples of %lld is expected, not %s [%lld, %lld, %lld, %lld]", (long long)in.t_stride,
                             (long long)in.s_stride, ghc_dtype_name(ghc_tensor_dtype(video)),
                             (long long)(ghc_tensor_ndim(video) > 0 ? sh[0] : 0),
                             (long long)(ghc_tensor_ndim(video) > 1 ? sh[1] : 0),
                             (long long)(ghc_tensor_ndim(video) > 2 ? sh[2] : 0),
                             (long long)(ghc_tensor_ndim(video) > 3 ? sh[3] : 0));
    uint64_t seq = ghc_error_seq(core);
    rc = EN_OPS(ghc_vae_ops, vae)->encode(EN_SELF(vae), video, latent);
    return rc < 0 ? ghc_error_member(core, seq, rc, "vae", EN_OPS(ghc_vae_ops, vae)->name, "encode", NULL) : rc;
}

int ghc_vae_decode(ghc_vae_t *vae, const ghc_tensor_t *latent, ghc_tensor_t **video)
{
    ghc_core_t *core = EN_CORE(vae);
    *video = NULL;
    if (!EN_OPS(ghc_vae_ops, vae)->decode)
        return ghc_error_set(core, GHC_EUNSUPPORTED, "vae '%s' has no decoder", EN_OPS(ghc_vae_ops, vae)->name);
    uint64_t seq = ghc_error_seq(core);
    int rc = EN_OPS(ghc_vae_ops, vae)->decode(EN_SELF(vae), latent, video);
    return rc < 0 ? ghc_error_member(core, seq, rc, "vae", EN_OPS(ghc_vae_ops, vae)->name, "decode", NULL) : rc;
}

ghc_text_encoder_t *ghc_text_encoder_get(ghc_core_t *core)
{
    return (ghc_text_encoder_t *)on_demand(core, GHC_KIND_TEXT_ENCODER);
}

int ghc_text_encoder_info(ghc_text_encoder_t *te, struct ghc_text_encoder_info *out)
{
    uint64_t seq = ghc_error_seq(EN_CORE(te));
    int rc = EN_OPS(ghc_text_encoder_ops, te)->info(EN_SELF(te), out);
    return rc < 0 ? ghc_error_member(EN_CORE(te), seq, rc, "text_encoder", EN_OPS(ghc_text_encoder_ops, te)->name,
                                     "info", NULL) : rc;
}

int ghc_text_encoder_encode(ghc_text_encoder_t *te, const char *text, ghc_tensor_t **embed)
{
    *embed = NULL;
    uint64_t seq = ghc_error_seq(EN_CORE(te));
    int rc = EN_OPS(ghc_text_encoder_ops, te)->encode(EN_SELF(te), text, embed);
    return rc < 0 ? ghc_error_member(EN_CORE(te), seq, rc, "text_encoder", EN_OPS(ghc_text_encoder_ops, te)->name,
                                     "encode", NULL) : rc;
}

#define MP_OPS(mp) ((const struct ghc_mempolicy_ops *)((struct ghc_instance *)(mp))->ops)
#define MP_SELF(mp) (((struct ghc_instance *)(mp))->self)
#define MP_CORE(mp) (((struct ghc_instance *)(mp))->core)

/* The memory wrappers leave the error buffer as it is on success: they may run in the cleanup
 * after an earlier failure, whose message must stay. A member's own message counts from `seq`
 * on. */
static int mem_failed(ghc_mempolicy_t *mp, uint64_t seq, int rc, const char *member)
{
    return ghc_error_member(MP_CORE(mp), seq, rc, "mempolicy", MP_OPS(mp)->name, member, NULL);
}

_Static_assert(GHC_ROLE_COUNT <= GHC_ROLE_MAX, "struct ghc_mem_stats has room for GHC_ROLE_MAX roles");

const char *ghc_mem_role_name(enum ghc_mem_role role)
{
    static const char *const names[GHC_ROLE_COUNT] = {
        "weights", "weights_inactive", "adapter", "grads", "optimizer_state",
        "activations", "latents", "text_embeds", "masks", "workspace", "saved",
        "encoder_weights", "encoder_activations",
    };
    return (unsigned)role < GHC_ROLE_COUNT ? names[role] : "?";
}

int ghc_mem_alloc(ghc_mempolicy_t *mp, size_t bytes, enum ghc_mem_role role, int device, void **ptr)
{
    *ptr = NULL;
    if ((unsigned)role >= GHC_ROLE_COUNT)
        return ghc_error_set(MP_CORE(mp), GHC_EINVAL, "mem: role %d out of range", role);
    uint64_t seq = ghc_error_seq(MP_CORE(mp));
    int rc = MP_OPS(mp)->alloc(MP_SELF(mp), bytes, role, device, ptr);
    if (rc < 0)
        *ptr = NULL;
    return mem_failed(mp, seq, rc, "alloc");
}

void ghc_mem_release(ghc_mempolicy_t *mp, void *ptr)
{
    if (ptr)
        MP_OPS(mp)->release(MP_SELF(mp), ptr);
}

int ghc_mem_advise(ghc_mempolicy_t *mp, void *ptr, size_t bytes, enum ghc_mem_role role)
{
    if (!MP_OPS(mp)->advise)
        return 0;
    if ((unsigned)role >= GHC_ROLE_COUNT)   /* policies index their counters by role */
        return ghc_error_set(MP_CORE(mp), GHC_EINVAL, "mem: role %d out of range", role);
    uint64_t seq = ghc_error_seq(MP_CORE(mp));
    return mem_failed(mp, seq, MP_OPS(mp)->advise(MP_SELF(mp), ptr, bytes, role), "advise");
}

int ghc_mem_prefetch(ghc_mempolicy_t *mp, void *ptr, size_t bytes, int device, void *stream)
{
    if (!MP_OPS(mp)->prefetch)
        return 0;
    uint64_t seq = ghc_error_seq(MP_CORE(mp));
    return mem_failed(mp, seq, MP_OPS(mp)->prefetch(MP_SELF(mp), ptr, bytes, device, stream), "prefetch");
}

int ghc_mem_phase(ghc_mempolicy_t *mp, enum ghc_mem_phase phase, int64_t index)
{
    if (!MP_OPS(mp)->phase)
        return 0;
    uint64_t seq = ghc_error_seq(MP_CORE(mp));
    return mem_failed(mp, seq, MP_OPS(mp)->phase(MP_SELF(mp), phase, index), "phase");
}

int ghc_mem_stats(ghc_mempolicy_t *mp, struct ghc_mem_stats *out)
{
    int rc = 0;
    if (MP_OPS(mp)->stats) {
        uint64_t seq = ghc_error_seq(MP_CORE(mp));
        rc = mem_failed(mp, seq, MP_OPS(mp)->stats(MP_SELF(mp), out), "stats");
    }
    if (out->struct_size >= offsetof(struct ghc_mem_stats, n_roles) + sizeof(out->n_roles))
        out->n_roles = GHC_ROLE_COUNT;
    return rc;
}

/* ---- trim, map, group, platforms, probes ----------------------------------------------------- */

int ghc_mem_trim(ghc_mempolicy_t *mp, bool hard)
{
    if (!MP_OPS(mp)->trim)
        return 0;
    uint64_t seq = ghc_error_seq(MP_CORE(mp));
    return mem_failed(mp, seq, MP_OPS(mp)->trim(MP_SELF(mp), hard), "trim");
}

void *ghc_mem_map(ghc_mempolicy_t *mp, void *ptr)
{
    return mp && ptr && MP_OPS(mp)->map ? MP_OPS(mp)->map(MP_SELF(mp), ptr) : ptr;
}

int ghc_mem_group(ghc_mempolicy_t *mp, int64_t group, void *const *ptrs, const size_t *bytes, int n)
{
    if (!MP_OPS(mp)->group)
        return 0;
    uint64_t seq = ghc_error_seq(MP_CORE(mp));
    return mem_failed(mp, seq, MP_OPS(mp)->group(MP_SELF(mp), group, ptrs, bytes, n), "group");
}

/* ---- saved activations ------------------------------------------------------------------------ */

int ghc_mem_saved_begin(ghc_mempolicy_t *mp, void *ptr, size_t bytes, int64_t unit, bool write, void *stream,
                        void **at)
{
    *at = ptr;
    if (!mp || !ptr || !MP_OPS(mp)->saved_begin || !MP_OPS(mp)->saved_end)
        return 0;
    uint64_t seq = ghc_error_seq(MP_CORE(mp));
    int rc = mem_failed(mp, seq, MP_OPS(mp)->saved_begin(MP_SELF(mp), ptr, bytes, unit, write, stream, at),
                        "saved_begin");
    if (rc == 0 && !*at)
        rc = ghc_error_set(MP_CORE(mp), GHC_EINVAL, "mempolicy \"%s\": saved_begin gave no address for unit %lld",
                           MP_OPS(mp)->name, (long long)unit);
    if (rc < 0)
        *at = NULL;
    return rc;
}

int ghc_mem_saved_end(ghc_mempolicy_t *mp, void *ptr, void *stream)
{
    if (!mp || !ptr || !MP_OPS(mp)->saved_begin || !MP_OPS(mp)->saved_end)
        return 0;
    uint64_t seq = ghc_error_seq(MP_CORE(mp));
    return mem_failed(mp, seq, MP_OPS(mp)->saved_end(MP_SELF(mp), ptr, stream), "saved_end");
}

const char *ghc_mem_usage_text(const uint64_t *bytes_role, int32_t n_roles, char *buf, size_t len)
{
    bool done[GHC_ROLE_MAX] = { false };
    int n = n_roles < 0 ? 0 : n_roles > GHC_ROLE_MAX ? GHC_ROLE_MAX : (int)n_roles;
    size_t at = 0;
    buf[0] = '\0';
    for (;;) {
        int best = -1;
        for (int r = 0; r < n; r++)
            if (!done[r] && bytes_role[r] && (best < 0 || bytes_role[r] > bytes_role[best]))
                best = r;
        if (best < 0 || at >= len)
            break;
        done[best] = true;
        double b = (double)bytes_role[best];
        const char *u = b >= 1073741824.0 ? "GiB" : b >= 1048576.0 ? "MiB" : b >= 1024.0 ? "KiB" : "B";
        double v = b >= 1073741824.0 ? b / 1073741824.0 : b >= 1048576.0 ? b / 1048576.0 : b >= 1024.0 ? b / 1024.0 : b;
        int w = snprintf(buf + at, len - at, "%s%s %.1f %s", at ? ", " : "", ghc_mem_role_name((enum ghc_mem_role)best), v, u);
        at += w > 0 ? (size_t)w : 0;
    }
    if (!buf[0])
        snprintf(buf, len, "nothing");
    return buf;
}

int ghc_mem_probe(ghc_core_t *core, const char *plugin, const struct ghc_probe_opts *opts, struct ghc_probe *out)
{
    int rc = ghc_plugin_load(core, plugin);
    if (rc < 0)
        return rc;
    const struct ghc_registered *r = ghc_registry_find(core, GHC_KIND_MEMPOLICY, plugin);
    const struct ghc_mempolicy_ops *ops = r ? r->ops : NULL;
    if (!ops || !ops->probe)
        return ghc_error_set(core, GHC_ENOTFOUND, "mem: mempolicy '%s' has no probe", plugin);
    uint64_t seq = ghc_error_seq(core);
    return ghc_error_member(core, seq, ops->probe(core, opts, out), "mempolicy", plugin, "probe", NULL);
}

const char *ghc_mem_platform_name(enum ghc_mem_platform p)
{
    static const char *const names[] = { "none", "discrete", "coherent", "integrated" };
    return (unsigned)p < sizeof(names) / sizeof(names[0]) ? names[p] : "?";
}

void ghc_probe_add(struct ghc_probe *p, const char *section, const char *key, enum ghc_probe_mark mark,
                   double value, const char *unit, const char *fmt, ...)
{
    if (!p || p->n_items >= p->cap)
        return;
    struct ghc_probe_item *it = &p->items[p->n_items++];
    memset(it, 0, sizeof(*it));
    snprintf(it->section, sizeof(it->section), "%s", section);
    snprintf(it->key, sizeof(it->key), "%s", key);
    snprintf(it->unit, sizeof(it->unit), "%s", unit ? unit : "");
    it->value = value;
    it->mark = mark;
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(it->text, sizeof(it->text), fmt, ap);
        va_end(ap);
    }
}

#define SC_OPS(s) ((const struct ghc_scheduler_ops *)((struct ghc_instance *)(s))->ops)

int32_t ghc_scheduler_micro_batches(ghc_scheduler_t *s, int64_t step)
{
    return SC_OPS(s)->micro_batches(((struct ghc_instance *)s)->self, step);
}

float ghc_scheduler_lr_factor(ghc_scheduler_t *s, int64_t step)
{
    return SC_OPS(s)->lr_factor(((struct ghc_instance *)s)->self, step);
}
