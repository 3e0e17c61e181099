/* estimate.c: `gh200core estimate -c train.cfg`: the memory a configured run will take, by role
 * and by location, before anything is loaded. The plugins the configuration names know their
 * own part and say it through the contract: the model (its estimate member: weights per expert
 * as loaded, one block's weights, activations with and without checkpointing, the backward
 * scratch, the text context and the batch's tensors, its targets' shapes) and the network (its
 * estimate member: the adapters and their grads on those targets). This file adds the optimizer
 * state, places each role by the memory policy (the saved activations, GHC_ROLE_SAVED: pinned
 * on the host with a ring of device buffers under offload and gh200_uvm), and prints; given the
 * card's memory, a verdict, and for a run that does not fit the first plan that does (another
 * policy, saved activations on the host, one of the model's leaner checkpointing modes). Uses the
 * public API only; tests/test_mem and test_mem_cuda link it to compare with a measured peak. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <gh200core/gh200core.h>
#include <gh200core/dataset.h>
#include <gh200core/mempolicy.h>
#include <gh200core/ops.h>

#include "cli.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

enum { AT_HOST = 0, AT_DEVICE, AT_MANAGED, AT_PINNED, AT_COUNT };
static const char *const at_names[AT_COUNT] = { "host", "device", "managed", "pinned host" };

/* Load the plugin `section` names (`name`); a failure is put behind where it was named, as a
 * run puts it ("train.cfg:5: model: plugin 'x': ghc_x.so not found in: ..."). */
static int load_named(ghc_core_t *core, ghc_cfg_t *section, const char *kind, const char *name)
{
    int rc = ghc_plugin_load(core, name);
    if (rc >= 0 || !section)
        return rc;
    char msg[1024];
    snprintf(msg, sizeof(msg), "%s", ghc_error_message(core));
    return ghc_error_set(core, rc, "%s: %s: %s", ghc_cfg_where(section, "plugin"), kind, msg);
}

/* ---- placement ------------------------------------------------------------------------------- */

/* The settings a plan changes: the memory policy, where it keeps saved activations, and the
 * model's figures under a checkpointing mode (struct ghc_model_mode). */
struct plan {
    const char *policy;
    bool        saved_device;   /* offload / gh200_uvm: saved = "device" */
    int64_t     ring, sring, resident;   /* offload: resident blocks per expert */
    uint64_t    acts, saved, saved_unit;
};

