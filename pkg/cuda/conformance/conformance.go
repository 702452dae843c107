// Package conformance is the one behaviour suite that every cuda.Driver must pass: the real driver
// (package libcuda) and the simulator (package cudasim) alike. It asserts what was measured on a real
// H100 (docs/contributing/driver-facts.md) and what the driver documents, so that a difference between the
// backends shows up as a failure here: on the simulator it is a simulator bug.
//
// The suite owns nothing beyond a test: each subtest takes a fresh Driver from the caller, retains the
// primary context of device 0 and releases it at the end.
package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// H100 figures from docs/contributing/driver-facts.md, asserted exactly only on that device.
const (
	h100Total       = 85017493504
	h100ClampedHeap = 17681179680
)

type env struct {
	drv   cuda.Driver
	dev   cuda.Device
	ctx   cuda.Context
	pools bool
	h100  bool
	total uint64
}

func setup(t *testing.T, newDriver func(t *testing.T) cuda.Driver) *env {
	t.Helper()
	d := newDriver(t)
	require.NoError(t, d.Init())
	n, err := d.DeviceCount()
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, 1)
	dev, err := d.DeviceGet(0)
	require.NoError(t, err)
	ctx, err := d.PrimaryCtxRetain(dev)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, d.PrimaryCtxRelease(dev)) })
	pools, err := d.DeviceAttribute(dev, cuda.AttrMemoryPoolsSupported)
	require.NoError(t, err)
	name, err := d.DeviceName(dev)
	require.NoError(t, err)
	total, err := d.DeviceTotalMem(dev)
	require.NoError(t, err)
	return &env{drv: d, dev: dev, ctx: ctx, pools: pools == 1, total: total,
		h100: strings.Contains(name, "H100 80GB") && total == h100Total}
}

// assertResult checks that err carries want, and that a failure is a *cuda.Error as the contract says.
func assertResult(t *testing.T, want cuda.Result, err error, step string) bool {
	t.Helper()
	if err != nil {
		var ce *cuda.Error
		assert.True(t, errors.As(err, &ce), "%s: %v is not a *cuda.Error", step, err)
	}
	return assert.Equal(t, want, cuda.ResultOf(err), "%s: got %v", step, err)
}

// mem allocates n bytes of device memory, freed when the test ends.
func (e *env) mem(t *testing.T, n uint64) cuda.DevicePtr {
	t.Helper()
	p, err := e.drv.MemAlloc(e.ctx, n)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, e.drv.MemFree(e.ctx, p)) })
	return p
}

// host allocates n bytes of pinned host memory, freed when the test ends.
func (e *env) host(t *testing.T, n uint64) []byte {
	t.Helper()
	b, err := e.drv.MemHostAlloc(e.ctx, n, 0)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, e.drv.MemFreeHost(e.ctx, b)) })
	return b
}

// stream creates a stream with flags, destroyed when the test ends.
func (e *env) stream(t *testing.T, flags uint32) cuda.Stream {
	t.Helper()
	s, err := e.drv.StreamCreate(e.ctx, flags, 0)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, e.drv.StreamDestroy(e.ctx, s)) })
	return s
}

// event creates an event without timing, destroyed when the test ends.
func (e *env) event(t *testing.T) cuda.Event {
	t.Helper()
	ev, err := e.drv.EventCreate(e.ctx, cuda.EventDisableTiming)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, e.drv.EventDestroy(e.ctx, ev)) })
	return ev
}

// captureStatus is cuStreamIsCapturing of s, which must succeed.
func (e *env) captureStatus(t *testing.T, s cuda.Stream) cuda.CaptureStatus {
	t.Helper()
	st, err := e.drv.StreamIsCapturing(e.ctx, s)
	require.NoError(t, err)
	return st
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31) ^ seed
	}
	return b
}

// Run runs the suite. newDriver returns a Driver that is not yet initialized; it may return the same
// process-wide driver each time.
func Run(t *testing.T, newDriver func(t *testing.T) cuda.Driver) {
	t.Run("Init", func(t *testing.T) {
		d := newDriver(t)
		require.NoError(t, d.Init())
		require.NoError(t, d.Init(), "cuInit is idempotent")
		v, err := d.Version()
		require.NoError(t, err)
		assert.GreaterOrEqual(t, v, 1000)
	})
	t.Run("Devices", func(t *testing.T) { testDevices(t, setup(t, newDriver)) })
	t.Run("MemGetInfo", func(t *testing.T) {
		e := setup(t, newDriver)
		free, total, err := e.drv.MemGetInfo(e.ctx)
		require.NoError(t, err)
		assert.LessOrEqual(t, free, total)
		assert.Greater(t, free, uint64(0))
		dt, err := e.drv.DeviceTotalMem(e.dev)
		require.NoError(t, err)
		assert.Equal(t, dt, total)
	})
	t.Run("AllocCopySync", func(t *testing.T) { testAllocCopySync(t, setup(t, newDriver)) })
	t.Run("CopyAsync", func(t *testing.T) { testCopyAsync(t, setup(t, newDriver)) })
	t.Run("Pinned", func(t *testing.T) { testPinned(t, setup(t, newDriver)) })
	t.Run("OutOfMemory", func(t *testing.T) { testOOM(t, setup(t, newDriver)) })
	t.Run("PoolTrimAfterSync", func(t *testing.T) { testPoolTrim(t, setup(t, newDriver)) })
	for _, m := range []struct {
		name string
		mode cuda.CaptureMode
	}{{"Global", cuda.CaptureModeGlobal}, {"ThreadLocal", cuda.CaptureModeThreadLocal}, {"Relaxed", cuda.CaptureModeRelaxed}} {
		t.Run("CaptureTable/"+m.name, func(t *testing.T) { testCaptureTable(t, setup(t, newDriver), m.mode) })
	}
	for _, m := range []struct {
		name string
		mode cuda.CaptureMode
	}{{"Global", cuda.CaptureModeGlobal}, {"ThreadLocal", cuda.CaptureModeThreadLocal}, {"Relaxed", cuda.CaptureModeRelaxed}} {
		t.Run("CaptureGraphDestroy/"+m.name, func(t *testing.T) { testCaptureGraphDestroy(t, setup(t, newDriver), m.mode) })
		t.Run("CaptureOutsidePoolCalls/"+m.name, func(t *testing.T) { testCaptureOutsidePoolCalls(t, setup(t, newDriver), m.mode) })
	}
	t.Run("CaptureLegacyRejected", func(t *testing.T) {
		e := setup(t, newDriver)
		for _, s := range []cuda.Stream{0, cuda.StreamLegacy} {
			assertResult(t, cuda.ErrorStreamCaptureUnsupported, e.drv.StreamBeginCapture(e.ctx, s, cuda.CaptureModeThreadLocal), "begin capture on the legacy stream")
			st, err := e.drv.StreamIsCapturing(e.ctx, s)
			assert.NoError(t, err)
			assert.Equal(t, cuda.CaptureStatusNone, st)
		}
	})
	t.Run("CaptureReplay", func(t *testing.T) { testCaptureReplay(t, setup(t, newDriver)) })
	t.Run("CaptureJoin", func(t *testing.T) { testCaptureJoin(t, setup(t, newDriver)) })
	t.Run("GraphMemoryLifetime", func(t *testing.T) { testGraphMemory(t, setup(t, newDriver)) })
	t.Run("GraphMemoryUpdate", func(t *testing.T) { testGraphMemoryUpdate(t, setup(t, newDriver)) })
	t.Run("ManagedPrefetchAdvise", func(t *testing.T) { testManaged(t, setup(t, newDriver)) })
	t.Run("CaptureQueries", func(t *testing.T) { testCaptureQueries(t, setup(t, newDriver)) })
	t.Run("Limits", func(t *testing.T) { testLimits(t, setup(t, newDriver)) })
	t.Run("InvalidHandles", func(t *testing.T) { testInvalidHandles(t, setup(t, newDriver)) })
	runMulti(t, newDriver)
	runPools(t, newDriver)
}

