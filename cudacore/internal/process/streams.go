package process

import (
	"cmp"
	"sync"

	"github.com/cudacore/cudacore/cudacore/internal/snapshot"
	"github.com/cudacore/cudacore/pkg/cuda"

	"github.com/cudacore/cudacore/pkg/memory"
	"github.com/cudacore/cudacore/pkg/stream"
)

// captures is the process's capture registry: one for all devices, since a GLOBAL capture on one device
// forbids unsafe calls on every other.
var captures = stream.NewRegistry()

// The count of captures is published to the C fast path (package snapshot), which takes no direct path
// while any capture is registered.
func init() { captures.OnActive(snapshot.SetCaptures) }

var streamManagers sync.Map // ordinal -> *stream.Manager

// Capturing says whether any stream of the process is capturing: one atomic load, for hot paths.
func Capturing() bool { return captures.Active() > 0 }

// DeferUntilNoCapture runs fn once no stream of the process captures (now if none does): see
// stream.Registry.Defer.
func DeferUntilNoCapture(fn func()) { captures.Defer(fn) }

// ReleaseDriverMemory gives back what the device keeps outside its allocator, unless a capture runs (the
// calls could invalidate it; nothing is released then): the graph memory the driver keeps for later
// launches (cuDeviceGraphMemTrim; a driver too old to trim keeps it) and the pinned staging buffers of
// pageable copies that no copy holds; it also retries the pinned frees that waited and failed. The caller
// keeps captures from beginning meanwhile (Steady).
func (d *Device) ReleaseDriverMemory() error {
	if Capturing() {
		return nil
	}
	err := d.Driver().DeviceGraphMemTrim(d.Context(), d.Handle())
	if cuda.ResultOf(err) == cuda.ErrorNotSupported {
		err = nil
	}
	RetryPinnedFrees()
	return cmp.Or(err, d.Streams().ReleaseStaging())
}

// Steady runs fn while no capture of the process can begin or end (stream.Registry.Steady): for a call
// made without the GIL that checks whether a capture runs and then makes a call the capture forbids (an
// unsafe call, or a stream-ordered free outside it), so that a capture begun on another thread between the
// check and the call cannot see it. fn must not begin or end a capture, nor call Steady.
func Steady(fn func() error) error { return captures.Steady(fn) }

// unsafeSteady makes call, an unsafe call (what, for messages), unless a capture forbids it on this
// thread (900, with fix); the check and the call run while no capture can begin (Steady): the caller
// runs without the GIL, and a GLOBAL capture begun on another thread in between would be invalidated.
func (d *Device) unsafeSteady(op, what, fix string, call func() error) error {
	return captures.Steady(func() error {
		if err := d.Streams().CheckUnsafe(op, what, fix); err != nil {
			return err
		}
		return call()
	})
}

// ActiveCaptures returns how many captures are in progress in the process.
func ActiveCaptures() int { return captures.Active() }

// Streams returns the device's stream/event/copy/graph manager, made on first use. The hot paths call
// it on every allocation, so the manager is also kept on the Device (one atomic load).
func (d *Device) Streams() *stream.Manager {
	if m := d.streams.Load(); m != nil {
		return m
	}
	m := d.streamsSlow()
	d.streams.Store(m)
	return m
}

func (d *Device) streamsSlow() *stream.Manager {
	if m, ok := streamManagers.Load(d.Ordinal()); ok {
		return m.(*stream.Manager)
	}
	m := stream.New(d.Device, stream.Options{
		Registry:          captures,
		Memory:            func() *memory.Stack { return d.Memory() },
		IsPinned:          IsPinned,
		PageableDirectMax: d.pageableDirectMax,
	})
	actual, _ := streamManagers.LoadOrStore(d.Ordinal(), m)
	return actual.(*stream.Manager)
}

// IsPinned says whether [p, p+n) lies inside one live pinned allocation made through AllocPinned on any
// device (with unified addressing, which every
// device cudacore supports has, pinned memory is usable from every context).
func IsPinned(p uintptr, n int) bool {
	found := false
	pinned.Range(func(_, v any) bool {
		t := v.(*pinnedTable)
		t.mu.Lock()
		for base, b := range t.live {
			if p >= base && p+uintptr(n) <= base+uintptr(len(b)) {
				found = true
				break
			}
		}
		t.mu.Unlock()
		return !found
	})
	return found
}

// destroyedAnywhere says whether h names a stream cudacore destroyed on any open device.
func destroyedAnywhere(h cuda.Stream) bool {
	return anyManager(func(m *stream.Manager) bool { return m.Destroyed(h) })
}
