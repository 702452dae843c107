package stream

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/device"
)

// Registry tracks the captures in progress in a process, across devices: a GLOBAL capture forbids unsafe
// calls on every device. Active is one atomic load, so hot paths skip every check when nothing captures.
type Registry struct {
	mu       sync.Mutex
	caps     map[*capture]struct{}
	active   atomic.Int32
	onActive func(int32) // OnActive's function, called under mu with each new count
	deferred []func()    // run when the last capture ends (Defer)
	// change is held for writing while a capture begins or ends (registered and begun at the driver, or
	// ended there and unregistered), and for reading by Steady: in between, cudacore's books and the
	// driver disagree on whether the stream captures.
	change sync.RWMutex
}

// Steady runs fn while no capture begins or ends, and returns its error. It is for work that decides by
// whether a stream captures and then calls the driver, made where the GIL does not keep captures out:
// without the GIL (the tiles of AllocateTiles, copies, waits) a capture could begin between cudacore
// registering it and the driver beginning it, so that an allocation counted into the capture was an
// ordinary one at the driver (or, as it ends, the reverse). A door that keeps the GIL may call it too
// (a small asynchronous copy): whoever holds the lock for writing (a capture's begin or end) either holds
// the GIL, and then no such door runs, or does not need it. fn must not begin or end a capture, nor call
// Steady, nor wait for the GIL.
func (r *Registry) Steady(fn func() error) error {
	r.change.RLock()
	defer r.change.RUnlock()
	return fn()
}

// Defer runs fn once no capture is in progress: now if none is, else when the last one ends. Frees that
// the driver forbids during capture (cuMemFreeHost and cuMemFree are unsafe calls: 900 in GLOBAL mode,
// and a garbage-collected buffer can be freed at any moment) wait this way instead of invalidating it.
func (r *Registry) Defer(fn func()) {
	r.mu.Lock()
	if r.active.Load() > 0 {
		r.deferred = append(r.deferred, fn)
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	fn()
}

// RunOrDefer runs fn now if no capture is in progress, holding the registry so that no capture can
// begin while it runs, else when the last capture ends (as Defer). It is for calls that a capture
// forbids (a synchronous free): with Defer a capture begun on another thread between the check and the
// call would be invalidated by it. fn must not begin or end a capture, nor take a lock that is held
// while the registry's mutex is taken (an allocator's in-flight lock: use Steady and Defer then). It
// returns fn's error when fn ran now; a deferred fn's error is dropped (no caller is left to take it).
func (r *Registry) RunOrDefer(fn func() error) error {
	r.mu.Lock()
	if r.active.Load() > 0 {
		// Run later under the same rule: a capture may begin between the last one ending and this call.
		r.deferred = append(r.deferred, func() { _ = r.RunOrDefer(fn) })
		r.mu.Unlock()
		return nil
	}
	defer r.mu.Unlock()
	return fn()
}

// RunOrDeferUnsafe is for an unsafe call that can wait (destroying a graph or an executable graph, which
// the driver refuses with 900 and which invalidates the capture, as a synchronous allocation does): it
// runs now, holding the registry so that no capture can begin meanwhile, unless a capture in progress
// forbids unsafe calls on the calling thread (a GLOBAL capture anywhere, a THREAD_LOCAL one begun on this
// thread). Then later is queued to run when the last capture ends, and ran is false. Unlike RunOrDefer,
// captures that allow the call (RELAXED ones, THREAD_LOCAL ones of other threads) do not delay it. now
// must not take the registry or begin or end a capture; later runs without the registry held.
func (r *Registry) RunOrDeferUnsafe(now func() error, later func()) (ran bool, err error) {
	return r.RunOrDeferUnsafeOn(nil, 0, now, later)
}

// RunOrDeferUnsafeOn is RunOrDeferUnsafe for a stream-ordered call on h, a stream of m's device (the
// free that follows a graph launch). It also waits while h captures, where the call would become a node
// of that capture's graph and run only if that graph were launched, and, for the legacy stream, while a
// blocking stream of the device captures (the legacy stream's implicit wait on it would invalidate that
// capture). A capture is registered before it begins at the driver, so a stream that the registry does
// not list, under its mutex, cannot begin capturing at the driver before now returns. A nil m checks
// no stream.
func (r *Registry) RunOrDeferUnsafeOn(m *Manager, h cuda.Stream, now func() error, later func()) (ran bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.active.Load() > 0 {
		tid := gettid()
		for c := range r.caps {
			if c.forbidsUnsafe(tid) || m != nil && c.holds(m, h) {
				r.deferred = append(r.deferred, later)
				return false, nil
			}
		}
	}
	return true, now()
}

// RunUnlessUnsafe runs now, an unsafe call that cannot wait (the instantiation of a graph about to be
// launched), holding the registry so that no capture can begin meanwhile, unless a capture in progress
// forbids unsafe calls on the calling thread: then now does not run, and that capture is returned for
// the caller's refusal.
func (r *Registry) RunUnlessUnsafe(now func() error) (*capture, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.active.Load() > 0 {
		tid := gettid()
		for c := range r.caps {
			if c.forbidsUnsafe(tid) {
				return c, nil
			}
		}
	}
	return nil, now()
}

// holds says whether work queued on h, a stream of m's device, would be captured into c or invalidate
// it: h is c's origin or joined to it, or h is the legacy stream and c captures a blocking stream of the
// same device. The registry's mutex must be held.
func (c *capture) holds(m *Manager, h cuda.Stream) bool {
	if c.member(m, h) != nil {
		return true
	}
	return h == cuda.StreamLegacy && c.stream.m.dev == m.dev && c.blocking()
}

// ForbidsUnsafe says whether a capture in progress forbids potentially unsafe calls (a stream-ordered
// allocation or free outside it, a synchronous allocation) on the calling thread: a GLOBAL capture
// anywhere, a THREAD_LOCAL one begun on this thread. One atomic load when nothing captures.
func (r *Registry) ForbidsUnsafe() bool { return r.forbidding() != nil }

// forbidding returns a capture in progress that forbids potentially unsafe calls on the calling thread
// (see ForbidsUnsafe), or nil.
func (r *Registry) forbidding() *capture {
	if r.active.Load() == 0 {
		return nil
	}
	tid := gettid()
	r.mu.Lock()
	defer r.mu.Unlock()
	for c := range r.caps {
		if c.forbidsUnsafe(tid) {
			return c
		}
	}
	return nil
}

// Deferred returns how many deferred calls wait for the captures to end.
func (r *Registry) Deferred() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.deferred)
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{caps: map[*capture]struct{}{}} }