func testDevices(t *testing.T, e *env) {
	d := e.drv
	n, err := d.DeviceCount()
	require.NoError(t, err)
	for _, bad := range []int{-1, n} {
		_, err := d.DeviceGet(bad)
		assertResult(t, cuda.ErrorInvalidDevice, err, "DeviceGet out of range")
		assert.ErrorIs(t, err, cuda.ErrInvalidDevice)
	}
	for i := 0; i < n; i++ {
		dev, err := d.DeviceGet(i)
		require.NoError(t, err)
		name, err := d.DeviceName(dev)
		require.NoError(t, err)
		assert.NotEmpty(t, name)
		uuid, err := d.DeviceUUID(dev)
		require.NoError(t, err)
		assert.NotEqual(t, [16]byte{}, uuid)
		bus, err := d.DevicePCIBusID(dev)
		require.NoError(t, err)
		assert.Regexp(t, `^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$`, bus)
		attr := func(a cuda.DeviceAttribute) int {
			v, err := d.DeviceAttribute(dev, a)
			require.NoError(t, err, "attribute %d", a)
			return v
		}
		assert.GreaterOrEqual(t, attr(cuda.AttrComputeCapabilityMajor), 1)
		assert.GreaterOrEqual(t, attr(cuda.AttrComputeCapabilityMinor), 0)
		assert.GreaterOrEqual(t, attr(cuda.AttrMultiprocessorCount), 1)
		assert.Equal(t, 32, attr(cuda.AttrWarpSize))
		assert.GreaterOrEqual(t, attr(cuda.AttrMaxThreadsPerBlock), 512)
		for _, a := range []cuda.DeviceAttribute{cuda.AttrMemoryPoolsSupported, cuda.AttrTCCDriver, cuda.AttrManagedMemory, cuda.AttrIntegrated} {
			assert.Contains(t, []int{0, 1}, attr(a), "attribute %d is a flag", a)
		}
		total, err := d.DeviceTotalMem(dev)
		require.NoError(t, err)
		assert.Greater(t, total, uint64(0))
		if strings.Contains(name, "H100 80GB") && total == h100Total {
			assert.Equal(t, 9, attr(cuda.AttrComputeCapabilityMajor))
			assert.Equal(t, 132, attr(cuda.AttrMultiprocessorCount))
			assert.Equal(t, 1, attr(cuda.AttrMemoryPoolsSupported))
			assert.Equal(t, 1, attr(cuda.AttrManagedMemory))
			assert.Equal(t, 1, attr(cuda.AttrHostRegisterSupported))
		}
	}
}

func testAllocCopySync(t *testing.T, e *env) {
	d, c := e.drv, e.ctx
	for _, n := range []int{1, 1000, 1 << 20} {
		p, err := d.MemAlloc(c, uint64(n))
		require.NoError(t, err)
		src := pattern(n, 7)
		require.NoError(t, d.MemcpyHtoD(c, p, src))
		q, err := d.MemAlloc(c, uint64(n))
		require.NoError(t, err)
		require.NoError(t, d.MemcpyDtoD(c, q, p, uint64(n)))
		got := make([]byte, n)
		require.NoError(t, d.MemcpyDtoH(c, got, q))
		assert.True(t, bytes.Equal(src, got), "round trip of %d bytes", n)
		require.NoError(t, d.MemFree(c, p))
		require.NoError(t, d.MemFree(c, q))
	}
	_, err := d.MemAlloc(c, 0)
	assertResult(t, cuda.ErrorInvalidValue, err, "MemAlloc of 0 bytes")
	// A pointer inside an allocation is a valid copy target.
	p, err := d.MemAlloc(c, 4096)
	require.NoError(t, err)
	require.NoError(t, d.MemcpyHtoD(c, p+1024, pattern(16, 1)))
	got := make([]byte, 16)
	require.NoError(t, d.MemcpyDtoH(c, got, p+1024))
	assert.Equal(t, pattern(16, 1), got)
	require.NoError(t, d.MemFree(c, p))
}

