package memory

import (
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// OpDeallocate is the Op of errors about a deallocation request itself (unknown pointer, wrong size).
const OpDeallocate = "cudacore.deallocate"

// Allocation is one live allocation a Tracker knows of.
type Allocation struct {
	Ptr    cuda.DevicePtr
	Size   uint64
	Stream cuda.Stream
	Where  string // the caller's label, or the captured stack trace (one "func file:line" per line), or ""
	Time   time.Time
}

// Tracker records every live allocation with where it was made, for leak reports, and refuses to free a
// pointer it did not hand out or has already taken back: the inner resource never sees a double free.
//
// With frames > 0 each allocation captures that many stack frames of its caller (only the program
// counters at allocation time; they are symbolized when Live is called). AllocateLabeled takes a label
// instead, for callers that know better (the Python layer passes the Python traceback).
type Tracker struct {
	inner  Resource
	frames int

	mu   sync.Mutex
	live map[cuda.DevicePtr]*tracked
}

type tracked struct {
	size   uint64
	stream cuda.Stream
	label  string
	pcs    []uintptr
	time   time.Time
}

// NewTracker wraps inner, capturing frames stack frames per allocation (0: none).
func NewTracker(inner Resource, frames int) *Tracker {
	return &Tracker{inner: inner, frames: max(frames, 0), live: map[cuda.DevicePtr]*tracked{}}
}

func (t *Tracker) Allocate(size uint64, s cuda.Stream) (cuda.DevicePtr, error) {
	return t.allocate(size, s, "", 3)
}

// AllocateLabeled allocates like Allocate and records label as where the allocation was made.
func (t *Tracker) AllocateLabeled(size uint64, s cuda.Stream, label string) (cuda.DevicePtr, error) {
	return t.allocate(size, s, label, 3)
}

func (t *Tracker) allocate(size uint64, s cuda.Stream, label string, skip int) (cuda.DevicePtr, error) {
	p, err := t.inner.Allocate(size, s)
	if err != nil {
		return 0, err
	}
	rec := &tracked{size: size, stream: s, label: label, time: time.Now()}
	if label == "" && t.frames > 0 {
		pcs := make([]uintptr, t.frames)
		rec.pcs = pcs[:runtime.Callers(skip, pcs)]
	}
	t.mu.Lock()
	t.live[p] = rec
	t.mu.Unlock()
	return p, nil
}

// Deallocate frees p if it is live and was allocated with size; otherwise it returns an InvalidValue
// *cuda.Error and calls nothing below. If the inner resource fails, p stays live (its state is unknown,
// so it is better reported as a leak than forgotten).
func (t *Tracker) Deallocate(p cuda.DevicePtr, size uint64, s cuda.Stream) error {
	t.mu.Lock()
	rec, ok := t.live[p]
	if ok && rec.size == size {
		delete(t.live, p) // before the inner call: a concurrent second free of p fails here, not below
	}
	t.mu.Unlock()
	if !ok {
		return invalid(OpDeallocate, fmt.Sprintf("pointer %#x was not allocated by this resource (or already freed)", uint64(p)),
			cuda.Field{Key: "ptr", Value: fmt.Sprintf("%#x", uint64(p))})
	}
	if rec.size != size {
		return invalid(OpDeallocate, fmt.Sprintf("pointer %#x was allocated with %d bytes, not %d", uint64(p), rec.size, size),
			field("size", rec.size), field("requested", size))
	}
	if err := t.inner.Deallocate(p, size, s); err != nil {
		t.mu.Lock()
		t.live[p] = rec
		t.mu.Unlock()
		return err
	}
	return nil
}

// SetLabel replaces where the live allocation p was made with label (its captured frames are dropped);
// it says whether p is live.
func (t *Tracker) SetLabel(p cuda.DevicePtr, label string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	rec, ok := t.live[p]
	if ok {
		rec.label, rec.pcs = label, nil
	}
	return ok
}

// Live returns the live allocations, oldest first.
func (t *Tracker) Live() []Allocation {
	t.mu.Lock()
	out := make([]Allocation, 0, len(t.live))
	recs := make([]*tracked, 0, len(t.live))
	for p, r := range t.live {
		out = append(out, Allocation{Ptr: p, Size: r.size, Stream: r.stream, Where: r.label, Time: r.time})
		recs = append(recs, r)
	}
	t.mu.Unlock()
	for i, r := range recs {
		if len(r.pcs) > 0 {
			out[i].Where = formatStack(r.pcs)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Time.Equal(out[j].Time) {
			return out[i].Time.Before(out[j].Time)
		}
		return out[i].Ptr < out[j].Ptr
	})
	return out
}

func formatStack(pcs []uintptr) string {
	var b strings.Builder
	frames := runtime.CallersFrames(pcs)
	for {
		f, more := frames.Next()
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%s %s:%d", f.Function, f.File, f.Line)
		if !more {
			return b.String()
		}
	}
}

// Len is the number of live allocations.
func (t *Tracker) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.live)
}

func (t *Tracker) Unwrap() Resource { return t.inner }
func (t *Tracker) Release() error   { return forwardRelease(t.inner) }
func (t *Tracker) Cached() uint64   { return Cached(t.inner) }