// OnActive makes fn hear every new count of captures in progress, under the registry's mutex (so in
// order: the last call has the latest count), from the moment a capture is registered (before the
// driver begins it) to the moment it is unregistered (after the driver ended it). fn must not call the
// registry. Set it before any capture begins.
func (r *Registry) OnActive(fn func(int32)) {
	r.mu.Lock()
	r.onActive = fn
	r.mu.Unlock()
}

func (r *Registry) publish(n int32) {
	if r.onActive != nil {
		r.onActive(n)
	}
}

// Active returns how many captures are in progress.
func (r *Registry) Active() int { return int(r.active.Load()) }

// capture is one capture sequence on a stream. Fields after stream are guarded by the registry's mutex.
type capture struct {
	stream *Stream // the origin: the stream that began the capture, the only one that may end it
	mode   cuda.CaptureMode
	tid    int
	// joined lists the streams that joined the capture by waiting on an event recorded in it (WaitEvent):
	// their work goes into the same graph, under the same rules, until the origin ends the capture.
	joined []*Stream
	onEnd  []func() // run once the capture has ended (the destroy of a joined stream closed meanwhile)
	allocs int
	bytes  uint64
	ptrs   map[cuda.DevicePtr]uint64 // the allocations made on the capturing stream (graph memory), by size
	uses   []span                    // device memory the captured work uses (graphmem.go)
	// escapes lists work cudacore issued while this capture ran that did not go into it (see
	// NoteEscape); escaped counts all of it, escapes keeps the first maxEscapes.
	escapes []string
	escaped int
}

// maxEscapes bounds the escapes a capture lists (it counts all of them).
const maxEscapes = 32

// member returns the stream of m with handle h if it captures into c (its origin or a joined stream),
// else nil. The registry's mutex must be held.
func (c *capture) member(m *Manager, h cuda.Stream) *Stream {
	if c.stream.m == m && c.stream.h == h {
		return c.stream
	}
	for _, s := range c.joined {
		if s.m == m && s.h == h {
			return s
		}
	}
	return nil
}

// blocking says whether a stream of c synchronizes with the legacy stream, so that work on the legacy
// stream would depend on the capture (906). The registry's mutex must be held.
func (c *capture) blocking() bool {
	if c.stream.blocking() {
		return true
	}
	for _, s := range c.joined {
		if s.blocking() {
			return true
		}
	}
	return false
}

// NoteEscape records that op ran on the stream with handle h (0 or legacy: the legacy stream) while
// captures were in progress, for the escape audit: unless h itself captures, the work ran at once and is
// in no graph, so every capture in progress that this thread began lists it (see escape). One atomic load when nothing captures.
func (m *Manager) NoteEscape(op string, h cuda.Stream) {
	if m.reg.active.Load() == 0 || m.lookup(h) != nil {
		return
	}
	switch {
	case h == 0 || h == cuda.StreamLegacy:
		m.escape(op + " on " + m.legacy.String())
	case h == cuda.StreamPerThread:
		m.escape(op + " on " + m.perTh.String())
	default:
		m.escape(fmt.Sprintf("%s on stream %#x of device %d", op, uint64(h), m.dev.Ordinal()))
	}
}

// noteEscape is NoteEscape for a known stream; s nil means a synchronous call.
func (m *Manager) noteEscape(op string, s *Stream) {
	switch {
	case s == nil:
		m.escape(op + " (synchronous) on device " + fmt.Sprint(m.dev.Ordinal()))
	case s.capturing() == nil:
		m.escape(op + " on " + s.String())
	}
}

// escape adds what to every capture in progress that the calling thread began. The audit is of the
// capturing code's own work: what another thread runs meanwhile (its own copies, on its own streams) is
// no part of that code, and counting it made every capture in a busy process look incomplete (graphed()
// then fell back to eager for good). Work of the capturing code that it hands to another thread is not
// seen, as work issued through other libraries is not.
func (m *Manager) escape(what string) {
	tid := gettid()
	m.reg.mu.Lock()
	for c := range m.reg.caps {
		if c.tid != tid {
			continue
		}
		c.escaped++
		if len(c.escapes) < maxEscapes {
			c.escapes = append(c.escapes, what)
		}
	}
	m.reg.mu.Unlock()
}

