package memory

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
	"github.com/cudacore/cudacore/pkg/device"
)

var strategies = []struct {
	name     string
	strategy device.Strategy
	opts     StackOptions
}{
	{"pool+cache", device.StrategyPool, StackOptions{}},
	{"pool", device.StrategyPool, StackOptions{NoCache: true}},
	{"own-pool", device.StrategyPool, StackOptions{OwnPool: true}},
	{"sync", device.StrategySync, StackOptions{}},
}

func TestOOMMessageAsUsersSeeIt(t *testing.T) {
	drv, d := openSim(t)
	s := newStack(t, d, StackOptions{})
	calls := drv.Calls("cuMemAllocFromPoolAsync")
	_, err := s.Allocate(2<<40, cuda.StreamLegacy)
	e := asCUDA(t, err)
	assert.Equal(t, drv.Calls("cuMemAllocFromPoolAsync"), calls, "larger than the device: no driver call")
	assert.Equal(t, cuda.ErrorOutOfMemory, e.Result)
	assert.ErrorIs(t, err, cuda.ErrOutOfMemory)
	assert.Equal(t, "cuMemAllocFromPoolAsync", e.Op)
	assert.Equal(t, "the request is larger than the device: out of memory allocating 2.0 TiB on device 0 (NVIDIA H100 80GB HBM3): 78.7 GiB of 79.2 GiB free; "+
		"this process's pool holds 0 B in use and 0 B cached. The request is larger than the device's total memory: "+
		"split it (for example into tiles with allocate_tiles), or use managed memory (allocate_managed), which the driver pages in and out of the device.", e.Msg)
	want := map[string]string{"requested": "2199023255552", "free": "84465090560", "total": "85017493504",
		"device": "0", "in_use": "0", "cached": "0"}
	for k, v := range want {
		got, ok := e.Field(k)
		assert.True(t, ok, k)
		assert.Equal(t, v, got, k)
	}
	_, hasLimit := e.Field("limit")
	assert.False(t, hasLimit)
	w, ok := cuda.Decode(cuda.Encode(err))
	require.True(t, ok)
	assert.Equal(t, cuda.ErrorOutOfMemory, w.Result)
	assert.Equal(t, "cuMemAllocFromPoolAsync", w.Op)
	assert.Equal(t, uint64(1), s.Stats().OOMs)
	t.Log(cuda.Encode(err))
}

// Allocate until out of memory, then free one block and allocate again; the failed call changes nothing.
func TestAllocateUntilOOMThenAgain(t *testing.T) {
	for _, tc := range strategies {
		t.Run(tc.name, func(t *testing.T) {
			_, d := openSim(t, small("sim-1g"))
			opts := tc.opts
			opts.Strategy = tc.strategy
			s := newStack(t, d, opts)
			const block = 100 * MiB
			var ptrs []cuda.DevicePtr
			var err error
			for range 20 {
				var p cuda.DevicePtr
				if p, err = s.Allocate(block, cuda.StreamLegacy); err != nil {
					break
				}
				ptrs = append(ptrs, p)
			}
			require.Len(t, ptrs, 9, "960 MiB free hold 9 blocks of 100 MiB")
			e := asCUDA(t, err)
			assert.Equal(t, cuda.ErrorOutOfMemory, e.Result)
			assert.Contains(t, e.Msg, "out of memory allocating 100.0 MiB on device 0 (sim-1g): 60.0 MiB of 1.0 GiB free")
			assert.Contains(t, e.Msg, "900.0 MiB in use")
			cause, _ := e.Field("cause")
			assert.Equal(t, CauseExhausted, cause)
			assert.True(t, strings.HasPrefix(e.Msg, "memory exhausted by this process: "), e.Msg)

			before, st := freeMem(t, d), s.Stats()
			_, err = s.Allocate(block, cuda.StreamLegacy)
			require.ErrorIs(t, err, cuda.ErrOutOfMemory)
			assert.Equal(t, before, freeMem(t, d), "a failed allocation leaves device memory as it was")
			st2 := s.Stats()
			assert.Equal(t, st.InUse, st2.InUse)
			assert.Equal(t, st.Reserved, st2.Reserved)
			assert.Equal(t, st.Cached, st2.Cached)
			assert.Equal(t, st.OOMs+1, st2.OOMs)

			require.NoError(t, s.Deallocate(ptrs[0], block, cuda.StreamLegacy))
			p, err := s.Allocate(block, cuda.StreamLegacy)
			require.NoError(t, err, "after a free the same size fits again")
			ptrs[0] = p
			for _, p := range ptrs {
				require.NoError(t, s.Deallocate(p, block, cuda.StreamLegacy))
			}
			require.NoError(t, s.Release())
			assert.Equal(t, GiB-64*MiB, freeMem(t, d))
			st = s.Stats()
			assert.Zero(t, st.InUse)
			assert.Zero(t, st.Cached)
			assert.Equal(t, uint64(900*MiB), st.PeakInUse)
			assert.Equal(t, st.Allocations, st.Frees)
		})
	}
}

