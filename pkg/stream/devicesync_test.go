package stream

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
	"github.com/cudacore/cudacore/pkg/device"
)

// slowSync is the simulator with a cuCtxSynchronize that waits until release is closed, as for a long
// kernel.
type slowSync struct {
	*cudasim.Driver
	release chan struct{}
	calls   atomic.Int32
}

func (d *slowSync) CtxSynchronize(c cuda.Context) error {
	d.calls.Add(1)
	<-d.release
	return d.Driver.CtxSynchronize(c)
}

func newSlowSync(t *testing.T) (*Manager, *slowSync) {
	t.Helper()
	drv := &slowSync{Driver: cudasim.New(), release: make(chan struct{})}
	d, err := device.Open(drv, 0, "")
	require.NoError(t, err)
	return New(d, Options{}), drv
}

// A device synchronize in flight (here one whose caller gave up after a slice, as with Ctrl-C) keeps a
// capture from beginning only for its way into the driver (syncEntryGrace), not until the device is
// idle: the thread beginning a capture holds the GIL, so the whole interpreter would wait.
func TestCaptureBeginsWhileADeviceSynchronizeWaits(t *testing.T) {
	m, drv := newSlowSync(t)
	defer close(drv.release)
	s, err := m.Create(true, 0)
	require.NoError(t, err)
	done, err := m.SynchronizeDevice(10*time.Millisecond, true)
	require.NoError(t, err)
	require.False(t, done, "the device is busy")
	began := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		err := s.BeginCapture(cuda.CaptureModeRelaxed)
		if err == nil {
			err = s.AbortCapture()
		}
		began <- err
	}()
	select {
	case err := <-began:
		assert.NoError(t, err)
	case <-time.After(2 * time.Second):
		t.Fatal("begin_capture waited for the device synchronize to finish")
	}
}

// A refusal made on the synchronize's goroutine stands only while a capture still forbids it: once the
// capture is over, a later call does not report it.
func TestADeviceSynchronizeRefusalIsNotReportedAfterTheCaptureEnded(t *testing.T) {
	m, drv := newSlowSync(t)
	close(drv.release) // synchronizes return at once
	s, err := m.Create(true, 0)
	require.NoError(t, err)
	// The goroutine's check meets a GLOBAL capture: hold a capture begin queued behind a Steady user, so
	// that the goroutine's check runs after the capture began.
	hold, held := make(chan struct{}), make(chan struct{})
	go func() { _ = m.reg.Steady(func() error { close(held); <-hold; return nil }) }()
	<-held
	capt, end := make(chan error), make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		capt <- s.BeginCapture(cuda.CaptureModeGlobal)
		<-end
		err := s.AbortCapture()
		capt <- err
	}()
	time.Sleep(20 * time.Millisecond) // the begin waits for the change lock
	done, err := m.SynchronizeDevice(10*time.Millisecond, true)
	require.NoError(t, err)
	require.False(t, done, "its goroutine waits behind the queued begin")
	close(hold)
	require.NoError(t, <-capt)
	time.Sleep(20 * time.Millisecond) // the goroutine's check is refused now
	close(end)
	require.NoError(t, <-capt)
	require.Zero(t, m.reg.Active())
	for i := 0; i < 3; i++ {
		done, err = m.SynchronizeDevice(100*time.Millisecond, i == 0)
		require.NoError(t, err, "the refusal of a capture that is over")
		if done {
			break
		}
	}
	assert.True(t, done)
}

// A new Device.synchronize after one that was given up (Ctrl-C) does not take the old synchronize's
// return for its own: that one covered only the work queued before it began. It waits for another.
func TestANewDeviceSynchronizeDoesNotTakeAnAbandonedOnesResult(t *testing.T) {
	m, drv := newSlowSync(t)
	done, err := m.SynchronizeDevice(10*time.Millisecond, true)
	require.NoError(t, err)
	require.False(t, done, "given up: the device is busy")
	close(drv.release) // the abandoned synchronize returns (work queued since is not covered by it)
	for i := 0; ; i++ {
		done, err = m.SynchronizeDevice(100*time.Millisecond, i == 0)
		require.NoError(t, err)
		if done {
			break
		}
		require.Less(t, i, 20)
	}
	assert.Equal(t, int32(2), drv.calls.Load(), "the new wait made its own cuCtxSynchronize")
	done, err = m.SynchronizeDevice(100*time.Millisecond, true)
	require.NoError(t, err)
	assert.True(t, done)
	assert.Equal(t, int32(3), drv.calls.Load(), "nothing in flight: one synchronize per wait")
}
