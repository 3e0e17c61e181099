/* checkpoint.c: the trainer's checkpoints. output_dir/checkpoint-N/ holds, after N optimizer
 * steps, the adapter files, params.safetensors (the fp32 params exactly), the optimizer's
 * state, trainer.json (the position: step counts, the data position, every generator's
 * counter) and the resolved configuration, so that a resumed run continues exactly as the
 * uninterrupted one would. Written, pruned to keep_last, and read back for --resume. */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include <gh200core/gh200core.h>
#include <gh200core/ops.h>
#include <gh200core/safetensors.h>
#include <gh200core/tensor.h>

#include "elem.h"         /* defines: ghc_cpu_load */
#include "train_impl.h"

/* ---- names ---------------------------------------------------------------------------------- */

bool ghc_checkpoint_name(const char *name, const char *suffix, int64_t *step)
{
    char *end;
    if (strncmp(name, "checkpoint-", 11) != 0 || !(name[11] >= '0' && name[11] <= '9'))
        return false;
    errno = 0;
    long long s = strtoll(name + 11, &end, 10);
    if (errno || strcmp(end, suffix) != 0)
        return false;
    *step = s;
    return true;
}

static bool checkpoint_step(const char *name, int64_t *step)
{
    return ghc_checkpoint_name(name, "", step);
}

bool ghc_checkpoint_ours(const char *dir, char *run, size_t len)
{
    char p[8400];
    struct stat st;
    snprintf(p, sizeof(p), "%s/trainer.json", dir);
    if (run)
        run[0] = '\0';
    /* a regular file only: json_load_file on a FIFO would wait forever */
    if (stat(p, &st) != 0 || !S_ISREG(st.st_mode))
        return false;
    json_t *j = json_load_file(p, 0, NULL);
    const char *format = json_string_value(json_object_get(j, "format"));
    const char *id = json_string_value(json_object_get(j, "run"));
    bool ours = format && !strcmp(format, "gh200core-trainer-state");
    if (ours && run && id)
        snprintf(run, len, "%s", id);
    json_decref(j);
    return ours;
}

void ghc_checkpoint_newest(const char *dir, int64_t *step)
{
    *step = -1;
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        char p[8400];
        struct stat st;
        int64_t s;
        if (!checkpoint_step(e->d_name, &s))
            continue;
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        if (s > *step && stat(p, &st) == 0 && S_ISDIR(st.st_mode))
            *step = s;
    }
    closedir(d);
}

/* dir/<name><suffix>.safetensors, the file of adapter slot a: on two-expert models the suffix
 * names the expert it serves. */
static void adapter_file(const struct ghc_trainer *tr, const char *dir, int a, char *buf, size_t len)
{
    const bool named = tr->n_experts >= 2 && tr->adapter_expert[a] >= 0;
    snprintf(buf, len, "%s/%s%s%s.safetensors", dir, tr->c.name, named ? "_" : "",
             named ? ghc_model_expert_name(tr->model, tr->adapter_expert[a]) : "");
}

int ghc_checkpoint_save_adapters(struct ghc_trainer *tr, const char *dir, char *first, size_t len)
{
    int rc;
    for (int a = 0; a < tr->n_adapters; a++) {
        char p[8400];
        adapter_file(tr, dir, a, p, sizeof(p));
        int32_t e = tr->adapter_expert[a] < 0 ? 0 : tr->adapter_expert[a];
        if ((rc = ghc_network_save(tr->net, e, p)) < 0)
            return rc;
        if (first && a == 0)
            snprintf(first, len, "%s", p);
    }
    return 0;
}

/* ---- trainer.json --------------------------------------------------------------------------- */

