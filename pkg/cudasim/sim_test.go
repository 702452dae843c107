package cudasim_test

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
)

type simEnv struct {
	d   *cudasim.Driver
	ctx cuda.Context
}

func start(t *testing.T, opts ...cudasim.Option) simEnv {
	t.Helper()
	d := cudasim.New(opts...)
	require.NoError(t, d.Init())
	ctx, err := d.PrimaryCtxRetain(0)
	require.NoError(t, err)
	return simEnv{d, ctx}
}

func requireResult(t *testing.T, want cuda.Result, op string, err error) {
	t.Helper()
	var e *cuda.Error
	if !assert.True(t, errors.As(err, &e), "want a *cuda.Error, got %v", err) {
		return
	}
	assert.Equal(t, want, e.Result, "%v", err)
	if op != "" {
		assert.Equal(t, op, e.Op)
	}
}

func TestParseDevices(t *testing.T) {
	good := []struct {
		name, in string
		check    func(t *testing.T, c []cudasim.DeviceConfig)
	}{
		{"README example", `[{"name": "sim-tcc", "total_memory": 1073741824, "memory_pools_supported": false, "tcc_driver": true}]`,
			func(t *testing.T, c []cudasim.DeviceConfig) {
				require.Len(t, c, 1)
				assert.Equal(t, "sim-tcc", c[0].Name)
				assert.Equal(t, uint64(1<<30), c[0].TotalMemory)
				assert.False(t, c[0].MemoryPoolsSupported)
				assert.True(t, c[0].TCCDriver)
				assert.Equal(t, [2]int{9, 0}, c[0].ComputeCapability, "omitted fields are the H100's")
				assert.True(t, c[0].ManagedMemory)
				assert.Equal(t, 132, c[0].MultiprocessorCount)
			}},
		{"all defaults", `[{}]`, func(t *testing.T, c []cudasim.DeviceConfig) {
			h := cudasim.H100()
			assert.Equal(t, h.Name, c[0].Name)
			assert.Equal(t, h.TotalMemory, c[0].TotalMemory)
			assert.NotZero(t, c[0].UUID)
			assert.NotEmpty(t, c[0].PCIBusID)
		}},
		{"duplicate names, distinct ids", `[{"name":"a"},{"name":"a"}]`, func(t *testing.T, c []cudasim.DeviceConfig) {
			require.Len(t, c, 2)
			assert.NotEqual(t, c[0].UUID, c[1].UUID)
			assert.NotEqual(t, c[0].PCIBusID, c[1].PCIBusID)
		}},
		{"every field", `[{"name":"x","total_memory":2048,"compute_capability":[8,6],"multiprocessor_count":4,
			"memory_pools_supported":true,"tcc_driver":false,"managed_memory":false,"integrated":true,
			"uuid":"GPU-00112233-4455-6677-8899-aabbccddeeff","pci_bus_id":"0000:65:00.0"}]`,
			func(t *testing.T, c []cudasim.DeviceConfig) {
				assert.Equal(t, [2]int{8, 6}, c[0].ComputeCapability)
				assert.Equal(t, "GPU-00112233-4455-6677-8899-aabbccddeeff", cudasim.UUIDString(c[0].UUID))
				assert.True(t, c[0].Integrated)
				assert.False(t, c[0].ManagedMemory)
			}},
		{"64 devices", "[" + strings.Repeat("{},", 63) + "{}]", func(t *testing.T, c []cudasim.DeviceConfig) { assert.Len(t, c, 64) }},
	}
	for _, tc := range good {
		t.Run(tc.name, func(t *testing.T) {
			c, err := cudasim.ParseDevices([]byte(tc.in))
			require.NoError(t, err)
			tc.check(t, c)
		})
	}
	bad := []struct{ name, in, quote string }{
		{"malformed", `[{"name":`, "not a JSON list"},
		{"not a list", `{"name":"x"}`, "not a JSON list"},
		{"null", `null`, "must be a JSON list"},
		{"unknown field", `[{"nmae":"x"}]`, "nmae"},
		{"empty list", `[]`, "no devices"},
		{"negative memory", `[{"total_memory":-5}]`, `"-5"`},
		{"zero memory", `[{"total_memory":0}]`, "total_memory"},
		{"fractional memory", `[{"total_memory":1.5}]`, "total_memory"},
		{"huge memory", `[{"total_memory":18446744073709551615}]`, "total_memory"},
		{"cc zero", `[{"compute_capability":[0,0]}]`, "compute_capability"},
		{"cc minor", `[{"compute_capability":[9,10]}]`, "compute_capability"},
		{"cc shape", `[{"compute_capability":[9]}]`, "compute_capability"},
		{"cc text", `[{"compute_capability":"9.0"}]`, "compute_capability"},
		{"sm zero", `[{"multiprocessor_count":0}]`, "multiprocessor_count"},
		{"bad uuid", `[{"uuid":"nope"}]`, "uuid"},
		{"bad bus id", `[{"pci_bus_id":"18:00"}]`, "pci_bus_id"},
		{"null device", `[null]`, "null"},
		{"trailing", `[{}] x`, "after the JSON list"},
		{"65 devices", "[" + strings.Repeat("{},", 64) + "{}]", "at most 64"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := cudasim.ParseDevices([]byte(tc.in))
			requireResult(t, cuda.ErrorInvalidValue, cudasim.EnvDevices, err)
			assert.Contains(t, err.Error(), tc.quote)
			assert.Contains(t, err.Error(), "a valid example: [{")
		})
	}
}

