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

#include <gh200core/gh200core.h>
#include <gh200core/mempolicy.h>

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
    uint64_t blocks = mm->block ? mm->weights / mm->block : 0, res = (uint64_t)p->resident;
    out->ring = offload ? ((uint64_t)p->ring + (res < blocks ? res : blocks) * (uint64_t)(mm->experts > 1 ? mm->experts : 1)) *
                mm->block : 0;
    out->saved_ring = saved_off ? (uint64_t)p->sring * (p->saved_unit + 256) : 0;   /* the largest unit */
    out->at[AT_DEVICE] += out->ring + out->saved_ring;
    out->device_total = out->at[AT_DEVICE] ? out->at[AT_DEVICE] + (uint64_t)(GHC_ESTIMATE_ALLOWANCE_GIB * GIB +
                        GHC_ESTIMATE_ALLOWANCE_SHARE * (double)out->at[AT_DEVICE]) : 0;
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
    if (mem && ((rc = ghc_cfg_get_int(mem, "ring", 2, 2, 64, &cfg.ring)) < 0 ||
                (rc = ghc_cfg_get_int(mem, "resident", 0, 0, 100000, &cfg.resident)) < 0))
        return rc;
    const char *saved = "host";
    if (mem && ((rc = ghc_cfg_get_string(mem, "saved", "host", &saved)) < 0 ||
                (rc = ghc_cfg_get_int(mem, "saved_ring", 3, 2, 64, &cfg.sring)) < 0))
        return rc;
    cfg.saved_device = strcmp(saved, "device") == 0;
    /* without a network section: the default network's defaults */
    if (net && (rc = ghc_cfg_get_string(net, "plugin", "lycoris", &net_name)) < 0)
        return rc;
    if ((rc = load_named(core, net, "network", net_name)) < 0 ||
        (rc = ghc_network_estimate(core, net_name, net, &mm, &nm)) < 0)
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
        fprintf(print, "device: %.1f GiB estimated + %.1f GiB allowance (CUDA context, workspaces, pool slack: "
                "%.1f GiB + %.0f%%, to be calibrated) = %.1f GiB of %.1f GiB: %s\n", out->at[AT_DEVICE] / GIB,
                (out->device_total - out->at[AT_DEVICE]) / GIB, GHC_ESTIMATE_ALLOWANCE_GIB,
                100 * GHC_ESTIMATE_ALLOWANCE_SHARE, out->device_total / GIB, o->device_gib,
                out->fits ? "fits" : "does not fit");
        if (!out->fits && *out->plan)
            fprintf(print, "plan:  %s (%.1f GiB of %.1f GiB)\n", out->plan, out->plan_total / GIB, o->device_gib);
        else if (!out->fits)
            fprintf(print, "plan:  none fits (tried the lighter checkpointing modes, saved activations on the host "
                    "and the offload policy); fewer tokens or a smaller batch\n");
    }
    return 0;
}
