package stream

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
	"github.com/cudacore/cudacore/pkg/device"
)

// enqueueHooks is the simulator with a hook that runs as work on a stream reaches the driver, before the
// driver takes it.
type enqueueHooks struct {
	*cudasim.Driver
	onEnqueue atomic.Pointer[func()]
}

func (d *enqueueHooks) GraphLaunch(c cuda.Context, x cuda.GraphExec, s cuda.Stream) error {
	run(&d.onEnqueue)
	return d.Driver.GraphLaunch(c, x, s)
}

func (d *enqueueHooks) GraphUpload(c cuda.Context, x cuda.GraphExec, s cuda.Stream) error {
	run(&d.onEnqueue)
	return d.Driver.GraphUpload(c, x, s)
}

func (d *enqueueHooks) StreamBeginCapture(c cuda.Context, s cuda.Stream, mode cuda.CaptureMode) error {
	run(&d.onEnqueue)
	return d.Driver.StreamBeginCapture(c, s, mode)
}

func (d *enqueueHooks) EventRecord(c cuda.Context, e cuda.Event, s cuda.Stream) error {
	run(&d.onEnqueue)
	return d.Driver.EventRecord(c, e, s)
}

func (d *enqueueHooks) MemcpyPeerAsync(c cuda.Context, dst cuda.DevicePtr, dstCtx cuda.Context, src cuda.DevicePtr, srcCtx cuda.Context, n uint64, s cuda.Stream) error {
	run(&d.onEnqueue)
	return d.Driver.MemcpyPeerAsync(c, dst, dstCtx, src, srcCtx, n, s)
}

func (d *enqueueHooks) StreamWaitEvent(c cuda.Context, s cuda.Stream, e cuda.Event) error {
	run(&d.onEnqueue)
	return d.Driver.StreamWaitEvent(c, s, e)
}

// A stream destroyed on another thread while work is on its way to the driver on it is destroyed only
// once the driver has that work: a destroyed stream's handle crashes the real driver (docs/contributing/driver-facts.md,
// "Graph memory"), and the simulator ends the process there just as loudly. The H100 fuzzer met it as a
// segfault in cuGraphLaunch. Each case destroys the stream from the driver hook, and the work must
// still reach a live stream; the destroy then completes.
func TestAStreamIsNotDestroyedUnderWorkOnItsWay(t *testing.T) {
	pools := cudasim.DeviceConfig{TotalMemory: 1 << 30, MemoryPoolsSupported: true}
	drv := &enqueueHooks{Driver: cudasim.New(cudasim.WithDevices(pools, pools))}
	ms := managersOn(t, drv, 2)
	m, d, d1 := ms[0], ms[0].Device(), ms[1].Device()
	peer, err := drv.MemAlloc(d1.Context(), 64)
	require.NoError(t, err)
	src, err := drv.MemAlloc(d.Context(), 64)
	require.NoError(t, err)
	dst, err := drv.MemAlloc(d.Context(), 64)
	require.NoError(t, err)
	capturer, err := m.Create(true, 0)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, capturer.Destroy()) })
	require.NoError(t, capturer.BeginCapture(cuda.CaptureModeThreadLocal))
	require.NoError(t, m.CopyDtoD(dst, src, 64, capturer))
	g, err := capturer.EndCapture()
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, g.Destroy()) })
	require.NoError(t, g.Instantiate())
	ev, err := m.NewEvent(false)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, ev.Destroy()) })
	require.NoError(t, ev.Record(capturer))

	for _, tc := range []struct {
		name string
		work func(s *Stream) error
	}{
		{"graph launch", g.Launch},
		{"graph upload", g.Upload},
		{"event record", func(s *Stream) error { return ev.Record(s) }},
		{"wait on an event", func(s *Stream) error { return s.WaitEvent(ev) }},
		{"peer copy", func(s *Stream) error { return m.CopyPeer(dst, d, peer, d1, 64, s) }},
		// The destroy ends the capture it finds, then destroys the stream.
		{"begin a capture", func(s *Stream) error { return s.BeginCapture(cuda.CaptureModeRelaxed) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := m.Create(true, 0)
			require.NoError(t, err)
			destroyed := make(chan error, 1)
			var early atomic.Bool
			hook := func() {
				go func() { destroyed <- s.Destroy() }()
				select {
				case err := <-destroyed:
					early.Store(true)
					destroyed <- err
				case <-time.After(50 * time.Millisecond): // the destroy waits for the work
				}
			}
			drv.onEnqueue.Store(&hook)
			assert.NoError(t, tc.work(s), "the work reached a live stream")
			assert.False(t, early.Load(), "the stream was destroyed while its work was on the way")
			select {
			case err := <-destroyed:
				assert.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("the destroy never completed")
			}
			assert.True(t, drv.onEnqueue.Load() == nil, "the hook ran")
		})
	}
}

// deadHandles is the simulator with a record of the stream handles handed to the driver after their
// stream was destroyed (where the simulator's own check would end the test process), and hooks.
type deadHandles struct {
	*cudasim.Driver
	mu       sync.Mutex
	dead     map[cuda.Stream]bool
	stale    []string
	failCopy atomic.Bool
	onQuery  atomic.Pointer[func()]
}

