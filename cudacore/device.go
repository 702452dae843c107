package cudacore

import (
	"encoding/json"

	"github.com/cudacore/cudacore/cudacore/internal/process"
	"github.com/cudacore/cudacore/pkg/device"
)

// Backend returns the name of the backend this process uses, "cuda" or "sim", loading and initializing
// the driver on first use (which takes ~200 ms on a real GPU: hence the GIL is released).
//
//cudacore:gil release
func Backend() (string, error) {
	return guard("cudacore.backend", func() (string, error) {
		_, name, err := process.Driver()
		return name, err
	})
}

// DriverVersion returns the driver's CUDA version as 1000*major + 10*minor (13000 for CUDA 13.0).
//
//cudacore:gil release
func DriverVersion() (int, error) {
	return guard("cudacore.driver_version", func() (int, error) {
		drv, _, err := process.Driver()
		if err != nil {
			return 0, err
		}
		return drv.Version()
	})
}

// DeviceCount returns the number of devices.
//
//cudacore:gil release
func DeviceCount() (int, error) {
	return guard("cudacore.device_count", process.DeviceCount)
}

// deviceJSON is what DeviceProperties returns: the static properties plus the allocation strategy.
type deviceJSON struct {
	device.Properties
	Backend                  string `json:"backend"`
	AllocationStrategy       string `json:"allocation_strategy"`
	AllocationStrategyReason string `json:"allocation_strategy_reason"`
}

// DeviceProperties opens the device at ordinal (retaining its primary context, ~150 ms the first time on
// a real GPU) and returns its properties and allocation strategy as a JSON object.
//
//cudacore:gil release
func DeviceProperties(ordinal int) (string, error) {
	return guard("cudacore.device_properties", func() (string, error) {
		d, err := process.GetDevice(ordinal)
		if err != nil {
			return "", err
		}
		_, backend, _ := process.Driver()
		b, err := json.Marshal(deviceJSON{d.Properties(), backend, string(d.Strategy()), d.StrategyReason()})
		return string(b), err
	})
}

// DeviceFreeMemory returns the device's free memory in bytes, as cuMemGetInfo reports it.
//
//cudacore:gil hold
func DeviceFreeMemory(ordinal int) (int, error) {
	return guard("cudacore.device_free_memory", func() (int, error) {
		d, err := process.GetDevice(ordinal)
		if err != nil {
			return 0, err
		}
		free, _, err := d.MemoryInfo()
		return int(free), err
	})
}
