package stream

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
)

func TestGraphUsesRange(t *testing.T) {
	g := &Graph{uses: mergeSpans([]span{{300, 400}, {100, 200}, {150, 250}, {400, 401}})}
	assert.Equal(t, []span{{100, 250}, {300, 401}}, g.uses, "sorted and merged")
	for _, tc := range []struct {
		name string
		p    cuda.DevicePtr
		size uint64
		want bool
	}{
		{"before all", 0, 100, false},
		{"ends where a use starts", 50, 50, false},
		{"overlaps the first byte", 50, 51, true},
		{"inside", 120, 10, true},
		{"covers a use", 0, 1000, true},
		{"in the gap", 250, 50, false},
		{"last byte of the last use", 400, 1, true},
		{"after all", 401, 1 << 20, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, g.usesRange(tc.p, tc.size))
		})
	}
	assert.False(t, (&Graph{}).usesRange(0, 1<<40), "a graph that uses nothing")
}

func FuzzUsesRange(f *testing.F) {
	f.Add(uint64(10), uint64(5), uint64(12), uint64(1), uint64(0), uint64(100))
	f.Fuzz(func(t *testing.T, a, an, b, bn, p, size uint64) {
		an, bn, size = an%1000+1, bn%1000+1, size%1000+1
		a, b, p = a%10000, b%10000, p%10000
		spans := []span{{cuda.DevicePtr(a), cuda.DevicePtr(a + an)}, {cuda.DevicePtr(b), cuda.DevicePtr(b + bn)}}
		g := &Graph{uses: mergeSpans(spans)}
		want := false
		for _, s := range spans {
			if uint64(s.lo) < p+size && p < uint64(s.hi) {
				want = true
			}
		}
		assert.Equal(t, want, g.usesRange(cuda.DevicePtr(p), size), "spans %v, range [%d, +%d)", spans, p, size)
	})
}

// The void pointers (graph memory whose graph was destroyed before a launch) must never outlive their
// owner's letting go: a stale entry would swallow a later owner's free, or make the Python layer close a
// later owner's Buffer.
func TestVoidPointersDoNotOutliveTheirOwner(t *testing.T) {
	const p, q = cuda.DevicePtr(0x1000), cuda.DevicePtr(0x9000)
	destroyedBeforeLaunch := func(m *Manager) {
		g := &Graph{m: m}
		m.adopt(g, map[cuda.DevicePtr]uint64{p: 256}, nil)
		m.graphGone(g)
	}
	t.Run("reissued before the Python layer took the list", func(t *testing.T) {
		m := &Manager{}
		m.adopt(&Graph{m: m}, map[cuda.DevicePtr]uint64{q: 256}, nil) // other graph memory alive
		destroyedBeforeLaunch(m)
		m.Reissued(p)
		assert.Empty(t, m.TakeVoided(), "the new owner's Buffer must not be closed")
	})
	t.Run("forgotten, then the address is a new graph's", func(t *testing.T) {
		m := &Manager{}
		destroyedBeforeLaunch(m)
		require.True(t, m.ForgetVoid(p, 0))
		m.adopt(&Graph{m: m}, map[cuda.DevicePtr]uint64{p: 256}, nil)
		assert.Empty(t, m.TakeVoided(), "no stale report")
	})
	t.Run("reported, and an owner the Python layer did not know frees it", func(t *testing.T) {
		m := &Manager{}
		destroyedBeforeLaunch(m)
		assert.Equal(t, []Voided{{p, 0}}, m.TakeVoided())
		handled, err := m.FreeGraphAware(p, 256, func() error { return nil }, func() {})
		require.NoError(t, err)
		assert.True(t, handled, "nothing to free: its bytes left the books when it became void")
	})
	t.Run("a void pointer freed with another size is not swallowed", func(t *testing.T) {
		m := &Manager{}
		destroyedBeforeLaunch(m)
		handled, err := m.FreeGraphAware(p, 4096, func() error { return nil }, func() {})
		require.NoError(t, err)
		assert.False(t, handled)
	})
}

