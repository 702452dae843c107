/*
 * The direct path of the hot calls (direct.h). On the real driver the calls go to the shim of
 * pkg/cuda/libcuda (its cc_* functions, linked into this library with it) with the table of entry points
 * that Go loaded; on the simulator they go to the generated SimDirect* doors, which hand them to the
 * simulated driver unchecked.
 */
#include <stdlib.h>

#include "direct.h"
#include "door_gen.h"
#include "snapshot.h"

/* The shim's entry points (pkg/cuda/libcuda/shim.h), declared here with plain C types: CUresult is an
 * enum of non-negative values, CUdeviceptr an unsigned long long, the table an opaque pointer. Each makes
 * ctx current on the calling thread if it is not, then calls the driver; nonzero is a failure. */
extern unsigned int cc_graphLaunch(const void *t, uintptr_t ctx, uintptr_t exec, uintptr_t s);
extern unsigned int cc_memcpyHtoDAsync(const void *t, uintptr_t ctx, unsigned long long dst, const void *src, size_t n,
                                       uintptr_t s);
extern unsigned int cc_memcpyDtoHAsync(const void *t, uintptr_t ctx, void *dst, unsigned long long src, size_t n,
                                       uintptr_t s);
extern unsigned int cc_launchKernel(const void *t, uintptr_t ctx, uintptr_t fn, const unsigned int *grid,
                                    const unsigned int *block, unsigned int shared, uintptr_t s, void **params);
extern unsigned int cc_streamQuery(const void *t, uintptr_t ctx, uintptr_t s);
extern unsigned int cc_eventQuery(const void *t, uintptr_t ctx, uintptr_t e);

/* CUDA_ERROR_NOT_READY: what a query answers while work is pending. */
#define DIRECT_NOT_READY 600u

/* The shim's arguments from a device's facts. */
#define TABLE(d) ((const void *)(uintptr_t)(d)->table)
#define CTX(d) ((uintptr_t)(d)->ctx)

/* Device ordinal's facts when its calls may take the direct path (the snapshot Go publishes), else NULL. */
static const cc_device_facts *
device_of(int64_t device)
{
    return cc_snapshot_direct(device);
}

int
direct_enabled(int64_t device)
{
    return device_of(device) != NULL;
}

int
direct_pageable(int64_t device, size_t n)
{
    const cc_device_facts *d = device_of(device);
    return d != NULL && d->pageable_max >= 0 && (uint64_t)n <= (uint64_t)d->pageable_max;
}

/* A door's result: the wire error text, if any, is dropped (the full path reports the error itself). */
static int
door_done(char *err)
{
    if (err != NULL) {
        free(err);
        return 0;
    }
    return 1;
}

int
direct_graph_launch(int64_t device, uint64_t exec, uint64_t stream)
{
    const cc_device_facts *d = device_of(device);
    if (d == NULL || exec == 0) {
        return 0;
    }
    if (d->direct == CC_DIRECT_CUDA) {
        return cc_graphLaunch(TABLE(d), CTX(d), (uintptr_t)exec, (uintptr_t)stream) == 0;
    }
    int64_t ret;
    return door_done(cudacore_door_SimDirectGraphLaunch(device, (int64_t)exec, (int64_t)stream, &ret));
}

int
direct_copy_to_device(int64_t device, uint64_t dst, const void *src, size_t n, uint64_t stream)
{
    const cc_device_facts *d = device_of(device);
    if (d == NULL) {
        return 0;
    }
    if (d->direct == CC_DIRECT_CUDA) {
        return cc_memcpyHtoDAsync(TABLE(d), CTX(d), (unsigned long long)dst, src, n, (uintptr_t)stream) == 0;
    }
    int64_t ret;
    return door_done(cudacore_door_SimDirectCopyToDevice(device, (int64_t)dst, src, (int64_t)n, (int64_t)stream, &ret));
}

int
direct_copy_to_host(int64_t device, void *dst, uint64_t src, size_t n, uint64_t stream)
{
    const cc_device_facts *d = device_of(device);
    if (d == NULL) {
        return 0;
    }
    if (d->direct == CC_DIRECT_CUDA) {
        return cc_memcpyDtoHAsync(TABLE(d), CTX(d), dst, (unsigned long long)src, n, (uintptr_t)stream) == 0;
    }
    int64_t ret;
    return door_done(cudacore_door_SimDirectCopyToHost(device, dst, (int64_t)n, (int64_t)src, (int64_t)stream, &ret));
}

int
direct_launch(int64_t device, uint64_t fn, const unsigned int grid[3], const unsigned int block[3], unsigned int shared,
              uint64_t stream, void **params)
{
    const cc_device_facts *d = device_of(device);
    if (d == NULL || d->direct != CC_DIRECT_CUDA || fn == 0) {
        return 0;
    }
    return cc_launchKernel(TABLE(d), CTX(d), (uintptr_t)fn, grid, block, shared, (uintptr_t)stream, params) == 0;
}

/* A query of the stream or event handle h on device: the driver's entry (the shim's cc_streamQuery or
 * cc_eventQuery) or the simulator's door, with the answer as direct.h says. The shim's failure flags make
 * any result but success and NOT_READY a failure. */
static int
direct_query(int64_t device, uint64_t h, unsigned int (*cc)(const void *, uintptr_t, uintptr_t),
             char *(*sim)(int64_t, int64_t, int64_t *))
{
    const cc_device_facts *d = device_of(device);
    if (d == NULL || h == 0) {
        return -1;
    }
    if (d->direct == CC_DIRECT_CUDA) {
        unsigned int r = cc(TABLE(d), CTX(d), (uintptr_t)h);
        return r == 0 ? 1 : r == DIRECT_NOT_READY ? 0 : -1;
    }
    int64_t ret = 0;
    return door_done(sim(device, (int64_t)h, &ret)) ? (ret != 0) : -1;
}

int
direct_stream_query(int64_t device, uint64_t stream)
{
    return direct_query(device, stream, cc_streamQuery, cudacore_door_SimDirectStreamQuery);
}

int
direct_event_query(int64_t device, uint64_t event)
{
    return direct_query(device, event, cc_eventQuery, cudacore_door_SimDirectEventQuery);
}