func TestTilesFailAtKLeaveMemoryAsBefore(t *testing.T) {
	for _, tc := range strategies {
		t.Run(tc.name, func(t *testing.T) {
			drv, d := openSim(t, small("sim-1g"))
			opts := tc.opts
			opts.Strategy = tc.strategy
			s := newStack(t, d, opts)
			const tile = 48 * MiB // a cache class: the tiles go through the size-class cache
			before, st := freeMem(t, d), s.Stats()

			var seen []int
			_, err := s.AllocateTiles(30, tile, cuda.StreamLegacy, func(done, total int) bool {
				seen = append(seen, done)
				assert.Equal(t, 30, total)
				return true
			})
			e := asCUDA(t, err)
			assert.Equal(t, cuda.ErrorOutOfMemory, e.Result)
			assert.Len(t, seen, 20)
			assert.Contains(t, e.Msg, "allocated 20 of 30 tiles of 48.0 MiB before running out of memory")
			assert.Contains(t, e.Msg, "20 tiles of that size fit")
			for k, v := range map[string]string{"tiles_requested": "30", "tiles_allocated": "20", "tiles_fit": "20",
				"tile_size": "50331648", "free": "1006632960", "total": "1073741824"} {
				got, ok := e.Field(k)
				assert.True(t, ok, k)
				assert.Equal(t, v, got, k)
			}
			assert.Equal(t, before, freeMem(t, d), "cuMemGetInfo is exactly as before")
			st2 := s.Stats()
			assert.Equal(t, st.InUse, st2.InUse)
			assert.Equal(t, st.Cached, st2.Cached)
			assert.Equal(t, st.Reserved, st2.Reserved)
			assert.Equal(t, uint64(20), st2.Allocations)
			assert.Equal(t, uint64(20), st2.Frees)

			// A fault at tile 4 (twice, so Retry's second try fails too) fails at k = 3.
			entry := "cuMemAllocFromPoolAsync"
			if tc.strategy == device.StrategySync {
				entry = "cuMemAlloc_v2"
			}
			drv.InjectFault(entry, 4, cuda.ErrorOutOfMemory)
			drv.InjectFault(entry, 5, cuda.ErrorOutOfMemory)
			if tc.name == "pool+cache" {
				// The cache was emptied by the rollback, so every tile reaches the driver.
				require.Zero(t, s.Cache().Stats().Blocks)
			}
			_, err = s.AllocateTiles(10, tile, cuda.StreamLegacy, nil)
			e = asCUDA(t, err)
			assert.Contains(t, e.Msg, "allocated 3 of 10 tiles")
			assert.Contains(t, e.Msg, "20 tiles of that size fit")
			assert.Equal(t, entry, e.Op)
			assert.Equal(t, before, freeMem(t, d))
			assert.Zero(t, s.Stats().InUse)

			// Cancelled by the progress callback: IllegalState, everything released.
			_, err = s.AllocateTiles(10, tile, cuda.StreamLegacy, func(done, _ int) bool { return done < 5 })
			e = asCUDA(t, err)
			assert.Equal(t, cuda.ErrorIllegalState, e.Result)
			assert.Equal(t, OpTiles, e.Op)
			assert.Contains(t, e.Msg, "cancelled")
			assert.Equal(t, before, freeMem(t, d))
			assert.Zero(t, s.Stats().InUse)

			// And the ones that fit, fit.
			tiles, err := s.AllocateTiles(20, tile, cuda.StreamLegacy, nil)
			require.NoError(t, err)
			require.Len(t, tiles, 20)
			for _, p := range tiles {
				require.NoError(t, s.Deallocate(p, tile, cuda.StreamLegacy))
			}
		})
	}
}

func TestAdmit(t *testing.T) {
	_, d := openSim(t, small("sim-1g"))
	s := newStack(t, d, StackOptions{})
	fits, free, cached, err := s.Admit(20, 48*MiB)
	require.NoError(t, err)
	assert.True(t, fits)
	assert.Equal(t, 960*MiB, free)
	assert.Zero(t, cached)
	fits, _, _, err = s.Admit(21, 48*MiB)
	require.NoError(t, err)
	assert.False(t, fits)
	// 40 MiB rounds up to the 40 MiB class (32*1.25); 41 MiB to 48 MiB: only 20 fit.
	fits, _, _, _ = s.Admit(23, 41*MiB)
	assert.False(t, fits, "tiles are counted at the cache's block size")

	// Memory in the cache counts: free 10 blocks into it and the same request still fits.
	tiles, err := s.AllocateTiles(10, 48*MiB, cuda.StreamLegacy, nil)
	require.NoError(t, err)
	for _, p := range tiles {
		require.NoError(t, s.Deallocate(p, 48*MiB, cuda.StreamLegacy))
	}
	fits, free, cached, err = s.Admit(20, 48*MiB)
	require.NoError(t, err)
	assert.True(t, fits)
	assert.Equal(t, 480*MiB, free)
	assert.Equal(t, 480*MiB, cached)

	for _, tc := range []struct {
		count int
		tile  uint64
		msg   string
	}{
		{0, MiB, "count must be positive"}, {-3, MiB, "count must be positive"},
		{1, 0, "tile size must be positive"}, {1 << 40, 1 << 40, "overflow"},
	} {
		_, _, _, err := s.Admit(tc.count, tc.tile)
		e := asCUDA(t, err)
		assert.Equal(t, cuda.ErrorInvalidValue, e.Result)
		assert.Contains(t, e.Msg, tc.msg)
		_, err = s.AllocateTiles(tc.count, tc.tile, 0, nil)
		e = asCUDA(t, err)
		assert.Equal(t, cuda.ErrorInvalidValue, e.Result)
		assert.Contains(t, e.Msg, tc.msg)
	}
}

