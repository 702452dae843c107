package cudacore

import (
	"encoding/json"

	"github.com/cudacore/cudacore/cudacore/internal/process"
	"github.com/cudacore/cudacore/pkg/limits"
)

// limitInfo is one entry of LimitNames.
type limitInfo struct {
	Name    string   `json:"name"`
	Unit    string   `json:"unit"`
	Doc     string   `json:"doc"`
	Min     uint64   `json:"min"`
	Max     uint64   `json:"max,omitempty"`
	Allowed []uint64 `json:"allowed,omitempty"`
}

// LimitNames returns every device limit as a JSON list of {name, unit, doc, min, max, allowed}.
//
//cudacore:gil hold
func LimitNames() (string, error) {
	return guard("cudacore.limit_names", func() (string, error) {
		var out []limitInfo
		for _, s := range limits.Specs() {
			out = append(out, limitInfo{s.Name, string(s.Unit), s.Doc, s.Min, s.Max, s.Allowed})
		}
		b, err := json.Marshal(out)
		return string(b), err
	})
}

func limitDevice(ordinal int) (*process.Device, limits.DeviceInfo, error) {
	d, err := process.GetDevice(ordinal)
	if err != nil {
		return nil, limits.DeviceInfo{}, err
	}
	p := d.Properties()
	return d, limits.DeviceInfo{Ordinal: ordinal, Name: p.Name, TotalMemory: p.TotalMemory,
		L2CacheSize: uint64(max(p.L2CacheSize, 0)), MaxPersistingL2CacheSize: uint64(max(p.MaxPersistingL2CacheSize, 0))}, nil
}

// DeviceLimit returns the current value of the named limit (cuCtxGetLimit) of the device at ordinal.
//
//cudacore:gil hold
func DeviceLimit(ordinal int, name string) (int, error) {
	return guard("cudacore.device_limit", func() (int, error) {
		d, info, err := limitDevice(ordinal)
		if err != nil {
			return 0, err
		}
		v, err := limits.Get(d.Driver(), d.Context(), info, name)
		return int(v), err
	})
}

// DeviceLimits returns every limit of the device at ordinal as JSON: {"values": {name: value},
// "unsupported": [names the device lacks]}.
//
//cudacore:gil hold
func DeviceLimits(ordinal int) (string, error) {
	return guard("cudacore.device_limits", func() (string, error) {
		d, _, err := limitDevice(ordinal)
		if err != nil {
			return "", err
		}
		values, unsupported, err := limits.All(d.Driver(), d.Context())
		if err != nil {
			return "", err
		}
		if unsupported == nil {
			unsupported = []string{}
		}
		b, err := json.Marshal(map[string]any{"values": values, "unsupported": unsupported})
		return string(b), err
	})
}

// DeviceSetLimit validates value, sets the named limit of the device at ordinal and reads it back. It
// returns JSON {name, unit, requested, applied, previous, clamped, message}: when the driver applied
// another value, clamped is true and message says so with both numbers (Python warns with it); with strict,
// a clamp is instead an InvalidValue error and the previous value is restored.
//
// The GIL is released: cuCtxSetLimit may wait for the context's work to finish before it resizes the
// stack or heap.
//
//cudacore:gil release
func DeviceSetLimit(ordinal int, name string, value int, strict bool) (string, error) {
	return guard("cudacore.device_set_limit", func() (string, error) {
		v, err := limits.CheckSigned(name, int64(value))
		if err != nil {
			return "", err
		}
		d, info, err := limitDevice(ordinal)
		if err != nil {
			return "", err
		}
		a, err := limits.Set(d.Driver(), d.Context(), info, name, v, strict)
		if err != nil {
			return "", err
		}
		b, err := json.Marshal(a)
		return string(b), err
	})
}
