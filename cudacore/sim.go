package cudacore

import (
	"github.com/cudacore/cudacore/cudacore/internal/process"
	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
)

// SimInjectFaults makes later driver calls of the simulator fail, at run time: spec is in the form of
// CUDACORE_SIM_FAULTS ("entry[@ordinal]:nth:code[,...]", nth counted from now, on one device with
// @ordinal). It returns how many faults were added, and refuses (NOT_SUPPORTED) when the process does not
// run on the simulator, and (INVALID_VALUE) a device the simulator does not have, adding nothing.
//
//cudacore:gil hold
func SimInjectFaults(spec string) (int, error) {
	return guard("cudacore.sim.inject_faults", func() (int, error) {
		s, err := process.Sim()
		if err != nil {
			return 0, err
		}
		faults, err := cudasim.ParseFaults(spec)
		if err != nil {
			return 0, err
		}
		for _, f := range faults {
			if f.Device != cudasim.AnyDevice {
				if _, err := process.Lookup(f.Device); err != nil {
					return 0, err
				}
			}
		}
		for _, f := range faults {
			s.InjectDeviceFault(f.Entry, f.Device, f.Nth, f.Code)
		}
		return len(faults), nil
	})
}

// SimClearFaults removes every pending simulator fault (those of CUDACORE_SIM_FAULTS included) and
// returns how many were pending: injected and not yet reached by a call.
//
//cudacore:gil hold
func SimClearFaults() (int, error) {
	return guard("cudacore.sim.clear_faults", func() (int, error) {
		s, err := process.Sim()
		if err != nil {
			return 0, err
		}
		return s.ClearFaults(), nil
	})
}

// SimForeignStream creates a stream on the simulated driver directly, as another library (CuPy, PyTorch)
// creates its own: cudacore does not know it, and only its creator destroys it (SimForeignStreamDestroy).
// It returns the handle. Tests use it to reproduce what other libraries do with their streams.
//
//cudacore:gil hold
func SimForeignStream(ordinal int, nonBlocking bool) (int, error) {
	return guard("cudacore.sim.foreign_stream", func() (int, error) {
		s, d, err := simAndDevice(ordinal)
		if err != nil {
			return 0, err
		}
		flags := cuda.StreamDefault
		if nonBlocking {
			flags = cuda.StreamNonBlocking
		}
		h, err := s.StreamCreate(d.Context(), flags, 0)
		return int(h), err
	})
}

// SimForeignStreamDestroy destroys, at the simulated driver and behind cudacore's back, a stream that
// SimForeignStream made, as its owner would. A later use of the handle ends the process, as on the real
// driver. It returns 0.
//
//cudacore:gil hold
func SimForeignStreamDestroy(ordinal, handle int) (int, error) {
	return guard("cudacore.sim.foreign_stream_destroy", func() (int, error) {
		s, d, err := simAndDevice(ordinal)
		if err != nil {
			return 0, err
		}
		return 0, s.StreamDestroy(d.Context(), cuda.Stream(uint64(handle)))
	})
}

// simAndDevice is the simulator and device ordinal, for the doors that act at the simulated driver.
func simAndDevice(ordinal int) (*cudasim.Driver, *process.Device, error) {
	s, err := process.Sim()
	if err != nil {
		return nil, nil, err
	}
	d, err := process.Lookup(ordinal)
	return s, d, err
}