// Devices without memory pools (TCC, some WSL setups) get the synchronous resource; pool calls would
// return 801 there.
func TestNoMempoolDevicesUseSync(t *testing.T) {
	for _, tc := range []struct {
		name string
		tcc  bool
	}{{"tcc", true}, {"no-mempool", false}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := small("sim-" + tc.name)
			cfg.MemoryPoolsSupported, cfg.TCCDriver = false, tc.tcc
			drv, d := openSim(t, cfg)
			require.Equal(t, device.StrategySync, d.Strategy())

			_, err := drv.MemAllocAsync(d.Context(), MiB, cuda.StreamLegacy)
			assert.Equal(t, cuda.ErrorNotSupported, cuda.ResultOf(err), "the simulator refuses pools here (801)")
			_, err = NewPool(d)
			assert.ErrorIs(t, err, cuda.ErrNotSupported)
			_, err = NewStack(d, StackOptions{Strategy: device.StrategyPool})
			assert.ErrorIs(t, err, cuda.ErrNotSupported)

			pool0, async0 := drv.Calls("cuMemAllocFromPoolAsync"), drv.Calls("cuMemAllocAsync")
			s := newStack(t, d, StackOptions{})
			assert.Nil(t, s.Pool())
			assert.Nil(t, s.Cache())
			p, err := s.Allocate(10*MiB, cuda.StreamLegacy)
			require.NoError(t, err)
			assert.Equal(t, 10*MiB, s.Stats().Reserved)
			require.NoError(t, s.Deallocate(p, 10*MiB, cuda.StreamLegacy))
			assert.Equal(t, 1, drv.Calls("cuMemAlloc_v2"))
			assert.Equal(t, 1, drv.Calls("cuMemFree_v2"))
			assert.Equal(t, pool0, drv.Calls("cuMemAllocFromPoolAsync"))
			assert.Equal(t, async0, drv.Calls("cuMemAllocAsync"))
			assert.Zero(t, drv.Calls("cuMemFreeAsync"))

			r, err := New(d, "")
			require.NoError(t, err)
			assert.IsType(t, &Sync{}, r)
		})
	}
}

func TestStackLimit(t *testing.T) {
	drv, d := openSim(t, small("sim-1g"))
	s := newStack(t, d, StackOptions{Limit: 100 * MiB})
	p, err := s.Allocate(60*MiB, cuda.StreamLegacy)
	require.NoError(t, err)
	before, calls := freeMem(t, d), drv.Calls("cuMemAllocFromPoolAsync")
	_, err = s.Allocate(60*MiB, cuda.StreamLegacy)
	e := asCUDA(t, err)
	assert.Equal(t, cuda.ErrorOutOfMemory, e.Result)
	assert.Equal(t, LimitOp, e.Op)
	assert.Equal(t, calls, drv.Calls("cuMemAllocFromPoolAsync"), "the limit refuses before the driver")
	assert.Equal(t, before, freeMem(t, d))
	assert.Contains(t, e.Msg, "its memory limit is 100.0 MiB")
	assert.Contains(t, e.Msg, "A memory limit was hit, not the device's capacity: 60.0 MiB of the 100.0 MiB limit is in use")
	for k, v := range map[string]string{"limit": "104857600", "limit_in_use": "62914560", "in_use": "62914560", "requested": "62914560"} {
		got, ok := e.Field(k)
		assert.True(t, ok, k)
		assert.Equal(t, v, got, k)
	}
	assert.Equal(t, 100*MiB, s.Stats().Limit)
	s.SetLimit(0)
	q, err := s.Allocate(60*MiB, cuda.StreamLegacy)
	require.NoError(t, err)
	assert.Zero(t, s.Stats().Limit)
	s.SetLimit(50 * MiB) // below what is in use: only later allocations fail
	_, err = s.Allocate(1, cuda.StreamLegacy)
	assert.ErrorIs(t, err, cuda.ErrOutOfMemory)
	require.NoError(t, s.Deallocate(p, 60*MiB, cuda.StreamLegacy))
	require.NoError(t, s.Deallocate(q, 60*MiB, cuda.StreamLegacy))
	p, err = s.Allocate(50*MiB, cuda.StreamLegacy)
	require.NoError(t, err)
	require.NoError(t, s.Deallocate(p, 50*MiB, cuda.StreamLegacy))
}

func TestRetry(t *testing.T) {
	t.Run("fault once then success", func(t *testing.T) {
		drv, d := openSim(t)
		s := newStack(t, d, StackOptions{})
		drv.InjectFault("cuMemAllocFromPoolAsync", 1, cuda.ErrorOutOfMemory)
		calls, syncs := drv.Calls("cuMemAllocFromPoolAsync"), drv.Calls("cuCtxSynchronize")
		p, err := s.Allocate(MiB, cuda.StreamLegacy)
		require.NoError(t, err)
		assert.Equal(t, calls+2, drv.Calls("cuMemAllocFromPoolAsync"))
		assert.Equal(t, syncs+1, drv.Calls("cuCtxSynchronize"))
		assert.Zero(t, s.Stats().OOMs)
		require.NoError(t, s.Deallocate(p, MiB, cuda.StreamLegacy))
	})
	t.Run("callback", func(t *testing.T) {
		for _, retry := range []bool{true, false} {
			drv, d := openSim(t)
			var asked []uint64
			s := newStack(t, d, StackOptions{OnOOM: func(n uint64) bool { asked = append(asked, n); return retry }})
			drv.InjectFault("cuMemAllocFromPoolAsync", 1, cuda.ErrorOutOfMemory)
			calls := drv.Calls("cuMemAllocFromPoolAsync")
			p, err := s.Allocate(3000, cuda.StreamLegacy)
			assert.Equal(t, []uint64{3000}, asked, "the callback sees the requested size")
			if retry {
				require.NoError(t, err)
				assert.Equal(t, calls+2, drv.Calls("cuMemAllocFromPoolAsync"))
				require.NoError(t, s.Deallocate(p, 3000, cuda.StreamLegacy))
			} else {
				assert.ErrorIs(t, err, cuda.ErrOutOfMemory)
				assert.Equal(t, calls+1, drv.Calls("cuMemAllocFromPoolAsync"), "false: no retry")
				assert.Zero(t, s.Stats().InUse)
			}
		}
	})
	t.Run("second failure is returned", func(t *testing.T) {
		drv, d := openSim(t)
		s := newStack(t, d, StackOptions{})
		drv.InjectFault("cuMemAllocFromPoolAsync", 1, cuda.ErrorOutOfMemory)
		drv.InjectFault("cuMemAllocFromPoolAsync", 2, cuda.ErrorOutOfMemory)
		_, err := s.Allocate(MiB, cuda.StreamLegacy)
		e := asCUDA(t, err)
		assert.Equal(t, "cuMemAllocFromPoolAsync", e.Op)
		assert.Equal(t, uint64(1), s.Stats().OOMs)
		_, err = s.Allocate(MiB, cuda.StreamLegacy)
		require.NoError(t, err, "the fault was used up")
	})
	t.Run("releases the cache to make room", func(t *testing.T) {
		drv, d := openSim(t, small("sim-1g"))
		s := newStack(t, d, StackOptions{})
		a := newStream(t, drv, d)
		// Fill the cache on stream a with 19 blocks of 48 MiB (912 MiB of 960 MiB free).
		tiles, err := s.AllocateTiles(19, 48*MiB, a, nil)
		require.NoError(t, err)
		for _, p := range tiles {
			require.NoError(t, s.Deallocate(p, 48*MiB, a))
		}
		assert.Equal(t, 912*MiB, s.Cache().Stats().Cached)
		// 500 MiB on the legacy stream cannot reuse stream a's blocks: only a release makes room.
		p, err := s.Allocate(500*MiB, cuda.StreamLegacy)
		require.NoError(t, err)
		assert.Zero(t, s.Cache().Stats().Cached)
		require.NoError(t, s.Deallocate(p, 500*MiB, cuda.StreamLegacy))
		// Too much even after releasing: the message says what was released.
		tiles, err = s.AllocateTiles(19, 48*MiB, a, nil)
		require.NoError(t, err)
		for _, p := range tiles {
			require.NoError(t, s.Deallocate(p, 48*MiB, a))
		}
		_, err = s.Allocate(970*MiB, cuda.StreamLegacy)
		e := asCUDA(t, err)
		assert.Contains(t, e.Msg, "cudacore already released")
		assert.Contains(t, e.Msg, "of cached memory and retried")
		assert.Equal(t, GiB-64*MiB, freeMem(t, d))
	})
}