// ParseMode maps "global", "thread_local" and "relaxed" to a CaptureMode.
func ParseMode(s string) (cuda.CaptureMode, error) {
	switch strings.ToLower(strings.ReplaceAll(s, "-", "_")) {
	case "global":
		return cuda.CaptureModeGlobal, nil
	case "thread_local", "threadlocal", "":
		return cuda.CaptureModeThreadLocal, nil
	case "relaxed":
		return cuda.CaptureModeRelaxed, nil
	}
	return 0, cuda.NewError("cudacore.begin_capture", cuda.ErrorInvalidValue,
		fmt.Sprintf("unknown capture mode %q: use \"thread_local\" (the default), \"global\" or \"relaxed\"", s))
}

// ModeName is the inverse of ParseMode.
func ModeName(m cuda.CaptureMode) string {
	switch m {
	case cuda.CaptureModeGlobal:
		return "global"
	case cuda.CaptureModeRelaxed:
		return "relaxed"
	}
	return "thread_local"
}

// CaptureError returns the error cudacore reports for a refused or failed operation during capture: a
// *cuda.Error with a capture-category Result r, Op "cudacore."+op and msg.
func CaptureError(r cuda.Result, op, msg string) *cuda.Error {
	return cuda.NewError("cudacore."+op, r, msg)
}

// IsCaptureResult says whether r is a driver result that invalidates or forbids a capture.
func IsCaptureResult(r cuda.Result) bool {
	switch r {
	case cuda.ErrorStreamCaptureUnsupported, cuda.ErrorStreamCaptureInvalidated, cuda.ErrorStreamCaptureImplicit,
		cuda.ErrorCapturedEvent, cuda.ErrorStreamCaptureWrongThread, cuda.ErrorStreamCaptureMerge, cuda.ErrorStreamCaptureUnmatched,
		cuda.ErrorStreamCaptureIsolation, cuda.ErrorStreamCaptureUnjoined:
		return true
	}
	return false
}

// ---- the checks made before calling the driver ---------------------------------------------------------

// blockingCapture returns a capture on a blocking stream of m's device: the legacy stream would
// implicitly wait on it (906).
func (m *Manager) blockingCapture() *capture {
	if m.reg.active.Load() == 0 {
		return nil
	}
	m.reg.mu.Lock()
	defer m.reg.mu.Unlock()
	for c := range m.reg.caps {
		if c.stream.m.dev == m.dev && c.blocking() {
			return c
		}
	}
	return nil
}

// unsafeCapture returns a capture that forbids potentially unsafe calls (synchronous allocation,
// synchronizing) on the calling thread: a GLOBAL capture anywhere, or a THREAD_LOCAL one begun on this
// thread. RELAXED captures allow them.
func (m *Manager) unsafeCapture() *capture { return m.reg.forbidding() }

// forbidsUnsafe says whether c forbids potentially unsafe calls on thread tid: a GLOBAL capture forbids
// them everywhere, a THREAD_LOCAL one on the thread that began it, a RELAXED one nowhere.
func (c *capture) forbidsUnsafe(tid int) bool {
	return c.mode == cuda.CaptureModeGlobal || c.mode == cuda.CaptureModeThreadLocal && c.tid == tid
}

// destroyGraph destroys g, a graph no Graph owns (one that a failed or aborted capture made, never
// instantiated), at once: cuGraphDestroy is legal during any capture. Its error is dropped: nothing can be
// done about it.
func (m *Manager) destroyGraph(g cuda.Graph) {
	_ = m.drv.GraphDestroy(m.ctx, g) // legal during any capture, unlike cuGraphExecDestroy
}

func (c *capture) describe() string {
	return fmt.Sprintf("%s captures in %s mode", c.stream, strings.ToUpper(ModeName(c.mode)))
}

func implicitMsg(what string, c *capture, fix string) string {
	return fmt.Sprintf("%s during capture would make the legacy stream depend on the capturing stream (the driver's error 906; %s); %s",
		what, c.describe(), fix)
}

func unsafeMsg(what string, c *capture, fix string) string {
	return fmt.Sprintf("%s is not permitted while %s (the driver's error 900; only RELAXED captures allow it, and THREAD_LOCAL ones only on other threads); %s",
		what, c.describe(), fix)
}

const fixSync = "end the capture first (end_capture(), or leave the `with stream.capture()` block), then synchronize; to order work inside the capture use events and stream.wait(event)"

// Failed handles err, the failure of an operation op that cudacore made on stream h outside the
// Manager (a free through the allocator): a capture error ends the captures it invalidated that this
// thread may end, as for the Manager's own operations (see after). It returns the error to report.
func (m *Manager) Failed(op string, h cuda.Stream, err error) error {
	return m.after(op, m.lookup(h), err)
}

// CheckUnsafe refuses, before the driver sees it, a potentially unsafe call (one that synchronizes or
// allocates synchronously: what) while a capture forbids it on the calling thread (900, see
// unsafeCapture); fix says what to do instead.
func (m *Manager) CheckUnsafe(op, what, fix string) error {
	if c := m.unsafeCapture(); c != nil {
		return CaptureError(cuda.ErrorStreamCaptureUnsupported, op, unsafeMsg(what, c, fix))
	}
	return nil
}

