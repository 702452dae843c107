package device

import (
	"fmt"
	"strings"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// Strategy is how a device allocates memory.
type Strategy string

const (
	// StrategyPool allocates stream-ordered from a memory pool (cuMemAllocAsync): sub-microsecond, and
	// allocations can be captured into graphs.
	StrategyPool Strategy = "pool"
	// StrategySync allocates with cuMemAlloc/cuMemFree: it works everywhere but costs ~73 µs a pair and
	// synchronizes the device on free.
	StrategySync Strategy = "sync"
)

// minPoolDriver is the first driver version with stream-ordered allocation (CUDA 11.2).
const minPoolDriver = 11020

// Choose picks the allocation strategy for a device and says why, in one sentence a person can read.
//
// requested is "", "auto", "pool" or "sync" (the API's or CUDACORE_ALLOCATOR's value). Asking for "pool"
// on a device that cannot do it is a NotSupported error rather than a silent fallback: the user asked
// for something specific.
func Choose(p Properties, requested string) (Strategy, string, error) {
	auto, cause := autoStrategy(p)
	why := cause
	if auto == StrategySync {
		why = cause + ", so cudacore falls back to synchronous cuMemAlloc/cuMemFree."
	}
	switch strings.ToLower(strings.TrimSpace(requested)) {
	case "", "auto":
		return auto, why, nil
	case string(StrategySync):
		return StrategySync, "the synchronous allocator (cuMemAlloc/cuMemFree) was requested explicitly; " +
			"the automatic choice would be " + string(auto) + ".", nil
	case string(StrategyPool):
		if auto != StrategyPool {
			// The user asked for pools: no fallback is made, and the message must not promise one.
			return "", "", cuda.NewError("cudacore.allocation_strategy", cuda.ErrorNotSupported,
				fmt.Sprintf("the pool allocator was requested for device %d, but %s; ask for \"auto\" or \"sync\" "+
					"(CUDACORE_ALLOCATOR or set_allocation_strategy) to allocate with cuMemAlloc/cuMemFree there",
					p.Ordinal, lowerFirst(cause)))
		}
		return StrategyPool, "the stream-ordered pool allocator was requested explicitly and the device supports it.", nil
	default:
		return "", "", cuda.NewError("cudacore.allocation_strategy", cuda.ErrorInvalidValue,
			fmt.Sprintf("unknown allocation strategy %q: use \"auto\", \"pool\" or \"sync\"", requested))
	}
}

// autoStrategy returns the strategy "auto" picks and its cause; for the synchronous strategy the cause
// is why pools are not available, without the conclusion (Choose adds the fallback where there is one).
func autoStrategy(p Properties) (Strategy, string) {
	switch {
	case p.TCCDriver:
		return StrategySync, "the device runs the Windows TCC driver (CU_DEVICE_ATTRIBUTE_TCC_DRIVER=1), where " +
			"stream-ordered memory pools are not available"
	case !p.MemoryPoolsSupported:
		return StrategySync, "the driver reports no memory pool support on this device " +
			"(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED=0, as on some WSL and virtualized setups)"
	case p.DriverVersion != 0 && p.DriverVersion < minPoolDriver:
		return StrategySync, fmt.Sprintf("the driver is CUDA %d.%d, older than 11.2 which introduced memory pools",
			p.DriverVersion/1000, p.DriverVersion%1000/10)
	default:
		return StrategyPool, "the device supports memory pools (CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED=1), " +
			"so allocations are stream-ordered from a pool (cuMemAllocAsync/cuMemFreeAsync)."
	}
}

func lowerFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToLower(s[:1]) + s[1:]
}
