package stream

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
)

const pendingSize = 4096

// pendingOf returns m's count of graph memory allocations that no launch has made real.
func pendingOf(m *Manager) int {
	m.gm.mu.Lock()
	defer m.gm.mu.Unlock()
	return m.gm.pending
}

// captureAlloc begins a capture on s and allocates pendingSize bytes of graph memory on it.
func (e *env) captureAlloc(t *testing.T, s *Stream) cuda.DevicePtr {
	t.Helper()
	require.NoError(t, s.BeginCapture(cuda.CaptureModeThreadLocal))
	p, err := e.stack.Allocate(pendingSize, s.Handle())
	require.NoError(t, err)
	e.m.NoteAllocate(s.Handle(), p, pendingSize)
	require.True(t, e.m.GraphMemory(s.Handle(), p), "booked as graph memory")
	return p
}

// freeGraphMemory is the owner's free of graph memory p allocated on s (the Buffer's close).
func (e *env) freeGraphMemory(t *testing.T, s *Stream, p cuda.DevicePtr) {
	t.Helper()
	handled, err := e.m.FreeGraphAware(p, pendingSize, func() error { return e.stack.Deallocate(p, pendingSize, s.Handle()) }, func() {})
	require.NoError(t, err)
	if !handled {
		require.NoError(t, e.stack.Deallocate(p, pendingSize, s.Handle()))
	}
}

// Graph memory of an ended capture whose graph was never launched is refused everywhere; after the first
// launch it is ordinary memory.
func TestPendingGraphMemoryUse(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	e := newEnv(t)
	s, other := e.stream(t, true), e.stream(t, true)
	base := PendingGraphMemory()
	p := e.captureAlloc(t, s)
	assert.Equal(t, 0, pendingOf(e.m), "not counted while the capture goes on (the direct path is off while any stream captures)")
	require.NoError(t, e.m.CopyDtoD(p, p+64, 64, s), "inside the allocating capture")
	requireResult(t, cuda.ErrorIllegalState, e.m.CopyDtoD(p, p+64, 64, other), "another stream, during the capture")
	requireResult(t, cuda.ErrorIllegalState, e.m.CopyDtoH(make([]byte, 64), p, nil), "a synchronous copy, during the capture")
	requireResult(t, cuda.ErrorIllegalState, e.m.CheckGraphMemoryUse("launch", other.Handle(), []cuda.DevicePtr{p + 8}), "a kernel on another stream")
	require.NoError(t, e.m.CheckGraphMemoryUse("launch", s.Handle(), []cuda.DevicePtr{p + 8}), "a kernel in the capture")
	assert.True(t, s.Capturing(), "refusals leave the capture going")
	g, err := s.EndCapture()
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, g.Destroy()) })
	assert.Equal(t, 1, pendingOf(e.m), "pending after the capture ended")
	assert.Equal(t, base+1, PendingGraphMemory(), "process-wide count")

	host := make([]byte, 64)
	pinned := e.pinned(t, 64)
	for _, tc := range []struct {
		name string
		use  func() error
	}{
		{"sync copy to the host", func() error { return e.m.CopyDtoH(host, p, nil) }},
		{"sync copy from the host", func() error { return e.m.CopyHtoD(p, host, nil) }},
		{"async copy on the allocating stream", func() error { return e.m.CopyDtoH(pinned, p+128, s) }},
		{"device copy on another stream", func() error { return e.m.CopyDtoD(p, p+64, 64, other) }},
		{"device copy, graph memory only the source", func() error { return e.m.CopyDtoD(e.alloc(t, 64), p+pendingSize-1, 1, other) }},
		{"kernel on another stream", func() error {
			return e.m.CheckGraphMemoryUse("launch", other.Handle(), []cuda.DevicePtr{p + pendingSize - 1})
		}},
		{"export", func() error { return e.m.CheckGraphMemoryExport("dlpack", p+16, 16) }},
		{"inside another capture", func() error {
			require.NoError(t, other.BeginCapture(cuda.CaptureModeThreadLocal))
			defer func() { require.NoError(t, other.AbortCapture()) }()
			return e.m.CopyDtoD(p, p+64, 64, other)
		}},
	} {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			runtime.LockOSThread() // a subtest's goroutine is not the parent's locked thread
			defer runtime.UnlockOSThread()
			requireResult(t, cuda.ErrorIllegalState, tc.use())
		})
	}
	requireResult(t, cuda.ErrorIllegalState, e.m.CopyDtoD(p, p+64, 64, other))
	require.NoError(t, e.m.CopyDtoD(p+pendingSize, p+pendingSize, 1, other), "the byte after it is not graph memory")
	require.NoError(t, e.m.CheckGraphMemoryUse("launch", other.Handle(), []cuda.DevicePtr{p - 1, p + pendingSize}), "nor the bytes around it")

	require.NoError(t, g.Launch(s))
	require.NoError(t, s.Synchronize())
	assert.Equal(t, 0, pendingOf(e.m), "launched")
	assert.Equal(t, base, PendingGraphMemory(), "process-wide count back")
	for _, tc := range []struct {
		name string
		use  func() error
	}{
		{"sync copy to the host", func() error { return e.m.CopyDtoH(host, p, nil) }},
		{"sync copy from the host", func() error { return e.m.CopyHtoD(p, host, nil) }},
		{"device copy on another stream", func() error { return e.m.CopyDtoD(p, p+64, 64, other) }},
		{"kernel on another stream", func() error {
			return e.m.CheckGraphMemoryUse("launch", other.Handle(), []cuda.DevicePtr{p})
		}},
		{"export", func() error { return e.m.CheckGraphMemoryExport("dlpack", p, pendingSize) }},
	} {
		t.Run("after launch/"+tc.name, func(t *testing.T) {
			assert.NoError(t, tc.use())
		})
	}
	require.NoError(t, other.Synchronize())
	e.freeGraphMemory(t, s, p)
}

