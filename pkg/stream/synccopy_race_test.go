package stream

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// A synchronous copy (CopyToDevice with stream -1) runs without the GIL: its capture check
// (checkSyncCopy: no blocking stream captures, else 906) and the driver's cuMemcpyHtoD are not made in
// one steady state (Registry.Steady), so a capture of a blocking stream begun on another thread in
// between is invalidated by the copy's implicit synchronization. A stress test.
func TestSyncCopyRacingACaptureOfABlockingStream(t *testing.T) {
	e := newEnv(t)
	dst, err := e.stack.Allocate(4096, cuda.StreamLegacy)
	require.NoError(t, err)
	defer func() { _ = e.stack.Deallocate(dst, 4096, cuda.StreamLegacy) }()
	s, err := e.m.Create(false, 0) // blocking: the legacy stream waits for it
	require.NoError(t, err)
	defer func() { _ = s.Destroy() }()

	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	src := make([]byte, 8)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			_ = e.m.CopyHtoD(dst, src, nil) // refused (906) while the capture runs
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	invalidated := 0
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && invalidated == 0 {
		if err := s.BeginCapture(cuda.CaptureModeRelaxed); err != nil {
			continue
		}
		g, err := s.EndCapture()
		if g != nil {
			_ = g.Destroy()
		}
		if err != nil {
			invalidated++
			t.Log(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	require.Zero(t, invalidated, "a synchronous copy reached the driver during a capture of a blocking stream")
}
