package cudasim_test

import (
	"testing"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A block freed with cuMemFreeAsync is not trimmable until a synchronize completes the free: measured on
// the H100 (a trim right after freeing 70 GiB on the legacy stream returned none of it), and the reason
// pkg/memory's Pool.Release synchronizes before it trims.
func TestFreeAsyncIsTrimmableOnlyAfterSynchronize(t *testing.T) {
	d := cudasim.New()
	require.NoError(t, d.Init())
	ctx, err := d.PrimaryCtxRetain(0)
	require.NoError(t, err)
	pool, err := d.DeviceDefaultMemPool(0)
	require.NoError(t, err)
	require.NoError(t, d.MemPoolSetAttribute(ctx, pool, cuda.PoolAttrReleaseThreshold, ^uint64(0)))
	free0, _, err := d.MemGetInfo(ctx)
	require.NoError(t, err)

	p, err := d.MemAllocAsync(ctx, 1<<30, cuda.StreamLegacy)
	require.NoError(t, err)
	require.NoError(t, d.MemFreeAsync(ctx, p, cuda.StreamLegacy))
	require.NoError(t, d.MemPoolTrimTo(ctx, pool, 0))
	free1, _, err := d.MemGetInfo(ctx)
	require.NoError(t, err)
	assert.Equal(t, free0-(1<<30), free1, "the free is still in flight: nothing to trim")

	require.NoError(t, d.CtxSynchronize(ctx))
	require.NoError(t, d.MemPoolTrimTo(ctx, pool, 0))
	free2, _, err := d.MemGetInfo(ctx)
	require.NoError(t, err)
	assert.Equal(t, free0, free2, "after the synchronize the trim returns it all")
}