static int write_state(struct ghc_trainer *tr, const char *path)
{
    int64_t epoch = 0, cursor = 0;
    int rc = ghc_dataset_tell(tr->ds, &epoch, &cursor);
    if (rc < 0)
        return rc;
    json_t *j = json_object(), *as = json_array();
    for (int a = 0; a < tr->n_adapters; a++)
        json_array_append_new(as, json_integer(tr->adapter_steps[a]));
    json_object_set_new(j, "format", json_string("gh200core-trainer-state"));
    json_object_set_new(j, "version", json_integer(1));
    json_object_set_new(j, "run", json_string(tr->run_id));
    json_object_set_new(j, "step", json_integer(tr->step));
    json_object_set_new(j, "mode", json_string(ghc_train_mode_names[tr->c.mode]));
    json_object_set_new(j, "adapters", json_integer(tr->n_adapters));
    json_object_set_new(j, "adapter_steps", as);
    json_object_set_new(j, "active_expert", json_integer(tr->active));
    json_object_set_new(j, "data_epoch", json_integer(epoch));
    json_object_set_new(j, "data_cursor", json_integer(cursor));
    /* 64-bit counters as strings: JSON numbers lose bits past 2^53 in other readers */
    char buf[32];
    snprintf(buf, sizeof(buf), "%llu", (unsigned long long)tr->sampler.counter);
    json_object_set_new(j, "sampler_counter", json_string(buf));
    snprintf(buf, sizeof(buf), "%llu", (unsigned long long)tr->noise_rng.offset);
    json_object_set_new(j, "noise_offset", json_string(buf));
    json_object_set_new(j, "bad_total", json_integer(tr->bad_total));
    json_object_set_new(j, "bad_in_row", json_integer(tr->bad_in_row));
    json_object_set_new(j, "samples_seen", json_integer(tr->samples_seen));
    json_object_set_new(j, "world_size", json_integer(tr->world));
    json_object_set_new(j, "loss_ema", json_real(tr->loss_ema));
    rc = json_dump_file(j, path, JSON_INDENT(2) | JSON_SORT_KEYS) == 0 ? 0
       : ghc_error_set(tr->core, GHC_EIO, "%s: cannot write the trainer state", path);
    json_decref(j);
    return rc;
}

/* trainer.json's key `key` of `j` as an integer in [lo, hi]; else GHC_EFORMAT naming the file,
 * the key, what it holds and what was expected (`why`: where the bound comes from). */
static int state_int(ghc_core_t *core, const char *path, json_t *j, const char *key, int64_t lo, int64_t hi,
                     const char *why, int64_t *out)
{
    json_t *v = json_object_get(j, key);
    if (json_is_integer(v) && json_integer_value(v) >= lo && json_integer_value(v) <= hi) {
        *out = json_integer_value(v);
        return 0;
    }
    char *txt = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    int rc = ghc_error_set(core, GHC_EFORMAT, "%s: \"%s\" is %s: expected an integer from %lld to %lld%s", path, key,
                           txt ? txt : "missing", (long long)lo, (long long)hi, why);
    free(txt);
    return rc;
}

/* A 64-bit counter, written as a decimal string (JSON numbers lose bits past 2^53). */
static int state_u64(ghc_core_t *core, const char *path, json_t *j, const char *key, uint64_t *out)
{
    const char *v = json_string_value(json_object_get(j, key));
    char *end;
    errno = 0;
    unsigned long long x = v && *v >= '0' && *v <= '9' ? strtoull(v, &end, 10) : 0;
    if (!v || *v < '0' || *v > '9' || errno || *end)
        return ghc_error_set(core, GHC_EFORMAT, "%s: \"%s\" must be a string of decimal digits (a 64-bit counter)%s%s%s",
                             path, key, v ? ", got \"" : "", v ? v : "", v ? "\"" : "");
    *out = x;
    return 0;
}

/* The step of a folder named checkpoint-N (N digits only), else -1. */
static int64_t folder_step(const char *dir)
{
    char name[8400];
    snprintf(name, sizeof(name), "%s", dir);
    size_t n = strlen(name);
    while (n > 1 && name[n - 1] == '/')
        name[--n] = '\0';
    const char *base = strrchr(name, '/');
    int64_t s;
    return checkpoint_step(base ? base + 1 : name, &s) ? s : -1;
}

/* Read and check every field of trainer.json (type, range, agreement with this run and with
 * the folder's name) before anything of it is used. */
