/* uvm_sm.c: the pure part of the gh200_uvm policy (state machine, platform, cap, advice,
 * settings); see uvm_sm.h. No CUDA here: tests/test_mem.c drives it with a simulated budget. */
#include <stdlib.h>
#include <string.h>

#include "uvm_sm.h"

/* ---- platform and cap ------------------------------------------------------------------------ */

enum ghc_mem_platform uvm_platform_classify(int integrated, int uses_host_page_tables, int concurrent_managed)
{
    if (integrated == 1)
        return GHC_PLATFORM_INTEGRATED;
    if (uses_host_page_tables == 1)
        return GHC_PLATFORM_COHERENT;
    if (concurrent_managed == 1)
        return GHC_PLATFORM_DISCRETE;
    return GHC_PLATFORM_NONE;
}

uint64_t uvm_cap(enum ghc_mem_platform p, uint64_t total, uint64_t free_bytes, uint64_t host_avail, double ratio,
                 uint64_t headroom, bool *capped)
{
    double want = ratio * (double)total;
    uint64_t cap = want >= 1.8e19 ? UINT64_MAX : (uint64_t)want;
    *capped = false;
    switch (p) {
    case GHC_PLATFORM_DISCRETE: {
        uint64_t safe = free_bytes > headroom ? free_bytes - headroom : 0;
        if (safe < cap) {
            cap = safe;
            *capped = true;
        }
        return cap;
    }
    case GHC_PLATFORM_COHERENT:
        return cap < host_avail ? cap : host_avail;
    case GHC_PLATFORM_INTEGRATED: {
        uint64_t safe = host_avail > headroom ? host_avail - headroom : 0;
        return cap < safe ? cap : safe;
    }
    default:
        return 0;
    }
}

/* ---- settings ----------------------------------------------------------------------------------- */

static const char *const pattern_names[] = { "gpu_first", "balanced", "cpu_first" };

const char *uvm_pattern_name(enum uvm_pattern p)
{
    return (unsigned)p < 3 ? pattern_names[p] : "?";
}

bool uvm_pattern_parse(const char *text, enum uvm_pattern *out)
{
    for (int i = 0; i < 3; i++)
        if (text && strcmp(text, pattern_names[i]) == 0) {
            *out = (enum uvm_pattern)i;
            return true;
        }
    return false;
}

bool uvm_ratio_parse(const char *text, double *out)
{
    char *end;
    if (!text || !*text)
        return false;
    double v = strtod(text, &end);
    if (*end != '\0' || !(v > 0.0) || v > 1000.0)   /* !(v > 0) also refuses NaN */
        return false;
    *out = v;
    return true;
}

/* ---- advice ----------------------------------------------------------------------------------- */

enum uvm_advice uvm_advice_for(enum ghc_mem_role role, enum uvm_pattern pattern, int stage, bool hints,
                               bool gpu_fits)
{
    if (!hints)
        return UVM_ADVICE_NONE;
    enum uvm_advice want;
    switch (role) {
    case GHC_ROLE_LATENTS:
    case GHC_ROLE_WEIGHTS_INACTIVE:
        return UVM_ADVICE_HOST;
    case GHC_ROLE_WEIGHTS:
    case GHC_ROLE_ENCODER_WEIGHTS:   /* read by every step of an encoder, as the model's weights */
    case GHC_ROLE_TEXT_EMBEDS:
    case GHC_ROLE_MASKS:
        want = UVM_ADVICE_GPU;
        break;
    case GHC_ROLE_OPTIMIZER_STATE:
        if (stage >= 1)
            return UVM_ADVICE_HOST;
        /* fall through */
    default:
        want = pattern == UVM_GPU_FIRST ? UVM_ADVICE_GPU : pattern == UVM_CPU_FIRST ? UVM_ADVICE_HOST : UVM_ADVICE_NONE;
        break;
    }
    /* GPU-preferred beyond the device budget would thrash forever */
    return want == UVM_ADVICE_GPU && !gpu_fits ? UVM_ADVICE_NONE : want;
}

enum uvm_kind uvm_kind_for(enum ghc_mem_role role, bool hints)
{
    if (role == GHC_ROLE_WORKSPACE)
        return UVM_KIND_DEVICE;
    if (hints && (role == GHC_ROLE_LATENTS || role == GHC_ROLE_WEIGHTS_INACTIVE))
        return UVM_KIND_MANAGED;
    return UVM_KIND_STAGE;
}

/* ---- the state machine ------------------------------------------------------------------------ */

