// Package stream owns cudacore's streams, events, copies and CUDA graph capture for one device, built so
// that a mistake during capture cannot wedge a stream.
//
// The driver's capture rules (docs/contributing/driver-facts.md, measured on an H100) are strict: a synchronous copy
// while a blocking stream captures fails with 906 and invalidates the capture; a synchronous allocation or
// a synchronize in GLOBAL or THREAD_LOCAL mode fails with 900; once invalidated, a capture can only be
// ended (901, no graph). So this package
//
//   - tracks every capture in progress in a Registry shared by all devices of the process (GLOBAL mode
//     reaches across devices), with the mode and the OS thread that began it;
//   - refuses, before calling the driver, what it knows is illegal, with a CaptureError: a *cuda.Error
//     whose Result is the code the driver would have returned, whose Op is "cudacore.<operation>" and
//     whose message names the operation and the fix;
//   - where the driver still fails with a capture error (900, 901, 906, 907, 908), ends every capture
//     that the failure invalidated itself (cuStreamEndCapture, destroying any graph), so the streams work
//     again, and returns a CaptureError naming the first operation that failed; EndCapture of such a
//     stream returns that error once;
//   - tells the memory Stack when a stream starts and stops capturing (Stack.SetCapturing), so cached
//     blocks never get baked into graphs, and counts the allocations made inside each capture.
//
// Thread identity matters to the driver (THREAD_LOCAL captures, and GLOBAL/THREAD_LOCAL captures must be
// ended by the thread that began them): callers that are goroutines must lock their OS thread around a
// capture. Calls from Python through cgo run on the calling Python thread, which is what the rules mean.
package stream

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/device"
	"github.com/cudacore/cudacore/pkg/memory"
)

// Defaults of Options.
const (
	// DefaultPageableDirectMax is the largest copy of pageable memory handed to the driver's own copy
	// instead of the staging pool: asynchronous host-to-device copies, and synchronous ones both ways.
	// Below about 2 MiB the driver's copy, which pipelines its staging with the DMA, is as fast or faster;
	// from 2 MiB, staging wins, its host copy spread over threads and its chunks pipelined (staged.go;
	// docs/contributing/driver-facts.md, "Pageable copies"). Asynchronous device-to-host copies of pageable memory are
	// always staged.
	DefaultPageableDirectMax = 1 << 20
)

// Options configure New.
type Options struct {
	// Registry tracks captures across devices; one per process. nil makes a private one (tests).
	Registry *Registry
	// Memory returns the device's allocator (it can be replaced, hence a func), told about captures
	// with SetCapturing and about destroyed streams with ReleaseStream. nil: none.
	Memory func() *memory.Stack
	// IsPinned reports whether [p, p+n) lies in page-locked host memory (a PinnedBuffer). nil: only the
	// staging buffers count as pinned.
	IsPinned func(p uintptr, n int) bool
	// Staging is how pageable copies are staged: the pinned staging pool's buffers, and the goroutines
	// that copy host memory (zero fields: the defaults; Manager.SetStagingTuning changes it later).
	Staging StagingTuning
	// PageableDirectMax is the largest copy of pageable memory that goes to the driver's own copy rather
	// than through the staging pool: asynchronous host-to-device copies (the driver stages them and returns
	// once it has read the caller's memory) and synchronous copies both ways. 0 means
	// DefaultPageableDirectMax; a negative value stages every such copy.
	PageableDirectMax int
}

// Manager is the stream/event/copy/graph layer of one device.
type Manager struct {
	dev     *device.Device
	drv     cuda.Driver
	ctx     cuda.Context
	reg     *Registry
	opts    Options
	legacy  *Stream
	perTh   *Stream
	staging *staging

	prioMu               sync.Mutex
	prioKnown            bool
	prioLeast, prioGreat int

	syncMu   sync.Mutex
	syncDone chan syncResult // the device synchronize in flight (SynchronizeDevice with a timeout), or nil

	life lifetimes      // destroyed stream handles, for the allocation paths (lifetime.go)
	gm   graphMemory    // graph memory and the memory graphs use (graphmem.go)
	fd   failedDestroys // graphs whose deferred destroy failed, kept for a retry (graph.go)
}

