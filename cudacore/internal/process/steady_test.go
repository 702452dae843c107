package process

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/device"
	"github.com/cudacore/cudacore/pkg/memory"
)

// lockedWorker runs functions, in order, on one goroutine locked to its OS thread (a GLOBAL capture
// must end on the thread that began it).
type lockedWorker chan func()

func newLockedWorker(t *testing.T) lockedWorker {
	w := make(lockedWorker, 8)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for fn := range w {
			fn()
		}
	}()
	t.Cleanup(func() { close(w) })
	return w
}

func (w lockedWorker) async(fn func() error) chan error {
	out := make(chan error, 1)
	w <- func() { out <- fn() }
	return out
}

func waitErr(t *testing.T, what string, ch chan error, d time.Duration) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(d):
		t.Fatalf("%s did not return within %v (deadlock?)", what, d)
		return nil
	}
}

// FreeSteady (PyTorch's free, made without the GIL) decides inside Steady that a capture runs, and then
// makes the free through Free outside Steady. If the capture ends in between, Free finds no capture and
// frees at once, outside Steady: a GLOBAL capture begun on another thread between Free's check and the
// driver's free is then invalidated by it (900), the race 04f8e55 closed for the free made at once.
// The test widens the two windows with the managed table's mutex (taken by Free after Steady) and the
// allocator's inFlight lock (taken by freeNow after Free's check).
func TestFreeSteadyCaptureEndsAndAnotherBeginsBeforeTheDriverFree(t *testing.T) {
	d := simDevice(t)
	if d.Strategy() != device.StrategyPool {
		t.Skip("needs the pool strategy")
	}
	const big = 80 << 20 // bypasses the cache: the free reaches the driver
	u, err := d.Streams().Create(true, 0)
	require.NoError(t, err)
	s, err := d.Streams().Create(true, 0)
	require.NoError(t, err)
	var p cuda.DevicePtr
	require.NoError(t, Steady(func() (err error) { p, err = d.Allocate(big, u.Handle()); return err }))
	mp, err := d.AllocateManaged(4096) // so that Free consults the managed table (its mutex)
	require.NoError(t, err)
	defer func() { _ = d.Free(mp, 4096, cuda.StreamLegacy) }()

	w := newLockedWorker(t)
	require.NoError(t, waitErr(t, "begin 1", w.async(func() error { return s.BeginCapture(cuda.CaptureModeGlobal) }), 2*time.Second))

	d.managed.mu.Lock()
	d.inFlight.Lock()
	managedHeld, inFlightHeld := true, true
	release := func() {
		if managedHeld {
			managedHeld = false
			d.managed.mu.Unlock()
		}
		if inFlightHeld {
			inFlightHeld = false
			d.inFlight.Unlock()
		}
	}
	defer release()

	freed := make(chan error, 1)
	go func() { freed <- d.FreeSteady(p, big, u.Handle()) }()
	time.Sleep(50 * time.Millisecond) // FreeSteady saw the capture; its Free waits for the managed table

	end1 := w.async(func() error {
		g, err := s.EndCapture()
		if g != nil {
			_ = g.Destroy()
		}
		return err
	})
	select { // before the fix: the capture ends at once (FreeSteady holds nothing)
	case err := <-end1:
		require.NoError(t, err)
		end1 = nil
	case <-time.After(100 * time.Millisecond):
	}
	d.managed.mu.Unlock() // Free goes on: its capture check, then freeNow waits for inFlight
	managedHeld = false
	time.Sleep(50 * time.Millisecond)
	begin2 := w.async(func() error { return s.BeginCapture(cuda.CaptureModeGlobal) })
	time.Sleep(50 * time.Millisecond)
	d.inFlight.Unlock() // the driver's free is made now
	inFlightHeld = false

	if end1 != nil {
		require.NoError(t, waitErr(t, "end 1", end1, 2*time.Second))
	}
	assert.NoError(t, waitErr(t, "FreeSteady", freed, 2*time.Second), "the free reached the driver during the GLOBAL capture")
	require.NoError(t, waitErr(t, "begin 2", begin2, 2*time.Second))
	end2 := w.async(func() error {
		g, err := s.EndCapture()
		if g != nil {
			_ = g.Destroy()
		}
		return err
	})
	assert.NoError(t, waitErr(t, "end 2", end2, 2*time.Second), "the capture begun after FreeSteady's check was invalidated")
	require.NoError(t, waitErr(t, "destroy", w.async(s.Destroy), 2*time.Second))
	require.NoError(t, u.Destroy())
}

// The Free door (cudacore/buffer.go) runs without the GIL on a device with the synchronous strategy
// ("gil device"), as PyTorch's does, and calls Device.Free: its capture check and the driver's free
// (cuMemFree, an unsafe call) are not made while no capture can begin, so a GLOBAL capture begun on
// another thread in between is invalidated, the race 04f8e55 closed for the PyTorch doors only. The test
// widens the window with the allocator's inFlight lock, which freeNow takes after Free's check.
func TestFreeDoorOfTheSyncStrategyRacesACaptureBegunMeanwhile(t *testing.T) {
	d := simDevice(t)
	old := string(d.Strategy())
	require.NoError(t, d.SetStrategy("sync", memory.StackOptions{}))
	defer func() { require.NoError(t, d.SetStrategy(old, memory.StackOptions{})) }()
	const big = 80 << 20 // bypasses the cache: the free reaches the driver
	var p cuda.DevicePtr
	require.NoError(t, Steady(func() (err error) { p, err = d.Allocate(big, cuda.StreamLegacy); return err }))
	s, err := d.Streams().Create(true, 0)
	require.NoError(t, err)
	w := newLockedWorker(t)

	d.inFlight.Lock()
	held := true
	defer func() {
		if held {
			d.inFlight.Unlock()
		}
	}()
	freed := make(chan error, 1)
	go func() { freed <- freeDoor(d, p, big, cuda.StreamLegacy) }()
	time.Sleep(50 * time.Millisecond) // past the capture check, waiting for inFlight
	begin := w.async(func() error { return s.BeginCapture(cuda.CaptureModeGlobal) })
	select {
	case err := <-begin:
		require.NoError(t, err)
		begin = nil
	case <-time.After(100 * time.Millisecond): // fixed: the free holds Steady, the capture waits
	}
	d.inFlight.Unlock()
	held = false
	assert.NoError(t, waitErr(t, "free", freed, 2*time.Second), "the free reached the driver during the GLOBAL capture")
	if begin != nil {
		require.NoError(t, waitErr(t, "begin", begin, 2*time.Second))
	}
	end := w.async(func() error {
		g, err := s.EndCapture()
		if g != nil {
			_ = g.Destroy()
		}
		return err
	})
	assert.NoError(t, waitErr(t, "end", end, 2*time.Second), "the capture was invalidated by the free")
	require.NoError(t, waitErr(t, "destroy", w.async(s.Destroy), 2*time.Second))
}

// freeDoor is what the Free door of cudacore/buffer.go calls (Device.Free before the fix).
func freeDoor(d *Device, p cuda.DevicePtr, size uint64, h cuda.Stream) error {
	return d.FreeSteady(p, size, h)
}