// Owner tokens: an owner whose memory went void must never free the address, whoever holds it now.
func TestOwnerTokens(t *testing.T) {
	const p = cuda.DevicePtr(0x1000)
	issue := func(m *Manager) uint64 { // p allocated during a capture, as NoteAllocate books it
		m.gm.mu.Lock()
		m.tokenLocked(p)
		m.gm.mu.Unlock()
		return m.Token(p)
	}
	t.Run("a live owner frees, and may ask again", func(t *testing.T) {
		m := &Manager{}
		tok := issue(m)
		require.NotZero(t, tok)
		assert.False(t, m.TokenStale(p, tok))
		assert.False(t, m.TokenStale(p, tok), "a free that waited asks again when it runs")
	})
	t.Run("void, then handed out again: the late free frees nothing", func(t *testing.T) {
		m := &Manager{}
		tok := issue(m)
		m.discard(map[cuda.DevicePtr]uint64{p: 256})
		m.Reissued(p) // an ordinary allocation got the address
		assert.True(t, m.TokenStale(p, tok), "stale")
		assert.False(t, m.TokenStale(p, tok), "once: the token is forgotten")
		handled, err := m.FreeGraphAware(p, 256, func() error { return nil }, func() {})
		require.NoError(t, err)
		assert.False(t, handled, "the new owner's free is an ordinary free")
	})
	t.Run("void, not handed out again: the stale free forgets the void entry", func(t *testing.T) {
		m := &Manager{}
		tok := issue(m)
		m.discard(map[cuda.DevicePtr]uint64{p: 256})
		assert.True(t, m.TokenStale(p, tok))
		assert.False(t, m.GraphMemoryInUse(), "nothing left on the books")
	})
	t.Run("an ordinary allocation at a stale owner's address has no token", func(t *testing.T) {
		m := &Manager{}
		tok := issue(m)
		m.discard(map[cuda.DevicePtr]uint64{p: 256})
		m.Reissued(p)
		assert.Zero(t, m.Token(p), "the new owner frees by address, as any ordinary owner")
		assert.True(t, m.TokenStale(p, tok), "the old owner's token stays stale")
	})
	t.Run("a second capture allocation at the address makes the first owner stale", func(t *testing.T) {
		m := &Manager{}
		first := issue(m)
		m.discard(map[cuda.DevicePtr]uint64{p: 256})
		second := issue(m)
		assert.NotEqual(t, first, second)
		assert.True(t, m.TokenStale(p, first))
		assert.False(t, m.TokenStale(p, second))
	})
	t.Run("the Python layer closed the owner: its stale token is dropped", func(t *testing.T) {
		m := &Manager{}
		tok := issue(m)
		m.discard(map[cuda.DevicePtr]uint64{p: 256})
		assert.Equal(t, []Voided{{p, tok}}, m.TakeVoided(), "reported with the owner's token")
		require.True(t, m.ForgetVoid(p, tok))
		assert.Empty(t, m.gm.stale)
		assert.False(t, m.TokenStale(p, tok))
	})
	t.Run("closing a later owner keeps an earlier owner's waiting free stale", func(t *testing.T) {
		// The first owner closed its Buffer while a capture ran (its free waits, holding its token); its
		// memory went void, and the address went to a second capture, aborted too. The Python layer
		// closes the second owner's Buffer: the first owner's free must still find its token stale when
		// it runs, by which time the address may be a third owner's.
		m := &Manager{}
		first := issue(m)
		m.discard(map[cuda.DevicePtr]uint64{p: 256})
		second := issue(m)
		m.discard(map[cuda.DevicePtr]uint64{p: 256})
		assert.Equal(t, []Voided{{p, second}}, m.TakeVoided(), "the first report went with the reissue")
		require.True(t, m.ForgetVoid(p, second))
		m.Reissued(p) // an ordinary owner now
		assert.True(t, m.TokenStale(p, first), "the waiting free frees nothing")
		handled, err := m.FreeGraphAware(p, 256, func() error { return nil }, func() {})
		require.NoError(t, err)
		assert.False(t, handled, "the third owner's free is an ordinary free")
	})
	t.Run("stale tokens are bounded", func(t *testing.T) {
		m := &Manager{}
		for i := 0; i < maxStaleTokens+10; i++ {
			m.gm.mu.Lock()
			m.tokenLocked(p)
			m.gm.mu.Unlock()
		}
		assert.LessOrEqual(t, len(m.gm.stale), maxStaleTokens)
	})
}