// New returns the Manager of d.
func New(d *device.Device, opts Options) *Manager {
	if opts.Registry == nil {
		opts.Registry = NewRegistry()
	}
	if opts.PageableDirectMax == 0 {
		opts.PageableDirectMax = DefaultPageableDirectMax
	}
	m := &Manager{dev: d, drv: d.Driver(), ctx: d.Context(), reg: opts.Registry, opts: opts}
	m.legacy = &Stream{m: m, h: cuda.StreamLegacy, legacy: true}
	m.perTh = &Stream{m: m, h: cuda.StreamPerThread, perThread: true}
	m.staging = newStaging(m, opts.Staging)
	return m
}

// PageableDirectMax returns the largest copy of pageable memory the manager hands to the driver's own
// copy; negative: none (Options.PageableDirectMax).
func (m *Manager) PageableDirectMax() int { return m.opts.PageableDirectMax }

// Device returns the manager's device.
func (m *Manager) Device() *device.Device { return m.dev }

// Registry returns the capture registry the manager uses.
func (m *Manager) Registry() *Registry { return m.reg }

func (m *Manager) memory() *memory.Stack {
	if m.opts.Memory == nil {
		return nil
	}
	return m.opts.Memory()
}

func (m *Manager) pinned(b []byte) bool {
	if len(b) == 0 {
		return true
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if m.staging.owns(p, len(b)) {
		return true
	}
	return m.opts.IsPinned != nil && m.opts.IsPinned(p, len(b))
}

// Legacy returns the legacy default stream (CU_STREAM_LEGACY), which synchronizes with every blocking
// stream of the device. It cannot be destroyed or captured.
func (m *Manager) Legacy() *Stream { return m.legacy }

// PerThread returns the per-thread default stream (CU_STREAM_PER_THREAD): a different stream on every OS
// thread, blocking with respect to the legacy stream. It cannot be destroyed, and cudacore does not
// capture it (create a stream to capture). The calling thread will drain it before it exits (see
// PerThreadDrainer), since work is about to be queued on it.
func (m *Manager) PerThread() *Stream {
	m.notePerThread()
	return m.perTh
}

// PriorityRange returns the device's stream priorities: least (the default, numerically largest) and
// greatest (numerically smallest).
//
// The range is read from the driver once it has been read successfully; a failure is returned and not
// remembered, so that one transient error does not fail every later stream.
func (m *Manager) PriorityRange() (least, greatest int, err error) {
	m.prioMu.Lock()
	defer m.prioMu.Unlock()
	if !m.prioKnown {
		least, greatest, err := m.drv.CtxStreamPriorityRange(m.ctx)
		if err != nil {
			return 0, 0, err
		}
		m.prioLeast, m.prioGreat, m.prioKnown = least, greatest, true
	}
	return m.prioLeast, m.prioGreat, nil
}

// Create makes a stream: non-blocking streams do not synchronize with the legacy stream (the usual
// choice, and the one that keeps synchronous copies legal while they capture). priority is clamped to
// the device's range (PriorityRange); lower numbers are greater priorities.
func (m *Manager) Create(nonBlocking bool, priority int) (*Stream, error) {
	least, great, err := m.PriorityRange()
	if err != nil {
		return nil, err
	}
	priority = min(max(priority, great), least)
	flags := cuda.StreamDefault
	if nonBlocking {
		flags = cuda.StreamNonBlocking
	}
	h, err := m.drv.StreamCreate(m.ctx, flags, priority)
	if err != nil {
		return nil, err
	}
	m.life.born(h)
	return &Stream{m: m, h: h, nonBlocking: nonBlocking, priority: priority}, nil
}

// Stream is a CUDA stream of a Manager's device. Its methods are safe for concurrent use, though the
// work of one stream is ordered and a capture belongs to one thread (see the package doc).
type Stream struct {
	m           *Manager
	h           cuda.Stream
	nonBlocking bool
	priority    int
	legacy      bool
	perThread   bool
	destroyed   atomic.Bool

	waiter blocker // the blocking synchronize of a Wait, if one is in flight (wait.go)
	// use is held for reading around each waiting driver call on h (hold), and taken for writing by
	// Destroy before it destroys h: a synchronize or query that passed the destroyed check on a thread
	// without the GIL is done before the handle goes, and one that comes later never reaches the driver.
	use sync.RWMutex

	// Guarded by the registry's mutex.
	cap    *capture    // the capture in progress, or nil
	failed *cuda.Error // the error that ended the last capture, returned once by EndCapture
}

// Handle returns the driver's handle.
func (s *Stream) Handle() cuda.Stream { return s.h }

// Manager returns the stream's manager.
func (s *Stream) Manager() *Manager { return s.m }

// NonBlocking says whether the stream was created with CU_STREAM_NON_BLOCKING.
func (s *Stream) NonBlocking() bool { return s.nonBlocking }

// Priority returns the stream's priority, after clamping.
func (s *Stream) Priority() int { return s.priority }

// IsLegacy says whether s is the legacy default stream.
func (s *Stream) IsLegacy() bool { return s.legacy }

// blocking says whether the stream synchronizes with the legacy stream.
func (s *Stream) blocking() bool { return !s.nonBlocking && !s.legacy }

func (s *Stream) String() string { return s.m.describe(s.h) }

func (s *Stream) alive(op string) error {
	if s.destroyed.Load() {
		return cuda.NewError("cudacore."+op, cuda.ErrorClosed, fmt.Sprintf("%s was destroyed", s))
	}
	return nil
}

// hold runs call, a driver call on s's handle, while s cannot be destroyed; for a destroyed stream it
// returns the closed error instead. The caller passes the result to after() outside the hold.
func (s *Stream) hold(op string, call func() error) error {
	s.use.RLock()
	defer s.use.RUnlock()
	if err := s.alive(op); err != nil {
		return err
	}
	return call()
}

// Destroy ends a capture in progress (discarding it), gives the allocator's cached blocks of the stream
// back, and destroys the stream. It is idempotent; the default streams are never destroyed.
func (s *Stream) Destroy() error {
	if s.legacy || s.perThread || !s.destroyed.CompareAndSwap(false, true) {
		return nil
	}
	// Closed to cudacore from now on, whether the driver's stream goes now or later (lifetimes.closing).
	// Marked before the registry's mutex is taken: a stream's lifetime comes first in the lock order.
	s.m.closing(s)
	s.m.reg.mu.Lock()
	c := s.cap
	if c != nil && c.stream != s {
		// Joined to another stream's capture: its work belongs to that capture, which may still join it
		// back. The stream is closed to cudacore now, and destroyed at the driver when the capture ends.
		c.onEnd = append(c.onEnd, func() { _ = s.destroy() })
		s.m.reg.mu.Unlock()
		return nil
	}
	s.m.reg.mu.Unlock()
	if c != nil {
		_ = s.m.abandon(c, nil, true) // destroying the stream ends the capture at the driver too
	}
	return s.m.reg.Steady(s.destroy) // no capture begins between destroy's check and its frees
}

// closing marks s closed to cudacore while its driver stream lives on (lifetimes.closing).
func (m *Manager) closing(s *Stream) {
	m.life.mu.Lock()
	m.life.markClosing(s)
	m.life.mu.Unlock()
}

// destroy destroys s at the driver, once it captures no more; Destroy has marked it destroyed. Giving
// back the stream's cached blocks is a stream-ordered free, which a capture that forbids unsafe calls on
// this thread refuses (and is invalidated by): then the stream stays alive at the driver, closed to
// cudacore, and is destroyed when the last capture ends. The caller keeps captures from beginning or
// ending meanwhile (Steady, or the end of a capture that runs the calls deferred until then).
func (s *Stream) destroy() error {
	if s.m.unsafeCapture() != nil {
		s.m.reg.Defer(func() { _ = s.destroy() })
		return nil
	}
	// Frees recorded against this stream after it is gone go to the legacy stream (lifetime.go), which
	// does not wait for a non-blocking stream's work: finish that work first, where the capture rules
	// allow a synchronize.
	if s.m.checkStreamWait("destroy", s) == nil {
		_ = s.m.drv.StreamSynchronize(s.m.ctx, s.h)
	}
	// A Wait's blocking cuStreamSynchronize runs inside hold, as a synchronize or query of another
	// thread does: taking use for writing waits for them, so none outlives the stream. (Waiting here for
	// the Wait's helper goroutine instead deadlocked: the helper first takes the change lock for reading,
	// which this caller holds, and a capture's begin queued for writing in between kept it out.)
	s.use.Lock()
	defer s.use.Unlock()
	s.m.life.mu.Lock()
	defer s.m.life.mu.Unlock()
	s.m.life.markDead(s.h)
	var err error
	if st := s.m.memory(); st != nil {
		err = st.ReleaseStream(s.h)
	}
	if derr := s.m.drv.StreamDestroy(s.m.ctx, s.h); err == nil {
		err = derr
	}
	return err
}

// Synchronize waits until the stream has finished its work. It is refused on a capturing stream, and
// while a GLOBAL capture runs anywhere or a THREAD_LOCAL one on this thread (900).
func (s *Stream) Synchronize() error {
	const op = "synchronize"
	if err := s.alive(op); err != nil {
		return err
	}
	return s.m.recheck(s.block(op), nil)
}

// block is the blocking wait of Synchronize and of Wait's slices: cuStreamSynchronize under the capture
// rules, entered as one step with their check (enterChecked).
func (s *Stream) block(op string) error {
	return s.m.enterChecked(op, s, func() error { return s.m.checkStreamWait(op, s) }, func() error {
		return s.hold(op, func() error { return s.m.drv.StreamSynchronize(s.m.ctx, s.h) })
	})
}

// Query says whether the stream has finished its work, without waiting. The same rules as Synchronize.
func (s *Stream) Query() (bool, error) {
	const op = "query"
	if err := s.alive(op); err != nil {
		return false, err
	}
	refused, err := s.m.steadyChecked(func() error { return s.m.checkStreamWait(op, s) }, func() error {
		return s.hold(op, func() error { return s.m.drv.StreamQuery(s.m.ctx, s.h) })
	})
	if refused != nil {
		return false, refused
	}
	if cuda.ResultOf(err) == cuda.ErrorNotReady {
		return false, nil
	}
	return err == nil, s.m.after(op, s, err)
}

// Wait waits at most timeout for the stream to finish and says whether it has: the building block of
// interruptible waits (Python calls it in slices, so Ctrl-C lands between them); see wait.go.
func (s *Stream) Wait(timeout time.Duration) (bool, error) {
	const op = "synchronize"
	done, err := waitFor(timeout, s.Query, &s.waiter, func() error { return s.block(op) })
	return done, s.m.recheck(err, func() error { return s.m.checkStreamWait(op, s) })
}

// WaitEvent makes later work on s wait for the work e recorded (cuStreamWaitEvent); it does not block
// the host.
func (s *Stream) WaitEvent(e *Event) error {
	const op = "wait_event"
	if err := s.alive(op); err != nil {
		return err
	}
	if err := e.alive(op); err != nil {
		return err
	}
	// An event of another device is fine (the driver orders streams across devices with events), as long
	// as one driver made both.
	if e.m.drv != s.m.drv {
		return s.m.sameDevice(op, e.m)
	}
	if err := s.m.checkEnqueue(op, s); err != nil {
		return err
	}
	if s.m.reg.active.Load() > 0 {
		joined, err := s.join(op, e)
		if joined { // the driver's result
			return s.m.after(op, s, err)
		}
		if err != nil { // refused before the driver: the captures go on
			return err
		}
	}
	return s.m.after(op, s, s.hold(op, func() error { return s.m.drv.StreamWaitEvent(s.m.ctx, s.h, e.h) }))
}

// join applies the capture rules of s waiting on e while captures are in progress. An event last
// recorded in a capture in progress joins s to that capture: the wait is made here, and joined is true.
// A wait that the driver would refuse and that would invalidate a capture is refused first: joining a
// stream that captures into another capture (902), the legacy or per-thread stream, or a stream of
// another device; and a capturing stream waiting on an event recorded outside any capture (905) or last
// recorded in a capture that has ended (907, which the driver would let end this capture). Otherwise
// joined is false and err nil: the caller makes the wait as usual.
func (s *Stream) join(op string, e *Event) (joined bool, err error) {
	m := s.m
	e.mu.Lock()
	ec, recorded, captured := e.in, e.recorded, e.captured
	e.mu.Unlock()
	m.reg.change.Lock() // registered and joined at the driver as one change (Steady)
	defer m.reg.change.Unlock()
	m.reg.mu.Lock()
	// Checked again under the registry's mutex, which Stream.Destroy takes after marking s destroyed: a
	// Destroy either came first (refused here) or finds s joined below and leaves it to the capture's end.
	if err := s.alive(op); err != nil {
		m.reg.mu.Unlock()
		return false, err
	}
	if _, live := m.reg.caps[ec]; !live {
		ec = nil
	}
	sc := s.cap
	var refuse error
	switch {
	case ec == sc:
		// Within one capture (an edge of its graph), or no capture concerned.
	case ec == nil && recorded:
		refuse = CaptureError(cuda.ErrorStreamCaptureIsolation, op, fmt.Sprintf(
			"%s captures, and %s was recorded outside the capture: the wait would cross the capture's boundary (the driver's error 905, which would end the capture); "+
				"record the event inside the capture, or wait before it begins", s, e))
	case ec == nil && captured && sc != nil:
		refuse = CaptureError(cuda.ErrorCapturedEvent, op, fmt.Sprintf(
			"%s was last recorded in a capture that has ended, so %s cannot wait on it (the driver's error 907); record it again outside a capture, or inside this one", e, s))
	case ec == nil:
		// An event never recorded, or (on a stream that does not capture) last recorded in a capture that
		// has ended: the driver decides.
	case sc != nil:
		refuse = CaptureError(cuda.ErrorStreamCaptureMerge, op, fmt.Sprintf(
			"%s was recorded in the capture on %s, and %s captures into another one: two captures cannot merge (the driver's error 902, which would end both); "+
				"capture both streams into one capture, or order them after the captures end", e, ec.stream, s))
	case s.legacy || s.perThread:
		refuse = CaptureError(cuda.ErrorStreamCaptureUnsupported, op, fmt.Sprintf(
			"%s was recorded in the capture on %s, and %s cannot join a capture; join a stream you created: d.create_stream()", e, ec.stream, s))
	case e.m != m:
		refuse = CaptureError(cuda.ErrorNotSupported, op, fmt.Sprintf(
			"%s was recorded in the capture on %s, of another device than %s; cudacore captures one device at a time", e, ec.stream, s))
	default:
		s.cap, s.failed = ec, nil
		ec.joined = append(ec.joined, s)
		m.reg.mu.Unlock()
		// The cache is told first, so no cached block can be handed out on s once the driver captures.
		st := m.memory()
		if st != nil {
			st.SetCapturing(s.h, true)
		}
		if err := m.drv.StreamWaitEvent(m.ctx, s.h, e.h); err != nil {
			m.reg.mu.Lock()
			ec.joined = slices.DeleteFunc(ec.joined, func(j *Stream) bool { return j == s })
			if s.cap == ec {
				s.cap = nil
			}
			m.reg.mu.Unlock()
			if st != nil {
				st.SetCapturing(s.h, false)
			}
			return true, err
		}
		return true, nil
	}
	m.reg.mu.Unlock()
	return false, refuse
}

// Record records e on s (cuEventRecord) and returns e.
func (s *Stream) Record(e *Event) error { return e.Record(s) }

// SynchronizeDevice waits for all work of the device (cuCtxSynchronize). It is refused while a stream of
// the device captures, or while unsafe calls are forbidden on this thread (900). timeout <= 0 waits
// without limit; otherwise it returns after at most timeout whether the device is done, leaving the wait
// running in the background, so a later call picks it up (Python's interruptible Device.synchronize).
//
// The check runs again right before the driver's synchronize, on the goroutine that makes it, with no
// capture able to begin (the registry's change lock, as Steady): the wait slices release the GIL, and a
// capture begun on another thread between an earlier check and the synchronize would be invalidated by
// it. The lock is let go once the synchronize returns or syncEntryGrace has passed, whichever is first:
// held for the whole wait, it kept every capture from beginning or ending until the device was idle, and
// the thread beginning one holds the GIL, so the whole interpreter (Ctrl-C included) waited. The grace
// only has to cover the goroutine's way into the driver.
//
// fresh says the caller begins a new wait: a synchronize still in flight from an earlier wait that was
// given up (Ctrl-C) only covers the work queued before it began, so a new one follows it, and the
// caller is told done only once that one returns.
func (m *Manager) SynchronizeDevice(timeout time.Duration, fresh bool) (bool, error) {
	const op = "device_synchronize"
	if err := m.checkDeviceSync(op); err != nil {
		return false, err
	}
	if timeout <= 0 {
		res := m.syncDevice(op)
		return res.err == nil, res.report(m, op)
	}
	m.syncMu.Lock()
	ch := m.syncDone
	switch {
	case ch == nil:
		ch = make(chan syncResult, 1)
		m.syncDone = ch
		go func() { ch <- m.syncDevice(op) }()
	case fresh:
		old := ch
		ch = make(chan syncResult, 1)
		m.syncDone = ch
		go func() {
			<-old // the abandoned wait's outcome: nobody asks for it any more
			ch <- m.syncDevice(op)
		}()
	}
	m.syncMu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case res := <-ch:
		m.syncMu.Lock()
		m.syncDone = nil
		m.syncMu.Unlock()
		if res.refused {
			// Refused on the goroutine, perhaps long ago (a wait given up with Ctrl-C): it stands only if
			// a capture still forbids the synchronize; else the next call starts a fresh one.
			if err := m.checkDeviceSync(op); err != nil {
				return false, err
			}
			return false, nil
		}
		return res.err == nil, res.report(m, op)
	case <-t.C:
		return false, nil
	}
}