func TestTrackerDoubleFree(t *testing.T) {
	drv, d := openSim(t)
	s := newStack(t, d, StackOptions{Track: true, TraceFrames: 8})
	p, err := s.Allocate(4*KiB, cuda.StreamLegacy)
	require.NoError(t, err)
	q, err := s.AllocateLabeled(8*KiB, cuda.StreamLegacy, "model.py:12")
	require.NoError(t, err)
	live := s.Live()
	require.Len(t, live, 2)
	assert.Equal(t, p, live[0].Ptr)
	assert.Equal(t, 4*KiB, live[0].Size)
	assert.Equal(t, cuda.StreamLegacy, live[0].Stream)
	assert.Contains(t, live[0].Where, "TestTrackerDoubleFree", "the trace names the caller")
	assert.Equal(t, "model.py:12", live[1].Where)
	assert.False(t, live[0].Time.IsZero())

	require.NoError(t, s.Deallocate(p, 4*KiB, cuda.StreamLegacy))
	frees := drv.Calls("cuMemFreeAsync")
	err = s.Deallocate(p, 4*KiB, cuda.StreamLegacy)
	e := asCUDA(t, err)
	assert.Equal(t, cuda.ErrorInvalidValue, e.Result)
	assert.Contains(t, e.Msg, "not allocated by this resource (or already freed)")
	err = s.Deallocate(0xdead00, 4*KiB, cuda.StreamLegacy)
	assert.ErrorIs(t, err, cuda.ErrInvalidValue)
	err = s.Deallocate(q, 4*KiB, cuda.StreamLegacy)
	assert.ErrorIs(t, err, cuda.ErrInvalidValue, "wrong size")
	assert.Equal(t, frees, drv.Calls("cuMemFreeAsync"), "nothing reached the driver")
	assert.Len(t, s.Live(), 1)
	st := s.Stats()
	assert.Equal(t, 8*KiB, st.InUse)
	assert.Equal(t, uint64(1), st.Frees)
	require.NoError(t, s.Deallocate(q, 8*KiB, cuda.StreamLegacy))
	assert.Empty(t, s.Live())
}

