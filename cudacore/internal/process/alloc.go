package process

import (
	"fmt"

	"github.com/cudacore/cudacore/pkg/device"
	"github.com/cudacore/cudacore/pkg/memory"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/stream"
)

// Allocate and Free are the one way device memory is handed out and taken back by address: the fast path
// (Buffer) and the framework allocators (PyTorch's pluggable allocator) both come through here, so the
// stream and capture rules hold for every caller.

// Allocate allocates size bytes ordered on h. An allocation on a stream cudacore destroyed is refused
// (pkg/stream/lifetime.go); while a stream captures, the capture rules apply (an allocation that would
// invalidate a capture is refused, one on the capturing stream is counted into its graph).
func (d *Device) Allocate(size uint64, h cuda.Stream) (cuda.DevicePtr, error) {
	d.inFlight.RLock() // the allocator cannot be replaced (SetStrategy) while a call uses it
	defer d.inFlight.RUnlock()
	capturing := Capturing()
	if !capturing && stream.IsDefault(h) {
		p, err := d.Memory().Allocate(size, h) // the common case: no stream to check, nothing captures
		if err == nil {
			d.reissued(p)
		}
		return p, err
	}
	streams := d.Streams()
	// Whose stream h is, decided before its use is bracketed (UseForAlloc holds the lifetimes' read lock
	// until Done, which Owns takes again): a live handle cannot become cudacore's meanwhile.
	own := streams.Owns(h)
	if err := streams.UseForAlloc(h); err != nil {
		return 0, err
	}
	defer streams.Done(h)
	if capturing {
		if err := streams.CheckAllocate(h); err != nil {
			return 0, err
		}
	}
	p, err := d.Memory().Allocate(size, h)
	if err != nil {
		return 0, err
	}
	if capturing {
		streams.NoteAllocate(h, p, size)
		streams.NoteEscape("allocate", h)
	} else {
		streams.Reissued(p)
	}
	if !own {
		noteForeign(p, h) // whose stream h is can change before the free: decided now
	}
	return p, nil
}

// reissued tells the graph-memory books that p was handed out (stream.Manager.Reissued): one atomic load
// while no graph memory is void.
func (d *Device) reissued(p cuda.DevicePtr) {
	if m := d.streams.Load(); m != nil {
		m.Reissued(p)
	}
}

// AllocateTiles allocates count tiles of size bytes ordered on h, all or nothing (memory.Stack's
// AllocateTiles), under the same stream-lifetime and capture rules as Allocate: tiles allocated on a
// capturing stream are counted into its graph like any other allocation.
//
// The call releases the GIL, so a capture may begin, or end, on another thread while the tiles are made:
// each tile is allocated, and each free and the cache release of a rollback made, under the rules of the
// moment it runs (tileResource), never those of when the call began. Allocated as if nothing captured, a
// tile made on h after a capture of h began was an allocation node of that capture at the driver booked
// as ordinary memory (fuzzer seed 103919), and a rollback free during a GLOBAL capture invalidated it
// (seed 5858).
//
// Nothing is held across the call: each tile holds the allocator (inFlight) and its stream's lifetime on
// its own, as each free of a rollback does. A lock held across the call would be taken a second time by
// the rollback on the same goroutine, which for a read lock deadlocks once a writer waits in between (a
// stream created on another thread meanwhile: seed 103992). A stream destroyed part way fails the next
// tile, and the rollback frees the earlier ones on the legacy stream, as any free on a destroyed stream.
//
// It returns the tiles and, for each, its owner token (as AllocateOwned; 0 for none).
func (d *Device) AllocateTiles(count int, size uint64, h cuda.Stream, progress func(done, total int) bool) ([]cuda.DevicePtr, []uint64, error) {
	streams := d.Streams()
	if err := streams.UseForAlloc(h); err != nil { // a destroyed stream is refused before any tile
		return nil, nil, err
	}
	streams.Done(h)
	if Capturing() { // what a capture forbids now is refused before any tile, with Allocate's error
		if err := streams.CheckAllocate(h); err != nil {
			return nil, nil, err
		}
	}
	r := &tileResource{d: d}
	ptrs, err := memory.AllocateTiles(r, count, size, h, progress)
	if err != nil {
		return nil, nil, err
	}
	tokens := make([]uint64, len(ptrs))
	for i, p := range ptrs {
		tokens[i] = r.tokens[p]
	}
	return ptrs, tokens, nil
}

