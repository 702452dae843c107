package conformance

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// The device's current pool and the properties of a pool made with cuMemPoolCreate: what cudacore needs to
// share one pool with the other libraries of a process (docs/contributing/design.md, "One pool for the
// process"). The current pool is state of the whole process, so every test puts back what it found.

func runPools(t *testing.T, newDriver func(t *testing.T) cuda.Driver) {
	t.Run("CurrentPool", func(t *testing.T) { testCurrentPool(t, setup(t, newDriver)) })
	t.Run("CurrentPoolDestroyed", func(t *testing.T) { testCurrentPoolDestroyed(t, setup(t, newDriver)) })
	t.Run("CurrentPoolOfAnotherDevice", func(t *testing.T) { testCurrentPoolOtherDevice(t, setup(t, newDriver)) })
	t.Run("PoolMaxSize", func(t *testing.T) { testPoolMaxSize(t, setup(t, newDriver)) })
}

// keepCurrent restores the device's current pool when the test ends, whatever the test did to it.
func (e *env) keepCurrent(t *testing.T, dev cuda.Device) cuda.MemPool {
	t.Helper()
	cur, err := e.drv.DeviceGetMemPool(dev)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, e.drv.DeviceSetMemPool(dev, cur)) })
	return cur
}

func (e *env) poolUsed(t *testing.T, p cuda.MemPool) uint64 {
	t.Helper()
	n, err := e.drv.MemPoolGetAttribute(e.ctx, p, cuda.PoolAttrUsedMemCurrent)
	require.NoError(t, err)
	return n
}

// testCurrentPool: the default pool is current until another is set; cuMemAllocAsync then allocates from
// the pool set, and cuMemAllocFromPoolAsync still from the pool it names.
func testCurrentPool(t *testing.T, e *env) {
	if !e.pools {
		t.Skip("no memory pools on this device")
	}
	d, c := e.drv, e.ctx
	def, err := d.DeviceDefaultMemPool(e.dev)
	require.NoError(t, err)
	assert.Equal(t, def, e.keepCurrent(t, e.dev), "the default pool is current until another is set")

	pool, err := d.MemPoolCreate(c, cuda.PoolProps{Device: e.dev})
	require.NoError(t, err)
	defer func() { assert.NoError(t, d.MemPoolDestroy(c, pool)) }()
	require.NoError(t, d.DeviceSetMemPool(e.dev, pool))
	cur, err := d.DeviceGetMemPool(e.dev)
	require.NoError(t, err)
	assert.Equal(t, pool, cur)

	s := e.stream(t, cuda.StreamNonBlocking)
	require.NoError(t, d.StreamSynchronize(c, s))
	defBefore := e.poolUsed(t, def)
	const size = 4 << 20
	p, err := d.MemAllocAsync(c, size, s)
	require.NoError(t, err)
	require.NoError(t, d.StreamSynchronize(c, s))
	assert.GreaterOrEqual(t, e.poolUsed(t, pool), uint64(size), "cuMemAllocAsync allocates from the current pool")
	assert.Equal(t, defBefore, e.poolUsed(t, def), "and not from the default pool")
	q, err := d.MemAllocFromPoolAsync(c, size, def, s)
	require.NoError(t, err)
	require.NoError(t, d.StreamSynchronize(c, s))
	assert.GreaterOrEqual(t, e.poolUsed(t, def), defBefore+size, "cuMemAllocFromPoolAsync allocates from the pool it names")
	require.NoError(t, d.MemFreeAsync(c, p, s))
	require.NoError(t, d.MemFreeAsync(c, q, s))
	require.NoError(t, d.StreamSynchronize(c, s))
	assert.Zero(t, e.poolUsed(t, pool), "a block freed goes back to its own pool")

	require.NoError(t, d.DeviceSetMemPool(e.dev, def), "the default pool can be made current again")
	cur, err = d.DeviceGetMemPool(e.dev)
	require.NoError(t, err)
	assert.Equal(t, def, cur)
}

