/* spm.h: the C side of the libsentencepiece shim (spm.cc): a processor loaded from a file or
 * from bytes, and plain encoding to ids. Errors come back as text in `err` (the caller makes
 * the one-line message). Internal to plugins/umt5. */
#ifndef GHC_UMT5_SPM_H
#define GHC_UMT5_SPM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct umt5_spm umt5_spm_t;

/* Status of the calls below. */
enum { UMT5_SPM_OK = 0, UMT5_SPM_ENOMEM = -1, UMT5_SPM_EFORMAT = -2, UMT5_SPM_EIO = -3 };

/* Load from `path`, or from `len` bytes of a serialized ModelProto (path NULL). Returns a
 * status; *out set on success (free with umt5_spm_free). */
int umt5_spm_load(const char *path, const void *data, size_t len, umt5_spm_t **out, char *err, size_t errlen);
void umt5_spm_free(umt5_spm_t *sp);
int32_t umt5_spm_size(const umt5_spm_t *sp);
/* The id of the EOS piece, or -1 when the model has none. */
int32_t umt5_spm_eos(const umt5_spm_t *sp);
/* Encode `len` bytes of UTF-8 text (no BOS, no EOS, no sampling) into *ids (malloc'd; free()),
 * *n ids. Returns a status. */
int umt5_spm_encode(const umt5_spm_t *sp, const char *text, size_t len, int32_t **ids, size_t *n, char *err,
                    size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* GHC_UMT5_SPM_H */