/* Place each role by the policy into out (role, where, at, ring, saved_ring). */
static void place(const struct ghc_model_memory *mm, const struct ghc_network_memory *nm, bool adapters,
                  const struct plan *p, struct ghc_estimate *out)
{
    uint64_t adapter = adapters ? nm->params : 0;
    bool offload = strcmp(p->policy, "offload") == 0, host = strcmp(p->policy, "host") == 0;
    bool uvm = strcmp(p->policy, "gh200_uvm") == 0;
    /* saved activations: pinned on the host through a ring of device buffers (offload, and
     * gh200_uvm unless integrated, which estimate cannot tell), else where the policy puts all */
    bool saved_off = (offload || uvm) && !p->saved_device && p->saved > 0;
    memset(out->role, 0, sizeof(out->role));
    memset(out->at, 0, sizeof(out->at));
    out->role[GHC_ROLE_WEIGHTS] = mm->weights;
    out->role[GHC_ROLE_WEIGHTS_INACTIVE] = mm->weights_inactive;
    out->role[GHC_ROLE_ADAPTER] = adapter;
    out->role[GHC_ROLE_GRADS] = adapters ? nm->grads : 0;
    out->role[GHC_ROLE_OPTIMIZER_STATE] = adapter ? 2 * adapter : 0;   /* adamw m, v; automagic alike */
    out->role[GHC_ROLE_ACTIVATIONS] = p->acts - p->saved + mm->backward_scratch;
    out->role[GHC_ROLE_SAVED] = p->saved;
    out->role[GHC_ROLE_TEXT_EMBEDS] = mm->text_embeds;
    out->role[GHC_ROLE_LATENTS] = mm->latents;
    for (int r = 0; r < GHC_ROLE_COUNT; r++) {
        int at = AT_DEVICE;
        if (host)
            at = AT_HOST;
        else if (offload && (r == GHC_ROLE_WEIGHTS || r == GHC_ROLE_WEIGHTS_INACTIVE))
            at = AT_PINNED;
        else if (saved_off && r == GHC_ROLE_SAVED)
            at = AT_PINNED;
        else if (uvm && (r == GHC_ROLE_WEIGHTS_INACTIVE || r == GHC_ROLE_LATENTS))
            at = AT_MANAGED;
        out->where[r] = at;
        out->at[at] += out->role[r];
    }
    /* the ring of block buffers, and offload's resident blocks (each expert's; the model's
     * blocks counted as its weights over one block's, at most) */
    uint64_t blocks = mm->blocks > 0 ? (uint64_t)mm->blocks : mm->block ? mm->weights / mm->block : 0;
    uint64_t res = (uint64_t)p->resident;
    out->ring = offload ? ((uint64_t)p->ring + (res < blocks ? res : blocks) * (uint64_t)(mm->experts > 1 ? mm->experts : 1)) *
                mm->block : 0;
    out->saved_ring = saved_off ? (uint64_t)p->sring * (p->saved_unit + 256) : 0;   /* the largest unit */
    out->at[AT_DEVICE] += out->ring + out->saved_ring;
    /* the allowance: a fixed part, and the pool's slack over what is allocated and freed again
     * during a step (what the card holds beyond the weights, the ring and resident blocks, the
     * adapters and their optimizer state, which are allocated once) */
    uint64_t fixed = out->ring;
    static const int once[] = { GHC_ROLE_WEIGHTS, GHC_ROLE_WEIGHTS_INACTIVE, GHC_ROLE_ADAPTER, GHC_ROLE_GRADS,
                                GHC_ROLE_OPTIMIZER_STATE };
    for (size_t i = 0; i < sizeof(once) / sizeof(once[0]); i++)
        fixed += out->where[once[i]] == AT_DEVICE ? out->role[once[i]] : 0;
    out->device_dynamic = out->at[AT_DEVICE] > fixed ? out->at[AT_DEVICE] - fixed : 0;
    out->device_total = out->at[AT_DEVICE] ? out->at[AT_DEVICE] + (uint64_t)(GHC_ESTIMATE_ALLOWANCE_GIB * GIB +
                        GHC_ESTIMATE_ALLOWANCE_SHARE * (double)out->device_dynamic) : 0;
    /* what a step copies between host and card: the streamed blocks' weights (each pass) and
     * the saved activations kept off the card (out in the forward, back in the backward) */
    out->streamed = offload && res < blocks ? (blocks - res) * mm->block : 0;
    out->saved_off = saved_off ? p->saved : 0;
}

/* ---- the plan search -------------------------------------------------------------------------- */

/* Append the --set arguments of a model mode's "key=value key=value" to buf. */
static void plan_sets(char *buf, size_t len, const char *section, const char *pairs)
{
    char tmp[128];
    snprintf(tmp, sizeof(tmp), "%s", pairs);
    for (char *save = NULL, *kv = strtok_r(tmp, " ", &save); kv; kv = strtok_r(NULL, " ", &save)) {
        size_t n = strlen(buf);
        snprintf(buf + n, len > n ? len - n : 0, "%s--set %s.%s", n ? " " : "", section, kv);
    }
}

/* When the configured run does not fit `limit` bytes: the first plan that does, changing as
 * little as it can. The model's modes from the configured one on (most memory first); for
 * each, the placements: as configured; saved activations on the host (offload, gh200_uvm);
 * the offload policy with saved activations on the host (in place of device). Into out->plan;
 * false when none fits. */
static bool plan_search(const struct ghc_model_memory *mm, const struct ghc_network_memory *nm, bool adapters,
                        const struct plan *cfg, uint64_t limit, struct ghc_estimate *out)
{
    struct ghc_model_mode cur = { .activations = cfg->acts, .saved = cfg->saved, .saved_unit = cfg->saved_unit };
    int m0 = mm->n_modes > 0 ? mm->mode : 0, m1 = mm->n_modes > 0 ? mm->n_modes : 1;
    bool off_policy = strcmp(cfg->policy, "offload") == 0 || strcmp(cfg->policy, "gh200_uvm") == 0;
    for (int m = m0; m < m1; m++) {
        const struct ghc_model_mode *mode = mm->n_modes > 0 ? &mm->modes[m] : &cur;
        for (int k = 0; k < 3; k++) {
            struct plan p = *cfg;
            const char *set_policy = NULL;
            bool set_saved = false;
            if (k == 0 && m == m0)
                continue;   /* the configured run */
            if (k == 1) {
                if (!off_policy || !cfg->saved_device)
                    continue;
                p.saved_device = false;
                set_saved = true;
            }
            if (k == 2) {
                if (off_policy || strcmp(cfg->policy, "host") == 0)
                    continue;
                p.policy = set_policy = "offload";
                set_saved = cfg->saved_device;
                p.saved_device = false;
            }
            p.acts = mode->activations;
            p.saved = mode->saved;
            p.saved_unit = mode->saved_unit;
            struct ghc_estimate e;
            place(mm, nm, adapters, &p, &e);
            if (e.device_total > limit)
                continue;
            out->plan[0] = 0;
            if (set_policy)
                snprintf(out->plan, sizeof(out->plan), "--set mempolicy.plugin=%s", set_policy);
            if (set_saved)
                plan_sets(out->plan, sizeof(out->plan), "mempolicy", "saved=host");
            if (m != m0)
                plan_sets(out->plan, sizeof(out->plan), "model", mode->set);
            out->plan_total = e.device_total;
            return true;
        }
    }
    return false;
}

