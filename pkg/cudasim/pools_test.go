package cudasim_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
)

// The current pool and pool properties, beyond what the conformance suite asserts on both drivers: the
// errors the driver documents for pools it refuses to make current, which a real process cannot provoke
// safely (a destroyed handle) or without a second process (an imported pool).

func twoPoolDevices() cudasim.Option {
	return cudasim.WithDevices(
		cudasim.DeviceConfig{Name: "sim0", TotalMemory: 1 << 30, MemoryPoolsSupported: true},
		cudasim.DeviceConfig{Name: "sim1", TotalMemory: 1 << 30, MemoryPoolsSupported: true},
	)
}

func TestSetMemPoolRefusals(t *testing.T) {
	e := start(t, twoPoolDevices())
	d, c := e.d, e.ctx
	c1, err := d.PrimaryCtxRetain(1)
	require.NoError(t, err)
	def, err := d.DeviceDefaultMemPool(0)
	require.NoError(t, err)

	destroyed, err := d.MemPoolCreate(c, cuda.PoolProps{})
	require.NoError(t, err)
	require.NoError(t, d.MemPoolDestroy(c, destroyed))
	other, err := d.MemPoolCreate(c1, cuda.PoolProps{Device: 1})
	require.NoError(t, err)
	exportable, err := d.MemPoolCreate(c, cuda.PoolProps{HandleTypes: cuda.HandlePosixFD})
	require.NoError(t, err)
	fd, err := d.MemPoolExportToShareableHandle(c, exportable, cuda.HandlePosixFD)
	require.NoError(t, err)
	defer os.NewFile(uintptr(fd), "pool").Close()
	imported, err := d.MemPoolImportFromShareableHandle(c, fd, cuda.HandlePosixFD)
	require.NoError(t, err)

	cases := []struct {
		name string
		dev  cuda.Device
		pool cuda.MemPool
		want cuda.Result
	}{
		{"a handle that is no pool", 0, 0xdead, cuda.ErrorInvalidValue},
		{"a destroyed pool", 0, destroyed, cuda.ErrorInvalidValue},
		{"a pool of another device", 0, other, cuda.ErrorInvalidValue},
		{"an imported pool", 0, imported, cuda.ErrorInvalidValue},
		{"a device that does not exist", 7, def, cuda.ErrorInvalidDevice},
		{"an exportable pool of the device", 0, exportable, cuda.Success},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := d.DeviceSetMemPool(tc.dev, tc.pool)
			if tc.want == cuda.Success {
				require.NoError(t, err)
				require.NoError(t, d.DeviceSetMemPool(0, def))
				return
			}
			requireResult(t, tc.want, "cuDeviceSetMemPool", err)
			cur, err := d.DeviceGetMemPool(0)
			require.NoError(t, err)
			assert.Equal(t, def, cur, "a refusal changes nothing")
		})
	}
	_, err = d.DeviceGetMemPool(7)
	requireResult(t, cuda.ErrorInvalidDevice, "cuDeviceGetMemPool", err)
}

func TestCurrentPoolWithoutPools(t *testing.T) {
	e := start(t, cudasim.WithDevices(cudasim.DeviceConfig{Name: "sim-tcc", TotalMemory: 1 << 30, TCCDriver: true}))
	_, err := e.d.DeviceGetMemPool(0)
	requireResult(t, cuda.ErrorNotSupported, "cuDeviceGetMemPool", err)
	requireResult(t, cuda.ErrorNotSupported, "cuDeviceSetMemPool", e.d.DeviceSetMemPool(0, 1))
}

