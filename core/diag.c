/* diag.c: `gh200core diag [--json FILE] [--oversubscription-scale X] [--skip-allocation]`: the
 * gh200_uvm plugin's machine probe (environment, GPU, driver, attributes, platform class, HBM
 * and host memory, a managed allocation test within the safe cap, bandwidth probes) printed
 * as a console summary with pass/fail marks, and as a JSON report. The core links no CUDA: the
 * probe runs in the plugin; without it (a CPU build) only the host part is reported. */
#include <config.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "cli.h"

#define DIAG_ITEMS 128

static const char *const marks[] = { "    ", "PASS", "FAIL", "SKIP" };
static const char *const mark_json[] = { "info", "pass", "fail", "skip" };

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* The report as {"version": ..., "failed": n, "items": [{section, key, mark, value, unit, text}]},
 * written to path.tmp and renamed. */
static int diag_json(ghc_core_t *core, const char *path, const struct ghc_probe *p, int failed)
{
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return ghc_error_set(core, GHC_EIO, "%s: cannot write the diag report: %s", path, strerror(errno));
    fprintf(f, "{\n  \"gh200core\": ");
    json_string(f, ghc_version());
    fprintf(f, ",\n  \"failed\": %d,\n  \"items\": [\n", failed);
    for (int i = 0; i < p->n_items; i++) {
        const struct ghc_probe_item *it = &p->items[i];
        fprintf(f, "    {\"section\": ");
        json_string(f, it->section);
        fprintf(f, ", \"key\": ");
        json_string(f, it->key);
        fprintf(f, ", \"mark\": \"%s\", \"value\": ", mark_json[it->mark]);
        if (isfinite(it->value))
            fprintf(f, "%.17g", it->value);
        else
            fprintf(f, "null");
        fprintf(f, ", \"unit\": ");
        json_string(f, it->unit);
        fprintf(f, ", \"text\": ");
        json_string(f, it->text);
        fprintf(f, "}%s\n", i + 1 < p->n_items ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        unlink(tmp);
        return ghc_error_set(core, GHC_EIO, "%s: cannot write the diag report: %s", path, strerror(errno));
    }
    return 0;
}

static struct ghc_probe_item *probe_item(struct ghc_probe *p, const char *section, const char *key)
{
    for (int i = 0; i < p->n_items; i++)
        if (!strcmp(p->items[i].section, section) && !strcmp(p->items[i].key, key))
            return &p->items[i];
    return NULL;
}

/* Where the probe found no GPU, the CUDA runtime's reason reads "CUDA driver version is
 * insufficient for CUDA runtime version" also on a machine without any NVIDIA driver. The
 * probe's driver version (0: no libcuda) tells the cases apart: say which one it is. */
static void explain_no_gpu(struct ghc_probe *p)
{
    struct ghc_probe_item *dev = probe_item(p, "gpu", "devices");
    const struct ghc_probe_item *drv = probe_item(p, "env", "cuda_driver_api");
    const struct ghc_probe_item *rt = probe_item(p, "env", "cuda_runtime");
    if (!dev || dev->mark != GHC_PROBE_FAIL || !drv || !isfinite(drv->value))
        return;
    int d = (int)drv->value, r = rt && isfinite(rt->value) ? (int)rt->value : 0;
    if (d == 0)
        snprintf(dev->text, sizeof(dev->text), "no NVIDIA driver is installed (libcuda.so.1 not found): this machine "
                 "has no usable GPU");
    else if (r > d)
        snprintf(dev->text, sizeof(dev->text), "the NVIDIA driver supports CUDA %d.%d, older than the runtime's %d.%d "
                 "that gh200core was built with: update the driver", d / 1000, d % 1000 / 10, r / 1000, r % 1000 / 10);
    else
        snprintf(dev->text, sizeof(dev->text), "no NVIDIA GPU is visible (driver for CUDA %d.%d loaded): check "
                 "nvidia-smi and CUDA_VISIBLE_DEVICES", d / 1000, d % 1000 / 10);
}

int ghc_cli_diag(ghc_core_t *core, const struct ghc_probe_opts *o, const char *json_path, FILE *out, int *failed)
{
    struct ghc_probe_item *items = calloc(DIAG_ITEMS, sizeof(*items));
    struct ghc_probe p = { .items = items, .cap = DIAG_ITEMS };
    struct utsname u;
    int rc = 0;
    if (!items)
        return ghc_error_set(core, GHC_ENOMEM, "diag: out of memory");
    ghc_probe_add(&p, "env", "gh200core", GHC_PROBE_INFO, NAN, "", "%s (API %d, plugin ABI %d)", ghc_version(),
                  ghc_api_version(), GHC_PLUGIN_ABI);
    if (uname(&u) == 0)
        ghc_probe_add(&p, "env", "system", GHC_PROBE_INFO, NAN, "", "%s %s %s", u.sysname, u.release, u.machine);
    ghc_probe_add(&p, "env", "cpus", GHC_PROBE_INFO, (double)sysconf(_SC_NPROCESSORS_ONLN), "", NULL);
    ghc_probe_add(&p, "memory", "host_total", GHC_PROBE_INFO, ghc_cli_host_gib(), "GiB", NULL);
    if (ghc_mem_probe(core, "gh200_uvm", o, &p) < 0)
        ghc_probe_add(&p, "gpu", "probe", GHC_PROBE_SKIP, NAN, "", "%s", ghc_error_message(core));
    explain_no_gpu(&p);
    static const char *const sections[] = { "env", "memory", "gpu", "alloc", "bandwidth" };
    *failed = 0;
    for (size_t k = 0; k < sizeof(sections) / sizeof(sections[0]); k++) {
        bool head = false;
        for (int i = 0; i < p.n_items; i++) {
            const struct ghc_probe_item *it = &p.items[i];
            if (strcmp(sections[k], it->section) != 0)
                continue;
            if (!head)
                fprintf(out, "[%s]\n", sections[k]);
            head = true;
            char val[64] = "";
            if (isfinite(it->value) && !*it->text)
                snprintf(val, sizeof(val), "%g%s%s", it->value, *it->unit ? " " : "", it->unit);
            else if (isfinite(it->value) && *it->unit)
                snprintf(val, sizeof(val), "%.2f %s", it->value, it->unit);
            fprintf(out, "  %s %-34s %-14s %s\n", marks[it->mark], it->key, val, it->text);
            *failed += it->mark == GHC_PROBE_FAIL;
        }
    }
    fprintf(out, "diag: %d check%s failed\n", *failed, *failed == 1 ? "" : "s");
    if (json_path)
        rc = diag_json(core, json_path, &p, *failed);
    free(items);
    return rc;
}