// testCurrentPoolDestroyed: destroying the current pool makes the default pool current again, and
// cuMemAllocAsync goes on working.
func testCurrentPoolDestroyed(t *testing.T, e *env) {
	if !e.pools {
		t.Skip("no memory pools on this device")
	}
	d, c := e.drv, e.ctx
	def, err := d.DeviceDefaultMemPool(e.dev)
	require.NoError(t, err)
	e.keepCurrent(t, e.dev)
	pool, err := d.MemPoolCreate(c, cuda.PoolProps{Device: e.dev})
	require.NoError(t, err)
	require.NoError(t, d.DeviceSetMemPool(e.dev, pool))
	require.NoError(t, d.MemPoolDestroy(c, pool))
	cur, err := d.DeviceGetMemPool(e.dev)
	require.NoError(t, err)
	assert.Equal(t, def, cur, "the default pool is current once the current pool is destroyed")
	s := e.stream(t, cuda.StreamNonBlocking)
	p, err := d.MemAllocAsync(c, 1<<20, s)
	require.NoError(t, err)
	require.NoError(t, d.MemFreeAsync(c, p, s))
	require.NoError(t, d.StreamSynchronize(c, s))
}

// testCurrentPoolOtherDevice: a device's current pool must be located on it.
func testCurrentPoolOtherDevice(t *testing.T, e *env) {
	if !e.pools {
		t.Skip("no memory pools on this device")
	}
	d := e.drv
	dev1, c1 := e.second(t)
	if ok, err := d.DeviceAttribute(dev1, cuda.AttrMemoryPoolsSupported); err != nil || ok != 1 {
		t.Skip("device 1 has no memory pools")
	}
	cur := e.keepCurrent(t, e.dev)
	other, err := d.MemPoolCreate(c1, cuda.PoolProps{Device: dev1})
	require.NoError(t, err)
	defer func() { assert.NoError(t, d.MemPoolDestroy(c1, other)) }()
	err = d.DeviceSetMemPool(e.dev, other)
	assertResult(t, cuda.ErrorInvalidValue, err, "device 1's pool made device 0's current pool")
	got, err := d.DeviceGetMemPool(e.dev)
	require.NoError(t, err)
	assert.Equal(t, cur, got, "a refused pool leaves the current one as it was")
}

// testPoolMaxSize: a pool made with a maximum size refuses, as out of memory, an allocation that would
// take its reserve beyond it, and serves the whole maximum again once its blocks are freed. A driver older
// than CUDA 12.2 has no such field and is refused before it is called.
func testPoolMaxSize(t *testing.T, e *env) {
	if !e.pools {
		t.Skip("no memory pools on this device")
	}
	d, c := e.drv, e.ctx
	v, err := d.Version()
	require.NoError(t, err)
	const max = 256 << 20
	if v < cuda.PoolMaxSizeVersion {
		_, err := d.MemPoolCreate(c, cuda.PoolProps{Device: e.dev, MaxSize: max})
		assertResult(t, cuda.ErrorNotSupported, err, "a maximum size on a driver before CUDA 12.2")
		return
	}
	pool, err := d.MemPoolCreate(c, cuda.PoolProps{Device: e.dev, MaxSize: max})
	require.NoError(t, err)
	defer func() { assert.NoError(t, d.MemPoolDestroy(c, pool)) }()
	s := e.stream(t, cuda.StreamNonBlocking)

	_, err = d.MemAllocFromPoolAsync(c, 2*max, pool, s)
	assertResult(t, cuda.ErrorOutOfMemory, err, "one allocation larger than the maximum size")
	a, err := d.MemAllocFromPoolAsync(c, max/2, pool, s)
	require.NoError(t, err, "half the maximum size")
	b, err := d.MemAllocFromPoolAsync(c, max/4, pool, s)
	require.NoError(t, err, "three quarters of it in all")
	_, err = d.MemAllocFromPoolAsync(c, max/2, pool, s)
	assertResult(t, cuda.ErrorOutOfMemory, err, "a reserve beyond the maximum size in all")
	require.NoError(t, d.StreamSynchronize(c, s), "the stream is not poisoned")
	reserved, err := d.MemPoolGetAttribute(c, pool, cuda.PoolAttrReservedMemCurrent)
	require.NoError(t, err)
	assert.LessOrEqual(t, reserved, uint64(max), "the pool never reserves more than its maximum size")
	require.NoError(t, d.MemFreeAsync(c, a, s))
	require.NoError(t, d.MemFreeAsync(c, b, s))
	require.NoError(t, d.StreamSynchronize(c, s))
	whole, err := d.MemAllocFromPoolAsync(c, max, pool, s)
	require.NoError(t, err, "the whole maximum size once the blocks are freed")
	require.NoError(t, d.MemFreeAsync(c, whole, s))
	require.NoError(t, d.StreamSynchronize(c, s))
}
