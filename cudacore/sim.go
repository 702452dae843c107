package cudacore

import (
	"github.com/cudacore/cudacore/cudacore/internal/process"
	"github.com/cudacore/cudacore/pkg/cudasim"
)

// SimInjectFaults makes later driver calls of the simulator fail, at run time: spec is in the form of
// CUDACORE_SIM_FAULTS ("entry:nth:code[,...]", nth counted from now). It returns how many faults were
// added, and refuses (NOT_SUPPORTED) when the process does not run on the simulator.
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
			s.InjectFault(f.Entry, f.Nth, f.Code)
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
