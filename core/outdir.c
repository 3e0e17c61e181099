/* outdir.c: the trainer's output folder. Whose it is: a folder that holds an earlier run
 * (its resolved.cfg) is refused unless the run resumes, and a run that fails before its first
 * checkpoint removes what it wrote, so the folder is as it was and the next run is not
 * refused. What it logs there: metrics.jsonl (one JSON line per step) and the TensorBoard
 * event file; a run resumed at step N into a folder that logged beyond N keeps each step once. */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gh200core/gh200core.h>
#include <gh200core/train.h>

#include "train_impl.h"

/* ---- files ---------------------------------------------------------------------------------- */

int ghc_outdir_remove(ghc_core_t *core, const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return errno == ENOENT ? 0 : ghc_error_set(core, GHC_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct dirent *e;
    char p[8192];
    int rc = 0;
    while ((e = readdir(d)) && rc == 0) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(p, sizeof(p), "%s/%s", path, e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
            rc = ghc_outdir_remove(core, p);
        else if (unlink(p) != 0)
            rc = ghc_error_set(core, GHC_EIO, "%s: cannot remove: %s", p, strerror(errno));
    }
    closedir(d);
    if (rc == 0 && rmdir(path) != 0)
        rc = ghc_error_set(core, GHC_EIO, "%s: cannot remove: %s", path, strerror(errno));
    return rc;
}

/* Rewrites `path` (temporary file, renamed) with `keep` bytes of `buf`; nothing when
 * keep == size. */
static int rewrite_file(ghc_core_t *core, const char *path, const void *buf, size_t keep, size_t size)
{
    if (keep == size)
        return 0;
    char tmp[8500];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return ghc_error_set(core, GHC_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    bool ok = fwrite(buf, 1, keep, f) == keep && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return ghc_error_set(core, GHC_EIO, "%s: cannot rewrite: %s", path, strerror(errno));
    }
    return 0;
}

static int read_all(ghc_core_t *core, const char *path, uint8_t **buf, size_t *size)
{
    FILE *f = fopen(path, "rb");
    *buf = NULL;
    *size = 0;
    if (!f)
        return errno == ENOENT ? 0 : ghc_error_set(core, GHC_EIO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 0, n;
    uint8_t chunk[65536];
    int rc = 0;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
        if (*size + n > cap) {
            uint8_t *nb = realloc(*buf, cap = 2 * (*size + n));
            if (!nb) {
                rc = ghc_error_set(core, GHC_ENOMEM, "%s: out of memory reading it", path);
                break;
            }
            *buf = nb;
        }
        memcpy(*buf + *size, chunk, n);
        *size += n;
    }
    if (rc == 0 && ferror(f))
        rc = ghc_error_set(core, GHC_EIO, "%s: cannot read: %s", path, strerror(errno));
    fclose(f);
    return rc;
}

/* ---- whose the folder is -------------------------------------------------------------------- */

int ghc_train_check_output(ghc_core_t *core, const struct ghc_train_opts *opts)
{
    int rc;
    struct stat st;
    const char *resume = opts ? opts->resume : NULL;
    if ((rc = ghc_config_resolve_output_dir(core)) < 0)
        return rc;
    if (resume && stat(resume, &st) != 0)
        return ghc_error_set(core, GHC_ENOTFOUND, "%s: no such checkpoint folder (--resume)", resume);
    const char *out = ghc_config_output_dir(core);
    char path[4200];
    snprintf(path, sizeof(path), "%s/resolved.cfg", out);
    if (resume || stat(path, &st) != 0)
        return 0;
    int64_t n;
    ghc_checkpoint_newest(out, &n);
    if (n >= 0)
        return ghc_error_set(core, GHC_EEXIST, "%s exists: output_dir '%s' holds an earlier run; continue it with "
                             "--resume %s/checkpoint-%lld (its newest checkpoint), choose another folder "
                             "(--set output_dir=DIR), or remove it", path, out, out, (long long)n);
    return ghc_error_set(core, GHC_EEXIST, "%s exists: output_dir '%s' holds an earlier run that left no checkpoint "
                         "(one still going, or one that was killed before its first): nothing to resume; to start "
                         "over remove the folder (rm -r '%s') or choose another (--set output_dir=DIR)", path, out, out);
}

/* Creates `path` with its parents; `made` gets the shallowest folder created ("" when none). */
static int mkdir_p(ghc_core_t *core, const char *path, char *made, size_t len)
{
    char buf[4096];
    made[0] = '\0';
    if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf))
        return ghc_error_set(core, GHC_EIO, "%s: path too long", path);
    for (char *p = buf + 1; ; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0777) == 0) {
                if (!made[0])
                    snprintf(made, len, "%s", buf);
            } else if (errno != EEXIST) {
                return ghc_error_set(core, GHC_EIO, "%s: cannot create the output folder: %s", buf, strerror(errno));
            }
            *p = c;
            if (!c)
                break;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return ghc_error_set(core, GHC_EIO, "%s: output_dir is not a folder", path);
    return 0;
}