static int read_state(struct ghc_trainer *tr, const char *dir, const char *path)
{
    ghc_core_t *core = tr->core;
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    if (!j)
        return ghc_error_set(core, GHC_EFORMAT, "%s:%d: %s", path, err.line, err.text);
    int rc = 0;
    const int64_t big = INT64_C(1) << 62;
    int64_t version, step, n_ad, active, epoch, cursor, bad_total, bad_in_row, seen;
    uint64_t sampler_counter, noise_offset;
    json_t *as = json_object_get(j, "adapter_steps"), *ema = json_object_get(j, "loss_ema");
    const char *format = json_string_value(json_object_get(j, "format"));
    const char *mode = json_string_value(json_object_get(j, "mode"));
    if (!json_is_object(j) || !format || strcmp(format, "gh200core-trainer-state") != 0) {
        rc = ghc_error_set(core, GHC_EFORMAT, "%s: \"format\" is not \"gh200core-trainer-state\" (not a gh200core "
                           "trainer state)", path);
        goto out;
    }
    if ((rc = state_int(core, path, j, "version", 1, 1, " (this gh200core writes version 1)", &version)) < 0 ||
        (rc = state_int(core, path, j, "step", 0, tr->c.steps, " (train.steps)", &step)) < 0)
        goto out;
    if (folder_step(dir) >= 0 && folder_step(dir) != step) {
        rc = ghc_error_set(core, GHC_EFORMAT, "%s: \"step\" is %lld, but the folder is %s (step %lld)", path,
                           (long long)step, dir, (long long)folder_step(dir));
        goto out;
    }
    if (!mode) {
        rc = ghc_error_set(core, GHC_EFORMAT, "%s: \"mode\" must be a string (%s, ...)", path,
                           ghc_train_mode_names[tr->c.mode]);
        goto out;
    }
    if (!json_is_array(as)) {
        rc = ghc_error_set(core, GHC_EFORMAT, "%s: \"adapter_steps\" must be an array of integers", path);
        goto out;
    }
    if ((rc = state_int(core, path, j, "adapters", 1, GHC_TRAIN_MAX_ADAPTERS, "", &n_ad)) < 0)
        goto out;
    if (strcmp(mode, ghc_train_mode_names[tr->c.mode]) != 0 || n_ad != tr->n_adapters ||
        (int64_t)json_array_size(as) != n_ad) {
        rc = ghc_error_set(core, GHC_ECONFIG, "%s: the checkpoint was made in mode '%s' with %lld adapter(s) (%d step "
                           "counts); this configuration trains in mode '%s' with %d", path, mode, (long long)n_ad,
                           (int)json_array_size(as), ghc_train_mode_names[tr->c.mode], tr->n_adapters);
        goto out;
    }
    for (int a = 0; a < tr->n_adapters; a++) {
        json_t *e = json_array_get(as, (size_t)a);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > step) {
            char *txt = json_dumps(e, JSON_ENCODE_ANY | JSON_COMPACT);
            rc = ghc_error_set(core, GHC_EFORMAT, "%s: \"adapter_steps\"[%d] is %s: expected an integer from 0 to %lld "
                               "(\"step\")", path, a, txt ? txt : "?", (long long)step);
            free(txt);
            goto out;
        }
    }
    if ((rc = state_int(core, path, j, "active_expert", -1, tr->n_experts > 1 ? tr->n_experts - 1 : 0,
                        " (the model's experts)", &active)) < 0 ||
        (rc = state_int(core, path, j, "data_epoch", 0, INT64_C(1) << 40, "", &epoch)) < 0 ||
        (rc = state_int(core, path, j, "data_cursor", 0, big, "", &cursor)) < 0 ||
        (rc = state_u64(core, path, j, "sampler_counter", &sampler_counter)) < 0 ||
        (rc = state_u64(core, path, j, "noise_offset", &noise_offset)) < 0 ||
        (rc = state_int(core, path, j, "bad_total", 0, step, " (\"step\")", &bad_total)) < 0 ||
        (rc = state_int(core, path, j, "bad_in_row", 0, bad_total, " (\"bad_total\")", &bad_in_row)) < 0 ||
        (rc = state_int(core, path, j, "samples_seen", 0, big, "", &seen)) < 0)
        goto out;
    /* the ranks that trained it (since issue 25; older checkpoints: one) */
    int64_t world = 1;
    if (json_object_get(j, "world_size") &&
        (rc = state_int(core, path, j, "world_size", 1, 1 << 20, "", &world)) < 0)
        goto out;
    if (!json_is_number(ema) || !isfinite(json_number_value(ema)) || json_number_value(ema) < 0.0) {
        char *txt = ema ? json_dumps(ema, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        rc = ghc_error_set(core, GHC_EFORMAT, "%s: \"loss_ema\" is %s: expected a finite number >= 0", path,
                           txt ? txt : "missing");
        free(txt);
        goto out;
    }
    (void)version;
    (void)active;   /* checked; the trainer works it out again from the step */
    tr->step = step;
    for (int a = 0; a < tr->n_adapters; a++)
        tr->adapter_steps[a] = json_integer_value(json_array_get(as, (size_t)a));
    tr->sampler.counter = sampler_counter;
    tr->noise_rng.offset = noise_offset;
    tr->bad_total = bad_total;
    tr->bad_in_row = bad_in_row;
    tr->samples_seen = seen;
    tr->resumed_world = (int32_t)world;
    tr->loss_ema = json_number_value(ema);
    /* the run it continues (checkpoints written before run ids have none: a new id is drawn) */
    const char *run = json_string_value(json_object_get(j, "run"));
    snprintf(tr->run_id, sizeof(tr->run_id), "%s", run && strlen(run) < sizeof(tr->run_id) ? run : "");
    /* the dataset seeks there once it is open (the demo's only after it is generated) */
    tr->resumed = true;
    tr->resume_epoch = epoch;
    tr->resume_cursor = cursor;
out:
    json_decref(j);
    return rc;
}

