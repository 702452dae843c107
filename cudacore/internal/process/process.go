// Package process holds cudacore's process-wide state: the driver chosen for this process and the
// devices opened on it. The facade (package cudacore) and the fast-path exports (internal/fast) both
// reach devices through here, so there is exactly one of each per process.
//
// The driver is chosen once, on first use, from CUDACORE_BACKEND ("cuda", the default, or "sim"); a
// failure to load it is remembered and returned to every later caller, so a process without a driver
// gets the same clear error each time rather than a retry storm of dlopen calls.
package process

import (
	"fmt"
	"strings"
	"sync"

	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cuda/libcuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
	"github.com/cudacore/cudacore/pkg/device"
)

// Backend names accepted in CUDACORE_BACKEND.
const (
	BackendCUDA = "cuda"
	BackendSim  = "sim"
)

var (
	driverOnce sync.Once
	drv        cuda.Driver
	backend    string
	driverErr  error

	devMu   sync.Mutex
	devices = map[int]*Device{}
)

// Device is one open device with everything cudacore keeps for it.
type Device struct {
	*device.Device
}

// Driver returns the process's driver and its backend name, choosing and initializing it on first use.
func Driver() (cuda.Driver, string, error) {
	driverOnce.Do(func() {
		backend, drv, driverErr = open(getenv("CUDACORE_BACKEND"))
		if driverErr == nil {
			driverErr = drv.Init()
		}
	})
	return drv, backend, driverErr
}

func open(name string) (string, cuda.Driver, error) {
	switch strings.ToLower(strings.TrimSpace(name)) {
	case "", BackendCUDA:
		d, err := libcuda.Open(getenv("CUDACORE_LIBCUDA"))
		if err != nil {
			return BackendCUDA, nil, err
		}
		return BackendCUDA, d, nil
	case BackendSim:
		d, err := simFromEnv()
		if err != nil {
			return BackendSim, nil, err
		}
		return BackendSim, d, nil
	default:
		return name, nil, cuda.NewError("CUDACORE_BACKEND", cuda.ErrorInvalidValue,
			fmt.Sprintf("unknown backend %q: use \"cuda\" (the real driver, the default) or \"sim\" (the simulator, no GPU needed)", name))
	}
}

// simFromEnv is cudasim.FromEnv reading the live C environment (see getenv).
func simFromEnv() (*cudasim.Driver, error) {
	var opts []cudasim.Option
	if v := strings.TrimSpace(getenv(cudasim.EnvDevices)); v != "" {
		cfgs, err := cudasim.ParseDevices([]byte(v))
		if err != nil {
			return nil, err
		}
		opts = append(opts, cudasim.WithDevices(cfgs...))
	}
	d := cudasim.New(opts...)
	if v := strings.TrimSpace(getenv(cudasim.EnvFaults)); v != "" {
		faults, err := cudasim.ParseFaults(v)
		if err != nil {
			return nil, err
		}
		for _, f := range faults {
			d.InjectFault(f.Entry, f.Nth, f.Code)
		}
	}
	return d, nil
}

// Sim returns the simulator when it is the process's backend, for fault injection from tests.
func Sim() (*cudasim.Driver, error) {
	d, _, err := Driver()
	if err != nil {
		return nil, err
	}
	s, ok := d.(*cudasim.Driver)
	if !ok {
		return nil, cuda.NewError("cudacore.sim", cuda.ErrorNotSupported,
			"fault injection needs the simulator: set CUDACORE_BACKEND=sim before cudacore is first used")
	}
	return s, nil
}

// DeviceCount returns how many devices the driver sees.
func DeviceCount() (int, error) {
	d, _, err := Driver()
	if err != nil {
		return 0, err
	}
	return device.Count(d)
}

// GetDevice returns the open device at ordinal, opening it on first use with the strategy that
// CUDACORE_ALLOCATOR asks for ("auto" when unset).
func GetDevice(ordinal int) (*Device, error) {
	devMu.Lock()
	defer devMu.Unlock()
	if d, ok := devices[ordinal]; ok {
		return d, nil
	}
	drv, _, err := Driver()
	if err != nil {
		return nil, err
	}
	dd, err := device.Open(drv, ordinal, getenv("CUDACORE_ALLOCATOR"))
	if err != nil {
		return nil, err
	}
	d := &Device{Device: dd}
	devices[ordinal] = d
	return d, nil
}