// Free frees p (size bytes, last used on h). While a capture runs, a free waits for the captures to end
// unless p is graph memory of h's own capture: it could be an unsafe call (900) or use the legacy stream
// (906) and invalidate the capture, the driver refuses a free of older memory on the capturing stream,
// and a garbage collector may free a buffer at any moment. A free of graph memory on the capturing stream
// becomes a graph node. A free recorded against a stream destroyed meanwhile is ordered on the legacy
// stream: a destroyed stream's handle never reaches the driver.
//
// Graph memory (allocated during a capture) and memory a live graph uses follow the graph's rules
// (stream.Manager.FreeGraphAware): a free of memory a live graph uses waits until that graph is
// destroyed, so that no launch writes into memory handed to someone else.
func (d *Device) Free(p cuda.DevicePtr, size uint64, h cuda.Stream) error {
	return d.free(p, size, h, d.freeNow, 0)
}

// AllocateSteady is Allocate for a caller that may not hold the GIL (PyTorch's allocator, and the
// Allocate door on a device with the synchronous strategy): the capture rules' check and the driver's
// allocation run while no capture can begin (Steady), so that a capture begun on another thread between
// the two cannot see the allocation (900 outside the capture, which would invalidate it).
func (d *Device) AllocateSteady(size uint64, h cuda.Stream) (p cuda.DevicePtr, err error) {
	p, _, err = d.AllocateOwned(size, h)
	return p, err
}

// AllocateOwned is AllocateSteady that also returns the owner token of an allocation made during a
// capture (stream.Manager.Token; 0 for any other), which the owner passes back with its free (FreeOwned).
// It is read in the same steady state as the allocation: no capture can end in between and void the
// memory, and a token looked up by address later could be a newer owner's, once the address was handed
// out again.
func (d *Device) AllocateOwned(size uint64, h cuda.Stream) (p cuda.DevicePtr, token uint64, err error) {
	err = captures.Steady(func() error {
		if p, err = d.Allocate(size, h); err == nil && d.Streams().Captured(h, p) {
			token = d.Streams().Token(p) // an earlier owner's token lingering at p is not this one's
		}
		return err
	})
	return p, token, err
}

// FreeSteady is Free for a caller that does not hold the GIL (PyTorch's allocator), against which a
// capture may begin on another thread at any moment: the capture check and whatever follows from it (a
// free made at once, or one queued until the captures end) run while none can begin or end (Steady), so
// that the driver's free cannot meet a capture that began after the check (900 in GLOBAL mode, which
// would invalidate it). A free of graph memory of h's own capture, a free node of it, is made inside
// Steady too (freeNode), so that the capture cannot end and void the memory in between; only the handling
// of a failed free node runs outside, since ending the capture it invalidated takes the change lock.
// (Deciding inside Steady and freeing through Free outside it let the capture end and another begin
// between Free's own check and the driver's free.)
func (d *Device) FreeSteady(p cuda.DevicePtr, size uint64, h cuda.Stream) error {
	return d.FreeOwned(p, size, h, 0)
}

// FreeOwned is FreeSteady for the owner of p that holds an owner token (stream.Manager.Token; 0 for
// none): a free of stale memory (void graph memory, whose address the driver may have handed to another
// owner since) frees nothing, now or when a free that waited for the captures to end runs. The token is
// checked while no capture can end (Steady), so memory cannot go void by a capture's end between the
// check and the free; a graph destroyed meanwhile on another thread could void it, which the GIL rules
// out for the Buffers that carry tokens (their frees hold it: tokens exist only with memory pools).
func (d *Device) FreeOwned(p cuda.DevicePtr, size uint64, h cuda.Stream, token uint64) error {
	return d.freeOwned(p, size, h, token, d.freeNow)
}