// The current pool is per device, and a destroyed context takes its pools with it: the default pool is
// current again in the next one.
func TestCurrentPoolPerDeviceAndContext(t *testing.T) {
	e := start(t, twoPoolDevices())
	d, c := e.d, e.ctx
	c1, err := d.PrimaryCtxRetain(1)
	require.NoError(t, err)
	pool, err := d.MemPoolCreate(c, cuda.PoolProps{})
	require.NoError(t, err)
	require.NoError(t, d.DeviceSetMemPool(0, pool))
	def1, err := d.DeviceDefaultMemPool(1)
	require.NoError(t, err)
	cur1, err := d.DeviceGetMemPool(1)
	require.NoError(t, err)
	assert.Equal(t, def1, cur1, "device 1 keeps its own current pool")
	p, err := d.MemAllocAsync(c1, 1<<20, cuda.StreamLegacy)
	require.NoError(t, err)
	used, err := d.MemPoolGetAttribute(c, pool, cuda.PoolAttrUsedMemCurrent)
	require.NoError(t, err)
	assert.Zero(t, used, "device 1's cuMemAllocAsync does not touch device 0's current pool")
	require.NoError(t, d.MemFreeAsync(c1, p, cuda.StreamLegacy))

	require.NoError(t, d.PrimaryCtxRelease(0))
	c, err = d.PrimaryCtxRetain(0)
	require.NoError(t, err)
	def0, err := d.DeviceDefaultMemPool(0)
	require.NoError(t, err)
	cur0, err := d.DeviceGetMemPool(0)
	require.NoError(t, err)
	assert.Equal(t, def0, cur0)
	_, err = d.MemPoolGetAttribute(c, pool, cuda.PoolAttrUsedMemCurrent)
	requireResult(t, cuda.ErrorInvalidValue, "cuMemPoolGetAttribute", err)
}

func TestPoolMaxSize(t *testing.T) {
	cases := []struct {
		name    string
		version int
		want    cuda.Result
	}{
		{"CUDA 12.0 has no maxSize", 12000, cuda.ErrorNotSupported},
		{"CUDA 12.2 has it", 12020, cuda.Success},
		{"CUDA 13.0", 13000, cuda.Success},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := start(t, cudasim.WithDriverVersion(tc.version))
			pool, err := e.d.MemPoolCreate(e.ctx, cuda.PoolProps{MaxSize: 64 << 20})
			if tc.want != cuda.Success {
				requireResult(t, tc.want, "cuMemPoolCreate", err)
				assert.Contains(t, err.Error(), "CUDA 12.2")
				_, err = e.d.MemPoolCreate(e.ctx, cuda.PoolProps{})
				assert.NoError(t, err, "a pool without a maximum size is made as before")
				return
			}
			require.NoError(t, err)
			require.NoError(t, e.d.MemPoolSetAttribute(e.ctx, pool, cuda.PoolAttrReleaseThreshold, ^uint64(0)))
			a, err := e.d.MemAllocFromPoolAsync(e.ctx, 48<<20, pool, cuda.StreamLegacy)
			require.NoError(t, err)
			_, err = e.d.MemAllocFromPoolAsync(e.ctx, 32<<20, pool, cuda.StreamLegacy)
			requireResult(t, cuda.ErrorOutOfMemory, "cuMemAllocFromPoolAsync", err)
			assert.Contains(t, err.Error(), "maximum size")
			require.NoError(t, e.d.MemFreeAsync(e.ctx, a, cuda.StreamLegacy))
			require.NoError(t, e.d.CtxSynchronize(e.ctx))
			reserved, err := e.d.MemPoolGetAttribute(e.ctx, pool, cuda.PoolAttrReservedMemCurrent)
			require.NoError(t, err)
			assert.Equal(t, uint64(48<<20), reserved, "the threshold keeps the freed block reserved")
			b, err := e.d.MemAllocFromPoolAsync(e.ctx, 60<<20, pool, cuda.StreamLegacy)
			require.NoError(t, err, "the pool gives back its unused blocks before it refuses")
			require.NoError(t, e.d.MemFreeAsync(e.ctx, b, cuda.StreamLegacy))
			// cuMemAllocAsync honours the maximum size of the current pool.
			require.NoError(t, e.d.DeviceSetMemPool(0, pool))
			_, err = e.d.MemAllocAsync(e.ctx, 65<<20, cuda.StreamLegacy)
			requireResult(t, cuda.ErrorOutOfMemory, "cuMemAllocAsync", err)
		})
	}
}
