/* tboard.c: TensorBoard event files written natively: TFRecord framing (length, masked
 * CRC-32C of the length, the Event protocol buffer, masked CRC-32C of the data) around
 * hand-encoded Event messages (wall_time = 1, step = 2, file_version = 3, summary = 5;
 * Summary.value = 1; Value.tag = 1, Value.simple_value = 2). Point TensorBoard at the run's
 * output folder. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "train_impl.h"

struct ghc_tboard {
    ghc_core_t *core;
    FILE       *f;
    char       *path;
};

/* ---- CRC-32C -------------------------------------------------------------------------------- */

static uint32_t crc_table[256];

static void crc_table_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t ghc_crc32c(const void *data, size_t len)
{
    if (!crc_table[1])
        crc_table_init();
    const uint8_t *p = data;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < len; i++)
        c = crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

uint32_t ghc_crc32c_masked(const void *data, size_t len)
{
    uint32_t c = ghc_crc32c(data, len);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- protocol buffer encoding --------------------------------------------------------------- */

struct pb {
    uint8_t buf[1024];
    size_t  len;
};

static void pb_byte(struct pb *b, uint8_t v)
{
    if (b->len < sizeof(b->buf))
        b->buf[b->len] = v;
    b->len++;
}

static void pb_varint(struct pb *b, uint64_t v)
{
    do {
        pb_byte(b, (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0)));
        v >>= 7;
    } while (v);
}

static void pb_le(struct pb *b, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        pb_byte(b, (uint8_t)(v >> (8 * i)));
}

static void pb_bytes(struct pb *b, uint32_t field, const void *data, size_t len)
{
    pb_varint(b, (uint64_t)field << 3 | 2);
    pb_varint(b, len);
    for (size_t i = 0; i < len; i++)
        pb_byte(b, ((const uint8_t *)data)[i]);
}

static void pb_double(struct pb *b, uint32_t field, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, 8);
    pb_varint(b, (uint64_t)field << 3 | 1);
    pb_le(b, bits, 8);
}

static double now(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}

static int write_record(ghc_tboard_t *tb, const struct pb *ev)
{
    if (ev->len > sizeof(ev->buf))
        return ghc_error_set(tb->core, GHC_EINVAL, "%s: event of %zu bytes too large", tb->path, ev->len);
    uint8_t head[12];
    uint64_t n = ev->len;
    for (int i = 0; i < 8; i++)
        head[i] = (uint8_t)(n >> (8 * i));
    uint32_t c = ghc_crc32c_masked(head, 8);
    for (int i = 0; i < 4; i++)
        head[8 + i] = (uint8_t)(c >> (8 * i));
    uint8_t tail[4];
    c = ghc_crc32c_masked(ev->buf, ev->len);
    for (int i = 0; i < 4; i++)
        tail[i] = (uint8_t)(c >> (8 * i));
    if (fwrite(head, 1, 12, tb->f) != 12 || fwrite(ev->buf, 1, ev->len, tb->f) != ev->len ||
        fwrite(tail, 1, 4, tb->f) != 4)
        return ghc_error_set(tb->core, GHC_EIO, "%s: write failed: %s", tb->path, strerror(errno));
    return 0;
}

int ghc_tboard_open(ghc_core_t *core, const char *dir, ghc_tboard_t **out)
{
    char host[256] = "localhost";
    gethostname(host, sizeof(host) - 1);
    host[sizeof(host) - 1] = '\0';
    double t = now();
    ghc_tboard_t *tb = calloc(1, sizeof(*tb));
    size_t len = strlen(dir) + strlen(host) + 80;
    if (!tb || !(tb->path = malloc(len))) {
        free(tb);
        return ghc_error_set(core, GHC_ENOMEM, "tensorboard: out of memory");
    }
    tb->core = core;
    snprintf(tb->path, len, "%s/events.out.tfevents.%lld.%s.gh200core", dir, (long long)t, host);
    if (!(tb->f = fopen(tb->path, "wb"))) {
        int rc = ghc_error_set(core, GHC_EIO, "%s: cannot create: %s", tb->path, strerror(errno));
        ghc_tboard_free(tb);
        return rc;
    }
    struct pb ev = { .len = 0 };
    pb_double(&ev, 1, t);
    pb_bytes(&ev, 3, "brain.Event:2", 13);
    int rc = write_record(tb, &ev);
    if (rc < 0 || (rc = ghc_tboard_flush(tb)) < 0) {
        ghc_tboard_free(tb);
        return rc;
    }
    *out = tb;
    return 0;
}

int ghc_tboard_scalar(ghc_tboard_t *tb, const char *tag, int64_t step, float value)
{
    size_t tl = strlen(tag);
    if (tl > 256)
        return ghc_error_set(tb->core, GHC_EINVAL, "tensorboard: tag '%.40s...' too long", tag);
    struct pb val = { .len = 0 }, sum = { .len = 0 }, ev = { .len = 0 };
    uint32_t bits;
    memcpy(&bits, &value, 4);
    pb_bytes(&val, 1, tag, tl);
    pb_varint(&val, 2u << 3 | 5);
    pb_le(&val, bits, 4);
    pb_bytes(&sum, 1, val.buf, val.len);
    pb_double(&ev, 1, now());
    pb_varint(&ev, 2u << 3 | 0);
    pb_varint(&ev, (uint64_t)step);
    pb_bytes(&ev, 5, sum.buf, sum.len);
    return write_record(tb, &ev);
}

int ghc_tboard_flush(ghc_tboard_t *tb)
{
    if (fflush(tb->f) != 0)
        return ghc_error_set(tb->core, GHC_EIO, "%s: write failed: %s", tb->path, strerror(errno));
    return 0;
}

const char *ghc_tboard_path(const ghc_tboard_t *tb) { return tb->path; }

void ghc_tboard_free(ghc_tboard_t *tb)
{
    if (!tb)
        return;
    if (tb->f)
        fclose(tb->f);
    free(tb->path);
    free(tb);
}
