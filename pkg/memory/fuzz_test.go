package memory

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
)

type liveAlloc struct {
	p    cuda.DevicePtr
	size uint64
}

// runOps interprets ops as an allocation script against r: each op byte allocates (sizes chosen so that
// some fail in the fake with out of memory or InvalidValue) or frees a live allocation. It returns what is
// still live and the counts it saw.
func runOps(t testing.TB, r Resource, ops []byte, sizeScale uint64) (live []liveAlloc, allocs, frees, ooms, fails uint64) {
	for i, b := range ops {
		switch {
		case b%3 != 2 || len(live) == 0:
			size := (uint64(b)*131+uint64(i))%(64*sizeScale) + 1
			p, err := r.Allocate(size, cuda.StreamLegacy)
			if err != nil {
				fails++
				if cuda.ResultOf(err) == cuda.ErrorOutOfMemory {
					ooms++
				}
				continue
			}
			allocs++
			live = append(live, liveAlloc{p, size})
		default:
			j := int(b) % len(live)
			a := live[j]
			live[j] = live[len(live)-1]
			live = live[:len(live)-1]
			if err := r.Deallocate(a.p, a.size, cuda.StreamLegacy); err != nil {
				t.Errorf("free of a live allocation failed: %v", err)
				continue
			}
			frees++
		}
	}
	return live, allocs, frees, ooms, fails
}

func sum(live []liveAlloc) uint64 {
	var n uint64
	for _, a := range live {
		n += a.size
	}
	return n
}

// FuzzStats: random allocation and free sequences, sequential and from several goroutines at once; InUse is
// the sum of the live sizes, the peak is at least InUse, and every count matches.
func FuzzStats(f *testing.F) {
	f.Add([]byte{1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233}, uint8(1))
	f.Add([]byte{0, 0, 0, 2, 2, 2, 7, 11, 14, 22}, uint8(4))
	f.Add([]byte("allocate free allocate free and so on"), uint8(3))
	f.Fuzz(func(t *testing.T, ops []byte, workers uint8) {
		n := int(workers%8) + 1
		fake := newFake()
		st := NewStats(fake)
		type result struct {
			live                       []liveAlloc
			allocs, frees, ooms, fails uint64
		}
		res := make([]result, n)
		var wg sync.WaitGroup
		for w := range n {
			wg.Go(func() {
				var mine []byte
				for i := w; i < len(ops); i += n {
					mine = append(mine, ops[i])
				}
				var r result
				r.live, r.allocs, r.frees, r.ooms, r.fails = runOps(t, st, mine, 1)
				res[w] = r
			})
		}
		wg.Wait()
		var want StatsSnapshot
		var live []liveAlloc
		for _, r := range res {
			live = append(live, r.live...)
			want.Allocations += r.allocs
			want.Frees += r.frees
			want.OOMs += r.ooms
			want.Failures += r.fails
		}
		got := st.Snapshot()
		require.Equal(t, sum(live), got.InUse, "in use is the sum of the live sizes")
		require.Equal(t, fake.liveBytes(), got.InUse)
		require.GreaterOrEqual(t, got.PeakInUse, got.InUse)
		require.Equal(t, want.Allocations, got.Allocations)
		require.Equal(t, want.Frees, got.Frees)
		require.Equal(t, want.OOMs, got.OOMs)
		require.Equal(t, want.Failures, got.Failures)
		if n == 1 { // sequentially the peak is exact: replay to find it
			var cur, peak uint64
			fake2 := newFake()
			st2 := NewStats(fake2)
			runOps(t, &peakProbe{Resource: st2, cur: &cur, peak: &peak}, ops, 1)
			require.Equal(t, peak, st2.Snapshot().PeakInUse)
		}
		for _, a := range live {
			require.NoError(t, st.Deallocate(a.p, a.size, cuda.StreamLegacy))
		}
		got = st.Snapshot()
		require.Zero(t, got.InUse)
		require.Equal(t, got.Allocations, got.Frees)
		st.ResetPeak()
		require.Zero(t, st.Snapshot().PeakInUse)
		require.Empty(t, fake.errs)
	})
}

// peakProbe follows in-use bytes through a sequential script to know the true peak.
type peakProbe struct {
	Resource
	cur, peak *uint64
}

func (p *peakProbe) Allocate(size uint64, s cuda.Stream) (cuda.DevicePtr, error) {
	ptr, err := p.Resource.Allocate(size, s)
	if err == nil {
		*p.cur += size
		*p.peak = max(*p.peak, *p.cur)
	}
	return ptr, err
}

func (p *peakProbe) Deallocate(ptr cuda.DevicePtr, size uint64, s cuda.Stream) error {
	err := p.Resource.Deallocate(ptr, size, s)
	if err == nil {
		*p.cur -= size
	}
	return err
}

// limitWatch checks, inside the inner resource, that what the Limit let through never exceeds the limit.
type limitWatch struct {
	inner Resource
	limit uint64
	mu    sync.Mutex
	cur   uint64
	over  bool
}