func TestCache(t *testing.T) {
	drv, d := openSim(t)
	pool, err := NewPool(d)
	require.NoError(t, err)
	c := NewCache(pool, CacheOptions{MaxCached: 8 * MiB})
	a, b := newStream(t, drv, d), newStream(t, drv, d)
	allocs := func() int { return drv.Calls("cuMemAllocFromPoolAsync") }
	frees := func() int { return drv.Calls("cuMemFreeAsync") }

	p, err := c.Allocate(MiB, a)
	require.NoError(t, err)
	require.NoError(t, c.Deallocate(p, MiB, a))
	n, f := allocs(), frees()
	q, err := c.Allocate(MiB-100, a) // same class
	require.NoError(t, err)
	assert.Equal(t, p, q, "the block comes back")
	assert.Equal(t, n, allocs(), "with no driver call")
	require.NoError(t, c.Deallocate(q, MiB-100, a))
	assert.Equal(t, f, frees(), "and goes back with no driver call")
	assert.Equal(t, MiB, c.Stats().Cached)

	r, err := c.Allocate(MiB, b)
	require.NoError(t, err)
	assert.NotEqual(t, p, r, "never across streams")
	assert.Equal(t, n+1, allocs())
	require.NoError(t, c.Deallocate(r, MiB, b))
	r2, err := c.Allocate(MiB, 0)
	require.NoError(t, err)
	assert.NotEqual(t, p, r2)
	assert.NotEqual(t, r, r2)
	require.NoError(t, c.Deallocate(r2, MiB, cuda.StreamLegacy)) // 0 and CU_STREAM_LEGACY are one stream
	r3, err := c.Allocate(MiB, 0)
	require.NoError(t, err)
	assert.Equal(t, r2, r3)
	require.NoError(t, c.Deallocate(r3, MiB, 0))

	// The per-thread stream is a different stream on each thread: never cached.
	pt, err := c.Allocate(MiB, cuda.StreamPerThread)
	require.NoError(t, err)
	f = frees()
	require.NoError(t, c.Deallocate(pt, MiB, cuda.StreamPerThread))
	assert.Equal(t, f+1, frees())

	// Bounded by MaxCached: 8 MiB, 3 held; 7 blocks of 1 MiB on a (the first from the cache, which then
	// holds 2 MiB), freed again: only 6 fit.
	var ps []cuda.DevicePtr
	for range 7 {
		p, err := c.Allocate(MiB, a)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	f = frees()
	for _, p := range ps {
		require.NoError(t, c.Deallocate(p, MiB, a))
	}
	assert.Equal(t, f+1, frees())
	assert.Equal(t, 8*MiB, c.Stats().Cached)

	// Too large for the classes: straight through.
	n, f = allocs(), frees()
	big, err := c.Allocate(65*MiB, a)
	require.NoError(t, err)
	require.NoError(t, c.Deallocate(big, 65*MiB, a))
	assert.Equal(t, n+1, allocs())
	assert.Equal(t, f+1, frees())

	// Release empties it and trims the pool.
	assert.Greater(t, c.Cached(), 8*MiB, "the pool's reserve counts too")
	f = frees()
	require.NoError(t, c.Release())
	assert.Equal(t, f+8, frees())
	assert.Zero(t, c.Cached())
	st := c.Stats()
	assert.Zero(t, st.Blocks)
	assert.Zero(t, st.Cached)
	res, err := pool.Reserved()
	require.NoError(t, err)
	assert.Zero(t, res)

	// ReleaseStream before destroying a stream.
	p, err = c.Allocate(2*MiB, b)
	require.NoError(t, err)
	require.NoError(t, c.Deallocate(p, 2*MiB, b))
	require.NoError(t, c.ReleaseStream(b))
	assert.Zero(t, c.Stats().Cached)
	require.NoError(t, drv.StreamDestroy(d.Context(), b))
	require.NoError(t, pool.Close())
}

func TestBadInput(t *testing.T) {
	for _, tc := range strategies {
		t.Run(tc.name, func(t *testing.T) {
			drv, d := openSim(t, small("sim-1g"))
			opts := tc.opts
			opts.Strategy = tc.strategy
			s := newStack(t, d, opts)
			_, err := s.Allocate(0, cuda.StreamLegacy)
			e := asCUDA(t, err)
			assert.Equal(t, cuda.ErrorInvalidValue, e.Result)
			assert.Contains(t, e.Msg, "size must be positive")

			before := drv.Calls("cuMemAllocFromPoolAsync") + drv.Calls("cuMemAlloc_v2")
			for _, size := range []uint64{GiB + 1, 1 << 62, ^uint64(0)} {
				_, err = s.Allocate(size, cuda.StreamLegacy)
				e = asCUDA(t, err)
				assert.Equal(t, cuda.ErrorOutOfMemory, e.Result)
				assert.Contains(t, e.Msg, "larger than the device's total memory")
			}
			assert.Equal(t, before, drv.Calls("cuMemAllocFromPoolAsync")+drv.Calls("cuMemAlloc_v2"), "no driver call")
			assert.Zero(t, s.Stats().InUse)
		})
	}
	_, d := openSim(t)
	_, err := New(d, "bogus")
	assert.ErrorIs(t, err, cuda.ErrInvalidValue)
}

func TestManagedAndPinned(t *testing.T) {
	drv, d := openSim(t)
	m := NewManaged(d)
	p, err := m.Allocate(MiB, 0)
	require.NoError(t, err)
	require.NoError(t, drv.MemcpyHtoD(d.Context(), p, []byte("hello")))
	require.NoError(t, m.Deallocate(p, MiB, 0))
	_, err = m.Allocate(0, 0)
	assert.ErrorIs(t, err, cuda.ErrInvalidValue)

	h := NewPinned(d, 0)
	b1, err := h.AllocateHost(4 * KiB)
	require.NoError(t, err)
	b2, err := h.AllocateHost(8 * KiB)
	require.NoError(t, err)
	copy(b1, "pinned")
	assert.Equal(t, PinnedStats{InUse: 12 * KiB, PeakInUse: 12 * KiB, Allocations: 2}, h.Stats())
	require.NoError(t, h.FreeHost(b1))
	require.NoError(t, h.FreeHost(b2))
	assert.Equal(t, PinnedStats{InUse: 0, PeakInUse: 12 * KiB, Allocations: 2, Frees: 2}, h.Stats())
	assert.ErrorIs(t, h.FreeHost(nil), cuda.ErrInvalidValue)
	_, err = h.AllocateHost(0)
	assert.ErrorIs(t, err, cuda.ErrInvalidValue)
}

func TestPoolThreshold(t *testing.T) {
	drv, d := openSim(t)
	p, err := NewPool(d)
	require.NoError(t, err)
	th, err := p.ReleaseThreshold()
	require.NoError(t, err)
	assert.Equal(t, ^uint64(0), th, "kept across synchronize by default")
	x, err := p.Allocate(10*MiB, 0)
	require.NoError(t, err)
	require.NoError(t, p.Deallocate(x, 10*MiB, 0))
	require.NoError(t, drv.CtxSynchronize(d.Context()))
	res, _ := p.Reserved()
	used, _ := p.Used()
	assert.Equal(t, 10*MiB, res)
	assert.Zero(t, used)
	assert.Equal(t, 10*MiB, p.Cached())
	require.NoError(t, p.Trim(0))
	assert.Zero(t, p.Cached())

	require.NoError(t, p.SetReleaseThreshold(0))
	x, err = p.Allocate(10*MiB, 0)
	require.NoError(t, err)
	require.NoError(t, p.Deallocate(x, 10*MiB, 0))
	require.NoError(t, drv.CtxSynchronize(d.Context()))
	assert.Zero(t, p.Cached(), "threshold 0 gives memory back at each synchronize")

	own, err := NewPool(d, OwnPool(), WithReleaseThreshold(MiB))
	require.NoError(t, err)
	assert.NotEqual(t, p.Handle(), own.Handle())
	th, _ = own.ReleaseThreshold()
	assert.Equal(t, MiB, th)
	require.NoError(t, own.Close())
	_, err = own.Allocate(MiB, 0)
	assert.Error(t, err, "a destroyed pool cannot allocate")
	require.NoError(t, p.Close())
}

func TestOOMVerdicts(t *testing.T) {
	_, d := openSim(t, small("sim-1g")) // 960 MiB free
	cause := cuda.NewError("cuMemAlloc_v2", cuda.ErrorOutOfMemory, "")
	limitCause := cuda.NewError(LimitOp, cuda.ErrorOutOfMemory, "", field("limit", 100*MiB), field("in_use", 60*MiB))
	nvml := func(procs ...ProcessUsage) func() ([]ProcessUsage, bool) {
		return func() ([]ProcessUsage, bool) { return procs, true }
	}
	probe := func(ok bool) func(uint64) bool { return func(uint64) bool { return ok } }
	for _, tc := range []struct {
		name      string
		requested uint64
		cause     error
		ps        PoolState
		verdict   string
		lead      string
		msg       string
	}{
		{"too large", 2 * GiB, cause, PoolState{}, CauseTooLarge, "the request is larger than the device: ",
			"larger than the device's total memory"},
		{"limit", 80 * MiB, limitCause, PoolState{}, CauseLimit, "a cudacore memory limit was hit: ",
			"60.0 MiB of the 100.0 MiB limit is in use"},
		{"free but pool refused", 500 * MiB, cause, PoolState{Pool: true, Probe: probe(true)}, CausePoolReservation,
			"the driver refused the pool's reservation: ", "can be allocated outside the pool"},
		{"free but no block", 500 * MiB, cause, PoolState{Pool: true, Probe: probe(false)}, CauseFragmentation,
			"fragmentation or cache: ", "No free block of 500.0 MiB exists"},
		{"free, retried", 500 * MiB, &retriedError{released: 300 * MiB, err: cause}, PoolState{}, CauseFragmentation,
			"fragmentation or cache: ", "cudacore released 300.0 MiB of cached memory and retried, but no free block"},
		{"others by nvml", 1000 * MiB, cause, PoolState{Others: nvml(ProcessUsage{PID: 7, Used: 500 * MiB})},
			CauseOtherProcesses, "memory held by other processes: ", "Other processes hold 500.0 MiB on this device (NVML): pid 7 500.0 MiB"},
		{"nvml sees nobody", 1000 * MiB, cause, PoolState{Others: nvml()}, CauseExhausted,
			"memory exhausted by this process: ", "Free memory"},
		{"ours exceed others", 1000 * MiB, cause, PoolState{InUse: 700 * MiB, Others: nvml(ProcessUsage{PID: 7, Used: 200 * MiB})},
			CauseExhausted, "memory exhausted by this process: ", "Free memory"},
		{"no nvml, small gap", 1000 * MiB, cause, PoolState{}, CauseExhausted, "memory exhausted by this process: ", "Free memory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := OutOfMemory(d, tc.requested, tc.cause, tc.ps)
			got, _ := e.Field("cause")
			assert.Equal(t, tc.verdict, got)
			assert.True(t, strings.HasPrefix(e.Msg, tc.lead), e.Msg)
			assert.Contains(t, e.Msg, tc.msg)
			assert.Equal(t, cuda.ErrorOutOfMemory, e.Result)
		})
	}
	e := OutOfMemory(d, 500*MiB, nil, PoolState{Limit: GiB})
	assert.Equal(t, "cudacore.allocate", e.Op)
	got, _ := e.Field("limit")
	assert.Equal(t, "1073741824", got)
}