/* ---- the estimate ------------------------------------------------------------------------------- */

int ghc_cli_estimate(ghc_core_t *core, const struct ghc_estimate_opts *o, struct ghc_estimate *out, FILE *print)
{
    int rc;
    ghc_cfg_t *model = ghc_config_section(core, "model"), *net = ghc_config_section(core, "network");
    ghc_cfg_t *opt = ghc_config_section(core, "optimizer"), *mem = ghc_config_section(core, "mempolicy");
    const char *model_name = NULL, *net_name = "lycoris", *policy = "host", *opt_name = "adamw";
    struct ghc_model_memory mm = { .struct_size = sizeof(mm) };
    struct ghc_network_memory nm = { .struct_size = sizeof(nm) };
    memset(out, 0, sizeof(*out));
    out->fits = -1;
    if (!model || (rc = ghc_cfg_get_string(model, "plugin", NULL, &model_name)) < 0 || !model_name)
        return ghc_error_set(core, GHC_ECONFIG, "estimate: the configuration has no model section with a plugin");
    const uint64_t B = (uint64_t)(o->batch > 0 ? o->batch : 1), L = (uint64_t)(o->tokens > 0 ? o->tokens : 32760);
    if ((rc = load_named(core, model, "model", model_name)) < 0 ||
        (rc = ghc_model_estimate(core, model_name, model, (int64_t)B, (int64_t)L, &mm)) < 0)
        return rc;
    struct plan cfg = { .ring = 2, .sring = 3 };
    if (mem && (rc = ghc_cfg_get_string(mem, "plugin", "host", &policy)) < 0)
        return rc;
    cfg.policy = policy;
    /* the keys of the policies that have them (a getter records its default in the section,
     * which must stay valid for the policy: plan = "auto" runs the policy after this) */
    bool off = strcmp(policy, "offload") == 0, saving = off || strcmp(policy, "gh200_uvm") == 0;
    if (mem && off && ((rc = ghc_cfg_get_int(mem, "ring", 2, 2, 64, &cfg.ring)) < 0 ||
                       (rc = ghc_cfg_get_int(mem, "resident", 0, 0, 100000, &cfg.resident)) < 0))
        return rc;
    const char *saved = "host";   /* gh200_uvm's "auto": the host, unless integrated (not known here) */
    if (mem && saving && ((rc = ghc_cfg_get_string(mem, "saved", off ? "host" : "auto", &saved)) < 0 ||
                          (rc = ghc_cfg_get_int(mem, "saved_ring", 3, 2, 64, &cfg.sring)) < 0))
        return rc;
    cfg.saved_device = strcmp(saved, "device") == 0;
    /* without a network section: the default network's defaults */
    if (net && (rc = ghc_cfg_get_string(net, "plugin", "lycoris", &net_name)) < 0)
        return rc;
    /* one adapter per expert with train.mode = "separate" only ("single" trains one expert,
     * "shared" one adapter for both) */
    struct ghc_model_memory nmm = mm;
    ghc_cfg_t *train = ghc_config_section(core, "train");
    const char *mode = "single";
    if (train && ghc_cfg_has(train, "mode") && (rc = ghc_cfg_get_string(train, "mode", "single", &mode)) < 0)
        return rc;
    if (strcmp(mode, "separate") != 0)
        nmm.experts = 1;
    if ((rc = load_named(core, net, "network", net_name)) < 0 ||
        (rc = ghc_network_estimate(core, net_name, net, &nmm, &nm)) < 0)
        return rc;
    if (opt)
        ghc_cfg_get_string(opt, "plugin", "adamw", &opt_name);
    bool ck = mm.checkpoint_every > 0;
    cfg.acts = ck ? mm.activations_ckpt : mm.activations_full;
    cfg.saved = mm.saved;
    cfg.saved_unit = mm.saved_unit;
    place(&mm, &nm, o->adapters, &cfg, out);
    out->activations_full = mm.activations_full;
    out->activations_ckpt = mm.activations_ckpt;
    out->flops_step = mm.flops_step;
    out->flops_forward = mm.flops_forward;
    uint64_t limit = (uint64_t)(o->device_gib * GIB);
    if (o->device_gib > 0) {
        out->fits = out->device_total <= limit;
        if (!out->fits)
            plan_search(&mm, &nm, o->adapters, &cfg, limit, out);
    }
    if (!print)
        return 0;

    fprintf(print, "model: %s, %d expert%s, %s; checkpointing %s%s\n", model_name, (int)mm.experts,
            mm.experts > 1 ? "s" : "", mm.summary, *mm.checkpointing ? mm.checkpointing : ck ? "per block" : "off",
            ck && mm.checkpoint_every > 1 ?
            " (every k-th)" : "");
    if (*mm.dims_from)
        fprintf(print, "dims:  from %s\n", mm.dims_from);
    fprintf(print, "run:   %llu x %llu tokens per micro-batch, adapters %s (%s), optimizer %s, mempolicy %s\n",
            (unsigned long long)B, (unsigned long long)L, nm.summary, o->adapters ? "counted" : "none",
            opt_name, policy);
    fprintf(print, "%-18s %12s  %s\n", "ROLE", "GiB", "WHERE");
    for (int r = 0; r < GHC_ROLE_COUNT; r++)
        if (out->role[r])
            fprintf(print, "%-18s %12.3f  %s\n", ghc_mem_role_name((enum ghc_mem_role)r), out->role[r] / GIB,
                    at_names[out->where[r]]);
    if (out->ring)
        fprintf(print, "%-18s %12.3f  %s\n", cfg.resident ? "ring + resident" : "offload ring", out->ring / GIB,
                at_names[AT_DEVICE]);
    if (out->saved_ring)
        fprintf(print, "%-18s %12.3f  %s\n", "saved ring", out->saved_ring / GIB, at_names[AT_DEVICE]);
    fprintf(print, "activations: %.3f GiB with checkpointing per block, %.3f GiB without (plus %.3f GiB backward "
            "scratch)\n", mm.activations_ckpt / GIB, mm.activations_full / GIB, mm.backward_scratch / GIB);
    fprintf(print, "total by location:");
    for (int a = 0; a < AT_COUNT; a++)
        if (out->at[a])
            fprintf(print, " %s %.3f GiB;", at_names[a], out->at[a] / GIB);
    fprintf(print, " (excludes CUDA context, library workspaces and pool slack)\n");
    if (o->device_gib > 0) {
        fprintf(print, "device: %.1f GiB estimated + %.1f GiB allowance (CUDA context, workspaces: %.2f GiB; "
                "pool slack: %.0f%% of the %.1f GiB allocated during a step) = %.1f GiB of %.1f GiB: %s\n",
                out->at[AT_DEVICE] / GIB, (out->device_total - out->at[AT_DEVICE]) / GIB, GHC_ESTIMATE_ALLOWANCE_GIB,
                100 * GHC_ESTIMATE_ALLOWANCE_SHARE, out->device_dynamic / GIB, out->device_total / GIB, o->device_gib,
                out->fits ? "fits" : "does not fit");
        if (!out->fits && *out->plan)
            fprintf(print, "plan:  %s (%.1f GiB of %.1f GiB)\n", out->plan, out->plan_total / GIB, o->device_gib);
        else if (!out->fits)
            fprintf(print, "plan:  none fits (tried the lighter checkpointing modes, saved activations on the host "
                    "and the offload policy); fewer tokens or a smaller batch\n");
    }
    return 0;
}