// syncResult is the outcome of syncDevice: the driver's error, or the capture rules' refusal (refused).
type syncResult struct {
	err     error
	refused bool
}

// report returns the error for the caller: a driver failure goes through the capture bookkeeping (after),
// a refusal is returned as is.
func (r syncResult) report(m *Manager, op string) error {
	if r.refused {
		return r.err
	}
	return m.after(op, nil, r.err)
}

// syncEntryGrace is how long a blocking host wait keeps captures from beginning after its check: long
// enough for its goroutine to enter the driver, short for a capture that waits (see SynchronizeDevice).
// A variable only so that tests can stretch it.
var syncEntryGrace = 2 * time.Millisecond

// syncDevice checks the capture rules and synchronizes the device, with no capture able to begin from
// the check until the synchronize has entered the driver (see SynchronizeDevice).
func (m *Manager) syncDevice(op string) syncResult {
	var refused error
	err := m.enterGuarded(func() error {
		refused = m.checkDeviceSync(op)
		return refused
	}, func() error { return m.drv.CtxSynchronize(m.ctx) })
	if refused != nil {
		return syncResult{err: refused, refused: true}
	}
	return syncResult{err: err}
}

// enterGuarded runs check and, if it passes, call (a blocking driver wait), with no capture able to
// begin from the check until call has entered the driver: the registry's change lock (as Steady) is held
// from the check until call returns or syncEntryGrace has passed, whichever is first (see
// SynchronizeDevice). It returns check's error, or call's.
func (m *Manager) enterGuarded(check, call func() error) error {
	m.reg.change.RLock()
	if err := check(); err != nil {
		m.reg.change.RUnlock()
		return err
	}
	// An RWMutex is not tied to a goroutine: the timer's goroutine may let go of it.
	var once sync.Once
	release := func() { once.Do(m.reg.change.RUnlock) }
	t := time.AfterFunc(syncEntryGrace, release)
	err := call()
	t.Stop()
	release()
	return err
}

