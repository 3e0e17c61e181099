/* saved.c: the saved-activation ring (saved.h). */
#include <stdlib.h>
#include <string.h>

#include "saved.h"

void saved_ring_init(struct saved_ring *r, ghc_core_t *core, const char *who, const struct saved_io *io, int n_bufs,
                     int ahead, bool poison)
{
    *r = (struct saved_ring){ .core = core, .who = who, .io = *io, .n_bufs = n_bufs < 2 ? 2 : n_bufs,
                              .poison = poison && io->fill };
    r->ahead = ahead < 0 ? 0 : ahead > r->n_bufs - 1 ? r->n_bufs - 1 : ahead;
}

static int home_find(const struct saved_ring *r, const void *ptr)
{
    for (int i = 0; i < r->n_homes; i++)
        if (r->homes[i].ptr == ptr)
            return i;
    return -1;
}

int saved_ring_add(struct saved_ring *r, void *ptr, size_t bytes)
{
    if (r->n_homes == r->cap_homes) {
        int cap = r->cap_homes ? 2 * r->cap_homes : 64;
        struct saved_home *h = realloc(r->homes, (size_t)cap * sizeof(*h));
        if (!h)
            return ghc_error_set(r->core, GHC_ENOMEM, "%s: out of memory", r->who);
        r->homes = h;
        r->cap_homes = cap;
    }
    r->homes[r->n_homes++] = (struct saved_home){ .ptr = ptr, .bytes = bytes, .unit = -1 };
    return 0;
}

/* ---- the buffers ---------------------------------------------------------------------------- */

static void bufs_free(struct saved_ring *r)
{
    if (!r->bufs)
        return;
    r->io.sync(r->io.ctx);
    for (int b = 0; b < r->n_bufs; b++) {
        struct saved_buf *sb = &r->bufs[b];
        if (sb->buf)
            r->io.buf_free(r->io.ctx, sb->buf);
        if (sb->used)
            r->io.event_free(r->io.ctx, sb->used);
        if (sb->copied)
            r->io.event_free(r->io.ctx, sb->copied);
    }
    free(r->bufs);
    r->bufs = NULL;
    r->buf_bytes = 0;
}

/* Buffers for units of up to `need` bytes (at least the largest home). */
static int bufs_make(struct saved_ring *r, size_t need)
{
    int rc = 0;
    if (r->bufs && r->buf_bytes >= need)
        return 0;
    for (int b = 0; r->bufs && b < r->n_bufs; b++)
        if (r->bufs[b].held)
            return ghc_error_set(r->core, GHC_EINVAL, "%s: saved unit of %zu bytes begun while the ring's buffers of "
                                 "%zu bytes are in use (end every unit before saved memory of a new size is used)",
                                 r->who, need, r->buf_bytes);
    bufs_free(r);
    size_t most = need;
    for (int i = 0; i < r->n_homes; i++)
        if (r->homes[i].bytes > most)
            most = r->homes[i].bytes;
    most = (most + 255) / 256 * 256;
    if (!(r->bufs = calloc((size_t)r->n_bufs, sizeof(*r->bufs))))
        return ghc_error_set(r->core, GHC_ENOMEM, "%s: out of memory", r->who);
    r->buf_bytes = most;
    for (int b = 0; b < r->n_bufs; b++) {
        struct saved_buf *sb = &r->bufs[b];
        sb->home = -1;
        if ((rc = r->io.buf_alloc(r->io.ctx, most, &sb->buf)) < 0)
            goto fail;
        if (r->io.event_make && ((rc = r->io.event_make(r->io.ctx, &sb->used)) < 0 ||
                                 (rc = r->io.event_make(r->io.ctx, &sb->copied)) < 0))
            goto fail;
    }
    r->io.sync(r->io.ctx);   /* buffers from a stream-ordered pool: usable on the copy stream */
    ghc_log(r->core, GHC_LOG_DEBUG, "%s: saved-activation ring of %d x %.1f MiB", r->who, r->n_bufs,
            most / 1048576.0);
    return 0;
fail:
    bufs_free(r);
    return rc;
}

