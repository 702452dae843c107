package cudacore

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/cudacore/cudacore/cudacore/internal/process"
	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/memory"
)

// Allocation and free of single buffers go through the fast path (internal/fast and bindings/fastpath.c);
// these are the coarser memory calls.

// statsJSON is the memory_stats() dict.
type statsJSON struct {
	InUse          uint64 `json:"in_use"`
	PeakInUse      uint64 `json:"peak_in_use"`
	Cached         uint64 `json:"cached"`
	Reserved       uint64 `json:"reserved"`
	Allocations    uint64 `json:"allocations"`
	Frees          uint64 `json:"frees"`
	OOMs           uint64 `json:"ooms"`
	Failures       uint64 `json:"failures"`
	Limit          uint64 `json:"limit"`
	PinnedInUse    uint64 `json:"pinned_in_use"`
	PinnedPeak     uint64 `json:"pinned_peak_in_use"`
	Strategy       string `json:"strategy"`
	LiveTracked    int    `json:"live_tracked"`
	TrackingActive bool   `json:"tracking"`
}

// MemoryStats returns the device allocator's counters as a JSON object (see statsJSON). Cached and
// reserved are read from the pool, which costs two driver queries.
//
//cudacore:gil hold
func MemoryStats(ordinal int) (string, error) {
	return guard("cudacore.memory_stats", func() (string, error) {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return "", err
		}
		m := d.Memory()
		s := m.Stats()
		p := d.PinnedStats()
		out := statsJSON{InUse: s.InUse, PeakInUse: s.PeakInUse, Cached: s.Cached, Reserved: s.Reserved,
			Allocations: s.Allocations, Frees: s.Frees, OOMs: s.OOMs, Failures: s.Failures, Limit: s.Limit,
			PinnedInUse: p.InUse, PinnedPeak: p.PeakInUse, Strategy: string(d.Strategy()),
			TrackingActive: m.Tracking()}
		if m.Tracking() {
			out.LiveTracked = len(m.Live())
		}
		b, err := json.Marshal(out)
		return string(b), err
	})
}

// MemoryResetPeak sets the peak-in-use counter to what is in use now, and returns that.
//
//cudacore:gil hold
func MemoryResetPeak(ordinal int) (int, error) {
	return guard("cudacore.reset_peak", func() (int, error) {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		d.Memory().ResetPeak()
		return int(d.Memory().Stats().PeakInUse), nil
	})
}

// MemoryRelease returns the allocator's cached memory to the device (the size-class cache, then the
// pool's reserve) and returns the bytes still cached afterwards. It synchronizes, so the GIL is released.
//
//cudacore:gil release
func MemoryRelease(ordinal int) (int, error) {
	return guard("cudacore.release", func() (int, error) {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		if err := d.Memory().Release(); err != nil {
			return 0, err
		}
		return int(d.Memory().Cached()), nil
	})
}

// MemorySetLimit sets a byte limit on what the device's allocator hands out (0 removes it). Allocations
// past it raise OutOfMemoryError saying that the limit was hit. It returns the limit.
//
//cudacore:gil hold
func MemorySetLimit(ordinal, limit int) (int, error) {
	return guard("cudacore.set_memory_limit", func() (int, error) {
		if limit < 0 {
			return 0, cuda.NewError("cudacore.set_memory_limit", cuda.ErrorInvalidValue,
				fmt.Sprintf("the memory limit must be >= 0 bytes (0: no limit), got %d", limit))
		}
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		d.Memory().SetLimit(uint64(limit))
		return int(d.Memory().Limit()), nil
	})
}

// AllocateTiles allocates count tiles of tileSize bytes on stream, all or nothing: if tile k fails,
// tiles 0..k-1 are freed, the cache is released, and the out-of-memory error says how many tiles fit.
// It returns the tiles' addresses, comma-separated (a list crosses gopy cheaply as one string).
//
//cudacore:gil release
func AllocateTiles(ordinal, count, tileSize, stream int) (string, error) {
	return guard("cudacore.allocate_tiles", func() (string, error) {
		if err := checkTiles(count, tileSize); err != nil {
			return "", err
		}
		d, err := process.Lookup(ordinal)
		if err != nil {
			return "", err
		}
		ptrs, err := d.AllocateTiles(count, uint64(tileSize), cuda.Stream(uint64(stream)), nil)
		if err != nil {
			return "", err
		}
		var b strings.Builder
		b.Grow(len(ptrs) * 16)
		for i, p := range ptrs {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatUint(uint64(p), 10))
		}
		return b.String(), nil
	})
}

func checkTiles(count, tileSize int) error {
	if count <= 0 || tileSize <= 0 {
		return cuda.NewError(memory.OpTiles, cuda.ErrorInvalidValue,
			fmt.Sprintf("count and tile_size must be positive, got count=%d tile_size=%d", count, tileSize))
	}
	return nil
}

// AdmitTiles answers "would count tiles of tileSize fit now?", counting the device's free memory and
// what the allocator holds cached. It returns a JSON object {fits, free, cached}.
//
//cudacore:gil hold
func AdmitTiles(ordinal, count, tileSize int) (string, error) {
	return guard("cudacore.admit", func() (string, error) {
		if err := checkTiles(count, tileSize); err != nil {
			return "", err
		}
		d, err := process.Lookup(ordinal)
		if err != nil {
			return "", err
		}
		fits, free, cached, err := d.Memory().Admit(count, uint64(tileSize))
		if err != nil {
			return "", err
		}
		b, err := json.Marshal(map[string]any{"fits": fits, "free": free, "cached": cached})
		return string(b), err
	})
}

// DeviceSetAllocationStrategy rebuilds the device's allocator with strategy "auto", "pool" or "sync"
// (refused while memory is allocated through the current one) and returns the properties as
// DeviceProperties does. track turns on the recording of live allocations for leak reports; where each
// was made is the Python stack the fast path labels it with (MemoryLabel), or the framework's name.
//
//cudacore:gil release
func DeviceSetAllocationStrategy(ordinal int, strategy string, track bool) (string, error) {
	return guard("cudacore.allocation_strategy", func() (string, error) {
		d, err := process.GetDevice(ordinal)
		if err != nil {
			return "", err
		}
		if err := d.SetStrategy(strategy, memory.StackOptions{Track: track}); err != nil {
			return "", err
		}
		return DeviceProperties(ordinal)
	})
}

// liveJSON is one entry of MemoryLive.
type liveJSON struct {
	Ptr    uint64 `json:"ptr"`
	Size   uint64 `json:"size"`
	Stream uint64 `json:"stream"`
	Where  string `json:"where"`
}

// MemoryLive lists the allocations alive now, with where each was made, as JSON; it needs tracking (see
// DeviceSetAllocationStrategy) and returns an empty list without it.
//
//cudacore:gil hold
func MemoryLive(ordinal int) (string, error) {
	return guard("cudacore.live_allocations", func() (string, error) {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return "", err
		}
		out := []liveJSON{}
		for _, a := range d.Memory().Live() {
			out = append(out, liveJSON{uint64(a.Ptr), a.Size, uint64(a.Stream), a.Where})
		}
		b, err := json.Marshal(out)
		return string(b), err
	})
}
