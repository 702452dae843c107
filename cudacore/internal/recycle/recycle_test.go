package recycle

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// fresh empties the process's one log and allows logging on devices 0 and 1 up to max bytes; the
// cleanup turns logging off again.
func fresh(t testing.TB, max uint64) {
	t.Helper()
	var o Ops
	Drain(&o)
	Allow(0, max)
	Allow(1, max)
	t.Cleanup(func() {
		Allow(0, 0)
		Allow(1, 0)
		Drain(&o)
	})
}

// drained drains the log and returns its ops with Time zeroed, after checking that each op's time is
// now.
func drained(t testing.TB) []Op {
	t.Helper()
	var o Ops
	Drain(&o)
	out := make([]Op, o.Len())
	for i := range out {
		out[i] = o.At(i)
		age := time.Since(o.When(out[i]))
		require.Greater(t, age, -50*time.Millisecond, "op %d is in the future", i)
		require.Less(t, age, 10*time.Second, "op %d is too old", i)
		out[i].Time = 0
	}
	return out
}

func TestLogOffRefusesEverything(t *testing.T) {
	fresh(t, 0)
	assert.False(t, LogFree(0, 0x1000, 256, 0), "logging is off")
	assert.Zero(t, LogTake(0, 256, 0))
	assert.False(t, Pending())
	Allow(0, 1<<20)
	assert.Equal(t, uint64(1<<20), Allowed(0))
	assert.False(t, LogFree(5, 0x1000, 256, 0), "device 5 was never allowed")
	assert.False(t, LogFree(-1, 0x1000, 256, 0), "a negative ordinal")
	assert.False(t, LogFree(Devices, 0x1000, 256, 0), "an ordinal beyond the table")
	assert.False(t, LogFree(0, 0x1000, 0, 0), "an empty block")
	assert.False(t, LogFree(0, 0x1000, 1<<20+1, 0), "larger than allowed")
	assert.Zero(t, Allowed(-1))
	assert.Empty(t, drained(t))
}

func TestTakeMatchesDeviceSizeAndStreamNewestFirst(t *testing.T) {
	fresh(t, 1<<20)
	require.True(t, LogFree(0, 0x1000, 256, 0))
	require.True(t, LogFree(0, 0x2000, 256, 0))
	require.True(t, LogFree(0, 0x3000, 512, 0))
	require.True(t, LogFree(1, 0x4000, 256, 0))
	assert.True(t, Pending())

	assert.Zero(t, LogTake(0, 256, 1), "another stream")
	assert.Zero(t, LogTake(0, 128, 0), "another size")
	assert.Equal(t, cuda.DevicePtr(0x2000), LogTake(0, 256, 0), "the newest free of the size")
	assert.Equal(t, cuda.DevicePtr(0x1000), LogTake(0, 256, 0))
	assert.Zero(t, LogTake(0, 256, 0), "both were taken; device 1's block is not device 0's")
	assert.Equal(t, cuda.DevicePtr(0x4000), LogTake(1, 256, 0))

	assert.Equal(t, []Op{
		{Device: 0, Ptr: 0x1000, Size: 256, Stream: 0, Kind: Consumed},
		{Device: 0, Ptr: 0x2000, Size: 256, Stream: 0, Kind: Consumed},
		{Device: 0, Ptr: 0x3000, Size: 512, Stream: 0, Kind: Free},
		{Device: 1, Ptr: 0x4000, Size: 256, Stream: 0, Kind: Consumed},
		{Device: 0, Ptr: 0x2000, Size: 256, Stream: 0, Kind: Take},
		{Device: 0, Ptr: 0x1000, Size: 256, Stream: 0, Kind: Take},
		{Device: 1, Ptr: 0x4000, Size: 256, Stream: 0, Kind: Take},
	}, drained(t))
	assert.False(t, Pending(), "drained")
}

func TestFullLogSendsCallersToGo(t *testing.T) {
	fresh(t, 1<<20)
	for i := range Capacity {
		require.True(t, LogFree(0, cuda.DevicePtr(0x1000*(i+1)), 256, 0), "op %d", i)
	}
	assert.False(t, LogFree(0, 0x999000, 256, 0), "full")
	assert.Zero(t, LogTake(0, 256, 0), "a take must append its op: refused when full")
	assert.Len(t, drained(t), Capacity)
	assert.True(t, LogFree(0, 0x1000, 256, 0), "room again after the drain")
}

