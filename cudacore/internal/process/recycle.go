package process

import (
	"sync"
	"sync/atomic"

	"github.com/cudacore/cudacore/cudacore/internal/recycle"
	"github.com/cudacore/cudacore/pkg/memory"
)

// The recycle log (package recycle): blocks that C freed and allocated again without entering Go. The
// facade's guard calls Replay before any call into Go does its work and Publish after it: so Go always
// acts on the state that includes every free and allocation C served, and C logs only while Go allows.

var (
	// replayMu keeps replays in log order: one thread drains and applies a batch before the next drains.
	replayMu sync.Mutex
	// failed holds logged frees that Go refused when replayed (a driver failure below the cache), retried
	// at every replay: the block stays in use, as a failed Buffer.close leaves it, and is never lost.
	failed   []recycle.Op
	nFailed  atomic.Int64
	allowed  [recycle.Devices]atomic.Uint64 // what Publish last told C, per device
	disabled = sync.OnceValue(func() bool { return getenv("CUDACORE_RECYCLE") == "0" })
)

// Replay applies the recycle log to the allocators, oldest op first: a free that nothing reused is freed
// (Device.Free, with every rule of a free), and a free whose block was taken again, with its take,
// counts as a free and an allocation of the same block in the statistics and the flight recorder. It
// costs one atomic load when the log is empty.
func Replay() {
	if !recycle.Pending() && nFailed.Load() == 0 {
		return
	}
	replayMu.Lock()
	defer replayMu.Unlock()
	if n := len(failed); n > 0 {
		retry := failed
		failed = nil
		for _, op := range retry {
			replayFree(op)
		}
	}
	var ops recycle.Ops
	recycle.Drain(&ops)
	var run [recycle.Capacity]memory.Recycle // consecutive consumed frees and takes of one device
	n, device := 0, -1
	flush := func() {
		if n > 0 {
			if d, err := Lookup(device); err == nil { // C logs only for devices Publish allowed, which are open
				d.inFlight.RLock()
				d.Memory().Recycled(run[:n])
				d.inFlight.RUnlock()
			}
			n = 0
		}
	}
	for i := range ops.Len() {
		op := ops.At(i)
		if op.Kind == recycle.Free || op.Device != device {
			flush()
			device = op.Device
		}
		if op.Kind == recycle.Free {
			replayFree(op)
			continue
		}
		run[n] = memory.Recycle{Free: op.Kind == recycle.Consumed, Ptr: op.Ptr, Size: op.Size, Stream: op.Stream}
		n++
	}
	flush()
	nFailed.Store(int64(len(failed)))
}

// replayFree frees a logged block; a failure keeps it for the next replay. Called with replayMu held.
func replayFree(op recycle.Op) {
	d, err := Lookup(op.Device)
	if err == nil {
		err = d.Free(op.Ptr, op.Size, op.Stream)
	}
	if err != nil {
		failed = append(failed, op)
	}
}

// Publish tells C, per open device, whether it may log frees and takes now, and of blocks up to what
// size: while the device's allocator caches freed blocks of that size (so that a logged free is what Go
// would have done anyway: keep the block for the next allocation of its size on its stream), tracks no allocation (the tracker records each one), no
// stream of the process captures, and no graph memory or memory a live graph uses is on the books (their
// frees follow the graph's rules). CUDACORE_RECYCLE=0 keeps it off.
func Publish() {
	off := disabled()
	capturing := Capturing()
	for i := range min(int(openedBound.Load()), recycle.Devices) {
		d := opened[i].Load()
		if d == nil {
			continue
		}
		var max uint64
		if !off && !capturing {
			max = d.recyclable()
		}
		if allowed[i].Load() != max {
			allowed[i].Store(max)
			recycle.Allow(i, max)
		}
	}
}

// recyclable is the largest block the device's own state lets C log (see Publish), 0 for none.
func (d *Device) recyclable() uint64 {
	m := d.Memory()
	if m == nil || m.Cache() == nil || m.Tracking() {
		return 0
	}
	if s := d.streams.Load(); s != nil && s.GraphMemoryInUse() {
		return 0
	}
	return m.Cache().MaxBlock()
}

// RecycleFailures is how many logged frees failed when replayed and wait for the next replay.
func RecycleFailures() int { return int(nFailed.Load()) }