// note records op if s is dead, and says whether it is.
func (d *deadHandles) note(op string, s cuda.Stream) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead[s] {
		d.stale = append(d.stale, op)
	}
	return d.dead[s]
}

func (d *deadHandles) StreamDestroy(c cuda.Context, s cuda.Stream) error {
	d.mu.Lock()
	d.dead[s] = true
	d.mu.Unlock()
	return d.Driver.StreamDestroy(c, s)
}

func (d *deadHandles) StreamIsCapturing(c cuda.Context, s cuda.Stream) (cuda.CaptureStatus, error) {
	run(&d.onQuery)
	if d.note("cuStreamIsCapturing", s) {
		return cuda.CaptureStatusNone, cuda.NewError("cuStreamIsCapturing", cuda.ErrorInvalidHandle, "dead")
	}
	return d.Driver.StreamIsCapturing(c, s)
}

func (d *deadHandles) StreamEndCapture(c cuda.Context, s cuda.Stream) (cuda.Graph, error) {
	if d.note("cuStreamEndCapture", s) {
		return 0, cuda.NewError("cuStreamEndCapture", cuda.ErrorInvalidHandle, "dead")
	}
	return d.Driver.StreamEndCapture(c, s)
}

func (d *deadHandles) MemcpyDtoDAsync(c cuda.Context, dst, src cuda.DevicePtr, n uint64, s cuda.Stream) error {
	if d.failCopy.Load() {
		return cuda.NewError("cuMemcpyDtoDAsync", cuda.ErrorStreamCaptureInvalidated, "injected")
	}
	return d.Driver.MemcpyDtoDAsync(c, dst, src, n, s)
}

// A capture error makes the failing call look at every capture in progress (Manager.after) and end the
// invalidated ones. The stream of one of them may be destroyed by another thread meanwhile: neither the
// query nor the end may reach the driver with its handle once it is gone.
func TestCaptureRecoveryNeverNamesAStreamDestroyedMeanwhile(t *testing.T) {
	drv := &deadHandles{Driver: cudasim.New(), dead: map[cuda.Stream]bool{}}
	d, err := device.Open(drv, 0, "")
	require.NoError(t, err)
	m := New(d, Options{})
	t.Cleanup(func() {
		assert.NoError(t, m.Close())
		_ = d.Close()
	})
	src, err := drv.MemAlloc(d.Context(), 64)
	require.NoError(t, err)
	dst, err := drv.MemAlloc(d.Context(), 64)
	require.NoError(t, err)
	x, err := m.Create(true, 0)
	require.NoError(t, err)
	y, err := m.Create(true, 0)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, y.Destroy()) })
	require.NoError(t, x.BeginCapture(cuda.CaptureModeRelaxed))
	destroyed := make(chan error, 1)
	hook := func() {
		go func() { destroyed <- x.Destroy() }()
		select {
		case err := <-destroyed:
			destroyed <- err
		case <-time.After(50 * time.Millisecond):
		}
	}
	drv.onQuery.Store(&hook)
	drv.failCopy.Store(true)
	requireResult(t, cuda.ErrorStreamCaptureInvalidated, m.CopyDtoD(dst, src, 64, y))
	drv.failCopy.Store(false)
	require.NoError(t, <-destroyed)
	drv.mu.Lock()
	defer drv.mu.Unlock()
	assert.Empty(t, drv.stale, "driver calls made with a destroyed stream's handle")
	assert.True(t, drv.dead[x.Handle()], "the stream was destroyed")
}

// A stream closed during a capture that forbids its destroy on this thread is destroyed when the capture
// ends. Ordering another stream after it (a DLPack consumer naming its handle) is refused as for a closed
// stream, rather than reaching the driver while that destroy may run.
func TestOrderRefusesAWaiterClosedDuringACapture(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	e := newEnv(t)
	x, j, p := e.stream(t, true), e.stream(t, true), e.stream(t, true)
	require.NoError(t, x.BeginCapture(cuda.CaptureModeThreadLocal))
	require.NoError(t, j.Destroy()) // its destroy waits for the capture to end
	assert.True(t, e.m.Closed(j.Handle()), "closed to cudacore")
	assert.False(t, e.m.Destroyed(j.Handle()), "not yet destroyed at the driver")
	requireResult(t, cuda.ErrorClosed, e.m.Order("dlpack", j.Handle(), p.Handle()), "waiter closed")
	requireResult(t, cuda.ErrorClosed, e.m.Order("dlpack", p.Handle(), j.Handle()), "producer closed")
	g, err := x.EndCapture()
	require.NoError(t, err)
	require.NoError(t, g.Destroy())
	assert.True(t, e.m.Destroyed(j.Handle()), "destroyed once the capture ended")
	assert.True(t, e.m.Closed(j.Handle()))
	requireResult(t, cuda.ErrorClosed, e.m.Order("dlpack", j.Handle(), p.Handle()), "waiter destroyed")
}
