package process

import (
	"sync"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/stream"
)

// The objects Python holds by number live here, beside the devices, the pinned table and the capture
// registry, so that every door reaches the same ones: a stream or event is named by its driver handle
// (Python passes a stream's handle to the allocation path as it is), a graph by a number of ours. Each is
// in its table from creation until destroy removes it; a number not in its table is an error made by
// the caller, never a stale handle passed to the driver.
var (
	Streams Registry[*stream.Stream]
	Events  Registry[*stream.Event]
	Graphs  Registry[*stream.Graph]
)

// Registry is an int-keyed table of live objects, safe for concurrent use.
type Registry[T any] struct {
	mu   sync.RWMutex
	m    map[int]T
	next int
}

// Add stores v under k, or under a new number of the registry's own when k is 0, and returns the key.
func (r *Registry[T]) Add(k int, v T) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[int]T{}
	}
	if k == 0 {
		r.next++
		k = r.next
	}
	r.m[k] = v
	return k
}

// Get returns the object under k.
func (r *Registry[T]) Get(k int) (T, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	v, ok := r.m[k]
	return v, ok
}

// Remove takes the object under k out of the table and returns it.
func (r *Registry[T]) Remove(k int) (T, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.m[k]
	delete(r.m, k)
	return v, ok
}

// Issued says whether k is a number this registry handed out (Add with key 0) at some time: numbers are
// never reused, so one that is issued but not in the table was removed (its object was destroyed).
func (r *Registry[T]) Issued(k int) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return k > 0 && k <= r.next
}

// Len returns how many objects are in the table.
func (r *Registry[T]) Len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.m)
}

// TorchAllocations records what the PyTorch allocator entries handed out, so that a free uses the size
// and stream of the allocation whatever the caller passes, and a pointer cudacore did not allocate is
// refused rather than handed to the allocator.
var TorchAllocations Allocations

// Allocation is one allocation handed to another framework.
type Allocation struct {
	Ordinal int
	Size    uint64
	Stream  cuda.Stream
}

// Allocations is a table of live allocations by address, safe for concurrent use.
type Allocations struct {
	mu sync.Mutex
	m  map[cuda.DevicePtr]Allocation
}

// Add records a at p.
func (t *Allocations) Add(p cuda.DevicePtr, a Allocation) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[cuda.DevicePtr]Allocation{}
	}
	t.m[p] = a
}

// Take removes the allocation at p and returns it; ok is false when there is none.
func (t *Allocations) Take(p cuda.DevicePtr) (a Allocation, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a, ok = t.m[p]
	delete(t.m, p)
	return a, ok
}

// Len returns how many allocations are live.
func (t *Allocations) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}
