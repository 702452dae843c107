package stream

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"unsafe"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// Copies. A nil stream means a synchronous copy: it goes through the legacy stream, returns when the data
// has arrived, and is refused while a blocking stream of the device captures (906). One of more than
// PageableDirectMax bytes of pageable memory is the staged asynchronous copy below, made on the legacy
// stream and waited for (stagedSync): the driver's own synchronous pageable copy is the slower one there.
//
// Asynchronous copies are ordered on their stream:
//   - from or to pinned memory (a PinnedBuffer, the staging buffers) they go straight to the driver and
//     return at once; the caller keeps the host memory alive and unchanged until the stream has passed
//     the copy (synchronize the stream or an event recorded after it);
//   - host-to-device from pageable memory, the call returns once the data is staged and the caller may
//     reuse its memory at once. Up to PageableDirectMax bytes the driver stages it (its pageable copy
//     is the faster one there); larger copies go through cudacore's pinned staging buffers (a pool of
//     StagingTuning.Buffers per device, Chunk bytes each), each recycled when an event recorded after its
//     copy completes. Memory that the driver knows as page-locked but cudacore does not (another
//     library's pinned memory) is read when the stream reaches the copy, as a PinnedBuffer is, if the
//     copy goes to the driver;
//   - device-to-host into pageable memory, the data goes through staging buffers too and the call returns
//     when it is in the caller's memory (as the driver's own pageable copy does);
//   - on a capturing stream only pinned memory is allowed: a captured copy keeps the host pointer and
//     moves whatever is there at each launch, which for pageable memory cudacore cannot keep valid.
//
// The staged paths are a pipeline (staged.go): chunks of one staging buffer, several in flight, the
// DMAs of earlier chunks running while a crew of goroutines copies the host side of later ones, since
// one core's memcpy is slower than the copy engine. Only the calling goroutine calls the driver: the
// workers touch nothing but the caller's memory and the staging buffers the caller handed them, a DMA
// is enqueued only after the workers have filled its chunk, and the call returns (or fails) only once
// no worker touches either any more.

// HeldCopyMax is the largest asynchronous copy the Python layer makes while keeping the GIL (the Held
// doors of the facade): such a copy only enqueues work, and releasing the GIL would cost more than the
// call. Larger ones release it, and so does every copy to the host but one into a PinnedBuffer: a copy
// into pageable memory waits for the work queued on its stream, which must not stop every Python thread.
// The Python and C layers read it from the generated tables (cudacore/internal/tablegen).
const HeldCopyMax = 64 << 10

const (
	opCopyFrom = "copy_from" // host to device (Buffer.copy_from)
	opCopyTo   = "copy_to"   // device to host (Buffer.copy_to)
	opCopyDev  = "copy"      // device to device
)

// CopyHtoD copies src to device memory at dst, on s (nil: synchronously).
//
// An asynchronous copy holds s's lifetime (Stream.hold) for all its driver calls: the copy doors release
// the GIL, and a staged copy makes several calls on s, so a Stream.close() on another thread would
// otherwise destroy the stream between two of them (the real driver crashes on the destroyed handle).
func (m *Manager) CopyHtoD(dst cuda.DevicePtr, src []byte, s *Stream) error {
	if err := m.checkPendingUse(opCopyFrom, s, span{dst, dst + cuda.DevicePtr(uint64(len(src)))}); err != nil {
		return err
	}
	if s == nil {
		return m.syncCopy(opCopyFrom, "a synchronous host-to-device copy",
			"copy from a PinnedBuffer with copy_from(pinned, stream=<the capturing stream>) instead",
			len(src) == 0, func() error {
				if m.stagedSync(src) {
					return m.syncStagedHtoD(dst, src)
				}
				if err := m.drv.MemcpyHtoD(m.ctx, dst, src); err != nil {
					return err
				}
				// From pageable memory the driver returns once it has staged src, before its DMA on the
				// legacy stream has landed: wait for it, so that the data has arrived when the call
				// returns, as documented, for work on any stream or device. Not where a capture forbids
				// the wait on this thread (the driver's own semantics there).
				if !m.pinned(src) && m.unsafeCapture() == nil {
					return m.drv.StreamSynchronize(m.ctx, cuda.StreamLegacy)
				}
				return nil
			})
	}
	const dir, fix = "host-to-device", "copy_from(pinned, stream=s)"
	pinned, err := m.checkAsyncCopy(opCopyFrom, s, src)
	if err != nil || len(src) == 0 && pinned {
		return err
	}
	if len(src) == 0 {
		return m.checkPageable(opCopyFrom, s, dir, fix) // nothing to copy, refused as a copy would be
	}
	if pinned {
		return m.after(opCopyFrom, s, s.hold(opCopyFrom, func() error {
			m.noteUse(s, dst, uint64(len(src)))
			m.noteUse(s, HostPtr(src), uint64(len(src))) // the graph keeps the pinned memory alive too
			return m.drv.MemcpyHtoDAsync(m.ctx, dst, src, s.h)
		}))
	}
	return m.pageable(opCopyFrom, s, dir, fix, func() error {
		return s.hold(opCopyFrom, func() error {
			if len(src) <= m.opts.PageableDirectMax {
				// The driver stages it and returns once it has read src, as the staging pool would.
				return m.drv.MemcpyHtoDAsync(m.ctx, dst, src, s.h)
			}
			return m.stagedHtoD(dst, src, s)
		})
	})
}

