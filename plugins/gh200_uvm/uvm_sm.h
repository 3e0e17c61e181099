/* uvm_sm.h: the pure part of the gh200_uvm policy, free of CUDA so the CPU suite
 * (tests/test_mem.c) drives it with a simulated budget: the two-stage state machine with light
 * and hard reclamation, platform classification, the managed cap, role -> advice, and the
 * parsing of settings and their environment overrides (doc/memory.md, "gh200_uvm", says what
 * each does). Never installed; the plugin and the test link uvm_sm.c. */
#ifndef GHC_UVM_SM_H
#define GHC_UVM_SM_H

#include <stdbool.h>
#include <stdint.h>

#include <gh200core/mempolicy.h>   /* defines: enum ghc_mem_role, enum ghc_mem_platform */

/* ---- platform and cap ------------------------------------------------------------------------ */

/* The class of a device from its attributes, the first that is set in this order: integrated
 * (GB10), pageableMemoryAccessUsesHostPageTables (coherent: GH200), concurrentManagedAccess
 * (discrete); none of them: GHC_PLATFORM_NONE. */
enum ghc_mem_platform uvm_platform_classify(int integrated, int uses_host_page_tables, int concurrent_managed);

/* The most managed bytes the policy holds. Discrete: the device's free memory minus the
 * headroom (never oversubscribe); coherent: ratio x total HBM, at most the host's available
 * memory; integrated: ratio x total, at most host available minus the headroom. 0 when nothing
 * fits. *capped is set when the discrete rule lowered the ratio's budget. */
uint64_t uvm_cap(enum ghc_mem_platform p, uint64_t total, uint64_t free_bytes, uint64_t host_avail, double ratio,
                 uint64_t headroom, bool *capped);

/* ---- settings ----------------------------------------------------------------------------------- */

enum uvm_pattern { UVM_GPU_FIRST = 0, UVM_BALANCED, UVM_CPU_FIRST };

/* "gpu_first", "balanced", "cpu_first". Static. */
const char *uvm_pattern_name(enum uvm_pattern p);
/* Parse a pattern name; false when unknown. */
bool uvm_pattern_parse(const char *text, enum uvm_pattern *out);
/* Parse an oversubscription ratio (a number > 0 and <= 1000); false otherwise. */
bool uvm_ratio_parse(const char *text, double *out);

/* ---- advice ----------------------------------------------------------------------------------- */

enum uvm_advice { UVM_ADVICE_NONE = 0, UVM_ADVICE_GPU, UVM_ADVICE_HOST };

/* Where a managed block of `role` should prefer to live (accessed-by GPU goes with any
 * advice): latents and the inactive expert on the host; weights (the model's and an
 * encoder's), text embeddings and masks on the GPU while GPU-preferred bytes fit the device
 * budget (else none: let thrash protection act); optimizer state on the host in stage 1; the
 * rest (encoder activations too) by the access pattern. */
enum uvm_advice uvm_advice_for(enum ghc_mem_role role, enum uvm_pattern pattern, int stage, bool hints,
                               bool gpu_fits);

/* Which allocations the stage decides: WORKSPACE stays on the device; latents and the
 * inactive expert are always managed (with hints on, to be read where they live); the rest
 * follows the stage. */
enum uvm_kind { UVM_KIND_STAGE = 0, UVM_KIND_DEVICE, UVM_KIND_MANAGED };
enum uvm_kind uvm_kind_for(enum ghc_mem_role role, bool hints);

/* ---- the state machine ------------------------------------------------------------------------ */

struct uvm_sm_cfg {
    uint64_t total;          /* device memory (integrated: the budgeted host memory) */
    uint64_t t_in;           /* stage 0 -> 1 below this free memory: max(threshold x total, min) */
    uint64_t hysteresis;     /* back to stage 0 only at t_in + this */
    uint64_t managed_cap;    /* uvm_cap() */
    uint64_t headroom;       /* kept free on the device for contexts, libraries, slack */
    bool     discrete;       /* managed bytes must also fit the device's free memory */
};

/* What the machine calls to read and free memory: the plugin's CUDA calls, or a test's model. */
struct uvm_env {
    void     *user;
    uint64_t (*free_bytes)(void *user);   /* device memory free now */
    void     (*light)(void *user);        /* give back cached pool blocks, no synchronisation */
    void     (*hard)(void *user);         /* synchronise, trim to zero, evict cold managed ranges */
};

struct uvm_sm {
    struct uvm_sm_cfg cfg;
    int               stage;              /* 0 or 1 */
    uint64_t          managed;            /* live managed bytes */
    uint64_t          transitions, light, hard;
};

enum uvm_where { UVM_AT_DEVICE = 0, UVM_AT_MANAGED };
enum uvm_result { UVM_OK = 0, UVM_OOM_DEVICE = -1, UVM_OOM_CAP = -2 };

/* Stage thresholds from the settings: t_in = max(threshold x total, min(min_bytes, total / 2));
 * hysteresis = fraction x total. */
void uvm_sm_init(struct uvm_sm *sm, uint64_t total, double threshold, uint64_t min_bytes, double hysteresis,
                 uint64_t managed_cap, uint64_t headroom, bool discrete);

/* Decide where `bytes` of `kind` go: updates the stage from the free memory the request
 * would leave (stage 0 -> 1 below t_in after a light reclamation; 1 -> 0 at t_in +
 * hysteresis), checks the managed cap (a hard reclamation, then a second look) and counts
 * the managed bytes. Returns UVM_OK with *where, or UVM_OOM_* (nothing counted). */
enum uvm_result uvm_sm_place(struct uvm_sm *sm, const struct uvm_env *env, uint64_t bytes, enum uvm_kind kind,
                             enum uvm_where *where);
/* A device allocation the machine chose failed anyway (fragmentation, other allocators):
 * hard reclamation, then managed if the cap allows. Returns UVM_OK (*where managed or device
 * again after the reclamation) or UVM_OOM_*. */
enum uvm_result uvm_sm_device_failed(struct uvm_sm *sm, const struct uvm_env *env, uint64_t bytes, bool retried,
                                     enum uvm_where *where);
/* Managed bytes given back. */
void uvm_sm_release(struct uvm_sm *sm, uint64_t bytes);
/* After an explicit trim or cache release: re-evaluate the stage against `free_bytes`. */
void uvm_sm_reevaluate(struct uvm_sm *sm, uint64_t free_bytes);

#endif /* GHC_UVM_SM_H */