bool saved_ring_drop(struct saved_ring *r, void *ptr)
{
    int h = home_find(r, ptr);
    if (h < 0)
        return false;
    for (int b = 0; r->bufs && b < r->n_bufs; b++) {
        if (r->bufs[b].home == h) {
            r->bufs[b].home = -1;
            r->bufs[b].held = false;   /* released while begun: a caller's bug, but the buffer lives on */
        } else if (r->bufs[b].home == r->n_homes - 1)
            r->bufs[b].home = h;   /* the last home moves into h's place */
    }
    for (int64_t u = 0; u < r->n_units; u++) {
        if (r->by_unit[u] == h)
            r->by_unit[u] = -1;
        else if (r->by_unit[u] == r->n_homes - 1)
            r->by_unit[u] = h;
    }
    r->homes[h] = r->homes[--r->n_homes];
    if (!r->n_homes)
        bufs_free(r);   /* the next begin sizes them for what is allocated then */
    return true;
}

/* The least recently used buffer that is not held, one holding nothing first, skipping any whose
 * unit lies in [lo, hi] (the units about to be read), or -1. */
static int buf_pick(const struct saved_ring *r, int64_t lo, int64_t hi)
{
    int pick = -1;
    for (int b = 0; b < r->n_bufs; b++) {
        const struct saved_buf *sb = &r->bufs[b];
        if (sb->held)
            continue;
        if (sb->home >= 0 && r->homes[sb->home].unit >= lo && r->homes[sb->home].unit <= hi)
            continue;
        bool empty = sb->home < 0, pick_empty = pick >= 0 && r->bufs[pick].home < 0;
        if (pick < 0 || (empty && !pick_empty) || (empty == pick_empty && sb->clock < r->bufs[pick].clock))
            pick = b;
    }
    return pick;
}

static int buf_of(const struct saved_ring *r, int h)
{
    for (int b = 0; r->bufs && b < r->n_bufs; b++)
        if (r->bufs[b].home == h)
            return b;
    return -1;
}

/* Copy home h into buffer b, after the caller's last work on b. */
static int fetch(struct saved_ring *r, int b, int h)
{
    struct saved_buf *sb = &r->bufs[b];
    const struct saved_home *hm = &r->homes[h];
    int rc = r->io.copy(r->io.ctx, sb->buf, hm->ptr, hm->bytes, true, sb->used, sb->copied);
    if (rc < 0) {
        sb->home = -1;
        return rc;
    }
    sb->home = h;
    sb->fetched = true;
    r->in_bytes += hm->bytes;
    return 0;
}

static int set_unit(struct saved_ring *r, int64_t unit, int h)
{
    if (unit >= r->n_units) {
        int64_t n = unit + 1 > 2 * r->n_units ? unit + 1 : 2 * r->n_units;
        int *bu = realloc(r->by_unit, (size_t)n * sizeof(*bu));
        if (!bu)
            return ghc_error_set(r->core, GHC_ENOMEM, "%s: out of memory", r->who);
        for (int64_t u = r->n_units; u < n; u++)
            bu[u] = -1;
        r->by_unit = bu;
        r->n_units = n;
    }
    for (int64_t u = 0; u < r->n_units; u++)   /* one unit number per home */
        if (r->by_unit[u] == h)
            r->by_unit[u] = -1;
    r->by_unit[unit] = h;
    r->homes[h].unit = unit;
    return 0;
}

/* ---- begin and end ----------------------------------------------------------------------------- */