int ghc_outdir_create(struct ghc_trainer *tr)
{
    ghc_core_t *core = tr->core;
    char p[8400];
    struct stat st;
    int rc;
    snprintf(p, sizeof(p), "%s/resolved.cfg", tr->out);
    if ((rc = mkdir_p(core, tr->out, tr->made_out, sizeof(tr->made_out))) < 0)
        return rc;
    tr->made_resolved = stat(p, &st) != 0;
    if ((rc = ghc_config_write(core, p)) < 0)
        return rc;
    ghc_log(core, GHC_LOG_INFO, "wrote %s", p);
    if (tr->demo) {
        snprintf(p, sizeof(p), "%s/demo-data", tr->out);
        tr->made_demo = stat(p, &st) != 0;
    }
    return 0;
}

/* After a failure before the run's first checkpoint: remove what it wrote into output_dir
 * (its files closed), so that the folder is as it was and the next run is not refused. The
 * error message stays. */
void ghc_outdir_undo(struct ghc_trainer *tr)
{
    ghc_core_t *core = tr->core;
    char msg[GHC_ERROR_MAX], p[8400];
    int code = ghc_error_code(core);
    bool any = tr->made_metrics || *tr->tb_path || tr->made_demo || tr->made_resolved || *tr->made_out;
    if (!any)
        return;
    snprintf(msg, sizeof(msg), "%s", ghc_error_message(core));
    snprintf(p, sizeof(p), "%s/metrics.jsonl", tr->out);
    if (tr->made_metrics)
        unlink(p);
    if (*tr->tb_path)
        unlink(tr->tb_path);
    snprintf(p, sizeof(p), "%s/demo-data", tr->out);
    if (tr->made_demo)
        ghc_outdir_remove(core, p);
    snprintf(p, sizeof(p), "%s/checkpoint-%lld.tmp", tr->out, (long long)tr->step);
    ghc_outdir_remove(core, p);
    snprintf(p, sizeof(p), "%s/resolved.cfg", tr->out);
    if (tr->made_resolved)
        unlink(p);
    if (*tr->made_out) {
        /* the folders mkdir made, deepest first, while empty */
        snprintf(p, sizeof(p), "%s", tr->out);
        size_t top = strlen(tr->made_out);
        while (strlen(p) >= top && rmdir(p) == 0) {
            char *slash = strrchr(p, '/');
            if (!slash || slash == p)
                break;
            *slash = '\0';
        }
    }
    ghc_log(core, GHC_LOG_INFO, "train: no checkpoint was written: removed what this run wrote to %s, which "
            "is as it was before", tr->out);
    ghc_error_set(core, code, "%s", msg);
}

/* ---- metrics.jsonl and TensorBoard ---------------------------------------------------------- */