// checkStreamWait is the rule for synchronizing or querying s.
func (m *Manager) checkStreamWait(op string, s *Stream) error {
	if m.reg.active.Load() == 0 {
		return nil
	}
	m.reg.mu.Lock()
	c := s.cap
	m.reg.mu.Unlock()
	what := "synchronizing " + s.String()
	if op == "query" {
		what = "querying " + s.String()
	}
	if c != nil {
		return CaptureError(cuda.ErrorStreamCaptureUnsupported, op, fmt.Sprintf(
			"%s is not permitted while it captures (the driver's error 900, which would invalidate the capture); %s", what, fixSync))
	}
	if s.legacy {
		if c := m.blockingCapture(); c != nil {
			return CaptureError(cuda.ErrorStreamCaptureImplicit, op, implicitMsg(what, c, fixSync))
		}
	}
	if c := m.unsafeCapture(); c != nil {
		return CaptureError(cuda.ErrorStreamCaptureUnsupported, op, unsafeMsg(what, c, fixSync))
	}
	return nil
}

// checkDeviceSync is the rule for cuCtxSynchronize: it waits on every stream, the capturing ones too.
func (m *Manager) checkDeviceSync(op string) error {
	if m.reg.active.Load() == 0 {
		return nil
	}
	m.reg.mu.Lock()
	var hit *capture
	for c := range m.reg.caps {
		if c.stream.m.dev == m.dev {
			hit = c
			break
		}
	}
	m.reg.mu.Unlock()
	what := fmt.Sprintf("synchronizing device %d", m.dev.Ordinal())
	if hit != nil {
		return CaptureError(cuda.ErrorStreamCaptureUnsupported, op, fmt.Sprintf(
			"%s is not permitted while %s: it would wait on the capturing stream (the driver's error 900); %s", what, hit.describe(), fixSync))
	}
	if c := m.unsafeCapture(); c != nil {
		return CaptureError(cuda.ErrorStreamCaptureUnsupported, op, unsafeMsg(what, c, fixSync))
	}
	return nil
}

// Enqueue runs enqueue, which queues work on the stream with handle h that this package did not make
// (a kernel launch), under the capture rules: refused on the legacy stream while a blocking stream
// captures (906), and when the driver still fails with a capture error, the invalidated captures are
// ended so that the streams work again (see after).
//
// Enqueue does not bracket h (Use/Done): for a handle that may name a stream this Manager destroys, use
// EnqueueOn, which brackets it around the driver call only (a bracket held across Enqueue can deadlock,
// see EnqueueOn).
func (m *Manager) Enqueue(op string, h cuda.Stream, enqueue func() error) error {
	s, ran, err := m.enqueueChecked(op, h, enqueue)
	if !ran {
		return err
	}
	return m.after(op, s, err)
}

// EnqueueOn is Enqueue for work on a stream handle the caller has not bracketed: a stream this Manager
// destroyed is refused before its handle reaches the driver (Use), h cannot be destroyed while enqueue
// runs, and the driver's result is handled (after) once h is released again (Done).
//
// The bracket is a read lock, and the capture-failure handling of after takes it again on the same
// goroutine: ending the invalidated captures runs the frees deferred until then, each of which brackets
// its own stream (UseForFree). A read lock taken twice by one goroutine deadlocks once a writer (a
// stream created or destroyed on another thread, Create or Destroy) waits in between, so after must run
// outside the bracket.
func (m *Manager) EnqueueOn(op string, h cuda.Stream, enqueue func() error) error {
	if err := m.Use(op, h); err != nil {
		return err
	}
	s, ran, err := m.enqueueChecked(op, h, enqueue)
	m.Done(h)
	if !ran {
		return err
	}
	return m.after(op, s, err)
}

// enqueueChecked runs enqueue on h unless the capture rules refuse it (checkEnqueue): it returns the
// stream whose capture the result concerns (for after; nil if none), whether enqueue ran, and its error
// or the refusal.
func (m *Manager) enqueueChecked(op string, h cuda.Stream, enqueue func() error) (*Stream, bool, error) {
	s := m.lookup(h)
	if s == nil && (h == 0 || h == cuda.StreamLegacy) {
		s = m.legacy
	}
	if s != nil {
		if err := m.checkEnqueue(op, s); err != nil {
			return s, false, err
		}
	}
	return s, true, enqueue()
}

// checkEnqueue is the rule for enqueueing work on s: on the legacy stream it conflicts with capturing
// blocking streams (906).
func (m *Manager) checkEnqueue(op string, s *Stream) error {
	if !s.legacy || m.reg.active.Load() == 0 {
		return nil
	}
	if c := m.blockingCapture(); c != nil {
		return CaptureError(cuda.ErrorStreamCaptureImplicit, op, implicitMsg(
			strings.ReplaceAll(op, "_", " ")+" on the legacy stream", c,
			"pass the capturing stream (stream=<the capturing stream>), or create the capturing stream non-blocking"))
	}
	return nil
}

// capturing returns s's capture in progress, or nil.
func (s *Stream) capturing() *capture {
	if s.m.reg.active.Load() == 0 {
		return nil
	}
	s.m.reg.mu.Lock()
	defer s.m.reg.mu.Unlock()
	return s.cap
}

// Capturing says whether s is capturing now.
func (s *Stream) Capturing() bool { return s.capturing() != nil }

// CaptureMode returns the mode of the capture in progress and whether there is one.
func (s *Stream) CaptureMode() (cuda.CaptureMode, bool) {
	c := s.capturing()
	if c == nil {
		return 0, false
	}
	return c.mode, true
}

// ---- allocation inside capture (called by the allocation path) ------------------------------------------

