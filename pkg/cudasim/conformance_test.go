package cudasim_test

import (
	"testing"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cuda/conformance"
	"github.com/cudacore/cudacore/pkg/cudasim"
)

func TestConformance(t *testing.T) {
	conformance.Run(t, func(t *testing.T) cuda.Driver { return cudasim.New() })
}

// The suite must hold on small and pool-less devices too, where the H100-only figures are skipped.
func TestConformanceSmallTCC(t *testing.T) {
	conformance.Run(t, func(t *testing.T) cuda.Driver {
		return cudasim.New(cudasim.WithDevices(cudasim.DeviceConfig{
			Name: "sim-tcc", TotalMemory: 1 << 30, MemoryPoolsSupported: false, TCCDriver: true,
		}))
	})
}

// Two peers and a third device that lacks peer access: the multi-device part of the suite runs in full.
func TestConformanceThreeDevices(t *testing.T) {
	conformance.Run(t, func(t *testing.T) cuda.Driver {
		return cudasim.New(cudasim.WithDevices(
			cudasim.DeviceConfig{Name: "sim0", TotalMemory: 1 << 30, MemoryPoolsSupported: true},
			cudasim.DeviceConfig{Name: "sim1", TotalMemory: 1 << 30, MemoryPoolsSupported: true},
			cudasim.DeviceConfig{Name: "sim-far", TotalMemory: 1 << 30, MemoryPoolsSupported: true, PeerGroup: 1},
		))
	})
}

// A CUDA 12.0 driver, whose pools have no maximum size: the suite's version-dependent parts take the
// other branch.
func TestConformanceCUDA120(t *testing.T) {
	conformance.Run(t, func(t *testing.T) cuda.Driver { return cudasim.New(cudasim.WithDriverVersion(12000)) })
}
