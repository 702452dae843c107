package cudasim

import (
	"fmt"
	"sort"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// ProcessMemory is another process's memory on a simulated device, as NVML would list it.
type ProcessMemory struct {
	PID  int    `json:"pid"`
	Used uint64 `json:"used"`
}

// MemoryConditions model what makes real allocations fail although the simulator would have room, so
// that every out-of-memory verdict can be produced without a GPU. The zero value models none.
type MemoryConditions struct {
	// OtherProcesses hold memory on the device: it is not free (cuMemGetInfo) and ProcessList lists it.
	OtherProcesses []ProcessMemory `json:"other_processes"`
	// MaxBlock is the largest block one allocation can get (fragmentation): a fresh allocation (cuMemAlloc,
	// or a pool's new reservation) larger than it fails with out of memory though enough is free. 0: none.
	MaxBlock uint64 `json:"max_block"`
	// PoolReservationLimit caps what each memory pool may reserve from the device (a refused
	// reservation, as on vGPU): past it a pool allocation fails with out of memory while cuMemAlloc still
	// succeeds. 0: none.
	PoolReservationLimit uint64 `json:"pool_reservation_limit"`
	// ReuseAddresses hands released addresses to later fresh allocations, lowest first and whatever their
	// size, as the real driver reuses addresses (the graph memory of a destroyed graph for the next
	// capture's allocation, or for a pool block). Off, addresses are never reused, so a stale pointer
	// never names new memory.
	ReuseAddresses bool `json:"reuse_addresses"`
	// ReuseHandles hands the handle of a destroyed stream to the next stream created, as the real driver
	// does (its handles are host addresses). Off, a destroyed stream's handle stays dead for good, and any
	// use of it ends the process as the driver's crash would.
	ReuseHandles bool `json:"reuse_handles"`
	// NoNVML makes ProcessList answer "not available", as on a machine without libnvidia-ml: the
	// allocator then estimates other processes' memory from the gap in cuMemGetInfo.
	NoNVML bool `json:"no_nvml"`
}

// SetMemoryConditions sets the conditions of device ordinal (replacing earlier ones). Other processes'
// memory must fit in what the device has free now.
func (d *Driver) SetMemoryConditions(ordinal int, c MemoryConditions) error {
	const op = "cudacore.sim.memory_conditions"
	if ordinal < 0 || ordinal >= len(d.devs) {
		return cuda.NewError(op, cuda.ErrorInvalidDevice, fmt.Sprintf("the simulator has no device %d (it has %d)", ordinal, len(d.devs)))
	}
	v := d.devs[ordinal]
	v.mu.Lock()
	defer v.mu.Unlock()
	var others uint64
	for _, p := range c.OtherProcesses {
		if p.PID <= 0 {
			return cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf("other process pid %d must be positive", p.PID))
		}
		if others+p.Used < others {
			return cuda.NewError(op, cuda.ErrorInvalidValue, "other processes' memory overflows")
		}
		others += p.Used
	}
	if avail := v.free() + v.others; others > avail {
		return cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf(
			"other processes' %d bytes do not fit in the %d bytes free on device %d", others, avail, ordinal))
	}
	v.conds = c
	v.conds.OtherProcesses = append([]ProcessMemory(nil), c.OtherProcesses...)
	v.others = others
	return nil
}

// ProcessList lists the other processes' memory on device ordinal, largest first, as NVML would; ok is
// false for an ordinal the simulator does not have, or when the conditions model no NVML.
func (d *Driver) ProcessList(ordinal int) ([]ProcessMemory, bool) {
	if ordinal < 0 || ordinal >= len(d.devs) {
		return nil, false
	}
	v := d.devs[ordinal]
	v.mu.Lock()
	out, noNVML := append([]ProcessMemory(nil), v.conds.OtherProcesses...), v.conds.NoNVML
	v.mu.Unlock()
	if noNVML {
		return nil, false
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Used > out[j].Used })
	return out, true
}