// FreeNamed is FreeSteady for a caller that names h in this very call and vouches that it is alive now
// (PyTorch's free, which passes the allocation's stream; a cuda.core deallocation on the stream it names):
// the free made at once is ordered on h even where h is a stream cudacore did not create and no watcher
// vouches for (foreign.go). A free that waits for the captures to end is made later, by then without
// anyone vouching for h, and takes Free's way.
func (d *Device) FreeNamed(p cuda.DevicePtr, size uint64, h cuda.Stream) error {
	return d.freeOwned(p, size, h, 0, d.freeNamedNow)
}

func (d *Device) freeOwned(p cuda.DevicePtr, size uint64, h cuda.Stream, token uint64, now func(cuda.DevicePtr, uint64, cuda.Stream) error) error {
	disownAt(d, p) // its owner by address frees it: an owner token of its making must not free it again
	streams := d.Streams()
	node := false
	var nodeErr error
	err := captures.Steady(func() error {
		if token != 0 && streams.TokenStale(p, token) {
			return nil
		}
		if handled, err := d.freeManaged(p, size); handled {
			return err
		}
		if Capturing() {
			// A free node of its own capture, or queued until the captures end (freeDuringCapture).
			if node, nodeErr = d.freeNode(p, size, h); !node {
				d.freeAfterCaptures(p, size, h, token)
			}
			return nil
		}
		if token != 0 {
			streams.DropToken(p, token) // freed now: nothing can void it any more
		}
		return d.freeIdle(p, size, h, now)
	})
	if node {
		if nodeErr != nil {
			return d.freeNodeFailed(p, h, token, nodeErr)
		}
		if token != 0 {
			streams.DropToken(p, token)
		}
	}
	return err
}

// free is Free, with now as the free made at once when no capture runs (d.freeNow, or the tile rollback's
// free with the capture registry held): every free of device memory by address takes these rules.
func (d *Device) free(p cuda.DevicePtr, size uint64, h cuda.Stream, now func(cuda.DevicePtr, uint64, cuda.Stream) error, token uint64) error {
	if handled, err := d.freeManaged(p, size); handled {
		return err
	}
	if Capturing() {
		return d.freeDuringCapture(p, size, h, token)
	}
	return d.freeIdle(p, size, h, now)
}

// freeIdle is free when no capture was found running: graph memory of ended captures and memory live
// graphs use follow their graphs' rules (FreeGraphAware), anything else is freed with now.
func (d *Device) freeIdle(p cuda.DevicePtr, size uint64, h cuda.Stream, now func(cuda.DevicePtr, uint64, cuda.Stream) error) error {
	streams := d.Streams()
	if !streams.GraphMemoryInUse() {
		return now(p, size, h) // the common case, without the callbacks' allocation
	}
	handled, err := streams.FreeGraphAware(p, size,
		func() error { return now(p, size, h) },
		func() { _ = d.Free(p, size, stream.Later(h)) })
	if handled {
		return err
	}
	return now(p, size, h)
}

// freeDuringCapture is Free while a capture runs: graph memory of h's capture is freed as a free node of
// it (freeNode); anything else waits for the captures to end (freeAfterCaptures). The caller does not
// hold Steady; the decision and the free node are made inside it.
func (d *Device) freeDuringCapture(p cuda.DevicePtr, size uint64, h cuda.Stream, token uint64) error {
	node := false
	var err error
	_ = captures.Steady(func() error {
		node, err = d.freeNode(p, size, h)
		return nil
	})
	if !node {
		d.freeAfterCaptures(p, size, h, token)
		return nil
	}
	if err != nil {
		return d.freeNodeFailed(p, h, token, err)
	}
	return nil
}

// freeNode frees p as a free node of h's capture when p is graph memory of that capture (GraphMemory),
// and says whether it was; the caller holds Steady. The decision, the driver's free and its booking
// (NoteFree) are one step that no capture's end can come between: an end in between (the stream
// destroyed, or the capture aborted or ended, on another thread) voids p, taking it off the books, and
// the free would then take it off a second time (or free an address the driver may have handed out
// again). A failed free node is left to freeNodeFailed, outside Steady: ending the capture it
// invalidated takes the change lock.
func (d *Device) freeNode(p cuda.DevicePtr, size uint64, h cuda.Stream) (node bool, err error) {
	streams := d.Streams()
	if !Capturing() || !streams.GraphMemory(h, p) {
		return false, nil
	}
	if err := d.freeNow(p, size, h); err != nil {
		return true, err
	}
	streams.NoteFree(h, p)
	return true, nil
}