// steadyChecked runs check and, if it passes, call (a query), while no capture can begin or end (Steady):
// it returns check's refusal, or call's error.
func (m *Manager) steadyChecked(check, call func() error) (refused, err error) {
	err = m.reg.Steady(func() error {
		if refused = check(); refused != nil {
			return nil
		}
		return call()
	})
	return refused, err
}

// refusal is a capture rule's refusal of a host wait, made by enterChecked: not the driver's result.
type refusal struct{ error }

func (r refusal) Unwrap() error { return r.error }

// enterChecked is enterGuarded for a host wait of stream s (nil: none) as op: a refusal comes back as a
// refusal, the driver's result through the capture bookkeeping (after).
func (m *Manager) enterChecked(op string, s *Stream, check, call func() error) error {
	var refused error
	err := m.enterGuarded(func() error {
		refused = check()
		return refused
	}, call)
	if refused != nil {
		return refusal{refused}
	}
	return m.after(op, s, err)
}

// recheck returns err for the caller of a wait, unwrapping a refusal. A refusal made by a blocking wait
// on a helper goroutine may be old (a slice given up with Ctrl-C): with check (not nil) it stands only
// while check still refuses, else the wait is reported not done, and the next slice starts afresh.
func (m *Manager) recheck(err error, check func() error) error {
	var r refusal
	if !errors.As(err, &r) {
		return err
	}
	if check == nil {
		return r.error
	}
	return check()
}

func (m *Manager) sameDevice(op string, o *Manager) error {
	if o != m {
		return cuda.NewError("cudacore."+op, cuda.ErrorInvalidValue, fmt.Sprintf(
			"the objects belong to different devices (%d and %d); use a stream and event of one device", m.dev.Ordinal(), o.dev.Ordinal()))
	}
	return nil
}

func gettid() int { return syscall.Gettid() }