double ghc_cli_host_gib(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    return pages > 0 && psize > 0 ? (double)pages * (double)psize / GIB : 0.0;
}

/* ---- plan = "auto" ------------------------------------------------------------------------------ */

/* A plan the trainer may take: the policy, where it keeps saved activations and offload's
 * resident blocks; the model's checkpointing and k. */
struct auto_plan {
    const char *policy;         /* "device", "offload", or the configured policy (kept) */
    const char *ckpt;           /* "off", "block_qkv", "block_attn", "block" */
    int64_t     every, resident;
};

/* Write plan p into the configuration. final: the plan chosen: a policy other than the
 * configured one then gets a section of its own (the configured keys are not its keys); the
 * configured one keeps its keys. A trial only sets what the estimate reads. */
static int auto_set(ghc_core_t *core, const struct auto_plan *p, const char *configured, int device, bool final)
{
    ghc_cfg_t *root = ghc_config_root(core), *mem, *model = ghc_config_section(core, "model");
    int rc = 0;
    bool same = strcmp(p->policy, configured) == 0;
    if (final && !same && (rc = ghc_cfg_remove(root, "mempolicy")) < 0)
        return rc;
    if ((rc = ghc_cfg_set_group(root, "mempolicy", &mem)) < 0 || (rc = ghc_cfg_set_string(mem, "plugin", p->policy)) < 0)
        return rc;
    /* a configured device policy keeps none of the keys the offload trials set in its section */
    if (final && same && strcmp(p->policy, "device") == 0 &&
        ((rc = ghc_cfg_remove(mem, "saved")) < 0 || (rc = ghc_cfg_remove(mem, "resident")) < 0))
        return rc;
    if (strcmp(p->policy, "offload") == 0 &&
        ((rc = ghc_cfg_set_string(mem, "saved", "host")) < 0 || (rc = ghc_cfg_set_int(mem, "resident", p->resident)) < 0 ||
         (final && !same && (rc = ghc_cfg_set_int(mem, "device", device)) < 0)))
        return rc;
    if (!p->ckpt)   /* a model without these keys: the policy alone */
        return 0;
    if ((rc = ghc_cfg_set_string(model, "checkpointing", p->ckpt)) < 0)
        return rc;
    return strcmp(p->ckpt, "off") == 0 ? ghc_cfg_remove(model, "checkpoint_every")
                                        : ghc_cfg_set_int(model, "checkpoint_every", p->every);
}

