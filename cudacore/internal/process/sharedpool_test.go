package process

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/memory"
)

// The shared pool on the process's simulator: what ShareProcessPool does to the device's current pool
// and to cudacore's allocator, what it refuses, and that UnshareProcessPool puts everything back.

func currentPool(t *testing.T, d *Device) cuda.MemPool {
	t.Helper()
	p, err := d.Driver().DeviceGetMemPool(d.Handle())
	require.NoError(t, err)
	return p
}

func TestShareProcessPoolOwnPool(t *testing.T) {
	d := simDevice(t)
	drv, ctx := d.Driver(), d.Context()
	def, err := drv.DeviceDefaultMemPool(d.Handle())
	require.NoError(t, err)
	require.Equal(t, def, currentPool(t, d))

	sp, err := d.ShareProcessPool(ShareOptions{ReleaseThreshold: 64 << 20, MaxSize: 1 << 30})
	require.NoError(t, err)
	t.Cleanup(func() {
		if _, ok := d.ProcessPool(); ok {
			_, _ = d.UnshareProcessPool()
		}
	})
	assert.True(t, sp.Owned())
	assert.NotEqual(t, def, sp.Handle)
	assert.Equal(t, def, sp.Previous)
	assert.Equal(t, sp.Handle, currentPool(t, d), "the shared pool is the device's current pool")
	assert.Equal(t, sp.Handle, d.Memory().Pool().Handle(), "cudacore's allocator draws from it")
	th, err := drv.MemPoolGetAttribute(ctx, sp.Handle, cuda.PoolAttrReleaseThreshold)
	require.NoError(t, err)
	assert.Equal(t, uint64(64<<20), th)

	// Another library's cuMemAllocAsync (PyTorch's, CuPy's) lands in it beside cudacore's blocks.
	p, err := d.Allocate(1<<20, 0)
	require.NoError(t, err)
	other, err := drv.MemAllocAsync(ctx, 3<<20, cuda.StreamLegacy)
	require.NoError(t, err)
	u, ok, err := d.PoolUsage()
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, sp.Handle, u.Handle)
	assert.Equal(t, uint64(4<<20), u.Used, "both libraries' blocks")
	assert.Equal(t, uint64(1<<20), u.Held, "cudacore's share")

	// Undo is refused, with nothing changed, while cudacore's blocks are in the pool.
	_, err = d.UnshareProcessPool()
	assert.ErrorIs(t, err, cuda.ErrIllegalState)
	assert.Equal(t, sp.Handle, currentPool(t, d))
	require.NoError(t, d.Free(p, 1<<20, 0))
	cur, err := d.UnshareProcessPool()
	require.NoError(t, err)
	assert.Equal(t, def, cur, "the previous current pool is back")
	assert.Equal(t, def, d.Memory().Pool().Handle(), "and cudacore's allocator in the default pool")
	_, ok = d.ProcessPool()
	assert.False(t, ok)
	// The other library's block outlives the pool's destruction; its free releases it.
	require.NoError(t, drv.MemFreeAsync(ctx, other, cuda.StreamLegacy))
	_, err = d.UnshareProcessPool()
	assert.ErrorIs(t, err, cuda.ErrIllegalState, "nothing is shared any more")
}

