package process

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/memory"
)

// Owned memory: what a call allocates (or maps) on behalf of a Python owner that names itself in the call
// by a token, made before the call. The call records what it made under the token before it returns, so
// nothing is lost if the caller never sees the result (a KeyboardInterrupt between the call's return and
// the owner's bookkeeping): the owner frees by its token (FreeToken), and a token freed twice, or
// never given anything, frees nothing. An owner whose memory goes to another owner by address (a C Buffer
// of cudacore._fast) gives up its token (Disown) once that owner holds it; a free by address of a
// recorded block (that C Buffer freeing it before the disowning) drops its record first (disownAt), so
// the token's free does not free it again.

// Kinds of owned memory, as memory_stats and the leak check count them.
const (
	OwnedShared   = "shared"   // a SharedBuffer's allocation (allocate_shareable)
	OwnedImported = "imported" // another process's memory mapped here (IpcHandle.open)
	OwnedManaged  = "managed"  // a ManagedBuffer's allocation, until the C Buffer holds it
	OwnedTile     = "tile"     // a tile of allocate_tiles, until its C Buffer holds it
)

type ownedEntry struct {
	d    *Device
	p    cuda.DevicePtr
	size uint64
	kind string
	free func() error // the one free of this entry, by its kind's rules
}

var owned struct {
	n  atomic.Int64 // entries recorded: frees by address skip the table while zero
	mu sync.Mutex
	m  map[uint64][]ownedEntry
}

// Own records that token's owner holds [p, p+size) of d, freed by free. Token 0 records nothing (a caller
// that keeps the address itself).
func Own(token uint64, d *Device, p cuda.DevicePtr, size uint64, kind string, free func() error) {
	if token == 0 {
		return
	}
	owned.mu.Lock()
	if owned.m == nil {
		owned.m = map[uint64][]ownedEntry{}
	}
	owned.m[token] = append(owned.m[token], ownedEntry{d, p, size, kind, free})
	owned.n.Add(1)
	owned.mu.Unlock()
}

// Disown forgets token's entries without freeing them: their memory has another owner now.
func Disown(token uint64) {
	owned.mu.Lock()
	owned.n.Add(-int64(len(owned.m[token])))
	delete(owned.m, token)
	owned.mu.Unlock()
}

// FreeToken frees every entry token still holds. An entry is out of the table while its free runs, so a
// concurrent FreeToken of the same token cannot free it twice; a failed free puts it back (it can be freed
// again) and is returned, after the other entries were tried.
func FreeToken(token uint64) error {
	owned.mu.Lock()
	entries := owned.m[token]
	delete(owned.m, token)
	owned.n.Add(-int64(len(entries)))
	owned.mu.Unlock()
	var first error
	for _, e := range entries {
		if err := e.free(); err != nil {
			Own(token, e.d, e.p, e.size, e.kind, e.free)
			if first == nil {
				first = err
			}
		}
	}
	return first
}

// disownAt drops the entry of d's block at p from whichever token records it: the block is being freed by
// address, by the owner it was handed to.
func disownAt(d *Device, p cuda.DevicePtr) {
	if owned.n.Load() == 0 {
		return
	}
	owned.mu.Lock()
	defer owned.mu.Unlock()
	for token, entries := range owned.m {
		for i, e := range entries {
			if e.d == d && e.p == p {
				entries = append(entries[:i], entries[i+1:]...)
				owned.n.Add(-1)
				if len(entries) == 0 {
					delete(owned.m, token)
				} else {
					owned.m[token] = entries
				}
				return
			}
		}
	}
}

// OwnedInUse returns the bytes and the number of d's entries of kind that are recorded now.
func (d *Device) OwnedInUse(kind string) (bytes uint64, count int) {
	if owned.n.Load() == 0 {
		return 0, 0
	}
	owned.mu.Lock()
	defer owned.mu.Unlock()
	for _, entries := range owned.m {
		for _, e := range entries {
			if e.d == d && e.kind == kind {
				bytes += e.size
				count++
			}
		}
	}
	return bytes, count
}

// OutsideInUse is the device memory this process holds on d outside its allocator: shareable memory
// (allocated here or mapped from another process), managed memory and graph memory.
func (d *Device) OutsideInUse() uint64 {
	shared, _ := d.OwnedInUse(OwnedShared)
	imported, _ := d.OwnedInUse(OwnedImported)
	managed, _ := d.ManagedInUse()
	return shared + imported + managed + d.Streams().GraphMemoryBytes()
}

// allocOutside makes alloc, an allocation of size bytes on d that does not go through the allocator
// (shareable or managed memory). If the device is out of memory it releases, as
// release_cached_memory does, what cudacore caches on the device (the allocator's cache, the exportable
// pool's blocks, graph memory the driver keeps) and tries once more; a second failure is the
// out-of-memory error of the allocator, with its verdict (memory.OutOfMemory).
func (d *Device) allocOutside(size uint64, alloc func() (cuda.DevicePtr, error)) (cuda.DevicePtr, error) {
	p, err := alloc()
	if err == nil || !errors.Is(err, cuda.ErrOutOfMemory) {
		return p, err
	}
	_ = d.ReleaseCaches()
	if p, err = alloc(); err == nil || !errors.Is(err, cuda.ErrOutOfMemory) {
		return p, err
	}
	return 0, memory.OutOfMemory(d.Device, size, err, d.Memory().State())
}

// ReleaseCaches gives back, as release_cached_memory does, what cudacore caches on d: the orphans, the
// allocator's cache, the exportable pool's blocks, and the graph memory and staging buffers the driver
// and the copies keep (the last two not while a capture runs). It synchronizes the device.
func (d *Device) ReleaseCaches() error {
	_, err := d.FlushOrphans()
	return errors.Join(err, Steady(func() error {
		return errors.Join(d.Memory().Release(), d.ReleaseDriverMemory(), d.ShareRelease())
	}))
}
