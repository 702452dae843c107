package cudacore

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudacore/cudacore/cudacore/internal/process"
	"github.com/cudacore/cudacore/pkg/cudasim"
)

// The tests of the facade run on the simulator, two devices of one peer group (the pool kind's import
// below opens device 0's memory on device 1), unless CUDACORE_BACKEND says otherwise: the benchmarks of
// share_bench_test.go run on a GPU with CUDACORE_BACKEND=cuda. The backend is chosen once per process,
// so it is chosen here, before any test runs.
const simDevicesForTests = `[{}, {}]`

// envExporter makes the test binary the exporting process of the IPC tests (exporterMain).
const envExporter = "CUDACORE_TEST_EXPORTER"

func TestMain(m *testing.M) {
	for _, kv := range [][2]string{{"CUDACORE_BACKEND", process.BackendSim}, {"CUDACORE_SIM_DEVICES", simDevicesForTests}} {
		if _, set := os.LookupEnv(kv[0]); set {
			continue
		}
		if err := os.Setenv(kv[0], kv[1]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	if size := os.Getenv(envExporter); size != "" {
		os.Exit(exporterMain(size))
	}
	os.Exit(m.Run())
}

// exporterMain is the other process of the IPC tests: it allocates size bytes of "ipc" memory through
// the facade, writes its export (ShareExport's JSON) as one line on stdout, and frees it once stdin
// closes.
func exporterMain(size string) int {
	var n int
	if _, err := fmt.Sscan(size, &n); err != nil {
		fmt.Fprintln(os.Stderr, "exporter:", err)
		return 2
	}
	p, err := ShareAllocate(0, n, 0, process.KindIPC, 0)
	if err == nil {
		var e string
		if e, err = ShareExport(0, p, process.KindIPC); err == nil {
			fmt.Println(e)
			_, _ = io.Copy(io.Discard, os.Stdin)
			_, err = ShareFree(0, p, process.KindIPC, 0)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "exporter:", err)
		return 1
	}
	return 0
}

// exported is what ShareExport returns.
type exported struct {
	Kind   string `json:"kind"`
	Handle string `json:"handle"`
	FD     int    `json:"fd"`
	PoolID string `json:"pool_id"`
}

// startExporter runs exporterMain in a second process and returns its export; the process frees its
// memory and exits when the test ends.
func startExporter(tb testing.TB, size int) exported {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", envExporter, size))
	stdin, err := cmd.StdinPipe()
	require.NoError(tb, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(tb, err)
	cmd.Stderr = os.Stderr
	require.NoError(tb, cmd.Start())
	tb.Cleanup(func() {
		_ = stdin.Close()
		assert.NoError(tb, cmd.Wait(), "the exporter frees its memory and exits")
	})
	line, err := bufio.NewReader(stdout).ReadBytes('\n')
	require.NoError(tb, err, "the exporter's export")
	var e exported
	require.NoError(tb, json.Unmarshal(line, &e), "%s", line)
	return e
}

// simulator is the process's simulator, whose calls the tests count, with its devices open (opening one
// makes calls of its own). The test skips where CUDACORE_BACKEND chose the real driver.
func simulator(tb testing.TB) *cudasim.Driver {
	tb.Helper()
	if b := os.Getenv("CUDACORE_BACKEND"); b != process.BackendSim {
		tb.Skipf("counts the simulator's calls; CUDACORE_BACKEND is %q", b)
	}
	sim, err := process.Sim()
	require.NoError(tb, err)
	for ordinal := range 2 {
		_, err := process.GetDevice(ordinal)
		require.NoError(tb, err)
	}
	return sim
}

// callsOf returns the driver calls fn makes, by entry point.
func callsOf(sim *cudasim.Driver, fn func()) map[string]int {
	before := sim.CallCounts()
	fn()
	return cudasim.CallsBetween(before, sim.CallCounts())
}

// Each door of a round trip of shareable memory makes its own driver call and no other: no pointer or
// context query, no synchronize, no event or stream. (On the real driver each call also reads the
// calling thread's current context, and sets it where it is another: libcuda's cc_ensure, counted by
// libcuda's own tests.) The pool kind's first import of a pool imports the pool too, once.
func TestShareRoundTripMakesOnlyTheDriversCalls(t *testing.T) {
	sim := simulator(t)
	const size = 1 << 20
	var token uint64 = 1 << 40 // far from the tokens other tests could take

	t.Run("ipc", func(t *testing.T) {
		e := startExporter(t, size)
		require.Equal(t, process.KindIPC, e.Kind)
		for round := range 2 {
			token++
			var p int
			calls := callsOf(sim, func() {
				var err error
				p, err = ShareImport(0, e.Kind, e.Handle, e.FD, e.PoolID, size, int(token))
				require.NoError(t, err)
			})
			assert.Equal(t, map[string]int{"cuIpcOpenMemHandle_v2": 1}, calls, "import, round %d", round)
			assert.NotZero(t, p)
			calls = callsOf(sim, func() {
				_, err := OwnedFree(int(token))
				require.NoError(t, err)
			})
			assert.Equal(t, map[string]int{"cuIpcCloseMemHandle": 1}, calls, "close, round %d", round)
			calls = callsOf(sim, func() {
				_, err := OwnedFree(int(token))
				require.NoError(t, err)
			})
			assert.Empty(t, calls, "a second close of the token closes nothing")
		}

		p, err := ShareAllocate(0, size, 0, process.KindIPC, 0)
		require.NoError(t, err)
		defer func() { _, _ = ShareFree(0, p, process.KindIPC, 0) }()
		calls := callsOf(sim, func() {
			_, err := ShareExport(0, p, process.KindIPC)
			require.NoError(t, err)
		})
		assert.Equal(t, map[string]int{"cuIpcGetMemHandle": 1}, calls, "export")
	})

	t.Run("pool", func(t *testing.T) {
		n, err := DeviceCount()
		require.NoError(t, err)
		require.GreaterOrEqual(t, n, 2, "the pool kind's import opens device 0's memory on device 1: CUDACORE_SIM_DEVICES needs two devices")
		p, err := ShareAllocate(0, size, 0, process.KindPool, 0)
		require.NoError(t, err)
		defer func() { _, _ = ShareFree(0, p, process.KindPool, 0) }()
		var text string
		calls := callsOf(sim, func() {
			text, err = ShareExport(0, p, process.KindPool)
			require.NoError(t, err)
		})
		assert.Equal(t, map[string]int{"cuMemPoolExportPointer": 1, "cuMemPoolExportToShareableHandle": 1}, calls, "export")
		var e exported
		require.NoError(t, json.Unmarshal([]byte(text), &e))
		defer os.NewFile(uintptr(e.FD), "pool").Close()
		for round, want := range []map[string]int{
			{"cuMemPoolImportFromShareableHandle": 1, "cuMemPoolImportPointer": 1},
			{"cuMemPoolImportPointer": 1},
		} {
			token++
			calls := callsOf(sim, func() {
				_, err := ShareImport(1, e.Kind, e.Handle, e.FD, e.PoolID, size, int(token))
				require.NoError(t, err)
			})
			assert.Equal(t, want, calls, "import, round %d", round)
			calls = callsOf(sim, func() {
				_, err := OwnedFree(int(token))
				require.NoError(t, err)
			})
			assert.Equal(t, map[string]int{"cuMemFree_v2": 1}, calls, "close, round %d", round)
		}
	})
}