func TestShareProcessPoolDefaultPool(t *testing.T) {
	d := simDevice(t)
	drv, ctx := d.Driver(), d.Context()
	def, err := drv.DeviceDefaultMemPool(d.Handle())
	require.NoError(t, err)
	before, err := drv.MemPoolGetAttribute(ctx, def, cuda.PoolAttrReleaseThreshold)
	require.NoError(t, err)
	p, err := d.Allocate(1<<20, 0)
	require.NoError(t, err, "cudacore's blocks may stay: the allocator is in the default pool already")
	sp, err := d.ShareProcessPool(ShareOptions{UseDefault: true, ReleaseThreshold: 8 << 20})
	require.NoError(t, err)
	assert.False(t, sp.Owned())
	assert.Equal(t, def, sp.Handle)
	assert.Equal(t, def, currentPool(t, d))

	// A strategy switch keeps the allocator in the shared pool and leaves its release threshold alone.
	require.NoError(t, d.Free(p, 1<<20, 0))
	require.NoError(t, d.SetStrategy("pool", memory.StackOptions{}))
	th, err := drv.MemPoolGetAttribute(ctx, def, cuda.PoolAttrReleaseThreshold)
	require.NoError(t, err)
	assert.Equal(t, uint64(8<<20), th)
	err = d.SetStrategy("sync", memory.StackOptions{})
	assert.ErrorIs(t, err, cuda.ErrIllegalState, "the synchronous strategy would leave the shared pool")
	assert.Contains(t, err.Error(), "undo the shared pool first")

	// Sharing again with the same kind changes the threshold only; another kind is refused.
	again, err := d.ShareProcessPool(ShareOptions{UseDefault: true, ReleaseThreshold: math.MaxUint64})
	require.NoError(t, err)
	assert.Equal(t, def, again.Handle)
	_, err = d.ShareProcessPool(ShareOptions{ReleaseThreshold: math.MaxUint64})
	assert.ErrorIs(t, err, cuda.ErrIllegalState)
	assert.Contains(t, err.Error(), "the device's default pool")

	_, err = d.UnshareProcessPool()
	require.NoError(t, err)
	th, err = drv.MemPoolGetAttribute(ctx, def, cuda.PoolAttrReleaseThreshold)
	require.NoError(t, err)
	assert.Equal(t, before, th, "the default pool's release threshold is put back")
}

func TestShareProcessPoolRefusals(t *testing.T) {
	d := simDevice(t)
	cases := []struct {
		name string
		opts ShareOptions
		want error
		text string
	}{
		{"a maximum size of the default pool", ShareOptions{UseDefault: true, MaxSize: 1 << 30}, cuda.ErrInvalidValue, "pool of cudacore's own"},
		{"IPC handles of the default pool", ShareOptions{UseDefault: true, IPC: true}, cuda.ErrInvalidValue, "no maximum size and no IPC handles"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := currentPool(t, d)
			_, err := d.ShareProcessPool(tc.opts)
			assert.ErrorIs(t, err, tc.want)
			assert.Contains(t, err.Error(), tc.text)
			assert.Equal(t, before, currentPool(t, d), "a refusal changes nothing")
			_, ok := d.ProcessPool()
			assert.False(t, ok)
		})
	}
	t.Run("cudacore's blocks in the old pool", func(t *testing.T) {
		p, err := d.Allocate(4096, 0)
		require.NoError(t, err)
		defer func() { require.NoError(t, d.Free(p, 4096, 0)) }()
		_, err = d.ShareProcessPool(ShareOptions{ReleaseThreshold: math.MaxUint64})
		assert.ErrorIs(t, err, cuda.ErrIllegalState)
		assert.Contains(t, err.Error(), "close those buffers first")
		_, ok := d.ProcessPool()
		assert.False(t, ok)
	})
	t.Run("the synchronous strategy", func(t *testing.T) {
		require.NoError(t, d.SetStrategy("sync", memory.StackOptions{}))
		defer func() { require.NoError(t, d.SetStrategy("auto", memory.StackOptions{})) }()
		_, err := d.ShareProcessPool(ShareOptions{})
		assert.ErrorIs(t, err, cuda.ErrNotSupported)
		assert.Contains(t, err.Error(), "cupy_allocator")
	})
}

