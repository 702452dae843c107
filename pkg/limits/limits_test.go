package limits_test

import (
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
	"github.com/cudacore/cudacore/pkg/limits"
)

// h100 is the device of docs/contributing/driver-facts.md as validation sees it.
var h100 = limits.DeviceInfo{Ordinal: 0, Name: "NVIDIA H100 80GB HBM3", TotalMemory: 85017493504,
	L2CacheSize: 52428800, MaxPersistingL2CacheSize: 51904512}

func open(t *testing.T, opts ...cudasim.Option) (*cudasim.Driver, cuda.Context) {
	t.Helper()
	drv := cudasim.New(opts...)
	require.NoError(t, drv.Init())
	dev, err := drv.DeviceGet(0)
	require.NoError(t, err)
	ctx, err := drv.PrimaryCtxRetain(dev)
	require.NoError(t, err)
	return drv, ctx
}

func cudaErr(t *testing.T, err error) *cuda.Error {
	t.Helper()
	var e *cuda.Error
	require.True(t, errors.As(err, &e), "want a *cuda.Error, got %T: %v", err, err)
	return e
}

// The defaults the H100 reported (docs/contributing/driver-facts.md, Limits), read through the simulator.
func TestDefaultsMatchDriverFacts(t *testing.T) {
	drv, ctx := open(t)
	for name, want := range map[string]uint64{
		"malloc_heap_size": 8388608,
		"stack_size":       1024,
		"printf_fifo_size": 8650752,
	} {
		got, err := limits.Get(drv, ctx, h100, name)
		require.NoError(t, err, name)
		assert.Equal(t, want, got, name)
	}
	// The H100 answers CUDA_ERROR_UNSUPPORTED_LIMIT for the device-runtime sync depth (measured; the
	// simulator reproduces it for compute capability 9 and up), and only for that limit.
	all, unsupported, err := limits.All(drv, ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"dev_runtime_sync_depth"}, unsupported)
	assert.Len(t, all, len(limits.Names())-1)
}

func TestSetReadsBack(t *testing.T) {
	drv, ctx := open(t)
	a, err := limits.Set(drv, ctx, h100, "malloc_heap_size", 256<<20, false)
	require.NoError(t, err)
	assert.Equal(t, limits.Applied{Name: "malloc_heap_size", Unit: limits.Bytes, Requested: 268435456,
		Applied: 268435456, Previous: 8388608}, a)
	got, err := limits.Get(drv, ctx, h100, "malloc_heap_size")
	require.NoError(t, err)
	assert.Equal(t, uint64(268435456), got)
}

// docs/contributing/driver-facts.md: 64 TiB returns CUDA_SUCCESS and reads back 17,681,179,680.
func TestClampIsReported(t *testing.T) {
	drv, ctx := open(t)
	a, err := limits.Set(drv, ctx, h100, "malloc_heap_size", 64<<40, false)
	require.NoError(t, err)
	assert.True(t, a.Clamped)
	assert.Equal(t, uint64(70368744177664), a.Requested)
	assert.Equal(t, uint64(17681179680), a.Applied)
	assert.Equal(t, "the driver clamped malloc_heap_size: asked 70,368,744,177,664 bytes (64.0 TiB), "+
		"applied 17,681,179,680 bytes (16.5 GiB)", a.Message)
}

func TestStrictClampIsAnErrorAndRestores(t *testing.T) {
	drv, ctx := open(t)
	_, err := limits.Set(drv, ctx, h100, "malloc_heap_size", 32<<20, false)
	require.NoError(t, err)
	a, err := limits.Set(drv, ctx, h100, "malloc_heap_size", 64<<40, true)
	require.Error(t, err)
	assert.True(t, a.Clamped)
	e := cudaErr(t, err)
	assert.Equal(t, cuda.ErrorInvalidValue, e.Result)
	assert.Contains(t, e.Msg, "asked 70,368,744,177,664 bytes (64.0 TiB), applied 17,681,179,680 bytes (16.5 GiB)")
	assert.Contains(t, e.Msg, "previous value 33,554,432 bytes (32.0 MiB) was restored")
	v, _ := e.Field("applied")
	assert.Equal(t, "17681179680", v)
	got, err := limits.Get(drv, ctx, h100, "malloc_heap_size")
	require.NoError(t, err)
	assert.Equal(t, uint64(32<<20), got)
}

