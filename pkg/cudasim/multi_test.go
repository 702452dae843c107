package cudasim_test

import (
	"bytes"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
)

// The child half of the cross-process tests: a second process with a simulator of its own opens what the
// parent exported (the handle in the environment, the pool's descriptor inherited as fd 3), checks the
// bytes, writes its own and reports on stdout.
func TestMain(m *testing.M) {
	if mode := os.Getenv("CUDASIM_IPC_CHILD"); mode != "" {
		os.Exit(ipcChild(mode))
	}
	os.Exit(m.Run())
}

func ipcChild(mode string) int {
	d := cudasim.New()
	fail := func(what string, err error) int {
		os.Stdout.WriteString("FAIL " + what + ": " + err.Error() + "\n")
		return 1
	}
	if err := d.Init(); err != nil {
		return fail("init", err)
	}
	ctx, err := d.PrimaryCtxRetain(0)
	if err != nil {
		return fail("retain", err)
	}
	raw, _ := hex.DecodeString(os.Getenv("CUDASIM_IPC_HANDLE"))
	var h cuda.IpcHandle
	copy(h[:], raw)
	var p cuda.DevicePtr
	var pool cuda.MemPool
	switch mode {
	case "mem":
		p, err = d.IpcOpenMemHandle(ctx, h)
	case "pool":
		pool, err = d.MemPoolImportFromShareableHandle(ctx, 3, cuda.HandlePosixFD)
		if err == nil {
			p, err = d.MemPoolImportPointer(ctx, pool, h)
		}
	case "event":
		var ev cuda.Event
		if ev, err = d.IpcOpenEventHandle(ctx, h); err == nil {
			err = d.StreamWaitEvent(ctx, cuda.StreamLegacy, ev)
		}
		if err != nil {
			return fail("event", err)
		}
		os.Stdout.WriteString("OK\n")
		return 0
	}
	if err != nil {
		return fail("open", err)
	}
	got := make([]byte, 64)
	if err := d.MemcpyDtoH(ctx, got, p); err != nil {
		return fail("read", err)
	}
	if err := d.MemcpyHtoD(ctx, p, bytes.Repeat([]byte{0xc5}, 64)); err != nil {
		return fail("write", err)
	}
	if mode == "mem" {
		err = d.IpcCloseMemHandle(ctx, p)
	} else {
		err = d.MemFree(ctx, p)
	}
	if err != nil {
		return fail("close", err)
	}
	os.Stdout.WriteString("OK " + hex.EncodeToString(got) + "\n")
	return 0
}

func runChild(t *testing.T, mode string, h cuda.IpcHandle, files ...*os.File) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "CUDASIM_IPC_CHILD="+mode, "CUDASIM_IPC_HANDLE="+hex.EncodeToString(h[:]))
	cmd.ExtraFiles = files
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child: %s", out)
	return strings.TrimSpace(string(out))
}

func pattern64(seed byte) []byte {
	b := make([]byte, 64)
	for i := range b {
		b[i] = byte(i) ^ seed
	}
	return b
}

func TestIpcMemHandleAcrossProcesses(t *testing.T) {
	e := start(t)
	p, err := e.d.MemAlloc(e.ctx, 4096)
	require.NoError(t, err)
	require.NoError(t, e.d.MemcpyHtoD(e.ctx, p, pattern64(1)))
	h, err := e.d.IpcGetMemHandle(e.ctx, p)
	require.NoError(t, err)
	out := runChild(t, "mem", h)
	assert.Equal(t, "OK "+hex.EncodeToString(pattern64(1)), out, "the child reads the parent's bytes")
	got := make([]byte, 64)
	require.NoError(t, e.d.MemcpyDtoH(e.ctx, got, p))
	assert.Equal(t, bytes.Repeat([]byte{0xc5}, 64), got, "the parent sees the child's bytes")

	// Freed, the handle opens nothing: the child gets a clear error, not someone else's memory.
	require.NoError(t, e.d.MemFree(e.ctx, p))
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "CUDASIM_IPC_CHILD=mem", "CUDASIM_IPC_HANDLE="+hex.EncodeToString(h[:]))
	stale, err := cmd.CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(stale), "CUDA_ERROR_INVALID_VALUE")
	assert.Contains(t, string(stale), "is gone")
}

