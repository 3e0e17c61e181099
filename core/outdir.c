/* outdir.c: the trainer's output folder. Whose it is: a folder that holds an earlier run
 * (its resolved.cfg) is refused unless the run resumes, and a run that fails before its first
 * checkpoint removes what it wrote, so the folder is as it was and the next run is not
 * refused. What it logs there: metrics.jsonl (one JSON line per step) and the TensorBoard
 * event file; a run resumed at step N into a folder that logged beyond N keeps each step once. */
#include <config.h>

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
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

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* What dir holds, for a message: "a, b/, c and 3 more" (sorted; folders end in '/').
 * Returns the number of entries, 0 for an empty or absent folder. */
static int folder_holds(const char *dir, char *buf, size_t len)
{
    DIR *d = opendir(dir);
    buf[0] = '\0';
    if (!d)
        return 0;
    char **names = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (n == cap) {
            char **nn = realloc(names, (size_t)(cap = cap ? 2 * cap : 16) * sizeof(*nn));
            if (!nn)
                break;
            names = nn;
        }
        if (!(names[n] = strdup(e->d_name)))
            break;
        n++;
    }
    closedir(d);
    if (n)
        qsort(names, (size_t)n, sizeof(*names), name_cmp);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        char p[8400];
        struct stat st;
        snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
        bool folder = lstat(p, &st) == 0 && S_ISDIR(st.st_mode);
        if (i < 4 && at < len)
            at += (size_t)snprintf(buf + at, len - at, "%s%s%s", i ? (i == n - 1 ? " and " : ", ") : "", names[i],
                                   folder ? "/" : "");
        free(names[i]);
    }
    if (n > 4 && at < len)
        snprintf(buf + at, len - at, " and %d more", n - 4);
    free(names);
    return n;
}

/* Whether the checkpoint folder `resume` lies directly in output_dir `out` (both existing). */
static bool resume_inside(const char *resume, const char *out)
{
    char r[PATH_MAX], o[PATH_MAX];
    if (!resume || !realpath(resume, r) || !realpath(out, o))
        return false;
    char *slash = strrchr(r, '/');
    if (!slash)
        return false;
    *slash = '\0';
    return !strcmp(*r ? r : "/", o);
}

