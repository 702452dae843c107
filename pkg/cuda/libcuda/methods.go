package libcuda

/*
#include <stdlib.h>
#include <string.h>
#include "shim.h"
*/
import "C"

import (
	"unsafe"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// The methods below are the cuda.Driver interface; each names its entry point in errors (see fail). Handles
// cross as uintptr_t and are turned back into pointers in C, so no Go code ever holds a driver handle as a
// Go pointer (the garbage collector must not see them, and go vet would rightly object).

func cctx(c cuda.Context) C.uintptr_t   { return C.uintptr_t(c) }
func cstream(s cuda.Stream) C.uintptr_t { return C.uintptr_t(s) }

// Init calls cuInit(0). The driver makes repeated calls cheap, so Init is idempotent.
func (d *Driver) Init() error {
	if r := C.cc_init(d.tab); r != 0 {
		return d.fail(symInit, r)
	}
	return nil
}

// Version returns cuDriverGetVersion's value, 1000*major + 10*minor (13000 for CUDA 13.0).
func (d *Driver) Version() (int, error) {
	var v C.int
	if r := C.cc_driverGetVersion(d.tab, &v); r != 0 {
		return 0, d.fail(symDriverGetVersion, r)
	}
	return int(v), nil
}

// DeviceCount returns the number of devices the driver exposes (cuDeviceGetCount).
func (d *Driver) DeviceCount() (int, error) {
	var n C.int
	if r := C.cc_deviceGetCount(d.tab, &n); r != 0 {
		return 0, d.fail(symDeviceGetCount, r)
	}
	return int(n), nil
}

// DeviceGet returns the device with the given ordinal (cuDeviceGet).
func (d *Driver) DeviceGet(ordinal int) (cuda.Device, error) {
	var dev C.int
	if r := C.cc_deviceGet(d.tab, C.int(ordinal), &dev); r != 0 {
		return 0, d.fail(symDeviceGet, r)
	}
	return cuda.Device(dev), nil
}

// DeviceName returns the device's marketing name (cuDeviceGetName).
func (d *Driver) DeviceName(dev cuda.Device) (string, error) {
	var buf [256]C.char
	if r := C.cc_deviceGetName(d.tab, C.int(dev), &buf[0], C.int(len(buf))); r != 0 {
		return "", d.fail(symDeviceGetName, r)
	}
	buf[len(buf)-1] = 0 // the driver truncates without promising a terminator
	return C.GoString(&buf[0]), nil
}

// DeviceUUID returns the device's 16-byte UUID (cuDeviceGetUuid_v2, or cuDeviceGetUuid on drivers before
// CUDA 11.4, which report the parent GPU's UUID for a MIG instance).
func (d *Driver) DeviceUUID(dev cuda.Device) ([16]byte, error) {
	var u [16]C.uchar
	var out [16]byte
	if r := C.cc_deviceGetUuid(d.tab, C.int(dev), &u[0]); r != 0 {
		return out, d.fail(symDeviceGetUuid, r)
	}
	for i := range u {
		out[i] = byte(u[i])
	}
	return out, nil
}

// DevicePCIBusID returns the device's PCI address, "domain:bus:device.function" (cuDeviceGetPCIBusId).
func (d *Driver) DevicePCIBusID(dev cuda.Device) (string, error) {
	var buf [64]C.char
	if r := C.cc_deviceGetPCIBusId(d.tab, C.int(dev), &buf[0], C.int(len(buf))); r != 0 {
		return "", d.fail(symDeviceGetPCIBusId, r)
	}
	buf[len(buf)-1] = 0
	return C.GoString(&buf[0]), nil
}

// DeviceAttribute returns one attribute of dev (cuDeviceGetAttribute).
func (d *Driver) DeviceAttribute(dev cuda.Device, a cuda.DeviceAttribute) (int, error) {
	var v C.int
	if r := C.cc_deviceGetAttribute(d.tab, C.int(dev), C.int(a), &v); r != 0 {
		return 0, d.fail(symDeviceGetAttribute, r)
	}
	return int(v), nil
}

// DeviceTotalMem returns the device's memory in bytes (cuDeviceTotalMem_v2).
func (d *Driver) DeviceTotalMem(dev cuda.Device) (uint64, error) {
	var n C.ulonglong
	if r := C.cc_deviceTotalMem(d.tab, C.int(dev), &n); r != 0 {
		return 0, d.fail(symDeviceTotalMem, r)
	}
	return uint64(n), nil
}

// DeviceDefaultMemPool returns the device's default memory pool (cuDeviceGetDefaultMemPool). The driver
// owns it: never destroy it.
func (d *Driver) DeviceDefaultMemPool(dev cuda.Device) (cuda.MemPool, error) {
	var p C.uintptr_t
	if r := C.cc_deviceGetDefaultMemPool(d.tab, C.int(dev), &p); r != 0 {
		return 0, d.fail(symDeviceGetDefaultMemPool, r)
	}
	return cuda.MemPool(p), nil
}

// DeviceGetMemPool returns the device's current memory pool (cuDeviceGetMemPool).
func (d *Driver) DeviceGetMemPool(dev cuda.Device) (cuda.MemPool, error) {
	var p C.uintptr_t
	if r := C.cc_deviceGetMemPool(d.tab, C.int(dev), &p); r != 0 {
		return 0, d.fail(symDeviceGetMemPool, r)
	}
	return cuda.MemPool(p), nil
}

// DeviceSetMemPool makes pool the device's current memory pool (cuDeviceSetMemPool).
func (d *Driver) DeviceSetMemPool(dev cuda.Device, pool cuda.MemPool) error {
	if r := C.cc_deviceSetMemPool(d.tab, C.int(dev), C.uintptr_t(pool)); r != 0 {
		return d.fail(symDeviceSetMemPool, r)
	}
	return nil
}

// PrimaryCtxRetain retains dev's primary context and returns it (cuDevicePrimaryCtxRetain). Each
// successful call must be balanced by one PrimaryCtxRelease. It does not make the context current: the
// methods that take it do that themselves.
func (d *Driver) PrimaryCtxRetain(dev cuda.Device) (cuda.Context, error) {
	var c C.uintptr_t
	if r := C.cc_primaryCtxRetain(d.tab, C.int(dev), &c); r != 0 {
		return 0, d.fail(symDevicePrimaryCtxRetain, r)
	}
	return cuda.Context(c), nil
}

// PrimaryCtxRelease releases one reference to dev's primary context (cuDevicePrimaryCtxRelease_v2); the
// last release destroys it and everything allocated in it.
func (d *Driver) PrimaryCtxRelease(dev cuda.Device) error {
	if r := C.cc_primaryCtxRelease(d.tab, C.int(dev)); r != 0 {
		return d.fail(symDevicePrimaryCtxRelease, r)
	}
	return nil
}

// CtxSynchronize waits for all work in ctx (cuCtxSynchronize). It can block for as long as the work takes.
func (d *Driver) CtxSynchronize(ctx cuda.Context) error {
	if r := C.cc_ctxSynchronize(d.tab, cctx(ctx)); r != 0 {
		return d.fail(symCtxSynchronize, r)
	}
	return nil
}

// CtxSetLimit sets a limit of ctx (cuCtxSetLimit). The driver may clamp the value silently (the malloc
// heap does): read it back with CtxGetLimit to learn what was set.
func (d *Driver) CtxSetLimit(ctx cuda.Context, l cuda.Limit, v uint64) error {
	if r := C.cc_ctxSetLimit(d.tab, cctx(ctx), C.int(l), C.ulonglong(v)); r != 0 {
		return d.fail(symCtxSetLimit, r)
	}
	return nil
}

// CtxGetLimit returns a limit of ctx (cuCtxGetLimit).
func (d *Driver) CtxGetLimit(ctx cuda.Context, l cuda.Limit) (uint64, error) {
	var v C.ulonglong
	if r := C.cc_ctxGetLimit(d.tab, cctx(ctx), C.int(l), &v); r != 0 {
		return 0, d.fail(symCtxGetLimit, r)
	}
	return uint64(v), nil
}

// MemGetInfo returns the free and total memory of ctx's device in bytes (cuMemGetInfo_v2).
func (d *Driver) MemGetInfo(ctx cuda.Context) (free, total uint64, err error) {
	var f, t C.ulonglong
	if r := C.cc_memGetInfo(d.tab, cctx(ctx), &f, &t); r != 0 {
		return 0, 0, d.fail(symMemGetInfo, r)
	}
	return uint64(f), uint64(t), nil
}

// MemAlloc allocates n bytes of device memory (cuMemAlloc_v2); free it with MemFree. It synchronizes with
// the device and costs tens of microseconds: the pools (MemAllocAsync) are the fast path.
func (d *Driver) MemAlloc(ctx cuda.Context, n uint64) (cuda.DevicePtr, error) {
	var p C.CUdeviceptr
	if r := C.cc_memAlloc(d.tab, cctx(ctx), C.ulonglong(n), &p); r != 0 {
		return 0, d.fail(symMemAlloc, r)
	}
	return cuda.DevicePtr(p), nil
}

// MemFree frees memory from MemAlloc or MemAllocManaged (cuMemFree_v2).
func (d *Driver) MemFree(ctx cuda.Context, p cuda.DevicePtr) error {
	if r := C.cc_memFree(d.tab, cctx(ctx), C.CUdeviceptr(p)); r != 0 {
		return d.fail(symMemFree, r)
	}
	return nil
}

// MemPrefetchAsync migrates managed memory [p, p+n) to device dst (cuda.CPU: the host), ordered on s
// (cuMemPrefetchAsync).
func (d *Driver) MemPrefetchAsync(ctx cuda.Context, p cuda.DevicePtr, n uint64, dst int, s cuda.Stream) error {
	if err := d.need(symMemPrefetchAsync); err != nil {
		return err
	}
	if r := C.cc_memPrefetchAsync(d.tab, cctx(ctx), C.CUdeviceptr(p), C.ulonglong(n), C.int(dst), C.uintptr_t(s)); r != 0 {
		return d.fail(symMemPrefetchAsync, r)
	}
	return nil
}

// MemAdvise gives the driver a hint about managed memory [p, p+n) for device dev (cuda.CPU: the host)
// (cuMemAdvise).
func (d *Driver) MemAdvise(ctx cuda.Context, p cuda.DevicePtr, n uint64, advice cuda.MemAdvice, dev int) error {
	if err := d.need(symMemAdvise); err != nil {
		return err
	}
	if r := C.cc_memAdvise(d.tab, cctx(ctx), C.CUdeviceptr(p), C.ulonglong(n), C.int(advice), C.int(dev)); r != 0 {
		return d.fail(symMemAdvise, r)
	}
	return nil
}

// MemAllocManaged allocates n bytes of managed memory (cuMemAllocManaged); free it with MemFree.
func (d *Driver) MemAllocManaged(ctx cuda.Context, n uint64, flags uint32) (cuda.DevicePtr, error) {
	var p C.CUdeviceptr
	if r := C.cc_memAllocManaged(d.tab, cctx(ctx), C.ulonglong(n), C.uint(flags), &p); r != 0 {
		return 0, d.fail(symMemAllocManaged, r)
	}
	return cuda.DevicePtr(p), nil
}

// MemAllocAsync allocates n bytes from the device's current pool, ordered on s (cuMemAllocAsync); free it
// with MemFreeAsync. This is a hot path: one cgo call and no Go allocation unless it fails.
func (d *Driver) MemAllocAsync(ctx cuda.Context, n uint64, s cuda.Stream) (cuda.DevicePtr, error) {
	var p C.CUdeviceptr
	if r := C.cc_memAllocAsync(d.tab, cctx(ctx), C.ulonglong(n), cstream(s), &p); r != 0 {
		return 0, d.fail(symMemAllocAsync, r)
	}
	return cuda.DevicePtr(p), nil
}

// MemAllocFromPoolAsync allocates n bytes from pool, ordered on s (cuMemAllocFromPoolAsync). Hot path, as
// MemAllocAsync.
func (d *Driver) MemAllocFromPoolAsync(ctx cuda.Context, n uint64, pool cuda.MemPool, s cuda.Stream) (cuda.DevicePtr, error) {
	var p C.CUdeviceptr
	if r := C.cc_memAllocFromPoolAsync(d.tab, cctx(ctx), C.ulonglong(n), C.uintptr_t(pool), cstream(s), &p); r != 0 {
		return 0, d.fail(symMemAllocFromPoolAsync, r)
	}
	return cuda.DevicePtr(p), nil
}

// MemFreeAsync returns p to its pool once s reaches this point (cuMemFreeAsync). Hot path, as
// MemAllocAsync.
func (d *Driver) MemFreeAsync(ctx cuda.Context, p cuda.DevicePtr, s cuda.Stream) error {
	if r := C.cc_memFreeAsync(d.tab, cctx(ctx), C.CUdeviceptr(p), cstream(s)); r != 0 {
		return d.fail(symMemFreeAsync, r)
	}
	return nil
}

// MemPoolCreate creates a pool of pinned device memory with props (cuMemPoolCreate); the caller owns it
// and destroys it with MemPoolDestroy. A MaxSize on a driver older than CUDA 12.2, whose CUmemPoolProps
// has no such field, is refused with ErrorNotSupported before the driver is called.
func (d *Driver) MemPoolCreate(ctx cuda.Context, props cuda.PoolProps) (cuda.MemPool, error) {
	if props.MaxSize != 0 {
		v, err := d.Version()
		if err != nil {
			return 0, err
		}
		if v < cuda.PoolMaxSizeVersion {
			return 0, cuda.MaxSizeUnsupported(d.op(symMemPoolCreate), v)
		}
	}
	var p C.uintptr_t
	if r := C.cc_memPoolCreate(d.tab, cctx(ctx), C.int(props.Device), C.int(props.HandleTypes),
		C.ulonglong(props.MaxSize), &p); r != 0 {
		return 0, d.fail(symMemPoolCreate, r)
	}
	return cuda.MemPool(p), nil
}

// MemPoolDestroy destroys a pool from MemPoolCreate (cuMemPoolDestroy).
func (d *Driver) MemPoolDestroy(ctx cuda.Context, p cuda.MemPool) error {
	if r := C.cc_memPoolDestroy(d.tab, cctx(ctx), C.uintptr_t(p)); r != 0 {
		return d.fail(symMemPoolDestroy, r)
	}
	return nil
}

// MemPoolSetAttribute sets a 64-bit attribute of a pool (cuMemPoolSetAttribute).
func (d *Driver) MemPoolSetAttribute(ctx cuda.Context, p cuda.MemPool, a cuda.MemPoolAttribute, v uint64) error {
	if r := C.cc_memPoolSetAttribute(d.tab, cctx(ctx), C.uintptr_t(p), C.int(a), C.ulonglong(v)); r != 0 {
		return d.fail(symMemPoolSetAttribute, r)
	}
	return nil
}

// MemPoolGetAttribute returns a 64-bit attribute of a pool (cuMemPoolGetAttribute).
func (d *Driver) MemPoolGetAttribute(ctx cuda.Context, p cuda.MemPool, a cuda.MemPoolAttribute) (uint64, error) {
	var v C.ulonglong
	if r := C.cc_memPoolGetAttribute(d.tab, cctx(ctx), C.uintptr_t(p), C.int(a), &v); r != 0 {
		return 0, d.fail(symMemPoolGetAttribute, r)
	}
	return uint64(v), nil
}

// MemPoolTrimTo releases the pool's unused memory down to keep bytes (cuMemPoolTrimTo).
func (d *Driver) MemPoolTrimTo(ctx cuda.Context, p cuda.MemPool, keep uint64) error {
	if r := C.cc_memPoolTrimTo(d.tab, cctx(ctx), C.uintptr_t(p), C.ulonglong(keep)); r != 0 {
		return d.fail(symMemPoolTrimTo, r)
	}
	return nil
}

// MemHostAlloc returns n bytes of pinned host memory (cuMemHostAlloc) as a slice over driver-owned C
// memory. The Go garbage collector never frees it: the caller must pass the same slice (or one starting at
// the same address) to MemFreeHost, and must not use it afterwards. n == 0 returns an empty slice and no
// error without calling the driver.
func (d *Driver) MemHostAlloc(ctx cuda.Context, n uint64, flags uint32) ([]byte, error) {
	if n == 0 {
		return []byte{}, nil
	}
	var p unsafe.Pointer
	if r := C.cc_memHostAlloc(d.tab, cctx(ctx), C.ulonglong(n), C.uint(flags), &p); r != 0 {
		return nil, d.fail(symMemHostAlloc, r)
	}
	return unsafe.Slice((*byte)(p), n), nil
}

// MemFreeHost frees memory from MemHostAlloc (cuMemFreeHost), found by the slice's base address. An empty
// slice with no backing array (such as MemHostAlloc's for n == 0) is a no-op.
func (d *Driver) MemFreeHost(ctx cuda.Context, b []byte) error {
	if cap(b) == 0 {
		return nil
	}
	if r := C.cc_memFreeHost(d.tab, cctx(ctx), unsafe.Pointer(unsafe.SliceData(b))); r != 0 {
		return d.fail(symMemFreeHost, r)
	}
	return nil
}

// MemcpyHtoD copies len(src) bytes from host to device (cuMemcpyHtoD_v2). It returns once the source may
// be reused. An empty src copies nothing and returns nil.
func (d *Driver) MemcpyHtoD(ctx cuda.Context, dst cuda.DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	if r := C.cc_memcpyHtoD(d.tab, cctx(ctx), C.CUdeviceptr(dst), unsafe.Pointer(&src[0]), C.size_t(len(src))); r != 0 {
		return d.fail(symMemcpyHtoD, r)
	}
	return nil
}

// MemcpyDtoH copies len(dst) bytes from device to host (cuMemcpyDtoH_v2). An empty dst copies nothing.
func (d *Driver) MemcpyDtoH(ctx cuda.Context, dst []byte, src cuda.DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	if r := C.cc_memcpyDtoH(d.tab, cctx(ctx), unsafe.Pointer(&dst[0]), C.CUdeviceptr(src), C.size_t(len(dst))); r != 0 {
		return d.fail(symMemcpyDtoH, r)
	}
	return nil
}

// MemcpyDtoD copies n bytes between device buffers (cuMemcpyDtoD_v2).
func (d *Driver) MemcpyDtoD(ctx cuda.Context, dst, src cuda.DevicePtr, n uint64) error {
	if r := C.cc_memcpyDtoD(d.tab, cctx(ctx), C.CUdeviceptr(dst), C.CUdeviceptr(src), C.ulonglong(n)); r != 0 {
		return d.fail(symMemcpyDtoD, r)
	}
	return nil
}

// MemcpyHtoDAsync copies len(src) bytes host to device, ordered on s (cuMemcpyHtoDAsync_v2). Only pinned
// src (from MemHostAlloc) is truly asynchronous, and then the caller must keep it unchanged until s passes
// the copy; the driver stages Go (pageable) memory before returning. An empty src copies nothing.
func (d *Driver) MemcpyHtoDAsync(ctx cuda.Context, dst cuda.DevicePtr, src []byte, s cuda.Stream) error {
	if len(src) == 0 {
		return nil
	}
	if r := C.cc_memcpyHtoDAsync(d.tab, cctx(ctx), C.CUdeviceptr(dst), unsafe.Pointer(&src[0]), C.size_t(len(src)), cstream(s)); r != 0 {
		return d.fail(symMemcpyHtoDAsync, r)
	}
	return nil
}

// MemcpyDtoHAsync copies len(dst) bytes device to host, ordered on s (cuMemcpyDtoHAsync_v2). With pinned
// dst the data is there only once s passes the copy; with pageable dst the driver returns after the copy.
// An empty dst copies nothing.
func (d *Driver) MemcpyDtoHAsync(ctx cuda.Context, dst []byte, src cuda.DevicePtr, s cuda.Stream) error {
	if len(dst) == 0 {
		return nil
	}
	if r := C.cc_memcpyDtoHAsync(d.tab, cctx(ctx), unsafe.Pointer(&dst[0]), C.CUdeviceptr(src), C.size_t(len(dst)), cstream(s)); r != 0 {
		return d.fail(symMemcpyDtoHAsync, r)
	}
	return nil
}

// MemcpyDtoDAsync copies n bytes between device buffers, ordered on s (cuMemcpyDtoDAsync_v2).
func (d *Driver) MemcpyDtoDAsync(ctx cuda.Context, dst, src cuda.DevicePtr, n uint64, s cuda.Stream) error {
	if r := C.cc_memcpyDtoDAsync(d.tab, cctx(ctx), C.CUdeviceptr(dst), C.CUdeviceptr(src), C.ulonglong(n), cstream(s)); r != 0 {
		return d.fail(symMemcpyDtoDAsync, r)
	}
	return nil
}

// MemsetD8Async sets n bytes at dst to v, ordered on s (cuMemsetD8Async).
func (d *Driver) MemsetD8Async(ctx cuda.Context, dst cuda.DevicePtr, v uint8, n uint64, s cuda.Stream) error {
	if r := C.cc_memsetD8Async(d.tab, cctx(ctx), C.CUdeviceptr(dst), C.uchar(v), C.ulonglong(n), cstream(s)); r != 0 {
		return d.fail(symMemsetD8Async, r)
	}
	return nil
}

// StreamCreate creates a stream with the given flags and priority (cuStreamCreateWithPriority); the caller
// owns it and destroys it with StreamDestroy.
func (d *Driver) StreamCreate(ctx cuda.Context, flags uint32, priority int) (cuda.Stream, error) {
	var s C.uintptr_t
	if r := C.cc_streamCreate(d.tab, cctx(ctx), C.uint(flags), C.int(priority), &s); r != 0 {
		return 0, d.fail(symStreamCreateWithPriority, r)
	}
	return cuda.Stream(s), nil
}

// StreamDestroy destroys a stream from StreamCreate (cuStreamDestroy_v2); work already queued still runs.
func (d *Driver) StreamDestroy(ctx cuda.Context, s cuda.Stream) error {
	if r := C.cc_streamDestroy(d.tab, cctx(ctx), cstream(s)); r != 0 {
		return d.fail(symStreamDestroy, r)
	}
	return nil
}

// StreamSynchronize waits until s has finished its work (cuStreamSynchronize).
// DrainPerThreadAtExit makes the calling OS thread, when it exits, synchronize its per-thread default
// stream in ctx before the driver destroys that stream (see cc_drainPerThreadAtExit in shim.c: why, and
// how). It is cheap to call again; false when it could not be arranged (more than 16 contexts on one
// thread).
func (d *Driver) DrainPerThreadAtExit(ctx cuda.Context) bool {
	return C.cc_drainPerThreadAtExit(d.tab, cctx(ctx)) == 0
}

func (d *Driver) StreamSynchronize(ctx cuda.Context, s cuda.Stream) error {
	if r := C.cc_streamSynchronize(d.tab, cctx(ctx), cstream(s)); r != 0 {
		return d.fail(symStreamSynchronize, r)
	}
	return nil
}

// StreamQuery returns nil when s has finished its work, and an error matching cuda.ErrNotReady while it has
// not (cuStreamQuery).
func (d *Driver) StreamQuery(ctx cuda.Context, s cuda.Stream) error {
	if r := C.cc_streamQuery(d.tab, cctx(ctx), cstream(s)); r != 0 {
		return d.fail(symStreamQuery, r)
	}
	return nil
}

// StreamWaitEvent makes later work on s wait for e (cuStreamWaitEvent, flags 0).
func (d *Driver) StreamWaitEvent(ctx cuda.Context, s cuda.Stream, e cuda.Event) error {
	if r := C.cc_streamWaitEvent(d.tab, cctx(ctx), cstream(s), C.uintptr_t(e)); r != 0 {
		return d.fail(symStreamWaitEvent, r)
	}
	return nil
}

// StreamBeginCapture starts capturing s into a graph (cuStreamBeginCapture_v2).
func (d *Driver) StreamBeginCapture(ctx cuda.Context, s cuda.Stream, mode cuda.CaptureMode) error {
	if r := C.cc_streamBeginCapture(d.tab, cctx(ctx), cstream(s), C.int(mode)); r != 0 {
		return d.fail(symStreamBeginCapture, r)
	}
	return nil
}

// StreamEndCapture ends the capture on s and returns the graph, which the caller owns (GraphDestroy). An
// invalidated capture returns CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and no graph; the stream is usable
// again afterwards (cuStreamEndCapture).
func (d *Driver) StreamEndCapture(ctx cuda.Context, s cuda.Stream) (cuda.Graph, error) {
	var g C.uintptr_t
	if r := C.cc_streamEndCapture(d.tab, cctx(ctx), cstream(s), &g); r != 0 {
		return 0, d.fail(symStreamEndCapture, r)
	}
	return cuda.Graph(g), nil
}

// StreamIsCapturing returns the capture status of s (cuStreamIsCapturing).
func (d *Driver) StreamIsCapturing(ctx cuda.Context, s cuda.Stream) (cuda.CaptureStatus, error) {
	var st C.int
	if r := C.cc_streamIsCapturing(d.tab, cctx(ctx), cstream(s), &st); r != 0 {
		return 0, d.fail(symStreamIsCapturing, r)
	}
	return cuda.CaptureStatus(st), nil
}

// CtxStreamPriorityRange returns the least and greatest stream priorities (cuCtxGetStreamPriorityRange);
// greatest is numerically the smaller.
func (d *Driver) CtxStreamPriorityRange(ctx cuda.Context) (least, greatest int, err error) {
	var l, g C.int
	if r := C.cc_ctxGetStreamPriorityRange(d.tab, cctx(ctx), &l, &g); r != 0 {
		return 0, 0, d.fail(symCtxGetStreamPriorityRange, r)
	}
	return int(l), int(g), nil
}

// EventCreate creates an event (cuEventCreate); the caller owns it and destroys it with EventDestroy.
func (d *Driver) EventCreate(ctx cuda.Context, flags uint32) (cuda.Event, error) {
	var e C.uintptr_t
	if r := C.cc_eventCreate(d.tab, cctx(ctx), C.uint(flags), &e); r != 0 {
		return 0, d.fail(symEventCreate, r)
	}
	return cuda.Event(e), nil
}

// EventDestroy destroys an event (cuEventDestroy_v2).
func (d *Driver) EventDestroy(ctx cuda.Context, e cuda.Event) error {
	if r := C.cc_eventDestroy(d.tab, cctx(ctx), C.uintptr_t(e)); r != 0 {
		return d.fail(symEventDestroy, r)
	}
	return nil
}

// EventRecord records e on s (cuEventRecord).
func (d *Driver) EventRecord(ctx cuda.Context, e cuda.Event, s cuda.Stream) error {
	if r := C.cc_eventRecord(d.tab, cctx(ctx), C.uintptr_t(e), cstream(s)); r != 0 {
		return d.fail(symEventRecord, r)
	}
	return nil
}

// EventQuery returns nil once e has completed, and an error matching cuda.ErrNotReady before (cuEventQuery).
func (d *Driver) EventQuery(ctx cuda.Context, e cuda.Event) error {
	if r := C.cc_eventQuery(d.tab, cctx(ctx), C.uintptr_t(e)); r != 0 {
		return d.fail(symEventQuery, r)
	}
	return nil
}

// EventSynchronize waits for e to complete (cuEventSynchronize).
func (d *Driver) EventSynchronize(ctx cuda.Context, e cuda.Event) error {
	if r := C.cc_eventSynchronize(d.tab, cctx(ctx), C.uintptr_t(e)); r != 0 {
		return d.fail(symEventSynchronize, r)
	}
	return nil
}

// EventElapsedTime returns the milliseconds between two completed events (cuEventElapsedTime_v2, or
// cuEventElapsedTime on drivers before CUDA 12.8).
func (d *Driver) EventElapsedTime(ctx cuda.Context, start, end cuda.Event) (float32, error) {
	var ms C.float
	if r := C.cc_eventElapsedTime(d.tab, cctx(ctx), C.uintptr_t(start), C.uintptr_t(end), &ms); r != 0 {
		return 0, d.fail(symEventElapsedTime, r)
	}
	return float32(ms), nil
}

// GraphInstantiate instantiates g with flags 0 (cuGraphInstantiateWithFlags); the caller owns the
// executable graph (GraphExecDestroy). On a driver before CUDA 11.4 it returns ErrorNotSupported.
func (d *Driver) GraphInstantiate(ctx cuda.Context, g cuda.Graph) (cuda.GraphExec, error) {
	if err := d.need(symGraphInstantiateWithFlags); err != nil {
		return 0, err
	}
	var x C.uintptr_t
	if r := C.cc_graphInstantiate(d.tab, cctx(ctx), C.uintptr_t(g), &x); r != 0 {
		return 0, d.fail(symGraphInstantiateWithFlags, r)
	}
	return cuda.GraphExec(x), nil
}

// GraphUpload uploads x to the device ahead of its first launch, ordered on s (cuGraphUpload).
func (d *Driver) GraphUpload(ctx cuda.Context, x cuda.GraphExec, s cuda.Stream) error {
	if r := C.cc_graphUpload(d.tab, cctx(ctx), C.uintptr_t(x), cstream(s)); r != 0 {
		return d.fail(symGraphUpload, r)
	}
	return nil
}

// GraphLaunch launches x on s (cuGraphLaunch).
func (d *Driver) GraphLaunch(ctx cuda.Context, x cuda.GraphExec, s cuda.Stream) error {
	if r := C.cc_graphLaunch(d.tab, cctx(ctx), C.uintptr_t(x), cstream(s)); r != 0 {
		return d.fail(symGraphLaunch, r)
	}
	return nil
}

// GraphExecUpdate updates x in place to match g (cuGraphExecUpdate_v2). When the driver refuses the update,
// the error carries the driver's CUgraphExecUpdateResult as the field update_result. On a driver before
// CUDA 12.0 it returns ErrorNotSupported.
func (d *Driver) GraphExecUpdate(ctx cuda.Context, x cuda.GraphExec, g cuda.Graph) error {
	if err := d.need(symGraphExecUpdate); err != nil {
		return err
	}
	var res C.int
	if r := C.cc_graphExecUpdate(d.tab, cctx(ctx), C.uintptr_t(x), C.uintptr_t(g), &res); r != 0 {
		err := d.fail(symGraphExecUpdate, r)
		if e, ok := err.(*cuda.Error); ok && r&C.CC_FAIL_MASK == 0 {
			e.Fields = append(e.Fields, cuda.Field{Key: "update_result", Value: itoa(int(res))})
		}
		return err
	}
	return nil
}

// GraphExecDestroy destroys an executable graph (cuGraphExecDestroy).
func (d *Driver) GraphExecDestroy(ctx cuda.Context, x cuda.GraphExec) error {
	if r := C.cc_graphExecDestroy(d.tab, cctx(ctx), C.uintptr_t(x)); r != 0 {
		return d.fail(symGraphExecDestroy, r)
	}
	return nil
}

// GraphDestroy destroys a graph (cuGraphDestroy).
func (d *Driver) GraphDestroy(ctx cuda.Context, g cuda.Graph) error {
	if r := C.cc_graphDestroy(d.tab, cctx(ctx), C.uintptr_t(g)); r != 0 {
		return d.fail(symGraphDestroy, r)
	}
	return nil
}

// DeviceGraphMemTrim gives the device's graph memory that no graph holds now back to the system
// (cuDeviceGraphMemTrim): the driver keeps it after graph allocations are freed, for later launches.
func (d *Driver) DeviceGraphMemTrim(ctx cuda.Context, dev cuda.Device) error {
	if err := d.need(symDeviceGraphMemTrim); err != nil {
		return err
	}
	if r := C.cc_deviceGraphMemTrim(d.tab, cctx(ctx), C.int(dev)); r != 0 {
		return d.fail(symDeviceGraphMemTrim, r)
	}
	return nil
}

// GraphNodeCount returns the number of nodes in g (cuGraphGetNodes with a NULL node array).
func (d *Driver) GraphNodeCount(ctx cuda.Context, g cuda.Graph) (int, error) {
	var n C.ulonglong
	if r := C.cc_graphNodeCount(d.tab, cctx(ctx), C.uintptr_t(g), &n); r != 0 {
		return 0, d.fail(symGraphGetNodes, r)
	}
	return int(n), nil
}

// GraphDebugDot writes g as a Graphviz DOT file at path (cuGraphDebugDotPrint, CUDA 11.3); verbose asks
// for every node's parameters. The driver creates or truncates the file; one it cannot open is
// CUDA_ERROR_OPERATING_SYSTEM.
func (d *Driver) GraphDebugDot(ctx cuda.Context, g cuda.Graph, path string, verbose bool) error {
	if err := d.need(symGraphDebugDotPrint); err != nil {
		return err
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var flags C.uint
	if verbose {
		flags = 1 // CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE
	}
	if r := C.cc_graphDebugDotPrint(d.tab, cctx(ctx), C.uintptr_t(g), cpath, flags); r != 0 {
		return d.fail(symGraphDebugDotPrint, r)
	}
	return nil
}

// ModuleLoadData loads a module from a cubin, fatbin or PTX image (cuModuleLoadData); the caller owns it
// and unloads it with ModuleUnload. The image is copied to C memory with a terminating NUL first: the
// driver reads PTX up to a NUL that a Go slice need not have. An empty image is CUDA_ERROR_INVALID_VALUE.
func (d *Driver) ModuleLoadData(ctx cuda.Context, image []byte) (cuda.Module, error) {
	if len(image) == 0 {
		return 0, cuda.NewError(d.op(symModuleLoadData), cuda.ErrorInvalidValue, "empty module image")
	}
	buf := C.malloc(C.size_t(len(image) + 1))
	if buf == nil {
		return 0, cuda.NewError(d.op(symModuleLoadData), cuda.ErrorOutOfMemory, "cannot copy the module image")
	}
	defer C.free(buf)
	c := unsafe.Slice((*byte)(buf), len(image)+1)
	copy(c, image)
	c[len(image)] = 0
	var m C.uintptr_t
	if r := C.cc_moduleLoadData(d.tab, cctx(ctx), buf, &m); r != 0 {
		return 0, d.fail(symModuleLoadData, r)
	}
	return cuda.Module(m), nil
}

// ModuleUnload unloads a module (cuModuleUnload); its functions become invalid.
func (d *Driver) ModuleUnload(ctx cuda.Context, m cuda.Module) error {
	if r := C.cc_moduleUnload(d.tab, cctx(ctx), C.uintptr_t(m)); r != 0 {
		return d.fail(symModuleUnload, r)
	}
	return nil
}

// ModuleGetFunction returns the kernel named name in m (cuModuleGetFunction); it lives as long as m.
func (d *Driver) ModuleGetFunction(ctx cuda.Context, m cuda.Module, name string) (cuda.Function, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var f C.uintptr_t
	if r := C.cc_moduleGetFunction(d.tab, cctx(ctx), C.uintptr_t(m), cname, &f); r != 0 {
		return 0, d.fail(symModuleGetFunction, r)
	}
	return cuda.Function(f), nil
}

// FuncGetAttribute returns an attribute of a kernel (cuFuncGetAttribute).
func (d *Driver) FuncGetAttribute(ctx cuda.Context, f cuda.Function, a cuda.FunctionAttribute) (int, error) {
	var v C.int
	if r := C.cc_funcGetAttribute(d.tab, cctx(ctx), C.uintptr_t(f), C.int(a), &v); r != 0 {
		return 0, d.fail(symFuncGetAttribute, r)
	}
	return int(v), nil
}

// paramAlign keeps each copied kernel argument aligned for any type a kernel takes by value (up to
// 16-byte vector types): the driver reads each argument through its pointer with the kernel's alignment.
const paramAlign = 16

// LaunchKernel launches f on s (cuLaunchKernel). Each argument's bytes are copied into one C buffer with
// the pointer array in front, because the driver reads them through void** and cgo forbids handing C a Go
// pointer to Go pointers; the driver copies the arguments before returning, so the buffer is freed then.
func (d *Driver) LaunchKernel(ctx cuda.Context, f cuda.Function, grid, block cuda.Dim3, sharedMem uint32, s cuda.Stream, params [][]byte) error {
	ptrSize := int(unsafe.Sizeof(uintptr(0)))
	head := (len(params)*ptrSize + paramAlign - 1) &^ (paramAlign - 1)
	total := head
	for _, p := range params {
		total += (len(p) + paramAlign - 1) &^ (paramAlign - 1)
	}
	var args *unsafe.Pointer
	if len(params) > 0 {
		buf := C.calloc(1, C.size_t(total))
		if buf == nil {
			return cuda.NewError(d.op(symLaunchKernel), cuda.ErrorOutOfMemory, "cannot copy the kernel arguments")
		}
		defer C.free(buf)
		ptrs := unsafe.Slice((*unsafe.Pointer)(buf), len(params))
		mem := unsafe.Slice((*byte)(buf), total)
		off := head
		for i, p := range params {
			copy(mem[off:], p)
			ptrs[i] = unsafe.Pointer(&mem[off])
			off += (len(p) + paramAlign - 1) &^ (paramAlign - 1)
		}
		args = &ptrs[0]
	}
	g := [3]C.uint{C.uint(grid[0]), C.uint(grid[1]), C.uint(grid[2])}
	b := [3]C.uint{C.uint(block[0]), C.uint(block[1]), C.uint(block[2])}
	if r := C.cc_launchKernel(d.tab, cctx(ctx), C.uintptr_t(f), &g[0], &b[0], C.uint(sharedMem), cstream(s), args); r != 0 {
		return d.fail(symLaunchKernel, r)
	}
	return nil
}
