package process

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
)

func TestRegistryNumbersAndRemoves(t *testing.T) {
	var r Registry[string]
	a, b := r.Add(0, "a"), r.Add(0, "b")
	assert.NotEqual(t, a, b, "numbers of the registry's own are distinct")
	assert.Equal(t, 77, r.Add(77, "handle"), "a given key is kept")
	v, ok := r.Get(a)
	require.True(t, ok)
	assert.Equal(t, "a", v)
	v, ok = r.Remove(a)
	assert.True(t, ok)
	assert.Equal(t, "a", v)
	_, ok = r.Get(a)
	assert.False(t, ok, "a removed number is gone")
	_, ok = r.Remove(a)
	assert.False(t, ok, "removing twice finds nothing")
	assert.Equal(t, 2, r.Len())
	assert.True(t, r.Issued(a), "a removed number was issued")
	assert.False(t, r.Issued(b+1), "a number not handed out yet")
	assert.False(t, r.Issued(0))
}

func TestAllocationsTakeOnce(t *testing.T) {
	var tab Allocations
	tab.Add(0x1000, Allocation{Ordinal: 0, Size: 16, Stream: cuda.StreamLegacy})
	a, ok := tab.Take(0x1000)
	require.True(t, ok)
	assert.Equal(t, uint64(16), a.Size)
	_, ok = tab.Take(0x1000)
	assert.False(t, ok, "a second free of the same pointer is refused")
	_, ok = tab.Take(0x2000)
	assert.False(t, ok, "a pointer never handed out is refused")
}

func TestRegistryConcurrent(t *testing.T) {
	var r Registry[int]
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				k := r.Add(0, g*1000+i)
				v, ok := r.Remove(k)
				assert.True(t, ok)
				assert.Equal(t, g*1000+i, v)
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 0, r.Len())
}
