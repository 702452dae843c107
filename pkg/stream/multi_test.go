package stream

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
	"github.com/cudacore/cudacore/pkg/device"
)

// twoDevices is device 0 and 1 of one simulator, each with its Manager, sharing one capture registry
// as in a process.
func twoDevices(t *testing.T) (*Manager, *Manager, *cudasim.Driver) {
	t.Helper()
	drv := cudasim.New(cudasim.WithDevices(cudasim.DeviceConfig{TotalMemory: 1 << 30, MemoryPoolsSupported: true},
		cudasim.DeviceConfig{TotalMemory: 1 << 30, MemoryPoolsSupported: true}, cudasim.DeviceConfig{TotalMemory: 1 << 30, PeerGroup: 1}))
	ms := managersOn(t, drv, 3)
	return ms[0], ms[1], drv
}

// managersOn opens the first n devices of drv, each with its Manager, sharing one capture registry as in
// a process; the test's cleanup closes them.
func managersOn(t *testing.T, drv cuda.Driver, n int) []*Manager {
	t.Helper()
	reg := NewRegistry()
	var ms []*Manager
	for i := range n {
		d, err := device.Open(drv, i, "")
		require.NoError(t, err)
		m := New(d, Options{Registry: reg})
		t.Cleanup(func() {
			assert.NoError(t, m.Close())
			_ = d.Close()
		})
		ms = append(ms, m)
	}
	return ms
}

func TestCopyPeer(t *testing.T) {
	m0, m1, drv := twoDevices(t)
	d0, d1 := m0.Device(), m1.Device()
	src, err := drv.MemAlloc(d0.Context(), 4096)
	require.NoError(t, err)
	dst, err := drv.MemAlloc(d1.Context(), 4096)
	require.NoError(t, err)
	require.NoError(t, drv.MemcpyHtoD(d0.Context(), src, pattern(4096, 1)))

	require.NoError(t, m1.CopyPeer(dst, d1, src, d0, 4096, nil), "synchronous, on the destination's device")
	got := make([]byte, 4096)
	require.NoError(t, drv.MemcpyDtoH(d1.Context(), got, dst))
	assert.Equal(t, pattern(4096, 1), got)

	s0, err := m0.Create(true, 0)
	require.NoError(t, err)
	defer func() { assert.NoError(t, s0.Destroy()) }()
	require.NoError(t, drv.MemcpyHtoD(d1.Context(), dst, pattern(4096, 2)))
	require.NoError(t, m0.CopyPeer(src, d0, dst, d1, 100, s0), "on a stream of the source's device")
	require.NoError(t, s0.Synchronize())
	require.NoError(t, drv.MemcpyDtoH(d0.Context(), got, src))
	assert.Equal(t, pattern(4096, 2)[:100], got[:100])
	assert.Equal(t, pattern(4096, 1)[100:], got[100:])

	// A stream of a third device, a destroyed stream, a stream of the other manager: refused.
	m2Dev := &fakePeer{ctx: d1.Context(), ordinal: 2}
	err = m0.CopyPeer(dst, d1, src, m2Dev, 1, nil)
	requireResult(t, cuda.ErrorInvalidValue, err)
	assert.Contains(t, err.Error(), "use a stream of either")
	s1, err := m1.Create(true, 0)
	require.NoError(t, err)
	requireResult(t, cuda.ErrorInvalidValue, m0.CopyPeer(dst, d1, src, d0, 1, s1), "a stream of another manager")
	require.NoError(t, s1.Destroy())
	requireResult(t, cuda.ErrorClosed, m1.CopyPeer(dst, d1, src, d0, 1, s1))
	require.NoError(t, m1.CopyPeer(dst, d1, src, d0, 0, nil), "0 bytes is nothing to do")

	// A synchronous peer copy while a blocking stream of the device captures would use the legacy stream.
	sb, err := m1.Create(false, 0)
	require.NoError(t, err)
	defer func() { assert.NoError(t, sb.Destroy()) }()
	require.NoError(t, sb.BeginCapture(cuda.CaptureModeRelaxed))
	err = m1.CopyPeer(dst, d1, src, d0, 16, nil)
	requireResult(t, cuda.ErrorStreamCaptureImplicit, err)
	_, err = sb.EndCapture()
	require.NoError(t, err)
}