// syncStagedHtoD is the synchronous host-to-device copy of pageable memory through the staging buffers,
// ordered as the driver's own: src is read once the work queued before the copy on the legacy stream and
// on every blocking stream is done (the GPU may be writing src until then: memory the driver knows as
// page-locked but cudacore does not, or pageable memory where the GPU can reach it), and the call
// returns once the data has arrived. The caller runs in syncCopy's steady state, where no capture forbids
// these waits.
func (m *Manager) syncStagedHtoD(dst cuda.DevicePtr, src []byte) error {
	// An event recorded on the legacy stream completes after everything a legacy-stream operation waits for.
	ev, err := m.staging.record(m.legacy)
	if err != nil {
		return err
	}
	err = m.drv.EventSynchronize(m.ctx, ev)
	m.staging.recycle(nil, ev)
	if err != nil {
		return err
	}
	if err := m.stagedHtoD(dst, src, m.legacy); err != nil {
		return err
	}
	return m.drv.StreamSynchronize(m.ctx, cuda.StreamLegacy)
}

// CopyDtoH copies device memory at src into dst, on s (nil: synchronously). An asynchronous copy holds
// s's lifetime for all its driver calls, as CopyHtoD.
func (m *Manager) CopyDtoH(dst []byte, src cuda.DevicePtr, s *Stream) error {
	if err := m.checkPendingUse(opCopyTo, s, span{src, src + cuda.DevicePtr(uint64(len(dst)))}); err != nil {
		return err
	}
	if s == nil {
		return m.syncCopy(opCopyTo, "a synchronous device-to-host copy",
			"copy into a PinnedBuffer with copy_to(pinned, stream=<the capturing stream>) instead",
			len(dst) == 0, func() error {
				if m.stagedSync(dst) {
					return m.stagedDtoH(dst, src, m.legacy) // done when the bytes are in dst
				}
				return m.drv.MemcpyDtoH(m.ctx, dst, src)
			})
	}
	const dir, fix = "device-to-host", "copy_to(pinned, stream=s)"
	pinned, err := m.checkAsyncCopy(opCopyTo, s, dst)
	if err != nil || len(dst) == 0 && pinned {
		return err
	}
	if len(dst) == 0 {
		return m.checkPageable(opCopyTo, s, dir, fix) // nothing to copy, refused as a copy would be
	}
	if pinned {
		return m.after(opCopyTo, s, s.hold(opCopyTo, func() error {
			m.noteUse(s, src, uint64(len(dst)))
			m.noteUse(s, HostPtr(dst), uint64(len(dst)))
			return m.drv.MemcpyDtoHAsync(m.ctx, dst, src, s.h)
		}))
	}
	return m.pageable(opCopyTo, s, dir, fix, func() error {
		return s.hold(opCopyTo, func() error { return m.stagedDtoH(dst, src, s) })
	})
}

