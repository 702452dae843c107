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
// A block whose stream cudacore cannot vouch for when it is freed (allocated on an unwatched foreign
// stream, or on one whose watcher has gone) is an orphan: it cannot be ordered after its stream's work,
// so it stays off the allocator until every stream of the device has finished the work queued before its
// free (a device synchronize), and is then given back on the legacy stream. Orphans are given back in
// batches (orphanFlushBytes, orphanFlushCount), on release_cached_memory, and before an out-of-memory
// error is raised; until then they count as in use.

// foreignBooks is the process's record of watched foreign streams and of the blocks allocated on them.
type foreignBooks struct {
	mu      sync.RWMutex           // held for reading across a driver call on a watched handle
	watched map[cuda.Stream]uint64 // handle -> generation, while a watcher vouches for the stream
	next    uint64                 // the last generation handed out
	any     atomic.Bool            // whether any stream was ever watched: the hot paths' one load
	blocks  sync.Map               // cuda.DevicePtr -> generation: a block allocated on a watched stream
}

var foreign foreignBooks

// WatchStream records that the caller vouches for h, a stream cudacore did not create, until it calls
// StreamGone(h). The caller calls it while h is alive (inside a call that names it). Default streams and
// cudacore's own streams need no watcher and are ignored. It returns h's generation (0 when ignored).
func WatchStream(h cuda.Stream) uint64 {
	if stream.IsDefault(h) || ownStream(h) {
		return 0
	}
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
	foreign.any.Store(true)
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

// Watched says whether a watcher vouches for h now.
func Watched(h cuda.Stream) bool {
	if !foreign.any.Load() {
		return false
	}
	foreign.mu.RLock()
	defer foreign.mu.RUnlock()
	_, ok := foreign.watched[h]
	return ok
}

// ownStream says whether h names a stream cudacore created, on any open device: alive, closed or
// destroyed (stream.Manager.Owns).
func ownStream(h cuda.Stream) bool {
	owned := false
	streamManagers.Range(func(_, m any) bool {
		owned = m.(*stream.Manager).Owns(h)
		return !owned
	})
	return owned
}

// noteForeign records the generation of the foreign stream p was allocated on, when a watcher vouches
// for it; a block of an unwatched foreign stream needs no record (it is an orphan when freed).
func noteForeign(p cuda.DevicePtr, h cuda.Stream) {
	if !foreign.any.Load() || stream.IsDefault(h) {
		return
	}
	foreign.mu.RLock()
	g, ok := foreign.watched[h]
	foreign.mu.RUnlock()
	if ok {
		foreign.blocks.Store(p, g)
	}
}

// freeForeign frees p (size bytes), last used on h, a stream cudacore did not create, with no caller
// vouching for h now: on h while its watcher still vouches for the generation p was allocated under,
// else as an orphan (a flush, once due, runs on a goroutine of its own). The caller holds the allocator
// (inFlight).
func (d *Device) freeForeign(p cuda.DevicePtr, size uint64, h cuda.Stream) error {
	g, noted := foreign.blocks.LoadAndDelete(p)
	if noted {
		foreign.mu.RLock()
		if w, ok := foreign.watched[h]; ok && w == g.(uint64) {
			err := d.Memory().Deallocate(p, size, h)
			foreign.mu.RUnlock()
			if err != nil {
				foreign.blocks.Store(p, g) // still the owner's: a retried free takes the same way
			}
			return err
		}
		foreign.mu.RUnlock()
	}
	if d.orphans.add(p, size) && d.orphans.flushing.CompareAndSwap(false, true) {
		// On a goroutine of its own: the caller holds the allocator, and may hold the GIL or keep captures
		// from beginning (Steady), none of which may be held across the device synchronize.
		go func() {
			defer d.orphans.flushing.Store(false)
			_ = d.FlushOrphans()
		}()
	}
	return nil
}

// orphanFlushBytes and orphanFlushCount bound what waits as orphans before a free synchronizes the device
// to give them back.
const (
	orphanFlushBytes = 64 << 20
	orphanFlushCount = 1024
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
	flushing atomic.Bool // a flush started by a free is running
}

// add adds an orphan and says whether the orphans are due for a flush.
func (o *orphanage) add(p cuda.DevicePtr, size uint64) bool {
	o.mu.Lock()
	o.blocks = append(o.blocks, orphanBlock{p, size})
	n := len(o.blocks)
	o.mu.Unlock()
	return o.bytes.Add(size) >= orphanFlushBytes || n >= orphanFlushCount
}

// Orphaned returns the bytes of the device's orphans: freed by their owners, waiting for a device
// synchronize before the allocator may hand them out again.
func (d *Device) Orphaned() uint64 { return d.orphans.bytes.Load() }

// FlushOrphans synchronizes the device and gives its orphans back to the allocator on the legacy stream.
// While a capture forbids the synchronize nothing is given back and the orphans wait for a later flush.
// The caller holds none of the allocator (inFlight), the capture registry's locks (Steady) or the GIL
// across the call: it waits for the device.
func (d *Device) FlushOrphans() error {
	if d.orphans.bytes.Load() == 0 {
		return nil
	}
	o := &d.orphans
	o.mu.Lock()
	taken := o.blocks
	o.blocks = nil
	o.mu.Unlock()
	if len(taken) == 0 {
		return nil
	}
	// Every block's last work was queued before its free: once the device has finished what is queued
	// now, no stream uses them, and a free on any stream is safe.
	var err error
	if _, err = d.Streams().SynchronizeDevice(0, false); err == nil {
		err = captures.Steady(func() error {
			if Capturing() { // a capture began since the synchronize: its rules forbid the frees
				return cuda.NewError("cudacore.free", cuda.ErrorStreamCaptureUnsupported, "a capture is in progress")
			}
			d.inFlight.RLock()
			defer d.inFlight.RUnlock()
			for len(taken) > 0 {
				b := taken[0]
				if ferr := d.Memory().Deallocate(b.p, b.size, cuda.StreamLegacy); ferr != nil {
					return ferr
				}
				o.bytes.Add(^(b.size - 1))
				taken = taken[1:]
			}
			return nil
		})
	}
	if len(taken) > 0 { // kept for the next flush
		o.mu.Lock()
		o.blocks = append(taken, o.blocks...)
		o.mu.Unlock()
	}
	return err
}