/* Reads a base-128 varint at p[*i] (< len); false past the end. */
static bool varint(const uint8_t *p, size_t len, size_t *i, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; *i < len && shift < 64; shift += 7) {
        uint8_t b = p[(*i)++];
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return true;
    }
    return false;
}

/* The step of a serialised tensorflow.Event (field 2, a varint; 0 when absent). */
static int64_t event_step(const uint8_t *p, size_t len)
{
    size_t i = 0;
    uint64_t tag, v;
    while (i < len && varint(p, len, &i, &tag)) {
        switch (tag & 7) {
        case 0:
            if (!varint(p, len, &i, &v))
                return 0;
            if (tag >> 3 == 2)
                return (int64_t)v;
            break;
        case 1: i += 8; break;
        case 2:
            if (!varint(p, len, &i, &v) || v > len - i)
                return 0;
            i += (size_t)v;
            break;
        case 5: i += 4; break;
        default: return 0;
        }
    }
    return 0;
}

/* A run resumed at step n into a folder that logged beyond n (an earlier continuation of the
 * same checkpoint) keeps each step once: metrics.jsonl keeps its lines up to step n (and drops
 * an unfinished last line), each TensorBoard event file its records up to step n (and drops a
 * torn last record). The files are rewritten through a temporary name and renamed. */
static int drop_after(struct ghc_trainer *tr, int64_t n)
{
    ghc_core_t *core = tr->core;
    char p[8400];
    uint8_t *buf;
    size_t size, keep = 0;
    int64_t lines = 0;
    snprintf(p, sizeof(p), "%s/metrics.jsonl", tr->out);
    int rc = read_all(core, p, &buf, &size);
    for (size_t i = 0; rc == 0 && i < size; ) {
        uint8_t *nl = memchr(buf + i, '\n', size - i);
        if (!nl)
            break;
        size_t len = (size_t)(nl - (buf + i)) + 1;
        char head[64];
        snprintf(head, sizeof(head), "%.*s", (int)(len < 63 ? len : 63), (const char *)buf + i);
        const char *s = strstr(head, "\"step\":");
        if (s && strtoll(s + 7, NULL, 10) > n) {
            lines++;
        } else {
            memmove(buf + keep, buf + i, len);
            keep += len;
        }
        i += len;
    }
    if (rc == 0 && (rc = rewrite_file(core, p, buf, keep, size)) == 0 && lines)
        ghc_log(core, GHC_LOG_INFO, "train: %s: dropped %lld line%s after step %lld (this run continues from there)",
                p, (long long)lines, lines == 1 ? "" : "s", (long long)n);
    free(buf);
    DIR *d = rc == 0 ? opendir(tr->out) : NULL;
    struct dirent *e;
    while (d && rc == 0 && (e = readdir(d))) {
        if (strncmp(e->d_name, "events.out.tfevents.", 20) != 0)
            continue;
        snprintf(p, sizeof(p), "%s/%s", tr->out, e->d_name);
        if ((rc = read_all(core, p, &buf, &size)) < 0)
            break;
        int64_t records = 0;
        keep = 0;
        for (size_t i = 0; i + 16 <= size; ) {
            uint64_t len;
            uint32_t crc;
            memcpy(&len, buf + i, 8);
            memcpy(&crc, buf + i + 8, 4);
            if (crc != ghc_crc32c_masked(buf + i, 8) || len > size - i - 16)
                break;
            memcpy(&crc, buf + i + 12 + len, 4);
            if (crc != ghc_crc32c_masked(buf + i + 12, (size_t)len))
                break;
            size_t rec = 16 + (size_t)len;
            if (event_step(buf + i + 12, (size_t)len) > n) {
                records++;
            } else {
                memmove(buf + keep, buf + i, rec);
                keep += rec;
            }
            i += rec;
        }
        if ((rc = rewrite_file(core, p, buf, keep, size)) == 0 && records)
            ghc_log(core, GHC_LOG_INFO, "train: %s: dropped %lld record%s after step %lld", p, (long long)records,
                    records == 1 ? "" : "s", (long long)n);
        free(buf);
    }
    if (d)
        closedir(d);
    return rc;
}

