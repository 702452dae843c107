package stream

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// Graph is a captured CUDA graph and, once instantiated, its executable graph. Destroy is idempotent,
// and every use after it is an InvalidHandle error made here: a stale handle never reaches the driver,
// which may crash on one.
type Graph struct {
	m      *Manager
	mu     sync.Mutex
	g      cuda.Graph
	x      cuda.GraphExec
	nodes  int
	allocs int
	bytes  uint64
	gone   bool // destroyed at the driver
	dying  bool // Destroy was called (and may have failed): no more launches or updates
	queued bool // the driver's destroys wait for the captures to end (Destroy)

	allocPtrs []cuda.DevicePtr // the graph memory it allocates (graphmem.go); fixed at capture
	// uses is the device memory its work uses, merged and sorted: fixed at capture, and grown by Update
	// (under g.mu and the Manager's graph memory lock).
	uses     []span
	deferred []func() // frees of memory it uses, run once it is destroyed
	// escapes: work cudacore issued during the capture that is not in the graph (the capture's list, its
	// first maxEscapes entries, and their total count).
	escapes []string
	escaped int
}

// Escapes returns the escape audit of the capture that made g: work cudacore issued while it ran that is
// not in the graph (ran at once on another stream, or synchronously), the first 32 entries, and how many
// there were in all.
func (g *Graph) Escapes() ([]string, int) { return append([]string{}, g.escapes...), g.escaped }

func (m *Manager) newGraph(g cuda.Graph, c *capture) (*Graph, error) {
	n, err := m.drv.GraphNodeCount(m.ctx, g)
	if err != nil {
		m.destroyGraph(g)
		m.discard(c.ptrs)
		return nil, err
	}
	m.reg.mu.Lock()
	allocs, bytes, ptrs, uses := c.allocs, c.bytes, c.ptrs, c.uses
	escapes, escaped := append([]string{}, c.escapes...), c.escaped
	m.reg.mu.Unlock()
	gr := &Graph{m: m, g: g, nodes: n, allocs: allocs, bytes: bytes, escapes: escapes, escaped: escaped}
	m.adopt(gr, ptrs, uses)
	return gr, nil
}

func (g *Graph) String() string {
	return fmt.Sprintf("graph %#x of device %d", uint64(g.g), g.m.dev.Ordinal())
}

// Manager returns the graph's manager.
func (g *Graph) Manager() *Manager { return g.m }

// NodeCount returns the number of nodes captured.
func (g *Graph) NodeCount() int { return g.nodes }

// Allocations returns how many allocations were made on the stream during the capture (graph memory
// nodes), and MemoryHeld their bytes as requested: the memory the graph's allocations hold.
func (g *Graph) Allocations() int   { return g.allocs }
func (g *Graph) MemoryHeld() uint64 { return g.bytes }

// Destroyed says whether Destroy was called (even one that failed and is to be retried).
func (g *Graph) Destroyed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.gone || g.dying
}

// Instantiated says whether the graph has an executable graph.
func (g *Graph) Instantiated() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.x != 0
}

func (g *Graph) dead(op string) error {
	return cuda.NewError("cudacore."+op, cuda.ErrorClosed, fmt.Sprintf(
		"%s was destroyed; capture it again", g))
}

// exec returns the executable graph, instantiating it first if needed. Caller holds g.mu.
func (g *Graph) exec(op string) (cuda.GraphExec, error) {
	if g.gone || g.dying {
		return 0, g.dead(op)
	}
	if g.x == 0 {
		// Instantiation is an unsafe call: on the H100 it answers 900 during a THREAD_LOCAL capture begun
		// on the calling thread and invalidates that capture (found by the fuzzer), as the destroy of an
		// executable graph does in GLOBAL mode too. It is refused before the driver where a capture
		// forbids it, and made where none can begin meanwhile.
		var x cuda.GraphExec
		c, err := g.m.reg.RunUnlessUnsafe(func() (err error) {
			x, err = g.m.drv.GraphInstantiate(g.m.ctx, g.g)
			return err
		})
		if c != nil {
			return 0, CaptureError(cuda.ErrorStreamCaptureUnsupported, op, unsafeMsg(
				fmt.Sprintf("instantiating %s (cuGraphInstantiate, which a first launch or upload makes)", g), c,
				"instantiate it before the capture (graph.instantiate()), or launch it after"))
		}
		if err != nil {
			return 0, err
		}
		g.x = x
	}
	return g.x, nil
}