// NVML that sees none of the memory used (processes in other containers) does not hide a large gap.
func TestOOMVerdictNVMLBlind(t *testing.T) {
	drv, d := openSim(t, cudasim.H100())
	require.NoError(t, drv.SetMemoryConditions(0, cudasim.MemoryConditions{OtherProcesses: []cudasim.ProcessMemory{{PID: 9, Used: 40 * GiB}}}))
	blind := func() ([]ProcessUsage, bool) { return []ProcessUsage{}, true }
	e := OutOfMemory(d, 50*GiB, cuda.NewError("cuMemAlloc_v2", cuda.ErrorOutOfMemory, ""), PoolState{Others: blind})
	got, _ := e.Field("cause")
	assert.Equal(t, CauseOtherProcesses, got)
	src, _ := e.Field("others_source")
	assert.Equal(t, "gap", src)
	assert.Contains(t, e.Msg, "NVML sees less than that: processes in other containers are invisible to it")
}

// Memory the process's other libraries hold in the allocator's pool is this process's: a gap it explains
// is not blamed on other processes, and the message names it.
func TestOOMVerdictPoolOthers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ps      PoolState
		verdict string
		msg     string
	}{
		{"the gap unexplained", PoolState{}, CauseOtherProcesses, "used outside this process's allocator"},
		{"the pool's other libraries", PoolState{PoolOthers: 40 * GiB}, CauseExhausted,
			"the process's other libraries 40.0 GiB in the same pool"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			drv, d := openSim(t, cudasim.H100())
			// 40 GiB used on the device that cudacore's allocator does not hold, and no NVML to say whose.
			require.NoError(t, drv.SetMemoryConditions(0, cudasim.MemoryConditions{
				OtherProcesses: []cudasim.ProcessMemory{{PID: 9, Used: 40 * GiB}}, NoNVML: true}))
			e := OutOfMemory(d, 50*GiB, cuda.NewError("torch", cuda.ErrorOutOfMemory, ""), tc.ps)
			got, _ := e.Field("cause")
			assert.Equal(t, tc.verdict, got)
			assert.Contains(t, e.Msg, tc.msg)
			assert.Equal(t, "torch", e.Op)
			others, ok := e.Field("pool_others")
			assert.Equal(t, tc.ps.PoolOthers != 0, ok)
			if ok {
				assert.Equal(t, "42949672960", others)
			}
		})
	}
}

