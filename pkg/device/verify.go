package device

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/cudacore/cudacore/pkg/cuda"
)

// The statuses of a Probe.
const (
	Verified    = "verified"    // the capability was exercised and works
	Fallback    = "fallback"    // claimed by the device, but the probe failed: cudacore uses something else
	Unsupported = "unsupported" // not claimed, and the probe confirmed it does not work
	Claimed     = "claimed"     // only the claim could be read (cudacore cannot exercise it here)
	NotProbed   = "not probed"  // cudacore has no API for it yet
)

// Probe is the result of one of Verify's probes.
type Probe struct {
	Name    string `json:"name"`
	Claimed *bool  `json:"claimed"` // what the device's attributes say; nil when there is no such claim
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	// Value carries a probe's figures: bytes of a reservation, the loading mode, the handle types.
	Value map[string]any `json:"value,omitempty"`
}

// Attributes Verify reads that the rest of cudacore does not.
const (
	attrVirtualMemory     cuda.DeviceAttribute = 102 // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
	attrPoolHandleTypes   cuda.DeviceAttribute = 119 // CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES
	probeBytes                                 = 4096
	moduleLoadingVariable                      = "CUDA_MODULE_LOADING"
)

// Verify runs tiny real probes on d instead of reading its attributes alone: it allocates and frees a few
// KiB from the default memory pool, as pinned host memory and as managed memory; reads the IPC handle
// types and virtual-memory claims (cudacore has no API to exercise them yet), and which devices it can
// reach as peers (not enabled: see peerProbe); reads the heap, stack and
// printf reservations, writes each back to itself to check the limit is settable, and says what the stack
// reservation costs (stack size times the resident threads of every multiprocessor); and reports the
// module loading mode in effect. It changes nothing it does not restore, and never panics.
func Verify(d *Device) []Probe {
	drv, ctx, props := d.Driver(), d.Context(), d.Properties()
	claim := func(b bool) *bool { return &b }
	var out []Probe

	// The default memory pool: what the pool strategy relies on.
	pool := Probe{Name: "memory pool", Claimed: claim(props.MemoryPoolsSupported && !props.TCCDriver)}
	err := func() error {
		mp, err := drv.DeviceDefaultMemPool(d.Handle())
		if err != nil {
			return err
		}
		p, err := drv.MemAllocFromPoolAsync(ctx, probeBytes, mp, cuda.StreamLegacy)
		if err != nil {
			return err
		}
		if err := drv.MemFreeAsync(ctx, p, cuda.StreamLegacy); err != nil {
			return err
		}
		return drv.StreamSynchronize(ctx, cuda.StreamLegacy)
	}()
	judge(&pool, err, "a 4 KiB allocation from the default pool and its free worked",
		"cudacore uses the synchronous allocator (cuMemAlloc/cuMemFree) instead")
	out = append(out, pool)

	pinned := Probe{Name: "pinned host memory", Claimed: nil}
	err = func() error {
		b, err := drv.MemHostAlloc(ctx, probeBytes, 0)
		if err != nil {
			return err
		}
		return drv.MemFreeHost(ctx, b)
	}()
	judge(&pinned, err, "4 KiB of page-locked host memory was allocated and freed",
		"copies from Python memory go through pageable staging, at lower speed")
	out = append(out, pinned)

	managed := Probe{Name: "managed memory", Claimed: claim(props.ManagedMemory)}
	err = func() error {
		p, err := drv.MemAllocManaged(ctx, probeBytes, cuda.MemAttachGlobal)
		if err != nil {
			return err
		}
		return drv.MemFree(ctx, p)
	}()
	judge(&managed, err, "4 KiB of managed memory was allocated and freed", "managed allocations fail on this device")
	out = append(out, managed)

	vmm := Probe{Name: "virtual memory", Status: NotProbed,
		Reason: "cudacore has no virtual memory management API yet (cuMemAddressReserve/cuMemMap); the attribute is shown"}
	if v, err := drv.DeviceAttribute(d.Handle(), attrVirtualMemory); err == nil {
		vmm.Claimed = claim(v != 0)
	}
	out = append(out, vmm)

	ipc := Probe{Name: "IPC handle types", Status: NotProbed,
		Reason: "the memory pools' supported handle types are shown; `cudacore doctor` (without --verify) tries each way of sharing memory with another process"}
	if v, err := drv.DeviceAttribute(d.Handle(), attrPoolHandleTypes); err == nil {
		ipc.Claimed = claim(v != 0)
		var types []string
		for bit, name := range map[int]string{1: "posix_fd", 2: "win32", 4: "win32_kmt", 8: "fabric"} {
			if v&bit != 0 {
				types = append(types, name)
			}
		}
		ipc.Value = map[string]any{"handle_types": v, "names": strings.Join(sorted(types), ",")}
	}
	out = append(out, ipc)

	out = append(out, peerProbe(d))

	resident := uint64(props.MultiprocessorCount)
	if t, err := drv.DeviceAttribute(d.Handle(), cuda.AttrMaxThreadsPerMultiprocessor); err == nil && t > 0 {
		resident *= uint64(t)
	}
	for _, l := range []struct {
		name  string
		limit cuda.Limit
	}{{"malloc heap", cuda.LimitMallocHeapSize}, {"stack", cuda.LimitStackSize}, {"printf fifo", cuda.LimitPrintfFIFOSize}} {
		p := Probe{Name: l.name + " reservation"}
		v, err := drv.CtxGetLimit(ctx, l.limit)
		if err == nil {
			err = drv.CtxSetLimit(ctx, l.limit, v) // set to itself: proves it is settable, changes nothing
		}
		if err != nil {
			p.Status, p.Reason = Fallback, fmt.Sprintf("the limit could not be read or set back: %v", err)
			out = append(out, p)
			continue
		}
		p.Status = Verified
		p.Value = map[string]any{"bytes": v}
		switch l.limit {
		case cuda.LimitStackSize:
			cost := v * resident
			p.Value["resident_threads"] = resident
			p.Value["cost_bytes"] = cost
			p.Reason = fmt.Sprintf("%d bytes per thread; with %d resident threads that reserves up to %d bytes of device memory",
				v, resident, cost)
		case cuda.LimitMallocHeapSize:
			p.Value["cost_bytes"] = v
			p.Reason = fmt.Sprintf("device-side malloc draws from a %d-byte heap, reserved outside cuMemGetInfo's accounting", v)
		default:
			p.Value["cost_bytes"] = v
			p.Reason = fmt.Sprintf("printf output buffer of %d bytes", v)
		}
		out = append(out, p)
	}

	loading := Probe{Name: "module loading", Status: Claimed}
	mode, set := os.LookupEnv(moduleLoadingVariable)
	version, _ := drv.Version()
	switch {
	case set && strings.TrimSpace(mode) != "":
		mode = strings.ToUpper(strings.TrimSpace(mode))
		loading.Reason = moduleLoadingVariable + " is set in the environment"
	case version >= 12020:
		mode, loading.Reason = "LAZY", moduleLoadingVariable+" is unset: the default of drivers since CUDA 12.2"
	default:
		mode, loading.Reason = "EAGER", moduleLoadingVariable+" is unset: the default of drivers before CUDA 12.2"
	}
	loading.Value = map[string]any{"mode": mode, "driver_version": version}
	out = append(out, loading)
	return out
}

