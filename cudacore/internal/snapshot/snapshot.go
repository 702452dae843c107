// Package snapshot publishes the facts that the C fast path (cudacore/native) decides on: Go owns them
// and writes them here, into one C struct (snapshot.h) that C reads with atomic loads. There is no other
// copy: the Python layer asks C (cudacore._fast.snapshot) or Go, and C reads only this.
//
// Every writer is in cudacore/internal/process: devices when they open and change strategy, the capture
// count from the capture registry, the graph memory count from the stream package's hook.
package snapshot

/*
#include "snapshot.h"

static void cc_snapshot_store_device(int ordinal, int32_t direct, int32_t blocking, uint64_t ctx, uint64_t table,
                                     int64_t pageable_max) {
	cc_device_facts *d = &cc_snapshot.devices[ordinal];
	__atomic_store_n(&d->direct, CC_DIRECT_OFF, __ATOMIC_SEQ_CST);
	__atomic_store_n(&d->ctx, ctx, __ATOMIC_SEQ_CST);
	__atomic_store_n(&d->table, table, __ATOMIC_SEQ_CST);
	__atomic_store_n(&d->pageable_max, pageable_max, __ATOMIC_SEQ_CST);
	__atomic_store_n(&d->blocking, blocking, __ATOMIC_SEQ_CST);
	__atomic_store_n(&d->direct, direct, __ATOMIC_RELEASE);
}
static void cc_snapshot_store_blocking(int ordinal, int32_t blocking) {
	__atomic_store_n(&cc_snapshot.devices[ordinal].blocking, blocking, __ATOMIC_SEQ_CST);
}
static void cc_snapshot_store_captures(int32_t n) { __atomic_store_n(&cc_snapshot.captures, n, __ATOMIC_SEQ_CST); }
static void cc_snapshot_store_graph_memory(int32_t n) {
	__atomic_store_n(&cc_snapshot.graph_memory_pending, n, __ATOMIC_SEQ_CST);
}
static cc_device_facts cc_snapshot_load_device(int ordinal) {
	cc_device_facts f;
	f.direct = __atomic_load_n(&cc_snapshot.devices[ordinal].direct, __ATOMIC_ACQUIRE);
	f.blocking = __atomic_load_n(&cc_snapshot.devices[ordinal].blocking, __ATOMIC_SEQ_CST);
	f.ctx = __atomic_load_n(&cc_snapshot.devices[ordinal].ctx, __ATOMIC_SEQ_CST);
	f.table = __atomic_load_n(&cc_snapshot.devices[ordinal].table, __ATOMIC_SEQ_CST);
	f.pageable_max = __atomic_load_n(&cc_snapshot.devices[ordinal].pageable_max, __ATOMIC_SEQ_CST);
	return f;
}
static int32_t cc_snapshot_load_captures(void) { return __atomic_load_n(&cc_snapshot.captures, __ATOMIC_SEQ_CST); }
static int32_t cc_snapshot_load_graph_memory(void) {
	return __atomic_load_n(&cc_snapshot.graph_memory_pending, __ATOMIC_SEQ_CST);
}
*/
import "C"

// Devices is how many device ordinals have facts (CC_SNAPSHOT_DEVICES); calls for the others go through Go.
const Devices = C.CC_SNAPSHOT_DEVICES

// Direct says how the direct path reaches a device's driver (CC_DIRECT_* of snapshot.h).
type Direct int32

const (
	DirectOff  Direct = C.CC_DIRECT_OFF  // every call goes through Go
	DirectCUDA Direct = C.CC_DIRECT_CUDA // the real driver, through the shim's entry point table
	DirectSim  Direct = C.CC_DIRECT_SIM  // the simulator, through the SimDirect* doors
)

// DeviceFacts are one device's facts (cc_device_facts).
type DeviceFacts struct {
	Direct      Direct
	Blocking    bool    // the allocator can block (the synchronous strategy)
	Context     uint64  // the device's context
	Table       uintptr // the real driver's entry point table; 0 elsewhere
	PageableMax int64   // stream.Options.PageableDirectMax; negative: none
}

// SetDevice publishes device ordinal's facts; an ordinal beyond Devices is ignored (its calls go through
// Go). Direct is stored last, so that C, which reads it first, sees the facts it guards. A real-driver
// device without a context or a table is published as DirectOff.
func SetDevice(ordinal int, f DeviceFacts) {
	if ordinal < 0 || ordinal >= Devices {
		return
	}
	if f.Direct == DirectCUDA && (f.Context == 0 || f.Table == 0) {
		f.Direct = DirectOff
	}
	C.cc_snapshot_store_device(C.int(ordinal), C.int32_t(f.Direct), boolC(f.Blocking), C.uint64_t(f.Context),
		C.uint64_t(f.Table), C.int64_t(f.PageableMax))
}

// SetBlocking publishes whether device ordinal's allocator can block (after a strategy change).
func SetBlocking(ordinal int, blocking bool) {
	if ordinal >= 0 && ordinal < Devices {
		C.cc_snapshot_store_blocking(C.int(ordinal), boolC(blocking))
	}
}

// SetCaptures publishes the count of streams cudacore captures on. The caller serializes its calls
// (the capture registry's mutex), so the last store is the latest count.
func SetCaptures(n int32) { C.cc_snapshot_store_captures(C.int32_t(n)) }

// SetGraphMemoryPending publishes the count of graph memory allocations no launch has made real; the
// caller serializes its calls.
func SetGraphMemoryPending(n int) { C.cc_snapshot_store_graph_memory(C.int32_t(n)) }

// Device reads device ordinal's facts back (the zero value beyond Devices).
func Device(ordinal int) DeviceFacts {
	if ordinal < 0 || ordinal >= Devices {
		return DeviceFacts{}
	}
	f := C.cc_snapshot_load_device(C.int(ordinal))
	return DeviceFacts{Direct: Direct(f.direct), Blocking: f.blocking != 0, Context: uint64(f.ctx),
		Table: uintptr(f.table), PageableMax: int64(f.pageable_max)}
}

// Captures reads the published capture count back.
func Captures() int32 { return int32(C.cc_snapshot_load_captures()) }

// GraphMemoryPending reads the published graph memory count back.
func GraphMemoryPending() int { return int(C.cc_snapshot_load_graph_memory()) }

func boolC(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}