// CopyDtoD copies n bytes of device memory from src to dst, on s (nil: synchronously).
func (m *Manager) CopyDtoD(dst, src cuda.DevicePtr, n uint64, s *Stream) error {
	if err := m.checkPendingUse(opCopyDev, s, span{dst, dst + cuda.DevicePtr(n)}, span{src, src + cuda.DevicePtr(n)}); err != nil {
		return err
	}
	if s == nil {
		return m.syncCopy(opCopyDev, "a synchronous device-to-device copy",
			"pass the capturing stream (stream=<the capturing stream>)",
			n == 0, func() error { return m.drv.MemcpyDtoD(m.ctx, dst, src, n) })
	}
	if err := m.checkStreamArg(opCopyDev, s); err != nil || n == 0 {
		return err
	}
	return m.after(opCopyDev, s, s.hold(opCopyDev, func() error {
		m.noteUse(s, dst, n)
		m.noteUse(s, src, n)
		return m.drv.MemcpyDtoDAsync(m.ctx, dst, src, n, s.h)
	}))
}

// syncCopy makes a synchronous copy (call) unless checkSyncCopy refuses it: the check and the driver's call
// run in one steady state (Registry.Steady), since the copy doors run without the GIL and a capture of a
// blocking stream begun on another thread in between would be invalidated by the copy's implicit
// synchronization (906). after, which may end captures, runs outside it.
func (m *Manager) syncCopy(op, what, fix string, empty bool, call func() error) error {
	var err error
	if serr := m.reg.Steady(func() error {
		if err := m.checkSyncCopy(op, what, fix); err != nil || empty {
			return err
		}
		err = call()
		return nil
	}); serr != nil || empty {
		return serr
	}
	return m.after(op, nil, err)
}

// stagedSync says whether a synchronous copy of host memory b goes through the staging buffers on the
// legacy stream (and a wait for it) rather than to the driver's synchronous copy: pageable memory above
// PageableDirectMax, where staging is the faster path as for asynchronous copies, unless a capture
// forbids the legacy stream's synchronize on this thread (the driver's synchronous copy is allowed
// there). The caller runs in a steady state (syncCopy), so no capture begins before the copy is done.
func (m *Manager) stagedSync(b []byte) bool {
	return len(b) > m.opts.PageableDirectMax && !m.pinned(b) && m.unsafeCapture() == nil
}

func (m *Manager) checkSyncCopy(op, what, fix string) error {
	if c := m.blockingCapture(); c != nil {
		return CaptureError(cuda.ErrorStreamCaptureImplicit, op, implicitMsg(what, c, fix))
	}
	return nil
}

func (m *Manager) checkStreamArg(op string, s *Stream) error {
	if err := s.alive(op); err != nil {
		return err
	}
	if err := m.sameDevice(op, s.m); err != nil {
		return err
	}
	return m.checkEnqueue(op, s)
}

// checkAsyncCopy validates the stream of an asynchronous copy of host memory b on s and says whether b is
// pinned. A copy of pageable memory is checked against the capture rules where it is made (pageable).
func (m *Manager) checkAsyncCopy(op string, s *Stream, b []byte) (bool, error) {
	if err := m.checkStreamArg(op, s); err != nil {
		return false, err
	}
	return m.pinned(b), nil
}

// checkPageable refuses an asynchronous copy of pageable memory on s where a capture forbids it: s
// captures (the graph would keep the host pointer), or a capture forbids unsafe calls on this thread (the
// copy can allocate and wait for staging buffers, cudacore's or the driver's).
func (m *Manager) checkPageable(op string, s *Stream, dir, fix string) error {
	if m.reg.active.Load() == 0 {
		return nil
	}
	if c := s.capturing(); c != nil {
		return CaptureError(cuda.ErrorStreamCaptureUnsupported, op, fmt.Sprintf(
			"an asynchronous %s copy of pageable host memory cannot be captured: the graph would keep the host pointer and replay it after this memory is gone or reused (%s); use a PinnedBuffer (d.allocate_pinned(n)) and %s",
			dir, c.describe(), fix))
	}
	if c := m.unsafeCapture(); c != nil {
		return CaptureError(cuda.ErrorStreamCaptureUnsupported, op, unsafeMsg(
			"an asynchronous copy of pageable memory (which can wait for staging buffers, cudacore's or the driver's)", c,
			"use a PinnedBuffer, or copy before or after the capture"))
	}
	return nil
}