func testCopyAsync(t *testing.T, e *env) {
	d, c := e.drv, e.ctx
	s := e.stream(t, cuda.StreamNonBlocking)
	const n = 1 << 20
	p := e.mem(t, n)
	src := pattern(n, 3)
	got := make([]byte, n)
	require.NoError(t, d.MemcpyHtoDAsync(c, p, src, s))
	require.NoError(t, d.MemsetD8Async(c, p+10, 0xAB, 5, s))
	require.NoError(t, d.MemcpyDtoHAsync(c, got, p, s))
	require.NoError(t, d.StreamSynchronize(c, s))
	want := append([]byte(nil), src...)
	for i := 10; i < 15; i++ {
		want[i] = 0xAB
	}
	assert.True(t, bytes.Equal(want, got), "async round trip with a memset")
	assert.NoError(t, d.StreamQuery(c, s))

	// Events on the same stream measure a non-negative time.
	a, err := d.EventCreate(c, cuda.EventDefault)
	require.NoError(t, err)
	b, err := d.EventCreate(c, cuda.EventDefault)
	require.NoError(t, err)
	require.NoError(t, d.EventRecord(c, a, s))
	require.NoError(t, d.MemcpyHtoDAsync(c, p, src, s))
	require.NoError(t, d.EventRecord(c, b, s))
	require.NoError(t, d.EventSynchronize(c, b))
	assert.NoError(t, d.EventQuery(c, b))
	ms, err := d.EventElapsedTime(c, a, b)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, ms, float32(0))
	require.NoError(t, d.StreamWaitEvent(c, s, b))
	require.NoError(t, d.EventDestroy(c, a))
	require.NoError(t, d.EventDestroy(c, b))

	least, greatest, err := d.CtxStreamPriorityRange(c)
	require.NoError(t, err)
	assert.LessOrEqual(t, greatest, least)
}

func testPinned(t *testing.T, e *env) {
	d, c := e.drv, e.ctx
	const n = 1 << 20
	h, err := d.MemHostAlloc(c, n, 0)
	require.NoError(t, err)
	require.Len(t, h, n)
	out, err := d.MemHostAlloc(c, n, cuda.HostAllocPortable)
	require.NoError(t, err)
	copy(h, pattern(n, 9))
	p, err := d.MemAlloc(c, n)
	require.NoError(t, err)
	s, err := d.StreamCreate(c, cuda.StreamNonBlocking, 0)
	require.NoError(t, err)
	require.NoError(t, d.MemcpyHtoDAsync(c, p, h, s))
	require.NoError(t, d.MemcpyDtoHAsync(c, out, p, s))
	require.NoError(t, d.StreamSynchronize(c, s))
	assert.True(t, bytes.Equal(h, out), "pinned round trip")
	require.NoError(t, d.StreamDestroy(c, s))
	require.NoError(t, d.MemFree(c, p))
	require.NoError(t, d.MemFreeHost(c, h))
	require.NoError(t, d.MemFreeHost(c, out))
}

func testOOM(t *testing.T, e *env) {
	d, c := e.drv, e.ctx
	_, err := d.MemAlloc(c, 1<<40)
	assertResult(t, cuda.ErrorOutOfMemory, err, "MemAlloc of 1 TiB")
	assert.ErrorIs(t, err, cuda.ErrOutOfMemory)
	p, err := d.MemAlloc(c, 1<<20)
	require.NoError(t, err, "the process goes on after an OOM")
	require.NoError(t, d.MemFree(c, p))
	if !e.pools {
		return
	}
	s := e.stream(t, cuda.StreamNonBlocking)
	_, err = d.MemAllocAsync(c, 1<<40, s)
	assertResult(t, cuda.ErrorOutOfMemory, err, "MemAllocAsync of 1 TiB")
	assert.NoError(t, d.StreamSynchronize(c, s), "the stream is not poisoned")
	q, err := d.MemAllocAsync(c, 1<<20, s)
	require.NoError(t, err)
	require.NoError(t, d.MemFreeAsync(c, q, s))
	assert.NoError(t, d.StreamSynchronize(c, s))
}

// testPoolTrim: memory freed with cuMemFreeAsync into a pool with the release threshold at its maximum
// stays reserved, and after a synchronize cuMemPoolTrimTo(0) gives all of it back. (On the H100, a trim
// without the synchronize returned nothing of 70 GiB just freed; the simulator asserts that strictly in
// its own tests, as the real driver's timing is not something to assert.)
func testPoolTrim(t *testing.T, e *env) {
	if !e.pools {
		t.Skip("no memory pools on this device")
	}
	d, c := e.drv, e.ctx
	pool, err := d.MemPoolCreate(c, cuda.PoolProps{Device: e.dev})
	require.NoError(t, err)
	defer func() { assert.NoError(t, d.MemPoolDestroy(c, pool)) }()
	require.NoError(t, d.MemPoolSetAttribute(c, pool, cuda.PoolAttrReleaseThreshold, ^uint64(0)))
	s := e.stream(t, cuda.StreamNonBlocking)
	const size = 256 << 20
	p, err := d.MemAllocFromPoolAsync(c, size, pool, s)
	require.NoError(t, err)
	require.NoError(t, d.MemFreeAsync(c, p, s))
	require.NoError(t, d.StreamSynchronize(c, s))
	reserved, err := d.MemPoolGetAttribute(c, pool, cuda.PoolAttrReservedMemCurrent)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, reserved, uint64(size), "with the threshold at max the pool keeps its memory")
	require.NoError(t, d.MemPoolTrimTo(c, pool, 0))
	reserved, err = d.MemPoolGetAttribute(c, pool, cuda.PoolAttrReservedMemCurrent)
	require.NoError(t, err)
	assert.Zero(t, reserved, "after a synchronize the trim gives everything back")
}

