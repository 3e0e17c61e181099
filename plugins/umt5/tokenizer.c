/* tokenizer.c: the umT5 tokenizer: a SentencePiece model through the libsentencepiece shim
 * (spm.cc), Wan's cleaning (clean.c), truncation to text_len - 1 pieces, the EOS and padding
 * (Wan's HuggingfaceTokenizer with padding='max_length'). Without libsentencepiece (configure
 * --without-sentencepiece) loading fails with a message saying so. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "spm.h"
#include "umt5.h"

struct ghc_umt5_tok {
    ghc_core_t *core;
    umt5_spm_t *sp;
    int32_t     size;
    int32_t     eos;
    char        name[256];   /* the file, for messages */
};

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

#ifdef GHC_HAVE_SENTENCEPIECE
static ghc_umt5_tok_t *tok_load(ghc_core_t *core, const char *name, const char *path, const void *data, size_t len)
{
    char err[512] = "";
    umt5_spm_t *sp = NULL;
    int st = umt5_spm_load(path, data, len, &sp, err, sizeof(err));
    if (st != UMT5_SPM_OK) {
        int code = st == UMT5_SPM_ENOMEM ? GHC_ENOMEM : st == UMT5_SPM_EIO ? GHC_EIO : GHC_EFORMAT;
        ghc_error_set(core, code, "%s: not a SentencePiece model (spiece.model / tokenizer.model): %s", name, err);
        return NULL;
    }
    ghc_umt5_tok_t *tok = calloc(1, sizeof(*tok));
    if (!tok) {
        umt5_spm_free(sp);
        ghc_error_set(core, GHC_ENOMEM, "%s: out of memory", name);
        return NULL;
    }
    tok->core = core;
    tok->sp = sp;
    tok->size = umt5_spm_size(sp);
    tok->eos = GHC_UMT5_EOS_ID;
    snprintf(tok->name, sizeof(tok->name), "%s", name);
    if (umt5_spm_eos(sp) != GHC_UMT5_EOS_ID || tok->size <= GHC_UMT5_EOS_ID)
        ghc_log(core, GHC_LOG_WARN, "umt5: %s: the EOS piece is id %d, umT5's is %d; appending %d", name,
                umt5_spm_eos(sp), GHC_UMT5_EOS_ID, GHC_UMT5_EOS_ID);
    return tok;
}
#else
static ghc_umt5_tok_t *tok_load(ghc_core_t *core, const char *name, const char *path, const void *data, size_t len)
{
    (void)path;
    (void)data;
    (void)len;
    ghc_error_set(core, GHC_EUNSUPPORTED, "%s: this build has no SentencePiece tokenizer (configured "
                  "--without-sentencepiece; install libsentencepiece-dev and configure again)", name);
    return NULL;
}
#endif

ghc_umt5_tok_t *ghc_umt5_tok_init(ghc_core_t *core, const char *path)
{
    struct stat sb;
    if (ends_with(path, ".json")) {
        ghc_error_set(core, GHC_EUNSUPPORTED, "%s: a tokenizers JSON file is not supported; give the SentencePiece "
                      "model of the same folder, spiece.model (google/umt5-xxl) or tokenizer.model", path);
        return NULL;
    }
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        ghc_error_set(core, GHC_EIO, "%s: no such tokenizer file (expected a SentencePiece model: spiece.model of "
                      "google/umt5-xxl, tokenizer.model)", path);
        return NULL;
    }
    return tok_load(core, path, path, NULL, 0);
}

ghc_umt5_tok_t *ghc_umt5_tok_init_bytes(ghc_core_t *core, const char *name, const void *data, size_t len)
{
    return tok_load(core, name, NULL, data, len);
}

void ghc_umt5_tok_free(ghc_umt5_tok_t *tok)
{
    if (!tok)
        return;
#ifdef GHC_HAVE_SENTENCEPIECE
    umt5_spm_free(tok->sp);
#endif
    free(tok);
}

int32_t ghc_umt5_tok_size(const ghc_umt5_tok_t *tok)
{
    return tok->size;
}

int ghc_umt5_tok_encode(ghc_umt5_tok_t *tok, const char *text, bool clean, int32_t text_len, int32_t *ids,
                        int32_t *mask)
{
    if (text_len < 1)
        return ghc_error_set(tok->core, GHC_EINVAL, "umt5: text_len %d, expected >= 1", text_len);
    char *cleaned = NULL;
    if (clean && !(cleaned = ghc_umt5_clean(tok->core, text)))
        return ghc_error_code(tok->core);
    const char *t = cleaned ? cleaned : text;
    int32_t *p = NULL;
    size_t n = 0;
    int rc = 0;
#ifdef GHC_HAVE_SENTENCEPIECE
    char err[512] = "";
    int st = umt5_spm_encode(tok->sp, t, strlen(t), &p, &n, err, sizeof(err));
    if (st != UMT5_SPM_OK)
        rc = ghc_error_set(tok->core, st == UMT5_SPM_ENOMEM ? GHC_ENOMEM : GHC_EINVAL, "umt5: %s: encoding failed: %s",
                           tok->name, err);
#else
    (void)t;
    rc = ghc_error_set(tok->core, GHC_EUNSUPPORTED, "umt5: this build has no SentencePiece tokenizer");
#endif
    free(cleaned);
    if (rc < 0)
        return rc;
    const int32_t L = n < (size_t)text_len - 1 ? (int32_t)n + 1 : text_len;
    for (int32_t i = 0; i < text_len; i++) {
        ids[i] = i < L - 1 ? p[i] : i == L - 1 ? tok->eos : GHC_UMT5_PAD_ID;
        if (mask)
            mask[i] = i < L;
    }
    free(p);
    return L;
}