// DebugDot writes the captured graph as a Graphviz DOT file at path, with every node's parameters when
// verbose (cuGraphDebugDotPrint). It works before and after instantiation, and not after Destroy.
func (g *Graph) DebugDot(path string, verbose bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gone || g.dying {
		return g.dead("graph_debug_dot")
	}
	return g.m.drv.GraphDebugDot(g.m.ctx, g.g, path, verbose)
}

// Instantiate makes the executable graph (it is also made on first Upload or Launch).
func (g *Graph) Instantiate() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, err := g.exec("graph_instantiate")
	return err
}

func (g *Graph) streamFor(op string, s *Stream) (*Stream, error) {
	if s == nil {
		s = g.m.legacy
	}
	if err := s.alive(op); err != nil {
		return nil, err
	}
	if err := g.m.sameDevice(op, s.m); err != nil {
		return nil, err
	}
	return s, g.m.checkEnqueue(op, s)
}

// Upload uploads the executable graph to the device on s, so the first launch costs no more than the
// next ones.
func (g *Graph) Upload(s *Stream) error {
	return g.onStream("graph_upload", s, g.m.drv.GraphUpload)
}

// Launch launches the graph on s (nil: the legacy stream). Each launch reads and writes host memory as
// it is at that moment (pinned copies replay with fresh data).
//
// A graph that allocates memory (graph memory) is refused while its last launch's allocation is still
// held by an open Buffer, and on a stream that captures (graphmem.go).
func (g *Graph) Launch(s *Stream) error {
	return g.onStream("graph_launch", s, g.m.drv.GraphLaunch)
}

// onStream runs call (cuGraphUpload or cuGraphLaunch) with g's executable graph on s, under the capture
// rules, instantiating the graph first if need be.
func (g *Graph) onStream(op string, s *Stream, call func(cuda.Context, cuda.GraphExec, cuda.Stream) error) error {
	s, err := g.streamFor(op, s)
	if err != nil {
		return err
	}
	// The stream is held until the driver has the work: another thread's Destroy waits (a destroyed
	// stream's handle crashes the driver).
	ran := false
	err = s.hold(op, func() error {
		g.mu.Lock()
		defer g.mu.Unlock()
		x, err := g.exec(op)
		if err != nil {
			return err
		}
		launch := op == "graph_launch"
		if launch {
			if err := g.m.checkLaunchInto(op, g, s); err != nil {
				return err
			}
			if err := g.m.checkLaunch(op, g); err != nil {
				return err
			}
		}
		ran = true
		err = call(g.m.ctx, x, s.h)
		if err == nil && launch {
			g.m.launched(g, s)
		}
		return err
	})
	if !ran {
		return err
	}
	// after may end captures, which runs the frees deferred until then; one of memory this graph uses
	// waits for the graph (afterDestroy takes g.mu), so g.mu is not held here, nor the stream.
	return g.m.after(op, s, err)
}

// DirectExec returns the executable graph for launches that bypass Go (the direct path of the hot calls),
// or 0 when every launch must come here: before instantiation, after destruction, and for a graph that
// allocates memory (each launch changes the state of its allocations, graphmem.go). The executable graph
// of a graph that does not allocate never changes until Destroy (Update changes it in place), so the
// caller may launch it while it knows the graph is not destroyed.
func (g *Graph) DirectExec() cuda.GraphExec {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gone || g.dying || len(g.allocPtrs) > 0 {
		return 0
	}
	return g.x
}

