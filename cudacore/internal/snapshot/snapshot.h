/*
 * The snapshot: the facts the C fast path (cudacore/native) decides on, owned by Go and written by Go
 * alone (package cudacore/internal/snapshot). C reads them; neither C nor Python keeps a copy.
 *
 * Who writes what, and when:
 *   - devices[d]: when Go opens device d (process.GetDevice), before any Python object of the device
 *     exists, and its `blocking` again when the device's allocation strategy changes. `direct` is stored
 *     last with release order, so a reader that sees it set sees the fields it guards.
 *   - captures: the count of streams cudacore captures on (stream.Registry), changed under the
 *     registry's mutex when a capture is registered (before the driver begins it) and unregistered (after
 *     the driver ended it), so that no call takes the direct path while the driver may capture.
 *   - graph_memory_pending: the count of graph memory allocations that no launch has made real
 *     (stream.PendingGraphMemory), written under a mutex by the last writer with the latest count.
 *   - The recycle log's per-device bound (cc_recycle_max, recycle.h) is a fact of the same kind, kept
 *     beside its log.
 *
 * Readers hold the GIL but must not rely on it against Go, which writes without it: every read is an
 * atomic load (the cc_snapshot_* functions below).
 */
#ifndef CUDACORE_SNAPSHOT_H
#define CUDACORE_SNAPSHOT_H

#include <stdint.h>

#define CC_SNAPSHOT_DEVICES 64 /* devices with facts; calls for others always go through Go */

/* How the direct path reaches a device's driver. */
#define CC_DIRECT_OFF 0  /* every call goes through Go (not open, CUDACORE_DIRECT=0, or unreachable from C) */
#define CC_DIRECT_CUDA 1 /* the real driver, through the shim's entry point table */
#define CC_DIRECT_SIM 2  /* the simulator, through the SimDirect* doors */

typedef struct {
    int32_t direct;       /* CC_DIRECT_*; stored last (release) */
    int32_t blocking;     /* the device's allocator can block (the synchronous strategy): its doors drop the GIL */
    uint64_t ctx;         /* the device's context */
    uint64_t table;       /* the real driver's entry point table (libcuda.Driver.Table); 0 on the simulator */
    int64_t pageable_max; /* the largest pageable host-to-device asynchronous copy handed to the driver's own
                             copy (stream.Options.PageableDirectMax); negative: none */
} cc_device_facts;

typedef struct {
    int32_t captures;             /* streams cudacore captures on, every device */
    int32_t graph_memory_pending; /* graph memory allocations that no launch has made real */
    cc_device_facts devices[CC_SNAPSHOT_DEVICES];
} cc_snapshot_t;

extern cc_snapshot_t cc_snapshot;

/* Whether any stream of cudacore's captures (or is about to: see captures above). */
static inline int
cc_snapshot_capturing(void)
{
    return __atomic_load_n(&cc_snapshot.captures, __ATOMIC_SEQ_CST) != 0;
}

/* Whether graph memory that no launch made real exists: calls that name device memory go through Go. */
static inline int
cc_snapshot_graph_memory_pending(void)
{
    return __atomic_load_n(&cc_snapshot.graph_memory_pending, __ATOMIC_SEQ_CST) != 0;
}

/* Device ordinal's facts when its calls may take the direct path, else NULL. */
static inline const cc_device_facts *
cc_snapshot_direct(int64_t ordinal)
{
    if (ordinal < 0 || ordinal >= CC_SNAPSHOT_DEVICES ||
        __atomic_load_n(&cc_snapshot.devices[ordinal].direct, __ATOMIC_ACQUIRE) == CC_DIRECT_OFF) {
        return (const cc_device_facts *)0;
    }
    return &cc_snapshot.devices[ordinal];
}

/* Whether device ordinal's allocator can block. */
static inline int
cc_snapshot_blocking(int64_t ordinal)
{
    return ordinal >= 0 && ordinal < CC_SNAPSHOT_DEVICES &&
           __atomic_load_n(&cc_snapshot.devices[ordinal].blocking, __ATOMIC_SEQ_CST) != 0;
}

#endif