// A driver refusal after the allocator left the pool (the pool's destruction here) is reported, and the
// pool is unshared all the same: the next share starts afresh.
func TestUnshareProcessPoolReportsALateRefusal(t *testing.T) {
	d := simDevice(t)
	sim, err := Sim()
	require.NoError(t, err)
	def, err := d.Driver().DeviceDefaultMemPool(d.Handle())
	require.NoError(t, err)
	_, err = d.ShareProcessPool(ShareOptions{ReleaseThreshold: math.MaxUint64})
	require.NoError(t, err)
	sim.InjectFault("cuMemPoolDestroy", 1, cuda.ErrorInvalidValue)
	_, err = d.UnshareProcessPool()
	assert.ErrorIs(t, err, cuda.ErrInvalidValue)
	assert.Contains(t, err.Error(), "cuMemPoolDestroy")
	_, ok := d.ProcessPool()
	assert.False(t, ok, "unshared all the same")
	assert.Equal(t, def, currentPool(t, d))
	assert.Equal(t, def, d.Memory().Pool().Handle())
	sp, err := d.ShareProcessPool(ShareOptions{ReleaseThreshold: math.MaxUint64})
	require.NoError(t, err)
	assert.Equal(t, sp.Handle, currentPool(t, d))
	_, err = d.UnshareProcessPool()
	require.NoError(t, err)
}

// Another library's out-of-memory failure gets cudacore's verdict from the device's state: the shared
// pool's maximum size, the bytes the process's other libraries hold in the pool (this process's, not
// other processes'), and no probe while that library captures on the allocation's stream.
func TestExplainOutOfMemory(t *testing.T) {
	const MiB, GiB = uint64(1 << 20), uint64(1 << 30)
	for _, tc := range []struct {
		name      string
		maxSize   uint64
		held      uint64 // what the other library holds in the pool
		requested func(free uint64) uint64
		capture   bool
		verdict   string
		msg       string
	}{
		{"the pool's maximum size", 256 * MiB, 200 * MiB, func(uint64) uint64 { return 100 * MiB }, false,
			memory.CausePoolMaxSize, "reserves 200.0 MiB of its maximum size of 256.0 MiB"},
		{"the process's other libraries hold the device", 0, 4 * GiB, func(free uint64) uint64 { return free + MiB }, false,
			memory.CauseExhausted, "the process's other libraries 4.0 GiB in the same pool"},
		{"free memory, a block outside the pool", 0, 0, func(uint64) uint64 { return 64 * MiB }, false,
			memory.CausePoolReservation, "can be allocated outside the pool"},
		{"free memory, the library captures: no probe", 0, 0, func(uint64) uint64 { return 64 * MiB }, true,
			memory.CauseFragmentation, "No free block of 64.0 MiB exists"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := simDevice(t)
			drv, ctx := d.Driver(), d.Context()
			_, err := d.ShareProcessPool(ShareOptions{ReleaseThreshold: math.MaxUint64, MaxSize: tc.maxSize})
			require.NoError(t, err)
			t.Cleanup(func() { _, _ = d.UnshareProcessPool() })
			st, err := drv.StreamCreate(ctx, 1, 0)
			require.NoError(t, err)
			t.Cleanup(func() { _ = drv.StreamDestroy(ctx, st) })
			if tc.held != 0 {
				p, err := drv.MemAllocAsync(ctx, tc.held, st)
				require.NoError(t, err)
				t.Cleanup(func() { _ = drv.MemFreeAsync(ctx, p, st) })
			}
			free, _, err := d.MemoryInfo()
			require.NoError(t, err)
			if tc.capture {
				require.NoError(t, drv.StreamBeginCapture(ctx, st, cuda.CaptureModeRelaxed))
				t.Cleanup(func() {
					if g, err := drv.StreamEndCapture(ctx, st); err == nil && g != 0 {
						_ = drv.GraphDestroy(ctx, g)
					}
				})
			}
			e := d.ExplainOutOfMemory(tc.requested(free), st, "torch")
			assert.Equal(t, "torch", e.Op)
			assert.Equal(t, cuda.ErrorOutOfMemory, e.Result)
			cause, _ := e.Field("cause")
			assert.Equal(t, tc.verdict, cause, e.Msg)
			assert.Contains(t, e.Msg, tc.msg)
			if tc.held != 0 {
				others, _ := e.Field("pool_others")
				assert.Equal(t, fmt.Sprint(tc.held), others)
			}
		})
	}
}