// The simulator's conditions produce each verdict through a whole Stack, and the recorder sees it.
func TestStackVerdictsWithSimConditions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		conds   cudasim.MemoryConditions
		size    uint64
		verdict string
		source  string
	}{
		{"other processes (nvml)", cudasim.MemoryConditions{OtherProcesses: []cudasim.ProcessMemory{{PID: 9, Used: 40 * GiB}}}, 50 * GiB, CauseOtherProcesses, "nvml"},
		{"other processes (gap)", cudasim.MemoryConditions{OtherProcesses: []cudasim.ProcessMemory{{PID: 9, Used: 40 * GiB}}, NoNVML: true}, 50 * GiB, CauseOtherProcesses, "gap"},
		{"fragmentation", cudasim.MemoryConditions{MaxBlock: GiB}, 2 * GiB, CauseFragmentation, "nvml"},
		{"pool reservation", cudasim.MemoryConditions{PoolReservationLimit: GiB}, 2 * GiB, CausePoolReservation, "nvml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			drv, d := openSim(t, cudasim.H100())
			require.NoError(t, drv.SetMemoryConditions(0, tc.conds))
			rec := NewRecorder(16)
			others := func() ([]ProcessUsage, bool) {
				list, ok := drv.ProcessList(0)
				out := make([]ProcessUsage, len(list))
				for i, p := range list {
					out[i] = ProcessUsage{PID: p.PID, Used: p.Used}
				}
				return out, ok
			}
			s := newStack(t, d, StackOptions{Recorder: rec, Others: others})
			_, err := s.Allocate(tc.size, 0)
			e := asCUDA(t, err)
			got, _ := e.Field("cause")
			assert.Equal(t, tc.verdict, got, e.Msg)
			src, _ := e.Field("others_source")
			assert.Equal(t, tc.source, src)
			evs, _ := rec.Since(0, 0)
			require.NotEmpty(t, evs)
			last := evs[len(evs)-1]
			assert.Equal(t, EventOOM, last.Kind)
			assert.Equal(t, tc.verdict, last.Note)
			seq, _ := e.Field("event")
			assert.Equal(t, fmt.Sprint(last.Seq), seq)
			assert.Zero(t, s.Stats().InUse)
		})
	}
}

var _ = cudasim.New

// While a stream is captured, the cache keeps out: allocations and frees reach the driver (graph memory
// nodes) and graph memory never enters the free lists, even when freed after the capture.
func TestCacheKeepsOutOfCapture(t *testing.T) {
	runtime.LockOSThread() // a THREAD_LOCAL or GLOBAL capture must end on the thread that began it
	defer runtime.UnlockOSThread()
	drv, d := openSim(t)
	s := newStack(t, d, StackOptions{})
	a := newStream(t, drv, d)
	p, err := s.Allocate(MiB, a)
	require.NoError(t, err)
	require.NoError(t, s.Deallocate(p, MiB, a)) // cached on a

	require.NoError(t, drv.StreamBeginCapture(d.Context(), a, cuda.CaptureModeThreadLocal))
	s.SetCapturing(a, true)
	n, f := drv.Calls("cuMemAllocFromPoolAsync"), drv.Calls("cuMemFreeAsync")
	g1, err := s.Allocate(MiB, a)
	require.NoError(t, err)
	assert.NotEqual(t, p, g1, "the cached block is not baked into the graph")
	assert.Equal(t, n+1, drv.Calls("cuMemAllocFromPoolAsync"))
	require.NoError(t, s.Release()) // a release during the capture keeps the stream marked
	g2, err := s.Allocate(MiB, a)
	require.NoError(t, err)
	require.NoError(t, s.Deallocate(g1, MiB, a))
	assert.Equal(t, f+1, drv.Calls("cuMemFreeAsync"), "a free during capture is a free node")
	graph, err := drv.StreamEndCapture(d.Context(), a)
	require.NoError(t, err)
	s.SetCapturing(a, false)

	// g2 is graph memory freed after the capture: it goes to the driver, never to the free lists.
	f = drv.Calls("cuMemFreeAsync")
	_ = s.Deallocate(g2, MiB, a)
	assert.Equal(t, f+1, drv.Calls("cuMemFreeAsync"))
	assert.Equal(t, 1, s.Cache().Stats().Blocks, "only the block cached before the capture, kept through its Release")
	require.NoError(t, drv.GraphDestroy(d.Context(), graph))

	// Outside the capture the cache works again.
	p, err = s.Allocate(MiB, a)
	require.NoError(t, err)
	require.NoError(t, s.Deallocate(p, MiB, a))
	n = drv.Calls("cuMemAllocFromPoolAsync")
	q, err := s.Allocate(MiB, a)
	require.NoError(t, err)
	assert.Equal(t, p, q)
	assert.Equal(t, n, drv.Calls("cuMemAllocFromPoolAsync"))
	require.NoError(t, s.Deallocate(q, MiB, a))
}

