package cudacore

import (
	"encoding/json"
	"math"
	"strings"
	"unicode"

	"github.com/cudacore/cudacore/cudacore/internal/process"
	"github.com/cudacore/cudacore/pkg/cuda"
)

// One pool for the process: the doors of cudacore.share_pool (python/cudacore/_broker.py), which wires the
// other libraries to the pool these make.

// sharedJSON is a device's shared pool as Python sees it.
type sharedJSON struct {
	Handle           uint64 `json:"handle"`
	Previous         uint64 `json:"previous"`
	Owned            bool   `json:"owned"`
	ReleaseThreshold uint64 `json:"release_threshold"`
	MaxSize          uint64 `json:"max_size"`
	IPC              bool   `json:"ipc"`
}

func sharedOf(sp process.SharedPool) sharedJSON {
	return sharedJSON{Handle: uint64(sp.Handle), Previous: uint64(sp.Previous), Owned: sp.Owned(),
		ReleaseThreshold: sp.ReleaseThreshold, MaxSize: sp.MaxSize, IPC: sp.IPC}
}

// PoolShare makes the device's shared pool (process.ShareOptions: the default pool when useDefault, else
// a pool of cudacore's own with maxSize, 0 for no cap, and IPC handles when ipc), moves cudacore's
// allocator into it and makes it the device's current pool; releaseThreshold below 0 keeps everything.
// It returns the pool as JSON (sharedJSON). The allocator may be rebuilt, which releases its cache.
//
//cudacore:gil release
func PoolShare(ordinal int, useDefault bool, releaseThreshold, maxSize int, ipc bool) (string, error) {
	return guard("cudacore.share_pool", func() (string, error) {
		if maxSize < 0 {
			return "", cuda.NewError("cudacore.share_pool", cuda.ErrorInvalidValue, "max_size must be positive, or None for no cap")
		}
		d, err := process.GetDevice(ordinal)
		if err != nil {
			return "", err
		}
		threshold := uint64(math.MaxUint64)
		if releaseThreshold >= 0 {
			threshold = uint64(releaseThreshold)
		}
		sp, err := d.ShareProcessPool(process.ShareOptions{UseDefault: useDefault, ReleaseThreshold: threshold,
			MaxSize: uint64(maxSize), IPC: ipc})
		if err != nil {
			return "", err
		}
		b, err := json.Marshal(sharedOf(sp))
		return string(b), err
	})
}

// PoolUnshare undoes PoolShare (process.Device.UnshareProcessPool) and returns the device's current pool
// afterwards.
//
//cudacore:gil release
func PoolUnshare(ordinal int) (int, error) {
	return guard("cudacore.unshare_pool", func() (int, error) {
		d, err := process.GetDevice(ordinal)
		if err != nil {
			return 0, err
		}
		cur, err := d.UnshareProcessPool()
		return int(cur), err
	})
}

// poolJSON is what PoolInfo reports.
type poolJSON struct {
	Shared *sharedJSON `json:"shared"` // null while the device shares no pool
	// Current is the device's current pool (cuDeviceGetMemPool): the shared pool's handle unless another
	// library made a third one current since.
	Current uint64 `json:"current"`
}

// PoolInfo returns the device's shared pool, if any, and its current pool, as JSON (poolJSON).
//
//cudacore:gil hold
func PoolInfo(ordinal int) (string, error) {
	return guard("cudacore.shared_pool", func() (string, error) {
		d, err := process.GetDevice(ordinal)
		if err != nil {
			return "", err
		}
		var out poolJSON
		if sp, ok := d.ProcessPool(); ok {
			j := sharedOf(sp)
			out.Shared = &j
		}
		if d.Properties().MemoryPoolsSupported {
			cur, err := d.Driver().DeviceGetMemPool(d.Handle())
			if err != nil {
				return "", err
			}
			out.Current = uint64(cur)
		}
		b, err := json.Marshal(out)
		return string(b), err
	})
}

// SimPoolAllocate allocates size bytes on the simulated driver directly, as another library of the
// process does: from the device's current pool (cuMemAllocAsync, as PyTorch's cudaMallocAsync backend and
// CuPy's MemoryAsyncPool do) when pool is 0, else from that pool (cuMemAllocFromPoolAsync, as RMM's
// CudaAsyncViewMemoryResource does), on the legacy stream. cudacore does not know the block; free it with
// SimPoolFree. Tests stand such libraries in with it.
//
//cudacore:gil hold
func SimPoolAllocate(ordinal, size, pool int) (int, error) {
	return guard("cudacore.sim.pool_allocate", func() (int, error) {
		s, d, err := simAndDevice(ordinal)
		if err != nil {
			return 0, err
		}
		if size <= 0 {
			return 0, cuda.NewError("cudacore.sim.pool_allocate", cuda.ErrorInvalidValue, "size must be positive")
		}
		var p cuda.DevicePtr
		if pool == 0 {
			p, err = s.MemAllocAsync(d.Context(), uint64(size), cuda.StreamLegacy)
		} else {
			p, err = s.MemAllocFromPoolAsync(d.Context(), uint64(size), cuda.MemPool(uint64(pool)), cuda.StreamLegacy)
		}
		return int(p), err
	})
}

// SimPoolFree frees, on the legacy stream, a block SimPoolAllocate made. It returns 0.
//
//cudacore:gil hold
func SimPoolFree(ordinal, ptr int) (int, error) {
	return guard("cudacore.sim.pool_free", func() (int, error) {
		s, d, err := simAndDevice(ordinal)
		if err != nil {
			return 0, err
		}
		return 0, s.MemFreeAsync(d.Context(), cuda.DevicePtr(uint64(ptr)), cuda.StreamLegacy)
	})
}

const opExplain = "cudacore.explain_oom"

// ExplainOOM is the verdict of cudacore.explain_oom (python/cudacore/_explain.py): the out-of-memory
// error cudacore gives for an allocation of requested bytes on stream (a CUstream; 0 for the legacy
// stream) of the device that failed in another library, op (process.Device.ExplainOutOfMemory), as
// wire-format text. op is one word: the library's name, or the entry point of a cudacore error that
// carried no verdict.
//
//cudacore:gil release
func ExplainOOM(ordinal, requested, stream int, op string) (string, error) {
	return guard(opExplain, func() (string, error) {
		if requested <= 0 {
			return "", cuda.NewError(opExplain, cuda.ErrorInvalidValue, "requested must be a positive number of bytes")
		}
		if op == "" || len(op) > 64 || strings.ContainsFunc(op, unicode.IsSpace) {
			return "", cuda.NewError(opExplain, cuda.ErrorInvalidValue, "op must be one word of at most 64 characters")
		}
		d, err := process.GetDevice(ordinal)
		if err != nil {
			return "", err
		}
		return cuda.Encode(d.ExplainOutOfMemory(uint64(requested), cuda.Stream(uint64(stream)), op)), nil
	})
}
