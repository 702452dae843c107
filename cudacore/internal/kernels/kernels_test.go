package kernels_test

import (
	"errors"
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/cudacore/internal/kernels"
	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
	"github.com/cudacore/cudacore/pkg/module"
)

func TestRegistryLifecycle(t *testing.T) {
	drv := cudasim.New()
	require.NoError(t, drv.Init())
	ctx, err := drv.PrimaryCtxRetain(0)
	require.NoError(t, err)
	lim, err := module.QueryDeviceLimits(drv, 0, 0)
	require.NoError(t, err)
	ptx, err := os.ReadFile("../../../tests/kernels/fill.ptx")
	require.NoError(t, err)

	r := kernels.New()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := module.Load(drv, ctx, lim, ptx)
			if !assert.NoError(t, err) {
				return
			}
			h := r.AddModule(m, 0)
			f1, err := r.Function(h, "fill")
			assert.NoError(t, err)
			f2, err := r.Function(h, "fill")
			assert.NoError(t, err)
			assert.Equal(t, f1, f2, "the same kernel gets the same handle")
			_, err = r.Function(h, "fill_f32")
			assert.NoError(t, err)
			_, err = r.Func(f1)
			assert.NoError(t, err)
			assert.NoError(t, r.Unload(h))
			_, err = r.Func(f1)
			assert.True(t, errors.Is(err, cuda.ErrInvalidHandle))
			assert.True(t, errors.Is(r.Unload(h), cuda.ErrInvalidHandle))
		}()
	}
	wg.Wait()
	mods, funcs := r.Len()
	assert.Zero(t, mods, "unloaded modules must not stay in the registry")
	assert.Zero(t, funcs)
	_, err = r.Function(12345, "fill")
	assert.Contains(t, err.Error(), "module handle 12345 is not a loaded module")
}