// testCaptureTable runs the capture sequence of docs/contributing/driver-facts.md step by step, on a blocking stream.
func testCaptureTable(t *testing.T, e *env, mode cuda.CaptureMode) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d, c := e.drv, e.ctx
	relaxed := mode == cuda.CaptureModeRelaxed
	const n = 4096
	s := e.stream(t, cuda.StreamDefault)
	other := e.stream(t, cuda.StreamNonBlocking)
	buf := e.mem(t, n)
	pinned := e.host(t, n)
	pageable := make([]byte, n)

	require.NoError(t, d.StreamBeginCapture(c, s, mode))
	st, err := d.StreamIsCapturing(c, s)
	require.NoError(t, err)
	assert.Equal(t, cuda.CaptureStatusActive, st)

	assertResult(t, cuda.Success, d.MemcpyHtoDAsync(c, buf, pinned, s), "HtoDAsync from pinned memory")
	assertResult(t, cuda.Success, d.MemcpyHtoDAsync(c, buf, pageable, s), "HtoDAsync from pageable memory")
	assertResult(t, cuda.ErrorStreamCaptureImplicit, d.MemcpyDtoH(c, pageable, buf), "synchronous MemcpyDtoH")
	st, err = d.StreamIsCapturing(c, s)
	require.NoError(t, err)
	assert.Equal(t, cuda.CaptureStatusInvalidated, st)

	p, err := d.MemAlloc(c, 1<<20)
	if relaxed {
		assertResult(t, cuda.Success, err, "MemAlloc during a relaxed capture")
		defer func() { assert.NoError(t, d.MemFree(c, p)) }()
	} else {
		assertResult(t, cuda.ErrorStreamCaptureUnsupported, err, "MemAlloc during capture")
	}
	if e.pools {
		_, err = d.MemAllocAsync(c, 1<<20, s)
		assertResult(t, cuda.ErrorStreamCaptureInvalidated, err, "MemAllocAsync on the invalidated capturing stream")
	}
	if relaxed {
		assertResult(t, cuda.Success, d.StreamSynchronize(c, other), "synchronize another stream")
	} else {
		assertResult(t, cuda.ErrorStreamCaptureUnsupported, d.StreamSynchronize(c, other), "synchronize another stream")
	}
	g, err := d.StreamEndCapture(c, s)
	assertResult(t, cuda.ErrorStreamCaptureInvalidated, err, "EndCapture of an invalidated capture")
	assert.Zero(t, g, "no graph")
	assertResult(t, cuda.Success, d.CtxSynchronize(c), "CtxSynchronize afterwards")

	// The stream works again.
	st, err = d.StreamIsCapturing(c, s)
	require.NoError(t, err)
	assert.Equal(t, cuda.CaptureStatusNone, st)
	assert.NoError(t, d.MemcpyHtoDAsync(c, buf, pinned, s))
	assert.NoError(t, d.StreamSynchronize(c, s))
	assertResult(t, cuda.ErrorIllegalState, func() error { _, err := d.StreamEndCapture(c, s); return err }(), "EndCapture of a stream not capturing")
}

// testCaptureGraphDestroy checks that destroying an executable graph (cuGraphExecDestroy), and
// instantiating one (cuGraphInstantiate), while a stream captures are unsafe calls, as a synchronous
// allocation is: 900 and the capture invalidated where the
// mode forbids unsafe calls (GLOBAL: from any thread; THREAD_LOCAL: from the capturing thread), and legal
// otherwise (RELAXED; THREAD_LOCAL from another thread). A refused destroy destroys nothing: it succeeds
// once the capture has ended. Destroying a graph (cuGraphDestroy) is legal in every mode, and the capture
// goes on. cudacore defers its executable-graph destroys accordingly.
func testCaptureGraphDestroy(t *testing.T, e *env, mode cuda.CaptureMode) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d, c := e.drv, e.ctx
	const n = 4096
	s := e.stream(t, cuda.StreamNonBlocking)
	buf := e.mem(t, n)
	pinned := e.host(t, n)

	// graph captures one copy outside any other capture and instantiates it.
	graph := func() (cuda.Graph, cuda.GraphExec) {
		require.NoError(t, d.StreamBeginCapture(c, s, cuda.CaptureModeThreadLocal))
		require.NoError(t, d.MemcpyHtoDAsync(c, buf, pinned, s))
		g, err := d.StreamEndCapture(c, s)
		require.NoError(t, err)
		x, err := d.GraphInstantiate(c, g)
		require.NoError(t, err)
		return g, x
	}
	// during runs destroy while s captures in mode (on this thread, or on another one), then ends the
	// capture; it returns destroy's error and whether the capture survived it.
	during := func(destroy func() error, otherThread bool) (error, bool) {
		require.NoError(t, d.StreamBeginCapture(c, s, mode))
		require.NoError(t, d.MemcpyHtoDAsync(c, buf, pinned, s))
		var callErr error
		if otherThread {
			done := make(chan struct{})
			go func() {
				runtime.LockOSThread() // the main goroutine's thread is locked: this runs on another one
				defer runtime.UnlockOSThread()
				defer close(done)
				callErr = destroy()
			}()
			<-done
		} else {
			callErr = destroy()
		}
		g, err := d.StreamEndCapture(c, s)
		if err == nil {
			assert.NoError(t, d.GraphDestroy(c, g))
			return callErr, true
		}
		assertResult(t, cuda.ErrorStreamCaptureInvalidated, err, "end of an invalidated capture")
		assert.Zero(t, g, "no graph")
		return callErr, false
	}
	for _, otherThread := range []bool{false, true} {
		forbidden := mode == cuda.CaptureModeGlobal || (mode == cuda.CaptureModeThreadLocal && !otherThread)
		where := map[bool]string{false: "on the capturing thread", true: "on another thread"}[otherThread]
		want := cuda.Success
		if forbidden {
			want = cuda.ErrorStreamCaptureUnsupported
		}

		g, x := graph()
		err, survived := during(func() error { return d.GraphExecDestroy(c, x) }, otherThread)
		assertResult(t, want, err, "cuGraphExecDestroy during capture "+where)
		assert.Equal(t, !forbidden, survived, "cuGraphExecDestroy %s: the capture survives only where the call is allowed", where)
		if forbidden {
			assert.NoError(t, d.GraphExecDestroy(c, x), "the refused cuGraphExecDestroy, again after the capture")
		}
		assert.NoError(t, d.GraphDestroy(c, g))

		g, x = graph()
		require.NoError(t, d.GraphExecDestroy(c, x))
		err, survived = during(func() error { return d.GraphDestroy(c, g) }, otherThread)
		assertResult(t, cuda.Success, err, "cuGraphDestroy during capture "+where)
		assert.True(t, survived, "cuGraphDestroy %s: the capture survives", where)

		// Instantiating a graph is an unsafe call by the same rules (the GPU fuzzer met 900 for a first
		// launch during a THREAD_LOCAL capture of the launching thread, and the capture was gone).
		g, x = graph()
		require.NoError(t, d.GraphExecDestroy(c, x))
		var x2 cuda.GraphExec
		err, survived = during(func() (err error) { x2, err = d.GraphInstantiate(c, g); return err }, otherThread)
		assertResult(t, want, err, "cuGraphInstantiate during capture "+where)
		assert.Equal(t, !forbidden, survived, "cuGraphInstantiate %s: the capture survives only where the call is allowed", where)
		if !forbidden {
			assert.NoError(t, d.GraphExecDestroy(c, x2))
		}
		assert.NoError(t, d.GraphDestroy(c, g))
	}
}