/* Whether plan p fits o's card, and its host memory where eo->host_gib says it (set into the
 * configuration, estimated). */
static int auto_try(ghc_core_t *core, struct auto_plan *p, bool ck_keys, const char *configured, int device,
                    const struct ghc_estimate_opts *eo, struct ghc_estimate *e)
{
    if (!ck_keys)
        p->ckpt = NULL;
    int rc = auto_set(core, p, configured, device, false);
    if (rc == 0)
        rc = ghc_cli_estimate(core, eo, e, NULL);
    if (rc < 0)
        return rc;
    return e->fits == 1 && (eo->host_gib <= 0 || (double)(e->at[AT_HOST] + e->at[AT_PINNED]) <= eo->host_gib * GIB);
}

/* A plan's step time (s) at `flops` FLOP/s and `h2d` bytes/s each way between host and card:
 * its compute, plus what its copies take beyond AUTO_OVERLAP of the compute of their pass (a
 * copy stream runs beside the compute). The forward streams the blocks in and the saved
 * activations out (the two directions), the backward streams both in. 0: the model gives no
 * FLOPs. */
#define AUTO_OVERLAP 0.8
static double auto_time(const struct ghc_estimate *e, double flops, double h2d)
{
    if (e->flops_step <= 0)
        return 0;
    double fwd = e->flops_forward / flops, bwd = (e->flops_step - e->flops_forward) / flops;
    double in_f = (double)e->streamed / h2d, out_f = (double)e->saved_off / h2d;
    double cf = in_f > out_f ? in_f : out_f, cb = (double)(e->streamed + e->saved_off) / h2d;
    return fwd + bwd + (cf > AUTO_OVERLAP * fwd ? cf - AUTO_OVERLAP * fwd : 0) +
           (cb > AUTO_OVERLAP * bwd ? cb - AUTO_OVERLAP * bwd : 0);
}

/* The plans that fit; the choice: the fastest, or of those within GHC_PLAN_AUTO_TIE of it the
 * smallest on the card. */
#define AUTO_PLANS_MAX 64
struct auto_pick {
    const char         *dev_pol;   /* the device policy, or the configured one kept */
    int                 n;
    struct auto_plan    plan[AUTO_PLANS_MAX];
    struct ghc_estimate e[AUTO_PLANS_MAX];
    double              time[AUTO_PLANS_MAX];
};

/* Keep plan p, which fits with estimate e. */
static void auto_keep(struct auto_pick *pk, const struct auto_plan *p, const struct ghc_estimate *e, double flops,
                      double h2d)
{
    if (pk->n == AUTO_PLANS_MAX)
        return;
    pk->plan[pk->n] = *p;
    pk->e[pk->n] = *e;
    pk->time[pk->n++] = auto_time(e, flops, h2d);
}

/* Try plan p and keep it when it fits. Returns 1 fits, 0 not, or GHC_E*. */
static int auto_add(ghc_core_t *core, struct auto_plan *p, bool ck_keys, const char *configured, int device,
                    const struct ghc_estimate_opts *eo, double flops, double h2d, struct auto_pick *pk)
{
    struct ghc_estimate e;
    int fit = auto_try(core, p, ck_keys, configured, device, eo, &e);
    if (fit == 1)
        auto_keep(pk, p, &e, flops, h2d);
    return fit;
}