int ghc_train_check_output(ghc_core_t *core, const struct ghc_train_opts *opts)
{
    int rc;
    struct stat st;
    const char *resume = opts ? opts->resume : NULL;
    if ((rc = ghc_config_resolve_output_dir(core)) < 0)
        return rc;
    if (resume && stat(resume, &st) != 0)
        return ghc_error_set(core, GHC_ENOTFOUND, "%s: no such checkpoint folder (--resume)", resume);
    if (opts && opts->dist && opts->dist->world > 1 && opts->dist->rank != 0)
        return 0;   /* rank 0 writes the folder and checks it */
    const char *out = ghc_config_output_dir(core);
    char path[4200], held[1024];
    /* one run owns its folder: an empty or new one, the folder of the checkpoint it resumes
     * from, or (--overwrite) any */
    if (folder_holds(out, held, sizeof(held)) == 0 || resume_inside(resume, out) || (opts && opts->overwrite))
        return 0;
    snprintf(path, sizeof(path), "%s/resolved.cfg", out);
    bool run = stat(path, &st) == 0;
    if (resume)
        return ghc_error_set(core, GHC_EEXIST, "output_dir '%s' holds %s (%s): --resume %s would write over it; "
                             "continue into the checkpoint's own folder or a new one (--set output_dir=DIR), or "
                             "give --overwrite", out, run ? "another run" : "files", held, resume);
    if (!run)
        return ghc_error_set(core, GHC_EEXIST, "output_dir '%s' is not empty: it holds %s; choose another folder "
                             "(--set output_dir=DIR), or give --overwrite to write into it (the run's files of the "
                             "same names are replaced, nothing else is removed)", out, held);
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

/* Whether name is a temporary file this tool writes in output_dir: <file>.tmp.XXXXXX of
 * mkstemp (the adapters, resolved.cfg, run.json) or <log>.tmp of a log's rewrite. */
static bool our_temporary(const char *name)
{
    size_t n = strlen(name);
    if (n > 11 && !strcmp(name + n - 4, ".tmp"))
        return !strcmp(name, "metrics.jsonl.tmp") || !strncmp(name, "events.out.tfevents.", 20);
    if (n < 12 || strncmp(name + n - 11, ".tmp.", 5) != 0)
        return false;
    for (size_t i = n - 6; i < n; i++)
        if (!isalnum((unsigned char)name[i]))
            return false;
    size_t base = n - 11;
    return (base > 12 && !strncmp(name + base - 12, ".safetensors", 12)) ||
           (base == 12 && !strncmp(name, "resolved.cfg", 12)) || (base == 8 && !strncmp(name, "run.json", 8));
}

/* What a stopped run of this folder left (only this tool's names), and with a run resumed
 * from its own folder the checkpoints of its id past its step: what the continuation it
 * abandons wrote, so that the newest checkpoint is this run's. */
static void clean_folder(struct ghc_trainer *tr)
{
    ghc_core_t *core = tr->core;
    bool inside = tr->resumed && resume_inside(tr->resume, tr->out);
    DIR *d = opendir(tr->out);
    struct dirent *e;
    char p[8400], run[40], why[256];
    while (d && (e = readdir(d))) {
        int64_t s;
        snprintf(p, sizeof(p), "%s/%s", tr->out, e->d_name);
        if (ghc_checkpoint_name(e->d_name, ".tmp", &s) || ghc_checkpoint_name(e->d_name, ".trash", &s) ||
            our_temporary(e->d_name)) {
            if (ghc_outdir_remove(core, p) == 0 || (unlink(p) == 0))
                ghc_log(core, GHC_LOG_INFO, "train: removed %s (left by a run that was stopped)", p);
            else
                ghc_log(core, GHC_LOG_WARN, "train: %s: not removed (%s)", p, ghc_error_message(core));
            ghc_error_clear(core);
        } else if (inside && ghc_checkpoint_name(e->d_name, "", &s) && s > tr->step &&
                   ghc_checkpoint_ours(p, run, sizeof(run)) && !strcmp(run, tr->run_id)) {
            snprintf(why, sizeof(why), ": newer than checkpoint-%lld, which this run continues from (the abandoned "
                     "continuation's checkpoint)", (long long)tr->step);
            ghc_checkpoint_trash(tr, p, why);
        }
    }
    if (d)
        closedir(d);
}

/* output_dir/run.json: the folder's run (its id, also in each checkpoint's trainer.json). */
static int write_marker(struct ghc_trainer *tr)
{
    ghc_core_t *core = tr->core;
    char p[8400], tmp[8500];
    struct stat st;
    if (!*tr->run_id) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(tr->run_id, sizeof(tr->run_id), "%08llx%08lx%06x", (unsigned long long)ts.tv_sec & 0xffffffffull,
                 (unsigned long)ts.tv_nsec, (unsigned)getpid() & 0xffffffu);
    }
    snprintf(p, sizeof(p), "%s/run.json", tr->out);
    snprintf(tmp, sizeof(tmp), "%s.tmp.XXXXXX", p);
    tr->made_marker = stat(p, &st) != 0;
    int fd = mkstemp(tmp);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        if (fd >= 0)
            close(fd);
        return ghc_error_set(core, GHC_EIO, "%s: cannot create: %s", p, strerror(errno));
    }
    bool ok = fprintf(f, "{\n  \"format\": \"gh200core-run\",\n  \"run\": \"%s\"\n}\n", tr->run_id) > 0 &&
              fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (fclose(f) != 0 || !ok || rename(tmp, p) != 0) {
        int err = errno;
        unlink(tmp);
        return ghc_error_set(core, GHC_EIO, "%s: cannot write: %s", p, strerror(err));
    }
    return 0;
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
    if (tr->overwrite && !resume_inside(tr->resume, tr->out)) {
        char held[1024];
        if (folder_holds(tr->out, held, sizeof(held)))
            ghc_log(core, GHC_LOG_INFO, "train: --overwrite: output_dir '%s' holds %s: this run replaces its own files "
                    "of the same names (resolved.cfg, run.json, metrics.jsonl, %s*.safetensors, the checkpoint-N it "
                    "saves); nothing else is removed", tr->out, held, tr->c.name);
    }
    clean_folder(tr);
    if ((rc = write_marker(tr)) < 0)
        return rc;
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
    bool any = tr->made_metrics || *tr->tb_path || tr->made_demo || tr->made_resolved || tr->made_marker ||
               *tr->made_out;
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
    snprintf(p, sizeof(p), "%s/run.json", tr->out);
    if (tr->made_marker)
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
    tr->made_metrics = stat(p, &st) != 0;
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