func TestStoppingKeepsWhatWasLogged(t *testing.T) {
	fresh(t, 1<<20)
	require.True(t, LogFree(0, 0x1000, 256, 0))
	Allow(0, 0)
	assert.Zero(t, LogTake(0, 256, 0), "logging stopped: the free waits for Go")
	assert.Equal(t, []Op{{Device: 0, Ptr: 0x1000, Size: 256, Kind: Free}}, drained(t))
}

// model is the log's contract in Go: FuzzLog checks the C log against it.
type model struct {
	max [2]uint64
	ops []Op
}

func (m *model) free(d int, p cuda.DevicePtr, size uint64, s cuda.Stream) bool {
	if size == 0 || size > m.max[d] || len(m.ops) >= Capacity {
		return false
	}
	m.ops = append(m.ops, Op{Device: d, Ptr: p, Size: size, Stream: s, Kind: Free})
	return true
}

func (m *model) take(d int, size uint64, s cuda.Stream) cuda.DevicePtr {
	if size == 0 || size > m.max[d] || len(m.ops) >= Capacity {
		return 0
	}
	for i := len(m.ops) - 1; i >= 0; i-- {
		if op := &m.ops[i]; op.Kind == Free && op.Device == d && op.Size == size && op.Stream == s {
			op.Kind = Consumed
			m.ops = append(m.ops, Op{Device: d, Ptr: op.Ptr, Size: size, Stream: s, Kind: Take})
			return op.Ptr
		}
	}
	return 0
}

// FuzzLog runs a program of frees, takes, drains and limit changes (two bytes an op) against the C log
// and the model.
func FuzzLog(f *testing.F) {
	f.Add([]byte{0, 1, 1, 1, 0, 2, 1, 2, 3, 0})
	f.Add([]byte{4, 0, 0, 1, 1, 1, 2, 0, 1, 1})
	f.Fuzz(func(t *testing.T, prog []byte) {
		fresh(t, 1<<10)
		m := &model{max: [2]uint64{1 << 10, 1 << 10}}
		next := cuda.DevicePtr(0x1000)
		for i := 0; i+1 < len(prog); i += 2 {
			op, arg := prog[i]%5, prog[i+1]
			d := int(arg & 1)
			size := uint64(arg>>1&3) * 512 // 0, 512, 1024 (at the limit) or 1536 (over it)
			s := cuda.Stream(arg >> 3 & 1)
			switch op {
			case 0, 1:
				next += 0x1000
				require.Equal(t, m.free(d, next, size, s), LogFree(d, next, size, s), "free #%d", i/2)
			case 2, 3:
				require.Equal(t, m.take(d, size, s), LogTake(d, size, s), "take #%d", i/2)
			case 4:
				if arg&2 != 0 {
					got := drained(t)
					if len(m.ops) == 0 {
						require.Empty(t, got)
					} else {
						require.Equal(t, m.ops, got)
					}
					m.ops = nil
				} else {
					max := uint64(arg>>2) * 64
					m.max[d] = max
					Allow(d, max)
				}
			}
		}
		got := drained(t)
		if len(m.ops) == 0 {
			assert.Empty(t, got)
		} else {
			assert.Equal(t, m.ops, got)
		}
	})
}

