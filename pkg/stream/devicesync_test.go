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

// hookedWaits is the simulator with hooks on the host waits of streams and events: the queries can be
// made to answer not ready (busy), and onQuery and onSync each run once on entry to the next query or
// blocking wait, before the simulator sees it.
type hookedWaits struct {
	*cudasim.Driver
	busy            atomic.Bool
	onQuery, onSync atomic.Pointer[func()]
}

func run(hook *atomic.Pointer[func()]) {
	if f := hook.Swap(nil); f != nil {
		(*f)()
	}
}

func (d *hookedWaits) query(name string, call func() error) error {
	run(&d.onQuery)
	if d.busy.Load() {
		return cuda.NewError(name, cuda.ErrorNotReady, "")
	}
	return call()
}

func (d *hookedWaits) StreamQuery(c cuda.Context, s cuda.Stream) error {
	return d.query("cuStreamQuery", func() error { return d.Driver.StreamQuery(c, s) })
}

func (d *hookedWaits) EventQuery(c cuda.Context, e cuda.Event) error {
	return d.query("cuEventQuery", func() error { return d.Driver.EventQuery(c, e) })
}

func (d *hookedWaits) StreamSynchronize(c cuda.Context, s cuda.Stream) error {
	run(&d.onSync)
	return d.Driver.StreamSynchronize(c, s)
}

func (d *hookedWaits) EventSynchronize(c cuda.Context, e cuda.Event) error {
	run(&d.onSync)
	return d.Driver.EventSynchronize(c, e)
}

// hookedStreams opens a device on the hooked simulator and a manager on it, with two non-blocking
// streams: one to wait on, and another for a capture.
func hookedStreams(t *testing.T) (*hookedWaits, *Manager, *Stream, *Stream) {
	t.Helper()
	drv := &hookedWaits{Driver: cudasim.New()}
	d, err := device.Open(drv, 0, "")
	require.NoError(t, err)
	m := New(d, Options{})
	s, err := m.Create(true, 0)
	require.NoError(t, err)
	other, err := m.Create(true, 0)
	require.NoError(t, err)
	return drv, m, s, other
}

// rivalCapture is a GLOBAL capture of a stream that another thread begins while the code under test is
// on its way into the driver (begin, from a driver hook), and ends when the test says (end).
type rivalCapture struct {
	s       *Stream
	began   chan error
	proceed chan struct{}
	ended   chan error
}

func newRivalCapture(s *Stream) *rivalCapture {
	return &rivalCapture{s: s, began: make(chan error, 1), proceed: make(chan struct{}), ended: make(chan error, 1)}
}

// begin starts the capture on a thread of its own and gives it 20 ms to begin, unless cudacore keeps it
// out until the caller's driver call is done.
func (r *rivalCapture) begin() {
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		r.began <- r.s.BeginCapture(cuda.CaptureModeGlobal)
		<-r.proceed
		g, err := r.s.EndCapture()
		if err == nil {
			err = g.Destroy()
		}
		r.ended <- err
	}()
	select {
	case err := <-r.began:
		r.began <- err
	case <-time.After(20 * time.Millisecond):
	}
}

// end waits for the capture to have begun, ends it, and returns the first error of the three steps: none
// when the capture survived what ran meanwhile.
func (r *rivalCapture) end() error {
	if err := <-r.began; err != nil {
		return err
	}
	close(r.proceed)
	return <-r.ended
}