// A graph that allocates memory, launched on a stream that another capture holds (a thread began it
// between the caller's check and the launch: fuzzer seeds 104843 and 104824), would only add its nodes to
// that capture: nothing is allocated. Counted as a launch, its allocation became "live" in cudacore's
// books while the driver never made it, so its Buffer's close reached the driver as a free of graph
// memory no launch had allocated, and every later launch was refused as if that Buffer held the last
// launch's memory. The launch is refused before the driver sees it, and the capture goes on.
func TestGraphMemoryLaunchIntoACaptureIsRefused(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	e := newEnv(t)
	s, other := e.stream(t, true), e.stream(t, true)
	const size = 4096
	require.NoError(t, s.BeginCapture(cuda.CaptureModeThreadLocal))
	p, err := e.stack.Allocate(size, s.Handle())
	require.NoError(t, err)
	e.m.NoteAllocate(s.Handle(), p, size)
	g, err := s.EndCapture()
	require.NoError(t, err)
	free := func() error {
		handled, err := e.m.FreeGraphAware(p, size, func() error { return e.stack.Deallocate(p, size, s.Handle()) }, func() {})
		require.True(t, handled, "graph memory")
		return err
	}

	require.NoError(t, other.BeginCapture(cuda.CaptureModeRelaxed))
	requireResult(t, cuda.ErrorStreamCaptureUnsupported, g.Launch(other), "a launch that would allocate nothing")
	assert.True(t, other.Capturing(), "refused before the driver: the capture goes on")
	outer, err := other.EndCapture()
	require.NoError(t, err)
	require.NoError(t, outer.Destroy())

	require.NoError(t, g.Launch(s), "not counted as a launch: its allocation is not held")
	require.NoError(t, s.Synchronize())
	require.NoError(t, free(), "the launch's allocation is real: the driver frees it")
	require.NoError(t, g.Launch(s), "freed after this launch (the owner let go)")
	require.NoError(t, s.Synchronize())
	require.NoError(t, g.Destroy())
}

// launchHook runs after, once, right after a successful cuGraphLaunch.
type launchHook struct {
	*cudasim.Driver
	after func()
}

func (d *launchHook) GraphLaunch(c cuda.Context, x cuda.GraphExec, s cuda.Stream) error {
	err := d.Driver.GraphLaunch(c, x, s)
	if f := d.after; err == nil && f != nil {
		d.after = nil
		f()
	}
	return err
}

// The free that follows a launch of graph memory whose Buffer was closed must not go into a capture that
// another thread began on the launch stream between the launch and that free: the free would become a
// node of the new capture's graph, made only if that graph were launched, and the launch's allocation
// would stay allocated for good (fuzzer seed 9065 on an H200: 256 bytes that compute-sanitizer reported
// leaked). The free waits for the capture to end. The other rule of the same check: a free on the legacy
// stream waits while a blocking stream of the device captures.
func TestOrphanFreeAfterLaunchWaitsForACaptureOfItsStream(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	hook := &launchHook{Driver: cudasim.New()}
	e := newEnvOn(t, hook.Driver, hook)
	s := e.stream(t, true)
	const size = 4096
	freeMem := func() uint64 {
		free, _, err := e.drv.MemGetInfo(e.dev.Context())
		require.NoError(t, err)
		return free
	}
	before := freeMem()
	require.NoError(t, s.BeginCapture(cuda.CaptureModeThreadLocal))
	p, err := e.stack.Allocate(size, s.Handle())
	require.NoError(t, err)
	e.m.NoteAllocate(s.Handle(), p, size)
	g, err := s.EndCapture()
	require.NoError(t, err)
	handled, err := e.m.FreeGraphAware(p, size, func() error { return e.stack.Deallocate(p, size, s.Handle()) }, func() {})
	require.NoError(t, err)
	require.True(t, handled, "the owner let go before the first launch: freed after each launch")

	hook.after = func() { require.NoError(t, s.BeginCapture(cuda.CaptureModeRelaxed)) }
	require.NoError(t, g.Launch(s))
	require.True(t, s.Capturing(), "the hook began a capture between the launch and its free")
	assert.Equal(t, 1, e.m.reg.Deferred(), "the free waits for the capture")
	inner, err := s.EndCapture()
	require.NoError(t, err)
	assert.Zero(t, e.m.reg.Deferred(), "and runs as it ends")
	require.NoError(t, inner.Destroy())
	require.NoError(t, s.Synchronize())
	require.NoError(t, g.Destroy())
	assert.Equal(t, before, freeMem(), "the launch's allocation was freed")

	t.Run("legacy stream while a blocking stream captures", func(t *testing.T) {
		blocking := e.stream(t, false)
		require.NoError(t, blocking.BeginCapture(cuda.CaptureModeRelaxed))
		ran := false
		did, err := e.m.reg.RunOrDeferUnsafeOn(e.m, cuda.StreamLegacy, func() error { ran = true; return nil }, func() { ran = true })
		require.NoError(t, err)
		assert.False(t, did)
		assert.False(t, ran)
		inner, err := blocking.EndCapture()
		require.NoError(t, err)
		assert.True(t, ran, "run as the capture ended")
		require.NoError(t, inner.Destroy())
	})
}