func TestExportablePoolAcrossProcesses(t *testing.T) {
	e := start(t)
	pool, err := e.d.MemPoolCreate(e.ctx, cuda.PoolProps{HandleTypes: cuda.HandlePosixFD})
	require.NoError(t, err)
	p, err := e.d.MemAllocFromPoolAsync(e.ctx, 5000, pool, cuda.StreamLegacy)
	require.NoError(t, err)
	require.NoError(t, e.d.MemcpyHtoD(e.ctx, p, pattern64(2)))
	data, err := e.d.MemPoolExportPointer(e.ctx, p)
	require.NoError(t, err)
	fd, err := e.d.MemPoolExportToShareableHandle(e.ctx, pool, cuda.HandlePosixFD)
	require.NoError(t, err)
	f := os.NewFile(uintptr(fd), "pool")
	defer f.Close()
	out := runChild(t, "pool", data, f)
	assert.Equal(t, "OK "+hex.EncodeToString(pattern64(2)), out)
	got := make([]byte, 64)
	require.NoError(t, e.d.MemcpyDtoH(e.ctx, got, p))
	assert.Equal(t, bytes.Repeat([]byte{0xc5}, 64), got)

	// Blocks of a pool made without a handle type cannot be exported.
	plain, err := e.d.MemPoolCreate(e.ctx, cuda.PoolProps{})
	require.NoError(t, err)
	q, err := e.d.MemAllocFromPoolAsync(e.ctx, 100, plain, cuda.StreamLegacy)
	require.NoError(t, err)
	_, err = e.d.MemPoolExportPointer(e.ctx, q)
	requireResult(t, cuda.ErrorInvalidValue, "cuMemPoolExportPointer", err)
	_, err = e.d.MemPoolCreate(e.ctx, cuda.PoolProps{HandleTypes: cuda.HandleFabric})
	requireResult(t, cuda.ErrorNotSupported, "cuMemPoolCreate", err)
}

func TestIpcEventAcrossProcesses(t *testing.T) {
	e := start(t)
	ev, err := e.d.EventCreate(e.ctx, cuda.EventInterprocess|cuda.EventDisableTiming)
	require.NoError(t, err)
	require.NoError(t, e.d.EventRecord(e.ctx, ev, cuda.StreamLegacy))
	h, err := e.d.IpcGetEventHandle(e.ctx, ev)
	require.NoError(t, err)
	assert.Equal(t, "OK", runChild(t, "event", h))
	plain, err := e.d.EventCreate(e.ctx, cuda.EventDisableTiming)
	require.NoError(t, err)
	_, err = e.d.IpcGetEventHandle(e.ctx, plain)
	requireResult(t, cuda.ErrorInvalidValue, "cuIpcGetEventHandle", err)
	_, err = e.d.IpcOpenEventHandle(e.ctx, h)
	requireResult(t, cuda.ErrorInvalidContext, "cuIpcOpenEventHandle", err)
}