/* The index of the choice among pk's plans (-1: none fits). Without FLOPs (time 0) the first
 * that fits, as the candidates come fastest first. */
static int auto_choose(const struct auto_pick *pk)
{
    int c = -1;
    double fastest = 0;
    for (int i = 0; i < pk->n; i++)
        if (i == 0 || pk->time[i] < fastest)
            fastest = pk->time[i];
    for (int i = 0; i < pk->n; i++)
        if (pk->time[i] <= fastest * (1 + GHC_PLAN_AUTO_TIE) &&
            (c < 0 || (fastest > 0 && pk->e[i].device_total < pk->e[c].device_total)))
            c = i;
    return c;
}

/* The device policy (or the configured one kept) with checkpointing ck every k-th block: the
 * fewest recomputed blocks that fit, kept in pk. 1 one fits, 0 none, or GHC_E*. */
static int auto_every(ghc_core_t *core, const char *ck, int64_t blocks, bool ck_keys, const char *configured,
                      int device, const struct ghc_estimate_opts *eo, double flops, double h2d,
                      struct auto_pick *pk)
{
    int fit = 0;
    int64_t last_rec = 0;
    for (int64_t k = blocks; fit == 0 && k >= 1; k--) {
        int64_t rec = (blocks + k - 1) / k;   /* blocks recomputed with every k */
        if (rec == last_rec)
            continue;
        last_rec = rec;
        struct auto_plan p = { .policy = pk->dev_pol, .ckpt = ck, .every = k };
        fit = auto_add(core, &p, ck_keys, configured, device, eo, flops, h2d, pk);
    }
    return fit;
}

/* The streaming policy with checkpointing ck: the most resident blocks that fit (the estimate
 * grows with them), then the fewest whose predicted step is within GHC_PLAN_AUTO_TIE of that
 * one's (more would be no faster), kept in pk. 0 or GHC_E*. */
static int auto_stream(ghc_core_t *core, const char *ck, int64_t blocks, bool ck_keys, const char *configured,
                       int device, const struct ghc_estimate_opts *eo, double flops, double h2d,
                       struct auto_pick *pk)
{
    struct ghc_estimate e;
    struct auto_plan p = { .policy = "offload", .ckpt = ck, .every = 1 };
    int64_t lo = -1, hi = blocks;
    int fit = 0;
    while (lo < hi) {
        p.resident = (lo + hi + 1) / 2;
        if ((fit = auto_try(core, &p, ck_keys, configured, device, eo, &e)) < 0)
            return fit;
        if (fit)
            lo = p.resident;
        else
            hi = p.resident - 1;
    }
    if (lo < 0)
        return 0;
    p.resident = lo;
    if ((fit = auto_try(core, &p, ck_keys, configured, device, eo, &e)) < 0)
        return fit;
    /* the time falls as resident grows: the first near `most` (lo itself at the latest) */
    const double most = auto_time(&e, flops, h2d);
    for (p.resident = 0; p.resident <= lo; p.resident++) {
        if ((fit = auto_try(core, &p, ck_keys, configured, device, eo, &e)) < 0)
            return fit;
        if (fit && auto_time(&e, flops, h2d) <= most * (1 + GHC_PLAN_AUTO_TIE))
            break;
    }
    auto_keep(pk, &p, &e, flops, h2d);
    return 0;
}

/* The largest batch of tokens of the dataset's samples (its headers; before the run's
 * plugins exist: the local backend, no cache) for a model whose token covers patch[3]. */
static int auto_tokens(ghc_core_t *core, const int64_t patch[3], int64_t *tokens)
{
    ghc_dataset_t *ds;
    int rc = ghc_dataset_open(core, &ds);
    if (rc < 0)
        return rc;
    *tokens = 0;
    for (int64_t i = 0; i < ghc_dataset_samples(ds); i++) {
        struct ghc_data_sample_info in;
        if (!ghc_dataset_sample_at(ds, i, &in))
            continue;
        int64_t t = 1;
        for (int d = 0; d < 3; d++) {
            int64_t p = patch[d] > 0 ? patch[d] : 1;
            t *= (in.latent_shape[1 + d] + p - 1) / p;
        }
        *tokens = t > *tokens ? t : *tokens;
    }
    ghc_dataset_free(ds);
    return 0;
}

