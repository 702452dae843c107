#include "recycle.h"

#include <sched.h>
#include <string.h>
#include <time.h>

volatile uint64_t cc_recycle_max[CC_RECYCLE_DEVICES];
volatile uint32_t cc_recycle_len;

static cc_recycle_op log_ops[CC_RECYCLE_CAPACITY];
static volatile int log_lock;

/* The guarded ranges of all devices, grouped by device (guard_first[d] to guard_first[d] + guard_n[d]);
 * written by Go (cc_recycle_guard) and read by cc_recycle_free, both under the lock. */
static uint64_t guard_lo[CC_RECYCLE_GUARDS], guard_hi[CC_RECYCLE_GUARDS];
static int guard_first[CC_RECYCLE_DEVICES], guard_n[CC_RECYCLE_DEVICES];

/* A spin lock: the sections are a few dozen instructions and almost never contended (the C callers hold
 * the GIL; only Go's replay, from a thread that may not, competes). Yield after a while rather than burn
 * a core behind a preempted holder. */
static void
lock(void)
{
    for (int spins = 0; __atomic_exchange_n(&log_lock, 1, __ATOMIC_ACQUIRE); spins++) {
        if (spins > 64) {
            sched_yield();
        }
    }
}

static void
unlock(void)
{
    __atomic_store_n(&log_lock, 0, __ATOMIC_RELEASE);
}

/* The time of an op: CLOCK_MONOTONIC (read through the vDSO, tens of nanoseconds), exact enough that the
 * ops of a burst get distinct, increasing times for a plot of the flight record. */
static int64_t
op_time(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t
cc_recycle_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Whether a block of size may be logged for device now (checked again under the lock). */
static int
logging(int64_t device, uint64_t size)
{
    return device >= 0 && device < CC_RECYCLE_DEVICES && size <= __atomic_load_n(&cc_recycle_max[device], __ATOMIC_ACQUIRE);
}

int
cc_recycle_free(int64_t device, uint64_t ptr, uint64_t size, uint64_t stream)
{
    if (size == 0 || !logging(device, size)) {
        return 0;
    }
    int64_t t = op_time();
    lock();
    uint32_t n = cc_recycle_len;
    /* Checked again under the lock, which cc_recycle_set takes too: once Go has turned logging off, no
     * later op is logged. */
    if (n >= CC_RECYCLE_CAPACITY || size > cc_recycle_max[device]) {
        unlock();
        return 0;
    }
    for (int i = guard_first[device], end = i + guard_n[device]; i < end; i++) {
        if (ptr < guard_hi[i] && guard_lo[i] < ptr + size) { /* a live graph uses the block: Go frees it */
            unlock();
            return 0;
        }
    }
    log_ops[n] = (cc_recycle_op){.device = device, .ptr = ptr, .size = size, .stream = stream, .time = t, .kind = CC_RECYCLE_FREE};
    __atomic_store_n(&cc_recycle_len, n + 1, __ATOMIC_RELEASE);
    unlock();
    return 1;
}

uint64_t
cc_recycle_take(int64_t device, uint64_t size, uint64_t stream)
{
    if (size == 0 || !logging(device, size) || __atomic_load_n(&cc_recycle_len, __ATOMIC_ACQUIRE) == 0) {
        return 0;
    }
    int64_t t = op_time();
    lock();
    uint32_t n = cc_recycle_len;
    uint64_t ptr = 0;
    if (n < CC_RECYCLE_CAPACITY && size <= cc_recycle_max[device]) {
        for (uint32_t i = n; i-- > 0;) {
            cc_recycle_op *op = &log_ops[i];
            if (op->kind == CC_RECYCLE_FREE && op->device == device && op->size == size && op->stream == stream) {
                op->kind = CC_RECYCLE_CONSUMED;
                ptr = op->ptr;
                log_ops[n] = (cc_recycle_op){.device = device, .ptr = ptr, .size = size, .stream = stream, .time = t, .kind = CC_RECYCLE_TAKE};
                __atomic_store_n(&cc_recycle_len, n + 1, __ATOMIC_RELEASE);
                break;
            }
        }
    }
    unlock();
    return ptr;
}

int
cc_recycle_drain(cc_recycle_op *out)
{
    lock();
    uint32_t n = cc_recycle_len;
    memcpy(out, log_ops, n * sizeof *out);
    __atomic_store_n(&cc_recycle_len, 0, __ATOMIC_RELEASE);
    unlock();
    return (int)n;
}

void
cc_recycle_set(int64_t device, uint64_t max)
{
    if (device >= 0 && device < CC_RECYCLE_DEVICES) {
        lock();
        __atomic_store_n(&cc_recycle_max[device], max, __ATOMIC_RELEASE);
        unlock();
    }
}

int
cc_recycle_guard(int64_t device, const uint64_t *lo, const uint64_t *hi, int n)
{
    if (device < 0 || device >= CC_RECYCLE_DEVICES || n < 0) {
        return 0;
    }
    lock();
    /* Rebuild the table with device's ranges replaced: the others keep theirs, in device order. */
    static uint64_t new_lo[CC_RECYCLE_GUARDS], new_hi[CC_RECYCLE_GUARDS];
    int first[CC_RECYCLE_DEVICES], count[CC_RECYCLE_DEVICES], total = 0;
    for (int d = 0; d < CC_RECYCLE_DEVICES; d++) {
        int k = d == device ? n : guard_n[d];
        if (total + k > CC_RECYCLE_GUARDS) {
            unlock();
            return 0;
        }
        first[d] = total;
        count[d] = k;
        for (int i = 0; i < k; i++) {
            new_lo[total + i] = d == device ? lo[i] : guard_lo[guard_first[d] + i];
            new_hi[total + i] = d == device ? hi[i] : guard_hi[guard_first[d] + i];
        }
        total += k;
    }
    memcpy(guard_lo, new_lo, (size_t)total * sizeof *guard_lo);
    memcpy(guard_hi, new_hi, (size_t)total * sizeof *guard_hi);
    memcpy(guard_first, first, sizeof first);
    memcpy(guard_n, count, sizeof count);
    unlock();
    return 1;
}
