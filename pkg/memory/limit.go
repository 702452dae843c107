package memory

import (
	"fmt"
	"sync/atomic"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// LimitOp is the Op of the error Limit returns when an allocation would go over the limit.
const LimitOp = "cudacore.limit"

// Limit caps the bytes allocated through it. The request is reserved against the limit atomically before
// the inner resource is called and the reservation is undone if that fails, so concurrent callers can
// never together exceed the limit, and a failure leaves the accounting as it was. A limit of 0 means none;
// SetLimit may change it at any time (lowering it below what is in use only fails later allocations).
//
// It counts the bytes callers ask for: what resources below add (the Cache's size-class rounding, at most
// 25%, and the blocks it keeps) is not counted, so device memory used can exceed the limit by that much.
type Limit struct {
	inner Resource
	limit atomic.Uint64
	inUse atomic.Uint64
}

// NewLimit wraps inner with a limit of limit bytes (0: none).
func NewLimit(inner Resource, limit uint64) *Limit {
	l := &Limit{inner: inner}
	l.limit.Store(limit)
	return l
}

// Allocate fails with an out-of-memory *cuda.Error (Op LimitOp; fields requested, limit, in_use) when
// size would take the bytes in use over the limit, without calling the inner resource.
func (l *Limit) Allocate(size uint64, s cuda.Stream) (cuda.DevicePtr, error) {
	for {
		lim := l.limit.Load()
		cur := l.inUse.Load()
		if lim != 0 && (size > lim || cur > lim-size) {
			return 0, l.overError(size, lim, cur)
		}
		if l.inUse.CompareAndSwap(cur, cur+size) {
			break
		}
	}
	p, err := l.inner.Allocate(size, s)
	if err != nil {
		l.inUse.Add(-size)
		return 0, err
	}
	return p, nil
}

// Deallocate forwards and, on success, gives the bytes back to the limit.
func (l *Limit) Deallocate(p cuda.DevicePtr, size uint64, s cuda.Stream) error {
	if err := l.inner.Deallocate(p, size, s); err != nil {
		return err
	}
	l.inUse.Add(-size)
	return nil
}

func (l *Limit) overError(size, lim, cur uint64) *cuda.Error {
	return cuda.NewError(LimitOp, cuda.ErrorOutOfMemory,
		fmt.Sprintf("allocating %s would exceed the memory limit of %s (%s of it in use): a memory limit was hit, "+
			"not the device's capacity; raise the limit (or set it to 0 for none) or free memory",
			FormatBytes(size), FormatBytes(lim), FormatBytes(cur)),
		field("requested", size), field("limit", lim), field("in_use", cur))
}

// SetLimit sets the limit in bytes; 0 removes it.
func (l *Limit) SetLimit(bytes uint64) { l.limit.Store(bytes) }

// Limit returns the limit (0: none).
func (l *Limit) Limit() uint64 { return l.limit.Load() }

// InUse returns the bytes counted against the limit, reservations in flight included.
func (l *Limit) InUse() uint64 { return l.inUse.Load() }

func (l *Limit) Unwrap() Resource { return l.inner }
func (l *Limit) Release() error   { return forwardRelease(l.inner) }
func (l *Limit) Cached() uint64   { return Cached(l.inner) }
