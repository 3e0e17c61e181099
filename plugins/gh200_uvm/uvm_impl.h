/* uvm_impl.h: what the gh200_uvm plugin's files share: CUPTI unified-memory telemetry
 * (telemetry.c), the diagnostic probe (probe.c) and the host-memory reading. Never installed. */
#ifndef GHC_UVM_IMPL_H
#define GHC_UVM_IMPL_H

#include <gh200core/mempolicy.h>   /* defines: ghc_core_t, struct ghc_probe */

/* Host memory the kernel could give now (/proc/meminfo MemAvailable), 0 if unknown. */
uint64_t uvm_host_available(void);

/* ---- telemetry.c: CUPTI unified-memory counters ---- */

struct uvm_telemetry;
struct uvm_tel_counts {
    uint64_t gpu_faults, cpu_faults, htod, dtoh, thrashing, remote_map;
};
/* Register the buffers, configure the counters for `device` and enable them (after the
 * driver is initialised). Returns 0 or GHC_EUNSUPPORTED with the CUPTI error. */
int  uvm_telemetry_init(ghc_core_t *core, int device, struct uvm_telemetry **out);
/* Flush the records and move the counts since the last flush into *c (then zeroed). */
void uvm_telemetry_flush(struct uvm_telemetry *t, struct uvm_tel_counts *c);
/* The counts of the last flush, without flushing. */
void uvm_telemetry_peek(struct uvm_telemetry *t, struct uvm_tel_counts *c);
void uvm_telemetry_free(struct uvm_telemetry *t);   /* NULL is a no-op */

/* ---- probe.c: `gh200core diag` ---- */

int uvm_probe(ghc_core_t *core, const struct ghc_probe_opts *opts, struct ghc_probe *out);

#endif /* GHC_UVM_IMPL_H */