void uvm_sm_init(struct uvm_sm *sm, uint64_t total, double threshold, uint64_t min_bytes, double hysteresis,
                 uint64_t managed_cap, uint64_t headroom, bool discrete)
{
    uint64_t t = (uint64_t)(threshold * (double)total), floor = min_bytes < total / 2 ? min_bytes : total / 2;
    if (t < floor)   /* the minimum never takes more than half of a small device */
        t = floor;
    *sm = (struct uvm_sm){ .cfg = { .total = total, .t_in = t, .hysteresis = (uint64_t)(hysteresis * (double)total),
                                    .managed_cap = managed_cap, .headroom = headroom, .discrete = discrete } };
}

static uint64_t left_after(uint64_t free_bytes, uint64_t bytes)
{
    return free_bytes > bytes ? free_bytes - bytes : 0;
}

static void set_stage(struct uvm_sm *sm, int stage)
{
    if (sm->stage != stage) {
        sm->stage = stage;
        sm->transitions++;
    }
}

/* May `bytes` more managed memory be held, with `free_bytes` free on the device? */
static bool managed_fits(const struct uvm_sm *sm, uint64_t bytes, uint64_t free_bytes)
{
    if (sm->managed + bytes > sm->cfg.managed_cap || sm->managed + bytes < sm->managed)
        return false;
    /* discrete: all managed bytes, wherever they are, fit the device's free memory minus the
     * headroom, so no migration can oversubscribe it (oversubscribed managed memory can hang a
     * discrete GPU). Pages already on the
     * device lower free_bytes too: counted twice, on the safe side. */
    return !sm->cfg.discrete || sm->managed + bytes + sm->cfg.headroom <= free_bytes;
}

static enum uvm_result place_managed(struct uvm_sm *sm, const struct uvm_env *env, uint64_t bytes, uint64_t f,
                                     enum uvm_where *where)
{
    if (!managed_fits(sm, bytes, f)) {
        env->hard(env->user);
        sm->hard++;
        if (!managed_fits(sm, bytes, env->free_bytes(env->user)))
            return UVM_OOM_CAP;
    }
    sm->managed += bytes;
    *where = UVM_AT_MANAGED;
    return UVM_OK;
}

enum uvm_result uvm_sm_place(struct uvm_sm *sm, const struct uvm_env *env, uint64_t bytes, enum uvm_kind kind,
                             enum uvm_where *where)
{
    uint64_t f = env->free_bytes(env->user);
    if (kind == UVM_KIND_MANAGED)
        return place_managed(sm, env, bytes, f, where);
    /* the stage, from the free memory this request would leave on the device */
    if (sm->stage == 0 && left_after(f, bytes) < sm->cfg.t_in) {
        env->light(env->user);   /* before changing stage, and whenever a request would cross t_in */
        sm->light++;
        f = env->free_bytes(env->user);
        if (left_after(f, bytes) < sm->cfg.t_in)
            set_stage(sm, 1);
    } else if (sm->stage == 1 && left_after(f, bytes) >= sm->cfg.t_in + sm->cfg.hysteresis) {
        set_stage(sm, 0);
    }
    if (sm->stage == 0 || kind == UVM_KIND_DEVICE) {
        if (bytes + sm->cfg.headroom <= f) {
            *where = UVM_AT_DEVICE;
            return UVM_OK;
        }
        if (kind == UVM_KIND_DEVICE) {
            env->hard(env->user);
            sm->hard++;
            if (bytes + sm->cfg.headroom <= env->free_bytes(env->user)) {
                *where = UVM_AT_DEVICE;
                return UVM_OK;
            }
            return UVM_OOM_DEVICE;
        }
    }
    return place_managed(sm, env, bytes, f, where);
}

enum uvm_result uvm_sm_device_failed(struct uvm_sm *sm, const struct uvm_env *env, uint64_t bytes, bool retried,
                                     enum uvm_where *where)
{
    if (!retried) {
        env->hard(env->user);
        sm->hard++;
        *where = UVM_AT_DEVICE;
        return UVM_OK;
    }
    set_stage(sm, 1);
    return place_managed(sm, env, bytes, env->free_bytes(env->user), where);
}

void uvm_sm_release(struct uvm_sm *sm, uint64_t bytes)
{
    sm->managed = sm->managed > bytes ? sm->managed - bytes : 0;
}

void uvm_sm_reevaluate(struct uvm_sm *sm, uint64_t free_bytes)
{
    if (sm->stage == 1 && free_bytes >= sm->cfg.t_in + sm->cfg.hysteresis)
        set_stage(sm, 0);
    else if (sm->stage == 0 && free_bytes < sm->cfg.t_in)
        set_stage(sm, 1);
}