// A synchronous peer copy waits for the legacy stream (cuStreamSynchronize), an unsafe call: where a
// GLOBAL capture (anywhere) or a THREAD_LOCAL one of this thread forbids it, it is refused before the
// driver sees it, in either direction, and the capture goes on; a RELAXED capture allows it.
func TestSyncCopyPeerRefusedWhereACaptureForbidsUnsafeCalls(t *testing.T) {
	runtime.LockOSThread() // a capture's thread rules
	defer runtime.UnlockOSThread()
	m0, m1, drv := twoDevices(t)
	d0, d1 := m0.Device(), m1.Device()
	a, err := drv.MemAlloc(d0.Context(), 4096)
	require.NoError(t, err)
	b, err := drv.MemAlloc(d1.Context(), 4096)
	require.NoError(t, err)
	s, err := m0.Create(true, 0)
	require.NoError(t, err)
	defer func() { assert.NoError(t, s.Destroy()) }()
	for _, mode := range []cuda.CaptureMode{cuda.CaptureModeGlobal, cuda.CaptureModeThreadLocal} {
		require.NoError(t, s.BeginCapture(mode))
		err = m1.CopyPeer(b, d1, a, d0, 4096, nil)
		requireResult(t, cuda.ErrorStreamCaptureUnsupported, err, "to the other device")
		assert.Contains(t, err.Error(), "synchronous peer copy")
		require.NotNil(t, s.capturing(), "refused before the driver: the capture goes on")
		requireResult(t, cuda.ErrorStreamCaptureUnsupported, m0.CopyPeer(a, d0, b, d1, 4096, nil), "to the capturing device")
		requireResult(t, cuda.ErrorStreamCaptureUnsupported, m0.CopyPeer(a, d0, b, d1, 0, nil), "refused whatever its size")
		_, err = s.EndCapture()
		require.NoError(t, err)
	}
	require.NoError(t, s.BeginCapture(cuda.CaptureModeRelaxed))
	require.NoError(t, m1.CopyPeer(b, d1, a, d0, 4096, nil), "a RELAXED capture allows it")
	_, err = s.EndCapture()
	require.NoError(t, err)
}

type fakePeer struct {
	ctx     cuda.Context
	ordinal int
}

func (f *fakePeer) Context() cuda.Context { return f.ctx }
func (f *fakePeer) Ordinal() int          { return f.ordinal }

func TestWaitEventOfAnotherDevice(t *testing.T) {
	m0, m1, _ := twoDevices(t)
	e, err := m1.NewEvent(false)
	require.NoError(t, err)
	defer func() { assert.NoError(t, e.Destroy()) }()
	require.NoError(t, e.Record(m1.Legacy()))
	s0, err := m0.Create(true, 0)
	require.NoError(t, err)
	defer func() { assert.NoError(t, s0.Destroy()) }()
	require.NoError(t, s0.WaitEvent(e), "a stream waits on an event of another device of the driver")

	other := newEnv(t) // another driver altogether
	foreign, err := other.m.NewEvent(false)
	require.NoError(t, err)
	defer func() { assert.NoError(t, foreign.Destroy()) }()
	requireResult(t, cuda.ErrorInvalidValue, s0.WaitEvent(foreign))
}

func TestInterprocessEvents(t *testing.T) {
	m0, _, _ := twoDevices(t)
	e, err := m0.NewInterprocessEvent()
	require.NoError(t, err)
	defer func() { assert.NoError(t, e.Destroy()) }()
	assert.True(t, e.Interprocess())
	assert.False(t, e.Timing())
	h, err := e.IpcHandle()
	require.NoError(t, err)
	assert.NotEqual(t, cuda.IpcHandle{}, h)
	_, err = m0.OpenEvent(h)
	requireResult(t, cuda.ErrorInvalidContext, err, "a process cannot open its own event")

	plain, err := m0.NewEvent(false)
	require.NoError(t, err)
	_, err = plain.IpcHandle()
	requireResult(t, cuda.ErrorInvalidValue, err)
	require.NoError(t, plain.Destroy())
	require.NoError(t, e.Destroy())
	_, err = e.IpcHandle()
	requireResult(t, cuda.ErrorClosed, err)
}