func (w *limitWatch) Allocate(size uint64, s cuda.Stream) (cuda.DevicePtr, error) {
	w.mu.Lock()
	w.cur += size
	if w.cur > w.limit {
		w.over = true
	}
	w.mu.Unlock()
	p, err := w.inner.Allocate(size, s)
	if err != nil {
		w.mu.Lock()
		w.cur -= size
		w.mu.Unlock()
	}
	return p, err
}

func (w *limitWatch) Deallocate(p cuda.DevicePtr, size uint64, s cuda.Stream) error {
	err := w.inner.Deallocate(p, size, s)
	if err == nil {
		w.mu.Lock()
		w.cur -= size
		w.mu.Unlock()
	}
	return err
}

// FuzzLimit: concurrent scripts against a limit never take the bytes allocated below over it, and the
// accounting returns to 0 when everything is freed.
func FuzzLimit(f *testing.F) {
	f.Add([]byte{1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233}, uint16(100), uint8(1))
	f.Add([]byte{200, 201, 202, 203, 1, 4, 9, 16, 25}, uint16(1), uint8(4))
	f.Add([]byte("limit limit limit"), uint16(0), uint8(8))
	f.Fuzz(func(t *testing.T, ops []byte, limit uint16, workers uint8) {
		n := int(workers%8) + 1
		fake := newFake()
		watch := &limitWatch{inner: fake, limit: uint64(limit)}
		if limit == 0 {
			watch.limit = ^uint64(0)
		}
		l := NewLimit(watch, uint64(limit))
		lives := make([][]liveAlloc, n)
		var wg sync.WaitGroup
		for w := range n {
			wg.Go(func() {
				var mine []byte
				for i := w; i < len(ops); i += n {
					mine = append(mine, ops[i])
				}
				lives[w], _, _, _, _ = runOps(t, l, mine, 4)
			})
		}
		wg.Wait()
		require.False(t, watch.over, "the limit was exceeded")
		var live []liveAlloc
		for _, lv := range lives {
			live = append(live, lv...)
		}
		require.Equal(t, sum(live), l.InUse())
		if limit != 0 {
			require.LessOrEqual(t, l.InUse(), uint64(limit))
		}
		for _, a := range live {
			require.NoError(t, l.Deallocate(a.p, a.size, cuda.StreamLegacy))
		}
		require.Zero(t, l.InUse())
		require.Zero(t, fake.liveBytes())
		require.Empty(t, fake.errs)
	})
}

// 16 goroutines allocate and free random sizes through full stacks (cache, limit, tracker); everything
// returns to zero.
func TestConcurrentStack(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts StackOptions
	}{
		{"pool+cache", StackOptions{}},
		{"pool+cache+track+limit", StackOptions{Track: true, Limit: 2 * GiB}},
		{"sync", StackOptions{Strategy: "sync"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			drv, d := openSim(t)
			s := newStack(t, d, tc.opts)
			streams := []cuda.Stream{cuda.StreamLegacy, newStream(t, drv, d), newStream(t, drv, d), cuda.StreamPerThread}
			before := freeMem(t, d)
			var wg sync.WaitGroup
			stop := make(chan struct{})
			var releaser sync.WaitGroup
			releaser.Go(func() { // Release racing with the hot path must strand nothing
				for {
					select {
					case <-stop:
						return
					default:
						assert.NoError(t, s.Release())
						time.Sleep(200 * time.Microsecond)
					}
				}
			})
			for g := range 16 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(g), 7))
					type a struct {
						p    cuda.DevicePtr
						size uint64
						s    cuda.Stream
					}
					var live []a
					for range 400 {
						if len(live) > 0 && rng.IntN(2) == 0 {
							j := rng.IntN(len(live))
							x := live[j]
							live = append(live[:j], live[j+1:]...)
							assert.NoError(t, s.Deallocate(x.p, x.size, x.s))
							continue
						}
						size := 1 + rng.Uint64N(1<<uint(8+rng.IntN(20)))
						st := streams[rng.IntN(len(streams))]
						p, err := s.Allocate(size, st)
						if !assert.NoError(t, err) {
							continue
						}
						live = append(live, a{p, size, st})
					}
					for _, x := range live {
						assert.NoError(t, s.Deallocate(x.p, x.size, x.s))
					}
				})
			}
			wg.Wait()
			close(stop)
			releaser.Wait()
			st := s.Stats()
			assert.Zero(t, st.InUse)
			assert.Equal(t, st.Allocations, st.Frees)
			assert.Zero(t, st.Failures)
			assert.Empty(t, s.Live())
			assert.Greater(t, st.PeakInUse, uint64(0))
			require.NoError(t, s.Release())
			assert.Zero(t, s.Stats().Cached)
			assert.Equal(t, before, freeMem(t, d))
		})
	}
}
