package stream

import (
	"fmt"
	"sync"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// Stream lifetimes as the allocator sees them.
//
// Allocation and free take raw stream handles (a Buffer remembers the handle it was allocated on, and
// other libraries' streams are accepted by handle). A handle must never reach the driver after its
// stream was destroyed: the real driver segfaults on a stale stream handle (seen on the H100 when a
// buffer was freed after its stream was closed), where the simulator returns CUDA_ERROR_INVALID_HANDLE.
// So the Manager remembers the handles of the streams it destroyed, and the allocation paths bracket each
// use of a non-default handle with UseForAlloc/UseForFree and Done: a free recorded against a destroyed
// stream is ordered on the legacy stream instead (Destroy synchronized the stream first when it could),
// and an allocation on one is refused. lifeMu makes the check and the call atomic against Destroy.
//
// Handles of streams made elsewhere are unknown here and pass unchanged: their owner keeps them alive.

// maxDead bounds the destroyed handles remembered; the oldest are forgotten first. A handle is also
// forgotten when the driver hands it out again for a new stream.
const maxDead = 1 << 16

type lifetimes struct {
	mu    sync.RWMutex
	live  map[cuda.Stream]struct{} // the streams this Manager created and has not destroyed
	dead  map[cuda.Stream]struct{}
	order []cuda.Stream
	// closing holds the streams closed to cudacore whose driver stream lives on until the captures end
	// (Stream.Destroy): work on them is refused as on a destroyed stream, and a free on one still goes to
	// it, since its handle is alive at the driver.
	closing map[cuda.Stream]*Stream
}

// IsDefault says whether h names a default stream (0 or the legacy stream, or the per-thread stream):
// those are never destroyed.
func IsDefault(h cuda.Stream) bool { return isDefault(h) }

func isDefault(h cuda.Stream) bool {
	return h == 0 || h == cuda.StreamLegacy || h == cuda.StreamPerThread
}

// markClosing records s as closed to cudacore while its driver stream lives on; the caller holds mu
// for writing.
func (l *lifetimes) markClosing(s *Stream) {
	if l.closing == nil {
		l.closing = map[cuda.Stream]*Stream{}
	}
	l.closing[s.h] = s
}

// markDead records h as destroyed; the caller holds mu for writing.
func (l *lifetimes) markDead(h cuda.Stream) {
	delete(l.closing, h)
	delete(l.live, h)
	if l.dead == nil {
		l.dead = map[cuda.Stream]struct{}{}
	}
	if _, ok := l.dead[h]; ok {
		return
	}
	l.dead[h] = struct{}{}
	l.order = append(l.order, h)
	if len(l.order) > maxDead {
		delete(l.dead, l.order[0])
		l.order = l.order[1:]
	}
}

// born records h as a stream this Manager created, forgetting it as destroyed: the driver may reuse a
// destroyed stream's handle for a new stream.
func (l *lifetimes) born(h cuda.Stream) {
	l.mu.Lock()
	delete(l.dead, h)
	if l.live == nil {
		l.live = map[cuda.Stream]struct{}{}
	}
	l.live[h] = struct{}{}
	l.mu.Unlock()
}

// OwnsLive says whether h names a stream this Manager created and has not destroyed.
func (m *Manager) OwnsLive(h cuda.Stream) bool {
	m.life.mu.RLock()
	defer m.life.mu.RUnlock()
	_, live := m.life.live[h]
	return live
}

// Reborn forgets h as a stream this Manager destroyed: the caller knows that h names a live stream of
// someone else's now (the driver hands a destroyed stream's handle to the next stream made, by any
// library). A live stream of this Manager's is left alone.
func (m *Manager) Reborn(h cuda.Stream) {
	m.life.mu.Lock()
	delete(m.life.dead, h)
	m.life.mu.Unlock()
}

// Owns says whether h names a stream this Manager created: alive, closed to cudacore, or destroyed (and
// not handed out again by the driver since, as far as this Manager knows).
func (m *Manager) Owns(h cuda.Stream) bool {
	m.life.mu.RLock()
	defer m.life.mu.RUnlock()
	_, live := m.life.live[h]
	_, dead := m.life.dead[h]
	return live || dead || m.life.closing[h] != nil
}

// Later is the stream on which a free of a block last used on h is made when it waits (for the captures
// to end, or for a graph's destruction) and so runs on whichever thread gets there: the legacy stream for
// the per-thread default stream, h otherwise. A per-thread handle names the stream of the calling thread,
// which is another thread's then; the legacy stream waits for the work of every blocking stream, each
// thread's per-thread stream included, so the free still follows the work that used the block.
func Later(h cuda.Stream) cuda.Stream {
	if h == cuda.StreamPerThread {
		return cuda.StreamLegacy
	}
	return h
}

// UseForFree returns the stream on which to free a block last used on h: h itself, or the legacy
// stream when h was destroyed. Every call must be followed by Done(h) once the free has reached the
// allocator; in between, h cannot be destroyed.
func (m *Manager) UseForFree(h cuda.Stream) cuda.Stream {
	if isDefault(h) {
		if h == cuda.StreamPerThread {
			m.notePerThread()
		}
		return h
	}
	m.life.mu.RLock()
	if _, dead := m.life.dead[h]; dead {
		return cuda.StreamLegacy
	}
	return h
}

// UseForAlloc checks that h may be allocated on: an error (and nothing to undo) for a destroyed stream;
// otherwise the caller allocates and then calls Done(h).
func (m *Manager) UseForAlloc(h cuda.Stream) error { return m.Use("allocate", h) }

// Use checks that work (op) may be queued on h, as UseForAlloc does for allocations: an error for a
// destroyed stream, else the caller queues the work and then calls Done(h).
func (m *Manager) Use(op string, h cuda.Stream) error {
	if isDefault(h) {
		if h == cuda.StreamPerThread {
			m.notePerThread()
		}
		return nil
	}
	m.life.mu.RLock()
	if _, dead := m.life.dead[h]; dead {
		m.life.mu.RUnlock()
		return cuda.NewError("cudacore."+op, cuda.ErrorClosed,
			fmt.Sprintf("stream %#x of device %d was destroyed: %s on a live stream", uint64(h), m.dev.Ordinal(), op))
	}
	if s := m.life.closing[h]; s != nil {
		m.life.mu.RUnlock()
		return cuda.NewError("cudacore."+op, cuda.ErrorClosed,
			fmt.Sprintf("%s was closed: %s on a live stream", s, op))
	}
	return nil
}

// Done ends a UseForFree or successful UseForAlloc of h.
func (m *Manager) Done(h cuda.Stream) {
	if !isDefault(h) {
		m.life.mu.RUnlock()
	}
}

// Destroyed says whether h names a stream this Manager destroyed (and whose handle the driver has not
// handed out again).
func (m *Manager) Destroyed(h cuda.Stream) bool {
	m.life.mu.RLock()
	defer m.life.mu.RUnlock()
	_, dead := m.life.dead[h]
	return dead
}

// Closed says whether h names a stream this Manager destroyed, or one closed to cudacore whose destroy
// at the driver waits for the captures to end (Stream.Destroy during a capture).
func (m *Manager) Closed(h cuda.Stream) bool {
	m.life.mu.RLock()
	defer m.life.mu.RUnlock()
	_, dead := m.life.dead[h]
	return dead || m.life.closing[h] != nil
}

// PerThreadDrainer is implemented by drivers that can synchronize a thread's per-thread default stream
// when the thread exits (libcuda.Driver): the real driver can stall for good when it tears down, at
// thread exit, a per-thread default stream with stream-ordered pool memory and copies still in flight.
type PerThreadDrainer interface {
	DrainPerThreadAtExit(ctx cuda.Context) bool
}

// notePerThread is called, on the calling OS thread, for every use of the per-thread default stream:
// the thread will drain that stream before it exits. A cgo call on the calling thread; drivers without
// the need (the simulator) cost a type assertion.
func (m *Manager) notePerThread() {
	if d, ok := m.drv.(PerThreadDrainer); ok {
		d.DrainPerThreadAtExit(m.ctx)
	}
}