/* ---- params.safetensors --------------------------------------------------------------------- */

/* The adapters' fp32 params exactly as trained (the adapter files may be saved in bf16 or
 * f16): params.safetensors of a checkpoint, restored over what the adapter files loaded. */
static int save_params(struct ghc_trainer *tr, const char *path)
{
    ghc_core_t *core = tr->core;
    ghc_st_writer_t *w = ghc_st_writer_init(core);
    int rc = w ? 0 : GHC_ENOMEM;
    for (int a = 0; a < tr->n_adapters && rc == 0; a++)
        for (int32_t i = 0; i < tr->n_params[a] && rc == 0; i++) {
            ghc_tensor_t *v = tr->params[a][i].value, *h = v;
            if (ghc_tensor_device(v) != GHC_DEVICE_CPU) {
                if (!(h = ghc_tensor_init(core, ghc_tensor_dtype(v), ghc_tensor_ndim(v), ghc_tensor_shape(v),
                                          GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE)))
                    rc = ghc_error_code(core);
                else if ((rc = ghc_op_copy(h, v, NULL)) == 0)
                    rc = ghc_op_sync(core, ghc_tensor_device(v), NULL);
            }
            if (rc == 0)
                rc = ghc_st_writer_add(w, tr->params[a][i].name, h);
            if (h != v)
                ghc_tensor_free(h);
        }
    if (rc == 0 && (rc = ghc_st_writer_metadata(w, "format", "gh200core-params")) == 0)
        rc = ghc_st_writer_finish(w, path);
    ghc_st_writer_free(w);
    return rc;
}

/* A tensor read from checkpoint file `path` must be finite: a NaN or an infinity there would
 * train on into an all-NaN adapter. 0 or GHC_EFORMAT naming the file, the tensor and the element. */
static int check_finite(ghc_core_t *core, const char *path, const char *name, const ghc_tensor_t *h)
{
    int64_t bad = ghc_tensor_find_nonfinite(h);
    if (bad < 0)
        return 0;
    return ghc_error_set(core, GHC_EFORMAT, "%s: tensor '%s': element %lld is %g (a non-finite value; the checkpoint "
                         "is damaged or was written by a run that diverged)", path, name, (long long)bad,
                         (double)ghc_cpu_load(ghc_tensor_cdata(h), ghc_tensor_dtype(h), bad));
}