// CheckAllocate is called before an allocation of the device's allocator on stream h. It refuses what
// capture forbids: on a device with the synchronous strategy an allocation on a capturing stream (it
// cannot become a graph node) or while unsafe calls are forbidden (900); with the pool strategy, an
// allocation on the legacy stream while a blocking stream captures (906).
func (m *Manager) CheckAllocate(h cuda.Stream) error {
	if m.reg.active.Load() == 0 {
		return nil
	}
	const op = "allocate"
	if m.dev.Strategy() == device.StrategySync {
		if s := m.lookup(h); s != nil && s.capturing() != nil {
			return CaptureError(cuda.ErrorStreamCaptureUnsupported, op, fmt.Sprintf(
				"device %d allocates synchronously (strategy \"sync\": cuMemAlloc), which cannot be captured into a graph; allocate before capture and reuse the buffer inside it",
				m.dev.Ordinal()))
		}
		if c := m.unsafeCapture(); c != nil {
			return CaptureError(cuda.ErrorStreamCaptureUnsupported, op, unsafeMsg(
				fmt.Sprintf("a synchronous allocation on device %d (strategy \"sync\")", m.dev.Ordinal()), c,
				"allocate before capture and reuse the buffer inside it"))
		}
		return nil
	}
	if h == 0 || h == cuda.StreamLegacy {
		if c := m.blockingCapture(); c != nil {
			return CaptureError(cuda.ErrorStreamCaptureImplicit, op, implicitMsg("an allocation on the legacy stream", c,
				"allocate on the capturing stream (allocate(n, stream=<the capturing stream>)) so it becomes a graph node, or before capture"))
		}
	}
	if m.lookup(h) == nil {
		// Outside the captures, a stream-ordered allocation is an unsafe call (the driver's 900, which
		// invalidates the capture): refused whether or not the cache could serve it, so that the answer
		// does not depend on what happens to be cached.
		if c := m.unsafeCapture(); c != nil {
			return CaptureError(cuda.ErrorStreamCaptureUnsupported, op, unsafeMsg(
				fmt.Sprintf("an allocation on %s, which is not part of a capture,", m.describe(h)), c,
				"allocate before the capture, or on the capturing stream (it becomes a graph node); the capture goes on"))
		}
	}
	return nil
}

// describe names stream h of m's device for messages (Stream.String too).
func (m *Manager) describe(h cuda.Stream) string {
	switch {
	case h == 0 || h == cuda.StreamLegacy:
		return fmt.Sprintf("the legacy stream of device %d", m.dev.Ordinal())
	case h == cuda.StreamPerThread:
		return fmt.Sprintf("the per-thread default stream of device %d", m.dev.Ordinal())
	}
	return fmt.Sprintf("stream %#x of device %d", uint64(h), m.dev.Ordinal())
}

// NoteAllocate counts a successful allocation p of size bytes on stream h into h's capture, if it
// captures: the graph it makes then reports the memory (Graph.MemoryHeld), and a free of p on h during
// the capture is a graph node (GraphMemory).
func (m *Manager) NoteAllocate(h cuda.Stream, p cuda.DevicePtr, size uint64) {
	if m.reg.active.Load() == 0 {
		return
	}
	m.reg.mu.Lock()
	captured := false
	for c := range m.reg.caps {
		if c.member(m, h) != nil {
			c.allocs++
			c.bytes += size
			if c.ptrs == nil {
				c.ptrs = map[cuda.DevicePtr]uint64{}
			}
			c.ptrs[p] = size
			captured = true
			break
		}
	}
	if !captured {
		m.reg.mu.Unlock()
		m.Reissued(p)
		return
	}
	// Under the registry, so that the capture cannot end (and void p) before p has its token: a void
	// entry of p now is an earlier owner's, whose address the driver handed out again.
	m.gm.mu.Lock()
	m.tokenLocked(p)
	m.gm.mu.Unlock()
	m.reg.mu.Unlock()
}

// Captured says whether p is an allocation of the capture stream h is in now (allocated on h or on
// another of its streams, and not freed in it).
func (m *Manager) Captured(h cuda.Stream, p cuda.DevicePtr) bool {
	captured, _ := m.captureAlloc(h, p)
	return captured
}

// captureAlloc says whether p is an allocation of the capture stream h is in now, and whether that
// capture has streams joined to it.
func (m *Manager) captureAlloc(h cuda.Stream, p cuda.DevicePtr) (captured, joined bool) {
	if m.reg.active.Load() == 0 {
		return false, false
	}
	m.reg.mu.Lock()
	defer m.reg.mu.Unlock()
	for c := range m.reg.caps {
		if c.member(m, h) != nil {
			_, ok := c.ptrs[p]
			return ok, len(c.joined) > 0
		}
	}
	return false, false
}

// GraphMemory says whether p was allocated on stream h during the capture h is in now, and may be freed
// there as a node of the graph. Memory from before the capture must wait for it to end (the driver
// refuses its free on a capturing stream). So must the capture's own memory once a stream joined the
// capture: a free node follows only the work of the stream it is made on, so it could come before work
// of another of the capture's streams that still uses the memory, or, made on a joined stream after its
// last join back, be work that nothing joins back (904 at the capture's end). Freed after the end, it
// follows its graph's rules (freed after each launch).
func (m *Manager) GraphMemory(h cuda.Stream, p cuda.DevicePtr) bool {
	captured, joined := m.captureAlloc(h, p)
	return captured && !joined
}

// lookup finds a capturing stream of m by handle (only capturing streams are registered: origins and
// the streams joined to them).
func (m *Manager) lookup(h cuda.Stream) *Stream {
	m.reg.mu.Lock()
	defer m.reg.mu.Unlock()
	for c := range m.reg.caps {
		if s := c.member(m, h); s != nil {
			return s
		}
	}
	return nil
}

// ---- begin, end, and recovery ----------------------------------------------------------------------------