// freeNodeFailed reports the failure err of the free node of p on h: when the driver had invalidated the
// capture, ending it (Manager.Failed) discards its graph memory, p with it, so nothing is left to free.
func (d *Device) freeNodeFailed(p cuda.DevicePtr, h cuda.Stream, token uint64, err error) error {
	streams := d.Streams()
	err = streams.Failed("free", h, err)
	if stream.IsCaptureResult(cuda.ResultOf(err)) {
		if token != 0 && streams.ForgetVoid(p, token) || token == 0 && streams.ForgetVoidAt(p) {
			return nil
		}
	}
	return err
}

// freeAfterCaptures queues the free of p until the captures end (made before the capture, or on another
// stream), also when h itself captures (the driver refuses it there). A free that waits and holds an
// owner token frees nothing if the memory went void meanwhile (the capture that allocated it failed,
// say): by then the driver may have handed the address to another owner.
func (d *Device) freeAfterCaptures(p cuda.DevicePtr, size uint64, h cuda.Stream, token uint64) {
	streams := d.Streams()
	later := stream.Later(h)
	DeferUntilNoCapture(func() {
		if token != 0 {
			if streams.TokenStale(p, token) {
				return
			}
			streams.DropToken(p, token)
		}
		_ = d.Free(p, size, later)
	})
}

// freeNow frees p at once, ordered on h. A block of the per-thread default stream is freed on the legacy
// stream (stream.Later): the per-thread handle names the calling thread's stream, which need not be the
// stream whose work used the block (a Buffer allocated on one thread and closed on another), and only the
// legacy stream waits for the work of every thread's per-thread stream.
//
// A block of a stream cudacore did not create is freed on that stream only while a watcher vouches for it,
// else it waits as an orphan for a device synchronize (freeForeign): nobody names the stream in this
// call, and its owner may have destroyed it.
func (d *Device) freeNow(p cuda.DevicePtr, size uint64, h cuda.Stream) error {
	return d.freeAt(p, size, h, false)
}

// freeNamedNow is freeNow for a caller that names h in this call and vouches for it (FreeNamed).
func (d *Device) freeNamedNow(p cuda.DevicePtr, size uint64, h cuda.Stream) error {
	return d.freeAt(p, size, h, true)
}

func (d *Device) freeAt(p cuda.DevicePtr, size uint64, h cuda.Stream, named bool) error {
	d.inFlight.RLock()
	defer d.inFlight.RUnlock()
	g, foreignBlock := takeForeign(p) // allocated on a stream cudacore did not create
	if stream.IsDefault(h) {
		return d.Memory().Deallocate(p, size, stream.Later(h))
	}
	// Not recorded as another library's, and this device's own stream (Allocate decides the same way).
	if streams := d.Streams(); !foreignBlock && streams.Owns(h) {
		use := streams.UseForFree(h)
		defer streams.Done(h)
		return d.Memory().Deallocate(p, size, use)
	}
	switch {
	case named: // the caller vouches for h in this call
		err := d.Memory().Deallocate(p, size, h)
		if err != nil && foreignBlock {
			putForeign(p, g)
		}
		return err
	case foreignBlock:
		return d.freeForeign(p, size, h, g)
	default: // a block of a stream nobody vouches for
		d.orphan(p, size)
		return nil
	}
}

// Order makes work queued on waiter wait for the work queued so far on producer (stream.Manager.Order).
// A producer stream that cudacore destroyed is never passed on: destroying a stream lets its queued work
// finish, and nothing can be queued on it afterwards, so there is nothing left to wait for.
func (d *Device) Order(op string, waiter, producer cuda.Stream) error {
	streams := d.Streams()
	// The waiter is the consumer's stream: the caller vouches for it, but a handle of a stream cudacore
	// destroyed, on any device, is known here and must not reach the driver (it would crash there).
	if !stream.IsDefault(waiter) && destroyedAnywhere(waiter) {
		return cuda.NewError("cudacore."+op, cuda.ErrorClosed, fmt.Sprintf(
			"the consumer's stream %#x was closed; pass a live stream (or -1 for no ordering)", uint64(waiter)))
	}
	// Order brackets the producer itself, around its enqueue only (a bracket held across the call would be
	// taken again by the handling of a capture failure: stream.Manager.EnqueueOn).
	err := streams.Order(op, waiter, producer)
	if err != nil && cuda.ResultOf(err) == cuda.ErrorClosed && streams.Destroyed(producer) {
		return nil
	}
	return err
}

