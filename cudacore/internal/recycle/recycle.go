// Package recycle is the Go side of the recycle log (recycle.h): device blocks that cudacore/native
// freed and allocated again in C, without entering Go, for the facade to replay into the allocator.
//
// C only logs; Go owns every block throughout. Go allows logging per device (Allow) and replays the log
// at the start of every call into Go (Drain), so the allocator never acts on a state that misses a free
// or an allocation C served.
package recycle

/*
#include "recycle.h"
*/
import "C"

import (
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// Capacity is how many ops the log holds.
const Capacity = C.CC_RECYCLE_CAPACITY

// Devices is how many device ordinals (0 to Devices-1) can log; others always enter Go.
const Devices = C.CC_RECYCLE_DEVICES

// Kind is what an Op records.
type Kind uint32

// The kinds of ops, in the order C logs them for one block: a Free, which a later Take of the same block
// turns into a Consumed free.
const (
	Free     Kind = C.CC_RECYCLE_FREE     // a free that no later op reused: Go frees the block
	Consumed Kind = C.CC_RECYCLE_CONSUMED // a free whose block a later Take of the same log reused
	Take     Kind = C.CC_RECYCLE_TAKE     // an allocation served with a Consumed free's block
)

// Op is one logged free or allocation.
type Op struct {
	Device int
	Ptr    cuda.DevicePtr
	Size   uint64
	Stream cuda.Stream
	Kind   Kind
	Time   int64 // when C served it: CLOCK_MONOTONIC nanoseconds (Ops.When converts it)
}

// Ops is a drained log.
type Ops struct {
	raw [Capacity]C.cc_recycle_op
	n   int
	// now and mono are the same instant on Go's clock and on CLOCK_MONOTONIC, read by Drain.
	now  time.Time
	mono int64
}

// Len is how many ops Drain moved.
func (o *Ops) Len() int { return o.n }

// At is op i (0 <= i < Len), oldest first.
func (o *Ops) At(i int) Op {
	r := &o.raw[i]
	return Op{Device: int(r.device), Ptr: cuda.DevicePtr(r.ptr), Size: uint64(r.size), Stream: cuda.Stream(uint64(r.stream)), Kind: Kind(r.kind), Time: int64(r.time)}
}

// When is op's time on Go's clock (with a monotonic reading), exact to tens of nanoseconds: the ops of a
// burst get distinct, increasing times. An op logged by LogFree or LogTake in tests carries the same
// clock.
func (o *Ops) When(op Op) time.Time {
	return o.now.Add(time.Duration(op.Time - o.mono))
}

// length points at the C log's op count, read without the lock: a load, not a cgo call.
var length = (*uint32)(unsafe.Pointer(&C.cc_recycle_len))

// Pending says whether the log holds ops. It costs one atomic load, so every call into Go can ask.
func Pending() bool { return atomic.LoadUint32(length) != 0 }

// Drain moves the log's ops into o, oldest first, and empties the log. The caller replays them in order.
func Drain(o *Ops) {
	o.n = int(C.cc_recycle_drain(&o.raw[0]))
	if o.n > 0 {
		o.now, o.mono = time.Now(), int64(C.cc_recycle_now())
	}
}

// Allow lets C log frees and takes of blocks up to max bytes for device ordinal, or stops it (max 0).
// An ordinal out of range is ignored. Stopping takes effect for every later C call (one in progress
// finishes first, under the log's lock).
func Allow(ordinal int, max uint64) {
	C.cc_recycle_set(C.int64_t(ordinal), C.uint64_t(max))
}

// Guards is how many guarded ranges C holds for all devices together.
const Guards = C.CC_RECYCLE_GUARDS

// Guard replaces device ordinal's guarded ranges ([lo[i], hi[i]): memory live graphs use, whose frees C
// never logs) and says whether they fit (else nothing changed). Set them before allowing logging.
func Guard(ordinal int, lo, hi []uint64) bool {
	if len(lo) != len(hi) || len(lo) > Guards {
		return false
	}
	var plo, phi *C.uint64_t
	if len(lo) > 0 {
		plo, phi = (*C.uint64_t)(unsafe.Pointer(&lo[0])), (*C.uint64_t)(unsafe.Pointer(&hi[0]))
	}
	return C.cc_recycle_guard(C.int64_t(ordinal), plo, phi, C.int(len(lo))) != 0
}

// Allowed is the largest block C may log for device ordinal now (0: none).
func Allowed(ordinal int) uint64 {
	if ordinal < 0 || ordinal >= Devices {
		return 0
	}
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&C.cc_recycle_max[ordinal])))
}

// LogFree and LogTake are the C calls of cudacore/native, for tests of the log and of the replay: they
// behave as a Buffer's close and an allocation do there.

// LogFree logs the free of a block; false when the caller must free through Go.
func LogFree(ordinal int, p cuda.DevicePtr, size uint64, s cuda.Stream) bool {
	return C.cc_recycle_free(C.int64_t(ordinal), C.uint64_t(p), C.uint64_t(size), C.uint64_t(uint64(s))) != 0
}

// LogTake takes a logged free of exactly this size and stream; 0 when the caller must allocate in Go.
func LogTake(ordinal int, size uint64, s cuda.Stream) cuda.DevicePtr {
	return cuda.DevicePtr(C.cc_recycle_take(C.int64_t(ordinal), C.uint64_t(size), C.uint64_t(uint64(s))))
}