int ghc_cli_plan_auto(ghc_core_t *core, const struct ghc_plan_opts *o, char *chosen, size_t len)
{
    static const char *const plans[] = { "configured", "auto", NULL };
    ghc_cfg_t *root = ghc_config_root(core), *model = ghc_config_section(core, "model");
    ghc_cfg_t *mem = ghc_config_section(core, "mempolicy"), *data = ghc_config_section(core, "data");
    const char *model_name = NULL, *configured = "host";
    int which = 0, rc;
    *chosen = 0;
    if (!root || (rc = ghc_cfg_get_choice(root, "plan", 0, plans, &which)) < 0 || which == 0)
        return root ? (rc < 0 ? rc : 0) : 0;
    if (!model || (rc = ghc_cfg_get_string(model, "plugin", NULL, &model_name)) < 0 || !model_name)
        return ghc_error_set(core, GHC_ECONFIG, "%s: plan = \"auto\" needs a model section with a plugin",
                             ghc_cfg_where(root, "plan"));
    if (mem && (rc = ghc_cfg_get_string(mem, "plugin", "host", &configured)) < 0)
        return rc;
    char conf[64];
    snprintf(conf, sizeof(conf), "%s", configured);   /* the section may be replaced below */
    /* the model's device: its `device` key, else CUDA device 0 where there is one */
    int64_t device = 0;
    uint64_t fr = 0, tot = 0;
    if (ghc_cfg_has(model, "device") && (rc = ghc_cfg_get_int(model, "device", 0, -1, 1023, &device)) < 0)
        return rc;
    double gib = o->device_gib;
    if (device >= 0 && gib <= 0) {
        if (ghc_op_device_memory(core, (int)device, &fr, &tot) < 0)
            device = -1;   /* no CUDA build, or no such GPU: the model computes on the CPU */
        else
            gib = fr / GIB;
        ghc_error_clear(core);
    }
    if (device < 0 || strcmp(conf, "host") == 0) {
        snprintf(chosen, len, "plan: auto: the model computes on the CPU: the configured plan");
        return 0;
    }
    /* the tokens: given, or the dataset's largest sample (the demo's is made by the run) */
    int64_t batch = o->batch, tokens = o->tokens;
    if (tokens <= 0 && ghc_config_section(core, "demo")) {
        snprintf(chosen, len, "plan: auto: the demo makes its data during the run: the configured plan");
        return 0;
    }
    if (batch <= 0) {   /* data.batch_size, as the dataset reads it */
        batch = 1;
        if (data && (rc = ghc_cfg_get_int(data, "batch_size", 1, 1, 1 << 20, &batch)) < 0)
            return rc;
    }
    struct ghc_model_memory mm = { .struct_size = sizeof(mm) };
    if ((rc = load_named(core, model, "model", model_name)) < 0 ||
        (rc = ghc_model_estimate(core, model_name, model, batch, 1, &mm)) < 0)
        return rc;
    if (tokens <= 0 && (rc = auto_tokens(core, mm.patch, &tokens)) < 0)
        return rc;
    /* the candidates: the device policy with no recomputation, else every k-th block recomputed
     * with the attention kept, and with the attention and its q, k, v kept (block_qkv, where the
     * model has it; the fewest recomputed that fit, each); the streaming policy (offload, saved
     * activations on the host) with both; block checkpointing (the attention recomputed too) on
     * the device, and streamed. A configured gh200_uvm (or another policy of its own) is kept
     * throughout. */
    uint64_t blocks = mm.blocks > 0 ? (uint64_t)mm.blocks : mm.block ? mm.weights / mm.block : 1;
    /* the model's checkpointing keys, where its modes say it has them (wan22's) */
    bool ck_keys = false, ck_qkv = false;
    for (int m = 0; m < mm.n_modes; m++) {
        ck_keys = ck_keys || strstr(mm.modes[m].set, "checkpointing=block_attn") != NULL;
        ck_qkv = ck_qkv || strstr(mm.modes[m].set, "checkpointing=block_qkv") != NULL;
    }
    if (!ck_keys)
        blocks = 1;
    bool keep_policy = strcmp(conf, "device") != 0 && strcmp(conf, "offload") != 0;
    const char *dev_pol = keep_policy ? conf : "device", *stream_pol = keep_policy ? conf : "offload";
    /* the speeds a plan's time is weighed with */
    double flops = o->flops, h2d = o->h2d;
    bool measured = false;
    if ((flops <= 0 || h2d <= 0) && device >= 0 && !keep_policy) {
        double f = 0, b = 0;
        if (ghc_op_device_speed(core, (int)device, &f, &b) == 0 && f > 0 && b > 0) {
            flops = flops > 0 ? flops : f;
            h2d = h2d > 0 ? h2d : b;
            measured = true;
        }
        ghc_error_clear(core);
    }
    flops = flops > 0 ? flops : GHC_PLAN_AUTO_FLOPS;
    h2d = h2d > 0 ? h2d : GHC_PLAN_AUTO_H2D;
    /* a plan fits when its estimate leaves GHC_PLAN_AUTO_HEADROOM of the card free, and what it
     * keeps on the host takes at most GHC_PLAN_AUTO_HOST of the host's memory */
    double host = o->host_gib > 0 ? o->host_gib : ghc_cli_host_gib();
    struct ghc_estimate_opts eo = { .batch = batch, .tokens = tokens, .adapters = true,
                                    .device_gib = gib * (1.0 - GHC_PLAN_AUTO_HEADROOM),
                                    .host_gib = host * GHC_PLAN_AUTO_HOST };
    struct auto_pick *pk = calloc(1, sizeof(*pk));
    if (!pk)
        return ghc_error_set(core, GHC_ENOMEM, "plan: auto: out of memory");
    pk->dev_pol = dev_pol;
    struct auto_plan p = { .policy = dev_pol, .ckpt = "off", .every = 1 };
    int fit = auto_add(core, &p, ck_keys, conf, (int)device, &eo, flops, h2d, pk);
    const bool off_fits = fit == 1;   /* then no plan of the device policy recomputes */
    if (fit == 0)
        fit = auto_every(core, "block_attn", (int64_t)blocks, ck_keys, conf, (int)device, &eo, flops, h2d, pk);
    if (fit >= 0 && ck_qkv && !off_fits)
        fit = auto_every(core, "block_qkv", (int64_t)blocks, ck_keys, conf, (int)device, &eo, flops, h2d, pk);
    if (fit >= 0 && !keep_policy && ck_qkv)
        fit = auto_stream(core, "block_qkv", (int64_t)blocks, ck_keys, conf, (int)device, &eo, flops, h2d, pk);
    if (fit >= 0 && !keep_policy)
        fit = auto_stream(core, "block_attn", (int64_t)blocks, ck_keys, conf, (int)device, &eo, flops, h2d, pk);
    if (fit >= 0) {
        p = (struct auto_plan){ .policy = dev_pol, .ckpt = "block", .every = 1 };
        fit = auto_add(core, &p, ck_keys, conf, (int)device, &eo, flops, h2d, pk);
    }
    if (fit >= 0 && !keep_policy)
        fit = auto_stream(core, "block", (int64_t)blocks, ck_keys, conf, (int)device, &eo, flops, h2d, pk);
    int c = fit < 0 ? -1 : auto_choose(pk);
    struct ghc_estimate e = { 0 };
    double time = 0;
    if (fit >= 0 && c < 0) {   /* none fits: the leanest, block checkpointing, everything streamed */
        p = (struct auto_plan){ .policy = stream_pol, .ckpt = "block", .every = 1 };
        fit = auto_try(core, &p, ck_keys, conf, (int)device, &eo, &e);
        fit = fit < 0 ? fit : 0;
    } else if (fit >= 0) {
        p = pk->plan[c];
        e = pk->e[c];
        time = pk->time[c];
        fit = 1;
    }
    free(pk);
    if (fit < 0)
        return fit;
    if ((rc = auto_set(core, &p, conf, (int)device, true)) < 0)
        return rc;
    char res[48] = "";
    if (strcmp(p.policy, "offload") == 0)
        snprintf(res, sizeof(res), ", saved on the host, %lld resident blocks", (long long)p.resident);
    char ck[48];
    if (!p.ckpt)
        snprintf(ck, sizeof(ck), "as configured");
    else if (strcmp(p.ckpt, "off") == 0 || p.every <= 1)
        snprintf(ck, sizeof(ck), "%s", p.ckpt);
    else
        snprintf(ck, sizeof(ck), "%s every %lld", p.ckpt, (long long)p.every);
    char step[96] = "";
    if (fit && time > 0)
        snprintf(step, sizeof(step), ", a step about %.2f s at %.0f TFLOP/s and %.0f GB/s from the host (%s)",
                 time, flops / 1e12, h2d / 1e9, measured ? "measured" : o->flops > 0 && o->h2d > 0 ? "given" : "assumed");
    snprintf(chosen, len, "plan: auto for %lld x %lld tokens, %.1f GiB free on cuda:%d: mempolicy %s%s, "
             "checkpointing %s: %.1f GiB estimated%s%s", (long long)batch, (long long)tokens, gib, (int)device,
             p.policy, res, ck, e.device_total / GIB, step,
             fit ? "" : " (does not fit: no plan does; fewer tokens or a smaller batch)");
    return 0;
}