// tileResource is the device's allocator as AllocateTiles uses it, with the rules of a free and of a
// cache release at the moment each is made.
type tileResource struct {
	d      *Device
	tokens map[cuda.DevicePtr]uint64 // the owner token of each tile made during a capture
}

// Allocate makes a tile as Device.Allocate allocates, under the rules of this moment: on a stream that
// captures now it is an allocation of the capture, counted into its graph.
//
// The call runs without the GIL, so a capture can begin or end on another thread meanwhile: the check of
// whether h captures, the driver's allocation and its booking are made while none does (Steady).
func (t *tileResource) Allocate(size uint64, h cuda.Stream) (p cuda.DevicePtr, err error) {
	p, token, err := t.d.AllocateOwned(size, h)
	if token != 0 {
		if t.tokens == nil {
			t.tokens = map[cuda.DevicePtr]uint64{}
		}
		t.tokens[p] = token
	}
	return p, err
}

// Deallocate frees a tile of a failed call by Free's rules (free): graph memory of a capture, in progress
// or ended meanwhile, follows its graph's rules, and a free while a capture runs is a free node of h's own
// capture or waits for the captures to end. The free made at once runs while no capture can begin
// (steadyOrDefer), so that a capture begun on another thread meanwhile cannot see it (an unsafe call in
// GLOBAL mode).
//
// A tile made during a capture frees nothing once its memory went void (its owner token is stale: the
// capture was aborted before the rollback, and the address may be another owner's by now).
func (t *tileResource) Deallocate(p cuda.DevicePtr, size uint64, h cuda.Stream) error {
	d := t.d
	token := t.tokens[p]
	delete(t.tokens, p)
	if token != 0 && d.Streams().TokenStale(p, token) {
		return nil
	}
	return d.free(p, size, h, func(p cuda.DevicePtr, size uint64, h cuda.Stream) error {
		return steadyOrDefer(func(later bool) error {
			// Asked again while no capture can begin or end: the memory may have gone void since the
			// first check (its capture aborted, or its stream destroyed, on another thread), or while
			// the free waited for the captures to end.
			if token != 0 && d.Streams().TokenStale(p, token) {
				return nil
			}
			if later {
				h = stream.Later(h)
			}
			err := d.freeNow(p, size, h)
			if err == nil && token != 0 {
				d.Streams().DropToken(p, token) // freed: nothing can void it any more
			}
			return err
		})
	}, token)
}

// Release gives the cache back after a failed call, once no capture runs (a release is unsafe during
// one), while none can begin (steadyOrDefer).
func (t *tileResource) Release() error {
	return steadyOrDefer(func(bool) error {
		t.d.inFlight.RLock()
		defer t.d.inFlight.RUnlock()
		return t.d.Memory().Release()
	})
}

// steadyOrDefer runs fn, a call that a capture forbids, now if no capture is in progress, while none can
// begin or end (Steady), else once the last one ends (Defer: the deferred calls run while the capture
// that ended still holds the registry's change lock, so that none begins then either). fn takes the
// allocator (inFlight), so it must not run under the registry's mutex as RunOrDefer runs it: the mutex
// comes after the allocator in the lock order (Device.inFlight). fn is told whether it runs later, on
// whichever thread ends the last capture (see stream.Later). It returns fn's error when fn ran now.
func steadyOrDefer(fn func(later bool) error) error {
	return captures.Steady(func() error {
		if Capturing() {
			DeferUntilNoCapture(func() { _ = fn(true) })
			return nil
		}
		return fn(false)
	})
}

// Device makes the out-of-memory verdict of a failed tile name the device.
func (t *tileResource) Device() *device.Device { return t.d.Device }

// Unwrap is the device's allocator: an out-of-memory error reads what it caches and its block sizes.
func (t *tileResource) Unwrap() memory.Resource { return t.d.Memory() }
