package process

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/cudacore/cudacore/cudacore/internal/recycle"
	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/memory"
	"github.com/cudacore/cudacore/pkg/stream"
)

// The recycle log (package recycle): blocks that C freed and allocated again without entering Go. The
// facade's guard calls Replay before any call into Go does its work and Publish after it: so Go always
// acts on the state that includes every free and allocation C served, and C logs only while Go allows.

var (
	// replayMu keeps replays in log order: one thread drains and applies a batch before the next drains.
	replayMu sync.Mutex
	// replaying is set while a replay holds replayMu: a caller that finds the log empty must still wait
	// for a replay in progress, whose ops are drained from the log but not yet applied.
	replaying atomic.Bool
	// failed holds logged frees that Go refused when replayed (a driver failure below the cache, where
	// the cache was full): the block stays counted in use, as a failed Buffer.close leaves it, and is never
	// lost. They are retried by later replays, at most once per retryEvery.
	failed    []recycle.Op
	nFailed   atomic.Int64
	lastRetry time.Time
	// drained and run are Replay's buffers (guarded by replayMu): a drained log, and its consecutive
	// consumed frees and takes of one device.
	drained recycle.Ops
	run     [recycle.Capacity]memory.Recycle
	// publishMu orders the writes of Publish: the value C holds is always computed from the newest state.
	// publishing counts the callers that hold it or wait for it.
	publishMu  sync.Mutex
	publishing atomic.Int32
	// disabled is CUDACORE_RECYCLE=0; a value that is neither 0 nor 1 fails every device's opening
	// (GetDevice), so no call reaches here with it, and it counts as off.
	disabled = sync.OnceValue(func() bool {
		on, err := switchOn(envRecycle, getenv(envRecycle))
		return err != nil || !on
	})
)

// retryEvery spaces the retries of failed replayed frees: a driver that refuses a free usually goes on
// refusing (a sticky context error), and each attempt counts as a failure in the statistics.
const retryEvery = time.Second

// Replay applies the recycle log to the allocators, oldest op first: a free that nothing reused is freed
// (Device.Free, with every rule of a free), and a free whose block was taken again, with its take,
// counts as a free and an allocation of the same block in the statistics and the flight recorder. It
// costs one atomic load when the log is empty.
func Replay() {
	if !recycle.Pending() && nFailed.Load() == 0 && !replaying.Load() {
		return
	}
	replayMu.Lock()
	defer replayMu.Unlock()
	replaying.Store(true) // before the drain: see replaying
	defer replaying.Store(false)
	if n := len(failed); n > 0 && time.Since(lastRetry) >= retryEvery {
		lastRetry = time.Now()
		retry := failed
		failed = nil
		for _, op := range retry {
			replayFree(op, time.Time{}) // recorded when it finally succeeds
		}
	}
	ops := &drained
	recycle.Drain(ops)
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
			replayFree(op, ops.When(op))
			continue
		}
		run[n] = memory.Recycle{At: ops.When(op), Free: op.Kind == recycle.Consumed, Ptr: op.Ptr, Size: op.Size, Stream: op.Stream}
		n++
	}
	flush()
	nFailed.Store(int64(len(failed)))
}

// replayFree frees a logged block, made at time at; a failure keeps it for the next replay. Called with
// replayMu held.
func replayFree(op recycle.Op, at time.Time) {
	d, err := Lookup(op.Device)
	if err == nil {
		err = d.freeLogged(op.Ptr, op.Size, op.Stream, at)
	}
	if err != nil {
		failed = append(failed, op)
	}
}

// freeLogged is Free of a block the recycle log freed at time at. In the case the log was allowed for (no
// capture, no graph memory, on a default stream) the flight recorder gets the free at that time; in any
// other (the state changed since), Free applies its rules and the free is recorded when it is made.
func (d *Device) freeLogged(p cuda.DevicePtr, size uint64, h cuda.Stream, at time.Time) error {
	if Capturing() || !stream.IsDefault(h) || d.managed.n.Load() != 0 || d.Streams().GraphMemoryInUse() {
		return d.Free(p, size, h)
	}
	d.inFlight.RLock()
	defer d.inFlight.RUnlock()
	return d.Memory().DeallocateAt(p, size, h, at)
}

// Publish tells C, per open device, whether it may log frees and takes now, and of blocks up to what
// size. It may while:
//   - the device's allocator caches freed blocks of that size, so that a logged free is what Go would have
//     done anyway: keep the block for the next allocation of its size on its stream;
//   - it tracks no allocation (the tracker records each one);
//   - no stream of the process captures;
//   - no graph memory (allocations of captures, void pointers) is on the books: their frees follow the
//     graph's rules. Memory live graphs only use does not stop it: C holds the ranges they use
//     (recycle.Guard, given before logging is allowed) and never logs the free of a block in one, which
//     goes through Go and waits for those graphs;
//   - no memory limit is exceeded: a limit lowered below what is in use fails every later allocation, and
//     C's takes never raise what is in use above what Go last saw, so they stay within a limit Go saw kept.
//
// CUDACORE_RECYCLE=0 keeps it off.
func Publish() {
	// Without the lock when no other caller is publishing and nothing changed (the common case). A caller
	// that finds another one publishing waits and computes again after it: that one may have computed
	// from a state older than this caller's, and its write must not be the last. The order of the two
	// checks matters: a publisher counts itself before it computes, so once this caller, after its own
	// change of state, sees none, every write still to come is computed from that state or a newer one,
	// and every earlier write is already there for publish(false) to compare with.
	if publishing.Load() == 0 && !publish(false) {
		return
	}
	publishing.Add(1)
	publishMu.Lock()
	publish(true)
	publishMu.Unlock()
	publishing.Add(-1)
}

// publish computes what C may log per device; with write, it tells C where that changed. It says whether
// anything changed.
func publish(write bool) bool {
	off := disabled()
	capturing := Capturing()
	changed := false
	for i := range min(int(openedBound.Load()), recycle.Devices) {
		d := opened[i].Load()
		if d == nil {
			continue
		}
		var max uint64
		if !off && !capturing {
			max = d.recyclable()
		}
		// The ranges live graphs use go to C first, whenever they changed, so that C never logs the free of
		// a block a graph launched later may still write (recycle.Guard). Ranges that do not fit stop
		// logging for the device instead, and are offered again at the next publish.
		if s := d.streams.Load(); s != nil && s.GraphUsesVersion() != guardVersion[i].Load() {
			changed = true
			if write {
				lo, hi, v := s.GraphUses(nil, nil)
				if recycle.Guard(i, lo, hi) {
					guardVersion[i].Store(v)
				} else {
					max = 0
				}
			}
		}
		if recycle.Allowed(i) != max { // only Publish writes what C holds
			changed = true
			if write {
				recycle.Allow(i, max)
			}
		}
	}
	return changed
}

// recyclable is the largest block the device's own state lets C log (see Publish), 0 for none.
func (d *Device) recyclable() uint64 {
	m := d.Memory()
	if m == nil || m.Cache() == nil || m.Tracking() || m.OverLimit() {
		return 0
	}
	// Graph memory proper (allocations of captures, void pointers) stops logging; memory live graphs only
	// use does not: C checks each free against the ranges publish gives it.
	if s := d.streams.Load(); s != nil && s.GraphMemoryProper() {
		return 0
	}
	return m.Cache().MaxBlock()
}

// guardVersion is, per device, the version of the graph-use books (stream.Manager.GraphUsesVersion)
// whose ranges C holds; written by publish under publishMu.
var guardVersion [recycle.Devices]atomic.Uint64
