/* fuzz_ghz.c: libFuzzer target for the .ghz block format of the in_memory backend. The input
 * is a whole .ghz file: staged as the backend stages one (frame, block table, every block
 * decoded and its CRC checked), then read back whole through im_read in uneven pieces. The
 * backend's file is compiled in (its functions are static). Any input: staged, or one line of
 * reason; never a read past a buffer (a 32-byte file claiming 2^64-1 raw bytes once did). */
#define FUZZ_PLAIN_INIT
#include "fuzz.h"

#include "plugins/in_memory/in_memory.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_memfd(data, size, path);
    struct im m = { .core = core, .block = 4096, .n = 1 };
    if (!(m.e = calloc(1, sizeof(*m.e))))
        abort();
    m.e[0] = (struct im_entry){ .name = strdup("0/x.latent.safetensors"), .path = strdup(path),
                                .file_size = size, .ghz = true };
    if (!m.e[0].name || !m.e[0].path)
        abort();
    stage_one(&m, &m.e[0]);
    if (m.e[0].err) {
        if (!*m.e[0].err || strchr(m.e[0].err, '\n'))
            abort();
    } else {
        uint64_t raw = m.e[0].raw;
        uint8_t buf[5000];
        for (uint64_t off = 0; off < raw;) {
            size_t want = (size_t)(raw - off < 4999 ? raw - off : 4999), got = 0;
            int rc = im_read(&m, m.e[0].name, off, buf, want, &got);
            fuzz_check(core, rc);
            if (rc < 0 || got == 0)
                break;
            off += got;
        }
    }
    entries_free(&m);
    close(fd);
    return 0;
}