// A release while a blocking stream captures keeps the legacy stream's cached blocks: freeing one there
// would wait on the capture (the driver's 906, which invalidates it), and the block would be lost to the
// cache and the device alike. The fuzzer of tests/fuzz.py found it.
func TestCacheReleaseKeepsLegacyBlocksDuringCapture(t *testing.T) {
	drv, d := openSim(t)
	s := newStack(t, d, StackOptions{})
	free := freeMem(t, d)
	p, err := s.Allocate(MiB, cuda.StreamLegacy)
	require.NoError(t, err)
	require.NoError(t, s.Deallocate(p, MiB, cuda.StreamLegacy)) // cached on the legacy stream

	blocking, err := drv.StreamCreate(d.Context(), 0, 0)
	require.NoError(t, err)
	require.NoError(t, drv.StreamBeginCapture(d.Context(), blocking, cuda.CaptureModeRelaxed))
	s.SetCapturing(blocking, true)
	require.NoError(t, s.Release())
	assert.Equal(t, 1, s.Cache().Stats().Blocks, "the legacy block stays cached during the capture")
	graph, err := drv.StreamEndCapture(d.Context(), blocking)
	require.NoError(t, err, "the capture was not invalidated")
	s.SetCapturing(blocking, false)
	require.NoError(t, drv.GraphDestroy(d.Context(), graph))

	require.NoError(t, s.Release())
	assert.Equal(t, 0, s.Cache().Stats().Blocks)
	assert.Equal(t, free, freeMem(t, d), "the block went back to the device")
	require.NoError(t, drv.StreamDestroy(d.Context(), blocking))
}

// An allocation that runs out of memory on a stream another library is capturing leaves its capture
// intact: the verdict reads no pool attribute and probes nothing (both would invalidate it), and
// Retry makes no room (its release synchronizes the context). PyTorch's test_graph_capture_oom does
// this under torch.cuda.graph: a request larger than the device inside the capture, then capture_end.
func TestOOMOnAStreamCapturedElsewhereKeepsTheCapture(t *testing.T) {
	for _, tc := range strategies[:3] {
		t.Run(tc.name, func(t *testing.T) {
			drv, d := openSim(t)
			s := newStack(t, d, tc.opts)
			ctx := d.Context()
			st, err := drv.StreamCreate(ctx, 1, 0)
			require.NoError(t, err)
			defer func() { _ = drv.StreamDestroy(ctx, st) }()
			require.NoError(t, drv.StreamBeginCapture(ctx, st, cuda.CaptureModeGlobal))
			queries := drv.Calls("cuMemPoolGetAttribute")
			_, err = s.Allocate(2<<40, st)
			require.ErrorIs(t, err, cuda.ErrOutOfMemory)
			assert.Contains(t, err.Error(), "the request is larger than the device")
			assert.Equal(t, queries, drv.Calls("cuMemPoolGetAttribute"), "no pool query during the capture")
			status, err := drv.StreamIsCapturing(ctx, st)
			require.NoError(t, err)
			assert.Equal(t, cuda.CaptureStatusActive, status)
			g, err := drv.StreamEndCapture(ctx, st)
			require.NoError(t, err)
			require.NoError(t, drv.GraphDestroy(ctx, g))
		})
	}
}

// An allocation that a fault injected into the simulator failed gets the verdict "injected", with the
// verdict the device's state would have given kept as cause_without_fault; the next failure, not
// injected, is judged by the device's state again.
func TestAnInjectedOutOfMemorySaysSo(t *testing.T) {
	drv, d := openSim(t)
	s := newStack(t, d, StackOptions{})
	// Both attempts (the allocation and Retry's second try) are answered by the fault.
	drv.InjectFault("cuMemAllocFromPoolAsync", 1, cuda.ErrorOutOfMemory)
	drv.InjectFault("cuMemAllocFromPoolAsync", 2, cuda.ErrorOutOfMemory)
	_, err := s.Allocate(1<<20, cuda.StreamLegacy)
	e := asCUDA(t, err)
	cause, _ := e.Field("cause")
	assert.Equal(t, CauseInjected, cause)
	without, ok := e.Field("cause_without_fault")
	assert.True(t, ok)
	assert.NotEqual(t, CauseInjected, without)
	assert.True(t, strings.HasPrefix(e.Msg, "injected by cudacore.testing: out of memory allocating 1.0 MiB on device 0"), e.Msg)
	assert.Contains(t, e.Msg, "without it the verdict would be "+without)
	_, err = s.Allocate(2<<40, cuda.StreamLegacy)
	cause, _ = asCUDA(t, err).Field("cause")
	assert.Equal(t, CauseTooLarge, cause)
}

// The out-of-memory probe's block whose free the driver refused is not lost: the next probe, Release and
// Close free it again.
func TestProbeBlockWhoseFreeIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		again func(s *Stack) error
	}{
		{"the next probe", func(s *Stack) error { s.probe(MiB); return nil }},
		{"Release", func(s *Stack) error { return s.Release() }},
		{"Close", func(s *Stack) error { return s.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			drv, d := openSim(t)
			s, err := NewStack(d, StackOptions{})
			require.NoError(t, err)
			free0, _, err := d.MemoryInfo()
			require.NoError(t, err)
			drv.InjectFault("cuMemFree_v2", 1, cuda.ErrorInvalidValue)
			assert.True(t, s.probe(MiB), "the block was had")
			free1, _, _ := d.MemoryInfo()
			assert.Equal(t, free0-MiB, free1, "its free was refused")
			require.NoError(t, tc.again(s))
			free2, _, _ := d.MemoryInfo()
			assert.Equal(t, free0, free2, "freed again")
			if tc.name != "Close" {
				require.NoError(t, s.Close())
			}
		})
	}
}