// pageable makes call, an asynchronous copy of pageable memory on s, unless checkPageable refuses it;
// the check and the copy run in one steady state (Registry.Steady): the copy doors run without the GIL,
// and a capture begun on another thread in between would be invalidated by the copy's unsafe calls
// (cuMemHostAlloc, cuEventSynchronize) or would capture the copy itself. The steady state is entered
// before call takes s's hold, the order Stream.Destroy takes them in.
//
// A refusal of the capture rules is returned as it is; what call returns (the driver's result) goes
// through after, which ends the captures a capture error invalidated, as syncCopy does.
func (m *Manager) pageable(op string, s *Stream, dir, fix string, call func() error) error {
	var err error
	if serr := m.reg.Steady(func() error {
		if err := m.checkPageable(op, s, dir, fix); err != nil {
			return err
		}
		err = call()
		return nil
	}); serr != nil {
		return serr
	}
	return m.after(op, s, err)
}

// ---- the pinned staging pool --------------------------------------------------------------------------

type inflight struct {
	buf []byte
	ev  cuda.Event
}

// staging is a small pool of at most tuning.Buffers pinned host buffers of tuning.Chunk bytes for
// pageable copies. A buffer handed to a copy is busy until an event recorded after the copy completes.
// When every buffer is held by a copy being issued, get waits for one to come back; no copy waits in get
// while it holds a buffer it has yet to enqueue or copy out (it asks with poll, which never waits), so the
// holders always finish and the pool never grows past its bound.
type staging struct {
	m *Manager

	mu       sync.Mutex
	returned sync.Cond // on mu: a buffer came back to the pool, or a slot under the bound came free
	tuning   StagingTuning
	copies   int       // staged copies running (begin/end): the tuning stays while any runs
	ceiling  int       // after a buffer could not be allocated: the pool's bound until memory is given back (0: none)
	all      []uintptr // base of every buffer, for owns
	free     [][]byte
	busy     []inflight // oldest first
	events   []cuda.Event
}

func newStaging(m *Manager, t StagingTuning) *staging {
	p := &staging{m: m, tuning: t.withDefaults()}
	p.returned.L = &p.mu
	return p
}

// begin counts a staged copy as running and returns the tuning it runs with; end counts it done.
func (p *staging) begin() StagingTuning {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.copies++
	return p.tuning
}

func (p *staging) end() {
	p.mu.Lock()
	p.copies--
	p.mu.Unlock()
}

func (p *staging) owns(addr uintptr, n int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range p.all {
		if addr >= b && addr+uintptr(n) <= b+uintptr(p.tuning.Chunk) {
			return true
		}
	}
	return false
}

// reapLocked moves the busy buffers whose events completed to the free list.
func (p *staging) reapLocked() {
	i := 0
	for ; i < len(p.busy); i++ {
		b := p.busy[i]
		if err := p.m.drv.EventQuery(p.m.ctx, b.ev); err != nil {
			break // not ready (or failed: keep it until a synchronize says more)
		}
		p.free = append(p.free, b.buf)
		p.events = append(p.events, b.ev)
	}
	p.busy = p.busy[i:]
}

// get returns a free staging buffer: a free one, else a new one while under the bound, else the oldest
// busy one once its copy completes, else (every buffer is held by a copy being issued) the first to come
// back. The caller must hold no buffer that only it can give back. A buffer that cannot be allocated for
// lack of memory is a noStaging error only while the pool has none; otherwise the pool stops growing
// (ceiling) and get waits for one of those it has. Any other failure to allocate is returned as it is.
func (p *staging) get() ([]byte, error) {
	return p.take(true)
}

// poll is get without waiting: a free buffer (or one whose copy has completed), a new one while under
// the bound, else nil (and no error).
func (p *staging) poll() ([]byte, error) {
	return p.take(false)
}

