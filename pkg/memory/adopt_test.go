package memory

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// A Stack on an adopted pool allocates from it, leaves its attributes and its life to its owner, and
// counts its own share of it (Pool.Held) whatever else the pool serves.
func TestStackOnAdoptedPool(t *testing.T) {
	cases := []struct {
		name string
		opts StackOptions
	}{
		{"with the cache", StackOptions{}},
		{"without the cache", StackOptions{NoCache: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			drv, d := openSim(t)
			ctx := d.Context()
			shared, err := drv.MemPoolCreate(ctx, cuda.PoolProps{Device: d.Handle()})
			require.NoError(t, err)
			defer func() { assert.NoError(t, drv.MemPoolDestroy(ctx, shared)) }()
			require.NoError(t, drv.MemPoolSetAttribute(ctx, shared, cuda.PoolAttrReleaseThreshold, 7<<20))

			opts := tc.opts
			opts.Pool = shared
			s := newStack(t, d, opts)
			assert.Equal(t, shared, s.Pool().Handle())
			assert.True(t, s.Pool().Adopted())
			th, err := drv.MemPoolGetAttribute(ctx, shared, cuda.PoolAttrReleaseThreshold)
			require.NoError(t, err)
			assert.Equal(t, uint64(7<<20), th, "the owner's release threshold is left as it was")

			// Another allocator of the process draws from the same pool (cuMemAllocFromPoolAsync by handle).
			other, err := drv.MemAllocFromPoolAsync(ctx, 3<<20, shared, cuda.StreamLegacy)
			require.NoError(t, err)
			p, err := s.Allocate(5<<20, cuda.StreamLegacy)
			require.NoError(t, err)
			used, err := drv.MemPoolGetAttribute(ctx, shared, cuda.PoolAttrUsedMemCurrent)
			require.NoError(t, err)
			assert.Equal(t, uint64(8<<20), used, "both allocators' blocks are in the pool")
			assert.Equal(t, uint64(5<<20), s.Pool().Held(), "the stack's share")
			require.NoError(t, s.Deallocate(p, 5<<20, cuda.StreamLegacy))
			if tc.opts.NoCache {
				assert.Zero(t, s.Pool().Held())
			} else {
				assert.Equal(t, uint64(5<<20), s.Pool().Held(), "a cached block is still the stack's")
				require.NoError(t, s.Release())
				assert.Zero(t, s.Pool().Held(), "released, it is not")
			}
			require.NoError(t, drv.MemFreeAsync(ctx, other, cuda.StreamLegacy))
			require.NoError(t, s.Close())
			_, err = drv.MemPoolGetAttribute(ctx, shared, cuda.PoolAttrUsedMemCurrent)
			assert.NoError(t, err, "closing the stack leaves the adopted pool alive")
		})
	}
}

// An allocation that would take an adopted pool beyond its maximum size gets that verdict, whoever holds
// the pool's reserve.
func TestVerdictPoolMaxSize(t *testing.T) {
	drv, d := openSim(t)
	ctx := d.Context()
	const max = 64 * MiB
	shared, err := drv.MemPoolCreate(ctx, cuda.PoolProps{Device: d.Handle(), MaxSize: max})
	require.NoError(t, err)
	defer func() { assert.NoError(t, drv.MemPoolDestroy(ctx, shared)) }()
	s := newStack(t, d, StackOptions{Pool: shared, PoolMaxSize: max})
	other, err := drv.MemAllocFromPoolAsync(ctx, 40*MiB, shared, cuda.StreamLegacy) // another library's block
	require.NoError(t, err)
	_, err = s.Allocate(30*MiB, cuda.StreamLegacy)
	e := asCUDA(t, err)
	assert.Equal(t, cuda.ErrorOutOfMemory, e.Result)
	cause, _ := e.Field("cause")
	assert.Equal(t, CausePoolMaxSize, cause)
	assert.Contains(t, e.Msg, "the pool reached its maximum size")
	assert.Contains(t, e.Msg, "40.0 MiB of its maximum size of 64.0 MiB")
	got, _ := e.Field("max_size")
	assert.Equal(t, u64(max), got)
	require.NoError(t, drv.MemFreeAsync(ctx, other, cuda.StreamLegacy))
	p, err := s.Allocate(30*MiB, cuda.StreamLegacy)
	require.NoError(t, err, "room again once the other library freed its block")
	require.NoError(t, s.Deallocate(p, 30*MiB, cuda.StreamLegacy))
}