func TestValidationBeforeTheDriver(t *testing.T) {
	cases := []struct {
		name  string
		limit string
		value uint64
		want  []string
	}{
		{"unknown name", "heap", 1, []string{`unknown limit "heap"`, "malloc_heap_size", "stack_size", "persisting_l2_cache_size"}},
		{"heap beyond the address space", "malloc_heap_size", 1 << 50, []string{"malloc_heap_size = 1,125,899,906,842,624 bytes (1.0 PiB)",
			"larger than the " + limits.FormatValue(limits.AddressSpace, limits.Bytes) + " a process can address at all"}},
		{"stack beyond local memory", "stack_size", 1 << 20, []string{"local memory", "524,288 bytes (512.0 KiB)"}},
		{"granularity not allowed", "max_l2_fetch_granularity", 100, []string{"0, 32, 64, 128"}},
		{"sync depth too deep", "dev_runtime_sync_depth", 25, []string{"24 levels"}},
		{"pending launches zero", "dev_runtime_pending_launch_count", 0, []string{"least allowed value is 1 launches"}},
		{"persisting L2 beyond its maximum", "persisting_l2_cache_size", 51904513, []string{"at most 51,904,512 bytes (49.5 MiB)", "50.0 MiB L2 cache"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			drv, ctx := open(t)
			before := drv.Calls("cuCtxSetLimit") + drv.Calls("cuCtxGetLimit")
			_, err := limits.Set(drv, ctx, h100, c.limit, c.value, false)
			require.Error(t, err)
			e := cudaErr(t, err)
			assert.Equal(t, cuda.ErrorInvalidValue, e.Result)
			assert.True(t, errors.Is(err, cuda.ErrInvalidValue))
			for _, w := range c.want {
				assert.Contains(t, e.Msg, w)
			}
			assert.Equal(t, before, drv.Calls("cuCtxSetLimit")+drv.Calls("cuCtxGetLimit"), "the driver was called")
		})
	}
}

// The address space bound is the machine's: 128 TiB on x86-64, 256 TiB on aarch64 (make check-aarch64 runs
// this package's tests emulated), so a heap between the two is refused on x86-64 only.
func TestAddressSpaceIsTheMachines(t *testing.T) {
	want := map[string]uint64{"amd64": 1 << 47, "arm64": 1 << 48}[runtime.GOARCH]
	require.NotZero(t, want, "no address space known for %s", runtime.GOARCH)
	assert.Equal(t, want, limits.AddressSpace)
	heap, err := limits.Lookup("malloc_heap_size")
	require.NoError(t, err)
	require.NoError(t, heap.Check(h100, want))
	err = heap.Check(h100, want+1)
	require.Error(t, err)
	assert.Contains(t, err.Error(), limits.HumanBytes(want)+") a process can address at all")
}

func TestCheckSigned(t *testing.T) {
	_, err := limits.CheckSigned("stack_size", -1)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "stack_size = -1 is not valid: a limit cannot be negative")
	v, err := limits.CheckSigned("stack_size", 4096)
	require.NoError(t, err)
	assert.Equal(t, uint64(4096), v)
}