int ghc_outdir_open_logs(struct ghc_trainer *tr)
{
    ghc_core_t *core = tr->core;
    int rc;
    char p[8400];
    struct stat st;
    if (tr->resumed && (rc = drop_after(tr, tr->step)) < 0)
        return rc;
    snprintf(p, sizeof(p), "%s/metrics.jsonl", tr->out);
    tr->made_metrics = !tr->resumed || stat(p, &st) != 0;
    if (!(tr->metrics = fopen(p, tr->resumed ? "a" : "w")))
        return ghc_error_set(core, GHC_EIO, "%s: cannot open: %s", p, strerror(errno));
    if (tr->c.tensorboard) {
        if ((rc = ghc_tboard_open(core, tr->out, &tr->tb)) < 0)
            return rc;
        snprintf(tr->tb_path, sizeof(tr->tb_path), "%s", ghc_tboard_path(tr->tb));
    }
    return 0;
}

void ghc_outdir_close_logs(struct ghc_trainer *tr)
{
    ghc_tboard_free(tr->tb);
    if (tr->metrics)
        fclose(tr->metrics);
    tr->tb = NULL;
    tr->metrics = NULL;
}

void ghc_outdir_record_step(struct ghc_trainer *tr, const struct ghc_step_report *r)
{
    const struct ghc_mem_stats *ms = &r->mem;
    if (tr->metrics) {
        fprintf(tr->metrics, "{\"step\":%lld,\"loss\":%.9g,\"loss_avg\":%.9g,\"lr\":%.9g,\"lr_factor\":%.9g,"
                "\"grad_norm\":%.9g,\"micro_batches\":%d,\"samples\":%d,\"expert\":%d,\"skipped\":%s,"
                "\"time_step\":%.6f,\"time_data\":%.6f,\"time_fwd_bwd\":%.6f,\"time_optimizer\":%.6f,"
                "\"mem_host\":%llu,\"mem_device\":%llu,\"mem_managed\":%llu,\"mem_peak\":%llu,\"uvm_stage\":%d}\n",
                (long long)tr->step, r->loss, tr->loss_ema, r->lr, r->lr_factor, r->grad_norm, r->micro_batches,
                r->samples, r->expert, r->skipped ? "true" : "false", r->t_step, r->t_data, r->t_fwd_bwd, r->t_opt,
                (unsigned long long)ms->bytes_host, (unsigned long long)ms->bytes_device,
                (unsigned long long)ms->bytes_managed, (unsigned long long)ms->bytes_peak, ms->stage);
        fflush(tr->metrics);
    }
    if (tr->tb && !r->skipped) {
        ghc_tboard_scalar(tr->tb, "train/loss", tr->step, (float)r->loss);
        ghc_tboard_scalar(tr->tb, "train/lr", tr->step, (float)r->lr);
        ghc_tboard_scalar(tr->tb, "train/grad_norm", tr->step, (float)r->grad_norm);
        ghc_tboard_scalar(tr->tb, "train/micro_batches", tr->step, (float)r->micro_batches);
        ghc_tboard_scalar(tr->tb, "time/step", tr->step, (float)r->t_step);
        ghc_tboard_flush(tr->tb);
    }
}

void ghc_outdir_record_validation(struct ghc_trainer *tr, double sigma, double loss)
{
    char tag[64];
    snprintf(tag, sizeof(tag), "validation/loss_sigma_%.3f", sigma);
    if (tr->tb)
        ghc_tboard_scalar(tr->tb, tag, tr->step, (float)loss);
    if (tr->metrics)
        fprintf(tr->metrics, "{\"step\":%lld,\"validation_sigma\":%.6g,\"validation_loss\":%.9g}\n",
                (long long)tr->step, sigma, loss);
}