// Update takes the parameters of other, a graph of the same topology (cuGraphExecUpdate), into g's
// executable graph, so g's next launches run other's copies without a new instantiation. Graphs that
// allocated memory during their capture are refused (ErrorGraphExecUpdateFailure), either way round.
func (g *Graph) Update(other *Graph) error {
	const op = "graph_update"
	if other == nil || other.Destroyed() {
		return cuda.NewError("cudacore."+op, cuda.ErrorClosed, "the graph to update from was destroyed")
	}
	if err := g.m.sameDevice(op, other.m); err != nil {
		return err
	}
	// Both graphs stay locked for the update, so that neither is destroyed under the driver call. Two
	// locks are always taken in the order of the graphs' handles (unique while both live): g1.Update(g2)
	// and g2.Update(g1) on two threads cannot deadlock; a graph updated from itself is locked once.
	first, second := g, other
	if uint64(other.g) < uint64(g.g) {
		first, second = other, g
	}
	first.mu.Lock()
	defer first.mu.Unlock()
	if second != first {
		second.mu.Lock()
		defer second.mu.Unlock()
	}
	if other.gone || other.dying {
		return cuda.NewError("cudacore."+op, cuda.ErrorClosed, "the graph to update from was destroyed")
	}
	// The driver takes the other graph's allocation addresses into the executable graph (conformance case
	// GraphMemoryUpdate): g's launches would allocate memory booked to other, which no Buffer of g's owns.
	// Allocations freed inside the capture move too; whether the driver keeps such an address to g once
	// other is destroyed is not measured, so those graphs are refused as well.
	if g.allocs > 0 || other.allocs > 0 {
		return cuda.NewError("cudacore."+op, cuda.ErrorGraphExecUpdateFailure,
			"a graph that allocated memory during its capture (graph memory) cannot be updated, nor be the graph another is updated from: the driver would move the executable graph's allocations to the other graph's addresses; instantiate the other graph instead")
	}
	x, err := g.exec(op)
	if err != nil {
		return err
	}
	if err := g.m.drv.GraphExecUpdate(g.m.ctx, x, other.g); err != nil {
		if cuda.ResultOf(err) == cuda.ErrorGraphExecUpdateFailure {
			return &cuda.Error{Op: "cudacore." + op, Result: cuda.ErrorGraphExecUpdateFailure, Err: err,
				Msg: "the graphs differ in topology (node kinds, order or allocation sizes), so the executable graph cannot take the other's parameters; instantiate the other graph instead"}
		}
		return err
	}
	g.m.takeUses(g, other) // g's launches name other's memory now
	return nil
}

// Destroy destroys the executable graph and the graph, giving back the memory their allocations hold.
// It is idempotent. Frees of memory the graph used, deferred while it lived, run once it is gone.
//
// Destroying an executable graph is an unsafe call during a capture (the driver's 900, which invalidates
// the capture: in GLOBAL mode from any thread, in THREAD_LOCAL mode from the capturing thread). While such
// a capture forbids it, Destroy marks the graph destroyed (no more launches or updates) and the driver's
// destroys (the executable graph's, then the graph's, which is legal but must follow it), with
// everything that follows them, run when the captures end.
//
// A driver failure leaves what it failed to destroy in place, and the graph unusable but not gone:
// calling Destroy again retries it, so a transient failure frees nothing for good. A failure of the
// destroy that waited for the captures to end has no caller left to retry it: the Manager keeps the
// graph and retries it (failedDestroys).
//
// Each Destroy also retries the destroys the Manager keeps, at most once per retryEvery.
func (g *Graph) Destroy() error {
	err := g.destroy()
	g.m.retryDestroys(false)
	return err
}

// destroy is Destroy without the retry of the destroys the Manager keeps.
func (g *Graph) destroy() error {
	g.mu.Lock()
	err := g.destroyLocked()
	var run []func()
	if g.gone {
		run, g.deferred = g.deferred, nil
	}
	g.mu.Unlock()
	for _, fn := range run {
		fn()
	}
	return err
}

