package memory

import (
	"errors"
	"strconv"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// Retry turns an out-of-memory failure of the inner resource into one more attempt after making room:
//
//  1. it releases the cached memory of everything below (Release on the composition: the Cache's blocks,
//     the pool's reserve),
//  2. synchronizes the context, so that stream-ordered frees have completed and their memory is truly
//     free, and trims again (what those frees returned to the pool),
//  3. calls the optional callback with the requested size, which may free the caller's own memory (drop a
//     cache, collect garbage); if it returns false, Retry gives up and returns the first error,
//  4. retries once. A second failure is returned as it is.
//
// Errors other than out of memory are returned at once. Concurrent callers may each retry; the release
// and synchronize are idempotent.
type Retry struct {
	inner Resource
	drv   cuda.Driver
	ctx   cuda.Context
	onOOM func(requested uint64) bool
}

// NewRetry wraps inner, synchronizing ctx through drv before the retry. onOOM may be nil.
func NewRetry(inner Resource, drv cuda.Driver, ctx cuda.Context, onOOM func(requested uint64) bool) *Retry {
	return &Retry{inner: inner, drv: drv, ctx: ctx, onOOM: onOOM}
}

// retriedError marks an out-of-memory error that survived Retry, with what Retry released on the way;
// OutOfMemory reads it to say so. Its text is the cause's; errors.As and errors.Is see through it.
type retriedError struct {
	released uint64
	err      error
}

func (e *retriedError) Error() string { return e.err.Error() }
func (e *retriedError) Unwrap() error { return e.err }

func (r *Retry) Allocate(size uint64, s cuda.Stream) (cuda.DevicePtr, error) {
	p, err := r.inner.Allocate(size, s)
	if err == nil || !errors.Is(err, cuda.ErrOutOfMemory) || !retryable(err) || capturedElsewhere(r.drv, r.ctx, s) {
		return p, err
	}
	before := Cached(r.inner)
	// A failure to release is not reported: the retry's own result says what matters. (The pool's
	// release synchronizes the context, so the frees in flight complete and are trimmed too.)
	_ = Release(r.inner)
	released := before - min(before, Cached(r.inner))
	if r.onOOM != nil && !r.onOOM(size) {
		return 0, &retriedError{released: released, err: err}
	}
	p, err2 := r.inner.Allocate(size, s)
	if err2 != nil {
		return 0, &retriedError{released: released, err: err2}
	}
	return p, nil
}

// capturedElsewhere says whether s, the stream an allocation names, is being captured: by another library
// (cudacore's own captures make the pool Quiet). Making room would then invalidate that capture: the
// release synchronizes the context, and a query of the pool's usage is an unsafe call during a capture
// (docs/contributing/driver-facts.md). Only the out-of-memory path asks, so the query costs nothing on success. The
// legacy and per-thread streams are not asked: a query of the legacy stream while another stream captures
// is itself refused. A failed query counts as capturing, the safe side.
func capturedElsewhere(drv cuda.Driver, ctx cuda.Context, s cuda.Stream) bool {
	if s == 0 || s == cuda.StreamLegacy || s == cuda.StreamPerThread {
		return false
	}
	status, err := drv.StreamIsCapturing(ctx, s)
	return err != nil || status != cuda.CaptureStatusNone
}

// retryable is false for out-of-memory errors no release can cure: a request larger than the device
// (its fields say requested > total) and a limit hit below.
func retryable(err error) bool {
	var e *cuda.Error
	if !errors.As(err, &e) {
		return true
	}
	if e.Op == LimitOp {
		return false
	}
	req, ok1 := e.Field("requested")
	total, ok2 := e.Field("total")
	if !ok1 || !ok2 {
		return true
	}
	rq, err1 := strconv.ParseUint(req, 10, 64)
	tt, err2 := strconv.ParseUint(total, 10, 64)
	return err1 != nil || err2 != nil || tt == 0 || rq <= tt
}

func (r *Retry) Deallocate(p cuda.DevicePtr, size uint64, s cuda.Stream) error {
	return r.inner.Deallocate(p, size, s)
}

func (r *Retry) Unwrap() Resource { return r.inner }
func (r *Retry) Release() error   { return forwardRelease(r.inner) }
func (r *Retry) Cached() uint64   { return Cached(r.inner) }
