package conformance

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// The multi-device and IPC part of the suite. What needs two devices skips on one; what needs two
// processes is tested by the drivers' own packages (a process cannot open its own IPC handles).

func runMulti(t *testing.T, newDriver func(t *testing.T) cuda.Driver) {
	t.Run("PeerQuery", func(t *testing.T) { testPeerQuery(t, setup(t, newDriver)) })
	t.Run("PeerCopy", func(t *testing.T) { testPeerCopy(t, setup(t, newDriver)) })
	t.Run("PoolAccess", func(t *testing.T) { testPoolAccess(t, setup(t, newDriver)) })
	t.Run("ExportablePool", func(t *testing.T) { testExportablePool(t, setup(t, newDriver)) })
	t.Run("IpcMemHandle", func(t *testing.T) { testIpcMemHandle(t, setup(t, newDriver)) })
	t.Run("IpcEvent", func(t *testing.T) { testIpcEvent(t, setup(t, newDriver)) })
	t.Run("NCCLMemoryKinds", func(t *testing.T) { testNCCLMemoryKinds(t, setup(t, newDriver)) })
}

// second retains device 1's primary context, skipping the test on a machine with one device.
func (e *env) second(t *testing.T) (cuda.Device, cuda.Context) {
	t.Helper()
	n, err := e.drv.DeviceCount()
	require.NoError(t, err)
	if n < 2 {
		t.Skip("needs two devices")
	}
	dev, err := e.drv.DeviceGet(1)
	require.NoError(t, err)
	ctx, err := e.drv.PrimaryCtxRetain(dev)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, e.drv.PrimaryCtxRelease(dev)) })
	return dev, ctx
}

func testPeerQuery(t *testing.T, e *env) {
	n, err := e.drv.DeviceCount()
	require.NoError(t, err)
	for i := range n {
		for j := range n {
			can, err := e.drv.DeviceCanAccessPeer(cuda.Device(i), cuda.Device(j))
			require.NoError(t, err)
			if i == j {
				assert.False(t, can, "a device is never its own peer")
			}
			back, err := e.drv.DeviceCanAccessPeer(cuda.Device(j), cuda.Device(i))
			require.NoError(t, err)
			assert.Equal(t, can, back, "peer access between %d and %d is symmetric", i, j)
		}
	}
	_, err = e.drv.DeviceCanAccessPeer(0, cuda.Device(n))
	assertResult(t, cuda.ErrorInvalidDevice, err, "a peer that does not exist")
	testP2PAttributes(t, e, n)
}

// testP2PAttributes: cuDeviceGetP2PAttribute's access attribute agrees with cuDeviceCanAccessPeer,
// native atomics only where there is access, and a device with itself or one that does not exist is
// ErrorInvalidDevice. doctor's link report (cudacore._topology) reads these.
func testP2PAttributes(t *testing.T, e *env, n int) {
	for i := range n {
		for j := range n {
			if i == j {
				_, err := e.drv.DeviceGetP2PAttribute(cuda.P2PAccessSupported, cuda.Device(i), cuda.Device(j))
				assertResult(t, cuda.ErrorInvalidDevice, err, "the path from a device to itself")
				continue
			}
			can, err := e.drv.DeviceCanAccessPeer(cuda.Device(i), cuda.Device(j))
			require.NoError(t, err)
			access, err := e.drv.DeviceGetP2PAttribute(cuda.P2PAccessSupported, cuda.Device(i), cuda.Device(j))
			require.NoError(t, err)
			assert.Equal(t, can, access == 1, "access %d -> %d agrees with cuDeviceCanAccessPeer", i, j)
			atomics, err := e.drv.DeviceGetP2PAttribute(cuda.P2PNativeAtomicSupport, cuda.Device(i), cuda.Device(j))
			require.NoError(t, err)
			assert.Contains(t, []int{0, 1}, atomics)
			if !can {
				assert.Zero(t, atomics, "no atomics %d -> %d without access", i, j)
			}
			rank, err := e.drv.DeviceGetP2PAttribute(cuda.P2PPerformanceRank, cuda.Device(i), cuda.Device(j))
			require.NoError(t, err)
			assert.GreaterOrEqual(t, rank, 0)
		}
	}
	_, err := e.drv.DeviceGetP2PAttribute(cuda.P2PAccessSupported, 0, cuda.Device(n))
	assertResult(t, cuda.ErrorInvalidDevice, err, "a peer that does not exist")
}

