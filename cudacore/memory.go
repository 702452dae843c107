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

// Allocation and free of single buffers go through the Buffer doors (buffer.go, called by cudacore/native/alloc.c);
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
	Recycled       uint64 `json:"recycled"`
	Limit          uint64 `json:"limit"`
	PinnedInUse    uint64 `json:"pinned_in_use"`
	PinnedPeak     uint64 `json:"pinned_peak_in_use"`
	PinnedStaging  uint64 `json:"pinned_staging"` // the staging buffers of pageable copies (stream.Manager.StagingBytes)
	Orphaned       uint64 `json:"orphaned"`       // freed blocks of gone foreign streams, waiting for a device synchronize
	ManagedInUse   uint64 `json:"managed_in_use"`
	ManagedLive    int    `json:"managed_allocations"`
	SharedInUse    uint64 `json:"shared_in_use"` // shareable memory allocated here (SharedBuffers), freed or not yet
	SharedLive     int    `json:"shared_allocations"`
	Strategy       string `json:"strategy"`
	LiveTracked    int    `json:"live_tracked"`
	TrackingActive bool   `json:"tracking"`
	// The driver's refusals to destroy a graph (every attempt), and the graphs whose destroy, deferred
	// until the captures ended, failed and is retried later (stream.Manager.DestroysKept).
	GraphDestroyFailures uint64 `json:"graph_destroy_failures"`
	GraphDestroysPending int    `json:"graph_destroys_pending"`
	// The pool the allocator draws from, over every library that draws from it too (0 on the synchronous
	// strategy), whether it is the device's shared pool (cudacore.share_pool), and the share of it this
	// process's libraries account for: Go knows cudacore's allocator's ("cudacore"), Python adds the
	// others and the rest ("unattributed", python/cudacore/_accounts.py).
	PoolUsed   uint64            `json:"pool_used"`
	PoolShared bool              `json:"pool_shared"`
	ByLibrary  map[string]uint64 `json:"by_library"`
}

// MemoryStats returns the device allocator's counters as a JSON object (see statsJSON). Cached, reserved
// and the pool's use are read from the pool, which costs three driver queries.
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
			Allocations: s.Allocations, Frees: s.Frees, OOMs: s.OOMs, Failures: s.Failures, Recycled: s.Recycled, Limit: s.Limit,
			PinnedInUse: p.InUse, PinnedPeak: p.PeakInUse, Strategy: string(d.Strategy()),
			TrackingActive: m.Tracking()}
		if m.Tracking() {
			out.LiveTracked = len(m.Live())
		}
		out.ManagedInUse, out.ManagedLive = d.ManagedInUse()
		out.SharedInUse, out.SharedLive = d.OwnedInUse(process.OwnedShared)
		out.GraphDestroyFailures, out.GraphDestroysPending = d.Streams().DestroyFailures(), d.Streams().DestroysKept()
		out.PinnedStaging = d.Streams().StagingBytes()
		out.Orphaned = d.Orphaned()
		out.ByLibrary = map[string]uint64{}
		if p := m.Pool(); p != nil {
			if out.PoolUsed, err = p.Used(); err != nil {
				return "", err
			}
			out.ByLibrary["cudacore"] = p.Held()
		}
		_, out.PoolShared = d.ProcessPool()
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
		// The release runs while no capture can begin (process.Steady): the GIL is released, and a GLOBAL
		// capture begun on another thread while the cached blocks were being freed was invalidated by the
		// next free, whose block was lost (out of the cache, never freed). Graph memory freed by launches
		// stays with the driver for later launches until trimmed, and the pinned staging buffers of
		// pageable copies are kept for the next copy: both go back too, unless a capture runs. Orphans (freed
		// blocks of gone foreign streams) are given back first, after a device synchronize.
		if _, err := d.FlushOrphans(); err != nil {
			return 0, err
		}
		err = process.Steady(func() error {
			if err := d.Memory().Release(); err != nil {
				return err
			}
			return d.ReleaseDriverMemory()
		})
		if err != nil {
			return 0, err
		}
		return int(d.Memory().Cached()), nil
	})
}