int saved_ring_begin(struct saved_ring *r, void *ptr, size_t bytes, int64_t unit, bool write, void *stream, void **at)
{
    int rc, h = home_find(r, ptr), b;
    *at = ptr;
    if (h < 0)
        return 0;   /* not a home of this ring: it stays where alloc put it */
    struct saved_home *hm = &r->homes[h];
    if (bytes > hm->bytes || unit < 0)
        return ghc_error_set(r->core, GHC_EINVAL, "%s: saved unit %lld: %zu bytes asked of an allocation of %zu",
                             r->who, (long long)unit, bytes, hm->bytes);
    if ((b = buf_of(r, h)) >= 0 && r->bufs[b].held)
        return ghc_error_set(r->core, GHC_EINVAL, "%s: saved unit %lld begun twice without saved_end", r->who,
                             (long long)unit);
    if (!write && !hm->written)
        return ghc_error_set(r->core, GHC_EINVAL, "%s: saved unit %lld read before a write pass wrote it", r->who,
                             (long long)unit);
    if ((rc = bufs_make(r, hm->bytes)) < 0)
        return rc;
    if (write) {
        if (b >= 0)
            r->bufs[b].home = -1;   /* an older copy of the unit: its bytes are about to be replaced */
        if ((b = buf_pick(r, 1, 0)) < 0)
            return ghc_error_set(r->core, GHC_EINVAL, "%s: every buffer of the saved ring (%d) is in use; end units "
                                 "sooner or give the ring more buffers", r->who, r->n_bufs);
        if ((rc = set_unit(r, unit, h)) < 0)
            return rc;
        hm->written = false;
        r->bufs[b].home = h;
        r->bufs[b].fetched = false;
        if (r->poison)
            r->io.fill(r->io.ctx, r->bufs[b].buf, r->buf_bytes);
    } else if (b >= 0) {
        if (!r->bufs[b].fetched)
            r->hits++;   /* still there from the write pass: no copy at all */
    } else {
        if ((b = buf_pick(r, unit - r->ahead, unit - 1)) < 0)
            return ghc_error_set(r->core, GHC_EINVAL, "%s: every buffer of the saved ring (%d) is in use; end units "
                                 "sooner or give the ring more buffers", r->who, r->n_bufs);
        if ((rc = fetch(r, b, h)) < 0)
            return rc;
    }
    struct saved_buf *sb = &r->bufs[b];
    if (r->io.event_make)
        r->io.wait(r->io.ctx, stream, sb->copied);   /* its last copy out (write) or in (read) is done */
    sb->held = true;
    sb->write = write;
    sb->clock = ++r->clock;
    *at = sb->buf;
    if (!write)   /* the backward reads the lower units next: start their copies now */
        for (int64_t k = 1; k <= r->ahead && unit - k >= 0; k++) {
            int64_t u = unit - k;
            int h2 = u < r->n_units ? r->by_unit[u] : -1, b2;
            if (h2 < 0 || !r->homes[h2].written || buf_of(r, h2) >= 0)
                continue;
            if ((b2 = buf_pick(r, unit - r->ahead, unit - 1)) < 0)
                break;
            if ((rc = fetch(r, b2, h2)) < 0)
                return rc;
            r->bufs[b2].clock = r->clock;
        }
    return 0;
}

int saved_ring_end(struct saved_ring *r, void *ptr, void *stream)
{
    int h = home_find(r, ptr), b = h >= 0 ? buf_of(r, h) : -1;
    if (h < 0)
        return 0;
    if (b < 0 || !r->bufs[b].held)
        return ghc_error_set(r->core, GHC_EINVAL, "%s: saved_end of unit %lld without saved_begin", r->who,
                             (long long)r->homes[h].unit);
    struct saved_buf *sb = &r->bufs[b];
    struct saved_home *hm = &r->homes[h];
    if (r->io.event_make)
        r->io.record(r->io.ctx, sb->used, stream);
    sb->held = false;
    if (sb->write) {   /* home, after the caller's writes; the buffer keeps the bytes */
        int rc = r->io.copy(r->io.ctx, hm->ptr, sb->buf, hm->bytes, false, sb->used, sb->copied);
        if (rc < 0) {
            sb->home = -1;
            return rc;
        }
        hm->written = true;
        r->out_bytes += hm->bytes;
    } else {
        sb->home = -1;   /* the caller may have used it as scratch */
    }
    if (r->poison) {   /* synchronous io: any later read of the buffer sees NaNs */
        r->io.fill(r->io.ctx, sb->buf, r->buf_bytes);
        sb->home = -1;
    }
    return 0;
}

uint64_t saved_ring_bytes(const struct saved_ring *r)
{
    return r->bufs ? (uint64_t)r->buf_bytes * (uint64_t)r->n_bufs : 0;
}

void saved_ring_free(struct saved_ring *r)
{
    bufs_free(r);
    free(r->homes);
    free(r->by_unit);
    r->homes = NULL;
    r->by_unit = NULL;
    r->n_homes = r->cap_homes = 0;
    r->n_units = 0;
}