func (p *staging) take(wait bool) ([]byte, error) {
	p.mu.Lock()
	for {
		p.reapLocked()
		if n := len(p.free); n > 0 {
			b := p.free[n-1]
			p.free = p.free[:n-1]
			p.mu.Unlock()
			return b, nil
		}
		if len(p.all) < p.boundLocked() {
			p.all = append(p.all, 0) // reserve the slot
			size := p.tuning.Chunk
			p.mu.Unlock()
			b, err := p.m.drv.MemHostAlloc(p.m.ctx, uint64(size), 0)
			p.mu.Lock()
			i := slices.Index(p.all, 0) // the reserved slot (Close leaves it)
			if err == nil {
				p.all[i] = uintptr(unsafe.Pointer(unsafe.SliceData(b)))
				p.mu.Unlock()
				return b, nil
			}
			p.all = slices.Delete(p.all, i, i+1)
			p.returned.Broadcast() // the slot is free again
			if cuda.ResultOf(err) != cuda.ErrorOutOfMemory {
				p.mu.Unlock()
				return nil, err
			}
			if len(p.all) == 0 {
				p.mu.Unlock()
				return nil, noStaging{err}
			}
			// Pinned memory is short: the copies go on with the buffers the pool has (or is being given),
			// and the pool stops growing until memory is given back (ReleaseStaging, a new tuning).
			p.ceiling = len(p.all)
			continue
		}
		if !wait {
			p.mu.Unlock()
			return nil, nil
		}
		if len(p.busy) > 0 {
			oldest := p.busy[0]
			p.busy = p.busy[1:]
			p.mu.Unlock()
			if err := p.m.drv.EventSynchronize(p.m.ctx, oldest.ev); err != nil {
				p.mu.Lock()
				p.busy = append([]inflight{oldest}, p.busy...) // still the oldest
				p.returned.Broadcast()
				p.mu.Unlock()
				return nil, err
			}
			p.recycle(nil, oldest.ev)
			return oldest.buf, nil
		}
		p.returned.Wait()
	}
}

// boundLocked is the most buffers the pool holds now: the tuning's, or fewer after an allocation failed.
func (p *staging) boundLocked() int {
	if p.ceiling > 0 {
		return min(p.ceiling, p.tuning.Buffers)
	}
	return p.tuning.Buffers
}

// noStaging is the failure to allocate a staging buffer while the pool has none: a copy that holds no
// buffer either cannot be staged, and is the driver's own pageable copy instead (stagedHtoD, stagedDtoH).
type noStaging struct{ err error }

func (e noStaging) Error() string { return e.err.Error() }
func (e noStaging) Unwrap() error { return e.err }

// record records a staging event on s.
func (p *staging) record(s *Stream) (cuda.Event, error) {
	p.mu.Lock()
	var ev cuda.Event
	if n := len(p.events); n > 0 {
		ev = p.events[n-1]
		p.events = p.events[:n-1]
	}
	p.mu.Unlock()
	if ev == 0 {
		var err error
		if ev, err = p.m.drv.EventCreate(p.m.ctx, cuda.EventDisableTiming); err != nil {
			return 0, err
		}
	}
	if err := p.m.drv.EventRecord(p.m.ctx, ev, s.h); err != nil {
		p.mu.Lock()
		p.events = append(p.events, ev)
		p.mu.Unlock()
		return 0, err
	}
	return ev, nil
}

// put marks buf busy until the work enqueued on s so far completes.
func (p *staging) put(buf []byte, s *Stream) error {
	ev, err := p.record(s)
	if err != nil {
		p.untracked(buf, s)
		return err
	}
	p.putRecorded(buf, ev)
	return nil
}

// untracked takes back buf, whose copy was enqueued on s but could not be followed by an event: it waits
// for the stream rather than risk a later copy overwriting data the DMA still reads or writes. If even
// that fails (a sticky error: the context is lost), buf is given up, never reused or freed, and its slot
// in the pool is freed for a new buffer (a copy waiting for a buffer would otherwise wait for it for good).
func (p *staging) untracked(buf []byte, s *Stream) {
	if err := p.m.drv.StreamSynchronize(p.m.ctx, s.h); err != nil {
		base := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
		p.mu.Lock()
		p.all = slices.DeleteFunc(p.all, func(a uintptr) bool { return a == base })
		p.returned.Broadcast()
		p.mu.Unlock()
		return
	}
	p.recycle(buf, 0)
}

func (p *staging) putRecorded(buf []byte, ev cuda.Event) {
	p.mu.Lock()
	p.busy = append(p.busy, inflight{buf, ev})
	p.returned.Broadcast()
	p.mu.Unlock()
}

