package memory

import (
	"errors"
	"sync/atomic"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// Stats counts what passes through it, exactly: every counter is an atomic updated after the inner call
// returns, so a snapshot taken while nothing is in flight is exact, and one taken under load is a
// consistent-enough view (each counter exact, not all from one instant). Sizes are the sizes callers ask
// for, not what the resources below round them up to.
type Stats struct {
	inner Resource

	inUse, peak, allocs, frees, ooms, failures, recycled atomic.Uint64
}

// StatsSnapshot is a copy of the counters. Stats fills InUse through Failures; Stack also fills Cached,
// Reserved and Limit.
type StatsSnapshot struct {
	InUse       uint64 // bytes allocated and not yet freed
	PeakInUse   uint64 // the most InUse has been since creation or ResetPeak
	Allocations uint64 // successful allocations
	Frees       uint64 // successful deallocations
	OOMs        uint64 // allocations that failed with out of memory
	Failures    uint64 // failed calls of either kind, OOMs included
	Recycled    uint64 // of Allocations, those served outside the stack with a block freed there (Stack.Recycled)

	Cached   uint64 // held for reuse, not handed out: the Cache plus the pool's reserved-but-unused memory
	Reserved uint64 // what the pool holds from the device (for Sync: InUse)
	Limit    uint64 // the byte limit, 0 for none
}

// NewStats wraps inner.
func NewStats(inner Resource) *Stats { return &Stats{inner: inner} }

func (r *Stats) Allocate(size uint64, s cuda.Stream) (cuda.DevicePtr, error) {
	p, err := r.inner.Allocate(size, s)
	if err != nil {
		r.failures.Add(1)
		if errors.Is(err, cuda.ErrOutOfMemory) {
			r.ooms.Add(1)
		}
		return 0, err
	}
	r.noteAlloc(size)
	return p, nil
}

// noteAlloc counts a successful allocation of size bytes.
func (r *Stats) noteAlloc(size uint64) {
	r.allocs.Add(1)
	storeMax(&r.peak, r.inUse.Add(size))
}

// apply counts a run of frees and allocations made outside the stack (Stack.Recycled), each allocation
// also as recycled. The peak is the highest InUse along the run. It returns InUse before the run (the
// run is added at once, so a concurrent snapshot sees none of it or all of each counter).
func (r *Stats) apply(ops []Recycle) uint64 {
	var frees, allocs uint64
	var net, high int64 // the running change of InUse along the run, and its highest value
	for _, op := range ops {
		if op.Free {
			frees++
			net -= int64(op.Size)
		} else {
			allocs++
			net += int64(op.Size)
			high = max(high, net)
		}
	}
	r.frees.Add(frees)
	r.allocs.Add(allocs)
	r.recycled.Add(allocs)
	after := r.inUse.Add(uint64(net))
	start := after - uint64(net)
	if high > 0 {
		storeMax(&r.peak, start+uint64(high))
	}
	return start
}

// noteFree counts a successful free of size bytes.
func (r *Stats) noteFree(size uint64) {
	r.frees.Add(1)
	r.inUse.Add(-size)
}

// Deallocate forwards and, if the inner resource took p back, counts the free. A failed free leaves
// InUse unchanged: the memory is still allocated as far as anyone knows.
func (r *Stats) Deallocate(p cuda.DevicePtr, size uint64, s cuda.Stream) error {
	if err := r.inner.Deallocate(p, size, s); err != nil {
		r.failures.Add(1)
		return err
	}
	r.noteFree(size)
	return nil
}

// Snapshot returns the counters.
func (r *Stats) Snapshot() StatsSnapshot {
	return StatsSnapshot{
		InUse:       r.inUse.Load(),
		PeakInUse:   r.peak.Load(),
		Allocations: r.allocs.Load(),
		Frees:       r.frees.Load(),
		OOMs:        r.ooms.Load(),
		Failures:    r.failures.Load(),
		Recycled:    r.recycled.Load(),
	}
}

// InUse is the bytes allocated through r and not yet freed.
func (r *Stats) InUse() uint64 { return r.inUse.Load() }

// ResetPeak sets the peak to the current in-use bytes.
func (r *Stats) ResetPeak() { r.peak.Store(r.inUse.Load()) }

func (r *Stats) Unwrap() Resource { return r.inner }
func (r *Stats) Release() error   { return forwardRelease(r.inner) }
func (r *Stats) Cached() uint64   { return Cached(r.inner) }