func testPeerCopy(t *testing.T, e *env) {
	d, c0 := e.drv, e.ctx
	_, c1 := e.second(t)
	const size = 1 << 20
	src, err := d.MemAlloc(c0, size)
	require.NoError(t, err)
	defer func() { assert.NoError(t, d.MemFree(c0, src)) }()
	dst, err := d.MemAlloc(c1, size)
	require.NoError(t, err)
	defer func() { assert.NoError(t, d.MemFree(c1, dst)) }()
	want := pattern(size, 3)
	require.NoError(t, d.MemcpyHtoD(c0, src, want))

	// Without peer access too: the driver stages the copy. On a stream of the destination's device...
	s1, err := d.StreamCreate(c1, cuda.StreamNonBlocking, 0)
	require.NoError(t, err)
	defer func() { assert.NoError(t, d.StreamDestroy(c1, s1)) }()
	require.NoError(t, d.MemcpyPeerAsync(c1, dst, c1, src, c0, size, s1))
	require.NoError(t, d.StreamSynchronize(c1, s1))
	got := make([]byte, size)
	require.NoError(t, d.MemcpyDtoH(c1, got, dst))
	assert.Equal(t, want, got, "peer copy on the destination's stream")

	// ...and back on a stream of the source's device, ordered after a write with an event.
	require.NoError(t, d.MemsetD8Async(c1, dst, 0x5a, size/2, s1))
	ev, err := d.EventCreate(c1, cuda.EventDisableTiming)
	require.NoError(t, err)
	defer func() { assert.NoError(t, d.EventDestroy(c1, ev)) }()
	require.NoError(t, d.EventRecord(c1, ev, s1))
	s0, err := d.StreamCreate(c0, cuda.StreamNonBlocking, 0)
	require.NoError(t, err)
	defer func() { assert.NoError(t, d.StreamDestroy(c0, s0)) }()
	require.NoError(t, d.StreamWaitEvent(c0, s0, ev))
	require.NoError(t, d.MemcpyPeerAsync(c0, src, c0, dst, c1, size, s0))
	require.NoError(t, d.StreamSynchronize(c0, s0))
	require.NoError(t, d.MemcpyDtoH(c0, got, src))
	for i := range size / 2 {
		want[i] = 0x5a
	}
	assert.Equal(t, want, got, "peer copy back, after the memset it waited for")
}

func testPoolAccess(t *testing.T, e *env) {
	if !e.pools {
		t.Skip("needs memory pools")
	}
	d, c0 := e.drv, e.ctx
	dev1, c1 := e.second(t)
	can, err := d.DeviceCanAccessPeer(e.dev, dev1)
	require.NoError(t, err)
	if can {
		err = d.CtxEnablePeerAccess(c1, c0)
		if cuda.ResultOf(err) != cuda.ErrorPeerAccessAlreadyEnabled {
			require.NoError(t, err)
		}
		err = d.CtxEnablePeerAccess(c1, c0)
		assertResult(t, cuda.ErrorPeerAccessAlreadyEnabled, err, "enabling peer access twice")
	} else {
		err = d.CtxEnablePeerAccess(c1, c0)
		assertResult(t, cuda.ErrorPeerAccessUnsupported, err, "peer access between devices that lack it")
	}
	pool, err := d.MemPoolCreate(c0, cuda.PoolProps{Device: e.dev})
	require.NoError(t, err)
	defer func() { assert.NoError(t, d.MemPoolDestroy(c0, pool)) }()
	own, err := d.MemPoolGetAccess(c0, pool, e.dev)
	require.NoError(t, err)
	assert.Equal(t, cuda.AccessReadWrite, own, "the owner's access")
	if !can {
		return
	}
	before, err := d.MemPoolGetAccess(c0, pool, dev1)
	require.NoError(t, err)
	assert.Equal(t, cuda.AccessNone, before, "a new pool is not shared with peers")
	require.NoError(t, d.MemPoolSetAccess(c0, pool, dev1, cuda.AccessReadWrite))
	after, err := d.MemPoolGetAccess(c0, pool, dev1)
	require.NoError(t, err)
	assert.Equal(t, cuda.AccessReadWrite, after)
}

func testExportablePool(t *testing.T, e *env) {
	if !e.pools {
		t.Skip("needs memory pools")
	}
	d, c := e.drv, e.ctx
	pool, err := d.MemPoolCreate(c, cuda.PoolProps{Device: e.dev, HandleTypes: cuda.HandlePosixFD})
	require.NoError(t, err)
	defer func() { assert.NoError(t, d.MemPoolDestroy(c, pool)) }()
	p, err := d.MemAllocFromPoolAsync(c, 1000, pool, cuda.StreamLegacy)
	require.NoError(t, err)
	require.NoError(t, d.StreamSynchronize(c, cuda.StreamLegacy)) // the allocation exists once its stream reached it
	data, err := d.MemPoolExportPointer(c, p)
	if r := cuda.ResultOf(err); r == cuda.ErrorInvalidValue || r == cuda.ErrorNotSupported {
		// Some drivers make exportable pools but refuse to export their blocks (the H100 test machine
		// answers INVALID_VALUE, also to NVIDIA's documented sequence); cudacore probes for it and shares
		// cuIpc memory there (process.sharePool). What follows needs a driver that exports.
		require.NoError(t, d.MemFreeAsync(c, p, cuda.StreamLegacy))
		require.NoError(t, d.CtxSynchronize(c))
		t.Skipf("this driver refuses to export an exportable pool's block: %v", err)
	}
	require.NoError(t, err)
	assert.NotEqual(t, cuda.IpcHandle{}, data)
	fd, err := d.MemPoolExportToShareableHandle(c, pool, cuda.HandlePosixFD)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, fd, 0)
	closeFD(fd)
	require.NoError(t, d.MemFreeAsync(c, p, cuda.StreamLegacy))
	require.NoError(t, d.CtxSynchronize(c))

	// The default pool was not made exportable.
	def, err := d.DeviceDefaultMemPool(e.dev)
	require.NoError(t, err)
	_, err = d.MemPoolExportToShareableHandle(c, def, cuda.HandlePosixFD)
	assert.Error(t, err, "exporting a pool made without a handle type")
}