// BeginCapture starts capturing s into a graph. The legacy and per-thread default streams are refused
// (the driver refuses the legacy stream with 900), as is a stream that captures already.
func (s *Stream) BeginCapture(mode cuda.CaptureMode) error {
	const op = "begin_capture"
	if err := s.alive(op); err != nil {
		return err
	}
	if mode < cuda.CaptureModeGlobal || mode > cuda.CaptureModeRelaxed {
		return cuda.NewError("cudacore."+op, cuda.ErrorInvalidValue, fmt.Sprintf("unknown capture mode %d", mode))
	}
	if s.legacy || s.perThread {
		return CaptureError(cuda.ErrorStreamCaptureUnsupported, op, fmt.Sprintf(
			"%s cannot be captured (the driver refuses the legacy stream with error 900); capture a stream you created: d.create_stream()", s))
	}
	m := s.m
	m.reg.change.Lock() // registered and begun at the driver as one change (Steady)
	defer m.reg.change.Unlock()
	m.reg.mu.Lock()
	// Checked again under the registry's mutex, which Stream.Destroy takes after marking s destroyed: a
	// Destroy either came first (refused here) or finds this capture registered and ends it.
	if err := s.alive(op); err != nil {
		m.reg.mu.Unlock()
		return err
	}
	if c := s.cap; c != nil {
		m.reg.mu.Unlock()
		if c.stream != s {
			return cuda.NewError("cudacore."+op, cuda.ErrorIllegalState, fmt.Sprintf(
				"%s joined the capture on %s (it waited on an event recorded there); it captures into that graph until the capture ends", s, c.stream))
		}
		return cuda.NewError("cudacore."+op, cuda.ErrorIllegalState, fmt.Sprintf("%s is already capturing; end that capture first", s))
	}
	c := &capture{stream: s, mode: mode, tid: gettid()}
	s.cap, s.failed = c, nil
	m.reg.caps[c] = struct{}{}
	m.reg.publish(m.reg.active.Add(1))
	m.reg.mu.Unlock()
	// The cache is told first, so no cached block can be handed out on s once the driver captures.
	st := m.memory()
	if st != nil {
		st.SetCapturing(s.h, true)
	}
	if err := m.drv.StreamBeginCapture(m.ctx, s.h, mode); err != nil {
		runAll(m.unregister(c))
		return err
	}
	return nil
}

// unregister forgets c, with the streams joined to it. It returns the calls that waited for c's end,
// and when c was the last capture the calls deferred until the captures ended, for the caller to run
// once the capture's graph, if any, is adopted: a deferred free of memory the new graph uses must find
// the graph among the users (FreeGraphAware) and wait for its destruction, not free memory that the
// graph's nodes name (the real driver crashes instantiating such a graph).
func (m *Manager) unregister(c *capture) (ready []func()) {
	m.reg.mu.Lock()
	if _, ok := m.reg.caps[c]; ok {
		delete(m.reg.caps, c)
		m.reg.publish(m.reg.active.Add(-1))
	}
	streams := append([]*Stream{c.stream}, c.joined...)
	for _, s := range streams {
		if s.cap == c {
			s.cap = nil
		}
	}
	if m.reg.active.Load() == 0 {
		ready, m.reg.deferred = m.reg.deferred, nil
	}
	ready = append(ready, c.onEnd...)
	c.onEnd = nil
	m.reg.mu.Unlock()
	for _, s := range streams {
		if st := s.m.memory(); st != nil {
			st.SetCapturing(s.h, false)
		}
	}
	return ready
}

// stillCaptures says whether the driver still has s capturing (active or invalidated) after a failed
// attempt to end its capture: then cudacore keeps the capture registered, rather than forget one the
// driver still has (whose next free would fail and leak).
func (s *Stream) stillCaptures() bool {
	st, err := s.m.drv.StreamIsCapturing(s.m.ctx, s.h)
	return err == nil && st != cuda.CaptureStatusNone
}

// runAll runs the deferred calls that unregister returned, in order.
func runAll(fns []func()) {
	for _, fn := range fns {
		fn()
	}
}

// StreamCapturing says whether the stream with handle h of m's device is capturing.
func (m *Manager) StreamCapturing(h cuda.Stream) bool {
	if m.reg.active.Load() == 0 {
		return false
	}
	return m.lookup(h) != nil
}

// abandon ends c at the driver, discarding any graph, and forgets it; failed, if not nil, is what
// EndCapture of its stream will return. If the driver fails to end it and the stream still captures, c
// stays registered, so that its rules still apply and it can be ended again, and the error is returned;
// unless force (the stream is being destroyed, which ends the capture at the driver too).
func (m *Manager) abandon(c *capture, failed *cuda.Error, force bool) error {
	sm := c.stream.m
	m.reg.change.Lock() // ended at the driver and unregistered as one change (Steady)
	defer m.reg.change.Unlock()
	// Another thread may have ended it first (the Destroy of its stream, which may have destroyed the
	// stream since): then there is nothing left to end, and the handle must not reach the driver.
	m.reg.mu.Lock()
	_, live := m.reg.caps[c]
	m.reg.mu.Unlock()
	if !live {
		return nil
	}
	g, err := sm.drv.StreamEndCapture(sm.ctx, c.stream.h)
	if err != nil && !force {
		if c.stream.stillCaptures() {
			return err
		}
	}
	ready := sm.unregister(c)
	if err == nil && g != 0 {
		sm.destroyGraph(g)
	}
	sm.discard(c.ptrs)
	runAll(ready)
	if failed != nil {
		m.reg.mu.Lock()
		c.stream.failed = failed
		m.reg.mu.Unlock()
	}
	return nil
}

