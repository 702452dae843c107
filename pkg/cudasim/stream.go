package cudasim

import (
	"fmt"
	"slices"
	"time"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// The stream priority range of Hopper, as cuCtxGetStreamPriorityRange reports it: lower is greater.
const (
	leastPriority    = 0
	greatestPriority = -5
)

type stream struct {
	dev         *device
	handle      cuda.Stream
	nonBlocking bool
	priority    int
	legacy      bool
	cap         *capture // guarded by dev.mu; nil when not capturing
}

// capture is one capture sequence. nodes, allocs, joined and tails are guarded by the device mutex;
// invalid by Driver.capMu, because an unsafe call on another device (GLOBAL mode) invalidates it too.
//
// The nodes form a chain in the order they were captured, which is how a launch replays them (a valid
// order, since the simulator runs work at once). Their dependencies are kept beside them only to find
// work that was not joined back to the origin stream (cuStreamEndCapture's 904).
type capture struct {
	dev     *device
	stream  *stream // the origin: the stream that began the capture and alone may end it
	mode    cuda.CaptureMode
	tid     int
	invalid bool
	nodes   []node
	allocs  []*alloc  // graph memory allocated during the capture
	joined  []*stream // streams that joined by waiting on an event recorded in the capture
	deps    [][]int   // deps[i]: the nodes that node i depends on
	tails   map[*stream][]int
}

// add appends n, captured on s (the origin or a joined stream), after s's current tail.
func (c *capture) add(s *stream, n node) {
	c.deps = append(c.deps, c.tails[s])
	c.tails[s] = []int{len(c.nodes)}
	c.nodes = append(c.nodes, n)
}

// blocking says whether a stream of c synchronizes with the legacy stream (906 for its work).
func (c *capture) blocking() bool {
	if !c.stream.nonBlocking {
		return true
	}
	for _, s := range c.joined {
		if !s.nonBlocking {
			return true
		}
	}
	return false
}

// unjoined returns how many nodes the origin's tail does not depend on, directly or through others: work
// of a joined stream that no wait of the origin's brought back.
func (c *capture) unjoined() int {
	seen := make([]bool, len(c.nodes))
	todo := slices.Clone(c.tails[c.stream])
	for len(todo) > 0 {
		i := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		if !seen[i] {
			seen[i] = true
			todo = append(todo, c.deps[i]...)
		}
	}
	n := 0
	for _, ok := range seen {
		if !ok {
			n++
		}
	}
	return n
}

// leave takes the joined stream s out of c.
func (c *capture) leave(s *stream) {
	c.joined = slices.DeleteFunc(c.joined, func(j *stream) bool { return j == s })
	delete(c.tails, s)
	s.cap = nil
}

type nodeKind uint8

const (
	nodeHtoD nodeKind = iota + 1
	nodeDtoH
	nodeDtoD
	nodeMemset
	nodeAlloc
	nodeFree
)

// node is one recorded operation. Host slices are the caller's: replay reads and writes them at launch,
// so each launch sees the host data of that moment, as with the real driver's pinned copies.
type node struct {
	kind    nodeKind
	dst     cuda.DevicePtr
	src     cuda.DevicePtr
	n       uint64
	host    []byte
	pinned  bool    // host came from MemHostAlloc; pageable copies are recorded the same way
	pinBase uintptr // the mapping host lies in, checked at launch so a freed mapping is never touched
	value   uint8
}

type event struct {
	flags      uint32
	recorded   bool
	at         time.Time
	capturedIn *capture // last recorded inside this capture
	deps       []int    // then: the nodes of capturedIn that a stream waiting on it depends on
}

// resolve finds a stream of v without capture checks.
func (d *Driver) resolve(op string, v *device, sh cuda.Stream) (*stream, error) {
	switch sh {
	case 0, cuda.StreamLegacy:
		return v.legacy, nil
	case cuda.StreamPerThread:
		tid := gettid()
		s := v.perThread[tid]
		if s == nil {
			s = &stream{dev: v, handle: cuda.StreamPerThread}
			v.perThread[tid] = s
		}
		return s, nil
	}
	s := v.streams[sh]
	if s == nil {
		d.checkDead(op, v, sh)
		return nil, errf(op, cuda.ErrorInvalidHandle, "stream %#x is not a live stream of device %d", uint64(sh), v.index)
	}
	return s, nil
}

// checkDead ends the process (d.fatal) when sh names a stream that was destroyed: see WithFatal.
func (d *Driver) checkDead(op string, v *device, sh cuda.Stream) {
	if _, dead := v.dead[sh]; dead {
		v.mu.Unlock() // the fatal hook may panic in tests: leave the device usable
		defer v.mu.Lock()
		d.fatal(fmt.Sprintf("%s was handed stream %#x of device %d, which was destroyed", op, uint64(sh), v.index))
	}
}

// streamOp resolves the stream an asynchronous operation is enqueued on and applies the capture rules:
// the legacy stream conflicts with capturing blocking streams (906) and an invalidated capture refuses
// work (901). A nil s.cap afterwards means run the operation now.
func (d *Driver) streamOp(op string, v *device, sh cuda.Stream) (*stream, error) {
	s, err := d.resolve(op, v, sh)
	if err != nil {
		return nil, err
	}
	if s.legacy {
		return s, d.implicitSync(op, v)
	}
	if s.cap != nil {
		d.capMu.Lock()
		inv := s.cap.invalid
		d.capMu.Unlock()
		if inv {
			return nil, errf(op, cuda.ErrorStreamCaptureInvalidated, "the capture on this stream was invalidated by an earlier error; end it")
		}
	}
	return s, nil
}

// implicitSync is the legacy stream's implicit synchronization with every blocking stream of the
// context: if one of them is capturing, the operation fails with 906 and that capture is invalidated,
// in every capture mode.
func (d *Driver) implicitSync(op string, v *device) error {
	d.capMu.Lock()
	defer d.capMu.Unlock()
	hit := false
	for c := range d.caps {
		if c.dev == v && c.blocking() {
			c.invalid, hit = true, true
		}
	}
	if hit {
		return errf(op, cuda.ErrorStreamCaptureImplicit, "this uses the legacy stream, which would wait on a capturing blocking stream; the capture is now invalidated")
	}
	return nil
}

// unsafeCall applies the rule for potentially unsafe calls (synchronous allocation and free, synchronizing
// other work, destroying a graph or an executable graph): they fail with 900 from any thread while a GLOBAL capture runs anywhere in the process, and from
// the capturing thread while a THREAD_LOCAL capture runs; RELAXED captures allow them. The captures that
// forbade the call are invalidated.
func (d *Driver) unsafeCall(op string, _ *device) error {
	d.capMu.Lock()
	defer d.capMu.Unlock()
	if len(d.caps) == 0 {
		return nil
	}
	tid := gettid()
	hit := false
	for c := range d.caps {
		if c.mode == cuda.CaptureModeGlobal || (c.mode == cuda.CaptureModeThreadLocal && c.tid == tid) {
			c.invalid, hit = true, true
		}
	}
	if hit {
		return errf(op, cuda.ErrorStreamCaptureUnsupported, "not permitted while a stream capture is under way (a GLOBAL capture anywhere, or a THREAD_LOCAL one on this thread); the capture is now invalidated")
	}
	return nil
}

func (d *Driver) invalidate(c *capture) {
	d.capMu.Lock()
	c.invalid = true
	d.capMu.Unlock()
}

// endCaptureLocked forgets c and, unless keep, gives back its graph memory.
func (d *Driver) endCaptureLocked(c *capture, keep bool) {
	d.capMu.Lock()
	delete(d.caps, c)
	d.capMu.Unlock()
	c.stream.cap = nil
	for _, s := range c.joined {
		s.cap = nil
	}
	if !keep {
		for _, a := range c.allocs {
			c.dev.release(a)
		}
	}
}

func (d *Driver) StreamCreate(c cuda.Context, flags uint32, priority int) (cuda.Stream, error) {
	const op = "cuStreamCreateWithPriority"
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	if flags&^cuda.StreamNonBlocking != 0 {
		return 0, errf(op, cuda.ErrorInvalidValue, "unknown stream flags %#x", flags)
	}
	// Out-of-range priorities are clamped, not refused, as the driver does.
	priority = min(max(priority, greatestPriority), leastPriority)
	h := cuda.Stream(v.handle(kindStreamHandle))
	if n := len(v.deadStreams); v.conds.ReuseHandles && n > 0 {
		// The driver's stream handles are host addresses, and a destroyed stream's is handed out again.
		h, v.deadStreams = v.deadStreams[n-1], v.deadStreams[:n-1]
		delete(v.dead, h)
	}
	s := &stream{dev: v, handle: h, nonBlocking: flags&cuda.StreamNonBlocking != 0, priority: priority}
	v.streams[s.handle] = s
	return s.handle, nil
}

func (d *Driver) StreamDestroy(c cuda.Context, sh cuda.Stream) error {
	const op = "cuStreamDestroy_v2"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	s := v.streams[sh]
	if s == nil {
		d.checkDead(op, v, sh)
		return errf(op, cuda.ErrorInvalidHandle, "stream %#x is not a live stream of device %d", uint64(sh), v.index)
	}
	switch {
	case s.cap != nil && s.cap.stream == s:
		d.endCaptureLocked(s.cap, false)
	case s.cap != nil:
		// A joined stream destroyed before it was joined back: its work can never rejoin the origin.
		d.invalidate(s.cap)
		s.cap.leave(s)
	}
	delete(v.streams, sh)
	if v.dead == nil {
		v.dead = map[cuda.Stream]struct{}{}
	}
	v.dead[sh] = struct{}{}
	if v.conds.ReuseHandles {
		v.deadStreams = append(v.deadStreams, sh)
	}
	return nil
}

func (d *Driver) StreamSynchronize(c cuda.Context, sh cuda.Stream) error {
	const op = "cuStreamSynchronize"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	if err := d.syncStream(op, v, sh); err != nil {
		return err
	}
	v.syncPoint()
	return nil
}

// syncStream is the capture rule for waiting on a stream: never the capturing stream itself (900 in every
// mode, invalidating it), and otherwise only where unsafe calls are allowed.
func (d *Driver) syncStream(op string, v *device, sh cuda.Stream) error {
	s, err := d.resolve(op, v, sh)
	if err != nil {
		return err
	}
	if s.cap != nil {
		d.invalidate(s.cap)
		return errf(op, cuda.ErrorStreamCaptureUnsupported, "a capturing stream cannot be synchronized or queried; the capture is now invalidated")
	}
	return d.unsafeCall(op, v)
}

// StreamQuery implements cuStreamQuery: simulated work is done when its call returns, so a stream is
// always ready.
func (d *Driver) StreamQuery(c cuda.Context, sh cuda.Stream) error {
	const op = "cuStreamQuery"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	return d.syncStream(op, v, sh)
}

func (d *Driver) CtxSynchronize(c cuda.Context) error {
	const op = "cuCtxSynchronize"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	// A context synchronize waits on every stream, the capturing ones included, which is never allowed.
	d.capMu.Lock()
	hit := false
	for cp := range d.caps {
		if cp.dev == v {
			cp.invalid, hit = true, true
		}
	}
	d.capMu.Unlock()
	if hit {
		return errf(op, cuda.ErrorStreamCaptureUnsupported, "a stream of this context is capturing; the capture is now invalidated")
	}
	if err := d.unsafeCall(op, v); err != nil {
		return err
	}
	v.syncPoint()
	return nil
}

func (d *Driver) StreamWaitEvent(c cuda.Context, sh cuda.Stream, eh cuda.Event) error {
	const op = "cuStreamWaitEvent"
	if owner := d.handleDevice(uint64(eh), kindEventHandle); owner != nil {
		if cv, err := d.ctxDevice(op, c); err == nil && cv != owner {
			return d.waitForeignEvent(op, c, sh, owner, eh)
		}
	}
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	e := v.events[eh]
	if e == nil {
		return errf(op, cuda.ErrorInvalidHandle, "event %#x is not a live event of device %d", uint64(eh), v.index)
	}
	s, err := d.streamOp(op, v, sh)
	if err != nil {
		return err
	}
	return d.joinOrWait(op, s, e)
}

// joinOrWait applies the capture rules of a stream s waiting on event e of the same device: an event
// recorded in a capture in progress joins s to that capture (its later work depends on the event's
// nodes); a capturing stream may wait only on events of its own capture.
func (d *Driver) joinOrWait(op string, s *stream, e *event) error {
	cp := e.capturedIn
	if cp != nil {
		d.capMu.Lock()
		_, active := d.caps[cp]
		d.capMu.Unlock()
		if !active {
			return errf(op, cuda.ErrorCapturedEvent, "the event was last recorded in a stream capture that has ended")
		}
	}
	switch {
	case cp != nil && s.cap == cp:
		s.cap.tails[s] = mergeDeps(s.cap.tails[s], e.deps)
	case cp != nil && s.cap != nil:
		d.invalidate(s.cap)
		d.invalidate(cp)
		return errf(op, cuda.ErrorStreamCaptureMerge, "the stream captures into another capture than the one the event was recorded in; both are now invalidated")
	case cp != nil && s.legacy:
		d.invalidate(cp)
		return errf(op, cuda.ErrorStreamCaptureImplicit, "the legacy stream cannot join a capture; the capture is now invalidated")
	case cp != nil:
		if cp.invalid {
			return errf(op, cuda.ErrorStreamCaptureInvalidated, "the event's capture was invalidated by an earlier error")
		}
		s.cap = cp
		cp.joined = append(cp.joined, s)
		cp.tails[s] = slices.Clone(e.deps)
	case s.cap != nil && e.recorded:
		d.invalidate(s.cap)
		return errf(op, cuda.ErrorStreamCaptureIsolation, "a capturing stream cannot wait on an event recorded outside its capture; the capture is now invalidated")
	}
	return nil
}

// mergeDeps returns the union of two sorted node lists.
func mergeDeps(a, b []int) []int {
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}

func (d *Driver) StreamBeginCapture(c cuda.Context, sh cuda.Stream, mode cuda.CaptureMode) error {
	const op = "cuStreamBeginCapture_v2"
	v, err := d.ctx(op, c)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	if mode < cuda.CaptureModeGlobal || mode > cuda.CaptureModeRelaxed {
		return errf(op, cuda.ErrorInvalidValue, "unknown capture mode %d", mode)
	}
	s, err := d.resolve(op, v, sh)
	if err != nil {
		return err
	}
	if s.legacy {
		return errf(op, cuda.ErrorStreamCaptureUnsupported, "the legacy stream cannot be captured; capture a stream you created")
	}
	if s.cap != nil {
		return errf(op, cuda.ErrorIllegalState, "the stream is already capturing")
	}
	cp := &capture{dev: v, stream: s, mode: mode, tid: gettid(), tails: map[*stream][]int{}}
	s.cap = cp
	d.capMu.Lock()
	d.caps[cp] = struct{}{}
	d.capMu.Unlock()
	return nil
}

func (d *Driver) StreamEndCapture(c cuda.Context, sh cuda.Stream) (cuda.Graph, error) {
	const op = "cuStreamEndCapture"
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	s, err := d.resolve(op, v, sh)
	if err != nil {
		return 0, err
	}
	cp := s.cap
	if cp == nil {
		return 0, errf(op, cuda.ErrorIllegalState, "the stream is not capturing")
	}
	if cp.stream != s {
		d.invalidate(cp)
		return 0, errf(op, cuda.ErrorStreamCaptureUnmatched, "the stream joined a capture that another stream began; only that stream may end it")
	}
	d.capMu.Lock()
	inv := cp.invalid
	d.capMu.Unlock()
	// Measured: an invalidated capture ends with 901 from any thread, so the thread check comes second.
	if inv {
		d.endCaptureLocked(cp, false)
		return 0, errf(op, cuda.ErrorStreamCaptureInvalidated, "the capture was invalidated by an earlier error; no graph was made")
	}
	if cp.mode != cuda.CaptureModeRelaxed && cp.tid != gettid() {
		return 0, errf(op, cuda.ErrorStreamCaptureWrongThread, "a GLOBAL or THREAD_LOCAL capture must be ended by the thread that began it")
	}
	if n := cp.unjoined(); n > 0 {
		d.endCaptureLocked(cp, false)
		return 0, errf(op, cuda.ErrorStreamCaptureUnjoined, "%d captured operations of joined streams were not joined back to the origin stream; no graph was made", n)
	}
	d.endCaptureLocked(cp, true)
	g := &graph{handle: cuda.Graph(v.handle(kindGraphHandle)), nodes: cp.nodes, mem: &graphMem{allocs: cp.allocs, refs: 1}}
	v.graphs[g.handle] = g
	return g.handle, nil
}

func (d *Driver) StreamIsCapturing(c cuda.Context, sh cuda.Stream) (cuda.CaptureStatus, error) {
	const op = "cuStreamIsCapturing"
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	s, err := d.resolve(op, v, sh)
	if err != nil {
		return 0, err
	}
	d.capMu.Lock()
	defer d.capMu.Unlock()
	if s.legacy {
		for cp := range d.caps {
			if cp.dev == v && cp.blocking() {
				return 0, errf(op, cuda.ErrorStreamCaptureImplicit, "the legacy stream depends on a capturing blocking stream")
			}
		}
		return cuda.CaptureStatusNone, nil
	}
	switch {
	case s.cap == nil:
		return cuda.CaptureStatusNone, nil
	case s.cap.invalid:
		return cuda.CaptureStatusInvalidated, nil
	}
	return cuda.CaptureStatusActive, nil
}

func (d *Driver) CtxStreamPriorityRange(c cuda.Context) (least, greatest int, err error) {
	v, err := d.ctx("cuCtxGetStreamPriorityRange", c)
	if err != nil {
		return 0, 0, err
	}
	v.mu.Unlock()
	return leastPriority, greatestPriority, nil
}

func (d *Driver) EventCreate(c cuda.Context, flags uint32) (cuda.Event, error) {
	const op = "cuEventCreate"
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	if flags&^(cuda.EventBlockingSync|cuda.EventDisableTiming|cuda.EventInterprocess) != 0 {
		return 0, errf(op, cuda.ErrorInvalidValue, "unknown event flags %#x", flags)
	}
	if flags&cuda.EventInterprocess != 0 && flags&cuda.EventDisableTiming == 0 {
		return 0, errf(op, cuda.ErrorInvalidValue, "CU_EVENT_INTERPROCESS needs CU_EVENT_DISABLE_TIMING too")
	}
	h := cuda.Event(v.handle(kindEventHandle))
	v.events[h] = &event{flags: flags}
	return h, nil
}

func (d *Driver) event(op string, c cuda.Context, eh cuda.Event) (*device, *event, error) {
	v, err := d.ctx(op, c)
	if err != nil {
		return nil, nil, err
	}
	e := v.events[eh]
	if e == nil {
		v.mu.Unlock()
		return nil, nil, errf(op, cuda.ErrorInvalidHandle, "event %#x is not a live event of device %d", uint64(eh), v.index)
	}
	return v, e, nil
}

func (d *Driver) EventDestroy(c cuda.Context, eh cuda.Event) error {
	v, _, err := d.event("cuEventDestroy_v2", c, eh)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	delete(v.events, eh)
	return nil
}

func (d *Driver) EventRecord(c cuda.Context, eh cuda.Event, sh cuda.Stream) error {
	const op = "cuEventRecord"
	v, e, err := d.event(op, c, eh)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	s, err := d.streamOp(op, v, sh)
	if err != nil {
		return err
	}
	if s.cap != nil {
		e.capturedIn, e.deps = s.cap, slices.Clone(s.cap.tails[s])
		return nil
	}
	e.recorded, e.at, e.capturedIn, e.deps = true, time.Now(), nil, nil
	return nil
}

// waitEvent is the capture rule for waiting on an event from the host.
func (d *Driver) waitEvent(op string, v *device, e *event) error {
	if e.capturedIn != nil {
		d.invalidate(e.capturedIn) // measured: the 907 also invalidates the capture, in RELAXED mode too
		return errf(op, cuda.ErrorCapturedEvent, "the event was last recorded in a stream capture")
	}
	return d.unsafeCall(op, v)
}

func (d *Driver) EventQuery(c cuda.Context, eh cuda.Event) error {
	const op = "cuEventQuery"
	v, e, err := d.event(op, c, eh)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	return d.waitEvent(op, v, e)
}

func (d *Driver) EventSynchronize(c cuda.Context, eh cuda.Event) error {
	const op = "cuEventSynchronize"
	v, e, err := d.event(op, c, eh)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	if err := d.waitEvent(op, v, e); err != nil {
		return err
	}
	v.syncPoint()
	return nil
}

func (d *Driver) EventElapsedTime(c cuda.Context, start, end cuda.Event) (float32, error) {
	const op = "cuEventElapsedTime_v2"
	v, err := d.ctx(op, c)
	if err != nil {
		return 0, err
	}
	defer v.mu.Unlock()
	a, b := v.events[start], v.events[end]
	if a == nil || b == nil {
		return 0, errf(op, cuda.ErrorInvalidHandle, "not a live event of device %d", v.index)
	}
	if a.capturedIn != nil || b.capturedIn != nil {
		return 0, errf(op, cuda.ErrorCapturedEvent, "an event was last recorded in a stream capture")
	}
	if a.flags&cuda.EventDisableTiming != 0 || b.flags&cuda.EventDisableTiming != 0 {
		return 0, errf(op, cuda.ErrorInvalidHandle, "an event was created with CU_EVENT_DISABLE_TIMING")
	}
	if !a.recorded || !b.recorded {
		return 0, errf(op, cuda.ErrorInvalidHandle, "an event has not been recorded")
	}
	return float32(b.at.Sub(a.at).Seconds() * 1000), nil
}