// docs/contributing/driver-facts.md: after a kernel that called malloc has run, setting the heap returns 1 and the old value
// stays. The simulator runs no kernels, so the driver's answer is injected.
func TestHeapFixedAfterMallocKernelStatesTheRule(t *testing.T) {
	drv, ctx := open(t)
	drv.InjectFault("cuCtxSetLimit", 1, cuda.ErrorInvalidValue)
	_, err := limits.Set(drv, ctx, h100, "malloc_heap_size", 1<<30, false)
	require.Error(t, err)
	e := cudaErr(t, err)
	assert.Equal(t, cuda.ErrorInvalidValue, e.Result)
	assert.Equal(t, "cuCtxSetLimit", e.Op)
	assert.Contains(t, e.Msg, "cannot set malloc_heap_size to 1,073,741,824 bytes (1.0 GiB) (it stays 8,388,608 bytes (8.0 MiB), unchanged)")
	assert.Contains(t, e.Msg, "fixed once a kernel that uses device malloc has been launched")
	assert.Contains(t, e.Msg, "at start-up")

	// Another limit refused the same way gets no such rule.
	drv.InjectFault("cuCtxSetLimit", 1, cuda.ErrorInvalidValue)
	_, err = limits.Set(drv, ctx, h100, "stack_size", 4096, false)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "malloc")
	assert.Contains(t, err.Error(), "the driver refused stack_size = 4,096 bytes (4.0 KiB)")
}

func TestUnsupportedLimit(t *testing.T) {
	// A compute capability 7.0 device has no persisting L2 cache: the simulator answers 215.
	drv, ctx := open(t, cudasim.WithDevices(cudasim.DeviceConfig{Name: "sim-volta", ComputeCapability: [2]int{7, 0}}))
	dev := limits.DeviceInfo{Name: "sim-volta"}
	_, err := limits.Get(drv, ctx, dev, "persisting_l2_cache_size")
	require.Error(t, err)
	assert.True(t, errors.Is(err, cuda.ErrNotSupported))
	assert.Contains(t, err.Error(), "device 0 (sim-volta) does not support the limit persisting_l2_cache_size")
	_, err = limits.Set(drv, ctx, dev, "persisting_l2_cache_size", 1<<20, false)
	assert.True(t, errors.Is(err, cuda.ErrNotSupported))
	all, unsupported, err := limits.All(drv, ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"persisting_l2_cache_size"}, unsupported)
	assert.NotContains(t, all, "persisting_l2_cache_size")
}

func TestFormat(t *testing.T) {
	assert.Equal(t, "0", limits.Commas(0))
	assert.Equal(t, "999", limits.Commas(999))
	assert.Equal(t, "1,000", limits.Commas(1000))
	assert.Equal(t, "18,446,744,073,709,551,615", limits.Commas(^uint64(0)))
	assert.Equal(t, "512 bytes", limits.FormatValue(512, limits.Bytes))
	assert.Equal(t, "2 levels", limits.FormatValue(2, limits.Levels))
	assert.Equal(t, "16.0 EiB", limits.HumanBytes(^uint64(0)))
}

// FuzzLimitValue: validation never panics, accepts exactly what the spec allows, and a value it accepts
// that reaches the simulator reads back as asked or is reported clamped.
func FuzzLimitValue(f *testing.F) {
	for _, s := range []uint64{0, 1, 32, 100, 1024, 8388608, 64 << 40, 1 << 47, 1<<47 + 1, ^uint64(0)} {
		for i := range limits.Names() {
			f.Add(uint8(i), s)
		}
	}
	drv := cudasim.New()
	if err := drv.Init(); err != nil {
		f.Fatal(err)
	}
	ctx, err := drv.PrimaryCtxRetain(0)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, which uint8, v uint64) {
		specs := limits.Specs()
		s := specs[int(which)%len(specs)]
		err := s.Check(h100, v)
		if err != nil {
			require.True(t, errors.Is(err, cuda.ErrInvalidValue))
			require.True(t, strings.HasPrefix(err.(*cuda.Error).Msg, s.Name+" = "))
			return
		}
		require.GreaterOrEqual(t, v, s.Min)
		if s.Max > 0 {
			require.LessOrEqual(t, v, s.Max)
		}
		a, err := limits.Set(drv, ctx, h100, s.Name, v, false)
		if s.Name == "dev_runtime_sync_depth" {
			require.ErrorIs(t, err, cuda.ErrNotSupported, "the H100 does not support this limit")
			return
		}
		require.NoError(t, err)
		require.Equal(t, a.Applied != v, a.Clamped)
		if a.Clamped {
			require.Contains(t, a.Message, limits.Commas(v))
		}
	})
}