// The pending count goes back to zero however graph memory leaves the pending state, and never goes
// negative: a count left over would turn the direct path off for the rest of the process.
func TestPendingGraphMemoryCount(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, e *env, s *Stream)
	}{
		{"launched", func(t *testing.T, e *env, s *Stream) {
			p := e.captureAlloc(t, s)
			g, err := s.EndCapture()
			require.NoError(t, err)
			assert.Equal(t, 1, pendingOf(e.m))
			require.NoError(t, g.Launch(s))
			require.NoError(t, s.Synchronize())
			assert.Equal(t, 0, pendingOf(e.m))
			e.freeGraphMemory(t, s, p)
			require.NoError(t, g.Launch(s), "an orphan's launch")
			require.NoError(t, s.Synchronize())
			require.NoError(t, g.Destroy())
		}},
		{"graph destroyed before any launch (void)", func(t *testing.T, e *env, s *Stream) {
			p := e.captureAlloc(t, s)
			g, err := s.EndCapture()
			require.NoError(t, err)
			require.NoError(t, g.Instantiate())
			assert.Equal(t, 1, pendingOf(e.m))
			require.NoError(t, g.Destroy())
			assert.Equal(t, 0, pendingOf(e.m))
			e.freeGraphMemory(t, s, p)
		}},
		{"freed before the first launch (orphan)", func(t *testing.T, e *env, s *Stream) {
			p := e.captureAlloc(t, s)
			g, err := s.EndCapture()
			require.NoError(t, err)
			e.freeGraphMemory(t, s, p)
			assert.Equal(t, 0, pendingOf(e.m))
			require.NoError(t, g.Launch(s))
			require.NoError(t, s.Synchronize())
			assert.Equal(t, 0, pendingOf(e.m), "an orphan's launch is not counted again")
			require.NoError(t, g.Destroy())
		}},
		{"capture aborted", func(t *testing.T, e *env, s *Stream) {
			p := e.captureAlloc(t, s)
			require.NoError(t, s.AbortCapture())
			assert.Equal(t, 0, pendingOf(e.m))
			e.freeGraphMemory(t, s, p)
		}},
		{"stream destroyed while capturing", func(t *testing.T, e *env, _ *Stream) {
			s2, err := e.m.Create(true, 0)
			require.NoError(t, err)
			p := e.captureAlloc(t, s2)
			_ = s2.Destroy()
			assert.Equal(t, 0, pendingOf(e.m))
			e.freeGraphMemory(t, s2, p)
		}},
		{"two graphs, destroyed during another capture", func(t *testing.T, e *env, s *Stream) {
			p := e.captureAlloc(t, s)
			g1, err := s.EndCapture()
			require.NoError(t, err)
			q := e.captureAlloc(t, s)
			g2, err := s.EndCapture()
			require.NoError(t, err)
			require.NoError(t, g2.Instantiate(), "not during the capture below (an unsafe call)")
			assert.Equal(t, 2, pendingOf(e.m))
			other, err := e.m.Create(true, 0)
			require.NoError(t, err)
			r := e.captureAlloc(t, other)
			require.NoError(t, g1.Destroy(), "deferred until the capture ends")
			require.NoError(t, g2.Launch(s))
			g3, err := other.EndCapture()
			require.NoError(t, err)
			require.NoError(t, s.Synchronize())
			require.NoError(t, g3.Destroy())
			assert.Equal(t, 0, pendingOf(e.m))
			e.freeGraphMemory(t, s, p)
			e.freeGraphMemory(t, s, q)
			e.freeGraphMemory(t, other, r)
			require.NoError(t, g2.Destroy())
			require.NoError(t, other.Destroy())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.LockOSThread() // a subtest's goroutine is not the parent's locked thread
			defer runtime.UnlockOSThread()
			base := PendingGraphMemory()
			e := newEnv(t)
			s := e.stream(t, true)
			tc.run(t, e, s)
			assert.Equal(t, 0, pendingOf(e.m), "this manager's count")
			assert.Equal(t, base, PendingGraphMemory(), "the process-wide count")
			assert.GreaterOrEqual(t, PendingGraphMemory(), 0)
		})
	}
}