// The link model: NVLinks between peers (the smaller count of the two), PCIe between peers without them,
// nothing across peer groups; the simulated NVML answers the same, or not at all under no_nvml.
func TestLinks(t *testing.T) {
	e := start(t, cudasim.WithDevices(
		cudasim.DeviceConfig{TotalMemory: 1 << 30, NVLinks: 18},
		cudasim.DeviceConfig{TotalMemory: 1 << 30, NVLinks: 12},
		cudasim.DeviceConfig{TotalMemory: 1 << 30},
		cudasim.DeviceConfig{TotalMemory: 1 << 30, NVLinks: 18, PeerGroup: 1},
	))
	for _, c := range []struct {
		a, b                  cuda.Device
		access, atomics, rank int
		links, ancestor       int
	}{
		{0, 1, 1, 1, 0, 12, 10},
		{1, 0, 1, 1, 0, 12, 10},
		{0, 2, 1, 0, 1, 0, 10},
		{2, 1, 1, 0, 1, 0, 10},
		{0, 3, 0, 0, 0, 0, 50},
		{3, 2, 0, 0, 0, 0, 50},
	} {
		for attr, want := range map[cuda.P2PAttribute]int{cuda.P2PAccessSupported: c.access, cuda.P2PNativeAtomicSupport: c.atomics, cuda.P2PPerformanceRank: c.rank} {
			got, err := e.d.DeviceGetP2PAttribute(attr, c.a, c.b)
			require.NoError(t, err)
			assert.Equal(t, want, got, "attribute %d, %d -> %d", attr, c.a, c.b)
		}
		link, ok := e.d.LinkBetween(int(c.a), int(c.b))
		require.True(t, ok)
		assert.Equal(t, cudasim.NVMLLink{DirectLinks: c.links, Ancestor: c.ancestor}, link, "%d -> %d", c.a, c.b)
	}
	for _, c := range []struct{ src, dst cuda.Device }{{1, 1}, {0, 4}, {-1, 0}} {
		_, err := e.d.DeviceGetP2PAttribute(cuda.P2PAccessSupported, c.src, c.dst)
		requireResult(t, cuda.ErrorInvalidDevice, "cuDeviceGetP2PAttribute", err)
	}
	_, err := e.d.DeviceGetP2PAttribute(99, 0, 1)
	requireResult(t, cuda.ErrorInvalidValue, "cuDeviceGetP2PAttribute", err)
	_, ok := e.d.LinkBetween(0, 4)
	assert.False(t, ok, "an ordinal the simulator does not have")
	require.NoError(t, e.d.SetMemoryConditions(1, cudasim.MemoryConditions{NoNVML: true}))
	_, ok = e.d.LinkBetween(0, 1)
	assert.False(t, ok, "no NVML on either device: not available")
	_, ok = e.d.LinkBetween(0, 2)
	assert.True(t, ok)
}

func TestPeerGroups(t *testing.T) {
	e := start(t, cudasim.WithDevices(
		cudasim.DeviceConfig{TotalMemory: 1 << 30, MemoryPoolsSupported: true},
		cudasim.DeviceConfig{TotalMemory: 1 << 30, MemoryPoolsSupported: true},
		cudasim.DeviceConfig{TotalMemory: 1 << 30, MemoryPoolsSupported: true, PeerGroup: 1},
	))
	for _, c := range []struct {
		a, b cuda.Device
		want bool
	}{{0, 1, true}, {1, 0, true}, {0, 2, false}, {2, 1, false}, {1, 1, false}} {
		got, err := e.d.DeviceCanAccessPeer(c.a, c.b)
		require.NoError(t, err)
		assert.Equal(t, c.want, got, "%d -> %d", c.a, c.b)
	}
	c2, err := e.d.PrimaryCtxRetain(2)
	require.NoError(t, err)
	requireResult(t, cuda.ErrorPeerAccessUnsupported, "cuCtxEnablePeerAccess", e.d.CtxEnablePeerAccess(e.ctx, c2))
	requireResult(t, cuda.ErrorInvalidValue, "cuCtxEnablePeerAccess", e.d.CtxEnablePeerAccess(e.ctx, e.ctx))
	pool, err := e.d.DeviceDefaultMemPool(0)
	require.NoError(t, err)
	requireResult(t, cuda.ErrorInvalidDevice, "cuMemPoolSetAccess", e.d.MemPoolSetAccess(e.ctx, pool, 2, cuda.AccessReadWrite))
	requireResult(t, cuda.ErrorInvalidValue, "cuMemPoolSetAccess", e.d.MemPoolSetAccess(e.ctx, pool, 0, cuda.AccessNone))
	requireResult(t, cuda.ErrorInvalidValue, "cuMemPoolSetAccess", e.d.MemPoolSetAccess(e.ctx, pool, 1, 2))

	// A peer copy between devices without peer access works (the driver stages it).
	src, err := e.d.MemAlloc(c2, 64)
	require.NoError(t, err)
	require.NoError(t, e.d.MemcpyHtoD(c2, src, pattern64(4)))
	dst, err := e.d.MemAlloc(e.ctx, 64)
	require.NoError(t, err)
	require.NoError(t, e.d.MemcpyPeerAsync(e.ctx, dst, e.ctx, src, c2, 64, cuda.StreamLegacy))
	got := make([]byte, 64)
	require.NoError(t, e.d.MemcpyDtoH(e.ctx, got, dst))
	assert.Equal(t, pattern64(4), got)
	requireResult(t, cuda.ErrorInvalidValue, "cuMemcpyPeerAsync", e.d.MemcpyPeerAsync(e.ctx, dst, e.ctx, src, c2, 65, cuda.StreamLegacy))
	requireResult(t, cuda.ErrorInvalidContext, "cuMemcpyPeerAsync", e.d.MemcpyPeerAsync(e.ctx, dst, e.ctx, src, 0x1234, 64, cuda.StreamLegacy))

	// Inside a capture the simulator refuses a peer copy (it does not record one).
	s, err := e.d.StreamCreate(e.ctx, cuda.StreamNonBlocking, 0)
	require.NoError(t, err)
	require.NoError(t, e.d.StreamBeginCapture(e.ctx, s, cuda.CaptureModeRelaxed))
	requireResult(t, cuda.ErrorNotSupported, "cuMemcpyPeerAsync", e.d.MemcpyPeerAsync(e.ctx, dst, e.ctx, src, c2, 64, s))
	g, err := e.d.StreamEndCapture(e.ctx, s)
	require.NoError(t, err)
	require.NoError(t, e.d.GraphDestroy(e.ctx, g))

	// The same IPC handle for the same allocation.
	h1, err := e.d.IpcGetMemHandle(e.ctx, dst)
	require.NoError(t, err)
	h2, err := e.d.IpcGetMemHandle(e.ctx, dst)
	require.NoError(t, err)
	assert.Equal(t, h1, h2)
}