/* Every float tensor of `path` (the optimizer's state, before the optimizer reads it) finite. */
static int check_file_finite(ghc_core_t *core, const char *path)
{
    ghc_st_t *st = ghc_st_open(core, path);
    if (!st)
        return ghc_error_code(core) ? ghc_error_code(core) : GHC_EIO;
    int rc = 0;
    for (int i = 0; i < ghc_st_count(st) && rc == 0; i++) {
        struct ghc_st_info info;
        ghc_st_info_at(st, i, &info);
        if (!ghc_dtype_is_float(info.dtype))
            continue;
        ghc_tensor_t *h = ghc_st_load(st, info.name, GHC_DTYPE_F32, GHC_ROLE_WORKSPACE);
        rc = h ? check_finite(core, path, info.name, h) : ghc_error_code(core);
        ghc_tensor_free(h);
    }
    ghc_st_free(st);
    return rc;
}

static int load_params(struct ghc_trainer *tr, const char *path)
{
    ghc_core_t *core = tr->core;
    ghc_st_t *st = ghc_st_open(core, path);
    if (!st)
        return ghc_error_code(core) ? ghc_error_code(core) : GHC_EIO;
    int rc = 0;
    int32_t total = 0;
    for (int a = 0; a < tr->n_adapters; a++)
        total += tr->n_params[a];
    if (ghc_st_count(st) != total)
        rc = ghc_error_set(core, GHC_EFORMAT, "%s: %d tensors, but the adapters have %d params", path,
                           ghc_st_count(st), (int)total);
    for (int a = 0; a < tr->n_adapters && rc == 0; a++)
        for (int32_t i = 0; i < tr->n_params[a] && rc == 0; i++) {
            ghc_tensor_t *v = tr->params[a][i].value;
            struct ghc_st_info info;
            if (!ghc_st_find(st, tr->params[a][i].name, &info)) {
                rc = ghc_error_set(core, GHC_EFORMAT, "%s: no tensor '%s'", path, tr->params[a][i].name);
                break;
            }
            ghc_tensor_t *h = ghc_st_load(st, tr->params[a][i].name, ghc_tensor_dtype(v), GHC_ROLE_WORKSPACE);
            if (!h) {
                rc = ghc_error_code(core);
            } else if ((rc = check_finite(core, path, tr->params[a][i].name, h)) < 0) {
                /* named */
            } else if (!ghc_tensor_same_shape(h, v)) {
                rc = ghc_error_set(core, GHC_EFORMAT, "%s: '%s' has another shape than the adapter's param", path,
                                   tr->params[a][i].name);
            } else if ((rc = ghc_op_copy(v, h, NULL)) == 0) {
                rc = ghc_op_sync(core, ghc_tensor_device(v), NULL);
            }
            ghc_tensor_free(h);
        }
    ghc_st_free(st);
    return rc;
}

/* ---- the checkpoint folder ------------------------------------------------------------------ */

static int mkdir_one(ghc_core_t *core, const char *path)
{
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
        return ghc_error_set(core, GHC_EIO, "%s: cannot create: %s", path, strerror(errno));
    return 0;
}

void ghc_checkpoint_trash(struct ghc_trainer *tr, const char *dir, const char *why)
{
    ghc_core_t *core = tr->core;
    char trash[8400], msg[GHC_ERROR_MAX];
    snprintf(trash, sizeof(trash), "%s.trash", dir);
    /* renamed first: a run killed while removing leaves checkpoint-N.trash, never a
     * half-removed checkpoint-N that looks whole; the next run cleans it */
    int rc = ghc_outdir_remove(core, trash);
    if (rc == 0 && rename(dir, trash) != 0)
        rc = ghc_error_set(core, GHC_EIO, "%s: cannot rename to %s: %s", dir, trash, strerror(errno));
    if (rc == 0)
        rc = ghc_outdir_remove(core, trash);
    if (rc == 0) {
        ghc_log(core, GHC_LOG_INFO, "train: removed %s%s", dir, why);
        return;
    }
    snprintf(msg, sizeof(msg), "%s", ghc_error_message(core));
    ghc_error_clear(core);
    ghc_log(core, GHC_LOG_WARN, "train: %s: not removed (%s); the run goes on", dir, msg);
}

/* Moves aside all but the newest keep_last of this run's own checkpoints (trainer.json with
 * its id); another run's, and folders this tool did not write, are neither counted nor
 * touched. */
