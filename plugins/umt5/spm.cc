// spm.cc: the libsentencepiece shim of the umT5 tokenizer: the one C++ file of the project,
// exposing SentencePieceProcessor through the extern "C" functions of spm.h. No exception or
// C++ type crosses into C: every status comes back as an int and a message.
#include <config.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include <sentencepiece_processor.h>

#include "spm.h"

struct umt5_spm {
    sentencepiece::SentencePieceProcessor proc;
};

static int fail(int code, char *err, size_t errlen, const std::string &what)
{
    if (err && errlen)
        std::snprintf(err, errlen, "%s", what.c_str());
    return code;
}

extern "C" int umt5_spm_load(const char *path, const void *data, size_t len, umt5_spm_t **out, char *err,
                             size_t errlen)
{
    umt5_spm_t *sp = new (std::nothrow) umt5_spm;
    if (!sp)
        return fail(UMT5_SPM_ENOMEM, err, errlen, "out of memory");
    try {
        sentencepiece::util::Status st;
        if (path)
            st = sp->proc.Load(path);
        else
            st = sp->proc.LoadFromSerializedProto(
                absl::string_view(static_cast<const char *>(data), len));
        if (!st.ok()) {
            int code = st.code() == sentencepiece::util::StatusCode::kNotFound ||
                               st.code() == sentencepiece::util::StatusCode::kPermissionDenied
                           ? UMT5_SPM_EIO : UMT5_SPM_EFORMAT;
            std::string msg = st.ToString();
            delete sp;
            return fail(code, err, errlen, msg);
        }
    } catch (const std::bad_alloc &) {
        delete sp;
        return fail(UMT5_SPM_ENOMEM, err, errlen, "out of memory");
    } catch (const std::exception &e) {
        delete sp;
        return fail(UMT5_SPM_EFORMAT, err, errlen, e.what());
    }
    *out = sp;
    return UMT5_SPM_OK;
}

extern "C" void umt5_spm_free(umt5_spm_t *sp)
{
    delete sp;
}

extern "C" int32_t umt5_spm_size(const umt5_spm_t *sp)
{
    return sp->proc.GetPieceSize();
}

extern "C" int32_t umt5_spm_eos(const umt5_spm_t *sp)
{
    return sp->proc.eos_id();
}

extern "C" int umt5_spm_encode(const umt5_spm_t *sp, const char *text, size_t len, int32_t **ids, size_t *n,
                               char *err, size_t errlen)
{
    try {
        std::vector<int> v;
        sentencepiece::util::Status st = sp->proc.Encode(absl::string_view(text, len), &v);
        if (!st.ok())
            return fail(UMT5_SPM_EFORMAT, err, errlen, st.ToString());
        int32_t *p = static_cast<int32_t *>(std::malloc((v.size() ? v.size() : 1) * sizeof(int32_t)));
        if (!p)
            return fail(UMT5_SPM_ENOMEM, err, errlen, "out of memory");
        for (size_t i = 0; i < v.size(); i++)
            p[i] = v[i];
        *ids = p;
        *n = v.size();
    } catch (const std::bad_alloc &) {
        return fail(UMT5_SPM_ENOMEM, err, errlen, "out of memory");
    } catch (const std::exception &e) {
        return fail(UMT5_SPM_EFORMAT, err, errlen, e.what());
    }
    return UMT5_SPM_OK;
}