// testCaptureOutsidePoolCalls checks that a stream-ordered allocation or free on a stream outside the
// capture (another stream, the legacy stream, the per-thread default stream; the device's default pool or
// a pool of its own) is an unsafe call: 900 and the capture invalidated where the mode forbids unsafe
// calls (GLOBAL: from any thread; THREAD_LOCAL: from the capturing thread), legal otherwise. cudacore
// therefore refuses such allocations before the driver and keeps such frees until the captures end.
func testCaptureOutsidePoolCalls(t *testing.T, e *env, mode cuda.CaptureMode) {
	if !e.pools {
		t.Skip("no memory pools on this device")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d, c := e.drv, e.ctx
	const n = 1 << 20
	s := e.stream(t, cuda.StreamNonBlocking) // captures
	u := e.stream(t, cuda.StreamNonBlocking) // does not
	own, err := d.MemPoolCreate(c, cuda.PoolProps{Device: e.dev})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, d.MemPoolDestroy(c, own)) })

	var block cuda.DevicePtr // what cuMemFreeAsync frees: allocated on u before the capture
	calls := map[string]func(h cuda.Stream) (cuda.DevicePtr, error){
		"cuMemAllocAsync":         func(h cuda.Stream) (cuda.DevicePtr, error) { return d.MemAllocAsync(c, n, h) },
		"cuMemAllocFromPoolAsync": func(h cuda.Stream) (cuda.DevicePtr, error) { return d.MemAllocFromPoolAsync(c, n, own, h) },
		"cuMemFreeAsync":          func(h cuda.Stream) (cuda.DevicePtr, error) { return 0, d.MemFreeAsync(c, block, h) },
	}
	// onThread runs fn on this thread, or on another one.
	onThread := func(other bool, fn func()) {
		if !other {
			fn()
			return
		}
		done := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			defer close(done)
			fn()
		}()
		<-done
	}
	for _, name := range []string{"cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemFreeAsync"} {
		call := calls[name]
		for _, h := range []cuda.Stream{u, cuda.StreamLegacy, cuda.StreamPerThread} {
			for _, other := range []bool{false, true} {
				forbidden := mode == cuda.CaptureModeGlobal || (mode == cuda.CaptureModeThreadLocal && !other)
				step := fmt.Sprintf("%s on stream %#x, on another thread: %v", name, uint64(h), other)
				block = 0
				if name == "cuMemFreeAsync" {
					p, err := d.MemAllocFromPoolAsync(c, n, own, u)
					require.NoError(t, err)
					require.NoError(t, d.StreamSynchronize(c, u))
					block = p
				}
				require.NoError(t, d.StreamBeginCapture(c, s, mode))
				var p cuda.DevicePtr
				var callErr error
				onThread(other, func() { p, callErr = call(h) })
				g, endErr := d.StreamEndCapture(c, s)
				if forbidden {
					assertResult(t, cuda.ErrorStreamCaptureUnsupported, callErr, step)
					assertResult(t, cuda.ErrorStreamCaptureInvalidated, endErr, step+": the capture's end")
				} else {
					assertResult(t, cuda.Success, callErr, step)
					assertResult(t, cuda.Success, endErr, step+": the capture's end")
				}
				if endErr == nil {
					assert.NoError(t, d.GraphDestroy(c, g))
				}
				if p != 0 {
					assert.NoError(t, d.MemFreeAsync(c, p, u))
				}
				if block != 0 && callErr != nil {
					assert.NoError(t, d.MemFreeAsync(c, block, u), "the refused free, again after the capture")
				}
				require.NoError(t, d.CtxSynchronize(c))
			}
		}
	}
}

// testCaptureReplay captures pinned H2D, D2D and D2H copies and replays them with fresh host data.
func testCaptureReplay(t *testing.T, e *env) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d, c := e.drv, e.ctx
	const n = 64 << 10
	s := e.stream(t, cuda.StreamNonBlocking)
	in := e.host(t, n)
	out := e.host(t, n)
	a := e.mem(t, n)
	b := e.mem(t, n)

	copy(in, pattern(n, 0x11))
	for i := range out {
		out[i] = 0xEE
	}
	require.NoError(t, d.StreamBeginCapture(c, s, cuda.CaptureModeThreadLocal))
	require.NoError(t, d.MemcpyHtoDAsync(c, a, in, s))
	require.NoError(t, d.MemcpyDtoDAsync(c, b, a, n, s))
	require.NoError(t, d.MemcpyDtoHAsync(c, out, b, s))
	g, err := d.StreamEndCapture(c, s)
	require.NoError(t, err)
	require.NotZero(t, g)
	defer func() { assert.NoError(t, d.GraphDestroy(c, g)) }()
	cnt, err := d.GraphNodeCount(c, g)
	require.NoError(t, err)
	assert.Equal(t, 3, cnt)
	assert.Equal(t, bytes.Repeat([]byte{0xEE}, n), out, "captured copies do not run during capture")
	dot := filepath.Join(t.TempDir(), "graph.dot")
	if err := d.GraphDebugDot(c, g, dot, true); !errors.Is(err, cuda.ErrNotSupported) { // CUDA 11.3
		require.NoError(t, err)
		text, err := os.ReadFile(dot)
		require.NoError(t, err)
		assert.True(t, bytes.HasPrefix(bytes.TrimSpace(text), []byte("digraph")), "a DOT graph: %.200s", text)
	}
	assert.Error(t, d.GraphDebugDot(c, g, filepath.Join(t.TempDir(), "no", "folder", "graph.dot"), false),
		"a file the driver cannot create is an error")

	x, err := d.GraphInstantiate(c, g)
	require.NoError(t, err)
	defer func() { assert.NoError(t, d.GraphExecDestroy(c, x)) }()
	require.NoError(t, d.GraphUpload(c, x, s))
	for round := byte(0); round < 3; round++ {
		copy(in, pattern(n, 0x40+round))
		require.NoError(t, d.GraphLaunch(c, x, s))
		require.NoError(t, d.StreamSynchronize(c, s))
		assert.True(t, bytes.Equal(pattern(n, 0x40+round), out), "replay %d moves the host data of that launch", round)
	}
	// Updating with an identical capture keeps the topology.
	require.NoError(t, d.StreamBeginCapture(c, s, cuda.CaptureModeThreadLocal))
	require.NoError(t, d.MemcpyHtoDAsync(c, a, in, s))
	require.NoError(t, d.MemcpyDtoDAsync(c, b, a, n, s))
	require.NoError(t, d.MemcpyDtoHAsync(c, out, b, s))
	g2, err := d.StreamEndCapture(c, s)
	require.NoError(t, err)
	assert.NoError(t, d.GraphExecUpdate(c, x, g2))
	assert.NoError(t, d.GraphDestroy(c, g2))

	// A graph is never launched on a capturing stream: 900 in every mode, and the capture is invalidated.
	for _, mode := range []cuda.CaptureMode{cuda.CaptureModeGlobal, cuda.CaptureModeThreadLocal, cuda.CaptureModeRelaxed} {
		require.NoError(t, d.StreamBeginCapture(c, s, mode))
		assertResult(t, cuda.ErrorStreamCaptureUnsupported, d.GraphLaunch(c, x, s), "GraphLaunch on a capturing stream")
		_, err = d.StreamEndCapture(c, s)
		assertResult(t, cuda.ErrorStreamCaptureInvalidated, err, "EndCapture after a graph launch into the capture")
	}
	require.NoError(t, d.StreamSynchronize(c, s), "the stream works again")
}

