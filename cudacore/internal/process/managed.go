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
	n     atomic.Int32 // live allocations: Free skips the table when zero
	mu    sync.Mutex
	live  map[cuda.DevicePtr]uint64
	inUse uint64
}

// AllocateManaged allocates size bytes of managed memory, attached globally (every stream may use it).
// It is a synchronous allocation, so it is refused while a capture forbids those on this thread.
func (d *Device) AllocateManaged(size uint64) (cuda.DevicePtr, error) {
	const op = "allocate_managed"
	if size == 0 {
		return 0, cuda.NewError("cudacore."+op, cuda.ErrorInvalidValue, "nbytes must be positive")
	}
	if Capturing() {
		if err := d.Streams().CheckUnsafe(op, "a managed allocation (cuMemAllocManaged is synchronous)",
			"allocate before the capture and reuse the buffer inside it"); err != nil {
			return 0, err
		}
	}
	p, err := d.Driver().MemAllocManaged(d.Context(), size, cuda.MemAttachGlobal)
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
	t.n.Store(int32(len(t.live)))
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
	t.mu.Unlock()
	if !ok {
		return false, nil
	}
	if have != size {
		return true, cuda.NewError("cudacore.free", cuda.ErrorInvalidValue, fmt.Sprintf(
			"managed memory %#x was allocated with %d bytes, not %d", uint64(p), have, size))
	}
	free := func() error {
		if err := d.Driver().MemFree(d.Context(), p); err != nil {
			return err
		}
		t.mu.Lock()
		if _, ok := t.live[p]; ok {
			delete(t.live, p)
			t.inUse -= size
			t.n.Store(int32(len(t.live)))
		}
		t.mu.Unlock()
		return nil
	}
	// cuMemFree synchronizes: it runs now only while no capture can begin, else once the captures end.
	return true, captures.RunOrDefer(free)
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
