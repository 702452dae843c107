package process

import (
	"github.com/cudacore/cudacore/pkg/cuda/libcuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
	"github.com/cudacore/cudacore/pkg/device"
	"github.com/cudacore/cudacore/pkg/memory"
)

// Recorder is the process's flight recorder: every device's allocator records its events (alloc, free,
// oom, release, trim) here, whichever door the call came through (Buffer, the PyTorch allocator, tiles).
var Recorder = memory.NewRecorder(0)

// withDiagnostics adds the process-wide diagnostics to opts: the recorder, and the source of other
// processes' memory for the out-of-memory verdict (the simulator's model, or NVML on the real driver).
func withDiagnostics(dd *device.Device, opts memory.StackOptions) memory.StackOptions {
	opts.Recorder = Recorder
	ordinal, bus := dd.Properties().Ordinal, dd.Properties().PCIBusID
	if sim, ok := dd.Driver().(*cudasim.Driver); ok {
		opts.Others = func() ([]memory.ProcessUsage, bool) {
			list, ok := sim.ProcessList(ordinal)
			out := make([]memory.ProcessUsage, len(list))
			for i, p := range list {
				out[i] = memory.ProcessUsage{PID: p.PID, Used: p.Used}
			}
			return out, ok
		}
		return opts
	}
	opts.Others = func() ([]memory.ProcessUsage, bool) {
		list, ok := libcuda.OtherProcesses(bus)
		out := make([]memory.ProcessUsage, len(list))
		for i, p := range list {
			out[i] = memory.ProcessUsage{PID: p.PID, Used: p.Used}
		}
		return out, ok
	}
	return opts
}