// judge sets p's status and reason from a probe's error: verified when it worked, else fallback when the
// device claims the capability (or makes no claim) and unsupported when it does not.
func judge(p *Probe, err error, ok, fallback string) {
	switch {
	case err == nil && p.Claimed != nil && !*p.Claimed:
		p.Status, p.Reason = Verified, ok+" (although the device's attribute says it is unsupported)"
	case err == nil:
		p.Status, p.Reason = Verified, ok
	case p.Claimed != nil && !*p.Claimed:
		p.Status, p.Reason = Unsupported, fmt.Sprintf("not claimed, and the probe failed (%s): %s", cuda.ResultOf(err), fallback)
	default:
		p.Status, p.Reason = Fallback, fmt.Sprintf("the probe failed (%s: %v): %s", cuda.ResultOf(err), err, fallback)
	}
}

func sorted(s []string) []string {
	sort.Strings(s)
	return s
}

// peerProbe reads which devices d can reach directly (cuDeviceCanAccessPeer). It does not enable peer
// access to exercise it: that changes d's context for the rest of the process (the driver has no way back
// through cudacore), and Device.enable_peer_access is the user's to call. So the status is Claimed.
func peerProbe(d *Device) Probe {
	drv := d.Driver()
	p := Probe{Name: "peer access", Status: Claimed}
	n, err := drv.DeviceCount()
	if err != nil {
		p.Status, p.Reason = NotProbed, fmt.Sprintf("the devices could not be counted: %v", err)
		return p
	}
	if n < 2 {
		p.Status, p.Reason = NotProbed, "one device: there is no peer to reach"
		return p
	}
	peers := []int{}
	for j := range n {
		if j == d.Ordinal() {
			continue
		}
		other, err := drv.DeviceGet(j)
		if err != nil {
			p.Status, p.Reason = NotProbed, fmt.Sprintf("device %d could not be read: %v", j, err)
			return p
		}
		can, err := drv.DeviceCanAccessPeer(d.Handle(), other)
		if err != nil {
			p.Status, p.Reason = NotProbed, fmt.Sprintf("cuDeviceCanAccessPeer failed for device %d: %v", j, err)
			return p
		}
		if can {
			peers = append(peers, j)
		}
	}
	claimed := len(peers) > 0
	p.Claimed = &claimed
	p.Value = map[string]any{"peers": peers}
	if claimed {
		p.Reason = fmt.Sprintf("the driver says it reaches devices %v directly; Device.enable_peer_access(peer) enables it "+
			"(not done here: it lasts for the process); peer copies work without it, staged through the host", peers)
	} else {
		p.Reason = "the driver says it reaches no other device directly: peer copies are staged through the host"
	}
	return p
}
