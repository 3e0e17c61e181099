/* inspect.c: `gh200core inspect FILE`: what a safetensors file (or a sharded checkpoint's
 * index) holds, without loading a tensor: its metadata, a table of tensors and totals per
 * dtype. Only the public reader API (safetensors.h) is used: the header is validated in full
 * first, so a broken file gives the reader's one-line error and nothing is printed. */
#include <config.h>

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/safetensors.h>   /* defines: ghc_st_open, struct ghc_st_info */

#include "cli.h"

#define INSPECT_VALUE_MAX 200   /* longer metadata values are shortened with "..." */

/* `v` on one line into buf: control characters escaped, cut after `max` bytes of v (never
 * inside a UTF-8 character) with "...". buf needs 4 * max + 4 bytes. */
static const char *one_line(const char *v, size_t max, char *buf)
{
    size_t n = strlen(v), cut = n, j = 0;
    if (n > max) {
        cut = max;
        while (cut > 0 && ((unsigned char)v[cut] & 0xc0) == 0x80)
            cut--;
    }
    for (size_t i = 0; i < cut; i++) {
        unsigned char c = (unsigned char)v[i];
        if (c == '\n' || c == '\t' || c == '\r') {
            buf[j++] = '\\';
            buf[j++] = c == '\n' ? 'n' : c == '\t' ? 't' : 'r';
        } else if (c < 0x20 || c == 0x7f) {
            j += (size_t)sprintf(buf + j, "\\x%02x", c);
        } else {
            buf[j++] = (char)c;
        }
    }
    if (cut < n) {
        memcpy(buf + j, "...", 3);
        j += 3;
    }
    buf[j] = '\0';
    return buf;
}

static void shape_str(const struct ghc_st_info *in, char *buf, size_t len)
{
    size_t j = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < in->ndim && j < len; d++)
        j += (size_t)snprintf(buf + j, len - j, "%s%" PRId64, d ? ", " : "", in->shape[d]);
    if (j < len)
        snprintf(buf + j, len - j, "]");
}

int ghc_cli_inspect(ghc_core_t *core, const char *path, FILE *out)
{
    int rc = 0;
    ghc_st_t *st = ghc_st_open(core, path);
    if (!st) {
        rc = ghc_error_code(core) ? ghc_error_code(core) : GHC_EFORMAT;
        goto out;
    }
    int n = ghc_st_count(st);
    struct ghc_st_info in;
    char kbuf[4 * INSPECT_VALUE_MAX + 4], vbuf[4 * INSPECT_VALUE_MAX + 4];

    fprintf(out, "file: %s\n", path);
    /* A sharded checkpoint: its files, in the order of the first tensor each holds. Every
     * tensor of one shard shares one `file` pointer, so pointers tell shards apart. */
    const char **files = NULL;
    int n_files = 0;
    for (int i = 0; i < n && ghc_st_info_at(st, i, &in); i++) {
        int k = 0;
        while (k < n_files && files[k] != in.file)
            k++;
        if (k < n_files)
            continue;
        const char **f = realloc(files, (size_t)(n_files + 1) * sizeof(*files));
        if (!f) {
            rc = ghc_error_set(core, GHC_ENOMEM, "inspect: out of memory");
            goto out_files;
        }
        files = f;
        files[n_files++] = in.file;
    }
    if (n_files > 1 || (n_files == 1 && strcmp(files[0], path))) {
        fputs("shards:\n", out);
        for (int k = 0; k < n_files; k++)
            fprintf(out, "  %s\n", one_line(files[k], INSPECT_VALUE_MAX, kbuf));
    }

    const char *key, *val;
    fputs("metadata:", out);
    if (!ghc_st_metadata_at(st, 0, &key, &val))
        fputs(" (none)", out);
    fputc('\n', out);
    for (int i = 0; ghc_st_metadata_at(st, i, &key, &val); i++)
        fprintf(out, "  %s = %s\n", one_line(key, INSPECT_VALUE_MAX, kbuf),
                one_line(val, INSPECT_VALUE_MAX, vbuf));

    char shape[160];
    int wname = 4, wshape = 5;
    for (int i = 0; i < n && ghc_st_info_at(st, i, &in); i++) {
        int len = (int)strlen(one_line(in.name, INSPECT_VALUE_MAX, kbuf));
        wname = len > wname ? len : wname;
        shape_str(&in, shape, sizeof(shape));
        len = (int)strlen(shape);
        wshape = len > wshape ? len : wshape;
    }
    if (wname > 80)
        wname = 80;   /* a few absurd names must not push every row off the screen */

    uint64_t cnt[GHC_DTYPE_COUNT] = { 0 }, params[GHC_DTYPE_COUNT] = { 0 };
    uint64_t bytes[GHC_DTYPE_COUNT] = { 0 };
    uint64_t total_params = 0, total_bytes = 0;
    fprintf(out, "%-*s  %-7s  %-*s  %s\n", wname, "NAME", "DTYPE", wshape, "SHAPE", "BYTES");
    for (int i = 0; i < n && ghc_st_info_at(st, i, &in); i++) {
        shape_str(&in, shape, sizeof(shape));
        fprintf(out, "%-*s  %-7s  %-*s  %" PRIu64 "\n", wname,
                one_line(in.name, INSPECT_VALUE_MAX, kbuf),
                ghc_dtype_name(in.dtype), wshape, shape, in.nbytes);
        uint64_t numel = in.nbytes / ghc_dtype_size(in.dtype);
        cnt[in.dtype]++;
        params[in.dtype] += numel;
        bytes[in.dtype] += in.nbytes;
        total_params += numel;
        total_bytes += in.nbytes;
    }

    fputs("totals:\n", out);
    for (int d = 0; d < GHC_DTYPE_COUNT; d++)
        if (cnt[d])
            fprintf(out, "  %-7s  %" PRIu64 " tensor%s, %" PRIu64 " parameters, %" PRIu64
                    " bytes\n", ghc_dtype_name((enum ghc_dtype)d), cnt[d], cnt[d] == 1 ? "" : "s",
                    params[d], bytes[d]);
    fprintf(out, "%d tensor%s, %" PRIu64 " parameters, %" PRIu64 " bytes (%.2f GiB)\n", n,
            n == 1 ? "" : "s", total_params, total_bytes,
            (double)total_bytes / (1024.0 * 1024.0 * 1024.0));
    if (ferror(out))
        rc = ghc_error_set(core, GHC_EIO, "inspect: cannot write the output");
out_files:
    free(files);
    ghc_st_free(st);
out:
    return rc;
}