// EndCapture ends s's capture and returns the graph (not yet instantiated). If cudacore ended the
// capture already because an operation failed, it returns that CaptureError, once. Ending a capture that
// was never begun is an IllegalState error, as the driver has it.
func (s *Stream) EndCapture() (*Graph, error) {
	const op = "end_capture"
	if err := s.alive(op); err != nil {
		return nil, err
	}
	m := s.m
	m.reg.change.Lock() // ended at the driver and unregistered as one change (Steady)
	defer m.reg.change.Unlock()
	m.reg.mu.Lock()
	c, failed := s.cap, s.failed
	s.failed = nil
	m.reg.mu.Unlock()
	if c == nil {
		if failed != nil {
			return nil, failed
		}
		return nil, cuda.NewError("cudacore."+op, cuda.ErrorIllegalState, fmt.Sprintf(
			"%s is not capturing: call begin_capture() first (or use `with stream.capture() as graph:`)", s))
	}
	if c.stream != s {
		return nil, notOrigin(op, s, c)
	}
	if c.mode != cuda.CaptureModeRelaxed && c.tid != gettid() {
		return nil, wrongThread(op, c)
	}
	g, err := m.drv.StreamEndCapture(m.ctx, s.h)
	if err != nil && !IsCaptureResult(cuda.ResultOf(err)) && g == 0 {
		// A failure that is not the capture's own (a transient error of the call) may leave the driver's
		// stream capturing: then the capture stays registered, so that end_capture or abort_capture can
		// be called again and every rule still applies, rather than cudacore forgetting a capture the
		// driver still has (whose next free would fail and leak).
		if s.stillCaptures() {
			return nil, fmt.Errorf("ending the capture on %s failed, and the stream still captures; end or abort it again: %w", s, err)
		}
	}
	ready := m.unregister(c)
	if err != nil {
		if g != 0 {
			m.destroyGraph(g)
		}
		m.discard(c.ptrs)
		runAll(ready)
		if cuda.ResultOf(err) == cuda.ErrorStreamCaptureUnjoined {
			return nil, CaptureError(cuda.ErrorStreamCaptureUnjoined, op, fmt.Sprintf(
				"work captured on %s was not joined back to %s, so the capture failed and no graph was made (the driver's error 904); "+
					"before ending a capture, make the stream that began it wait for each joined stream's last work "+
					"(origin.wait(joined.record())); the streams work again: %v",
				joinedNames(c), s, err))
		}
		if IsCaptureResult(cuda.ResultOf(err)) {
			return nil, CaptureError(cuda.ResultOf(err), op, fmt.Sprintf(
				"the capture on %s was invalidated by an operation cudacore did not see (made through another library?), so no graph was made; the stream works again: %v",
				s, err))
		}
		return nil, err
	}
	gr, err := m.newGraph(g, c)
	runAll(ready) // after the graph took the capture's uses (unregister)
	return gr, err
}

// AbortCapture ends s's capture, if any, and discards it and any pending failure. It is what a `with`
// block that raised does. As with EndCapture, a GLOBAL or THREAD_LOCAL capture is aborted only on the
// thread that began it (the driver would refuse with 908 and go on capturing), and a stream joined to
// another stream's capture cannot abort it: that is the origin's to end. Refused, the capture goes on.
func (s *Stream) AbortCapture() error {
	const op = "abort_capture"
	m := s.m
	m.reg.mu.Lock()
	c := s.cap
	if c != nil && c.stream != s {
		m.reg.mu.Unlock()
		return notOrigin(op, s, c)
	}
	if c != nil && c.mode != cuda.CaptureModeRelaxed && c.tid != gettid() {
		m.reg.mu.Unlock()
		return wrongThread(op, c)
	}
	failed := s.failed
	s.failed = nil
	m.reg.mu.Unlock()
	if c == nil {
		return nil
	}
	if err := m.abandon(c, nil, false); err != nil {
		m.reg.mu.Lock()
		s.failed = failed
		m.reg.mu.Unlock()
		return fmt.Errorf("aborting the capture on %s failed, and the stream still captures; abort or end it again: %w", s, err)
	}
	return nil
}

// wrongThread is the refusal of op, the end of c on a thread other than the one that began it, where
// c's mode forbids that (the driver's 908, after which the capture goes on).
func wrongThread(op string, c *capture) error {
	return CaptureError(cuda.ErrorStreamCaptureWrongThread, op, fmt.Sprintf(
		"a %s capture must be ended by the thread that began it (the driver's error 908); end it there, or capture in \"relaxed\" mode",
		strings.ToUpper(ModeName(c.mode))))
}

// notOrigin is the refusal of op, the end of c, on s, a stream joined to c (the driver's 903, which
// would invalidate the capture): only the stream that began a capture ends it.
func notOrigin(op string, s *Stream, c *capture) error {
	return CaptureError(cuda.ErrorStreamCaptureUnmatched, op, fmt.Sprintf(
		"%s joined the capture that %s began (it waited on an event recorded there), and only that stream can end it (the driver's error 903); "+
			"join this stream back (origin.wait(joined.record())) and end or abort the capture on %s; the capture goes on",
		s, c.stream, c.stream))
}

// joinedNames names the streams joined to c, for messages.
func joinedNames(c *capture) string {
	names := make([]string, 0, len(c.joined))
	for _, s := range c.joined {
		names = append(names, s.String())
	}
	if len(names) == 0 {
		return "a stream joined to the capture outside cudacore"
	}
	return strings.Join(names, " and ")
}

