package process

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/memory"
)

// pinnedTable maps the address of each live pinned allocation to its slice, so that Python, which only
// holds the address, can free it, and so that an address not allocated here (or freed already) is an
// error instead of a double free.
type pinnedTable struct {
	mu   sync.Mutex
	res  *memory.Pinned
	live map[uintptr][]byte
}

var pinned sync.Map // ordinal -> *pinnedTable

func (d *Device) pinnedTable() *pinnedTable {
	if t, ok := pinned.Load(d.Ordinal()); ok {
		return t.(*pinnedTable)
	}
	t, _ := pinned.LoadOrStore(d.Ordinal(), &pinnedTable{res: memory.NewPinned(d.Device, 0), live: map[uintptr][]byte{}})
	return t.(*pinnedTable)
}

// AllocPinned allocates size bytes of page-locked host memory and returns its address. The caller owns
// it until FreePinned.
func (d *Device) AllocPinned(size int64) (uintptr, error) {
	if size <= 0 {
		return 0, cuda.NewError("cudacore.allocate_pinned", cuda.ErrorInvalidValue,
			fmt.Sprintf("size must be positive, got %d", size))
	}
	t := d.pinnedTable()
	var b []byte
	err := d.unsafeSteady("allocate_pinned", "allocating pinned host memory (cuMemHostAlloc)",
		"allocate pinned memory before the capture and reuse it inside", func() (err error) {
			b, err = t.res.AllocateHost(uint64(size))
			return err
		})
	if err != nil {
		return 0, err
	}
	addr := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	t.mu.Lock()
	t.live[addr] = b
	t.mu.Unlock()
	return addr, nil
}

// FreePinned frees pinned memory that AllocPinned returned. If the driver refuses, the memory stays
// allocated and can be freed again.
func (d *Device) FreePinned(addr uintptr) error {
	t := d.pinnedTable()
	t.mu.Lock()
	b, ok := t.live[addr]
	delete(t.live, addr)
	t.mu.Unlock()
	if !ok {
		return cuda.NewError("cudacore.free_pinned", cuda.ErrorInvalidValue,
			fmt.Sprintf("0x%x is not pinned memory allocated by cudacore on %s, or it was freed already", addr, d))
	}
	// cuMemFreeHost during a GLOBAL (or this thread's THREAD_LOCAL) capture fails with 900 and
	// invalidates it, and a PinnedBuffer collected by the GC can be freed at any moment: the free runs now
	// only while no capture can begin, else once the captures end.
	if err := captures.RunOrDefer(func() error { return t.res.FreeHost(b) }); err != nil {
		// Still allocated: it stays live, so that the caller can free it again (and pinned_in_use, which
		// still counts it, can come back down).
		t.mu.Lock()
		t.live[addr] = b
		t.mu.Unlock()
		return err
	}
	return nil
}

// PinnedStats returns the pinned resource's counters.
func (d *Device) PinnedStats() memory.PinnedStats { return d.pinnedTable().res.Stats() }
