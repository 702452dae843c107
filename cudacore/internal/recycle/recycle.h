/*
 * The recycle log: device blocks freed and taken again in C, without entering Go.
 *
 * The hot pair of the allocator (Buffer.close, then an allocation of the same size on the same stream)
 * is served here, without entering Go: the crossing into Go, not the allocator, is what that pair costs. C never owns
 * memory: it only logs. A close appends a FREE op instead of calling Go; an allocation that finds an
 * unconsumed FREE of its exact device, size and stream takes that block (the FREE is marked consumed and
 * a TAKE op appended). Go replays the log, in order, at the start of every call into it (the facade's
 * guard), so that Go's allocator, its statistics and its flight recorder see every free and allocation
 * before anything else happens, exactly as if the calls had entered Go one by one: an unconsumed FREE
 * becomes the real free, a consumed FREE and its TAKE become a free and an allocation of the same block
 * in the statistics and the recorder.
 *
 * Go decides when C may log, per device (cc_recycle_max): only while its allocator caches freed blocks
 * (a block it would have kept anyway, of a size it caches), nothing captures, no graph memory is on the books and no
 * allocation is tracked; and never a block that a live graph uses (cc_recycle_guard). The C caller adds its own conditions (an owned stream, no capture starting,
 * no stack labels); see cudacore/native/alloc.c.
 *
 * The log is bounded: when it is full, cc_recycle_free and cc_recycle_take answer 0 and the caller
 * enters Go, whose guard replays the log first. All functions are thread-safe (a spin lock held for a
 * few instructions); none calls Go.
 */
#ifndef CUDACORE_RECYCLE_H
#define CUDACORE_RECYCLE_H

#include <stdint.h>

#define CC_RECYCLE_CAPACITY 64 /* ops in the log */
#define CC_RECYCLE_DEVICES 64  /* devices C may log for; others always enter Go */

/* The kinds of ops. */
#define CC_RECYCLE_FREE 1     /* a free not (yet) followed by a take of its block: Go frees it */
#define CC_RECYCLE_CONSUMED 2 /* a free whose block a later TAKE in the same log reused */
#define CC_RECYCLE_TAKE 3     /* an allocation served by a CONSUMED free's block */

typedef struct {
    int64_t device;
    uint64_t ptr;
    uint64_t size;
    uint64_t stream;
    int64_t time; /* when C served it: CLOCK_MONOTONIC, in nanoseconds */
    uint32_t kind;
    uint32_t reserved;
} cc_recycle_op;

/* Per device, the largest block C may log while Go allows logging, else 0. Written by Go only. */
extern volatile uint64_t cc_recycle_max[CC_RECYCLE_DEVICES];
/* The number of ops in the log; Go reads it without the lock to skip an empty log. */
extern volatile uint32_t cc_recycle_len;

/* Log the free of a block; 1 if logged (the caller's free is done), 0 if the caller must free through Go
 * (logging is off for the device, the block is larger than it allows, or the log is full). */
int cc_recycle_free(int64_t device, uint64_t ptr, uint64_t size, uint64_t stream);

/* Take the newest logged, unconsumed free of exactly (device, size, stream): its address, or 0 if there
 * is none (or logging is off, or the log is full) and the caller must allocate through Go. */
uint64_t cc_recycle_take(int64_t device, uint64_t size, uint64_t stream);

/* Move the log's ops, oldest first, into out (room for CC_RECYCLE_CAPACITY ops) and empty it; returns
 * how many. For Go's replay. */
int cc_recycle_drain(cc_recycle_op *out);

/* CLOCK_MONOTONIC now, in nanoseconds: what Go converts the ops' times with. */
int64_t cc_recycle_now(void);

/* Allow logging for a device, of blocks up to max bytes, or stop it (max 0); out of range: ignored. For
 * Go. */
void cc_recycle_set(int64_t device, uint64_t max);

/* The guarded ranges: device memory that live graphs use. A free of a block that overlaps one is never
 * logged (the caller frees through Go, which keeps the block until those graphs are gone), so no
 * allocation can take a block a later launch may still write. */
#define CC_RECYCLE_GUARDS 1024 /* ranges in all; past it Go stops logging for the device instead */

/* Replace device's guarded ranges with the n ranges [lo[i], hi[i]); out of range or n beyond the room
 * left: ignored, and 0 returned (1 when set). For Go, which sets them before it allows logging. */
int cc_recycle_guard(int64_t device, const uint64_t *lo, const uint64_t *hi, int n);

#endif