// MemoryFlushOrphans gives the device's orphans back to its allocator after a device synchronize
// (process.Device.FlushOrphans: blocks of other libraries' streams that nobody vouches for any more) and
// returns the bytes given back. The allocation path calls it, without the GIL, before it retries an
// allocation that ran out of memory while orphans waited.
//
//cudacore:gil release
//cudacore:door native
func MemoryFlushOrphans(ordinal int) (int, error) {
	return guard("cudacore.flush_orphans", func() (int, error) {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		n, err := d.FlushOrphans()
		return int(n), err
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
// It returns the tiles, comma-separated (a list crosses gopy cheaply as one string), each as
// "address:token" with the owner token of a tile made during a capture (0 for none; see Allocate). The
// tiles are recorded under owner, a Python owner's token, before the call returns (OwnedClaim once their
// Buffers hold them, OwnedFree if that never happened; 0 records nothing).
//
//cudacore:gil release
func AllocateTiles(ordinal, count, tileSize, stream, owner int) (string, error) {
	return guard("cudacore.allocate_tiles", func() (string, error) {
		if err := checkTiles(count, tileSize); err != nil {
			return "", err
		}
		d, err := process.Lookup(ordinal)
		if err != nil {
			return "", err
		}
		h := cuda.Stream(uint64(stream))
		ptrs, tokens, err := d.AllocateTiles(count, uint64(tileSize), h, nil)
		if err != nil {
			return "", err
		}
		for i, p := range ptrs {
			size, token := uint64(tileSize), tokens[i]
			process.Own(uint64(owner), d, p, size, process.OwnedTile, func() error {
				return d.FreeOwned(p, size, h, token)
			})
		}
		var b strings.Builder
		b.Grow(len(ptrs) * 20)
		for i, p := range ptrs {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatUint(uint64(p), 10))
			b.WriteByte(':')
			b.WriteString(strconv.FormatUint(tokens[i], 10))
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

// ManagedAllocate allocates size bytes of managed (unified) memory on the device (cuMemAllocManaged,
// attached globally) and returns its address; Free frees it like any Buffer. It is synchronous, so it is
// refused while a capture forbids synchronous allocation on this thread.
//
// The allocation is recorded under owner, a Python owner's token, before the call returns
// (OwnedClaim once its Buffer holds it, OwnedFree if that never happened).
//
//cudacore:gil release
func ManagedAllocate(ordinal, size, owner int) (int, error) {
	return guard("cudacore.allocate_managed", func() (int, error) {
		if size <= 0 {
			return 0, cuda.NewError("cudacore.allocate_managed", cuda.ErrorInvalidValue, "nbytes must be positive")
		}
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		p, err := d.AllocateManaged(uint64(size))
		if err == nil {
			process.Own(uint64(owner), d, p, uint64(size), process.OwnedManaged, func() error {
				return d.FreeSteady(p, uint64(size), 0)
			})
		}
		return int(p), err
	})
}

// ManagedPrefetch migrates managed memory [ptr, ptr+size) to device dst (-1: the host), ordered on the
// stream with handle stream (0: the legacy stream). It returns 0.
//
//cudacore:gil hold
func ManagedPrefetch(ordinal, ptr, size, dst, stream int) (int, error) {
	return guard("cudacore.prefetch", func() (int, error) {
		const op = "cudacore.prefetch"
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		if err := checkManaged(d, "prefetch", ptr, size); err != nil {
			return 0, err
		}
		if err := checkLocation(op, "prefetch to", dst); err != nil {
			return 0, err
		}
		h, streams := cuda.Stream(uintptr(stream)), d.Streams()
		// A destroyed stream's handle must never reach the driver: EnqueueOn refuses it, and holds the
		// stream around the prefetch only, not across the handling of a capture failure (which takes it
		// again).
		return 0, streams.EnqueueOn("prefetch", h, func() error {
			return d.Driver().MemPrefetchAsync(d.Context(), cuda.DevicePtr(uint64(ptr)), uint64(size), dst, h)
		})
	})
}

// ManagedAdvise gives the driver a hint (cuda.MemAdvice, 1 to 6) about managed memory [ptr, ptr+size)
// for device dev (-1: the host). It returns 0.
//
//cudacore:gil hold
func ManagedAdvise(ordinal, ptr, size, advice, dev int) (int, error) {
	return guard("cudacore.advise", func() (int, error) {
		const op = "cudacore.advise"
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		if err := checkManaged(d, "advise", ptr, size); err != nil {
			return 0, err
		}
		if advice < int(cuda.AdviseSetReadMostly) || advice > int(cuda.AdviseUnsetAccessedBy) {
			return 0, cuda.NewError(op, cuda.ErrorInvalidValue, fmt.Sprintf("unknown advice %d", advice))
		}
		if err := checkLocation(op, "advise for", dev); err != nil {
			return 0, err
		}
		return 0, d.Driver().MemAdvise(d.Context(), cuda.DevicePtr(uint64(ptr)), uint64(size), cuda.MemAdvice(advice), dev)
	})
}

func checkManaged(d *process.Device, op string, ptr, size int) error {
	if size <= 0 {
		return cuda.NewError("cudacore."+op, cuda.ErrorInvalidValue, "the size must be positive")
	}
	return d.ManagedRange(op, cuda.DevicePtr(uint64(ptr)), uint64(size))
}

// checkLocation checks a device number of the managed-memory calls: a device of this machine, or -1.
func checkLocation(op, what string, dev int) error {
	if dev == cuda.CPU {
		return nil
	}
	n, err := process.DeviceCount()
	if err != nil {
		return err
	}
	if dev < 0 || dev >= n {
		return cuda.NewError(op, cuda.ErrorInvalidDevice, fmt.Sprintf(
			"cannot %s device %d: name one of the %d devices, or the host (\"cpu\")", what, dev, n))
	}
	return nil
}
