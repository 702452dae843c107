package process

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// Managed (unified) memory: cuMemAllocManaged allocations, accessible from the host and every device,
// that the driver migrates on demand. They are kept apart from the device's allocator (they are neither
// pool memory nor cacheable) and freed through Free like every Buffer, which finds them here first.
type managedTable struct {
	n       atomic.Int32 // live allocations: Free skips the table when zero
	mu      sync.Mutex
	live    map[cuda.DevicePtr]uint64
	pending map[cuda.DevicePtr]struct{} // out of live, their free waiting for the captures to end
	inUse   uint64
}

func (t *managedTable) freeing(p cuda.DevicePtr) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.pending[p]
	return ok
}

// AllocateManaged allocates size bytes of managed memory, attached globally (every stream may use it).
// It is a synchronous allocation, so it is refused while a capture forbids those on this thread.
func (d *Device) AllocateManaged(size uint64) (cuda.DevicePtr, error) {
	const op = "allocate_managed"
	if size == 0 {
		return 0, cuda.NewError("cudacore."+op, cuda.ErrorInvalidValue, "nbytes must be positive")
	}
	// Out of memory, cudacore's caches go back and the allocation is tried once more (allocOutside).
	p, err := d.allocOutside(size, func() (p cuda.DevicePtr, err error) {
		err = d.unsafeSteady(op, "a managed allocation (cuMemAllocManaged is synchronous)",
			"allocate before the capture and reuse the buffer inside it", func() (err error) {
				p, err = d.Driver().MemAllocManaged(d.Context(), size, cuda.MemAttachGlobal)
				return err
			})
		return p, err
	})
	if err != nil {
		return 0, err
	}
	t := &d.managed
	t.mu.Lock()
	if t.live == nil {
		t.live = map[cuda.DevicePtr]uint64{}
	}
	t.live[p] = size
	t.inUse += size
	t.n.Store(int32(len(t.live) + len(t.pending)))
	t.mu.Unlock()
	return p, nil
}

// freeManaged frees p if it is a managed allocation of d (handled), after the captures end if any is in
// progress (cuMemFree synchronizes). A failure leaves p allocated, so the free can be retried.
func (d *Device) freeManaged(p cuda.DevicePtr, size uint64) (handled bool, err error) {
	t := &d.managed
	if t.n.Load() == 0 {
		return false, nil
	}
	t.mu.Lock()
	have, ok := t.live[p]
	if ok && have == size {
		// Out of the table before the free, which may wait for the captures to end: a second free of p
		// meanwhile is refused below rather than queued (it could free a later allocation at p).
		delete(t.live, p)
	}
	t.mu.Unlock()
	if !ok {
		if t.freeing(p) {
			return true, cuda.NewError("cudacore.free", cuda.ErrorInvalidValue, fmt.Sprintf(
				"managed memory %#x is being freed already", uint64(p)))
		}
		return false, nil
	}
	if have != size {
		return true, cuda.NewError("cudacore.free", cuda.ErrorInvalidValue, fmt.Sprintf(
			"managed memory %#x was allocated with %d bytes, not %d", uint64(p), have, size))
	}
	t.mu.Lock()
	if t.pending == nil {
		t.pending = map[cuda.DevicePtr]struct{}{}
	}
	t.pending[p] = struct{}{}
	t.mu.Unlock()
	free := func() error {
		err := d.Driver().MemFree(d.Context(), p)
		t.mu.Lock()
		delete(t.pending, p)
		if err != nil {
			t.live[p] = size // still allocated: it can be freed again
		} else {
			t.inUse -= size
		}
		t.n.Store(int32(len(t.live) + len(t.pending)))
		t.mu.Unlock()
		return err
	}
	// During a capture, which may name the memory, whether a graph holds it is decided once the captures
	// ended and their graphs took their uses (the deferred calls run then): decided now, a capture's
	// graph would not be among the users yet, and the free would come before the graph's launches.
	if Capturing() {
		DeferUntilNoCapture(func() { _ = d.releaseManaged(p, size, free) })
		return true, nil
	}
	return true, d.releaseManaged(p, size, free)
}

// releaseManaged frees the managed allocation at p (by free) unless a live graph uses it (a copy or
// kernel it captured names it): then the free waits for the destruction of every such graph, pending
// meanwhile (in managed_in_use, a second free refused). cuMemFree synchronizes: it runs now only while
// no capture can begin, else once the captures end.
func (d *Device) releaseManaged(p cuda.DevicePtr, size uint64, free func() error) error {
	if held, _ := d.Streams().FreeGraphAware(p, size, func() error { return nil },
		func() { _ = captures.RunOrDefer(free) }); held {
		return nil
	}
	return captures.RunOrDefer(free)
}

// ManagedRange checks that [p, p+n) lies inside one live managed allocation of d.
func (d *Device) ManagedRange(op string, p cuda.DevicePtr, n uint64) error {
	t := &d.managed
	t.mu.Lock()
	defer t.mu.Unlock()
	for base, size := range t.live {
		if p >= base && n <= size && uint64(p-base) <= size-n {
			return nil
		}
	}
	return cuda.NewError("cudacore."+op, cuda.ErrorInvalidValue, fmt.Sprintf(
		"[%#x, +%d) is not inside a live managed allocation of device %d (allocate it with allocate_managed)",
		uint64(p), n, d.Ordinal()))
}

// ManagedInUse returns the bytes of managed memory allocated and not freed, and how many allocations.
func (d *Device) ManagedInUse() (bytes uint64, count int) {
	t := &d.managed
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inUse, len(t.live)
}