func (g *Graph) destroyLocked() error {
	if g.gone {
		return nil
	}
	g.dying = true
	if g.queued {
		return nil // the destroy queued for the end of the captures will do it
	}
	ran, err := g.m.reg.RunOrDeferUnsafe(g.destroyAtDriver, func() {
		g.mu.Lock()
		g.queued = false
		g.mu.Unlock()
		g.m.retryDestroys(false) // the destroys kept before this one
		// The caller was told the graph is destroyed (the facade forgot its number): a failure is kept
		// by the Manager, not left to a Destroy that may never come.
		if g.destroy() != nil {
			g.m.keepFailed(g)
		}
	})
	if !ran {
		g.queued = true
		return nil
	}
	if err != nil {
		g.m.fd.failures.Add(1)
		return err
	}
	g.gone = true
	g.m.graphGone(g)
	return nil
}

// destroyAtDriver destroys the executable graph, then the graph. Caller holds g.mu (and the registry).
func (g *Graph) destroyAtDriver() error {
	if g.x != 0 {
		if err := g.m.drv.GraphExecDestroy(g.m.ctx, g.x); err != nil {
			return err
		}
		g.x = 0
	}
	return g.m.drv.GraphDestroy(g.m.ctx, g.g)
}

// failedDestroys keeps the graphs whose destroy, deferred until the captures ended (Destroy), the driver
// refused. No caller is left to retry it (Destroy returned, and the facade forgot the graph's number), so
// dropping the failure would leak the graph and the memory its allocations hold: the Manager keeps the
// graph, with its handles, and retries its destroy at each later Destroy of any graph and at the end of
// each later deferred destroy, at most once per retryEvery (a driver that refuses a destroy usually goes
// on refusing, and each attempt counts as a failure), and at once in RetryDestroys and Close.
type failedDestroys struct {
	mu     sync.Mutex
	graphs []*Graph     // kept, not being retried
	last   time.Time    // the last retry
	kept   atomic.Int64 // graphs kept, those being retried included
	// failures counts the driver's refusals of a graph's destroy, every attempt (Destroy's own too).
	failures atomic.Uint64
}

// retryEvery spaces the retries of kept destroys made by later Destroys.
const retryEvery = time.Second

// keepFailed keeps g, whose deferred destroy failed, for a retry.
func (m *Manager) keepFailed(g *Graph) {
	m.fd.mu.Lock()
	m.fd.graphs = append(m.fd.graphs, g)
	m.fd.mu.Unlock()
	m.fd.kept.Add(1)
}

// RetryDestroys retries now the destroys the Manager keeps after a failure (failedDestroys) and returns
// the first error; a graph that fails again stays kept.
func (m *Manager) RetryDestroys() error { return m.retryDestroys(true) }

// retryDestroys retries the kept destroys: now, or only if the last retry was retryEvery ago.
func (m *Manager) retryDestroys(now bool) error {
	fd := &m.fd
	if fd.kept.Load() == 0 {
		return nil
	}
	fd.mu.Lock()
	if len(fd.graphs) == 0 || !now && time.Since(fd.last) < retryEvery {
		fd.mu.Unlock()
		return nil
	}
	fd.last = time.Now()
	retry := fd.graphs
	fd.graphs = nil
	fd.mu.Unlock()
	var first error
	for _, g := range retry {
		// nil also when the destroy waits for the captures again: its own deferred run keeps it on failure.
		if err := g.destroy(); err != nil {
			fd.mu.Lock()
			fd.graphs = append(fd.graphs, g)
			fd.mu.Unlock()
			if first == nil {
				first = err
			}
			continue
		}
		fd.kept.Add(-1)
	}
	return first
}

// DestroysKept returns how many graphs the Manager keeps because their deferred destroy failed
// (failedDestroys): their driver objects, and the memory their allocations hold, are not yet given back.
func (m *Manager) DestroysKept() int { return int(m.fd.kept.Load()) }

// DestroyFailures returns how many times the driver refused to destroy a graph, every attempt counted.
func (m *Manager) DestroyFailures() uint64 { return m.fd.failures.Load() }
