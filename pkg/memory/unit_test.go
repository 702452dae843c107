package memory

import (
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
)

func TestFormatBytes(t *testing.T) {
	for _, tc := range []struct {
		n    uint64
		want string
	}{
		{0, "0 B"}, {1, "1 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {1536, "1.5 KiB"},
		{MiB - 1, "1.0 MiB"}, {MiB, "1.0 MiB"}, {84465090560, "78.7 GiB"}, {85017493504, "79.2 GiB"},
		{2 << 40, "2.0 TiB"}, {1 << 60, "1.0 EiB"}, {^uint64(0), "16.0 EiB"},
	} {
		assert.Equal(t, tc.want, FormatBytes(tc.n), "%d", tc.n)
	}
}

func TestSizeClasses(t *testing.T) {
	c := NewCache(newFake(), CacheOptions{})
	assert.Equal(t, 68, c.nClasses, "64 MiB is reached with 68 classes")
	for _, tc := range []struct {
		n     uint64
		idx   int
		class uint64
	}{
		{1, 0, 256}, {256, 0, 256}, {257, 1, 512}, {1000, 3, 1024}, {1024, 3, 1024},
		{1025, 4, 1280}, {1280, 4, 1280}, {1281, 5, 1536}, {2048, 7, 2048}, {2049, 8, 2560},
		{MiB, 43, MiB}, {MiB + 1, 44, MiB + MiB/4}, {48 * MiB, 65, 48 * MiB}, {64 * MiB, 67, 64 * MiB},
	} {
		idx, cs := classOf(tc.n)
		assert.Equal(t, tc.idx, idx, "index of %d", tc.n)
		assert.Equal(t, tc.class, cs, "class of %d", tc.n)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	prevIdx, prevClass := -1, uint64(0)
	check := func(n uint64) {
		idx, cs := classOf(n)
		require.GreaterOrEqual(t, cs, n)
		if n > 1024 {
			require.LessOrEqual(t, cs-n, n/4, "waste of %d must stay under 25%%", n)
		} else {
			require.Less(t, cs-n, uint64(256))
		}
		i2, c2 := classOfIndex(idx)
		require.Equal(t, idx, i2)
		require.Equal(t, cs, c2, "classOfIndex(%d)", idx)
		_, again := classOf(cs)
		require.Equal(t, cs, again, "a class size is its own class")
	}
	for n := uint64(1); n <= 1<<16; n++ {
		check(n)
		idx, cs := classOf(n)
		require.GreaterOrEqual(t, idx, prevIdx)
		require.GreaterOrEqual(t, cs, prevClass)
		prevIdx, prevClass = idx, cs
	}
	for range 20000 {
		check(1 + rng.Uint64N(1<<40))
	}
}

func TestStatsAndLimitOnFake(t *testing.T) {
	f := newFake()
	l := NewLimit(f, 100)
	st := NewStats(l)
	p, err := st.Allocate(60, 0)
	require.NoError(t, err)
	_, err = st.Allocate(50, 0)
	e := asCUDA(t, err)
	assert.Equal(t, cuda.ErrorOutOfMemory, e.Result)
	assert.Equal(t, LimitOp, e.Op)
	for k, v := range map[string]string{"requested": "50", "limit": "100", "in_use": "60"} {
		got, ok := e.Field(k)
		assert.True(t, ok, k)
		assert.Equal(t, v, got, k)
	}
	assert.Contains(t, e.Msg, "memory limit")
	assert.Contains(t, e.Msg, "raise the limit")
	_, err = st.Allocate(14, 0) // the fake fails it: the reservation must be undone
	assert.ErrorIs(t, err, cuda.ErrOutOfMemory)
	assert.Equal(t, uint64(60), l.InUse())
	l.SetLimit(0)
	q, err := st.Allocate(1000, 0)
	require.NoError(t, err)
	require.NoError(t, st.Deallocate(q, 1000, 0))
	require.NoError(t, st.Deallocate(p, 60, 0))
	snap := st.Snapshot()
	assert.Equal(t, StatsSnapshot{InUse: 0, PeakInUse: 1060, Allocations: 2, Frees: 2, OOMs: 2, Failures: 2}, snap)
	st.ResetPeak()
	assert.Zero(t, st.Snapshot().PeakInUse)
	assert.Zero(t, l.InUse())
	// A failed free leaves the counters alone.
	require.Error(t, st.Deallocate(12345, 8, 0))
	assert.Equal(t, uint64(3), st.Snapshot().Failures)
	assert.Equal(t, uint64(2), st.Snapshot().Frees)
}

func TestWalkers(t *testing.T) {
	f := newFake()
	c := NewCache(f, CacheOptions{})
	top := NewTracker(NewStats(NewLimit(NewRetry(c, nil, 0, nil), 0)), 0)
	p, err := top.Allocate(1000, cuda.StreamLegacy)
	require.NoError(t, err)
	require.NoError(t, top.Deallocate(p, 1000, cuda.StreamLegacy))
	assert.Equal(t, uint64(1024), Cached(top), "the cached block is seen from the top")
	assert.Equal(t, uint64(1024), blockSizeOf(top, 1000))
	assert.Nil(t, DeviceOf(top))
	require.NoError(t, Release(top))
	assert.Zero(t, Cached(top))
	assert.Empty(t, f.live)
	assert.Empty(t, f.errs)
}

// A tile count or size beyond the device is a typed out-of-memory error at once, never the Go runtime's
// own out-of-memory (a slice sized by the count) nor hours of allocations.
func TestTilesBeyondTheDeviceFailAtOnce(t *testing.T) {
	for _, tc := range []struct {
		count int
		size  uint64
	}{{1 << 40, 16}, {1 << 30, 1 << 20}, {1<<16 + 1, 1 << 20}, {3, 1 << 40}} {
		_, d := openSim(t, small("tiles"))
		s := newStack(t, d, StackOptions{})
		_, err := s.AllocateTiles(tc.count, tc.size, 0, nil)
		require.Error(t, err)
		assert.ErrorIs(t, err, cuda.ErrOutOfMemory, "%d x %d", tc.count, tc.size)
		assert.Zero(t, s.Stats().InUse)
	}
}

func TestCacheKeepsOnlyStreamsItMayOutlive(t *testing.T) {
	const own, foreign = cuda.Stream(0x1000), cuda.Stream(0x2000)
	f := newFake()
	f.oomEvery, f.badEvery = 0, 0
	c := NewCache(f, CacheOptions{Keep: func(s cuda.Stream) bool { return s == own }})
	for _, tc := range []struct {
		name string
		s    cuda.Stream
		kept bool
	}{
		{"the legacy stream is always kept", cuda.StreamLegacy, true},
		{"a stream Keep vouches for", own, true},
		{"a stream another library owns goes straight back", foreign, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := f.liveBytes()
			p, err := c.Allocate(4096, tc.s)
			require.NoError(t, err)
			require.NoError(t, c.Deallocate(p, 4096, tc.s))
			if tc.kept {
				assert.Equal(t, before+4096, f.liveBytes(), "the block waits in the cache")
			} else {
				assert.Equal(t, before, f.liveBytes(), "the block was freed at once on its stream")
			}
		})
	}
	require.NoError(t, c.Release())
	assert.Zero(t, f.liveBytes())
	assert.Empty(t, f.errs)
}

func TestCacheReleasesNothingWhileQuiet(t *testing.T) {
	f := newFake()
	f.oomEvery, f.badEvery = 0, 0
	var capturing atomic.Bool
	c := NewCache(f, CacheOptions{Quiet: capturing.Load})
	const s = cuda.Stream(0x1000)
	for _, h := range []cuda.Stream{s, cuda.StreamLegacy} {
		p, err := c.Allocate(4096, h)
		require.NoError(t, err)
		require.NoError(t, c.Deallocate(p, 4096, h))
	}
	capturing.Store(true)
	require.NoError(t, c.Release())
	assert.Equal(t, uint64(2*4096), f.liveBytes(), "no free reaches the resource below during a capture")
	assert.Equal(t, uint64(2*4096), c.Cached(), "the blocks stay cached, none lost")
	capturing.Store(false)
	require.NoError(t, c.Release())
	assert.Zero(t, f.liveBytes())
	assert.Zero(t, c.Cached())
	assert.Empty(t, f.errs)
}

// failOnce fails the first free of one address, as the driver's free node fails for graph memory that
// is not (yet) an allocation, and then frees normally.
type failOnce struct {
	*fakeRes
	ptr    cuda.DevicePtr
	failed bool
	frees  int
}

func (f *failOnce) Deallocate(p cuda.DevicePtr, size uint64, s cuda.Stream) error {
	f.frees++
	if p == f.ptr && !f.failed {
		f.failed = true
		return cuda.NewError("cuMemFreeAsync", cuda.ErrorInvalidValue, "not an allocation yet")
	}
	return f.fakeRes.Deallocate(p, size, s)
}

func TestCacheFailedFreeOfCapturedBlockStaysCaptured(t *testing.T) {
	fake := newFake()
	fake.oomEvery, fake.badEvery = 0, 0
	inner := &failOnce{fakeRes: fake}
	c := NewCache(inner, CacheOptions{})
	const s = cuda.Stream(0x1234)
	c.SetCapturing(s, true)
	p, err := c.Allocate(256, s)
	require.NoError(t, err)
	inner.ptr = p
	c.SetCapturing(s, false)

	require.Error(t, c.Deallocate(p, 256, s), "the driver refused the free")
	require.NoError(t, c.Deallocate(p, 256, s), "the retry reaches the driver")
	assert.Equal(t, 2, inner.frees, "both frees went to the driver, none to the free lists")
	assert.Zero(t, fake.liveBytes(), "the block was freed")
	assert.Zero(t, c.Stats().Cached, "nothing entered the cache")
	q, err := c.Allocate(256, s)
	require.NoError(t, err)
	assert.NotEqual(t, p, q, "the refused block was never handed out again from the cache")
	require.NoError(t, c.Deallocate(q, 256, s))
}