// voidedPtrs is the addresses of a TakeVoided report.
func voidedPtrs(vs []Voided) []cuda.DevicePtr {
	out := make([]cuda.DevicePtr, len(vs))
	for i, v := range vs {
		out[i] = v.Ptr
	}
	return out
}

// A graph that allocates during its capture is not updated: the driver would take the other graph's
// allocation addresses into the executable graph (conformance case GraphMemoryUpdate), and its launches
// would then allocate memory that no Buffer owns and cudacore does not count. Allocations freed inside the
// capture move as well, and what the driver then does with an address of a destroyed graph is not
// measured, so those are refused too. The refusal changes nothing.
func TestAGraphThatAllocatesIsNotUpdated(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	e := newEnv(t)
	s := e.stream(t, true)
	base := e.stack.Stats().InUse
	capture := func() (*Graph, cuda.DevicePtr) {
		p := e.captureAlloc(t, s)
		g, err := s.EndCapture()
		require.NoError(t, err)
		require.NoError(t, g.Instantiate())
		return g, p
	}
	scratch := func() *Graph { // its allocation freed inside the capture
		p := e.captureAlloc(t, s)
		require.NoError(t, e.stack.Deallocate(p, pendingSize, s.Handle()))
		e.m.NoteFree(s.Handle(), p)
		g, err := s.EndCapture()
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, g.Destroy()) })
		return g
	}
	g1, p1 := capture()
	g2, p2 := capture()
	g3, g4 := scratch(), scratch()
	require.NotEqual(t, p1, p2)
	for _, tc := range []struct {
		name     string
		dst, src *Graph
	}{
		{"from another", g1, g2}, {"into another", g2, g1}, {"from itself", g1, g1},
		{"allocations freed in the capture", g3, g4}, {"from a graph whose allocation outlives it", g3, g1},
	} {
		err := tc.dst.Update(tc.src)
		requireResult(t, cuda.ErrorGraphExecUpdateFailure, err, tc.name)
		assert.Contains(t, err.Error(), "allocated memory during its capture", tc.name)
	}
	// g1 still allocates at p1: one launch, its owner's free, and nothing is left.
	require.NoError(t, g1.Launch(s))
	require.NoError(t, s.Synchronize())
	e.freeGraphMemory(t, s, p1)
	e.freeGraphMemory(t, s, p2) // never launched: taken off the books
	require.NoError(t, g1.Destroy())
	require.NoError(t, g2.Destroy())
	require.NoError(t, g3.Launch(s))
	require.NoError(t, s.Synchronize())
	assert.Equal(t, base, e.stack.Stats().InUse, "every byte back")
	assert.False(t, e.m.GraphMemoryInUse())
}

// GraphMemoryBytes is what the out-of-memory verdict adds to the allocator's in_use as the process's own
// memory outside it: only graph memory no Buffer owns any more. A pending or live allocation's Buffer is
// still open, and in in_use already (counting it twice made the verdict's figures exceed the device).
func TestGraphMemoryBytesCountsWhatNoOwnerHolds(t *testing.T) {
	for _, tc := range []struct {
		name   string
		states []graphAllocState
		want   uint64
	}{
		{"nothing", nil, 0},
		{"pending: no launch yet, its Buffer open", []graphAllocState{gmPending}, 0},
		{"live: launched, its Buffer open", []graphAllocState{gmLive}, 0},
		{"orphan: its Buffer freed, the graph keeps it", []graphAllocState{gmOrphan}, 256},
		{"one of each", []graphAllocState{gmPending, gmLive, gmOrphan, gmOrphan}, 512},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &Manager{}
			ptrs := map[cuda.DevicePtr]uint64{}
			for i := range tc.states {
				ptrs[cuda.DevicePtr(0x1000*(i+1))] = 256
			}
			m.adopt(&Graph{m: m}, ptrs, nil)
			m.gm.mu.Lock()
			for i, st := range tc.states {
				m.gm.allocs[cuda.DevicePtr(0x1000*(i+1))].state = st
			}
			m.gm.count()
			m.gm.mu.Unlock()
			assert.Equal(t, tc.want, m.GraphMemoryBytes())
		})
	}
}