// testCaptureJoin checks capture across streams: a stream that waits on an event recorded in a capture
// joins it (its work goes into the same graph), the capture ends only on the stream that began it, and
// only once every joined stream's work was joined back to that stream. Where the outcome after an error
// is not asserted exactly, the streams are only brought back to work.
func testCaptureJoin(t *testing.T, e *env) {
	d, c := e.drv, e.ctx
	const n = 4096
	a, b, in, out := e.mem(t, n), e.mem(t, n), e.host(t, n), e.host(t, n)
	// fork begins a THREAD_LOCAL capture on a new stream s, runs before on it, and joins a new stream j to
	// it through an event recorded there. The calling goroutine stays on its thread until the test ends,
	// since the capture must end there (a subtest runs on a goroutine of its own).
	fork := func(t *testing.T, before func(s cuda.Stream)) (s, j cuda.Stream) {
		runtime.LockOSThread()
		t.Cleanup(runtime.UnlockOSThread)
		s, j, ev := e.stream(t, cuda.StreamNonBlocking), e.stream(t, cuda.StreamNonBlocking), e.event(t)
		require.NoError(t, d.StreamBeginCapture(c, s, cuda.CaptureModeThreadLocal))
		if before != nil {
			before(s)
		}
		require.NoError(t, d.EventRecord(c, ev, s))
		require.NoError(t, d.StreamWaitEvent(c, j, ev))
		return s, j
	}

	t.Run("fork and join", func(t *testing.T) {
		s, j := fork(t, func(s cuda.Stream) { require.NoError(t, d.MemcpyHtoDAsync(c, a, in, s)) })
		join := e.event(t)
		assert.Equal(t, cuda.CaptureStatusActive, e.captureStatus(t, j), "waiting on a captured event joins the capture")
		require.NoError(t, d.MemcpyDtoDAsync(c, b, a, n, j))
		require.NoError(t, d.EventRecord(c, join, j))
		require.NoError(t, d.StreamWaitEvent(c, s, join))
		require.NoError(t, d.MemcpyDtoHAsync(c, out, b, s))
		g, err := d.StreamEndCapture(c, s)
		require.NoError(t, err)
		defer func() { assert.NoError(t, d.GraphDestroy(c, g)) }()
		assert.Equal(t, cuda.CaptureStatusNone, e.captureStatus(t, j), "ending the capture takes the joined stream out too")
		cnt, err := d.GraphNodeCount(c, g)
		require.NoError(t, err)
		assert.Equal(t, 3, cnt, "the joined stream's copy is in the graph; events make edges, not nodes")
		x, err := d.GraphInstantiate(c, g)
		require.NoError(t, err)
		defer func() { assert.NoError(t, d.GraphExecDestroy(c, x)) }()
		copy(in, pattern(n, 0x5C))
		require.NoError(t, d.GraphLaunch(c, x, s))
		require.NoError(t, d.StreamSynchronize(c, s))
		assert.Equal(t, pattern(n, 0x5C), []byte(out[:n]), "the work of both streams ran, in order")
	})
	t.Run("unjoined work fails the capture", func(t *testing.T) {
		s, j := fork(t, nil)
		require.NoError(t, d.MemsetD8Async(c, a, 1, n, j))
		_, err := d.StreamEndCapture(c, s)
		assertResult(t, cuda.ErrorStreamCaptureUnjoined, err, "EndCapture with a joined stream's work not joined back")
		assert.Equal(t, cuda.CaptureStatusNone, e.captureStatus(t, s))
		assert.Equal(t, cuda.CaptureStatusNone, e.captureStatus(t, j))
		require.NoError(t, d.StreamSynchronize(c, j), "the joined stream works again")
	})
	t.Run("only the origin ends the capture", func(t *testing.T) {
		s, j := fork(t, nil)
		_, err := d.StreamEndCapture(c, j)
		assertResult(t, cuda.ErrorStreamCaptureUnmatched, err, "EndCapture on a joined stream")
		if g, err := d.StreamEndCapture(c, s); err == nil {
			assert.NoError(t, d.GraphDestroy(c, g))
		}
		assert.Equal(t, cuda.CaptureStatusNone, e.captureStatus(t, j))
	})
	t.Run("two captures never merge", func(t *testing.T) {
		runtime.LockOSThread() // a subtest runs on its own goroutine; the capture ends on the thread that began it
		defer runtime.UnlockOSThread()
		s1, s2, ev := e.stream(t, cuda.StreamNonBlocking), e.stream(t, cuda.StreamNonBlocking), e.event(t)
		require.NoError(t, d.StreamBeginCapture(c, s1, cuda.CaptureModeRelaxed))
		require.NoError(t, d.StreamBeginCapture(c, s2, cuda.CaptureModeRelaxed))
		require.NoError(t, d.EventRecord(c, ev, s1))
		assertResult(t, cuda.ErrorStreamCaptureMerge, d.StreamWaitEvent(c, s2, ev), "waiting on another capture's event")
		for _, s := range []cuda.Stream{s1, s2} {
			if g, err := d.StreamEndCapture(c, s); err == nil {
				assert.NoError(t, d.GraphDestroy(c, g))
			}
		}
	})
	t.Run("a capture waits only on its own events", func(t *testing.T) {
		runtime.LockOSThread() // a subtest runs on its own goroutine; the capture ends on the thread that began it
		defer runtime.UnlockOSThread()
		s, other, ev := e.stream(t, cuda.StreamNonBlocking), e.stream(t, cuda.StreamNonBlocking), e.event(t)
		require.NoError(t, d.EventRecord(c, ev, other))
		require.NoError(t, d.StreamBeginCapture(c, s, cuda.CaptureModeRelaxed))
		assertResult(t, cuda.ErrorStreamCaptureIsolation, d.StreamWaitEvent(c, s, ev), "waiting on an event recorded outside the capture")
		_, err := d.StreamEndCapture(c, s)
		assertResult(t, cuda.ErrorStreamCaptureInvalidated, err, "EndCapture after the refused wait")
	})
}

