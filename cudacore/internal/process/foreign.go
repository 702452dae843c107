package process

import (
	"sync"
	"sync/atomic"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/stream"
)

// Streams cudacore did not create ("foreign" streams: CuPy's, PyTorch's, cuda.core's, a raw handle).
//
// The owner of a foreign stream may destroy it at any moment after the call that named it returns, and a
// destroyed stream's handle crashes the real driver. So a foreign handle reaches the driver only while
// cudacore knows the stream is alive:
//
//   - during the call that names it (an allocation on it, or a free that names it: PyTorch's free, a
//     cuda.core deallocation);
//   - afterwards, only while a watcher vouches for it: the Python layer watches stream objects whose
//     handle lives exactly as long as the object (CuPy's streams, PyTorch's) and calls StreamGone when the
//     object goes (WatchStream). A handle watched again after it went gets a new generation, and a block
//     allocated under the old one never reaches the new stream: the handle may name another stream now.
//
// Whether a block is foreign is decided when it is allocated, not when it is freed: the driver may have
// handed its stream's handle to a stream of cudacore's meanwhile, whose order says nothing of the old
// stream's work.
//
// A block whose stream cudacore cannot vouch for when it is freed (allocated on an unwatched foreign
// stream, or on one whose watcher has gone) is an orphan: it cannot be ordered after its stream's work,
// so it stays off the allocator until every stream of the device has finished the work queued before its
// free (a device synchronize), and is then given back on the legacy stream. Orphans are given back in
// batches (orphanFlushBytes, orphanFlushCount) on a goroutine of their own, on release_cached_memory, on
// a strategy change, and before an allocation that ran out of memory is tried again (the Python layer's
// FlushOrphans door, without the GIL); until then they count as in use.

// foreignBooks is the process's record of watched foreign streams and of the blocks allocated on
// foreign streams.
type foreignBooks struct {
	mu      sync.RWMutex           // held for reading across a driver call on a watched handle
	watched map[cuda.Stream]uint64 // handle -> generation, while a watcher vouches for the stream
	next    uint64                 // the last generation handed out
	// blocks maps each live block allocated on a foreign stream to the generation of its stream's watch
	// then (0: unwatched); count is how many it holds, so that frees skip it while it is empty.
	blocks sync.Map
	count  atomic.Int64
}

var foreign foreignBooks

// WatchStream records that the caller vouches for h, a stream cudacore did not create, until it calls
// StreamGone(h). The caller calls it while h is alive (inside a call that names it). Default streams and
// live streams of cudacore's need no watcher and are ignored. A handle of a stream cudacore destroyed is
// someone else's stream now (the driver hands handles out again), and stops counting as destroyed. It
// returns h's generation (0 when ignored).
func WatchStream(h cuda.Stream) uint64 {
	if stream.IsDefault(h) || liveOwnStream(h) {
		return 0
	}
	streamManagers.Range(func(_, m any) bool {
		m.(*stream.Manager).Reborn(h)
		return true
	})
	foreign.mu.Lock()
	defer foreign.mu.Unlock()
	if g, ok := foreign.watched[h]; ok {
		return g
	}
	if foreign.watched == nil {
		foreign.watched = map[cuda.Stream]uint64{}
	}
	foreign.next++
	foreign.watched[h] = foreign.next
	return foreign.next
}

// StreamGone ends the watch of h: its owner has destroyed it, or is about to. A free of h's handle in
// flight on another thread finishes first (the watch's lock); no later one reaches the driver. It says
// whether h was watched.
func StreamGone(h cuda.Stream) bool {
	foreign.mu.Lock()
	defer foreign.mu.Unlock()
	_, ok := foreign.watched[h]
	delete(foreign.watched, h)
	return ok
}

// liveOwnStream says whether h names a stream cudacore created and has not destroyed, on any open device.
func liveOwnStream(h cuda.Stream) bool {
	return anyManager(func(m *stream.Manager) bool { return m.OwnsLive(h) })
}

// anyManager says whether f holds for the stream manager of any open device.
func anyManager(f func(*stream.Manager) bool) bool {
	found := false
	streamManagers.Range(func(_, m any) bool {
		found = f(m.(*stream.Manager))
		return !found
	})
	return found
}

