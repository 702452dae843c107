package stream

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// A capture failure of work enqueued on a stream (a kernel launch, a managed prefetch) ends the
// invalidated capture, which runs the frees deferred until then, and each of them brackets its stream
// (UseForFree: the read side of the lifetime lock). The work's own bracket of its stream, held across that
// handling, was a second read lock on the same goroutine: a stream created on another thread in between
// (Create takes the write side) queued behind the first, the second waited behind it, and both threads
// hung. EnqueueOn must finish, and the stream be created, whatever comes in between.
func TestEnqueueOnCaptureFailureWhileAStreamIsCreated(t *testing.T) {
	e := newEnv(t)
	s, err := e.m.Create(true, 0)
	require.NoError(t, err) // destroyed at the end: after a deadlock its Destroy would wait for good
	h := s.Handle()
	require.NoError(t, s.BeginCapture(cuda.CaptureModeRelaxed))
	// A free of memory last used on s, waiting for the capture to end as process.Device.Free makes it
	// wait: it brackets the stream when it runs.
	freed := make(chan cuda.Stream, 1)
	e.m.reg.Defer(func() {
		use := e.m.UseForFree(h)
		e.m.Done(h)
		freed <- use
	})
	e.drv.InjectFault("cuMemPrefetchAsync", 1, cuda.ErrorStreamCaptureInvalidated)

	created, done := make(chan error, 1), make(chan error, 1)
	go func() {
		done <- e.m.EnqueueOn("prefetch", h, func() error {
			go func() { // another thread creates a stream while the work is enqueued
				c, err := e.m.Create(true, 0)
				if err == nil {
					err = c.Destroy()
				}
				created <- err
			}()
			waitUntilBlocked(t, "(*lifetimes).reborn") // the creation waits for the write lock
			return e.drv.MemPrefetchAsync(e.dev.Context(), 0, 1, 0, h)
		})
	}()
	select {
	case err := <-done:
		requireResult(t, cuda.ErrorStreamCaptureInvalidated, err, "the injected failure")
	case <-time.After(10 * time.Second):
		t.Fatal("EnqueueOn deadlocked with a stream's creation while it handled a capture failure")
	}
	select {
	case err := <-created:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the stream's creation never finished")
	}
	assert.False(t, s.Capturing(), "the invalidated capture was ended")
	assert.Equal(t, h, <-freed, "the deferred free ran, on its live stream")
	assert.Zero(t, e.m.Registry().Deferred())
	require.NoError(t, s.Destroy())
}

// EnqueueOn refuses a stream this Manager destroyed before the driver sees its handle.
func TestEnqueueOnRefusesADestroyedStream(t *testing.T) {
	e := newEnv(t)
	s, err := e.m.Create(true, 0)
	require.NoError(t, err)
	require.NoError(t, s.Destroy())
	called := false
	err = e.m.EnqueueOn("launch", s.Handle(), func() error { called = true; return nil })
	requireResult(t, cuda.ErrorClosed, err)
	assert.False(t, called, "the destroyed handle never reached the driver")
}

// waitUntilBlocked waits until a goroutine is blocked taking a write lock in a function whose name
// contains fn (or a second has passed: the caller's test then checks less, and never fails for it).
func waitUntilBlocked(t *testing.T, fn string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, fn) && strings.Contains(g, "sync.(*RWMutex).Lock") {
				return
			}
		}
	}
}

// A graph destroy that waits for the captures to end has no caller left when it runs (Destroy returned
// nil, and the facade forgot the graph's number): a failure of the driver there was dropped, and the
// graph, with the memory its allocations hold, leaked for good. The Manager keeps it and retries it: at
// a later Destroy (at most once per retryEvery), in RetryDestroys and in Close.
func TestDeferredGraphDestroyFailureIsKeptAndRetried(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	e := newEnv(t)
	s, other := e.stream(t, true), e.stream(t, true)
	a := e.alloc(t, 64)
	g, p := e.unlaunchedGraphMemory(t, other)

	require.NoError(t, s.BeginCapture(cuda.CaptureModeGlobal))
	require.NoError(t, e.m.CopyDtoD(a, a, 64, s))
	require.NoError(t, g.Destroy(), "waits for the capture to end")
	e.drv.InjectFault("cuGraphExecDestroy", 1, cuda.ErrorUnknown)
	captured, err := s.EndCapture()
	require.NoError(t, err)
	assert.Zero(t, e.m.Registry().Deferred())
	assert.Empty(t, e.m.TakeVoided(), "the deferred destroy failed: the graph still holds its memory")
	assert.Equal(t, 1, e.m.DestroysKept(), "the graph is kept for a retry")
	assert.Equal(t, uint64(1), e.m.DestroyFailures())
	assert.True(t, g.Destroyed(), "and stays unusable")

	// A later Destroy retries it; this retry fails too, and the graph stays kept.
	calls := e.drv.Calls("cuGraphExecDestroy")
	e.drv.InjectFault("cuGraphExecDestroy", 1, cuda.ErrorUnknown)
	require.NoError(t, captured.Destroy())
	assert.Equal(t, calls+1, e.drv.Calls("cuGraphExecDestroy"), "retried by a later Destroy")
	assert.Equal(t, 1, e.m.DestroysKept())
	assert.Equal(t, uint64(2), e.m.DestroyFailures(), "each attempt counts")

	// Within retryEvery of that retry, a later Destroy does not retry again.
	e.m.fd.mu.Lock()
	e.m.fd.last = time.Now()
	e.m.fd.mu.Unlock()
	spare := e.graph(t, s, a)
	require.NoError(t, spare.Destroy())
	assert.Equal(t, calls+2, e.drv.Calls("cuGraphExecDestroy"), "the spare's own destroy, no retry within retryEvery")
	assert.Equal(t, 1, e.m.DestroysKept())

	require.NoError(t, e.m.Close(), "Close retries it at once, and it succeeds")
	assert.Equal(t, 0, e.m.DestroysKept())
	assert.Equal(t, []cuda.DevicePtr{p}, voidedPtrs(e.m.TakeVoided()), "destroyed: the memory it held is given back")
	require.NoError(t, g.Destroy(), "idempotent")
}

// graph captures a copy on s into a graph, instantiated.
func (e *env) graph(t *testing.T, s *Stream, a cuda.DevicePtr) *Graph {
	t.Helper()
	require.NoError(t, s.BeginCapture(cuda.CaptureModeThreadLocal))
	require.NoError(t, e.m.CopyDtoD(a, a, 64, s))
	g, err := s.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g.Instantiate())
	return g
}