func testIpcMemHandle(t *testing.T, e *env) {
	d, c := e.drv, e.ctx
	p, err := d.MemAlloc(c, 4096)
	require.NoError(t, err)
	defer func() { assert.NoError(t, d.MemFree(c, p)) }()
	require.NoError(t, d.MemcpyHtoD(c, p, pattern(4096, 9)))
	h, err := d.IpcGetMemHandle(c, p)
	require.NoError(t, err)
	assert.NotEqual(t, cuda.IpcHandle{}, h)
	got := make([]byte, 4096)
	require.NoError(t, d.MemcpyDtoH(c, got, p))
	assert.Equal(t, pattern(4096, 9), got, "taking the handle keeps the contents")
	_, err = d.IpcOpenMemHandle(c, h)
	assertResult(t, cuda.ErrorInvalidContext, err, "opening a handle in the process that made it")
}

func testIpcEvent(t *testing.T, e *env) {
	d, c := e.drv, e.ctx
	_, err := d.EventCreate(c, cuda.EventInterprocess)
	assertResult(t, cuda.ErrorInvalidValue, err, "an interprocess event that keeps timing")
	ev, err := d.EventCreate(c, cuda.EventInterprocess|cuda.EventDisableTiming)
	require.NoError(t, err)
	defer func() { assert.NoError(t, d.EventDestroy(c, ev)) }()
	h, err := d.IpcGetEventHandle(c, ev)
	require.NoError(t, err)
	assert.NotEqual(t, cuda.IpcHandle{}, h)
}

// testNCCLMemoryKinds: what NCCL asks of a buffer before it registers it with a peer process
// (docs/contributing/driver-facts.md, "NCCL's user buffers"). cuMemAlloc memory is legacy-IPC capable and
// has no physical allocation handle (it is not mapped with cuMemMap); a block of a stream-ordered pool,
// default or exportable, is not legacy-IPC capable, and the model says it has no allocation handle either:
// the GPU run decides that, and -v prints the handle types each kind reports.
func testNCCLMemoryKinds(t *testing.T, e *env) {
	d, c := e.drv, e.ctx
	p, err := d.MemAlloc(c, 1<<21)
	require.NoError(t, err)
	defer func() { assert.NoError(t, d.MemFree(c, p)) }()
	legacy, err := d.PointerGetAttribute(c, cuda.PointerLegacyIpcCapable, p+64)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), legacy, "cuMemAlloc memory is legacy-IPC capable")
	_, err = d.MemRetainAllocationHandle(c, p)
	assert.Error(t, err, "cuMemAlloc memory has no physical allocation handle")
	types, err := d.PointerGetAttribute(c, cuda.PointerAllowedHandleTypes, p)
	t.Logf("cuMemAlloc: allowed handle types %#x (%v)", types, err)
	if !e.pools {
		return
	}
	for _, exportable := range []bool{false, true} {
		pool, err := d.DeviceDefaultMemPool(e.dev)
		require.NoError(t, err)
		if exportable {
			pool, err = d.MemPoolCreate(c, cuda.PoolProps{Device: e.dev, HandleTypes: cuda.HandlePosixFD})
			require.NoError(t, err)
		}
		q, err := d.MemAllocFromPoolAsync(c, 1<<21, pool, cuda.StreamLegacy)
		require.NoError(t, err)
		require.NoError(t, d.StreamSynchronize(c, cuda.StreamLegacy))
		legacy, err := d.PointerGetAttribute(c, cuda.PointerLegacyIpcCapable, q)
		require.NoError(t, err)
		assert.Zero(t, legacy, "a pool block (exportable %v) is not legacy-IPC capable", exportable)
		h, err := d.MemRetainAllocationHandle(c, q)
		if err == nil {
			assert.NoError(t, d.MemRelease(c, h))
		}
		assert.Error(t, err, "a pool block (exportable %v) has no physical allocation handle in the model", exportable)
		types, terr := d.PointerGetAttribute(c, cuda.PointerAllowedHandleTypes, q)
		t.Logf("pool block (exportable %v): retain %v; allowed handle types %#x (%v)", exportable, err, types, terr)
		require.NoError(t, d.MemFreeAsync(c, q, cuda.StreamLegacy))
		require.NoError(t, d.StreamSynchronize(c, cuda.StreamLegacy))
		if exportable {
			require.NoError(t, d.MemPoolDestroy(c, pool))
		}
	}
}
