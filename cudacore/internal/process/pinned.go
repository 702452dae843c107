package process

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
	"unsafe"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/memory"
	"github.com/cudacore/cudacore/pkg/stream"
)

// pinnedTable maps the address of each live pinned allocation to its slice, so that Python, which only
// holds the address, can free it, and so that an address not allocated here (or freed already) is an
// error instead of a double free.
type pinnedTable struct {
	mu   sync.Mutex
	res  *memory.Pinned
	live map[uintptr][]byte
	// failed holds allocations whose free waited (for a graph's destruction, or for the captures to end)
	// and then failed, or whose owner's collection failed to free them: no caller is left to retry them,
	// so the next FreePinned, and the release of cached memory, try again (retryFailed).
	failed [][]byte
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
	alloc := func() error {
		return d.unsafeSteady("allocate_pinned", "allocating pinned host memory (cuMemHostAlloc)",
			"allocate pinned memory before the capture and reuse it inside", func() (err error) {
				b, err = t.res.AllocateHost(uint64(size))
				return err
			})
	}
	err := alloc()
	if err != nil && errors.Is(err, cuda.ErrOutOfMemory) {
		// What cudacore keeps pinned goes back (the staging buffers no copy holds, frees that failed), and
		// the allocation is tried once more.
		_ = Steady(func() error { RetryPinnedFrees(); return d.Streams().ReleaseStaging() })
		if err = alloc(); err != nil && errors.Is(err, cuda.ErrOutOfMemory) {
			return 0, d.pinnedOOM(uint64(size), err)
		}
	}
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
// allocated and can be freed again; for an owner being collected (collected), which cannot try again,
// it is kept for a retry by a later free or the release of cached memory, and the error still returned.
func (d *Device) FreePinned(addr uintptr, collected bool) error {
	t := d.pinnedTable()
	t.mu.Lock()
	b, ok := t.live[addr]
	delete(t.live, addr)
	t.mu.Unlock()
	if !ok {
		return cuda.NewError("cudacore.free_pinned", cuda.ErrorInvalidValue,
			fmt.Sprintf("0x%x is not pinned memory allocated by cudacore on %s, or it was freed already", addr, d))
	}
	// The decision and a free made now run while no capture can begin or end (this door runs without the
	// GIL): between a capture's end and its graph taking over its uses, nothing would hold the memory.
	err := captures.Steady(func() error {
		t.retryFailed()
		return d.releasePinned(t, b)
	})
	if err != nil {
		// Still allocated: it stays live, so that the caller can free it again (and pinned_in_use, which
		// still counts it, can come back down), or, with no caller left, it waits for a retry.
		t.mu.Lock()
		if collected {
			t.failed = append(t.failed, b)
		} else {
			t.live[addr] = b
		}
		t.mu.Unlock()
		return err
	}
	return nil
}

// releasePinned frees b, a pinned allocation taken out of the table, once nothing can reach it any more,
// and returns the error of a free made now (one that waits reports nothing: no caller is left, and a
// failure is kept for a retry).
//   - A live graph that copies to or from it (or takes it as a kernel argument), on any device, would
//     read or write it at each launch: on the real driver a launch after the free faults the device (the
//     context is lost) or crashes. The free waits for the destruction of every such graph, as for device
//     memory (stream.Manager.FreeGraphAware); pinned_in_use counts it until then.
//   - During a capture it waits for the captures to end: the capture may name it (its graph then holds
//     it), and cuMemFreeHost during a GLOBAL (or this thread's THREAD_LOCAL) capture fails with 900 and
//     invalidates it. A PinnedBuffer collected by the GC can be freed at any moment, so the free made now
//     runs while no capture can begin (RunOrDefer).
//
// It takes no Steady itself: the frees that waited run where a capture ends, which holds the change
// lock; FreePinned calls it inside Steady.
func (d *Device) releasePinned(t *pinnedTable, b []byte) error {
	later := func() {
		if err := d.releasePinned(t, b); err != nil {
			t.mu.Lock()
			t.failed = append(t.failed, b)
			t.mu.Unlock()
		}
	}
	if Capturing() {
		DeferUntilNoCapture(later)
		return nil
	}
	p := stream.HostPtr(b)
	// Host addresses are never graph memory: only the uses of live graphs can hold it, and a graph of
	// any device may copy to or from pinned memory allocated through another.
	held := false
	streamManagers.Range(func(_, m any) bool {
		held, _ = m.(*stream.Manager).FreeGraphAware(p, uint64(len(b)), func() error { return nil }, later)
		return !held
	})
	if held {
		return nil
	}
	return captures.RunOrDefer(func() error { return t.res.FreeHost(b) })
}

// retryFailed frees again the allocations whose waiting free failed, unless a capture runs; those that
// fail again stay. The caller keeps captures from beginning or ending (Steady).
func (t *pinnedTable) retryFailed() {
	if Capturing() {
		return // a free now would wait again, and its failure would have no one to tell
	}
	t.mu.Lock()
	failed := t.failed
	t.failed = nil
	t.mu.Unlock()
	if len(failed) == 0 {
		return
	}
	var still [][]byte
	for _, b := range failed {
		if err := captures.RunOrDefer(func() error { return t.res.FreeHost(b) }); err != nil {
			still = append(still, b)
		}
	}
	t.mu.Lock()
	t.failed = append(t.failed, still...)
	t.mu.Unlock()
}

// RetryPinnedFrees frees again the pinned allocations of every device whose waiting free failed
// (release_cached_memory). The caller keeps captures from beginning (Steady).
func RetryPinnedFrees() {
	pinned.Range(func(_, v any) bool {
		v.(*pinnedTable).retryFailed()
		return true
	})
}

// PinnedStats returns the pinned resource's counters.
func (d *Device) PinnedStats() memory.PinnedStats { return d.pinnedTable().res.Stats() }

// pinnedOOM is the out-of-memory error of a pinned allocation of size bytes that failed twice: page-locked
// host memory, so the verdict is the process's own ("exhausted") or the request's size ("too_large", more
// than the host's memory); the message says what this process holds pinned.
func (d *Device) pinnedOOM(size uint64, cause error) error {
	op := "cudacore.allocate_pinned"
	var ce *cuda.Error
	if errors.As(cause, &ce) && ce.Op != "" {
		op = ce.Op
	}
	st := d.PinnedStats()
	staging := d.Streams().StagingBytes()
	verdict, lead, fix := memory.CauseExhausted, "memory exhausted by this process",
		"Close PinnedBuffers you no longer need, or allocate less; the host's limit on locked memory (ulimit -l, a container's memory limit) may be lower than its memory."
	if total := hostMemory(); total != 0 && size > total {
		verdict, lead, fix = memory.CauseTooLarge, "the request is larger than the host",
			"Pin less: copy through a smaller PinnedBuffer in pieces."
	}
	msg := fmt.Sprintf("%s: out of page-locked host memory allocating %s of pinned memory: this process holds %s in PinnedBuffers and %s in staging buffers. %s",
		lead, memory.FormatBytes(size), memory.FormatBytes(st.InUse), memory.FormatBytes(staging), fix)
	return cuda.NewError(op, cuda.ErrorOutOfMemory, msg,
		cuda.Field{Key: "cause", Value: verdict},
		cuda.Field{Key: "requested", Value: fmt.Sprint(size)},
		cuda.Field{Key: "pinned_in_use", Value: fmt.Sprint(st.InUse)},
		cuda.Field{Key: "pinned_staging", Value: fmt.Sprint(staging)},
		cuda.Field{Key: "device", Value: fmt.Sprint(d.Ordinal())})
}

// hostMemory is the host's physical memory in bytes, 0 if unknown.
func hostMemory() uint64 {
	var si syscall.Sysinfo_t
	if syscall.Sysinfo(&si) != nil {
		return 0
	}
	return uint64(si.Totalram) * uint64(si.Unit)
}
