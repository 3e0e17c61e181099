/* telemetry.c: CUPTI's unified-memory counters for gh200_uvm (telemetry = true): GPU and CPU
 * page faults, bytes migrated each way, thrashing and throttling, counted per step. The order
 * of calls is the one found to work on CUDA 13: callbacks, driver up, configure, enable. One
 * collector per process (CUPTI's callbacks are global). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <cupti.h>

#include "uvm_impl.h"

#define TEL_BUF (1u << 20)

struct uvm_telemetry {
    ghc_core_t           *core;
    struct uvm_tel_counts last;
};

static pthread_mutex_t tel_lock = PTHREAD_MUTEX_INITIALIZER;
static struct uvm_tel_counts tel_acc;   /* filled by the completion callback */
static int tel_users;

static void CUPTIAPI tel_request(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, TEL_BUF);
    *size = *buffer ? TEL_BUF : 0;
    *max_records = 0;
}

static void CUPTIAPI tel_complete(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid)
{
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    pthread_mutex_lock(&tel_lock);
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER)
            continue;
        const CUpti_ActivityUnifiedMemoryCounter3 *um = (const void *)rec;
        switch (um->counterKind) {
        case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT: tel_acc.gpu_faults += um->value; break;
        case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_CPU_PAGE_FAULT_COUNT: tel_acc.cpu_faults++; break;  /* value is the PC */
        case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD: tel_acc.htod += um->value; break;
        case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOH: tel_acc.dtoh += um->value; break;
        case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_THRASHING:
        case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_THROTTLING: tel_acc.thrashing++; break;
        case CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_REMOTE_MAP: tel_acc.remote_map++; break;
        default: break;
        }
    }
    pthread_mutex_unlock(&tel_lock);
    free(buffer);
}

int uvm_telemetry_init(ghc_core_t *core, int device, struct uvm_telemetry **out)
{
    static const CUpti_ActivityUnifiedMemoryCounterKind kinds[] = {
        CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD,
        CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOH,
        CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_CPU_PAGE_FAULT_COUNT,
        CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT,
        CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_THRASHING,
        CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_THROTTLING,
        CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_REMOTE_MAP,
    };
    CUpti_ActivityUnifiedMemoryCounterConfig cfg[sizeof(kinds) / sizeof(kinds[0])];
    CUptiResult r;
    const char *what = "cuptiActivityRegisterCallbacks";
    pthread_mutex_lock(&tel_lock);
    bool first = tel_users++ == 0;
    pthread_mutex_unlock(&tel_lock);
    if (first) {
        int n;
        cudaGetDeviceCount(&n);   /* the driver must be up before configuring */
        for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
            cfg[i] = (CUpti_ActivityUnifiedMemoryCounterConfig){
                .scope = CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_SCOPE_PROCESS_SINGLE_DEVICE,
                .kind = kinds[i], .deviceId = (uint32_t)device, .enable = 1 };
        if ((r = cuptiActivityRegisterCallbacks(tel_request, tel_complete)) != CUPTI_SUCCESS ||
            (what = "cuptiActivityConfigureUnifiedMemoryCounter",
             r = cuptiActivityConfigureUnifiedMemoryCounter(cfg, (uint32_t)(sizeof(kinds) / sizeof(kinds[0])))) != CUPTI_SUCCESS ||
            (what = "cuptiActivityEnable", r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER)) != CUPTI_SUCCESS) {
            const char *msg = "?";
            cuptiGetResultString(r, &msg);
            pthread_mutex_lock(&tel_lock);
            tel_users--;
            pthread_mutex_unlock(&tel_lock);
            return ghc_error_set(core, GHC_EUNSUPPORTED, "gh200_uvm: telemetry: %s: %s (unified-memory counters are "
                                 "not available here; set telemetry = false)", what, msg);
        }
    }
    struct uvm_telemetry *t = calloc(1, sizeof(*t));
    if (!t)
        return ghc_error_set(core, GHC_ENOMEM, "gh200_uvm: out of memory");
    t->core = core;
    *out = t;
    return 0;
}

void uvm_telemetry_flush(struct uvm_telemetry *t, struct uvm_tel_counts *c)
{
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    pthread_mutex_lock(&tel_lock);
    *c = t->last = tel_acc;
    memset(&tel_acc, 0, sizeof(tel_acc));
    pthread_mutex_unlock(&tel_lock);
}

void uvm_telemetry_peek(struct uvm_telemetry *t, struct uvm_tel_counts *c)
{
    pthread_mutex_lock(&tel_lock);
    *c = t->last;
    pthread_mutex_unlock(&tel_lock);
}

void uvm_telemetry_free(struct uvm_telemetry *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&tel_lock);
    bool last = --tel_users == 0;
    pthread_mutex_unlock(&tel_lock);
    if (last) {
        cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
        cuptiActivityDisable(CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER);
    }
    free(t);
}