// recycle returns a buffer that no copy uses (nil: none), and an event (0: none), to the pool.
func (p *staging) recycle(buf []byte, ev cuda.Event) {
	p.mu.Lock()
	if buf != nil {
		p.free = append(p.free, buf)
		p.returned.Broadcast()
	}
	if ev != 0 {
		p.events = append(p.events, ev)
	}
	p.mu.Unlock()
}

// ReleaseStaging frees the staging buffers that no copy holds now (cuMemFreeHost) and the spare events
// of the pool; the pool allocates again when a copy needs it. A buffer the driver refuses to free stays in
// the pool. cuMemFreeHost is an unsafe call during a capture: the caller makes sure none runs.
func (m *Manager) ReleaseStaging() error {
	p := m.staging
	p.mu.Lock()
	p.reapLocked()
	bufs, evs := p.free, p.events
	p.free, p.events = nil, nil
	p.ceiling = 0 // memory is given back: the pool may grow to its bound again
	p.mu.Unlock()
	var first error
	for _, b := range bufs {
		if err := m.drv.MemFreeHost(m.ctx, b); err != nil {
			first = cmp.Or(first, err)
			p.recycle(b, 0)
			continue
		}
		base := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		p.mu.Lock()
		p.all = slices.DeleteFunc(p.all, func(a uintptr) bool { return a == base })
		p.returned.Broadcast() // a slot under max
		p.mu.Unlock()
	}
	for _, ev := range evs {
		_ = m.drv.EventDestroy(m.ctx, ev) // an event no copy holds: nothing waits on it
	}
	return first
}

// StagingBytes returns the pinned memory the staging pool holds now: its buffers, free, busy or held by a
// copy.
func (m *Manager) StagingBytes() uint64 {
	p := m.staging
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, a := range p.all {
		if a != 0 { // 0: a slot reserved for a buffer being allocated
			n++
		}
	}
	return uint64(n) * uint64(p.tuning.Chunk)
}

// StagingStats returns the number of staging buffers allocated and busy now.
func (m *Manager) StagingStats() (allocated, busy int) {
	p := m.staging
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.all), len(p.busy)
}

// Close frees the staging buffers and events once their copies complete, and retries the destroys of the
// graphs kept after a failure (RetryDestroys). Buffers that copies hold meanwhile stay in the pool. The
// manager can still be used afterwards (the pool fills again).
func (m *Manager) Close() error {
	p := m.staging
	p.mu.Lock()
	busy, free, events := p.busy, p.free, p.events
	p.busy, p.free, p.events = nil, nil, nil
	p.ceiling = 0 // its memory is given back: the pool may grow to its bound again
	// The buffers it frees leave the pool; those that copies hold now stay counted, and come back.
	gone := make(map[uintptr]bool, len(busy)+len(free))
	for _, b := range busy {
		gone[uintptr(unsafe.Pointer(unsafe.SliceData(b.buf)))] = true
	}
	for _, b := range free {
		gone[uintptr(unsafe.Pointer(unsafe.SliceData(b)))] = true
	}
	p.all = slices.DeleteFunc(p.all, func(a uintptr) bool { return gone[a] })
	p.returned.Broadcast() // slots under max
	p.mu.Unlock()
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	if err := m.RetryDestroys(); err != nil { // the graphs whose deferred destroy failed
		keep(err)
	}
	for _, b := range busy {
		if err := m.drv.EventSynchronize(m.ctx, b.ev); err != nil {
			keep(err)
			continue // a buffer still possibly in use is leaked, not freed
		}
		free = append(free, b.buf)
		events = append(events, b.ev)
	}
	for _, b := range free {
		if err := m.drv.MemFreeHost(m.ctx, b); err != nil {
			keep(err)
		}
	}
	for _, ev := range events {
		if err := m.drv.EventDestroy(m.ctx, ev); err != nil {
			keep(err)
		}
	}
	return first
}

// HostPtr is the address of b's first byte as a graph's uses record it: with unified addressing host and
// device addresses never overlap, so a pinned host range is kept alive by the same bookkeeping as device
// memory (FreeGraphAware).
func HostPtr(b []byte) cuda.DevicePtr {
	return cuda.DevicePtr(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}