/* After a failed write to a log: the message, and the run stops (train.c). */
static int log_failed(struct ghc_trainer *tr, const char *path)
{
    tr->log_failed = true;
    return ghc_error_set(tr->core, GHC_EIO, "%s: cannot write: %s", path, strerror(errno ? errno : EIO));
}

static int tb_scalars(struct ghc_trainer *tr, const char *const *tags, const double *v, int n)
{
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        rc = ghc_tboard_scalar(tr->tb, tags[i], tr->step, (float)v[i]);
    if (rc == 0)
        rc = ghc_tboard_flush(tr->tb);
    if (rc < 0)
        tr->log_failed = true;
    return rc;
}

int ghc_outdir_record_step(struct ghc_trainer *tr, const struct ghc_step_report *r)
{
    const struct ghc_mem_stats *ms = &r->mem;
    if (tr->metrics) {
        errno = 0;
        if (fprintf(tr->metrics, "{\"step\":%lld,\"loss\":%.9g,\"loss_avg\":%.9g,\"lr\":%.9g,\"lr_factor\":%.9g,"
                    "\"grad_norm\":%.9g,\"micro_batches\":%d,\"samples\":%d,\"expert\":%d,\"skipped\":%s,"
                    "\"time_step\":%.6f,\"time_data\":%.6f,\"time_fwd_bwd\":%.6f,\"time_optimizer\":%.6f,"
                    "\"mem_host\":%llu,\"mem_device\":%llu,\"mem_managed\":%llu,\"mem_peak\":%llu,\"uvm_stage\":%d}\n",
                    (long long)tr->step, r->loss, tr->loss_ema, r->lr, r->lr_factor, r->grad_norm, r->micro_batches,
                    r->samples, r->expert, r->skipped ? "true" : "false", r->t_step, r->t_data, r->t_fwd_bwd, r->t_opt,
                    (unsigned long long)ms->bytes_host, (unsigned long long)ms->bytes_device,
                    (unsigned long long)ms->bytes_managed, (unsigned long long)ms->bytes_peak, ms->stage) < 0 ||
            fflush(tr->metrics) != 0) {
            char p[8400];
            snprintf(p, sizeof(p), "%s/metrics.jsonl", tr->out);
            return log_failed(tr, p);
        }
    }
    if (tr->tb && !r->skipped) {
        static const char *const tags[] = { "train/loss", "train/lr", "train/grad_norm", "train/micro_batches",
                                            "time/step" };
        const double v[] = { r->loss, r->lr, r->grad_norm, r->micro_batches, r->t_step };
        return tb_scalars(tr, tags, v, 5);
    }
    return 0;
}

int ghc_outdir_record_validation(struct ghc_trainer *tr, double sigma, double loss)
{
    char tag[64];
    snprintf(tag, sizeof(tag), "validation/loss_sigma_%.3f", sigma);
    const char *tags[] = { tag };
    int rc = tr->tb ? tb_scalars(tr, tags, &loss, 1) : 0;
    if (rc == 0 && tr->metrics) {
        errno = 0;
        if (fprintf(tr->metrics, "{\"step\":%lld,\"validation_sigma\":%.6g,\"validation_loss\":%.9g}\n",
                    (long long)tr->step, sigma, loss) < 0 || fflush(tr->metrics) != 0) {
            char p[8400];
            snprintf(p, sizeof(p), "%s/metrics.jsonl", tr->out);
            rc = log_failed(tr, p);
        }
    }
    return rc;
}
