package process

import (
	"math/rand"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cudacore/cudacore/cudacore/internal/snapshot"
	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/memory"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The process-wide driver is chosen once per process; these tests use the pieces below it, and the
// simulator (CUDACORE_BACKEND=sim) for what needs the whole process.

func TestOpenBackends(t *testing.T) {
	cases := []struct {
		name, backend string
		err           error
	}{
		{"unknown", "quantum", cuda.ErrInvalidValue},
		{"sim", "sim", nil},
		{"sim, any case", " SIM ", nil},
		{"real driver missing", "cuda", cuda.ErrDriverNotFound},
	}
	t.Setenv("CUDACORE_LIBCUDA", "/nonexistent/libcuda.so.1")
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, d, err := open(c.backend)
			if c.err != nil {
				require.Error(t, err)
				assert.ErrorIs(t, err, c.err)
				return
			}
			require.NoError(t, err)
			assert.NotNil(t, d)
		})
	}
}

// getenv must see variables set after the library loaded (os.Setenv goes through setenv with cgo), which
// os.Getenv in a c-shared library does not.
func TestGetenvReadsTheLiveEnvironment(t *testing.T) {
	t.Setenv("CUDACORE_TEST_VAR", "live")
	assert.Equal(t, "live", getenv("CUDACORE_TEST_VAR"))
	require.NoError(t, os.Unsetenv("CUDACORE_TEST_VAR"))
	assert.Equal(t, "", getenv("CUDACORE_TEST_VAR"))
}

func TestSimFromEnv(t *testing.T) {
	t.Setenv("CUDACORE_SIM_DEVICES", `[{"name": "a", "total_memory": 1073741824}, {"name": "b", "memory_pools_supported": false}]`)
	t.Setenv("CUDACORE_SIM_FAULTS", "cuMemAllocAsync:1:2")
	d, err := simFromEnv()
	require.NoError(t, err)
	require.NoError(t, d.Init())
	n, err := d.DeviceCount()
	require.NoError(t, err)
	assert.Equal(t, 2, n)

	t.Setenv("CUDACORE_SIM_FAULTS", "cuMemAllocAsync:x:2")
	_, err = simFromEnv()
	assert.ErrorIs(t, err, cuda.ErrInvalidValue)
	t.Setenv("CUDACORE_SIM_FAULTS", "")
	t.Setenv("CUDACORE_SIM_DEVICES", "[{")
	_, err = simFromEnv()
	assert.ErrorIs(t, err, cuda.ErrInvalidValue)
}

// The rest runs on the process's simulator: devices, the allocator's strategy and the routing of frees
// recorded against a destroyed stream.
func TestDevicesOnTheSimulator(t *testing.T) {
	t.Setenv("CUDACORE_BACKEND", "sim")
	_, backend, err := Driver()
	require.NoError(t, err)
	require.Equal(t, BackendSim, backend)

	d, err := Lookup(0)
	require.NoError(t, err)
	again, err := GetDevice(0)
	require.NoError(t, err)
	assert.Same(t, d, again, "one Device per ordinal")
	_, err = Lookup(7)
	assert.ErrorIs(t, err, cuda.ErrInvalidValue)

	p, err := d.Allocate(1<<20, 0)
	require.NoError(t, err)
	err = d.SetStrategy("sync", memory.StackOptions{})
	assert.ErrorIs(t, err, cuda.ErrIllegalState, "refused while memory is allocated")
	require.NoError(t, d.Free(p, 1<<20, 0))
	require.NoError(t, d.SetStrategy("sync", memory.StackOptions{}))
	assert.Equal(t, "sync", string(d.Strategy()))
	require.NoError(t, d.SetStrategy("auto", memory.StackOptions{}))

	s, err := d.Streams().Create(true, 0)
	require.NoError(t, err)
	q, err := d.Allocate(4096, s.Handle())
	require.NoError(t, err)
	require.NoError(t, s.Destroy())
	require.NoError(t, d.Free(q, 4096, s.Handle()), "a free recorded against a destroyed stream goes to the legacy stream")
	_, err = d.Allocate(4096, s.Handle())
	assert.ErrorIs(t, err, cuda.ErrInvalidHandle)
	assert.Zero(t, d.Memory().Stats().InUse)
}

