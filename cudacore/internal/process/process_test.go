package process

import (
	"os"
	"testing"

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
