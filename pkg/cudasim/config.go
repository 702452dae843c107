package cudasim

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// EnvDevices is the variable FromEnv reads the device list from (see docs/guide/testing-without-a-gpu.md).
const EnvDevices = "CUDACORE_SIM_DEVICES"

// EnvFaults is the variable FromEnv reads injected faults from: a comma list of entry:nth:code, such as
// "cuMemAllocFromPoolAsync:3:2" (the third cuMemAllocFromPoolAsync from start, the pool allocator's call,
// fails with CUDA_ERROR_OUT_OF_MEMORY). The code may also be a name,
// "cuMemAllocFromPoolAsync:3:CUDA_ERROR_OUT_OF_MEMORY". Each fault is one call: cudacore's allocator retries
// a failed allocation once, so failing an allocation takes two (docs/guide/testing-without-a-gpu.md).
const EnvFaults = "CUDACORE_SIM_FAULTS"

// MaxDevices is the most devices one simulator offers; the driver API's own ordinals go no further in
// practice and a larger list is almost certainly a typo or generated garbage.
const MaxDevices = 64

// MaxTotalMemory bounds a simulated device's memory (256 TiB): device pointers live in a 4 PiB window per
// device that is never reused, so a bound keeps the window from running out in a long-lived process.
const MaxTotalMemory = 1 << 48

// MaxNVLinks bounds DeviceConfig.NVLinks: NVIDIA's GPUs have had at most 18 NVLinks; 64 leaves room.
const MaxNVLinks = 64

const exampleDevices = `[{"name": "sim-tcc", "total_memory": 1073741824, "memory_pools_supported": false, "tcc_driver": true}]`

// DeviceConfig describes one simulated device. The caller owns it; the Driver copies it at New.
//
// Zero numeric fields and empty strings take the H100 defaults (see H100); zero UUID and PCIBusID are
// derived from the device's ordinal, so that they are stable from run to run. The bool fields are taken as
// given. In JSON (CUDACORE_SIM_DEVICES) every omitted field takes the H100 value, bools included.
type DeviceConfig struct {
	Name                 string   `json:"name"`
	TotalMemory          uint64   `json:"total_memory"`
	ComputeCapability    [2]int   `json:"compute_capability"`
	MultiprocessorCount  int      `json:"multiprocessor_count"`
	MemoryPoolsSupported bool     `json:"memory_pools_supported"`
	TCCDriver            bool     `json:"tcc_driver"`
	ManagedMemory        bool     `json:"managed_memory"`
	Integrated           bool     `json:"integrated"`
	UUID                 [16]byte `json:"uuid"`
	PCIBusID             string   `json:"pci_bus_id"`
	// PeerGroup says which devices can access each other's memory (cuDeviceCanAccessPeer): those with
	// the same group, 0 unless set. A device alone in its group has no peers, like GPUs of two PCIe root
	// complexes without a switch between them.
	PeerGroup int `json:"peer_group"`
	// NVLinks is how many NVLinks join this device to each other device of its peer group; two devices
	// are joined by the smaller of their two counts (cuDeviceGetP2PAttribute and the simulated NVML say
	// so). 0, the default, makes its peers reach it over PCIe.
	NVLinks int `json:"nvlinks"`
}

// H100 returns the device measured in docs/contributing/driver-facts.md: NVIDIA H100 80GB HBM3, compute capability 9.0.
func H100() DeviceConfig {
	return DeviceConfig{
		Name:                 "NVIDIA H100 80GB HBM3",
		TotalMemory:          85017493504,
		ComputeCapability:    [2]int{9, 0},
		MultiprocessorCount:  132,
		MemoryPoolsSupported: true,
		TCCDriver:            false,
		ManagedMemory:        true,
		Integrated:           false,
	}
}