// A host wait (query or synchronize of a stream or an event; the doors of the sliced waits release the
// GIL) checks the capture rules and then calls the driver: a GLOBAL capture that another thread began in
// between was invalidated by the wait, an unsafe call (found by an adversarial review: a few captures in
// 100,000, the error blaming "an operation cudacore did not see"). The check and the driver's entry are
// one step now: the capture begins after the wait has entered the driver, and stays valid.
func TestAHostWaitDoesNotInvalidateACaptureBegunMeanwhile(t *testing.T) {
	saved := syncEntryGrace
	syncEntryGrace = time.Minute // the blocking waits' grace covers the hook's delay
	defer func() { syncEntryGrace = saved }()
	drv, m, s, other := hookedStreams(t)
	ev, err := m.NewEvent(false)
	require.NoError(t, err)
	require.NoError(t, ev.Record(s))
	for _, c := range []struct {
		name     string
		wait     func() error
		blocking bool // the hook waits for a blocking call: on a busy stream, a sliced wait's blocking slice
	}{
		{"Stream.Query", func() error { _, err := s.Query(); return err }, false},
		{"Stream.Synchronize", s.Synchronize, true},
		{"Stream.Wait", func() error { _, err := s.Wait(time.Second); return err }, false},
		{"Stream.Wait, blocking slice", func() error { _, err := s.Wait(time.Second); return err }, true},
		{"Event.Query", func() error { _, err := ev.Query(); return err }, false},
		{"Event.Synchronize", ev.Synchronize, true},
		{"Event.Wait", func() error { _, err := ev.Wait(time.Second); return err }, false},
		{"Event.Wait, blocking slice", func() error { _, err := ev.Wait(time.Second); return err }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			rival := newRivalCapture(other)
			hook := rival.begin // the wait is on its way into the driver: another thread begins a capture
			on := &drv.onQuery
			if c.blocking {
				on = &drv.onSync
				drv.busy.Store(true) // until the blocking call: then the confirming query says done
				unbusy := hook
				hook = func() { drv.busy.Store(false); unbusy() }
			}
			on.Store(&hook)
			err := c.wait()
			require.Nil(t, on.Load(), "the wait reached the hooked driver call")
			if err != nil {
				// A sliced wait whose stream was not done yet asks again after the capture began: refused
				// then, before the driver, which leaves the capture alone.
				require.Equal(t, cuda.ErrorStreamCaptureUnsupported, cuda.ResultOf(err), "%v", err)
			}
			require.NoError(t, rival.end(), "the capture survived the wait")
		})
	}
}

// Stream.Destroy runs with the change lock held for reading, and used to wait there for the helper
// goroutine of a Stream.Wait on another thread. That helper takes the change lock for reading before its
// blocking call, and a capture's begin queued for writing in between kept it out: Destroy waited for the
// helper, the helper for the begin, the begin for Destroy (found by a review). Destroy now waits only
// for the calls that hold the stream, which the helper takes after the change lock.
func TestStreamDestroyDoesNotWaitForAWaitsHelper(t *testing.T) {
	drv, _, s, other := hookedStreams(t)
	drv.busy.Store(true)

	inQuery, releaseQuery := make(chan struct{}), make(chan struct{})
	pauseQuery := func() { close(inQuery); <-releaseQuery; time.Sleep(3 * time.Millisecond) }
	waited := make(chan error, 1)
	go func() { _, err := s.Wait(10 * time.Second); waited <- err }()
	time.Sleep(time.Millisecond) // past the first queries
	drv.onQuery.Store(&pauseQuery)
	<-inQuery

	inSync, releaseSync := make(chan struct{}), make(chan struct{})
	pauseSync := func() { close(inSync); <-releaseSync }
	drv.onSync.Store(&pauseSync)
	destroyed := make(chan error, 1)
	go func() { destroyed <- s.Destroy() }()
	<-inSync // Destroy holds the change lock for reading, inside its synchronize
	began := make(chan error, 1)
	go func() { began <- other.BeginCapture(cuda.CaptureModeRelaxed) }()
	time.Sleep(20 * time.Millisecond) // the begin queues for the change lock
	close(releaseQuery)               // the wait's query answers not ready: its helper starts
	time.Sleep(50 * time.Millisecond)
	drv.busy.Store(false)
	close(releaseSync)
	select {
	case err := <-destroyed:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("deadlock: Destroy, the wait's helper and BeginCapture wait for each other")
	}
	require.NoError(t, <-began)
	g, err := other.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g.Destroy())
	select {
	case err := <-waited: // the stream is gone: a closed error, or done if it finished first
		if err != nil {
			assert.Equal(t, cuda.ErrorClosed, cuda.ResultOf(err), "%v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the wait never returned")
	}
}