static void prune_checkpoints(struct ghc_trainer *tr)
{
    if (!tr->c.keep_last)
        return;
    DIR *d = opendir(tr->out);
    if (!d)
        return;
    int64_t *steps = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    char p[8400], run[40];
    while ((e = readdir(d))) {
        int64_t s;
        snprintf(p, sizeof(p), "%s/%s", tr->out, e->d_name);
        if (!checkpoint_step(e->d_name, &s) || !ghc_checkpoint_ours(p, run, sizeof(run)) || strcmp(run, tr->run_id))
            continue;
        if (n == cap) {
            int64_t *ns = realloc(steps, (cap = cap ? 2 * cap : 64) * sizeof(*ns));
            if (!ns)
                break;
            steps = ns;
        }
        steps[n++] = s;
    }
    closedir(d);
    while (n > (size_t)tr->c.keep_last) {
        size_t lo = 0;
        for (size_t i = 1; i < n; i++)
            if (steps[i] < steps[lo])
                lo = i;
        snprintf(p, sizeof(p), "%s/checkpoint-%lld", tr->out, (long long)steps[lo]);
        ghc_checkpoint_trash(tr, p, " (keep_last)");
        steps[lo] = steps[--n];
    }
    free(steps);
}

/* output_dir/checkpoint-<step>/: adapters, optimizer state, trainer state, the resolved config;
 * written into a .tmp folder first and renamed, so a checkpoint is whole or absent. */
int ghc_checkpoint_write(struct ghc_trainer *tr)
{
    ghc_core_t *core = tr->core;
    char dir[8192], tmp[8300], p[8400];
    snprintf(dir, sizeof(dir), "%s/checkpoint-%lld", tr->out, (long long)tr->step);
    snprintf(tmp, sizeof(tmp), "%s.tmp", dir);
    int rc;
    if ((rc = ghc_outdir_remove(core, tmp)) < 0 || (rc = mkdir_one(core, tmp)) < 0 ||
        (rc = ghc_checkpoint_save_adapters(tr, tmp, NULL, 0)) < 0)
        return rc;
    snprintf(p, sizeof(p), "%s/params.safetensors", tmp);
    if ((rc = save_params(tr, p)) < 0)
        return rc;
    snprintf(p, sizeof(p), "%s/optimizer.safetensors", tmp);
    if ((rc = ghc_optimizer_save(tr->opt, p)) < 0)
        return rc;
    snprintf(p, sizeof(p), "%s/trainer.json", tmp);
    if ((rc = write_state(tr, p)) < 0)
        return rc;
    snprintf(p, sizeof(p), "%s/resolved.cfg", tmp);
    if ((rc = ghc_config_write(core, p)) < 0)
        return rc;
    /* a checkpoint of the same step (this tool's) is replaced; a folder of that name this
     * tool did not write stays, and so does the new checkpoint, under its .tmp name */
    struct stat st;
    char old[8400] = "";
    if (lstat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode) || !ghc_checkpoint_ours(dir, NULL, 0))
            return ghc_error_set(core, GHC_EEXIST, "%s exists and is not a gh200core checkpoint (no trainer.json): "
                                 "not replaced; this step's checkpoint is in %s", dir, tmp);
        snprintf(old, sizeof(old), "%s.trash", dir);
        if ((rc = ghc_outdir_remove(core, old)) < 0)
            return rc;
        if (rename(dir, old) != 0)
            return ghc_error_set(core, GHC_EIO, "%s: cannot rename to %s: %s", dir, old, strerror(errno));
    }
    if (rename(tmp, dir) != 0)
        return ghc_error_set(core, GHC_EIO, "%s: cannot rename to %s: %s", tmp, dir, strerror(errno));
    tr->wrote_checkpoint = true;
    ghc_log(core, GHC_LOG_INFO, "train: step %lld: checkpoint %s", (long long)tr->step, dir);
    if (*old && ghc_outdir_remove(core, old) < 0) {
        ghc_log(core, GHC_LOG_WARN, "train: %s: the replaced checkpoint is not removed (%s); the run goes on", old,
                ghc_error_message(core));
        ghc_error_clear(core);
    }
    prune_checkpoints(tr);
    return 0;
}

/* ---- the configuration of a resumed run ------------------------------------------------------ */