// testGraphMemory checks the lifetime of an allocation made on a capturing stream (an alloc node), which
// cudacore's accounting follows: before its graph's first launch it is no allocation (a free fails),
// each launch allocates it anew (a launch while the last launch's allocation is live fails), it is freed
// like any allocation, and one still live when its graph is destroyed stays the caller's until freed.
func testGraphMemory(t *testing.T, e *env) {
	if !e.pools {
		t.Skip("graph memory nodes need memory pools")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d, c := e.drv, e.ctx
	const n = 1 << 20
	s := e.stream(t, cuda.StreamNonBlocking)
	host := e.host(t, n)

	// Never launched: not an allocation, and destroying the graph leaves nothing to free.
	g, p := e.captureAlloc(t, s, host)
	assert.Error(t, d.MemFreeAsync(c, p, s), "free of graph memory before any launch")
	require.NoError(t, d.GraphDestroy(c, g))

	// Launched: live until freed, also after its graph is gone; a second launch needs it freed first.
	g, p = e.captureAlloc(t, s, host)
	x, err := d.GraphInstantiate(c, g)
	require.NoError(t, err)
	copy(host, pattern(n, 0x5A))
	require.NoError(t, d.GraphLaunch(c, x, s))
	require.NoError(t, d.StreamSynchronize(c, s))
	assertResult(t, cuda.ErrorInvalidValue, d.GraphLaunch(c, x, s), "launch while the last launch's allocation is live")
	require.NoError(t, d.StreamSynchronize(c, s))
	require.NoError(t, d.MemFreeAsync(c, p, s))
	require.NoError(t, d.GraphLaunch(c, x, s), "launch after the allocation was freed")
	require.NoError(t, d.StreamSynchronize(c, s))
	require.NoError(t, d.GraphExecDestroy(c, x))
	require.NoError(t, d.GraphDestroy(c, g))
	back := make([]byte, n)
	require.NoError(t, d.MemcpyDtoH(c, back, p), "the allocation outlives its graph")
	assert.True(t, bytes.Equal(pattern(n, 0x5A), back))
	require.NoError(t, d.MemFreeAsync(c, p, s))
	require.NoError(t, d.StreamSynchronize(c, s))
	assert.Error(t, d.MemFreeAsync(c, p, s), "a second free")
}

// captureAlloc captures on s, in THREAD_LOCAL mode, an allocation of len(host) bytes and a copy of host
// into it, and returns the graph and the allocation's address. The caller locks its OS thread.
func (e *env) captureAlloc(t *testing.T, s cuda.Stream, host []byte) (cuda.Graph, cuda.DevicePtr) {
	t.Helper()
	d, c := e.drv, e.ctx
	require.NoError(t, d.StreamBeginCapture(c, s, cuda.CaptureModeThreadLocal))
	p, err := d.MemAllocAsync(c, uint64(len(host)), s)
	require.NoError(t, err)
	require.NoError(t, d.MemcpyHtoDAsync(c, p, host, s))
	g, err := d.StreamEndCapture(c, s)
	require.NoError(t, err)
	return g, p
}

// testGraphMemoryUpdate: cuGraphExecUpdate takes a graph whose allocation node allocates elsewhere (same
// size), and the executable graph's launches then allocate at the other graph's address, no longer at
// its own capture's. cudacore keeps the allocations of a graph's launches (their Buffers) by graph and
// address, so it refuses to update a graph that allocated memory during its capture (Graph.Update).
func testGraphMemoryUpdate(t *testing.T, e *env) {
	if !e.pools {
		t.Skip("graph memory nodes need memory pools")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d, c := e.drv, e.ctx
	const n = 256
	s := e.stream(t, cuda.StreamNonBlocking)
	host := e.host(t, n)
	g1, p1 := e.captureAlloc(t, s, host)
	defer func() { assert.NoError(t, d.GraphDestroy(c, g1)) }()
	g2, p2 := e.captureAlloc(t, s, host)
	defer func() { assert.NoError(t, d.GraphDestroy(c, g2)) }()
	require.NotEqual(t, p1, p2, "two live graphs allocate at different addresses")
	x, err := d.GraphInstantiate(c, g1)
	require.NoError(t, err)
	defer func() { assert.NoError(t, d.GraphExecDestroy(c, x)) }()
	require.NoError(t, d.GraphExecUpdate(c, x, g2), "update from a graph that allocates elsewhere")
	require.NoError(t, d.GraphLaunch(c, x, s))
	require.NoError(t, d.StreamSynchronize(c, s))
	assert.Error(t, d.MemFreeAsync(c, p1, s), "the launch no longer allocates at its own capture's address")
	require.NoError(t, d.StreamSynchronize(c, s))
	require.NoError(t, d.MemFreeAsync(c, p2, s), "the launch allocated at the other graph's address")
	require.NoError(t, d.StreamSynchronize(c, s))
}

// testManaged checks managed memory: its bytes survive prefetches to the device and back to the host,
// the hints are accepted, and both calls refuse memory that is not managed and unknown hints.
func testManaged(t *testing.T, e *env) {
	d, c := e.drv, e.ctx
	if on, err := d.DeviceAttribute(e.dev, cuda.AttrManagedMemory); err != nil || on != 1 {
		t.Skip("no managed memory")
	}
	const n = 1 << 20
	s := e.stream(t, cuda.StreamNonBlocking)
	p, err := d.MemAllocManaged(c, n, cuda.MemAttachGlobal)
	require.NoError(t, err)
	defer func() { assert.NoError(t, d.MemFree(c, p)) }()
	require.NoError(t, d.MemcpyHtoD(c, p, pattern(n, 0x21)))
	assert.NoError(t, d.MemAdvise(c, p, n, cuda.AdviseSetReadMostly, int(e.dev)))
	assert.NoError(t, d.MemAdvise(c, p, n, cuda.AdviseSetPreferredLocation, int(e.dev)))
	assert.NoError(t, d.MemAdvise(c, p, n, cuda.AdviseSetAccessedBy, int(e.dev)))
	assert.NoError(t, d.MemAdvise(c, p, n, cuda.AdviseUnsetReadMostly, int(e.dev)))
	require.NoError(t, d.MemPrefetchAsync(c, p, n, int(e.dev), s))
	require.NoError(t, d.MemPrefetchAsync(c, p, n, cuda.CPU, s))
	require.NoError(t, d.StreamSynchronize(c, s))
	back := make([]byte, n)
	require.NoError(t, d.MemcpyDtoH(c, back, p))
	assert.True(t, bytes.Equal(pattern(n, 0x21), back), "the bytes survive the migrations")
	assertResult(t, cuda.ErrorInvalidValue, d.MemAdvise(c, p, n, cuda.MemAdvice(99), int(e.dev)), "an unknown hint")

	plain := e.mem(t, n)
	assertResult(t, cuda.ErrorInvalidValue, d.MemPrefetchAsync(c, plain, n, int(e.dev), s), "prefetch of memory that is not managed")
}

// testCaptureQueries checks which read-only queries a THREAD_LOCAL capture on the calling thread survives:
// cuMemGetInfo does; a query of a pool's current usage (cuMemPoolGetAttribute) is an unsafe call (900)
// that invalidates the capture, so cudacore does not query the pool while a capture runs.
func testCaptureQueries(t *testing.T, e *env) {
	if !e.pools {
		t.Skip("no memory pools")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d, c := e.drv, e.ctx
	pool, err := d.DeviceDefaultMemPool(e.dev)
	require.NoError(t, err)
	s := e.stream(t, cuda.StreamNonBlocking)
	survives := func(query func() error) (callErr error, survived bool) {
		require.NoError(t, d.StreamBeginCapture(c, s, cuda.CaptureModeThreadLocal))
		callErr = query()
		g, err := d.StreamEndCapture(c, s)
		if err == nil {
			assert.NoError(t, d.GraphDestroy(c, g))
			return callErr, true
		}
		assertResult(t, cuda.ErrorStreamCaptureInvalidated, err, "end of an invalidated capture")
		return callErr, false
	}
	err, ok := survives(func() error { _, _, err := d.MemGetInfo(c); return err })
	assert.NoError(t, err)
	assert.True(t, ok, "cuMemGetInfo leaves the capture valid")
	for _, attr := range []cuda.MemPoolAttribute{cuda.PoolAttrReservedMemCurrent, cuda.PoolAttrUsedMemCurrent} {
		err, ok := survives(func() error { _, err := d.MemPoolGetAttribute(c, pool, attr); return err })
		assertResult(t, cuda.ErrorStreamCaptureUnsupported, err, "a pool usage query during capture")
		assert.False(t, ok, "attribute %d: the query invalidates the capture", attr)
	}
}

func testLimits(t *testing.T, e *env) {
	d, c := e.drv, e.ctx
	get := func(l cuda.Limit) uint64 {
		v, err := d.CtxGetLimit(c, l)
		require.NoError(t, err, "limit %d", l)
		return v
	}
	heap := get(cuda.LimitMallocHeapSize)
	assert.Equal(t, uint64(8388608), heap)
	assert.Equal(t, uint64(1024), get(cuda.LimitStackSize))
	if e.h100 {
		assert.Equal(t, uint64(8650752), get(cuda.LimitPrintfFIFOSize))
	} else {
		assert.Greater(t, get(cuda.LimitPrintfFIFOSize), uint64(0))
	}
	defer func() { assert.NoError(t, d.CtxSetLimit(c, cuda.LimitMallocHeapSize, heap)) }()
	require.NoError(t, d.CtxSetLimit(c, cuda.LimitMallocHeapSize, 256<<20))
	if e.total >= 4<<30 { // a small device clamps even 256 MiB
		assert.Equal(t, uint64(268435456), get(cuda.LimitMallocHeapSize))
	}
	require.NoError(t, d.CtxSetLimit(c, cuda.LimitMallocHeapSize, 64<<40), "the heap clamps silently")
	clamped := get(cuda.LimitMallocHeapSize)
	assert.Less(t, clamped, uint64(64<<40))
	assert.Greater(t, clamped, uint64(0))
	if e.h100 {
		assert.Equal(t, uint64(h100ClampedHeap), clamped)
	}
	// Measured on the H100: a value that is no CUlimit is INVALID_VALUE, not UNSUPPORTED_LIMIT.
	assertResult(t, cuda.ErrorInvalidValue, d.CtxSetLimit(c, cuda.Limit(0x7fff), 1), "set an unknown limit")
	_, err := d.CtxGetLimit(c, cuda.Limit(0x7fff))
	assertResult(t, cuda.ErrorInvalidValue, err, "get an unknown limit")
}

// testInvalidHandles uses only handles whose rejection the driver documents; use-after-destroy of a
// real driver handle is undefined behaviour, so the simulator's own tests cover that.
func testInvalidHandles(t *testing.T, e *env) {
	d, c := e.drv, e.ctx
	a, err := d.EventCreate(c, cuda.EventDefault)
	require.NoError(t, err)
	b, err := d.EventCreate(c, cuda.EventDefault)
	require.NoError(t, err)
	_, err = d.EventElapsedTime(c, a, b)
	assertResult(t, cuda.ErrorInvalidHandle, err, "elapsed time of events never recorded")
	assert.ErrorIs(t, err, cuda.ErrInvalidHandle)
	nt, err := d.EventCreate(c, cuda.EventDisableTiming)
	require.NoError(t, err)
	s, err := d.StreamCreate(c, cuda.StreamNonBlocking, 0)
	require.NoError(t, err)
	require.NoError(t, d.EventRecord(c, a, s))
	require.NoError(t, d.EventRecord(c, nt, s))
	require.NoError(t, d.StreamSynchronize(c, s))
	_, err = d.EventElapsedTime(c, a, nt)
	assertResult(t, cuda.ErrorInvalidHandle, err, "elapsed time with a CU_EVENT_DISABLE_TIMING event")
	for _, ev := range []cuda.Event{a, b, nt} {
		require.NoError(t, d.EventDestroy(c, ev))
	}
	require.NoError(t, d.StreamDestroy(c, s))
}