// UUIDString renders a UUID the way nvidia-smi does: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
func UUIDString(u [16]byte) string {
	h := hex.EncodeToString(u[:])
	return "GPU-" + h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

func parseUUID(s string) ([16]byte, bool) {
	var u [16]byte
	s = strings.TrimPrefix(strings.TrimPrefix(s, "GPU-"), "gpu-")
	s = strings.ReplaceAll(s, "-", "")
	if len(s) != 32 {
		return u, false
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		return u, false
	}
	copy(u[:], b)
	return u, true
}

// MarshalJSON writes the form ParseDevices reads: the UUID as a GPU-... string.
func (c DeviceConfig) MarshalJSON() ([]byte, error) {
	type plain DeviceConfig
	return json.Marshal(struct {
		plain
		UUID string `json:"uuid"`
	}{plain(c), UUIDString(c.UUID)})
}

var pciBusIDRe = regexp.MustCompile(`^([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])$`)

// pciParts returns domain, bus and device numbers of a validated bus id.
func pciParts(id string) (domain, bus, dev int) {
	m := pciBusIDRe.FindStringSubmatch(id)
	if m == nil {
		return 0, 0, 0
	}
	d, _ := strconv.ParseUint(m[1], 16, 32)
	b, _ := strconv.ParseUint(m[2], 16, 8)
	v, _ := strconv.ParseUint(m[3], 16, 8)
	return int(d), int(b), int(v)
}

func derivedUUID(i int) [16]byte {
	sum := sha256.Sum256([]byte("cudacore-sim-device-" + strconv.Itoa(i)))
	var u [16]byte
	copy(u[:], sum[:16])
	u[6] = u[6]&0x0f | 0x40 // version 4, variant 1: it looks like the random UUIDs real GPUs carry
	u[8] = u[8]&0x3f | 0x80
	return u
}

// derivedPCIBusID has the driver's own form: the H100 reported "0000:00:06.0" (a four-digit domain).
func derivedPCIBusID(i int) string { return fmt.Sprintf("0000:%02X:00.0", 0x18+i) }

func configError(format string, args ...any) *cuda.Error {
	return cuda.NewError(EnvDevices, cuda.ErrorInvalidValue,
		fmt.Sprintf(format, args...)+"; a valid example: "+exampleDevices)
}

// normalize fills defaults and checks one device; i is its ordinal.
func normalize(i int, c DeviceConfig) (DeviceConfig, *cuda.Error) {
	def := H100()
	if c.Name == "" {
		c.Name = def.Name
	}
	if c.TotalMemory == 0 {
		c.TotalMemory = def.TotalMemory
	}
	if c.ComputeCapability == [2]int{} {
		c.ComputeCapability = def.ComputeCapability
	}
	if c.MultiprocessorCount == 0 {
		c.MultiprocessorCount = def.MultiprocessorCount
	}
	if c.UUID == [16]byte{} {
		c.UUID = derivedUUID(i)
	}
	if c.PCIBusID == "" {
		c.PCIBusID = derivedPCIBusID(i)
	}
	return c, validate(i, c)
}

func validate(i int, c DeviceConfig) *cuda.Error {
	switch {
	case len(c.Name) > 255 || strings.ContainsRune(c.Name, 0):
		return configError("device %d: name %q must be at most 255 bytes with no NUL", i, c.Name)
	case c.TotalMemory == 0 || c.TotalMemory > MaxTotalMemory:
		return configError("device %d: total_memory %d must be between 1 and %d bytes", i, c.TotalMemory, uint64(MaxTotalMemory))
	case c.ComputeCapability[0] < 1 || c.ComputeCapability[0] > 19 || c.ComputeCapability[1] < 0 || c.ComputeCapability[1] > 9:
		return configError("device %d: compute_capability %v is out of range: want [major, minor] with major 1..19 and minor 0..9, such as [9, 0]", i, c.ComputeCapability)
	case c.MultiprocessorCount < 1 || c.MultiprocessorCount > 4096:
		return configError("device %d: multiprocessor_count %d must be between 1 and 4096", i, c.MultiprocessorCount)
	case !pciBusIDRe.MatchString(c.PCIBusID):
		return configError("device %d: pci_bus_id %q is not of the form 0000:18:00.0", i, c.PCIBusID)
	case c.PeerGroup < 0 || c.PeerGroup > MaxDevices:
		return configError("device %d: peer_group %d must be between 0 and %d", i, c.PeerGroup, MaxDevices)
	case c.NVLinks < 0 || c.NVLinks > MaxNVLinks:
		return configError("device %d: nvlinks %d must be between 0 and %d", i, c.NVLinks, MaxNVLinks)
	}
	return nil
}

// jsonDevice mirrors DeviceConfig with pointers, so that an omitted field can take the H100 value while a
// given zero or false stays as given.
type jsonDevice struct {
	Name                 *string          `json:"name"`
	TotalMemory          *json.Number     `json:"total_memory"`
	ComputeCapability    *json.RawMessage `json:"compute_capability"`
	MultiprocessorCount  *json.Number     `json:"multiprocessor_count"`
	MemoryPoolsSupported *bool            `json:"memory_pools_supported"`
	TCCDriver            *bool            `json:"tcc_driver"`
	ManagedMemory        *bool            `json:"managed_memory"`
	Integrated           *bool            `json:"integrated"`
	UUID                 *json.RawMessage `json:"uuid"`
	PCIBusID             *string          `json:"pci_bus_id"`
	PeerGroup            *json.Number     `json:"peer_group"`
	NVLinks              *json.Number     `json:"nvlinks"`
}

// ParseDevices parses a CUDACORE_SIM_DEVICES value: a JSON list of device objects whose omitted fields
// take the H100 values. Every failure is a *cuda.Error with Result ErrorInvalidValue and Op
// CUDACORE_SIM_DEVICES whose message quotes the problem and shows a valid example. It never panics.
func ParseDevices(data []byte) ([]DeviceConfig, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	var raw []*jsonDevice
	if err := dec.Decode(&raw); err != nil {
		return nil, configError("%s is not a JSON list of device objects: %v (value %s)", EnvDevices, err, quoteShort(data))
	}
	if dec.More() {
		return nil, configError("%s has text after the JSON list (value %s)", EnvDevices, quoteShort(data))
	}
	if raw == nil {
		return nil, configError("%s must be a JSON list of devices, got %s", EnvDevices, quoteShort(data))
	}
	if len(raw) == 0 {
		return nil, configError("%s lists no devices; unset it for one H100, or list at least one", EnvDevices)
	}
	if len(raw) > MaxDevices {
		return nil, configError("%s lists %d devices; the simulator offers at most %d", EnvDevices, len(raw), MaxDevices)
	}
	out := make([]DeviceConfig, len(raw))
	for i, r := range raw {
		if r == nil {
			return nil, configError("device %d is null; each device is an object such as {\"name\": \"sim0\"}", i)
		}
		c := H100()
		if r.Name != nil {
			if *r.Name == "" {
				return nil, configError("device %d: name is empty", i)
			}
			c.Name = *r.Name
		}
		if r.TotalMemory != nil {
			n, err := strconv.ParseUint(r.TotalMemory.String(), 10, 64)
			if err != nil || n == 0 {
				return nil, configError("device %d: total_memory %q must be a positive whole number of bytes", i, r.TotalMemory.String())
			}
			c.TotalMemory = n
		}
		if r.ComputeCapability != nil {
			var cc []json.Number
			if err := json.Unmarshal(*r.ComputeCapability, &cc); err != nil || len(cc) != 2 {
				return nil, configError("device %d: compute_capability %s must be [major, minor], such as [9, 0]", i, quoteShort(*r.ComputeCapability))
			}
			for k := range cc {
				v, err := strconv.ParseInt(cc[k].String(), 10, 32)
				if err != nil {
					return nil, configError("device %d: compute_capability %s must hold whole numbers, such as [9, 0]", i, quoteShort(*r.ComputeCapability))
				}
				c.ComputeCapability[k] = int(v)
			}
		}
		if r.MultiprocessorCount != nil {
			v, err := strconv.ParseInt(r.MultiprocessorCount.String(), 10, 32)
			if err != nil {
				return nil, configError("device %d: multiprocessor_count %q must be a whole number", i, r.MultiprocessorCount.String())
			}
			c.MultiprocessorCount = int(v)
		}
		for _, b := range []struct {
			p   *bool
			dst *bool
		}{{r.MemoryPoolsSupported, &c.MemoryPoolsSupported}, {r.TCCDriver, &c.TCCDriver}, {r.ManagedMemory, &c.ManagedMemory}, {r.Integrated, &c.Integrated}} {
			if b.p != nil {
				*b.dst = *b.p
			}
		}
		if r.UUID != nil {
			u, ok := decodeUUID(*r.UUID)
			if !ok {
				return nil, configError("device %d: uuid %s must be a string such as \"GPU-6f2c1e1a-8f4b-4c7e-9a51-3d2f0c9b7e10\"", i, quoteShort(*r.UUID))
			}
			c.UUID = u
		}
		if r.PCIBusID != nil {
			c.PCIBusID = *r.PCIBusID
		}
		if r.PeerGroup != nil {
			v, err := strconv.ParseInt(r.PeerGroup.String(), 10, 32)
			if err != nil {
				return nil, configError("device %d: peer_group %q must be a whole number", i, r.PeerGroup.String())
			}
			c.PeerGroup = int(v)
		}
		if r.NVLinks != nil {
			v, err := strconv.ParseInt(r.NVLinks.String(), 10, 32)
			if err != nil {
				return nil, configError("device %d: nvlinks %q must be a whole number", i, r.NVLinks.String())
			}
			c.NVLinks = int(v)
		}
		// Explicit zeros were meant: validate them rather than letting normalize default them.
		if c.UUID == [16]byte{} {
			c.UUID = derivedUUID(i)
		}
		if c.PCIBusID == "" {
			c.PCIBusID = derivedPCIBusID(i)
		}
		if err := validate(i, c); err != nil {
			return nil, err
		}
		out[i] = c
	}
	return out, nil
}

func decodeUUID(raw json.RawMessage) ([16]byte, bool) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return parseUUID(s)
	}
	var a [16]byte
	var arr []uint8
	if err := json.Unmarshal(raw, &arr); err == nil && len(arr) == 16 {
		copy(a[:], arr)
		return a, true
	}
	return a, false
}

// quoteShort quotes at most 200 bytes of b: enough to recognize the value in a message without flooding it.
func quoteShort(b []byte) string {
	if len(b) > 200 {
		return strconv.Quote(string(b[:200])) + "..."
	}
	return strconv.Quote(string(b))
}