// noteForeign records p as allocated on h, a stream cudacore did not create (the caller knows), with the
// generation of h's watch (0: unwatched).
func noteForeign(p cuda.DevicePtr, h cuda.Stream) {
	foreign.mu.RLock()
	g := foreign.watched[h]
	foreign.mu.RUnlock()
	if _, loaded := foreign.blocks.Swap(p, g); !loaded {
		foreign.count.Add(1)
	}
}

// takeForeign takes p's record out of the foreign books: the generation it was allocated under, and
// whether it was allocated on a foreign stream at all. One atomic load while the books are empty.
func takeForeign(p cuda.DevicePtr) (uint64, bool) {
	if foreign.count.Load() == 0 {
		return 0, false
	}
	g, ok := foreign.blocks.LoadAndDelete(p)
	if !ok {
		return 0, false
	}
	foreign.count.Add(-1)
	return g.(uint64), true
}

// putForeign puts back the record takeForeign took, for a free that failed and may be retried.
func putForeign(p cuda.DevicePtr, g uint64) {
	if _, loaded := foreign.blocks.Swap(p, g); !loaded {
		foreign.count.Add(1)
	}
}

// freeForeign frees p (size bytes), allocated under generation g of h's watch, with no caller vouching
// for h now: on h while its watcher still vouches for that generation, else as an orphan. The caller
// holds the allocator (inFlight).
func (d *Device) freeForeign(p cuda.DevicePtr, size uint64, h cuda.Stream, g uint64) error {
	if g != 0 {
		foreign.mu.RLock()
		if w, ok := foreign.watched[h]; ok && w == g {
			err := d.Memory().Deallocate(p, size, h)
			foreign.mu.RUnlock()
			if err != nil {
				putForeign(p, g) // still the owner's: a retried free takes the same way
			}
			return err
		}
		foreign.mu.RUnlock()
	}
	d.orphan(p, size)
	return nil
}

// orphan adds p to the device's orphans, and starts a flush on a goroutine of its own once they are due:
// the caller holds the allocator, and may hold the GIL or keep captures from beginning (Steady), none of
// which may be held across the device synchronize.
func (d *Device) orphan(p cuda.DevicePtr, size uint64) {
	o := &d.orphans
	if o.add(p, size) && o.flushing.CompareAndSwap(false, true) {
		go func() {
			// Orphans added while a flush runs are not in it: flush again while they are due and the last
			// flush gave something back (one that a capture held off leaves them to the next orphan).
			for {
				before := o.given.Load()
				_ = d.flushOrphans()
				o.flushing.Store(false)
				if o.given.Load() == before || !o.due() || !o.flushing.CompareAndSwap(false, true) {
					return
				}
			}
		}()
	}
}

// orphanFlushBytes and orphanFlushCount bound what waits as orphans before a free synchronizes the device
// to give them back. Variables only so that tests can stretch them.
var (
	orphanFlushBytes uint64 = 64 << 20
	orphanFlushCount        = 1024
)

type orphanBlock struct {
	p    cuda.DevicePtr
	size uint64
}

// orphanage holds a device's orphans (see the top of this file).
type orphanage struct {
	mu       sync.Mutex
	blocks   []orphanBlock
	bytes    atomic.Uint64
	flushing atomic.Bool   // a flush started by a free is running
	flushMu  sync.Mutex    // one flush at a time: a second caller waits for the one in flight, then flushes the rest
	given    atomic.Uint64 // the bytes all flushes gave back so far
	reported atomic.Uint64 // given, as FlushOrphans last told its caller
}

// add adds an orphan and says whether the orphans are due for a flush.
func (o *orphanage) add(p cuda.DevicePtr, size uint64) bool {
	o.mu.Lock()
	o.blocks = append(o.blocks, orphanBlock{p, size})
	o.mu.Unlock()
	o.bytes.Add(size)
	return o.due()
}

// due says whether the orphans waiting are over the batch bounds.
func (o *orphanage) due() bool {
	o.mu.Lock()
	n := len(o.blocks)
	o.mu.Unlock()
	return o.bytes.Load() >= orphanFlushBytes || n >= orphanFlushCount
}

