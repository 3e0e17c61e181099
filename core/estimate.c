/* estimate.c: `gh200core estimate -c train.cfg`: the memory a configured run will take, by role
 * and by location, before anything is loaded. The plugins the configuration names know their
 * own part and say it through the contract: the model (its estimate member: weights per expert
 * as loaded, one block's weights, activations with and without checkpointing, the backward
 * scratch, the text context and the batch's tensors, its targets' shapes) and the network (its
 * estimate member: the adapters and their grads on those targets). This file adds the optimizer
 * state, places each role by the memory policy (the saved activations, GHC_ROLE_SAVED: pinned
 * on the host with a ring of device buffers under offload and gh200_uvm), and prints. Uses the
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
    if (!model || (rc = ghc_cfg_get_string(model, "plugin", NULL, &model_name)) < 0 || !model_name)
        return ghc_error_set(core, GHC_ECONFIG, "estimate: the configuration has no model section with a plugin");
    const uint64_t B = (uint64_t)(o->batch > 0 ? o->batch : 1), L = (uint64_t)(o->tokens > 0 ? o->tokens : 32760);
    if ((rc = load_named(core, model, "model", model_name)) < 0 ||
        (rc = ghc_model_estimate(core, model_name, model, (int64_t)B, (int64_t)L, &mm)) < 0)
        return rc;
    int64_t ring = 2;
    if (mem && (rc = ghc_cfg_get_string(mem, "plugin", "host", &policy)) < 0)
        return rc;
    if (mem && strcmp(policy, "offload") == 0 && (rc = ghc_cfg_get_int(mem, "ring", 2, 2, 64, &ring)) < 0)
        return rc;
    /* saved activations: pinned on the host through a ring of device buffers (offload, and
     * gh200_uvm unless integrated, which estimate cannot tell), else where the policy puts all */
    int64_t sring = 3;
    const char *saved = "host";
    bool saved_off = strcmp(policy, "offload") == 0 || strcmp(policy, "gh200_uvm") == 0;
    if (mem && saved_off && ((rc = ghc_cfg_get_string(mem, "saved", "host", &saved)) < 0 ||
                             (rc = ghc_cfg_get_int(mem, "saved_ring", 3, 2, 64, &sring)) < 0))
        return rc;
    saved_off = saved_off && strcmp(saved, "device") != 0 && mm.saved > 0;
    /* without a network section: the default network's defaults */
    if (net && (rc = ghc_cfg_get_string(net, "plugin", "lycoris", &net_name)) < 0)
        return rc;
    if ((rc = load_named(core, net, "network", net_name)) < 0 ||
        (rc = ghc_network_estimate(core, net_name, net, &mm, &nm)) < 0)
        return rc;
    if (opt)
        ghc_cfg_get_string(opt, "plugin", "adamw", &opt_name);
    bool ck = mm.checkpoint_every > 0;
    uint64_t adapter = o->adapters ? nm.params : 0;

    out->role[GHC_ROLE_WEIGHTS] = mm.weights;
    out->role[GHC_ROLE_WEIGHTS_INACTIVE] = mm.weights_inactive;
    out->role[GHC_ROLE_ADAPTER] = adapter;
    out->role[GHC_ROLE_GRADS] = o->adapters ? nm.grads : 0;
    out->role[GHC_ROLE_OPTIMIZER_STATE] = adapter ? 2 * adapter : 0;   /* adamw m, v; automagic alike */
    out->role[GHC_ROLE_ACTIVATIONS] = (ck ? mm.activations_ckpt : mm.activations_full) - mm.saved + mm.backward_scratch;
    out->role[GHC_ROLE_SAVED] = mm.saved;
    out->role[GHC_ROLE_TEXT_EMBEDS] = mm.text_embeds;
    out->role[GHC_ROLE_LATENTS] = mm.latents;
    out->activations_full = mm.activations_full;
    out->activations_ckpt = mm.activations_ckpt;

    for (int r = 0; r < GHC_ROLE_COUNT; r++) {
        int at = AT_DEVICE;
        if (strcmp(policy, "host") == 0)
            at = AT_HOST;
        else if (strcmp(policy, "offload") == 0 && (r == GHC_ROLE_WEIGHTS || r == GHC_ROLE_WEIGHTS_INACTIVE))
            at = AT_PINNED;
        else if (saved_off && r == GHC_ROLE_SAVED)
            at = AT_PINNED;
        else if (strcmp(policy, "gh200_uvm") == 0 && (r == GHC_ROLE_WEIGHTS_INACTIVE || r == GHC_ROLE_LATENTS))
            at = AT_MANAGED;
        out->where[r] = at;
        out->at[at] += out->role[r];
    }
    if (strcmp(policy, "offload") == 0)
        out->at[AT_DEVICE] += (uint64_t)ring * mm.block;   /* the ring of block buffers */
    out->ring = strcmp(policy, "offload") == 0 ? (uint64_t)ring * mm.block : 0;
    out->saved_ring = saved_off ? (uint64_t)sring * (mm.saved_unit + 256) : 0;   /* the largest unit */
    out->at[AT_DEVICE] += out->saved_ring;
    if (!print)
        return 0;

    fprintf(print, "model: %s, %d expert%s, %s; checkpointing %s%s\n", model_name, (int)mm.experts,
            mm.experts > 1 ? "s" : "", mm.summary, *mm.checkpointing ? mm.checkpointing : ck ? "per block" : "off",
            ck && mm.checkpoint_every > 1 ?
            " (every k-th)" : "");
    fprintf(print, "run:   %llu x %llu tokens per micro-batch, adapters %s (%s), optimizer %s, mempolicy %s\n",
            (unsigned long long)B, (unsigned long long)L, nm.summary, o->adapters ? "counted" : "none",
            opt_name, policy);
    fprintf(print, "%-18s %12s  %s\n", "ROLE", "GiB", "WHERE");
    for (int r = 0; r < GHC_ROLE_COUNT; r++)
        if (out->role[r])
            fprintf(print, "%-18s %12.3f  %s\n", ghc_mem_role_name((enum ghc_mem_role)r), out->role[r] / GIB,
                    at_names[out->where[r]]);
    if (out->ring)
        fprintf(print, "%-18s %12.3f  %s\n", "offload ring", out->ring / GIB, at_names[AT_DEVICE]);
    if (out->saved_ring)
        fprintf(print, "%-18s %12.3f  %s\n", "saved ring", out->saved_ring / GIB, at_names[AT_DEVICE]);
    fprintf(print, "activations: %.3f GiB with checkpointing per block, %.3f GiB without (plus %.3f GiB backward "
            "scratch)\n", mm.activations_ckpt / GIB, mm.activations_full / GIB, mm.backward_scratch / GIB);
    fprintf(print, "total by location:");
    for (int a = 0; a < AT_COUNT; a++)
        if (out->at[a])
            fprintf(print, " %s %.3f GiB;", at_names[a], out->at[a] / GIB);
    fprintf(print, " (excludes CUDA context, library workspaces and pool slack)\n");
    return 0;
}
