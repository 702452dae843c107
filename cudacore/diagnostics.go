package cudacore

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/cudacore/cudacore/cudacore/internal/process"
	"github.com/cudacore/cudacore/pkg/cuda"
	"github.com/cudacore/cudacore/pkg/cudasim"
	"github.com/cudacore/cudacore/pkg/device"
)

// eventJSON is one flight-recorder event as Python reads it.
type eventJSON struct {
	Seq    uint64 `json:"seq"`
	TimeNS int64  `json:"t_ns"`
	Kind   string `json:"kind"`
	Device int    `json:"device"`
	Ptr    uint64 `json:"ptr"`
	Size   uint64 `json:"size"`
	Stream uint64 `json:"stream"`
	InUse  uint64 `json:"in_use"`
	Note   string `json:"note,omitempty"`
}

// RecorderEvents returns the flight recorder's events numbered after after (0: from the oldest kept), at
// most limit of the newest (limit <= 0: all kept), as JSON {"last", "capacity", "enabled", "events"}.
// last is the number of the newest event recorded, so a caller polling with after=last misses nothing
// the ring still holds.
//
//cudacore:gil hold
func RecorderEvents(after, limit int) (string, error) {
	return guard("cudacore.flight_recorder", func() (string, error) {
		if after < 0 {
			return "", cuda.NewError("cudacore.flight_recorder", cuda.ErrorInvalidValue, fmt.Sprintf("after must be >= 0, got %d", after))
		}
		evs, last := process.Recorder.Since(uint64(after), limit)
		out := make([]eventJSON, len(evs))
		for i, e := range evs {
			out[i] = eventJSON{Seq: e.Seq, TimeNS: e.Time.Nanoseconds(), Kind: e.Kind.String(), Device: e.Device,
				Ptr: uint64(e.Ptr), Size: e.Size, Stream: uint64(e.Stream), InUse: e.InUse, Note: e.Note}
		}
		b, err := json.Marshal(map[string]any{"last": last, "capacity": process.Recorder.Capacity(),
			"enabled": process.Recorder.Enabled(), "events": out})
		return string(b), err
	})
}

// RecorderConfigure turns the flight recorder on (enabled 1) or off (0) or leaves it (-1), and sets its
// capacity in slots (0: leave it; at most 1<<20; a slot holds one event, or up to 8 recycled
// free+allocation pairs). It returns the capacity.
//
//cudacore:gil hold
func RecorderConfigure(enabled, capacity int) (int, error) {
	return guard("cudacore.flight_recorder", func() (int, error) {
		if enabled < -1 || enabled > 1 {
			return 0, cuda.NewError("cudacore.flight_recorder", cuda.ErrorInvalidValue, fmt.Sprintf("enabled must be -1, 0 or 1, got %d", enabled))
		}
		if capacity < 0 || capacity > 1<<20 {
			return 0, cuda.NewError("cudacore.flight_recorder", cuda.ErrorInvalidValue,
				fmt.Sprintf("capacity must be between 1 and %d events (0 keeps it), got %d", 1<<20, capacity))
		}
		if enabled >= 0 {
			process.Recorder.SetEnabled(enabled == 1)
		}
		if capacity > 0 {
			process.Recorder.Resize(capacity)
		}
		return process.Recorder.Capacity(), nil
	})
}

// MemoryLabel records label (a Python stack) as where the live allocation ptr of device ordinal was
// made: in live allocations (with tracking) and on its newest alloc event in the flight recorder. It
// returns 1 when either knew ptr, else 0. The fast path calls it right after an allocation when Python
// stacks are asked for.
//
//cudacore:gil hold
//cudacore:door native
func MemoryLabel(ordinal, ptr int, label string) (int, error) {
	return guard("cudacore.memory_label", func() (int, error) {
		d, err := process.Lookup(ordinal)
		if err != nil {
			return 0, err
		}
		if d.Memory().Label(cuda.DevicePtr(uint64(ptr)), label) {
			return 1, nil
		}
		return 0, nil
	})
}

// SimSetMemoryConditions sets the simulator's memory conditions of device ordinal (cudasim.MemoryConditions
// as JSON: other_processes [{pid, used}], max_block, pool_reservation_limit, no_nvml), replacing earlier
// ones; "{}" clears them. It refuses (NOT_SUPPORTED) when the process does not run on the simulator, and
// returns the bytes the other processes hold.
//
//cudacore:gil hold
func SimSetMemoryConditions(ordinal int, spec string) (int, error) {
	return guard("cudacore.sim.memory_conditions", func() (int, error) {
		s, err := process.Sim()
		if err != nil {
			return 0, err
		}
		var c cudasim.MemoryConditions
		dec := json.NewDecoder(strings.NewReader(spec))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			return 0, cuda.NewError("cudacore.sim.memory_conditions", cuda.ErrorInvalidValue,
				fmt.Sprintf("memory conditions must be a JSON object with other_processes, max_block, pool_reservation_limit or no_nvml: %v", err))
		}
		if err := s.SetMemoryConditions(ordinal, c); err != nil {
			return 0, err
		}
		var n uint64
		for _, p := range c.OtherProcesses {
			n += p.Used
		}
		return int(n), nil
	})
}

// VerifyDevice runs tiny real probes on device ordinal (device.Verify: the memory pool, pinned, managed
// and virtual memory, IPC handle types, peer access, the heap, stack and printf reservations, the module
// loading mode) and returns them as a JSON list of {name, claimed, status, reason, value}. Probing
// synchronizes the legacy stream, so the GIL is released.
//
//cudacore:gil release
func VerifyDevice(ordinal int) (string, error) {
	return guard("cudacore.verify", func() (string, error) {
		d, err := process.GetDevice(ordinal)
		if err != nil {
			return "", err
		}
		return probeJSON("cudacore.verify", func() any { return device.Verify(d.Device) })
	})
}
