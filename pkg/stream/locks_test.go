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