// after handles the result of a driver call made for op on stream s (nil: none in particular). A capture
// error ends every capture it invalidated (and s's own), so the streams work again, and comes back as a
// CaptureError naming op. Other errors and nil pass through.
func (m *Manager) after(op string, s *Stream, err error) error {
	if err == nil {
		if m.reg.active.Load() > 0 {
			m.noteEscape(op, s)
		}
		return nil
	}
	r := cuda.ResultOf(err)
	if !IsCaptureResult(r) || m.reg.active.Load() == 0 {
		return err
	}
	var de *cuda.Error
	if !errors.As(err, &de) {
		de = cuda.NewError(op, r, "")
	}
	m.reg.mu.Lock()
	caps := make([]*capture, 0, len(m.reg.caps))
	var own *capture // s's capture, whether s began it or joined it
	for c := range m.reg.caps {
		caps = append(caps, c)
	}
	if s != nil {
		own = s.cap
	}
	m.reg.mu.Unlock()
	var ended []string
	for _, c := range caps {
		sm := c.stream.m
		// The query holds the stream: another thread may be destroying it (its Destroy then ends this
		// capture itself). A stream marked destroyed is skipped before its lock is taken, since the
		// goroutine destroying it may be the one here.
		var st cuda.CaptureStatus
		var qerr error
		if c.stream.destroyed.Load() || c.stream.hold(op, func() error {
			st, qerr = sm.drv.StreamIsCapturing(sm.ctx, c.stream.h)
			return nil
		}) != nil {
			continue
		}
		if c != own && qerr == nil && st == cuda.CaptureStatusActive {
			continue
		}
		if c.mode != cuda.CaptureModeRelaxed && c.tid != gettid() {
			// The driver ends a GLOBAL or THREAD_LOCAL capture only on the thread that began it: ended
			// here it would stay at the driver while cudacore forgot it, and the next unsafe call would
			// meet a capture cudacore no longer guards. It stays registered (its rules still apply), and
			// its own end_capture reports the invalidation.
			continue
		}
		ended = append(ended, c.stream.String())
		first := CaptureError(r, op, fmt.Sprintf(
			"the capture on %s failed at its first failing operation, %s (the driver's error %d %s from %s); cudacore ended the capture, so the stream works again; capture again without that operation",
			c.stream, strings.ReplaceAll(op, "_", " "), int(r), r, de.Op))
		_ = m.abandon(c, first, false) // one the driver still has stays registered, and its end reports it
	}
	what := "no capture was in progress on it"
	if len(ended) > 0 {
		what = "cudacore ended the capture on " + strings.Join(ended, " and ") + " so the stream works again"
	}
	return &cuda.Error{Op: "cudacore." + op, Result: r, Msg: fmt.Sprintf(
		"%s failed during stream capture with the driver's error %d (%s); %s", strings.ReplaceAll(op, "_", " "), int(r), r.Description(), what),
		Err: err}
}

// ---- ordering between streams ------------------------------------------------------------------------

// Order makes the work queued on waiter from now on wait for the work queued on producer so far, through
// an event on the device (the host does not wait). It is how a buffer's stream order reaches a consumer's
// stream (the DLPack export). Both enqueues obey the capture rules of Enqueue: the legacy stream is
// refused while a blocking stream captures, and a capture error from the driver ends the invalidated
// captures. producer is bracketed here around its enqueue (EnqueueOn): a stream of this Manager that was
// destroyed is refused with a closed error before its handle reaches the driver, and the caller must not
// hold the bracket itself. waiter is bracketed the same way: the consumer's owner keeps a stream of its
// own alive, but a handle of a cudacore stream may name one being destroyed (or one closed during a
// capture, whose destroy waits for the capture's end). Equal streams need no ordering and make no driver
// call.
//
// While either stream captures, the ordering would cross the capture's boundary (the driver answers 905
// and invalidates the capture), so it is refused here, before the driver sees it.
func (m *Manager) Order(op string, waiter, producer cuda.Stream) error {
	if sameStream(waiter, producer) {
		return nil
	}
	for _, h := range []cuda.Stream{producer, waiter} {
		if m.StreamCapturing(h) {
			return CaptureError(cuda.ErrorStreamCaptureIsolation, op, fmt.Sprintf(
				"stream %#x is capturing, and ordering streams %#x and %#x with an event would cross the capture's boundary "+
					"(the driver's error 905, which would end the capture); export before or after the capture, or for the "+
					"capturing stream itself (stream=<its handle>), or with stream=-1 and order the work yourself",
				uint64(h), uint64(producer), uint64(waiter)))
		}
	}
	ev, err := m.drv.EventCreate(m.ctx, cuda.EventDisableTiming)
	if err != nil {
		return err
	}
	// An event may be destroyed while a wait on it is queued: the driver releases it once the wait is done.
	defer func() { _ = m.drv.EventDestroy(m.ctx, ev) }()
	if err := m.EnqueueOn(op, producer, func() error { return m.drv.EventRecord(m.ctx, ev, producer) }); err != nil {
		return err
	}
	return m.EnqueueOn(op, waiter, func() error { return m.drv.StreamWaitEvent(m.ctx, waiter, ev) })
}

// sameStream says whether a and b name one stream (0 and the legacy handle are the same stream).
func sameStream(a, b cuda.Stream) bool {
	if a == 0 {
		a = cuda.StreamLegacy
	}
	if b == 0 {
		b = cuda.StreamLegacy
	}
	return a == b
}