/* What a resumed run may not change: what the adapters, the optimizer's state and the random
 * streams are made of (a key, or a section's key and everything under it). Every other key
 * that differs is named in one warning. doc/training.md lists both. */
static const char *const resume_fixed[] = {
    "seed", "data.seed",
    "model.plugin", "model.checkpoint", "model.checkpoints", "model.random",
    "network.plugin", "network.algo", "network.rank", "network.alpha", "network.rs_lora", "network.factor",
    "network.decompose_both", "network.full_matrix", "network.dora_wd", "network.preset", "network.include",
    "network.exclude", "network.overrides",
    "optimizer.plugin", "train.mode", "train.expert", "train.name",
};

/* Keys a resumed run changes without a word: where it writes, where plugins come from. */
static const char *const resume_quiet[] = { "output_dir", "plugin_path" };

static bool key_in(const char *key, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(list[i]);
        if (strncmp(key, list[i], l) == 0 && (key[l] == '\0' || key[l] == '.'))
            return true;
    }
    return false;
}

struct resume_diff {
    ghc_core_t *core;
    const char *cfg;              /* the checkpoint's resolved.cfg */
    char        changed[1024];    /* "train.steps 12 (was 6), ..." */
    int         n_changed;
};

static int resume_visit(void *user, const char *key, const char *mine, const char *theirs)
{
    struct resume_diff *d = user;
    if (key_in(key, resume_quiet, sizeof(resume_quiet) / sizeof(resume_quiet[0])))
        return 0;
    if (key_in(key, resume_fixed, sizeof(resume_fixed) / sizeof(resume_fixed[0])))
        return ghc_error_set(d->core, GHC_ECONFIG, "%s: %s = %s, but this configuration has %s = %s: a resumed run "
                             "cannot change it (doc/training.md, \"Resuming\")", d->cfg, key, theirs, key, mine);
    size_t at = strlen(d->changed);
    if (at + 1 < sizeof(d->changed))
        snprintf(d->changed + at, sizeof(d->changed) - at, "%s%s %s (was %s)", d->n_changed ? ", " : "", key, mine,
                 theirs);
    d->n_changed++;
    return 0;
}

/* The configuration in effect against the checkpoint's resolved.cfg: GHC_ECONFIG for a key of
 * resume_fixed, one warning naming the others that differ. */
static int check_resume_config(struct ghc_trainer *tr, const char *dir)
{
    struct resume_diff d = { .core = tr->core };
    char p[8400];
    snprintf(p, sizeof(p), "%s/resolved.cfg", dir);
    d.cfg = p;
    int rc = ghc_config_diff(tr->core, p, resume_visit, &d);
    if (rc < 0)
        return rc;
    if (d.n_changed)
        ghc_log(tr->core, GHC_LOG_WARN, "train: resuming %s with %d setting%s changed from its resolved.cfg: %s", dir,
                d.n_changed, d.n_changed == 1 ? "" : "s", d.changed);
    return 0;
}

int ghc_checkpoint_read(struct ghc_trainer *tr, const char *dir)
{
    ghc_core_t *core = tr->core;
    char p[8400];
    int rc;
    if ((rc = check_resume_config(tr, dir)) < 0)
        return rc;
    snprintf(p, sizeof(p), "%s/trainer.json", dir);
    if ((rc = read_state(tr, dir, p)) < 0)
        return rc;
    for (int a = 0; a < tr->n_adapters; a++) {
        adapter_file(tr, dir, a, p, sizeof(p));
        int32_t e = tr->adapter_expert[a] < 0 ? 0 : tr->adapter_expert[a];
        if ((rc = ghc_network_load(tr->net, e, p)) < 0)
            return rc;
    }
    snprintf(p, sizeof(p), "%s/params.safetensors", dir);
    if ((rc = load_params(tr, p)) < 0)
        return rc;
    snprintf(p, sizeof(p), "%s/optimizer.safetensors", dir);
    if ((rc = check_file_finite(core, p)) < 0 || (rc = ghc_optimizer_load(tr->opt, p)) < 0)
        return rc;
    ghc_log(core, GHC_LOG_INFO, "train: resumed from %s at step %lld", dir, (long long)tr->step);
    return 0;
}