// Orphaned returns the bytes of the device's orphans: freed by their owners, waiting for a device
// synchronize before the allocator may hand them out again.
func (d *Device) Orphaned() uint64 { return d.orphans.bytes.Load() }

// FlushOrphans synchronizes the device and gives its orphans back to the allocator on the legacy stream
// (a flush in flight on a goroutine is waited for first), and returns the bytes given back since the last
// FlushOrphans returned, by any flush: a caller retrying an allocation that ran out of memory knows
// whether there is more room, also when a flush on a goroutine gave the orphans back just before.
func (d *Device) FlushOrphans() (uint64, error) {
	err := d.flushOrphans()
	given := d.orphans.given.Load()
	return given - d.orphans.reported.Swap(given), err
}

// flushOrphans is FlushOrphans without the report. While a capture runs nothing is given back
// and the orphans wait for a later flush. The synchronize runs while no capture can begin (Steady): a
// capture begun meanwhile would be invalidated by it. The caller holds none of the allocator (inFlight),
// the capture registry's locks (Steady) or the GIL across the call: it waits for the device, and work
// queued on the device may wait for the GIL (a host callback).
func (d *Device) flushOrphans() error {
	o := &d.orphans
	o.flushMu.Lock()
	defer o.flushMu.Unlock()
	if o.bytes.Load() == 0 {
		return nil
	}
	return captures.Steady(func() error {
		if Capturing() {
			return nil // the synchronize would be refused, or invalidate a capture: a later flush
		}
		// Every orphan's last work was queued before its free: once the device has finished what is queued
		// now, no stream uses them, and a free on any stream is safe.
		o.mu.Lock()
		taken := o.blocks
		o.blocks = nil
		o.mu.Unlock()
		if err := d.Driver().CtxSynchronize(d.Context()); err != nil {
			o.mu.Lock()
			o.blocks = append(taken, o.blocks...)
			o.mu.Unlock()
			return err
		}
		d.inFlight.RLock()
		defer d.inFlight.RUnlock()
		for i, b := range taken {
			if err := d.Memory().Deallocate(b.p, b.size, cuda.StreamLegacy); err != nil {
				o.mu.Lock()
				o.blocks = append(taken[i:], o.blocks...)
				o.mu.Unlock()
				return err
			}
			o.bytes.Add(^(b.size - 1))
			o.given.Add(b.size)
		}
		return nil
	})
}

// ExportStream is the stream that a consumer of block p (allocated on h) may be told to order its use
// after, as the CUDA Array Interface's "stream" says it: h while h is alive and its handle names it (a
// default stream, a live stream of cudacore's, or another library's stream whose watcher still vouches
// for the generation p was allocated under). ok is false when no stream is needed: h is a stream of
// cudacore's that is destroyed (its destruction waited for its work), or a stream nobody vouches for any
// more, whose handle must not reach the driver; then the device is synchronized first, so that work
// still queued on h has finished. That wait is refused while a capture runs (it would invalidate it).
func (d *Device) ExportStream(p cuda.DevicePtr, h cuda.Stream) (s cuda.Stream, ok bool, err error) {
	m := d.Streams()
	if stream.IsDefault(h) || m.OwnsLive(h) {
		return h, true, nil
	}
	if m.Owns(h) {
		return 0, false, nil
	}
	if g, found := foreign.blocks.Load(p); found && g.(uint64) != 0 {
		foreign.mu.RLock()
		cur, watched := foreign.watched[h]
		foreign.mu.RUnlock()
		if watched && cur == g.(uint64) {
			return h, true, nil
		}
	}
	err = captures.Steady(func() error {
		if Capturing() {
			return cuda.NewError("cudacore.cuda_array_interface", cuda.ErrorStreamCaptureUnsupported,
				"the buffer's stream belongs to another library and nobody vouches for it any more, so the "+
					"device must be synchronized before its memory is handed out, which a capture in progress "+
					"forbids: hand it out after the capture ends")
		}
		return d.Driver().CtxSynchronize(d.Context())
	})
	return 0, false, err
}
