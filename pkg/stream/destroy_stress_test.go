package stream

import (
	"math/rand"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
	"github.com/cudacore/cudacore/pkg/device"
	"github.com/cudacore/cudacore/pkg/memory"
)

// Streams destroyed while other goroutines put every kind of work on them: graph launches and uploads
// (of a graph that allocates too), event records and waits, joins, peer copies, orderings, waits and
// queries, captures of each mode, and capture errors that make the recovery look at every capture. No
// destroyed stream's handle may reach the driver (the simulator reports each one where the real driver
// crashes), and nothing may deadlock. The seeds are fixed; the interleaving is not, so a failure may need
// a few runs (go test -count=20 -run TestStreamsDestroyedUnderConcurrentWork).
func TestStreamsDestroyedUnderConcurrentWork(t *testing.T) {
	const workers, runFor = 12, time.Second
	var stale sync.Map
	pools := cudasim.DeviceConfig{TotalMemory: 1 << 30, MemoryPoolsSupported: true}
	sim := cudasim.New(cudasim.WithDevices(pools, pools), cudasim.WithFatal(func(msg string) { stale.Store(msg, true) }))
	reg := NewRegistry()
	var ms []*Manager
	var stacks []*memory.Stack
	for i := range 2 {
		d, err := device.Open(sim, i, "")
		require.NoError(t, err)
		st, err := memory.NewStack(d, memory.StackOptions{})
		require.NoError(t, err)
		m := New(d, Options{Registry: reg, Memory: func() *memory.Stack { return st }})
		t.Cleanup(func() {
			assert.NoError(t, m.Close())
			_ = st.Close()
			_ = d.Close()
		})
		ms, stacks = append(ms, m), append(stacks, st)
	}
	m, st := ms[0], stacks[0]
	d, d1 := m.Device(), ms[1].Device()
	peer, err := sim.MemAlloc(d1.Context(), 64)
	require.NoError(t, err)
	src, err := sim.MemAlloc(d.Context(), 64)
	require.NoError(t, err)
	dst, err := sim.MemAlloc(d.Context(), 64)
	require.NoError(t, err)

	capturer, err := m.Create(true, 0)
	require.NoError(t, err)
	require.NoError(t, capturer.BeginCapture(cuda.CaptureModeRelaxed))
	require.NoError(t, m.CopyDtoD(dst, src, 64, capturer))
	copyGraph, err := capturer.EndCapture()
	require.NoError(t, err)
	require.NoError(t, copyGraph.Instantiate())
	// A graph whose allocation outlives its launches: a launch is refused until the owner frees it.
	require.NoError(t, capturer.BeginCapture(cuda.CaptureModeThreadLocal))
	gp, err := st.Allocate(pendingSize, capturer.Handle())
	require.NoError(t, err)
	m.NoteAllocate(capturer.Handle(), gp, pendingSize)
	require.NoError(t, m.CopyDtoD(gp, src, 64, capturer))
	allocGraph, err := capturer.EndCapture()
	require.NoError(t, err)
	require.NoError(t, allocGraph.Instantiate())
	var allocMu sync.Mutex
	freeOwned := func(s *Stream) {
		free := func() error { return st.Deallocate(gp, pendingSize, s.Handle()) }
		if handled, _ := m.FreeGraphAware(gp, pendingSize, free, func() {}); !handled {
			_ = free()
		}
	}

	var mu sync.Mutex
	streams := make([]*Stream, 8)
	for i := range streams {
		streams[i], err = m.Create(true, 0)
		require.NoError(t, err)
	}
	pick := func(r *rand.Rand) *Stream {
		mu.Lock()
		defer mu.Unlock()
		return streams[r.Intn(len(streams))]
	}
	work := []func(r *rand.Rand, s *Stream, ev *Event){
		func(_ *rand.Rand, s *Stream, _ *Event) { _ = copyGraph.Launch(s) },
		func(_ *rand.Rand, s *Stream, _ *Event) { _ = copyGraph.Upload(s) },
		func(_ *rand.Rand, s *Stream, ev *Event) { _ = ev.Record(s) },
		func(_ *rand.Rand, s *Stream, ev *Event) { _ = s.WaitEvent(ev) },
		func(_ *rand.Rand, s *Stream, _ *Event) { _ = m.CopyPeer(dst, d, peer, d1, 64, s) },
		func(_ *rand.Rand, s *Stream, _ *Event) { _ = s.Synchronize() },
		func(_ *rand.Rand, s *Stream, _ *Event) { _, _ = s.Query() },
		func(_ *rand.Rand, s *Stream, _ *Event) { _, _ = s.Wait(time.Millisecond) },
		func(r *rand.Rand, s *Stream, _ *Event) { _ = m.Order("dlpack", s.Handle(), pick(r).Handle()) },
		func(_ *rand.Rand, s *Stream, _ *Event) { // a capture error: the recovery looks at every capture
			_ = m.Enqueue("copy", s.Handle(), func() error {
				return cuda.NewError("cuMemcpyAsync", cuda.ErrorStreamCaptureInvalidated, "injected")
			})
		},
		func(_ *rand.Rand, s *Stream, _ *Event) {
			allocMu.Lock()
			defer allocMu.Unlock()
			if allocGraph.Launch(s) != nil {
				freeOwned(s)
				_ = allocGraph.Launch(s)
			}
		},
		func(r *rand.Rand, s *Stream, ev *Event) { // a relaxed capture that another stream joins
			if s.BeginCapture(cuda.CaptureModeRelaxed) != nil {
				return
			}
			_ = ev.Record(s)
			if other := pick(r); other != s {
				_ = other.WaitEvent(ev)
				_ = ev.Record(other)
				_ = s.WaitEvent(ev)
			}
			_ = copyGraph.Launch(s) // refused: the stream captures
			_ = m.CopyDtoD(dst, src, 64, s)
			if g, err := s.EndCapture(); err == nil {
				_ = g.Destroy()
			} else {
				_ = s.AbortCapture()
			}
		},
		func(r *rand.Rand, s *Stream, ev *Event) { // a GLOBAL or THREAD_LOCAL capture, ended on its thread
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if s.BeginCapture([]cuda.CaptureMode{cuda.CaptureModeGlobal, cuda.CaptureModeThreadLocal}[r.Intn(2)]) != nil {
				return
			}
			_ = m.CopyDtoD(dst, src, 64, s)
			_ = ev.Record(s)
			if g, err := s.EndCapture(); err == nil {
				_ = g.Destroy()
			} else {
				_ = s.AbortCapture()
			}
		},
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var ops atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(w)))
			ev, err := m.NewEvent(false)
			if !assert.NoError(t, err) {
				return
			}
			defer func() { assert.NoError(t, ev.Destroy()) }()
			for {
				select {
				case <-stop:
					return
				default:
				}
				work[r.Intn(len(work))](r, pick(r), ev)
				ops.Add(1)
			}
		}()
	}
	var destroyed atomic.Int64
	wg.Add(1)
	go func() { // replaces a stream and destroys the old one, over and over
		defer wg.Done()
		r := rand.New(rand.NewSource(int64(workers)))
		for {
			select {
			case <-stop:
				return
			default:
			}
			s, err := m.Create(r.Intn(2) == 0, 0)
			if !assert.NoError(t, err) {
				return
			}
			mu.Lock()
			i := r.Intn(len(streams))
			old := streams[i]
			streams[i] = s
			mu.Unlock()
			time.Sleep(time.Duration(r.Intn(200)) * time.Microsecond)
			_ = old.Destroy()
			destroyed.Add(1)
		}
	}()
	done := make(chan struct{})
	go func() { time.Sleep(runFor); close(stop); wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
		t.Fatal("deadlocked: the goroutines' stacks are above")
	}
	stale.Range(func(msg, _ any) bool {
		t.Errorf("a destroyed stream's handle reached the driver: %v", msg)
		return true
	})
	assert.Positive(t, destroyed.Load(), "streams were destroyed")
	assert.Greater(t, ops.Load(), int64(1000), "work ran")
	t.Logf("%d operations, %d streams destroyed", ops.Load(), destroyed.Load())

	allocMu.Lock()
	freeOwned(capturer) // if the last launch's allocation is still live
	allocMu.Unlock()
	for _, s := range streams {
		assert.NoError(t, s.Destroy())
	}
	assert.NoError(t, copyGraph.Destroy())
	assert.NoError(t, allocGraph.Destroy())
	assert.NoError(t, capturer.Destroy())
}
