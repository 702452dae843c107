// Package device detects CUDA devices and decides how each one allocates memory.
//
// A Device owns a retained primary context for its lifetime (Open retains, Close releases), and every
// other package reaches the driver for that device through Device.Context. Nothing here is global: the
// caller (the cudacore facade) keeps one Device per ordinal.
package device

import (
	"fmt"
	"strings"
	"sync"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// Properties are the static facts about a device that users ask for (the Python Device attributes).
type Properties struct {
	Ordinal                      int    `json:"ordinal"`
	Name                         string `json:"name"`
	UUID                         string `json:"uuid"`
	PCIBusID                     string `json:"pci_bus_id"`
	ComputeCapability            [2]int `json:"compute_capability"`
	MultiprocessorCount          int    `json:"multiprocessor_count"`
	TotalMemory                  uint64 `json:"total_memory"`
	MemoryPoolsSupported         bool   `json:"memory_pools_supported"`
	TCCDriver                    bool   `json:"tcc_driver"`
	ManagedMemory                bool   `json:"managed_memory"`
	Integrated                   bool   `json:"integrated"`
	HostRegisterSupported        bool   `json:"host_register_supported"`
	MaxThreadsPerBlock           int    `json:"max_threads_per_block"`
	MaxBlockDim                  [3]int `json:"max_block_dim"`
	MaxGridDim                   [3]int `json:"max_grid_dim"`
	MaxSharedMemoryPerBlock      int    `json:"max_shared_memory_per_block"`
	MaxSharedMemoryPerBlockOptin int    `json:"max_shared_memory_per_block_optin"`
	MaxRegistersPerBlock         int    `json:"max_registers_per_block"`
	WarpSize                     int    `json:"warp_size"`
	L2CacheSize                  int    `json:"l2_cache_size"`
	MaxPersistingL2CacheSize     int    `json:"max_persisting_l2_cache_size"`
	DriverVersion                int    `json:"driver_version"`
}

// Count returns the number of devices the driver sees, initializing it first.
func Count(drv cuda.Driver) (int, error) {
	if err := drv.Init(); err != nil {
		return 0, err
	}
	return drv.DeviceCount()
}

// Query reads the Properties of the device at ordinal. It validates the ordinal first, so a bad one is
// an InvalidValue error that says how many devices there are, not a bare CUDA_ERROR_INVALID_DEVICE.
func Query(drv cuda.Driver, ordinal int) (Properties, error) {
	n, err := Count(drv)
	if err != nil {
		return Properties{}, err
	}
	if err := CheckOrdinal(ordinal, n); err != nil {
		return Properties{}, err
	}
	dev, err := drv.DeviceGet(ordinal)
	if err != nil {
		return Properties{}, err
	}
	p := Properties{Ordinal: ordinal}
	if p.Name, err = drv.DeviceName(dev); err != nil {
		return p, err
	}
	uuid, err := drv.DeviceUUID(dev)
	if err != nil {
		return p, err
	}
	p.UUID = FormatUUID(uuid)
	if p.PCIBusID, err = drv.DevicePCIBusID(dev); err != nil {
		return p, err
	}
	if p.TotalMemory, err = drv.DeviceTotalMem(dev); err != nil {
		return p, err
	}
	if p.DriverVersion, err = drv.Version(); err != nil {
		return p, err
	}
	ints := []struct {
		attr cuda.DeviceAttribute
		dst  *int
	}{
		{cuda.AttrComputeCapabilityMajor, &p.ComputeCapability[0]},
		{cuda.AttrComputeCapabilityMinor, &p.ComputeCapability[1]},
		{cuda.AttrMultiprocessorCount, &p.MultiprocessorCount},
		{cuda.AttrMaxThreadsPerBlock, &p.MaxThreadsPerBlock},
		{cuda.AttrMaxBlockDimX, &p.MaxBlockDim[0]},
		{cuda.AttrMaxBlockDimY, &p.MaxBlockDim[1]},
		{cuda.AttrMaxBlockDimZ, &p.MaxBlockDim[2]},
		{cuda.AttrMaxGridDimX, &p.MaxGridDim[0]},
		{cuda.AttrMaxGridDimY, &p.MaxGridDim[1]},
		{cuda.AttrMaxGridDimZ, &p.MaxGridDim[2]},
		{cuda.AttrMaxSharedMemoryPerBlock, &p.MaxSharedMemoryPerBlock},
		{cuda.AttrMaxSharedMemoryPerBlockOptin, &p.MaxSharedMemoryPerBlockOptin},
		{cuda.AttrMaxRegistersPerBlock, &p.MaxRegistersPerBlock},
		{cuda.AttrWarpSize, &p.WarpSize},
		{cuda.AttrL2CacheSize, &p.L2CacheSize},
		{cuda.AttrMaxPersistingL2CacheSize, &p.MaxPersistingL2CacheSize},
	}
	for _, a := range ints {
		if *a.dst, err = drv.DeviceAttribute(dev, a.attr); err != nil {
			return p, err
		}
	}
	flags := []struct {
		attr cuda.DeviceAttribute
		dst  *bool
	}{
		{cuda.AttrMemoryPoolsSupported, &p.MemoryPoolsSupported},
		{cuda.AttrTCCDriver, &p.TCCDriver},
		{cuda.AttrManagedMemory, &p.ManagedMemory},
		{cuda.AttrIntegrated, &p.Integrated},
		{cuda.AttrHostRegisterSupported, &p.HostRegisterSupported},
	}
	for _, a := range flags {
		v, err := drv.DeviceAttribute(dev, a.attr)
		if err != nil {
			return p, err
		}
		*a.dst = v != 0
	}
	return p, nil
}

// CheckOrdinal returns an InvalidValue error unless 0 <= ordinal < count.
func CheckOrdinal(ordinal, count int) error {
	if ordinal >= 0 && ordinal < count {
		return nil
	}
	valid := "there are no devices"
	switch count {
	case 0:
	case 1:
		valid = "the only device is 0"
	default:
		valid = fmt.Sprintf("valid ordinals are 0 to %d", count-1)
	}
	return cuda.NewError("cudacore.device", cuda.ErrorInvalidValue,
		fmt.Sprintf("device %d does not exist: %s", ordinal, valid),
		cuda.Field{Key: "ordinal", Value: fmt.Sprint(ordinal)}, cuda.Field{Key: "count", Value: fmt.Sprint(count)})
}

// FormatUUID renders a device UUID the way nvidia-smi does: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
func FormatUUID(u [16]byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// Device is an open device: its properties, its retained primary context and its allocation strategy.
type Device struct {
	drv      cuda.Driver
	dev      cuda.Device
	ctx      cuda.Context
	props    Properties
	mu       sync.Mutex // guards strategy and reason (SetStrategy)
	strategy Strategy
	reason   string

	closeOnce sync.Once
}

// Open queries the device at ordinal, retains its primary context and chooses its allocation strategy
// (see Choose; requested may be "" or "auto" for the automatic choice). The caller owns the Device and
// must Close it to release the context.
func Open(drv cuda.Driver, ordinal int, requested string) (*Device, error) {
	props, err := Query(drv, ordinal)
	if err != nil {
		return nil, err
	}
	strategy, reason, err := Choose(props, requested)
	if err != nil {
		return nil, err
	}
	dev, err := drv.DeviceGet(ordinal)
	if err != nil {
		return nil, err
	}
	ctx, err := drv.PrimaryCtxRetain(dev)
	if err != nil {
		return nil, fmt.Errorf("device %d: retain primary context: %w", ordinal, err)
	}
	return &Device{drv: drv, dev: dev, ctx: ctx, props: props, strategy: strategy, reason: reason}, nil
}

// Close releases the primary context. It is idempotent.
func (d *Device) Close() error {
	var err error
	d.closeOnce.Do(func() { err = d.drv.PrimaryCtxRelease(d.dev) })
	return err
}

func (d *Device) Driver() cuda.Driver    { return d.drv }
func (d *Device) Handle() cuda.Device    { return d.dev }
func (d *Device) Context() cuda.Context  { return d.ctx }
func (d *Device) Ordinal() int           { return d.props.Ordinal }
func (d *Device) Properties() Properties { return d.props }

// Strategy is how this device allocates ("pool" or "sync").
func (d *Device) Strategy() Strategy {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.strategy
}

// StrategyReason says why the device has its strategy, in one sentence.
func (d *Device) StrategyReason() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.reason
}

// SetStrategy re-chooses the strategy as Choose does for requested. The caller (which owns the allocator
// built on the old strategy) must make sure nothing allocated under the old one is still in use.
func (d *Device) SetStrategy(requested string) error {
	s, why, err := Choose(d.props, requested)
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.strategy, d.reason = s, why
	d.mu.Unlock()
	return nil
}

// MemoryInfo returns the device's free and total memory as the driver reports them (cuMemGetInfo).
func (d *Device) MemoryInfo() (free, total uint64, err error) {
	return d.drv.MemGetInfo(d.ctx)
}

// String is "device 0 (NVIDIA H100 80GB HBM3)".
func (d *Device) String() string {
	return fmt.Sprintf("device %d (%s)", d.props.Ordinal, strings.TrimSpace(d.props.Name))
}