func FuzzParseDevices(f *testing.F) {
	for _, s := range []string{`[{}]`, `[]`, `null`, `[{"name":"a","total_memory":1}]`, `[{"compute_capability":[9,0],"uuid":[1,2]}]`,
		`[{"uuid":"GPU-00112233-4455-6677-8899-aabbccddeeff","pci_bus_id":"0000:65:00.0"}]`, `[{"total_memory":-1e400}]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		cfgs, err := cudasim.ParseDevices(b)
		if err != nil {
			var e *cuda.Error
			if !errors.As(err, &e) || e.Result != cuda.ErrorInvalidValue || e.Op != cudasim.EnvDevices {
				t.Fatalf("bad error %v", err)
			}
			return
		}
		if len(cfgs) == 0 || len(cfgs) > cudasim.MaxDevices {
			t.Fatalf("%d devices", len(cfgs))
		}
		// Whatever parses must start.
		d := cudasim.New(cudasim.WithDevices(cfgs...))
		if err := d.Init(); err != nil {
			t.Fatalf("parsed config does not start: %v", err)
		}
	})
}

func TestFromEnv(t *testing.T) {
	t.Run("unset is one H100", func(t *testing.T) {
		t.Setenv(cudasim.EnvDevices, "")
		t.Setenv(cudasim.EnvFaults, "")
		d, err := cudasim.FromEnv()
		require.NoError(t, err)
		require.NoError(t, d.Init())
		n, _ := d.DeviceCount()
		assert.Equal(t, 1, n)
		name, _ := d.DeviceName(0)
		assert.Equal(t, "NVIDIA H100 80GB HBM3", name)
		v, _ := d.Version()
		assert.Equal(t, 13000, v)
	})
	t.Run("tcc device", func(t *testing.T) {
		t.Setenv(cudasim.EnvDevices, `[{"name": "sim-tcc", "total_memory": 1073741824, "memory_pools_supported": false, "tcc_driver": true}]`)
		d, err := cudasim.FromEnv()
		require.NoError(t, err)
		require.NoError(t, d.Init())
		tcc, _ := d.DeviceAttribute(0, cuda.AttrTCCDriver)
		pools, _ := d.DeviceAttribute(0, cuda.AttrMemoryPoolsSupported)
		assert.Equal(t, 1, tcc)
		assert.Equal(t, 0, pools)
		total, _ := d.DeviceTotalMem(0)
		assert.Equal(t, uint64(1<<30), total)
	})
	t.Run("bad devices", func(t *testing.T) {
		t.Setenv(cudasim.EnvDevices, `[`)
		_, err := cudasim.FromEnv()
		requireResult(t, cuda.ErrorInvalidValue, cudasim.EnvDevices, err)
	})
	t.Run("faults", func(t *testing.T) {
		t.Setenv(cudasim.EnvDevices, "")
		t.Setenv(cudasim.EnvFaults, "cuMemAlloc_v2:2:2, cuMemAllocAsync:1:CUDA_ERROR_OUT_OF_MEMORY")
		d, err := cudasim.FromEnv()
		require.NoError(t, err)
		require.NoError(t, d.Init())
		ctx, _ := d.PrimaryCtxRetain(0)
		_, err = d.MemAlloc(ctx, 16)
		require.NoError(t, err)
		_, err = d.MemAlloc(ctx, 16)
		requireResult(t, cuda.ErrorOutOfMemory, "cuMemAlloc_v2", err)
		_, err = d.MemAllocAsync(ctx, 16, cuda.StreamPerThread)
		requireResult(t, cuda.ErrorOutOfMemory, "cuMemAllocAsync", err)
	})
	for _, bad := range []string{"cuMemAlloc_v2", "cuMemAlloc_v2:x:2", "cuMemAlloc_v2:0:2", "cuNope:1:2", "cuMemAlloc_v2:1:0", "cuMemAlloc_v2:1:NOPE", ",", "a:b:c:d"} {
		t.Run("bad faults "+bad, func(t *testing.T) {
			t.Setenv(cudasim.EnvFaults, bad)
			_, err := cudasim.FromEnv()
			requireResult(t, cuda.ErrorInvalidValue, cudasim.EnvFaults, err)
		})
	}
}

func TestConfigViaNew(t *testing.T) {
	d := cudasim.New(cudasim.WithDevices(cudasim.DeviceConfig{ComputeCapability: [2]int{42, 0}}))
	requireResult(t, cuda.ErrorInvalidValue, cudasim.EnvDevices, d.Init())
	d = cudasim.New(cudasim.WithDevices())
	requireResult(t, cuda.ErrorNoDevice, "cuInit", d.Init())
	d = cudasim.New(cudasim.WithDriverVersion(12080))
	v, err := d.Version()
	require.NoError(t, err, "cuDriverGetVersion works before cuInit")
	assert.Equal(t, 12080, v)
}

func TestNotInitialized(t *testing.T) {
	d := cudasim.New()
	_, err := d.DeviceCount()
	requireResult(t, cuda.ErrorNotInitialized, "cuDeviceGetCount", err)
	_, err = d.MemAlloc(0xC7000, 1)
	requireResult(t, cuda.ErrorNotInitialized, "cuMemAlloc_v2", err)
}

// CallCounts sees every call by its entry point, a failed one too, and not the per-device tallies that
// scoped faults count by.
func TestCallCountsShowEveryCall(t *testing.T) {
	e := start(t)
	before := e.d.CallCounts()
	p, err := e.d.MemAlloc(e.ctx, 64)
	require.NoError(t, err)
	require.NoError(t, e.d.MemFree(e.ctx, p))
	requireResult(t, cuda.ErrorInvalidValue, "cuMemFree_v2", e.d.MemFree(e.ctx, p))
	assert.Equal(t, map[string]int{"cuMemAlloc_v2": 1, "cuMemFree_v2": 2}, cudasim.CallsBetween(before, e.d.CallCounts()))
	for k := range e.d.CallCounts() {
		assert.NotContains(t, k, "@", "a per-device tally")
	}
}

func TestFaultInjection(t *testing.T) {
	e := start(t)
	before := e.d.Calls("cuMemAllocAsync")
	e.d.InjectFault("cuMemAllocAsync", 2, cuda.ErrorOutOfMemory)
	e.d.InjectFault("cuStreamSynchronize", 1, cuda.ErrorLaunchFailed)
	p, err := e.d.MemAllocAsync(e.ctx, 64, cuda.StreamPerThread)
	require.NoError(t, err)
	_, err = e.d.MemAllocAsync(e.ctx, 64, cuda.StreamPerThread)
	requireResult(t, cuda.ErrorOutOfMemory, "cuMemAllocAsync", err)
	_, err = e.d.MemAllocAsync(e.ctx, 64, cuda.StreamPerThread)
	require.NoError(t, err, "a fault fires once")
	assert.Equal(t, before+3, e.d.Calls("cuMemAllocAsync"))
	requireResult(t, cuda.ErrorLaunchFailed, "cuStreamSynchronize", e.d.StreamSynchronize(e.ctx, cuda.StreamPerThread))
	e.d.InjectFault("cuMemFreeAsync", 1, cuda.ErrorInvalidValue)
	assert.Equal(t, 1, e.d.ClearFaults(), "the fault injected and not reached")
	assert.Equal(t, 0, e.d.ClearFaults())
	require.NoError(t, e.d.MemFreeAsync(e.ctx, p, cuda.StreamPerThread))
}

func TestDeviceScopedFaults(t *testing.T) {
	d := cudasim.New(cudasim.WithDevices(cudasim.DeviceConfig{}, cudasim.DeviceConfig{}))
	require.NoError(t, d.Init())
	c0, err := d.PrimaryCtxRetain(0)
	require.NoError(t, err)
	c1, err := d.PrimaryCtxRetain(1)
	require.NoError(t, err)
	faults, err := cudasim.ParseFaults("cuMemAlloc_v2@1:2:CUDA_ERROR_OUT_OF_MEMORY,cuMemAlloc_v2:1:2")
	require.NoError(t, err)
	assert.Equal(t, []cudasim.Fault{
		{Entry: "cuMemAlloc_v2", Nth: 2, Code: cuda.ErrorOutOfMemory, Device: 1},
		{Entry: "cuMemAlloc_v2", Nth: 1, Code: cuda.ErrorOutOfMemory, Device: cudasim.AnyDevice},
	}, faults)
	f := faults[0]
	d.InjectDeviceFault(f.Entry, f.Device, f.Nth, f.Code)
	// Calls on device 0 neither count towards device 1's fault nor fail.
	for i := 0; i < 3; i++ {
		_, err := d.MemAlloc(c0, 64)
		require.NoError(t, err)
	}
	_, err = d.MemAlloc(c1, 64)
	require.NoError(t, err, "the first call on device 1")
	_, err = d.MemAlloc(c1, 64)
	requireResult(t, cuda.ErrorOutOfMemory, "cuMemAlloc_v2", err)
	assert.True(t, cuda.Injected(err), "an injected fault's error says so")
	_, err = d.MemAlloc(c1, 64)
	require.NoError(t, err, "a fault fires once")
	d.InjectFault("cuMemAlloc_v2", 1, cuda.ErrorOutOfMemory)
	_, err = d.MemAlloc(c0, 64)
	requireResult(t, cuda.ErrorOutOfMemory, "cuMemAlloc_v2", err)
	_, err = d.MemAlloc(c0, 64)
	require.NoError(t, err)
	// A fault of a call that names a device (not a context) is scoped too.
	d.InjectDeviceFault("cuDeviceGetName", 1, 1, cuda.ErrorUnknown)
	_, err = d.DeviceName(0)
	require.NoError(t, err)
	_, err = d.DeviceName(1)
	requireResult(t, cuda.ErrorUnknown, "cuDeviceGetName", err)

	for _, bad := range []string{"cuMemAlloc_v2@x:1:2", "cuMemAlloc_v2@-1:1:2", "cuInit@0:1:2", "cuMemcpyPeerAsync@1:1:2"} {
		_, err := cudasim.ParseFaults(bad)
		requireResult(t, cuda.ErrorInvalidValue, cudasim.EnvFaults, err)
	}
}

func TestPoolCachingAndTrim(t *testing.T) {
	e := start(t)
	d, c := e.d, e.ctx
	pool, err := d.DeviceDefaultMemPool(0)
	require.NoError(t, err)
	s, err := d.StreamCreate(c, cuda.StreamNonBlocking, 0)
	require.NoError(t, err)
	attr := func(a cuda.MemPoolAttribute) uint64 {
		v, err := d.MemPoolGetAttribute(c, pool, a)
		require.NoError(t, err)
		return v
	}
	free0, total, _ := d.MemGetInfo(c)
	assert.Equal(t, uint64(85017493504), total)
	assert.Equal(t, uint64(84465090560), free0, "the H100's context reserve")
	assert.Zero(t, attr(cuda.PoolAttrReleaseThreshold), "the default threshold is 0")

	const n = 1 << 20
	p, err := d.MemAllocAsync(c, n, s)
	require.NoError(t, err)
	assert.Equal(t, uint64(n), attr(cuda.PoolAttrUsedMemCurrent))
	require.NoError(t, d.MemFreeAsync(c, p, s))
	assert.Zero(t, attr(cuda.PoolAttrUsedMemCurrent))
	assert.Equal(t, uint64(n), attr(cuda.PoolAttrReservedMemCurrent), "freed blocks stay reserved until a synchronize")
	free1, _, _ := d.MemGetInfo(c)
	assert.Equal(t, free0-n, free1)
	q, err := d.MemAllocAsync(c, n, s)
	require.NoError(t, err)
	assert.Equal(t, p, q, "a cached block is reused")
	require.NoError(t, d.MemFreeAsync(c, q, s))
	require.NoError(t, d.StreamSynchronize(c, s))
	assert.Zero(t, attr(cuda.PoolAttrReservedMemCurrent), "threshold 0 trims at every synchronize")
	free2, _, _ := d.MemGetInfo(c)
	assert.Equal(t, free0, free2)

	require.NoError(t, d.MemPoolSetAttribute(c, pool, cuda.PoolAttrReleaseThreshold, ^uint64(0)))
	for i := 0; i < 3; i++ {
		p, err := d.MemAllocAsync(c, n, s)
		require.NoError(t, err)
		require.NoError(t, d.MemFreeAsync(c, p, s))
	}
	require.NoError(t, d.CtxSynchronize(c))
	assert.Equal(t, uint64(n), attr(cuda.PoolAttrReservedMemCurrent), "a max threshold keeps the cache through synchronizes")
	assert.Equal(t, uint64(n), attr(cuda.PoolAttrReservedMemHigh))
	assert.Equal(t, uint64(n), attr(cuda.PoolAttrUsedMemHigh))
	require.NoError(t, d.MemPoolTrimTo(c, pool, 0))
	assert.Zero(t, attr(cuda.PoolAttrReservedMemCurrent))
	require.NoError(t, d.MemPoolSetAttribute(c, pool, cuda.PoolAttrUsedMemHigh, 0))
	assert.Zero(t, attr(cuda.PoolAttrUsedMemHigh))
	requireResult(t, cuda.ErrorInvalidValue, "cuMemPoolSetAttribute", d.MemPoolSetAttribute(c, pool, cuda.PoolAttrUsedMemCurrent, 1))

	// Own pools.
	mp, err := d.MemPoolCreate(c, cuda.PoolProps{})
	require.NoError(t, err)
	r, err := d.MemAllocFromPoolAsync(c, 4096, mp, s)
	require.NoError(t, err)
	require.NoError(t, d.MemFreeAsync(c, r, s))
	require.NoError(t, d.MemPoolDestroy(c, mp))
	_, err = d.MemAllocFromPoolAsync(c, 4096, mp, s)
	requireResult(t, cuda.ErrorInvalidValue, "cuMemAllocFromPoolAsync", err)
	requireResult(t, cuda.ErrorInvalidValue, "cuMemPoolDestroy", d.MemPoolDestroy(c, pool))

	// An OOM gives back this pool's cache first.
	small := start(t, cudasim.WithDevices(cudasim.DeviceConfig{TotalMemory: 64 << 20, MemoryPoolsSupported: true}))
	sp, _ := small.d.DeviceDefaultMemPool(0)
	require.NoError(t, small.d.MemPoolSetAttribute(small.ctx, sp, cuda.PoolAttrReleaseThreshold, ^uint64(0)))
	a, err := small.d.MemAllocAsync(small.ctx, 40<<20, cuda.StreamPerThread)
	require.NoError(t, err)
	require.NoError(t, small.d.MemFreeAsync(small.ctx, a, cuda.StreamPerThread))
	_, err = small.d.MemAllocAsync(small.ctx, 20<<20, cuda.StreamPerThread)
	require.NoError(t, err)
}

func TestNoMemPoolDevice(t *testing.T) {
	e := start(t, cudasim.WithDevices(cudasim.DeviceConfig{Name: "sim-tcc", TotalMemory: 1 << 30, TCCDriver: true}))
	d, c := e.d, e.ctx
	const ns = cuda.ErrorNotSupported
	_, err := d.DeviceDefaultMemPool(0)
	requireResult(t, ns, "cuDeviceGetDefaultMemPool", err)
	_, err = d.MemAllocAsync(c, 1, cuda.StreamPerThread)
	requireResult(t, ns, "cuMemAllocAsync", err)
	_, err = d.MemAllocFromPoolAsync(c, 1, 1, cuda.StreamPerThread)
	requireResult(t, ns, "cuMemAllocFromPoolAsync", err)
	requireResult(t, ns, "cuMemFreeAsync", d.MemFreeAsync(c, 1, cuda.StreamPerThread))
	_, err = d.MemPoolCreate(c, cuda.PoolProps{})
	requireResult(t, ns, "cuMemPoolCreate", err)
	requireResult(t, ns, "cuMemPoolDestroy", d.MemPoolDestroy(c, 1))
	requireResult(t, ns, "cuMemPoolSetAttribute", d.MemPoolSetAttribute(c, 1, cuda.PoolAttrReleaseThreshold, 0))
	_, err = d.MemPoolGetAttribute(c, 1, cuda.PoolAttrReleaseThreshold)
	requireResult(t, ns, "cuMemPoolGetAttribute", err)
	requireResult(t, ns, "cuMemPoolTrimTo", d.MemPoolTrimTo(c, 1, 0))
	// Synchronous allocation still works, and the small device's reserve is scaled down.
	free, total, err := d.MemGetInfo(c)
	require.NoError(t, err)
	assert.Equal(t, uint64(1<<30), total)
	assert.Equal(t, uint64(1<<30-1<<26), free)
	p, err := d.MemAlloc(c, 1<<20)
	require.NoError(t, err)
	require.NoError(t, d.MemFree(c, p))
	tcc, _ := d.DeviceAttribute(0, cuda.AttrTCCDriver)
	assert.Equal(t, 1, tcc)
}

func TestMemoryErrors(t *testing.T) {
	e := start(t)
	d, c := e.d, e.ctx
	p, err := d.MemAlloc(c, 1000)
	require.NoError(t, err)
	assert.Zero(t, uint64(p)%256, "256-byte aligned")
	assert.GreaterOrEqual(t, uint64(p), uint64(1)<<60, "outside any host address range")
	requireResult(t, cuda.ErrorInvalidValue, "cuMemcpyHtoD_v2", d.MemcpyHtoD(c, p+999, []byte{1, 2}))
	requireResult(t, cuda.ErrorInvalidValue, "cuMemcpyDtoH_v2", d.MemcpyDtoH(c, make([]byte, 2), p-1))
	requireResult(t, cuda.ErrorInvalidValue, "cuMemcpyDtoD_v2", d.MemcpyDtoD(c, p, p+500, 501))
	requireResult(t, cuda.ErrorInvalidValue, "cuMemsetD8Async", d.MemsetD8Async(c, p, 1, 1001, cuda.StreamPerThread))
	require.NoError(t, d.MemcpyDtoD(c, p+1, p, 999), "overlapping copies inside one allocation")
	requireResult(t, cuda.ErrorInvalidValue, "cuMemFree_v2", d.MemFree(c, p+8))
	require.NoError(t, d.MemFree(c, p))
	requireResult(t, cuda.ErrorInvalidValue, "cuMemFree_v2", d.MemFree(c, p))
	requireResult(t, cuda.ErrorInvalidValue, "cuMemcpyHtoD_v2", d.MemcpyHtoD(c, p, []byte{1}))
	_, err = d.MemAlloc(c, ^uint64(0))
	requireResult(t, cuda.ErrorOutOfMemory, "cuMemAlloc_v2", err)
	var ce *cuda.Error
	require.ErrorAs(t, err, &ce)
	req, ok := ce.Field("requested")
	assert.True(t, ok)
	assert.Equal(t, fmt.Sprint(^uint64(0)), req)
	requireResult(t, cuda.ErrorInvalidValue, "cuMemFreeHost", d.MemFreeHost(c, make([]byte, 8)))
	h, err := d.MemHostAlloc(c, 100, 0)
	require.NoError(t, err)
	requireResult(t, cuda.ErrorInvalidValue, "cuMemFreeHost", d.MemFreeHost(c, h[1:]))
	require.NoError(t, d.MemFreeHost(c, h))
	requireResult(t, cuda.ErrorInvalidValue, "cuMemFreeHost", d.MemFreeHost(c, h))
	m, err := d.MemAllocManaged(c, 64, cuda.MemAttachGlobal)
	require.NoError(t, err)
	require.NoError(t, d.MemFree(c, m))
	_, err = d.MemAllocManaged(c, 64, 7)
	requireResult(t, cuda.ErrorInvalidValue, "cuMemAllocManaged", err)
}

// The real driver segfaults when handed a destroyed stream; the simulator fails as loudly (by default it
// ends the process), for every entry point that takes a stream, so that CI catches a path that lets a
// destroyed handle through.
func TestDestroyedStreamIsFatal(t *testing.T) {
	type fatal struct{ msg string }
	e := start(t, cudasim.WithFatal(func(msg string) { panic(fatal{msg}) }))
	d, c := e.d, e.ctx
	s, err := d.StreamCreate(c, 0, 0)
	require.NoError(t, err)
	require.NoError(t, d.StreamDestroy(c, s))
	for name, call := range map[string]func(){
		"cuStreamSynchronize": func() { _ = d.StreamSynchronize(c, s) },
		"cuStreamQuery":       func() { _ = d.StreamQuery(c, s) },
		"cuStreamDestroy_v2":  func() { _ = d.StreamDestroy(c, s) },
		"cuMemAllocAsync":     func() { _, _ = d.MemAllocAsync(c, 16, s) },
	} {
		var got any
		func() {
			defer func() { got = recover() }()
			call()
		}()
		if assert.IsType(t, fatal{}, got, name) {
			assert.Contains(t, got.(fatal).msg, name, "the message names the entry point")
			assert.Contains(t, got.(fatal).msg, "destroyed")
		}
	}
	// The device still works after the hook returned control.
	s2, err := d.StreamCreate(c, 0, 0)
	require.NoError(t, err)
	assert.NoError(t, d.StreamSynchronize(c, s2))
}

// A graph that names device memory freed after the capture: on the H100, cuGraphInstantiate crashes for a
// copy node (of either end) and returns CUDA_ERROR_INVALID_VALUE for a memset node. The simulator calls
// the fatal hook for the copy, and gives the memset's error.
func TestInstantiatingAGraphThatNamesFreedMemory(t *testing.T) {
	type fatal struct{ msg string }
	e := start(t, cudasim.WithFatal(func(msg string) { panic(fatal{msg}) }))
	d, c := e.d, e.ctx
	s, err := d.StreamCreate(c, 0, 0)
	require.NoError(t, err)
	const n = 4096
	host := make([]byte, n)
	tests := []struct {
		name    string
		capture func(freed, live cuda.DevicePtr) error
		fatal   bool
	}{
		{"d2d onto itself", func(p, _ cuda.DevicePtr) error { return d.MemcpyDtoDAsync(c, p, p, n, s) }, true},
		{"d2d from freed", func(p, q cuda.DevicePtr) error { return d.MemcpyDtoDAsync(c, q, p, n, s) }, true},
		{"d2d into freed", func(p, q cuda.DevicePtr) error { return d.MemcpyDtoDAsync(c, p, q, n, s) }, true},
		{"h2d into freed", func(p, _ cuda.DevicePtr) error { return d.MemcpyHtoDAsync(c, p, host, s) }, true},
		{"d2h from freed", func(p, _ cuda.DevicePtr) error { return d.MemcpyDtoHAsync(c, host, p, s) }, true},
		{"memset of freed", func(p, _ cuda.DevicePtr) error { return d.MemsetD8Async(c, p, 7, n, s) }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runtime.LockOSThread() // a THREAD_LOCAL or GLOBAL capture must end on the thread that began it
			defer runtime.UnlockOSThread()
			p, err := d.MemAlloc(c, n)
			require.NoError(t, err)
			q, err := d.MemAlloc(c, n)
			require.NoError(t, err)
			defer func() { assert.NoError(t, d.MemFree(c, q)) }()
			require.NoError(t, d.StreamBeginCapture(c, s, cuda.CaptureModeGlobal))
			require.NoError(t, tt.capture(p, q))
			g, err := d.StreamEndCapture(c, s)
			require.NoError(t, err)
			defer func() { assert.NoError(t, d.GraphDestroy(c, g)) }()

			x, err := d.GraphInstantiate(c, g) // while the memory lives, the graph is fine
			require.NoError(t, err)
			require.NoError(t, d.GraphExecDestroy(c, x))
			require.NoError(t, d.MemFree(c, p))
			var got any
			func() {
				defer func() { got = recover() }()
				_, err = d.GraphInstantiate(c, g)
			}()
			if tt.fatal {
				if assert.IsType(t, fatal{}, got) {
					assert.Contains(t, got.(fatal).msg, "cuGraphInstantiateWithFlags")
					assert.Contains(t, got.(fatal).msg, fmt.Sprintf("%#x", uint64(p)))
				}
				return
			}
			assert.Nil(t, got)
			requireResult(t, cuda.ErrorInvalidValue, "cuGraphInstantiateWithFlags", err)
		})
	}
	// The device still works after the hook returned control.
	assert.NoError(t, d.StreamSynchronize(c, s))
}

func TestInvalidHandlesAndDevices(t *testing.T) {
	e := start(t)
	d, c := e.d, e.ctx
	for _, o := range []int{-1, 1, 1 << 30} {
		_, err := d.DeviceGet(o)
		requireResult(t, cuda.ErrorInvalidDevice, "cuDeviceGet", err)
	}
	_, err := d.DeviceName(7)
	requireResult(t, cuda.ErrorInvalidDevice, "cuDeviceGetName", err)
	_, err = d.DeviceAttribute(-3, cuda.AttrWarpSize)
	requireResult(t, cuda.ErrorInvalidDevice, "cuDeviceGetAttribute", err)
	_, err = d.MemAlloc(0, 1)
	requireResult(t, cuda.ErrorInvalidContext, "cuMemAlloc_v2", err)
	_, err = d.MemAlloc(0xdeadbeef, 1)
	requireResult(t, cuda.ErrorInvalidContext, "cuMemAlloc_v2", err)

	s, _ := d.StreamCreate(c, 0, 0)
	ev, _ := d.EventCreate(c, 0)
	require.NoError(t, d.StreamDestroy(c, s))
	require.NoError(t, d.EventDestroy(c, ev))
	requireResult(t, cuda.ErrorInvalidHandle, "cuStreamQuery", d.StreamQuery(c, 0x12345))
	requireResult(t, cuda.ErrorInvalidHandle, "cuEventRecord", d.EventRecord(c, ev, 0))
	requireResult(t, cuda.ErrorInvalidHandle, "cuEventDestroy_v2", d.EventDestroy(c, ev))
	requireResult(t, cuda.ErrorInvalidHandle, "cuMemcpyHtoDAsync_v2", d.MemcpyHtoDAsync(c, 1, nil, 0x12345))
	_, err = d.GraphInstantiate(c, 99)
	requireResult(t, cuda.ErrorInvalidHandle, "cuGraphInstantiateWithFlags", err)
	requireResult(t, cuda.ErrorInvalidHandle, "cuGraphLaunch", d.GraphLaunch(c, 99, 0))
	requireResult(t, cuda.ErrorInvalidHandle, "cuGraphExecDestroy", d.GraphExecDestroy(c, 99))
	requireResult(t, cuda.ErrorInvalidHandle, "cuGraphDestroy", d.GraphDestroy(c, 99))
	_, err = d.GraphNodeCount(c, 99)
	requireResult(t, cuda.ErrorInvalidHandle, "cuGraphGetNodes", err)
	_, err = d.ModuleGetFunction(c, 5, "k")
	requireResult(t, cuda.ErrorInvalidHandle, "cuModuleGetFunction", err)

	// Priorities clamp into the Hopper range.
	least, greatest, err := d.CtxStreamPriorityRange(c)
	require.NoError(t, err)
	assert.Equal(t, []int{0, -5}, []int{least, greatest})
	_, err = d.StreamCreate(c, 0, -100)
	require.NoError(t, err)
	_, err = d.StreamCreate(c, 0x10, 0)
	requireResult(t, cuda.ErrorInvalidValue, "cuStreamCreateWithPriority", err)

	// Releasing the last reference destroys the context.
	require.NoError(t, d.PrimaryCtxRelease(0))
	_, err = d.MemAlloc(c, 1)
	requireResult(t, cuda.ErrorInvalidContext, "cuMemAlloc_v2", err)
	requireResult(t, cuda.ErrorInvalidContext, "cuDevicePrimaryCtxRelease_v2", d.PrimaryCtxRelease(0))
}

func TestCaptureRules(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	e := start(t)
	d, c := e.d, e.ctx
	s, _ := d.StreamCreate(c, cuda.StreamNonBlocking, 0)
	other, _ := d.StreamCreate(c, cuda.StreamNonBlocking, 0)

	onOtherThread := func(f func()) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			f()
		}()
		<-done
	}

	t.Run("begin twice", func(t *testing.T) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		require.NoError(t, d.StreamBeginCapture(c, s, cuda.CaptureModeRelaxed))
		requireResult(t, cuda.ErrorIllegalState, "cuStreamBeginCapture_v2", d.StreamBeginCapture(c, s, cuda.CaptureModeRelaxed))
		requireResult(t, cuda.ErrorInvalidValue, "cuStreamBeginCapture_v2", d.StreamBeginCapture(c, other, 9))
		g, err := d.StreamEndCapture(c, s)
		require.NoError(t, err)
		n, _ := d.GraphNodeCount(c, g)
		assert.Zero(t, n)
	})
	t.Run("wrong thread", func(t *testing.T) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for _, mode := range []cuda.CaptureMode{cuda.CaptureModeGlobal, cuda.CaptureModeThreadLocal} {
			require.NoError(t, d.StreamBeginCapture(c, s, mode))
			onOtherThread(func() {
				_, err := d.StreamEndCapture(c, s)
				requireResult(t, cuda.ErrorStreamCaptureWrongThread, "cuStreamEndCapture", err)
			})
			_, err := d.StreamEndCapture(c, s)
			require.NoError(t, err)
		}
		require.NoError(t, d.StreamBeginCapture(c, s, cuda.CaptureModeRelaxed))
		onOtherThread(func() {
			_, err := d.StreamEndCapture(c, s)
			assert.NoError(t, err, "a relaxed capture may end on another thread")
		})
		// Measured: an invalidated capture ends with 901 from any thread.
		require.NoError(t, d.StreamBeginCapture(c, s, cuda.CaptureModeThreadLocal))
		requireResult(t, cuda.ErrorStreamCaptureUnsupported, "cuStreamSynchronize", d.StreamSynchronize(c, s))
		onOtherThread(func() {
			_, err := d.StreamEndCapture(c, s)
			requireResult(t, cuda.ErrorStreamCaptureInvalidated, "cuStreamEndCapture", err)
		})
		st, _ := d.StreamIsCapturing(c, s)
		assert.Equal(t, cuda.CaptureStatusNone, st)
	})
	t.Run("thread-local spares other threads", func(t *testing.T) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		require.NoError(t, d.StreamBeginCapture(c, s, cuda.CaptureModeThreadLocal))
		onOtherThread(func() {
			p, err := d.MemAlloc(c, 16)
			assert.NoError(t, err)
			assert.NoError(t, d.MemFree(c, p))
			assert.NoError(t, d.StreamSynchronize(c, other))
		})
		st, _ := d.StreamIsCapturing(c, s)
		assert.Equal(t, cuda.CaptureStatusActive, st)
		_, err := d.StreamEndCapture(c, s)
		require.NoError(t, err)
	})
	t.Run("global forbids every thread", func(t *testing.T) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		require.NoError(t, d.StreamBeginCapture(c, s, cuda.CaptureModeGlobal))
		onOtherThread(func() {
			_, err := d.MemAlloc(c, 16)
			requireResult(t, cuda.ErrorStreamCaptureUnsupported, "cuMemAlloc_v2", err)
		})
		st, _ := d.StreamIsCapturing(c, s)
		assert.Equal(t, cuda.CaptureStatusInvalidated, st)
		_, err := d.StreamEndCapture(c, s)
		requireResult(t, cuda.ErrorStreamCaptureInvalidated, "cuStreamEndCapture", err)
	})
	t.Run("sync of the capturing stream", func(t *testing.T) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		require.NoError(t, d.StreamBeginCapture(c, s, cuda.CaptureModeRelaxed))
		requireResult(t, cuda.ErrorStreamCaptureUnsupported, "cuStreamSynchronize", d.StreamSynchronize(c, s))
		requireResult(t, cuda.ErrorStreamCaptureInvalidated, "cuMemsetD8Async", d.MemsetD8Async(c, 1, 0, 0, s))
		_, err := d.StreamEndCapture(c, s)
		requireResult(t, cuda.ErrorStreamCaptureInvalidated, "cuStreamEndCapture", err)
	})
	t.Run("ctx sync during capture", func(t *testing.T) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		require.NoError(t, d.StreamBeginCapture(c, s, cuda.CaptureModeGlobal))
		requireResult(t, cuda.ErrorStreamCaptureUnsupported, "cuCtxSynchronize", d.CtxSynchronize(c))
		_, err := d.StreamEndCapture(c, s)
		requireResult(t, cuda.ErrorStreamCaptureInvalidated, "cuStreamEndCapture", err)
		require.NoError(t, d.CtxSynchronize(c))
	})
	t.Run("non-blocking capture spares the legacy stream", func(t *testing.T) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		p, _ := d.MemAlloc(c, 16)
		require.NoError(t, d.StreamBeginCapture(c, s, cuda.CaptureModeRelaxed))
		require.NoError(t, d.MemcpyHtoD(c, p, make([]byte, 16)))
		st, err := d.StreamIsCapturing(c, cuda.StreamLegacy)
		require.NoError(t, err)
		assert.Equal(t, cuda.CaptureStatusNone, st)
		_, err = d.StreamEndCapture(c, s)
		require.NoError(t, err)
		require.NoError(t, d.MemFree(c, p))
	})
	t.Run("blocking capture and the legacy stream", func(t *testing.T) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		b, _ := d.StreamCreate(c, cuda.StreamDefault, 0)
		require.NoError(t, d.StreamBeginCapture(c, b, cuda.CaptureModeRelaxed))
		_, err := d.StreamIsCapturing(c, cuda.StreamLegacy)
		requireResult(t, cuda.ErrorStreamCaptureImplicit, "cuStreamIsCapturing", err)
		requireResult(t, cuda.ErrorStreamCaptureImplicit, "cuMemsetD8Async", d.MemsetD8Async(c, 1, 0, 0, 0))
		_, err = d.StreamEndCapture(c, b)
		requireResult(t, cuda.ErrorStreamCaptureInvalidated, "cuStreamEndCapture", err)
	})
	t.Run("captured events", func(t *testing.T) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		ev, _ := d.EventCreate(c, 0)
		require.NoError(t, d.StreamBeginCapture(c, s, cuda.CaptureModeRelaxed))
		require.NoError(t, d.EventRecord(c, ev, s))
		require.NoError(t, d.StreamWaitEvent(c, s, ev))
		require.NoError(t, d.StreamWaitEvent(c, other, ev), "other joins the capture")
		st, _ := d.StreamIsCapturing(c, other)
		assert.Equal(t, cuda.CaptureStatusActive, st)
		requireResult(t, cuda.ErrorCapturedEvent, "cuEventQuery", d.EventQuery(c, ev))
		st, _ = d.StreamIsCapturing(c, s)
		assert.Equal(t, cuda.CaptureStatusInvalidated, st, "a 907 invalidates the capture, as measured")
		st, _ = d.StreamIsCapturing(c, other)
		assert.Equal(t, cuda.CaptureStatusInvalidated, st, "for every stream of the capture")
		_, err := d.StreamEndCapture(c, s)
		requireResult(t, cuda.ErrorStreamCaptureInvalidated, "cuStreamEndCapture", err)
		require.NoError(t, d.EventRecord(c, ev, other))
		require.NoError(t, d.EventQuery(c, ev))
	})
	t.Run("graph memory and update", func(t *testing.T) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		free0, _, _ := d.MemGetInfo(c)
		require.NoError(t, d.StreamBeginCapture(c, s, cuda.CaptureModeThreadLocal))
		p, err := d.MemAllocAsync(c, 1<<20, s)
		require.NoError(t, err)
		require.NoError(t, d.MemsetD8Async(c, p, 7, 1<<20, s))
		out := make([]byte, 4)
		require.NoError(t, d.MemcpyDtoHAsync(c, out, p+100, s))
		require.NoError(t, d.MemFreeAsync(c, p, s))
		g, err := d.StreamEndCapture(c, s)
		require.NoError(t, err)
		n, _ := d.GraphNodeCount(c, g)
		assert.Equal(t, 4, n)
		x, err := d.GraphInstantiate(c, g)
		require.NoError(t, err)
		require.NoError(t, d.GraphLaunch(c, x, s))
		assert.Equal(t, []byte{7, 7, 7, 7}, out)
		free1, _, _ := d.MemGetInfo(c)
		assert.Equal(t, free0-1<<20, free1, "graph memory is held while the graph exists")

		require.NoError(t, d.StreamBeginCapture(c, s, cuda.CaptureModeThreadLocal))
		require.NoError(t, d.MemsetD8Async(c, p, 7, 1, s))
		g2, err := d.StreamEndCapture(c, s)
		require.NoError(t, err)
		requireResult(t, cuda.ErrorGraphExecUpdateFailure, "cuGraphExecUpdate_v2", d.GraphExecUpdate(c, x, g2))
		require.NoError(t, d.GraphExecUpdate(c, x, g))
		require.NoError(t, d.GraphDestroy(c, g2))
		require.NoError(t, d.GraphDestroy(c, g))
		require.NoError(t, d.GraphLaunch(c, x, s), "the exec outlives its graph")
		require.NoError(t, d.GraphExecDestroy(c, x))
		free2, _, _ := d.MemGetInfo(c)
		assert.Equal(t, free0, free2)
		requireResult(t, cuda.ErrorInvalidHandle, "cuGraphLaunch", d.GraphLaunch(c, x, s))
	})
	t.Run("invalidated capture gives back graph memory", func(t *testing.T) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		free0, _, _ := d.MemGetInfo(c)
		require.NoError(t, d.StreamBeginCapture(c, s, cuda.CaptureModeGlobal))
		_, err := d.MemAllocAsync(c, 1<<20, s)
		require.NoError(t, err)
		_, err = d.MemAlloc(c, 1)
		requireResult(t, cuda.ErrorStreamCaptureUnsupported, "cuMemAlloc_v2", err)
		_, err = d.StreamEndCapture(c, s)
		requireResult(t, cuda.ErrorStreamCaptureInvalidated, "cuStreamEndCapture", err)
		free1, _, _ := d.MemGetInfo(c)
		assert.Equal(t, free0, free1)
	})
}

func TestLimitsSim(t *testing.T) {
	e := start(t, cudasim.WithDevices(cudasim.H100(), cudasim.DeviceConfig{TotalMemory: 8 << 30, ComputeCapability: [2]int{7, 5}}))
	d, c := e.d, e.ctx
	get := func(c cuda.Context, l cuda.Limit) uint64 {
		v, err := d.CtxGetLimit(c, l)
		require.NoError(t, err)
		return v
	}
	for l, want := range map[cuda.Limit]uint64{cuda.LimitDevRuntimePendingLaunchCount: 2048,
		cuda.LimitMaxL2FetchGranularity: 64, cuda.LimitPersistingL2CacheSize: 9830400} {
		assert.Equal(t, want, get(c, l), "limit %d", l)
	}
	require.NoError(t, d.CtxSetLimit(c, cuda.LimitMallocHeapSize, 64<<40))
	assert.Equal(t, uint64(17681179680), get(c, cuda.LimitMallocHeapSize))
	// Measured on the H100: above the maximum is refused, not clamped; sync depth is unsupported (CDP2);
	// an unknown limit is INVALID_VALUE.
	requireResult(t, cuda.ErrorInvalidValue, "cuCtxSetLimit", d.CtxSetLimit(c, cuda.LimitPersistingL2CacheSize, 1<<40))
	require.NoError(t, d.CtxSetLimit(c, cuda.LimitPersistingL2CacheSize, 1<<20))
	assert.Equal(t, uint64(3276800), get(c, cuda.LimitPersistingL2CacheSize), "rounded up to a tenth of the maximum, as on the H100")
	require.NoError(t, d.CtxSetLimit(c, cuda.LimitStackSize, 1000))
	assert.Equal(t, uint64(1008), get(c, cuda.LimitStackSize), "16-byte granules, as on the H100")
	_, err := d.CtxGetLimit(c, cuda.LimitDevRuntimeSyncDepth)
	requireResult(t, cuda.ErrorUnsupportedLimit, "cuCtxGetLimit", err)
	requireResult(t, cuda.ErrorInvalidValue, "cuCtxSetLimit", d.CtxSetLimit(c, 42, 1))
	_, err = d.CtxGetLimit(c, 42)
	requireResult(t, cuda.ErrorInvalidValue, "cuCtxGetLimit", err)

	c1, err := d.PrimaryCtxRetain(1)
	require.NoError(t, err)
	require.NoError(t, d.CtxSetLimit(c1, cuda.LimitMallocHeapSize, 64<<40))
	assert.Equal(t, uint64(1786457947), get(c1, cuda.LimitMallocHeapSize), "the clamp scales with the device")
	requireResult(t, cuda.ErrorUnsupportedLimit, "cuCtxSetLimit", d.CtxSetLimit(c1, cuda.LimitPersistingL2CacheSize, 1))
	v, err := d.CtxGetLimit(c1, cuda.LimitDevRuntimeSyncDepth)
	require.NoError(t, err, "cc 7.5 still has the sync depth limit")
	assert.Equal(t, uint64(2), v)
}

func TestModules(t *testing.T) {
	e := start(t)
	d, c := e.d, e.ctx
	ptx := []byte("//\n// Generated\n.version 8.5\n.target sm_90\n.address_size 64\n\n.visible .entry add_one(\n.param .u64 p)\n{ ret; }\n.entry _Z3fooPf (\n){ret;}\n\x00")
	m, err := d.ModuleLoadData(c, ptx)
	require.NoError(t, err)
	f, err := d.ModuleGetFunction(c, m, "add_one")
	require.NoError(t, err)
	_, err = d.ModuleGetFunction(c, m, "_Z3fooPf")
	require.NoError(t, err)
	_, err = d.ModuleGetFunction(c, m, "missing")
	requireResult(t, cuda.ErrorNotFound, "cuModuleGetFunction", err)
	v, err := d.FuncGetAttribute(c, f, cuda.FuncAttrMaxThreadsPerBlock)
	require.NoError(t, err)
	assert.Equal(t, 1024, v)
	err = d.LaunchKernel(c, f, cuda.Dim3{1, 1, 1}, cuda.Dim3{32, 1, 1}, 0, 0, nil)
	requireResult(t, cuda.ErrorNotSupported, "cuLaunchKernel", err)
	assert.Contains(t, err.Error(), "the simulator does not run device code")
	err = d.LaunchKernel(c, f, cuda.Dim3{1, 1, 1}, cuda.Dim3{2048, 1, 1}, 0, 0, nil)
	requireResult(t, cuda.ErrorInvalidValue, "cuLaunchKernel", err)
	require.NoError(t, d.ModuleUnload(c, m))
	_, err = d.FuncGetAttribute(c, f, cuda.FuncAttrNumRegs)
	requireResult(t, cuda.ErrorInvalidHandle, "cuFuncGetAttribute", err)
	requireResult(t, cuda.ErrorInvalidHandle, "cuModuleUnload", d.ModuleUnload(c, m))

	for name, img := range map[string][]byte{"empty": nil, "nul": {0}, "garbage": []byte("hello")} {
		_, err := d.ModuleLoadData(c, img)
		requireResult(t, cuda.ErrorInvalidImage, "cuModuleLoadData", err)
		_ = name
	}
	_, err = d.ModuleLoadData(c, []byte(".version 8.5\n.target sm_100\n"))
	requireResult(t, cuda.ErrorInvalidPTX, "cuModuleLoadData", err)
	fat := append([]byte{0x50, 0xED, 0x55, 0xBA, 1, 0, 0x10, 0}, bytes.Repeat([]byte{0}, 64)...)
	fm, err := d.ModuleLoadData(c, fat)
	require.NoError(t, err)
	_, err = d.ModuleGetFunction(c, fm, "anything")
	require.NoError(t, err, "a fatbin whose kernels cannot be listed resolves any name")
	elfish := append([]byte("\x7fELF"), bytes.Repeat([]byte{0xff}, 100)...)
	_, err = d.ModuleLoadData(c, elfish)
	require.NoError(t, err)
}

// TestConcurrency runs 32 goroutines allocating, copying and freeing at once; run it with -race.
func TestConcurrency(t *testing.T) {
	e := start(t, cudasim.WithDevices(cudasim.H100(), cudasim.DeviceConfig{TotalMemory: 1 << 30, MemoryPoolsSupported: true}))
	d := e.d
	c1, err := d.PrimaryCtxRetain(1)
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			c := e.ctx
			if g%2 == 1 {
				c = c1
			}
			s, err := d.StreamCreate(c, cuda.StreamNonBlocking, 0)
			if err != nil {
				errs <- err
				return
			}
			for i := 0; i < 50; i++ {
				n := 64 + (g*7+i*13)%4096
				src := bytes.Repeat([]byte{byte(g), byte(i)}, n/2)
				var p cuda.DevicePtr
				if i%2 == 0 {
					p, err = d.MemAlloc(c, uint64(len(src)))
				} else {
					p, err = d.MemAllocAsync(c, uint64(len(src)), s)
				}
				if err != nil {
					errs <- err
					return
				}
				got := make([]byte, len(src))
				if err := d.MemcpyHtoDAsync(c, p, src, s); err != nil {
					errs <- err
					return
				}
				if err := d.MemcpyDtoHAsync(c, got, p, s); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(src, got) {
					errs <- fmt.Errorf("goroutine %d: bytes differ", g)
					return
				}
				if i%2 == 0 {
					err = d.MemFree(c, p)
				} else {
					err = d.MemFreeAsync(c, p, s)
				}
				if err != nil {
					errs <- err
					return
				}
				if _, _, err := d.MemGetInfo(c); err != nil {
					errs <- err
					return
				}
			}
			if err := d.StreamSynchronize(c, s); err != nil {
				errs <- err
			}
			if err := d.StreamDestroy(c, s); err != nil {
				errs <- err
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, c := range []cuda.Context{e.ctx, c1} {
		require.NoError(t, d.CtxSynchronize(c))
	}
	free, total, _ := d.MemGetInfo(e.ctx)
	assert.Equal(t, uint64(84465090560), free, "everything was given back (total %d)", total)
}

// FuzzAccounting runs random allocation sequences and checks that free memory never goes negative and
// that allocated plus free plus the context reserve always make the total.
func FuzzAccounting(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 200, 17, 99})
	f.Add([]byte{0, 0, 0, 255, 255, 255})
	f.Fuzz(func(t *testing.T, ops []byte) {
		d := cudasim.New(cudasim.WithDevices(cudasim.DeviceConfig{TotalMemory: 1 << 24, MemoryPoolsSupported: true}))
		if err := d.Init(); err != nil {
			t.Fatal(err)
		}
		c, _ := d.PrimaryCtxRetain(0)
		pool, _ := d.DeviceDefaultMemPool(0)
		_, total, _ := d.MemGetInfo(c)
		reserve := min(uint64(552402944), total/16)
		var live []cuda.DevicePtr
		syncSize := map[cuda.DevicePtr]uint64{} // accounted size of each MemAlloc block; pool blocks are in the pool's figures
		var syncOut uint64
		for i, op := range ops {
			size := uint64(op)*uint64(op)*257 + 1
			switch op % 5 {
			case 0, 1:
				p, err := d.MemAlloc(c, size)
				if err == nil {
					live = append(live, p)
					syncSize[p] = (size + 255) &^ 255
					syncOut += syncSize[p]
				} else if cuda.ResultOf(err) != cuda.ErrorOutOfMemory {
					t.Fatal(err)
				}
			case 2:
				p, err := d.MemAllocAsync(c, size, cuda.StreamPerThread)
				if err == nil {
					live = append(live, p)
				} else if cuda.ResultOf(err) != cuda.ErrorOutOfMemory {
					t.Fatal(err)
				}
			case 3:
				if len(live) > 0 {
					k := i % len(live)
					p := live[k]
					live = append(live[:k], live[k+1:]...)
					var err error
					if op%2 == 0 {
						err = d.MemFree(c, p)
					} else {
						err = d.MemFreeAsync(c, p, cuda.StreamPerThread)
					}
					if err != nil {
						t.Fatal(err)
					}
					syncOut -= syncSize[p]
					delete(syncSize, p)
				}
			case 4:
				if err := d.StreamSynchronize(c, cuda.StreamPerThread); err != nil {
					t.Fatal(err)
				}
			}
			free, tot, err := d.MemGetInfo(c)
			if err != nil || tot != total {
				t.Fatalf("total %d err %v", tot, err)
			}
			reserved, _ := d.MemPoolGetAttribute(c, pool, cuda.PoolAttrReservedMemCurrent)
			used, _ := d.MemPoolGetAttribute(c, pool, cuda.PoolAttrUsedMemCurrent)
			if free+reserve+syncOut+reserved != total || used > reserved {
				t.Fatalf("free %d + reserve %d + allocated %d + pool reserved %d != total %d (pool used %d)", free, reserve, syncOut, reserved, total, used)
			}
		}
		for _, p := range live {
			if err := d.MemFree(c, p); err != nil {
				t.Fatal(err)
			}
		}
		if err := d.CtxSynchronize(c); err != nil {
			t.Fatal(err)
		}
		free, _, _ := d.MemGetInfo(c)
		if free+reserve != total {
			t.Fatalf("leak: free %d + reserve %d != total %d", free, reserve, total)
		}
	})
}
