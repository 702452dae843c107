package stream

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// event creates an event without timing, destroyed when the test ends.
func (e *env) event(t *testing.T) *Event {
	t.Helper()
	ev, err := e.m.NewEvent(false)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, ev.Destroy()) })
	return ev
}

// fork begins a capture on s and joins j to it through an event recorded there.
func (e *env) fork(t *testing.T, s, j *Stream, mode cuda.CaptureMode) {
	t.Helper()
	ev := e.event(t)
	require.NoError(t, s.BeginCapture(mode))
	require.NoError(t, ev.Record(s))
	require.NoError(t, j.WaitEvent(ev))
	require.True(t, j.Capturing(), "joined")
}

// rejoin makes s wait for the work queued on j so far.
func (e *env) rejoin(t *testing.T, s, j *Stream) {
	t.Helper()
	ev := e.event(t)
	require.NoError(t, ev.Record(j))
	require.NoError(t, s.WaitEvent(ev))
}

// A joined stream is one of the capture's streams for every book cudacore keeps: its allocations are the
// capture's graph memory (never a cached block), and that memory may be used on it and on the origin,
// but not on a stream joined to another capture. Once a stream joined, no free of the capture's memory
// is a node of its graph: it waits for the capture's end.
func TestJoinedStreamShareTheCapturesBooks(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	e := newEnv(t)
	s, j := e.stream(t, true), e.stream(t, true)
	s2, j2 := e.stream(t, true), e.stream(t, true)

	cached, err := e.stack.Allocate(pendingSize, j.Handle())
	require.NoError(t, err)
	require.NoError(t, e.stack.Deallocate(cached, pendingSize, j.Handle())) // cached on j

	e.fork(t, s, j, cuda.CaptureModeThreadLocal)
	e.fork(t, s2, j2, cuda.CaptureModeThreadLocal)
	assert.Equal(t, 2, e.m.reg.Active(), "a join is no capture of its own")
	allocs := e.drv.Calls("cuMemAllocFromPoolAsync")
	p, err := e.stack.Allocate(pendingSize, j.Handle())
	require.NoError(t, err)
	e.m.NoteAllocate(j.Handle(), p, pendingSize)
	assert.Equal(t, allocs+1, e.drv.Calls("cuMemAllocFromPoolAsync"), "an allocation node, not the cached block")
	for _, h := range []cuda.Stream{j.Handle(), s.Handle(), j2.Handle()} {
		assert.False(t, e.m.GraphMemory(h, p), "its free waits for the capture's end")
	}

	require.NoError(t, e.m.CopyDtoD(p, p+64, 64, j), "on the joined stream that allocated it")
	require.NoError(t, e.m.CheckGraphMemoryUse("launch", s.Handle(), []cuda.DevicePtr{p}), "on the origin")
	requireResult(t, cuda.ErrorIllegalState, e.m.CheckGraphMemoryUse("launch", j2.Handle(), []cuda.DevicePtr{p}),
		"on a stream joined to another capture")
	requireResult(t, cuda.ErrorIllegalState, e.m.CopyDtoD(p, p+64, 64, s2), "on another capture's origin")

	e.rejoin(t, s, j)
	g, err := s.EndCapture()
	require.NoError(t, err)
	assert.Equal(t, 1, g.Allocations())
	assert.False(t, j.Capturing())
	e.freeGraphMemory(t, j, p) // the Buffer's close, after the capture: its graph's rules
	require.NoError(t, g.Destroy())

	e.rejoin(t, s2, j2)
	g2, err := s2.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g2.Destroy())
	assert.Equal(t, 0, e.m.reg.Active())
}

// A joined stream destroyed during the capture is closed to cudacore at once, and destroyed at the driver
// when the capture ends: its work may still be joined back.
func TestJoinedStreamDestroyWaitsForTheCapture(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	e := newEnv(t)
	s := e.stream(t, true)
	j, err := e.m.Create(true, 0)
	require.NoError(t, err)
	p := e.alloc(t, 64)
	e.fork(t, s, j, cuda.CaptureModeGlobal)
	require.NoError(t, e.m.CopyDtoD(p, p, 64, j))
	ev := e.event(t)
	require.NoError(t, ev.Record(j))

	destroys := e.drv.Calls("cuStreamDestroy_v2")
	require.NoError(t, j.Destroy())
	assert.Equal(t, destroys, e.drv.Calls("cuStreamDestroy_v2"), "not yet at the driver")
	requireResult(t, cuda.ErrorClosed, j.Synchronize())
	require.NoError(t, s.WaitEvent(ev))
	g, err := s.EndCapture()
	require.NoError(t, err, "the closed stream's work was joined back")
	assert.Equal(t, destroys+1, e.drv.Calls("cuStreamDestroy_v2"), "destroyed once the capture ended")
	require.NoError(t, j.Destroy(), "idempotent")
	assert.Equal(t, destroys+1, e.drv.Calls("cuStreamDestroy_v2"))
	require.NoError(t, g.Destroy())
}

// A join the driver refuses leaves the stream out of the capture, and its cache usable again.
func TestFailedJoinIsUndone(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	e := newEnv(t)
	s, j := e.stream(t, true), e.stream(t, true)
	ev := e.event(t)
	require.NoError(t, s.BeginCapture(cuda.CaptureModeRelaxed))
	require.NoError(t, ev.Record(s))
	e.drv.InjectFault("cuStreamWaitEvent", 1, cuda.ErrorUnknown)
	requireResult(t, cuda.ErrorUnknown, j.WaitEvent(ev))
	assert.False(t, j.Capturing())
	assert.True(t, s.Capturing())

	p, err := e.stack.Allocate(pendingSize, j.Handle())
	require.NoError(t, err)
	require.NoError(t, e.stack.Deallocate(p, pendingSize, j.Handle()))
	allocs := e.drv.Calls("cuMemAllocFromPoolAsync")
	q, err := e.stack.Allocate(pendingSize, j.Handle())
	require.NoError(t, err)
	assert.Equal(t, allocs, e.drv.Calls("cuMemAllocFromPoolAsync"), "j's cache serves it again")
	require.NoError(t, e.stack.Deallocate(q, pendingSize, j.Handle()))

	g, err := s.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g.Destroy())
}