func TestPageableDirectMaxFromEnv(t *testing.T) {
	cases := []struct {
		in   string
		want int
		bad  bool
	}{
		{"", 0, false}, {" ", 0, false}, {"0", -1, false}, {"65536", 65536, false}, {" 4194304 ", 4194304, false},
		{"-1", 0, true}, {"4M", 0, true}, {"1.5", 0, true}, {"99999999999999999999", 0, true},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			got, err := pageableDirectMax(c.in)
			if c.bad {
				require.Error(t, err)
				assert.ErrorIs(t, err, cuda.ErrInvalidValue)
				assert.Contains(t, err.Error(), envPageableDirectMax)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
}

// simDevice opens device 0 on the simulator, with what C logged applied (Replay), so that its statistics
// are current.
func simDevice(t *testing.T) *Device {
	t.Helper()
	t.Setenv("CUDACORE_BACKEND", "sim")
	d, err := GetDevice(0)
	require.NoError(t, err)
	Replay()
	return d
}

// A strategy switch closes the old allocator, whose cache frees its blocks on their streams, while other
// goroutines create streams, allocate and free on them, and destroy them. A stream's destroy gives back
// its cached blocks through the current allocator first, so the old cache must be released while it is
// still current: otherwise a free reaches the driver with a destroyed stream's handle (the simulator ends
// the test process there, as the real driver crashes).
func TestStrategySwitchesWhileStreamsComeAndGo(t *testing.T) {
	d := simDevice(t)
	before := d.Memory().Stats().InUse
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var switched, cycles atomic.Int64
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(w)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				s, err := d.Streams().Create(true, 0)
				if !assert.NoError(t, err) {
					return
				}
				id := Streams.Add(int(s.Handle()), s) // the cache keeps blocks only of streams the process knows
				for range 1 + r.Intn(4) {
					n := uint64(512 << r.Intn(8))
					if p, err := d.Allocate(n, s.Handle()); err == nil {
						assert.NoError(t, d.Free(p, n, s.Handle()))
					}
				}
				time.Sleep(time.Duration(r.Intn(50)) * time.Microsecond)
				Streams.Remove(id)
				assert.NoError(t, s.Destroy())
				cycles.Add(1)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			// Refused while another goroutine's allocation is out: that is the rule, not a failure.
			if d.SetStrategy([]string{"pool", "auto", "sync"}[i%3], memory.StackOptions{}) == nil {
				switched.Add(1)
			}
		}
	}()
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	require.NoError(t, d.SetStrategy("auto", memory.StackOptions{}))
	assert.Positive(t, switched.Load(), "strategies switched")
	assert.Positive(t, cycles.Load(), "streams came and went")
	assert.Equal(t, before, d.Memory().Stats().InUse, "nothing left allocated")
}

// Go publishes what the C fast path decides on (package snapshot): a device's facts when it opens, its
// allocator's blocking with each strategy change, and the count of captures from registration (before the
// driver begins) to unregistration (after the driver ended).
func TestTheSnapshotFollowsGo(t *testing.T) {
	d := simDevice(t)
	f := snapshot.Device(0)
	assert.Equal(t, snapshot.DirectSim, f.Direct)
	assert.Equal(t, uint64(d.Context()), f.Context)
	assert.Equal(t, int64(d.Streams().PageableDirectMax()), f.PageableMax)
	old := d.Strategy()
	for _, s := range []string{"sync", "pool"} {
		require.NoError(t, d.SetStrategy(s, memory.StackOptions{}))
		assert.Equal(t, s == "sync", snapshot.Device(0).Blocking, s)
	}
	require.NoError(t, d.SetStrategy(string(old), memory.StackOptions{}))

	s, err := d.Streams().Create(true, 0)
	require.NoError(t, err)
	defer func() { assert.NoError(t, s.Destroy()) }()
	assert.Equal(t, int32(0), snapshot.Captures())
	require.NoError(t, s.BeginCapture(cuda.CaptureModeThreadLocal))
	assert.Equal(t, int32(1), snapshot.Captures())
	g, err := s.EndCapture()
	require.NoError(t, err)
	assert.Equal(t, int32(0), snapshot.Captures())
	require.NoError(t, g.Destroy())
}

func TestOnOffSettingsFromTheEnvironment(t *testing.T) {
	cases := []struct {
		v    string
		on   bool
		fail bool
	}{{"", true, false}, {"1", true, false}, {" 0 ", false, false}, {"0", false, false}, {"maybe", false, true}, {"2", false, true}}
	for _, c := range cases {
		on, err := switchOn(envDirect, c.v)
		if c.fail {
			require.Error(t, err, c.v)
			assert.ErrorIs(t, err, cuda.ErrInvalidValue)
			assert.Contains(t, err.Error(), "CUDACORE_DIRECT")
			continue
		}
		require.NoError(t, err, c.v)
		assert.Equal(t, c.on, on, c.v)
	}
}
