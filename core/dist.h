/* dist.h: several processes, one per GPU (issue 25), the parts that need no GPU: the rank of
 * this process from the launcher's environment, the TCP rendezvous at MASTER_ADDR:MASTER_PORT
 * that hands every rank rank 0's blob (the NCCL unique id), the control channel it leaves open
 * (barrier, broadcast, gather, abort); dist_shard.h has the deterministic share of a step's samples
 * each rank trains. Internal to the CLI (core/main.c) for now; doc/distributed.md is the user's side. */
#ifndef GHC_DIST_H
#define GHC_DIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <gh200core/core.h>   /* defines: ghc_core_t, ghc_error_set */

#define GHC_DIST_PORT     29500   /* MASTER_PORT when the environment gives none */
#define GHC_DIST_TIMEOUT  300.0   /* seconds the rendezvous waits (GHC_DIST_TIMEOUT overrides) */
#define GHC_DIST_BLOB     128     /* bytes rank 0 hands out: an ncclUniqueId */
#define GHC_DIST_GRACE_MS 5000    /* a rank gone: how long the others may take to stop on their own */

/* ---- ranks from the launcher's environment ---------------------------------------------- */

struct ghc_dist {
    int         rank, world, local_rank;
    char        addr[256];        /* rank 0's host; "" when world is 1 */
    int         port;
    const char *launcher;         /* "torchrun", "Open MPI", "Slurm" or "none" (static) */
    double      timeout;          /* seconds for the rendezvous */
};

/* This process's rank from `envp` (NULL-terminated "NAME=value" strings, as environ). First
 * found wins: RANK + WORLD_SIZE (torchrun, gh200core --nproc), OMPI_COMM_WORLD_RANK + _SIZE
 * (Open MPI), SLURM_PROCID + SLURM_NTASKS (Slurm); none: rank 0 of 1. Returns 0, or GHC_EINVAL
 * with one line naming the variable (not a number, rank >= world, no address for world > 1). */
int ghc_dist_from_env(ghc_core_t *core, const char *const *envp, struct ghc_dist *d);

/* The first host of a Slurm node list ("gpu[01-04,07],cpu3" -> "gpu01") into out (len bytes).
 * Returns 0, or -1 when the list is empty, malformed or the name does not fit. */
int ghc_dist_first_host(const char *nodelist, char *out, size_t len);

/* ---- the rendezvous and the control channel --------------------------------------------- */

typedef struct ghc_dist_comm ghc_dist_comm_t;

/* 64-bit FNV-1a of n bytes, the configuration's fingerprint. */
uint64_t ghc_dist_hash(const void *p, size_t n);
/* The fingerprint of the configuration in effect (as resolved.cfg would hold it). Returns 0 or
 * GHC_EIO. */
int ghc_dist_config_fingerprint(ghc_core_t *core, uint64_t *fp);

/* Meet the other ranks: rank 0 listens at d->addr:d->port and waits up to d->timeout seconds
 * for ranks 1..world-1; each of those connects (retrying until the timeout) and says its rank,
 * the world size and `fingerprint`. Rank 0 checks them (a wrong world size, a rank twice, another
 * fingerprint end the rendezvous on every rank) and sends each rank its blob[0..blob_len):
 * rank 0's blob is input, the others' output. On success *out is the control channel
 * (release with ghc_dist_comm_free). Returns 0, GHC_EINVAL (a mismatch: the message names the
 * rank and the value) or GHC_EIO (a rank that never came, naming it; rank 0 unreachable; rank
 * 0 gave up, with its reason). With world 1 it returns at once with a channel of one. */
int ghc_dist_rendezvous(ghc_core_t *core, const struct ghc_dist *d, uint64_t fingerprint, void *blob,
                        size_t blob_len, ghc_dist_comm_t **out);
/* Close the channel (the other ranks see it closed). NULL is a no-op. */
void ghc_dist_comm_free(ghc_dist_comm_t *c);

/* Collectives over the channel (every rank calls each, in the same order). A rank whose
 * connection closes (it died) or that aborts is reported on every rank: GHC_EIO naming it,
 * never a hang while the processes live or die. */
/* Wait for every rank. Returns 0 or GHC_EIO. */
int ghc_dist_barrier(ghc_dist_comm_t *c);
/* buf[0..len) of rank 0 to every rank. Returns 0 or GHC_EIO. */
int ghc_dist_broadcast(ghc_dist_comm_t *c, void *buf, size_t len);
/* Each rank's mine[0..len) to rank 0's all[r * len ...] (all: world * len bytes on rank 0,
 * ignored elsewhere). Returns 0 or GHC_EIO. */
int ghc_dist_gather(ghc_dist_comm_t *c, const void *mine, size_t len, void *all);
/* Tell the other ranks this one stops, with `reason` (their next collective fails with it). */
void ghc_dist_abort(ghc_dist_comm_t *c, const char *reason);
/* on: a thread watches the connections; when another rank's closes and this process has not
 * ended GHC_DIST_GRACE_MS later, it ends it (exit status 1, one line naming the rank): while
 * training, a rank may wait in a GPU collective that no message can interrupt. off: stop watching (before the ranks close their
 * channels at the end: a barrier, the watch off on every rank, another barrier). Returns 0 or
 * GHC_EIO. */
int ghc_dist_watch(ghc_dist_comm_t *c, bool on);

/* ---- NCCL (core/dist_nccl.c, built with --with-nccl: GHC_HAVE_NCCL) ------------------------- */

struct ghc_nccl;
/* Rank 0: a new NCCL unique id into blob[0..len) (GHC_DIST_BLOB is enough). Returns 0 or GHC_EIO. */
int  ghc_nccl_id(ghc_core_t *core, void *blob, size_t len);
/* A communicator-to-be from rank 0's id in blob (as the rendezvous handed it out). */
int  ghc_nccl_new(ghc_core_t *core, const void *blob, size_t len, struct ghc_nccl **out);
/* buf[0..count) f32 on CUDA device `device` summed over the ranks, queued on `stream`; the
 * first call makes the communicator there (every rank calls it together). Returns 0 or GHC_EIO. */
int  ghc_nccl_allreduce(ghc_core_t *core, struct ghc_nccl *n, int rank, int world, float *buf, int64_t count,
                        int device, void *stream);
void ghc_nccl_free(struct ghc_nccl *n);

#include "dist_shard.h"   /* the share of a step: ghc_dist_shard_step */

#endif /* GHC_DIST_H */