func TestParsePeerGroup(t *testing.T) {
	cfgs, err := cudasim.ParseDevices([]byte(`[{"name": "a"}, {"name": "b", "peer_group": 1}]`))
	require.NoError(t, err)
	assert.Equal(t, 0, cfgs[0].PeerGroup)
	assert.Equal(t, 1, cfgs[1].PeerGroup)
	for _, bad := range []string{`[{"peer_group": -1}]`, `[{"peer_group": 1.5}]`, `[{"peer_group": 65}]`} {
		_, err := cudasim.ParseDevices([]byte(bad))
		requireResult(t, cuda.ErrorInvalidValue, cudasim.EnvDevices, err)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(entries)
}

// Shared memory is given back: a destroyed pool's file, a freed allocation's file, a released context's.
func TestSharedMemoryIsReleased(t *testing.T) {
	e := start(t)
	before := openFDs(t)
	for range 20 {
		pool, err := e.d.MemPoolCreate(e.ctx, cuda.PoolProps{HandleTypes: cuda.HandlePosixFD})
		require.NoError(t, err)
		p, err := e.d.MemAllocFromPoolAsync(e.ctx, 4096, pool, cuda.StreamLegacy)
		require.NoError(t, err)
		require.NoError(t, e.d.MemFreeAsync(e.ctx, p, cuda.StreamLegacy))
		require.NoError(t, e.d.MemPoolDestroy(e.ctx, pool))
		q, err := e.d.MemAlloc(e.ctx, 4096)
		require.NoError(t, err)
		_, err = e.d.IpcGetMemHandle(e.ctx, q)
		require.NoError(t, err)
		require.NoError(t, e.d.MemFree(e.ctx, q))
	}
	_, err := e.d.MemPoolCreate(e.ctx, cuda.PoolProps{HandleTypes: cuda.HandlePosixFD})
	require.NoError(t, err)
	q, err := e.d.MemAlloc(e.ctx, 4096)
	require.NoError(t, err)
	_, err = e.d.IpcGetMemHandle(e.ctx, q)
	require.NoError(t, err)
	require.NoError(t, e.d.PrimaryCtxRelease(0)) // the last release destroys the context and all of it
	assert.Equal(t, before, openFDs(t))
}