// Many threads free and take while another drains: every take hands out a block that was freed and not
// taken since, and the drained ops account for every logged call exactly once.
func TestConcurrentUseLosesNothing(t *testing.T) {
	fresh(t, 1<<20)
	const workers, rounds = 4, 2000
	var (
		mu     sync.Mutex
		ops    []Op
		frees  [workers]int
		takes  [workers]int
		wg     sync.WaitGroup
		stop   = make(chan struct{})
		drains sync.WaitGroup
	)
	drains.Add(1)
	go func() {
		defer drains.Done()
		for {
			var o Ops // not drained(t): require may not stop the test from this goroutine
			Drain(&o)
			got := make([]Op, o.Len())
			for i := range got {
				got[i] = o.At(i)
			}
			mu.Lock()
			ops = append(ops, got...)
			mu.Unlock()
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				p := cuda.DevicePtr(uint64(w+1)<<32 | uint64(i+1)<<12)
				if LogFree(0, p, 256, 0) {
					frees[w]++
				}
				if LogTake(0, 256, 0) != 0 {
					takes[w]++
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	drains.Wait()
	ops = append(ops, drained(t)...)

	var nFree, nTake int
	for w := range workers {
		nFree += frees[w]
		nTake += takes[w]
	}
	kinds := map[Kind]int{}
	for _, op := range ops {
		kinds[op.Kind]++
	}
	assert.Equal(t, nFree, kinds[Free]+kinds[Consumed], "each logged free drained once")
	assert.Equal(t, nTake, kinds[Take], "each take drained once")
	assert.Equal(t, kinds[Consumed], kinds[Take], "a take consumes a free of its own batch")
}

// An op's time is when C served it, on Go's clock.
func TestOpTimes(t *testing.T) {
	fresh(t, 1<<20)
	start := time.Now()
	require.True(t, LogFree(0, 0x1000, 256, 0))
	time.Sleep(200 * time.Millisecond)
	require.Equal(t, cuda.DevicePtr(0x1000), LogTake(0, 256, 0))
	var o Ops
	Drain(&o)
	require.Equal(t, 2, o.Len())
	free, take := o.When(o.At(0)), o.When(o.At(1))
	// A loaded machine may sleep longer.
	gap := take.Sub(free)
	assert.GreaterOrEqual(t, gap, 190*time.Millisecond)
	assert.Less(t, gap, 5*time.Second)
	assert.Less(t, free.Sub(start).Abs(), 50*time.Millisecond)
}

// A free of a block that overlaps a guarded range (memory a live graph uses) is never logged, on its
// device only; replacing a device's ranges keeps the other devices', and ranges that do not fit change
// nothing.
func TestGuardedRangesAreNeverLogged(t *testing.T) {
	fresh(t, 1<<20)
	t.Cleanup(func() {
		require.True(t, Guard(0, nil, nil))
		require.True(t, Guard(1, nil, nil))
	})
	const s = cuda.StreamLegacy
	require.True(t, Guard(0, []uint64{0x2000, 0x9000}, []uint64{0x3000, 0x9001}))
	require.True(t, Guard(1, []uint64{0x5000}, []uint64{0x6000}))
	for _, tc := range []struct {
		name   string
		device int
		p      cuda.DevicePtr
		size   uint64
		logged bool
	}{
		{"before the range", 0, 0x1000, 0x1000, true},
		{"ending inside it", 0, 0x1800, 0x1000, false},
		{"inside it", 0, 0x2400, 0x100, false},
		{"over a one-byte range (a kernel's pointer argument)", 0, 0x8000, 0x2000, false},
		{"right after it", 0, 0x3000, 0x1000, true},
		{"another device's range", 0, 0x5000, 0x1000, true},
		{"on that device", 1, 0x5800, 0x100, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.logged, LogFree(tc.device, tc.p, tc.size, s))
			drained(t)
		})
	}
	// Replacing device 0's ranges leaves device 1's.
	require.True(t, Guard(0, nil, nil))
	assert.True(t, LogFree(0, 0x2400, 0x100, s))
	assert.False(t, LogFree(1, 0x5800, 0x100, s))
	drained(t)
	// Too many ranges: refused, and the old ones stay.
	lo, hi := make([]uint64, Guards+1), make([]uint64, Guards+1)
	assert.False(t, Guard(0, lo, hi))
	assert.False(t, Guard(0, []uint64{1}, nil), "lo and hi differ in length")
	assert.False(t, LogFree(1, 0x5800, 0x100, s))
	drained(t)
}

// The ops of a burst, served microseconds or less apart, get distinct, increasing times on Go's clock,
// within the burst's span (the op clock is a CPU counter, not the kernel's millisecond tick).
func TestBurstTimesAreDistinctAndIncreasing(t *testing.T) {
	fresh(t, 1<<20)
	start := time.Now()
	const n = 32
	for i := range n {
		require.True(t, LogFree(0, cuda.DevicePtr(0x10000+i*0x1000), 256, 0))
	}
	end := time.Now()
	var o Ops
	Drain(&o)
	require.Equal(t, n, o.Len())
	prev := time.Time{}
	for i := range n {
		at := o.When(o.At(i))
		if i > 0 {
			assert.True(t, at.After(prev), "op %d at %v is not after op %d at %v", i, at, i-1, prev)
		}
		// The conversion is exact to well under a microsecond; allow for a loaded machine.
		assert.False(t, at.Before(start.Add(-50*time.Microsecond)), "op %d before the burst began", i)
		assert.False(t, at.After(end.Add(50*time.Microsecond)), "op %d after the burst ended", i)
		prev = at
	}
	assert.Less(t, o.When(o.At(n-1)).Sub(o.When(o.At(0))), time.Millisecond, "a burst of %d ops spans well under a millisecond", n)
}
