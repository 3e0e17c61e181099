/* progress.c: what the trainer tells its user while it runs: the run's first and last lines
 * and one line per step (step/total, the loss and its average, seconds per step, the time
 * left, memory on the host and the device, and the UVM stage of gh200_uvm). Everything goes
 * through ghc_log at GHC_LOG_INFO, so a program that embeds the trainer gets it through its
 * sink and the library prints nothing itself.
 *
 * For a terminal (ghc_train_opts.progress) every step's line is logged, starting with '\r'
 * so that a sink writing to a terminal draws it over the last one; the line that ends the
 * progress (the last step, or the stop after a signal) also ends with '\n'. Otherwise the
 * line is logged plainly every log_every steps, and at the first and the last. */
#include <config.h>

#include <stdio.h>
#include <time.h>

#include <gh200core/gh200core.h>

#include "train_impl.h"

double ghc_progress_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void ghc_progress_begin(struct ghc_trainer *tr)
{
    ghc_log(tr->core, GHC_LOG_INFO, "train: %lld steps, mode %s, %lld samples per epoch, on %s",
            (long long)tr->c.steps, ghc_train_mode_names[tr->c.mode], (long long)ghc_dataset_size(tr->ds),
            tr->device == GHC_DEVICE_CPU ? "the CPU" : "the GPU");
    tr->t_start = ghc_progress_now();
    tr->first_step = tr->step;
    tr->line[0] = '\0';
}

static void fmt_bytes(char *buf, size_t len, uint64_t b)
{
    if (b >= (1ull << 30))
        snprintf(buf, len, "%.1fG", (double)b / (double)(1ull << 30));
    else
        snprintf(buf, len, "%.0fM", (double)b / (double)(1ull << 20));
}

void ghc_progress_step(struct ghc_trainer *tr, const struct ghc_step_report *r)
{
    const struct ghc_mem_stats *ms = &r->mem;
    double elapsed = ghc_progress_now() - tr->t_start;
    int64_t done = tr->step, total = tr->c.steps;
    int64_t ran = done - tr->first_step;
    double per = elapsed / (double)(ran > 0 ? ran : 1);
    double eta = per * (double)(total - done);
    char host[16], dev[16];
    fmt_bytes(host, sizeof(host), ms->bytes_host + ms->bytes_managed);
    fmt_bytes(dev, sizeof(dev), ms->bytes_device);
    snprintf(tr->line, sizeof(tr->line), "step %lld/%lld  loss %.4g (avg %.4g)  %.3g s/step  ETA %dm%02ds  mem host %s dev %s%s%s",
             (long long)done, (long long)total, r->loss, tr->loss_ema, r->t_step, (int)(eta / 60), (int)eta % 60,
             host, dev, ms->stage ? "  uvm stage " : "", ms->stage ? (ms->stage == 1 ? "1" : "2") : "");
    if (tr->progress) {
        ghc_log(tr->core, GHC_LOG_INFO, "\r%s%s", tr->line, done == total ? "\n" : "");
        if (done == total)
            tr->line[0] = '\0';
    } else if (done % tr->c.log_every == 0 || done == total || done == 1) {
        ghc_log(tr->core, GHC_LOG_INFO, "%s", tr->line);
    }
}

void ghc_progress_stop(struct ghc_trainer *tr)
{
    /* drawn again as it stands, now ended (an empty line when the last step ended it) */
    if (tr->progress)
        ghc_log(tr->core, GHC_LOG_INFO, "\r%s\n", tr->line);
}

void ghc_progress_done(struct ghc_trainer *tr, const char *first_file)
{
    ghc_log(tr->core, GHC_LOG_INFO, "train: done: %lld steps in %.1f s, final loss (avg) %.6g; adapter%s: %s%s",
            (long long)tr->step, ghc_progress_now() - tr->t_start, tr->loss_ema, tr->n_adapters > 1 ? "s" : "",
            first_file, tr->n_adapters > 1 ? " (and the low-noise one beside it)" : "");
}
